/*
 * k_compress: the compress pipeline every generated policy instantiates (docs/runtime_abi.md): score -> [pool] -> group-reduce -> [pool] -> [layer-wide reduce] -> guards
 * -> allocation (per layer schedule; per head, adaptive across a layer's heads, or one
 * global pool) -> selection (k_select, tie rule: equal scores keep the lower position)
 * -> action (evict, or merge evicted entries into a kept neighbour as a prototype with a
 * count) -> [precision: the kept entries' storage tiers, k_tier.h, set before the
 * compaction by rt_kv_head_set_tiers; by utility per byte the tiers and the kept set are
 * chosen together, in the allocation step] -> compaction (rt_kv_head_evict, which moves only tail entries into evicted
 * slots; rt_kv_head_keep, the order-keeping gather, under `positions compacted`, where
 * an entry's index is its RoPE position). `action = add_split`
 * (GraceKV) takes the other road, k_grace_run (k_grace_run.h): the score becomes the
 * direct relevance of the prototype trees' Add/Split competition.
 *
 * The generated code supplies the per-query-head score function (its statistics and
 * expression inlined) and a filled struct k_compress_cfg of constants and parameter
 * values. All work memory is carved out of ctx->scratch (k_compress_scratch_bytes);
 * nothing is allocated.
 */
#ifndef K_COMPRESS_H
#define K_COMPRESS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k_abi.h"
#include "k_alloc.h"
#include "k_score.h"
#include "k_select.h"
#include "k_signal.h"
#include "k_stat.h"
#include "k_tier.h"
#include "base/rt_pool.h"
#include "kv/rt_kv.h"
#include "policy/rt_budget.h"
#include "policy/rt_policy.h"

/* The settings K_LAYERS_*, K_HEADS_*, K_ACT_*, K_POOL_*, K_REDUCE_*, K_TIERS_* are
 * k_abi.h's, shared with the compiler. */
enum { K_FLAG_GUARD = 1, K_FLAG_KEEP = 2, K_FLAG_SINGLE = 4 };
/* Most threads one compress uses (the pool may have more; the rest sit out). */
#define K_MAX_THREADS 64

/* The policy's compress configuration (constants and current parameter values). */
struct k_compress_cfg {
	const char *name;       /* policy name, for messages */
	double budget;          /* the budget (entries per head), for messages */
	int has_score;          /* 0: every entry scores 0 (position rules only) */
	int reduce;             /* K_REDUCE_MEAN/MAX/SUM/L2, or -1: score independent of the
	                           query head (computed once) */
	int over_layer;         /* reduce across the KV heads of a layer too (TOVA) */
	int pool;               /* K_POOL_* */
	int32_t kernel;         /* pooling kernel (odd, entries) */
	int pool_before_reduce;
	int n_tmp;              /* [cap] float temporaries the score function uses */
	int keep_order;         /* compact with the order-keeping gather (`positions compacted`) */
	int reads_rows;         /* the score reads keys or values (KVP_NEED_KEYS/VALUES): on a
	                           store of a narrow element type each head's rows are decoded
	                           to f32 for it (k_head_f32) */
	double target;          /* average entries per head to keep */
	double min_kv;          /* the policy's floor (`budget = B min F`), entries per head;
	                           0: none (k_budget_check) */
	int has_sinks, has_recent; /* the policy has `keep sinks` / `keep recent` */
	double sinks;           /* keep pos < sinks (tokens) */
	double recent;          /* keep pos >= seen - recent (tokens) */
	int budget_shared;      /* the budget is written as a share of the context */
	int guards_follow_context; /* sinks or recent grow with the context (a share of it) */
	int layers;             /* K_LAYERS_* */
	double beta, from, to;
	const double *list;
	int n_list;
	int heads;              /* K_HEADS_* */
	double floor_frac;      /* adaptive/global floor in [0, 1] */
	int action;             /* K_ACT_* */
	double run;             /* max tokens per prototype (<= 0: unlimited) */
	double single_floor;    /* SPLIT: exact singletons kept per head */
	int protect_all_spans;
	const char *const *spans; /* [n_spans] span names to protect */
	int n_spans;
	int budget_bytes;       /* `budget = bytes(P)`: budget and target count bytes (k_bytes_mode) */
	int tiers;              /* K_TIERS_*: the precision action */
	int n_tier;             /* tiers given (1..K_TIER_MAX) */
	const uint8_t *tier;    /* [n_tier] enum rt_kv_tier, highest precision first */
	const double *tier_cum; /* SHARES: [n_tier] cumulative shares of the kept entries */
	int threshold;          /* `budget = threshold(L)`: each head keeps at most the candidates
	                           whose score is >= level (k_threshold_count) */
	double level;           /* the level L */
	double tier_window;     /* `window = W` in tiers(): entries at pos >= seen - W stay at the
	                           top tier (0: none) */
	int tier_edge;          /* `edges = TIER`: the lowest tier of the edge layers */
	int tier_edge_layers;   /* `edge_layers = N`: layers l < N and l >= n_layer - N (0: none) */
};

/* Per-query-head score of every entry of head h into out[h->n]; r is the query head in
 * the group (0 when the score does not depend on it). tmp: [n_tmp × cap] floats,
 * vec: [2 × head_dim] doubles (CAOTE output, KeyDiff anchor). */
typedef void (*k_score_fn)(const struct kvp_ctx *ctx, const rt_kv *kv, const rt_kv_head *h,
                           int layer, int r, float *out, float *tmp, double *vec);

static inline size_t k_align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* 1 when compress reads the budget (budget, target and layer budgets) in bytes, as the
 * bytes of that many f16 entries (rt_kv_f16_entry_bytes each): under a byte ratio
 * (kvp_ctx.byte_ratio), for a byte budget unless an entry ratio (kvp_ctx.ratio) replaces
 * it, and always for tiers chosen by utility per byte (an entry ratio R is then 1/R of the
 * f16 bytes). */
static inline int k_bytes_mode(const struct kvp_ctx *ctx, const struct k_compress_cfg *cfg)
{
	if (cfg->tiers == K_TIERS_UTILITY || ctx->byte_ratio > 0)
		return 1;
	return cfg->budget_bytes && !(ctx->ratio > 0);
}

/* cost[t]: bytes of one entry's key and value rows at tier t (scales included) and, at a
 * quantised tier, its share of a key group's range (runtime/kv/rt_kv.h); an untiered
 * store has only tier 0 (the others cost 0: not storable). rt_kvbytes counts the exact
 * bytes: every range held once, however thin eviction left its group. */
static inline void k_tier_costs(const rt_kv *kv, double *cost)
{
	/* a quantised entry's share of its key group's range: the range over the mean members
	 * a group has now (eviction thins groups; a full group before any) instead of the full
	 * group's share rt_kv_tier_row_bytes counts */
	const double thin = kv->tiered ? (double)kv->kgroup_bytes *
	                                 (1.0 / rt_kv_kgroup_fill(kv) - 1.0 / RT_KV_KGROUP) : 0.0;
	for (int t = 0; t < K_TIER_MAX; t++)
		cost[t] = kv->tiered ? 2.0 * (double)rt_kv_tier_row_bytes(kv, t) + (t > 0 ? thin : 0.0) :
		          t == 0 ? 2.0 * (double)kv->row_bytes : 0.0;
}

/* Scratch bytes the precision action adds to k_compress_scratch_bytes: per entry its tier
 * now, the chosen one and its limit (k_tier_entry_limits), a utility heap item; per head
 * its byte budget, layer and KV head. */
static inline size_t k_tier_scratch_bytes(const rt_kv *kv)
{
	size_t H = (size_t)kv->n_layer * kv->n_kv_head, c = (size_t)kv->cap;
	return 3 * k_align64(H * c) + k_align64(H * c * sizeof(struct k_uheap_item)) +
	       k_align64(H * sizeof(double)) + 2 * k_align64(H * sizeof(int32_t)) + 64;
}

/* Scratch bytes for one head's keys and values decoded to f32 ([2 × cap × head_dim]
 * floats) on a store of a narrow element type or with tiers; 0 for an untiered f32
 * store. */
