/*
 * test_kvpc_front: the front end of kvpc — scanner, parser, semantic analysis, lowering
 * to the IR, the formatter and the driver's exit codes.
 *   - golden diagnostics: every tests/golden/kvp/bad/NAME.kvp must fail with exactly the
 *     text of NAME.err (format of compiler/kvp_src.h);
 *   - generated hostile inputs: a 1 MB file, 10000 nested parentheses, 100000 unary
 *     operators, a 250000-term expression, 30 broken statements (error cap);
 *   - every library policy (policies/) and good example compiles, and the lowered IR
 *     of the library policies has the structure the language reference promises
 *     (hand-derived expectations per policy);
 *   - fmt is idempotent and canonical on every policy, matches fmt/messy.fmt, and keeps
 *     the meaning (same IR before and after formatting).
 * Run from the repository root.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvp_ast.h"
#include "kvp_emit_c.h"
#include "kvp_fmt.h"
#include "kvp_ir.h"
#include "kvp_sema.h"
#include "kvp_src.h"
#include "kv/rt_kv.h"
#include "support/check_run.h"

#define GOLDEN "tests/golden/kvp"

static char kvpc_path[1024]; /* the driver next to this test binary, "" if absent */

/* ---- helpers ------------------------------------------------------------------------ */

static char *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	size_t got = fread(buf, 1, (size_t)n, f);
	fclose(f);
	buf[got] = '\0';
	if (len)
		*len = got;
	return buf;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* sorted "DIR/NAME.kvp" paths of a directory (NULL-terminated, malloc'd) */
static char **list_kvp(const char *dir, int *n)
{
	DIR *d = opendir(dir);
	char **out = calloc(512, sizeof *out);
	*n = 0;
	if (!d)
		return out;
	struct dirent *e;
	while ((e = readdir(d)) && *n < 511) {
		size_t l = strlen(e->d_name);
		if (l > 4 && !strcmp(e->d_name + l - 4, ".kvp")) {
			char *p = malloc(strlen(dir) + l + 2);
			sprintf(p, "%s/%s", dir, e->d_name);
			out[(*n)++] = p;
		}
	}
	closedir(d);
	qsort(out, (size_t)*n, sizeof *out, cmp_str);
	return out;
}

static void free_list(char **l, int n)
{
	for (int i = 0; i < n; i++)
		free(l[i]);
	free(l);
}

/* compile text named name; returns the number of errors, *diags a malloc'd copy */
static int compile_text(const char *name, const char *text, size_t len, char **diags)
{
	kvp_src *src = kvp_src_from_mem(name, text, len);
	struct kvp_ir ir;
	int rc = kvp_compile(src, &ir);
	if (rc == 0)
		kvp_ir_free(&ir);
	if (diags)
		*diags = strdup(kvp_src_diags(src));
	int errors = src->n_errors;
	kvp_src_free(src);
	ck_assert_int_eq(rc != 0, errors != 0);
	return errors;
}

/* compile a file into ir (must succeed) */
static void compile_file(const char *path, struct kvp_ir *ir)
{
	char err[256];
	kvp_src *src = kvp_src_open(path, err, sizeof err);
	ck_assert_msg(src != NULL, "%s", err);
	int rc = kvp_compile(src, ir);
	ck_assert_msg(rc == 0, "%s does not compile:\n%s", path, kvp_src_diags(src));
	ck_assert_str_eq(kvp_src_diags(src), "");
	kvp_src_free(src);
}

static const struct kvp_ir_expr *node(const struct kvp_ir *ir, int32_t i)
{
	ck_assert_int_ge(i, 0);
	ck_assert_int_lt(i, ir->n_nodes);
	return &ir->nodes[i];
}

static void expect_param(const struct kvp_ir *ir, int32_t e, int index)
{
	ck_assert_int_eq(node(ir, e)->op, KVP_OP_PARAM);
	ck_assert_int_eq(node(ir, e)->index, index);
}

static void expect_signal(const struct kvp_ir *ir, int32_t e, enum kvp_ir_signal s)
{
	ck_assert_int_eq(node(ir, e)->op, KVP_OP_SIGNAL);
	ck_assert_int_eq(node(ir, e)->sig, s);
}

static void expect_fold(const struct kvp_ir *ir, int32_t e, double v)
{
	double got;
	ck_assert_msg(kvp_ir_fold(ir, e, &got), "node %d does not fold", e);
	ck_assert_double_eq_tol(got, v, 1e-12);
}

/* ---- golden diagnostics ------------------------------------------------------------ */

/* The C that kvp_emit_c writes for ir, without #line directives; the caller frees it. */
static char *emit_c_str(const struct kvp_ir *ir)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	struct kvp_emit_opts eo = { .line_directives = 0 };
	ck_assert_int_eq(kvp_emit_c(ir, &eo, f), 0);
	fclose(f);
	return buf;
}

/* The byte allocator's precision tiers as the library writes them: f16, q8, q4 (no 2-bit
 * tier), utility-ranked, under a byte budget of the share parameter (index 0) times the
 * context. */
static void expect_utility_tiers(const struct kvp_ir *ir)
{
	ck_assert_int_eq(ir->tiers.n, 3);
	ck_assert_int_eq(ir->tiers.tier[0], RT_KV_TIER_TOP);
	ck_assert_int_eq(ir->tiers.tier[1], RT_KV_TIER_Q8);
	ck_assert_int_eq(ir->tiers.tier[2], RT_KV_TIER_Q4);
	ck_assert_int_eq(ir->tiers.kind, K_TIERS_UTILITY);
	ck_assert_int_eq(ir->alloc.budget_bytes, 1);
	const struct kvp_ir_expr *b = node(ir, ir->alloc.budget);
	ck_assert_int_eq(b->op, KVP_OP_MUL);
	expect_param(ir, b->a, 0);
	expect_signal(ir, b->b, KVP_SIG_CONTEXT);
}

static char **bad_files;
static int n_bad;

START_TEST(test_golden_bad)
{
	const char *path = bad_files[_i];
	char errp[512];
	snprintf(errp, sizeof errp, "%.*s.err", (int)strlen(path) - 4, path);
	char *expected = read_all(errp, NULL);
	ck_assert_msg(expected != NULL, "missing %s", errp);
	char err[256];
	kvp_src *src = kvp_src_open(path, err, sizeof err);
	ck_assert_msg(src != NULL, "%s", err);
	struct kvp_ir ir;
	int rc = kvp_compile(src, &ir);
	ck_assert_msg(rc > 0, "%s compiled without errors", path);
	ck_assert_msg(strcmp(kvp_src_diags(src), expected) == 0,
	              "%s: diagnostics differ\n--- expected\n%s--- got\n%s", path, expected,
	              kvp_src_diags(src));
	/* every diagnostic block is "file:line:col: error|note: ..." + 2 display lines */
	ck_assert_msg(strncmp(kvp_src_diags(src), path, strlen(path)) == 0, "%s", path);
	kvp_src_free(src);
	free(expected);
}
END_TEST

