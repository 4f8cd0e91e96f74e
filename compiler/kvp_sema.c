/*
 * kvp_sema: names, types, units, contexts and feasibility of one .kvp policy (the rules
 * are in kvp_sema.h and docs/language.md sections 5-7). Two passes over the statements:
 *   1. definitions in source order (param, const, stat): each may use only the
 *      definitions above it;
 *   2. everything else (budget first, so `budget` has a unit), then the cross-statement
 *      checks (a trigger needs a budget, guards must leave room for the score, ...).
 * Every problem is one located error, with a note pointing at the other statement
 * involved and a "did you mean" for near-miss names.
 */
#include "kvp_sema.h"
#include "kvp_heads.h"

#include "policy/rt_budget.h"
#include "policy/rt_span.h"
#include "kvp_ir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* evaluation contexts (bit mask) */
enum {
	CX_SCALAR = KVP_IN_SCALAR,   /* budget, guards, triggers, targets, windows, arguments */
	CX_OBSERVE = KVP_IN_OBSERVE, /* a statistic's argument, at every attention step */
	CX_SCORE = KVP_IN_SCORE,     /* the score, at compress time */
	CX_CONST = 8,                /* param / const defaults */
};

/* the type of a checked expression */
typedef struct ty {
	kvp_sunit u;
	int known;     /* value v is known (parameters at their defaults) */
	double v;
	int constant;  /* no parameter and no signal: a compile-time constant */
	int per_qhead; /* depends on the query head (reads attn) */
} ty;

static const ty TY_ERR = { KVP_SU_ERR, 0, 0, 0, 0 };

/* ---- built-in tables ------------------------------------------------------------- */

typedef struct builtin_sig {
	const char *name;
	kvp_sunit unit;
	unsigned cx;
	int per_qhead;
	int lang;      /* a name of the language (else reached by a keyword or not at all) */
} builtin_sig;

