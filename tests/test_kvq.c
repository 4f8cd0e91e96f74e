/*
 * test_kvq: the KV quantisation codecs (runtime/kv/rt_kvq.c) and f32 -> f16 rounding
 * (runtime/base/rt_util.c).
 *
 * References, none of them the code under test:
 *   - f32 -> f16: the processor's F16C instruction (VCVTPS2PH, round to nearest even) on
 *     2^20 random bit patterns and every f16 value's neighbourhood, where the CPU has F16C;
 *     everywhere, the exhaustive round trip f16 -> f32 -> f16 and hand-worked ties.
 *   - codecs: a hand-computed 4-bit group (codes and decoded values worked out on paper),
 *     the error bound of asymmetric min/max rounding derived below, and the identity that the
 *     fused tile logits equal q · (decoded key) computed in double.
 *   - bytes: the sizes the layout implies at head_dim 64 (KIVI-style accounting, scales
 *     counted), against f16's 128 bytes per row.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_util.h"
#include "kv/rt_kvq.h"
#include "support/check_run.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static uint32_t rnd32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

static float rnd_unit(void)
{
	return (float)(rnd32() & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

/* ---- f32 -> f16 ------------------------------------------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_f16(float f)
{
	return (uint16_t)_cvtss_sh(f, 0); /* 0: round to nearest even */
}
#define HAVE_HW_F16 1
#endif

