/*
 * test_kv_tiers: the KV store's per-entry precision tiers (runtime/kv/rt_kv.h,
 * rt_kv_init_tiered / rt_kv_head_set_tiers) on the grouped-query shapes 9/3 and 4/1.
 * References, all independent of the code under test:
 *   - round trip: every decoded key and value within the bound of its asymmetric group
 *     computed here from the input (half a step of (max - min) / (2^bits - 1), plus the
 *     f16 rounding of the scale, the minimum and of the top-tier row first stored);
 *   - bytes: rt_kv_bytes_held, rt_kvbytes_held and the pool's bytes equal the sums over
 *     tiers computed by hand from the row layouts (f16 128 bytes per row at head_dim 64,
 *     q8 2 × (4 + 32), q4 2 × (4 + 16), q2 2 × (4 + 8)), and the pool returns to zero;
 *   - a random mix of append / set_tiers / keep / evict against a plain model of the list
 *     (position, tier and the decoded rows of each entry; rows never change when slots
 *     move), with every slot and owner index checked after each step;
 *   - attention over the stored, dequantised entries: after set_tiers and evict on a tiny
 *     model, the forward over the tiered store gives the logits of an f32 store holding
 *     rt_kv_key / rt_kv_value of the kept entries (the f32 path is itself checked against
 *     a naive reference by test_model), the observe hook's outputs equal Σ p·v over the
 *     dequantised values, and quantisation really changed the logits;
 *   - a policy with KVP_NEED_TIERS gets a tiered store from rt_seq (f16 top on the fast
 *     path, f32 on the exact one) whose compress downgrades entries to q4, and the
 *     configurations a tiered store cannot serve are refused before any token.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/rt_kv.h"
#include "kv/rt_kvbytes.h"
#include "model/rt_model.h"
#include "model/rt_quant.h"
#include "policy/rt_policy.h"
#include "policy/rt_seq.h"
#include "support/tiny_model.h"
#include "support/check_run.h"

static unsigned rng(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (*s >> 8) & 0xffffff;
}

/* uniform in [-1, 1) times a per-channel spread (channel outliers, as keys have) */
static float rnd(unsigned *s)
{
	return (float)rng(s) / (float)0x800000 - 1.0f;
}

static void fill_row(float *x, int d, unsigned *s, int outliers)
{
	for (int c = 0; c < d; c++)
		x[c] = rnd(s) * (outliers && c % 8 == 3 ? 12.0f : 1.0f) + (outliers && c == 5 ? 4.0f : 0);
}

/* positions a key group covers (runtime/kv/rt_kv.h RT_KV_KGROUP: the bytes and groups
 * below are computed by hand for it) */
enum { KG = 64 };

/* bits of the values and of the keys at each tier: top, q8, k8v4, q4, q2 (the 2-bit tier
 * keeps keys at 4) */
static const int vbits_of[RT_KV_N_TIER] = { 16, 8, 4, 4, 2 };
static const int kbits_of[RT_KV_N_TIER] = { 16, 8, 8, 4, 4 };

/* Largest error allowed for a key channel coded at `bits` against a key group whose
 * members' values span [lo, hi]: half a step (hi - lo) / (2^bits - 1), the f16 rounding of
 * the range's ends (relative 2^-11 each, and of the members' f16 rows the range was fitted
 * on: 2^-10 in all) reaching up to 2^bits - 1 steps, plus f32 slack. */
static double chan_bound(double lo, double hi, int bits)
{
	const double top = (1 << bits) - 1, step = (hi - lo) / top;
	return step / 2 + (fabs(lo) + fabs(hi)) * 0x1p-9 + 1e-6 * (fabs(hi) + fabs(lo)) + 1e-30;
}

/* Largest error allowed for a group of 32 values x (stride 1) coded at `bits`: half a
 * step, the step and minimum rounded to f16 (relative 2^-11 each; the codes go up to
 * 2^bits - 1 steps), plus f32 slack. */
static double group_bound(const float *x, int bits)
{
	float lo = x[0], hi = x[0];
	for (int i = 1; i < 32; i++)
		lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
	const double top = (1 << bits) - 1, step = (hi - lo) / top;
	return step / 2 + step * top * 0x1p-10 + fabs(lo) * 0x1p-10 + 1e-6 * (fabs(hi) + fabs(lo)) +
	       1e-30;
}

