/* kvp_paged: the paged-engine subset of the policy language (kvp_paged.h). */
#include "kvp_paged.h"

#include <stdio.h>

/* One rule: 1 when ir is outside the paged subset for this reason, with the place and the
 * reason's words. */
typedef int (*paged_rule)(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n);

static int rule_merge(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n)
{
	if (ir->action.kind == K_ACT_EVICT)
		return 0;
	*loc = ir->action.loc;
	snprintf(why, n, "merging (action = %s): a paged engine has no per-entry count, so it "
	         "cannot add the log n logit bias of a merged entry",
	         ir->action.kind == K_ACT_MERGE ? "merge" : "add_split");
	return 1;
}

static int rule_tiers(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n)
{
	if (ir->tiers.n == 0)
		return 0;
	*loc = ir->tiers.loc;
	snprintf(why, n, "precision tiers: a paged engine stores one key/value type per cache");
	return 1;
}

static int rule_positions(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n)
{
	if (ir->positions != KVP_POS_COMPACTED)
		return 0;
	*loc = ir->loc;
	snprintf(why, n, "positions compacted: kept keys would be re-rotated to their index; "
	         "the engine keeps each key's original RoPE position");
	return 1;
}

static int rule_heads(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n)
{
	if (ir->alloc.heads == K_HEADS_EACH)
		return 0;
	*loc = ir->alloc.loc;
	snprintf(why, n, "per-head budgets that differ (allocate %s): one block holds every KV "
	         "head of a layer, so every head must keep the same count",
	         ir->alloc.heads == K_HEADS_ADAPTIVE ? "adaptive" : "global");
	return 1;
}

static int rule_layers(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n)
{
	if (ir->alloc.layers == K_LAYERS_UNIFORM)
		return 0;
	*loc = ir->alloc.loc;
	snprintf(why, n, "per-layer budgets that differ: one block table serves every layer of "
	         "a request, so every layer must keep the same count");
	return 1;
}

static int rule_trigger(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n)
{
	static const char *const kind[] = {
		[KVP_TRIG_EVERY_STEP] = "every step", [KVP_TRIG_OVER_BUDGET] = "when over budget",
		[KVP_TRIG_EVERY_N] = "every N steps", [KVP_TRIG_PREFILL_BLOCK] = "per prefill block",
	};
	const enum kvp_ir_trigger t = ir->trigger.kind;
	if (t == KVP_TRIG_NEVER || t == KVP_TRIG_PROMPT_END)
		return 0;
	*loc = ir->trigger.loc;
	snprintf(why, n, "compresses %s: this version compacts a request once, at the prompt end",
	         kind[t]);
	return 1;
}

static int rule_observe(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n)
{
	for (int k = 0; k < ir->n_stats; k++) {
		if (ir->stats[k].hist == KVP_HIST_PROMPT_TAIL)
			continue;
		*loc = ir->stats[k].loc;
		snprintf(why, n, "per-step observe: statistic '%s' is updated at every step; the "
		         "engine gives only the queries of the last prompt window", ir->stats[k].name);
		return 1;
	}
	return 0;
}

static int rule_needs(const struct kvp_ir *ir, struct kvp_loc *loc, char *why, size_t n)
{
	if (!(ir->needs & (KVP_NEED_QUERY | KVP_NEED_TRACE)))
		return 0;
	*loc = ir->score.loc;
	snprintf(why, n, "%s: the engine gives post-RoPE keys and window queries only",
	         (ir->needs & KVP_NEED_TRACE) ? "reads the prompt trace (hidden states, surprisal)"
	                                       : "reads pre-RoPE query statistics");
	return 1;
}

/* ORDER: the order in which a policy's reasons are reported (docs/vllm.md lists them). */
static const paged_rule rules[] = {
	rule_merge, rule_tiers, rule_positions, rule_heads, rule_layers, rule_trigger,
	rule_observe, rule_needs,
};

int kvp_paged_check(const struct kvp_ir *ir, kvp_src *src)
{
	int bad = 0;
	for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
		struct kvp_loc loc = { 0, 0 };
		char why[320];
		if (!rules[i](ir, &loc, why, sizeof why))
			continue;
		kvp_src_error(src, kvp_src_loc_at(src, loc.line > 0 ? loc.line : 1,
		                                  loc.col > 0 ? loc.col : 1),
		              "paged: %s", why);
		bad++;
	}
	return bad;
}
