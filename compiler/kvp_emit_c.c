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
 * The buffer, escaping, #line, expressions, statistic updates and read-outs and
 * budget_of's return are the emitter core's (kvp_emit.c), in the C spelling below.
 * Safety: source text reaches the output only through kvp_em_cstr (escaped literal
 * bodies) and kvp_em_comment_name (bytes outside [A-Za-z0-9_] become '?'); numbers are
 * printed with %.17g (exact round trip) from the IR's doubles.
 */
#include "kvp_emit_c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_util.h"

/* The C spelling: the policy context ctx, the store kv, the head h (kernels/k_signal.h
 * reads the context). */
static const struct kvp_emit_target C_TARGET = {
	.param = "P[%d]",
	.stat = "stat_read_%d(ctx, kv, h, i, r)",
	.budget = "budget_of(ctx, kv, seen)",
	.context = "k_context(ctx, seen)",
	.prompt_len = "k_prompt_len(ctx, seen)",
	.n_layers = "(double)kv->n_layer",
	.prompt_raw = "ctx->prompt_len",
	.seen_raw = "ctx->seen",
	.ratio = "ctx->ratio",
	.byte_ratio = "ctx->byte_ratio",
	.step = "ob->step",
	.stat_block = "k_stat_block(kv, h, i)",
	.group = "ob->group",
	.attn = "ob->probs[(size_t)r * (size_t)n + (size_t)i]",
	.host_score = 1,
};

static const struct kvp_emit_view C_VIEW = { "h->", "d", "n", "layer" };

/* ORDER(tier): enum rt_kv_tier (runtime/kv/rt_kv.h), by name */
static const char *const TIER_ENUM[KVP_IR_MAX_TIERS] = {
	"RT_KV_TIER_TOP", "RT_KV_TIER_Q8", "RT_KV_TIER_K8V4", "RT_KV_TIER_Q4", "RT_KV_TIER_Q2",
};

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

typedef void (*body_fn)(struct kvp_em *em, const void *arg);

/* Emit body(em, arg) preceded by the declarations of those of loc[0..n) it uses (or that
 * a used later declaration uses). The body is emitted twice: once to read which names it
 * uses (the output is then discarded), once for real, so #line numbers stay exact. */
static void with_locals(struct kvp_em *em, const struct local *loc, int n, body_fn body,
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
			kvp_em_out(em, "\t%s\n", loc[i].decl);
	body(em, arg);
}

/* ---- sections ----------------------------------------------------------------------- */

static const char *hist_name(enum kvp_ir_history h)
{
	return h == KVP_HIST_WHOLE ? "the whole history" :
	       h == KVP_HIST_LAST_STEPS ? "the last steps (ring)" : "the prompt tail";
}