START_TEST(test_golden_count)
{
	ck_assert_int_ge(n_bad, 40);
}
END_TEST

/* ---- generated hostile inputs ------------------------------------------------------- */

START_TEST(test_one_megabyte)
{
	/* a valid policy padded to 1 MB with comment lines, broken on its last line */
	size_t cap = (1u << 20) + 4096, len = 0;
	char *t = malloc(cap);
	len += (size_t)sprintf(t + len, "policy big {\n    budget = 64 entries\n");
	int line = 3;
	while (len < (1u << 20)) {
		len += (size_t)sprintf(t + len, "    # padding line %d of a large policy file\n", line);
		line++;
	}
	len += (size_t)sprintf(t + len, "    score = atn\n}\n");
	char *diags;
	int errors = compile_text("big.kvp", t, len, &diags);
	ck_assert_int_eq(errors, 1);
	char expect[512];
	snprintf(expect, sizeof expect,
	         "big.kvp:%d:13: error: unknown name 'atn'; did you mean 'attn'?\n"
	         "%5d |     score = atn\n"
	         "      |             ^~~\n", line, line);
	ck_assert_str_eq(diags, expect);
	free(diags);
	free(t);
}
END_TEST

START_TEST(test_one_megabyte_line)
{
	/* one 1 MB expression line: rejected once by the depth limit, shown windowed */
	size_t n = 250000, len = 0;
	char *t = malloc(n * 4 + 64);
	len += (size_t)sprintf(t + len, "policy x {\n    score = ");
	for (size_t i = 0; i < n; i++) {
		memcpy(t + len, "1 + ", 4);
		len += 4;
	}
	len += (size_t)sprintf(t + len, "1\n}\n");
	ck_assert_uint_gt(len, 1000000);
	char *diags;
	int errors = compile_text("x.kvp", t, len, &diags);
	ck_assert_int_eq(errors, 1);
	const char *first =
		"x.kvp:2:13: error: expression is nested too deeply (more than 256 levels)\n"
		"    2 |     score = 1 + 1 + ";
	ck_assert_msg(strncmp(diags, first, strlen(first)) == 0, "%.300s", diags);
	ck_assert_uint_lt(strlen(diags), 600); /* the line is windowed, not dumped */
	ck_assert_ptr_nonnull(strstr(diags, "...\n      |             ^~~~"));
	free(diags);
	free(t);
}
END_TEST

START_TEST(test_deep_parentheses)
{
	size_t n = 10000, len = 0;
	char *t = malloc(2 * n + 64);
	len += (size_t)sprintf(t + len, "policy x {\n    score = ");
	memset(t + len, '(', n);
	len += n;
	t[len++] = '1';
	memset(t + len, ')', n);
	len += n;
	len += (size_t)sprintf(t + len, "\n}\n");
	char *diags;
	int errors = compile_text("x.kvp", t, len, &diags);
	ck_assert_int_eq(errors, 1);
	/* the 65th '(' is at column 13 + 64 */
	const char *first =
		"x.kvp:2:77: error: expression is nested too deeply (more than 64 levels of brackets)\n";
	ck_assert_msg(strncmp(diags, first, strlen(first)) == 0, "%.300s", diags);
	free(diags);
	free(t);
}
END_TEST

START_TEST(test_deep_unary)
{
	/* 100000 prefix operators: the parser stack limit, not a crash */
	const char *ops[] = { "-", "not " };
	for (int k = 0; k < 2; k++) {
		size_t n = 100000, len = 0, w = strlen(ops[k]);
		char *t = malloc(n * w + 64);
		len += (size_t)sprintf(t + len, "policy x {\n    score = ");
		for (size_t i = 0; i < n; i++) {
			memcpy(t + len, ops[k], w);
			len += w;
		}
		len += (size_t)sprintf(t + len, "1\n}\n");
		char *diags;
		int errors = compile_text("x.kvp", t, len, &diags);
		ck_assert_int_eq(errors, 1);
		ck_assert_msg(strstr(diags, "error: expression is nested too deeply") != NULL, "%.300s",
		              diags);
		free(diags);
		free(t);
	}
}
END_TEST

START_TEST(test_depth_limit_boundary)
{
	/* 255 additions nest 256 deep: accepted; one more is rejected */
	for (int extra = 0; extra < 2; extra++) {
		char t[4096];
		int len = sprintf(t, "policy x {\n    budget = 64\n    score = pos");
		for (int i = 0; i < 255 + extra; i++)
			len += sprintf(t + len, " + 1");
		len += sprintf(t + len, "\n    compress every step\n}\n");
		char *diags;
		int errors = compile_text("x.kvp", t, (size_t)len, &diags);
		ck_assert_msg(errors == extra, "extra %d: %s", extra, diags);
		free(diags);
	}
}
END_TEST

START_TEST(test_error_cap)
{
	char t[4096];
	int len = sprintf(t, "policy x {\n");
	for (int i = 0; i < 30; i++)
		len += sprintf(t + len, "    score pos\n");
	len += sprintf(t + len, "}\n");
	char *diags;
	int errors = compile_text("x.kvp", t, (size_t)len, &diags);
	ck_assert_int_ge(errors, 21);
	int shown = 0;
	for (const char *p = diags; (p = strstr(p, ": error: unexpected")); p++)
		shown++;
	ck_assert_int_eq(shown, KVP_MAX_ERRORS);
	ck_assert_ptr_nonnull(strstr(diags, "x.kvp: error: too many errors; stopping after 20\n"));
	free(diags);
}
END_TEST

/* Diagnostics come out in source order whatever order they were reported in: a file-wide
 * error first, then each located report by offset (equal places in report order), each
 * note after the report it belongs to, the cap's line last. Expected order by hand. */
START_TEST(test_diags_source_order)
{
	const char *text = "aaa\nbbb\nccc\n";
	kvp_src *src = kvp_src_from_mem("o.kvp", text, strlen(text));
	kvp_src_error(src, kvp_src_loc_at(src, 3, 1), "third line");
	kvp_src_note(src, kvp_src_loc_at(src, 1, 2), "note of the third");
	kvp_src_warning(src, kvp_src_loc_at(src, 2, 1), "second line");
	kvp_src_error(src, kvp_src_loc_at(src, 1, 1), "first line");
	kvp_src_error(src, kvp_src_loc_at(src, 3, 1), "third line again");
	kvp_src_error_file(src, "whole file");
	const char *want[] = { "o.kvp: error: whole file", "o.kvp:1:1: error: first line",
		               "o.kvp:2:1: warning: second line", "o.kvp:3:1: error: third line\n",
		               "o.kvp:1:2: note: note of the third", "o.kvp:3:1: error: third line again" };
	const char *d = kvp_src_diags(src), *at = d;
	for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
		const char *f = strstr(at, want[i]);
		ck_assert_msg(f != NULL, "'%s' missing or out of order in:\n%s", want[i], d);
		at = f + strlen(want[i]);
	}
	for (int i = 0; i < KVP_MAX_ERRORS; i++)
		kvp_src_error(src, kvp_src_loc_at(src, 1, 1), "more");
	d = kvp_src_diags(src);
	const char *cap = strstr(d, "o.kvp: error: too many errors");
	ck_assert_ptr_nonnull(cap);
	ck_assert_int_eq(strchr(cap, '\n')[1], '\0'); /* nothing after the cap's line */
	ck_assert_uint_eq(strlen(d), src->diags_len);
	kvp_src_free(src);
}
END_TEST