static inline size_t k_rows_bytes(const rt_kv *kv)
{
	if (kv->type == RT_KV_F32 && !kv->tiered)
		return 0;
	return 2 * k_align64((size_t)kv->cap * (size_t)kv->head_dim * sizeof(float));
}

/* An f32 view of head h: *h itself for an untiered f32 store; otherwise a copy of *h in *view whose
 * k and v point at h's rows decoded into rows[2 × cap × head_dim] (the other arrays are
 * h's own). The generated score code and the merge read keys and values as f32 arrays. */
static inline rt_kv_head *k_head_f32(const rt_kv *kv, rt_kv_head *h, rt_kv_head *view,
                                     float *rows)
{
	if (kv->type == RT_KV_F32 && !kv->tiered)
		return h;
	*view = *h;
	view->k = rows;
	view->v = rows + k_align64((size_t)kv->cap * (size_t)kv->head_dim * sizeof(float)) / sizeof(float);
	rt_kv_head_decode(kv, h, 0, h->n, view->k, view->v);
	return view;
}

/* Bytes of one thread's share of the compress scratch (struct k_thr): the areas one
 * head's scoring and selection use while other threads work on other heads. */
static inline size_t k_thr_bytes(const rt_kv *kv, int n_tmp)
{
	size_t c = (size_t)kv->cap;
	return k_rows_bytes(kv) + k_align64((size_t)kv->group * c * sizeof(float)) +
	       2 * k_align64(c * sizeof(float)) +
	       k_align64((size_t)(n_tmp > 0 ? n_tmp : 1) * c * sizeof(float)) +
	       k_align64((size_t)2 * kv->head_dim * sizeof(double)) + k_align64(c * sizeof(int32_t));
}

/* Scratch bytes for compress on this store's shape with n_tmp score temporaries, run on
 * up to n_threads threads (>= 1; each takes k_thr_bytes of its own). */
static inline size_t k_compress_scratch_bytes(const rt_kv *kv, int n_tmp, int n_threads)
{
	size_t H = (size_t)kv->n_layer * kv->n_kv_head, c = (size_t)kv->cap;
	size_t T = (size_t)(n_threads > 1 ? n_threads : 1);
	return k_align64(H * c * sizeof(float)) + 2 * k_align64(H * c) +
	       2 * k_align64(H * c * sizeof(struct k_cand)) +
	       k_align64((size_t)kv->n_layer * sizeof(double)) +
	       3 * k_align64(H * sizeof(void *)) + 3 * k_align64(H * sizeof(int32_t)) +
	       T * k_thr_bytes(kv, n_tmp) + 64;
}

/* Does the request's span id s name one of the spans spans[0..n_spans) (or any span, when
 * all is set)? Span 0 is no span. */
static inline int k_span_named(const struct kvp_ctx *ctx, int all, const char *const *spans,
                               int n_spans, uint16_t s)
{
	if (s == 0)
		return 0;
	if (all)
		return 1;
	if (!ctx->span_names || s > ctx->n_spans || !ctx->span_names[s])
		return 0;
	for (int j = 0; j < n_spans; j++)
		if (strcmp(ctx->span_names[s], spans[j]) == 0)
			return 1;
	return 0;
}

/* Does the request's span id s name a span the policy protects? */
static inline int k_span_protected(const struct kvp_ctx *ctx, const struct k_compress_cfg *cfg,
                                   uint16_t s)
{
	return k_span_named(ctx, cfg->protect_all_spans, cfg->spans, cfg->n_spans, s);
}

/* Merge entry src into entry dst of head h: count-weighted mean of keys and values,
 * counts add, log_count = log(count); dst keeps its position and statistics. */
static inline void k_merge_entry(const rt_kv *kv, rt_kv_head *h, int32_t dst, int32_t src)
{
	size_t d = (size_t)kv->head_dim;
	double cd = h->count[dst], cs = h->count[src], c = cd + cs;
	float *kd = h->k + dst * d, *vd = h->v + dst * d;
	const float *ks = h->k + src * d, *vs = h->v + src * d;
	for (size_t j = 0; j < d; j++) {
		kd[j] = (float)((cd * kd[j] + cs * ks[j]) / c);
		vd[j] = (float)((cd * vd[j] + cs * vs[j]) / c);
	}
	h->count[dst] = (float)c;
	h->log_count[dst] = (float)log(c);
}

/* head_score() (docs/language.md 7.12): the weight of head h of layer `layer` in w[L × G]
 * (row = layer), the table resampled to the store's shape by nearest index as a layer
 * list is (layer l reads row l·L / n_layer, KV head j column j·G / n_kv_head), so a table
 * calibrated on one model is exact on it. h may be the f32 view k_head_f32 made of the
 * head, which shares its position array, so the head is found by that array. */
static inline double k_head_weight(const rt_kv *kv, int layer, const rt_kv_head *h,
                                   const double *w, int L, int G)
{
	int j = 0;
	for (int g = 0; g < kv->n_kv_head; g++)
		if (kv->heads[(size_t)layer * (size_t)kv->n_kv_head + (size_t)g].pos == h->pos)
			j = g;
	const int64_t l = (int64_t)layer * L / kv->n_layer, c = (int64_t)j * G / kv->n_kv_head;
	return w[l * G + c];
}

/* replay_attn (docs/language.md 7.13): the context replay's score of the entry at original
 * position pos in head h of layer `layer` (ctx->replay, runtime/policy/rt_replay.h); 0 for a
 * position the replay did not score (after the prompt) or when it has not run. h may be the
 * f32 view k_head_f32 made, which shares the position array, so the head is found by it. */
static inline double k_replay_attn(const struct kvp_ctx *ctx, const rt_kv *kv, int layer,
                                   const rt_kv_head *h, int32_t pos)
{
	if (!ctx->replay || pos < 0 || pos >= ctx->replay_n)
		return 0.0;
	int j = 0;
	for (int g = 0; g < kv->n_kv_head; g++)
		if (kv->heads[(size_t)layer * (size_t)kv->n_kv_head + (size_t)g].pos == h->pos)
			j = g;
	const size_t row = (size_t)layer * (size_t)kv->n_kv_head + (size_t)j;
	return (double)ctx->replay[row * (size_t)ctx->replay_n + (size_t)pos];
}

/* linear_score() (docs/language.md 7.14): for entries [first, first + n) of head
 * (layer, kv_head), appended from the layer input rows ctx->layer_in ([n × E], row r =
 * entry first + r), k_linear of the head's row of w [L × G × (E + 1)] into shared
 * statistics word `word`. rt_seq_init refused a model of another shape; without input
 * rows (no forward: rt_shared refuses such policies) the words stay 0. */
static inline void k_linear_init(const struct kvp_ctx *ctx, rt_kv *kv, int layer, int kv_head,
                                 int32_t first, int32_t n, const float *w, int L, int G, int E,
                                 int word)
{
	if (!ctx->layer_in || ctx->n_embd != E || layer >= L || kv_head >= G)
		return;
	const float *row = w + ((size_t)layer * (size_t)G + (size_t)kv_head) * (size_t)(E + 1);
	rt_kv_head *h = rt_kv_head_at(kv, layer, kv_head);
	for (int32_t r = 0; r < n; r++)
		k_stat_setf(k_stat_block(kv, h, first + r) + word,
		            (float)k_linear(row, ctx->layer_in + (size_t)r * (size_t)E, E));
}

/* cos(k_a, k_b) of two entries of h (0 when either key is zero). */
static inline double k_entry_cos(const rt_kv *kv, const rt_kv_head *h, int32_t a, int32_t b)
{
	size_t d = (size_t)kv->head_dim;
	const float *x = h->k + a * d, *y = h->k + b * d;
	double xy = 0, xx = 0, yy = 0;
	for (size_t j = 0; j < d; j++) {
		xy += (double)x[j] * y[j];
		xx += (double)x[j] * x[j];
		yy += (double)y[j] * y[j];
	}
	return xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : 0.0;
}

static inline int k_cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* ord[0..n) = the entries of h in increasing position order (tmp: [n] int64 scratch).
 * Returns 0 when that is index order (ord is then the identity), 1 otherwise: lists
 * compacted by rt_kv_head_evict are not in position order. */
