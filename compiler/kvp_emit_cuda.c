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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_emit.h"

/* The CUDA spelling: the scalar block x (struct k_cu_scalar, below) and the entry views
 * ob (struct k_cu_obs, kernels/k_attn.cuh) and sc (struct k_cu_sc, kernels/k_compact.cuh).
 * key_cos_mean and the whole-head transforms need the whole head: such a policy
 * compresses on the host (kvp_emit_cuda_host_why). */
static const struct kvp_emit_target CU_TARGET = {
	.param = "x.P[%d]",
	.stat = "stat_read_%d(sc, x, i, r)",
	.budget = "budget_of(x, seen)",
	.context = "k_context_at(x.prompt_len, seen)",
	.prompt_len = "k_prompt_len_at(x.prompt_len, seen)",
	.n_layers = "(double)x.n_layer",
	.prompt_raw = "x.prompt_len",
	.seen_raw = "(int64_t)sc.seen",
	.ratio = "x.ratio",
	.byte_ratio = "x.byte_ratio",
	.step = "ob.step",
	.stat_block = "k_stat_at(ob.stats, ob.stat_bytes, i)",
	.group = "ob.group",
	.attn = "ob.probs[(size_t)r * (size_t)ob.ld + (size_t)i]",
	.void_attn = 1,
	.host_score = 0,
};

static const struct kvp_emit_view OB_VIEW = { "ob.", "ob.hd", "ob.n", "ob.layer" };
static const struct kvp_emit_view SC_VIEW = { "sc.", "sc.hd", "sc.n", "sc.layer" };
static int uses(const struct kvp_ir *ir, int32_t e, int op, int sig)
{
	if (e < 0)
		return 0;
	const struct kvp_ir_expr *x = &ir->nodes[e];
	if ((int)x->op == op && (op != KVP_OP_SIGNAL || (int)x->sig == sig))
		return 1;
	return uses(ir, x->a, op, sig) || uses(ir, x->b, op, sig) || uses(ir, x->c, op, sig);
}

const char *kvp_emit_cuda_host_why(const struct kvp_ir *ir)
{
	if (ir->trigger.kind == KVP_TRIG_NEVER)
		return "the policy never compresses";
	if (kvp_ir_grace_core(ir))
		return "GraceKV's prototype trees (kernels/k_grace_run.h) run on the host";
	if (ir->tiers.n > 0)
		return "precision tiers (kernels/k_tier.h) set the tiers of a tiered host store";
	if (ir->alloc.threshold)
		return "a threshold budget (budget = threshold(L)) counts the passing entries on the host";
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
	if (uses(ir, e, KVP_OP_HEADW, 0))
		return "head_score()'s weights are read on the host";
	if (uses(ir, e, KVP_OP_LINEAR, 0))
		return "linear_score() reads the hidden states on the host";
	if (uses(ir, e, KVP_OP_SIGNAL, KVP_SIG_KEY_REDUNDANCY))
		return "key_redundancy (every pair of a head's keys) runs on the host";
	if (uses(ir, e, KVP_OP_SIGNAL, KVP_SIG_REPLAY_ATTN))
		return "replay_attn (the context replay's scores) is read on the host";
	if (uses(ir, e, KVP_OP_SIGNAL, KVP_SIG_KEY_COS_MEAN))
		return "key_cos_mean (a whole-head anchor) runs on the host";
	return NULL;
}

/* ---- sections ---------------------------------------------------------------------------- */

static void emit_header(struct kvp_em *em, const char *sym, const char *why)
{
	const struct kvp_ir *ir = em->ir;
	kvp_em_out(em, "/* generated from ");
	kvp_em_comment_path(em, ir->source);
	kvp_em_out(em, " by kvpc %s \xe2\x80\x94 do not edit */\n", KVP_VERSION);
	kvp_em_out(em, "/*\n * The CUDA half of policy ");
	kvp_em_comment_name(em, ir->name);
	kvp_em_out(em, " (runtime/cuda/rt_cuda_policy.h); its C half is %s.\n", sym);
	kvp_em_out(em, " * Statistics, 4-byte words per entry: %u shared, then %u per query head.\n",
	    ir->stat_words_entry, ir->stat_words_qhead);
	kvp_em_out(em, " * Observe: fused into the attention kernel (kernels/k_attn.cuh), %s.\n",
	    ir->n_stats > 0 || (ir->needs & KVP_NEED_OUT) ? "updating the statistics" : "nothing to update");
	if (why)
		kvp_em_out(em, " * Compress: on the host (%s).\n */\n", why);
	else
		kvp_em_out(em, " * Compress: on the device (kernels/k_compact.cuh).\n */\n");
	kvp_em_out(em, "#include <math.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <string.h>\n\n");
	kvp_em_out(em, "#include \"k_attn.cuh\"\n#include \"k_compact.cuh\"\n");
	/* the C kernels (k_score.h, k_signal.h through k_compress.h; k_stat.h) keep C linkage */
	kvp_em_out(em, "#include \"cuda/rt_cuda_compress.cuh\"\n\nextern \"C\" {\n#include \"k_stat.h\"\n}\n\n");
	kvp_em_out(em, "#define STAT_WORDS_ENTRY %uu\n#define STAT_WORDS_QHEAD %uu\n\n", ir->stat_words_entry,
	    ir->stat_words_qhead);
	kvp_em_out(em, "extern \"C\" const struct kvp_policy %s;\n\nnamespace {\n\n", sym);
	kvp_em_out(em, "/* what scalar expressions read: parameters, prompt length, ratio, layers */\n"
	        "struct k_cu_scalar {\n\tconst double *P;\n\tint64_t prompt_len;\n\tdouble ratio, byte_ratio;\n\tint n_layer;\n};\n\n");
}

