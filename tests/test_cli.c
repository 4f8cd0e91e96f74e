/*
 * test_cli: what the command lines print and how they exit, for the findings of a new
 * user's trial: `run` refuses an empty prompt and `-n 0` as usage errors (exit 2, naming
 * the option) before any model work; `kvpc check` says what it checked on success; `ppl`
 * says how many tokens it scored (token 0 has no prediction, so N fed tokens score N - 1,
 * fewer with --score-from: counted by hand below); `ab`'s header and `ppl`'s policy line
 * list only the parameters in effect: under --ratio the budget is context / R, so H2O's
 * heavy share and SnapKV's capacity (read only by their budgets) are named as replaced,
 * and the guards (recent, window), which still apply, are listed.
 *
 * Commands run in a child: kvrt's through rt_cli_main (the library entry every binary
 * uses), kvpc as the program next to this test's build directory. The real model
 * ($KVRT_MODEL) is needed by the ppl, ab, chat and needle cases; without it they are skipped.
 */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/rt_cli.h"
#include "policy/rt_policy.h"
#include "model/rt_gguf.h"
#include "support/proc_run.h"
#include "support/tiny_model.h"
#include "support/check_run.h"

static char g_dir[PATH_MAX];
static char g_kvpc[PATH_MAX + 8];

#define NOMODEL "no/such/model.gguf"

/* The policies a child's rt_cli_main is given. */
typedef struct cli_reg {
	const struct kvp_policy *const *reg;
	int n;
} cli_reg;

static int cli_main(int argc, char **argv, void *user)
{
	const cli_reg *r = user;
	return rt_cli_main(argc, argv, r->reg, r->n);
}

/* Run argv in a child (60 s limit): rt_cli_main with the policies reg[0..n_reg) when exe is
 * NULL, else execv(exe) (exe is argv[0]). Its exit status; stdout and stderr in *out and
 * *err (caller frees). */
static int run(const char *exe, char **argv, const struct kvp_policy *const *reg, int n_reg,
               char **out, char **err)
{
	cli_reg r = { reg, n_reg };
	ck_assert(!exe || !strcmp(exe, argv[0]));
	int rc = exe ? proc_exec(argv, 60, out, err) : proc_call(cli_main, &r, argv, 60, out, err);
	ck_assert_msg(rc >= 0, "%s: could not be run", argv[0]);
	ck_assert_msg(rc < 128, "killed by signal %d (hung?)", rc - 128);
	return rc;
}

/* keepmap's dumps for training a KVzap-style surrogate (docs/language.md 7.13) on a tiny
 * model (9 query / 3 KV heads, 2 layers): the .npy files parse as NumPy's format 1.0 says
 * (magic, version, header length, a dict ending in a newline at a multiple of 64 bytes),
 * with the shapes [2, 3, P] and [2, P, 288] and as many float32 values; every score is an
 * attention probability (0 < s <= 1); a policy without the replay is refused for
 * --dump-scores, exit 2, before any model work. */
static unsigned char *npy_read(const char *path, const char *shape, size_t n_values)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "%s not written", path);
	unsigned char *b = malloc(64 * 1024 + n_values * 4);
	const size_t len = fread(b, 1, 64 * 1024 + n_values * 4, f);
	fclose(f);
	ck_assert(len >= 10 && !memcmp(b, "\x93NUMPY\x01\x00", 8));
	const size_t hl = (size_t)b[8] | (size_t)b[9] << 8;
	ck_assert_int_eq((10 + hl) % 64, 0);
	ck_assert_int_eq(b[10 + hl - 1], '\n');
	char *hd = strndup((const char *)b + 10, hl);
	ck_assert_msg(strstr(hd, "'descr': '<f4'") && strstr(hd, "'fortran_order': False") &&
	              strstr(hd, shape), "%s: header %s, want shape %s", path, hd, shape);
	free(hd);
	ck_assert_int_eq(len, 10 + hl + n_values * 4);
	memmove(b, b + 10 + hl, n_values * 4);
	return b;
}

