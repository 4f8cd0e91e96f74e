/*
 * kvp_ir: builders, folding, checking and layout of the policy IR (see kvp_ir.h). The
 * checker is the back end's safety net: the front end's sema reports user errors with
 * better wording first, so every problem found here is reported once with its location.
 */
#include "kvp_ir.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_util.h"

static char *dupstr(const char *s)
{
	size_t n = strlen(s ? s : "");
	char *d = RT_MALLOC(n + 1);
	memcpy(d, s ? s : "", n + 1);
	return d;
}

/* Grow *arr (element size sz) so that index n fits. */
static void grow(void **arr, int *cap, int n, size_t sz)
{
	if (n < *cap)
		return;
	int nc = *cap ? *cap * 2 : 16;
	while (nc <= n)
		nc *= 2;
	void *p = realloc(*arr, (size_t)nc * sz);
	RT_ASSERT(p != NULL);
	*arr = p;
	*cap = nc;
}

void kvp_ir_hash(const void *bytes, size_t n, char out[17])
{
	const unsigned char *p = bytes;
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	snprintf(out, 17, "%016llx", (unsigned long long)h);
}

void kvp_ir_init(struct kvp_ir *ir, const char *name, const char *source,
                 const char *source_hash, const char *summary)
{
	memset(ir, 0, sizeof *ir);
	ir->name = dupstr(name);
	ir->source = dupstr(source);
	ir->source_hash = dupstr(source_hash ? source_hash : "0000000000000000");
	ir->summary = dupstr(summary);
	ir->statements = dupstr("");
	ir->score.expr = -1;
	ir->score.kernel = -1;
	ir->score.reduce = K_REDUCE_MEAN;
	ir->score.pool = K_POOL_NONE;
	ir->guards.sinks = -1;
	ir->guards.recent = -1;
	ir->alloc.budget = -1;
	ir->alloc.level = -1;
	ir->alloc.budget_unit = KVP_UNIT_ENTRIES;
	ir->alloc.beta = -1;
	ir->alloc.from = -1;
	ir->alloc.to = -1;
	ir->alloc.floor = -1;
	ir->alloc.min = -1;
	ir->action.run = -1;
	ir->action.floor = -1;
	ir->action.seg_min = ir->action.seg_max = ir->action.seg_cut = ir->action.seg_length = -1;
	ir->action.seg_stability = ir->action.seg_surprisal = -1;
	ir->action.smooth = ir->action.mass = ir->action.numerator = -1;
	ir->trigger.kind = KVP_TRIG_NEVER;
	ir->trigger.n = -1;
	ir->trigger.threshold = -1;
	ir->trigger.target = -1;
	ir->positions = KVP_POS_ORIGINAL;
}

void kvp_ir_free(struct kvp_ir *ir)
{
	for (int i = 0; i < ir->n_params; i++) {
		free(ir->params[i].name);
		free(ir->params[i].doc);
	}
	for (int i = 0; i < ir->n_consts; i++)
		free(ir->consts[i].name);
	for (int i = 0; i < ir->n_stats; i++)
		free(ir->stats[i].name);
	for (int i = 0; i < ir->guards.n_spans; i++)
		free(ir->guards.spans[i]);
	free(ir->guards.spans);
	free(ir->alloc.list);
	free(ir->head_w);
	free(ir->lin_w);
	free(ir->lin_file);
	for (int i = 0; i < ir->n_rules; i++)
		free(ir->rules[i].what);
	free(ir->rules);
	free(ir->params);
	free(ir->consts);
	free(ir->stats);
	free(ir->nodes);
	free(ir->name);
	free(ir->source);
	free(ir->source_hash);
	free(ir->summary);
	free(ir->statements);
	memset(ir, 0, sizeof *ir);
}

int kvp_ir_add_param(struct kvp_ir *ir, struct kvp_loc loc, const char *name, double def,
                     enum kvp_unit unit, const char *doc)
{
	grow((void **)&ir->params, &ir->cap_params, ir->n_params, sizeof *ir->params);
	struct kvp_ir_param *p = &ir->params[ir->n_params];
	p->name = dupstr(name);
	p->def = def;
	p->unit = unit;
	p->doc = dupstr(doc);
	p->loc = loc;
	return ir->n_params++;
}

int kvp_ir_add_rule(struct kvp_ir *ir, struct kvp_loc loc, int32_t e, enum kvp_rule rule,
                    const char *what, int live)
{
	grow((void **)&ir->rules, &ir->cap_rules, ir->n_rules, sizeof *ir->rules);
	ir->rules[ir->n_rules] = (struct kvp_ir_rule){ e, rule, dupstr(what), loc, live };
	return ir->n_rules++;
}

int kvp_ir_add_const(struct kvp_ir *ir, struct kvp_loc loc, const char *name, double value)
{
	grow((void **)&ir->consts, &ir->cap_consts, ir->n_consts, sizeof *ir->consts);
	struct kvp_ir_const *c = &ir->consts[ir->n_consts];
	c->name = dupstr(name);
	c->value = value;
	c->loc = loc;
	return ir->n_consts++;
}

