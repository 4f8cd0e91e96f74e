/*
 * rt_dot: quantised dot-product kernels (scalar reference, AVX2, AVX-512 VNNI) and the
 * activation quantisers; see rt_dot.h for the formats and the maths. Block layouts of the
 * weights are those of ggml-common.h (the same as rt_quant.c decodes). Weight blocks are
 * read with unaligned loads: GGUF tensor data is only 32-byte aligned as a whole and the
 * blocks are 18, 20, 22, 24, 34, 144, 176 or 210 bytes long.
 */
#include "model/rt_dot.h"

#include <cpuid.h>
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/rt_gguf.h"
#include "base/rt_util.h"

#define QK 32
#define QK_K 256

static size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

static inline float ld_f16(const uint8_t *p)
{
	return rt_fp16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* ---- activation buffers ----------------------------------------------------------- */

/* 32-blocks: d[nb] s[nb] f32, then the codes at a 64-byte offset. */
static size_t q8b_codes_off(int n)
{
	return align64((size_t)(n / QK) * 2 * sizeof(float));
}

/* 256-blocks: d[nb] f32, codes at a 64-byte offset, then n/16 int16 sums. */
static size_t q8k_codes_off(int n)
{
	return align64((size_t)(n / QK_K) * sizeof(float));
}

size_t rt_dot_act_bytes(uint32_t wtype, int n)
{
	if (n <= 0)
		return 0;
	switch (wtype) {
	case RT_GGML_Q4_0:
	case RT_GGML_Q4_1:
	case RT_GGML_Q5_0:
	case RT_GGML_Q5_1:
	case RT_GGML_Q8_0:
		return n % QK ? 0 : align64(q8b_codes_off(n) + (size_t)n);
	case RT_GGML_Q4_K:
	case RT_GGML_Q5_K:
	case RT_GGML_Q6_K:
		return n % QK_K ? 0 : align64(q8k_codes_off(n) + (size_t)n + (size_t)n / 16 * 2);
	case RT_GGML_F16:
	case RT_GGML_F32:
		return align64((size_t)n * sizeof(float));
	default:
		return 0;
	}
}

/* 1 when x[0..n) holds a NaN or an infinity. Such an activation (from a model file whose
 * weights or norms are not finite) must not reach the float-to-int conversion of the
 * quantisers, which is undefined for it; its block gets scale NaN instead, so the dot
 * products come out NaN, as the exact f32 path's would. */
static int block_not_finite(const float *x, int n)
{
	float acc = 0.0f;
	for (int j = 0; j < n; j++)
		acc += x[j] * 0.0f; /* 0 for every finite x, NaN for a NaN or an infinity */
	return acc != acc;
}

/* Below this largest magnitude a block of activations quantises to zeros: 127/amax and
 * 1/(amax/127) stay finite for every amax >= 128·FLT_MIN (about 1.5e-36), so the codes
 * x·(127/amax) stay within ±127. */
#define TINY_AMAX (128.0f * FLT_MIN)

/* One Q8_0/Q8_1 block of 32: d = max|x|/127, q = round(x/d), s = d·Σq (quantize_row_q8_1). */
static void q8b_block(const float *xb, float *d, float *s, int8_t *q)
{
	if (block_not_finite(xb, QK)) {
		*d = *s = NAN;
		memset(q, 0, QK);
		return;
	}
	float amax = 0.0f;
	for (int j = 0; j < QK; j++)
		amax = fmaxf(amax, fabsf(xb[j]));
	/* A block whose largest value is below TINY_AMAX is stored as zeros: its scale would
	 * be subnormal and 1/scale infinite, and 0·inf is NaN (a crafted GGUF found it). */
	const float db = amax < TINY_AMAX ? 0.0f : amax / 127.0f;
	const float id = db != 0.0f ? 1.0f / db : 0.0f;
	int sum = 0;
	for (int j = 0; j < QK; j++) {
		const int v = (int)roundf(xb[j] * id);
		q[j] = (int8_t)v;
		sum += v;
	}
	*d = db;
	*s = db * (float)sum;
}

static void quant_q8b(const float *x, void *xa, int n)
{
	const int nb = n / QK;
	float *d = xa, *s = d + nb;
	int8_t *q = (int8_t *)xa + q8b_codes_off(n);
	for (int b = 0; b < nb; b++)
		q8b_block(x + (size_t)b * QK, d + b, s + b, q + (size_t)b * QK);
}

/* Q8_K blocks of 256 (quantize_row_q8_K_ref): d = max/-127 for the signed value of largest
 * magnitude, q = min(127, round(x/d)), sums of each 16 codes. */
static void quant_q8k(const float *x, void *xa, int n)
{
	const int nb = n / QK_K;
	float *d = xa;
	int8_t *q = (int8_t *)xa + q8k_codes_off(n);
	int16_t *bs = (int16_t *)(q + n);
	for (int b = 0; b < nb; b++) {
		const float *xb = x + (size_t)b * QK_K;
		float max = 0.0f, amax = 0.0f;
		for (int j = 0; j < QK_K; j++) {
			const float ax = fabsf(xb[j]);
			if (ax > amax) {
				amax = ax;
				max = xb[j];
			}
		}
		int8_t *qb = q + (size_t)b * QK_K;
		if (block_not_finite(xb, QK_K)) {
			d[b] = NAN;
			memset(qb, 0, QK_K);
			memset(bs + b * 16, 0, 16 * sizeof(int16_t));
			continue;
		}
		if (amax < TINY_AMAX) { /* zero, or so small that -127/max would overflow */
			d[b] = 0.0f;
			memset(qb, 0, QK_K);
			memset(bs + b * 16, 0, 16 * sizeof(int16_t));
			continue;
		}
		const float iscale = -127.0f / max;
		for (int j = 0; j < QK_K; j++) {
			const int v = (int)roundf(iscale * xb[j]);
			qb[j] = (int8_t)(v < 127 ? v : 127);
		}
		for (int g = 0; g < 16; g++) {
			int sum = 0;
			for (int j = 0; j < 16; j++)
				sum += qb[g * 16 + j];
			bs[b * 16 + g] = (int16_t)sum;
		}
		d[b] = 1.0f / iscale;
	}
}

static void quant_f32(const float *x, void *xa, int n)
{
	memcpy(xa, x, (size_t)n * sizeof(float));
}

/* ---- scalar reference kernels ----------------------------------------------------- */

static float dot_q4_0_scalar(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 18, q += QK) {
		int isum = 0;
		for (int j = 0; j < QK / 2; j++)
			isum += (w[2 + j] & 0x0F) * q[j] + (w[2 + j] >> 4) * q[j + QK / 2];
		const float dw = ld_f16(w);
		sum += dw * (d[b] * (float)isum - 8.0f * s[b]);
	}
	return sum;
}

