/*
 * k_compact: the compress pipeline of kernels/k_compress.h on the device, for the
 * policies whose pipeline it covers: action evict, one budget per head (`allocate` per
 * head; any per-layer schedule, computed on the host), no layer-wide reduction and a
 * score made of per-entry terms (statistics, position, age, count, norms; no caote(),
 * normalize() or key_cos_mean, which read the whole head). Per (layer, KV head), one
 * block:
 *
 *   guards     sinks (pos < sinks), recent (pos >= seen - recent), protected spans
 *   score      Score::at(sc, i, r) per entry and query head (the policy's expression)
 *   pool       1-D max/avg pooling over the entries before the recent window (k_pool),
 *              before or after the group reduction as the policy says
 *   reduce     mean / max / sum / l2 over the group (k_reduce)
 *   select     keep the k = floor(budget_l) - guarded best candidates (rank counting with
 *              kernels/k_select.cuh's order: higher score, then LOWER POSITION, NaN last)
 *   map        dst[i] = new index of kept entry i (prefix count), -1 for evicted ones
 *
 * then k_cu_compact_words gathers every per-entry array through dst into scratch and the
 * caller copies it back (the device form of rt_kv_head_keep). Float arithmetic follows
 * k_score.h (doubles where it uses doubles), so the same scores select the same entries.
 *
 * Versions: 1 (one block per head; selection O(n^2 / threads); serial prefix count).
 * Build line: included by the generated policy_NAME.cu (nvcc -std=c++17 --fmad=false).
 * CPU reference: k_cu_compress_ref below (host loops over the same Score functor), which
 * tests/cuda/test_cuda_host.cu checks against the C policy's compress (equal kept sets).
 *
 * A score is a type with
 *   enum { per_q = 0|1 };      per_q: depends on the query head (then reduced)
 *   K_HD static float at(const struct k_cu_sc &sc, int32_t i, int r);
 */
#ifndef K_COMPACT_CUH
#define K_COMPACT_CUH

#include <math.h>
#include <stdint.h>

#include "k_alloc.h"
#include "k_cu.cuh"
#include "k_select.cuh"

enum { K_CU_POOL_NONE = 0, K_CU_POOL_MAX, K_CU_POOL_AVG };
enum { K_CU_RED_MEAN = 0, K_CU_RED_MAX, K_CU_RED_SUM, K_CU_RED_L2 };

/* What a score sees of one head at compress time. */
struct k_cu_sc {
	const uint8_t *stats;
	size_t stat_bytes;
	const float *k, *v;
	const int32_t *pos;
	const float *count;
	int32_t n;
	int hd, layer, n_layer, group;
	double seen;
	int64_t prompt_len;
	double ratio, byte_ratio, budget;
	const double *P;
};

struct k_cu_compress_args {
	/* the store (struct rt_cuda_kv's arrays) */
	const float *k, *v;
	const int32_t *pos;
	const float *count;
	const uint16_t *span;
	const uint8_t *stats;
	const int32_t *n;        /* [H] entries before */
	size_t stat_bytes;
	int32_t cap;
	int hd, n_kv_head, n_layer, group;
	/* configuration */
	const double *lb;        /* [n_layer] budget per head of each layer (device) */
	const uint8_t *span_keep; /* [n_span_ids + 1]: 1 = a protected span id (device), or NULL */
	int n_span_ids;
	int has_score, reduce, pool, kernel, pool_before_reduce;
	double sinks, recent, seen, budget, ratio, byte_ratio;
	int64_t prompt_len;
	struct k_cu_params P;
	int bytes;               /* lb counts f16 entries' bytes (k_bytes_mode, kernels/k_compress.h) */
	double e16, entry_cost;  /* bytes of one f16 entry; of one stored entry (keys + values) */
	/* scratch (device) */
	float *score;            /* [H × cap] */
	float *qs;               /* [H × group × cap] */
	float *pooled;           /* [H × cap] */
	uint8_t *flags;          /* [H × cap] bit 1 guard, bit 2 keep */
	int32_t *dst;            /* [H × cap] new index or -1 */
	int32_t *n_new;          /* [H] */
};

