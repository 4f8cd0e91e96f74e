/*
 * test_seq: one sequence under one policy (runtime/policy/rt_seq.c) and the shared command line
 * (runtime/cli/), on tiny synthetic models (tests/support/tiny_model.h) with the
 * grouped-query shapes 9q/3kv, 4q/1kv and 4q/4kv. Checked:
 *   - an evicted cache gives the same logits as dense attention over exactly the kept
 *     entries at their positions: an independent naive forward in double (own RMSNorm,
 *     adjacent-pair RoPE, softmax, SwiGLU) replays the text token by token, each query
 *     attending only to the positions the policy run kept (recorded after every step),
 *     with keys rotated at their original positions (h2o, tova: original convention) or
 *     at their index among the kept entries with the query at its own index
 *     (streaming_llm: compacted convention), and after SnapKV's prompt-end compression
 *     for the decode tokens, to 1e-5 relative;
 *   - for EVERY policy of the registry (every policies/NAME.kvp) plus the built-in full policy:
 *     one feed call == token-by-token == internal chunks 1, 3, 7 and 5 (which divides no
 *     budget used), identical kept sets (positions and counts per head) and logits to
 *     1e-5;
 *   - a second sequence after rt_seq_reset equals a fresh one (all policy state reset);
 *   - a policy's init_entries runs on every appended entry before observe sees it, once
 *     per entry and head, and observe gets no probabilities unless the policy asks;
 *   - budget edges: ratios that leave 0 or 1 entries, a ratio equal to the text; prompts
 *     one under, equal to, one over and far over a sliding window keep exactly the last
 *     min(n, W) positions;
 *   - memory: under h2o at ratio 4, resident entries after every step stay within
 *     budget + chunk per head and kv_bytes_peak within (budget + chunk) x bytes per entry
 *     x heads; and rt_seq_feed allocates nothing: malloc/calloc/realloc/aligned_alloc/
 *     posix_memalign are wrapped at link time (-Wl,--wrap, see the Makefile rule) and
 *     counted around feeding;
 *   - the command line (rt_cli_main with argv, stdout and stderr captured): unknown
 *     policy, unknown --set name, a non-numeric --set value, --ratio below 1 or on a
 *     policy that never compresses, a bad --depths list, an unknown command exit 2; a
 *     text that is not UTF-8 and a missing model exit 1, each with one clear line; every
 *     --help exits 0; `ppl --json` carries the KL statistics, memory figures and hashes,
 *     its compression at --ratio 2 is 2, and the full policy's ppl equals the reference
 *     ppl of the policy run; needle, run and info --json work end to end.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/rt_cli.h"
#include "eval/rt_eval.h"
#include "kv/rt_kvbytes.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "policy/rt_policy.h"
#include "policy/rt_seq.h"
#include "serve/rt_serve.h"
#include "support/tiny_model.h"
#include "support/check_run.h"

/* the exact path: these tests compare against f32 references */
static const rt_model_opts exact_opts = { .exact = 1, .threads = 0 };

/* ---- allocation counting (link with -Wl,--wrap=malloc,...) ----------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t sz);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);

static long g_allocs;

void *__wrap_malloc(size_t n)
{
	g_allocs++;
	return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t sz)
{
	g_allocs++;
	return __real_calloc(n, sz);
}

void *__wrap_realloc(void *p, size_t n)
{
	g_allocs++;
	return __real_realloc(p, n);
}

void *__wrap_aligned_alloc(size_t a, size_t n)
{
	g_allocs++;
	return __real_aligned_alloc(a, n);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
	g_allocs++;
	return __real_posix_memalign(p, a, n);
}

/* ---- fixtures ------------------------------------------------------------------------- */

#define N_TOK 48
#define PROMPT 32

static tiny_model_cfg shape_cfg(int shape)
{
	/* shape 0: 9q/3kv head_dim 32; 1: 4q/1kv head_dim 32; 2: 4q/4kv head_dim 32 (the
	 * precision tiers' codes need a multiple of 32) */
	/* n_ctx 160: kvzip replays the 32-token prompt after its instruction at positions
	 * 32 .. 108 (runtime/policy/rt_replay.h) */
	tiny_model_cfg c = { .n_layer = 2, .n_ff = 96, .n_vocab = 300, .n_ctx = 160,
		             .rope_base = 10000.0f, .seed = 777u + (uint32_t)shape,
		             .wtype = RT_GGML_F32 };
	if (shape == 0)
		c.n_head = 9, c.n_head_kv = 3, c.n_embd = 288;
	else if (shape == 1)
		c.n_head = 4, c.n_head_kv = 1, c.n_embd = 128;
	else
		c.n_head = 4, c.n_head_kv = 4, c.n_embd = 128;
	return c;
}

static char g_model_path[4][256]; /* shapes 0..2, and 3: shape 1 with a 1024-token context */

static const char *model_path(int shape)
{
	return g_model_path[shape];
}

static rt_model *load_shape(int shape)
{
	rt_err err = { "" };
	rt_model *m = rt_model_open(model_path(shape), &exact_opts, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	return m;
}

static void test_tokens(int32_t *t, int n, int vocab, unsigned seed)
{
	for (int i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		t[i] = (int32_t)((seed >> 8) % (unsigned)vocab);
	}
}

/* The library policies the every-policy tests run on the tiny models: the registry less
 * any policy whose linear scorer (linear_score(), KVP_NEED_HIDDEN) was trained for another
 * model's shape, which rt_seq_init refuses on these models (hidden_scorer_refused checks
 * that; test_kvpc_emit runs linear_score() with scorers made for the tiny shapes).
 * Filled by lib_init before the suite is built. */
static const struct kvp_policy *g_lib[1000];
static int g_lib_n;

static void lib_init(void)
{
	g_lib_n = 0;
	for (int i = 0; i < kvp_registry_count && g_lib_n < 1000; i++)
		if (!(kvp_registry[i]->needs & KVP_NEED_HIDDEN))
			g_lib[g_lib_n++] = kvp_registry[i];
}

static const struct kvp_policy *find_policy(const char *name)
{
	if (!strcmp(name, "full") && !rt_registry_find(kvp_registry, kvp_registry_count, name))
		return &rt_policy_full;
	const struct kvp_policy *p = rt_registry_find(kvp_registry, kvp_registry_count, name);
	ck_assert_msg(p != NULL, "policy %s is not in the registry", name);
	return p;
}

/* Scale a library policy down so that it compresses within N_TOK tokens of a tiny model
 * (its defaults are sized for 4k-token contexts): every parameter counted in entries,
 * tokens or steps gets a small value by its role (sinks 2; recent, window and question
 * 4; blocks 8; budgets 12) when that is below its default; ratios and scalars keep
 * theirs, except the extras below, and a tiered policy's `capacity` share is 0.5 (12.5%
 * of 32 tokens' bytes cannot hold sinks 2 + recent 4). Works for policies added to
 * policies/ later. */
static void scale_down(rt_seq *s, const struct kvp_policy *p)
{
	static const struct {
		const char *policy, *set;
	} extras[] = { { "gracekv", "capacity=0.5" },
	               /* funnel: layer 0 keeps half the budget, which must hold the recent 4 */
	               { "scissorhands", "capacity=0.3" }, { "scissorhands_whole", "capacity=0.3" } };
	rt_err err = { "" };
	for (int i = 0; i < p->n_params; i++) {
		const struct kvp_param *q = &p->params[i];
		if (q->unit != KVP_UNIT_ENTRIES && q->unit != KVP_UNIT_TOKENS && q->unit != KVP_UNIT_STEPS)
			continue;
		double v = strstr(q->name, "sink") ? 2
		         : strstr(q->name, "recent") || strstr(q->name, "window") ||
		                   strstr(q->name, "question") ? 4
		         : strstr(q->name, "block") ? 8 : 12;
		if (v >= q->def)
			continue;
		char a[96];
		snprintf(a, sizeof a, "%s=%g", q->name, v);
		ck_assert_msg(rt_seq_set(s, a, &err) == 0, "%s", err.msg);
	}
	for (size_t i = 0; i < sizeof extras / sizeof extras[0]; i++)
		if (!strcmp(extras[i].policy, p->name))
			ck_assert_msg(rt_seq_set(s, extras[i].set, &err) == 0, "%s", err.msg);
	for (int i = 0; (p->needs & KVP_NEED_TIERS) && i < p->n_params; i++)
		if (!strcmp(p->params[i].name, "capacity"))
			ck_assert_msg(rt_seq_set(s, "capacity=0.5", &err) == 0, "%s", err.msg);
}

static void seq_open(rt_seq *s, const rt_model *m, const struct kvp_policy *p, int32_t cap,
                     int chunk, int64_t prompt_len)
{
	rt_err err = { "" };
	ck_assert_msg(rt_seq_init(s, m, p, cap, chunk, prompt_len, &err) == 0, "%s", err.msg);
	scale_down(s, p);
}

static void feed_ok(rt_seq *s, const int32_t *t, int64_t n, float *logits)
{
	rt_err err = { "" };
	ck_assert_msg(rt_seq_feed(s, t, n, logits, logits ? RT_LOGITS_ALL : RT_LOGITS_NONE, &err) == 0,
	              "%s", err.msg);
}

/* ---- the naive reference: dense attention over given position sets ----------------------- */

/* kept[l][j] after token t: positions (ascending) of head (l, j) */
typedef struct kept_log {
	int L, J;
	int32_t *n;    /* [N_TOK × L × J] */
	int32_t *pos;  /* [N_TOK × L × J × N_TOK] */
	float *count;  /* same shape */
} kept_log;

static void kept_record(kept_log *k, const rt_seq *s, int t)
{
	for (int l = 0; l < k->L; l++)
		for (int j = 0; j < k->J; j++) {
			const rt_kv_head *h = &s->kv.heads[l * k->J + j];
			size_t at = ((size_t)t * k->L + l) * k->J + j;
			k->n[at] = h->n;
			memcpy(k->pos + at * N_TOK, h->pos, (size_t)h->n * sizeof(int32_t));
			memcpy(k->count + at * N_TOK, h->count, (size_t)h->n * sizeof(float));
		}
}

static void rmsnorm_d(double *y, const double *x, const float *w, int n, double eps)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	double sc = 1.0 / sqrt(ss / n + eps);
	for (int i = 0; i < n; i++)
		y[i] = x[i] * sc * w[i];
}

/* y[out] = W[out × in] x[in] */
static void matvec_d(double *y, const float *W, const double *x, int out, int in)
{
	for (int o = 0; o < out; o++) {
		double s = 0;
		for (int i = 0; i < in; i++)
			s += (double)W[(size_t)o * in + i] * x[i];
		y[o] = s;
	}
}

static void rope_d(double *v, double pos, int n_rot, double base)
{
	for (int i = 0; i < n_rot / 2; i++) {
		double th = pos * pow(base, -2.0 * i / n_rot);
		double x0 = v[2 * i], x1 = v[2 * i + 1];
		v[2 * i] = x0 * cos(th) - x1 * sin(th);
		v[2 * i + 1] = x0 * sin(th) + x1 * cos(th);
	}
}

/* Logits after each token t of toks[0..n) where the query of token t at (l, j) sees the
 * positions kept after token t-1 (log k, index t-1) plus t itself. compacted: keys are
 * rotated at their index in that visible list, the query at its own index. */
static void ref_logits(const rt_model *m, const int32_t *toks, int n, const kept_log *k,
                       int compacted, double *out /* [n × V] */)
{
	const rt_model_hparams *hp = &m->hp;
	const int E = hp->n_embd, F = hp->n_ff, HQ = hp->n_head, J = hp->n_head_kv;
	const int G = hp->group, hd = hp->head_dim, L = hp->n_layer, V = hp->n_vocab;
	double *kraw = calloc((size_t)L * J * n * hd, sizeof(double));
	double *vals = calloc((size_t)L * J * n * hd, sizeof(double));
	double *x = malloc((size_t)E * sizeof *x), *xn = malloc((size_t)E * sizeof *xn);
	double *q = malloc((size_t)HQ * hd * sizeof *q), *kk = malloc((size_t)J * hd * sizeof *kk);
	double *vv = malloc((size_t)J * hd * sizeof *vv), *att = malloc((size_t)HQ * hd * sizeof *att);
	double *tmp = malloc((size_t)(E > F ? E : F) * sizeof *tmp);
	double *g = malloc((size_t)F * sizeof *g), *u = malloc((size_t)F * sizeof *u);
	double *sc = malloc((size_t)n * sizeof *sc), *key = malloc((size_t)hd * sizeof *key);
	int32_t *vis = malloc((size_t)n * sizeof *vis);
	for (int t = 0; t < n; t++) {
		for (int i = 0; i < E; i++)
			x[i] = m->tok_embd[(size_t)toks[t] * E + i];
		for (int l = 0; l < L; l++) {
			const rt_layer *W = &m->layers[l];
			rmsnorm_d(xn, x, W->attn_norm, E, hp->norm_eps);
			matvec_d(q, W->wq, xn, HQ * hd, E);
			matvec_d(kk, W->wk, xn, J * hd, E);
			matvec_d(vv, W->wv, xn, J * hd, E);
			for (int j = 0; j < J; j++) {
				memcpy(kraw + (((size_t)l * J + j) * n + t) * hd, kk + (size_t)j * hd,
				       (size_t)hd * sizeof(double));
				memcpy(vals + (((size_t)l * J + j) * n + t) * hd, vv + (size_t)j * hd,
				       (size_t)hd * sizeof(double));
				int nv = 0;
				if (t > 0) {
					size_t at = ((size_t)(t - 1) * L + l) * J + j;
					for (int i = 0; i < k->n[at]; i++) {
						ck_assert(k->count[at * N_TOK + i] == 1.0f);
						vis[nv++] = k->pos[at * N_TOK + i];
					}
				}
				vis[nv++] = t;
				for (int r = 0; r < G; r++) {
					double qh[256];
					memcpy(qh, q + (size_t)(j * G + r) * hd, (size_t)hd * sizeof(double));
					rope_d(qh, compacted ? nv - 1 : t, hp->n_rot, hp->rope_base);
					double mx = -INFINITY;
					for (int i = 0; i < nv; i++) {
						memcpy(key, kraw + (((size_t)l * J + j) * n + vis[i]) * hd,
						       (size_t)hd * sizeof(double));
						rope_d(key, compacted ? i : vis[i], hp->n_rot, hp->rope_base);
						double s = 0;
						for (int d = 0; d < hd; d++)
							s += qh[d] * key[d];
						sc[i] = s / sqrt((double)hd);
						mx = sc[i] > mx ? sc[i] : mx;
					}
					double sum = 0;
					for (int i = 0; i < nv; i++)
						sum += (sc[i] = exp(sc[i] - mx));
					double *o = att + (size_t)(j * G + r) * hd;
					for (int d = 0; d < hd; d++)
						o[d] = 0;
					for (int i = 0; i < nv; i++) {
						const double *vp = vals + (((size_t)l * J + j) * n + vis[i]) * hd;
						for (int d = 0; d < hd; d++)
							o[d] += sc[i] / sum * vp[d];
					}
				}
			}
			matvec_d(tmp, W->wo, att, E, HQ * hd);
			for (int i = 0; i < E; i++)
				x[i] += tmp[i];
			rmsnorm_d(xn, x, W->ffn_norm, E, hp->norm_eps);
			matvec_d(g, W->w_gate, xn, F, E);
			matvec_d(u, W->w_up, xn, F, E);
			for (int i = 0; i < F; i++)
				g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
			matvec_d(tmp, W->w_down, g, E, F);
			for (int i = 0; i < E; i++)
				x[i] += tmp[i];
		}
		rmsnorm_d(xn, x, m->out_norm, E, hp->norm_eps);
		matvec_d(out + (size_t)t * V, m->output, xn, V, E);
	}
	free(kraw), free(vals), free(x), free(xn), free(q), free(kk), free(vv), free(att);
	free(tmp), free(g), free(u), free(sc), free(key), free(vis);
}

