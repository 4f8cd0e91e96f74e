/*
 * kvp_ir: the typed, checked, location-carrying description of one KV-cache policy — the
 * contract between the front end (parser + sema + lowering, which builds it) and the back
 * ends (the C and CUDA emitters), which read it. One struct kvp_ir holds:
 *
 *   params      runtime knobs: name, default, unit (entries/tokens/ratio/steps/scalar)
 *   consts      named compile-time numbers (kept only for comments; uses are folded to NUM)
 *   stats       per-entry statistics updated by observe at every step: sum / mean /
 *               count(cond) / ema(alpha) / last of a signal expression, over the whole
 *               history, the last W steps (ring buffer), or the prompt tail (observation
 *               window of the last w prompt queries, SnapKV)
 *   score       expression tree evaluated per entry and query head at compress time, then
 *               1-D pooling and group reduction (mean/max/sum/l2/none, also layer-wide as
 *               TOVA), in either order
 *   guards      sinks (first S positions), recent (last R positions), protected spans
 *   budget      entries per (layer, KV head) on average, as an expression (a ratio policy
 *               writes ratio * context)
 *   allocation  across layers (uniform / pyramid(beta) / linear(a, b) / explicit list) and
 *               across heads (per head / adaptive within a layer with a floor / one global
 *               pool with a floor)
 *   action      evict, merge evicted entries into a kept neighbour (a prototype carrying a
 *               count), or split (merge with a singleton floor)
 *   tiers       the storage precision of the kept entries (kernels/k_tier.h): shares of
 *               the kept entries by score rank, or evict-or-tier by utility per byte
 *   trigger     never / every step / over budget down to a target / every N steps / at
 *               prompt end / per prefill block of b tokens
 *   positions   original or compacted
 *
 * Expressions live in one node array (ir->nodes) and refer to each other by index
 * (int32_t, -1 = none); every node carries its source location. All strings are owned by
 * the IR (copied on entry) and freed by kvp_ir_free. Nothing here is ever pasted into
 * generated code as text: the emitter prints names only inside escaped string literals
 * and numbers from the stored doubles.
 *
 * Evaluation contexts decide which signals an expression may use (kvp_ir_check enforces;
 * each signal's contexts are its row in kvp_builtin.def):
 *   KVP_CTX_SCALAR   budget, target, guards, trigger N, window w, floor, alpha:
 *                    numbers, params, context, seen, prompt_len, n_layers
 *   KVP_CTX_OBSERVE  a statistic's argument (evaluated per visible entry, per query head,
 *                    at every step): + attn, pos, age, size, entries, key/value norm,
 *                    layer
 *   KVP_CTX_SCORE    the score (per entry, per query head, at compress): stats, pos, age,
 *                    size, entries, key/value norm, key_cos_mean, and the whole-head
 *                    transforms caote(), normalize() and expected_attention() (whose
 *                    two operands are SCALAR expressions)
 */
#ifndef KVP_IR_H
#define KVP_IR_H

#include <stddef.h>
#include <stdint.h>

#include "k_abi.h"
#include "policy/rt_policy.h"

#define KVP_VERSION "0.1.0"

/* Longest history window of a sum/mean statistic over the last W steps: those keep one
 * float per step, entry and query head (count keeps one bit and allows 2^20 steps). */
#define KVP_IR_MAX_FLOAT_RING 128

/* Rows of attention output (query heads per KV head) the per-head state holds for an
 * exact CAOTE: state_words_dim of such a policy (kernels/k_score.h K_OUT_MAX_GROUP). */
#define KVP_IR_OUT_ROWS 16

/* Query heads per KV head whose query statistics the per-head state holds for Expected
 * Attention: state_words, state_words_dim and state_words_dim2 of such a policy
 * (kernels/k_expattn.h K_EA_MAX_GROUP). */
#define KVP_IR_EA_ROWS 16

/* A place in the .kvp source: 1-based line and column (0 = unknown). */
struct kvp_loc {
	int line;
	int col;
};