START_TEST(test_every_byte)
{
	/* each byte value inside a statement: an error or a valid program, never a crash */
	for (int b = 0; b < 256; b++) {
		char t[64];
		int len = sprintf(t, "policy x {\n    score = pos ");
		t[len++] = (char)b;
		len += sprintf(t + len, " 1\n}\n");
		char *diags;
		compile_text("x.kvp", t, (size_t)len, &diags);
		free(diags);
	}
}
END_TEST

START_TEST(test_caret_tabs_utf8)
{
	/* columns count code points; a tab is copied into the caret line */
	const char *t = "policy x {\n\tbudget = 64 # é\n\tscore = $\n}\n";
	char *diags;
	int errors = compile_text("u.kvp", t, strlen(t), &diags);
	ck_assert_int_eq(errors, 1);
	ck_assert_str_eq(diags, "u.kvp:3:10: error: unexpected character '$'\n"
	                        "    3 | \tscore = $\n"
	                        "      | \t        ^\n");
	free(diags);
	const char *u = "policy x {\n    param é = 1\n}\n";
	errors = compile_text("u.kvp", u, strlen(u), &diags);
	ck_assert_int_eq(errors, 1);
	ck_assert_str_eq(diags, "u.kvp:2:11: error: unexpected character 'é' (U+00E9)\n"
	                        "    2 |     param é = 1\n"
	                        "      |           ^\n");
	free(diags);
}
END_TEST

START_TEST(test_edit_distance)
{
	ck_assert_int_eq(kvp_edit_distance("attn", "atn", 2), 1);
	ck_assert_int_eq(kvp_edit_distance("kernel", "kernal", 2), 1);
	ck_assert_int_eq(kvp_edit_distance("sinks", "sink", 2), 1);
	ck_assert_int_eq(kvp_edit_distance("pyramid", "pyramd", 2), 1);
	ck_assert_int_eq(kvp_edit_distance("abc", "abc", 2), 0);
	ck_assert_int_eq(kvp_edit_distance("abcdef", "uvwxyz", 2), 3); /* capped at cap + 1 */
	ck_assert_int_eq(kvp_edit_distance("flaw", "lawn", 2), 2);
}
END_TEST

/* ---- every policy compiles; the IR is what the reference promises ------------------ */

/* A definition nothing names is a warning and the policy still compiles: a param a budget
 * rewritten as bytes(P) stopped reading (it would be listed and --set-able to no effect),
 * a statistic outside the score, a const. A name used anywhere (a guard, the budget, the
 * score) is not reported, one named only by unused definitions is; a file with errors gets
 * no warnings on top. */
START_TEST(test_unused_warning)
{
	static const char text[] =
		"policy q {\n"
		"    const c = 2\n"
		"    param share = 25%\n"
		"    param window = 16 tokens\n"
		"    budget = bytes(12.5%)\n"
		"    stat obs = sum(attn) over prompt tail window\n"
		"    stat spare = sum(attn)\n"
		"    const hist = 8 steps\n"
		"    stat old = count(attn < 1 / seen) over last hist\n"
		"    const base = 2 steps\n"
		"    const twice = base * 2\n"
		"    stat older = count(attn < base / seen) over last twice\n"
		"    score = obs\n"
		"    keep recent window\n"
		"    compress at prompt end\n"
		"}\n";
	char *d = NULL;
	ck_assert_int_eq(compile_text("q.kvp", text, strlen(text), &d), 0);
	/* hist is named only by the unused statistic old: unused as well, saying by whom */
	ck_assert_msg(strstr(d, "q.kvp:2:5: warning: const 'c' is never used\n") &&
	              strstr(d, "q.kvp:3:5: warning: param 'share' is never used: it changes nothing") &&
	              strstr(d, "q.kvp:7:5: warning: statistic 'spare' is never used") &&
	              strstr(d, "q.kvp:8:5: warning: const 'hist' is never used (only 'old' "
	                        "names it, and it is unused)\n") &&
	              strstr(d, "q.kvp:9:5: warning: statistic 'old' is never used: ") &&
	              /* a chain: base is named by twice and older, both unused */
	              strstr(d, "q.kvp:10:5: warning: const 'base' is never used (only unused "
	                        "definitions name it: 'twice', 'older')\n") &&
	              strstr(d, "q.kvp:11:5: warning: const 'twice' is never used (only 'older' "
	                        "names it, and it is unused)\n") &&
	              !strstr(d, "'window'") && !strstr(d, "'obs'") && !strstr(d, "prompt tail") &&
	              !strstr(d, "error"), "%s", d);
	free(d);
	/* a prompt-tail statistic under a trigger that fires before the tail is a warning; under
	 * `compress at prompt end` (above) it is not */
	static const char tail[] = "policy t {\n    stat obs = sum(attn) over prompt tail 16\n"
	                           "    score = obs\n    budget = 25%\n    keep recent 16\n"
	                           "    compress every step\n}\n";
	ck_assert_int_eq(compile_text("t.kvp", tail, strlen(tail), &d), 0);
	ck_assert_msg(strstr(d, "t.kvp:2:5: warning: statistic 'obs' reads the prompt's last "
	                        "queries (`over prompt tail`)") && !strstr(d, "error"), "%s", d);
	free(d);
	static const char bad[] = "policy q {\n    param share = 25%\n    budget = nosuch\n}\n";
	ck_assert_int_gt(compile_text("b.kvp", bad, strlen(bad), &d), 0);
	ck_assert_msg(!strstr(d, "warning"), "%s", d);
	free(d);
	/* a constant score ranks nothing (every entry ties): compiled, with a warning; so is a
	 * score that reads parameters only; one that reads a signal is not */
	static const char *const scores[] = { "1", "2 * 3 - 1", "share", "pos", "-key_norm" };
	for (int i = 0; i < 5; i++) {
		char t[256];
		snprintf(t, sizeof t, "policy q {\n    param share = 25%%\n    budget = share * context\n"
		         "    score = %s\n    compress every step\n}\n", scores[i]);
		ck_assert_int_eq(compile_text("s.kvp", t, strlen(t), &d), 0);
		const int warned = strstr(d, "s.kvp:4:13: warning: the score is a constant: every "
		                             "entry ties") != NULL;
		ck_assert_msg(warned == (i < 3), "score = %s: %s", scores[i], d);
		free(d);
	}
	static const char both[] = "policy q {\n    budget = nosuch\n    score = 1\n}\n";
	ck_assert_int_gt(compile_text("c.kvp", both, strlen(both), &d), 0);
	ck_assert_msg(!strstr(d, "warning"), "a file with errors gets no warnings: %s", d);
	free(d);
}
END_TEST

