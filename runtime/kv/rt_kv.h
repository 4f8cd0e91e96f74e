/*
 * rt_kv: the KV store. One ragged entry list per (layer, KV head) — never per query
 * head (the GQA trap) — holding post-RoPE keys, values, the original position of each
 * entry, the number of tokens it represents (n >= 1; merged prototypes have n > 1, and
 * attention adds log n to the entry's logit), a protected-span id, and the policy's
 * per-entry statistics. Different KV heads may hold different entries and lengths.
 *
 * Memory: blocks from the process's KV pool (rt_kvpool.h; docs/architecture.md "The KV store", docs/serving.md).
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
 *
 * Precision tiers (rt_kv_init_tiered): every entry has its own storage tier, h->tier[i]
 * (enum rt_kv_tier): tier 0 is the store's top type (f16, or f32 on the exact path), then
 * keys/values at 8/8, 8/4, 4/4 and 4/2 bits. An entry only moves down (rt_kv_head_set_tiers), and a downgraded entry
 * occupies its tier's bytes only:
 *   - the per-entry metadata (pos, count, log_count, span, stats, tier, slot, kgrp) stays
 *     in the list's arrays, blocks of RT_KV_BLOCK entries as above;
 *   - the key and value rows live in per-tier row arenas of the head (h->arena[t]): a
 *     reserved span of cap slots, slot s holding the key row then the value row at tier
 *     t's row size, committed block by block (RT_KV_BLOCK slots) from the pool. Entry i's
 *     rows are slot h->slot[i] of arena h->tier[i]; arena[t].owner[s] names the entry in
 *     slot s. Freeing a slot (eviction, downgrade) fills the hole from the arena's tail, as
 *     rt_kv_head_evict does for entries, and emptied arena blocks return to the pool in the
 *     same call, so the pool's bytes are Σ over tiers of the blocks each tier holds (and
 *     the key-group table's, below).
 * In a tiered store h->kr, h->vr, h->k and h->v are NULL: rows are read through rt_kv_key /
 * rt_kv_value / rt_kv_head_decode. In an untiered store h->tier, h->slot and h->kgrp are NULL (every
 * entry is at RT_KV_TIER_TOP; rt_kv_tier_of reads either kind).
 *
 * Quantised tiers (head_dim a multiple of 32): values are coded per token with the rt_kvq
 * vrow codecs (asymmetric min/max groups of 32 channels, f16 scale and minimum), keys per
 * channel (KIVI, Liu et al. 2024, arXiv 2402.02750: key outliers live in channels, so a
 * channel's range is shared across neighbouring tokens), with the ranges kept apart from
 * the codes so that every entry stays evictable and downgradable alone:
 *   - a key group is the entries of one aligned position block [b·G, (b+1)·G), G =
 *     RT_KV_KGROUP = 64, of one (layer, KV head) list (KIVI groups 32 tokens; 64 halves
 *     the range bytes an entry pays, which eviction multiplies, and measured best of 32,
 *     64 and 128 over quantisation-only and mixed policies: docs/architecture.md). When the first of
 *     them leaves the top tier (rt_kv_head_set_tiers), the group's per-channel minima and
 *     maxima (f16) are fitted on every entry of the block then in the list at the top tier
 *     without a group (each still exact: tiers only go down) and stored in the head's
 *     key-group table h->arena[RT_KV_KGROUPS] (slot g: head_dim f16 minima then head_dim
 *     f16 maxima; owner[g]: its quantised members); h->kgrp[i] names entry i's group (-1:
 *     none). The table is committed block by block from the pool like a tier arena.
 *   - a quantised entry's slot holds its key codes alone (head_dim × bits / 8 bytes) and its
 *     value row; every downgrade (top to q8/q4/q2, q8 to q4, ...) codes the key against its
 *     group's range at the new tier's bits (rt_kvq_kcodes_encode), so downgrading or
 *     evicting one entry never touches another entry's codes.
 *   - entries of a block evicted before the fit are not in it; entries of the block
 *     appended after it (a block downgraded before it was complete) form a group of their
 *     own when they leave the top tier, so every key is coded against a range fitted on it.
 *     A group is freed when its last quantised member is evicted (the table's last group
 *     moves into its slot; members still at the top tier forget it and join a new group).
 *   - a key rewritten in place (rt_kv_set_key: a merge) is clamped to its group's range;
 *     RoPE re-rotation (`positions = compacted`) rewrites a head's keys at once through
 *     rt_kv_head_set_keys, which refits every group with a rotated member.
 * The 2-bit tier keeps 4-bit keys: 2-bit keys, per token or per channel, cost several times
 * the KL of 4-bit ones on SmolLM2-135M (docs/architecture.md has the table; keys are the
 * sensitive half, QAQ, Dong et al. 2024, arXiv 2403.04643; K8V4 spends the bits the other
 * way round from q2). Bytes at head_dim 64: key codes + value row of 64 + 72 (q8), 64 + 40
 * (k8v4), 32 + 40 (q4), 32 + 24 (q2) against f16's 128 + 128, and a
 * 256-byte range per key group: 4 bytes an entry of a full group, half what per-token key
 * scales took (140, 108, 76, 60 bytes an entry against 144, 112, 80, 64). Eviction thins groups:
 * rt_kvbytes_held counts every range held, and the byte-budget allocator charges each
 * quantised entry the range over the store's mean members per group (rt_kv_kgroup_fill).
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

/* Storage tier of an entry in a tiered store. ORDER RT_KV_TIER: tier_names[],
 * tier_vkind[] and tier_kkind[] in rt_kv.c. Tier 0 is the store's own type (f16 on the
 * fast path, f32 on the exact path); the others code values per token and keys per
 * channel against their key group's range (see the header comment): Q8 both at 8 bits, K8V4
 * keys at 8 and values at 4, Q4 both at 4, Q2 values at 2 bits and keys at 4. The order is
 * a chain in both halves (neither the key bits nor the value bits ever grow along it), so
 * a downgrade (a higher tier index) never regains precision on either side. */
