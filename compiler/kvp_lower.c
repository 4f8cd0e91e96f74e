/*
 * kvp_lower: turns a checked .kvp policy (kvp_sema) into the typed IR of kvp_ir.h, the
 * contract with the back ends. Lowering makes the language's conveniences explicit:
 *   - a ratio in a size slot (budget, recent window, target, trigger limit, singleton
 *     floor) becomes `ratio * context` entries/tokens (KVP_SIG_CONTEXT);
 *   - `budget` used as a value becomes the budget's own expression, in entries;
 *   - consts are folded to numbers, parameters stay runtime references;
 *   - flow(q) becomes normalize(q) (direct relevance, GraceKV's first hop);
 *   - defaults that the IR leaves to the language are made explicit: the group
 *     reduction is mean for a score that depends on the query head and none otherwise;
 *     add_split's slot is 64 tokens (GraceKV's target slot length), and its pooling
 *     comes after the group reduction (the core's relevance is per KV head).
 * It never reports a user error that kvp_sema could have reported; kvp_ir_check is the
 * back end's own safety net afterwards.
 */
#include "kvp_ir.h"
#include "kvp_sema.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct lower {
	kvp_sema *s;
	struct kvp_ir *ir;
	int in_budget; /* lowering the budget's expression */
} lower;

static struct kvp_loc L(kvp_srcloc l)
{
	struct kvp_loc o = { l.line, l.col };
	return o;
}

/* Where a part of the IR points: the statement that gave it, else the policy's name (a
 * default). */
static struct kvp_loc at_stmt(const lower *lw, const kvp_stmt *st)
{
	return L(st ? st->loc : lw->s->file->name_loc);
}


static int32_t lower_expr(lower *lw, const kvp_expr *e);

static int32_t lower_budget(lower *lw, kvp_srcloc at);

/* An optional value: its expression, or -1 for none (the kernel's default). */
static int32_t lower_opt(lower *lw, const kvp_expr *e)
{
	return e ? lower_expr(lw, e) : -1;
}

/* e in entries/tokens: a ratio is multiplied by the context */
static int32_t lower_size(lower *lw, const kvp_expr *e, kvp_sunit u)
{
	int32_t v = lower_expr(lw, e);
	if (u != KVP_SU_RATIO || v < 0)
		return v;
	int32_t c = kvp_ir_signal(lw->ir, L(e->loc), KVP_SIG_CONTEXT);
	return kvp_ir_binary(lw->ir, L(e->loc), KVP_OP_MUL, v, c);
}

static int32_t lower_budget(lower *lw, kvp_srcloc at)
{
	const kvp_stmt *b = lw->s->setting[KVP_SET_BUDGET];
	if (!b || lw->in_budget) {
		/* sema rejects both; never recurse */
		kvp_src_error(lw->s->file->src, at, "'budget' has no value here");
		return -1;
	}
	if (lw->s->budget_level) /* the whole context: only the level evicts */
		return kvp_ir_signal(lw->ir, L(b->loc), KVP_SIG_CONTEXT);
	lw->in_budget = 1;
	const kvp_expr *e = lw->s->budget_bytes ? lw->s->budget_share : b->value;
	int32_t v = lower_size(lw, e, lw->s->budget_unit);
	lw->in_budget = 0;
	return v;
}