START_TEST(test_policies_compile)
{
	int n;
	char **files = list_kvp("policies", &n);
	static const char *const required[] = {
		"sliding_window", "streaming_llm", "h2o", "tova", "snapkv", "pyramidkv",
		"adakv_snapkv", "scissorhands", "caote_h2o", "knorm", "keydiff", "gracekv",
	};
	ck_assert_int_ge(n, 12);
	for (size_t r = 0; r < sizeof required / sizeof required[0]; r++) {
		int found = 0;
		for (int i = 0; i < n; i++) {
			struct kvp_ir ir;
			char want[128];
			snprintf(want, sizeof want, "policies/%s.kvp", required[r]);
			if (strcmp(files[i], want) != 0)
				continue;
			compile_file(files[i], &ir);
			ck_assert_str_eq(ir.name, required[r]);
			ck_assert_msg(ir.summary[0] != '\0', "%s has no summary comment", files[i]);
			ck_assert_msg(strstr(ir.summary, "arXiv") != NULL || r == 0,
			              "%s: the first line should cite the paper", files[i]);
			kvp_ir_free(&ir);
			found = 1;
		}
		ck_assert_msg(found, "policies/%s.kvp is missing", required[r]);
	}
	free_list(files, n);
	files = list_kvp(GOLDEN "/good", &n);
	ck_assert_int_ge(n, 2);
	for (int i = 0; i < n; i++) {
		struct kvp_ir ir;
		compile_file(files[i], &ir);
		kvp_ir_free(&ir);
	}
	free_list(files, n);
}
END_TEST

/* The statements BIN info shows (kvp_ir.statements): each on one line as written, a
 * newline inside parentheses and its indentation one space, a comment inside them and
 * after a statement dropped, `param`s left out (hand-written expectation). */
START_TEST(test_statements_text)
{
	static const char text[] =
		"# summary\n"
		"policy st {\n"
		"    param cap = 25%  # share\n"
		"    const half = 0.5\n"
		"    budget = cap min 8 tokens  # floor\n"
		"    precision = tiers(f16 = 25%,  # top\n"
		"                      q8 = 25%, q4 = rest)\n"
		"    stat acc = sum(attn) over all\n"
		"    score = acc * half\n"
		"    keep span system\n"
		"    compress every 8 steps\n"
		"}\n";
	kvp_src *src = kvp_src_from_mem("st.kvp", text, strlen(text));
	struct kvp_ir ir;
	ck_assert_msg(kvp_compile(src, &ir) == 0, "%s", kvp_src_diags(src));
	ck_assert_str_eq(ir.statements,
	                 "const half = 0.5\n"
	                 "budget = cap min 8 tokens\n"
	                 "precision = tiers(f16 = 25%, q8 = 25%, q4 = rest)\n"
	                 "stat acc = sum(attn) over all\n"
	                 "score = acc * half\n"
	                 "keep span system\n"
	                 "compress every 8 steps\n");
	kvp_ir_free(&ir);
	kvp_src_free(src);
}
END_TEST

START_TEST(test_lower_h2o)
{
	struct kvp_ir ir;
	compile_file("policies/h2o.kvp", &ir);
	ck_assert_int_eq(ir.n_params, 2);
	ck_assert_str_eq(ir.params[0].name, "heavy");
	ck_assert_int_eq(ir.params[0].unit, KVP_UNIT_RATIO);
	ck_assert_double_eq_tol(ir.params[0].def, 0.1, 1e-15);
	ck_assert_str_eq(ir.params[1].doc, "recent-window share of the context (recent_ratio)");
	/* budget = (heavy + recent) * context */
	const struct kvp_ir_expr *b = node(&ir, ir.alloc.budget);
	ck_assert_int_eq(b->op, KVP_OP_MUL);
	ck_assert_int_eq(node(&ir, b->a)->op, KVP_OP_ADD);
	expect_param(&ir, node(&ir, b->a)->a, 0);
	expect_param(&ir, node(&ir, b->a)->b, 1);
	expect_signal(&ir, b->b, KVP_SIG_CONTEXT);
	ck_assert_int_eq(ir.alloc.budget_unit, KVP_UNIT_RATIO);
	/* budget ... min 64 tokens: a constant floor beside the budget, not inside it (a ratio
	 * override replaces the budget's tree only) */
	expect_fold(&ir, ir.alloc.min, 64);
	/* keep recent recent = recent * context */
	const struct kvp_ir_expr *r = node(&ir, ir.guards.recent);
	ck_assert_int_eq(r->op, KVP_OP_MUL);
	expect_param(&ir, r->a, 1);
	expect_signal(&ir, r->b, KVP_SIG_CONTEXT);
	ck_assert_int_eq(ir.guards.sinks, -1);
	ck_assert_int_eq(ir.n_stats, 1);
	ck_assert_int_eq(ir.stats[0].kind, KVP_STAT_SUM);
	ck_assert_int_eq(ir.stats[0].hist, KVP_HIST_WHOLE);
	expect_signal(&ir, ir.stats[0].arg, KVP_SIG_ATTN);
	ck_assert_int_eq(node(&ir, ir.score.expr)->op, KVP_OP_STAT);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_SUM);
	ck_assert_int_eq(ir.score.pool, K_POOL_NONE);
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_EVERY_STEP);
	ck_assert_int_eq(ir.trigger.target, -1);
	ck_assert_int_eq(ir.action.kind, K_ACT_EVICT);
	ck_assert_int_eq(ir.positions, KVP_POS_ORIGINAL);
	kvp_ir_free(&ir);
}
END_TEST

START_TEST(test_lower_snapkv_family)
{
	struct kvp_ir ir;
	compile_file("policies/snapkv.kvp", &ir);
	ck_assert_int_eq(ir.stats[0].hist, KVP_HIST_PROMPT_TAIL);
	expect_param(&ir, ir.stats[0].window, 1);
	ck_assert_int_eq(ir.params[1].unit, KVP_UNIT_TOKENS);
	ck_assert_int_eq(ir.score.pool, K_POOL_MAX);
	expect_fold(&ir, ir.score.kernel, 7);
	ck_assert_int_eq(ir.score.pool_before_reduce, 1);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_MEAN);
	expect_param(&ir, ir.guards.recent, 1); /* tokens: no context factor */
	expect_param(&ir, ir.alloc.budget, 0);
	ck_assert_int_eq(ir.alloc.budget_unit, KVP_UNIT_ENTRIES);
	ck_assert_int_eq(ir.alloc.min, -1); /* a budget of a fixed size: no floor */
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_PROMPT_END);
	ck_assert_int_eq(ir.alloc.layers, K_LAYERS_UNIFORM);
	kvp_ir_free(&ir);

	compile_file("policies/pyramidkv.kvp", &ir);
	ck_assert_int_eq(ir.alloc.layers, K_LAYERS_PYRAMID);
	expect_param(&ir, ir.alloc.beta, 2);
	ck_assert_double_eq(ir.params[2].def, 20);
	ck_assert_int_eq(ir.score.pool_before_reduce, 0); /* group = mean before pool */
	kvp_ir_free(&ir);

	compile_file("policies/adakv_snapkv.kvp", &ir);
	ck_assert_int_eq(ir.alloc.heads, K_HEADS_ADAPTIVE);
	expect_param(&ir, ir.alloc.floor, 2);
	ck_assert_double_eq_tol(ir.params[2].def, 0.2, 1e-15);
	kvp_ir_free(&ir);
}
END_TEST