static void evicted_equals_dense(const char *name, const char *const *sets, int shape,
                                 int expect_compacted, int64_t prompt_len)
{
	rt_model *m = load_shape(shape);
	const struct kvp_policy *p = find_policy(name);
	ck_assert_int_eq(p->positions == KVP_POS_COMPACTED, expect_compacted);
	const int L = m->hp.n_layer, J = m->hp.n_head_kv, V = m->hp.n_vocab;
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, V, 99u + (unsigned)shape);
	rt_seq s;
	rt_err err = { "" };
	ck_assert_msg(rt_seq_init(&s, m, p, N_TOK, 8, prompt_len, &err) == 0, "%s", err.msg);
	s.run.ctx.min_kv = KVP_MIN_KV_STRICT; /* evicting at 48 tokens: no `min` floor */
	for (const char *const *a = sets; *a; a++)
		ck_assert_msg(rt_seq_set(&s, *a, &err) == 0, "%s", err.msg);
	kept_log k = { .L = L, .J = J };
	k.n = calloc((size_t)N_TOK * L * J, sizeof *k.n);
	k.pos = calloc((size_t)N_TOK * L * J * N_TOK, sizeof *k.pos);
	k.count = calloc((size_t)N_TOK * L * J * N_TOK, sizeof *k.count);
	float *lg = malloc((size_t)N_TOK * V * sizeof *lg);
	for (int t = 0; t < N_TOK; t++) {
		feed_ok(&s, toks + t, 1, lg + (size_t)t * V);
		kept_record(&k, &s, t);
	}
	ck_assert_msg(rt_seq_stats_get(&s).compress_events > 0, "%s never compressed", name);
	ck_assert_int_lt(k.n[((size_t)(N_TOK - 1) * L) * J], N_TOK);
	double *ref = malloc((size_t)N_TOK * V * sizeof *ref);
	ref_logits(m, toks, N_TOK, &k, expect_compacted, ref);
	double worst = 0;
	for (size_t i = 0; i < (size_t)N_TOK * V; i++) {
		double e = fabs(lg[i] - ref[i]) / (1.0 + fabs(ref[i]));
		worst = e > worst ? e : worst;
	}
	ck_assert_msg(worst < 1e-5, "%s shape %d: logits differ from dense attention over the kept "
	              "entries by %g", name, shape, worst);
	free(ref), free(lg), free(k.n), free(k.pos), free(k.count);
	rt_seq_free(&s);
	rt_model_free(m);
}

/* Feed a (1 thread) and b (2 threads) the same N_TOK tokens, 8 at a time over the prompt
 * and then one by one: after every feed the kept positions (and in a tiered store their
 * tiers) of every (layer, KV head) are the same and the logits equal bit for bit. */
static void threads_feed_compare(rt_seq *a, rt_seq *b, const int32_t *toks, float *la, float *lb,
                                 const char *what)
{
	const int V = a->m->hp.n_vocab, H = a->kv.n_layer * a->kv.n_kv_head;
	int64_t t = 0;
	while (t < N_TOK) {
		const int64_t n = t < PROMPT ? 8 : 1;
		feed_ok(a, toks + t, n, la);
		feed_ok(b, toks + t, n, lb);
		t += n;
		ck_assert_msg(memcmp(la, lb, (size_t)n * V * sizeof *la) == 0,
		              "%s: logits differ with 2 threads after %lld tokens", what, (long long)t);
		for (int h = 0; h < H; h++) {
			const rt_kv_head *x = &a->kv.heads[h], *y = &b->kv.heads[h];
			ck_assert_int_eq(x->n, y->n);
			ck_assert_msg(memcmp(x->pos, y->pos, (size_t)x->n * sizeof *x->pos) == 0,
			              "%s: head %d keeps other positions with 2 threads after %lld tokens",
			              what, h, (long long)t);
			ck_assert_msg(memcmp(x->count, y->count, (size_t)x->n * sizeof *x->count) == 0,
			              "%s: head %d has other counts with 2 threads", what, h);
			for (int32_t e = 0; a->kv.tiered && e < x->n; e++)
				ck_assert_msg(rt_kv_tier_of(x, e) == rt_kv_tier_of(y, e),
				              "%s: head %d position %d at tier %d, %d with 2 threads", what,
				              h, x->pos[e], rt_kv_tier_of(x, e), rt_kv_tier_of(y, e));
		}
	}
	ck_assert_int_eq(rt_seq_stats_get(a).compress_events, rt_seq_stats_get(b).compress_events);
}

/* The thread count does not change what a policy keeps: on the fast path the KV heads of a
 * layer are attended and observed in parallel (observe_parallel), and compress scores,
 * selects and compacts the (layer, KV head) lists on the pool (kernels/k_compress.h), and
 * every head's result comes from the same operations whichever thread ran it. H2O and TOVA
 * at ratio 4 over a 32-token prompt (chunked prefill of 8, so several compresses cross
 * chunks) and 16 decode steps, then every library policy scaled down as in the chunking
 * tests (pooling, adaptive allocation, merges, key scores, position compaction), 1 thread
 * against 2: the same kept positions and counts after every feed and logits equal bit for
 * bit (as test_model's fast-path case finds for the forward alone). Shapes 9/3 on an f16
 * store (each thread decodes rows for the scores that read keys), 4/4 and 4/1 on f32. */
START_TEST(threads_same_kept_sets)
{
	static const int shapes[3] = { 0, 2, 1 };
	const int shape = shapes[_i];
	const enum rt_kv_type kt = _i == 0 ? RT_KV_F16 : RT_KV_F32;
	const rt_model_opts o1 = { .exact = 0, .threads = 1, .kv_type = kt };
	const rt_model_opts o2 = { .exact = 0, .threads = 2, .kv_type = kt };
	rt_err err = { "" };
	rt_model *m1 = rt_model_open(model_path(shape), &o1, &err);
	ck_assert_msg(m1 != NULL, "%s", err.msg);
	rt_model *m2 = rt_model_open(model_path(shape), &o2, &err);
	ck_assert_msg(m2 != NULL, "%s", err.msg);
	const int V = m1->hp.n_vocab;
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, V, 31u + (unsigned)shape);
	float *la = malloc((size_t)PROMPT * V * sizeof *la), *lb = malloc((size_t)PROMPT * V * sizeof *lb);
	for (int pi = -2; pi < g_lib_n; pi++) {
		const struct kvp_policy *p = pi == -2 ? find_policy("h2o") :
		                             pi == -1 ? find_policy("tova") : g_lib[pi];
		if (!p->compress || ((p->needs & KVP_NEED_F32_KV) && kt != RT_KV_F32))
			continue;
		rt_seq a, b;
		ck_assert_msg(rt_seq_init(&a, m1, p, N_TOK, 8, PROMPT, &err) == 0, "%s", err.msg);
		ck_assert_msg(rt_seq_init(&b, m2, p, N_TOK, 8, PROMPT, &err) == 0, "%s", err.msg);
		ck_assert_int_eq(b.fwd.n_att, 2); /* the parallel attention path is taken */
		ck_assert(b.fwd.observe_parallel);
		ck_assert_ptr_eq(b.run.ctx.pool, m2->pool); /* and compress gets the pool */
		rt_seq *both[2] = { &a, &b };
		for (int k = 0; k < 2; k++) {
			if (pi < 0) {
				ck_assert_msg(rt_seq_set_ratio(both[k], 4, &err) == 0, "%s", err.msg);
				ck_assert_msg(rt_seq_set_prefill_chunk(both[k], 8, &err) == 0, "%s", err.msg);
			} else {
				scale_down(both[k], p);
			}
		}
		char what[96];
		snprintf(what, sizeof what, "%s shape %d %s%s", p->name, shape,
		         rt_kv_type_name(kt), pi < 0 ? " ratio 4" : "");
		threads_feed_compare(&a, &b, toks, la, lb, what);
		ck_assert_msg(rt_seq_stats_get(&a).compress_events > (pi < 0 ? 1 : 0),
		              "%s: too few compressions", what);
		ck_assert(rt_seq_stats_get(&b).policy_seconds > 0);
		rt_seq_free(&a);
		rt_seq_free(&b);
	}
	free(la), free(lb);
	rt_model_free(m1);
	rt_model_free(m2);
}
END_TEST

/* serve's admission footprint (rt_serve_footprint) in entries per list, by hand for a
 * 64-token prompt and 16 generated tokens at ratio 8 with steps of 16 tokens.
 * Strict budgets (no floor): H2O (every step) holds ceil(80/8) = 10 entries at the end plus
 * the one its trigger lets a decode step add (11); with a prefill chunk C its prompt chunks
 * add up to min(C, 16) entries to the prompt's budget ceil(64/8) = 8 (C = 16: 24; C = 64 is
 * bounded by the step's 16: 24; C = 2: 10 < 11). SnapKV (prompt end) holds the whole prompt
 * whatever C (64); the full cache all 80.
 * Graceful budgets, what the policy really keeps: H2O's own floor (`min 64 tokens`) raises
 * ceil(80/8) = 10 to min(64, 80) = 64, so 65 at the end; with C = 2 the prompt's
 * min(64, 64) = 64 plus 2 is 66. SnapKV at min_kv 16, 64 generated tokens: ceil(64/8) = 8,
 * raised to the floor 16, then to its observation window (a guard, 32 tokens) that the
 * floor lets exceed the budget: 32 after the prompt-end compress, plus 64 decoded: 96
 * (ceil(64/8) + 64 = 72 and 16 + 64 = 80 would over-admit).
 * The probe leaves the sequence at its start with its prefill chunk. */