/* ---- expressions ----------------------------------------------------------------- */

enum kvp_ir_op {
	KVP_OP_NUM = 0, /* num */
	KVP_OP_PARAM,   /* index into ir->params: the runtime value ctx->params[index] */
	KVP_OP_STAT,    /* index into ir->stats: the statistic's current value (SCORE only) */
	KVP_OP_SIGNAL,  /* sig */
	/* unary (a) */
	KVP_OP_NEG, KVP_OP_NOT, KVP_OP_LOG, KVP_OP_EXP, KVP_OP_ABS, KVP_OP_SQRT,
	/* binary (a, b); comparisons (made in float32, the precision of attention and
	 * statistics) and logic give 0 or 1 */
	KVP_OP_ADD, KVP_OP_SUB, KVP_OP_MUL, KVP_OP_DIV, KVP_OP_MIN, KVP_OP_MAX, KVP_OP_POW,
	KVP_OP_LT, KVP_OP_LE, KVP_OP_GT, KVP_OP_GE, KVP_OP_EQ, KVP_OP_NE, KVP_OP_AND, KVP_OP_OR,
	/* ternary: a ? b : c */
	KVP_OP_SELECT,
	/* whole-head transforms (SCORE only): their argument a is evaluated for every entry
	 * of the head (per query head) first, then transformed as a vector */
	KVP_OP_CAOTE,     /* CAOTE output error of score a (mode: exact/fast), arXiv 2504.14051:
	                     alpha_j = a_j / sum_i a_i;
	                     exact: o = the TRUE attention output of the query head at the
	                            latest observed step (kept in the head's state by
	                            observe; needs KVP_NEED_OUT; depends on the query
	                            head); fast: o = mean_i v_i (FastCAOTE);
	                     result_j = alpha_j / (1 - alpha_j) * ||o - v_j||_2
	                     (+inf when alpha_j >= 1) */
	KVP_OP_NORMALIZE, /* a_j / sum_i a_i (0 when the sum is 0) */
	KVP_OP_EXPATTN,   /* Expected Attention (arXiv 2510.00636, kernels/k_expattn.h): the
	                     softmax over the head's entries at positions >= b of
	                     z_i = k_iᵀmu'/sqrt(d) + k_iᵀSigma'k_i/(2d), mu' and Sigma' the
	                     mean and covariance of the query head's pre-RoPE queries at
	                     positions >= b (kept in the head's state by observe; needs
	                     KVP_NEED_QUERY), rotated by the RoPE averaged over the next a
	                     positions. a (future, tokens) and b (skip, tokens) are SCALAR
	                     expressions, not per-entry ones; depends on the query head */
	/* leaf, SCORE only: */
	KVP_OP_HEADW,     /* head_score("FILE"): the weight of the entry's (layer, KV head),
	                     ir->head_w (docs/language.md 7.12); the same for every entry and
	                     query head of a head */
	KVP_OP_LINEAR,    /* linear_score("FILE"): KVzap's w·h + b (arXiv 2601.07891), h the
	                     entry's hidden state at its layer's input, w, b the (layer, KV
	                     head)'s row of ir->lin_w; computed when the entry is appended
	                     (init_entries, KVP_NEED_HIDDEN) into the shared statistics word
	                     ir->lin_word (docs/language.md 7.14) */
	KVP_OP_COUNT_
};

/* Where an expression may be evaluated, as a mask of 1 << enum kvp_ir_ctx (the
 * `where` column of kvp_builtin.def). */
#define KVP_IN_SCALAR 1u
#define KVP_IN_OBSERVE 2u
#define KVP_IN_SCORE 4u

/* The built-in signals: the KVP_SIGNAL rows of kvp_builtin.def (meaning, unit, contexts
 * and needs are there). */
enum kvp_ir_signal {
#define KVP_SIGNAL(ID, name, unit, where, per_qhead, needs, lang) KVP_SIG_##ID,
#include "kvp_builtin.def"
	KVP_SIG_COUNT_
};

