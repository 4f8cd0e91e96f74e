/*
 * test_model: the llama forward pass (runtime/model/rt_model.c) on tiny synthetic models written
 * by tests/support/tiny_model.c, with grouped-query shapes 9q/3kv, 4q/1kv and 4q/4kv and
 * F32, Q4_1 and Q8_0 weights. The oracle is an independent naive forward written here
 * with plain loops in double precision (its own RMSNorm, adjacent-pair RoPE, softmax
 * attention with an explicit per-(layer, KV head) visibility mask, SwiGLU), reading the
 * weights straight from the GGUF through rt_gguf + rt_dequant. Checked:
 *   - logits == reference (1e-4), for every row of a prefill;
 *   - one-shot prefill == token-by-token == chunked (chunks 3, 5, 7, 1) (1e-5);
 *   - after per-head eviction with rt_kv_head_keep (a different kept set per KV head), the
 *     next token's logits == the reference restricted to those kept positions (1e-5);
 *   - an entry of count 2 == two identical entries (1e-5), and != one entry;
 *   - the observe hook sees probabilities that sum to 1 and outputs equal to Σ p v;
 *   - bad files and inputs give one clear error, never a crash;
 *   - rt_eval (runtime/eval/rt_eval.c): perplexity, per-token log-probabilities and argmaxes
 *     equal those computed here from the reference logits; the --dump lines and the raw
 *     logits file hold what they claim; rt_logprob on hand-computed rows.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/gguf_writer.h"
#include "eval/rt_eval.h"
#include "model/rt_gguf.h"
#include "kv/rt_kv.h"
#include "base/rt_rope.h"
#include "model/rt_model.h"
#include "model/rt_quant.h"
#include "model/rt_chat.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_seq.h"
#include "support/tiny_model.h"
#include "support/check_run.h"

/* the exact path: these tests compare against f32 references */
static const rt_model_opts exact_opts = { .exact = 1, .threads = 0 };

/* ---- fixtures ---------------------------------------------------------------------- */

static char g_path[256];

static void tmp_path(char *buf, size_t n, const char *tag)
{
	mkdir("tests/tmp", 0755);
	snprintf(buf, n, "tests/tmp/test_model_%d_%s.gguf", (int)getpid(), tag);
}

static tiny_model_cfg shape_cfg(int shape, uint32_t wtype)
{
	/* shape 0: 9q/3kv head_dim 32; 1: 4q/1kv head_dim 16; 2: 4q/4kv head_dim 16 */
	tiny_model_cfg c = { .n_layer = 2, .n_ff = 96, .n_vocab = 300, .n_ctx = 64,
		             .rope_base = 10000.0f, .seed = 1234u + (uint32_t)shape, .wtype = wtype };
	if (shape == 0)
		c.n_head = 9, c.n_head_kv = 3, c.n_embd = 288;
	else if (shape == 1)
		c.n_head = 4, c.n_head_kv = 1, c.n_embd = 64;
	else
		c.n_head = 4, c.n_head_kv = 4, c.n_embd = 64;
	return c;
}

static const char *write_model(const tiny_model_cfg *c)
{
	tmp_path(g_path, sizeof g_path, "m");
	ck_assert_int_eq(tiny_model_write(c, g_path), 0);
	return g_path;
}

static rt_model *load_ok(const char *path)
{
	rt_err err = {0};
	rt_model *m = rt_model_open(path, &exact_opts, &err);
	if (!m)
		ck_abort_msg("load failed: %s", err.msg);
	return m;
}

static void test_tokens(int32_t *t, int n, int vocab, unsigned seed)
{
	for (int i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		t[i] = (int32_t)((seed >> 8) % (unsigned)vocab);
	}
}

/* ---- the naive reference ------------------------------------------------------------ */

typedef struct ref {
	int L, E, F, H, HKV, hd, V;
	double base, eps;
	float *embd, *onorm;
	float *an[4], *wq[4], *wk[4], *wv[4], *wo[4], *fn[4], *wg[4], *wu[4], *wd[4];
} ref;

static float *ref_tensor(rt_gguf *g, const char *name, int64_t n)
{
	const rt_gguf_tensor *t = rt_gguf_find_tensor(g, name);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(t->ne[0] * (t->n_dims > 1 ? t->ne[1] : 1), n);
	float *v = malloc((size_t)n * sizeof *v);
	ck_assert_int_eq(rt_dequant(t->type, t->data, v, n), 0);
	return v;
}

static void ref_load(ref *r, const tiny_model_cfg *c, const char *path)
{
	rt_err err = {0};
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_int_le(c->n_layer, 4);
	r->L = c->n_layer, r->E = c->n_embd, r->F = c->n_ff, r->H = c->n_head;
	r->HKV = c->n_head_kv, r->hd = c->n_embd / c->n_head, r->V = c->n_vocab;
	r->base = c->rope_base, r->eps = 1e-5;
	int64_t E = r->E, F = r->F, kd = (int64_t)r->HKV * r->hd;
	r->embd = ref_tensor(g, "token_embd.weight", E * r->V);
	r->onorm = ref_tensor(g, "output_norm.weight", E);
	for (int l = 0; l < r->L; l++) {
		char nm[64];
#define T(field, sfx, n)                                               \
	snprintf(nm, sizeof nm, "blk.%d." sfx ".weight", l);          \
	r->field[l] = ref_tensor(g, nm, (n));
		T(an, "attn_norm", E);
		T(wq, "attn_q", E * E);
		T(wk, "attn_k", E * kd);
		T(wv, "attn_v", E * kd);
		T(wo, "attn_output", E * E);
		T(fn, "ffn_norm", E);
		T(wg, "ffn_gate", E * F);
		T(wu, "ffn_up", E * F);
		T(wd, "ffn_down", F * E);
#undef T
	}
	rt_gguf_close(g);
}

static void ref_free(ref *r)
{
	free(r->embd);
	free(r->onorm);
	for (int l = 0; l < r->L; l++) {
		free(r->an[l]), free(r->wq[l]), free(r->wk[l]), free(r->wv[l]), free(r->wo[l]);
		free(r->fn[l]), free(r->wg[l]), free(r->wu[l]), free(r->wd[l]);
	}
}

/* visibility: may query position qp of (layer, kv head) attend to key position kp? */
typedef int (*ref_visible_fn)(const void *u, int layer, int kvh, int qp, int kp);

static void ref_rmsnorm(double *y, const double *x, const float *w, int n, double eps)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	double s = 1.0 / sqrt(ss / n + eps);
	for (int i = 0; i < n; i++)
		y[i] = x[i] * s * w[i];
}

/* y[out] = W[out × in] x[in] */
static void ref_matvec(double *y, const float *W, const double *x, int out, int in)
{
	for (int o = 0; o < out; o++) {
		double s = 0;
		for (int i = 0; i < in; i++)
			s += (double)W[(size_t)o * in + i] * x[i];
		y[o] = s;
	}
}

/* adjacent pairs (v[2i], v[2i+1]) rotated by pos · base^(-2i/hd) */
static void ref_rope(double *v, int hd, int pos, double base)
{
	for (int i = 0; i < hd / 2; i++) {
		double th = pos * pow(base, -2.0 * i / hd);
		double a = v[2 * i], b = v[2 * i + 1];
		v[2 * i] = a * cos(th) - b * sin(th);
		v[2 * i + 1] = a * sin(th) + b * cos(th);
	}
}

/* NULL, or called by ref_forward with every query head's attention row: query h of layer l
 * at position t, p[0..t] the unnormalised weights (0 where not visible), sum their total. */
typedef void (*ref_attn_fn)(void *u, int layer, int h, int t, const double *p, double sum);
static ref_attn_fn ref_attn_hook;
static void *ref_attn_user;

/* Full forward over tokens[0..n) at positions 0..n-1; logits [n × V]. Attention of query
 * t over keys s <= t with vis(layer, kvh, t, s). */
static void ref_forward(const ref *r, const int32_t *tok, int n, ref_visible_fn vis,
                        const void *u, double *logits)
{
	int E = r->E, hd = r->hd, H = r->H, HKV = r->HKV, G = H / HKV, F = r->F;
	double *x = calloc((size_t)n * E, sizeof *x);
	double *xn = malloc((size_t)E * sizeof *xn);
	double *q = malloc((size_t)n * H * hd * sizeof *q);
	double *k = malloc((size_t)n * HKV * hd * sizeof *k);
	double *v = malloc((size_t)n * HKV * hd * sizeof *v);
	double *att = malloc((size_t)E * sizeof *att);
	double *tmp = malloc((size_t)E * sizeof *tmp);
	double *g = malloc((size_t)F * sizeof *g), *up = malloc((size_t)F * sizeof *up);
	double *p = malloc((size_t)n * sizeof *p);
	for (int t = 0; t < n; t++)
		for (int i = 0; i < E; i++)
			x[(size_t)t * E + i] = r->embd[(size_t)tok[t] * E + i];
	for (int l = 0; l < r->L; l++) {
		for (int t = 0; t < n; t++) {
			ref_rmsnorm(xn, x + (size_t)t * E, r->an[l], E, r->eps);
			ref_matvec(q + (size_t)t * H * hd, r->wq[l], xn, H * hd, E);
			ref_matvec(k + (size_t)t * HKV * hd, r->wk[l], xn, HKV * hd, E);
			ref_matvec(v + (size_t)t * HKV * hd, r->wv[l], xn, HKV * hd, E);
			for (int h = 0; h < H; h++)
				ref_rope(q + ((size_t)t * H + h) * hd, hd, t, r->base);
			for (int h = 0; h < HKV; h++)
				ref_rope(k + ((size_t)t * HKV + h) * hd, hd, t, r->base);
		}
		for (int t = 0; t < n; t++) {
			for (int h = 0; h < H; h++) {
				int kh = h / G;
				const double *qv = q + ((size_t)t * H + h) * hd;
				double mx = -INFINITY;
				for (int s = 0; s <= t; s++) {
					if (!vis(u, l, kh, t, s)) {
						p[s] = -INFINITY;
						continue;
					}
					double d = 0;
					for (int i = 0; i < hd; i++)
						d += qv[i] * k[((size_t)s * HKV + kh) * hd + i];
					p[s] = d / sqrt((double)hd);
					if (p[s] > mx)
						mx = p[s];
				}
				double sum = 0;
				for (int s = 0; s <= t; s++) {
					p[s] = p[s] == -INFINITY ? 0.0 : exp(p[s] - mx);
					sum += p[s];
				}
				if (ref_attn_hook)
					ref_attn_hook(ref_attn_user, l, h, t, p, sum);
				for (int i = 0; i < hd; i++) {
					double o = 0;
					for (int s = 0; s <= t; s++)
						o += p[s] / sum * v[((size_t)s * HKV + kh) * hd + i];
					att[h * hd + i] = o;
				}
			}
			ref_matvec(tmp, r->wo[l], att, E, E);
			for (int i = 0; i < E; i++)
				x[(size_t)t * E + i] += tmp[i];
			ref_rmsnorm(xn, x + (size_t)t * E, r->fn[l], E, r->eps);
			ref_matvec(g, r->wg[l], xn, F, E);
			ref_matvec(up, r->wu[l], xn, F, E);
			for (int i = 0; i < F; i++)
				g[i] = g[i] / (1.0 + exp(-g[i])) * up[i];
			ref_matvec(tmp, r->wd[l], g, E, F);
			for (int i = 0; i < E; i++)
				x[(size_t)t * E + i] += tmp[i];
		}
	}
	for (int t = 0; t < n; t++) {
		ref_rmsnorm(xn, x + (size_t)t * E, r->onorm, E, r->eps);
		ref_matvec(logits + (size_t)t * r->V, r->embd, xn, r->V, E);
	}
	free(x), free(xn), free(q), free(k), free(v), free(att), free(tmp), free(g), free(up), free(p);
}