static void emit_budget(struct kvp_em *em)
{
	kvp_em_out(em, "/* budget_of: entries per head on average (the policy's budget, or context / R under\n"
	               " * a compression ratio R in entries or in bytes) */\n");
	kvp_em_out(em, "K_HD double budget_of(const struct k_cu_scalar &x, double seen)\n{\n");
	kvp_em_budget_return(em, "0.0");
	kvp_em_out(em, "}\n\n");
}

static void emit_stat_reads(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	for (int k = 0; k < ir->n_stats; k++) {
		const struct kvp_ir_stat *s = &ir->stats[k];
		if (!kvp_em_uses_stat(ir, ir->score.expr, k))
			continue;
		kvp_em_out(em, "/* stat_%d ", k);
		kvp_em_comment_name(em, s->name);
		kvp_em_out(em, " at compress time */\n");
		kvp_em_out(em, "K_HD double stat_read_%d(const struct k_cu_sc &sc, const struct k_cu_scalar &x, int32_t i, int r)\n{\n", k);
		kvp_em_out(em, "\tconst uint32_t *b = k_stat_cat(sc.stats, sc.stat_bytes, i);\n");
		kvp_em_out(em, "\tconst double seen = sc.seen;\n\t(void)x;\n\t(void)seen;\n\t(void)r;\n");
		if (s->per_qhead)
			kvp_em_out(em, "\tconst uint32_t *w = b + STAT_WORDS_ENTRY + (size_t)r * STAT_WORDS_QHEAD + %d;\n",
			    (int)s->word);
		else
			kvp_em_out(em, "\tconst uint32_t *w = b + %d;\n", (int)s->word);
		if (s->kind != KVP_STAT_MEAN)
			kvp_em_out(em, "\t(void)b;\n");
		kvp_em_stat_read(em, k);
		kvp_em_out(em, "}\n\n");
	}
}

static void emit_obs(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	const int need_out = (ir->needs & KVP_NEED_OUT) != 0;
	em->view = &OB_VIEW;
	kvp_em_out(em, "/* obs: the statistic update of one visible entry i at step ob.step, run inside the\n"
	        " * attention kernel with this row's probabilities (the C observe's loop body) */\n");
	kvp_em_out(em, "struct obs {\n\tenum { active = %d, need_out = %d };\n", ir->n_stats > 0, need_out);
	kvp_em_out(em, "\tK_HD static void entry(const struct k_cu_obs &ob, int32_t i)\n\t{\n");
	kvp_em_out(em, "\t\tconst struct k_cu_scalar x = { ob.P, ob.prompt_len, ob.ratio, ob.byte_ratio, ob.n_layer };\n");
	kvp_em_out(em, "\t\tconst double seen = (double)(ob.step + 1);\n\t\t(void)x;\n\t\t(void)seen;\n\t\t(void)i;\n");
	if (ir->n_stats == 0) {
		kvp_em_out(em, "\t}\n};\n\n");
		return;
	}
	kvp_em_stat_prelude(em, "\t\t");
	kvp_em_stat_entry(em);
	kvp_em_out(em, "\t}\n};\n\n");
}

