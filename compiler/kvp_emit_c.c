/*
 * kvp_emit_c: the C back end (see kvp_emit_c.h). The output is built in memory (so
 * lines can be counted for `#line` switches back to the generated file) and written at
 * once. Layout of a generated unit:
 *
 *   banner, file comment (policy, statistics layout)
 *   includes (rt_policy.h and the kernel templates)
 *   parameter table, protected-span names, layer list
 *   stat_read_N()   read-out of statistic N at compress time
 *   observe()       the fused per-step statistic update loop
 *   score_q()       the per-query-head score (vector stages, then the elementwise tree)
 *   fires(), should_compress(), next_trigger()   the trigger
 *   config()        the policy's k_compress_cfg after `seen` tokens
 *   compress()      k_compress_run (or k_grace_run) with that configuration
 *   check()         the budget check before a sequence starts (runtime/policy/rt_budget.h)
 *   the exported const struct kvp_policy
 *
 * Every function body declares only the locals it uses (with_locals: the body is emitted
 * once to see which names it reads); hooks keep the ABI's signatures, so unused
 * parameters are allowed by one pragma at the top.
 *
 * Safety: source text reaches the output only through emit_cstr (escaped literal bodies)
 * and emit_comment_name (bytes outside [A-Za-z0-9_] become '?'); numbers are printed
 * with %.17g (exact round trip) from the IR's doubles.
 */
#include "kvp_emit_c.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_util.h"

/* ---- output buffer ---------------------------------------------------------------- */

struct em {
	char *buf;
	size_t len, cap;
	int lines;          /* newlines written so far */
	const struct kvp_ir *ir;
	const struct kvp_emit_opts *opts;
	int n_vec;          /* whole-head transform nodes, numbered in node order */
	int in_src;         /* a #line to the .kvp source is in effect */
	int subst_budget;   /* emitting a trigger limit or target: a subtree equal to the
	                       budget's expression is the budget (see kvp_ir_same_tree) */
	int32_t *vec_of;    /* [n_nodes] temporary index of a transform node, -1 otherwise */
};

static void put(struct em *em, const char *s, size_t n)
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

static void out(struct em *em, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void out(struct em *em, const char *fmt, ...)
{
	char small[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	RT_ASSERT(n >= 0);
	if ((size_t)n < sizeof small) {
		put(em, small, (size_t)n);
		return;
	}
	char *big = RT_MALLOC((size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	put(em, big, (size_t)n);
	free(big);
}

/* The line number the next byte will be on. */
static int lines_so_far(const struct em *em)
{
	return em->lines + 1;
}

/* ---- locals: a generated function declares only the names its body uses ---------- */

/* One local a body may need: its name and its declaration (one line, no tab). */
struct local {
	const char *name;
	const char *decl;
};

/* 1 if C text names the identifier id: as a whole word, outside comments, string and
 * character literals, and not as a member (after "->" or "."). */
static int names_ident(const char *text, const char *id)
{
	size_t n = strlen(id);
	for (const char *p = text; *p; p++) {
		if (p[0] == '/' && p[1] == '*') {
			const char *e = strstr(p + 2, "*/");
			if (!e)
				return 0;
			p = e + 1;
			continue;
		}
		if (*p == '"' || *p == '\'') {
			char q = *p;
			for (p++; *p && *p != q; p++)
				if (*p == '\\' && p[1])
					p++;
			if (!*p)
				return 0;
			continue;
		}
		int word = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_';
		if (!word)
			continue;
		const char *b = p;
		while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		       *p == '_')
			p++;
		int member = (b > text && b[-1] == '.') || (b > text + 1 && b[-1] == '>' && b[-2] == '-');
		if (!member && (size_t)(p - b) == n && !memcmp(b, id, n))
			return 1;
		p--;
	}
	return 0;
}

typedef void (*body_fn)(struct em *em, const void *arg);

/* Emit body(em, arg) preceded by the declarations of those of loc[0..n) it uses (or that
 * a used later declaration uses). The body is emitted twice: once to read which names it
 * uses (the output is then discarded), once for real, so #line numbers stay exact. */
static void with_locals(struct em *em, const struct local *loc, int n, body_fn body,
                        const void *arg)
{
	RT_ASSERT(n <= 16);
	size_t len0 = em->len;
	int lines0 = em->lines, src0 = em->in_src;
	body(em, arg);
	char *text = RT_MALLOC(em->len - len0 + 1);
	memcpy(text, em->buf + len0, em->len - len0 + 1);
	em->len = len0;
	em->buf[len0] = 0;
	em->lines = lines0;
	em->in_src = src0;
	int used[16] = { 0 };
	for (int i = n - 1; i >= 0; i--) {
		used[i] = names_ident(text, loc[i].name);
		for (int j = i + 1; j < n && !used[i]; j++)
			used[i] = used[j] && names_ident(loc[j].decl, loc[i].name);
	}
	free(text);
	for (int i = 0; i < n; i++)
		if (used[i])
			out(em, "\t%s\n", loc[i].decl);
	body(em, arg);
}

/* ---- escaping --------------------------------------------------------------------- */

static void cstr_into(struct em *em, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned c = *p;
		if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"' && c != '?') {
			char ch = (char)c;
			put(em, &ch, 1);
		} else {
			out(em, "\\%03o", c);
		}
	}
}

void kvp_emit_cstr(FILE *f, const char *s)
{
	struct em em = { 0 };
	cstr_into(&em, s);
	if (em.len)
		fwrite(em.buf, 1, em.len, f);
	free(em.buf);
}

/* A name inside a comment: only [A-Za-z0-9_] pass, at most 40 bytes. */
static void comment_name(struct em *em, const char *s)
{
	size_t n = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p && n < 40; p++, n++) {
		unsigned c = *p;
		char ch = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		          c == '_' ? (char)c : '?';
		put(em, &ch, 1);
	}
	if (*s && strlen(s) > 40)
		put(em, "...", 3);
}

/* A path inside a comment: [A-Za-z0-9_./-] pass; never forms a comment closer. */
static void comment_path(struct em *em, const char *s)
{
	char prev = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned c = *p;
		char ch = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		          c == '_' || c == '.' || c == '-' || (c == '/' && prev != '*') ? (char)c : '?';
		put(em, &ch, 1);
		prev = ch;
	}
}

