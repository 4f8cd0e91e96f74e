/* rt_shared: a request's arrays replayed through the runtime's policy path (rt_shared.h). */
#include "policy/rt_shared.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/rt_kv.h"
#include "model/rt_model.h"

/* needs a one-shot replay from keys and window queries cannot supply */
#define SHARED_UNSUPPORTED \
	(KVP_NEED_TRACE | KVP_NEED_QUERY | KVP_NEED_F32_KV | KVP_NEED_TIERS | KVP_NEED_HIDDEN)

/* set err, give the status code (err must be in scope) */
#define FAIL(code, ...) (rt_err_set(err, __VA_ARGS__), (code))

/* Shape and pointer checks of everything select reads. */
static int req_check(const struct rt_shared_req *q, int full, rt_err *err)
{
	if (!q || !q->policy)
		return FAIL(RT_SHARED_E_ARG, "shared: no request or policy name");
	const char *P = q->policy;
	if (q->group < 1 || q->group > 256 || q->head_dim < 1 || q->head_dim > 4096)
		return FAIL(RT_SHARED_E_ARG, "policy %s: group %lld or head_dim %lld out of range "
		            "(1..256, 1..4096)", P, (long long)q->group, (long long)q->head_dim);
	if (q->n < 1 || q->n > (1 << 24))
		return FAIL(RT_SHARED_E_ARG, "policy %s: %lld prompt tokens: must be 1..2^24",
		            P, (long long)q->n);
	if (!full)
		return RT_SHARED_OK;
	if (q->n_layer < 1 || q->n_layer > 4096 || q->n_kv_head < 1 || q->n_kv_head > 4096)
		return FAIL(RT_SHARED_E_ARG, "policy %s: n_layer %lld or n_kv_head %lld out of "
		            "range (1..4096)", P, (long long)q->n_layer, (long long)q->n_kv_head);
	const double floats = (double)q->n_layer * q->n_kv_head * q->n * q->head_dim;
	if (floats > (double)(SIZE_MAX / 8))
		return FAIL(RT_SHARED_E_ARG, "policy %s: keys of %lld x %lld entries are too large",
		            P, (long long)q->n_layer * q->n_kv_head, (long long)q->n);
	if (!q->keys)
		return FAIL(RT_SHARED_E_ARG, "policy %s: keys is NULL", P);
	if (q->n_window < 0 || q->n_window > q->n)
		return FAIL(RT_SHARED_E_ARG, "policy %s: n_window %lld outside 0..%lld (the prompt)",
		            P, (long long)q->n_window, (long long)q->n);
	if ((q->n_window > 0) != (q->queries != NULL))
		return FAIL(RT_SHARED_E_ARG, "policy %s: queries must be given iff n_window > 0 "
		            "(n_window %lld)", P, (long long)q->n_window);
	if (q->n_spans < 0 || q->n_spans > 65535 || (q->n_spans > 0 && !q->span_names))
		return FAIL(RT_SHARED_E_ARG, "policy %s: %lld span names but span_names is NULL "
		            "or the count is out of range", P, (long long)q->n_spans);
	for (int32_t i = 0; q->span && i < q->n; i++)
		if (q->span[i] > q->n_spans && !(q->n_spans == 0 && !q->span_names))
			return FAIL(RT_SHARED_E_ARG, "policy %s: span id %lld at position %lld has no "
			            "name", P, (long long)q->span[i], (long long)i);
	return RT_SHARED_OK;
}

/* The policy of req, its needs checked. */
static int policy_find(const struct kvp_policy *const *reg, int n_reg,
                       const struct rt_shared_req *q, const struct kvp_policy **out, rt_err *err)
{
	const struct kvp_policy *p = rt_registry_find(reg, n_reg, q->policy);
	if (!p) {
		char names[384] = "";
		for (int i = 0; i < n_reg; i++) {
			size_t l = strlen(names);
			snprintf(names + l, sizeof names - l, "%s%s", i ? ", " : "", reg[i]->name);
		}
		return FAIL(RT_SHARED_E_POLICY, "policy %s: not in this library (it has: %s%sfull)",
		            q->policy, names, n_reg ? ", " : "");
	}
	if (p->needs & SHARED_UNSUPPORTED)
		return FAIL(RT_SHARED_E_UNSUPPORTED, "policy %s: needs %s, which a one-shot call "
		            "from keys and window queries cannot give (needs 0x%llx)", p->name,
		            (p->needs & KVP_NEED_TRACE) ? "the prompt trace"
		            : (p->needs & KVP_NEED_QUERY) ? "pre-RoPE query statistics"
		            : (p->needs & KVP_NEED_HIDDEN) ? "the layers' hidden states"
		            : (p->needs & KVP_NEED_TIERS) ? "precision tiers" : "f32 row rewrites",
		            (long long)p->needs);
	*out = p;
	return RT_SHARED_OK;
}