START_TEST(keepmap_dumps_replay_scores_and_hidden_states)
{
	char model[PATH_MAX + 64], text[PATH_MAX + 64], sc[PATH_MAX + 64], hid[PATH_MAX + 64];
	snprintf(model, sizeof model, "%s/keepmap_dump_%d.gguf", g_dir, (int)getpid());
	snprintf(text, sizeof text, "%s/keepmap_dump_%d.txt", g_dir, (int)getpid());
	snprintf(sc, sizeof sc, "%s/keepmap_dump_%d.scores.npy", g_dir, (int)getpid());
	snprintf(hid, sizeof hid, "%s/keepmap_dump_%d.hidden.npy", g_dir, (int)getpid());
	tiny_model_cfg c = { .n_layer = 2, .n_embd = 288, .n_head = 9, .n_head_kv = 3, .n_ff = 96,
		             .n_vocab = 300, .n_ctx = 128, .rope_base = 10000.0f, .seed = 5u,
		             .wtype = RT_GGML_F32 };
	ck_assert_int_eq(tiny_model_write(&c, model), 0);
	FILE *f = fopen(text, "w");
	ck_assert_ptr_nonnull(f);
	fputs("the quick brown fox jumps over the lazy dog", f);
	fclose(f);
	char *out, *err;
	char *bad[] = { "kvrt", "keepmap", "--model", model, "--text", text, "--policy", "snapkv",
		        "--dump-scores", sc, NULL };
	ck_assert_int_eq(run(NULL, bad, kvp_registry, kvp_registry_count, &out, &err), 2);
	ck_assert_msg(strstr(err, "--dump-scores: policy snapkv reads no context replay scores"),
	              "%s", err);
	free(out), free(err);
	enum { P = 20 };
	char *ok[] = { "kvrt", "keepmap", "--model", model, "--text", text, "--ctx", "20", "--policy",
		       "kvzip", "--dump-scores", sc, "--dump-hidden", hid, "--quiet", NULL };
	ck_assert_msg(run(NULL, ok, kvp_registry, kvp_registry_count, &out, &err) == 0, "%s", err);
	free(out), free(err);
	float *s = (float *)npy_read(sc, "'shape': (2, 3, 20, )", 2 * 3 * P);
	for (int i = 0; i < 2 * 3 * P; i++)
		ck_assert_msg(s[i] > 0.0f && s[i] <= 1.0f, "score %d = %g", i, s[i]);
	float *h = (float *)npy_read(hid, "'shape': (2, 20, 288, )", 2 * P * 288);
	for (int i = 0; i < 2 * P * 288; i++)
		ck_assert(h[i] == h[i]);
	free(s), free(h);
	unlink(model), unlink(text), unlink(sc), unlink(hid);
}
END_TEST

