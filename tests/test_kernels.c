/*
 * test_kernels: the C kernel templates of kernels/ against hand-computed values and
 * plain reference loops: top-k selection and its tie rule (k_select.h: the scan, selection
 * and sort paths vs an O(n^2) rank-count reference on random inputs with many ties and
 * NaN), 1-D pooling and group
 * reduction (k_score.h), the CAOTE transform (exact: equal to the true output change
 * when one entry is removed and the rest renormalised; fast: with the mean value), the
 * KeyDiff anchor cosine, statistic rings and the prompt-tail gate (k_stat.h), PyramidKV
 * and linear layer budgets and Ada-KV head allocation (k_alloc.h), and the merge action
 * (k_compress.h).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k_alloc.h"
#include "k_compress.h"
#include "k_score.h"
#include "k_select.h"
#include "k_stat.h"
#include "support/check_run.h"

START_TEST(select_ties_keep_lower_position)
{
	/* scores with ties; positions deliberately not in index order */
	const float s[6] = { 1, 3, 3, 2, 3, 1 };
	const int32_t pos[6] = { 10, 40, 20, 30, 50, 5 };
	const uint8_t cand[6] = { 1, 1, 1, 1, 1, 1 };
	uint8_t keep[6] = { 0 };
	struct k_cand buf[6], tmp[6];
	ck_assert_int_eq(k_select_topk(s, pos, cand, 6, 2, keep, buf, tmp), 2);
	/* three entries score 3: positions 20 (idx 2) and 40 (idx 1) win over 50 */
	const uint8_t want[6] = { 0, 1, 1, 0, 0, 0 };
	ck_assert_int_eq(memcmp(keep, want, 6), 0);
	memset(keep, 0, 6);
	k_select_topk(s, pos, cand, 6, 5, keep, buf, tmp);
	/* the score-1 tie between positions 10 and 5: 5 (idx 5) stays */
	const uint8_t want5[6] = { 0, 1, 1, 1, 1, 1 };
	ck_assert_int_eq(memcmp(keep, want5, 6), 0);
}
END_TEST

START_TEST(select_nan_and_candidates)
{
	const float s[5] = { NAN, -INFINITY, 0, NAN, 7 };
	const int32_t pos[5] = { 0, 1, 2, 3, 4 };
	const uint8_t cand[5] = { 1, 1, 1, 1, 0 }; /* the best one is not a candidate */
	uint8_t keep[5] = { 0 };
	struct k_cand buf[5], tmp[5];
	ck_assert_int_eq(k_select_topk(s, pos, cand, 5, 3, keep, buf, tmp), 3);
	/* 0 > -inf > NaN; the NaN at position 0 beats the NaN at 3 */
	const uint8_t want[5] = { 1, 1, 1, 0, 0 };
	ck_assert_int_eq(memcmp(keep, want, 5), 0);
	memset(keep, 0, 5);
	ck_assert_int_eq(k_select_topk(s, pos, cand, 5, 0, keep, buf, tmp), 0);
	ck_assert_int_eq(k_select_topk(s, pos, cand, 5, 9, keep, buf, tmp), 4);
}
END_TEST

START_TEST(sort_matches_rank_reference)
{
	srand(7);
	enum { N = 257 };
	struct k_cand c[N], ref[N], tmp[N];
	for (int trial = 0; trial < 20; trial++) {
		for (int i = 0; i < N; i++) {
			int r = rand() % 9;
			c[i].score = r == 8 ? NAN : (float)(r % 4); /* many ties */
			c[i].pos = rand() % 50;                    /* equal positions too */
			c[i].head = rand() % 3;
			c[i].idx = i;
		}
		memcpy(ref, c, sizeof c);
		k_cand_sort(c, N, tmp);
		for (int i = 0; i < N; i++) {
			int64_t rank = k_select_ref_rank(ref, N, i);
			ck_assert_int_eq(c[rank].idx, ref[i].idx);
		}
	}
}
END_TEST

/* k_select_topk (both the sort path and the few-evictions scan path) keeps exactly the
 * candidates whose reference rank is below k. */
