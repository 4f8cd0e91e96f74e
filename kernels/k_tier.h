/*
 * k_tier: entry precision as a compress action — which storage tier every entry of a
 * (layer, KV head) list keeps (runtime/kv/rt_kv.h enum rt_kv_tier: 0 the store's own type,
 * then keys/values at 8/8, 8/4, 4/4 and 4/2 bits), or whether it is evicted. Two rules, both downgrade-only (an
 * entry already at a lower tier never goes back up: its precision is gone):
 *
 *   shares   (`precision = tiers(f16 = 25%, q8 = 25%, q4 = rest)`): the kept entries
 *            outside the guards, ranked by score (ties: the lower position), take the
 *            tiers in order, the first share at the first tier and so on (k_tier_shares);
 *            the entry count comes from the budget as for eviction (k_tier_share_cost
 *            turns a byte budget into entries).
 *   utility  (`precision = tiers(f16, q8, q4, q2)` with a budget in bytes): GraceKV's
 *            "every byte earns its place" (arXiv 2608.07001) applied to resolution: each
 *            entry is evicted or kept at one tier, chosen for every entry of a pool (a
 *            head, a layer or the whole cache) at once by utility per byte
 *            (k_tier_alloc). An entry of score s at tier t is worth u = s · F[t], where
 *            F is the tier's fidelity (below), and costs the tier's bytes. Every entry
 *            starts evicted (u = 0, no bytes); a binary max-heap (k_uheap.h) holds each
 *            entry's next step on its upgrade chain, keyed by the step's marginal utility
 *            per byte Δu / Δbytes; the best step is taken while the budget holds it (a
 *            step that does not fit is dropped and the entry stays where it is). The
 *            upgrade chain is the upper concave hull of the points (0, 0) and
 *            (bytes[t], F[t]) of the tiers the entry may take, so its marginal rates
 *            fall along the chain and the greedy takes an entry's steps in order: the
 *            classic greedy of the multiple-choice knapsack's LP relaxation.
 *
 * Fidelity F[t] = 1 − e_t, e_t the relative RMS error of a row coded at tier t, so F is
 * the share of the entry's contribution to the attention output that survives (eviction
 * loses all of it: e = 1, F = 0). The quantised tiers code values in groups of 32
 * channels of a token and keys in groups of 32 tokens of a channel (runtime/kv/rt_kv.h key
 * groups; KIVI, arXiv 2402.02750), each with an asymmetric min/max grid of 2^b levels: the
 * step is range / (2^b − 1), the rounding error is uniform with RMS step / √12, and the
 * expected range of 32 normal samples is 4.08 σ (the mean range of 32 normal samples),
 * so e_b = 4.08 / ((2^b − 1) √12) = 1.178 / (2^b − 1): e_8 = 0.0046, e_4 = 0.0785,
 * e_2 = 0.393. A tier whose keys and values differ in bits (k8v4, q2 = k4v2) takes the
 * larger error of its two halves. The top tier is exact for f32 and within 2^-11 for f16: 1.
 * So k8v4 has q4's fidelity at more bytes and is never on a utility chain that also
 * offers q4 (the row-error model does not see what 8-bit keys buy in the logits): it
 * serves shares and the per-layer and window limits of docs/language.md section 7.8.
 * On rows of normal values the store's codecs measure 1 − e = 0.9954, 0.9217, 0.6076
 * (tests/test_k_tier.c fidelity_measured). ORDER(tier): K_TIER_FIDELITY follows enum rt_kv_tier.
 *
 * Ties: the heap's order is total (k_uheap_before: higher rate, then the lower layer,
 * KV head, position, entry), so equal utilities keep the lower position. Nothing is
 * allocated: the caller passes the heap ([Σ entries] items) and the output arrays.
 */
#ifndef K_TIER_H
#define K_TIER_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "k_select.h"
#include "k_uheap.h"

/* Tiers of the store (RT_KV_N_TIER in runtime/kv/rt_kv.h) and the mark of an evicted
 * entry in the allocator's output. */
#define K_TIER_MAX 5
#define K_TIER_EVICT 0xffu

/* ORDER(tier): fidelity of top, q8, k8v4, q4, q2 (see the top): 1 − the larger of the key
 * and the value error, e_8, e_4 (k8v4's 4-bit values), e_4, e_2 (q2's 2-bit values). */
#define K_TIER_FIDELITY { 1.0, 0.9954, 0.9215, 0.9215, 0.6073 }

/* One entry's upgrade chain: the points of the upper concave hull after (0, 0), cheapest
 * first: tier[j] with its increments dc[j] (bytes) and df[j] (fidelity) from point j − 1
 * (point −1 = evicted). */
struct k_tier_menu {
	int n;
	uint8_t tier[K_TIER_MAX];
	double dc[K_TIER_MAX], df[K_TIER_MAX];
};

/* The chain of an entry now at tier cur that may take the tiers t >= cur whose bit is set
 * in allowed, tier t costing bytes[t] (> 0) and worth fid[t] (in [0, 1]) per unit of score.
 * A tier that costs more than another allowed one and is worth no more is never on the
 * chain; collinear points stay (a finer step at the same rate). */