START_TEST(run_refuses_an_empty_prompt_and_no_tokens)
{
	char *out, *err;
	char *empty[] = { "kvrt", "run", "--model", NOMODEL, "--prompt", "", NULL };
	ck_assert_int_eq(run(NULL, empty, NULL, 0, &out, &err), 2);
	ck_assert_msg(strstr(err, "--prompt: the prompt is empty") && !strstr(err, NOMODEL), "%s", err);
	free(out), free(err);
	char *none[] = { "kvrt", "run", "--model", NOMODEL, "--prompt", "Hi", "-n", "0", NULL };
	ck_assert_int_eq(run(NULL, none, NULL, 0, &out, &err), 2);
	ck_assert_msg(strstr(err, "-n: '0' is not a token count >= 1") && !strstr(err, NOMODEL),
	              "%s", err);
	free(out), free(err);
	/* the prompt one way, --prompt or --file, checked before the model */
	char *both[] = { "kvrt", "run", "--model", NOMODEL, "--prompt", "Hi", "--file", "x", NULL };
	ck_assert_int_eq(run(NULL, both, NULL, 0, &out, &err), 2);
	ck_assert_msg(strstr(err, "--prompt and --file: give the prompt one way") &&
	              !strstr(err, NOMODEL), "%s", err);
	free(out), free(err);
	char *neither[] = { "kvrt", "run", "--model", NOMODEL, NULL };
	ck_assert_int_eq(run(NULL, neither, NULL, 0, &out, &err), 2);
	ck_assert_msg(strstr(err, "--prompt TEXT or --file FILE is required"), "%s", err);
	free(out), free(err);
	/* an empty or missing prompt file is named, before the model */
	char empty_file[PATH_MAX + 64];
	snprintf(empty_file, sizeof empty_file, "%s/empty.txt", g_dir);
	FILE *f = fopen(empty_file, "w");
	ck_assert(f != NULL);
	fclose(f);
	char *ef[] = { "kvrt", "run", "--model", NOMODEL, "-f", empty_file, NULL };
	ck_assert_int_eq(run(NULL, ef, NULL, 0, &out, &err), 1);
	ck_assert_msg(strstr(err, "the prompt file is empty") && strstr(err, empty_file) &&
	              !strstr(err, NOMODEL), "%s", err);
	free(out), free(err);
	/* tune's sidecar path is checked before any measurement (it failed after the search) */
	char *tout[] = { "kvrt", "tune", "--model", NOMODEL, "--text", "README.md", "--out",
		         "/no/such/dir/x.tune", NULL };
	ck_assert_int_eq(run(NULL, tout, NULL, 0, &out, &err), 2);
	ck_assert_msg(strstr(err, "--out: /no/such/dir/x.tune: directory '/no/such/dir' does not "
	                          "exist") && !strstr(err, NOMODEL), "%s", err);
	free(out), free(err);
	/* with both good, the model is the first thing that fails (a runtime error) */
	char *good[] = { "kvrt", "run", "--model", NOMODEL, "--prompt", "Hi", "-n", "1", NULL };
	ck_assert_int_eq(run(NULL, good, NULL, 0, &out, &err), 1);
	ck_assert_msg(strstr(err, NOMODEL), "%s", err);
	free(out), free(err);
}
END_TEST

/* serve's options come from the one option table: each bad value is a usage error (exit 2)
 * naming its option and range, the default policy is checked as run checks it, and all of
 * it before the model is opened (the model path is never named). Expected texts are the
 * ranges of serve's man page. */