START_TEST(serve_footprint_prefill_chunk)
{
	rt_model *m = load_shape(0);
	rt_err err = { "" };
	const struct { const char *name; int32_t pf; double min_kv; int64_t gen, want; } cases[] = {
		{ "h2o", 0, KVP_MIN_KV_STRICT, 16, 11 }, { "h2o", 16, KVP_MIN_KV_STRICT, 16, 24 },
		{ "h2o", 64, KVP_MIN_KV_STRICT, 16, 24 }, { "h2o", 2, KVP_MIN_KV_STRICT, 16, 11 },
		{ "snapkv", 0, KVP_MIN_KV_STRICT, 16, 64 }, { "snapkv", 16, KVP_MIN_KV_STRICT, 16, 64 },
		{ "full", 16, KVP_MIN_KV_STRICT, 16, 80 },
		{ "h2o", 0, 0, 16, 65 }, { "h2o", 2, 0, 16, 66 }, { "snapkv", 0, 16, 64, 96 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const struct kvp_policy *p = find_policy(cases[i].name);
		rt_seq s;
		const int64_t N = 64 + cases[i].gen;
		ck_assert_msg(rt_seq_init(&s, m, p, (int32_t)N, 16, 64, &err) == 0, "%s", err.msg);
		s.run.ctx.min_kv = cases[i].min_kv;
		if (p->compress)
			ck_assert_msg(rt_seq_set_ratio(&s, 8, &err) == 0, "%s", err.msg);
		ck_assert_msg(rt_seq_set_prefill_chunk(&s, cases[i].pf, &err) == 0, "%s", err.msg);
		const int64_t f = rt_serve_footprint(&s, 64, cases[i].gen, 16);
		ck_assert_msg(f == cases[i].want, "%s prefill chunk %d min_kv %g: footprint %lld, "
		              "expected %lld", cases[i].name, (int)cases[i].pf, cases[i].min_kv,
		              (long long)f, (long long)cases[i].want);
		ck_assert_int_eq(rt_seq_seen(&s), 0);
		ck_assert_int_eq(s.run.prefill_chunk, cases[i].pf < 16 ? cases[i].pf : 16);
		ck_assert(s.run.ctx.in_force == NULL && s.run.ctx.prompt_len == 64);
		rt_seq_free(&s);
	}
	rt_model_free(m);
}
END_TEST

START_TEST(evicted_h2o_original)
{
	static const char *const none[] = { NULL };
	evicted_equals_dense("h2o", none, _i, 0, -1);
}
END_TEST

START_TEST(evicted_tova_original)
{
	static const char *const sets[] = { "states=9", NULL };
	evicted_equals_dense("tova", sets, _i, 0, -1);
}
END_TEST

START_TEST(evicted_streaming_compacted)
{
	static const char *const sets[] = { "sinks=3", "recent=7", NULL };
	evicted_equals_dense("streaming_llm", sets, _i, 1, -1);
}
END_TEST

START_TEST(evicted_snapkv_prompt_end)
{
	static const char *const sets[] = { "capacity=12", "window=4", NULL };
	evicted_equals_dense("snapkv", sets, _i, 0, PROMPT);
}
END_TEST

/* StreamingLLM (compacted positions) on a model whose layers all attend over a window
 * W = 8 (Mistral style): the window hides every entry 8 or more positions back, so with
 * recent >= W every entry a query sees is kept and the logits equal the full cache's (the
 * oracle: dense attention over the kept entries, which are the visible ones). The store
 * drops what the window hides (every list at most W - 1 entries after a chunk, where the
 * policy alone holds sinks + recent = 12), and the kept keys are re-rotated to their new
 * indices (without that the logits differ). Shapes 9/3 and 4/1, chunks of 1 and 5. */
START_TEST(compacted_window_trimmed)
{
	enum { W = 8, N = 40 };
	const int shape = _i % 2, chunk = _i < 2 ? 1 : 5;
	tiny_model_cfg c = shape_cfg(shape);
	c.n_swa = W;
	char path[256];
	snprintf(path, sizeof path, "tests/tmp/test_seq_swa_%d_%d.gguf", (int)getpid(), _i);
	ck_assert_int_eq(tiny_model_write(&c, path), 0);
	rt_err err = { "" };
	rt_model *m = rt_model_open(path, &exact_opts, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	unlink(path);
	rt_seq s, f;
	ck_assert_msg(rt_seq_init(&s, m, find_policy("streaming_llm"), N, chunk, -1, &err) == 0 &&
	              rt_seq_init(&f, m, &rt_policy_full, N, chunk, -1, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_seq_set(&s, "sinks=2", &err) == 0 && rt_seq_set(&s, "recent=10", &err) == 0,
	              "%s", err.msg);
	int32_t toks[N];
	test_tokens(toks, N, m->hp.n_vocab, 91u + (unsigned)_i);
	const int V = m->hp.n_vocab;
	float *a = malloc((size_t)chunk * V * sizeof *a), *b = malloc((size_t)chunk * V * sizeof *b);
	double worst = 0;
	for (int t = 0; t < N; t += chunk) {
		feed_ok(&s, toks + t, chunk, a);
		feed_ok(&f, toks + t, chunk, b);
		for (size_t k = 0; k < (size_t)chunk * V; k++)
			worst = fmax(worst, fabs((double)a[k] - b[k]));
		for (int hi = 0; hi < m->hp.n_layer * m->hp.n_head_kv; hi++)
			ck_assert_int_le(s.kv.heads[hi].n, W - 1);
	}
	ck_assert_msg(worst <= 1e-4, "streaming_llm under a window of %d: logits differ from the "
	              "full cache's by %g", W, worst);
	free(a), free(b);
	rt_seq_free(&s);
	rt_seq_free(&f);
	rt_model_free(m);
}
END_TEST

/* `positions compacted` on a narrow store: after each compress the runtime decodes every
 * kept key that moved, rotates it in f32 from the index it was rotated at to its new index
 * and stores it again (rt_seq.c seq_rerotate). StreamingLLM (sinks 3, recent 7, one token
 * per step: every step after the window fills moves the recent entries down by one) on
 * the fast path with an f16 store (shapes 9/3 and 4/1) and a q8_0 store (9/3; q8_0 needs
 * head_dim a multiple of 32). Reference: the key decoded before the step, rotated in
 * double by the index change (rope_d, the naive adjacent-pair RoPE above). The stored key
 * must equal it within one rounding to the store's type (runtime/kv/rt_kvq.h): f16 2^-11
 * relative (2^-25 absolute below its normal range), q8_0 0.0044 of its block's largest
 * magnitude (plus 127 · 2^-25 below f16's normal range for the scale), each with 2^-23
 * relative for the f32 rotation; a key that did not move must be unchanged, bit for bit.
 * That the check has teeth: moved keys are counted, and some differ from the unrotated
 * decoded key by more than the bound. */
START_TEST(compacted_rerotation_narrow_store)
{
	static const int shapes[3] = { 0, 1, 0 };
	const int shape = shapes[_i];
	const enum rt_kv_type kt = _i == 2 ? RT_KV_Q8_0 : RT_KV_F16;
	const rt_model_opts o = { .exact = 0, .threads = 1, .kv_type = kt };
	rt_err err = { "" };
	rt_model *m = rt_model_open(model_path(shape), &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	const int H = m->hp.n_layer * m->hp.n_head_kv, hd = m->hp.head_dim, n_rot = m->hp.n_rot;
	rt_seq s;
	ck_assert_msg(rt_seq_init(&s, m, find_policy("streaming_llm"), N_TOK, 8, -1, &err) == 0,
	              "%s", err.msg);
	ck_assert_msg(rt_seq_set(&s, "sinks=3", &err) == 0 && rt_seq_set(&s, "recent=7", &err) == 0,
	              "%s", err.msg);
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 57u + (unsigned)shape);
	int32_t *ppos = malloc((size_t)H * N_TOK * sizeof *ppos), *pn = calloc((size_t)H, sizeof *pn);
	float *pkey = malloc((size_t)H * N_TOK * hd * sizeof *pkey), *buf = malloc((size_t)hd * sizeof *buf);
	double *ref = malloc((size_t)hd * sizeof *ref);
	long moved = 0, rotated_far = 0;
	for (int t = 0; t < N_TOK; t++) {
		feed_ok(&s, toks + t, 1, NULL);
		for (int hi = 0; hi < H; hi++) {
			rt_kv_head *h = &s.kv.heads[hi];
			for (int32_t j = 0; j < h->n; j++) {
				int32_t i = 0; /* the entry's index before this step */
				while (i < pn[hi] && ppos[(size_t)hi * N_TOK + i] != h->pos[j])
					i++;
				const float *now = rt_kv_key(&s.kv, h, j, buf);
				if (i == pn[hi])
					continue; /* appended this step */
				const float *was = pkey + ((size_t)hi * N_TOK + i) * hd;
				ck_assert_int_le(j, i);
				if (j == i) {
					ck_assert_msg(memcmp(now, was, (size_t)hd * sizeof *now) == 0,
					              "%s: head %d entry %d changed without moving",
					              rt_kv_type_name(kt), hi, j);
					continue;
				}
				moved++;
				for (int d = 0; d < hd; d++)
					ref[d] = was[d];
				rope_d(ref, (double)j - i, n_rot, m->hp.rope_base);
				int far = 0;
				for (int d = 0; d < hd; d++) {
					double amax = 0; /* q8_0: the largest magnitude of d's block of 32 */
					for (int e = d / 32 * 32; e < d / 32 * 32 + 32 && e < hd; e++)
						amax = fabs(ref[e]) > amax ? fabs(ref[e]) : amax;
					const double tol = kt == RT_KV_F16 ?
					        fabs(ref[d]) * (0x1p-11 + 0x1p-23) + 0x1p-25 :
					        0.0044 * amax + fabs(ref[d]) * 0x1p-23 + 127 * 0x1p-25;
					ck_assert_msg(fabs(now[d] - ref[d]) <= tol,
					              "%s shape %d: head %d entry %d (position %d, index %d -> %d) "
					              "element %d: %.9g, the f32 re-rotation gives %.9g (bound %.3g)",
					              rt_kv_type_name(kt), shape, hi, j, h->pos[j], i, j, d,
					              (double)now[d], ref[d], tol);
					far |= fabs(was[d] - ref[d]) > 4 * tol;
				}
				rotated_far += far;
			}
			pn[hi] = h->n;
			for (int32_t j = 0; j < h->n; j++) {
				ppos[(size_t)hi * N_TOK + j] = h->pos[j];
				const float *k = rt_kv_key(&s.kv, h, j, buf);
				memcpy(pkey + ((size_t)hi * N_TOK + j) * hd, k, (size_t)hd * sizeof *k);
			}
		}
	}
	ck_assert_int_gt(moved, (long)H * (N_TOK - 11) * 6);
	ck_assert_int_gt(rotated_far, moved / 2);
	free(ppos), free(pn), free(pkey), free(buf), free(ref);
	rt_seq_free(&s);
	rt_model_free(m);
}
END_TEST

/* ---- chunked == token-by-token for every policy ----------------------------------------- */

typedef struct run_out {
	float *logits;     /* [N_TOK × V] */
	int32_t *n;        /* [L × J] */
	int32_t *pos;      /* [L × J × N_TOK] */
	float *count;
	int64_t compress_events;
} run_out;

/* A head's kept (position, count) pairs into pp, cc ([h->n] each) in increasing position:
 * kept sets compare by position, since a compaction moves tail entries into evicted slots
 * and the entry order depends on when compactions ran (runtime/kv/rt_kv.h). */
static void kept_by_pos(const rt_kv_head *h, int32_t *pp, float *cc)
{
	for (int32_t e = 0; e < h->n; e++) { /* insertion sort by position */
		int32_t j = e;
		while (j > 0 && pp[j - 1] > h->pos[e]) {
			pp[j] = pp[j - 1];
			cc[j] = cc[j - 1];
			j--;
		}
		pp[j] = h->pos[e];
		cc[j] = h->count[e];
	}
}

static void run_collect(const rt_model *m, const struct kvp_policy *p, int chunk, int calls_of,
                        const int32_t *toks, run_out *o, rt_seq *reuse)
{
	const int H = m->hp.n_layer * m->hp.n_head_kv, V = m->hp.n_vocab;
	rt_seq local, *s = reuse ? reuse : &local;
	if (!reuse)
		seq_open(s, m, p, N_TOK, chunk, PROMPT);
	o->logits = malloc((size_t)N_TOK * V * sizeof(float));
	for (int t = 0; t < N_TOK; t += calls_of) {
		int c = N_TOK - t < calls_of ? N_TOK - t : calls_of;
		feed_ok(s, toks + t, c, o->logits + (size_t)t * V);
	}
	o->n = malloc((size_t)H * sizeof *o->n);
	o->pos = calloc((size_t)H * N_TOK, sizeof *o->pos);
	o->count = calloc((size_t)H * N_TOK, sizeof *o->count);
	for (int i = 0; i < H; i++) {
		const rt_kv_head *h = &s->kv.heads[i];
		o->n[i] = h->n;
		int32_t *pp = o->pos + (size_t)i * N_TOK;
		kept_by_pos(h, pp, o->count + (size_t)i * N_TOK);
		/* the entries, the position map and the tokens-seen counter agree; no position
		 * is held twice */
		for (int32_t e = 0; e < h->n; e++) {
			ck_assert_int_lt(pp[e], (int32_t)rt_seq_seen(s));
			if (e)
				ck_assert_int_lt(pp[e - 1], pp[e]);
		}
	}
	ck_assert_int_eq(rt_seq_seen(s), N_TOK);
	o->compress_events = rt_seq_stats_get(s).compress_events;
	if (!reuse)
		rt_seq_free(s);
}

static void run_free(run_out *o)
{
	free(o->logits), free(o->n), free(o->pos), free(o->count);
}

/* The logit tolerance of expect_same for policy p: 3e-5 (only the GEMM row counts differ,
 * so only OpenBLAS's summation order: measured up to 1.2e-5 with the kernels it picks on
 * an AMD EPYC; the earlier machines stayed under 1e-5),
 * or 5e-2 for a policy with precision tiers: a quantised code is a discontinuous function
 * of its input, so a key that differs in its last f32 bit between two chunkings can land on
 * the next code of its grid (one step is 1/255 of the group's range at 8 bits, 1/3 at 2);
 * measured: up to 6e-3 at 8 bits on these models. Kept sets and compress events must still
 * be identical. */
static double logit_tol(const struct kvp_policy *p)
{
	return p->needs & KVP_NEED_TIERS ? 5e-2 : 3e-5;
}

static void expect_same(const rt_model *m, const char *what, const run_out *a, const run_out *b,
                        double tol)
{
	const int H = m->hp.n_layer * m->hp.n_head_kv, V = m->hp.n_vocab;
	for (int i = 0; i < H; i++) {
		ck_assert_msg(a->n[i] == b->n[i], "%s: head %d keeps %d vs %d entries", what, i, a->n[i],
		              b->n[i]);
		for (int e = 0; e < a->n[i]; e++) {
			ck_assert_msg(a->pos[(size_t)i * N_TOK + e] == b->pos[(size_t)i * N_TOK + e],
			              "%s: head %d entry %d at position %d vs %d", what, i, e,
			              a->pos[(size_t)i * N_TOK + e], b->pos[(size_t)i * N_TOK + e]);
			ck_assert(a->count[(size_t)i * N_TOK + e] == b->count[(size_t)i * N_TOK + e]);
		}
	}
	ck_assert_int_eq(a->compress_events, b->compress_events);
	double worst = 0;
	for (size_t i = 0; i < (size_t)N_TOK * V; i++) {
		double e = fabs((double)a->logits[i] - b->logits[i]);
		worst = e > worst ? e : worst;
	}
	ck_assert_msg(worst < tol, "%s: logits differ by %g", what, worst);
}

static void chunk_invariance(const struct kvp_policy *p, int shape)
{
	rt_model *m = load_shape(shape);
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 4242u + (unsigned)shape);
	run_out one, tok, c[4];
	run_collect(m, p, 64, N_TOK, toks, &one, NULL);        /* one call, chunks up to 64 */
	run_collect(m, p, 64, 1, toks, &tok, NULL);            /* token by token */
	static const int chunks[4] = { 1, 3, 7, 5 };
	char what[96];
	snprintf(what, sizeof what, "%s shape %d: one call vs token by token", p->name, shape);
	expect_same(m, what, &one, &tok, logit_tol(p));
	for (int i = 0; i < 4; i++) {
		run_collect(m, p, chunks[i], N_TOK, toks, &c[i], NULL);
		snprintf(what, sizeof what, "%s shape %d: chunk %d vs token by token", p->name, shape,
		         chunks[i]);
		expect_same(m, what, &c[i], &tok, logit_tol(p));
		run_free(&c[i]);
	}
	if (p->compress)
		ck_assert_msg(one.compress_events > 0, "%s never compressed in %d tokens", p->name, N_TOK);
	run_free(&one);
	run_free(&tok);
	rt_model_free(m);
}

/* Every library policy and the full cache in ONE lockstep batch (rt_seq_batch_feed, calls
 * of 5 tokens, chunks up to 8) against each policy alone: with the same calls and chunks,
 * the same logits bit for bit (a sequence's matmul rows are its own segment, whatever is
 * stacked with it: runtime/model/rt_matmul.h); token by token, the same kept entries, the
 * same compress events and logits within logit_tol (only the GEMM row counts differ).
 * fast: the fast path (quantised-activation dot rows below 16 rows a sequence, sgemm at
 * or above), on 2 threads; else the exact path. */
static void batch_invariance(int shape, int fast)
{
	const rt_model_opts fast_opts = { .exact = 0, .threads = 2 };
	rt_err err = { "" };
	rt_model *m = fast ? rt_model_open(model_path(shape), &fast_opts, &err) : load_shape(shape);
	ck_assert_msg(m != NULL, "%s", err.msg);
	const int V = m->hp.n_vocab, K = g_lib_n + 1;
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 4242u + (unsigned)shape);
	rt_seq *seqs = calloc((size_t)K, sizeof *seqs);
	rt_seq **sp = calloc((size_t)K, sizeof *sp);
	float *lg = malloc((size_t)K * 5 * V * sizeof(float));
	run_out *got = calloc((size_t)K, sizeof *got);
	for (int k = 0; k < K; k++) {
		seq_open(&seqs[k], m, k < g_lib_n ? g_lib[k] : &rt_policy_full, N_TOK,
		         64, PROMPT);
		sp[k] = &seqs[k];
		got[k].logits = malloc((size_t)N_TOK * V * sizeof(float));
	}
	rt_seq_batch b;
	ck_assert_msg(rt_seq_batch_init(&b, sp, K, 8, &err) == 0, "%s", err.msg);
	for (int t = 0; t < N_TOK; t += 5) {
		int c = N_TOK - t < 5 ? N_TOK - t : 5;
		ck_assert_msg(rt_seq_batch_feed(&b, toks + t, c, lg, RT_LOGITS_ALL, &err) == 0, "%s",
		              err.msg);
		for (int k = 0; k < K; k++)
			memcpy(got[k].logits + (size_t)t * V, lg + (size_t)k * c * V,
			       (size_t)c * V * sizeof(float));
	}
	/* a batch of sequences at different positions is refused */
	rt_seq_reset(&seqs[0], PROMPT);
	ck_assert_int_eq(rt_seq_batch_feed(&b, toks, 1, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_msg(strstr(err.msg, "has seen 0 tokens") != NULL, "%s", err.msg);
	rt_seq_batch_free(&b);
	for (int k = 0; k < K; k++) {
		const struct kvp_policy *p = seqs[k].p;
		run_out ref;
		run_collect(m, p, 8, 5, toks, &ref, NULL); /* the batch's calls and chunks, alone */
		ck_assert_msg(memcmp(ref.logits, got[k].logits, (size_t)N_TOK * V * sizeof(float)) == 0,
		              "%s shape %d (%s path): a batch of %d changes its logits' bits", p->name,
		              shape, fast ? "fast" : "exact", K);
		run_free(&ref);
		if (fast)
			continue;
		run_collect(m, p, 64, 1, toks, &ref, NULL);
		if (k == 0) { /* reset above: replay it alone, chunk 64, to fill got[0]'s store */
			run_free(&got[0]);
			run_collect(m, p, 64, N_TOK, toks, &got[0], NULL);
		} else {
			const int H = m->hp.n_layer * m->hp.n_head_kv;
			got[k].n = malloc((size_t)H * sizeof *got[k].n);
			got[k].pos = calloc((size_t)H * N_TOK, sizeof *got[k].pos);
			got[k].count = calloc((size_t)H * N_TOK, sizeof *got[k].count);
			for (int i = 0; i < H; i++) {
				const rt_kv_head *h = &seqs[k].kv.heads[i];
				got[k].n[i] = h->n;
				kept_by_pos(h, got[k].pos + (size_t)i * N_TOK, got[k].count + (size_t)i * N_TOK);
			}
			got[k].compress_events = rt_seq_stats_get(&seqs[k]).compress_events;
		}
		char what[96];
		snprintf(what, sizeof what, "%s shape %d: batch of %d vs alone", p->name, shape, K);
		expect_same(m, what, &got[k], &ref, logit_tol(p));
		run_free(&ref);
		run_free(&got[k]);
	}
	for (int k = 0; k < K; k++) {
		rt_seq_free(&seqs[k]);
		if (fast)
			run_free(&got[k]);
	}
	free(got), free(lg), free(sp), free(seqs);
	rt_model_free(m);
}

START_TEST(batch_equals_alone_every_policy)
{
	batch_invariance(_i, 0);
}
END_TEST

START_TEST(batch_equals_alone_fast_path)
{
	batch_invariance(_i ? 1 : 0, 1);
}
END_TEST

START_TEST(chunked_equals_stepwise_every_policy)
{
	/* _i: registry index × 3 shapes, then the built-in full policy */
	int pi = _i / 3, shape = _i % 3;
	const struct kvp_policy *p = pi < g_lib_n ? g_lib[pi] : &rt_policy_full;
	chunk_invariance(p, shape);
}
END_TEST

/* ---- the device interface (rt_seq_dev) -------------------------------------------------- */

/* A device for rt_seq_attach that is the CPU again: its own forward scratch with the
 * sequence's hooks, the policy's C compress; it counts its calls. The reference is the
 * plain CPU sequence: through the device interface the ppl/KL engine must give the same
 * figures bit for bit, and the hooks must be what ran. */
typedef struct echo_dev {
	rt_fwd fwd;
	const struct kvp_policy *p;
	int forwards, compresses, resets, freed;
} echo_dev;

static int echo_forward(void *st, rt_kv *kv, const int32_t *tok, int32_t k, int64_t pos,
                        float *lg, enum rt_logits_mode md, rt_err *err)
{
	echo_dev *d = st;
	d->forwards++;
	return rt_model_forward(&d->fwd, kv, tok, k, (int32_t)pos, lg, md, err);
}

static int echo_compress(void *st, struct kvp_ctx *c, rt_kv *kv, rt_err *err)
{
	echo_dev *d = st;
	d->compresses++;
	return d->p->compress(c, kv, err);
}

static void echo_reset(void *st)
{
	((echo_dev *)st)->resets++;
}

static void echo_free(void *st)
{
	echo_dev *d = st;
	rt_fwd_free(&d->fwd);
	d->freed = 1;
}

/* Move s to d: d's forward takes over s's scratch hooks (they point at s). */
static int echo_attach(rt_seq *s, echo_dev *d, rt_err *err)
{
	memset(d, 0, sizeof *d);
	d->p = s->p;
	ck_assert_msg(rt_fwd_init(&d->fwd, s->m, s->max_chunk, s->cap, err) == 0, "%s", err->msg);
	d->fwd.observe = s->fwd.observe, d->fwd.observe_user = s->fwd.observe_user;
	d->fwd.on_append = s->fwd.on_append, d->fwd.append_user = s->fwd.append_user;
	d->fwd.on_layer = s->fwd.on_layer, d->fwd.layer_user = s->fwd.layer_user;
	d->fwd.observe_parallel = s->fwd.observe_parallel;
	const rt_seq_dev dev = { "echo", 8, d, echo_forward, echo_compress, echo_reset, echo_free };
	int rc = rt_seq_attach(s, &dev, err);
	if (rc != 0)
		rt_fwd_free(&d->fwd);
	return rc;
}

START_TEST(device_interface_equals_cpu)
{
	/* tova at ratio 4 (a compress every step once over budget; h2o's 64-token floor would
	 * keep all 48 tokens) and the full-cache reference, through rt_eval_runs: on the CPU,
	 * and both sequences on the echo device */
	rt_model *m = load_shape(0);
	const struct kvp_policy *p = find_policy("tova");
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 99u);
	rt_err err = { "" };
	rt_seq run[2], ref[2];
	echo_dev dr, df;
	rt_eval_score sc[2];
	double ref_nll[2];
	for (int d = 0; d < 2; d++) {
		/* chunks of 8 on both: the device bounds its sequence's 16 to its own 8 */
		seq_open(&run[d], m, p, N_TOK, d ? 16 : 8, N_TOK);
		ck_assert_msg(rt_seq_set_ratio(&run[d], 4, &err) == 0, "%s", err.msg);
		seq_open(&ref[d], m, &rt_policy_full, N_TOK, d ? 16 : 8, N_TOK);
		if (d == 1) {
			ck_assert_msg(echo_attach(&run[1], &dr, &err) == 0, "%s", err.msg);
			ck_assert_msg(echo_attach(&ref[1], &df, &err) == 0, "%s", err.msg);
			ck_assert_str_eq(rt_seq_device(&run[1]), "echo");
			ck_assert_int_eq(run[1].max_chunk, 8);
		}
		/* the CPU pair fed one after the other; the device pair asks for a batch, which the
		 * engine must not use (its forward is the device's) */
		rt_eval_loop lo = { .block = 8, .batched = d };
		rt_seq *one = &run[d];
		rt_eval_score_init(&sc[d]);
		ck_assert_msg(rt_eval_runs(&one, 1, &ref[d], toks, N_TOK, &lo, &sc[d], &ref_nll[d], &err) == 0,
		              "%s", err.msg);
		ck_assert_msg(sc[d].failed_at < 0, "%s", sc[d].error);
	}
	ck_assert_str_eq(rt_seq_device(&run[0]), "cpu");
	ck_assert_msg(sc[0].nll == sc[1].nll && ref_nll[0] == ref_nll[1], "nll %.17g vs %.17g",
	              sc[0].nll, sc[1].nll);
	ck_assert_int_eq(sc[0].scored, sc[1].scored);
	ck_assert_int_eq(sc[0].hits, sc[1].hits);
	ck_assert_int_eq(sc[0].compressed, sc[1].compressed);
	ck_assert_int_gt(sc[1].compressed, 0);
	rt_kld_summary ka, kb;
	rt_kld_acc_summary(&sc[0].acc, &ka);
	rt_kld_acc_summary(&sc[1].acc, &kb);
	ck_assert_msg(ka.kld_mean == kb.kld_mean && ka.kld_mean > 0, "kld %g vs %g", ka.kld_mean,
	              kb.kld_mean);
	const rt_seq_stats a = rt_seq_stats_get(&run[0]), b = rt_seq_stats_get(&run[1]);
	ck_assert_int_eq(a.tokens, b.tokens);
	ck_assert_int_eq(a.kv_entries_peak, b.kv_entries_peak);
	ck_assert_int_eq(a.kv_bytes_peak, b.kv_bytes_peak);
	ck_assert_int_eq(a.first_compress_seen, b.first_compress_seen);
	ck_assert_int_eq(a.compress_events, b.compress_events);
	ck_assert(rt_seq_mean_entries(&run[0]) == rt_seq_mean_entries(&run[1]));
	/* the hooks ran: every chunk (at most 8 tokens) through forward, every compress */
	ck_assert_int_ge(dr.forwards, N_TOK / 8);
	ck_assert_int_ge(df.forwards, N_TOK / 8);
	ck_assert_int_eq(dr.compresses, (int)b.compress_events);
	ck_assert_int_gt(dr.compresses, 0);
	ck_assert_int_eq(df.compresses, 0);
	/* a device sequence is refused by the CPU batch; a fed one cannot move */
	rt_seq *pair[2] = { &run[0], &run[1] };
	rt_seq_batch bt;
	ck_assert_int_eq(rt_seq_batch_init(&bt, pair, 2, 8, &err), -1);
	ck_assert_msg(strstr(err.msg, "tova runs on echo") != NULL, "%s", err.msg);
	rt_seq_batch_free(&bt);
	echo_dev dx;
	ck_assert_int_eq(echo_attach(&run[0], &dx, &err), -1);
	ck_assert_msg(strstr(err.msg, "cannot move to echo: it has been fed") != NULL, "%s", err.msg);
	rt_seq_reset(&run[1], N_TOK);
	ck_assert_int_eq(dr.resets, 1);
	for (int d = 0; d < 2; d++) {
		rt_eval_score_free(&sc[d]);
		rt_seq_free(&run[d]);
		rt_seq_free(&ref[d]);
	}
	ck_assert(dr.freed && df.freed);
	rt_model_free(m);
}
END_TEST

START_TEST(second_sequence_equals_fresh)
{
	static const char *const names[] = { "h2o", "scissorhands", "snapkv", "streaming_llm" };
	rt_model *m = load_shape(0);
	int32_t a[N_TOK], b[N_TOK];
	test_tokens(a, N_TOK, m->hp.n_vocab, 1u);
	test_tokens(b, N_TOK, m->hp.n_vocab, 2u);
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		const struct kvp_policy *p = find_policy(names[i]);
		rt_seq s;
		seq_open(&s, m, p, N_TOK, 8, PROMPT);
		run_out first, second, fresh;
		run_collect(m, p, 8, 5, a, &first, &s);
		rt_seq_reset(&s, PROMPT);
		run_collect(m, p, 8, 5, b, &second, &s);
		run_collect(m, p, 8, 5, b, &fresh, NULL);
		expect_same(m, names[i], &second, &fresh, logit_tol(p));
		run_free(&first), run_free(&second), run_free(&fresh);
		rt_seq_free(&s);
	}
	rt_model_free(m);
}
END_TEST

/* ---- hook order: init_entries runs on every new entry before observe sees it --------- */

static long g_inits, g_observes, g_bad_order;

static void mark_init(const struct kvp_ctx *ctx, rt_kv *kv, int layer, int kv_head, int32_t first,
                      int32_t n)
{
	(void)ctx;
	rt_kv_head *h = rt_kv_head_at(kv, layer, kv_head);
	for (int32_t i = first; i < first + n; i++) {
		uint32_t w = (uint32_t)h->pos[i] + 1;
		memcpy(h->stats + (size_t)i * kv->stat_bytes, &w, 4);
	}
	g_inits += n;
}

static void mark_observe(const struct kvp_ctx *ctx, rt_kv *kv, int layer, int kv_head,
                         const struct kvp_obs *ob)
{
	(void)ctx;
	rt_kv_head *h = rt_kv_head_at(kv, layer, kv_head);
	for (int32_t i = 0; i < ob->n; i++) {
		uint32_t w;
		memcpy(&w, h->stats + (size_t)i * kv->stat_bytes, 4);
		g_bad_order += w != (uint32_t)h->pos[i] + 1;
	}
	g_bad_order += ob->probs != NULL; /* the policy did not ask for them */
	g_bad_order += h->pos[ob->n - 1] != ob->step;
	g_observes++;
}

static int never(const struct kvp_ctx *ctx, const rt_kv *kv)
{
	(void)ctx, (void)kv;
	return 0;
}

static int32_t room_of(const struct kvp_ctx *ctx, const rt_kv *kv)
{
	(void)ctx;
	int32_t room = kv->cap;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		room = kv->cap - kv->heads[i].n < room ? kv->cap - kv->heads[i].n : room;
	return room;
}

/* ---- the prompt trace (KVP_NEED_TRACE) --------------------------------------------------- */

/* Feed toks under a trace-only policy (no hooks, never compresses) in calls of `calls`
 * tokens with chunk `chunk`, or in a batch with the full cache when batch is set, and copy
 * the trace: surprisal [N_TOK], hid and q of every sampled layer, q_tail. */
typedef struct trace_copy {
	int32_t n, tail_start, tail_n;
	int sample[KVP_TRACE_LAYERS];
	float *sur, *hid, *q, *qt;
} trace_copy;

static void trace_run(const rt_model *m, const int32_t *toks, int chunk, int calls, int batch,
                      trace_copy *o)
{
	static const struct kvp_policy tracer = {
		.abi_version = KVP_ABI_VERSION, .name = "tracer", .source = "test", .source_hash = "0",
		.needs = KVP_NEED_TRACE | KVP_NEED_PROMPT_LEN, .should_compress = never,
		.next_trigger = room_of,
	};
	rt_err err = { "" };
	rt_seq s, f;
	ck_assert_msg(rt_seq_init(&s, m, &tracer, N_TOK, chunk, PROMPT, &err) == 0, "%s", err.msg);
	ck_assert(s.run.ctx.trace == &s.tr);
	if (batch) {
		ck_assert_msg(rt_seq_init(&f, m, &rt_policy_full, N_TOK, chunk, PROMPT, &err) == 0, "%s",
		              err.msg);
		ck_assert(f.run.ctx.trace == NULL);
		rt_seq *sp[2] = { &f, &s };
		rt_seq_batch b;
		ck_assert_msg(rt_seq_batch_init(&b, sp, 2, chunk, &err) == 0, "%s", err.msg);
		for (int t = 0; t < N_TOK; t += calls) {
			int c = N_TOK - t < calls ? N_TOK - t : calls;
			ck_assert_msg(rt_seq_batch_feed(&b, toks + t, c, NULL, RT_LOGITS_NONE, &err) == 0,
			              "%s", err.msg);
		}
		rt_seq_batch_free(&b);
		rt_seq_free(&f);
	} else {
		float *last = malloc((size_t)m->hp.n_vocab * sizeof(float));
		for (int t = 0; t < N_TOK; t += calls) {
			int c = N_TOK - t < calls ? N_TOK - t : calls;
			ck_assert_msg(rt_seq_feed(&s, toks + t, c, last, RT_LOGITS_LAST, &err) == 0, "%s",
			              err.msg);
		}
		free(last);
	}
	const struct kvp_trace *t = &s.tr;
	const size_t E = (size_t)t->n_embd, qd = (size_t)t->n_head * t->head_dim;
	o->n = t->n, o->tail_start = t->tail_start, o->tail_n = t->tail_n;
	memcpy(o->sample, t->sample_layer, sizeof o->sample);
	o->sur = malloc(N_TOK * sizeof(float));
	o->hid = malloc(KVP_TRACE_LAYERS * (size_t)PROMPT * E * sizeof(float));
	o->q = malloc(KVP_TRACE_LAYERS * (size_t)PROMPT * qd * sizeof(float));
	o->qt = malloc((size_t)t->n_layer * PROMPT * qd * sizeof(float));
	memcpy(o->sur, t->surprisal, PROMPT * sizeof(float));
	for (int i = 0; i < KVP_TRACE_LAYERS; i++) {
		memcpy(o->hid + (size_t)i * PROMPT * E, t->hid + (size_t)i * t->cap * E,
		       PROMPT * E * sizeof(float));
		memcpy(o->q + (size_t)i * PROMPT * qd, t->q + (size_t)i * t->cap * qd,
		       PROMPT * qd * sizeof(float));
	}
	for (int l = 0; l < t->n_layer; l++)
		memcpy(o->qt + (size_t)l * PROMPT * qd, t->q_tail + (size_t)l * KVP_TRACE_TAIL * qd,
		       PROMPT * qd * sizeof(float));
	rt_seq_free(&s);
}

static void trace_free(trace_copy *o)
{
	free(o->sur), free(o->hid), free(o->q), free(o->qt);
}

static double max_diff(const float *a, const float *b, size_t n)
{
	double w = 0;
	for (size_t i = 0; i < n; i++)
		w = fabs((double)a[i] - b[i]) > w ? fabs((double)a[i] - b[i]) : w;
	return w;
}

START_TEST(trace_records_the_prompt)
{
	rt_model *m = load_shape(_i);
	const int V = m->hp.n_vocab, L = m->hp.n_layer, E = m->hp.n_embd;
	const size_t qd = (size_t)m->hp.n_head * m->hp.head_dim;
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, V, 99u + (unsigned)_i);
	trace_copy a, b, c;
	trace_run(m, toks, 64, N_TOK, 0, &a); /* one call, LAST logits only */
	trace_run(m, toks, 64, 1, 0, &b);     /* token by token */
	trace_run(m, toks, 5, 7, 1, &c);      /* batched with the full cache, odd chunks */
	ck_assert_int_eq(a.n, PROMPT);
	ck_assert_int_eq(a.tail_start, 0);
	ck_assert_int_eq(a.tail_n, PROMPT);
	/* sampled layers: round((s+1)·L/4) - 1 */
	for (int i = 0; i < KVP_TRACE_LAYERS; i++)
		ck_assert_int_eq(a.sample[i], (int)lround((i + 1) * (double)L / 4) - 1);
	/* surprisal against an independent log-softmax (double) of the full cache's logits */
	rt_seq f;
	seq_open(&f, m, &rt_policy_full, N_TOK, 64, PROMPT);
	float *lg = malloc((size_t)N_TOK * V * sizeof(float));
	feed_ok(&f, toks, N_TOK, lg);
	ck_assert(a.sur[0] == 0.0f);
	for (int p = 1; p < PROMPT; p++) {
		const float *row = lg + (size_t)(p - 1) * V;
		double mx = row[0], sum = 0;
		for (int i = 1; i < V; i++)
			mx = row[i] > mx ? row[i] : mx;
		for (int i = 0; i < V; i++)
			sum += exp((double)row[i] - mx);
		double want = mx + log(sum) - row[toks[p]];
		ck_assert_msg(fabs(a.sur[p] - want) < 1e-4, "surprisal at %d: %g vs %g", p, a.sur[p],
		              want);
	}
	free(lg);
	rt_seq_free(&f);
	/* hidden rows are RMS-normalised; the last sampled layer's queries are also the tail's */
	for (int i = 0; i < KVP_TRACE_LAYERS; i++)
		for (int p = 0; p < PROMPT; p++) {
			double ss = 0;
			const float *h = a.hid + ((size_t)i * PROMPT + p) * E;
			for (int e = 0; e < E; e++)
				ss += (double)h[e] * h[e];
			ck_assert_msg(fabs(sqrt(ss / E) - 1) < 1e-4, "rms %g", sqrt(ss / E));
		}
	const int ls = a.sample[KVP_TRACE_LAYERS - 1];
	ck_assert(max_diff(a.q + (size_t)(KVP_TRACE_LAYERS - 1) * PROMPT * qd,
	                   a.qt + (size_t)ls * PROMPT * qd, PROMPT * qd) == 0);
	/* the same trace however the tokens are chunked or batched */
	const trace_copy *o[2] = { &b, &c };
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(o[k]->n, PROMPT);
		/* a surprisal is log Σ exp(logits) − a logit, of the size of log V: the chunkings
		 * round it differently by a few of its ulps (OpenBLAS's sgemm bits depend on the
		 * row count), so its bound is relative (1.05e-5 seen at 10.2 on one machine) */
		for (int p = 0; p < PROMPT; p++)
			ck_assert_msg(fabsf(a.sur[p] - o[k]->sur[p]) <= 1e-5f * (1 + fabsf(a.sur[p])),
			              "surprisal at %d: %.9g vs %.9g", p, a.sur[p], o[k]->sur[p]);
		ck_assert(max_diff(a.hid, o[k]->hid, KVP_TRACE_LAYERS * (size_t)PROMPT * E) < 1e-5);
		ck_assert(max_diff(a.q, o[k]->q, KVP_TRACE_LAYERS * (size_t)PROMPT * qd) < 1e-5);
		ck_assert(max_diff(a.qt, o[k]->qt, (size_t)L * PROMPT * qd) < 1e-5);
	}
	trace_free(&a), trace_free(&b), trace_free(&c);
	rt_model_free(m);
}
END_TEST