static inline int k_pos_order(const rt_kv_head *h, int32_t *ord, int64_t *tmp)
{
	int sorted = 1;
	for (int32_t i = 0; i < h->n; i++) {
		ord[i] = i;
		sorted &= i == 0 || h->pos[i] > h->pos[i - 1];
	}
	if (sorted)
		return 0;
	for (int32_t i = 0; i < h->n; i++)
		tmp[i] = (int64_t)h->pos[i] << 32 | (uint32_t)i;
	qsort(tmp, (size_t)h->n, sizeof *tmp, k_cmp_i64);
	for (int32_t i = 0; i < h->n; i++)
		ord[i] = (int32_t)(uint32_t)tmp[i];
	return 1;
}

/* Pool s over its first m entries in position order: s[ord[j]] for j < m (ord NULL:
 * index order), through t0, t1 ([m] floats each). */
static inline void k_pool_ordered(float *s, const int32_t *ord, int32_t m, int32_t kernel,
                                  int is_max, float *t0, float *t1)
{
	if (!ord) {
		k_pool(s, t0, m, kernel, is_max);
		memcpy(s, t0, (size_t)m * sizeof(float));
		return;
	}
	for (int32_t j = 0; j < m; j++)
		t0[j] = s[ord[j]];
	k_pool(t0, t1, m, kernel, is_max);
	for (int32_t j = 0; j < m; j++)
		s[ord[j]] = t1[j];
}

/* Fold every evicted entry (flags without K_FLAG_KEEP) into the adjacent kept entry
 * (previous or next kept in position order; not a guarded entry (sinks, recent, spans
 * stay exact) nor a floor singleton; whose count stays
 * <= run when run > 0) with the more similar key; ties and equal similarity go to the
 * previous one. Entries are processed in position order (ord: [n] scratch, tmp: [n] int64
 * scratch, for k_pos_order). On a store of a narrow element type
 * the merges run on the head's rows decoded into rows (k_head_f32) and every entry that
 * took a merge is encoded back (rounded once, from its f32 mean). */
static inline void k_merge_evicted(const rt_kv *kv, rt_kv_head *hs, const uint8_t *flags,
                                   double run, float *rows, int32_t *ord, int64_t *tmp)
{
	rt_kv_head view;
	rt_kv_head *h = k_head_f32(kv, hs, &view, rows);
	int32_t n = h->n, prev = -1;
	k_pos_order(h, ord, tmp);
	for (int32_t oi = 0; oi < n; oi++) {
		const int32_t i = ord[oi];
		if (flags[i] & K_FLAG_KEEP) {
			prev = i;
			continue;
		}
		int32_t next = -1;
		for (int32_t oj = oi + 1; oj < n; oj++)
			if (flags[ord[oj]] & K_FLAG_KEEP) {
				next = ord[oj];
				break;
			}
		int32_t cands[2] = { prev, next };
		int32_t best = -1;
		double best_cos = 0;
		for (int c = 0; c < 2; c++) {
			int32_t t = cands[c];
			if (t < 0 || (flags[t] & (K_FLAG_SINGLE | K_FLAG_GUARD)))
				continue;
			if (run > 0 && (double)h->count[t] + h->count[i] > run)
				continue;
			double cs = k_entry_cos(kv, h, i, t);
			if (best < 0 || cs > best_cos) {
				best = t;
				best_cos = cs;
			}
		}
		if (best >= 0) {
			k_merge_entry(kv, h, best, i);
			if (h != hs) {
				size_t d = (size_t)kv->head_dim;
				rt_kv_set_key(kv, hs, best, h->k + (size_t)best * d);
				rt_kv_set_value(kv, hs, best, h->v + (size_t)best * d);
			}
		}
	}
}

/* Per-layer budgets (entries per head, guards included) for average target T over L
 * layers; n: entries per head before compression (PyramidKV's branches read it). */
static inline void k_layer_budgets(const struct k_compress_cfg *cfg, int L, double T, double n,
                                   double *out)
{
	switch (cfg->layers) {
	case K_LAYERS_PYRAMID:
	case K_LAYERS_FUNNEL:
		k_layers_pyramid(T, cfg->has_recent ? cfg->recent : 0, cfg->beta, floor(n), L,
		                 cfg->layers == K_LAYERS_FUNNEL, out);
		break;
	case K_LAYERS_LINEAR:
		k_layers_linear(T, cfg->from, cfg->to, L, out);
		break;
	case K_LAYERS_LIST:
		k_layers_list(T, cfg->list, cfg->n_list, L, out);
		break;
	default:
		for (int l = 0; l < L; l++)
			out[l] = T;
	}
}

/* `layers = global_only`: a sliding-window layer (ctx->layer_window[l] > 0) keeps every
 * entry it holds (lb[l] = the store's capacity), since the model already keeps only its
 * window there; the full-attention layers keep the budget. */
static inline void k_layers_window_keep(const struct kvp_ctx *ctx, const rt_kv *kv,
                                        const struct k_compress_cfg *cfg, double *lb)
{
	for (int l = 0; lb && cfg->layers == K_LAYERS_GLOBAL_ONLY && ctx->layer_window && l < kv->n_layer; l++)
		if (ctx->layer_window[l] > 0)
			lb[l] = (double)kv->cap;
}

/* The floor of a graceful budget in force, entries per head: the larger of the policy's
 * `min` and the runtime's min_kv; 0: none (strict budgets), also under KVP_MIN_KV_STRICT.
 * Entries at the store's top tier: k_budget_force charges a byte budget their rows. */
static inline double k_floor_of(const struct kvp_ctx *ctx, const struct k_compress_cfg *cfg)
{
	if (ctx->min_kv < 0)
		return 0;
	return ctx->min_kv > cfg->min_kv ? ctx->min_kv : cfg->min_kv;
}

/* The budget and guards in force after `seen` tokens, with n entries per head before
 * compression, checked by rt_budget_check (runtime/policy/rt_budget.h: every layer's
 * budget and the target at least 1 entry, the guards inside the budget; in bytes
 * (k_bytes_mode) the guards count their top-tier rows' bytes, so an f32 store's guards take
 * twice the f16 entries' worth they would in entries). Fills
 * lb[kv->n_layer] (may be NULL under K_LAYERS_UNIFORM) with the per-layer targets
 * compress keeps. A budget that follows a context still growing (a share of the context,
 * or a --ratio, while the prompt length is unknown or passed) fails only early in a
 * stream: then every layer keeps at least 1 entry, and guards of a fixed size stay whole
 * (returns 1); guards that grow with the context too never fit and are an error.
 * Graceful budgets, under a floor F = max(the policy's `min` (cfg->min_kv), the runtime's
 * ctx->min_kv: serve's and run's default), F > 0: the budget and the target are at least
 * min(F, context), whatever the budget or a ratio override, and guards that exceed the
 * budget raise it to hold them instead of failing (sinks that keep nothing still fail);
 * each is recorded in ctx->notes. Without a floor such guards are an error, as kvpc check
 * says; a threshold budget (the whole context) without an override takes guards longer
 * than the context as guarding every entry (returns 1, nothing to evict). in_force (NULL,
 * or [2]) receives the budget and the target in force.
 * Returns 0, 1 (early in a stream), or -1 with err "policy NAME: reason". */