START_TEST(serve_checks_its_options_before_the_model)
{
	static const struct {
		const char *args[4];
		const char *want;
	} cases[] = {
		{ { "--port", "70000" }, "--port: '70000' is not a whole number in 0..65535" },
		{ { "--chunk", "5000" }, "--chunk: '5000' is not a whole number in 1..4096" },
		{ { "--prefill-chunk", "-1" }, "--prefill-chunk: '-1' is not a whole number in 0..4096" },
		{ { "--kv-memory", "lots" }, "--kv-memory: " },
		{ { "--max-seqs", "8", "--step-rows", "4" },
		  "--step-rows 4 is below --max-seqs 8 (each active sequence needs a row)" },
		{ { "--exact", "--kv-type", "f16" }, "--kv-type f16: the exact path stores f32 keys and "
		  "values (drop --exact, or --kv-type f32)" },
		{ { "--ratio", "2" }, "--ratio: policy full never compresses, so a ratio does not apply" },
		{ { "--ratio", "0.5" }, "--ratio: '0.5' is not a compression factor >= 1" },
		{ { "--policy", "nope" }, "unknown policy 'nope'" },
		{ { "--bogus" }, "unknown option '--bogus'" },
		{ { "extra" }, "unexpected argument 'extra'" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *argv[10] = { "kvrt", "serve", "--model", NOMODEL };
		int n = 4;
		for (int k = 0; k < 4 && cases[i].args[k]; k++)
			argv[n++] = (char *)cases[i].args[k];
		char *out, *err;
		ck_assert_int_eq(run(NULL, argv, NULL, 0, &out, &err), 2);
		ck_assert_msg(strstr(err, cases[i].want) && strstr(err, "Try 'kvrt serve --help'") &&
		              !strstr(err, NOMODEL), "case %zu: %s", i, err);
		free(out), free(err);
	}
	char *out, *err;
	char *none[] = { "kvrt", "serve", "--port", "0", NULL };
	ck_assert_int_eq(run(NULL, none, NULL, 0, &out, &err), 2);
	ck_assert_msg(strstr(err, "--model is required"), "%s", err);
	free(out), free(err);
	/* the fast-path commands name the other way out */
	char *runx[] = { "kvrt", "run", "--model", NOMODEL, "-p", "Hi", "--exact", "--kv-type", "f16", NULL };
	ck_assert_int_eq(run(NULL, runx, NULL, 0, &out, &err), 2);
	ck_assert_msg(strstr(err, "(give --fast, or --kv-type f32)"), "%s", err);
	free(out), free(err);
	char *help[] = { "kvrt", "serve", "--help", NULL };
	ck_assert_int_eq(run(NULL, help, NULL, 0, &out, &err), 0);
	ck_assert_msg(strstr(out, "kvrt serve - an OpenAI-compatible HTTP server") &&
	              strstr(out, "(default full)"), "%s", out);
	free(out), free(err);
	char *ver[] = { "kvrt", "serve", "--version", NULL };
	ck_assert_int_eq(run(NULL, ver, NULL, 0, &out, &err), 0);
	ck_assert_msg(!strncmp(out, "kvrt serve (kvpc runtime, commit ", 33), "%s", out);
	free(out), free(err);
}
END_TEST

START_TEST(check_says_what_it_checked)
{
	char *out, *err;
	char *ok[] = { g_kvpc, "check", "policies/h2o.kvp", "policies/tova.kvp", NULL };
	ck_assert_int_eq(run(g_kvpc, ok, NULL, 0, &out, &err), 0);
	ck_assert_str_eq(out, "policies/h2o.kvp: ok (policy h2o)\npolicies/tova.kvp: ok (policy tova)\n");
	ck_assert_str_eq(err, "");
	free(out), free(err);
	char bad[PATH_MAX + 16];
	snprintf(bad, sizeof bad, "%s/bad.kvp", g_dir);
	FILE *f = fopen(bad, "w");
	ck_assert_ptr_nonnull(f);
	fputs("policy bad {\n    budget = 0 entries\n}\n", f);
	fclose(f);
	char *mixed[] = { g_kvpc, "check", bad, "policies/h2o.kvp", NULL };
	ck_assert_int_eq(run(g_kvpc, mixed, NULL, 0, &out, &err), 1);
	ck_assert_str_eq(out, "policies/h2o.kvp: ok (policy h2o)\n"); /* nothing for bad.kvp */
	ck_assert_msg(strstr(err, "bad.kvp:2:"), "%s", err);
	free(out), free(err);
}
END_TEST

/* Every kvpc command answers --help (exit 0, its usage on stdout) and --version (exit 0,
 * the version line), and an unknown option is still a usage error (exit 2). */
START_TEST(every_kvpc_command_has_help_and_version)
{
	const char *cmds[] = { "check", "emit", "fmt", "build", "ab", "tune" };
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		char *out, *err, want[64];
		char *help[] = { g_kvpc, (char *)cmds[i], "--help", NULL };
		ck_assert_int_eq(run(g_kvpc, help, NULL, 0, &out, &err), 0);
		snprintf(want, sizeof want, "kvpc %s", cmds[i]);
		ck_assert_msg(strstr(out, want) || strstr(err, want), "%s --help: %s%s", cmds[i], out, err);
		ck_assert_msg(!strstr(err, "unknown option"), "%s --help: %s", cmds[i], err);
		free(out), free(err);
		char *ver[] = { g_kvpc, (char *)cmds[i], "--version", NULL };
		ck_assert_int_eq(run(g_kvpc, ver, NULL, 0, &out, &err), 0);
		ck_assert_msg(!strncmp(out, "kvpc ", 5), "%s --version: %s", cmds[i], out);
		free(out), free(err);
	}
	char *out, *err;
	char *bogus[] = { g_kvpc, "check", "--bogus", "policies/h2o.kvp", NULL };
	ck_assert_int_eq(run(g_kvpc, bogus, NULL, 0, &out, &err), 2);
	ck_assert_msg(strstr(err, "check: unknown option"), "%s", err);
	free(out), free(err);
}
END_TEST