/* A double as a C double literal (%.17g round-trips exactly). */
static void num(struct em *em, double v)
{
	char b[64];
	snprintf(b, sizeof b, "%.17g", v);
	int is_int = strspn(b, "-0123456789") == strlen(b);
	if (v < 0)
		out(em, "(%s%s)", b, is_int ? ".0" : "");
	else
		out(em, "%s%s", b, is_int ? ".0" : "");
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

static void line_src(struct em *em, struct kvp_loc loc)
{
	if (!em->opts->line_directives || loc.line <= 0)
		return;
	em->in_src = 1;
	out(em, "#line %d \"", loc.line);
	cstr_into(em, em->ir->source);
	out(em, "\"\n");
}

static void line_back(struct em *em)
{
	if (!em->in_src || !em->opts->out_name)
		return;
	em->in_src = 0;
	int next = lines_so_far(em) + 1;
	out(em, "#line %d \"", next);
	cstr_into(em, em->opts->out_name);
	out(em, "\"\n");
}

/* ---- expressions -------------------------------------------------------------------- */

enum ectx { E_SCALAR, E_OBSERVE, E_SCORE };

static void expr(struct em *em, int32_t e, enum ectx c);

static void signal_expr(struct em *em, enum kvp_ir_signal s, enum ectx c)
{
	switch (s) {
	case KVP_SIG_ATTN: out(em, "attn"); break;
	case KVP_SIG_SEEN: out(em, "seen"); break;
	case KVP_SIG_CONTEXT: out(em, "k_context(ctx, seen)"); break;
	case KVP_SIG_PROMPT_LEN: out(em, "k_prompt_len(ctx, seen)"); break;
	case KVP_SIG_ENTRIES: out(em, "(double)n"); break;
	case KVP_SIG_POS: out(em, "(double)h->pos[i]"); break;
	case KVP_SIG_AGE: out(em, "(seen - 1.0 - (double)h->pos[i])"); break;
	case KVP_SIG_SIZE: out(em, "(double)h->count[i]"); break;
	case KVP_SIG_KEY_NORM: out(em, "k_norm(h->k + (size_t)i * d, d)"); break;
	case KVP_SIG_VALUE_NORM: out(em, "k_norm(h->v + (size_t)i * d, d)"); break;
	case KVP_SIG_KEY_COS_MEAN: out(em, "k_cos_anchor(h->k + (size_t)i * d, vec + d, d)"); break;
	case KVP_SIG_LAYER: out(em, "(double)layer"); break;
	case KVP_SIG_N_LAYERS: out(em, "(double)kv->n_layer"); break;
	case KVP_SIG_BUDGET: out(em, "budget_of(ctx, kv, seen)"); break;
	default: out(em, "0.0"); break;
	}
	(void)c;
}

static void bin(struct em *em, const struct kvp_ir_expr *x, const char *op, enum ectx c)
{
	out(em, "(");
	expr(em, x->a, c);
	out(em, " %s ", op);
	expr(em, x->b, c);
	out(em, ")");
}

/* Comparisons are made in float32, the precision of attention probabilities and stored
 * statistics: `attn < 1 / seen` must not call a uniform row "below uniform" because
 * 1/n rounded to float lies below the double 1/n. */
static void cmp(struct em *em, const struct kvp_ir_expr *x, const char *op, enum ectx c)
{
	out(em, "((float)");
	expr(em, x->a, c);
	out(em, " %s (float)", op);
	expr(em, x->b, c);
	out(em, " ? 1.0 : 0.0)");
}

static void call1(struct em *em, const char *fn, int32_t a, enum ectx c)
{
	out(em, "%s(", fn);
	expr(em, a, c);
	out(em, ")");
}

static void call2(struct em *em, const char *fn, const struct kvp_ir_expr *x, enum ectx c)
{
	out(em, "%s(", fn);
	expr(em, x->a, c);
	out(em, ", ");
	expr(em, x->b, c);
	out(em, ")");
}

static void expr(struct em *em, int32_t e, enum ectx c)
{
	const struct kvp_ir_expr *x = &em->ir->nodes[e];
	/* A trigger limit or target written as `budget` (or `0.5 * budget`) reaches the IR
	 * as a copy of the budget's expression when the front end inlines it; emitting it
	 * as budget_of() makes it follow a compression-ratio override. Without an override
	 * the value is identical. */
	if (em->subst_budget && em->ir->alloc.budget >= 0 && kvp_ir_same_tree(em->ir, e, em->ir->alloc.budget)) {
		out(em, "budget_of(ctx, kv, seen)");
		return;
	}
	switch (x->op) {
	case KVP_OP_NUM: num(em, x->num); break;
	case KVP_OP_PARAM: out(em, "P[%d]", (int)x->index); break;
	case KVP_OP_STAT: out(em, "stat_read_%d(ctx, kv, h, i, r)", (int)x->index); break;
	case KVP_OP_SIGNAL: signal_expr(em, x->sig, c); break;
	case KVP_OP_NEG: out(em, "(-"); expr(em, x->a, c); out(em, ")"); break;
	case KVP_OP_NOT: out(em, "("); expr(em, x->a, c); out(em, " == 0 ? 1.0 : 0.0)"); break;
	case KVP_OP_LOG: call1(em, "log", x->a, c); break;
	case KVP_OP_EXP: call1(em, "exp", x->a, c); break;
	case KVP_OP_ABS: call1(em, "fabs", x->a, c); break;
	case KVP_OP_SQRT: call1(em, "sqrt", x->a, c); break;
	case KVP_OP_ADD: bin(em, x, "+", c); break;
	case KVP_OP_SUB: bin(em, x, "-", c); break;
	case KVP_OP_MUL: bin(em, x, "*", c); break;
	case KVP_OP_DIV: bin(em, x, "/", c); break;
	case KVP_OP_MIN: call2(em, "fmin", x, c); break;
	case KVP_OP_MAX: call2(em, "fmax", x, c); break;
	case KVP_OP_POW: call2(em, "pow", x, c); break;
	case KVP_OP_LT: cmp(em, x, "<", c); break;
	case KVP_OP_LE: cmp(em, x, "<=", c); break;
	case KVP_OP_GT: cmp(em, x, ">", c); break;
	case KVP_OP_GE: cmp(em, x, ">=", c); break;
	case KVP_OP_EQ: cmp(em, x, "==", c); break;
	case KVP_OP_NE: cmp(em, x, "!=", c); break;
	case KVP_OP_AND:
		out(em, "((");
		expr(em, x->a, c);
		out(em, ") != 0 && (");
		expr(em, x->b, c);
		out(em, ") != 0 ? 1.0 : 0.0)");
		break;
	case KVP_OP_OR:
		out(em, "((");
		expr(em, x->a, c);
		out(em, ") != 0 || (");
		expr(em, x->b, c);
		out(em, ") != 0 ? 1.0 : 0.0)");
		break;
	case KVP_OP_SELECT:
		out(em, "((");
		expr(em, x->a, c);
		out(em, ") != 0 ? ");
		expr(em, x->b, c);
		out(em, " : ");
		expr(em, x->c, c);
		out(em, ")");
		break;
	case KVP_OP_CAOTE:
	case KVP_OP_NORMALIZE:
	case KVP_OP_EXPATTN:
		out(em, "(double)tmp[(size_t)%d * cap + (size_t)i]", (int)em->vec_of[e]);
		break;
	default:
		out(em, "0.0");
		break;
	}
}

/* The expression as readable pseudo-source for comments (names sanitised). */
static void expr_comment(struct em *em, int32_t e)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	switch (x->op) {
	case KVP_OP_NUM: {
		char b[64];
		snprintf(b, sizeof b, "%.17g", x->num);
		out(em, "%s", b);
		return;
	}
	case KVP_OP_PARAM: comment_name(em, ir->params[x->index].name); return;
	case KVP_OP_STAT: comment_name(em, ir->stats[x->index].name); return;
	case KVP_OP_SIGNAL: out(em, "%s", kvp_ir_signal_name(x->sig)); return;
	case KVP_OP_NEG: out(em, "-"); expr_comment(em, x->a); return;
	case KVP_OP_NOT: out(em, "not "); expr_comment(em, x->a); return;
	case KVP_OP_ADD: case KVP_OP_SUB: case KVP_OP_MUL: case KVP_OP_DIV:
	case KVP_OP_LT: case KVP_OP_LE: case KVP_OP_GT: case KVP_OP_GE: case KVP_OP_EQ:
	case KVP_OP_NE: case KVP_OP_AND: case KVP_OP_OR:
		out(em, "(");
		expr_comment(em, x->a);
		out(em, " %s ", kvp_ir_op_name(x->op));
		expr_comment(em, x->b);
		out(em, ")");
		return;
	case KVP_OP_SELECT:
		out(em, "if(");
		expr_comment(em, x->a);
		out(em, ", ");
		expr_comment(em, x->b);
		out(em, ", ");
		expr_comment(em, x->c);
		out(em, ")");
		return;
	case KVP_OP_CAOTE:
		out(em, "caote(");
		expr_comment(em, x->a);
		out(em, ", %s)", x->mode == KVP_CAOTE_FAST ? "fast" : "exact");
		return;
	default:
		out(em, "%s(", kvp_ir_op_name(x->op));
		expr_comment(em, x->a);
		if (x->b >= 0) {
			out(em, ", ");
			expr_comment(em, x->b);
		}
		out(em, ")");
		return;
	}
}

/* 1 if expression e (or anything below it) uses signal s. */
static int uses_signal(const struct kvp_ir *ir, int32_t e, enum kvp_ir_signal s)
{
	if (e < 0)
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if (x->op == KVP_OP_SIGNAL)
		return x->sig == s;
	return uses_signal(ir, x->a, s) || uses_signal(ir, x->b, s) || uses_signal(ir, x->c, s);
}

/* Scalar expression e, or the default d when e < 0. */
static void scalar_or(struct em *em, int32_t e, double d)
{
	if (e >= 0)
		expr(em, e, E_SCALAR);
	else
		num(em, d);
}

/* ---- sections ----------------------------------------------------------------------- */

