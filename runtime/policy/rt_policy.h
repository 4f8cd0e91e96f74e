/*
 * rt_policy: the policy ABI — what a policy compiled by kvpc exports and how the runtime
 * drives it (docs/runtime_abi.md). A compiled policy is one `const struct kvp_policy`: its
 * name and source, its parameters (runtime knobs with defaults and units), the size of its
 * per-entry statistics and per-head state, its position convention, what the runtime must
 * hand it (needs flags), and five hooks:
 *
 *   init_entries     after entries are appended to a head (new positions, keys, values)
 *   observe          after the attention of ONE query token over one KV head's entries:
 *                    the probabilities of every query head of the group, the attention
 *                    output o of each, the step (= the query token's position)
 *   should_compress  after each step or chunk: 1 if compress must run now
 *   compress         the whole cache (all layers and heads), so allocation across layers
 *                    and heads is possible
 *   next_trigger     how many more tokens may be appended before the policy must run, so
 *                    the runtime processes the largest chunk that cannot cross a trigger
 *                    and chunked evaluation equals token-by-token evaluation
 *
 * Units used throughout: "entries" are slots of one (layer, KV head) list, "tokens" are
 * positions of the text, "steps" are query tokens processed (one observe per step, layer
 * and KV head). Statistics are stored in 4-byte words per entry: stat_words_entry shared
 * words plus stat_words_qhead words for each query head of the group, so
 * stat_bytes = 4 × (stat_words_entry + group × stat_words_qhead); the same for per-head
 * state: state_bytes = 4 × (state_words + head_dim × state_words_dim + head_dim² ×
 * state_words_dim2).
 *
 * The runtime owns everything passed in; hooks never allocate. compress works in
 * ctx->scratch (at least scratch_bytes(kv, T) bytes, 64-byte aligned, allocated once) and
 * may split its per-(layer, KV head) work over the T threads of ctx->pool.
 */
#ifndef RT_POLICY_H
#define RT_POLICY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/rt_pool.h"
#include "kv/rt_kv.h"

#define KVP_ABI_VERSION 15 /* 7: struct kvp_policy.budget_bytes; 8: .measure; 9: kvp_ctx.rope_freq;
                            10: kvp_ctx.layer_window, kvp_policy.global_only;
                            11: enum rt_kv_tier gains RT_KV_TIER_K8V4 (q4, q2 renumbered);
                            12: kvp_ctx.replay, replay_n (KVP_NEED_REPLAY);
                            13: kvp_ctx.n_embd, layer_in, kvp_policy.hidden_shape,
                            hidden_file (KVP_NEED_HIDDEN);
                            14: kvp_policy.check_params;
                            15: kvp_policy.statements */

/* Unit of a parameter value: what the number counts. ORDER(unit): compiler/kvp_emit_c.c
 * names each value, runtime/policy/rt_policy.c kvp_unit_name and rt_param_format too. */
enum kvp_unit {
	KVP_UNIT_SCALAR = 0, /* a plain number (thresholds, EMA rates, exponents) */
	KVP_UNIT_ENTRIES,    /* entries of one (layer, KV head) list */
	KVP_UNIT_TOKENS,     /* token positions of the text */
	KVP_UNIT_RATIO,      /* a fraction of the context (0..1) or a compression factor */
	KVP_UNIT_STEPS,      /* query steps (decode or prefill tokens processed) */
	KVP_UNIT_COUNT_
};

/* Where kept keys sit after compaction (docs/architecture.md, "The KV store"). */
enum kvp_positions {
	KVP_POS_ORIGINAL = 0, /* keys keep the RoPE of their original position (H2O, SnapKV, TOVA) */
	KVP_POS_COMPACTED,    /* the runtime re-rotates kept keys to their index in the cache
	                         (StreamingLLM) after each compress */
};
/* Either way rt_kv_head.pos keeps each entry's ORIGINAL position: policies use it for
 * guards (sinks, recent), ages and the tie rule. Under COMPACTED the runtime tracks the
 * rotation separately (entry i is rotated to index i, the query to index n). */

/* Processing phase of the sequence. */
enum kvp_phase {
	KVP_PHASE_PREFILL = 0, /* tokens of the prompt (the context to compress) */
	KVP_PHASE_DECODE,      /* generated or scored continuation tokens */
};

/* How a policy's quality is measured (runtime/eval/rt_eval.h, rt_eval_split_of: ppl, ab,
 * tune and `kvpc build --gate` alike), compiled from its trigger (compiler/kvp_ir.h, enum
 * kvp_ir_trigger). A prompt-end policy compresses once, after the prompt's last token: fed a
 * text as its whole prompt it never compresses before a scored token, so it is scored on
 * the tokens that follow a prompt instead. */