START_TEST(ppl_counts_the_scored_tokens)
{
	const char *model = getenv("KVRT_MODEL");
	if (!model || access(model, R_OK) != 0) {
		printf("test_cli: KVRT_MODEL unset or unreadable: ppl case skipped\n");
		return;
	}
	char *out, *err;
	char *argv[] = { "kvrt", "ppl", "--model", (char *)model, "--text", "README.md", "--ctx", "16",
		         "--no-ref", "--fast", "--threads", "1", "--quiet", NULL };
	ck_assert_int_eq(run(NULL, argv, NULL, 0, &out, &err), 0);
	ck_assert_msg(strstr(out, "tokens; the first 16 fed, 15 of them scored)\n"), "%s", out);
	free(out), free(err);
	/* --score-from 5: positions 5..15 are scored, 11 tokens */
	char *from[] = { "kvrt", "ppl", "--model", (char *)model, "--text", "README.md", "--ctx", "16",
		         "--no-ref", "--fast", "--threads", "1", "--quiet", "--score-from", "5", NULL };
	ck_assert_int_eq(run(NULL, from, NULL, 0, &out, &err), 0);
	ck_assert_msg(strstr(out, "tokens; the first 16 fed, 11 of them scored)\n"), "%s", out);
	free(out), free(err);
	/* a prompt-end policy whose window (40 tokens) outgrows a 24-token prompt compresses to
	 * nothing: the warning names the guards as what raised its budget, not its floor */
	char *win[] = { "kvrt", "ppl", "--model", (char *)model, "--text", "README.md", "--ctx", "48",
		        "--policy", "snapkv_tiers_k15", "--set", "window=40", "--prompt", "24",
		        "--no-ref", "--fast", "--threads", "1", "--quiet", NULL };
	ck_assert_int_eq(run(NULL, win, kvp_registry, kvp_registry_count, &out, &err), 0);
	ck_assert_msg(strstr(err, "(its budget, raised to hold its guards, keeps every entry of the "
	                          "24-token prompt"), "%s", err);
	free(out), free(err);
}
END_TEST

START_TEST(reports_list_the_parameters_in_effect)
{
	const char *model = getenv("KVRT_MODEL");
	if (!model || access(model, R_OK) != 0) {
		printf("test_cli: KVRT_MODEL unset or unreadable: ab case skipped\n");
		return;
	}
	char *out, *err;
	/* ab runs the exact path (f32 weights): minutes under the sanitizers, so that pass
	 * checks ppl's line only */
	const int ab_too = !getenv("KVRT_SANITIZED");
	if (!ab_too)
		printf("test_cli: KVRT_SANITIZED: the ab header case is left to the plain pass\n");
	/* snapkv is measured after a prompt of half the 64 tokens: 32 / 2 = 16 entries hold a
	 * window of 16 */
	char *ab[] = { "kvrt", "ab", "--model", (char *)model, "--text", "README.md", "--a", "h2o",
		       "--b", "snapkv", "--ratio", "2", "--ctx", "64", "--chunk", "64", "--resamples",
		       "10", "--threads", "1", "--quiet", "--set-b", "window=16", NULL };
	if (ab_too) {
		ck_assert_int_eq(run(NULL, ab, kvp_registry, kvp_registry_count, &out, &err), 0);
		ck_assert_msg(strstr(out, "\n  A: recent=10%; budget = context / ratio, replacing the "
		                          "policy's (heavy has no effect)\n"), "%s", out);
		ck_assert_msg(strstr(out, "\n  B: window=16; budget = context / ratio, replacing the "
		                          "policy's (capacity has no effect)\n"), "%s", out);
		free(out), free(err);
	}
	/* without a ratio every parameter is in force */
	char *ppl[] = { "kvrt", "ppl", "--model", (char *)model, "--text", "README.md", "--ctx", "16",
		        "--policy", "h2o", "--no-ref", "--fast", "--threads", "1", "--quiet", NULL };
	ck_assert_int_eq(run(NULL, ppl, kvp_registry, kvp_registry_count, &out, &err), 0);
	ck_assert_msg(strstr(out, "\npolicy           h2o heavy=10% recent=10%\n"), "%s", out);
	free(out), free(err);
	char *pplr[] = { "kvrt", "ppl", "--model", (char *)model, "--text", "README.md", "--ctx", "16",
		         "--policy", "h2o", "--ratio", "4", "--no-ref", "--fast", "--threads", "1",
		         "--quiet", NULL };
	ck_assert_int_eq(run(NULL, pplr, kvp_registry, kvp_registry_count, &out, &err), 0);
	ck_assert_msg(strstr(out, "\npolicy           h2o recent=10% ratio=4\n"), "%s", out);
	free(out), free(err);
}
END_TEST

