/*
 * test_rope: the one RoPE (runtime/base/rt_rope.c) against a long-hand rotation written
 * here from the definition (ggml NORMAL mode: adjacent pairs, theta_i = pos ·
 * base^(-2i/n_rot)), a hand-computed pair, inverse rotations, and the three precisions
 * agreeing with each other. Head shapes 9/3 and 4/1 (query/KV heads). RoPE scaling
 * (linear, Llama 3.x frequency factors, YaRN) against frequencies worked out by hand.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_rope.h"
#include "support/check_run.h"

static uint64_t rng = 1;

static double rnd(void)
{
	rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* Long-hand: rotate pair i of x (double) by pos·base^(-2i/n), using powl and cosl in long
 * double so the reference does not share the code's arithmetic. */
static void ref_rotate(double *x, int n_rot, double base, double pos)
{
	for (int i = 0; i < n_rot / 2; i++) {
		long double th = (long double)pos * powl((long double)base, -2.0L * i / n_rot);
		long double c = cosl(th), s = sinl(th);
		long double a = x[2 * i], b = x[2 * i + 1];
		x[2 * i] = (double)(a * c - b * s);
		x[2 * i + 1] = (double)(a * s + b * c);
	}
}

START_TEST(test_hand_pair)
{
	/* pos 1, pair 0: frequency base^0 = 1, so the rotation is exactly 1 radian */
	float x[2] = { 1.0f, 0.0f };
	rt_rope_by_f32(x, 2, 10000.0f, 1.0);
	ck_assert_float_eq_tol(x[0], 0.5403023f, 1e-7f); /* cos 1 */
	ck_assert_float_eq_tol(x[1], 0.8414710f, 1e-7f); /* sin 1 */
	/* pair 1 of n_rot 4 at base 100: frequency 100^(-1/2) = 0.1 */
	ck_assert_double_eq_tol(rt_rope_freq(1, 4, 100.0f), 0.1, 1e-15);
	double y[4] = { 0, 0, 0.0, 2.0 };
	rt_rope_by_f64(y, 4, 100.0f, 10.0); /* pair 1 turns by 1 radian: (0,2) -> (-2 sin 1, 2 cos 1) */
	ck_assert_double_eq_tol(y[2], -2.0 * 0.8414709848078965, 1e-12);
	ck_assert_double_eq_tol(y[3], 2.0 * 0.5403023058681398, 1e-12);
}
END_TEST

/* The forward's f32 table and rotation over C rows of 9 query heads and 3 KV heads (and
 * 4/1), against the long-hand reference; unrotated dimensions untouched. */
static void check_heads(int n_head, int head_dim, int n_rot)
{
	const int C = 5;
	const int32_t pos0 = 1000;
	const size_t stride = (size_t)n_head * head_dim;
	float *x = malloc(C * stride * sizeof *x), *cs = malloc((size_t)C * n_rot * sizeof *cs);
	double *ref = malloc(C * stride * sizeof *ref);
	for (size_t i = 0; i < C * stride; i++)
		ref[i] = x[i] = (float)rnd();
	rt_rope_table_f32(cs, C, pos0, n_rot, 10000.0f);
	/* heads 1..n_head-1 of every row; head 0 stays as it was */
	rt_rope_apply_f32(x, C, stride, 1, n_head - 1, head_dim, n_rot, cs);
	for (int r = 0; r < C; r++)
		for (int h = 1; h < n_head; h++)
			ref_rotate(ref + r * stride + (size_t)h * head_dim, n_rot, 10000.0, pos0 + r);
	for (size_t i = 0; i < C * stride; i++)
		ck_assert_msg(fabs(x[i] - ref[i]) < 2e-6, "%zu: %g vs %g", i, (double)x[i], ref[i]);
	free(x);
	free(cs);
	free(ref);
}

START_TEST(test_forward_table)
{
	check_heads(9, 64, 64);
	check_heads(3, 64, 32);
	check_heads(4, 16, 16);
	check_heads(1, 16, 8);
}
END_TEST

START_TEST(test_precisions_and_inverse)
{
	const int d = 64;
	double freq[32], cs[64];
	rt_rope_freqs(freq, d, 100000.0f);
	const int32_t positions[] = { 0, 1, 17, 1234, 8191 };
	for (int k = 0; k < 5; k++) {
		float a[64], b[64], orig[64];
		double c[64];
		for (int i = 0; i < d; i++)
			c[i] = orig[i] = a[i] = b[i] = (float)rnd();
		/* by position == table with frequencies == table without them, to the bit */
		rt_rope_by_f32(a, d, 100000.0f, positions[k]);
		rt_rope_cs_f64(cs, positions[k], d, 100000.0f, freq);
		rt_rope_rotate_f32_by_f64(b, d, cs);
		ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
		double cs2[64];
		rt_rope_cs_f64(cs2, positions[k], d, 100000.0f, NULL);
		ck_assert_int_eq(memcmp(cs, cs2, sizeof cs), 0);
		/* the double path rounds to the float path's result */
		rt_rope_rotate_f64(c, d, cs);
		for (int i = 0; i < d; i++)
			ck_assert_float_eq((float)c[i], a[i]);
		/* rotating back by -pos restores the vector */
		rt_rope_by_f64(c, d, 100000.0f, -(double)positions[k]);
		for (int i = 0; i < d; i++)
			ck_assert_double_eq_tol(c[i], orig[i], 1e-12);
	}
}
END_TEST

