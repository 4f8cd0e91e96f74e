/*
 * k_attn: attention over the device KV store with a policy's statistic update fused in
 * (docs/cuda.md; the FlexAttention pattern, a user functor instantiated
 * into a kernel template). For one layer, one chunk of C query rows and every KV head j,
 * query row r of the chunk attends to the nb + r + 1 entries of head (layer, j) that it
 * can see (nb = entries before the chunk; the chunk's own keys were appended already):
 *
 *   s_gi = (q_g · k_i) · scale + log_count_i     for the group's query heads g
 *   p_gi = exp(s_gi - max_i s_gi) / sum_i exp(...)    (sum in double, as rt_attn_softmax)
 *   o_g  = sum_i p_gi v_i
 *   Obs::entry(ob, i) for every visible entry i  — the policy's observe, in the same
 *   kernel, with the probabilities of this row still in the block's scratch
 *
 * exactly the maths of runtime/model/rt_model.c attend_layer + rt_seq's observe. Rows of a
 * chunk update an entry's statistics in row order (a sum over a ring, an EMA and `last`
 * depend on it), so a policy that observes runs one block per KV head looping over the
 * rows (k_cu_attn_rows); without an observer every (KV head, row) is its own block
 * (k_cu_attn_par). The probabilities live in global scratch, [G × cap] floats per block.
 *
 * Versions: 1 (scores, softmax and P·V from global scratch; threads over entries for the
 * scores and the observer, over (query head, dim) for the output); 2 (P·V over slices of
 * the entries with interleaved accumulators, k_cu_attn_pv: version 1's one chain per output
 * read 6.5 GB/s, 0.1% of an H200's bandwidth, at 4096 entries; with it 9.3 GB/s); 3 (the
 * scores from key tiles staged in shared memory, k_cu_attn_scores; same bits).
 * Build line (the library's): nvcc -std=c++17 -arch=sm_90 -Ikernels -Iruntime -c FILE.cu
 * CPU reference: k_cu_attn_ref below (same maths, host loops), which the tests compare
 * with rt_model's attention and the GPU check compares with the kernels.
 *
 * An observer is a type with
 *   enum { active = 0|1, need_out = 0|1 };
 *   K_HD static void entry(const struct k_cu_obs &ob, int32_t i);
 * need_out: the row's outputs o [group × head_dim] are stored in the head's state (the
 * exact CAOTE's k_out_store) after each row.
 */
#ifndef K_ATTN_CUH
#define K_ATTN_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "k_cu.cuh"

/* One layer's attention over the device store (struct rt_cuda_kv's arrays). */
struct k_cu_attn_args {
	const float *q;         /* [C × n_head·hd] post-RoPE queries of the chunk */
	float *out;             /* [C × n_head·hd] attention outputs */
	const float *k, *v;     /* store: [H × cap × hd] */
	const int32_t *pos;     /* [H × cap] */
	const float *count, *log_count; /* [H × cap] */
	uint8_t *stats;         /* [H × cap × stat_bytes] */
	uint8_t *state;         /* [H × state_bytes] */
	const int32_t *nb;      /* [H] entries before the chunk */
	float *scratch;         /* probabilities: n_kv_head × C × G × cap floats (k_cu_attn_par)
	                           or n_kv_head × G × cap (k_cu_attn_rows) */
	size_t stat_bytes, state_bytes;
	int32_t cap;
	int hd, G, n_kv_head, n_layer, layer, C;
	int64_t pos0;           /* position of chunk row 0 */
	float scale;            /* 1 / sqrt(hd) */
	int64_t prompt_len;     /* kvp_ctx.prompt_len */
	double ratio;           /* kvp_ctx.ratio */
	double byte_ratio;      /* kvp_ctx.byte_ratio */
	struct k_cu_params P;   /* kvp_ctx.params */
};

/* What an observer sees at one step over one head (struct kvp_obs plus the head). */
struct k_cu_obs {
	int64_t step;           /* the query's position; tokens seen = step + 1 */
	int32_t n;              /* visible entries */
	int group;
	const float *probs;     /* row r of the group at probs + r × ld */
	int32_t ld;
	uint8_t *stats;         /* the head's statistics: entry i at stats + i × stat_bytes */
	size_t stat_bytes;
	const float *k, *v;     /* the head's keys, values: entry i at i × hd */
	const int32_t *pos;
	const float *count;
	int hd, layer, n_layer;
	int64_t prompt_len;
	double ratio, byte_ratio;
	const double *P;        /* parameters */
};

