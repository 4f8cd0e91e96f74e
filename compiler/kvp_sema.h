/*
 * kvp_sema: semantic analysis of one parsed .kvp policy — names, types, units,
 * evaluation contexts, and budget feasibility — and the resolved view of the policy that
 * lowering (kvp_lower.c) turns into the IR (compiler/kvp_ir.h).
 *
 * Units (docs/language.md section 5): a value is a plain number, a ratio of the context,
 * a count of entries, tokens or steps, or a condition. A bare number literal has no
 * unit yet and takes the unit its use needs (`budget = 2048` is 2048 entries); a named
 * value keeps the unit of its definition (`param b = 2048` is a plain number and is not
 * a budget). Adding, subtracting, comparing or taking min/max needs equal units;
 * `ratio * X` is an X; `X / X` is a plain number.
 *
 * Contexts: each expression is evaluated somewhere — a constant (param/const defaults),
 * a scalar known per sequence (budget, guards, triggers, targets, windows), the
 * observation of one attention step (a statistic's argument), or the score at compress
 * time. Each built-in is allowed in some of them (table in kvp_sema.c); a use elsewhere
 * is a located error that says where the name can be used.
 *
 * Feasibility checks fold expressions with the parameters' defaults (the runtime
 * re-validates overrides given with --set): budget 0, windows of 0, a recent window or
 * sinks that fill the budget, targets above the budget, even pooling kernels, ...
 */
#ifndef KVP_SEMA_H
#define KVP_SEMA_H

#include "kvp_ast.h"
#include "kvp_ir.h"

/* Units of sema (finer than the ABI's enum kvp_unit: ANY and BOOL exist only here). */
typedef enum kvp_sunit {
	KVP_SU_ANY = 0, /* an untyped number literal (or an expression of them) */
	KVP_SU_NUM,     /* a plain number */
	KVP_SU_RATIO,   /* a fraction of the context */
	KVP_SU_ENTRIES,
	KVP_SU_TOKENS,
	KVP_SU_STEPS,
	KVP_SU_BOOL,    /* a condition */
	KVP_SU_ERR,     /* already reported */
} kvp_sunit;

typedef enum kvp_sym_kind {
	KVP_SYM_PARAM,
	KVP_SYM_CONST,
	KVP_SYM_STAT,
} kvp_sym_kind;

/* A user definition. */
typedef struct kvp_sym {
	const char *name;
	kvp_sym_kind kind;
	const kvp_stmt *stmt;
	kvp_sunit unit;       /* PARAM, CONST: of the value; STAT: KVP_SU_NUM */
	double value;         /* PARAM: default; CONST: value */
	int ok;               /* the definition checked without errors */
	/* STAT: */
	enum kvp_ir_stat_kind agg; /* kvp_builtin.def KVP_AGGREGATE */
	const kvp_expr *arg;   /* the aggregated signal expression (condition for count) */
	const kvp_expr *alpha; /* ema rate, or NULL */
	int per_qhead;         /* the argument reads attn */
	int ir_index;          /* index in the IR (params, stats), filled by kvp_lower */
	int used;              /* some expression names it (warn_unused) */
} kvp_sym;


/* The resolved policy: which statement sets what, and the checked choices. Pointers
 * point into the kvp_file's tree. */
