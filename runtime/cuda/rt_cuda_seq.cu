/*
 * rt_cuda_seq: the device half of a sequence (rt_cuda.h): the device KV store, the chunked
 * forward (cuBLAS GEMMs + runtime/cuda/rt_cuda_kernels.cuh + the policy's fused attention
 * of kernels/k_attn.cuh) and the compress, behind rt_seq's device interface (rt_seq_dev in
 * runtime/policy/rt_seq.h). The policy loop is rt_seq's own: the C policy's host hooks
 * decide chunk sizes and when to compress (on the host view of the store, whose entry
 * counts follow the device); the CUDA policy's compress runs on the device, or the C
 * compress runs on a downloaded copy of the store that is uploaded again.
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/rt_cuda.h"
#include "cuda/rt_cuda_check.h"
#include "cuda/rt_cuda_internal.h"
#include "cuda/rt_cuda_kernels.cuh"
#include "k_attn.cuh"
#include "k_compact.cuh"

extern "C" {
#include "policy/rt_seq.h"
}

struct rt_cuda_seq {
	rt_seq *h;               /* the sequence whose forward this is (rt_seq_attach): its run
	                          * state, the host view (shadow) of the store, the counters */
	rt_seq *own;             /* rt_cuda_seq_init's own sequence (= h), else NULL */
	const rt_model *m;
	const rt_cuda_model *dm;
	const struct kvp_cuda_policy *cp; /* NULL: the full cache */
	const struct kvp_policy *p;
	rt_cuda_kv d;            /* the device store */
	int max_chunk;
	int32_t cap;
	cudaStream_t st;
	cublasHandle_t cb;
	/* device scratch (one allocation) */
	float *x, *xn, *q, *k, *v, *att, *gate, *up, *cs, *attn, *logits;
	__half *xh;
	int32_t *tok;
	void *cmp;               /* device compress scratch */
	size_t cmp_len;
	void *dmem;
	/* pinned host buffers */
	float *h_logits;         /* [max_chunk × n_vocab] */
	int32_t *h_tok, *h_n;    /* [max_chunk], [H] */
};

