/*
 * kvp_emit_cuda: the CUDA back end (see kvp_emit_cuda.h). Layout of a generated unit:
 *
 *   banner, file comment (policy, statistics layout, where compress runs)
 *   includes (the kernel templates, the CUDA policy ABI, the C policy's symbol)
 *   budget_of()       the budget (entries per head), host and device
 *   stat_read_N()     read-out of statistic N at compress time (device)
 *   struct obs        the fused observe functor (kernels/k_attn.cuh)
 *   struct score      the score functor (kernels/k_compact.cuh), device compress only
 *   attend(), compress()   the launchers the runtime calls
 *   the exported const struct kvp_cuda_policy
 *
 * Expressions are printed with two variable names in scope: `x` (struct k_cu_scalar:
 * parameters, prompt length, ratio, layers) and `E` (the entry view: struct k_cu_obs
 * `ob` in observe, struct k_cu_sc `sc` in the score), plus `seen`, `i` (the entry), `r`
 * (the query head) and `attn`.
 */
#include "kvp_emit_cuda.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_emit_c.h"

struct cem {
	FILE *f;
	const struct kvp_ir *ir;
	const char *ent;   /* the entry view's name: "ob" or "sc" */
	int subst_budget;  /* a trigger target: a copy of the budget's tree is budget_of() */
	int err;
};

static void out(struct cem *em, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(struct cem *em, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (vfprintf(em->f, fmt, ap) < 0)
		em->err = 1;
	va_end(ap);
}

static void num(struct cem *em, double v)
{
	char b[64];
	snprintf(b, sizeof b, "%.17g", v);
	int is_int = strspn(b, "-0123456789") == strlen(b);
	if (v < 0)
		out(em, "(%s%s)", b, is_int ? ".0" : "");
	else
		out(em, "%s%s", b, is_int ? ".0" : "");
}

/* A name inside a comment: only [A-Za-z0-9_] pass, at most 40 bytes. */
static void comment_name(struct cem *em, const char *s)
{
	size_t n = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p && n < 40; p++, n++) {
		unsigned c = *p;
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
		out(em, "%c", ok ? (char)c : '?');
	}
}

static void comment_path(struct cem *em, const char *s)
{
	char prev = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned c = *p;
		char ch = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		          c == '_' || c == '.' || c == '-' || (c == '/' && prev != '*') ? (char)c : '?';
		out(em, "%c", ch);
		prev = ch;
	}
}

static void cstr(struct cem *em, const char *s)
{
	kvp_emit_cstr(em->f, s);
}

/* ---- expressions ----------------------------------------------------------------------- */

static void expr(struct cem *em, int32_t e);

static void signal_expr(struct cem *em, enum kvp_ir_signal s)
{
	const char *E = em->ent;
	switch (s) {
	case KVP_SIG_ATTN: out(em, "attn"); break;
	case KVP_SIG_SEEN: out(em, "seen"); break;
	case KVP_SIG_CONTEXT: out(em, "k_context_at(x.prompt_len, seen)"); break;
	case KVP_SIG_PROMPT_LEN: out(em, "k_prompt_len_at(x.prompt_len, seen)"); break;
	case KVP_SIG_ENTRIES: out(em, "(double)%s.n", E); break;
	case KVP_SIG_POS: out(em, "(double)%s.pos[i]", E); break;
	case KVP_SIG_AGE: out(em, "(seen - 1.0 - (double)%s.pos[i])", E); break;
	case KVP_SIG_SIZE: out(em, "(double)%s.count[i]", E); break;
	case KVP_SIG_KEY_NORM: out(em, "k_norm(%s.k + (size_t)i * %s.hd, %s.hd)", E, E, E); break;
	case KVP_SIG_VALUE_NORM: out(em, "k_norm(%s.v + (size_t)i * %s.hd, %s.hd)", E, E, E); break;
	case KVP_SIG_LAYER: out(em, "(double)%s.layer", E); break;
	case KVP_SIG_N_LAYERS: out(em, "(double)x.n_layer"); break;
	case KVP_SIG_BUDGET: out(em, "budget_of(x, seen)"); break;
	default: out(em, "0.0"); break; /* key_cos_mean: the host compress handles it */
	}
}