START_TEST(test_lower_scissorhands)
{
	struct kvp_ir ir;
	compile_file("policies/scissorhands.kvp", &ir);
	ck_assert_int_eq(ir.n_consts, 1);
	ck_assert_int_eq(ir.stats[0].kind, KVP_STAT_COUNT);
	ck_assert_int_eq(ir.stats[0].hist, KVP_HIST_LAST_STEPS);
	expect_fold(&ir, ir.stats[0].window, 400);
	/* count(attn < 1 / seen) */
	const struct kvp_ir_expr *c = node(&ir, ir.stats[0].arg);
	ck_assert_int_eq(c->op, KVP_OP_LT);
	expect_signal(&ir, c->a, KVP_SIG_ATTN);
	ck_assert_int_eq(node(&ir, c->b)->op, KVP_OP_DIV);
	expect_fold(&ir, node(&ir, c->b)->a, 1);
	expect_signal(&ir, node(&ir, c->b)->b, KVP_SIG_SEEN);
	/* score = -low */
	ck_assert_int_eq(node(&ir, ir.score.expr)->op, KVP_OP_NEG);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_MEAN);
	/* when entries > budget to left * budget; budget = capacity * context */
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_OVER_BUDGET);
	const struct kvp_ir_expr *th = node(&ir, ir.trigger.threshold);
	ck_assert_int_eq(th->op, KVP_OP_MUL);
	expect_param(&ir, th->a, 0);
	expect_signal(&ir, th->b, KVP_SIG_CONTEXT);
	const struct kvp_ir_expr *tg = node(&ir, ir.trigger.target);
	ck_assert_int_eq(tg->op, KVP_OP_MUL);
	expect_param(&ir, tg->a, 2);
	ck_assert_double_eq(ir.params[2].def, 0.5);
	ck_assert_int_eq(node(&ir, tg->b)->op, KVP_OP_MUL);
	expect_param(&ir, ir.guards.recent, 1);
	/* the funnel: a linear ramp 0.5 .. 1.5 over the layers */
	ck_assert_int_eq(ir.alloc.layers, K_LAYERS_LINEAR);
	expect_fold(&ir, ir.alloc.from, 0.5);
	expect_fold(&ir, ir.alloc.to, 1.5);
	kvp_ir_free(&ir);
}
END_TEST

START_TEST(test_lower_position_rules)
{
	struct kvp_ir ir;
	compile_file("policies/streaming_llm.kvp", &ir);
	ck_assert_int_eq(ir.positions, KVP_POS_COMPACTED);
	/* newest first beyond the guards, so a ratio budget above S + R widens the window */
	expect_signal(&ir, ir.score.expr, KVP_SIG_POS);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_NONE);
	expect_param(&ir, ir.guards.sinks, 0);
	expect_param(&ir, ir.guards.recent, 1);
	ck_assert_int_eq(node(&ir, ir.alloc.budget)->op, KVP_OP_ADD);
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_OVER_BUDGET);
	ck_assert_int_eq(ir.n_stats, 0);
	kvp_ir_free(&ir);

	compile_file("policies/sliding_window.kvp", &ir);
	expect_signal(&ir, ir.score.expr, KVP_SIG_POS);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_NONE);
	kvp_ir_free(&ir);

	/* a policy without compress keeps everything; "full" itself is the runtime's */
	static const char keep_all[] = "policy keep_all {\n    positions = original\n}\n";
	kvp_src *ka = kvp_src_from_mem("keep_all.kvp", keep_all, strlen(keep_all));
	ck_assert_int_eq(kvp_compile(ka, &ir), 0);
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_NEVER);
	ck_assert_int_eq(ir.alloc.budget, -1);
	kvp_ir_free(&ir);
	kvp_src_free(ka);

	compile_file("policies/tova.kvp", &ir);
	ck_assert_int_eq(ir.score.over_layer, 1);
	ck_assert_int_eq(ir.stats[0].kind, KVP_STAT_LAST);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_MEAN);
	kvp_ir_free(&ir);

	compile_file("policies/knorm.kvp", &ir);
	ck_assert_int_eq(node(&ir, ir.score.expr)->op, KVP_OP_NEG);
	expect_signal(&ir, node(&ir, ir.score.expr)->a, KVP_SIG_KEY_NORM);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_NONE);
	kvp_ir_free(&ir);

	compile_file("policies/keydiff.kvp", &ir);
	expect_signal(&ir, node(&ir, ir.score.expr)->a, KVP_SIG_KEY_COS_MEAN);
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_PREFILL_BLOCK);
	ck_assert_int_eq(ir.trigger.prompt_only, 1); /* `per prompt block`: prefill only */
	expect_param(&ir, ir.trigger.n, 1);
	kvp_ir_free(&ir);
}
END_TEST

/* budget = threshold(level) (docs/language.md section 7.11): the level lowered as the
 * parameter it names, the entry budget the whole context, and the emitted compress fires at
 * the prompt end whatever the entry count, with the level in its configuration. */
START_TEST(test_lower_threshold)
{
	struct kvp_ir ir;
	compile_file("tests/tier/thr_knorm.kvp", &ir);
	ck_assert_int_eq(ir.alloc.threshold, 1);
	expect_param(&ir, ir.alloc.level, 0);
	expect_signal(&ir, ir.alloc.budget, KVP_SIG_CONTEXT);
	char *buf = emit_c_str(&ir);
	ck_assert_ptr_nonnull(strstr(buf, "\tcfg->threshold = 1;\n\tcfg->level = P[0];\n"));
	ck_assert_ptr_nonnull(strstr(buf, "seen == (double)ctx->prompt_len;\n"));
	ck_assert_ptr_null(strstr(buf, "entries > budget_of"));
	free(buf);
	kvp_ir_free(&ir);
}
END_TEST

/* The precision action (docs/language.md section 7.8) as the library writes it: KIVI's one
 * tier (shares [1]), MiKV's two (10% then the rest: cumulative 0.1, 1), the utility form with
 * a byte budget (the share parameter times the context, bytes flagged), the needs flag, and
 * a schedule that fires whatever the entry count (no `entries` comparison left to it). */
