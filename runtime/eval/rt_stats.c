/*
 * rt_stats: per-token KL divergence between a reference and a candidate distribution,
 * llama.cpp-style run summaries (mean/median/percentile KLD, PPL ratio, same top-1,
 * RMS Δp), a reproducible PRNG, and the paired (block) bootstrap with its verdict.
 * Definitions and references are in rt_stats.h.
 */
#include "eval/rt_stats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/rt_json.h"

/* ---- per-token comparison ------------------------------------------------------------ */

/* max and log-sum-exp of a logit row in double; argmax keeps the lowest id on ties. */
static int row_lse(const float *x, int32_t n, double *lse, int32_t *arg)
{
	double mx = -INFINITY;
	int32_t am = 0;
	for (int32_t i = 0; i < n; i++) {
		double v = x[i];
		if (!isfinite(v))
			return -1;
		if (v > mx) {
			mx = v;
			am = i;
		}
	}
	double s = 0.0;
	for (int32_t i = 0; i < n; i++)
		s += exp((double)x[i] - mx);
	*lse = mx + log(s);
	*arg = am;
	return 0;
}

int rt_stats_token_cmp(const float *logits_p, const float *logits_q, int32_t n_vocab,
                       int32_t target, rt_tok_cmp *out, rt_err *err)
{
	if (n_vocab <= 0)
		return rt_err_set(err, "logits: vocabulary size %d must be positive", n_vocab);
	if (target < 0 || target >= n_vocab)
		return rt_err_set(err, "logits: target token %d out of range [0, %d)", target,
		                  n_vocab);
	double lse_p, lse_q;
	if (row_lse(logits_p, n_vocab, &lse_p, &out->top_p) < 0)
		return rt_err_set(err, "logits: non-finite value in the reference row");
	if (row_lse(logits_q, n_vocab, &lse_q, &out->top_q) < 0)
		return rt_err_set(err, "logits: non-finite value in the candidate row");
	double kl = 0.0;
	for (int32_t i = 0; i < n_vocab; i++) {
		double lp = (double)logits_p[i] - lse_p;
		double lq = (double)logits_q[i] - lse_q;
		kl += exp(lp) * (lp - lq);
	}
	/* Rounding can give a tiny negative value for identical rows; KL is >= 0. */
	out->kld = kl > 0.0 ? kl : 0.0;
	out->nll_p = lse_p - (double)logits_p[target];
	out->nll_q = lse_q - (double)logits_q[target];
	out->prob_p = exp(-out->nll_p);
	out->prob_q = exp(-out->nll_q);
	return 0;
}

/* ---- accumulator ---------------------------------------------------------------------- */

void rt_kld_acc_init(rt_kld_acc *a)
{
	memset(a, 0, sizeof(*a));
}

void rt_kld_acc_free(rt_kld_acc *a)
{
	free(a->kld);
	memset(a, 0, sizeof(*a));
}

void rt_kld_acc_reset(rt_kld_acc *a)
{
	double *k = a->kld;
	int64_t cap = a->cap;
	memset(a, 0, sizeof(*a));
	a->kld = k;
	a->cap = cap;
}

void rt_kld_acc_reserve(rt_kld_acc *a, int64_t n)
{
	if (n <= a->cap)
		return;
	double *k = realloc(a->kld, (size_t)n * sizeof(double));
	if (!k)
		rt_assert_fail("out of memory", __FILE__, __LINE__);
	a->kld = k;
	a->cap = n;
}