static inline int k_budget_force(const struct kvp_ctx *ctx, const rt_kv *kv,
                                 const struct k_compress_cfg *cfg_in, double seen, double n,
                                 double *lb, double *in_force, rt_err *err)
{
	struct k_compress_cfg fc = *cfg_in; /* the budget and target in force, floored */
	const struct k_compress_cfg *cfg = &fc;
	const double context = k_context(ctx, seen);
	const double floor_kv = k_floor_of(ctx, cfg_in);
	const int graceful = floor_kv > 0;
	if (graceful) {
		/* F entries at the top tier, so at least F entries are kept (more where lower
		 * tiers buy them); in bytes that is F top-tier rows in f16 entries' worth, the
		 * budget's unit: twice F on an f32 store, as the guards below */
		const double top = k_bytes_mode(ctx, cfg_in) ? k_top_worth(kv) : 1.0;
		const double f = (floor_kv < context ? floor_kv : context) * top;
		if (fc.budget < f && ctx->notes)
			*ctx->notes |= KVP_NOTE_FLOOR;
		fc.budget = fc.budget > f ? fc.budget : f;
		fc.target = fc.target > f ? fc.target : f;
	}
	const int L = kv->n_layer;
	if (lb) {
		k_layer_budgets(cfg, L, cfg->budget, n, lb);
		k_layers_window_keep(ctx, kv, cfg, lb);
	}
	struct rt_budget b = {
		.scale = RT_BUDGET_ENTRIES, .budget = cfg->budget,
		.target = cfg->target != cfg->budget ? cfg->target : 0, .n_layer = L,
		.layer = lb && cfg->layers != K_LAYERS_UNIFORM ? lb : NULL,
		.has_sinks = cfg->has_sinks, .has_recent = cfg->has_recent,
		.sinks = cfg->sinks, .recent = cfg->recent, .context = k_context(ctx, seen),
		.ratio = ctx->ratio, .budget_shared = cfg->budget_shared,
		.byte_ratio = ctx->byte_ratio,
	};
	if (k_bytes_mode(ctx, cfg)) { /* the guards' bytes at the top tier against the budget's */
		b.entry_bytes = (double)rt_kv_f16_entry_bytes(kv);
		b.guard_bytes = 2.0 * (double)rt_kv_tier_row_bytes(kv, RT_KV_TIER_TOP);
	}
	char msg[400];
	int relative = cfg->budget_shared || ctx->ratio > 0;
	int growing = relative && cfg->budget > 0 &&
	              !(ctx->prompt_len >= 0 && seen <= (double)ctx->prompt_len);
	struct rt_budget alone = b;
	alone.has_sinks = alone.has_recent = 0;
	int early = 0;
	if (rt_budget_check(&alone, msg, sizeof msg) != 0) {
		if (!growing)
			return rt_err_setc(err, RT_ERR_INPUT, "policy %s: %s", cfg->name ? cfg->name : "?",
			                   msg);
		early = 1; /* below one entry: the context will grow */
	}
	if (!early && rt_budget_check(&b, msg, sizeof msg) != 0) {
		int sinks_bad = cfg->has_sinks && !(cfg->sinks > 0);
		/* a threshold budget is the whole context: guards beyond it (a context shorter than
		 * them) guard every entry, so there is nothing to fit and nothing to refuse; under a
		 * --ratio or --byte-ratio the budget is the override's, and its rules hold */
		if (cfg->threshold && !sinks_bad && !(ctx->ratio > 0) && !(ctx->byte_ratio > 0)) {
			early = 1;
		} else if (sinks_bad || (!graceful && (!growing || cfg->guards_follow_context))) {
			return rt_err_setc(err, RT_ERR_INPUT, "policy %s: %s", cfg->name ? cfg->name : "?",
			                   msg);
		} else if (!graceful) {
			early = 1; /* guards of a fixed size: the budget will grow past them */
		} else { /* graceful: the budget and target grow to hold the guards, in entries
			  * ceil(sinks) + floor(recent), in bytes their top-tier rows' worth */
			double g = (cfg->has_sinks ? ceil(cfg->sinks) : 0) +
			           (cfg->has_recent ? floor(cfg->recent) : 0);
			if (b.entry_bytes > 0)
				g *= k_top_worth(kv); /* = b.guard_bytes / b.entry_bytes */
			fc.budget = fc.budget > g ? fc.budget : g;
			fc.target = fc.target > g ? fc.target : g;
			if (ctx->notes)
				*ctx->notes |= KVP_NOTE_GUARDS;
		}
	}
	if (lb) {
		k_layer_budgets(cfg, L, cfg->target, n, lb);
		k_layers_window_keep(ctx, kv, cfg, lb);
		for (int l = 0; early && l < L; l++)
			lb[l] = lb[l] > 1 ? lb[l] : 1;
	}
	if (in_force) {
		in_force[0] = fc.budget;
		in_force[1] = fc.target;
	}
	return early;
}

/* k_budget_force with the values in force recorded where ctx->in_force points (NULL: not
 * at all; rt_policy_budget_at): what check() and compress run. */
static inline int k_budget_check(const struct kvp_ctx *ctx, const rt_kv *kv,
                                 const struct k_compress_cfg *cfg, double seen, double n,
                                 double *lb, rt_err *err)
{
	return k_budget_force(ctx, kv, cfg, seen, n, lb, ctx->in_force, err);
}

/* One thread's areas (k_thr_bytes), reused head after head. */
struct k_thr {
	float *qs;                   /* [group × cap] scores per query head of a group */
	float *pooled, *pooled2;     /* [cap] pooling scratch (pooled also holds keep bytes) */
	float *tmp;                  /* [n_tmp × cap] the score function's scratch */
	double *vec;                 /* [2 × head_dim] */
	float *rows;                 /* k_rows_bytes: an f32 view of one head's rows */
	int32_t *keep;               /* [cap] kept indices, or a head's position order */
};

/* The scratch areas of one k_compress_run, carved from the runtime's scratch
 * (k_compress_scratch_bytes); per (layer, KV head) hi and entry i the index is hi·cap + i.
 * The per-head arrays are written only by the thread working on that head. */
struct k_run {
	const struct kvp_ctx *ctx;
	rt_kv *kv;
	const struct k_compress_cfg *cfg;
	k_score_fn score_fn;
	double seen;                 /* tokens seen (positions 0..seen-1) */
	int nth;                     /* threads the scratch has room for (thr[0..nth)) */
	struct k_thr thr[K_MAX_THREADS];
	float *score;                /* [H × cap] scores */
	uint8_t *flags, *candm;      /* [H × cap] K_FLAG_* and candidate masks */
	struct k_cand *cbuf, *ctmp;  /* [H × cap] selection scratch (head hi: its cap slice) */
	double *lb;                  /* [n_layer] per-layer budgets (k_budget_check) */
	const float **sp;            /* [H] each head's scores, */
	const int32_t **pp;          /* [H] positions, */
	const uint8_t **cp;          /* [H] candidate masks, */
	int32_t *nn, *base, *alloc;  /* [H] entries, budget after guards, allocation */
	/* the precision action (cfg->tiers, k_tier_scratch_bytes), else NULL: */
	uint8_t *cur, *want;         /* [H × cap] each entry's tier now, and the tier it gets
	                                (by utility: K_TIER_EVICT for an evicted entry) */
	uint8_t *lim;                /* [H × cap] each entry's lowest tier (k_tier_entry_limits);
	                                NULL without a tiers() window or edge layers */
	struct k_uheap_item *heap;   /* [H × cap] the utility heap */
	double *hbytes;              /* [H] bytes for the head's entries outside the guards */
	int32_t *lay, *kvh;          /* [H] layer and KV head of each head (the heap's order) */
	int bytes;                   /* k_bytes_mode */
	double cost[K_TIER_MAX];     /* k_tier_costs */
	double e16;                  /* bytes of one f16 entry (the budget's unit in bytes) */
	int trim;                    /* a tiered store in bytes: selection leaves the compaction
	                                to K_STEP_COMPACT, after the exact trim (K_STEP_TRIM) */
};

/* Carve r's areas from scratch (at least k_compress_scratch_bytes(kv, n_tmp, r->nth), any
 * alignment). */
