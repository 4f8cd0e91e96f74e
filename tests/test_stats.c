/*
 * test_stats: the A/B statistics (runtime/eval/rt_stats.c).
 *
 * Hand-computed KL divergences of small distributions; per-token KL, NLL and top-1 of
 * random float32 logit rows, percentiles/medians and a 250-token run summary against
 * numpy, the PRNG streams and the paired (block) bootstrap intervals against a pure-Python
 * re-implementation of the same PRNG and algorithm (tests/golden/stats/golden.txt, written
 * by tests/golden/stats/make_golden.py); exact-constant intervals, coverage of the mean,
 * the verdict and its error cases; the Politis-White block length against the same
 * script (including real autocorrelated NLL differences, tests/golden/stats/d_real.txt)
 * and against the closed form for a long AR(1) series; block intervals wider than iid
 * ones on autocorrelated data; the JSON fragments.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/rt_sample.h"
#include "eval/rt_stats.h"
#include "support/check_run.h"

#define GOLDEN "tests/golden/stats/golden.txt"

/* ---- golden file ----------------------------------------------------------------- */

typedef struct gvec {
	char name[32];
	int n;
	double *v;
} gvec;

static gvec g_vecs[32];
static int g_nvec;

static char *next_tok(char **p)
{
	return strtok_r(NULL, " \n", p);
}

static double tok_d(char **p)
{
	char *t = next_tok(p);
	ck_assert_ptr_nonnull(t);
	return strtod(t, NULL);
}

static long long tok_ll(char **p)
{
	char *t = next_tok(p);
	ck_assert_ptr_nonnull(t);
	return strtoll(t, NULL, 10);
}

static unsigned long long tok_ull(char **p)
{
	char *t = next_tok(p);
	ck_assert_ptr_nonnull(t);
	return strtoull(t, NULL, 10);
}

static const gvec *find_vec(const char *name)
{
	for (int i = 0; i < g_nvec; i++)
		if (!strcmp(g_vecs[i].name, name))
			return &g_vecs[i];
	ck_abort_msg("golden vector %s missing", name);
	return NULL;
}

/* Read every line; call fn(kind, rest-of-line state) for each. */
typedef void (*line_fn)(const char *kind, char **sp, FILE *f, void *ctx);

static void for_each_line(line_fn fn, void *ctx)
{
	FILE *f = fopen(GOLDEN, "r");
	ck_assert_msg(f != NULL, "cannot open %s (run tests from the repo root)", GOLDEN);
	char *line = NULL;
	size_t cap = 0;
	while (getline(&line, &cap, f) > 0) {
		char *sp;
		char *kind = strtok_r(line, " \n", &sp);
		if (kind)
			fn(kind, &sp, f, ctx);
	}
	free(line);
	fclose(f);
}

static void load_vec_fn(const char *kind, char **sp, FILE *f, void *ctx)
{
	(void)f;
	(void)ctx;
	if (strcmp(kind, "vec"))
		return;
	ck_assert_int_lt(g_nvec, 32);
	gvec *g = &g_vecs[g_nvec++];
	snprintf(g->name, sizeof(g->name), "%s", next_tok(sp));
	g->n = (int)tok_ll(sp);
	g->v = malloc((size_t)g->n * sizeof(double));
	for (int i = 0; i < g->n; i++)
		g->v[i] = tok_d(sp);
}

static void load_vecs(void)
{
	if (g_nvec == 0)
		for_each_line(load_vec_fn, NULL);
	ck_assert_int_ge(g_nvec, 9);
}

static int close_rel(double a, double b, double tol)
{
	return fabs(a - b) <= tol * fmax(1.0, fmax(fabs(a), fabs(b)));
}

#define ASSERT_CLOSE(a, b, tol)                                                        \
	ck_assert_msg(close_rel((a), (b), (tol)), "%s = %.17g, expected %.17g", #a,     \
	              (double)(a), (double)(b))

/* ---- hand-computed KL ------------------------------------------------------------ */

/* rt_sample's draws against hand-computed distributions over four tokens with logits
 * {0, ln 3, ln 2, ln 2} (softmax 1/8, 3/8, 2/8, 2/8): each frequency of 40000 draws within
 * 0.012 (about five standard errors), the truncations' excluded tokens never drawn, and
 * the greedy cases (temperature 0, top-k 1) the argmax, lowest id on ties. */