static void emit_header(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	kvp_em_out(em, "/* generated from ");
	kvp_em_comment_path(em, ir->source);
	kvp_em_out(em, " by kvpc %s \xe2\x80\x94 do not edit */\n", KVP_VERSION);
	kvp_em_out(em, "/*\n * Policy ");
	kvp_em_comment_name(em, ir->name);
	kvp_em_out(em, " (source hash %.16s) compiled to the hooks of the policy ABI\n",
	    strspn(ir->source_hash, "0123456789abcdef") >= 16 ? ir->source_hash : "0000000000000000");
	kvp_em_out(em, " * (runtime/policy/rt_policy.h) with the kernel templates of kernels/ instantiated.\n");
	kvp_em_out(em, " * Statistics, 4-byte words per entry: %u shared, then %u per query head.\n",
	    ir->stat_words_entry, ir->stat_words_qhead);
	if (ir->uses_obs_count)
		kvp_em_out(em, " *   word %d (shared): steps the entry was visible\n", (int)ir->obs_count_word);
	if (ir->lin_word >= 0)
		kvp_em_out(em, " *   word %d (shared): linear_score() of the entry, set when it is appended\n",
		    (int)ir->lin_word);
	for (int i = 0; i < ir->n_stats; i++) {
		const struct kvp_ir_stat *s = &ir->stats[i];
		kvp_em_out(em, " *   stat_%d ", i);
		kvp_em_comment_name(em, s->name);
		kvp_em_out(em, " = %s(", kvp_ir_stat_kind_name(s->kind));
		kvp_em_expr_comment(em, s->arg);
		kvp_em_out(em, ") over %s: %s words %d..%d\n", hist_name(s->hist),
		    s->per_qhead ? "per query head," : "shared,", (int)s->word,
		    (int)(s->word + s->n_words - 1));
	}
	for (int i = 0; i < ir->n_consts; i++) {
		char b[64];
		snprintf(b, sizeof b, "%.17g", ir->consts[i].value);
		kvp_em_out(em, " *   const ");
		kvp_em_comment_name(em, ir->consts[i].name);
		kvp_em_out(em, " = %s (folded into the code)\n", b);
	}
	for (int i = 0; i < ir->n_params; i++) {
		kvp_em_out(em, " *   param %d ", i);
		kvp_em_comment_name(em, ir->params[i].name);
		kvp_em_out(em, " (%s)\n", kvp_unit_name(ir->params[i].unit));
	}
	kvp_em_out(em, " */\n");
	kvp_em_out(em, "#include <math.h>\n#include <stddef.h>\n#include <stdint.h>\n\n");
	kvp_em_out(em, "#include \"k_compress.h\"\n");
	if (kvp_ir_grace_core(ir))
		kvp_em_out(em, "#include \"k_grace_run.h\"\n");
	if (ir->needs & KVP_NEED_QUERY)
		kvp_em_out(em, "#include \"k_expattn.h\"\n");
	kvp_em_out(em, "#include \"k_score.h\"\n#include \"k_signal.h\"\n");
	kvp_em_out(em, "#include \"k_stat.h\"\n#include \"kv/rt_kv.h\"\n#include \"policy/rt_policy.h\"\n\n");
	kvp_em_out(em, "#include <string.h>\n\n");
	kvp_em_out(em, "/* Hooks and helpers keep the signatures of the ABI and the kernels; each policy reads\n"
	        " * only some of their arguments. */\n"
	        "#pragma GCC diagnostic ignored \"-Wunused-parameter\"\n\n");
	kvp_em_out(em, "#define STAT_WORDS_ENTRY %uu\n#define STAT_WORDS_QHEAD %uu\n\n",
	    ir->stat_words_entry, ir->stat_words_qhead);
	if (ir->needs & KVP_NEED_OUT)
		kvp_em_out(em, "/* per-head state: the attention output of each query head at the latest step */\n"
		        "_Static_assert(K_OUT_MAX_GROUP == %d, \"kvpc and kernels/k_score.h disagree on the output rows\");\n\n",
		    KVP_IR_OUT_ROWS);
	if (ir->needs & KVP_NEED_QUERY)
		kvp_em_out(em, "/* per-head state%s: Expected Attention's query statistics (kernels/k_expattn.h) */\n"
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

/* One row of a constant array: the i-th span name (a C string), the i-th layer multiplier. */
static void span_row(struct kvp_em *em, int i)
{
	kvp_em_out(em, "\"");
	kvp_em_cstr(em, em->ir->guards.spans[i]);
	kvp_em_out(em, "\"");
}

static void layer_row(struct kvp_em *em, int i)
{
	kvp_em_num(em, em->ir->alloc.list[i]);
}

/* head_score()'s weights of layer i, one row of the table */
static void head_row(struct kvp_em *em, int i)
{
	const struct kvp_ir *ir = em->ir;
	for (int g = 0; g < ir->head_kv; g++) {
		kvp_em_out(em, g ? ", " : "");
		kvp_em_num(em, ir->head_w[(size_t)i * (size_t)ir->head_kv + (size_t)g]);
	}
}

/* linear_score()'s rows as float literals, one (layer, KV head) a line: w_0 .. w_{E-1}, b */
static void emit_linear(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	const int E = ir->lin_embd, rows = ir->lin_layers * ir->lin_kv;
	kvp_em_out(em, "/* linear_score(): per (layer, KV head) the weights over the hidden size %d, then the\n"
	           " * bias, %d layers of %d KV heads (docs/language.md 7.14) */\n", E, ir->lin_layers, ir->lin_kv);
	kvp_em_out(em, "static const float policy_lin_w[%d] = {\n", rows * (E + 1));
	for (int r = 0; r < rows; r++) {
		kvp_em_out(em, "\t");
		for (int i = 0; i <= E; i++) {
			char b[48];
			snprintf(b, sizeof b, "%.9g", (double)ir->lin_w[(size_t)r * (size_t)(E + 1) + (size_t)i]);
			kvp_em_out(em, "%s%s%sf", i ? ", " : "", b, strpbrk(b, ".e") ? "" : ".0");
		}
		kvp_em_out(em, ",\n");
	}
	kvp_em_out(em, "};\n\n");
	kvp_em_out(em, "/* init_entries: linear_score() of the new entries from the layer's input rows\n"
	           " * (kernels/k_compress.h k_linear_init), into shared word %d */\n", (int)ir->lin_word);
	kvp_em_out(em, "static void init_entries(const struct kvp_ctx *ctx, rt_kv *kv, int layer, int kv_head,\n"
	           "                         int32_t first, int32_t n)\n{\n");
	kvp_em_out(em, "\tk_linear_init(ctx, kv, layer, kv_head, first, n, policy_lin_w, %d, %d, %d, %d);\n}\n\n",
	           ir->lin_layers, ir->lin_kv, E, (int)ir->lin_word);
}

/* A constant array of the policy, one row a line: "static const DECL[n] = {\n\tROW,\n...};". */
static void emit_array(struct kvp_em *em, const char *decl, int n,
                       void (*row)(struct kvp_em *em, int i))
{
	kvp_em_out(em, "static const %s[%d] = {\n", decl, n);
	for (int i = 0; i < n; i++) {
		kvp_em_out(em, "\t");
		row(em, i);
		kvp_em_out(em, ",\n");
	}
	kvp_em_out(em, "};\n\n");
}

static void emit_tables(struct kvp_em *em)
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
		/* a value rule's expression repeats a setting's (check_params): its
		 * references decide nothing about the budget */
		for (int r = 0; r < ir->n_rules; r++)
			mark_tree(ir, ir->rules[r].expr, mark);
		kvp_em_out(em, "static const struct kvp_param policy_params[%d] = {\n", ir->n_params);
		for (int i = 0; i < ir->n_params; i++) {
			const struct kvp_ir_param *p = &ir->params[i];
			kvp_em_line_src(em, p->loc);
			kvp_em_out(em, "\t{ \"");
			kvp_em_cstr(em, p->name);
			kvp_em_out(em, "\", ");
			kvp_em_num(em, p->def);
			/* ORDER(unit): enum kvp_unit (runtime/policy/rt_policy.h), by name */
			static const char *const units[KVP_UNIT_COUNT_] = {
				[KVP_UNIT_SCALAR] = "KVP_UNIT_SCALAR", [KVP_UNIT_ENTRIES] = "KVP_UNIT_ENTRIES",
				[KVP_UNIT_TOKENS] = "KVP_UNIT_TOKENS", [KVP_UNIT_RATIO] = "KVP_UNIT_RATIO",
				[KVP_UNIT_STEPS] = "KVP_UNIT_STEPS",
			};
			kvp_em_out(em, ", %s, \"", (unsigned)p->unit < KVP_UNIT_COUNT_ ? units[p->unit] : units[0]);
			kvp_em_cstr(em, p->doc);
			kvp_em_out(em, "\", %d },\n", param_budget_only(ir, i, mark));
		}
		free(mark);
		kvp_em_line_back(em);
		kvp_em_out(em, "};\n\n");
	}
	if (ir->trigger.kind == KVP_TRIG_NEVER)
		return; /* spans and layer lists are read only by compress */
	if (ir->guards.n_spans > 0)
		emit_array(em, "char *const policy_spans", ir->guards.n_spans, span_row);
	if (ir->tiers.n > 0) {
		const struct kvp_ir_tiers *t = &ir->tiers;
		kvp_em_out(em, "/* precision: the storage tiers, highest precision first%s */\n",
		    t->kind == K_TIERS_SHARES ? ", and their cumulative shares of\n * the kept entries by score rank" :
		                "; each entry is evicted or\n * given one by utility per byte (kernels/k_tier.h)");
		kvp_em_out(em, "static const uint8_t policy_tiers[%d] = {", t->n);
		for (int j = 0; j < t->n; j++)
			kvp_em_out(em, "%s %s", j ? "," : "", TIER_ENUM[t->tier[j]]);
		kvp_em_out(em, " };\n");
		if (t->kind == K_TIERS_SHARES) {
			kvp_em_out(em, "static const double policy_tier_cum[%d] = {", t->n);
			for (int j = 0; j < t->n; j++) {
				kvp_em_out(em, "%s ", j ? "," : "");
				kvp_em_num(em, t->cum[j]);
			}
			kvp_em_out(em, " };\n");
		}
		kvp_em_out(em, "\n");
	}
	if (ir->alloc.layers == K_LAYERS_LIST && ir->alloc.n_list > 0)
		emit_array(em, "double policy_layer_list", ir->alloc.n_list, layer_row);
	if (ir->head_w) {
		kvp_em_out(em, "/* head_score(): the weight of each (layer, KV head), %d layers of %d KV heads\n"
		           " * (docs/language.md 7.12) */\n", ir->head_layers, ir->head_kv);
		kvp_em_out(em, "static const double policy_head_w[%d] = {\n", ir->head_layers * ir->head_kv);
		for (int l = 0; l < ir->head_layers; l++) {
			kvp_em_out(em, "\t");
			head_row(em, l);
			kvp_em_out(em, ",\n");
		}
		kvp_em_out(em, "};\n\n");
	}
	if (ir->lin_w)
		emit_linear(em);
}

