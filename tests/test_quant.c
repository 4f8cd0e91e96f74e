/*
 * test_quant: the ggml block decoders of rt_quant and the reference encoders of the test
 * GGUF writer, checked against golden vectors produced by an independent implementation
 * (the numpy gguf.quants of llama.cpp's gguf-py, tests/golden/quant/make_golden.py),
 * against hand-computed blocks (layout: half-split nibbles, Q6_K scale indexing and the
 * position of its super-scale), and, when KVRT_MODEL names the real SmolLM2 file, against
 * rows of the real model decoded by gguf-py.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gguf_writer.h"
#include "model/rt_gguf.h"
#include "model/rt_quant.h"
#include "base/rt_util.h"
#include "support/check_run.h"

#define GOLDEN_DIR "tests/golden/quant/"

static uint32_t rd32(const char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static void put_f16(uint8_t *p, uint16_t h)
{
	p[0] = (uint8_t)h;
	p[1] = (uint8_t)(h >> 8);
}

/* One parsed golden case; pointers into the loaded file. */
typedef struct gcase {
	char name[33];
	uint32_t type, n, has_input, nbytes;
	const float *input;   /* [n] or NULL (unaligned-safe copies made by the loader) */
	const uint8_t *bytes; /* [nbytes] */
	const float *deq;     /* [n] */
} gcase;

static char *g_buf;
static gcase *g_cases;
static uint32_t g_n;

static void golden_load(void)
{
	if (g_cases)
		return;
	rt_err err = { { 0 } };
	size_t len;
	g_buf = rt_read_file(GOLDEN_DIR "quant_golden.dat", &len, &err);
	ck_assert_msg(g_buf != NULL, "%s", err.msg);
	ck_assert_uint_ge(len, 12);
	ck_assert_int_eq(memcmp(g_buf, "KVQG", 4), 0);
	ck_assert_uint_eq(rd32(g_buf + 4), 1);
	g_n = rd32(g_buf + 8);
	g_cases = calloc(g_n, sizeof *g_cases);
	size_t off = 12;
	for (uint32_t i = 0; i < g_n; i++) {
		gcase *c = &g_cases[i];
		ck_assert_uint_le(off + 48, len);
		memcpy(c->name, g_buf + off, 32);
		c->type = rd32(g_buf + off + 32);
		c->n = rd32(g_buf + off + 36);
		c->has_input = rd32(g_buf + off + 40);
		c->nbytes = rd32(g_buf + off + 44);
		off += 48;
		size_t need = (c->has_input ? 4 * (size_t)c->n : 0) + c->nbytes + 4 * (size_t)c->n;
		ck_assert_uint_le(off + need, len);
		if (c->has_input) {
			float *in = malloc(4 * (size_t)c->n);
			memcpy(in, g_buf + off, 4 * (size_t)c->n);
			c->input = in;
			off += 4 * (size_t)c->n;
		}
		c->bytes = (const uint8_t *)g_buf + off;
		off += c->nbytes;
		float *dq = malloc(4 * (size_t)c->n);
		memcpy(dq, g_buf + off, 4 * (size_t)c->n);
		c->deq = dq;
		off += 4 * (size_t)c->n;
	}
	ck_assert_uint_eq(off, len);
}

static void golden_free(void)
{
	for (uint32_t i = 0; i < g_n; i++) {
		free((void *)g_cases[i].input);
		free((void *)g_cases[i].deq);
	}
	free(g_cases);
	free(g_buf);
	g_cases = NULL;
	g_buf = NULL;
	g_n = 0;
}