/* The entries a head keeps besides its n_guard guards under layer budget lb: in entries,
 * lb less the guards; in bytes (a.bytes), lb f16 entries' bytes less the guards' rows, over
 * one stored entry's bytes (k_head_bytes of kernels/k_compress.h on an untiered store: an
 * f32 store under a byte ratio keeps half the entries an f16 one would). Never negative. */
K_HD int32_t k_cu_head_budget(const struct k_cu_compress_args &a, double lb, int32_t n_guard)
{
	if (!a.bytes) {
		const int32_t kb = k_floor_entries(lb) - n_guard;
		return kb > 0 ? kb : 0;
	}
	return k_bytes_entries(lb * a.e16 - (double)n_guard * a.entry_cost, a.entry_cost);
}

/* 1 when the entry at position pos (tokens) with span id span is guarded: a sink
 * (pos < a.sinks), in the recent window (pos >= a.seen - a.recent) or in a protected span
 * (a.span_keep[span], ids 1..a.n_span_ids); the C compress's guards (kernels/k_compress.h,
 * struct k_compress_cfg). */
K_HD int k_cu_guarded(const struct k_cu_compress_args &a, int32_t pos, uint16_t span)
{
	return (a.sinks > 0 && pos < a.sinks) || (a.recent > 0 && pos >= a.seen - a.recent) ||
	       (span != 0 && a.span_keep && span <= a.n_span_ids && a.span_keep[span]);
}

/* k_pool of k_score.h for entry i of in[0..n). */
K_HD float k_cu_pool_at(const float *in, int32_t n, int32_t k, int is_max, int32_t i)
{
	int32_t h = k / 2;
	int32_t lo = i - h < 0 ? 0 : i - h, hi = i + h >= n ? n - 1 : i + h;
	if (is_max) {
		float m = in[lo];
		for (int32_t j = lo + 1; j <= hi; j++)
			if (in[j] > m)
				m = in[j];
		return m;
	}
	double s = 0;
	for (int32_t j = lo; j <= hi; j++)
		s += in[j];
	return (float)(s / k);
}

/* k_reduce of k_score.h for entry i. */
K_HD float k_cu_reduce_at(const float *src, int group, size_t stride, int32_t i, int kind)
{
	double acc = kind == K_CU_RED_L2 ? (double)src[i] * src[i] : src[i];
	for (int r = 1; r < group; r++) {
		double x = src[(size_t)r * stride + i];
		if (kind == K_CU_RED_MAX)
			acc = x > acc ? x : acc;
		else if (kind == K_CU_RED_L2)
			acc += x * x;
		else
			acc += x;
	}
	return (float)(kind == K_CU_RED_MEAN ? acc / group : kind == K_CU_RED_L2 ? sqrt(acc) : acc);
}

/* The view a score gets of head hi (layer hi / n_kv_head, KV head hi % n_kv_head) of the
 * device store a: its rows [cap × hd], positions, counts and statistics [cap ×
 * stat_bytes], borrowed from a, with the policy's scalars. */
K_HD struct k_cu_sc k_cu_sc_of(const struct k_cu_compress_args &a, size_t hi)
{
	struct k_cu_sc sc;
	const size_t cap = (size_t)a.cap;
	sc.stats = a.stats + hi * cap * a.stat_bytes;
	sc.stat_bytes = a.stat_bytes;
	sc.k = a.k + hi * cap * a.hd;
	sc.v = a.v + hi * cap * a.hd;
	sc.pos = a.pos + hi * cap;
	sc.count = a.count + hi * cap;
	sc.n = a.n[hi];
	sc.hd = a.hd;
	sc.layer = (int)(hi / (size_t)a.n_kv_head);
	sc.n_layer = a.n_layer;
	sc.group = a.group;
	sc.seen = a.seen;
	sc.prompt_len = a.prompt_len;
	sc.ratio = a.ratio;
	sc.byte_ratio = a.byte_ratio;
	sc.budget = a.budget;
	sc.P = a.P.v;
	return sc;
}