static inline void k_run_carve(struct k_run *r, void *scratch)
{
	const rt_kv *kv = r->kv;
	const struct k_compress_cfg *cfg = r->cfg;
	const int L = kv->n_layer, G = kv->n_kv_head, R = kv->group;
	const size_t H = (size_t)L * G, c = (size_t)kv->cap;
	uint8_t *p = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
	r->score = (float *)(void *)p; p += k_align64(H * c * sizeof(float));
	r->flags = p; p += k_align64(H * c);
	r->candm = p; p += k_align64(H * c);
	r->cbuf = (struct k_cand *)(void *)p; p += k_align64(H * c * sizeof(struct k_cand));
	r->ctmp = (struct k_cand *)(void *)p; p += k_align64(H * c * sizeof(struct k_cand));
	r->lb = (double *)(void *)p; p += k_align64((size_t)L * sizeof(double));
	r->sp = (const float **)(void *)p; p += k_align64(H * sizeof(void *));
	r->pp = (const int32_t **)(void *)p; p += k_align64(H * sizeof(void *));
	r->cp = (const uint8_t **)(void *)p; p += k_align64(H * sizeof(void *));
	r->nn = (int32_t *)(void *)p; p += k_align64(H * sizeof(int32_t));
	r->base = (int32_t *)(void *)p; p += k_align64(H * sizeof(int32_t));
	r->alloc = (int32_t *)(void *)p; p += k_align64(H * sizeof(int32_t));
	for (int t = 0; t < r->nth; t++) {
		struct k_thr *w = &r->thr[t];
		w->qs = (float *)(void *)p; p += k_align64((size_t)R * c * sizeof(float));
		w->pooled = (float *)(void *)p; p += k_align64(c * sizeof(float));
		w->pooled2 = (float *)(void *)p; p += k_align64(c * sizeof(float));
		w->tmp = (float *)(void *)p; p += k_align64((size_t)(cfg->n_tmp > 0 ? cfg->n_tmp : 1) * c * sizeof(float));
		w->vec = (double *)(void *)p; p += k_align64((size_t)2 * kv->head_dim * sizeof(double));
		w->rows = (float *)(void *)p; p += k_rows_bytes(kv);
		w->keep = (int32_t *)(void *)p; p += k_align64(c * sizeof(int32_t));
	}
	if (cfg->tiers == K_TIERS_NONE)
		return;
	r->cur = p; p += k_align64(H * c);
	r->want = p; p += k_align64(H * c);
	r->lim = cfg->tier_window > 0 || cfg->tier_edge_layers > 0 ? p : NULL;
	p += k_align64(H * c);
	r->heap = (struct k_uheap_item *)(void *)p; p += k_align64(H * c * sizeof(struct k_uheap_item));
	r->hbytes = (double *)(void *)p; p += k_align64(H * sizeof(double));
	r->lay = (int32_t *)(void *)p; p += k_align64(H * sizeof(int32_t));
	r->kvh = (int32_t *)(void *)p;
}

/* In bytes (r->bytes): the bytes of head h's entries outside the guards (flags f), its
 * layer budget lb (f16 entries' worth) less the guards' bytes at their tiers, into
 * r->hbytes[hi] (by utility), and the entries they buy: at the top tier, or at the shares'
 * mix (k_tier_share_cost). */
static inline int32_t k_head_bytes(const struct k_run *r, const rt_kv_head *h, const uint8_t *f,
                                   double lb, size_t hi)
{
	const struct k_compress_cfg *cfg = r->cfg;
	double guard = 0;
	for (int32_t i = 0; i < h->n; i++)
		if (f[i] & K_FLAG_GUARD)
			guard += r->cost[rt_kv_tier_of(h, i)];
	double left = lb * r->e16 - guard;
	if (r->hbytes)
		r->hbytes[hi] = left > 0 ? left : 0;
	double per = cfg->tiers == K_TIERS_SHARES ?
	             k_tier_share_cost(cfg->tier, cfg->tier_cum, cfg->n_tier, r->cost) : r->cost[0];
	return k_bytes_entries(left, per);
}

/* By utility per byte, the (layer, KV head) lists one pool of bytes spans: 1 for
 * `allocate = uniform`, a layer's KV heads for `adaptive`, every list for `global`. */
static inline size_t k_tier_pool_heads(const struct k_run *r)
{
	const int G = r->kv->n_kv_head;
	return r->cfg->heads == K_HEADS_EACH ? 1 :
	       r->cfg->heads == K_HEADS_ADAPTIVE ? (size_t)G : (size_t)r->kv->n_layer * G;
}

/* By utility per byte, pool u (lists u·per .. u·per + per - 1): every entry outside the
 * guards is evicted or given a tier (r->want) by k_tier_alloc within the pool's bytes
 * (Σ r->hbytes). A pool reads and writes only its own lists' slices (the heap's too), so
 * the pools run in parallel; a whole-cache pool is one greedy on one thread. */
static inline void k_run_alloc_tier_pool(const struct k_run *r, size_t u)
{
	const struct k_compress_cfg *cfg = r->cfg;
	const size_t c = (size_t)r->kv->cap, per = k_tier_pool_heads(r), h0 = u * per;
	unsigned allowed = 0;
	for (int j = 0; j < cfg->n_tier; j++)
		allowed |= 1u << cfg->tier[j];
	static const double fid[K_TIER_MAX] = K_TIER_FIDELITY;
	double budget = 0;
	for (size_t k = 0; k < per; k++)
		budget += r->hbytes[h0 + k];
	struct k_tier_pool pool = {
		(int)per, (int32_t)c, r->nn + h0, r->score + h0 * c, r->candm + h0 * c,
		r->cur + h0 * c, r->pp + h0, r->lay + h0, r->kvh + h0, r->lim ? r->lim + h0 * c : NULL,
	};
	k_tier_alloc(&pool, r->cost, fid, allowed, budget, r->want + h0 * c, r->heap + h0 * c);
}

/* The lowest tier each entry of head h (layer l of kv) may take, into lim[h->n]: the top
 * tier for an entry of the tiers() window (pos >= seen - cfg->tier_window), cfg->tier_edge
 * on an edge layer (the first or the last cfg->tier_edge_layers), else K_TIER_MAX (none).
 * docs/language.md section 7.8. */
static inline void k_tier_entry_limits(const struct k_compress_cfg *cfg, const rt_kv *kv, int l,
                                       const rt_kv_head *h, double seen, uint8_t *lim)
{
	const int N = cfg->tier_edge_layers;
	const int edge = N > 0 && (l < N || l >= kv->n_layer - N);
	const uint8_t other = edge ? (uint8_t)cfg->tier_edge : (uint8_t)K_TIER_MAX;
	const double from = cfg->tier_window > 0 ? seen - cfg->tier_window : INFINITY;
	for (int32_t i = 0; i < h->n; i++)
		lim[i] = h->pos[i] >= from ? (uint8_t)RT_KV_TIER_TOP : other;
}

/* 1. Scores, guard flags and candidate mask of head hi (thread w), and what allocation
 * reads of it: its entries, guarded count subtracted from its layer's budget, and
 * pointers to its scores, positions and candidates. */
