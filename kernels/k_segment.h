/*
 * k_segment: cutting a text into segments at semantic change, from hidden-state curvature
 * and surprisal (GraceKV, arXiv 2608.07001; docs/gracekv.md section 2 gives the definitions
 * and their tags). The segments are the roots of the prototype trees (k_grace.h).
 *
 * Per token i and (layer l, window w): mu- = mean h[i-w+1..i], mu+ = mean h[i+1..i+w]
 * (clipped to the text), κ = 1 - cos(h_i - mu-, mu+ - h_i) (0 when a vector is zero or at
 * the last token); κ_i = mean κ - stability · std κ over (l, w) (population std). A cut
 * between tokens i and i+1 has strength b_i = z(κ)_i + surprisal · z(s)_{i+1}, z the robust
 * z-score (median, 1.4826·MAD; a zero MAD falls back to 1.2533 · mean absolute deviation,
 * then to 0). A dynamic programme picks the cuts maximising
 *   Σ_cuts (b - cut) - length · Σ_segments ((len - target)/target)²
 * with every len in [min_len, max_len]; ties keep the lower previous cut. A text shorter
 * than min_len (or of one token) is one segment. All sums in double.
 */
#ifndef K_SEGMENT_H
#define K_SEGMENT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_util.h"

/* The tuning values, all settable from `segment = curvature(...)` (docs/language.md). */
struct k_segment_params {
	int min_len;        /* shortest segment, tokens (16) */
	int max_len;        /* longest segment, tokens (128) */
	int target_len;     /* preferred length, tokens (64) */
	double stability;   /* κ = mean - stability · std over (layer, window) (0.5) */
	double surprisal;   /* weight of the surprisal z-score (1.0) */
	double length;      /* penalty per segment: length · ((len - target)/target)² (4.0) */
	double cut;         /* cost of each cut, robust-z units (3.0) */
	int n_win;          /* window sizes used (1..4) */
	int win[4];         /* tokens; default {2, 4, 8} */
};

static inline void k_segment_params_default(struct k_segment_params *sp)
{
	memset(sp, 0, sizeof *sp);
	sp->min_len = 16;
	sp->max_len = 128;
	sp->target_len = 64;
	sp->stability = 0.5;
	sp->surprisal = 1.0;
	sp->length = 4.0;
	sp->cut = 3.0;
	sp->n_win = 3;
	sp->win[0] = 2;
	sp->win[1] = 4;
	sp->win[2] = 8;
}

/* Doubles of work k_segment needs for n tokens, n_embd dims, n_hid layers, n_win windows. */
static inline size_t k_segment_work(int32_t n, int n_embd, int n_hid, int n_win)
{
	size_t N = n > 0 ? (size_t)n : 1;
	return (N + 1) * (size_t)(n_embd > 0 ? n_embd : 1) +
	       N * (size_t)(n_hid > 0 ? n_hid : 1) * (size_t)(n_win > 0 ? n_win : 1) + 6 * N + 4;
}

static inline int k_segment_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Robust z-score of x[0..m) into out (see the top); tmp: [m]. */
static inline void k_segment_robust_z(const double *x, int32_t m, double *out, double *tmp)
{
	if (m <= 0)
		return;
	memcpy(tmp, x, (size_t)m * sizeof(double));
	qsort(tmp, (size_t)m, sizeof(double), k_segment_cmp_double);
	double med = m % 2 ? tmp[m / 2] : 0.5 * (tmp[m / 2 - 1] + tmp[m / 2]);
	double mean_abs = 0.0;
	for (int32_t i = 0; i < m; i++) {
		tmp[i] = fabs(x[i] - med);
		mean_abs += tmp[i];
	}
	mean_abs /= m;
	qsort(tmp, (size_t)m, sizeof(double), k_segment_cmp_double);
	double mad = m % 2 ? tmp[m / 2] : 0.5 * (tmp[m / 2 - 1] + tmp[m / 2]);
	double scale = 1.4826 * mad;
	if (!(scale > 1e-12))
		scale = 1.2533 * mean_abs;
	for (int32_t i = 0; i < m; i++)
		out[i] = scale > 1e-12 ? (x[i] - med) / scale : 0.0;
}