static const builtin_sig SIGNALS[] = {
#define KVP_SIGNAL(ID, name, unit, where, per_qhead, needs, lang) \
	{ name, KVP_SU_##unit, where, per_qhead, lang },
#include "kvp_builtin.def"
};
#define N_SIGNALS (int)(sizeof SIGNALS / sizeof SIGNALS[0])

/* functions usable inside expressions */
static const char *const FUNCTIONS[] = {
#define KVP_FUNCTION(name, OP) name,
#include "kvp_builtin.def"
};
#define N_FUNCTIONS (int)(sizeof FUNCTIONS / sizeof FUNCTIONS[0])

/* the IR operation of each function, in FUNCTIONS' order */
static const enum kvp_ir_op FUNCTION_OPS[] = {
#define KVP_FUNCTION(name, OP) KVP_OP_##OP,
#include "kvp_builtin.def"
};

/* a statistic's aggregations, indexed by enum kvp_ir_stat_kind */
static const char *const AGGREGATES[] = {
#define KVP_AGGREGATE(ID, name) [KVP_STAT_##ID] = name,
#include "kvp_builtin.def"
};
#define N_AGGREGATES (int)(sizeof AGGREGATES / sizeof AGGREGATES[0])

/* words that are values of one setting */
typedef struct setting_word {
	const char *name;
	const char *what;    /* "a layer schedule" */
	const char *setting; /* "layers" */
} setting_word;

static const setting_word SETTING_WORDS[] = {
	{ "uniform", "a layer schedule or an allocation", "layers" },
	{ "pyramid", "a layer schedule", "layers" },
	{ "funnel", "a layer schedule", "layers" },
	{ "linear", "a layer schedule", "layers" },
	{ "global_only", "a layer schedule", "layers" },
	{ "adaptive", "an allocation", "allocate" },
	{ "global", "an allocation", "allocate" },
	{ "evict", "an action", "action" },
	{ "merge", "an action", "action" },
	{ "add_split", "an action", "action" },
	{ "avg", "a pooling", "pool" },
	{ "none", "a pooling", "pool" },
	{ "original", "a position convention", "positions" },
	{ "compacted", "a position convention", "positions" },
	{ "tiers", "a precision action", "precision" },
	{ "f16", "a storage tier", "precision" },
	{ "q8", "a storage tier", "precision" },
	{ "k8v8", "a storage tier", "precision" },
	{ "k8v4", "a storage tier", "precision" },
	{ "q4", "a storage tier", "precision" },
	{ "k4v4", "a storage tier", "precision" },
	{ "q2", "a storage tier", "precision" },
	{ "k4v2", "a storage tier", "precision" },
	{ "rest", "a tier's share", "precision" },
	{ "bytes", "a byte budget", "budget" },
	{ "threshold", "a threshold budget", "budget" },
};

/* ORDER(tier): the storage tiers of runtime/kv/rt_kv.h enum rt_kv_tier, highest precision
 * first (f16 is the store's own type: f32 on the exact path), and the same tiers spelled by
 * their key and value bits (NULL: none other). */
static const char *const TIER_NAMES[] = { "f16", "q8", "k8v4", "q4", "q2" };
static const char *const TIER_BITS_NAMES[] = { NULL, "k8v8", "k8v4", "k4v4", "k4v2" };
#define N_TIERS 5
/* every word that names a tier, for suggestions */
static const char *const TIER_WORDS[] = { "f16", "q8", "k8v4", "q4", "q2", "k8v8", "k4v4", "k4v2" };
#define TIER_LIST "f16, q8 (k8v8), k8v4, q4 (k4v4) and q2 (k4v2)"
#define N_SETTING_WORDS (int)(sizeof SETTING_WORDS / sizeof SETTING_WORDS[0])

static const builtin_sig *find_signal(const char *name)
{
	for (int i = 0; i < N_SIGNALS; i++)
		if (SIGNALS[i].lang && strcmp(SIGNALS[i].name, name) == 0)
			return &SIGNALS[i];
	return NULL;
}

static int in_list(const char *name, const char *const *list, int n)
{
	for (int i = 0; i < n; i++)
		if (strcmp(list[i], name) == 0)
			return 1;
	return 0;
}

static int is_aggregate(const char *name)
{
	return in_list(name, AGGREGATES, N_AGGREGATES);
}

static const setting_word *find_setting_word(const char *name)
{
	for (int i = 0; i < N_SETTING_WORDS; i++)
		if (strcmp(SETTING_WORDS[i].name, name) == 0)
			return &SETTING_WORDS[i];
	return NULL;
}

/* ---- state and reporting --------------------------------------------------------- */

typedef struct sema {
	kvp_sema *out;
	kvp_src *src;
	/* pass 1 bookkeeping: every definition's name in source order, defined or not yet */
	const kvp_stmt **defs;
	int n_defs;
	int n_defined; /* defs[0..n_defined) are visible */
	const kvp_stmt *current; /* the definition being checked */
	int have_budget; /* budget statement checked ok */
	int in_budget;   /* checking the budget's own expression */
	ty budget;
	const kvp_expr *ea_call; /* an expected_attention() call, for the sinks check */
	ty ea_skip;      /* its skip (positions left out of the query statistics) */
	const kvp_expr *replay_use; /* a use of replay_attn, for the trigger check */
	const kvp_expr *const_score; /* a score of numbers and parameters only (a warning) */
	/* uses of one definition by another (syms indices [user, used]): a name that only
	 * unused definitions name is unused too (warn_unused) */
	int (*uses)[2];
	int n_uses, cap_uses;
} sema;

#define ERR(S, loc, ...) kvp_src_error((S)->src, (loc), __VA_ARGS__)
#define NOTE(S, loc, ...) kvp_src_note((S)->src, (loc), __VA_ARGS__)

static const char *unit_name(kvp_sunit u)
{
	switch (u) {
	case KVP_SU_ANY: return "a number";
	case KVP_SU_NUM: return "a plain number";
	case KVP_SU_RATIO: return "a ratio";
	case KVP_SU_ENTRIES: return "entries";
	case KVP_SU_TOKENS: return "tokens";
	case KVP_SU_STEPS: return "steps";
	case KVP_SU_BOOL: return "a condition";
	default: return "an invalid value";
	}
}

static const char *cx_where(unsigned cx)
{
	switch (cx) {
	case CX_CONST: return "a default value (only numbers and consts)";
	case CX_SCALAR: return "a budget, guard, trigger or argument";
	case CX_OBSERVE: return "a statistic";
	case CX_SCORE: return "the score";
	default: return "this place";
	}
}

/* "statistics and the score", from a mask of contexts */
static void cx_list(unsigned mask, char *buf, size_t n)
{
	const char *parts[3];
	int k = 0;
	if (mask & CX_SCALAR)
		parts[k++] = "budgets, guards and triggers";
	if (mask & CX_OBSERVE)
		parts[k++] = "statistics";
	if (mask & CX_SCORE)
		parts[k++] = "the score";
	buf[0] = '\0';
	for (int i = 0; i < k; i++) {
		size_t l = strlen(buf);
		snprintf(buf + l, n - l, "%s%s", i == 0 ? "" : i == k - 1 ? " and " : ", ",
		         parts[i]);
	}
}

/* Best near-miss of name among candidates (NULL when none is close). */
static const char *suggest_from(const char *name, const char *const *cands, int n,
                                const char *best, int *best_d)
{
	size_t len = strlen(name);
	int cap = len <= 3 ? 1 : 2;
	for (int i = 0; i < n; i++) {
		if (!cands[i])
			continue;
		int d = kvp_edit_distance(name, cands[i], cap);
		if (d <= cap && d < *best_d && d < (int)len) {
			*best_d = d;
			best = cands[i];
		}
	}
	return best;
}

/* A near-miss among the visible user names, signals and functions. */
static const char *suggest_name(const sema *S, const char *name, int with_functions)
{
	int best_d = 1000;
	const char *best = NULL;
	const char *tmp[64];
	int k = 0;
	for (int i = 0; i < S->n_defined && k < 64; i++)
		tmp[k++] = S->defs[i]->name;
	best = suggest_from(name, tmp, k, best, &best_d);
	k = 0;
	for (int i = 0; i < N_SIGNALS; i++)
		if (SIGNALS[i].lang)
			tmp[k++] = SIGNALS[i].name;
	best = suggest_from(name, tmp, k, best, &best_d);
	if (with_functions) {
		best = suggest_from(name, FUNCTIONS, N_FUNCTIONS, best, &best_d);
		best = suggest_from(name, AGGREGATES, N_AGGREGATES, best, &best_d);
	}
	return best;
}

static int is_int(double v)
{
	return v == floor(v);
}

/* a number for messages: integers without decimals */
static void fmt_num(double v, char *buf, size_t n)
{
	if (is_int(v) && fabs(v) < 1e15)
		snprintf(buf, n, "%.0f", v);
	else
		snprintf(buf, n, "%g", v);
}

/* ---- symbols --------------------------------------------------------------------- */

static kvp_sym *sym_add(sema *S, const kvp_stmt *st, kvp_sym_kind kind)
{
	kvp_sema *o = S->out;
	if (o->n_syms == o->cap_syms)
		o->syms = kvp_grow(o->syms, &o->cap_syms, 16, sizeof *o->syms);
	kvp_sym *y = &o->syms[o->n_syms++];
	memset(y, 0, sizeof *y);
	y->name = st->name;
	y->kind = kind;
	y->stmt = st;
	y->ir_index = -1;
	return y;
}

const kvp_sym *kvp_sema_lookup(const kvp_sema *s, const char *name)
{
	for (int i = 0; i < s->n_syms; i++)
		if (strcmp(s->syms[i].name, name) == 0)
			return &s->syms[i];
	return NULL;
}

const kvp_expr *kvp_call_arg(const kvp_expr *call, const char *name, int pos)
{
	if (!call || call->kind != KVP_E_CALL)
		return NULL;
	int k = 0;
	for (int i = 0; i < call->n_args; i++) {
		const kvp_expr *a = call->args[i];
		if (a->kind == KVP_E_ARG) {
			if (strcmp(a->name, name) == 0)
				return a->a;
		} else {
			if (k == pos)
				return a;
			k++;
		}
	}
	return NULL;
}

/* Check the arguments of call against the parameter names names[0..n): positional ones
 * fill names in order, named ones must be among names, none twice. required[i] says
 * whether names[i] must be given. Returns 0 when fine. */
static int check_args(sema *S, const kvp_expr *call, const char *const *names,
                      const int *required, int n)
{
	int given[8] = { 0 };
	int k = 0, bad = 0;
	for (int i = 0; i < call->n_args; i++) {
		const kvp_expr *a = call->args[i];
		int slot = -1;
		if (a->kind == KVP_E_ARG) {
			for (int j = 0; j < n; j++)
				if (strcmp(names[j], a->name) == 0)
					slot = j;
			if (slot < 0) {
				int d = 1000;
				const char *s = suggest_from(a->name, names, n, NULL, &d);
				if (n == 0)
					ERR(S, a->name_loc, "%s() takes no arguments", call->name);
				else if (s)
					ERR(S, a->name_loc,
					    "%s() has no argument '%s'; did you mean '%s'?",
					    call->name, a->name, s);
				else
					ERR(S, a->name_loc, "%s() has no argument '%s'", call->name,
					    a->name);
				bad = 1;
				continue;
			}
		} else {
			if (k >= n) {
				ERR(S, a->loc, "too many arguments to %s() (it takes %d)",
				    call->name, n);
				bad = 1;
				continue;
			}
			slot = k++;
		}
		if (given[slot]) {
			ERR(S, a->loc, "argument '%s' of %s() is given twice", names[slot],
			    call->name);
			bad = 1;
		}
		given[slot] = 1;
	}
	for (int j = 0; j < n && !bad; j++) {
		if (required[j] && !given[j]) {
			ERR(S, call->loc, "%s() needs the argument '%s'", call->name, names[j]);
			bad = 1;
		}
	}
	return bad ? -1 : 0;
}

/* ---- expressions ----------------------------------------------------------------- */

static ty check_expr(sema *S, const kvp_expr *e, unsigned cx);

static ty ty_make(kvp_sunit u)
{
	ty t = { u, 0, 0, 0, 0 };
	return t;
}

static ty ty_const(kvp_sunit u, double v)
{
	ty t = { u, 1, v, 1, 0 };
	return t;
}

/* unit of a + b (and of comparisons, min, max); ERR when they differ */
static kvp_sunit unify(kvp_sunit a, kvp_sunit b)
{
	if (a == b)
		return a;
	if (a == KVP_SU_ANY)
		return b;
	if (b == KVP_SU_ANY)
		return a;
	return KVP_SU_ERR;
}

/* A hint after a unit mismatch between a share of the context and a count of tokens or
 * entries: "; `h * context` is that share in tokens" (the ratio side named when it is a
 * name). Empty otherwise. */
static void ratio_hint(const sema *S, const kvp_expr *ea, kvp_sunit a, const kvp_expr *eb,
                       kvp_sunit b, char *buf, size_t n)
{
	buf[0] = 0;
	int count_a = a == KVP_SU_TOKENS || a == KVP_SU_ENTRIES;
	int count_b = b == KVP_SU_TOKENS || b == KVP_SU_ENTRIES;
	const kvp_expr *r = a == KVP_SU_RATIO && count_b ? ea : b == KVP_SU_RATIO && count_a ? eb : NULL;
	if (!r)
		return;
	int w = (int)(r->loc.end - r->loc.off);
	int simple = r->kind == KVP_E_NAME || r->kind == KVP_E_NUM;
	snprintf(buf, n, "; a ratio is a share of the context: write `%s%.*s%s * context` for that "
	         "share in tokens", simple ? "" : "(", w > 40 ? 40 : w, S->src->text + r->loc.off,
	         simple ? "" : ")");
}

static ty combine(ty a, ty b, kvp_sunit u)
{
	ty t = ty_make(u);
	t.known = a.known && b.known;
	t.constant = a.constant && b.constant;
	t.per_qhead = a.per_qhead || b.per_qhead;
	return t;
}

static int need_number(sema *S, const kvp_expr *at, ty t, const char *what)
{
	if (t.u == KVP_SU_BOOL) {
		ERR(S, at->loc, "%s needs a number, not a condition", what);
		return -1;
	}
	return 0;
}

enum kvp_ir_op kvp_sema_ir_op(const kvp_expr *e)
{
	switch (e->kind) {
	case KVP_E_UNARY:
		return e->op == KVP_ASTOP_NOT ? KVP_OP_NOT : KVP_OP_NEG;
	case KVP_E_BINARY:
		switch (e->op) {
		case KVP_ASTOP_ADD: return KVP_OP_ADD;
		case KVP_ASTOP_SUB: return KVP_OP_SUB;
		case KVP_ASTOP_MUL: return KVP_OP_MUL;
		case KVP_ASTOP_DIV: return KVP_OP_DIV;
		case KVP_ASTOP_LT: return KVP_OP_LT;
		case KVP_ASTOP_LE: return KVP_OP_LE;
		case KVP_ASTOP_GT: return KVP_OP_GT;
		case KVP_ASTOP_GE: return KVP_OP_GE;
		case KVP_ASTOP_EQ: return KVP_OP_EQ;
		case KVP_ASTOP_NE: return KVP_OP_NE;
		case KVP_ASTOP_AND: return KVP_OP_AND;
		case KVP_ASTOP_OR: return KVP_OP_OR;
		default: return KVP_OP_COUNT_;
		}
	case KVP_E_CALL:
		for (int i = 0; i < N_FUNCTIONS; i++)
			if (!strcmp(e->name, FUNCTIONS[i]))
				return FUNCTION_OPS[i];
		return KVP_OP_COUNT_;
	default:
		return KVP_OP_COUNT_;
	}
}

/* The constant value of e's operation on a, b, c (kvp_ir_fold_op: the rule the IR folds
 * and the emitted code computes by). */
static double fold(const kvp_expr *e, double a, double b, double c)
{
	double r = 0;
	kvp_ir_fold_op(kvp_sema_ir_op(e), a, b, c, &r);
	return r;
}

static ty check_binary(sema *S, const kvp_expr *e, unsigned cx)
{
	ty a = check_expr(S, e->a, cx);
	ty b = check_expr(S, e->b, cx);
	if (a.u == KVP_SU_ERR || b.u == KVP_SU_ERR)
		return TY_ERR;
	const char *op = kvp_op_text(e->op);
	kvp_sunit u;
	switch (e->op) {
	case KVP_ASTOP_AND:
	case KVP_ASTOP_OR:
		if (a.u != KVP_SU_BOOL || b.u != KVP_SU_BOOL) {
			const kvp_expr *bad = a.u != KVP_SU_BOOL ? e->a : e->b;
			ERR(S, bad->loc, "'%s' needs conditions on both sides; this is %s", op,
			    unit_name(a.u != KVP_SU_BOOL ? a.u : b.u));
			return TY_ERR;
		}
		u = KVP_SU_BOOL;
		break;
	case KVP_ASTOP_ADD:
	case KVP_ASTOP_SUB:
	case KVP_ASTOP_LT:
	case KVP_ASTOP_LE:
	case KVP_ASTOP_GT:
	case KVP_ASTOP_GE:
	case KVP_ASTOP_EQ:
	case KVP_ASTOP_NE:
		if (a.u == KVP_SU_BOOL || b.u == KVP_SU_BOOL) {
			ERR(S, (a.u == KVP_SU_BOOL ? e->a : e->b)->loc,
			    "'%s' needs numbers on both sides, not a condition", op);
			return TY_ERR;
		}
		u = unify(a.u, b.u);
		if (u == KVP_SU_ERR) {
			char hint[160];
			ratio_hint(S, e->a, a.u, e->b, b.u, hint, sizeof hint);
			ERR(S, e->loc, "unit mismatch in '%s': the left side is %s, the right side is %s%s",
			    op, unit_name(a.u), unit_name(b.u), hint);
			return TY_ERR;
		}
		if (e->op != KVP_ASTOP_ADD && e->op != KVP_ASTOP_SUB)
			u = KVP_SU_BOOL;
		break;
	case KVP_ASTOP_MUL:
		if (need_number(S, a.u == KVP_SU_BOOL ? e->a : e->b,
		                a.u == KVP_SU_BOOL ? a : b, "'*'"))
			return TY_ERR;
		if (a.u == KVP_SU_ANY || a.u == KVP_SU_NUM || a.u == KVP_SU_RATIO)
			u = (a.u == KVP_SU_NUM && b.u == KVP_SU_ANY) ? KVP_SU_NUM : b.u;
		else if (b.u == KVP_SU_ANY || b.u == KVP_SU_NUM || b.u == KVP_SU_RATIO)
			u = a.u;
		else {
			ERR(S, e->loc, "unit mismatch in '*': cannot multiply %s by %s",
			    unit_name(a.u), unit_name(b.u));
			return TY_ERR;
		}
		if (a.u == KVP_SU_RATIO && b.u == KVP_SU_ANY)
			u = KVP_SU_RATIO;
		break;
	case KVP_ASTOP_DIV:
		if (need_number(S, a.u == KVP_SU_BOOL ? e->a : e->b,
		                a.u == KVP_SU_BOOL ? a : b, "'/'"))
			return TY_ERR;
		if (b.u == KVP_SU_ANY || b.u == KVP_SU_NUM)
			u = a.u;
		else
			u = KVP_SU_NUM; /* X / X, or a rate per X */
		break;
	default:
		return TY_ERR;
	}
	if (e->op == KVP_ASTOP_DIV && b.known && b.constant && b.v == 0) {
		/* X / 0 is infinite or NaN whatever X is (a score of NaN ranks nothing) */
		ERR(S, e->b->loc, "division by zero");
		return TY_ERR;
	}
	ty t = combine(a, b, u);
	if (t.known) {
		double r = 0;
		if (e->op == KVP_ASTOP_DIV && b.v == 0) {
			if (t.constant) {
				ERR(S, e->b->loc, "division by zero");
				return TY_ERR;
			}
			t.known = 0;
		} else {
			r = fold(e, a.v, b.v, 0);
		}
		t.v = r;
		if (!isfinite(r))
			t.known = 0;
	}
	return t;
}

/* the name of a definition that comes later in the file, or NULL */
static const kvp_stmt *later_def(const sema *S, const char *name)
{
	for (int i = S->n_defined; i < S->n_defs; i++)
		if (strcmp(S->defs[i]->name, name) == 0)
			return S->defs[i];
	return NULL;
}

/* The definition of name (NULL: none), marked used when a statement names it; a use
 * inside another definition (S->current, the last symbol added: pass_definitions adds
 * each before checking it) is recorded as an edge for warn_unused instead. */
static const kvp_sym *sym_use(sema *S, const char *name)
{
	for (int i = 0; i < S->out->n_syms; i++)
		if (strcmp(S->out->syms[i].name, name) == 0) {
			int user = S->out->n_syms - 1;
			if (!S->current || S->out->syms[user].stmt != S->current) {
				S->out->syms[i].used = 1;
			} else if (user != i) {
				if (S->n_uses == S->cap_uses)
					S->uses = kvp_grow(S->uses, &S->cap_uses, 16, sizeof *S->uses);
				S->uses[S->n_uses][0] = user;
				S->uses[S->n_uses++][1] = i;
			}
			return &S->out->syms[i];
		}
	return NULL;
}

static ty check_name(sema *S, const kvp_expr *e, unsigned cx)
{
	const char *name = e->name;
	const kvp_sym *y = sym_use(S, name);
	if (y) {
		if (y->stmt == S->current) {
			ERR(S, e->loc, "'%s' is used in its own definition", name);
			return TY_ERR;
		}
		if (!y->ok)
			return TY_ERR;
		if (y->kind == KVP_SYM_STAT) {
			if (!(cx & CX_SCORE)) {
				if (cx & CX_OBSERVE)
					ERR(S, e->loc,
					    "statistic '%s' cannot be used inside another statistic",
					    name);
				else
					ERR(S, e->loc,
					    "statistic '%s' is a per-entry value; it can be used only in the score",
					    name);
				return TY_ERR;
			}
			ty t = ty_make(KVP_SU_NUM);
			t.per_qhead = y->per_qhead;
			return t;
		}
		if (y->kind == KVP_SYM_PARAM && cx == CX_CONST) {
			ERR(S, e->loc,
			    "'%s' is a parameter (changeable at run time); a default can use only numbers and consts",
			    name);
			return TY_ERR;
		}
		ty t = ty_const(y->unit, y->value);
		t.constant = y->kind == KVP_SYM_CONST;
		return t;
	}
	const builtin_sig *sg = find_signal(name);
	if (sg) {
		if (!(sg->cx & cx)) {
			if (strcmp(name, "attn") == 0 && cx == CX_SCORE)
				ERR(S, e->loc,
				    "'attn' is the attention of the current step and exists only inside a statistic; define `stat a = last(attn)` and use 'a'");
			else {
				char where[128];
				cx_list(sg->cx, where, sizeof where);
				ERR(S, e->loc, "'%s' cannot be used in %s; it is available in %s",
				    name, cx_where(cx), where);
			}
			return TY_ERR;
		}
		if (!strcmp(name, "replay_attn") && !S->replay_use)
			S->replay_use = e;
		ty t = ty_make(sg->unit);
		t.per_qhead = sg->per_qhead;
		return t;
	}
	const kvp_stmt *later = later_def(S, name);
	if (later) {
		ERR(S, e->loc, "'%s' is used before its definition", name);
		NOTE(S, later->name_loc, "'%s' is defined here", name);
		return TY_ERR;
	}
	const setting_word *w = find_setting_word(name);
	if (w) {
		ERR(S, e->loc, "'%s' is %s; it is a value of `%s = ...`, not a number", name,
		    w->what, w->setting);
		return TY_ERR;
	}
	if (in_list(name, FUNCTIONS, N_FUNCTIONS) || is_aggregate(name)) {
		ERR(S, e->loc, "'%s' is a function; call it as %s(...)", name, name);
		return TY_ERR;
	}
	const char *s = suggest_name(S, name, 0);
	if (s)
		ERR(S, e->loc, "unknown name '%s'; did you mean '%s'?", name, s);
	else
		ERR(S, e->loc, "unknown name '%s'", name);
	return TY_ERR;
}

/* min(a, b), max(a, b) (equal units) and pow(a, b) (plain) */
static ty check_call_binary(sema *S, const kvp_expr *e, unsigned cx)
{
	const char *f = e->name;
	int is_minmax = !strcmp(f, "min") || !strcmp(f, "max");
	static const char *const n2[] = { "a", "b" };
	static const int r2[] = { 1, 1 };
	if (check_args(S, e, n2, r2, 2))
		return TY_ERR;
	const kvp_expr *ea = kvp_call_arg(e, "a", 0), *eb = kvp_call_arg(e, "b", 1);
	ty a = check_expr(S, ea, cx), b = check_expr(S, eb, cx);
	if (a.u == KVP_SU_ERR || b.u == KVP_SU_ERR)
		return TY_ERR;
	if (need_number(S, ea, a, f) || need_number(S, eb, b, f))
		return TY_ERR;
	kvp_sunit u = KVP_SU_NUM;
	if (is_minmax) {
		u = unify(a.u, b.u);
		if (u == KVP_SU_ERR) {
			char hint[160];
			ratio_hint(S, ea, a.u, eb, b.u, hint, sizeof hint);
			ERR(S, e->loc, "unit mismatch in %s(): %s and %s%s", f,
			    unit_name(a.u), unit_name(b.u), hint);
			return TY_ERR;
		}
	}
	ty t = combine(a, b, u);
	if (t.known)
		t.v = fold(e, a.v, b.v, 0);
	if (!isfinite(t.v))
		t.known = 0;
	return t;
}

/* abs(x) (unit of x), log, exp, sqrt (plain) */
static ty check_call_unary(sema *S, const kvp_expr *e, unsigned cx)
{
	const char *f = e->name;
	static const char *const n1[] = { "x" };
	static const int r1[] = { 1 };
	if (check_args(S, e, n1, r1, 1))
		return TY_ERR;
	const kvp_expr *ex = kvp_call_arg(e, "x", 0);
	ty a = check_expr(S, ex, cx);
	if (a.u == KVP_SU_ERR || need_number(S, ex, a, f))
		return TY_ERR;
	ty t = a;
	if (strcmp(f, "abs") != 0)
		t.u = KVP_SU_NUM;
	if (t.known) {
		t.v = fold(e, a.v, 0, 0);
		if (!isfinite(t.v))
			t.known = 0;
	}
	return t;
}

/* if(cond, then, else) */
static ty check_call_if(sema *S, const kvp_expr *e, unsigned cx)
{
	static const char *const n3[] = { "cond", "then", "else" };
	static const int r3[] = { 1, 1, 1 };
	if (check_args(S, e, n3, r3, 3))
		return TY_ERR;
	const kvp_expr *ec = kvp_call_arg(e, "cond", 0);
	const kvp_expr *ea = kvp_call_arg(e, "then", 1), *eb = kvp_call_arg(e, "else", 2);
	ty c = check_expr(S, ec, cx), a = check_expr(S, ea, cx), b = check_expr(S, eb, cx);
	if (c.u == KVP_SU_ERR || a.u == KVP_SU_ERR || b.u == KVP_SU_ERR)
		return TY_ERR;
	if (c.u != KVP_SU_BOOL) {
		ERR(S, ec->loc, "the first argument of if() must be a condition, not %s",
		    unit_name(c.u));
		return TY_ERR;
	}
	kvp_sunit u = unify(a.u, b.u);
	if (u == KVP_SU_ERR) {
		char hint[160];
		ratio_hint(S, ea, a.u, eb, b.u, hint, sizeof hint);
		ERR(S, e->loc, "unit mismatch in if(): %s and %s%s", unit_name(a.u),
		    unit_name(b.u), hint);
		return TY_ERR;
	}
	ty t = combine(combine(c, a, u), b, u);
	if (t.known)
		t.v = fold(e, c.v, a.v, b.v);
	return t;
}

/* caote(score, mode = exact|fast), a whole-head transform (docs/language.md 7.6) */
static ty check_call_caote(sema *S, const kvp_expr *e, unsigned cx)
{
	static const char *const nc[] = { "score", "mode" };
	static const int rc[] = { 1, 0 };
	if (check_args(S, e, nc, rc, 2))
		return TY_ERR;
	const kvp_expr *ex = kvp_call_arg(e, "score", 0);
	const kvp_expr *em = kvp_call_arg(e, "mode", 1);
	ty a = check_expr(S, ex, cx);
	if (a.u == KVP_SU_ERR || need_number(S, ex, a, "caote()"))
		return TY_ERR;
	if (em && (em->kind != KVP_E_NAME ||
	           (strcmp(em->name, "exact") != 0 && strcmp(em->name, "fast") != 0))) {
		ERR(S, em->loc, "caote() mode is 'exact' (attention output) or 'fast' (mean value)");
		return TY_ERR;
	}
	ty t = ty_make(KVP_SU_NUM);
	/* exact mode reads the query head's attention output */
	t.per_qhead = a.per_qhead || !(em && !strcmp(em->name, "fast"));
	return t;
}

/* normalize(score), a whole-head transform */
static ty check_call_normalize(sema *S, const kvp_expr *e, unsigned cx)
{
	static const char *const nn[] = { "score" };
	static const int rn[] = { 1 };
	if (check_args(S, e, nn, rn, 1))
		return TY_ERR;
	const kvp_expr *ex = kvp_call_arg(e, "score", 0);
	ty a = check_expr(S, ex, cx);
	if (a.u == KVP_SU_ERR || need_number(S, ex, a, "normalize()"))
		return TY_ERR;
	ty t = ty_make(KVP_SU_NUM);
	t.per_qhead = a.per_qhead;
	return t;
}

static ty check_unit(sema *S, const kvp_expr *e, unsigned cx, const kvp_sunit *acc, int n,
                     const char *what);
static int positive(sema *S, const kvp_expr *e, ty t, const char *what, int integer);
static int rule_holds(sema *S, const kvp_expr *e, ty t, enum kvp_rule r, const char *what);

/* expected_attention(future = F, skip = S), a whole-head transform (docs/language.md 7.8):
 * F future positions the RoPE is averaged over (a whole number of tokens >= 1, default
 * 512), S leading positions left out of the query statistics and the softmax (a whole
 * number of tokens >= 0, default 4; `keep sinks` must keep them, checked in
 * cross_checks). Both scalar: numbers, parameters, constants. */
static ty check_call_expattn(sema *S, const kvp_expr *e, unsigned cx)
{
	(void)cx;
	static const char *const na[] = { "future", "skip" };
	static const int ra[] = { 0, 0 };
	static const kvp_sunit tok[] = { KVP_SU_TOKENS };
	if (S->ea_call) {
		ERR(S, e->loc, "expected_attention() may be used once in a policy (its query statistics are kept once per head)");
		return TY_ERR;
	}
	if (check_args(S, e, na, ra, 2))
		return TY_ERR;
	const kvp_expr *ef = kvp_call_arg(e, "future", 0), *es = kvp_call_arg(e, "skip", 1);
	if (ef) {
		ty f = check_unit(S, ef, CX_SCALAR, tok, 1, "expected_attention() future");
		if (positive(S, ef, f, "expected_attention() future (positions the RoPE is averaged over)", 1))
			return TY_ERR;
	}
	ty k = { KVP_SU_TOKENS, 1, 4, 1, 0 };
	if (es) {
		k = check_unit(S, es, CX_SCALAR, tok, 1, "expected_attention() skip");
		if (k.u == KVP_SU_ERR)
			return TY_ERR;
		if (!rule_holds(S, es, k, KVP_RULE_NONNEG_INT, "expected_attention() skip")) {
			ERR(S, es->loc, "expected_attention() skip must be a whole number of tokens >= 0");
			return TY_ERR;
		}
	}
	S->ea_call = e;
	S->ea_skip = k;
	ty t = ty_make(KVP_SU_NUM);
	t.per_qhead = 1; /* each query head has its own query statistics */
	return t;
}

/* The path of a weight file named in a policy: relative to the directory of the .kvp file
 * unless absolute (malloc'ed; NULL when out of memory). */
static char *policy_file(const sema *S, const char *name)
{
	const char *src = S->src->path, *slash = strrchr(src, '/');
	int dir = name[0] == '/' || !slash ? 0 : (int)(slash - src) + 1;
	size_t n = (size_t)dir + strlen(name) + 1;
	char *path = malloc(n);
	if (path)
		snprintf(path, n, "%.*s%s", dir, src, name);
	return path;
}

/* FN("FILE") of a weight file: score only, once per policy, one string argument. The
 * argument's expression, or NULL after an error. */
static const kvp_expr *check_file_call(sema *S, const kvp_expr *e, unsigned cx, const char *fn,
                                       const char *what, const kvp_expr *before)
{
	static const char *const nh[] = { "file" };
	static const int rh[] = { 1 };
	if (!(cx & CX_SCORE)) {
		ERR(S, e->loc, "%s() is %s; it can be used only in the score", fn, what);
		return NULL;
	}
	if (before) {
		ERR(S, e->loc, "%s() may be used once in a policy (one weight file per policy)", fn);
		return NULL;
	}
	if (check_args(S, e, nh, rh, 1))
		return NULL;
	const kvp_expr *fe = kvp_call_arg(e, "file", 0);
	if (fe->kind != KVP_E_STR || !fe->name[0]) {
		ERR(S, fe->loc, "%s() takes the weight file as a string: %s(\"FILE\")", fn, fn);
		return NULL;
	}
	return fe;
}

/* head_score("FILE"): the weight of the entry's (layer, KV head) in FILE (kvp_heads.h),
 * read now, relative to the directory of the .kvp file, and baked into the generated code
 * (docs/language.md 7.12). Score only, once per policy. */
static ty check_call_heads(sema *S, const kvp_expr *e, unsigned cx)
{
	const kvp_expr *fe = check_file_call(S, e, cx, "head_score", "a per-head weight of the score",
	                                     S->out->head_call);
	if (!fe)
		return TY_ERR;
	char *path = policy_file(S, fe->name), err[512];
	if (!path) {
		ERR(S, fe->loc, "out of memory");
		return TY_ERR;
	}
	int rc = kvp_heads_read(path, &S->out->head_layers, &S->out->head_kv, &S->out->head_w,
	                        err, sizeof err);
	free(path);
	if (rc != 0) {
		ERR(S, fe->loc, "head_score(): %s", err);
		return TY_ERR;
	}
	S->out->head_call = e;
	return ty_make(KVP_SU_NUM);
}

/* linear_score("FILE"): KVzap's w·h + b of the entry's hidden state h with the
 * (layer, KV head)'s row of FILE (kvp_heads.h), read now like head_score()'s and baked into
 * the generated code (docs/language.md 7.14). Score only, once per policy. */
static ty check_call_linear(sema *S, const kvp_expr *e, unsigned cx)
{
	const kvp_expr *fe = check_file_call(S, e, cx, "linear_score",
	                                     "a per-entry score read from the hidden states",
	                                     S->out->lin_call);
	if (!fe)
		return TY_ERR;
	char *path = policy_file(S, fe->name), err[512];
	if (!path) {
		ERR(S, fe->loc, "out of memory");
		return TY_ERR;
	}
	int rc = kvp_linear_read(path, &S->out->lin_layers, &S->out->lin_kv, &S->out->lin_embd,
	                         &S->out->lin_w, err, sizeof err);
	free(path);
	if (rc != 0) {
		ERR(S, fe->loc, "linear_score(): %s", err);
		return TY_ERR;
	}
	S->out->lin_call = e;
	return ty_make(KVP_SU_NUM);
}

/* flow(question_stat, hops = 1): GraceKV's relevance from the question */
static ty check_call_flow(sema *S, const kvp_expr *e, unsigned cx)
{
	static const char *const nf[] = { "relevance", "hops" };
	static const int rf[] = { 1, 0 };
	if (check_args(S, e, nf, rf, 2))
		return TY_ERR;
	const kvp_expr *ex = kvp_call_arg(e, "relevance", 0);
	const kvp_expr *eh = kvp_call_arg(e, "hops", 1);
	const kvp_sym *y = ex->kind == KVP_E_NAME ? sym_use(S, ex->name) : NULL;
	if (!y || y->kind != KVP_SYM_STAT || y->stmt->window != KVP_W_PROMPT_TAIL ||
	    y->agg != KVP_STAT_SUM || !y->per_qhead) {
		ty a = check_expr(S, ex, cx);
		if (a.u != KVP_SU_ERR)
			ERR(S, ex->loc,
			    "flow() starts from the question's attention: a statistic `sum(attn) over prompt tail W`");
		return TY_ERR;
	}
	if (eh) {
		ty h = check_expr(S, eh, CX_SCALAR);
		if (h.u == KVP_SU_ERR)
			return TY_ERR;
		if (!h.constant || h.v != 1) {
			ERR(S, eh->loc, "flow() supports hops = 1 (direct relevance); multi-hop propagation is not available yet");
			return TY_ERR;
		}
	}
	ty t = ty_make(KVP_SU_NUM);
	t.per_qhead = 1;
	return t;
}

static ty check_call(sema *S, const kvp_expr *e, unsigned cx)
{
	const char *f = e->name;
	if (is_aggregate(f)) {
		ERR(S, e->loc,
		    "%s(...) is a statistic; define it with `stat NAME = %s(...)` and use NAME",
		    f, f);
		return TY_ERR;
	}
	const setting_word *w = find_setting_word(f);
	if (w) {
		ERR(S, e->loc, "%s(...) is %s; write it as `%s = %s(...)`", f, w->what,
		    w->setting, f);
		return TY_ERR;
	}
	if (!in_list(f, FUNCTIONS, N_FUNCTIONS)) {
		int d = 1000;
		const char *s = suggest_from(f, FUNCTIONS, N_FUNCTIONS, NULL, &d);
		s = suggest_from(f, AGGREGATES, N_AGGREGATES, s, &d);
		if (s)
			ERR(S, e->name_loc, "unknown function '%s'; did you mean '%s'?", f, s);
		else
			ERR(S, e->name_loc, "unknown function '%s'", f);
		return TY_ERR;
	}
	if (!strcmp(f, "min") || !strcmp(f, "max") || !strcmp(f, "pow"))
		return check_call_binary(S, e, cx);
	if (!strcmp(f, "abs") || !strcmp(f, "log") || !strcmp(f, "exp") || !strcmp(f, "sqrt"))
		return check_call_unary(S, e, cx);
	if (!strcmp(f, "if"))
		return check_call_if(S, e, cx);
	if (!strcmp(f, "head_score"))
		return check_call_heads(S, e, cx);
	if (!strcmp(f, "linear_score"))
		return check_call_linear(S, e, cx);
	/* whole-head transforms: score only */
	if (!(cx & CX_SCORE)) {
		ERR(S, e->loc, "%s() transforms the score of every entry of a head; it can be used only in the score",
		    f);
		return TY_ERR;
	}
	if (!strcmp(f, "caote"))
		return check_call_caote(S, e, cx);
	if (!strcmp(f, "normalize"))
		return check_call_normalize(S, e, cx);
	if (!strcmp(f, "expected_attention"))
		return check_call_expattn(S, e, cx);
	return check_call_flow(S, e, cx);
}

static ty check_expr(sema *S, const kvp_expr *e, unsigned cx)
{
	switch (e->kind) {
	case KVP_E_NUM:
		switch (e->unit) {
		case KVP_LIT_ENTRIES: return ty_const(KVP_SU_ENTRIES, e->num);
		case KVP_LIT_TOKENS: return ty_const(KVP_SU_TOKENS, e->num);
		case KVP_LIT_STEPS: return ty_const(KVP_SU_STEPS, e->num);
		case KVP_LIT_PERCENT: return ty_const(KVP_SU_RATIO, e->num);
		default: return ty_const(KVP_SU_ANY, e->num);
		}
	case KVP_E_NAME:
		return check_name(S, e, cx);
	case KVP_E_CALL:
		return check_call(S, e, cx);
	case KVP_E_ARG:
		ERR(S, e->loc, "a named argument can only appear inside a call");
		return TY_ERR;
	case KVP_E_UNARY: {
		ty a = check_expr(S, e->a, cx);
		if (a.u == KVP_SU_ERR)
			return TY_ERR;
		if (e->op == KVP_ASTOP_NOT) {
			if (a.u != KVP_SU_BOOL) {
				ERR(S, e->a->loc, "'not' needs a condition, not %s", unit_name(a.u));
				return TY_ERR;
			}
			a.v = fold(e, a.v, 0, 0);
			return a;
		}
		if (need_number(S, e->a, a, "'-'"))
			return TY_ERR;
		a.v = fold(e, a.v, 0, 0);
		return a;
	}
	case KVP_E_BINARY:
		return check_binary(S, e, cx);
	case KVP_E_LIST:
		ERR(S, e->loc, "a list [...] can only be a value of `layers = [...]` or of `windows = [...]` in `segment = curvature(...)`");
		return TY_ERR;
	case KVP_E_BUDGET:
		if (!(cx & (CX_SCALAR))) {
			ERR(S, e->loc, "'budget' can be used in guards, triggers and targets, not in %s",
			    cx_where(cx));
			return TY_ERR;
		}
		if (S->in_budget) {
			ERR(S, e->loc, "'budget' is used in its own definition");
			return TY_ERR;
		}
		if (!S->have_budget) {
			if (!S->out->setting[KVP_SET_BUDGET])
				ERR(S, e->loc, "'budget' is used but the policy sets no budget");
			return TY_ERR; /* the budget's own error is reported */
		}
		if (S->out->budget_level) {
			ERR(S, e->loc, "'budget' has no size under `budget = threshold(...)`: each head keeps the entries whose score passes the level");
			return TY_ERR;
		}
		{
			ty t = S->budget;
			t.u = KVP_SU_ENTRIES;
			t.known = S->budget.known && S->budget.u == KVP_SU_ENTRIES;
			t.constant = 0;
			return t;
		}
	case KVP_E_STR:
		ERR(S, e->loc, "a string can only name the file of head_score(\"FILE\") or linear_score(\"FILE\")");
		return TY_ERR;
	case KVP_E_ENTRIES:
		if (!(cx & (CX_OBSERVE | CX_SCORE))) {
			ERR(S, e->loc, "'entries' (the entries a head holds) cannot be used in %s; a trigger writes `compress when entries > LIMIT`",
			    cx_where(cx));
			return TY_ERR;
		}
		return ty_make(KVP_SU_ENTRIES);
	}
	return TY_ERR;
}

/* Check e in context cx and require one of the units in acc[0..n) (ANY becomes acc[0]).
 * what names the slot in messages ("the budget"). */
static ty check_unit(sema *S, const kvp_expr *e, unsigned cx, const kvp_sunit *acc, int n,
                     const char *what)
{
	ty t = check_expr(S, e, cx);
	if (t.u == KVP_SU_ERR)
		return t;
	if (t.u == KVP_SU_ANY) {
		t.u = acc[0];
		return t;
	}
	for (int i = 0; i < n; i++)
		if (t.u == acc[i])
			return t;
	char want[96] = "";
	for (int i = 0; i < n; i++) {
		size_t l = strlen(want);
		snprintf(want + l, sizeof want - l, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
		         unit_name(acc[i]));
	}
	const kvp_sym *y = e->kind == KVP_E_NAME ? kvp_sema_lookup(S->out, e->name) : NULL;
	if (y && y->kind != KVP_SYM_STAT && t.u == KVP_SU_NUM) {
		char b[32];
		fmt_num(y->value, b, sizeof b);
		/* a percentage is written against its number (`12.5%`; `12.5 %` does not lex) */
		const int pct = acc[0] == KVP_SU_RATIO;
		ERR(S, e->loc, "%s must be %s, not a plain number; give '%s' a unit, as in `%s %s = %s%s%s`",
		    what, want, e->name, y->kind == KVP_SYM_PARAM ? "param" : "const", e->name, b,
		    pct ? "" : " ", pct ? "%" : unit_name(acc[0]));
		return TY_ERR;
	}
	int wants_count = 0;
	for (int i = 0; i < n; i++)
		wants_count |= acc[i] == KVP_SU_TOKENS || acc[i] == KVP_SU_ENTRIES;
	if (t.u == KVP_SU_RATIO && wants_count) {
		char hint[160];
		ratio_hint(S, e, t.u, e, KVP_SU_TOKENS, hint, sizeof hint);
		ERR(S, e->loc, "%s must be %s, not a ratio%s", what, want, hint);
		return TY_ERR;
	}
	ERR(S, e->loc, "%s must be %s, not %s", what, want, unit_name(t.u));
	return TY_ERR;
}

/* a compile-time constant, integer >= lo */
static int need_const(sema *S, const kvp_expr *e, ty t, const char *what)
{
	if (t.u == KVP_SU_ERR)
		return -1;
	if (!t.constant || !t.known) {
		ERR(S, e->loc, "%s is compiled in: use a number or a `const`, not a parameter or signal",
		    what);
		return -1;
	}
	return 0;
}

static const kvp_sunit U_NUM[] = { KVP_SU_NUM };
/* sizes: a token kept as itself is one entry, so tokens count as entries */
static const kvp_sunit U_SIZE[] = { KVP_SU_ENTRIES, KVP_SU_RATIO, KVP_SU_TOKENS };
static const kvp_sunit U_TOKENS[] = { KVP_SU_TOKENS };
static const kvp_sunit U_TOKENS_RATIO[] = { KVP_SU_TOKENS, KVP_SU_RATIO };
static const kvp_sunit U_STEPS[] = { KVP_SU_STEPS };
static const kvp_sunit U_ENTRIES[] = { KVP_SU_ENTRIES };
static const kvp_sunit U_FRACTION[] = { KVP_SU_NUM, KVP_SU_RATIO };
static const kvp_sunit U_RATIO[] = { KVP_SU_RATIO };

/* ---- pass 1: definitions ----------------------------------------------------------- */

static int name_is_builtin(const char *name, const char **what)
{
	if (find_signal(name)) {
		*what = "a built-in signal";
		return 1;
	}
	if (in_list(name, FUNCTIONS, N_FUNCTIONS) || is_aggregate(name)) {
		*what = "a built-in function";
		return 1;
	}
	if (find_setting_word(name) || !strcmp(name, "exact") || !strcmp(name, "fast")) {
		*what = "a built-in word";
		return 1;
	}
	return 0;
}

static void check_value_def(sema *S, const kvp_stmt *st, kvp_sym *y)
{
	ty t = check_expr(S, st->value, CX_CONST);
	if (t.u == KVP_SU_ERR)
		return;
	if (t.u == KVP_SU_BOOL) {
		ERR(S, st->value->loc, "a %s is a number, not a condition",
		    st->kind == KVP_S_PARAM ? "parameter" : "constant");
		return;
	}
	if (!t.known) {
		ERR(S, st->value->loc, "the value of '%s' is not a finite number", st->name);
		return;
	}
	y->unit = t.u == KVP_SU_ANY ? KVP_SU_NUM : t.u;
	y->value = t.v;
	y->ok = 1;
}

static void check_stat(sema *S, const kvp_stmt *st, kvp_sym *y)
{
	const kvp_expr *v = st->value;
	if (v->kind != KVP_E_CALL || !is_aggregate(v->name)) {
		if (v->kind == KVP_E_CALL && !in_list(v->name, FUNCTIONS, N_FUNCTIONS) &&
		    !find_setting_word(v->name)) {
			int d = 1000;
			const char *s = suggest_from(v->name, AGGREGATES, N_AGGREGATES, NULL, &d);
			if (s) {
				ERR(S, v->name_loc, "unknown statistic '%s'; did you mean '%s'?",
				    v->name, s);
				return;
			}
		}
		ERR(S, v->loc,
		    "a statistic is sum(X), mean(X), count(COND), ema(X, alpha) or last(X) of a signal");
		return;
	}
	const char *f = v->name;
	enum kvp_ir_stat_kind agg = KVP_STAT_LAST;
	for (int i = 0; i < N_AGGREGATES; i++)
		if (!strcmp(f, AGGREGATES[i]))
			agg = (enum kvp_ir_stat_kind)i;
	const char *arg0 = agg == KVP_STAT_COUNT ? "cond" : "x";
	const char *names[2] = { arg0, "alpha" };
	static const int req[2] = { 1, 1 };
	if (check_args(S, v, names, req, agg == KVP_STAT_EMA ? 2 : 1))
		return;
	const kvp_expr *arg = kvp_call_arg(v, arg0, 0);
	ty a = check_expr(S, arg, CX_OBSERVE);
	if (a.u == KVP_SU_ERR)
		return;
	if (agg == KVP_STAT_COUNT && a.u != KVP_SU_BOOL) {
		ERR(S, arg->loc, "count() counts the steps at which a condition holds; this is %s",
		    unit_name(a.u));
		return;
	}
	if (agg != KVP_STAT_COUNT && a.u == KVP_SU_BOOL) {
		ERR(S, arg->loc, "%s() of a condition; use count(...) to count the steps where it holds",
		    f);
		return;
	}
	if (agg == KVP_STAT_EMA) {
		const kvp_expr *al = kvp_call_arg(v, "alpha", 1);
		ty t = check_unit(S, al, CX_SCALAR, U_FRACTION, 2, "the ema rate alpha");
		if (t.u == KVP_SU_ERR)
			return;
		if (!rule_holds(S, al, t, KVP_RULE_RATE, "the ema rate alpha")) {
			char b[32];
			fmt_num(t.v, b, sizeof b);
			ERR(S, al->loc, "the ema rate alpha must be in (0, 1]; got %s", b);
			return;
		}
		y->alpha = al;
	}
	if ((agg == KVP_STAT_EMA || agg == KVP_STAT_LAST) &&
	    (st->window == KVP_W_LAST || st->window == KVP_W_PROMPT_TAIL)) {
		ERR(S, st->window_loc, "%s() has no history window; remove this `over` clause", f);
		return;
	}
	if (st->window == KVP_W_LAST) {
		ty w = check_unit(S, st->window_len, CX_SCALAR, U_STEPS, 1, "a history window");
		if (need_const(S, st->window_len, w, "a history window (a ring buffer per entry)"))
			return;
		if (w.v < 1 || !is_int(w.v)) {
			char b[32];
			fmt_num(w.v, b, sizeof b);
			ERR(S, st->window_len->loc,
			    "a history window must be a whole number of steps >= 1; got %s", b);
			return;
		}
		if (w.v > 65536) {
			ERR(S, st->window_len->loc,
			    "a history window of more than 65536 steps is too large for a ring buffer; use `over all`");
			return;
		}
		if ((agg == KVP_STAT_SUM || agg == KVP_STAT_MEAN) && w.v > KVP_IR_MAX_FLOAT_RING) {
			ERR(S, st->window_len->loc,
			    "%s() over the last %.0f steps keeps one number per step and entry; the limit is %d steps (count() keeps one bit and allows 65536)",
			    f, w.v, KVP_IR_MAX_FLOAT_RING);
			return;
		}
	} else if (st->window == KVP_W_PROMPT_TAIL) {
		ty w = check_unit(S, st->window_len, CX_SCALAR, U_TOKENS, 1, "an observation window");
		if (w.u == KVP_SU_ERR)
			return;
		if (!rule_holds(S, st->window_len, w, KVP_RULE_PERIOD, "an observation window")) {
			char b[32];
			fmt_num(w.v, b, sizeof b);
			ERR(S, st->window_len->loc,
			    "an observation window must be a whole number of tokens >= 1; got %s", b);
			return;
		}
	}
	y->agg = agg;
	y->arg = arg;
	y->per_qhead = a.per_qhead;
	y->unit = KVP_SU_NUM;
	y->ok = 1;
}

static void pass_definitions(sema *S, const kvp_file *f)
{
	S->defs = calloc((size_t)f->n_stmts + 1, sizeof *S->defs);
	if (!S->defs)
		abort();
	for (int i = 0; i < f->n_stmts; i++) {
		const kvp_stmt *st = f->stmts[i];
		if (st->kind == KVP_S_PARAM || st->kind == KVP_S_CONST || st->kind == KVP_S_STAT)
			S->defs[S->n_defs++] = st;
	}
	for (int i = 0; i < S->n_defs; i++) {
		const kvp_stmt *st = S->defs[i];
		const char *what;
		int dup = 0;
		for (int j = 0; j < i; j++) {
			if (strcmp(S->defs[j]->name, st->name) == 0) {
				ERR(S, st->name_loc, "'%s' is already defined", st->name);
				NOTE(S, S->defs[j]->name_loc, "'%s' was first defined here", st->name);
				dup = 1;
				break;
			}
		}
		int builtin = 0;
		if (!dup && name_is_builtin(st->name, &what)) {
			ERR(S, st->name_loc, "'%s' is %s; choose another name", st->name, what);
			builtin = 1;
		}
		kvp_sym *y = sym_add(S, st, st->kind == KVP_S_PARAM ? KVP_SYM_PARAM :
		                            st->kind == KVP_S_CONST ? KVP_SYM_CONST : KVP_SYM_STAT);
		if (dup) {
			/* keep the first definition visible under this name */
			y->name = "";
		} else if (builtin) {
			/* visible but not ok: its uses report nothing more */
		} else if (st->kind == KVP_S_STAT) {
			S->current = st;
			check_stat(S, st, y);
			S->current = NULL;
		} else {
			S->current = st;
			check_value_def(S, st, y);
			S->current = NULL;
		}
		if (!y->ok && S->src->n_errors == 0) {
			/* every failed definition must have said why; never lower a broken one */
			ERR(S, st->name_loc, "the definition of '%s' is not valid", st->name);
		}
		S->n_defined = i + 1;
	}
}

/* ---- pass 2: settings, guards, trigger ------------------------------------------- */

/* the first statement of this kind, or report a duplicate */
static int set_once(sema *S, const kvp_stmt **slot, const kvp_stmt *st, const char *what)
{
	if (*slot) {
		ERR(S, st->loc, "%s is given twice", what);
		NOTE(S, (*slot)->loc, "first given here");
		return -1;
	}
	*slot = st;
	return 0;
}

static const char *word_of(const kvp_expr *v)
{
	if (v->kind == KVP_E_NAME || v->kind == KVP_E_CALL)
		return v->name;
	return NULL;
}

/* report an unknown choice for a setting with a suggestion */
static void bad_choice(sema *S, const kvp_expr *v, const char *setting,
                       const char *const *choices, int n)
{
	const char *w = word_of(v);
	char list[200] = "";
	for (int i = 0; i < n; i++) {
		size_t l = strlen(list);
		snprintf(list + l, sizeof list - l, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
		         choices[i]);
	}
	int d = 1000;
	const char *s = w ? suggest_from(w, choices, n, NULL, &d) : NULL;
	if (s)
		ERR(S, v->kind == KVP_E_CALL ? v->name_loc : v->loc,
		    "unknown %s '%s'; did you mean '%s'?", setting, w, s);
	else
		ERR(S, v->loc, "%s must be %s", setting, list);
}

/* Rule r (runtime/policy/rt_policy.h KVP_RULES) of a setting's value t, the checked
 * expression e; what names the setting (a string literal, kept). 1 when the rule holds or
 * the value is not known here; a value that reads parameters is also recorded, and the
 * lowering hands it to the policy's check_params, which applies the rule to the values a
 * run sets (--set, a request's kv.set). The caller reports a broken rule in its words. */
static int rule_holds(sema *S, const kvp_expr *e, ty t, enum kvp_rule r, const char *what)
{
	if (t.u == KVP_SU_ERR || !t.known)
		return 1;
	if (!kvp_rule_ok(r, t.v))
		return 0;
	if (t.constant)
		return 1;
	kvp_sema *o = S->out;
	if (o->n_rules == o->cap_rules) {
		int cap = o->cap_rules ? 2 * o->cap_rules : 8;
		struct kvp_sema_rule *nr = realloc(o->rules, sizeof *nr * (size_t)cap);
		if (!nr)
			abort();
		o->rules = nr;
		o->cap_rules = cap;
	}
	o->rules[o->n_rules++] = (struct kvp_sema_rule){ e, r, what };
	return 1;
}

static int positive(sema *S, const kvp_expr *e, ty t, const char *what, int integer)
{
	if (t.u == KVP_SU_ERR)
		return -1;
	if (!rule_holds(S, e, t, integer ? KVP_RULE_POSITIVE_INT : KVP_RULE_POSITIVE, what)) {
		char b[32];
		fmt_num(t.v, b, sizeof b);
		ERR(S, e->loc, "%s must be %s > 0; got %s", what,
		    integer ? "a whole number" : "a number", b);
		return -1;
	}
	return 0;
}

/* `budget = B min F`: the floor F, entries (tokens) per head, a whole number > 0 and not
 * above a budget of a fixed size (docs/language.md section 7.9). It survives every
 * override of the budget (a compression ratio, --set), which is why it is not written as
 * max(B, F) inside the budget. */
static void check_budget_floor(sema *S, const kvp_stmt *st)
{
	kvp_sema *o = S->out;
	const kvp_expr *fl = st->target;
	static const kvp_sunit U_COUNT[] = { KVP_SU_ENTRIES, KVP_SU_TOKENS };
	ty t = check_expr(S, fl, CX_SCALAR); /* a ratio gets its own message, */
	if (t.u == KVP_SU_ERR)
		return;
	if (t.u != KVP_SU_RATIO) /* every other unit check_unit's (fl checked once already) */
		t = check_unit(S, fl, CX_SCALAR, U_COUNT, 2, "the budget's floor");
	if (t.u == KVP_SU_ERR)
		return;
	if (t.u == KVP_SU_RATIO) {
		ERR(S, fl->loc, "the budget's floor is a number of entries, as in `min 64 tokens`, not a share of the context: it keeps short contexts whole where a share would not");
		return;
	}
	if (!t.known) {
		ERR(S, fl->loc, "the budget's floor is fixed for a sequence: a number, a `const` or a `param`, not a signal that follows the context");
		return;
	}
	if (positive(S, fl, t, "the budget's floor", 1))
		return;
	if (t.known && S->budget.known && o->budget_unit != KVP_SU_RATIO && !o->budget_bytes &&
	    t.v > S->budget.v) {
		char fb[32], bb[32];
		fmt_num(t.v, fb, sizeof fb);
		fmt_num(S->budget.v, bb, sizeof bb);
		ERR(S, fl->loc, "the floor (%s entries) is above the budget (%s entries), so the policy's own budget never holds; a floor is for a budget that shrinks with the context or a compression ratio",
		    fb, bb);
		NOTE(S, st->value->loc, "the budget is set here");
		return;
	}
	o->budget_min = fl;
}

/* budget = threshold '(' LEVEL ')': every head keeps the entries outside the guards whose
 * score is at least LEVEL (a plain number, a parameter: `--set` and `tune --param` change it)
 * and evicts the rest (docs/language.md section 7.11); the entry budget is the whole context
 * (`budget = 100%`), so only the level and an override's ratio evict. */
static void check_budget_threshold(sema *S, const kvp_expr *v)
{
	static const char *const n[] = { "level" };
	static const int r[] = { 1 };
	if (check_args(S, v, n, r, 1))
		return;
	const kvp_expr *lv = kvp_call_arg(v, "level", 0);
	S->in_budget = 1;
	ty t = check_unit(S, lv, CX_SCALAR, U_NUM, 1, "a threshold level (compared with the score)");
	S->in_budget = 0;
	if (t.u == KVP_SU_ERR)
		return;
	S->out->budget_level = lv;
	S->out->budget_unit = KVP_SU_RATIO;
	S->budget = (ty){ KVP_SU_RATIO, 1, 1.0, 1, 0 };
	S->have_budget = 1;
}

/* budget = SIZE | bytes '(' SHARE ')' | threshold '(' LEVEL ')'
 * SIZE: entries (tokens) or a ratio of the context; bytes(SHARE): a ratio of the bytes of
 * an f16 full cache of the context (docs/language.md section 7.8), checked as the ratio. */
static void check_budget(sema *S, const kvp_stmt *st)
{
	const kvp_expr *v = st->value;
	kvp_sema *o = S->out;
	if (v->kind == KVP_E_CALL && !strcmp(v->name, "threshold")) {
		if (st->target)
			ERR(S, st->target->loc, "`budget = threshold(...)` takes no floor (`min`): the level alone decides what each head keeps");
		else
			check_budget_threshold(S, v);
		return;
	}
	if (v->kind == KVP_E_CALL && !strcmp(v->name, "bytes")) {
		static const char *const n[] = { "share" };
		static const int r[] = { 1 };
		if (check_args(S, v, n, r, 1))
			return;
		v = kvp_call_arg(v, "share", 0);
		if (v->kind == KVP_E_NUM && v->unit != KVP_LIT_NONE && v->unit != KVP_LIT_PERCENT) {
			ERR(S, v->loc, "a byte budget is a share of the full cache's bytes (f16 = 100%%), as in `budget = bytes(12.5%%)`");
			return;
		}
		o->budget_bytes = 1;
		o->budget_share = v;
	}
	S->in_budget = 1;
	ty t = o->budget_bytes ?
	       check_unit(S, v, CX_SCALAR, U_RATIO, 1, "a byte budget (a share of the full cache's bytes)") :
	       check_unit(S, v, CX_SCALAR, U_SIZE, 3, "the budget");
	S->in_budget = 0;
	if (t.u == KVP_SU_ERR)
		return;
	/* a byte budget that reads parameters is re-checked with the values a run sets (a
	 * share above 100% of an f16 full cache is refused here, so at run time too) */
	const int bytes_ok = !o->budget_bytes ||
	                     rule_holds(S, v, t, KVP_RULE_SHARE, "the byte budget (a share of an f16 full cache's bytes)");
	if (t.known && (!bytes_ok || !o->budget_bytes)) {
		char b[32];
		fmt_num(t.u == KVP_SU_RATIO ? t.v * 100 : t.v, b, sizeof b);
		if (t.v == 0) {
			ERR(S, st->value->loc, "the budget is 0%s; a policy must keep at least one entry per head",
			    t.u == KVP_SU_RATIO ? "% of the context" : " entries");
			return;
		}
		if (t.v < 0) {
			ERR(S, st->value->loc, "the budget is negative (%s%s)", b,
			    t.u == KVP_SU_RATIO ? "%" : " entries");
			return;
		}
		if (o->budget_bytes && t.v > 1) {
			ERR(S, v->loc, "the byte budget is %s%% of an f16 full cache; a byte budget is at most 100%%",
			    b);
			return;
		}
		if (t.u == KVP_SU_RATIO && t.v > 1) {
			ERR(S, st->value->loc, "the budget is %s%% of the context; a ratio budget is at most 100%%",
			    b);
			return;
		}
	}
	S->out->budget_unit = t.u;
	S->budget = t;
	S->have_budget = 1;
	if (st->target)
		check_budget_floor(S, st);
}

static void check_layers(sema *S, const kvp_stmt *st)
{
	static const char *const choices[] = { "uniform", "pyramid", "funnel", "linear", "global_only",
		                                "[...]" };
	const kvp_expr *v = st->value;
	kvp_sema *o = S->out;
	if (v->kind == KVP_E_LIST) {
		if (v->n_args == 0 || v->n_args > 1024) {
			ERR(S, v->loc, "a layer list needs between 1 and 1024 multipliers");
			return;
		}
		for (int i = 0; i < v->n_args; i++) {
			if (v->args[i]->kind == KVP_E_ARG) {
				ERR(S, v->args[i]->loc, "a layer list holds numbers, not named arguments");
				return;
			}
			ty t = check_unit(S, v->args[i], CX_SCALAR, U_NUM, 1, "a layer multiplier");
			if (need_const(S, v->args[i], t, "a layer multiplier"))
				return;
			/* a 0 leaves the layers it maps to without a budget, which every run
			 * refuses (below 1 entry per KV head: runtime/policy/rt_budget.c) */
			if (!(t.v > 0)) {
				ERR(S, v->args[i]->loc, "a layer multiplier must be > 0 (the layers a 0 "
				    "maps to would keep no entry, which every run refuses); got %g", t.v);
				return;
			}
		}
		o->layers = K_LAYERS_LIST;
		o->list = v;
		return;
	}
	const char *w = word_of(v);
	if (w && !strcmp(w, "uniform") && v->kind == KVP_E_NAME) {
		o->layers = K_LAYERS_UNIFORM;
		return;
	}
	if (w && !strcmp(w, "global_only") && v->kind == KVP_E_NAME) {
		o->layers = K_LAYERS_GLOBAL_ONLY;
		return;
	}
	if (w && (!strcmp(w, "pyramid") || !strcmp(w, "funnel"))) {
		static const char *const n[] = { "beta" };
		static const int r[] = { 0 };
		if (v->kind == KVP_E_CALL && check_args(S, v, n, r, 1))
			return;
		const kvp_expr *beta = kvp_call_arg(v, "beta", 0);
		if (beta) {
			ty t = check_unit(S, beta, CX_SCALAR, U_NUM, 1, "beta");
			if (positive(S, beta, t, "beta", 0))
				return;
		}
		o->layers = !strcmp(w, "pyramid") ? K_LAYERS_PYRAMID : K_LAYERS_FUNNEL;
		o->beta = beta;
		return;
	}
	if (w && !strcmp(w, "linear")) {
		static const char *const n[] = { "from", "to" };
		static const int r[] = { 1, 1 };
		if (v->kind != KVP_E_CALL) {
			ERR(S, v->loc, "linear needs its end points, as in `layers = linear(0.8, 1.2)`");
			return;
		}
		if (check_args(S, v, n, r, 2))
			return;
		const kvp_expr *a = kvp_call_arg(v, "from", 0), *b = kvp_call_arg(v, "to", 1);
		ty ta = check_unit(S, a, CX_SCALAR, U_NUM, 1, "the first multiplier");
		ty tb = check_unit(S, b, CX_SCALAR, U_NUM, 1, "the last multiplier");
		if (ta.u == KVP_SU_ERR || tb.u == KVP_SU_ERR)
			return;
		if ((ta.known && ta.v < 0) || (tb.known && tb.v < 0) ||
		    (ta.known && tb.known && ta.v + tb.v <= 0)) {
			ERR(S, v->loc, "linear() multipliers must be >= 0 and not both 0");
			return;
		}
		o->layers = K_LAYERS_LINEAR;
		o->lin_from = a;
		o->lin_to = b;
		return;
	}
	bad_choice(S, v, "layer schedule", choices, 6);
}

static int check_floor(sema *S, const kvp_expr *fl)
{
	ty t = check_unit(S, fl, CX_SCALAR, U_FRACTION, 2, "the floor");
	if (t.u == KVP_SU_ERR)
		return -1;
	if (!rule_holds(S, fl, t, KVP_RULE_FRACTION, "the floor (a fraction of the budget)")) {
		char b[32];
		fmt_num(t.v, b, sizeof b);
		ERR(S, fl->loc, "the floor is a fraction of the budget in [0, 1]; got %s", b);
		return -1;
	}
	return 0;
}

static void check_allocate(sema *S, const kvp_stmt *st)
{
	static const char *const choices[] = { "uniform", "adaptive", "global" };
	const kvp_expr *v = st->value;
	const char *w = word_of(v);
	kvp_sema *o = S->out;
	if (w && !strcmp(w, "uniform") && v->kind == KVP_E_NAME) {
		o->allocate = K_HEADS_EACH;
		return;
	}
	if (w && (!strcmp(w, "adaptive") || !strcmp(w, "global"))) {
		static const char *const n[] = { "floor" };
		static const int r[] = { 0 };
		if (v->kind == KVP_E_CALL && check_args(S, v, n, r, 1))
			return;
		const kvp_expr *fl = kvp_call_arg(v, "floor", 0);
		if (fl && check_floor(S, fl))
			return;
		o->allocate = !strcmp(w, "adaptive") ? K_HEADS_ADAPTIVE : K_HEADS_GLOBAL;
		o->alloc_floor = fl;
		return;
	}
	bad_choice(S, v, "allocation", choices, 3);
}

static void check_pool(sema *S, const kvp_stmt *st)
{
	static const char *const choices[] = { "max(kernel = K)", "avg(kernel = K)", "none" };
	static const char *const words[] = { "max", "avg", "none" };
	const kvp_expr *v = st->value;
	const char *w = word_of(v);
	kvp_sema *o = S->out;
	if (w && !strcmp(w, "none") && v->kind == KVP_E_NAME) {
		o->pool = K_POOL_NONE;
		return;
	}
	if (w && (!strcmp(w, "max") || !strcmp(w, "avg"))) {
		if (v->kind != KVP_E_CALL) {
			ERR(S, v->loc, "pooling needs a kernel size, as in `pool = %s(kernel = 7)`", w);
			return;
		}
		static const char *const n[] = { "kernel" };
		static const int r[] = { 1 };
		if (check_args(S, v, n, r, 1))
			return;
		const kvp_expr *k = kvp_call_arg(v, "kernel", 0);
		ty t = check_unit(S, k, CX_SCALAR, U_ENTRIES, 1, "the pooling kernel");
		if (need_const(S, k, t, "the pooling kernel"))
			return;
		if (t.v < 1 || t.v > 1023 || !is_int(t.v) || ((long long)t.v) % 2 == 0) {
			char b[32];
			fmt_num(t.v, b, sizeof b);
			ERR(S, k->loc, "the pooling kernel must be an odd whole number from 1 to 1023; got %s",
			    b);
			return;
		}
		o->pool = !strcmp(w, "max") ? K_POOL_MAX : K_POOL_AVG;
		o->kernel = k;
		return;
	}
	int d = 1000;
	const char *s = w ? suggest_from(w, words, 3, NULL, &d) : NULL;
	if (s)
		ERR(S, v->kind == KVP_E_CALL ? v->name_loc : v->loc,
		    "unknown pooling '%s'; did you mean '%s'?", w, s);
	else
		ERR(S, v->loc, "pool must be %s, %s or %s", choices[0], choices[1], choices[2]);
}

/* A plain number >= 0 (or > 0 when strict) for a GraceKV tuning value. 0 when fine. */
static int grace_number(sema *S, const kvp_expr *e, const char *what, int strict)
{
	if (!e)
		return 0;
	ty t = check_unit(S, e, CX_SCALAR, U_NUM, 1, what);
	if (t.u == KVP_SU_ERR)
		return -1;
	if (!rule_holds(S, e, t, strict ? KVP_RULE_POSITIVE : KVP_RULE_NONNEG, what)) {
		char b[32];
		fmt_num(t.v, b, sizeof b);
		ERR(S, e->loc, "%s must be %s 0; got %s", what, strict ? ">" : ">=", b);
		return -1;
	}
	return 0;
}

/* A whole number of tokens > 0 (a segment length), or NULL. 0 when fine. */
static int grace_tokens(sema *S, const kvp_expr *e, const char *what, ty *out)
{
	out->known = 0;
	if (!e)
		return 0;
	*out = check_unit(S, e, CX_SCALAR, U_TOKENS, 1, what);
	return positive(S, e, *out, what, 1);
}

/* action = add_split [ '(' [mass = X] [, numerator = Y] ')' ]
 * The Add/Split competition (kernels/k_grace.h): the distortion weights of the attention
 * mass (λ_Z) and numerator (λ_M), plain numbers >= 0, default 1. */
static void check_add_split(sema *S, const kvp_expr *v)
{
	static const char *const n[] = { "mass", "numerator" };
	static const int r[] = { 0, 0 };
	kvp_sema *o = S->out;
	if (v->kind == KVP_E_CALL) {
		for (int i = 0; i < v->n_args; i++) {
			const kvp_expr *a = v->args[i];
			if (a->kind == KVP_E_ARG && (!strcmp(a->name, "slot") || !strcmp(a->name, "floor"))) {
				ERR(S, a->name_loc, "add_split() has no argument '%s'; write %s", a->name,
				    a->name[0] == 's' ? "the segment length as `segment = curvature(target = T tokens)`"
				                      : "the singleton floor as `keep singletons N entries`");
				return;
			}
		}
		if (check_args(S, v, n, r, 2))
			return;
	}
	const kvp_expr *mass = v->kind == KVP_E_CALL ? kvp_call_arg(v, "mass", 0) : NULL;
	const kvp_expr *num = v->kind == KVP_E_CALL ? kvp_call_arg(v, "numerator", 1) : NULL;
	if (grace_number(S, mass, "the mass weight", 0) || grace_number(S, num, "the numerator weight", 0))
		return;
	o->action = K_ACT_SPLIT;
	o->mass = mass;
	o->numerator = num;
}

/* windows = '[' W { ',' W } ']': 1 to 4 curvature window sizes, whole tokens > 0, compiled
 * in. 0 when fine. */
static int check_windows(sema *S, const kvp_expr *l)
{
	if (l->kind != KVP_E_LIST || l->n_args < 1 || l->n_args > 4) {
		ERR(S, l->loc, "the curvature windows are a list of 1 to 4 sizes in tokens, as in `windows = [2 tokens, 4 tokens, 8 tokens]`");
		return -1;
	}
	for (int i = 0; i < l->n_args; i++) {
		const kvp_expr *w = l->args[i];
		if (w->kind == KVP_E_ARG) {
			ERR(S, w->loc, "a window list holds sizes, not named arguments");
			return -1;
		}
		ty t = check_unit(S, w, CX_SCALAR, U_TOKENS, 1, "a curvature window");
		if (need_const(S, w, t, "a curvature window") || positive(S, w, t, "a curvature window", 1))
			return -1;
		if (t.v > 1024) {
			ERR(S, w->loc, "a curvature window must be at most 1024 tokens");
			return -1;
		}
	}
	return 0;
}

/* segment = curvature [ '(' [target = T] [, min = A] [, max = B] [, cut = C] [, length = P]
 *                           [, stability = S] [, surprisal = W] [, windows = [W1, ...]] ')' ]
 *         | slots '(' T ')'
 * How the context is cut into the roots of the prototype trees (kernels/k_segment.h): at
 * semantic change (hidden-state curvature and surprisal, a DP over cuts) or in fixed slots
 * of T tokens. Lengths are whole numbers of tokens with min <= target <= max. */
static void check_segment(sema *S, const kvp_stmt *st)
{
	static const char *const choices[] = { "curvature", "slots" };
	static const char *const n[] = { "target", "min", "max", "cut", "length", "stability",
		                         "surprisal", "windows" };
	static const int r[] = { 0, 0, 0, 0, 0, 0, 0, 0 };
	static const char *const sn[] = { "length" };
	static const int sr[] = { 1 };
	const kvp_expr *v = st->value;
	const char *w = word_of(v);
	kvp_sema *o = S->out;
	ty tt, ta, tb;
	if (w && !strcmp(w, "slots")) {
		if (v->kind != KVP_E_CALL) {
			ERR(S, v->loc, "fixed slots need a length, as in `segment = slots(64 tokens)`");
			return;
		}
		const kvp_expr *len = check_args(S, v, sn, sr, 1) ? NULL : kvp_call_arg(v, "length", 0);
		if (!len || grace_tokens(S, len, "the slot length", &tt))
			return;
		o->slot = len;
		o->seg_fixed = 1;
		return;
	}
	if (!w || strcmp(w, "curvature")) {
		bad_choice(S, v, "segmentation", choices, 2);
		return;
	}
	if (v->kind == KVP_E_CALL && check_args(S, v, n, r, 8))
		return;
	const kvp_expr *a[8] = { NULL };
	for (int i = 0; i < 8 && v->kind == KVP_E_CALL; i++)
		a[i] = kvp_call_arg(v, n[i], i);
	if (a[7] && check_windows(S, a[7]))
		return;
	if (grace_tokens(S, a[0], "the target segment length", &tt) ||
	    grace_tokens(S, a[1], "the shortest segment", &ta) ||
	    grace_tokens(S, a[2], "the longest segment", &tb) ||
	    grace_number(S, a[3], "the cut cost", 0) || grace_number(S, a[4], "the length penalty", 0) ||
	    grace_number(S, a[5], "the stability weight", 0) ||
	    grace_number(S, a[6], "the surprisal weight", 0))
		return;
	/* the kernel's defaults where a length is left out: target 64, min target/4, max 2·target */
	double T = tt.known ? tt.v : a[0] ? -1 : 64;
	double lo = ta.known ? ta.v : a[1] ? -1 : T > 0 ? floor(T / 4) : -1;
	double hi = tb.known ? tb.v : a[2] ? -1 : T > 0 ? 2 * T : -1;
	if ((lo > 0 && T > 0 && lo > T) || (hi > 0 && T > 0 && hi < T) || (lo > 0 && hi > 0 && lo > hi)) {
		char b0[32], b1[32], b2[32];
		fmt_num(lo, b0, sizeof b0);
		fmt_num(T, b1, sizeof b1);
		fmt_num(hi, b2, sizeof b2);
		ERR(S, v->loc, "segment lengths must satisfy min <= target <= max; here min %s, target %s, max %s (tokens)",
		    lo > 0 ? b0 : "?", T > 0 ? b1 : "?", hi > 0 ? b2 : "?");
		return;
	}
	if (lo > 0 && hi > 0 && hi < 2 * lo - 1) {
		ERR(S, v->loc, "the longest segment must be at least 2·min - 1 tokens, or some context lengths cannot be cut into segments");
		return;
	}
	o->slot = a[0];
	o->seg_min = a[1];
	o->seg_max = a[2];
	o->seg_cut = a[3];
	o->seg_length = a[4];
	o->seg_stability = a[5];
	o->seg_surprisal = a[6];
	o->seg_windows = a[7];
}

/* tree = prototypes [ '(' [key = post] [, count = coherence | members] [, smooth = X] ')' ]
 * The merged entries of the prototype trees (kernels/k_proto.h): the key is the mean of the
 * post-RoPE keys; the count whose log the attention adds is n·coherence² (coherence) or
 * the member count n (members); the value is relevance-weighted, smoothed toward the
 * plain mean by smooth · mean relevance (default 0.1). */
static void check_tree(sema *S, const kvp_stmt *st)
{
	static const char *const choices[] = { "prototypes(...)" };
	static const char *const n[] = { "key", "count", "smooth" };
	static const int r[] = { 0, 0, 0 };
	const kvp_expr *v = st->value;
	const char *w = word_of(v);
	kvp_sema *o = S->out;
	if (!w || strcmp(w, "prototypes")) {
		bad_choice(S, v, "tree", choices, 1);
		return;
	}
	if (v->kind != KVP_E_CALL)
		return;
	if (check_args(S, v, n, r, 3))
		return;
	const kvp_expr *key = kvp_call_arg(v, "key", 0), *cnt = kvp_call_arg(v, "count", 1);
	if (key && (key->kind != KVP_E_NAME || strcmp(key->name, "post"))) {
		ERR(S, key->loc, "the prototype key is `post` (the mean of the post-RoPE keys); the paper's un-rotated mean needs the model's RoPE, which the prompt trace does not carry");
		return;
	}
	if (cnt && (cnt->kind != KVP_E_NAME ||
	            (strcmp(cnt->name, "coherence") && strcmp(cnt->name, "members")))) {
		ERR(S, cnt->loc, "the prototype count is `coherence` (n·coherence²) or `members` (n)");
		return;
	}
	const kvp_expr *sm = kvp_call_arg(v, "smooth", 2);
	if (grace_number(S, sm, "the value smoothing", 0))
		return;
	o->tree_count = cnt && !strcmp(cnt->name, "members");
	o->tree_smooth = sm;
}

/* keep singletons N [over all]: the singleton floor (kernels/k_single.h), N entries per head
 * (or a share of the context): each head its own N best, or with `over all` the N·L·G best
 * of every head together; only with action = add_split. */
static void check_singletons(sema *S, const kvp_stmt *st)
{
	kvp_sema *o = S->out;
	if (set_once(S, &o->singletons, st, "`keep singletons`"))
		return;
	if (!st->value) {
		ERR(S, st->words[0].loc, "`keep singletons` needs a number of entries per head, as in `keep singletons 16 entries`");
		o->singletons = NULL;
		return;
	}
	ty t = check_unit(S, st->value, CX_SCALAR, U_SIZE, 3, "the singleton floor");
	if (!rule_holds(S, st->value, t, KVP_RULE_NONNEG, "the singleton floor")) {
		ERR(S, st->value->loc, "the singleton floor must be >= 0");
		t.u = KVP_SU_ERR;
	}
	if (t.u == KVP_SU_ERR) {
		o->singletons = NULL;
		return;
	}
	o->floor_unit = t.u;
	o->act_floor = st->value;
	o->singletons_all = st->window == KVP_W_ALL;
}

static void check_action(sema *S, const kvp_stmt *st)
{
	static const char *const choices[] = { "evict", "merge", "add_split" };
	const kvp_expr *v = st->value;
	const char *w = word_of(v);
	kvp_sema *o = S->out;
	if (w && !strcmp(w, "evict") && v->kind == KVP_E_NAME) {
		o->action = K_ACT_EVICT;
		return;
	}
	if (w && !strcmp(w, "merge")) {
		static const char *const n[] = { "run" };
		static const int r[] = { 0 };
		if (v->kind == KVP_E_CALL && check_args(S, v, n, r, 1))
			return;
		const kvp_expr *run = kvp_call_arg(v, "run", 0);
		if (run) {
			ty t = check_unit(S, run, CX_SCALAR, U_TOKENS, 1, "the merge run");
			if (positive(S, run, t, "the merge run", 1))
				return;
		}
		o->action = K_ACT_MERGE;
		o->run = run;
		return;
	}
	if (w && !strcmp(w, "add_split")) {
		check_add_split(S, v);
		return;
	}
	bad_choice(S, v, "action", choices, 3);
}

/* The tier a tiers() argument names (its name, or the name of `TIER = SHARE`), or -1
 * after reporting an unknown one. */
static int tier_of(sema *S, const kvp_expr *a)
{
	const char *w = a->kind == KVP_E_ARG ? a->name : a->kind == KVP_E_NAME ? a->name : NULL;
	kvp_srcloc at = a->kind == KVP_E_ARG ? a->name_loc : a->loc;
	if (!w) {
		ERR(S, a->loc, "a tier is one of " TIER_LIST ", with its share of the kept entries or without (`q8 = 25%%`, `q4 = rest`)");
		return -1;
	}
	for (int t = 0; t < N_TIERS; t++)
		if (!strcmp(w, TIER_NAMES[t]) || (TIER_BITS_NAMES[t] && !strcmp(w, TIER_BITS_NAMES[t])))
			return t;
	/* a two-letter near miss (q3) is as near to q2 as to q4: no suggestion */
	int d = 1000;
	const char *s = strlen(w) > 2 ? suggest_from(w, TIER_WORDS, (int)(sizeof TIER_WORDS / sizeof *TIER_WORDS), NULL, &d) : NULL;
	if (s)
		ERR(S, at, "unknown tier '%s'; did you mean '%s'? (the tiers are " TIER_LIST ")", w, s);
	else
		ERR(S, at, "unknown tier '%s'; the tiers are " TIER_LIST, w);
	return -1;
}

/* One tier's share (a compile-time ratio in (0, 100%], or `rest` when last): its value into
 * *v (-1 for rest). 0 when fine. */
static int tier_share(sema *S, const kvp_expr *e, int last, double *v)
{
	if (e->kind == KVP_E_NAME && !strcmp(e->name, "rest")) {
		if (!last) {
			ERR(S, e->loc, "only the last tier takes `rest` (the entries the other shares leave)");
			return -1;
		}
		*v = -1;
		return 0;
	}
	ty t = check_unit(S, e, CX_SCALAR, U_RATIO, 1, "a tier's share");
	if (need_const(S, e, t, "a tier's share"))
		return -1;
	if (!(t.v > 0) || t.v > 1) {
		char b[32];
		fmt_num(t.v * 100, b, sizeof b);
		ERR(S, e->loc, "a tier's share of the kept entries is above 0%% and at most 100%%; got %s%%", b);
		return -1;
	}
	*v = t.v;
	return 0;
}

/* precision = tiers '(' TIER [ '=' SHARE ] { ',' TIER [ '=' SHARE ] } ')'
 * TIER = f16 | q8 | k8v4 | q4 | q2 (or k8v8, k4v4, k4v2), highest precision first; SHARE = a constant ratio, or `rest` for
 * the last. With shares the kept entries outside the guards take the tiers by score rank;
 * without, every entry is evicted or given a tier by utility per byte (docs/language.md
 * section 7.8, kernels/k_tier.h). */
/* `rotate = hadamard` (keys and values), `hadamard(keys)`, `hadamard(values)` or
 * `hadamard(keys, values)`: the rotation before quantisation (docs/language.md section
 * 7.8) into S->out->tier_rotate. 0 when fine. */
static int check_rotate(sema *S, const kvp_expr *a)
{
	const kvp_expr *v = a->a;
	const char *w = word_of(v);
	if (!w || strcmp(w, "hadamard")) {
		ERR(S, v->kind == KVP_E_CALL ? v->name_loc : v->loc,
		    "unknown rotation%s%s%s; the rotation is hadamard (`rotate = hadamard`, or `hadamard(keys)`, `hadamard(values)`)",
		    w ? " '" : "", w ? w : "", w ? "'" : "");
		return -1;
	}
	unsigned bits = v->kind == KVP_E_CALL ? 0u : 3u;
	for (int i = 0; v->kind == KVP_E_CALL && i < v->n_args; i++) {
		const kvp_expr *x = v->args[i];
		const unsigned b = x->kind == KVP_E_NAME && !strcmp(x->name, "keys")     ? 1u
		                   : x->kind == KVP_E_NAME && !strcmp(x->name, "values") ? 2u
		                                                                          : 0u;
		if (!b || (bits & b)) {
			ERR(S, x->loc, b ? "hadamard() names keys or values once" :
			    "hadamard() rotates keys, values or both: `hadamard(keys)`, `hadamard(values)`, `hadamard(keys, values)`");
			return -1;
		}
		bits |= b;
	}
	if (!bits) {
		ERR(S, v->loc, "hadamard() needs keys, values or both; `rotate = hadamard` rotates both");
		return -1;
	}
	S->out->tier_rotate = bits;
	return 0;
}

/* The options of tiers(...), after its tiers (docs/language.md section 7.8). */
static const char *const TIER_OPTIONS[] = { "rotate", "window", "edges", "edge_layers" };
enum { OPT_ROTATE, OPT_WINDOW, OPT_EDGES, OPT_EDGE_LAYERS, N_TIER_OPTIONS };

/* The option a tiers() argument sets (`NAME = ...` with an option's name), or -1. */
static int tier_option(const kvp_expr *a)
{
	for (int o = 0; a->kind == KVP_E_ARG && o < N_TIER_OPTIONS; o++)
		if (!strcmp(a->name, TIER_OPTIONS[o]))
			return o;
	return -1;
}

/* A compile-time whole number >= lo of unit acc (what names it in messages) into *v. */
static int tier_count(sema *S, const kvp_expr *e, const kvp_sunit *acc, double lo,
                      const char *what, double *v)
{
	ty t = check_unit(S, e, CX_SCALAR, acc, 1, what);
	if (need_const(S, e, t, what))
		return -1;
	if (t.v < lo || !is_int(t.v)) {
		char b[32];
		fmt_num(t.v, b, sizeof b);
		ERR(S, e->loc, "%s must be a whole number%s >= %g; got %s", what,
		    acc[0] == KVP_SU_TOKENS ? " of tokens" : "", lo, b);
		return -1;
	}
	*v = t.v;
	return 0;
}

/* The options after the na tiers of tiers(...) v: `rotate = ...` (check_rotate),
 * `window = W tokens` (the newest W entries stay at the top tier), `edges = TIER` and
 * `edge_layers = N` (the first N and the last N layers, default 1, store no entry below
 * TIER), each once; no tier after them. Into S->out. 0 when fine. */
static int check_tier_options(sema *S, const kvp_expr *v, int na)
{
	kvp_sema *o = S->out;
	const kvp_expr *seen[N_TIER_OPTIONS] = { 0 };
	for (int i = na; i < v->n_args; i++) {
		const kvp_expr *a = v->args[i];
		const int opt = tier_option(a);
		if (opt < 0) {
			const kvp_expr *prev = v->args[i - 1];
			ERR(S, prev->name_loc, "`%s = ...` comes after the tiers, last in tiers(...)", prev->name);
			return -1;
		}
		if (seen[opt]) {
			ERR(S, a->name_loc, "`%s` is given twice in tiers(...)", a->name);
			return -1;
		}
		seen[opt] = a;
	}
	if (seen[OPT_ROTATE] && check_rotate(S, seen[OPT_ROTATE]))
		return -1;
	if (seen[OPT_WINDOW] && tier_count(S, seen[OPT_WINDOW]->a, U_TOKENS, 1, "a tiers() window",
	                                   &o->tier_window))
		return -1;
	if (seen[OPT_EDGE_LAYERS] && !seen[OPT_EDGES]) {
		ERR(S, seen[OPT_EDGE_LAYERS]->name_loc,
		    "`edge_layers` needs `edges = TIER`, the tier the edge layers keep (as in `edges = q8, edge_layers = 2`)");
		return -1;
	}
	if (!seen[OPT_EDGES])
		return 0;
	const kvp_expr *e = seen[OPT_EDGES]->a;
	const int t = e->kind == KVP_E_NAME ? tier_of(S, e) : -1;
	if (e->kind != KVP_E_NAME) {
		ERR(S, e->loc, "`edges` takes a tier, as in `edges = q8`");
		return -1;
	}
	if (t < 0)
		return -1;
	const int last = tier_of(S, v->args[na - 1]);
	if (last >= 0 && t >= last) {
		ERR(S, e->loc, "`edges = %s` is no higher than the lowest tier listed (%s): the edge layers would keep what the others keep",
		    TIER_NAMES[t], TIER_NAMES[last]);
		return -1;
	}
	double n = 1;
	if (seen[OPT_EDGE_LAYERS] && tier_count(S, seen[OPT_EDGE_LAYERS]->a, U_NUM, 1,
	                                        "`edge_layers` (the first and the last layers)", &n))
		return -1;
	o->tier_edge = t;
	o->tier_edge_layers = (int)n;
	return 0;
}

static void check_precision(sema *S, const kvp_stmt *st)
{
	static const char *const choices[] = { "tiers(...)" };
	const kvp_expr *v = st->value;
	kvp_sema *o = S->out;
	if (!word_of(v) || strcmp(word_of(v), "tiers")) {
		static const char *const words[] = { "tiers" };
		int d = 1000;
		if (word_of(v) && suggest_from(word_of(v), words, 1, NULL, &d))
			ERR(S, v->kind == KVP_E_CALL ? v->name_loc : v->loc,
			    "unknown precision action '%s'; did you mean 'tiers'?", word_of(v));
		else
			bad_choice(S, v, "the precision action", choices, 1);
		return;
	}
	if (v->kind != KVP_E_CALL || v->n_args == 0) {
		ERR(S, v->loc, "tiers() needs the tiers, highest precision first, as in `tiers(f16 = 25%%, q8 = 25%%, q4 = rest)` or `tiers(f16, q8, q4, q2)`");
		return;
	}
	int na = v->n_args; /* the tiers: the arguments before the options */
	for (int i = 0; i < v->n_args; i++)
		if (tier_option(v->args[i]) >= 0) {
			na = i;
			break;
		}
	if (na == 0) {
		ERR(S, v->args[0]->name_loc, "tiers() needs the tiers before `%s = ...`, as in `tiers(q4 = rest, rotate = hadamard)`",
		    v->args[0]->name);
		return;
	}
	if (check_tier_options(S, v, na))
		return;
	if (na > N_TIERS) {
		ERR(S, v->args[N_TIERS]->loc, "too many tiers: there are five (" TIER_LIST ")");
		return;
	}
	int named = 0, shares = 0;
	double sum = 0, val[N_TIERS];
	for (int i = 0; i < na; i++) {
		const kvp_expr *a = v->args[i];
		int t = tier_of(S, a);
		if (t < 0)
			return;
		for (int j = 0; j < i; j++)
			if (o->tier[j] == t) {
				ERR(S, a->loc, "tier %s is given twice", TIER_NAMES[t]);
				return;
			}
		if (i > 0 && t < o->tier[i - 1]) {
			ERR(S, a->loc, "the tiers go from the highest precision down: %s cannot follow %s",
			    TIER_NAMES[t], TIER_NAMES[o->tier[i - 1]]);
			return;
		}
		o->tier[i] = t;
		named += a->kind == KVP_E_ARG;
		if (a->kind == KVP_E_ARG) {
			if (tier_share(S, a->a, i == na - 1, &val[i]))
				return;
			shares += val[i] > 0;
			sum += val[i] > 0 ? val[i] : 0;
		}
	}
	if (named && named != na) {
		ERR(S, v->loc, "give every tier a share (the kept entries by score rank) or none (chosen by utility per byte), not some");
		return;
	}
	char b[32];
	fmt_num(sum * 100, b, sizeof b);
	if (named && sum > 1 + 1e-9) {
		ERR(S, v->loc, "the tiers' shares add up to %s%%, more than the kept entries (100%%)", b);
		return;
	}
	if (named && shares == na && sum < 1 - 1e-9) {
		ERR(S, v->loc, "the tiers' shares add up to %s%%; end with `rest` (as in `q4 = rest`) or make them add up to 100%%",
		    b);
		return;
	}
	if (named && shares < na && sum >= 1 - 1e-9) {
		ERR(S, v->args[na - 1]->loc, "`rest` is empty: the shares before it add up to %s%%", b);
		return;
	}
	double cum = 0;
	for (int i = 0; named && i < na; i++) {
		cum += val[i] > 0 ? val[i] : 1 - sum;
		o->tier_cum[i] = i == na - 1 ? 1 : cum;
	}
	o->n_tier = na;
	o->tier_shares = named > 0;
}

static void check_positions(sema *S, const kvp_stmt *st)
{
	static const char *const choices[] = { "original", "compacted" };
	const kvp_expr *v = st->value;
	if (v->kind == KVP_E_NAME && !strcmp(v->name, "original"))
		S->out->compacted = 0;
	else if (v->kind == KVP_E_NAME && !strcmp(v->name, "compacted"))
		S->out->compacted = 1;
	else
		bad_choice(S, v, "position convention", choices, 2);
}

static void check_group(sema *S, const kvp_stmt *st)
{
	static const char *const reducers[] = { "mean", "max", "sum", "l2" };
	kvp_sema *o = S->out;
	const kvp_word *w = &st->words[0];
	if (!strcmp(w->s, "mean"))
		o->reduce = K_REDUCE_MEAN;
	else if (!strcmp(w->s, "max"))
		o->reduce = K_REDUCE_MAX;
	else if (!strcmp(w->s, "sum"))
		o->reduce = K_REDUCE_SUM;
	else if (!strcmp(w->s, "l2"))
		o->reduce = K_REDUCE_L2;
	else {
		int d = 1000;
		const char *s = suggest_from(w->s, reducers, 4, NULL, &d);
		if (s)
			ERR(S, w->loc, "unknown group reduction '%s'; did you mean '%s'?", w->s, s);
		else
			ERR(S, w->loc, "the group reduction must be mean, max, sum or l2");
		return;
	}
	int seen_over = 0, seen_pool = 0;
	for (int i = 1; i < st->n_words; i++) {
		const kvp_word *m = &st->words[i];
		if (m->tag == KVP_WORD_OVER) {
			if (strcmp(m->s, "layer") != 0) {
				ERR(S, m->loc, "a group reduction goes over the query heads of a KV head, or `over layer`; '%s' is not known",
				    m->s);
				return;
			}
			if (seen_over++) {
				ERR(S, m->loc, "`over layer` is given twice");
				return;
			}
			o->over_layer = 1;
		} else {
			if (strcmp(m->s, "before") != 0 && strcmp(m->s, "after") != 0) {
				ERR(S, m->loc, "write `before pool` (reduce, then pool) or `after pool` (pool each query head, then reduce)");
				return;
			}
			if (seen_pool++) {
				ERR(S, m->loc, "the order relative to pooling is given twice");
				return;
			}
			o->pool_before_reduce = !strcmp(m->s, "after");
			o->group_order_loc_set = 1;
			o->group_order_loc = m->loc;
		}
	}
}

/* `keep span NAME`: NAME must be a span the runtime marks (runtime/policy/rt_span.h), or
 * the guard protects nothing. 1 when it is; else 0 after a located error with the near
 * miss, or the list. */
static int span_known(sema *S, const kvp_expr *name)
{
	static const char *const spans[] = RT_SPAN_NAMES;
	for (int i = 0; i < RT_N_SPAN_NAMES; i++)
		if (!strcmp(spans[i], name->name))
			return 1;
	int d = 1000;
	const char *s = suggest_from(name->name, spans, RT_N_SPAN_NAMES, NULL, &d);
	if (s)
		ERR(S, name->loc, "unknown span '%s'; did you mean '%s'?", name->name, s);
	else {
		char list[128] = "";
		for (int i = 0; i < RT_N_SPAN_NAMES; i++)
			snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
			         i == 0 ? "" : i + 1 < RT_N_SPAN_NAMES ? ", " : " and ", spans[i]);
		ERR(S, name->loc, "unknown span '%s': the runtime marks %s", name->name, list);
	}
	return 0;
}

