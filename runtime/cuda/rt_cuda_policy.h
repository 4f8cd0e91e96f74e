/*
 * rt_cuda_policy: what `kvpc emit --target cuda` generates for a policy (policy_NAME.cu)
 * and the CUDA runtime (runtime/cuda/rt_cuda.h) calls — the device half of the policy ABI
 * of runtime/policy/rt_policy.h (docs/runtime_abi.md, docs/cuda.md). A CUDA policy is one
 * `const struct kvp_cuda_policy` that points at the C policy generated from the same
 * source (its parameters, triggers and host compress stay the C ones) and adds:
 *
 *   attend    one layer's attention over a chunk with the policy's statistic update
 *             fused in: one kernel computes, per (KV head, query row), the probabilities,
 *             the output and the statistics of every live entry (kernels/k_attn.cuh)
 *   compress  the compress pipeline on the device — score, pooling, group reduction,
 *             guards, per-layer budgets, selection (kernels/k_select.cuh: ties keep the
 *             lower position) and compaction (kernels/k_compact.cuh) — for the policies
 *             whose pipeline the device kernels cover (evict, one budget per head, a score
 *             without whole-head transforms); NULL otherwise, and the runtime runs the C
 *             compress on a host copy of the store (host_compress_why says why)
 *
 * The device store is struct rt_cuda_kv: the arrays of rt_kv (kv/rt_kv.h) for every
 * (layer, KV head), entry lists per KV head, never per query head.
 */
#ifndef RT_CUDA_POLICY_H
#define RT_CUDA_POLICY_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stddef.h>
#include <stdint.h>

#include "base/rt_util.h"
#include "kv/rt_kv.h"
#include "policy/rt_policy.h"

#define KVP_CUDA_ABI_VERSION 1

/* The KV store on the device: the arrays of rt_kv for H = n_layer × n_kv_head heads, head
 * hi = layer · n_kv_head + kv_head at offset hi · cap entries of every array. */
typedef struct rt_cuda_kv {
	int n_layer, n_kv_head, group, head_dim;
	int32_t cap;           /* entries per head */
	size_t stat_bytes;     /* per entry */
	size_t state_bytes;    /* per head */
	float *k, *v;          /* [H × cap × head_dim] post-RoPE keys, values */
	int32_t *pos;          /* [H × cap] original positions */
	float *count;          /* [H × cap] tokens represented */
	float *log_count;      /* [H × cap] log(count) */
	uint16_t *span;        /* [H × cap] protected span id */
	uint8_t *stats;        /* [H × cap × stat_bytes] */
	uint8_t *state;        /* [H × state_bytes] */
	int32_t *n;            /* [H] entries in use */
	void *mem;             /* the one device allocation */
	size_t mem_bytes;
} rt_cuda_kv;

/* What a device compress receives. */
struct kvp_cuda_compress_in {
	const struct kvp_ctx *ctx;  /* the host context: parameters, seen, prompt, ratio, spans */
	const rt_kv *shadow;        /* host shadow: the shape and every head's entry count n */
	const rt_cuda_kv *dkv;      /* the device store */
	void *scratch;              /* device scratch, >= kvp_cuda_compress_scratch(dkv) bytes */
	size_t scratch_len;
	void *stream;               /* cudaStream_t the kernels are queued on */
};

struct k_cu_attn_args;          /* kernels/k_attn.cuh */
struct k_cu_compress_args;      /* kernels/k_compact.cuh */
struct k_compress_cfg;          /* kernels/k_compress.h */

struct kvp_cuda_policy {
	int abi_version;            /* KVP_CUDA_ABI_VERSION */
	const struct kvp_policy *host; /* the C policy of the same source */
	const char *name;           /* == host->name */
	const char *source_hash;    /* == host->source_hash */
	/* Queue one layer's attention (and observe) on stream (a cudaStream_t); returns a
	 * cudaError_t (0 = queued). */
	int (*attend)(const struct k_cu_attn_args *a, void *stream);
	/* Queue the device compress; returns 0, or -1 with err set. NULL: host compress. */
	int (*compress)(const struct kvp_cuda_compress_in *in, rt_err *err);
	const char *host_compress_why; /* "" when compress is set */
	/* CPU references (host loops over the same functors; the tests and the GPU check
	 * compare them with the C policy and the kernels): */
	/* attend for KV head j, chunk row r on host arrays; P: [G × cap] host scratch */
	void (*attend_ref)(const struct k_cu_attn_args *a, int j, int r, float *P);
	/* the k_compress_cfg compress builds from ctx (NULL with compress) */
	void (*compress_cfg)(const struct kvp_ctx *ctx, const rt_kv *kv, struct k_compress_cfg *cfg);
	/* k_cu_compress_select for head hi on host arrays (NULL with compress) */
	void (*compress_ref)(const struct k_cu_compress_args *a, size_t hi);
};

#ifdef __cplusplus
}
#endif

#endif
