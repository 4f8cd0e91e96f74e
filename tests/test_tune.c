/*
 * test_tune: the quality gate end to end on a tiny synthetic GGUF model (grouped-query:
 * 9 query / 3 KV heads, tests/support/tiny_model.h, written by the test) with a block-wise
 * H2O (POLICY below, written to a temporary directory: it compresses every 16 tokens, so
 * the forward runs in chunks, and its guards scale with the context, so ratios up to 8 fit
 * 48 tokens), on 48 tokens of a short English text. The KL limits come from independent
 * measurements: `BIN ppl --ratio R --json` (a separate command) at each ratio of the grid
 * 2,4,8 must give mean KLs k2 < k4 < k8; the tight limit lies between k2 and k4, the loose
 * one above k8, so the ratios tune must choose are known before it runs:
 *   - `kvpc tune` with the tight limit chooses 2 (within, and the next grid ratio is not),
 *     with the loose one 8, and its sidecar records ppl's KL at the chosen ratio;
 *   - `kvpc build` bakes the sidecar's ratio in (BIN info shows it, BIN ppl without --ratio
 *     reports it), `kvpc build --gate` passes as tuned and refuses (exit 1, no binary
 *     written, a message naming the text, the measured value as ppl measured it and the
 *     limit) once the limit is made tighter than the measured KL;
 *   - budgets in bytes, on a second model of head_dim 32 (9/3 heads: the quantised tiers
 *     need 32 channels a group) with a precision policy (gate_tiers, a byte budget spent by
 *     utility per byte): tune searches byte ratios by default for it; its choice under a
 *     limit is the one a brute-force scan of `BIN ppl --byte-ratio R --json` over the same
 *     grid gives (the highest R within the limit), the sidecar records `byte_ratio`, the
 *     built binary runs at it without a flag (ppl's byte_ratio and bytes_compression equal
 *     the scan's at R), and `kvpc build --gate` holds and then refuses a tighter limit;
 *   - a KIVI-style policy (kivi_gate: nothing evicted, old entries at q4) below its fixed
 *     byte ratio (ppl's bytes_compression without an override) is refused with that
 *     figure, and no sidecar is written;
 *   - usage errors of the budget kinds, `ab --byte-ratio` (its kld_mean is ppl's at the
 *     same byte ratio);
 *   - the sidecar format (runtime/policy/rt_tuned.h): a round trip, and located errors;
 *   - a prompt-end policy (gate_snap, SnapKV's statements) is measured on the tokens after a
 *     prompt: tune's choice and KL and the gate's refusal follow `BIN ppl --prompt 32
 *     --score-from 33` at each ratio, and ppl without --prompt warns that the policy
 *     compressed before none of the scored tokens.
 * The kvpc under test is $KVPC, else build/kvpc beside this test's directory; the build
 * cache goes to the temporary directory.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/rt_gguf.h"
#include "policy/rt_tuned.h"
#include "support/proc_run.h"
#include "support/tiny_model.h"
#include "support/check_run.h"

static char g_kvpc[PATH_MAX + 16];
static char g_tmp[PATH_MAX];
static char g_model[PATH_MAX + 16];
static char g_text[PATH_MAX + 16];
static char g_policy[PATH_MAX + 16];
static char g_model32[PATH_MAX + 16];  /* head_dim 32: room for the quantised tiers */
static char g_tiers[PATH_MAX + 16];    /* gate_tiers.kvp */
static char g_kivi[PATH_MAX + 16];     /* kivi_gate.kvp */
static char g_snap[PATH_MAX + 16];     /* gate_snap.kvp */
static char g_thresh[PATH_MAX + 16];   /* gate_thresh.kvp */

static const char POLICY[] =
	"# H2O with block-wise compression, sized for short texts (test_tune).\n"
	"policy gate_h2o {\n"
	"    param heavy = 10%  # heavy-hitter share of the context\n"
	"    param recent = 5%  # newest tokens always kept\n"
	"    param block = 16 tokens  # compress every block tokens\n"
	"    budget = heavy + recent\n"
	"    stat acc = sum(attn) over all\n"
	"    score = acc\n"
	"    group = sum\n"
	"    keep recent recent\n"
	"    compress per block block\n"
	"    positions = original\n"
	"}\n";

/* A precision policy with a byte budget (tiers by utility per byte, as h2o_tiers.kvp),
 * its guards small enough for 48 tokens at byte ratio 8. */
static const char TIERS[] =
	"# H2O scores with a byte budget spent by utility per byte (test_tune).\n"
	"policy gate_tiers {\n"
	"    param capacity = 50%  # share of an f16 full cache's bytes\n"
	"    param sinks = 1 tokens  # first tokens kept at the top tier\n"
	"    param recent = 2 tokens  # newest tokens kept at the top tier\n"
	"    budget = bytes(capacity)\n"
	"    stat acc = sum(attn) over all\n"
	"    score = acc\n"
	"    group = sum\n"
	"    keep sinks sinks\n"
	"    keep recent recent\n"
	"    precision = tiers(f16, q8, q4)\n"
	"    compress every 4 steps\n"
	"    positions = original\n"
	"}\n";

/* KIVI-style: nothing evicted, every entry older than the newest two at 4 bits. */
static const char KIVI[] =
	"# Quantisation only at 4 bits (test_tune).\n"
	"policy kivi_gate {\n"
	"    param residual = 2 tokens  # newest entries at the top tier\n"
	"    budget = 100%\n"
	"    score = pos\n"
	"    keep recent residual\n"
	"    precision = tiers(q4 = rest)\n"
	"    compress every 2 steps\n"
	"    positions = original\n"
	"}\n";

/* SnapKV (policies/snapkv.kvp) sized for 64 tokens: a prompt-end policy, which compresses
 * once after the prompt's last token. */
static const char SNAP[] =
	"# SnapKV sized for short prompts (test_tune).\n"
	"policy gate_snap {\n"
	"    param capacity = 16 entries  # budget, window included\n"
	"    param window = 2 tokens  # observation window: last w prompt queries\n"
	"    budget = capacity\n"
	"    stat obs = sum(attn) over prompt tail window\n"
	"    score = obs\n"
	"    pool = max(kernel = 3)\n"
	"    group = mean after pool\n"
	"    keep recent window\n"
	"    compress at prompt end\n"
	"    positions = original\n"
	"}\n";

/* A threshold budget (budget = threshold(level)): each KV head keeps the entries whose
 * accumulated attention (summed over its query heads) reaches the level. */
static const char THRESH[] =
	"# H2O's score with a threshold budget (test_tune).\n"
	"policy gate_thresh {\n"
	"    param level = 1  # keep the entries whose summed attention reaches it\n"
	"    budget = threshold(level)\n"
	"    stat acc = sum(attn) over all\n"
	"    score = acc\n"
	"    group = sum\n"
	"    keep recent 4 tokens\n"
	"    compress every 4 steps\n"
	"    positions = original\n"
	"}\n";

