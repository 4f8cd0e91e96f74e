/*
 * kvp_emit: the emitter core (see kvp_emit.h). Both back ends print through these
 * functions; their differences are the spellings of struct kvp_emit_target and
 * struct kvp_emit_view.
 */
#include "kvp_emit.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_util.h"

/* ---- output buffer ---------------------------------------------------------------- */


void kvp_em_put(struct kvp_em *em, const char *s, size_t n)
{
	if (em->len + n + 1 > em->cap) {
		size_t nc = em->cap ? em->cap * 2 : 8192;
		while (nc < em->len + n + 1)
			nc *= 2;
		char *p = realloc(em->buf, nc);
		RT_ASSERT(p != NULL);
		em->buf = p;
		em->cap = nc;
	}
	memcpy(em->buf + em->len, s, n);
	for (size_t i = 0; i < n; i++)
		em->lines += s[i] == '\n';
	em->len += n;
	em->buf[em->len] = 0;
}

void kvp_em_out(struct kvp_em *em, const char *fmt, ...)
{
	char small[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	RT_ASSERT(n >= 0);
	if ((size_t)n < sizeof small) {
		kvp_em_put(em, small, (size_t)n);
		return;
	}
	char *big = RT_MALLOC((size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	kvp_em_put(em, big, (size_t)n);
	free(big);
}

/* The line number the next byte will be on. */
int kvp_em_line_now(const struct kvp_em *em)
{
	return em->lines + 1;
}


/* ---- escaping --------------------------------------------------------------------- */

void kvp_em_cstr(struct kvp_em *em, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned c = *p;
		if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"' && c != '?') {
			char ch = (char)c;
			kvp_em_put(em, &ch, 1);
		} else {
			kvp_em_out(em, "\\%03o", c);
		}
	}
}

void kvp_emit_cstr(FILE *f, const char *s)
{
	struct kvp_em em = { 0 };
	kvp_em_cstr(&em, s);
	if (em.len)
		fwrite(em.buf, 1, em.len, f);
	free(em.buf);
}

/* A name inside a comment: only [A-Za-z0-9_] pass, at most 40 bytes. */
void kvp_em_comment_name(struct kvp_em *em, const char *s)
{
	size_t n = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p && n < 40; p++, n++) {
		unsigned c = *p;
		char ch = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		          c == '_' ? (char)c : '?';
		kvp_em_put(em, &ch, 1);
	}
	if (*s && strlen(s) > 40)
		kvp_em_put(em, "...", 3);
}

/* A path inside a comment: [A-Za-z0-9_./-] pass; never forms a comment closer. */
void kvp_em_comment_path(struct kvp_em *em, const char *s)
{
	char prev = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned c = *p;
		char ch = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		          c == '_' || c == '.' || c == '-' || (c == '/' && prev != '*') ? (char)c : '?';
		kvp_em_put(em, &ch, 1);
		prev = ch;
	}
}

/* A double as a C double literal (%.17g round-trips exactly). */
void kvp_em_num(struct kvp_em *em, double v)
{
	char b[64];
	snprintf(b, sizeof b, "%.17g", v);
	int is_int = strspn(b, "-0123456789") == strlen(b);
	if (v < 0)
		kvp_em_out(em, "(%s%s)", b, is_int ? ".0" : "");
	else
		kvp_em_out(em, "%s%s", b, is_int ? ".0" : "");
}

size_t kvp_emit_symbol(const char *name, char *buf, size_t len)
{
	char tmp[256];
	size_t n = 0;
	int changed = name[0] == 0;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		unsigned c = *p;
		char ch;
		if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')
			ch = (char)c;
		else if (c >= 'A' && c <= 'Z')
			ch = (char)(c - 'A' + 'a'), changed = 1;
		else
			ch = '_', changed = 1;
		if (n < 200)
			tmp[n++] = ch;
		else
			changed = 1;
	}
	tmp[n] = 0;
	char hash[17];
	kvp_ir_hash(name, strlen(name), hash);
	if (changed)
		return (size_t)snprintf(buf, len, "kvp_policy_%s_%.8s", tmp, hash);
	return (size_t)snprintf(buf, len, "kvp_policy_%s", tmp);
}