enum rt_kv_tier {
	RT_KV_TIER_TOP = 0,
	RT_KV_TIER_Q8,   /* keys 8 bits, values 8 */
	RT_KV_TIER_K8V4, /* keys 8 bits, values 4 */
	RT_KV_TIER_Q4,   /* keys 4 bits, values 4 */
	RT_KV_TIER_Q2,   /* keys 4 bits, values 2 */
	RT_KV_N_TIER
};

/* Index of the key-group table among a head's arenas (h->arena[RT_KV_KGROUPS]), and the
 * positions a key group covers: the entries of positions [b·RT_KV_KGROUP, (b+1)·RT_KV_KGROUP)
 * of one (layer, KV head) share each channel's key range (see the header comment). ORDER:
 * tests/test_kv_tiers.c and tests/test_k_tier.c compute their bytes and groups by hand for 64. */
#define RT_KV_KGROUPS RT_KV_N_TIER
#define RT_KV_KGROUP 64

/* "top", "q8", "k8v4", "q4", "q2" (static strings; "?" for t outside 0..RT_KV_N_TIER-1);
 * rt_kv_tier_parse returns the tier or -1. */
const char *rt_kv_tier_name(int t);
int rt_kv_tier_parse(const char *name);

/* One tier's row arena of a head (tiered stores): slot s (< n) holds an entry's key row
 * then its value row at the tier's row size; owner[s] is that entry's index. */