static inline void k_run_head_scores(const struct k_run *r, const struct k_thr *w, size_t hi)
{
	const struct kvp_ctx *ctx = r->ctx;
	rt_kv *kv = r->kv;
	const struct k_compress_cfg *cfg = r->cfg;
	const int G = kv->n_kv_head, R = kv->group, l = (int)(hi / (size_t)G);
	const size_t c = (size_t)kv->cap;
	const double seen = r->seen;
	rt_kv_head *h = rt_kv_head_at(kv, l, (int)(hi % (size_t)G));
	const int32_t n = h->n;
	float *s = r->score + hi * c;
	uint8_t *f = r->flags + hi * c, *cm = r->candm + hi * c;
	const int spans = cfg->protect_all_spans || cfg->n_spans > 0;
	const double recent_from = cfg->has_recent ? seen - cfg->recent : INFINITY;
	const double sinks = cfg->has_sinks ? cfg->sinks : -INFINITY;
	int32_t n_dom = 0, n_guard = 0; /* entries before the recent window; guarded entries */
	const int guards = cfg->has_recent || cfg->has_sinks || spans;
	if (!guards) { /* every entry a candidate (TOVA) */
		memset(f, 0, (size_t)n);
		memset(cm, 1, (size_t)n);
		n_dom = n;
	}
	for (int32_t i = 0; guards && i < n; i++) {
		const double p = h->pos[i];
		const int in_recent = p >= recent_from;
		const int guard = p < sinks || in_recent ||
		                  (spans && k_span_protected(ctx, cfg, h->span[i]));
		f[i] = guard ? K_FLAG_GUARD : 0;
		cm[i] = !guard;
		n_dom += !in_recent;
		n_guard += guard;
	}
	for (int32_t i = 0; r->cur && i < n; i++)
		r->cur[hi * c + i] = (uint8_t)rt_kv_tier_of(h, i);
	if (r->lim)
		k_tier_entry_limits(cfg, kv, l, h, seen, r->lim + hi * c);
	const int32_t b = r->bytes ? k_head_bytes(r, h, f, r->lb[l], hi) :
	                  k_floor_entries(r->lb[l]) - n_guard;
	r->base[hi] = b > 0 ? b : 0;
	r->nn[hi] = n;
	r->sp[hi] = s;
	r->pp[hi] = h->pos;
	r->cp[hi] = cm;
	if (!cfg->has_score) {
		for (int32_t i = 0; i < n; i++)
			s[i] = 0.0f;
		return;
	}
	/* pooling runs over neighbouring positions: through the position order when an
	 * earlier rt_kv_head_evict left the list out of it */
	const int32_t *ord = NULL;
	if (cfg->pool != K_POOL_NONE && k_pos_order(h, w->keep, (int64_t *)(void *)(r->ctmp + hi * c)))
		ord = w->keep;
	rt_kv_head view;
	const rt_kv_head *hv = cfg->reads_rows ? k_head_f32(kv, h, &view, w->rows) : h;
	if (cfg->reduce < 0) {
		r->score_fn(ctx, kv, hv, l, 0, s, w->tmp, w->vec);
	} else {
		for (int qh = 0; qh < R; qh++) {
			float *q = w->qs + (size_t)qh * c;
			r->score_fn(ctx, kv, hv, l, qh, q, w->tmp, w->vec);
			if (cfg->pool != K_POOL_NONE && cfg->pool_before_reduce)
				k_pool_ordered(q, ord, n_dom, cfg->kernel, cfg->pool == K_POOL_MAX,
				               w->pooled, w->pooled2);
		}
		k_reduce(s, w->qs, R, (int32_t)c, n, cfg->reduce);
	}
	if (cfg->pool != K_POOL_NONE && (!cfg->pool_before_reduce || cfg->reduce < 0))
		k_pool_ordered(s, ord, n_dom, cfg->kernel, cfg->pool == K_POOL_MAX, w->pooled,
		               w->pooled2);
}

/* 2. Layer-wide reduction of layer l: one score per position shared by its KV heads. */
static inline void k_run_layer_reduce(const struct k_run *r, int l)
{
	rt_kv *kv = r->kv;
	const struct k_compress_cfg *cfg = r->cfg;
	const int G = kv->n_kv_head;
	const size_t c = (size_t)kv->cap;
	float *score = r->score;
	const rt_kv_head *h0 = rt_kv_head_at(kv, l, 0);
	float *s0 = score + (size_t)l * G * c;
	for (int g = 1; g < G; g++) {
		const rt_kv_head *hg = rt_kv_head_at(kv, l, g);
		RT_ASSERT(hg->n == h0->n);
		RT_ASSERT(memcmp(hg->pos, h0->pos, (size_t)h0->n * sizeof(int32_t)) == 0);
	}
	/* the group reduction across the layer's heads (stride cap), into head 0's row */
	k_reduce(s0, s0, G, (int32_t)c, h0->n, cfg->reduce < 0 ? K_REDUCE_MEAN : cfg->reduce);
	for (int g = 1; g < G; g++)
		memcpy(score + ((size_t)l * G + g) * c, s0, (size_t)h0->n * sizeof(float));
}

/* `budget = threshold(L)` (KVzap's and DMS's keep-what-passes rule, docs/language.md
 * section 7.11): the candidates (cand[i], the entries outside the guards) of a head of n
 * entries whose score reaches the level, score[i] >= level (NaN never does). The head keeps
 * that many by score, so exactly those: every passing score ranks above every failing one. */
static inline int32_t k_threshold_count(const float *score, const uint8_t *cand, int32_t n,
                                        double level)
{
	int32_t m = 0;
	for (int32_t i = 0; i < n; i++)
		m += cand[i] && (double)score[i] >= level;
	return m;
}

/* 3. Allocation: the per-layer budget minus the guarded entries (base, from step 1),
 * split across heads; by utility per byte only the heap's order here, the pools are the
 * next step (k_run_alloc_tier_pool). */
static inline void k_run_alloc(const struct k_run *r)
{
	rt_kv *kv = r->kv;
	const struct k_compress_cfg *cfg = r->cfg;
	const size_t H = (size_t)kv->n_layer * kv->n_kv_head;
	if (cfg->tiers == K_TIERS_UTILITY) {
		for (size_t hi = 0; hi < H; hi++) { /* the heap's order (k_tier.h) */
			r->lay[hi] = (int32_t)(hi / (size_t)kv->n_kv_head);
			r->kvh[hi] = (int32_t)(hi % (size_t)kv->n_kv_head);
		}
	} else if (cfg->heads == K_HEADS_EACH) {
		for (size_t hi = 0; hi < H; hi++) {
			r->alloc[hi] = r->base[hi];
			if (cfg->threshold) {
				const int32_t m = k_threshold_count(r->sp[hi], r->cp[hi], r->nn[hi], cfg->level);
				r->alloc[hi] = m < r->alloc[hi] ? m : r->alloc[hi];
			}
		}
	} else {
		size_t per = cfg->heads == K_HEADS_ADAPTIVE ? (size_t)kv->n_kv_head : H;
		for (size_t h0 = 0; h0 < H; h0 += per)
			k_alloc_adaptive((int)per, r->sp + h0, r->pp + h0, r->cp + h0, r->nn + h0,
			                 r->base + h0, cfg->floor_frac, r->alloc + h0, r->cbuf, r->ctmp);
	}
}

/* The precision action on head h before its compaction (flags f with K_FLAG_KEEP set):
 * the tiers of the kept entries outside the guards (by score rank for shares; chosen by
 * k_run_alloc_tier_pool by utility), every other entry as it is (guards stay at their tier,
 * the top one for every entry that was never outside them). Returns 0 or -1 (err). */
static inline int k_apply_tiers(const struct k_run *r, rt_kv_head *h, size_t hi,
                                const uint8_t *kp, rt_err *err)
{
	const struct k_compress_cfg *cfg = r->cfg;
	const size_t c = (size_t)r->kv->cap;
	const uint8_t *f = r->flags + hi * c, *cur = r->cur + hi * c;
	uint8_t *want = r->want + hi * c;
	if (cfg->tiers == K_TIERS_SHARES)
		k_tier_shares(r->sp[hi], h->pos, kp, cur, h->n, cfg->tier, cfg->tier_cum, cfg->n_tier,
		              want, r->cbuf + hi * c, r->ctmp + hi * c);
	for (int32_t i = 0; i < h->n; i++)
		if (!(f[i] & K_FLAG_KEEP) || (f[i] & K_FLAG_GUARD) || want[i] == K_TIER_EVICT)
			want[i] = cur[i];
		else if (r->lim && cfg->tiers == K_TIERS_SHARES) /* by utility: chosen within it */
			want[i] = (uint8_t)k_tier_limit_want(want[i], cur[i], r->lim[hi * c + i]);
	return rt_kv_head_set_tiers(r->kv, h, want, err) < 0 ? -1 : 0;
}

/* 4a. The merge actions of head hi, whose flags carry K_FLAG_KEEP: under SPLIT the
 * singleton floor (the best kept entries stay exact), then every evicted entry folded
 * into a kept neighbour (k_merge_evicted). */
static inline void k_run_head_merge(const struct k_run *r, const struct k_thr *w, size_t hi,
                                    rt_kv_head *h)
{
	const struct k_compress_cfg *cfg = r->cfg;
	const size_t c = (size_t)r->kv->cap;
	uint8_t *f = r->flags + hi * c, *cm = r->candm + hi * c;
	uint8_t *kp = (uint8_t *)(void *)w->pooled;
	struct k_cand *cbuf = r->cbuf + hi * c, *ctmp = r->ctmp + hi * c;
	if (cfg->action == K_ACT_SPLIT && cfg->single_floor > 0) {
		memcpy(cm, kp, (size_t)h->n);
		k_select_topk(r->sp[hi], h->pos, cm, h->n, k_floor_entries(cfg->single_floor), kp,
		              cbuf, ctmp);
		for (int32_t i = 0; i < h->n; i++)
			if (kp[i])
				f[i] |= K_FLAG_SINGLE;
	}
	k_merge_evicted(r->kv, h, f, cfg->run, w->rows, w->keep, (int64_t *)(void *)ctmp);
}

