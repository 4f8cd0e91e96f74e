/*
 * rt_kvattn: attention reads of f16 / Q8_0 KV rows and of tiered heads, scalar, AVX2 and
 * AVX-512; see rt_kvattn.h. Each function decodes one row (a column slice of at most DCH values) into
 * a buffer in L1 and uses it for every query head of the group before the next row, so
 * the stored row is read from memory once.
 */
#include "model/rt_kvattn.h"

#include <string.h>

#include "base/rt_util.h"
#include "kv/rt_kvq.h"
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

/* ---- tiered heads (rt_kv_init_tiered): rows read slot by slot from the tier arenas ------ */

#define TIER_MAXD 1024 /* the tiered store's largest head_dim (rt_kv_init_tiered) */
#define TIER_QG 16     /* query heads folded into a key group's range at a time */

/* Raw codes of a quantised key (bits 8, 4 or 2, packed as rt_kvq writes them: element i in
 * byte i / (8 / bits) at bit (i % (8 / bits)) · bits) as floats, in channel order. */
static void dec_codes_scalar(int bits, const uint8_t *c, int d, float *out)
{
	const int per = 8 / bits;
	const unsigned mask = (1u << bits) - 1;
	for (int j = 0; j < d; j++)
		out[j] = (float)((c[j / per] >> ((j % per) * bits)) & mask);
}

static void vdec_scalar(int kind, const uint8_t *row, int d, float *out)
{
	rt_kvq_vrow_decode((rt_kvq_kind)kind, row, d, out);
}

/* Key group range folded into the queries: with k_c = lo_c + step_c · code_c,
 * scale · q·k = base + Σ_c qs_c · code_c, base = scale · Σ_c q_c lo_c, qs_c = scale · q_c
 * step_c (KIVI's per-channel keys read without dequantising, arXiv 2402.02750 sec. 3.3),
 * for the G (<= TIER_QG) query rows q + g·ldq: qs[g·d + c], base[g]. */
static void tier_fold(int kind, const uint16_t *range, int d, const float *q, size_t ldq, int G,
                      float scale, float *qs, float *base)
{
	float lo[TIER_MAXD], step[TIER_MAXD];
	rt_kvq_krange_unpack((rt_kvq_kind)kind, range, d, lo, step);
	for (int g = 0; g < G; g++) {
		const float *qg = q + (size_t)g * ldq;
		float b = 0;
		for (int c = 0; c < d; c++) {
			b += qg[c] * lo[c];
			qs[(size_t)g * d + c] = scale * qg[c] * step[c];
		}
		base[g] = scale * b;
	}
}

/* The two tiered-head kernels of one ISA: scores (G <= TIER_QG) and mix. DECH decodes an
 * f16 row, DECC raw key codes, VDEC a quantised value row (rt_kvq layout). */