static void check_keep(sema *S, const kvp_stmt *st)
{
	static const char *const kinds[] = { "sinks", "recent", "span", "spans", "singletons" };
	kvp_sema *o = S->out;
	const kvp_word *w = &st->words[0];
	if (!strcmp(w->s, "singletons")) {
		check_singletons(S, st);
		return;
	}
	if (st->window == KVP_W_ALL) {
		ERR(S, st->window_loc, "`over all` applies only to `keep singletons N over all` (the floor chosen over every head)");
		return;
	}
	if (!strcmp(w->s, "sinks") || !strcmp(w->s, "recent")) {
		int sinks = w->s[0] == 's';
		if (set_once(S, sinks ? &o->sinks : &o->recent, st,
		             sinks ? "`keep sinks`" : "`keep recent`"))
			return;
		if (!st->value) {
			ERR(S, w->loc, "`keep %s` needs a number of tokens, as in `keep %s %d`", w->s,
			    w->s, sinks ? 4 : 32);
			if (sinks)
				o->sinks = NULL;
			else
				o->recent = NULL;
			return;
		}
		ty t = sinks ? check_unit(S, st->value, CX_SCALAR, U_TOKENS, 1, "the sink count")
		             : check_unit(S, st->value, CX_SCALAR, U_TOKENS_RATIO, 2,
		                          "the recent window");
		if (!rule_holds(S, st->value, t, KVP_RULE_POSITIVE,
		                sinks ? "the sink count" : "the recent window")) {
			ERR(S, st->value->loc, "`keep %s %s` keeps nothing; remove it or keep at least 1 token",
			    w->s, t.v == 0 ? "0" : "a negative count");
			t.u = KVP_SU_ERR;
		}
		if (t.u == KVP_SU_ERR) {
			if (sinks)
				o->sinks = NULL;
			else
				o->recent = NULL;
			return;
		}
		if (sinks) {
			o->sinks_unit = t.u;
			o->sinks_ty_known = t.known;
			o->sinks_v = t.v;
		} else {
			o->recent_unit = t.u;
			o->recent_ty_known = t.known;
			o->recent_v = t.v;
		}
		return;
	}
	if (!strcmp(w->s, "span")) {
		if (!st->value || st->value->kind != KVP_E_NAME) {
			ERR(S, st->value ? st->value->loc : w->loc,
			    "`keep span` names a protected span supplied with the request, as in `keep span system`");
			return;
		}
		if (!span_known(S, st->value))
			return;
		for (int i = 0; i < o->n_spans; i++) {
			if (!strcmp(o->spans[i]->value->name, st->value->name)) {
				ERR(S, st->value->loc, "span '%s' is already kept", st->value->name);
				NOTE(S, o->spans[i]->value->loc, "first kept here");
				return;
			}
		}
		const kvp_stmt **sp = realloc(o->spans, sizeof *sp * (size_t)(o->n_spans + 1));
		if (!sp)
			abort();
		o->spans = sp;
		o->spans[o->n_spans++] = st;
		return;
	}
	if (!strcmp(w->s, "spans")) {
		if (st->value) {
			ERR(S, st->value->loc, "`keep spans` keeps every protected span and takes no value; use `keep span NAME` for one");
			return;
		}
		set_once(S, &o->all_spans, st, "`keep spans`");
		return;
	}
	int d = 1000;
	const char *s = suggest_from(w->s, kinds, 5, NULL, &d);
	if (s)
		ERR(S, w->loc, "unknown guard '%s'; did you mean '%s'?", w->s, s);
	else
		ERR(S, w->loc, "a guard is `keep sinks N`, `keep recent N`, `keep span NAME`, `keep spans` or `keep singletons N`");
}