static int32_t lower_call(lower *lw, const kvp_expr *e)
{
	struct kvp_ir *ir = lw->ir;
	const char *f = e->name;
	struct kvp_loc at = L(e->loc);
	if (!strcmp(f, "min") || !strcmp(f, "max") || !strcmp(f, "pow")) {
		int32_t a = lower_expr(lw, kvp_call_arg(e, "a", 0));
		int32_t b = lower_expr(lw, kvp_call_arg(e, "b", 1));
		return kvp_ir_binary(ir, at, kvp_sema_ir_op(e), a, b);
	}
	if (!strcmp(f, "abs") || !strcmp(f, "log") || !strcmp(f, "exp") || !strcmp(f, "sqrt")) {
		int32_t a = lower_expr(lw, kvp_call_arg(e, "x", 0));
		return kvp_ir_unary(ir, at, kvp_sema_ir_op(e), a);
	}
	if (!strcmp(f, "if")) {
		int32_t c = lower_expr(lw, kvp_call_arg(e, "cond", 0));
		int32_t a = lower_expr(lw, kvp_call_arg(e, "then", 1));
		int32_t b = lower_expr(lw, kvp_call_arg(e, "else", 2));
		return kvp_ir_select(ir, at, c, a, b);
	}
	if (!strcmp(f, "caote")) {
		int32_t a = lower_expr(lw, kvp_call_arg(e, "score", 0));
		const kvp_expr *m = kvp_call_arg(e, "mode", 1);
		enum kvp_ir_caote_mode mode =
			m && !strcmp(m->name, "fast") ? KVP_CAOTE_FAST : KVP_CAOTE_EXACT;
		return kvp_ir_caote(ir, at, mode, a);
	}
	if (!strcmp(f, "expected_attention")) {
		const kvp_expr *ef = kvp_call_arg(e, "future", 0), *es = kvp_call_arg(e, "skip", 1);
		int32_t a = ef ? lower_expr(lw, ef) : kvp_ir_num(ir, at, 512);
		int32_t b = es ? lower_expr(lw, es) : kvp_ir_num(ir, at, 4);
		return kvp_ir_expattn(ir, at, a, b);
	}
	if (!strcmp(f, "head_score")) {
		kvp_ir_set_heads(ir, lw->s->head_w, lw->s->head_layers, lw->s->head_kv);
		return kvp_ir_headw(ir, at);
	}
	if (!strcmp(f, "linear_score")) {
		kvp_ir_set_linear(ir, lw->s->lin_w, lw->s->lin_layers, lw->s->lin_kv, lw->s->lin_embd,
		                  kvp_call_arg(e, "file", 0)->name);
		return kvp_ir_linear(ir, at);
	}
	if (!strcmp(f, "normalize") || !strcmp(f, "flow")) {
		const kvp_expr *x = kvp_call_arg(e, !strcmp(f, "flow") ? "relevance" : "score", 0);
		return kvp_ir_normalize(ir, at, lower_expr(lw, x));
	}
	return -1;
}

static int32_t lower_expr(lower *lw, const kvp_expr *e)
{
	struct kvp_ir *ir = lw->ir;
	struct kvp_loc at = L(e->loc);
	switch (e->kind) {
	case KVP_E_NUM:
		return kvp_ir_num(ir, at, e->num);
	case KVP_E_NAME: {
		const kvp_sym *y = kvp_sema_lookup(lw->s, e->name);
		if (y) {
			switch (y->kind) {
			case KVP_SYM_PARAM: return kvp_ir_param_ref(ir, at, y->ir_index);
			case KVP_SYM_CONST: return kvp_ir_num(ir, at, y->value);
			case KVP_SYM_STAT: return kvp_ir_stat_ref(ir, at, y->ir_index);
			}
		}
		/* sema admitted only the language's signals (kvp_builtin.def) */
		for (int s = 0; s < KVP_SIG_COUNT_; s++)
			if (!strcmp(kvp_ir_signal_name((enum kvp_ir_signal)s), e->name))
				return kvp_ir_signal(ir, at, (enum kvp_ir_signal)s);
		return -1;
	}
	case KVP_E_CALL:
		return lower_call(lw, e);
	case KVP_E_UNARY:
		return kvp_ir_unary(ir, at, kvp_sema_ir_op(e), lower_expr(lw, e->a));
	case KVP_E_BINARY:
		return kvp_ir_binary(ir, at, kvp_sema_ir_op(e), lower_expr(lw, e->a),
		                     lower_expr(lw, e->b));
	case KVP_E_BUDGET:
		return lower_budget(lw, e->loc);
	case KVP_E_ENTRIES:
		return kvp_ir_signal(ir, at, KVP_SIG_ENTRIES);
	default:
		return -1;
	}
}