enum kvp_measure {
	KVP_MEASURE_STREAM = 0, /* compresses as tokens arrive (every step, per block, over a
	                           threshold, every N steps) or never: the whole text is the
	                           prompt, every token is scored */
	KVP_MEASURE_PROMPT_END, /* `compress at prompt end`: the first part of the text is the
	                           prompt, the tokens after it are scored */
};

/* What the runtime must compute and pass to the hooks (bit flags of needs). ORDER(needs):
 * compiler/kvp_emit_c.c names bit b as needs[b]; a new flag goes at the end of both. */
enum {
	KVP_NEED_ATTN = 1u << 0,   /* observe needs the attention probabilities */
	KVP_NEED_OUT = 1u << 1,    /* observe needs the attention outputs o */
	KVP_NEED_KEYS = 1u << 2,   /* init_entries / compress read keys */
	KVP_NEED_VALUES = 1u << 3, /* init_entries / compress read values */
	KVP_NEED_SPANS = 1u << 4,  /* compress reads protected span ids (rt_kv_head.span) */
	KVP_NEED_PROMPT_LEN = 1u << 5, /* the prompt length must be known before prefill
	                                  (observation windows over the prompt tail, triggers
	                                  at the prompt end); with prompt_len -1 they never
	                                  fire */
	KVP_NEED_TRACE = 1u << 6, /* compress reads the prompt trace (struct kvp_trace: hidden
	                             states and queries of sampled layers, the queries of every
	                             layer for the prompt tail, per-token surprisal), which the
	                             runtime records while the prompt is processed; implies
	                             KVP_NEED_PROMPT_LEN */
	KVP_NEED_F32_KV = 1u << 7, /* compress reads and rewrites the stores' key and value rows
	                              as f32 arrays (GraceKV's core, kernels/k_grace.h):
	                              rt_run_init refuses a store of another element type */
	KVP_NEED_TIERS = 1u << 8,  /* compress sets entry precision tiers
	                              (rt_kv_head_set_tiers): the runtime creates the policy's
	                              stores with rt_kv_init_tiered, top tier f16 (f32 on the
	                              exact path); excludes KVP_NEED_F32_KV */
	KVP_NEED_QUERY = 1u << 9,  /* observe needs the pre-RoPE query rows (kvp_obs.query) and
	                              compress the model's RoPE (kvp_ctx.rope_base, n_rot):
	                              Expected Attention's query statistics */
	KVP_NEED_REPLAY = 1u << 10, /* compress reads the context replay's scores (kvp_ctx.replay:
	                               KVzip's largest attention over a replay of the prompt,
	                               runtime/policy/rt_replay.h), which the runtime measures
	                               when the prompt ends, before the compress there */
	KVP_NEED_HIDDEN = 1u << 11, /* init_entries reads the layer's normalised input rows of
	                              the new entries (kvp_ctx.layer_in): linear_score(), KVzap */
};

/* Layers the prompt trace samples, and the prompt-tail length whose queries it keeps for
 * every layer. */
#define KVP_TRACE_LAYERS 4
#define KVP_TRACE_TAIL 128

/* The prompt trace (KVP_NEED_TRACE): what the forward computed for each prompt token that
 * the KV store does not keep, recorded by the runtime (rt_seq) for positions
 * 0 .. n-1 of the prompt (row = position), so a one-shot compress at the prompt end can
 * segment the text by its hidden-state trajectory and surprisal and probe the cache with
 * the question's queries (GraceKV, docs/gracekv.md). All arrays are runtime-owned
 * and valid during compress; rows at positions >= n are undefined. Queries are post-RoPE
 * exactly as the attention used them (under KVP_POS_COMPACTED: rotated at the entry
 * index, not the position). */
struct kvp_trace {
	int32_t n;              /* prompt positions recorded (== prompt length once done) */
	int32_t cap;            /* rows per sampled layer in hid and q */
	int n_layer, n_embd, n_head, head_dim;
	int n_sample;           /* KVP_TRACE_LAYERS */
	int sample_layer[KVP_TRACE_LAYERS]; /* increasing; round((s+1)·n_layer/4) - 1 */
	const float *hid;       /* [n_sample × cap × n_embd]: the residual stream after layer
	                           sample_layer[s], RMS-normalised (x / rms(x), no weight) */
	const float *q;         /* [n_sample × cap × n_head·head_dim]: the post-RoPE queries of
	                           layer sample_layer[s] (query head h at h·head_dim) */
	int32_t tail_start;     /* first position of the tail: max(0, prompt_len - TAIL) */
	int32_t tail_n;         /* tail rows recorded: positions tail_start .. +tail_n-1 */
	const float *q_tail;    /* [n_layer × KVP_TRACE_TAIL × n_head·head_dim]: every layer's
	                           post-RoPE queries of the tail positions (row = pos -
	                           tail_start) */
	const float *surprisal; /* [cap]: -log p(token at p | tokens < p) in nats, from the
	                           logits the forward computed (with the cache the policy kept
	                           then: the full prompt for a prompt-end policy); [0] = 0 */
};