typedef struct rt_kv_arena {
	uint8_t *rows;      /* [cap × 2 × tier row bytes] */
	int32_t *owner;     /* [cap] entry index of slot s */
	int32_t n;          /* slots in use */
	int32_t nb;         /* blocks held: slots 0..nb·RT_KV_BLOCK-1 are backed */
	int32_t nb_mapped;  /* blocks whose pages may be resident (>= nb) */
} rt_kv_arena;

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
	/* tiered stores only (NULL / zero otherwise) */
	uint8_t *tier;      /* [cap] entry tier (enum rt_kv_tier) */
	int32_t *slot;      /* [cap] entry's slot in arena[tier[i]] */
	int32_t *kgrp;      /* [cap] entry's key group (slot of arena[RT_KV_KGROUPS]), -1 none */
	rt_kv_arena arena[RT_KV_N_TIER + 1]; /* the tiers' row arenas, then the key groups
	                                        (slot g: the range, owner[g]: its quantised
	                                        members) */
	struct rt_kv_prefix *px; /* untiered: the shared prefix whose segment holds this list's
	                            key and value rows [0, px's entries), or NULL (see "Shared
	                            prefixes" below) */
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
	int64_t block_bytes; /* bytes of one block: RT_KV_BLOCK × rt_kv_entry_bytes (tiered:
	                        of entries at the top tier, metadata block + arena block) */
	RT_KVPOOL_ATOMIC int64_t blocks;     /* blocks held by all lists and arenas together */
	RT_KVPOOL_ATOMIC int64_t bytes;      /* their bytes */
	RT_KVPOOL_ATOMIC int64_t bytes_peak; /* most bytes held at once since init / reset */
	int tiered;         /* rt_kv_init_tiered: per-entry tiers, rows in tier arenas */
	size_t meta_bytes;  /* tiered: bytes of one entry's metadata (list arrays) */
	size_t tier_krow[RT_KV_N_TIER]; /* tiered: bytes of one key row at tier t */
	size_t tier_vrow[RT_KV_N_TIER]; /* tiered: bytes of one value row at tier t */
	size_t tier_row[RT_KV_N_TIER];  /* tiered: (key row + value row) / 2, so an entry's rows
	                                   are 2 × tier_row[t] bytes at every tier */
	size_t kgroup_bytes; /* tiered: bytes of one key group's range (4 · head_dim) */
	int rot_keys;       /* tiered: quantised keys are stored rotated (rt_kv_set_rotation) */
	int rot_values;     /* tiered: quantised values are stored rotated */
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
/* A store with per-entry precision tiers (see the header comment): tier 0 stores `top`
 * (RT_KV_F16 or RT_KV_F32), the other tiers the rt_kvq Q8/Q4/Q2 codecs. Every entry is
 * appended at the top tier. Same shapes, ownership and errors as rt_kv_init_typed, and
 * fails on a top type other than f16/f32 or a head_dim that is not a multiple of 32
 * ("kv: tiered store: head_dim 40 is not a multiple of 32, which the q8/q4/q2 tiers
 * need"). pool NULL: the process's. */
int rt_kv_init_tiered(rt_kv *kv, rt_kvpool *pool, enum rt_kv_type top, int n_layer,
                      int n_kv_head, int group, int head_dim, int32_t cap, size_t stat_bytes,
                      size_t state_bytes, rt_err *err);

/* ---- Shared prefixes --------------------------------------------------------------------
 * Sequences whose prompts start with the same tokens (a system prompt, a few-shot preamble)
 * hold the same key and value rows for them, bit for bit, when the forward computed them the
 * same way. A shared prefix (rt_kv_prefix) is one copy of the rows [0, n) of every list of a
 * store in a memory file (memfd), n a multiple of rt_kv_prefix_unit; a list shares it by
 * mapping the file's pages over its own rows (mmap MAP_PRIVATE | MAP_FIXED), so attention and
 * every policy read the same contiguous arrays as before, and the pages are resident once
 * however many lists map them. Only the key and value rows are shared: positions, counts,
 * spans and policy statistics stay the sequence's own.
 *
 * Pool: the prefix's rows are counted once (its segment: lists × n/RT_KV_BLOCK blocks and
 * lists × n × 2 row bytes, taken when it is made), and every list that shares it gives its
 * own copy's blocks and bytes back (rt_kvpool_adjust); the store's own figures
 * (rt_kv_bytes_held, its blocks) still count the whole list, as an unshared run holds it.
 *
 * Copy on write: the store never writes a shared row. Before anything would (an entry moved
 * or evicted below n, rt_kv_set_key / rt_kv_set_value on such an entry, a list cut below
 * n), the list stops sharing: its rows are copied into private pages again and counted in
 * the pool again (rt_kvpool_adjust, beyond the limit if need be: a server admits a request
 * by its unshared footprint, so the copy fits what it reserved). Code that writes h->k /
 * h->v directly (GraceKV, f32 merges, the compacted convention's re-rotation) is not
 * guarded: the mapping is private, so such a write still lands in a private copy of the
 * page (the values stay right) but the pool would not count it; callers share only
 * stores whose policy cannot do that (docs/serving.md, "Shared prefixes"). Tiered stores
 * do not share (rt_kv_prefix_unit 0). */
typedef struct rt_kv_prefix rt_kv_prefix;

/* Entries per list a shared prefix of kv is a multiple of: whole blocks whose key and value
 * rows fill whole pages (32 at f16 rows of 64 values, 16 at f32); 0 when kv cannot share
 * (tiered, or a row size no page multiple reaches within 4096 entries). */
int32_t rt_kv_prefix_unit(const rt_kv *kv);