/* Every golden block decodes bit-exactly as gguf-py decodes it. */
START_TEST(test_golden_decode)
{
	golden_load();
	ck_assert_uint_ge(g_n, 70);
	int seen[64] = { 0 };
	for (uint32_t i = 0; i < g_n; i++) {
		const gcase *c = &g_cases[i];
		ck_assert_msg(rt_quant_supported(c->type), "%s: type %u", c->name, c->type);
		ck_assert_uint_eq(rt_quant_row_bytes(c->type, c->n), c->nbytes);
		float *out = malloc(4 * (size_t)c->n);
		ck_assert_int_eq(rt_dequant(c->type, c->bytes, out, c->n), 0);
		for (uint32_t j = 0; j < c->n; j++)
			ck_assert_msg(f32_bits(out[j]) == f32_bits(c->deq[j]),
			              "%s: value %u is %.9g (0x%08x), gguf-py says %.9g (0x%08x)",
			              c->name, j, out[j], f32_bits(out[j]), c->deq[j],
			              f32_bits(c->deq[j]));
		free(out);
		seen[c->type < 64 ? c->type : 63]++;
	}
	static const uint32_t need[] = { RT_GGML_F16, RT_GGML_BF16, RT_GGML_Q4_0, RT_GGML_Q4_1,
		                          RT_GGML_Q5_0, RT_GGML_Q5_1, RT_GGML_Q8_0, RT_GGML_Q4_K,
		                          RT_GGML_Q5_K, RT_GGML_Q6_K };
	for (size_t k = 0; k < sizeof need / sizeof need[0]; k++)
		ck_assert_msg(seen[need[k] & 63] > 0, "no golden case for %s",
		              rt_ggml_type_name(need[k]));
}
END_TEST

/* The writer's Q4_1/Q8_0 encoders produce the same bytes as gguf-py's encoders (which
 * are bit-exact with ggml-quants.c's reference encoders). */
START_TEST(test_golden_encode)
{
	golden_load();
	int checked = 0;
	for (uint32_t i = 0; i < g_n; i++) {
		const gcase *c = &g_cases[i];
		if (!c->has_input || (c->type != RT_GGML_Q4_1 && c->type != RT_GGML_Q8_0))
			continue;
		uint8_t *enc = malloc(c->nbytes);
		if (c->type == RT_GGML_Q4_1)
			gw_quantize_q4_1(c->input, enc, c->n);
		else
			gw_quantize_q8_0(c->input, enc, c->n);
		for (uint32_t b = 0; b < c->nbytes; b++)
			ck_assert_msg(enc[b] == c->bytes[b], "%s: byte %u is 0x%02x, gguf-py wrote 0x%02x",
			              c->name, b, enc[b], c->bytes[b]);
		free(enc);
		checked++;
	}
	ck_assert_int_ge(checked, 20);
}
END_TEST

/* f32 -> f16 of the writer: hand values and an exact round trip of every non-NaN half. */
START_TEST(test_f16_encode)
{
	ck_assert_uint_eq(gw_f32_to_f16(1.0f), 0x3C00);
	ck_assert_uint_eq(gw_f32_to_f16(-2.0f), 0xC000);
	ck_assert_uint_eq(gw_f32_to_f16(65504.0f), 0x7BFF);
	ck_assert_uint_eq(gw_f32_to_f16(65520.0f), 0x7C00); /* ties to even -> inf */
	ck_assert_uint_eq(gw_f32_to_f16(65519.0f), 0x7BFF);
	ck_assert_uint_eq(gw_f32_to_f16(0x1p-24f), 0x0001);  /* smallest subnormal */
	ck_assert_uint_eq(gw_f32_to_f16(0x1p-25f), 0x0000);  /* tie to even -> 0 */
	ck_assert_uint_eq(gw_f32_to_f16(0x1.8p-25f), 0x0001);
	ck_assert_uint_eq(gw_f32_to_f16(1.0f / 3.0f), 0x3555);
	ck_assert_uint_eq(gw_f32_to_f16(1.0f + 0x1p-11f), 0x3C00); /* tie, even mantissa */
	ck_assert_uint_eq(gw_f32_to_f16(1.0f + 0x3p-11f), 0x3C02); /* tie, odd -> up */
	for (uint32_t h = 0; h < 65536; h++) {
		if ((h & 0x7C00) == 0x7C00 && (h & 0x03FF))
			continue; /* NaN payloads are not preserved by ggml's encoder */
		ck_assert_uint_eq(gw_f32_to_f16(rt_fp16_to_f32((uint16_t)h)), h);
	}
}
END_TEST

/* Hand-made legacy blocks: the 32 values are split in halves (low nibbles = values
 * 0..15, high nibbles = 16..31), Q4_0 subtracts 8, Q4_1 adds m, Q5 takes bit j of qh. */
