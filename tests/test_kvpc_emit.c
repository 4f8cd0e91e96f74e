/*
 * test_kvpc_emit: the C back end (compiler/kvp_emit_c.c) and the IR checker
 * (compiler/kvp_ir.c), independent of the front end: policies are built as IR directly
 * here. Checks: golden generated C for four policies (tests/golden/emit/NAME.c.golden,
 * byte-identical, and a second emission identical to the first) and CUDA for two
 * (NAME.cu.golden, with its #line directives); every emitted unit
 * (golden ones and a wider set) compiles with -std=c11 -Wall -Wextra -Werror; #line
 * directives appear and disappear with the switch; hostile names, paths and strings
 * cannot leave their literal; symbols are sanitised and distinct; the registry unit;
 * the IR checker rejects invalid IR (attn in a score, a per-head score without a group
 * reduction, a non-constant ring window, an even pooling kernel, a missing budget).
 *
 * Regenerate the goldens (after an intended emitter change) with
 *   KVPC_UPDATE_GOLDEN=1 build/tests/test_kvpc_emit
 */
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvp_emit_c.h"
#include "kvp_emit_cuda.h"
#include "kvp_ir.h"
#include "kvp_sema.h"
#include "kvp_src.h"
#include "k_score.h"
#include "model/rt_model.h"
#include "policy/rt_pick.h"
#include "policy/rt_seq.h"
#include "support/check_run.h"
#include "support/tiny_model.h"

/* ---- IR-built policies (shaped like the policies/ files but built here, so the back
 * end is tested without the front end; their sources are named ir/NAME.kvp) ---------- */

#define L(n) ((struct kvp_loc){ (n), 5 })

static struct kvp_ir *ir_new(const char *name, const char *src)
{
	struct kvp_ir *ir = malloc(sizeof *ir);
	char h[17];
	kvp_ir_hash(name, strlen(name), h);
	kvp_ir_init(ir, name, src, h, "test policy");
	ir->loc = L(2);
	return ir;
}

static int32_t P(struct kvp_ir *ir, int p) { return kvp_ir_param_ref(ir, L(9), p); }
static int32_t N(struct kvp_ir *ir, double v) { return kvp_ir_num(ir, L(9), v); }
static int32_t S(struct kvp_ir *ir, enum kvp_ir_signal s) { return kvp_ir_signal(ir, L(9), s); }
static int32_t B(struct kvp_ir *ir, enum kvp_ir_op op, int32_t a, int32_t b)
{
	return kvp_ir_binary(ir, L(9), op, a, b);
}