START_TEST(round_trip_per_tier)
{
	enum { D = 64, N = 40 };
	rt_kv kv;
	rt_err err;
	rt_kvpool pool = { .limit = INT64_MAX };
	ck_assert_int_eq(rt_kv_init_tiered(&kv, &pool, RT_KV_F16, 1, 1, 4, D, N, 0, 0, &err), 0);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	static float K[N][D], V[N][D];
	unsigned s = 7;
	for (int i = 0; i < N; i++) {
		fill_row(K[i], D, &s, 1);
		fill_row(V[i], D, &s, 0);
		rt_kv_append(&kv, h, K[i], V[i], i);
	}
	/* entry i to tier i % 5 (keys with channel outliers, as real keys have) */
	uint8_t want[N];
	for (int i = 0; i < N; i++)
		want[i] = (uint8_t)(i % RT_KV_N_TIER);
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), N - N / RT_KV_N_TIER);
	/* one key group, positions 0..39, every member at the top tier when fitted */
	ck_assert_int_eq(RT_KV_KGROUP, KG);
	ck_assert_int_eq(rt_kv_kgroups(&kv), 1);
	for (int i = 0; i < N; i++) {
		const int t = i % RT_KV_N_TIER;
		ck_assert_int_eq(h->tier[i], t);
		float kb[D], vb[D];
		const float *k = rt_kv_key(&kv, h, i, kb), *v = rt_kv_value(&kv, h, i, vb);
		const int b0 = i / KG * KG, b1 = b0 + KG < N ? b0 + KG : N;
		for (int g = 0; g < D; g += 32) {
			double vbnd = t == 0 ? 0 : group_bound(V[i] + g, vbits_of[t]);
			for (int c = g; c < g + 32; c++) {
				double lo = K[b0][c], hi = K[b0][c];
				for (int j = b0; j < b1; j++)
					lo = fmin(lo, K[j][c]), hi = fmax(hi, K[j][c]);
				const double kbnd = t == 0 ? 0 : chan_bound(lo, hi, kbits_of[t]);
				/* every tier codes the f16 row appended first: + its rounding */
				const double vb_c = vbnd + fabs(V[i][c]) * 0x1p-11;
				ck_assert_msg(fabs(v[c] - V[i][c]) <= vb_c, "tier %d value %d/%d: %g vs %g (bound %g)",
				              t, i, c, v[c], V[i][c], vb_c);
				double kb_c = kbnd + fabs(K[i][c]) * 0x1p-11;
				ck_assert_msg(fabs(k[c] - K[i][c]) <= kb_c, "tier %d key %d/%d: %g vs %g (bound %g)",
				              t, i, c, k[c], K[i][c], kb_c);
			}
		}
	}
	/* precision lost is not regained: asking entry 4 (q2) back to top, or entry 2 (k8v4)
	 * to q8 (8-bit values again), leaves them where they are */
	want[4] = RT_KV_TIER_TOP;
	want[2] = RT_KV_TIER_Q8;
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), 0);
	ck_assert_int_eq(h->tier[4], RT_KV_TIER_Q2);
	ck_assert_int_eq(h->tier[2], RT_KV_TIER_K8V4);
	/* refusals */
	want[0] = RT_KV_N_TIER;
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "outside"));
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
	rt_kv un;
	ck_assert_int_eq(rt_kv_init_typed(&un, &pool, RT_KV_F16, 1, 1, 1, D, 8, 0, 0, &err), 0);
	ck_assert_int_eq(rt_kv_head_set_tiers(&un, rt_kv_head_at(&un, 0, 0), want, &err), -1);
	ck_assert_ptr_null(rt_kv_head_at(&un, 0, 0)->tier);
	rt_kv_free(&un);
	ck_assert_int_eq(rt_kv_init_tiered(&kv, &pool, RT_KV_F16, 1, 1, 1, 40, 8, 0, 0, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "head_dim 40"));
	ck_assert_int_eq(rt_kv_init_tiered(&kv, &pool, RT_KV_Q8_0, 1, 1, 1, 64, 8, 0, 0, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "top tier"));
}
END_TEST

/* Keys per channel by hand, head_dim 32 (one head): three entries of position block 0 with
 * channel 0 = -1, 0.25, 2; channel 1 = 5 throughout (a constant channel); channel 2 = 0.5,
 * -0.5, 0.1; the others 0. Key codes are 4 bits at the q4 and q2 tiers (the 2-bit tier
 * keeps 4-bit keys), 8 at q8. */