static float dot_q4_1_scalar(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 20, q += QK) {
		int isum = 0;
		for (int j = 0; j < QK / 2; j++)
			isum += (w[4 + j] & 0x0F) * q[j] + (w[4 + j] >> 4) * q[j + QK / 2];
		sum += ld_f16(w) * d[b] * (float)isum + ld_f16(w + 2) * s[b];
	}
	return sum;
}

static inline uint32_t ld_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Σ_j code_j·q_j over a Q5_0/Q5_1 block: code j (0..31) is nibble j of qs (the low
 * nibbles are values 0..15, the high ones 16..31) with bit j of qh as its 5th bit */
static inline int q5_isum(const uint8_t *qs, uint32_t qh, const int8_t *q)
{
	int isum = 0;
	for (int j = 0; j < QK / 2; j++) {
		const int lo = (qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
		const int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
		isum += lo * q[j] + hi * q[j + QK / 2];
	}
	return isum;
}

/* Q5_0, 22 bytes (d f16, qh u32, qs[16]): dw·(dx·Σ code·qx - 16·sx) */
static float dot_q5_0_scalar(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 22, q += QK)
		sum += ld_f16(w) * (d[b] * (float)q5_isum(w + 6, ld_u32(w + 2), q) - 16.0f * s[b]);
	return sum;
}

/* Q5_1, 24 bytes (d f16, m f16, qh u32, qs[16]): dw·dx·Σ code·qx + mw·sx */
static float dot_q5_1_scalar(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 24, q += QK)
		sum += ld_f16(w) * d[b] * (float)q5_isum(w + 8, ld_u32(w + 4), q) + ld_f16(w + 2) * s[b];
	return sum;
}

static float dot_q8_0_scalar(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 34, q += QK) {
		const int8_t *qw = (const int8_t *)(w + 2);
		int isum = 0;
		for (int j = 0; j < QK; j++)
			isum += qw[j] * q[j];
		sum += ld_f16(w) * d[b] * (float)isum;
	}
	return sum;
}

/* 6-bit scale and min j of a Q4_K block (get_scale_min_k4 in ggml-quants.c). */
static inline void scale_min_k4(int j, const uint8_t *q, int *d, int *m)
{
	if (j < 4) {
		*d = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
	}
}

/* Σ_j m_j·(bsum[2j] + bsum[2j+1]) and the 8 scales of one Q4_K block. */
static inline int q4k_scales(const uint8_t *scales, const int16_t *bs, int sc[8])
{
	int summ = 0;
	for (int j = 0; j < 8; j++) {
		int m;
		scale_min_k4(j, scales, &sc[j], &m);
		summ += m * (bs[2 * j] + bs[2 * j + 1]);
	}
	return summ;
}

static float dot_q4_k_scalar(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK_K;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8k_codes_off(n);
	const int16_t *bs = (const int16_t *)(q + n);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 144, q += QK_K, bs += 16) {
		int sc[8];
		const int summ = q4k_scales(w + 4, bs, sc);
		const uint8_t *qs = w + 16;
		int isum = 0;
		for (int k = 0; k < 4; k++) {
			int lo = 0, hi = 0;
			for (int l = 0; l < 32; l++) {
				lo += (qs[32 * k + l] & 0x0F) * q[64 * k + l];
				hi += (qs[32 * k + l] >> 4) * q[64 * k + 32 + l];
			}
			isum += sc[2 * k] * lo + sc[2 * k + 1] * hi;
		}
		sum += ld_f16(w) * d[b] * (float)isum - ld_f16(w + 2) * d[b] * (float)summ;
	}
	return sum;
}

/* Q5_K, 176 bytes (d, dmin, scales[12], qh[32], qs[128]): Q4_K's sums with the 5th bit of
 * value 64k + l (low nibble) at bit 2k of qh[l], of value 64k + 32 + l at bit 2k + 1 */