/* Compact h to the entries keep[0..nk) (increasing indices): the order-keeping gather
 * under `positions compacted`, else the tail fill (rt_kv_head_evict). */
static inline void k_head_compact(rt_kv *kv, const struct k_compress_cfg *cfg, rt_kv_head *h,
                                  const int32_t *keep, int32_t nk)
{
	if (nk < h->n && cfg->keep_order)
		rt_kv_head_keep(kv, h, keep, nk);
	else if (nk < h->n)
		rt_kv_head_evict(kv, h, keep, nk);
}

/* Exact bytes of head h's entries marked K_FLAG_KEEP in f, as rt_kvbytes_held will count
 * them once h is compacted to them: 2 rows at each entry's tier (kv->tier_row) and every
 * key group with a kept quantised member once (kv->kgroup_bytes). live[g] (g < the head's
 * groups, at most cap) is set to the kept quantised members of group g. */
static inline double k_head_kept_bytes(const rt_kv *kv, const rt_kv_head *h, const uint8_t *f,
                                       int32_t *live)
{
	const rt_kv_arena *tab = &h->arena[RT_KV_KGROUPS];
	RT_ASSERT(tab->n <= kv->cap);
	memset(live, 0, (size_t)tab->n * sizeof *live);
	double b = 0;
	for (int32_t i = 0; i < h->n; i++) {
		if (!(f[i] & K_FLAG_KEEP))
			continue;
		const int t = rt_kv_tier_of(h, i);
		b += 2.0 * (double)kv->tier_row[t];
		if (t != RT_KV_TIER_TOP && live[h->kgrp[i]]++ == 0)
			b += (double)kv->kgroup_bytes;
	}
	return b;
}

/* 4b. (r->trim) The trim of pool u (the lists k_tier_pool_heads groups, as the allocation
 * did): the allocator charges a quantised entry the key-group range over the store's mean
 * members per group (k_tier_costs), a figure from before this compress, whose evictions
 * thin groups and whose downgrades make new ones; so the pool's kept entries can exceed its
 * bytes (Σ of its layers' budgets × an f16 entry's bytes) by a few ranges (0.3% at 8x,
 * 5% at a one-shot prompt-end compress, on SmolLM2-135M). The trim counts the kept bytes
 * exactly (k_head_kept_bytes) and, while they exceed the pool's budget, evicts the kept
 * entry outside the guards of the lowest utility per byte (score × fidelity of its tier /
 * its cost; ties: the higher position goes first), each eviction returning its rows and,
 * with its group's last kept member, the group's range. The guards alone fit the budget
 * (k_budget_check), so the pool then holds at most its bytes (early in a stream, where
 * they need not fit, every candidate goes). Scratch: the pool's slices of heap (group
 * counts), cbuf and ctmp (the candidates). */
static inline void k_run_trim_pool(const struct k_run *r, size_t u)
{
	rt_kv *kv = r->kv;
	const int G = kv->n_kv_head;
	const size_t c = (size_t)kv->cap, per = k_tier_pool_heads(r), h0 = u * per;
	static const double fid[K_TIER_MAX] = K_TIER_FIDELITY;
	int32_t *live = (int32_t *)(void *)(r->heap + h0 * c); /* [per × c] */
	struct k_cand *cb = r->cbuf + h0 * c, *ct = r->ctmp + h0 * c;
	double budget = 0, held = 0;
	int64_t m = 0;
	for (size_t k = 0; k < per; k++) {
		const size_t hi = h0 + k;
		const int l = (int)(hi / (size_t)G);
		const rt_kv_head *h = rt_kv_head_at(kv, l, (int)(hi % (size_t)G));
		const uint8_t *f = r->flags + hi * c, *cm = r->candm + hi * c;
		const float *s = r->score + hi * c;
		budget += r->lb[l] * r->e16;
		held += k_head_kept_bytes(kv, h, f, live + k * c);
		for (int32_t i = 0; i < h->n; i++) {
			if (!(f[i] & K_FLAG_KEEP) || !cm[i] || (f[i] & K_FLAG_GUARD))
				continue;
			const int t = rt_kv_tier_of(h, i);
			const double v = s[i] > 0 ? (double)s[i] : 0.0;
			cb[m++] = (struct k_cand){ (float)((v + 1e-30) * fid[t] / r->cost[t]), h->pos[i], i,
			                           (int32_t)k };
		}
	}
	if (held <= budget)
		return;
	k_cand_sort(cb, m, ct);
	for (int64_t j = m - 1; j >= 0 && held > budget; j--) {
		const size_t k = (size_t)cb[j].head, hi = h0 + k;
		const rt_kv_head *h = rt_kv_head_at(kv, (int)(hi / (size_t)G), (int)(hi % (size_t)G));
		const int32_t i = cb[j].idx;
		const int t = rt_kv_tier_of(h, i);
		r->flags[hi * c + i] &= (uint8_t)~K_FLAG_KEEP;
		held -= 2.0 * (double)kv->tier_row[t];
		if (t != RT_KV_TIER_TOP && --live[k * c + (size_t)h->kgrp[i]] == 0)
			held -= (double)kv->kgroup_bytes;
	}
}

/* 4. Selection, action, precision and compaction of head hi (thread w). Returns 0, or -1
 * with err set when the store refuses the tiers (an untiered store, an exhausted pool). */
static inline int k_run_head_select(const struct k_run *r, const struct k_thr *w, size_t hi,
                                    rt_err *err)
{
	rt_kv *kv = r->kv;
	const struct k_compress_cfg *cfg = r->cfg;
	const int G = kv->n_kv_head;
	const size_t c = (size_t)kv->cap;
	rt_kv_head *h = rt_kv_head_at(kv, (int)(hi / (size_t)G), (int)(hi % (size_t)G));
	uint8_t *f = r->flags + hi * c;
	uint8_t *cm = r->candm + hi * c;
	struct k_cand *cbuf = r->cbuf + hi * c, *ctmp = r->ctmp + hi * c;
	uint8_t *kp = (uint8_t *)(void *)w->pooled; /* [cap] bytes fit in [cap] floats */
	int32_t *keep = w->keep;
	if (cfg->tiers == K_TIERS_UTILITY) {
		const uint8_t *wt = r->want + hi * c;
		for (int32_t i = 0; i < h->n; i++)
			kp[i] = cm[i] && wt[i] != K_TIER_EVICT;
	} else {
		k_select_topk(r->sp[hi], h->pos, cm, h->n, r->alloc[hi], kp, cbuf, ctmp);
	}
	int32_t nk = 0;
	if (cfg->action == K_ACT_EVICT && cfg->tiers == K_TIERS_NONE) {
		/* the kept indices at once: nothing reads the flags */
		for (int32_t i = 0; i < h->n; i++)
			if (kp[i] || (f[i] & K_FLAG_GUARD))
				keep[nk++] = i;
	} else {
		for (int32_t i = 0; i < h->n; i++)
			if (kp[i] || (f[i] & K_FLAG_GUARD))
				f[i] |= K_FLAG_KEEP;
		if (cfg->action != K_ACT_EVICT)
			k_run_head_merge(r, w, hi, h);
		if (cfg->tiers != K_TIERS_NONE && k_apply_tiers(r, h, hi, kp, err) != 0)
			return -1;
		if (r->trim)
			return 0; /* compacted after the pool's trim (K_STEP_TRIM, K_STEP_COMPACT) */
		for (int32_t i = 0; i < h->n; i++)
			if (f[i] & K_FLAG_KEEP)
				keep[nk++] = i;
	}
	k_head_compact(kv, cfg, h, keep, nk);
	return 0;
}

/* 5. (r->trim) The compaction of head hi deferred past the trim: the entries whose flags
 * carry K_FLAG_KEEP stay. */
static inline void k_run_head_compact(const struct k_run *r, const struct k_thr *w, size_t hi)
{
	rt_kv *kv = r->kv;
	const int G = kv->n_kv_head;
	rt_kv_head *h = rt_kv_head_at(kv, (int)(hi / (size_t)G), (int)(hi % (size_t)G));
	const uint8_t *f = r->flags + hi * (size_t)kv->cap;
	int32_t nk = 0;
	for (int32_t i = 0; i < h->n; i++)
		if (f[i] & K_FLAG_KEEP)
			w->keep[nk++] = i;
	k_head_compact(kv, r->cfg, h, w->keep, nk);
}

