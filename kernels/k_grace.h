/*
 * k_grace: GraceKV's prototype trees and their Add/Split competition ("Every Cache Entry
 * Earns Its Place: Global Allocation of Resolution and Coverage for KV Cache Compression",
 * Tian, Liu, Wang, arXiv 2608.07001), a policy kernel over the ragged store of rt_kv. It
 * models the paper's one-shot post-prefill compression: the context is cut into segments
 * (k_segment.h, or fixed slots); every (layer, KV head, segment) owns a tree of prototypes
 * (k_proto.h: leaves are the original tokens, an internal node is one merged entry whose
 * log count is its logit bias); Add (cover a segment with its root, 1 entry) and Split
 * (refine a frontier node, children - 1 entries) actions of ALL heads compete in one
 * utility heap (k_uheap.h) by utility per entry under one budget B_total = floor(L·G·N_ctx
 * / x), after the recent window, pinned entries and the singleton floor (k_single.h) are
 * charged. The frontier becomes the new entry list of each head, written back in place.
 *
 * The paper's text was not available; the formulas follow a secondary source [S], and
 * where it is silent the choices are ours [D]; docs/gracekv.md lists every choice with
 * its tag. A compiled policy reaches this kernel through k_grace_run.h.
 *
 * Units: "entries" are slots of one (layer, KV head) list; "tokens" are positions of the
 * text. Shapes use L = n_layer, G = n_kv_head, R = group (query heads per KV head),
 * d = head_dim, n = entries per head at the call (the same in every head).
 * Memory: k_grace_init_at carves all scratch from the caller's memory (a compiled
 * policy's ctx->scratch); k_grace_compress allocates nothing.
 */
#ifndef K_GRACE_H
#define K_GRACE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k_proto.h"
#include "k_single.h"
#include "k_uheap.h"
#include "base/rt_gemm.h"
#include "base/rt_util.h"
#include "kv/rt_kv.h"

/* Token-to-token attention used by the multi-hop value flow: write into row[0..n) the
 * attention the token of entry src pays to each entry (averaged over the layers and heads
 * the caller samples; only entries before src matter). */
typedef void (*k_grace_attn_row_fn)(void *user, int32_t src, float *row);

/* Action kinds as reported to a trace callback. */
enum k_grace_action { K_GRACE_ADD = 0, K_GRACE_SPLIT_BINARY, K_GRACE_SPLIT_SALIENT };

/* Called once per applied action, in order: its kind, the head, the first position its
 * node covers, the member tokens of the node, its cost (entries) and gain Δ. */
typedef void (*k_grace_trace_fn)(void *user, enum k_grace_action kind, int layer,
                                 int kv_head, int32_t pos, int32_t members, int cost,
                                 double delta);

struct k_grace_params {
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
	int key_mode;        /* enum k_proto_key (K_PROTO_KEY_UNROPE, the paper's) */
	int count_mode;      /* enum k_proto_count (K_PROTO_COUNT_COHERENCE) */
	double smooth;       /* value smoothing share beta / mean relevance (0.1) */
	int floor_each;      /* 0: the singleton floor is the `floor` best tokens over all
	                        heads [S]; 1: each head keeps its own floor / (L·G) best [D] */
	double head_share;   /* coverage floor in [0, 1] [D]: before the global competition
	                        each head spends up to head_share · B_alloc / (L·G) entries on
	                        its own best actions (0: one global competition only, [S]) */
};

static inline void k_grace_params_default(struct k_grace_params *p)
{
	memset(p, 0, sizeof *p);
	p->x = 8.0;
	p->recent = 32;
	p->floor = 0;
	p->lambda_z = 1.0;
	p->lambda_m = 1.0;
	p->lambda_graph = 0.3;
	p->hops = 2;
	p->hop_seeds = 8;
	p->hop_decay = 0.5;
	p->seg_len = 64;
	p->smooth = 0.1;
}

/* What the caller knows about the sequence. Entry indices are the same in every head
 * (after prefill every head holds the same n singletons in position order). */
struct k_grace_input {
	int32_t prefix;      /* entries [0, prefix) kept exact, not charged (system, template) */
	int32_t suffix;      /* entries [n - suffix, n) kept exact, not charged (the question) */
	const int32_t *seg_start; /* [n_seg] first entry of each segment, increasing, the
	                             first == prefix; NULL: fixed seg_len segments */
	int32_t n_seg;
	const float *boundary; /* [n] cut strength after each entry (k_segment's boundary,
	                          aligned to entries); NULL: binary splits at the middle */
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
	k_grace_attn_row_fn hop_attn; /* NULL: no multi-hop propagation */
	void *hop_user;
	k_grace_trace_fn trace; /* NULL, or called for every action the competition applies */
	void *trace_user;
};

struct k_grace_stats {
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
};

struct k_grace {
	int n_layer, n_kv_head, group, head_dim, n_rot;
	float rope_base;
	int32_t cap;         /* entries per head the scratch covers */
	int32_t max_probe;   /* probe tokens the scratch covers */
	size_t stat_bytes;
	struct k_grace_scratch *s;
};

/* A tree node: members [a, b) of its head's member list, in the frontier or not. */
typedef struct k_grace_node {
	int32_t a, b, lg, frontier;
	double D, Ddrop, R;
} k_grace_node;

/* An action; a salient split also carries its binary alternative (used when the budget
 * left is one entry). */
typedef struct k_grace_act {
	int32_t node, kind, cost, cut, bcut;
	double delta, dch[3], bdelta, bdch[2];
} k_grace_act;

typedef struct k_grace_ord {
	int32_t pos, anchor, slot;
} k_grace_ord;

struct k_grace_scratch {
	float *R;          /* [LG × C] relevance per entry */
	double *sbar, *dflow, *dnext; /* [C] */
	float *row;        /* [C] */
	uint8_t *sel;      /* [C] */
	int32_t *mem;      /* [LG × C] member entry indices per head */
	int32_t *nmem;     /* [LG] */
	int32_t *segb;     /* [LG × (C + 1)] segment starts in member indices, closed by nmem */
	int32_t *nseg;     /* [LG] */
	uint8_t *isfloor;  /* [LG × C] */
	struct k_single_cand *fc;         /* [LG × C] */
	k_grace_node *nodes;      /* [2 × LG × C] */
	k_grace_act *acts;        /* [3 × LG × C] */
	struct k_uheap_item *heap; /* [3 × LG × C] */
	double *cq, *zall; /* [LG × maxq] max context logit, Σ exp(logit - max) per probe row */
	float *E;          /* [LG × C × maxq] exp(logit - cq) / zall per entry and probe row
	                      (row stride nq of the head; 0 outside the context) */
	float *logit;      /* [maxq × C] one head's probe logits */
	float *Mq;         /* [maxq × d] numerators of one range */
	double *Zq;        /* [maxq] */
	double *cs;        /* [C × n_rot] un-rotation table of the entries' positions */
	int32_t *owner;    /* [LG × C] */
	float *ktmp, *vtmp; /* [d] */
	double *dwork;     /* [3 × d] */
	float *sk, *sv;    /* [C × d] staging of one head */
	int32_t *spos;     /* [C] */
	float *scnt, *slc; /* [C] */
	uint16_t *sspan;   /* [C] */
	uint8_t *sstat;    /* [C × stat_bytes] */
	k_grace_ord *ord;         /* [C] */
	struct k_uheap_item *lheap; /* [3 × C] one head's heap (coverage floor phase) */
	int64_t *hspent;   /* [LG] entries the coverage floor phase gave each head */
	int64_t n_nodes, n_acts;
	/* per call */
	const rt_kv *kv;
	const struct k_grace_params *p;
	const struct k_grace_input *in;
	int32_t n;
};