/* pre, the tree at x->a, mid (its %s replaced by op), the tree at x->b, post */
static void infix(struct cem *em, const struct kvp_ir_expr *x, const char *pre,
                  const char *mid, const char *op, const char *post)
{
	out(em, "%s", pre);
	expr(em, x->a);
	out(em, mid, op);
	expr(em, x->b);
	out(em, "%s", post);
}

static void bin(struct cem *em, const struct kvp_ir_expr *x, const char *op)
{
	infix(em, x, "(", " %s ", op, ")");
}

/* comparisons in float32, as the C emitter makes them */
static void cmp(struct cem *em, const struct kvp_ir_expr *x, const char *op)
{
	infix(em, x, "((float)", " %s (float)", op, " ? 1.0 : 0.0)");
}

static void logic(struct cem *em, const struct kvp_ir_expr *x, const char *op)
{
	infix(em, x, "((", ") != 0 %s (", op, ") != 0 ? 1.0 : 0.0)");
}

static void call(struct cem *em, const char *fn, const struct kvp_ir_expr *x, int args)
{
	out(em, "%s(", fn);
	expr(em, x->a);
	if (args > 1) {
		out(em, ", ");
		expr(em, x->b);
	}
	out(em, ")");
}

static void expr(struct cem *em, int32_t e)
{
	const struct kvp_ir_expr *x = &em->ir->nodes[e];
	/* a target written relative to the budget follows a ratio override (C emitter rule) */
	if (em->subst_budget && em->ir->alloc.budget >= 0 && kvp_ir_same_tree(em->ir, e, em->ir->alloc.budget)) {
		out(em, "budget_of(x, seen)");
		return;
	}
	switch (x->op) {
	case KVP_OP_NUM: num(em, x->num); break;
	case KVP_OP_PARAM: out(em, "x.P[%d]", (int)x->index); break;
	case KVP_OP_STAT: out(em, "stat_read_%d(sc, x, i, r)", (int)x->index); break;
	case KVP_OP_SIGNAL: signal_expr(em, x->sig); break;
	case KVP_OP_NEG: out(em, "(-"); expr(em, x->a); out(em, ")"); break;
	case KVP_OP_NOT: out(em, "("); expr(em, x->a); out(em, " == 0 ? 1.0 : 0.0)"); break;
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
	case KVP_OP_SELECT:
		out(em, "((");
		expr(em, x->a);
		out(em, ") != 0 ? ");
		expr(em, x->b);
		out(em, " : ");
		expr(em, x->c);
		out(em, ")");
		break;
	default: out(em, "0.0"); break; /* whole-head transforms: host compress only */
	}
}

static int uses(const struct kvp_ir *ir, int32_t e, int op, int sig)
{
	if (e < 0)
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if ((int)x->op == op && (op != KVP_OP_SIGNAL || (int)x->sig == sig))
		return 1;
	return uses(ir, x->a, op, sig) || uses(ir, x->b, op, sig) || uses(ir, x->c, op, sig);
}

/* 1 if expression e reads statistic k */
static int uses_stat(const struct kvp_ir *ir, int32_t e, int k)
{
	if (e < 0)
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if (x->op == KVP_OP_STAT && x->index == k)
		return 1;
	return uses_stat(ir, x->a, k) || uses_stat(ir, x->b, k) || uses_stat(ir, x->c, k);
}

const char *kvp_emit_cuda_host_why(const struct kvp_ir *ir)
{
	if (ir->trigger.kind == KVP_TRIG_NEVER)
		return "the policy never compresses";
	if (kvp_ir_grace_core(ir))
		return "GraceKV's prototype trees (kernels/k_grace_run.h) run on the host";
	if (ir->tiers.n > 0)
		return "precision tiers (kernels/k_tier.h) set the tiers of a tiered host store";
	if (ir->action.kind != K_ACT_EVICT)
		return "merging evicted entries into prototypes runs on the host";
	if (ir->alloc.heads != K_HEADS_EACH)
		return "allocation across heads (adaptive or global) runs on the host";
	if (ir->score.over_layer)
		return "a layer-wide score reduction runs on the host";
	int32_t e = ir->score.expr;
	if (uses(ir, e, KVP_OP_CAOTE, 0) || uses(ir, e, KVP_OP_NORMALIZE, 0))
		return "whole-head score transforms (caote, normalize) run on the host";
	if (uses(ir, e, KVP_OP_EXPATTN, 0))
		return "Expected Attention's score (query statistics) runs on the host";
	if (uses(ir, e, KVP_OP_SIGNAL, KVP_SIG_KEY_COS_MEAN))
		return "key_cos_mean (a whole-head anchor) runs on the host";
	return NULL;
}