static enum kvp_unit abi_unit(kvp_sunit u)
{
	switch (u) {
	case KVP_SU_RATIO: return KVP_UNIT_RATIO;
	case KVP_SU_ENTRIES: return KVP_UNIT_ENTRIES;
	case KVP_SU_TOKENS: return KVP_UNIT_TOKENS;
	case KVP_SU_STEPS: return KVP_UNIT_STEPS;
	default: return KVP_UNIT_SCALAR;
	}
}

/* the comment at the end of a statement's line, without '#' and blanks ("" if none):
 * the same comment kvpc fmt keeps at the end of that statement's line (it must come
 * before the next statement, so `a = 1; b = 2  # doc` documents b only) */
static const char *trailing_doc(const kvp_file *f, const kvp_stmt *st)
{
	uint32_t next = UINT32_MAX;
	for (int i = 0; i < f->n_stmts; i++)
		if (f->stmts[i]->loc.off > st->loc.off && f->stmts[i]->loc.off < next)
			next = f->stmts[i]->loc.off;
	int line, col;
	kvp_src_pos(f->src, st->loc.end, &line, &col);
	for (int i = 0; i < f->n_comments; i++) {
		const kvp_comment *c = &f->comments[i];
		if (!c->own_line && c->loc.line == line && c->loc.off >= st->loc.end &&
		    c->loc.off < next) {
			const char *t = c->text + 1;
			while (*t == ' ' || *t == '\t')
				t++;
			return t;
		}
	}
	return "";
}

/* The definitions in order (each uses only the ones above it). */
static void lower_defs(lower *lw)
{
	kvp_sema *s = lw->s;
	struct kvp_ir *ir = lw->ir;
	const kvp_file *f = s->file;
	for (int i = 0; i < s->n_syms; i++) {
		kvp_sym *y = &s->syms[i];
		const kvp_stmt *st = y->stmt;
		switch (y->kind) {
		case KVP_SYM_PARAM:
			y->ir_index = kvp_ir_add_param(ir, L(st->name_loc), y->name, y->value,
			                               abi_unit(y->unit), trailing_doc(f, st));
			break;
		case KVP_SYM_CONST:
			y->ir_index = kvp_ir_add_const(ir, L(st->name_loc), y->name, y->value);
			break;
		case KVP_SYM_STAT: {
			int32_t arg = lower_expr(lw, y->arg);
			int32_t alpha = y->alpha ? lower_expr(lw, y->alpha) : -1;
			enum kvp_ir_history h = KVP_HIST_WHOLE;
			int32_t win = -1;
			if (st->window == KVP_W_LAST) {
				h = KVP_HIST_LAST_STEPS;
				win = lower_expr(lw, st->window_len);
			} else if (st->window == KVP_W_PROMPT_TAIL) {
				h = KVP_HIST_PROMPT_TAIL;
				win = lower_expr(lw, st->window_len);
			}
			y->ir_index = kvp_ir_add_stat(ir, L(st->name_loc), y->name, y->agg,
			                              arg, alpha, h, win);
			break;
		}
		}
	}

}

/* The score pipeline and the guards. */
static void lower_score_guards(lower *lw)
{
	kvp_sema *s = lw->s;
	struct kvp_ir *ir = lw->ir;
	/* score pipeline */
	const kvp_stmt *score = s->setting[KVP_SET_SCORE];
	ir->score.expr = score ? lower_expr(lw, score->value) : -1;
	ir->score.loc = at_stmt(lw, score);
	ir->score.reduce = s->score_per_qhead ? s->reduce : K_REDUCE_NONE;
	ir->score.over_layer = s->over_layer;
	ir->score.pool = s->pool;
	ir->score.kernel = s->kernel ? lower_expr(lw, s->kernel) : 0;
	/* add_split (the GraceKV core) pools the group-reduced relevance */
	ir->score.pool_before_reduce = s->action == K_ACT_SPLIT ? 0 : s->pool_before_reduce;

	/* guards */
	ir->guards.sinks = s->sinks ? lower_size(lw, s->sinks->value, s->sinks_unit) : -1;
	ir->guards.recent = s->recent ? lower_size(lw, s->recent->value, s->recent_unit) : -1;
	ir->guards.protect_all_spans = s->all_spans != NULL;
	for (int i = 0; i < s->n_spans; i++)
		kvp_ir_add_span(ir, s->spans[i]->value->name);
	const kvp_stmt *g0 = s->sinks ? s->sinks : s->recent ? s->recent :
	                     s->all_spans ? s->all_spans : s->n_spans ? s->spans[0] : NULL;
	ir->guards.loc = at_stmt(lw, g0);

}