static void check_compress(sema *S, const kvp_stmt *st)
{
	kvp_sema *o = S->out;
	if (o->compress) {
		ERR(S, st->loc, "a policy has one trigger; `compress` is already given");
		NOTE(S, o->compress->loc, "first given here");
		return;
	}
	o->compress = st;
	int bad = 0;
	switch (st->trigger) {
	case KVP_T_EVERY_STEP:
		break;
	case KVP_T_EVERY: {
		ty t = check_unit(S, st->value, CX_SCALAR, U_STEPS, 1, "the trigger period");
		if (t.u == KVP_SU_ERR)
			bad = 1;
		else if (!rule_holds(S, st->value, t, KVP_RULE_PERIOD, "the trigger period")) {
			char b[32];
			fmt_num(t.v, b, sizeof b);
			ERR(S, st->value->loc, "`compress every %s steps` %s; the period must be a whole number >= 1",
			    b, t.v == 0 ? "never runs" : "is not a period");
			bad = 1;
		}
		break;
	}
	case KVP_T_WHEN: {
		const kvp_expr *c = st->value;
		if (c->kind != KVP_E_BINARY || c->op != KVP_ASTOP_GT || c->a->kind != KVP_E_ENTRIES) {
			ERR(S, c->loc, "a trigger condition is `entries > LIMIT` (compress when a head holds more than LIMIT entries)");
			bad = 1;
			break;
		}
		ty t = check_unit(S, c->b, CX_SCALAR, U_SIZE, 3, "the trigger limit");
		if (t.u == KVP_SU_ERR) {
			bad = 1;
			break;
		}
		if (positive(S, c->b, t, "the trigger limit", 0)) {
			bad = 1;
			break;
		}
		o->threshold = c->b;
		o->threshold_unit = t.u;
		o->threshold_known = t.known;
		o->threshold_v = t.v;
		break;
	}
	case KVP_T_AT:
		if (strcmp(st->words[0].s, "end") != 0) {
			ERR(S, st->words[0].loc, "the trigger is `compress at prompt end`");
			bad = 1;
		}
		break;
	case KVP_T_PER: {
		if (strcmp(st->words[0].s, "block") != 0) {
			ERR(S, st->words[0].loc, "the trigger is `compress per block N` (every N tokens, prompt and decoding) or `compress per prompt block N` (blocks of the prompt only)");
			bad = 1;
			break;
		}
		ty t = check_unit(S, st->value, CX_SCALAR, U_TOKENS, 1, "the block size");
		if (positive(S, st->value, t, "the block size", 1))
			bad = 1;
		break;
	}
	}
	if (st->target) {
		ty t = check_unit(S, st->target, CX_SCALAR, U_SIZE, 3, "the target");
		if (t.u == KVP_SU_ERR || positive(S, st->target, t, "the target", 0)) {
			bad = 1;
		} else {
			o->target_unit = t.u;
			o->target_known = t.known;
			o->target_v = t.v;
		}
	}
	if (bad)
		o->compress_bad = 1;
}

