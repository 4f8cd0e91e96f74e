/*
 * test_pick: the one policy choice of every front door (runtime/policy/rt_pick.h). The
 * matrix: a policy that never compresses and ones that do (one needing f32 rows, one
 * setting precision tiers) x no ratio / a ratio / a byte ratio / both / a bad one x the
 * KV types (each chosen, and the default) x a door's overrides (parameter values, the
 * build's tuned default, a request that replaces the server's ratio). Every expected
 * outcome is written by hand from the rules in rt_pick.h (the reference), not taken from
 * a run: which field fails, the message the door prints, and the ratio, KV type and
 * parameter values in force. (rt_seq_apply, which puts a choice into a sequence, runs in
 * every CLI test of tests/test_seq.c and tests/test_cli.c.)
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/rt_pick.h"
#include "support/check_run.h"

static const struct kvp_param PARAMS[] = {
	{ "sinks", 4, KVP_UNIT_ENTRIES, "" },
	{ "heavy", 0.1, KVP_UNIT_RATIO, "" },
};

static int compress_stub(const struct kvp_ctx *ctx, rt_kv *kv, rt_err *err)
{
	(void)ctx, (void)kv, (void)err;
	return 0;
}

static const struct kvp_policy SQUEEZE = { .abi_version = KVP_ABI_VERSION, .name = "squeeze",
	.n_params = 2, .params = PARAMS, .compress = compress_stub };
static const struct kvp_policy ROWS = { .abi_version = KVP_ABI_VERSION, .name = "rows",
	.needs = KVP_NEED_F32_KV, .compress = compress_stub };
static const struct kvp_policy TIERS = { .abi_version = KVP_ABI_VERSION, .name = "tiers",
	.needs = KVP_NEED_TIERS, .compress = compress_stub };
static const struct kvp_policy KEEP = { .abi_version = KVP_ABI_VERSION, .name = "keep" };
static const struct kvp_policy *const REG[] = { &SQUEEZE, &ROWS, &TIERS, &KEEP };

static const char *const CLI[RT_PICK_N_FIELDS] = { "--policy", "--kv-type", "--set", "--ratio",
	"--byte-ratio", "--prefill-chunk", "--min-kv" };
static const char *const HTTP[RT_PICK_N_FIELDS] = { "kv.policy", "this server's --kv-type",
	"kv.set", "kv.ratio", "kv.byte_ratio", "kv.prefill_chunk", "kv.min_kv" };

/* squeeze's tuned default: 6 in entries; rows': 3 in bytes; none for the others */
static double tuned(const struct kvp_policy *p, int *bytes)
{
	*bytes = p == &ROWS;
	return p == &SQUEEZE ? 6 : p == &ROWS ? 3 : 0;
}

/* One cell: the input, then either the error (field, message) or what is in force. */
struct cell {
	const char *policy;
	int kv_type;          /* -1: not chosen (default f16) */
	double ratio, byte_ratio;
	int use_tuned;
	const char *set;      /* one "name=value" or NULL */
	int ok;
	enum rt_pick_field field;
	const char *msg;      /* the whole message (CLI spellings) */
	const char *in_force; /* "entries R" / "bytes R" / "none" */
	int kv_in_force;
};