START_TEST(test_f16_roundtrip_exhaustive)
{
	for (uint32_t h = 0; h < 0x10000u; h++) {
		float f = rt_fp16_to_f32((uint16_t)h);
		if (isnan(f)) {
			ck_assert(isnan(rt_fp16_to_f32(rt_f32_to_fp16(f))));
			continue;
		}
		ck_assert_uint_eq(rt_f32_to_fp16(f), h);
	}
	/* hand-worked ties: 1 + 2^-11 lies halfway between 1 (0x3c00) and 1 + 2^-10 (0x3c01),
	 * ties to even -> 0x3c00; 1 + 3 * 2^-11 is halfway between 0x3c01 and 0x3c02 -> 0x3c02 */
	ck_assert_uint_eq(rt_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
	ck_assert_uint_eq(rt_f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
	ck_assert_uint_eq(rt_f32_to_fp16(65520.0f), 0x7c00);     /* rounds up to inf */
	ck_assert_uint_eq(rt_f32_to_fp16(65519.0f), 0x7bff);     /* largest finite */
	ck_assert_uint_eq(rt_f32_to_fp16(0x1p-25f), 0x0000);     /* tie with 0 -> even (0) */
	ck_assert_uint_eq(rt_f32_to_fp16(0x1.8p-25f), 0x0001);   /* above the tie */
	ck_assert_uint_eq(rt_f32_to_fp16(-0x1p-24f), 0x8001);    /* smallest subnormal */
}
END_TEST

START_TEST(test_f16_matches_f16c)
{
#ifdef HAVE_HW_F16
	if (!__builtin_cpu_supports("f16c")) {
		fprintf(stderr, "test_kvq: no F16C on this CPU, hardware comparison skipped\n");
		return;
	}
	for (int i = 0; i < (1 << 20); i++) {
		uint32_t bits = rnd32() ^ (rnd32() << 21);
		float f;
		memcpy(&f, &bits, sizeof f);
		if (isnan(f))
			continue;
		ck_assert_msg(rt_f32_to_fp16(f) == hw_f16(f), "bits %08x: %04x vs hw %04x", bits,
		              rt_f32_to_fp16(f), hw_f16(f));
	}
	/* around every f16 value: the value, the midpoints and one ulp (f32) either side */
	for (uint32_t h = 0; h < 0x7c00u; h++) {
		float a = rt_fp16_to_f32((uint16_t)h), b = rt_fp16_to_f32((uint16_t)(h + 1));
		float mid = a + (b - a) / 2;
		float probe[5] = { a, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), -mid };
		for (int j = 0; j < 5; j++)
			ck_assert_uint_eq(rt_f32_to_fp16(probe[j]), hw_f16(probe[j]));
	}
#endif
}
END_TEST

/* ---- codecs ----------------------------------------------------------------------------- */

START_TEST(test_hand_computed_q4_group)
{
	/* values 0, 1, ..., 31 scaled by 0.5: min 0, max 15.5, 4-bit scale 15.5 / 15 = 1.0333...,
	 * which f16 rounds to 1.0332031 (0x3c22). code_i = round(0.5 i / 1.0332031): i = 0 -> 0,
	 * i = 1 -> round(0.484) = 0, i = 2 -> round(0.968) = 1, i = 3 -> round(1.452) = 1,
	 * i = 31 -> round(15.0019) = 15. Decoded: code * 1.0332031. */
	float x[64] = { 0 };
	for (int i = 0; i < 32; i++)
		x[i] = 0.5f * (float)i;
	for (int i = 32; i < 64; i++)
		x[i] = -2.0f; /* a constant second group: scale 0, decodes exactly to -2 */
	uint8_t row[64];
	ck_assert_uint_eq(rt_kvq_vrow_bytes(RT_KVQ_Q4, 64), 40);
	rt_kvq_vrow_encode(RT_KVQ_Q4, x, 64, row);
	uint16_t hdr[2];
	memcpy(hdr, row, 4);
	ck_assert_uint_eq(hdr[0], 0x3c22);
	ck_assert_uint_eq(hdr[1], 0x0000);
	float y[64];
	rt_kvq_vrow_decode(RT_KVQ_Q4, row, 64, y);
	const float s = 1.0332031f;
	const int code[6][2] = { { 0, 0 }, { 1, 0 }, { 2, 1 }, { 3, 1 }, { 30, 15 }, { 31, 15 } };
	for (int j = 0; j < 6; j++)
		ck_assert_float_eq_tol(y[code[j][0]], s * (float)code[j][1], 1e-6);
	for (int i = 32; i < 64; i++)
		ck_assert_float_eq(y[i], -2.0f);
}
END_TEST

/* A NaN inside a group (a non-finite value from a broken model) gets code 0 instead of a
 * NaN-to-integer conversion, which is undefined (the sanitizer build of this test catches
 * it); the group's other values are encoded as if the NaN were not there: min and max
 * skip it, so they decode as in the hand-computed case above. */
START_TEST(test_nan_in_group_is_code_zero)
{
	float x[32], y[32];
	for (int i = 0; i < 32; i++)
		x[i] = 0.5f * (float)i;
	x[7] = NAN;
	uint8_t row[64];
	rt_kvq_vrow_encode(RT_KVQ_Q4, x, 32, row);
	rt_kvq_vrow_decode(RT_KVQ_Q4, row, 32, y);
	ck_assert_float_eq(y[7], 0.0f); /* code 0 at min 0 */
	ck_assert_float_eq_tol(y[31], 1.0332031f * 15.0f, 1e-6);
	ck_assert_float_eq_tol(y[2], 1.0332031f, 1e-6);
}
END_TEST

/* Asymmetric min/max with f16 scale s and f16 min m: each code is the nearest grid point of
 * the rounded grid m + s*c (clamped to [0, 2^b - 1]), so |x - dec| <= s/2 + |m - min| +
 * (2^b - 1) * |s - s_exact| (the clamped top end drifts by the scale's rounding), and the
 * f16 roundings are relative 2^-11. */
static float group_bound(const float *x, int n, int stride, int bits)
{
	float lo = x[0], hi = x[0];
	for (int i = 1; i < n; i++) {
		lo = fminf(lo, x[(size_t)i * stride]);
		hi = fmaxf(hi, x[(size_t)i * stride]);
	}
	float top = (float)((1 << bits) - 1), s = (hi - lo) / top;
	return s / 2 + fabsf(lo) * 0x1p-11f + top * s * 0x1p-11f + 1e-7f;
}

START_TEST(test_error_bounds)
{
	const rt_kvq_kind kinds[3] = { RT_KVQ_Q8, RT_KVQ_Q4, RT_KVQ_Q2 };
	const int d = 64;
	float k[RT_KVQ_KTILE * 64], y[64];
	static uint8_t buf[RT_KVQ_KTILE * 64 * 4];
	for (int trial = 0; trial < 50; trial++) {
		for (int i = 0; i < RT_KVQ_KTILE * d; i++)
			k[i] = rnd_unit() * (1.0f + (float)(i % d)); /* channel-dependent ranges */
		for (int kk = 0; kk < 3; kk++) {
			int bits = rt_kvq_bits(kinds[kk]);
			/* values, per token */
			rt_kvq_vrow_encode(kinds[kk], k, d, buf);
			rt_kvq_vrow_decode(kinds[kk], buf, d, y);
			for (int g = 0; g < d / RT_KVQ_VGROUP; g++) {
				float b = group_bound(k + g * RT_KVQ_VGROUP, RT_KVQ_VGROUP, 1, bits);
				for (int i = g * RT_KVQ_VGROUP; i < (g + 1) * RT_KVQ_VGROUP; i++)
					ck_assert_msg(fabsf(y[i] - k[i]) <= b, "v %s i %d: %g vs %g (bound %g)",
					              rt_kvq_name(kinds[kk]), i, y[i], k[i], b);
			}
			/* keys, per channel */
			rt_kvq_ktile_encode(kinds[kk], k, d, buf);
			for (int t = 0; t < RT_KVQ_KTILE; t++) {
				rt_kvq_ktile_decode(kinds[kk], buf, d, t, y);
				for (int c = 0; c < d; c++) {
					float b = group_bound(k + c, RT_KVQ_KTILE, d, bits);
					ck_assert_msg(fabsf(y[c] - k[t * d + c]) <= b, "k %s t %d c %d",
					              rt_kvq_name(kinds[kk]), t, c);
				}
			}
		}
	}
}
END_TEST

START_TEST(test_tile_logits_equal_decoded_dot)
{
	const int d = 64;
	float k[RT_KVQ_KTILE * 64], q[64], row[64], lg[RT_KVQ_KTILE];
	static uint8_t buf[RT_KVQ_KTILE * 64 * 4];
	for (int kind = 0; kind < RT_KVQ_N_KIND; kind++) {
		for (int i = 0; i < RT_KVQ_KTILE * d; i++)
			k[i] = rnd_unit() * 3.0f;
		for (int c = 0; c < d; c++)
			q[c] = rnd_unit();
		rt_kvq_ktile_encode((rt_kvq_kind)kind, k, d, buf);
		for (int n = 1; n <= RT_KVQ_KTILE; n += 31) {
			rt_kvq_ktile_logits((rt_kvq_kind)kind, buf, d, n, q, 0.125f, lg);
			for (int t = 0; t < n; t++) {
				rt_kvq_ktile_decode((rt_kvq_kind)kind, buf, d, t, row);
				double ref = 0, mag = 0;
				for (int c = 0; c < d; c++) {
					ref += (double)q[c] * row[c];
					mag += fabs((double)q[c] * row[c]) + fabs((double)q[c] * k[t * d + c]);
				}
				ref *= 0.125;
				/* f32 sums of 64 terms in another order: a few ulps of the magnitude */
				ck_assert_msg(fabs(lg[t] - ref) <= 1e-5 * (mag + 1), "%s t %d: %g vs %g",
				              rt_kvq_name((rt_kvq_kind)kind), t, lg[t], ref);
			}
		}
	}
}
END_TEST

/* A Q8_0 block worked out by hand (ggml's quantize_row_q8_0_ref): x = (1, -2, 0.5, 0, ...):
 * amax 2, d = 2/127 = 0.0157480..., stored as f16 1032/1024 · 2^-6 = 0.0157470703125;
 * codes round(x · 127/2) = 64 (63.5 rounds away from zero), -127, 32 (31.75), 0; decoded
 * D·c = 1.0078125, -1.9998779296875, 0.50390625, 0. */
START_TEST(test_hand_computed_q8_0_block)
{
	float x[64] = { 1.0f, -2.0f, 0.5f }, y[64];
	uint8_t row[68];
	ck_assert_uint_eq(rt_kvq_vrow_bytes(RT_KVQ_Q8_0, 64), 68);
	rt_kvq_vrow_encode(RT_KVQ_Q8_0, x, 64, row);
	uint16_t h;
	memcpy(&h, row, 2);
	ck_assert(rt_fp16_to_f32(h) == 0.0157470703125f);
	ck_assert_int_eq((int8_t)row[2], 64);
	ck_assert_int_eq((int8_t)row[3], -127);
	ck_assert_int_eq((int8_t)row[4], 32);
	ck_assert_int_eq((int8_t)row[5], 0);
	memcpy(&h, row + 34, 2); /* the second block is all zero: scale 0 */
	ck_assert_uint_eq(h, 0);
	rt_kvq_vrow_decode(RT_KVQ_Q8_0, row, 64, y);
	ck_assert(y[0] == 1.0078125f && y[1] == -1.9998779296875f && y[2] == 0.50390625f);
	for (int i = 3; i < 64; i++)
		ck_assert(y[i] == 0.0f);
}
END_TEST

START_TEST(test_bytes_and_names)
{
	/* head_dim 64: f16 row 128 bytes; q8 2 x (4 + 32) = 72; q4 2 x (4 + 16) = 40;
	 * q2 2 x (4 + 8) = 24. Key tiles per entry: 64 x (4 + 32 b / 8) / 32. */
	ck_assert_uint_eq(rt_kvq_vrow_bytes(RT_KVQ_F32, 64), 256);
	ck_assert_uint_eq(rt_kvq_vrow_bytes(RT_KVQ_F16, 64), 128);
	ck_assert_uint_eq(rt_kvq_vrow_bytes(RT_KVQ_Q8, 64), 72);
	ck_assert_uint_eq(rt_kvq_vrow_bytes(RT_KVQ_Q4, 64), 40);
	ck_assert_uint_eq(rt_kvq_vrow_bytes(RT_KVQ_Q2, 64), 24);
	ck_assert_uint_eq(rt_kvq_ktile_bytes(RT_KVQ_F16, 64), 32 * 128);
	ck_assert_uint_eq(rt_kvq_ktile_bytes(RT_KVQ_Q8, 64), 64 * 36);
	ck_assert_uint_eq(rt_kvq_ktile_bytes(RT_KVQ_Q4, 64), 64 * 20);
	ck_assert_uint_eq(rt_kvq_ktile_bytes(RT_KVQ_Q2, 64), 64 * 12);
	for (int k = 0; k < RT_KVQ_N_KIND; k++)
		ck_assert_int_eq(rt_kvq_parse(rt_kvq_name((rt_kvq_kind)k)), k);
	ck_assert_int_eq(rt_kvq_parse("q3"), -1);
}
END_TEST

static Suite *kvq_suite(void)
{
	Suite *s = suite_create("kvq");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_f16_roundtrip_exhaustive);
	tcase_add_test(tc, test_f16_matches_f16c);
	tcase_add_test(tc, test_hand_computed_q4_group);
	tcase_add_test(tc, test_nan_in_group_is_code_zero);
	tcase_add_test(tc, test_error_bounds);
	tcase_add_test(tc, test_tile_logits_equal_decoded_dot);
	tcase_add_test(tc, test_bytes_and_names);
	tcase_add_test(tc, test_hand_computed_q8_0_block);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int nf = check_run(kvq_suite());
	return nf == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
