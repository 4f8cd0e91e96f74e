/*
 * test_text: the text/haystack loader (runtime/base/rt_text.c), the output-path check
 * (runtime/base/rt_outpath.c), that the command line uses both before any model work, and
 * that the policy source reader (compiler/kvp_src.c) refuses non-files the same way.
 * Every command below names a model that does not exist, so the input or output error
 * can only be seen if it is checked first. Expected messages and offsets are worked out
 * by hand from the bytes written; gzip data comes from the gzip program (an independent
 * encoder), except where zlib must build a shape gzip cannot (a bomb, a truncation).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/rt_numparse.h"
#include "base/rt_outpath.h"
#include "base/rt_text.h"
#include "cli/rt_cli.h"
#include "kvp_src.h"
#include "support/proc_run.h"
#include "support/check_run.h"

static char g_dir[PATH_MAX];

static const char *tmp_path(const char *name)
{
	static char p[4][PATH_MAX + 64];
	static int k;
	k = (k + 1) % 4;
	snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
	return p[k];
}

static const char *write_file(const char *name, const void *data, size_t n)
{
	const char *p = tmp_path(name);
	FILE *f = fopen(p, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, n, f), n);
	fclose(f);
	return p;
}

/* rt_text_read must fail with exactly want (want has "%s" for the path). */
static void expect_refused(const char *path, const char *want_fmt)
{
	char want[PATH_MAX + 256];
	snprintf(want, sizeof want, want_fmt, path);
	rt_err err = { "" };
	size_t len = 77;
	char *s = rt_text_read(path, &len, &err);
	ck_assert_msg(s == NULL, "%s accepted", path);
	ck_assert_str_eq(err.msg, want);
}

START_TEST(plain_and_gzip_texts_read_alike)
{
	char body[6000];
	size_t n = 0;
	for (int i = 0; i < 100; i++)
		n += (size_t)snprintf(body + n, sizeof body - n, "Line %d: caf\xc3\xa9 \xe2\x82\xac.\n", i);
	const char *plain = write_file("hay.txt", body, n);
	char cmd[3 * PATH_MAX];
	/* two members, as `cat a.gz b.gz` makes: gzip -dc reads both */
	snprintf(cmd, sizeof cmd, "head -c 1000 '%s' | gzip -c > '%s' && tail -c +1001 '%s' | gzip -c >> '%s'",
	         plain, tmp_path("hay.txt.gz"), plain, tmp_path("hay.txt.gz"));
	ck_assert_int_eq(system(cmd), 0);
	rt_err err = { "" };
	size_t n1 = 0, n2 = 0;
	char *a = rt_text_read(plain, &n1, &err);
	ck_assert_msg(a != NULL, "%s", err.msg);
	char *b = rt_text_read(tmp_path("hay.txt.gz"), &n2, &err);
	ck_assert_msg(b != NULL, "%s", err.msg);
	ck_assert_uint_eq(n1, n);
	ck_assert_uint_eq(n2, n);
	ck_assert(memcmp(a, body, n) == 0 && memcmp(b, body, n) == 0);
	ck_assert(a[n] == 0 && b[n] == 0);
	free(a);
	free(b);
	/* an empty file is a text (of no tokens); the commands decide whether that is enough */
	char *e = rt_text_read(write_file("empty.txt", "", 0), &n1, &err);
	ck_assert_ptr_nonnull(e);
	ck_assert_uint_eq(n1, 0);
	free(e);
}
END_TEST

START_TEST(non_files_are_refused_before_reading)
{
	expect_refused("/dev/zero", "%s: not a regular file (a character device); a text must be a file");
	expect_refused(g_dir, "%s: not a regular file (a directory); a text must be a file");
	const char *fifo = tmp_path("fifo");
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	alarm(10); /* a reader that blocked on the FIFO would hang here */
	expect_refused(fifo, "%s: not a regular file (a FIFO); a text must be a file");
	alarm(0);
	expect_refused(tmp_path("missing.txt"), "%s: No such file or directory");
}
END_TEST

