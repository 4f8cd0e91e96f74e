/*
 * k_score: the vector stages of a policy's score at compress time, over the n entries of
 * one (layer, KV head): key/value norms and the KeyDiff anchor cosine, the CAOTE
 * output-error transform (with the true attention outputs a policy keeps in its per-head
 * state, or the mean value), normalisation, 1-D pooling over the entry axis, and the
 * group reduction over the query heads of a KV head (GQA: mean, max, sum, or l2, the
 * root sum of squares). Every function is a plain loop in a
 * fixed order, so results are reproducible; tests compare each with hand-computed values.
 */
#ifndef K_SCORE_H
#define K_SCORE_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "k_abi.h"

/* ||x||_2 of x[d]. */
K_HD double k_norm(const float *x, int d)
{
	double s = 0;
	for (int j = 0; j < d; j++)
		s += (double)x[j] * x[j];
	return sqrt(s);
}

/* ||x||_1 of x[d] (VATP's value norm, arXiv 2406.12335). */
K_HD double k_norm_l1(const float *x, int d)
{
	double s = 0;
	for (int j = 0; j < d; j++)
		s += fabs((double)x[j]);
	return s;
}

/* KVzap's linear scorer (arXiv 2601.07891, kvpress KVzapPress with model_type
 * "linear"): w·x + b over the hidden size E, row = [w_0 .. w_{E-1}, b], accumulated in
 * double in index order. */
K_HD double k_linear(const float *row, const float *x, int E)
{
	double s = 0;
	for (int j = 0; j < E; j++)
		s += (double)row[j] * x[j];
	return s + row[E];
}

/* KeyDiff anchor (arXiv 2504.15364): a[d] = mean over the n keys k[n × d] of k_i/||k_i||
 * (zero keys contribute 0). */
static inline void k_key_anchor(const float *k, int32_t n, int d, double *a)
{
	for (int j = 0; j < d; j++)
		a[j] = 0;
	for (int32_t i = 0; i < n; i++) {
		const float *ki = k + (size_t)i * d;
		double nk = k_norm(ki, d);
		if (nk > 0)
			for (int j = 0; j < d; j++)
				a[j] += ki[j] / nk;
	}
	if (n > 0)
		for (int j = 0; j < d; j++)
			a[j] /= n;
}

/* cos(x, a) for x[d] (float) and a[d] (double); 0 when either is zero. */
static inline double k_cos_anchor(const float *x, const double *a, int d)
{
	double xy = 0, xx = 0, aa = 0;
	for (int j = 0; j < d; j++) {
		xy += x[j] * a[j];
		xx += (double)x[j] * x[j];
		aa += a[j] * a[j];
	}
	return xx > 0 && aa > 0 ? xy / sqrt(xx * aa) : 0.0;
}

/* R-KV's redundancy of each of the n keys k[n × d] of a head (Cai et al., arXiv 2505.24133,
 * as kvpress rkv_press.py cal_similarity with threshold 0.5 and retain_direction "last"):
 * c_ij = k_iᵀk_j / ((||k_i|| + 1e-8)(||k_j|| + 1e-8)) for j != i, c_ii = 0; in row i the
 * entry of the newest position among those with c_ij > 0.5 is set to 0 (the one similar key
 * a token may keep; with none, the oldest position's, as kvpress zeroes index 0); then
 * r_i = (1/n) sum_j c_ij and out[i] = exp(r_i) / sum_m exp(r_m). pos[n]: the entries'
 * positions (the list may be out of position order after an eviction); nrm[n]: scratch.
 * O(n² d). */
