/*
 * test_policies: drives the hooks of every compiled library policy (policies/NAME.kvp
 * emitted by kvpc and linked in through the registry) on a synthetic KV store and
 * synthetic attention traces, and compares the kept positions with hand-computed
 * references — including ties (equal scores keep the lower position) and the
 * grouped-query shapes 9/3, 4/1 and 4/4 (query heads / KV heads).
 *
 * The harness plays the runtime: per token it appends one entry to every (layer, KV
 * head), calls observe once per (layer, KV head) with the attention rows of the group
 * (weights from the test, normalised over the visible entries; uniform when all weights
 * are 0) and the attention outputs, then asks should_compress and runs compress. It also
 * checks next_trigger against should_compress at every step.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k_expattn.h"
#include "kv/rt_kv.h"
#include "policy/rt_policy.h"
#include "support/check_run.h"

/* ---- harness -------------------------------------------------------------------------- */

typedef double (*weight_fn)(int layer, int g, int r, int64_t step, int32_t pos, void *u);
typedef void (*entry_fn)(int layer, int g, int32_t pos, float *k, float *v, int d, void *u);
/* the pre-RoPE query row q[d] of query head r of KV head g at step t (KVP_NEED_QUERY) */
typedef void (*query_fn)(int layer, int g, int r, int64_t t, float *q, int d);

struct harness {
	const struct kvp_policy *p;
	rt_kv kv;
	struct rt_run run;      /* params, ctx and scratch (rt_policy.h) */
	float *probs, *outs, *kbuf, *vbuf;
	int L, G, R, d;
	int compresses;
	int32_t span_from, span_to; /* positions [from, to) carry span id 1 */
	weight_fn w;
	entry_fn e;
	query_fn q;
	float *qrows;           /* [R × d] the group's query rows of a step */
	void *u;
};

static const struct kvp_policy *policy(const char *name)
{
	const struct kvp_policy *p = rt_registry_find(kvp_registry, kvp_registry_count, name);
	ck_assert_msg(p != NULL, "policy %s is not in the registry", name);
	ck_assert_int_eq(p->abi_version, KVP_ABI_VERSION);
	return p;
}

static void default_entry(int layer, int g, int32_t pos, float *k, float *v, int d, void *u)
{
	(void)u;
	for (int j = 0; j < d; j++) {
		k[j] = (float)((pos * 7 + j * 3 + layer + g) % 11) - 5.0f;
		v[j] = (float)((pos * 5 + j + 2 * g) % 13) - 6.0f;
	}
}

static void h_open(struct harness *h, const char *name, int L, int G, int R, int d, int32_t cap,
                   int64_t prompt_len)
{
	memset(h, 0, sizeof *h);
	h->p = policy(name);
	h->L = L, h->G = G, h->R = R, h->d = d;
	rt_err err = { "" };
	ck_assert_msg(rt_run_init(&h->run, &h->kv, h->p, L, G, R, d, cap, prompt_len, &err) == 0,
	              "%s", err.msg);
	/* the papers' algorithms at a few tokens: without the library's `min` floors (their
	 * own case: floor_survives_ratio_and_set) */
	h->run.ctx.min_kv = KVP_MIN_KV_STRICT;
	ck_assert_uint_eq(h->kv.stat_bytes, kvp_policy_stat_bytes(h->p, R));
	h->probs = calloc((size_t)R * cap, sizeof(float));
	h->outs = calloc((size_t)R * d, sizeof(float));
	h->kbuf = calloc((size_t)d, sizeof(float));
	h->vbuf = calloc((size_t)d, sizeof(float));
	h->qrows = calloc((size_t)R * d, sizeof(float));
	h->e = default_entry;
}

static void h_close(struct harness *h)
{
	rt_run_free(&h->run);
	rt_kv_free(&h->kv);
	free(h->probs);
	free(h->outs);
	free(h->kbuf);
	free(h->vbuf);
	free(h->qrows);
}

static void h_set(struct harness *h, const char *assign)
{
	rt_err err = { "" };
	ck_assert_msg(rt_run_set(&h->run, assign, &err) == 0, "%s", err.msg);
}

static int32_t kv_room(const rt_kv *kv)
{
	int32_t room = kv->cap;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		if (kv->cap - kv->heads[i].n < room)
			room = kv->cap - kv->heads[i].n;
	return room;
}

/* Append token t to every head. */
static void h_append(struct harness *h, int64_t t)
{
	const struct kvp_ctx *ctx = &h->run.ctx;
	for (int l = 0; l < h->L; l++)
		for (int g = 0; g < h->G; g++) {
			rt_kv_head *hd = rt_kv_head_at(&h->kv, l, g);
			h->e(l, g, (int32_t)t, h->kbuf, h->vbuf, h->d, h->u);
			int32_t i = rt_kv_append(&h->kv, hd, h->kbuf, h->vbuf, (int32_t)t);
			if (t >= h->span_from && t < h->span_to)
				hd->span[i] = 1;
			if (h->p->init_entries)
				h->p->init_entries(ctx, &h->kv, l, g, i, 1);
		}
}

/* Observe the attention step of query token t (entries of later tokens of the same
 * chunk may already be in the store: the query sees positions <= t only). */
static void h_observe(struct harness *h, int64_t t)
{
	const struct kvp_ctx *ctx = &h->run.ctx;
	for (int l = 0; l < h->L; l++)
		for (int g = 0; g < h->G; g++) {
			rt_kv_head *hd = rt_kv_head_at(&h->kv, l, g);
			int32_t n = 0; /* visible: positions <= t (a prefix: entries are in order) */
			while (n < hd->n && hd->pos[n] <= t)
				n++;
			for (int r = 0; r < h->R; r++) {
				float *row = h->probs + (size_t)r * n;
				double s = 0;
				for (int32_t i = 0; i < n; i++) {
					double w = h->w ? h->w(l, g, r, t, hd->pos[i], h->u) : 1.0;
					row[i] = (float)w;
					s += w;
				}
				for (int32_t i = 0; i < n; i++)
					row[i] = s > 0 ? (float)(row[i] / s) : 1.0f / (float)n;
				for (int j = 0; j < h->d; j++) {
					double o = 0;
					for (int32_t i = 0; i < n; i++)
						o += row[i] * hd->v[(size_t)i * h->d + j];
					h->outs[(size_t)r * h->d + j] = (float)o;
				}
			}
			struct kvp_obs ob = { t, n, h->R, h->probs, h->outs };
			if (h->q && (h->p->needs & KVP_NEED_QUERY)) {
				for (int r = 0; r < h->R; r++)
					h->q(l, g, r, t, h->qrows + (size_t)r * h->d, h->d);
				ob.query = h->qrows;
			}
			if (h->p->observe)
				h->p->observe(ctx, &h->kv, l, g, &ob);
		}
}

/* Process k tokens as one chunk as the runtime does (append all, then attention for
 * each query), then let the policy run (rt_run_advance). */
static void h_chunk(struct harness *h, int32_t k)
{
	for (int32_t j = 0; j < k; j++)
		h_append(h, h->run.ctx.seen + j);
	for (int32_t j = 0; j < k; j++)
		h_observe(h, h->run.ctx.seen + j);
	rt_err err = { "" };
	int rc = rt_run_advance(&h->run, &h->kv, k, &err);
	ck_assert_msg(rc >= 0, "%s", err.msg);
	h->compresses += rc;
}

/* One token, checking next_trigger's promise against should_compress. */
static void h_step(struct harness *h)
{
	int32_t nt = h->p->next_trigger(&h->run.ctx, &h->kv);
	int32_t room = kv_room(&h->kv);
	h_append(h, h->run.ctx.seen);
	h_observe(h, h->run.ctx.seen);
	struct kvp_ctx after = h->run.ctx;
	after.seen++;
	int fire = h->p->should_compress(&after, &h->kv);
	if (nt > 1)
		ck_assert_msg(!fire, "%s: fired after 1 token though next_trigger was %d", h->p->name, nt);
	else if (nt == 1 && room > 1)
		ck_assert_msg(fire, "%s: next_trigger 1 but no compress", h->p->name);
	int before = h->compresses;
	rt_err err = { "" };
	int rc = rt_run_advance(&h->run, &h->kv, 1, &err);
	ck_assert_msg(rc >= 0, "%s", err.msg);
	h->compresses += rc;
	ck_assert_int_eq(h->compresses - before, fire && h->p->compress ? 1 : 0);
}

static void h_feed(struct harness *h, int n)
{
	for (int i = 0; i < n; i++)
		h_step(h);
}

static int cmp_pos(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* Assert head (l, g) holds exactly the positions want[0..n) (increasing), in any entry
 * order (a compaction moves tail entries into evicted slots, runtime/kv/rt_kv.h). */
static void expect_pos(struct harness *h, int l, int g, const int32_t *want, int n)
{
	rt_kv_head *hd = rt_kv_head_at(&h->kv, l, g);
	char got[512] = "", exp[512] = "";
	int32_t *sorted = malloc(sizeof(int32_t) * (size_t)(hd->n + 1));
	memcpy(sorted, hd->pos, sizeof(int32_t) * (size_t)hd->n);
	qsort(sorted, (size_t)hd->n, sizeof *sorted, cmp_pos);
	for (int i = 0; i < hd->n && strlen(got) < 480; i++)
		snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", sorted[i]);
	for (int i = 0; i < n && strlen(exp) < 480; i++)
		snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%d ", want[i]);
	int same = hd->n == n && memcmp(sorted, want, (size_t)n * sizeof(int32_t)) == 0;
	free(sorted);
	ck_assert_msg(same,
	              "%s %d/%d shape, layer %d head %d: kept [%s], expected [%s]", h->p->name,
	              h->G * h->R, h->G, l, g, got, exp);
}

static void expect_all(struct harness *h, const int32_t *want, int n)
{
	for (int l = 0; l < h->L; l++)
		for (int g = 0; g < h->G; g++)
			expect_pos(h, l, g, want, n);
}

/* The three grouped-query shapes: (KV heads, group) for 9/3, 4/1 and 4/4. */
static const int shapes[3][2] = { { 3, 3 }, { 1, 4 }, { 4, 1 } };

/* ---- attention traces ------------------------------------------------------------ */

/* every query puts all its weight on positions 2 and 5 (uniform before they exist) */
static double w_heavy_2_5(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)g, (void)r, (void)t, (void)u;
	return pos == 2 || pos == 5 ? 1.0 : 0.0;
}