/* Y[C × out] = X[C × in] · W[out × in]^T (+ beta · Y), W in the model's wtype. */
static int gemm(rt_cuda_seq *s, float *Y, const float *X, const void *W, int C, int out, int in,
                float beta, rt_err *err)
{
	const float one = 1.0f;
	if (s->dm->wt == RT_CUDA_W_F16) {
		const size_t n = (size_t)C * in;
		rt_cu_to_half<<<rt_cu_blocks(n, 256), 256, 0, s->st>>>(s->xh, X, n);
		RT_CU_TRY(err, cudaGetLastError());
		RT_CUBLAS_TRY(err, cublasGemmEx(s->cb, CUBLAS_OP_T, CUBLAS_OP_N, out, C, in, &one, W,
		                                CUDA_R_16F, in, s->xh, CUDA_R_16F, in, &beta, Y,
		                                CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
		return 0;
	}
	RT_CUBLAS_TRY(err, cublasGemmEx(s->cb, CUBLAS_OP_T, CUBLAS_OP_N, out, C, in, &one, W, CUDA_R_32F,
	                                in, X, CUDA_R_32F, in, &beta, Y, CUDA_R_32F, out,
	                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	return 0;
}

/* The device store's arrays inside one allocation. */
static int kv_alloc(rt_cuda_kv *d, const rt_kv *h, rt_err *err)
{
	memset(d, 0, sizeof *d);
	d->n_layer = h->n_layer;
	d->n_kv_head = h->n_kv_head;
	d->group = h->group;
	d->head_dim = h->head_dim;
	d->cap = h->cap;
	d->stat_bytes = h->stat_bytes;
	d->state_bytes = h->state_bytes;
	const size_t H = (size_t)h->n_layer * h->n_kv_head, c = (size_t)h->cap, hd = (size_t)h->head_dim;
	const size_t sizes[10] = { H * c * hd * 4, H * c * hd * 4, H * c * 4, H * c * 4, H * c * 4,
		                   H * c * 2, H * c * h->stat_bytes, H * h->state_bytes, H * 4, 0 };
	size_t off[10], total = 0;
	for (int i = 0; i < 9; i++) {
		off[i] = total;
		total += (sizes[i] + 255) & ~(size_t)255;
	}
	RT_CU_TRY(err, cudaMalloc(&d->mem, total));
	RT_CU_TRY(err, cudaMemset(d->mem, 0, total));
	uint8_t *b = (uint8_t *)d->mem;
	d->k = (float *)(void *)(b + off[0]);
	d->v = (float *)(void *)(b + off[1]);
	d->pos = (int32_t *)(void *)(b + off[2]);
	d->count = (float *)(void *)(b + off[3]);
	d->log_count = (float *)(void *)(b + off[4]);
	d->span = (uint16_t *)(void *)(b + off[5]);
	d->stats = b + off[6];
	d->state = b + off[7];
	d->n = (int32_t *)(void *)(b + off[8]);
	d->mem_bytes = total;
	return 0;
}

/* Copy every head between the host shadow and the device (to_dev: upload). Per head,
 * only the n entries in use travel. */
static int kv_sync(rt_cuda_seq *s, int to_dev, rt_err *err)
{
	rt_kv *h = &s->h->kv;
	rt_cuda_kv *d = &s->d;
	const int H = h->n_layer * h->n_kv_head;
	const size_t c = (size_t)h->cap, hd = (size_t)h->head_dim;
	const cudaMemcpyKind kind = to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
	if (!to_dev) {
		RT_CU_TRY(err, cudaMemcpyAsync(s->h_n, d->n, (size_t)H * 4, cudaMemcpyDeviceToHost, s->st));
		RT_CU_TRY(err, cudaStreamSynchronize(s->st));
		for (int i = 0; i < H; i++)
			h->heads[i].n = s->h_n[i];
	}
	for (int i = 0; i < H; i++) {
		rt_kv_head *e = &h->heads[i];
		const size_t n = (size_t)e->n, o = (size_t)i * c;
		struct { void *hp; void *dp; size_t bytes; } a[8] = {
			{ e->k, d->k + o * hd, n * hd * 4 }, { e->v, d->v + o * hd, n * hd * 4 },
			{ e->pos, d->pos + o, n * 4 }, { e->count, d->count + o, n * 4 },
			{ e->log_count, d->log_count + o, n * 4 }, { e->span, d->span + o, n * 2 },
			{ e->stats, d->stats + o * h->stat_bytes, n * h->stat_bytes },
			{ e->state, d->state + (size_t)i * h->state_bytes, h->state_bytes },
		};
		for (int j = 0; j < 8; j++) {
			if (!a[j].bytes)
				continue;
			if (to_dev)
				RT_CU_TRY(err, cudaMemcpyAsync(a[j].dp, a[j].hp, a[j].bytes, kind, s->st));
			else
				RT_CU_TRY(err, cudaMemcpyAsync(a[j].hp, a[j].dp, a[j].bytes, kind, s->st));
		}
	}
	if (to_dev) {
		for (int i = 0; i < H; i++)
			s->h_n[i] = h->heads[i].n;
		RT_CU_TRY(err, cudaMemcpyAsync(d->n, s->h_n, (size_t)H * 4, cudaMemcpyHostToDevice, s->st));
	}
	RT_CU_TRY(err, cudaStreamSynchronize(s->st));
	return 0;
}

/* The device half of a sequence (rt_seq_dev.free): everything but the rt_seq. */
static void dev_free(void *state)
{
	rt_cuda_seq *s = (rt_cuda_seq *)state;
	cudaFree(s->d.mem);
	cudaFree(s->dmem);
	cudaFree(s->cmp);
	cudaFreeHost(s->h_logits);
	cudaFreeHost(s->h_tok);
	cudaFreeHost(s->h_n);
	if (s->cb)
		cublasDestroy(s->cb);
	if (s->st)
		cudaStreamDestroy(s->st);
	free(s);
}

extern "C" void rt_cuda_seq_free(rt_cuda_seq *s)
{
	if (!s)
		return;
	rt_seq *h = s->own;
	rt_seq_free(h); /* frees s too (dev_free) */
	free(h);
}

unsigned rt_cuda_refuses(const struct kvp_policy *p, const char **why)
{
	static const char *const reason[] = {
		"precision tiers (per-entry 8/4/2-bit KV rows) are stored on the CPU only",
		"`positions compacted` (re-rotation of kept keys) runs on the CPU only",
		"the prompt trace (GraceKV's segmentation) is recorded on the CPU only",
		"the query statistics of Expected Attention are gathered on the CPU only",
		"more parameters than the CUDA kernels take (32)",
	};
	const int hit[5] = { (p->needs & KVP_NEED_TIERS) != 0, p->positions == KVP_POS_COMPACTED,
		             (p->needs & KVP_NEED_TRACE) != 0, (p->needs & KVP_NEED_QUERY) != 0,
		             p->n_params > K_CU_MAX_PARAMS };
	unsigned no = hit[0] ? RT_CUDA_NO_STORE : 0;
	for (int i = 1; i < 5; i++)
		no |= hit[i] ? RT_CUDA_NO_DRIVER : 0;
	if (why) {
		*why = NULL;
		for (int i = 4; i >= 0; i--)
			*why = hit[i] ? reason[i] : *why;
	}
	return no;
}

static int scratch_alloc(rt_cuda_seq *s, rt_err *err)
{
	const rt_model_hparams *hp = &s->m->hp;
	const size_t C = (size_t)s->max_chunk, E = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
	const size_t qd = (size_t)hp->n_head * hp->head_dim, kd = (size_t)hp->n_head_kv * hp->head_dim;
	/* sized for the row-parallel kernel (C rows per KV head), which policies without
	 * statistics use as well; the observing kernel needs one row's worth */
	const size_t att = k_cu_attn_scratch_floats(hp->n_head_kv, hp->group, s->cap, (int)C, 0);
	const size_t big = F > (size_t)hp->n_vocab ? F : (size_t)hp->n_vocab;
	const size_t fl[11] = { C * E, C * E, C * qd, C * kd, C * kd, C * qd, C * F, C * F,
		                C * (size_t)hp->n_rot, att, C * (size_t)hp->n_vocab };
	size_t total = 0, off[13];
	for (int i = 0; i < 11; i++) {
		off[i] = total;
		total += (fl[i] * 4 + 255) & ~(size_t)255;
	}
	off[11] = total;
	total += (C * big * 2 + 255) & ~(size_t)255; /* f16 copy of a GEMM input */
	off[12] = total;
	total += (C * 4 + 255) & ~(size_t)255;
	RT_CU_TRY(err, cudaMalloc(&s->dmem, total));
	uint8_t *b = (uint8_t *)s->dmem;
	float **slots[11] = { &s->x, &s->xn, &s->q, &s->k, &s->v, &s->att, &s->gate, &s->up, &s->cs,
		              &s->attn, &s->logits };
	for (int i = 0; i < 11; i++)
		*slots[i] = (float *)(void *)(b + off[i]);
	s->xh = (__half *)(void *)(b + off[11]);
	s->tok = (int32_t *)(void *)(b + off[12]);
	const size_t H = (size_t)hp->n_layer * hp->n_head_kv;
	RT_CU_TRY(err, cudaMallocHost((void **)&s->h_logits, C * hp->n_vocab * 4));
	RT_CU_TRY(err, cudaMallocHost((void **)&s->h_tok, C * 4));
	RT_CU_TRY(err, cudaMallocHost((void **)&s->h_n, H * 4));
	if (s->cp && s->cp->compress) {
		const size_t sb = s->h->kv.stat_bytes;
		size_t W = (size_t)hp->head_dim > sb / 4 ? (size_t)hp->head_dim : sb / 4;
		s->cmp_len = k_cu_compress_scratch_bytes(H, (size_t)s->cap, (size_t)hp->group, W,
		                                         (size_t)hp->n_layer);
		RT_CU_TRY(err, cudaMalloc(&s->cmp, s->cmp_len));
	}
	return 0;
}

/* Why this backend cannot take sequence h under CUDA policy cp (NULL: the full cache) on
 * weights dm, as an rt_err; 0 when it can. Touches no device (the tests call it with no
 * weights: a refused policy is named before dm is read). */
static int attach_check(const rt_seq *h, const rt_cuda_model *dm, const struct kvp_cuda_policy *cp,
                        rt_err *err)
{
	if (cp && (cp->abi_version != KVP_CUDA_ABI_VERSION || !cp->host))
		return rt_err_set(err, "policy %s: CUDA policy of another ABI version", cp->name);
	const struct kvp_policy *p = h->p;
	const char *why;
	if (rt_cuda_refuses(p, &why))
		return rt_err_setc(err, RT_ERR_INPUT, "policy %s: not supported by the CUDA runtime: %s",
		                   p->name, why);
	if (cp ? cp->host != p && (strcmp(cp->name, p->name) || strcmp(cp->source_hash, p->source_hash))
	       : p != &rt_policy_full)
		return rt_err_set(err, "policy %s: the CUDA unit %s is not compiled from it", p->name,
		                  cp ? cp->name : "(none)");
	if (h->kv.type != RT_KV_F32 || h->kv.tiered)
		return rt_err_setc(err, RT_ERR_INPUT, "policy %s: the CUDA store holds f32 keys and "
		                   "values, not %s (--kv-type %s runs on the CPU only)", p->name,
		                   rt_kv_type_name(h->kv.type), rt_kv_type_name(h->kv.type));
	if (memcmp(&dm->hp, &h->m->hp, sizeof dm->hp) != 0)
		return rt_err_set(err, "%s: cuda sequence: the device weights belong to another model",
		                  h->m->path);
	return 0;
}

static int dev_forward(void *state, rt_kv *kv, const int32_t *tok, int32_t k, int64_t pos,
                       float *logits, enum rt_logits_mode mode, rt_err *err);
static int dev_compress(void *state, struct kvp_ctx *c, rt_kv *kv, rt_err *err);
static void dev_reset(void *state);

extern "C" int rt_cuda_seq_attach(rt_seq *h, const rt_cuda_model *dm,
                                  const struct kvp_cuda_policy *cp, rt_err *err)
{
	if (attach_check(h, dm, cp, err) != 0)
		return -1;
	rt_cuda_seq *s = (rt_cuda_seq *)calloc(1, sizeof *s);
	if (!s)
		return rt_err_set(err, "%s: cuda sequence: out of host memory", h->m->path);
	s->h = h;
	s->m = h->m;
	s->dm = dm;
	s->cp = cp;
	s->p = h->p;
	s->cap = h->cap;
	s->max_chunk = h->max_chunk < RT_CUDA_MAX_CHUNK ? h->max_chunk : RT_CUDA_MAX_CHUNK;
	RT_CU_GOTO(err, cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking));
	RT_CUBLAS_GOTO(err, cublasCreate(&s->cb));
	RT_CUBLAS_GOTO(err, cublasSetStream(s->cb, s->st));
	if (kv_alloc(&s->d, &h->kv, err) != 0 || scratch_alloc(s, err) != 0)
		goto fail;
	{
		const rt_seq_dev d = { "cuda", s->max_chunk, s, dev_forward, dev_compress, dev_reset,
			               dev_free };
		if (rt_seq_attach(h, &d, err) == 0)
			return 0;
	}
fail:
	dev_free(s);
	return -1;
}

extern "C" rt_cuda_seq *rt_cuda_seq_init(const rt_model *m, const rt_cuda_model *dm,
                                         const struct kvp_cuda_policy *cp, int32_t cap,
                                         int max_chunk, int64_t prompt_len, rt_err *err)
{
	if (cap < 1 || max_chunk < 1 || max_chunk > RT_CUDA_MAX_CHUNK) {
		rt_err_setc(err, RT_ERR_INPUT, "%s: cuda sequence: invalid capacity %d or chunk %d (1..%d)",
		            m->path, (int)cap, max_chunk, RT_CUDA_MAX_CHUNK);
		return NULL;
	}
	/* the refusals first, on a stand-in sequence: they need no model and no device */
	rt_seq probe;
	memset(&probe, 0, sizeof probe);
	probe.m = m;
	probe.p = cp && cp->abi_version == KVP_CUDA_ABI_VERSION && cp->host ? cp->host : &rt_policy_full;
	probe.kv.type = RT_KV_F32;
	const char *why;
	if ((cp && (cp->abi_version != KVP_CUDA_ABI_VERSION || !cp->host)) ||
	    rt_cuda_refuses(probe.p, &why)) {
		attach_check(&probe, dm, cp, err);
		return NULL;
	}
	rt_seq *h = (rt_seq *)calloc(1, sizeof *h);
	if (!h) {
		rt_err_set(err, "%s: cuda sequence: out of host memory", m->path);
		return NULL;
	}
	if (rt_seq_init(h, m, probe.p, cap, max_chunk, prompt_len, err) != 0 ||
	    rt_cuda_seq_attach(h, dm, cp, err) != 0) {
		rt_seq_free(h);
		free(h);
		return NULL;
	}
	rt_cuda_seq *s = (rt_cuda_seq *)h->dev.state;
	s->own = h;
	return s;
}

static void dev_reset(void *state)
{
	rt_cuda_seq *s = (rt_cuda_seq *)state;
	/* empty device heads: n = 0 everywhere, state zeroed */
	if (cudaMemsetAsync(s->d.n, 0, (size_t)s->d.n_layer * s->d.n_kv_head * 4, s->st) == cudaSuccess &&
	    s->d.state_bytes)
		cudaMemsetAsync(s->d.state, 0, (size_t)s->d.n_layer * s->d.n_kv_head * s->d.state_bytes, s->st);
	cudaStreamSynchronize(s->st);
}

extern "C" void rt_cuda_seq_reset(rt_cuda_seq *s, int64_t prompt_len)
{
	rt_seq_reset(s->h, prompt_len);
}

extern "C" int rt_cuda_seq_set(rt_cuda_seq *s, const char *assign, rt_err *err)
{
	return rt_seq_set(s->h, assign, err);
}

extern "C" int rt_cuda_seq_set_ratio(rt_cuda_seq *s, double R, rt_err *err)
{
	return rt_seq_set_ratio(s->h, R, err);
}

extern "C" int64_t rt_cuda_seq_seen(const rt_cuda_seq *s)
{
	return rt_seq_seen(s->h);
}

extern "C" int64_t rt_cuda_seq_compressions(const rt_cuda_seq *s)
{
	return s->h->run.compressions;
}

extern "C" const rt_kv *rt_cuda_seq_kv(rt_cuda_seq *s, rt_err *err)
{
	return kv_sync(s, 0, err) == 0 ? &s->h->kv : NULL;
}

/* One layer's attention: the policy's fused kernel, or the plain one. */
static int attend(rt_cuda_seq *s, int layer, int C, int64_t pos0, rt_err *err)
{
	const rt_model_hparams *hp = &s->m->hp;
	struct k_cu_attn_args a;
	memset(&a, 0, sizeof a);
	a.q = s->q;
	a.out = s->att;
	a.k = s->d.k;
	a.v = s->d.v;
	a.pos = s->d.pos;
	a.count = s->d.count;
	a.log_count = s->d.log_count;
	a.stats = s->d.stats;
	a.state = s->d.state;
	a.nb = s->d.n;
	a.scratch = s->attn;
	a.stat_bytes = s->d.stat_bytes;
	a.state_bytes = s->d.state_bytes;
	a.cap = s->cap;
	a.hd = hp->head_dim;
	a.G = hp->group;
	a.n_kv_head = hp->n_head_kv;
	a.n_layer = hp->n_layer;
	a.layer = layer;
	a.C = C;
	a.pos0 = pos0;
	a.scale = 1.0f / sqrtf((float)hp->head_dim);
	a.prompt_len = s->h->run.ctx.prompt_len;
	a.ratio = s->h->run.ctx.ratio;
	a.byte_ratio = s->h->run.ctx.byte_ratio;
	for (int i = 0; i < s->p->n_params && i < K_CU_MAX_PARAMS; i++)
		a.P.v[i] = s->h->run.ctx.params[i];
	cudaError_t e = s->cp ? (cudaError_t)s->cp->attend(&a, (void *)s->st)
	                      : k_cu_attn_launch<k_cu_obs_none>(&a, s->st);
	if (e != cudaSuccess)
		return rt_err_setc(err, rt_cu_code(e), "%s:%d: attention of layer %d (policy %s): %s",
		                   __FILE__, __LINE__, layer, s->p->name, cudaGetErrorString(e));
	return 0;
}

/* One layer of the chunk: x is updated in place. */
static int layer_fwd(rt_cuda_seq *s, int l, int C, int64_t pos0, rt_err *err)
{
	const rt_model_hparams *hp = &s->m->hp;
	const rt_cuda_layer *L = &s->dm->layers[l];
	const int E = hp->n_embd, F = hp->n_ff, hd = hp->head_dim;
	const int qd = hp->n_head * hd, kd = hp->n_head_kv * hd;
	rt_cu_rmsnorm<<<C, K_CU_THREADS, 0, s->st>>>(s->xn, s->x, L->attn_norm, E, hp->norm_eps);
	RT_CU_TRY(err, cudaGetLastError());
	if (gemm(s, s->q, s->xn, L->wq, C, qd, E, 0.0f, err) || gemm(s, s->k, s->xn, L->wk, C, kd, E, 0.0f, err) ||
	    gemm(s, s->v, s->xn, L->wv, C, kd, E, 0.0f, err))
		return -1;
	const size_t nq = (size_t)C * hp->n_head * (hp->n_rot / 2), nk = (size_t)C * hp->n_head_kv * (hp->n_rot / 2);
	rt_cu_rope<<<rt_cu_blocks(nq, 256), 256, 0, s->st>>>(s->q, s->cs, C, hp->n_head, hd, hp->n_rot);
	rt_cu_rope<<<rt_cu_blocks(nk, 256), 256, 0, s->st>>>(s->k, s->cs, C, hp->n_head_kv, hd, hp->n_rot);
	RT_CU_TRY(err, cudaGetLastError());
	rt_cu_append<<<dim3(hp->n_head_kv, C), 64, 0, s->st>>>(
		s->d.k, s->d.v, s->d.pos, s->d.count, s->d.log_count, s->d.span, s->d.stats, s->k, s->v,
		s->d.n, l, hp->n_head_kv, hd, s->cap, s->d.stat_bytes, pos0, s->h->span);
	RT_CU_TRY(err, cudaGetLastError());
	if (attend(s, l, C, pos0, err) != 0)
		return -1;
	if (gemm(s, s->x, s->att, L->wo, C, E, qd, 1.0f, err) != 0)
		return -1;
	rt_cu_rmsnorm<<<C, K_CU_THREADS, 0, s->st>>>(s->xn, s->x, L->ffn_norm, E, hp->norm_eps);
	RT_CU_TRY(err, cudaGetLastError());
	if (gemm(s, s->gate, s->xn, L->w_gate, C, F, E, 0.0f, err) || gemm(s, s->up, s->xn, L->w_up, C, F, E, 0.0f, err))
		return -1;
	rt_cu_swiglu<<<rt_cu_blocks((size_t)C * F, 256), 256, 0, s->st>>>(s->gate, s->up, (size_t)C * F);
	RT_CU_TRY(err, cudaGetLastError());
	return gemm(s, s->x, s->gate, L->w_down, C, E, F, 1.0f, err);
}

/* Forward C tokens at pos0; logits of rows from..C-1 to host lg (NULL: none). */
static int forward_chunk(rt_cuda_seq *s, const int32_t *tok, int C, int64_t pos0, float *lg,
                         int from, rt_err *err)
{
	const rt_model_hparams *hp = &s->m->hp;
	const int E = hp->n_embd, V = hp->n_vocab;
	memcpy(s->h_tok, tok, (size_t)C * 4);
	RT_CU_TRY(err, cudaMemcpyAsync(s->tok, s->h_tok, (size_t)C * 4, cudaMemcpyHostToDevice, s->st));
	rt_cu_embed<<<rt_cu_blocks((size_t)C * E, 256), 256, 0, s->st>>>(s->x, s->dm->tok_embd, s->tok, C, E);
	rt_cu_rope_table<<<rt_cu_blocks((size_t)C * (hp->n_rot / 2), 256), 256, 0, s->st>>>(
		s->cs, C, pos0, hp->n_rot, hp->rope_base);
	RT_CU_TRY(err, cudaGetLastError());
	for (int l = 0; l < hp->n_layer; l++)
		if (layer_fwd(s, l, C, pos0, err) != 0)
			return -1;
	const int H = hp->n_layer * hp->n_head_kv;
	rt_cu_advance<<<rt_cu_blocks((size_t)H, 128), 128, 0, s->st>>>(s->d.n, H, C);
	RT_CU_TRY(err, cudaGetLastError());
	if (lg) {
		const int nr = C - from;
		rt_cu_rmsnorm<<<nr, K_CU_THREADS, 0, s->st>>>(s->xn, s->x + (size_t)from * E, s->dm->out_norm, E, hp->norm_eps);
		RT_CU_TRY(err, cudaGetLastError());
		if (gemm(s, s->logits, s->xn, s->dm->output, nr, V, E, 0.0f, err) != 0)
			return -1;
		RT_CU_TRY(err, cudaMemcpyAsync(s->h_logits, s->logits, (size_t)nr * V * 4,
		                               cudaMemcpyDeviceToHost, s->st));
	}
	RT_CU_TRY(err, cudaStreamSynchronize(s->st));
	if (lg)
		memcpy(lg, s->h_logits, (size_t)(C - from) * V * 4);
	for (int i = 0; i < H; i++)
		s->h->kv.heads[i].n += C;
	return 0;
}

/* rt_seq_dev.compress: the CUDA policy's compress on the device store, or the C compress
 * on a downloaded copy that is uploaded again; the host view's counts follow the device
 * (rt_run_advance then returns emptied blocks to the pool). */
static int dev_compress(void *state, struct kvp_ctx *c, rt_kv *kv, rt_err *err)
{
	rt_cuda_seq *s = (rt_cuda_seq *)state;
	if (s->cp->compress) {
		struct kvp_cuda_compress_in in = { c, kv, &s->d, s->cmp, s->cmp_len, (void *)s->st };
		if (s->cp->compress(&in, err) != 0)
			return -1;
		RT_CU_TRY(err, cudaMemcpyAsync(s->h_n, s->d.n, (size_t)kv->n_layer * kv->n_kv_head * 4,
		                               cudaMemcpyDeviceToHost, s->st));
		RT_CU_TRY(err, cudaStreamSynchronize(s->st));
		for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
			kv->heads[i].n = s->h_n[i];
		return 0;
	}
	if (kv_sync(s, 0, err) != 0 || s->p->compress(c, kv, err) != 0)
		return -1;
	return kv_sync(s, 1, err);
}

/* rt_seq_dev.forward: one chunk of k <= max_chunk tokens (rt_seq_feed plans it and has
 * reserved the host view's blocks). */
static int dev_forward(void *state, rt_kv *kv, const int32_t *tok, int32_t k, int64_t pos,
                       float *logits, enum rt_logits_mode mode, rt_err *err)
{
	rt_cuda_seq *s = (rt_cuda_seq *)state;
	const rt_model_hparams *hp = &s->m->hp;
	(void)kv; /* = &s->h->kv */
	if (k < 1 || k > s->max_chunk)
		return rt_err_set(err, "%s: cuda sequence: chunk of %d tokens (1..%d)", s->m->path,
		                  (int)k, s->max_chunk);
	if (pos + k > hp->n_ctx)
		return rt_err_setc(err, RT_ERR_INPUT,
		                   "%s: context of %lld tokens exceeds the model's context_length %d",
		                   s->m->path, (long long)(pos + k), (int)hp->n_ctx);
	for (int32_t i = 0; i < k; i++)
		if (tok[i] < 0 || tok[i] >= hp->n_vocab)
			return rt_err_set(err, "%s: token %d at index %lld is outside the vocabulary (0..%d)",
			                  s->m->path, (int)tok[i], (long long)(pos + i), hp->n_vocab - 1);
	return forward_chunk(s, tok, k, pos, mode == RT_LOGITS_NONE ? NULL : logits,
	                     mode == RT_LOGITS_LAST ? k - 1 : 0, err);
}

extern "C" int rt_cuda_seq_feed(rt_cuda_seq *s, const int32_t *tokens, int64_t n, float *logits,
                                enum rt_logits_mode mode, rt_err *err)
{
	return rt_seq_feed(s->h, tokens, n, logits, mode, err);
}