START_TEST(binary_and_invalid_utf8_are_refused_at_their_place)
{
	static const char nul[] = "line one\nab\0cd"; /* NUL at offset 11: line 2, column 3 */
	expect_refused(write_file("nul.txt", nul, sizeof nul - 1),
	               "%s:2:3: binary data: NUL byte (byte offset 11); a text must be UTF-8 without NUL bytes");
	static const char ovl[] = "ok\n\n  \xc0\xaf"; /* overlong '/' at offset 6: line 3, column 3 */
	expect_refused(write_file("overlong.txt", ovl, sizeof ovl - 1),
	               "%s:3:3: not valid UTF-8 (byte offset 6, byte 0xc0); a text must be UTF-8");
	static const char sur[] = "x\xed\xa0\x80"; /* UTF-16 surrogate U+D800 at offset 1 */
	expect_refused(write_file("surrogate.txt", sur, sizeof sur - 1),
	               "%s:1:2: not valid UTF-8 (byte offset 1, byte 0xed); a text must be UTF-8");
	static const char cut[] = "end \xe2\x82"; /* truncated sequence at offset 4 */
	expect_refused(write_file("cut.txt", cut, sizeof cut - 1),
	               "%s:1:5: not valid UTF-8 (byte offset 4, byte 0xe2); a text must be UTF-8");
	/* the first fault wins: invalid UTF-8 at 1 before a NUL at 3 */
	expect_refused(write_file("both.txt", "a\xff\n\0", 4),
	               "%s:1:2: not valid UTF-8 (byte offset 1, byte 0xff); a text must be UTF-8");
	/* a binary haystack: an ELF header */
	static const unsigned char elf[] = { 0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0 };
	expect_refused(write_file("prog.bin", elf, sizeof elf),
	               "%s:1:8: binary data: NUL byte (byte offset 7); a text must be UTF-8 without NUL bytes");
	/* the same checks after decompression */
	const char *p = write_file("bin.txt", nul, sizeof nul - 1);
	char cmd[3 * PATH_MAX];
	snprintf(cmd, sizeof cmd, "gzip -c '%s' > '%s'", p, tmp_path("bin.txt.gz"));
	ck_assert_int_eq(system(cmd), 0);
	expect_refused(tmp_path("bin.txt.gz"),
	               "%s:2:3: binary data: NUL byte (byte offset 11); a text must be UTF-8 without NUL bytes");
}
END_TEST