#define F32 RT_KV_F32
#define F16 RT_KV_F16
#define Q8 RT_KV_Q8_0
static const struct cell CELLS[] = {
	/* a policy that never compresses: no ratio is fine, any ratio names its field */
	{ "keep", -1, 0, 0, 0, NULL, 1, 0, NULL, "none", F16 },
	{ "keep", -1, 0, 0, 1, NULL, 1, 0, NULL, "none", F16 }, /* no tuned default for it */
	{ "keep", -1, 4, 0, 0, NULL, 0, RT_PICK_RATIO,
	  "--ratio: policy keep never compresses, so a ratio does not apply", NULL, 0 },
	{ "keep", -1, 0, 4, 0, NULL, 0, RT_PICK_BYTE_RATIO,
	  "--byte-ratio: policy keep never compresses, so a ratio does not apply", NULL, 0 },
	{ "keep", F32, 4, 2, 0, NULL, 0, RT_PICK_RATIO,
	  "--ratio: policy keep never compresses, so a ratio does not apply", NULL, 0 },
	/* a compressing policy: ratio, byte ratio, both, bad values, the tuned default */
	{ "squeeze", -1, 0, 0, 0, NULL, 1, 0, NULL, "none", F16 },
	{ "squeeze", -1, 4, 0, 0, NULL, 1, 0, NULL, "entries 4", F16 },
	{ "squeeze", Q8, 0, 2.5, 0, NULL, 1, 0, NULL, "bytes 2.5", Q8 },
	{ "squeeze", -1, 4, 2, 0, NULL, 0, RT_PICK_BYTE_RATIO,
	  "--ratio counts entries and --byte-ratio bytes; give one of them", NULL, 0 },
	{ "squeeze", -1, 0.5, 0, 0, NULL, 0, RT_PICK_RATIO,
	  "--ratio: compression ratio must be a finite number >= 1, got 0.5", NULL, 0 },
	{ "squeeze", -1, 0, 0.5, 0, NULL, 0, RT_PICK_BYTE_RATIO,
	  "--byte-ratio: compression ratio in bytes must be a finite number >= 1, got 0.5", NULL, 0 },
	{ "squeeze", -1, INFINITY, 0, 0, NULL, 0, RT_PICK_RATIO,
	  "--ratio: compression ratio must be a finite number >= 1, got inf", NULL, 0 },
	{ "squeeze", -1, 0, 0, 1, NULL, 1, 0, NULL, "entries 6", F16 },   /* tuned */
	{ "squeeze", -1, 0, 8, 1, NULL, 1, 0, NULL, "bytes 8", F16 },     /* given wins */
	{ "squeeze", -1, 1, 0, 0, "sinks=2", 1, 0, NULL, "entries 1", F16 },
	{ "squeeze", -1, 0, 0, 0, "sinks=2.5", 0, RT_PICK_SET,
	  "--set: policy squeeze: parameter sinks counts entries: it needs a whole number between 0 and 1e9, got '2.5'", NULL, 0 },
	{ "squeeze", -1, 0, 0, 0, "nosuch=1", 0, RT_PICK_SET,
	  "--set: policy squeeze: no parameter 'nosuch' (its parameters: sinks, heavy)", NULL, 0 },
	/* f32 rows: the default follows the policy, a chosen narrow type is refused */
	{ "rows", -1, 0, 0, 0, NULL, 1, 0, NULL, "none", F32 },
	{ "rows", -1, 0, 0, 1, NULL, 1, 0, NULL, "bytes 3", F32 },        /* tuned in bytes */
	{ "rows", F32, 2, 0, 1, NULL, 1, 0, NULL, "entries 2", F32 },
	{ "rows", F16, 0, 0, 0, NULL, 0, RT_PICK_KV_TYPE,
	  "--kv-type f16: policy rows reads and rewrites f32 key/value rows; it needs --kv-type f32", NULL, 0 },
	{ "rows", Q8, 4, 0, 0, NULL, 0, RT_PICK_KV_TYPE,
	  "--kv-type q8_0: policy rows reads and rewrites f32 key/value rows; it needs --kv-type f32", NULL, 0 },
	/* precision tiers: f16 and f32 tops, not q8_0 */
	{ "tiers", F32, 0, 4, 0, NULL, 1, 0, NULL, "bytes 4", F32 },
	{ "tiers", -1, 0, 4, 0, NULL, 1, 0, NULL, "bytes 4", F16 },
	{ "tiers", Q8, 0, 4, 0, NULL, 0, RT_PICK_KV_TYPE,
	  "--kv-type q8_0: policy tiers sets precision tiers, whose top tier is f16 or f32", NULL, 0 },
	/* an unknown policy lists the binary's, with the built-in full */
	{ "nosuch", -1, 4, 0, 0, NULL, 0, RT_PICK_POLICY,
	  "unknown policy 'nosuch' (this binary has: squeeze, rows, tiers, keep, full)", NULL, 0 },
	/* the built-in full never compresses */
	{ "full", -1, 2, 0, 0, NULL, 0, RT_PICK_RATIO,
	  "--ratio: policy full never compresses, so a ratio does not apply", NULL, 0 },
};
#define N_CELLS ((int)(sizeof CELLS / sizeof CELLS[0]))