/* Every head of sequences s[0..n) holds 18 entries whose span ids are want[0..18). */
static void spans_are(rt_seq *const *s, int n, const uint16_t want[18])
{
	for (int k = 0; k < n; k++)
		for (int i = 0; i < s[k]->kv.n_layer * s[k]->kv.n_kv_head; i++) {
			const rt_kv_head *h = &s[k]->kv.heads[i];
			ck_assert_int_eq(h->n, 18);
			for (int e = 0; e < 18; e++)
				ck_assert_msg(h->span[e] == want[e], "seq %d head %d entry %d: span %d, "
				              "want %d", k, i, e, h->span[e], want[e]);
		}
}

/* Protected spans: entries appended after rt_seq_span(s, id) carry that id, alone and in a
 * lockstep batch, and the policy sees the names; a range (rt_seq_span_range) marks the
 * entries at its token positions inside one feed, across its chunks, over the current
 * span. */
START_TEST(spans_mark_appended_entries)
{
	static const char *const names[] = { "", "system", "question" };
	/* span ids: 1 = system, 2 = question */
	rt_model *m = load_shape(_i);
	int32_t toks[18];
	test_tokens(toks, 18, m->hp.n_vocab, 5u);
	rt_seq a, b2;
	seq_open(&a, m, &rt_policy_full, 32, 4, -1);
	seq_open(&b2, m, &rt_policy_full, 32, 4, -1);
	rt_seq *sp[2] = { &a, &b2 };
	rt_seq_batch b;
	rt_err err = { "" };
	ck_assert_msg(rt_seq_batch_init(&b, sp, 2, 4, &err) == 0, "%s", err.msg);
	for (int k = 0; k < 2; k++) {
		rt_seq_set_span_names(sp[k], names, 2);
		ck_assert(sp[k]->run.ctx.span_names == names && sp[k]->run.ctx.n_spans == 2);
	}
	/* both sequences in one batch: system-marked, unmarked, question-marked tokens */
	for (int k = 0; k < 2; k++)
		rt_seq_span(sp[k], 1);
	ck_assert(rt_seq_batch_feed(&b, toks, 3, NULL, RT_LOGITS_NONE, &err) == 0);
	for (int k = 0; k < 2; k++)
		rt_seq_span(sp[k], 0);
	ck_assert(rt_seq_batch_feed(&b, toks + 3, 10, NULL, RT_LOGITS_NONE, &err) == 0);
	for (int k = 0; k < 2; k++)
		rt_seq_span(sp[k], 2);
	ck_assert(rt_seq_batch_feed(&b, toks + 13, 5, NULL, RT_LOGITS_NONE, &err) == 0);
	static const uint16_t fed[18] = { 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2 };
	spans_are(sp, 2, fed);
	/* reset keeps the names, clears the current span */
	rt_seq_reset(&a, -1);
	feed_ok(&a, toks, 2, NULL);
	ck_assert_int_eq(a.kv.heads[0].span[0], 0);
	ck_assert(a.run.ctx.span_names == names);
	/* positions 5..10 (chunks of 4: across two chunk ends) as question, inside one feed
	 * under the current span system; then both cleared */
	for (int k = 0; k < 2; k++) {
		rt_seq_reset(sp[k], -1);
		rt_seq_span(sp[k], 1);
		rt_seq_span_range(sp[k], 2, 5, 6);
	}
	ck_assert(rt_seq_batch_feed(&b, toks, 16, NULL, RT_LOGITS_NONE, &err) == 0);
	for (int k = 0; k < 2; k++) {
		rt_seq_span(sp[k], 0);
		rt_seq_span_range(sp[k], 0, 0, 0);
	}
	ck_assert(rt_seq_batch_feed(&b, toks + 16, 2, NULL, RT_LOGITS_NONE, &err) == 0);
	static const uint16_t ranged[18] = { 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0 };
	spans_are(sp, 2, ranged);
	/* reset clears a range too */
	rt_seq_span_range(&a, 2, 0, 4);
	rt_seq_reset(&a, -1);
	feed_ok(&a, toks, 2, NULL);
	ck_assert_int_eq(a.kv.heads[0].span[0], 0);
	rt_seq_batch_free(&b);
	rt_seq_free(&a);
	rt_seq_free(&b2);
	rt_model_free(m);
}
END_TEST