/* a human form of a folded size: "2048 entries", "20%" */
static void fmt_size(double v, kvp_sunit u, char *buf, size_t n)
{
	char b[32];
	fmt_num(u == KVP_SU_RATIO ? v * 100 : v, b, sizeof b);
	snprintf(buf, n, "%s%s", b, u == KVP_SU_RATIO ? "%" : u == KVP_SU_TOKENS ? " tokens" :
	                            u == KVP_SU_ENTRIES ? " entries" : "");
}

/* entries and tokens are compared directly (a kept token is one entry); ratios only
 * with ratios */
static int same_family(kvp_sunit a, kvp_sunit b)
{
	if (a == KVP_SU_RATIO || b == KVP_SU_RATIO)
		return a == b;
	return 1;
}

/* The budget and the guards through the runtime's own check (runtime/policy/rt_budget.h),
 * so kvpc check and the runtime refuse the same sizes with the same message. Guards in
 * another unit family than the budget (tokens against a share of the context) are known
 * only at run time, where the same check runs again. 1 when it reported an error. */
static int check_budget_guards(sema *S, const kvp_stmt *budget)
{
	kvp_sema *o = S->out;
	kvp_sunit Bu = o->budget_unit;
	struct rt_budget rb = {
		.scale = Bu == KVP_SU_RATIO ? RT_BUDGET_SHARE : RT_BUDGET_ENTRIES,
		.budget = S->budget.v, .budget_shared = Bu == KVP_SU_RATIO,
	};
	char msg[400];
	if (rt_budget_check(&rb, msg, sizeof msg) != 0) {
		ERR(S, budget->value->loc, "%s", msg);
		return 1;
	}
	rb.has_sinks = o->sinks && o->sinks_ty_known && same_family(o->sinks_unit, Bu);
	rb.sinks = o->sinks_v;
	rb.has_recent = o->recent && o->recent_ty_known && same_family(o->recent_unit, Bu);
	rb.recent = o->recent_v;
	if (rt_budget_check(&rb, msg, sizeof msg) != 0) {
		ERR(S, rb.has_recent ? o->recent->loc : o->sinks->loc, "%s", msg);
		NOTE(S, budget->value->loc, "the budget is set here");
		return 1;
	}
	return 0;
}

