/*
 * test_gemma: the second real model, Gemma 3 270M Q4_K_M (architecture gemma3: per-head Q/K
 * norm, post-norms, GELU, sliding-window layers; path in env KVRT_GEMMA, default
 * models/gemma-3-270m-q4_k_m.gguf, fetched by `make model-gemma`), against llama.cpp's
 * llama-perplexity on the same file and text. The tests print a message and pass when the
 * model file is absent (they cannot fail for want of a download).
 *
 * Reference: tests/golden/model/gemma3_gpl3.txt, written by
 * scripts/reference/make_gemma_golden.py from the log-probabilities llama-perplexity
 * --kl-divergence-base stores (llama.cpp computes them with its own kernels: Q8-quantised
 * activations against the Q5_0/Q4_K/Q6_K/Q8_0 weights, F16 KV cache). The golden holds
 * llama-perplexity's tokens for one chunk (the first token replaced by BOS when the
 * vocabulary adds one, as llama-perplexity does) and, for each scored position i (the
 * second half of the chunk, as llama-perplexity scores), the next token's log-probability
 * and llama.cpp's top-1.
 * Asserted on kvrt's full cache (fast path, the path users run; the exact path where not
 * sanitized), 63 positions of a 128-token chunk of GPL-3: perplexity within 3% of
 * llama.cpp's on the same positions, mean |Δ logprob| <= 0.12 and max <= 0.6 nats, top-1
 * agreement >= 90%. Measured (both paths): ppl 16.119 vs 15.897 (+1.4%), mean |Δ| 0.081,
 * max 0.419, top-1 0.952; the bounds are about 1.5x that, the scale of llama.cpp's own
 * rounding (Q8 activations, F16 KV cache, GELU through an f16 table) on this model, whose
 * norms reach weights of 300 (docs/exactness.md, Gemma 3 section).
 *
 * test_gemma_window: the sliding-window layers keep only their window (rt_model_forward):
 * 600 tokens fed in chunks of 64 (the out-of-window entries evicted after each chunk)
 * give the logits of one chunk of 600 (where only the mask hides them) within 1e-4, and
 * leave exactly window - 1 entries in every sliding-window head and all 600 in the global
 * ones.
 *
 * test_gemma_rerotation: StreamingLLM's compacted positions re-rotate a sliding-window
 * layer's keys at that layer's base (a hand rotation of the full cache's keys).
 *
 * test_gemma_global_only: a policy with `layers = global_only` leaves the sliding-window
 * layers to the model and compresses the global ones to its budget; its compression is
 * counted over those (hand-computed 4x entries, 2x bytes).
 *
 * test_gemma_chat_tokens: the chat prompts `run --chat` and `serve` feed for two
 * conversations equal llama-server's token ids (golden and command by the test), and a
 * plain prompt starts with BOS as llama-tokenize's does.
 *
 * With KVRT_KL_BASE=FILE (a llama-perplexity --kl-divergence-base file of any chunk count)
 * test_gemma_kl_file also runs every chunk of that file and prints llama-perplexity's own
 * statistics of kvrt against it (the KL formula and top-1 of perplexity.cpp's log_softmax):
 * the figures in docs/exactness.md.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/rt_chat.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "base/rt_rope.h"
#include "policy/rt_policy.h"
#include "policy/rt_seq.h"
#include "eval/rt_compression.h"
#include "support/check_run.h"

extern const struct kvp_policy kvp_policy_h2o_global_only;

#define GOLDEN "tests/golden/model/gemma3_gpl3.txt"

static const char *gemma_path(void)
{
	const char *p = getenv("KVRT_GEMMA");
	p = p && *p ? p : "models/gemma-3-270m-q4_k_m.gguf";
	if (access(p, R_OK) != 0) {
		printf("test_gemma: %s absent (make model-gemma): skipped\n", p);
		return NULL;
	}
	return p;
}

/* Run one chunk tok[0..n_ctx) (tok[0] already BOS where wanted) from an empty cache and
 * write the logits of rows first..n_ctx-2 (each predicting the next token) into lg. */
