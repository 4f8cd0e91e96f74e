/*
 * rt_stats: the statistics the A/B command reports when it compares a policy run (Q) with
 * a full-cache reference run (P) on the same tokens, and when it compares two policies A
 * and B with each other.
 *
 * (a) Per-token comparison of two logit rows (KL(P || Q) from log-softmax in double, the
 *     probabilities of the correct next token, top-1 agreement) and a summary over a run
 *     that follows llama.cpp's `llama-perplexity --kl-divergence` (tools/perplexity/
 *     perplexity.cpp): mean KLD with its standard error, median, percentiles, max, PPL
 *     ratio, "same top p" and "RMS Δp".
 * (b) A paired bootstrap confidence interval for the mean of per-token differences
 *     d_i = nll_B,i - nll_A,i (Efron & Tibshirani 1993, percentile interval), with a
 *     circular block bootstrap option (Politis & Romano 1992) for autocorrelated tokens,
 *     driven by a documented fixed-seed PRNG (splitmix64-seeded xoshiro256**, Blackman &
 *     Vigna 2018) so results are reproducible and re-implementable (tests/golden/stats/).
 *
 * Percentile definition (same as llama.cpp's KL mode and numpy.percentile's default
 * "linear" method): sort the n values v[0..n-1]; for a fraction f in [0,1] let
 * p = f*(n-1), i = floor(p); result = (1-(p-i))*v[i] + (p-i)*v[min(i+1,n-1)]; f <= 0 gives
 * v[0], f >= 1 gives v[n-1]. The median is the middle value (mean of the two middle values
 * for even n), which equals the 0.5 percentile. (llama.cpp passes the fraction as a float,
 * e.g. 0.99f; we use doubles, so results can differ in the last few bits.)
 */
#ifndef RT_STATS_H
#define RT_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/rt_util.h"

/* ---- (a) per-token comparison and KL summary ----------------------------------------- */

/* One token's comparison of the reference distribution P and the candidate Q. */
typedef struct rt_tok_cmp {
	double kld;        /* KL(P || Q) = sum_v P(v) (log P(v) - log Q(v)), nats; rounding
	                    * noise below 0 is clamped to 0 (llama.cpp does not clamp, so its
	                    * minimum can print as -0.000003) */
	double nll_p;      /* -log P(target), nats */
	double nll_q;      /* -log Q(target), nats */
	double prob_p;     /* P(target) */
	double prob_q;     /* Q(target) */
	int32_t top_p;     /* argmax of P (lowest id on ties) */
	int32_t top_q;     /* argmax of Q (lowest id on ties) */
} rt_tok_cmp;

/* Compare two logit rows logits_p[n_vocab], logits_q[n_vocab] (unnormalised, float) for a
 * next token `target` in [0, n_vocab). Log-softmax is computed in double with the max
 * subtracted, so large logits do not overflow. Returns 0, or -1 with err set for
 * n_vocab <= 0, a target out of range, or a non-finite logit ("logits: ..."). */
int rt_stats_token_cmp(const float *logits_p, const float *logits_q, int32_t n_vocab,
                       int32_t target, rt_tok_cmp *out, rt_err *err);

/* Accumulates per-token comparisons over a run. Owns a growing array of the KLD values
 * (8 bytes per token; grown geometrically, so adding is amortised O(1)). */
typedef struct rt_kld_acc {
	double *kld;       /* [n] per-token KL values in order of addition */
	int64_t n, cap;
	double sum_kld, sum_kld2;
	double sum_nll_p, sum_nll_q;
	double sum_dp, sum_dp2;      /* dp = prob_q - prob_p of the correct token */
	int64_t n_same_top;
} rt_kld_acc;

/* Summary of a run (all zero when n == 0). */
typedef struct rt_kld_summary {
	int64_t n;                 /* tokens */
	double kld_mean, kld_mean_err; /* mean and its standard error sqrt(var/(n-1)) */
	double kld_median, kld_p90, kld_p95, kld_p99, kld_p999, kld_max, kld_min;
	double ppl_p, ppl_q;       /* exp(mean nll) of the reference and the candidate */
	double ppl_ratio;          /* ppl_q / ppl_p = exp(mean(nll_q - nll_p)) */
	double same_top1;          /* fraction of tokens with top_p == top_q, in [0,1] */
	double rms_dp;             /* sqrt(mean((prob_q - prob_p)^2)), a probability in [0,1]
	                            * (llama.cpp prints it as a percentage) */
	double mean_dp;            /* mean(prob_q - prob_p) */
} rt_kld_summary;