enum kvp_ir_caote_mode {
	KVP_CAOTE_EXACT = 0,
	KVP_CAOTE_FAST,
};

struct kvp_ir_expr {
	enum kvp_ir_op op;
	struct kvp_loc loc;
	double num;              /* KVP_OP_NUM */
	int32_t index;           /* KVP_OP_PARAM / KVP_OP_STAT */
	enum kvp_ir_signal sig;  /* KVP_OP_SIGNAL */
	int mode;                /* KVP_OP_CAOTE: enum kvp_ir_caote_mode */
	int32_t a, b, c;         /* operands (node indices), -1 when unused */
};

/* ---- parameters and constants ------------------------------------------------------ */

struct kvp_ir_param {
	char *name;
	double def;
	enum kvp_unit unit;
	char *doc;               /* "" when none */
	struct kvp_loc loc;
};

/* A value rule (enum kvp_rule, runtime/policy/rt_policy.h) of a setting whose value reads
 * parameters (compiler/kvp_sema.c rule_holds): the policy's check_params applies it to a
 * run's values, as kvpc did to the defaults. */
struct kvp_ir_rule {
	int32_t expr;            /* SCALAR expression */
	enum kvp_rule rule;
	char *what;              /* the setting, as the checker names it */
	struct kvp_loc loc;
	int live;                /* 1: check_params applies it (its expression reads numbers
	                            and parameters only, not the budget); 0: kept only so that
	                            its nodes are known to repeat a setting's */
};

struct kvp_ir_const {
	char *name;
	double value;
	struct kvp_loc loc;
};

/* ---- statistics -------------------------------------------------------------------- */

/* The aggregations: the KVP_AGGREGATE rows of kvp_builtin.def. */
enum kvp_ir_stat_kind {
#define KVP_AGGREGATE(ID, name) KVP_STAT_##ID,
#include "kvp_builtin.def"
	KVP_STAT_KIND_COUNT_
};

enum kvp_ir_history {
	KVP_HIST_WHOLE = 0,  /* every step since the entry was appended */
	KVP_HIST_LAST_STEPS, /* the last `window` steps (a constant; ring buffer per entry) */
	KVP_HIST_PROMPT_TAIL, /* only steps at positions >= prompt_len - window: the queries of
	                        the observation window at the end of the prompt (SnapKV);
	                        `window` may use params; needs the prompt length */
};

struct kvp_ir_stat {
	char *name;
	struct kvp_loc loc;
	enum kvp_ir_stat_kind kind;
	int32_t arg;             /* OBSERVE expression (the condition for COUNT) */
	int32_t alpha;           /* EMA rate, SCALAR expression; -1 otherwise */
	enum kvp_ir_history hist;
	int32_t window;          /* SCALAR expression (steps), -1 for WHOLE */
	/* layout, filled by kvp_ir_layout: */
	int per_qhead;           /* 1 when arg depends on attn (stored per query head) */
	int32_t word;            /* first 4-byte word in the entry's (entry or qhead) block */
	int32_t n_words;         /* words used */
	int32_t ring;            /* LAST_STEPS: the window as a constant number of steps */
};

/* ---- score pipeline ---------------------------------------------------------------- */

struct kvp_ir_score {
	int32_t expr;            /* SCORE expression; -1: no score (every entry scores 0, so
	                            the tie rule keeps the lowest positions) */
	enum k_reduce reduce;    /* kernels/k_abi.h, as the settings below */
	enum k_pool pool;
	int32_t kernel;          /* pooling kernel: a node folding to an odd constant
	                            (entries); -1 when no pooling */
	int pool_before_reduce;  /* 1: pool each query head then reduce (kvpress);
	                            0: reduce then pool (KVCache-Factory) */
	int over_layer;          /* 1: reduce over every query head of the layer, so one
	                            selection is shared by all KV heads of the layer (TOVA);
	                            needs heads holding the same positions */
	struct kvp_loc loc;
};

/* ---- guards, budget, allocation, action, trigger ----------------------------------- */