typedef struct kvp_sema {
	const kvp_file *file;
	kvp_sym *syms;        /* [n_syms] in definition order */
	int n_syms, cap_syms;

	const kvp_stmt *setting[KVP_SET_COUNT_]; /* the statement that sets each, or NULL */
	const kvp_stmt *group, *sinks, *recent, *all_spans, *compress;
	const kvp_stmt **spans; /* [n_spans] `keep span NAME` */
	int n_spans;

	kvp_sunit budget_unit;  /* ENTRIES or RATIO (when a budget is set) */
	kvp_sunit sinks_unit, recent_unit, target_unit, threshold_unit, floor_unit;
	const kvp_expr *threshold; /* `when entries > X`: X */

	/* `budget`, `layers`, `allocate`, `action`, `pool` and `group` resolved: */
	enum k_layers layers;   /* kernels/k_abi.h, as allocate, action, pool, reduce */
	const kvp_expr *beta, *lin_from, *lin_to, *list; /* arguments (or NULL) */
	enum k_heads allocate;
	const kvp_expr *alloc_floor;
	enum k_act action;
	const kvp_expr *run;
	/* GraceKV's actions (`segment`, `tree`, `action = add_split(...)`, `keep singletons`):
	 * slot = the target segment length (or the fixed slot of `segment = slots(T)`),
	 * act_floor = the singleton floor (unit floor_unit), the rest as written or NULL */
	const kvp_expr *slot, *act_floor;
	const kvp_expr *seg_min, *seg_max, *seg_cut, *seg_length, *seg_stability, *seg_surprisal;
	const kvp_expr *seg_windows; /* `windows = [...]`, constants checked */
	int seg_fixed;          /* segment = slots(T) */
	int tree_count;         /* tree = prototypes(count = ...): 0 coherence, 1 members */
	const kvp_expr *tree_smooth, *mass, *numerator;
	const kvp_stmt *singletons; /* `keep singletons N` */
	int singletons_all;     /* `keep singletons N over all`: chosen over every head */
	enum k_pool pool;
	const kvp_expr *kernel;
	enum k_reduce reduce;   /* of a query-head dependent score (default MEAN) */
	int over_layer;
	int pool_before_reduce; /* 1 (default): pool each query head, then reduce */
	int group_order_loc_set; /* `before pool` / `after pool` was written */
	kvp_srcloc group_order_loc;
	int compacted;          /* positions = compacted */
	int compress_bad;       /* the trigger had an error */
	/* folded values (parameters at their defaults) for the feasibility checks */
	int sinks_ty_known, recent_ty_known, threshold_known, target_known;
	double sinks_v, recent_v, threshold_v, target_v;
	int score_per_qhead;    /* the score depends on the query head */
	/* `budget = bytes(P)`: the budget is the share P of an f16 full cache's bytes */
	int budget_bytes;
	const kvp_expr *budget_share;
	/* `budget = B min F`: the floor F (entries per head), or NULL */
	const kvp_expr *budget_min;
	/* `budget = threshold(L)`: the level L (a scalar expression); NULL: none */
	const kvp_expr *budget_level;
	/* `precision = tiers(...)`: n_tier tiers (enum rt_kv_tier), highest precision first;
	 * with shares (tier_shares) their cumulative shares of the kept entries (the last 1),
	 * without, the allocator chooses by utility per byte. n_tier 0: no precision action. */
	int n_tier;
	int tier[5];
	double tier_cum[5];
	int tier_shares;
	/* `rotate = hadamard` in tiers(...): bit 0 keys, bit 1 values stored rotated at the
	 * quantised tiers (rt_kv_set_rotation); 0 none */
	unsigned tier_rotate;
	/* `window = W` in tiers(...): the newest W tokens' entries stay at the top tier (0: none) */
	double tier_window;
	/* `edges = TIER, edge_layers = N` in tiers(...): the first N and the last N layers store
	 * no entry below tier_edge (tier_edge_layers 0: none) */
	int tier_edge, tier_edge_layers;
	/* `head_score("FILE")` (docs/language.md 7.12): the file as written, and its weights
	 * [head_layers × head_kv] read by kvp_heads_read (owned; NULL when not used) */
	const kvp_expr *head_call;
	double *head_w;
	int head_layers, head_kv;
	/* `linear_score("FILE")` (docs/language.md 7.14): the file as written, and its rows
	 * [lin_layers × lin_kv × (lin_embd + 1)] read by kvp_linear_read (owned; NULL when not
	 * used) */
	const kvp_expr *lin_call;
	float *lin_w;
	int lin_layers, lin_kv, lin_embd;
	/* the value rules (enum kvp_rule, runtime/policy/rt_policy.h) of the settings whose
	 * value reads parameters, checked on the defaults and lowered for the policy's
	 * check_params, which applies them to a run's values: the setting's expression, its
	 * rule and what it is ("the ema rate alpha", a string literal) */
	struct kvp_sema_rule {
		const kvp_expr *e;
		enum kvp_rule rule;
		const char *what;
	} *rules;
	int n_rules, cap_rules;
} kvp_sema;

/* Check a tree that parsed without errors. Diagnostics go to f->src; the result is
 * usable for lowering only when f->src->n_errors is 0. Never NULL; free with
 * kvp_sema_free. */
kvp_sema *kvp_sema_check(const kvp_file *f);
void kvp_sema_free(kvp_sema *s);

/* The symbol called name, or NULL. */
const kvp_sym *kvp_sema_lookup(const kvp_sema *s, const char *name);

/* The IR operation an expression is (the lowering builds it; the check folds constants
 * with kvp_ir_fold_op of it): a unary or binary operator's, or a call's (its
 * KVP_FUNCTION row in compiler/kvp_builtin.def); KVP_OP_COUNT_ for anything else. */
enum kvp_ir_op kvp_sema_ir_op(const kvp_expr *e);

/* The value of a named argument of a call (or the positional argument at index pos when
 * it is not named; pos < 0: named only); NULL when absent. */
const kvp_expr *kvp_call_arg(const kvp_expr *call, const char *name, int pos);

struct kvp_ir;
/* Lower a checked policy (kvp_sema_check reported no error) into ir, which must be
 * freshly initialised by kvp_ir_init. Fills s->syms[i].ir_index. Returns 0, or -1 with
 * a located error in f->src for a construct the IR cannot represent. */
int kvp_lower(kvp_sema *s, struct kvp_ir *ir);

/* The whole front end on one source: parse, check, kvp_ir_init (name, source = src->path,
 * FNV hash of the bytes, summary), lower, and the back end's kvp_ir_check (its messages
 * are reported in src at their line and column). Returns 0 when ir is ready for an
 * emitter (free it with kvp_ir_free), else the number of errors reported in src (ir is
 * left empty and needs no free). */
int kvp_compile(kvp_src *src, struct kvp_ir *ir);

/* The one-line summary of a policy: the first own-line comment before `policy`, without
 * the leading '#' and blanks ("" when none). Arena-allocated in f. */
const char *kvp_file_summary(kvp_file *f);

#endif