void rt_kld_acc_init(rt_kld_acc *a);
void rt_kld_acc_free(rt_kld_acc *a);
/* Reset to zero tokens, keeping the allocation. */
void rt_kld_acc_reset(rt_kld_acc *a);
/* Pre-size for n tokens so that rt_kld_acc_add never allocates (call before the
 * evaluation loop; aborts on out-of-memory). */
void rt_kld_acc_reserve(rt_kld_acc *a, int64_t n);
/* Add one token (grows geometrically when not reserved; aborts on out-of-memory). */
void rt_kld_acc_add(rt_kld_acc *a, const rt_tok_cmp *c);
/* Summarise (sorts a copy of the KLD values; a is unchanged). */
void rt_kld_acc_summary(const rt_kld_acc *a, rt_kld_summary *out);

/* Percentile of ascending-sorted values v[n] at fraction f (definition above). n >= 1. */
double rt_stats_percentile_sorted(const double *v, int64_t n, double f);
/* Median of ascending-sorted values v[n]. n >= 1. */
double rt_stats_median_sorted(const double *v, int64_t n);
/* Sort v[n] ascending in place (total order; NaN must not occur). */
void rt_stats_sort(double *v, int64_t n);

/* ---- PRNG ----------------------------------------------------------------------------- */

/* xoshiro256** 1.0 (Blackman & Vigna, prng.di.unimi.it), state seeded by four successive
 * outputs of splitmix64 starting from `seed` (the seeding the authors recommend). */
typedef struct rt_rng {
	uint64_t s[4];
} rt_rng;

void rt_rng_seed(rt_rng *r, uint64_t seed);
uint64_t rt_rng_next(rt_rng *r);
/* Uniform integer in [0, n), n >= 1, unbiased by rejection: draw x until
 * x >= (2^64 - n) mod n, return x mod n. */
uint64_t rt_rng_below(rt_rng *r, uint64_t n);

/* ---- (b) paired bootstrap ------------------------------------------------------------- */

/* Result of a bootstrap of the mean of d[n]. */
typedef struct rt_boot_ci {
	int64_t n;          /* sample size (tokens) */
	double mean;        /* sample mean of d */
	double lo, hi;      /* percentile interval at `level` */
	double level;       /* e.g. 0.95 */
	int n_resamples;    /* B */
	int64_t block_len;  /* L (1 = ordinary iid bootstrap) */
	uint64_t seed;
} rt_boot_ci;

/* Paired bootstrap percentile interval for the mean of d[n] (pass d_i = nll_B,i - nll_A,i
 * for the A/B comparison; the pairing is implicit because whole d_i are resampled).
 *
 * Algorithm (reproduced bit for bit by tests/golden/stats/make_golden.py):
 *   rng = rt_rng_seed(seed); k = ceil(n / L)
 *   for b in 0..B-1:  s = 0.0; taken = 0
 *       for j in 0..k-1: start = rt_rng_below(rng, n)
 *           for t in 0..L-1 while taken < n: s += d[(start + t) mod n] - d[0]; taken++
 *       m[b] = d[0] + s / n
 *   sort m; lo = percentile(m, (1-level)/2); hi = percentile(m, 1-(1-level)/2)
 * With L = 1 this is the ordinary bootstrap; L > 1 is the circular block bootstrap, which
 * keeps runs of L consecutive tokens together so that the autocorrelation of per-token
 * losses (neighbouring tokens share context) does not make the interval too narrow.
 * Centring on d[0] makes a constant sample give exactly that constant as lo = hi = mean.
 * `work` may be NULL (then B doubles are allocated and freed) or a caller buffer of
 * B doubles. The sample mean uses the same centring.
 * Errors (-1, err set): n < 1, B < 2, L < 1, level not in (0,1), non-finite d_i. */
int rt_bootstrap_mean_ci(const double *d, int64_t n, int n_resamples, int64_t block_len,
                         double level, uint64_t seed, double *work, rt_boot_ci *out,
                         rt_err *err);

/* Suggested block length for n autocorrelated per-token values: max(1, round(cbrt(n)))
 * tokens (16 for 4096 tokens). The mean-squared-error-optimal block length for the
 * variance of a mean grows like n^(1/3) (Hall, Horowitz & Jing 1995); the constant depends
 * on the autocorrelation (Politis & White 2004 estimate it) and is taken as 1 here. */
int64_t rt_bootstrap_block_len(int64_t n);