/* A new shared prefix of the rows [0, n) of every list of kv (n > 0, a multiple of
 * rt_kv_prefix_unit, every list holding at least n entries, none shared yet), which kv's
 * lists then share. The caller owns one reference (rt_kv_prefix_unref); each sharing list
 * holds one more. Returns NULL with err set when the memory file cannot be made or written
 * ("kv: shared prefix: memfd_create: ..."); kv is then unchanged. */
rt_kv_prefix *rt_kv_prefix_make(rt_kv *kv, int32_t n, rt_err *err);

/* Share px in every list of kv when kv has px's shape (layers, KV heads, row bytes), every
 * list holds at least px's n entries, shares nothing yet, and its rows [0, n) equal px's byte
 * for byte. Returns 1 when it shares (the pool gives back kv's copy), 0 when it does not
 * (nothing changed), -1 with err when a mapping fails (kv then shares nothing). */
int rt_kv_prefix_attach(rt_kv *kv, rt_kv_prefix *px, rt_err *err);

/* Prefix caching (vLLM's automatic prefix caching, llama-server's prompt cache): start the
 * empty store kv where the maker of px stood when px was made, without computing it. When
 * every list of the maker held the same number m >= n of entries then, px keeps a copy of
 * what those lists held besides the shared rows (rt_kv_prefix_fork_len is m; else 0): the m
 * entries' positions, counts, log counts, spans and policy statistics, the key and value
 * rows of entries [n, m) (less than a page: not shared) and the list's policy state
 * (h->state). A fork gives every list of kv those m entries: rows [0, n) shared, the rest
 * copied, so kv is then, array for array, the maker's store at that moment. Possible
 * (rt_kv_prefix_forkable) when kv has px's shape, statistics and state sizes, a capacity of
 * at least m, and every list empty and unshared. Returns 1 when kv forked, 0 when it cannot
 * (nothing changed), -1 with err when the pool refuses what the entries need beyond the
 * shared rows ("KV pool exhausted: ...") or a mapping fails (kv is then empty again). The caller moves the
 * sequence's own state (tokens seen, counters) to the maker's: runtime/policy/rt_seq.h
 * rt_seq_fork. */
int32_t rt_kv_prefix_fork_len(const rt_kv_prefix *px);
int rt_kv_prefix_forkable(const rt_kv *kv, const rt_kv_prefix *px);
int rt_kv_prefix_fork(rt_kv *kv, rt_kv_prefix *px, rt_err *err);

/* Drop one reference; the last frees the segment and gives its blocks back to the pool. */
void rt_kv_prefix_unref(rt_kv_prefix *px);

/* Entries per list of px; its bytes in the pool (counted once); the lists sharing it now. */
int32_t rt_kv_prefix_len(const rt_kv_prefix *px);
int64_t rt_kv_prefix_bytes(const rt_kv_prefix *px);
int64_t rt_kv_prefix_lists(const rt_kv_prefix *px);

/* Lists of kv that share a prefix now. */
int rt_kv_shared_lists(const rt_kv *kv);

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

/* Append one entry (count 1, span 0, zeroed statistics; tiered: at the top tier) holding
 * key k[head_dim] and value v[head_dim] (f32, encoded to the store's type) at original
 * position pos. Returns its index. Asserts n < cap. When the
 * entry starts a new block and none was reserved, takes one and asserts the pool grants
 * it: callers that must survive a full pool reserve first (rt_kv_reserve). */
int32_t rt_kv_append(rt_kv *kv, rt_kv_head *h, const float *k, const float *v, int32_t pos);

/* Entry i's key / value as head_dim floats: a pointer into the store for RT_KV_F32, else
 * the row decoded into buf[head_dim] (and buf returned). Asserts 0 <= i < h->n. */
const float *rt_kv_key(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *buf);
const float *rt_kv_value(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *buf);
/* Overwrite entry i's key / value with x[head_dim], encoded to the store's type (tiered:
 * at the entry's tier; a key at a quantised tier against its key group's range, a channel
 * outside the range clamped to it) (a policy merge). Asserts 0 <= i < h->n. */