int kvp_ir_add_stat(struct kvp_ir *ir, struct kvp_loc loc, const char *name,
                    enum kvp_ir_stat_kind kind, int32_t arg, int32_t alpha,
                    enum kvp_ir_history hist, int32_t window)
{
	grow((void **)&ir->stats, &ir->cap_stats, ir->n_stats, sizeof *ir->stats);
	struct kvp_ir_stat *s = &ir->stats[ir->n_stats];
	memset(s, 0, sizeof *s);
	s->name = dupstr(name);
	s->loc = loc;
	s->kind = kind;
	s->arg = arg;
	s->alpha = alpha;
	s->hist = hist;
	s->window = window;
	return ir->n_stats++;
}

static int32_t add_node(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_op op)
{
	grow((void **)&ir->nodes, &ir->cap_nodes, ir->n_nodes, sizeof *ir->nodes);
	struct kvp_ir_expr *e = &ir->nodes[ir->n_nodes];
	memset(e, 0, sizeof *e);
	e->op = op;
	e->loc = loc;
	e->a = e->b = e->c = -1;
	e->index = -1;
	return ir->n_nodes++;
}

int32_t kvp_ir_num(struct kvp_ir *ir, struct kvp_loc loc, double v)
{
	int32_t i = add_node(ir, loc, KVP_OP_NUM);
	ir->nodes[i].num = v;
	return i;
}

/* a node of op (KVP_OP_PARAM or KVP_OP_STAT) that refers to entry index of its table */
static int32_t add_ref(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_op op, int index)
{
	int32_t i = add_node(ir, loc, op);
	ir->nodes[i].index = index;
	return i;
}

int32_t kvp_ir_param_ref(struct kvp_ir *ir, struct kvp_loc loc, int param)
{
	return add_ref(ir, loc, KVP_OP_PARAM, param);
}

int32_t kvp_ir_stat_ref(struct kvp_ir *ir, struct kvp_loc loc, int stat)
{
	return add_ref(ir, loc, KVP_OP_STAT, stat);
}

int32_t kvp_ir_signal(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_signal sig)
{
	int32_t i = add_node(ir, loc, KVP_OP_SIGNAL);
	ir->nodes[i].sig = sig;
	return i;
}

int32_t kvp_ir_unary(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_op op, int32_t a)
{
	int32_t i = add_node(ir, loc, op);
	ir->nodes[i].a = a;
	return i;
}

int32_t kvp_ir_binary(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_op op, int32_t a,
                      int32_t b)
{
	int32_t i = add_node(ir, loc, op);
	ir->nodes[i].a = a;
	ir->nodes[i].b = b;
	return i;
}

int32_t kvp_ir_select(struct kvp_ir *ir, struct kvp_loc loc, int32_t c, int32_t a, int32_t b)
{
	int32_t i = add_node(ir, loc, KVP_OP_SELECT);
	ir->nodes[i].a = c;
	ir->nodes[i].b = a;
	ir->nodes[i].c = b;
	return i;
}

int32_t kvp_ir_caote(struct kvp_ir *ir, struct kvp_loc loc, enum kvp_ir_caote_mode mode,
                     int32_t a)
{
	int32_t i = kvp_ir_unary(ir, loc, KVP_OP_CAOTE, a);
	ir->nodes[i].mode = mode;
	return i;
}

int32_t kvp_ir_normalize(struct kvp_ir *ir, struct kvp_loc loc, int32_t a)
{
	return kvp_ir_unary(ir, loc, KVP_OP_NORMALIZE, a);
}

int32_t kvp_ir_expattn(struct kvp_ir *ir, struct kvp_loc loc, int32_t future, int32_t skip)
{
	return kvp_ir_binary(ir, loc, KVP_OP_EXPATTN, future, skip);
}

int32_t kvp_ir_headw(struct kvp_ir *ir, struct kvp_loc loc)
{
	return add_node(ir, loc, KVP_OP_HEADW);
}

void kvp_ir_set_heads(struct kvp_ir *ir, const double *w, int layers, int kv_heads)
{
	free(ir->head_w);
	ir->head_w = RT_MALLOC((size_t)layers * (size_t)kv_heads * sizeof(double));
	memcpy(ir->head_w, w, (size_t)layers * (size_t)kv_heads * sizeof(double));
	ir->head_layers = layers;
	ir->head_kv = kv_heads;
}

int32_t kvp_ir_linear(struct kvp_ir *ir, struct kvp_loc loc)
{
	return add_node(ir, loc, KVP_OP_LINEAR);
}

void kvp_ir_set_linear(struct kvp_ir *ir, const float *w, int layers, int kv_heads, int embd,
                       const char *file)
{
	const size_t n = (size_t)layers * (size_t)kv_heads * (size_t)(embd + 1);
	free(ir->lin_w);
	free(ir->lin_file);
	ir->lin_w = RT_MALLOC(n * sizeof(float));
	memcpy(ir->lin_w, w, n * sizeof(float));
	ir->lin_file = dupstr(file);
	ir->lin_layers = layers;
	ir->lin_kv = kv_heads;
	ir->lin_embd = embd;
}

void kvp_ir_add_span(struct kvp_ir *ir, const char *name)
{
	int n = ir->guards.n_spans;
	char **p = realloc(ir->guards.spans, (size_t)(n + 1) * sizeof *p);
	RT_ASSERT(p != NULL);
	p[n] = dupstr(name);
	ir->guards.spans = p;
	ir->guards.n_spans = n + 1;
}

