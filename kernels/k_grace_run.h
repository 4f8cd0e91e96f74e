/*
 * k_grace_run: how a compiled policy runs GraceKV's actions (k_segment, k_proto, k_uheap,
 * k_single, k_grace) at the prompt end. The generated compress fills a struct k_grace_cfg
 * from the policy's statements (docs/language.md: `segment = curvature(...)`,
 * `tree = prototypes(...)`, `action = add_split(...)`, `keep singletons N`,
 * `allocate = global(floor = φ)`, the score, pooling and guards) and calls k_grace_run,
 * which builds the tree competition's input from the policy's context:
 *
 *   relevance   the policy's score per entry (per query head, reduced over the group by
 *               the policy's `group`), pooled over the tree region when the policy pools;
 *               without a score the question's attention from the probes;
 *   prefix      the leading entries the policy guards (sinks, protected spans), exact and
 *               uncharged inside the competition;
 *   suffix      the trailing protected-span entries (e.g. a `question` span), likewise;
 *   budget      the policy's budget (entries per head on average, or context / ratio) over
 *               ALL entries, so every policy compared at one ratio holds the same number of
 *               entries: the uncharged prefix and suffix are taken out of it and x is set
 *               so that B_total is what is left;
 *   segments    k_segment over the prompt trace's sampled hidden states and surprisal,
 *               else fixed slots;
 *   probes      the post-RoPE queries of every layer for the question: the protected
 *               suffix span when there is one, else the last `probe` prompt tokens, from
 *               trace->q_tail; without a trace the key stand-ins of k_grace;
 *   hops        token-to-token attention of the sampled layers (trace->q against the
 *               stored keys) for the multi-hop value flow, when hops >= 2.
 *
 * Model and sources: docs/gracekv.md. Memory: everything lives in ctx->scratch
 * (k_grace_scratch_bytes); nothing is allocated.
 */
#ifndef K_GRACE_RUN_H
#define K_GRACE_RUN_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "k_compress.h"
#include "k_grace.h"
#include "k_segment.h"
#include "kv/rt_kv.h"
#include "policy/rt_policy.h"

/* The policy's values, as the generated compress fills them (units in brackets). */
struct k_grace_cfg {
	const char *name;       /* policy name, for messages */
	double budget;          /* [entries per head, average] over all entries of the prompt */
	int graceful;           /* 1 under a floor (k_budget_force): guards and protected spans
	                           over the budget raise it, with a note, instead of failing */
	double sinks;           /* [tokens] positions < sinks join the exact prefix; <= 0: none */
	double recent;          /* [tokens] r: newest context tokens kept exactly (charged) */
	double slot;            /* [tokens] target segment length; the fixed slot length with
	                           `segment = slots(...)` or without a trace */
	int seg_fixed;          /* 1: fixed slots even with a trace (`segment = slots`) */
	struct k_segment_params seg; /* curvature values; min_len / max_len 0: slot / 4 and
	                                2 · slot; target_len is taken from slot */
	int key_mode, count_mode; /* enum k_proto_key / k_proto_count */
	double smooth;          /* prototype value smoothing share (0.1) */
	double lambda_z, lambda_m; /* distortion weights of attention mass / numerator (1, 1) */
	double floor;           /* [entries per head] singleton floor */
	int floor_each;         /* 1: each head picks its own floor (k_single.h) */
	double head_share;      /* coverage floor fraction in [0, 1] (k_grace_params) */
	double probe;           /* [tokens] the question: prompt-tail tokens whose queries probe */
	int hops;               /* value-flow hops; 1 = direct relevance only */
	int32_t pool;           /* [entries] odd kernel of the max/avg pooling of rel over the
	                           tree region (SnapKV's clustering); <= 1: none */
	int pool_max;           /* 1: max pooling, 0: average (zero padding counts) */
	int protect_all_spans;  /* every span id != 0 counts as protected */
	const char *const *spans; /* [n_spans] protected span names */
	int n_spans;
	float *rel;             /* [L × G × n] direct relevance per entry, or NULL; pooled in
	                           place when pool > 1 (set by k_grace_run) */
	const int *view_layer;  /* [kv->n_layer] the store's layer of each layer of kv when kv
	                           is a view of a layer group (k_grace_run), or NULL: kv is the
	                           store; the prompt trace is indexed by the store's layers */
	int view_of;            /* layers of the whole store when view_layer is set */
	k_grace_trace_fn trace; /* NULL, or called for every action the competition applies */
	void *trace_user;
};

