/*
 * rt_gracekv: builds the GraceKV core's input from a compiled policy's context and values
 * and runs it in the policy's scratch (see rt_gracekv.h; docs/gracekv.md). Layout of the
 * scratch: probe queries, probe positions, segment starts, boundaries, hop row, the
 * segmentation work, then the core's own area (rt_grace_init_at).
 */
#include "policy/rt_gracekv.h"

#include <math.h>
#include <string.h>

void rt_gracekv_cfg_default(rt_gracekv_cfg *c)
{
	memset(c, 0, sizeof *c);
	c->name = "gracekv";
	c->budget = 0.0;
	c->recent = 32;
	c->slot = 64;
	c->floor = 16;
	c->floor_each = 1;
	c->head_share = 0.0;
	c->probe = 64;
	c->hops = 1;
	c->key_mode = RT_GRACE_KEY_POST;
	c->count_mode = RT_GRACE_COUNT_COHERENCE;
}

static size_t al64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* Sizes of the glue's own blocks (bytes) before the core's area. */
struct glue_sizes {
	size_t probe_q, probe_pos, seg, bound, row, pin, work;
};

static struct glue_sizes glue_sizes(const rt_kv *kv)
{
	const size_t LG = (size_t)kv->n_layer * kv->n_kv_head, C = (size_t)kv->cap;
	const size_t R = (size_t)kv->group, d = (size_t)kv->head_dim;
	const int n_embd = (int)((size_t)kv->n_kv_head * R * d);
	struct glue_sizes z;
	z.probe_q = al64(LG * KVP_TRACE_TAIL * R * d * sizeof(float));
	z.probe_pos = al64(KVP_TRACE_TAIL * sizeof(int32_t));
	z.seg = al64((C + 1) * sizeof(int32_t));
	z.bound = al64(C * sizeof(float));
	z.row = al64(C * sizeof(float));
	z.pin = al64(C);
	z.work = al64(rt_grace_segment_work(kv->cap, n_embd, KVP_TRACE_LAYERS, 4) * sizeof(double));
	return z;
}

size_t rt_gracekv_scratch_bytes(const rt_kv *kv)
{
	size_t core = rt_grace_bytes(kv, 0, KVP_TRACE_TAIL);
	if (core == 0 || core == SIZE_MAX)
		return core;
	struct glue_sizes z = glue_sizes(kv);
	return 64 + z.probe_q + z.probe_pos + z.seg + z.bound + z.row + z.pin + z.work + core;
}

static int span_protected(const struct kvp_ctx *ctx, const rt_gracekv_cfg *c, uint16_t s)
{
	if (s == 0)
		return 0;
	if (c->protect_all_spans)
		return 1;
	if (!ctx->span_names || s > ctx->n_spans || !ctx->span_names[s])
		return 0;
	for (int j = 0; j < c->n_spans; j++)
		if (strcmp(ctx->span_names[s], c->spans[j]) == 0)
			return 1;
	return 0;
}

/* Token-to-token attention for the multi-hop flow: the attention the token at entry src
 * pays to every entry t <= src, softmax of q·k/√d over those entries, averaged over the
 * trace's sampled layers and all their query heads. Arithmetic: logits in double rounded
 * to float, the softmax in double from the largest rounded logit, each probability
 * rounded to float and summed in float (layers, then query heads in order), divided by
 * the number of rows in float. */
struct hop_user {
	const struct kvp_trace *tr;
	const rt_kv *kv;
	float *tmp; /* [n] logits of one query head */
};

static void hop_row(void *user, int32_t src, float *row)
{
	const struct hop_user *u = user;
	const rt_kv *kv = u->kv;
	const struct kvp_trace *tr = u->tr;
	const int G = kv->n_kv_head, R = kv->group, d = kv->head_dim;
	const int32_t n = kv->heads[0].n;
	const double scale = 1.0 / sqrt((double)d);
	for (int32_t t = 0; t < n; t++)
		row[t] = 0.0f;
	int rows = 0;
	for (int s = 0; s < tr->n_sample; s++) {
		const int l = tr->sample_layer[s];
		const float *qrow = tr->q + ((size_t)s * tr->cap + (size_t)src) * (size_t)tr->n_head * d;
		for (int g = 0; g < G; g++) {
			const rt_kv_head *h = &kv->heads[(size_t)l * G + g];
			for (int r = 0; r < R; r++) {
				const float *q = qrow + (size_t)(g * R + r) * d;
				double mx = -INFINITY, sum = 0.0;
				for (int32_t t = 0; t <= src; t++) {
					double x = 0.0;
					for (int i = 0; i < d; i++)
						x += (double)q[i] * h->k[(size_t)t * d + i];
					u->tmp[t] = (float)(x * scale);
					mx = u->tmp[t] > mx ? u->tmp[t] : mx;
				}
				for (int32_t t = 0; t <= src; t++)
					sum += exp((double)u->tmp[t] - mx);
				for (int32_t t = 0; t <= src; t++)
					row[t] += (float)(exp((double)u->tmp[t] - mx) / sum);
				rows++;
			}
		}
	}
	if (rows > 0)
		for (int32_t t = 0; t <= src; t++)
			row[t] /= (float)rows;
}

