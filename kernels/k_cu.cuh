/*
 * k_cu: what the CUDA kernel templates (kernels/k_*.cuh) share — the host+device function
 * marker, the parameter block passed to kernels by value, and block-wide reductions.
 * Versions: 1 (block reductions through warp shuffles and one shared slot per warp).
 * CPU reference: the reductions are plain sums/maxima; every template that uses them
 * keeps its own host loop (see each file).
 */
#ifndef K_CU_CUH
#define K_CU_CUH

#include <stdint.h>

#include "k_abi.h"

/* Functions compiled for both sides are marked K_HD (k_abi.h). */

/* Threads per block of every template kernel (a multiple of 32, at most 1024). */
#define K_CU_THREADS 256

/* Parameters of a policy (kvp_ctx.params), by value in kernel arguments. */
#define K_CU_MAX_PARAMS 32
struct k_cu_params {
	double v[K_CU_MAX_PARAMS];
};

/* Block-wide sum / max of one value per thread (every thread gets the result). sh: at
 * least 33 slots of shared memory; callers separate consecutive calls with their own
 * __syncthreads (the functions end with one). */
__device__ inline double k_cu_block_sum(double x, double *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_down_sync(0xffffffffu, x, o);
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	if (lane == 0)
		sh[w] = x;
	__syncthreads();
	if (threadIdx.x == 0) {
		double t = 0;
		for (int i = 0; i < nw; i++)
			t += sh[i];
		sh[32] = t;
	}
	__syncthreads();
	double r = sh[32];
	__syncthreads();
	return r;
}

__device__ inline float k_cu_block_max(float x, float *sh)
{
	for (int o = 16; o > 0; o >>= 1) {
		float y = __shfl_down_sync(0xffffffffu, x, o);
		x = y > x ? y : x;
	}
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	if (lane == 0)
		sh[w] = x;
	__syncthreads();
	if (threadIdx.x == 0) {
		float t = sh[0];
		for (int i = 1; i < nw; i++)
			t = sh[i] > t ? sh[i] : t;
		sh[32] = t;
	}
	__syncthreads();
	float r = sh[32];
	__syncthreads();
	return r;
}

__device__ inline int32_t k_cu_block_sum_i(int32_t x, int32_t *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_down_sync(0xffffffffu, x, o);
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	if (lane == 0)
		sh[w] = x;
	__syncthreads();
	if (threadIdx.x == 0) {
		int32_t t = 0;
		for (int i = 0; i < nw; i++)
			t += sh[i];
		sh[32] = t;
	}
	__syncthreads();
	int32_t r = sh[32];
	__syncthreads();
	return r;
}

__device__ inline int32_t k_cu_block_max_i(int32_t x, int32_t *sh)
{
	for (int o = 16; o > 0; o >>= 1) {
		int32_t y = __shfl_down_sync(0xffffffffu, x, o);
		x = y > x ? y : x;
	}
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	if (lane == 0)
		sh[w] = x;
	__syncthreads();
	if (threadIdx.x == 0) {
		int32_t t = sh[0];
		for (int i = 1; i < nw; i++)
			t = sh[i] > t ? sh[i] : t;
		sh[32] = t;
	}
	__syncthreads();
	int32_t r = sh[32];
	__syncthreads();
	return r;
}

#endif