START_TEST(channel_codes_by_hand)
{
	enum { D = 32 };
	rt_kvpool pool = { .limit = INT64_MAX };
	rt_kv kv;
	rt_err err;
	ck_assert_int_eq(rt_kv_init_tiered(&kv, &pool, RT_KV_F16, 1, 1, 4, D, 8, 0, 0, &err), 0);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	static const float c0[3] = { -1.0f, 0.25f, 2.0f }, c2[3] = { 0.5f, -0.5f, 0.1f };
	float k[D] = { 0 }, v[D] = { 0 }, kb[D];
	for (int i = 0; i < 3; i++) {
		k[0] = c0[i], k[1] = 5.0f, k[2] = c2[i];
		rt_kv_append(&kv, h, k, v, i);
	}
	/* entries 0 and 1 to q2: one group, fitted on all three (entry 2 stays at the top) */
	uint8_t want[8] = { RT_KV_TIER_Q2, RT_KV_TIER_Q2, RT_KV_TIER_TOP };
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), 2);
	ck_assert_int_eq(rt_kv_kgroups(&kv), 1);
	ck_assert_int_eq(h->kgrp[0], 0);
	ck_assert_int_eq(h->kgrp[2], 0);
	ck_assert_int_eq(h->arena[RT_KV_KGROUPS].owner[0], 2); /* quantised members */
	/* channel 0: range [-1, 2], step 3 / 15 = 0.2: -1 -> code 0, 0.25 -> 6.25 -> code 6 (0.2);
	 * channel 1: step 0, decodes 5; channel 2: [-0.5, 0.5], step 1/15: 0.5 -> 15, -0.5 -> 0 */
	const float *r = rt_kv_key(&kv, h, 0, kb);
	ck_assert_float_eq(r[0], -1.0f);
	ck_assert_float_eq(r[1], 5.0f);
	ck_assert_float_eq_tol(r[2], 0.5f, 1e-6f);
	ck_assert_float_eq(r[3], 0.0f);
	r = rt_kv_key(&kv, h, 1, kb);
	ck_assert_float_eq_tol(r[0], 0.2f, 1e-6f);
	ck_assert_float_eq(r[2], -0.5f);
	/* the codes: 4 bits a channel, channel c at bits 4 (c % 2) of byte c / 2: 16 bytes */
	ck_assert_int_eq((int)kv.tier_krow[RT_KV_TIER_Q2], D / 2);
	const uint8_t *row0 = h->arena[RT_KV_TIER_Q2].rows + (size_t)h->slot[0] * 2 * kv.tier_row[RT_KV_TIER_Q2];
	const uint8_t *row1 = h->arena[RT_KV_TIER_Q2].rows + (size_t)h->slot[1] * 2 * kv.tier_row[RT_KV_TIER_Q2];
	ck_assert_int_eq(row0[0], 0);
	ck_assert_int_eq(row0[1], 15);
	ck_assert_int_eq(row1[0], 6);
	ck_assert_int_eq(row1[1], 0);
	/* entry 2 to q8 with the group's range: channel 0 2 -> code 255 (2.0), channel 2 0.1
	 * (0.0999756 in f16) -> 0.59998 · 255 = code 153 (0.1); then to q4: codes 15 and 9 */
	want[2] = RT_KV_TIER_Q8;
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), 1);
	ck_assert_int_eq(rt_kv_kgroups(&kv), 1);
	r = rt_kv_key(&kv, h, 2, kb);
	ck_assert_float_eq_tol(r[0], 2.0f, 1e-6f);
	ck_assert_float_eq_tol(r[2], -0.5f + 153.0f / 255.0f, 1e-6f);
	want[2] = RT_KV_TIER_Q4;
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), 1);
	r = rt_kv_key(&kv, h, 2, kb);
	ck_assert_float_eq_tol(r[0], 2.0f, 1e-6f);
	ck_assert_float_eq_tol(r[2], -0.5f + 9.0f / 15.0f, 1e-6f);
	ck_assert_int_eq(h->arena[RT_KV_KGROUPS].owner[0], 3);
	/* evicting entry 0 leaves the others' codes and the group as they were */
	int32_t keep[2] = { 1, 2 };
	rt_kv_head_keep(&kv, h, keep, 2);
	ck_assert_int_eq(rt_kv_kgroups(&kv), 1);
	ck_assert_int_eq(h->arena[RT_KV_KGROUPS].owner[0], 2);
	r = rt_kv_key(&kv, h, 0, kb); /* the old entry 1, now 0 */
	ck_assert_float_eq_tol(r[0], 0.2f, 1e-6f);
	ck_assert_float_eq(r[2], -0.5f);
	/* an entry of the same block appended after the fit forms a group of its own: its
	 * channel 0 (10) lies outside [-1, 2] and is kept exactly (a one-member range) */
	k[0] = 10.0f, k[1] = 5.0f, k[2] = 0.0f;
	rt_kv_append(&kv, h, k, v, 3);
	uint8_t w2[3] = { RT_KV_TIER_Q2, RT_KV_TIER_Q4, RT_KV_TIER_Q2 };
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, w2, &err), 1);
	ck_assert_int_eq(rt_kv_kgroups(&kv), 2);
	ck_assert_int_ne(h->kgrp[2], h->kgrp[0]);
	r = rt_kv_key(&kv, h, 2, kb);
	ck_assert_float_eq(r[0], 10.0f);
	/* bytes: 2 entries at q2 (16 key code bytes, value 4 + 8), 1 at q4 (16; 4 + 16), two
	 * ranges of 32 f16 minima and maxima; the pool: metadata 23 bytes an entry (position 4,
	 * count 4, log count 4, span 2, tier 1, slot 4, key group 4), a block of 16 slots per
	 * arena (rows + owner) and one of 16 key groups (range + member count) */
	ck_assert_int_eq(rt_kvbytes_held(&kv), 2 * (16 + 12) + (16 + 20) + 2 * 128);
	ck_assert_int_eq(rt_kv_bytes_held(&kv), 16 * 23 + 16 * (28 + 4) + 16 * (36 + 4) + 16 * (128 + 4));
	/* the first group's quantised members evicted: its range is freed */
	int32_t keep2[1] = { 2 };
	rt_kv_head_keep(&kv, h, keep2, 1);
	ck_assert_int_eq(rt_kv_kgroups(&kv), 1);
	ck_assert_int_eq(h->kgrp[0], 0);
	ck_assert_int_eq(rt_kvbytes_held(&kv), 16 + 12 + 128);
	ck_assert_int_eq(rt_kv_bytes_held(&kv), 16 * 23 + 16 * (28 + 4) + 16 * (128 + 4));
	ck_assert_int_eq(rt_kvpool_get(&pool).used, rt_kv_bytes_held(&kv));
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
}
END_TEST

/* rt_kv_head_set_keys (RoPE re-rotation): a key group with a changed member is refitted on
 * its members' new keys, so a key moved outside the old range is not clamped; a group
 * without a changed member keeps its codes byte for byte; a lone rt_kv_set_key clamps. */
START_TEST(set_keys_refits_groups)
{
	enum { D = 32, N = 2 * KG };
	rt_kvpool pool = { .limit = INT64_MAX };
	rt_kv kv;
	rt_err err;
	ck_assert_int_eq(rt_kv_init_tiered(&kv, &pool, RT_KV_F16, 1, 1, 3, D, N, 0, 0, &err), 0);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	static float K[N][D], V[N][D];
	unsigned s = 31;
	for (int i = 0; i < N; i++) {
		fill_row(K[i], D, &s, 1);
		fill_row(V[i], D, &s, 0);
		rt_kv_append(&kv, h, K[i], V[i], i);
	}
	uint8_t want[N], changed[N] = { 0 };
	for (int i = 0; i < N; i++)
		want[i] = i % 5 == 0 ? RT_KV_TIER_TOP : (uint8_t)(1 + i % (RT_KV_N_TIER - 1));
	ck_assert_int_gt(rt_kv_head_set_tiers(&kv, h, want, &err), 0);
	ck_assert_int_eq(rt_kv_kgroups(&kv), 2);
	/* every key as stored now; block 0 then changed */
	static float Kn[N][D];
	for (int i = 0; i < N; i++)
		rt_kv_key(&kv, h, i, Kn[i]);
	/* block 0: every key scaled by 3 (outside the fitted range in most channels) */
	for (int i = 0; i < KG; i++) {
		for (int c = 0; c < D; c++)
			Kn[i][c] *= 3.0f;
		changed[i] = 1;
	}
	static float before[N][D];
	for (int i = KG; i < N; i++)
		rt_kv_key(&kv, h, i, before[i]);
	rt_kv_head_set_keys(&kv, h, &Kn[0][0], changed);
	for (int c = 0; c < D; c++) {
		double lo = Kn[0][c], hi = Kn[0][c];
		for (int j = 0; j < KG; j++)
			lo = fmin(lo, Kn[j][c]), hi = fmax(hi, Kn[j][c]);
		for (int i = 0; i < KG; i++) {
			float kb[D];
			const float *k = rt_kv_key(&kv, h, i, kb);
			const double bnd = h->tier[i] == RT_KV_TIER_TOP ? fabs(Kn[i][c]) * 0x1p-11
			                                                 : chan_bound(lo, hi, kbits_of[h->tier[i]]);
			ck_assert_msg(fabs(k[c] - Kn[i][c]) <= bnd, "entry %d channel %d: %g vs %g (bound %g)",
			              i, c, k[c], Kn[i][c], bnd);
		}
	}
	for (int i = KG; i < N; i++) {
		float kb[D];
		ck_assert(memcmp(rt_kv_key(&kv, h, i, kb), before[i], sizeof kb) == 0);
	}
	/* one key set alone: a channel outside its group's range is clamped to it */
	float x[D], kb[D];
	memcpy(x, Kn[1], sizeof x);
	x[0] = 1000.0f;
	rt_kv_set_key(&kv, h, 1, x);
	ck_assert_float_le(rt_kv_key(&kv, h, 1, kb)[0], 100.0f);
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
}
END_TEST