START_TEST(size_cap_is_enforced)
{
	/* a sparse file one byte over the cap: refused from its size, nothing read */
	const char *big = tmp_path("big.txt");
	int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)RT_TEXT_MAX_BYTES + 1), 0);
	close(fd);
	expect_refused(big, "%s: 67108865 bytes, more than the 67108864 bytes (64 MiB) a text may have");
	/* exactly at the cap is accepted (64 MiB of 'a') */
	char *a = malloc(RT_TEXT_MAX_BYTES);
	ck_assert_ptr_nonnull(a);
	memset(a, 'a', RT_TEXT_MAX_BYTES);
	rt_err err = { "" };
	size_t n = 0;
	char *s = rt_text_from_mem("cap.txt", a, RT_TEXT_MAX_BYTES, 0, &n, &err);
	ck_assert_msg(s != NULL, "%s", err.msg);
	ck_assert_uint_eq(n, RT_TEXT_MAX_BYTES);
	free(s);
	/* a gzip bomb: 64 MiB + 1 of 'a' compresses to about 64 KiB and is refused while
	 * inflating */
	z_stream zs = { 0 };
	ck_assert_int_eq(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
	size_t zcap = 1 << 20;
	unsigned char *z = malloc(zcap);
	zs.next_out = z;
	zs.avail_out = (uInt)zcap;
	unsigned char one = 'a';
	zs.next_in = (unsigned char *)a;
	zs.avail_in = (uInt)RT_TEXT_MAX_BYTES;
	ck_assert_int_eq(deflate(&zs, Z_NO_FLUSH), Z_OK);
	zs.next_in = &one;
	zs.avail_in = 1;
	ck_assert_int_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
	size_t zn = zcap - zs.avail_out;
	deflateEnd(&zs);
	ck_assert_uint_lt(zn, 1 << 19);
	s = rt_text_from_mem("bomb.txt.gz", z, zn, 1, &n, &err);
	ck_assert_ptr_null(s);
	ck_assert_str_eq(err.msg, "bomb.txt.gz: decompresses to more than the 64 MiB a text may have");
	free(a);
	free(z);
	/* a truncated member and trailing bytes are errors, as is a .gz that is not gzip */
	char cmd[3 * PATH_MAX];
	snprintf(cmd, sizeof cmd, "printf 'hello, world\\n' | gzip -c | head -c 20 > '%s'",
	         tmp_path("trunc.gz"));
	ck_assert_int_eq(system(cmd), 0);
	expect_refused(tmp_path("trunc.gz"), "%s: truncated gzip data");
	snprintf(cmd, sizeof cmd, "printf 'hello\\n' | gzip -c > '%s' && printf 'junk' >> '%s'",
	         tmp_path("junk.gz"), tmp_path("junk.gz"));
	ck_assert_int_eq(system(cmd), 0);
	expect_refused(tmp_path("junk.gz"), "%s: bytes after the end of the gzip data");
	expect_refused(write_file("plain.gz", "hello\n", 6), "%s: not gzip data (the name ends in .gz)");
}
END_TEST

START_TEST(output_paths_are_checked_without_creating_files)
{
	rt_err err = { "" };
	ck_assert_int_eq(rt_outpath_check(tmp_path("new.json"), &err), 0);
	ck_assert_int_eq(access(tmp_path("new.json"), F_OK), -1); /* not created */
	ck_assert_int_eq(rt_outpath_check(write_file("old.json", "x", 1), &err), 0);
	ck_assert_int_eq(rt_outpath_check("/dev/null", &err), 0);
	char want[PATH_MAX + 128];
	const char *p = tmp_path("no/such/dir/r.json");
	ck_assert_int_eq(rt_outpath_check(p, &err), -1);
	snprintf(want, sizeof want, "%s: directory '%s/no/such/dir' does not exist", p, g_dir);
	ck_assert_str_eq(err.msg, want);
	ck_assert_int_eq(rt_outpath_check(g_dir, &err), -1);
	snprintf(want, sizeof want, "%s: is a directory", g_dir);
	ck_assert_str_eq(err.msg, want);
	p = tmp_path("old.json/x.svg"); /* a file where a directory should be */
	ck_assert_int_eq(rt_outpath_check(p, &err), -1);
	snprintf(want, sizeof want, "%s: Not a directory", p);
	ck_assert_str_eq(err.msg, want);
	ck_assert_int_eq(rt_outpath_check("r.json", &err), 0); /* the working directory */
}
END_TEST

/* The policy source reader refuses what the text loader refuses, without blocking. */
START_TEST(policy_sources_must_be_regular_files)
{
	char err[512];
	ck_assert_ptr_null(kvp_src_open("/dev/zero", err, sizeof err));
	ck_assert_str_eq(err, "/dev/zero: not a regular file");
	ck_assert_ptr_null(kvp_src_open(g_dir, err, sizeof err));
	char want[PATH_MAX + 64];
	snprintf(want, sizeof want, "%s: not a regular file (a directory)", g_dir);
	ck_assert_str_eq(err, want);
	const char *fifo = tmp_path("policy.fifo");
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	alarm(10); /* opening a FIFO for reading would wait for a writer */
	ck_assert_ptr_null(kvp_src_open(fifo, err, sizeof err));
	alarm(0);
	snprintf(want, sizeof want, "%s: not a regular file", fifo);
	ck_assert_str_eq(err, want);
	kvp_src *src = kvp_src_open(write_file("p.kvp", "policy p {}\n", 12), err, sizeof err);
	ck_assert_msg(src != NULL, "%s", err);
	kvp_src_free(src);
}
END_TEST

