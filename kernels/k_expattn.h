/*
 * k_expattn: Expected Attention (Devoto, Jeblick, Jégou, arXiv 2510.00636; kvpress
 * expected_attention_press.py), the query-statistics score of `expected_attention()`
 * (docs/language.md section 7.8).
 *
 * The queries a head will issue next are modelled as a Gaussian: mean mu and covariance
 * Sigma of the query rows seen so far (BEFORE RoPE, positions >= skip: the first tokens'
 * queries are outliers, kvpress n_sink = 4), rotated by the RoPE matrix averaged over the
 * next F positions (seen .. seen + F - 1, kvpress n_future_positions = 512):
 *   Rbar = mean_p R(p),  mu' = Rbar mu,  Sigma' = Rbar Sigma Rbarᵀ.
 * The expected softmax logit of a key k_i (as stored: post-RoPE) under that Gaussian is
 *   z_i = k_iᵀ mu' / sqrt(d) + k_iᵀ Sigma' k_i / (2 d),
 * and the score of entry i for one query head is softmax_i(z) over the entries at
 * positions >= skip (the sinks are kept by their guard and left out of the softmax, as
 * kvpress removes them before scoring). The policy multiplies by ‖v_i‖ and averages the
 * query heads of a GQA group (kvpress: mean over the group, then (score + eps)·‖v‖).
 *
 * Rbar is block-diagonal in the runtime's RoPE pairs (base/rt_rope.h: adjacent pairs
 * (2i, 2i+1), frequency theta_i), each block [c -s; s c] with c, s the means of cos and
 * sin of p·theta_i over the F positions (a closed form of the sums below). The kernel never
 * forms Sigma': with u_i = Rbarᵀ k_i, k_iᵀ mu' = u_iᵀ mu and k_iᵀ Sigma' k_i = u_iᵀ Sigma u_i.
 *
 * Per-head state (floats, query head r < K_EA_MAX_GROUP of the group): cnt[r] queries
 * observed; mean[r·d ..] their running mean; m2[r·d·d ..] the co-moment sum
 * Σ (q - mean)(q - mean)ᵀ, upper triangle only (Welford's update, exactly symmetric), so
 * Sigma = m2 / cnt (kvpress divides by the number of queries, not cnt - 1).
 * Cost: observe O(group·d²/2) per step and KV head; a score O(n·d²/2) per query head.
 * Plain loops in a fixed order (reproducible); tests/test_policies.c checks the kept
 * entries against an independent numpy computation.
 */
#ifndef K_EXPATTN_H
#define K_EXPATTN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/rt_rope.h"

/* Query heads per KV head the state holds (the state is sized per head_dim and head_dim²,
 * not per group: rt_policy.h state_words, state_words_dim, state_words_dim2 = 16 each).
 * The generated compress refuses a larger group with an error. */
#define K_EA_MAX_GROUP 16

/* Floats of the state for head_dim d: counts, means, co-moments. */
static inline size_t k_ea_state_floats(int d)
{
	return (size_t)K_EA_MAX_GROUP * (1 + (size_t)d + (size_t)d * (size_t)d);
}

/* Add one step's query rows q[group × d] (pre-RoPE) to the state st. */
static inline void k_ea_observe(float *st, const float *q, int group, int d)
{
	const int rows = group < K_EA_MAX_GROUP ? group : K_EA_MAX_GROUP;
	float *cnt = st, *mean = st + K_EA_MAX_GROUP;
	float *m2 = mean + (size_t)K_EA_MAX_GROUP * d;
	for (int r = 0; r < rows; r++) {
		const float *x = q + (size_t)r * d;
		float *mu = mean + (size_t)r * d, *M = m2 + (size_t)r * d * d;
		const double n = (double)cnt[r] + 1.0, w = (n - 1.0) / n;
		for (int a = 0; a < d; a++) {
			const double da = (double)x[a] - mu[a];
			for (int b = a; b < d; b++)
				M[(size_t)a * d + b] += (float)(w * da * ((double)x[b] - mu[b]));
		}
		for (int a = 0; a < d; a++)
			mu[a] += (float)(((double)x[a] - mu[a]) / n);
		cnt[r] = (float)n;
	}
}

/* Layer l's RoPE frequencies in the runtime's per-layer table rope_freq [n_layer ×
 * n_rot/2] (kvp_ctx.rope_freq), or NULL when there is none (every layer at the base). */