static const char *hist_name(enum kvp_ir_history h)
{
	return h == KVP_HIST_WHOLE ? "the whole history" :
	       h == KVP_HIST_LAST_STEPS ? "the last steps (ring)" : "the prompt tail";
}

static void emit_header(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	out(em, "/* generated from ");
	comment_path(em, ir->source);
	out(em, " by kvpc %s \xe2\x80\x94 do not edit */\n", KVP_VERSION);
	out(em, "/*\n * Policy ");
	comment_name(em, ir->name);
	out(em, " (source hash %.16s) compiled to the hooks of the policy ABI\n",
	    strspn(ir->source_hash, "0123456789abcdef") >= 16 ? ir->source_hash : "0000000000000000");
	out(em, " * (runtime/policy/rt_policy.h) with the kernel templates of kernels/ instantiated.\n");
	out(em, " * Statistics, 4-byte words per entry: %u shared, then %u per query head.\n",
	    ir->stat_words_entry, ir->stat_words_qhead);
	if (ir->uses_obs_count)
		out(em, " *   word %d (shared): steps the entry was visible\n", (int)ir->obs_count_word);
	for (int i = 0; i < ir->n_stats; i++) {
		const struct kvp_ir_stat *s = &ir->stats[i];
		out(em, " *   stat_%d ", i);
		comment_name(em, s->name);
		out(em, " = %s(", kvp_ir_stat_kind_name(s->kind));
		expr_comment(em, s->arg);
		out(em, ") over %s: %s words %d..%d\n", hist_name(s->hist),
		    s->per_qhead ? "per query head," : "shared,", (int)s->word,
		    (int)(s->word + s->n_words - 1));
	}
	for (int i = 0; i < ir->n_consts; i++) {
		char b[64];
		snprintf(b, sizeof b, "%.17g", ir->consts[i].value);
		out(em, " *   const ");
		comment_name(em, ir->consts[i].name);
		out(em, " = %s (folded into the code)\n", b);
	}
	for (int i = 0; i < ir->n_params; i++) {
		out(em, " *   param %d ", i);
		comment_name(em, ir->params[i].name);
		out(em, " (%s)\n", kvp_unit_name(ir->params[i].unit));
	}
	out(em, " */\n");
	out(em, "#include <math.h>\n#include <stddef.h>\n#include <stdint.h>\n\n");
	out(em, "#include \"k_compress.h\"\n");
	if (kvp_ir_grace_core(ir))
		out(em, "#include \"k_grace_run.h\"\n");
	if (ir->needs & KVP_NEED_QUERY)
		out(em, "#include \"k_expattn.h\"\n");
	out(em, "#include \"k_score.h\"\n#include \"k_signal.h\"\n");
	out(em, "#include \"k_stat.h\"\n#include \"kv/rt_kv.h\"\n#include \"policy/rt_policy.h\"\n\n");
	out(em, "#include <string.h>\n\n");
	out(em, "/* Hooks and helpers keep the signatures of the ABI and the kernels; each policy reads\n"
	        " * only some of their arguments. */\n"
	        "#pragma GCC diagnostic ignored \"-Wunused-parameter\"\n\n");
	out(em, "#define STAT_WORDS_ENTRY %uu\n#define STAT_WORDS_QHEAD %uu\n\n",
	    ir->stat_words_entry, ir->stat_words_qhead);
	if (ir->needs & KVP_NEED_OUT)
		out(em, "/* per-head state: the attention output of each query head at the latest step */\n"
		        "_Static_assert(K_OUT_MAX_GROUP == %d, \"kvpc and kernels/k_score.h disagree on the output rows\");\n\n",
		    KVP_IR_OUT_ROWS);
	if (ir->needs & KVP_NEED_QUERY)
		out(em, "/* per-head state%s: Expected Attention's query statistics (kernels/k_expattn.h) */\n"
		        "_Static_assert(K_EA_MAX_GROUP == %d, \"kvpc and kernels/k_expattn.h disagree on the query rows\");\n"
		        "#define EA_STATE(h, d) ((float *)(void *)((h)->state%s))\n\n",
		    (ir->needs & KVP_NEED_OUT) ? ", after the output rows" : "", KVP_IR_EA_ROWS,
		    (ir->needs & KVP_NEED_OUT) ? " + (size_t)K_OUT_MAX_GROUP * (size_t)(d) * sizeof(float)" : "");
}

/* Mark e and every node below it. */
static void mark_tree(const struct kvp_ir *ir, int32_t e, unsigned char *mark)
{
	if (e < 0 || mark[e])
		return;
	mark[e] = 1;
	mark_tree(ir, ir->nodes[e].a, mark);
	mark_tree(ir, ir->nodes[e].b, mark);
	mark_tree(ir, ir->nodes[e].c, mark);
}

/* Under e (a trigger limit or target): mark the copies of the budget's expression, which
 * the emitted code replaces by budget_of() (see expr). */
static void mark_budget_copies(const struct kvp_ir *ir, int32_t e, unsigned char *mark)
{
	if (e < 0)
		return;
	if (kvp_ir_same_tree(ir, e, ir->alloc.budget)) {
		mark_tree(ir, e, mark);
		return;
	}
	mark_budget_copies(ir, ir->nodes[e].a, mark);
	mark_budget_copies(ir, ir->nodes[e].b, mark);
	mark_budget_copies(ir, ir->nodes[e].c, mark);
}

/* 1 when every reference to parameter i lies in the budget's expression (or a copy of it
 * that follows the budget): a compression-ratio override then replaces it (kvp_param's
 * budget_only). The front end lowers each use of a name to nodes of its own
 * (kvp_ir_param_ref), so a parameter used by a guard or a score as well has a reference
 * outside. */
static int param_budget_only(const struct kvp_ir *ir, int i, const unsigned char *mark)
{
	int refs = 0;
	for (int32_t e = 0; e < ir->n_nodes; e++)
		if (ir->nodes[e].op == KVP_OP_PARAM && ir->nodes[e].index == i) {
			if (!mark[e])
				return 0;
			refs++;
		}
	return refs > 0;
}

static void emit_tables(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->n_params > 0) {
		unsigned char *mark = calloc((size_t)ir->n_nodes + 1, 1);
		RT_ASSERT(mark != NULL);
		if (ir->alloc.budget >= 0 && ir->trigger.kind != KVP_TRIG_NEVER) {
			mark_tree(ir, ir->alloc.budget, mark);
			mark_budget_copies(ir, ir->trigger.target, mark);
			mark_budget_copies(ir, ir->trigger.threshold, mark);
		}
		out(em, "static const struct kvp_param policy_params[%d] = {\n", ir->n_params);
		for (int i = 0; i < ir->n_params; i++) {
			const struct kvp_ir_param *p = &ir->params[i];
			line_src(em, p->loc);
			out(em, "\t{ \"");
			cstr_into(em, p->name);
			out(em, "\", ");
			num(em, p->def);
			/* ORDER(unit): enum kvp_unit (runtime/policy/rt_policy.h), by name */
			static const char *const units[KVP_UNIT_COUNT_] = {
				[KVP_UNIT_SCALAR] = "KVP_UNIT_SCALAR", [KVP_UNIT_ENTRIES] = "KVP_UNIT_ENTRIES",
				[KVP_UNIT_TOKENS] = "KVP_UNIT_TOKENS", [KVP_UNIT_RATIO] = "KVP_UNIT_RATIO",
				[KVP_UNIT_STEPS] = "KVP_UNIT_STEPS",
			};
			out(em, ", %s, \"", (unsigned)p->unit < KVP_UNIT_COUNT_ ? units[p->unit] : units[0]);
			cstr_into(em, p->doc);
			out(em, "\", %d },\n", param_budget_only(ir, i, mark));
		}
		free(mark);
		line_back(em);
		out(em, "};\n\n");
	}
	if (ir->trigger.kind == KVP_TRIG_NEVER)
		return; /* spans and layer lists are read only by compress */
	if (ir->guards.n_spans > 0) {
		out(em, "static const char *const policy_spans[%d] = {\n", ir->guards.n_spans);
		for (int i = 0; i < ir->guards.n_spans; i++) {
			out(em, "\t\"");
			cstr_into(em, ir->guards.spans[i]);
			out(em, "\",\n");
		}
		out(em, "};\n\n");
	}
	if (ir->tiers.n > 0) {
		/* ORDER(tier): enum rt_kv_tier (runtime/kv/rt_kv.h), by name */
		static const char *const tiers[KVP_IR_MAX_TIERS] = {
			"RT_KV_TIER_TOP", "RT_KV_TIER_Q8", "RT_KV_TIER_Q4", "RT_KV_TIER_Q2",
		};
		const struct kvp_ir_tiers *t = &ir->tiers;
		out(em, "/* precision: the storage tiers, highest precision first%s */\n",
		    t->kind == K_TIERS_SHARES ? ", and their cumulative shares of\n * the kept entries by score rank" :
		                "; each entry is evicted or\n * given one by utility per byte (kernels/k_tier.h)");
		out(em, "static const uint8_t policy_tiers[%d] = {", t->n);
		for (int j = 0; j < t->n; j++)
			out(em, "%s %s", j ? "," : "", tiers[t->tier[j]]);
		out(em, " };\n");
		if (t->kind == K_TIERS_SHARES) {
			out(em, "static const double policy_tier_cum[%d] = {", t->n);
			for (int j = 0; j < t->n; j++) {
				out(em, "%s ", j ? "," : "");
				num(em, t->cum[j]);
			}
			out(em, " };\n");
		}
		out(em, "\n");
	}
	if (ir->alloc.layers == K_LAYERS_LIST && ir->alloc.n_list > 0) {
		out(em, "static const double policy_layer_list[%d] = {\n", ir->alloc.n_list);
		for (int i = 0; i < ir->alloc.n_list; i++) {
			out(em, "\t");
			num(em, ir->alloc.list[i]);
			out(em, ",\n");
		}
		out(em, "};\n\n");
	}
}