/* The budget, the layer schedule and the allocation across heads. -1 after an error. */
static int lower_alloc(lower *lw)
{
	kvp_sema *s = lw->s;
	struct kvp_ir *ir = lw->ir;
	/* budget and allocation */
	const kvp_stmt *budget = s->setting[KVP_SET_BUDGET];
	ir->alloc.budget = budget ? lower_budget(lw, budget->loc) : -1;
	ir->alloc.budget_unit = s->budget_unit == KVP_SU_RATIO ? KVP_UNIT_RATIO : KVP_UNIT_ENTRIES;
	ir->alloc.budget_bytes = s->budget_bytes;
	ir->alloc.min = lower_opt(lw, s->budget_min);
	ir->alloc.threshold = s->budget_level != NULL;
	ir->alloc.level = s->budget_level ? lower_expr(lw, s->budget_level) : -1;
	ir->alloc.loc = at_stmt(lw, budget);
	ir->alloc.layers = s->layers;
	ir->alloc.beta = lower_opt(lw, s->beta);
	ir->alloc.from = lower_opt(lw, s->lin_from);
	ir->alloc.to = lower_opt(lw, s->lin_to);
	if (s->layers == K_LAYERS_LIST) {
		int n = s->list->n_args;
		double v[1024];
		for (int i = 0; i < n; i++) {
			int32_t node = lower_expr(lw, s->list->args[i]);
			if (!kvp_ir_fold(ir, node, &v[i])) {
				kvp_src_error(s->file->src, s->list->args[i]->loc,
				              "a layer multiplier must be a constant");
				return -1;
			}
		}
		kvp_ir_set_list(ir, v, n);
	}
	ir->alloc.heads = s->allocate;
	ir->alloc.floor = lower_opt(lw, s->alloc_floor);

	return 0;
}

/* GraceKV's segmentation, prototype and utility values (`segment`, `tree`, add_split). */
static void lower_grace(lower *lw)
{
	kvp_sema *s = lw->s;
	struct kvp_ir_act *ac = &lw->ir->action;
	const kvp_stmt *seg = s->setting[KVP_SET_SEGMENT], *tree = s->setting[KVP_SET_TREE];
	ac->seg_loc = seg ? L(seg->loc) : ac->loc;
	ac->tree_loc = tree ? L(tree->loc) : ac->loc;
	ac->seg_fixed = s->seg_fixed;
	ac->seg_min = lower_opt(lw, s->seg_min);
	ac->seg_max = lower_opt(lw, s->seg_max);
	ac->seg_cut = lower_opt(lw, s->seg_cut);
	ac->seg_length = lower_opt(lw, s->seg_length);
	ac->seg_stability = lower_opt(lw, s->seg_stability);
	ac->seg_surprisal = lower_opt(lw, s->seg_surprisal);
	for (int i = 0; s->seg_windows && i < s->seg_windows->n_args && i < 4; i++) {
		double v = 0;
		kvp_ir_fold(lw->ir, lower_expr(lw, s->seg_windows->args[i]), &v);
		ac->win[ac->n_win++] = (int32_t)v;
	}
	ac->floor_all = s->singletons_all;
	ac->count = s->tree_count;
	ac->smooth = lower_opt(lw, s->tree_smooth);
	ac->mass = lower_opt(lw, s->mass);
	ac->numerator = lower_opt(lw, s->numerator);
}

