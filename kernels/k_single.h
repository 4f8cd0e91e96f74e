/*
 * k_single: the singleton floor — the highest-value single entries of a region kept
 * exactly, charged before any prototype competes (GraceKV's singleton floor, arXiv
 * 2608.07001; docs/gracekv.md section 6). Value of entry t of head lg: ω_lg · R[lg, t]
 * rounded to float; ties keep the lower head, then the lower entry.
 *   each = 0: the `total` best of the region over ALL heads;
 *   each = 1: every head its own total / LG best (the first total mod LG heads one more),
 *             so a head with peaked relevance cannot take another head's floor.
 * Written as `keep singletons N entries` in a policy (docs/language.md). Nothing is
 * allocated; no errors.
 */
#ifndef K_SINGLE_H
#define K_SINGLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* One candidate of the floor. */
struct k_single_cand {
	float val;
	int32_t lg, e;
};

/* Higher value first, then the lower head, then the lower entry. */
static inline int k_single_cmp(const void *a, const void *b)
{
	const struct k_single_cand *x = a, *y = b;
	if (x->val != y->val)
		return x->val > y->val ? -1 : 1;
	if (x->lg != y->lg)
		return x->lg < y->lg ? -1 : 1;
	return (x->e > y->e) - (x->e < y->e);
}

/* Mark the floor of the region [a, b) of LG heads. R: [LG × stride] values per entry;
 * omega: [LG] head weights or NULL (1). mark: [LG × stride] bytes, 1 where an entry is
 * already kept (it is neither a candidate nor counted); the floor's entries become 1.
 * fc: [LG × (b - a)] candidates of scratch. */
static inline void k_single_floor(const float *R, size_t stride, int LG, int32_t a, int32_t b,
                                  const float *omega, int64_t total, int each, uint8_t *mark,
                                  struct k_single_cand *fc)
{
	if (total <= 0)
		return;
	int64_t nf = 0;
	for (int lg = 0; lg < LG; lg++) {
		const double om = omega ? omega[lg] : 1.0;
		if (each)
			nf = 0;
		for (int32_t t = a; t < b; t++)
			if (!mark[(size_t)lg * stride + t])
				fc[nf++] = (struct k_single_cand){ (float)(om * R[(size_t)lg * stride + t]), lg, t };
		if (!each)
			continue;
		int64_t q = total / LG + (lg < total % LG);
		qsort(fc, (size_t)nf, sizeof *fc, k_single_cmp);
		for (int64_t i = 0; i < q && i < nf; i++)
			mark[(size_t)lg * stride + fc[i].e] = 1;
	}
	if (each)
		return;
	qsort(fc, (size_t)nf, sizeof *fc, k_single_cmp);
	for (int64_t i = 0; i < total && i < nf; i++)
		mark[(size_t)fc[i].lg * stride + fc[i].e] = 1;
}

#endif