START_TEST(test_lower_tiers)
{
	struct kvp_ir ir;
	compile_file("policies/kivi_q4.kvp", &ir);
	ck_assert_int_eq(ir.tiers.n, 1);
	ck_assert_int_eq(ir.tiers.tier[0], RT_KV_TIER_Q4);
	ck_assert_int_eq(ir.tiers.kind, K_TIERS_SHARES);
	ck_assert(ir.tiers.cum[0] == 1);
	ck_assert_int_eq(ir.alloc.budget_bytes, 0);
	expect_param(&ir, ir.guards.recent, 0);
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_EVERY_N);
	ck_assert(ir.needs & KVP_NEED_TIERS);
	kvp_ir_free(&ir);

	compile_file("policies/mikv_h2o.kvp", &ir);
	ck_assert_int_eq(ir.tiers.n, 2);
	ck_assert_int_eq(ir.tiers.tier[0], 0);
	ck_assert_int_eq(ir.tiers.tier[1], RT_KV_TIER_Q4);
	ck_assert(fabs(ir.tiers.cum[0] - 0.1) < 1e-15 && ir.tiers.cum[1] == 1);
	kvp_ir_free(&ir);

	compile_file("policies/h2o_tiers.kvp", &ir);
	expect_utility_tiers(&ir); /* no 2-bit tier (measured, the file) */
	ck_assert_int_eq(ir.alloc.budget_unit, KVP_UNIT_RATIO);
	ck_assert(ir.needs & KVP_NEED_TIERS);
	kvp_ir_free(&ir);

	/* SnapKV's prompt score under the byte allocator: the observation-window statistic
	 * (the `window` parameter, index 2), pooled per query head then averaged, the byte budget
	 * as the share times the context, the same three tiers and one compress at prompt end */
	compile_file("policies/snapkv_tiers.kvp", &ir);
	ck_assert_int_eq(ir.stats[0].hist, KVP_HIST_PROMPT_TAIL);
	expect_param(&ir, ir.stats[0].window, 2);
	ck_assert_int_eq(ir.score.pool, K_POOL_MAX);
	expect_fold(&ir, ir.score.kernel, 7);
	ck_assert_int_eq(ir.score.pool_before_reduce, 1);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_MEAN);
	expect_param(&ir, ir.guards.sinks, 1);
	expect_param(&ir, ir.guards.recent, 2);
	expect_utility_tiers(&ir);
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_PROMPT_END);
	ck_assert(ir.needs & KVP_NEED_TIERS);
	kvp_ir_free(&ir);

	/* the emitted trigger: every 32 steps, with no entry-count condition */
	compile_file("policies/tova_tiers.kvp", &ir);
	char *buf = emit_c_str(&ir);
	ck_assert_ptr_nonnull(strstr(buf, "\treturn k_every(seen, 32.0);\n"));
	ck_assert_ptr_nonnull(strstr(buf, "cfg->tiers = K_TIERS_UTILITY;"));
	ck_assert_ptr_nonnull(strstr(buf, "{ RT_KV_TIER_TOP, RT_KV_TIER_Q8, RT_KV_TIER_Q4 }"));
	ck_assert_ptr_nonnull(strstr(buf, "k_tier_scratch_bytes(kv)"));
	free(buf);
	kvp_ir_free(&ir);

	/* keys and values at different bits: k8v4 by name, q2 spelled k4v2, shares 25/25/50 */
	compile_file("tests/golden/kvp/good/tiers_kv_bits.kvp", &ir);
	ck_assert_int_eq(ir.tiers.n, 3);
	ck_assert_int_eq(ir.tiers.tier[0], RT_KV_TIER_TOP);
	ck_assert_int_eq(ir.tiers.tier[1], RT_KV_TIER_K8V4);
	ck_assert_int_eq(ir.tiers.tier[2], RT_KV_TIER_Q2);
	ck_assert(ir.tiers.cum[0] == 0.25 && ir.tiers.cum[1] == 0.5 && ir.tiers.cum[2] == 1);
	ck_assert_int_eq(ir.tiers.rotate, 3);
	buf = emit_c_str(&ir);
	ck_assert_ptr_nonnull(strstr(buf, "{ RT_KV_TIER_TOP, RT_KV_TIER_K8V4, RT_KV_TIER_Q2 }"));
	free(buf);
	kvp_ir_free(&ir);
}
END_TEST

START_TEST(test_lower_caote_gracekv)
{
	struct kvp_ir ir;
	compile_file("policies/caote_h2o.kvp", &ir);
	const struct kvp_ir_expr *s = node(&ir, ir.score.expr);
	ck_assert_int_eq(s->op, KVP_OP_CAOTE);
	ck_assert_int_eq(s->mode, KVP_CAOTE_EXACT);
	ck_assert_int_eq(node(&ir, s->a)->op, KVP_OP_STAT);
	ck_assert_int_eq(ir.trigger.kind, KVP_TRIG_PREFILL_BLOCK);
	ck_assert_int_eq(ir.trigger.prompt_only, 0); /* `per block`: decoding too */
	expect_param(&ir, ir.trigger.n, 2);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_L2); /* CAOTE's GQA rule */
	ck_assert_uint_eq(ir.needs & KVP_NEED_OUT, KVP_NEED_OUT);
	kvp_ir_free(&ir);

	/* FastCAOTE: the mean value, no attention output; a per-query-head score still */
	compile_file("policies/caote_fast_h2o.kvp", &ir);
	s = node(&ir, ir.score.expr);
	ck_assert_int_eq(s->mode, KVP_CAOTE_FAST);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_L2);
	ck_assert_uint_eq(ir.needs & KVP_NEED_OUT, 0);
	kvp_ir_free(&ir);

	/* over TOVA: l2 over the layer */
	compile_file("policies/caote_tova.kvp", &ir);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_L2);
	ck_assert_int_eq(ir.score.over_layer, 1);
	kvp_ir_free(&ir);

	compile_file("policies/gracekv.kvp", &ir);
	s = node(&ir, ir.score.expr);
	ck_assert_int_eq(s->op, KVP_OP_NORMALIZE);
	ck_assert_int_eq(node(&ir, s->a)->op, KVP_OP_STAT);
	ck_assert_int_eq(ir.stats[0].hist, KVP_HIST_PROMPT_TAIL);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_SUM);
	ck_assert_int_eq(ir.alloc.heads, K_HEADS_GLOBAL);
	expect_fold(&ir, ir.alloc.floor, 0.8);
	ck_assert_int_eq(ir.action.kind, K_ACT_SPLIT);
	expect_fold(&ir, ir.action.run, 64);
	expect_fold(&ir, ir.action.floor, 16);
	/* GraceKV's values as policies/gracekv.kvp writes them */
	ck_assert_int_eq(ir.action.seg_fixed, 0);
	expect_fold(&ir, ir.action.seg_min, 16);
	expect_fold(&ir, ir.action.seg_max, 128);
	expect_fold(&ir, ir.action.seg_cut, 3);
	expect_fold(&ir, ir.action.seg_length, 4);
	expect_fold(&ir, ir.action.seg_stability, 0.5);
	expect_fold(&ir, ir.action.seg_surprisal, 1);
	ck_assert_int_eq(ir.action.n_win, 3);
	ck_assert_int_eq(ir.action.win[0], 2);
	ck_assert_int_eq(ir.action.win[1], 4);
	ck_assert_int_eq(ir.action.win[2], 8);
	ck_assert_int_eq(ir.action.count, 0);
	expect_fold(&ir, ir.action.smooth, 0.1);
	expect_fold(&ir, ir.action.mass, 1);
	expect_fold(&ir, ir.action.numerator, 1);
	ck_assert_int_eq(ir.guards.n_spans, 2);
	ck_assert_str_eq(ir.guards.spans[0], "system");
	ck_assert_str_eq(ir.guards.spans[1], "question");
	/* 12.5% ratio budget */
	ck_assert_double_eq_tol(ir.params[0].def, 0.125, 1e-15);
	kvp_ir_free(&ir);

	compile_file(GOLDEN "/good/everything.kvp", &ir);
	ck_assert_int_eq(ir.alloc.layers, K_LAYERS_LINEAR);
	expect_fold(&ir, ir.alloc.from, 0.5);
	expect_fold(&ir, ir.alloc.to, 1.5);
	ck_assert_int_eq(ir.action.kind, K_ACT_MERGE);
	expect_fold(&ir, ir.action.run, 8);
	ck_assert_int_eq(ir.score.pool, K_POOL_AVG);
	ck_assert_int_eq(ir.score.pool_before_reduce, 0);
	ck_assert_int_eq(ir.score.reduce, K_REDUCE_MAX);
	ck_assert_int_eq(ir.guards.protect_all_spans, 1);
	ck_assert_int_eq(ir.positions, KVP_POS_COMPACTED);
	ck_assert_int_eq(ir.n_stats, 6);
	ck_assert_int_eq(ir.stats[2].kind, KVP_STAT_COUNT);
	ck_assert_int_eq(ir.stats[3].kind, KVP_STAT_EMA);
	expect_fold(&ir, ir.stats[3].alpha, 0.25);
	/* target = half * budget: a const folds */
	expect_fold(&ir, node(&ir, ir.trigger.target)->a, 0.5);
	kvp_ir_free(&ir);
}
END_TEST