/* ---- #line ------------------------------------------------------------------------ */

void kvp_em_line_src(struct kvp_em *em, struct kvp_loc loc)
{
	if (!em->opts || !em->opts->line_directives || loc.line <= 0)
		return;
	em->in_src = 1;
	kvp_em_out(em, "#line %d \"", loc.line);
	kvp_em_cstr(em, em->ir->source);
	kvp_em_out(em, "\"\n");
}

void kvp_em_line_back(struct kvp_em *em)
{
	if (!em->in_src || !em->opts || !em->opts->out_name)
		return;
	em->in_src = 0;
	int next = kvp_em_line_now(em) + 1;
	kvp_em_out(em, "#line %d \"", next);
	kvp_em_cstr(em, em->opts->out_name);
	kvp_em_out(em, "\"\n");
}


/* ---- expressions ------------------------------------------------------------------ */

/* A signal as the target reads it (each signal's meaning: kvp_builtin.def). */
static void signal_expr(struct kvp_em *em, enum kvp_ir_signal s)
{
	const struct kvp_emit_target *t = em->t;
	const char *E = em->view->e, *D = em->view->d;
	switch (s) {
	case KVP_SIG_ATTN: kvp_em_out(em, "attn"); break;
	case KVP_SIG_SEEN: kvp_em_out(em, "seen"); break;
	case KVP_SIG_CONTEXT: kvp_em_out(em, "%s", t->context); break;
	case KVP_SIG_PROMPT_LEN: kvp_em_out(em, "%s", t->prompt_len); break;
	case KVP_SIG_N_LAYERS: kvp_em_out(em, "%s", t->n_layers); break;
	case KVP_SIG_POS: kvp_em_out(em, "(double)%spos[i]", E); break;
	case KVP_SIG_AGE: kvp_em_out(em, "(seen - 1.0 - (double)%spos[i])", E); break;
	case KVP_SIG_SIZE: kvp_em_out(em, "(double)%scount[i]", E); break;
	case KVP_SIG_KEY_NORM: kvp_em_out(em, "k_norm(%sk + (size_t)i * %s, %s)", E, D, D); break;
	case KVP_SIG_VALUE_NORM: kvp_em_out(em, "k_norm(%sv + (size_t)i * %s, %s)", E, D, D); break;
	case KVP_SIG_VALUE_L1: kvp_em_out(em, "k_norm_l1(%sv + (size_t)i * %s, %s)", E, D, D); break;
	case KVP_SIG_KEY_COS_MEAN:
		if (t->host_score)
			kvp_em_out(em, "k_cos_anchor(%sk + (size_t)i * %s, vec + %s, %s)", E, D, D, D);
		else
			kvp_em_out(em, "0.0");
		break;
	case KVP_SIG_KEY_REDUNDANCY: /* the whole-head vector score_q computed into tmp */
		if (t->host_score)
			kvp_em_out(em, "(double)tmp[(size_t)%d * cap + (size_t)i]", em->n_vec);
		else
			kvp_em_out(em, "0.0");
		break;
	case KVP_SIG_REPLAY_ATTN: /* the runtime's replay scores, by (layer, KV head, position) */
		if (t->host_score)
			kvp_em_out(em, "k_replay_attn(ctx, kv, %s, h, %spos[i])", em->view->layer, E);
		else
			kvp_em_out(em, "0.0");
		break;
	case KVP_SIG_ENTRIES: kvp_em_out(em, "(double)%s", em->view->n); break;
	case KVP_SIG_LAYER: kvp_em_out(em, "(double)%s", em->view->layer); break;
	case KVP_SIG_BUDGET: kvp_em_out(em, "%s", t->budget); break;
	/* no default: a signal row without its spelling here is a compile error (-Wswitch) */
	case KVP_SIG_COUNT_: kvp_em_out(em, "0.0"); break;
	}
}

