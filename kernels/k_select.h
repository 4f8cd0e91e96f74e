/*
 * k_select: deterministic top-k selection of cache entries by score — the kernel every
 * compress ends in. Ranking is a total order: higher score first, then LOWER position
 * (the project's tie rule, docs/architecture.md "The KV store"), then lower index (and, across heads, the
 * lower head); NaN ranks below every number. Because the order is total the result does
 * not depend on the algorithm that finds it. k_select_topk, run on every head at every
 * compress (once per decode step for a per-step policy), does O(n) work: a few linear scans
 * for the worst candidates when only a few leave (one eviction per step), otherwise a
 * selection (Hoare's quickselect, median-of-three pivots, an O(n log n) merge sort of the
 * remaining range after 2·log2(n) + 8 partition rounds, so the worst case stays O(n log n))
 * that moves the k best candidates in front without ordering them. No allocation: the
 * caller passes the buffers. The CUDA version (k_select.cuh) uses the same key. CPU
 * reference for tests: k_select_ref_rank (O(n^2) rank counting).
 */
#ifndef K_SELECT_H
#define K_SELECT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* One candidate: its score, position (tokens), index in its head and head number. */
struct k_cand {
	float score;
	int32_t pos;
	int32_t idx;
	int32_t head;
};

/* 1 if a ranks strictly before b (a is kept first). */
static inline int k_cand_before(const struct k_cand *a, const struct k_cand *b)
{
	int an = isnan(a->score), bn = isnan(b->score);
	if (an != bn)
		return bn; /* a number ranks before NaN */
	if (!an && a->score != b->score)
		return a->score > b->score;
	if (a->pos != b->pos)
		return a->pos < b->pos;
	if (a->head != b->head)
		return a->head < b->head;
	return a->idx < b->idx;
}

/* Sort c[0..n) into rank order; tmp is [n] scratch. */
static inline void k_cand_sort(struct k_cand *c, int64_t n, struct k_cand *tmp)
{
	struct k_cand *src = c, *dst = tmp;
	for (int64_t width = 1; width < n; width *= 2) {
		for (int64_t lo = 0; lo < n; lo += 2 * width) {
			int64_t mid = lo + width < n ? lo + width : n;
			int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
			int64_t i = lo, j = mid, k = lo;
			while (i < mid && j < hi)
				dst[k++] = k_cand_before(&src[j], &src[i]) ? src[j++] : src[i++];
			while (i < mid)
				dst[k++] = src[i++];
			while (j < hi)
				dst[k++] = src[j++];
		}
		struct k_cand *t = src;
		src = dst;
		dst = t;
	}
	if (src != c)
		memcpy(c, src, (size_t)n * sizeof *c);
}

/* Reorder c[0..n) so that c[0..k) are the k candidates that rank first (in no particular
 * order) and c[k..n) the rest, 0 <= k <= n; tmp is [n] scratch for the fallback sort. */
static inline void k_cand_select(struct k_cand *c, int64_t n, int64_t k, struct k_cand *tmp)
{
	int64_t lo = 0, hi = n; /* [0, lo) ranks before [lo, n); [0, hi) before [hi, n) */
	int rounds = 8;
	for (int64_t m = n; m > 1; m /= 2)
		rounds += 2;
	while (lo < k && k < hi) {
		if (hi - lo <= 16 || rounds-- == 0) {
			k_cand_sort(c + lo, hi - lo, tmp);
			return;
		}
		const int64_t mid = lo + (hi - lo) / 2;
		const struct k_cand *a = &c[lo], *b = &c[mid], *d = &c[hi - 1];
		const struct k_cand p = *(k_cand_before(a, b) ?
		        (k_cand_before(b, d) ? b : k_cand_before(a, d) ? d : a) :
		        (k_cand_before(a, d) ? a : k_cand_before(b, d) ? d : b));
		/* Lomuto partition around p: [lo, i) rank before p, c[i] = p, (i, hi) after it
		 * (the order is total and strict, so p is the only candidate equal to itself) */
		int64_t i = lo;
		for (int64_t j = lo; j < hi; j++)
			if (k_cand_before(&c[j], &p)) {
				struct k_cand t = c[i];
				c[i++] = c[j];
				c[j] = t;
			}
		for (int64_t j = i; j < hi; j++)
			if (!k_cand_before(&p, &c[j])) { /* p itself */
				c[j] = c[i];
				c[i] = p;
				break;
			}
		if (k <= i)
			hi = i;
		else
			lo = i + 1;
	}
}