struct kvp_ir_guards {
	int32_t sinks;           /* SCALAR (tokens): keep entries with pos < sinks; -1 none */
	int32_t recent;          /* SCALAR (tokens): keep entries with pos >= seen - recent;
	                            -1 none. Pooling only spans entries outside this window. */
	int protect_all_spans;   /* keep every entry with a span id != 0 */
	int n_spans;
	char **spans;            /* [n_spans] names of the request spans to keep */
	struct kvp_loc loc;
};

enum kvp_ir_trigger {
	KVP_TRIG_NEVER = 0,      /* full cache */
	KVP_TRIG_EVERY_STEP,     /* after every step when entries > target */
	KVP_TRIG_OVER_BUDGET,    /* when entries > threshold (default budget), down to target */
	KVP_TRIG_EVERY_N,        /* every n steps (seen % n == 0) when entries > target */
	KVP_TRIG_PROMPT_END,     /* once, when the prompt is done, down to target */
	KVP_TRIG_PREFILL_BLOCK,  /* after every block of n tokens and at prompt end, when
	                            entries > target; with prompt_only only while the prompt
	                            is processed (KeyDiff's block-wise prefill), else also
	                            every n decode steps (CAOTE's schedule) */
};
/* "entries" in a trigger is the average over heads (total entries / (L·G)), so
 * per-layer and per-head allocations do not re-trigger on their larger heads. The
 * target is the average entries per head that compress leaves (before allocation). */

struct kvp_ir_alloc {
	int32_t budget;          /* SCALAR (entries per head, average): required unless NEVER */
	enum kvp_unit budget_unit; /* ENTRIES or RATIO: how the source wrote it (docs only) */
	int budget_bytes;        /* 1: `budget = bytes(P)`: the budget counts bytes, as the
	                            bytes of that many f16 entries (budget = P · context) */
	int32_t min;             /* `budget = B min F`: SCALAR entries per head, the floor of
	                            the budget and the target under every override; -1 = none */
	int threshold;           /* 1: `budget = threshold(L)`: every head keeps the entries
	                            outside the guards whose score is >= level (budget =
	                            context, so only the level and an override evict) */
	int32_t level;           /* threshold: SCALAR, the level L */
	enum k_layers layers;
	int32_t beta;            /* PYRAMID/FUNNEL: SCALAR; -1 = 20 */
	int32_t from, to;        /* LINEAR: SCALAR */
	int n_list;
	double *list;            /* LIST: [n_list] multipliers */
	enum k_heads heads;
	int32_t floor;           /* ADAPTIVE/GLOBAL: SCALAR fraction in [0, 1]; -1 = 0.2 */
	struct kvp_loc loc;
};

struct kvp_ir_act {
	enum k_act kind;
	int32_t run;             /* MERGE/SPLIT: SCALAR max tokens per prototype; -1 = no cap */
	int32_t floor;           /* SPLIT: singleton floor, SCALAR (entries per head); -1 = 0 */
	/* SPLIT under kvp_ir_grace_core, the values of GraceKV's actions (kernels/
	 * k_grace_run.h struct k_grace_cfg), each SCALAR or -1 for the kernel's default: */
	int seg_fixed;           /* 1: fixed slots of `run` tokens (`segment = slots(T)`) */
	int32_t seg_min, seg_max; /* shortest / longest segment, tokens (run / 4, 2 · run) */
	int32_t seg_cut, seg_length; /* cost of a cut (3), length penalty (4) */
	int32_t seg_stability, seg_surprisal; /* curvature std weight (0.5), surprisal weight (1) */
	int n_win;               /* curvature windows given (0: the kernel's 2, 4, 8 tokens) */
	int32_t win[4];          /* their sizes, tokens (compiled in) */
	int floor_all;           /* 1: the singleton floor is chosen over every head together */
	int count;               /* prototype count: 0 n·coherence², 1 the member count n */
	int32_t smooth;          /* prototype value smoothing (0.1) */
	int32_t mass, numerator; /* distortion weights λ_Z, λ_M of the utility (1, 1) */
	struct kvp_loc loc;
	struct kvp_loc seg_loc, tree_loc; /* the `segment` / `tree` statements (else loc) */
};