static void draws(double temp, double top_p, int top_k, uint64_t seed, double *freq)
{
	const float lg[4] = { 0.0f, logf(3.0f), logf(2.0f), logf(2.0f) };
	rt_sampler s;
	ck_assert_int_eq(rt_sampler_init(&s, 4, temp, top_p, top_k, seed), 0);
	for (int i = 0; i < 4; i++)
		freq[i] = 0;
	for (int n = 0; n < 40000; n++) {
		const int32_t t = rt_sample(&s, lg);
		ck_assert(t >= 0 && t < 4);
		freq[t] += 1.0 / 40000;
	}
	rt_sampler_free(&s);
}

static void want(const double *freq, double a, double b, double c, double d)
{
	const double w[4] = { a, b, c, d };
	for (int i = 0; i < 4; i++)
		ck_assert_msg(w[i] == 0 ? freq[i] == 0 : fabs(freq[i] - w[i]) < 0.012,
		              "token %d: drawn %.4f, expected %.4f", i, freq[i], w[i]);
}

START_TEST(test_sampler_hand)
{
	double f[4], g[4];
	draws(1.0, 1.0, 0, 1, f);
	want(f, 1 / 8.0, 3 / 8.0, 2 / 8.0, 2 / 8.0);
	draws(0.5, 1.0, 0, 2, f); /* exp(2 logit): 1, 9, 4, 4 */
	want(f, 1 / 18.0, 9 / 18.0, 4 / 18.0, 4 / 18.0);
	draws(1.0, 1.0, 2, 3, f); /* the two best: id 1, and id 2 of the tie (lower id) */
	want(f, 0, 3 / 5.0, 2 / 5.0, 0);
	draws(1.0, 0.5, 0, 4, f); /* 3/8 < 0.5 <= 3/8 + 2/8: ids 1 and 2, renormalised */
	want(f, 0, 3 / 5.0, 2 / 5.0, 0);
	draws(0.0, 1.0, 0, 5, f);
	want(f, 0, 1, 0, 0);
	draws(1.5, 1.0, 1, 6, f);
	want(f, 0, 1, 0, 0);
	/* the seed makes the draws: the same one repeats them exactly, another differs */
	draws(1.0, 1.0, 0, 7, f);
	draws(1.0, 1.0, 0, 7, g);
	ck_assert(memcmp(f, g, sizeof f) == 0);
	draws(1.0, 1.0, 0, 8, g);
	ck_assert(memcmp(f, g, sizeof f) != 0);
}
END_TEST

START_TEST(test_kl_hand)
{
	rt_err err = {0};
	rt_tok_cmp c;
	/* P = (1/2, 1/2), Q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3). */
	float p2[2] = {0.0f, 0.0f};
	float q2[2] = {0.0f, (float)log(3.0)};
	ck_assert_int_eq(rt_stats_token_cmp(p2, q2, 2, 1, &c, &err), 0);
	ASSERT_CLOSE(c.kld, 0.5 * log(2.0) + 0.5 * log(2.0 / 3.0), 1e-7);
	ASSERT_CLOSE(c.nll_p, log(2.0), 1e-12);
	ASSERT_CLOSE(c.prob_q, 0.75, 1e-7);
	/* tie rule: equal logits keep the lower id */
	ck_assert_int_eq(c.top_p, 0);
	ck_assert_int_eq(c.top_q, 1);

	/* P uniform over 4, Q = (1/2, 1/6, 1/6, 1/6): KL = 1/4 ln(1/2) + 3/4 ln(3/2). */
	float p4[4] = {7.0f, 7.0f, 7.0f, 7.0f};
	float q4[4] = {(float)log(3.0), 0.0f, 0.0f, 0.0f};
	ck_assert_int_eq(rt_stats_token_cmp(p4, q4, 4, 2, &c, &err), 0);
	ASSERT_CLOSE(c.kld, 0.25 * log(0.5) + 0.75 * log(1.5), 1e-7);
	ASSERT_CLOSE(c.prob_p, 0.25, 1e-12);
	ASSERT_CLOSE(c.prob_q, 1.0 / 6.0, 1e-7);

	/* Identical rows: KL exactly 0 (never negative), same top. Shift invariance. */
	float a[3] = {1.5f, -2.0f, 0.25f}, b[3] = {101.5f, 98.0f, 100.25f};
	ck_assert_int_eq(rt_stats_token_cmp(a, a, 3, 0, &c, &err), 0);
	ck_assert(c.kld == 0.0);
	ck_assert_int_eq(c.top_p, c.top_q);
	ck_assert_int_eq(rt_stats_token_cmp(a, b, 3, 0, &c, &err), 0);
	ck_assert(c.kld < 1e-12);

	/* Huge logits do not overflow. */
	float h1[2] = {1e30f, -1e30f}, h2[2] = {-1e30f, 1e30f};
	ck_assert_int_eq(rt_stats_token_cmp(h1, h1, 2, 1, &c, &err), 0);
	ck_assert(isfinite(c.nll_p));
	ck_assert(c.kld == 0.0);
	ck_assert_int_eq(rt_stats_token_cmp(h1, h2, 2, 0, &c, &err), 0);
	ASSERT_CLOSE(c.kld, 2e30, 1e-6);
}
END_TEST