START_TEST(topk_matches_rank_reference)
{
	srand(3);
	enum { N = 60 };
	float s[N];
	int32_t pos[N];
	uint8_t cand[N], keep[N];
	struct k_cand buf[N], tmp[N], ref[N];
	for (int trial = 0; trial < 200; trial++) {
		int m = 0;
		for (int i = 0; i < N; i++) {
			int r = rand() % 7;
			s[i] = r == 6 ? NAN : (float)(r % 3);
			pos[i] = i * 3 + rand() % 3;
			cand[i] = rand() % 5 != 0;
			if (cand[i])
				ref[m++] = (struct k_cand){ s[i], pos[i], i, 0 };
		}
		int k = trial % 2 ? m - 1 - trial % 9 : trial % (m + 1);
		memset(keep, 0, sizeof keep);
		k_select_topk(s, pos, cand, N, k, keep, buf, tmp);
		for (int j = 0; j < m; j++)
			ck_assert_int_eq(keep[ref[j].idx], k_select_ref_rank(ref, m, j) < k);
		for (int i = 0; i < N; i++)
			if (!cand[i])
				ck_assert_int_eq(keep[i], 0);
	}
}
END_TEST

/* The scan path (a few leave) and the selection path (more than 8 leave, more than 16
 * in play) of k_select_topk, and k_cand_select, on heads of 700 entries: ties in score
 * (0, -0 which ranks equal to it, 1, 2, 3, -1.5, NaN), equal positions, every fifth
 * entry no candidate, and inputs already in rank order, in reverse, and all scores
 * equal; for k = 0, 1, 9, half, m - 9 (just past the scan path), m - 1, m, and a random
 * k, the kept set is exactly the candidates whose reference rank (k_select_ref_rank,
 * computed once per input) is below k. */
START_TEST(select_large_matches_rank_reference)
{
	srand(11);
	enum { N = 700 };
	static float s[N];
	static int32_t pos[N], rank[N];
	static uint8_t cand[N], keep[N];
	static struct k_cand buf[N], tmp[N], ref[N], c[N];
	for (int trial = 0; trial < 12; trial++) {
		const int kind = trial % 4; /* 0 random, 1 rank order, 2 reverse, 3 one score */
		int m = 0;
		for (int i = 0; i < N; i++) {
			int r = rand() % 9;
			s[i] = kind == 1 ? (float)(N - i) : kind == 2 ? (float)i : kind == 3 ? 1.0f :
			       r == 8 ? NAN : r == 4 ? -0.0f : r == 5 ? -1.5f : (float)(r % 4);
			pos[i] = kind == 0 ? rand() % 300 : i;
			cand[i] = kind == 0 ? rand() % 5 != 0 : 1;
			if (cand[i])
				ref[m++] = (struct k_cand){ s[i], pos[i], i, 0 };
		}
		for (int j = 0; j < m; j++)
			rank[j] = (int32_t)k_select_ref_rank(ref, m, j);
		const int ks[8] = { 0, 1, 9, m / 2, m - 9, m - 1, m, rand() % (m + 1) };
		for (int q = 0; q < 8; q++) {
			const int k = ks[q];
			memset(keep, 0, sizeof keep);
			ck_assert_int_eq(k_select_topk(s, pos, cand, N, k, keep, buf, tmp), k);
			for (int j = 0; j < m; j++)
				ck_assert_msg(keep[ref[j].idx] == (rank[j] < k),
				              "trial %d k %d: entry %d of rank %d kept %d", trial, k,
				              ref[j].idx, rank[j], keep[ref[j].idx]);
			for (int i = 0; i < N; i++)
				if (!cand[i])
					ck_assert_int_eq(keep[i], 0);
			/* the selection alone: c[0..k) are the ranks below k, c[k..m) the rest */
			memcpy(c, ref, (size_t)m * sizeof *c);
			k_cand_select(c, m, k, tmp);
			memset(keep, 0, sizeof keep);
			for (int j = 0; j < k; j++)
				keep[c[j].idx] = 1;
			for (int j = 0; j < m; j++)
				ck_assert_int_eq(keep[ref[j].idx], rank[j] < k);
		}
	}
}
END_TEST