static const struct local P_LOCAL[] = { { "P", "const double *P = ctx->params;" } };

static void budget_body(struct kvp_em *em, const void *arg)
{
	(void)arg;
	kvp_em_budget_return(em, "0.0");
}

/* budget_of: the policy's budget, or the runtime's compression-ratio override. */
static void emit_budget(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->alloc.budget < 0)
		return;
	if (ir->alloc.budget_bytes || ir->tiers.n > 0)
		kvp_em_out(em, "/* budget_of: per head on average, entries or (in bytes, k_bytes_mode) the bytes of\n"
		        " * that many f16 entries: the policy's budget, or context / R under a compression\n"
		        " * ratio R in entries (kvp_ctx.ratio) or in bytes (kvp_ctx.byte_ratio). */\n");
	else
		kvp_em_out(em, "/* budget_of: entries per head on average: the policy's budget, or context / R when\n"
		        " * the runtime overrides it with a compression ratio R (kvp_ctx.ratio, or\n"
		        " * kvp_ctx.byte_ratio: the bytes of that many f16 entries). */\n");
	kvp_em_out(em, "static inline double budget_of(const struct kvp_ctx *ctx, const rt_kv *kv, double seen)\n{\n");
	with_locals(em, P_LOCAL, 1, budget_body, NULL);
	kvp_em_out(em, "}\n\n");
}

/* The body of stat_read_k (kvp_emit.c), for with_locals. */
static void stat_read_body(struct kvp_em *em, const void *arg)
{
	kvp_em_stat_read(em, *(const int *)arg);
}

static void emit_stat_reads(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	for (int k = 0; k < ir->n_stats; k++) {
		const struct kvp_ir_stat *s = &ir->stats[k];
		kvp_em_out(em, "/* stat_%d ", k);
		kvp_em_comment_name(em, s->name);
		kvp_em_out(em, ": its value at compress time */\n");
		kvp_em_out(em, "static inline double stat_read_%d(const struct kvp_ctx *ctx, const rt_kv *kv,\n"
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
		kvp_em_out(em, "}\n\n");
	}
}

/* The body of observe: the output store, then the fused statistic loop. */
static void observe_body(struct kvp_em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir *ir = em->ir;
	const int keep_out = (ir->needs & KVP_NEED_OUT) != 0;
	if (keep_out)
		kvp_em_out(em, "\t/* exact CAOTE: the true attention output of each query head at this step */\n"
		        "\tif (ob->out)\n\t\tk_out_store(h->state, ob->out, ob->group, d);\n");
	if (ir->needs & KVP_NEED_QUERY) {
		int32_t ea = -1;
		for (int32_t v = 0; v < ir->n_nodes && ea < 0; v++)
			if (ir->nodes[v].op == KVP_OP_EXPATTN)
				ea = v;
		RT_ASSERT(ea >= 0);
		kvp_em_line_src(em, ir->nodes[ea].loc);
		kvp_em_out(em, "\t/* Expected Attention: the running mean and co-moment of each query head's\n"
		        "\t * pre-RoPE queries at positions >= skip (kernels/k_expattn.h) */\n"
		        "\tif (ob->query && (double)ob->step >= ");
		kvp_em_expr(em, ir->nodes[ea].b);
		kvp_em_out(em, ")\n\t\tk_ea_observe(EA_STATE(h, d), ob->query, ob->group, d);\n");
		kvp_em_line_back(em);
	}
	if (ir->n_stats == 0)
		return;
	kvp_em_stat_prelude(em, "\t");
	kvp_em_out(em, "\tfor (int32_t i = 0; i < n; i++) {\n");
	kvp_em_stat_entry(em);
	kvp_em_out(em, "\t}\n");
}

static void emit_observe(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->n_stats == 0 && !(ir->needs & (KVP_NEED_OUT | KVP_NEED_QUERY)))
		return;
	kvp_em_out(em, "/* observe: one step (query token ob->step) over head (layer, kv_head); updates\n"
	        " * every statistic of the ob->n visible entries (k_stat.h templates, fused). */\n");
	kvp_em_out(em, "static void observe(const struct kvp_ctx *ctx, rt_kv *kv, int layer, int kv_head,\n"
	        "                    const struct kvp_obs *ob)\n{\n");
	static const struct local loc[] = {
		{ "h", "rt_kv_head *h = rt_kv_head_at(kv, layer, kv_head);" },
		{ "P", "const double *P = ctx->params;" },
		{ "seen", "const double seen = (double)(ob->step + 1);" },
		{ "n", "const int32_t n = ob->n;" },
		{ "d", "const int d = kv->head_dim;" },
	};
	with_locals(em, loc, 5, observe_body, NULL);
	kvp_em_out(em, "}\n\n");
}

/* [cap] float temporaries score_q uses (cfg->n_tmp and scratch_bytes read this one
 * count): one per whole-head transform, then key_redundancy's result and norms. */
static int n_tmp_of(const struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	return em->n_vec + 2 * kvp_em_uses_signal(ir, ir->score.expr, KVP_SIG_KEY_REDUNDANCY);
}

