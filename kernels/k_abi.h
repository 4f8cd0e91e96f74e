/*
 * k_abi.h: the settings the policy IR (compiler/kvp_ir.h), the emitters and the kernels
 * share, one row list each. The IR's fields have these types, the kernels' configuration
 * (k_compress.h struct k_compress_cfg) reads them, and the emitters print a value by its
 * name from the K_*_NAMES array made from the same rows, so a new value is one row here
 * and its meaning in the kernel. The only kernels header the compiler may include
 * (scripts/check_layers.sh). Also K_HD, the marker of a function both back ends run.
 */
#ifndef K_ABI_H
#define K_ABI_H

/* A function compiled for both sides: the CUDA device code and the host (the C policies,
 * and the host references the CUDA tests check the device against), so one text computes
 * the same bits on both (the device code is built without FMA contraction). */
#ifdef __CUDACC__
#define K_HD __host__ __device__ inline
#else
#define K_HD static inline
#endif

#define K_ABI_ENUM_(P, n) P##n,
#define K_ABI_NAME_(P, n) [P##n] = #P #n,

/* How the budget is spread over the layers (enum k_layers):
 *   UNIFORM  every layer gets the average budget
 *   PYRAMID  PyramidKV (KVCache-Factory): beta; the recent guard is w; most entries at
 *            layer 0
 *   FUNNEL   the pyramid reversed: most entries at the last layer (Scissorhands' reading
 *            in cold-compress)
 *   LINEAR   the budget scaled by a linear ramp from `from` (layer 0) to `to` (last
 *            layer), renormalised to the same total (funnel: linear(0.8, 1.2))
 *   LIST     explicit multipliers, resampled to n_layers by nearest index and
 *            renormalised to the same total
 *   GLOBAL_ONLY  the budget on each full-attention layer; the sliding-window layers
 *            (kvp_ctx.layer_window > 0) are not compressed: they keep their window, which
 *            is the model's (k_layers_window_keep) */
#define K_LAYERS_ROWS(X) \
	X(K_LAYERS_, UNIFORM) X(K_LAYERS_, PYRAMID) X(K_LAYERS_, FUNNEL) X(K_LAYERS_, LINEAR) \
	X(K_LAYERS_, LIST) X(K_LAYERS_, GLOBAL_ONLY)

/* How a layer's budget is spread over its KV heads (enum k_heads):
 *   EACH      every KV head of a layer gets the layer budget
 *   ADAPTIVE  Ada-KV: global top-(G·B) across the heads of a layer,
 *             b_g = round(floor·B + (1 - floor)·n_g)
 *   GLOBAL    one pool over all layers and heads: top-(L·G·B) overall, each head keeps at
 *             least floor·B_l */
#define K_HEADS_ROWS(X) X(K_HEADS_, EACH) X(K_HEADS_, ADAPTIVE) X(K_HEADS_, GLOBAL)

/* What happens to an entry the selection drops (enum k_act):
 *   EVICT  it is removed
 *   MERGE  it is merged into the adjacent kept, unguarded entry (previous or next in
 *          position order; guarded entries stay exact) whose key is more cosine-similar
 *          (ties: previous); count-weighted mean of keys and values, counts add,
 *          log_count = log(count), the kept entry's position stays. A prototype never
 *          grows past `run` tokens; an evicted entry that does not fit is dropped.
 *   SPLIT  add/split (GraceKV, arXiv 2608.07001): with one global pool, a prompt-end
 *          trigger and original positions (compiler kvp_ir_grace_core) GraceKV's actions,
 *          k_grace_run.h (k_grace_run): `run` is the slot (target segment) length, `floor`
 *          the singleton floor per head, the allocation floor the per-head coverage share,
 *          the score the direct relevance. Otherwise (hand-built IRs only) a simplified
 *          version: as MERGE with run = slot, after the `floor` highest-scoring evicted
 *          singletons per head are kept exactly (charged to the budget first) */
#define K_ACT_ROWS(X) X(K_ACT_, EVICT) X(K_ACT_, MERGE) X(K_ACT_, SPLIT)

/* 1-D pooling of the scores along positions (enum k_pool):
 *   NONE
 *   MAX   max over [i - k/2, i + k/2] of the scored entries
 *   AVG   sum over the same window / k (zero padding counts, as torch avg_pool1d with
 *         padding=k/2) */
#define K_POOL_ROWS(X) X(K_POOL_, NONE) X(K_POOL_, MAX) X(K_POOL_, AVG)

/* Reduction of the per-query-head scores over a GQA group (enum k_reduce):
 *   MEAN  mean over the query heads of the group (kvpress)
 *   MAX, SUM
 *   L2    sqrt of the sum of squares over the group: CAOTE's GQA rule, the root of the
 *         total squared output error of the query heads sharing the entry
 *   NONE  the score does not depend on the query head (the kernel's cfg->reduce is then
 *         -1: computed once) */
#define K_REDUCE_ROWS(X) \
	X(K_REDUCE_, MEAN) X(K_REDUCE_, MAX) X(K_REDUCE_, SUM) X(K_REDUCE_, L2) X(K_REDUCE_, NONE)

/* The precision action on the kept entries (enum k_tiers, k_tier.h):
 *   NONE     none
 *   SHARES   cumulative shares of the kept entries (by score rank) per tier
 *   UTILITY  each entry is evicted or given a tier by utility per byte */
#define K_TIERS_ROWS(X) X(K_TIERS_, NONE) X(K_TIERS_, SHARES) X(K_TIERS_, UTILITY)

enum k_layers { K_LAYERS_ROWS(K_ABI_ENUM_) K_LAYERS_COUNT_ };
enum k_heads { K_HEADS_ROWS(K_ABI_ENUM_) K_HEADS_COUNT_ };
enum k_act { K_ACT_ROWS(K_ABI_ENUM_) K_ACT_COUNT_ };
enum k_pool { K_POOL_ROWS(K_ABI_ENUM_) K_POOL_COUNT_ };
enum k_reduce { K_REDUCE_ROWS(K_ABI_ENUM_) K_REDUCE_COUNT_ };
enum k_tiers { K_TIERS_ROWS(K_ABI_ENUM_) K_TIERS_COUNT_ };

/* The C spelling of each value ("K_LAYERS_PYRAMID"), for the emitters. */
static const char *const K_LAYERS_NAMES[] = { K_LAYERS_ROWS(K_ABI_NAME_) };
static const char *const K_HEADS_NAMES[] = { K_HEADS_ROWS(K_ABI_NAME_) };
static const char *const K_ACT_NAMES[] = { K_ACT_ROWS(K_ABI_NAME_) };
static const char *const K_POOL_NAMES[] = { K_POOL_ROWS(K_ABI_NAME_) };
static const char *const K_REDUCE_NAMES[] = { K_REDUCE_ROWS(K_ABI_NAME_) };
static const char *const K_TIERS_NAMES[] = { K_TIERS_ROWS(K_ABI_NAME_) };

#endif