START_TEST(test_legacy_layout)
{
	uint8_t b[34];
	float y[32];

	/* Q4_1: d = 1, m = -8, qs[j] = j | (15 - j) << 4 */
	put_f16(b, 0x3C00);
	put_f16(b + 2, 0xC800);
	for (int j = 0; j < 16; j++)
		b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
	ck_assert_int_eq(rt_dequant(RT_GGML_Q4_1, b, y, 32), 0);
	for (int j = 0; j < 16; j++) {
		ck_assert_float_eq(y[j], (float)(j - 8));
		ck_assert_float_eq(y[j + 16], (float)(7 - j));
	}

	/* Q4_0: d = 0.5, same nibbles: (nibble - 8) * 0.5 */
	put_f16(b, 0x3800);
	for (int j = 0; j < 16; j++)
		b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
	ck_assert_int_eq(rt_dequant(RT_GGML_Q4_0, b, y, 32), 0);
	for (int j = 0; j < 16; j++) {
		ck_assert_float_eq(y[j], 0.5f * (float)(j - 8));
		ck_assert_float_eq(y[j + 16], 0.5f * (float)(7 - j));
	}

	/* Q8_0: d = -0.25, q[j] = j - 16 */
	put_f16(b, 0xB400);
	for (int j = 0; j < 32; j++)
		b[2 + j] = (uint8_t)(int8_t)(j - 16);
	ck_assert_int_eq(rt_dequant(RT_GGML_Q8_0, b, y, 32), 0);
	for (int j = 0; j < 32; j++)
		ck_assert_float_eq(y[j], -0.25f * (float)(j - 16));

	/* Q5_0: d = 1, qh has only bit 3 and bit 20 set, all nibbles 0:
	 * value 3 -> 16 - 16 = 0, value 20 -> 0, everything else -16 */
	memset(b, 0, sizeof b);
	put_f16(b, 0x3C00);
	uint32_t qh = (1u << 3) | (1u << 20);
	memcpy(b + 2, &qh, 4);
	ck_assert_int_eq(rt_dequant(RT_GGML_Q5_0, b, y, 32), 0);
	for (int j = 0; j < 32; j++)
		ck_assert_float_eq(y[j], ((j == 3 || j == 20) ? 0.0f : -16.0f));

	/* Q5_1: d = 2, m = 1, qh bit 31, nibbles 15: value 31 -> 31*2+1, others 15*2+1 */
	memset(b, 0, sizeof b);
	put_f16(b, 0x4000);
	put_f16(b + 2, 0x3C00);
	qh = 1u << 31;
	memcpy(b + 4, &qh, 4);
	memset(b + 8, 0xFF, 16);
	ck_assert_int_eq(rt_dequant(RT_GGML_Q5_1, b, y, 32), 0);
	for (int j = 0; j < 32; j++)
		ck_assert_float_eq(y[j], (j == 31 ? 63.0f : 31.0f));
}
END_TEST

/* Q6_K: the super-scale d is the LAST two bytes (208..209), scales are signed and
 * scale i covers values 16i..16i+15. */
START_TEST(test_q6_k_layout)
{
	uint8_t b[210];
	float y[256];
	memset(b, 0x11, 128);    /* ql: both nibbles 1 */
	memset(b + 128, 0, 64);  /* qh: high bits 0 -> code 1 -> q = 1 - 32 = -31 */
	for (int i = 0; i < 16; i++)
		b[192 + i] = (uint8_t)(int8_t)(i == 5 ? -3 : i + 1);
	put_f16(b + 208, 0x3800); /* d = 0.5; bytes 0..1 hold 0x1111 (a tiny f16) */
	ck_assert_int_eq(rt_dequant(RT_GGML_Q6_K, b, y, 256), 0);
	for (int k = 0; k < 256; k++) {
		int sc = k / 16 == 5 ? -3 : k / 16 + 1;
		ck_assert_msg(y[k] == 0.5f * (float)sc * -31.0f, "value %d is %g, expected %g", k,
		              y[k], 0.5 * sc * -31.0);
	}
	/* high bits: qh[0] = 0b11100100 gives codes 1|0<<4, 1|1<<4, 1|2<<4, 1|3<<4 for
	 * values 0, 32, 64, 96 of the first half */
	b[128] = 0xE4;
	ck_assert_int_eq(rt_dequant(RT_GGML_Q6_K, b, y, 256), 0);
	ck_assert_float_eq(y[0], 0.5f * 1.0f * (1 - 32));
	ck_assert_float_eq(y[32], 0.5f * 3.0f * (17 - 32));
	ck_assert_float_eq(y[64], 0.5f * 5.0f * (33 - 32));
	ck_assert_float_eq(y[96], 0.5f * 7.0f * (49 - 32));
}
END_TEST