static const struct local P_LOCAL[] = { { "P", "const double *P = ctx->params;" } };

static void budget_body(struct em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir *ir = em->ir;
	line_src(em, ir->alloc.loc);
	out(em, "\treturn k_budget_of(ctx->ratio, ctx->byte_ratio, k_context(ctx, seen), ");
	expr(em, ir->alloc.budget, E_SCALAR);
	out(em, ");\n");
	line_back(em);
}

/* budget_of: the policy's budget, or the runtime's compression-ratio override. */
static void emit_budget(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->alloc.budget < 0)
		return;
	if (ir->alloc.budget_bytes || ir->tiers.n > 0)
		out(em, "/* budget_of: per head on average, entries or (in bytes, k_bytes_mode) the bytes of\n"
		        " * that many f16 entries: the policy's budget, or context / R under a compression\n"
		        " * ratio R in entries (kvp_ctx.ratio) or in bytes (kvp_ctx.byte_ratio). */\n");
	else
		out(em, "/* budget_of: entries per head on average: the policy's budget, or context / R when\n"
		        " * the runtime overrides it with a compression ratio R (kvp_ctx.ratio, or\n"
		        " * kvp_ctx.byte_ratio: the bytes of that many f16 entries). */\n");
	out(em, "static inline double budget_of(const struct kvp_ctx *ctx, const rt_kv *kv, double seen)\n{\n");
	with_locals(em, P_LOCAL, 1, budget_body, NULL);
	out(em, "}\n\n");
}

/* The body of stat_read_k: its value read out of the entry's words. */
static void stat_read_body(struct em *em, const void *arg)
{
	const struct kvp_ir *ir = em->ir;
	const int k = *(const int *)arg;
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
		line_src(em, s->loc);
		out(em, "\tconst double tail = k_stat_tail_steps(ctx->seen, ctx->prompt_len, ");
		expr(em, s->window, E_SCALAR);
		out(em, ");\n");
		line_back(em);
		out(em, "\treturn k_stat_mean(k_stat_getf(w), fmin(%s, tail));\n", steps);
	} else if (ring && s->kind == KVP_STAT_COUNT) {
		out(em, "\treturn k_stat_ring_count(w, %d);\n", (int)s->ring);
	} else if (ring && s->kind == KVP_STAT_MEAN) {
		out(em, "\treturn k_stat_mean(k_stat_ring_sum(w, %d), %s);\n", (int)s->ring, steps);
	} else if (ring) {
		out(em, "\treturn k_stat_ring_sum(w, %d);\n", (int)s->ring);
	} else if (s->kind == KVP_STAT_MEAN) {
		out(em, "\treturn k_stat_mean(k_stat_getf(w), %s);\n", steps);
	} else {
		out(em, "\treturn k_stat_getf(w);\n");
	}
}

static void emit_stat_reads(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	for (int k = 0; k < ir->n_stats; k++) {
		const struct kvp_ir_stat *s = &ir->stats[k];
		out(em, "/* stat_%d ", k);
		comment_name(em, s->name);
		out(em, ": its value at compress time */\n");
		out(em, "static inline double stat_read_%d(const struct kvp_ctx *ctx, const rt_kv *kv,\n"
		        "                                  const rt_kv_head *h, int32_t i, int r)\n{\n", k);
		char wdecl[128];
		if (s->per_qhead)
			snprintf(wdecl, sizeof wdecl,
			         "const uint32_t *w = b + STAT_WORDS_ENTRY + (size_t)r * STAT_WORDS_QHEAD + %d;",
			         (int)s->word);
		else
			snprintf(wdecl, sizeof wdecl, "const uint32_t *w = b + %d;", (int)s->word);
		const struct local loc[] = {
			{ "P", "const double *P = ctx->params;" },
			{ "seen", "const double seen = (double)ctx->seen;" },
			{ "b", "const uint32_t *b = k_stat_block(kv, h, i);" },
			{ "w", wdecl },
		};
		with_locals(em, loc, 4, stat_read_body, &k);
		out(em, "}\n\n");
	}
}

/* The update statement of stat k with value x_k (inside the entry loop). */
static void stat_update(struct em *em, int k, const char *ind)
{
	const struct kvp_ir_stat *s = &em->ir->stats[k];
	const char *w = s->per_qhead ? "q" : "b";
	line_src(em, s->loc);
	out(em, "%sconst double x_%d = ", ind, k);
	expr(em, s->arg, E_OBSERVE);
	out(em, ";\n");
	line_back(em);
	if (s->hist == KVP_HIST_PROMPT_TAIL)
		out(em, "%sif (tail_%d)\n%s\t", ind, k, ind);
	else
		out(em, "%s", ind);
	int ring = s->hist == KVP_HIST_LAST_STEPS;
	switch (s->kind) {
	case KVP_STAT_SUM:
	case KVP_STAT_MEAN:
		if (ring)
			out(em, "k_stat_ring_put(%s + %d, %d, ob->step, x_%d);\n", w, (int)s->word,
			    (int)s->ring, k);
		else
			out(em, "k_stat_sum(%s + %d, x_%d);\n", w, (int)s->word, k);
		break;
	case KVP_STAT_COUNT:
		if (ring)
			out(em, "k_stat_ring_put_bit(%s + %d, %d, ob->step, x_%d);\n", w, (int)s->word,
			    (int)s->ring, k);
		else
			out(em, "k_stat_count(%s + %d, x_%d);\n", w, (int)s->word, k);
		break;
	case KVP_STAT_EMA:
		out(em, "k_stat_ema(%s + %d, x_%d, alpha_%d);\n", w, (int)s->word, k, k);
		break;
	default:
		out(em, "k_stat_last(%s + %d, x_%d);\n", w, (int)s->word, k);
		break;
	}
}