/* A short chat under the library H2O (20% of the context, `budget = ... min 64 tokens`)
 * answers as the full cache does, greedy, also under a ratio override that would leave
 * 5 entries of the 42-token prompt: the policy's own floor keeps it whole (run's runtime
 * floor is off, --min-kv 0), and --stats says the floor raised the budget. Without the
 * floor this question got "I'm glad to help. I'm here to assist you". */
START_TEST(short_chat_under_h2o_answers_as_full)
{
	const char *model = getenv("KVRT_MODEL");
	if (!model || access(model, R_OK) != 0) {
		printf("test_cli: KVRT_MODEL unset or unreadable: chat case skipped\n");
		return;
	}
	char *q = "What is the capital of France? Answer in one word.";
	char *full_out, *out, *err;
	char *full[] = { "kvrt", "run", "--model", (char *)model, "--chat", "-p", q, "-n", "12",
		         "--threads", "2", NULL };
	ck_assert_int_eq(run(NULL, full, kvp_registry, kvp_registry_count, &full_out, &err), 0);
	ck_assert_msg(strstr(full_out, "Paris"), "full cache: %s", full_out);
	free(err);
	/* the same question read from a file (--file) is the same prompt */
	char qfile[PATH_MAX + 64];
	snprintf(qfile, sizeof qfile, "%s/question.txt", g_dir);
	FILE *f = fopen(qfile, "w");
	ck_assert(f && fputs(q, f) >= 0 && fclose(f) == 0);
	char *ff[] = { "kvrt", "run", "--model", (char *)model, "--chat", "--file", qfile, "-n",
		       "12", "--threads", "2", NULL };
	ck_assert_int_eq(run(NULL, ff, kvp_registry, kvp_registry_count, &out, &err), 0);
	ck_assert_msg(!strcmp(out, full_out), "--file: '%s', -p: '%s'", out, full_out);
	free(out), free(err);
	const char *ratio[] = { NULL, "8" };
	for (int i = 0; i < 2; i++) {
		char *h2o[] = { "kvrt", "run", "--model", (char *)model, "--chat", "-p", q, "-n", "12",
			        "--threads", "2", "--policy", "h2o", "--min-kv", "0", "--stats",
			        ratio[i] ? "--ratio" : NULL, (char *)ratio[i], NULL };
		ck_assert_int_eq(run(NULL, h2o, kvp_registry, kvp_registry_count, &out, &err), 0);
		ck_assert_msg(!strcmp(out, full_out), "h2o%s%s: '%s', full: '%s'",
		              ratio[i] ? " --ratio " : "", ratio[i] ? ratio[i] : "", out, full_out);
		ck_assert_msg(strstr(err, "note: the floor (min_kv, or the policy's budget min) raised the budget"),
		              "%s", err);
		free(out), free(err);
	}
	free(full_out);
}
END_TEST

/* `run --chat --system` marks the system message as the span `system`: at --ratio 4 with no
 * floor, GraceKV (`keep span system`) keeps every one of its entries in every head, TOVA
 * (no span) keeps fewer; --stats reports "span `system`, N tokens at A..B, K kept by every
 * full-attention head". */
static long long span_kept(const char *err, long long *n)
{
	const char *p = strstr(err, "system message: span `system`, ");
	long long a, b, k;
	ck_assert_msg(p && sscanf(p, "system message: span `system`, %lld tokens at %lld..%lld, "
	                             "%lld kept", n, &a, &b, &k) == 4, "%s", err);
	ck_assert_int_eq(b - a + 1, *n);
	return k;
}