#define TIER_DEFINE(SUF, ATTR, DECH, DECC, VDEC, DOT, AXPY)                                   \
	ATTR static void tscores_##SUF(const rt_kv *kv, const rt_kv_head *h, int32_t lim,         \
	                               const float *q, size_t ldq, const float *qr, size_t ldqr,  \
	                               int G, float scale, float *S, size_t ldS)                  \
	{                                                                                        \
		const int d = kv->head_dim;                                                          \
		float buf[TIER_MAXD], qs[TIER_QG * TIER_MAXD], base[TIER_QG];                         \
		for (int t = 0; t < RT_KV_N_TIER; t++) {                                             \
			const rt_kv_arena *a = &h->arena[t];                                             \
			const size_t sb = 2 * kv->tier_row[t];                                           \
			const int kind = rt_kv_tier_codec(kv, t, 0);                                     \
			const int bits = t == RT_KV_TIER_TOP ? 0 : rt_kvq_bits((rt_kvq_kind)kind);       \
			int32_t g_have = -1;                                                             \
			for (int32_t s = 0; s < a->n; s++) {                                             \
				const int32_t e = a->owner[s];                                               \
				const uint8_t *row = a->rows + (size_t)s * sb;                               \
				if (e >= lim)                                                                \
					continue;                                                                \
				if (t == RT_KV_TIER_TOP) {                                                   \
					const float *k = buf;                                                    \
					if (kind == RT_KVQ_F32)                                                  \
						k = (const float *)(const void *)row;                                \
					else                                                                     \
						DECH(row, d, buf);                                                   \
					for (int g = 0; g < G; g++)                                              \
						S[(size_t)g * ldS + e] = scale * DOT(q + (size_t)g * ldq, k, d);     \
					continue;                                                                \
				}                                                                            \
				if (h->kgrp[e] != g_have) {                                                  \
					g_have = h->kgrp[e];                                                     \
					tier_fold(kind, rt_kv_kgroup_range(kv, h, g_have), d, qr, ldqr, G,       \
					          scale, qs, base);                                              \
				}                                                                            \
				DECC(bits, row, d, buf);                                                     \
				for (int g = 0; g < G; g++)                                                  \
					S[(size_t)g * ldS + e] = base[g] + DOT(qs + (size_t)g * d, buf, d);      \
			}                                                                                \
		}                                                                                    \
	}                                                                                        \
	ATTR static void tmix_##SUF(const rt_kv *kv, const rt_kv_head *h, int32_t lim,            \
	                            const float *P, size_t ldP, int G, float *out, size_t ldo,    \
	                            int t0, int t1)                                               \
	{                                                                                        \
		const int d = kv->head_dim;                                                          \
		float buf[TIER_MAXD];                                                                \
		for (int g = 0; g < G; g++)                                                          \
			memset(out + (size_t)g * ldo, 0, (size_t)d * sizeof(float));                     \
		for (int t = t0; t < t1; t++) {                                                      \
			const rt_kv_arena *a = &h->arena[t];                                             \
			const size_t sb = 2 * kv->tier_row[t], off = kv->tier_krow[t];                   \
			const int kind = rt_kv_tier_codec(kv, t, 1);                                     \
			for (int32_t s = 0; s < a->n; s++) {                                             \
				const int32_t e = a->owner[s];                                               \
				const uint8_t *row = a->rows + (size_t)s * sb + off;                         \
				const float *v = buf;                                                        \
				if (e >= lim)                                                                \
					continue;                                                                \
				if (kind == RT_KVQ_F32)                                                      \
					v = (const float *)(const void *)row;                                    \
				else if (kind == RT_KVQ_F16)                                                 \
					DECH(row, d, buf);                                                       \
				else                                                                         \
					VDEC(kind, row, d, buf);                                                 \
				for (int g = 0; g < G; g++)                                                  \
					AXPY(out + (size_t)g * ldo, P[(size_t)g * ldP + e], v, d);               \
			}                                                                                \
		}                                                                                    \
	}

#define NO_ATTR
KVATTN_DEFINE(f16_scalar, NO_ATTR, dec_f16_scalar, off_f16, dot_scalar, axpy_scalar)
KVATTN_DEFINE(q8_scalar, NO_ATTR, dec_q8_scalar, off_q8, dot_scalar, axpy_scalar)
TIER_DEFINE(scalar, NO_ATTR, dec_f16_scalar, dec_codes_scalar, vdec_scalar, dot_scalar, axpy_scalar)

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

/* 32 codes of 8, 4 or 2 bits at p (rt_kvq's packing) as 8-bit integers in channel order:
 * channels 0..15 in *lo, 16..31 in *hi. A nibble or crumb is masked out of each byte and the
 * planes are interleaved back (unpack), so no code crosses a byte. */
AVX2_ATTR static inline void codes32_avx2(int bits, const uint8_t *p, __m128i *lo, __m128i *hi)
{
	if (bits == 8) {
		*lo = _mm_loadu_si128((const __m128i *)(const void *)p);
		*hi = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
	} else if (bits == 4) {
		const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p), m = _mm_set1_epi8(15);
		const __m128i l = _mm_and_si128(b, m), h = _mm_and_si128(_mm_srli_epi16(b, 4), m);
		*lo = _mm_unpacklo_epi8(l, h);
		*hi = _mm_unpackhi_epi8(l, h);
	} else {
		const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p), m = _mm_set1_epi8(3);
		const __m128i v0 = _mm_and_si128(b, m), v1 = _mm_and_si128(_mm_srli_epi16(b, 2), m);
		const __m128i v2 = _mm_and_si128(_mm_srli_epi16(b, 4), m);
		const __m128i v3 = _mm_and_si128(_mm_srli_epi16(b, 6), m);
		const __m128i a = _mm_unpacklo_epi8(v0, v1), c = _mm_unpacklo_epi8(v2, v3);
		*lo = _mm_unpacklo_epi16(a, c);
		*hi = _mm_unpackhi_epi16(a, c);
	}
}