/* The observer of a policy without statistics (the full cache). */
struct k_cu_obs_none {
	enum { active = 0, need_out = 0 };
	K_HD static void entry(const struct k_cu_obs &, int32_t) {}
};

/* Shared floats for the key tile of k_cu_attn_scores. */
#define K_CU_KTILE 6144

/* P[g·cap + i] = (q_g · k_i) · scale + lc[i] for the G query heads of the group and the lim
 * visible entries, by the whole block: tiles of keys are staged in shared memory with
 * coalesced loads (rows padded to hd + 1 floats, so the threads of a warp, one entry each,
 * read distinct banks), then each (g, i) is one thread's sum over d in order, the same
 * operations as version 1 (which read each key row from global memory one thread at a
 * time) and as k_cu_attn_ref. Ends with the block synchronised. */
static __device__ void k_cu_attn_scores(const float *q, const float *K, const float *lc, float scale, int hd,
                                        int G, int32_t lim, size_t cap, float *P)
{
	__shared__ float kt[K_CU_KTILE];
	const int ld = hd + 1;
	const int32_t T = K_CU_KTILE / ld;
	for (int32_t i0 = 0; i0 < lim; i0 += T) {
		const int32_t nt = lim - i0 < T ? lim - i0 : T;
		for (int x = threadIdx.x; x < nt * hd; x += blockDim.x) {
			const int ii = x / hd, d = x - ii * hd;
			kt[ii * ld + d] = K[(size_t)(i0 + ii) * hd + d];
		}
		__syncthreads();
		for (int idx = threadIdx.x; idx < G * nt; idx += blockDim.x) {
			const int g = idx / nt;
			const int32_t ii = idx - g * nt;
			const float *qg = q + (size_t)g * hd, *kr = kt + ii * ld;
			float s = 0.0f;
			for (int d = 0; d < hd; d++)
				s += qg[d] * kr[d];
			P[(size_t)g * cap + i0 + ii] = s * scale + lc[i0 + ii];
		}
		__syncthreads();
	}
}

/* Shared floats for the partial sums of k_cu_attn_pv. */
#define K_CU_PV_PART 4096

/* o[g·hd + d] = Σ_i P[g·cap + i] · V[i·hd + d] over the lim visible entries, by the whole
 * block. Each output is S partial sums over contiguous slices of the entries (S = 4096 /
 * (G·hd), 1..16), each slice with four interleaved accumulators, added in a fixed order:
 * latency, not arithmetic, bounds this loop, and one chain of lim dependent loads per
 * output (version 1) read 0.1% of an H200's memory bandwidth at 4096 entries. The order is
 * fixed, so a run repeats bit for bit; it differs from k_cu_attn_ref's single chain by
 * rounding only (gpu_check --kernels bounds it). Threads of a warp take consecutive d, so
 * the loads of V coalesce. Ends with the block synchronised. */
static __device__ void k_cu_attn_pv(const float *P, size_t cap, const float *V, int hd, int G, int32_t lim, float *o)
{
	__shared__ float part[K_CU_PV_PART];
	const int GH = G * hd;
	int S = K_CU_PV_PART / GH;
	S = S < 1 ? 1 : S > 16 ? 16 : S;
	S = S > lim ? (lim > 0 ? lim : 1) : S;
	const int32_t per = (lim + S - 1) / S;
	const int direct = S == 1; /* one slice: straight into o (also G·hd > K_CU_PV_PART) */
	for (int idx = threadIdx.x; idx < GH * S; idx += blockDim.x) {
		const int sl = idx / GH, oi = idx - sl * GH, g = oi / hd, d = oi - g * hd;
		const float *row = P + (size_t)g * cap, *vd = V + d;
		int32_t i = sl * per;
		const int32_t end = i + per < lim ? i + per : lim;
		float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
		for (; i + 3 < end; i += 4) {
			a0 += row[i] * vd[(size_t)i * hd];
			a1 += row[i + 1] * vd[(size_t)(i + 1) * hd];
			a2 += row[i + 2] * vd[(size_t)(i + 2) * hd];
			a3 += row[i + 3] * vd[(size_t)(i + 3) * hd];
		}
		for (; i < end; i++)
			a0 += row[i] * vd[(size_t)i * hd];
		const float acc = (a0 + a1) + (a2 + a3);
		if (direct)
			o[oi] = acc;
		else
			part[idx] = acc;
	}
	__syncthreads();
	if (direct)
		return;
	for (int oi = threadIdx.x; oi < GH; oi += blockDim.x) {
		float acc = 0.0f;
		for (int sl = 0; sl < S; sl++)
			acc += part[sl * GH + oi];
		o[oi] = acc;
	}
	__syncthreads();
}