/* KV head g's queries attend only position g + 1 */
static double w_head_pos(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)r, (void)t, (void)u;
	return pos == g + 1 ? 1.0 : 0.0;
}

/* ---- tests ------------------------------------------------------------------------ */

START_TEST(full_keeps_everything)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "full", 2, shapes[s][0], shapes[s][1], 8, 16, -1);
		h_feed(&h, 12);
		int32_t want[12];
		for (int i = 0; i < 12; i++)
			want[i] = i;
		expect_all(&h, want, 12);
		ck_assert_int_eq(h.compresses, 0);
		/* never runs: next_trigger is the room left */
		ck_assert_int_eq(h.p->next_trigger(&h.run.ctx, &h.kv), 4);
		h_close(&h);
	}
}
END_TEST

START_TEST(window_keeps_last)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "sliding_window", 2, shapes[s][0], shapes[s][1], 8, 16, -1);
		h_set(&h, "window=4");
		h_feed(&h, 10);
		const int32_t want[] = { 6, 7, 8, 9 };
		expect_all(&h, want, 4);
		h_close(&h);
	}
}
END_TEST

START_TEST(streaming_llm_sinks_and_recent)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "streaming_llm", 2, shapes[s][0], shapes[s][1], 8, 16, -1);
		h_set(&h, "sinks=2");
		h_set(&h, "recent=3");
		h_feed(&h, 10);
		const int32_t want[] = { 0, 1, 7, 8, 9 };
		expect_all(&h, want, 5);
		ck_assert_int_eq(h.p->positions, KVP_POS_COMPACTED);
		h_close(&h);
	}
}
END_TEST

/* H2O, every step; heavy 25% + recent 12.5% of a prompt of 8 tokens = budget 3 with
 * a recent window of 1. Attention on positions 2 and 5 (uniform before they exist):
 * per query head acc = {0: 1.5, 1: 0.5, 2: 2} at step 3, so {0,2,3}; then {0,2,4};
 * at step 5 positions 2 and 5 share: {0: 1.5, 2: 3.5, 4: 0} -> {0,2,5}; at step 6
 * {0: 1.5, 2: 4, 5: 1} -> {0,2,6}. */
START_TEST(h2o_heavy_hitters)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "h2o", 1, shapes[s][0], shapes[s][1], 4, 8, 8);
		h_set(&h, "heavy=0.25");
		h_set(&h, "recent=0.125");
		h.w = w_heavy_2_5;
		h_feed(&h, 4);
		const int32_t a[] = { 0, 2, 3 };
		expect_all(&h, a, 3);
		h_feed(&h, 2);
		const int32_t b[] = { 0, 2, 5 };
		expect_all(&h, b, 3);
		h_feed(&h, 1);
		const int32_t c[] = { 0, 2, 6 };
		expect_all(&h, c, 3);
		ck_assert_int_eq(h.compresses, 4);
		h_close(&h);
	}
}
END_TEST

/* TOVA with uniform attention: every entry ties, so the lowest positions stay. */
START_TEST(tova_ties_keep_lower)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "tova", 2, shapes[s][0], shapes[s][1], 4, 8, -1);
		h_set(&h, "states=3");
		h_feed(&h, 6);
		const int32_t want[] = { 0, 1, 2 };
		expect_all(&h, want, 3);
		h_close(&h);
	}
}
END_TEST

/* TOVA's layer-wide mean (9/3): KV head g attends position g+1 only; the mean over the
 * layer's 9 query heads gives positions 1, 2, 3 a third each, so every KV head keeps
 * {1,2,3} (a per-head choice would keep {0,1,2} for head 0). */
START_TEST(tova_layer_mean_gqa)
{
	struct harness h;
	h_open(&h, "tova", 1, 3, 3, 4, 8, -1);
	h_set(&h, "states=3");
	h.w = w_head_pos;
	h_feed(&h, 6);
	const int32_t want[] = { 1, 2, 3 };
	expect_all(&h, want, 3);
	h_close(&h);
}
END_TEST

/* SnapKV: prompt of 12, window 3 (queries 9..11 observe; 9..11 kept), budget 5, max
 * pooling k=7 over the 9 prefix entries. Window queries put 2/3 on position 2 and 1/3
 * on 6: obs = {2: 2, 6: 1}; pooled = 2 for 0..5 (they see 2), 1 for 6..8; two free
 * slots, ties keep the lower positions -> {0, 1}. Decode appends without eviction. */
static double w_snap(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)g, (void)r, (void)u;
	if (t < 9)
		return pos == 8 ? 1.0 : 0.0; /* before the window: ignored by the statistic */
	return pos == 2 ? 2.0 : pos == 6 ? 1.0 : 0.0;
}

START_TEST(snapkv_window_pooling)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "snapkv", 2, shapes[s][0], shapes[s][1], 4, 16, 12);
		h_set(&h, "capacity=5");
		h_set(&h, "window=3");
		h.w = w_snap;
		h_feed(&h, 11);
		ck_assert_int_eq(h.compresses, 0);
		h_feed(&h, 1);
		ck_assert_int_eq(h.compresses, 1);
		const int32_t a[] = { 0, 1, 9, 10, 11 };
		expect_all(&h, a, 5);
		h_feed(&h, 2);
		const int32_t b[] = { 0, 1, 9, 10, 11, 12, 13 };
		expect_all(&h, b, 7);
		h_close(&h);
	}
}
END_TEST

/* Scissorhands' window roll-off. 700 steps, no eviction until the end. Position 0 gets
 * no attention during steps 1..299, position 1 none during 400..599 and half weight
 * during 300..399 and from 600; every other entry gets more than 1/seen (never "low"; exactly uniform rows
 * are avoided, since float 1/n may round below the double threshold). At step 699 the
 * last-400-step counts are 0 for position 0 (its lows rolled off) and 400 for
 * position 1, 0 for the rest; with 2 free
 * slots + recent 1 the kept set is {0, 2, 699} (0 and 2 tie at 0 and beat 3..698 by
 * position). A whole-history count would have evicted 0 (299 lows). */
static double w_sciss(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)g, (void)r, (void)u;
	if (pos == 0)
		return t >= 300 ? 1.0 : 0.0;
	if (pos == 1)
		return t < 300 ? 1.0 : t >= 400 && t < 600 ? 0.0 : 0.5;
	return 1.0;
}

START_TEST(scissorhands_window_rolloff)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "scissorhands", 1, shapes[s][0], shapes[s][1], 4, 704, -1);
		h_set(&h, "capacity=100000%"); /* never binds */
		h_set(&h, "recent=1");
		h.w = w_sciss;
		h_feed(&h, 700);
		ck_assert_int_eq(h.compresses, 0);
		/* budget = capacity × 700 tokens = 6, target half of it = 3 */
		char a[64];
		snprintf(a, sizeof a, "capacity=%.17g", 6.0 / 700.0);
		h_set(&h, a);
		ck_assert(h.p->should_compress(&h.run.ctx, &h.kv));
		rt_err err = { "" };
		ck_assert_int_eq(h.p->compress(&h.run.ctx, &h.kv, &err), 0);
		const int32_t want[] = { 0, 2, 699 };
		expect_all(&h, want, 3);
		h_close(&h);
	}
}
END_TEST

/* The same trace under the whole-history variant: the counts at step 699 are 299 for
 * position 0 (steps 1..299, its lows never roll off), 400 for position 1 (steps
 * 300..699) and 0 for the rest, so 2 free slots + recent 1 keep {2, 3, 699}. */
START_TEST(scissorhands_whole_history)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "scissorhands_whole", 1, shapes[s][0], shapes[s][1], 4, 704, -1);
		h_set(&h, "capacity=100000%"); /* never binds */
		h_set(&h, "recent=1");
		h.w = w_sciss;
		h_feed(&h, 700);
		ck_assert_int_eq(h.compresses, 0);
		char a[64];
		snprintf(a, sizeof a, "capacity=%.17g", 6.0 / 700.0);
		h_set(&h, a);
		rt_err err = { "" };
		ck_assert_int_eq(h.p->compress(&h.run.ctx, &h.kv, &err), 0);
		const int32_t want[] = { 2, 3, 699 };
		expect_all(&h, want, 3);
		h_close(&h);
	}
}
END_TEST

/* Per-step single eviction (left = 1, cold-compress's reading): prompt of 40, budget
 * 25% = 10 entries, recent 2. From token 11 on every step evicts exactly one entry, so
 * each head holds 10 after every step and compress ran 30 times by token 40. The
 * attention sits on positions 2 and 5 (the rest is below uniform at every step), so
 * they survive; the others go oldest first (most low steps). Kept at the end: 2, 5 and
 * the newest 8 - the recent 38, 39 among them. */
START_TEST(scissorhands_single_eviction)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "scissorhands", 1, shapes[s][0], shapes[s][1], 4, 48, 40);
		h_set(&h, "capacity=0.25");
		h_set(&h, "recent=2");
		h_set(&h, "left=1");
		h.w = w_heavy_2_5;
		for (int t = 1; t <= 40; t++) {
			h_step(&h);
			for (int g = 0; g < h.G; g++)
				ck_assert_int_eq(rt_kv_head_at(&h.kv, 0, g)->n, t <= 10 ? t : 10);
		}
		ck_assert_int_eq(h.compresses, 30);
		const int32_t want[] = { 2, 5, 32, 33, 34, 35, 36, 37, 38, 39 };
		expect_all(&h, want, 10);
		h_close(&h);
	}
}
END_TEST