static float dot_q5_k_scalar(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK_K;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8k_codes_off(n);
	const int16_t *bs = (const int16_t *)(q + n);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 176, q += QK_K, bs += 16) {
		int sc[8];
		const int summ = q4k_scales(w + 4, bs, sc);
		const uint8_t *qh = w + 16, *qs = w + 48;
		int isum = 0;
		for (int k = 0; k < 4; k++) {
			int lo = 0, hi = 0;
			for (int l = 0; l < 32; l++) {
				lo += ((qs[32 * k + l] & 0x0F) | (((qh[l] >> (2 * k)) & 1) << 4)) * q[64 * k + l];
				hi += ((qs[32 * k + l] >> 4) | (((qh[l] >> (2 * k + 1)) & 1) << 4)) * q[64 * k + 32 + l];
			}
			isum += sc[2 * k] * lo + sc[2 * k + 1] * hi;
		}
		sum += ld_f16(w) * d[b] * (float)isum - ld_f16(w + 2) * d[b] * (float)summ;
	}
	return sum;
}

/* 6-bit code of value e (0..255) of a Q6_K block, unsigned (0..63). */
static inline int q6k_code(const uint8_t *w, int e)
{
	const int half = e / 128, t = (e % 128) / 32, l = e % 32;
	const uint8_t *ql = w + 64 * half, *qh = w + 128 + 32 * half;
	const int lo = t & 1 ? ql[l + 32] : ql[l];
	const int nib = t >= 2 ? lo >> 4 : lo & 0x0F;
	return nib | (((qh[l] >> (2 * t)) & 3) << 4);
}

static float dot_q6_k_scalar(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK_K;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8k_codes_off(n);
	const int16_t *bs = (const int16_t *)(q + n);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 210, q += QK_K, bs += 16) {
		const int8_t *sc = (const int8_t *)(w + 192);
		int isum = 0;
		for (int g = 0; g < 16; g++) {
			int s = 0;
			for (int j = 0; j < 16; j++)
				s += q6k_code(w, g * 16 + j) * q[g * 16 + j];
			isum += sc[g] * (s - 32 * bs[g]);
		}
		sum += ld_f16(w + 208) * d[b] * (float)isum;
	}
	return sum;
}

/* sum + Σ w_j·x_j over j = i..n-1, added one at a time in order: the F16/F32 scalar
 * kernels (i = 0), and the tails the vector kernels leave after their last full step */
static inline float f16_run(const uint8_t *w, const float *x, int i, int n, float sum)
{
	for (; i < n; i++)
		sum += ld_f16(w + 2 * i) * x[i];
	return sum;
}

static inline float f32_run(const void *w, const float *x, int i, int n, float sum)
{
	for (; i < n; i++) {
		float wi;
		memcpy(&wi, (const uint8_t *)w + 4 * (size_t)i, 4);
		sum += wi * x[i];
	}
	return sum;
}

static float dot_f16_scalar(const void *wv, const void *xa, int n)
{
	return f16_run(wv, xa, 0, n, 0.0f);
}

static float dot_f32_scalar(const void *wv, const void *xa, int n)
{
	return f32_run(wv, xa, 0, n, 0.0f);
}

/* ---- AVX2 ---------------------------------------------------------------------------- */

#define AVX2_ATTR __attribute__((target("avx2,fma,f16c")))

AVX2_ATTR static inline float hsum256(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

AVX2_ATTR static inline int hsum256_i32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
	return _mm_cvtsi128_si32(s);
}

AVX2_ATTR static inline float f16_avx2(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

/* the 32 nibbles of a 16-byte run as bytes: low nibbles (values 0..15) then high */
AVX2_ATTR static inline __m256i nibbles_avx2(const uint8_t *p)
{
	const __m128i raw = _mm_loadu_si128((const __m128i *)p);
	const __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
	return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* Σ over 8 int32 lanes of unsigned a[i]·signed b[i] pairs (maddubs then madd) */
AVX2_ATTR static inline __m256i dot_u8s8_avx2(__m256i a, __m256i b)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* A matrix's rows lie back to back and a matvec reads them in order once per token, so
 * the bytes PREFETCH_AHEAD beyond a block (in this row or the next ones) are wanted soon;
 * the hardware prefetcher alone leaves the core waiting on them. */
#define PREFETCH_AHEAD 2048

static inline void prefetch_ahead(const uint8_t *w)
{
	_mm_prefetch((const char *)((uintptr_t)w + PREFETCH_AHEAD), _MM_HINT_T0);
}

AVX2_ATTR static float dot_q4_0_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	__m256 acc = _mm256_setzero_ps();
	float corr = 0.0f;
	for (int b = 0; b < nb; b++, w += 18) {
		prefetch_ahead(w);
		const __m256i y = _mm256_loadu_si256((const __m256i *)(q + (size_t)b * QK));
		const __m256i p = dot_u8s8_avx2(nibbles_avx2(w + 2), y);
		const float dw = f16_avx2(w);
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * d[b]), acc);
		corr += dw * s[b];
	}
	return hsum256(acc) - 8.0f * corr;
}

AVX2_ATTR static float dot_q4_1_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	__m256 acc = _mm256_setzero_ps();
	float mins = 0.0f;
	for (int b = 0; b < nb; b++, w += 20) {
		prefetch_ahead(w);
		const __m256i y = _mm256_loadu_si256((const __m256i *)(q + (size_t)b * QK));
		const __m256i p = dot_u8s8_avx2(nibbles_avx2(w + 4), y);
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16_avx2(w) * d[b]), acc);
		mins += f16_avx2(w + 2) * s[b];
	}
	return hsum256(acc) + mins;
}

/* Decode batches (rt_dot_xrows_fn): one Q4_1 weight row against nx activation rows, the
 * block's nibbles and scales decoded once for all of them; each row's accumulator takes
 * the operations dot_q4_1_avx2 does, in its order, so each result has its bits. */
