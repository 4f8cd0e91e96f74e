/*
 * test_random_models: kvrt's logits on small random-weight GGUF files of each architecture
 * the runtime reads (llama with and without Llama 3.x rope_freqs, a SentencePiece llama in
 * Q8_0, qwen2 with Q/K/V biases, qwen3 with per-head Q/K norms, gemma3 with post-norms and
 * sliding-window layers over a window of 16 inside a 128-token chunk), against llama.cpp's
 * on the same files. GQA 4/1 and 8/1, head_dim 32, 64, 128 and 256; F32, F16 and Q8_0
 * weights; real vocabularies (llama-bpe, llama-spm, qwen2).
 *
 * The files are written by scripts/models/make_random_gguf.py (`make random-models`, into
 * KVRT_RANDOM_DIR, default build/random-models: seeded, so the same bytes on every run).
 * Reference: tests/golden/model/random/NAME.txt, written by
 * scripts/reference/make_random_golden.py from the log-probabilities llama.cpp's
 * `llama-perplexity --kl-divergence-base` stores for one 128-token chunk of GPL-3 (f32 KV
 * cache): the tokens as llama.cpp ran them and, for each position of the second half, the
 * next token's log-probability and llama.cpp's 16 most probable tokens with theirs. Each
 * golden names the sha256 of the file it was made from; a file that differs (another
 * numpy or gguf package wrote other bytes) cannot be compared and is reported and
 * skipped, as is a missing file (python3 without numpy and gguf): the golden script
 * regenerates the goldens where llama.cpp is built (scripts/bench/build_llama.sh).
 *
 * A row the runtime does not support yet (none now) must be refused at load naming the file
 * and what is unsupported; it is compared once that row's refusal is NULL.
 * Asserted per file, on the fast path (the one users run) and the exact path: over the 63
 * scored positions, max |Δ log p| over the 16 + 1 tokens of each position (a next-token
 * value llama.cpp stored at its floor, max - 16, only has to stay under it), the mean KL
 * of llama.cpp's distribution coarsened to those 16 tokens and "the rest" against kvrt's,
 * and top-1 agreement. The bounds (table below) are about 3x the measured figures, above
 * llama.cpp's 16-bit storage step (range / 65535, up to 2.5e-4 nats here) and its own
 * rounding: F16 rows multiply f16-rounded activations, Q8_0 rows 8-bit ones.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/rt_cli_input.h"
#include "eval/rt_eval.h"
#include "kv/rt_kvbytes.h"
#include "model/rt_model.h"
#include "policy/rt_policy.h"
#include "policy/rt_seq.h"
#include "support/check_run.h"

#define GOLDEN_DIR "tests/golden/model/random"
#define TOPK_MAX 64

/* name, max |Δ log p| (nats), mean coarse KL (nats), least top-1 agreement, and for a file
 * the runtime refuses today, a piece of the refusal it must give (NULL: compared). Measured
 * (fast / exact path, the same to 2 digits; `make random-models && build/tests/
 * test_random_models`): F32 llama (also with rope_freqs), qwen2, qwen3 1.3e-4..1.8e-4 and KL 2e-10..6e-10 (llama.cpp's
 * storage step); gemma3 F32 3.0e-3, KL 4e-8 (llama.cpp's GELU goes through an f16 table);
 * gemma3 F16 4.7e-3, KL 1.7e-7 and qwen2 F16 0.022, KL 6e-6 (llama.cpp rounds the
 * activations to f16 for F16 rows); Q8_0 0.43, KL 5.5e-4, top-1 0.968 (8-bit activations in
 * llama.cpp, f32 in kvrt at this chunk size). */
#define RANDOM_MODELS(X)                                                        \
	X(llama_f32, 6e-4, 1e-8, 1.0, NULL)                                     \
	X(llama_rope_freqs, 6e-4, 1e-8, 1.0, NULL)                               \
	X(llama_spm_q8_0, 1.3, 2e-3, 0.9, NULL)                                 \
	X(qwen2_f32, 6e-4, 1e-8, 1.0, NULL)                                     \
	X(qwen2_f16, 0.07, 2e-5, 1.0, NULL)                                     \
	X(qwen3_f32, 6e-4, 1e-8, 1.0, NULL)                                     \
	X(gemma3_f32, 0.01, 2e-7, 1.0, NULL)                                    \
	X(gemma3_f16, 0.015, 5e-7, 1.0, NULL)