/* first_compress_seen (the tokens after which the figures are the policy's, not the full
 * cache's: rt_eval's scored_compressed) is where the cache first held fewer entries than
 * the tokens fed, not the first compress call: h2o at ratio 4 compresses every step from
 * the first token, but its 64-token floor keeps every entry until token 65. Oracle: the
 * store's entry count, fed one token at a time. */
START_TEST(first_compress_is_the_first_that_changed_the_cache)
{
	rt_model *m = load_shape(_i);
	enum { N = 96 };
	int32_t toks[N];
	test_tokens(toks, N, m->hp.n_vocab, 7u);
	rt_seq s;
	rt_err err = { "" };
	ck_assert_msg(rt_seq_init(&s, m, find_policy("h2o"), N, 1, -1, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_seq_set_ratio(&s, 4, &err) == 0, "%s", err.msg);
	const int64_t heads = (int64_t)m->hp.n_layer * m->hp.n_head_kv;
	int64_t first = 0, calls_before = 0;
	for (int t = 1; t <= N; t++) {
		feed_ok(&s, toks + t - 1, 1, NULL);
		if (!first && rt_kv_entries(&s.kv) < t * heads) {
			first = t;
			calls_before = rt_seq_stats_get(&s).compress_events - 1;
		}
		ck_assert_int_eq(rt_seq_stats_get(&s).first_compress_seen, first);
	}
	ck_assert_int_eq(first, 65);
	ck_assert_int_ge(calls_before, 60); /* compress ran all along, keeping everything */
	ck_assert_int_eq(rt_seq_stats_get(&s).first_call_seen, 1); /* from the first token */
	rt_seq_free(&s);
	rt_model_free(m);
}
END_TEST

START_TEST(init_entries_before_observe)
{
	static const struct kvp_policy marker = {
		.abi_version = KVP_ABI_VERSION, .name = "marker", .source = "test", .source_hash = "0",
		.stat_words_entry = 1, .init_entries = mark_init, .observe = mark_observe,
		.should_compress = never, .next_trigger = room_of,
	};
	rt_model *m = load_shape(_i);
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 3u);
	rt_seq s;
	rt_err err = { "" };
	ck_assert(rt_seq_init(&s, m, &marker, N_TOK, 7, -1, &err) == 0);
	g_inits = g_observes = g_bad_order = 0;
	feed_ok(&s, toks, 20, NULL);
	feed_ok(&s, toks + 20, 1, NULL);
	feed_ok(&s, toks + 21, N_TOK - 21, NULL);
	const long H = (long)m->hp.n_layer * m->hp.n_head_kv;
	ck_assert_int_eq(g_inits, N_TOK * H);
	ck_assert_int_eq(g_observes, N_TOK * H);
	ck_assert_int_eq(g_bad_order, 0);
	rt_seq_free(&s);
	rt_model_free(m);
}
END_TEST

/* ---- memory ----------------------------------------------------------------------------- */

START_TEST(h2o_ratio4_memory_bounded)
{
	rt_model *m = load_shape(_i);
	const struct kvp_policy *p = find_policy("h2o");
	const int H = m->hp.n_layer * m->hp.n_head_kv, chunk = 4;
	const int n = 90;
	int32_t toks[90];
	test_tokens(toks, n, m->hp.n_vocab, 5u);
	rt_seq s;
	rt_err err = { "" };
	ck_assert_msg(rt_seq_init(&s, m, p, n, chunk, -1, &err) == 0, "%s", err.msg);
	s.run.ctx.min_kv = KVP_MIN_KV_STRICT; /* H2O's ratio-4 shape over 90 tokens, no floor */
	ck_assert_msg(rt_seq_set_ratio(&s, 4, &err) == 0, "%s", err.msg);
	const double eb = (double)rt_kv_entry_bytes(&s.kv);
	for (int t = 0; t < n; t += 3) {
		int c = n - t < 3 ? n - t : 3;
		long before = g_allocs; /* (check's assertions allocate: count before them) */
		int rc = rt_seq_feed(&s, toks + t, c, NULL, RT_LOGITS_NONE, &err);
		long got = g_allocs - before;
		ck_assert_msg(rc == 0, "%s", err.msg);
		ck_assert_msg(got == 0, "rt_seq_feed allocated %ld times", got);
		double budget = ceil((double)rt_seq_seen(&s) / 4.0);
		for (int i = 0; i < H; i++)
			ck_assert_msg(s.kv.heads[i].n <= budget, "head %d holds %d entries, budget %g", i,
			              s.kv.heads[i].n, budget);
		ck_assert((double)rt_kv_bytes_used(&s.kv) <= budget * eb * H);
	}
	rt_seq_stats st = rt_seq_stats_get(&s);
	double final_budget = ceil(n / 4.0);
	ck_assert_msg((double)st.kv_entries_peak <= (final_budget + chunk) * H,
	              "peak %lld entries > (budget %g + chunk %d) x %d heads",
	              (long long)st.kv_entries_peak, final_budget, chunk, H);
	/* the bytes are pool blocks: each list holds ceil(entries / RT_KV_BLOCK) blocks */
	const double blk = (double)RT_KV_BLOCK * eb;
	ck_assert_msg((double)st.kv_bytes_peak <= ceil((final_budget + chunk) / RT_KV_BLOCK) * blk * H,
	              "peak %lld bytes", (long long)st.kv_bytes_peak);
	ck_assert((double)st.kv_bytes_peak >= (double)st.kv_entries_peak * eb);
	ck_assert_int_gt(st.compress_events, 0);
	/* a realistic shape of growth: the peak is far below the full cache's n entries */
	ck_assert_int_lt(st.kv_entries_peak, (int64_t)n * H / 2);
	rt_seq_free(&s);
	rt_model_free(m);
}
END_TEST


/* ---- the KV block pool -------------------------------------------------------------- */

/* Every list of s holds exactly the blocks its entries need (ceil(n / RT_KV_BLOCK): an
 * emptied block is never kept), and so does every tier arena of a tiered store (its rows,
 * ceil(slots / RT_KV_BLOCK)); the store's count is the sum over its lists and arenas.
 * Returns the store's blocks, and in *bytes their bytes: block_bytes each, or in a tiered
 * store RT_KV_BLOCK entries' metadata (meta_bytes) per list block and RT_KV_BLOCK slots of a
 * key row, a value row and an owner index per arena block, and RT_KV_BLOCK key groups'
 * ranges and member counts per block of the key-group table (runtime/kv/rt_kv.h). */
static int64_t check_blocks(const rt_seq *s, const char *what, int64_t at, int64_t *bytes)
{
	int64_t sum = 0;
	*bytes = 0;
	for (int i = 0; i < s->kv.n_layer * s->kv.n_kv_head; i++) {
		const rt_kv_head *h = &s->kv.heads[i];
		const int32_t want = (h->n + RT_KV_BLOCK - 1) / RT_KV_BLOCK;
		ck_assert_msg(h->nb == want, "%s at token %lld: list %d holds %d entries in %d blocks",
		              what, (long long)at, i, h->n, h->nb);
		sum += h->nb;
		*bytes += h->nb * (s->kv.tiered ? (int64_t)RT_KV_BLOCK * (int64_t)s->kv.meta_bytes :
		                                  s->kv.block_bytes);
		for (int t = 0; s->kv.tiered && t <= RT_KV_KGROUPS; t++) {
			const rt_kv_arena *a = &h->arena[t];
			ck_assert_msg(a->nb == (a->n + RT_KV_BLOCK - 1) / RT_KV_BLOCK,
			              "%s at token %lld: list %d tier %d holds %d rows in %d blocks", what,
			              (long long)at, i, t, a->n, a->nb);
			sum += a->nb;
			/* a key group's slot: head_dim f16 minima and maxima */
			const int64_t slot = t == RT_KV_KGROUPS ? 4 * (int64_t)s->kv.head_dim
			                                        : 2 * (int64_t)s->kv.tier_row[t];
			*bytes += a->nb * (int64_t)RT_KV_BLOCK * (slot + (int64_t)sizeof(int32_t));
		}
	}
	ck_assert_msg(sum == s->kv.blocks, "%s: lists hold %lld blocks, the store counts %lld", what,
	              (long long)sum, (long long)s->kv.blocks);
	return sum;
}

/* Under every policy (and the full cache) in one lockstep batch, on the 9/3 and 4/1
 * shapes, fed 3 tokens a step: after every step the pool's blocks in use equal the sum
 * over every (sequence, layer, KV head) list of the blocks its entries need, the pool's
 * bytes are blocks x block bytes, and resetting (a finished sequence) or freeing returns
 * every block. */
START_TEST(pool_accounting_every_policy)
{
	rt_model *m = load_shape(_i);
	rt_kvpool *pool = rt_kvpool_process();
	const rt_kvpool_stats base = rt_kvpool_get(pool);
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 21u);
	const int K = g_lib_n + 1;
	rt_seq *seqs = calloc((size_t)K, sizeof *seqs), **sp = calloc((size_t)K, sizeof *sp);
	for (int k = 0; k < K; k++) {
		seq_open(&seqs[k], m, k < g_lib_n ? g_lib[k] : &rt_policy_full, N_TOK,
		         5, PROMPT);
		sp[k] = &seqs[k];
	}
	rt_seq_batch b;
	rt_err err = { "" };
	ck_assert_msg(rt_seq_batch_init(&b, sp, K, 5, &err) == 0, "%s", err.msg);
	for (int t = 0; t < N_TOK; t += 3) {
		const int c = N_TOK - t < 3 ? N_TOK - t : 3;
		ck_assert_msg(rt_seq_batch_feed(&b, toks + t, c, NULL, RT_LOGITS_NONE, &err) == 0, "%s",
		              err.msg);
		int64_t blocks = 0, bytes = 0;
		for (int k = 0; k < K; k++) {
			ck_assert_msg(rt_seq_batch_error(&b, k) == NULL, "%s", rt_seq_batch_error(&b, k));
			int64_t nbytes;
			int64_t nb = check_blocks(&seqs[k], seqs[k].p->name, t + c, &nbytes);
			blocks += nb;
			bytes += nbytes;
			ck_assert_int_eq(rt_kv_bytes_held(&seqs[k].kv), nbytes);
		}
		const rt_kvpool_stats ps = rt_kvpool_get(pool);
		ck_assert_int_eq(ps.blocks - base.blocks, blocks);
		ck_assert_int_eq(ps.used - base.used, bytes);
	}
	rt_seq_batch_free(&b);
	/* a finished sequence returns every block: reset, then free */
	for (int k = 0; k < K; k++) {
		rt_seq_stats st = rt_seq_stats_get(&seqs[k]);
		/* an entry takes at least its narrowest tier's bytes (the top tier's untiered) */
		int64_t eb = (int64_t)rt_kv_entry_bytes(&seqs[k].kv);
		for (int t = 1; seqs[k].kv.tiered && t < RT_KV_N_TIER; t++)
			if ((int64_t)rt_kv_tier_entry_bytes(&seqs[k].kv, t) < eb)
				eb = (int64_t)rt_kv_tier_entry_bytes(&seqs[k].kv, t);
		ck_assert_int_ge(st.kv_bytes_peak, st.kv_entries_peak * eb);
		rt_seq_reset(&seqs[k], PROMPT);
		ck_assert_int_eq(seqs[k].kv.blocks, 0);
		int64_t nbytes;
		check_blocks(&seqs[k], seqs[k].p->name, 0, &nbytes);
		ck_assert_int_eq(nbytes, 0);
	}
	ck_assert_int_eq(rt_kvpool_get(pool).blocks, base.blocks);
	ck_assert_int_eq(rt_kvpool_get(pool).used, base.used);
	ck_assert_msg(rt_seq_feed(&seqs[0], toks, 7, NULL, RT_LOGITS_NONE, &err) == 0, "%s", err.msg);
	ck_assert_int_gt(rt_kvpool_get(pool).blocks, base.blocks);
	for (int k = 0; k < K; k++)
		rt_seq_free(&seqs[k]);
	ck_assert_int_eq(rt_kvpool_get(pool).blocks, base.blocks);
	ck_assert_int_eq(rt_kvpool_get(pool).used, base.used);
	free(seqs), free(sp);
	rt_model_free(m);
}
END_TEST

/* A pool too small for two sequences: in a lockstep batch a streaming policy that never
 * needs more than one block per list and the full cache that needs one more every
 * RT_KV_BLOCK tokens. The pool holds the streaming sequence's blocks and two per list of
 * the full cache, so the full cache leaves the batch with "KV pool exhausted" at token
 * 2·RT_KV_BLOCK with its entries intact, and the streaming sequence's logits equal those
 * it gets alone with an unlimited pool (bit for bit: the same single-sequence forward
 * after the other leaves; before, the batched GEMMs agree to float summation order). A
 * lone sequence gets the same error from rt_seq_feed. */