AVX2_ATTR static void xrows_q4_1_avx2(const void *wv, const void *xa, size_t xs, int n, int nx,
                                      float *out)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const size_t qo = q8b_codes_off(n);
	__m256 acc[RT_DOT_XROWS];
	float mins[RT_DOT_XROWS];
	for (int c = 0; c < nx; c++)
		acc[c] = _mm256_setzero_ps(), mins[c] = 0.0f;
	for (int b = 0; b < nb; b++, w += 20) {
		prefetch_ahead(w);
		const __m256i nib = nibbles_avx2(w + 4);
		const float dw = f16_avx2(w), mw = f16_avx2(w + 2);
		for (int c = 0; c < nx; c++) {
			const uint8_t *x = (const uint8_t *)xa + (size_t)c * xs;
			const float *d = (const float *)x, *s = d + nb;
			const __m256i y = _mm256_loadu_si256((const __m256i *)(x + qo + (size_t)b * QK));
			const __m256i p = dot_u8s8_avx2(nib, y);
			acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * d[b]), acc[c]);
			mins[c] += mw * s[b];
		}
	}
	for (int c = 0; c < nx; c++)
		out[c] = hsum256(acc[c]) + mins[c];
}

/* The same for Q8_0 (dot_q8_0_avx2's operations per row). */
AVX2_ATTR static void xrows_q8_0_avx2(const void *wv, const void *xa, size_t xs, int n, int nx,
                                      float *out)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const size_t qo = q8b_codes_off(n);
	__m256 acc[RT_DOT_XROWS];
	for (int c = 0; c < nx; c++)
		acc[c] = _mm256_setzero_ps();
	for (int b = 0; b < nb; b++, w += 34) {
		prefetch_ahead(w);
		const __m256i x = _mm256_loadu_si256((const __m256i *)(w + 2));
		const __m256i ax = _mm256_sign_epi8(x, x);
		const float dw = f16_avx2(w);
		for (int c = 0; c < nx; c++) {
			const uint8_t *xr = (const uint8_t *)xa + (size_t)c * xs;
			const float *d = (const float *)xr;
			const __m256i y = _mm256_loadu_si256((const __m256i *)(xr + qo + (size_t)b * QK));
			const __m256i p = dot_u8s8_avx2(ax, _mm256_sign_epi8(y, x));
			acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * d[b]), acc[c]);
		}
	}
	for (int c = 0; c < nx; c++)
		out[c] = hsum256(acc[c]);
}

/* the 32 bits of qh as bytes: 0xFF where bit j is set (ggml's bytes_from_bits_32) */
AVX2_ATTR static inline __m256i bits_avx2(uint32_t qh)
{
	const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
	                                       0x0101010101010101, 0x0000000000000000);
	const __m256i bytes = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf),
	                                      _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
	return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* the 32 5-bit codes of a Q5_0/Q5_1 block as bytes, in value order */
AVX2_ATTR static inline __m256i q5_codes_avx2(const uint8_t *qs, uint32_t qh)
{
	return _mm256_or_si256(nibbles_avx2(qs), _mm256_and_si256(bits_avx2(qh), _mm256_set1_epi8(0x10)));
}

AVX2_ATTR static float dot_q5_0_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	__m256 acc = _mm256_setzero_ps();
	float corr = 0.0f;
	for (int b = 0; b < nb; b++, w += 22) {
		prefetch_ahead(w);
		const __m256i y = _mm256_loadu_si256((const __m256i *)(q + (size_t)b * QK));
		const __m256i p = dot_u8s8_avx2(q5_codes_avx2(w + 6, ld_u32(w + 2)), y);
		const float dw = f16_avx2(w);
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * d[b]), acc);
		corr += dw * s[b];
	}
	return hsum256(acc) - 16.0f * corr;
}

AVX2_ATTR static float dot_q5_1_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	__m256 acc = _mm256_setzero_ps();
	float mins = 0.0f;
	for (int b = 0; b < nb; b++, w += 24) {
		prefetch_ahead(w);
		const __m256i y = _mm256_loadu_si256((const __m256i *)(q + (size_t)b * QK));
		const __m256i p = dot_u8s8_avx2(q5_codes_avx2(w + 8, ld_u32(w + 4)), y);
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16_avx2(w) * d[b]), acc);
		mins += f16_avx2(w + 2) * s[b];
	}
	return hsum256(acc) + mins;
}

AVX2_ATTR static float dot_q8_0_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	__m256 acc = _mm256_setzero_ps();
	for (int b = 0; b < nb; b++, w += 34) {
		prefetch_ahead(w);
		const __m256i x = _mm256_loadu_si256((const __m256i *)(w + 2));
		const __m256i y = _mm256_loadu_si256((const __m256i *)(q + (size_t)b * QK));
		const __m256i p = dot_u8s8_avx2(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16_avx2(w) * d[b]), acc);
	}
	return hsum256(acc);
}

AVX2_ATTR static float dot_q4_k_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK_K;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8k_codes_off(n);
	const int16_t *bs = (const int16_t *)(q + n);
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 144, q += QK_K, bs += 16) {
		int sc[8];
		const int summ = q4k_scales(w + 4, bs, sc);
		__m256i acc = _mm256_setzero_si256();
		for (int k = 0; k < 4; k++) {
			const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * k));
			const __m256i lo = _mm256_and_si256(raw, m4);
			const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
			const __m256i y0 = _mm256_loadu_si256((const __m256i *)(q + 64 * k));
			const __m256i y1 = _mm256_loadu_si256((const __m256i *)(q + 64 * k + 32));
			const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0),
			                                     _mm256_set1_epi16((short)sc[2 * k]));
			const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1),
			                                     _mm256_set1_epi16((short)sc[2 * k + 1]));
			acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
		}
		sum += f16_avx2(w) * d[b] * (float)hsum256_i32(acc) - f16_avx2(w + 2) * d[b] * (float)summ;
	}
	return sum;
}