/* The body of score_q: the whole-head transforms, then the elementwise tree. */
static void score_body(struct kvp_em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir *ir = em->ir;
	int32_t e = ir->score.expr;
	if (kvp_em_uses_signal(ir, e, KVP_SIG_KEY_COS_MEAN))
		kvp_em_out(em, "\tk_key_anchor(h->k, n, d, vec + d);\n");
	/* tmp slots n_vec (the result) and n_vec + 1 (norms) after the transforms'; computed
	 * for query head 0 and kept for the group's others, which k_run_head_scores
	 * (kernels/k_compress.h) scores next on the same thread and scratch */
	if (kvp_em_uses_signal(ir, e, KVP_SIG_KEY_REDUNDANCY))
		kvp_em_out(em, "\tif (r == 0)\n\t\tk_key_redundancy(h->k, h->pos, n, d, tmp + (size_t)%d * cap, "
		           "tmp + (size_t)%d * cap);\n", em->n_vec, em->n_vec + 1);
	for (int32_t v = 0; v <= e; v++) {
		if (em->vec_of[v] < 0)
			continue;
		const struct kvp_ir_expr *x = &ir->nodes[v];
		kvp_em_line_src(em, x->loc);
		if (x->op == KVP_OP_EXPATTN) {
			kvp_em_out(em, "\tk_ea_score(tmp + (size_t)%d * cap, h->k, h->pos, n, d, EA_STATE(h, d), r, seen,\n"
			        "\t           (double)(", (int)em->vec_of[v]);
			kvp_em_expr(em, x->a);
			kvp_em_out(em, "), (double)(");
			kvp_em_expr(em, x->b);
			kvp_em_out(em, "), ctx->rope_base,\n\t           k_ea_freq(ctx->rope_freq, layer, ctx->n_rot), ctx->n_rot, vec);\n");
			kvp_em_line_back(em);
			continue;
		}
		kvp_em_out(em, "\tfor (int32_t i = 0; i < n; i++)\n\t\ttmp[(size_t)%d * cap + (size_t)i] = (float)",
		    (int)em->vec_of[v]);
		kvp_em_expr(em, x->a);
		kvp_em_out(em, ";\n");
		kvp_em_line_back(em);
		if (x->op == KVP_OP_CAOTE && x->mode == KVP_CAOTE_FAST)
			kvp_em_out(em, "\tk_caote(tmp + (size_t)%d * cap, h->v, n, d, NULL, vec);\n",
			    (int)em->vec_of[v]);
		else if (x->op == KVP_OP_CAOTE)
			kvp_em_out(em, "\tk_caote(tmp + (size_t)%d * cap, h->v, n, d, k_out_row(h->state, r, d), vec);\n",
			    (int)em->vec_of[v]);
		else
			kvp_em_out(em, "\tk_normalize(tmp + (size_t)%d * cap, n);\n", (int)em->vec_of[v]);
	}
	kvp_em_line_src(em, ir->score.loc.line > 0 ? ir->score.loc : ir->nodes[e].loc);
	kvp_em_out(em, "\tfor (int32_t i = 0; i < n; i++)\n\t\tout[i] = (float)");
	kvp_em_expr(em, e);
	kvp_em_out(em, ";\n");
	kvp_em_line_back(em);
}

static void emit_score(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	int32_t e = ir->score.expr;
	if (e < 0 || ir->trigger.kind == KVP_TRIG_NEVER)
		return; /* no score, or no compress to use it */
	kvp_em_out(em, "/* score_q: the score of every entry of h for query head r (lowest evicted first):\n"
	        " *   ");
	kvp_em_expr_comment(em, e);
	kvp_em_out(em, "\n */\n");
	kvp_em_out(em, "static void score_q(const struct kvp_ctx *ctx, const rt_kv *kv, const rt_kv_head *h,\n"
	        "                    int layer, int r, float *out, float *tmp, double *vec)\n{\n");
	static const struct local loc[] = {
		{ "P", "const double *P = ctx->params;" },
		{ "seen", "const double seen = (double)ctx->seen;" },
		{ "n", "const int32_t n = h->n;" },
		{ "d", "const int d = kv->head_dim;" },
		{ "cap", "const size_t cap = (size_t)kv->cap;" },
	};
	with_locals(em, loc, 5, score_body, NULL);
	kvp_em_out(em, "}\n\n");
}

/* target expression (or budget) of compress and the trigger */
static void target_expr(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	kvp_em_budget_or(em, ir->trigger.target);
}

/* The body of fires: the trigger's condition, its schedule (every N steps, the prompt end,
 * per prefill block) joined with "the entries are over the target". */
static void fires_body(struct kvp_em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir_trig *tr = &em->ir->trigger;
	/* with a precision action a schedule fires whatever the entry count: the entries that
	 * left the recent window are downgraded even when none is evicted; with a threshold
	 * budget the entries whose score fell below the level are evicted whatever their count */
	const int tiered = em->ir->tiers.n > 0 || em->ir->alloc.threshold;
	const char *join = tiered ? NULL : " && entries > "; /* before the limit; NULL: none */
	int32_t limit = tr->target;
	kvp_em_line_src(em, tr->loc);
	switch (tr->kind) {
	case KVP_TRIG_NEVER:
		kvp_em_out(em, "\treturn 0");
		join = NULL;
		break;
	case KVP_TRIG_EVERY_STEP:
		kvp_em_out(em, tiered ? "\treturn 1" : "\treturn ");
		join = tiered ? NULL : "entries > ";
		break;
	case KVP_TRIG_OVER_BUDGET:
		kvp_em_out(em, "\treturn ");
		join = "entries > ";
		limit = tr->threshold;
		break;
	case KVP_TRIG_EVERY_N:
		kvp_em_out(em, "\treturn k_every(seen, ");
		kvp_em_scalar_or(em, tr->n, 1);
		kvp_em_out(em, ")");
		break;
	case KVP_TRIG_PROMPT_END:
		kvp_em_out(em, "\treturn ctx->prompt_len >= 0 && seen == (double)ctx->prompt_len");
		break;
	case KVP_TRIG_PREFILL_BLOCK:
		if (tr->prompt_only)
			kvp_em_out(em, "\tif (ctx->prompt_len >= 0 && seen > (double)ctx->prompt_len)\n"
			        "\t\treturn 0; /* blocks of the prompt only */\n");
		kvp_em_out(em, "\treturn (k_every(seen, ");
		kvp_em_scalar_or(em, tr->n, 1);
		kvp_em_out(em, ") || (ctx->prompt_len >= 0 && seen == (double)ctx->prompt_len))");
		break;
	}
	if (join) {
		kvp_em_out(em, "%s", join);
		kvp_em_budget_or(em, limit);
	}
	kvp_em_out(em, ";\n");
	kvp_em_line_back(em);
}