START_TEST(pool_and_reduce)
{
	const float in[7] = { 0, 5, 1, 0, 0, 3, 0 };
	float out[7];
	k_pool(in, out, 7, 3, 1);
	const float mx[7] = { 5, 5, 5, 1, 3, 3, 3 };
	for (int i = 0; i < 7; i++)
		ck_assert_float_eq(out[i], mx[i]);
	k_pool(in, out, 7, 3, 0);
	/* zero padding counts: the first window is (pad, 0, 5) / 3 */
	const float av[7] = { 5.0f / 3, 2, 2, 1.0f / 3, 1, 1, 1 };
	for (int i = 0; i < 7; i++)
		ck_assert_float_eq_tol(out[i], av[i], 1e-6);
	/* group of 3 query heads, stride 4, 2 entries */
	const float q[12] = { 1, 4, 0, 0, 3, 2, 0, 0, 5, 0, 0, 0 };
	float r[2];
	k_reduce(r, q, 3, 4, 2, K_REDUCE_MEAN);
	ck_assert_float_eq_tol(r[0], 3, 1e-6);
	ck_assert_float_eq_tol(r[1], 2, 1e-6);
	k_reduce(r, q, 3, 4, 2, K_REDUCE_MAX);
	ck_assert_float_eq(r[0], 5);
	ck_assert_float_eq(r[1], 4);
	k_reduce(r, q, 3, 4, 2, K_REDUCE_SUM);
	ck_assert_float_eq(r[0], 9);
	ck_assert_float_eq(r[1], 6);
}
END_TEST

/* CAOTE exact, given the true output o of attention a (the base score is that step's
 * attention), equals ||o - o'_j|| where o'_j renormalises the attention without j. */
START_TEST(caote_exact_is_the_output_change)
{
	enum { D = 3 };
	const float v[4 * D] = { 1, 0, 2, -1, 3, 0, 0.5f, 0.5f, 0.5f, 4, -2, 1 };
	const float a[4] = { 0.1f, 0.4f, 0.3f, 0.2f };
	for (int n = 2; n <= 4; n++) {
		float s[4], of[D];
		double sum = 0, o[D] = { 0 }, work[D];
		for (int i = 0; i < n; i++)
			sum += a[i];
		for (int i = 0; i < n; i++) {
			s[i] = a[i];
			for (int j = 0; j < D; j++)
				o[j] += a[i] / sum * v[i * D + j];
		}
		for (int j = 0; j < D; j++)
			of[j] = (float)o[j];
		k_caote(s, v, n, D, of, work);
		for (int e = 0; e < n; e++) {
			double o2[D] = { 0 }, rest = sum - a[e], err = 0;
			for (int i = 0; i < n; i++)
				if (i != e)
					for (int j = 0; j < D; j++)
						o2[j] += a[i] / rest * v[i * D + j];
			for (int j = 0; j < D; j++)
				err += (o[j] - o2[j]) * (o[j] - o2[j]);
			ck_assert_double_eq_tol(s[e], sqrt(err), 1e-5);
		}
	}
	/* two entries, attention (1/4, 3/4) on values 0, 8: the true output is 6;
	 * c_0 = (1/4)/(3/4)·|6 - 0| = 2, c_1 = 3·|6 - 8| = 6 */
	float s2[2] = { 0.25f, 0.75f };
	const float v2[2] = { 0, 8 }, o6[1] = { 6 };
	double w1[1];
	k_caote(s2, v2, 2, 1, o6, w1);
	ck_assert_float_eq_tol(s2[0], 2.0f, 1e-6);
	ck_assert_float_eq_tol(s2[1], 6.0f, 1e-6);
	/* the output is the TRUE one, not the score-weighted mean: with o = 1 (another
	 * query's output), c_0 = 1/3·1, c_1 = 3·7 */
	float s5[2] = { 0.25f, 0.75f };
	const float o1[1] = { 1 };
	k_caote(s5, v2, 2, 1, o1, w1);
	ck_assert_float_eq_tol(s5[0], 1.0f / 3, 1e-6);
	ck_assert_float_eq_tol(s5[1], 21.0f, 1e-5);
	/* fast: mean value 4; c = a/(1-a)·|4 - v| = (1/3·4, 3·4) */
	float s3[2] = { 0.25f, 0.75f };
	k_caote(s3, v2, 2, 1, NULL, w1);
	ck_assert_float_eq_tol(s3[0], 4.0f / 3, 1e-6);
	ck_assert_float_eq_tol(s3[1], 12.0f, 1e-5);
	/* a single entry holds all the attention: never cheap */
	float s4[1] = { 1 };
	k_caote(s4, v2, 1, 1, o6, w1);
	ck_assert(s4[0] == FLT_MAX);
}
END_TEST