/* ---- sections ---------------------------------------------------------------------------- */

static void emit_header(struct cem *em, const char *sym, const char *why)
{
	const struct kvp_ir *ir = em->ir;
	out(em, "/* generated from ");
	comment_path(em, ir->source);
	out(em, " by kvpc %s \xe2\x80\x94 do not edit */\n", KVP_VERSION);
	out(em, "/*\n * The CUDA half of policy ");
	comment_name(em, ir->name);
	out(em, " (runtime/cuda/rt_cuda_policy.h); its C half is %s.\n", sym);
	out(em, " * Statistics, 4-byte words per entry: %u shared, then %u per query head.\n",
	    ir->stat_words_entry, ir->stat_words_qhead);
	out(em, " * Observe: fused into the attention kernel (kernels/k_attn.cuh), %s.\n",
	    ir->n_stats > 0 || (ir->needs & KVP_NEED_OUT) ? "updating the statistics" : "nothing to update");
	if (why)
		out(em, " * Compress: on the host (%s).\n */\n", why);
	else
		out(em, " * Compress: on the device (kernels/k_compact.cuh).\n */\n");
	out(em, "#include <math.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <string.h>\n\n");
	out(em, "#include \"k_attn.cuh\"\n#include \"k_compact.cuh\"\n");
	/* the C kernels (k_score.h, k_signal.h through k_compress.h; k_stat.h) keep C linkage */
	out(em, "#include \"cuda/rt_cuda_compress.cuh\"\n\nextern \"C\" {\n#include \"k_stat.h\"\n}\n\n");
	out(em, "#define STAT_WORDS_ENTRY %uu\n#define STAT_WORDS_QHEAD %uu\n\n", ir->stat_words_entry,
	    ir->stat_words_qhead);
	out(em, "extern \"C\" const struct kvp_policy %s;\n\nnamespace {\n\n", sym);
	out(em, "/* what scalar expressions read: parameters, prompt length, ratio, layers */\n"
	        "struct k_cu_scalar {\n\tconst double *P;\n\tint64_t prompt_len;\n\tdouble ratio, byte_ratio;\n\tint n_layer;\n};\n\n");
}

static void emit_budget(struct cem *em)
{
	const struct kvp_ir *ir = em->ir;
	out(em, "/* budget_of: entries per head on average (the policy's budget, or context / R under\n"
	        " * a compression ratio R in entries or in bytes) */\n");
	out(em, "K_HD double budget_of(const struct k_cu_scalar &x, double seen)\n{\n");
	out(em, "\treturn k_budget_of(x.ratio, x.byte_ratio, k_context_at(x.prompt_len, seen), ");
	if (ir->alloc.budget >= 0)
		expr(em, ir->alloc.budget);
	else
		out(em, "0.0");
	out(em, ");\n}\n\n");
}