START_TEST(test_kl_errors)
{
	rt_err err = {0};
	rt_tok_cmp c;
	float p[2] = {0, 0}, bad[2] = {0, NAN};
	ck_assert_int_eq(rt_stats_token_cmp(p, p, 2, 2, &c, &err), -1);
	ck_assert_str_eq(err.msg, "logits: target token 2 out of range [0, 2)");
	ck_assert_int_eq(rt_stats_token_cmp(p, p, 2, -1, &c, &err), -1);
	ck_assert_int_eq(rt_stats_token_cmp(p, p, 0, 0, &c, &err), -1);
	ck_assert_str_eq(err.msg, "logits: vocabulary size 0 must be positive");
	ck_assert_int_eq(rt_stats_token_cmp(p, bad, 2, 0, &c, &err), -1);
	ck_assert_str_eq(err.msg, "logits: non-finite value in the candidate row");
	bad[1] = INFINITY;
	ck_assert_int_eq(rt_stats_token_cmp(bad, p, 2, 0, &c, &err), -1);
	ck_assert_str_eq(err.msg, "logits: non-finite value in the reference row");
}
END_TEST

/* ---- golden: KL rows ---------------------------------------------------------------- */

static void kl_fn(const char *kind, char **sp, FILE *f, void *ctx)
{
	(void)f;
	if (strcmp(kind, "kl"))
		return;
	int V = (int)tok_ll(sp), T = (int)tok_ll(sp);
	double kld = tok_d(sp), np_ = tok_d(sp), nq = tok_d(sp);
	int tp = (int)tok_ll(sp), tq = (int)tok_ll(sp);
	float *p = malloc((size_t)V * sizeof(float)), *q = malloc((size_t)V * sizeof(float));
	for (int i = 0; i < V; i++)
		p[i] = (float)tok_d(sp);
	for (int i = 0; i < V; i++)
		q[i] = (float)tok_d(sp);
	rt_err err = {0};
	rt_tok_cmp c;
	ck_assert_int_eq(rt_stats_token_cmp(p, q, V, T, &c, &err), 0);
	ck_assert_msg(fabs(c.kld - kld) <= 1e-12 * fmax(1.0, kld), "V=%d kld %.17g vs %.17g", V,
	              c.kld, kld);
	ASSERT_CLOSE(c.nll_p, np_, 1e-12);
	ASSERT_CLOSE(c.nll_q, nq, 1e-12);
	ck_assert_int_eq(c.top_p, tp);
	ck_assert_int_eq(c.top_q, tq);
	free(p);
	free(q);
	(*(int *)ctx)++;
}

START_TEST(test_kl_golden)
{
	int n = 0;
	for_each_line(kl_fn, &n);
	ck_assert_int_eq(n, 15);
}
END_TEST

/* ---- golden: percentiles and medians ------------------------------------------------ */

static void pct_fn(const char *kind, char **sp, FILE *f, void *ctx)
{
	(void)f;
	int is_pct = !strcmp(kind, "pct"), is_med = !strcmp(kind, "median");
	if (!is_pct && !is_med)
		return;
	const gvec *g = find_vec(next_tok(sp));
	double *v = malloc((size_t)g->n * sizeof(double));
	memcpy(v, g->v, (size_t)g->n * sizeof(double));
	rt_stats_sort(v, g->n);
	for (int i = 1; i < g->n; i++)
		ck_assert(v[i - 1] <= v[i]);
	if (is_pct) {
		double fr = tok_d(sp), want = tok_d(sp);
		double got = rt_stats_percentile_sorted(v, g->n, fr);
		ck_assert_msg(close_rel(got, want, 1e-13), "%s p%g = %.17g, numpy %.17g", g->name,
		              fr * 100, got, want);
	} else {
		double want = tok_d(sp);
		ASSERT_CLOSE(rt_stats_median_sorted(v, g->n), want, 1e-15);
		ASSERT_CLOSE(rt_stats_percentile_sorted(v, g->n, 0.5), want, 1e-15);
	}
	free(v);
	(*(int *)ctx)++;
}