/* CAOTE's GQA rule (L2 over the group): per-head errors 3 and 4 give 5; 9/3 and 4/1
 * shapes; the stored outputs come back per query head. */
START_TEST(reduce_l2_and_output_state)
{
	/* group of 3, stride 2, 2 entries: (3, 4, 0) -> 5; (1, 2, 2) -> 3 */
	const float q[6] = { 3, 1, 4, 2, 0, 2 };
	float r[2];
	k_reduce(r, q, 3, 2, 2, K_REDUCE_L2);
	ck_assert_float_eq_tol(r[0], 5.0f, 1e-6);
	ck_assert_float_eq_tol(r[1], 3.0f, 1e-6);
	/* group of 4: (1, 1, 1, 1) -> 2 */
	const float q4[4] = { 1, 1, 1, 1 };
	k_reduce(r, q4, 4, 1, 1, K_REDUCE_L2);
	ck_assert_float_eq_tol(r[0], 2.0f, 1e-6);
	uint8_t state[K_OUT_MAX_GROUP * 2 * sizeof(float)];
	memset(state, 0, sizeof state);
	const float outs[3 * 2] = { 1, 2, 3, 4, 5, 6 };
	k_out_store(state, outs, 3, 2);
	ck_assert_float_eq(k_out_row(state, 1, 2)[0], 3);
	ck_assert_float_eq(k_out_row(state, 2, 2)[1], 6);
	ck_assert_float_eq(k_out_row(state, 3, 2)[0], 0);
}
END_TEST

START_TEST(keydiff_anchor)
{
	const float k[3 * 2] = { 2, 0, 0, 5, 1, 0 };
	double a[2];
	k_key_anchor(k, 3, 2, a);
	ck_assert_double_eq_tol(a[0], 2.0 / 3, 1e-12);
	ck_assert_double_eq_tol(a[1], 1.0 / 3, 1e-12);
	ck_assert_double_eq_tol(k_cos_anchor(k, a, 2), 2 / sqrt(5), 1e-9);
	ck_assert_double_eq_tol(k_cos_anchor(k + 2, a, 2), 1 / sqrt(5), 1e-9);
	const float z[2] = { 0, 0 };
	ck_assert_double_eq(k_cos_anchor(z, a, 2), 0);
	ck_assert_double_eq_tol(k_norm(k + 2, 2), 5, 1e-12);
}
END_TEST