START_TEST(pool_exhaustion_fails_one_sequence)
{
	rt_model *m = load_shape(0);
	rt_kvpool *pool = rt_kvpool_process();
	const int V = m->hp.n_vocab, H = m->hp.n_layer * m->hp.n_head_kv;
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, V, 23u);
	const struct kvp_policy *ps = find_policy("streaming_llm");
	float *solo = malloc((size_t)N_TOK * V * sizeof *solo);
	float *blg = malloc((size_t)2 * N_TOK * V * sizeof *blg);
	rt_seq a, f;
	rt_err err = { "" };
	seq_open(&a, m, ps, N_TOK, 4, -1);
	ck_assert_msg(rt_seq_feed(&a, toks, N_TOK, solo, RT_LOGITS_ALL, &err) == 0, "%s", err.msg);
	ck_assert_int_le(rt_seq_stats_get(&a).kv_bytes_peak, (int64_t)H * a.kv.block_bytes);
	rt_seq_reset(&a, -1);
	ck_assert_msg(rt_seq_init(&f, m, &rt_policy_full, N_TOK, 4, -1, &err) == 0, "%s", err.msg);
	const int64_t used0 = rt_kvpool_get(pool).used;
	rt_kvpool_set_limit(pool, used0 + H * a.kv.block_bytes + 2 * H * f.kv.block_bytes);
	rt_seq *sp[2] = { &a, &f };
	rt_seq_batch b;
	ck_assert_msg(rt_seq_batch_init(&b, sp, 2, 4, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_seq_batch_feed(&b, toks, N_TOK, blg, RT_LOGITS_ALL, &err) == 0, "%s", err.msg);
	ck_assert_ptr_null(rt_seq_batch_error(&b, 0));
	const char *why = rt_seq_batch_error(&b, 1);
	ck_assert_ptr_nonnull(why);
	ck_assert_msg(strstr(why, "KV pool exhausted") && strstr(why, "full"), "%s", why);
	ck_assert_int_eq(rt_seq_seen(&f), 2 * RT_KV_BLOCK);
	for (int i = 0; i < H; i++)
		ck_assert_int_eq(f.kv.heads[i].n, 2 * RT_KV_BLOCK);
	double maxd = 0;
	for (size_t i = 0; i < (size_t)N_TOK * V; i++)
		maxd = fmax(maxd, fabs((double)blg[i] - solo[i]));
	ck_assert_msg(maxd < 1e-4, "streaming logits moved by %g when the full cache failed", maxd);
	rt_seq_batch_free(&b);
	/* a lone sequence: the same clean error, nothing appended */
	rt_seq_reset(&f, -1);
	rt_seq_reset(&a, -1);
	rt_kvpool_set_limit(pool, used0 + 2 * H * f.kv.block_bytes);
	ck_assert_int_eq(rt_seq_feed(&f, toks, N_TOK, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_msg(strstr(err.msg, "KV pool exhausted"), "%s", err.msg);
	ck_assert_int_eq(err.code, RT_ERR_RESOURCE); /* the code survives the sequence's prefix */
	ck_assert_int_le(rt_kvpool_get(pool).used, rt_kvpool_get(pool).limit);
	rt_kvpool_set_limit(pool, INT64_MAX);
	rt_seq_free(&a);
	rt_seq_free(&f);
	ck_assert_int_eq(rt_kvpool_get(pool).used, used0);
	free(solo), free(blg);
	rt_model_free(m);
}
END_TEST


/* Continuous batching: three sequences (full, h2o, streaming_llm) with different texts,
 * at different positions, offered ragged chunks of 1..5 tokens per step in one
 * rt_seq_multi_step: after every step each sequence's last-row logits equal those it gets
 * fed alone (rt_seq_feed, every row), up to float summation order; feeding allocates
 * nothing; a sequence joining late (after 7 steps) does too. */
START_TEST(multi_step_equals_alone)
{
	rt_model *m = load_shape(_i);
	const int V = m->hp.n_vocab, K = 3;
	const char *names[3] = { "full", "h2o", "streaming_llm" };
	int32_t toks[3][N_TOK];
	float *ref = malloc((size_t)K * N_TOK * V * sizeof *ref);
	float *lg = malloc((size_t)K * V * sizeof *lg);
	rt_seq seqs[3];
	rt_seq *sp[3];
	rt_err err = { "" }, why[3];
	for (int i = 0; i < K; i++) {
		test_tokens(toks[i], N_TOK, V, 40u + (unsigned)i);
		seq_open(&seqs[i], m, find_policy(names[i]), N_TOK, 5, PROMPT);
		ck_assert_msg(rt_seq_feed(&seqs[i], toks[i], N_TOK, ref + (size_t)i * N_TOK * V,
		                          RT_LOGITS_ALL, &err) == 0, "%s", err.msg);
		rt_seq_reset(&seqs[i], PROMPT);
	}
	rt_seq_multi b;
	ck_assert_msg(rt_seq_multi_init(&b, m, K, 16, &err) == 0, "%s", err.msg);
	int done[3] = { 0, 0, 0 };
	for (int step = 0; done[0] < N_TOK || done[1] < N_TOK || done[2] < N_TOK; step++) {
		int J = 0, map[3], n[3];
		const int32_t *tp[3];
		for (int i = 0; i < K; i++) {
			if (done[i] >= N_TOK || (i == 2 && step < 7))
				continue;
			int want = 1 + (step + i) % 5;
			n[J] = want < N_TOK - done[i] ? want : N_TOK - done[i];
			tp[J] = toks[i] + done[i];
			sp[J] = &seqs[i];
			map[J++] = i;
		}
		long before = g_allocs;
		int fed = rt_seq_multi_step(&b, sp, J, tp, n, lg, why, &err);
		long got = g_allocs - before;
		ck_assert_msg(fed == J, "step %d: %d of %d fed (%s)", step, fed, J, err.msg);
		ck_assert_msg(got == 0, "a step allocated %ld times", got);
		for (int j = 0; j < J; j++) {
			const int i = map[j];
			ck_assert_msg(n[j] >= 1, "%s: %s", names[i], why[j].msg);
			done[i] += n[j];
			ck_assert_int_eq(rt_seq_seen(&seqs[i]), done[i]);
			const float *want_row = ref + ((size_t)i * N_TOK + done[i] - 1) * V;
			double maxd = 0;
			for (int v = 0; v < V; v++)
				maxd = fmax(maxd, fabs((double)lg[(size_t)j * V + v] - want_row[v]));
			ck_assert_msg(maxd < 1e-4, "%s at token %d: logits differ by %g", names[i], done[i],
			              maxd);
		}
	}
	rt_seq_multi_free(&b);
	for (int i = 0; i < K; i++)
		rt_seq_free(&seqs[i]);
	free(ref), free(lg);
	rt_model_free(m);
}
END_TEST

START_TEST(feed_allocates_nothing_any_policy)
{
	rt_model *m = load_shape(1);
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 8u);
	float *lg = malloc((size_t)N_TOK * m->hp.n_vocab * sizeof *lg);
	for (int pi = 0; pi <= g_lib_n; pi++) {
		const struct kvp_policy *p = pi < g_lib_n ? g_lib[pi] : &rt_policy_full;
		rt_seq s;
		seq_open(&s, m, p, N_TOK, 5, PROMPT);
		rt_err err = { "" };
		long before = g_allocs;
		int rc = rt_seq_feed(&s, toks, N_TOK, lg, RT_LOGITS_ALL, &err);
		long got = g_allocs - before;
		ck_assert_msg(rc == 0, "%s", err.msg);
		ck_assert_msg(got == 0, "%s: feeding allocated %ld times", p->name, got);
		rt_seq_free(&s);
	}
	/* nor does a lockstep batch of every policy and the full cache */
	ck_assert(g_lib_n >= 0 && g_lib_n < 1000);
	const int K = g_lib_n + 1;
	rt_seq *seqs = calloc(1000, sizeof *seqs), **sp = calloc(1000, sizeof *sp);
	float *blg = malloc((size_t)K * N_TOK * (size_t)m->hp.n_vocab * sizeof *blg);
	for (int k = 0; k < K; k++) {
		seq_open(&seqs[k], m, k < g_lib_n ? g_lib[k] : &rt_policy_full, N_TOK,
		         5, PROMPT);
		sp[k] = &seqs[k];
	}
	rt_seq_batch b;
	rt_err err = { "" };
	ck_assert_msg(rt_seq_batch_init(&b, sp, K, 5, &err) == 0, "%s", err.msg);
	long before = g_allocs;
	int rc = rt_seq_batch_feed(&b, toks, N_TOK, blg, RT_LOGITS_ALL, &err);
	long got = g_allocs - before; /* read before check's own asserts allocate */
	ck_assert_msg(rc == 0, "%s", err.msg);
	ck_assert_msg(got == 0, "batch feeding allocated %ld times", got);
	rt_seq_batch_free(&b);
	for (int k = 0; k < K; k++)
		rt_seq_free(&seqs[k]);
	free(seqs), free(sp), free(blg);
	free(lg);
	rt_model_free(m);
}
END_TEST

START_TEST(capacity_too_small_is_an_error)
{
	rt_model *m = load_shape(2);
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 9u);
	rt_seq s;
	rt_err err = { "" };
	ck_assert(rt_seq_init(&s, m, &rt_policy_full, 10, 4, -1, &err) == 0);
	ck_assert_int_eq(rt_seq_feed(&s, toks, 20, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_msg(strstr(err.msg, "KV cache full") != NULL, "%s", err.msg);
	ck_assert_int_eq(err.code, RT_ERR_RESOURCE);
	rt_seq_free(&s);
	/* ratio below 1 and ratio on a policy that never compresses */
	ck_assert(rt_seq_init(&s, m, find_policy("h2o"), 10, 4, -1, &err) == 0);
	ck_assert_int_eq(rt_seq_set_ratio(&s, 0.5, &err), -1);
	ck_assert_int_eq(rt_seq_set(&s, "nosuch=1", &err), -1);
	ck_assert_msg(strstr(err.msg, "nosuch") != NULL, "%s", err.msg);
	rt_seq_free(&s);
	rt_model_free(m);
}
END_TEST

/* Budget edges: a ratio so large that the budget rounds to 0 or 1 entries, a prompt
 * shorter than, equal to, one over and far over a fixed budget. Each either runs with
 * every head within budget + chunk or fails with a clear error; never a crash. */
START_TEST(budget_edges)
{
	rt_model *m = load_shape(0);
	const int H = m->hp.n_layer * m->hp.n_head_kv;
	int32_t toks[N_TOK];
	test_tokens(toks, N_TOK, m->hp.n_vocab, 11u);
	rt_err err = { "" };
	static const double ratios[] = { 1, 1000, N_TOK, N_TOK / 2.0 };
	for (size_t i = 0; i < sizeof ratios / sizeof ratios[0]; i++) {
		rt_seq s;
		ck_assert(rt_seq_init(&s, m, find_policy("h2o"), N_TOK, 4, -1, &err) == 0);
		ck_assert_msg(rt_seq_set_ratio(&s, ratios[i], &err) == 0, "%s", err.msg);
		int rc = rt_seq_feed(&s, toks, N_TOK, NULL, RT_LOGITS_NONE, &err);
		if (rc != 0) {
			ck_assert_msg(strstr(err.msg, "h2o") != NULL, "unclear error: %s", err.msg);
		} else {
			/* the library H2O's floor: min(64, N_TOK) entries whatever the ratio */
			double budget = fmax(ceil(N_TOK / ratios[i]), fmin(64.0, N_TOK));
			for (int h = 0; h < H; h++)
				ck_assert_int_le(s.kv.heads[h].n, budget + 4);
		}
		rt_seq_free(&s);
	}
	/* sliding window of W entries; prompts of W - 1, W, W + 1 and 4W tokens */
	static const int lens[] = { 9, 10, 11, 40 };
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		rt_seq s;
		ck_assert(rt_seq_init(&s, m, find_policy("sliding_window"), N_TOK, 8, lens[i], &err) == 0);
		ck_assert(rt_seq_set(&s, "window=10", &err) == 0);
		ck_assert_msg(rt_seq_feed(&s, toks, lens[i], NULL, RT_LOGITS_NONE, &err) == 0, "%s",
		              err.msg);
		for (int h = 0; h < H; h++) {
			const rt_kv_head *hd = &s.kv.heads[h];
			int want = lens[i] < 10 ? lens[i] : 10;
			ck_assert_int_eq(hd->n, want);
			/* the last `want` positions, in any entry order (rt_kv_head_evict) */
			uint8_t seen_pos[64] = { 0 };
			for (int e = 0; e < hd->n; e++) {
				const int32_t p = hd->pos[e];
				ck_assert(p >= lens[i] - want && p < lens[i] && !seen_pos[p]);
				seen_pos[p] = 1;
			}
		}
		rt_seq_free(&s);
	}
	rt_model_free(m);
}
END_TEST

/* ---- the command line ------------------------------------------------------------------ */

/* Run rt_cli_main on argv (NULL-terminated) with the registry, capturing stdout and stderr
 * (NUL-terminated, truncated to the buffer sizes). Returns the exit status. */
static int cli(char *out, size_t on, char *errb, size_t en, const char *const *args)
{
	char *argv[32];
	int argc = 0;
	while (args[argc] && argc < 31) {
		argv[argc] = (char *)args[argc];
		argc++;
	}
	argv[argc] = NULL;
	char po[128], pe[128];
	snprintf(po, sizeof po, "tests/tmp/test_seq_%d.out", (int)getpid());
	snprintf(pe, sizeof pe, "tests/tmp/test_seq_%d.err", (int)getpid());
	fflush(stdout);
	fflush(stderr);
	int so = dup(1), se = dup(2);
	FILE *fo = fopen(po, "w"), *fe = fopen(pe, "w");
	ck_assert(fo && fe);
	dup2(fileno(fo), 1);
	dup2(fileno(fe), 2);
	int rc = rt_cli_main(argc, argv, kvp_registry, kvp_registry_count);
	fflush(stdout);
	fflush(stderr);
	dup2(so, 1);
	dup2(se, 2);
	close(so), close(se);
	fclose(fo), fclose(fe);
	FILE *f = fopen(po, "r");
	size_t n = fread(out, 1, on - 1, f);
	out[n] = 0;
	fclose(f);
	f = fopen(pe, "r");
	n = fread(errb, 1, en - 1, f);
	errb[n] = 0;
	fclose(f);
	unlink(po), unlink(pe);
	return rc;
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static const char *write_text(char *path, const char *tag, const char *bytes, size_t n)
{
	snprintf(path, 128, "tests/tmp/test_seq_%d_%s.txt", (int)getpid(), tag);
	FILE *f = fopen(path, "wb");
	ck_assert(f != NULL);
	ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
	fclose(f);
	return path;
}

static const char k_text[] =
	"The quick brown fox jumps over the lazy dog. A stitch in time saves nine. "
	"All that glitters is not gold; the early bird catches the worm.";

/* A sequence of policy p over an N-token prompt in a store of type t at byte ratio R,
 * prompt chunks of `chunk` (the byte-budget tests below). */
static void seq_open_bytes(rt_seq *s, const rt_model *m, const struct kvp_policy *p,
                           enum rt_kv_type t, int n, int chunk, double R)
{
	rt_err err = { "" };
	ck_assert_msg(rt_seq_init_typed(s, m, p, t, n, chunk, n, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_seq_set_byte_ratio(s, R, &err) == 0, "%s", err.msg);
}

/* A byte budget holds on every store type (docs/language.md 7.8: --byte-ratio R keeps the
 * bytes of context / R f16 entries): tova (compress every step, no guard) at byte ratio 4
 * over 96 tokens fed one at a time never holds more than 24 f16 entries' bytes plus the
 * entry each step appends, and ends with the entries those bytes buy, by hand at head_dim
 * 32: 24 x 128 bytes = 12 f32 entries (256 bytes of key and value rows), 24 f16 entries,
 * 45 q8_0 entries (68 bytes: 32 codes and an f16 scale per row). A trigger that counted
 * plain entries against the budget let an f32 store refill to 24 entries, twice its
 * bytes, between compressions. */
START_TEST(byte_budget_every_store)
{
	const enum rt_kv_type types[3] = { RT_KV_F32, RT_KV_F16, RT_KV_Q8_0 };
	const int want_n[3] = { 12, 24, 45 };
	enum { N = 96 };
	rt_model *m = load_shape(0);
	const struct kvp_policy *p = find_policy("tova");
	int32_t tok[N];
	test_tokens(tok, N, 300, 5u);
	for (int t = 0; t < 3; t++) {
		rt_seq s;
		rt_err err = { "" };
		seq_open_bytes(&s, m, p, types[t], N, 1, 4);
		ck_assert_int_eq(s.kv.head_dim, 32);
		const double H = (double)s.kv.n_layer * s.kv.n_kv_head;
		const double budget = H * (N / 4.0) * 128.0, entry = H * 2.0 * (double)s.kv.row_bytes;
		for (int i = 0; i < N; i++) {
			ck_assert_msg(rt_seq_feed(&s, tok + i, 1, NULL, RT_LOGITS_NONE, &err) == 0, "%s",
			              err.msg);
			const double held = (double)rt_kvbytes_held(&s.kv);
			ck_assert_msg(held <= budget + entry, "%s store, token %d: %g bytes held, budget %g",
			              rt_kv_type_name(types[t]), i, held, budget);
		}
		ck_assert_msg(rt_kv_entries(&s.kv) == (int64_t)H * want_n[t], "%s store: %lld entries, "
		              "want %d per head", rt_kv_type_name(types[t]),
		              (long long)rt_kv_entries(&s.kv), want_n[t]);
		rt_seq_free(&s);
	}
	rt_model_free(m);
}
END_TEST

/* A floor counts entries on every store (docs/language.md 7.10: `min 64 tokens` keeps at
 * least min(64, context) entries per head): tova_tiers (sinks 4, recent 32 at the top
 * tier, the rest bought by utility per byte) at byte ratio 8 over 96 tokens of an f32
 * store keeps at least 64 entries per head, though 96 / 8 = 12 f16 entries' bytes buy
 * fewer; a floor counted in f16 entries' bytes (32 f32 rows) fell below its guards'
 * 36 f32 rows and kept the guards alone. On f16 rows the floor's 64 entries' bytes hold
 * the guards and buy more entries at the lower tiers. */
START_TEST(byte_floor_counts_entries)
{
	enum { N = 96 };
	const enum rt_kv_type types[2] = { RT_KV_F32, RT_KV_F16 };
	rt_model *m = load_shape(0);
	const struct kvp_policy *p = find_policy("tova_tiers");
	int32_t tok[N];
	test_tokens(tok, N, 300, 9u);
	for (int t = 0; t < 2; t++) {
		rt_seq s;
		seq_open_bytes(&s, m, p, types[t], N, 8, 8);
		feed_ok(&s, tok, N, NULL);
		ck_assert(rt_seq_stats_get(&s).compress_events > 0);
		for (int l = 0; l < s.kv.n_layer; l++)
			for (int g = 0; g < s.kv.n_kv_head; g++)
				ck_assert_msg(rt_kv_head_at(&s.kv, l, g)->n >= 64, "%s store: layer %d head "
				              "%d keeps %d entries, under the floor of 64",
				              rt_kv_type_name(types[t]), l, g, rt_kv_head_at(&s.kv, l, g)->n);
		rt_seq_free(&s);
	}
	rt_model_free(m);
}
END_TEST

/* GraceKV (f32 rows only) under a byte ratio keeps the bytes the ratio asks: its core
 * counts entries of f32 rows, so at byte ratio 4 over a 128-token prompt (scaled down, no
 * floor) it keeps 128 / 4 = 32 f16 entries' bytes per head, 16 f32 entries: 4x in bytes
 * against the f16 full cache, 8x in entries. A core that read the budget's f16 entries'
 * worth as entries kept 32 f32 rows, 2x in bytes. */
START_TEST(gracekv_byte_ratio)
{
	enum { N = 128 };
	rt_model *m = load_shape(0);
	const struct kvp_policy *p = find_policy("gracekv");
	int32_t tok[N];
	test_tokens(tok, N, 300, 3u);
	rt_seq s;
	rt_err err = { "" };
	seq_open(&s, m, p, N, 16, N);
	s.run.ctx.min_kv = -1; /* strict: no floor */
	ck_assert_msg(rt_seq_set_byte_ratio(&s, 4, &err) == 0, "%s", err.msg);
	feed_ok(&s, tok, N, NULL);
	ck_assert_int_eq(s.kv.type, RT_KV_F32);
	const double H = (double)s.kv.n_layer * s.kv.n_kv_head;
	ck_assert_msg(fabs((double)rt_kv_entries(&s.kv) / H - 16.0) < 0.5, "%g entries per head",
	              (double)rt_kv_entries(&s.kv) / H);
	ck_assert_msg(fabs(H * N * 128.0 / (double)rt_kvbytes_held(&s.kv) - 4.0) < 0.15,
	              "%g x in bytes", H * N * 128.0 / (double)rt_kvbytes_held(&s.kv));
	rt_seq_free(&s);
	rt_model_free(m);
}
END_TEST

START_TEST(cli_bad_input)
{
	char out[8192], e[2048];
	char tp[128], bp[128];
	const char *txt = write_text(tp, "ok", k_text, sizeof k_text - 1);
	const char *mp = model_path(0);
	/* unknown policy: usage error naming it and the policies there are */
	const char *a1[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "nosuch", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a1), 2);
	ck_assert_msg(strstr(e, "kvx: unknown policy 'nosuch'") == e && strstr(e, "h2o"), "%s", e);
	ck_assert_int_le(count_lines(e), 2);
	/* a flag given a value: the stray word is explained by the flag before it */
	const char *aj[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--json", "out.json", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, aj), 2);
	ck_assert_msg(strstr(e, "unexpected argument 'out.json': --json takes no value (the JSON "
	                     "goes to standard output"), "%s", e);
	/* unknown --set name */
	const char *a2[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "h2o",
		             "--set", "bogus=3", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a2), 2);
	ck_assert_msg(strstr(e, "policy h2o: no parameter 'bogus'") != NULL, "%s", e);
	ck_assert_int_le(count_lines(e), 2);
	/* a --set value that is not a number */
	const char *a3[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "h2o",
		             "--set", "heavy=lots", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a3), 2);
	ck_assert_msg(strstr(e, "needs a finite number") != NULL, "%s", e);
	/* ratio below 1 */
	const char *a4[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "h2o",
		             "--ratio", "0.5", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a4), 2);
	ck_assert_msg(strstr(e, "--ratio: '0.5' is not a compression factor >= 1") != NULL, "%s", e);
	/* ratio on a policy that never compresses */
	const char *a5[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "full",
		             "--ratio", "4", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a5), 2);
	ck_assert_msg(strstr(e, "never compresses") != NULL, "%s", e);
	/* text that is not UTF-8: runtime error with the file, line, column and byte offset
	 * (rt_text_read's message) */
	static const char bad[] = "valid start \xff\xfe then junk";
	const char *btxt = write_text(bp, "bad", bad, sizeof bad - 1);
	const char *a6[] = { "kvx", "ppl", "--model", mp, "--text", btxt, "--policy", "h2o", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a6), 1);
	char want[256];
	snprintf(want, sizeof want, "kvx: %s:1:13: not valid UTF-8 (byte offset 12, byte 0xff); a text "
	         "must be UTF-8\n", btxt);
	ck_assert_str_eq(e, want);
	unlink(btxt);
	/* a missing model file: runtime error */
	const char *a7[] = { "kvx", "ppl", "--model", "tests/tmp/no_such_model.gguf", "--text", txt,
		             NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a7), 1);
	ck_assert_int_eq(count_lines(e), 1);
	ck_assert_msg(strstr(e, "no_such_model.gguf") != NULL, "%s", e);
	/* unknown command and option */
	const char *a8[] = { "kvx", "frobnicate", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a8), 2);
	const char *a9[] = { "kvx", "needle", "--model", mp, "--depths", "0,150", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, a9), 2);
	ck_assert_msg(strstr(e, "--depths") != NULL, "%s", e);
	/* --kv-type: an unknown word, a narrow type on the exact path (ppl's default), and a
	 * policy that needs f32 rows on a narrow store are usage errors naming the option */
	const char *k1[] = { "kvx", "run", "--model", mp, "--prompt", "hi", "--kv-type", "q4", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, k1), 2);
	ck_assert_msg(strstr(e, "--kv-type: 'q4' is not f32, f16 or q8_0") != NULL, "%s", e);
	const char *k2[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--kv-type", "f16", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, k2), 2);
	ck_assert_msg(strstr(e, "--kv-type f16: the exact path stores f32") != NULL, "%s", e);
	const char *k3[] = { "kvx", "run", "--model", mp, "--prompt", "hi", "--exact", "--kv-type",
		             "q8_0", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, k3), 2);
	ck_assert_msg(strstr(e, "--kv-type q8_0: the exact path") != NULL, "%s", e);
	if (find_policy("gracekv")) {
		const char *k4[] = { "kvx", "run", "--model", mp, "--prompt", "hi", "--policy",
			             "gracekv", "--kv-type", "f16", NULL };
		ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, k4), 2);
		ck_assert_msg(strstr(e, "policy gracekv reads and rewrites f32") != NULL, "%s", e);
	}
	/* every command's --help exits 0 and names the command */
	static const char *const cmds[] = { "info", "ppl", "needle", "run", "tokenize", "bench" };
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		const char *ah[] = { "kvx", cmds[i], "--help", NULL };
		ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, ah), 0);
		char nm[64];
		snprintf(nm, sizeof nm, "kvx %s - ", cmds[i]);
		ck_assert_msg(strstr(out, nm) != NULL, "%s --help: %s", cmds[i], out);
		ck_assert_str_eq(e, "");
	}
	unlink(txt);
}
END_TEST