/* 32 channels of a row as floats x[0..4): 32 codes (8, 4 or 2 bits) or 32 f16 values (bits 16) */
AVX2_ATTR static inline void chunk32_avx2(int bits, const uint8_t *p, __m256 x[4])
{
	if (bits == 16) {
		for (int j = 0; j < 4; j++)
			x[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * j)));
		return;
	}
	__m128i lo, hi;
	codes32_avx2(bits, p, &lo, &hi);
	x[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
	x[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
	x[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
	x[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

/* The horizontal sums of v[0..8) as one vector (lane k = Σ v[k]): 7 adds for 8 dots. */
AVX2_ATTR static inline __m256 hsum8_avx2(const __m256 *v)
{
	const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
	const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
	return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* Up to 8 entries' partial dots acc[g·8 + k] reduced into S[g·ldS + ent[k]] = base[g] + Σ. */
AVX2_ATTR static void tier_flush_avx2(__m256 *acc, const int32_t *ent, int nb, int G,
                                      const float *base, float *S, size_t ldS)
{
	float sum[8];
	for (int g = 0; g < G; g++) {
		for (int k = nb; k < 8; k++)
			acc[g * 8 + k] = _mm256_setzero_ps();
		_mm256_storeu_ps(sum, hsum8_avx2(acc + g * 8));
		for (int k = 0; k < nb; k++)
			S[(size_t)g * ldS + ent[k]] = base[g] + sum[k];
	}
}

/* tier_fold with F16C: the range's halves converted 8 at a time (the same floats as
 * rt_kvq_krange_unpack: lo exact, step = (hi − lo) / (2^bits − 1) when hi > lo, else 0). */
AVX2_ATTR static void tier_fold_avx2(int kind, const uint16_t *range, int d, const float *q,
                                     size_t ldq, int G, float scale, float *qs, float *base)
{
	const __m256 top = _mm256_set1_ps((float)((1 << rt_kvq_bits((rt_kvq_kind)kind)) - 1));
	const __m256 sc = _mm256_set1_ps(scale), zero = _mm256_setzero_ps();
	__m256 b[TIER_QG];
	for (int g = 0; g < G; g++)
		b[g] = zero;
	for (int c = 0; c < d; c += 8) {
		const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(range + c)));
		const __m256 w = _mm256_sub_ps(
			_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(range + d + c))), lo);
		const __m256 step = _mm256_and_ps(_mm256_div_ps(w, top), _mm256_cmp_ps(w, zero, _CMP_GT_OQ));
		for (int g = 0; g < G; g++) {
			const __m256 qg = _mm256_loadu_ps(q + (size_t)g * ldq + c);
			b[g] = _mm256_fmadd_ps(qg, lo, b[g]);
			_mm256_storeu_ps(qs + (size_t)g * d + c, _mm256_mul_ps(_mm256_mul_ps(sc, qg), step));
		}
	}
	float sum[8];
	for (int g = 0; g < G; g++) {
		_mm256_storeu_ps(sum, b[g]);
		base[g] = scale * (((sum[0] + sum[1]) + (sum[2] + sum[3])) +
		                   ((sum[4] + sum[5]) + (sum[6] + sum[7])));
	}
}

/* Scores over the top tier's arena (f16 rows): qs[G × d] the queries times scale. Entries
 * are taken 8 at a time, their dots reduced together. */
AVX2_ATTR static void ttop_scores_avx2(const rt_kv *kv, const rt_kv_head *h, int32_t lim, int G,
                                       const float *qs, float *S, size_t ldS)
{
	const int d = kv->head_dim;
	const size_t sb = 2 * kv->tier_row[RT_KV_TIER_TOP];
	const rt_kv_arena *a = &h->arena[RT_KV_TIER_TOP];
	const float base[TIER_QG] = { 0 };
	__m256 acc[TIER_QG * 8];
	int32_t ent[8];
	int nb = 0;
	for (int32_t s = 0; s < a->n; s++) {
		const int32_t e = a->owner[s];
		if (e >= lim)
			continue;
		const uint8_t *row = a->rows + (size_t)s * sb;
		for (int g = 0; g < G; g++)
			acc[g * 8 + nb] = _mm256_setzero_ps();
		for (int c0 = 0; c0 < d; c0 += 32, row += 64) {
			__m256 x[4];
			chunk32_avx2(16, row, x);
			for (int g = 0; g < G; g++) {
				const float *w = qs + (size_t)g * d + c0;
				__m256 u = _mm256_mul_ps(x[0], _mm256_loadu_ps(w));
				__m256 v = _mm256_mul_ps(x[1], _mm256_loadu_ps(w + 8));
				u = _mm256_fmadd_ps(x[2], _mm256_loadu_ps(w + 16), u);
				v = _mm256_fmadd_ps(x[3], _mm256_loadu_ps(w + 24), v);
				acc[g * 8 + nb] = _mm256_add_ps(acc[g * 8 + nb], _mm256_add_ps(u, v));
			}
		}
		ent[nb++] = e;
		if (nb == 8) {
			tier_flush_avx2(acc, ent, nb, G, base, S, ldS);
			nb = 0;
		}
	}
	if (nb)
		tier_flush_avx2(acc, ent, nb, G, base, S, ldS);
}

/* A key group's folded queries qs[G × d] (tier_fold_avx2) as 16-bit integers: per query row
 * g, D[g] = max_c |qs_gc| / 32767 and iq_gc = round(qs_gc / D[g]) (all 0 when D[g] = 0), so
 * Σ_c qs_gc code_c = D[g] Σ_c iq_gc code_c within D[g] (1/2 + 2^-10) Σ_c code_c (the
 * rounding to the integer, then f32's in qs_gc / D[g]): at most d (2^b − 1) D[g] / 2, i.e.
 * d / 65534 of the largest channel's term (q_c times its key group's range), some 2^-10 of it
 * at head_dim 64, against the half step of the key's own codes. The integer dot then takes
 * 25 instructions per 32 channels and three query heads against the float one's 43
 * (tqscores_avx2). */
AVX2_ATTR static void tier_qfold_avx2(const float *qs, int d, int G, int16_t *iq, float *D)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	for (int g = 0; g < G; g++) {
		const float *x = qs + (size_t)g * d;
		__m256 m = _mm256_setzero_ps();
		for (int c = 0; c < d; c += 8)
			m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + c)));
		float mm[8], mx = 0;
		_mm256_storeu_ps(mm, m);
		for (int k = 0; k < 8; k++)
			mx = mm[k] > mx ? mm[k] : mx;
		D[g] = mx / 32767.0f;
		const __m256 inv = _mm256_set1_ps(mx > 0 ? 32767.0f / mx : 0.0f);
		for (int c = 0; c < d; c += 16) {
			/* packs saturates a product rounded up to 32768 */
			const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c), inv));
			const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c + 8), inv));
			_mm256_storeu_si256((__m256i *)(void *)(iq + (size_t)g * d + c),
			                    _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8));
		}
	}
}