static inline const double *k_ea_freq(const double *rope_freq, int layer, int n_rot)
{
	return rope_freq ? rope_freq + (size_t)layer * (size_t)(n_rot / 2) : NULL;
}

/* The means of cos and sin of p·theta_i over p = p0 .. p0 + F - 1 (F >= 1), for the
 * n_rot/2 pairs at frequencies freq[i] (NULL: base^(-2i/n_rot)): cs[2i] = mean cos,
 * cs[2i+1] = mean sin. Σ_k e^{j(p0+k)θ} = e^{j(p0 + (F-1)/2)θ} · sin(Fθ/2) / sin(θ/2), the
 * direct sum when sin(θ/2) is tiny. */
static inline void k_ea_rope_mean(double *cs, double p0, double F, int n_rot, float base,
                                  const double *freq)
{
	for (int i = 0; i < n_rot / 2; i++) {
		const double th = freq ? freq[i] : rt_rope_freq(i, n_rot, base), h = sin(th / 2);
		double c = 0, s = 0;
		if (fabs(h) > 1e-6) {
			const double g = sin(F * th / 2) / h / F, a = (p0 + (F - 1) / 2) * th;
			c = g * cos(a);
			s = g * sin(a);
		} else {
			for (double k = 0; k < F; k++) {
				c += cos((p0 + k) * th);
				s += sin((p0 + k) * th);
			}
			c /= F;
			s /= F;
		}
		cs[2 * i] = c;
		cs[2 * i + 1] = s;
	}
}

/* Expected Attention of query head r over the n entries of a head: keys k[n × d]
 * (post-RoPE, as stored), positions pos[n], the state st (k_ea_observe). s[n] <-
 * softmax over the entries with pos >= skip of z_i (see the file comment), 0 for the
 * others. seen: tokens seen (the next query's position); F: future positions (< 1 counts
 * as 1); rope base, freq (the layer's frequencies, k_ea_freq; NULL: from base) and n_rot:
 * the model's RoPE (n_rot 0: no rotation, Rbar = I).
 * vec: [2 × d] doubles of scratch. No query observed yet: z = 0, a uniform softmax. */
static inline void k_ea_score(float *s, const float *k, const int32_t *pos, int32_t n, int d,
                              const float *st, int r, double seen, double F, double skip,
                              float base, const double *freq, int n_rot, double *vec)
{
	const float *cnt = st, *mu = st + K_EA_MAX_GROUP + (size_t)r * d;
	const float *M = st + K_EA_MAX_GROUP + (size_t)K_EA_MAX_GROUP * d + (size_t)r * d * d;
	double *cs = vec, *u = vec + d;
	const int nr = n_rot < d ? n_rot & ~1 : d & ~1;
	const double nq = cnt[r], isd = 1.0 / sqrt((double)d);
	k_ea_rope_mean(cs, seen, F < 1 ? 1 : F, nr, base, freq);
	double mx = -INFINITY;
	for (int32_t i = 0; i < n; i++) {
		if (pos[i] < skip)
			continue;
		const float *ki = k + (size_t)i * d;
		for (int p = 0; p < nr / 2; p++) { /* u = Rbarᵀ k */
			const double c = cs[2 * p], sn = cs[2 * p + 1], x0 = ki[2 * p], x1 = ki[2 * p + 1];
			u[2 * p] = c * x0 + sn * x1;
			u[2 * p + 1] = -sn * x0 + c * x1;
		}
		for (int a = nr; a < d; a++)
			u[a] = ki[a];
		double lin = 0, quad = 0;
		for (int a = 0; a < d; a++) {
			lin += u[a] * mu[a];
			const float *Ma = M + (size_t)a * d;
			double t = 0;
			for (int b = a + 1; b < d; b++)
				t += Ma[b] * u[b];
			quad += u[a] * (Ma[a] * u[a] + 2 * t);
		}
		const double z = lin * isd + (nq > 0 ? quad / nq : 0.0) / (2.0 * d);
		s[i] = (float)z;
		mx = z > mx ? z : mx;
	}
	double sum = 0;
	for (int32_t i = 0; i < n; i++)
		if (pos[i] >= skip)
			sum += exp((double)s[i] - mx);
	for (int32_t i = 0; i < n; i++)
		s[i] = pos[i] >= skip ? (float)(exp((double)s[i] - mx) / sum) : 0.0f;
}

#endif