/* ppl through the command line on a tiny model: the JSON record carries the reference
 * statistics and memory figures, and the KL of the full policy against itself is 0. */
START_TEST(cli_ppl_json)
{
	char out[8192], e[2048];
	char text[4096] = "";
	for (int i = 0; i < 6; i++)
		strcat(text, k_text);
	char tp[128];
	const char *txt = write_text(tp, "ppl", text, strlen(text));
	const char *mp = model_path(1);
	const char *a[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "h2o",
		            "--ratio", "2", "--ctx", "80", "--chunk", "7", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, a) == 0, "%s", e);
	static const char *const keys[] = { "\"kld_mean\":", "\"kld_p99\":", "\"kld_max\":",
		"\"ppl_ratio\":", "\"same_top1\":", "\"rms_dp\":", "\"kv_entries_peak\":",
		"\"kv_bytes_peak\":", "\"compression\":", "\"tokens_per_s\":",
		"\"compress_events\":", "\"policy_seconds\":", "\"model_sha256\":",
		"\"text_sha256\":", "\"params\":{\"heavy\":0.1,\"recent\":0.1}", "\"ratio\":2" };
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
		ck_assert_msg(strstr(out, keys[i]) != NULL, "missing %s in %s", keys[i], out);
	double comp = atof(strstr(out, "\"compression\":") + 14);
	/* ratio 2 of 80 tokens asks for 40 entries per head; the library H2O's floor
	 * (`min 64 tokens`) keeps 64: 80 / 64 = 1.25 */
	ck_assert_msg(fabs(comp - 1.25) < 0.01, "compression %g at ratio 2 under the floor 64", comp);
	/* and says so: the JSON's budget_notes and a note on stderr */
	ck_assert_msg(strstr(out, "\"budget_notes\":[\"the floor (min_kv, or the policy's budget "
	                     "min) raised the budget\"]") != NULL, "%s", out);
	ck_assert_msg(strstr(e, "note: policy h2o: the floor") != NULL, "%s", e);
	ck_assert(atof(strstr(out, "\"kld_mean\":") + 11) > 0);
	ck_assert_int_eq(count_lines(out), 1);
	char out_h2o_keep[8192];
	memcpy(out_h2o_keep, out, sizeof out_h2o_keep);
	/* full vs full: no reference run, and ppl equals the h2o run's reference ppl */
	double ppl_ref = atof(strstr(out, "\"ppl_ref\":") + 10);
	const char *b[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "full",
		            "--ctx", "80", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, b) == 0, "%s", e);
	ck_assert(strstr(out, "kld_mean") == NULL);
	ck_assert_msg(strstr(out, "\"budget_notes\":[]") != NULL, "%s", out);
	double ppl = atof(strstr(out, "\"ppl\":") + 6);
	ck_assert_msg(fabs(ppl - ppl_ref) < 1e-4 * ppl, "full ppl %g vs reference %g", ppl, ppl_ref);
	/* --batch: the h2o run above and a tova run in one lockstep pass give what separate runs
	 * give (ppl and KL), one JSON line each in file order */
	double h2o_ppl = atof(strstr(out_h2o_keep, "\"ppl\":") + 6);
	double h2o_kld = atof(strstr(out_h2o_keep, "\"kld_mean\":") + 11);
	const char *c1[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "tova",
		             "--ratio", "4", "--ctx", "80", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, c1) == 0, "%s", e);
	double tova_ppl = atof(strstr(out, "\"ppl\":") + 6);
	char bp[128];
	const char *runs = "# two runs\nh2o --ratio 2\n\n  tova --ratio 4\n";
	const char *bf = write_text(bp, "runs", runs, strlen(runs));
	const char *c2[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--batch", bf,
		             "--ctx", "80", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, c2) == 0, "%s", e);
	ck_assert_int_eq(count_lines(out), 2);
	const char *l2 = strchr(out, '\n') + 1;
	ck_assert(strstr(out, "\"policy\":\"h2o\"") < l2 && strstr(l2, "\"policy\":\"tova\""));
	ck_assert(strstr(out, "\"batch\":3") != NULL);
	ck_assert_msg(fabs(atof(strstr(out, "\"ppl\":") + 6) - h2o_ppl) < 1e-4 * h2o_ppl, "%s", out);
	ck_assert(fabs(atof(strstr(out, "\"kld_mean\":") + 11) - h2o_kld) < 1e-4 * h2o_kld + 1e-7);
	ck_assert(fabs(atof(strstr(l2, "\"ppl\":") + 6) - tova_ppl) < 1e-4 * tova_ppl);
	/* a batch line's --kv-type stores that run's rows in another type against the same
	 * f32 reference: the full cache in f32 rows is the reference itself (KL 0, half the
	 * bytes of an f16 cache), in f16 rows it is the f16 cache (bytes 1x) whose rounding
	 * costs a small, non-zero KL */
	const char *kvr = "full --kv-type f32\nfull --kv-type f16\n";
	write_text(bp, "runs", kvr, strlen(kvr));
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, c2) == 0, "%s", e);
	l2 = strchr(out, '\n') + 1;
	ck_assert_msg(strstr(out, "\"kv_type\":\"f32\"") < l2 && strstr(l2, "\"kv_type\":\"f16\""), "%s", out);
	ck_assert_msg(atof(strstr(out, "\"kld_mean\":") + 11) == 0, "%s", out);
	ck_assert(fabs(atof(strstr(out, "\"bytes_compression\":") + 20) - 0.5) < 1e-9);
	double k16 = atof(strstr(l2, "\"kld_mean\":") + 11);
	ck_assert_msg(k16 > 0 && k16 < 1e-3, "f16 rows: kld_mean %g", k16);
	ck_assert(fabs(atof(strstr(l2, "\"bytes_compression\":") + 20) - 1.0) < 1e-9);
	/* on the fast path a line that names no store gets what a single run of its policy
	 * gets: GraceKV (it rewrites f32 rows) f32, the h2o beside it the f16 of the
	 * reference; a command that names f16 has chosen every line's store, and GraceKV's
	 * line is refused with the reason */
	const char *gr = "gracekv --ratio 2\nh2o --ratio 2\n";
	write_text(bp, "runs", gr, strlen(gr));
	const char *g1[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--batch", bf, "--fast",
		             "--ctx", "80", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, g1) == 0, "%s", e);
	ck_assert_int_eq(count_lines(out), 2);
	l2 = strchr(out, '\n') + 1;
	const char *t32 = strstr(out, "\"kv_type\":\"f32\""), *t16 = strstr(l2, "\"kv_type\":\"f16\"");
	ck_assert_msg(t32 && t32 < l2 && t16, "%s", out);
	const char *g2[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--batch", bf, "--fast",
		             "--kv-type", "f16", "--ctx", "80", "--json", NULL };
	ck_assert_int_ne(cli(out, sizeof out, e, sizeof e, g2), 0);
	ck_assert_msg(strstr(e, "needs --kv-type f32") != NULL, "%s", e);
	const char *kvbad = "full --kv-type f8\n";
	write_text(bp, "runs", kvbad, strlen(kvbad));
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, c2), 2);
	ck_assert_msg(strstr(e, ":1: --kv-type: 'f8' is not f32, f16 or q8_0") != NULL, "%s", e);
	/* a run whose guards exceed its budget leaves the pass with an error line; the
	 * others are unchanged and the exit status is 1 (mikv_h2o: its recent window, 10% of
	 * the context, over a ratio-16 budget, and no `min` floor to make it graceful) */
	const char *some = "mikv_h2o --ratio 16\nh2o --ratio 2\n";
	write_text(bp, "runs", some, strlen(some));
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, c2), 1);
	ck_assert_int_eq(count_lines(out), 2);
	l2 = strchr(out, '\n') + 1;
	ck_assert_msg(strstr(out, "\"error\":") && strstr(out, "\"error\":") < l2, "%s", out);
	ck_assert_msg(strstr(e, "policy mikv_h2o: ") != NULL, "%s", e);
	ck_assert(fabs(atof(strstr(l2, "\"ppl\":") + 6) - h2o_ppl) < 1e-4 * h2o_ppl);
	/* --score-from P scores the tokens at positions P .. ctx-1 only */
	const char *d1[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "full",
		             "--ctx", "80", "--score-from", "41", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, d1) == 0, "%s", e);
	ck_assert_msg(strstr(out, "\"scored\":39,\"score_from\":41") != NULL, "%s", out);
	const char *d2[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--ctx", "80",
		             "--score-from", "80", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, d2), 2);
	/* a prompt longer than the 80 tokens fed is a usage error (its ratio budget would be
	 * sized on tokens that never come); the whole fed text as the prompt is fine */
	const char *d3[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--ctx", "80",
		             "--prompt", "81", "--no-ref", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, d3), 2);
	ck_assert_msg(strstr(e, "--prompt 81: only 80 tokens are fed") != NULL, "%s", e);
	d3[9] = "80";
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, d3) == 0, "%s", e);
	/* --prompt 48 with a prompt-end policy at ratio 4: its budget is 48 / 4 = 12 entries
	 * per head, so right after the prompt's compress the prompt is 4x in entries and, f32
	 * rows against f16, 2x in bytes; the 32 tokens after it are appended, 44 entries of 80
	 * tokens at the end (1.82x, 0.91x in bytes); in a batch, f16 rows: 4x both */
	const char *p1[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "snapkv",
		             "--set", "window=8", "--ratio", "4", "--ctx", "80", "--prompt", "48",
		             "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, p1) == 0, "%s", e);
	ck_assert_msg(fabs(atof(strstr(out, "\"prompt_compression\":") + 21) - 4.0) < 1e-9, "%s", out);
	ck_assert_msg(fabs(atof(strstr(out, "\"prompt_bytes_compression\":") + 27) - 2.0) < 1e-9, "%s", out);
	/* (the JSON prints 9 significant digits) */
	ck_assert_msg(fabs(atof(strstr(out, "\"compression\":") + 14) - 80.0 / 44) < 1e-7, "%s", out);
	ck_assert_msg(fabs(atof(strstr(out, "\"bytes_compression\":") + 20) - 40.0 / 44) < 1e-7, "%s", out);
	/* snapkv's own budget (1024 entries) keeps the whole 48-token prompt: the warning says
	 * that, not to pass the --prompt and --score-from already given */
	const char *p0[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--policy", "snapkv",
		             "--ctx", "80", "--prompt", "48", "--score-from", "49", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, p0) == 0, "%s", e);
	ck_assert_msg(strstr(e, "compressed before none") && strstr(e, "its budget keeps every "
	              "entry of the 48-token prompt") && !strstr(e, "measure it with"), "%s", e);
	const char *pr = "snapkv --set window=8 --ratio 4 --kv-type f16\n";
	write_text(bp, "runs", pr, strlen(pr));
	const char *p2[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--batch", bf,
		             "--ctx", "80", "--prompt", "48", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, p2) == 0, "%s", e);
	ck_assert_msg(fabs(atof(strstr(out, "\"prompt_compression\":") + 21) - 4.0) < 1e-9, "%s", out);
	ck_assert_msg(fabs(atof(strstr(out, "\"prompt_bytes_compression\":") + 27) - 4.0) < 1e-9, "%s", out);
	/* without --prompt the whole text is the prompt: no prompt figures */
	ck_assert(strstr(out_h2o_keep, "prompt_compression") == NULL);
	/* a bad batch line names the file and the line; --batch excludes --policy */
	const char *bad = "h2o --ratio 2\nh2o --ratio 0.5\nh2o --sett x=1\nnosuch\n";
	write_text(bp, "runs", bad, strlen(bad));
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, c2), 2);
	/* every bad line, not the first only */
	ck_assert_msg(strstr(e, ":2: --ratio: '0.5' is not a compression factor >= 1") &&
	              strstr(e, ":3: unknown word '--sett'") && strstr(e, "unknown policy 'nosuch'") &&
	              strstr(e, ":4: the run above is refused"), "%s", e);
	const char *bad2 = "nosuch\n";
	write_text(bp, "runs", bad2, strlen(bad2));
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, c2), 2);
	ck_assert_msg(strstr(e, "unknown policy 'nosuch'") && strstr(e, ":1:"), "%s", e);
	const char *c3[] = { "kvx", "ppl", "--model", mp, "--text", txt, "--batch", bf,
		             "--policy", "h2o", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, c3), 2);
	unlink(bf);
	unlink(txt);
}
END_TEST