START_TEST(test_percentile_golden)
{
	load_vecs();
	int n = 0;
	for_each_line(pct_fn, &n);
	ck_assert_int_eq(n, 6 * 12);
	/* hand case: v = {1,2,3,4}, p90 = 3 + 0.7 * 1 */
	double v[4] = {1, 2, 3, 4};
	ASSERT_CLOSE(rt_stats_percentile_sorted(v, 4, 0.9), 3.7, 1e-15);
	ck_assert(rt_stats_percentile_sorted(v, 4, -1.0) == 1.0);
	ck_assert(rt_stats_percentile_sorted(v, 4, 2.0) == 4.0);
	ck_assert(rt_stats_median_sorted(v, 4) == 2.5);
}
END_TEST

/* ---- golden: run summary ------------------------------------------------------------ */

START_TEST(test_summary_golden)
{
	FILE *f = fopen(GOLDEN, "r");
	ck_assert_ptr_nonnull(f);
	char *line = NULL;
	size_t cap = 0;
	int found = 0;
	rt_kld_acc acc;
	rt_kld_acc_init(&acc);
	rt_kld_acc_reserve(&acc, 250);
	double *const reserved = acc.kld;
	while (getline(&line, &cap, f) > 0) {
		if (strncmp(line, "sum ", 4))
			continue;
		found = 1;
		char *sp;
		strtok_r(line, " \n", &sp);
		int NT = (int)tok_ll(&sp), V = (int)tok_ll(&sp);
		double want[7];
		for (int i = 0; i < 7; i++)
			want[i] = tok_d(&sp);
		float p[64], q[64];
		ck_assert_int_le(V, 64);
		char *row = NULL;
		size_t rcap = 0;
		for (int r = 0; r < NT; r++) {
			ck_assert(getline(&row, &rcap, f) > 0);
			char *rp;
			ck_assert_str_eq(strtok_r(row, " \n", &rp), "row");
			int T = (int)tok_ll(&rp);
			for (int i = 0; i < V; i++)
				p[i] = (float)tok_d(&rp);
			for (int i = 0; i < V; i++)
				q[i] = (float)tok_d(&rp);
			rt_tok_cmp c;
			rt_err err = {0};
			ck_assert_int_eq(rt_stats_token_cmp(p, q, V, T, &c, &err), 0);
			rt_kld_acc_add(&acc, &c);
		}
		free(row);
		rt_kld_summary s;
		rt_kld_acc_summary(&acc, &s);
		ck_assert_int_eq(s.n, NT);
		ck_assert_ptr_eq(acc.kld, reserved); /* reserved: no reallocation while adding */
		ASSERT_CLOSE(s.kld_mean, want[0], 1e-12);
		ASSERT_CLOSE(s.kld_median, want[1], 1e-12);
		ASSERT_CLOSE(s.kld_p99, want[2], 1e-12);
		ASSERT_CLOSE(s.kld_max, want[3], 1e-12);
		ASSERT_CLOSE(s.ppl_ratio, want[4], 1e-12);
		ASSERT_CLOSE(s.same_top1, want[5], 1e-15);
		ASSERT_CLOSE(s.rms_dp, want[6], 1e-12);
		ck_assert(s.kld_min <= s.kld_median && s.kld_median <= s.kld_p90);
		ck_assert(s.kld_p90 <= s.kld_p95 && s.kld_p95 <= s.kld_p99);
		ck_assert(s.kld_p99 <= s.kld_p999 && s.kld_p999 <= s.kld_max);
		ck_assert(s.kld_mean_err > 0);
		/* the accumulator's order is kept (summary sorts a copy) */
		ck_assert(acc.kld[0] != s.kld_min || acc.kld[1] != s.kld_min);
		rt_kld_acc_reset(&acc);
		ck_assert_int_eq(acc.n, 0);
		rt_kld_acc_summary(&acc, &s);
		ck_assert_int_eq(s.n, 0);
		ck_assert(s.kld_mean == 0.0);
	}
	free(line);
	fclose(f);
	rt_kld_acc_free(&acc);
	ck_assert(found);
}
END_TEST

/* ---- PRNG ------------------------------------------------------------------------------ */

static void rng_fn(const char *kind, char **sp, FILE *f, void *ctx)
{
	(void)f;
	int is_rng = !strcmp(kind, "rng"), is_below = !strcmp(kind, "below");
	if (!is_rng && !is_below)
		return;
	rt_rng r;
	rt_rng_seed(&r, tok_ull(sp));
	unsigned long long bound = is_below ? tok_ull(sp) : 0;
	int n = (int)tok_ll(sp);
	for (int i = 0; i < n; i++) {
		uint64_t want = tok_ull(sp);
		uint64_t got = is_rng ? rt_rng_next(&r) : rt_rng_below(&r, bound);
		ck_assert_msg(got == want, "%s #%d: %llu vs %llu", kind, i, (unsigned long long)got,
		              (unsigned long long)want);
	}
	(*(int *)ctx)++;
}