START_TEST(stat_rings)
{
	uint32_t ring[3] = { 0 }; /* 70 one-bit cells */
	for (int64_t t = 0; t < 100; t++)
		k_stat_ring_put_bit(ring, 70, t, t % 2 == 0 && t >= 50);
	/* last 70 steps are 30..99; lows at even steps 50..98: 25 */
	ck_assert_double_eq(k_stat_ring_count(ring, 70), 25);
	uint32_t fr[4] = { 0 };
	for (int64_t t = 0; t < 10; t++)
		k_stat_ring_put(fr, 4, t, (double)t);
	ck_assert_double_eq(k_stat_ring_sum(fr, 4), 6 + 7 + 8 + 9);
	uint32_t w = 0;
	k_stat_ema(&w, 1.0, 0.5);
	k_stat_ema(&w, 1.0, 0.5);
	ck_assert_float_eq(k_stat_getf(&w), 0.75f);
	/* prompt of 10, window 3: steps 7, 8, 9 observe */
	ck_assert_int_eq(k_stat_in_prompt_tail(6, 10, 3), 0);
	ck_assert_int_eq(k_stat_in_prompt_tail(7, 10, 3), 1);
	ck_assert_int_eq(k_stat_in_prompt_tail(9, 10, 3), 1);
	ck_assert_int_eq(k_stat_in_prompt_tail(10, 10, 3), 0);
	ck_assert_int_eq(k_stat_in_prompt_tail(9, -1, 3), 0);
	ck_assert_double_eq(k_stat_tail_steps(9, 10, 3), 2);
	ck_assert_double_eq(k_stat_tail_steps(20, 10, 3), 3);
}
END_TEST

START_TEST(layer_budgets)
{
	double out[4];
	/* KVCache-Factory: B = 100, w = 10, beta = 20, n = 1000, L = 4:
	 * min = 90 // 20 = 4, max = 180 - 4 = 176, step = 172 // 3 = 57;
	 * cap_l = 176 - 57 l (+ w) = 186, 129, 72, 15 */
	k_layers_pyramid(100, 10, 20, 1000, 4, 0, out);
	const double p[4] = { 186, 129, 72, 15 };
	for (int l = 0; l < 4; l++)
		ck_assert_double_eq(out[l], p[l]);
	k_layers_pyramid(100, 10, 20, 1000, 4, 1, out);
	for (int l = 0; l < 4; l++)
		ck_assert_double_eq(out[l], p[3 - l]);
	/* short prompts: n < B keeps n; B <= n < 2(B - w) is uniform */
	k_layers_pyramid(100, 10, 20, 60, 4, 0, out);
	ck_assert_double_eq(out[2], 60);
	k_layers_pyramid(100, 10, 20, 150, 4, 0, out);
	ck_assert_double_eq(out[3], 100);
	/* prompt just over the pyramid threshold: max capped at n - w */
	k_layers_pyramid(100, 10, 20, 185, 4, 0, out);
	/* max = 176 >= 175 -> max 175, min 5, step 56: 185, 129, 73, 17 */
	const double q[4] = { 185, 129, 73, 17 };
	for (int l = 0; l < 4; l++)
		ck_assert_double_eq(out[l], q[l]);
	/* linear 0.5 .. 1.5 over 3 layers keeps the mean */
	k_layers_linear(10, 0.5, 1.5, 3, out);
	ck_assert_double_eq_tol(out[0], 5, 1e-12);
	ck_assert_double_eq_tol(out[1], 10, 1e-12);
	ck_assert_double_eq_tol(out[2], 15, 1e-12);
	const double m[2] = { 1, 3 };
	k_layers_list(10, m, 2, 4, out); /* resampled 1 1 3 3, mean 2 */
	ck_assert_double_eq_tol(out[0], 5, 1e-12);
	ck_assert_double_eq_tol(out[3], 15, 1e-12);
}
END_TEST

/* Ada-KV on two heads of 4 candidates, base 2 each (total 4): head 0 scores
 * 9 8 7 1, head 1 scores 6 0 0 0. Global top 4: 9 8 7 (head 0), 6 (head 1):
 * n = (3, 1). floor 0: b = (3, 1); floor 0.5: b = round(1 + 1.5, 1 + 0.5) = (3, 2). */