void rt_kld_acc_add(rt_kld_acc *a, const rt_tok_cmp *c)
{
	if (a->n == a->cap)
		rt_kld_acc_reserve(a, a->cap ? 2 * a->cap : 1024);
	a->kld[a->n++] = c->kld;
	a->sum_kld += c->kld;
	a->sum_kld2 += c->kld * c->kld;
	a->sum_nll_p += c->nll_p;
	a->sum_nll_q += c->nll_q;
	double dp = c->prob_q - c->prob_p;
	a->sum_dp += dp;
	a->sum_dp2 += dp * dp;
	a->n_same_top += c->top_p == c->top_q;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

void rt_stats_sort(double *v, int64_t n)
{
	if (n > 1)
		qsort(v, (size_t)n, sizeof(double), cmp_double);
}

double rt_stats_percentile_sorted(const double *v, int64_t n, double f)
{
	RT_ASSERT(n >= 1);
	if (f <= 0.0)
		return v[0];
	if (f >= 1.0)
		return v[n - 1];
	double p = f * (double)(n - 1);
	int64_t i = (int64_t)p;
	double w = p - (double)i;
	int64_t j = i + 1 < n ? i + 1 : n - 1;
	return (1.0 - w) * v[i] + w * v[j];
}

double rt_stats_median_sorted(const double *v, int64_t n)
{
	RT_ASSERT(n >= 1);
	if (n % 2)
		return v[n / 2];
	return 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void rt_kld_acc_summary(const rt_kld_acc *a, rt_kld_summary *out)
{
	memset(out, 0, sizeof(*out));
	int64_t n = a->n;
	out->n = n;
	if (n == 0)
		return;
	double *v = RT_MALLOC((size_t)n * sizeof(double));
	memcpy(v, a->kld, (size_t)n * sizeof(double));
	rt_stats_sort(v, n);
	double dn = (double)n;
	out->kld_mean = a->sum_kld / dn;
	/* llama.cpp mean_and_uncertainty: sqrt((E[x^2] - E[x]^2) / (n-1)). */
	double var = a->sum_kld2 / dn - out->kld_mean * out->kld_mean;
	out->kld_mean_err = (n > 1 && var > 0.0) ? sqrt(var / (dn - 1.0)) : 0.0;
	out->kld_median = rt_stats_median_sorted(v, n);
	out->kld_p90 = rt_stats_percentile_sorted(v, n, 0.90);
	out->kld_p95 = rt_stats_percentile_sorted(v, n, 0.95);
	out->kld_p99 = rt_stats_percentile_sorted(v, n, 0.99);
	out->kld_p999 = rt_stats_percentile_sorted(v, n, 0.999);
	out->kld_max = v[n - 1];
	out->kld_min = v[0];
	free(v);
	out->ppl_p = exp(a->sum_nll_p / dn);
	out->ppl_q = exp(a->sum_nll_q / dn);
	out->ppl_ratio = exp((a->sum_nll_q - a->sum_nll_p) / dn);
	out->same_top1 = (double)a->n_same_top / dn;
	out->mean_dp = a->sum_dp / dn;
	out->rms_dp = sqrt(a->sum_dp2 / dn);
}

/* ---- PRNG ----------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void rt_rng_seed(rt_rng *r, uint64_t seed)
{
	uint64_t x = seed;
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t rt_rng_next(rt_rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

uint64_t rt_rng_below(rt_rng *r, uint64_t n)
{
	RT_ASSERT(n >= 1);
	uint64_t threshold = (0 - n) % n; /* (2^64 - n) mod n = 2^64 mod n */
	for (;;) {
		uint64_t x = rt_rng_next(r);
		if (x >= threshold)
			return x % n;
	}
}

/* ---- bootstrap ------------------------------------------------------------------------ */

int rt_bootstrap_mean_ci(const double *d, int64_t n, int n_resamples, int64_t block_len,
                         double level, uint64_t seed, double *work, rt_boot_ci *out,
                         rt_err *err)
{
	if (n < 1)
		return rt_err_set(err, "bootstrap: empty sample");
	if (n_resamples < 2)
		return rt_err_set(err, "bootstrap: %d resamples, need at least 2", n_resamples);
	if (block_len < 1)
		return rt_err_set(err, "bootstrap: block length %lld must be >= 1",
		                  (long long)block_len);
	if (!(level > 0.0 && level < 1.0))
		return rt_err_set(err, "bootstrap: confidence level %g not in (0, 1)", level);
	for (int64_t i = 0; i < n; i++)
		if (!isfinite(d[i]))
			return rt_err_set(err, "bootstrap: non-finite difference at token %lld",
			                  (long long)i);
	double d0 = d[0], dn = (double)n;
	double s = 0.0;
	for (int64_t i = 0; i < n; i++)
		s += d[i] - d0;
	double mean = d0 + s / dn;

	double *m = work ? work : RT_MALLOC((size_t)n_resamples * sizeof(double));
	rt_rng rng;
	rt_rng_seed(&rng, seed);
	int64_t L = block_len > n ? n : block_len;
	int64_t k = (n + L - 1) / L;
	for (int b = 0; b < n_resamples; b++) {
		double acc = 0.0;
		int64_t taken = 0;
		for (int64_t j = 0; j < k; j++) {
			int64_t start = (int64_t)rt_rng_below(&rng, (uint64_t)n);
			for (int64_t t = 0; t < L && taken < n; t++, taken++) {
				int64_t idx = start + t;
				if (idx >= n)
					idx -= n;
				acc += d[idx] - d0;
			}
		}
		m[b] = d0 + acc / dn;
	}
	rt_stats_sort(m, n_resamples);
	double alpha = (1.0 - level) / 2.0;
	out->n = n;
	out->mean = mean;
	out->lo = rt_stats_percentile_sorted(m, n_resamples, alpha);
	out->hi = rt_stats_percentile_sorted(m, n_resamples, 1.0 - alpha);
	out->level = level;
	out->n_resamples = n_resamples;
	out->block_len = block_len;
	out->seed = seed;
	if (!work)
		free(m);
	return 0;
}

rt_verdict rt_verdict_of(const rt_boot_ci *ci, int *significant)
{
	if (significant)
		*significant = ci->lo > 0.0 || ci->hi < 0.0;
	if (ci->mean > 0.0)
		return RT_VERDICT_A_BETTER;
	if (ci->mean < 0.0)
		return RT_VERDICT_B_BETTER;
	return RT_VERDICT_TIE;
}

int rt_verdict_head(rt_verdict v, int significant, const char *name_a, const char *name_b,
                    char *buf, size_t cap)
{
	const char *na = name_a ? name_a : "A", *nb = name_b ? name_b : "B";
	const char *who = v == RT_VERDICT_A_BETTER ? "A" : "B";
	if (v == RT_VERDICT_TIE)
		return snprintf(buf, cap, "A (%s) and B (%s) tie", na, nb);
	if (!significant) /* a point estimate inside the noise names no winner */
		return snprintf(buf, cap, "no significant difference between A (%s) and B (%s), "
		                "point estimate favours %s", na, nb, who);
	return snprintf(buf, cap, "%s (%s) better", who, v == RT_VERDICT_A_BETTER ? na : nb);
}

int rt_verdict_format(const rt_boot_ci *ci, const char *name_a, const char *name_b,
                      const char *metric, const char *unit, char *buf, size_t cap)
{
	int sig;
	rt_verdict v = rt_verdict_of(ci, &sig);
	char head[300];
	rt_verdict_head(v, sig, name_a, name_b, head, sizeof head);
	return snprintf(buf, cap, "%s: mean d%s(B-A) = %+.5f %s, %g%% CI [%+.5f, %+.5f], %s",
	                head, metric ? metric : "NLL", ci->mean, unit ? unit : "nats/token",
	                ci->level * 100.0, ci->lo, ci->hi,
	                sig ? "significant" : "not significant (CI includes 0)");
}

/* Autocovariance of d[n] at lag k around mean: sum_{i>=k} e_i e_{i-k} / n. */
static double acv_at(const double *d, int64_t n, double mean, int64_t k)
{
	double s = 0.0;
	for (int64_t i = k; i < n; i++)
		s += (d[i] - mean) * (d[i - k] - mean);
	return s / (double)n;
}

int64_t rt_bootstrap_block_len(int64_t n)
{
	if (n <= 1)
		return 1;
	int64_t l = (int64_t)llround(cbrt((double)n));
	return l < 1 ? 1 : l;
}

int64_t rt_bootstrap_block_len_auto(const double *d, int64_t n)
{
	if (n < 8)
		return 1;
	double dn = (double)n, mean = 0.0;
	for (int64_t i = 0; i < n; i++)
		mean += d[i];
	mean /= dn;
	int64_t K = (int64_t)floor(sqrt(log10(dn)));
	if (K < 5)
		K = 5;
	int64_t m_max = (int64_t)ceil(sqrt(dn)) + K;
	if (m_max > n - 1)
		m_max = n - 1;
	/* autocovariance at lag k, computed on demand (m_max is O(sqrt n)) */
#define ACV(k) acv_at(d, n, mean, (k))
	double r0 = ACV(0);
	if (!(r0 > 0.0) || !isfinite(r0))
		return 1;
	double thr = 2.0 * sqrt(log10(dn) / dn);
	int64_t m_hat = m_max - K > 0 ? m_max - K : 0;
	for (int64_t m = 0; m + K <= m_max; m++) {
		int ok = 1;
		for (int64_t k = 1; k <= K && ok; k++)
			ok = fabs(ACV(m + k) / r0) < thr;
		if (ok) {
			m_hat = m;
			break;
		}
	}
	int64_t M = 2 * (m_hat > 1 ? m_hat : 1);
	if (M > m_max)
		M = m_max;
	double g = r0, G = 0.0;
	for (int64_t k = 1; k <= M; k++) {
		double t = (double)k / (double)M;
		double lam = t <= 0.5 ? 1.0 : 2.0 * (1.0 - t);
		double r = ACV(k);
		g += 2.0 * lam * r;
		G += 2.0 * lam * (double)k * r;
	}
#undef ACV
	double D = 4.0 / 3.0 * g * g;
	if (!(D > 0.0))
		return 1;
	double b = cbrt(2.0 * G * G / D) * cbrt(dn);
	double bmax = ceil(fmin(3.0 * sqrt(dn), dn / 3.0));
	if (!(b >= 1.0))
		b = 1.0;
	if (b > bmax)
		b = bmax;
	return (int64_t)llround(b);
}

/* ---- JSON ----------------------------------------------------------------------------- */

/* "key": v members with ", " between them (the first without). */
static void json_members(FILE *out, const char *const *keys, const double *v, int n)
{
	for (int i = 0; i < n; i++) {
		fputs(i ? ", " : "", out);
		rt_json_str(out, keys[i]);
		fputs(": ", out);
		rt_json_num(out, v[i]);
	}
}

void rt_kld_summary_json(FILE *out, const rt_kld_summary *s)
{
	static const char *const keys[] = { "kld_mean", "kld_mean_err", "kld_median", "kld_p90",
		"kld_p95", "kld_p99", "kld_p999", "kld_max", "kld_min", "ppl_ref", "ppl",
		"ppl_ratio", "same_top1", "rms_dp", "mean_dp" };
	const double v[] = { s->kld_mean, s->kld_mean_err, s->kld_median, s->kld_p90, s->kld_p95,
		s->kld_p99, s->kld_p999, s->kld_max, s->kld_min, s->ppl_p, s->ppl_q, s->ppl_ratio,
		s->same_top1, s->rms_dp, s->mean_dp };
	fputs("\"tokens\": ", out);
	rt_json_int(out, s->n);
	fputs(", ", out);
	json_members(out, keys, v, (int)(sizeof v / sizeof v[0]));
}

void rt_boot_ci_json(FILE *out, const rt_boot_ci *ci)
{
	static const char *const keys[] = { "mean", "ci_lo", "ci_hi", "level" };
	const double v[] = { ci->mean, ci->lo, ci->hi, ci->level };
	int sig;
	rt_verdict_of(ci, &sig);
	fputs("\"n\": ", out);
	rt_json_int(out, ci->n);
	fputs(", ", out);
	json_members(out, keys, v, 4);
	fprintf(out, ", \"resamples\": %d, \"block_len\": ", ci->n_resamples);
	rt_json_int(out, ci->block_len);
	fputs(", \"seed\": ", out);
	rt_json_uint(out, ci->seed);
	fprintf(out, ", \"significant\": %s", sig ? "true" : "false");
}
