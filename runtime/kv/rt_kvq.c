/*
 * rt_kvq: KV-cache quantisation codecs — see rt_kvq.h for the layouts and the papers.
 */
#include <math.h>
#include <string.h>

#include "base/rt_util.h"
#include "kv/rt_kvq.h"

/* ORDER RT_KVQ_KIND */
static const int rt_kvq_bits_tab[RT_KVQ_N_KIND] = { 32, 16, 8, 4, 2, 8 };
static const char *const rt_kvq_names[RT_KVQ_N_KIND] = { "f32", "f16", "q8", "q4", "q2", "q8_0" };

int rt_kvq_bits(rt_kvq_kind kind)
{
	RT_ASSERT(kind >= 0 && kind < RT_KVQ_N_KIND);
	return rt_kvq_bits_tab[kind];
}

const char *rt_kvq_name(rt_kvq_kind kind)
{
	RT_ASSERT(kind >= 0 && kind < RT_KVQ_N_KIND);
	return rt_kvq_names[kind];
}

int rt_kvq_parse(const char *name)
{
	return rt_name_index(rt_kvq_names, RT_KVQ_N_KIND, name);
}

static int is_quant(rt_kvq_kind kind)
{
	return kind == RT_KVQ_Q8 || kind == RT_KVQ_Q4 || kind == RT_KVQ_Q2;
}

/* ---- one asymmetric group: f16 scale, f16 min, n codes of `bits` bits ---------------------- */

/* Bytes of the codes of n elements (n * bits a multiple of 8 here: n is 32). */
static size_t codes_bytes(int bits, int n)
{
	return (size_t)n * (size_t)bits / 8;
}

static void put_code(uint8_t *codes, int bits, int i, unsigned c)
{
	int per = 8 / bits, sh = (i % per) * bits;
	uint8_t *b = codes + i / per;
	*b = (uint8_t)((*b & ~(((1u << bits) - 1) << sh)) | (c << sh));
}

static unsigned get_code(const uint8_t *codes, int bits, int i)
{
	int per = 8 / bits;
	return (codes[i / per] >> ((i % per) * bits)) & ((1u << bits) - 1);
}

/* Encode x[0], x[stride], ... (n values) into hdr (scale, min as f16) and codes. */
static void group_encode(int bits, const float *x, int n, int stride, uint16_t hdr[2],
                         uint8_t *codes)
{
	float lo = x[0], hi = x[0];
	for (int i = 1; i < n; i++) {
		float v = x[(size_t)i * stride];
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
	}
	int top = (1 << bits) - 1;
	hdr[0] = rt_f32_to_fp16((hi - lo) / (float)top);
	hdr[1] = rt_f32_to_fp16(lo);
	float s = rt_fp16_to_f32(hdr[0]), m = rt_fp16_to_f32(hdr[1]);
	memset(codes, 0, codes_bytes(bits, n));
	for (int i = 0; i < n; i++) {
		float q = s > 0 ? nearbyintf((x[(size_t)i * stride] - m) / s) : 0.0f;
		/* written so that a NaN (a non-finite entry) gives code 0, never a NaN cast */
		unsigned c = q > 0 ? (q < (float)top ? (unsigned)q : (unsigned)top) : 0u;
		put_code(codes, bits, i, c);
	}
}

/* ---- Q8_0: ggml's symmetric blocks of 32 (f16 scale, int8 codes) ---------------------------- */

#define Q8_0_BYTES (2 + RT_KVQ_VGROUP)

/* One block, as quantize_row_q8_0_ref: d = amax / 127, codes round(x / d) against the
 * unrounded d, the scale stored as f16. */