void kvp_ir_set_list(struct kvp_ir *ir, const double *v, int n)
{
	free(ir->alloc.list);
	ir->alloc.list = NULL;
	ir->alloc.n_list = 0;
	if (n <= 0)
		return;
	ir->alloc.list = RT_MALLOC((size_t)n * sizeof(double));
	memcpy(ir->alloc.list, v, (size_t)n * sizeof(double));
	ir->alloc.n_list = n;
}

/* ---- names --------------------------------------------------------------------------- */

const char *kvp_ir_op_name(enum kvp_ir_op op)
{
	static const char *const names[KVP_OP_COUNT_] = {
		[KVP_OP_NUM] = "number", [KVP_OP_PARAM] = "param", [KVP_OP_STAT] = "stat",
		[KVP_OP_SIGNAL] = "signal", [KVP_OP_NEG] = "-", [KVP_OP_NOT] = "not",
		[KVP_OP_LOG] = "log", [KVP_OP_EXP] = "exp", [KVP_OP_ABS] = "abs",
		[KVP_OP_SQRT] = "sqrt", [KVP_OP_ADD] = "+", [KVP_OP_SUB] = "-", [KVP_OP_MUL] = "*",
		[KVP_OP_DIV] = "/", [KVP_OP_MIN] = "min", [KVP_OP_MAX] = "max", [KVP_OP_POW] = "pow",
		[KVP_OP_LT] = "<", [KVP_OP_LE] = "<=", [KVP_OP_GT] = ">", [KVP_OP_GE] = ">=",
		[KVP_OP_EQ] = "==", [KVP_OP_NE] = "!=", [KVP_OP_AND] = "and", [KVP_OP_OR] = "or",
		[KVP_OP_SELECT] = "if", [KVP_OP_CAOTE] = "caote", [KVP_OP_NORMALIZE] = "normalize",
		[KVP_OP_EXPATTN] = "expected_attention", [KVP_OP_HEADW] = "head_score",
		[KVP_OP_LINEAR] = "linear_score",
	};
	return (unsigned)op < KVP_OP_COUNT_ && names[op] ? names[op] : "?";
}