AVX2_ATTR static float dot_q5_k_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK_K;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8k_codes_off(n);
	const int16_t *bs = (const int16_t *)(q + n);
	const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 176, q += QK_K, bs += 16) {
		int sc[8];
		const int summ = q4k_scales(w + 4, bs, sc);
		const __m256i hb = _mm256_loadu_si256((const __m256i *)(w + 16));
		__m256i acc = _mm256_setzero_si256();
		for (int k = 0; k < 4; k++) {
			const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 48 + 32 * k));
			/* bit 2k (2k + 1) of each qh byte moved to bit 4: the shift stays below 8, so
			 * no bit of the neighbouring byte reaches bit 0 before the mask */
			const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), one), 4);
			const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * k + 1), one), 4);
			const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), h0);
			const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), h1);
			const __m256i y0 = _mm256_loadu_si256((const __m256i *)(q + 64 * k));
			const __m256i y1 = _mm256_loadu_si256((const __m256i *)(q + 64 * k + 32));
			const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0),
			                                     _mm256_set1_epi16((short)sc[2 * k]));
			const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1),
			                                     _mm256_set1_epi16((short)sc[2 * k + 1]));
			acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
		}
		sum += f16_avx2(w) * d[b] * (float)hsum256_i32(acc) - f16_avx2(w + 2) * d[b] * (float)summ;
	}
	return sum;
}

AVX2_ATTR static float dot_q6_k_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const int nb = n / QK_K;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8k_codes_off(n);
	const int16_t *bs = (const int16_t *)(q + n);
	const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
	float sum = 0.0f;
	for (int b = 0; b < nb; b++, w += 210, q += QK_K, bs += 16) {
		const int8_t *sc = (const int8_t *)(w + 192);
		__m256i acc = _mm256_setzero_si256();
		for (int half = 0; half < 2; half++) {
			const uint8_t *ql = w + 64 * half, *qh = w + 128 + 32 * half;
			const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
			const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
			const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
			__m256i c[4];
			c[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
			                       _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
			c[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
			                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
			c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
			                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
			c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
			                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
			for (int t = 0; t < 4; t++) {
				const int g = 8 * half + 2 * t;
				const __m256i y = _mm256_loadu_si256((const __m256i *)(q + 128 * half + 32 * t));
				const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
				acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(c[t], y), scv));
			}
		}
		int corr = 0;
		for (int g = 0; g < 16; g++)
			corr += sc[g] * bs[g];
		sum += f16_avx2(w + 208) * d[b] * (float)(hsum256_i32(acc) - 32 * corr);
	}
	return sum;
}

AVX2_ATTR static float dot_f16_avx2(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const float *x = xa;
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	int i = 0;
	for (; i + 16 <= n; i += 16) {
		const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i)));
		const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i + 16)));
		a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
		a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
	}
	return f16_run(w, x, i, n, hsum256(_mm256_add_ps(a0, a1)));
}

AVX2_ATTR static float dot_f32_avx2(const void *wv, const void *xa, int n)
{
	const float *w = wv, *x = xa;
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	int i = 0;
	for (; i + 16 <= n; i += 16) {
		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
		a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
	}
	return f32_run(w, x, i, n, hsum256(_mm256_add_ps(a0, a1)));
}

/* ---- AVX-512 (F, BW, VL, DQ, VNNI) --------------------------------------------------- */

#define AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

/* quant_q8b in AVX-512, bit for bit: the same scale (amax/127 in f32), the same products
 * x·(1/d) and roundf's halves away from zero, as trunc(t) + sign(t) where |t - trunc(t)| >=
 * 1/2 (t - trunc(t) is exact for |t| < 2^23). Blocks that are not finite or below
 * TINY_AMAX take the scalar code. */
AVX512_ATTR static void quant_q8b_avx512(const float *x, void *xa, int n)
{
	const int nb = n / QK;
	float *d = xa, *s = d + nb;
	int8_t *q = (int8_t *)xa + q8b_codes_off(n);
	const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
	for (int b = 0; b < nb; b++) {
		const float *xb = x + (size_t)b * QK;
		const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
		const __m512 z0 = _mm512_mul_ps(x0, _mm512_setzero_ps()), z1 = _mm512_mul_ps(x1, _mm512_setzero_ps());
		const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
		if (_mm512_cmp_ps_mask(z0, z1, _CMP_UNORD_Q) || amax < TINY_AMAX) {
			q8b_block(xb, d + b, s + b, q + (size_t)b * QK);
			continue;
		}
		const float db = amax / 127.0f;
		const __m512 id = _mm512_set1_ps(1.0f / db);
		__m512i v[2];
		const __m512 xs[2] = { x0, x1 };
		for (int h = 0; h < 2; h++) {
			const __m512 t = _mm512_mul_ps(xs[h], id);
			const __m512 tr = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
			const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(t, tr)), half, _CMP_GE_OQ);
			const __m512 r = _mm512_mask_add_ps(tr, up, tr, _mm512_or_ps(one, _mm512_and_ps(t, _mm512_set1_ps(-0.0f))));
			v[h] = _mm512_cvtps_epi32(r);
			_mm_storeu_si128((__m128i *)(q + (size_t)b * QK + 16 * h), _mm512_cvtepi32_epi8(v[h]));
		}
		const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(v[0], v[1]));
		d[b] = db;
		s[b] = db * (float)sum;
	}
}

