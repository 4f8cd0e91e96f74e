/*
 * test_build: `kvpc build` end to end — the compiler driver emits, compiles and links two
 * real policies (policies/streaming_llm.kvp, policies/h2o.kvp) into a per-deployment
 * binary in a temporary directory, whose `info` command must list both with their
 * parameters and defaults; a second build of unchanged inputs must be a cache hit (the
 * compiler does not run: the message says so and neither the cached nor the output
 * binary changes); editing a policy must rebuild; bad inputs (a missing file, a syntax
 * error, an unwritable output) must give a clear one-line error and exit 1. Also checks
 * the SHA-256 of runtime/eval/rt_ab.h (used by the cache key and the A/B metadata) against
 * FIPS 180-4 test vectors and coreutils' sha256sum.
 *
 * The kvpc under test is $KVPC, else the kvpc next to this test's build directory
 * (build/tests/test_build -> build/kvpc). The build cache goes to a temporary directory
 * (KVPC_CACHE), so runs never share state.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/rt_sha256.h"
#include "eval/rt_ab.h"
#include "support/proc_run.h"
#include "support/check_run.h"

static char g_kvpc[PATH_MAX + 16];
static char g_tmp[PATH_MAX];

/* Run argv (argv[0] a path) with stdout and stderr captured (heap strings, caller frees;
 * killed after 300 s, the suite's time limit). Returns the exit status (128 + signal when
 * killed). */
static int run(char *const argv[], char **out, char **err)
{
	int rc = proc_exec(argv, 300, out, err);
	ck_assert_msg(rc >= 0, "%s: could not be run", argv[0]);
	return rc;
}

static void path_in_tmp(char *buf, size_t cap, const char *name)
{
	snprintf(buf, cap, "%s/%s", g_tmp, name);
}

static struct timespec mtime_of(const char *p)
{
	struct stat st;
	ck_assert_msg(stat(p, &st) == 0, "%s: %s", p, strerror(errno));
	return st.st_mtim;
}