struct kvp_ir_trig {
	enum kvp_ir_trigger kind;
	int32_t n;               /* EVERY_N / PREFILL_BLOCK: SCALAR (steps / tokens) */
	int prompt_only;         /* PREFILL_BLOCK: 1 = blocks of the prompt only (`compress per
	                            prompt block N`): no trigger once seen > prompt_len (a
	                            stream of unknown prompt length is all prompt) */
	int32_t threshold;       /* OVER_BUDGET: SCALAR entries per head; -1 = budget */
	int32_t target;          /* SCALAR entries per head left by compress; -1 = budget */
	struct kvp_loc loc;
};

/* Storage tiers (`precision = tiers(...)`, kernels/k_tier.h). Tier numbers are enum
 * rt_kv_tier (runtime/kv/rt_kv.h): 0 the store's own type, 1 q8, 2 k8v4, 3 q4, 4 q2. */
#define KVP_IR_MAX_TIERS 5
struct kvp_ir_tiers {
	int n;                   /* tiers given, highest precision first; 0: no precision action */
	int tier[KVP_IR_MAX_TIERS];
	enum k_tiers kind;       /* K_TIERS_NONE iff n == 0; SHARES: cum[j] is the cumulative
	                            share of the kept entries (by score rank) at tiers 0..j,
	                            cum[n - 1] = 1; UTILITY: each entry is evicted or given a
	                            tier by utility per byte */
	double cum[KVP_IR_MAX_TIERS];
	unsigned rotate;         /* `rotate = hadamard`: bit 0 keys, bit 1 values stored rotated
	                            at the quantised tiers (kvp_policy.tier_rotate); 0 none */
	double window;           /* `window = W`: the newest W tokens stay at the top tier; 0 none */
	int edge, edge_layers;   /* `edges = TIER, edge_layers = N`: the first N and the last N
	                            layers store no entry below tier `edge`; edge_layers 0: none */
	struct kvp_loc loc;
};

/* ---- the policy -------------------------------------------------------------------- */

struct kvp_ir {
	char *name;              /* policy name (any bytes; the emitter sanitises) */
	char *source;            /* path of the .kvp file as given on the command line */
	char *source_hash;       /* 16 hex digits (kvp_ir_hash of the source bytes) */
	char *summary;           /* one-line description, "" when none */
	char *statements;        /* the policy's statements as written, one a line, comments
	                            dropped and each on one line (`param`s left out: info lists
	                            them); "" until kvp_compile sets it (BIN info shows it) */
	struct kvp_loc loc;      /* of the policy header */

	int n_params, n_consts, n_stats, n_nodes;
	struct kvp_ir_param *params;
	struct kvp_ir_const *consts;
	struct kvp_ir_stat *stats;
	struct kvp_ir_expr *nodes;
	int cap_params, cap_consts, cap_stats, cap_nodes;

	struct kvp_ir_score score;
	struct kvp_ir_guards guards;
	struct kvp_ir_alloc alloc;
	struct kvp_ir_act action;
	struct kvp_ir_trig trigger;
	struct kvp_ir_tiers tiers;
	enum kvp_positions positions;
	/* head_score("FILE"): [head_layers × head_kv] weights (owned), compiled into the
	 * generated code; a model of another shape reads them resampled by nearest index
	 * (kernels/k_score.h k_head_weight); NULL when no KVP_OP_HEADW node */
	double *head_w;
	int head_layers, head_kv;
	/* linear_score("FILE"): [lin_layers × lin_kv × (lin_embd + 1)] rows w then b (owned),
	 * compiled into the generated code; a model of another shape is refused when a
	 * sequence starts (kernels/k_score.h k_linear_check); NULL when no KVP_OP_LINEAR */
	float *lin_w;
	int lin_layers, lin_kv, lin_embd;
	char *lin_file;          /* the file as the policy names it (messages) */
	struct kvp_ir_rule *rules; /* [n_rules] (owned) */
	int n_rules, cap_rules;

