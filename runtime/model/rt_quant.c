/*
 * rt_quant: decoders from ggml block formats to f32. Each decoder is a transcription of
 * the matching dequantize_row_* of ggml-quants.c (block layouts from ggml-common.h), with
 * the same order of float operations so the results are bit-identical to ggml's scalar
 * path and to the numpy decoders of the `gguf` Python package (tests/golden/quant).
 * Blocks are read byte-wise (memcpy for multi-byte fields) because tensor data inside an
 * mmap'ed GGUF file is only 32-byte aligned as a whole, and block sizes such as 18, 20
 * or 34 bytes leave individual fields unaligned.
 */
#include "model/rt_quant.h"

#include <string.h>

#include "model/rt_gguf.h"
#include "base/rt_util.h"

#define QK 32    /* values per block of the legacy formats */
#define QK_K 256 /* values per K-quant super-block */

static float ld_f16(const uint8_t *p)
{
	return rt_fp16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* One block of the legacy 32-value formats: value j's code is nibble j of qs (the low
 * nibbles first, the high ones second) with bit j of qh as its 5th bit (qh = 0 for Q4_*),
 * less bias; v = code * d, plus m where has_min (dequantize_row_q{4,5}_{0,1}). */
static void deq_legacy_block(const uint8_t *qs, uint32_t qh, int bias, float d, float m,
                             int has_min, float *y)
{
	for (int j = 0; j < QK / 2; j++) {
		const uint8_t xh_0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
		const uint8_t xh_1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
		const int x0 = ((qs[j] & 0x0F) | xh_0) - bias;
		const int x1 = ((qs[j] >> 4) | xh_1) - bias;
		y[j] = has_min ? (float)x0 * d + m : (float)x0 * d;
		y[j + QK / 2] = has_min ? (float)x1 * d + m : (float)x1 * d;
	}
}

static uint32_t ld_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

/* Q4_0, 18 bytes: d f16, qs[16]; v = (nibble - 8) * d, low nibbles first half. */
static void deq_q4_0(const uint8_t *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, x += 18, y += QK)
		deq_legacy_block(x + 2, 0, 8, ld_f16(x), 0.0f, 0, y);
}

/* Q4_1, 20 bytes: d f16, m f16, qs[16]; v = nibble * d + m. */
static void deq_q4_1(const uint8_t *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, x += 20, y += QK)
		deq_legacy_block(x + 4, 0, 0, ld_f16(x), ld_f16(x + 2), 1, y);
}

/* Q5_0, 22 bytes: d f16, qh u32 (bit j = 5th bit of value j), qs[16];
 * v = (code - 16) * d. */
static void deq_q5_0(const uint8_t *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, x += 22, y += QK)
		deq_legacy_block(x + 6, ld_u32(x + 2), 16, ld_f16(x), 0.0f, 0, y);
}

/* Q5_1, 24 bytes: d f16, m f16, qh u32, qs[16]; v = code * d + m. */
static void deq_q5_1(const uint8_t *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, x += 24, y += QK)
		deq_legacy_block(x + 8, ld_u32(x + 4), 0, ld_f16(x), ld_f16(x + 2), 1, y);
}

/* Q8_0, 34 bytes: d f16, qs[32] int8; v = q * d. */
static void deq_q8_0(const uint8_t *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, x += 34, y += QK) {
		const float d = ld_f16(x);
		const int8_t *qs = (const int8_t *)(x + 2);
		for (int j = 0; j < QK; j++)
			y[j] = (float)qs[j] * d;
	}
}

/* 6-bit scale and min j of a Q4_K/Q5_K block (get_scale_min_k4 in ggml-quants.c). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
	if (j < 4) {
		*d = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
	}
}

/* One Q4_K or Q5_K super-block x (d f16, dmin f16, scales[12] at x + 4) with 4-bit codes
 * ql[128] and, for Q5_K, 5th bits qh[32] (NULL for Q4_K): 8 sub-blocks of 32,
 * v = d*sc * code - dmin*m (dequantize_row_q4_K, dequantize_row_q5_K). */
