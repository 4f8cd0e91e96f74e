/*
 * k_select.cuh: the CUDA counterpart of k_select.h — top-k selection of one (layer,
 * KV head)'s entries per thread block with the SAME total order as the CPU kernel
 * (higher score first, then lower position, then lower index; NaN ranks below every
 * number), so CPU and GPU keep identical sets (docs/architecture.md, "The KV store").
 *
 * Method: rank counting. Thread i computes rank(i) = the number of candidates that
 * rank before candidate i (O(n^2 / threads) per head, no atomics, no sort
 * instability), and keeps i when rank(i) < k. Exact and deterministic; fine for the
 * budgets of prompt compression. A radix-select version can replace it behind the
 * same launcher. CPU reference: k_select_topk / k_select_ref_rank in k_select.h; the order
 * k_cu_before is host+device so the host references of kernels/k_compact.cuh share it.
 * Versions: 1. Build line: nvcc -std=c++17 -arch=sm_90 -Ikernels -Iruntime (see the Makefile).
 */
#ifndef K_SELECT_CUH
#define K_SELECT_CUH

#include <stdint.h>

/* 1 if (sa, pa, ia) ranks strictly before (sb, pb, ib): the k_cand_before order. */
__host__ __device__ __forceinline__ int k_cu_before(float sa, int32_t pa, int32_t ia, float sb, int32_t pb,
                                           int32_t ib)
{
	int an = isnan(sa), bn = isnan(sb);
	if (an != bn)
		return bn;
	if (!an && sa != sb)
		return sa > sb;
	if (pa != pb)
		return pa < pb;
	return ia < ib;
}

/* One block per head h: scores [H × cap], pos [H × cap], cand [H × cap] (1 =
 * candidate), n [H] entries, k [H] entries to keep; keep [H × cap] receives 1 for the
 * chosen candidates and 0 elsewhere (guards are the caller's business). */
static __global__ void k_cu_select_topk(const float *score, const int32_t *pos, const uint8_t *cand,
                                 const int32_t *n, const int32_t *k, int32_t cap, uint8_t *keep)
{
	const int h = blockIdx.x;
	const float *s = score + (size_t)h * cap;
	const int32_t *p = pos + (size_t)h * cap;
	const uint8_t *c = cand + (size_t)h * cap;
	uint8_t *out = keep + (size_t)h * cap;
	const int32_t nh = n[h], kh = k[h];
	for (int32_t i = threadIdx.x; i < nh; i += blockDim.x) {
		uint8_t chosen = 0;
		if (c[i] && kh > 0) {
			int32_t rank = 0;
			for (int32_t j = 0; j < nh && rank < kh; j++)
				if (j != i && c[j] && k_cu_before(s[j], p[j], j, s[i], p[i], i))
					rank++;
			chosen = rank < kh;
		}
		out[i] = chosen;
	}
}

/* Launch the selection for H heads on stream st (device pointers). */
static inline cudaError_t k_cu_select_launch(const float *score, const int32_t *pos,
                                             const uint8_t *cand, const int32_t *n,
                                             const int32_t *k, int32_t cap, uint8_t *keep, int H,
                                             cudaStream_t st)
{
	if (H <= 0)
		return cudaSuccess;
	k_cu_select_topk<<<H, 256, 0, st>>>(score, pos, cand, n, k, cap, keep);
	return cudaGetLastError();
}

#endif
