/*
 * test_params: run-time parameter overrides (`--set NAME=VALUE`, kvp_policy_param_set in
 * runtime/policy/rt_policy.c). The values a user types are untrusted input: they get the same
 * unit rules kvpc applies to the defaults (whole non-negative counts for entries, tokens
 * and steps; non-negative ratios, which may be written as percentages and are above 1 only
 * with the percent sign) and a one-line error
 * that names the policy and the parameter.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/rt_policy.h"
#include "support/check_run.h"

static const struct kvp_param PARAMS[] = {
	{ "sinks", 4, KVP_UNIT_ENTRIES, "" },
	{ "recent", 32, KVP_UNIT_TOKENS, "" },
	{ "every", 8, KVP_UNIT_STEPS, "" },
	{ "heavy", 0.1, KVP_UNIT_RATIO, "" },
	{ "alpha", -0.5, KVP_UNIT_SCALAR, "" },
};
static const struct kvp_policy POL = {
	.abi_version = KVP_ABI_VERSION,
	.name = "demo",
	.n_params = 5,
	.params = PARAMS,
};

/* Apply one assignment; returns the error text ("" on success) in err. */
static int set(double *v, const char *a, rt_err *err)
{
	err->msg[0] = 0;
	return kvp_policy_param_set(&POL, v, a, err);
}

START_TEST(test_accepts_valid_values)
{
	double v[5];
	rt_err err;
	kvp_policy_param_defaults(&POL, v);
	ck_assert_double_eq(v[3], 0.1);
	ck_assert_int_eq(set(v, "sinks=0", &err), 0);
	ck_assert_double_eq(v[0], 0);
	ck_assert_int_eq(set(v, "recent=128", &err), 0);
	ck_assert_double_eq(v[1], 128);
	ck_assert_int_eq(set(v, "every=1", &err), 0);
	ck_assert_int_eq(set(v, "heavy=0.25", &err), 0);
	ck_assert_double_eq_tol(v[3], 0.25, 1e-15);
	ck_assert_int_eq(set(v, "heavy=1", &err), 0); /* a fraction up to 1 */
	ck_assert_double_eq(v[3], 1);
	ck_assert_int_eq(set(v, "heavy=150%", &err), 0); /* above 1 only with its sign */
	ck_assert_double_eq_tol(v[3], 1.5, 1e-15);
	ck_assert_int_eq(set(v, "heavy=25%", &err), 0); /* a percentage, as in .kvp files */
	ck_assert_double_eq_tol(v[3], 0.25, 1e-15);
	ck_assert_int_eq(set(v, "alpha=-3.5", &err), 0); /* scalars may be negative */
	ck_assert_double_eq(v[4], -3.5);
}
END_TEST

START_TEST(test_rejects_bad_values)
{
	double v[5];
	rt_err err;
	kvp_policy_param_defaults(&POL, v);
	static const struct {
		const char *assign, *want;
	} cases[] = {
		{ "recent=-3", "parameter recent counts tokens: it needs a whole number" },
		{ "sinks=2.5", "parameter sinks counts entries: it needs a whole number" },
		{ "every=1e12", "parameter every counts steps" },
		{ "heavy=-0.1", "parameter heavy is a ratio: it cannot be negative" },
		/* a bare 20 is 2000%: a percentage without its sign */
		{ "heavy=20", "parameter heavy is a ratio: '20' would be 2000%; write a percentage (20%) or a fraction" },
		{ "heavy=abc", "parameter heavy needs a finite number" },
		{ "recent=10%", "parameter recent counts tokens: a percentage is for a ratio parameter, got '10%'" },
		{ "alpha=5%", "parameter alpha is a plain number: a percentage is for a ratio parameter" },
		{ "heavy=5%%", "parameter heavy needs a finite number or a percentage" },
		{ "alpha=inf", "needs a finite number" },
		/* the command lines' strict syntax (base/rt_numparse.h), as --ratio's */
		{ "heavy=0x10", "parameter heavy needs a finite number or a percentage, got '0x10'" },
		{ "recent= 8", "parameter recent needs a finite number, got ' 8'" },
		{ "nosuch=1", "policy demo: no parameter 'nosuch' (its parameters: sinks, recent, every, heavy, alpha)" },
		{ "=1", "--set expects NAME=VALUE" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		ck_assert_int_eq(set(v, cases[i].assign, &err), -1);
		ck_assert_msg(strstr(err.msg, cases[i].want), "%s: got '%s'", cases[i].assign, err.msg);
		ck_assert_msg(strncmp(err.msg, "policy demo: ", 13) == 0, "%s", err.msg);
	}
	/* nothing changed by the rejected assignments */
	ck_assert_double_eq(v[0], 4);
	ck_assert_double_eq(v[1], 32);
	ck_assert_double_eq(v[3], 0.1);
}
END_TEST

/* `info` shows parameters in the units the .kvp source writes them (rt_param_format):
 * a ratio as a percentage, counts with their unit word; the --set form drops the word. */
START_TEST(test_format_source_units)
{
	static const struct {
		int i;
		double v;
		const char *src, *set;
	} cases[] = {
		{ 3, 0.1, "10%", "10%" },          { 3, 0.125, "12.5%", "12.5%" },
		{ 1, 32, "32 tokens", "32" },      { 1, 1, "1 token", "1" },
		{ 0, 2048, "2048 entries", "2048" }, { 0, 1, "1 entry", "1" },
		{ 2, 400, "400 steps", "400" },    { 4, -0.5, "-0.5", "-0.5" },
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		char a[64], b[64];
		rt_param_format(&PARAMS[cases[k].i], cases[k].v, a, sizeof a);
		rt_param_format_set(&PARAMS[cases[k].i], cases[k].v, b, sizeof b);
		ck_assert_str_eq(a, cases[k].src);
		ck_assert_str_eq(b, cases[k].set);
		/* the --set form reads back as the same value */
		double v[5];
		kvp_policy_param_defaults(&POL, v);
		char assign[96];
		snprintf(assign, sizeof assign, "%s=%s", PARAMS[cases[k].i].name, b);
		rt_err err;
		ck_assert_int_eq(set(v, assign, &err), 0);
		ck_assert_double_eq_tol(v[cases[k].i], cases[k].v, 1e-15);
	}
}
END_TEST

static Suite *params_suite(void)
{
	Suite *s = suite_create("params");
	TCase *tc = tcase_create("set");
	tcase_add_test(tc, test_accepts_valid_values);
	tcase_add_test(tc, test_rejects_bad_values);
	tcase_add_test(tc, test_format_source_units);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed = check_run(params_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
