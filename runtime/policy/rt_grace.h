/*
 * rt_grace: the GraceKV compression core ("Every Cache Entry Earns Its Place: Global
 * Allocation of Resolution and Coverage for KV Cache Compression", Tian, Liu, Wang,
 * arXiv 2608.07001), as a plain C library over the KV store of rt_kv. It models the
 * paper's one-shot post-prefill compression: the context is cut into segments at semantic
 * change; every (layer, KV head, segment) owns a tree of prototypes (leaves are the
 * original tokens, an internal node is one merged entry standing for its subtree with a
 * RoPE-aware mean key, a relevance-weighted value and an effective count whose log is the
 * entry's logit bias); Add (cover a segment with its root, 1 entry) and Split (refine a
 * frontier node, children - 1 entries) actions of ALL heads compete in one max-heap by
 * utility per entry under one global budget B_total = floor(L·G·N_ctx / x), after the
 * recent window and a singleton floor are charged. The frontier becomes the new entry list
 * of each head, written back in place.
 *
 * The paper's text was not available; the formulas follow a secondary source [S] and
 * /work/shared/research/algorithms.md sections 9-10, and where it is silent the choices
 * are ours [D]. docs/gracekv.md lists every choice with its tag.
 *
 * Units: "entries" are slots of one (layer, KV head) list; "tokens" are positions of the
 * text. Shapes use L = n_layer, G = n_kv_head, R = group (query heads per KV head),
 * d = head_dim, n = entries per head at the call (the same in every head).
 * Memory: rt_grace_init allocates all scratch once for a store shape (rt_grace_init_at
 * carves it from the caller's memory instead, as the compiled policy does with its
 * ctx->scratch); rt_grace_compress allocates nothing.
 */
#ifndef RT_GRACE_H
#define RT_GRACE_H

#include <stddef.h>
#include <stdint.h>

#include "kv/rt_kv.h"
#include "base/rt_util.h"

/* ---- RoPE (ggml NORMAL mode, as runtime/model/rt_model.c) --------------------------------
 * The adjacent pair (x[2i], x[2i+1]), i < n_rot/2, is rotated by theta_i = pos ·
 * base^(-2i/n_rot), angles and products in double; dims n_rot..d-1 are not rotated.
 * rt_grace_rope rotates by +pos (what the forward applies), rt_grace_unrope by -pos.
 * x: [d] in place. n_rot even, 0 <= n_rot <= d. */
void rt_grace_rope(float *x, int d, int n_rot, float base, int32_t pos);
void rt_grace_unrope(float *x, int d, int n_rot, float base, int32_t pos);

/* ---- one prototype (section 9.4 [S]) ------------------------------------------------
 * Merge the n >= 1 entries idx[0..n) of the arrays K, V ([· × d], post-RoPE keys and
 * values) at positions P[idx[j]]:
 *   k°_t = RoPE^-1(k_t, t);  p = round(mean t) (half up);  k~ = RoPE(mean k°_t, p);
 *   beta = 0.1 · mean w_t;   v~ = Σ (w_t + beta) v_t / Σ (w_t + beta)   (plain mean when
 *   w is NULL or every w_t is 0);
 *   coherence = ‖mean k°‖ / (mean ‖k°‖ + 1e-12);  m = clamp(n · coherence², 1, n).
 * w: relevance per entry of the same arrays (indexed by idx), or NULL. Outputs k_out[d],
 * v_out[d], *pos_out = p, *count_out = m, *coherence_out (may be NULL). work: [2 × d]
 * doubles. For n == 1 the outputs are the entry itself bit for bit (count 1). */
void rt_grace_prototype(const float *K, const float *V, const int32_t *P, const float *w,
                        const int32_t *idx, int n, int d, int n_rot, float base,
                        float *k_out, float *v_out, int32_t *pos_out, float *count_out,
                        double *coherence_out, double *work);

