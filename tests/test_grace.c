/*
 * test_grace: GraceKV's actions (kernels/k_proto.h, k_segment.h, k_uheap.h, k_single.h,
 * k_grace.h) on synthetic data with
 * grouped-query shapes (9 query / 3 KV heads, 4 / 1). References are independent: a
 * float RoPE written like the forward's, rt_model's attention softmax for the merged-entry
 * semantics, hand-computed distortions and utilities for a two-segment case, a qsort
 * oracle for the heap order, a bitwise copy of the store for exactness at x = 1, and the
 * budget formula floor(L·G·N_ctx / x) for the entry count. The glue of the compiled
 * policy (kernels/k_grace_run.h: k_grace_apply, k_grace_run) is checked against the
 * core called directly with an input built by hand from a synthetic prompt trace, and,
 * through rt_seq on tiny synthetic models (9/3, 4/1) with the runtime's own trace, at
 * compression 1 against the full cache's logits.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k_compress.h"
#include "kvp_emit_c.h"
#include "kvp_ir.h"
#include "kvp_sema.h"
#include "kvp_src.h"
#include "k_signal.h"
#include "k_grace_run.h"
#include "base/rt_rope.h"
#include "kv/rt_kv.h"
#include "model/rt_model.h"
#include "policy/rt_seq.h"
#include "support/tiny_model.h"
#include "support/check_run.h"

/* the exact path: these tests compare against f32 references */
static const rt_model_opts exact_opts = { .exact = 1, .threads = 0 };

static uint64_t rng_state;

static void rng_seed(uint64_t s)
{
	rng_state = s * 6364136223846793005ULL + 1442695040888963407ULL;
}