/* `rotate = hadamard(keys)` reaches the IR's tiers and the emitted policy's tier_rotate
 * (bit 0 keys, runtime/policy/rt_policy.h); the tiers before it stay as written */
START_TEST(test_tiers_rotate)
{
	struct kvp_ir ir;
	compile_file(GOLDEN "/good/tiers_rotate.kvp", &ir);
	ck_assert_int_eq(ir.tiers.n, 2);
	ck_assert_int_eq(ir.tiers.kind, K_TIERS_SHARES);
	ck_assert_int_eq(ir.tiers.rotate, 1);
	ck_assert_double_eq_tol(ir.tiers.cum[0], 0.5, 1e-15);
	char *buf = emit_c_str(&ir);
	ck_assert_ptr_nonnull(strstr(buf, "\t.tier_rotate = 1,\n"));
	free(buf);
	kvp_ir_free(&ir);
}
END_TEST

START_TEST(test_c_keywords)
{
	struct kvp_ir ir;
	compile_file(GOLDEN "/good/c_keywords.kvp", &ir);
	ck_assert_str_eq(ir.name, "int");
	ck_assert_str_eq(ir.params[0].name, "while");
	ck_assert_str_eq(ir.params[1].name, "return");
	ck_assert_int_eq(ir.params[1].unit, KVP_UNIT_TOKENS);
	expect_fold(&ir, ir.stats[0].window, 400);
	char *buf = emit_c_str(&ir);
	/* the names appear only as string literals */
	ck_assert_ptr_nonnull(strstr(buf, "\"while\""));
	ck_assert_ptr_null(strstr(buf, " while ="));
	free(buf);
	kvp_ir_free(&ir);
}
END_TEST

/* ---- formatter ---------------------------------------------------------------------- */

static char *fmt_text(const char *name, const char *text, size_t len)
{
	kvp_src *src = kvp_src_from_mem(name, text, len);
	char *out = kvp_fmt_src(src);
	ck_assert_msg(out != NULL, "%s does not parse:\n%s", name, kvp_src_diags(src));
	kvp_src_free(src);
	return out;
}

/* the operations and numbers of an IR, without locations (the meaning) */
static char *ir_shape(const char *name, const char *text)
{
	kvp_src *src = kvp_src_from_mem(name, text, strlen(text));
	struct kvp_ir ir;
	ck_assert_int_eq(kvp_compile(src, &ir), 0);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	for (int i = 0; i < ir.n_nodes; i++)
		fprintf(f, "%d %a %d %d %d %d %d %d;", ir.nodes[i].op, ir.nodes[i].num,
		        ir.nodes[i].index, ir.nodes[i].sig, ir.nodes[i].mode, ir.nodes[i].a,
		        ir.nodes[i].b, ir.nodes[i].c);
	for (int i = 0; i < ir.n_params; i++)
		fprintf(f, "p %s %a %d %s;", ir.params[i].name, ir.params[i].def, ir.params[i].unit,
		        ir.params[i].doc);
	fprintf(f, "%d %d %d %d %d %d %d %d", ir.score.expr, ir.score.reduce, ir.alloc.budget,
	        ir.trigger.kind, ir.trigger.target, ir.guards.recent, ir.action.kind,
	        ir.positions);
	fclose(f);
	kvp_ir_free(&ir);
	kvp_src_free(src);
	return buf;
}

START_TEST(test_fmt_idempotent)
{
	const char *dirs[] = { "policies", GOLDEN "/good", GOLDEN "/fmt" };
	int total = 0;
	for (int d = 0; d < 3; d++) {
		int n;
		char **files = list_kvp(dirs[d], &n);
		for (int i = 0; i < n; i++) {
			size_t len;
			char *x = read_all(files[i], &len);
			char *y = fmt_text(files[i], x, len);
			char *z = fmt_text(files[i], y, strlen(y));
			ck_assert_msg(strcmp(y, z) == 0, "fmt is not idempotent on %s:\n%s---\n%s",
			              files[i], y, z);
			if (d < 2) /* the library and good examples are written canonically */
				ck_assert_msg(strcmp(x, y) == 0, "%s is not in canonical form:\n%s",
				              files[i], y);
			if (d != 1 || strstr(files[i], "everything") || strstr(files[i], "keywords")) {
				char *a = ir_shape(files[i], x), *b = ir_shape(files[i], y);
				ck_assert_msg(strcmp(a, b) == 0, "fmt changed the meaning of %s", files[i]);
				free(a);
				free(b);
			}
			free(x);
			free(y);
			free(z);
			total++;
		}
		free_list(files, n);
	}
	ck_assert_int_ge(total, 16);
}
END_TEST

START_TEST(test_fmt_golden)
{
	size_t len;
	char *x = read_all(GOLDEN "/fmt/messy.kvp", &len);
	char *want = read_all(GOLDEN "/fmt/messy.fmt", NULL);
	ck_assert_ptr_nonnull(x);
	ck_assert_ptr_nonnull(want);
	char *y = fmt_text("messy.kvp", x, len);
	ck_assert_str_eq(y, want);
	free(x);
	free(y);
	free(want);
}
END_TEST