/* The rank order of one head's candidates as one integer: (score, position) ->
 * a key that is smaller the worse the candidate ranks (lower score, NaN lowest, -0 equal
 * to +0; then higher position). Equal keys are broken by the index (higher is worse). */
static inline uint64_t k_rank_key(float score, int32_t pos)
{
	uint32_t u;
	memcpy(&u, &score, sizeof u);
	const uint32_t neg = (uint32_t)((int32_t)u >> 31); /* all ones for a negative sign */
	u ^= neg | 0x80000000u;           /* IEEE order as unsigned order */
	u = score == 0.0f ? 0x80000000u : u; /* -0 ranks as +0 */
	u = score != score ? 0u : u;      /* NaN below every number (no branch: both cmov) */
	const uint32_t p = ~((uint32_t)pos ^ 0x80000000u);
	return (uint64_t)u << 32 | p;
}

/* Mark the k best candidates of one head: keep[0..n) is overwritten with 1 for the top k
 * of the entries i with cand[i] != 0 by (score desc, pos asc, index asc), 0 for every other
 * entry. score [n], pos [n]; buf and tmp are [n] scratch. Returns the number marked
 * (min(k, candidates), 0 when k <= 0). */
static inline int32_t k_select_topk(const float *score, const int32_t *pos, const uint8_t *cand,
                                    int32_t n, int32_t k, uint8_t *keep, struct k_cand *buf,
                                    struct k_cand *tmp)
{
	int32_t m = 0;
	for (int32_t i = 0; i < n; i++)
		m += cand[i] != 0;
	for (int32_t i = 0; i < n; i++)
		keep[i] = cand[i] != 0;
	if (m - k <= 8 && k > 0) {
		/* every candidate, or all but a few (one eviction per step): drop the worst
		 * m - k by linear scans for the least rank key, O(n (m - k)) and no copy */
		for (int32_t e = 0; e < m - k; e++) {
			uint64_t wk = UINT64_MAX;
			int32_t wi = -1;
			for (int32_t i = 0; i < n; i++) {
				if (!keep[i])
					continue;
				const uint64_t x = k_rank_key(score[i], pos[i]);
				if (x <= wk) { /* on equal keys the later (higher) index ranks worse */
					wk = x;
					wi = i;
				}
			}
			keep[wi] = 0;
		}
		return k < m ? k : m;
	}
	memset(keep, 0, (size_t)(n > 0 ? n : 0));
	if (k <= 0)
		return 0;
	m = 0;
	for (int32_t i = 0; i < n; i++)
		if (cand[i])
			buf[m++] = (struct k_cand){ score[i], pos[i], i, 0 };
	k_cand_select(buf, m, k, tmp);
	for (int32_t j = 0; j < k; j++)
		keep[buf[j].idx] = 1;
	return k;
}

/* Reference for tests: the rank (0 = best) of candidate i among c[0..n) by counting the
 * candidates that rank before it. O(n^2), independent of the sort. */
static inline int64_t k_select_ref_rank(const struct k_cand *c, int64_t n, int64_t i)
{
	int64_t r = 0;
	for (int64_t j = 0; j < n; j++)
		if (j != i && k_cand_before(&c[j], &c[i]))
			r++;
	return r;
}

#endif