/* ---- segmentation (section 9.3 [S], DP details [D]) --------------------------------- */
typedef struct rt_grace_seg_params {
	int min_len;        /* shortest segment, tokens (16) */
	int max_len;        /* longest segment, tokens (128) */
	int target_len;     /* preferred length, tokens (64) */
	double lambda_stab; /* κ = mean - lambda_stab · std over (layer, window) (0.5) */
	double lambda_s;    /* weight of the surprisal z-score (1.0) */
	double lambda_len;  /* DP penalty per segment: lambda_len·((len-target)/target)² (4.0) */
	double cut_cost;    /* DP cost of each cut, robust-z units (3.0) */
	int n_win;          /* window sizes used (1..4) */
	int win[4];         /* tokens; default {2, 4, 8} */
} rt_grace_seg_params;

void rt_grace_seg_params_default(rt_grace_seg_params *sp);

/* Doubles of work rt_grace_segment needs for n tokens, n_embd dims, n_hid layers. */
size_t rt_grace_segment_work(int32_t n, int n_embd, int n_hid, int n_win);

/* Cut n tokens into segments at semantic change. hid[l] (l < n_hid) is a layer's
 * normalised hidden states [n × n_embd]; surprisal [n] is -log p(token_i | tokens < i) in
 * nats (NULL: not used). Per token i and (layer, window w):
 *   mu- = mean h[i-w+1..i], mu+ = mean h[i+1..i+w] (clipped to the text),
 *   κ = 1 - cos(h_i - mu-, mu+ - h_i)   (0 when a vector is zero or i = n-1);
 * κ_i = mean κ - lambda_stab · std κ; the strength of a cut between tokens i and i+1 is
 *   b_i = z(κ)_i + lambda_s · z(surprisal)_{i+1},  z = robust z-score (median, 1.4826·MAD).
 * A DP picks the cuts maximising Σ (b - cut_cost) - lambda_len Σ ((len - target)/target)²
 * with every length in [min_len, max_len] (a cut pays only where the boundary stands
 * cut_cost robust sigmas above the median; the length term pulls toward target_len); ties
 * keep the lower cut. n < min_len gives one segment.
 * Outputs: seg_start[0..k) (first token of each segment, seg_start[0] = 0), returns k
 * (>= 1); boundary[0..n) receives b_i (b_{n-1} = 0) unless NULL. work: see above.
 * Errors (-1, err "gracekv segment: ..."): n < 1, bad parameters, n_hid < 1 with a NULL
 * layer, no feasible cutting (only when max_len < 2·min_len - 1). */
int rt_grace_segment(const rt_grace_seg_params *sp, int32_t n, int n_embd, int n_hid,
                     const float *const *hid, const float *surprisal, double *work,
                     float *boundary, int32_t *seg_start, rt_err *err);

/* ---- the global action heap (section 9.6 [S], tie rule [D]) ------------------------- */
typedef struct rt_grace_item {
	double u;           /* utility per entry Δ/c (NaN counts as -inf) */
	int32_t layer, kv_head;
	int32_t pos;        /* first position covered by the action's node */
	int32_t id;         /* caller's payload (action index); last tie-breaker */
} rt_grace_item;

typedef struct rt_grace_heap {
	rt_grace_item *a;   /* [cap] */
	int32_t n, cap;
} rt_grace_heap;

/* 1 when x pops before y: higher u, then lower layer, kv_head, pos, id. */
int rt_grace_item_before(const rt_grace_item *x, const rt_grace_item *y);
/* Push (asserts room) / pop the best (returns 0 when empty, 1 otherwise). */
void rt_grace_heap_push(rt_grace_heap *h, const rt_grace_item *it);
int rt_grace_heap_pop(rt_grace_heap *h, rt_grace_item *out);

/* ---- compression ------------------------------------------------------------------- */

/* Token-to-token attention used by the multi-hop value flow: write into row[0..n) the
 * attention the token of entry src pays to each entry (averaged over the layers and heads
 * the caller samples; only entries before src matter). */
typedef void (*rt_grace_attn_row_fn)(void *user, int32_t src, float *row);

/* Action kinds as reported to a trace callback. */
enum rt_grace_action { RT_GRACE_ADD = 0, RT_GRACE_SPLIT_BINARY, RT_GRACE_SPLIT_SALIENT };

