/*
 * rt_kv: the KV store. One ragged entry list per (layer, KV head) — never per query
 * head (the GQA trap) — holding post-RoPE keys, values, the original position of each
 * entry, the number of tokens it represents (n >= 1; merged prototypes have n > 1, and
 * attention adds log n to the entry's logit), a protected-span id, and the policy's
 * per-entry statistics. Different KV heads may hold different entries and lengths.
 *
 * Memory: blocks from the process's KV pool (rt_kvpool.h, DESIGN.md sections 4 and 9).
 * A list's entries live in fixed-size blocks of RT_KV_BLOCK entries; the list's block
 * table is its block count nb: block b holds entries [b·RT_KV_BLOCK, (b+1)·RT_KV_BLOCK)
 * of every per-entry array. Each array of a list is one span of address space reserved
 * at the store's capacity (rt_kv_init, mmap without backing) and page-aligned, so the
 * entries of a list stay contiguous (attention, every policy and the compiled code index
 * them as arrays) while only the pages of blocks the list holds are resident: a block is
 * committed when its entries are first written, and returning a block hands its whole
 * pages back to the operating system (madvise MADV_DONTNEED; one spare block per list
 * stays mapped so a list oscillating around a block edge does not fault every token).
 * This is the vAttention layout (Prabhu et al. 2024, arXiv 2405.04437): physical blocks on
 * demand behind a contiguous virtual view.
 *
 * Appending past a list's last block takes a block (rt_kv_reserve takes them for a whole
 * chunk up front and fails cleanly when the pool is exhausted); compaction returns every
 * emptied block in the same call: rt_kv_head_keep gathers the kept entries forward in
 * order (every entry after the first eviction moves), rt_kv_head_evict moves only what
 * it must (each evicted slot below the new length takes a kept entry from the list's
 * tail: as many moves as evicted slots there, none for an eviction of the newest
 * entries); nothing is allocated per token.
 *
 * Entry order: appends go to the end in position order, so a store compacted only by
 * rt_kv_head_keep is in position order. After rt_kv_head_evict only this holds: every
 * entry appended after a compaction follows every entry that was there before it (so a
 * chunk's queries still see a prefix of the list, the causal mask of the forward). Code
 * that needs position order (pooling over neighbouring positions, merging into the
 * neighbouring kept entry, RoPE at the list index for `positions compacted`) sorts by pos
 * or compacts with rt_kv_head_keep.
 *
 * Element types: keys and values are stored as rows of kv->row_bytes bytes in the layouts
 * of runtime/kv/rt_kvq.h: RT_KV_F32 head_dim floats (256 bytes at head_dim 64), RT_KV_F16
 * head_dim IEEE halves (128), RT_KV_Q8_0 ggml's blocks of 32 (an f16 scale and 32 int8
 * codes: 68 bytes at head_dim 64; head_dim a multiple of 32). The block and page arithmetic
 * uses row_bytes only, so a narrower element type shrinks the bytes per block, not the
 * layout. h->kr / h->vr address the stored rows of every type; h->k / h->v are the same
 * memory as floats and are set only for RT_KV_F32 (NULL otherwise), so code that reads
 * f32 rows directly cannot misread a narrow store. rt_kv_key / rt_kv_value decode one row
 * of any type, rt_kv_set_key / rt_kv_set_value encode one.
 */
#ifndef RT_KV_H
#define RT_KV_H

#include <stddef.h>
#include <stdint.h>

#include "base/rt_util.h"
#include "kv/rt_kvpool.h"

/* Entries per block. */
#define RT_KV_BLOCK 16

/* Key/value element type of a store. ORDER RT_KV_TYPE: rt_kv_type_name's table. */
enum rt_kv_type {
	RT_KV_F32 = 0, /* float32, head_dim values per row */
	RT_KV_F16,     /* IEEE binary16 (round to nearest even), head_dim values per row */
	RT_KV_Q8_0,    /* ggml Q8_0: head_dim / 32 blocks of (f16 scale, 32 int8 codes) */
	RT_KV_N_TYPE
};

/* "f32", "f16", "q8_0" (the --kv-type words); rt_kv_type_parse returns the type or -1. */
const char *rt_kv_type_name(enum rt_kv_type t);
int rt_kv_type_parse(const char *name);
/* Bytes of one stored key (or value) row of head_dim values at type t; 0 when the type
 * cannot hold a row of that width (Q8_0 needs a multiple of 32). */
size_t rt_kv_row_bytes(enum rt_kv_type t, int head_dim);

typedef struct rt_kv_head {
	int32_t n;          /* entries in use, 0..cap */
	int32_t cap;        /* capacity in entries (same for every head of an rt_kv) */
	int32_t nb;         /* blocks held: entries 0..nb·RT_KV_BLOCK-1 are backed */
	int32_t nb_mapped;  /* blocks whose pages may be resident (>= nb) */
	float *k;           /* [cap × head_dim] keys, RoPE applied at pos (RT_KV_F32; else NULL) */
	float *v;           /* [cap × head_dim] values (RT_KV_F32; else NULL) */
	uint8_t *kr;        /* [cap × row_bytes] the stored key rows, every type */
	uint8_t *vr;        /* [cap × row_bytes] the stored value rows */
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
	enum rt_kv_type type; /* key/value element type */
	size_t row_bytes;   /* bytes of one key (or value) row */
	rt_kv_head *heads;  /* [n_layer × n_kv_head], index layer * n_kv_head + kv_head */
	rt_kvpool *pool;    /* the pool the blocks come from (the process's) */
	int64_t block_bytes; /* bytes of one block: RT_KV_BLOCK × rt_kv_entry_bytes */
	int64_t blocks;     /* blocks held by all lists together */
	int64_t blocks_peak; /* most blocks held at once since init / reset */
	void *mem;          /* the reserved address space behind every per-entry array */
	size_t mem_bytes;
	void *meta;         /* the heads and their policy state (an ordinary allocation) */
} rt_kv;