/* H2O: accumulated attention, group sum, recent guard, every step (arXiv 2306.14048). */
static struct kvp_ir *ir_h2o(void)
{
	struct kvp_ir *ir = ir_new("h2o", "ir/h2o.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 64, KVP_UNIT_ENTRIES, "entries per KV head");
	int recent = kvp_ir_add_param(ir, L(4), "recent", 8, KVP_UNIT_TOKENS, "recent window");
	int acc = kvp_ir_add_stat(ir, L(5), "acc", KVP_STAT_SUM, S(ir, KVP_SIG_ATTN), -1,
	                          KVP_HIST_WHOLE, -1);
	ir->score.expr = kvp_ir_stat_ref(ir, L(6), acc);
	ir->score.loc = L(6);
	ir->score.reduce = K_REDUCE_SUM;
	ir->guards.recent = P(ir, recent);
	ir->guards.loc = L(8);
	ir->alloc.budget = P(ir, budget);
	ir->alloc.loc = L(7);
	ir->trigger.kind = KVP_TRIG_EVERY_STEP;
	ir->trigger.loc = L(9);
	return ir;
}

/* SnapKV: observation window over the prompt tail, max pooling k=7, prompt end. */
static struct kvp_ir *ir_snapkv(void)
{
	struct kvp_ir *ir = ir_new("snapkv", "ir/snapkv.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 1024, KVP_UNIT_ENTRIES, "");
	int window = kvp_ir_add_param(ir, L(4), "window", 32, KVP_UNIT_TOKENS, "observation window");
	int obs = kvp_ir_add_stat(ir, L(5), "obs", KVP_STAT_SUM, S(ir, KVP_SIG_ATTN), -1,
	                          KVP_HIST_PROMPT_TAIL, P(ir, window));
	ir->score.expr = kvp_ir_stat_ref(ir, L(6), obs);
	ir->score.loc = L(6);
	ir->score.reduce = K_REDUCE_MEAN;
	ir->score.pool = K_POOL_MAX;
	ir->score.kernel = N(ir, 7);
	ir->score.pool_before_reduce = 1;
	ir->guards.recent = P(ir, window);
	ir->alloc.budget = P(ir, budget);
	ir->trigger.kind = KVP_TRIG_PROMPT_END;
	return ir;
}

/* Scissorhands: count(attn < 1/seen) over the last 400 steps, batch eviction. */
static struct kvp_ir *ir_scissorhands(void)
{
	struct kvp_ir *ir = ir_new("scissorhands", "ir/scissorhands.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 0.2, KVP_UNIT_RATIO, "");
	int recent = kvp_ir_add_param(ir, L(4), "recent", 10, KVP_UNIT_TOKENS, "");
	int32_t cond = B(ir, KVP_OP_LT, S(ir, KVP_SIG_ATTN), B(ir, KVP_OP_DIV, N(ir, 1), S(ir, KVP_SIG_SEEN)));
	int low = kvp_ir_add_stat(ir, L(5), "low", KVP_STAT_COUNT, cond, -1, KVP_HIST_LAST_STEPS,
	                          N(ir, 400));
	ir->score.expr = kvp_ir_unary(ir, L(6), KVP_OP_NEG, kvp_ir_stat_ref(ir, L(6), low));
	ir->score.reduce = K_REDUCE_MEAN;
	ir->guards.recent = P(ir, recent);
	ir->alloc.budget = B(ir, KVP_OP_MUL, P(ir, budget), S(ir, KVP_SIG_CONTEXT));
	ir->alloc.budget_unit = KVP_UNIT_RATIO;
	ir->alloc.layers = K_LAYERS_LINEAR;
	ir->alloc.from = N(ir, 0.8);
	ir->alloc.to = N(ir, 1.2);
	ir->trigger.kind = KVP_TRIG_OVER_BUDGET;
	ir->trigger.target = B(ir, KVP_OP_MUL, N(ir, 0.5), ir->alloc.budget);
	return ir;
}

/* CAOTE (exact) over H2O's accumulated attention, the GQA rule l2, per prefill block of
 * 128: the score reads the TRUE attention output that observe keeps per query head. */
static struct kvp_ir *ir_caote_exact(void)
{
	struct kvp_ir *ir = ir_new("caote_exact", "ir/caote_exact.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 2048, KVP_UNIT_ENTRIES, "");
	int block = kvp_ir_add_param(ir, L(4), "block", 128, KVP_UNIT_TOKENS, "prefill block");
	int acc = kvp_ir_add_stat(ir, L(5), "acc", KVP_STAT_SUM, S(ir, KVP_SIG_ATTN), -1,
	                          KVP_HIST_WHOLE, -1);
	ir->score.expr = kvp_ir_caote(ir, L(6), KVP_CAOTE_EXACT, kvp_ir_stat_ref(ir, L(6), acc));
	ir->score.loc = L(6);
	ir->score.reduce = K_REDUCE_L2;
	ir->alloc.budget = P(ir, budget);
	ir->alloc.loc = L(7);
	ir->trigger.kind = KVP_TRIG_PREFILL_BLOCK;
	ir->trigger.n = P(ir, block);
	ir->trigger.loc = L(8);
	return ir;
}

/* An exact CAOTE of a score that reads no attention (key norm): no statistics, yet the
 * policy observes (to keep the outputs) and its score depends on the query head. */
static struct kvp_ir *ir_caote_knorm(void)
{
	struct kvp_ir *ir = ir_new("caote_knorm", "ir/caote_knorm.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 64, KVP_UNIT_ENTRIES, "");
	ir->score.expr = kvp_ir_caote(ir, L(4), KVP_CAOTE_EXACT, S(ir, KVP_SIG_KEY_NORM));
	ir->score.reduce = K_REDUCE_MEAN;
	ir->alloc.budget = P(ir, budget);
	ir->trigger.kind = KVP_TRIG_EVERY_STEP;
	return ir;
}

/* CAOTE over H2O (fast form), per prefill block, with a merge action and spans: touches
 * the remaining emitter paths. */
static struct kvp_ir *ir_caote_mix(void)
{
	struct kvp_ir *ir = ir_new("caote_mix", "ir/caote_mix.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 256, KVP_UNIT_ENTRIES, "");
	int acc = kvp_ir_add_stat(ir, L(4), "acc", KVP_STAT_MEAN, S(ir, KVP_SIG_ATTN), -1,
	                          KVP_HIST_WHOLE, -1);
	int ema = kvp_ir_add_stat(ir, L(5), "e", KVP_STAT_EMA, S(ir, KVP_SIG_ATTN), N(ir, 0.1),
	                          KVP_HIST_WHOLE, -1);
	int win = kvp_ir_add_stat(ir, L(6), "w", KVP_STAT_MEAN, S(ir, KVP_SIG_ATTN), -1,
	                          KVP_HIST_LAST_STEPS, N(ir, 16));
	int32_t base = B(ir, KVP_OP_ADD, kvp_ir_stat_ref(ir, L(7), acc),
	                 B(ir, KVP_OP_MAX, kvp_ir_stat_ref(ir, L(7), ema), kvp_ir_stat_ref(ir, L(7), win)));
	int32_t c = kvp_ir_caote(ir, L(7), KVP_CAOTE_FAST, base);
	int32_t kd = kvp_ir_unary(ir, L(7), KVP_OP_NEG, S(ir, KVP_SIG_KEY_COS_MEAN));
	ir->score.expr = kvp_ir_select(ir, L(7), B(ir, KVP_OP_GT, S(ir, KVP_SIG_SIZE), N(ir, 1)),
	                               B(ir, KVP_OP_MUL, c, S(ir, KVP_SIG_VALUE_NORM)),
	                               B(ir, KVP_OP_ADD, c, kd));
	ir->score.reduce = K_REDUCE_MAX;
	ir->guards.sinks = N(ir, 4);
	kvp_ir_add_span(ir, "system");
	kvp_ir_add_span(ir, "cit\"*/ations\\?\?=");
	ir->alloc.budget = P(ir, budget);
	ir->alloc.layers = K_LAYERS_LIST;
	double m[3] = { 1, 2, 3 };
	kvp_ir_set_list(ir, m, 3);
	ir->alloc.heads = K_HEADS_ADAPTIVE;
	ir->action.kind = K_ACT_SPLIT;
	ir->action.run = N(ir, 8);
	ir->action.floor = N(ir, 2);
	ir->trigger.kind = KVP_TRIG_PREFILL_BLOCK;
	ir->trigger.n = N(ir, 128);
	ir->positions = KVP_POS_COMPACTED;
	return ir;
}

/* A policy whose every string is hostile. */
static struct kvp_ir *ir_hostile(void)
{
	struct kvp_ir *ir = malloc(sizeof *ir);
	kvp_ir_init(ir, "evil */ int x; /*\"\n#include <stdio.h>", "we\"ird*/path\\\n.kvp", NULL,
	            "summary */ \"\\ ?\?/ \n");
	kvp_ir_add_param(ir, L(1), "p\"); system(\"rm", 1, KVP_UNIT_SCALAR, "doc */ \n#define");
	kvp_ir_add_stat(ir, L(2), "s*/x", KVP_STAT_LAST, S(ir, KVP_SIG_ATTN), -1, KVP_HIST_WHOLE, -1);
	ir->score.expr = kvp_ir_stat_ref(ir, L(3), 0);
	ir->alloc.budget = N(ir, 16);
	ir->trigger.kind = KVP_TRIG_EVERY_N;
	ir->trigger.n = N(ir, 4);
	return ir;
}

static void ir_delete(struct kvp_ir *ir)
{
	kvp_ir_free(ir);
	free(ir);
}

/* ---- helpers ------------------------------------------------------------------------ */

static void diag_print(void *user, struct kvp_loc loc, const char *msg)
{
	int *n = user;
	(*n)++;
	fprintf(stderr, "ir:%d:%d: %s\n", loc.line, loc.col, msg);
}

/* Emit ir into a heap string, in C or (cuda) CUDA. */
static char *emit_to(struct kvp_ir *ir, int lines, const char *out_name, int cuda)
{
	int nd = 0;
	ck_assert_int_eq(kvp_ir_check(ir, diag_print, &nd), 0);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	struct kvp_emit_opts o = { lines, out_name };
	ck_assert_int_eq(cuda ? kvp_emit_cuda(ir, &o, f) : kvp_emit_c(ir, &o, f), 0);
	fclose(f);
	return buf;
}

static char *emit_str(struct kvp_ir *ir, int lines, const char *out_name)
{
	return emit_to(ir, lines, out_name, 0);
}

static char *read_all(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	size_t got = fread(b, 1, (size_t)n, f);
	b[got] = 0;
	fclose(f);
	return b;
}

static void write_all(const char *path, const char *s)
{
	FILE *f = fopen(path, "wb");
	ck_assert_msg(f != NULL, "cannot write %s", path);
	fputs(s, f);
	fclose(f);
}

/* Compile C source with the project's strict flags; returns the exit status. */
static int compile_c(const char *src, const char *tag)
{
	char dir[64] = "/tmp/kvpc_emit_";
	size_t dl = strlen(dir);
	memset(dir + dl, 'X', 6); /* mkdtemp's template suffix */
	dir[dl + 6] = 0;
	ck_assert_ptr_nonnull(mkdtemp(dir));
	char cpath[256], opath[256], cmd[1024];
	snprintf(cpath, sizeof cpath, "%s/%s.c", dir, tag);
	snprintf(opath, sizeof opath, "%s/%s.o", dir, tag);
	write_all(cpath, src);
	const char *cc = getenv("CC") ? getenv("CC") : "cc";
	snprintf(cmd, sizeof cmd,
	         "%s -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Iruntime -Ikernels -c %s -o %s 2>&1",
	         cc, cpath, opath);
	int rc = system(cmd);
	unlink(cpath);
	unlink(opath);
	rmdir(dir);
	return rc;
}

static void golden_check(struct kvp_ir *ir, const char *name)
{
	char path[256], outname[256];
	snprintf(path, sizeof path, "tests/golden/emit/%s.c.golden", name);
	snprintf(outname, sizeof outname, "ir/%s.c", name);
	char *a = emit_str(ir, 1, outname);
	char *b = emit_str(ir, 1, outname);
	ck_assert_str_eq(a, b); /* deterministic within a process */
	if (getenv("KVPC_UPDATE_GOLDEN")) {
		mkdir("tests/golden", 0755);
		mkdir("tests/golden/emit", 0755);
		write_all(path, a);
	}
	char *g = read_all(path);
	ck_assert_msg(g != NULL, "missing golden %s (run with KVPC_UPDATE_GOLDEN=1)", path);
	ck_assert_msg(strcmp(a, g) == 0, "%s differs from the emitter output", path);
	ck_assert_int_eq(compile_c(a, name), 0);
	free(a);
	free(b);
	free(g);
}

/* The CUDA unit of ir against tests/golden/emit/NAME.cu.golden (not compiled here: nvcc
 * builds every policy's unit in `make cuda`); #line directives come and go with the
 * switch, as in C. */
static void golden_check_cuda(struct kvp_ir *ir, const char *name)
{
	char path[256], outname[256];
	snprintf(path, sizeof path, "tests/golden/emit/%s.cu.golden", name);
	snprintf(outname, sizeof outname, "ir/%s.cu", name);
	char *a = emit_to(ir, 1, outname, 1);
	char *b = emit_to(ir, 1, outname, 1);
	char *plain = emit_to(ir, 0, outname, 1);
	ck_assert_str_eq(a, b);
	ck_assert_ptr_nonnull(strstr(a, "#line "));
	ck_assert_ptr_null(strstr(plain, "#line "));
	if (getenv("KVPC_UPDATE_GOLDEN"))
		write_all(path, a);
	char *g = read_all(path);
	ck_assert_msg(g != NULL, "missing golden %s (run with KVPC_UPDATE_GOLDEN=1)", path);
	ck_assert_msg(strcmp(a, g) == 0, "%s differs from the emitter output", path);
	free(a);
	free(b);
	free(plain);
	free(g);
}

/* ---- tests ------------------------------------------------------------------------ */

START_TEST(golden_h2o)
{
	struct kvp_ir *ir = ir_h2o();
	golden_check(ir, "h2o");
	golden_check_cuda(ir, "h2o");
	ir_delete(ir);
}
END_TEST

START_TEST(golden_snapkv)
{
	struct kvp_ir *ir = ir_snapkv();
	golden_check(ir, "snapkv");
	golden_check_cuda(ir, "snapkv");
	ir_delete(ir);
}
END_TEST

START_TEST(golden_scissorhands)
{
	struct kvp_ir *ir = ir_scissorhands();
	golden_check(ir, "scissorhands");
	ir_delete(ir);
}
END_TEST

START_TEST(golden_caote_exact)
{
	struct kvp_ir *ir = ir_caote_exact();
	golden_check(ir, "caote_exact");
	/* the exact CAOTE asks the runtime for the attention outputs and keeps one row of
	 * head_dim floats per query head in the per-head state */
	ck_assert_uint_eq(ir->needs & KVP_NEED_OUT, KVP_NEED_OUT);
	ck_assert_uint_eq(ir->needs & KVP_NEED_ATTN, KVP_NEED_ATTN);
	ck_assert_uint_eq(ir->state_words_dim, KVP_IR_OUT_ROWS);
	char *s = emit_str(ir, 0, "caote_exact.c");
	ck_assert_ptr_nonnull(strstr(s, ".needs = KVP_NEED_ATTN | KVP_NEED_OUT | KVP_NEED_VALUES"));
	ck_assert_ptr_nonnull(strstr(s, "k_out_store(h->state, ob->out, ob->group, d);"));
	ck_assert_ptr_nonnull(strstr(s, "k_out_row(h->state, r, d)"));
	ck_assert_ptr_nonnull(strstr(s, "cfg->reduce = K_REDUCE_L2;"));
	ck_assert_ptr_nonnull(strstr(s, ".state_words_dim = 16,"));
	free(s);
	ir_delete(ir);
	/* fast mode reads no output */
	struct kvp_ir *f = ir_caote_mix();
	free(emit_str(f, 0, "caote_mix.c")); /* checks and lays out the IR */
	ck_assert_uint_eq(f->needs & KVP_NEED_VALUES, KVP_NEED_VALUES);
	ck_assert_uint_eq(f->needs & KVP_NEED_OUT, 0);
	ck_assert_uint_eq(f->state_words_dim, 0);
	ir_delete(f);
	/* no statistics: observe only keeps the outputs */
	struct kvp_ir *k = ir_caote_knorm();
	ck_assert_int_eq(kvp_ir_expr_per_qhead(k, k->score.expr), 1);
	char *ks = emit_str(k, 1, "caote_knorm.c");
	ck_assert_int_eq(compile_c(ks, "caote_knorm"), 0);
	ck_assert_ptr_nonnull(strstr(ks, ".observe = observe,"));
	ck_assert_ptr_nonnull(strstr(ks, ".needs = KVP_NEED_OUT | KVP_NEED_KEYS | KVP_NEED_VALUES"));
	free(ks);
	ir_delete(k);
}
END_TEST

START_TEST(compiles_all_paths)
{
	struct kvp_ir *ir = ir_caote_mix();
	char *s = emit_str(ir, 1, "caote_mix.c");
	ck_assert_int_eq(compile_c(s, "caote_mix"), 0);
	ck_assert_ptr_nonnull(strstr(s, "k_caote("));
	ck_assert_ptr_nonnull(strstr(s, "k_stat_ring_put("));
	ck_assert_ptr_nonnull(strstr(s, "k_stat_ema("));
	ck_assert_ptr_nonnull(strstr(s, "K_HEADS_ADAPTIVE"));
	ck_assert_ptr_nonnull(strstr(s, "K_ACT_SPLIT"));
	ck_assert_ptr_nonnull(strstr(s, "KVP_POS_COMPACTED"));
	free(s);
	ir_delete(ir);
}
END_TEST

START_TEST(line_directives_switch)
{
	struct kvp_ir *ir = ir_h2o();
	char *on = emit_str(ir, 1, "out.c");
	char *off = emit_str(ir, 0, "out.c");
	ck_assert_ptr_nonnull(strstr(on, "#line 5 \"ir/h2o.kvp\"\n"));
	ck_assert_ptr_nonnull(strstr(on, "\"out.c\"\n"));
	ck_assert_ptr_null(strstr(off, "#line"));
	ck_assert_int_eq(compile_c(off, "h2o_nolines"), 0);
	/* every switch back names the line that follows it */
	int line = 1;
	for (const char *p = on; *p; p++) {
		if (p == on || p[-1] == '\n') {
			int n, used = 0;
			if (sscanf(p, "#line %d %n", &n, &used) == 1 && used > 0 &&
			    strncmp(p + used, "\"out.c\"\n", 8) == 0)
				ck_assert_int_eq(n, line + 1);
		}
		if (*p == '\n')
			line++;
	}
	free(on);
	free(off);
	ir_delete(ir);
}
END_TEST

START_TEST(banner_and_determinism)
{
	struct kvp_ir *a = ir_scissorhands(), *b = ir_scissorhands();
	char *sa = emit_str(a, 1, "x.c"), *sb = emit_str(b, 1, "x.c");
	ck_assert_str_eq(sa, sb);
	const char *banner = "/* generated from ir/scissorhands.kvp by kvpc " KVP_VERSION
	                     " \xe2\x80\x94 do not edit */\n";
	ck_assert_int_eq(strncmp(sa, banner, strlen(banner)), 0);
	free(sa);
	free(sb);
	ir_delete(a);
	ir_delete(b);
}
END_TEST

START_TEST(no_injection)
{
	struct kvp_ir *ir = ir_hostile();
	char *s = emit_str(ir, 1, "out\"*/.c");
	/* it compiles, so nothing escaped a literal or a comment */
	ck_assert_int_eq(compile_c(s, "hostile"), 0);
	/* code outside literals and comments: the hostile text must not be there; and
	 * literals hold only printable ASCII (escapes for the rest) */
	size_t n = strlen(s);
	char *code = calloc(n + 1, 1);
	size_t m = 0;
	for (const char *p = s; *p; p++) {
		if (p[0] == '"') {
			for (p++; *p && *p != '"'; p++) {
				ck_assert_msg(*p != '\n' && (unsigned char)*p < 0x7f, "raw byte in a literal");
				ck_assert_msg(!(p[0] == '?' && p[1] == '?'), "trigraph in a literal");
				if (*p == '\\' && p[1])
					p++;
			}
			continue;
		}
		if (p[0] == '/' && p[1] == '*') {
			const char *end = strstr(p + 2, "*/");
			ck_assert_ptr_nonnull(end);
			p = end + 1;
			continue;
		}
		code[m++] = *p;
	}
	ck_assert_ptr_null(strstr(code, "system"));
	ck_assert_ptr_null(strstr(code, "int x"));
	ck_assert_ptr_null(strstr(code, "#include <stdio.h>"));
	ck_assert_ptr_null(strstr(code, "#define\n"));
	free(code);
	free(s);
	ir_delete(ir);
}
END_TEST

/* A trigger limit/target that repeats the budget's expression (a front end inlining
 * `budget`) is emitted as budget_of() so a ratio override moves it; a guard that happens
 * to equal the budget is not. */
START_TEST(budget_copies_follow_override)
{
	struct kvp_ir *ir = ir_new("copy", "ir/copy.kvp");
	int w = kvp_ir_add_param(ir, L(2), "w", 64, KVP_UNIT_ENTRIES, "");
	ir->alloc.budget = B(ir, KVP_OP_MUL, P(ir, w), N(ir, 2));
	ir->trigger.kind = KVP_TRIG_OVER_BUDGET;
	ir->trigger.threshold = B(ir, KVP_OP_MUL, P(ir, w), N(ir, 2));
	ir->trigger.target = B(ir, KVP_OP_MUL, N(ir, 0.5), B(ir, KVP_OP_MUL, P(ir, w), N(ir, 2)));
	ir->guards.recent = B(ir, KVP_OP_MUL, P(ir, w), N(ir, 2));
	char *src = emit_str(ir, 0, NULL);
	ck_assert_ptr_nonnull(strstr(src, "return entries > budget_of(ctx, kv, seen);"));
	ck_assert_ptr_nonnull(strstr(src, "cfg->target = (0.5 * budget_of(ctx, kv, seen));"));
	ck_assert_ptr_nonnull(strstr(src, "cfg->recent = (P[0] * 2.0);"));
	free(src);
	ir_delete(ir);
}
END_TEST

START_TEST(symbols)
{
	char a[300], b[300], c[300];
	kvp_emit_symbol("h2o", a, sizeof a);
	ck_assert_str_eq(a, "kvp_policy_h2o");
	kvp_emit_symbol("My-Pol", b, sizeof b);
	kvp_emit_symbol("my_pol", c, sizeof c);
	ck_assert_str_ne(b, c);
	ck_assert_int_eq(strncmp(b, "kvp_policy_my_pol_", 18), 0);
	ck_assert_uint_eq(strspn(b, "abcdefghijklmnopqrstuvwxyz0123456789_"), strlen(b));
	kvp_emit_symbol("", a, sizeof a);
	ck_assert_uint_eq(strspn(a, "abcdefghijklmnopqrstuvwxyz0123456789_"), strlen(a));
	ck_assert_str_ne(a, "kvp_policy_");
}
END_TEST

START_TEST(registry)
{
	const char *names[] = { "h2o", "snapkv", "My Policy" };
	char *buf = NULL, err[256] = "";
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	ck_assert_int_eq(kvp_emit_registry(names, 3, f, err, sizeof err), 0);
	fclose(f);
	ck_assert_ptr_nonnull(strstr(buf, "&kvp_policy_h2o,\n\t&kvp_policy_snapkv,\n"));
	ck_assert_ptr_nonnull(strstr(buf, "const int kvp_registry_count = 3;"));
	ck_assert_int_eq(compile_c(buf, "registry"), 0);
	free(buf);
	const char *dup[] = { "a-b", "a-b" };
	f = open_memstream(&buf, &len);
	ck_assert_int_eq(kvp_emit_registry(dup, 2, f, err, sizeof err), -1);
	fclose(f);
	ck_assert_ptr_nonnull(strstr(err, "policies 1 and 2"));
	free(buf);
}
END_TEST

static int check_count(struct kvp_ir *ir)
{
	int n = 0;
	int r = kvp_ir_check(ir, diag_print, &n);
	ck_assert_int_eq(r, n);
	return r;
}

START_TEST(checker_rejects)
{
	/* attn in a score */
	struct kvp_ir *ir = ir_h2o();
	ir->score.expr = S(ir, KVP_SIG_ATTN);
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	/* per-query-head score with reduce NONE */
	ir = ir_h2o();
	ir->score.reduce = K_REDUCE_NONE;
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	/* ring window from a param */
	ir = ir_h2o();
	kvp_ir_add_stat(ir, L(3), "x", KVP_STAT_COUNT, S(ir, KVP_SIG_ATTN), -1, KVP_HIST_LAST_STEPS,
	                P(ir, 0));
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	/* a float ring longer than KVP_IR_MAX_FLOAT_RING; the same window is fine for count */
	ir = ir_h2o();
	kvp_ir_add_stat(ir, L(3), "m", KVP_STAT_MEAN, S(ir, KVP_SIG_ATTN), -1, KVP_HIST_LAST_STEPS,
	                N(ir, KVP_IR_MAX_FLOAT_RING + 1));
	kvp_ir_add_stat(ir, L(3), "c", KVP_STAT_COUNT, S(ir, KVP_SIG_ATTN), -1, KVP_HIST_LAST_STEPS,
	                N(ir, KVP_IR_MAX_FLOAT_RING + 1));
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	/* even pooling kernel */
	ir = ir_snapkv();
	ir->score.kernel = N(ir, 4);
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	/* missing budget with a trigger */
	ir = ir_h2o();
	ir->alloc.budget = -1;
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	/* key_cos_mean in a statistic, a stat in a budget */
	ir = ir_h2o();
	kvp_ir_add_stat(ir, L(3), "y", KVP_STAT_SUM, S(ir, KVP_SIG_KEY_COS_MEAN), -1, KVP_HIST_WHOLE, -1);
	ir->alloc.budget = kvp_ir_stat_ref(ir, L(4), 0);
	ck_assert_int_eq(check_count(ir), 2);
	ir_delete(ir);
	/* forward reference (operand index not below its parent) */
	ir = ir_h2o();
	int32_t e = B(ir, KVP_OP_ADD, N(ir, 1), N(ir, 2));
	ir->nodes[e].b = e + 5;
	ir->score.expr = e;
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	/* the budget defined through itself; 'budget' used without a budget */
	ir = ir_h2o();
	ir->alloc.budget = B(ir, KVP_OP_MUL, N(ir, 2), S(ir, KVP_SIG_BUDGET));
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	ir = ir_h2o();
	ir->trigger.kind = KVP_TRIG_NEVER;
	ir->alloc.budget = -1;
	ir->guards.recent = S(ir, KVP_SIG_BUDGET);
	ck_assert_int_eq(check_count(ir), 1);
	ir_delete(ir);
	/* valid ones pass */
	ir = ir_caote_mix();
	ck_assert_int_eq(check_count(ir), 0);
	ir_delete(ir);
}
END_TEST

START_TEST(layout_words)
{
	struct kvp_ir *ir = ir_scissorhands();
	ck_assert_int_eq(check_count(ir), 0);
	/* 400 one-bit cells = 13 words per query head; nothing shared */
	ck_assert_uint_eq(ir->stat_words_qhead, 13);
	ck_assert_uint_eq(ir->stat_words_entry, 0);
	ck_assert_uint_eq(ir->needs & KVP_NEED_ATTN, KVP_NEED_ATTN);
	ir_delete(ir);
	ir = ir_caote_mix();
	ck_assert_int_eq(check_count(ir), 0);
	/* shared visible-step counter; acc 1 + ema 1 + ring 16 per query head */
	ck_assert_uint_eq(ir->stat_words_entry, 1);
	ck_assert_uint_eq(ir->stat_words_qhead, 18);
	ck_assert_uint_eq(ir->needs & (KVP_NEED_KEYS | KVP_NEED_VALUES | KVP_NEED_SPANS),
	                  KVP_NEED_KEYS | KVP_NEED_VALUES | KVP_NEED_SPANS);
	ir_delete(ir);
}
END_TEST

/* The library policies through the real front end (kvp_compile): two independent
 * compilations emit byte-identical C, and the --no-line form compiles -Werror. */
static char *compile_policy(const char *path, int lines)
{
	char err[256] = "";
	kvp_src *src = kvp_src_open(path, err, sizeof err);
	ck_assert_msg(src != NULL, "%s", err);
	struct kvp_ir ir;
	int ne = kvp_compile(src, &ir);
	ck_assert_msg(ne == 0, "%s: %s", path, kvp_src_diags(src));
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	struct kvp_emit_opts o = { lines, "out.c" };
	ck_assert_int_eq(kvp_emit_c(&ir, &o, f), 0);
	fclose(f);
	kvp_ir_free(&ir);
	kvp_src_free(src);
	return buf;
}

START_TEST(library_policies)
{
	DIR *d = opendir("policies");
	ck_assert_ptr_nonnull(d);
	struct dirent *e;
	int n = 0;
	while ((e = readdir(d)) != NULL) {
		size_t l = strlen(e->d_name);
		if (l < 5 || strcmp(e->d_name + l - 4, ".kvp") != 0)
			continue;
		char path[512];
		snprintf(path, sizeof path, "policies/%s", e->d_name);
		char *a = compile_policy(path, 1), *b = compile_policy(path, 1);
		ck_assert_msg(strcmp(a, b) == 0, "%s: two compilations differ", path);
		char banner[600];
		snprintf(banner, sizeof banner, "/* generated from %s by kvpc ", path);
		ck_assert_int_eq(strncmp(a, banner, strlen(banner)), 0);
		ck_assert_ptr_nonnull(strstr(a, "#line "));
		char *c = compile_policy(path, 0);
		ck_assert_ptr_null(strstr(c, "#line"));
		/* declares only what it uses: compiled -Wall -Wextra -Werror (unused variables are
		 * errors) without silencing casts */
		ck_assert_msg(strstr(c, "(void)") == NULL, "%s: emitted C has a (void) line", path);
		ck_assert_msg(compile_c(c, "lib") == 0, "%s: emitted C does not compile", path);
		free(a);
		free(b);
		free(c);
		n++;
	}
	closedir(d);
	ck_assert_int_ge(n, 12);
}
END_TEST

/* ---- random valid IR: every combination the checker accepts must emit C that
 * compiles -Werror (emitter coverage beyond the hand-built policies) ----------------- */

static unsigned rnd_state = 12345;
static unsigned rnd(unsigned n)
{
	rnd_state = rnd_state * 1103515245u + 12345u;
	return (rnd_state >> 16) % n;
}

static int rnd_no_budget; /* generating the budget itself: no KVP_SIG_BUDGET */

static int32_t rnd_expr(struct kvp_ir *ir, enum kvp_ir_ctx c, int depth)
{
	static const enum kvp_ir_signal scalar[] = { KVP_SIG_SEEN, KVP_SIG_CONTEXT,
	                                             KVP_SIG_PROMPT_LEN, KVP_SIG_N_LAYERS,
	                                             KVP_SIG_BUDGET };
	static const enum kvp_ir_signal observe[] = { KVP_SIG_ATTN, KVP_SIG_SEEN, KVP_SIG_POS,
	                                              KVP_SIG_AGE, KVP_SIG_SIZE, KVP_SIG_ENTRIES,
	                                              KVP_SIG_KEY_NORM, KVP_SIG_VALUE_NORM,
	                                              KVP_SIG_LAYER };
	static const enum kvp_ir_signal score[] = { KVP_SIG_POS, KVP_SIG_AGE, KVP_SIG_KEY_NORM,
	                                            KVP_SIG_VALUE_NORM, KVP_SIG_KEY_COS_MEAN,
	                                            KVP_SIG_CONTEXT, KVP_SIG_SIZE };
	unsigned k = depth > 3 ? rnd(3) : rnd(9);
	if (k == 0)
		return N(ir, (double)rnd(100) / 7.0 - 3);
	if (k == 1 && ir->n_params > 0)
		return P(ir, (int)rnd((unsigned)ir->n_params));
	if (k == 1 || k == 2) {
		if (c == KVP_CTX_SCALAR)
			return S(ir, scalar[rnd(rnd_no_budget ? 4 : 5)]);
		if (c == KVP_CTX_OBSERVE)
			return S(ir, observe[rnd(9)]);
		if (ir->n_stats > 0 && rnd(2))
			return kvp_ir_stat_ref(ir, L(9), (int)rnd((unsigned)ir->n_stats));
		return S(ir, score[rnd(7)]);
	}
	if (k == 3)
		return kvp_ir_unary(ir, L(9), (enum kvp_ir_op)(KVP_OP_NEG + rnd(6)),
		                    rnd_expr(ir, c, depth + 1));
	if (k == 4)
		return kvp_ir_select(ir, L(9), rnd_expr(ir, c, depth + 1), rnd_expr(ir, c, depth + 1),
		                     rnd_expr(ir, c, depth + 1));
	if (k == 5 && c == KVP_CTX_SCORE)
		return rnd(2) ? kvp_ir_caote(ir, L(9), (enum kvp_ir_caote_mode)rnd(2), rnd_expr(ir, c, depth + 1))
		              : kvp_ir_normalize(ir, L(9), rnd_expr(ir, c, depth + 1));
	int32_t a = rnd_expr(ir, c, depth + 1), b = rnd_expr(ir, c, depth + 1);
	return B(ir, (enum kvp_ir_op)(KVP_OP_ADD + rnd(15)), a, b);
}

static struct kvp_ir *ir_random(int seed)
{
	rnd_state = (unsigned)seed * 2654435761u + 1;
	char name[32];
	snprintf(name, sizeof name, "random_%d", seed);
	struct kvp_ir *ir = ir_new(name, "ir/random.kvp");
	int np = (int)rnd(4);
	for (int i = 0; i < np; i++) {
		char pn[16];
		snprintf(pn, sizeof pn, "p%d", i);
		kvp_ir_add_param(ir, L(2 + i), pn, (double)rnd(50), (enum kvp_unit)rnd(5), "");
	}
	int ns = (int)rnd(4);
	for (int i = 0; i < ns; i++) {
		char sn[16];
		snprintf(sn, sizeof sn, "s%d", i);
		enum kvp_ir_stat_kind kind = (enum kvp_ir_stat_kind)rnd(5);
		enum kvp_ir_history hist = (enum kvp_ir_history)rnd(3);
		int32_t arg = rnd_expr(ir, KVP_CTX_OBSERVE, 0);
		int32_t alpha = kind == KVP_STAT_EMA ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
		int32_t win = hist == KVP_HIST_LAST_STEPS ? N(ir, 1 + rnd(100)) :
		              hist == KVP_HIST_PROMPT_TAIL ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
		kvp_ir_add_stat(ir, L(6 + i), sn, kind, arg, alpha, hist, win);
	}
	ir->score.expr = rnd(5) ? rnd_expr(ir, KVP_CTX_SCORE, 0) : -1;
	ir->score.reduce = (enum k_reduce)rnd(3);
	ir->score.pool = (enum k_pool)rnd(3);
	ir->score.kernel = N(ir, 1 + 2 * rnd(4));
	ir->score.pool_before_reduce = (int)rnd(2);
	ir->trigger.kind = (enum kvp_ir_trigger)rnd(6);
	ir->trigger.n = rnd_expr(ir, KVP_CTX_SCALAR, 2);
	ir->trigger.threshold = rnd(2) ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
	ir->trigger.target = rnd(2) ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
	rnd_no_budget = 1;
	ir->alloc.budget = rnd_expr(ir, KVP_CTX_SCALAR, 1);
	rnd_no_budget = 0;
	ir->alloc.layers = (enum k_layers)rnd(5);
	ir->alloc.beta = rnd(2) ? N(ir, 20) : -1;
	ir->alloc.from = N(ir, 0.5);
	ir->alloc.to = rnd_expr(ir, KVP_CTX_SCALAR, 2);
	double m[2] = { 1, 2 };
	kvp_ir_set_list(ir, m, 2);
	ir->alloc.heads = (enum k_heads)rnd(3);
	ir->alloc.floor = rnd(2) ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
	ir->action.kind = ir->alloc.heads == K_HEADS_EACH ? (enum k_act)rnd(3) : K_ACT_EVICT;
	ir->action.run = rnd(2) ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
	ir->action.floor = rnd(2) ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
	ir->score.over_layer = ir->alloc.heads == K_HEADS_EACH && ir->action.kind == K_ACT_EVICT ?
	                       (int)rnd(2) : 0;
	ir->guards.sinks = rnd(2) ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
	ir->guards.recent = rnd(2) ? rnd_expr(ir, KVP_CTX_SCALAR, 2) : -1;
	ir->guards.protect_all_spans = (int)rnd(2);
	if (rnd(2))
		kvp_ir_add_span(ir, "s\"pan");
	ir->positions = (enum kvp_positions)rnd(2);
	return ir;
}

/* Build src (one emitted policy) into a shared object together with the runtime pieces
 * its hooks call, load it and return its exported policy (NULL on failure). *handle
 * receives the dlopen handle. */
static const struct kvp_policy *load_policy(const char *src, const char *name, void **handle)
{
	char dir[64] = "/tmp/kvpc_run_";
	size_t dl = strlen(dir);
	memset(dir + dl, 'X', 6);
	dir[dl + 6] = 0;
	ck_assert_ptr_nonnull(mkdtemp(dir));
	char cpath[128], sopath[128], cmd[1024];
	snprintf(cpath, sizeof cpath, "%s/p.c", dir);
	snprintf(sopath, sizeof sopath, "%s/p.so", dir);
	write_all(cpath, src);
	const char *cc = getenv("CC") ? getenv("CC") : "cc";
	/* under `make test-asan` the policy is instrumented too */
	const char *san = getenv("KVRT_SANITIZED") ? "-fsanitize=address,undefined -fno-sanitize-recover=undefined" : "";
	snprintf(cmd, sizeof cmd,
	         "%s -std=c11 -O1 -D_GNU_SOURCE -fPIC -shared %s -Iruntime -Ikernels %s runtime/kv/rt_kv.c runtime/kv/rt_kvpool.c runtime/kv/rt_kvq.c "
	         "runtime/base/rt_util.c runtime/base/rt_pool.c runtime/policy/rt_budget.c -o %s -pthread -lm 2>&1",
	         cc, san, cpath, sopath);
	int rc = system(cmd);
	unlink(cpath);
	*handle = rc == 0 ? dlopen(sopath, RTLD_NOW | RTLD_LOCAL) : NULL;
	unlink(sopath);
	rmdir(dir);
	if (!*handle)
		return NULL;
	char sym[300];
	kvp_emit_symbol(name, sym, sizeof sym);
	return dlsym(*handle, sym);
}

/* Drive a loaded policy on 2 layers × 3 KV heads × group 3 for up to 80 tokens with
 * pseudo-random attention and keys, in chunks from rt_run_chunk; check the store's
 * invariants after every chunk: n <= cap, positions strictly increasing, counts >= 1,
 * and (for layer-wide selections) equal position lists across a layer's heads. */
static int64_t drive_policy(const struct kvp_policy *p, int prompt_len)
{
	enum { L = 2, G = 3, R = 3, D = 4, CAP = 48 };
	rt_kv kv;
	struct rt_run run;
	rt_err err = { "" };
	ck_assert_msg(rt_run_init(&run, &kv, p, L, G, R, D, CAP, prompt_len, &err) == 0, "%s",
	              err.msg);
	for (int i = 0; i < p->n_params; i++)
		run.params[i] = 1 + (double)(rnd(40)) / (rnd(2) ? 1 : 40);
	if (p->compress && rnd(3) == 0)
		ck_assert_int_eq(rt_run_set_ratio(&run, 1 + rnd(8), &err), 0);
	const char *names[2] = { NULL, "s\"pan" };
	run.ctx.span_names = names;
	run.ctx.n_spans = 1;
	float probs[R * CAP], outs[R * D], k[D], v[D];
	memset(outs, 0, sizeof outs);
	while (run.ctx.seen < 80) {
		int32_t c = rt_run_chunk(&run, &kv, 1 + (int32_t)rnd(6));
		if (c == 0)
			break; /* full and the policy does not make room: the runtime would stop */
		int64_t t0 = run.ctx.seen;
		for (int64_t t = t0; t < t0 + c; t++)
			for (int l = 0; l < L; l++)
				for (int g = 0; g < G; g++) {
					for (int j = 0; j < D; j++) {
						k[j] = (float)rnd(9) - 4;
						v[j] = (float)rnd(7) - 3;
					}
					rt_kv_head *h = rt_kv_head_at(&kv, l, g);
					int32_t i = rt_kv_append(&kv, h, k, v, (int32_t)t);
					h->span[i] = t % 11 == 3;
				}
		for (int64_t t = t0; t < t0 + c; t++)
			for (int l = 0; l < L; l++)
				for (int g = 0; g < G; g++) {
					rt_kv_head *h = rt_kv_head_at(&kv, l, g);
					int32_t n = 0;
					while (n < h->n && h->pos[n] <= t)
						n++;
					for (int r = 0; r < R; r++) {
						double sum = 0;
						for (int32_t i = 0; i < n; i++)
							sum += probs[r * n + i] = (float)(1 + rnd(5));
						for (int32_t i = 0; i < n; i++)
							probs[r * n + i] = (float)(probs[r * n + i] / sum);
					}
					struct kvp_obs ob = { t, n, R, probs, outs };
					if (p->observe)
						p->observe(&run.ctx, &kv, l, g, &ob);
				}
		if (rt_run_advance(&run, &kv, c, &err) < 0) {
			/* the one legitimate failure: random sizes the budget check refuses
			 * (runtime/policy/rt_budget.h) */
			ck_assert_msg(strstr(err.msg, ": the guards (") || strstr(err.msg, ": the budget comes to") ||
			              strstr(err.msg, ": the target of compress comes to") ||
			              strstr(err.msg, ": the sinks ("), "%s", err.msg);
			break;
		}
		for (int l = 0; l < L; l++)
			for (int g = 0; g < G; g++) {
				rt_kv_head *h = rt_kv_head_at(&kv, l, g);
				ck_assert_int_le(h->n, CAP);
				for (int32_t i = 0; i < h->n; i++) {
					ck_assert(h->count[i] >= 1.0f);
					ck_assert(i == 0 || h->pos[i] > h->pos[i - 1]);
					ck_assert_int_lt(h->pos[i], run.ctx.seen);
				}
			}
	}
	int64_t nc = run.compressions;
	rt_run_free(&run);
	rt_kv_free(&kv);
	return nc;
}

START_TEST(random_ir_compiles)
{
	/* KVPC_RANDOM_IR=N runs N policies instead of 12 (a longer local search) */
	int want = getenv("KVPC_RANDOM_IR") ? atoi(getenv("KVPC_RANDOM_IR")) : 12;
	int emitted = 0, compressed = 0;
	for (int seed = 0; seed < 4 * want && emitted < want; seed++) {
		struct kvp_ir *ir = ir_random(seed);
		/* random reduce NONE with a per-query-head score is the one invalid draw */
		if (ir->score.expr >= 0 && kvp_ir_expr_per_qhead(ir, ir->score.expr) &&
		    ir->score.reduce == K_REDUCE_NONE)
			ir->score.reduce = K_REDUCE_MEAN;
		int nd = 0;
		ck_assert_msg(kvp_ir_check(ir, diag_print, &nd) == 0, "random IR %d rejected", seed);
		char *src = emit_str(ir, seed % 2, "random.c");
		char tag[32];
		snprintf(tag, sizeof tag, "random_%d", seed);
		ck_assert_msg(compile_c(src, tag) == 0, "random IR %d: emitted C does not compile", seed);
		/* and its hooks run on a synthetic store without breaking it */
		void *handle = NULL;
		const struct kvp_policy *p = load_policy(src, ir->name, &handle);
		ck_assert_msg(p != NULL, "random IR %d: cannot load (%s)", seed, handle ? "symbol" : dlerror());
		compressed += drive_policy(p, seed % 3 == 0 ? -1 : 30) > 0;
		dlclose(handle);
		free(src);
		ir_delete(ir);
		emitted++;
	}
	ck_assert_int_eq(emitted, want);
	ck_assert_int_ge(compressed, want / 4); /* the drives really exercised compress */
	if (getenv("KVPC_RANDOM_IR"))
		fprintf(stderr, "random IR: %d policies, %d compressed\n", emitted, compressed);
}
END_TEST

/* A policy compiled from the .kvp text (file names it in diagnostics), emitted as C (no
 * #line), built and loaded (load_policy, symbol of policy name); src_policy_free frees
 * the source, the IR, the C and the library. */
typedef struct src_policy {
	kvp_src *src;
	struct kvp_ir ir;
	char *c;
	void *handle;
	const struct kvp_policy *p;
} src_policy;

static void src_policy_open(src_policy *sp, const char *file, const char *text, const char *name)
{
	sp->src = kvp_src_from_mem(file, text, strlen(text));
	ck_assert_msg(kvp_compile(sp->src, &sp->ir) == 0, "%s", kvp_src_diags(sp->src));
	sp->c = emit_str(&sp->ir, 0, "policy.c");
	sp->handle = NULL;
	sp->p = load_policy(sp->c, name, &sp->handle);
	ck_assert_ptr_nonnull(sp->p);
}

static void src_policy_free(src_policy *sp)
{
	dlclose(sp->handle);
	free(sp->c);
	kvp_ir_free(&sp->ir);
	kvp_src_free(sp->src);
}

/* The positions a policy compiled from source keeps of five prompt tokens: text (one
 * policy named name, whose needs must include need) compiled, emitted as C, built and
 * loaded, then run over one layer of one KV head with group query heads, head_dim 4, the
 * entries (k[t], v[t]) appended at positions t = 0..4, one token a step. pos receives the
 * kept positions in list order; returns their number. Everything it made is freed. */
static int kept_of_five(const char *name, const char *text, unsigned need, int group,
                        const float k[5][4], const float v[5][4], int32_t pos[5])
{
	src_policy sp;
	src_policy_open(&sp, "five.kvp", text, name);
	ck_assert(sp.ir.needs & need);
	rt_kv kv;
	struct rt_run run;
	rt_err err = { "" };
	ck_assert_int_eq(rt_run_init(&run, &kv, sp.p, 1, 1, group, 4, 8, 5, &err), 0);
	for (int32_t t = 0; t < 5; t++) {
		ck_assert_int_ge(rt_run_chunk(&run, &kv, 1), 1);
		rt_kv_append(&kv, rt_kv_head_at(&kv, 0, 0), k[t], v[t], t);
		ck_assert_msg(rt_run_advance(&run, &kv, 1, &err) >= 0, "%s", err.msg);
	}
	const rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	const int n = h->n;
	memcpy(pos, h->pos, (size_t)n * sizeof *pos);
	rt_run_free(&run);
	rt_kv_free(&kv);
	src_policy_free(&sp);
	return n;
}

/* VATP's value norm (arXiv 2406.12335): `score = value_l1` compiled from source keeps
 * the entries of largest ||v||_1. Five entries (head_dim 4) whose l1 and l2 rankings
 * differ, by hand:
 *   v0 = ( 3, 0, 0, 0)    l1 3    l2 3
 *   v1 = ( 1, 1, 1, 1)    l1 4    l2 2
 *   v2 = ( 0, 0, 0, .5)   l1 .5   l2 .5
 *   v3 = (-2.2, 0, 0, 0)  l1 2.2  l2 2.2
 *   v4 = ( 1, -1, 1, -1.5) l1 4.5 l2 sqrt(5.25) = 2.29
 * A budget of 3 at prompt end keeps positions 0, 1, 4 by l1 (4.5, 4, 3) and 0, 3, 4 by
 * l2 (3, 2.29, 2.2): the second run, with value_norm, shows the test tells them apart. */
static const char l1_src[] =
	"policy %s {\n"
	"    budget = 3 entries\n"
	"    score = %s\n"
	"    compress at prompt end\n"
	"}\n";

static void kept_by(const char *name, const char *score, const int32_t want[3])
{
	static const float K[5][4] = { { 1, 0, 0, 0 }, { 1, 0, 0, 0 }, { 1, 0, 0, 0 },
	                               { 1, 0, 0, 0 }, { 1, 0, 0, 0 } };
	static const float V[5][4] = { { 3, 0, 0, 0 }, { 1, 1, 1, 1 }, { 0, 0, 0, 0.5f },
	                               { -2.2f, 0, 0, 0 }, { 1, -1, 1, -1.5f } };
	char text[256];
	snprintf(text, sizeof text, l1_src, name, score);
	int32_t pos[5];
	ck_assert_int_eq(kept_of_five(name, text, KVP_NEED_VALUES, 1, K, V, pos), 3);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(pos[i], want[i]);
}

START_TEST(value_l1_vatp)
{
	static const float v4[4] = { 1, -1, 1, -1.5f };
	ck_assert(k_norm_l1(v4, 4) == 4.5);
	kept_by("vatp_l1", "value_l1", (const int32_t[3]){ 0, 1, 4 });
	kept_by("vatp_l2", "value_norm", (const int32_t[3]){ 0, 3, 4 });
}
END_TEST

/* DuoAttention's head classes (arXiv 2410.10819, docs/language.md 7.12): a policy compiled
 * from source with `head_score("duo.heads")` over one global pool, on 2 layers x 3 KV heads
 * (group 3, GQA 9/3), a prompt of 20 tokens, sinks 2 and recent 3 (guards g = 5), keeps
 * what the rule says, computed here on its own: every head keeps its guards; the heads in
 * decreasing weight take their n - g = 15 other entries whole while the pool
 * H * (B - g) lasts; the head at the boundary keeps its oldest candidates. The weights
 * 0.5 3 0.1 / 2 0.2 1 rank (0,1) > (1,0) > (1,2) > (0,0) > (1,1) > (0,2); a budget of
 * B = 12 gives a pool of 6 * 7 = 42 = 15 + 15 + 12, so (0,1) and (1,0) are retrieval heads,
 * (1,2) keeps positions 2..13 besides its guards, and the other three stream (0, 1, 17, 18,
 * 19). B = 10 (pool 30) streams (1,2) too. */
static const char duo_src[] =
	"policy %s {\n"
	"    budget = %d entries\n"
	"    score = head_score(\"duo.heads\")\n"
	"    allocate = global(floor = 0)\n"
	"    keep sinks 2\n"
	"    keep recent 3\n"
	"    compress at prompt end\n"
	"}\n";

/* The kept positions of head hd by the rule above, independent of the kernels: kept[p]. */
static void duo_rule(const double *w, int H, int n, int B, int sinks, int recent, int hd,
                     int *kept)
{
	int order[16];
	for (int j = 0; j < H; j++)
		order[j] = j;
	for (int a = 0; a < H; a++) /* selection sort by weight, descending */
		for (int b = a + 1; b < H; b++)
			if (w[order[b]] > w[order[a]]) {
				int t = order[a];
				order[a] = order[b];
				order[b] = t;
			}
	const int g = sinks + recent;
	int pool = H * (B - g), take = 0;
	for (int r = 0; r < H; r++) {
		int got = pool < n - g ? pool : n - g;
		pool -= got;
		if (order[r] == hd)
			take = got;
	}
	for (int p = 0; p < n; p++)
		kept[p] = p < sinks || p >= n - recent || (p - sinks) < take;
}

static void duo_case(const char *dir, int B)
{
	static const double W[6] = { 0.5, 3, 0.1, 2, 0.2, 1 };
	char text[512], path[256], name[32];
	snprintf(name, sizeof name, "duo_b%d", B);
	snprintf(text, sizeof text, duo_src, name, B);
	snprintf(path, sizeof path, "%s/duo.kvp", dir);
	src_policy sp;
	src_policy_open(&sp, path, text, name);
	ck_assert_int_eq(sp.ir.head_layers, 2);
	ck_assert_int_eq(sp.ir.head_kv, 3);
	ck_assert(!kvp_ir_expr_per_qhead(&sp.ir, sp.ir.score.expr));
	enum { L = 2, G = 3, R = 3, D = 4, N = 20 };
	rt_kv kv;
	struct rt_run run;
	rt_err err = { "" };
	ck_assert_int_eq(rt_run_init(&run, &kv, sp.p, L, G, R, D, 24, N, &err), 0);
	const float k[D] = { 1, 0, 0, 0 }, v[D] = { 0, 1, 0, 0 };
	for (int32_t t = 0; t < N; t++) {
		ck_assert_int_ge(rt_run_chunk(&run, &kv, 1), 1);
		for (int l = 0; l < L; l++)
			for (int g = 0; g < G; g++)
				rt_kv_append(&kv, rt_kv_head_at(&kv, l, g), k, v, t);
		ck_assert_msg(rt_run_advance(&run, &kv, 1, &err) >= 0, "%s", err.msg);
	}
	ck_assert_int_eq(run.compressions, 1);
	for (int hd = 0; hd < L * G; hd++) {
		int want[N], got[N] = { 0 };
		duo_rule(W, L * G, N, B, 2, 3, hd, want);
		const rt_kv_head *h = rt_kv_head_at(&kv, hd / G, hd % G);
		for (int32_t i = 0; i < h->n; i++)
			got[h->pos[i]] = 1;
		for (int pp = 0; pp < N; pp++)
			ck_assert_msg(got[pp] == want[pp], "B %d head (%d,%d) position %d: kept %d, rule %d",
			              B, hd / G, hd % G, pp, got[pp], want[pp]);
	}
	rt_run_free(&run);
	rt_kv_free(&kv);
	src_policy_free(&sp);
}

START_TEST(duo_head_classes)
{
	char dir[] = "/tmp/kvpc_duo_XXXXXX", hp[64];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(hp, sizeof hp, "%s/duo.heads", dir);
	write_all(hp, "# hand-written classes: 2 layers of 3 KV heads\nheads 2 3\n0.5 3 0.1\n2 0.2 1\n");
	/* the rule itself, by hand: B = 12 keeps (1,2)'s positions 0..13 and 17..19 */
	static const double W[6] = { 0.5, 3, 0.1, 2, 0.2, 1 };
	int kept[20];
	duo_rule(W, 6, 20, 12, 2, 3, 5, kept);
	for (int pp = 0; pp < 20; pp++)
		ck_assert_int_eq(kept[pp], pp <= 13 || pp >= 17);
	duo_rule(W, 6, 20, 12, 2, 3, 4, kept);
	for (int pp = 0; pp < 20; pp++)
		ck_assert_int_eq(kept[pp], pp <= 1 || pp >= 17);
	duo_case(dir, 12);
	duo_case(dir, 10);
	unlink(hp);
	rmdir(dir);
}
END_TEST

/* ---- KVzap's linear_score() (docs/language.md 7.14) ----------------------------------- */

enum { LIN_P = 48 };

/* The tiny GQA model si (0: 9 query / 3 KV heads, n_embd 288; 1: 4 / 1, n_embd 128; 2
 * layers, f32 weights) on the exact path with an f32 store. */
static rt_model *lin_model(int si)
{
	rt_model_opts o = { .exact = 1, .threads = 1, .kv_type = RT_KV_F32 };
	rt_err err = { "" };
	rt_model *m = tiny_model_open_gqa(si, 55u + (uint32_t)si, &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	return m;
}

/* The value dimension layer l >= 1's KV head g scores by (its row of W_v is the weights). */
static int lin_vdim(int l, int g, int hd)
{
	return (5 * g + 3 * l) % hd;
}

/* Weights [L × G × (E + 1)]: layer 0 pseudo-random in [-0.5, 0.5), layer l >= 1 the row of
 * W_v that projects KV head g's value dimension lin_vdim; bias 0.25 (l + 1) - 0.1 g. */
static float *lin_weights(const rt_model *m)
{
	const rt_model_hparams *hp = &m->hp;
	const int L = hp->n_layer, G = hp->n_head_kv, E = hp->n_embd, hd = hp->head_dim;
	float *w = malloc((size_t)L * G * (E + 1) * sizeof *w);
	uint32_t x = 12345u;
	for (int l = 0; l < L; l++)
		for (int g = 0; g < G; g++) {
			float *row = w + ((size_t)l * G + g) * (E + 1);
			for (int c = 0; c < E; c++) {
				x = x * 1664525u + 1013904223u;
				row[c] = l == 0 ? (float)(x >> 8) / 16777216.0f - 0.5f
				                : m->layers[l].wv[(size_t)(g * hd + lin_vdim(l, g, hd)) * E + c];
			}
			row[E] = 0.25f * (float)(l + 1) - 0.1f * (float)g;
		}
	return w;
}

static void lin_write(const char *path, const float *w, int L, int G, int E)
{
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "# test scorer\nlinear %d %d %d\n", L, G, E);
	for (int r = 0; r < L * G; r++)
		for (int c = 0; c <= E; c++)
			fprintf(f, "%.9g%s", (double)w[(size_t)r * (E + 1) + c], c == E ? "\n" : " ");
	fclose(f);
}

/* Compile `score = linear_score("PATH")` under budget = threshold(level) at the prompt end
 * and load it (NULL with the diagnostics in diag when it does not compile). */
static const struct kvp_policy *lin_policy(const char *path, struct kvp_ir *ir, void **handle,
                                           char *diag, size_t nd)
{
	char text[512];
	snprintf(text, sizeof text, "policy lin {\n    param level = 0\n    budget = threshold(level)\n"
	         "    score = linear_score(\"%s\")\n    compress at prompt end\n}\n", path);
	kvp_src *src = kvp_src_from_mem("lin.kvp", text, strlen(text));
	int rc = kvp_compile(src, ir);
	snprintf(diag, nd, "%s", kvp_src_diags(src));
	kvp_src_free(src);
	if (rc != 0)
		return NULL;
	char *c = emit_str(ir, 0, "lin.c");
	const struct kvp_policy *p = load_policy(c, "lin", handle);
	free(c);
	return p;
}

static void lin_feed(rt_model *m, const struct kvp_policy *p, const char *set, rt_seq *s)
{
	rt_err err = { "" };
	ck_assert_msg(rt_seq_init(s, m, p, LIN_P, 16, LIN_P, &err) == 0 && rt_seq_set(s, set, &err) == 0,
	              "%s", err.msg);
	int32_t tok[LIN_P];
	for (int i = 0; i < LIN_P; i++)
		tok[i] = (int32_t)((i * 37 + 11) % 290);
	ck_assert_msg(rt_seq_feed(s, tok, LIN_P, NULL, RT_LOGITS_NONE, &err) == 0, "%s", err.msg);
}

/* The score by hand, in double: layer 0's input is the token's embedding row, RMS-normalised
 * and scaled by attn_norm (the post-norm hidden state KVzap reads); a later layer's score
 * is its value component lin_vdim plus the bias, since v = W_v h of the same input. */
static double lin_want(const rt_model *m, const float *w, rt_seq *s, int l, int g, int32_t i)
{
	const rt_model_hparams *hp = &m->hp;
	const int G = hp->n_head_kv, E = hp->n_embd;
	const float *row = w + ((size_t)l * G + g) * (E + 1);
	const rt_kv_head *h = rt_kv_head_at(&s->kv, l, g);
	if (l > 0) {
		float buf[256];
		return rt_kv_value(&s->kv, h, i, buf)[lin_vdim(l, g, hp->head_dim)] + (double)row[E];
	}
	const float *e = m->tok_embd + (size_t)((h->pos[i] * 37 + 11) % 290) * E;
	double ss = 0, dot = 0;
	for (int c = 0; c < E; c++)
		ss += (double)e[c] * e[c];
	const double inv = 1.0 / sqrt(ss / E + hp->norm_eps);
	for (int c = 0; c < E; c++)
		dot += (double)row[c] * e[c] * inv * m->layers[0].attn_norm[c];
	return dot + row[E];
}

static void kvzap_case(int si)
{
	rt_model *m = lin_model(si);
	const rt_model_hparams *hp = &m->hp;
	const int L = hp->n_layer, G = hp->n_head_kv, E = hp->n_embd;
	char dir[] = "/tmp/kvpc_lin_XXXXXX", path[64], diag[2048];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/t.kvzap", dir);
	float *w = lin_weights(m);
	lin_write(path, w, L, G, E);
	struct kvp_ir ir;
	void *handle = NULL;
	const struct kvp_policy *p = lin_policy(path, &ir, &handle, diag, sizeof diag);
	ck_assert_msg(p != NULL, "%s", diag);
	ck_assert(p->needs & KVP_NEED_HIDDEN);
	/* every entry passes a level of -1e30: the stored scores against the hand values */
	rt_seq s;
	lin_feed(m, p, "level=-1e30", &s);
	double *want = malloc((size_t)L * G * LIN_P * sizeof *want);
	for (int l = 0; l < L; l++)
		for (int g = 0; g < G; g++) {
			rt_kv_head *h = rt_kv_head_at(&s.kv, l, g);
			ck_assert_int_eq(h->n, LIN_P);
			for (int32_t i = 0; i < h->n; i++) {
				const uint32_t *b = (const uint32_t *)(const void *)(h->stats + (size_t)i * s.kv.stat_bytes);
				float got;
				memcpy(&got, b + ir.lin_word, sizeof got);
				const double x = lin_want(m, w, &s, l, g, i);
				want[((size_t)l * G + g) * LIN_P + h->pos[i]] = x;
				ck_assert_msg(fabs(got - x) <= 1e-4 * (1 + fabs(x)),
				              "layer %d head %d pos %d: linear_score %.9g, by hand %.9g", l, g,
				              h->pos[i], (double)got, x);
			}
		}
	rt_seq_free(&s);
	/* level 0.3: every head keeps exactly the positions whose hand score reaches it */
	lin_feed(m, p, "level=0.3", &s);
	int kept_any = 0, dropped_any = 0;
	for (int l = 0; l < L; l++)
		for (int g = 0; g < G; g++) {
			rt_kv_head *h = rt_kv_head_at(&s.kv, l, g);
			int kept[LIN_P] = { 0 };
			for (int32_t i = 0; i < h->n; i++)
				kept[h->pos[i]] = 1;
			for (int q = 0; q < LIN_P; q++) {
				const double x = want[((size_t)l * G + g) * LIN_P + q];
				if (fabs(x - 0.3) < 1e-5)
					continue; /* within rounding of the level */
				ck_assert_msg(kept[q] == (x >= 0.3), "layer %d head %d pos %d: score %.9g, kept %d",
				              l, g, q, x, kept[q]);
				kept_any |= kept[q], dropped_any |= !kept[q];
			}
		}
	ck_assert(kept_any && dropped_any);
	rt_seq_free(&s);
	/* the other test shape is refused with the file and both shapes named */
	rt_model *m2 = lin_model(1 - si);
	rt_err err = { "" };
	ck_assert_int_ne(rt_seq_init(&s, m2, p, LIN_P, 16, LIN_P, &err), 0);
	ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "linear scorer for 2 layers") &&
	              strstr(err.msg, "but the model"), "%s", err.msg);
	rt_model_free(m2);
	free(want);
	free(w);
	dlclose(handle);
	kvp_ir_free(&ir);
	unlink(path);
	rmdir(dir);
	rt_model_free(m);
}

START_TEST(linear_score_kvzap_9_3)
{
	kvzap_case(0);
}
END_TEST

START_TEST(linear_score_kvzap_4_1)
{
	kvzap_case(1);
}
END_TEST

/* A bad weight file is refused at compile time, at the file's line with the reason. */
START_TEST(linear_score_bad_files)
{
	static const struct {
		const char *text, *why;
	} bad[] = {
		{ "linear 2 3\n", ":1: expected `linear LAYERS KV_HEADS HIDDEN`" },
		{ "# two rows of three missing\nlinear 1 2 2\n1 2 3\n",
		  ": truncated: 2 rows of 3 numbers expected (1 layers x 2 KV heads), the file ends after 1" },
		{ "linear 1 1 2\n1 nan 3\n", ":2: weight 2 is not a finite number" },
		{ "linear 1 1 2\n1 2\n", ":2: expected 3 weights on this line, found 2" },
		{ "linear 1 1 2\n1 2 3\n4 5 6\n", ":3: more than the 1 rows the header declares" },
		{ "", ": empty; expected a first line `linear LAYERS KV_HEADS HIDDEN`" },
	};
	char dir[] = "/tmp/kvpc_linbad_XXXXXX", path[64], diag[2048], want[256];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/bad.kvzap", dir);
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		write_all(path, bad[k].text);
		struct kvp_ir ir;
		void *handle = NULL;
		ck_assert_ptr_null(lin_policy(path, &ir, &handle, diag, sizeof diag));
		snprintf(want, sizeof want, "linear_score(): %s%s", path, bad[k].why);
		ck_assert_msg(strstr(diag, want), "case %zu: got %s, want %s", k, diag, want);
	}
	unlink(path);
	struct kvp_ir ir;
	void *handle = NULL;
	ck_assert_ptr_null(lin_policy(path, &ir, &handle, diag, sizeof diag));
	ck_assert_msg(strstr(diag, "cannot open"), "%s", diag);
	rmdir(dir);
}
END_TEST

/* R-KV's redundancy (arXiv 2505.24133; kvpress rkv_press.py, threshold 0.5, "last"), by
 * hand for five keys (head_dim 4): k0 = k1 = k2 = e1, k3 = e2, k4 = e1 + e2. Cosines: 1
 * among k0..k2, 0 between them and k3, 1/sqrt(2) between k4 and every other. Row 0: the
 * similar keys are 1, 2, 4, the newest (4) is left out: r0 = (1 + 1) / 5 = 0.4, and so
 * r1 = r2 = 0.4; row 3: only k4 is similar and left out: r3 = 0; row 4: all four are
 * similar, k3 (the newest) left out: r4 = 3 / sqrt(2) / 5 = 0.424264. Softmax: e^0.4 =
 * 1.4918247, e^0.424264 = 1.5284652, sum 3 * 1.4918247 + 1 + 1.5284652 = 7.0039393, so
 * R = 0.2129979 (x3), 0.1427768, 0.2182294. A budget of 3 at prompt end with
 * score = obs - key_redundancy (obs never observed: 0; per query head of a group of 3, so
 * query heads 1 and 2 reuse query head 0's vector) keeps the least redundant, 3 then the
 * tie 0, 1 (lower positions); score = key_redundancy + 0 * obs keeps 4, 0, 1. */
static const float rkv_k[5][4] = { { 1, 0, 0, 0 }, { 1, 0, 0, 0 }, { 1, 0, 0, 0 },
                                   { 0, 1, 0, 0 }, { 1, 1, 0, 0 } };

static void rkv_kept(const char *name, const char *score, const int32_t want[3])
{
	static const char src_fmt[] = "policy %s {\n    budget = 3 entries\n"
	                              "    stat obs = sum(attn)\n    score = %s\n    group = mean\n"
	                              "    compress at prompt end\n}\n";
	static const float V[5][4] = { { 0, 0, 1, 0 }, { 0, 0, 1, 0 }, { 0, 0, 1, 0 },
	                               { 0, 0, 1, 0 }, { 0, 0, 1, 0 } };
	char text[256];
	snprintf(text, sizeof text, src_fmt, name, score);
	int32_t pos[5];
	ck_assert_int_eq(kept_of_five(name, text, KVP_NEED_KEYS, 3, rkv_k, V, pos), 3);
	int got[5] = { 0 };
	for (int i = 0; i < 3; i++)
		got[pos[i]] = 1;
	for (int i = 0; i < 3; i++)
		ck_assert_msg(got[want[i]], "%s: position %d not kept", name, want[i]);
}

START_TEST(rkv_redundancy)
{
	static const int32_t pos[5] = { 0, 1, 2, 3, 4 }, rev[5] = { 4, 3, 2, 1, 0 };
	static const double want[5] = { 0.2129979, 0.2129979, 0.2129979, 0.1427768, 0.2182294 };
	float out[5], nrm[5];
	k_key_redundancy(&rkv_k[0][0], pos, 5, 4, out, nrm);
	for (int i = 0; i < 5; i++)
		ck_assert_msg(fabs(out[i] - want[i]) < 1e-6, "R%d = %.7f, by hand %.7f", i, out[i], want[i]);
	/* the same keys listed newest first (a list out of position order after an eviction):
	 * "newest" follows the positions, not the list order */
	float rk[5][4], out2[5];
	for (int i = 0; i < 5; i++)
		memcpy(rk[i], rkv_k[4 - i], sizeof rk[i]);
	k_key_redundancy(&rk[0][0], rev, 5, 4, out2, nrm);
	for (int i = 0; i < 5; i++)
		ck_assert(fabs(out2[i] - want[4 - i]) < 1e-6);
	rkv_kept("rkv_least", "obs - key_redundancy", (const int32_t[3]){ 0, 1, 3 });
	rkv_kept("rkv_most", "key_redundancy + 0 * obs", (const int32_t[3]){ 0, 1, 4 });
}
END_TEST

/* Every signal of the language (the kvp_builtin.def rows with lang 1) has its row in the
 * table of docs/language.md section 7.1 ("| `name` |"): a signal added without its
 * documentation fails here. */
START_TEST(signals_documented)
{
	static const struct {
		const char *name;
		int lang;
	} sig[] = {
#define KVP_SIGNAL(ID, name, unit, where, per_qhead, needs, lang) { name, lang },
#include "kvp_builtin.def"
	};
	char *doc = read_all("docs/language.md");
	ck_assert_ptr_nonnull(doc);
	for (size_t i = 0; i < sizeof sig / sizeof sig[0]; i++) {
		char row[64];
		snprintf(row, sizeof row, "| `%s` |", sig[i].name);
		ck_assert_msg(!sig[i].lang || strstr(doc, row), "docs/language.md has no row %s", row);
	}
	free(doc);
}
END_TEST

/* One validation, one message: guards above the budget found by kvpc check (recent at
 * 62 tokens by default) and by the runtime before a run (default 8, then --set r=62)
 * read the same after their place ("FILE:LINE:COL: error: " / "policy NAME: "). */
static const char same_src[] =
	"policy same {\n"
	"    param r = %d tokens\n"
	"    budget = 64 entries\n"
	"    stat acc = sum(attn) over all\n"
	"    score = acc\n"
	"    keep sinks 4\n"
	"    keep recent r\n"
	"    compress every step\n"
	"}\n";

START_TEST(same_message_compile_and_run)
{
	char text[512];
	snprintf(text, sizeof text, same_src, 62);
	kvp_src *bad = kvp_src_from_mem("same.kvp", text, strlen(text));
	struct kvp_ir ir;
	ck_assert_int_ne(kvp_compile(bad, &ir), 0);
	const char *d = strstr(kvp_src_diags(bad), "error: ");
	ck_assert_ptr_nonnull(d);
	char compile_msg[512];
	snprintf(compile_msg, sizeof compile_msg, "%.*s", (int)strcspn(d + 7, "\n"), d + 7);
	kvp_src_free(bad);
	ck_assert_str_eq(compile_msg, "the guards (sinks 4 + recent 62 = 66 tokens) exceed the budget "
	                 "(64 entries per KV head); guards count inside the budget: lower them or "
	                 "raise the budget");

	snprintf(text, sizeof text, same_src, 8);
	src_policy ok;
	src_policy_open(&ok, "same.kvp", text, "same");
	rt_kv kv;
	struct rt_run run;
	rt_err err = { "" };
	ck_assert_int_eq(rt_run_init(&run, &kv, ok.p, 2, 1, 4, 4, 128, 100, &err), 0);
	ck_assert_msg(rt_policy_check(&run, &kv, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(rt_run_set(&run, "r=62", &err), 0);
	ck_assert_int_eq(rt_policy_check(&run, &kv, &err), -1);
	ck_assert_str_eq(err.msg + strlen("policy same: "), compile_msg);
	rt_run_free(&run);
	rt_kv_free(&kv);
	src_policy_free(&ok);
}
END_TEST

/* The value rules a run's parameter values obey are the compiler's: for each value of a
 * parameter that an ema rate (an expression of it), a trigger period and an observation
 * window read, the policy compiled with that value as its default is accepted exactly when
 * the policy compiled with the valid default accepts it by --set (rt_pick_vals, the rule of
 * --set and kv.set), and a refusal names the setting, the value and the source line, as
 * the compiler does. A --set of an ema rate of 5 used to run, with degenerate scores. */
static const char rules_src[] =
	"policy rules {\n"
	"    param half = %s\n"
	"    param period = %s steps\n"
	"    param win = %s tokens\n"
	"    stat e = ema(attn, half * 2)\n"
	"    stat w = sum(attn) over prompt tail win\n"
	"    score = e + w\n"
	"    budget = 64 entries\n"
	"    keep sinks 4\n"
	"    compress every period\n"
	"}\n";

START_TEST(value_rules_compile_and_run)
{
	char text[768];
	snprintf(text, sizeof text, rules_src, "0.25", "8", "16");
	src_policy ok;
	src_policy_open(&ok, "rules.kvp", text, "rules");
	ck_assert_ptr_nonnull(ok.p->check_params);
	static const struct {
		const char *half, *period, *win, *what;
	} cases[] = {
		{ "0.5", "8", "16", NULL }, { "0.05", "1", "1", NULL },
		{ "0", "8", "16", "the ema rate alpha must be in (0, 1]; got 0" },
		{ "0.6", "8", "16", "the ema rate alpha must be in (0, 1]; got 1.2" },
		{ "-1", "8", "16", "the ema rate alpha must be in (0, 1]; got -2" },
		{ "0.25", "0", "16", "the period must be a whole number >= 1" },
		{ "0.25", "8", "0", "an observation window must be a whole number of tokens >= 1" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		snprintf(text, sizeof text, rules_src, cases[i].half, cases[i].period, cases[i].win);
		kvp_src *src = kvp_src_from_mem("rules.kvp", text, strlen(text));
		struct kvp_ir ir;
		const int compiles = kvp_compile(src, &ir) == 0;
		if (compiles)
			kvp_ir_free(&ir);
		else
			ck_assert_msg(cases[i].what && strstr(kvp_src_diags(src), cases[i].what), "%zu: %s",
			              i, kvp_src_diags(src));
		kvp_src_free(src);
		ck_assert_int_eq(compiles, cases[i].what == NULL);
		char s0[64], s1[64], s2[64];
		snprintf(s0, sizeof s0, "half=%s", cases[i].half);
		snprintf(s1, sizeof s1, "period=%s", cases[i].period);
		snprintf(s2, sizeof s2, "win=%s", cases[i].win);
		const char *sets[] = { s0, s1, s2 };
		double vals[3];
		rt_err err = { "" };
		const int runs = rt_pick_vals(ok.p, sets, 3, vals, &err) == 0;
		ck_assert_msg(runs == compiles, "%zu: compiles %d, --set %d (%s)", i, compiles, runs,
		              err.msg);
		if (!runs) { /* the compiler's words, with the value and the line */
			const char *want = strstr(cases[i].what, "ema") ? cases[i].what :
			                   strstr(cases[i].what, "period") ? "the trigger period must be a whole number >= 1; got 0" :
			                   "an observation window must be a whole number >= 1; got 0";
			ck_assert_msg(strncmp(err.msg, "policy rules: ", 14) == 0 && strstr(err.msg, want) &&
			              strstr(err.msg, "(rules.kvp line "), "%zu: %s", i, err.msg);
		}
	}
	src_policy_free(&ok);
	/* a policy whose settings read no parameter has none to check */
	static const char fixed[] = "policy fixed {\n    budget = 64 entries\n    stat acc = sum(attn) over all\n"
	                            "    score = acc\n    keep sinks 4\n    compress every step\n}\n";
	src_policy c;
	src_policy_open(&c, "fixed.kvp", fixed, "fixed");
	ck_assert_ptr_null(c.p->check_params);
	src_policy_free(&c);
}
END_TEST

/* A byte budget's share that reads a parameter obeys the compiler's rule at run time too:
 * a share above 100% of an f16 full cache (or 0) is refused by kvpc as a default and by
 * --set as a value (it ran, keeping every entry, when only the literal was checked). */
START_TEST(byte_share_rule_compile_and_run)
{
	static const char src_fmt[] = "policy share {\n    param share = %s\n"
	                              "    budget = bytes(share)\n    score = pos\n"
	                              "    compress every step\n}\n";
	char text[256];
	snprintf(text, sizeof text, src_fmt, "12.5%");
	src_policy ok;
	src_policy_open(&ok, "share.kvp", text, "share");
	static const struct {
		const char *v;
		int good;
	} cases[] = { { "12.5%", 1 }, { "100%", 1 }, { "1%", 1 }, { "150%", 0 }, { "0%", 0 } };
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		snprintf(text, sizeof text, src_fmt, cases[i].v);
		kvp_src *src = kvp_src_from_mem("share.kvp", text, strlen(text));
		struct kvp_ir ir;
		const int compiles = kvp_compile(src, &ir) == 0;
		if (compiles)
			kvp_ir_free(&ir);
		kvp_src_free(src);
		ck_assert_msg(compiles == cases[i].good, "%s: compiles %d", cases[i].v, compiles);
		char set[64];
		snprintf(set, sizeof set, "share=%s", cases[i].v);
		const char *sets[] = { set };
		double vals[1];
		rt_err err = { "" };
		const int runs = rt_pick_vals(ok.p, sets, 1, vals, &err) == 0;
		ck_assert_msg(runs == cases[i].good, "%s: --set %d (%s)", cases[i].v, runs, err.msg);
		if (!runs)
			ck_assert_msg(strstr(err.msg, "the byte budget (a share of an f16 full cache's bytes) "
			                     "must be above 0% and at most 100%; got ") &&
			              strstr(err.msg, cases[i].v) && strstr(err.msg, "(share.kvp line 3)"),
			              "%s", err.msg);
	}
	src_policy_free(&ok);
}
END_TEST

static Suite *emit_suite(void)
{
	Suite *s = suite_create("kvpc_emit");
	TCase *tc = tcase_create("emit");
	tcase_set_timeout(tc, 1200);
	tcase_add_test(tc, golden_h2o);
	tcase_add_test(tc, byte_share_rule_compile_and_run);
	tcase_add_test(tc, duo_head_classes);
	tcase_add_test(tc, rkv_redundancy);
	tcase_add_test(tc, linear_score_kvzap_9_3);
	tcase_add_test(tc, linear_score_kvzap_4_1);
	tcase_add_test(tc, linear_score_bad_files);
	tcase_add_test(tc, golden_snapkv);
	tcase_add_test(tc, golden_scissorhands);
	tcase_add_test(tc, golden_caote_exact);
	tcase_add_test(tc, same_message_compile_and_run);
	tcase_add_test(tc, value_rules_compile_and_run);
	tcase_add_test(tc, value_l1_vatp);
	tcase_add_test(tc, signals_documented);
	tcase_add_test(tc, compiles_all_paths);
	tcase_add_test(tc, line_directives_switch);
	tcase_add_test(tc, banner_and_determinism);
	tcase_add_test(tc, no_injection);
	tcase_add_test(tc, budget_copies_follow_override);
	tcase_add_test(tc, symbols);
	tcase_add_test(tc, registry);
	tcase_add_test(tc, checker_rejects);
	tcase_add_test(tc, layout_words);
	tcase_add_test(tc, library_policies);
	tcase_add_test(tc, random_ir_compiles);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int nf = check_run(emit_suite());
	return nf == 0 ? 0 : 1;
}