/* ---- bytes and the random mix against a model ------------------------------------------- */

enum { MD = 64, MCAP = 96 };

typedef struct model_entry {
	int32_t pos;
	int tier;
	int grp;          /* the model's key group, -1 none */
	float ktop[MD];   /* the key as the top tier held it */
	double kerr[MD];  /* bound on |key - ktop| per channel over the entry's downgrades */
	float k[MD], v[MD];
} model_entry;

/* A key group of the model: the rule of rt_kv.h restated (fitted when the first entry of a
 * position block without a group leaves the top tier, on the block's top-tier entries
 * without a group; freed when no quantised member is left). */
typedef struct model_group {
	int used, live;
	float lo[MD], hi[MD];
} model_group;

typedef struct list_model {
	int n;
	model_entry e[MCAP];
	model_group g[MCAP];
} list_model;

/* half an entry's key + value row bytes at tier t, head_dim 64, from the layouts (f16
 * top; keys: 64 codes of 8, 4 or 2 bits; values: two groups of 32 channels, each a 4-byte
 * header and the codes) */
static const int64_t row64[RT_KV_N_TIER] = { 128, (64 + 2 * (4 + 32)) / 2, (64 + 2 * (4 + 16)) / 2,
	                                     (32 + 2 * (4 + 16)) / 2, (32 + 2 * (4 + 8)) / 2 };
/* a key group's range: 64 f16 minima and 64 f16 maxima */
enum { RANGE64 = 4 * MD };

static int64_t up16(int64_t n)
{
	return (n + RT_KV_BLOCK - 1) / RT_KV_BLOCK * RT_KV_BLOCK;
}

/* Check h against m: entries, slots, owners, key groups (the store's groups partition the
 * entries as the model's do, with the model's member counts); returns the hand-computed
 * pool bytes. */
static int64_t check_head(const rt_kv *kv, const rt_kv_head *h, const list_model *m,
                          int64_t *rows_bytes)
{
	ck_assert_int_eq(h->n, m->n);
	int cnt[RT_KV_N_TIER] = { 0 }, groups = 0, to_store[MCAP], to_model[MCAP];
	for (int g = 0; g < MCAP; g++) {
		groups += m->g[g].used;
		to_store[g] = to_model[g] = -1;
	}
	ck_assert_int_eq(h->arena[RT_KV_KGROUPS].n, groups);
	for (int i = 0; i < h->n; i++) {
		const int mg = m->e[i].grp, sg = h->kgrp[i];
		ck_assert_int_eq(mg < 0, sg < 0);
		if (mg >= 0) {
			ck_assert(sg < groups);
			ck_assert(to_store[mg] < 0 || to_store[mg] == sg);
			ck_assert(to_model[sg] < 0 || to_model[sg] == mg);
			to_store[mg] = sg, to_model[sg] = mg;
			ck_assert_int_eq(h->arena[RT_KV_KGROUPS].owner[sg], m->g[mg].live);
		}
		ck_assert_int_eq(h->pos[i], m->e[i].pos);
		ck_assert_int_eq(h->tier[i], m->e[i].tier);
		cnt[h->tier[i]]++;
		const rt_kv_arena *a = &h->arena[h->tier[i]];
		ck_assert(h->slot[i] >= 0 && h->slot[i] < a->n);
		ck_assert_int_eq(a->owner[h->slot[i]], i);
		float kb[MD], vb[MD];
		const float *k = rt_kv_key(kv, h, i, kb), *v = rt_kv_value(kv, h, i, vb);
		ck_assert_msg(memcmp(k, m->e[i].k, sizeof kb) == 0 && memcmp(v, m->e[i].v, sizeof vb) == 0,
		              "entry %d: rows changed", i);
	}
	/* 4 + 4 + 4 + 2 metadata bytes, 8 statistics bytes, tier 1, slot 4, key group 4: 31 */
	int64_t bytes = up16(h->n) * 31 + up16(groups) * (RANGE64 + 4);
	*rows_bytes += groups * RANGE64;
	for (int t = 0; t < RT_KV_N_TIER; t++) {
		ck_assert_int_eq(h->arena[t].n, cnt[t]);
		bytes += up16(cnt[t]) * (2 * row64[t] + 4);
		*rows_bytes += cnt[t] * 2 * row64[t];
	}
	return bytes;
}

