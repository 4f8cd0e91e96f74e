/* kvp_paged: the paged-engine subset of the policy language (kvp_paged.h). */
#include "kvp_paged.h"

#include <stdarg.h>
#include <stdio.h>

/* Report one reason at loc ("paged: ..." at the place, line and column 1 when unknown)
 * and count it in *bad. */
static void reason(kvp_src *src, int *bad, struct kvp_loc loc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void reason(kvp_src *src, int *bad, struct kvp_loc loc, const char *fmt, ...)
{
	char why[320];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	kvp_src_error(src, kvp_src_loc_at(src, loc.line > 0 ? loc.line : 1, loc.col > 0 ? loc.col : 1),
	              "paged: %s", why);
	(*bad)++;
}

/* The first statistic updated at every step (not over the prompt tail), or -1. */
static int per_step_stat(const struct kvp_ir *ir)
{
	for (int k = 0; k < ir->n_stats; k++)
		if (ir->stats[k].hist != KVP_HIST_PROMPT_TAIL)
			return k;
	return -1;
}

int kvp_paged_check(const struct kvp_ir *ir, kvp_src *src)
{
	static const char *const every[] = {
		[KVP_TRIG_EVERY_STEP] = "every step", [KVP_TRIG_OVER_BUDGET] = "when over budget",
		[KVP_TRIG_EVERY_N] = "every N steps", [KVP_TRIG_PREFILL_BLOCK] = "per prefill block",
	};
	const enum kvp_ir_trigger t = ir->trigger.kind;
	const int k = per_step_stat(ir);
	int bad = 0;
	/* ORDER: the order in which a policy's reasons are reported (docs/vllm.md lists them) */
	if (ir->action.kind != K_ACT_EVICT)
		reason(src, &bad, ir->action.loc, "merging (action = %s): a paged engine has no "
		       "per-entry count, so it cannot add the log n logit bias of a merged entry",
		       ir->action.kind == K_ACT_MERGE ? "merge" : "add_split");
	if (ir->tiers.n != 0)
		reason(src, &bad, ir->tiers.loc,
		       "precision tiers: a paged engine stores one key/value type per cache");
	if (ir->alloc.threshold)
		reason(src, &bad, ir->alloc.loc, "budget = threshold(L): each head would keep its own "
		       "count, and one block holds every KV head of a layer");
	if (ir->positions == KVP_POS_COMPACTED)
		reason(src, &bad, ir->loc, "positions compacted: kept keys would be re-rotated to "
		       "their index; the engine keeps each key's original RoPE position");
	if (ir->alloc.heads != K_HEADS_EACH)
		reason(src, &bad, ir->alloc.loc, "per-head budgets that differ (allocate %s): one "
		       "block holds every KV head of a layer, so every head must keep the same count",
		       ir->alloc.heads == K_HEADS_ADAPTIVE ? "adaptive" : "global");
	if (ir->alloc.layers != K_LAYERS_UNIFORM)
		reason(src, &bad, ir->alloc.loc, "per-layer budgets that differ: one block table "
		       "serves every layer of a request, so every layer must keep the same count");
	if (t != KVP_TRIG_NEVER && t != KVP_TRIG_PROMPT_END)
		reason(src, &bad, ir->trigger.loc,
		       "compresses %s: this version compacts a request once, at the prompt end",
		       every[t]);
	if (k >= 0)
		reason(src, &bad, ir->stats[k].loc, "per-step observe: statistic '%s' is updated at "
		       "every step; the engine gives only the queries of the last prompt window",
		       ir->stats[k].name);
	if (ir->needs & (KVP_NEED_QUERY | KVP_NEED_TRACE | KVP_NEED_HIDDEN))
		reason(src, &bad, ir->score.loc,
		       "%s: the engine gives post-RoPE keys and window queries only",
		       (ir->needs & KVP_NEED_TRACE)    ? "reads the prompt trace (hidden states, surprisal)"
		       : (ir->needs & KVP_NEED_HIDDEN) ? "reads the layers' hidden states (linear_score)"
		                                       : "reads pre-RoPE query statistics");
	if (ir->needs & KVP_NEED_REPLAY)
		reason(src, &bad, ir->score.loc,
		       "reads the context replay's scores (replay_attn): the engine does not replay "
		       "the prompt");
	return bad;
}