START_TEST(test_rng_golden)
{
	int n = 0;
	for_each_line(rng_fn, &n);
	ck_assert_int_eq(n, 8);
	/* splitmix64(0) first output, a published constant of the reference code */
	rt_rng r;
	rt_rng_seed(&r, 0);
	ck_assert(r.s[0] == 0xe220a8397b1dcdafULL);
	/* rt_rng_below covers its range roughly uniformly */
	int hist[10] = {0};
	rt_rng_seed(&r, 3);
	for (int i = 0; i < 100000; i++)
		hist[rt_rng_below(&r, 10)]++;
	for (int i = 0; i < 10; i++)
		ck_assert_msg(hist[i] > 9500 && hist[i] < 10500, "bucket %d: %d", i, hist[i]);
}
END_TEST

/* ---- bootstrap ------------------------------------------------------------------------- */

static void boot_fn(const char *kind, char **sp, FILE *f, void *ctx)
{
	(void)f;
	if (strcmp(kind, "boot"))
		return;
	const gvec *g = find_vec(next_tok(sp));
	int B = (int)tok_ll(sp);
	int64_t L = tok_ll(sp);
	double level = tok_d(sp);
	uint64_t seed = tok_ull(sp);
	double mean = tok_d(sp), lo = tok_d(sp), hi = tok_d(sp);
	rt_boot_ci ci;
	rt_err err = {0};
	ck_assert_int_eq(rt_bootstrap_mean_ci(g->v, g->n, B, L, level, seed, NULL, &ci, &err), 0);
	/* same PRNG, same operation order (C11 mode: no FMA contraction): bit-identical */
	ck_assert_msg(close_rel(ci.mean, mean, 0), "%s mean %.17g vs %.17g", g->name,
	              ci.mean, mean);
	ck_assert_msg(close_rel(ci.lo, lo, 0), "%s L=%lld lo %.17g vs %.17g", g->name,
	              (long long)L, ci.lo, lo);
	ck_assert_msg(close_rel(ci.hi, hi, 0), "%s L=%lld hi %.17g vs %.17g", g->name,
	              (long long)L, ci.hi, hi);
	/* the interval covers the sample mean (all golden samples are well-behaved) */
	ck_assert(ci.lo <= ci.mean && ci.mean <= ci.hi);
	ck_assert_int_eq(ci.n_resamples, B);
	/* a caller work buffer gives the same result */
	double *w = malloc((size_t)B * sizeof(double));
	rt_boot_ci ci2;
	ck_assert_int_eq(rt_bootstrap_mean_ci(g->v, g->n, B, L, level, seed, w, &ci2, &err), 0);
	ck_assert(ci2.lo == ci.lo && ci2.hi == ci.hi);
	free(w);
	(*(int *)ctx)++;
}

START_TEST(test_bootstrap_golden)
{
	load_vecs();
	int n = 0;
	for_each_line(boot_fn, &n);
	ck_assert_int_eq(n, 6);
}
END_TEST

START_TEST(test_bootstrap_constant)
{
	rt_err err = {0};
	rt_boot_ci ci;
	double d[777];
	for (int i = 0; i < 777; i++)
		d[i] = 0.1;
	for (int L = 1; L <= 64; L *= 4) {
		ck_assert_int_eq(rt_bootstrap_mean_ci(d, 777, 1000, L, 0.95, 7, NULL, &ci, &err), 0);
		ck_assert(ci.mean == 0.1);
		ck_assert(ci.lo == 0.1);
		ck_assert(ci.hi == 0.1);
	}
	int sig;
	ck_assert_int_eq(rt_verdict_of(&ci, &sig), RT_VERDICT_A_BETTER);
	ck_assert_int_eq(sig, 1);
	/* n = 1 works and is the constant */
	double one = -3.25;
	ck_assert_int_eq(rt_bootstrap_mean_ci(&one, 1, 10, 1, 0.95, 7, NULL, &ci, &err), 0);
	ck_assert(ci.lo == -3.25 && ci.hi == -3.25);
	ck_assert_int_eq(rt_verdict_of(&ci, &sig), RT_VERDICT_B_BETTER);
	ck_assert_int_eq(sig, 1);
}
END_TEST