static inline size_t k_grace_al64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* Sizes of the scratch blocks for a store shape (n_sizes entries, the first being the
 * scratch header); each block is 64-byte aligned in the single area. */
enum { K_GRACE_N_SIZES = 31 };

static inline int k_grace_sizes(const rt_kv *kv, int n_rot, int32_t max_probe, size_t *sizes)
{
	const size_t LG = (size_t)kv->n_layer * kv->n_kv_head, C = (size_t)kv->cap, d = (size_t)kv->head_dim;
	size_t maxq = (size_t)max_probe * kv->group;
	if (maxq < 1)
		maxq = 1;
	const size_t v[] = {
		sizeof(struct k_grace_scratch),
		LG * C * sizeof(float),                        /* R */
		3 * C * sizeof(double), C * sizeof(float), C,  /* sbar.., row, sel */
		LG * C * sizeof(int32_t), LG * sizeof(int32_t), /* mem, nmem */
		LG * (C + 1) * sizeof(int32_t), LG * sizeof(int32_t), /* segb, nseg */
		LG * C, LG * C * sizeof(struct k_single_cand),                /* isfloor, fc */
		2 * LG * C * sizeof(k_grace_node), 3 * LG * C * sizeof(k_grace_act), 3 * LG * C * sizeof(struct k_uheap_item),
		2 * LG * maxq * sizeof(double), LG * maxq * C * sizeof(float), maxq * C * sizeof(float),
		LG * C * sizeof(int32_t),
		maxq * d * sizeof(float), maxq * sizeof(double), C * (size_t)(n_rot > 0 ? n_rot : 1) * sizeof(double),
		2 * d * sizeof(float), 3 * d * sizeof(double),
		2 * C * d * sizeof(float), C * sizeof(int32_t), 2 * C * sizeof(float),
		C * sizeof(uint16_t), C * kv->stat_bytes + 1, C * sizeof(k_grace_ord),
		3 * C * sizeof(struct k_uheap_item), LG * sizeof(int64_t),
	};
	RT_ASSERT(sizeof v / sizeof v[0] == K_GRACE_N_SIZES);
	memcpy(sizes, v, sizeof v);
	return K_GRACE_N_SIZES;
}

static inline int k_grace_check_shape(const rt_kv *kv, int n_rot, float rope_base, int32_t max_probe, rt_err *err)
{
	if (!kv || kv->n_layer <= 0 || kv->n_kv_head <= 0 || kv->group <= 0 || kv->head_dim <= 0 ||
	    kv->cap <= 0)
		return rt_err_set(err, "gracekv: invalid KV store shape");
	if (kv->type != RT_KV_F32 || kv->tiered)
		return rt_err_set(err, "gracekv: the trees read and rewrite f32 key/value rows; the "
		                  "store holds %s%s", rt_kv_type_name(kv->type),
		                  kv->tiered ? " with precision tiers" : "");
	if (n_rot < 0 || n_rot > kv->head_dim || n_rot % 2 || !(rope_base > 0.0f))
		return rt_err_set(err, "gracekv: bad RoPE (n_rot %d of head_dim %d, base %g)", n_rot,
		                  kv->head_dim, (double)rope_base);
	if (max_probe < 0)
		return rt_err_set(err, "gracekv: max_probe %d is negative", (int)max_probe);
	return 0;
}

/* Bytes of scratch k_grace_init_at needs for stores shaped like kv (cap entries per head,
 * its statistics size), n_rot rotated dims and max_probe probe tokens, alignment slack
 * included: ≈ L·G·C·(4·max_probe·group + 440) bytes. 0 for a bad shape, SIZE_MAX when it
 * overflows. */
static inline size_t k_grace_bytes(const rt_kv *kv, int n_rot, int32_t max_probe)
{
	size_t sizes[K_GRACE_N_SIZES];
	if (!kv || kv->n_layer <= 0 || kv->n_kv_head <= 0 || kv->group <= 0 || kv->head_dim <= 0 ||
	    kv->cap <= 0 || max_probe < 0)
		return 0;
	int ns = k_grace_sizes(kv, n_rot, max_probe, sizes);
	size_t total = 64; /* room to align a caller's area */
	for (int i = 0; i < ns; i++) {
		if (sizes[i] > SIZE_MAX / 4 - total)
			return SIZE_MAX;
		total += k_grace_al64(sizes[i]);
	}
	return total;
}

/* Carve the scratch blocks out of mem (64-byte aligned, at least k_grace_bytes). */
static inline void k_grace_carve(struct k_grace *g, const rt_kv *kv, int n_rot, float rope_base, int32_t max_probe,
                  uint8_t *m)
{
	const size_t LG = (size_t)kv->n_layer * kv->n_kv_head, C = (size_t)kv->cap, d = (size_t)kv->head_dim;
	size_t maxq = (size_t)max_probe * kv->group;
	if (maxq < 1)
		maxq = 1;
	size_t sizes[K_GRACE_N_SIZES];
	int ns = k_grace_sizes(kv, n_rot, max_probe, sizes);
	uint8_t *q = m;
	void *ptr[K_GRACE_N_SIZES];
	for (int i = 0; i < ns; i++) {
		ptr[i] = q;
		q += k_grace_al64(sizes[i]);
	}
	struct k_grace_scratch *s = ptr[0];
	memset(s, 0, sizeof *s);
	int k = 1;
	s->R = ptr[k++];
	s->sbar = ptr[k++];
	s->dflow = s->sbar + C;
	s->dnext = s->dflow + C;
	s->row = ptr[k++];
	s->sel = ptr[k++];
	s->mem = ptr[k++];
	s->nmem = ptr[k++];
	s->segb = ptr[k++];
	s->nseg = ptr[k++];
	s->isfloor = ptr[k++];
	s->fc = ptr[k++];
	s->nodes = ptr[k++];
	s->acts = ptr[k++];
	s->heap = ptr[k++];
	s->cq = ptr[k++];
	s->zall = s->cq + LG * maxq;
	s->E = ptr[k++];
	s->logit = ptr[k++];
	s->owner = ptr[k++];
	s->Mq = ptr[k++];
	s->Zq = ptr[k++];
	s->cs = ptr[k++];
	s->ktmp = ptr[k++];
	s->vtmp = s->ktmp + d;
	s->dwork = ptr[k++];
	s->sk = ptr[k++];
	s->sv = s->sk + C * d;
	s->spos = ptr[k++];
	s->scnt = ptr[k++];
	s->slc = s->scnt + C;
	s->sspan = ptr[k++];
	s->sstat = ptr[k++];
	s->ord = ptr[k++];
	s->lheap = ptr[k++];
	s->hspent = ptr[k++];
	RT_ASSERT(k == ns);
	g->n_layer = kv->n_layer;
	g->n_kv_head = kv->n_kv_head;
	g->group = kv->group;
	g->head_dim = kv->head_dim;
	g->n_rot = n_rot;
	g->rope_base = rope_base;
	g->cap = kv->cap;
	g->max_probe = max_probe;
	g->stat_bytes = kv->stat_bytes;
	g->s = s;
}