typedef void (*tree_fn)(struct kvp_em *em, int32_t e);

/* pre, the tree at x->a, mid (its %s replaced by op), the tree at x->b, post; without
 * mid (one operand) pre, the tree at x->a, post. Trees print with fn. */
static void infix_by(struct kvp_em *em, tree_fn fn, const struct kvp_ir_expr *x,
                     const char *pre, const char *mid, const char *op, const char *post)
{
	kvp_em_out(em, "%s", pre);
	fn(em, x->a);
	if (mid) {
		kvp_em_out(em, mid, op);
		fn(em, x->b);
	}
	kvp_em_out(em, "%s", post);
}

static void infix(struct kvp_em *em, const struct kvp_ir_expr *x, const char *pre,
                  const char *mid, const char *op, const char *post)
{
	infix_by(em, kvp_em_expr, x, pre, mid, op, post);
}

/* a ? b : c as pre a mid b sep c post */
static void select_by(struct kvp_em *em, tree_fn fn, const struct kvp_ir_expr *x,
                      const char *pre, const char *mid, const char *sep, const char *post)
{
	infix_by(em, fn, x, pre, "%s", mid, sep);
	fn(em, x->c);
	kvp_em_out(em, "%s", post);
}

static void bin(struct kvp_em *em, const struct kvp_ir_expr *x, const char *op)
{
	infix(em, x, "(", " %s ", op, ")");
}

/* Comparisons are made in float32, the precision of attention probabilities and stored
 * statistics: `attn < 1 / seen` must not call a uniform row "below uniform" because
 * 1/n rounded to float lies below the double 1/n. */
static void cmp(struct kvp_em *em, const struct kvp_ir_expr *x, const char *op)
{
	infix(em, x, "((float)", " %s (float)", op, " ? 1.0 : 0.0)");
}

/* and / or of two conditions: 0 or 1 */
static void logic(struct kvp_em *em, const struct kvp_ir_expr *x, const char *op)
{
	infix(em, x, "((", ") != 0 %s (", op, ") != 0 ? 1.0 : 0.0)");
}

/* fn(a) or fn(a, b) */
static void call(struct kvp_em *em, const char *fn, const struct kvp_ir_expr *x, int args)
{
	kvp_em_out(em, "%s(", fn);
	infix(em, x, "", args > 1 ? "%s" : NULL, ", ", ")");
}