/* Data-driven block length for the circular block bootstrap of the mean of d[n]: the
 * rule of Politis & White (2004) with the correction of Patton, Politis & White (2009),
 *   e = d - mean(d); R(k) = sum_{i>=k} e_i e_{i-k} / n  (autocovariance)
 *   K = max(5, floor(sqrt(log10 n))); m_max = min(ceil(sqrt n) + K, n - 1)
 *   m = smallest m >= 0 with |R(m+k)/R(0)| < 2 sqrt(log10(n)/n) for k = 1..K
 *       (m_max - K when there is none); M = min(2 max(m, 1), m_max)
 *   flat-top kernel lam(t) = 1 for t <= 1/2, 2(1 - t) for 1/2 < t <= 1
 *   g = R(0) + 2 sum_{k=1..M} lam(k/M) R(k);  G = 2 sum_{k=1..M} lam(k/M) k R(k)
 *   L = (2 G^2 / ((4/3) g^2))^(1/3) n^(1/3), clamped to [1, ceil(min(3 sqrt n, n/3))]
 * and rounded to the nearest integer. Returns 1 for n < 8 or a constant sample.
 * Measured on the real model (SmolLM2-135M, 1023 tokens of coreutils.info, NLL
 * differences of sinks+window vs window eviction at 8x): autocorrelation 0.19-0.25 up
 * to lag 16, this rule picks L = 57, and the 95% interval is 2.5x as wide as the iid
 * bootstrap's (which is therefore far too optimistic), close to where the width stops
 * growing with L (L = 64..128). The A/B command should use this. O(n sqrt n) time, no
 * allocation. */
int64_t rt_bootstrap_block_len_auto(const double *d, int64_t n);

/* Default settings used by the A/B command. */
#define RT_BOOT_DEFAULT_B 1000
#define RT_BOOT_DEFAULT_SEED 0x6b7670632d616221ULL /* "kvpc-ab!" */

/* Verdict on a CI of d = metric_B - metric_A where lower is better (NLL). */
typedef enum rt_verdict {
	RT_VERDICT_TIE = 0,    /* mean exactly 0 */
	RT_VERDICT_A_BETTER,   /* mean > 0: B has the higher loss */
	RT_VERDICT_B_BETTER,   /* mean < 0 */
} rt_verdict;

/* Which side is better and whether the interval excludes 0 (*significant = 1 when
 * lo > 0 or hi < 0). */
rt_verdict rt_verdict_of(const rt_boot_ci *ci, int *significant);

/* The head of every A/B verdict line (ppl's bootstrap CI and needle's sign test alike):
 * "A (x) and B (y) tie" (v TIE), "no significant difference between A (x) and B (y), point
 * estimate favours B" (not significant: no winner named inside the noise), or "B (y)
 * better". Names may be NULL ("A", "B"). Writes at most cap bytes (NUL-terminated) and
 * returns the full length like snprintf. */
int rt_verdict_head(rt_verdict v, int significant, const char *name_a, const char *name_b,
                    char *buf, size_t cap);

/* One verdict line for a per-token metric where lower is better (metric NULL = "NLL",
 * unit NULL = "nats/token"; e.g. "KLD" works the same way with d_i = kld_B,i - kld_A,i):
 *   "A (snapkv) better: mean dNLL(B-A) = +0.01234 nats/token, 95% CI [+0.00800, +0.01700],
 *    significant"
 * "no significant difference between A (x) and B (y), point estimate favours B: ...,
 *  not significant (CI includes 0)" when the CI includes 0, or "A (x) and B (y) tie: ..."
 * when the mean difference is exactly 0. Writes at most
 * cap bytes (NUL-terminated, truncated if needed) and returns the full length like
 * snprintf. Names may be NULL ("A", "B"). */
int rt_verdict_format(const rt_boot_ci *ci, const char *name_a, const char *name_b,
                      const char *metric, const char *unit, char *buf, size_t cap);

/* ---- JSON fragments for reports ------------------------------------------------------- */

/* Write the summary to out as JSON object members (no braces), keys as llama.cpp's
 * perplexity --kl-divergence names them:
 *   "tokens": n, "kld_mean": .., "kld_mean_err": .., "kld_median": .., "kld_p90": ..,
 *   "kld_p95": .., "kld_p99": .., "kld_p999": .., "kld_max": .., "kld_min": ..,
 *   "ppl_ref": .., "ppl": .., "ppl_ratio": .., "same_top1": .., "rms_dp": .., "mean_dp": ..
 * Numbers as report/rt_json.h writes them (%.9g, null when not finite). */
void rt_kld_summary_json(FILE *out, const rt_kld_summary *s);

/* Same for a bootstrap result: "n": .., "mean": .., "ci_lo": .., "ci_hi": .., "level": ..,
 * "resamples": .., "block_len": .., "seed": .., "significant": true|false. The seed is a
 * 64-bit integer: above 2^53 it is written as a decimal string (rt_json_uint). */
void rt_boot_ci_json(FILE *out, const rt_boot_ci *ci);

#endif