/* The funnel: 4 layers, prompt 48, budget 50% = 24, batch target 12 on average, layer
 * multipliers 0.5, 5/6, 7/6, 1.5 -> 6, 10, 14, 18 entries per head after the first
 * compression (token 25); uniform attention ties everything, so each keeps its lowest
 * positions plus the recent 24. */
START_TEST(scissorhands_funnel_layers)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "scissorhands", 4, shapes[s][0], shapes[s][1], 4, 64, 48);
		h_set(&h, "capacity=0.5");
		h_set(&h, "recent=1");
		h_feed(&h, 25);
		ck_assert_int_eq(h.compresses, 1);
		const int keep[4] = { 6, 10, 14, 18 };
		for (int l = 0; l < 4; l++) {
			int32_t want[20];
			for (int i = 0; i < keep[l] - 1; i++)
				want[i] = i;
			want[keep[l] - 1] = 24;
			for (int g = 0; g < h.G; g++)
				expect_pos(&h, l, g, want, keep[l]);
		}
		h_close(&h);
	}
}
END_TEST

/* Uniform attention is never "below uniform": with every row exactly 1/n no entry
 * collects a low count (the comparison is made at float precision), so all scores tie
 * and the compress keeps the lowest positions plus the recent one. */
START_TEST(scissorhands_uniform_is_not_low)
{
	struct harness h;
	h_open(&h, "scissorhands", 1, 3, 3, 4, 400, -1);
	h_set(&h, "capacity=100000%"); /* never binds */
	h_set(&h, "recent=1");
	h_feed(&h, 390);
	for (int g = 0; g < 3; g++) {
		rt_kv_head *hd = rt_kv_head_at(&h.kv, 0, g);
		for (size_t b = 0; b < (size_t)hd->n * h.kv.stat_bytes; b++)
			ck_assert_int_eq(hd->stats[b], 0);
	}
	char a[64];
	snprintf(a, sizeof a, "capacity=%.17g", 6.0 / 390.0);
	h_set(&h, a);
	rt_err err = { "" };
	ck_assert_int_eq(h.p->compress(&h.run.ctx, &h.kv, &err), 0);
	const int32_t want[] = { 0, 1, 389 };
	expect_all(&h, want, 3);
	h_close(&h);
}
END_TEST

/* KnormPress: the lowest key norms stay. Key norms by position: 2 1 1 3 5 4 (first
 * coordinate, the rest 0); budget 2 -> {1, 2}; budget 1 -> {1} (tie with 2, lower). */
static void e_knorm(int layer, int g, int32_t pos, float *k, float *v, int d, void *u)
{
	(void)layer, (void)g, (void)u;
	static const float norms[] = { 2, 1, 1, 3, 5, 4 };
	for (int j = 0; j < d; j++)
		k[j] = v[j] = 0;
	k[0] = pos < 6 ? -norms[pos] : 9; /* sign must not matter */
	v[0] = 1;
}

START_TEST(knorm_lowest_norms)
{
	for (int s = 0; s < 3; s++) {
		for (int budget = 1; budget <= 2; budget++) {
			struct harness h;
			h_open(&h, "knorm", 2, shapes[s][0], shapes[s][1], 4, 8, 6);
			char a[64];
			snprintf(a, sizeof a, "kept=%.17g", budget / 6.0); /* of a 6-token prompt */
			h_set(&h, a);
			h.e = e_knorm;
			h_feed(&h, 6);
			const int32_t want[] = { 1, 2 };
			expect_all(&h, want, budget);
			h_close(&h);
		}
	}
}
END_TEST

/* KeyDiff: keys (1,0) (1,0) (0,1) (1,0); anchor = mean of unit keys = (3/4, 1/4);
 * cos = 0.949 for (1,0), 0.316 for (0,1); the least similar (position 2) first, then
 * the tie among 0, 1, 3 keeps 0. Budget 2, prompt of 4 -> {0, 2}. */
static void e_keydiff(int layer, int g, int32_t pos, float *k, float *v, int d, void *u)
{
	(void)layer, (void)g, (void)u;
	for (int j = 0; j < d; j++)
		k[j] = v[j] = 0;
	if (pos == 2)
		k[1] = 3;
	else
		k[0] = (float)(1 + pos); /* lengths differ: only directions matter */
	v[0] = 1;
}

START_TEST(keydiff_least_similar)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "keydiff", 1, shapes[s][0], shapes[s][1], 4, 8, 4);
		h_set(&h, "capacity=2");
		h.e = e_keydiff;
		h_feed(&h, 4);
		const int32_t want[] = { 0, 2 };
		expect_all(&h, want, 2);
		h_close(&h);
	}
}
END_TEST

/* keydiff_rot_q4q2: KeyDiff's score ranks the q4 / k4v2 split. head_dim 32, every key in the
 * (e0, e1) plane: the three guards (sinks=1: position 0; recent=2: 30, 31) at angle -1.5 rad,
 * candidate p (1..29) at 0.05 · ((11 p) mod 29) rad, lengths 1 + p mod 3 (only directions
 * count). The oracle, computed here in double: the anchor a = mean of the 32 unit keys (the
 * head's every entry, guards included: language.md's key_cos_mean), each candidate's cos to
 * a, ranked by -cos (the least anchor-like first); when compress fires at the 32nd token the
 * first round(0.6 · 29) = 17 ranks go to q4, the other 12 to k4v2 (q2), the guards stay at
 * the top tier and nothing is evicted. */
static void e_kd_tiers(int layer, int g, int32_t pos, float *k, float *v, int d, void *u)
{
	(void)layer, (void)g, (void)u;
	const double th = pos == 0 || pos >= 30 ? -1.5 : 0.05 * ((11 * pos) % 29);
	const double len = 1 + pos % 3;
	for (int j = 0; j < d; j++) {
		k[j] = 0;
		v[j] = (float)((pos * 5 + j) % 7) - 3.0f;
	}
	k[0] = (float)(len * cos(th));
	k[1] = (float)(len * sin(th));
}

START_TEST(keydiff_ranks_the_tier_split)
{
	enum { N = 32, D = 32 };
	double ax = 0, ay = 0, c[N];
	float k[D], v[D];
	for (int p = 0; p < N; p++) {
		e_kd_tiers(0, 0, p, k, v, D, NULL);
		const double nk = sqrt((double)k[0] * k[0] + (double)k[1] * k[1]);
		ax += k[0] / nk / N, ay += k[1] / nk / N;
	}
	int rank[N] = { 0 };
	for (int p = 0; p < N; p++) {
		e_kd_tiers(0, 0, p, k, v, D, NULL);
		c[p] = (k[0] * ax + k[1] * ay) / sqrt(((double)k[0] * k[0] + (double)k[1] * k[1]) *
		                                      (ax * ax + ay * ay));
	}
	for (int p = 1; p < 30; p++)
		for (int q = 1; q < 30; q++) {
			ck_assert_msg(p == q || fabs(c[p] - c[q]) > 1e-4, "no near ties: %d %d", p, q);
			rank[p] += c[q] < c[p]; /* lower cos = more distinctive = earlier rank */
		}
	static const int gqa[3][2] = { { 3, 3 }, { 1, 4 }, { 1, 8 } }; /* 9/3, 4/1, 8/1 */
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "keydiff_rot_q4q2", 1, gqa[s][0], gqa[s][1], D, 64, N);
		h_set(&h, "sinks=1");
		h_set(&h, "recent=2");
		h.e = e_kd_tiers;
		rt_err err = { "" };
		for (int t = 0; t < N; t++) {
			h_append(&h, t);
			ck_assert_msg(rt_run_advance(&h.run, &h.kv, 1, &err) == (t == N - 1), "token %d: %s",
			              t, err.msg);
		}
		for (int g = 0; g < h.G; g++) {
			rt_kv_head *hd = rt_kv_head_at(&h.kv, 0, g);
			ck_assert_int_eq(hd->n, N);
			for (int32_t i = 0; i < hd->n; i++) {
				const int p = hd->pos[i];
				const int want = p == 0 || p >= 30 ? RT_KV_TIER_TOP
				                 : rank[p] < 17   ? RT_KV_TIER_Q4
				                                  : RT_KV_TIER_Q2;
				ck_assert_msg(rt_kv_tier_of(hd, i) == want, "shape %d/%d head %d position %d "
				              "(rank %d): tier %s, expected %s", h.G * h.R, h.G, g, p, rank[p],
				              rt_kv_tier_name(rt_kv_tier_of(hd, i)), rt_kv_tier_name(want));
			}
		}
		h_close(&h);
	}
}
END_TEST

/* CAOTE over H2O, blocks of 3, heavy 2, recent 0: one eviction among three entries
 * after the first block. Steps 0 and 1 attend uniformly, step 2 with weights 1:1:5, so
 * acc = (1 + 1/2 + 1/7, 1/2 + 1/7, 5/7) = (23/14, 9/14, 10/14) and alpha = acc / 3 =
 * (23/42, 9/42, 10/42). Values (first coordinate) 6, 2, 8; the TRUE output of step 2
 * is o = (6 + 2 + 5·8) / 7 = 48/7, so
 *   c = alpha/(1 - alpha)·|o - v| = (23/19·6/7, 9/33·34/7, 10/32·8/7)
 *     = (1.0376, 1.3247, 0.3571): entry 2 goes, kept {0, 1}.
 * The three readings disagree: plain H2O evicts the least accumulated (1) -> {0, 2};
 * the score-weighted mean o_w = 236/42 = 5.619 would give (0.461, 0.987, 0.744) and
 * evict 0 -> {1, 2}; FastCAOTE (mean value 16/3) gives (0.807, 0.909, 0.833) and evicts
 * 0 -> {1, 2}. */
