/*
 * test_progress: runtime/base/rt_progress.c — the plain mode writes one line per tenth of
 * the work (ten lines for a thousand single steps, the last at 100% without an ETA), the
 * terminal mode redraws one line with a bar and clears it at the end, quiet writes nothing.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_progress.h"
#include "support/check_run.h"

static char *run(int tty, int quiet, size_t *len)
{
	char *s = NULL;
	FILE *f = open_memstream(&s, len);
	rt_progress p;
	rt_progress_init(&p, "ppl", "tokens", 1000, quiet);
	p.out = f;
	p.tty = tty;
	for (int i = 1; i <= 1000; i++)
		rt_progress_update(&p, i);
	rt_progress_end(&p);
	fclose(f);
	return s;
}

START_TEST(test_plain)
{
	size_t n;
	char *s = run(0, 0, &n);
	int lines = 0;
	for (char *p = s; *p; p++)
		lines += *p == '\n';
	ck_assert_int_eq(lines, 10);
	ck_assert(strncmp(s, "ppl: 10% (100/1000 tokens, ", 27) == 0);
	ck_assert_ptr_nonnull(strstr(s, "ETA"));
	char *last = strstr(s, "ppl: 100% (1000/1000 tokens, ");
	ck_assert_ptr_nonnull(last);
	ck_assert_ptr_null(strstr(last, "ETA"));
	free(s);
}
END_TEST

START_TEST(test_tty_and_quiet)
{
	size_t n;
	char *s = run(1, 0, &n);
	ck_assert_ptr_nonnull(strstr(s, "\r\033[Kppl [#"));
	ck_assert_ptr_nonnull(strstr(s, "[####################] 100% 1000/1000 tokens"));
	ck_assert(n >= 4 && strcmp(s + n - 4, "\r\033[K") == 0); /* cleared at the end */
	ck_assert_ptr_null(strchr(s, '\n'));
	free(s);
	s = run(0, 1, &n);
	ck_assert_uint_eq(n, 0);
	free(s);
	s = run(1, 1, &n);
	ck_assert_uint_eq(n, 0);
	free(s);
}
END_TEST

/* Slower than one unit a second, the line gives the seconds each takes (a rate would read
 * "0.0 trials/s"): one trial of three after 95 s is "95 s per trial", ETA 190 s. */
START_TEST(test_slow_units)
{
	char *s = NULL;
	size_t n;
	FILE *f = open_memstream(&s, &n);
	rt_progress p;
	rt_progress_init(&p, "needle", "trials", 3, 0);
	p.out = f;
	p.tty = 0;
	p.t0 -= 95.0;
	rt_progress_update(&p, 1);
	fclose(f);
	const char *want = "needle: 33% (1/3 trials, 95 s per trial, ETA 190 s)\n";
	ck_assert_msg(strcmp(s, want) == 0, "%s", s);
	free(s);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("progress");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_plain);
	tcase_add_test(tc, test_tty_and_quiet);
	tcase_add_test(tc, test_slow_units);
	suite_add_tcase(s, tc);
	int failed = check_run(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