static int vis_all(const void *u, int layer, int kvh, int qp, int kp)
{
	(void)u, (void)layer, (void)kvh;
	return kp <= qp;
}

/* ---- helpers over the runtime ------------------------------------------------------- */

/* Run tokens through a fresh store in calls of `step` tokens (0 = all at once) with
 * internal chunk max_chunk; logits [n × V]. */
static void run_model(const rt_model *m, const int32_t *tok, int n, int max_chunk, int step,
                      float *logits)
{
	rt_err err = {0};
	rt_kv kv;
	rt_fwd f;
	ck_assert_int_eq(rt_model_kv_init(m, &kv, n, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&f, m, max_chunk, n, &err), 0);
	if (step == 0)
		step = n;
	for (int i = 0; i < n; i += step) {
		int c = n - i < step ? n - i : step;
		int rc = rt_model_forward(&f, &kv, tok + i, c, i, logits + (size_t)i * m->hp.n_vocab,
		                          RT_LOGITS_ALL, &err);
		ck_assert_msg(rc == 0, "forward: %s", err.msg);
	}
	ck_assert_int_eq(rt_kv_entries(&kv), (int64_t)n * m->hp.n_layer * m->hp.n_head_kv);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
}

static double max_diff_f(const float *a, const float *b, size_t n)
{
	double d = 0;
	for (size_t i = 0; i < n; i++)
		d = fmax(d, fabs((double)a[i] - b[i]));
	return d;
}

static double max_diff_fd(const float *a, const double *b, size_t n)
{
	double d = 0;
	for (size_t i = 0; i < n; i++)
		d = fmax(d, fabs((double)a[i] - b[i]));
	return d;
}

/* An oracle case over a policy-edited store: the model of c written and loaded, its
 * reference (ref_load), n test tokens from seed, a store and a forward (chunks of
 * max_chunk) for n positions, and the first n_prompt tokens fed; the test then edits the
 * store and decodes the rest. oracle_close frees it all. */
typedef struct oracle_case {
	tiny_model_cfg c;
	const char *path;
	rt_model *m;
	ref r;
	rt_kv kv;
	rt_fwd f;
} oracle_case;

static void oracle_open(oracle_case *o, const tiny_model_cfg *c, int32_t *tok, int n,
                        unsigned seed, int max_chunk, int n_prompt)
{
	o->c = *c;
	o->path = write_model(c);
	o->m = load_ok(o->path);
	ref_load(&o->r, c, o->path);
	test_tokens(tok, n, c->n_vocab, seed);
	rt_err err = {0};
	ck_assert_int_eq(rt_model_kv_init(o->m, &o->kv, n, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&o->f, o->m, max_chunk, n, &err), 0);
	ck_assert_int_eq(rt_model_forward(&o->f, &o->kv, tok, n_prompt, 0, NULL, RT_LOGITS_NONE,
	                                  &err), 0);
}

/* max |logit - reference| over rows positions from..from+rows-1: lg holds those rows
 * ([rows × V]), the reference runs tok[0..n) with visibility vis(u). */
static double oracle_diff(const oracle_case *o, const int32_t *tok, int n, ref_visible_fn vis,
                          const void *u, const float *lg, int from, int rows)
{
	const size_t V = (size_t)o->c.n_vocab;
	double *rl = malloc((size_t)n * V * sizeof *rl);
	ref_forward(&o->r, tok, n, vis, u, rl);
	double d = max_diff_fd(lg, rl + (size_t)from * V, (size_t)rows * V);
	free(rl);
	return d;
}

static void oracle_close(oracle_case *o)
{
	rt_fwd_free(&o->f);
	rt_kv_free(&o->kv);
	ref_free(&o->r);
	rt_model_free(o->m);
	unlink(o->path);
}

/* ---- tests --------------------------------------------------------------------------- */

static const uint32_t wtypes[3] = { RT_GGML_F32, RT_GGML_Q4_1, RT_GGML_Q8_0 };

/* loop over 3 shapes × 3 weight types */
START_TEST(test_logits_match_reference)
{
	tiny_model_cfg c = shape_cfg(_i % 3, wtypes[_i / 3]);
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	ck_assert_int_eq(m->hp.n_head, c.n_head);
	ck_assert_int_eq(m->hp.n_head_kv, c.n_head_kv);
	ck_assert_int_eq(m->hp.group, c.n_head / c.n_head_kv);
	ck_assert_int_eq(m->hp.head_dim, c.n_embd / c.n_head);
	ck_assert_int_eq(m->hp.n_vocab, c.n_vocab);
	ck_assert_int_eq(m->hp.n_ctx, c.n_ctx);
	ck_assert_int_eq(m->tied_output, 1);
	ref r;
	ref_load(&r, &c, path);
	enum { N = 13 };
	int32_t tok[N];
	test_tokens(tok, N, c.n_vocab, 7u + (unsigned)_i);
	float *lg = malloc((size_t)N * c.n_vocab * sizeof *lg);
	double *rl = malloc((size_t)N * c.n_vocab * sizeof *rl);
	run_model(m, tok, N, 4, 0, lg);
	ref_forward(&r, tok, N, vis_all, NULL, rl);
	double d = max_diff_fd(lg, rl, (size_t)N * c.n_vocab);
	/* the logits are O(1..10); make sure the comparison is not vacuous */
	double mag = 0;
	for (size_t i = 0; i < (size_t)N * c.n_vocab; i++)
		mag = fmax(mag, fabs(rl[i]));
	ck_assert_msg(mag > 0.5, "reference logits degenerate (max |logit| %g)", mag);
	ck_assert_msg(d <= 1e-4, "shape %d type %u: max |logit - ref| = %g", _i % 3, wtypes[_i / 3], d);
	free(lg), free(rl);
	ref_free(&r);
	rt_model_free(m);
	unlink(path);
}
END_TEST

START_TEST(test_chunking_invariance)
{
	tiny_model_cfg c = shape_cfg(_i, _i == 1 ? RT_GGML_Q4_1 : RT_GGML_F32);
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	enum { N = 23 };
	int32_t tok[N];
	test_tokens(tok, N, c.n_vocab, 99u);
	size_t sz = (size_t)N * c.n_vocab;
	float *one = malloc(sz * sizeof *one), *other = malloc(sz * sizeof *other);
	run_model(m, tok, N, N, 0, one);           /* one shot */
	run_model(m, tok, N, N, 1, other);         /* token by token */
	ck_assert_msg(max_diff_f(one, other, sz) <= 1e-5, "token-by-token differs by %g",
	              max_diff_f(one, other, sz));
	const int chunks[4] = { 3, 5, 7, 1 };
	for (int i = 0; i < 4; i++) {
		run_model(m, tok, N, chunks[i], 0, other);
		double d = max_diff_f(one, other, sz);
		/* 3e-5: OpenBLAS's summation order differs with the row count (measured up to
		 * 1.05e-5 with the kernels it picks on an AMD EPYC) */
		ck_assert_msg(d <= 3e-5, "internal chunk %d differs by %g", chunks[i], d);
	}
	/* uneven external calls with a small internal chunk */
	run_model(m, tok, N, 3, 4, other);
	ck_assert_msg(max_diff_f(one, other, sz) <= 1e-5, "calls of 4, chunk 3 differ by %g",
	              max_diff_f(one, other, sz));
	/* last-row-only logits == last row of the full logits */
	rt_err err = {0};
	rt_kv kv;
	rt_fwd f;
	ck_assert_int_eq(rt_model_kv_init(m, &kv, N, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&f, m, 5, N, &err), 0);
	float *last = malloc((size_t)c.n_vocab * sizeof *last);
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, N, 0, last, RT_LOGITS_LAST, &err), 0);
	ck_assert(max_diff_f(last, one + (size_t)(N - 1) * c.n_vocab, (size_t)c.n_vocab) <= 1e-5);
	free(last);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	free(one), free(other);
	rt_model_free(m);
	unlink(path);
}
END_TEST


/* The fast path against the exact path on the same file, and the fast path at 1 and 3
 * threads (GQA shapes 9/3 and 4/1; Q4_1, Q8_0 and F32 weights).
 *  - Prefill (a chunk of >= RT_MATMUL_GEMM_ROWS rows): the fast path dequantises weight
 *    tiles to the same f32 values the exact path holds and multiplies f32 activations by
 *    sgemm in tiles, so at most the order of f32 additions could differ: 1e-4 of the
 *    largest logit (measured: identical).
 *  - Decode (one row at a time): activations are quantised to 8 bits per block of 32 with
 *    scale max|x|/127, an error of at most 1/254 of the block's largest value per element;
 *    two layers of seven such products on random weights keep the logits within a few per
 *    cent. Bound: 3% of the largest exact logit (measured: under 0.9%), and the softmax
 *    KL(exact || fast) <= 2e-3 nats per position (measured: under 5e-4). F32 weights have
 *    f32 activations: only the summation order differs (measured 4e-7).
 *  - Thread count: every output element is computed by the same operations whatever the
 *    thread count (rt_matmul, attention per KV head), so 1 and 3 threads agree bit for bit.
 *  - f32_act: decode multiplies f32 activations too, so it meets the prefill bound. */
