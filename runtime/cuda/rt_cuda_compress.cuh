/*
 * rt_cuda_compress: the host side of the device compress pipeline, instantiated by each
 * generated policy_NAME.cu with its score functor (kernels/k_compact.cuh documents the
 * kernels). rt_cuda_compress_run<Score> takes the configuration the C compress would
 * hand k_compress_run (struct k_compress_cfg of kernels/k_compress.h) and:
 *
 *   1. refuses a ratio override whose budget is below the guards (the C message);
 *   2. computes the per-layer budgets on the host with k_layer_budgets (the C code) from
 *      the shadow's entry counts, and the protected-span table from the request's span
 *      names (k_span_protected);
 *   3. queues k_cu_compress_select<Score> (one block per head) and the gathers of every
 *      per-entry array through the new-index map, then the new entry counts.
 *
 * n_params: the policy's parameter count (kvp_ctx.params holds that many).
 * Everything is queued on in->stream; the caller synchronises. CUDA/C++ only.
 * Versions: 1. Build line: compiled inside each policy unit (see the Makefile).
 */
#ifndef RT_CUDA_COMPRESS_CUH
#define RT_CUDA_COMPRESS_CUH

#include <cuda_runtime.h>

#include <string.h>

#include "cuda/rt_cuda_check.h"
#include "cuda/rt_cuda_policy.h"
#include "k_compact.cuh"

extern "C" {
#include "k_compress.h"
}

/* Gather one per-entry array of W words through the map (into tmp, then back). */
static inline int rt_cuda_compact_array(void *arr, int W, void *tmp, const struct k_cu_compress_args &a,
                                        size_t H, cudaStream_t st, rt_err *err)
{
	const dim3 grid((unsigned)H, (unsigned)((a.cap + 255) / 256));
	k_cu_compact_words<<<grid, 256, 0, st>>>((const uint32_t *)arr, (uint32_t *)tmp, a.dst, a.n, a.cap, W);
	RT_CU_TRY(err, cudaGetLastError());
	RT_CU_TRY(err, cudaMemcpyAsync(arr, tmp, H * (size_t)a.cap * W * 4, cudaMemcpyDeviceToDevice, st));
	return 0;
}

/* Fill a's configuration fields from cfg, the context and kv (the shadow of the device
 * store: its entry bytes), everything but the store and scratch pointers. */
static inline void rt_cuda_compress_conf(struct k_cu_compress_args *a, const struct kvp_ctx *ctx,
                                         const struct k_compress_cfg *cfg, const rt_kv *kv, int n_params)
{
	double cost[K_TIER_MAX];
	k_tier_costs(kv, cost);
	a->bytes = k_bytes_mode(ctx, cfg);
	a->e16 = (double)rt_kv_f16_entry_bytes(kv);
	a->entry_cost = cost[0];
	a->has_score = cfg->has_score;
	a->reduce = cfg->reduce;
	a->pool = cfg->pool;
	a->kernel = cfg->kernel;
	a->pool_before_reduce = cfg->pool_before_reduce;
	a->sinks = cfg->sinks;
	a->recent = cfg->recent;
	a->seen = (double)ctx->seen;
	a->budget = cfg->budget;
	a->ratio = ctx->ratio;
	a->byte_ratio = ctx->byte_ratio;
	a->prompt_len = ctx->prompt_len;
	for (int i = 0; i < n_params && i < K_CU_MAX_PARAMS; i++)
		a->P.v[i] = ctx->params[i];
}

/* The configuration and per-layer budgets compress applies to kv: k_budget_force
 * (kernels/k_compress.h), the call the C compress makes (k_budget_check), so the budget
 * check, a graceful budget's floor, the layer budgets lb[kv->n_layer] from the target, the
 * windows' keep and the early clamp are the C code's; cfg takes the budget and target in
 * force. Host code; the device pipeline and its CPU reference in
 * tests/cuda/test_cuda_host.cu both call it. Returns 0, or -1 with err set (the budget
 * check's errors, the C compress's messages). */
static inline int rt_cuda_compress_plan(const struct kvp_ctx *ctx, const rt_kv *kv,
                                        struct k_compress_cfg *cfg, double *lb, rt_err *err)
{
	double in_force[2] = { cfg->budget, cfg->target };
	const double per_head = (double)rt_kv_entries(kv) / ((double)kv->n_layer * kv->n_kv_head);
	if (k_budget_force(ctx, kv, cfg, (double)ctx->seen, per_head, lb, in_force, err) < 0)
		return -1;
	cfg->budget = in_force[0];
	cfg->target = in_force[1];
	return 0;
}