static int same_time(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

/* Build files into out; returns the exit status, *err the stderr text (caller frees). */
static int build(const char *const *files, int n, const char *out, char **err)
{
	char *argv[16];
	int k = 0;
	argv[k++] = g_kvpc;
	argv[k++] = "build";
	for (int i = 0; i < n; i++)
		argv[k++] = (char *)files[i];
	argv[k++] = "-o";
	argv[k++] = (char *)out;
	argv[k] = NULL;
	char *o;
	int rc = run(argv, &o, err);
	free(o);
	return rc;
}

/* The cached binary of the last build (the only KEY/bin under the cache). */
static void cached_bin(char *buf, size_t cap, const char *not_this)
{
	char cmd[PATH_MAX + 64];
	snprintf(cmd, sizeof cmd, "ls -t %s/cache/*/bin", g_tmp);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	buf[0] = 0;
	char line[PATH_MAX];
	while (fgets(line, sizeof line, p)) {
		line[strcspn(line, "\n")] = 0;
		if (!not_this || strcmp(line, not_this) != 0) {
			snprintf(buf, cap, "%s", line);
			break;
		}
	}
	pclose(p);
	ck_assert_msg(buf[0], "no cached binary under %s/cache", g_tmp);
}

START_TEST(build_info_lists_policies_and_cache_hits)
{
	const char *files[] = { "policies/streaming_llm.kvp", "policies/h2o.kvp" };
	char bin[PATH_MAX + 16], cbin[PATH_MAX];
	path_in_tmp(bin, sizeof bin, "kv-ab");
	char *err;
	int rc = build(files, 2, bin, &err);
	ck_assert_msg(rc == 0, "kvpc build failed (%d): %s", rc, err);
	ck_assert_msg(strstr(err, "compiled 2 policies"), "first build message: %s", err);
	free(err);
	ck_assert_int_eq(access(bin, X_OK), 0);

	char *argv[] = { bin, "info", NULL };
	char *out;
	rc = run(argv, &out, &err);
	ck_assert_msg(rc == 0, "BIN info failed (%d): %s", rc, err);
	/* both policies with their parameters and defaults (streaming_llm: sinks 4, recent
	 * 2000 tokens; h2o: heavy and recent 10%) */
	const char *want[] = { "streaming_llm", "sinks", "recent", "2000", "h2o", "heavy", NULL };
	for (int i = 0; want[i]; i++)
		ck_assert_msg(strstr(out, want[i]), "BIN info lacks '%s':\n%s", want[i], out);
	ck_assert_msg(strstr(out, "0.1") || strstr(out, "10%"), "h2o default 0.1 missing:\n%s", out);
	ck_assert_msg(strstr(out, "streaming_llm") < strstr(out, "h2o"),
	              "policies not in command-line order:\n%s", out);
	/* h2o's statements as its source writes them, comments dropped, params not repeated */
	ck_assert_msg(strstr(out, "    statements:\n        budget = heavy + recent min 64 tokens\n"
	                          "        stat acc = sum(attn) over all\n        score = acc\n") &&
	              !strstr(out, "        param heavy") && !strstr(out, "accumulated attention"),
	              "h2o's statements:\n%s", out);
	free(out);
	free(err);

	/* second build: a cache hit, nothing recompiled or rewritten */
	cached_bin(cbin, sizeof cbin, NULL);
	struct timespec t_out = mtime_of(bin), t_cache = mtime_of(cbin);
	rc = build(files, 2, bin, &err);
	ck_assert_msg(rc == 0, "second build failed: %s", err);
	ck_assert_msg(strstr(err, "up to date (cached)"), "second build was not a cache hit: %s",
	              err);
	ck_assert_msg(!strstr(err, "compiled"), "second build recompiled: %s", err);
	free(err);
	ck_assert(same_time(t_out, mtime_of(bin)));
	ck_assert(same_time(t_cache, mtime_of(cbin)));

	/* a new output path is filled from the cache, still without compiling */
	char bin2[PATH_MAX + 16];
	path_in_tmp(bin2, sizeof bin2, "kv-ab-copy");
	rc = build(files, 2, bin2, &err);
	ck_assert_msg(rc == 0 && strstr(err, "cached") && !strstr(err, "compiled"), "%s", err);
	free(err);
	ck_assert(same_time(t_cache, mtime_of(cbin)));
	ck_assert_int_eq(access(bin2, X_OK), 0);
}
END_TEST

START_TEST(changed_policy_rebuilds)
{
	/* a copy of streaming_llm with another default */
	rt_err e;
	size_t n;
	char *src = rt_read_file("policies/streaming_llm.kvp", &n, &e);
	ck_assert_ptr_nonnull(src);
	char *at = strstr(src, "recent = 2000");
	ck_assert_ptr_nonnull(at);
	char kvp[PATH_MAX + 16], bin[PATH_MAX + 16];
	path_in_tmp(kvp, sizeof kvp, "mine.kvp");
	path_in_tmp(bin, sizeof bin, "kv-mine");
	write_text(kvp, src);
	const char *files[] = { kvp };
	char *err;
	int rc = build(files, 1, bin, &err);
	ck_assert_msg(rc == 0 && strstr(err, "compiled 1 policy"), "%s", err);
	free(err);
	rc = build(files, 1, bin, &err);
	ck_assert_msg(rc == 0 && strstr(err, "up to date"), "%s", err);
	free(err);

	memcpy(at, "recent = 1234", 13);
	write_text(kvp, src);
	free(src);
	rc = build(files, 1, bin, &err);
	ck_assert_msg(rc == 0 && strstr(err, "compiled 1 policy"), "edit not rebuilt: %s", err);
	free(err);
	char *argv[] = { bin, "info", NULL };
	char *out;
	rc = run(argv, &out, &err);
	ck_assert_msg(rc == 0 && strstr(out, "1234") && !strstr(out, "2000"),
	              "rebuilt binary does not hold the edit:\n%s%s", out, err);
	free(out);
	free(err);
}
END_TEST

START_TEST(missing_file_is_an_error)
{
	char bin[PATH_MAX + 16];
	path_in_tmp(bin, sizeof bin, "kv-missing");
	const char *files[] = { "policies/h2o.kvp", "no/such/policy.kvp" };
	char *err;
	int rc = build(files, 2, bin, &err);
	ck_assert_int_eq(rc, 1);
	ck_assert_msg(strstr(err, "no/such/policy.kvp") && strstr(err, "error"), "%s", err);
	ck_assert_int_ne(access(bin, F_OK), 0);
	free(err);
}
END_TEST

/* Two different policies of one name in one build are an error naming both files (they
 * were silently registered as NAME and NAME~2); the same file twice is built once. */
START_TEST(duplicate_policy_name_is_an_error)
{
	char kvp[PATH_MAX + 16], bin[PATH_MAX + 16];
	path_in_tmp(kvp, sizeof kvp, "h2o_copy.kvp");
	path_in_tmp(bin, sizeof bin, "kv-dup");
	write_text(kvp, "policy h2o {\n    budget = 64\n    score = pos\n    compress every step\n}\n");
	const char *files[] = { "policies/h2o.kvp", kvp };
	char *err;
	int rc = build(files, 2, bin, &err);
	ck_assert_int_eq(rc, 1);
	char want[2 * PATH_MAX + 128];
	snprintf(want, sizeof want, "%s: error: policy 'h2o' is already defined by policies/h2o.kvp",
	         kvp);
	ck_assert_msg(strstr(err, want) != NULL, "%s", err);
	ck_assert_int_ne(access(bin, F_OK), 0);
	free(err);
}
END_TEST

START_TEST(syntax_error_is_located)
{
	char kvp[PATH_MAX + 16], bin[PATH_MAX + 16];
	path_in_tmp(kvp, sizeof kvp, "bad.kvp");
	path_in_tmp(bin, sizeof bin, "kv-bad");
	write_text(kvp, "policy bad {\n    budget = = 3\n}\n");
	const char *files[] = { kvp };
	char *err;
	int rc = build(files, 1, bin, &err);
	ck_assert_int_eq(rc, 1);
	/* "PATH:2:COL: error: ..." then the source line */
	char want[PATH_MAX + 32];
	snprintf(want, sizeof want, "%s:2:", kvp);
	ck_assert_msg(strstr(err, want) && strstr(err, "error"), "not located: %s", err);
	ck_assert_msg(strstr(err, "budget = = 3"), "no source line shown: %s", err);
	ck_assert_int_ne(access(bin, F_OK), 0);
	free(err);
}
END_TEST

START_TEST(unwritable_output_is_an_error)
{
	char file[PATH_MAX + 16], bin[PATH_MAX + 32];
	path_in_tmp(file, sizeof file, "plainfile");
	write_text(file, "x\n");
	const char *files[] = { "policies/h2o.kvp" };
	const char *outs[3];
	snprintf(bin, sizeof bin, "%s/sub/bin", file); /* a directory that is a file */
	outs[0] = bin;
	outs[1] = "/nonexistent-kvpc-dir/bin";
	outs[2] = g_tmp; /* a directory */
	for (int i = 0; i < 3; i++) {
		char *err;
		int rc = build(files, 1, outs[i], &err);
		ck_assert_int_eq(rc, 1);
		ck_assert_msg(strstr(err, outs[i]) && strstr(err, "cannot write"), "%s: %s", outs[i],
		              err);
		/* one line */
		ck_assert_msg(strchr(err, '\n') == err + strlen(err) - 1, "not one line: %s", err);
		free(err);
	}
}
END_TEST

START_TEST(usage_errors)
{
	char *err, *out;
	char *a1[] = { g_kvpc, "build", "policies/h2o.kvp", NULL }; /* no -o */
	ck_assert_int_eq(run(a1, &out, &err), 2);
	ck_assert_msg(strstr(err, "-o"), "%s", err);
	free(out);
	free(err);
	char *a2[] = { g_kvpc, "build", "--frobnicate", "policies/h2o.kvp", "-o", "x", NULL };
	ck_assert_int_eq(run(a2, &out, &err), 2);
	ck_assert_msg(strstr(err, "--frobnicate"), "%s", err);
	free(out);
	free(err);
	/* --threads is --gate's, a count of 1 or more */
	char *a4[] = { g_kvpc, "build", "policies/h2o.kvp", "-o", "x", "--threads", "1", NULL };
	ck_assert_int_eq(run(a4, &out, &err), 2);
	ck_assert_msg(strstr(err, "--threads sets the threads of --gate's runs"), "%s", err);
	free(out);
	free(err);
	char *a5[] = { g_kvpc, "build", "policies/h2o.kvp", "-o", "x", "--gate", "--threads", "0", NULL };
	ck_assert_int_eq(run(a5, &out, &err), 2);
	ck_assert_msg(strstr(err, "--threads needs a thread count 1..256 (got '0')"), "%s", err);
	free(out);
	free(err);
	char *a3[] = { g_kvpc, "ab", "policies/h2o.kvp", NULL }; /* one policy */
	ck_assert_int_eq(run(a3, &out, &err), 2);
	free(out);
	free(err);
}
END_TEST

/* FIPS 180-4 / NIST example vectors, a streamed update in odd pieces, and coreutils'
 * sha256sum on a file as an independent implementation. */
START_TEST(sha256_vectors)
{
	static const struct {
		const char *in, *hex;
	} v[] = {
		{ "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
		{ "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
		{ "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
		  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
	};
	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		rt_sha256 c;
		char hex[65];
		rt_sha256_init(&c);
		rt_sha256_update(&c, v[i].in, strlen(v[i].in));
		rt_sha256_hex(&c, hex);
		ck_assert_str_eq(hex, v[i].hex);
	}
	/* one million 'a' in pieces of 1..127 bytes */
	static char buf[128];
	memset(buf, 'a', sizeof buf);
	rt_sha256 c;
	rt_sha256_init(&c);
	size_t left = 1000000, step = 1;
	while (left) {
		size_t k = step < left ? step : left;
		rt_sha256_update(&c, buf, k);
		left -= k;
		step = step % 127 + 1;
	}
	char hex[65];
	rt_sha256_hex(&c, hex);
	ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");

	rt_err e;
	ck_assert_int_eq(rt_sha256_file("policies/h2o.kvp", hex, &e), 0);
	FILE *p = popen("sha256sum policies/h2o.kvp", "r");
	ck_assert_ptr_nonnull(p);
	char line[256] = "";
	ck_assert_ptr_nonnull(fgets(line, sizeof line, p));
	pclose(p);
	ck_assert_int_eq(strncmp(line, hex, 64), 0);
	ck_assert_int_eq(rt_sha256_file("no/such/file", hex, &e), -1);
	ck_assert_msg(strstr(e.msg, "no/such/file"), "%s", e.msg);
}
END_TEST

static Suite *build_suite(void)
{
	Suite *s = suite_create("build");
	TCase *tc = tcase_create("build");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, sha256_vectors);
	tcase_add_test(tc, build_info_lists_policies_and_cache_hits);
	tcase_add_test(tc, changed_policy_rebuilds);
	tcase_add_test(tc, missing_file_is_an_error);
	tcase_add_test(tc, syntax_error_is_located);
	tcase_add_test(tc, duplicate_policy_name_is_an_error);
	tcase_add_test(tc, unwritable_output_is_an_error);
	tcase_add_test(tc, usage_errors);
	suite_add_tcase(s, tc);
	return s;
}

int main(int argc, char **argv)
{
	(void)argc;
	/* build/tests/test_build -> build/kvpc */
	if (proc_bin_path("kvpc", "KVPC", g_kvpc, sizeof g_kvpc) != 0) {
		fprintf(stderr, "test_build: cannot locate %s\n", argv[0]);
		return EXIT_FAILURE;
	}
	if (access(g_kvpc, X_OK) != 0) {
		fprintf(stderr, "test_build: %s: not found (build it first, or set KVPC)\n", g_kvpc);
		return EXIT_FAILURE;
	}
	snprintf(g_tmp, sizeof g_tmp, "/tmp/kvpc_test_build_XXXXXX");
	if (!mkdtemp(g_tmp)) {
		perror("mkdtemp");
		return EXIT_FAILURE;
	}
	char cache[PATH_MAX + 16];
	snprintf(cache, sizeof cache, "%s/cache", g_tmp);
	setenv("KVPC_CACHE", cache, 1);
	int failed = check_run(build_suite());
	char cmd[PATH_MAX + 16];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
	if (!failed && system(cmd) != 0)
		fprintf(stderr, "test_build: could not remove %s\n", g_tmp);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