START_TEST(test_bootstrap_coverage)
{
	/* iid N(mu, 1) samples of size 200 from our own PRNG (Box-Muller): the 90% interval
	 * should contain mu in about 90% of 200 repetitions. Binomial(200, 0.9) has sd 4.2,
	 * so [160, 195] is a > 4-sigma band around 180. */
	rt_rng r;
	rt_rng_seed(&r, 11);
	double d[200];
	int cover = 0;
	const double mu = 0.3;
	for (int rep = 0; rep < 200; rep++) {
		for (int i = 0; i < 200; i += 2) {
			double u1 = ((double)(rt_rng_next(&r) >> 11) + 0.5) / 9007199254740992.0;
			double u2 = (double)(rt_rng_next(&r) >> 11) / 9007199254740992.0;
			double rad = sqrt(-2.0 * log(u1));
			d[i] = mu + rad * cos(2 * M_PI * u2);
			d[i + 1] = mu + rad * sin(2 * M_PI * u2);
		}
		rt_boot_ci ci;
		rt_err err = {0};
		ck_assert_int_eq(rt_bootstrap_mean_ci(d, 200, 400, 1, 0.90, (uint64_t)rep, NULL,
		                                      &ci, &err), 0);
		cover += ci.lo <= mu && mu <= ci.hi;
		ck_assert(ci.lo <= ci.mean && ci.mean <= ci.hi);
		/* width close to 2 * 1.645 / sqrt(200) = 0.233 */
		ck_assert_msg(ci.hi - ci.lo > 0.17 && ci.hi - ci.lo < 0.30, "width %g",
		              ci.hi - ci.lo);
	}
	ck_assert_msg(cover >= 160 && cover <= 195, "coverage %d/200", cover);
}
END_TEST

START_TEST(test_bootstrap_errors)
{
	rt_err err = {0};
	rt_boot_ci ci;
	double d[3] = {1, 2, 3};
	ck_assert_int_eq(rt_bootstrap_mean_ci(d, 0, 100, 1, 0.95, 1, NULL, &ci, &err), -1);
	ck_assert_str_eq(err.msg, "bootstrap: empty sample");
	ck_assert_int_eq(rt_bootstrap_mean_ci(d, 3, 1, 1, 0.95, 1, NULL, &ci, &err), -1);
	ck_assert_str_eq(err.msg, "bootstrap: 1 resamples, need at least 2");
	ck_assert_int_eq(rt_bootstrap_mean_ci(d, 3, 100, 0, 0.95, 1, NULL, &ci, &err), -1);
	ck_assert_str_eq(err.msg, "bootstrap: block length 0 must be >= 1");
	ck_assert_int_eq(rt_bootstrap_mean_ci(d, 3, 100, 1, 1.0, 1, NULL, &ci, &err), -1);
	ck_assert_str_eq(err.msg, "bootstrap: confidence level 1 not in (0, 1)");
	d[1] = NAN;
	ck_assert_int_eq(rt_bootstrap_mean_ci(d, 3, 100, 1, 0.95, 1, NULL, &ci, &err), -1);
	ck_assert_str_eq(err.msg, "bootstrap: non-finite difference at token 1");
}
END_TEST

START_TEST(test_verdict)
{
	rt_boot_ci ci = {.n = 100, .mean = 0.0123, .lo = 0.008, .hi = 0.017, .level = 0.95,
	                 .n_resamples = 1000, .block_len = 1};
	char buf[512];
	int sig;
	ck_assert_int_eq(rt_verdict_of(&ci, &sig), RT_VERDICT_A_BETTER);
	ck_assert_int_eq(sig, 1);
	int n = rt_verdict_format(&ci, "snapkv", "h2o", NULL, NULL, buf, sizeof(buf));
	ck_assert_int_eq(n, (int)strlen(buf));
	ck_assert_str_eq(buf, "A (snapkv) better: mean dNLL(B-A) = +0.01230 nats/token, "
	                      "95% CI [+0.00800, +0.01700], significant");
	ci.mean = -0.002;
	ci.lo = -0.006;
	ci.hi = 0.001;
	ck_assert_int_eq(rt_verdict_of(&ci, &sig), RT_VERDICT_B_BETTER);
	ck_assert_int_eq(sig, 0);
	rt_verdict_format(&ci, NULL, NULL, "KLD", "nats", buf, sizeof(buf));
	ck_assert_str_eq(buf, "no significant difference between A (A) and B (B), point estimate "
	                      "favours B: mean dKLD(B-A) = -0.00200 nats, "
	                      "95% CI [-0.00600, +0.00100], not significant (CI includes 0)");
	ci.mean = 0.0;
	ck_assert_int_eq(rt_verdict_of(&ci, &sig), RT_VERDICT_TIE);
	rt_verdict_format(&ci, "x", "y", NULL, NULL, buf, sizeof(buf));
	ck_assert_str_eq(buf, "A (x) and B (y) tie: mean dNLL(B-A) = +0.00000 nats/token, "
	                      "95% CI [-0.00600, +0.00100], not significant (CI includes 0)");
	/* the head alone, as needle's sign-test verdict uses it: no winner inside the noise */
	rt_verdict_head(RT_VERDICT_A_BETTER, 0, "kvzip", "snapkv", buf, sizeof buf);
	ck_assert_str_eq(buf, "no significant difference between A (kvzip) and B (snapkv), point "
	                      "estimate favours A");
	rt_verdict_head(RT_VERDICT_B_BETTER, 1, "kvzip", "snapkv", buf, sizeof buf);
	ck_assert_str_eq(buf, "B (snapkv) better");
	/* truncation keeps a NUL and reports the full length */
	char small[8];
	n = rt_verdict_format(&ci, "a", "b", NULL, NULL, small, sizeof(small));
	ck_assert_int_gt(n, 7);
	ck_assert_uint_eq(strlen(small), 7);
}
END_TEST