/* One runtime knob. The runtime copies the defaults into kvp_ctx.params and applies
 * `--set name=value` overrides; hooks read ctx->params[i], never the default. */
struct kvp_param {
	const char *name;    /* as written in the .kvp file */
	double def;          /* default value */
	enum kvp_unit unit;
	const char *doc;     /* one line, may be "" */
	int budget_only;     /* 1: only the budget's expression reads it, so a compression-ratio
	                        override (kvp_ctx.ratio) replaces it and it is not in effect
	                        (kvp_param_in_effect) */
};

/* The per-sequence context the runtime passes to every hook. */
struct kvp_ctx {
	const double *params;   /* [n_params] current parameter values */
	int64_t seen;           /* tokens appended to the cache so far (positions 0..seen-1) */
	int64_t prompt_len;     /* tokens of the prompt, or -1 when unknown (pure streaming) */
	enum kvp_phase phase;   /* phase of the last processed token */
	int prompt_done;        /* 1 once every prompt token has been processed */
	int64_t compress_count; /* compress calls so far in this sequence */
	int64_t last_compress_seen; /* ctx.seen at the last compress (0 if none) */
	const char *const *span_names; /* [n_spans + 1] names of the request's protected spans,
	                                  span id s (1..n_spans) is span_names[s]; [0] unused */
	int n_spans;
	void *scratch;          /* >= policy->scratch_bytes(kv, T) bytes for compress */
	size_t scratch_len;
	rt_pool *pool;          /* T = rt_pool_threads(pool) threads compress may use for its
	                           per-head work (NULL: the calling thread alone); the kept
	                           sets do not depend on T */
	double ratio;           /* compression factor override R (> 1), 0 = none: the budget
	                           becomes context / R entries per head (k_context: the prompt
	                           length while known, else the tokens seen) in place of the
	                           policy's own budget; schedules, allocation and targets
	                           written relative to the budget follow it, guards keep their
	                           values (compress fails when they exceed it) */
	const struct kvp_trace *trace; /* the prompt trace (KVP_NEED_TRACE), else NULL */
	float rope_base;        /* the model's RoPE (base/rt_rope.h): frequency base and rotated */
	int n_rot;              /* dimensions per head; n_rot 0 = no rotation (set by rt_seq) */
	const double *rope_freq; /* [n_layer × n_rot/2] each layer's frequencies (rt_model
	                           rope_freq: a sliding-window layer's own base, RoPE scaling),
	                           or NULL: every layer at rope_base (kernels/k_expattn.h
	                           k_ea_freq reads it) */
	const int32_t *layer_window; /* [n_layer] each layer's sliding window in tokens (0: full
	                           attention), or NULL: every layer full (`layers = global_only`
	                           leaves the windowed ones alone: kernels/k_compress.h) */
	double byte_ratio;      /* compression factor in bytes R (> 1), 0 = none: the budget
	                           becomes 1/R of the bytes of an f16 full cache of the context
	                           (k_context × rt_kv_f16_entry_bytes per head) in place of the
	                           policy's own; at most one of ratio and byte_ratio is set
	                           (kernels/k_compress.h k_bytes_mode reads the budget) */
	/* Graceful budgets (k_budget_check in kernels/k_compress.h): */
	double min_kv;          /* the runtime's floor in tokens (--min-kv N), 0 = none: the
	                           budget and the target are at least min(N, context) entries
	                           per head, whatever the policy's budget or a ratio, so a
	                           prompt of N tokens or fewer stays whole (a policy's own
	                           `budget = B min F` is a floor too: the larger one holds) */
	                        /* KVP_MIN_KV_STRICT: no floor at all, not even the policy's
	                           (no door sets it: the oracle tests of the papers' algorithms
	                           at a few tokens, tests/test_policies.c) */
	unsigned *notes;        /* where check and compress record what they did instead of
	                           failing (KVP_NOTE_*, or-ed), or NULL */
	double *in_force;       /* NULL, or [2] where check and compress record the budget and
	                           the target in force, entries per (layer, KV head) on average
	                           (k_budget_check: the floor and guards raised, as compress
	                           keeps them); rt_policy_budget_at sets it */
	const float *replay;    /* KVP_NEED_REPLAY: [n_layer × n_kv_head × replay_n] the largest
	                           attention each prompt position received during the context
	                           replay, row (layer · n_kv_head + kv_head), column = the entry's
	                           original position (runtime/policy/rt_replay.h); NULL until the
	                           replay ran */
	int64_t replay_n;       /* positions per row of replay (the prompt length) */
	/* KVP_NEED_HIDDEN (linear_score(), KVzap arXiv 2601.07891): */
	int n_embd;             /* the model's hidden size (set by rt_seq; 0 = unknown) */
	const float *layer_in;  /* during init_entries only: [n × n_embd] the rows the layer's
	                           attention projected into the n new entries' keys and values,
	                           i.e. the residual stream after the layer's input RMSNorm
	                           (weight applied), row r = entry first + r; NULL elsewhere,
	                           and NULL when no forward computed them (rt_shared) */
};