static int cli_main(int argc, char **argv, void *user)
{
	(void)user;
	return rt_cli_main(argc, argv, NULL, 0);
}

/* Run rt_cli_main(argv) in a child (10 s limit); its exit status, stderr in *err (caller
 * frees; stdout is discarded). */
static int run_cli(char **err, char **argv)
{
	int rc = proc_call(cli_main, NULL, argv, 10, NULL, err);
	ck_assert_msg(rc >= 0, "%s: could not be run", argv[0]);
	ck_assert_msg(rc < 128, "killed by signal %d (hung?)", rc - 128);
	return rc;
}

#define NOMODEL "no/such/model.gguf"

START_TEST(cli_refuses_bad_inputs_before_the_model)
{
	char *err;
	char *ppl[] = { "kvrt", "ppl", "--model", NOMODEL, "--text", "/dev/zero", NULL };
	ck_assert_int_eq(run_cli(&err, ppl), 1);
	ck_assert_str_eq(err, "kvrt: /dev/zero: not a regular file (a character device); a text must be a file\n");
	free(err);
	char *tok[] = { "kvrt", "tokenize", "--model", NOMODEL, "--text", g_dir, NULL };
	ck_assert_int_eq(run_cli(&err, tok), 1);
	ck_assert_msg(strstr(err, "not a regular file (a directory)") && !strstr(err, NOMODEL), "%s", err);
	free(err);
	static const unsigned char bin[] = { 0x7f, 'E', 'L', 'F', 2, 1, 1, 0 };
	char *hay = (char *)write_file("hay.bin", bin, sizeof bin);
	char *niah[] = { "kvrt", "needle", "--model", NOMODEL, "--task", "niah", "--haystack", hay, NULL };
	ck_assert_int_eq(run_cli(&err, niah), 1);
	ck_assert_msg(strstr(err, "binary data: NUL byte (byte offset 7)") && !strstr(err, NOMODEL),
	              "%s", err);
	free(err);
	char *txt = (char *)write_file("ok.txt", "Some text.\n", 11);
	char *km[] = { "kvrt", "keepmap", "--model", NOMODEL, "--text", txt, "--svg",
		       (char *)tmp_path("no/dir/k.svg"), NULL };
	ck_assert_int_eq(run_cli(&err, km), 2);
	ck_assert_msg(strstr(err, "--svg: ") && strstr(err, "no/dir' does not exist") &&
	              !strstr(err, NOMODEL), "%s", err);
	free(err);
	char *dump[] = { "kvrt", "ppl", "--model", NOMODEL, "--text", txt, "--dump", g_dir, NULL };
	ck_assert_int_eq(run_cli(&err, dump), 2);
	ck_assert_msg(strstr(err, "--dump: ") && strstr(err, ": is a directory"), "%s", err);
	free(err);
	/* a --batch run list is read by the same loader */
	char *batch[] = { "kvrt", "ppl", "--model", NOMODEL, "--text", txt, "--batch", "/dev/zero", NULL };
	ck_assert_int_eq(run_cli(&err, batch), 2);
	ck_assert_str_eq(err, "kvrt: /dev/zero: not a regular file (a character device); a text must be a file\n");
	free(err);
	/* with good inputs the model is the first thing that fails */
	char *good[] = { "kvrt", "ppl", "--model", NOMODEL, "--text", txt, NULL };
	ck_assert_int_eq(run_cli(&err, good), 1);
	ck_assert_msg(strstr(err, NOMODEL), "%s", err);
	free(err);
}
END_TEST

/* The command lines' number syntax, against hand-written cases: bounds, whole numbers,
 * the count cap, and the spellings strtod would take but a strict parse must not. */