START_TEST(test_block_len_and_autocorrelation)
{
	ck_assert_int_eq(rt_bootstrap_block_len(0), 1);
	ck_assert_int_eq(rt_bootstrap_block_len(1), 1);
	ck_assert_int_eq(rt_bootstrap_block_len(2), 1);
	ck_assert_int_eq(rt_bootstrap_block_len(1000), 10);
	ck_assert_int_eq(rt_bootstrap_block_len(4096), 16);
	ck_assert_int_eq(rt_bootstrap_block_len(100000), 46);
	/* On the AR(1) golden series (phi = 0.8) the block bootstrap interval must be much
	 * wider than the iid one: the iid bootstrap ignores the positive autocorrelation
	 * (variance inflation (1+phi)/(1-phi) = 9, so about 3x in width). */
	load_vecs();
	const gvec *g = find_vec("d_ar1");
	rt_boot_ci iid, blk;
	rt_err err = {0};
	ck_assert_int_eq(rt_bootstrap_mean_ci(g->v, g->n, 1000, 1, 0.95, 3, NULL, &iid, &err), 0);
	ck_assert_int_eq(rt_bootstrap_mean_ci(g->v, g->n, 1000, 32, 0.95, 3, NULL, &blk, &err), 0);
	double wi = iid.hi - iid.lo, wb = blk.hi - blk.lo;
	ck_assert_msg(wb > 1.8 * wi, "block width %g vs iid width %g", wb, wi);
	/* and on the iid golden sample the two agree roughly */
	g = find_vec("d_iid");
	ck_assert_int_eq(rt_bootstrap_mean_ci(g->v, g->n, 1000, 1, 0.95, 3, NULL, &iid, &err), 0);
	ck_assert_int_eq(rt_bootstrap_mean_ci(g->v, g->n, 1000, 8, 0.95, 3, NULL, &blk, &err), 0);
	wi = iid.hi - iid.lo;
	wb = blk.hi - blk.lo;
	ck_assert_msg(wb > 0.7 * wi && wb < 1.4 * wi, "block width %g vs iid width %g", wb, wi);
}
END_TEST

static void pw_fn(const char *kind, char **sp, FILE *f, void *ctx)
{
	(void)f;
	if (strcmp(kind, "pwblock"))
		return;
	const gvec *g = find_vec(next_tok(sp));
	int64_t want = tok_ll(sp);
	int64_t got = rt_bootstrap_block_len_auto(g->v, g->n);
	ck_assert_msg(got == want, "%s: block length %lld, python %lld", g->name, (long long)got,
	              (long long)want);
	(*(int *)ctx)++;
}