/* The score against the settings that need or refuse one. 1 when it reported an error. */
static int cross_check_score(sema *S)
{
	kvp_sema *o = S->out;
	const kvp_stmt *score = o->setting[KVP_SET_SCORE];
	const kvp_stmt *action = o->setting[KVP_SET_ACTION];
	const kvp_stmt *pool = o->setting[KVP_SET_POOL];
	double B = S->budget.v;
	int Bk = S->budget.known;
	kvp_sunit Bu = o->budget_unit;
	if (!score) {
		if (action && o->action != K_ACT_EVICT) {
			ERR(S, action->value->loc, "action %s chooses entries by score; the policy has no `score`",
			    o->action == K_ACT_MERGE ? "merge" : "add_split");
			return 1;
		}
		if (o->group) {
			ERR(S, o->group->loc, "the group reduction does not apply: the policy has no `score`");
			return 1;
		}
		if (pool) {
			ERR(S, pool->loc, "pooling smooths a score; the policy has no `score`");
			return 1;
		}
		/* without a score only the guards choose: they must fill the budget exactly */
		int fits = 0;
		if (Bk && (o->sinks || o->recent)) {
			double g = 0;
			int known = 1;
			if (o->sinks) {
				known &= o->sinks_ty_known && same_family(o->sinks_unit, Bu);
				g += o->sinks_v;
			}
			if (o->recent) {
				known &= o->recent_ty_known && same_family(o->recent_unit, Bu);
				g += o->recent_v;
			}
			fits = known && g == B;
		}
		if (!fits) {
			ERR(S, o->compress->loc,
			    "compress has no `score` to choose the entries outside the guards; add one (e.g. `score = pos` keeps the newest) or make sinks + recent equal the budget");
			return 1;
		}
	} else if (o->group && !o->score_per_qhead) {
		ERR(S, o->group->loc,
		    "the group reduction does not apply: the score does not depend on the query head (it reads no statistic of 'attn')");
		return 1;
	}
	return 0;
}