START_TEST(test_sizes)
{
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_Q4_1, 576), 360);
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_Q4_1, 1536), 960);
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_Q8_0, 576), 612);
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_F32, 576), 2304);
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_F16, 3), 6);
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_Q6_K, 512), 420);
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_Q6_K, 576), 0);  /* not whole blocks */
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_Q4_1, 33), 0);
	ck_assert_uint_eq(rt_quant_row_bytes(RT_GGML_Q2_K, 256), 0);  /* not decodable */
	ck_assert_int_eq(rt_quant_block_values(RT_GGML_Q5_K), 256);
	ck_assert_uint_eq(rt_quant_block_bytes(RT_GGML_Q5_K), 176);
	ck_assert_uint_eq(rt_quant_block_bytes(RT_GGML_Q5_0), 22);
	ck_assert_int_eq(rt_quant_supported(RT_GGML_Q8_1), 0);
	ck_assert_int_eq(rt_quant_supported(99), 0);
	float y[32];
	uint8_t b[64] = { 0 };
	ck_assert_int_eq(rt_dequant(RT_GGML_Q4_1, b, y, 31), -1);
	ck_assert_int_eq(rt_dequant(RT_GGML_Q2_K, b, y, 32), -1);
	/* the container knows more types than the decoder */
	uint32_t blck, bytes;
	ck_assert_int_eq(rt_ggml_type_size(RT_GGML_Q2_K, &blck, &bytes), 0);
	ck_assert_uint_eq(blck, 256);
	ck_assert_uint_eq(bytes, 84);
	for (uint32_t t = 0; t < 40; t++)
		if (rt_quant_supported(t)) {
			ck_assert_int_eq(rt_ggml_type_size(t, &blck, &bytes), 0);
			ck_assert_uint_eq(blck, (uint32_t)rt_quant_block_values(t));
			ck_assert_uint_eq(bytes, rt_quant_block_bytes(t));
		}
}
END_TEST

/* Encode/decode round trip on random data: the error of each value stays within half a
 * step plus the fp16 rounding of the scales (derived bound, see comments). */
START_TEST(test_roundtrip_bound)
{
	enum { N = 32 * 64 };
	static float x[N], y[N];
	static uint8_t q[N * 2];
	uint64_t s = 0x9E3779B97F4A7C15ull;
	for (int i = 0; i < N; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		double u = (double)(s >> 11) / 9007199254740992.0;
		x[i] = (float)((u - 0.5) * (1 + i % 7) * 3.0);
	}
	gw_quantize_q8_0(x, q, N);
	ck_assert_int_eq(rt_dequant(RT_GGML_Q8_0, q, y, N), 0);
	for (int b = 0; b < N / 32; b++) {
		float amax = 0;
		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[b * 32 + j]));
		/* |x - round(x/d)*d16| <= d/2 + 127*d*2^-11 */
		double bound = amax / 127.0 * (0.5 + 127.0 / 2048.0) + 1e-6;
		for (int j = 0; j < 32; j++)
			ck_assert_double_le(fabs(x[b * 32 + j] - y[b * 32 + j]), bound);
	}
	gw_quantize_q4_1(x, q, N);
	ck_assert_int_eq(rt_dequant(RT_GGML_Q4_1, q, y, N), 0);
	for (int b = 0; b < N / 32; b++) {
		float mn = x[b * 32], mx = x[b * 32];
		for (int j = 0; j < 32; j++) {
			mn = fminf(mn, x[b * 32 + j]);
			mx = fmaxf(mx, x[b * 32 + j]);
		}
		double d = (mx - mn) / 15.0;
		/* half a step + 15 steps of d's fp16 error + min's fp16 error */
		double bound = d * (0.5 + 15.0 / 2048.0) + fabs(mn) / 2048.0 + 1e-6;
		for (int j = 0; j < 32; j++)
			ck_assert_double_le(fabs(x[b * 32 + j] - y[b * 32 + j]), bound);
	}
}
END_TEST