/* Apply req's --set list and ratio to the run. */
static int run_params(struct rt_run *r, const struct rt_shared_req *q, rt_err *err)
{
	if (q->set && q->set[0]) {
		char *copy = strdup(q->set);
		if (!copy)
			return FAIL(RT_SHARED_E_NOMEM, "policy %s: out of memory", q->policy);
		int rc = RT_SHARED_OK;
		for (char *save = NULL, *t = strtok_r(copy, ",", &save); t && rc == RT_SHARED_OK;
		     t = strtok_r(NULL, ",", &save)) {
			while (*t == ' ')
				t++;
			if (*t && rt_run_set(r, t, err) != 0)
				rc = RT_SHARED_E_PARAM;
		}
		free(copy);
		if (rc)
			return rc;
		if (kvp_policy_params_check(r->p, r->params, err) != 0)
			return RT_SHARED_E_PARAM;
	}
	if (q->ratio != 0 && rt_run_set_ratio(r, q->ratio, err) != 0)
		return RT_SHARED_E_PARAM;
	return RT_SHARED_OK;
}

/* Run state and store of p for req's shape (n_layer x n_kv_head heads, or 1 x 1 for the
 * window probe), parameters applied. On error both are freed. */
static int run_open(struct rt_run *r, rt_kv *kv, const struct kvp_policy *p,
                    const struct rt_shared_req *q, int L, int H, int32_t cap, rt_err *err)
{
	if (rt_run_init(r, kv, p, L, H, q->group, q->head_dim, cap, q->n, err) != 0)
		return RT_SHARED_E_NOMEM;
	int rc = run_params(r, q, err);
	if (rc) {
		rt_run_free(r);
		rt_kv_free(kv);
	}
	return rc;
}

static int nonzero(const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 1;
	return 0;
}

/* The window: observe a one-entry head at steps n-1, n-2, ... with every probability 1
 * until a step leaves the statistics and state untouched (k_stat_in_prompt_tail in the
 * generated observe decides, with the run's parameters). The run is opened, so the --set
 * names and the ratio are checked, even for a policy that observes nothing: a caller
 * validates a request with this call before it has any keys. */
static int window_probe(const struct kvp_policy *p, const struct rt_shared_req *q,
                        int32_t *window, rt_err *err)
{
	*window = 0;
	struct rt_run r;
	rt_kv kv;
	int rc = run_open(&r, &kv, p, q, 1, 1, 1, err);
	if (rc)
		return rc;
	if (!p->observe)
		goto closed;
	const int G = q->group, d = q->head_dim;
	float *buf = calloc((size_t)G * (d + 1) + (size_t)d, sizeof *buf);
	if (!buf) {
		rc = FAIL(RT_SHARED_E_NOMEM, "policy %s: out of memory", p->name);
		goto done;
	}
	float *probs = buf, *out = buf + G, *zero = buf + (size_t)G * (d + 1);
	for (int g = 0; g < G; g++)
		probs[g] = 1.0f;
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	rt_kv_append(&kv, h, zero, zero, 0);
	for (int64_t t = q->n - 1; t >= 0; t--) {
		memset(h->stats, 0, kv.stat_bytes);
		memset(h->state, 0, kv.state_bytes);
		const struct kvp_obs ob = { .step = t, .n = 1, .group = G, .probs = probs,
		                            .out = (p->needs & KVP_NEED_OUT) ? out : NULL };
		p->observe(&r.ctx, &kv, 0, 0, &ob);
		if (!nonzero(h->stats, kv.stat_bytes) && !nonzero(h->state, kv.state_bytes))
			break;
		(*window)++;
	}
done:
	free(buf);
closed:
	rt_run_free(&r);
	rt_kv_free(&kv);
	return rc;
}

int rt_shared_window(const struct kvp_policy *const *reg, int n_reg,
                     const struct rt_shared_req *req, int32_t *window, rt_err *err)
{
	const struct kvp_policy *p = NULL;
	int rc = req_check(req, 0, err);
	if (!rc)
		rc = window ? policy_find(reg, n_reg, req, &p, err)
		            : FAIL(RT_SHARED_E_ARG, "policy %s: window is NULL", req->policy);
	return rc ? rc : window_probe(p, req, window, err);
}

