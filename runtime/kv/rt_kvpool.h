/*
 * rt_kvpool: the process-wide KV block pool (docs/serving.md). Every KV store (rt_kv)
 * of a process draws its (layer, KV head) lists' blocks from one pool with a hard byte
 * limit: appending an entry past a list's last block takes a block, compaction returns
 * every emptied block at once, and a sequence whose block cannot be granted fails with an
 * error while every other sequence is untouched. The pool is the accounting (blocks and
 * bytes in use, high-water mark, limit); the memory behind a block is the block's slice
 * of its store's reserved address space (rt_kv.h), committed when written and handed back
 * to the operating system when the block returns — so the pool's bytes in use are the
 * resident KV bytes, as in vAttention (Prabhu et al. 2024, arXiv 2405.04437).
 *
 * A block holds RT_KV_BLOCK entries of one list; its bytes depend on the store (key and
 * value element type, head_dim, the policy's per-entry statistics), so the pool counts
 * both blocks and bytes. Thread-safe: the counters are C11 atomics, so an HTTP thread
 * may read them while the scheduler takes and returns blocks.
 */
#ifndef RT_KVPOOL_H
#define RT_KVPOOL_H

#include <stdint.h>

#include "base/rt_util.h"

/* C++ units (the CUDA backend, runtime/cuda) include this header only for the layout and
 * never touch the counters; C++ before C++23 has no _Atomic qualifier, and an _Atomic
 * int64_t has the size and alignment of an int64_t. */
#ifdef __cplusplus
#define RT_KVPOOL_ATOMIC
#else
#include <stdatomic.h>
#define RT_KVPOOL_ATOMIC _Atomic
#endif

typedef struct rt_kvpool {
	RT_KVPOOL_ATOMIC int64_t limit;   /* hard limit in bytes (INT64_MAX: none) */
	RT_KVPOOL_ATOMIC int64_t used;    /* bytes of the blocks held by every store */
	RT_KVPOOL_ATOMIC int64_t blocks;  /* blocks held by every store */
	RT_KVPOOL_ATOMIC int64_t peak;    /* high-water mark of used since start or rt_kvpool_peak_reset */
	RT_KVPOOL_ATOMIC int64_t refused; /* takes refused for lack of room */
} rt_kvpool;

/* A snapshot of the counters. */
typedef struct rt_kvpool_stats {
	int64_t limit, used, blocks, peak, refused;
} rt_kvpool_stats;

/* The process's pool (no limit until rt_kvpool_set_limit). Every rt_kv draws from it. */
rt_kvpool *rt_kvpool_process(void);

/* Set the hard limit to `bytes` (> 0; INT64_MAX removes it). Blocks already held stay
 * held even when they exceed the new limit; later takes are refused until they fit. */
void rt_kvpool_set_limit(rt_kvpool *p, int64_t bytes);

/* Take n blocks of block_bytes each, all or none. Returns 0, or -1 (nothing taken, the
 * refused counter grows) when used + n·block_bytes would exceed the limit. */
int rt_kvpool_take(rt_kvpool *p, int64_t n, int64_t block_bytes);

/* Return n blocks of block_bytes each (taken earlier with rt_kvpool_take). */
void rt_kvpool_give(rt_kvpool *p, int64_t n, int64_t block_bytes);

/* Add dblocks blocks and dbytes bytes (either sign) to the counters, whatever the limit,
 * without touching the high-water mark: the shared prefixes' accounting (rt_kv.h, "Shared
 * prefixes"), which moves bytes already granted between a sequence and a shared segment,
 * or gives back a copy that a write forced (copy on write). */
void rt_kvpool_adjust(rt_kvpool *p, int64_t dblocks, int64_t dbytes);

rt_kvpool_stats rt_kvpool_get(const rt_kvpool *p);

/* Start a new high-water mark at the bytes in use now. */
void rt_kvpool_peak_reset(rt_kvpool *p);

/* Parse a memory size: a positive integer with an optional suffix K, M, G, T (powers of
 * 1024; "KiB", "MB" etc. also read as powers of 1024) — "512M", "2G", "1048576". Errors
 * (-1, err names the text): empty, not a number, unknown suffix, zero, overflow. */
int rt_kvpool_parse_size(const char *text, int64_t *bytes, rt_err *err);

#endif