static void emit_score(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	em->view = &SC_VIEW;
	int32_t e = ir->score.expr;
	kvp_em_out(em, "/* score: the score of entry i for query head r (lowest evicted first) */\n");
	kvp_em_out(em, "struct score {\n\tenum { per_q = %d };\n", e >= 0 && kvp_ir_expr_per_qhead(ir, e));
	kvp_em_out(em, "\tK_HD static float at(const struct k_cu_sc &sc, int32_t i, int r)\n\t{\n");
	kvp_em_out(em, "\t\tconst struct k_cu_scalar x = { sc.P, sc.prompt_len, sc.ratio, sc.byte_ratio, sc.n_layer };\n");
	kvp_em_out(em, "\t\tconst double seen = sc.seen;\n\t\t(void)x;\n\t\t(void)seen;\n\t\t(void)i;\n\t\t(void)r;\n");
	if (e >= 0)
		kvp_em_line_src(em, ir->score.loc.line > 0 ? ir->score.loc : ir->nodes[e].loc);
	kvp_em_out(em, "\t\treturn (float)");
	if (e >= 0)
		kvp_em_expr(em, e);
	else
		kvp_em_out(em, "0.0");
	kvp_em_out(em, ";\n");
	kvp_em_line_back(em);
	kvp_em_out(em, "\t}\n};\n\n");
}

static void emit_compress(struct kvp_em *em)
{
	const struct kvp_ir *ir = em->ir;
	const struct kvp_ir_score *sc = &ir->score;
	const struct kvp_ir_alloc *al = &ir->alloc;
	kvp_em_out(em, "/* compress: the device pipeline (runtime/cuda/rt_cuda_compress.cuh) configured as\n"
	        " * the C compress configures k_compress_run */\n");
	kvp_em_out(em, "void compress_cfg(const struct kvp_ctx *ctx, const rt_kv *kv, struct k_compress_cfg *c)\n{\n");
	kvp_em_out(em, "\tconst struct k_cu_scalar x = { ctx->params, ctx->prompt_len, ctx->ratio, ctx->byte_ratio, kv->n_layer };\n");
	kvp_em_out(em, "\tconst double seen = (double)ctx->seen;\n");
	kvp_em_out(em, "\tstruct k_compress_cfg &cfg = *c;\n\tmemset(&cfg, 0, sizeof cfg);\n");
	kvp_em_out(em, "\tcfg.name = \"");
	kvp_em_cstr(em, ir->name);
	kvp_em_out(em, "\";\n\tcfg.budget = budget_of(x, seen);\n");
	if (al->min >= 0) { /* the floor: rt_cuda_compress_run applies it as the C side does */
		kvp_em_line_src(em, al->loc);
		kvp_em_out(em, "\tcfg.min_kv = ");
		kvp_em_expr(em, al->min);
		kvp_em_out(em, ";\n");
		kvp_em_line_back(em);
	}
	int has_score = sc->expr >= 0;
	int per_q = has_score && kvp_ir_expr_per_qhead(ir, sc->expr);
	kvp_em_out(em, "\tcfg.has_score = %d;\n\tcfg.reduce = %s;\n", has_score,
	    per_q ? K_REDUCE_NAMES[sc->reduce] : "-1");
	if (sc->pool != K_POOL_NONE) {
		double k = 1;
		kvp_ir_fold(ir, sc->kernel, &k);
		kvp_em_out(em, "\tcfg.pool = %s;\n\tcfg.kernel = %d;\n\tcfg.pool_before_reduce = %d;\n",
		    K_POOL_NAMES[sc->pool], (int)k, sc->pool_before_reduce);
	}
	kvp_em_line_src(em, ir->alloc.loc);
	kvp_em_out(em, "\tcfg.target = ");
	kvp_em_budget_or(em, ir->trigger.target);
	kvp_em_out(em, ";\n");
	kvp_em_line_back(em);
	kvp_em_cfg_guards(em, "cfg.");
	kvp_em_cfg_layers(em, "cfg.");
	if (al->layers == K_LAYERS_LIST && al->n_list > 0) {
		kvp_em_out(em, "\tstatic const double list[%d] = {", al->n_list);
		for (int i = 0; i < al->n_list; i++) {
			kvp_em_out(em, i ? ", " : " ");
			kvp_em_num(em, al->list[i]);
		}
		kvp_em_out(em, " };\n\tcfg.list = list;\n\tcfg.n_list = %d;\n", al->n_list);
	}
	if (ir->guards.protect_all_spans)
		kvp_em_out(em, "\tcfg.protect_all_spans = 1;\n");
	if (ir->guards.n_spans > 0) {
		kvp_em_out(em, "\tstatic const char *const spans[%d] = {", ir->guards.n_spans);
		for (int i = 0; i < ir->guards.n_spans; i++) {
			kvp_em_out(em, " \"");
			kvp_em_cstr(em, ir->guards.spans[i]);
			kvp_em_out(em, "\",");
		}
		kvp_em_out(em, " };\n\tcfg.spans = spans;\n\tcfg.n_spans = %d;\n", ir->guards.n_spans);
	}
	kvp_em_out(em, "}\n\n");
	kvp_em_out(em, "int compress(const struct kvp_cuda_compress_in *in, rt_err *err)\n{\n"
	        "\tstruct k_compress_cfg cfg;\n\tcompress_cfg(in->ctx, in->shadow, &cfg);\n"
	        "\treturn rt_cuda_compress_run<score>(in, &cfg, %d, err);\n}\n\n", ir->n_params);
	kvp_em_out(em, "void compress_ref(const struct k_cu_compress_args *a, size_t hi)\n{\n"
	        "\tk_cu_compress_ref<score>(*a, hi);\n}\n\n");
}