static inline void k_key_redundancy(const float *k, const int32_t *pos, int32_t n, int d,
                                    float *out, float *nrm)
{
	for (int32_t i = 0; i < n; i++)
		nrm[i] = (float)(k_norm(k + (size_t)i * d, d) + 1e-8);
	double mx = -INFINITY;
	for (int32_t i = 0; i < n; i++) {
		const float *ki = k + (size_t)i * d;
		double sum = 0, c_last = 0, c_old = 0;
		int32_t last = -1, old = -1;
		for (int32_t j = 0; j < n; j++) {
			if (j == i)
				continue;
			const float *kj = k + (size_t)j * d;
			double dot = 0;
			for (int t = 0; t < d; t++)
				dot += (double)ki[t] * kj[t];
			const double c = dot / ((double)nrm[i] * nrm[j]);
			sum += c;
			if (c > 0.5 && (last < 0 || pos[j] > pos[last])) {
				last = j;
				c_last = c;
			}
			if (old < 0 || pos[j] < pos[old]) {
				old = j;
				c_old = c;
			}
		}
		/* the oldest is the diagonal when i itself is the oldest: nothing to remove */
		if (last >= 0)
			sum -= c_last;
		else if (old >= 0 && pos[old] < pos[i])
			sum -= c_old;
		out[i] = (float)(sum / n);
		mx = out[i] > mx ? out[i] : mx;
	}
	double z = 0;
	for (int32_t i = 0; i < n; i++)
		z += exp(out[i] - mx);
	for (int32_t i = 0; i < n; i++)
		out[i] = (float)(exp(out[i] - mx) / z);
}

/* s[j] <- s[j] / sum_i s[i] over n entries (all 0 when the sum is 0). */
static inline void k_normalize(float *s, int32_t n)
{
	double t = 0;
	for (int32_t i = 0; i < n; i++)
		t += s[i];
	for (int32_t i = 0; i < n; i++)
		s[i] = t != 0 ? (float)(s[i] / t) : 0.0f;
}

/* Query heads per KV head whose attention output a policy's per-head state can hold
 * (the state is sized per head_dim, not per group: rt_policy.h state_words_dim). The
 * generated compress refuses a larger group with an error. */
#define K_OUT_MAX_GROUP 16

/* Store the attention outputs out[group × d] of the latest observed step into a KV
 * head's state (rows of d floats, query head r at row r; at most K_OUT_MAX_GROUP rows). */
static inline void k_out_store(uint8_t *state, const float *out, int group, int d)
{
	int rows = group < K_OUT_MAX_GROUP ? group : K_OUT_MAX_GROUP;
	memcpy(state, out, (size_t)rows * (size_t)d * sizeof(float));
}

/* The stored output of query head r: [d] floats. */
static inline const float *k_out_row(const uint8_t *state, int r, int d)
{
	return (const float *)(const void *)state + (size_t)r * (size_t)d;
}

/* CAOTE (Goel et al., arXiv 2504.14051), in place on s[n] with values v[n × d]:
 * alpha_j = s_j / sum_i s_i (the base score normalised to sum 1);
 * exact (o_true != NULL): o = o_true[d], the TRUE attention output of the query head
 * at the latest observed step; fast (o_true == NULL): o = mean_i v_i (FastCAOTE);
 * s_j <- alpha_j / (1 - alpha_j) * ||o - v_j||_2, and FLT_MAX when alpha_j >= 1
 * (removing the only attended entry is never cheap). o is [d] scratch. When the base
 * score is the latest step's attention, this is exactly the change of that step's
 * output if entry j alone were removed: o - o'_j = alpha_j (v_j - o) / (1 - alpha_j). */
static inline void k_caote(float *s, const float *v, int32_t n, int d, const float *o_true,
                           double *o)
{
	double t = 0;
	for (int32_t i = 0; i < n; i++)
		t += s[i];
	for (int j = 0; j < d; j++)
		o[j] = o_true ? (double)o_true[j] : 0.0;
	if (!o_true && n > 0) {
		for (int32_t i = 0; i < n; i++)
			for (int j = 0; j < d; j++)
				o[j] += v[(size_t)i * d + j];
		for (int j = 0; j < d; j++)
			o[j] /= n;
	}
	for (int32_t i = 0; i < n; i++) {
		double a = t != 0 ? s[i] / t : 0.0;
		if (a >= 1.0) {
			s[i] = FLT_MAX;
			continue;
		}
		double e = 0;
		for (int j = 0; j < d; j++) {
			double x = o[j] - v[(size_t)i * d + j];
			e += x * x;
		}
		s[i] = (float)(a / (1.0 - a) * sqrt(e));
	}
}