void kvp_em_expr(struct kvp_em *em, int32_t e)
{
	const struct kvp_ir_expr *x = &em->ir->nodes[e];
	/* A trigger limit or target written as `budget` (or `0.5 * budget`) reaches the IR
	 * as a copy of the budget's expression when the front end inlines it; emitting it
	 * as budget_of() makes it follow a compression-ratio override. Without an override
	 * the value is identical. */
	if (em->subst_budget && em->ir->alloc.budget >= 0 && kvp_ir_same_tree(em->ir, e, em->ir->alloc.budget)) {
		kvp_em_out(em, "%s", em->t->budget);
		return;
	}
	switch (x->op) {
	case KVP_OP_NUM: kvp_em_num(em, x->num); break;
	case KVP_OP_PARAM: kvp_em_out(em, em->t->param, (int)x->index); break;
	case KVP_OP_STAT: kvp_em_out(em, em->t->stat, (int)x->index); break;
	case KVP_OP_SIGNAL: signal_expr(em, x->sig); break;
	case KVP_OP_NEG: infix(em, x, "(-", NULL, NULL, ")"); break;
	case KVP_OP_NOT: infix(em, x, "(", NULL, NULL, " == 0 ? 1.0 : 0.0)"); break;
	case KVP_OP_LOG: call(em, "log", x, 1); break;
	case KVP_OP_EXP: call(em, "exp", x, 1); break;
	case KVP_OP_ABS: call(em, "fabs", x, 1); break;
	case KVP_OP_SQRT: call(em, "sqrt", x, 1); break;
	case KVP_OP_ADD: bin(em, x, "+"); break;
	case KVP_OP_SUB: bin(em, x, "-"); break;
	case KVP_OP_MUL: bin(em, x, "*"); break;
	case KVP_OP_DIV: bin(em, x, "/"); break;
	case KVP_OP_MIN: call(em, "fmin", x, 2); break;
	case KVP_OP_MAX: call(em, "fmax", x, 2); break;
	case KVP_OP_POW: call(em, "pow", x, 2); break;
	case KVP_OP_LT: cmp(em, x, "<"); break;
	case KVP_OP_LE: cmp(em, x, "<="); break;
	case KVP_OP_GT: cmp(em, x, ">"); break;
	case KVP_OP_GE: cmp(em, x, ">="); break;
	case KVP_OP_EQ: cmp(em, x, "=="); break;
	case KVP_OP_NE: cmp(em, x, "!="); break;
	case KVP_OP_AND: logic(em, x, "&&"); break;
	case KVP_OP_OR: logic(em, x, "||"); break;
	case KVP_OP_SELECT: select_by(em, kvp_em_expr, x, "((", ") != 0 ? ", " : ", ")"); break;
	case KVP_OP_CAOTE:
	case KVP_OP_NORMALIZE:
	case KVP_OP_EXPATTN:
		if (em->t->host_score)
			kvp_em_out(em, "(double)tmp[(size_t)%d * cap + (size_t)i]", (int)em->vec_of[e]);
		else
			kvp_em_out(em, "0.0");
		break;
	case KVP_OP_HEADW:
		if (em->t->host_score)
			kvp_em_out(em, "k_head_weight(kv, %s, h, policy_head_w, %d, %d)", em->view->layer,
			           em->ir->head_layers, em->ir->head_kv);
		else
			kvp_em_out(em, "0.0");
		break;
	case KVP_OP_LINEAR: /* the shared word init_entries wrote (k_linear_init) */
		if (em->t->host_score)
			kvp_em_out(em, "(double)k_stat_getf(k_stat_block(kv, h, i) + %d)", (int)em->ir->lin_word);
		else
			kvp_em_out(em, "0.0");
		break;
	default:
		kvp_em_out(em, "0.0");
		break;
	}
}

/* The expression as readable pseudo-source for comments (names sanitised). */
void kvp_em_expr_comment(struct kvp_em *em, int32_t e)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	switch (x->op) {
	case KVP_OP_NUM: {
		char b[64];
		snprintf(b, sizeof b, "%.17g", x->num);
		kvp_em_out(em, "%s", b);
		return;
	}
	case KVP_OP_PARAM: kvp_em_comment_name(em, ir->params[x->index].name); return;
	case KVP_OP_STAT: kvp_em_comment_name(em, ir->stats[x->index].name); return;
	case KVP_OP_SIGNAL: kvp_em_out(em, "%s", kvp_ir_signal_name(x->sig)); return;
	case KVP_OP_NEG: kvp_em_out(em, "-"); kvp_em_expr_comment(em, x->a); return;
	case KVP_OP_NOT: kvp_em_out(em, "not "); kvp_em_expr_comment(em, x->a); return;
	case KVP_OP_ADD: case KVP_OP_SUB: case KVP_OP_MUL: case KVP_OP_DIV:
	case KVP_OP_LT: case KVP_OP_LE: case KVP_OP_GT: case KVP_OP_GE: case KVP_OP_EQ:
	case KVP_OP_NE: case KVP_OP_AND: case KVP_OP_OR:
		infix_by(em, kvp_em_expr_comment, x, "(", " %s ", kvp_ir_op_name(x->op), ")");
		return;
	case KVP_OP_SELECT:
		select_by(em, kvp_em_expr_comment, x, "if(", ", ", ", ", ")");
		return;
	case KVP_OP_HEADW:
		kvp_em_out(em, "head_score(%dx%d weights)", ir->head_layers, ir->head_kv);
		return;
	case KVP_OP_LINEAR:
		kvp_em_out(em, "linear_score(%dx%dx%d weights)", ir->lin_layers, ir->lin_kv, ir->lin_embd + 1);
		return;
	case KVP_OP_CAOTE:
		kvp_em_out(em, "caote(");
		kvp_em_expr_comment(em, x->a);
		kvp_em_out(em, ", %s)", x->mode == KVP_CAOTE_FAST ? "fast" : "exact");
		return;
	default:
		kvp_em_out(em, "%s(", kvp_ir_op_name(x->op));
		infix_by(em, kvp_em_expr_comment, x, "", x->b >= 0 ? "%s" : NULL, ", ", ")");
		return;
	}
}