static void emit_trigger(struct kvp_em *em)
{
	kvp_em_out(em, "/* fires: would the trigger fire after `seen` tokens with `entries` entries per head\n"
	        " * on average (in f16 entries' worth under a byte budget, k_trigger_weight)?\n"
	        " * (should_compress asks now; next_trigger asks ahead) */\n");
	kvp_em_out(em, "static int fires(const struct kvp_ctx *ctx, const rt_kv *kv, double seen, double entries)\n{\n");
	with_locals(em, P_LOCAL, 1, fires_body, NULL);
	kvp_em_out(em, "}\n\n");
	/* `entries` in the budget's unit: under a byte budget an f32 row counts as two f16
	 * entries (k_trigger_weight) */
	const int bb = em->ir->alloc.budget_bytes;
	kvp_em_out(em, "static int should_compress(const struct kvp_ctx *ctx, const rt_kv *kv)\n{\n");
	kvp_em_out(em, "\treturn fires(ctx, kv, (double)ctx->seen,\n"
	        "\t             k_trigger_weight(ctx, kv, %d) * k_avg_entries(kv));\n}\n\n", bb);
	kvp_em_out(em, "/* next_trigger: the first k (tokens) after which fires() may hold, bounded by the\n"
	        " * room left in the store; 0 when no head has room. */\n");
	kvp_em_out(em, "static int32_t next_trigger(const struct kvp_ctx *ctx, const rt_kv *kv)\n{\n");
	kvp_em_out(em, "\tconst int32_t room = k_room(kv);\n");
	kvp_em_out(em, "\tconst double seen = (double)ctx->seen, w = k_trigger_weight(ctx, kv, %d),\n"
	        "\t             avg = k_avg_entries(kv);\n", bb);
	kvp_em_out(em, "\tfor (int32_t k = 1; k <= room; k++)\n");
	kvp_em_out(em, "\t\tif (fires(ctx, kv, seen + k, w * (avg + k)))\n\t\t\treturn k;\n");
	kvp_em_out(em, "\treturn room;\n}\n\n");
}

/* `FIELD = value;` for a GraceKV value that was written (e >= 0); the kernel's default
 * (k_grace_cfg_default) stands otherwise. int_field: the field is an int (a length). */
static void emit_grace_field(struct kvp_em *em, const char *field, int32_t e, int int_field)
{
	if (e < 0)
		return;
	kvp_em_out(em, "\t%s = %s", field, int_field ? "(int)(" : "");
	kvp_em_expr(em, e);
	kvp_em_out(em, "%s;\n", int_field ? ")" : "");
}

static void emit_grace_opt(struct kvp_em *em, const char *field, int32_t e)
{
	emit_grace_field(em, field, e, 0);
}

/* The protected spans of a configuration (cfg, or GraceKV's gc). */
static void emit_cfg_spans(struct kvp_em *em, const char *c)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->guards.protect_all_spans)
		kvp_em_out(em, "\t%s->protect_all_spans = 1;\n", c);
	if (ir->guards.n_spans > 0)
		kvp_em_out(em, "\t%s->spans = policy_spans;\n\t%s->n_spans = %d;\n", c, c,
		           ir->guards.n_spans);
}

/* The segmentation (`segment`) and prototype (`tree`) values of gc. ORDER(proto count):
 * ir->action.count 0/1 to K_PROTO_COUNT_COHERENCE / K_PROTO_COUNT_N (kernels/k_proto.h). */
static void emit_grace_tree(struct kvp_em *em)
{
	const struct kvp_ir_act *ac = &em->ir->action;
	kvp_em_line_src(em, ac->seg_loc);
	kvp_em_out(em, "\tgc->slot = ");
	kvp_em_scalar_or(em, ac->run, 64);
	kvp_em_out(em, ";\n");
	if (ac->seg_fixed)
		kvp_em_out(em, "\tgc->seg_fixed = 1;\n");
	emit_grace_field(em, "gc->seg.min_len", ac->seg_min, 1);
	emit_grace_field(em, "gc->seg.max_len", ac->seg_max, 1);
	emit_grace_opt(em, "gc->seg.cut", ac->seg_cut);
	emit_grace_opt(em, "gc->seg.length", ac->seg_length);
	emit_grace_opt(em, "gc->seg.stability", ac->seg_stability);
	emit_grace_opt(em, "gc->seg.surprisal", ac->seg_surprisal);
	if (ac->n_win > 0) {
		kvp_em_out(em, "\tgc->seg.n_win = %d;\n", ac->n_win);
		for (int i = 0; i < ac->n_win; i++)
			kvp_em_out(em, "\tgc->seg.win[%d] = %d;\n", i, (int)ac->win[i]);
	}
	kvp_em_line_back(em);
	if (ac->count == 0 && ac->smooth < 0)
		return;
	kvp_em_line_src(em, ac->tree_loc);
	if (ac->count == 1)
		kvp_em_out(em, "\tgc->count_mode = K_PROTO_COUNT_N;\n");
	emit_grace_opt(em, "gc->smooth", ac->smooth);
	kvp_em_line_back(em);
}

/* GraceKV's values in a struct k_grace_cfg (kernels/k_grace_run.h), from the
 * policy's guards, allocation, action and question window. */
static void emit_grace_cfg(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	kvp_em_out(em, "\tk_grace_cfg_default(gc);\n");
	kvp_em_out(em, "\tgc->name = cfg->name;\n\tgc->budget = cfg->budget;\n");
	kvp_em_out(em, "\tgc->sinks = cfg->has_sinks ? cfg->sinks : gc->sinks;\n");
	kvp_em_out(em, "\tgc->recent = cfg->has_recent ? cfg->recent : 0;\n");
	kvp_em_line_src(em, ir->alloc.loc);
	kvp_em_out(em, "\tgc->head_share = fmin(1.0, fmax(0.0, ");
	kvp_em_scalar_or(em, ir->alloc.floor, 0);
	kvp_em_out(em, "));\n");
	kvp_em_line_back(em);
	kvp_em_line_src(em, ir->action.loc);
	kvp_em_out(em, "\tgc->floor = ");
	kvp_em_scalar_or(em, ir->action.floor, 0);
	kvp_em_out(em, ";\n");
	if (ir->action.floor_all)
		kvp_em_out(em, "\tgc->floor_each = 0;\n");
	emit_grace_opt(em, "gc->lambda_z", ir->action.mass);
	emit_grace_opt(em, "gc->lambda_m", ir->action.numerator);
	kvp_em_line_back(em);
	emit_grace_tree(em);
	/* the question: the window of the first prompt-tail statistic, else the default */
	for (int k = 0; k < ir->n_stats; k++)
		if (ir->stats[k].hist == KVP_HIST_PROMPT_TAIL && ir->stats[k].window >= 0) {
			kvp_em_line_src(em, ir->stats[k].loc);
			kvp_em_out(em, "\tgc->probe = ");
			kvp_em_expr(em, ir->stats[k].window);
			kvp_em_out(em, ";\n");
			kvp_em_line_back(em);
			break;
		}
	if (ir->score.pool != K_POOL_NONE) {
		double k = 1;
		kvp_ir_fold(ir, ir->score.kernel, &k);
		kvp_em_out(em, "\tgc->pool = %d;\n\tgc->pool_max = %d;\n", (int)k, ir->score.pool == K_POOL_MAX);
	}
	emit_cfg_spans(em, "gc");
}

