/*
 * k_uheap: the utility heap of GraceKV's Add/Split competition (arXiv 2608.07001;
 * docs/gracekv.md section 6): a binary max-heap of actions keyed by utility per entry
 * u = Δ / cost, over every (layer, KV head) of the model. The order is total, so the pop
 * sequence does not depend on the heap's shape: higher u first (NaN counts as -inf), then
 * the lower layer, KV head, first position covered and payload id. The caller owns the
 * array; nothing is allocated.
 */
#ifndef K_UHEAP_H
#define K_UHEAP_H

#include <math.h>
#include <stdint.h>

#include "base/rt_util.h"

struct k_uheap_item {
	double u;           /* utility per entry Δ/c (NaN counts as -inf) */
	int32_t layer, kv_head;
	int32_t pos;        /* first position covered by the action's node */
	int32_t id;         /* caller's payload (action index); last tie-breaker */
};

struct k_uheap {
	struct k_uheap_item *a; /* [cap], the caller's */
	int32_t n, cap;
};

/* 1 when x pops before y (see the top). */
static inline int k_uheap_before(const struct k_uheap_item *x, const struct k_uheap_item *y)
{
	double ux = isnan(x->u) ? -INFINITY : x->u, uy = isnan(y->u) ? -INFINITY : y->u;
	if (ux != uy)
		return ux > uy;
	if (x->layer != y->layer)
		return x->layer < y->layer;
	if (x->kv_head != y->kv_head)
		return x->kv_head < y->kv_head;
	if (x->pos != y->pos)
		return x->pos < y->pos;
	return x->id < y->id;
}

/* Push it (asserts room). */
static inline void k_uheap_push(struct k_uheap *h, const struct k_uheap_item *it)
{
	RT_ASSERT(h->n < h->cap);
	int32_t i = h->n++;
	while (i > 0) {
		int32_t p = (i - 1) / 2;
		if (!k_uheap_before(it, &h->a[p]))
			break;
		h->a[i] = h->a[p];
		i = p;
	}
	h->a[i] = *it;
}

/* Pop the best into *out: 1, or 0 when the heap is empty. */
static inline int k_uheap_pop(struct k_uheap *h, struct k_uheap_item *out)
{
	if (h->n == 0)
		return 0;
	*out = h->a[0];
	struct k_uheap_item last = h->a[--h->n];
	int32_t i = 0;
	for (;;) {
		int32_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && k_uheap_before(&h->a[c + 1], &h->a[c]))
			c++;
		if (!k_uheap_before(&h->a[c], &last))
			break;
		h->a[i] = h->a[c];
		i = c;
	}
	if (h->n > 0)
		h->a[i] = last;
	return 1;
}

#endif