/* 1 if expression e (or anything below it) uses signal s. */
int kvp_em_uses_signal(const struct kvp_ir *ir, int32_t e, enum kvp_ir_signal s)
{
	if (e < 0)
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if (x->op == KVP_OP_SIGNAL)
		return x->sig == s;
	return kvp_em_uses_signal(ir, x->a, s) || kvp_em_uses_signal(ir, x->b, s) || kvp_em_uses_signal(ir, x->c, s);
}

/* Scalar expression e, or the default d when e < 0. */
void kvp_em_scalar_or(struct kvp_em *em, int32_t e, double d)
{
	if (e >= 0)
		kvp_em_expr(em, e);
	else
		kvp_em_num(em, d);
}


/* ---- shared sections -------------------------------------------------------------- */

/* The body of stat_read_k: its value read out of the entry's words. */
void kvp_em_stat_read(struct kvp_em *em, int k)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_stat *s = &ir->stats[k];
	int ring = s->hist == KVP_HIST_LAST_STEPS && s->kind != KVP_STAT_LAST &&
	           s->kind != KVP_STAT_EMA;
	const char *steps = NULL;
	char stepbuf[160];
	if (s->kind == KVP_STAT_MEAN) {
		if (s->hist == KVP_HIST_LAST_STEPS)
			snprintf(stepbuf, sizeof stepbuf, "fmin((double)k_stat_getf(b + %d), %d.0)",
			         (int)ir->obs_count_word, (int)s->ring);
		else
			snprintf(stepbuf, sizeof stepbuf, "(double)k_stat_getf(b + %d)",
			         (int)ir->obs_count_word);
		steps = stepbuf;
	}
	if (s->kind == KVP_STAT_MEAN && s->hist == KVP_HIST_PROMPT_TAIL) {
		kvp_em_line_src(em, s->loc);
		kvp_em_out(em, "\tconst double tail = k_stat_tail_steps(%s, %s, ", em->t->seen_raw,
		           em->t->prompt_raw);
		kvp_em_expr(em, s->window);
		kvp_em_out(em, ");\n");
		kvp_em_line_back(em);
		kvp_em_out(em, "\treturn k_stat_mean(k_stat_getf(w), fmin(%s, tail));\n", steps);
	} else if (ring && s->kind == KVP_STAT_COUNT) {
		kvp_em_out(em, "\treturn k_stat_ring_count(w, %d);\n", (int)s->ring);
	} else if (ring && s->kind == KVP_STAT_MEAN) {
		kvp_em_out(em, "\treturn k_stat_mean(k_stat_ring_sum(w, %d), %s);\n", (int)s->ring, steps);
	} else if (ring) {
		kvp_em_out(em, "\treturn k_stat_ring_sum(w, %d);\n", (int)s->ring);
	} else if (s->kind == KVP_STAT_MEAN) {
		kvp_em_out(em, "\treturn k_stat_mean(k_stat_getf(w), %s);\n", steps);
	} else {
		kvp_em_out(em, "\treturn k_stat_getf(w);\n");
	}
}