	/* layout, filled by kvp_ir_layout (called by kvp_ir_check): */
	int checked;             /* 1 once kvp_ir_check passed (the emitters assert it) */
	uint32_t stat_words_entry, stat_words_qhead;
	unsigned needs;          /* KVP_NEED_* */
	uint32_t state_words;    /* per-head state words (rt_policy.h) */
	uint32_t state_words_dim; /* per-head state words per head_dim: K_OUT_MAX_GROUP rows
	                             of attention output when an exact CAOTE reads them, and
	                             K_EA_MAX_GROUP query means for Expected Attention */
	uint32_t state_words_dim2; /* per head_dim²: K_EA_MAX_GROUP query co-moment matrices */
	int uses_obs_count;      /* a per-entry word counts visible steps (MEAN stats) */
	int32_t obs_count_word;
	int32_t lin_word;        /* the shared word holding linear_score(), -1 when none */
};

/* One diagnostic from kvp_ir_check: "source:line:col: error: msg". */
typedef void (*kvp_ir_diag_fn)(void *user, struct kvp_loc loc, const char *msg);

/* Start an empty policy (trigger NEVER, no score, reduce MEAN, positions ORIGINAL,
 * all optional expressions -1). name/source/summary are copied; source_hash may be NULL
 * (then "0000000000000000"). */
void kvp_ir_init(struct kvp_ir *ir, const char *name, const char *source,
                 const char *source_hash, const char *summary);
void kvp_ir_free(struct kvp_ir *ir);

/* FNV-1a 64 of bytes as 16 lower-case hex digits into out[17]. */
void kvp_ir_hash(const void *bytes, size_t n, char out[17]);

/* Builders. Each returns the new index (params, consts, stats, nodes). Strings are copied. */
int kvp_ir_add_param(struct kvp_ir *ir, struct kvp_loc loc, const char *name, double def,
                     enum kvp_unit unit, const char *doc);
int kvp_ir_add_const(struct kvp_ir *ir, struct kvp_loc loc, const char *name, double value);
int kvp_ir_add_stat(struct kvp_ir *ir, struct kvp_loc loc, const char *name,
                    enum kvp_ir_stat_kind kind, int32_t arg, int32_t alpha,
                    enum kvp_ir_history hist, int32_t window);
int32_t kvp_ir_num(struct kvp_ir *ir, struct kvp_loc loc, double v);
/* A value rule on expression e (what is copied; live: see struct kvp_ir_rule). Returns
 * its index. */
int kvp_ir_add_rule(struct kvp_ir *ir, struct kvp_loc loc, int32_t e, enum kvp_rule rule,
                    const char *what, int live);
int32_t kvp_ir_param_ref(struct kvp_ir *ir, struct kvp_loc loc, int param);
int32_t kvp_ir_stat_ref(struct kvp_ir *ir, struct kvp_loc loc, int stat);
int32_t kvp_ir_signal(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_signal sig);
int32_t kvp_ir_unary(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_op op, int32_t a);
int32_t kvp_ir_binary(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_op op, int32_t a,
                      int32_t b);
int32_t kvp_ir_select(struct kvp_ir *ir, struct kvp_loc loc, int32_t c, int32_t a, int32_t b);
int32_t kvp_ir_caote(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_caote_mode mode,
                     int32_t a);
int32_t kvp_ir_normalize(struct kvp_ir *ir, struct kvp_loc loc, int32_t a);
/* expected_attention(future = a, skip = b): a, b SCALAR expressions (tokens). */
int32_t kvp_ir_expattn(struct kvp_ir *ir, struct kvp_loc loc, int32_t future, int32_t skip);

/* head_score() (DuoAttention's head classes, docs/language.md 7.12): its node at loc. */
int32_t kvp_ir_headw(struct kvp_ir *ir, struct kvp_loc loc);
/* The head weights w[layers × kv_heads] (row = layer, as compiler/kvp_heads.h reads them)
 * copied into ir->head_w, replacing any earlier table (ir owns the copy: kvp_ir_free). */