/* Real model: rows decoded by rt_dequant equal the rows gguf-py decoded. */
START_TEST(test_real_model_rows)
{
	const char *path = getenv("KVRT_MODEL");
	if (!path || !*path) {
		fprintf(stderr, "test_real_model_rows: KVRT_MODEL not set, skipped\n");
		return;
	}
	rt_err err = { { 0 } };
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	size_t len;
	char *buf = rt_read_file(GOLDEN_DIR "model_rows.dat", &len, &err);
	ck_assert_msg(buf != NULL, "%s", err.msg);
	ck_assert_int_eq(memcmp(buf, "KVMR", 4), 0);
	uint32_t n_rows = rd32(buf + 8);
	ck_assert_uint_ge(n_rows, 7);
	size_t off = 12;
	int seen_q41 = 0, seen_q80 = 0;
	for (uint32_t r = 0; r < n_rows; r++) {
		char name[65] = { 0 };
		memcpy(name, buf + off, 64);
		uint32_t type = rd32(buf + off + 64), row = rd32(buf + off + 68),
			 n = rd32(buf + off + 72);
		off += 76;
		ck_assert_uint_le(off + 4 * (size_t)n, len);
		const rt_gguf_tensor *t = rt_gguf_find_tensor(g, name);
		ck_assert_msg(t != NULL, "tensor %s missing", name);
		ck_assert_uint_eq(t->type, type);
		ck_assert_int_eq(t->ne[0], (int64_t)n);
		ck_assert_int_lt((int64_t)row, t->ne[1]);
		size_t rb = rt_quant_row_bytes(t->type, n);
		ck_assert_uint_gt(rb, 0);
		float *y = malloc(4 * (size_t)n), *want = malloc(4 * (size_t)n);
		memcpy(want, buf + off, 4 * (size_t)n);
		off += 4 * (size_t)n;
		ck_assert_int_eq(rt_dequant(t->type, (const uint8_t *)t->data + row * rb, y, n), 0);
		for (uint32_t j = 0; j < n; j++)
			ck_assert_msg(f32_bits(y[j]) == f32_bits(want[j]),
			              "%s row %u value %u: %.9g, gguf-py %.9g", name, row, j, y[j],
			              want[j]);
		seen_q41 += type == RT_GGML_Q4_1;
		seen_q80 += type == RT_GGML_Q8_0;
		free(y);
		free(want);
	}
	ck_assert_int_gt(seen_q41, 0);
	ck_assert_int_gt(seen_q80, 0);
	free(buf);

	/* decode every tensor once and time it (the runtime does this at load) */
	if (!getenv("KVRT_SANITIZED")) {
		double t0 = rt_now();
		double sum = 0;
		for (uint64_t i = 0; i < rt_gguf_n_tensors(g); i++) {
			const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
			int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
			float *y = malloc(4 * (size_t)n);
			ck_assert_int_eq(rt_dequant(t->type, t->data, y, n), 0);
			for (int64_t j = 0; j < n; j += 4099)
				ck_assert(isfinite(y[j]));
			sum += y[n - 1];
			free(y);
		}
		fprintf(stderr, "test_real_model_rows: dequantised all tensors in %.3f s (%g)\n",
		        rt_now() - t0, sum);
	}
	rt_gguf_close(g);
}
END_TEST

static Suite *quant_suite(void)
{
	Suite *s = suite_create("quant");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_unchecked_fixture(tc, NULL, golden_free);
	tcase_add_test(tc, test_golden_decode);
	tcase_add_test(tc, test_golden_encode);
	tcase_add_test(tc, test_f16_encode);
	tcase_add_test(tc, test_legacy_layout);
	tcase_add_test(tc, test_q6_k_layout);
	tcase_add_test(tc, test_sizes);
	tcase_add_test(tc, test_roundtrip_bound);
	tcase_add_test(tc, test_real_model_rows);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed = check_run(quant_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