/* The update statement of stat k with value x_k (inside the entry loop). */
void kvp_em_stat_prelude(struct kvp_em *em, const char *ind)
{
	const struct kvp_ir *ir = em->ir;
	for (int k = 0; k < ir->n_stats; k++) {
		const struct kvp_ir_stat *s = &ir->stats[k];
		if (s->kind == KVP_STAT_EMA) {
			kvp_em_line_src(em, s->loc);
			kvp_em_out(em, "%sconst double alpha_%d = ", ind, k);
			kvp_em_expr(em, s->alpha);
			kvp_em_out(em, ";\n");
			kvp_em_line_back(em);
		}
		if (s->hist == KVP_HIST_PROMPT_TAIL) {
			kvp_em_line_src(em, s->loc);
			kvp_em_out(em, "%sconst int tail_%d = k_stat_in_prompt_tail(%s, %s, ", ind, k,
			           em->t->step, em->t->prompt_raw);
			kvp_em_expr(em, s->window);
			kvp_em_out(em, ");\n");
			kvp_em_line_back(em);
		}
	}
}

void kvp_em_stat_updates(struct kvp_em *em, int per_qhead, const char *ind)
{
	for (int k = 0; k < em->ir->n_stats; k++)
		if (em->ir->stats[k].per_qhead == per_qhead)
			kvp_em_stat_update(em, k, ind);
}

void kvp_em_stat_entry(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	int any_q = 0;
	for (int k = 0; k < ir->n_stats; k++)
		any_q |= ir->stats[k].per_qhead;
	kvp_em_out(em, "\t\tuint32_t *b = %s;\n", em->t->stat_block);
	if (ir->uses_obs_count)
		kvp_em_out(em, "\t\tk_stat_sum(b + %d, 1.0);\n", (int)ir->obs_count_word);
	kvp_em_stat_updates(em, 0, "\t\t");
	if (!any_q)
		return;
	kvp_em_out(em, "\t\tfor (int r = 0; r < %s; r++) {\n", em->t->group);
	kvp_em_out(em, "\t\t\tconst double attn = %s;\n", em->t->attn);
	kvp_em_out(em, "\t\t\tuint32_t *q = b + STAT_WORDS_ENTRY + (size_t)r * STAT_WORDS_QHEAD;\n");
	if (em->t->void_attn)
		kvp_em_out(em, "\t\t\t(void)attn;\n");
	kvp_em_stat_updates(em, 1, "\t\t\t");
	kvp_em_out(em, "\t\t}\n");
}

void kvp_em_stat_update(struct kvp_em *em, int k, const char *ind)
{
	const struct kvp_ir_stat *s = &em->ir->stats[k];
	const char *w = s->per_qhead ? "q" : "b";
	kvp_em_line_src(em, s->loc);
	kvp_em_out(em, "%sconst double x_%d = ", ind, k);
	kvp_em_expr(em, s->arg);
	kvp_em_out(em, ";\n");
	kvp_em_line_back(em);
	if (s->hist == KVP_HIST_PROMPT_TAIL)
		kvp_em_out(em, "%sif (tail_%d)\n%s\t", ind, k, ind);
	else
		kvp_em_out(em, "%s", ind);
	int ring = s->hist == KVP_HIST_LAST_STEPS;
	switch (s->kind) {
	case KVP_STAT_SUM:
	case KVP_STAT_MEAN:
	case KVP_STAT_COUNT: {
		/* a count keeps bits; the ring of the last steps keeps one slot a step */
		const int bit = s->kind == KVP_STAT_COUNT;
		if (ring)
			kvp_em_out(em, "%s(%s + %d, %d, %s, x_%d);\n",
			           bit ? "k_stat_ring_put_bit" : "k_stat_ring_put", w, (int)s->word,
			           (int)s->ring, em->t->step, k);
		else
			kvp_em_out(em, "%s(%s + %d, x_%d);\n", bit ? "k_stat_count" : "k_stat_sum", w,
			           (int)s->word, k);
		break;
	}
	case KVP_STAT_EMA:
		kvp_em_out(em, "k_stat_ema(%s + %d, x_%d, alpha_%d);\n", w, (int)s->word, k, k);
		break;
	default:
		kvp_em_out(em, "k_stat_last(%s + %d, x_%d);\n", w, (int)s->word, k);
		break;
	}
}