START_TEST(adaptive_heads)
{
	const float s0[4] = { 9, 8, 7, 1 }, s1[4] = { 6, 0, 0, 0 };
	const int32_t p[4] = { 0, 1, 2, 3 };
	const uint8_t c[4] = { 1, 1, 1, 1 };
	const float *sc[2] = { s0, s1 };
	const int32_t *ps[2] = { p, p };
	const uint8_t *cs[2] = { c, c };
	const int32_t n[2] = { 4, 4 }, base[2] = { 2, 2 };
	int32_t out[2];
	struct k_cand buf[8], tmp[8];
	k_alloc_adaptive(2, sc, ps, cs, n, base, 0.0, out, buf, tmp);
	ck_assert_int_eq(out[0], 3);
	ck_assert_int_eq(out[1], 1);
	k_alloc_adaptive(2, sc, ps, cs, n, base, 0.5, out, buf, tmp);
	ck_assert_int_eq(out[0], 3);
	ck_assert_int_eq(out[1], 2);
	/* equal scores across heads: the tie goes to the lower position, then head 0 */
	const float e0[2] = { 1, 1 }, e1[2] = { 1, 1 };
	const float *se[2] = { e0, e1 };
	const int32_t q0[2] = { 5, 6 }, q1[2] = { 4, 7 };
	const int32_t *pq[2] = { q0, q1 };
	const int32_t n2[2] = { 2, 2 }, b1[2] = { 1, 1 };
	k_alloc_adaptive(2, se, pq, cs, n2, b1, 0.0, out, buf, tmp);
	ck_assert_int_eq(out[0], 1); /* position 5 */
	ck_assert_int_eq(out[1], 1); /* position 4 */
}
END_TEST

/* Merge: entries 0..3 with keys along x or y; keep 0 and 3; 1 (key like 0) folds into
 * 0, 2 (key like 3) into 3; counts and values are count-weighted. */
START_TEST(merge_into_neighbours)
{
	rt_kv kv;
	rt_err err = { "" };
	ck_assert_int_eq(rt_kv_init(&kv, 1, 1, 1, 2, 8, 0, 0, &err), 0);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	const float k[4][2] = { { 1, 0 }, { 1, 0.1f }, { 0.1f, 1 }, { 0, 1 } };
	const float v[4][2] = { { 2, 0 }, { 4, 0 }, { 0, 6 }, { 0, 2 } };
	for (int i = 0; i < 4; i++)
		rt_kv_append(&kv, h, k[i], v[i], i);
	uint8_t flags[4] = { K_FLAG_KEEP, 0, 0, K_FLAG_KEEP };
	int32_t ord[4];
	int64_t tmp[4];
	k_merge_evicted(&kv, h, flags, 0, NULL, ord, tmp);
	ck_assert_float_eq(h->count[0], 2);
	ck_assert_float_eq(h->count[3], 2);
	ck_assert_float_eq_tol(h->v[0], 3, 1e-6);
	ck_assert_float_eq_tol(h->v[3 * 2 + 1], 4, 1e-6);
	ck_assert_float_eq_tol(h->log_count[0], logf(2), 1e-6);
	/* a run cap of 2 tokens: a third entry cannot join a prototype of 2 */
	rt_kv_reset(&kv);
	for (int i = 0; i < 4; i++)
		rt_kv_append(&kv, h, k[0], v[0], i);
	uint8_t f2[4] = { K_FLAG_KEEP, 0, 0, 0 };
	k_merge_evicted(&kv, h, f2, 2, NULL, ord, tmp);
	ck_assert_float_eq(h->count[0], 2);
	/* the same merge on a list out of position order (as rt_kv_head_evict leaves it):
	 * entries at positions 0, 3, 1, 2; neighbours are taken by position, so position 1
	 * folds into 0 and position 2 into 3 exactly as above */
	rt_kv_reset(&kv);
	const int order[4] = { 0, 3, 1, 2 };
	for (int i = 0; i < 4; i++)
		rt_kv_append(&kv, h, k[order[i]], v[order[i]], order[i]);
	uint8_t f3[4] = { K_FLAG_KEEP, K_FLAG_KEEP, 0, 0 };
	k_merge_evicted(&kv, h, f3, 0, NULL, ord, tmp);
	ck_assert_float_eq(h->count[0], 2);
	ck_assert_float_eq(h->count[1], 2);
	ck_assert_float_eq_tol(h->v[0], 3, 1e-6);
	ck_assert_float_eq_tol(h->v[1 * 2 + 1], 4, 1e-6);
	rt_kv_free(&kv);
}
END_TEST