/* The action and the trigger. */
static void lower_action_trigger(lower *lw)
{
	kvp_sema *s = lw->s;
	struct kvp_ir *ir = lw->ir;
	const kvp_file *f = s->file;
	/* action */
	const kvp_stmt *action = s->setting[KVP_SET_ACTION];
	ir->action.loc = at_stmt(lw, action);
	ir->action.run = -1;
	ir->action.floor = -1;
	ir->action.kind = s->action;
	switch (s->action) {
	case K_ACT_EVICT:
	case K_ACT_COUNT_:
		break;
	case K_ACT_MERGE:
		ir->action.run = lower_opt(lw, s->run);
		break;
	case K_ACT_SPLIT:
		ir->action.run = s->slot ? lower_expr(lw, s->slot) :
		                           kvp_ir_num(ir, L(action->loc), 64);
		ir->action.floor = s->act_floor ? lower_size(lw, s->act_floor, s->floor_unit) : -1;
		lower_grace(lw);
		break;
	}

	/* trigger */
	const kvp_stmt *c = s->compress;
	ir->trigger.n = -1;
	ir->trigger.threshold = -1;
	ir->trigger.target = -1;
	if (!c) {
		ir->trigger.kind = KVP_TRIG_NEVER;
		ir->trigger.loc = L(f->name_loc);
	} else {
		/* the statement's trigger word -> the IR's trigger */
		static const enum kvp_ir_trigger kind[] = {
			[KVP_T_EVERY_STEP] = KVP_TRIG_EVERY_STEP, [KVP_T_EVERY] = KVP_TRIG_EVERY_N,
			[KVP_T_WHEN] = KVP_TRIG_OVER_BUDGET,      [KVP_T_AT] = KVP_TRIG_PROMPT_END,
			[KVP_T_PER] = KVP_TRIG_PREFILL_BLOCK,
		};
		ir->trigger.loc = L(c->loc);
		ir->trigger.kind = kind[c->trigger];
		if (c->trigger == KVP_T_EVERY || c->trigger == KVP_T_PER) /* every N, per N tokens */
			ir->trigger.n = lower_expr(lw, c->value);
		if (c->trigger == KVP_T_WHEN)
			ir->trigger.threshold = lower_size(lw, s->threshold, s->threshold_unit);
		if (c->trigger == KVP_T_PER)
			ir->trigger.prompt_only = c->n_words > 1;
		if (c->target)
			ir->trigger.target = lower_size(lw, c->target, s->target_unit);
	}
}

/* The precision action: the tiers and their cumulative shares as checked. */
static void lower_tiers(lower *lw)
{
	const kvp_sema *s = lw->s;
	struct kvp_ir_tiers *t = &lw->ir->tiers;
	const kvp_stmt *st = s->setting[KVP_SET_PRECISION];
	t->n = st ? s->n_tier : 0;
	t->kind = t->n == 0 ? K_TIERS_NONE : s->tier_shares ? K_TIERS_SHARES : K_TIERS_UTILITY;
	t->loc = at_stmt(lw, st);
	t->rotate = st ? s->tier_rotate : 0;
	t->window = st ? s->tier_window : 0;
	t->edge = st ? s->tier_edge : 0;
	t->edge_layers = st ? s->tier_edge_layers : 0;
	for (int j = 0; j < t->n; j++) {
		t->tier[j] = s->tier[j];
		t->cum[j] = s->tier_shares ? s->tier_cum[j] : 0;
	}
}

/* 1 when expression e reads numbers and parameters only: a value check_params can
 * compute from a run's parameter values alone. */
static int params_only(const struct kvp_ir *ir, int32_t e)
{
	if (e < 0)
		return 1;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if (x->op == KVP_OP_STAT || x->op == KVP_OP_SIGNAL || x->op >= KVP_OP_CAOTE)
		return 0;
	return params_only(ir, x->a) && params_only(ir, x->b) && params_only(ir, x->c);
}

/* 1 when expression e holds a copy of the budget's expression: a trigger limit or target
 * written with `budget`, which a compression-ratio override replaces (budget_of in the
 * emitted code), so its value is not the parameters' alone. */
static int reads_budget(const struct kvp_ir *ir, int32_t e)
{
	if (e < 0 || ir->alloc.budget < 0)
		return 0;
	if (kvp_ir_same_tree(ir, e, ir->alloc.budget))
		return 1;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	return reads_budget(ir, x->a) || reads_budget(ir, x->b) || reads_budget(ir, x->c);
}