void rt_kv_set_key(const rt_kv *kv, rt_kv_head *h, int32_t i, const float *x);
void rt_kv_set_value(const rt_kv *kv, rt_kv_head *h, int32_t i, const float *x);
/* Overwrite the keys of the entries with changed[i] set (0 <= i < h->n) by K[i × head_dim]
 * at once (RoPE re-rotation of `positions = compacted`, runtime/policy/rt_seq.c): K holds
 * h->n rows, the new key of every changed entry and the current key (as rt_kv_key reads
 * it) of every other. An untiered store, or an entry at the top tier, is encoded as
 * rt_kv_set_key does. A key group with a changed member is refitted on all its members'
 * rows of K (quantised and top tier alike) and its quantised members are coded again
 * against the new range, so no re-rotated key is clamped by a range fitted on other
 * rotations; a group without a changed member is not touched. O(n × key groups). */
void rt_kv_head_set_keys(const rt_kv *kv, rt_kv_head *h, const float *K, const uint8_t *changed);
/* Decode n stored rows (row_bytes apart, from rows) of the store's type into out[n ×
 * head_dim] (f32 rows are copied). Untiered stores' h->kr / h->vr only; rt_kv_head_decode
 * reads any store. */
void rt_kv_rows_decode(const rt_kv *kv, const uint8_t *rows, int32_t n, float *out);

/* Entries [i0, i0 + n) of h decoded to f32: keys to K[n × head_dim], values to
 * V[n × head_dim] (either may be NULL), whatever the store's type or the entries' tiers.
 * Reads only (several threads may decode different heads, or the same head, at once).
 * Asserts 0 <= i0, n >= 0, i0 + n <= h->n. */
void rt_kv_head_decode(const rt_kv *kv, const rt_kv_head *h, int32_t i0, int32_t n, float *K,
                       float *V);

/* Decodes n rows of a store's top type (rows row bytes apart) into out[n × d]: the
 * signature of rt_kvattn_kernels.decode (runtime/model/rt_kvattn.h). */
typedef void (*rt_kv_rows_fn)(const uint8_t *rows, int32_t n, int d, float *out);

/* Every entry of h decoded to f32, K[h->n × head_dim] and V[h->n × head_dim] (both
 * non-NULL): rt_kv_head_decode(kv, h, 0, h->n, K, V) with the same values, but a tiered
 * store is read arena by arena in slot order, and its top-tier rows through `top` (the
 * attention's vectorised decode of the top type; NULL: the portable one). Reads only. */
void rt_kv_head_decode_all(const rt_kv *kv, const rt_kv_head *h, float *K, float *V,
                           rt_kv_rows_fn top);

/* The rt_kvq codec (enum rt_kvq_kind) of tier t's key codes (value == 0) or value rows
 * (value != 0) in a tiered store; tier 0 is the store's type (RT_KVQ_F16 or RT_KVQ_F32).
 * A quantised tier's keys are codes against their key group's range
 * (rt_kv_kgroup_range), its values rt_kvq value rows. */
int rt_kv_tier_codec(const rt_kv *kv, int t, int value);

/* Rotation before quantisation in a tiered store (rt_kvq_rotate, the normalised
 * Walsh-Hadamard transform H of a head row): with keys != 0 every key at a quantised tier
 * is coded as H·k (its key group's range fitted on the rotated keys), with values != 0
 * every quantised value row as H·v. Reads undo it: rt_kv_key, rt_kv_value and
 * rt_kv_head_decode return H·decode (H·H = I), and attention (runtime/model/rt_kvattn.h)
 * dots the rotated query H·q with the rotated codes ((H q)·(H k) = q·k) and un-rotates the
 * quantised entries' share of the output once per row. The top tier is never rotated. It
 * costs no byte (H is computed, not stored). Set it before any entry leaves the top tier.
 * Returns 0, or -1 with err: an untiered store, head_dim not a power of two ("kv: rotate
 * hadamard needs a power-of-two head_dim, not 96"), or quantised entries already held. */
int rt_kv_set_rotation(rt_kv *kv, int keys, int values, rt_err *err);

/* Key group g's range in h (0 <= g < h->arena[RT_KV_KGROUPS].n): head_dim f16 minima then
 * head_dim f16 maxima, the layout rt_kvq_krange_unpack reads. Borrowed: valid until the
 * head's groups change (set_tiers, evict, set_keys). */
const uint16_t *rt_kv_kgroup_range(const rt_kv *kv, const rt_kv_head *h, int32_t g);

/* Entry i's tier: h->tier[i] in a tiered store, RT_KV_TIER_TOP otherwise. */
static inline int rt_kv_tier_of(const rt_kv_head *h, int32_t i)
{
	return h->tier ? (int)h->tier[i] : (int)RT_KV_TIER_TOP;
}