static void q8_0_encode(const float *x, uint8_t *o)
{
	float amax = 0;
	for (int i = 0; i < RT_KVQ_VGROUP; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
	uint16_t h = rt_f32_to_fp16(d);
	memcpy(o, &h, 2);
	for (int i = 0; i < RT_KVQ_VGROUP; i++)
		o[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
}

/* ---- values ------------------------------------------------------------------------------ */

static size_t vgroup_bytes(int bits)
{
	return 4 + codes_bytes(bits, RT_KVQ_VGROUP);
}

size_t rt_kvq_vrow_bytes(rt_kvq_kind kind, int d)
{
	if (kind == RT_KVQ_F32)
		return (size_t)d * 4;
	if (kind == RT_KVQ_F16)
		return (size_t)d * 2;
	if (kind == RT_KVQ_Q8_0) {
		RT_ASSERT(d % RT_KVQ_VGROUP == 0);
		return (size_t)(d / RT_KVQ_VGROUP) * Q8_0_BYTES;
	}
	RT_ASSERT(is_quant(kind) && d % RT_KVQ_VGROUP == 0);
	return (size_t)(d / RT_KVQ_VGROUP) * vgroup_bytes(rt_kvq_bits(kind));
}

void rt_kvq_vrow_encode(rt_kvq_kind kind, const float *x, int d, uint8_t *out)
{
	if (kind == RT_KVQ_F32) {
		memcpy(out, x, (size_t)d * 4);
		return;
	}
	if (kind == RT_KVQ_F16) {
		for (int i = 0; i < d; i++) {
			uint16_t h = rt_f32_to_fp16(x[i]);
			memcpy(out + 2 * i, &h, 2);
		}
		return;
	}
	if (kind == RT_KVQ_Q8_0) {
		for (int b = 0; b < d / RT_KVQ_VGROUP; b++)
			q8_0_encode(x + b * RT_KVQ_VGROUP, out + (size_t)b * Q8_0_BYTES);
		return;
	}
	int bits = rt_kvq_bits(kind);
	size_t gb = vgroup_bytes(bits);
	for (int g = 0; g < d / RT_KVQ_VGROUP; g++) {
		uint16_t hdr[2];
		uint8_t *o = out + (size_t)g * gb;
		group_encode(bits, x + g * RT_KVQ_VGROUP, RT_KVQ_VGROUP, 1, hdr, o + 4);
		memcpy(o, hdr, 4);
	}
}

void rt_kvq_vrow_axpy(rt_kvq_kind kind, const uint8_t *row, int d, float w, float *acc)
{
	if (kind == RT_KVQ_F32) {
		for (int i = 0; i < d; i++) {
			float v;
			memcpy(&v, row + 4 * i, 4);
			acc[i] += w * v;
		}
		return;
	}
	if (kind == RT_KVQ_F16) {
		for (int i = 0; i < d; i++) {
			uint16_t h;
			memcpy(&h, row + 2 * i, 2);
			acc[i] += w * rt_fp16_to_f32(h);
		}
		return;
	}
	if (kind == RT_KVQ_Q8_0) {
		for (int b = 0; b < d / RT_KVQ_VGROUP; b++) {
			const uint8_t *o = row + (size_t)b * Q8_0_BYTES;
			uint16_t h;
			memcpy(&h, o, 2);
			const float s = rt_fp16_to_f32(h);
			for (int i = 0; i < RT_KVQ_VGROUP; i++)
				acc[b * RT_KVQ_VGROUP + i] += w * (s * (float)(int8_t)o[2 + i]);
		}
		return;
	}
	int bits = rt_kvq_bits(kind);
	size_t gb = vgroup_bytes(bits);
	for (int g = 0; g < d / RT_KVQ_VGROUP; g++) {
		const uint8_t *o = row + (size_t)g * gb;
		uint16_t hdr[2];
		memcpy(hdr, o, 4);
		float s = rt_fp16_to_f32(hdr[0]), m = rt_fp16_to_f32(hdr[1]);
		float *a = acc + g * RT_KVQ_VGROUP;
		for (int i = 0; i < RT_KVQ_VGROUP; i++)
			a[i] += w * (m + s * (float)get_code(o + 4, bits, i));
	}
}

/* x[0..32) = m + s · code_i of one asymmetric group (codes packed as put_code writes them:
 * element i in byte i / (8 / bits) at bit (i % (8 / bits)) · bits), by byte, not by
 * element: the tier decode of every attention chunk runs through here. */
static void group_decode(int bits, const uint8_t *o, float *x)
{
	uint16_t hdr[2];
	memcpy(hdr, o, 4);
	const float s = rt_fp16_to_f32(hdr[0]), m = rt_fp16_to_f32(hdr[1]);
	const uint8_t *c = o + 4;
	if (bits == 8) {
		for (int i = 0; i < RT_KVQ_VGROUP; i++)
			x[i] = m + s * (float)c[i];
	} else if (bits == 4) {
		for (int i = 0; i < RT_KVQ_VGROUP / 2; i++) {
			x[2 * i] = m + s * (float)(c[i] & 15);
			x[2 * i + 1] = m + s * (float)(c[i] >> 4);
		}
	} else {
		for (int i = 0; i < RT_KVQ_VGROUP / 4; i++)
			for (int k = 0; k < 4; k++)
				x[4 * i + k] = m + s * (float)((c[i] >> (2 * k)) & 3);
	}
}

void rt_kvq_vrow_decode(rt_kvq_kind kind, const uint8_t *row, int d, float *x)
{
	if (is_quant(kind)) {
		const int bits = rt_kvq_bits(kind);
		const size_t gb = vgroup_bytes(bits);
		for (int g = 0; g < d / RT_KVQ_VGROUP; g++)
			group_decode(bits, row + (size_t)g * gb, x + g * RT_KVQ_VGROUP);
		return;
	}
	memset(x, 0, (size_t)d * sizeof *x);
	rt_kvq_vrow_axpy(kind, row, d, 1.0f, x);
}

/* ---- keys ---------------------------------------------------------------------------------- */

static size_t kchan_bytes(int bits)
{
	return 4 + codes_bytes(bits, RT_KVQ_KTILE);
}

size_t rt_kvq_ktile_bytes(rt_kvq_kind kind, int d)
{
	if (!is_quant(kind))
		return (size_t)RT_KVQ_KTILE * rt_kvq_vrow_bytes(kind, d);
	return (size_t)d * kchan_bytes(rt_kvq_bits(kind));
}

void rt_kvq_ktile_encode(rt_kvq_kind kind, const float *k, int d, uint8_t *out)
{
	if (!is_quant(kind)) {
		size_t rb = rt_kvq_vrow_bytes(kind, d);
		for (int t = 0; t < RT_KVQ_KTILE; t++)
			rt_kvq_vrow_encode(kind, k + (size_t)t * d, d, out + t * rb);
		return;
	}
	int bits = rt_kvq_bits(kind);
	size_t cb = kchan_bytes(bits);
	for (int c = 0; c < d; c++) {
		uint16_t hdr[2];
		uint8_t *o = out + (size_t)c * cb;
		group_encode(bits, k + c, RT_KVQ_KTILE, d, hdr, o + 4);
		memcpy(o, hdr, 4);
	}
}

void rt_kvq_ktile_decode(rt_kvq_kind kind, const uint8_t *tile, int d, int t, float *x)
{
	RT_ASSERT(t >= 0 && t < RT_KVQ_KTILE);
	if (!is_quant(kind)) {
		size_t rb = rt_kvq_vrow_bytes(kind, d);
		rt_kvq_vrow_decode(kind, tile + (size_t)t * rb, d, x);
		return;
	}
	int bits = rt_kvq_bits(kind);
	size_t cb = kchan_bytes(bits);
	for (int c = 0; c < d; c++) {
		const uint8_t *o = tile + (size_t)c * cb;
		uint16_t hdr[2];
		memcpy(hdr, o, 4);
		x[c] = rt_fp16_to_f32(hdr[1]) + rt_fp16_to_f32(hdr[0]) * (float)get_code(o + 4, bits, t);
	}
}

void rt_kvq_ktile_logits(rt_kvq_kind kind, const uint8_t *tile, int d, int n, const float *q,
                         float scale, float *logits)
{
	RT_ASSERT(n >= 0 && n <= RT_KVQ_KTILE);
	if (!is_quant(kind)) {
		float row[512];
		RT_ASSERT(d <= 512);
		for (int t = 0; t < n; t++) {
			rt_kvq_ktile_decode(kind, tile, d, t, row);
			float s = 0;
			for (int c = 0; c < d; c++)
				s += q[c] * row[c];
			logits[t] = scale * s;
		}
		return;
	}
	int bits = rt_kvq_bits(kind);
	size_t cb = kchan_bytes(bits);
	float acc[RT_KVQ_KTILE] = { 0 }, base = 0;
	for (int c = 0; c < d; c++) {
		const uint8_t *o = tile + (size_t)c * cb;
		uint16_t hdr[2];
		memcpy(hdr, o, 4);
		float w = q[c] * rt_fp16_to_f32(hdr[0]);
		base += q[c] * rt_fp16_to_f32(hdr[1]);
		for (int t = 0; t < n; t++)
			acc[t] += w * (float)get_code(o + 4, bits, t);
	}
	for (int t = 0; t < n; t++)
		logits[t] = scale * (base + acc[t]);
}

/* ---- keys per channel against a shared range ------------------------------------------------ */

size_t rt_kvq_kcodes_bytes(rt_kvq_kind kind, int d)
{
	RT_ASSERT(is_quant(kind) && d % 8 == 0);
	return codes_bytes(rt_kvq_bits(kind), d);
}

void rt_kvq_krange_set(const float *lo, const float *hi, int d, uint16_t *range)
{
	for (int c = 0; c < d; c++) {
		range[c] = rt_f32_to_fp16(lo[c]);
		range[d + c] = rt_f32_to_fp16(hi[c]);
	}
}

void rt_kvq_krange_unpack(rt_kvq_kind kind, const uint16_t *range, int d, float *lo,
                          float *step)
{
	RT_ASSERT(is_quant(kind));
	const float top = (float)((1 << rt_kvq_bits(kind)) - 1);
	for (int c = 0; c < d; c++) {
		lo[c] = rt_fp16_to_f32(range[c]);
		const float w = rt_fp16_to_f32(range[d + c]) - lo[c];
		step[c] = w > 0 ? w / top : 0.0f;
	}
}

void rt_kvq_kcodes_encode(rt_kvq_kind kind, const float *lo, const float *step, const float *x,
                          int d, uint8_t *out)
{
	const int bits = rt_kvq_bits(kind);
	const float top = (float)((1 << bits) - 1);
	memset(out, 0, rt_kvq_kcodes_bytes(kind, d));
	for (int c = 0; c < d; c++) {
		float q = step[c] > 0 ? nearbyintf((x[c] - lo[c]) / step[c]) : 0.0f;
		/* written so that a NaN gives code 0, never a NaN cast */
		unsigned v = q > 0 ? (q < top ? (unsigned)q : (unsigned)top) : 0u;
		put_code(out, bits, c, v);
	}
}

void rt_kvq_kcodes_decode(rt_kvq_kind kind, const float *lo, const float *step,
                          const uint8_t *codes, int d, float *x)
{
	const int bits = rt_kvq_bits(kind);
	if (bits == 8) {
		for (int c = 0; c < d; c++)
			x[c] = lo[c] + step[c] * (float)codes[c];
	} else if (bits == 4) {
		for (int c = 0; c < d / 2; c++) {
			x[2 * c] = lo[2 * c] + step[2 * c] * (float)(codes[c] & 15);
			x[2 * c + 1] = lo[2 * c + 1] + step[2 * c + 1] * (float)(codes[c] >> 4);
		}
	} else {
		for (int c = 0; c < d / 4; c++)
			for (int k = 0; k < 4; k++)
				x[4 * c + k] = lo[4 * c + k] + step[4 * c + k] * (float)((codes[c] >> (2 * k)) & 3);
	}
}

/* ---- rotation ------------------------------------------------------------------------------- */

void rt_kvq_rotate(float *x, int d)
{
	RT_ASSERT(d > 0 && (d & (d - 1)) == 0);
	for (int len = 1; len < d; len <<= 1)
		for (int i = 0; i < d; i += 2 * len)
			for (int j = i; j < i + len; j++) {
				const float a = x[j], b = x[j + len];
				x[j] = a + b;
				x[j + len] = a - b;
			}
	const float s = 1.0f / sqrtf((float)d);
	for (int i = 0; i < d; i++)
		x[i] *= s;
}