template <class Score>
static inline int rt_cuda_compress_run(const struct kvp_cuda_compress_in *in,
                                       const struct k_compress_cfg *cfg, int n_params, rt_err *err)
{
	const struct kvp_ctx *ctx = in->ctx;
	const rt_kv *kv = in->shadow;
	const rt_cuda_kv *d = in->dkv;
	cudaStream_t st = (cudaStream_t)in->stream;
	const size_t L = (size_t)kv->n_layer;
	if (L > 1024)
		return rt_err_setc(err, RT_ERR_INPUT, "policy %s: more than 1024 layers",
		                   cfg->name ? cfg->name : "?");
	struct k_compress_cfg fc = *cfg;
	double lb[1024];
	if (rt_cuda_compress_plan(ctx, kv, &fc, lb, err) < 0)
		return -1;
	cfg = &fc;
	if (ctx->ratio > 0) {
		double sk = cfg->sinks > 0 ? cfg->sinks : 0, rc = cfg->recent > 0 ? cfg->recent : 0;
		if (sk + rc > cfg->target)
			return rt_err_setc(err, RT_ERR_INPUT,
			                   "policy %s: at ratio %g the budget (%.0f entries) is below the guards (sinks %g + recent %g)",
			                   cfg->name ? cfg->name : "?", ctx->ratio, floor(cfg->budget), sk, rc);
	}
	const size_t H = (size_t)kv->n_layer * kv->n_kv_head, cap = (size_t)kv->cap, R = (size_t)kv->group;
	const size_t W = (size_t)kv->head_dim > kv->stat_bytes / 4 ? (size_t)kv->head_dim : kv->stat_bytes / 4;
	if (in->scratch_len < k_cu_compress_scratch_bytes(H, cap, R, W, L))
		return rt_err_set(err, "policy %s: device compress scratch of %zu bytes is too small",
		                  cfg->name ? cfg->name : "?", in->scratch_len);
	uint8_t keep[65536];
	const int n_ids = ctx->n_spans < 65535 ? ctx->n_spans : 65535;
	for (int s = 0; s <= n_ids; s++)
		keep[s] = (uint8_t)k_span_protected(ctx, cfg, (uint16_t)s);
	uint8_t *p = (uint8_t *)in->scratch;
	struct k_cu_compress_args a;
	memset(&a, 0, sizeof a);
	a.score = (float *)(void *)p; p += k_cu_align(H * cap * 4);
	a.pooled = (float *)(void *)p; p += k_cu_align(H * cap * 4);
	a.qs = (float *)(void *)p; p += k_cu_align(H * R * cap * 4);
	a.flags = p; p += k_cu_align(H * cap);
	a.dst = (int32_t *)(void *)p; p += k_cu_align(H * cap * 4);
	a.n_new = (int32_t *)(void *)p; p += k_cu_align(H * 4);
	double *dlb = (double *)(void *)p; p += k_cu_align(L * 8);
	uint8_t *dkeep = p; p += k_cu_align(65536);
	void *tmp = p;
	RT_CU_TRY(err, cudaMemcpyAsync(dlb, lb, L * 8, cudaMemcpyHostToDevice, st));
	RT_CU_TRY(err, cudaMemcpyAsync(dkeep, keep, (size_t)n_ids + 1, cudaMemcpyHostToDevice, st));
	a.k = d->k;
	a.v = d->v;
	a.pos = d->pos;
	a.count = d->count;
	a.span = d->span;
	a.stats = d->stats;
	a.n = d->n;
	a.stat_bytes = d->stat_bytes;
	a.cap = d->cap;
	a.hd = d->head_dim;
	a.n_kv_head = d->n_kv_head;
	a.n_layer = d->n_layer;
	a.group = d->group;
	a.lb = dlb;
	a.span_keep = dkeep;
	a.n_span_ids = n_ids;
	rt_cuda_compress_conf(&a, ctx, cfg, kv, n_params);
	k_cu_compress_select<Score><<<(unsigned)H, K_CU_THREADS, 0, st>>>(a);
	RT_CU_TRY(err, cudaGetLastError());
	const int hd = d->head_dim;
	if (rt_cuda_compact_array(d->k, hd, tmp, a, H, st, err) || rt_cuda_compact_array(d->v, hd, tmp, a, H, st, err) ||
	    rt_cuda_compact_array(d->pos, 1, tmp, a, H, st, err) ||
	    rt_cuda_compact_array(d->count, 1, tmp, a, H, st, err) ||
	    rt_cuda_compact_array(d->log_count, 1, tmp, a, H, st, err))
		return -1;
	if (d->stat_bytes >= 4 &&
	    rt_cuda_compact_array(d->stats, (int)(d->stat_bytes / 4), tmp, a, H, st, err))
		return -1;
	const dim3 grid((unsigned)H, (unsigned)((cap + 255) / 256));
	k_cu_compact_u16<<<grid, 256, 0, st>>>(d->span, (uint16_t *)tmp, a.dst, a.n, a.cap);
	RT_CU_TRY(err, cudaGetLastError());
	RT_CU_TRY(err, cudaMemcpyAsync(d->span, tmp, H * cap * 2, cudaMemcpyDeviceToDevice, st));
	RT_CU_TRY(err, cudaMemcpyAsync(d->n, a.n_new, H * 4, cudaMemcpyDeviceToDevice, st));
	return 0;
}

#endif