static void model_snapshot(const rt_kv *kv, const rt_kv_head *h, list_model *m, int i)
{
	float kb[MD], vb[MD];
	memcpy(m->e[i].k, rt_kv_key(kv, h, i, kb), sizeof kb);
	memcpy(m->e[i].v, rt_kv_value(kv, h, i, vb), sizeof vb);
	m->e[i].tier = h->tier[i];
}

/* The model's side of a set_tiers(want): the groups it fits (before the call). */
static void model_groups_make(list_model *m, const uint8_t *want)
{
	for (int i = 0; i < m->n; i++) {
		if (want[i] <= m->e[i].tier || m->e[i].tier != 0 || m->e[i].grp >= 0)
			continue;
		int g = 0;
		while (m->g[g].used)
			g++;
		model_group *mg = &m->g[g];
		mg->used = 1, mg->live = 0;
		for (int c = 0; c < MD; c++)
			mg->lo[c] = INFINITY, mg->hi[c] = -INFINITY;
		for (int j = 0; j < m->n; j++) {
			model_entry *e = &m->e[j];
			if (e->tier != 0 || e->grp >= 0 || e->pos / KG != m->e[i].pos / KG)
				continue;
			e->grp = g;
			for (int c = 0; c < MD; c++)
				mg->lo[c] = fminf(mg->lo[c], e->ktop[c]), mg->hi[c] = fmaxf(mg->hi[c], e->ktop[c]);
		}
	}
}

/* After the call: entry i moved to its tier; its key within its group's bound. */
static void model_moved(const rt_kv *kv, const rt_kv_head *h, list_model *m, int i)
{
	model_entry *e = &m->e[i];
	model_group *g = &m->g[e->grp];
	if (e->tier == 0)
		g->live++;
	model_snapshot(kv, h, m, i);
	for (int c = 0; c < MD; c++) {
		e->kerr[c] += chan_bound(g->lo[c], g->hi[c], kbits_of[e->tier]);
		ck_assert_msg(fabs(e->k[c] - e->ktop[c]) <= e->kerr[c],
		              "entry %d (pos %d) tier %d channel %d: key %g, at the top %g, bound %g", i,
		              e->pos, e->tier, c, e->k[c], e->ktop[c], e->kerr[c]);
	}
}

/* The model's side of a keep/evict leaving out entry i (before the entries move). */
static void model_drop(list_model *m, int i)
{
	const model_entry *e = &m->e[i];
	if (e->tier == 0 || --m->g[e->grp].live > 0)
		return;
	m->g[e->grp].used = 0;
	for (int j = 0; j < m->n; j++)
		if (j != i && m->e[j].grp == e->grp)
			m->e[j].grp = -1;
}

static void check_store(const rt_kv *kv, const list_model *lm, const rt_kvpool *pool)
{
	int64_t bytes = 0, rows = 0;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		bytes += check_head(kv, &kv->heads[i], &lm[i], &rows);
	ck_assert_int_eq(rt_kv_bytes_held(kv), bytes);
	ck_assert_int_eq(rt_kvpool_get(pool).used, bytes);
	ck_assert_int_eq(rt_kvbytes_held(kv), rows);
	ck_assert_int_ge(rt_kv_bytes_peak(kv), bytes);
}

START_TEST(random_mix_against_model)
{
	/* _i == 0: 2 layers × 3 KV heads, group 3 (9/3); 1: 1 × 1, group 4 (4/1) */
	const int L = _i ? 1 : 2, H = _i ? 1 : 3, G = _i ? 4 : 3, NH = L * H;
	rt_kvpool pool = { .limit = INT64_MAX };
	rt_kv kv;
	rt_err err;
	ck_assert_int_eq(rt_kv_init_tiered(&kv, &pool, RT_KV_F16, L, H, G, MD, MCAP, 8, 16, &err), 0);
	/* the rows plus a full group's share of its range, 256 / 64 */
	ck_assert_int_eq((int)rt_kv_tier_row_bytes(&kv, RT_KV_TIER_Q4), (32 + 40 + 4) / 2);
	ck_assert_int_eq((int)rt_kv_tier_row_bytes(&kv, RT_KV_TIER_K8V4), (64 + 40 + 4) / 2);
	ck_assert_int_eq((int)kv.tier_krow[RT_KV_TIER_K8V4], 64);
	ck_assert_int_eq((int)kv.tier_vrow[RT_KV_TIER_K8V4], 40);
	ck_assert_int_eq((int)rt_kv_tier_row_bytes(&kv, RT_KV_TIER_Q2), (32 + 24 + 4) / 2);
	ck_assert_int_eq((int)rt_kv_tier_row_bytes(&kv, RT_KV_TIER_TOP), 128);
	ck_assert_int_eq((int)rt_kv_tier_entry_bytes(&kv, RT_KV_TIER_Q2), 31 + 32 + 24 + 4);
	ck_assert_int_eq((int)kv.tier_krow[RT_KV_TIER_Q2], 32);
	ck_assert_int_eq((int)kv.tier_vrow[RT_KV_TIER_Q2], 24);
	ck_assert_int_eq((int)rt_kv_tier_entry_bytes(&kv, RT_KV_TIER_TOP), 31 + 256 + 4);
	ck_assert_int_eq((int)rt_kv_f16_entry_bytes(&kv), 256);
	list_model *lm = calloc((size_t)NH, sizeof *lm);
	unsigned s = 99u + (unsigned)_i;
	int32_t next_pos = 0;
	for (int step = 0; step < 300; step++) {
		const int op = (int)(rng(&s) % 10);
		if (op < 4) { /* a chunk of appends to every head */
			const int add = 1 + (int)(rng(&s) % 7);
			if (lm[0].n + add > MCAP)
				continue;
			ck_assert_int_eq(rt_kv_reserve(&kv, add, &err), 0);
			for (int j = 0; j < add; j++, next_pos++)
				for (int i = 0; i < NH; i++) {
					float k[MD], v[MD];
					fill_row(k, MD, &s, 1);
					fill_row(v, MD, &s, 0);
					rt_kv_head *h = &kv.heads[i];
					int32_t e = rt_kv_append(&kv, h, k, v, next_pos);
					model_entry *me = &lm[i].e[e];
					me->pos = next_pos;
					me->grp = -1;
					memset(me->kerr, 0, sizeof me->kerr);
					lm[i].n = e + 1;
					model_snapshot(&kv, h, &lm[i], e);
					memcpy(me->ktop, me->k, sizeof me->k);
				}
		} else if (op < 7) { /* set tiers: random wants, some upward (ignored) */
			for (int i = 0; i < NH; i++) {
				rt_kv_head *h = &kv.heads[i];
				uint8_t want[MCAP];
				int moved = 0;
				for (int e = 0; e < h->n; e++) {
					want[e] = (uint8_t)(rng(&s) % RT_KV_N_TIER);
					moved += want[e] > lm[i].e[e].tier;
				}
				model_groups_make(&lm[i], want);
				ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), moved);
				for (int e = 0; e < h->n; e++)
					if (want[e] > lm[i].e[e].tier)
						model_moved(&kv, h, &lm[i], e);
			}
		} else { /* keep or evict a random subset */
			for (int i = 0; i < NH; i++) {
				rt_kv_head *h = &kv.heads[i];
				int32_t keep[MCAP];
				int nk = 0;
				for (int e = 0; e < h->n; e++)
					if (rng(&s) % 3)
						keep[nk++] = e;
				for (int e = 0, j = 0; e < h->n; e++)
					if (j < nk && keep[j] == e)
						j++;
					else
						model_drop(&lm[i], e);
				static list_model nm;
				memset(&nm, 0, sizeof nm);
				memcpy(nm.g, lm[i].g, sizeof nm.g);
				if (op == 7) {
					rt_kv_head_keep(&kv, h, keep, nk);
					for (int j = 0; j < nk; j++)
						nm.e[j] = lm[i].e[keep[j]];
				} else {
					/* evict's placement: kept below nk stay, the rest fill the holes */
					int t = 0;
					for (int j = 0; j < nk; j++)
						t += keep[j] < nk;
					int src = t, k = 0;
					for (int j = 0; j < nk; j++) {
						if (k < t && keep[k] == j)
							nm.e[j] = lm[i].e[keep[k++]];
						else
							nm.e[j] = lm[i].e[keep[src++]];
					}
					rt_kv_head_evict(&kv, h, keep, nk);
				}
				nm.n = nk;
				lm[i] = nm;
			}
		}
		check_store(&kv, lm, &pool);
	}
	rt_kv_reset(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
	ck_assert_int_eq(rt_kv_bytes_held(&kv), 0);
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 0);
	free(lm);
}
END_TEST