/* The body of observe: the output store, then the fused statistic loop. */
static void observe_body(struct em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir *ir = em->ir;
	const int keep_out = (ir->needs & KVP_NEED_OUT) != 0;
	int any_q = 0, any_e = 0;
	for (int k = 0; k < ir->n_stats; k++) {
		if (ir->stats[k].per_qhead)
			any_q = 1;
		else
			any_e = 1;
	}
	if (keep_out)
		out(em, "\t/* exact CAOTE: the true attention output of each query head at this step */\n"
		        "\tif (ob->out)\n\t\tk_out_store(h->state, ob->out, ob->group, d);\n");
	if (ir->needs & KVP_NEED_QUERY) {
		int32_t ea = -1;
		for (int32_t v = 0; v < ir->n_nodes && ea < 0; v++)
			if (ir->nodes[v].op == KVP_OP_EXPATTN)
				ea = v;
		RT_ASSERT(ea >= 0);
		line_src(em, ir->nodes[ea].loc);
		out(em, "\t/* Expected Attention: the running mean and co-moment of each query head's\n"
		        "\t * pre-RoPE queries at positions >= skip (kernels/k_expattn.h) */\n"
		        "\tif (ob->query && (double)ob->step >= ");
		expr(em, ir->nodes[ea].b, E_SCALAR);
		out(em, ")\n\t\tk_ea_observe(EA_STATE(h, d), ob->query, ob->group, d);\n");
		line_back(em);
	}
	if (ir->n_stats == 0)
		return;
	for (int k = 0; k < ir->n_stats; k++) {
		const struct kvp_ir_stat *s = &ir->stats[k];
		if (s->kind == KVP_STAT_EMA) {
			line_src(em, s->loc);
			out(em, "\tconst double alpha_%d = ", k);
			expr(em, s->alpha, E_SCALAR);
			out(em, ";\n");
			line_back(em);
		}
		if (s->hist == KVP_HIST_PROMPT_TAIL) {
			line_src(em, s->loc);
			out(em, "\tconst int tail_%d = k_stat_in_prompt_tail(ob->step, ctx->prompt_len, ", k);
			expr(em, s->window, E_SCALAR);
			out(em, ");\n");
			line_back(em);
		}
	}
	out(em, "\tfor (int32_t i = 0; i < n; i++) {\n");
	out(em, "\t\tuint32_t *b = k_stat_block(kv, h, i);\n");
	if (ir->uses_obs_count)
		out(em, "\t\tk_stat_sum(b + %d, 1.0);\n", (int)ir->obs_count_word);
	if (any_e)
		for (int k = 0; k < ir->n_stats; k++)
			if (!ir->stats[k].per_qhead)
				stat_update(em, k, "\t\t");
	if (any_q) {
		out(em, "\t\tfor (int r = 0; r < ob->group; r++) {\n");
		out(em, "\t\t\tconst double attn = ob->probs[(size_t)r * (size_t)n + (size_t)i];\n");
		out(em, "\t\t\tuint32_t *q = b + STAT_WORDS_ENTRY + (size_t)r * STAT_WORDS_QHEAD;\n");
		for (int k = 0; k < ir->n_stats; k++)
			if (ir->stats[k].per_qhead)
				stat_update(em, k, "\t\t\t");
		out(em, "\t\t}\n");
	}
	out(em, "\t}\n");
}

static void emit_observe(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->n_stats == 0 && !(ir->needs & (KVP_NEED_OUT | KVP_NEED_QUERY)))
		return;
	out(em, "/* observe: one step (query token ob->step) over head (layer, kv_head); updates\n"
	        " * every statistic of the ob->n visible entries (k_stat.h templates, fused). */\n");
	out(em, "static void observe(const struct kvp_ctx *ctx, rt_kv *kv, int layer, int kv_head,\n"
	        "                    const struct kvp_obs *ob)\n{\n");
	static const struct local loc[] = {
		{ "h", "rt_kv_head *h = rt_kv_head_at(kv, layer, kv_head);" },
		{ "P", "const double *P = ctx->params;" },
		{ "seen", "const double seen = (double)(ob->step + 1);" },
		{ "n", "const int32_t n = ob->n;" },
		{ "d", "const int d = kv->head_dim;" },
	};
	with_locals(em, loc, 5, observe_body, NULL);
	out(em, "}\n\n");
}

/* The body of score_q: the whole-head transforms, then the elementwise tree. */
static void score_body(struct em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir *ir = em->ir;
	int32_t e = ir->score.expr;
	if (uses_signal(ir, e, KVP_SIG_KEY_COS_MEAN))
		out(em, "\tk_key_anchor(h->k, n, d, vec + d);\n");
	for (int32_t v = 0; v <= e; v++) {
		if (em->vec_of[v] < 0)
			continue;
		const struct kvp_ir_expr *x = &ir->nodes[v];
		line_src(em, x->loc);
		if (x->op == KVP_OP_EXPATTN) {
			out(em, "\tk_ea_score(tmp + (size_t)%d * cap, h->k, h->pos, n, d, EA_STATE(h, d), r, seen,\n"
			        "\t           (double)(", (int)em->vec_of[v]);
			expr(em, x->a, E_SCALAR);
			out(em, "), (double)(");
			expr(em, x->b, E_SCALAR);
			out(em, "), ctx->rope_base, ctx->n_rot, vec);\n");
			line_back(em);
			continue;
		}
		out(em, "\tfor (int32_t i = 0; i < n; i++)\n\t\ttmp[(size_t)%d * cap + (size_t)i] = (float)",
		    (int)em->vec_of[v]);
		expr(em, x->a, E_SCORE);
		out(em, ";\n");
		line_back(em);
		if (x->op == KVP_OP_CAOTE && x->mode == KVP_CAOTE_FAST)
			out(em, "\tk_caote(tmp + (size_t)%d * cap, h->v, n, d, NULL, vec);\n",
			    (int)em->vec_of[v]);
		else if (x->op == KVP_OP_CAOTE)
			out(em, "\tk_caote(tmp + (size_t)%d * cap, h->v, n, d, k_out_row(h->state, r, d), vec);\n",
			    (int)em->vec_of[v]);
		else
			out(em, "\tk_normalize(tmp + (size_t)%d * cap, n);\n", (int)em->vec_of[v]);
	}
	line_src(em, ir->score.loc.line > 0 ? ir->score.loc : ir->nodes[e].loc);
	out(em, "\tfor (int32_t i = 0; i < n; i++)\n\t\tout[i] = (float)");
	expr(em, e, E_SCORE);
	out(em, ";\n");
	line_back(em);
}

static void emit_score(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	int32_t e = ir->score.expr;
	if (e < 0 || ir->trigger.kind == KVP_TRIG_NEVER)
		return; /* no score, or no compress to use it */
	out(em, "/* score_q: the score of every entry of h for query head r (lowest evicted first):\n"
	        " *   ");
	expr_comment(em, e);
	out(em, "\n */\n");
	out(em, "static void score_q(const struct kvp_ctx *ctx, const rt_kv *kv, const rt_kv_head *h,\n"
	        "                    int layer, int r, float *out, float *tmp, double *vec)\n{\n");
	static const struct local loc[] = {
		{ "P", "const double *P = ctx->params;" },
		{ "seen", "const double seen = (double)ctx->seen;" },
		{ "n", "const int32_t n = h->n;" },
		{ "d", "const int d = kv->head_dim;" },
		{ "cap", "const size_t cap = (size_t)kv->cap;" },
	};
	with_locals(em, loc, 5, score_body, NULL);
	out(em, "}\n\n");
}

/* target expression (or budget) of compress and the trigger */
static void target_expr(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->trigger.target >= 0) {
		em->subst_budget = 1;
		expr(em, ir->trigger.target, E_SCALAR);
		em->subst_budget = 0;
	} else {
		out(em, "budget_of(ctx, kv, seen)");
	}
}

