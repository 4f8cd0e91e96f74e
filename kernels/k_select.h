/*
 * k_select: deterministic top-k selection of cache entries by score — the kernel every
 * compress ends in. Ranking is a total order: higher score first, then LOWER position
 * (the project's tie rule, DESIGN.md section 4), then lower index (and, across heads, the
 * lower head); NaN ranks below every number. Because the order is total the result does
 * not depend on the sort algorithm; a bottom-up merge sort is used (O(n log n), no
 * allocation: the caller passes the buffers). The CUDA version (k_select.cuh) uses the
 * same key. CPU reference for tests: k_select_ref_rank (O(n^2) rank counting).
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

/* Mark the k best candidates of one head: among entries i in [0, n) with cand[i] != 0,
 * set keep[i] = 1 for the top k by (score desc, pos asc). score [n], pos [n]; buf and
 * tmp are [n] scratch. Returns the number marked (min(k, candidates)). */
static inline int32_t k_select_topk(const float *score, const int32_t *pos, const uint8_t *cand,
                                    int32_t n, int32_t k, uint8_t *keep, struct k_cand *buf,
                                    struct k_cand *tmp)
{
	int32_t m = 0;
	for (int32_t i = 0; i < n; i++)
		if (cand[i])
			buf[m++] = (struct k_cand){ score[i], pos[i], i, 0 };
	if (k <= 0)
		return 0;
	if (k >= m) {
		for (int32_t j = 0; j < m; j++)
			keep[buf[j].idx] = 1;
		return m;
	}
	if (m - k <= 8) {
		/* few to drop (one eviction per step): drop the worst m - k by linear scans,
		 * O(m (m - k)) instead of a sort; same total order, same result */
		for (int32_t j = 0; j < m; j++)
			keep[buf[j].idx] = 1;
		for (int32_t e = 0; e < m - k; e++) {
			int32_t worst = -1;
			for (int32_t j = 0; j < m; j++)
				if (keep[buf[j].idx] && (worst < 0 || k_cand_before(&buf[worst], &buf[j])))
					worst = j;
			keep[buf[worst].idx] = 0;
		}
		return k;
	}
	k_cand_sort(buf, m, tmp);
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
