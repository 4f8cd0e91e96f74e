/*
 * k_cu: what the CUDA kernel templates (kernels/k_*.cuh) share — the host+device function
 * marker, the parameter block passed to kernels by value, and block-wide reductions.
 * Versions: 1 (block reductions through warp shuffles and one shared slot per warp);
 * 2 (the four reductions are one macro, K_CU_BLOCK_REDUCE, the sums starting from
 * warp 0's result rather than 0: the same value but for the sign of a zero total).
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
/* the block reductions below shuffle over full warps and keep one slot per warp */
static_assert(K_CU_THREADS % 32 == 0 && K_CU_THREADS <= 1024, "K_CU_THREADS: full warps, <= 1024");

/* Parameters of a policy (kvp_ctx.params), by value in kernel arguments. */
#define K_CU_MAX_PARAMS 32
struct k_cu_params {
	double v[K_CU_MAX_PARAMS];
};

/* K_CU_BLOCK_REDUCE(NAME, T, OP): NAME(x, sh), the block-wide reduction of one T per
 * thread by OP (a sum or a maximum; every thread gets the result). sh: at least 33 slots
 * of shared memory, which consecutive calls may share with no barrier between them (the
 * function ends with one). The block is whole warps (the full-mask shuffle; launch with
 * K_CU_THREADS). The order is fixed (shuffles down within each warp, then
 * thread 0 over the warps' results in warp order), so a reduction repeats bit for bit;
 * a NaN in a maximum is kept or dropped as the comparison OP makes it. */
#define K_CU_ADD(a, b) ((a) + (b))
#define K_CU_MAX(a, b) ((b) > (a) ? (b) : (a))
#define K_CU_BLOCK_REDUCE(NAME, T, OP)                                                   \
	__device__ inline T NAME(T x, T *sh)                                              \
	{                                                                                 \
		for (int o = 16; o > 0; o >>= 1) {                                        \
			const T y = __shfl_down_sync(0xffffffffu, x, o);                  \
			x = OP(x, y);                                                     \
		}                                                                         \
		const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;                  \
		const int nw = (blockDim.x + 31) >> 5;                                    \
		if (lane == 0)                                                            \
			sh[w] = x;                                                        \
		__syncthreads();                                                          \
		if (threadIdx.x == 0) {                                                   \
			T t = sh[0];                                                      \
			for (int i = 1; i < nw; i++)                                      \
				t = OP(t, sh[i]);                                         \
			sh[32] = t;                                                       \
		}                                                                         \
		__syncthreads();                                                          \
		const T r = sh[32];                                                       \
		__syncthreads();                                                          \
		return r;                                                                 \
	}

K_CU_BLOCK_REDUCE(k_cu_block_sum, double, K_CU_ADD)
K_CU_BLOCK_REDUCE(k_cu_block_max, float, K_CU_MAX)
K_CU_BLOCK_REDUCE(k_cu_block_sum_i, int32_t, K_CU_ADD)
K_CU_BLOCK_REDUCE(k_cu_block_max_i, int32_t, K_CU_MAX)

#endif