/* Called once per applied action, in order: its kind, the head, the first position its
 * node covers, the member tokens of the node, its cost (entries) and gain Δ. */
typedef void (*rt_grace_trace_fn)(void *user, enum rt_grace_action kind, int layer,
                                  int kv_head, int32_t pos, int32_t members, int cost,
                                  double delta);

/* How a prototype's key is formed (rt_grace_params.key_mode). */
enum rt_grace_key_mode {
	RT_GRACE_KEY_UNROPE = 0, /* [S] un-rotate, average, re-rotate at the rounded mean position */
	RT_GRACE_KEY_POST,       /* [D] mean of the post-RoPE keys (first-order exact for every
	                            query: q·mean k = mean q·k, algorithms.md 10.2) */
};
/* How a prototype's count is formed (rt_grace_params.count_mode). */
enum rt_grace_count_mode {
	RT_GRACE_COUNT_COHERENCE = 0, /* [S] m = clamp(n·ℏ², 1, n) */
	RT_GRACE_COUNT_N,             /* [D] m = n (the exact-case count, algorithms.md 10.1) */
};

typedef struct rt_grace_params {
	double x;            /* compression factor >= 1: B_total = floor(L·G·N_ctx / x) */
	int32_t recent;      /* r: newest context tokens kept exact in every head (charged) */
	int64_t floor;       /* singleton floor: entries over ALL heads (charged first) */
	double lambda_z;     /* distortion weight of the attention mass (1) */
	double lambda_m;     /* distortion weight of the attention numerator (1) */
	double lambda_graph; /* share of the multi-hop relevance (0.3; 0 without hop_attn) */
	int hops;            /* propagation hops (2) */
	int hop_seeds;       /* seeds per hop (8; at most 64 are used) */
	double hop_decay;    /* weight factor per hop (0.5) */
	int32_t seg_len;     /* fixed segment length when no segments are given (64) */
	int key_mode;        /* enum rt_grace_key_mode (RT_GRACE_KEY_UNROPE, the paper's) */
	int count_mode;      /* enum rt_grace_count_mode (RT_GRACE_COUNT_COHERENCE) */
	int floor_each;      /* 0: the singleton floor is the `floor` best tokens over all
	                        heads [S]; 1: each head keeps its own floor / (L·G) best [D] */
	double head_share;   /* coverage floor in [0, 1] [D]: before the global competition
	                        each head spends up to head_share · B_alloc / (L·G) entries on
	                        its own best actions (0: one global competition only, [S]) */
} rt_grace_params;

void rt_grace_params_default(rt_grace_params *p);

/* What the caller knows about the sequence. Entry indices are the same in every head
 * (after prefill every head holds the same n singletons in position order). */
typedef struct rt_grace_input {
	int32_t prefix;      /* entries [0, prefix) kept exact, not charged (system, template) */
	int32_t suffix;      /* entries [n - suffix, n) kept exact, not charged (the question) */
	const int32_t *seg_start; /* [n_seg] first entry of each segment, increasing, the
	                             first == prefix; NULL: fixed seg_len segments */
	int32_t n_seg;
	const float *boundary; /* [n] cut strength after each entry (rt_grace_segment's
	                          boundary, aligned to entries); NULL: binary splits at the
	                          middle */
	const float *probe_q;  /* [L × G × n_probe × R × d] post-RoPE query vectors of the
	                          probe tokens (the question); NULL: the keys of the suffix
	                          (or of the recent window without suffix) stand in [D] */
	const int32_t *probe_pos; /* [n_probe] positions of the probe tokens (causal
	                             visibility); NULL: all entries visible */
	int32_t n_probe;
	const float *rel;      /* [L × G × n] direct relevance per entry (e.g. the question's
	                          attention summed over probes and the group); NULL: computed
	                          from the probes */
	const float *omega;    /* [L × G] head sensitivity ω; NULL: 1 */
	const uint8_t *pin;    /* [n] 1: the entry is kept exactly in every head, charged
	                          before the floor (protected spans inside the context) [D];
	                          NULL: none */
	rt_grace_attn_row_fn hop_attn; /* NULL: no multi-hop propagation */
	void *hop_user;
	rt_grace_trace_fn trace; /* NULL, or called for every action the competition applies */
	void *trace_user;
} rt_grace_input;