static void run_chunk(rt_fwd *f, rt_kv *kv, const int32_t *tok, int n_ctx, int first,
                      float *lg)
{
	rt_err err = { "" };
	rt_kv_reset(kv);
	ck_assert_msg(rt_model_forward(f, kv, tok, first, 0, NULL, RT_LOGITS_NONE, &err) == 0, "%s",
	              err.msg);
	ck_assert_msg(rt_model_forward(f, kv, tok + first, n_ctx - 1 - first, first, lg, RT_LOGITS_ALL,
	                               &err) == 0, "%s", err.msg);
}

/* log-softmax of row x[V] at index t, and the row's argmax */
static double logprob_at(const float *x, int V, int t, int *top)
{
	float mx = x[0];
	int am = 0;
	for (int v = 1; v < V; v++)
		if (x[v] > mx)
			mx = x[v], am = v;
	double s = 0.0;
	for (int v = 0; v < V; v++)
		s += exp((double)x[v] - mx);
	*top = am;
	return (double)x[t] - mx - log(s);
}

typedef struct golden {
	int n_ctx, first;
	int32_t *tok;     /* [n_ctx] as run (BOS first) */
	double *lp;       /* [n_ctx - 1 - first] llama.cpp's log-prob of the next token */
	int32_t *top1;
	double ppl;
} golden;

static void golden_load(golden *g)
{
	memset(g, 0, sizeof *g);
	FILE *fp = fopen(GOLDEN, "r");
	ck_assert_msg(fp != NULL, "%s: cannot open (run from the repository root)", GOLDEN);
	char line[1 << 16];
	int rows = 0;
	while (fgets(line, sizeof line, fp)) {
		if (sscanf(line, "# n_ctx %d first %d", &g->n_ctx, &g->first) == 2) {
			g->tok = calloc((size_t)g->n_ctx, sizeof *g->tok);
			g->lp = calloc((size_t)g->n_ctx, sizeof *g->lp);
			g->top1 = calloc((size_t)g->n_ctx, sizeof *g->top1);
			continue;
		}
		sscanf(line, "# ppl_llama %lf", &g->ppl);
		if (line[0] == '#')
			continue;
		ck_assert_msg(g->tok != NULL, "%s: rows before the '# n_ctx' header", GOLDEN);
		if (strncmp(line, "tokens", 6) == 0) {
			char *p = line + 6;
			for (int i = 0; i < g->n_ctx; i++) {
				char *e;
				g->tok[i] = (int32_t)strtol(p, &e, 10);
				ck_assert_msg(e != p, "%s: %d tokens, expected %d", GOLDEN, i, g->n_ctx);
				p = e;
			}
			continue;
		}
		int i, nt, t1;
		double lp;
		ck_assert_msg(sscanf(line, "%d %d %lf %d", &i, &nt, &lp, &t1) == 4, "%s: malformed line '%s'",
		              GOLDEN, line);
		ck_assert_int_eq(i, g->first + rows);
		ck_assert_int_eq(nt, g->tok[i + 1]);
		g->lp[rows] = lp, g->top1[rows] = t1;
		rows++;
	}
	fclose(fp);
	ck_assert_int_eq(rows, g->n_ctx - 1 - g->first);
	ck_assert(g->ppl > 1.0);
}