static inline void k_tier_menu_make(const double *bytes, const double *fid, unsigned allowed,
                                    int cur, struct k_tier_menu *m)
{
	int cand[K_TIER_MAX], nc = 0;
	for (int t = cur; t < K_TIER_MAX; t++)
		if (allowed >> t & 1u)
			cand[nc++] = t;
	/* by cost, then by fidelity (insertion sort of at most 4) */
	for (int a = 1; a < nc; a++)
		for (int b = a; b > 0; b--) {
			int x = cand[b - 1], y = cand[b];
			if (bytes[y] < bytes[x] || (bytes[y] == bytes[x] && fid[y] > fid[x])) {
				cand[b - 1] = y;
				cand[b] = x;
			}
		}
	int st[K_TIER_MAX + 1], ns = 0; /* the hull so far: st[0] = -1 is (0, 0) */
	st[ns++] = -1;
	for (int a = 0; a < nc; a++) {
		int t = cand[a];
		double c = bytes[t], f = fid[t];
		double pc = ns > 1 ? bytes[st[ns - 1]] : 0, pf = ns > 1 ? fid[st[ns - 1]] : 0;
		if (f <= pf || c <= pc)
			continue; /* dominated: more bytes for no more fidelity */
		/* pop the last point while it lies below the segment to (c, f) */
		while (ns > 1) {
			int b = st[ns - 1];
			double ac = ns > 2 ? bytes[st[ns - 2]] : 0, af = ns > 2 ? fid[st[ns - 2]] : 0;
			double s1 = (fid[b] - af) / (bytes[b] - ac), s2 = (f - fid[b]) / (c - bytes[b]);
			if (!(s2 > s1 * (1 + 1e-12)))
				break; /* on or above the segment (collinear within rounding: kept) */
			ns--;
		}
		st[ns++] = t;
	}
	m->n = ns - 1;
	for (int j = 0; j < m->n; j++) {
		int t = st[j + 1];
		double pc = j > 0 ? bytes[st[j]] : 0, pf = j > 0 ? fid[st[j]] : 0;
		m->tier[j] = (uint8_t)t;
		m->dc[j] = bytes[t] - pc;
		m->df[j] = fid[t] - pf;
	}
}

/* The entries of one pool of heads, for k_tier_alloc. Entry i of head h (0 <= h < n_head,
 * 0 <= i < n[h]) is element h·stride + i of score, cand, cur and out. */
struct k_tier_pool {
	int n_head;
	int32_t stride;
	const int32_t *n;             /* [n_head] entries per head */
	const float *score;           /* utilities; a negative score or NaN counts as 0 */
	const uint8_t *cand;          /* 1: competes; 0: not touched (a guard, kept as it is) */
	const uint8_t *cur;           /* the entry's tier now (enum rt_kv_tier) */
	const int32_t *const *pos;    /* [n_head] → [n[h]] positions (the tie rule) */
	const int32_t *layer, *kv_head; /* [n_head] for the heap's order */
	const uint8_t *lim;           /* NULL, or the lowest tier each entry may take (a tiers()
	                                 window or edge layer, k_tier_limit_allowed); K_TIER_MAX:
	                                 no limit */
};

/* The tiers an entry now at tier cur, limited to tier lim (K_TIER_MAX: no limit), may take
 * out of `allowed`: the allowed tiers at or above lim, and lim itself (a window or edge
 * layer holds its entries at a tier the list may not name: `tiers(q4 = rest, window = 64)`
 * keeps the window at the top). An entry already below its limit (cur > lim) keeps the
 * tiers it has. */
static inline unsigned k_tier_limit_allowed(unsigned allowed, int cur, int lim)
{
	if (lim >= K_TIER_MAX || cur > lim)
		return allowed;
	return (allowed & ((2u << lim) - 1u)) | 1u << lim;
}

/* The chain of entry e of pool p out of k_tier_alloc's menus [cur][lim]. */
static inline const struct k_tier_menu *k_tier_menu_of(const struct k_tier_pool *p,
                                                       const struct k_tier_menu (*menu)[K_TIER_MAX + 1],
                                                       size_t e)
{
	const int cur = p->cur[e] < K_TIER_MAX ? p->cur[e] : 0;
	const int lim = p->lim && p->lim[e] < K_TIER_MAX ? p->lim[e] : K_TIER_MAX;
	return &menu[cur][lim];
}

/* Choose evict-or-tier for every candidate of pool p within `budget` bytes by utility per
 * byte (see the top), each entry among the tiers k_tier_limit_allowed leaves it (p->lim):
 * out[h·stride + i] = the tier (>= cur: downgrade only) or K_TIER_EVICT
 * for candidates; non-candidates are not written. bytes[t] (> 0): bytes of one entry at
 * tier t; fid: K_TIER_FIDELITY or the caller's; allowed: bit t set when tier t may be
 * given. heap: [Σ n[h]] items of scratch. Returns the bytes the candidates take. An entry
 * with a zero score still takes leftover bytes (its rate 1e-30 · ΔF / Δbytes follows the
 * chain), cheapest tier first, lower positions first. */