/* kvp_ctx.min_kv: budgets exactly as the policy's budget expression says, without its
 * `min` floor either. */
#define KVP_MIN_KV_STRICT (-1.0)

/* What a graceful budget did (kvp_ctx.notes). */
enum {
	KVP_NOTE_FLOOR = 1u << 0,  /* the floor (min_kv) raised the budget */
	KVP_NOTE_GUARDS = 1u << 1, /* the guards exceeded the budget, which was raised to hold
	                              them (an error before) */
	KVP_NOTE_SPAN = 1u << 2,   /* a protected span held more entries than the budget left
	                              after the other guards: it was kept whole, so the head
	                              holds more than its budget */
	KVP_NOTE_LAST = KVP_NOTE_SPAN /* the highest note (a loop over the notes ends here) */
};

/* What observe receives for one query token (one step) over one KV head. The entries
 * visible to this query are the first n of the head: every entry appended before the
 * query's chunk (in any order: a compaction moves tail entries into evicted slots,
 * runtime/kv/rt_kv.h) and the chunk's entries up to the query's own, in position order. */
struct kvp_obs {
	int64_t step;          /* position of the query token; tokens seen = step + 1 */
	int32_t n;             /* visible entries */
	int group;             /* query heads sharing the KV head */
	const float *probs;    /* [group × n] attention probabilities, row r (query head r of
	                          the group) at probs + r × n, each row summing to 1 over the
	                          visible entries (log-count bias included); NULL unless
	                          KVP_NEED_ATTN */
	const float *out;      /* [group × head_dim] attention outputs, or NULL unless
	                          KVP_NEED_OUT */
	const float *query;    /* [group × head_dim] the query rows of the group BEFORE RoPE,
	                          or NULL unless KVP_NEED_QUERY */
};

struct kvp_policy {
	int abi_version;        /* KVP_ABI_VERSION */
	const char *name;       /* policy name as written in the .kvp file */
	const char *source;     /* path of the .kvp file the code was generated from */
	const char *source_hash; /* 16 hex digits, FNV-1a 64 of the source bytes */
	const char *summary;    /* one-line description (the leading comment), may be "" */
	int n_params;
	const struct kvp_param *params; /* [n_params] */
	uint32_t stat_words_entry; /* per-entry words shared by the group */
	uint32_t stat_words_qhead; /* per-entry words for each query head */
	uint32_t state_words;      /* per-head state words */
	uint32_t state_words_dim;  /* per-head state words per head_dim */
	enum kvp_positions positions;
	unsigned needs;         /* KVP_NEED_* */