/* Defaults: slot 64 (curvature segments of 16..128 tokens), recent 32, floor 16 per head
 * chosen per head, coverage share 0, probe 64, hops 1, post-RoPE key mean, coherence
 * count, smoothing 0.1, distortion weights 1, no spans (see docs/gracekv.md). */
static inline void k_grace_cfg_default(struct k_grace_cfg *c)
{
	memset(c, 0, sizeof *c);
	c->name = "gracekv";
	c->recent = 32;
	c->slot = 64;
	k_segment_params_default(&c->seg);
	c->seg.min_len = 0;
	c->seg.max_len = 0;
	c->key_mode = K_PROTO_KEY_POST;
	c->count_mode = K_PROTO_COUNT_COHERENCE;
	c->smooth = 0.1;
	c->lambda_z = 1.0;
	c->lambda_m = 1.0;
	c->floor = 16;
	c->floor_each = 1;
	c->probe = 64;
	c->hops = 1;
}

/* Sizes of the blocks (bytes) before the competition's area: the score's (k_grace_run)
 * and the trace inputs' (k_grace_apply). */
struct k_grace_sizes {
	size_t rel, qs, tmp, vec, vheads, vlayer;                  /* k_grace_run */
	size_t probe_q, probe_pos, seg, bound, row, pin, work;     /* k_grace_apply */
};

static inline struct k_grace_sizes k_grace_sizes_of(const rt_kv *kv, int n_tmp)
{
	const size_t LG = (size_t)kv->n_layer * kv->n_kv_head, C = (size_t)kv->cap;
	const size_t R = (size_t)kv->group, d = (size_t)kv->head_dim;
	const int n_embd = (int)((size_t)kv->n_kv_head * R * d);
	struct k_grace_sizes z;
	z.rel = k_align64(LG * C * sizeof(float));
	z.qs = k_align64(R * C * sizeof(float));
	z.tmp = k_align64((size_t)(n_tmp > 0 ? n_tmp : 1) * C * sizeof(float));
	z.vec = k_align64(2 * d * sizeof(double));
	z.vheads = k_align64(LG * sizeof(rt_kv_head));
	z.vlayer = k_align64(2 * (size_t)kv->n_layer * sizeof(int));
	z.probe_q = k_align64(LG * KVP_TRACE_TAIL * R * d * sizeof(float));
	z.probe_pos = k_align64(KVP_TRACE_TAIL * sizeof(int32_t));
	z.seg = k_align64((C + 1) * sizeof(int32_t));
	z.bound = k_align64(C * sizeof(float));
	z.row = k_align64(C * sizeof(float));
	z.pin = k_align64(C);
	z.work = k_align64(k_segment_work(kv->cap, n_embd, KVP_TRACE_LAYERS, 4) * sizeof(double));
	return z;
}

/* Scratch bytes of k_grace_apply for stores shaped like kv: probes, segments and the
 * segmentation work, then k_grace_bytes for KVP_TRACE_TAIL probe tokens. The hidden size
 * is taken as n_head·head_dim (as in llama models; checked at compress). 0 for a bad
 * shape, SIZE_MAX on overflow. */
static inline size_t k_grace_apply_bytes(const rt_kv *kv)
{
	size_t core = k_grace_bytes(kv, 0, KVP_TRACE_TAIL);
	if (core == 0 || core == SIZE_MAX)
		return core;
	struct k_grace_sizes z = k_grace_sizes_of(kv, 1);
	return 64 + z.probe_q + z.probe_pos + z.seg + z.bound + z.row + z.pin + z.work + core;
}

/* Scratch bytes of k_grace_run with n_tmp score temporaries: the relevance [L × G × cap],
 * one head's per-query-head scores, the score temporaries, a layer group's view (its head
 * structs and layer numbers), then k_grace_apply_bytes. */