AVX512_ATTR static float dot_f16_avx512(const void *wv, const void *xa, int n)
{
	const uint8_t *w = wv;
	const float *x = xa;
	__m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
	int i = 0;
	for (; i + 32 <= n; i += 32) {
		const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * i)));
		const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * i + 32)));
		a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), a0);
		a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), a1);
	}
	return f16_run(w, x, i, n, _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)));
}

AVX512_ATTR static float dot_f32_avx512(const void *wv, const void *xa, int n)
{
	const float *w = wv, *x = xa;
	__m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
	int i = 0;
	for (; i + 32 <= n; i += 32) {
		a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
		a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
	}
	return f32_run(w, x, i, n, _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)));
}

/* ---- AVX-512 rows: the legacy formats, up to RT_DOT_ROWS weight rows per call --------
 * A decode matvec calls one kernel per output; these share each activation load among
 * R rows (R = 1..4, a compile-time constant of each instantiation) and handle the f32
 * scales 16 blocks at a time: one 32-bit gather per row and group reads every block's
 * first word (d, and for Q4_1 m, which follows it), _mm512_cvtph_ps converts the 16
 * half-words at once, the products dw·dx are formed as a vector, and each step picks the
 * two scales it needs with one permute. The Q4 mins (Σ m·s, and Q4_0's -8·Σ d·s) are one
 * vector FMA per group. A row's operations do not depend on R, so a row gives the same
 * bits whichever R computed it (rt_matmul relies on it: results do not depend on the
 * thread count). */

/* the 16 words at w + stride·j (j < 16, lanes outside mask m zero) as f32: the low
 * half-words in *lo, the high ones in *hi (NULL: not wanted) */
AVX512_ATTR static inline void f16_gather16(const uint8_t *w, int stride, __mmask16 m, __m512 *lo,
                                            __m512 *hi)
{
	const __m512i offs = _mm512_mullo_epi32(
		_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(stride));
	const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offs, w, 1);
	*lo = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
	if (hi)
		*hi = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
}

/* mask of the first k (0..16) lanes */
static inline __mmask16 first_lanes(int k)
{
	return (__mmask16)((1u << k) - 1u);
}

/* nibbles of two 4-bit blocks' 16-byte runs p0, p1 as [p0 lo, p1 lo, p0 hi, p1 hi] (p1
 * NULL: zeros); pairs with activation codes in that order (y_q4_order) */
AVX512_ATTR static inline __m512i nib_pair(const uint8_t *p0, const uint8_t *p1)
{
	const __m128i a = _mm_loadu_si128((const __m128i *)p0);
	const __m256i raw = p1 ? _mm256_inserti128_si256(_mm256_castsi128_si256(a),
	                                                 _mm_loadu_si128((const __m128i *)p1), 1)
	                       : _mm256_zextsi128_si256(a);
	const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
	return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

/* activation codes of blocks b, b+1 (one: the second zero) as [b lo, b+1 lo, b hi, b+1 hi] */
AVX512_ATTR static inline __m512i y_q4_order(const int8_t *q, int two)
{
	const __m512i y = two ? _mm512_loadu_si512((const void *)q)
	                      : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)q));
	return _mm512_shuffle_i64x2(y, y, _MM_SHUFFLE(3, 1, 2, 0));
}

/* Q4_0 (bb 18, codes at 2, mins -8·d) and Q4_1 (bb 20, codes at 4, mins m) over R rows */
AVX512_ATTR static inline void q4_rows_avx512(const uint8_t *w, size_t rb, const void *xa, int n,
                                              float *out, const int R, const int q41)
{
	const int bb = q41 ? 20 : 18, co = q41 ? 4 : 2;
	const int nb = n / QK;
	const float *d = xa, *s = d + nb;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	/* int32 lanes of a pair's product: 0-3 and 8-11 block b, 4-7 and 12-15 block b+1 */
	const __m512i pidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
	__m512 acc[RT_DOT_ROWS];
	_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
		acc[r] = _mm512_setzero_ps();
	for (int b0 = 0; b0 < nb; b0 += 16) {
		const int ng = nb - b0 < 16 ? nb - b0 : 16;
		const __mmask16 m = first_lanes(ng);
		const __m512 dx = _mm512_maskz_loadu_ps(m, d + b0);
		const __m512 sx = q41 ? _mm512_maskz_loadu_ps(m, s + b0)
		                      : _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + b0), _mm512_set1_ps(-8.0f));
		__m512 dd[RT_DOT_ROWS];
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
			__m512 dw, mw;
			f16_gather16(w + r * rb + (size_t)b0 * bb, bb, m, &dw, q41 ? &mw : NULL);
			dd[r] = _mm512_mul_ps(dw, dx);
			acc[r] = _mm512_fmadd_ps(q41 ? mw : dw, sx, acc[r]);
		}
		__m512i idx = pidx;
		for (int k = 0; k < ng; k += 2) {
			const int b = b0 + k, two = k + 1 < ng;
			const __m512i y = y_q4_order(q + (size_t)b * QK, two);
			_Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
				const uint8_t *p = w + r * rb + (size_t)b * bb + co;
				_mm_prefetch((const char *)((uintptr_t)p + R * rb), _MM_HINT_T0);
				const __m512i pr = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
				                                       nib_pair(p, two ? p + bb : NULL), y);
				acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pr), _mm512_permutexvar_ps(idx, dd[r]), acc[r]);
			}
			idx = _mm512_add_epi32(idx, _mm512_set1_epi32(2));
		}
	}
	_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
		out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* Q8_0 over R rows: signed codes, the sign moved onto the activations (dpbusd takes one
 * unsigned operand) */