/* The columns of kvp_builtin.def's signal rows the IR reads, indexed by the signal. */
static const struct {
	const char *name;
	unsigned where;     /* KVP_IN_* */
	int per_qhead;
	unsigned needs;     /* KVP_NEED_* */
} SIGNALS[KVP_SIG_COUNT_] = {
#define KVP_SIGNAL(ID, name, unit, where, per_qhead, needs, lang) \
	[KVP_SIG_##ID] = { name, where, per_qhead, needs },
#include "kvp_builtin.def"
};

const char *kvp_ir_signal_name(enum kvp_ir_signal s)
{
	return (unsigned)s < KVP_SIG_COUNT_ ? SIGNALS[s].name : "?";
}

const char *kvp_ir_stat_kind_name(enum kvp_ir_stat_kind k)
{
	static const char *const names[KVP_STAT_KIND_COUNT_] = {
#define KVP_AGGREGATE(ID, name) [KVP_STAT_##ID] = name,
#include "kvp_builtin.def"
	};
	return (unsigned)k < KVP_STAT_KIND_COUNT_ ? names[k] : "?";
}

/* ---- analysis -------------------------------------------------------------------------- */

static int node_ok(const struct kvp_ir *ir, int32_t e)
{
	return e >= 0 && e < ir->n_nodes;
}

/* Operand count of an op. */
static int arity(enum kvp_ir_op op)
{
	switch (op) {
	case KVP_OP_NUM: case KVP_OP_PARAM: case KVP_OP_STAT: case KVP_OP_SIGNAL:
	case KVP_OP_HEADW: case KVP_OP_LINEAR:
		return 0;
	case KVP_OP_NEG: case KVP_OP_NOT: case KVP_OP_LOG: case KVP_OP_EXP: case KVP_OP_ABS:
	case KVP_OP_SQRT: case KVP_OP_CAOTE: case KVP_OP_NORMALIZE:
		return 1;
	case KVP_OP_SELECT:
		return 3;
	default:
		return 2;
	}
}

/* Operands are always created before their parent, so a well-formed tree has strictly
 * smaller operand indices: recursion depth is bounded and cycles are impossible. */
static int operands_ok(const struct kvp_ir *ir, int32_t e)
{
	const struct kvp_ir_expr *x = &ir->nodes[e];
	int n = arity(x->op);
	int32_t ops[3] = { x->a, x->b, x->c };
	for (int i = 0; i < n; i++)
		if (ops[i] < 0 || ops[i] >= e)
			return 0;
	return 1;
}

int kvp_ir_expr_per_qhead(const struct kvp_ir *ir, int32_t e)
{
	if (!node_ok(ir, e))
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if (x->op == KVP_OP_SIGNAL)
		return (unsigned)x->sig < KVP_SIG_COUNT_ && SIGNALS[x->sig].per_qhead;
	if (x->op == KVP_OP_STAT)
		return x->index >= 0 && x->index < ir->n_stats &&
		       kvp_ir_expr_per_qhead(ir, ir->stats[x->index].arg);
	if ((x->op == KVP_OP_CAOTE && x->mode == KVP_CAOTE_EXACT) || x->op == KVP_OP_EXPATTN)
		return 1;
	int n = arity(x->op);
	int32_t ops[3] = { x->a, x->b, x->c };
	for (int i = 0; i < n; i++)
		if (ops[i] < e && kvp_ir_expr_per_qhead(ir, ops[i]))
			return 1;
	return 0;
}

/* Where the policy may use the signal; a scalar one can be evaluated anywhere. */
static int signal_allowed(enum kvp_ir_signal s, enum kvp_ir_ctx c)
{
	unsigned w = SIGNALS[s].where;
	return ((w & KVP_IN_SCALAR) || (w & (1u << c))) != 0;
}

int kvp_ir_expr_allowed(const struct kvp_ir *ir, int32_t e, enum kvp_ir_ctx c)
{
	if (!node_ok(ir, e) || !operands_ok(ir, e))
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	switch (x->op) {
	case KVP_OP_NUM:
		return isfinite(x->num);
	case KVP_OP_PARAM:
		return x->index >= 0 && x->index < ir->n_params;
	case KVP_OP_STAT:
		return c == KVP_CTX_SCORE && x->index >= 0 && x->index < ir->n_stats;
	case KVP_OP_SIGNAL:
		return (unsigned)x->sig < KVP_SIG_COUNT_ && signal_allowed(x->sig, c);
	case KVP_OP_CAOTE: case KVP_OP_NORMALIZE:
		if (c != KVP_CTX_SCORE)
			return 0;
		break;
	case KVP_OP_HEADW:
		return c == KVP_CTX_SCORE && ir->head_w && ir->head_layers > 0 && ir->head_kv > 0;
	case KVP_OP_LINEAR:
		return c == KVP_CTX_SCORE && ir->lin_w && ir->lin_layers > 0 && ir->lin_kv > 0 &&
		       ir->lin_embd > 0;
	case KVP_OP_EXPATTN: /* its operands are scalars (future, skip) */
		return c == KVP_CTX_SCORE && kvp_ir_expr_allowed(ir, x->a, KVP_CTX_SCALAR) &&
		       kvp_ir_expr_allowed(ir, x->b, KVP_CTX_SCALAR);
	default:
		if ((unsigned)x->op >= KVP_OP_COUNT_)
			return 0;
		break;
	}
	int n = arity(x->op);
	int32_t ops[3] = { x->a, x->b, x->c };
	for (int i = 0; i < n; i++)
		if (!kvp_ir_expr_allowed(ir, ops[i], c))
			return 0;
	return 1;
}

int kvp_ir_same_tree(const struct kvp_ir *ir, int32_t a, int32_t b)
{
	if (a == b)
		return 1;
	if (a < 0 || b < 0)
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[a], *y = &ir->nodes[b];
	if (x->op != y->op)
		return 0;
	switch (x->op) {
	case KVP_OP_NUM: return x->num == y->num;
	case KVP_OP_PARAM: case KVP_OP_STAT: return x->index == y->index;
	case KVP_OP_SIGNAL: return x->sig == y->sig;
	case KVP_OP_CAOTE: if (x->mode != y->mode) return 0; break;
	default: break;
	}
	return kvp_ir_same_tree(ir, x->a, y->a) && kvp_ir_same_tree(ir, x->b, y->b) &&
	       kvp_ir_same_tree(ir, x->c, y->c);
}

int kvp_ir_fold_op(enum kvp_ir_op op, double a, double b, double c, double *out)
{
	double r;
	switch (op) {
	case KVP_OP_NEG: r = -a; break;
	case KVP_OP_NOT: r = a == 0; break;
	case KVP_OP_LOG: r = log(a); break;
	case KVP_OP_EXP: r = exp(a); break;
	case KVP_OP_ABS: r = fabs(a); break;
	case KVP_OP_SQRT: r = sqrt(a); break;
	case KVP_OP_ADD: r = a + b; break;
	case KVP_OP_SUB: r = a - b; break;
	case KVP_OP_MUL: r = a * b; break;
	case KVP_OP_DIV: r = a / b; break;
	case KVP_OP_MIN: r = a < b ? a : b; break;
	case KVP_OP_MAX: r = a > b ? a : b; break;
	case KVP_OP_POW: r = pow(a, b); break;
	case KVP_OP_LT: r = a < b; break;
	case KVP_OP_LE: r = a <= b; break;
	case KVP_OP_GT: r = a > b; break;
	case KVP_OP_GE: r = a >= b; break;
	case KVP_OP_EQ: r = a == b; break;
	case KVP_OP_NE: r = a != b; break;
	case KVP_OP_AND: r = a != 0 && b != 0; break;
	case KVP_OP_OR: r = a != 0 || b != 0; break;
	case KVP_OP_SELECT: r = a != 0 ? b : c; break;
	default: return 0;
	}
	*out = r;
	return 1;
}

int kvp_ir_fold(const struct kvp_ir *ir, int32_t e, double *out)
{
	if (!node_ok(ir, e) || !operands_ok(ir, e))
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	double a = 0, b = 0, c = 0;
	int n = arity(x->op);
	if (x->op == KVP_OP_NUM) {
		*out = x->num;
		return 1;
	}
	if (n == 0 || x->op == KVP_OP_CAOTE || x->op == KVP_OP_NORMALIZE || x->op == KVP_OP_EXPATTN)
		return 0;
	if (!kvp_ir_fold(ir, x->a, &a) || (n > 1 && !kvp_ir_fold(ir, x->b, &b)) ||
	    (n > 2 && !kvp_ir_fold(ir, x->c, &c)))
		return 0;
	return kvp_ir_fold_op(x->op, a, b, c, out);
}

void kvp_ir_layout(struct kvp_ir *ir)
{
	uint32_t we = 0, wq = 0;
	unsigned needs = 0;
	ir->uses_obs_count = 0;
	for (int i = 0; i < ir->n_stats; i++)
		if (ir->stats[i].kind == KVP_STAT_MEAN)
			ir->uses_obs_count = 1;
	/* the visible-step counter comes first in the shared block */
	if (ir->uses_obs_count)
		ir->obs_count_word = (int32_t)we++;
	else
		ir->obs_count_word = -1;
	for (int i = 0; i < ir->n_stats; i++) {
		struct kvp_ir_stat *s = &ir->stats[i];
		s->per_qhead = kvp_ir_expr_per_qhead(ir, s->arg);
		s->ring = 0;
		if (s->hist == KVP_HIST_LAST_STEPS) {
			double w = 0;
			if (kvp_ir_fold(ir, s->window, &w) && w >= 1 && w <= 1 << 20)
				s->ring = (int32_t)w;
		}
		int32_t nw;
		if (s->hist != KVP_HIST_LAST_STEPS)
			nw = 1;
		else if (s->kind == KVP_STAT_COUNT)
			nw = (s->ring + 31) / 32; /* one bit per step */
		else if (s->kind == KVP_STAT_LAST || s->kind == KVP_STAT_EMA)
			nw = 1; /* last/ema ignore the window: the latest step is inside it */
		else
			nw = s->ring; /* one float per step */
		if (nw < 1)
			nw = 1;
		s->n_words = nw;
		if (s->per_qhead) {
			s->word = (int32_t)wq;
			wq += (uint32_t)nw;
		} else {
			s->word = (int32_t)we;
			we += (uint32_t)nw;
		}
		if (s->per_qhead)
			needs |= KVP_NEED_ATTN;
		if (s->hist == KVP_HIST_PROMPT_TAIL)
			needs |= KVP_NEED_PROMPT_LEN;
	}
	/* linear_score() is computed once, when the entry is appended: a shared word */
	ir->lin_word = -1;
	for (int32_t e = 0; e < ir->n_nodes; e++)
		if (ir->nodes[e].op == KVP_OP_LINEAR && ir->lin_word < 0) {
			ir->lin_word = (int32_t)we++;
			needs |= KVP_NEED_HIDDEN;
		}
	ir->stat_words_entry = we;
	ir->stat_words_qhead = wq;
	/* key/value reads */
	for (int32_t e = 0; e < ir->n_nodes; e++) {
		const struct kvp_ir_expr *x = &ir->nodes[e];
		if (x->op == KVP_OP_SIGNAL && (unsigned)x->sig < KVP_SIG_COUNT_)
			needs |= SIGNALS[x->sig].needs;
		if (x->op == KVP_OP_CAOTE)
			needs |= KVP_NEED_VALUES;
		if (x->op == KVP_OP_CAOTE && x->mode == KVP_CAOTE_EXACT)
			needs |= KVP_NEED_OUT;
		if (x->op == KVP_OP_EXPATTN)
			needs |= KVP_NEED_QUERY | KVP_NEED_KEYS;
	}
	/* the exact CAOTE's true attention outputs: one row per query head of the group;
	 * then Expected Attention's query counts, means and co-moments (k_expattn.h) */
	const uint32_t ea = (needs & KVP_NEED_QUERY) ? KVP_IR_EA_ROWS : 0u;
	ir->state_words = ea;
	ir->state_words_dim = ((needs & KVP_NEED_OUT) ? KVP_IR_OUT_ROWS : 0u) + ea;
	ir->state_words_dim2 = ea;
	if (ir->action.kind != K_ACT_EVICT)
		needs |= KVP_NEED_KEYS | KVP_NEED_VALUES;
	if (ir->guards.protect_all_spans || ir->guards.n_spans > 0)
		needs |= KVP_NEED_SPANS;
	if (ir->trigger.kind == KVP_TRIG_PROMPT_END || ir->trigger.kind == KVP_TRIG_PREFILL_BLOCK)
		needs |= KVP_NEED_PROMPT_LEN;
	/* add_split runs the GraceKV core: segments and probes come from the prompt trace,
	 * the question span from the span ids */
	if (kvp_ir_grace_core(ir))
		needs |= KVP_NEED_TRACE | KVP_NEED_PROMPT_LEN | KVP_NEED_SPANS | KVP_NEED_F32_KV;
	if (ir->tiers.n > 0)
		needs |= KVP_NEED_TIERS;
	ir->needs = needs;
}

int kvp_ir_grace_core(const struct kvp_ir *ir)
{
	return ir->action.kind == K_ACT_SPLIT && ir->alloc.heads == K_HEADS_GLOBAL &&
	       ir->trigger.kind == KVP_TRIG_PROMPT_END && ir->positions == KVP_POS_ORIGINAL &&
	       !ir->score.over_layer;
}

/* ---- checking ---------------------------------------------------------------------------- */

struct checker {
	struct kvp_ir *ir;
	kvp_ir_diag_fn diag;
	void *user;
	int n;
};

static void problem(struct checker *ck, struct kvp_loc loc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void problem(struct checker *ck, struct kvp_loc loc, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	ck->n++;
	if (ck->diag)
		ck->diag(ck->user, loc, msg);
}

static const char *ctx_name(enum kvp_ir_ctx c)
{
	return c == KVP_CTX_SCALAR ? "a scalar (budget, guard, trigger)" :
	       c == KVP_CTX_OBSERVE ? "a statistic's argument" : "the score";
}

/* 1 if expression e (a well-formed tree) uses signal sig. */
static int uses_sig(const struct kvp_ir *ir, int32_t e, enum kvp_ir_signal sig)
{
	if (!node_ok(ir, e) || !operands_ok(ir, e))
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if (x->op == KVP_OP_SIGNAL)
		return x->sig == sig;
	int n = arity(x->op);
	int32_t ops[3] = { x->a, x->b, x->c };
	for (int i = 0; i < n; i++)
		if (uses_sig(ir, ops[i], sig))
			return 1;
	return 0;
}

/* The node (in e's subtree) that makes e not allowed in c, or -1 when the fault is
 * structural (an operand or index out of range). */
static int32_t first_bad(const struct kvp_ir *ir, int32_t e, enum kvp_ir_ctx c)
{
	if (!node_ok(ir, e) || !operands_ok(ir, e))
		return -1;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	int n = arity(x->op);
	int32_t ops[3] = { x->a, x->b, x->c };
	const enum kvp_ir_ctx oc = x->op == KVP_OP_EXPATTN ? KVP_CTX_SCALAR : c;
	for (int i = 0; i < n; i++)
		if (!kvp_ir_expr_allowed(ir, ops[i], oc))
			return first_bad(ir, ops[i], oc);
	return kvp_ir_expr_allowed(ir, e, c) ? -1 : e;
}

/* Check an optional (-1 allowed when !required) expression for context c. */
static void check_expr(struct checker *ck, int32_t e, enum kvp_ir_ctx c, int required,
                       struct kvp_loc where, const char *what)
{
	if (e < 0) {
		if (required)
			problem(ck, where, "%s is missing", what);
		return;
	}
	if (!node_ok(ck->ir, e)) {
		problem(ck, where, "%s refers to expression %d out of range", what, (int)e);
		return;
	}
	if (!kvp_ir_expr_allowed(ck->ir, e, c)) {
		int32_t bad = first_bad(ck->ir, e, c);
		const struct kvp_ir_expr *x = &ck->ir->nodes[bad >= 0 ? bad : e];
		if (bad >= 0 && x->op == KVP_OP_SIGNAL)
			problem(ck, x->loc, "%s: '%s' cannot be used in %s", what,
			        kvp_ir_signal_name(x->sig), ctx_name(c));
		else if (bad >= 0 && (x->op == KVP_OP_STAT || x->op == KVP_OP_CAOTE ||
		                      x->op == KVP_OP_NORMALIZE || x->op == KVP_OP_EXPATTN ||
		                      x->op == KVP_OP_HEADW || x->op == KVP_OP_LINEAR))
			problem(ck, x->loc, "%s: %s cannot be used in %s", what,
			        x->op == KVP_OP_STAT ? "a statistic" : kvp_ir_op_name(x->op), ctx_name(c));
		else
			problem(ck, x->loc, "%s is malformed (bad operand or reference)", what);
	}
}

/* A required compile-time integer in [lo, hi]. */
static void check_const(struct checker *ck, int32_t e, double lo, double hi,
                        struct kvp_loc where, const char *what)
{
	double v;
	if (!kvp_ir_fold(ck->ir, e, &v)) {
		problem(ck, node_ok(ck->ir, e) ? ck->ir->nodes[e].loc : where,
		        "%s must be a constant number", what);
		return;
	}
	if (!(v >= lo && v <= hi) || v != floor(v))
		problem(ck, ck->ir->nodes[e].loc, "%s must be a whole number in %.17g..%.17g, not %.17g",
		        what, lo, hi, v);
}

/* The precision action: tiers in range, highest precision first, cumulative shares up to
 * 1; only with eviction, a trigger, and (by utility) a score and a byte budget. */
static void check_tiers(struct checker *ck, const struct kvp_ir *ir)
{
	const struct kvp_ir_tiers *t = &ir->tiers;
	if (t->rotate > 3u || (t->rotate && t->n == 0))
		problem(ck, t->loc, "a rotation rotates keys (1), values (2) or both (3) of precision tiers");
	if ((t->window != 0 || t->edge_layers != 0) && t->n == 0)
		problem(ck, t->loc, "a tiers() window or edge layers need precision tiers");
	if (t->n == 0 && t->kind == K_TIERS_NONE)
		return;
	if (!(t->window >= 0) || t->window != floor(t->window) || t->edge_layers < 0)
		problem(ck, t->loc, "a tiers() window and edge layers are whole numbers >= 0");
	if (t->edge_layers > 0 && (t->edge < 0 || t->edge >= t->tier[t->n - 1]))
		problem(ck, t->loc, "the edge layers' tier is above the lowest tier listed");
	if (t->n < 1 || t->n > KVP_IR_MAX_TIERS) {
		problem(ck, t->loc, "1 to %d precision tiers", KVP_IR_MAX_TIERS);
		return;
	}
	if (t->kind != K_TIERS_SHARES && t->kind != K_TIERS_UTILITY) {
		problem(ck, t->loc, "precision tiers go by shares or by utility");
		return;
	}
	for (int j = 0; j < t->n; j++) {
		if (t->tier[j] < 0 || t->tier[j] >= KVP_IR_MAX_TIERS || (j > 0 && t->tier[j] <= t->tier[j - 1]))
			problem(ck, t->loc, "the precision tiers must be distinct and go from the highest precision down");
		if (t->kind == K_TIERS_SHARES && (!(t->cum[j] > (j > 0 ? t->cum[j - 1] : 0)) || t->cum[j] > 1))
			problem(ck, t->loc, "the tiers' cumulative shares must grow and stay within 1");
	}
	if (t->kind == K_TIERS_SHARES && t->cum[t->n - 1] != 1)
		problem(ck, t->loc, "the tiers' shares must cover every kept entry");
	if (ir->action.kind != K_ACT_EVICT)
		problem(ck, t->loc, "precision tiers combine with eviction only");
	if (ir->trigger.kind == KVP_TRIG_NEVER)
		problem(ck, t->loc, "a precision action needs a compress trigger");
	if (t->kind == K_TIERS_UTILITY && (ir->score.expr < 0 || !ir->alloc.budget_bytes))
		problem(ck, t->loc, "tiers chosen by utility per byte need a score and a byte budget");
}

int kvp_ir_check(struct kvp_ir *ir, kvp_ir_diag_fn diag, void *user)
{
	struct checker ck = { ir, diag, user, 0 };
	for (int i = 0; i < ir->n_params; i++)
		if (!isfinite(ir->params[i].def) || (unsigned)ir->params[i].unit >= KVP_UNIT_COUNT_)
			problem(&ck, ir->params[i].loc, "param '%s' needs a finite default and a unit",
			        ir->params[i].name);
	for (int i = 0; i < ir->n_stats; i++) {
		struct kvp_ir_stat *s = &ir->stats[i];
		if ((unsigned)s->kind >= KVP_STAT_KIND_COUNT_) {
			problem(&ck, s->loc, "stat '%s' has an unknown kind", s->name);
			continue;
		}
		check_expr(&ck, s->arg, KVP_CTX_OBSERVE, 1, s->loc, "the statistic's argument");
		if (s->kind == KVP_STAT_EMA)
			check_expr(&ck, s->alpha, KVP_CTX_SCALAR, 1, s->loc, "the EMA rate");
		if (s->hist == KVP_HIST_LAST_STEPS) {
			/* sum/mean keep one float per step and entry (and query head): cap the
			 * ring so a statistic cannot outweigh the keys and values many times */
			int float_ring = s->kind == KVP_STAT_SUM || s->kind == KVP_STAT_MEAN;
			check_const(&ck, s->window, 1, float_ring ? KVP_IR_MAX_FLOAT_RING : 1 << 20,
			            s->loc, float_ring ? "a sum/mean history window (steps; count() keeps 1 bit per step and allows longer windows)" :
			                                 "a history window (steps)");
		}
		else if (s->hist == KVP_HIST_PROMPT_TAIL)
			check_expr(&ck, s->window, KVP_CTX_SCALAR, 1, s->loc, "the observation window");
		else if (s->hist != KVP_HIST_WHOLE)
			problem(&ck, s->loc, "stat '%s' has an unknown history", s->name);
	}
	for (int i = 0; i < ir->n_rules; i++) {
		const struct kvp_ir_rule *r = &ir->rules[i];
		check_expr(&ck, r->expr, KVP_CTX_SCALAR, 1, r->loc, "a value rule's setting");
		if ((unsigned)r->rule >= KVP_RULE_COUNT_)
			problem(&ck, r->loc, "unknown value rule");
	}
	struct kvp_ir_score *sc = &ir->score;
	check_expr(&ck, sc->expr, KVP_CTX_SCORE, 0, sc->loc, "the score");
	if (sc->reduce == K_REDUCE_NONE && sc->expr >= 0 && kvp_ir_expr_per_qhead(ir, sc->expr))
		problem(&ck, sc->loc, "the score depends on the query head (attention); choose a group reduction mean, max, sum or l2");
	if ((unsigned)sc->reduce >= K_REDUCE_COUNT_)
		problem(&ck, sc->loc, "unknown group reduction");
	if (sc->pool != K_POOL_NONE)
		check_const(&ck, sc->kernel, 1, 1 << 16, sc->loc, "the pooling kernel (entries)");
	double k;
	if (sc->pool != K_POOL_NONE && kvp_ir_fold(ir, sc->kernel, &k) && fmod(k, 2) != 1)
		problem(&ck, ir->nodes[sc->kernel].loc, "the pooling kernel must be odd, not %.17g", k);
	check_expr(&ck, ir->guards.sinks, KVP_CTX_SCALAR, 0, ir->guards.loc, "the sink guard");
	check_expr(&ck, ir->guards.recent, KVP_CTX_SCALAR, 0, ir->guards.loc, "the recent guard");
	struct kvp_ir_alloc *al = &ir->alloc;
	int needs_budget = ir->trigger.kind != KVP_TRIG_NEVER;
	check_expr(&ck, al->budget, KVP_CTX_SCALAR, needs_budget, al->loc, "the budget");
	if (al->budget >= 0 && node_ok(ir, al->budget) && uses_sig(ir, al->budget, KVP_SIG_BUDGET))
		problem(&ck, al->loc, "the budget cannot be defined in terms of itself");
	for (int32_t e = 0; e < ir->n_nodes; e++)
		if (al->budget < 0 && ir->nodes[e].op == KVP_OP_SIGNAL && ir->nodes[e].sig == KVP_SIG_BUDGET) {
			problem(&ck, ir->nodes[e].loc, "'budget' is used but the policy sets no budget");
			break;
		}
	if (al->threshold) {
		check_expr(&ck, al->level, KVP_CTX_SCALAR, 1, al->loc, "the threshold level");
		if (sc->expr < 0 || ir->action.kind != K_ACT_EVICT || al->heads != K_HEADS_EACH ||
		    al->layers != K_LAYERS_UNIFORM || ir->tiers.n > 0 || al->budget_bytes || al->min >= 0)
			problem(&ck, al->loc, "a threshold budget needs a score, eviction, uniform "
			        "allocation and layers, no tiers, no byte budget and no floor");
	}
	if (al->layers == K_LAYERS_PYRAMID || al->layers == K_LAYERS_FUNNEL)
		check_expr(&ck, al->beta, KVP_CTX_SCALAR, 0, al->loc, "the pyramid beta");
	if (al->layers == K_LAYERS_LINEAR) {
		check_expr(&ck, al->from, KVP_CTX_SCALAR, 1, al->loc, "the first layer's multiplier");
		check_expr(&ck, al->to, KVP_CTX_SCALAR, 1, al->loc, "the last layer's multiplier");
	}
	if (al->layers == K_LAYERS_LIST) {
		if (al->n_list < 1)
			problem(&ck, al->loc, "a layer list needs at least one multiplier");
		for (int i = 0; i < al->n_list; i++)
			if (!isfinite(al->list[i]) || al->list[i] < 0)
				problem(&ck, al->loc, "layer multiplier %d must be a finite number >= 0", i);
	}
	if ((unsigned)al->layers >= K_LAYERS_COUNT_ || (unsigned)al->heads >= K_HEADS_COUNT_)
		problem(&ck, al->loc, "unknown allocation");
	check_expr(&ck, al->floor, KVP_CTX_SCALAR, 0, al->loc, "the allocation floor");
	check_expr(&ck, al->min, KVP_CTX_SCALAR, 0, al->loc, "the budget's floor");
	if (sc->over_layer && al->heads != K_HEADS_EACH)
		problem(&ck, sc->loc, "a layer-wide score reduction needs every KV head of a layer to keep the same entries; it cannot be combined with adaptive or global allocation");
	if (sc->over_layer && ir->action.kind != K_ACT_EVICT)
		problem(&ck, sc->loc, "a layer-wide score reduction cannot be combined with merging");
	if ((unsigned)ir->action.kind >= K_ACT_COUNT_)
		problem(&ck, ir->action.loc, "unknown action");
	check_expr(&ck, ir->action.run, KVP_CTX_SCALAR, 0, ir->action.loc, "the prototype size");
	check_expr(&ck, ir->action.floor, KVP_CTX_SCALAR, 0, ir->action.loc, "the singleton floor");
	const struct kvp_ir_act *ac = &ir->action;
	const int32_t seg[] = { ac->seg_min, ac->seg_max, ac->seg_cut, ac->seg_length,
		                ac->seg_stability, ac->seg_surprisal };
	for (size_t i = 0; i < sizeof seg / sizeof seg[0]; i++)
		check_expr(&ck, seg[i], KVP_CTX_SCALAR, 0, ac->seg_loc, "a segmentation value");
	if (ac->n_win < 0 || ac->n_win > 4)
		problem(&ck, ac->seg_loc, "1 to 4 curvature windows");
	for (int i = 0; i < ac->n_win && i < 4; i++)
		if (ac->win[i] < 1)
			problem(&ck, ac->seg_loc, "a curvature window below 1 token");
	check_expr(&ck, ac->smooth, KVP_CTX_SCALAR, 0, ac->tree_loc, "the prototype smoothing");
	check_expr(&ck, ac->mass, KVP_CTX_SCALAR, 0, ac->loc, "the mass weight");
	check_expr(&ck, ac->numerator, KVP_CTX_SCALAR, 0, ac->loc, "the numerator weight");
	struct kvp_ir_trig *tr = &ir->trigger;
	if ((unsigned)tr->kind > KVP_TRIG_PREFILL_BLOCK)
		problem(&ck, tr->loc, "unknown trigger");
	if (tr->kind == KVP_TRIG_EVERY_N || tr->kind == KVP_TRIG_PREFILL_BLOCK)
		check_expr(&ck, tr->n, KVP_CTX_SCALAR, 1, tr->loc, "the trigger period");
	check_expr(&ck, tr->threshold, KVP_CTX_SCALAR, 0, tr->loc, "the trigger threshold");
	check_expr(&ck, tr->target, KVP_CTX_SCALAR, 0, tr->loc, "the compression target");
	if (ir->positions != KVP_POS_ORIGINAL && ir->positions != KVP_POS_COMPACTED)
		problem(&ck, ir->loc, "unknown position convention");
	check_tiers(&ck, ir);
	if (ck.n == 0)
		kvp_ir_layout(ir);
	ir->checked = ck.n == 0;
	return ck.n;
}