static inline size_t k_grace_scratch_bytes(const rt_kv *kv, int n_tmp)
{
	size_t core = k_grace_apply_bytes(kv);
	if (core == 0 || core == SIZE_MAX)
		return core;
	struct k_grace_sizes z = k_grace_sizes_of(kv, n_tmp);
	return 64 + z.rel + z.qs + z.tmp + z.vec + z.vheads + z.vlayer + core;
}

/* Does the request's span id s name a span the policy protects (k_span_named)? */
static inline int k_grace_span_protected(const struct kvp_ctx *ctx, const struct k_grace_cfg *c,
                                         uint16_t s)
{
	return k_span_named(ctx, c->protect_all_spans, c->spans, c->n_spans, s);
}

/* Token-to-token attention for the multi-hop flow: the attention the token at entry src
 * pays to every entry t <= src, softmax of q·k/√d over those entries, averaged over the
 * trace's sampled layers and all their query heads. Arithmetic: logits in double rounded
 * to float, the softmax in double from the largest rounded logit, each probability
 * rounded to float and summed in float (layers, then query heads in order), divided by
 * the number of rows in float. */
struct k_grace_hop_user {
	const struct kvp_trace *tr;
	const rt_kv *kv;
	float *tmp; /* [n] logits of one query head */
};