static double w_caote(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)g, (void)r, (void)u;
	if (t < 2)
		return 1.0;
	return pos == 2 ? 5.0 : 1.0;
}

static void e_caote(int layer, int g, int32_t pos, float *k, float *v, int d, void *u)
{
	(void)layer, (void)g, (void)u;
	for (int j = 0; j < d; j++)
		k[j] = v[j] = 0;
	k[0] = 1;
	v[0] = pos == 0 ? 6.0f : pos == 1 ? 2.0f : pos == 2 ? 8.0f : 1.0f;
}

START_TEST(caote_true_output)
{
	for (int s = 0; s < 3; s++) {
		for (int fast = 0; fast < 2; fast++) {
			struct harness h;
			h_open(&h, fast ? "caote_fast_h2o" : "caote_h2o", 1, shapes[s][0], shapes[s][1],
			       4, 8, -1);
			h_set(&h, "heavy=2");
			h_set(&h, "recent=0");
			h_set(&h, "block=3");
			h.w = w_caote;
			h.e = e_caote;
			h_feed(&h, 2);
			ck_assert_int_eq(h.compresses, 0);
			h_feed(&h, 1);
			ck_assert_int_eq(h.compresses, 1);
			const int32_t exact[] = { 0, 1 }, mean[] = { 1, 2 };
			expect_all(&h, fast ? mean : exact, 2);
			h_close(&h);
		}
	}
}
END_TEST

/* CAOTE's GQA rule: the group score is the root sum of the per-query-head squared
 * errors (group = l2). Same entries and values as caote_true_output; at step 2 query
 * head r attends with its own weights, so each has its own alpha and true output:
 *   r0 (2:1:3): alpha (11/18, 4/18, 3/18), o = 38/6: c = (0.5238, 1.2381, 0.3333)
 *   r1 (1:1:3): alpha (17/30, 7/30, 6/30), o = 6.4:  c = (0.5231, 1.3391, 0.4000)
 *   r2 (1:1:2): alpha (7/12, 3/12, 2/12), o = 6:     c = (0,      1.3333, 0.4000)
 *   r3 (5:2:5): alpha (23/36, 8/36, 5/36), o = 74/12: c = (0.2949, 1.1905, 0.2957)
 * 9/3 (r0..r2 per KV head): l2 = (0.7403, 2.2592, 0.6566) evicts 2 -> {0, 1}; the sum
 * (1.0469, 3.9106, 1.1333) or mean would evict 0 -> {1, 2}.
 * 4/1 (r0..r3): l2 = (0.7969, 2.5537, 0.7201) evicts 2 -> {0, 1}; the sum
 * (1.3418, 5.1010, 1.4290) would evict 0. */
static double w_caote_gqa(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)g, (void)u;
	static const double w[4][3] = { { 2, 1, 3 }, { 1, 1, 3 }, { 1, 1, 2 }, { 5, 2, 5 } };
	if (t < 2)
		return 1.0;
	return pos < 3 ? w[r][pos] : 0.0;
}

/* Expected Attention (arXiv 2510.00636) against an independent numpy computation: 12
 * tokens, d = 4, RoPE over both pairs (base 10000, n_rot 4), skip = sinks = 1, future 3
 * positions, one compress after the block of 12 down to 50% (6 entries per head: the
 * sink and the 5 best). Keys, values and pre-RoPE queries are the formulas of e_ea and
 * q_ea. The reference (numpy 2.4; mean and biased covariance of the queries at t = 1..11,
 * Rbar the mean of the RoPE blocks at p = 12..14, z = K·Rbar·mu/2 + K·Rbar·S·Rbarᵀ·K/8,
 * softmax over positions 1..11, mean over the group, times ||v||):
 *
 *   import numpy as np
 *   d, T, skip, F, base, nrot = 4, 12, 1, 3, 10000.0, 4
 *   f32 = lambda a: np.array(a, np.float32).astype(np.float64)
 *   k = lambda g, p: f32([1.5*np.sin(1.3*p + 0.7*j + 0.5*g) for j in range(d)])
 *   v = lambda g, p: f32([1.0 + 0.5*np.cos(0.9*p + 1.1*j + 0.3*g) for j in range(d)])
 *   q = lambda g, r, t: f32([np.sin(0.37*t*(r+1) + 1.7*j + g) + 0.25*j for j in range(d)])
 *   Rb = np.zeros((d, d))
 *   for i in range(nrot // 2):
 *       th = base ** (-2.0*i/nrot); ps = np.arange(T, T + F)
 *       c, s = np.cos(ps*th).mean(), np.sin(ps*th).mean()
 *       Rb[2*i:2*i+2, 2*i:2*i+2] = [[c, -s], [s, c]]
 *   def scores(g, R):
 *       K = np.stack([k(g, p) for p in range(T)]); V = np.stack([v(g, p) for p in range(T)])
 *       P = []
 *       for r in range(R):
 *           Q = np.stack([q(g, r, t) for t in range(skip, T)])
 *           mu, S = Rb @ Q.mean(0), Rb @ np.cov(Q.T, bias=True) @ Rb.T
 *           z = K[skip:] @ mu / np.sqrt(d) + np.einsum('ij,jk,ik->i', K[skip:], S, K[skip:]) / (2*d)
 *           e = np.exp(z - z.max()); P.append(e / e.sum())
 *       return np.array(P), np.mean(P, 0) * np.linalg.norm(V[skip:], axis=1)
 *   for G, R in ((3, 3), (1, 4)):
 *       for g in range(G):
 *           print(G, R, g, sorted([0] + [int(i) + skip for i in np.argsort(-scores(g, R)[1])[:5]]))
 *   print(scores(0, 4)[0][1])
 *
 * prints 9/3: {0,4,5,6,9,10}, {0,4,5,8,9,10}, {0,3,4,5,8,9}; 4/1: {0,4,5,6,9,10}; the
 * softmax of query head 1 of 4/1 below (without the covariance term KV head 1 of 9/3
 * would keep {0,3,4,5,9,10}; without the RoPE average that softmax starts 0.1002). */
static void e_ea(int l, int g, int32_t pos, float *k, float *v, int d, void *u)
{
	(void)l, (void)u;
	for (int j = 0; j < d; j++) {
		k[j] = (float)(1.5 * sin(1.3 * pos + 0.7 * j + 0.5 * g));
		v[j] = (float)(1.0 + 0.5 * cos(0.9 * pos + 1.1 * j + 0.3 * g));
	}
}

static void q_ea(int l, int g, int r, int64_t t, float *q, int d)
{
	(void)l;
	for (int j = 0; j < d; j++)
		q[j] = (float)(sin(0.37 * (double)t * (r + 1) + 1.7 * j + g) + 0.25 * j);
}

static const double ea_softmax_4_1_r1[11] = {
	0.08343936, 0.0421848836, 0.044603893, 0.138138609, 0.160263732, 0.0732307028,
	0.039159131, 0.0518463302, 0.159197274, 0.143285096, 0.0646509886,
};

START_TEST(expected_attention_numpy)
{
	const int shp[2][2] = { { 3, 3 }, { 1, 4 } };
	const int32_t want[4][6] = { { 0, 4, 5, 6, 9, 10 }, { 0, 4, 5, 8, 9, 10 },
		                     { 0, 3, 4, 5, 8, 9 }, { 0, 4, 5, 6, 9, 10 } };
	for (int s = 0, w = 0; s < 2; s++) {
		struct harness h;
		h_open(&h, "expected_attention", 1, shp[s][0], shp[s][1], 4, 16, -1);
		ck_assert(h.p->needs & KVP_NEED_QUERY);
		h_set(&h, "sinks=1");
		h_set(&h, "future=3");
		h_set(&h, "block=12");
		h.run.ctx.rope_base = 10000.0f;
		h.run.ctx.n_rot = 4;
		h.e = e_ea;
		h.q = q_ea;
		h_feed(&h, 11);
		if (s == 1) { /* the kernel's softmax before the compress (the state after t = 1..10
		               * plus step 11's query, as the policy's observe will add it) */
			const rt_kv_head *hd = rt_kv_head_at(&h.kv, 0, 0);
			float st[16 + 16 * 4 + 16 * 16];
			memcpy(st, hd->state, sizeof st);
			float qr[16];
			for (int r = 0; r < 4; r++)
				q_ea(0, 0, r, 11, qr + 4 * r, 4);
			k_ea_observe(st, qr, 4, 4);
			float kk[12 * 4], vv[4], sc[12];
			int32_t pos[12];
			for (int32_t p = 0; p < 12; p++) {
				e_ea(0, 0, p, kk + 4 * p, vv, 4, NULL);
				pos[p] = p;
			}
			double vec[8];
			k_ea_score(sc, kk, pos, 12, 4, st, 1, 12, 3, 1, 10000.0f, NULL, 4, vec);
			ck_assert(sc[0] == 0.0f);
			for (int i = 0; i < 11; i++)
				ck_assert_msg(fabs(sc[i + 1] - ea_softmax_4_1_r1[i]) < 2e-6,
				              "softmax[%d] %.9g, numpy %.9g", i + 1, sc[i + 1], ea_softmax_4_1_r1[i]);
		}
		h_feed(&h, 1);
		ck_assert_int_eq(h.compresses, 1);
		for (int g = 0; g < shp[s][0]; g++, w++)
			expect_pos(&h, 0, g, want[w], 6);
		h_close(&h);
	}
}
END_TEST