void kvp_ir_set_heads(struct kvp_ir *ir, const double *w, int layers, int kv_heads);
/* linear_score(): its node, and the rows [layers × kv_heads × (embd + 1)] and the file
 * name (copied). */
int32_t kvp_ir_linear(struct kvp_ir *ir, struct kvp_loc loc);
void kvp_ir_set_linear(struct kvp_ir *ir, const float *w, int layers, int kv_heads, int embd,
                       const char *file);

/* Spans to protect (copied). */
void kvp_ir_add_span(struct kvp_ir *ir, const char *name);
/* Layer multipliers for K_LAYERS_LIST (copied). */
void kvp_ir_set_list(struct kvp_ir *ir, const double *v, int n);

/* Evaluation contexts (see the file comment). */
enum kvp_ir_ctx {
	KVP_CTX_SCALAR = 0,
	KVP_CTX_OBSERVE,
	KVP_CTX_SCORE,
};

/* 1 if expression e may be evaluated in context c (all its signals, stats and
 * transforms are allowed there). */
int kvp_ir_expr_allowed(const struct kvp_ir *ir, int32_t e, enum kvp_ir_ctx c);

/* 1 if the expression trees at nodes a and b of ir compute the same thing: the same ops,
 * numbers, parameter and statistic references, signals and CAOTE modes (-1, no node,
 * equals only -1). The emitters use it to see a target written as the budget's own
 * expression. */
int kvp_ir_same_tree(const struct kvp_ir *ir, int32_t a, int32_t b);

/* The compiler's one constant-folding rule: the value of op on the constants a, b, c (as
 * many as its arity; the IR's operand order, KVP_OP_SELECT: a ? b : c), as the emitted code
 * computes it. Used by kvp_ir_fold and by the semantic check's folding of the source's
 * constants (compiler/kvp_sema.c). Returns 1 and *out, or 0 for an op that is not plain
 * arithmetic (a number, parameter, signal, statistic or whole-head transform); the caller
 * decides what a non-finite result means. */
int kvp_ir_fold_op(enum kvp_ir_op op, double a, double b, double c, double *out);

/* Fold e to a constant if it uses only numbers (params are not constant). Returns 1 and
 * *out on success. */
int kvp_ir_fold(const struct kvp_ir *ir, int32_t e, double *out);

/* Validate the whole policy (indices in range, contexts, constant windows/kernels, a
 * budget when a trigger needs one, reduce NONE only for a query-head-free score, ...) and
 * compute the layout (kvp_ir_layout). Reports each problem through diag and returns the
 * number of problems (0 = the back end may emit). The front end's sema reports user
 * errors first with better messages; this is the back end's own safety net. */
int kvp_ir_check(struct kvp_ir *ir, kvp_ir_diag_fn diag, void *user);

/* Compute stat word offsets, needs flags. Called by kvp_ir_check. */
void kvp_ir_layout(struct kvp_ir *ir);

/* 1 if expression e depends on the query head (reads attn or a per-qhead stat, or is an
 * exact CAOTE, which reads the query head's attention output). */
int kvp_ir_expr_per_qhead(const struct kvp_ir *ir, int32_t e);

/* 1 when the policy runs GraceKV's actions (kernels/k_grace_run.h): a SPLIT action over one
 * global pool, compressing once at the prompt end, original positions, a score without
 * layer-wide reduction (what `action = add_split` with `allocate = global` and
 * `compress at prompt end` lowers to; pooling applies after the group reduction). Other SPLIT combinations, which only a
 * hand-built IR can express, keep the simplified merge of k_compress_run. */
int kvp_ir_grace_core(const struct kvp_ir *ir);

/* Names for messages and comments. */
const char *kvp_ir_op_name(enum kvp_ir_op op);
const char *kvp_ir_signal_name(enum kvp_ir_signal s);
const char *kvp_ir_stat_kind_name(enum kvp_ir_stat_kind k);

#endif