/* uniform in [-1, 1) */
static float rnd(void)
{
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The kernels' rotation by +pos / -pos (base/rt_rope, angles and products in double). */
static void rope_to(float *x, int d, int n_rot, float base, int32_t pos)
{
	ck_assert(n_rot >= 0 && n_rot <= d && n_rot % 2 == 0);
	rt_rope_by_f32(x, n_rot, base, (double)pos);
}

static void rope_back(float *x, int d, int n_rot, float base, int32_t pos)
{
	ck_assert(n_rot >= 0 && n_rot <= d && n_rot % 2 == 0);
	rt_rope_by_f32(x, n_rot, base, -(double)pos);
}

/* The paper's prototype (un-rotated key mean, coherence count, smoothing 0.1). */
static void proto_paper(const float *K, const float *V, const int32_t *P, const float *w,
                        const int32_t *idx, int n, int d, int n_rot, float base, float *k_out,
                        float *v_out, int32_t *pos_out, float *count_out, double *coh,
                        double *work)
{
	k_proto_merge(K, V, P, w, idx, n, d, n_rot, base, NULL, K_PROTO_KEY_UNROPE,
	              K_PROTO_COUNT_COHERENCE, 0.1, k_out, v_out, pos_out, count_out, coh, work);
}

/* The competition with its scratch in memory of its own (k_grace_init_at). */
typedef struct {
	struct k_grace k;
	void *mem;
} grace_t;

static int grace_init(grace_t *g, const rt_kv *kv, int n_rot, float base, int32_t max_probe,
                      rt_err *err)
{
	size_t len = k_grace_bytes(kv, n_rot, max_probe);
	g->mem = len > 0 && len != SIZE_MAX ? malloc(len) : NULL;
	return k_grace_init_at(&g->k, kv, n_rot, base, max_probe, g->mem, len, err);
}

static void grace_free(grace_t *g)
{
	free(g->mem);
	g->mem = NULL;
}

/* The forward's RoPE (rt_model.c rope_table/rope_apply): cos/sin in double rounded to
 * float, products in float. */
static void ref_rope(float *x, int d, int n_rot, float base, int pos)
{
	(void)d;
	for (int i = 0; i < n_rot / 2; i++) {
		double theta = (double)pos * pow((double)base, -2.0 * i / n_rot);
		float co = (float)cos(theta), si = (float)sin(theta);
		float x0 = x[2 * i], x1 = x[2 * i + 1];
		x[2 * i] = x0 * co - x1 * si;
		x[2 * i + 1] = x0 * si + x1 * co;
	}
}

/* A store of L layers × G KV heads (group R, head_dim d) holding n random singletons at
 * positions 0..n-1; keys are random pre-RoPE vectors rotated at their position. Statistics
 * (8 bytes per entry) and spans carry tags so any misplaced copy shows. */
static void make_store(rt_kv *kv, int L, int G, int R, int d, int n_rot, int32_t n,
                       int32_t cap, uint64_t seed)
{
	rt_err err = {0};
	ck_assert_int_eq(rt_kv_init(kv, L, G, R, d, cap, 8, 0, &err), 0);
	rng_seed(seed);
	float k[128], v[128];
	for (int l = 0; l < L; l++)
		for (int g = 0; g < G; g++) {
			rt_kv_head *h = rt_kv_head_at(kv, l, g);
			for (int32_t t = 0; t < n; t++) {
				for (int i = 0; i < d; i++) {
					k[i] = 2.0f * rnd();
					v[i] = rnd();
				}
				ref_rope(k, d, n_rot, 10000.0f, t);
				int32_t e = rt_kv_append(kv, h, k, v, t);
				h->span[e] = (uint16_t)(t % 3);
				for (int b = 0; b < 8; b++)
					h->stats[(size_t)e * 8 + b] = (uint8_t)(t * 7 + b + l + g);
			}
		}
}

/* ---- RoPE --------------------------------------------------------------------------- */

START_TEST(test_rope_roundtrip)
{
	const int d = 64;
	float x[64], y[64], r[64];
	rng_seed(1);
	for (int i = 0; i < d; i++)
		x[i] = rnd();
	int32_t positions[] = { 0, 1, 17, 1234, 8191 };
	for (int pi = 0; pi < 5; pi++) {
		for (int nr = 0; nr <= 64; nr += 32) {
			memcpy(y, x, sizeof y);
			memcpy(r, x, sizeof r);
			rope_to(y, d, nr, 100000.0f, positions[pi]);
			ref_rope(r, d, nr, 100000.0f, positions[pi]);
			for (int i = 0; i < d; i++)
				ck_assert_float_eq_tol(y[i], r[i], 2e-6f);
			for (int i = nr; i < d; i++)
				ck_assert_float_eq(y[i], x[i]); /* unrotated dims untouched */
			rope_back(y, d, nr, 100000.0f, positions[pi]);
			for (int i = 0; i < d; i++)
				ck_assert_float_eq_tol(y[i], x[i], 2e-6f);
		}
	}
	/* one pair by hand: pos 1, i = 0 rotates by exactly 1 radian */
	float p[2] = { 1.0f, 0.0f };
	rope_to(p, 2, 2, 10000.0f, 1);
	ck_assert_float_eq_tol(p[0], (float)cos(1.0), 1e-7f);
	ck_assert_float_eq_tol(p[1], (float)sin(1.0), 1e-7f);
}
END_TEST

/* ---- prototypes and merged-entry semantics ------------------------------------------ */

START_TEST(test_merge_identical_keys)
{
	/* the same pre-RoPE key at positions 10, 13, 17, 20: coherence 1, count 4, the key
	 * re-rotated at round(15) = 15 */
	const int d = 64, nr = 64;
	float K[4 * 64], V[4 * 64], k0[64], kt[64], vt[64];
	int32_t P[4] = { 10, 13, 17, 20 }, idx[4] = { 0, 1, 2, 3 }, pos;
	double work[128], coh;
	float cnt;
	rng_seed(2);
	for (int i = 0; i < d; i++)
		k0[i] = rnd();
	for (int j = 0; j < 4; j++) {
		memcpy(K + j * d, k0, sizeof k0);
		ref_rope(K + j * d, d, nr, 10000.0f, P[j]);
		for (int i = 0; i < d; i++)
			V[j * d + i] = (float)(j + 1);
	}
	proto_paper(K, V, P, NULL, idx, 4, d, nr, 10000.0f, kt, vt, &pos, &cnt, &coh, work);
	ck_assert_int_eq(pos, 15);
	ck_assert_double_eq_tol(coh, 1.0, 1e-6);
	ck_assert_float_eq_tol(cnt, 4.0f, 1e-5f);
	float ref[64];
	memcpy(ref, k0, sizeof ref);
	ref_rope(ref, d, nr, 10000.0f, 15);
	for (int i = 0; i < d; i++) {
		ck_assert_float_eq_tol(kt[i], ref[i], 1e-5f);
		ck_assert_float_eq_tol(vt[i], 2.5f, 1e-6f); /* plain mean of 1..4 */
	}
	/* relevance weights (1, 0, 0, 0): beta = 0.025, v~ = (1.025·1 + 0.025·(2+3+4)) / 1.1 */
	float w[4] = { 1, 0, 0, 0 };
	proto_paper(K, V, P, w, idx, 4, d, nr, 10000.0f, kt, vt, &pos, &cnt, &coh, work);
	ck_assert_float_eq_tol(vt[0], (float)((1.025 + 0.025 * 9) / 1.1), 1e-6f);
	/* opposite keys: coherence 0, count clamped to 1; rounding half up: mean 11.5 -> 12 */
	int32_t P2[2] = { 11, 12 };
	float K2[4] = { 1, 0, -1, 0 }, V2[4] = { 0, 0, 0, 0 };
	proto_paper(K2, V2, P2, NULL, idx, 2, 2, 0, 10000.0f, kt, vt, &pos, &cnt, &coh, work);
	ck_assert_double_eq_tol(coh, 0.0, 1e-9);
	ck_assert_float_eq(cnt, 1.0f);
	ck_assert_int_eq(pos, 12);
	/* a single member is itself, bit for bit */
	proto_paper(K, V, P, NULL, idx + 2, 1, d, nr, 10000.0f, kt, vt, &pos, &cnt, &coh, work);
	ck_assert_int_eq(memcmp(kt, K + 2 * d, d * sizeof(float)), 0);
	ck_assert_int_eq(pos, 17);
	ck_assert_float_eq(cnt, 1.0f);
}
END_TEST

/* Attention output [G × d] of queries Q [G × d] over n entries, through rt_model's
 * softmax (logit + log_count), accumulated in double. */
static void attend(const float *Q, int G, const float *K, const float *V, const float *lc, int n,
                   int d, double *out)
{
	float P[4 * 16];
	for (int g = 0; g < G; g++)
		for (int i = 0; i < n; i++) {
			double s = 0.0;
			for (int c = 0; c < d; c++)
				s += (double)Q[g * d + c] * K[i * d + c];
			P[g * n + i] = (float)(s / sqrt((double)d));
		}
	rt_attn_softmax(P, (size_t)n, G, n, lc);
	for (int g = 0; g < G; g++)
		for (int c = 0; c < d; c++) {
			double o = 0.0;
			for (int i = 0; i < n; i++)
				o += (double)P[g * n + i] * V[i * d + c];
			out[g * d + c] = o;
		}
}

START_TEST(test_exact_case_attention)
{
	/* five tokens with the SAME post-RoPE key (only unrotated dims are non-zero, n_rot 4
	 * of d 8) and different values, plus three other tokens; a 4/1 group of queries.
	 * Merging the five into one entry with count 5 (log 5 on its logit) and the mean value
	 * gives the same attention output as the five originals (docs/gracekv.md section 3, the
	 * exact case). */
	const int d = 8, nr = 4, G = 4;
	float K[8 * 8], V[8 * 8], lc[8] = { 0 };
	int32_t P[8];
	rng_seed(3);
	float kshared[8] = { 0, 0, 0, 0, 0.7f, -0.3f, 0.2f, 0.9f };
	for (int i = 0; i < 8; i++) {
		P[i] = i * 3;
		for (int c = 0; c < d; c++) {
			K[i * d + c] = i < 5 ? kshared[c] : rnd();
			V[i * d + c] = rnd();
		}
		if (i >= 5)
			ref_rope(K + i * d, d, nr, 10000.0f, P[i]);
	}
	float Q[4 * 8];
	for (int i = 0; i < G * d; i++)
		Q[i] = 3.0f * rnd();
	double o_full[32], o_merged[32];
	attend(Q, G, K, V, lc, 8, d, o_full);
	int32_t idx[5] = { 0, 1, 2, 3, 4 }, pos;
	float w[8] = { 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0, 0, 0 }; /* equal relevance */
	float K2[4 * 8], V2[4 * 8], lc2[4] = { 0 }, cnt;
	double work[16], coh;
	proto_paper(K, V, P, w, idx, 5, d, nr, 10000.0f, K2, V2, &pos, &cnt, &coh, work);
	ck_assert_int_eq(pos, 6); /* mean of 0, 3, 6, 9, 12 */
	ck_assert_double_eq_tol(coh, 1.0, 1e-7);
	ck_assert_float_eq_tol(cnt, 5.0f, 1e-5f);
	lc2[0] = logf(cnt);
	for (int i = 0; i < d; i++)
		ck_assert_float_eq(K2[i], kshared[i]); /* un-rotate/re-rotate leaves it alone */
	memcpy(K2 + d, K + 5 * d, 3 * d * sizeof(float));
	memcpy(V2 + d, V + 5 * d, 3 * d * sizeof(float));
	attend(Q, G, K2, V2, lc2, 4, d, o_merged);
	for (int i = 0; i < G * d; i++)
		ck_assert_double_eq_tol(o_merged[i], o_full[i], 2e-6);
	/* without the log-count bias the merged entry is under-weighted: outputs differ */
	lc2[0] = 0.0f;
	attend(Q, G, K2, V2, lc2, 4, d, o_merged);
	double diff = 0.0;
	for (int i = 0; i < G * d; i++)
		diff += fabs(o_merged[i] - o_full[i]);
	ck_assert(diff > 1e-3);
}
END_TEST

START_TEST(test_key_and_count_modes)
{
	/* one 4/1 head, 6 tokens in one segment, x = 6: B_total = 1, so the store becomes the
	 * root prototype. Paper mode equals proto_paper; KEY_POST + COUNT_N gives the
	 * plain mean of the post-RoPE keys at count 6. */
	const int d = 8;
	for (int mode = 0; mode < 2; mode++) {
		rt_kv kv;
		make_store(&kv, 1, 1, 4, d, d, 6, 6, 60);
		rt_kv ref;
		make_store(&ref, 1, 1, 4, d, d, 6, 6, 60);
		grace_t g;
		rt_err err = {0};
		ck_assert_int_eq(grace_init(&g, &kv, d, 10000.0f, 1, &err), 0);
		struct k_grace_params p;
		k_grace_params_default(&p);
		p.x = 6.0;
		p.recent = 0;
		p.key_mode = mode ? K_PROTO_KEY_POST : K_PROTO_KEY_UNROPE;
		p.count_mode = mode ? K_PROTO_COUNT_N : K_PROTO_COUNT_COHERENCE;
		struct k_grace_input in = { 0 };
		float rel[6] = { 1, 1, 1, 1, 1, 1 };
		in.rel = rel;
		ck_assert_msg(k_grace_compress(&g.k, &kv, &p, &in, NULL, &err) == 0, "%s", err.msg);
		const rt_kv_head *h = &kv.heads[0], *r = &ref.heads[0];
		ck_assert_int_eq(h->n, 1);
		ck_assert_int_eq(h->pos[0], 3); /* round(2.5) half up */
		if (mode) {
			ck_assert_float_eq(h->count[0], 6.0f);
			for (int i = 0; i < d; i++) {
				double m = 0.0;
				for (int t = 0; t < 6; t++)
					m += r->k[t * d + i];
				ck_assert_float_eq_tol(h->k[i], (float)(m / 6.0), 1e-6f);
			}
		} else {
			int32_t idx[6] = { 0, 1, 2, 3, 4, 5 }, pos;
			float kt[8], vt[8], cnt;
			double work[16];
			proto_paper(r->k, r->v, r->pos, rel, idx, 6, d, d, 10000.0f, kt, vt, &pos, &cnt,
			                   NULL, work);
			ck_assert_int_eq(memcmp(kt, h->k, sizeof kt), 0);
			ck_assert_int_eq(memcmp(vt, h->v, sizeof vt), 0);
			ck_assert_float_eq(cnt, h->count[0]);
			ck_assert(cnt < 6.0f); /* random keys are incoherent */
		}
		grace_free(&g);
		rt_kv_free(&ref);
		rt_kv_free(&kv);
	}
}
END_TEST

/* ---- the heap and its tie rule -------------------------------------------------------- */

static int oracle_cmp(const void *a, const void *b)
{
	const struct k_uheap_item *x = a, *y = b;
	double ux = isnan(x->u) ? -INFINITY : x->u, uy = isnan(y->u) ? -INFINITY : y->u;
	if (ux > uy)
		return -1;
	if (ux < uy)
		return 1;
	int kx[4] = { x->layer, x->kv_head, x->pos, x->id }, ky[4] = { y->layer, y->kv_head, y->pos, y->id };
	for (int i = 0; i < 4; i++)
		if (kx[i] != ky[i])
			return kx[i] < ky[i] ? -1 : 1;
	return 0;
}

START_TEST(test_heap_order_and_ties)
{
	struct k_uheap_item buf[16];
	struct k_uheap h = { buf, 0, 16 };
	/* equal utility 1.0 on purpose: lower layer, then head, then position pops first */
	struct k_uheap_item in[] = {
		{ 1.0, 2, 0, 5, 0 }, { 1.0, 1, 2, 9, 1 }, { 1.0, 1, 0, 40, 2 }, { 1.0, 1, 0, 7, 3 },
		{ 2.5, 9, 9, 99, 4 }, { NAN, 0, 0, 0, 5 }, { -1.0, 0, 0, 0, 6 }, { 1.0, 0, 1, 3, 7 },
	};
	for (int i = 0; i < 8; i++)
		k_uheap_push(&h, &in[i]);
	int want[] = { 4, 7, 3, 2, 1, 0, 6, 5 };
	struct k_uheap_item o;
	for (int i = 0; i < 8; i++) {
		ck_assert(k_uheap_pop(&h, &o));
		ck_assert_int_eq(o.id, want[i]);
	}
	ck_assert_int_eq(k_uheap_pop(&h, &o), 0);
	/* 2000 random items with many ties against a qsort oracle */
	enum { N = 2000 };
	static struct k_uheap_item big[N], ref[N];
	struct k_uheap hb = { big, 0, N };
	rng_seed(4);
	for (int i = 0; i < N; i++) {
		struct k_uheap_item it = { (double)(int)(4 * rnd()), (int)(3 + 3 * rnd()), (int)(2 + 2 * rnd()),
		                     (int)(50 + 50 * rnd()), i };
		ref[i] = it;
		k_uheap_push(&hb, &it);
	}
	qsort(ref, N, sizeof ref[0], oracle_cmp);
	for (int i = 0; i < N; i++) {
		ck_assert(k_uheap_pop(&hb, &o));
		ck_assert_int_eq(o.id, ref[i].id);
	}
}
END_TEST

/* ---- Split beats Add (hand-computed) --------------------------------------------------- */

typedef struct trace_log {
	int n;
	int kind[16], members[16], cost[16];
	int32_t pos[16];
	double delta[16];
} trace_log;

static void trace_cb(void *user, enum k_grace_action kind, int layer, int kv_head, int32_t pos,
                     int32_t members, int cost, double delta)
{
	trace_log *t = user;
	(void)layer;
	(void)kv_head;
	if (t->n < 16) {
		t->kind[t->n] = kind;
		t->members[t->n] = members;
		t->cost[t->n] = cost;
		t->pos[t->n] = pos;
		t->delta[t->n] = delta;
		t->n++;
	}
}

/* One layer, one KV head of a 4/1 group, d = 2, no rotation. Segment A = tokens 0, 1
 * with opposite keys (1,0), (-1,0) and values (1,0), (0,1); segment B = tokens 2, 3 with
 * the same key (0,1) and value (0.5,0.5). One probe token whose four query rows are
 * (√2, 0), so logits are k_x: 1, -1, 0, 0. Budget 2 entries (x = 2, no recent, no floor). */
static void split_case(float relA, float relB, trace_log *tl, rt_kv *kv, struct k_grace_stats *st)
{
	rt_err err = {0};
	ck_assert_int_eq(rt_kv_init(kv, 1, 1, 4, 2, 8, 0, 0, &err), 0);
	float K[4][2] = { { 1, 0 }, { -1, 0 }, { 0, 1 }, { 0, 1 } };
	float V[4][2] = { { 1, 0 }, { 0, 1 }, { 0.5f, 0.5f }, { 0.5f, 0.5f } };
	rt_kv_head *h = rt_kv_head_at(kv, 0, 0);
	for (int t = 0; t < 4; t++)
		rt_kv_append(kv, h, K[t], V[t], t);
	grace_t g;
	ck_assert_int_eq(grace_init(&g, kv, 0, 10000.0f, 1, &err), 0);
	float q[4 * 2];
	for (int r = 0; r < 4; r++) {
		q[2 * r] = (float)sqrt(2.0);
		q[2 * r + 1] = 0.0f;
	}
	float rel[4] = { relA, relA, relB, relB };
	int32_t seg[2] = { 0, 2 }, ppos = 4;
	struct k_grace_params p;
	k_grace_params_default(&p);
	p.x = 2.0;
	p.recent = 0;
	p.floor = 0;
	struct k_grace_input in = { 0 };
	in.seg_start = seg;
	in.n_seg = 2;
	in.probe_q = q;
	in.probe_pos = &ppos;
	in.n_probe = 1;
	in.rel = rel;
	in.trace = trace_cb;
	in.trace_user = tl;
	memset(tl, 0, sizeof *tl);
	ck_assert_msg(k_grace_compress(&g.k, kv, &p, &in, st, &err) == 0, "%s", err.msg);
	grace_free(&g);
}

START_TEST(test_split_beats_add)
{
	/* by hand (λ_Z = λ_M = 1; the normaliser of the probe cancels in every ratio):
	 * A as one prototype: mean key 0, coherence 0 -> m = 1, k~ = 0, logit 0; v~ = (0.5, 0.5)
	 *   (equal relevance). Z = e^0 + e^-2, Z~ = e^0 relative to the max logit 1 -> shift:
	 *   Z = 1 + e^-2, Z~ = e^-1; M = (1, e^-2), M~ = e^-1 (0.5, 0.5).
	 *   D(A) = (Z - Z~)²/Z² + |M - M~|²/|M|²;  D_drop = 2;  singletons have D = 0.
	 * B: identical keys (coherence 1, m = 2) and values: D(B) = 0. */
	double Z = 1.0 + exp(-2.0), Zt = exp(-1.0);
	double m0 = 1.0 - 0.5 * Zt, m1 = exp(-2.0) - 0.5 * Zt;
	double DA = (Z - Zt) * (Z - Zt) / (Z * Z) + (m0 * m0 + m1 * m1) / (1.0 + exp(-4.0));
	ck_assert_double_eq_tol(DA, 1.1132, 1e-3); /* 0.45694 + 0.65630 */
	/* relevance 0.45 / 0.05 per token -> R(A) = 0.9, R(B) = 0.1 */
	double u_add_a = 0.9 * (2.0 - DA), u_split_a = 0.9 * DA, u_add_b = 0.1 * 2.0;
	ck_assert(u_add_a > u_add_b && u_split_a > u_add_b);
	trace_log tl;
	rt_kv kv;
	struct k_grace_stats st;
	split_case(0.45f, 0.05f, &tl, &kv, &st);
	ck_assert_int_eq(st.b_total, 2);
	ck_assert_int_eq(tl.n, 2);
	ck_assert_int_eq(tl.kind[0], K_GRACE_ADD);
	ck_assert_int_eq(tl.pos[0], 0);
	ck_assert_double_eq_tol(tl.delta[0], u_add_a, 1e-5);
	ck_assert_int_eq(tl.kind[1], K_GRACE_SPLIT_BINARY); /* beats Add(B) */
	ck_assert_int_eq(tl.cost[1], 1);
	ck_assert_double_eq_tol(tl.delta[1], u_split_a, 1e-5);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	ck_assert_int_eq(h->n, 2); /* tokens 0 and 1 exactly, segment B not covered */
	ck_assert_int_eq(h->pos[0], 0);
	ck_assert_int_eq(h->pos[1], 1);
	ck_assert_float_eq(h->k[2], -1.0f);
	ck_assert_float_eq(h->count[0], 1.0f);
	rt_kv_free(&kv);

	/* the same case with B relevant (R(A) = 0.9/2.1, R(B) = 1.2/2.1): Add(B) = 0.571·2
	 * outranks everything, then Add(A) = 0.429·0.887 beats Split(B) (Δ = 0) */
	split_case(0.45f, 0.6f, &tl, &kv, &st);
	ck_assert_int_eq(tl.n, 2);
	ck_assert_int_eq(tl.kind[0], K_GRACE_ADD);
	ck_assert_int_eq(tl.pos[0], 2);
	ck_assert_double_eq_tol(tl.delta[0], 1.2 / 2.1 * 2.0, 1e-5);
	ck_assert_int_eq(tl.kind[1], K_GRACE_ADD);
	ck_assert_double_eq_tol(tl.delta[1], 0.9 / 2.1 * (2.0 - DA), 1e-5);
	h = rt_kv_head_at(&kv, 0, 0);
	ck_assert_int_eq(h->n, 2);
	ck_assert_int_eq(h->pos[0], 1); /* A: round(0.5) = 1, count 1 (incoherent) */
	ck_assert_float_eq(h->count[0], 1.0f);
	ck_assert_float_eq_tol(h->v[0], 0.5f, 1e-7f);
	ck_assert_int_eq(h->pos[1], 3); /* B: round(2.5) = 3, count 2 */
	ck_assert_float_eq_tol(h->count[1], 2.0f, 1e-6f);
	ck_assert_float_eq_tol(h->log_count[1], logf(2.0f), 1e-6f);
	rt_kv_free(&kv);
}
END_TEST

/* ---- whole-store behaviour ----------------------------------------------------------- */

typedef struct shape {
	int L, G, R;
} shape;

static const shape shapes[] = { { 2, 3, 3 }, { 3, 1, 4 } }; /* 9/3 and 4/1 */

/* Random normalised trajectories with a turn every 37 tokens, for the segmenter. */
static int32_t make_segments(int32_t n_ctx, int32_t *seg, float *bound_ctx)
{
	const int E = 16;
	float *hd = malloc((size_t)n_ctx * E * sizeof(float));
	float dir[16] = { 0 };
	float x[16] = { 0 };
	for (int32_t i = 0; i < n_ctx; i++) {
		if (i % 37 == 0)
			for (int e = 0; e < E; e++)
				dir[e] = rnd();
		for (int e = 0; e < E; e++) {
			x[e] += dir[e] + 0.05f * rnd();
			hd[(size_t)i * E + e] = x[e];
		}
	}
	struct k_segment_params sp;
	k_segment_params_default(&sp);
	double *work = malloc(k_segment_work(n_ctx, E, 1, sp.n_win) * sizeof(double));
	const float *hl[1] = { hd };
	rt_err err = {0};
	int32_t k = k_segment(&sp, n_ctx, E, 1, hl, NULL, work, bound_ctx, seg, &err);
	ck_assert_msg(k >= 1, "%s", err.msg);
	free(work);
	free(hd);
	return k;
}

static void run_compress(rt_kv *kv, double x, int32_t prefix, int32_t suffix, int32_t recent,
                         int64_t floor, int use_segments, struct k_grace_stats *st)
{
	const int32_t n = kv->heads[0].n;
	grace_t g;
	rt_err err = {0};
	ck_assert_int_eq(grace_init(&g, kv, kv->head_dim, 10000.0f, 16, &err), 0);
	int32_t *seg = malloc((size_t)n * sizeof(int32_t));
	float *bound = calloc((size_t)n, sizeof(float));
	struct k_grace_params p;
	k_grace_params_default(&p);
	p.x = x;
	p.recent = recent;
	p.floor = floor;
	struct k_grace_input in = { 0 };
	in.prefix = prefix;
	in.suffix = suffix;
	if (use_segments) {
		int32_t k = make_segments(n - prefix - suffix, seg, bound + prefix);
		for (int32_t i = 0; i < k; i++)
			seg[i] += prefix;
		in.seg_start = seg;
		in.n_seg = k;
		in.boundary = bound;
	}
	ck_assert_msg(k_grace_compress(&g.k, kv, &p, &in, st, &err) == 0, "%s", err.msg);
	free(seg);
	free(bound);
	grace_free(&g);
}

START_TEST(test_x1_exact)
{
	for (int si = 0; si < 2; si++)
		for (int use_seg = 0; use_seg < 2; use_seg++) {
			const shape s = shapes[si];
			rt_kv kv;
			make_store(&kv, s.L, s.G, s.R, 16, 16, 300, 320, 10 + si);
			void *copy = malloc(kv.mem_bytes);
			memcpy(copy, kv.mem, kv.mem_bytes);
			struct k_grace_stats st;
			run_compress(&kv, 1.0, 5, 12, 20, 7, use_seg, &st);
			/* every tree fully expanded: the whole allocation is bit-identical */
			ck_assert_int_eq(st.b_total, (int64_t)s.L * s.G * (300 - 17));
			ck_assert_int_eq(st.prototypes, 0);
			ck_assert_int_eq(st.b_floor, 7);
			ck_assert_int_eq(memcmp(copy, kv.mem, kv.mem_bytes), 0);
			free(copy);
			rt_kv_free(&kv);
		}
}
END_TEST

START_TEST(test_budget_exact)
{
	const double xs[] = { 2.0, 3.3, 8.0, 16.0 };
	for (int si = 0; si < 2; si++)
		for (int xi = 0; xi < 4; xi++) {
			const shape s = shapes[si];
			const int LG = s.L * s.G;
			const int32_t n = 400, prefix = 3, suffix = 16, recent = 8;
			rt_kv kv;
			make_store(&kv, s.L, s.G, s.R, 16, 16, n, n, 20 + si);
			rt_kv ref;
			make_store(&ref, s.L, s.G, s.R, 16, 16, n, n, 20 + si);
			struct k_grace_stats st;
			run_compress(&kv, xs[xi], prefix, suffix, recent, 2 * LG, 1, &st);
			int64_t want = (int64_t)floor((double)LG * (n - prefix - suffix) / xs[xi]);
			ck_assert_int_eq(st.b_total, want);
			ck_assert_int_eq(rt_kv_entries(&kv) - (int64_t)LG * (prefix + suffix), want);
			ck_assert_int_eq(st.entries, rt_kv_entries(&kv));
			ck_assert_int_eq(st.spent, st.b_alloc);
			ck_assert(st.prototypes > 0);
			for (int lg = 0; lg < LG; lg++) {
				const rt_kv_head *h = &kv.heads[lg], *r = &ref.heads[lg];
				double tokens = 0.0;
				for (int32_t i = 0; i < h->n; i++) {
					if (i > 0)
						ck_assert(h->pos[i] >= h->pos[i - 1]); /* position order */
					ck_assert(h->count[i] >= 1.0f);
					ck_assert_float_eq_tol(h->log_count[i], logf(h->count[i]), 1e-6f);
					tokens += h->count[i];
					if (h->count[i] == 1.0f && h->span[i] != 0)
						ck_assert_int_eq(h->span[i], h->pos[i] % 3);
				}
				ck_assert(tokens <= n + 1e-3);
				/* prefix, recent window and suffix kept exactly */
				for (int32_t i = 0; i < prefix; i++)
					ck_assert_int_eq(memcmp(h->k + i * 16, r->k + i * 16, 16 * sizeof(float)), 0);
				for (int32_t j = 0; j < suffix + recent; j++) {
					int32_t i = h->n - 1 - j, t = n - 1 - j;
					ck_assert_int_eq(h->pos[i], t);
					ck_assert_int_eq(memcmp(h->k + i * 16, r->k + (size_t)t * 16, 16 * sizeof(float)), 0);
					ck_assert_int_eq(memcmp(h->v + i * 16, r->v + (size_t)t * 16, 16 * sizeof(float)), 0);
					ck_assert_int_eq(memcmp(h->stats + (size_t)i * 8, r->stats + (size_t)t * 8, 8), 0);
				}
			}
			rt_kv_free(&ref);
			rt_kv_free(&kv);
		}
}
END_TEST

START_TEST(test_singleton_floor)
{
	/* 9/3 shape; relevance supplied: a spike on token 40 of head (0, 1), token 90 of head
	 * (1, 2) and token 41 of head (0, 1), flat elsewhere. x = 16 is far too tight to
	 * reach them by splits; a floor of 3 keeps exactly those three tokens bit for bit. */
	const int L = 2, G = 3, LG = 6;
	const int32_t n = 200;
	rt_kv kv, ref;
	make_store(&kv, L, G, 3, 16, 16, n, n, 30);
	make_store(&ref, L, G, 3, 16, 16, n, n, 30);
	float *rel = malloc((size_t)LG * n * sizeof(float));
	for (int i = 0; i < LG * n; i++)
		rel[i] = 1.0f;
	rel[1 * n + 40] = 500.0f;
	rel[5 * n + 90] = 400.0f;
	rel[1 * n + 41] = 300.0f;
	grace_t g;
	rt_err err = {0};
	ck_assert_int_eq(grace_init(&g, &kv, 16, 10000.0f, 4, &err), 0);
	struct k_grace_params p;
	k_grace_params_default(&p);
	p.x = 16.0;
	p.recent = 4;
	p.floor = 3;
	struct k_grace_input in = { 0 };
	in.rel = rel;
	struct k_grace_stats st;
	ck_assert_msg(k_grace_compress(&g.k, &kv, &p, &in, &st, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(st.b_total, LG * n / 16);
	ck_assert_int_eq(st.b_floor, 3);
	ck_assert_int_eq(rt_kv_entries(&kv), LG * n / 16);
	int32_t want_lg[3] = { 1, 5, 1 }, want_t[3] = { 40, 90, 41 };
	for (int w = 0; w < 3; w++) {
		const rt_kv_head *h = &kv.heads[want_lg[w]], *r = &ref.heads[want_lg[w]];
		int found = 0;
		for (int32_t i = 0; i < h->n; i++)
			if (h->pos[i] == want_t[w] && h->count[i] == 1.0f &&
			    memcmp(h->k + i * 16, r->k + (size_t)want_t[w] * 16, 16 * sizeof(float)) == 0 &&
			    memcmp(h->v + i * 16, r->v + (size_t)want_t[w] * 16, 16 * sizeof(float)) == 0)
				found = 1;
		ck_assert_msg(found, "floor token %d of head %d not kept exactly", want_t[w], want_lg[w]);
	}
	free(rel);
	grace_free(&g);
	rt_kv_free(&ref);
	rt_kv_free(&kv);
}
END_TEST

static void hop_row(void *user, int32_t src, float *row)
{
	/* token 150 (the seed) attends entirely to token 20; every other token to itself */
	int32_t n = *(int32_t *)user;
	for (int32_t t = 0; t < n; t++)
		row[t] = 0.0f;
	row[src == 150 ? 20 : src] = 1.0f;
}

START_TEST(test_probe_relevance_and_hops)
{
	/* 4/1 shape. Route 1: the caller's probe queries; route 2: the same attention computed
	 * here (softmax of q·k/√d over the visible entries, summed over probes and the group)
	 * passed as rel. Both must give the same store bit for bit. */
	const int L = 1, G = 1, R = 4, d = 16;
	const int32_t n = 180, suffix = 8;
	rt_kv a, b;
	make_store(&a, L, G, R, d, d, n, n, 40);
	make_store(&b, L, G, R, d, d, n, n, 40);
	const int np = 2;
	float q[2 * 4 * 16];
	for (int i = 0; i < np * R * d; i++)
		q[i] = 2.0f * rnd();
	int32_t ppos[2] = { 175, 179 };
	float *rel = calloc(n, sizeof(float));
	const rt_kv_head *h = &a.heads[0];
	for (int u = 0; u < np; u++)
		for (int r = 0; r < R; r++) {
			double lg[180], mx = -INFINITY, sum = 0.0;
			int32_t vis = ppos[u] + 1;
			for (int32_t t = 0; t < vis; t++) {
				double s = 0.0;
				for (int c = 0; c < d; c++)
					s += (double)q[(u * R + r) * d + c] * h->k[t * d + c];
				lg[t] = s / 4.0;
				mx = lg[t] > mx ? lg[t] : mx;
			}
			for (int32_t t = 0; t < vis; t++)
				sum += exp(lg[t] - mx);
			for (int32_t t = 0; t < vis; t++)
				rel[t] += (float)(exp(lg[t] - mx) / sum);
		}
	grace_t g;
	rt_err err = {0};
	ck_assert_int_eq(grace_init(&g, &a, d, 10000.0f, 4, &err), 0);
	struct k_grace_params p;
	k_grace_params_default(&p);
	p.x = 6.0;
	p.recent = 4;
	p.floor = 2;
	struct k_grace_input in = { 0 };
	in.suffix = suffix;
	in.probe_q = q;
	in.probe_pos = ppos;
	in.n_probe = np;
	ck_assert_msg(k_grace_compress(&g.k, &a, &p, &in, NULL, &err) == 0, "%s", err.msg);
	in.rel = rel;
	ck_assert_msg(k_grace_compress(&g.k, &b, &p, &in, NULL, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(a.heads[0].n, b.heads[0].n);
	for (int32_t i = 0; i < a.heads[0].n; i++) {
		ck_assert_int_eq(a.heads[0].pos[i], b.heads[0].pos[i]);
		ck_assert_float_eq_tol(a.heads[0].k[i * d], b.heads[0].k[i * d], 1e-6f);
		ck_assert_float_eq_tol(a.heads[0].count[i], b.heads[0].count[i], 1e-5f);
	}
	rt_kv_free(&a);
	rt_kv_free(&b);

	/* multi-hop: direct relevance peaks at token 150; token 150 attends to token 20. With
	 * the flow (λ_graph 0.5, one hop) a floor of 2 keeps 150 and 20; without it, 150 and
	 * the second-highest direct token (60). */
	for (int with_hop = 0; with_hop < 2; with_hop++) {
		rt_kv c;
		make_store(&c, L, G, R, d, d, n, n, 41);
		for (int32_t t = 0; t < n; t++)
			rel[t] = 1.0f;
		rel[150] = 1000.0f;
		rel[60] = 30.0f;
		int32_t nn = n;
		struct k_grace_input ih = { 0 };
		ih.suffix = suffix;
		ih.rel = rel;
		ih.hop_attn = with_hop ? hop_row : NULL;
		ih.hop_user = &nn;
		struct k_grace_params ph = p;
		ph.x = 20.0;
		ph.lambda_graph = 0.5;
		ph.hops = 1;
		ph.hop_seeds = 1;
		ph.floor = 2;
		ck_assert_msg(k_grace_compress(&g.k, &c, &ph, &ih, NULL, &err) == 0, "%s", err.msg);
		int has20 = 0, has60 = 0, has150 = 0;
		for (int32_t i = 0; i < c.heads[0].n; i++) {
			if (c.heads[0].count[i] != 1.0f)
				continue;
			has20 |= c.heads[0].pos[i] == 20;
			has60 |= c.heads[0].pos[i] == 60;
			has150 |= c.heads[0].pos[i] == 150;
		}
		ck_assert(has150);
		ck_assert_int_eq(has20, with_hop);
		ck_assert_int_eq(has60, !with_hop);
		rt_kv_free(&c);
	}
	free(rel);
	grace_free(&g);
}
END_TEST

START_TEST(test_errors)
{
	rt_kv kv;
	make_store(&kv, 2, 3, 3, 16, 16, 64, 64, 50);
	grace_t g;
	rt_err err = {0};
	ck_assert_int_eq(grace_init(&g, &kv, 16, 10000.0f, 4, &err), 0);
	struct k_grace_params p;
	k_grace_params_default(&p);
	struct k_grace_input in = { 0 };
	void *copy = malloc(kv.mem_bytes);
	memcpy(copy, kv.mem, kv.mem_bytes);
	p.x = 0.5;
	ck_assert_int_eq(k_grace_compress(&g.k, &kv, &p, &in, NULL, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "gracekv: compression factor"));
	p.x = 16.0;
	p.recent = 32; /* 32 × 6 entries > 64 × 6 / 16 */
	ck_assert_int_eq(k_grace_compress(&g.k, &kv, &p, &in, NULL, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "recent window"));
	p.recent = 2;
	in.prefix = 40;
	in.suffix = 30;
	ck_assert_int_eq(k_grace_compress(&g.k, &kv, &p, &in, NULL, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "prefix"));
	in.prefix = in.suffix = 0;
	kv.heads[4].count[7] = 3.0f;
	ck_assert_int_eq(k_grace_compress(&g.k, &kv, &p, &in, NULL, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "merged"));
	kv.heads[4].count[7] = 1.0f;
	ck_assert_int_eq(memcmp(copy, kv.mem, kv.mem_bytes), 0); /* unchanged on error */
	/* no context at all (prefix + suffix = n): nothing to compress, store unchanged */
	in.prefix = 40;
	in.suffix = 24;
	struct k_grace_stats st;
	ck_assert_int_eq(k_grace_compress(&g.k, &kv, &p, &in, &st, &err), 0);
	ck_assert_int_eq(st.b_total, 0);
	ck_assert_int_eq(memcmp(copy, kv.mem, kv.mem_bytes), 0);
	/* an empty store */
	rt_kv_reset(&kv);
	in.prefix = in.suffix = 0;
	ck_assert_int_eq(k_grace_compress(&g.k, &kv, &p, &in, &st, &err), 0);
	ck_assert_int_eq(rt_kv_entries(&kv), 0);
	free(copy);
	grace_free(&g);
	rt_kv_free(&kv);
}
END_TEST

/* ---- segmentation --------------------------------------------------------------------- */

START_TEST(test_segment_turn)
{
	/* a trajectory moving along e1 for tokens 0..49, then along e2: the cut is at 50 */
	const int E = 8;
	const int32_t n = 100;
	float hd[100 * 8];
	rng_seed(6);
	for (int32_t i = 0; i < n; i++)
		for (int e = 0; e < E; e++) {
			float v = 0.01f * rnd();
			if (e == 0)
				v += (float)(i < 50 ? i : 49);
			if (e == 1)
				v += (float)(i < 50 ? 0 : i - 49);
			hd[i * E + e] = v;
		}
	struct k_segment_params sp;
	k_segment_params_default(&sp);
	double *work = malloc(k_segment_work(n, E, 2, sp.n_win) * sizeof(double));
	const float *hl[2] = { hd, hd };
	int32_t seg[100];
	float bnd[100];
	rt_err err = {0};
	int32_t k = k_segment(&sp, n, E, 2, hl, NULL, work, bnd, seg, &err);
	ck_assert_int_eq(k, 2);
	ck_assert_int_eq(seg[0], 0);
	ck_assert_int_eq(seg[1], 50);
	for (int32_t i = 0; i + 1 < n; i++)
		if (i != 49)
			ck_assert(bnd[i] < bnd[49]);
	/* a straight line with a surprisal spike on token 70: the cut moves to 70 */
	for (int32_t i = 0; i < n; i++)
		for (int e = 0; e < E; e++)
			hd[i * E + e] = (e == 0 ? (float)i : 0.0f) + 0.01f * rnd();
	float sur[100];
	for (int32_t i = 0; i < n; i++)
		sur[i] = 2.0f + 0.1f * rnd();
	sur[70] = 12.0f;
	k = k_segment(&sp, n, E, 1, hl, sur, work, NULL, seg, &err);
	ck_assert_int_eq(k, 2);
	ck_assert_int_eq(seg[1], 70);
	/* fewer than 16 tokens: one segment */
	k = k_segment(&sp, 15, E, 1, hl, NULL, work, NULL, seg, &err);
	ck_assert_int_eq(k, 1);
	ck_assert_int_eq(seg[0], 0);
	ck_assert_int_eq(k_segment(&sp, 0, E, 1, hl, NULL, work, NULL, seg, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "gracekv segment"));
	free(work);
}
END_TEST

START_TEST(test_segment_bounds)
{
	/* random walks of several lengths: every segment length lies in [16, 128] */
	const int E = 12;
	const int32_t lens[] = { 16, 17, 31, 129, 257, 1000 };
	struct k_segment_params sp;
	k_segment_params_default(&sp);
	rng_seed(7);
	for (int li = 0; li < 6; li++) {
		const int32_t n = lens[li];
		float *hd = malloc((size_t)n * E * sizeof(float));
		float *sur = malloc((size_t)n * sizeof(float));
		float x[12] = { 0 };
		for (int32_t i = 0; i < n; i++) {
			for (int e = 0; e < E; e++) {
				x[e] += rnd();
				hd[(size_t)i * E + e] = x[e];
			}
			sur[i] = 5.0f * (rnd() + 1.0f);
		}
		double *work = malloc(k_segment_work(n, E, 1, sp.n_win) * sizeof(double));
		int32_t *seg = malloc((size_t)n * sizeof(int32_t));
		const float *hl[1] = { hd };
		rt_err err = {0};
		int32_t k = k_segment(&sp, n, E, 1, hl, sur, work, NULL, seg, &err);
		ck_assert_msg(k >= 1, "%s", err.msg);
		ck_assert_int_eq(seg[0], 0);
		for (int32_t i = 0; i < k; i++) {
			int32_t len = (i + 1 < k ? seg[i + 1] : n) - seg[i];
			ck_assert_msg(len >= 16 && len <= 128, "n %d: segment %d has %d tokens", n, i, len);
		}
		if (n >= 257)
			ck_assert(k >= 3);
		free(seg);
		free(work);
		free(sur);
		free(hd);
	}
}
END_TEST

/* ---- the compiled policy's run (k_grace_apply, k_grace_run) --------------------------- */

/* A synthetic prompt trace for a store of L layers × G·R query heads of d dims and n
 * positions: 2 sampled layers (0 and L-1) whose hidden states move along e0 until
 * position `turn`, then along e1 (plus noise); flat surprisal; random tail queries except
 * the last n_q positions, whose queries in every layer and head point at the key of
 * context entry `target` of that head (scaled to dominate the softmax). */
typedef struct syn_trace {
	struct kvp_trace tr;
	float *hid, *q, *q_tail, *sur;
} syn_trace;

static void syn_trace_make(syn_trace *t, const rt_kv *kv, int32_t n, int32_t turn, int32_t n_q,
                           int32_t target)
{
	const int L = kv->n_layer, G = kv->n_kv_head, R = kv->group, d = kv->head_dim;
	const int H = G * R, E = H * d;
	const int32_t cap = kv->cap;
	memset(t, 0, sizeof *t);
	t->hid = calloc((size_t)2 * cap * E, sizeof(float));
	t->q = calloc((size_t)2 * cap * H * d, sizeof(float));
	t->q_tail = calloc((size_t)L * KVP_TRACE_TAIL * H * d, sizeof(float));
	t->sur = calloc((size_t)cap, sizeof(float));
	for (int s = 0; s < 2; s++)
		for (int32_t i = 0; i < n; i++)
			for (int e = 0; e < E; e++) {
				float v = 0.01f * rnd();
				if (e == 0)
					v += (float)(i < turn ? i : turn - 1);
				if (e == 1)
					v += (float)(i < turn ? 0 : i - turn + 1);
				t->hid[((size_t)s * cap + i) * E + e] = v;
			}
	for (size_t i = 0; i < (size_t)2 * cap * H * d; i++)
		t->q[i] = rnd();
	for (int32_t i = 0; i < n; i++)
		t->sur[i] = i == 0 ? 0.0f : 2.0f + 0.1f * rnd();
	const int32_t ts = n > KVP_TRACE_TAIL ? n - KVP_TRACE_TAIL : 0;
	for (int l = 0; l < L; l++)
		for (int32_t p = ts; p < n; p++)
			for (int hq = 0; hq < H; hq++) {
				float *q = t->q_tail + (((size_t)l * KVP_TRACE_TAIL + (size_t)(p - ts)) * H + hq) * d;
				const rt_kv_head *h = &kv->heads[l * G + hq / R];
				for (int i = 0; i < d; i++)
					q[i] = p >= n - n_q ? 12.0f * h->k[(size_t)target * d + i] : 0.3f * rnd();
			}
	t->tr.n = n;
	t->tr.cap = cap;
	t->tr.n_layer = L;
	t->tr.n_embd = E;
	t->tr.n_head = H;
	t->tr.head_dim = d;
	t->tr.n_sample = 2;
	t->tr.sample_layer[0] = 0;
	t->tr.sample_layer[1] = L - 1;
	t->tr.hid = t->hid;
	t->tr.q = t->q;
	t->tr.tail_start = ts;
	t->tr.tail_n = n - ts;
	t->tr.q_tail = t->q_tail;
	t->tr.surprisal = t->sur;
}

static void syn_trace_free(syn_trace *t)
{
	free(t->hid);
	free(t->q);
	free(t->q_tail);
	free(t->sur);
}

/* 64-byte aligned scratch of n bytes */
static void *scratch_new(size_t n)
{
	return aligned_alloc(64, (n + 63) & ~(size_t)63);
}

/* Reference hop row for the glue's multi-hop flow, written independently: the attention
 * of the query at position src (trace->q of each sampled layer, every query head) over the
 * keys at positions 0..src of that layer's store, softmax in double, averaged. */
struct ref_hop {
	const syn_trace *st;
	const rt_kv *kv;
};

static void ref_hop_row(void *user, int32_t src, float *row)
{
	const struct ref_hop *u = user;
	const rt_kv *kv = u->kv;
	const int G = kv->n_kv_head, R = kv->group, d = kv->head_dim, H = G * R;
	const int32_t n = kv->heads[0].n;
	float *lg = malloc((size_t)(src + 1) * sizeof(float));
	for (int32_t t = 0; t < n; t++)
		row[t] = 0.0f;
	for (int s = 0; s < u->st->tr.n_sample; s++)
		for (int hq = 0; hq < H; hq++) {
			const float *q = u->st->tr.q + (((size_t)s * u->st->tr.cap + src) * H + hq) * d;
			const rt_kv_head *h = &kv->heads[u->st->tr.sample_layer[s] * G + hq / R];
			float mx = -INFINITY;
			double z = 0.0;
			for (int32_t t = 0; t <= src; t++) {
				double x = 0.0;
				for (int i = 0; i < d; i++)
					x += (double)q[i] * h->k[(size_t)t * d + i];
				lg[t] = (float)(x * (1.0 / sqrt((double)d)));
				mx = lg[t] > mx ? lg[t] : mx;
			}
			for (int32_t t = 0; t <= src; t++)
				z += exp((double)lg[t] - mx);
			for (int32_t t = 0; t <= src; t++)
				row[t] += (float)(exp((double)lg[t] - mx) / z);
		}
	for (int32_t t = 0; t <= src; t++)
		row[t] /= (float)(u->st->tr.n_sample * H);
	free(lg);
}

/* test_glue_plumbing's fixed sizes: n tokens with a turn at 60, nq probes, the probed
 * token at 30, 2 sinks, head_dim 16; budget 40 entries per head. */
enum { GLUE_N = 120, GLUE_TURN = 60, GLUE_NQ = 6, GLUE_TARGET = 30, GLUE_SINKS = 2, GLUE_D = 16 };

/* One run of test_glue_plumbing: the shape, 1 or 2 hops, tuned: every value a .kvp file
 * can set away from its default, fixed: fixed slots (`segment = slots(32 tokens)`). */
typedef struct glue_run {
	int run, hops, tuned, fixed;
	shape sh;
} glue_run;

/* The glue's configuration for run gr (what the .kvp file of that run would give). */
static void glue_cfg(struct k_grace_cfg *c, const glue_run *gr)
{
	const int run = gr->run, hops = gr->hops, tuned = gr->tuned, fixed = gr->fixed;
	const int32_t nq = GLUE_NQ, sinks = GLUE_SINKS;
	k_grace_cfg_default(c);
	c->budget = 40;
	c->sinks = sinks;
	c->recent = 8;
	c->slot = 32;
	c->floor = 1;
	c->probe = nq;
	c->hops = hops;
	if (tuned) {
		c->seg.min_len = 10;
		c->seg.max_len = 40;
		c->seg.cut = 1.5;
		c->seg.length = 2.0;
		c->seg.stability = 0.25;
		c->seg.surprisal = 0.5;
		c->seg.n_win = 2;
		c->seg.win[0] = 3;
		c->seg.win[1] = 6;
		c->seg_fixed = fixed;
		c->floor = 2;
		c->floor_each = !(run == 4); /* `keep singletons 2 entries over all` */
		c->count_mode = K_PROTO_COUNT_N;
		c->smooth = 0.3;
		c->lambda_z = 0.5;
		c->lambda_m = 2.0;
	}
}

/* What k_grace_apply reported (info) and kept (kv; ref: the store before it) for run gr:
 * the prefix, the probes, segments starting at the prefix with lengths in range and a cut
 * at the turn, the budget, the probed token kept bit for bit in every head. */
static void glue_check_info(const struct k_grace_info *info, const rt_kv *kv,
                            const rt_kv *ref, const glue_run *gr)
{
	const int tuned = gr->tuned, fixed = gr->fixed, LG = gr->sh.L * gr->sh.G, d = GLUE_D;
	const int32_t n = GLUE_N, turn = GLUE_TURN, nq = GLUE_NQ, target = GLUE_TARGET;
	const int32_t sinks = GLUE_SINKS;
	ck_assert_int_eq(info->prefix, sinks);
	ck_assert_int_eq(info->suffix, 0);
	ck_assert_int_eq(info->used_trace, 1);
	ck_assert_int_eq(info->n_probe, nq);
	/* segments: start at the prefix, lengths in [slot/4, 2·slot] (tuned: [10, 40]), a
	 * cut at the turn; fixed slots: none from the trace */
	ck_assert_int_eq(info->n_seg, fixed ? 0 : info->n_seg);
	ck_assert_int_ge(info->n_seg, fixed ? 0 : 2);
	int cut_at_turn = fixed;
	for (int k = 0; k < info->n_seg; k++) {
		int32_t e = k + 1 < info->n_seg ? info->seg_start[k + 1] : n;
		ck_assert_int_eq(info->seg_start[0], sinks);
		ck_assert_int_ge(e - info->seg_start[k], tuned ? 10 : 8);
		ck_assert_int_le(e - info->seg_start[k], tuned ? 40 : 64);
		cut_at_turn |= info->seg_start[k] == turn;
	}
	ck_assert_msg(cut_at_turn, "no segment starts at the turn (position %d)", (int)turn);
	/* the budget covers every entry: L·G·40 in all, the sinks among them */
	ck_assert_int_eq(rt_kv_entries(kv), (int64_t)LG * 40);
	ck_assert_int_eq(info->st.b_total, (int64_t)LG * (40 - sinks));
	/* the probed token is the floor of every head, kept bit for bit */
	for (int lg = 0; lg < LG; lg++) {
		const rt_kv_head *h = &kv->heads[lg], *r = &ref->heads[lg];
		int found = 0;
		for (int32_t i = 0; i < h->n; i++)
			found |= h->pos[i] == target && h->count[i] == 1.0f &&
			         memcmp(h->k + (size_t)i * d, r->k + (size_t)target * d, d * sizeof(float)) == 0;
		ck_assert_msg(found, "head %d lost the probed token", lg);
		ck_assert_int_eq(h->pos[0], 0);
		ck_assert_int_eq(h->pos[1], 1);
	}
}

/* The oracle for run gr: the core (k_grace_compress) on the reference store ref with the
 * input built here by hand from the same trace st (prefix = the sinks, segments from the
 * sampled hidden states, the probes' queries), which must keep exactly what the glue
 * kept in kv. */
static void glue_oracle(rt_kv *ref, const rt_kv *kv, const syn_trace *st,
                        const struct k_grace_info *info, const glue_run *gr)
{
	const int run = gr->run, hops = gr->hops, tuned = gr->tuned, fixed = gr->fixed;
	const int L = gr->sh.L, G = gr->sh.G, R = gr->sh.R, LG = L * G, d = GLUE_D;
	const int32_t n = GLUE_N, nq = GLUE_NQ, sinks = GLUE_SINKS;
	rt_err err = {0};
	struct k_segment_params sp;
	k_segment_params_default(&sp);
	sp.target_len = 32;
	sp.min_len = tuned ? 10 : 8;
	sp.max_len = tuned ? 40 : 64;
	if (tuned) {
		sp.cut = 1.5;
		sp.length = 2.0;
		sp.stability = 0.25;
		sp.surprisal = 0.5;
		sp.n_win = 2;
		sp.win[0] = 3;
		sp.win[1] = 6;
	}
	const int E = G * R * d;
	const float *hl[2] = { st->hid + (size_t)sinks * E, st->hid + ((size_t)128 + sinks) * E };
	double *work = malloc(k_segment_work(n, E, 2, 4) * sizeof(double));
	int32_t seg[128];
	float bound[128] = { 0 };
	int32_t k = k_segment(&sp, n - sinks, E, 2, hl, st->sur + sinks, work, bound + sinks,
	                             seg, &err);
	ck_assert_int_eq(k, fixed ? k : info->n_seg);
	for (int i = 0; i < k; i++) {
		seg[i] += sinks;
		ck_assert_int_eq(seg[i], fixed ? seg[i] : info->seg_start[i]);
	}
	float *pq = malloc((size_t)LG * nq * R * d * sizeof(float));
	int32_t ppos[6];
	for (int l = 0; l < L; l++)
		for (int g = 0; g < G; g++)
			for (int u = 0; u < nq; u++)
				for (int r = 0; r < R; r++)
					for (int i = 0; i < d; i++)
						pq[((((size_t)l * G + g) * nq + u) * R + r) * d + i] =
						        st->q_tail[(((size_t)l * KVP_TRACE_TAIL + (size_t)(n - nq + u)) * G * R +
						                   (size_t)g * R + r) * d + i];
	for (int u = 0; u < nq; u++)
		ppos[u] = n - nq + u;
	grace_t g;
	ck_assert_int_eq(grace_init(&g, ref, 0, 1.0f, KVP_TRACE_TAIL, &err), 0);
	struct k_grace_params gp;
	k_grace_params_default(&gp);
	gp.x = (double)LG * (n - sinks) / ((double)LG * (40 - sinks) + 0.5);
	gp.recent = 8;
	gp.floor = LG;
	gp.floor_each = 1;
	gp.seg_len = 32;
	gp.key_mode = K_PROTO_KEY_POST;
	gp.lambda_graph = hops > 1 ? 0.3 : 0.0;
	gp.hops = hops - 1;
	if (tuned) {
		gp.floor = 2 * LG;
		gp.floor_each = !(run == 4);
		gp.count_mode = K_PROTO_COUNT_N;
		gp.smooth = 0.3;
		gp.lambda_z = 0.5;
		gp.lambda_m = 2.0;
	}
	struct k_grace_input in = { 0 };
	struct ref_hop rh = { st, ref };
	if (hops > 1) {
		in.hop_attn = ref_hop_row;
		in.hop_user = &rh;
	}
	in.prefix = sinks;
	in.seg_start = fixed ? NULL : seg;
	in.n_seg = fixed ? 0 : k;
	in.boundary = fixed ? NULL : bound;
	in.probe_q = pq;
	in.probe_pos = ppos;
	in.n_probe = nq;
	struct k_grace_stats gst;
	ck_assert_msg(k_grace_compress(&g.k, ref, &gp, &in, &gst, &err) == 0, "%s", err.msg);
	for (int lg = 0; lg < LG; lg++) {
		const rt_kv_head *a = &kv->heads[lg], *b = &ref->heads[lg];
		ck_assert_int_eq(a->n, b->n);
		ck_assert_int_eq(memcmp(a->pos, b->pos, (size_t)a->n * sizeof(int32_t)), 0);
		ck_assert_int_eq(memcmp(a->k, b->k, (size_t)a->n * d * sizeof(float)), 0);
		ck_assert_int_eq(memcmp(a->v, b->v, (size_t)a->n * d * sizeof(float)), 0);
		ck_assert_int_eq(memcmp(a->count, b->count, (size_t)a->n * sizeof(float)), 0);
	}
	grace_free(&g);
	free(pq);
	free(work);
}

START_TEST(test_glue_plumbing)
{
	/* The glue against the core called directly with an input built here by hand from
	 * the same trace: prefix = the 2 sink tokens, segments of the context from the
	 * sampled hidden states (the turn at position 60 must be a cut), probes = the last 6
	 * positions' queries of every layer, budget 40 entries per head over everything. */
	/* runs 4 and 5: every value a .kvp file can set (segment, tree, add_split) away from
	 * its default, on both sides; run 5 with fixed slots (`segment = slots(32 tokens)`) */
	for (int run = 0; run < 6; run++) {
		const int si = run % 2;
		const glue_run gr = { run, run < 2 || run > 3 ? 1 : 2, run >= 4, run == 5, shapes[si] };
		const int L = gr.sh.L, G = gr.sh.G, R = gr.sh.R, LG = L * G, d = GLUE_D;
		const int32_t n = GLUE_N;
		rt_kv kv, ref;
		make_store(&kv, L, G, R, d, d, n, 128, 70 + si);
		make_store(&ref, L, G, R, d, d, n, 128, 70 + si);
		for (int lg = 0; lg < LG; lg++)
			for (int32_t i = 0; i < n; i++)
				kv.heads[lg].span[i] = ref.heads[lg].span[i] = 0;
		rng_seed(80 + si);
		syn_trace st;
		syn_trace_make(&st, &kv, n, GLUE_TURN, GLUE_NQ, GLUE_TARGET);
		struct kvp_ctx ctx;
		memset(&ctx, 0, sizeof ctx);
		ctx.seen = n;
		ctx.prompt_len = n;
		ctx.prompt_done = 1;
		ctx.trace = &st.tr;
		struct k_grace_cfg c;
		glue_cfg(&c, &gr);
		size_t len = k_grace_apply_bytes(&kv);
		void *mem = scratch_new(len);
		struct k_grace_info info;
		rt_err err = {0};
		ck_assert_msg(k_grace_apply(&ctx, &kv, &c, mem, len, &info, &err) == 0, "%s", err.msg);
		glue_check_info(&info, &kv, &ref, &gr);
		glue_oracle(&ref, &kv, &st, &info, &gr);
		free(mem);
		syn_trace_free(&st);
		rt_kv_free(&ref);
		rt_kv_free(&kv);
	}
}
END_TEST

/* score for k_grace_run: the key norm of each entry, the same for every query head */
static void score_knorm(const struct kvp_ctx *ctx, const rt_kv *kv, const rt_kv_head *h, int layer,
                        int r, float *out, float *tmp, double *vec)
{
	(void)ctx;
	(void)layer;
	(void)r;
	(void)tmp;
	(void)vec;
	for (int32_t i = 0; i < h->n; i++) {
		double s = 0.0;
		for (int j = 0; j < kv->head_dim; j++)
			s += (double)h->k[(size_t)i * kv->head_dim + j] * h->k[(size_t)i * kv->head_dim + j];
		out[i] = (float)sqrt(s);
	}
}

/* What the generated compress of a GraceKV policy hands k_grace_run at the prompt end of
 * n tokens: ctx (the trace tr, NULL for none; a scratch sized for kv, the caller frees
 * ctx->scratch), cfg (the key-norm score score_knorm when scored, summed over the group) and
 * gc (the kernel's defaults, then the budget in entries per head, 8 recent entries, slots of
 * 16 tokens, 4 probes). */
static void glue_prompt_end(struct kvp_ctx *ctx, struct k_compress_cfg *cfg,
                            struct k_grace_cfg *gc, const rt_kv *kv, int32_t n,
                            const struct kvp_trace *tr, int scored, double budget)
{
	memset(ctx, 0, sizeof *ctx);
	ctx->seen = n;
	ctx->prompt_len = n;
	ctx->prompt_done = 1;
	ctx->trace = tr;
	memset(cfg, 0, sizeof *cfg);
	cfg->name = "t";
	cfg->has_score = scored;
	cfg->reduce = K_REDUCE_SUM;
	cfg->n_tmp = 1;
	k_grace_cfg_default(gc);
	gc->budget = budget;
	gc->recent = 8;
	gc->slot = 16;
	gc->probe = 4;
	ctx->scratch_len = k_grace_scratch_bytes(kv, 1);
	ctx->scratch = scratch_new(ctx->scratch_len);
}

START_TEST(test_glue_x1_and_spans)
{
	/* Compression 1 (budget = the prompt) through k_grace_run, the code the generated
	 * compress calls, with and without a score and a trace: the store is bit-identical.
	 * Then spans: `system` at 10..14 (inside the context) is kept exactly, `question`
	 * at the end is the uncharged-in-the-core suffix. */
	for (int si = 0; si < 2; si++)
		for (int mode = 0; mode < 3; mode++) {
			const shape sh = shapes[si];
			const int L = sh.L, G = sh.G, R = sh.R, LG = L * G, d = 16;
			const int32_t n = 100;
			rt_kv kv;
			make_store(&kv, L, G, R, d, d, n, n, 90 + si);
			for (int lg = 0; lg < LG; lg++)
				for (int32_t i = 0; i < n; i++)
					kv.heads[lg].span[i] = i >= 10 && i < 15 ? 1 : i >= n - 7 ? 2 : 0;
			void *copy = malloc(kv.mem_bytes);
			memcpy(copy, kv.mem, kv.mem_bytes);
			rng_seed(100 + si);
			syn_trace st;
			syn_trace_make(&st, &kv, n, 40, 4, 50);
			const char *names[3] = { NULL, "system", "question" };
			const char *const prot[2] = { "system", "question" };
			struct kvp_ctx ctx;
			struct k_compress_cfg cfg;
			struct k_grace_cfg gc;
			glue_prompt_end(&ctx, &cfg, &gc, &kv, n, mode >= 1 ? &st.tr : NULL, mode == 2, n);
			ctx.span_names = names;
			ctx.n_spans = 2;
			gc.spans = prot;
			gc.n_spans = 2;
			rt_err err = {0};
			ck_assert_msg(k_grace_run(&ctx, &kv, &cfg, mode == 2 ? score_knorm : NULL, &gc, &err) == 0,
			              "%s", err.msg);
			ck_assert_int_eq(memcmp(copy, kv.mem, kv.mem_bytes), 0);
			/* x = 4 over everything: protected entries exact, total = budget */
			gc.budget = n / 4;
			ck_assert_msg(k_grace_run(&ctx, &kv, &cfg, mode == 2 ? score_knorm : NULL, &gc, &err) == 0,
			              "%s", err.msg);
			ck_assert_int_eq(rt_kv_entries(&kv), (int64_t)LG * (n / 4));
			const rt_kv_head *r0 = NULL;
			for (int lg = 0; lg < LG; lg++) {
				const rt_kv_head *h = &kv.heads[lg];
				int sys = 0, q = 0;
				for (int32_t i = 0; i < h->n; i++) {
					sys += h->span[i] == 1 && h->count[i] == 1.0f;
					q += h->span[i] == 2 && h->count[i] == 1.0f;
				}
				ck_assert_int_eq(sys, 5);
				ck_assert_int_eq(q, 7);
				ck_assert_int_eq(h->pos[h->n - 1], n - 1);
				r0 = h;
			}
			(void)r0;
			/* a second compress meets a compressed store: a clear error */
			ck_assert_int_eq(k_grace_run(&ctx, &kv, &cfg, NULL, &gc, &err), -1);
			ck_assert_ptr_nonnull(strstr(err.msg, "once"));
			free(ctx.scratch);
			free(copy);
			syn_trace_free(&st);
			rt_kv_free(&kv);
		}
}
END_TEST

/* A store of the layers layer[0..nl-1] of src (in that order): the same entries (keys,
 * values, positions, spans, statistics) appended to a fresh store. */
static void copy_layers(rt_kv *dst, const rt_kv *src, const int *layer, int nl)
{
	rt_err err = {0};
	const int G = src->n_kv_head, d = src->head_dim;
	ck_assert_int_eq(rt_kv_init(dst, nl, G, src->group, d, src->cap, src->stat_bytes, 0, &err), 0);
	for (int v = 0; v < nl; v++)
		for (int g = 0; g < G; g++) {
			const rt_kv_head *s = &src->heads[(size_t)layer[v] * G + g];
			rt_kv_head *h = rt_kv_head_at(dst, v, g);
			for (int32_t i = 0; i < s->n; i++) {
				int32_t e = rt_kv_append(dst, h, s->k + (size_t)i * d, s->v + (size_t)i * d, s->pos[i]);
				h->span[e] = s->span[i];
				memcpy(h->stats + (size_t)e * src->stat_bytes, s->stats + (size_t)i * src->stat_bytes,
				       src->stat_bytes);
			}
		}
}

/* The trace of st restricted to the layers layer[0..nl-1] (their tail queries, in that
 * order); hidden states, surprisal and sampled layers as st's. q_tail: caller's buffer. */
static struct kvp_trace trace_of_layers(const syn_trace *st, const int *layer, int nl, float *q_tail)
{
	struct kvp_trace tr = st->tr;
	const size_t row = (size_t)KVP_TRACE_TAIL * tr.n_head * tr.head_dim;
	for (int v = 0; v < nl; v++)
		memcpy(q_tail + (size_t)v * row, st->q_tail + (size_t)layer[v] * row, row * sizeof(float));
	tr.n_layer = nl;
	tr.q_tail = q_tail;
	tr.sample_layer[0] = 0;
	tr.sample_layer[1] = nl - 1;
	return tr;
}

/* Are heads a and b (of stores ka, kb) the same list: entries, positions, counts, keys,
 * values, spans, statistics? */
static void assert_same_head(const rt_kv *ka, const rt_kv_head *a, const rt_kv *kb,
                             const rt_kv_head *b)
{
	const size_t d = (size_t)ka->head_dim;
	ck_assert_int_eq(a->n, b->n);
	ck_assert_int_eq(kb->stat_bytes, ka->stat_bytes);
	for (int32_t i = 0; i < a->n; i++) {
		ck_assert_int_eq(a->pos[i], b->pos[i]);
		ck_assert_float_eq(a->count[i], b->count[i]);
		ck_assert_int_eq(a->span[i], b->span[i]);
		ck_assert_int_eq(memcmp(a->k + i * d, b->k + i * d, d * sizeof(float)), 0);
		ck_assert_int_eq(memcmp(a->v + i * d, b->v + i * d, d * sizeof(float)), 0);
		ck_assert_int_eq(memcmp(a->stats + i * ka->stat_bytes, b->stats + i * ka->stat_bytes,
		                        ka->stat_bytes), 0);
	}
}

START_TEST(test_glue_window_layers)
{
	/* A model with sliding-window layers (Gemma 3: five of six): after a prompt longer than
	 * the window, a window layer's lists hold only the newest w positions (the model's
	 * window_trim), the other layers the whole prompt. k_grace_run competes per layer group:
	 * the result must equal GraceKV run on a store of the full layers alone and on a store
	 * of the window layer alone (positions n-w..n-1), with and without a trace and a score,
	 * at a budget below the window (the window layer compressed too) and above it (kept
	 * as the window holds it). Before the groups, k_grace_score asserted equal lengths. */
	const int32_t n = 100, w = 40;
	const int full[2] = { 0, 2 }, win[1] = { 1 };
	for (int si = 0; si < 2; si++)
		for (int mode = 0; mode < 3; mode++)
			for (int bi = 0; bi < 2; bi++) {
				const int G = shapes[si].G, R = shapes[si].R, d = 16;
				const double budget = bi == 0 ? n / 4 : 50;
				rt_kv kv, ka, kb;
				make_store(&kv, 3, G, R, d, d, n, n, 130 + si);
				rng_seed(140 + si);
				syn_trace st; /* before the window cut: it reads every layer's keys */
				syn_trace_make(&st, &kv, n, 40, 4, 70);
				int32_t keep[100];
				for (int32_t i = 0; i < w; i++)
					keep[i] = n - w + i;
				for (int g = 0; g < G; g++)
					rt_kv_head_keep(&kv, rt_kv_head_at(&kv, 1, g), keep, w);
				copy_layers(&ka, &kv, full, 2);
				copy_layers(&kb, &kv, win, 1);
				float *qa = malloc((size_t)2 * KVP_TRACE_TAIL * G * R * d * sizeof(float));
				float *qb = malloc((size_t)KVP_TRACE_TAIL * G * R * d * sizeof(float));
				struct kvp_trace ta = trace_of_layers(&st, full, 2, qa);
				struct kvp_trace tb = trace_of_layers(&st, win, 1, qb);
				rt_kv *stores[3] = { &kv, &ka, &kb };
				const struct kvp_trace *traces[3] = { &st.tr, &ta, &tb };
				for (int k = 0; k < 3; k++) {
					struct kvp_ctx ctx;
					struct k_compress_cfg cfg;
					struct k_grace_cfg gc;
					glue_prompt_end(&ctx, &cfg, &gc, stores[k], n,
					                mode >= 1 ? traces[k] : NULL, mode == 2, budget);
					gc.sinks = 4;
					rt_err err = {0};
					ck_assert_msg(k_grace_run(&ctx, stores[k], &cfg, mode == 2 ? score_knorm : NULL,
					                          &gc, &err) == 0, "%s", err.msg);
					free(ctx.scratch);
				}
				/* each group holds its budget per head in all (the competition moves entries
				 * between heads), the window group at most its window */
				int64_t held_full = 0, held_win = 0;
				for (int g = 0; g < G; g++) {
					for (int v = 0; v < 2; v++) {
						const rt_kv_head *h = &kv.heads[(size_t)full[v] * G + g];
						held_full += h->n;
						ck_assert_int_eq(h->pos[0], 0); /* the sinks */
						assert_same_head(&kv, h, &ka, &ka.heads[(size_t)v * G + g]);
					}
					const rt_kv_head *h = &kv.heads[(size_t)G + g];
					held_win += h->n;
					ck_assert_int_ge(h->pos[0], n - w);
					ck_assert_int_eq(h->pos[h->n - 1], n - 1);
					assert_same_head(&kv, h, &kb, &kb.heads[g]);
				}
				ck_assert_int_eq(held_full, (int64_t)2 * G * (int32_t)budget);
				ck_assert_int_eq(held_win, (int64_t)G * (budget < w ? (int32_t)budget : w));
				free(qa);
				free(qb);
				syn_trace_free(&st);
				rt_kv_free(&kv);
				rt_kv_free(&ka);
				rt_kv_free(&kb);
			}
}
END_TEST

START_TEST(test_glue_errors)
{
	const int d = 16;
	rt_kv kv;
	make_store(&kv, 2, 3, 3, d, d, 64, 64, 110);
	struct kvp_ctx ctx;
	memset(&ctx, 0, sizeof ctx);
	ctx.seen = 64;
	ctx.prompt_len = 64;
	struct k_grace_cfg c;
	k_grace_cfg_default(&c);
	c.name = "gk";
	c.budget = 16;
	c.recent = 32;
	size_t len = k_grace_apply_bytes(&kv);
	void *mem = scratch_new(len);
	void *copy = malloc(kv.mem_bytes);
	memcpy(copy, kv.mem, kv.mem_bytes);
	rt_err err = {0};
	/* the recent window exceeds the budget (ratio 4 with recent 32) */
	ck_assert_int_eq(k_grace_apply(&ctx, &kv, &c, mem, len, NULL, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "policy gk: the budget (16 entries per head) is below the guards"));
	/* scratch too small */
	c.recent = 4;
	ck_assert_int_eq(k_grace_apply(&ctx, &kv, &c, mem, len - 1, NULL, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "bytes of scratch"));
	/* a trace of another shape */
	syn_trace st;
	rng_seed(111);
	syn_trace_make(&st, &kv, 64, 30, 4, 10);
	st.tr.head_dim = 8;
	ctx.trace = &st.tr;
	ck_assert_int_eq(k_grace_apply(&ctx, &kv, &c, mem, len, NULL, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "prompt trace"));
	ck_assert_int_eq(memcmp(copy, kv.mem, kv.mem_bytes), 0);
	/* k_grace_init_at: too little memory */
	struct k_grace g;
	ck_assert_int_eq(k_grace_init_at(&g, &kv, 0, 1.0f, 4, mem, 100, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "gracekv: scratch of 100 bytes"));
	syn_trace_free(&st);
	free(copy);
	free(mem);
	rt_kv_free(&kv);
}
END_TEST

START_TEST(test_init_at_equals_init)
{
	/* the core in caller memory (unaligned start) gives the store of the owned scratch */
	rt_kv a, b;
	make_store(&a, 2, 3, 3, 16, 16, 150, 160, 120);
	make_store(&b, 2, 3, 3, 16, 16, 150, 160, 120);
	grace_t ga;
	struct k_grace gb;
	rt_err err = {0};
	ck_assert_int_eq(grace_init(&ga, &a, 16, 10000.0f, 8, &err), 0);
	size_t len = k_grace_bytes(&b, 16, 8);
	ck_assert_uint_gt(len, 0);
	uint8_t *raw = malloc(len + 7);
	memset(raw, 0xA5, len + 7); /* not zeroed: init_at must not rely on zeros */
	ck_assert_int_eq(k_grace_init_at(&gb, &b, 16, 10000.0f, 8, raw + 7, len, &err), 0);
	struct k_grace_params p;
	k_grace_params_default(&p);
	p.x = 6.0;
	p.recent = 4;
	p.floor = 12;
	struct k_grace_input in = { 0 };
	in.prefix = 2;
	in.suffix = 5;
	struct k_grace_stats sa, sb;
	ck_assert_int_eq(k_grace_compress(&ga.k, &a, &p, &in, &sa, &err), 0);
	ck_assert_int_eq(k_grace_compress(&gb, &b, &p, &in, &sb, &err), 0);
	ck_assert_int_eq(sa.entries, sb.entries);
	for (int lg = 0; lg < 6; lg++) {
		ck_assert_int_eq(a.heads[lg].n, b.heads[lg].n);
		ck_assert_int_eq(memcmp(a.heads[lg].k, b.heads[lg].k, (size_t)a.heads[lg].n * 16 * sizeof(float)), 0);
		ck_assert_int_eq(memcmp(a.heads[lg].pos, b.heads[lg].pos, (size_t)a.heads[lg].n * sizeof(int32_t)), 0);
	}
	free(raw);
	grace_free(&ga);
	rt_kv_free(&a);
	rt_kv_free(&b);
}
END_TEST

START_TEST(test_coverage_share_and_floor_each)
{
	/* 9/3 shape, relevance concentrated in head (0, 0): with one global competition and
	 * a global floor that head takes most entries; with floor_each and head_share = 1
	 * every head holds the same number (its equal share), still B_total in all. */
	const int L = 2, G = 3, LG = 6;
	const int32_t n = 240;
	for (int mode = 0; mode < 2; mode++) {
		rt_kv kv;
		make_store(&kv, L, G, 3, 16, 16, n, n, 130);
		float *rel = malloc((size_t)LG * n * sizeof(float));
		for (int lg = 0; lg < LG; lg++)
			for (int32_t t = 0; t < n; t++)
				rel[lg * n + t] = lg == 0 ? (float)(1 + t % 7) * 100.0f : 1.0f;
		grace_t g;
		rt_err err = {0};
		ck_assert_int_eq(grace_init(&g, &kv, 16, 10000.0f, 4, &err), 0);
		struct k_grace_params p;
		k_grace_params_default(&p);
		p.x = 8.0;
		p.recent = 4;
		p.floor = 60;
		p.floor_each = mode;
		p.head_share = mode ? 1.0 : 0.0;
		struct k_grace_input in = { 0 };
		in.rel = rel;
		struct k_grace_stats st;
		ck_assert_msg(k_grace_compress(&g.k, &kv, &p, &in, &st, &err) == 0, "%s", err.msg);
		ck_assert_int_eq(rt_kv_entries(&kv), LG * n / 8);
		if (mode == 0) {
			ck_assert_int_gt(kv.heads[0].n, n / 8 + 10);
		} else {
			for (int lg = 0; lg < LG; lg++)
				ck_assert_int_eq(kv.heads[lg].n, n / 8);
		}
		free(rel);
		grace_free(&g);
		rt_kv_free(&kv);
	}
}
END_TEST

/* ---- through rt_seq with the runtime's trace: compression 1 equals the full cache ---- */

static const struct k_grace_cfg *g_seq_cfg;

static int seq_should(const struct kvp_ctx *ctx, const rt_kv *kv)
{
	(void)kv;
	return ctx->prompt_len >= 0 && ctx->seen == ctx->prompt_len && ctx->compress_count == 0;
}

static int32_t seq_next(const struct kvp_ctx *ctx, const rt_kv *kv)
{
	int32_t room = kv->cap - kv->heads[0].n;
	for (int g = 1; g < kv->n_layer * kv->n_kv_head; g++)
		if (kv->cap - kv->heads[g].n < room)
			room = kv->cap - kv->heads[g].n;
	if (ctx->prompt_len >= 0 && ctx->seen < ctx->prompt_len && ctx->prompt_len - ctx->seen < room)
		return (int32_t)(ctx->prompt_len - ctx->seen);
	return room;
}

static int seq_compress(const struct kvp_ctx *ctx, rt_kv *kv, rt_err *err)
{
	/* what the generated compress of an add_split policy does (kvpc emit) */
	struct k_compress_cfg cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.name = "grace_test";
	cfg.has_score = 1;
	cfg.reduce = K_REDUCE_SUM;
	cfg.n_tmp = 1;
	struct k_grace_cfg gc = *g_seq_cfg;
	gc.budget = ctx->ratio > 0 ? k_context(ctx, (double)ctx->seen) / ctx->ratio : gc.budget;
	ck_assert_ptr_nonnull(ctx->trace);
	ck_assert_int_eq(ctx->trace->n, ctx->prompt_len);
	return k_grace_run(ctx, kv, &cfg, score_knorm, &gc, err);
}

static size_t seq_scratch(const rt_kv *kv, int n_threads)
{
	(void)n_threads; /* k_grace_run works on the calling thread */
	return k_grace_scratch_bytes(kv, 1);
}

static const struct kvp_policy seq_policy = {
	.abi_version = KVP_ABI_VERSION,
	.name = "grace_test",
	.source = "tests/test_grace.c",
	.source_hash = "0000000000000000",
	.summary = "",
	.positions = KVP_POS_ORIGINAL,
	.needs = KVP_NEED_KEYS | KVP_NEED_VALUES | KVP_NEED_SPANS | KVP_NEED_PROMPT_LEN | KVP_NEED_TRACE,
	.should_compress = seq_should,
	.compress = seq_compress,
	.next_trigger = seq_next,
	.scratch_bytes = seq_scratch,
};

START_TEST(test_seq_ratio1_equals_full)
{
	/* tiny synthetic llama models 9/3 and 4/1; a 70-token prompt, then 10 tokens one by
	 * one. At ratio 1 the core keeps everything (bit-identical store), so every logit
	 * equals the full cache's; at ratio 4 it compresses to the budget and differs. */
	for (int si = 0; si < 2; si++) {
		const tiny_model_cfg c = tiny_model_gqa_cfg(si, 2, si == 0 ? 32 : 16, 4242u + (uint32_t)si);
		rt_err err = {0};
		rt_model *m = tiny_model_open(&c, &exact_opts, &err);
		ck_assert_msg(m != NULL, "%s", err.msg);
		const int64_t P = 70, T = 10;
		int32_t tok[80];
		unsigned sd = 9u + (unsigned)si;
		for (int i = 0; i < P + T; i++) {
			sd = sd * 1103515245u + 12345u;
			tok[i] = (int32_t)((sd >> 8) % 290u);
		}
		struct k_grace_cfg gc;
		k_grace_cfg_default(&gc);
		gc.recent = 4;
		gc.slot = 16;
		gc.floor = 2;
		gc.probe = 8;
		g_seq_cfg = &gc;
		const int V = m->hp.n_vocab;
		float *lf = malloc((size_t)V * sizeof(float)), *lg = malloc((size_t)V * sizeof(float));
		for (int ri = 0; ri < 2; ri++) {
			const double ratio = ri == 0 ? 1.0 : 4.0;
			rt_seq full, gs;
			ck_assert_msg(rt_seq_init(&full, m, &rt_policy_full, 96, 32, P, &err) == 0, "%s", err.msg);
			ck_assert_msg(rt_seq_init(&gs, m, &seq_policy, 96, 32, P, &err) == 0, "%s", err.msg);
			ck_assert_msg(rt_seq_set_ratio(&gs, ratio, &err) == 0, "%s", err.msg);
			ck_assert_int_eq(rt_seq_feed(&full, tok, P, NULL, RT_LOGITS_NONE, &err), 0);
			ck_assert_msg(rt_seq_feed(&gs, tok, P, NULL, RT_LOGITS_NONE, &err) == 0, "%s", err.msg);
			ck_assert_int_eq(rt_seq_stats_get(&gs).compress_events, 1);
			/* the budget over all heads: floor(L·G·P / ratio) entries */
			const int64_t LGm = (int64_t)m->hp.n_layer * m->hp.n_head_kv;
			ck_assert_int_eq(rt_kv_entries(&gs.kv), (int64_t)floor((double)LGm * P / ratio));
			double maxdiff = 0.0;
			for (int64_t t = 0; t < T; t++) {
				ck_assert_int_eq(rt_seq_feed(&full, tok + P + t, 1, lf, RT_LOGITS_LAST, &err), 0);
				ck_assert_int_eq(rt_seq_feed(&gs, tok + P + t, 1, lg, RT_LOGITS_LAST, &err), 0);
				for (int v = 0; v < V; v++) {
					double dd = fabs((double)lf[v] - lg[v]);
					maxdiff = dd > maxdiff ? dd : maxdiff;
				}
			}
			if (ri == 0)
				ck_assert_msg(maxdiff == 0.0, "ratio 1: logits differ from the full cache by %g", maxdiff);
			else
				ck_assert_msg(maxdiff > 1e-4, "ratio 4: logits equal the full cache (nothing compressed?)");
			rt_seq_free(&gs);
			rt_seq_free(&full);
		}
		free(lf);
		free(lg);
		rt_model_free(m);
	}
}
END_TEST

/* ---- the compiler side: add_split reaches the core ---------------------------------- */

/* Emit the policy of .kvp file path as C; NULL (and the diagnostics on stderr) when it
 * does not compile. *n_err receives the number of errors. */
static char *emit_file(const char *path, unsigned *needs, int *n_err)
{
	char e[256];
	kvp_src *src = kvp_src_open(path, e, sizeof e);
	ck_assert_msg(src != NULL, "%s", e);
	struct kvp_ir ir;
	*n_err = kvp_compile(src, &ir);
	char *buf = NULL;
	if (*n_err == 0) {
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);
		struct kvp_emit_opts o = { 1, "gracekv.c" };
		ck_assert_int_eq(kvp_emit_c(&ir, &o, f), 0);
		fclose(f);
		*needs = ir.needs;
		kvp_ir_free(&ir);
	}
	kvp_src_free(src);
	return buf;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	size_t got = fread(b, 1, (size_t)n, f);
	b[got] = 0;
	fclose(f);
	return b;
}

static void spit(const char *path, const char *s)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	fputs(s, f);
	fclose(f);
}

START_TEST(test_emit_gracekv)
{
	/* policies/gracekv.kvp compiles to a compress that calls k_grace_run (the core) and
	 * asks for the prompt trace; the C is deterministic, matches the golden
	 * (KVPC_UPDATE_GOLDEN=1 rewrites it) and compiles with -Werror */
	unsigned needs = 0;
	int ne = 0;
	char *a = emit_file("policies/gracekv.kvp", &needs, &ne);
	ck_assert_int_eq(ne, 0);
	char *b = emit_file("policies/gracekv.kvp", &needs, &ne);
	ck_assert_str_eq(a, b);
	ck_assert_uint_eq(needs & KVP_NEED_TRACE, KVP_NEED_TRACE);
	ck_assert_uint_eq(needs & KVP_NEED_PROMPT_LEN, KVP_NEED_PROMPT_LEN);
	ck_assert_ptr_nonnull(strstr(a, "return k_grace_run(ctx, kv, &cfg, score_q, &gc, err);"));
	ck_assert_ptr_nonnull(strstr(a, "return k_grace_scratch_bytes(kv, "));
	ck_assert_ptr_nonnull(strstr(a, "KVP_NEED_TRACE"));
	ck_assert_ptr_null(strstr(a, "k_compress_run("));
	const char *gp = "tests/golden/emit/gracekv.c.golden";
	if (getenv("KVPC_UPDATE_GOLDEN"))
		spit(gp, a);
	char *g = slurp(gp);
	ck_assert_msg(g != NULL, "missing golden %s (run with KVPC_UPDATE_GOLDEN=1)", gp);
	ck_assert_msg(strcmp(a, g) == 0, "%s differs from the emitter output", gp);
	char dir[] = "/tmp/kvpc_grace_XXXXXX";
	ck_assert_ptr_nonnull(mkdtemp(dir));
	char cpath[128], opath[128], cmd[512];
	snprintf(cpath, sizeof cpath, "%s/gracekv.c", dir);
	snprintf(opath, sizeof opath, "%s/gracekv.o", dir);
	spit(cpath, a);
	snprintf(cmd, sizeof cmd,
	         "%s -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Iruntime -Ikernels -c %s -o %s 2>&1",
	         getenv("CC") ? getenv("CC") : "cc", cpath, opath);
	ck_assert_int_eq(system(cmd), 0);
	unlink(cpath);
	unlink(opath);
	rmdir(dir);
	free(g);
	free(a);
	free(b);
}
END_TEST

START_TEST(test_emit_grace_statements)
{
	/* every value of `segment`, `tree`, `action = add_split(...)` and `keep singletons`
	 * reaches the struct k_grace_cfg the generated compress fills (a parameter stays a
	 * parameter); left out, the kernel's default (k_grace_cfg_default) stands */
	static const char *const src[2] = {
		"policy v {\n    param tgt = 48 tokens\n    budget = 10%\n"
		"    stat a = sum(attn) over prompt tail 16 tokens\n    score = flow(a, hops = 1)\n"
		"    allocate = global\n    action = add_split(mass = 2, numerator = 0.5)\n"
		"    segment = curvature(target = tgt, min = 12 tokens, max = 96 tokens, cut = 2, length = 1, stability = 0.75, surprisal = 0, windows = [3 tokens, 5 tokens])\n"
		"    tree = prototypes(key = post, count = members, smooth = 0)\n"
		"    keep singletons 4 entries\n    compress at prompt end\n}\n",
		"policy w {\n    budget = 10%\n    stat a = sum(attn) over prompt tail 16 tokens\n"
		"    score = flow(a, hops = 1)\n    allocate = global\n    action = add_split\n"
		"    segment = slots(32 tokens)\n    keep singletons 2 entries over all\n"
		"    compress at prompt end\n}\n",
	};
	static const char *const want[2][14] = {
		{ "gc->lambda_z = 2.0;", "gc->lambda_m = 0.5;", "gc->slot = P[0];",
		  "gc->seg.min_len = (int)(12.0);", "gc->seg.max_len = (int)(96.0);", "gc->seg.cut = 2.0;",
		  "gc->seg.length = 1.0;", "gc->seg.stability = 0.75;", "gc->seg.surprisal = 0.0;",
		  "gc->count_mode = K_PROTO_COUNT_N;", "gc->smooth = 0.0;", "gc->floor = 4.0;",
		  "gc->seg.n_win = 2;", "gc->seg.win[1] = 5;" },
		{ "gc->slot = 32.0;", "gc->seg_fixed = 1;", "gc->floor = 2.0;", "gc->floor_each = 0;", NULL },
	};
	for (int i = 0; i < 2; i++) {
		char path[128];
		snprintf(path, sizeof path, "tests/tmp/test_grace_stmt_%d_%d.kvp", (int)getpid(), i);
		spit(path, src[i]);
		unsigned needs = 0;
		int ne = 0;
		char *c = emit_file(path, &needs, &ne);
		unlink(path);
		ck_assert_msg(ne == 0 && c != NULL, "policy %d does not compile", i);
		for (int j = 0; j < 14 && want[i][j]; j++)
			ck_assert_msg(strstr(c, want[i][j]), "policy %d: no `%s` in the emitted C", i, want[i][j]);
		ck_assert_ptr_null(strstr(c, i == 0 ? "gc->seg_fixed" : "gc->seg.cut"));
		ck_assert_ptr_null(strstr(c, i == 0 ? "gc->smooth = 0.1" : "gc->count_mode"));
		ck_assert_ptr_null(strstr(c, i == 0 ? "gc->floor_each" : "gc->smooth"));
		free(c);
	}
}
END_TEST

START_TEST(test_check_add_split)
{
	/* kvpc check: add_split needs one compression of the whole prompt with original
	 * positions, and a group-before-pool order */
	const char *bad[][2] = {
		{ "compress at prompt end", "compress every 8 steps" },
		{ "positions = original", "positions = compacted" },
		{ "group = sum", "group = sum after pool" },
		/* GraceKV's statements: the values are checked, and they need add_split */
		{ "action = add_split(mass = 1, numerator = 1)", "action = add_split(slot = 64 tokens)" },
		{ "action = add_split(mass = 1, numerator = 1)", "action = add_split(mass = -1)" },
		{ "min = 16 tokens", "min = 100 tokens" },
		{ "max = 128 tokens", "max = 20 tokens" },
		{ "cut = 3", "cut = 3 tokens" },
		{ "windows = [2 tokens, 4 tokens, 8 tokens]", "windows = [2 tokens, 4 tokens, 8 tokens, 16 tokens, 32 tokens]" },
		{ "windows = [2 tokens, 4 tokens, 8 tokens]", "windows = [question]" },
		{ "key = post", "key = rope" },
		{ "count = coherence", "count = many" },
		{ "smooth = 0.1", "smooth = -0.1" },
		{ "keep singletons 16 entries", "keep singletons 16 steps" },
		{ "action = add_split(mass = 1, numerator = 1)", "action = merge(run = 4 tokens)" },
	};
	const int n_bad = (int)(sizeof bad / sizeof bad[0]);
	char *orig = slurp("policies/gracekv.kvp");
	ck_assert_ptr_nonnull(orig);
	for (int i = 0; i < n_bad; i++) {
		char *at = strstr(orig, bad[i][0]);
		ck_assert_ptr_nonnull(at);
		size_t pre = (size_t)(at - orig);
		char *mut = malloc(strlen(orig) + 64);
		memcpy(mut, orig, pre);
		strcpy(mut + pre, bad[i][1]);
		strcat(mut, at + strlen(bad[i][0]));
		char path[128];
		snprintf(path, sizeof path, "tests/tmp/test_grace_%d_%d.kvp", (int)getpid(), i);
		spit(path, mut);
		unsigned needs = 0;
		int ne = 0;
		char *c = emit_file(path, &needs, &ne);
		ck_assert_msg(ne > 0 && c == NULL, "mutation %d (%s) was accepted", i, bad[i][1]);
		unlink(path);
		free(mut);
	}
	free(orig);
}
END_TEST

static Suite *grace_suite(void)
{
	Suite *s = suite_create("grace");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_rope_roundtrip);
	tcase_add_test(tc, test_merge_identical_keys);
	tcase_add_test(tc, test_exact_case_attention);
	tcase_add_test(tc, test_key_and_count_modes);
	tcase_add_test(tc, test_heap_order_and_ties);
	tcase_add_test(tc, test_split_beats_add);
	tcase_add_test(tc, test_x1_exact);
	tcase_add_test(tc, test_budget_exact);
	tcase_add_test(tc, test_singleton_floor);
	tcase_add_test(tc, test_probe_relevance_and_hops);
	tcase_add_test(tc, test_errors);
	tcase_add_test(tc, test_segment_turn);
	tcase_add_test(tc, test_segment_bounds);
	tcase_add_test(tc, test_init_at_equals_init);
	tcase_add_test(tc, test_coverage_share_and_floor_each);
	tcase_add_test(tc, test_glue_plumbing);
	tcase_add_test(tc, test_glue_x1_and_spans);
	tcase_add_test(tc, test_glue_window_layers);
	tcase_add_test(tc, test_glue_errors);
	tcase_add_test(tc, test_seq_ratio1_equals_full);
	tcase_add_test(tc, test_emit_gracekv);
	tcase_add_test(tc, test_check_add_split);
	tcase_add_test(tc, test_emit_grace_statements);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	mkdir("tests/tmp", 0755); /* scratch models and sources of the compiled-path tests */
	int failed = check_run(grace_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