/* The body of fires: the trigger's condition. */
static void fires_body(struct em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir_trig *tr = &em->ir->trigger;
	/* with a precision action a schedule fires whatever the entry count: the entries that
	 * left the recent window are downgraded even when none is evicted */
	const int tiered = em->ir->tiers.n > 0;
	line_src(em, tr->loc);
	switch (tr->kind) {
	case KVP_TRIG_NEVER:
		out(em, "\treturn 0;\n");
		break;
	case KVP_TRIG_EVERY_STEP:
		if (tiered) {
			out(em, "\treturn 1;\n");
			break;
		}
		out(em, "\treturn entries > ");
		target_expr(em);
		out(em, ";\n");
		break;
	case KVP_TRIG_OVER_BUDGET:
		out(em, "\treturn entries > ");
		if (tr->threshold >= 0) {
			em->subst_budget = 1;
			expr(em, tr->threshold, E_SCALAR);
			em->subst_budget = 0;
		} else
			out(em, "budget_of(ctx, kv, seen)");
		out(em, ";\n");
		break;
	case KVP_TRIG_EVERY_N:
		out(em, "\treturn k_every(seen, ");
		scalar_or(em, tr->n, 1);
		if (tiered) {
			out(em, ");\n");
			break;
		}
		out(em, ") && entries > ");
		target_expr(em);
		out(em, ";\n");
		break;
	case KVP_TRIG_PROMPT_END:
		out(em, "\treturn ctx->prompt_len >= 0 && seen == (double)ctx->prompt_len%s", tiered ? ";\n" : " && entries > ");
		if (tiered)
			break;
		target_expr(em);
		out(em, ";\n");
		break;
	case KVP_TRIG_PREFILL_BLOCK:
		if (tr->prompt_only)
			out(em, "\tif (ctx->prompt_len >= 0 && seen > (double)ctx->prompt_len)\n"
			        "\t\treturn 0; /* blocks of the prompt only */\n");
		out(em, "\treturn (k_every(seen, ");
		scalar_or(em, tr->n, 1);
		out(em, ") || (ctx->prompt_len >= 0 && seen == (double)ctx->prompt_len))%s",
		    tiered ? ";\n" : " && entries > ");
		if (tiered)
			break;
		target_expr(em);
		out(em, ";\n");
		break;
	}
	line_back(em);
}

static void emit_trigger(struct em *em)
{
	out(em, "/* fires: would the trigger fire after `seen` tokens with `entries` entries per head\n"
	        " * on average? (should_compress asks now; next_trigger asks ahead) */\n");
	out(em, "static int fires(const struct kvp_ctx *ctx, const rt_kv *kv, double seen, double entries)\n{\n");
	with_locals(em, P_LOCAL, 1, fires_body, NULL);
	out(em, "}\n\n");
	out(em, "static int should_compress(const struct kvp_ctx *ctx, const rt_kv *kv)\n{\n");
	out(em, "\treturn fires(ctx, kv, (double)ctx->seen, k_avg_entries(kv));\n}\n\n");
	out(em, "/* next_trigger: the first k (tokens) after which fires() may hold, bounded by the\n"
	        " * room left in the store; 0 when no head has room. */\n");
	out(em, "static int32_t next_trigger(const struct kvp_ctx *ctx, const rt_kv *kv)\n{\n");
	out(em, "\tconst int32_t room = k_room(kv);\n");
	out(em, "\tconst double seen = (double)ctx->seen, avg = k_avg_entries(kv);\n");
	out(em, "\tfor (int32_t k = 1; k <= room; k++)\n");
	out(em, "\t\tif (fires(ctx, kv, seen + k, avg + k))\n\t\t\treturn k;\n");
	out(em, "\treturn room;\n}\n\n");
}

/* `FIELD = value;` for a GraceKV value that was written (e >= 0); the kernel's default
 * (k_grace_cfg_default) stands otherwise. int_field: the field is an int (a length). */
static void emit_grace_field(struct em *em, const char *field, int32_t e, int int_field)
{
	if (e < 0)
		return;
	out(em, "\t%s = %s", field, int_field ? "(int)(" : "");
	expr(em, e, E_SCALAR);
	out(em, "%s;\n", int_field ? ")" : "");
}

static void emit_grace_opt(struct em *em, const char *field, int32_t e)
{
	emit_grace_field(em, field, e, 0);
}

/* The segmentation (`segment`) and prototype (`tree`) values of gc. ORDER(proto count):
 * ir->action.count 0/1 to K_PROTO_COUNT_COHERENCE / K_PROTO_COUNT_N (kernels/k_proto.h). */
static void emit_grace_tree(struct em *em)
{
	const struct kvp_ir_act *ac = &em->ir->action;
	line_src(em, ac->seg_loc);
	out(em, "\tgc->slot = ");
	scalar_or(em, ac->run, 64);
	out(em, ";\n");
	if (ac->seg_fixed)
		out(em, "\tgc->seg_fixed = 1;\n");
	emit_grace_field(em, "gc->seg.min_len", ac->seg_min, 1);
	emit_grace_field(em, "gc->seg.max_len", ac->seg_max, 1);
	emit_grace_opt(em, "gc->seg.cut", ac->seg_cut);
	emit_grace_opt(em, "gc->seg.length", ac->seg_length);
	emit_grace_opt(em, "gc->seg.stability", ac->seg_stability);
	emit_grace_opt(em, "gc->seg.surprisal", ac->seg_surprisal);
	if (ac->n_win > 0) {
		out(em, "\tgc->seg.n_win = %d;\n", ac->n_win);
		for (int i = 0; i < ac->n_win; i++)
			out(em, "\tgc->seg.win[%d] = %d;\n", i, (int)ac->win[i]);
	}
	line_back(em);
	if (ac->count == 0 && ac->smooth < 0)
		return;
	line_src(em, ac->tree_loc);
	if (ac->count == 1)
		out(em, "\tgc->count_mode = K_PROTO_COUNT_N;\n");
	emit_grace_opt(em, "gc->smooth", ac->smooth);
	line_back(em);
}

/* GraceKV's values in a struct k_grace_cfg (kernels/k_grace_run.h), from the
 * policy's guards, allocation, action and question window. */
static void emit_grace_cfg(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	out(em, "\tk_grace_cfg_default(gc);\n");
	out(em, "\tgc->name = cfg->name;\n\tgc->budget = cfg->budget;\n");
	out(em, "\tgc->sinks = cfg->has_sinks ? cfg->sinks : gc->sinks;\n");
	out(em, "\tgc->recent = cfg->has_recent ? cfg->recent : 0;\n");
	line_src(em, ir->alloc.loc);
	out(em, "\tgc->head_share = fmin(1.0, fmax(0.0, ");
	scalar_or(em, ir->alloc.floor, 0);
	out(em, "));\n");
	line_back(em);
	line_src(em, ir->action.loc);
	out(em, "\tgc->floor = ");
	scalar_or(em, ir->action.floor, 0);
	out(em, ";\n");
	if (ir->action.floor_all)
		out(em, "\tgc->floor_each = 0;\n");
	emit_grace_opt(em, "gc->lambda_z", ir->action.mass);
	emit_grace_opt(em, "gc->lambda_m", ir->action.numerator);
	line_back(em);
	emit_grace_tree(em);
	/* the question: the window of the first prompt-tail statistic, else the default */
	for (int k = 0; k < ir->n_stats; k++)
		if (ir->stats[k].hist == KVP_HIST_PROMPT_TAIL && ir->stats[k].window >= 0) {
			line_src(em, ir->stats[k].loc);
			out(em, "\tgc->probe = ");
			expr(em, ir->stats[k].window, E_SCALAR);
			out(em, ";\n");
			line_back(em);
			break;
		}
	if (ir->score.pool != K_POOL_NONE) {
		double k = 1;
		kvp_ir_fold(ir, ir->score.kernel, &k);
		out(em, "\tgc->pool = %d;\n\tgc->pool_max = %d;\n", (int)k, ir->score.pool == K_POOL_MAX);
	}
	if (ir->guards.protect_all_spans)
		out(em, "\tgc->protect_all_spans = 1;\n");
	if (ir->guards.n_spans > 0)
		out(em, "\tgc->spans = policy_spans;\n\tgc->n_spans = %d;\n", ir->guards.n_spans);
}

