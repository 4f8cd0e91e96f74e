/*
 * make_d_real: writes tests/golden/stats/d_real.txt, real per-token NLL differences with
 * the autocorrelation the block bootstrap is for. Not part of the build (only
 * tests/test_*.c are); run by hand from the repository root:
 *
 *   make build/libkvrt.a
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iruntime tests/golden/stats/make_d_real.c build/libkvrt.a \
 *      $(pkg-config --libs openblas libpcre2-8 zlib) -lm -lpthread -o /tmp/make_d_real
 *   /tmp/make_d_real models/SmolLM2-135M-Instruct.Q4_1.gguf > tests/golden/stats/d_real.txt
 *
 * What it measures: SmolLM2-135M-Instruct reads 1024 tokens of coreutils.info starting at
 * "Node: Introduction" in chunks of 16 under two hand-written eviction rules with a budget
 * of 128 entries per head (8x compression): A keeps the most recent entries, B keeps the
 * first 4 (attention sinks, StreamingLLM) plus the most recent. Before each chunk every
 * head is cut to 128 - 16 entries. Output: d_i = nll_B,i - nll_A,i for the 1023 scored
 * tokens, one per line (%.17g). Also prints to stderr the lag-k autocorrelations of d and
 * the bootstrap interval width against the block length.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/rt_eval.h"
#include "kv/rt_kv.h"
#include "model/rt_model.h"
#include "base/rt_text.h"
#include "eval/rt_needle.h"
#include "eval/rt_stats.h"
#include "model/rt_tokenizer.h"

enum { N = 1024, CHUNK = 16, BUDGET = 128, SINKS = 4 };

static void evict(rt_kv *kv, int32_t keep_n, int sinks, int32_t *idx)
{
	for (int h = 0; h < kv->n_layer * kv->n_kv_head; h++) {
		rt_kv_head *hd = &kv->heads[h];
		if (hd->n <= keep_n)
			continue;
		int k = 0;
		for (int i = 0; i < sinks && i < keep_n; i++)
			idx[k++] = i;
		for (int32_t i = hd->n - (keep_n - k); i < hd->n; i++)
			idx[k++] = i;
		rt_kv_head_keep(kv, hd, idx, k);
	}
}

static int run(const rt_model *m, const int32_t *tok, int sinks, double *nll, rt_err *err)
{
	rt_fwd f;
	rt_kv kv;
	if (rt_fwd_init(&f, m, CHUNK, BUDGET, err) || rt_model_kv_init(m, &kv, BUDGET, err))
		return -1;
	int V = m->hp.n_vocab;
	float *lg = malloc((size_t)CHUNK * V * sizeof(float));
	int32_t idx[BUDGET];
	int64_t ns = 0;
	for (int pos = 0; pos < N; pos += CHUNK) {
		evict(&kv, BUDGET - CHUNK, sinks, idx);
		if (rt_model_forward(&f, &kv, tok + pos, CHUNK, pos, lg, RT_LOGITS_ALL, err))
			return -1;
		for (int i = 0; i < CHUNK && pos + i + 1 < N; i++) {
			int32_t top;
			nll[ns++] = -rt_logprob(lg + (size_t)i * V, V, tok[pos + i + 1], &top);
		}
	}
	free(lg);
	rt_kv_free(&kv);
	rt_fwd_free(&f);
	return 0;
}

int main(int argc, char **argv)
{
	rt_model_blas_setup(argv);
	if (argc != 2) {
		fprintf(stderr, "usage: make_d_real MODEL.gguf > d_real.txt\n");
		return 2;
	}
	rt_err err = {0};
	rt_gguf *g = rt_gguf_open(argv[1], &err);
	rt_tokenizer *t = g ? rt_tokenizer_init(g, &err) : NULL;
	const rt_model_opts mo = { .exact = 1, .threads = 0 }; /* the exact path, as measured */
	rt_model *m = t ? rt_model_load_opts(g, &mo, &err) : NULL;
	size_t len = 0;
	char *txt = m ? rt_text_read("/usr/share/info/coreutils.info.gz", &len, &err) : NULL;
	if (!txt) {
		fprintf(stderr, "make_d_real: %s\n", err.msg);
		return 1;
	}
	const char *st = strstr(txt, "Node: Introduction");
	int32_t *tok = malloc(sizeof(int32_t) * 20000);
	if (!st || rt_tokenize(t, st, 60000, 0, tok, 20000, &err) < N) {
		fprintf(stderr, "make_d_real: text too short\n");
		return 1;
	}
	double *a = malloc(sizeof(double) * N), *b = malloc(sizeof(double) * N);
	if (run(m, tok, 0, a, &err) || run(m, tok, SINKS, b, &err)) {
		fprintf(stderr, "make_d_real: %s\n", err.msg);
		return 1;
	}
	int64_t n = N - 1;
	double *d = malloc(sizeof(double) * n), mu = 0, c0 = 0;
	for (int64_t i = 0; i < n; i++) {
		d[i] = b[i] - a[i];
		mu += d[i];
		printf("%.17g\n", d[i]);
	}
	mu /= n;
	for (int64_t i = 0; i < n; i++)
		c0 += (d[i] - mu) * (d[i] - mu);
	for (int lag = 1; lag <= 64; lag *= 2) {
		double c = 0;
		for (int64_t i = lag; i < n; i++)
			c += (d[i] - mu) * (d[i - lag] - mu);
		fprintf(stderr, "acf lag %d: %.3f\n", lag, c / c0);
	}
	const int64_t Ls[] = {1, 4, 10, 16, 32, 64, 128};
	for (int k = 0; k < 7; k++) {
		rt_boot_ci ci;
		rt_bootstrap_mean_ci(d, n, 2000, Ls[k], 0.95, 1, NULL, &ci, &err);
		fprintf(stderr, "L=%lld: mean %+.4f, 95%% CI [%+.4f, %+.4f], width %.4f\n",
		        (long long)Ls[k], ci.mean, ci.lo, ci.hi, ci.hi - ci.lo);
	}
	fprintf(stderr, "Politis-White block length: %lld\n",
	        (long long)rt_bootstrap_block_len_auto(d, n));
	return 0;
}