	/* Entries [first, first + n) of head (layer, kv_head) were just appended (statistics
	 * already zeroed by rt_kv_append). May be NULL. */
	void (*init_entries)(const struct kvp_ctx *ctx, rt_kv *kv, int layer, int kv_head,
	                     int32_t first, int32_t n);
	/* One step of attention over head (layer, kv_head). May be NULL. On the fast path the
	 * runtime calls it from several threads at once, for different KV heads of one layer
	 * (rt_seq sets rt_fwd.observe_parallel): it may write only the statistics and state
	 * of head (layer, kv_head), which every emitted policy does. */
	void (*observe)(const struct kvp_ctx *ctx, rt_kv *kv, int layer, int kv_head,
	                const struct kvp_obs *obs);
	/* 1 when compress must run now (after ctx->seen tokens), else 0. */
	int (*should_compress)(const struct kvp_ctx *ctx, const rt_kv *kv);
	/* Compress the whole cache. Returns 0, or -1 with err set (e.g. scratch too small).
	 * NULL (with scratch_bytes NULL) for a policy that never compresses. */
	int (*compress)(const struct kvp_ctx *ctx, rt_kv *kv, rt_err *err);
	/* How many tokens k may be appended (and observed) before the policy must run:
	 * should_compress stays 0 after 1 .. k-1 more tokens and may be 1 after k. Bounded
	 * by the room of the store (min over heads of cap - n): a policy that never runs
	 * returns the room, and 0 means some head is full. The runtime feeds chunks of at
	 * most k tokens, which makes chunked processing equal to token-by-token. */
	int32_t (*next_trigger)(const struct kvp_ctx *ctx, const rt_kv *kv);
	/* Bytes of ctx->scratch compress needs for this store's shape on n_threads (>= 1)
	 * threads of ctx->pool. */
	size_t (*scratch_bytes)(const rt_kv *kv, int n_threads);
	/* Check the budget and guards in force for a sequence whose context is its prompt
	 * (ctx->prompt_len >= 0 tokens) with ctx's parameters and ratio, on kv's shape, before
	 * the sequence starts: the rules of runtime/policy/rt_budget.h, which compress applies
	 * again every time it runs. May use ctx->scratch. Returns 0, or -1 with err
	 * "policy NAME: reason". NULL (with compress) for a policy that never compresses. */
	int (*check)(const struct kvp_ctx *ctx, const rt_kv *kv, rt_err *err);
	uint32_t state_words_dim2; /* per-head state words per head_dim² (query covariances) */
	int budget_bytes;       /* 1: the policy's own budget counts bytes (`budget = bytes(P)`,
	                           docs/language.md); with KVP_NEED_TIERS the policy stores
	                           entries at several precisions: `kvpc tune` then searches a
	                           byte ratio by default */
	unsigned tier_rotate;   /* with KVP_NEED_TIERS: bit 0 keys, bit 1 values are stored
	                           rotated at the quantised tiers (rt_kv_set_rotation); 0 none */
	enum kvp_measure measure; /* how its quality is measured (see enum kvp_measure) */
	int global_only;        /* 1: `layers = global_only`: the sliding-window layers are the
	                           model's, not compressed, and compression is counted over the
	                           other layers (eval/rt_compression.h) */
	/* KVP_NEED_HIDDEN (linear_score("FILE")): the model the compiled-in scorer was trained
	 * for, {layers, KV heads, hidden size}, and FILE as the policy names it; rt_seq_init
	 * refuses a model of another shape */
	int hidden_shape[3];
	const char *hidden_file;
	/* The value rules (enum kvp_rule) of the settings whose value reads parameters (an
	 * ema rate, a window, a trigger period written with a parameter), on params
	 * [n_params]: kvpc checked them on the defaults, this on the values a run sets.
	 * Returns 0, or -1 with err (kvp_rule_fail). NULL: no such setting. */
	int (*check_params)(const struct kvp_policy *self, const double *params, rt_err *err);
	/* The statements as written (kvpc: one a line, comments dropped, `param`s left out as
	 * params[] lists them): what `BIN info` shows of the algorithm. "" or NULL: none. */
	const char *statements;
};

/* The value rules of a policy's scalar settings, one row each: X(ID, test of double v,
 * what a valid value is). kvpc's checker (compiler/kvp_sema.c) applies them to the values
 * under the defaults, and the policy's emitted check_params to a run's values, so a
 * --set or a request's kv.set cannot give a value the compiler would refuse. */
#define KVP_RULES(X)                                                                 \
	X(POSITIVE, v > 0, "a number > 0")                                           \
	X(POSITIVE_INT, v > 0 && v == floor(v), "a whole number > 0")                \
	X(NONNEG, v >= 0, "a number >= 0")                                           \
	X(NONNEG_INT, v >= 0 && v == floor(v), "a whole number >= 0")                \
	X(RATE, v > 0 && v <= 1, "in (0, 1]")                                        \
	X(FRACTION, v >= 0 && v <= 1, "in [0, 1]")                                   \
	X(PERIOD, v >= 1 && v == floor(v), "a whole number >= 1")                    \
	X(SHARE, v > 0 && v <= 1, "above 0% and at most 100%")

enum kvp_rule {
#define KVP_RULE_ID_(id, test, text) KVP_RULE_##id,
	KVP_RULES(KVP_RULE_ID_)
#undef KVP_RULE_ID_
	KVP_RULE_COUNT_
};

/* 1 when v obeys rule r (a NaN obeys none). */
static inline int kvp_rule_ok(enum kvp_rule r, double v)
{
	switch (r) {
#define KVP_RULE_OK_(id, test, text) case KVP_RULE_##id: return (test);
	KVP_RULES(KVP_RULE_OK_)
#undef KVP_RULE_OK_
	default: return 0;
	}
}

