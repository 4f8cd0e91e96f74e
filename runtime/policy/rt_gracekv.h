/*
 * rt_gracekv: the glue between a compiled `action = add_split(...)` policy and the GraceKV
 * core (rt_grace). At the prompt end the policy's compress hook hands over the store, its
 * context (ctx: budget override, protected spans, the prompt trace) and the policy's
 * values (rt_gracekv_cfg); this module turns them into one rt_grace_input and runs
 * rt_grace_compress in ctx->scratch:
 *
 *   prefix      the leading entries the policy guards (sinks, protected spans), exact and
 *               uncharged inside the core;
 *   suffix      the trailing protected-span entries (e.g. a `question` span), likewise;
 *   budget      the policy's budget (entries per head on average, or context / ratio) over
 *               ALL entries, so every policy compared at one ratio holds the same number
 *               of entries: the core's uncharged prefix and suffix are taken out of it and
 *               the core's x is set so that its B_total is what is left;
 *   segments    rt_grace_segment over the trace's sampled hidden states and surprisal
 *               (target length = the policy's slot), else fixed slots;
 *   probes      the post-RoPE queries of every layer for the question: the protected
 *               suffix span when there is one, else the last `probe` prompt tokens, from
 *               trace->q_tail; without a trace the core's key stand-ins;
 *   relevance   the policy's score per entry (summed over the group by the generated
 *               code), pooled over the tree region when the policy pools, else the
 *               core's own probe attention;
 *   hops        token-to-token attention of the sampled layers (trace->q against the
 *               stored keys) for the multi-hop value flow, when hops >= 2.
 *
 * Model and sources: docs/gracekv.md ("How the compiled policy reaches the core").
 * Memory: everything lives in the caller's scratch (rt_gracekv_scratch_bytes); nothing
 * is allocated.
 */
#ifndef RT_GRACEKV_H
#define RT_GRACEKV_H

#include <stddef.h>
#include <stdint.h>

#include "policy/rt_grace.h"
#include "kv/rt_kv.h"
#include "policy/rt_policy.h"
#include "base/rt_util.h"

/* The policy's values, as the generated compress fills them (units in brackets). */
typedef struct rt_gracekv_cfg {
	const char *name;       /* policy name, for messages */
	double budget;          /* [entries per head, average] over all entries of the prompt */
	double sinks;           /* [tokens] positions < sinks join the exact prefix; <= 0: none */
	double recent;          /* [tokens] r: newest context tokens kept exactly (charged) */
	double slot;            /* [tokens] target segment length (fixed slots without trace) */
	double floor;           /* [entries per head] singleton floor */
	int floor_each;         /* 1: each head picks its own floor (rt_grace_params) */
	double head_share;      /* coverage floor fraction in [0, 1] (rt_grace_params) */
	double probe;           /* [tokens] the question: prompt-tail tokens whose queries probe */
	int hops;               /* value-flow hops; 1 = direct relevance only */
	int32_t pool;           /* [entries] odd kernel of the max/avg pooling of rel over the
	                           tree region (SnapKV's clustering); <= 1: none */
	int pool_max;           /* 1: max pooling, 0: average (zero padding counts) */
	int key_mode, count_mode; /* rt_grace key / count modes */
	int protect_all_spans;  /* every span id != 0 counts as protected */
	const char *const *spans; /* [n_spans] protected span names */
	int n_spans;
	float *rel;             /* [L × G × n] direct relevance per entry, or NULL; pooled in
	                           place when pool > 1 */
	rt_grace_trace_fn trace; /* NULL, or called for every action the core applies */
	void *trace_user;
} rt_gracekv_cfg;

/* Defaults: slot 64, recent 32, floor 16 per head chosen per head, coverage share 0,
 * probe 64, hops 1, post-RoPE key mean, coherence count, no spans (see docs/gracekv.md). */
void rt_gracekv_cfg_default(rt_gracekv_cfg *c);

/* What one compression did. */
typedef struct rt_gracekv_info {
	int32_t n;              /* entries per head before */
	int32_t prefix, suffix; /* exact uncharged entries at the start / end */
	double x;               /* the core's compression factor */
	int used_trace;         /* 1 when segments and probes came from ctx->trace */
	int32_t n_seg;          /* segments (0 without trace: fixed slots) */
	const int32_t *seg_start; /* [n_seg] their first entries, inside the caller's scratch
	                             (valid until it is reused); NULL when n_seg is 0 */
	int32_t n_probe;        /* probe tokens (0: key stand-ins) */
	rt_grace_stats st;
} rt_gracekv_info;

/* Bytes of scratch rt_gracekv_compress needs for stores shaped like kv: the core's
 * (rt_grace_bytes for KVP_TRACE_TAIL probe tokens) plus probes, segments and work. The
 * hidden size is taken as n_head·head_dim (as in llama models; checked at compress). */
size_t rt_gracekv_scratch_bytes(const rt_kv *kv);

/* Compress kv once at the prompt end. Preconditions: every head holds entries for
 * positions 0..n-1 in order, unmerged (nothing compressed before). ctx supplies span
 * names and the trace (either may be absent: then fixed slots and key probes). scratch:
 * >= rt_gracekv_scratch_bytes(kv) bytes. info may be NULL.
 * Errors (-1, err "policy NAME: ..." or "gracekv: ..."): scratch too small, a store that
 * is not the uncompressed prompt, a budget below the guards (prefix + suffix + recent per
 * head), a trace of another shape, and every error of rt_grace_compress. */
int rt_gracekv_compress(const struct kvp_ctx *ctx, rt_kv *kv, const rt_gracekv_cfg *cfg,
                        void *scratch, size_t len, rt_gracekv_info *info, rt_err *err);

#endif
