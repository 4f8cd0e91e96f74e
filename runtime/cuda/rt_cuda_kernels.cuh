/*
 * rt_cuda_kernels: the model's elementwise and row kernels for libkvrt_cuda, each beside
 * its CPU reference (the llm.c dev/cuda convention: the reference is the plain loop of
 * runtime/model/rt_model.c it replaces, kept here as rt_cu_*_ref so the GPU check
 * (tests/cuda/gpu_check.cu) and the host tests compare against it).
 *
 *   embed     x[r] = tok_embd[tok[r]]                           (gather)
 *   rmsnorm   y = x / sqrt(mean(x^2) + eps) ⊙ w, sum of squares in double, one block/row
 *   rope      ggml mode 0 ("normal"): rotate ADJACENT pairs (x[2i], x[2i+1]) of each head
 *             by pos · base^(-2i/n_rot); cos/sin in double then rounded to float, as
 *             rope_table of rt_model.c
 *   swiglu    g ← g / (1 + exp(-g)) · u
 *   append    the chunk's keys/values into each (layer, KV head) list at its entry count,
 *             count 1, log count 0, span id (rt_span_mark_at), zeroed statistics
 *   to_half   f32 → f16 (round to nearest even) for the f16 GEMM path
 *
 * Versions: 1 for each (one thread per element; rmsnorm one block per row).
 * Build line: nvcc -std=c++17 -O2 -arch=sm_90 -Iruntime -Ikernels -c runtime/cuda/rt_cuda_model.cu
 */
#ifndef RT_CUDA_KERNELS_CUH
#define RT_CUDA_KERNELS_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "k_cu.cuh"
#include "policy/rt_span.h"

extern "C" {
#include "model/rt_model.h"
}

/* ---- embed -------------------------------------------------------------------------- */
static __global__ void rt_cu_embed(float *x, const float *emb, const int32_t *tok, int C, int E)
{
	const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= (size_t)C * E)
		return;
	const size_t r = idx / E, j = idx - r * E;
	x[idx] = emb[(size_t)tok[r] * E + j];
}

static inline void rt_cu_embed_ref(float *x, const float *emb, const int32_t *tok, int C, int E)
{
	for (int r = 0; r < C; r++)
		memcpy(x + (size_t)r * E, emb + (size_t)tok[r] * E, (size_t)E * sizeof(float));
}

/* ---- rmsnorm ------------------------------------------------------------------------ */
static __global__ void rt_cu_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
	__shared__ double sh[33];
	const float *xr = x + (size_t)blockIdx.x * n;
	float *yr = y + (size_t)blockIdx.x * n;
	double ss = 0.0;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		ss += (double)xr[i] * xr[i];
	ss = k_cu_block_sum(ss, sh);
	const float scale = (float)(1.0 / sqrt(ss / n + (double)eps));
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = xr[i] * scale * w[i];
}

/* the forward's own loop (rt_rms_norm of runtime/model/rt_model.c) */
static inline void rt_cu_rmsnorm_ref(float *y, const float *x, const float *w, int C, int n,
                                     float eps)
{
	rt_rms_norm(y, x, w, C, n, eps);
}

/* ---- rope --------------------------------------------------------------------------- */
/* cs[r × n_rot]: interleaved cos, sin of (pos0 + r) · base^(-2i/n_rot). */
static __global__ void rt_cu_rope_table(float *cs, int C, int64_t pos0, int n_rot, float base)
{
	const int idx = blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= C * (n_rot / 2))
		return;
	const int r = idx / (n_rot / 2), i = idx - r * (n_rot / 2);
	const double theta = (double)(pos0 + r) * pow((double)base, -2.0 * i / n_rot);
	cs[(size_t)r * n_rot + 2 * i] = (float)cos(theta);
	cs[(size_t)r * n_rot + 2 * i + 1] = (float)sin(theta);
}