/* The score's reduction, pooling and the guards of cfg. */
static void emit_cfg_score_guards(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_score *sc = &ir->score;
	int has_score = sc->expr >= 0;
	kvp_em_out(em, "\tcfg->has_score = %d;\n", has_score);
	/* -1: the score is query-head independent, computed once (K_REDUCE_NONE implies it) */
	int per_q = has_score && kvp_ir_expr_per_qhead(ir, sc->expr);
	kvp_em_out(em, "\tcfg->reduce = %s;\n", per_q ? K_REDUCE_NAMES[sc->reduce] : "-1");
	kvp_em_out(em, "\tcfg->over_layer = %d;\n", sc->over_layer);
	if (sc->pool != K_POOL_NONE) {
		double k = 1;
		kvp_ir_fold(ir, sc->kernel, &k);
		kvp_em_out(em, "\tcfg->pool = %s;\n\tcfg->kernel = %d;\n\tcfg->pool_before_reduce = %d;\n",
		    K_POOL_NAMES[sc->pool], (int)k, sc->pool_before_reduce);
	}
	kvp_em_out(em, "\tcfg->n_tmp = %d;\n", n_tmp_of(em));
	kvp_em_out(em, "\tcfg->reads_rows = %d;\n", (ir->needs & (KVP_NEED_KEYS | KVP_NEED_VALUES)) != 0);
	kvp_em_out(em, "\tcfg->keep_order = %d;\n", ir->positions == KVP_POS_COMPACTED);
	kvp_em_line_src(em, ir->alloc.loc);
	kvp_em_out(em, "\tcfg->target = ");
	target_expr(em);
	kvp_em_out(em, ";\n");
	kvp_em_line_back(em);
	if (ir->guards.sinks >= 0 || ir->guards.recent >= 0) {
		int follow = 0;
		for (int g = 0; g < 2; g++) {
			int32_t e = g ? ir->guards.recent : ir->guards.sinks;
			follow |= kvp_em_uses_signal(ir, e, KVP_SIG_CONTEXT) || kvp_em_uses_signal(ir, e, KVP_SIG_SEEN) ||
			          kvp_em_uses_signal(ir, e, KVP_SIG_PROMPT_LEN) || kvp_em_uses_signal(ir, e, KVP_SIG_BUDGET);
		}
		if (follow)
			kvp_em_out(em, "\tcfg->guards_follow_context = 1;\n");
		kvp_em_cfg_guards(em, "cfg->");
	}
	emit_cfg_spans(em, "cfg");
}

/* The allocation and the action of cfg. */
static void emit_cfg_alloc_action(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_alloc *al = &ir->alloc;
	kvp_em_cfg_layers(em, "cfg->");
	if (al->layers == K_LAYERS_LIST && al->n_list > 0) {
		kvp_em_out(em, "\tcfg->list = policy_layer_list;\n\tcfg->n_list = %d;\n", al->n_list);
	}
	kvp_em_out(em, "\tcfg->heads = %s;\n", K_HEADS_NAMES[al->heads]);
	if (al->heads != K_HEADS_EACH) {
		kvp_em_out(em, "\tcfg->floor_frac = fmin(1.0, fmax(0.0, ");
		kvp_em_scalar_or(em, al->floor, 0.2);
		kvp_em_out(em, "));\n");
	}
	if (kvp_ir_grace_core(ir))
		return; /* GraceKV's actions read their values from the k_grace_cfg */
	kvp_em_line_src(em, ir->action.loc);
	kvp_em_out(em, "\tcfg->action = %s;\n", K_ACT_NAMES[ir->action.kind]);
	if (ir->action.kind != K_ACT_EVICT) {
		kvp_em_out(em, "\tcfg->run = ");
		kvp_em_scalar_or(em, ir->action.run, 0);
		kvp_em_out(em, ";\n");
	}
	if (ir->action.kind == K_ACT_SPLIT) {
		kvp_em_out(em, "\tcfg->single_floor = ");
		kvp_em_scalar_or(em, ir->action.floor, 0);
		kvp_em_out(em, ";\n");
	}
	kvp_em_line_back(em);
}

static void config_body(struct kvp_em *em, const void *arg)
{
	(void)arg;
	const struct kvp_ir *ir = em->ir;
	kvp_em_out(em, "\tmemset(cfg, 0, sizeof *cfg);\n");
	kvp_em_out(em, "\tcfg->name = \"");
	kvp_em_cstr(em, ir->name);
	kvp_em_out(em, "\";\n\tcfg->budget = budget_of(ctx, kv, seen);\n");
	if (ir->alloc.budget_unit == KVP_UNIT_RATIO)
		kvp_em_out(em, "\tcfg->budget_shared = 1;\n");
	if (ir->alloc.min >= 0) { /* the floor: k_budget_check applies it under any override */
		kvp_em_line_src(em, ir->alloc.loc);
		kvp_em_out(em, "\tcfg->min_kv = ");
		kvp_em_expr(em, ir->alloc.min);
		kvp_em_out(em, ";\n");
		kvp_em_line_back(em);
	}
	if (ir->alloc.budget_bytes)
		kvp_em_out(em, "\tcfg->budget_bytes = 1;\n");
	if (ir->alloc.threshold) {
		kvp_em_out(em, "\tcfg->threshold = 1;\n\tcfg->level = ");
		kvp_em_expr(em, ir->alloc.level);
		kvp_em_out(em, ";\n");
	}
	emit_cfg_score_guards(em);
	emit_cfg_alloc_action(em);
	if (ir->tiers.n > 0) {
		kvp_em_line_src(em, ir->tiers.loc);
		kvp_em_out(em, "\tcfg->tiers = %s;\n\tcfg->n_tier = %d;\n\tcfg->tier = policy_tiers;\n",
		    K_TIERS_NAMES[ir->tiers.kind], ir->tiers.n);
		if (ir->tiers.kind == K_TIERS_SHARES)
			kvp_em_out(em, "\tcfg->tier_cum = policy_tier_cum;\n");
		if (ir->tiers.window > 0)
			kvp_em_out(em, "\tcfg->tier_window = %.17g;\n", ir->tiers.window);
		if (ir->tiers.edge_layers > 0)
			kvp_em_out(em, "\tcfg->tier_edge = %s;\n\tcfg->tier_edge_layers = %d;\n",
			           TIER_ENUM[ir->tiers.edge], ir->tiers.edge_layers);
		kvp_em_line_back(em);
	}
}

static void grace_config_body(struct kvp_em *em, const void *arg)
{
	(void)arg;
	emit_grace_cfg(em);
}

/* config(): the policy's compress configuration after `seen` tokens, shared by compress
 * and check. */
