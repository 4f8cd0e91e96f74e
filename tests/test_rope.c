/*
 * test_rope: the one RoPE (runtime/base/rt_rope.c) against a long-hand rotation written
 * here from the definition (ggml NORMAL mode: adjacent pairs, theta_i = pos ·
 * base^(-2i/n_rot)), a hand-computed pair, inverse rotations, and the three precisions
 * agreeing with each other. Head shapes 9/3 and 4/1 (query/KV heads).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_rope.h"

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

int main(void)
{
	Suite *s = suite_create("rope");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_hand_pair);
	tcase_add_test(tc, test_forward_table);
	tcase_add_test(tc, test_precisions_and_inverse);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