static void emit_stat_reads(struct cem *em)
{
	const struct kvp_ir *ir = em->ir;
	for (int k = 0; k < ir->n_stats; k++) {
		const struct kvp_ir_stat *s = &ir->stats[k];
		if (!uses_stat(ir, ir->score.expr, k))
			continue;
		out(em, "/* stat_%d ", k);
		comment_name(em, s->name);
		out(em, " at compress time */\n");
		out(em, "K_HD double stat_read_%d(const struct k_cu_sc &sc, const struct k_cu_scalar &x, int32_t i, int r)\n{\n", k);
		out(em, "\tconst uint32_t *b = k_stat_cat(sc.stats, sc.stat_bytes, i);\n");
		out(em, "\tconst double seen = sc.seen;\n\t(void)x;\n\t(void)seen;\n\t(void)r;\n");
		if (s->per_qhead)
			out(em, "\tconst uint32_t *w = b + STAT_WORDS_ENTRY + (size_t)r * STAT_WORDS_QHEAD + %d;\n",
			    (int)s->word);
		else
			out(em, "\tconst uint32_t *w = b + %d;\n", (int)s->word);
		int ring = s->hist == KVP_HIST_LAST_STEPS && s->kind != KVP_STAT_LAST && s->kind != KVP_STAT_EMA;
		char steps[160] = "";
		if (s->kind == KVP_STAT_MEAN) {
			if (s->hist == KVP_HIST_LAST_STEPS)
				snprintf(steps, sizeof steps, "fmin((double)k_stat_getf(b + %d), %d.0)",
				         (int)ir->obs_count_word, (int)s->ring);
			else
				snprintf(steps, sizeof steps, "(double)k_stat_getf(b + %d)", (int)ir->obs_count_word);
		} else {
			out(em, "\t(void)b;\n");
		}
		if (s->kind == KVP_STAT_MEAN && s->hist == KVP_HIST_PROMPT_TAIL) {
			out(em, "\tconst double tail = k_stat_tail_steps((int64_t)sc.seen, x.prompt_len, ");
			expr(em, s->window);
			out(em, ");\n\treturn k_stat_mean(k_stat_getf(w), fmin(%s, tail));\n}\n\n", steps);
			continue;
		}
		if (ring && s->kind == KVP_STAT_COUNT)
			out(em, "\treturn k_stat_ring_count(w, %d);\n", (int)s->ring);
		else if (ring && s->kind == KVP_STAT_MEAN)
			out(em, "\treturn k_stat_mean(k_stat_ring_sum(w, %d), %s);\n", (int)s->ring, steps);
		else if (ring)
			out(em, "\treturn k_stat_ring_sum(w, %d);\n", (int)s->ring);
		else if (s->kind == KVP_STAT_MEAN)
			out(em, "\treturn k_stat_mean(k_stat_getf(w), %s);\n", steps);
		else
			out(em, "\treturn k_stat_getf(w);\n");
		out(em, "}\n\n");
	}
}