START_TEST(test_fast_path)
{
	static const uint32_t wts[3] = { RT_GGML_Q4_1, RT_GGML_Q8_0, RT_GGML_F32 };
	tiny_model_cfg c = shape_cfg(_i % 2, wts[_i / 2]);
	const char *path = write_model(&c);
	rt_err err = {0};
	rt_model *ex = load_ok(path);
	const rt_model_opts f1o = { .exact = 0, .threads = 1 }, f3o = { .exact = 0, .threads = 3 };
	const rt_model_opts f32o = { .exact = 0, .threads = 2, .f32_act = 1 };
	rt_model *f1 = rt_model_open(path, &f1o, &err), *f3 = rt_model_open(path, &f3o, &err);
	rt_model *fa = rt_model_open(path, &f32o, &err);
	ck_assert_msg(f1 && f3 && fa, "%s", err.msg);
	ck_assert_int_eq(rt_model_threads(f3), 3);
	enum { N = 40 };
	int32_t tok[N];
	test_tokens(tok, N, c.n_vocab, 7u);
	const size_t sz = (size_t)N * c.n_vocab;
	float *le = malloc(sz * sizeof(float)), *la = malloc(sz * sizeof(float)),
	      *lb = malloc(sz * sizeof(float));
	for (int step = N; step >= 1; step -= N - 1) {
		run_model(ex, tok, N, N, step, le);
		run_model(f1, tok, N, N, step, la);
		run_model(f3, tok, N, N, step, lb);
		ck_assert_msg(memcmp(la, lb, sz * sizeof(float)) == 0, "1 and 3 threads differ (step %d)",
		              step);
		double mx = 0.0, kl_max = 0.0;
		for (size_t i = 0; i < sz; i++)
			mx = fmax(mx, fabs(le[i]));
		for (int r = 0; r < N; r++) {
			const float *p = le + (size_t)r * c.n_vocab, *q = la + (size_t)r * c.n_vocab;
			double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, kl = 0;
			for (int v = 0; v < c.n_vocab; v++)
				mp = fmax(mp, p[v]), mq = fmax(mq, q[v]);
			for (int v = 0; v < c.n_vocab; v++)
				zp += exp(p[v] - mp), zq += exp(q[v] - mq);
			for (int v = 0; v < c.n_vocab; v++) {
				double lp = p[v] - mp - log(zp), lq = q[v] - mq - log(zq);
				kl += exp(lp) * (lp - lq);
			}
			kl_max = fmax(kl_max, kl);
		}
		const double d = max_diff_f(le, la, sz);
		if (step == N)
			ck_assert_msg(d <= 1e-4 * mx, "type %u prefill: fast differs from exact by %g (max %g)",
			              c.wtype, d, mx);
		else
			ck_assert_msg(d <= 0.03 * mx && kl_max <= 2e-3,
			              "type %u decode: fast differs from exact by %g (max %g), KL %g", c.wtype,
			              d, mx, kl_max);
		run_model(fa, tok, N, N, step, la);
		const double da = max_diff_f(le, la, sz);
		ck_assert_msg(da <= 1e-4 * mx, "type %u f32_act step %d: fast differs from exact by %g "
		              "(max %g)", c.wtype, step, da, mx);
	}
	/* A prefill that asks for its last row only (RT_LOGITS_LAST: `run`'s first token, a
	 * needle answer's) is a prefill too: the output GEMM of that one row takes the way of
	 * its 40-row chunk, so it meets the prefill bound against the exact path's last row
	 * (it took the decode way, 8-bit activations, and missed it by up to a few per cent) */
	const rt_model *const two[2] = { ex, f1 };
	float *last[2] = { le, la };
	double mx = 0.0;
	for (int k = 0; k < 2; k++) {
		rt_kv kv;
		rt_fwd f;
		ck_assert_int_eq(rt_model_kv_init(two[k], &kv, N, &err), 0);
		ck_assert_int_eq(rt_fwd_init(&f, two[k], N, N, &err), 0);
		ck_assert_msg(rt_model_forward(&f, &kv, tok, N, 0, last[k], RT_LOGITS_LAST, &err) == 0,
		              "%s", err.msg);
		rt_fwd_free(&f);
		rt_kv_free(&kv);
	}
	for (int v = 0; v < c.n_vocab; v++)
		mx = fmax(mx, fabs(le[v]));
	const double dl = max_diff_f(le, la, (size_t)c.n_vocab);
	ck_assert_msg(dl <= 1e-4 * mx, "type %u last row of a prefill: fast differs from exact by %g "
	              "(max %g)", c.wtype, dl, mx);
	free(le), free(la), free(lb);
	rt_model_free(ex), rt_model_free(f1), rt_model_free(f3), rt_model_free(fa);
	unlink(path);
}
END_TEST

/* A continuous-batching step that stacks a 20-row prefill (its last row's logits: the GEMM
 * way, logits_rows) with a 1-row decode step (the 8-bit way) takes both ways in one call
 * (chunk_logits' per-segment path): each sequence's logits equal, bit for bit, those of
 * rt_model_forward with the same chunks alone, as rt_model_forward_multi promises. GQA 9/3
 * on Q4_1 weights, the fast path. */
START_TEST(test_multi_mixed_ways)
{
	tiny_model_cfg c = shape_cfg(0, RT_GGML_Q4_1);
	const char *path = write_model(&c);
	rt_err err = {0};
	const rt_model_opts fo = { .exact = 0, .threads = 2 };
	rt_model *m = rt_model_open(path, &fo, &err);
	ck_assert_msg(m, "%s", err.msg);
	enum { NA = 20, NB = 6 };
	int32_t ta[NA], tb[NB];
	test_tokens(ta, NA, c.n_vocab, 3u);
	test_tokens(tb, NB, c.n_vocab, 5u);
	const int V = c.n_vocab;
	float *solo_a = malloc((size_t)V * sizeof(float)), *solo_b = malloc((size_t)V * sizeof(float));
	/* the two rows of one buffer, as a lockstep batch lays them out: the stacked call's
	 * logits are consecutive, so only the ways tell chunk_logits to split them */
	float *lab = malloc(2 * (size_t)V * sizeof(float)), *la = lab, *lb = lab + V;
	rt_kv kv[2];
	rt_fwd f[2], big;
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(rt_model_kv_init(m, &kv[k], 64, &err), 0);
		ck_assert_int_eq(rt_fwd_init(&f[k], m, 32, 64, &err), 0);
	}
	ck_assert_int_eq(rt_fwd_init(&big, m, 32, 64, &err), 0);
	/* alone: A's 20-token prefill; B's 5-token prefill, then its 6th token as a step */
	ck_assert_int_eq(rt_model_forward(&f[0], &kv[0], ta, NA, 0, solo_a, RT_LOGITS_LAST, &err), 0);
	ck_assert_int_eq(rt_model_forward(&f[1], &kv[1], tb, NB - 1, 0, lb, RT_LOGITS_LAST, &err), 0);
	ck_assert_int_eq(rt_model_forward(&f[1], &kv[1], tb + NB - 1, 1, NB - 1, solo_b,
	                                  RT_LOGITS_LAST, &err), 0);
	/* together: fresh caches, B's prefill alone, then A's prefill and B's step stacked */
	for (int k = 0; k < 2; k++) {
		rt_fwd_free(&f[k]);
		rt_kv_free(&kv[k]);
		ck_assert_int_eq(rt_model_kv_init(m, &kv[k], 64, &err), 0);
		ck_assert_int_eq(rt_fwd_init(&f[k], m, 32, 64, &err), 0);
	}
	ck_assert_int_eq(rt_model_forward(&f[1], &kv[1], tb, NB - 1, 0, lb, RT_LOGITS_LAST, &err), 0);
	rt_fwd *const fs[2] = { &f[0], &f[1] };
	rt_kv *const ks[2] = { &kv[0], &kv[1] };
	const int32_t *toks[2] = { ta, tb + NB - 1 };
	const int n[2] = { NA, 1 };
	const int32_t pos[2] = { 0, NB - 1 };
	float *const lg[2] = { la, lb };
	ck_assert_msg(rt_model_forward_multi(&big, fs, ks, 2, toks, n, pos, lg, NULL, &err) == 0,
	              "%s", err.msg);
	ck_assert_msg(memcmp(la, solo_a, (size_t)V * sizeof(float)) == 0,
	              "the prefill's last row differs stacked with a decode step");
	ck_assert_msg(memcmp(lb, solo_b, (size_t)V * sizeof(float)) == 0,
	              "the decode step differs stacked with a prefill");
	for (int k = 0; k < 2; k++) {
		rt_fwd_free(&f[k]);
		rt_kv_free(&kv[k]);
	}
	rt_fwd_free(&big);
	free(solo_a), free(solo_b), free(lab);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* kept-set oracle: per (layer, kv head) a different subset of prefix positions */
typedef struct keep_rule {
	int n_prefix;
} keep_rule;

static int kept(int layer, int kvh, int pos)
{
	/* always keep position 0 in some heads, drop it in others; vary the stride */
	return ((pos * (kvh + 2) + layer * 3 + kvh) % 5) < 3;
}

static int vis_kept(const void *u, int layer, int kvh, int qp, int kp)
{
	const keep_rule *k = u;
	if (kp > qp)
		return 0;
	if (qp < k->n_prefix)
		return 1;
	return kp >= k->n_prefix || kept(layer, kvh, kp);
}

START_TEST(test_evicted_cache_oracle)
{
	const tiny_model_cfg c = shape_cfg(_i, RT_GGML_F32);
	enum { P = 17 };
	int32_t tok[P + 2];
	oracle_case o;
	oracle_open(&o, &c, tok, P + 2, 5u, 6, P);
	int distinct = 0, first_mask = -1;
	for (int l = 0; l < c.n_layer; l++)
		for (int j = 0; j < c.n_head_kv; j++) {
			rt_kv_head *h = rt_kv_head_at(&o.kv, l, j);
			int32_t keep[P];
			int nk = 0, mask = 0;
			for (int i = 0; i < h->n; i++) {
				ck_assert_int_eq(h->pos[i], i);
				if (kept(l, j, h->pos[i]))
					keep[nk++] = i, mask |= 1 << i;
			}
			rt_kv_head_keep(&o.kv, h, keep, nk);
			if (first_mask == -1)
				first_mask = mask;
			distinct += mask != first_mask;
		}
	/* two more tokens after the eviction: both must match the reference */
	rt_err err = {0};
	float *lg = malloc(2 * (size_t)c.n_vocab * sizeof *lg);
	ck_assert_int_eq(rt_model_forward(&o.f, &o.kv, tok + P, 1, P, lg, RT_LOGITS_ALL, &err), 0);
	ck_assert_int_eq(rt_model_forward(&o.f, &o.kv, tok + P + 1, 1, P + 1, lg + c.n_vocab,
	                                  RT_LOGITS_ALL, &err), 0);
	keep_rule rule = { P };
	double d = oracle_diff(&o, tok, P + 2, vis_kept, &rule, lg, P, 2);
	ck_assert_msg(d <= 1e-5, "evicted cache: max |logit - ref| = %g", d);
	/* and the eviction really changed the answer */
	ck_assert_msg(oracle_diff(&o, tok, P + 2, vis_all, NULL, lg, P, 1) > 1e-3,
	              "eviction had no effect");
	ck_assert_int_gt(distinct, 0); /* the kept sets really differ between heads */
	free(lg);
	oracle_close(&o);
}
END_TEST