/* Scores, guards and selection of head blockIdx.x; writes flags, dst and n_new. */
template <class Score>
static __global__ void k_cu_compress_select(struct k_cu_compress_args a)
{
	__shared__ int32_t shi[33];
	const size_t hi = blockIdx.x, cap = (size_t)a.cap;
	const struct k_cu_sc sc = k_cu_sc_of(a, hi);
	const int32_t n = sc.n;
	const int R = a.group;
	float *s = a.score + hi * cap, *qs = a.qs + hi * R * cap, *pl = a.pooled + hi * cap;
	uint8_t *f = a.flags + hi * cap;
	int32_t *dst = a.dst + hi * cap;
	int32_t n_dom = 0, n_guard = 0;
	for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
		const int32_t p = sc.pos[i];
		const int g = k_cu_guarded(a, p, a.span[hi * cap + i]);
		f[i] = g ? 1 : 0;
		n_guard += g;
		if (!(a.recent > 0 && p >= a.seen - a.recent))
			n_dom = i + 1 > n_dom ? i + 1 : n_dom;
	}
	n_dom = k_cu_block_max_i(n_dom, shi);
	n_guard = k_cu_block_sum_i(n_guard, shi);
	const int pool_q = a.has_score && a.pool != K_CU_POOL_NONE && a.pool_before_reduce && a.reduce >= 0;
	const int pool_s = a.has_score && a.pool != K_CU_POOL_NONE && (!a.pool_before_reduce || a.reduce < 0);
	if (!a.has_score) {
		for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
			s[i] = 0.0f;
	} else if (a.reduce < 0) {
		for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
			s[i] = Score::at(sc, i, 0);
	} else {
		for (int r = 0; r < R; r++)
			for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
				qs[(size_t)r * cap + i] = Score::at(sc, i, r);
		__syncthreads();
		for (int r = 0; pool_q && r < R; r++) {
			float *q = qs + (size_t)r * cap;
			for (int32_t i = threadIdx.x; i < n_dom; i += blockDim.x)
				pl[i] = k_cu_pool_at(q, n_dom, a.kernel, a.pool == K_CU_POOL_MAX, i);
			__syncthreads();
			for (int32_t i = threadIdx.x; i < n_dom; i += blockDim.x)
				q[i] = pl[i];
			__syncthreads();
		}
		for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
			s[i] = k_cu_reduce_at(qs, R, cap, i, a.reduce);
	}
	__syncthreads();
	if (pool_s) {
		for (int32_t i = threadIdx.x; i < n_dom; i += blockDim.x)
			pl[i] = k_cu_pool_at(s, n_dom, a.kernel, a.pool == K_CU_POOL_MAX, i);
		__syncthreads();
		for (int32_t i = threadIdx.x; i < n_dom; i += blockDim.x)
			s[i] = pl[i];
		__syncthreads();
	}
	const int32_t k = k_cu_head_budget(a, a.lb[sc.layer], n_guard);
	for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
		if (f[i] & 1) {
			f[i] |= 2;
			continue;
		}
		int32_t rank = 0;
		for (int32_t j = 0; j < n && rank < k; j++)
			if (j != i && !(f[j] & 1) && k_cu_before(s[j], sc.pos[j], j, s[i], sc.pos[i], i))
				rank++;
		if (rank < k)
			f[i] |= 2;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		int32_t m = 0;
		for (int32_t i = 0; i < n; i++)
			dst[i] = (f[i] & 2) ? m++ : -1;
		a.n_new[hi] = m;
	}
}

/* out[dst[e] words] = in[e words] for every entry e < n[h] of every head, W 4-byte words
 * per entry; grid (H, ceil(cap / blockDim)). */
static __global__ void k_cu_compact_words(const uint32_t *in, uint32_t *out, const int32_t *dst,
                                   const int32_t *n, int32_t cap, int W)
{
	const size_t h = blockIdx.x;
	const int32_t e = (int32_t)(blockIdx.y * blockDim.x + threadIdx.x);
	if (e >= n[h])
		return;
	const int32_t d = dst[h * (size_t)cap + e];
	if (d < 0)
		return;
	const uint32_t *src = in + (h * (size_t)cap + e) * W;
	uint32_t *to = out + (h * (size_t)cap + d) * W;
	for (int w = 0; w < W; w++)
		to[w] = src[w];
}

/* The same for 2-byte words (span ids). */
static __global__ void k_cu_compact_u16(const uint16_t *in, uint16_t *out, const int32_t *dst,
                                 const int32_t *n, int32_t cap)
{
	const size_t h = blockIdx.x;
	const int32_t e = (int32_t)(blockIdx.y * blockDim.x + threadIdx.x);
	if (e >= n[h])
		return;
	const int32_t d = dst[h * (size_t)cap + e];
	if (d >= 0)
		out[h * (size_t)cap + d] = in[h * (size_t)cap + e];
}