START_TEST(downgrade_frees_bytes_and_full_pool_refuses)
{
	rt_kvpool pool = { .limit = INT64_MAX };
	rt_kv kv;
	rt_err err;
	enum { N = 64 };
	ck_assert_int_eq(rt_kv_init_tiered(&kv, &pool, RT_KV_F16, 1, 1, 4, MD, N, 0, 0, &err), 0);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	unsigned s = 5;
	ck_assert_int_eq(rt_kv_reserve(&kv, N, &err), 0);
	for (int i = 0; i < N; i++) {
		float k[MD], v[MD];
		fill_row(k, MD, &s, 1);
		fill_row(v, MD, &s, 0);
		rt_kv_append(&kv, h, k, v, i);
	}
	/* metadata 4 blocks × 16 × 23 bytes; top arena 4 blocks × 16 × (256 + 4) */
	const int64_t meta = 4 * 16 * 23, top = 4 * 16 * 260, kgb = 16 * (256 + 4);
	ck_assert_int_eq(rt_kv_bytes_held(&kv), meta + top);
	uint8_t want[N];
	memset(want, RT_KV_TIER_Q4, N);
	/* limits that cannot hold the key-group block, or the q4 arena beside the top one and
	 * the key groups: refused, nothing changed (the groups made are undone) */
	const int64_t lim[2] = { meta + top + 16 * 76, meta + top + kgb + 16 * 76 };
	for (int k = 0; k < 2; k++) {
		rt_kvpool_set_limit(&pool, lim[k]);
		ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), -1);
		ck_assert_ptr_nonnull(strstr(err.msg, "KV pool exhausted"));
		ck_assert_int_eq(h->tier[0], RT_KV_TIER_TOP);
		ck_assert_int_eq(h->kgrp[0], -1);
		ck_assert_int_eq(rt_kv_kgroups(&kv), 0);
		ck_assert_int_eq(rt_kv_bytes_held(&kv), meta + top);
		ck_assert_int_eq(rt_kvpool_get(&pool).used, meta + top);
	}
	rt_kvpool_set_limit(&pool, INT64_MAX);
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), N);
	/* every top block returned: the q4 arena (rows 32 + 40, owner 4) and one block of key
	 * groups (one group: positions 0..63) */
	ck_assert_int_eq(rt_kv_kgroups(&kv), 1);
	ck_assert_int_eq(rt_kv_bytes_held(&kv), meta + 4 * 16 * 76 + kgb);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, meta + 4 * 16 * 76 + kgb);
	ck_assert_int_eq(rt_kvbytes_held(&kv), N * 72 + 256);
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
}
END_TEST

/* ---- attention over the stored, dequantised entries --------------------------------------- */

typedef struct obs_check {
	const rt_kv *kv;
	double max_err;
	int calls;
} obs_check;