/* ---- KVzip's context replay (runtime/policy/rt_replay.h, policies/kvzip.kvp) --------- */

/* The reference replay score: max over the group's query heads and the replay's queries
 * (positions >= P) of the attention on prompt position i < P (one chunk: the whole softmax). */
typedef struct replay_ref {
	int P, G, HKV;
	double *score; /* [L × HKV × P] */
} replay_ref;

static void replay_ref_attn(void *u, int layer, int h, int t, const double *p, double sum)
{
	replay_ref *r = u;
	if (t < r->P)
		return;
	double *row = r->score + ((size_t)layer * r->HKV + (size_t)(h / r->G)) * r->P;
	for (int i = 0; i < r->P; i++)
		row[i] = fmax(row[i], p[i] / sum);
}

/* what a head kept: kept[(layer · HKV + kvh) · P + pos] */
typedef struct kept_mask {
	int P, HKV;
	const uint8_t *kept;
} kept_mask;

static int vis_mask(const void *u, int layer, int kvh, int qp, int kp)
{
	const kept_mask *k = u;
	if (kp > qp)
		return 0;
	return qp < k->P || kp >= k->P || k->kept[((size_t)layer * k->HKV + kvh) * k->P + kp];
}

/* The replay's input as kvpress builds it for one chunk: the instruction, the template's
 * suffix (the rendered chat prompt of a dummy user message after the message: the tiny
 * vocabulary's turn tokens give ChatML), the prompt; tokenized here. */
static int replay_input(const char *path, const int32_t *prompt, int P, int32_t *out, int cap)
{
	static const char instr[] = "\n\nRepeat the previous context exactly.";
	rt_err err = {0};
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	rt_tokenizer *tk = rt_tokenizer_init(g, &err);
	ck_assert_msg(tk != NULL, "%s", err.msg);
	int64_t n = rt_tokenize(tk, instr, sizeof instr - 1, 0, out, cap, &err);
	ck_assert_int_gt(n, 0);
	char *chat = rt_chat_render(tk, NULL, "dummy context", &err);
	ck_assert_msg(chat != NULL, "%s", err.msg);
	const char *suffix = strstr(chat, "dummy context") + strlen("dummy context");
	ck_assert_msg(strstr(suffix, "<|im_start|>assistant") != NULL, "suffix %s", suffix);
	const int64_t ns = rt_tokenize(tk, suffix, strlen(suffix), 1, out + n, cap - n, &err);
	ck_assert_int_gt(ns, 0);
	n += ns;
	free(chat);
	ck_assert_int_le(n + P, cap);
	memcpy(out + n, prompt, (size_t)P * sizeof *prompt);
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	return (int)n + P;
}

/* The replay both oracles share: the naive forward over prompt + instruction + prompt with
 * visibility vis (ref_forward) records the reference scores rr->score [L × HKV × P]
 * (allocated here, the caller frees); the runtime feeds tok[0..P) under kvzip into s (capacity
 * P + 1, a strict budget of kept = budget / P and, when sinks >= 0, that many sinks): one
 * compress, the replay's token count, and its scores equal the reference's within 1e-5 with
 * a positive maximum (returned). */