/* Size and carve all scratch for stores shaped like kv, RoPE n_rot / base as the model's
 * (used by K_PROTO_KEY_UNROPE; n_rot 0 with the post-RoPE key), and up to max_probe probe
 * tokens, in the caller's memory mem[len] (len >= k_grace_bytes; any alignment; need not
 * be zeroed; g does not own it). Errors (-1, err "gracekv: ..."): bad shapes, len too
 * small. */
static inline int k_grace_init_at(struct k_grace *g, const rt_kv *kv, int n_rot, float rope_base,
                     int32_t max_probe, void *mem, size_t len, rt_err *err)
{
	memset(g, 0, sizeof *g);
	if (k_grace_check_shape(kv, n_rot, rope_base, max_probe, err))
		return -1;
	size_t total = k_grace_bytes(kv, n_rot, max_probe);
	if (!mem || total == SIZE_MAX || len < total)
		return rt_err_set(err, "gracekv: scratch of %zu bytes given, %zu needed", len, total);
	uint8_t *m = (uint8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
	k_grace_carve(g, kv, n_rot, rope_base, max_probe, m);
	return 0;
}

/* Probe query rows of head lg: the caller's post-RoPE queries, or the stand-in keys. */
static inline const float *k_grace_probes(const struct k_grace *g, int lg, int32_t *nq, int32_t *first_entry)
{
	const struct k_grace_scratch *s = g->s;
	const struct k_grace_input *in = s->in;
	const size_t d = (size_t)g->head_dim;
	if (in->probe_q) {
		*nq = in->n_probe * g->group;
		*first_entry = -1;
		return in->probe_q + (size_t)lg * (size_t)*nq * d;
	}
	/* stand-ins [D]: the keys of the suffix, else of the recent window */
	int32_t tail = in->suffix > 0 ? in->suffix : s->p->recent;
	int32_t ctx_end = s->n - in->suffix;
	int32_t hi = in->suffix > 0 ? s->n : ctx_end;
	if (tail > g->max_probe)
		tail = g->max_probe;
	if (tail > hi - in->prefix)
		tail = hi - in->prefix;
	if (tail < 0)
		tail = 0;
	*nq = tail;
	*first_entry = hi - tail;
	return s->kv->heads[lg].k + (size_t)(hi - tail) * d;
}

/* M[q] += w[q] · v and Z[q] += w[q] for the nq probe rows, w = E[e, ·] (row stride nq)
 * of one member e with value v[d]. The d-loop is written with 8-float GCC vectors when d is
 * a multiple of 8 and compiled in AVX-512 / AVX2 / baseline clones picked at load. */
typedef float k_grace_v8f __attribute__((vector_size(32)));

__attribute__((target_clones("avx512f", "avx2", "default")))
static inline void k_grace_accum(float *M, double *Z, const float *E, int32_t e, int32_t nq,
                         const float *v, int d)
{
	const float *wr = E + (size_t)e * nq;
	if (d % 8 == 0) {
		for (int32_t qi = 0; qi < nq; qi++) {
			const float w = wr[qi];
			float *Mr = M + (size_t)qi * d;
			Z[qi] += w;
			for (int i = 0; i < d; i += 8) {
				k_grace_v8f a, x;
				memcpy(&a, Mr + i, sizeof a);
				memcpy(&x, v + i, sizeof x);
				a += w * x;
				memcpy(Mr + i, &a, sizeof a);
			}
		}
		return;
	}
	for (int32_t qi = 0; qi < nq; qi++) {
		const float w = wr[qi];
		float *Mr = M + (size_t)qi * d;
		Z[qi] += w;
		for (int i = 0; i < d; i++)
			Mr[i] += w * v[i];
	}
}

/* Distortion D(I) of representing members [a, b) of head lg by one prototype, and
 * D_drop(I) of representing them by nothing (section 9.4 [S]). Per probe row q (weights
 * and sums relative to the row's context mass, so the shift cancels):
 *   Z = Σ e_t, M = Σ e_t v_t, Z~ = m e~, M~ = Z~ v~,
 *   D_q = λ_Z (Z - Z~)²/(Z² + ε) + λ_M ‖M - M~‖²/(‖M‖² + ε),  D = Σ Z D_q / Σ Z. */
static inline void k_grace_eval(struct k_grace *g, int lg, int32_t a, int32_t b, double *D, double *Ddrop)
{
	struct k_grace_scratch *s = g->s;
	const rt_kv_head *h = &s->kv->heads[lg];
	const int d = g->head_dim;
	const int32_t n = b - a, C = g->cap;
	const int32_t *idx = s->mem + (size_t)lg * C + a;
	const float scale = 1.0f / sqrtf((float)d);
	const double eps = 1e-20;
	float m = 1.0f;
	int32_t pp;
	if (n > 1)
		k_proto_merge(h->k, h->v, h->pos, s->R + (size_t)lg * C, idx, n, d, g->n_rot, g->rope_base,
		          g->n_rot > 0 ? s->cs : NULL, s->p->key_mode, s->p->count_mode, s->p->smooth, s->ktmp,
		          s->vtmp, &pp, &m, NULL, s->dwork);
	int32_t nq, fe;
	const float *Q = k_grace_probes(g, lg, &nq, &fe);
	size_t maxq = (size_t)g->max_probe * g->group;
	if (maxq < 1)
		maxq = 1;
	const double *cq = s->cq + (size_t)lg * maxq, *za = s->zall + (size_t)lg * maxq;
	const float *E = s->E + (size_t)lg * maxq * C;
	float *M = s->Mq;
	double *Zs = s->Zq;
	memset(M, 0, (size_t)nq * d * sizeof(float));
	for (int32_t qi = 0; qi < nq; qi++)
		Zs[qi] = 0.0;
	for (int32_t j = 0; j < n; j++)
		k_grace_accum(M, Zs, E, idx[j], nq, h->v + (size_t)idx[j] * d, d);
	double sw = 0.0, sD = 0.0, sDd = 0.0;
	for (int32_t qi = 0; qi < nq; qi++) {
		if (!(za[qi] > 0.0))
			continue;
		const double Z = Zs[qi];
		const float *Mr = M + (size_t)qi * d;
		double mm = 0.0;
		for (int i = 0; i < d; i++)
			mm += (double)Mr[i] * Mr[i];
		double Dq = 0.0;
		if (n > 1) {
			const float *q = Q + (size_t)qi * d;
			double dot = 0.0;
			for (int i = 0; i < d; i++)
				dot += (double)q[i] * s->ktmp[i];
			double Zt = m * exp(dot * scale - cq[qi]) / za[qi];
			double dm = 0.0;
			for (int i = 0; i < d; i++) {
				double t = Mr[i] - Zt * s->vtmp[i];
				dm += t * t;
			}
			Dq = s->p->lambda_z * (Z - Zt) * (Z - Zt) / (Z * Z + eps) +
			     s->p->lambda_m * dm / (mm + eps);
		}
		double Dd = s->p->lambda_z * Z * Z / (Z * Z + eps) + s->p->lambda_m * mm / (mm + eps);
		sw += Z;
		sD += Z * Dq;
		sDd += Z * Dd;
	}
	*D = sw > 0.0 ? sD / sw : 0.0;
	*Ddrop = sw > 0.0 ? sDd / sw : 0.0;
}

static inline double k_grace_range_rel(const struct k_grace *g, int lg, int32_t a, int32_t b)
{
	const struct k_grace_scratch *s = g->s;
	const int32_t *idx = s->mem + (size_t)lg * g->cap;
	const float *R = s->R + (size_t)lg * g->cap;
	double r = 0.0;
	for (int32_t j = a; j < b; j++)
		r += R[idx[j]];
	return r;
}

static inline double k_grace_omega(const struct k_grace *g, int lg)
{
	const struct k_grace_input *in = g->s->in;
	return in->omega ? in->omega[lg] : 1.0;
}

static inline void k_grace_push(struct k_grace *g, struct k_uheap *hp, int32_t id, double u)
{
	struct k_grace_scratch *s = g->s;
	const k_grace_node *nd = &s->nodes[s->acts[id].node];
	struct k_uheap_item it = { u, nd->lg / g->n_kv_head, nd->lg % g->n_kv_head,
	                     s->kv->heads[nd->lg].pos[s->mem[(size_t)nd->lg * g->cap + nd->a]], id };
	k_uheap_push(hp, &it);
}

/* Evaluate the split options of node ni (>= 2 members) and push the better one by
 * utility per entry (ties: binary). */
static inline void k_grace_offer_split(struct k_grace *g, struct k_uheap *hp, int32_t ni)
{
	struct k_grace_scratch *s = g->s;
	const k_grace_node nd = s->nodes[ni];
	const int32_t n = nd.b - nd.a, C = g->cap;
	const int32_t *idx = s->mem + (size_t)nd.lg * C;
	const float *R = s->R + (size_t)nd.lg * C;
	const double w = k_grace_omega(g, nd.lg) * nd.R;
	RT_ASSERT(n >= 2);
	/* binary: cut in the middle half at the strongest boundary (ties: lower) [D] */
	int32_t q4 = n / 4 < 1 ? 1 : n / 4;
	int32_t lo = nd.a + q4, hi = nd.b - q4, cut = nd.a + n / 2;
	if (s->in->boundary) {
		cut = lo;
		for (int32_t c = lo + 1; c <= hi; c++)
			if (s->in->boundary[idx[c - 1]] > s->in->boundary[idx[cut - 1]])
				cut = c;
	}
	double D0 = 0.0, D1 = 0.0, dd;
	if (cut - nd.a > 1)
		k_grace_eval(g, nd.lg, nd.a, cut, &D0, &dd);
	if (nd.b - cut > 1)
		k_grace_eval(g, nd.lg, cut, nd.b, &D1, &dd);
	k_grace_act *ac = &s->acts[s->n_acts];
	memset(ac, 0, sizeof *ac);
	ac->node = ni;
	ac->kind = K_GRACE_SPLIT_BINARY;
	ac->cost = 1;
	ac->cut = cut;
	ac->delta = w * (nd.D - D0 - D1);
	ac->dch[0] = D0;
	ac->dch[1] = D1;
	double ub = ac->delta;
	if (n >= 3) {
		/* salient extraction: the highest-relevance member alone (ties: lower) */
		int32_t sm = nd.a;
		for (int32_t j = nd.a + 1; j < nd.b; j++)
			if (R[idx[j]] > R[idx[sm]])
				sm = j;
		double L = 0.0, Rr = 0.0;
		int nch = 1;
		if (sm - nd.a > 1)
			k_grace_eval(g, nd.lg, nd.a, sm, &L, &dd);
		if (nd.b - sm - 1 > 1)
			k_grace_eval(g, nd.lg, sm + 1, nd.b, &Rr, &dd);
		nch += (sm > nd.a) + (sm + 1 < nd.b);
		double ds = w * (nd.D - L - Rr);
		double us = ds / (nch - 1);
		if (us > ub) {
			ac->bcut = cut;
			ac->bdelta = ac->delta;
			ac->bdch[0] = D0;
			ac->bdch[1] = D1;
			ac->kind = K_GRACE_SPLIT_SALIENT;
			ac->cost = nch - 1;
			ac->cut = sm;
			ac->delta = ds;
			ac->dch[0] = L;
			ac->dch[1] = 0.0;
			ac->dch[2] = Rr;
			ub = us;
		}
	}
	RT_ASSERT(s->n_acts < 3 * (int64_t)g->n_layer * g->n_kv_head * C);
	k_grace_push(g, hp, (int32_t)s->n_acts++, ub);
}

static inline int32_t k_grace_new_node(struct k_grace *g, int lg, int32_t a, int32_t b, double D)
{
	struct k_grace_scratch *s = g->s;
	RT_ASSERT(s->n_nodes < 2 * (int64_t)g->n_layer * g->n_kv_head * g->cap);
	k_grace_node *nd = &s->nodes[s->n_nodes];
	nd->a = a;
	nd->b = b;
	nd->lg = lg;
	nd->frontier = 1;
	nd->D = D;
	nd->Ddrop = 0.0;
	nd->R = k_grace_range_rel(g, lg, a, b);
	return (int32_t)s->n_nodes++;
}

static inline int k_grace_cmp_ord(const void *a, const void *b)
{
	const k_grace_ord *x = a, *y = b;
	if (x->pos != y->pos)
		return x->pos < y->pos ? -1 : 1;
	return (x->anchor > y->anchor) - (x->anchor < y->anchor);
}

/* Direct relevance of head lg into R[0..n) (from in->rel or the probes' softmax over the
 * visible entries, logit + log count), normalised over the context; on the way the
 * distortion weights E and their normalisers cq, zall of every probe row. */
static inline void k_grace_direct(struct k_grace *g, int lg, int32_t ctx_b, int32_t ctx_e)
{
	struct k_grace_scratch *s = g->s;
	const struct k_grace_input *in = s->in;
	const int d = g->head_dim;
	const int32_t n = s->n, C = g->cap;
	const float scale = 1.0f / sqrtf((float)d);
	size_t maxq = (size_t)g->max_probe * g->group;
	if (maxq < 1)
		maxq = 1;
	const rt_kv_head *h = &s->kv->heads[lg];
	float *R = s->R + (size_t)lg * C;
	int32_t nq, fe;
	const float *Q = k_grace_probes(g, lg, &nq, &fe);
	for (int32_t t = 0; t < n; t++)
		R[t] = 0.0f;
	float *Eh = s->E + (size_t)lg * maxq * C;
	if (nq > 0 && n > 0)
		rt_gemm_nt_f32(nq, n, d, scale, Q, d, h->k, d, s->logit, n);
	else
		nq = 0;
	for (int32_t qi = 0; qi < nq; qi++) {
		const float *row = s->logit + (size_t)qi * n;
		/* distortion normaliser over the context */
		double c = -INFINITY, z = 0.0;
		for (int32_t t = ctx_b; t < ctx_e; t++)
			c = row[t] > c ? row[t] : c;
		for (int32_t t = ctx_b; t < ctx_e; t++)
			z += exp(row[t] - c);
		s->cq[(size_t)lg * maxq + qi] = ctx_e > ctx_b ? c : 0.0;
		s->zall[(size_t)lg * maxq + qi] = z;
		/* distortion weights e_t = exp(logit - c) / z, stored [entry × probe row] */
		for (int32_t t = 0; t < n; t++)
			Eh[(size_t)t * nq + qi] = t >= ctx_b && t < ctx_e ? (float)(exp(row[t] - c) / z) : 0.0f;
		if (in->rel)
			continue;
		/* direct relevance: softmax over the visible entries (logit + log count) */
		int32_t ppos = fe >= 0 ? h->pos[fe + qi] :
		               in->probe_pos ? in->probe_pos[qi / g->group] : INT32_MAX;
		int32_t vis = 0;
		while (vis < n && h->pos[vis] <= ppos)
			vis++;
		double mx = -INFINITY, sum = 0.0;
		for (int32_t t = 0; t < vis; t++) {
			double x = (double)row[t] + h->log_count[t];
			mx = x > mx ? x : mx;
		}
		for (int32_t t = 0; t < vis; t++)
			sum += exp((double)row[t] + h->log_count[t] - mx);
		for (int32_t t = 0; t < vis; t++)
			R[t] += (float)(exp((double)row[t] + h->log_count[t] - mx) / sum);
	}
	if (in->rel)
		for (int32_t t = 0; t < n; t++)
			R[t] = in->rel[(size_t)lg * n + t];
	double tot = 0.0;
	for (int32_t t = ctx_b; t < ctx_e; t++)
		tot += R[t] > 0.0f ? R[t] : 0.0f;
	for (int32_t t = 0; t < n; t++) {
		if (t < ctx_b || t >= ctx_e)
			R[t] = 0.0f;
		else if (tot > 0.0)
			R[t] = R[t] > 0.0f ? (float)(R[t] / tot) : 0.0f;
		else
			R[t] = 1.0f / (float)(ctx_e - ctx_b);
	}
}

/* Relevance R [LG × n]: direct (k_grace_direct) mixed with the multi-hop flow (section
 * 9.5 [S], propagation [D]): seeds = top tokens of the head-averaged relevance; each hop
 * spreads the seeds' weight over what they attended to, decayed, excluding selected
 * tokens. */
static inline void k_grace_relevance(struct k_grace *g, int32_t ctx_b, int32_t ctx_e)
{
	struct k_grace_scratch *s = g->s;
	const struct k_grace_input *in = s->in;
	const struct k_grace_params *p = s->p;
	const int LG = g->n_layer * g->n_kv_head;
	const int32_t n = s->n, C = g->cap;
	for (int lg = 0; lg < LG; lg++)
		k_grace_direct(g, lg, ctx_b, ctx_e);
	if (!in->hop_attn || !(p->lambda_graph > 0.0) || p->hops < 1 || p->hop_seeds < 1 ||
	    ctx_e <= ctx_b)
		return;
	/* multi-hop: seeds = top tokens of the head-averaged relevance; each hop spreads the
	 * seeds' weight over what they attended to, decayed, excluding selected tokens */
	double *sb = s->sbar, *df = s->dflow, *dn = s->dnext;
	for (int32_t t = 0; t < n; t++) {
		double a = 0.0;
		for (int lg = 0; lg < LG; lg++)
			a += s->R[(size_t)lg * C + t];
		sb[t] = a / LG;
		df[t] = 0.0;
		s->sel[t] = 0;
	}
	int32_t seeds[64];
	double sw[64];
	int K = p->hop_seeds > 64 ? 64 : p->hop_seeds, ns = 0;
	const double *src = sb;
	double decay = 1.0;
	for (int hop = 0; hop <= p->hops; hop++) {
		/* pick the seeds of this hop from src (ties: lower entry) */
		ns = 0;
		for (int k = 0; k < K; k++) {
			int32_t best = -1;
			for (int32_t t = ctx_b; t < ctx_e; t++)
				if (!s->sel[t] && src[t] > 0.0 && (best < 0 || src[t] > src[best]))
					best = t;
			if (best < 0)
				break;
			s->sel[best] = 1;
			seeds[ns] = best;
			sw[ns++] = src[best];
		}
		if (hop == p->hops || ns == 0)
			break;
		decay *= p->hop_decay;
		for (int32_t t = 0; t < n; t++)
			dn[t] = 0.0;
		for (int k = 0; k < ns; k++) {
			in->hop_attn(in->hop_user, seeds[k], s->row);
			for (int32_t t = ctx_b; t < ctx_e && t < seeds[k]; t++)
				if (!s->sel[t] && s->row[t] > 0.0f)
					dn[t] += sw[k] * s->row[t];
		}
		for (int32_t t = ctx_b; t < ctx_e; t++)
			df[t] += decay * dn[t];
		memcpy(sb, dn, (size_t)n * sizeof(double));
		src = sb;
	}
	double tot = 0.0;
	for (int32_t t = ctx_b; t < ctx_e; t++)
		tot += df[t];
	if (!(tot > 0.0))
		return;
	for (int lg = 0; lg < LG; lg++) {
		float *R = s->R + (size_t)lg * C;
		for (int32_t t = ctx_b; t < ctx_e; t++)
			R[t] = (float)((1.0 - p->lambda_graph) * R[t] + p->lambda_graph * df[t] / tot);
	}
}

struct k_grace_counts {
	int64_t adds, sbin, ssal;
};

/* Pop and apply actions of heap hp while *left > 0 (section 9.6 [S]): an Add puts its
 * root in the frontier and offers its split, a Split replaces a node by its children and
 * offers theirs (into the same heap). A popped action costing more than is left can only
 * be a 2-entry salient split with 1 entry left: its binary alternative is pushed. */
static inline void k_grace_compete(struct k_grace *g, struct k_uheap *hp, int64_t *left, struct k_grace_counts *cnt)
{
	struct k_grace_scratch *s = g->s;
	const struct k_grace_input *in = s->in;
	struct k_uheap_item it;
	while (*left > 0 && k_uheap_pop(hp, &it)) {
		k_grace_act *ac = &s->acts[it.id];
		k_grace_node *nd = &s->nodes[ac->node];
		if (ac->cost > *left) {
			RT_ASSERT(ac->kind == K_GRACE_SPLIT_SALIENT);
			k_grace_act *alt = &s->acts[s->n_acts];
			memset(alt, 0, sizeof *alt);
			alt->node = ac->node;
			alt->kind = K_GRACE_SPLIT_BINARY;
			alt->cost = 1;
			alt->cut = ac->bcut;
			alt->delta = ac->bdelta;
			alt->dch[0] = ac->bdch[0];
			alt->dch[1] = ac->bdch[1];
			k_grace_push(g, hp, (int32_t)s->n_acts++, alt->delta);
			continue;
		}
		*left -= ac->cost;
		if (in->trace)
			in->trace(in->trace_user, (enum k_grace_action)ac->kind, it.layer, it.kv_head, it.pos,
			          nd->b - nd->a, ac->cost, ac->delta);
		if (ac->kind == K_GRACE_ADD) {
			cnt->adds++;
			nd->frontier = 1;
			if (nd->b - nd->a >= 2)
				k_grace_offer_split(g, hp, ac->node);
			continue;
		}
		nd->frontier = 0;
		const int32_t a = nd->a, b = nd->b, lg = nd->lg;
		int32_t ch[3], nch = 0;
		if (ac->kind == K_GRACE_SPLIT_BINARY) {
			cnt->sbin++;
			ch[nch++] = k_grace_new_node(g, lg, a, ac->cut, ac->dch[0]);
			ch[nch++] = k_grace_new_node(g, lg, ac->cut, b, ac->dch[1]);
		} else {
			cnt->ssal++;
			if (ac->cut > a)
				ch[nch++] = k_grace_new_node(g, lg, a, ac->cut, ac->dch[0]);
			ch[nch++] = k_grace_new_node(g, lg, ac->cut, ac->cut + 1, 0.0);
			if (ac->cut + 1 < b)
				ch[nch++] = k_grace_new_node(g, lg, ac->cut + 1, b, ac->dch[2]);
		}
		for (int k = 0; k < nch; k++)
			if (s->nodes[ch[k]].b - s->nodes[ch[k]].a >= 2)
				k_grace_offer_split(g, hp, ch[k]);
	}
}

/* Check the store and the values against what k_grace_init_at sized. */
static inline int k_grace_validate(const struct k_grace *g, const rt_kv *kv,
                                   const struct k_grace_params *p, const struct k_grace_input *in,
                                   rt_err *err)
{
	if (!g->s || kv->n_layer != g->n_layer || kv->n_kv_head != g->n_kv_head ||
	    kv->group != g->group || kv->head_dim != g->head_dim || kv->cap > g->cap ||
	    kv->stat_bytes != g->stat_bytes)
		return rt_err_set(err, "gracekv: KV store shape differs from the one k_grace_init_at sized");
	const int LG = g->n_layer * g->n_kv_head;
	const int32_t n = kv->heads[0].n;
	const rt_kv_head *h0 = &kv->heads[0];
	for (int lg = 0; lg < LG; lg++) {
		const rt_kv_head *h = &kv->heads[lg];
		if (h->n != n)
			return rt_err_set(err, "gracekv: head (%d, %d) holds %d entries, head (0, 0) holds %d",
			                  lg / g->n_kv_head, lg % g->n_kv_head, (int)h->n, (int)n);
		for (int32_t i = 0; i < n; i++) {
			if (h->pos[i] != h0->pos[i] || (i > 0 && h->pos[i] <= h->pos[i - 1]))
				return rt_err_set(err, "gracekv: head (%d, %d) entry %d: positions differ between heads or do not increase",
				                  lg / g->n_kv_head, lg % g->n_kv_head, (int)i);
			if (h->count[i] != 1.0f)
				return rt_err_set(err, "gracekv: head (%d, %d) entry %d is merged (count %g); compression is one-shot after prefill",
				                  lg / g->n_kv_head, lg % g->n_kv_head, (int)i, (double)h->count[i]);
		}
	}
	if (!(p->x >= 1.0) || !isfinite(p->x))
		return rt_err_set(err, "gracekv: compression factor %g must be a finite number >= 1", p->x);
	if (p->recent < 0 || p->floor < 0 || p->seg_len < 1 || p->hops < 0 || p->hop_seeds < 0)
		return rt_err_set(err, "gracekv: negative recent/floor/hops or segment length < 1");
	if ((p->key_mode != K_PROTO_KEY_UNROPE && p->key_mode != K_PROTO_KEY_POST) ||
	    (p->count_mode != K_PROTO_COUNT_COHERENCE && p->count_mode != K_PROTO_COUNT_N))
		return rt_err_set(err, "gracekv: unknown key mode %d or count mode %d", p->key_mode,
		                  p->count_mode);
	if (in->prefix < 0 || in->suffix < 0 || (int64_t)in->prefix + in->suffix > n)
		return rt_err_set(err, "gracekv: prefix %d + suffix %d exceed the %d entries", (int)in->prefix,
		                  (int)in->suffix, (int)n);
	if (in->n_probe < 0 || in->n_probe > g->max_probe || (in->probe_q && in->n_probe == 0))
		return rt_err_set(err, "gracekv: %d probe tokens (scratch sized for %d)", (int)in->n_probe,
		                  (int)g->max_probe);
	const int32_t ctx_b = in->prefix, ctx_e = n - in->suffix;
	if (in->seg_start) {
		if (in->n_seg < 1 || in->seg_start[0] != ctx_b)
			return rt_err_set(err, "gracekv: segments must start at the prefix end %d", (int)ctx_b);
		for (int32_t i = 1; i < in->n_seg; i++)
			if (in->seg_start[i] <= in->seg_start[i - 1] || in->seg_start[i] >= ctx_e)
				return rt_err_set(err, "gracekv: segment %d starts at %d (must increase, below %d)",
				                  (int)i, (int)in->seg_start[i], (int)ctx_e);
	}
	return 0;
}

/* The budget split of one call (section 9.2 [S]; entries over all heads). */
struct k_grace_budget {
	int32_t ctx_b, ctx_e, tree_e; /* context [ctx_b, ctx_e), tree region [ctx_b, tree_e) */
	int64_t n_ctx, n_pin, b_total, b_recent, b_pin, b_floor, b_alloc;
};

/* B_total, then the recent window, the pinned entries (exact, charged before the floor
 * [D]) and the floor clamped to what is left and to the tree size. */
static inline int k_grace_budget_of(const struct k_grace_params *p,
                                    const struct k_grace_input *in, int LG, int32_t n,
                                    struct k_grace_budget *bu, rt_err *err)
{
	bu->ctx_b = in->prefix;
	bu->ctx_e = n - in->suffix;
	bu->n_ctx = bu->ctx_e - bu->ctx_b;
	const int64_t r_eff = p->recent < bu->n_ctx ? p->recent : bu->n_ctx;
	bu->b_total = (int64_t)floor((double)LG * (double)bu->n_ctx / p->x);
	bu->b_recent = (int64_t)LG * r_eff;
	if (bu->b_recent > bu->b_total)
		return rt_err_set(err, "gracekv: the recent window (%d tokens × %d heads = %lld entries) exceeds the budget of %lld entries at x = %g",
		                  (int)r_eff, LG, (long long)bu->b_recent, (long long)bu->b_total, p->x);
	bu->tree_e = bu->ctx_e - (int32_t)r_eff;
	bu->n_pin = 0;
	if (in->pin)
		for (int32_t t = bu->ctx_b; t < bu->tree_e; t++)
			bu->n_pin += in->pin[t] != 0;
	bu->b_pin = (int64_t)LG * bu->n_pin;
	if (bu->b_recent + bu->b_pin > bu->b_total)
		return rt_err_set(err, "gracekv: the recent window and the pinned entries (%lld + %lld entries) exceed the budget of %lld entries at x = %g",
		                  (long long)bu->b_recent, (long long)bu->b_pin, (long long)bu->b_total, p->x);
	int64_t b_floor = p->floor;
	if (b_floor > bu->b_total - bu->b_recent - bu->b_pin)
		b_floor = bu->b_total - bu->b_recent - bu->b_pin;
	if (b_floor > (int64_t)LG * (bu->tree_e - bu->ctx_b - bu->n_pin))
		b_floor = (int64_t)LG * (bu->tree_e - bu->ctx_b - bu->n_pin);
	bu->b_floor = b_floor;
	bu->b_alloc = bu->b_total - bu->b_recent - bu->b_pin - b_floor;
	return 0;
}

/* Members (tree-region entries outside the floor) and their segment ranges per head. */
static inline void k_grace_members(struct k_grace *g, const struct k_grace_budget *bu)
{
	struct k_grace_scratch *s = g->s;
	const struct k_grace_input *in = s->in;
	const int LG = g->n_layer * g->n_kv_head;
	const int32_t C = g->cap, seg_len = s->p->seg_len, ctx_b = bu->ctx_b;
	for (int lg = 0; lg < LG; lg++) {
		int32_t *mem = s->mem + (size_t)lg * C, *sb = s->segb + (size_t)lg * (C + 1);
		int32_t nm = 0, ns = 0, si = 0;
		for (int32_t t = ctx_b; t < bu->tree_e; t++) {
			int32_t st0 = in->seg_start ? -1 : ctx_b + ((t - ctx_b) / seg_len) * seg_len;
			if (in->seg_start) {
				while (si + 1 < in->n_seg && in->seg_start[si + 1] <= t)
					si++;
				st0 = in->seg_start[si];
			}
			if (s->isfloor[(size_t)lg * C + t])
				continue;
			/* a new segment starts when this member's segment differs from the last one's */
			if (nm == 0 || st0 > mem[nm - 1])
				sb[ns++] = nm;
			mem[nm++] = t;
		}
		sb[ns] = nm;
		s->nmem[lg] = nm;
		s->nseg[lg] = ns;
	}
}

/* Roots: one Add per (layer, KV head, segment); with a coverage share each head first
 * spends its share on its own best actions (own heap), then all compete in one heap
 * (section 9.6 [S]). Returns the entries left of b_alloc. */
static inline int64_t k_grace_spend(struct k_grace *g, int64_t b_alloc, struct k_grace_counts *cnt)
{
	struct k_grace_scratch *s = g->s;
	const struct k_grace_params *p = s->p;
	const int LG = g->n_layer * g->n_kv_head;
	const int32_t C = g->cap;
	struct k_uheap hp = { s->heap, 0, (int32_t)(3 * (int64_t)LG * C) };
	int64_t left = b_alloc;
	const int64_t share = p->head_share > 0.0 ?
	                      (int64_t)floor((p->head_share > 1.0 ? 1.0 : p->head_share) *
	                                     (double)b_alloc / LG) : 0;
	for (int lg = 0; lg < LG; lg++) {
		const int32_t *sb = s->segb + (size_t)lg * (C + 1);
		struct k_uheap lh = { s->lheap, 0, 3 * C };
		struct k_uheap *th = share > 0 ? &lh : &hp;
		for (int32_t k = 0; k < s->nseg[lg]; k++) {
			double D = 0.0, Dd = 0.0;
			k_grace_eval(g, lg, sb[k], sb[k + 1], &D, &Dd);
			int32_t ni = k_grace_new_node(g, lg, sb[k], sb[k + 1], D);
			s->nodes[ni].frontier = 0;
			s->nodes[ni].Ddrop = Dd;
			k_grace_act *ac = &s->acts[s->n_acts];
			memset(ac, 0, sizeof *ac);
			ac->node = ni;
			ac->kind = K_GRACE_ADD;
			ac->cost = 1;
			ac->delta = k_grace_omega(g, lg) * s->nodes[ni].R * (Dd - D);
			k_grace_push(g, th, (int32_t)s->n_acts++, ac->delta);
		}
		s->hspent[lg] = 0;
		if (share > 0) {
			int64_t mine = share < left ? share : left;
			int64_t before = mine;
			k_grace_compete(g, &lh, &mine, cnt);
			s->hspent[lg] = before - mine;
			left -= before - mine;
			struct k_uheap_item it;
			while (k_uheap_pop(&lh, &it))
				k_uheap_push(&hp, &it);
		}
	}
	k_grace_compete(g, &hp, &left, cnt);
	return left;
}

/* Stage entry t of head h (exact) or the prototype of node nd into slot `out`. */
static inline void k_grace_stage(struct k_grace *g, rt_kv_head *h, int lg, int32_t t,
                                 const k_grace_node *nd, int32_t out, size_t sbytes)
{
	struct k_grace_scratch *s = g->s;
	const struct k_grace_params *p = s->p;
	const int d = g->head_dim;
	const int32_t C = g->cap;
	float *ko = s->sk + (size_t)out * d, *vo = s->sv + (size_t)out * d;
	if (!nd) {
		memcpy(ko, h->k + (size_t)t * d, (size_t)d * sizeof(float));
		memcpy(vo, h->v + (size_t)t * d, (size_t)d * sizeof(float));
		s->spos[out] = h->pos[t];
		s->scnt[out] = h->count[t];
		s->slc[out] = h->log_count[t];
		s->sspan[out] = h->span[t];
		if (sbytes)
			memcpy(s->sstat + (size_t)out * sbytes, h->stats + (size_t)t * sbytes, sbytes);
	} else {
		float m;
		k_proto_merge(h->k, h->v, h->pos, s->R + (size_t)lg * C, s->mem + (size_t)lg * C + nd->a,
		              nd->b - nd->a, d, g->n_rot, g->rope_base, g->n_rot > 0 ? s->cs : NULL,
		              p->key_mode, p->count_mode, p->smooth, ko, vo, &s->spos[out], &m, NULL,
		              s->dwork);
		s->scnt[out] = m;
		s->slc[out] = logf(m);
		s->sspan[out] = 0;
		if (sbytes)
			memset(s->sstat + (size_t)out * sbytes, 0, sbytes);
	}
	s->ord[out] = (k_grace_ord){ s->spos[out], t, out };
}

/* Materialise head lg: its frontier and exact entries in position order (ties: the lower
 * first member), written back in place. Returns the entries; *protos += prototypes. */
static inline int32_t k_grace_write(struct k_grace *g, rt_kv *kv, int lg,
                                    const struct k_grace_budget *bu, int64_t *protos)
{
	struct k_grace_scratch *s = g->s;
	rt_kv_head *h = &kv->heads[lg];
	const int d = g->head_dim;
	const int32_t C = g->cap, n = s->n;
	const int32_t *mem = s->mem + (size_t)lg * C;
	const size_t sbytes = kv->stat_bytes;
	int32_t out = 0, j = 0;
	for (int32_t t = 0; t < n; t++) {
		int exact = t < bu->ctx_b || t >= bu->tree_e || s->isfloor[(size_t)lg * C + t];
		int32_t ow = -1;
		if (!exact) {
			RT_ASSERT(j < s->nmem[lg] && mem[j] == t);
			ow = s->owner[(size_t)lg * C + j];
			if (ow < 0 || s->nodes[ow].a != j) {
				j++;
				continue; /* dropped, or inside a prototype already written */
			}
			exact = s->nodes[ow].b - s->nodes[ow].a == 1;
			j++;
		}
		k_grace_stage(g, h, lg, t, exact ? NULL : &s->nodes[ow], out, sbytes);
		*protos += !exact;
		out++;
	}
	qsort(s->ord, (size_t)out, sizeof(k_grace_ord), k_grace_cmp_ord);
	for (int32_t i = 0; i < out; i++) {
		int32_t sl = s->ord[i].slot;
		memcpy(h->k + (size_t)i * d, s->sk + (size_t)sl * d, (size_t)d * sizeof(float));
		memcpy(h->v + (size_t)i * d, s->sv + (size_t)sl * d, (size_t)d * sizeof(float));
		h->pos[i] = s->spos[sl];
		h->count[i] = s->scnt[sl];
		h->log_count[i] = s->slc[sl];
		h->span[i] = s->sspan[sl];
		if (sbytes)
			memcpy(h->stats + (size_t)i * sbytes, s->sstat + (size_t)sl * sbytes, sbytes);
	}
	h->n = out;
	return out;
}

/* Compress kv once (after prefill). Every head must hold the same n singleton entries
 * (count 1) with strictly increasing positions, n <= g->cap. Keeps the prefix and suffix
 * exact and uncharged; of the context it keeps the recent window, the pinned entries and
 * the singleton floor exact (charged in that order), then runs the Add/Split competition
 * over the segment trees — first each head on its own for its coverage share
 * (head_share), then all heads in one heap — until the budget is spent or every tree is
 * fully expanded, and rewrites every head in position order (ties: the lower first
 * member): exact entries keep k, v, pos, span, statistics and count 1; prototypes get k~,
 * v~, pos = rounded mean position, count m, log_count log m, span 0, zeroed statistics.
 * At x = 1 the store is bit-identical to the input. The charged entries after compression
 * equal b_total whenever the context has at least that many tokens. st may be NULL.
 * Errors (-1, err "gracekv: ...", kv unchanged): shape mismatch, heads of different
 * lengths or positions, merged entries in the input, x < 1, prefix/suffix/segments out
 * of range, n_probe > max_probe, and a recent window plus pinned entries whose
 * L·G·(r + pins) entries exceed b_total. */
static inline int k_grace_compress(struct k_grace *g, rt_kv *kv, const struct k_grace_params *p,
                                   const struct k_grace_input *in, struct k_grace_stats *st,
                                   rt_err *err)
{
	struct k_grace_scratch *s = g->s;
	if (k_grace_validate(g, kv, p, in, err))
		return -1;
	const int LG = g->n_layer * g->n_kv_head;
	const int32_t C = g->cap, n = kv->heads[0].n;
	struct k_grace_budget bu = { 0 };
	if (k_grace_budget_of(p, in, LG, n, &bu, err))
		return -1;
	s->kv = kv;
	s->p = p;
	s->in = in;
	s->n = n;
	s->n_nodes = 0;
	s->n_acts = 0;
	if (g->n_rot > 0)
		k_proto_rope_table(s->cs, kv->heads[0].pos, n, g->n_rot, g->rope_base);
	k_grace_relevance(g, bu.ctx_b, bu.ctx_e);
	/* exact before the competition: the pinned entries, then the singleton floor */
	memset(s->isfloor, 0, (size_t)LG * C);
	if (bu.n_pin > 0)
		for (int lg = 0; lg < LG; lg++)
			for (int32_t t = bu.ctx_b; t < bu.tree_e; t++)
				s->isfloor[(size_t)lg * C + t] = in->pin[t] != 0;
	k_single_floor(s->R, (size_t)C, LG, bu.ctx_b, bu.tree_e, in->omega, bu.b_floor,
	               p->floor_each, s->isfloor, s->fc);
	k_grace_members(g, &bu);
	struct k_grace_counts cnt = { 0, 0, 0 };
	const int64_t left = k_grace_spend(g, bu.b_alloc, &cnt);
	for (size_t i = 0; i < (size_t)LG * C; i++)
		s->owner[i] = -1;
	for (int64_t i = 0; i < s->n_nodes; i++) {
		const k_grace_node *nd = &s->nodes[i];
		if (nd->frontier)
			for (int32_t j = nd->a; j < nd->b; j++)
				s->owner[(size_t)nd->lg * C + j] = (int32_t)i;
	}
	int64_t protos = 0, entries = 0;
	for (int lg = 0; lg < LG; lg++)
		entries += k_grace_write(g, kv, lg, &bu, &protos);
	if (st) {
		st->n_ctx = bu.n_ctx;
		st->b_total = bu.b_total;
		st->b_recent = bu.b_recent;
		st->b_floor = bu.b_floor;
		st->b_pin = bu.b_pin;
		st->b_alloc = bu.b_alloc;
		st->spent = bu.b_alloc - left;
		st->adds = cnt.adds;
		st->splits_binary = cnt.sbin;
		st->splits_salient = cnt.ssal;
		st->prototypes = protos;
		st->entries = entries;
	}
	return 0;
}

#endif