/* out == Σ_i p_i · value_i over the dequantised values, for each query head of the group */
static void obs_fn(void *u, const rt_attn_view *v)
{
	obs_check *o = u;
	float buf[64];
	for (int g = 0; g < v->group; g++)
		for (int c = 0; c < v->head_dim; c++) {
			double acc = 0, mag = 0;
			for (int i = 0; i < v->n_entries; i++) {
				const float *val = rt_kv_value(o->kv, v->head, i, buf);
				acc += (double)v->probs[(size_t)g * v->probs_ld + i] * val[c];
				mag += fabs((double)v->probs[(size_t)g * v->probs_ld + i] * val[c]);
			}
			double e = fabs(acc - v->out[(size_t)g * v->head_dim + c]) / (mag + 1e-6);
			o->max_err = e > o->max_err ? e : o->max_err;
		}
	o->calls++;
}

START_TEST(attention_over_dequantised_entries)
{
	/* _i: 0 exact 9/3, 1 exact 4/1, 2 fast (threads) 9/3, 3 fast 4/1; head_dim 32 */
	const int shape = _i % 2, fast = _i / 2;
	rt_model_opts mo = { .exact = !fast, .threads = fast ? 2 : 0 };
	rt_err err = { "" };
	rt_model *m = tiny_model_open_gqa(shape, 77u + (uint32_t)_i, &mo, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	const rt_model_hparams c = m->hp;
	enum { P = 60, T = 3 };
	int32_t tok[P + T];
	unsigned s = 3u + (unsigned)_i;
	for (int i = 0; i < P + T; i++)
		tok[i] = (int32_t)(rng(&s) % (unsigned)c.n_vocab);
	const enum rt_kv_type top = fast ? RT_KV_F16 : RT_KV_F32;
	rt_kv kv, ref, full;
	rt_fwd f, fr;
	ck_assert_int_eq(rt_kv_init_tiered(&kv, NULL, top, c.n_layer, c.n_head_kv,
	                                   c.n_head / c.n_head_kv, 32, P + T, 0, 0, &err), 0);
	ck_assert_int_eq(rt_kv_init_typed(&ref, NULL, RT_KV_F32, c.n_layer, c.n_head_kv,
	                                  c.n_head / c.n_head_kv, 32, P + T, 0, 0, &err), 0);
	ck_assert_int_eq(rt_kv_init_typed(&full, NULL, top, c.n_layer, c.n_head_kv,
	                                  c.n_head / c.n_head_kv, 32, P + T, 0, 0, &err), 0);
	/* chunk 8: below the narrow types' decode threshold, so the tiered scratch is made lazily */
	ck_assert_int_eq(rt_fwd_init(&f, m, 8, P + T, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&fr, m, 8, P + T, &err), 0);
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, P, 0, NULL, RT_LOGITS_NONE, &err), 0);
	ck_assert_int_eq(rt_model_forward(&fr, &full, tok, P, 0, NULL, RT_LOGITS_NONE, &err), 0);
	/* per head: tiers by position pattern, then evict a head-dependent subset */
	for (int i = 0; i < c.n_layer * c.n_head_kv; i++) {
		rt_kv_head *h = &kv.heads[i];
		uint8_t want[P];
		for (int e = 0; e < h->n; e++)
			want[e] = (uint8_t)(e < 4 || e >= P - 8 ? RT_KV_TIER_TOP : 1 + (e * 7 + i) % (RT_KV_N_TIER - 1));
		ck_assert_int_gt(rt_kv_head_set_tiers(&kv, h, want, &err), 0);
		int32_t keep[P];
		int nk = 0;
		for (int e = 0; e < h->n; e++)
			if ((e * (i + 2)) % 5 < 4)
				keep[nk++] = e;
		rt_kv_head_evict(&kv, h, keep, nk);
		/* the dense reference: an f32 store of the kept entries as they read back */
		rt_kv_head *hr = &ref.heads[i];
		for (int e = 0; e < h->n; e++) {
			float kb[32], vb[32];
			rt_kv_append(&ref, hr, rt_kv_key(&kv, h, e, kb), rt_kv_value(&kv, h, e, vb), h->pos[e]);
		}
	}
	obs_check oc = { .kv = &kv };
	f.observe = obs_fn; /* not parallel-safe: the heads of this step run in order */
	f.observe_user = &oc;
	float *lg = malloc((size_t)T * c.n_vocab * sizeof *lg), *lr = malloc((size_t)T * c.n_vocab * sizeof *lr);
	float *lf = malloc((size_t)T * c.n_vocab * sizeof *lf);
	/* one token, then a chunk of two */
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok + P, 1, P, lg, RT_LOGITS_ALL, &err), 0);
	f.observe = NULL; /* the fast path's KV heads in parallel from here */
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok + P + 1, 2, P + 1, lg + c.n_vocab, RT_LOGITS_ALL,
	                                  &err), 0);
	ck_assert_int_eq(rt_model_forward(&fr, &ref, tok + P, 1, P, lr, RT_LOGITS_ALL, &err), 0);
	ck_assert_int_eq(rt_model_forward(&fr, &ref, tok + P + 1, 2, P + 1, lr + c.n_vocab,
	                                  RT_LOGITS_ALL, &err), 0);
	ck_assert_int_eq(rt_model_forward(&fr, &full, tok + P, T, P, lf, RT_LOGITS_ALL, &err), 0);
	double d = 0, dfull = 0, mx = 0;
	for (size_t i = 0; i < (size_t)T * c.n_vocab; i++) {
		d = fmax(d, fabs(lg[i] - lr[i]));
		dfull = fmax(dfull, fabs(lg[i] - lf[i]));
		mx = fmax(mx, fabs(lr[i]));
	}
	/* the new tokens' own rows are f16 in a fast tiered store and f32 in the reference */
	const double tol = fast ? 2e-3 * mx : 1e-5 * mx;
	ck_assert_msg(d <= tol, "tiered vs dense over the dequantised kept entries: %g (max %g)", d, mx);
	ck_assert_msg(dfull > 10 * tol, "tiers and eviction had no effect (%g)", dfull);
	ck_assert_int_eq(oc.calls, c.n_layer * c.n_head_kv);
	ck_assert_msg(oc.max_err <= 1e-5, "observe: out vs Σ p·v relative error %g", oc.max_err);
	free(lg), free(lr), free(lf);
	rt_fwd_free(&f);
	rt_fwd_free(&fr);
	rt_kv_free(&kv);
	rt_kv_free(&ref);
	rt_kv_free(&full);
	rt_model_free(m);
}
END_TEST