int rt_gracekv_compress(const struct kvp_ctx *ctx, rt_kv *kv, const rt_gracekv_cfg *cfg,
                        void *scratch, size_t len, rt_gracekv_info *info, rt_err *err)
{
	const char *name = cfg->name ? cfg->name : "gracekv";
	const size_t need = rt_gracekv_scratch_bytes(kv);
	if (!scratch || need == 0 || need == SIZE_MAX || len < need)
		return rt_err_set(err, "policy %s: compress needs %zu bytes of scratch, runtime gave %zu",
		                  name, need, len);
	const int L = kv->n_layer, G = kv->n_kv_head, R = kv->group, d = kv->head_dim;
	const int LG = L * G;
	const rt_kv_head *h0 = &kv->heads[0];
	const int32_t n = h0->n;
	for (int32_t i = 0; i < n; i++)
		if (h0->pos[i] != i)
			return rt_err_set(err, "policy %s: GraceKV compresses the whole prompt once; entry %d holds position %d",
			                  name, (int)i, (int)h0->pos[i]);
	/* prefix: the leading guarded entries; suffix: the trailing protected-span entries */
	int32_t prefix = 0, suffix = 0;
	while (prefix < n && ((cfg->sinks > 0 && h0->pos[prefix] < cfg->sinks) ||
	                      span_protected(ctx, cfg, h0->span[prefix])))
		prefix++;
	while (suffix < n - prefix && span_protected(ctx, cfg, h0->span[n - 1 - suffix]))
		suffix++;
	const int64_t n_ctx = (int64_t)n - prefix - suffix;
	const int64_t recent = cfg->recent > 0 ? (int64_t)floor(cfg->recent) : 0;
	const int64_t r_eff = recent < n_ctx ? recent : n_ctx;
	/* the policy's budget covers every entry; the core's B_total is what the uncharged
	 * prefix and suffix leave of it */
	const double per_head = cfg->budget;
	const int64_t b_all = (int64_t)floor((double)LG * per_head + 1e-9);
	const int64_t b_core = b_all - (int64_t)LG * (prefix + suffix);
	if (!(per_head >= 0.0) || b_core < (int64_t)LG * r_eff)
		return rt_err_set(err, "policy %s: the budget (%.0f entries per head%s) is below the guards (prefix %d + question %d + recent %d)",
		                  name, floor(per_head), ctx->ratio > 0 ? ", from the ratio" : "",
		                  (int)prefix, (int)suffix, (int)r_eff);
	double x = 1.0;
	if (n_ctx > 0 && b_core < (int64_t)LG * n_ctx)
		x = (double)LG * (double)n_ctx / ((double)b_core + 0.5);

	/* carve the scratch */
	if (cfg->pool > 1 && cfg->pool % 2 == 0)
		return rt_err_set(err, "policy %s: the pooling kernel must be odd, not %d", name, (int)cfg->pool);
	struct glue_sizes z = glue_sizes(kv);
	uint8_t *p = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
	float *probe_q = (float *)(void *)p; p += z.probe_q;
	int32_t *probe_pos = (int32_t *)(void *)p; p += z.probe_pos;
	int32_t *seg = (int32_t *)(void *)p; p += z.seg;
	float *bound = (float *)(void *)p; p += z.bound;
	float *row = (float *)(void *)p; p += z.row;
	uint8_t *pin = p; p += z.pin;
	double *work = (double *)(void *)p; p += z.work;
	size_t used = (size_t)(p - (uint8_t *)scratch);
	rt_grace g;
	if (rt_grace_init_at(&g, kv, 0, 1.0f, KVP_TRACE_TAIL, p, len - used, err))
		return -1;

	rt_grace_params gp;
	rt_grace_params_default(&gp);
	gp.x = x;
	gp.recent = (int32_t)r_eff;
	gp.floor = cfg->floor > 0 ? (int64_t)floor(cfg->floor) * LG : 0;
	gp.floor_each = cfg->floor_each;
	gp.head_share = cfg->head_share;
	gp.seg_len = cfg->slot >= 1 ? (int32_t)cfg->slot : 64;
	gp.key_mode = cfg->key_mode;
	gp.count_mode = cfg->count_mode;
	gp.hops = cfg->hops > 1 ? cfg->hops - 1 : 0;
	gp.lambda_graph = cfg->hops > 1 ? gp.lambda_graph : 0.0;

	rt_grace_input in;
	memset(&in, 0, sizeof in);
	in.prefix = prefix;
	in.suffix = suffix;
	in.rel = cfg->rel;
	/* pool the relevance over the tree region (SnapKV's clustering, [D] after the group
	 * reduction): a relevant token keeps its neighbours in the floor and the splits */
	if (cfg->rel && cfg->pool > 1) {
		const int32_t a = prefix, m = (int32_t)(n - suffix - r_eff) - prefix;
		for (int lg = 0; lg < LG && m > 0; lg++) {
			float *r = cfg->rel + (size_t)lg * n + a;
			const int32_t hk = cfg->pool / 2;
			for (int32_t i = 0; i < m; i++) {
				int32_t lo = i - hk < 0 ? 0 : i - hk, hi = i + hk >= m ? m - 1 : i + hk;
				double acc = cfg->pool_max ? (double)r[lo] : 0.0;
				for (int32_t j = lo; j <= hi; j++)
					acc = cfg->pool_max ? (r[j] > acc ? r[j] : acc) : acc + r[j];
				row[i] = (float)(cfg->pool_max ? acc : acc / cfg->pool);
			}
			memcpy(r, row, (size_t)m * sizeof(float));
		}
	}
	/* protected spans inside the context: exact, charged */
	int32_t n_pin = 0;
	for (int32_t i = 0; i < n; i++) {
		pin[i] = i >= prefix && i < n - suffix && span_protected(ctx, cfg, h0->span[i]);
		n_pin += pin[i];
	}
	in.pin = n_pin > 0 ? pin : NULL;
	in.trace = cfg->trace;
	in.trace_user = cfg->trace_user;

	const struct kvp_trace *tr = ctx->trace;
	int used_trace = 0;
	struct hop_user hu = { tr, kv, row };
	if (tr && tr->n >= n && n > 0) {
		if (tr->n_layer != L || tr->head_dim != d || tr->n_head != G * R ||
		    tr->n_embd > G * R * d || tr->n_sample < 1 || tr->n_sample > KVP_TRACE_LAYERS ||
		    tr->cap < n)
			return rt_err_set(err, "policy %s: the prompt trace (%d layers, %d heads of %d, hidden %d) does not match the KV store (%d layers, %d heads of %d)",
			                  name, tr->n_layer, tr->n_head, tr->head_dim, tr->n_embd, L, G * R, d);
		used_trace = 1;
		/* segments over the context [prefix, n - suffix) */
		if (n_ctx > 0 && tr->hid) {
			rt_grace_seg_params sp;
			rt_grace_seg_params_default(&sp);
			sp.target_len = gp.seg_len;
			sp.min_len = gp.seg_len / 4 > 1 ? gp.seg_len / 4 : 1;
			sp.max_len = 2 * gp.seg_len;
			const float *hid[KVP_TRACE_LAYERS];
			for (int s = 0; s < tr->n_sample; s++)
				hid[s] = tr->hid + ((size_t)s * tr->cap + (size_t)prefix) * (size_t)tr->n_embd;
			for (int32_t i = 0; i < n; i++)
				bound[i] = 0.0f;
			int k = rt_grace_segment(&sp, (int32_t)n_ctx, tr->n_embd, tr->n_sample, hid,
			                         tr->surprisal ? tr->surprisal + prefix : NULL, work,
			                         bound + prefix, seg, err);
			if (k < 0)
				return -1;
			for (int i = 0; i < k; i++)
				seg[i] += prefix;
			in.seg_start = seg;
			in.n_seg = k;
			in.boundary = bound;
		}
		/* probes: the question = the last `probe` prompt tokens inside the recorded tail */
		int32_t np = suffix > 0 ? suffix : cfg->probe > 0 ? (int32_t)floor(cfg->probe) : 0;
		if (np > KVP_TRACE_TAIL)
			np = KVP_TRACE_TAIL;
		if (np > n)
			np = n;
		int32_t first = n - np;
		if (tr->q_tail && np > 0 && first >= tr->tail_start &&
		    n <= tr->tail_start + tr->tail_n) {
			const size_t qd = (size_t)tr->n_head * d;
			for (int l = 0; l < L; l++)
				for (int gg = 0; gg < G; gg++)
					for (int32_t u = 0; u < np; u++) {
						const float *src = tr->q_tail + ((size_t)l * KVP_TRACE_TAIL +
						                   (size_t)(first + u - tr->tail_start)) * qd +
						                   (size_t)gg * R * d;
						float *dst = probe_q + ((((size_t)l * G + gg) * np + u) * R) * d;
						memcpy(dst, src, (size_t)R * d * sizeof(float));
					}
			for (int32_t u = 0; u < np; u++)
				probe_pos[u] = first + u;
			in.probe_q = probe_q;
			in.probe_pos = probe_pos;
			in.n_probe = np;
		}
		if (cfg->hops > 1 && tr->q) {
			in.hop_attn = hop_row;
			in.hop_user = &hu;
		}
	}
	rt_grace_stats st;
	if (rt_grace_compress(&g, kv, &gp, &in, &st, err))
		return -1;
	if (info) {
		info->n = n;
		info->prefix = prefix;
		info->suffix = suffix;
		info->x = x;
		info->used_trace = used_trace;
		info->n_seg = in.seg_start ? in.n_seg : 0;
		info->seg_start = in.seg_start;
		info->n_probe = in.n_probe;
		info->st = st;
	}
	return 0;
}