/* What a value obeying rule r is ("in (0, 1]"). */
static inline const char *kvp_rule_text(enum kvp_rule r)
{
	static const char *const text[KVP_RULE_COUNT_] = {
#define KVP_RULE_TEXT_(id, test, txt) [KVP_RULE_##id] = txt,
		KVP_RULES(KVP_RULE_TEXT_)
#undef KVP_RULE_TEXT_
	};
	return (unsigned)r < KVP_RULE_COUNT_ ? text[r] : "?";
}

/* check_params' error: "policy NAME: WHAT must be TEXT; got V with the values set (SOURCE
 * line L)" with code RT_ERR_INPUT. Returns -1. Inline (with kvp_rule_text), as the
 * emitted policy calls it: a test builds a policy as a shared object with a few runtime
 * files (base/, kv/, rt_budget.c), not rt_policy.c. */
static inline int kvp_rule_fail(rt_err *err, const struct kvp_policy *p, enum kvp_rule r,
                                const char *what, int line, double v)
{
	const int pct = r == KVP_RULE_SHARE; /* a share reads as the percentage it was set as */
	return rt_err_setc(err, RT_ERR_INPUT, "policy %s: %s must be %s; got %.9g%s with the values "
	                   "set (%s line %d)", p->name, what, kvp_rule_text(r), pct ? v * 100 : v,
	                   pct ? "%" : "", p->source, line);
}

/* p's check_params on vals [n_params] (0 when it has none); kvp_policy_param_set's callers
 * run it once the last "name=value" is applied (rt_pick_vals, tune, the shared library). */
int kvp_policy_params_check(const struct kvp_policy *p, const double *vals, rt_err *err);

/* Bytes of per-entry statistics and per-head state a store needs for policy p with this
 * GQA group size and head_dim (pass them to rt_kv_init). */
size_t kvp_policy_stat_bytes(const struct kvp_policy *p, int group);
size_t kvp_policy_state_bytes(const struct kvp_policy *p, int head_dim);

/* 1 when parameter i of p is in effect under the compression ratio R (0: none): every
 * parameter is, except one that only the budget reads while R replaces the budget. */
int kvp_param_in_effect(const struct kvp_policy *p, int i, double R);

/* Index of the parameter called name, or -1. */
int kvp_policy_param_index(const struct kvp_policy *p, const char *name);

/* Fill vals[0..n_params) with the defaults. */
void kvp_policy_param_defaults(const struct kvp_policy *p, double *vals);

/* Apply one "name=value" override to vals. The value is the command lines' strict number
 * (base/rt_numparse.h rt_parse_double: no spaces, hex, inf or nan; at most 63 characters);
 * a ratio parameter also accepts a percentage ("25%" = 0.25). Fails (-1, err "policy NAME:
 * ...", an unknown name's listing the policy's parameters, cut at 255 bytes) on an unknown
 * name, a value that is not such a number, a negative ratio, a ratio above 1 written without its percent sign
 * ("20": 2000%; "150%" passes), or an entries/tokens/steps value that is not a whole
 * number in [0, 1e9] (the same unit rules kvpc applies to the defaults). Budget-versus-guard
 * feasibility is checked when compress runs, against the values then in force. */
int kvp_policy_param_set(const struct kvp_policy *p, double *vals, const char *assign,
                         rt_err *err);

/* A parameter value as the .kvp source writes it: a ratio as a percentage ("12.5%"), a
 * count with its unit word ("32 tokens", "1 entry", "400 steps"), a plain number as is;
 * into buf[0..n) (always terminated). rt_param_format_set gives the `--set` form, which
 * omits the unit word (`--set NAME=VALUE` takes "12.5%" or "32"). */
void rt_param_format(const struct kvp_param *q, double v, char *buf, size_t n);
void rt_param_format_set(const struct kvp_param *q, double v, char *buf, size_t n);

/* Name of a unit ("entries", "tokens", ...). */
const char *kvp_unit_name(enum kvp_unit u);