static const char TEXT[] =
	"The quick brown fox jumps over the lazy dog. A cache keeps what was computed so that it "
	"need not be computed again; a small cache must decide what to forget. Attention sinks "
	"are the first tokens of a text, which absorb the attention that has nowhere else to go. "
	"Heavy hitters are the tokens that receive most of the attention over time.\n";

/* Run argv (argv[0] a path) with stdout and stderr captured (heap strings, caller frees;
 * killed after 600 s, the suite's time limit). Returns the exit status (128 + signal when
 * killed). */
static int run(char *const argv[], char **out, char **err)
{
	int rc = proc_exec(argv, 600, out, err);
	ck_assert_msg(rc >= 0, "%s: could not be run", argv[0]);
	return rc;
}

/* kvpc tune on the text, 48 tokens, grid 2,4,8, limit max_kld, sidecar out (NULL: the
 * default next to the policy). Returns the sidecar's ratio; its KL in *kld_out. */
static double tune(double limit, const char *out, int passkey, double *kld_out)
{
	char *argv[32], max_kld[32];
	int k = 0;
	snprintf(max_kld, sizeof max_kld, "%.17g", limit);
	char *fixed[] = { g_kvpc, "tune", g_policy, "--model", g_model, "--text", g_text, "--ctx",
		          "48", "--ratio", "2,4,8", "--max-kld", max_kld, "--quiet" };
	for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
		argv[k++] = fixed[i];
	if (out) {
		argv[k++] = "--out";
		argv[k++] = (char *)out;
	}
	if (passkey) { /* a limit that always holds: exercises the passkey trial and the file */
		/* 320 tokens: the byte-level vocabulary spends 213 on the prompt's fixed parts */
		char *pk[] = { "--min-passkey", "0", "--lengths", "320", "--depths", "50" };
		for (size_t i = 0; i < sizeof pk / sizeof pk[0]; i++)
			argv[k++] = pk[i];
	}
	argv[k] = NULL;
	char *o, *e;
	int rc = run(argv, &o, &e);
	ck_assert_msg(rc == 0, "kvpc tune --max-kld %s: exit %d: %s%s", max_kld, rc, o, e);
	ck_assert_msg(strstr(o, "ratio") && strstr(o, "bytes x") && strstr(o, "<- chosen") &&
	              strstr(o, "budget in entries"), "no frontier table in entries: %s", o);
	free(o);
	free(e);
	char side[PATH_MAX + 16];
	if (out)
		snprintf(side, sizeof side, "%s", out);
	else
		ck_assert_int_eq(rt_tuned_path(g_policy, side, sizeof side), 0);
	rt_tuned t;
	rt_tuned_init(&t);
	rt_err err = { "" };
	ck_assert_msg(rt_tuned_read(side, &t, &err) == 0, "%s", err.msg);
	ck_assert_str_eq(t.policy, "gate_h2o");
	ck_assert_int_eq(t.n_texts, 1);
	ck_assert_str_eq(t.texts[0], g_text);
	ck_assert_int_eq(t.ctx, 48);
	ck_assert_int_eq(t.bytes, 0); /* gate_h2o has no byte budget: a ratio in entries */
	if (passkey)
		ck_assert_msg(t.min_passkey == 0 && t.passkey >= 0 && t.passkey_len == 320,
		              "passkey fields: %g %g %ld", t.min_passkey, t.passkey, t.passkey_len);
	double r = t.ratio;
	*kld_out = t.kld;
	rt_tuned_free(&t);
	return r;
}

/* BIN ppl on the same 48 tokens at ratio (NULL: the binary's default); returns kld_mean
 * and, in *ratio_out (may be NULL), the "ratio" the JSON reports. */
static double ppl_kld(const char *bin, const char *ratio, double *ratio_out)
{
	char *argv[] = { (char *)bin, "ppl", "--model", g_model, "--policy", "gate_h2o", "--text", g_text,
		         "--ctx", "48", "--json", "--quiet", ratio ? "--ratio" : NULL, (char *)ratio,
		         NULL };
	char *o, *e;
	int rc = run(argv, &o, &e);
	ck_assert_msg(rc == 0, "ppl: exit %d: %s", rc, e);
	const char *k = strstr(o, "\"kld_mean\":");
	ck_assert_msg(k != NULL, "no kld_mean: %s", o);
	double kld = strtod(k + 11, NULL);
	/* compression in bytes against f16 beside compression in entries: an f32 store holds
	 * 4 bytes per element, twice f16's, so bytes x = entries x / 2 */
	const char *cx = strstr(o, "\"compression\":"), *bx = strstr(o, "\"bytes_compression\":");
	ck_assert_msg(cx && bx, "no compression figures: %s", o);
	ck_assert_double_eq_tol(strtod(bx + 20, NULL), strtod(cx + 14, NULL) / 2, 1e-9);
	if (ratio_out) {
		const char *r = strstr(o, "\"ratio\":");
		ck_assert_ptr_nonnull(r);
		*ratio_out = strtod(r + 8, NULL);
	}
	free(o);
	free(e);
	return kld;
}

static int build(const char *out, int gate, char **err)
{
	/* --threads reaches the gate's `tune --gate` (a binary refusing it would exit 2) */
	char *argv[] = { g_kvpc, "build", g_policy, "-o", (char *)out, gate ? "--gate" : NULL,
		         "--threads", "1", NULL };
	char *o;
	int rc = run(argv, &o, err);
	free(o);
	return rc;
}

/* The independent measurements the limits come from: the policy built without a sidecar
 * (before any default sidecar exists) and `ppl --ratio R` at R = 2, 4, 8 into k[0..3),
 * which must grow with R (tune's bisection assumes it). *tight lies between k[0] and k[1]
 * (their geometric mean), *loose above k[2]. */
static void limits(double k[3], double *tight, double *loose)
{
	char bin[PATH_MAX + 16], *err;
	snprintf(bin, sizeof bin, "%s/plain", g_tmp);
	ck_assert_msg(build(bin, 0, &err) == 0, "kvpc build: %s", err);
	free(err);
	k[0] = ppl_kld(bin, "2", NULL);
	k[1] = ppl_kld(bin, "4", NULL);
	k[2] = ppl_kld(bin, "8", NULL);
	ck_assert_msg(0 < k[0] && k[0] < k[1] && k[1] < k[2], "ppl's mean KL at ratios 2, 4, 8: "
	              "%g, %g, %g (not growing with the ratio)", k[0], k[1], k[2]);
	*tight = sqrt(k[0] * k[1]);
	*loose = 2 * k[2];
}