/* Append every position to every head (keys, values, spans) and run init_entries. */
static int store_fill(struct rt_run *r, rt_kv *kv, const struct rt_shared_req *q, rt_err *err)
{
	const int d = q->head_dim;
	float *zero = calloc((size_t)d, sizeof *zero);
	if (!zero || rt_kv_reserve(kv, q->n, err) != 0) {
		free(zero);
		return FAIL(RT_SHARED_E_NOMEM, "policy %s: cannot hold the prompt's entries", q->policy);
	}
	for (int l = 0; l < q->n_layer; l++)
		for (int j = 0; j < q->n_kv_head; j++) {
			rt_kv_head *h = rt_kv_head_at(kv, l, j);
			const size_t base = ((size_t)l * q->n_kv_head + j) * q->n * d;
			for (int32_t i = 0; i < q->n; i++) {
				const size_t o = base + (size_t)i * d;
				rt_kv_append(kv, h, q->keys + o, q->values ? q->values + o : zero, i);
				if (q->span)
					h->span[i] = q->span[i];
			}
			if (r->p->init_entries)
				r->p->init_entries(&r->ctx, kv, l, j, 0, q->n);
		}
	free(zero);
	return RT_SHARED_OK;
}

/* Attend the last w window rows over each head (scores in f32, the runtime's softmax)
 * and hand them to observe, layer by layer as the forward does. */
static int store_observe(struct rt_run *r, rt_kv *kv, const struct rt_shared_req *q, int32_t w,
                         rt_err *err)
{
	const struct kvp_policy *p = r->p;
	if (!p->observe || w == 0)
		return RT_SHARED_OK;
	const int G = q->group, d = q->head_dim, nh = q->n_kv_head * G;
	const int32_t n = q->n, W = q->n_window;
	const float scale = 1.0f / sqrtf((float)d);
	float *S = malloc(((size_t)G * n + (size_t)G * d) * sizeof *S);
	if (!S)
		return FAIL(RT_SHARED_E_NOMEM, "policy %s: out of memory", q->policy);
	float *out = S + (size_t)G * n;
	for (int l = 0; l < q->n_layer; l++)
		for (int32_t t = n - w; t < n; t++) {
			const float *qrow = q->queries + ((size_t)l * W + (size_t)(t - (n - W))) * nh * d;
			for (int j = 0; j < q->n_kv_head; j++) {
				rt_kv_head *h = rt_kv_head_at(kv, l, j);
				const int32_t lim = t + 1;
				for (int g = 0; g < G; g++) {
					const float *qg = qrow + (size_t)(j * G + g) * d;
					for (int32_t i = 0; i < lim; i++) {
						const float *k = h->k + (size_t)i * d;
						float s = 0;
						for (int c = 0; c < d; c++)
							s += qg[c] * k[c];
						S[(size_t)g * lim + i] = scale * s;
					}
				}
				rt_attn_softmax(S, (size_t)lim, G, lim, h->log_count);
				if (p->needs & KVP_NEED_OUT)
					for (int g = 0; g < G; g++)
						for (int c = 0; c < d; c++) {
							float o = 0;
							for (int32_t i = 0; i < lim; i++)
								o += S[(size_t)g * lim + i] * h->v[(size_t)i * d + c];
							out[(size_t)g * d + c] = o;
						}
				const struct kvp_obs ob = {
					.step = t, .n = lim, .group = G,
					.probs = (p->needs & KVP_NEED_ATTN) ? S : NULL,
					.out = (p->needs & KVP_NEED_OUT) ? out : NULL,
				};
				p->observe(&r->ctx, kv, l, j, &ob);
			}
		}
	free(S);
	return RT_SHARED_OK;
}