AVX512_ATTR static inline void q8_0_rows_avx512(const uint8_t *w, size_t rb, const void *xa, int n,
                                                float *out, const int R)
{
	const int nb = n / QK;
	const float *d = xa;
	const int8_t *q = (const int8_t *)xa + q8b_codes_off(n);
	const __m512i zero = _mm512_setzero_si512();
	/* int32 lanes of a pair's product: 0-7 block b, 8-15 block b+1 */
	const __m512i pidx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
	__m512 acc[RT_DOT_ROWS];
	_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
		acc[r] = _mm512_setzero_ps();
	for (int b0 = 0; b0 < nb; b0 += 16) {
		const int ng = nb - b0 < 16 ? nb - b0 : 16;
		const __mmask16 m = first_lanes(ng);
		const __m512 dx = _mm512_maskz_loadu_ps(m, d + b0);
		__m512 dd[RT_DOT_ROWS];
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
			__m512 dw;
			f16_gather16(w + r * rb + (size_t)b0 * 34, 34, m, &dw, NULL);
			dd[r] = _mm512_mul_ps(dw, dx);
		}
		__m512i idx = pidx;
		for (int k = 0; k < ng; k += 2) {
			const int b = b0 + k, two = k + 1 < ng;
			const __m512i y = two ? _mm512_loadu_si512((const void *)(q + (size_t)b * QK))
			                      : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(q + (size_t)b * QK)));
			_Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
				const uint8_t *p = w + r * rb + (size_t)b * 34 + 2;
				_mm_prefetch((const char *)((uintptr_t)p + R * rb), _MM_HINT_T0);
				const __m256i x0 = _mm256_loadu_si256((const __m256i *)p);
				const __m512i x = two ? _mm512_inserti64x4(_mm512_castsi256_si512(x0),
				                                           _mm256_loadu_si256((const __m256i *)(p + 34)), 1)
				                      : _mm512_zextsi256_si512(x0);
				const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), zero, y);
				const __m512i pr = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(x), sy);
				acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pr), _mm512_permutexvar_ps(idx, dd[r]), acc[r]);
			}
			idx = _mm512_add_epi32(idx, _mm512_set1_epi32(2));
		}
	}
	_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
		out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* The legacy formats' kernel over R rows, by format f: Q4_0 and Q4_1 share
 * q4_rows_avx512, Q8_0 has its own. The rows and dot entries below are this one kernel. */
enum { LG_Q4_0, LG_Q4_1, LG_Q8_0 };

AVX512_ATTR static inline void legacy_kernel(const uint8_t *w, size_t rb, const void *xa, int n,
                                             float *out, const int R, const int f)
{
	if (f == LG_Q8_0)
		q8_0_rows_avx512(w, rb, xa, n, out, R);
	else
		q4_rows_avx512(w, rb, xa, n, out, R, f == LG_Q4_1);
}

/* rt_dot_rows_fn of format f: a full group of RT_DOT_ROWS rows in one call, fewer one row
 * at a time (a row's bits do not depend on R, see above) */
AVX512_ATTR static inline void legacy_rows(const void *w, size_t rb, const void *xa, int n, int nr,
                                           float *out, const int f)
{
	if (nr == RT_DOT_ROWS)
		legacy_kernel(w, rb, xa, n, out, RT_DOT_ROWS, f);
	else
		for (int r = 0; r < nr; r++)
			legacy_kernel((const uint8_t *)w + r * rb, rb, xa, n, out + r, 1, f);
}

AVX512_ATTR static inline float legacy_dot(const void *w, const void *xa, int n, const int f)
{
	float v;
	legacy_kernel(w, 0, xa, n, &v, 1, f);
	return v;
}

AVX512_ATTR static void rows_q4_0_avx512(const void *w, size_t rb, const void *xa, int n, int nr, float *out)
{
	legacy_rows(w, rb, xa, n, nr, out, LG_Q4_0);
}

AVX512_ATTR static void rows_q4_1_avx512(const void *w, size_t rb, const void *xa, int n, int nr, float *out)
{
	legacy_rows(w, rb, xa, n, nr, out, LG_Q4_1);
}

AVX512_ATTR static void rows_q8_0_avx512(const void *w, size_t rb, const void *xa, int n, int nr, float *out)
{
	legacy_rows(w, rb, xa, n, nr, out, LG_Q8_0);
}

AVX512_ATTR static float dot_q4_0_avx512(const void *w, const void *xa, int n)
{
	return legacy_dot(w, xa, n, LG_Q4_0);
}

AVX512_ATTR static float dot_q4_1_avx512(const void *w, const void *xa, int n)
{
	return legacy_dot(w, xa, n, LG_Q4_1);
}

AVX512_ATTR static float dot_q8_0_avx512(const void *w, const void *xa, int n)
{
	return legacy_dot(w, xa, n, LG_Q8_0);
}

/* ---- dispatch ------------------------------------------------------------------------ */