/* ---- a policy that sets tiers, through rt_seq ----------------------------------------- */

enum { PT_EVERY = 16, PT_KEEP_TOP = 8 };

static int pt_should(const struct kvp_ctx *ctx, const rt_kv *kv)
{
	(void)kv;
	return ctx->seen % PT_EVERY == 0;
}

static int32_t pt_next(const struct kvp_ctx *ctx, const rt_kv *kv)
{
	(void)kv;
	return (int32_t)(PT_EVERY - ctx->seen % PT_EVERY);
}

static size_t pt_scratch(const rt_kv *kv, int n_threads)
{
	(void)n_threads; /* its compress works on the calling thread */
	return (size_t)kv->cap;
}

/* every entry but the newest PT_KEEP_TOP of each head to q4 */
static int pt_compress(const struct kvp_ctx *ctx, rt_kv *kv, rt_err *err)
{
	uint8_t *want = ctx->scratch;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++) {
		rt_kv_head *h = &kv->heads[i];
		for (int e = 0; e < h->n; e++)
			want[e] = h->n - e > PT_KEEP_TOP ? RT_KV_TIER_Q4 : RT_KV_TIER_TOP;
		if (rt_kv_head_set_tiers(kv, h, want, err) < 0)
			return -1;
	}
	return 0;
}

static const struct kvp_policy tier_policy = {
	.abi_version = KVP_ABI_VERSION, .name = "q4_tail", .source = "test", .source_hash = "0",
	.needs = KVP_NEED_TIERS, .should_compress = pt_should, .compress = pt_compress,
	.next_trigger = pt_next, .scratch_bytes = pt_scratch,
};

START_TEST(policy_needs_tiers_through_seq)
{
	const int exact = _i;
	rt_model_opts mo = { .exact = exact, .kv_type = exact ? RT_KV_F32 : RT_KV_F16 };
	rt_err err = { "" };
	rt_model *m = tiny_model_open_gqa(1, 5u, &mo, &err); /* 4 query / 1 KV head */
	ck_assert_msg(m != NULL, "%s", err.msg);
	const rt_model_hparams c = m->hp;
	enum { N = 40 };
	int32_t tok[N];
	unsigned s = 11;
	for (int i = 0; i < N; i++)
		tok[i] = (int32_t)(rng(&s) % (unsigned)c.n_vocab);
	rt_seq q;
	ck_assert_msg(rt_seq_init(&q, m, &tier_policy, N, 8, -1, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(q.kv.tiered, 1);
	ck_assert_int_eq(q.kv.type, exact ? RT_KV_F32 : RT_KV_F16);
	float *lg = malloc((size_t)N * c.n_vocab * sizeof *lg);
	ck_assert_msg(rt_seq_feed(&q, tok, N, lg, RT_LOGITS_ALL, &err) == 0, "%s", err.msg);
	for (size_t i = 0; i < (size_t)N * c.n_vocab; i++)
		ck_assert(isfinite(lg[i]));
	/* the last compress ran at 32 tokens: entries 0..23 at q4, the rest at the top */
	const rt_kv_head *h = rt_kv_head_at(&q.kv, 1, 0);
	ck_assert_int_eq(h->n, N);
	for (int e = 0; e < N; e++)
		ck_assert_int_eq(h->tier[e], e < 32 - PT_KEEP_TOP ? RT_KV_TIER_Q4 : RT_KV_TIER_TOP);
	const int64_t top_row = exact ? 128 : 64; /* head_dim 32 in f32 / f16 */
	/* q4 at head_dim 32: key codes 16 bytes, value 4 + 16; two key groups of 4 · 32 bytes
	 * per head: block 0 fitted at 16 tokens on entries 0..15, and entries 16..31, appended
	 * after that fit, at 32 tokens */
	ck_assert_int_eq(rt_kv_kgroups(&q.kv), 2 * c.n_layer);
	ck_assert_int_eq(rt_kvbytes_held(&q.kv),
	                 c.n_layer * (24 * (16 + 20) + 16 * 2 * top_row + 2 * 128));
	free(lg);
	rt_seq_free(&q);
	rt_model_free(m);
	/* refusals when the run is configured */
	rt_kv kv;
	struct rt_run r;
	ck_assert_int_eq(rt_run_init_typed(&r, &kv, RT_KV_Q8_0, &tier_policy, 1, 1, 4, 64, 16, -1, &err),
	                 -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "top tier is f16 or f32"));
	ck_assert_int_eq(rt_run_init_typed(&r, &kv, RT_KV_F16, &tier_policy, 1, 1, 4, 48, 16, -1, &err),
	                 -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "head_dim 48"));
	struct kvp_policy both = tier_policy;
	both.needs |= KVP_NEED_F32_KV;
	ck_assert_int_eq(rt_run_init_typed(&r, &kv, RT_KV_F32, &both, 1, 1, 4, 64, 16, -1, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "cannot do both"));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kvtier");
	TCase *tc = tcase_create("tiers");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, round_trip_per_tier);
	tcase_add_test(tc, channel_codes_by_hand);
	tcase_add_test(tc, set_keys_refits_groups);
	tcase_add_loop_test(tc, random_mix_against_model, 0, 2);
	tcase_add_test(tc, downgrade_frees_bytes_and_full_pool_refuses);
	tcase_add_loop_test(tc, attention_over_dequantised_entries, 0, 4);
	tcase_add_loop_test(tc, policy_needs_tiers_through_seq, 0, 2);
	suite_add_tcase(s, tc);
	int failed = check_run(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