static double kvzip_replay_run(const char *path, rt_model *m, const ref *r, const int32_t *tok, int P,
                               int budget, int sinks, ref_visible_fn vis, const void *vu, replay_ref *rr,
                               rt_seq *s)
{
	int32_t seq[128];
	const int n = replay_input(path, tok, P, seq + P, 128 - P);
	memcpy(seq, tok, (size_t)P * sizeof *tok);
	const size_t H = (size_t)r->L * r->HKV;
	rr->P = P;
	rr->G = r->H / r->HKV;
	rr->HKV = r->HKV;
	rr->score = calloc(H * P, sizeof(double));
	double *lg_ref = malloc((size_t)(P + n) * r->V * sizeof *lg_ref);
	ref_attn_hook = replay_ref_attn;
	ref_attn_user = rr;
	ref_forward(r, seq, P + n, vis, vu, lg_ref);
	ref_attn_hook = NULL;
	free(lg_ref);
	const struct kvp_policy *p = rt_registry_find(kvp_registry, kvp_registry_count, "kvzip");
	ck_assert_ptr_nonnull(p);
	ck_assert(p->needs & KVP_NEED_REPLAY);
	rt_err err = {0};
	ck_assert_msg(rt_seq_init(s, m, p, P + 1, 5, P, &err) == 0, "%s", err.msg);
	s->run.ctx.min_kv = KVP_MIN_KV_STRICT;
	char a[64];
	snprintf(a, sizeof a, "kept=%.17g", (double)budget / P);
	ck_assert_msg(rt_seq_set(s, a, &err) == 0, "%s", err.msg);
	snprintf(a, sizeof a, "sinks=%d", sinks);
	ck_assert_msg(sinks < 0 || rt_seq_set(s, a, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_seq_feed(s, tok, P, NULL, RT_LOGITS_NONE, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(rt_seq_stats_get(s).compress_events, 1);
	ck_assert_int_eq(s->rp.tokens, n);
	ck_assert_ptr_nonnull(s->run.ctx.replay);
	ck_assert_int_eq(s->run.ctx.replay_n, P);
	double dmax = 0, smax = 0;
	for (size_t i = 0; i < H * P; i++) {
		dmax = fmax(dmax, fabs(s->run.ctx.replay[i] - rr->score[i]));
		smax = fmax(smax, rr->score[i]);
	}
	ck_assert_msg(dmax <= 1e-5, "replay scores: max |runtime - reference| = %g", dmax);
	ck_assert_msg(smax > 0, "replay scores: all 0");
	return smax;
}

/* A tiny model (9/3 and 4/1 heads) under policies/kvzip.kvp with a prompt of P tokens: the
 * scores the runtime measured equal max attention over a replay computed here by the naive
 * forward over prompt + instruction + prompt; the kept set equals the top of all heads'
 * non-sink positions by that score (kvzip: one global pool, `keep sinks`); the replay's rows
 * are gone (the next token sits at position P and its logits equal the naive forward with
 * attention restricted to the kept entries). */
START_TEST(test_kvzip_replay_oracle)
{
	tiny_model_cfg c = shape_cfg(_i, RT_GGML_F32);
	c.n_ctx = 128;
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	ref r;
	ref_load(&r, &c, path);
	enum { P = 14, SINKS = 2, BUDGET = 6 };
	const int L = c.n_layer, HKV = c.n_head_kv;
	int32_t tok[P + 1];
	test_tokens(tok, P + 1, 256, 11u + (unsigned)_i);
	/* the runtime under kvzip, strict budget: 6 entries per head on average, 2 sinks */
	replay_ref rr;
	rt_seq s;
	const double smax = kvzip_replay_run(path, m, &r, tok, P, BUDGET, SINKS, vis_all, NULL, &rr, &s);
	ck_assert_msg(smax <= 1.0 + 1e-12, "replay scores: max %g", smax);
	rt_err err = {0};
	/* the kept set: every head's sinks, then the L·HKV·(BUDGET - SINKS) best other entries
	 * over all heads together (ties: lower position first, then lower head) */
	const int H = L * HKV, nc = H * (P - SINKS), take = H * (BUDGET - SINKS);
	uint8_t *want = calloc((size_t)H * P, 1);
	for (int h = 0; h < H; h++)
		for (int i = 0; i < SINKS; i++)
			want[(size_t)h * P + i] = 1;
	for (int k = 0; k < take; k++) {
		int best = -1;
		for (int q = 0; q < nc; q++) {
			const int h = q / (P - SINKS), i = SINKS + q % (P - SINKS);
			if (want[(size_t)h * P + i])
				continue;
			if (best < 0 || rr.score[(size_t)h * P + i] >
			                rr.score[(size_t)(best / (P - SINKS)) * P + SINKS + best % (P - SINKS)])
				best = q;
		}
		want[(size_t)(best / (P - SINKS)) * P + SINKS + best % (P - SINKS)] = 1;
	}
	uint8_t *got = calloc((size_t)H * P, 1);
	for (int h = 0; h < H; h++) {
		const rt_kv_head *hd = &s.kv.heads[h];
		for (int i = 0; i < hd->n; i++) {
			ck_assert_int_lt(hd->pos[i], P); /* no replay row left */
			got[(size_t)h * P + hd->pos[i]] = 1;
		}
	}
	for (int h = 0; h < H; h++)
		for (int i = 0; i < P; i++)
			ck_assert_msg(got[(size_t)h * P + i] == want[(size_t)h * P + i],
			              "head %d position %d: kept %d, reference %d (score %g)", h, i,
			              got[(size_t)h * P + i], want[(size_t)h * P + i],
			              rr.score[(size_t)h * P + i]);
	ck_assert_int_eq(rt_kv_entries(&s.kv), (int64_t)H * BUDGET);
	/* the next token after the compressed prompt: dense attention over the kept entries */
	float *lg = malloc((size_t)c.n_vocab * sizeof *lg);
	ck_assert_msg(rt_seq_feed(&s, tok + P, 1, lg, RT_LOGITS_LAST, &err) == 0, "%s", err.msg);
	double *rl = malloc((size_t)(P + 1) * c.n_vocab * sizeof *rl);
	kept_mask km = { P, HKV, want };
	ref_forward(&r, tok, P + 1, vis_mask, &km, rl);
	const double d = max_diff_fd(lg, rl + (size_t)P * c.n_vocab, (size_t)c.n_vocab);
	ck_assert_msg(d <= 1e-5, "after the replay and compress: max |logit - ref| = %g", d);
	free(lg), free(rl), free(want), free(got), free(rr.score);
	rt_seq_free(&s);
	ref_free(&r);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* On a window model: visible when kp <= qp inside the window W (qp - kp < W, as
 * rt_model.c's window_masked), and, for a query after the prompt, kept by the head. */
typedef struct win_kept {
	int W;
	kept_mask k;
} win_kept;

static int vis_win(const void *u, int layer, int kvh, int qp, int kp)
{
	const win_kept *w = u;
	(void)layer, (void)kvh;
	return kp <= qp && qp - kp < w->W;
}

static int vis_win_kept(const void *u, int layer, int kvh, int qp, int kp)
{
	const win_kept *w = u;
	return vis_win(u, layer, kvh, qp, kp) && vis_mask(&w->k, layer, kvh, qp, kp);
}

/* KVzip on a model whose every layer has a window of W = 8 (Mistral style), shapes 9/3
 * and 4/1, a prompt of P = 14: the prefill's trim leaves positions 7..13 in each list; the
 * replay (instruction + prompt, about 30 tokens at positions 14..) masks by the window but
 * trims nothing, so its scores equal max attention over a naive forward with the window
 * mask, 0 for the trimmed positions; after it no replay row is left, every list holds a
 * subset of 7..13, fewer entries in all than before (the budget: 6 of the 14 tokens per
 * head), and the next token's logits equal the naive forward over the window and the kept
 * entries (evicted cache = dense attention over what is kept). */
START_TEST(test_kvzip_replay_window_oracle)
{
	tiny_model_cfg c = shape_cfg(_i, RT_GGML_F32);
	c.n_ctx = 128;
	c.n_swa = 8;
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	ref r;
	ref_load(&r, &c, path);
	enum { P = 14, W = 8, BUDGET = 6 };
	const int HKV = c.n_head_kv, H = c.n_layer * HKV;
	int32_t tok[P + 1];
	test_tokens(tok, P + 1, 256, 17u + (unsigned)_i);
	win_kept wk = { W, { P, HKV, NULL } };
	replay_ref rr;
	rt_seq s;
	kvzip_replay_run(path, m, &r, tok, P, BUDGET, -1, vis_win, &wk, &rr, &s);
	ck_assert_int_gt(s.rp.tokens, 2 * W); /* later replayed queries see none of the prompt */
	for (size_t i = 0; i < (size_t)H * P; i++)
		if ((int)(i % P) < P - W + 1)
			ck_assert_msg(rr.score[i] == 0.0 && s.run.ctx.replay[i] == 0.0f,
			              "trimmed position %d scored %g (reference %g)", (int)(i % P),
			              (double)s.run.ctx.replay[i], rr.score[i]);
	rt_err err = {0};
	uint8_t *got = calloc((size_t)H * P, 1);
	for (int h = 0; h < H; h++) {
		const rt_kv_head *hd = &s.kv.heads[h];
		for (int i = 0; i < hd->n; i++) {
			ck_assert_msg(hd->pos[i] >= P - W + 1 && hd->pos[i] < P, "head %d holds position %d", h,
			              hd->pos[i]);
			got[(size_t)h * P + hd->pos[i]] = 1;
		}
	}
	ck_assert_int_lt(rt_kv_entries(&s.kv), (int64_t)H * (W - 1));
	float *lg = malloc((size_t)c.n_vocab * sizeof *lg);
	ck_assert_msg(rt_seq_feed(&s, tok + P, 1, lg, RT_LOGITS_LAST, &err) == 0, "%s", err.msg);
	double *rl = malloc((size_t)(P + 1) * c.n_vocab * sizeof *rl);
	wk.k.kept = got;
	ref_forward(&r, tok, P + 1, vis_win_kept, &wk, rl);
	const double d = max_diff_fd(lg, rl + (size_t)P * c.n_vocab, (size_t)c.n_vocab);
	ck_assert_msg(d <= 1e-5, "window model after the replay and compress: max |logit - ref| = %g", d);
	free(lg), free(rl), free(got), free(rr.score);
	rt_seq_free(&s);
	ref_free(&r);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* What the replay cannot run is refused with the reason: a prompt whose replay would pass
 * the model's context_length. */
START_TEST(test_kvzip_replay_refusals)
{
	const struct kvp_policy *p = rt_registry_find(kvp_registry, kvp_registry_count, "kvzip");
	ck_assert_ptr_nonnull(p);
	tiny_model_cfg c = shape_cfg(1, RT_GGML_F32);
	rt_err err = {0};
	rt_seq s;
	const char *path;
	rt_model *m;
	/* n_ctx 64: a prompt of 40 and its replay (40 + instruction) pass it */
	path = write_model(&c);
	m = load_ok(path);
	ck_assert_msg(rt_seq_init(&s, m, p, 41, 8, 40, &err) == 0, "%s", err.msg);
	int32_t tok[40];
	test_tokens(tok, 40, 256, 3u);
	ck_assert_int_eq(rt_seq_feed(&s, tok, 40, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_msg(strstr(err.msg, "policy kvzip: replay:") && strstr(err.msg, "context_length 64"),
	              "%s", err.msg);
	rt_seq_free(&s);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* A window layer whose list a policy compacted out of position order (rt_kv_head_evict's
 * tail fill: the newest entries move into the evicted slots): the window mask and the
 * window trim must go by each entry's position, not by its index. Oracle: the reference
 * forward attending, from each new token, to the kept entries and the new ones inside the
 * window W (pos - pos_i < W), dense otherwise. Mistral-style window W = 8 on every layer;
 * 20 prompt tokens (the trim leaves positions 13..19), then per (layer, KV head) two of
 * them evicted by tail fill, then 10 tokens one at a time (each entry ages out of the
 * window in turn). */
enum { WO_W = 8, WO_P = 20, WO_N = 10 };

static int wo_evicted(int layer, int kvh, int pos)
{
	return pos == 13 + (layer + kvh) % 3 || pos == 17 + (layer + 2 * kvh) % 2;
}

static int vis_window_out_of_order(const void *u, int layer, int kvh, int qp, int kp)
{
	(void)u;
	if (kp > qp || qp - kp >= WO_W)
		return 0;
	return qp < WO_P || kp >= WO_P || !wo_evicted(layer, kvh, kp);
}

START_TEST(test_window_out_of_order_oracle)
{
	tiny_model_cfg c = shape_cfg(_i, RT_GGML_F32);
	c.n_swa = WO_W;
	int32_t tok[WO_P + WO_N];
	oracle_case o;
	oracle_open(&o, &c, tok, WO_P + WO_N, 11u, 8, WO_P);
	int disordered = 0;
	for (int l = 0; l < c.n_layer; l++)
		for (int j = 0; j < c.n_head_kv; j++) {
			rt_kv_head *h = rt_kv_head_at(&o.kv, l, j);
			ck_assert_int_eq(h->n, WO_W - 1); /* the window trim: positions 13..19 */
			int32_t keep[WO_W];
			int nk = 0;
			for (int i = 0; i < h->n; i++)
				if (!wo_evicted(l, j, h->pos[i]))
					keep[nk++] = i;
			rt_kv_head_evict(&o.kv, h, keep, nk);
			for (int i = 1; i < h->n; i++)
				disordered += h->pos[i] < h->pos[i - 1];
		}
	ck_assert_int_gt(disordered, 0); /* the lists really are out of position order */
	rt_err err = {0};
	float *lg = malloc((size_t)WO_N * c.n_vocab * sizeof *lg);
	for (int t = 0; t < WO_N; t++)
		ck_assert_msg(rt_model_forward(&o.f, &o.kv, tok + WO_P + t, 1, WO_P + t,
		                               lg + (size_t)t * c.n_vocab, RT_LOGITS_ALL, &err) == 0,
		              "%s", err.msg);
	/* the trim after the last token kept exactly what a later query sees */
	for (int l = 0; l < c.n_layer; l++)
		for (int j = 0; j < c.n_head_kv; j++) {
			const rt_kv_head *h = rt_kv_head_at(&o.kv, l, j);
			ck_assert_int_eq(h->n, WO_W - 1);
			for (int i = 0; i < h->n; i++)
				ck_assert_int_gt(h->pos[i], WO_P + WO_N - WO_W);
		}
	double d = oracle_diff(&o, tok, WO_P + WO_N, vis_window_out_of_order, NULL, lg, WO_P, WO_N);
	ck_assert_msg(d <= 1e-5, "window over an out-of-order list: max |logit - ref| = %g", d);
	free(lg);
	oracle_close(&o);
}
END_TEST

START_TEST(test_count_oracle)
{
	tiny_model_cfg c = shape_cfg(_i, RT_GGML_F32);
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	enum { P = 37 }; /* > 16 entries: the vectorised softmax path sees the counts too */
	int32_t tok[P + 1];
	test_tokens(tok, P + 1, c.n_vocab, 11u);
	rt_err err = {0};
	rt_kv a, b, base;
	rt_fwd f;
	ck_assert_int_eq(rt_fwd_init(&f, m, 4, P + 8, &err), 0);
	rt_kv *kvs[3] = { &a, &b, &base };
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(rt_model_kv_init(m, kvs[i], P + 8, &err), 0);
		ck_assert_int_eq(rt_model_forward(&f, kvs[i], tok, P, 0, NULL, RT_LOGITS_NONE, &err), 0);
	}
	/* per head, two different entries (one early, one in the last 16): store a duplicates
	 * them, store b gives them count 2 and 3 (a holds 1 and 2 extra copies) */
	for (int l = 0; l < c.n_layer; l++)
		for (int j = 0; j < c.n_head_kv; j++) {
			int e1 = (l * 5 + j * 3 + 1) % P, e2 = P - 1 - (l + j) % 3;
			rt_kv_head *ha = rt_kv_head_at(&a, l, j), *hb = rt_kv_head_at(&b, l, j);
			size_t hd = (size_t)c.n_embd / c.n_head;
			rt_kv_append(&a, ha, ha->k + e1 * hd, ha->v + e1 * hd, ha->pos[e1]);
			rt_kv_append(&a, ha, ha->k + e2 * hd, ha->v + e2 * hd, ha->pos[e2]);
			rt_kv_append(&a, ha, ha->k + e2 * hd, ha->v + e2 * hd, ha->pos[e2]);
			hb->count[e1] = 2.0f;
			hb->log_count[e1] = logf(2.0f);
			hb->count[e2] = 3.0f;
			hb->log_count[e2] = logf(3.0f);
		}
	float *la = malloc((size_t)c.n_vocab * sizeof *la);
	float *lb = malloc((size_t)c.n_vocab * sizeof *lb);
	float *l0 = malloc((size_t)c.n_vocab * sizeof *l0);
	ck_assert_int_eq(rt_model_forward(&f, &a, tok + P, 1, P, la, RT_LOGITS_LAST, &err), 0);
	ck_assert_int_eq(rt_model_forward(&f, &b, tok + P, 1, P, lb, RT_LOGITS_LAST, &err), 0);
	ck_assert_int_eq(rt_model_forward(&f, &base, tok + P, 1, P, l0, RT_LOGITS_LAST, &err), 0);
	double d = max_diff_f(la, lb, (size_t)c.n_vocab);
	ck_assert_msg(d <= 1e-5, "counts 2, 3 vs duplicates: %g", d);
	ck_assert_msg(max_diff_f(la, l0, (size_t)c.n_vocab) > 1e-4, "duplicate had no effect");
	free(la), free(lb), free(l0);
	for (int i = 0; i < 3; i++)
		rt_kv_free(kvs[i]);
	rt_fwd_free(&f);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* observe hook: probabilities over the attended prefix sum to 1, out == Σ p v */
typedef struct obs_acc {
	long calls;
	double worst_sum, worst_out;
	int bad_n;
	int chunk_start;   /* entries before the chunk at the current call's layer */
} obs_acc;

static void obs_cb(void *user, const rt_attn_view *v)
{
	obs_acc *a = user;
	a->calls++;
	if (v->n_entries != a->chunk_start + v->row + 1 || v->pos != a->chunk_start + v->row ||
	    v->probs_ld != (size_t)v->n_entries)
		a->bad_n++;
	for (int g = 0; g < v->group; g++) {
		const float *p = v->probs + (size_t)g * v->probs_ld;
		double s = 0;
		for (int i = 0; i < v->n_entries; i++)
			s += p[i];
		a->worst_sum = fmax(a->worst_sum, fabs(s - 1.0));
		for (int d = 0; d < v->head_dim; d++) {
			double o = 0;
			for (int i = 0; i < v->n_entries; i++)
				o += p[i] * v->head->v[(size_t)i * v->head_dim + d];
			a->worst_out = fmax(a->worst_out, fabs(o - v->out[(size_t)g * v->head_dim + d]));
		}
	}
}

START_TEST(test_observe_hook)
{
	tiny_model_cfg c = shape_cfg(0, RT_GGML_F32);
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	rt_err err = {0};
	rt_kv kv;
	rt_fwd f;
	ck_assert_int_eq(rt_model_kv_init(m, &kv, 16, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&f, m, 16, 16, &err), 0);
	obs_acc acc = {0};
	f.observe = obs_cb;
	f.observe_user = &acc;
	int32_t tok[10];
	test_tokens(tok, 10, c.n_vocab, 3u);
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, 7, 0, NULL, RT_LOGITS_NONE, &err), 0);
	acc.chunk_start = 7;
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok + 7, 3, 7, NULL, RT_LOGITS_NONE, &err), 0);
	ck_assert_int_eq(acc.calls, 10L * c.n_layer * c.n_head_kv);
	ck_assert_int_eq(acc.bad_n, 0);
	ck_assert_msg(acc.worst_sum < 1e-5, "probabilities sum off by %g", acc.worst_sum);
	ck_assert_msg(acc.worst_out < 1e-5, "output differs from sum p v by %g", acc.worst_out);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* The fast path over f16 and Q8_0 stores (shapes 9/3 head_dim 32 and 4/1 head_dim 16):
 *  - the attention output handed to observe equals Σ p·v over the stored, dequantised
 *    values (rt_kv_value), to f32 rounding;
 *  - a chunk of 20 rows (decoded once, sgemm) equals 20 single-token steps (rows read in
 *    place, runtime/model/rt_kvattn.c): same stored entries, so the logits agree to f32
 *    summation order (1e-4 of the largest logit);
 *  - Q8_0 at head_dim 16 and an exact model with a narrow type are refused at load. */
typedef struct obs_narrow {
	const rt_kv *kv;
	double worst_sum, worst_out;
	long calls;
} obs_narrow;

static void obs_narrow_cb(void *user, const rt_attn_view *v)
{
	obs_narrow *a = user;
	a->calls++;
	float buf[64];
	for (int g = 0; g < v->group; g++) {
		const float *p = v->probs + (size_t)g * v->probs_ld;
		double s = 0;
		for (int i = 0; i < v->n_entries; i++)
			s += p[i];
		a->worst_sum = fmax(a->worst_sum, fabs(s - 1.0));
		for (int d = 0; d < v->head_dim; d++) {
			double o = 0;
			for (int i = 0; i < v->n_entries; i++)
				o += p[i] * rt_kv_value(a->kv, v->head, i, buf)[d];
			a->worst_out = fmax(a->worst_out, fabs(o - v->out[(size_t)g * v->head_dim + d]));
		}
	}
}

START_TEST(test_narrow_kv_types)
{
	const enum rt_kv_type type = _i / 2 ? RT_KV_Q8_0 : RT_KV_F16;
	/* f32 weights: the fast path multiplies them in f32 at every chunk length, so only the
	 * attention path differs between the chunk and the steps */
	tiny_model_cfg c = shape_cfg(_i % 2, RT_GGML_F32);
	const char *path = write_model(&c);
	rt_err err = {0};
	const rt_model_opts o = { .exact = 0, .threads = 2, .kv_type = type };
	rt_model *m = rt_model_open(path, &o, &err);
	if (type == RT_KV_Q8_0 && _i % 2) { /* head_dim 16 */
		ck_assert_ptr_null(m);
		ck_assert_msg(strstr(err.msg, "KV type q8_0 cannot be used here (head_dim is not a multiple of 32)"),
		              "%s", err.msg);
		unlink(path);
		return;
	}
	ck_assert_msg(m != NULL, "%s", err.msg);
	const rt_model_opts xo = { .exact = 1, .kv_type = type };
	ck_assert_ptr_null(rt_model_open(path, &xo, &err));
	ck_assert_msg(strstr(err.msg, "the exact path stores f32 keys and values"), "%s", err.msg);
	enum { N = 24 };
	int32_t tok[N];
	test_tokens(tok, N, c.n_vocab, 5u);
	rt_kv a, b;
	rt_fwd fa, fb;
	ck_assert_int_eq(rt_model_kv_init(m, &a, N, &err), 0);
	ck_assert_int_eq(rt_model_kv_init(m, &b, N, &err), 0);
	ck_assert_int_eq(a.type, type);
	ck_assert_int_eq(rt_fwd_init(&fa, m, 32, N, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&fb, m, 1, N, &err), 0);
	obs_narrow acc = { .kv = &a };
	fa.observe = obs_narrow_cb;
	fa.observe_user = &acc;
	float *la = malloc(sizeof(float) * c.n_vocab), *lb = malloc(sizeof(float) * c.n_vocab);
	ck_assert_int_eq(rt_model_forward(&fa, &a, tok, 20, 0, la, RT_LOGITS_LAST, &err), 0);
	for (int t = 0; t < 20; t++)
		ck_assert_int_eq(rt_model_forward(&fb, &b, tok + t, 1, t, lb, RT_LOGITS_LAST, &err), 0);
	/* as test_fast_path's prefill bound: 1e-4 of the largest logit (f32 summation order of
	 * the matmuls and the attention through both layers); for q8_0, 2e-3: a key or value
	 * that differs in its last f32 bit between the two orders can land on the next code of
	 * its block (a step of 1/127 of the block's largest magnitude); measured 6e-4 on an
	 * AMD EPYC */
	double worst = 0, mx = 0;
	for (int i = 0; i < c.n_vocab; i++) {
		worst = fmax(worst, fabs(la[i] - lb[i]));
		mx = fmax(mx, fabs(lb[i]));
	}
	ck_assert_msg(worst <= (type == RT_KV_Q8_0 ? 2e-3 : 1e-4) * mx,
	              "%s: chunk of 20 vs 20 steps differ by %g (max %g)",
	              rt_kv_type_name(type), worst, mx);
	/* the single-row path under observe too */
	ck_assert_int_eq(rt_model_forward(&fa, &a, tok + 20, 4, 20, la, RT_LOGITS_LAST, &err), 0);
	ck_assert_int_eq(acc.calls, 24L * c.n_layer * c.n_head_kv);
	ck_assert_msg(acc.worst_sum < 1e-5, "probabilities sum off by %g", acc.worst_sum);
	ck_assert_msg(acc.worst_out < 1e-5, "output differs from sum p v(stored) by %g", acc.worst_out);
	free(la), free(lb);
	rt_fwd_free(&fa), rt_fwd_free(&fb);
	rt_kv_free(&a), rt_kv_free(&b);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* Long context: enough entries that the attention splits a chunk into several row
 * blocks (rows·group·entries above 2^18 floats); a 64-token chunk after a 2000-token
 * prefill equals 64 single-token calls, and observe still sees exact probabilities. */
START_TEST(test_long_context_row_blocks)
{
	tiny_model_cfg c = shape_cfg(0, RT_GGML_F32);
	c.n_ctx = 2100;
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	enum { P = 2000, C = 64 };
	int32_t *tok = malloc((P + C) * sizeof *tok);
	test_tokens(tok, P + C, c.n_vocab, 2024u);
	rt_err err = {0};
	rt_kv a, b;
	rt_fwd fa, fb;
	ck_assert_int_eq(rt_model_kv_init(m, &a, P + C, &err), 0);
	ck_assert_int_eq(rt_model_kv_init(m, &b, P + C, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&fa, m, 500, P + C, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&fb, m, 500, P + C, &err), 0);
	ck_assert_int_eq(rt_model_forward(&fa, &a, tok, P, 0, NULL, RT_LOGITS_NONE, &err), 0);
	ck_assert_int_eq(rt_model_forward(&fb, &b, tok, P, 0, NULL, RT_LOGITS_NONE, &err), 0);
	/* the chunk is split: 2^18 / (3 · 2064) = 42 rows per block < 64 */
	ck_assert_int_lt((1 << 18) / (c.n_head / c.n_head_kv * (P + C)), C);
	obs_acc acc = {0};
	acc.chunk_start = P;
	fa.observe = obs_cb;
	fa.observe_user = &acc;
	float *la = malloc((size_t)C * c.n_vocab * sizeof *la);
	float *lb = malloc((size_t)C * c.n_vocab * sizeof *lb);
	ck_assert_int_eq(rt_model_forward(&fa, &a, tok + P, C, P, la, RT_LOGITS_ALL, &err), 0);
	for (int i = 0; i < C; i++)
		ck_assert_int_eq(rt_model_forward(&fb, &b, tok + P + i, 1, P + i,
		                                  lb + (size_t)i * c.n_vocab, RT_LOGITS_ALL, &err), 0);
	double d = max_diff_f(la, lb, (size_t)C * c.n_vocab);
	/* 3e-5 as test_chunking_invariance (measured 1.5e-5 on an AMD EPYC) */
	ck_assert_msg(d <= 3e-5, "chunk vs token-by-token at 2000 tokens: %g", d);
	ck_assert_int_eq(acc.calls, (long)C * c.n_layer * c.n_head_kv);
	ck_assert_int_eq(acc.bad_n, 0);
	ck_assert_msg(acc.worst_sum < 1e-5 && acc.worst_out < 1e-5, "observe: sum %g, out %g",
	              acc.worst_sum, acc.worst_out);
	free(la), free(lb), free(tok);
	rt_fwd_free(&fa), rt_fwd_free(&fb);
	rt_kv_free(&a), rt_kv_free(&b);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* ---- bad inputs ---------------------------------------------------------------------- */

enum damage { D_NONE, D_ARCH, D_MISSING, D_SHAPE, D_NO_CTX, D_HEADS, D_ROPE_SCALING, D_ROPE_FREQS,
	      D_YARN_OK, D_FREQS_OK };

/* A 1-layer F32 llama (4q/2kv, E 32, F 32, V 40, head_dim 8) with one deliberate defect
 * (D_YARN_OK, D_FREQS_OK: no defect, RoPE scaling that loads). */
static void write_damaged(const char *path, enum damage d)
{
	const int E = 32, F = 32, V = 40, KD = 16;
	gw *w = gw_init();
	gw_kv_str(w, "general.architecture", d == D_ARCH ? "gpt2" : "llama");
	gw_kv_u32(w, "llama.block_count", 1);
	if (d != D_NO_CTX)
		gw_kv_u32(w, "llama.context_length", 16);
	gw_kv_u32(w, "llama.embedding_length", (uint32_t)E);
	gw_kv_u32(w, "llama.feed_forward_length", (uint32_t)F);
	gw_kv_u32(w, "llama.attention.head_count", 4);
	gw_kv_u32(w, "llama.attention.head_count_kv", d == D_HEADS ? 3 : 2);
	gw_kv_f32(w, "llama.rope.freq_base", 10000.0f);
	gw_kv_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
	if (d == D_ROPE_SCALING) {
		gw_kv_str(w, "llama.rope.scaling.type", "longrope");
		gw_kv_f32(w, "llama.rope.scaling.factor", 4.0f);
	}
	if (d == D_YARN_OK) {
		gw_kv_str(w, "llama.rope.scaling.type", "yarn");
		gw_kv_f32(w, "llama.rope.scaling.factor", 4.0f);
		gw_kv_u32(w, "llama.rope.scaling.original_context_length", 64);
	}
	float *z = calloc((size_t)V * E, sizeof *z);
	for (int i = 0; i < V * E; i++)
		z[i] = 0.01f * (float)(i % 7);
	int64_t ne_embd[2] = { E, V }, ne_n[1] = { E }, ne_q[2] = { E, E }, ne_k[2] = { E, KD };
	int64_t ne_k_bad[2] = { E, KD + 1 }, ne_ff[2] = { E, F }, ne_down[2] = { F, E };
	gw_tensor_f32(w, "token_embd.weight", 2, ne_embd, z);
	gw_tensor_f32(w, "output_norm.weight", 1, ne_n, z);
	if (d == D_ROPE_FREQS) /* z[0] = 0: a factor that would divide by zero */
		gw_tensor_f32(w, "rope_freqs.weight", 1, (int64_t[1]){ 4 }, z);
	if (d == D_FREQS_OK)
		gw_tensor_f32(w, "rope_freqs.weight", 1, (int64_t[1]){ 4 }, (float[4]){ 1, 2, 4, 8 });
	gw_tensor_f32(w, "blk.0.attn_norm.weight", 1, ne_n, z);
	gw_tensor_f32(w, "blk.0.attn_q.weight", 2, ne_q, z);
	gw_tensor_f32(w, "blk.0.attn_k.weight", 2, d == D_SHAPE ? ne_k_bad : ne_k, z);
	gw_tensor_f32(w, "blk.0.attn_v.weight", 2, ne_k, z);
	gw_tensor_f32(w, "blk.0.attn_output.weight", 2, ne_q, z);
	gw_tensor_f32(w, "blk.0.ffn_norm.weight", 1, ne_n, z);
	if (d != D_MISSING)
		gw_tensor_f32(w, "blk.0.ffn_gate.weight", 2, ne_ff, z);
	gw_tensor_f32(w, "blk.0.ffn_up.weight", 2, ne_ff, z);
	gw_tensor_f32(w, "blk.0.ffn_down.weight", 2, ne_down, z);
	ck_assert_int_eq(gw_write(w, path), 0);
	gw_free(w);
	free(z);
}

START_TEST(test_bad_files)
{
	static const struct {
		enum damage d;
		const char *want;
	} cases[] = {
		{ D_ARCH, "general.architecture 'gpt2' is not supported (supported: 'llama', 'qwen2', "
		          "'qwen3', 'gemma3')" },
		{ D_ROPE_SCALING, "key 'llama.rope.scaling.type' = 'longrope' is not supported "
		                  "(supported: none, linear, yarn)" },
		{ D_ROPE_FREQS, "tensor 'rope_freqs.weight'[0] = 0 must be positive" },
		{ D_MISSING, "missing tensor 'blk.0.ffn_gate.weight'" },
		{ D_SHAPE, "tensor 'blk.0.attn_k.weight' has shape [32, 17], expected [32, 16]" },
		{ D_NO_CTX, "llama.context_length" },
		{ D_HEADS, "head_count 4 must be a positive multiple of head_count_kv 3" },
	};
	char path[256];
	tmp_path(path, sizeof path, "bad");
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		write_damaged(path, cases[i].d);
		rt_err err = {0};
		rt_model *m = rt_model_open(path, &exact_opts, &err);
		ck_assert_ptr_null(m);
		ck_assert_msg(strstr(err.msg, cases[i].want) != NULL, "case %zu: got '%s'", i, err.msg);
		ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0, "error does not name the file: %s",
		              err.msg);
		ck_assert_ptr_null(strchr(err.msg, '\n'));
	}
	/* the undamaged variant loads (so the cases above fail for their stated reason) */
	write_damaged(path, D_NONE);
	rt_err err = {0};
	rt_model *m = rt_model_open(path, &exact_opts, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	ck_assert_int_eq(m->hp.n_ctx, 16);
	ck_assert_int_eq(m->hp.group, 2);
	ck_assert_double_eq(m->layers[0].rope_freq[1], rt_rope_freq(1, 8, 10000.0f));
	rt_model_free(m);
	/* RoPE scaling as llama.cpp reads it, n_rot 8 at base 10000 (frequencies 1, 0.1, 0.01,
	 * 0.001; test_rope works the cases out by hand): YaRN factor 4 over an original
	 * context of 64 keeps pair 0, mixes pair 1 half and half, interpolates the others */
	static const struct {
		enum damage d;
		double f[4];
		float mscale;
	} ok[] = { { D_YARN_OK, { 1, 0.0625, 0.0025, 0.00025 }, 1.1386294f },
		   { D_FREQS_OK, { 1, 0.05, 0.0025, 0.000125 }, 1.0f } };
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		write_damaged(path, ok[i].d);
		m = rt_model_open(path, &exact_opts, &err);
		ck_assert_msg(m != NULL, "%s", err.msg);
		for (int k = 0; k < 4; k++)
			ck_assert_double_eq_tol(m->layers[0].rope_freq[k], ok[i].f[k], 1e-9 * ok[i].f[k]);
		ck_assert_float_eq_tol(m->layers[0].rope_mscale, ok[i].mscale, 1e-6f);
		rt_model_free(m);
	}
	ck_assert_ptr_null(rt_model_open("tests/tmp/does-not-exist.gguf", &exact_opts, &err));
	ck_assert_ptr_nonnull(strstr(err.msg, "does-not-exist.gguf"));
	unlink(path);
}
END_TEST

/* Last-row logits of tokens tok[0..n) fed from position 0 into a fresh cache. */
static void last_logits(rt_model *m, const int32_t *tok, int n, float *lg)
{
	rt_err err = {0};
	rt_kv kv;
	rt_fwd f;
	ck_assert_int_eq(rt_model_kv_init(m, &kv, n, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&f, m, n, n, &err), 0);
	ck_assert_msg(rt_model_forward(&f, &kv, tok, n, 0, lg, RT_LOGITS_LAST, &err) == 0, "%s", err.msg);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
}

/* A Mistral-style window (llama.attention.sliding_window W, every layer): RoPE scores
 * depend on relative positions only, so in a 1-layer model the last of 12 tokens under a
 * window of 4 sees exactly what it sees when only the last 4 tokens are fed from position
 * 0; without the window the two differ (the check can fail). Shape 4/1. */
START_TEST(test_mistral_window)
{
	tiny_model_cfg c = shape_cfg(1, RT_GGML_F32);
	c.n_layer = 1;
	c.n_swa = 4;
	int32_t tok[12];
	test_tokens(tok, 12, c.n_vocab, 7u);
	float *a = malloc((size_t)c.n_vocab * sizeof *a), *b = malloc((size_t)c.n_vocab * sizeof *b);
	for (int windowed = 1; windowed >= 0; windowed--) {
		c.n_swa = windowed ? 4 : 0;
		const char *path = write_model(&c);
		rt_model *m = load_ok(path);
		ck_assert_int_eq(m->layers[0].window, windowed ? 4 : 0);
		ck_assert_int_eq(m->layers[0].rope_slot, 0);
		last_logits(m, tok, 12, a);
		last_logits(m, tok + 8, 4, b);
		double d = max_diff_f(a, b, (size_t)c.n_vocab);
		if (windowed)
			ck_assert_msg(d < 1e-4, "window 4: last-row logits differ from the last 4 tokens "
			              "alone by %g", d);
		else
			ck_assert_msg(d > 1e-3, "without a window the logits should differ (%g)", d);
		rt_model_free(m);
		unlink(path);
	}
	free(a), free(b);
}
END_TEST

START_TEST(test_bad_forward_inputs)
{
	tiny_model_cfg c = shape_cfg(1, RT_GGML_F32);
	c.n_ctx = 8;
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	rt_err err = {0};
	rt_kv kv;
	rt_fwd f;
	ck_assert_int_eq(rt_model_kv_init(m, &kv, 6, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&f, m, 4, 6, &err), 0);
	int32_t tok[10];
	test_tokens(tok, 10, c.n_vocab, 1u);
	/* context too long */
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, 9, 0, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_msg(strstr(err.msg, "context of 9 tokens exceeds the model's context_length 8"),
	              "%s", err.msg);
	ck_assert_int_eq(err.code, RT_ERR_INPUT);
	ck_assert_int_eq(rt_kv_entries(&kv), 0);
	/* token out of range */
	tok[2] = c.n_vocab;
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, 3, 0, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_msg(strstr(err.msg, "outside the vocabulary"), "%s", err.msg);
	ck_assert_int_eq(err.code, RT_ERR_INPUT); /* the caller's token: a 400 in serve */
	tok[2] = -1;
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, 3, 0, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_int_eq(err.code, RT_ERR_INPUT);
	tok[2] = 5;
	/* KV store full */
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, 5, 0, NULL, RT_LOGITS_NONE, &err), 0);
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, 2, 5, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_msg(strstr(err.msg, "KV cache full"), "%s", err.msg);
	ck_assert_int_eq(rt_kv_entries(&kv), 5 * c.n_layer * c.n_head_kv);
	/* logits requested without a buffer */
	ck_assert_int_eq(rt_model_forward(&f, &kv, tok, 1, 5, NULL, RT_LOGITS_ALL, &err), -1);
	/* a store of another shape */
	rt_kv other;
	ck_assert_int_eq(rt_kv_init(&other, 1, 1, 4, 16, 4, 0, 0, &err), 0);
	ck_assert_int_eq(rt_model_forward(&f, &other, tok, 1, 0, NULL, RT_LOGITS_NONE, &err), -1);
	ck_assert_msg(strstr(err.msg, "does not match the model"), "%s", err.msg);
	rt_kv_free(&other);
	/* bad scratch sizes */
	rt_fwd g;
	ck_assert_int_eq(rt_fwd_init(&g, m, 0, 6, &err), -1);
	rt_fwd_free(&g);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	rt_model_free(m);
	unlink(path);
}
END_TEST

/* ---- evaluation ---------------------------------------------------------------------- */

START_TEST(test_softmax_accuracy)
{
	/* rt_attn_softmax against a double-precision softmax on rows of many lengths (vector
	 * body and scalar tail), with log counts, large spreads and a padded tail */
	enum { LD = 300, G = 3 };
	static float P[G * LD], lc[LD];
	double worst = 0;
	unsigned seed = 42;
	for (int lim = 1; lim <= 290; lim += (lim < 40 ? 1 : 17)) {
		for (int i = 0; i < LD; i++) {
			seed = seed * 1103515245u + 12345u;
			lc[i] = (seed >> 9) % 4 == 0 ? logf((float)(1 + (seed >> 20) % 5)) : 0.0f;
		}
		for (int i = 0; i < G * LD; i++) {
			seed = seed * 1103515245u + 12345u;
			float u = (float)((seed >> 8) & 0xffff) / 65536.0f;
			P[i] = (i % 3 == 0 ? 60.0f : 8.0f) * (u - 0.5f); /* spreads up to 60 */
		}
		double ref[G * LD];
		for (int g = 0; g < G; g++) {
			double mx = -INFINITY, sum = 0;
			for (int i = 0; i < lim; i++)
				mx = fmax(mx, (double)P[g * LD + i] + lc[i]);
			for (int i = 0; i < lim; i++)
				sum += exp((double)P[g * LD + i] + lc[i] - mx);
			for (int i = 0; i < lim; i++)
				ref[g * LD + i] = exp((double)P[g * LD + i] + lc[i] - mx) / sum;
		}
		rt_attn_softmax(P, LD, G, lim, lc);
		for (int g = 0; g < G; g++) {
			double s = 0;
			for (int i = 0; i < LD; i++) {
				double p = P[g * LD + i];
				if (i >= lim) {
					ck_assert(p == 0.0);
					continue;
				}
				s += p;
				/* relative error where it matters, absolute for tiny probabilities */
				worst = fmax(worst, fabs(p - ref[g * LD + i]) / fmax(ref[g * LD + i], 1e-6));
			}
			ck_assert_double_eq_tol(s, 1.0, 1e-5);
		}
	}
	ck_assert_msg(worst <= 2e-6, "softmax relative error %g", worst);
	/* a spread beyond the clamp: exp(-100) is negligible, the rest exact */
	float row[20] = { 0 }, zero[20] = { 0 };
	row[3] = -100.0f;
	rt_attn_softmax(row, 20, 1, 20, zero);
	ck_assert_float_eq_tol(row[0], 1.0f / 19.0f, 1e-7f);
	ck_assert(row[3] < 1e-30f);
}
END_TEST

START_TEST(test_logprob_hand)
{
	/* softmax of log(1..4) is (1, 2, 3, 4) / 10 */
	float l[4] = { 0.0f, logf(2.0f), logf(3.0f), logf(4.0f) };
	int32_t top1 = -1;
	ck_assert_double_eq_tol(rt_logprob(l, 4, 2, &top1), log(0.3), 1e-6);
	ck_assert_int_eq(top1, 3);
	/* shift invariance with large logits: no overflow */
	float big[3] = { 1000.0f, 1001.0f, 1000.0f };
	ck_assert_double_eq_tol(rt_logprob(big, 3, 1, &top1), -log(1.0 + 2.0 * exp(-1.0)), 1e-6);
	ck_assert_int_eq(top1, 1);
	/* ties: the lowest id wins */
	float tie[4] = { -1.0f, 5.0f, 5.0f, 2.0f };
	rt_logprob(tie, 4, 0, &top1);
	ck_assert_int_eq(top1, 1);
}
END_TEST

START_TEST(test_eval_ppl_matches_reference)
{
	tiny_model_cfg c = shape_cfg(_i, RT_GGML_Q8_0);
	const char *path = write_model(&c);
	rt_model *m = load_ok(path);
	ref r;
	ref_load(&r, &c, path);
	enum { N = 21 };
	int32_t tok[N];
	test_tokens(tok, N, c.n_vocab, 77u);
	double *rl = malloc((size_t)N * c.n_vocab * sizeof *rl);
	ref_forward(&r, tok, N, vis_all, NULL, rl);
	/* reference NLL: logsumexp in double over the reference logits */
	double nll = 0, ref_lp[N];
	int32_t ref_top1[N];
	for (int i = 0; i + 1 < N; i++) {
		const double *row = rl + (size_t)i * c.n_vocab;
		double mx = row[0];
		ref_top1[i] = 0;
		for (int v = 1; v < c.n_vocab; v++)
			if (row[v] > mx)
				mx = row[v], ref_top1[i] = v;
		double s = 0;
		for (int v = 0; v < c.n_vocab; v++)
			s += exp(row[v] - mx);
		ref_lp[i] = row[tok[i + 1]] - mx - log(s);
		nll -= ref_lp[i];
	}
	double ref_ppl = exp(nll / (N - 1));

	char dpath[256], lpath[256];
	tmp_path(dpath, sizeof dpath, "dump");
	tmp_path(lpath, sizeof lpath, "logits");
	FILE *dump = fopen(dpath, "w"), *lg = fopen(lpath, "wb");
	ck_assert(dump && lg);
	rt_ppl_opts o = { .chunk = 6, .dump = dump, .logits = lg };
	float lp[N];
	int32_t top1[N];
	rt_ppl_result res;
	rt_err err = {0};
	ck_assert_msg(rt_eval_ppl(m, tok, N, &o, lp, top1, &res, &err) == 0, "%s", err.msg);
	fclose(dump);
	fclose(lg);
	ck_assert_int_eq(res.tokens, N);
	ck_assert_int_eq(res.scored, N - 1);
	ck_assert_msg(fabs(res.ppl - ref_ppl) <= 1e-5 * ref_ppl, "ppl %g vs reference %g", res.ppl,
	              ref_ppl);
	ck_assert_double_eq_tol(res.nll_mean, nll / (N - 1), 1e-5);
	int hits = 0;
	for (int i = 0; i + 1 < N; i++) {
		ck_assert_msg(fabs(lp[i] - ref_lp[i]) <= 1e-4, "logprob %d: %g vs %g", i, lp[i], ref_lp[i]);
		ck_assert_int_eq(top1[i], ref_top1[i]);
		hits += ref_top1[i] == tok[i + 1];
	}
	ck_assert_int_eq(res.top1_hits, hits);
	ck_assert_int_eq(res.kv_entries_peak, (int64_t)N * c.n_layer * c.n_head_kv);
	ck_assert_int_gt(res.kv_bytes_peak, res.kv_entries_peak * 2 * (c.n_embd / c.n_head) * 4 - 1);

	/* dump: N-1 JSON lines {"pos":i+1,"token":t[i+1],"logprob":lp,"top1":a} */
	FILE *f = fopen(dpath, "r");
	char line[256];
	int rows = 0;
	while (fgets(line, sizeof line, f)) {
		long pos, t, a;
		double l;
		ck_assert_msg(sscanf(line, "{\"pos\":%ld,\"token\":%ld,\"logprob\":%lf,\"top1\":%ld}", &pos,
		                     &t, &l, &a) == 4, "bad dump line: %s", line);
		ck_assert_int_eq(pos, rows + 1);
		ck_assert_int_eq(t, tok[rows + 1]);
		ck_assert_double_eq_tol(l, ref_lp[rows], 1e-4);
		ck_assert_int_eq(a, ref_top1[rows]);
		rows++;
	}
	fclose(f);
	ck_assert_int_eq(rows, N - 1);

	/* logits file: raw f32 [N × V] equal to the reference */
	f = fopen(lpath, "rb");
	float *raw = malloc((size_t)N * c.n_vocab * sizeof *raw);
	ck_assert_uint_eq(fread(raw, sizeof(float), (size_t)N * c.n_vocab + 1, f), (size_t)N * c.n_vocab);
	fclose(f);
	ck_assert(max_diff_fd(raw, rl, (size_t)N * c.n_vocab) <= 1e-4);
	free(raw);

	/* JSON summary: one line with the required keys */
	FILE *js = tmpfile();
	rt_eval_json(js, m, "00ff", "t\"x.txt", "full", &res, 2, 6);
	rewind(js);
	char buf[1024];
	ck_assert_ptr_nonnull(fgets(buf, sizeof buf, js));
	fclose(js);
	const char *keys[] = { "{\"policy\":\"full\"", "\"tokens\":21", "\"ppl\":", "\"nll_mean\":",
		               "\"tokens_per_s\":", "\"kv_entries_peak\":", "\"kv_bytes_peak\":",
		               "\"threads\":2", "\"text\":\"t\\\"x.txt\"", "\"model_sha256\":\"00ff\"" };
	for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
		ck_assert_msg(strstr(buf, keys[k]) != NULL, "JSON lacks %s: %s", keys[k], buf);

	/* too few tokens / too many */
	ck_assert_int_eq(rt_eval_ppl(m, tok, 1, &o, NULL, NULL, &res, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "at least 2 tokens"));
	unlink(dpath);
	unlink(lpath);
	free(rl);
	ref_free(&r);
	rt_model_free(m);
	unlink(path);
}
END_TEST

static Suite *model_suite(void)
{
	Suite *s = suite_create("model");
	TCase *tc = tcase_create("forward");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_logits_match_reference, 0, 9);
	tcase_add_loop_test(tc, test_chunking_invariance, 0, 3);
	tcase_add_loop_test(tc, test_fast_path, 0, 6);
	tcase_add_test(tc, test_multi_mixed_ways);
	tcase_add_loop_test(tc, test_evicted_cache_oracle, 0, 3);
	tcase_add_loop_test(tc, test_kvzip_replay_oracle, 0, 2);
	tcase_add_loop_test(tc, test_kvzip_replay_window_oracle, 0, 2);
	tcase_add_test(tc, test_kvzip_replay_refusals);
	tcase_add_loop_test(tc, test_window_out_of_order_oracle, 0, 3);
	tcase_add_loop_test(tc, test_count_oracle, 0, 3);
	tcase_add_test(tc, test_observe_hook);
	tcase_add_loop_test(tc, test_narrow_kv_types, 0, 4);
	tcase_add_test(tc, test_long_context_row_blocks);
	suite_add_tcase(s, tc);
	TCase *bad = tcase_create("errors");
	tcase_add_test(bad, test_bad_files);
	tcase_add_test(bad, test_mistral_window);
	tcase_add_test(bad, test_bad_forward_inputs);
	suite_add_tcase(s, bad);
	TCase *ev = tcase_create("eval");
	tcase_add_test(ev, test_logprob_hand);
	tcase_add_test(ev, test_softmax_accuracy);
	tcase_add_loop_test(ev, test_eval_ppl_matches_reference, 0, 3);
	suite_add_tcase(s, ev);
	return s;
}

int main(void)
{
	int failed = check_run(model_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