static void stat_update(struct cem *em, int k, const char *ind)
{
	const struct kvp_ir_stat *s = &em->ir->stats[k];
	const char *w = s->per_qhead ? "q" : "b";
	out(em, "%sconst double x_%d = ", ind, k);
	expr(em, s->arg);
	out(em, ";\n");
	if (s->hist == KVP_HIST_PROMPT_TAIL)
		out(em, "%sif (tail_%d)\n%s\t", ind, k, ind);
	else
		out(em, "%s", ind);
	int ring = s->hist == KVP_HIST_LAST_STEPS;
	switch (s->kind) {
	case KVP_STAT_SUM:
	case KVP_STAT_MEAN:
		if (ring)
			out(em, "k_stat_ring_put(%s + %d, %d, ob.step, x_%d);\n", w, (int)s->word, (int)s->ring, k);
		else
			out(em, "k_stat_sum(%s + %d, x_%d);\n", w, (int)s->word, k);
		break;
	case KVP_STAT_COUNT:
		if (ring)
			out(em, "k_stat_ring_put_bit(%s + %d, %d, ob.step, x_%d);\n", w, (int)s->word, (int)s->ring, k);
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

static void emit_obs(struct cem *em)
{
	const struct kvp_ir *ir = em->ir;
	const int need_out = (ir->needs & KVP_NEED_OUT) != 0;
	em->ent = "ob";
	out(em, "/* obs: the statistic update of one visible entry i at step ob.step, run inside the\n"
	        " * attention kernel with this row's probabilities (the C observe's loop body) */\n");
	out(em, "struct obs {\n\tenum { active = %d, need_out = %d };\n", ir->n_stats > 0, need_out);
	out(em, "\tK_HD static void entry(const struct k_cu_obs &ob, int32_t i)\n\t{\n");
	out(em, "\t\tconst struct k_cu_scalar x = { ob.P, ob.prompt_len, ob.ratio, ob.byte_ratio, ob.n_layer };\n");
	out(em, "\t\tconst double seen = (double)(ob.step + 1);\n\t\t(void)x;\n\t\t(void)seen;\n\t\t(void)i;\n");
	if (ir->n_stats == 0) {
		out(em, "\t}\n};\n\n");
		return;
	}
	int any_q = 0;
	for (int k = 0; k < ir->n_stats; k++) {
		const struct kvp_ir_stat *s = &ir->stats[k];
		any_q |= s->per_qhead;
		if (s->kind == KVP_STAT_EMA) {
			out(em, "\t\tconst double alpha_%d = ", k);
			expr(em, s->alpha);
			out(em, ";\n");
		}
		if (s->hist == KVP_HIST_PROMPT_TAIL) {
			out(em, "\t\tconst int tail_%d = k_stat_in_prompt_tail(ob.step, x.prompt_len, ", k);
			expr(em, s->window);
			out(em, ");\n");
		}
	}
	out(em, "\t\tuint32_t *b = k_stat_at(ob.stats, ob.stat_bytes, i);\n");
	if (ir->uses_obs_count)
		out(em, "\t\tk_stat_sum(b + %d, 1.0);\n", (int)ir->obs_count_word);
	for (int k = 0; k < ir->n_stats; k++)
		if (!ir->stats[k].per_qhead)
			stat_update(em, k, "\t\t");
	if (any_q) {
		out(em, "\t\tfor (int r = 0; r < ob.group; r++) {\n");
		out(em, "\t\t\tconst double attn = ob.probs[(size_t)r * (size_t)ob.ld + (size_t)i];\n");
		out(em, "\t\t\tuint32_t *q = b + STAT_WORDS_ENTRY + (size_t)r * STAT_WORDS_QHEAD;\n");
		out(em, "\t\t\t(void)attn;\n");
		for (int k = 0; k < ir->n_stats; k++)
			if (ir->stats[k].per_qhead)
				stat_update(em, k, "\t\t\t");
		out(em, "\t\t}\n");
	}
	out(em, "\t}\n};\n\n");
}

static void emit_score(struct cem *em)
{
	const struct kvp_ir *ir = em->ir;
	em->ent = "sc";
	int32_t e = ir->score.expr;
	out(em, "/* score: the score of entry i for query head r (lowest evicted first) */\n");
	out(em, "struct score {\n\tenum { per_q = %d };\n", e >= 0 && kvp_ir_expr_per_qhead(ir, e));
	out(em, "\tK_HD static float at(const struct k_cu_sc &sc, int32_t i, int r)\n\t{\n");
	out(em, "\t\tconst struct k_cu_scalar x = { sc.P, sc.prompt_len, sc.ratio, sc.byte_ratio, sc.n_layer };\n");
	out(em, "\t\tconst double seen = sc.seen;\n\t\t(void)x;\n\t\t(void)seen;\n\t\t(void)i;\n\t\t(void)r;\n");
	out(em, "\t\treturn (float)");
	if (e >= 0)
		expr(em, e);
	else
		out(em, "0.0");
	out(em, ";\n\t}\n};\n\n");
}

/* scalar expression e, or d when e < 0 */
static void scalar_or(struct cem *em, int32_t e, double d)
{
	if (e >= 0)
		expr(em, e);
	else
		num(em, d);
}

static void emit_compress(struct cem *em)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_score *sc = &ir->score;
	const struct kvp_ir_alloc *al = &ir->alloc;
	out(em, "/* compress: the device pipeline (runtime/cuda/rt_cuda_compress.cuh) configured as\n"
	        " * the C compress configures k_compress_run */\n");
	out(em, "void compress_cfg(const struct kvp_ctx *ctx, const rt_kv *kv, struct k_compress_cfg *c)\n{\n");
	out(em, "\tconst struct k_cu_scalar x = { ctx->params, ctx->prompt_len, ctx->ratio, ctx->byte_ratio, kv->n_layer };\n");
	out(em, "\tconst double seen = (double)ctx->seen;\n");
	out(em, "\tstruct k_compress_cfg &cfg = *c;\n\tmemset(&cfg, 0, sizeof cfg);\n");
	out(em, "\tcfg.name = \"");
	cstr(em, ir->name);
	out(em, "\";\n\tcfg.budget = budget_of(x, seen);\n");
	int has_score = sc->expr >= 0;
	int per_q = has_score && kvp_ir_expr_per_qhead(ir, sc->expr);
	out(em, "\tcfg.has_score = %d;\n\tcfg.reduce = %s;\n", has_score,
	    per_q ? K_REDUCE_NAMES[sc->reduce] : "-1");
	if (sc->pool != K_POOL_NONE) {
		double k = 1;
		kvp_ir_fold(ir, sc->kernel, &k);
		out(em, "\tcfg.pool = %s;\n\tcfg.kernel = %d;\n\tcfg.pool_before_reduce = %d;\n",
		    K_POOL_NAMES[sc->pool], (int)k, sc->pool_before_reduce);
	}
	out(em, "\tcfg.target = ");
	if (ir->trigger.target >= 0) {
		em->subst_budget = 1;
		expr(em, ir->trigger.target);
		em->subst_budget = 0;
	} else
		out(em, "budget_of(x, seen)");
	out(em, ";\n");
	if (ir->guards.sinks >= 0) {
		out(em, "\tcfg.has_sinks = 1;\n\tcfg.sinks = ");
		expr(em, ir->guards.sinks);
		out(em, ";\n");
	}
	if (ir->guards.recent >= 0) {
		out(em, "\tcfg.has_recent = 1;\n\tcfg.recent = ");
		expr(em, ir->guards.recent);
		out(em, ";\n");
	}
	out(em, "\tcfg.layers = %s;\n", K_LAYERS_NAMES[al->layers]);
	if (al->layers == K_LAYERS_PYRAMID || al->layers == K_LAYERS_FUNNEL) {
		out(em, "\tcfg.beta = ");
		scalar_or(em, al->beta, 20);
		out(em, ";\n");
	} else if (al->layers == K_LAYERS_LINEAR) {
		out(em, "\tcfg.from = ");
		scalar_or(em, al->from, 1);
		out(em, ";\n\tcfg.to = ");
		scalar_or(em, al->to, 1);
		out(em, ";\n");
	} else if (al->layers == K_LAYERS_LIST && al->n_list > 0) {
		out(em, "\tstatic const double list[%d] = {", al->n_list);
		for (int i = 0; i < al->n_list; i++) {
			out(em, i ? ", " : " ");
			num(em, al->list[i]);
		}
		out(em, " };\n\tcfg.list = list;\n\tcfg.n_list = %d;\n", al->n_list);
	}
	if (ir->guards.protect_all_spans)
		out(em, "\tcfg.protect_all_spans = 1;\n");
	if (ir->guards.n_spans > 0) {
		out(em, "\tstatic const char *const spans[%d] = {", ir->guards.n_spans);
		for (int i = 0; i < ir->guards.n_spans; i++) {
			out(em, " \"");
			cstr(em, ir->guards.spans[i]);
			out(em, "\",");
		}
		out(em, " };\n\tcfg.spans = spans;\n\tcfg.n_spans = %d;\n", ir->guards.n_spans);
	}
	out(em, "}\n\n");
	out(em, "int compress(const struct kvp_cuda_compress_in *in, rt_err *err)\n{\n"
	        "\tstruct k_compress_cfg cfg;\n\tcompress_cfg(in->ctx, in->shadow, &cfg);\n"
	        "\treturn rt_cuda_compress_run<score>(in, &cfg, %d, err);\n}\n\n", ir->n_params);
	out(em, "void compress_ref(const struct k_cu_compress_args *a, size_t hi)\n{\n"
	        "\tk_cu_compress_ref<score>(*a, hi);\n}\n\n");
}

int kvp_emit_cuda(const struct kvp_ir *ir, FILE *f)
{
	if (!ir->checked)
		return -1;
	struct cem em = { f, ir, "ob", 0, 0 };
	char sym[300], csym[320];
	kvp_emit_symbol(ir->name, sym, sizeof sym);
	snprintf(csym, sizeof csym, "kvp_cuda_%s", sym + 4); /* kvp_policy_X -> kvp_cuda_policy_X */
	const char *why = kvp_emit_cuda_host_why(ir);
	emit_header(&em, sym, why);
	int obs_budget = 0;
	for (int k = 0; k < ir->n_stats; k++)
		obs_budget |= uses(ir, ir->stats[k].arg, KVP_OP_SIGNAL, KVP_SIG_BUDGET) ||
		              uses(ir, ir->stats[k].alpha, KVP_OP_SIGNAL, KVP_SIG_BUDGET) ||
		              uses(ir, ir->stats[k].window, KVP_OP_SIGNAL, KVP_SIG_BUDGET);
	if (!why || obs_budget)
		emit_budget(&em);
	if (!why) {
		emit_stat_reads(&em);
		emit_score(&em);
	}
	emit_obs(&em);
	out(&em, "int attend(const struct k_cu_attn_args *a, void *stream)\n{\n"
	         "\treturn (int)k_cu_attn_launch<obs>(a, (cudaStream_t)stream);\n}\n\n");
	out(&em, "void attend_ref(const struct k_cu_attn_args *a, int j, int r, float *P)\n{\n"
	         "\tk_cu_attn_ref<obs>(*a, j, r, P);\n}\n\n");
	if (!why)
		emit_compress(&em);
	out(&em, "} /* namespace */\n\n");
	out(&em, "extern \"C\" const struct kvp_cuda_policy %s;\n", csym);
	out(&em, "const struct kvp_cuda_policy %s = {\n", csym);
	out(&em, "\tKVP_CUDA_ABI_VERSION,\n\t&%s,\n\t\"", sym);
	cstr(&em, ir->name);
	out(&em, "\",\n\t\"");
	cstr(&em, ir->source_hash);
	out(&em, "\",\n\tattend,\n\t%s,\n\t\"", why ? "NULL" : "compress");
	cstr(&em, why ? why : "");
	out(&em, "\",\n\tattend_ref,\n\t%s,\n\t%s,\n};\n", why ? "NULL" : "compress_cfg",
	    why ? "NULL" : "compress_ref");
	return em.err ? -1 : 0;
}

int kvp_emit_cuda_registry(const char *const *names, int n, FILE *f, char *err, size_t err_len)
{
	struct cem em = { f, NULL, "ob", 0, 0 };
	char (*syms)[320] = calloc((size_t)(n > 0 ? n : 1), sizeof *syms);
	if (!syms)
		return -1;
	for (int i = 0; i < n; i++) {
		char sym[300];
		kvp_emit_symbol(names[i], sym, sizeof sym);
		snprintf(syms[i], sizeof syms[i], "kvp_cuda_%s", sym + 4);
		for (int j = 0; j < i; j++)
			if (!strcmp(syms[i], syms[j])) {
				if (err && err_len)
					snprintf(err, err_len, "registry: policies %d and %d have the same name or symbol (%s)",
					         j + 1, i + 1, syms[i]);
				free(syms);
				return -1;
			}
	}
	out(&em, "/* generated from %d polic%s by kvpc %s \xe2\x80\x94 do not edit */\n", n,
	    n == 1 ? "y" : "ies", KVP_VERSION);
	out(&em, "/* The CUDA policies of this binary (C registry order) and the backend table the\n"
	         " * command line finds (runtime/cuda/rt_cuda.h). */\n");
	out(&em, "#include <stddef.h>\n\n#include \"cuda/rt_cuda.h\"\n\n");
	for (int i = 0; i < n; i++)
		out(&em, "extern \"C\" const struct kvp_cuda_policy %s;\n", syms[i]);
	out(&em, "\nstatic const struct kvp_cuda_policy *const policies[%d] = {\n", n + 1);
	for (int i = 0; i < n; i++)
		out(&em, "\t&%s,\n", syms[i]);
	out(&em, "\tNULL,\n};\n\n");
	out(&em, "extern \"C\" const struct rt_cuda_backend kvp_cuda_backend;\n");
	out(&em, "const struct rt_cuda_backend kvp_cuda_backend = {\n"
	         "\trt_cuda_probe, rt_cuda_model_upload, rt_cuda_model_free, rt_cuda_seq_init,\n"
	         "\trt_cuda_seq_free, rt_cuda_seq_reset, rt_cuda_seq_set, rt_cuda_seq_set_ratio,\n"
	         "\trt_cuda_seq_feed, rt_cuda_seq_kv, rt_cuda_refuses, policies, %d,\n};\n", n);
	free(syms);
	return em.err ? -1 : 0;
}