/* κ of one layer h [n × E] and window w into kp[0..n); ps: [(n+1) × E] prefix sums of h,
 * filled by the caller. */
static inline void k_segment_curvature(const float *h, const double *ps, int32_t n, size_t E,
                                       int w, double *kp)
{
	for (int32_t i = 0; i < n; i++) {
		int32_t a0 = i - w + 1 < 0 ? 0 : i - w + 1;
		int32_t b1 = i + w > n - 1 ? n - 1 : i + w;
		kp[i] = 0.0;
		if (i == n - 1)
			continue;
		double dot = 0.0, na = 0.0, nb = 0.0;
		for (size_t e = 0; e < E; e++) {
			double hi = h[(size_t)i * E + e];
			double mm = (ps[(size_t)(i + 1) * E + e] - ps[(size_t)a0 * E + e]) / (i + 1 - a0);
			double mp = (ps[(size_t)(b1 + 1) * E + e] - ps[(size_t)(i + 1) * E + e]) / (b1 - i);
			double x = hi - mm, y = mp - hi;
			dot += x * y;
			na += x * x;
			nb += y * y;
		}
		if (na > 1e-24 && nb > 1e-24)
			kp[i] = 1.0 - dot / sqrt(na * nb);
	}
}

/* The cut strengths b[0..n-1) (b_i between tokens i and i+1) from the layers' hidden
 * states and the surprisal (NULL: not used). work: k_segment_work doubles; b lives in it
 * and is returned. */
static inline double *k_segment_strength(const struct k_segment_params *sp, int32_t n,
                                         int n_embd, int n_hid, const float *const *hid,
                                         const float *surprisal, double *work)
{
	const size_t E = (size_t)n_embd, N = (size_t)n;
	const int nk = n_hid * sp->n_win;
	double *ps = work;                      /* [(n+1) × E] prefix sums */
	double *kap = ps + (N + 1) * E;         /* [nk × n] */
	double *kf = kap + (size_t)nk * N;      /* [n] */
	double *za = kf + N, *zb = za + N, *tmp = zb + N; /* [n] each */
	for (int l = 0; l < n_hid; l++) {
		const float *h = hid[l];
		for (size_t e = 0; e < E; e++)
			ps[e] = 0.0;
		for (size_t i = 0; i < N; i++)
			for (size_t e = 0; e < E; e++)
				ps[(i + 1) * E + e] = ps[i * E + e] + h[i * E + e];
		for (int w = 0; w < sp->n_win; w++)
			k_segment_curvature(h, ps, n, E, sp->win[w], kap + (size_t)(l * sp->n_win + w) * N);
	}
	for (size_t i = 0; i < N; i++) {
		double s = 0.0, s2 = 0.0;
		for (int k = 0; k < nk; k++)
			s += kap[(size_t)k * N + i];
		s /= nk;
		for (int k = 0; k < nk; k++) {
			double dd = kap[(size_t)k * N + i] - s;
			s2 += dd * dd;
		}
		kf[i] = s - sp->stability * sqrt(s2 / nk);
	}
	k_segment_robust_z(kf, n - 1, za, tmp);
	for (int32_t i = 0; i + 1 < n; i++)
		zb[i] = 0.0;
	if (surprisal && sp->surprisal != 0.0) {
		for (int32_t i = 0; i + 1 < n; i++)
			kf[i] = surprisal[i + 1];
		k_segment_robust_z(kf, n - 1, zb, tmp);
	}
	for (int32_t i = 0; i + 1 < n; i++)
		kf[i] = za[i] + sp->surprisal * zb[i];
	return kf;
}

/* The DP over segment ends (see the top) on the cut strengths b: seg_start[0..k), returns k,
 * or 0 when no cutting is feasible. f, arg: [n + 1] doubles each. */
