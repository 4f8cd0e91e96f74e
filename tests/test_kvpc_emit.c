/*
 * test_kvpc_emit: the C back end (compiler/kvp_emit_c.c) and the IR checker
 * (compiler/kvp_ir.c), independent of the front end: policies are built as IR directly
 * here. Checks: golden generated C for three policies (tests/golden/emit/NAME.c.golden,
 * byte-identical, and a second emission identical to the first); every emitted unit
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvp_emit_c.h"
#include "kvp_ir.h"

/* ---- IR-built policies (mirror the policies/ files; locations are plausible lines) ------ */

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
	struct kvp_ir *ir = ir_new("h2o", "policies/h2o.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 64, KVP_UNIT_ENTRIES, "entries per KV head");
	int recent = kvp_ir_add_param(ir, L(4), "recent", 8, KVP_UNIT_TOKENS, "recent window");
	int acc = kvp_ir_add_stat(ir, L(5), "acc", KVP_STAT_SUM, S(ir, KVP_SIG_ATTN), -1,
	                          KVP_HIST_WHOLE, -1);
	ir->score.expr = kvp_ir_stat_ref(ir, L(6), acc);
	ir->score.loc = L(6);
	ir->score.reduce = KVP_REDUCE_SUM;
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
	struct kvp_ir *ir = ir_new("snapkv", "policies/snapkv.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 1024, KVP_UNIT_ENTRIES, "");
	int window = kvp_ir_add_param(ir, L(4), "window", 32, KVP_UNIT_TOKENS, "observation window");
	int obs = kvp_ir_add_stat(ir, L(5), "obs", KVP_STAT_SUM, S(ir, KVP_SIG_ATTN), -1,
	                          KVP_HIST_PROMPT_TAIL, P(ir, window));
	ir->score.expr = kvp_ir_stat_ref(ir, L(6), obs);
	ir->score.loc = L(6);
	ir->score.reduce = KVP_REDUCE_MEAN;
	ir->score.pool = KVP_POOL_MAX;
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
	struct kvp_ir *ir = ir_new("scissorhands", "policies/scissorhands.kvp");
	int budget = kvp_ir_add_param(ir, L(3), "budget", 0.2, KVP_UNIT_RATIO, "");
	int recent = kvp_ir_add_param(ir, L(4), "recent", 10, KVP_UNIT_TOKENS, "");
	int32_t cond = B(ir, KVP_OP_LT, S(ir, KVP_SIG_ATTN), B(ir, KVP_OP_DIV, N(ir, 1), S(ir, KVP_SIG_SEEN)));
	int low = kvp_ir_add_stat(ir, L(5), "low", KVP_STAT_COUNT, cond, -1, KVP_HIST_LAST_STEPS,
	                          N(ir, 400));
	ir->score.expr = kvp_ir_unary(ir, L(6), KVP_OP_NEG, kvp_ir_stat_ref(ir, L(6), low));
	ir->score.reduce = KVP_REDUCE_MEAN;
	ir->guards.recent = P(ir, recent);
	ir->alloc.budget = B(ir, KVP_OP_MUL, P(ir, budget), S(ir, KVP_SIG_CONTEXT));
	ir->alloc.budget_unit = KVP_UNIT_RATIO;
	ir->alloc.layers = KVP_LAYERS_LINEAR;
	ir->alloc.from = N(ir, 0.8);
	ir->alloc.to = N(ir, 1.2);
	ir->trigger.kind = KVP_TRIG_OVER_BUDGET;
	ir->trigger.target = B(ir, KVP_OP_MUL, N(ir, 0.5), ir->alloc.budget);
	return ir;
}

/* CAOTE over H2O (fast form), per prefill block, with a merge action and spans: touches
 * the remaining emitter paths. */
static struct kvp_ir *ir_caote_mix(void)
{
	struct kvp_ir *ir = ir_new("caote_mix", "policies/caote_mix.kvp");
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
	ir->score.expr = kvp_ir_select(ir, L(7), B(ir, KVP_OP_GT, S(ir, KVP_SIG_COUNT), N(ir, 1)),
	                               B(ir, KVP_OP_MUL, c, S(ir, KVP_SIG_VALUE_NORM)),
	                               B(ir, KVP_OP_ADD, c, kd));
	ir->score.reduce = KVP_REDUCE_MAX;
	ir->guards.sinks = N(ir, 4);
	kvp_ir_add_span(ir, "system");
	kvp_ir_add_span(ir, "cit\"*/ations\\?\?=");
	ir->alloc.budget = P(ir, budget);
	ir->alloc.layers = KVP_LAYERS_LIST;
	double m[3] = { 1, 2, 3 };
	kvp_ir_set_list(ir, m, 3);
	ir->alloc.heads = KVP_HEADS_ADAPTIVE;
	ir->action.kind = KVP_ACT_SPLIT;
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

/* Emit ir into a heap string. */
static char *emit_str(struct kvp_ir *ir, int lines, const char *out_name)
{
	int nd = 0;
	ck_assert_int_eq(kvp_ir_check(ir, diag_print, &nd), 0);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	struct kvp_emit_opts o = { lines, out_name };
	ck_assert_int_eq(kvp_emit_c(ir, &o, f), 0);
	fclose(f);
	return buf;
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
	char dir[] = "/tmp/kvpc_emit_XXXXXX";
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
	snprintf(outname, sizeof outname, "build/gen/policies/%s.c", name);
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

/* ---- tests ------------------------------------------------------------------------ */

START_TEST(golden_h2o)
{
	struct kvp_ir *ir = ir_h2o();
	golden_check(ir, "h2o");
	ir_delete(ir);
}
END_TEST

START_TEST(golden_snapkv)
{
	struct kvp_ir *ir = ir_snapkv();
	golden_check(ir, "snapkv");
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
	ck_assert_ptr_nonnull(strstr(on, "#line 5 \"policies/h2o.kvp\"\n"));
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
	const char *banner = "/* generated from policies/scissorhands.kvp by kvpc " KVP_VERSION
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
	ir->score.reduce = KVP_REDUCE_NONE;
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

static Suite *emit_suite(void)
{
	Suite *s = suite_create("kvpc_emit");
	TCase *tc = tcase_create("emit");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, golden_h2o);
	tcase_add_test(tc, golden_snapkv);
	tcase_add_test(tc, golden_scissorhands);
	tcase_add_test(tc, compiles_all_paths);
	tcase_add_test(tc, line_directives_switch);
	tcase_add_test(tc, banner_and_determinism);
	tcase_add_test(tc, no_injection);
	tcase_add_test(tc, symbols);
	tcase_add_test(tc, registry);
	tcase_add_test(tc, checker_rejects);
	tcase_add_test(tc, layout_words);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(emit_suite());
	srunner_run_all(sr, CK_NORMAL);
	int nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf == 0 ? 0 : 1;
}