/* RoPE scaling against values worked out by hand from llama.cpp's formulas (ggml-cpu
 * ops.cpp rope_yarn, ggml.c ggml_rope_yarn_corr_dims, llama-context.cpp's attention
 * factor), n_rot 8, base 10000 (plain frequencies 1, 0.1, 0.01, 0.001):
 *   linear, factor 4 (freq_scale 0.25): 0.25, 0.025, 0.0025, 0.00025; magnitude 1;
 *   Llama 3.x factors (rope_freqs.weight) 1, 2, 4, 8: 1, 0.05, 0.0025, 0.000125;
 *   YaRN, factor 4, original context 64, betas 32 / 1: the correction dimensions are
 *   floor(8 ln(64 / (32·2π)) / (2 ln 10000)) = floor(-0.497) -> 0 and
 *   ceil(8 ln(64 / (2π)) / (2 ln 10000)) = ceil(1.008) = 2, so the ramp mixes
 *   1, 0.5, 0, 0 of the extrapolated frequency: 1, 0.1·(0.25·0.5 + 0.5) = 0.0625, 0.0025,
 *   0.00025; magnitude 1 + 0.1 ln 4 = 1.1386294 (llama.cpp cancels its own get_mscale). */
START_TEST(test_scaling_hand)
{
	double f[4];
	float ms;
	const rt_rope_scaling lin = { .freq_scale = 0.25f, .attn_factor = 1.0f };
	rt_rope_scaled_freqs(f, &ms, 8, 10000.0f, &lin);
	const double want_lin[4] = { 0.25, 0.025, 0.0025, 0.00025 };
	for (int i = 0; i < 4; i++)
		ck_assert_double_eq_tol(f[i], want_lin[i], 1e-9 * want_lin[i]);
	ck_assert_float_eq(ms, 1.0f);
	const float ff[4] = { 1, 2, 4, 8 };
	const rt_rope_scaling l3 = { .freq_scale = 1.0f, .factors = ff, .attn_factor = 1.0f };
	rt_rope_scaled_freqs(f, &ms, 8, 10000.0f, &l3);
	const double want_l3[4] = { 1, 0.05, 0.0025, 0.000125 };
	for (int i = 0; i < 4; i++)
		ck_assert_double_eq_tol(f[i], want_l3[i], 1e-9 * want_l3[i]);
	const rt_rope_scaling yarn = { .freq_scale = 0.25f, .yarn = 1, .yarn_factor = 4.0f,
		                       .beta_fast = 32.0f, .beta_slow = 1.0f, .n_ctx_orig = 64,
		                       .attn_factor = 1.0f };
	rt_rope_scaled_freqs(f, &ms, 8, 10000.0f, &yarn);
	const double want_yarn[4] = { 1, 0.0625, 0.0025, 0.00025 };
	for (int i = 0; i < 4; i++)
		ck_assert_double_eq_tol(f[i], want_yarn[i], 1e-9 * want_yarn[i]);
	ck_assert_float_eq_tol(ms, 1.1386294f, 1e-6f);
	/* the table from frequencies: pos 3, pair 1 of the linear case, cos/sin of 0.075 */
	float cs[8];
	rt_rope_scaled_freqs(f, &ms, 8, 10000.0f, &lin);
	rt_rope_table_f32_freq(cs, 1, 3, 8, f, 2.0f);
	ck_assert_float_eq_tol(cs[2], 2.0f * 0.99718882f, 1e-6f);
	ck_assert_float_eq_tol(cs[3], 2.0f * 0.07492971f, 1e-6f);
	/* unscaled: the plain table, bit for bit */
	float a[16], b[16];
	rt_rope_scaled_freqs(f, &ms, 8, 10000.0f, NULL);
	rt_rope_table_f32(a, 2, 5, 8, 10000.0f);
	rt_rope_table_f32_freq(b, 2, 5, 8, f, ms);
	ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("rope");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_hand_pair);
	tcase_add_test(tc, test_forward_table);
	tcase_add_test(tc, test_precisions_and_inverse);
	tcase_add_test(tc, test_scaling_hand);
	suite_add_tcase(s, tc);
	int failed = check_run(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
