/*
 * k_alloc: budget allocation — how many entries each (layer, KV head) keeps.
 *
 *   per-layer schedules: uniform; PyramidKV's linear ramp with beta (arXiv 2406.02069, as
 *   in KVCache-Factory's PyramidKVCluster, integer arithmetic included) and its reverse,
 *   the funnel; a linear ramp from..to; an explicit list of multipliers (resampled by
 *   nearest index, renormalised to mean 1);
 *   across heads: adaptive (Ada-KV, arXiv 2407.11550: the top of all candidates of the
 *   heads jointly decides each head's share n_g; b_g = round(floor * B_g + (1 - floor) *
 *   n_g)), used within one layer or over every head of the model (global pool).
 *
 * Budgets are in entries per head. A budget keeps floor(x) entries (k_floor_entries);
 * Ada-KV's per-head formula rounds to nearest (k_round_entries), as the paper's code.
 */
#ifndef K_ALLOC_H
#define K_ALLOC_H

#include <math.h>
#include <stdint.h>

#include "k_abi.h"
#include "k_select.h"

static inline int32_t k_round_entries(double x)
{
	if (!(x > 0))
		return 0;
	if (x > 2147483647.0)
		return INT32_MAX;
	return (int32_t)floor(x + 0.5);
}

/* A budget or target in entries: the largest whole number of entries not above x, so
 * after a compress `entries > budget` no longer holds. A relative tolerance of 1e-9
 * absorbs rounding of ratio × context (0.29 × 100 = 28.999999999999996 keeps 29). Both
 * back ends (K_HD): the device compress (kernels/k_compact.cuh) floors the same way. */
K_HD int32_t k_floor_entries(double x)
{
	if (!(x > 0))
		return 0;
	if (x > 2147483647.0)
		return INT32_MAX;
	return (int32_t)floor(x + 1e-9 * x);
}

/* A budget in bytes as entries: left bytes (a head's layer budget, f16 entries' bytes, less
 * its guards' bytes) at per bytes an entry, floored (k_floor_entries); 0 when either is not
 * positive. The C compress (k_head_bytes, kernels/k_compress.h) and the device compress
 * (k_cu_head_budget, kernels/k_compact.cuh) both call it. */
K_HD int32_t k_bytes_entries(double left, double per)
{
	return per > 0 && left > 0 ? k_floor_entries(left / per) : 0;
}

/* PyramidKV per-layer budgets (entries, window included). B: average budget per head
 * (window included), w: observation/recent window, beta: ramp steepness, n: entries
 * before compression, L layers. out[L]. funnel != 0 reverses the ramp (most at the top).
 * Branches as KVCache-Factory: n < B: keep n everywhere; n < 2(B - w): uniform B. */
static inline void k_layers_pyramid(double B, double w, double beta, double n, int L, int funnel,
                                    double *out)
{
	int64_t b = (int64_t)floor(B), ww = (int64_t)floor(w), nn = (int64_t)floor(n);
	int64_t be = (int64_t)floor(beta);
	if (be < 1)
		be = 1;
	if (nn < b) {
		for (int l = 0; l < L; l++)
			out[l] = (double)nn;
		return;
	}
	if (nn < 2 * (b - ww) || L < 2 || b <= ww) {
		for (int l = 0; l < L; l++)
			out[l] = (double)b;
		return;
	}
	int64_t min_num = (b - ww) / be;
	int64_t max_num = 2 * (b - ww) - min_num;
	if (max_num >= nn - ww) {
		max_num = nn - ww;
		min_num = 2 * (b - ww) - max_num;
	}
	int64_t step = (max_num - min_num) / (L - 1);
	for (int l = 0; l < L; l++) {
		int li = funnel ? L - 1 - l : l;
		out[l] = (double)(max_num - li * step + ww);
	}
}

/* Scale B by multipliers m[L] renormalised to mean 1 (all B when they sum to 0). */
static inline void k_layers_scale(double B, const double *m, int L, double *out)
{
	double s = 0;
	for (int l = 0; l < L; l++)
		s += m[l];
	for (int l = 0; l < L; l++)
		out[l] = s > 0 ? B * m[l] * L / s : B;
}

/* Linear ramp of multipliers from `from` (layer 0) to `to` (layer L-1), out[L]. */
static inline void k_layers_linear(double B, double from, double to, int L, double *out)
{
	for (int l = 0; l < L; l++)
		out[l] = L > 1 ? from + (to - from) * l / (L - 1) : from;
	double s = 0;
	for (int l = 0; l < L; l++)
		s += out[l];
	for (int l = 0; l < L; l++)
		out[l] = s > 0 ? B * out[l] * L / s : B;
}

/* Explicit multipliers list[n_list], resampled to L layers by nearest index
 * (layer l takes list[l * n_list / L]), renormalised to mean 1. out[L]. */
static inline void k_layers_list(double B, const double *list, int n_list, int L, double *out)
{
	for (int l = 0; l < L; l++)
		out[l] = list[(int64_t)l * n_list / L];
	double s = 0;
	for (int l = 0; l < L; l++)
		s += out[l];
	for (int l = 0; l < L; l++)
		out[l] = s > 0 ? B * out[l] * L / s : B;
}

/* Adaptive allocation over H heads (Ada-KV). Head j has n[j] entries with scores
 * score[j] (pointer to [n[j]]), positions pos[j], candidate flags cand[j] (entries not
 * guarded), and a base budget base[j] (free entries it would get uniformly). The top
 * sum(base) candidates over all heads, by (score desc, pos asc, head asc), give n_g per
 * head; out[j] = min(candidates_j, round(floor * base_j + (1 - floor) * n_g)).
 * buf and tmp: [sum n] scratch. */
static inline void k_alloc_adaptive(int H, const float *const *score, const int32_t *const *pos,
                                    const uint8_t *const *cand, const int32_t *n,
                                    const int32_t *base, double floor_frac, int32_t *out,
                                    struct k_cand *buf, struct k_cand *tmp)
{
	int64_t m = 0, total = 0;
	for (int j = 0; j < H; j++) {
		total += base[j];
		out[j] = 0;
		for (int32_t i = 0; i < n[j]; i++)
			if (cand[j][i])
				buf[m++] = (struct k_cand){ score[j][i], pos[j][i], i, j };
	}
	if (total < m)
		k_cand_sort(buf, m, tmp);
	int64_t take = total < m ? total : m;
	for (int64_t t = 0; t < take; t++)
		out[buf[t].head]++;
	for (int j = 0; j < H; j++) {
		int32_t c = 0;
		for (int32_t i = 0; i < n[j]; i++)
			c += cand[j][i] != 0;
		int32_t b = k_round_entries(floor_frac * base[j] + (1.0 - floor_frac) * out[j]);
		out[j] = b < c ? b : c;
	}
}

#endif
