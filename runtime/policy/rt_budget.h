/*
 * rt_budget: the one feasibility check of a policy's sizes, shared by the compiler's
 * semantic analysis (kvpc check: parameters at their defaults) and the runtime (every
 * compress, and before a sequence starts: `--set`, `--ratio`, layer schedules, request
 * parameters), so both refuse the same budgets with the same message.
 *
 * The rules, for the budget of every (layer, KV head):
 *   1. `keep sinks S` keeps something: S > 0 (a recent window may be set to 0 at run
 *      time, which turns it off: `--set recent=0`; kvpc refuses a literal `keep recent 0`
 *      as a statement that does nothing);
 *   2. the budget (and the target compress cuts to) is at least 1 entry (a budget that floors to 0 would run on an empty
 *      cache). A budget relative to a context that is still growing (a share of the
 *      context or a --ratio while the prompt length is unknown or passed) is below 1 entry
 *      or below guards of a fixed size only early in a stream: compress then keeps at
 *      least 1 entry per layer and the guards whole (k_budget_check in
 *      kernels/k_compress.h) instead of failing;
 *   3. the guards fit in the budget: sinks + recent <= budget (guards count inside the
 *      budget, docs/language.md section 8). In entries the guards count what they keep:
 *      ceil(sinks) + floor(recent) (a recent window of 10% of 64 tokens keeps 6 entries),
 *      and the message prints those counts. In bytes (entry_bytes > 0: a byte budget or
 *      a --byte-ratio, the budget counted in f16 entries' worth) each guard entry takes
 *      guard_bytes (its key and value rows at the store's top tier: twice an f16 entry on
 *      the exact path's f32 store), so the rule is (sinks + recent) x guard_bytes <=
 *      budget x entry_bytes, and the message prints both sides in bytes.
 * Values are entries per (layer, KV head) (a kept token is one entry), or, at compile
 * time for a budget written as a share of the context, fractions of the context; the
 * message then says so ("25%"). At run time the caller resolves shares against the
 * context first and passes it (and the --ratio in force) so the message can say where
 * the number came from.
 */
#ifndef RT_BUDGET_H
#define RT_BUDGET_H

#include <stddef.h>

/* What the values of a struct rt_budget count. */
enum rt_budget_scale {
	RT_BUDGET_ENTRIES = 0, /* entries per (layer, KV head); tokens count as entries */
	RT_BUDGET_SHARE,       /* fractions of the context (compile time, `budget = 25%`) */
};

/* A policy's sizes as they stand for one context. */
struct rt_budget {
	enum rt_budget_scale scale;
	double budget;          /* the budget, on average per (layer, KV head) */
	double target;          /* what compress cuts to (`compress ... to T`), <= budget;
	                           0: the budget */
	int n_layer;            /* entries of layer[]; 0: every layer keeps `budget` */
	const double *layer;    /* [n_layer] per-layer budgets (layer schedule), or NULL */
	int has_sinks, has_recent; /* the policy has `keep sinks` / `keep recent` */
	double sinks, recent;   /* their sizes (same scale as budget) */
	double context;         /* tokens of context shares and ratios refer to; 0: unknown */
	double ratio;           /* the compression factor in force (budget = context / ratio),
	                           0: the policy's own budget */
	int budget_shared;      /* the policy's own budget is a share of the context */
	double byte_ratio;      /* the compression factor in bytes in force, 0: none */
	double entry_bytes;     /* > 0: the budget counts bytes, entry_bytes a unit (an f16
	                           entry, 4 x head_dim); 0: entries */
	double guard_bytes;     /* with entry_bytes: bytes one guard entry takes (the top
	                           tier's key and value rows) */
};

/* Check b against rules 1-3 above. Returns 0, or -1 with a one-line message (no
 * trailing newline, no "policy NAME:" prefix: callers add their place) in msg[0..n). */
int rt_budget_check(const struct rt_budget *b, char *msg, size_t n);

#endif
