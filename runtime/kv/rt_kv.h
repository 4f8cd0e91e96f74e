/*
 * rt_kv: the KV store. One ragged entry list per (layer, KV head) — never per query
 * head (the GQA trap) — holding post-RoPE keys, values, the original position of each
 * entry, the number of tokens it represents (n >= 1; merged prototypes have n > 1, and
 * attention adds log n to the entry's logit), a protected-span id, and the policy's
 * per-entry statistics. Different KV heads may hold different entries and lengths.
 *
 * Memory: one allocation per sequence at its capacity (entries per head), made by
 * rt_kv_init; eviction is an in-place gather (rt_kv_head_keep); nothing is allocated per
 * token. See DESIGN.md section 4.
 */
#ifndef RT_KV_H
#define RT_KV_H

#include <stddef.h>
#include <stdint.h>

#include "base/rt_util.h"

typedef struct rt_kv_head {
	int32_t n;          /* entries in use, 0..cap */
	int32_t cap;        /* capacity in entries (same for every head of an rt_kv) */
	float *k;           /* [cap × head_dim] keys, RoPE applied at pos */
	float *v;           /* [cap × head_dim] values */
	int32_t *pos;       /* [cap] original position (tokens from the start of the text) */
	float *count;       /* [cap] tokens represented, >= 1 */
	float *log_count;   /* [cap] log(count), the additive attention-logit bias */
	uint16_t *span;     /* [cap] protected span id, 0 = none */
	uint8_t *stats;     /* [cap × stat_bytes] policy statistics, zeroed on append */
	uint8_t *state;     /* [state_bytes] per-head policy state, zeroed at reset */
} rt_kv_head;

typedef struct rt_kv {
	int n_layer;        /* transformer layers */
	int n_kv_head;      /* KV heads per layer */
	int group;          /* query heads per KV head (GQA group size) */
	int head_dim;       /* values per key/value vector */
	int32_t cap;        /* entries per head */
	size_t stat_bytes;  /* per-entry policy statistics, bytes */
	size_t state_bytes; /* per-head policy state, bytes */
	rt_kv_head *heads;  /* [n_layer × n_kv_head], index layer * n_kv_head + kv_head */
	void *mem;          /* the single allocation behind every array above */
	size_t mem_bytes;
} rt_kv;

/* Allocate a store for n_layer × n_kv_head heads of capacity cap entries. Fails (returns
 * -1, sets err) on non-positive shapes or a size that overflows or cannot be allocated;
 * kv is then zeroed and safe to rt_kv_free. */
int rt_kv_init(rt_kv *kv, int n_layer, int n_kv_head, int group, int head_dim, int32_t cap,
               size_t stat_bytes, size_t state_bytes, rt_err *err);
void rt_kv_free(rt_kv *kv);

/* Empty every head (n = 0) and zero policy state; keeps the allocation. */
void rt_kv_reset(rt_kv *kv);

/* The entry list of (layer, kv_head). Asserts the indices are in range. */
rt_kv_head *rt_kv_head_at(rt_kv *kv, int layer, int kv_head);

/* Append one entry (count 1, span 0, zeroed statistics) holding key k[head_dim] and value
 * v[head_dim] at original position pos. Returns its index. Asserts n < cap: the caller
 * (the runtime's chunk planner) guarantees room before it runs attention. */
int32_t rt_kv_append(rt_kv *kv, rt_kv_head *h, const float *k, const float *v, int32_t pos);

/* Keep exactly the entries keep[0..n_keep) (strictly increasing indices into the head),
 * in that order, by an in-place gather of every per-entry array; the rest are evicted.
 * Asserts the indices are valid and sorted. */
void rt_kv_head_keep(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep);

/* Entries in use over all heads, and the bytes they occupy (keys, values, metadata and
 * statistics) — the "KV bytes" figure reported by evaluation. */
int64_t rt_kv_entries(const rt_kv *kv);
int64_t rt_kv_bytes_used(const rt_kv *kv);
/* Bytes one entry occupies (keys + values + metadata + statistics). */
size_t rt_kv_entry_bytes(const rt_kv *kv);

#endif
