/*
 * test_kvbytes: compression in bytes against an f16 full cache (runtime/kv/rt_kvbytes.h)
 * on stores of the grouped-query shapes 9/3 and 4/1 holding different entry counts per
 * (layer, KV head), against figures computed by hand from the definition:
 *   held = Σ entries × 2 (K and V) × row_bytes,  f16 = tokens × layers × KV heads × 2 ×
 *   head_dim × 2 bytes.
 */
#include <check.h>
#include <stdlib.h>

#include "kv/rt_kv.h"
#include "kv/rt_kvbytes.h"
#include "support/check_run.h"

/* Append n[i] entries to head i of kv. */
static void fill(rt_kv *kv, const int *n)
{
	float k[64] = { 0 }, v[64] = { 0 };
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		for (int e = 0; e < n[i]; e++)
			rt_kv_append(kv, &kv->heads[i], k, v, e);
}

START_TEST(gqa_9_3_by_hand)
{
	/* 2 layers × 3 KV heads (9 query heads: group 3), head_dim 8, f32 rows of 32 bytes */
	rt_kv kv;
	rt_err err;
	ck_assert_int_eq(rt_kv_init(&kv, 2, 3, 3, 8, 16, 0, 0, &err), 0);
	ck_assert_int_eq((int)kv.row_bytes, 32);
	const int n[6] = { 5, 3, 4, 5, 2, 1 }; /* 20 entries */
	fill(&kv, n);
	/* held: 20 × 2 × 32 = 1280; f16 after 10 tokens: 10 × 2 × 3 × 2 × 8 × 2 = 1920 */
	ck_assert_int_eq(rt_kvbytes_held(&kv), 1280);
	ck_assert_int_eq(rt_kvbytes_f16(&kv, 10), 1920);
	ck_assert_double_eq_tol(rt_kvbytes_compression(&kv, 10), 1.5, 1e-15);
	/* the full cache in an f32 store is 0.5x: 10 tokens in every head */
	rt_kv_reset(&kv);
	const int full[6] = { 10, 10, 10, 10, 10, 10 };
	fill(&kv, full);
	ck_assert_double_eq_tol(rt_kvbytes_compression(&kv, 10), 0.5, 1e-15);
	rt_kv_free(&kv);
}
END_TEST

START_TEST(gqa_4_1_by_hand_and_empty)
{
	/* 1 layer × 1 KV head (4 query heads), head_dim 16: rows of 64 bytes */
	rt_kv kv;
	rt_err err;
	ck_assert_int_eq(rt_kv_init(&kv, 1, 1, 4, 16, 32, 0, 0, &err), 0);
	ck_assert_int_eq(rt_kvbytes_held(&kv), 0);
	ck_assert_double_eq(rt_kvbytes_compression(&kv, 12), 0); /* nothing held: 0 */
	const int n[1] = { 6 };
	fill(&kv, n);
	/* held 6 × 2 × 64 = 768; f16 after 12 tokens: 12 × 1 × 1 × 2 × 16 × 2 = 768 */
	ck_assert_int_eq(rt_kvbytes_held(&kv), 768);
	ck_assert_int_eq(rt_kvbytes_f16(&kv, 12), 768);
	ck_assert_double_eq_tol(rt_kvbytes_compression(&kv, 12), 1.0, 1e-15);
	/* 48 tokens summarised by the same 6 entries: 4x */
	ck_assert_double_eq_tol(rt_kvbytes_compression(&kv, 48), 4.0, 1e-15);
	rt_kv_free(&kv);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kvbytes");
	TCase *tc = tcase_create("bytes");
	tcase_add_test(tc, gqa_9_3_by_hand);
	tcase_add_test(tc, gqa_4_1_by_hand_and_empty);
	suite_add_tcase(s, tc);
	int failed = check_run(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