/* A library policy whose linear scorer was trained for another model (KVzap's, for
 * SmolLM2-135M: 30 layers x 3 KV heads x 576) is refused on each tiny model before anything
 * is allocated, with the weight file and both shapes named - the reason lib_init leaves it
 * out of the every-policy tests. */
START_TEST(hidden_scorer_refused)
{
	int seen = 0;
	for (int i = 0; i < kvp_registry_count; i++) {
		const struct kvp_policy *p = kvp_registry[i];
		if (!(p->needs & KVP_NEED_HIDDEN))
			continue;
		seen++;
		for (int shape = 0; shape < 3; shape++) {
			rt_model *m = load_shape(shape);
			rt_seq s;
			rt_err err = { "" };
			ck_assert_int_ne(rt_seq_init(&s, m, p, N_TOK, 8, PROMPT, &err), 0);
			char want[640];
			snprintf(want, sizeof want, "but the model %s has %d x %d x %d", m->path,
			         m->hp.n_layer, m->hp.n_head_kv, m->hp.n_embd);
			ck_assert_msg(strstr(err.msg, want) && strstr(err.msg, p->hidden_file),
			              "%s: %s", p->name, err.msg);
			rt_model_free(m);
		}
	}
	ck_assert_int_eq(seen, kvp_registry_count - g_lib_n);
}
END_TEST

/* needle and run end to end on a tiny model (its answers are noise; the commands must
 * build the prompts, prefill under the policy, generate and report) */
START_TEST(cli_needle_and_run)
{
	/* info --json lists every library policy with its parameters: tens of KiB */
	static char out[1 << 17], single[1 << 17];
	char e[2048];
	const char *mp = model_path(3);
	const char *a[] = { "kvx", "needle", "--model", mp, "--policy", "h2o", "--ratio", "2",
		            "--lengths", "600", "--depths", "0,100", "--mode", "agnostic", "--json",
		            NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, a) == 0, "%s", e);
	ck_assert_msg(strstr(out, "\"task\":\"passkey\",\"mode\":\"agnostic\"") != NULL, "%s", out);
	/* what remakes the prompts is recorded: the default seed, answer length and chunk */
	ck_assert_msg(strstr(out, "\"seed\":1,\"gen\":8,\"chunk\":512,") != NULL, "%s", out);
	ck_assert_msg(strstr(out, "{\"length\":600,\"depth\":0,") != NULL, "%s", out);
	ck_assert_msg(strstr(out, "{\"length\":600,\"depth\":100,") != NULL, "%s", out);
	ck_assert_msg(strstr(out, "\"accuracy\":") != NULL, "%s", out);
	/* --batch: the same run next to a snapkv run and the full cache gives the same answers
	 * (the "generated" texts) as alone */
	char bp[128];
	memcpy(single, out, sizeof single);
	const char *runs = "full\nh2o --ratio 2\nsnapkv --ratio 2 --set window=8\n";
	const char *bf = write_text(bp, "nruns", runs, strlen(runs));
	const char *a2[] = { "kvx", "needle", "--model", mp, "--batch", bf, "--lengths", "600",
		             "--depths", "0,100", "--mode", "agnostic", "--json", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, a2) == 0, "%s", e);
	ck_assert_int_eq(count_lines(out), 3);
	const char *h = strstr(out, "\"policy\":\"h2o\"");
	ck_assert(h != NULL && strstr(out, "\"policy\":\"snapkv\"") > h);
	const char *gs = strstr(single, "\"results\":"), *gb = strstr(h, "\"results\":");
	size_t glen = (size_t)(strstr(gs, "],\"accuracy\"") - gs);
	ck_assert_msg(strncmp(gs, gb, glen) == 0, "alone %.*s\nbatch %.*s", (int)glen, gs, (int)glen, gb);
	/* the batch's text report: the mode once, then each run with its budget as given and
	 * its 1/0 answers per length (one length here: one row of two depths) */
	a2[12] = NULL;
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, a2) == 0, "%s", e);
	ck_assert_msg(strstr(out, "passkey, 3 runs in lockstep (agnostic mode)") &&
	              strstr(out, "\nfull at its own budget: accuracy ") &&
	              strstr(out, "\nh2o at ratio 2: accuracy ") &&
	              strstr(out, "\nsnapkv (with --set) at ratio 2: accuracy "), "%s", out);
	ck_assert_int_eq(count_lines(out), 2 + 3 * 2);
	/* without --mode the batch's prompt-end policy (snapkv) sets agnostic for every run:
	 * a note names the streaming one it moves (h2o), not snapkv or the full cache */
	a2[10] = NULL;
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, a2) == 0, "%s", e);
	ck_assert_msg(strstr(out, "(agnostic mode)") &&
	              strstr(e, "note: h2o is a streaming policy measured in agnostic mode") &&
	              !strstr(e, "snapkv is") && !strstr(e, "full is"), "%s", e);
	unlink(bf);
	/* a length too short for the fixed parts is a usage error naming the option, before
	 * any output */
	const char *b[] = { "kvx", "needle", "--model", mp, "--lengths", "20", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, b), 2);
	ck_assert_msg(strstr(e, "--lengths 20 at depth") && strstr(e, "too short"), "%s", e);
	ck_assert_str_eq(out, "");
	const char *c[] = { "kvx", "run", "--model", mp, "--prompt", "hello there", "-n", "6",
		            "--policy", "streaming_llm", "--set", "sinks=1", "--set", "recent=4", NULL };
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, c) == 0, "%s", e);
	ck_assert_int_eq(count_lines(out), 1);
	/* sampling: top-k 1 at any temperature is the greedy text; a seed repeats its text */
	const char *base[] = { "kvx", "run", "--model", mp, "--prompt", "hello there", "-n", "12",
		               NULL, NULL, NULL, NULL, NULL, NULL, NULL };
	static char greedy[1 << 17], first[1 << 17];
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, base) == 0, "%s", e);
	memcpy(greedy, out, sizeof greedy);
	const char *k1[] = { "--temp", "1.5", "--top-k", "1" };
	memcpy(&base[8], k1, sizeof k1);
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, base) == 0, "%s", e);
	ck_assert_str_eq(out, greedy);
	const char *s7[] = { "--temp", "2", "--seed", "7" };
	memcpy(&base[8], s7, sizeof s7);
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, base) == 0, "%s", e);
	memcpy(first, out, sizeof first);
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, base) == 0, "%s", e);
	ck_assert_str_eq(out, first);
	/* and it is the seed that makes it: another seed, another text (12 draws at
	 * temperature 2 over 300 tokens), and not the greedy one */
	base[11] = "8";
	ck_assert_msg(cli(out, sizeof out, e, sizeof e, base) == 0, "%s", e);
	ck_assert_msg(strcmp(out, first) != 0 && strcmp(first, greedy) != 0, "seed 7 '%s', seed 8 "
	              "'%s', greedy '%s'", first, out, greedy);
	const char *bads[][2] = { { "--temp", "2.5" }, { "--top-p", "0" }, { "--seed", "0x10" },
		                  { "--top-k", "-1" } };
	for (int i = 0; i < 4; i++) {
		memcpy(&base[8], bads[i], sizeof bads[i]);
		base[10] = NULL;
		ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, base), 2);
		ck_assert_msg(strstr(e, bads[i][0]) && strstr(e, bads[i][1]), "%s", e);
	}
	/* a truncation without a temperature would be greedy: refused, not ignored */
	base[8] = "--top-k";
	base[9] = "5";
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, base), 2);
	ck_assert_msg(strstr(e, "needs --temp T > 0"), "%s", e);
	const char *d[] = { "kvx", "info", "--json", NULL };
	ck_assert_int_eq(cli(out, sizeof out, e, sizeof e, d), 0);
	for (int i = 0; i < kvp_registry_count; i++) {
		char nm[80];
		snprintf(nm, sizeof nm, "{\"name\":\"%s\"", kvp_registry[i]->name);
		ck_assert_msg(strstr(out, nm) != NULL, "info lacks %s", nm);
		/* kv_f32_only is the store refusal's flag: every policy with KVP_NEED_F32_KV,
		 * and only those (rt_run_init_typed refuses them an f16 store) */
		const char *at = strstr(out, nm), *f = strstr(at, "\"kv_f32_only\":");
		const int need = (kvp_registry[i]->needs & KVP_NEED_F32_KV) != 0;
		ck_assert_msg(f && strncmp(f + 14, need ? "true" : "false", need ? 4 : 5) == 0,
		              "%s: kv_f32_only is not %d", kvp_registry[i]->name, need);
		if (need) { /* refused before anything is allocated */
			rt_kv kv;
			struct rt_run r;
			rt_err er = { "" };
			const int rc = rt_run_init_typed(&r, &kv, RT_KV_F16, kvp_registry[i], 2, 1, 1,
			                                 32, 64, -1, &er);
			ck_assert_msg(rc != 0 && strstr(er.msg, "needs --kv-type f32") != NULL,
			              "%s: f32-only, but an f16 store was not refused: %s",
			              kvp_registry[i]->name, er.msg);
		}
	}
}
END_TEST

/* ---- suite ----------------------------------------------------------------------------- */

static void cleanup(void)
{
	for (int i = 0; i < 4; i++)
		if (g_model_path[i][0])
			unlink(g_model_path[i]);
}

static Suite *seq_suite(void)
{
	Suite *s = suite_create("seq");
	TCase *tc = tcase_create("seq");
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, evicted_h2o_original, 0, 3);
	tcase_add_loop_test(tc, threads_same_kept_sets, 0, 3);
	tcase_add_test(tc, serve_footprint_prefill_chunk);
	tcase_add_loop_test(tc, evicted_tova_original, 0, 3);
	tcase_add_loop_test(tc, evicted_streaming_compacted, 0, 3);
	tcase_add_loop_test(tc, compacted_rerotation_narrow_store, 0, 3);
	tcase_add_loop_test(tc, compacted_window_trimmed, 0, 4);
	tcase_add_loop_test(tc, evicted_snapkv_prompt_end, 0, 3);
	tcase_add_loop_test(tc, chunked_equals_stepwise_every_policy, 0, 3 * (g_lib_n + 1));
	tcase_add_loop_test(tc, batch_equals_alone_every_policy, 0, 3);
	tcase_add_loop_test(tc, batch_equals_alone_fast_path, 0, 2);
	tcase_add_loop_test(tc, trace_records_the_prompt, 0, 3);
	tcase_add_loop_test(tc, spans_mark_appended_entries, 0, 3);
	tcase_add_loop_test(tc, first_compress_is_the_first_that_changed_the_cache, 0, 3);
	tcase_add_test(tc, second_sequence_equals_fresh);
	tcase_add_test(tc, device_interface_equals_cpu);
	tcase_add_loop_test(tc, init_entries_before_observe, 0, 3);
	tcase_add_loop_test(tc, h2o_ratio4_memory_bounded, 0, 3);
	tcase_add_test(tc, feed_allocates_nothing_any_policy);
	tcase_add_loop_test(tc, pool_accounting_every_policy, 0, 2);
	tcase_add_test(tc, pool_exhaustion_fails_one_sequence);
	tcase_add_loop_test(tc, multi_step_equals_alone, 0, 3);
	tcase_add_test(tc, capacity_too_small_is_an_error);
	tcase_add_test(tc, budget_edges);
	tcase_add_test(tc, cli_bad_input);
	tcase_add_test(tc, cli_ppl_json);
	tcase_add_test(tc, byte_budget_every_store);
	tcase_add_test(tc, byte_floor_counts_entries);
	tcase_add_test(tc, gracekv_byte_ratio);
	tcase_add_test(tc, cli_needle_and_run);
	tcase_add_test(tc, hidden_scorer_refused);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	/* the models are written once, by the parent, before check forks the tests */
	for (int i = 0; i < 4; i++) {
		mkdir("tests/tmp", 0755);
		snprintf(g_model_path[i], sizeof g_model_path[i], "tests/tmp/test_seq_%d_s%d.gguf",
		         (int)getpid(), i);
		tiny_model_cfg c = shape_cfg(i < 3 ? i : 1);
		if (i == 3)
			c.n_ctx = 1024;
		if (tiny_model_write(&c, g_model_path[i]) != 0) {
			fprintf(stderr, "test_seq: cannot write %s\n", g_model_path[i]);
			return EXIT_FAILURE;
		}
	}
	lib_init();
	int failed = check_run(seq_suite());
	cleanup();
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