START_TEST(caote_gqa_l2)
{
	const int shp[2][2] = { { 3, 3 }, { 1, 4 } };
	for (int s = 0; s < 2; s++) {
		struct harness h;
		h_open(&h, "caote_h2o", 1, shp[s][0], shp[s][1], 4, 8, -1);
		h_set(&h, "heavy=2");
		h_set(&h, "recent=0");
		h_set(&h, "block=3");
		h.w = w_caote_gqa;
		h.e = e_caote;
		h_feed(&h, 3);
		ck_assert_int_eq(h.compresses, 1);
		const int32_t want[] = { 0, 1 };
		expect_all(&h, want, 2);
		h_close(&h);
	}
}
END_TEST

/* CAOTE over TOVA (blocks of 3, 2 states): the base is step 2's attention itself,
 * alpha = (1/7, 1/7, 5/7), o = 48/7, c = (1/6·6/7, 1/6·34/7, 5/2·8/7) =
 * (0.143, 0.810, 2.857): entry 0 goes, kept {1, 2} (plain TOVA drops the tie 0/1 at
 * the higher position: {0, 2}). CAOTE over SnapKV (prompt 4, window 1, capacity 3,
 * window kept): query 3 attends 1:1:5:0, the same alpha and o on 0..2 -> {1, 2, 3}. */
static double w_caote_last(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)g, (void)r, (void)u;
	if (t < 2)
		return 1.0;
	return pos == 2 ? 5.0 : pos < 2 ? 1.0 : 0.0;
}

START_TEST(caote_tova_snapkv)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "caote_tova", 1, shapes[s][0], shapes[s][1], 4, 8, -1);
		h_set(&h, "states=2");
		h_set(&h, "block=3");
		h.w = w_caote_last;
		h.e = e_caote;
		h_feed(&h, 3);
		const int32_t a[] = { 1, 2 };
		expect_all(&h, a, 2);
		h_close(&h);
		struct harness k;
		h_open(&k, "caote_snapkv", 1, shapes[s][0], shapes[s][1], 4, 8, 4);
		h_set(&k, "capacity=3");
		h_set(&k, "window=1");
		k.w = w_caote_last;
		k.e = e_caote;
		h_feed(&k, 4);
		ck_assert_int_eq(k.compresses, 1);
		const int32_t b[] = { 1, 2, 3 };
		expect_all(&k, b, 3);
		h_close(&k);
	}
}
END_TEST

/* A group larger than the 16 output rows the state holds is refused with an error at
 * the first compress, not read out of bounds. */
START_TEST(caote_group_too_large)
{
	struct harness h;
	h_open(&h, "caote_h2o", 1, 1, 17, 4, 8, -1);
	h_set(&h, "heavy=2");
	h_set(&h, "recent=0");
	h_set(&h, "block=3");
	for (int t = 0; t < 3; t++) {
		h_append(&h, t);
		h_observe(&h, t);
	}
	rt_err err = { "" };
	ck_assert_int_eq(rt_run_advance(&h.run, &h.kv, 3, &err), -1);
	ck_assert_msg(strstr(err.msg, "policy caote_h2o: the exact CAOTE keeps the attention output of at most 16 query heads per KV head; this model has 17") != NULL,
	              "%s", err.msg);
	h_close(&h);
}
END_TEST

/* The exact forms ask the runtime for the attention outputs and keep them per query
 * head in the head's state; the fast form needs neither. */
START_TEST(caote_needs_outputs)
{
	const char *exact[] = { "caote_h2o", "caote_tova", "caote_snapkv" };
	for (int i = 0; i < 3; i++) {
		const struct kvp_policy *p = policy(exact[i]);
		ck_assert_uint_eq(p->needs & KVP_NEED_OUT, KVP_NEED_OUT);
		ck_assert_uint_eq(p->needs & KVP_NEED_ATTN, KVP_NEED_ATTN);
		ck_assert_ptr_nonnull(p->observe);
		ck_assert_uint_ge(kvp_policy_state_bytes(p, 64), (size_t)16 * 64 * sizeof(float));
	}
	const struct kvp_policy *f = policy("caote_fast_h2o");
	ck_assert_uint_eq(f->needs & KVP_NEED_OUT, 0);
	ck_assert_uint_eq(kvp_policy_state_bytes(f, 64), 0);
	ck_assert_uint_eq(policy("h2o")->needs & KVP_NEED_OUT, 0);
}
END_TEST

/* Ada-KV over SnapKV, 9/3, one layer: prompt of 26, window 2 (24, 25 kept), capacity 4
 * per head = 2 free each, 6 over the layer; floor 0.5. Window queries: KV head 0's
 * attend 3 (3/4) and 15 (1/4); head 1's query heads 0 and 1 attend 10, query head 2
 * attends 20; head 2's attend uniformly. Group mean then max pooling (k = 7):
 * head 0: 1.5 on 0..6, 0.5 on 12..18; head 1: 4/3 on 7..13, 2/3 on 17..23; head 2:
 * flat. The layer's top 6 are all head 0's (1.5 > 4/3): n = (6, 0, 0), so
 * b = round(0.5·2 + 0.5·n) = (4, 1, 1): head 0 keeps 0..3, head 1 keeps 7 (ties keep
 * the lowest), head 2 keeps 0 (flat: lowest). With a max group reduction head 1 would
 * have won. */
static double w_ada(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)u;
	if (t < 24)
		return pos == 0 ? 1.0 : 0.0;
	if (g == 0)
		return pos == 3 ? 3.0 : pos == 15 ? 1.0 : 0.0;
	if (g == 1)
		return pos == (r < 2 ? 10 : 20) ? 1.0 : 0.0;
	return 1.0;
}

START_TEST(adakv_adaptive_heads_gqa)
{
	struct harness h;
	h_open(&h, "adakv_snapkv", 1, 3, 3, 4, 32, 26);
	h_set(&h, "capacity=4");
	h_set(&h, "window=2");
	h_set(&h, "floor=0.5");
	h.w = w_ada;
	h_feed(&h, 26);
	ck_assert_int_eq(h.compresses, 1);
	const int32_t a[] = { 0, 1, 2, 3, 24, 25 }, b[] = { 7, 24, 25 }, c[] = { 0, 24, 25 };
	expect_pos(&h, 0, 0, a, 6);
	expect_pos(&h, 0, 1, b, 3);
	expect_pos(&h, 0, 2, c, 3);
	h_close(&h);
}
END_TEST

/* PyramidKV, 4 layers, prompt 60, window 2, capacity 12, beta 20 (KVCache-Factory):
 * min = 10 // 20 = 0, max = 20, step = 20 // 3 = 6: layers keep 20, 14, 8, 2 prefix
 * entries + the window. Uniform attention makes every score equal, so each layer keeps
 * its lowest positions. */
START_TEST(pyramidkv_layer_budgets)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "pyramidkv", 4, shapes[s][0], shapes[s][1], 4, 64, 60);
		h_set(&h, "capacity=12");
		h_set(&h, "window=2");
		h_set(&h, "beta=20");
		h_feed(&h, 60);
		const int keep[4] = { 20, 14, 8, 2 };
		for (int l = 0; l < 4; l++) {
			int32_t want[24];
			for (int i = 0; i < keep[l]; i++)
				want[i] = i;
			want[keep[l]] = 58;
			want[keep[l] + 1] = 59;
			for (int g = 0; g < h.G; g++)
				expect_pos(&h, l, g, want, keep[l] + 2);
		}
		h_close(&h);
	}
}
END_TEST

/* GraceKV (simplified: first-hop relevance, global pool, add/split): prompt 16, the
 * question = the last 4 prompt tokens (their attention is the relevance), recent 2,
 * capacity 50% -> 8 entries. Question queries attend 5, 9, 10, 11 with weights
 * 4:3:2:1. Positions 6 and 7 carry the request's span 1. When span 1 is "system" (a
 * span the policy keeps) the guards are {6, 7, 14, 15} and the 4 free slots go to
 * 5, 9, 10, 11; when it is another span, 6 free slots take 5, 9, 10, 11 and then the
 * zero-score ties 0, 1. The singleton floor (16) and the guards keep every kept entry
 * exact, so nothing can absorb the evicted ones. */
static double w_grace(int l, int g, int r, int64_t t, int32_t pos, void *u)
{
	(void)l, (void)g, (void)r, (void)u;
	if (t < 12)
		return 1.0;
	return pos == 5 ? 4.0 : pos == 9 ? 3.0 : pos == 10 ? 2.0 : pos == 11 ? 1.0 : 0.0;
}

START_TEST(gracekv_spans_and_relevance)
{
	for (int named = 0; named < 2; named++) {
		struct harness h;
		h_open(&h, "gracekv", 1, 1, 4, 4, 20, 16);
		h_set(&h, "capacity=0.5");
		h_set(&h, "question=4");
		h_set(&h, "recent=2");
		const char *names[2] = { NULL, named ? "system" : "citations" };
		h.run.ctx.span_names = names;
		h.run.ctx.n_spans = 1;
		h.span_from = 6;
		h.span_to = 8;
		h.w = w_grace;
		h_feed(&h, 16);
		ck_assert_int_eq(h.compresses, 1);
		/* GraceKV core: 4 sinks exact; budget 8 over everything leaves 2 floor entries after
		 * recent 2 (named: the pinned span 6..7 takes them); relevance max-pooled over 7 */
		const int32_t a[] = { 0, 1, 2, 3, 6, 7, 14, 15 }, b[] = { 0, 1, 2, 3, 4, 5, 14, 15 };
		expect_all(&h, named ? a : b, 8);
		rt_kv_head *hd = rt_kv_head_at(&h.kv, 0, 0);
		for (int i = 0; i < hd->n; i++)
			ck_assert_float_eq(hd->count[i], 1.0f);
		h_close(&h);
	}
}
END_TEST