/* Up to 8 entries' integer partial dots acc[g·8 + k] (32-bit lanes) reduced into
 * S[g·ldS + ent[k]] = base[g] + D[g] · Σ: each lane is converted to f32 before the
 * horizontal sum, so no 32-bit sum of more than d/8 products is formed. */
AVX2_ATTR static void tier_qflush_avx2(const __m256i *acc, const int32_t *ent, int nb, int G,
                                       const float *base, const float *D, float *S, size_t ldS)
{
	__m256 f[8];
	float sum[8];
	for (int g = 0; g < G; g++) {
		for (int k = 0; k < 8; k++)
			f[k] = k < nb ? _mm256_cvtepi32_ps(acc[g * 8 + k]) : _mm256_setzero_ps();
		_mm256_storeu_ps(sum, hsum8_avx2(f));
		for (int k = 0; k < nb; k++)
			S[(size_t)g * ldS + ent[k]] = base[g] + D[g] * sum[k];
	}
}

/* Scores over a quantised tier's arena t: at each new key group the range is folded into
 * the queries q (H·q when keys are rotated) and the fold is rounded to 16 bits
 * (tier_qfold_avx2); an entry's codes, widened to 16 bits, are dotted with it by madd
 * (pairs of 16-bit products summed in 32-bit lanes: per lane at most d/8 products of
 * 255 · 32767, below 2^31 for d <= 1024). Entries are taken 8 at a time (of one group).
 * One walk for every ISA: tq_entry_SUF accumulates an entry's dots into its ACC_T lanes
 * acc[g·8 + nb], tier_qflush_SUF reduces up to 8 entries into S; tscores_SUF runs it on
 * every quantised tier after the top one. */
