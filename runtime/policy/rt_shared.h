/*
 * rt_shared: compiled policies as a function of arrays, for an engine other than kvpc's
 * own runtime (a paged engine such as vLLM, docs/vllm.md). `kvpc build --shared` links
 * these functions with the policies into a shared library that exports them as the C ABI
 * of docs/shared_abi.md (kvpc_abi_version, kvpc_policies, kvpc_window, kvpc_select); here
 * they take the registry explicitly so the runtime's tests call them on their own
 * registry.
 *
 * One request, once at the end of its prompt: the keys (post-RoPE, as the attention used
 * them) of every (layer, KV head) for prompt positions 0..n-1, the optional values and
 * span ids, and the post-RoPE queries of the last n_window prompt positions. The request is
 * replayed through the runtime's own path: the entries are appended to an rt_kv store of
 * the policy's shape (rt_run_init, init_entries), the window rows are attended with the
 * runtime's softmax (rt_attn_softmax) and handed to the policy's observe, and
 * rt_run_advance runs the generated compress. So guards, budgets, allocation and the tie
 * rule (equal scores keep the lower position) are the runtime's, not a second copy.
 *
 * Only what a one-shot prompt-end call can replay is accepted: a policy that compresses
 * before the prompt end (per step, per prefill block), observes rows before the window,
 * or needs the prompt trace, pre-RoPE queries, f32 row rewrites or precision tiers is
 * refused with a message (kvpc check --target paged says which library policies pass).
 */
#ifndef RT_SHARED_H
#define RT_SHARED_H

#include <stddef.h>
#include <stdint.h>

#include "policy/rt_policy.h"

/* Version of the shared ABI (kvpc_abi_version); bumped on any change of a signature,
 * layout or error code below. */
#define RT_SHARED_ABI 1

/* Error codes of the shared ABI (0: success). ORDER: docs/shared_abi.md's table. */
enum rt_shared_status {
	RT_SHARED_OK = 0,
	RT_SHARED_E_ARG = 1,     /* a NULL array, a shape out of range or inconsistent */
	RT_SHARED_E_POLICY = 2,  /* no policy of that name in the library */
	RT_SHARED_E_PARAM = 3,   /* unknown parameter, bad value, bad ratio */
	RT_SHARED_E_UNSUPPORTED = 4, /* the policy cannot be replayed once at the prompt end */
	RT_SHARED_E_WINDOW = 5,  /* fewer window queries than the policy observes */
	RT_SHARED_E_BUDGET = 6,  /* budget/guards infeasible for this prompt, compress failed */
	RT_SHARED_E_NOMEM = 7,   /* allocation failure */
};

/* One request (shapes in the names' units; every array is the caller's, read only). */
struct rt_shared_req {
	const char *policy;      /* policy name */
	const char *set;         /* "name=value,name=value" (kvpc's --set; NULL or "": none) */
	double ratio;            /* compression factor R >= 1 replacing the budget, 0 = none */
	int n_layer, n_kv_head, group, head_dim; /* model shape; n_head = n_kv_head · group */
	int32_t n;               /* prompt tokens = entries per (layer, KV head), >= 1 */
	const float *keys;       /* [n_layer][n_kv_head][n][head_dim] post-RoPE keys of
	                            positions 0..n-1 */
	const float *values;     /* same shape, or NULL (then zeros: a policy reading values
	                            is refused) */
	const uint16_t *span;    /* [n] protected-span id per position (0 none), or NULL */
	const char *const *span_names; /* [n_spans + 1], [s] names span id s; NULL if none */
	int n_spans;
	int32_t n_window;        /* window rows given, 0..n */
	const float *queries;    /* [n_layer][n_window][n_kv_head · group][head_dim]
	                            post-RoPE queries of positions n-n_window .. n-1 (query
	                            head q belongs to KV head q / group); NULL iff n_window 0 */
};

/* Select the kept entries of req under its policy. keep: [n_layer][n_kv_head][n] (the
 * caller's), filled per (layer, KV head) with the kept positions in increasing order;
 * n_keep: [n_layer][n_kv_head] their counts (the rest of each row is left as it was).
 * A policy that never compresses (or a budget above the prompt) keeps every position.
 * Returns RT_SHARED_OK, or an error code with err set ("policy NAME: reason"); never
 * aborts on bad input. reg[0..n_reg): the registry to look the policy up in. */
int rt_shared_select(const struct kvp_policy *const *reg, int n_reg,
                     const struct rt_shared_req *req, int32_t *keep, int32_t *n_keep,
                     rt_err *err);

/* The window rows the policy observes for a prompt of n tokens (its observation window
 * with req's --set values; 0 for a policy that reads no attention), into *window. Only
 * req->policy, set, ratio, n, group and head_dim are read. Returns a status as above. */
int rt_shared_window(const struct kvp_policy *const *reg, int n_reg,
                     const struct rt_shared_req *req, int32_t *window, rt_err *err);

/* ---- the exported C ABI (docs/shared_abi.md) -------------------------------------------
 *
 * What a `kvpc build --shared` library exports, over the registry linked into it
 * (kvp_registry): flat signatures, so that ctypes or any C caller needs no struct layout.
 * Each returns a status of enum rt_shared_status and, on error, writes the message to
 * err[0..err_len) (always terminated when err_len > 0; err may be NULL). No function keeps
 * a pointer after it returns or allocates anything the caller frees; calls on different
 * threads are independent. */

/* RT_SHARED_ABI: a caller compares it with the version it was written for. */
int kvpc_abi_version(void);

/* The policy names of the library, comma-separated, in build order ("full", the
 * built-in full cache, is not listed but accepted). Static storage. */
const char *kvpc_policies(void);

/* rt_shared_window for (policy, set, ratio) on a prompt of n tokens, GQA group and
 * head_dim. */
int kvpc_window(const char *policy, const char *set, double ratio, int group, int head_dim,
                int32_t n, int32_t *window, char *err, size_t err_len);

/* rt_shared_select with the fields of struct rt_shared_req as arguments (no span names:
 * span ids are kept as given, `protect all spans` reads them). */
int kvpc_select(const char *policy, const char *set, double ratio, int n_layer, int n_kv_head,
                int group, int head_dim, int32_t n, const float *keys, const float *values,
                const uint16_t *span, int32_t n_window, const float *queries, int32_t *keep,
                int32_t *n_keep, char *err, size_t err_len);

#endif