START_TEST(run_marks_the_system_message)
{
	const char *model = getenv("KVRT_MODEL");
	if (!model || access(model, R_OK) != 0) {
		printf("test_cli: KVRT_MODEL unset or unreadable: system span case skipped\n");
		return;
	}
	const char *pol[] = { "gracekv", "tova" };
	long long n[2], kept[2];
	for (int i = 0; i < 2; i++) {
		char *out, *err;
		char *a[] = { "kvrt", "run", "--model", (char *)model, "--chat", "--system",
			      "The secret code is 7731. Never forget it.", "-p", "What is the secret code?",
			      "-n", "4", "--threads", "2", "--policy", (char *)pol[i], "--ratio", "4",
			      "--min-kv", "0", "--stats", NULL };
		ck_assert_msg(run(NULL, a, kvp_registry, kvp_registry_count, &out, &err) == 0, "%s: %s",
		              pol[i], err);
		kept[i] = span_kept(err, &n[i]);
		free(out), free(err);
	}
	ck_assert_int_eq(n[0], n[1]);
	ck_assert_int_ge(n[0], 10); /* the message's text and its turn's markers */
	ck_assert_int_eq(kept[0], n[0]);
	ck_assert_int_lt(kept[1], n[1]);
}
END_TEST

/* needle's instruct task runs the full cache beside the policy; with --mark-question every
 * sequence, that reference too, marks the question as a span (it aborted on an internal
 * assertion when the reference had no span names): under a policy without spans and one
 * keeping them (which cuts the feed at the system message, test_needle checks the marks)
 * the run reaches its report, exit 0. */
START_TEST(needle_instruct_marks_spans_on_every_sequence)
{
	const char *model = getenv("KVRT_MODEL");
	if (!model || access(model, R_OK) != 0) {
		printf("test_cli: KVRT_MODEL unset or unreadable: needle case skipped\n");
		return;
	}
	const char *pol[] = { "tova", "gracekv" };
	for (int i = 0; i < 2; i++) {
		char *out, *err;
		char *a[] = { "kvrt", "needle", "--model", (char *)model, "--task", "instruct",
			      "--mark-question", "--lengths", "160", "--depths", "0", "--policy",
			      (char *)pol[i], "--ratio", "2", "--gen", "4", "--threads", "2", "--json",
			      "--quiet", NULL };
		ck_assert_msg(run(NULL, a, kvp_registry, kvp_registry_count, &out, &err) == 0,
		              "%s: %s", pol[i], err);
		ck_assert_msg(strstr(out, "\"followed_ref\"") && strstr(out, "\"accuracy\""), "%s: %s",
		              pol[i], out);
		free(out), free(err);
	}
}
END_TEST

static Suite *cli_suite(void)
{
	Suite *s = suite_create("cli");
	TCase *tc = tcase_create("cli");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, run_refuses_an_empty_prompt_and_no_tokens);
	tcase_add_test(tc, keepmap_dumps_replay_scores_and_hidden_states);
	tcase_add_test(tc, serve_checks_its_options_before_the_model);
	tcase_add_test(tc, check_says_what_it_checked);
	tcase_add_test(tc, every_kvpc_command_has_help_and_version);
	tcase_add_test(tc, ppl_counts_the_scored_tokens);
	tcase_add_test(tc, reports_list_the_parameters_in_effect);
	tcase_add_test(tc, short_chat_under_h2o_answers_as_full);
	tcase_add_test(tc, run_marks_the_system_message);
	tcase_add_test(tc, needle_instruct_marks_spans_on_every_sequence);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	snprintf(g_dir, sizeof g_dir, "/tmp/test_cli_XXXXXX");
	if (!mkdtemp(g_dir))
		return EXIT_FAILURE;
	if (proc_bin_path("kvpc", NULL, g_kvpc, sizeof g_kvpc) != 0)
		return EXIT_FAILURE;
	int failed = check_run(cli_suite());
	char cmd[PATH_MAX + 16];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
	if (system(cmd) != 0)
		failed++;
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