START_TEST(number_lists_parse_strictly)
{
	double v[RT_NUMPARSE_MAX_LIST];
	int n = -1;
	ck_assert_int_eq(rt_parse_list("2,4,8.5", 1, INFINITY, 0, v, 8, &n), 0);
	ck_assert_int_eq(n, 3);
	ck_assert(v[0] == 2 && v[1] == 4 && v[2] == 8.5);
	ck_assert_int_eq(rt_parse_list("0,100", 0, 100, 1, v, 8, &n), 0);
	ck_assert(n == 2 && v[0] == 0 && v[1] == 100);
	static const char *const bad[] = { "", ",", "2,", ",2", "2,,4", " 2", "2 ", "2, 4", "4x",
		                           "inf", "nan", "0.5", "101", "1e999", "0x10", "0x1p3", "+inf" };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
		ck_assert_msg(rt_parse_list(bad[i], 1, 100, 0, v, 8, &n) == -1, "'%s' accepted", bad[i]);
	ck_assert_int_eq(rt_parse_list("2.5", 1, 100, 1, v, 8, &n), -1); /* not whole */
	ck_assert_int_eq(rt_parse_list("1,2,3", 1, 100, 1, v, 3, &n), 0);
	ck_assert_int_eq(rt_parse_list("1,2,3,4", 1, 100, 1, v, 3, &n), -1); /* over the cap */
	/* a ratio list: factors >= 1, at most 16 (kvrt ab's and kvpc ab's one bound) */
	ck_assert_int_eq(rt_parse_ratio_list("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16.5", v, &n), 0);
	ck_assert(n == 16 && v[15] == 16.5);
	ck_assert_int_eq(rt_parse_ratio_list("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", v, &n), -1);
	ck_assert_int_eq(rt_parse_ratio_list("0.99", v, &n), -1);
	double y = 7;
	ck_assert_int_eq(rt_parse_double("-1.5e-3", &y), 0);
	ck_assert(y == -1.5e-3);
	static const char *const baddbl[] = { "", " 2", "2 ", "0x10", "inf", "nan", "1e999", "2x" };
	for (size_t i = 0; i < sizeof baddbl / sizeof *baddbl; i++) {
		y = 7;
		ck_assert_msg(rt_parse_double(baddbl[i], &y) == -1 && y == 7, "'%s'", baddbl[i]);
	}
	long x = 7;
	ck_assert_int_eq(rt_parse_int("42", 0, 100, &x), 0);
	ck_assert_int_eq(x, 42);
	static const char *const badint[] = { "", " 4", "4 ", "4.0", "0x10", "101", "-1" };
	for (size_t i = 0; i < sizeof badint / sizeof *badint; i++) {
		x = 7;
		ck_assert_msg(rt_parse_int(badint[i], 0, 100, &x) == -1 && x == 7, "'%s'", badint[i]);
	}
}
END_TEST

static Suite *text_suite(void)
{
	Suite *s = suite_create("text");
	TCase *tc = tcase_create("text");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, plain_and_gzip_texts_read_alike);
	tcase_add_test(tc, number_lists_parse_strictly);
	tcase_add_test(tc, non_files_are_refused_before_reading);
	tcase_add_test(tc, binary_and_invalid_utf8_are_refused_at_their_place);
	tcase_add_test(tc, size_cap_is_enforced);
	tcase_add_test(tc, output_paths_are_checked_without_creating_files);
	tcase_add_test(tc, cli_refuses_bad_inputs_before_the_model);
	tcase_add_test(tc, policy_sources_must_be_regular_files);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	snprintf(g_dir, sizeof g_dir, "/tmp/test_text_XXXXXX");
	if (!mkdtemp(g_dir))
		return 1;
	int failed = check_run(text_suite());
	char cmd[PATH_MAX + 16];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
	if (system(cmd) != 0)
		failed++;
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