/* The checker's value rules of settings that read parameters (compiler/kvp_sema.c
 * rule_holds), for the emitted check_params; live only where the value is the
 * parameters' alone, not where it holds the budget (runtime/policy/rt_budget.c checks the
 * budget in force when a sequence starts). Runs after the budget is lowered. */
static void lower_rules(lower *lw)
{
	for (int i = 0; i < lw->s->n_rules; i++) {
		const struct kvp_sema_rule *r = &lw->s->rules[i];
		int32_t e = lower_expr(lw, r->e);
		if (e >= 0)
			kvp_ir_add_rule(lw->ir, L(r->e->loc), e, r->rule, r->what,
			                params_only(lw->ir, e) && !reads_budget(lw->ir, e));
	}
}

int kvp_lower(kvp_sema *s, struct kvp_ir *ir)
{
	lower lw = { s, ir, 0 };
	ir->loc = L(s->file->name_loc);
	lower_defs(&lw);
	lower_score_guards(&lw);
	if (lower_alloc(&lw) != 0)
		return -1;
	lower_action_trigger(&lw);
	lower_tiers(&lw);
	lower_rules(&lw);
	ir->positions = s->compacted ? KVP_POS_COMPACTED : KVP_POS_ORIGINAL;
	return 0;
}

static void ir_diag(void *user, struct kvp_loc loc, const char *msg)
{
	kvp_src *src = user;
	kvp_src_error(src, kvp_src_loc_at(src, loc.line, loc.col), "%s", msg);
}

/* The statements of f as written in src, for BIN info: each statement's bytes on one line
 * (a newline inside its parentheses and the indentation after it become one space, a `#`
 * comment inside it is dropped, a string literal kept whole), `param` statements left
 * out (info lists the parameters with their defaults). Heap string. */
static char *statements_text(const kvp_file *f, const kvp_src *src)
{
	size_t cap = 1;
	for (int i = 0; i < f->n_stmts; i++)
		cap += f->stmts[i]->loc.end - f->stmts[i]->loc.off + 1;
	char *out = malloc(cap), *w = out;
	if (!out)
		abort();
	for (int i = 0; i < f->n_stmts; i++) {
		const kvp_stmt *st = f->stmts[i];
		if (st->kind == KVP_S_PARAM)
			continue;
		int in_str = 0, space = 0;
		for (uint32_t k = st->loc.off; k < st->loc.end && k < src->len; k++) {
			const char c = src->text[k];
			if (!in_str && c == '#') { /* to the end of the line */
				while (k + 1 < st->loc.end && src->text[k + 1] != '\n')
					k++;
				continue;
			}
			if (!in_str && (c == '\n' || c == '\r' || c == ' ' || c == '\t')) {
				space = 1;
				continue;
			}
			if (space && w > out && w[-1] != '\n' && w[-1] != '(' && c != ')')
				*w++ = ' ';
			space = 0;
			in_str ^= c == '"';
			*w++ = c;
		}
		*w++ = '\n';
	}
	*w = 0;
	return out;
}

int kvp_compile(kvp_src *src, struct kvp_ir *ir)
{
	memset(ir, 0, sizeof *ir);
	kvp_file *f = kvp_parse(src);
	if (src->n_errors) {
		kvp_file_free(f);
		return src->n_errors;
	}
	kvp_sema *s = kvp_sema_check(f);
	if (src->n_errors) {
		kvp_sema_free(s);
		kvp_file_free(f);
		return src->n_errors;
	}
	char hash[17];
	kvp_ir_hash(src->text, src->len, hash);
	kvp_ir_init(ir, f->name, src->path, hash, kvp_file_summary(f));
	free(ir->statements);
	ir->statements = statements_text(f, src);
	if (kvp_lower(s, ir) == 0)
		kvp_ir_check(ir, ir_diag, src);
	kvp_sema_free(s);
	kvp_file_free(f);
	if (src->n_errors) {
		kvp_ir_free(ir);
		memset(ir, 0, sizeof *ir);
		return src->n_errors;
	}
	return 0;
}