static const rt_dot_kernel kernels[][3] = {
	{ { RT_GGML_Q4_0, QK, RT_ISA_SCALAR, quant_q8b, dot_q4_0_scalar },
	  { RT_GGML_Q4_0, QK, RT_ISA_AVX2, quant_q8b, dot_q4_0_avx2 },
	  { RT_GGML_Q4_0, QK, RT_ISA_AVX512, quant_q8b_avx512, dot_q4_0_avx512, rows_q4_0_avx512 } },
	{ { RT_GGML_Q4_1, QK, RT_ISA_SCALAR, quant_q8b, dot_q4_1_scalar },
	  { RT_GGML_Q4_1, QK, RT_ISA_AVX2, quant_q8b, dot_q4_1_avx2, NULL, xrows_q4_1_avx2 },
	  { RT_GGML_Q4_1, QK, RT_ISA_AVX512, quant_q8b_avx512, dot_q4_1_avx512, rows_q4_1_avx512 } },
	{ { RT_GGML_Q5_0, QK, RT_ISA_SCALAR, quant_q8b, dot_q5_0_scalar },
	  { RT_GGML_Q5_0, QK, RT_ISA_AVX2, quant_q8b, dot_q5_0_avx2 },
	  { RT_GGML_Q5_0, QK, RT_ISA_AVX512, quant_q8b_avx512, dot_q5_0_avx2 } },
	{ { RT_GGML_Q5_1, QK, RT_ISA_SCALAR, quant_q8b, dot_q5_1_scalar },
	  { RT_GGML_Q5_1, QK, RT_ISA_AVX2, quant_q8b, dot_q5_1_avx2 },
	  { RT_GGML_Q5_1, QK, RT_ISA_AVX512, quant_q8b_avx512, dot_q5_1_avx2 } },
	{ { RT_GGML_Q8_0, QK, RT_ISA_SCALAR, quant_q8b, dot_q8_0_scalar },
	  { RT_GGML_Q8_0, QK, RT_ISA_AVX2, quant_q8b, dot_q8_0_avx2, NULL, xrows_q8_0_avx2 },
	  { RT_GGML_Q8_0, QK, RT_ISA_AVX512, quant_q8b_avx512, dot_q8_0_avx512, rows_q8_0_avx512 } },
	{ { RT_GGML_Q4_K, QK_K, RT_ISA_SCALAR, quant_q8k, dot_q4_k_scalar },
	  { RT_GGML_Q4_K, QK_K, RT_ISA_AVX2, quant_q8k, dot_q4_k_avx2 },
	  { RT_GGML_Q4_K, QK_K, RT_ISA_AVX512, quant_q8k, dot_q4_k_avx2 } },
	{ { RT_GGML_Q5_K, QK_K, RT_ISA_SCALAR, quant_q8k, dot_q5_k_scalar },
	  { RT_GGML_Q5_K, QK_K, RT_ISA_AVX2, quant_q8k, dot_q5_k_avx2 },
	  { RT_GGML_Q5_K, QK_K, RT_ISA_AVX512, quant_q8k, dot_q5_k_avx2 } },
	{ { RT_GGML_Q6_K, QK_K, RT_ISA_SCALAR, quant_q8k, dot_q6_k_scalar },
	  { RT_GGML_Q6_K, QK_K, RT_ISA_AVX2, quant_q8k, dot_q6_k_avx2 },
	  { RT_GGML_Q6_K, QK_K, RT_ISA_AVX512, quant_q8k, dot_q6_k_avx2 } },
	{ { RT_GGML_F16, 1, RT_ISA_SCALAR, quant_f32, dot_f16_scalar },
	  { RT_GGML_F16, 1, RT_ISA_AVX2, quant_f32, dot_f16_avx2 },
	  { RT_GGML_F16, 1, RT_ISA_AVX512, quant_f32, dot_f16_avx512 } },
	{ { RT_GGML_F32, 1, RT_ISA_SCALAR, quant_f32, dot_f32_scalar },
	  { RT_GGML_F32, 1, RT_ISA_AVX2, quant_f32, dot_f32_avx2 },
	  { RT_GGML_F32, 1, RT_ISA_AVX512, quant_f32, dot_f32_avx512 } },
};

/* F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports knows it */
static int has_f16c(void)
{
	unsigned a, b, c, d;
	return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

static int detect_isa(void)
{
	__builtin_cpu_init();
	int isa = RT_ISA_SCALAR;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
		isa = RT_ISA_AVX2;
	if (isa == RT_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni"))
		isa = RT_ISA_AVX512;
	const char *env = getenv("KVRT_ISA");
	if (env) {
		int want = strcmp(env, "scalar") == 0 ? RT_ISA_SCALAR
		           : strcmp(env, "avx2") == 0 ? RT_ISA_AVX2
		                                      : RT_ISA_AVX512;
		if (want < isa)
			isa = want;
	}
	return isa;
}

int rt_dot_isa_best(void)
{
	static int cached = -1;
	int v = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
	if (v < 0) {
		v = detect_isa();
		__atomic_store_n(&cached, v, __ATOMIC_RELEASE);
	}
	return v;
}

const char *rt_dot_isa_name(int isa)
{
	return isa == RT_ISA_AVX512 ? "avx512" : isa == RT_ISA_AVX2 ? "avx2" : "scalar";
}

const rt_dot_kernel *rt_dot_kernel_get(uint32_t wtype, int isa)
{
	const int best = rt_dot_isa_best();
	if (isa > best)
		isa = best;
	if (isa < RT_ISA_SCALAR)
		isa = RT_ISA_SCALAR;
	for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
		if (kernels[i][0].wtype == wtype)
			return &kernels[i][isa];
	return NULL;
}