static void deq_k4_block(const uint8_t *x, const uint8_t *qh, const uint8_t *ql, float *y)
{
	const float d = ld_f16(x);
	const float min = ld_f16(x + 2);
	const uint8_t *scales = x + 4;
	int is = 0;
	uint8_t sc, m;
	uint8_t u1 = 1, u2 = 2;
	for (int j = 0; j < QK_K; j += 64) {
		scale_min_k4(is + 0, scales, &sc, &m);
		const float d1 = d * sc, m1 = min * m;
		scale_min_k4(is + 1, scales, &sc, &m);
		const float d2 = d * sc, m2 = min * m;
		for (int l = 0; l < 32; l++)
			*y++ = d1 * (float)((ql[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
		for (int l = 0; l < 32; l++)
			*y++ = d2 * (float)((ql[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
		ql += 32;
		is += 2;
		u1 = (uint8_t)(u1 << 2);
		u2 = (uint8_t)(u2 << 2);
	}
}

/* Q4_K, 144 bytes: d f16, dmin f16, scales[12] (8 x 6-bit scale + 8 x 6-bit min),
 * qs[128]; 8 sub-blocks of 32: v = d*sc * nibble - dmin*m. */
static void deq_q4_k(const uint8_t *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, x += 144, y += QK_K)
		deq_k4_block(x, NULL, x + 16, y);
}

/* Q5_K, 176 bytes: d, dmin, scales[12], qh[32], qs[128]; like Q4_K plus a 5th bit. */
static void deq_q5_k(const uint8_t *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, x += 176, y += QK_K)
		deq_k4_block(x, x + 16, x + 48, y);
}

/* Q6_K, 210 bytes: ql[128], qh[64], scales[16] int8, d f16 at bytes 208..209;
 * v = d * scale * (6-bit code - 32). */
static void deq_q6_k(const uint8_t *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, x += 210) {
		const float d = ld_f16(x + 208);
		const uint8_t *ql = x;
		const uint8_t *qh = x + 128;
		const int8_t *sc = (const int8_t *)(x + 192);
		for (int n = 0; n < QK_K; n += 128) {
			for (int l = 0; l < 32; l++) {
				const int is = l / 16;
				const int q1 = (int)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
				const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
				const int q3 = (int)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
				const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
				y[l + 0] = d * (float)sc[is + 0] * (float)q1;
				y[l + 32] = d * (float)sc[is + 2] * (float)q2;
				y[l + 64] = d * (float)sc[is + 4] * (float)q3;
				y[l + 96] = d * (float)sc[is + 6] * (float)q4;
			}
			y += 128;
			ql += 64;
			qh += 32;
			sc += 8;
		}
	}
}

static void deq_f32(const uint8_t *x, float *y, int64_t n)
{
	memcpy(y, x, (size_t)n * sizeof(float));
}

static void deq_f16(const uint8_t *x, float *y, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = ld_f16(x + 2 * i);
}

static void deq_bf16(const uint8_t *x, float *y, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = rt_bf16_to_f32((uint16_t)(x[2 * i] | (x[2 * i + 1] << 8)));
}

/* The decoders; the block geometry comes from the type table (rt_ggml_type_size). */
typedef struct quant_traits {
	uint32_t type;
	void (*deq)(const uint8_t *x, float *y, int64_t nblocks);
} quant_traits;

static const quant_traits traits[] = {
	{ RT_GGML_F32, deq_f32 },   { RT_GGML_F16, deq_f16 },   { RT_GGML_BF16, deq_bf16 },
	{ RT_GGML_Q4_0, deq_q4_0 }, { RT_GGML_Q4_1, deq_q4_1 }, { RT_GGML_Q5_0, deq_q5_0 },
	{ RT_GGML_Q5_1, deq_q5_1 }, { RT_GGML_Q8_0, deq_q8_0 }, { RT_GGML_Q4_K, deq_q4_k },
	{ RT_GGML_Q5_K, deq_q5_k }, { RT_GGML_Q6_K, deq_q6_k },
};

static const quant_traits *find_traits(uint32_t type)
{
	for (size_t i = 0; i < sizeof traits / sizeof traits[0]; i++)
		if (traits[i].type == type)
			return &traits[i];
	return NULL;
}

/* values and bytes per block of a decodable type; 0 (and *t NULL) for any other */
static int geometry(uint32_t type, const quant_traits **t, uint32_t *blck, uint32_t *bytes)
{
	*t = find_traits(type);
	if (!*t || rt_ggml_type_size(type, blck, bytes) < 0) {
		*t = NULL;
		return 0;
	}
	return 1;
}

int rt_quant_block_values(uint32_t type)
{
	const quant_traits *t;
	uint32_t blck, bytes;
	return geometry(type, &t, &blck, &bytes) ? (int)blck : 0;
}

size_t rt_quant_block_bytes(uint32_t type)
{
	const quant_traits *t;
	uint32_t blck, bytes;
	return geometry(type, &t, &blck, &bytes) ? bytes : 0;
}

int rt_quant_supported(uint32_t type)
{
	return find_traits(type) != NULL;
}

size_t rt_quant_row_bytes(uint32_t type, int64_t n)
{
	const quant_traits *t;
	uint32_t blck, bytes;
	if (!geometry(type, &t, &blck, &bytes) || n < 0 || n % blck)
		return 0;
	uint64_t nb = (uint64_t)(n / blck);
	if (nb > SIZE_MAX / bytes)
		return 0;
	return (size_t)nb * bytes;
}

int rt_dequant(uint32_t type, const void *src, float *dst, int64_t n)
{
	const quant_traits *t;
	uint32_t blck, bytes;
	if (!geometry(type, &t, &blck, &bytes) || n < 0 || n % blck)
		return -1;
	t->deq(src, dst, n / blck);
	return 0;
}