typedef struct bound {
	const char *name;
	double max_dlp, kl, top1;
	const char *refused; /* NULL, or what the refusal at load must say */
} bound;

static const bound bounds[] = {
#define ROW(n, d, k, t, r) { #n, d, k, t, r },
	RANDOM_MODELS(ROW)
#undef ROW
};

typedef struct golden {
	char sha[65];
	int n_ctx, first, topk;
	int32_t *tok;  /* [n_ctx] as llama.cpp ran them (BOS first where the file adds one) */
	int32_t *next; /* [rows] */
	double *lp, *floor; /* [rows] next token's log p, the row's floor */
	int32_t *top;  /* [rows × topk] */
	double *toplp; /* [rows × topk] */
} golden;

static void golden_free(golden *g)
{
	free(g->tok), free(g->next), free(g->lp), free(g->floor), free(g->top), free(g->toplp);
}

static void golden_load(const char *path, golden *g)
{
	memset(g, 0, sizeof *g);
	FILE *fp = fopen(path, "r");
	ck_assert_msg(fp != NULL, "%s: cannot open (run from the repository root)", path);
	static char line[1 << 16];
	int r = 0;
	while (fgets(line, sizeof line, fp)) {
		char nm[128];
		if (sscanf(line, "# model %127s sha256 %64s", nm, g->sha) == 2)
			continue;
		if (sscanf(line, "# n_ctx %d first %d topk %d", &g->n_ctx, &g->first, &g->topk) == 3) {
			ck_assert_msg(g->n_ctx > 2 && g->topk > 0 && g->topk <= TOPK_MAX, "%s: header", path);
			const int rows = g->n_ctx - 1 - g->first;
			g->tok = calloc((size_t)g->n_ctx, sizeof *g->tok);
			g->next = calloc((size_t)rows, sizeof *g->next);
			g->lp = calloc((size_t)rows, sizeof *g->lp);
			g->floor = calloc((size_t)rows, sizeof *g->floor);
			g->top = calloc((size_t)rows * g->topk, sizeof *g->top);
			g->toplp = calloc((size_t)rows * g->topk, sizeof *g->toplp);
			continue;
		}
		if (line[0] == '#')
			continue;
		ck_assert_msg(g->tok != NULL, "%s: rows before the '# n_ctx' header", path);
		char *p = line, *e;
		if (strncmp(line, "tokens", 6) == 0) {
			p += 6;
			for (int i = 0; i < g->n_ctx; i++, p = e) {
				g->tok[i] = (int32_t)strtol(p, &e, 10);
				ck_assert_msg(e != p, "%s: %d tokens, expected %d", path, i, g->n_ctx);
			}
			continue;
		}
		ck_assert_msg(r < g->n_ctx - 1 - g->first, "%s: too many rows", path);
		const long i = strtol(p, &e, 10);
		ck_assert_msg(e != p && i == g->first + r, "%s: row %d: position", path, r);
		g->next[r] = (int32_t)strtol(p = e, &e, 10);
		g->lp[r] = strtod(p = e, &e);
		g->floor[r] = strtod(p = e, &e);
		for (int k = 0; k < g->topk; k++) {
			g->top[(size_t)r * g->topk + k] = (int32_t)strtol(p = e, &e, 10);
			ck_assert_msg(e != p && *e == ':', "%s: row %d: pair %d", path, r, k);
			g->toplp[(size_t)r * g->topk + k] = strtod(p = e + 1, &e);
			ck_assert_msg(e != p, "%s: row %d: pair %d", path, r, k);
		}
		r++;
	}
	fclose(fp);
	ck_assert_msg(r == g->n_ctx - 1 - g->first, "%s: %d rows, expected %d", path, r,
	              g->n_ctx - 1 - g->first);
}

/* log-softmax of x[V] into lp (double) and the argmax */
static int log_softmax(const float *x, int V, double *lp)
{
	int am = 0;
	for (int v = 1; v < V; v++)
		if (x[v] > x[am])
			am = v;
	double s = 0.0;
	for (int v = 0; v < V; v++)
		s += exp((double)x[v] - x[am]);
	const double lse = x[am] + log(s);
	for (int v = 0; v < V; v++)
		lp[v] = x[v] - lse;
	return am;
}