/* The library H2O's floor (`budget = heavy + recent min 64 tokens`) under every override,
 * hand-computed: after t tokens a head keeps floor(max(budget, min(64, t))) entries.
 * Ratio 4 (budget t / 4): all t up to 64, then 64 up to t = 256 (t / 4 <= 64), then t / 4.
 * --set heavy=1% recent=1% (budget 2% of t): 64 once t > 64. A runtime floor of 100
 * (--min-kv, kvp_ctx.min_kv) above the policy's: 100 once t > 100. Each time the
 * sequence's notes say the floor raised the budget. */
START_TEST(floor_survives_ratio_and_set)
{
	for (int c = 0; c < 3; c++) {
		struct harness h;
		h_open(&h, "h2o", 2, 1, 4, 4, 320, -1);
		h.run.ctx.min_kv = c == 2 ? 100 : 0; /* the policy's floor, or the runtime's above it */
		rt_err err = { "" };
		if (c == 0)
			ck_assert_int_eq(rt_run_set_ratio(&h.run, 4, &err), 0);
		if (c == 1) {
			h_set(&h, "heavy=0.01");
			h_set(&h, "recent=0.01");
		}
		const int f = c == 2 ? 100 : 64;
		h.w = w_heavy_2_5;
		for (int t = 1; t <= 300; t++) {
			h_step(&h);
			int want = t <= f ? t : f;
			if (c == 0 && t / 4 > want)
				want = t / 4;
			for (int l = 0; l < 2; l++)
				ck_assert_msg(rt_kv_head_at(&h.kv, l, 0)->n == want,
				              "case %d, t %d: %d entries, want %d", c, t,
				              (int)rt_kv_head_at(&h.kv, l, 0)->n, want);
		}
		ck_assert(h.run.notes & KVP_NOTE_FLOOR);
		h_close(&h);
	}
}
END_TEST

/* GraceKV honours the floor: the library's `min 64 tokens` over its 12.5% budget. A
 * 16-token prompt stays whole (min(64, 16) = 16 entries); a 100-token prompt keeps 64
 * entries in all (its budget counts every entry: 12.5 by the share, 64 by the floor),
 * where strict budgets (KVP_MIN_KV_STRICT) keep floor(100 / 8) = 12. */
START_TEST(gracekv_honours_the_floor)
{
	const int prompts[3] = { 16, 100, 100 }, want[3] = { 16, 64, 12 };
	for (int c = 0; c < 3; c++) {
		struct harness h;
		h_open(&h, "gracekv", 1, 1, 4, 4, 128, prompts[c]);
		h.run.ctx.min_kv = c == 2 ? KVP_MIN_KV_STRICT : 0;
		h_set(&h, "question=4");
		h_set(&h, "recent=2");
		h.w = w_grace;
		h_feed(&h, prompts[c]);
		ck_assert_int_eq(h.compresses, 1);
		ck_assert_msg(rt_kv_head_at(&h.kv, 0, 0)->n == want[c], "case %d: %d entries, want %d",
		              c, (int)rt_kv_head_at(&h.kv, 0, 0)->n, want[c]);
		ck_assert_int_eq((h.run.notes & KVP_NOTE_FLOOR) != 0, c < 2);
		h_close(&h);
	}
}
END_TEST

/* Chunked feeding through rt_run_chunk (chunks of at most `want` tokens that never
 * cross a trigger or the prompt end) gives the same cache as token-by-token feeding,
 * for policies with every-step, batch, block and prompt-end triggers. */
static void chunked_vs_stepwise(const char *name, const char *const *sets, int n_sets,
                                int64_t prompt_len, int total, int32_t want)
{
	struct harness a, b;
	h_open(&a, name, 2, 3, 3, 4, 40, prompt_len);
	h_open(&b, name, 2, 3, 3, 4, 40, prompt_len);
	for (int i = 0; i < n_sets; i++) {
		h_set(&a, sets[i]);
		h_set(&b, sets[i]);
	}
	a.w = b.w = w_heavy_2_5;
	h_feed(&a, total);
	int32_t max_k = 0;
	while (b.run.ctx.seen < total) {
		int32_t k = rt_run_chunk(&b.run, &b.kv, want);
		ck_assert_int_ge(k, 1);
		ck_assert_int_le(k, want);
		if (b.run.ctx.seen + k > total)
			k = (int32_t)(total - b.run.ctx.seen);
		max_k = k > max_k ? k : max_k;
		h_chunk(&b, k);
	}
	ck_assert_int_gt(max_k, 1); /* real multi-token chunks happened */
	ck_assert_int_eq(a.compresses, b.compresses);
	ck_assert_int_gt(a.compresses, 0);
	for (int l = 0; l < 2; l++)
		for (int g = 0; g < 3; g++) {
			rt_kv_head *x = rt_kv_head_at(&a.kv, l, g), *y = rt_kv_head_at(&b.kv, l, g);
			ck_assert_int_eq(x->n, y->n);
			ck_assert_int_eq(memcmp(x->pos, y->pos, (size_t)x->n * sizeof(int32_t)), 0);
			ck_assert_int_eq(memcmp(x->stats, y->stats, (size_t)x->n * a.kv.stat_bytes), 0);
			/* the exact CAOTE's stored outputs: the last query of a chunk is the last step */
			if (a.kv.state_bytes)
				ck_assert_int_eq(memcmp(x->state, y->state, a.kv.state_bytes), 0);
		}
	h_close(&a);
	h_close(&b);
}

START_TEST(chunked_equals_stepwise)
{
	const char *sc[] = { "capacity=0.5", "recent=2" };
	chunked_vs_stepwise("scissorhands", sc, 2, -1, 30, 7);
	const char *h2[] = { "heavy=0.2", "recent=0.1" };
	chunked_vs_stepwise("h2o", h2, 2, 20, 30, 6);
	const char *ca[] = { "heavy=4", "recent=2", "block=5" };
	chunked_vs_stepwise("caote_h2o", ca, 3, 17, 30, 8);
	const char *ct[] = { "states=4", "block=5" };
	chunked_vs_stepwise("caote_tova", ct, 2, 17, 30, 8);
	const char *sw[] = { "capacity=0.5", "recent=2", "left=1" };
	chunked_vs_stepwise("scissorhands_whole", sw, 3, -1, 30, 7);
	const char *sn[] = { "capacity=6", "window=3" };
	chunked_vs_stepwise("snapkv", sn, 2, 23, 30, 9);
	const char *tv[] = { "states=5" };
	chunked_vs_stepwise("tova", tv, 1, -1, 30, 4);
}
END_TEST

/* Chunked prefill (rt_run_set_prefill_chunk): H2O over a 16-token prompt, heavy 25% and
 * recent 12.5% of it (budget 6 = 4 heavy + 2 recent entries), prompt chunks of 4 that cross
 * its every-step trigger. Attention as w_heavy_2_5, so by hand: query 0 sees only entry 0
 * (1), query 1 entries 0 and 1 (1/2 each), queries 2..4 put 1 on position 2 and queries
 * 5.. 1/2 on positions 2 and 5. After the chunk 4..7 the accumulated scores are 1.5, 0.5,
 * 4.5, 0, 0, 1.5 for positions 0..5 (6 and 7 are the recent window), so the compress at
 * the chunk's end keeps 0, 1, 2, 5 + 6, 7; every later chunk only adds weight to 2 and 5,
 * so each compress keeps 0, 1, 2, 5 and the chunk's last two. With a store of 16 entries
 * the chunks are 4, 4, 4, 4 and compress runs 3 times (the exact schedule runs it after
 * every token from the 7th: 10 times); with a store of 9 the room bounds them: 4, 4, 3,
 * 3, 2. The store holds budget + chunk entries before each compress, budget after it.
 * After the prompt the decode steps keep the exact schedule (next_trigger's chunk). */
START_TEST(prefill_chunk_h2o)
{
	const int32_t want16[] = { 4, 4, 4, 4 }, want9[] = { 4, 4, 3, 3, 2 };
	for (int s = 0; s < 3; s++)
		for (int small = 0; small < 2; small++) {
			struct harness h;
			h_open(&h, "h2o", 1, shapes[s][0], shapes[s][1], 4, small ? 9 : 16, 16);
			h_set(&h, "heavy=0.25");
			h_set(&h, "recent=0.125");
			rt_err err = { "" };
			ck_assert_msg(rt_run_set_prefill_chunk(&h.run, 4, &err) == 0, "%s", err.msg);
			h.w = w_heavy_2_5;
			const int32_t *want = small ? want9 : want16;
			int nc = 0;
			while (h.run.ctx.seen < 16) {
				int32_t k = rt_run_chunk(&h.run, &h.kv, 4);
				ck_assert_int_lt(nc, small ? 5 : 4);
				ck_assert_int_eq(k, want[nc]);
				nc++;
				int64_t before = h.run.ctx.seen;
				h_chunk(&h, k);
				int32_t n = rt_kv_head_at(&h.kv, 0, 0)->n;
				ck_assert_int_eq(n, before + k > 6 ? 6 : before + k);
				if (before + k == 8) {
					const int32_t a[] = { 0, 1, 2, 5, 6, 7 };
					expect_all(&h, a, 6);
				}
			}
			ck_assert_int_eq(nc, small ? 5 : 4);
			ck_assert_int_eq(h.compresses, small ? 4 : 3);
			const int32_t b[] = { 0, 1, 2, 5, 14, 15 };
			expect_all(&h, b, 6);
			/* decode: the chunk is next_trigger's again, not the prefill chunk */
			int32_t nt = h.p->next_trigger(&h.run.ctx, &h.kv);
			ck_assert_int_eq(rt_run_chunk(&h.run, &h.kv, 4), nt < 4 ? nt : 4);
			ck_assert_int_lt(nt, 4);
			ck_assert_int_eq(rt_run_set_prefill_chunk(&h.run, -1, &err), -1);
			ck_assert_int_eq(rt_run_set_prefill_chunk(&h.run, 65537, &err), -1);
			h_close(&h);
		}
}
END_TEST

