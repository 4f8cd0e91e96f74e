/*
 * test_real_model: exactness of the runtime on the real model (SmolLM2-135M-Instruct
 * Q4_1, path in env KVRT_MODEL, default models/SmolLM2-135M-Instruct.Q4_1.gguf) against
 * the golden file tests/golden/model/gpl3_2048.txt written by
 * scripts/reference/make_model_golden.py. The golden holds, for the first 2048 tokens of
 * /usr/share/common-licenses/GPL-3 (stored ids: the test does not re-tokenize), the
 * next-token log-probability and argmax of two independent implementations:
 *   ref    scripts/reference/ref_forward.py, a float32 numpy forward from the GGUF spec;
 *   llama  llama.cpp (llama-cpp-python), which computes with its own quantised kernels
 *          (Q8_1-quantised activations against Q4_1 weights), so it is only close.
 * Asserted: max |logprob - ref| <= 1e-3 over all positions, argmax == ref's everywhere,
 * ppl within 0.1% of the ref's; and agreement with llama.cpp above a floor set a little
 * below what was measured. With KVRT_SANITIZED=1 only the first 256 positions are run.
 * A second test checks the decode path (prefill, then one token per call) the same way.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/rt_eval.h"
#include "model/rt_model.h"
#include "support/check_run.h"

/* the exact path: these tests compare against f32 references */
static const rt_model_opts exact_opts = { .exact = 1, .threads = 0 };

#define GOLDEN "tests/golden/model/gpl3_2048.txt"

typedef struct golden {
	int n;                 /* tokens (rows + 1) */
	int32_t *tok;          /* [n] */
	float *ref_lp, *llama_lp;        /* [n - 1] */
	int32_t *ref_top1, *llama_top1;  /* [n - 1] */
	double ppl_ref, ppl_llama;
} golden;

static void golden_load(golden *g)
{
	memset(g, 0, sizeof *g);
	FILE *f = fopen(GOLDEN, "r");
	ck_assert_msg(f != NULL, "%s: cannot open (run from the repository root)", GOLDEN);
	char line[512];
	int cap = 0, rows = 0, declared = -1;
	while (fgets(line, sizeof line, f)) {
		if (line[0] == '#') {
			sscanf(line, "# ppl_ref %lf", &g->ppl_ref);
			sscanf(line, "# ppl_llama %lf", &g->ppl_llama);
			sscanf(line, "# tokens %d", &declared);
			continue;
		}
		int i, t, nt, rt1, lt1;
		float rl, ll;
		ck_assert_msg(sscanf(line, "%d %d %d %f %d %f %d", &i, &t, &nt, &rl, &rt1, &ll, &lt1) == 7,
		              "%s:%d: malformed line", GOLDEN, rows + 1);
		ck_assert_int_eq(i, rows);
		if (rows + 2 > cap) {
			cap = cap ? 2 * cap : 1024;
			g->tok = realloc(g->tok, (size_t)cap * sizeof *g->tok);
			g->ref_lp = realloc(g->ref_lp, (size_t)cap * sizeof *g->ref_lp);
			g->llama_lp = realloc(g->llama_lp, (size_t)cap * sizeof *g->llama_lp);
			g->ref_top1 = realloc(g->ref_top1, (size_t)cap * sizeof *g->ref_top1);
			g->llama_top1 = realloc(g->llama_top1, (size_t)cap * sizeof *g->llama_top1);
		}
		if (rows > 0)
			ck_assert_msg(g->tok[rows] == t, "%s: row %d token %d != previous next_token", GOLDEN,
			              rows, t);
		g->tok[rows] = t;
		g->tok[rows + 1] = nt;
		g->ref_lp[rows] = rl, g->ref_top1[rows] = rt1;
		g->llama_lp[rows] = ll, g->llama_top1[rows] = lt1;
		rows++;
	}
	fclose(f);
	g->n = rows + 1;
	ck_assert_int_eq(g->n, declared);
	ck_assert(g->ppl_ref > 1.0 && g->ppl_llama > 1.0);
}

static void golden_free(golden *g)
{
	free(g->tok), free(g->ref_lp), free(g->llama_lp), free(g->ref_top1), free(g->llama_top1);
}