#define TSCORES_DEFINE(SUF, ATTR, ACC_T)                                                    \
	ATTR static void tqscores_##SUF(const rt_kv *kv, const rt_kv_head *h, int t, int32_t lim,  \
	                                const float *q, size_t ldq, int G, float scale, float *S,  \
	                                size_t ldS)                                                \
	{                                                                                          \
		const int d = kv->head_dim, kind = rt_kv_tier_codec(kv, t, 0);                         \
		const int bits = rt_kvq_bits((rt_kvq_kind)kind);                                       \
		const size_t sb = 2 * kv->tier_row[t];                                                 \
		const rt_kv_arena *a = &h->arena[t];                                                   \
		float qs[TIER_QG * TIER_MAXD], base[TIER_QG], D[TIER_QG];                              \
		int16_t iq[TIER_QG * TIER_MAXD];                                                       \
		ACC_T acc[TIER_QG * 8];                                                                \
		int32_t ent[8], g_have = -1;                                                           \
		int nb = 0;                                                                            \
		for (int32_t s = 0; s < a->n; s++) {                                                   \
			const int32_t e = a->owner[s];                                                     \
			if (e >= lim)                                                                      \
				continue;                                                                      \
			if (h->kgrp[e] != g_have) {                                                        \
				if (nb)                                                                        \
					tier_qflush_##SUF(acc, ent, nb, G, base, D, S, ldS);                       \
				nb = 0;                                                                        \
				g_have = h->kgrp[e];                                                           \
				tier_fold_avx2(kind, rt_kv_kgroup_range(kv, h, g_have), d, q, ldq, G, scale,   \
				               qs, base);                                                      \
				tier_qfold_avx2(qs, d, G, iq, D);                                              \
			}                                                                                  \
			tq_entry_##SUF(acc + nb, G, bits, a->rows + (size_t)s * sb, iq, d);                \
			ent[nb++] = e;                                                                     \
			if (nb == 8) {                                                                     \
				tier_qflush_##SUF(acc, ent, nb, G, base, D, S, ldS);                           \
				nb = 0;                                                                        \
			}                                                                                  \
		}                                                                                      \
		if (nb)                                                                                \
			tier_qflush_##SUF(acc, ent, nb, G, base, D, S, ldS);                               \
	}                                                                                          \
	/* every tier: the top one's f16 rows by ttop_scores_avx2 (at 512 bits no faster) */       \
	ATTR static void tscores_##SUF(const rt_kv *kv, const rt_kv_head *h, int32_t lim,         \
	                               const float *q, size_t ldq, const float *qr, size_t ldqr,   \
	                               int G, float scale, float *S, size_t ldS)                   \
	{                                                                                          \
		const int d = kv->head_dim;                                                            \
		float qs[TIER_QG * TIER_MAXD];                                                         \
		for (int g = 0; g < G; g++)                                                            \
			for (int c = 0; c < d; c++)                                                        \
				qs[(size_t)g * d + c] = scale * q[(size_t)g * ldq + c];                        \
		ttop_scores_avx2(kv, h, lim, G, qs, S, ldS);                                           \
		for (int t = RT_KV_TIER_TOP + 1; t < RT_KV_N_TIER; t++)                                \
			if (h->arena[t].n)                                                                 \
				tqscores_##SUF(kv, h, t, lim, qr, ldqr, G, scale, S, ldS);                     \
	}

/* One entry's integer dots with the G folded queries iq[G × d]: acc[g·8] (the entry's lane
 * of query row g), two 256-bit madds per 32 channels and query row. */
AVX2_ATTR static inline void tq_entry_avx2(__m256i *acc, int G, int bits, const uint8_t *row,
                                           const int16_t *iq, int d)
{
	const size_t cb = (size_t)32 * bits / 8;
	for (int g = 0; g < G; g++)
		acc[g * 8] = _mm256_setzero_si256();
	for (int c0 = 0; c0 < d; c0 += 32, row += cb) {
		__m128i lo, hi;
		codes32_avx2(bits, row, &lo, &hi);
		const __m256i x0 = _mm256_cvtepu8_epi16(lo), x1 = _mm256_cvtepu8_epi16(hi);
		for (int g = 0; g < G; g++) {
			const int16_t *w = iq + (size_t)g * d + c0;
			const __m256i u = _mm256_madd_epi16(x0, _mm256_loadu_si256((const __m256i *)(const void *)w));
			const __m256i v = _mm256_madd_epi16(x1, _mm256_loadu_si256((const __m256i *)(const void *)(w + 16)));
			acc[g * 8] = _mm256_add_epi32(acc[g * 8], _mm256_add_epi32(u, v));
		}
	}
}

TSCORES_DEFINE(avx2, AVX2_ATTR, __m256i)

/* A value group at row: its f16 scale and minimum (*sc, *mn) and its codes, or, in the top
 * tier's f16 rows (top), 1, 0 and the row itself. */
AVX2_ATTR static inline const uint8_t *vgroup_avx2(int top, const uint8_t *row, float *sc,
                                                   float *mn)
{
	if (top) {
		*sc = 1, *mn = 0;
		return row;
	}
	uint16_t hdr[2];
	memcpy(hdr, row, 4);
	*sc = _cvtsh_ss(hdr[0]);
	*mn = _cvtsh_ss(hdr[1]);
	return row + 4;
}

