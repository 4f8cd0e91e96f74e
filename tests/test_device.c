/*
 * test_device: the command line's --device option (runtime/cli/rt_cli_cuda.h) in a binary
 * built without CUDA (B/kvrt): `--device cuda` fails with exit status 1 and one line
 * naming why (no CUDA in this binary), an unknown device or a missing value is a usage
 * error (2), `--device cpu` is the ordinary CPU path. --device is a row of the one option
 * table, so ppl and bench on either device refuse bad options and a bad --text with the
 * same line and status (compared here, --device cuda against --device cpu), before any
 * device is looked for; commands that do not run on a device refuse the option. The
 * CUDA-enabled binary's answer on a machine without a GPU is checked by `make cuda`; the
 * engine's use of the device interface by test_seq (device_interface_equals_cpu).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/check_run.h"

static char kvrt_path[1024];

/* Run kvrt with args; stderr (first line) into err. Returns the exit status. */
static int run(const char *args, char *err, size_t cap)
{
	char cmd[2048], tmp[64];
	snprintf(tmp, sizeof tmp, "/tmp/test_device_%d.err", (int)getpid());
	snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", kvrt_path, args, tmp);
	int st = system(cmd);
	err[0] = 0;
	FILE *f = fopen(tmp, "r");
	if (f) {
		if (!fgets(err, (int)cap, f))
			err[0] = 0;
		fclose(f);
	}
	remove(tmp);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_device_cuda_without_backend)
{
	if (!kvrt_path[0])
		return;
	char err[1024];
	ck_assert_int_eq(run("ppl --device cuda --model models/none.gguf --text README.md", err, sizeof err), 1);
	ck_assert_msg(strstr(err, "--device cuda") && strstr(err, "built without CUDA"), "stderr: %s", err);
	ck_assert_int_eq(run("bench --device=cuda --model models/none.gguf", err, sizeof err), 1);
	ck_assert_msg(strstr(err, "built without CUDA"), "stderr: %s", err);
}
END_TEST

START_TEST(test_device_usage)
{
	if (!kvrt_path[0])
		return;
	char err[1024];
	ck_assert_int_eq(run("ppl --device tpu --model m --text t", err, sizeof err), 2);
	ck_assert_msg(strstr(err, "'tpu' is not cpu or cuda"), "stderr: %s", err);
	ck_assert_int_eq(run("ppl --model m --text t --device", err, sizeof err), 2);
	ck_assert_msg(strstr(err, "option '--device' needs a value"), "stderr: %s", err);
	ck_assert_int_eq(run("run --device cuda --model m -p hi", err, sizeof err), 2);
	ck_assert_msg(strstr(err, "unknown option '--device'"), "stderr: %s", err);
	/* the device's own options: --f16 only on the GPU, --fast and narrow stores never */
	ck_assert_int_eq(run("ppl --f16 --model models/none.gguf --text README.md", err, sizeof err), 2);
	ck_assert_msg(strstr(err, "--f16: f16 weights are the GPU's"), "stderr: %s", err);
	ck_assert_int_eq(run("ppl --device cuda --fast --model models/none.gguf --text README.md", err,
	                     sizeof err), 2);
	ck_assert_msg(strstr(err, "--fast: the GPU takes the exact path's f32 weights"), "stderr: %s", err);
	/* --device cpu is the CPU path: its own error for the missing model file */
	ck_assert_int_eq(run("ppl --device cpu --model models/none.gguf --text README.md", err, sizeof err), 1);
	ck_assert_msg(strstr(err, "none.gguf"), "stderr: %s", err);
}
END_TEST

/* The same refusal, line for line and status, from both devices. */
static void same_refusal(const char *args, int want)
{
	char a[1024], b[1024], cmd[1024];
	snprintf(cmd, sizeof cmd, "%s --device cpu", args);
	ck_assert_int_eq(run(cmd, a, sizeof a), want);
	snprintf(cmd, sizeof cmd, "%s --device cuda", args);
	ck_assert_int_eq(run(cmd, b, sizeof b), want);
	ck_assert_msg(a[0] && !strcmp(a, b), "%s: cpu says '%s', cuda says '%s'", args, a, b);
}

START_TEST(test_device_same_refusals)
{
	if (!kvrt_path[0])
		return;
	char bad[64], err[1024];
	snprintf(bad, sizeof bad, "/tmp/test_device_%d.txt", (int)getpid());
	FILE *f = fopen(bad, "wb");
	ck_assert_ptr_nonnull(f);
	fputs("caf\xe9 latin-1\n", f); /* not UTF-8 */
	fclose(f);
	char args[256];
	snprintf(args, sizeof args, "ppl --model models/none.gguf --text %s", bad);
	same_refusal(args, 1);
	same_refusal("ppl --model models/none.gguf --text /dev/zero", 1);
	same_refusal("ppl --model models/none.gguf --text README.md --ratio 0.5", 2);
	same_refusal("ppl --model models/none.gguf --text README.md --byte-ratio x", 2);
	same_refusal("ppl --model models/none.gguf --text README.md --policy nosuch", 2);
	same_refusal("ppl --model models/none.gguf --text README.md --chunk 0", 2);
	same_refusal("bench --model models/none.gguf --ratio 2", 2);
	remove(bad);
	ck_assert_int_eq(run("ppl --model models/none.gguf --text /dev/zero --device cuda", err, sizeof err), 1);
	ck_assert_msg(strstr(err, "not a regular file"), "stderr: %s", err);
}
END_TEST

int main(int argc, char **argv)
{
	(void)argc;
	/* argv[0] is B/tests/test_device: the binary is B/kvrt */
	const char *slash = strrchr(argv[0], '/');
	if (slash && slash - argv[0] > 6 && !strncmp(slash - 6, "/tests", 6)) {
		snprintf(kvrt_path, sizeof kvrt_path, "%.*s/kvrt", (int)(slash - 6 - argv[0]), argv[0]);
		if (access(kvrt_path, X_OK) != 0)
			kvrt_path[0] = '\0';
	}
	if (!kvrt_path[0])
		fprintf(stderr, "test_device: no kvrt next to the test binary; build it (make build/kvrt)\n");
	Suite *s = suite_create("device");
	TCase *tc = tcase_create("device");
	tcase_add_test(tc, test_device_cuda_without_backend);
	tcase_add_test(tc, test_device_usage);
	tcase_add_test(tc, test_device_same_refusals);
	suite_add_tcase(s, tc);
	int nf = check_run(s);
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