/* kvrt (exact or fast path) against the golden */
static void check_golden(int exact)
{
	const char *path = gemma_path();
	if (!path)
		return;
	golden g;
	golden_load(&g);
	rt_err err = { "" };
	const rt_model_opts o = { .exact = exact, .threads = 1 };
	rt_model *m = rt_model_open(path, &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	ck_assert_int_eq(m->hp.arch, RT_ARCH_GEMMA3);
	const int V = m->hp.n_vocab, nr = g.n_ctx - 1 - g.first;
	rt_kv kv;
	rt_fwd f;
	ck_assert_msg(rt_model_kv_init(m, &kv, g.n_ctx, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_fwd_init(&f, m, 64, g.n_ctx, &err) == 0, "%s", err.msg);
	float *lg = malloc((size_t)nr * V * sizeof(float));
	ck_assert_ptr_nonnull(lg);
	run_chunk(&f, &kv, g.tok, g.n_ctx, g.first, lg);
	double nll = 0.0, sum_d = 0.0, max_d = 0.0;
	int agree = 0;
	for (int r = 0; r < nr; r++) {
		int top;
		const double lp = logprob_at(lg + (size_t)r * V, V, g.tok[g.first + r + 1], &top);
		nll -= lp;
		const double d = fabs(lp - g.lp[r]);
		sum_d += d;
		max_d = d > max_d ? d : max_d;
		agree += top == g.top1[r];
	}
	const double ppl = exp(nll / nr), mean_d = sum_d / nr, agr = (double)agree / nr;
	printf("test_gemma (%s): ppl %.4f vs llama.cpp %.4f, mean |dlogprob| %.4f, max %.4f, top-1 "
	       "agreement %.4f over %d positions\n", exact ? "exact" : "fast", ppl, g.ppl, mean_d, max_d,
	       agr, nr);
	ck_assert_msg(fabs(ppl / g.ppl - 1.0) <= 0.03, "ppl %.4f vs llama.cpp %.4f", ppl, g.ppl);
	ck_assert_msg(mean_d <= 0.12 && max_d <= 0.6, "mean |dlogprob| %.4f, max %.4f", mean_d, max_d);
	ck_assert_msg(agr >= 0.90, "top-1 agreement %.4f", agr);
	free(lg);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	rt_model_free(m);
	free(g.tok), free(g.lp), free(g.top1);
}

START_TEST(test_gemma_fast_vs_llama)
{
	check_golden(0);
}
END_TEST

START_TEST(test_gemma_exact_vs_llama)
{
	/* the exact path holds every weight in f32 (about 1.1 GB): not under the sanitizers */
	if (getenv("KVRT_SANITIZED")) {
		printf("test_gemma: exact path skipped under KVRT_SANITIZED\n");
		return;
	}
	check_golden(1);
}
END_TEST

/* feed ids[0..n) in chunks of `chunk`; the last row's logits into lg */
static void feed(rt_model *m, rt_kv *kv, const int32_t *ids, int n, int chunk, float *lg)
{
	rt_err err = { "" };
	rt_fwd f;
	ck_assert_msg(rt_model_kv_init(m, kv, n, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_fwd_init(&f, m, chunk, n, &err) == 0, "%s", err.msg);
	for (int d = 0; d < n; d += chunk) {
		const int c = n - d < chunk ? n - d : chunk;
		ck_assert_msg(rt_model_forward(&f, kv, ids + d, c, d, lg, RT_LOGITS_LAST, &err) == 0, "%s",
		              err.msg);
	}
	rt_fwd_free(&f);
}

START_TEST(test_gemma_window)
{
	const char *path = gemma_path();
	if (!path)
		return;
	if (getenv("KVRT_SANITIZED")) { /* 1200 tokens of a 270M model: the plain pass covers it */
		printf("test_gemma: window test skipped under KVRT_SANITIZED\n");
		return;
	}
	rt_err err = { "" };
	const rt_model_opts o = { .exact = 0, .threads = 1 };
	rt_model *m = rt_model_open(path, &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	const int n = 600, V = m->hp.n_vocab, w = m->hp.n_swa;
	ck_assert_int_eq(w, 512);
	int32_t *ids = malloc(n * sizeof *ids);
	uint32_t s = 1;
	ids[0] = 2;
	for (int i = 1; i < n; i++) {
		s = s * 1103515245u + 12345u;
		ids[i] = 300 + (int32_t)((s >> 8) % 20000);
	}
	float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
	rt_kv ka, kb;
	feed(m, &ka, ids, n, n, a);
	feed(m, &kb, ids, n, 64, b);
	double md = 0.0;
	for (int v = 0; v < V; v++)
		md = fmax(md, fabs((double)a[v] - b[v]));
	printf("test_gemma: window trim vs mask: max |dlogit| %.3g\n", md);
	ck_assert_msg(md <= 1e-4, "max |dlogit| %g", md);
	for (int l = 0; l < m->hp.n_layer; l++) {
		const int want = m->layers[l].window ? w - 1 : n;
		ck_assert_int_eq(rt_kv_head_at(&ka, l, 0)->n, want);
		ck_assert_int_eq(rt_kv_head_at(&kb, l, 0)->n, want);
		ck_assert_int_eq(m->layers[l].window ? 1 : 0, l % 6 != 5);
	}
	free(ids), free(a), free(b);
	rt_kv_free(&ka), rt_kv_free(&kb);
	rt_model_free(m);
}
END_TEST

/* llama-perplexity's statistics of kvrt against a --kl-divergence-base file: its header
 * "_logits_", n_ctx u32, n_vocab i32, n_chunk i32, the tokens [n_chunk × n_ctx] i32, then
 * per chunk n_ctx - 1 - n_ctx/2 rows of nv = 2·((n_vocab + 1)/2) + 4 u16 (two floats
 * scale, min_log_prob, then the codes of log p = scale·code + min_log_prob). */
static void kl_file(const char *path, const char *base, int exact)
{
	FILE *fp = fopen(base, "rb");
	ck_assert_msg(fp != NULL, "%s: cannot open", base);
	char magic[8];
	uint32_t n_ctx;
	int32_t n_vocab, n_chunk;
	ck_assert(fread(magic, 1, 8, fp) == 8 && memcmp(magic, "_logits_", 8) == 0);
	ck_assert(fread(&n_ctx, 4, 1, fp) == 1 && fread(&n_vocab, 4, 1, fp) == 1 &&
	          fread(&n_chunk, 4, 1, fp) == 1);
	int32_t *tok = malloc((size_t)n_ctx * n_chunk * sizeof *tok);
	ck_assert(fread(tok, 4, (size_t)n_ctx * n_chunk, fp) == (size_t)n_ctx * n_chunk);
	rt_err err = { "" };
	const rt_model_opts o = { .exact = exact, .threads = 2 };
	rt_model *m = rt_model_open(path, &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	ck_assert_int_eq(m->hp.n_vocab, n_vocab);
	const int V = n_vocab, first = (int)n_ctx / 2, nr = (int)n_ctx - 1 - first;
	const size_t nv = 2 * (((size_t)V + 1) / 2) + 4;
	uint16_t *bl = malloc(nv * 2 * nr);
	float *lg = malloc((size_t)nr * V * sizeof(float));
	rt_kv kv;
	rt_fwd f;
	ck_assert_msg(rt_model_kv_init(m, &kv, (int32_t)n_ctx, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_fwd_init(&f, m, 512, (int32_t)n_ctx, &err) == 0, "%s", err.msg);
	double nll = 0, nll_b = 0, kld = 0, kmax = 0;
	long same = 0, cnt = 0;
	for (int c = 0; c < n_chunk; c++) {
		int32_t *t = tok + (size_t)c * n_ctx;
		const int32_t t0 = t[0];
		t[0] = 2; /* BOS: tokenizer.ggml.bos_token_id of the file, add_bos_token true */
		run_chunk(&f, &kv, t, (int)n_ctx, first, lg);
		t[0] = t0;
		ck_assert(fread(bl, nv * 2, (size_t)nr, fp) == (size_t)nr);
		for (int r = 0; r < nr; r++) {
			const float *x = lg + (size_t)r * V;
			const uint16_t *b = bl + (size_t)r * nv;
			float sc, mn;
			memcpy(&sc, b, 4);
			memcpy(&mn, b + 2, 4);
			b += 4;
			int top;
			const int nt = t[first + r + 1];
			const double lp = logprob_at(x, V, nt, &top);
			const double lse = (double)x[top] - logprob_at(x, V, top, &top);
			nll -= lp;
			nll_b -= sc * b[nt] + mn;
			double sum = 0;
			int top_b = 0;
			float pbmax = 0;
			for (int i = 0; i < V; i++) {
				const float plb = sc * b[i] + mn;
				if (i == 0 || plb > pbmax)
					pbmax = plb, top_b = i;
				if (plb > -16.f)
					sum += expf(plb) * (plb - (x[i] - lse));
			}
			kld += sum;
			kmax = sum > kmax ? sum : kmax;
			same += top == top_b;
			cnt++;
		}
	}
	printf("test_gemma KL (%s path, %s, %d chunks of %u): ppl kvrt %.4f, llama.cpp %.4f; "
	       "KL(llama||kvrt) mean %.6f max %.6f; same top %.4f over %ld positions\n",
	       exact ? "exact" : "fast", base, n_chunk, n_ctx, exp(nll / cnt), exp(nll_b / cnt),
	       kld / cnt, kmax, (double)same / cnt, cnt);
	fclose(fp);
	free(tok), free(bl), free(lg);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	rt_model_free(m);
}

/* StreamingLLM's compacted positions on Gemma's sliding-window layers (rt_seq.c
 * seq_rerotate): a kept key is turned from its position p to its new index i at its
 * layer's own RoPE base (rope.freq_base_swa 10000 there, not the global 1e6). Layer 0 is a
 * sliding-window layer and its keys depend on the token alone, so the oracle is the full
 * cache's key at p (the same token, the same projection) rotated by i - p at base 10000
 * by hand (rt_rope_by_f32, angles in double); at the global base the keys would differ by
 * O(1). 40 tokens one at a time (sinks 2, recent 8), f32 store on the fast path. */
START_TEST(test_gemma_rerotation)
{
	const char *path = gemma_path();
	if (!path)
		return;
	enum { N = 40 };
	rt_err err = { "" };
	const rt_model_opts o = { .exact = 0, .threads = 2, .kv_type = RT_KV_F32 };
	rt_model *m = rt_model_open(path, &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	ck_assert_int_gt(m->layers[0].window, 0);
	ck_assert_float_eq(m->layers[0].rope_base, 10000.0f);
	ck_assert_float_eq(m->hp.rope_base, 1e6f);
	const struct kvp_policy *p = rt_registry_find(kvp_registry, kvp_registry_count, "streaming_llm");
	ck_assert_ptr_nonnull(p);
	rt_seq s;
	ck_assert_msg(rt_seq_init(&s, m, p, N, 1, -1, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_seq_set(&s, "sinks=2", &err) == 0 && rt_seq_set(&s, "recent=8", &err) == 0,
	              "%s", err.msg);
	rt_kv kv;
	rt_fwd f;
	ck_assert_msg(rt_model_kv_init(m, &kv, N, &err) == 0 && rt_fwd_init(&f, m, 1, N, &err) == 0,
	              "%s", err.msg);
	float *lg = malloc((size_t)m->hp.n_vocab * sizeof *lg);
	int32_t tok[N];
	for (int i = 0; i < N; i++)
		tok[i] = 1000 + 37 * i;
	for (int i = 0; i < N; i++) {
		ck_assert_msg(rt_seq_feed(&s, tok + i, 1, lg, RT_LOGITS_LAST, &err) == 0, "%s", err.msg);
		ck_assert_msg(rt_model_forward(&f, &kv, tok + i, 1, i, lg, RT_LOGITS_LAST, &err) == 0,
		              "%s", err.msg);
	}
	const int d = m->hp.head_dim;
	const rt_kv_head *h = rt_kv_head_at(&s.kv, 0, 0), *full = rt_kv_head_at(&kv, 0, 0);
	ck_assert_int_lt(h->n, N);
	int moved = 0;
	double worst = 0;
	for (int32_t i = 0; i < h->n; i++) {
		const int32_t pos = h->pos[i];
		float x[512];
		memcpy(x, full->k + (size_t)pos * d, (size_t)d * sizeof *x);
		rt_rope_by_f32(x, m->hp.n_rot, 10000.0f, (double)i - (double)pos);
		moved += i != pos;
		for (int e = 0; e < d; e++) {
			double err_e = fabs((double)h->k[(size_t)i * d + e] - x[e]) / (1.0 + fabs(x[e]));
			worst = err_e > worst ? err_e : worst;
		}
	}
	ck_assert_int_gt(moved, 0);
	ck_assert_msg(worst < 1e-5, "layer 0's re-rotated keys differ from the hand rotation at "
	              "base 10000 by %g", worst);
	printf("test_gemma: %d of %d kept keys re-rotated on sliding layer 0, max rel. error %.2e\n",
	       moved, h->n, worst);
	free(lg);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	rt_seq_free(&s);
	rt_model_free(m);
}
END_TEST

/* `layers = global_only` (tests/golden/kvp/good/h2o_global_only.kvp: H2O at a ratio of 4)
 * on Gemma's 18 layers, of which 3 (5, 11, 17) attend globally: 160 prompt tokens in
 * chunks of 16 leave every sliding-window list whole (160 < the window 512: the model's
 * rule keeps them) and every global list at the budget 160 / 4 = 40 entries; compression
 * counted over the compressed (global) lists is then 160 / 40 = 4x in entries and, from an
 * f32 store against the f16 baseline, 2x in bytes (over all 18 layers' lists it would be
 * 160 / ((15·160 + 3·40) / 18) = 1.14x). */
START_TEST(test_gemma_global_only)
{
	const char *path = gemma_path();
	if (!path)
		return;
	enum { N = 160, C = 16 };
	rt_err err = { "" };
	const rt_model_opts o = { .exact = 0, .threads = 2, .kv_type = RT_KV_F32 };
	rt_model *m = rt_model_open(path, &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	ck_assert_int_eq(kvp_policy_h2o_global_only.global_only, 1);
	rt_seq s;
	ck_assert_msg(rt_seq_init(&s, m, &kvp_policy_h2o_global_only, N, C, N, &err) == 0 &&
	              rt_seq_set_ratio(&s, 4, &err) == 0 && rt_seq_set_prefill_chunk(&s, C, &err) == 0,
	              "%s", err.msg);
	int32_t tok[N];
	for (int i = 0; i < N; i++)
		tok[i] = 2000 + 53 * i;
	float *lg = malloc((size_t)m->hp.n_vocab * sizeof *lg);
	ck_assert_msg(rt_seq_feed(&s, tok, N, lg, RT_LOGITS_LAST, &err) == 0, "%s", err.msg);
	ck_assert_int_gt(rt_seq_stats_get(&s).compress_events, 0);
	for (int l = 0; l < m->hp.n_layer; l++) {
		const rt_kv_head *h = rt_kv_head_at(&s.kv, l, 0);
		if (m->layers[l].window > 0)
			ck_assert_msg(h->n == N, "sliding layer %d holds %d of %d entries", l, h->n, N);
		else
			ck_assert_msg(h->n == N / 4, "global layer %d holds %d entries, budget %d", l, h->n,
			              N / 4);
	}
	rt_compression c;
	rt_compression_of(&s, N, &c);
	ck_assert_double_eq_tol(c.entries_end, 4.0, 1e-9);
	ck_assert_double_eq_tol(c.bytes_end, 2.0, 1e-9);
	free(lg);
	rt_seq_free(&s);
	rt_model_free(m);
}
END_TEST

/* llama.cpp's token ids of two conversations on this file. The file carries no
 * tokenizer.chat_template (llama.cpp would fall back to ChatML, which this vocabulary does
 * not have: `llama-server -m GEMMA` then greedily answers '<|im_end|>\n<|im_start|>...');
 * kvrt takes the Gemma family from the <start_of_turn> token, so the reference is
 * llama-server with that template, its /apply-template output tokenized as it feeds a
 * prompt (add_special: BOS first; parse_special):
 *   llama-server -m models/gemma-3-270m-q4_k_m.gguf --no-jinja --chat-template gemma --port P
 *   curl -s localhost:P/apply-template -d '{"messages": MSGS}'            -> {"prompt": TEXT}
 *   curl -s localhost:P/tokenize -d '{"content": TEXT, "add_special": true,
 *                                     "parse_special": true}'          -> {"tokens": [...]}
 */
static const rt_chat_msg CHAT_A[] = { { "user", "What is the capital of France?" } };
static const int32_t GOLD_A[] = { 2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881,
	                          106, 107, 105, 4368, 107 };
static const rt_chat_msg CHAT_B[] = {
	{ "system", "You are a terse assistant." },
	{ "user", "Name three primary colors." },
	{ "assistant", "Red, yellow and blue." },
	{ "user", "And the secondary ones?" },
};
static const int32_t GOLD_B[] = { 2, 105, 2364, 107, 3048, 659, 496, 17514, 16326, 236761, 108,
	                          1567, 1806, 5905, 7913, 236761, 106, 107, 105, 4368, 107, 9264,
	                          236764, 7070, 532, 3730, 236761, 106, 107, 105, 2364, 107, 3133,
	                          506, 10929, 5906, 236881, 106, 107, 105, 4368, 107 };

/* The ids of m rendered in one piece (BOS by rt_tokenize_prompt, as llama.cpp tokenizes a
 * rendered template) and as `run --chat` and `serve` feed them (rt_chat_tokenize: one text,
 * control tokens parsed only in the template's pieces), each equal to gold; the ids marked as message 0's are
 * [lo0, hi0) (of a system message m[0], the span `system`), the template's own (BOS, the
 * generation prompt) -1. */
static void check_chat(const rt_tokenizer *t, const rt_chat_msg *m, int n, const int32_t *gold,
                       int ng, int lo0, int hi0)
{
	rt_err err = { "" };
	char *r = rt_chat_render_msgs(t, m, n, &err);
	ck_assert_msg(r != NULL, "%s", err.msg);
	int32_t ids[128];
	int64_t k = rt_tokenize_prompt(t, r, strlen(r), 1, ids, 128, &err);
	ck_assert_int_eq(k, ng);
	for (int i = 0; i < ng; i++)
		ck_assert_msg(ids[i] == gold[i], "rendered: token %d is %d, llama.cpp %d", i, ids[i],
		              gold[i]);
	free(r);
	int *of = NULL;
	int32_t *p = rt_chat_tokenize(t, m, n, &k, &of, &err);
	ck_assert_msg(p != NULL, "%s", err.msg);
	ck_assert_int_eq(k, ng);
	for (int i = 0; i < ng; i++)
		ck_assert_msg(p[i] == gold[i], "pieces: token %d is %d, llama.cpp %d", i, p[i], gold[i]);
	int lo = -1, hi = -1;
	for (int i = 0; i < ng; i++)
		if (of[i] == 0)
			hi = i + 1, lo = lo < 0 ? i : lo;
	ck_assert_int_eq(lo, lo0);
	ck_assert_int_eq(hi, hi0);
	for (int i = lo; i >= 0 && i < hi; i++)
		ck_assert_int_eq(of[i], 0);
	ck_assert_int_eq(of[0], -1);      /* <bos> */
	ck_assert_int_eq(of[ng - 1], -1); /* the generation prompt's last id */
	free(p), free(of);
}

START_TEST(test_gemma_chat_tokens)
{
	const char *path = gemma_path();
	if (!path)
		return;
	rt_err err = { "" };
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	rt_tokenizer *t = rt_tokenizer_init(g, &err);
	ck_assert_msg(t != NULL, "%s", err.msg);
	rt_gguf_close(g);
	ck_assert_str_eq(rt_chat_family(t, &err), "gemma");
	/* the user's turn, its markers included (<start_of_turn> user \n ... <end_of_turn> \n),
	 * between <bos> and the generation prompt */
	check_chat(t, CHAT_A, 1, GOLD_A, (int)(sizeof GOLD_A / sizeof GOLD_A[0]), 1, 13);
	/* Gemma has no system turn: the system text and its "\n\n" (ids 3048 .. 108) open the
	 * first user turn, after <bos> <start_of_turn> user \n */
	check_chat(t, CHAT_B, 4, GOLD_B, (int)(sizeof GOLD_B / sizeof GOLD_B[0]), 4, 11);
	/* a plain prompt starts with BOS as llama-tokenize gives it: [2, 9259, 1902] */
	int32_t ids[4];
	ck_assert_int_eq(rt_tokenize_prompt(t, "Hello world", 11, 0, ids, 4, &err), 3);
	ck_assert_int_eq(ids[0], 2);
	ck_assert_int_eq(ids[1], 9259);
	ck_assert_int_eq(ids[2], 1902);
	rt_tokenizer_free(t);
}
END_TEST

START_TEST(test_gemma_kl_file)
{
	const char *base = getenv("KVRT_KL_BASE");
	const char *path = gemma_path();
	if (!base || !path) {
		printf("test_gemma: KVRT_KL_BASE unset: the KL run is skipped\n");
		return;
	}
	kl_file(path, base, 0);
	if (getenv("KVRT_KL_EXACT"))
		kl_file(path, base, 1);
}
END_TEST

static Suite *gemma_suite(void)
{
	Suite *s = suite_create("gemma");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 3600);
	tcase_add_test(tc, test_gemma_fast_vs_llama);
	tcase_add_test(tc, test_gemma_exact_vs_llama);
	tcase_add_test(tc, test_gemma_window);
	tcase_add_test(tc, test_gemma_chat_tokens);
	tcase_add_test(tc, test_gemma_rerotation);
	tcase_add_test(tc, test_gemma_global_only);
	tcase_add_test(tc, test_gemma_kl_file);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int nf = check_run(gemma_suite());
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