/* x: [C × n_heads × head_dim] rows; rotate the first n_rot dims of every head. */
static __global__ void rt_cu_rope(float *x, const float *cs, int C, int n_heads, int head_dim, int n_rot)
{
	const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	const size_t per_row = (size_t)n_heads * (n_rot / 2);
	if (idx >= (size_t)C * per_row)
		return;
	const size_t r = idx / per_row, rem = idx - r * per_row;
	const int h = (int)(rem / (n_rot / 2)), i = (int)(rem - (size_t)h * (n_rot / 2));
	float *v = x + (r * n_heads + h) * head_dim;
	const float co = cs[r * n_rot + 2 * i], si = cs[r * n_rot + 2 * i + 1];
	const float x0 = v[2 * i], x1 = v[2 * i + 1];
	v[2 * i] = x0 * co - x1 * si;
	v[2 * i + 1] = x0 * si + x1 * co;
}

static inline void rt_cu_rope_ref(float *x, int C, int64_t pos0, int n_heads, int head_dim,
                                  int n_rot, float base)
{
	for (int r = 0; r < C; r++)
		for (int i = 0; i < n_rot / 2; i++) {
			const double theta = (double)(pos0 + r) * pow((double)base, -2.0 * i / n_rot);
			const float co = (float)cos(theta), si = (float)sin(theta);
			for (int h = 0; h < n_heads; h++) {
				float *v = x + ((size_t)r * n_heads + h) * head_dim;
				const float x0 = v[2 * i], x1 = v[2 * i + 1];
				v[2 * i] = x0 * co - x1 * si;
				v[2 * i + 1] = x0 * si + x1 * co;
			}
		}
}

/* ---- swiglu ------------------------------------------------------------------------- */
static __global__ void rt_cu_swiglu(float *g, const float *u, size_t n)
{
	const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) {
		const float x = g[i];
		g[i] = x / (1.0f + expf(-x)) * u[i];
	}
}

static inline void rt_cu_swiglu_ref(float *g, const float *u, size_t n)
{
	for (size_t i = 0; i < n; i++)
		g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- append ------------------------------------------------------------------------- */
/* Layer `layer` of a chunk of C rows: k, v [C × n_kv_head·hd]; row r of KV head j goes to
 * entry nb[hi] + r of head hi = layer · n_kv_head + j. Grid (n_kv_head, C), hd threads. */
static __global__ void rt_cu_append(float *K, float *V, int32_t *pos, float *count, float *log_count,
                             uint16_t *span, uint8_t *stats, const float *k, const float *v,
                             const int32_t *nb, int layer, int n_kv_head, int hd, int32_t cap,
                             size_t stat_bytes, int64_t pos0, rt_span_mark sm)
{
	const int j = blockIdx.x, r = blockIdx.y;
	const size_t hi = (size_t)layer * n_kv_head + j;
	const size_t e = hi * (size_t)cap + (size_t)nb[hi] + r;
	const size_t src = ((size_t)r * n_kv_head + j) * hd;
	for (int d = threadIdx.x; d < hd; d += blockDim.x) {
		K[e * hd + d] = k[src + d];
		V[e * hd + d] = v[src + d];
	}
	for (size_t b = threadIdx.x; b < stat_bytes; b += blockDim.x)
		stats[e * stat_bytes + b] = 0;
	if (threadIdx.x == 0) {
		pos[e] = (int32_t)(pos0 + r);
		count[e] = 1.0f;
		log_count[e] = 0.0f;
		span[e] = rt_span_mark_at(sm, pos0 + r);
	}
}

/* nb[h] += C for every head (after the chunk's last layer). */
static __global__ void rt_cu_advance(int32_t *n, int H, int C)
{
	const int h = blockIdx.x * blockDim.x + threadIdx.x;
	if (h < H)
		n[h] += C;
}

/* ---- f16 ---------------------------------------------------------------------------- */
static __global__ void rt_cu_to_half(__half *y, const float *x, size_t n)
{
	const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = __float2half_rn(x[i]);
}

/* Blocks of `threads` covering n elements. */
static inline unsigned rt_cu_blocks(size_t n, unsigned threads)
{
	return (unsigned)((n + threads - 1) / threads);
}

#endif