typedef struct rt_grace_stats {
	int64_t n_ctx;       /* context tokens N_ctx = n - prefix - suffix */
	int64_t b_total;     /* floor(L·G·N_ctx / x) */
	int64_t b_recent;    /* L·G·r charged to the recent window */
	int64_t b_pin;       /* L·G · pinned context entries outside the recent window */
	int64_t b_floor;     /* singleton floor entries (after clamping) */
	int64_t b_alloc;     /* left for Add/Split */
	int64_t spent;       /* entries the competition used (<= b_alloc) */
	int64_t adds, splits_binary, splits_salient;
	int64_t prototypes;  /* kept entries with count > 1 member */
	int64_t entries;     /* entries in the store after compression (all heads) */
} rt_grace_stats;

typedef struct rt_grace {
	int n_layer, n_kv_head, group, head_dim, n_rot;
	float rope_base;
	int32_t cap;         /* entries per head the scratch covers */
	int32_t max_probe;   /* probe tokens the scratch covers */
	size_t stat_bytes;
	void *mem;           /* one allocation behind all scratch */
	size_t mem_bytes;
	int owns;            /* 1: mem was allocated by rt_grace_init (freed by rt_grace_free) */
	struct rt_grace_scratch *s;
} rt_grace;

/* Size all scratch for stores shaped like kv (its capacity and statistics size), RoPE
 * n_rot / base as the model's (rt_model_hparams), and up to max_probe probe tokens.
 * Fails (-1, err "gracekv: ...") on bad shapes or when the allocation fails. */
int rt_grace_init(rt_grace *g, const rt_kv *kv, int n_rot, float rope_base,
                  int32_t max_probe, rt_err *err);
void rt_grace_free(rt_grace *g);

/* Bytes of scratch rt_grace_init_at needs for stores shaped like kv (cap entries per
 * head, its statistics size), n_rot rotated dims and max_probe probe tokens, alignment
 * slack included: ≈ L·G·C·(4·max_probe·group + 440) bytes. 0 for a bad shape, SIZE_MAX
 * when it overflows. */
size_t rt_grace_bytes(const rt_kv *kv, int n_rot, int32_t max_probe);

/* As rt_grace_init, but in the caller's memory mem[len] (len >= rt_grace_bytes; any
 * alignment): nothing is allocated and rt_grace_free does not free mem. This is how a
 * compiled policy's compress hook runs the core in ctx->scratch. The area need not be
 * zeroed. Errors as rt_grace_init, and len too small. */
int rt_grace_init_at(rt_grace *g, const rt_kv *kv, int n_rot, float rope_base,
                     int32_t max_probe, void *mem, size_t len, rt_err *err);

/* Compress kv once (after prefill). Every head must hold the same n singleton entries
 * (count 1) with strictly increasing positions, n <= g->cap. Keeps the prefix and suffix
 * exact and uncharged; of the context it keeps the recent window, the pinned entries and
 * the singleton floor exact (charged in that order), then runs the Add/Split competition
 * over the segment trees — first each head on its own for its coverage share
 * (head_share), then all heads in one heap — until the budget is spent or every tree is
 * fully expanded, and rewrites every head in position order (ties:
 * the lower first member): exact entries keep k, v, pos, span, statistics and count 1;
 * prototypes get k~, v~, pos = rounded mean position, count m, log_count log m, span 0,
 * zeroed statistics. At x = 1 the store is bit-identical to the input. The charged
 * entries after compression equal b_total whenever the context has at least that many
 * tokens. st may be NULL. Errors (-1, err "gracekv: ...", kv unchanged): shape mismatch,
 * heads of different lengths or positions, merged entries in the input, x < 1,
 * prefix/suffix/segments out of range, n_probe > max_probe, and a recent window plus
 * pinned entries whose L·G·(r + pins) entries exceed b_total. */
int rt_grace_compress(rt_grace *g, rt_kv *kv, const rt_grace_params *p,
                      const rt_grace_input *in, rt_grace_stats *st, rt_err *err);

#endif