/* A parallel step of the run: what each unit (a head, a layer, or a pool of bytes) does. */
enum { K_STEP_SCORES = 0, K_STEP_LAYER_REDUCE, K_STEP_ALLOC_TIERS, K_STEP_SELECT, K_STEP_TRIM,
       K_STEP_COMPACT };
struct k_step {
	const struct k_run *r;
	int step;                    /* K_STEP_* */
	long fail[K_MAX_THREADS];    /* K_STEP_SELECT: the unit where thread t stopped on a
	                                refusal of the store (errs[t]), or -1 */
	rt_err errs[K_MAX_THREADS];
};

/* rt_pool job: thread ith of the run's nth takes a contiguous share of the units; every
 * unit's result depends only on the unit, never on the thread that ran it. A thread stops
 * at the first head whose tiers the store refuses. */
static inline void k_step_job(void *arg, int ith, int nth)
{
	struct k_step *j = (struct k_step *)arg;
	const struct k_run *r = j->r;
	const rt_kv *kv = r->kv;
	const int T = nth < r->nth ? nth : r->nth;
	if (ith >= T)
		return;
	const long H = (long)kv->n_layer * kv->n_kv_head;
	const long units = j->step == K_STEP_LAYER_REDUCE ? kv->n_layer :
	                   j->step == K_STEP_ALLOC_TIERS || j->step == K_STEP_TRIM ?
	                   H / (long)k_tier_pool_heads(r) : H;
	long lo, hi;
	rt_pool_range(units, ith, T, &lo, &hi);
	for (long u = lo; u < hi; u++) {
		if (j->step == K_STEP_SCORES)
			k_run_head_scores(r, &r->thr[ith], (size_t)u);
		else if (j->step == K_STEP_LAYER_REDUCE)
			k_run_layer_reduce(r, (int)u);
		else if (j->step == K_STEP_ALLOC_TIERS)
			k_run_alloc_tier_pool(r, (size_t)u);
		else if (j->step == K_STEP_TRIM)
			k_run_trim_pool(r, (size_t)u);
		else if (j->step == K_STEP_COMPACT)
			k_run_head_compact(r, &r->thr[ith], (size_t)u);
		else if (k_run_head_select(r, &r->thr[ith], (size_t)u, &j->errs[ith]) != 0) {
			j->fail[ith] = u;
			return;
		}
	}
}

/* After the scores: a protected span that leaves a head more guarded entries than its
 * layer's budget is kept whole (the head then holds more than its budget), recorded as
 * KVP_NOTE_SPAN in ctx->notes so the report and the response say so. Entries mode only
 * (in bytes the guards are charged by k_head_bytes). */
static inline void k_run_note_spans(const struct k_run *r)
{
	const struct kvp_ctx *ctx = r->ctx;
	const struct k_compress_cfg *cfg = r->cfg;
	if (!ctx->notes || r->bytes || !(cfg->protect_all_spans || cfg->n_spans > 0))
		return;
	const rt_kv *kv = r->kv;
	const int G = kv->n_kv_head;
	const size_t H = (size_t)kv->n_layer * G, c = (size_t)kv->cap;
	for (size_t hi = 0; hi < H; hi++) {
		const rt_kv_head *h = &kv->heads[hi];
		const uint8_t *f = r->flags + hi * c;
		int32_t guarded = 0, spanned = 0;
		for (int32_t i = 0; i < h->n; i++) {
			guarded += (f[i] & K_FLAG_GUARD) != 0;
			spanned += k_span_protected(ctx, cfg, h->span[i]);
		}
		if (spanned > 0 && guarded > k_floor_entries(r->lb[hi / (size_t)G])) {
			*ctx->notes |= KVP_NOTE_SPAN;
			return;
		}
	}
}

/* Run one step on every unit, on ctx->pool's threads (inline when it has one). Returns 0,
 * or -1 with err set to the error of the lowest (layer, KV head) list that failed
 * (K_STEP_SELECT under a precision action: the threads' shares are in list order). */
static inline int k_run_step(const struct k_run *r, int step, rt_err *err)
{
	struct k_step j; /* ~33 KiB of the caller's stack: the threads' error slots */
	j.r = r, j.step = step;
	for (int t = 0; t < K_MAX_THREADS; t++)
		j.fail[t] = -1;
	if (r->nth > 1)
		rt_pool_run(r->ctx->pool, k_step_job, &j);
	else
		k_step_job(&j, 0, 1);
	for (int t = 0; t < r->nth; t++)
		if (j.fail[t] >= 0) {
			*err = j.errs[t];
			return -1;
		}
	return 0;
}

/* Run the pipeline on every head of kv, the per-head steps (scores, the layer-wide
 * reduction, the pools of bytes by utility, selection, precision and compaction) split
 * over the heads on ctx->pool (NULL: the caller's thread) as far as ctx->scratch holds the
 * threads' areas (k_compress_scratch_bytes); the result does not depend on the thread
 * count: each list's (or pool's) operations read only what is its own. When the store
 * refuses a list's tiers (rt_kv_head_set_tiers: an untiered store, an exhausted KV pool)
 * the error is the lowest such list's, and lists on other threads may have been
 * compacted meanwhile (the caller fails the sequence). At an exhausted pool the outcome
 * can depend on the thread count: the lists being re-tiered at once hold their new
 * lower-tier blocks together before each returns its emptied top-tier ones. Returns 0, or
 * -1 with err set when the scratch area is too small, the budget check fails or the store
 * refuses the tiers. */
static inline int k_compress_run(const struct kvp_ctx *ctx, rt_kv *kv,
                                 const struct k_compress_cfg *cfg, k_score_fn score_fn,
                                 rt_err *err)
{
	const size_t tb = cfg->tiers != K_TIERS_NONE ? k_tier_scratch_bytes(kv) : 0;
	size_t need = k_compress_scratch_bytes(kv, cfg->n_tmp, 1) + tb;
	if (!ctx->scratch || ctx->scratch_len < need)
		return rt_err_set(err, "policy: compress needs %zu bytes of scratch, runtime gave %zu",
		                  need, ctx->scratch_len);
	struct k_run r = { .ctx = ctx, .kv = kv, .cfg = cfg, .score_fn = score_fn,
		           .seen = (double)ctx->seen, .nth = 1 };
	const int H = kv->n_layer * kv->n_kv_head;
	int nth = rt_pool_threads(ctx->pool);
	nth = nth < K_MAX_THREADS ? nth : K_MAX_THREADS;
	nth = nth < H ? nth : H;
	while (nth > 1 && k_compress_scratch_bytes(kv, cfg->n_tmp, nth) + tb > ctx->scratch_len)
		nth--;
	r.nth = nth;
	k_run_carve(&r, ctx->scratch);
	r.bytes = k_bytes_mode(ctx, cfg);
	k_tier_costs(kv, r.cost);
	r.e16 = (double)rt_kv_f16_entry_bytes(kv);
	r.trim = r.bytes && kv->tiered && cfg->tiers != K_TIERS_NONE;
	if (k_budget_check(ctx, kv, cfg, r.seen, (double)rt_kv_entries(kv) / H, r.lb, err) < 0)
		return -1;
	(void)k_run_step(&r, K_STEP_SCORES, err);
	k_run_note_spans(&r);
	if (cfg->over_layer && cfg->has_score && kv->n_kv_head > 1)
		(void)k_run_step(&r, K_STEP_LAYER_REDUCE, err);
	k_run_alloc(&r);
	if (cfg->tiers == K_TIERS_UTILITY)
		(void)k_run_step(&r, K_STEP_ALLOC_TIERS, err);
	if (k_run_step(&r, K_STEP_SELECT, err) != 0)
		return -1;
	if (!r.trim)
		return 0;
	(void)k_run_step(&r, K_STEP_TRIM, err);
	return k_run_step(&r, K_STEP_COMPACT, err);
}

#endif