static void emit_config(struct kvp_em *em)
{
	kvp_em_out(em, "/* config: this policy's compress configuration (kernels/k_compress.h) after\n"
	        " * `seen` tokens, with the parameters in force. */\n");
	kvp_em_out(em, "static void config(const struct kvp_ctx *ctx, const rt_kv *kv, double seen,\n"
	        "                   struct k_compress_cfg *cfg)\n{\n");
	with_locals(em, P_LOCAL, 1, config_body, NULL);
	kvp_em_out(em, "}\n\n");
}

static void emit_compress(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (ir->trigger.kind == KVP_TRIG_NEVER)
		return;
	int has_score = ir->score.expr >= 0;
	int grace = kvp_ir_grace_core(ir);
	emit_config(em);
	if (grace) {
		kvp_em_out(em, "/* grace_config: the values of GraceKV's actions (kernels/k_grace_run.h). */\n");
		kvp_em_out(em, "static void grace_config(const struct kvp_ctx *ctx, const struct k_compress_cfg *cfg,\n"
		        "                         struct k_grace_cfg *gc)\n{\n");
		with_locals(em, P_LOCAL, 1, grace_config_body, NULL);
		kvp_em_out(em, "}\n\n");
	}
	kvp_em_out(em, "/* compress: %s (kernels/k_compress.h) with this policy's pipeline. */\n",
	    grace ? "k_grace_run" : "k_compress_run");
	kvp_em_out(em, "static int compress(const struct kvp_ctx *ctx, rt_kv *kv, rt_err *err)\n{\n");
	if (ir->needs & KVP_NEED_OUT) {
		kvp_em_out(em, "\tif (kv->group > K_OUT_MAX_GROUP || kv->state_bytes < (size_t)K_OUT_MAX_GROUP * (size_t)kv->head_dim * sizeof(float))\n"
		        "\t\treturn rt_err_set(err, \"policy %%s: the exact CAOTE keeps the attention output of at most %%d query heads per KV head; this model has %%d\", \"");
		kvp_em_cstr(em, ir->name);
		kvp_em_out(em, "\", K_OUT_MAX_GROUP, kv->group);\n");
	}
	if (ir->needs & KVP_NEED_QUERY) {
		kvp_em_out(em, "\tif (kv->group > K_EA_MAX_GROUP || kv->state_bytes < %sk_ea_state_floats(kv->head_dim) * sizeof(float))\n"
		        "\t\treturn rt_err_set(err, \"policy %%s: Expected Attention keeps the query statistics of at most %%d query heads per KV head; this model has %%d\", \"",
		    (ir->needs & KVP_NEED_OUT) ? "(size_t)K_OUT_MAX_GROUP * (size_t)kv->head_dim * sizeof(float) + " : "");
		kvp_em_cstr(em, ir->name);
		kvp_em_out(em, "\", K_EA_MAX_GROUP, kv->group);\n");
	}
	kvp_em_out(em, "\tstruct k_compress_cfg cfg;\n\tconfig(ctx, kv, (double)ctx->seen, &cfg);\n");
	if (grace) {
		kvp_em_out(em, "\tstruct k_grace_cfg gc;\n\tgrace_config(ctx, &cfg, &gc);\n");
		kvp_em_out(em, "\treturn k_grace_run(ctx, kv, &cfg, %s, &gc, err);\n}\n\n",
		    has_score ? "score_q" : "NULL");
	} else {
		kvp_em_out(em, "\treturn k_compress_run(ctx, kv, &cfg, %s, err);\n}\n\n",
		    has_score ? "score_q" : "NULL");
	}
	kvp_em_out(em, "/* check: the budget and guards in force for a sequence whose context is the prompt\n"
	        " * (runtime/policy/rt_budget.h), before it starts. */\n");
	kvp_em_out(em, "static int check(const struct kvp_ctx *ctx, const rt_kv *kv, rt_err *err)\n{\n");
	kvp_em_out(em, "\tconst double seen = (double)ctx->prompt_len;\n");
	kvp_em_out(em, "\tstruct k_compress_cfg cfg;\n\tconfig(ctx, kv, seen, &cfg);\n");
	kvp_em_out(em, "\tdouble *lb = cfg.layers == K_LAYERS_UNIFORM ? NULL : (double *)ctx->scratch;\n");
	kvp_em_out(em, "\treturn k_budget_check(ctx, kv, &cfg, seen, seen, lb, err) < 0 ? -1 : 0;\n}\n\n");
	kvp_em_out(em, "static size_t scratch_bytes(const rt_kv *kv, int n_threads)\n{\n");
	if (grace) /* k_grace_run works on the calling thread */
		kvp_em_out(em, "\treturn k_grace_scratch_bytes(kv, %d)%s;\n}\n\n", n_tmp_of(em),
		    ir->tiers.n > 0 ? " + k_tier_scratch_bytes(kv)" : "");
	else
		kvp_em_out(em, "\treturn k_compress_scratch_bytes(kv, %d, n_threads)%s;\n}\n\n", n_tmp_of(em),
		    ir->tiers.n > 0 ? " + k_tier_scratch_bytes(kv)" : "");
}

static int live_rules(const struct kvp_ir *ir)
{
	int n = 0;
	for (int i = 0; i < ir->n_rules; i++)
		n += ir->rules[i].live;
	return n;
}

/* check_params: the value rules of the settings that read parameters (the IR's live
 * rules), on a run's values; kvpc applied them to the defaults. */
static void emit_check_params(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	if (live_rules(ir) == 0)
		return;
	static const char *const rule_enum[KVP_RULE_COUNT_] = {
#define RULE_ENUM_(id, test, text) [KVP_RULE_##id] = "KVP_RULE_" #id,
		KVP_RULES(RULE_ENUM_)
#undef RULE_ENUM_
	};
	kvp_em_out(em, "/* check_params: the value rules of the settings that read parameters (kvpc checked\n"
	           " * them on the defaults), on a run's values (runtime/policy/rt_policy.h KVP_RULES) */\n");
	kvp_em_out(em, "static int check_params(const struct kvp_policy *self, const double *P, rt_err *err)\n{\n");
	kvp_em_out(em, "\tdouble v;\n");
	for (int i = 0; i < ir->n_rules; i++) {
		const struct kvp_ir_rule *r = &ir->rules[i];
		if (!r->live)
			continue;
		kvp_em_out(em, "\tv = ");
		kvp_em_expr(em, r->expr);
		kvp_em_out(em, ";\n\tif (!kvp_rule_ok(%s, v))\n", rule_enum[r->rule]);
		kvp_em_out(em, "\t\treturn kvp_rule_fail(err, self, %s, \"", rule_enum[r->rule]);
		kvp_em_cstr(em, r->what);
		kvp_em_out(em, "\", %d, v);\n", r->loc.line);
	}
	kvp_em_out(em, "\treturn 0;\n}\n\n");
}