/* score = -pos (older entries are worth more), for the pipeline test below */
static void score_neg_pos(const struct kvp_ctx *ctx, const rt_kv *kv, const rt_kv_head *h,
                          int layer, int r, float *out, float *tmp, double *vec)
{
	(void)ctx, (void)kv, (void)layer, (void)r, (void)tmp, (void)vec;
	for (int32_t i = 0; i < h->n; i++)
		out[i] = (float)-h->pos[i];
}

/* The whole pipeline with a merge action on one head of 8 entries (keys all along x):
 * sink 1 (position 0), recent 2 (6, 7), target 5 -> 2 free slots: positions 1, 2 win
 * (score -pos). Evicted 3, 4, 5 fold into the previous kept unguarded entry (2), up to
 * a run of 3 tokens: 3 and 4 join 2 (count 3), 5 cannot (2 is full, 6 is guarded) and
 * is dropped. Counts: 1 1 3 1 1. */
START_TEST(pipeline_merge)
{
	rt_kv kv;
	rt_err err = { "" };
	ck_assert_int_eq(rt_kv_init(&kv, 1, 1, 1, 2, 8, 0, 0, &err), 0);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	for (int i = 0; i < 8; i++) {
		const float k[2] = { 1, 0 }, v[2] = { (float)i, 0 };
		rt_kv_append(&kv, h, k, v, i);
	}
	struct kvp_ctx ctx;
	memset(&ctx, 0, sizeof ctx);
	ctx.seen = 8;
	ctx.prompt_len = -1;
	ctx.scratch_len = k_compress_scratch_bytes(&kv, 0, 1);
	ctx.scratch = malloc(ctx.scratch_len);
	struct k_compress_cfg cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.has_score = 1;
	cfg.reduce = -1;
	cfg.budget = cfg.target = 5;
	cfg.has_sinks = cfg.has_recent = 1;
	cfg.sinks = 1;
	cfg.recent = 2;
	cfg.action = K_ACT_MERGE;
	cfg.run = 3;
	ck_assert_int_eq(k_compress_run(&ctx, &kv, &cfg, score_neg_pos, &err), 0);
	const int32_t pos[5] = { 0, 1, 2, 6, 7 };
	const float cnt[5] = { 1, 1, 3, 1, 1 };
	ck_assert_int_eq(h->n, 5);
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(h->pos[i], pos[i]);
		ck_assert_float_eq(h->count[i], cnt[i]);
	}
	/* the prototype's value is the mean of 2, 3, 4 */
	ck_assert_float_eq_tol(h->v[2 * 2], 3.0f, 1e-6);
	/* too little scratch is an error, not a crash */
	ctx.scratch_len = 16;
	ck_assert_int_eq(k_compress_run(&ctx, &kv, &cfg, score_neg_pos, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "scratch"));
	free(ctx.scratch);
	rt_kv_free(&kv);
}
END_TEST

static Suite *kernels_suite(void)
{
	Suite *s = suite_create("kernels");
	TCase *tc = tcase_create("cpu");
	tcase_add_test(tc, select_ties_keep_lower_position);
	tcase_add_test(tc, select_nan_and_candidates);
	tcase_add_test(tc, sort_matches_rank_reference);
	tcase_add_test(tc, topk_matches_rank_reference);
	tcase_add_test(tc, select_large_matches_rank_reference);
	tcase_add_test(tc, pool_and_reduce);
	tcase_add_test(tc, caote_exact_is_the_output_change);
	tcase_add_test(tc, reduce_l2_and_output_state);
	tcase_add_test(tc, keydiff_anchor);
	tcase_add_test(tc, stat_rings);
	tcase_add_test(tc, layer_budgets);
	tcase_add_test(tc, adaptive_heads);
	tcase_add_test(tc, merge_into_neighbours);
	tcase_add_test(tc, pipeline_merge);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int nf = check_run(kernels_suite());
	return nf == 0 ? 0 : 1;
}