START_TEST(test_block_len_auto)
{
	load_vecs();
	int n = 0;
	for_each_line(pw_fn, &n);
	ck_assert_int_eq(n, 4); /* d_iid 1, d_ar1 17, d_small 1, d_real 57 */
	/* constant and tiny samples */
	double c[100];
	for (int i = 0; i < 100; i++)
		c[i] = 0.25;
	ck_assert_int_eq(rt_bootstrap_block_len_auto(c, 100), 1);
	ck_assert_int_eq(rt_bootstrap_block_len_auto(c, 3), 1);
	/* AR(1) with phi = 0.5, n = 100000: the theoretical optimum is
	 * (2 G^2 / (4/3 g^2))^(1/3) n^(1/3) with g = sum R(k) = 1/(1-phi)^2 and
	 * G = sum |k| R(k) = 2 phi / ((1-phi^2)(1-phi)^2) (unit innovations): 64.4 tokens. */
	const int64_t N = 100000;
	const double phi = 0.5;
	double *a = malloc((size_t)N * sizeof(double));
	rt_rng r;
	rt_rng_seed(&r, 2024);
	double prev = 0.0;
	for (int64_t i = 0; i < N; i++) {
		double u1 = ((double)(rt_rng_next(&r) >> 11) + 0.5) / 9007199254740992.0;
		double u2 = (double)(rt_rng_next(&r) >> 11) / 9007199254740992.0;
		double z = sqrt(-2.0 * log(u1)) * cos(2 * M_PI * u2);
		a[i] = prev = phi * prev + z;
	}
	double g = 1.0 / ((1 - phi) * (1 - phi));
	double G = 2 * phi / ((1 - phi * phi) * (1 - phi) * (1 - phi));
	double theory = cbrt(2 * G * G / (4.0 / 3.0 * g * g)) * cbrt((double)N);
	ck_assert(fabs(theory - 64.37) < 0.01);
	int64_t L = rt_bootstrap_block_len_auto(a, N);
	ck_assert_msg(L > 0.75 * theory && L < 1.25 * theory, "L = %lld, theory %.1f",
	              (long long)L, theory);
	free(a);
}
END_TEST

START_TEST(test_json)
{
	rt_kld_summary s = {.n = 3, .kld_mean = 0.5, .kld_mean_err = 0.25, .kld_median = 0.125,
	                    .kld_p90 = 1, .kld_p95 = 2, .kld_p99 = 3, .kld_p999 = 4, .kld_max = 5,
	                    .kld_min = 0, .ppl_p = 10, .ppl_q = 11, .ppl_ratio = 1.1,
	                    .same_top1 = 2.0 / 3.0, .rms_dp = NAN, .mean_dp = -0.01};
	char *buf = NULL;
	size_t blen = 0;
	FILE *f = open_memstream(&buf, &blen);
	rt_kld_summary_json(f, &s);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_str_eq(buf, "\"tokens\": 3, \"kld_mean\": 0.5, \"kld_mean_err\": 0.25, "
	                      "\"kld_median\": 0.125, \"kld_p90\": 1, \"kld_p95\": 2, "
	                      "\"kld_p99\": 3, \"kld_p999\": 4, \"kld_max\": 5, \"kld_min\": 0, "
	                      "\"ppl_ref\": 10, \"ppl\": 11, \"ppl_ratio\": 1.1, "
	                      "\"same_top1\": 0.666666667, \"rms_dp\": null, \"mean_dp\": -0.01");
	rt_boot_ci ci = {.n = 4096, .mean = -0.002, .lo = -0.004, .hi = -0.001, .level = 0.95,
	                 .n_resamples = 1000, .block_len = 16, .seed = 7};
	free(buf);
	f = open_memstream(&buf, &blen);
	rt_boot_ci_json(f, &ci);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_str_eq(buf, "\"n\": 4096, \"mean\": -0.002, \"ci_lo\": -0.004, "
	                      "\"ci_hi\": -0.001, \"level\": 0.95, \"resamples\": 1000, "
	                      "\"block_len\": 16, \"seed\": 7, \"significant\": true");
	free(buf);
	/* the default seed ("kvpc-ab!", above 2^53) is written as a string, digit for digit */
	ci.seed = RT_BOOT_DEFAULT_SEED;
	f = open_memstream(&buf, &blen);
	rt_boot_ci_json(f, &ci);
	ck_assert_int_eq(fclose(f), 0);
	/* 0x6b7670632d616221 in decimal (Python int) */
	ck_assert_ptr_nonnull(strstr(buf, "\"seed\": \"7743500180575576609\""));
	free(buf);
}
END_TEST

static Suite *stats_suite(void)
{
	Suite *s = suite_create("stats");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_kl_hand);
	tcase_add_test(tc, test_kl_errors);
	tcase_add_test(tc, test_kl_golden);
	tcase_add_test(tc, test_percentile_golden);
	tcase_add_test(tc, test_summary_golden);
	tcase_add_test(tc, test_rng_golden);
	tcase_add_test(tc, test_bootstrap_golden);
	tcase_add_test(tc, test_bootstrap_constant);
	tcase_add_test(tc, test_bootstrap_coverage);
	tcase_add_test(tc, test_bootstrap_errors);
	tcase_add_test(tc, test_verdict);
	tcase_add_test(tc, test_block_len_and_autocorrelation);
	tcase_add_test(tc, test_block_len_auto);
	tcase_add_test(tc, test_json);
	tcase_add_test(tc, test_sampler_hand);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed = check_run(stats_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