/* A chunk that crosses a periodic trigger compresses at its end, wherever the chunk ends:
 * caote_tova with `per block 8` (states 4) on a 40-token prompt fed in prefill chunks of 6
 * ends its chunks at 6, 12, 18, 24, 30, 36, 40, and the blocks end at 8, 16, 24, 32, 40,
 * so the chunks ending at 12, 18, 24, 36 and 40 each compress once: 5, as the exact
 * schedule's 5 blocks (hand count). Only the chunks landing on a multiple of 8 (24, 40)
 * compressed before, and a chunk offset by a system message's span (serve) then never
 * compressed at all. */
START_TEST(prefill_chunk_crosses_a_periodic_trigger)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "caote_tova", 1, shapes[s][0], shapes[s][1], 4, 48, 40);
		h_set(&h, "states=4");
		h_set(&h, "block=8");
		rt_err err = { "" };
		ck_assert_msg(rt_run_set_prefill_chunk(&h.run, 6, &err) == 0, "%s", err.msg);
		int n = 0;
		while (h.run.ctx.seen < 40) {
			const int32_t k = rt_run_chunk(&h.run, &h.kv, 6);
			ck_assert_int_eq(k, h.run.ctx.seen + 6 <= 40 ? 6 : 40 - h.run.ctx.seen);
			h_chunk(&h, k);
			n++;
		}
		ck_assert_int_eq(n, 7);
		ck_assert_int_eq(h.compresses, 5);
		ck_assert_int_eq(rt_kv_head_at(&h.kv, 0, 0)->n, 4);
		h_close(&h);
	}
}
END_TEST

/* A compression-ratio override R (rt_run_set_ratio): the budget becomes context / R
 * entries per head. H2O streaming (context = tokens seen), R = 4, every step: the rule
 * "entries > seen / 4 -> keep floor(seen / 4)" keeps exactly floor(seen / 4) entries
 * after every step from step 4 on (the recent guard, 10% of the context, stays below
 * the budget); before, the budget is below one entry and compress keeps one entry
 * instead of emptying the cache (runtime/policy/rt_budget.h, rule 2). */
START_TEST(ratio_override_h2o)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "h2o", 2, shapes[s][0], shapes[s][1], 4, 64, -1);
		rt_err err = { "" };
		ck_assert_int_eq(rt_run_set_ratio(&h.run, 4, &err), 0);
		h.w = w_heavy_2_5;
		for (int t = 1; t <= 40; t++) {
			h_step(&h);
			for (int l = 0; l < 2; l++)
				for (int g = 0; g < h.G; g++)
					ck_assert_int_eq(rt_kv_head_at(&h.kv, l, g)->n, t < 4 ? 1 : t / 4);
		}
		h_close(&h);
	}
}
END_TEST

/* The override also moves limits and targets written relative to the budget:
 * scissorhands' `when entries > budget to 0.5 * budget` with R = 2 and a 40-token
 * prompt means budget 20, target 10 (its own budget would be 20% = 8, target 4):
 * the cache grows to 21 at token 21 -> 10, to 21 again at token 32 -> 10, then 18 at
 * token 40. */
START_TEST(ratio_override_moves_targets)
{
	for (int s = 0; s < 3; s++) {
		struct harness h;
		h_open(&h, "scissorhands", 1, shapes[s][0], shapes[s][1], 4, 48, 40);
		rt_err err = { "" };
		h_set(&h, "recent=2");
		ck_assert_int_eq(rt_run_set_ratio(&h.run, 2, &err), 0);
		h.w = w_heavy_2_5;
		const int at[3] = { 21, 32, 40 }, want[3] = { 10, 10, 18 };
		for (int j = 0; j < 3; j++) {
			h_feed(&h, at[j] - (int)h.run.ctx.seen);
			for (int g = 0; g < h.G; g++)
				ck_assert_int_eq(rt_kv_head_at(&h.kv, 0, g)->n, want[j]);
		}
		ck_assert_int_eq(h.compresses, 2);
		h_close(&h);
	}
}
END_TEST

/* Guards larger than the overridden budget are an error, not a silent overflow; bad
 * ratios are rejected. */
/* One validation before the run (rt_policy_check, runtime/policy/rt_budget.h), with the
 * prompt as the context: a budget that comes to 0 entries (TOVA --set states=0), a
 * ratio far above the text (--ratio 1e9), guards in tokens above a budget written as a
 * share of the context (Scissorhands 25% with recent 64 at 128 tokens; its funnel
 * halves layer 0), `--set sinks=0` (kvpc refuses `keep sinks 0`). Feasible values
 * pass. */
static void expect_check(const char *name, int64_t prompt, const char *const *sets, int n_sets,
                         double ratio, const char *want)
{
	struct harness h;
	h_open(&h, name, 2, 1, 4, 4, 160, prompt);
	for (int i = 0; i < n_sets; i++)
		h_set(&h, sets[i]);
	rt_err err = { "" };
	if (ratio > 0)
		ck_assert_int_eq(rt_run_set_ratio(&h.run, ratio, &err), 0);
	int rc = rt_policy_check(&h.run, &h.kv, &err);
	if (want) {
		ck_assert_int_eq(rc, -1);
		ck_assert_str_eq(err.msg, want);
	} else {
		ck_assert_msg(rc == 0, "%s", err.msg);
	}
	h_close(&h);
}

START_TEST(check_before_run)
{
	const char *tova0[] = { "states=0" };
	expect_check("tova", 128, tova0, 1, 0,
	             "policy tova: the budget comes to 0 entries per KV head, below 1 entry; raise "
	             "the budget or lower the compression ratio");
	const char *tova8[] = { "states=8" };
	expect_check("tova", 128, tova8, 1, 0, NULL);
	expect_check("h2o", 128, NULL, 0, 1e9,
	             "policy h2o: the budget comes to 1.28e-07 entries per KV head (128 tokens of "
	             "context / ratio 1e+09), below 1 entry; raise the budget or lower the "
	             "compression ratio");
	expect_check("h2o", 128, NULL, 0, 8, NULL);
	const char *sc[] = { "capacity=0.25", "recent=64" };
	expect_check("scissorhands", 128, sc, 2, 0,
	             "policy scissorhands: the guards (recent 64 tokens) exceed the budget (32 "
	             "entries per KV head (a share of 128 tokens of context)); guards count inside "
	             "the budget: lower them or raise the budget");
	const char *sc2[] = { "capacity=0.25", "recent=8" };
	expect_check("scissorhands", 128, sc2, 2, 0, NULL);
	const char *sc3[] = { "capacity=0.25", "recent=24" }; /* layer 0: 16 entries */
	expect_check("scissorhands", 128, sc3, 2, 0,
	             "policy scissorhands: the guards (recent 24 tokens) exceed the budget (16 "
	             "entries per KV head at layer 0 (a share of 128 tokens of context)); guards "
	             "count inside the budget: lower them or raise the budget");
	const char *st0[] = { "sinks=0" };
	expect_check("streaming_llm", 128, st0, 1, 0,
	             "policy streaming_llm: the sinks (0) keep nothing; remove `keep sinks` or keep "
	             "at least 1 token");
	/* the same refusal at the first compress when the prompt length is unknown */
	struct harness h;
	h_open(&h, "tova", 1, 1, 4, 4, 16, -1);
	h_set(&h, "states=0");
	rt_err err = { "" };
	ck_assert_int_eq(rt_policy_check(&h.run, &h.kv, &err), 0); /* nothing known yet */
	h_append(&h, 0);
	h_observe(&h, 0);
	ck_assert_int_eq(rt_run_advance(&h.run, &h.kv, 1, &err), -1);
	ck_assert_str_eq(err.msg, "policy tova: the budget comes to 0 entries per KV head, below 1 "
	                 "entry; raise the budget or lower the compression ratio");
	h_close(&h);
}
END_TEST

/* `compress per prompt block N` (KeyDiff) cuts after every block of the prompt and at
 * its end, never while decoding; `compress per block N` (CAOTE) goes on every N decode
 * steps. Blocks of 4, budget 6, an 8-token prompt then 12 decoded tokens: KeyDiff cuts
 * once (8 -> 6) and then holds 6 + 12 = 18; CAOTE over H2O (heavy 4 + recent 2) cuts at
 * 8, 12, 16 and 20 and holds 6. */
START_TEST(block_schedules)
{
	for (int s = 0; s < 3; s++) {
		struct harness k;
		h_open(&k, "keydiff", 1, shapes[s][0], shapes[s][1], 4, 32, 8);
		h_set(&k, "capacity=6");
		h_set(&k, "block=4");
		h_feed(&k, 8);
		ck_assert_int_eq(k.compresses, 1);
		ck_assert_int_eq(k.kv.heads[0].n, 6);
		h_feed(&k, 12);
		ck_assert_int_eq(k.compresses, 1);
		ck_assert_int_eq(k.kv.heads[0].n, 18);
		h_close(&k);
		struct harness c;
		h_open(&c, "caote_h2o", 1, shapes[s][0], shapes[s][1], 4, 32, 8);
		h_set(&c, "heavy=4");
		h_set(&c, "recent=2");
		h_set(&c, "block=4");
		h_feed(&c, 20);
		ck_assert_int_eq(c.compresses, 4);
		ck_assert_int_eq(c.kv.heads[0].n, 6);
		h_close(&c);
	}
}
END_TEST