/* The score's reduction, pooling and the guards of cfg. */
static void emit_cfg_score_guards(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_score *sc = &ir->score;
	int has_score = sc->expr >= 0;
	out(em, "\tcfg->has_score = %d;\n", has_score);
	/* -1: the score is query-head independent, computed once (K_REDUCE_NONE implies it) */
	int per_q = has_score && kvp_ir_expr_per_qhead(ir, sc->expr);
	out(em, "\tcfg->reduce = %s;\n", per_q ? K_REDUCE_NAMES[sc->reduce] : "-1");
	out(em, "\tcfg->over_layer = %d;\n", sc->over_layer);
	if (sc->pool != K_POOL_NONE) {
		double k = 1;
		kvp_ir_fold(ir, sc->kernel, &k);
		out(em, "\tcfg->pool = %s;\n\tcfg->kernel = %d;\n\tcfg->pool_before_reduce = %d;\n",
		    K_POOL_NAMES[sc->pool], (int)k, sc->pool_before_reduce);
	}
	out(em, "\tcfg->n_tmp = %d;\n", em->n_vec);
	out(em, "\tcfg->reads_rows = %d;\n", (ir->needs & (KVP_NEED_KEYS | KVP_NEED_VALUES)) != 0);
	out(em, "\tcfg->keep_order = %d;\n", ir->positions == KVP_POS_COMPACTED);
	line_src(em, ir->alloc.loc);
	out(em, "\tcfg->target = ");
	target_expr(em);
	out(em, ";\n");
	line_back(em);
	if (ir->guards.sinks >= 0 || ir->guards.recent >= 0) {
		int follow = 0;
		for (int g = 0; g < 2; g++) {
			int32_t e = g ? ir->guards.recent : ir->guards.sinks;
			follow |= uses_signal(ir, e, KVP_SIG_CONTEXT) || uses_signal(ir, e, KVP_SIG_SEEN) ||
			          uses_signal(ir, e, KVP_SIG_PROMPT_LEN) || uses_signal(ir, e, KVP_SIG_BUDGET);
		}
		if (follow)
			out(em, "\tcfg->guards_follow_context = 1;\n");
		line_src(em, ir->guards.loc);
		if (ir->guards.sinks >= 0) {
			out(em, "\tcfg->has_sinks = 1;\n\tcfg->sinks = ");
			expr(em, ir->guards.sinks, E_SCALAR);
			out(em, ";\n");
		}
		if (ir->guards.recent >= 0) {
			out(em, "\tcfg->has_recent = 1;\n\tcfg->recent = ");
			expr(em, ir->guards.recent, E_SCALAR);
			out(em, ";\n");
		}
		line_back(em);
	}
	if (ir->guards.protect_all_spans)
		out(em, "\tcfg->protect_all_spans = 1;\n");
	if (ir->guards.n_spans > 0)
		out(em, "\tcfg->spans = policy_spans;\n\tcfg->n_spans = %d;\n", ir->guards.n_spans);
}

/* The allocation and the action of cfg. */
static void emit_cfg_alloc_action(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_alloc *al = &ir->alloc;
	out(em, "\tcfg->layers = %s;\n", K_LAYERS_NAMES[al->layers]);
	if (al->layers == K_LAYERS_PYRAMID || al->layers == K_LAYERS_FUNNEL) {
		out(em, "\tcfg->beta = ");
		scalar_or(em, al->beta, 20);
		out(em, ";\n");
	} else if (al->layers == K_LAYERS_LINEAR) {
		out(em, "\tcfg->from = ");
		scalar_or(em, al->from, 1);
		out(em, ";\n\tcfg->to = ");
		scalar_or(em, al->to, 1);
		out(em, ";\n");
	} else if (al->layers == K_LAYERS_LIST && al->n_list > 0) {
		out(em, "\tcfg->list = policy_layer_list;\n\tcfg->n_list = %d;\n", al->n_list);
	}
	out(em, "\tcfg->heads = %s;\n", K_HEADS_NAMES[al->heads]);
	if (al->heads != K_HEADS_EACH) {
		out(em, "\tcfg->floor_frac = fmin(1.0, fmax(0.0, ");
		scalar_or(em, al->floor, 0.2);
		out(em, "));\n");
	}
	if (kvp_ir_grace_core(ir))
		return; /* GraceKV's actions read their values from the k_grace_cfg */
	line_src(em, ir->action.loc);
	out(em, "\tcfg->action = %s;\n", K_ACT_NAMES[ir->action.kind]);
	if (ir->action.kind != K_ACT_EVICT) {
		out(em, "\tcfg->run = ");
		scalar_or(em, ir->action.run, 0);
		out(em, ";\n");
	}
	if (ir->action.kind == K_ACT_SPLIT) {
		out(em, "\tcfg->single_floor = ");
		scalar_or(em, ir->action.floor, 0);
		out(em, ";\n");
	}
	line_back(em);
}

static void config_body(struct em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir *ir = em->ir;
	out(em, "\tmemset(cfg, 0, sizeof *cfg);\n");
	out(em, "\tcfg->name = \"");
	cstr_into(em, ir->name);
	out(em, "\";\n\tcfg->budget = budget_of(ctx, kv, seen);\n");
	if (ir->alloc.budget_unit == KVP_UNIT_RATIO)
		out(em, "\tcfg->budget_shared = 1;\n");
	if (ir->alloc.budget_bytes)
		out(em, "\tcfg->budget_bytes = 1;\n");
	emit_cfg_score_guards(em);
	emit_cfg_alloc_action(em);
	if (ir->tiers.n > 0) {
		line_src(em, ir->tiers.loc);
		out(em, "\tcfg->tiers = %s;\n\tcfg->n_tier = %d;\n\tcfg->tier = policy_tiers;\n",
		    K_TIERS_NAMES[ir->tiers.kind], ir->tiers.n);
		if (ir->tiers.kind == K_TIERS_SHARES)
			out(em, "\tcfg->tier_cum = policy_tier_cum;\n");
		line_back(em);
	}
}

static void grace_config_body(struct em *em, const void *arg)
{
	(void)arg;
	emit_grace_cfg(em);
}

/* config(): the policy's compress configuration after `seen` tokens, shared by compress
 * and check. */
static void emit_config(struct em *em)
{
	out(em, "/* config: this policy's compress configuration (kernels/k_compress.h) after\n"
	        " * `seen` tokens, with the parameters in force. */\n");
	out(em, "static void config(const struct kvp_ctx *ctx, const rt_kv *kv, double seen,\n"
	        "                   struct k_compress_cfg *cfg)\n{\n");
	with_locals(em, P_LOCAL, 1, config_body, NULL);
	out(em, "}\n\n");
}

static void emit_compress(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->trigger.kind == KVP_TRIG_NEVER)
		return;
	int has_score = ir->score.expr >= 0;
	int grace = kvp_ir_grace_core(ir);
	emit_config(em);
	if (grace) {
		out(em, "/* grace_config: the values of GraceKV's actions (kernels/k_grace_run.h). */\n");
		out(em, "static void grace_config(const struct kvp_ctx *ctx, const struct k_compress_cfg *cfg,\n"
		        "                         struct k_grace_cfg *gc)\n{\n");
		with_locals(em, P_LOCAL, 1, grace_config_body, NULL);
		out(em, "}\n\n");
	}
	out(em, "/* compress: %s (kernels/k_compress.h) with this policy's pipeline. */\n",
	    grace ? "k_grace_run" : "k_compress_run");
	out(em, "static int compress(const struct kvp_ctx *ctx, rt_kv *kv, rt_err *err)\n{\n");
	if (ir->needs & KVP_NEED_OUT) {
		out(em, "\tif (kv->group > K_OUT_MAX_GROUP || kv->state_bytes < (size_t)K_OUT_MAX_GROUP * (size_t)kv->head_dim * sizeof(float))\n"
		        "\t\treturn rt_err_set(err, \"policy %%s: the exact CAOTE keeps the attention output of at most %%d query heads per KV head; this model has %%d\", \"");
		cstr_into(em, ir->name);
		out(em, "\", K_OUT_MAX_GROUP, kv->group);\n");
	}
	if (ir->needs & KVP_NEED_QUERY) {
		out(em, "\tif (kv->group > K_EA_MAX_GROUP || kv->state_bytes < %sk_ea_state_floats(kv->head_dim) * sizeof(float))\n"
		        "\t\treturn rt_err_set(err, \"policy %%s: Expected Attention keeps the query statistics of at most %%d query heads per KV head; this model has %%d\", \"",
		    (ir->needs & KVP_NEED_OUT) ? "(size_t)K_OUT_MAX_GROUP * (size_t)kv->head_dim * sizeof(float) + " : "");
		cstr_into(em, ir->name);
		out(em, "\", K_EA_MAX_GROUP, kv->group);\n");
	}
	out(em, "\tstruct k_compress_cfg cfg;\n\tconfig(ctx, kv, (double)ctx->seen, &cfg);\n");
	if (grace) {
		out(em, "\tstruct k_grace_cfg gc;\n\tgrace_config(ctx, &cfg, &gc);\n");
		out(em, "\treturn k_grace_run(ctx, kv, &cfg, %s, &gc, err);\n}\n\n",
		    has_score ? "score_q" : "NULL");
	} else {
		out(em, "\treturn k_compress_run(ctx, kv, &cfg, %s, err);\n}\n\n",
		    has_score ? "score_q" : "NULL");
	}
	out(em, "/* check: the budget and guards in force for a sequence whose context is the prompt\n"
	        " * (runtime/policy/rt_budget.h), before it starts. */\n");
	out(em, "static int check(const struct kvp_ctx *ctx, const rt_kv *kv, rt_err *err)\n{\n");
	out(em, "\tconst double seen = (double)ctx->prompt_len;\n");
	out(em, "\tstruct k_compress_cfg cfg;\n\tconfig(ctx, kv, seen, &cfg);\n");
	out(em, "\tdouble *lb = cfg.layers == K_LAYERS_UNIFORM ? NULL : (double *)ctx->scratch;\n");
	out(em, "\treturn k_budget_check(ctx, kv, &cfg, seen, seen, lb, err) < 0 ? -1 : 0;\n}\n\n");
	out(em, "static size_t scratch_bytes(const rt_kv *kv, int n_threads)\n{\n");
	if (grace) /* k_grace_run works on the calling thread */
		out(em, "\treturn k_grace_scratch_bytes(kv, %d)%s;\n}\n\n", em->n_vec,
		    ir->tiers.n > 0 ? " + k_tier_scratch_bytes(kv)" : "");
	else
		out(em, "\treturn k_compress_scratch_bytes(kv, %d, n_threads)%s;\n}\n\n", em->n_vec,
		    ir->tiers.n > 0 ? " + k_tier_scratch_bytes(kv)" : "");
}