static const char *model_path(void)
{
	const char *p = getenv("KVRT_MODEL");
	return p && *p ? p : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

START_TEST(test_matches_reference)
{
	golden g;
	golden_load(&g);
	const char *san = getenv("KVRT_SANITIZED");
	int n = san && !strcmp(san, "1") ? 256 : g.n;
	rt_err err = {0};
	rt_model *m = rt_model_open(model_path(), &exact_opts, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	ck_assert_int_eq(m->hp.n_layer, 30);
	ck_assert_int_eq(m->hp.n_head, 9);
	ck_assert_int_eq(m->hp.n_head_kv, 3);
	ck_assert_int_eq(m->hp.head_dim, 64);
	ck_assert_int_eq(m->hp.n_vocab, 49152);
	ck_assert_int_eq(m->tied_output, 1);

	float *lp = malloc((size_t)(n - 1) * sizeof *lp);
	int32_t *top1 = malloc((size_t)(n - 1) * sizeof *top1);
	rt_ppl_opts o = { .chunk = 256 };
	rt_ppl_result r;
	ck_assert_msg(rt_eval_ppl(m, g.tok, n, &o, lp, top1, &r, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(r.scored, n - 1);

	double maxd = 0, nll_ref = 0, nll_llama = 0, maxd_llama = 0, sumd_llama = 0;
	int worst = 0, top1_bad = 0, first_bad = -1, agree_llama = 0;
	for (int i = 0; i < n - 1; i++) {
		double d = fabs((double)lp[i] - g.ref_lp[i]);
		if (d > maxd)
			maxd = d, worst = i;
		if (top1[i] != g.ref_top1[i] && top1_bad++ == 0)
			first_bad = i;
		agree_llama += top1[i] == g.llama_top1[i];
		maxd_llama = fmax(maxd_llama, fabs((double)lp[i] - g.llama_lp[i]));
		sumd_llama += fabs((double)lp[i] - g.llama_lp[i]);
		nll_ref -= g.ref_lp[i];
		nll_llama -= g.llama_lp[i];
	}
	double ppl_ref = n == g.n ? g.ppl_ref : exp(nll_ref / (n - 1));
	double agree = (double)agree_llama / (n - 1);
	fprintf(stderr,
	        "real model, %d tokens: ppl %.6f (ref %.6f, llama.cpp %.6f); max |dlogprob| vs ref %.3g "
	        "(pos %d), vs llama.cpp %.3g (mean %.4f); top1 mismatches vs ref %d, top1 agreement with "
	        "llama.cpp %.4f; %.1f tokens/s\n",
	        n, r.ppl, ppl_ref, n == g.n ? g.ppl_llama : exp(nll_llama / (n - 1)), maxd, worst + 1,
	        maxd_llama, sumd_llama / (n - 1), top1_bad, agree, r.tokens_per_s);
	ck_assert_msg(maxd <= 1e-3, "max |logprob - ref| = %g at position %d", maxd, worst + 1);
	ck_assert_msg(top1_bad == 0,
	              "%d top-1 mismatches with the reference, first at position %d (%d vs %d)",
	              top1_bad, first_bad + 1, first_bad >= 0 ? top1[first_bad] : 0,
	              first_bad >= 0 ? g.ref_top1[first_bad] : 0);
	ck_assert_msg(fabs(r.ppl - ppl_ref) <= 1e-3 * ppl_ref, "ppl %.6f vs reference %.6f", r.ppl,
	              ppl_ref);
	/* llama.cpp quantises activations to Q8_1 before its Q4_1 dot products, so it is
	 * close but not exact. Measured over 2048 tokens: top-1 agreement 0.9619, max
	 * |dlogprob| 0.454, ppl 19.7155 vs llama.cpp's 19.7401. The floor leaves room for
	 * BLAS/rounding differences and for the 256-token sanitized run (measured 0.9569). */
	ck_assert_msg(agree >= 0.94, "top-1 agreement with llama.cpp %.4f < 0.94", agree);
	/* measured (docs/exactness.md): mean |dlogprob| 0.0586, ppl +0.12% */
	double ppl_llama = n == g.n ? g.ppl_llama : exp(nll_llama / (n - 1));
	ck_assert_msg(sumd_llama / (n - 1) <= 0.1, "mean |logprob - llama.cpp| %.4f > 0.1",
	              sumd_llama / (n - 1));
	ck_assert_msg(fabs(r.ppl - ppl_llama) <= 0.01 * ppl_llama, "ppl %.4f vs llama.cpp %.4f (> 1%%)",
	              r.ppl, ppl_llama);
	free(lp), free(top1);
	rt_model_free(m);
	golden_free(&g);
}
END_TEST

/* The decode path (single-token forward calls, matrix-vector products, last-row logits)
 * after a prefill in uneven chunks agrees with the reference too. */
START_TEST(test_decode_matches_reference)
{
	golden g;
	golden_load(&g);
	enum { PRE = 61, DEC = 24 };
	ck_assert_int_ge(g.n, PRE + DEC + 1);
	rt_err err = {0};
	rt_model *m = rt_model_open(model_path(), &exact_opts, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	rt_kv kv;
	rt_fwd f;
	ck_assert_int_eq(rt_model_kv_init(m, &kv, PRE + DEC, &err), 0);
	ck_assert_int_eq(rt_fwd_init(&f, m, 13, PRE + DEC, &err), 0);
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
	ck_assert_msg(rt_model_forward(&f, &kv, g.tok, PRE, 0, logits, RT_LOGITS_LAST, &err) == 0, "%s",
	              err.msg);
	double maxd = 0;
	for (int i = PRE - 1; i < PRE + DEC - 1; i++) {
		if (i > PRE - 1)
			ck_assert_msg(rt_model_forward(&f, &kv, g.tok + i, 1, i, logits, RT_LOGITS_LAST, &err) == 0,
			              "%s", err.msg);
		int32_t top1;
		double lp = rt_logprob(logits, m->hp.n_vocab, g.tok[i + 1], &top1);
		maxd = fmax(maxd, fabs(lp - g.ref_lp[i]));
		ck_assert_int_eq(top1, g.ref_top1[i]);
	}
	ck_assert_msg(maxd <= 1e-3, "decode: max |logprob - ref| = %g", maxd);
	free(logits);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	rt_model_free(m);
	golden_free(&g);
}
END_TEST

int main(int argc, char **argv)
{
	(void)argc;
	rt_model_blas_setup(argv); /* fast BLAS kernels on CPUs OpenBLAS does not recognise */
	Suite *s = suite_create("real_model");
	TCase *tc = tcase_create("gpl3");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_matches_reference);
	tcase_add_test(tc, test_decode_matches_reference);
	suite_add_tcase(s, tc);
	int failed = check_run(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