/* ---- driving a policy (what the runtime's sequence loop calls) ---------------------
 *
 * One rt_run per sequence slot: the parameter values, the context and the scratch
 * area, allocated once by rt_run_init. Per chunk the runtime asks rt_run_chunk how
 * many tokens it may process, appends them to the store (calling init_entries), runs
 * attention with observe for each token, then calls rt_run_advance, which moves the
 * context forward and compresses when the policy says so:
 *
 *   rt_run_init(&run, &kv, policy, L, G, R, d, cap, prompt_len, &err);
 *   while (tokens remain) {
 *       k = rt_run_chunk(&run, &kv, max_chunk);        // 0: the store is full
 *       for each (layer, kv head): rt_kv_append the k new entries (+ init_entries)
 *       forward the k tokens; in each layer, for each query token t of the chunk and
 *           each KV head: softmax over the entries with pos <= t (logit + log_count),
 *           then policy->observe(&run.ctx, &kv, layer, g, &(struct kvp_obs){ t, n_vis,
 *           R, probs [R × n_vis], outs [R × d] })
 *       rt_run_advance(&run, &kv, k, &err);            // may compress
 *   }
 *
 * so a chunk never crosses a trigger or the prompt end and chunked evaluation equals
 * token-by-token evaluation (tests/test_policies.c checks this).
 *
 * Chunked prefill (rt_run_set_prefill_chunk, opt-in): while the prompt is processed a
 * chunk may cross the policy's triggers, up to prefill_chunk tokens (and the store's
 * room), so a per-step policy (`compress every step`: H2O, TOVA, Scissorhands) prefills
 * in chunks of C tokens instead of one token at a time. Every token of the chunk is
 * observed as usual (its attention over the entries before it and the chunk's earlier
 * tokens), and the policy compresses to its budget once at the chunk's end. The store
 * then holds up to budget + C entries per head before that compress. Decode steps and
 * the prompt end are never crossed, so the schedule after the prompt is unchanged. */
struct rt_run {
	const struct kvp_policy *p;
	double *params;          /* [n_params], defaults then --set overrides */
	struct kvp_ctx ctx;
	void *scratch;
	size_t scratch_len;
	int64_t compressions;    /* compress calls in this sequence */
	double policy_seconds;   /* time spent in should_compress/compress/next_trigger */
	int32_t prefill_chunk;   /* 0: exact schedule; C > 0: prompt chunks of up to C
	                            tokens may cross triggers (see above) */
	int64_t due_at;          /* the token count at which the trigger a chunk crossed fell
	                            (rt_run_chunk), so the chunk's end compresses; 0: none */
	unsigned notes;          /* KVP_NOTE_* of this sequence (ctx.notes points here) */
	/* NULL, or the compress rt_run_advance calls in place of the policy's when it fires:
	 * a device that holds the store (rt_seq_attach, runtime/cuda) runs the policy's
	 * compress there and leaves the host store's entry counts as the device's */
	int (*compress_on)(void *user, struct kvp_ctx *ctx, rt_kv *kv, rt_err *err);
	void *compress_user;
};

/* Create the store kv (n_layer × n_kv_head heads of cap entries, statistics and state
 * sized for p) and the run state for it. prompt_len: tokens of the prompt, -1 when
 * unknown. Returns 0, or -1 with err set (bad shape, allocation failure); on failure
 * both are left freed. */
int rt_run_init(struct rt_run *r, rt_kv *kv, const struct kvp_policy *p, int n_layer,
                 int n_kv_head, int group, int head_dim, int32_t cap, int64_t prompt_len,
                 rt_err *err);
/* The same with a store of element type kv_type (rt_run_init: RT_KV_F32). Also refuses
 * a policy with KVP_NEED_F32_KV on any other type ("policy gracekv: its compress reads
 * and rewrites f32 key/value rows; it needs --kv-type f32, not f16"). A policy with
 * KVP_NEED_TIERS gets a tiered store (rt_kv_init_tiered) whose top tier is kv_type; it
 * is refused with a kv_type other than f16/f32, with KVP_NEED_F32_KV, or on a head_dim
 * that is not a multiple of 32. */
int rt_run_init_typed(struct rt_run *r, rt_kv *kv, enum rt_kv_type kv_type,
                      const struct kvp_policy *p, int n_layer, int n_kv_head, int group,
                      int head_dim, int32_t cap, int64_t prompt_len, rt_err *err);
void rt_run_free(struct rt_run *r);

/* Let compress split its per-(layer, KV head) work over the threads of pool (NULL: one
 * thread, the caller's): sizes the scratch for rt_pool_threads(pool) threads. The pool
 * must outlive the run and serve nothing else while rt_run_advance runs. Returns 0, or -1
 * with err (allocation failure; the run keeps its previous scratch and pool). */
int rt_run_set_pool(struct rt_run *r, const rt_kv *kv, rt_pool *pool, rt_err *err);

/* Start a new sequence on the same store: empty the store (rt_kv_reset), zero the
 * counters, keep the parameter values. */
void rt_run_reset(struct rt_run *r, rt_kv *kv, int64_t prompt_len);