/* One query row r of the chunk over KV head j: P is this block's [G × cap] scratch. */
template <class Obs>
__device__ void k_cu_attn_row(const struct k_cu_attn_args &a, int j, int r, float *P)
{
	__shared__ double shd[33];
	__shared__ float shf[33];
	const int G = a.G, hd = a.hd;
	const size_t hi = (size_t)a.layer * a.n_kv_head + j, cap = (size_t)a.cap;
	const int32_t lim = a.nb[hi] + r + 1;
	const float *K = a.k + hi * cap * hd, *V = a.v + hi * cap * hd;
	const float *lc = a.log_count + hi * cap;
	const size_t qd = (size_t)a.n_kv_head * G * hd;
	const float *q = a.q + (size_t)r * qd + (size_t)j * G * hd;
	k_cu_attn_scores(q, K, lc, a.scale, hd, G, lim, cap, P);
	for (int g = 0; g < G; g++) {
		float *row = P + (size_t)g * cap;
		float mx = -INFINITY;
		for (int32_t i = threadIdx.x; i < lim; i += blockDim.x)
			mx = row[i] > mx ? row[i] : mx;
		mx = k_cu_block_max(mx, shf);
		double sum = 0.0;
		for (int32_t i = threadIdx.x; i < lim; i += blockDim.x) {
			float x = row[i] - mx;
			float e = expf(x < -80.0f ? -80.0f : x);
			row[i] = e;
			sum += e;
		}
		sum = k_cu_block_sum(sum, shd);
		const float inv = (float)(1.0 / sum);
		for (int32_t i = threadIdx.x; i < lim; i += blockDim.x)
			row[i] *= inv;
	}
	__syncthreads();
	float *o = a.out + (size_t)r * qd + (size_t)j * G * hd;
	k_cu_attn_pv(P, cap, V, hd, G, lim, o);
	if (Obs::active) {
		struct k_cu_obs ob;
		ob.step = a.pos0 + r;
		ob.n = lim;
		ob.group = G;
		ob.probs = P;
		ob.ld = a.cap;
		ob.stats = a.stats + hi * cap * a.stat_bytes;
		ob.stat_bytes = a.stat_bytes;
		ob.k = K;
		ob.v = V;
		ob.pos = a.pos + hi * cap;
		ob.count = a.count + hi * cap;
		ob.hd = hd;
		ob.layer = a.layer;
		ob.n_layer = a.n_layer;
		ob.prompt_len = a.prompt_len;
		ob.ratio = a.ratio;
		ob.byte_ratio = a.byte_ratio;
		ob.P = a.P.v;
		for (int32_t i = threadIdx.x; i < lim; i += blockDim.x)
			Obs::entry(ob, i);
	}
	__syncthreads();
	if (Obs::need_out) {
		float *st = (float *)(void *)(a.state + hi * a.state_bytes);
		const int rows = G < 16 ? G : 16;
		for (int idx = threadIdx.x; idx < rows * hd; idx += blockDim.x)
			st[idx] = o[idx];
		__syncthreads();
	}
}

/* Observing policies: block j = KV head j, rows in order. */
template <class Obs>
__global__ void k_cu_attn_rows(struct k_cu_attn_args a)
{
	const int j = blockIdx.x;
	float *P = a.scratch + (size_t)j * a.G * a.cap;
	for (int r = 0; r < a.C; r++)
		k_cu_attn_row<Obs>(a, j, r, P);
}