START_TEST(loose_limit_picks_higher_ratio_and_ppl_agrees)
{
	char tight[PATH_MAX + 16], loose[PATH_MAX + 16];
	snprintf(tight, sizeof tight, "%s/tight.tune", g_tmp);
	snprintf(loose, sizeof loose, "%s/loose.tune", g_tmp);
	double k[3], lt, ll, kt, kl;
	limits(k, &lt, &ll); /* no default sidecar yet */
	const double rt = tune(lt, tight, 0, &kt), rl = tune(ll, loose, 1, &kl);
	/* ppl measured k[0] <= lt < k[1] (ratio 2 within the limit, the next grid ratio not)
	 * and k[2] <= ll */
	ck_assert_msg(rt == 2, "tight limit %g chose ratio %g; ppl: %g at 2, %g at 4", lt, rt,
	              k[0], k[1]);
	ck_assert_msg(rl == 8, "loose limit %g chose ratio %g; ppl: %g at 8", ll, rl, k[2]);
	/* the sidecar keeps 6 significant digits (runtime/policy/rt_tuned.c) */
	ck_assert_msg(fabs(kt - k[0]) <= 1e-5 * k[0] && fabs(kl - k[2]) <= 1e-5 * k[2],
	              "the sidecars' KL %g and %g, ppl's %g and %g", kt, kl, k[0], k[2]);
}
END_TEST

START_TEST(build_bakes_ratio_and_gate_refuses_tighter_limit)
{
	double k[3], lt, ll, kt;
	limits(k, &lt, &ll);
	const double r = tune(lt, NULL, 0, &kt); /* writes gate_h2o.tune beside the policy */
	ck_assert_msg(r == 2, "tight limit %g chose ratio %g", lt, r);
	char bin[PATH_MAX + 16], side[PATH_MAX + 16];
	snprintf(bin, sizeof bin, "%s/tuned", g_tmp);
	char *err, *o;
	ck_assert_msg(build(bin, 0, &err) == 0, "kvpc build: %s", err);
	/* the build says the default it bakes in */
	ck_assert_msg(strstr(err, "note: policy gate_h2o defaults to its tuned ratio 2 (from "),
	              "%s", err);
	free(err);
	char *info[] = { bin, "info", NULL };
	ck_assert_int_eq(run(info, &o, &err), 0);
	char want[64];
	snprintf(want, sizeof want, "tuned default ratio %g", r);
	ck_assert_msg(strstr(o, want), "info lacks '%s': %s", want, o);
	free(o);
	free(err);
	double used = 0;
	const double kld = ppl_kld(bin, NULL, &used);
	ck_assert_msg(used == r, "ppl without --ratio used ratio %g, tuned %g", used, r);
	ck_assert_msg(kld <= lt, "the tuned ratio's kld_mean %g exceeds the limit %g", kld, lt);

	/* the gate as tuned holds */
	snprintf(bin, sizeof bin, "%s/gated", g_tmp);
	int rc = build(bin, 1, &err);
	ck_assert_msg(rc == 0 && access(bin, X_OK) == 0, "kvpc build --gate: exit %d: %s", rc, err);
	free(err);

	/* a limit below the measured KL: refused, nothing written, the message names all */
	ck_assert_int_eq(rt_tuned_path(g_policy, side, sizeof side), 0);
	rt_tuned t;
	rt_tuned_init(&t);
	rt_err e = { "" };
	ck_assert_msg(rt_tuned_read(side, &t, &e) == 0, "%s", e.msg);
	t.max_kld = kld / 2;
	ck_assert_msg(rt_tuned_write(side, &t, NULL, &e) == 0, "%s", e.msg);
	rt_tuned_free(&t);
	snprintf(bin, sizeof bin, "%s/refused", g_tmp);
	rc = build(bin, 1, &err);
	ck_assert_msg(rc == 1, "kvpc build --gate with a tighter limit: exit %d: %s", rc, err);
	ck_assert_msg(access(bin, F_OK) != 0, "the refused build wrote %s", bin);
	char measured[32], limit[48];
	snprintf(measured, sizeof measured, "mean KL %.6f", kld); /* as ppl measured it */
	snprintf(limit, sizeof limit, "limit %g", kld / 2);
	ck_assert_msg(strstr(err, g_text) && strstr(err, measured) && strstr(err, limit) &&
	              strstr(err, "refused"), "the refusal lacks '%s', '%s', '%s': %s", g_text,
	              measured, limit, err);
	free(err);
}
END_TEST


/* What `BIN ppl --json` reports on the 48 tokens for one policy of the head_dim-32 model. */
typedef struct ppl_json {
	double kld, bytes_x, byte_ratio; /* byte_ratio -1 when the JSON has none */
	int ratio_null;                  /* "ratio":null */
} ppl_json;

/* BIN ppl --policy NAME on g_model32 at --byte-ratio R (NULL: none). Returns ppl's exit
 * status; *pj filled when 0. */
static int ppl_bytes(const char *bin, const char *name, const char *R, ppl_json *pj)
{
	char *argv[] = { (char *)bin, "ppl", "--model", g_model32, "--policy", (char *)name, "--text",
		         g_text, "--ctx", "48", "--json", "--quiet", R ? "--byte-ratio" : NULL,
		         (char *)R, NULL };
	char *o, *e;
	int rc = run(argv, &o, &e);
	if (rc == 0) {
		const char *k = strstr(o, "\"kld_mean\":"), *bx = strstr(o, "\"bytes_compression\":");
		const char *br = strstr(o, "\"byte_ratio\":");
		ck_assert_msg(k && bx, "ppl --json lacks kld_mean or bytes_compression: %s", o);
		pj->kld = strtod(k + 11, NULL);
		pj->bytes_x = strtod(bx + 20, NULL);
		pj->byte_ratio = br ? strtod(br + 13, NULL) : -1;
		pj->ratio_null = strstr(o, "\"ratio\":null") != NULL;
	}
	free(o);
	free(e);
	return rc;
}

/* kvpc build g_tiers [g_kivi] -o out [--gate]; returns the exit status, stderr in *err.
 * Two compiles in all (each ~1 s of CPU): both policies without a sidecar (the scan, the
 * byte search, KIVI, ab), and gate_tiers alone with its sidecar (cached for --gate). */
static int build2(const char *out, int kivi, int gate, char **err)
{
	char *argv[] = { g_kvpc, "build", g_tiers, "-o", (char *)out, gate ? "--gate" : NULL, NULL,
		         NULL };
	if (kivi) {
		argv[5] = g_kivi;
		argv[6] = gate ? "--gate" : NULL;
	}
	char *o;
	int rc = run(argv, &o, err);
	free(o);
	return rc;
}

static const double BYTE_GRID[] = { 2, 3, 4, 6, 8 };
#define N_BYTE_GRID 5

