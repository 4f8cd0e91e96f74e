/*
 * test_json: the report writers of runtime/report/rt_json.c and runtime/base/rt_buf.c —
 * escapes, non-finite numbers, integers at and beyond 2^53 (checked against Python's
 * json.loads, which reads integers exactly, and against an IEEE double parse, which
 * does not), and the growable buffer across many doublings.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_buf.h"
#include "report/rt_json.h"
#include "support/check_run.h"


static char *capture(void (*fn)(FILE *), size_t *len)
{
	char *s = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&s, &n);
	fn(f);
	ck_assert_int_eq(fclose(f), 0);
	if (len)
		*len = n;
	return s;
}

static void w_strings(FILE *f)
{
	rt_json_str(f, "a\"b\\c\nd\x01\x1f caf\xc3\xa9");
	fputc(' ', f);
	rt_json_str(f, NULL);
}

static void w_numbers(FILE *f)
{
	rt_json_num(f, 0.1);
	fputc(' ', f);
	rt_json_num(f, 2.0 / 3.0);
	fputc(' ', f);
	rt_json_num(f, NAN);
	fputc(' ', f);
	rt_json_num(f, -INFINITY);
	fputc(' ', f);
	rt_json_fixed(f, 3.14159, 2);
	fputc(' ', f);
	rt_json_fixed(f, INFINITY, 3);
	fputc('{', f);
	fputs("\"a\":1", f);
	rt_json_member_num(f, "x", 1e-7);
	rt_json_member_fixed(f, "y", 12.5, 3);
	fputc('}', f);
}

static void w_integers(FILE *f)
{
	rt_json_uint(f, 9007199254740992ULL);   /* 2^53: a number */
	fputc(' ', f);
	rt_json_uint(f, 9007199254740993ULL);   /* 2^53 + 1: a double would read 2^53 */
	fputc(' ', f);
	rt_json_uint(f, UINT64_MAX);
	fputc(' ', f);
	rt_json_int(f, -9007199254740992LL);
	fputc(' ', f);
	rt_json_int(f, INT64_MIN);
	fputc(' ', f);
	rt_json_int(f, 0);
}

START_TEST(test_strings)
{
	char *s = capture(w_strings, NULL);
	ck_assert_str_eq(s, "\"a\\\"b\\\\c\\nd\\u0001\\u001f caf\xc3\xa9\" null");
	free(s);
}
END_TEST

START_TEST(test_numbers)
{
	char *s = capture(w_numbers, NULL);
	ck_assert_str_eq(s, "0.1 0.666666667 null null 3.14 null{\"a\":1,\"x\":1e-07,\"y\":12.500}");
	free(s);
}
END_TEST

START_TEST(test_integers_survive_a_parser)
{
	char *s = capture(w_integers, NULL);
	ck_assert_str_eq(s, "9007199254740992 \"9007199254740993\" \"18446744073709551615\" "
	                    "-9007199254740992 \"-9223372036854775808\" 0");
	/* what a double-reading parser would make of the bare number shows why */
	ck_assert(strtod("9007199254740993", NULL) == 9007199254740992.0);
	free(s);
}
END_TEST

START_TEST(test_buf)
{
	rt_buf b = RT_BUF_INIT;
	char *e = rt_buf_take(&b, NULL); /* nothing appended: an empty string, not NULL */
	ck_assert_str_eq(e, "");
	free(e);
	rt_buf_puts(&b, NULL);
	rt_buf_puts(&b, "ab");
	rt_buf_append(&b, "cdef", 2);
	ck_assert_str_eq(b.s, "abcd");
	for (int i = 0; i < 3000; i++)
		rt_buf_printf(&b, "%04d;", i);
	ck_assert_uint_eq(b.len, 4 + 5 * 3000);
	ck_assert(b.cap > b.len && b.s[b.len] == '\0');
	ck_assert_int_eq(memcmp(b.s + 4 + 5 * 2999, "2999;", 5), 0);
	size_t n;
	char *t = rt_buf_take(&b, &n);
	ck_assert_uint_eq(n, 4 + 5 * 3000);
	ck_assert_ptr_null(b.s);
	ck_assert_uint_eq(b.len, 0);
	free(t);
	rt_buf_printf(&b, "%s", "x");
	rt_buf_free(&b);
	ck_assert_ptr_null(b.s);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("json");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_strings);
	tcase_add_test(tc, test_numbers);
	tcase_add_test(tc, test_integers_survive_a_parser);
	tcase_add_test(tc, test_buf);
	suite_add_tcase(s, tc);
	int failed = check_run(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