/* CPU reference of k_cu_compress_select for head hi on host arrays (tmp: [R × cap + cap]
 * floats of scratch besides a's own). */
template <class Score>
static inline void k_cu_compress_ref(const struct k_cu_compress_args &a, size_t hi)
{
	const size_t cap = (size_t)a.cap;
	const struct k_cu_sc sc = k_cu_sc_of(a, hi);
	const int32_t n = sc.n;
	const int R = a.group;
	float *s = a.score + hi * cap, *qs = a.qs + hi * R * cap, *pl = a.pooled + hi * cap;
	uint8_t *f = a.flags + hi * cap;
	int32_t n_dom = 0, n_guard = 0;
	for (int32_t i = 0; i < n; i++) {
		const int g = k_cu_guarded(a, sc.pos[i], a.span[hi * cap + i]);
		f[i] = g ? 1 : 0;
		n_guard += g;
		if (!(a.recent > 0 && sc.pos[i] >= a.seen - a.recent))
			n_dom = i + 1;
	}
	const int pool_q = a.has_score && a.pool != K_CU_POOL_NONE && a.pool_before_reduce && a.reduce >= 0;
	const int pool_s = a.has_score && a.pool != K_CU_POOL_NONE && (!a.pool_before_reduce || a.reduce < 0);
	for (int32_t i = 0; i < n; i++)
		s[i] = 0.0f;
	if (a.has_score && a.reduce < 0) {
		for (int32_t i = 0; i < n; i++)
			s[i] = Score::at(sc, i, 0);
	} else if (a.has_score) {
		for (int r = 0; r < R; r++) {
			float *q = qs + (size_t)r * cap;
			for (int32_t i = 0; i < n; i++)
				q[i] = Score::at(sc, i, r);
			if (pool_q) {
				for (int32_t i = 0; i < n_dom; i++)
					pl[i] = k_cu_pool_at(q, n_dom, a.kernel, a.pool == K_CU_POOL_MAX, i);
				for (int32_t i = 0; i < n_dom; i++)
					q[i] = pl[i];
			}
		}
		for (int32_t i = 0; i < n; i++)
			s[i] = k_cu_reduce_at(qs, R, cap, i, a.reduce);
	}
	if (pool_s) {
		for (int32_t i = 0; i < n_dom; i++)
			pl[i] = k_cu_pool_at(s, n_dom, a.kernel, a.pool == K_CU_POOL_MAX, i);
		for (int32_t i = 0; i < n_dom; i++)
			s[i] = pl[i];
	}
	const int32_t k = k_cu_head_budget(a, a.lb[sc.layer], n_guard);
	int32_t m = 0;
	for (int32_t i = 0; i < n; i++) {
		if (!(f[i] & 1)) {
			int32_t rank = 0;
			for (int32_t j = 0; j < n && rank < k; j++)
				if (j != i && !(f[j] & 1) && k_cu_before(s[j], sc.pos[j], j, s[i], sc.pos[i], i))
					rank++;
			if (rank < k)
				f[i] |= 2;
		} else {
			f[i] |= 2;
		}
		a.dst[hi * cap + i] = (f[i] & 2) ? m++ : -1;
	}
	a.n_new[hi] = m;
}

/* Device scratch of the pipeline for H heads of cap entries, a group of R query heads,
 * per-entry arrays of at most W words, L layers: score, qs, pooled, flags, dst, n_new,
 * lb, span_keep (65536 ids), the gather buffer. */
static inline size_t k_cu_align(size_t n)
{
	return (n + 255) & ~(size_t)255;
}

static inline size_t k_cu_compress_scratch_bytes(size_t H, size_t cap, size_t R, size_t W, size_t L)
{
	return 2 * k_cu_align(H * cap * 4) + k_cu_align(H * R * cap * 4) + k_cu_align(H * cap) +
	       k_cu_align(H * cap * 4) + k_cu_align(H * 4) + k_cu_align(L * 8) + k_cu_align(65536) +
	       k_cu_align(H * cap * W * 4) + 256;
}

#endif