/* Set the tiers of the head's entries at once (tiered stores): want[i] for i < h->n is the
 * wanted tier of entry i (enum rt_kv_tier). An entry only moves down: want[i] <= h->tier[i]
 * leaves it as it is (precision lost is not regained). Each moved entry's rows are decoded
 * and encoded at the new tier. The pool must grant the destination tiers' new blocks
 * before the source tiers' emptied blocks return (in the same call). Different heads may
 * be set from different threads at once (the pool and the store's byte counters are
 * atomic). Returns the number of entries moved, or -1 with err set and nothing changed
 * (the store is untiered, a want[i] is out of range, or the pool is exhausted: "KV pool
 * exhausted: ..."). */
int rt_kv_head_set_tiers(rt_kv *kv, rt_kv_head *h, const uint8_t *want, rt_err *err);

/* Bytes one entry occupies at tier t (key row + value row + metadata + statistics, and a
 * tiered store's slot owner index) in the pool, its share of a key group's range not
 * included (a quantised entry shares kv->kgroup_bytes + 4 bytes of the key-group table
 * with the other members of its group); an untiered store answers rt_kv_entry_bytes for
 * t == 0 and 0 for the others. */
size_t rt_kv_tier_entry_bytes(const rt_kv *kv, int t);
/* Half the bytes an entry's rows cost at tier t in a full key group: (key row + value
 * row) / 2, plus at a quantised tier the entry's share of its key
 * group's range amortised over a full group, kgroup_bytes / (2 · RT_KV_KGROUP) (2 bytes
 * at head_dim 64), so an entry costs 2 × this. Tiered, head_dim 64: 128 (top), 68 + 2
 * (q8), 36 + 2 (q4), 28 + 2 (q2). rt_kvbytes_held counts the exact bytes instead (each
 * key group held once, however many members it has left); a group loses members by
 * eviction only, so the figure is low by the ranges of partly evicted groups, which the
 * byte-budget allocator adds (kernels/k_compress.h k_tier_costs, rt_kv_kgroup_fill) and its
 * trim then counts exactly (k_run_trim_pool). */
size_t rt_kv_tier_row_bytes(const rt_kv *kv, int t);
/* Key groups the store holds (tiered stores; 0 otherwise): Σ over heads of the table's
 * slots in use. */
int64_t rt_kv_kgroups(const rt_kv *kv);
/* Mean quantised members per key group over the store now (Σ members / groups; the
 * positions a group covers, RT_KV_KGROUP, when it holds none): what eviction left of the
 * groups, the divisor of the byte-budget allocator's share of a range per entry
 * (kernels/k_compress.h k_tier_costs). */
double rt_kv_kgroup_fill(const rt_kv *kv);
/* Bytes of one entry in an f16 full cache: key + value row of head_dim halves
 * (4 · head_dim), the 1x baseline of rt_kvbytes. */
size_t rt_kv_f16_entry_bytes(const rt_kv *kv);

/* Keep exactly the entries keep[0..n_keep) (strictly increasing indices into the head),
 * in that order, by an in-place gather of every per-entry array; the rest are evicted and
 * every block left empty returns to the pool (in a tiered store the evicted entries' tier
 * slots are freed first and every arena's emptied blocks return too; kept rows do not
 * move, only their slots' owners change). Asserts the indices are valid and sorted. */
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
 * statistics; tiered: and the key groups' ranges and member counts). */
int64_t rt_kv_entries(const rt_kv *kv);
int64_t rt_kv_bytes_used(const rt_kv *kv);
/* Bytes of the blocks the store holds now (list blocks and, in a tiered store, every tier
 * arena's blocks), and their peak since init / reset: the pool memory the sequence really
 * occupies ("KV bytes" of evaluation). */
int64_t rt_kv_bytes_held(const rt_kv *kv);
int64_t rt_kv_bytes_peak(const rt_kv *kv);
/* Bytes one entry occupies (keys + values + metadata + statistics; tiered: at the top
 * tier, rt_kv_tier_entry_bytes(kv, 0)). */
size_t rt_kv_entry_bytes(const rt_kv *kv);
/* Blocks a list of n entries holds: ceil(n / RT_KV_BLOCK). */
int32_t rt_kv_blocks_for(int32_t n);

#endif