/* 1-D pooling over the first n entries, stride 1, window [i - k/2, i + k/2] clipped to
 * [0, n): max pooling ignores the padding (-inf); average pooling divides by k (zero
 * padding counted, as torch avg_pool1d(padding=k/2)). in[n] -> out[n], out != in. */
static inline void k_pool(const float *in, float *out, int32_t n, int32_t k, int is_max)
{
	int32_t h = k / 2;
	for (int32_t i = 0; i < n; i++) {
		int32_t lo = i - h < 0 ? 0 : i - h, hi = i + h >= n ? n - 1 : i + h;
		if (is_max) {
			float m = in[lo];
			for (int32_t j = lo + 1; j <= hi; j++)
				if (in[j] > m)
					m = in[j];
			out[i] = m;
		} else {
			double s = 0;
			for (int32_t j = lo; j <= hi; j++)
				s += in[j];
			out[i] = (float)(s / k);
		}
	}
}

/* L2: sqrt of the sum of squares (CAOTE's GQA rule, docs/language.md section 7.6: the
 * squared output errors of the query heads sharing an entry add up). kind: enum k_reduce
 * (k_abi.h), not K_REDUCE_NONE. */

/* Entries per block of k_reduce: a block's accumulators stay in registers or L1. */
#define K_REDUCE_BLOCK 64

/* k_reduce on the m entries of one block (m <= K_REDUCE_BLOCK; a literal K_REDUCE_BLOCK
 * after inlining, so every loop has a fixed trip count and vectorises). */
static inline void k_reduce_block(float *dst, const float *src, int group, int32_t stride,
                                  int32_t m, int kind)
{
	double acc[K_REDUCE_BLOCK];
	if (kind == K_REDUCE_L2)
		for (int32_t j = 0; j < m; j++)
			acc[j] = (double)src[j] * src[j];
	else
		for (int32_t j = 0; j < m; j++)
			acc[j] = src[j];
	for (int r = 1; r < group; r++) {
		const float *sr = src + (size_t)r * stride;
		if (kind == K_REDUCE_MAX)
			for (int32_t j = 0; j < m; j++) {
				double x = sr[j];
				acc[j] = x > acc[j] ? x : acc[j];
			}
		else if (kind == K_REDUCE_L2)
			for (int32_t j = 0; j < m; j++) {
				double x = sr[j];
				acc[j] += x * x;
			}
		else
			for (int32_t j = 0; j < m; j++)
				acc[j] += sr[j];
	}
	if (kind == K_REDUCE_MEAN)
		for (int32_t j = 0; j < m; j++)
			dst[j] = (float)(acc[j] / group);
	else if (kind == K_REDUCE_L2)
		for (int32_t j = 0; j < m; j++)
			dst[j] = (float)sqrt(acc[j]);
	else
		for (int32_t j = 0; j < m; j++)
			dst[j] = (float)acc[j];
}

/* Group reduction: dst[i] = reduce over r < group of src[r × stride + i], i < n, in
 * double in query-head order (the same operations entry by entry whatever the blocking),
 * K_REDUCE_BLOCK entries at a time. dst may be src's first row. */
static inline void k_reduce(float *dst, const float *src, int group, int32_t stride, int32_t n,
                            int kind)
{
	int32_t i0 = 0;
	for (; i0 + K_REDUCE_BLOCK <= n; i0 += K_REDUCE_BLOCK)
		k_reduce_block(dst + i0, src + i0, group, stride, K_REDUCE_BLOCK, kind);
	if (i0 < n)
		k_reduce_block(dst + i0, src + i0, group, stride, n - i0, kind);
}

#endif