static void emit_policy(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	char sym[300];
	kvp_emit_symbol(ir->name, sym, sizeof sym);
	int compresses = ir->trigger.kind != KVP_TRIG_NEVER;
	kvp_em_out(em, "extern const struct kvp_policy %s;\n", sym);
	kvp_em_out(em, "const struct kvp_policy %s = {\n", sym);
	kvp_em_out(em, "\t.abi_version = KVP_ABI_VERSION,\n");
	const char *const strs[][2] = { { "name", ir->name }, { "source", ir->source },
	                                { "source_hash", ir->source_hash },
	                                { "summary", ir->summary },
	                                { "statements", ir->statements ? ir->statements : "" } };
	for (int i = 0; i < 5; i++) {
		kvp_em_out(em, "\t.%s = \"", strs[i][0]);
		kvp_em_cstr(em, strs[i][1]);
		kvp_em_out(em, "\",\n");
	}
	kvp_em_out(em, "\t.n_params = %d,\n", ir->n_params);
	kvp_em_out(em, "\t.params = %s,\n", ir->n_params > 0 ? "policy_params" : "NULL");
	kvp_em_out(em, "\t.stat_words_entry = STAT_WORDS_ENTRY,\n\t.stat_words_qhead = STAT_WORDS_QHEAD,\n");
	kvp_em_out(em, "\t.state_words = %u,\n\t.state_words_dim = %u,\n", ir->state_words,
	    ir->state_words_dim);
	if (ir->state_words_dim2)
		kvp_em_out(em, "\t.state_words_dim2 = %u,\n", ir->state_words_dim2);
	if (ir->alloc.budget_bytes)
		kvp_em_out(em, "\t.budget_bytes = 1,\n");
	if (ir->tiers.rotate)
		kvp_em_out(em, "\t.tier_rotate = %u,\n", ir->tiers.rotate);
	if (ir->trigger.kind == KVP_TRIG_PROMPT_END) /* measured after a prompt (rt_policy.h) */
		kvp_em_out(em, "\t.measure = KVP_MEASURE_PROMPT_END,\n");
	if (ir->alloc.layers == K_LAYERS_GLOBAL_ONLY)
		kvp_em_out(em, "\t.global_only = 1,\n");
	if (ir->lin_w) { /* the model shape rt_seq_init requires (KVP_NEED_HIDDEN) */
		kvp_em_out(em, "\t.hidden_shape = { %d, %d, %d },\n\t.hidden_file = \"", ir->lin_layers,
		    ir->lin_kv, ir->lin_embd);
		kvp_em_cstr(em, ir->lin_file);
		kvp_em_out(em, "\",\n");
	}
	kvp_em_out(em, "\t.positions = %s,\n",
	    ir->positions == KVP_POS_COMPACTED ? "KVP_POS_COMPACTED" : "KVP_POS_ORIGINAL");
	kvp_em_out(em, "\t.needs = ");
	/* ORDER(needs): bit b of KVP_NEED_* (runtime/policy/rt_policy.h) is needs[b] */
	static const char *const needs[] = { "KVP_NEED_ATTN", "KVP_NEED_OUT", "KVP_NEED_KEYS",
	                                     "KVP_NEED_VALUES", "KVP_NEED_SPANS", "KVP_NEED_PROMPT_LEN",
	                                     "KVP_NEED_TRACE", "KVP_NEED_F32_KV", "KVP_NEED_TIERS",
	                                     "KVP_NEED_QUERY", "KVP_NEED_REPLAY", "KVP_NEED_HIDDEN" };
	_Static_assert(sizeof needs / sizeof needs[0] == 12, "ORDER(needs): one name per KVP_NEED_ bit");
	int first = 1;
	for (int b = 0; b < (int)(sizeof needs / sizeof needs[0]); b++)
		if (ir->needs & (1u << b)) {
			kvp_em_out(em, "%s%s", first ? "" : " | ", needs[b]);
			first = 0;
		}
	if (first)
		kvp_em_out(em, "0");
	kvp_em_out(em, ",\n\t.init_entries = %s,\n", ir->lin_w ? "init_entries" : "NULL");
	kvp_em_out(em, "\t.observe = %s,\n",
	    ir->n_stats > 0 || (ir->needs & (KVP_NEED_OUT | KVP_NEED_QUERY)) ? "observe" : "NULL");
	kvp_em_out(em, "\t.should_compress = should_compress,\n");
	kvp_em_out(em, "\t.compress = %s,\n", compresses ? "compress" : "NULL");
	kvp_em_out(em, "\t.next_trigger = next_trigger,\n");
	kvp_em_out(em, "\t.scratch_bytes = %s,\n", compresses ? "scratch_bytes" : "NULL");
	kvp_em_out(em, "\t.check = %s,\n", compresses ? "check" : "NULL");
	kvp_em_out(em, "\t.check_params = %s,\n};\n", live_rules(ir) > 0 ? "check_params" : "NULL");
}

int kvp_emit_c(const struct kvp_ir *ir, const struct kvp_emit_opts *opts, FILE *f)
{
	RT_ASSERT(ir->checked); /* the layout and the indices were validated */
	struct kvp_emit_opts defaults = { 1, NULL };
	struct kvp_em em = { 0 };
	em.ir = ir;
	em.opts = opts ? opts : &defaults;
	em.t = &C_TARGET;
	em.view = &C_VIEW;
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
	emit_check_params(&em);
	emit_policy(&em);
	int rc = kvp_em_write(&em, f);
	kvp_em_free(&em);
	free(em.vec_of);
	return rc;
}

int kvp_emit_registry(const char *const *names, int n, FILE *f, char *err, size_t err_len)
{
	struct kvp_em em = { 0 };
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
	kvp_em_out(&em, "/* generated from %d polic%s by kvpc %s \xe2\x80\x94 do not edit */\n", n,
	    n == 1 ? "y" : "ies", KVP_VERSION);
	kvp_em_out(&em, "/* The registry of the policies compiled into this binary, in command-line order. */\n");
	kvp_em_out(&em, "#include <stddef.h>\n\n#include \"policy/rt_policy.h\"\n\n");
	for (int i = 0; i < n; i++)
		kvp_em_out(&em, "extern const struct kvp_policy %s;\n", syms[i]);
	kvp_em_out(&em, "\nconst struct kvp_policy *const kvp_registry[%d] = {\n", n + 1);
	for (int i = 0; i < n; i++)
		kvp_em_out(&em, "\t&%s,\n", syms[i]);
	kvp_em_out(&em, "\tNULL,\n};\n\nconst int kvp_registry_count = %d;\n", n);
	int rc = kvp_em_write(&em, f);
	kvp_em_free(&em);
	free(syms);
	return rc;
}