/* Channels [c0, c0 + 32) of out for query heads [g0, g0 + ng) (ng <= 3: 12 accumulators in
 * registers), over every arena: Σ p · (s · code + m) as Σ (p·s) · code plus Σ p·m. */
AVX2_ATTR static void tmix_chunk_avx2(const rt_kv *kv, const rt_kv_head *h, int32_t lim,
                                      const float *P, size_t ldP, int g0, int ng, int c0,
                                      float *out, size_t ldo, int t0, int t1)
{
	__m256 acc[3][4];
	float bias[3] = { 0, 0, 0 };
	for (int g = 0; g < 3; g++)
		for (int j = 0; j < 4; j++)
			acc[g][j] = _mm256_setzero_ps();
	for (int t = t0; t < t1; t++) {
		const rt_kv_arena *a = &h->arena[t];
		const int kind = rt_kv_tier_codec(kv, t, 1);
		const int bits = t == RT_KV_TIER_TOP ? 16 : rt_kvq_bits((rt_kvq_kind)kind);
		const size_t sb = 2 * kv->tier_row[t];
		/* the chunk's bytes: 32 halves, or a value group (f16 scale, f16 minimum, codes) */
		const size_t off = kv->tier_krow[t] +
		                   (t == RT_KV_TIER_TOP ? (size_t)c0 * 2 : (size_t)(c0 / 32) * (4 + 4 * bits));
		for (int32_t s = 0; s < a->n; s++) {
			const int32_t e = a->owner[s];
			if (e >= lim)
				continue;
			float sc, mn;
			const uint8_t *codes = vgroup_avx2(t == RT_KV_TIER_TOP, a->rows + (size_t)s * sb + off,
			                                   &sc, &mn);
			__m256 x[4];
			chunk32_avx2(bits, codes, x);
			for (int g = 0; g < ng; g++) {
				const float p = P[(size_t)(g0 + g) * ldP + e];
				const __m256 w = _mm256_set1_ps(p * sc);
				bias[g] += p * mn;
				for (int j = 0; j < 4; j++)
					acc[g][j] = _mm256_fmadd_ps(w, x[j], acc[g][j]);
			}
		}
	}
	for (int g = 0; g < ng; g++) {
		const __m256 b = _mm256_set1_ps(bias[g]);
		for (int j = 0; j < 4; j++)
			_mm256_storeu_ps(out + (size_t)(g0 + g) * ldo + c0 + 8 * j, _mm256_add_ps(acc[g][j], b));
	}
}

AVX2_ATTR static void tmix_avx2(const rt_kv *kv, const rt_kv_head *h, int32_t lim,
                                const float *P, size_t ldP, int G, float *out, size_t ldo,
                                int t0, int t1)
{
	for (int c0 = 0; c0 < kv->head_dim; c0 += 32)
		for (int g0 = 0; g0 < G; g0 += 3)
			tmix_chunk_avx2(kv, h, lim, P, ldP, g0, G - g0 < 3 ? G - g0 : 3, c0, out, ldo, t0,
			                t1);
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


/* The tiered kernels at 512 bits: the quantised tiers' scores and every tier's mix in about
 * half AVX2's instructions per entry (the top tier's f16 scores stay AVX2's: 512 bits
 * measured no faster there). Each gives AVX2's bits: tqscores_avx512's 32-bit lanes are
 * folded (upper half onto lower) into the very integer sums AVX2's lanes hold before
 * tier_qflush_avx2 converts them, and tmix_avx512 does per channel the fused multiply-adds
 * of tmix_chunk_avx2 in the same entry order, 64 channels (two value groups) per walk of
 * an arena instead of 32. test_kvtattn checks both against the decoded rows at every ISA
 * and for bits equal to AVX2's. */

/* codes32_avx2's 32 codes widened to 16-bit lanes in channel order */
AVX512_ATTR static inline __m512i codes32_w16_avx512(int bits, const uint8_t *p)
{
	__m128i lo, hi;
	codes32_avx2(bits, p, &lo, &hi);
	return _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* tier_qflush_avx2 over 512-bit accumulators: lane k + 8 added to lane k (exact) */
AVX512_ATTR static void tier_qflush_avx512(const __m512i *acc, const int32_t *ent, int nb, int G,
                                           const float *base, const float *D, float *S,
                                           size_t ldS)
{
	__m256i a[TIER_QG * 8];
	for (int g = 0; g < G; g++)
		for (int k = 0; k < nb; k++)
			a[g * 8 + k] = _mm256_add_epi32(_mm512_castsi512_si256(acc[g * 8 + k]),
			                                _mm512_extracti64x4_epi64(acc[g * 8 + k], 1));
	tier_qflush_avx2(a, ent, nb, G, base, D, S, ldS);
}

/* tq_entry_avx2 with one 512-bit madd per 32 channels and query row (AVX2: two, plus an
 * add) */
AVX512_ATTR static inline void tq_entry_avx512(__m512i *acc, int G, int bits, const uint8_t *row,
                                               const int16_t *iq, int d)
{
	const size_t cb = (size_t)32 * bits / 8;
	for (int g = 0; g < G; g++)
		acc[g * 8] = _mm512_setzero_si512();
	for (int c0 = 0; c0 < d; c0 += 32, row += cb) {
		const __m512i x = codes32_w16_avx512(bits, row);
		for (int g = 0; g < G; g++)
			acc[g * 8] = _mm512_add_epi32(
				acc[g * 8], _mm512_madd_epi16(x, _mm512_loadu_si512((const void *)(iq + (size_t)g * d + c0))));
	}
}

TSCORES_DEFINE(avx512, AVX512_ATTR, __m512i)

/* 32 channels of a row as floats x[0..2) (chunk32_avx2's, 16 lanes each) */
AVX512_ATTR static inline void chunk32_avx512(int bits, const uint8_t *p, __m512 x[2])
{
	if (bits == 16) {
		x[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
		x[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 32)));
		return;
	}
	__m128i lo, hi;
	codes32_avx2(bits, p, &lo, &hi);
	x[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo));
	x[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi));
}