/* Create a store for n_layer × n_kv_head heads of capacity cap entries whose blocks come
 * from the process's pool (rt_kvpool_process). Reserves address space for cap entries
 * per list and takes no block. Fails (returns -1, sets err) on non-positive shapes, a size
 * that overflows or cannot be reserved; kv is then zeroed and safe to rt_kv_free. */
int rt_kv_init(rt_kv *kv, int n_layer, int n_kv_head, int group, int head_dim, int32_t cap,
               size_t stat_bytes, size_t state_bytes, rt_err *err);
/* The same with an explicit pool (tests; a server with several pools). */
int rt_kv_init_pool(rt_kv *kv, rt_kvpool *pool, int n_layer, int n_kv_head, int group,
                    int head_dim, int32_t cap, size_t stat_bytes, size_t state_bytes,
                    rt_err *err);
/* The same with element type `type` (rt_kv_init and rt_kv_init_pool store RT_KV_F32) and
 * pool (NULL: the process's). Also fails on a type outside enum rt_kv_type or a head_dim
 * the type cannot hold ("kv: head_dim 40 is not a multiple of 32, which q8_0 needs"). */
int rt_kv_init_typed(rt_kv *kv, rt_kvpool *pool, enum rt_kv_type type, int n_layer,
                     int n_kv_head, int group, int head_dim, int32_t cap, size_t stat_bytes,
                     size_t state_bytes, rt_err *err);
/* Return every block to the pool and release the address space. */
void rt_kv_free(rt_kv *kv);

/* Empty every head (n = 0), return every block and zero policy state; keeps the
 * reservation. */
void rt_kv_reset(rt_kv *kv);

/* The entry list of (layer, kv_head). Asserts the indices are in range. */
rt_kv_head *rt_kv_head_at(rt_kv *kv, int layer, int kv_head);

/* Make every list able to take `add` more entries without a new block: take the blocks
 * that are missing, all or none. Errors (-1, err set, nothing taken, the store unchanged):
 * a list would exceed the capacity, or the pool cannot grant the blocks ("KV pool
 * exhausted: ..."). */
int rt_kv_reserve(rt_kv *kv, int32_t add, rt_err *err);

/* Append one entry (count 1, span 0, zeroed statistics) holding key k[head_dim] and value
 * v[head_dim] (f32, encoded to the store's type) at original position pos. Returns its index. Asserts n < cap. When the
 * entry starts a new block and none was reserved, takes one and asserts the pool grants
 * it: callers that must survive a full pool reserve first (rt_kv_reserve). */
int32_t rt_kv_append(rt_kv *kv, rt_kv_head *h, const float *k, const float *v, int32_t pos);

/* Entry i's key / value as head_dim floats: a pointer into the store for RT_KV_F32, else
 * the row decoded into buf[head_dim] (and buf returned). Asserts 0 <= i < h->n. */
const float *rt_kv_key(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *buf);
const float *rt_kv_value(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *buf);
/* Overwrite entry i's key / value with x[head_dim], encoded to the store's type (a policy
 * merge, RoPE re-rotation). Asserts 0 <= i < h->n. */
void rt_kv_set_key(const rt_kv *kv, rt_kv_head *h, int32_t i, const float *x);
void rt_kv_set_value(const rt_kv *kv, rt_kv_head *h, int32_t i, const float *x);
/* Decode n stored rows (row_bytes apart, from rows) of the store's type into out[n ×
 * head_dim] (f32 rows are copied). */
void rt_kv_rows_decode(const rt_kv *kv, const uint8_t *rows, int32_t n, float *out);

/* Keep exactly the entries keep[0..n_keep) (strictly increasing indices into the head),
 * in that order, by an in-place gather of every per-entry array; the rest are evicted and
 * every block left empty returns to the pool. Asserts the indices are valid and sorted. */
void rt_kv_head_keep(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep);

/* Keep exactly the entries keep[0..n_keep) (strictly increasing indices into the head) by
 * moving as few as possible: kept entries below index n_keep stay where they are, and the
 * kept entries at n_keep or above fill the evicted slots below n_keep, both in increasing
 * index order; every block left empty returns to the pool. Returns the number of entries
 * moved (the evicted slots below n_keep). Asserts the indices are valid and sorted. */
int32_t rt_kv_head_evict(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep);

/* Return the blocks past each list's entries (after a compaction that set h->n itself). */
void rt_kv_trim(rt_kv *kv);

/* Entries in use over all heads, and the bytes they occupy (keys, values, metadata and
 * statistics). */
int64_t rt_kv_entries(const rt_kv *kv);
int64_t rt_kv_bytes_used(const rt_kv *kv);
/* Bytes of the blocks the store holds now (blocks × block_bytes), and their peak since
 * init / reset: the pool memory the sequence really occupies ("KV bytes" of evaluation). */
int64_t rt_kv_bytes_held(const rt_kv *kv);
int64_t rt_kv_bytes_peak(const rt_kv *kv);
/* Bytes one entry occupies (keys + values + metadata + statistics). */
size_t rt_kv_entry_bytes(const rt_kv *kv);
/* Blocks a list of n entries holds: ceil(n / RT_KV_BLOCK). */
int32_t rt_kv_blocks_for(int32_t n);

#endif
