/*
 * rt_budget: the feasibility check of a policy's budget and guards (see rt_budget.h).
 */
#include "policy/rt_budget.h"

#include <math.h>
#include <stdio.h>

/* "12 entries", "1 entry", "2.5 entries", or "25%" for a share */
static void fmt_size(const struct rt_budget *b, double v, char *out, size_t n)
{
	if (b->scale == RT_BUDGET_SHARE)
		snprintf(out, n, "%.6g%%", v * 100);
	else
		snprintf(out, n, "%.6g entr%s", v, v == 1 ? "y" : "ies");
}

/* where a run-time budget came from: " (128 tokens of context / ratio 4)" */
static void fmt_origin(const struct rt_budget *b, char *out, size_t n)
{
	out[0] = 0;
	if (b->scale != RT_BUDGET_ENTRIES || !(b->context > 0))
		return;
	if (b->ratio > 0)
		snprintf(out, n, " (%.6g tokens of context / ratio %.6g)", b->context, b->ratio);
	else if (b->byte_ratio > 0)
		snprintf(out, n, " (%.6g tokens of context / byte ratio %.6g)", b->context,
		         b->byte_ratio);
	else if (b->budget_shared)
		snprintf(out, n, " (a share of %.6g tokens of context)", b->context);
}

static int fail_budget(const struct rt_budget *b, const char *what, double v, int layer,
                       char *msg, size_t n)
{
	char sz[48], org[96], at[32] = "";
	fmt_size(b, v, sz, sizeof sz);
	fmt_origin(b, org, sizeof org);
	if (layer >= 0)
		snprintf(at, sizeof at, " at layer %d", layer);
	snprintf(msg, n, "the %s comes to %s per KV head%s%s, below 1 entry; raise the budget "
	         "or lower the compression ratio", what, sz, at, org);
	return -1;
}

/* The entries the guards keep. In entries, `keep sinks S` keeps the positions below S
 * (ceil(S) entries) and `keep recent R` the positions within R of the newest (floor(R)
 * entries; kernels/k_compress.h), so a share of the context that comes to 6.4 keeps 6;
 * shares stay fractions (compile time, no context yet). The tolerance is
 * k_floor_entries's (kernels/k_alloc.h). */
static double kept_sinks(const struct rt_budget *b)
{
	double s = b->has_sinks ? b->sinks : 0;
	return b->scale == RT_BUDGET_ENTRIES && s > 0 ? ceil(s - 1e-9 * s) : s;
}

static double kept_recent(const struct rt_budget *b)
{
	double r = b->has_recent ? b->recent : 0;
	return b->scale == RT_BUDGET_ENTRIES && r > 0 ? floor(r + 1e-9 * r) : r;
}

/* 1 when rule 3 compares bytes (see rt_budget.h) */
static int in_bytes(const struct rt_budget *b)
{
	return b->scale == RT_BUDGET_ENTRIES && b->entry_bytes > 0 && b->guard_bytes > 0;
}

/* guard sizes: "4" bare inside a sum, with "tokens" (or "%") at the end */
static void fmt_guard(const struct rt_budget *b, double v, int unit, char *out, size_t n)
{
	if (b->scale == RT_BUDGET_SHARE)
		snprintf(out, n, "%.6g%%", v * 100);
	else
		snprintf(out, n, "%.6g%s", v, unit ? (v == 1 ? " token" : " tokens") : "");
}

static int fail_guards(const struct rt_budget *b, double v, int layer, char *msg, size_t n)
{
	char sz[48], org[96], at[32] = "", gs[48], g1[48], g2[48], what[200];
	fmt_size(b, v, sz, sizeof sz);
	fmt_origin(b, org, sizeof org);
	if (layer >= 0)
		snprintf(at, sizeof at, " at layer %d", layer);
	double s = kept_sinks(b), r = kept_recent(b);
	fmt_guard(b, s + r, 1, gs, sizeof gs);
	fmt_guard(b, s, 0, g1, sizeof g1);
	fmt_guard(b, r, 0, g2, sizeof g2);
	if (b->has_sinks && b->has_recent)
		snprintf(what, sizeof what, "sinks %s + recent %s = %s", g1, g2, gs);
	else
		snprintf(what, sizeof what, "%s %s", b->has_sinks ? "sinks" : "recent", gs);
	if (in_bytes(b)) {
		snprintf(msg, n, "the guards (%s at %.6g bytes each, %.6g bytes) exceed the budget "
		         "(%.6g bytes per KV head%s%s); guards count inside the budget: lower them or "
		         "raise the budget", what, b->guard_bytes, (s + r) * b->guard_bytes,
		         v * b->entry_bytes, at, org);
		return -1;
	}
	snprintf(msg, n, "the guards (%s) exceed the budget (%s per KV head%s%s); guards count "
	         "inside the budget: lower them or raise the budget", what, sz, at, org);
	return -1;
}

int rt_budget_check(const struct rt_budget *b, char *msg, size_t n)
{
	if (b->has_sinks && !(b->sinks > 0)) {
		snprintf(msg, n, "the sinks (%.6g) keep nothing; remove `keep sinks` or keep at least "
		         "1 token", b->sinks);
		return -1;
	}
	if (b->has_recent && b->recent < 0) {
		snprintf(msg, n, "the recent window (%.6g) is negative", b->recent);
		return -1;
	}
	/* the guards in the budget's unit: entries, or f16 entries' worth of bytes */
	double g = (kept_sinks(b) + kept_recent(b)) *
	           (in_bytes(b) ? b->guard_bytes / b->entry_bytes : 1.0);
	/* at compile time a share budget has no entry count yet: only rule 3 applies */
	int entries = b->scale == RT_BUDGET_ENTRIES;
	/* the relative tolerance of k_floor_entries: 0.29 x 100 is 29 entries */
	double one = 1 - 1e-9;
	if (!(b->budget > 0) || (entries && b->budget < one))
		return fail_budget(b, "budget", b->budget, -1, msg, n);
	if (b->target != 0 && (!(b->target > 0) || (entries && b->target < one)))
		return fail_budget(b, "target of compress", b->target, -1, msg, n);
	if (g > b->budget * (1 + 1e-9))
		return fail_guards(b, b->budget, -1, msg, n);
	for (int l = 0; b->layer && l < b->n_layer; l++) {
		double v = b->layer[l];
		if (!(v > 0) || (entries && v < one))
			return fail_budget(b, "budget", v, l, msg, n);
		if (g > v * (1 + 1e-9))
			return fail_guards(b, v, l, msg, n);
	}
	return 0;
}