int kvp_em_write(const struct kvp_em *em, FILE *f)
{
	return fwrite(em->buf, 1, em->len, f) == em->len ? 0 : -1;
}

void kvp_em_free(struct kvp_em *em)
{
	free(em->buf);
	em->buf = NULL;
	em->len = em->cap = 0;
}

/* 1 if expression e (or anything below it) reads statistic k. */
int kvp_em_uses_stat(const struct kvp_ir *ir, int32_t e, int k)
{
	if (e < 0)
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if (x->op == KVP_OP_STAT && x->index == k)
		return 1;
	return kvp_em_uses_stat(ir, x->a, k) || kvp_em_uses_stat(ir, x->b, k) ||
	       kvp_em_uses_stat(ir, x->c, k);
}

void kvp_em_budget_return(struct kvp_em *em, const char *own_default)
{
	const struct kvp_ir *ir = em->ir;
	kvp_em_line_src(em, ir->alloc.loc);
	kvp_em_out(em, "\treturn k_budget_of(%s, %s, %s, ", em->t->ratio, em->t->byte_ratio,
	           em->t->context);
	if (ir->alloc.budget >= 0)
		kvp_em_expr(em, ir->alloc.budget);
	else
		kvp_em_out(em, "%s", own_default);
	kvp_em_out(em, ");\n");
	kvp_em_line_back(em);
}

void kvp_em_budget_or(struct kvp_em *em, int32_t e)
{
	if (e < 0) {
		kvp_em_out(em, "%s", em->t->budget);
		return;
	}
	em->subst_budget = 1;
	kvp_em_expr(em, e);
	em->subst_budget = 0;
}

void kvp_em_cfg_layers(struct kvp_em *em, const char *cfg)
{
	const struct kvp_ir_alloc *al = &em->ir->alloc;
	kvp_em_out(em, "\t%slayers = %s;\n", cfg, K_LAYERS_NAMES[al->layers]);
	if (al->layers == K_LAYERS_PYRAMID || al->layers == K_LAYERS_FUNNEL) {
		kvp_em_out(em, "\t%sbeta = ", cfg);
		kvp_em_scalar_or(em, al->beta, 20);
		kvp_em_out(em, ";\n");
	} else if (al->layers == K_LAYERS_LINEAR) {
		kvp_em_out(em, "\t%sfrom = ", cfg);
		kvp_em_scalar_or(em, al->from, 1);
		kvp_em_out(em, ";\n\t%sto = ", cfg);
		kvp_em_scalar_or(em, al->to, 1);
		kvp_em_out(em, ";\n");
	}
}

void kvp_em_cfg_guards(struct kvp_em *em, const char *cfg)
{
	const struct kvp_ir_guards *g = &em->ir->guards;
	if (g->sinks < 0 && g->recent < 0)
		return;
	kvp_em_line_src(em, g->loc);
	for (int i = 0; i < 2; i++) {
		const char *name = i ? "recent" : "sinks";
		int32_t e = i ? g->recent : g->sinks;
		if (e < 0)
			continue;
		kvp_em_out(em, "\t%shas_%s = 1;\n\t%s%s = ", cfg, name, cfg, name);
		kvp_em_expr(em, e);
		kvp_em_out(em, ";\n");
	}
	kvp_em_line_back(em);
}