typedef struct figures {
	double max_dlp, kl, top1;
} figures;

/* kvrt's full-cache logits on the golden's chunk, compared as the header says. */
static figures compare(const char *path, const golden *g, int exact)
{
	rt_err err = { "" };
	const rt_model_opts o = { .exact = exact, .threads = 2 };
	rt_model *m = rt_model_open(path, &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	const int V = m->hp.n_vocab, n = g->n_ctx, first = g->first, rows = n - 1 - first;
	float *lg = malloc((size_t)rows * V * sizeof *lg);
	double *lp = malloc((size_t)V * sizeof *lp);
	rt_kv kv;
	rt_fwd f;
	ck_assert_msg(rt_model_kv_init(m, &kv, n, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_fwd_init(&f, m, n, n, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_model_forward(&f, &kv, g->tok, first, 0, NULL, RT_LOGITS_NONE, &err) == 0,
	              "%s", err.msg);
	ck_assert_msg(rt_model_forward(&f, &kv, g->tok + first, rows, first, lg, RT_LOGITS_ALL,
	                               &err) == 0, "%s", err.msg);
	figures fg = { 0, 0, 0 };
	int same = 0;
	for (int r = 0; r < rows; r++) {
		const int am = log_softmax(lg + (size_t)r * V, V, lp);
		const int32_t *top = g->top + (size_t)r * g->topk;
		const double *tlp = g->toplp + (size_t)r * g->topk;
		ck_assert(g->next[r] >= 0 && g->next[r] < V);
		const double dn = lp[g->next[r]] - g->lp[r];
		fg.max_dlp = fmax(fg.max_dlp, g->lp[r] > g->floor[r] + 1e-6 ? fabs(dn) : fmax(dn, 0.0));
		double pl_rest = 1.0, pk_rest = 1.0, kl = 0.0;
		for (int k = 0; k < g->topk; k++) {
			ck_assert(top[k] >= 0 && top[k] < V);
			fg.max_dlp = fmax(fg.max_dlp, fabs(lp[top[k]] - tlp[k]));
			kl += exp(tlp[k]) * (tlp[k] - lp[top[k]]);
			pl_rest -= exp(tlp[k]);
			pk_rest -= exp(lp[top[k]]);
		}
		if (pl_rest > 1e-12)
			kl += pl_rest * log(pl_rest / fmax(pk_rest, 1e-300));
		fg.kl += kl / rows;
		same += am == top[0];
	}
	fg.top1 = (double)same / rows;
	free(lg), free(lp);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	rt_model_free(m);
	return fg;
}

static const char *random_dir(void)
{
	const char *d = getenv("KVRT_RANDOM_DIR");
	return d && *d ? d : "build/random-models";
}

START_TEST(test_random_vs_llama)
{
	const bound *b = &bounds[_i];
	char gp[512], mp[512], sha[65];
	snprintf(gp, sizeof gp, "%s/%s.txt", GOLDEN_DIR, b->name);
	snprintf(mp, sizeof mp, "%s/%s.gguf", random_dir(), b->name);
	if (access(mp, R_OK) != 0) {
		printf("test_random_models: %s absent (make random-models; needs python3 with numpy "
		       "and gguf): skipped\n", mp);
		return;
	}
	if (b->refused) { /* not supported yet: a clear refusal, not another model's logits */
		rt_err err = { "" };
		const rt_model_opts o = { .threads = 1 };
		rt_model *m = rt_model_open(mp, &o, &err);
		printf("test_random_models: %s refused: %s\n", b->name, err.msg);
		ck_assert_msg(m == NULL, "%s loads now: compare it (set its refusal to NULL)", mp);
		ck_assert_msg(strstr(err.msg, b->refused) && strstr(err.msg, mp), "%s", err.msg);
		return;
	}
	golden g;
	golden_load(gp, &g);
	rt_cli_file_sha256(mp, sha);
	if (strcmp(sha, g.sha) != 0) {
		printf("test_random_models: SKIPPED %s: sha256 %s, but %s was made from %s (another "
		       "numpy/gguf wrote other bytes; regenerate it with "
		       "scripts/reference/make_random_golden.py)\n", mp, sha, gp, g.sha);
		golden_free(&g);
		return;
	}
	for (int exact = 0; exact <= 1; exact++) {
		const figures fg = compare(mp, &g, exact);
		printf("test_random_models: %s (%s path): max |dlogp| %.3g (bound %g), mean KL %.3g "
		       "(bound %g), top-1 %.3f (bound %.2f)\n", b->name, exact ? "exact" : "fast",
		       fg.max_dlp, b->max_dlp, fg.kl, b->kl, fg.top1, b->top1);
		ck_assert_msg(fg.max_dlp <= b->max_dlp, "%s: max |dlogp| %g > %g", b->name, fg.max_dlp,
		              b->max_dlp);
		ck_assert_msg(fg.kl <= b->kl, "%s: mean KL %g > %g", b->name, fg.kl, b->kl);
		ck_assert_msg(fg.top1 >= b->top1, "%s: top-1 %g < %g", b->name, fg.top1, b->top1);
	}
	golden_free(&g);
}
END_TEST

/* Positions of every (layer, KV head) list distinct and inside [0, n) (a list is in
 * position order only up to rt_kv_head_evict's moves, runtime/kv/rt_kv.h), a
 * sliding-window layer's inside its window of the last position; the entries held. */
static int64_t check_kept(const rt_model *m, rt_kv *kv, int32_t n, const char *what,
                          int window_strict, int64_t *outside)
{
	int64_t held = 0;
	uint8_t *seen = malloc((size_t)n);
	for (int l = 0; l < m->hp.n_layer; l++)
		for (int h = 0; h < m->hp.n_head_kv; h++) {
			const rt_kv_head *kh = rt_kv_head_at(kv, l, h);
			const int32_t w = m->layers[l].window;
			memset(seen, 0, (size_t)n);
			for (int i = 0; i < kh->n; i++) {
				const int32_t p = kh->pos[i];
				ck_assert_msg(p >= 0 && p < n && !seen[p], "%s: layer %d head %d entry %d "
				              "at position %d (again or outside 0..%d)", what, l, h, i, p, n - 1);
				seen[p] = 1;
				ck_assert_msg(!window_strict || !w || p > n - 1 - w, "%s: layer %d (window "
				              "%d) holds position %d of %d", what, l, w, p, n);
				*outside += w && p <= n - 1 - w;
			}
			held += kh->n;
		}
	free(seen);
	return held;
}

/* Every library policy (kvp_registry) on each random-weight file: 128 tokens fed in blocks
 * of 16 beside the full cache (rt_eval_runs, as `ppl --batch` does), at ratio 4 where the
 * policy takes one and a prompt of 64 for the prompt-end ones, scoring the last 16. Under
 * KVRT_SANITIZED only the files of a 32000-token vocabulary run (the others' output rows
 * cost minutes there). Each run must finish or be
 * refused with a message (a budget its guards exceed); what it keeps must be positions of
 * the text, once each, inside the window on sliding-window layers; the log-probabilities are
 * finite; at least half hold fewer entries or bytes than the full cache, and all finish but 2 and
 * those the model itself rules out (model_refuses: a linear scorer trained for another
 * shape), each refused at
 * rt_seq_init with its reason. Budgets are graceful (a floor of 16, run's --min-kv): guards
 * that exceed a budget raise it. Measured (36 policies): 35 finish on every file, Gemma 3's
 * windows included (kvzap's SmolLM2 scorer is refused), 20 of them holding fewer entries or bytes. */
static int model_refuses(const rt_model *m, const struct kvp_policy *p)
{
	const int *w = p->hidden_shape;
	return (p->needs & KVP_NEED_HIDDEN) &&
	       (w[0] != m->hp.n_layer || w[1] != m->hp.n_head_kv || w[2] != m->hp.n_embd);
}

START_TEST(test_random_policies)
{
	const bound *b = &bounds[_i];
	char gp[512], mp[512];
	snprintf(gp, sizeof gp, "%s/%s.txt", GOLDEN_DIR, b->name);
	snprintf(mp, sizeof mp, "%s/%s.gguf", random_dir(), b->name);
	if (b->refused || access(mp, R_OK) != 0)
		return; /* test_random_vs_llama says why */
	golden g;
	golden_load(gp, &g);
	rt_err err = { "" };
	const rt_model_opts o = { .threads = 2 };
	rt_model *m = rt_model_open(mp, &o, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	if (getenv("KVRT_SANITIZED") && m->hp.n_vocab > 32000) {
		printf("test_random_models: %s: policies skipped under the sanitizers\n", b->name);
		rt_model_free(m);
		golden_free(&g);
		return;
	}
	const int K = kvp_registry_count, n = g.n_ctx;
	rt_seq *seq = calloc((size_t)K + 1, sizeof *seq);
	rt_seq **runs = calloc((size_t)K, sizeof *runs);
	rt_eval_score *sc = calloc((size_t)K, sizeof *sc);
	int k_ok = 0, ruled_out = 0;
	for (int k = 0; k < K; k++) {
		const struct kvp_policy *p = kvp_registry[k];
		if (rt_seq_init(&seq[k_ok], m, p, n, 16, n / 2, &err) < 0) {
			printf("test_random_models: %s: %s refused: %s\n", b->name, p->name, err.msg);
			ck_assert(err.msg[0] != 0);
			ruled_out += model_refuses(m, p);
			continue;
		}
		ck_assert_msg(!model_refuses(m, p), "%s: %s was not refused", b->name, p->name);
		rt_err e2 = { "" };
		(void)rt_seq_set_ratio(&seq[k_ok], 4.0, &e2); /* policies without a budget refuse it */
		seq[k_ok].run.ctx.min_kv = 16; /* graceful budgets (run's --min-kv): guards raise it */
		runs[k_ok] = &seq[k_ok];
		rt_eval_score_init(&sc[k_ok]);
		k_ok++;
	}
	ck_assert_msg(rt_seq_init(&seq[K], m, &rt_policy_full, n, 16, n / 2, &err) == 0, "%s",
	              err.msg);
	const rt_eval_loop lo = { .block = 16, .score_from = n - 16 };
	double ref_nll = 0;
	ck_assert_msg(rt_eval_runs(runs, k_ok, &seq[K], g.tok, n, &lo, sc, &ref_nll, &err) == 0,
	              "%s: %s", b->name, err.msg);
	int64_t outside = 0;
	const int64_t full = check_kept(m, &seq[K].kv, n, "full", 1, &outside);
	int finished = 0, evicting = 0;
	for (int k = 0; k < k_ok; k++) {
		const char *pn = runs[k]->p->name;
		if (sc[k].error[0]) {
			printf("test_random_models: %s: %s stopped at %lld: %s\n", b->name, pn,
			       (long long)sc[k].failed_at, sc[k].error);
			continue;
		}
		ck_assert_msg(isfinite(sc[k].nll) && sc[k].scored == 16, "%s: %s: nll %g over %lld",
		              b->name, pn, sc[k].nll, (long long)sc[k].scored);
		/* every policy, `positions compacted` included, holds nothing the window hides */
		const int64_t held = check_kept(m, &runs[k]->kv, n, pn, 1, &outside);
		finished++;
		/* fewer entries, or fewer bytes (a tiered policy may keep every entry at lower
		 * precision: under the floor of 64 entries at the top tier an f32 store's 128
		 * tokens are bought whole at q8/q4) */
		evicting += held < full || rt_kvbytes_held(&runs[k]->kv) < rt_kvbytes_held(&seq[K].kv);
	}
	printf("test_random_models: %s: %d of %d library policies finished (%d hold fewer entries "
	       "than the full cache's %lld, or fewer bytes), full-cache ppl %.1f\n", b->name, finished, K,
	       evicting, (long long)full, exp(ref_nll / 16));
	ck_assert_msg(finished >= K - ruled_out - 2 && evicting >= K / 2,
	              "%s: %d finished (%d ruled out by the model), %d evicting", b->name, finished,
	              ruled_out, evicting);
	for (int k = 0; k <= K; k++)
		if (k == K || k < k_ok)
			rt_seq_free(&seq[k]);
	for (int k = 0; k < k_ok; k++)
		rt_eval_score_free(&sc[k]);
	free(seq), free(runs), free(sc);
	rt_model_free(m);
	golden_free(&g);
}
END_TEST

static Suite *random_suite(void)
{
	Suite *s = suite_create("random_models");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, test_random_vs_llama, 0, (int)(sizeof bounds / sizeof bounds[0]));
	tcase_add_loop_test(tc, test_random_policies, 0, (int)(sizeof bounds / sizeof bounds[0]));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int nf = check_run(random_suite());
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