static inline int32_t k_segment_cuts(const struct k_segment_params *sp, int32_t n,
                                     const double *b, double *f, double *arg, int32_t *seg_start)
{
	const double T = sp->target_len;
	f[0] = 0.0;
	for (int32_t j = 1; j <= n; j++) {
		f[j] = -INFINITY;
		arg[j] = -1;
		int32_t hi = sp->max_len < j ? sp->max_len : j;
		for (int32_t len = hi; len >= sp->min_len; len--) {
			int32_t i = j - len;
			if (f[i] == -INFINITY)
				continue;
			double pen = (len - T) / T;
			double val = f[i] + (i > 0 ? b[i - 1] - sp->cut : 0.0) - sp->length * pen * pen;
			if (val > f[j]) {
				f[j] = val;
				arg[j] = i;
			}
		}
	}
	if (f[n] == -INFINITY)
		return 0;
	int32_t k = 0;
	for (int32_t j = n; j > 0; j = (int32_t)arg[j])
		seg_start[k++] = (int32_t)arg[j];
	for (int32_t i = 0; i < k / 2; i++) {
		int32_t t = seg_start[i];
		seg_start[i] = seg_start[k - 1 - i];
		seg_start[k - 1 - i] = t;
	}
	return k;
}

/* Cut n tokens into segments. hid[l] (l < n_hid) is a layer's normalised hidden states
 * [n × n_embd]; surprisal [n] is -log p(token_i | tokens < i) in nats (NULL: not used).
 * Outputs seg_start[0..k) (first token of each segment, seg_start[0] = 0), returns k >= 1;
 * boundary[0..n) receives b_i (b_{n-1} = 0) unless NULL. work: k_segment_work doubles.
 * Errors (-1, err "gracekv segment: ..."): n < 1, bad parameters, a NULL layer, no
 * feasible cutting (only when max_len < 2·min_len - 1). */
static inline int k_segment(const struct k_segment_params *sp, int32_t n, int n_embd, int n_hid,
                            const float *const *hid, const float *surprisal, double *work,
                            float *boundary, int32_t *seg_start, rt_err *err)
{
	if (n < 1)
		return rt_err_set(err, "gracekv segment: %d tokens (need at least 1)", (int)n);
	if (sp->min_len < 1 || sp->max_len < sp->min_len || sp->target_len < 1 || sp->n_win < 1 ||
	    sp->n_win > 4 || n_embd < 1 || n_hid < 1 || !hid)
		return rt_err_set(err, "gracekv segment: bad parameters (lengths %d..%d target %d, %d windows, %d layers of %d dims)",
		                  sp->min_len, sp->max_len, sp->target_len, sp->n_win, n_hid, n_embd);
	for (int w = 0; w < sp->n_win; w++)
		if (sp->win[w] < 1)
			return rt_err_set(err, "gracekv segment: window %d has size %d", w, sp->win[w]);
	for (int l = 0; l < n_hid; l++)
		if (!hid[l])
			return rt_err_set(err, "gracekv segment: hidden states of layer %d missing", l);
	if (boundary)
		for (int32_t i = 0; i < n; i++)
			boundary[i] = 0.0f;
	if (n < sp->min_len || n == 1) {
		seg_start[0] = 0;
		return 1;
	}
	const size_t N = (size_t)n;
	double *b = k_segment_strength(sp, n, n_embd, n_hid, hid, surprisal, work);
	if (boundary)
		for (int32_t i = 0; i + 1 < n; i++)
			boundary[i] = (float)b[i];
	double *f = b + 4 * N, *arg = f + N + 1; /* after kf, za, zb, tmp */
	int32_t k = k_segment_cuts(sp, n, b, f, arg, seg_start);
	if (k == 0)
		return rt_err_set(err, "gracekv segment: %d tokens cannot be cut into segments of %d..%d",
		                  (int)n, sp->min_len, sp->max_len);
	return k;
}

#endif