int kvp_emit_cuda(const struct kvp_ir *ir, const struct kvp_emit_opts *opts, FILE *f)
{
	if (!ir->checked)
		return -1;
	struct kvp_emit_opts defaults = { 1, NULL };
	struct kvp_em em = { 0 };
	em.ir = ir;
	em.opts = opts ? opts : &defaults;
	em.t = &CU_TARGET;
	em.view = &OB_VIEW;
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
	kvp_em_out(&em, "int attend(const struct k_cu_attn_args *a, void *stream)\n{\n"
	         "\treturn (int)k_cu_attn_launch<obs>(a, (cudaStream_t)stream);\n}\n\n");
	kvp_em_out(&em, "void attend_ref(const struct k_cu_attn_args *a, int j, int r, float *P)\n{\n"
	         "\tk_cu_attn_ref<obs>(*a, j, r, P);\n}\n\n");
	if (!why)
		emit_compress(&em);
	kvp_em_out(&em, "} /* namespace */\n\n");
	kvp_em_out(&em, "extern \"C\" const struct kvp_cuda_policy %s;\n", csym);
	kvp_em_out(&em, "const struct kvp_cuda_policy %s = {\n", csym);
	kvp_em_out(&em, "\tKVP_CUDA_ABI_VERSION,\n\t&%s,\n\t\"", sym);
	kvp_em_cstr(&em, ir->name);
	kvp_em_out(&em, "\",\n\t\"");
	kvp_em_cstr(&em, ir->source_hash);
	kvp_em_out(&em, "\",\n\tattend,\n\t%s,\n\t\"", why ? "NULL" : "compress");
	kvp_em_cstr(&em, why ? why : "");
	kvp_em_out(&em, "\",\n\tattend_ref,\n\t%s,\n\t%s,\n};\n", why ? "NULL" : "compress_cfg",
	           why ? "NULL" : "compress_ref");
	int rc = kvp_em_write(&em, f);
	kvp_em_free(&em);
	return rc;
}

int kvp_emit_cuda_registry(const char *const *names, int n, FILE *f, char *err, size_t err_len)
{
	struct kvp_em em = { 0 };
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
	kvp_em_out(&em, "/* generated from %d polic%s by kvpc %s \xe2\x80\x94 do not edit */\n", n,
	    n == 1 ? "y" : "ies", KVP_VERSION);
	kvp_em_out(&em, "/* The CUDA policies of this binary (C registry order) and the backend table the\n"
	         " * command line finds (runtime/cuda/rt_cuda.h). */\n");
	kvp_em_out(&em, "#include <stddef.h>\n\n#include \"cuda/rt_cuda.h\"\n\n");
	for (int i = 0; i < n; i++)
		kvp_em_out(&em, "extern \"C\" const struct kvp_cuda_policy %s;\n", syms[i]);
	kvp_em_out(&em, "\nstatic const struct kvp_cuda_policy *const policies[%d] = {\n", n + 1);
	for (int i = 0; i < n; i++)
		kvp_em_out(&em, "\t&%s,\n", syms[i]);
	kvp_em_out(&em, "\tNULL,\n};\n\n");
	kvp_em_out(&em, "extern \"C\" const struct rt_cuda_backend kvp_cuda_backend;\n");
	kvp_em_out(&em, "const struct rt_cuda_backend kvp_cuda_backend = {\n"
	         "\trt_cuda_probe, rt_cuda_model_upload, rt_cuda_model_free, rt_cuda_seq_init,\n"
	         "\trt_cuda_seq_attach, rt_cuda_seq_free, rt_cuda_seq_reset, rt_cuda_seq_set,\n"
	         "\trt_cuda_seq_set_ratio, rt_cuda_seq_feed, rt_cuda_seq_kv, rt_cuda_refuses,\n"
	         "\tpolicies, %d,\n};\n", n);
	free(syms);
	int rc = kvp_em_write(&em, f);
	kvp_em_free(&em);
	return rc;
}