/* tmix_chunk_avx2 for channels [c0, c0 + 32·nc), nc <= 2 value groups, query heads
 * [g0, g0 + ng), ng <= 3 (12 accumulators) */
AVX512_ATTR static void tmix_chunk_avx512(const rt_kv *kv, const rt_kv_head *h, int32_t lim,
                                          const float *P, size_t ldP, int g0, int ng, int c0,
                                          int nc, float *out, size_t ldo, int t0, int t1)
{
	__m512 acc[3][4];
	float bias[3][2] = { { 0, 0 }, { 0, 0 }, { 0, 0 } };
	for (int g = 0; g < 3; g++)
		for (int j = 0; j < 4; j++)
			acc[g][j] = _mm512_setzero_ps();
	for (int t = t0; t < t1; t++) {
		const rt_kv_arena *a = &h->arena[t];
		const int top = t == RT_KV_TIER_TOP;
		const int bits = top ? 16 : rt_kvq_bits((rt_kvq_kind)rt_kv_tier_codec(kv, t, 1));
		const size_t sb = 2 * kv->tier_row[t], gb = top ? 64 : (size_t)(4 + 4 * bits);
		const size_t off = kv->tier_krow[t] + (size_t)(c0 / 32) * gb;
		for (int32_t s = 0; s < a->n; s++) {
			const int32_t e = a->owner[s];
			if (e >= lim)
				continue;
			const uint8_t *row = a->rows + (size_t)s * sb + off;
			for (int k = 0; k < nc; k++, row += gb) {
				float sc, mn;
				const uint8_t *codes = vgroup_avx2(top, row, &sc, &mn);
				__m512 x[2];
				chunk32_avx512(bits, codes, x);
				for (int g = 0; g < ng; g++) {
					const float p = P[(size_t)(g0 + g) * ldP + e];
					const __m512 w = _mm512_set1_ps(p * sc);
					bias[g][k] += p * mn;
					acc[g][2 * k] = _mm512_fmadd_ps(w, x[0], acc[g][2 * k]);
					acc[g][2 * k + 1] = _mm512_fmadd_ps(w, x[1], acc[g][2 * k + 1]);
				}
			}
		}
	}
	for (int g = 0; g < ng; g++)
		for (int j = 0; j < 2 * nc; j++)
			_mm512_storeu_ps(out + (size_t)(g0 + g) * ldo + c0 + 16 * j,
			                 _mm512_add_ps(acc[g][j], _mm512_set1_ps(bias[g][j / 2])));
}