static inline double k_tier_alloc(const struct k_tier_pool *p, const double *bytes,
                                  const double *fid, unsigned allowed, double budget,
                                  uint8_t *out, struct k_uheap_item *heap)
{
	/* menu[cur][lim]: the chain of an entry at tier cur limited to lim (K_TIER_MAX: none) */
	struct k_tier_menu menu[K_TIER_MAX][K_TIER_MAX + 1];
	for (int t = 0; t < K_TIER_MAX; t++)
		for (int l = 0; l <= K_TIER_MAX; l++)
			if (l == K_TIER_MAX || p->lim)
				k_tier_menu_make(bytes, fid, k_tier_limit_allowed(allowed, t, l), t, &menu[t][l]);
	int64_t total = 0;
	for (int h = 0; h < p->n_head; h++)
		total += p->n[h];
	struct k_uheap hp = { heap, 0, (int32_t)(total < INT32_MAX ? total : INT32_MAX) };
	/* level of entry e on its chain: out[e] holds it while the heap runs (K_TIER_EVICT =
	 * not yet kept), the tier is written at the end */
	for (int h = 0; h < p->n_head; h++)
		for (int32_t i = 0; i < p->n[h]; i++) {
			size_t e = (size_t)h * p->stride + i;
			if (!p->cand[e])
				continue;
			out[e] = K_TIER_EVICT;
			const struct k_tier_menu *m = k_tier_menu_of(p, menu, e);
			if (m->n == 0)
				continue;
			double s = p->score[e] > 0 ? (double)p->score[e] : 0.0;
			struct k_uheap_item it = { (s + 1e-30) * m->df[0] / m->dc[0], p->layer[h],
			                           p->kv_head[h], p->pos[h][i], (int32_t)e };
			k_uheap_push(&hp, &it);
		}
	double left = budget, used = 0;
	struct k_uheap_item it;
	while (k_uheap_pop(&hp, &it)) {
		size_t e = (size_t)it.id;
		const struct k_tier_menu *m = k_tier_menu_of(p, menu, e);
		int j = out[e] == K_TIER_EVICT ? 0 : out[e] + 1;
		if (m->dc[j] > left)
			continue; /* does not fit: the entry stays at its level */
		left -= m->dc[j];
		used += m->dc[j];
		out[e] = (uint8_t)j;
		if (j + 1 < m->n) {
			double s = p->score[e] > 0 ? (double)p->score[e] : 0.0;
			it.u = (s + 1e-30) * m->df[j + 1] / m->dc[j + 1];
			k_uheap_push(&hp, &it);
		}
	}
	for (int h = 0; h < p->n_head; h++)
		for (int32_t i = 0; i < p->n[h]; i++) {
			size_t e = (size_t)h * p->stride + i;
			if (p->cand[e] && out[e] != K_TIER_EVICT)
				out[e] = k_tier_menu_of(p, menu, e)->tier[out[e]];
		}
	return used;
}

/* Shares: the tiers of one head's kept entries. Of the n entries, those with kept[i] set
 * (the selection, guards excluded) are ranked by score (ties: the lower position; buf and
 * tmp: [n] scratch); rank r of m takes tier[j] for the first j with r < round(cum[j] · m),
 * cum the cumulative shares (cum[n_tier − 1] = 1), and never a tier above its current one:
 * want[i] = max(tier[j], cur[i]). want is written for the kept entries only. */
static inline void k_tier_shares(const float *score, const int32_t *pos, const uint8_t *kept,
                                 const uint8_t *cur, int32_t n, const uint8_t *tier,
                                 const double *cum, int n_tier, uint8_t *want,
                                 struct k_cand *buf, struct k_cand *tmp)
{
	int32_t m = 0;
	for (int32_t i = 0; i < n; i++)
		if (kept[i])
			buf[m++] = (struct k_cand){ score[i], pos[i], i, 0 };
	k_cand_sort(buf, m, tmp);
	int j = 0;
	for (int32_t r = 0; r < m; r++) {
		while (j < n_tier - 1 && (double)r >= floor(cum[j] * m + 0.5))
			j++;
		int32_t i = buf[r].idx;
		want[i] = tier[j] > cur[i] ? tier[j] : cur[i];
	}
}

/* Shares under a limit: the tier an entry wanting tier want (by its share), now at cur and
 * limited to lim (K_TIER_MAX: none), takes: lim when want lies below it, never above cur
 * (downgrade only). */
static inline int k_tier_limit_want(int want, int cur, int lim)
{
	const int w = want > lim ? lim : want;
	return w > cur ? w : cur;
}

/* Bytes per entry, on average, of the shares' mix: Σ_j (cum[j] − cum[j − 1]) · bytes[tier[j]]
 * (what a byte budget buys per kept entry outside the guards). */
static inline double k_tier_share_cost(const uint8_t *tier, const double *cum, int n_tier,
                                       const double *bytes)
{
	double c = 0, prev = 0;
	for (int j = 0; j < n_tier; j++) {
		c += (cum[j] - prev) * bytes[tier[j]];
		prev = cum[j];
	}
	return c;
}

#endif