/* Apply "name=value" (see kvp_policy_param_set). */
int rt_run_set(struct rt_run *r, const char *assign, rt_err *err);

/* The ratio rule of the library and of every front door (runtime/policy/rt_pick.h): R is
 * 0 (none) or a finite number >= 1 (bytes 1: a ratio in bytes). Returns 0, or -1 with
 * "compression ratio[ in bytes] must be a finite number >= 1, got R" in err (RT_ERR_INPUT;
 * the caller prefixes its place). */
int rt_ratio_check(double R, int bytes, rt_err *err);

/* Override the policy's budget with a compression factor: budget = context / R entries
 * per head (see kvp_ctx.ratio); R = 0 removes the override. Fails (-1, err) unless R is
 * 0 or a finite number >= 1, or when the policy never compresses (no budget). */
int rt_run_set_ratio(struct rt_run *r, double R, rt_err *err);

/* Override the policy's budget with a compression factor in bytes: 1/R of the bytes of an
 * f16 full cache of the context per head (see kvp_ctx.byte_ratio); replaces an entry ratio
 * (and rt_run_set_ratio replaces this one); R = 0 removes it. Same errors as
 * rt_run_set_ratio. */
int rt_run_set_byte_ratio(struct rt_run *r, double R, rt_err *err);

/* Check the parameters, ratio and layer schedule in force against the store kv before a
 * sequence with a known prompt starts (policy->check: every layer's budget at least 1
 * entry per KV head, the guards inside it, with the same message kvpc check gives).
 * Nothing to check (0) for a policy that never compresses or an unknown prompt length
 * (compress checks then, each time it runs). Returns 0, or -1 with err set. Call it
 * after rt_run_init/rt_run_reset and the --set/--ratio overrides; request parameters
 * of a server go through the same call. */
int rt_policy_check(struct rt_run *r, const rt_kv *kv, rt_err *err);

/* The budget compress keeps in force once the context is `context` tokens (> 0), with r's
 * parameters and ratio, on kv's shape: entries per (layer, KV head) on average, into
 * *budget — the ratio's or the policy's budget raised by the floor (`budget = B min F`,
 * kvp_ctx.min_kv) and by guards that exceed it under that floor (k_budget_check in
 * kernels/k_compress.h), what the policy really keeps. r is left as it was (no notes
 * recorded). Returns 0, or -1 with err: a policy that never compresses (no check), or a
 * budget check that fails at that context. */
int rt_policy_budget_at(struct rt_run *r, const rt_kv *kv, int64_t context, double *budget,
                        rt_err *err);

/* Chunked prefill: prompt chunks of up to C tokens (1..65536) cross the policy's triggers
 * and the policy compresses once at each chunk's end; 0 restores the exact schedule.
 * Kept by rt_run_reset. Fails (-1, err) on a C outside 0..65536. */
int rt_run_set_prefill_chunk(struct rt_run *r, int32_t C, rt_err *err);

/* Tokens the runtime may process in its next chunk: min(want, next_trigger), and not
 * past the prompt end while the prompt is being processed. With a prefill chunk C, while
 * the prompt is processed: min(want, max(next_trigger, C), room of the store, tokens to
 * the prompt end). 0 when the store is full. */
int32_t rt_run_chunk(struct rt_run *r, const rt_kv *kv, int32_t want);

/* After n tokens were appended and observed: advance ctx.seen/phase and compress if
 * should_compress says so, or, for a prefill chunk that crossed a trigger, if it said so
 * where the trigger fell (a periodic trigger, `every N steps`, fires at multiples of N,
 * which a chunk's end after an offset, say a system message's span, may never be); after a
 * compress every emptied block returns to the pool (rt_kv_trim). Returns 1 when it compressed, 0 when not, -1 with err set
 * when compress failed. */
int rt_run_advance(struct rt_run *r, rt_kv *kv, int32_t n, rt_err *err);

/* The policies compiled into a binary: defined by the unit `kvpc emit --target registry`
 * writes (NULL-terminated, kvp_registry_count entries, command-line order). */
extern const struct kvp_policy *const kvp_registry[];
extern const int kvp_registry_count;

/* The built-in full-cache policy: no statistics, no hooks, never compresses (the exact
 * reference every other policy is compared with). Name "full", reserved. */
extern const struct kvp_policy rt_policy_full;

/* The registered policy called name; "full" (a reserved name: kvpc refuses a policy of
 * that name) is the runtime's built-in full cache, rt_policy_full (rt_seq.h); NULL for
 * any other name. */
const struct kvp_policy *rt_registry_find(const struct kvp_policy *const *reg, int n,
                                           const char *name);

#endif