AVX512_ATTR static void tmix_avx512(const rt_kv *kv, const rt_kv_head *h, int32_t lim,
                                    const float *P, size_t ldP, int G, float *out, size_t ldo,
                                    int t0, int t1)
{
	for (int c0 = 0; c0 < kv->head_dim; c0 += 64) {
		const int nc = kv->head_dim - c0 >= 64 ? 2 : 1;
		for (int g0 = 0; g0 < G; g0 += 3)
			tmix_chunk_avx512(kv, h, lim, P, ldP, g0, G - g0 < 3 ? G - g0 : 3, c0, nc, out,
			                  ldo, t0, t1);
	}
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

/* [isa]: the tiered-head kernels */
typedef struct tier_kernels {
	/* q: the top tier's queries, qr: the quantised tiers' (H·q when keys are rotated) */
	void (*scores)(const rt_kv *kv, const rt_kv_head *h, int32_t lim, const float *q,
	               size_t ldq, const float *qr, size_t ldqr, int G, float scale, float *S,
	               size_t ldS);
	/* over the arenas of tiers [t0, t1) */
	void (*mix)(const rt_kv *kv, const rt_kv_head *h, int32_t lim, const float *P, size_t ldP,
	            int G, float *out, size_t ldo, int t0, int t1);
} tier_kernels;

static const tier_kernels tier_table[3] = {
	{ tscores_scalar, tmix_scalar },
#ifdef KVATTN_X86
	{ tscores_avx2, tmix_avx2 },
	{ tscores_avx512, tmix_avx512 },
#endif
};

static const tier_kernels *tier_get(const rt_kv *kv, const rt_kv_head *h, int32_t lim, int isa)
{
	RT_ASSERT(kv->tiered && kv->head_dim <= TIER_MAXD && lim >= 0 && lim <= h->n);
	int best = rt_dot_isa_best();
	isa = isa > best ? best : isa < RT_ISA_SCALAR ? RT_ISA_SCALAR : isa;
#ifndef KVATTN_X86
	isa = RT_ISA_SCALAR;
#endif
	if (kv->type != RT_KV_F16)
		isa = RT_ISA_SCALAR; /* the vector kernels read an f16 top tier */
	return &tier_table[isa];
}

void rt_kvattn_tier_scores(const rt_kv *kv, const rt_kv_head *h, int32_t lim, const float *q,
                           size_t ldq, int G, float scale, float *S, size_t ldS, int isa)
{
	const tier_kernels *tk = tier_get(kv, h, lim, isa);
	const int d = kv->head_dim;
	float qr[TIER_QG * TIER_MAXD];
	for (int g0 = 0; g0 < G; g0 += TIER_QG) {
		const int ng = G - g0 < TIER_QG ? G - g0 : TIER_QG;
		const float *qg = q + (size_t)g0 * ldq, *qq = qg;
		size_t ldr = ldq;
		if (kv->rot_keys) {
			for (int g = 0; g < ng; g++) {
				memcpy(qr + (size_t)g * d, qg + (size_t)g * ldq, (size_t)d * sizeof(float));
				rt_kvq_rotate(qr + (size_t)g * d, d);
			}
			qq = qr;
			ldr = (size_t)d;
		}
		tk->scores(kv, h, lim, qg, ldq, qq, ldr, ng, scale, S + (size_t)g0 * ldS, ldS);
	}
}

void rt_kvattn_tier_mix(const rt_kv *kv, const rt_kv_head *h, int32_t lim, const float *P,
                        size_t ldP, int G, float *out, size_t ldo, int isa)
{
	const tier_kernels *tk = tier_get(kv, h, lim, isa);
	if (!kv->rot_values) {
		tk->mix(kv, h, lim, P, ldP, G, out, ldo, 0, RT_KV_N_TIER);
		return;
	}
	/* the top tier as stored, the quantised tiers' sum rotated back once: H Σ p·(H v) */
	const int d = kv->head_dim;
	float tmp[TIER_QG * TIER_MAXD];
	tk->mix(kv, h, lim, P, ldP, G, out, ldo, RT_KV_TIER_TOP, RT_KV_TIER_TOP + 1);
	for (int g0 = 0; g0 < G; g0 += TIER_QG) {
		const int ng = G - g0 < TIER_QG ? G - g0 : TIER_QG;
		tk->mix(kv, h, lim, P + (size_t)g0 * ldP, ldP, ng, tmp, (size_t)d, RT_KV_TIER_TOP + 1,
		        RT_KV_N_TIER);
		for (int g = 0; g < ng; g++) {
			float *o = out + (size_t)(g0 + g) * ldo, *u = tmp + (size_t)g * d;
			rt_kvq_rotate(u, d);
			for (int c = 0; c < d; c++)
				o[c] += u[c];
		}
	}
}