/* Settings that do not combine (docs/language.md section 9, combinations). */
/* A threshold budget keeps or evicts each entry by its own score, per head: it needs a
 * score, eviction, one selection per head and no tiers. 1 after an error. */
static int cross_check_threshold(sema *S)
{
	kvp_sema *o = S->out;
	const kvp_expr *at = o->setting[KVP_SET_BUDGET]->value;
	const char *why = !o->setting[KVP_SET_SCORE] ? "needs a `score` (the level is compared with it)"
	                  : o->action != K_ACT_EVICT ? "keeps or evicts each entry; it needs `action = evict`"
	                  : o->allocate != K_HEADS_EACH ? "keeps per head what passes the level; it needs `allocate = uniform`"
	                  : o->layers != K_LAYERS_UNIFORM ? "keeps in each layer what passes the level; it needs `layers = uniform`"
	                  : o->n_tier > 0 ? "keeps or evicts whole entries; precision tiers need a budget in entries or bytes"
	                  : NULL;
	if (!why)
		return 0;
	ERR(S, at->loc, "`budget = threshold(...)` %s", why);
	return 1;
}

static void cross_check_combinations(sema *S)
{
	kvp_sema *o = S->out;
	const kvp_stmt *action = o->setting[KVP_SET_ACTION];
	const kvp_stmt *pool = o->setting[KVP_SET_POOL];
	if (o->group_order_loc_set && !pool) {
		ERR(S, o->group_order_loc, "the order relative to pooling is given, but the policy has no `pool`");
		return;
	}
	if (o->budget_level && cross_check_threshold(S))
		return;
	if (o->over_layer && o->allocate != K_HEADS_EACH) {
		ERR(S, o->group->loc,
		    "unsupported combination: `over layer` shares one selection across the heads of a layer, which needs `allocate = uniform`");
		return;
	}
	if (o->action != K_ACT_SPLIT) {
		const kvp_stmt *g = o->setting[KVP_SET_SEGMENT] ? o->setting[KVP_SET_SEGMENT] :
		                    o->setting[KVP_SET_TREE] ? o->setting[KVP_SET_TREE] : o->singletons;
		if (g) {
			ERR(S, g->loc, "segments, prototype trees and singletons belong to `action = add_split` (GraceKV); the policy's action is %s",
			    o->action == K_ACT_MERGE ? "merge" : "evict");
			return;
		}
	}
	if (o->action == K_ACT_SPLIT && o->allocate != K_HEADS_GLOBAL) {
		ERR(S, action->value->loc, "add_split competes for one global budget; add `allocate = global`");
		return;
	}
	/* add_split runs the GraceKV core: one compression of the whole prompt */
	if (o->action == K_ACT_SPLIT && o->compress && o->compress->trigger != KVP_T_AT) {
		ERR(S, o->compress->loc,
		    "add_split (GraceKV) compresses the whole prompt once; use `compress at prompt end`");
		return;
	}
	if (o->action == K_ACT_SPLIT && o->compacted) {
		ERR(S, o->setting[KVP_SET_POSITIONS]->value->loc,
		    "add_split keeps each prototype at its members' mean original position; use `positions = original`");
		return;
	}
	if (o->action == K_ACT_SPLIT && o->group_order_loc_set && o->pool_before_reduce) {
		ERR(S, o->group_order_loc,
		    "with add_split the relevance is pooled after the group reduction; write `before pool` or leave the order out");
		return;
	}
	if (o->allocate == K_HEADS_GLOBAL && o->layers != K_LAYERS_UNIFORM) {
		ERR(S, o->setting[KVP_SET_LAYERS]->value->loc,
		    "a per-layer schedule has no effect with one global pool (`allocate = global`)");
		return;
	}
}

