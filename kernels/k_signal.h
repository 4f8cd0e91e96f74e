/*
 * k_signal: the scalar signals generated policies read outside the per-entry loops —
 * the context a ratio refers to, the prompt length, the average entries per head and the
 * free room of the store — shared by should_compress, next_trigger and compress.
 */
#ifndef K_SIGNAL_H
#define K_SIGNAL_H

#include <math.h>
#include <stdint.h>

#include "k_abi.h"
#include "kv/rt_kv.h"
#include "policy/rt_policy.h"

/* The context (tokens) a ratio budget refers to when `seen` tokens were seen: the prompt
 * length while the prompt is known (prompt_len >= 0) and not yet exceeded, else the
 * tokens seen. Both back ends (the CUDA one passes its scalar block's prompt_len). */
K_HD double k_context_at(int64_t prompt_len, double seen)
{
	if (prompt_len >= 0 && seen <= (double)prompt_len)
		return (double)prompt_len;
	return seen;
}

/* The prompt length (tokens), or `seen` when unknown (prompt_len < 0). */
K_HD double k_prompt_len_at(int64_t prompt_len, double seen)
{
	return prompt_len >= 0 ? (double)prompt_len : seen;
}

/* k_context_at and k_prompt_len_at of the policy context. */
static inline double k_context(const struct kvp_ctx *ctx, double seen)
{
	return k_context_at(ctx->prompt_len, seen);
}

static inline double k_prompt_len(const struct kvp_ctx *ctx, double seen)
{
	return k_prompt_len_at(ctx->prompt_len, seen);
}

/* The budget in force (entries per head on average; in bytes, the bytes of that many f16
 * entries): the policy's own, unless the runtime overrides it with a compression ratio R
 * in entries (ratio, kvp_ctx.ratio) or in bytes (byte_ratio, kvp_ctx.byte_ratio), then
 * context / R; 0 means no override. Every generated budget_of returns this, on both back
 * ends, with the policy's own budget expression as `own`. */
K_HD double k_budget_of(double ratio, double byte_ratio, double context, double own)
{
	if (ratio > 0)
		return context / ratio;
	if (byte_ratio > 0)
		return context / byte_ratio;
	return own;
}

/* Average entries per (layer, KV head): total / (n_layer × n_kv_head). */
static inline double k_avg_entries(const rt_kv *kv)
{
	return (double)rt_kv_entries(kv) / ((double)kv->n_layer * kv->n_kv_head);
}

/* One entry at the store's top tier in f16 entries' worth: its key and value rows' bytes
 * over an f16 entry's (rt_kv_f16_entry_bytes): 2 for f32 rows, 1 for f16, 34/64 for q8_0.
 * The one conversion between a budget counted in bytes (k_bytes_mode) and entries kept at
 * the top tier: triggers, floors, guards and GraceKV's core. */
static inline double k_top_worth(const rt_kv *kv)
{
	return 2.0 * (double)rt_kv_tier_row_bytes(kv, RT_KV_TIER_TOP) /
	       (double)rt_kv_f16_entry_bytes(kv);
}

/* What one entry counts for when a trigger compares the entries with budget_of: 1, or
 * where the budget counts bytes (a byte ratio, kvp_ctx.byte_ratio, or the policy's
 * `budget = bytes(P)` that no entry ratio replaces: k_bytes_mode) an untiered store's key
 * and value rows in f16 entries' worth (rt_kv_f16_entry_bytes): 2 for f32 rows, 34/64 for
 * q8_0. Compress keeps the bytes of budget_of f16 entries, so a trigger that counted plain
 * entries would fire at the wrong fill (an f32 store under --byte-ratio 4 refilled from
 * N/8 to N/4 entries between compressions). A tiered store: 1 (its schedules fire
 * whatever the count, docs/language.md 7.8). */
static inline double k_trigger_weight(const struct kvp_ctx *ctx, const rt_kv *kv,
                                      int budget_bytes)
{
	if (kv->tiered || !(ctx->byte_ratio > 0 || (budget_bytes && !(ctx->ratio > 0))))
		return 1.0;
	return k_top_worth(kv);
}

/* Entries every head can still append: min over heads of cap - n. */
static inline int32_t k_room(const rt_kv *kv)
{
	int32_t room = kv->cap;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		if (kv->cap - kv->heads[i].n < room)
			room = kv->cap - kv->heads[i].n;
	return room;
}

/* A period (steps or tokens) as a whole number >= 1. */
static inline double k_period(double x)
{
	return x >= 1 ? floor(x) : 1;
}

/* 1 when `seen` is a multiple of period p (p >= 1). */
static inline int k_every(double seen, double p)
{
	return fmod(seen, k_period(p)) == 0;
}

#endif