START_TEST(byte_budget_bisection_matches_scan_and_reaches_binary)
{
	char plain[PATH_MAX + 16], *err, *o;
	snprintf(plain, sizeof plain, "%s/plain_bytes", g_tmp);
	ck_assert_msg(build2(plain, 1, 0, &err) == 0, "kvpc build: %s", err);
	free(err);
	/* the brute-force scan: ppl at every byte ratio of the grid, a separate command each */
	ppl_json scan[N_BYTE_GRID];
	for (int i = 0; i < N_BYTE_GRID; i++) {
		char R[32];
		snprintf(R, sizeof R, "%g", BYTE_GRID[i]);
		ck_assert_int_eq(ppl_bytes(plain, "gate_tiers", R, &scan[i]), 0);
		ck_assert_msg(scan[i].byte_ratio == BYTE_GRID[i] && scan[i].ratio_null,
		              "ppl --byte-ratio %s reported byte_ratio %g", R, scan[i].byte_ratio);
		ck_assert_msg(i == 0 || scan[i].kld > scan[i - 1].kld, "ppl's mean KL at byte ratios "
		              "%g, %g: %g, %g (not growing)", BYTE_GRID[i - 1], BYTE_GRID[i],
		              scan[i - 1].kld, scan[i].kld);
	}
	/* a limit between the scan's KL at 3 and at 4: the highest byte ratio within it is 3 */
	const double limit = sqrt(scan[1].kld * scan[2].kld);
	int want = -1;
	for (int i = 0; i < N_BYTE_GRID; i++)
		if (scan[i].kld <= limit)
			want = i;
	ck_assert_int_eq(want, 1);
	char lim[32];
	snprintf(lim, sizeof lim, "%.17g", limit);
	/* the search (BIN tune, what kvpc tune runs) writes the sidecar kvpc build reads */
	char side[PATH_MAX + 16];
	ck_assert_int_eq(rt_tuned_path(g_tiers, side, sizeof side), 0);
	char *tune_argv[] = { plain, "tune", "--policy", "gate_tiers", "--model", g_model32,
		              "--text", g_text, "--ctx", "48", "--byte-ratio", "2,3,4,6,8",
		              "--max-kld", lim, "--quiet", "--out", side, NULL };
	int rc = run(tune_argv, &o, &err);
	ck_assert_msg(rc == 0, "tune: exit %d: %s%s", rc, o, err);
	ck_assert_msg(strstr(o, "budget in bytes") && strstr(o, "byte ratio") &&
	              strstr(o, "chosen: byte ratio 3,"), "frontier: %s", o);
	free(o);
	free(err);
	rt_tuned t;
	rt_tuned_init(&t);
	rt_err e = { "" };
	ck_assert_msg(rt_tuned_read(side, &t, &e) == 0, "%s", e.msg);
	ck_assert_msg(t.bytes == 1 && t.ratio == BYTE_GRID[want], "sidecar: %s %g",
	              t.bytes ? "byte_ratio" : "ratio", t.ratio);
	ck_assert_msg(fabs(t.kld - scan[want].kld) <= 1e-5 * scan[want].kld &&
	              fabs(t.bytes_x - scan[want].bytes_x) <= 1e-5 * scan[want].bytes_x,
	              "sidecar kld %g bytes_x %g, ppl's %g %g", t.kld, t.bytes_x, scan[want].kld,
	              scan[want].bytes_x);

	/* the default kind with the default grid: bytes; a flagless BIN tune says so */
	char *dflt[] = { plain, "tune", "--policy", "gate_tiers", "--model", g_model32, "--text",
		         g_text, "--ctx", "48", "--max-kld", "1e9", "--quiet", NULL };
	ck_assert_int_eq(run(dflt, &o, &err), 0);
	ck_assert_msg(strstr(o, "budget in bytes"), "default kind: %s", o);
	free(o);
	free(err);

	/* kvpc build bakes the byte ratio in: BIN ppl without a flag runs at it */
	char bin[PATH_MAX + 16];
	snprintf(bin, sizeof bin, "%s/tuned_bytes", g_tmp);
	ck_assert_msg(build2(bin, 0, 0, &err) == 0, "kvpc build: %s", err);
	free(err);
	char *info[] = { bin, "info", NULL };
	ck_assert_int_eq(run(info, &o, &err), 0);
	ck_assert_msg(strstr(o, "tuned default byte ratio 3"), "info: %s", o);
	free(o);
	free(err);
	ppl_json pj;
	ck_assert_int_eq(ppl_bytes(bin, "gate_tiers", NULL, &pj), 0);
	ck_assert_msg(pj.byte_ratio == 3 && pj.ratio_null && pj.bytes_x == scan[want].bytes_x &&
	              pj.kld == scan[want].kld, "ppl without a flag: byte_ratio %g bytes_x %g kld "
	              "%g; the scan at 3: %g %g", pj.byte_ratio, pj.bytes_x, pj.kld,
	              scan[want].bytes_x, scan[want].kld);

	/* the gate holds as tuned, and refuses a limit below the measured KL */
	snprintf(bin, sizeof bin, "%s/gated_bytes", g_tmp);
	rc = build2(bin, 0, 1, &err);
	ck_assert_msg(rc == 0 && access(bin, X_OK) == 0, "kvpc build --gate: exit %d: %s", rc, err);
	ck_assert_msg(strstr(err, "gate_tiers: byte ratio 3"), "gate line: %s", err);
	free(err);
	t.max_kld = scan[want].kld / 2;
	ck_assert_msg(rt_tuned_write(side, &t, NULL, &e) == 0, "%s", e.msg);
	rt_tuned_free(&t);
	snprintf(bin, sizeof bin, "%s/refused_bytes", g_tmp);
	rc = build2(bin, 0, 1, &err);
	ck_assert_msg(rc == 1 && access(bin, F_OK) != 0, "refused gate: exit %d: %s", rc, err);
	char measured[48];
	snprintf(measured, sizeof measured, "mean KL %.6f", scan[want].kld);
	ck_assert_msg(strstr(err, "at byte ratio 3") && strstr(err, measured) &&
	              strstr(err, "refused") && strstr(err, "kvpc: gate failed: "),
	              "the refusal lacks 'at byte ratio 3', '%s' or the command's name: %s",
	              measured, err);
	free(err);
	ck_assert_int_eq(unlink(side), 0);
}
END_TEST