/* The precision action against the settings it needs or refuses. 1 when it reported an
 * error. */
static int cross_check_precision(sema *S)
{
	kvp_sema *o = S->out;
	const kvp_stmt *prec = o->setting[KVP_SET_PRECISION];
	if (!prec || o->n_tier == 0)
		return 0;
	if (o->action != K_ACT_EVICT) {
		ERR(S, o->setting[KVP_SET_ACTION]->value->loc,
		    "precision tiers combine with `action = evict`: the entries the budget cannot hold at any tier are evicted");
		return 1;
	}
	if (!o->setting[KVP_SET_SCORE] && (!o->tier_shares || o->n_tier > 1)) {
		ERR(S, prec->value->loc, o->tier_shares ?
		    "the tiers' shares rank the kept entries by score; the policy has no `score`" :
		    "tiers chosen by utility per byte need a `score`: an entry's utility is its score times the tier's fidelity");
		return 1;
	}
	if (!o->tier_shares && !o->budget_bytes) {
		ERR(S, prec->value->loc, "tiers without shares are chosen by utility per byte within a byte budget; write `budget = bytes(P)` or give every tier a share");
		NOTE(S, o->setting[KVP_SET_BUDGET]->value->loc, "the budget is set here");
		return 1;
	}
	if (!o->tier_shares && o->alloc_floor) {
		ERR(S, o->alloc_floor->loc, "the byte allocator has no floor: every entry of the pool competes by utility per byte; leave the floor out");
		return 1;
	}
	return 0;
}

static void cross_checks(sema *S)
{
	kvp_sema *o = S->out;
	const kvp_stmt *budget = o->setting[KVP_SET_BUDGET];

	/* expected_attention() scores the first `skip` positions 0 (they are outside its
	 * softmax, as kvpress removes its sinks): a sinks guard must keep them */
	if (S->ea_call && S->ea_skip.known && S->ea_skip.v > 0 &&
	    !(o->sinks && o->sinks_ty_known && o->sinks_v >= S->ea_skip.v)) {
		char b[32];
		fmt_num(S->ea_skip.v, b, sizeof b);
		ERR(S, S->ea_call->loc, "expected_attention() leaves the first %s positions out of its softmax (skip), so they score 0; keep them with `keep sinks %s`, or set skip = 0",
		    b, b);
		return;
	}
	/* the replay runs once, when the prompt ends (runtime/policy/rt_replay.h): its scores
	 * exist only for a compress at that moment, over keys at their original positions */
	if (S->replay_use && (!o->compress || o->compress->trigger != KVP_T_AT)) {
		ERR(S, S->replay_use->loc,
		    "replay_attn is measured by replaying the prompt once, at its end (KVzip); the policy must compress then: `compress at prompt end`");
		return;
	}
	if (S->replay_use && o->compacted) {
		ERR(S, o->setting[KVP_SET_POSITIONS]->value->loc,
		    "replay_attn scores entries by their original positions; use `positions = original`");
		return;
	}
	if (o->setting[KVP_SET_PRECISION] && !o->compress) {
		ERR(S, o->setting[KVP_SET_PRECISION]->loc,
		    "the precision action runs when the policy compresses; add a budget and a trigger (e.g. `budget = 100%%` and `compress every 32 steps`)");
		return;
	}

	if (o->compress && !budget) {
		ERR(S, o->compress->loc, "`compress` needs a budget; add `budget = N entries` or `budget = P%%`");
		return;
	}
	if (budget && !o->compress) {
		ERR(S, budget->loc, "the budget is never enforced: nothing triggers compression; add e.g. `compress when entries > budget`");
		return;
	}
	if (!S->have_budget || o->compress_bad)
		return;

	/* guards versus the budget (parameters at their defaults) */
	double B = S->budget.v;
	int Bk = S->budget.known;
	kvp_sunit Bu = o->budget_unit;
	char bs[48], xs[48], ys[48];
	fmt_size(B, Bu, bs, sizeof bs);
	if (o->recent && o->recent_ty_known && Bk && same_family(o->recent_unit, Bu) &&
	    o->recent_v >= B) {
		fmt_size(o->recent_v, o->recent_unit, xs, sizeof xs);
		ERR(S, o->recent->value->loc,
		    "the recent window (%s) is not smaller than the budget (%s): no entry would be chosen by score",
		    xs, bs);
		NOTE(S, budget->value->loc, "the budget is set here");
		return;
	}
	if (o->sinks && o->sinks_ty_known && Bk && same_family(o->sinks_unit, Bu) &&
	    o->sinks_v >= B) {
		fmt_size(o->sinks_v, o->sinks_unit, xs, sizeof xs);
		ERR(S, o->sinks->value->loc, "the sinks (%s) fill the whole budget (%s)", xs, bs);
		NOTE(S, budget->value->loc, "the budget is set here");
		return;
	}
	if (Bk && check_budget_guards(S, budget))
		return;
	if (o->compress->target && o->target_known && Bk && same_family(o->target_unit, Bu) &&
	    o->target_v > B) {
		fmt_size(o->target_v, o->target_unit, xs, sizeof xs);
		ERR(S, o->compress->target->loc, "the target (%s) is larger than the budget (%s)", xs,
		    bs);
		NOTE(S, budget->value->loc, "the budget is set here");
		return;
	}
	if (o->compress->target && o->threshold && o->target_known && o->threshold_known &&
	    same_family(o->target_unit, o->threshold_unit) && o->target_v >= o->threshold_v) {
		fmt_size(o->target_v, o->target_unit, xs, sizeof xs);
		fmt_size(o->threshold_v, o->threshold_unit, ys, sizeof ys);
		ERR(S, o->compress->target->loc,
		    "the target (%s) must be below the trigger limit (%s), or compress would remove nothing",
		    xs, ys);
		return;
	}

	if (cross_check_precision(S) || cross_check_score(S))
		return;
	cross_check_combinations(S);
}

/* `setting = X WORD Y` parses for every setting; only `budget = B min F` means something.
 * 1 when st is that form. */
static int floor_word_ok(sema *S, const kvp_stmt *st)
{
	static const char *const mins[] = { "min" };
	const kvp_word *w = &st->words[0];
	if (st->setting != KVP_SET_BUDGET) {
		ERR(S, w->loc, "unexpected '%s' after the %s; only the budget takes a floor (`budget = 20%% min 64 tokens`)",
		    w->s, kvp_setting_text(st->setting));
		return 0;
	}
	if (strcmp(w->s, "min") != 0) {
		int d = 1000;
		const char *sug = suggest_from(w->s, mins, 1, NULL, &d);
		ERR(S, w->loc, "unexpected '%s' after the budget; %s the budget's floor is written `budget = B min F`",
		    w->s, sug ? "did you mean 'min'?" : "a budget ends at its value;");
		return 0;
	}
	return 1;
}

/* A definition no expression names is a warning, not an error: a param that nothing reads
 * would still be listed, shown and accepted by --set while changing nothing (a budget
 * rewritten as bytes(P) leaves the share it used to read); a statistic outside the score
 * is computed at every step for nothing. */
static void warn_unused(sema *S)
{
	kvp_sym *sy = S->out->syms;
	/* a definition names only earlier ones, so one sweep from the last definition back
	 * carries "used" down every chain of definitions a statement names */
	for (int k = S->n_uses - 1; k >= 0; k--)
		if (sy[S->uses[k][0]].used)
			sy[S->uses[k][1]].used = 1;
	for (int i = 0; i < S->out->n_syms; i++) {
		const kvp_sym *y = &sy[i];
		if (y->used)
			continue;
		/* the unused definitions that name it: " (only 'a' names it, and it is unused)",
		 * or " (only unused definitions name it: 'a', 'b')" */
		char by[160] = "", list[120] = "";
		int users = 0;
		for (int k = 0; k < S->n_uses; k++) {
			int seen = S->uses[k][1] != i; /* not a user of i, or one listed already */
			for (int q = 0; !seen && q < k; q++)
				seen = S->uses[q][0] == S->uses[k][0] && S->uses[q][1] == i;
			if (!seen) {
				size_t o = strlen(list);
				snprintf(list + o, sizeof list - o, "%s'%.40s'", users ? ", " : "",
				         sy[S->uses[k][0]].name);
				users++;
			}
		}
		if (users == 1)
			snprintf(by, sizeof by, " (only %s names it, and it is unused)", list);
		else if (users > 1)
			snprintf(by, sizeof by, " (only unused definitions name it: %s)", list);
		if (y->kind == KVP_SYM_PARAM)
			kvp_src_warning(S->src, y->stmt->loc, "param '%s' is never used%s: it changes "
			                "nothing, and a --set of it would be accepted to no effect",
			                y->name, by);
		else if (y->kind == KVP_SYM_STAT)
			kvp_src_warning(S->src, y->stmt->loc, "statistic '%s' is never used%s: it would "
			                "be kept for every entry and step for nothing", y->name, by);
		else
			kvp_src_warning(S->src, y->stmt->loc, "const '%s' is never used%s", y->name, by);
	}
}

/* A used statistic over the prompt tail under a trigger other than `compress at prompt end`:
 * its observation window holds no query until the prompt's last W tokens arrive, so every
 * compression before them (a streaming policy's whole prefill, all of a ppl run that scores
 * the prompt) ranks entries on scores that are all 0, i.e. by position. Legal (a decode-time
 * compression after the prompt reads it), so a warning. Runs after warn_unused (its `used`). */
static void warn_prompt_tail(sema *S)
{
	const kvp_stmt *c = S->out->compress;
	if (!c || c->trigger == KVP_T_AT)
		return;
	for (int i = 0; i < S->out->n_syms; i++) {
		const kvp_sym *y = &S->out->syms[i];
		if (y->kind == KVP_SYM_STAT && y->used && y->stmt->window == KVP_W_PROMPT_TAIL)
			kvp_src_warning(S->src, y->stmt->loc, "statistic '%s' reads the prompt's last "
			                "queries (`over prompt tail`), which exist only once the prompt "
			                "ends, but this policy compresses before that (its trigger is not "
			                "`compress at prompt end`): those compressions read it as 0 for "
			                "every entry (a score of it alone keeps entries by position)",
			                y->name);
	}
}

kvp_sema *kvp_sema_check(const kvp_file *f)
{
	kvp_sema *o = calloc(1, sizeof *o);
	if (!o)
		abort();
	o->file = f;
	o->pool_before_reduce = 1;
	sema S;
	memset(&S, 0, sizeof S);
	S.out = o;
	S.src = f->src;

	if (f->name && strcmp(f->name, "full") == 0)
		ERR(&S, f->name_loc, "the policy name 'full' is reserved for the runtime's built-in full "
		    "cache (the reference every policy is compared with); choose another name");
	pass_definitions(&S, f);
	/* settings: each at most once; budget first so `budget` has a unit */
	for (int i = 0; i < f->n_stmts; i++) {
		const kvp_stmt *st = f->stmts[i];
		if (st->kind == KVP_S_SETTING) {
			char what[48];
			snprintf(what, sizeof what, "`%s`", kvp_setting_text(st->setting));
			if (st->target && !floor_word_ok(&S, st))
				continue;
			set_once(&S, &o->setting[st->setting], st, what);
		} else if (st->kind == KVP_S_GROUP) {
			set_once(&S, &o->group, st, "`group`");
		}
	}
	if (o->setting[KVP_SET_BUDGET])
		check_budget(&S, o->setting[KVP_SET_BUDGET]);
	for (int k = 0; k < KVP_SET_COUNT_; k++) {
		const kvp_stmt *st = o->setting[k];
		if (!st || k == KVP_SET_BUDGET)
			continue;
		switch ((kvp_setting)k) {
		case KVP_SET_SCORE: {
			ty t = check_expr(&S, st->value, CX_SCORE);
			if (t.u == KVP_SU_BOOL) {
				ERR(&S, st->value->loc, "the score must be a number, not a condition; use if(COND, A, B)");
				o->setting[k] = NULL;
			} else if (t.u == KVP_SU_ERR) {
				o->setting[k] = NULL;
			} else {
				o->score_per_qhead = t.per_qhead;
				if (t.known) /* numbers and parameters only: warned if all else is ok */
					S.const_score = st->value;
			}
			break;
		}
		case KVP_SET_LAYERS: check_layers(&S, st); break;
		case KVP_SET_ALLOCATE: check_allocate(&S, st); break;
		case KVP_SET_POOL: check_pool(&S, st); break;
		case KVP_SET_POSITIONS: check_positions(&S, st); break;
		case KVP_SET_ACTION: check_action(&S, st); break;
		case KVP_SET_SEGMENT: check_segment(&S, st); break;
		case KVP_SET_TREE: check_tree(&S, st); break;
		case KVP_SET_PRECISION: check_precision(&S, st); break;
		default: break;
		}
	}
	if (o->group)
		check_group(&S, o->group);
	for (int i = 0; i < f->n_stmts; i++) {
		const kvp_stmt *st = f->stmts[i];
		if (st->kind == KVP_S_KEEP)
			check_keep(&S, st);
		else if (st->kind == KVP_S_COMPRESS)
			check_compress(&S, st);
	}
	if (f->src->n_errors == 0)
		cross_checks(&S);
	if (f->src->n_errors == 0) {
		warn_unused(&S);
		warn_prompt_tail(&S);
	}
	if (f->src->n_errors == 0 && S.const_score)
		kvp_src_warning(S.src, S.const_score->loc, "the score is a constant: every entry "
		                "ties, so compress keeps them by position, not by any signal; score a "
		                "signal or a statistic (or leave `score` out where the policy allows "
		                "it)");
	free(S.uses);
	free(S.defs);
	return o;
}

void kvp_sema_free(kvp_sema *s)
{
	if (!s)
		return;
	free(s->syms);
	free(s->spans);
	free(s->head_w);
	free(s->lin_w);
	free(s->rules);
	free(s);
}

const char *kvp_file_summary(kvp_file *f)
{
	for (int i = 0; i < f->n_comments; i++) {
		const kvp_comment *c = &f->comments[i];
		if (!c->own_line || (f->name && c->loc.off > f->name_loc.off))
			break;
		const char *t = c->text + 1;
		while (*t == ' ' || *t == '\t')
			t++;
		if (*t)
			return kvp_arena_strndup(&f->arena, t, strlen(t));
	}
	return "";
}