static struct rt_pick_in in_of(const struct cell *c, const char *const *sets,
                               const char *const *spellings)
{
	return (struct rt_pick_in){ .reg = REG, .n_reg = 4, .policy = c->policy,
		.kv_type = c->kv_type, .kv_default = RT_KV_F16, .sets = sets, .n_sets = c->set ? 1 : 0,
		.ratio = c->ratio, .byte_ratio = c->byte_ratio, .tuned = c->use_tuned ? tuned : NULL,
		.spellings = spellings };
}

START_TEST(matrix_cell)
{
	const struct cell *c = &CELLS[_i];
	const char *sets[1] = { c->set };
	struct rt_pick_in in = in_of(c, sets, CLI);
	struct rt_pick pk;
	rt_err err = { "" };
	int rc = rt_pick(&in, &pk, &err);
	if (!c->ok) {
		ck_assert_int_eq(rc, -1);
		ck_assert_int_eq(pk.field, c->field);
		ck_assert_int_eq(err.code, RT_ERR_INPUT);
		ck_assert_str_eq(err.msg, c->msg);
		ck_assert_ptr_null(pk.vals);
		return;
	}
	ck_assert_msg(rc == 0, "cell %d: %s", _i, err.msg);
	ck_assert_str_eq(pk.p->name, c->policy);
	ck_assert_int_eq(pk.kv_type, c->kv_in_force);
	char got[32];
	if (pk.ratio > 0)
		snprintf(got, sizeof got, "entries %g", pk.ratio);
	else if (pk.byte_ratio > 0)
		snprintf(got, sizeof got, "bytes %g", pk.byte_ratio);
	else
		snprintf(got, sizeof got, "none");
	ck_assert_str_eq(got, c->in_force);
	ck_assert(pk.ratio == 0 || pk.byte_ratio == 0);
	ck_assert_int_eq(pk.tuned, c->use_tuned && c->ratio == 0 && c->byte_ratio == 0 &&
	                           strcmp(c->in_force, "none") != 0);
	if (pk.p == &SQUEEZE) { /* defaults 4 and 0.1, then the set */
		ck_assert_double_eq(pk.vals[0], c->set ? 2 : 4);
		ck_assert_double_eq(pk.vals[1], 0.1);
	}
	rt_pick_free(&pk);
	ck_assert_ptr_null(pk.vals);
}
END_TEST

/* The same cells through a request's door: the field is the same, the message spells it
 * as the request does. */