START_TEST(ratio_override_errors)
{
	struct harness h;
	h_open(&h, "h2o", 1, 1, 4, 4, 16, -1);
	rt_err err = { "" };
	ck_assert_int_eq(rt_run_set_ratio(&h.run, 0.5, &err), -1);
	ck_assert_int_eq(err.code, RT_ERR_INPUT);
	ck_assert_int_eq(rt_run_set_ratio(&h.run, NAN, &err), -1);
	ck_assert_int_eq(rt_run_set_ratio(&h.run, INFINITY, &err), -1);
	ck_assert_int_eq(rt_run_set_ratio(&h.run, 4, &err), 0);
	h_set(&h, "recent=0.5"); /* half the context is guarded: more than a quarter */
	h_append(&h, 0);
	h_observe(&h, 0);
	/* streaming: one token of context, a budget of 0.25 entries: one entry stays */
	ck_assert_int_eq(rt_run_advance(&h.run, &h.kv, 1, &err), 1);
	ck_assert_int_eq(h.kv.heads[0].n, 1);
	for (int t = 1; t < 8; t++) {
		h_append(&h, t);
		h_observe(&h, t);
	}
	/* 8 tokens: budget 2 entries, recent window 4 tokens */
	ck_assert_int_eq(rt_run_advance(&h.run, &h.kv, 7, &err), -1);
	ck_assert_str_eq(err.msg, "policy h2o: the guards (recent 4 tokens) exceed the budget (2 "
	                 "entries per KV head (8 tokens of context / ratio 4)); guards count inside "
	                 "the budget: lower them or raise the budget");
	ck_assert_int_eq(err.code, RT_ERR_INPUT);
	h_close(&h);
	struct harness f;
	h_open(&f, "full", 1, 1, 4, 4, 16, -1);
	ck_assert_int_eq(rt_run_set_ratio(&f.run, 2, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "never compresses"));
	ck_assert_int_eq(rt_run_set_ratio(&f.run, 0, &err), 0);
	h_close(&f);
}
END_TEST

/* Under a byte budget the guards count bytes: a guard entry takes its key and value rows
 * at the store's top tier. tova_tiers, head_dim 32, a 16-token prompt at byte ratio 4:
 * budget 16 / 4 = 4 f16 entries = 4 x (4 x 32) = 512 bytes; sinks 1 + recent 2 = 3 entries
 * fit in entries, and in bytes on an f16 top tier (3 x 2 x 64 = 384), not on an f32 one
 * (3 x 2 x 128 = 768), where the store would otherwise keep the guards alone, above the
 * budget. */
START_TEST(guards_count_bytes_under_byte_budget)
{
	for (int f32 = 0; f32 <= 1; f32++) {
		struct rt_run run;
		rt_kv kv;
		rt_err err = { "" };
		ck_assert_msg(rt_run_init_typed(&run, &kv, f32 ? RT_KV_F32 : RT_KV_F16,
		                                policy("tova_tiers"), 1, 1, 3, 32, 64, 16, &err) == 0,
		              "%s", err.msg);
		run.ctx.min_kv = KVP_MIN_KV_STRICT; /* tova_tiers' `min 64 tokens` off */
		ck_assert_msg(rt_run_set(&run, "sinks=1", &err) == 0 &&
		              rt_run_set(&run, "recent=2", &err) == 0 &&
		              rt_run_set_byte_ratio(&run, 4, &err) == 0, "%s", err.msg);
		if (!f32) {
			ck_assert_msg(rt_policy_check(&run, &kv, &err) == 0, "%s", err.msg);
		} else {
			ck_assert_int_eq(rt_policy_check(&run, &kv, &err), -1);
			ck_assert_str_eq(err.msg, "policy tova_tiers: the guards (sinks 1 + recent 2 = 3 "
			                 "tokens at 256 bytes each, 768 bytes) exceed the budget (512 bytes "
			                 "per KV head (16 tokens of context / byte ratio 4)); guards count "
			                 "inside the budget: lower them or raise the budget");
			ck_assert_int_eq(err.code, RT_ERR_INPUT);
		}
		rt_run_free(&run);
		rt_kv_free(&kv);
	}
}
END_TEST

/* A guard that is a share of the context counts the entries it keeps: `keep recent R`
 * keeps the positions p >= seen - R, floor(R) of them (hand count below), so the check
 * compares and prints whole entries, never "recent 4.5". */
START_TEST(guards_count_kept_entries)
{
	struct harness h;
	h_open(&h, "h2o", 1, 1, 4, 4, 16, 10);
	rt_err err = { "" };
	ck_assert_int_eq(rt_run_set_ratio(&h.run, 4, &err), 0); /* budget 10 / 4 = 2.5 entries */
	h_set(&h, "recent=0.45"); /* 4.5 tokens: positions 6..9 (>= 5.5) are 4 entries */
	ck_assert_int_eq(rt_policy_check(&h.run, &h.kv, &err), -1);
	ck_assert_str_eq(err.msg, "policy h2o: the guards (recent 4 tokens) exceed the budget (2.5 "
	                 "entries per KV head (10 tokens of context / ratio 4)); guards count inside "
	                 "the budget: lower them or raise the budget");
	ck_assert_int_eq(err.code, RT_ERR_INPUT);
	/* 2.9 tokens keep positions 8, 9 (>= 7.1): 2 entries fit in 2.5 */
	h_set(&h, "recent=0.29");
	ck_assert_int_eq(rt_policy_check(&h.run, &h.kv, &err), 0);
	for (int t = 0; t < 10; t++) {
		h_append(&h, t);
		h_observe(&h, t);
	}
	ck_assert_int_eq(rt_run_advance(&h.run, &h.kv, 10, &err), 1);
	ck_assert_int_eq(h.kv.heads[0].n, 2);
	ck_assert_int_eq(h.kv.heads[0].pos[0], 8);
	ck_assert_int_eq(h.kv.heads[0].pos[1], 9);
	h_close(&h);
}
END_TEST

START_TEST(registry_and_params)
{
	ck_assert_int_ge(kvp_registry_count, 10);
	ck_assert_ptr_null(kvp_registry[kvp_registry_count]);
	for (int i = 0; i < kvp_registry_count; i++) {
		const struct kvp_policy *p = kvp_registry[i];
		ck_assert_int_eq(p->abi_version, KVP_ABI_VERSION);
		ck_assert_uint_eq(strlen(p->source_hash), 16);
		ck_assert_ptr_nonnull(p->should_compress);
		ck_assert_ptr_nonnull(p->next_trigger);
		for (int j = 0; j < p->n_params; j++)
			ck_assert_int_eq(kvp_policy_param_index(p, p->params[j].name), j);
	}
	const struct kvp_policy *p = policy("tova");
	double v[32];
	kvp_policy_param_defaults(p, v);
	rt_err err = { "" };
	ck_assert_int_eq(kvp_policy_param_set(p, v, "nosuch=1", &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "no parameter 'nosuch'"));
	ck_assert_int_eq(kvp_policy_param_set(p, v, "states=abc", &err), -1);
	ck_assert_int_eq(kvp_policy_param_set(p, v, "states=inf", &err), -1);
	ck_assert_int_eq(kvp_policy_param_set(p, v, "states", &err), -1);
	int bi = kvp_policy_param_index(p, "states");
	ck_assert_int_ge(bi, 0);
	ck_assert(v[bi] == 512.0); /* the default of policies/tova.kvp */
	ck_assert_int_eq(kvp_policy_param_set(p, v, "states=77", &err), 0);
	ck_assert(v[bi] == 77.0);
}
END_TEST

static Suite *policies_suite(void)
{
	Suite *s = suite_create("policies");
	TCase *tc = tcase_create("hooks");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, registry_and_params);
	tcase_add_test(tc, full_keeps_everything);
	tcase_add_test(tc, window_keeps_last);
	tcase_add_test(tc, streaming_llm_sinks_and_recent);
	tcase_add_test(tc, h2o_heavy_hitters);
	tcase_add_test(tc, tova_ties_keep_lower);
	tcase_add_test(tc, tova_layer_mean_gqa);
	tcase_add_test(tc, snapkv_window_pooling);
	tcase_add_test(tc, scissorhands_window_rolloff);
	tcase_add_test(tc, scissorhands_uniform_is_not_low);
	tcase_add_test(tc, knorm_lowest_norms);
	tcase_add_test(tc, keydiff_least_similar);
	tcase_add_test(tc, keydiff_ranks_the_tier_split);
	tcase_add_test(tc, caote_true_output);
	tcase_add_test(tc, caote_gqa_l2);
	tcase_add_test(tc, expected_attention_numpy);
	tcase_add_test(tc, caote_tova_snapkv);
	tcase_add_test(tc, caote_needs_outputs);
	tcase_add_test(tc, caote_group_too_large);
	tcase_add_test(tc, scissorhands_whole_history);
	tcase_add_test(tc, scissorhands_single_eviction);
	tcase_add_test(tc, scissorhands_funnel_layers);
	tcase_add_test(tc, adakv_adaptive_heads_gqa);
	tcase_add_test(tc, pyramidkv_layer_budgets);
	tcase_add_test(tc, gracekv_spans_and_relevance);
	tcase_add_test(tc, floor_survives_ratio_and_set);
	tcase_add_test(tc, gracekv_honours_the_floor);
	tcase_add_test(tc, chunked_equals_stepwise);
	tcase_add_test(tc, prefill_chunk_h2o);
	tcase_add_test(tc, prefill_chunk_crosses_a_periodic_trigger);
	tcase_add_test(tc, ratio_override_h2o);
	tcase_add_test(tc, ratio_override_moves_targets);
	tcase_add_test(tc, ratio_override_errors);
	tcase_add_test(tc, guards_count_kept_entries);
	tcase_add_test(tc, guards_count_bytes_under_byte_budget);
	tcase_add_test(tc, check_before_run);
	tcase_add_test(tc, block_schedules);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int nf = check_run(policies_suite());
	return nf == 0 ? 0 : 1;
}