static inline void k_grace_hop_row(void *user, int32_t src, float *row)
{
	const struct k_grace_hop_user *u = user;
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

/* Where one run stands: the regions and the competition's x. */
struct k_grace_plan {
	int32_t n, prefix, suffix;
	int32_t pos0;           /* position of entry 0: 0, or where a window layer's list starts */
	int64_t n_ctx, r_eff;
	double x;
};

/* Prefix (leading guarded entries), suffix (trailing protected-span entries) and the
 * competition's x from the policy's budget over every entry. Every head holds the
 * consecutive positions pos0 .. pos0 + n - 1: pos0 is 0, or later on a sliding-window
 * layer whose list holds only its window. Errors: a store that is not the uncompressed
 * prompt (or its window), a budget below the guards. */
static inline int k_grace_plan_of(const struct kvp_ctx *ctx, const rt_kv *kv,
                                  const struct k_grace_cfg *cfg, struct k_grace_plan *pl,
                                  rt_err *err)
{
	const char *name = cfg->name ? cfg->name : "gracekv";
	const int LG = kv->n_layer * kv->n_kv_head;
	const rt_kv_head *h0 = &kv->heads[0];
	const int32_t n = h0->n, pos0 = n > 0 ? h0->pos[0] : 0;
	for (int32_t i = 0; i < n; i++)
		if (h0->pos[i] != pos0 + i)
			return rt_err_set(err, "policy %s: GraceKV compresses the whole prompt once; entry %d holds position %d",
			                  name, (int)i, (int)h0->pos[i]);
	int32_t prefix = 0, suffix = 0;
	while (prefix < n && ((cfg->sinks > 0 && h0->pos[prefix] < cfg->sinks) ||
	                      k_grace_span_protected(ctx, cfg, h0->span[prefix])))
		prefix++;
	while (suffix < n - prefix && k_grace_span_protected(ctx, cfg, h0->span[n - 1 - suffix]))
		suffix++;
	const int64_t n_ctx = (int64_t)n - prefix - suffix;
	const int64_t recent = cfg->recent > 0 ? (int64_t)floor(cfg->recent) : 0;
	const int64_t r_eff = recent < n_ctx ? recent : n_ctx;
	/* the policy's budget covers every entry; B_total is what the uncharged prefix and
	 * suffix leave of it */
	double per_head = cfg->budget;
	if (cfg->graceful && per_head >= 0.0 && per_head < (double)(prefix + suffix + r_eff)) {
		per_head = (double)(prefix + suffix + r_eff); /* graceful: hold the guards */
		if (ctx->notes)
			*ctx->notes |= prefix + suffix > 0 ? KVP_NOTE_SPAN : KVP_NOTE_GUARDS;
	}
	const int64_t b_all = (int64_t)floor((double)LG * per_head + 1e-9);
	const int64_t b_core = b_all - (int64_t)LG * (prefix + suffix);
	if (!(per_head >= 0.0) || b_core < (int64_t)LG * r_eff)
		return rt_err_setc(err, RT_ERR_INPUT, "policy %s: the budget (%.0f entries per head%s) is below the guards (prefix %d + question %d + recent %d)",
		                  name, floor(per_head), ctx->ratio > 0 ? ", from the ratio" : "",
		                  (int)prefix, (int)suffix, (int)r_eff);
	double x = 1.0;
	if (n_ctx > 0 && b_core < (int64_t)LG * n_ctx)
		x = (double)LG * (double)n_ctx / ((double)b_core + 0.5);
	*pl = (struct k_grace_plan){ n, prefix, suffix, pos0, n_ctx, r_eff, x };
	return 0;
}

/* Pool rel over the tree region [prefix, n - suffix - r) of every head with the policy's
 * odd kernel (max, or average with zero padding), SnapKV's clustering after the group
 * reduction [D]: a relevant token keeps its neighbours. row: [n] floats. */
static inline void k_grace_pool(const rt_kv *kv, const struct k_grace_cfg *cfg,
                                const struct k_grace_plan *pl, float *row)
{
	const int LG = kv->n_layer * kv->n_kv_head;
	const int32_t n = pl->n, a = pl->prefix, m = (int32_t)(n - pl->suffix - pl->r_eff) - a;
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

/* The work areas of one k_grace_apply, carved from its scratch. */
struct k_grace_areas {
	float *probe_q, *bound, *row;
	double *work;
	int32_t *probe_pos, *seg;
	uint8_t *pin, *core;
};

/* Segments over the context [prefix, n - suffix) from the trace's hidden states and
 * surprisal (k_segment), into in. */
static inline int k_grace_segments(const struct kvp_trace *tr, const struct k_grace_cfg *cfg,
                                   const struct k_grace_plan *pl, struct k_grace_areas *ar,
                                   struct k_grace_input *in, rt_err *err)
{
	const int32_t seg_len = cfg->slot >= 1 ? (int32_t)cfg->slot : 64;
	struct k_segment_params sp = cfg->seg;
	sp.target_len = seg_len;
	if (sp.min_len <= 0)
		sp.min_len = seg_len / 4 > 1 ? seg_len / 4 : 1;
	if (sp.max_len <= 0)
		sp.max_len = 2 * seg_len;
	const float *hid[KVP_TRACE_LAYERS];
	for (int s = 0; s < tr->n_sample; s++)
		hid[s] = tr->hid + ((size_t)s * tr->cap + (size_t)(pl->pos0 + pl->prefix)) *
		                   (size_t)tr->n_embd;
	for (int32_t i = 0; i < pl->n; i++)
		ar->bound[i] = 0.0f;
	int k = k_segment(&sp, (int32_t)pl->n_ctx, tr->n_embd, tr->n_sample, hid,
	                  tr->surprisal ? tr->surprisal + pl->pos0 + pl->prefix : NULL, ar->work,
	                  ar->bound + pl->prefix, ar->seg, err);
	if (k < 0)
		return -1;
	for (int i = 0; i < k; i++)
		ar->seg[i] += pl->prefix;
	in->seg_start = ar->seg;
	in->n_seg = k;
	in->boundary = ar->bound;
	return 0;
}

/* Probes: the question = the suffix, else the last `probe` prompt tokens inside the
 * recorded tail; their post-RoPE queries packed [L × G × n_probe × R × d] (the trace's
 * rows of the store's layer of each layer of kv: cfg->view_layer). */
static inline void k_grace_probes_of(const struct kvp_trace *tr, const rt_kv *kv,
                                     const struct k_grace_cfg *cfg,
                                     const struct k_grace_plan *pl, struct k_grace_areas *ar,
                                     struct k_grace_input *in)
{
	const int L = kv->n_layer, G = kv->n_kv_head, R = kv->group, d = kv->head_dim;
	const int32_t n = pl->n;
	int32_t np = pl->suffix > 0 ? pl->suffix : cfg->probe > 0 ? (int32_t)floor(cfg->probe) : 0;
	if (np > KVP_TRACE_TAIL)
		np = KVP_TRACE_TAIL;
	if (np > n)
		np = n;
	const int32_t first = pl->pos0 + n - np, end = pl->pos0 + n; /* positions */
	if (!tr->q_tail || np <= 0 || first < tr->tail_start || end > tr->tail_start + tr->tail_n)
		return;
	const size_t qd = (size_t)tr->n_head * d;
	for (int l = 0; l < L; l++)
		for (int gg = 0; gg < G; gg++)
			for (int32_t u = 0; u < np; u++) {
				const int lt = cfg->view_layer ? cfg->view_layer[l] : l;
				const float *src = tr->q_tail + ((size_t)lt * KVP_TRACE_TAIL +
				                   (size_t)(first + u - tr->tail_start)) * qd +
				                   (size_t)gg * R * d;
				float *dst = ar->probe_q + ((((size_t)l * G + gg) * np + u) * R) * d;
				memcpy(dst, src, (size_t)R * d * sizeof(float));
			}
	for (int32_t u = 0; u < np; u++)
		ar->probe_pos[u] = first + u;
	in->probe_q = ar->probe_q;
	in->probe_pos = ar->probe_pos;
	in->n_probe = np;
}

/* Everything the prompt trace gives: segments, probes and the hop callback. Errors: a
 * trace of another shape, and k_segment's. */
static inline int k_grace_from_trace(const struct kvp_ctx *ctx, const rt_kv *kv,
                                     const struct k_grace_cfg *cfg,
                                     const struct k_grace_plan *pl, struct k_grace_areas *ar,
                                     struct k_grace_hop_user *hu, struct k_grace_input *in,
                                     rt_err *err)
{
	const struct kvp_trace *tr = ctx->trace;
	const int L = cfg->view_layer ? cfg->view_of : kv->n_layer;
	const int G = kv->n_kv_head, R = kv->group, d = kv->head_dim;
	const int32_t end = pl->pos0 + pl->n; /* the positions the trace must cover */
	if (!tr || tr->n < end || pl->n <= 0)
		return 0;
	if (tr->n_layer != L || tr->head_dim != d || tr->n_head != G * R ||
	    tr->n_embd > G * R * d || tr->n_sample < 1 || tr->n_sample > KVP_TRACE_LAYERS ||
	    tr->cap < end)
		return rt_err_set(err, "policy %s: the prompt trace (%d layers, %d heads of %d, hidden %d) does not match the KV store (%d layers, %d heads of %d)",
		                  cfg->name ? cfg->name : "gracekv", tr->n_layer, tr->n_head,
		                  tr->head_dim, tr->n_embd, L, G * R, d);
	if (pl->n_ctx > 0 && tr->hid && !cfg->seg_fixed &&
	    k_grace_segments(tr, cfg, pl, ar, in, err))
		return -1;
	k_grace_probes_of(tr, kv, cfg, pl, ar, in);
	if (cfg->hops > 1 && tr->q && cfg->view_layer)
		return rt_err_set(err, "policy %s: value flow over %d hops needs every layer to hold the whole prompt; a sliding-window layer holds only its window",
		                  cfg->name ? cfg->name : "gracekv", cfg->hops);
	if (cfg->hops > 1 && tr->q) {
		*hu = (struct k_grace_hop_user){ tr, kv, ar->row };
		in->hop_attn = k_grace_hop_row;
		in->hop_user = hu;
	}
	return 0;
}

/* The policy's score per entry as the direct relevance rel [Lv × G × n] of the layers
 * layer[0..Lv-1] of kv, whose lists all hold n entries: computed per query head with
 * score_fn (on the store's own heads and layer numbers), reduced over the group by
 * cfg->reduce (no pooling, no guards: the competition treats the guarded prefix, suffix and
 * recent window itself). qs: [R × cap], tmp: [n_tmp × cap] floats; vec: [2 × head_dim]
 * doubles. */
static inline void k_grace_score(const struct kvp_ctx *ctx, rt_kv *kv, const int *layer, int Lv,
                                 const struct k_compress_cfg *cfg, k_score_fn score_fn,
                                 float *rel, float *qs, float *tmp, double *vec)
{
	const int G = kv->n_kv_head, R = kv->group;
	const size_t c = (size_t)kv->cap;
	const int32_t n = rt_kv_head_at(kv, layer[0], 0)->n;
	for (int v = 0; v < Lv; v++)
		for (int g = 0; g < G; g++) {
			const int l = layer[v];
			rt_kv_head *h = rt_kv_head_at(kv, l, g);
			RT_ASSERT(h->n == n);
			float *s = rel + ((size_t)v * G + g) * (size_t)n;
			if (cfg->reduce < 0) {
				score_fn(ctx, kv, h, l, 0, s, tmp, vec);
				continue;
			}
			for (int r = 0; r < R; r++)
				score_fn(ctx, kv, h, l, r, qs + (size_t)r * c, tmp, vec);
			k_reduce(s, qs, R, (int32_t)c, n, cfg->reduce);
		}
}

/* The competition's values from the policy's. */
static inline void k_grace_params_of(const rt_kv *kv, const struct k_grace_cfg *gc,
                                     const struct k_grace_plan *pl, struct k_grace_params *gp)
{
	const int LG = kv->n_layer * kv->n_kv_head;
	k_grace_params_default(gp);
	gp->x = pl->x;
	gp->recent = (int32_t)pl->r_eff;
	gp->floor = gc->floor > 0 ? (int64_t)floor(gc->floor) * LG : 0;
	gp->floor_each = gc->floor_each;
	gp->head_share = gc->head_share;
	gp->seg_len = gc->slot >= 1 ? (int32_t)gc->slot : 64;
	gp->key_mode = gc->key_mode;
	gp->count_mode = gc->count_mode;
	gp->smooth = gc->smooth;
	gp->lambda_z = gc->lambda_z;
	gp->lambda_m = gc->lambda_m;
	gp->hops = gc->hops > 1 ? gc->hops - 1 : 0;
	gp->lambda_graph = gc->hops > 1 ? gp->lambda_graph : 0.0;
}

/* What one k_grace_apply did. */
struct k_grace_info {
	int32_t n;              /* entries per head before */
	int32_t prefix, suffix; /* exact uncharged entries at the start / end */
	double x;               /* the competition's compression factor */
	int used_trace;         /* 1 when segments and probes came from ctx->trace */
	int32_t n_seg;          /* segments (0 without trace: fixed slots) */
	const int32_t *seg_start; /* [n_seg] their first entries, inside the caller's scratch
	                             (valid until it is reused); NULL when n_seg is 0 */
	int32_t n_probe;        /* probe tokens (0: key stand-ins) */
	struct k_grace_stats st;
};

/* Run GraceKV's actions on kv at the prompt end with the values gc (gc->rel: the direct
 * relevance [L × G × n], or NULL for the probes' attention; pooled in place), in the
 * caller's memory mem[len] (len >= k_grace_apply_bytes(kv), any alignment). Preconditions:
 * every head holds entries for positions 0..n-1 in order, unmerged (nothing compressed
 * before). ctx supplies span names and the prompt trace (either may be absent: then fixed
 * slots and key probes). info may be NULL. Errors (-1, err "policy NAME: ..." or
 * "gracekv: ..."): scratch too small, a store that is not the uncompressed prompt, a
 * budget below the guards (prefix + suffix + recent per head), an even pooling kernel, a
 * trace of another shape, and every error of k_segment and k_grace_compress. */
static inline int k_grace_apply(const struct kvp_ctx *ctx, rt_kv *kv, const struct k_grace_cfg *gc,
                                void *mem, size_t len, struct k_grace_info *info, rt_err *err)
{
	const char *name = gc->name ? gc->name : "gracekv";
	const size_t need = k_grace_apply_bytes(kv);
	if (!mem || need == 0 || need == SIZE_MAX || len < need)
		return rt_err_set(err, "policy %s: compress needs %zu bytes of scratch, runtime gave %zu",
		                  name, need, len);
	struct k_grace_plan pl = { 0 };
	if (k_grace_plan_of(ctx, kv, gc, &pl, err))
		return -1;
	if (gc->pool > 1 && gc->pool % 2 == 0)
		return rt_err_set(err, "policy %s: the pooling kernel must be odd, not %d", name, (int)gc->pool);
	struct k_grace_sizes z = k_grace_sizes_of(kv, 1);
	struct k_grace_areas ar;
	uint8_t *p = (uint8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
	ar.probe_q = (float *)(void *)p; p += z.probe_q;
	ar.probe_pos = (int32_t *)(void *)p; p += z.probe_pos;
	ar.seg = (int32_t *)(void *)p; p += z.seg;
	ar.bound = (float *)(void *)p; p += z.bound;
	ar.row = (float *)(void *)p; p += z.row;
	ar.pin = p; p += z.pin;
	ar.work = (double *)(void *)p; p += z.work;
	struct k_grace g;
	if (k_grace_init_at(&g, kv, 0, 1.0f, KVP_TRACE_TAIL, p, len - (size_t)(p - (uint8_t *)mem), err))
		return -1;
	struct k_grace_params gp;
	k_grace_params_of(kv, gc, &pl, &gp);
	struct k_grace_input in;
	memset(&in, 0, sizeof in);
	in.prefix = pl.prefix;
	in.suffix = pl.suffix;
	in.rel = gc->rel;
	if (gc->rel && gc->pool > 1)
		k_grace_pool(kv, gc, &pl, ar.row);
	/* protected spans inside the context: exact, charged */
	int32_t n_pin = 0;
	for (int32_t i = 0; i < pl.n; i++) {
		ar.pin[i] = i >= pl.prefix && i < pl.n - pl.suffix &&
		            k_grace_span_protected(ctx, gc, kv->heads[0].span[i]);
		n_pin += ar.pin[i];
	}
	in.pin = n_pin > 0 ? ar.pin : NULL;
	in.trace = gc->trace;
	in.trace_user = gc->trace_user;
	struct k_grace_hop_user hu;
	if (k_grace_from_trace(ctx, kv, gc, &pl, &ar, &hu, &in, err))
		return -1;
	struct k_grace_stats st;
	if (k_grace_compress(&g, kv, &gp, &in, &st, err))
		return -1;
	if (info) {
		const struct kvp_trace *tr = ctx->trace;
		info->n = pl.n;
		info->prefix = pl.prefix;
		info->suffix = pl.suffix;
		info->x = pl.x;
		info->used_trace = tr && tr->n >= pl.pos0 + pl.n && pl.n > 0;
		info->n_seg = in.seg_start ? in.n_seg : 0;
		info->seg_start = in.seg_start;
		info->n_probe = in.n_probe;
		info->st = st;
	}
	return 0;
}

/* The next layer group of kv after the layers marked in done[L]: the unmarked layers
 * whose lists hold as many entries as the first unmarked layer's, into layer[] (marked);
 * returns their number, 0 when every layer is done. A sliding-window layer holds only its
 * window once the prompt is longer (rt_model's window_trim), so on such a model (Gemma 3)
 * the full-attention layers form one group and the window layers another. Errors (-1): a
 * layer whose KV heads hold different numbers of entries. */
static inline int k_grace_group_next(const rt_kv *kv, int *done, int *layer, const char *name,
                                     rt_err *err)
{
	const int L = kv->n_layer, G = kv->n_kv_head;
	int nv = 0;
	int32_t n = -1;
	for (int l = 0; l < L; l++) {
		if (done[l]) /* compressed: its heads may differ now */
			continue;
		const int32_t nl = kv->heads[(size_t)l * G].n;
		for (int g = 1; g < G; g++)
			if (kv->heads[(size_t)l * G + g].n != nl)
				return rt_err_set(err, "policy %s: layer %d holds %d entries in KV head 0 and %d in KV head %d; GraceKV compresses the prompt of every head of a layer at once",
				                  name, l, (int)nl, (int)kv->heads[(size_t)l * G + g].n, g);
		if (n >= 0 && nl != n)
			continue;
		n = nl;
		done[l] = 1;
		layer[nv++] = l;
	}
	return nv;
}

/* Compress kv with GraceKV's actions at the prompt end, as a generated compress does: the
 * budget check of every policy on gc's values, then per layer group (k_grace_group_next:
 * all layers, or on a model with sliding-window layers the full-attention layers and the
 * window layers apart) the direct relevance from the policy's score when it has one
 * (score_fn != NULL and cfg->has_score; k_grace_score), then k_grace_apply in the rest of
 * ctx->scratch (>= k_grace_scratch_bytes(kv, cfg->n_tmp)). A group that is not the whole
 * store competes on a view of it (its head structs copied into the scratch and back), at
 * the policy's budget per head: a window layer holding fewer entries than the budget keeps
 * them all. Returns 0, or -1 with err set (scratch too small, the budget check, a layer
 * whose heads differ in length, and every error of k_grace_apply; a group compressed
 * before a later group's error stays compressed). */
static inline int k_grace_run(const struct kvp_ctx *ctx, rt_kv *kv,
                              const struct k_compress_cfg *cfg, k_score_fn score_fn,
                              struct k_grace_cfg *gc, rt_err *err)
{
	const char *name = cfg->name ? cfg->name : "?";
	size_t need = k_grace_scratch_bytes(kv, cfg->n_tmp);
	if (!ctx->scratch || need == 0 || need == SIZE_MAX || ctx->scratch_len < need)
		return rt_err_set(err, "policy %s: compress needs %zu bytes of scratch, runtime gave %zu",
		                  name, need, ctx->scratch_len);
	/* the same budget check as every policy, on the run's values */
	struct k_compress_cfg bc = *cfg;
	bc.budget = bc.target = gc->budget;
	bc.has_sinks = gc->sinks > 0;
	bc.sinks = gc->sinks;
	bc.has_recent = gc->recent > 0;
	bc.recent = gc->recent;
	bc.layers = K_LAYERS_UNIFORM;
	double in_force[2] = { gc->budget, gc->budget };
	if (k_budget_force(ctx, kv, &bc, (double)ctx->seen, 0, NULL, in_force, err) < 0)
		return -1;
	gc->budget = in_force[0]; /* the floor, and guards raised under it (graceful) */
	/* in bytes (a --byte-ratio) the budget is f16 entries' worth and the core counts
	 * entries of its f32 rows: half as many (the top tier's rows over an f16 entry) */
	if (k_bytes_mode(ctx, cfg))
		gc->budget /= k_top_worth(kv);
	gc->graceful = k_floor_of(ctx, cfg) > 0;
	const int L = kv->n_layer, G = kv->n_kv_head;
	struct k_grace_sizes z = k_grace_sizes_of(kv, cfg->n_tmp);
	uint8_t *p = (uint8_t *)(((uintptr_t)ctx->scratch + 63) & ~(uintptr_t)63);
	float *rel = (float *)(void *)p; p += z.rel;
	float *qs = (float *)(void *)p; p += z.qs;
	float *tmp = (float *)(void *)p; p += z.tmp;
	double *vec = (double *)(void *)p; p += z.vec;
	rt_kv_head *vheads = (rt_kv_head *)(void *)p; p += z.vheads;
	int *layer = (int *)(void *)p, *done = layer + L; p += z.vlayer;
	const size_t used = (size_t)(p - (uint8_t *)ctx->scratch);
	memset(done, 0, (size_t)L * sizeof *done);
	int nv;
	while ((nv = k_grace_group_next(kv, done, layer, name, err)) > 0) {
		rt_kv view, *vk = kv;
		gc->view_layer = NULL;
		if (nv < L) { /* the group's heads, in its layers' order */
			memcpy(&view, kv, sizeof view);
			view.n_layer = nv;
			view.heads = vheads;
			for (int v = 0; v < nv; v++)
				for (int g = 0; g < G; g++)
					vheads[v * G + g] = *rt_kv_head_at(kv, layer[v], g);
			vk = &view;
			gc->view_layer = layer;
			gc->view_of = L;
		}
		gc->rel = NULL;
		if (score_fn && cfg->has_score) {
			k_grace_score(ctx, kv, layer, nv, cfg, score_fn, rel, qs, tmp, vec);
			gc->rel = rel;
		}
		const int rc = k_grace_apply(ctx, vk, gc, p, ctx->scratch_len - used, NULL, err);
		if (vk != kv)
			for (int v = 0; v < nv; v++)
				for (int g = 0; g < G; g++)
					*rt_kv_head_at(kv, layer[v], g) = vheads[v * G + g];
		gc->view_layer = NULL;
		if (rc)
			return -1;
	}
	return nv < 0 ? -1 : 0;
}

#endif