START_TEST(test_fmt_precedence)
{
	/* parentheses only where needed, and the printed form parses back the same */
	const char *t = "policy p {\n    score = (pos - (age - 1)) * -(key_norm + 1) / (2 * 3) + "
	                "(age)\n    budget = 10\n    compress every step\n}\n";
	char *y = fmt_text("p.kvp", t, strlen(t));
	ck_assert_str_eq(y, "policy p {\n    score = (pos - (age - 1)) * -(key_norm + 1) / (2 * 3) + "
	                    "age\n    budget = 10\n    compress every step\n}\n");
	char *a = ir_shape("p.kvp", t), *b = ir_shape("p.kvp", y);
	ck_assert_str_eq(a, b);
	free(a);
	free(b);
	free(y);
}
END_TEST

/* ---- the driver --------------------------------------------------------------------- */

static int run(const char *args)
{
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>&1", kvpc_path, args);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_driver_exit_codes)
{
	if (!kvpc_path[0]) {
		fprintf(stderr, "test_driver_exit_codes: no kvpc next to the test binary; "
		                "build it (make build/kvpc) to run this test\n");
		return;
	}
	ck_assert_int_eq(run("--version"), 0);
	ck_assert_int_eq(run("--help"), 0);
	ck_assert_int_eq(run("check policies/h2o.kvp policies/snapkv.kvp"), 0);
	ck_assert_int_eq(run("check " GOLDEN "/bad/budget_zero.kvp"), 1);
	ck_assert_int_eq(run("check policies/h2o.kvp " GOLDEN "/bad/empty.kvp"), 1);
	ck_assert_int_eq(run("check tests/golden/kvp/no_such_file.kvp"), 1);
	ck_assert_int_eq(run(""), 2);
	ck_assert_int_eq(run("check"), 2);
	ck_assert_int_eq(run("frobnicate policies/h2o.kvp"), 2);
	ck_assert_int_eq(run("emit policies/h2o.kvp"), 2);
	ck_assert_int_eq(run("emit --target metal policies/h2o.kvp"), 2);
	ck_assert_int_eq(run("emit --target cuda policies/h2o.kvp -o /dev/null"), 0);
	ck_assert_int_eq(run("emit --target cuda policies/h2o.kvp policies/tova.kvp"), 2);
	ck_assert_int_eq(run("emit --target cuda-registry policies/h2o.kvp policies/tova.kvp -o /dev/null"), 0);
	ck_assert_int_eq(run("emit --target cuda " GOLDEN "/bad/budget_zero.kvp -o /dev/null"), 1);
	ck_assert_int_eq(run("emit --target c policies/h2o.kvp --bogus"), 2);
	ck_assert_int_eq(run("fmt policies/h2o.kvp"), 0);
	ck_assert_int_eq(run("fmt " GOLDEN "/bad/syn_missing_operand.kvp"), 1);
	/* emit writes nothing on errors and the output when fine */
	char out[64];
	snprintf(out, sizeof out, "/tmp/kvpc_front_%d.c", (int)getpid());
	remove(out);
	char args[256];
	snprintf(args, sizeof args, "emit --target c " GOLDEN "/bad/budget_zero.kvp -o %s", out);
	ck_assert_int_eq(run(args), 1);
	ck_assert_int_ne(access(out, F_OK), 0);
	snprintf(args, sizeof args, "emit --target c policies/tova.kvp --no-line -o %s", out);
	ck_assert_int_eq(run(args), 0);
	size_t len;
	char *c = read_all(out, &len);
	ck_assert_ptr_nonnull(c);
	ck_assert_ptr_nonnull(strstr(c, "policies/tova.kvp"));
	ck_assert_ptr_null(strstr(c, "#line"));
	free(c);
	remove(out);
	/* fmt -w rewrites a file into its canonical form */
	char *messy = read_all(GOLDEN "/fmt/messy.kvp", &len);
	char *want = read_all(GOLDEN "/fmt/messy.fmt", NULL);
	snprintf(out, sizeof out, "/tmp/kvpc_front_%d.kvp", (int)getpid());
	FILE *f = fopen(out, "wb");
	ck_assert_ptr_nonnull(f);
	fwrite(messy, 1, len, f);
	fclose(f);
	snprintf(args, sizeof args, "fmt -w %s", out);
	ck_assert_int_eq(run(args), 0);
	c = read_all(out, NULL);
	ck_assert_str_eq(c, want);
	free(c);
	free(messy);
	free(want);
	remove(out);
}
END_TEST

static Suite *front_suite(void)
{
	Suite *s = suite_create("kvpc_front");
	TCase *tc = tcase_create("golden");
	tcase_add_loop_test(tc, test_golden_bad, 0, n_bad);
	tcase_add_test(tc, test_golden_count);
	suite_add_tcase(s, tc);

	tc = tcase_create("hostile");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_one_megabyte);
	tcase_add_test(tc, test_one_megabyte_line);
	tcase_add_test(tc, test_deep_parentheses);
	tcase_add_test(tc, test_deep_unary);
	tcase_add_test(tc, test_depth_limit_boundary);
	tcase_add_test(tc, test_error_cap);
	tcase_add_test(tc, test_diags_source_order);
	tcase_add_test(tc, test_every_byte);
	tcase_add_test(tc, test_caret_tabs_utf8);
	tcase_add_test(tc, test_edit_distance);
	suite_add_tcase(s, tc);

	tc = tcase_create("lower");
	tcase_add_test(tc, test_policies_compile);
	tcase_add_test(tc, test_unused_warning);
	tcase_add_test(tc, test_lower_h2o);
	tcase_add_test(tc, test_statements_text);
	tcase_add_test(tc, test_lower_snapkv_family);
	tcase_add_test(tc, test_lower_scissorhands);
	tcase_add_test(tc, test_lower_position_rules);
	tcase_add_test(tc, test_lower_caote_gracekv);
	tcase_add_test(tc, test_lower_tiers);
	tcase_add_test(tc, test_lower_threshold);
	tcase_add_test(tc, test_c_keywords);
	tcase_add_test(tc, test_tiers_rotate);
	suite_add_tcase(s, tc);

	tc = tcase_create("fmt");
	tcase_add_test(tc, test_fmt_idempotent);
	tcase_add_test(tc, test_fmt_golden);
	tcase_add_test(tc, test_fmt_precedence);
	suite_add_tcase(s, tc);

	tc = tcase_create("driver");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_driver_exit_codes);
	suite_add_tcase(s, tc);
	return s;
}

int main(int argc, char **argv)
{
	(void)argc;
	/* argv[0] is B/tests/test_kvpc_front: the driver is B/kvpc */
	const char *slash = strrchr(argv[0], '/');
	if (slash && slash - argv[0] > 6 && !strncmp(slash - 6, "/tests", 6)) {
		snprintf(kvpc_path, sizeof kvpc_path, "%.*s/kvpc", (int)(slash - 6 - argv[0]),
		         argv[0]);
		if (access(kvpc_path, X_OK) != 0)
			kvpc_path[0] = '\0';
	}
	bad_files = list_kvp(GOLDEN "/bad", &n_bad);
	int failed = check_run(front_suite());
	free_list(bad_files, n_bad);
	return failed == 0 ? 0 : 1;
}
