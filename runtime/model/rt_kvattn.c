/*
 * rt_kvattn: attention reads of f16 / Q8_0 KV rows, scalar, AVX2 and AVX-512; see
 * rt_kvattn.h. Each function decodes one row (a column slice of at most DCH values) into
 * a buffer in L1 and uses it for every query head of the group before the next row, so
 * the stored row is read from memory once.
 */
#include "model/rt_kvattn.h"

#include <string.h>

#include "base/rt_util.h"
#include "model/rt_dot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVATTN_X86 1
#endif

/* Columns decoded at a time (a multiple of 32, so a slice holds whole Q8_0 blocks). */
#define DCH 256
#define QB 32          /* values per Q8_0 block */
#define QB_BYTES 34    /* f16 scale + 32 int8 codes */

/* Bytes from a row's start to column c0 (c0 a multiple of QB for Q8_0). */
static size_t off_f16(int c0)
{
	return (size_t)c0 * 2;
}

static size_t off_q8(int c0)
{
	return (size_t)(c0 / QB) * QB_BYTES;
}

/* ---- scalar ------------------------------------------------------------------------------ */

static void dec_f16_scalar(const uint8_t *p, int w, float *out)
{
	for (int j = 0; j < w; j++) {
		uint16_t h;
		memcpy(&h, p + 2 * j, 2);
		out[j] = rt_fp16_to_f32(h);
	}
}

static void dec_q8_scalar(const uint8_t *p, int w, float *out)
{
	for (int b = 0; b < w / QB; b++, p += QB_BYTES) {
		uint16_t h;
		memcpy(&h, p, 2);
		const float s = rt_fp16_to_f32(h);
		for (int j = 0; j < QB; j++)
			out[b * QB + j] = s * (float)(int8_t)p[2 + j];
	}
}

static float dot_scalar(const float *a, const float *b, int w)
{
	float s = 0;
	for (int j = 0; j < w; j++)
		s += a[j] * b[j];
	return s;
}

static void axpy_scalar(float *y, float a, const float *x, int w)
{
	for (int j = 0; j < w; j++)
		y[j] += a * x[j];
}

/* The three kernels for one (ISA, type): DEC decodes w columns from a row pointer already
 * advanced to the slice, OFF gives that advance, DOT / AXPY are the f32 helpers. */
#define KVATTN_DEFINE(SUF, ATTR, DEC, OFF, DOT, AXPY)                                         \
	ATTR static void decode_##SUF(const uint8_t *rows, int32_t n, int d, float *out)          \
	{                                                                                        \
		const size_t rb = OFF(d);                                                            \
		for (int32_t i = 0; i < n; i++)                                                      \
			for (int c0 = 0; c0 < d; c0 += DCH)                                              \
				DEC(rows + (size_t)i * rb + OFF(c0), d - c0 < DCH ? d - c0 : DCH,            \
				    out + (size_t)i * d + c0);                                               \
	}                                                                                        \
	ATTR static void scores_##SUF(const uint8_t *rows, int32_t n, int d, const float *q,      \
	                              size_t ldq, int G, float scale, float *S, size_t ldS)      \
	{                                                                                        \
		const size_t rb = OFF(d);                                                            \
		float buf[DCH];                                                                      \
		for (int32_t i = 0; i < n; i++) {                                                    \
			const uint8_t *row = rows + (size_t)i * rb;                                      \
			for (int g = 0; g < G; g++)                                                      \
				S[(size_t)g * ldS + i] = 0.0f;                                               \
			for (int c0 = 0; c0 < d; c0 += DCH) {                                            \
				const int w = d - c0 < DCH ? d - c0 : DCH;                                   \
				DEC(row + OFF(c0), w, buf);                                                  \
				for (int g = 0; g < G; g++)                                                  \
					S[(size_t)g * ldS + i] += DOT(q + (size_t)g * ldq + c0, buf, w);         \
			}                                                                                \
			for (int g = 0; g < G; g++)                                                      \
				S[(size_t)g * ldS + i] *= scale;                                             \
		}                                                                                    \
	}                                                                                        \
	ATTR static void mix_##SUF(const uint8_t *rows, int32_t n, int d, const float *P,         \
	                           size_t ldP, int G, float *out, size_t ldo)                    \
	{                                                                                        \
		const size_t rb = OFF(d);                                                            \
		float buf[DCH];                                                                      \
		for (int g = 0; g < G; g++)                                                          \
			memset(out + (size_t)g * ldo, 0, (size_t)d * sizeof(float));                     \
		for (int32_t i = 0; i < n; i++) {                                                    \
			const uint8_t *row = rows + (size_t)i * rb;                                      \
			for (int c0 = 0; c0 < d; c0 += DCH) {                                            \
				const int w = d - c0 < DCH ? d - c0 : DCH;                                   \
				DEC(row + OFF(c0), w, buf);                                                  \
				for (int g = 0; g < G; g++)                                                  \
					AXPY(out + (size_t)g * ldo + c0, P[(size_t)g * ldP + i], buf, w);        \
			}                                                                                \
		}                                                                                    \
	}

#define NO_ATTR
KVATTN_DEFINE(f16_scalar, NO_ATTR, dec_f16_scalar, off_f16, dot_scalar, axpy_scalar)
KVATTN_DEFINE(q8_scalar, NO_ATTR, dec_q8_scalar, off_q8, dot_scalar, axpy_scalar)