START_TEST(the_door_spells_the_field)
{
	static const struct { int cell; const char *msg; } cases[] = {
		{ 2, "kv.ratio: policy keep never compresses, so a ratio does not apply" },
		{ 8, "kv.ratio counts entries and kv.byte_ratio bytes; give one of them" },
		{ 10, "kv.byte_ratio: compression ratio in bytes must be a finite number >= 1, got 0.5" },
		{ 16, "kv.set: policy squeeze: no parameter 'nosuch' (its parameters: sinks, heavy)" },
		{ 20, "this server's --kv-type f16: policy rows reads and rewrites f32 key/value rows; "
		      "it needs --kv-type f32" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const struct cell *c = &CELLS[cases[i].cell];
		const char *sets[1] = { c->set };
		struct rt_pick_in in = in_of(c, sets, HTTP);
		struct rt_pick pk;
		rt_err err = { "" };
		ck_assert_int_eq(rt_pick(&in, &pk, &err), -1);
		ck_assert_int_eq(pk.field, c->field);
		ck_assert_str_eq(err.msg, cases[i].msg);
	}
}
END_TEST

/* Per-request overrides as the server composes them: the request's sets after the
 * server's (the last value wins), and a request ratio of 0 asks for the policy's own
 * budget (no tuned default replaces it when the door passes none). */
START_TEST(overrides_in_order)
{
	const char *sets[] = { "sinks=8", "heavy=25%", "sinks=1" };
	struct rt_pick_in in = { .reg = REG, .n_reg = 4, .policy = "squeeze", .kv_type = RT_KV_F16,
		.sets = sets, .n_sets = 3, .spellings = HTTP };
	struct rt_pick pk;
	rt_err err = { "" };
	ck_assert_msg(rt_pick(&in, &pk, &err) == 0, "%s", err.msg);
	ck_assert_double_eq(pk.vals[0], 1);
	ck_assert_double_eq_tol(pk.vals[1], 0.25, 1e-15);
	ck_assert(pk.ratio == 0 && pk.byte_ratio == 0 && !pk.tuned);
	rt_pick_free(&pk);
	/* no policy named: the registry's first; no registry: the built-in full */
	in.policy = NULL;
	in.n_sets = 0;
	ck_assert_int_eq(rt_pick(&in, &pk, &err), 0);
	ck_assert_ptr_eq(pk.p, &SQUEEZE);
	rt_pick_free(&pk);
	in.reg = NULL;
	in.n_reg = 0;
	ck_assert_int_eq(rt_pick(&in, &pk, &err), 0);
	ck_assert_ptr_eq(pk.p, &rt_policy_full);
	rt_pick_free(&pk);
	/* the floor of a graceful budget: whole tokens, carried to the choice */
	in.min_kv = 64;
	ck_assert_int_eq(rt_pick(&in, &pk, &err), 0);
	ck_assert_double_eq(pk.min_kv, 64);
	rt_pick_free(&pk);
	in.min_kv = 2.5;
	ck_assert_int_eq(rt_pick(&in, &pk, &err), -1);
	ck_assert_int_eq(pk.field, RT_PICK_MIN_KV);
	ck_assert_str_eq(err.msg, "kv.min_kv: the floor must be a whole number of tokens in "
	                 "0..1073741824, got 2.5");
	in.min_kv = 0;
	/* a prefill chunk outside 0..65536 */
	in.prefill_chunk = 70000;
	ck_assert_int_eq(rt_pick(&in, &pk, &err), -1);
	ck_assert_int_eq(pk.field, RT_PICK_PREFILL);
	ck_assert_str_eq(err.msg, "kv.prefill_chunk: prefill chunk must be 0..65536 tokens, got 70000");
}
END_TEST

/* The one ratio rule, which rt_run_set_ratio also applies. */
START_TEST(ratio_rule)
{
	rt_err err = { "" };
	ck_assert_int_eq(rt_ratio_check(0, 0, &err), 0);
	ck_assert_int_eq(rt_ratio_check(1, 0, &err), 0);
	ck_assert_int_eq(rt_ratio_check(1e9, 1, &err), 0);
	ck_assert_int_eq(rt_ratio_check(0.999, 0, &err), -1);
	ck_assert_int_eq(rt_ratio_check(-2, 1, &err), -1);
	ck_assert_int_eq(rt_ratio_check(NAN, 0, &err), -1);
	ck_assert_int_eq(rt_ratio_check(INFINITY, 0, NULL), -1);
}
END_TEST


/* The notes of a graceful budget, walked in bit order: each set bit's text once, unknown
 * bits dropped; the JSON writer walks them the same way. */
START_TEST(notes_walk)
{
	unsigned n = KVP_NOTE_SPAN | KVP_NOTE_FLOOR | (KVP_NOTE_LAST << 3);
	const char *t = rt_pick_note_next(&n);
	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_nonnull(strstr(t, "floor"));
	t = rt_pick_note_next(&n);
	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_nonnull(strstr(t, "protected span"));
	ck_assert_ptr_null(rt_pick_note_next(&n));
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(rt_pick_note_next(&n));
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	ck_assert_ptr_nonnull(f);
	rt_pick_notes_json(f, KVP_NOTE_GUARDS);
	fputc(' ', f);
	rt_pick_notes_json(f, 0);
	fclose(f);
	ck_assert_str_eq(buf, "[\"the guards exceeded the budget, which was raised to hold them\"] []");
	free(buf);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("pick");
	TCase *tc = tcase_create("pick");
	tcase_add_loop_test(tc, matrix_cell, 0, N_CELLS);
	tcase_add_test(tc, the_door_spells_the_field);
	tcase_add_test(tc, overrides_in_order);
	tcase_add_test(tc, ratio_rule);
	tcase_add_test(tc, notes_walk);
	suite_add_tcase(s, tc);
	int failed = check_run(s);
	return failed ? 1 : 0;
}