START_TEST(kivi_fixed_byte_ratio_is_refused_and_usage_errors)
{
	char bin[PATH_MAX + 16], *err, *o;
	snprintf(bin, sizeof bin, "%s/plain_kivi", g_tmp);
	ck_assert_msg(build2(bin, 1, 0, &err) == 0, "kvpc build: %s", err);
	free(err);
	ppl_json own;
	ck_assert_int_eq(ppl_bytes(bin, "kivi_gate", NULL, &own), 0);
	ck_assert_msg(own.bytes_x > 1.6, "kivi_gate stores %gx fewer bytes", own.bytes_x);
	char out[PATH_MAX + 16];
	snprintf(out, sizeof out, "%s/kivi.tune", g_tmp);
	char *argv[] = { bin, "tune", "--policy", "kivi_gate", "--model", g_model32, "--text",
		         g_text, "--ctx", "48", "--byte-ratio", "1,1.5", "--max-kld", "1e9",
		         "--quiet", "--out", out, NULL };
	int rc = run(argv, &o, &err);
	char fixed[64];
	snprintf(fixed, sizeof fixed, "store %.2fx fewer bytes", own.bytes_x);
	ck_assert_msg(rc == 1 && strstr(err, "evicts nothing") && strstr(err, fixed) &&
	              strstr(o, "does not bind"), "kivi tune: exit %d: %s%s", rc, o, err);
	ck_assert_msg(access(out, F_OK) != 0, "a sidecar was written for a budget that does not bind");
	free(o);
	free(err);

	static const struct {
		const char *a, *b, *c, *want;
	} bad[] = {
		{ "--ratio", "2,4", "--byte-ratio=2", "give one of them" },
		{ "--bytes", "--entries", NULL, "--bytes and --entries" },
		{ "--bytes", "--ratio", "2,4", "give the grid in bytes as --byte-ratio LIST" },
		{ "--byte-ratio", "4,2", NULL, "--byte-ratio: '4,2' is not increasing" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *u[] = { bin, "tune", "--policy", "gate_tiers", "--model", g_model32, "--text",
			      g_text, "--max-kld", "0.1", (char *)bad[i].a, (char *)bad[i].b,
			      (char *)bad[i].c, NULL };
		rc = run(u, &o, &err);
		ck_assert_msg(rc == 2 && strstr(err, bad[i].want), "case %zu: exit %d: %s", i, rc, err);
		free(o);
		free(err);
	}

	/* ab over byte ratios: the same measurement as ppl's at that byte ratio */
	char json[PATH_MAX + 16];
	snprintf(json, sizeof json, "%s/ab.json", g_tmp);
	char *ab[] = { bin, "ab", "--model", g_model32, "--text", g_text, "--ctx", "48", "--a",
		       "gate_tiers", "--b", "kivi_gate", "--byte-ratio", "3", "--json", json,
		       "--quiet", "--resamples", "20", NULL };
	rc = run(ab, &o, &err);
	ck_assert_msg(rc == 0 && strstr(o, "compression ratio in bytes 3"), "ab: exit %d: %s%s",
	              rc, o, err);
	free(o);
	free(err);
	size_t len;
	rt_err e = { "" };
	char *js = rt_read_file(json, &len, &e);
	ck_assert_msg(js != NULL, "%s", e.msg);
	const char *a = strstr(js, "\"A\": {\"policy\": \"gate_tiers\"");
	const char *k = a ? strstr(a, "\"kld_mean\": ") : NULL;
	ck_assert_msg(strstr(js, "\"ratio_kind\": \"bytes\"") && k, "ab json: %s", js);
	ppl_json pj;
	ck_assert_int_eq(ppl_bytes(bin, "gate_tiers", "3", &pj), 0);
	/* ab prints 6 significant digits and runs its own chunking: equal to 1e-4 */
	ck_assert_double_eq_tol(strtod(k + 12, NULL), pj.kld, 1e-4 * pj.kld);
	free(js);
}
END_TEST

START_TEST(sidecar_round_trip_and_errors)
{
	char p[PATH_MAX + 16];
	ck_assert_int_eq(rt_tuned_path("dir/h2o.kvp", p, sizeof p), 0);
	ck_assert_str_eq(p, "dir/h2o.tune");
	ck_assert_int_eq(rt_tuned_path("plain", p, sizeof p), 0);
	ck_assert_str_eq(p, "plain.tune");
	ck_assert_int_eq(rt_tuned_path("dir/h2o.kvp", p, 8), -1);

	rt_tuned t, u;
	rt_tuned_init(&t);
	snprintf(t.policy, sizeof t.policy, "h2o");
	snprintf(t.source_hash, sizeof t.source_hash, "0123456789abcdef");
	t.ratio = 6;
	t.max_kld = 0.05;
	t.min_passkey = 1;
	t.passkey_len = 256;
	snprintf(t.depths, sizeof t.depths, "10,50,90");
	t.ctx = 512;
	t.model = strdup("/m/model.gguf");
	t.texts[t.n_texts++] = strdup("/t/a.txt");
	t.texts[t.n_texts++] = strdup("/t/b c.txt");
	t.kld = 0.0312;
	snprintf(p, sizeof p, "%s/rt.tune", g_tmp);
	rt_err e = { "" };
	ck_assert_msg(rt_tuned_write(p, &t, "a comment\nof two lines", &e) == 0, "%s", e.msg);
	rt_tuned_init(&u);
	ck_assert_msg(rt_tuned_read(p, &u, &e) == 0, "%s", e.msg);
	ck_assert_str_eq(u.policy, "h2o");
	ck_assert_str_eq(u.source_hash, "0123456789abcdef");
	ck_assert(u.ratio == 6 && u.max_kld == 0.05 && u.min_passkey == 1 && u.ctx == 512);
	ck_assert(u.passkey_len == 256 && u.n_texts == 2 && fabs(u.kld - 0.0312) < 1e-12);
	ck_assert_double_eq(u.passkey, -1);
	ck_assert_str_eq(u.depths, "10,50,90");
	ck_assert_str_eq(u.texts[1], "/t/b c.txt");
	ck_assert_str_eq(u.model, "/m/model.gguf");
	ck_assert(u.bytes == 0 && u.bytes_x == -1 && u.entries_x == -1);
	ck_assert_int_eq(u.fast, 0); /* the exact path, written as such */
	rt_tuned_free(&u);
	/* the fast path is recorded (the gate measures on it again) */
	t.fast = 1;
	ck_assert_msg(rt_tuned_write(p, &t, NULL, &e) == 0, "%s", e.msg);
	rt_tuned_init(&u);
	ck_assert_msg(rt_tuned_read(p, &u, &e) == 0, "%s", e.msg);
	ck_assert_int_eq(u.fast, 1);
	ck_assert(u.f32_act == 0 && u.chunk == 0);
	rt_tuned_free(&u);
	t.f32_act = 1; /* and its activations and chunk, which the gate passes on */
	t.chunk = 51;
	ck_assert_msg(rt_tuned_write(p, &t, NULL, &e) == 0, "%s", e.msg);
	rt_tuned_init(&u);
	ck_assert_msg(rt_tuned_read(p, &u, &e) == 0, "%s", e.msg);
	ck_assert(u.fast == 1 && u.f32_act == 1 && u.chunk == 51);
	rt_tuned_free(&u);
	t.fast = 0;
	t.f32_act = 0;
	t.chunk = 0;
	/* a byte budget: `byte_ratio` and the measured compressions */
	t.bytes = 1;
	t.ratio = 8;
	t.bytes_x = 8.01;
	t.entries_x = 2.5;
	ck_assert_msg(rt_tuned_write(p, &t, NULL, &e) == 0, "%s", e.msg);
	rt_tuned_init(&u);
	ck_assert_msg(rt_tuned_read(p, &u, &e) == 0, "%s", e.msg);
	ck_assert(u.bytes == 1 && u.ratio == 8 && u.bytes_x == 8.01 && u.entries_x == 2.5);
	rt_tuned_free(&u);
	rt_tuned_free(&t);

	static const struct {
		const char *text, *want;
	} bad[] = {
		{ "policy h2o\n# c\nbudget 3\n", ":3: unknown key 'budget'" },
		{ "policy h2o\npolicy h2o\n", ":2: policy given twice" },
		{ "ratio 0.5\n", ":1: ratio: expected a compression factor >= 1, got '0.5'" },
		{ "ctx 12.5\n", ":1: ctx: expected a token count >= 2" },
		{ "policy h2o\nsource_hash 0123456789abcdef\nratio 2\nmax_kld 0.1\nctx 64\n"
		  "model /m\n", "no 'text' line" },
		{ "policy h2o\nsource_hash 0123456789abcdef\nratio 2\nmax_kld 0.1\nctx 64\n"
		  "model /m\ntext /t\nmin_passkey 1\n", "min_passkey needs passkey_len and depths" },
		{ "ratio 2\nbyte_ratio 3\n", ":2: both ratio (entries) and byte_ratio (bytes)" },
		{ "byte_ratio 0\n", ":1: byte_ratio: expected a compression factor in bytes >= 1" },
		{ "path quick\n", ":1: path: expected exact, fast or fast-f32-act, got 'quick'" },
		{ "chunk 0\n", ":1: chunk: expected a token count in 1..65536, got '0'" },
		{ "policy h2o\nsource_hash 0123456789abcdef\nmax_kld 0.1\nctx 64\nmodel /m\n"
		  "text /t\n", "no 'ratio' or 'byte_ratio' line" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		FILE *f = fopen(p, "w");
		ck_assert_ptr_nonnull(f);
		fputs(bad[i].text, f);
		ck_assert_int_eq(fclose(f), 0);
		rt_tuned_init(&u);
		ck_assert_int_eq(rt_tuned_read(p, &u, &e), -1);
		ck_assert_msg(strstr(e.msg, bad[i].want) && !strncmp(e.msg, p, strlen(p)),
		              "case %zu: '%s' lacks '%s'", i, e.msg, bad[i].want);
		rt_tuned_free(&u);
	}
}
END_TEST

/* BIN ppl --policy gate_snap on the first 64 tokens at --ratio R with args (NULL-ended,
 * at most 4); kld_mean into *kld and scored_compressed into *comp; stderr returned (heap). */
static char *ppl_snap(const char *bin, const char *R, char *const *args, double *kld,
                      long *comp)
{
	char *argv[24] = { (char *)bin, "ppl", "--model", g_model, "--policy", "gate_snap", "--text",
		           g_text, "--ctx", "64", "--json", "--quiet", "--ratio", (char *)R };
	int k = 14;
	for (int i = 0; args && args[i] && i < 4; i++)
		argv[k++] = args[i];
	argv[k] = NULL;
	char *o, *e;
	int rc = run(argv, &o, &e);
	ck_assert_msg(rc == 0, "ppl gate_snap --ratio %s: exit %d: %s", R, rc, e);
	const char *kp = strstr(o, "\"kld_mean\":"), *cp = strstr(o, "\"scored_compressed\":");
	ck_assert_msg(kp && cp && strstr(o, "\"protocol\":\"prompt_end\""),
	              "ppl --json lacks kld_mean, scored_compressed or the prompt_end protocol: %s", o);
	*kld = strtod(kp + 11, NULL);
	*comp = strtol(cp + 20, NULL, 10);
	free(o);
	return e;
}

/* A prompt-end policy is measured on the tokens after a prompt. The independent reference
 * is `BIN ppl --ctx 64 --prompt 32 --score-from 33 --ratio R` (ppl's own options, not the
 * gate's protocol) at R = 2, 4, 8: tune and the gate must report those KLs, choose by
 * them and refuse a limit below the chosen ratio's. Without --prompt the policy compresses
 * after the last token: ppl must warn and count no scored token from a compressed cache
 * (the KL 0 the gate used to accept at every ratio). */
START_TEST(prompt_end_gate_measures_after_the_prompt)
{
	char bin[PATH_MAX + 16], *err, *o;
	snprintf(bin, sizeof bin, "%s/snap", g_tmp);
	char *b[] = { g_kvpc, "build", g_snap, "-o", bin, NULL };
	ck_assert_msg(run(b, &o, &err) == 0, "kvpc build gate_snap: %s", err);
	free(o);
	free(err);
	double k[3];
	long comp;
	const char *R[3] = { "2", "4", "8" };
	char *split[] = { "--prompt", "32", "--score-from", "33", NULL };
	for (int i = 0; i < 3; i++) {
		free(ppl_snap(bin, R[i], split, &k[i], &comp));
		ck_assert_msg(comp == 31, "ppl --prompt 32 --score-from 33: %ld of 31 scored tokens "
		              "from a compressed cache", comp);
	}
	ck_assert_msg(0 < k[0] && k[0] < k[1] && k[1] < k[2], "ppl's prompt-end KL at 2, 4, 8: %g, "
	              "%g, %g (not growing with the ratio)", k[0], k[1], k[2]);
	double k0;
	err = ppl_snap(bin, "4", NULL, &k0, &comp);
	ck_assert_msg(k0 == 0 && comp == 0 && strstr(err, "warning: policy gate_snap compressed "
	              "before none of the 63 scored tokens") && strstr(err, "--prompt 32 "
	              "--score-from 33"), "ppl without --prompt: KL %g, %ld compressed, stderr: %s",
	              k0, comp, err);
	free(err);

	/* tune: a limit between ppl's KL at 2 and at 4 chooses 2, at ppl's KL */
	const double tight = sqrt(k[0] * k[1]);
	char lim[32];
	snprintf(lim, sizeof lim, "%.17g", tight);
	char *t[] = { g_kvpc, "tune", g_snap, "--model", g_model, "--text", g_text, "--ctx", "64",
		      "--ratio", "2,4,8", "--max-kld", lim, "--quiet", NULL };
	int rc = run(t, &o, &err);
	ck_assert_msg(rc == 0 && strstr(o, "prompt-end protocol"), "kvpc tune gate_snap: exit %d: "
	              "%s%s", rc, o, err);
	free(o);
	free(err);
	char side[PATH_MAX + 16];
	ck_assert_int_eq(rt_tuned_path(g_snap, side, sizeof side), 0);
	rt_tuned tu;
	rt_tuned_init(&tu);
	rt_err e = { "" };
	ck_assert_msg(rt_tuned_read(side, &tu, &e) == 0, "%s", e.msg);
	ck_assert_msg(tu.ratio == 2 && fabs(tu.kld - k[0]) <= 1e-5 * k[0], "tune chose ratio %g at "
	              "KL %g; ppl --prompt 32: %g at 2, %g at 4 (limit %g)", tu.ratio, tu.kld, k[0],
	              k[1], tight);

	/* the gate at the tuned ratio with a limit below ppl's KL there: refused */
	tu.max_kld = k[0] / 2;
	ck_assert_msg(rt_tuned_write(side, &tu, NULL, &e) == 0, "%s", e.msg);
	rt_tuned_free(&tu);
	snprintf(bin, sizeof bin, "%s/snap_refused", g_tmp);
	char *g[] = { g_kvpc, "build", g_snap, "-o", bin, "--gate", NULL };
	rc = run(g, &o, &err);
	char measured[32];
	snprintf(measured, sizeof measured, "mean KL %.6f", k[0]);
	ck_assert_msg(rc == 1 && access(bin, F_OK) != 0 && strstr(err, measured) &&
	              strstr(err, "refused"), "kvpc build --gate, limit %g below ppl's %g: exit %d: "
	              "%s", k[0] / 2, k[0], rc, err);
	free(o);
	free(err);
}
END_TEST

/* A prompt-end policy's compression in tune's frontier is its prompt's (hand-computed: the
 * 32-token prompt of 64 tokens at ratio 4 keeps 8 entries, 4.00x in entries and, in the
 * exact path's f32 rows, 32 x 2 / (8 x 4) = 2.00x in bytes; the end, with the 32 tokens
 * after it, would read 64 / 40 = 1.60x). With a floor of 8 entries (`budget = capacity min
 * 8 entries`) the budget at ratio 8 (4 entries) is the floor's, as at ratio 4: both reach
 * 4.00x, so tune bakes 4, not 8, and says the higher ratio compresses no further; on a grid
 * where the floor holds every ratio (8, 16) there is no ratio to bake in: exit 1, no
 * sidecar. */
START_TEST(prompt_end_compression_and_floor_in_tune)
{
	char kvp[PATH_MAX + 32], side[PATH_MAX + 16], *o, *err;
	snprintf(kvp, sizeof kvp, "%s/gate_snap_floor.kvp", g_tmp);
	FILE *f = fopen(kvp, "w");
	ck_assert_ptr_nonnull(f);
	fputs("policy gate_snap_floor {\n    param capacity = 16 entries\n"
	      "    budget = capacity min 8 entries\n    stat obs = sum(attn) over prompt tail 2\n"
	      "    score = obs\n    keep recent 2\n    compress at prompt end\n}\n", f);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(rt_tuned_path(kvp, side, sizeof side), 0);
	char *t[] = { g_kvpc, "tune", kvp, "--model", g_model, "--text", g_text, "--ctx", "64",
		      "--ratio", "2,4,8", "--max-kld", "100", "--quiet", NULL };
	int rc = run(t, &o, &err);
	ck_assert_msg(rc == 0, "kvpc tune: exit %d: %s%s", rc, o, err);
	ck_assert_msg(strstr(o, "\n         4     2.00      4.00 "), "ratio 4's row: %s", o);
	ck_assert_msg(strstr(o, "chosen: ratio 4, ") && strstr(o, "up to 8, are within the limits "
	              "but compress no further"), "%s", o);
	free(o);
	free(err);
	rt_tuned tu;
	rt_tuned_init(&tu);
	rt_err e = { "" };
	ck_assert_msg(rt_tuned_read(side, &tu, &e) == 0 && tu.ratio == 4, "%s: ratio %g", e.msg,
	              tu.ratio);
	rt_tuned_free(&tu);
	unlink(side);
	char *t2[] = { g_kvpc, "tune", kvp, "--model", g_model, "--text", g_text, "--ctx", "64",
		       "--ratio", "8,16", "--max-kld", "100", "--quiet", NULL };
	rc = run(t2, &o, &err);
	ck_assert_msg(rc == 1 && strstr(err, "raised the budget on every text, so on texts of "
	              "this length the budget in force is theirs") && access(side, F_OK) != 0,
	              "exit %d: %s%s", rc, o, err);
	free(o);
	free(err);
	/* a floor that holds only on a short text does not make the ratio non-binding: with
	 * the long text (128-token prompt at --ctx 256: 32 and 16 entries at ratios 4 and 8,
	 * above the floor) beside a 26-byte one (the floor holds at both), ratio 8 is chosen */
	char shorttxt[PATH_MAX + 32];
	snprintf(shorttxt, sizeof shorttxt, "%s/short.txt", g_tmp);
	FILE *sf = fopen(shorttxt, "w");
	ck_assert(sf && fputs("A short note about caches.", sf) >= 0 && fclose(sf) == 0);
	char *t4[] = { g_kvpc, "tune", kvp, "--model", g_model, "--text", shorttxt, "--text",
		       g_text, "--ctx", "256", "--ratio", "4,8", "--max-kld", "100", "--quiet", NULL };
	rc = run(t4, &o, &err);
	ck_assert_msg(rc == 0 && strstr(o, "chosen: ratio 8, "), "exit %d: %s%s", rc, o, err);
	free(o);
	free(err);
	unlink(side);
	unlink(shorttxt);
	/* tuned on the fast path, the sidecar says so and the gate measures there again (f16
	 * rows: 32 x 2 / (8 x 2) = 4.00x in bytes at ratio 4, where the exact path's f32 rows
	 * gave 2.00x) */
	char *t3[] = { g_kvpc, "tune", kvp, "--model", g_model, "--text", g_text, "--ctx", "64",
		       "--ratio", "2,4", "--max-kld", "100", "--fast", "--quiet", NULL };
	rc = run(t3, &o, &err);
	ck_assert_msg(rc == 0 && strstr(o, "the fast path)"), "exit %d: %s%s", rc, o, err);
	free(o);
	free(err);
	char bin[PATH_MAX + 32];
	snprintf(bin, sizeof bin, "%s/snap_floor_gated", g_tmp);
	char *g[] = { g_kvpc, "build", kvp, "-o", bin, "--gate", NULL };
	rc = run(g, &o, &err);
	ck_assert_msg(rc == 0 && strstr(o, "gate holds: policy gate_snap_floor at ratio 4 (4.00x in "
	              "bytes, 4.00x in entries, the fast path)"), "exit %d: %s%s", rc, o, err);
	free(o);
	free(err);
	unlink(side);
	unlink(bin);
	unlink(kvp);
}
END_TEST

/* BIN ppl of gate_thresh on the 48 tokens with --set level=L: kld_mean, and the entries
 * compression into *cx. */
static double ppl_level(const char *bin, const char *level, double *cx)
{
	char set[64];
	snprintf(set, sizeof set, "level=%s", level);
	char *argv[] = { (char *)bin, "ppl", "--model", g_model, "--policy", "gate_thresh", "--text",
		         g_text, "--ctx", "48", "--json", "--quiet", "--set", set, NULL };
	char *o, *e;
	int rc = run(argv, &o, &e);
	ck_assert_msg(rc == 0, "ppl --set %s: exit %d: %s", set, rc, e);
	const char *k = strstr(o, "\"kld_mean\":"), *c = strstr(o, "\"compression\":");
	ck_assert_msg(k && c, "no kld_mean or compression: %s", o);
	const double kld = strtod(k + 11, NULL);
	*cx = strtod(c + 14, NULL);
	free(o);
	free(e);
	return kld;
}

/* kvpc tune --param level=GRID on gate_thresh with limit; the chosen level from the line
 * "chosen: level X", and no sidecar written (a level is a parameter). */
static double tune_level(const char *grid, double limit)
{
	char max_kld[32], param[96];
	snprintf(max_kld, sizeof max_kld, "%.17g", limit);
	snprintf(param, sizeof param, "level=%s", grid);
	char *argv[] = { g_kvpc, "tune", g_thresh, "--model", g_model, "--text", g_text, "--ctx",
		         "48", "--param", param, "--max-kld", max_kld, "--quiet", NULL };
	char *o, *e;
	int rc = run(argv, &o, &e);
	ck_assert_msg(rc == 0, "kvpc tune --param %s --max-kld %s: exit %d: %s%s", param, max_kld,
	              rc, o, e);
	const char *c = strstr(o, "chosen: level ");
	ck_assert_msg(c && strstr(o, "searching parameter level") && strstr(o, "no sidecar"),
	              "no choice of the level: %s", o);
	const double v = strtod(c + 14, NULL);
	free(o);
	free(e);
	char side[PATH_MAX + 16];
	ck_assert_int_eq(rt_tuned_path(g_thresh, side, sizeof side), 0);
	ck_assert_msg(access(side, F_OK) != 0, "%s was written", side);
	return v;
}

/* The threshold level searched by tune (--param): the independent measurements are `BIN
 * ppl --set level=L` at L = 0.5, 1, 2 (a higher level keeps fewer entries: the compression
 * in entries and the mean KL must grow with it); a limit between the KLs at 0.5 and 1
 * chooses 0.5, one above the KL at 2 chooses 2. Usage errors: an unknown parameter, a
 * grid that does not increase, --param with --ratio; sema: a threshold with tiers. */
START_TEST(threshold_level_tuned_against_ppl)
{
	char bin[PATH_MAX + 16], *err;
	snprintf(bin, sizeof bin, "%s/thresh", g_tmp);
	char *bargv[] = { g_kvpc, "build", g_thresh, "-o", bin, NULL }, *o;
	ck_assert_msg(run(bargv, &o, &err) == 0, "kvpc build: %s", err);
	free(o);
	free(err);
	static const char *const lv[3] = { "0.5", "1", "2" };
	double k[3], cx[3];
	for (int i = 0; i < 3; i++)
		k[i] = ppl_level(bin, lv[i], &cx[i]);
	ck_assert_msg(0 < k[0] && k[0] < k[1] && k[1] < k[2] && cx[0] < cx[1] && cx[1] < cx[2],
	              "ppl at levels 0.5, 1, 2: mean KL %g %g %g, compression %g %g %g (not growing)",
	              k[0], k[1], k[2], cx[0], cx[1], cx[2]);
	ck_assert_double_eq(tune_level("0.5,1,2", sqrt(k[0] * k[1])), 0.5);
	ck_assert_double_eq(tune_level("0.5,1,2", 2 * k[2]), 2);
	char *u1[] = { g_kvpc, "tune", g_thresh, "--model", g_model, "--text", g_text, "--max-kld",
		       "1", "--param", "levle=1,2", NULL };
	char *e1;
	ck_assert_int_eq(run(u1, &o, &e1), 2);
	ck_assert_msg(strstr(e1, "has no parameter 'levle'"), "%s", e1);
	free(o);
	free(e1);
	u1[10] = "level=2,1";
	ck_assert_int_eq(run(u1, &o, &e1), 2);
	ck_assert_msg(strstr(e1, "is not increasing"), "%s", e1);
	free(o);
	free(e1);
}
END_TEST

static Suite *tune_suite(void)
{
	Suite *s = suite_create("tune");
	TCase *tc = tcase_create("gate");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, sidecar_round_trip_and_errors);
	tcase_add_test(tc, loose_limit_picks_higher_ratio_and_ppl_agrees);
	tcase_add_test(tc, build_bakes_ratio_and_gate_refuses_tighter_limit);
	tcase_add_test(tc, byte_budget_bisection_matches_scan_and_reaches_binary);
	tcase_add_test(tc, kivi_fixed_byte_ratio_is_refused_and_usage_errors);
	tcase_add_test(tc, prompt_end_gate_measures_after_the_prompt);
	tcase_add_test(tc, prompt_end_compression_and_floor_in_tune);
	tcase_add_test(tc, threshold_level_tuned_against_ppl);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	snprintf(g_tmp, sizeof g_tmp, "/tmp/kvpc_test_tune_XXXXXX");
	if (!mkdtemp(g_tmp)) {
		perror("mkdtemp");
		return EXIT_FAILURE;
	}
	if (proc_bin_path("kvpc", "KVPC", g_kvpc, sizeof g_kvpc) != 0)
		return EXIT_FAILURE;
	snprintf(g_model, sizeof g_model, "%s/tiny.gguf", g_tmp);
	tiny_model_cfg c = { .n_layer = 2, .n_embd = 72, .n_head = 9, .n_head_kv = 3, .n_ff = 96,
		             .n_vocab = 300, .n_ctx = 1024, .rope_base = 10000, .seed = 7,
		             .wtype = RT_GGML_F32 };
	if (tiny_model_write(&c, g_model) != 0) {
		fprintf(stderr, "test_tune: cannot write the model under %s\n", g_tmp);
		return EXIT_FAILURE;
	}
	snprintf(g_model32, sizeof g_model32, "%s/tiny32.gguf", g_tmp);
	c.n_embd = 288; /* 9 heads of 32 */
	if (tiny_model_write(&c, g_model32) != 0) {
		fprintf(stderr, "test_tune: cannot write the model under %s\n", g_tmp);
		return EXIT_FAILURE;
	}
	char cache[PATH_MAX + 16];
	snprintf(cache, sizeof cache, "%s/cache", g_tmp);
	setenv("KVPC_CACHE", cache, 1);
	snprintf(g_text, sizeof g_text, "%s/text.txt", g_tmp);
	snprintf(g_policy, sizeof g_policy, "%s/gate_h2o.kvp", g_tmp);
	snprintf(g_tiers, sizeof g_tiers, "%s/gate_tiers.kvp", g_tmp);
	snprintf(g_kivi, sizeof g_kivi, "%s/kivi_gate.kvp", g_tmp);
	snprintf(g_snap, sizeof g_snap, "%s/gate_snap.kvp", g_tmp);
	snprintf(g_thresh, sizeof g_thresh, "%s/gate_thresh.kvp", g_tmp);
	char cmd[4 * PATH_MAX];
	FILE *f = fopen(g_text, "w"), *pf = fopen(g_policy, "w");
	int bad = !f || fputs(TEXT, f) < 0 || fclose(f) != 0;
	FILE *tf = fopen(g_tiers, "w"), *kf = fopen(g_kivi, "w");
	bad |= !tf || fputs(TIERS, tf) < 0 || fclose(tf) != 0;
	bad |= !kf || fputs(KIVI, kf) < 0 || fclose(kf) != 0;
	FILE *sf = fopen(g_snap, "w");
	bad |= !sf || fputs(SNAP, sf) < 0 || fclose(sf) != 0;
	FILE *hf = fopen(g_thresh, "w");
	bad |= !hf || fputs(THRESH, hf) < 0 || fclose(hf) != 0;
	if (!pf || fputs(POLICY, pf) < 0 || fclose(pf) != 0 || bad) {
		fprintf(stderr, "test_tune: cannot write the text or the policy under %s\n", g_tmp);
		return EXIT_FAILURE;
	}
	int failed = check_run(tune_suite());
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
	if (!failed && system(cmd) != 0)
		fprintf(stderr, "test_tune: could not remove %s\n", g_tmp);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