#ifdef KVATTN_X86
/* ---- AVX2 + FMA + F16C --------------------------------------------------------------------- */

#define AVX2_ATTR __attribute__((target("avx2,fma,f16c")))

AVX2_ATTR static void dec_f16_avx2(const uint8_t *p, int w, float *out)
{
	int j = 0;
	for (; j + 8 <= w; j += 8)
		_mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * j))));
	dec_f16_scalar(p + 2 * j, w - j, out + j);
}

AVX2_ATTR static void dec_q8_avx2(const uint8_t *p, int w, float *out)
{
	for (int b = 0; b < w / QB; b++, p += QB_BYTES) {
		uint16_t h;
		memcpy(&h, p, 2);
		const __m256 s = _mm256_set1_ps(rt_fp16_to_f32(h));
		for (int j = 0; j < QB; j += 8) {
			__m128i c = _mm_loadl_epi64((const __m128i *)(const void *)(p + 2 + j));
			__m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
			_mm256_storeu_ps(out + b * QB + j, _mm256_mul_ps(s, x));
		}
	}
}

AVX2_ATTR static float dot_avx2(const float *a, const float *b, int w)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	int j = 0;
	for (; j + 16 <= w; j += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), s1);
	}
	for (; j + 8 <= w; j += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), s0);
	s0 = _mm256_add_ps(s0, s1);
	__m128 t = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
	t = _mm_add_ps(t, _mm_movehl_ps(t, t));
	t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
	return _mm_cvtss_f32(t) + dot_scalar(a + j, b + j, w - j);
}

AVX2_ATTR static void axpy_avx2(float *y, float a, const float *x, int w)
{
	const __m256 va = _mm256_set1_ps(a);
	int j = 0;
	for (; j + 8 <= w; j += 8)
		_mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
	axpy_scalar(y + j, a, x + j, w - j);
}

KVATTN_DEFINE(f16_avx2, AVX2_ATTR, dec_f16_avx2, off_f16, dot_avx2, axpy_avx2)
KVATTN_DEFINE(q8_avx2, AVX2_ATTR, dec_q8_avx2, off_q8, dot_avx2, axpy_avx2)

/* ---- AVX-512 --------------------------------------------------------------------------------- */

#define AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

AVX512_ATTR static void dec_f16_avx512(const uint8_t *p, int w, float *out)
{
	int j = 0;
	for (; j + 16 <= w; j += 16)
		_mm512_storeu_ps(out + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * j))));
	dec_f16_avx2(p + 2 * j, w - j, out + j);
}

AVX512_ATTR static void dec_q8_avx512(const uint8_t *p, int w, float *out)
{
	for (int b = 0; b < w / QB; b++, p += QB_BYTES) {
		uint16_t h;
		memcpy(&h, p, 2);
		const __m512 s = _mm512_set1_ps(rt_fp16_to_f32(h));
		for (int j = 0; j < QB; j += 16) {
			__m128i c = _mm_loadu_si128((const __m128i *)(const void *)(p + 2 + j));
			__m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
			_mm512_storeu_ps(out + b * QB + j, _mm512_mul_ps(s, x));
		}
	}
}

AVX512_ATTR static float dot_avx512(const float *a, const float *b, int w)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
	int j = 0;
	for (; j + 32 <= w; j += 32) {
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), s0);
		s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 16), _mm512_loadu_ps(b + j + 16), s1);
	}
	for (; j + 16 <= w; j += 16)
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), s0);
	return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) + dot_scalar(a + j, b + j, w - j);
}

AVX512_ATTR static void axpy_avx512(float *y, float a, const float *x, int w)
{
	const __m512 va = _mm512_set1_ps(a);
	int j = 0;
	for (; j + 16 <= w; j += 16)
		_mm512_storeu_ps(y + j, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + j), _mm512_loadu_ps(y + j)));
	axpy_scalar(y + j, a, x + j, w - j);
}

KVATTN_DEFINE(f16_avx512, AVX512_ATTR, dec_f16_avx512, off_f16, dot_avx512, axpy_avx512)
KVATTN_DEFINE(q8_avx512, AVX512_ATTR, dec_q8_avx512, off_q8, dot_avx512, axpy_avx512)
#endif

/* [isa][type - RT_KV_F16] */
static const rt_kvattn_kernels table[3][2] = {
	{ { decode_f16_scalar, scores_f16_scalar, mix_f16_scalar },
	  { decode_q8_scalar, scores_q8_scalar, mix_q8_scalar } },
#ifdef KVATTN_X86
	{ { decode_f16_avx2, scores_f16_avx2, mix_f16_avx2 },
	  { decode_q8_avx2, scores_q8_avx2, mix_q8_avx2 } },
	{ { decode_f16_avx512, scores_f16_avx512, mix_f16_avx512 },
	  { decode_q8_avx512, scores_q8_avx512, mix_q8_avx512 } },
#endif
};

const rt_kvattn_kernels *rt_kvattn_get(enum rt_kv_type type, int isa)
{
	if (type != RT_KV_F16 && type != RT_KV_Q8_0)
		return NULL;
	int best = rt_dot_isa_best();
	if (isa > best)
		isa = best;
	if (isa < RT_ISA_SCALAR)
		isa = RT_ISA_SCALAR;
#ifndef KVATTN_X86
	isa = RT_ISA_SCALAR;
#endif
	return &table[isa][type == RT_KV_Q8_0];
}