/* No observer: block (j, r). */
template <class Obs>
__global__ void k_cu_attn_par(struct k_cu_attn_args a)
{
	const int j = blockIdx.x, r = blockIdx.y;
	float *P = a.scratch + ((size_t)j * a.C + r) * a.G * a.cap;
	k_cu_attn_row<Obs>(a, j, r, P);
}

/* Scratch floats either kernel needs for chunks of up to C rows. */
static inline size_t k_cu_attn_scratch_floats(int n_kv_head, int G, int32_t cap, int C, int observes)
{
	return (size_t)n_kv_head * (observes ? 1 : (size_t)C) * G * (size_t)cap;
}

/* Queue one layer on stream st. */
template <class Obs>
static inline cudaError_t k_cu_attn_launch(const struct k_cu_attn_args *a, cudaStream_t st)
{
	if (a->C <= 0)
		return cudaSuccess;
	if (Obs::active)
		k_cu_attn_rows<Obs><<<a->n_kv_head, K_CU_THREADS, 0, st>>>(*a);
	else
		k_cu_attn_par<Obs><<<dim3(a->n_kv_head, a->C), K_CU_THREADS, 0, st>>>(*a);
	return cudaGetLastError();
}

/* CPU reference of one (KV head j, row r): the same scores, softmax (double sum, inputs
 * clamped at -80 as rt_attn_softmax) and P·V on host arrays laid out as the device
 * store, and the observer run over the visible entries. P: [G × cap] host scratch. */
template <class Obs>
static inline void k_cu_attn_ref(const struct k_cu_attn_args &a, int j, int r, float *P)
{
	const int G = a.G, hd = a.hd;
	const size_t hi = (size_t)a.layer * a.n_kv_head + j, cap = (size_t)a.cap;
	const int32_t lim = a.nb[hi] + r + 1;
	const float *K = a.k + hi * cap * hd, *V = a.v + hi * cap * hd;
	const size_t qd = (size_t)a.n_kv_head * G * hd;
	const float *q = a.q + (size_t)r * qd + (size_t)j * G * hd;
	float *o = a.out + (size_t)r * qd + (size_t)j * G * hd;
	for (int g = 0; g < G; g++) {
		float *row = P + (size_t)g * cap;
		float mx = -INFINITY;
		for (int32_t i = 0; i < lim; i++) {
			float s = 0.0f;
			for (int d = 0; d < hd; d++)
				s += q[(size_t)g * hd + d] * K[(size_t)i * hd + d];
			row[i] = s * a.scale + a.log_count[hi * cap + i];
			mx = row[i] > mx ? row[i] : mx;
		}
		double sum = 0.0;
		for (int32_t i = 0; i < lim; i++) {
			float x = row[i] - mx;
			row[i] = expf(x < -80.0f ? -80.0f : x);
			sum += row[i];
		}
		const float inv = (float)(1.0 / sum);
		for (int32_t i = 0; i < lim; i++)
			row[i] *= inv;
		for (int d = 0; d < hd; d++) {
			float acc = 0.0f;
			for (int32_t i = 0; i < lim; i++)
				acc += row[i] * V[(size_t)i * hd + d];
			o[(size_t)g * hd + d] = acc;
		}
	}
	if (Obs::active) {
		struct k_cu_obs ob;
		ob.step = a.pos0 + r;
		ob.n = lim;
		ob.group = G;
		ob.probs = P;
		ob.ld = a.cap;
		ob.stats = a.stats + hi * cap * a.stat_bytes;
		ob.stat_bytes = a.stat_bytes;
		ob.k = K;
		ob.v = V;
		ob.pos = a.pos + hi * cap;
		ob.count = a.count + hi * cap;
		ob.hd = hd;
		ob.layer = a.layer;
		ob.n_layer = a.n_layer;
		ob.prompt_len = a.prompt_len;
		ob.ratio = a.ratio;
		ob.byte_ratio = a.byte_ratio;
		ob.P = a.P.v;
		for (int32_t i = 0; i < lim; i++)
			Obs::entry(ob, i);
	}
	if (Obs::need_out) {
		const int rows = G < 16 ? G : 16;
		memcpy(a.state + hi * a.state_bytes, o, (size_t)rows * hd * sizeof(float));
	}
}

#endif