static void emit_policy(struct em *em)
{
	const struct kvp_ir *ir = em->ir;
	char sym[300];
	kvp_emit_symbol(ir->name, sym, sizeof sym);
	int compresses = ir->trigger.kind != KVP_TRIG_NEVER;
	out(em, "extern const struct kvp_policy %s;\n", sym);
	out(em, "const struct kvp_policy %s = {\n", sym);
	out(em, "\t.abi_version = KVP_ABI_VERSION,\n\t.name = \"");
	cstr_into(em, ir->name);
	out(em, "\",\n\t.source = \"");
	cstr_into(em, ir->source);
	out(em, "\",\n\t.source_hash = \"");
	cstr_into(em, ir->source_hash);
	out(em, "\",\n\t.summary = \"");
	cstr_into(em, ir->summary);
	out(em, "\",\n\t.n_params = %d,\n", ir->n_params);
	out(em, "\t.params = %s,\n", ir->n_params > 0 ? "policy_params" : "NULL");
	out(em, "\t.stat_words_entry = STAT_WORDS_ENTRY,\n\t.stat_words_qhead = STAT_WORDS_QHEAD,\n");
	out(em, "\t.state_words = %u,\n\t.state_words_dim = %u,\n", ir->state_words,
	    ir->state_words_dim);
	if (ir->state_words_dim2)
		out(em, "\t.state_words_dim2 = %u,\n", ir->state_words_dim2);
	if (ir->alloc.budget_bytes)
		out(em, "\t.budget_bytes = 1,\n");
	if (ir->trigger.kind == KVP_TRIG_PROMPT_END) /* measured after a prompt (rt_policy.h) */
		out(em, "\t.measure = KVP_MEASURE_PROMPT_END,\n");
	out(em, "\t.positions = %s,\n",
	    ir->positions == KVP_POS_COMPACTED ? "KVP_POS_COMPACTED" : "KVP_POS_ORIGINAL");
	out(em, "\t.needs = ");
	/* ORDER(needs): bit b of KVP_NEED_* (runtime/policy/rt_policy.h) is needs[b] */
	static const char *const needs[] = { "KVP_NEED_ATTN", "KVP_NEED_OUT", "KVP_NEED_KEYS",
	                                     "KVP_NEED_VALUES", "KVP_NEED_SPANS", "KVP_NEED_PROMPT_LEN",
	                                     "KVP_NEED_TRACE", "KVP_NEED_F32_KV", "KVP_NEED_TIERS",
	                                     "KVP_NEED_QUERY" };
	_Static_assert(sizeof needs / sizeof needs[0] == 10, "ORDER(needs): one name per KVP_NEED_ bit");
	int first = 1;
	for (int b = 0; b < (int)(sizeof needs / sizeof needs[0]); b++)
		if (ir->needs & (1u << b)) {
			out(em, "%s%s", first ? "" : " | ", needs[b]);
			first = 0;
		}
	if (first)
		out(em, "0");
	out(em, ",\n\t.init_entries = NULL,\n");
	out(em, "\t.observe = %s,\n",
	    ir->n_stats > 0 || (ir->needs & (KVP_NEED_OUT | KVP_NEED_QUERY)) ? "observe" : "NULL");
	out(em, "\t.should_compress = should_compress,\n");
	out(em, "\t.compress = %s,\n", compresses ? "compress" : "NULL");
	out(em, "\t.next_trigger = next_trigger,\n");
	out(em, "\t.scratch_bytes = %s,\n", compresses ? "scratch_bytes" : "NULL");
	out(em, "\t.check = %s,\n};\n", compresses ? "check" : "NULL");
}

int kvp_emit_c(const struct kvp_ir *ir, const struct kvp_emit_opts *opts, FILE *f)
{
	RT_ASSERT(ir->checked); /* the layout and the indices were validated */
	struct kvp_emit_opts defaults = { 1, NULL };
	struct em em = { 0 };
	em.ir = ir;
	em.opts = opts ? opts : &defaults;
	em.vec_of = RT_MALLOC((size_t)(ir->n_nodes > 0 ? ir->n_nodes : 1) * sizeof(int32_t));
	for (int32_t i = 0; i < ir->n_nodes; i++) {
		int v = ir->nodes[i].op == KVP_OP_CAOTE || ir->nodes[i].op == KVP_OP_NORMALIZE ||
		        ir->nodes[i].op == KVP_OP_EXPATTN;
		em.vec_of[i] = v ? em.n_vec++ : -1;
	}
	emit_header(&em);
	emit_tables(&em);
	emit_budget(&em);
	emit_stat_reads(&em);
	emit_observe(&em);
	emit_score(&em);
	emit_trigger(&em);
	emit_compress(&em);
	emit_policy(&em);
	int rc = fwrite(em.buf, 1, em.len, f) == em.len ? 0 : -1;
	free(em.buf);
	free(em.vec_of);
	return rc;
}

int kvp_emit_registry(const char *const *names, int n, FILE *f, char *err, size_t err_len)
{
	struct em em = { 0 };
	char (*syms)[300] = RT_MALLOC((size_t)(n > 0 ? n : 1) * sizeof *syms);
	for (int i = 0; i < n; i++) {
		kvp_emit_symbol(names[i], syms[i], sizeof syms[i]);
		for (int j = 0; j < i; j++)
			if (strcmp(syms[i], syms[j]) == 0) {
				if (err && err_len)
					snprintf(err, err_len,
					         "registry: policies %d and %d have the same name or symbol (%s)",
					         j + 1, i + 1, syms[i]);
				free(syms);
				return -1;
			}
	}
	out(&em, "/* generated from %d polic%s by kvpc %s \xe2\x80\x94 do not edit */\n", n,
	    n == 1 ? "y" : "ies", KVP_VERSION);
	out(&em, "/* The registry of the policies compiled into this binary, in command-line order. */\n");
	out(&em, "#include <stddef.h>\n\n#include \"policy/rt_policy.h\"\n\n");
	for (int i = 0; i < n; i++)
		out(&em, "extern const struct kvp_policy %s;\n", syms[i]);
	out(&em, "\nconst struct kvp_policy *const kvp_registry[%d] = {\n", n + 1);
	for (int i = 0; i < n; i++)
		out(&em, "\t&%s,\n", syms[i]);
	out(&em, "\tNULL,\n};\n\nconst int kvp_registry_count = %d;\n", n);
	int rc = fwrite(em.buf, 1, em.len, f) == em.len ? 0 : -1;
	free(em.buf);
	free(syms);
	return rc;
}