static int cmp_i32(const void *a, const void *b)
{
	const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* The replay on a store of req's shape: check, fill, observe, compress, read out. */
static int select_run(const struct kvp_policy *p, const struct rt_shared_req *q, int32_t w,
                      int32_t *keep, int32_t *n_keep, rt_err *err)
{
	struct rt_run r;
	rt_kv kv;
	int rc = run_open(&r, &kv, p, q, q->n_layer, q->n_kv_head, q->n, err);
	if (rc)
		return rc;
	r.ctx.span_names = q->span_names;
	r.ctx.n_spans = q->n_spans;
	const int32_t k = rt_run_chunk(&r, &kv, q->n);
	if (k < q->n) {
		rc = FAIL(RT_SHARED_E_UNSUPPORTED, "policy %s: compresses before the prompt end "
		          "(after %lld of %lld tokens: per step or per prefill block); the shared "
		          "library runs a policy once at the prompt end", p->name, (long long)k, (long long)q->n);
	} else if (rt_policy_check(&r, &kv, err) != 0) {
		rc = RT_SHARED_E_BUDGET;
	} else if (!(rc = store_fill(&r, &kv, q, err)) && !(rc = store_observe(&r, &kv, q, w, err)) &&
	           rt_run_advance(&r, &kv, q->n, err) < 0) {
		rc = RT_SHARED_E_BUDGET;
	}
	for (int l = 0; !rc && l < q->n_layer; l++)
		for (int j = 0; j < q->n_kv_head; j++) {
			const rt_kv_head *h = rt_kv_head_at(&kv, l, j);
			int32_t *row = keep + ((size_t)l * q->n_kv_head + j) * q->n;
			memcpy(row, h->pos, (size_t)h->n * sizeof *row);
			qsort(row, (size_t)h->n, sizeof *row, cmp_i32);
			n_keep[(size_t)l * q->n_kv_head + j] = h->n;
		}
	rt_run_free(&r);
	rt_kv_free(&kv);
	return rc;
}

int rt_shared_select(const struct kvp_policy *const *reg, int n_reg,
                     const struct rt_shared_req *req, int32_t *keep, int32_t *n_keep,
                     rt_err *err)
{
	const struct kvp_policy *p = NULL;
	int32_t w = 0;
	int rc = req_check(req, 1, err);
	if (!rc && (!keep || !n_keep))
		rc = FAIL(RT_SHARED_E_ARG, "policy %s: keep or n_keep is NULL", req->policy);
	if (!rc)
		rc = policy_find(reg, n_reg, req, &p, err);
	if (!rc && (p->needs & (KVP_NEED_VALUES | KVP_NEED_OUT)) && !req->values)
		rc = FAIL(RT_SHARED_E_ARG, "policy %s: reads values, and values is NULL", p->name);
	if (!rc)
		rc = window_probe(p, req, &w, err);
	if (!rc && w > req->n_window)
		rc = FAIL(RT_SHARED_E_WINDOW, "policy %s: observes the queries of the last %lld "
		          "prompt positions; %lld were given", p->name, (long long)w, (long long)req->n_window);
	return rc ? rc : select_run(p, req, w, keep, n_keep, err);
}

/* ---- the exported C ABI ------------------------------------------------------------------ */

static void err_out(const rt_err *e, int rc, char *err, size_t err_len)
{
	if (err && err_len > 0)
		snprintf(err, err_len, "%s", rc ? e->msg : "");
}

int kvpc_abi_version(void)
{
	return RT_SHARED_ABI;
}

const char *kvpc_policies(void)
{
	static char names[1024];
	if (!names[0])
		for (int i = 0; i < kvp_registry_count; i++) {
			size_t l = strlen(names);
			snprintf(names + l, sizeof names - l, "%s%s", i ? "," : "", kvp_registry[i]->name);
		}
	return names;
}

int kvpc_window(const char *policy, const char *set, double ratio, int group, int head_dim,
                int32_t n, int32_t *window, char *err, size_t err_len)
{
	const struct rt_shared_req q = { .policy = policy, .set = set, .ratio = ratio,
	                                 .group = group, .head_dim = head_dim, .n = n };
	rt_err e = { "" };
	const int rc = rt_shared_window(kvp_registry, kvp_registry_count, &q, window, &e);
	err_out(&e, rc, err, err_len);
	return rc;
}

int kvpc_select(const char *policy, const char *set, double ratio, int n_layer, int n_kv_head,
                int group, int head_dim, int32_t n, const float *keys, const float *values,
                const uint16_t *span, int32_t n_window, const float *queries, int32_t *keep,
                int32_t *n_keep, char *err, size_t err_len)
{
	const struct rt_shared_req q = {
		.policy = policy, .set = set, .ratio = ratio, .n_layer = n_layer,
		.n_kv_head = n_kv_head, .group = group, .head_dim = head_dim, .n = n, .keys = keys,
		.values = values, .span = span, .n_window = n_window, .queries = queries,
	};
	rt_err e = { "" };
	const int rc = rt_shared_select(kvp_registry, kvp_registry_count, &q, keep, n_keep, &e);
	err_out(&e, rc, err, err_len);
	return rc;
}
