/*
 * rt_cmd_bench: `bench` — prefill and decode speed at several context lengths; the man page
 * is help_bench below.
 */
#include "cli/rt_cmd.h"

#include "base/rt_progress.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/rt_cli_cuda.h"
#include "cli/rt_cli_input.h"
#include "cli/rt_cli_opts.h"
#include "model/rt_dot.h"
#include "model/rt_model.h"

static const char *const help_bench =
	"NAME\n"
	"    {prog} bench - prefill and decode speed\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} bench --model MODEL [--ctx N,N,...] [--decode N] [--chunk N] [--threads N]\n"
	"             [--exact] [--kv-type f32|f16|q8_0] [--pp N] [--tg N] [--depth D,D,...]\n"
	"    {prog} bench --model MODEL --pp N | --tg N [--depth D,...] --policy NAME [--ratio R]\n"
	"             [--set NAME=VALUE]... [--prefill-chunk C]\n"
	"    {prog} bench ... --device cuda [--f16]\n"
	"\n"
	"DESCRIPTION\n"
	"    For each context length L: prefills L synthetic tokens (the first the file's BOS\n"
	"    when it adds one, as llama-bench does) into an empty full cache\n"
	"    (chunked, logits for the last token only) and reports prefill tokens/s; then\n"
	"    feeds --decode single tokens (each with its logits, as generation does) and\n"
	"    reports decode tokens/s at that depth. A benchmark, not a test: figures depend\n"
	"    on the machine and the thread count.\n"
	"    With --pp or --tg it runs llama-bench's tests instead and prints one line per\n"
	"    test, 'NAME TOKENS_PER_S': ppN prefills N tokens into an empty cache; tgN feeds\n"
	"    N single tokens after an untimed prefill of each --depth D (tgN, tgN@dD).\n"
	"    With --policy (one of the binary's, from `kvpc build`) those tests run under the\n"
	"    policy: the depth is the prompt (a ratio budget is D / R entries per head), its\n"
	"    untimed prefill uses chunked prefill (--prefill-chunk, default --chunk: a per-step\n"
	"    policy fed token by token would take minutes), and each timed step includes the\n"
	"    policy's work (observe, compress). A '#' line after each test gives the entries\n"
	"    per head at the end, the compressions and policy_seconds.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    --ctx LIST         comma-separated context lengths (default 128,1024,4096)\n"
	"    --decode N         decode steps after each prefill (default 32)\n"
	"    --chunk N          prefill chunk (default 512)\n"
	"    --threads N        threads (fast path: the pool; exact path: OpenBLAS)\n"
	"    --exact            the exact path (f32 weights, OpenBLAS); default: the fast path\n"
	"    --kv-type T        KV storage: f32, f16 (the fast path's default) or q8_0 (ggml's\n"
	"                       8-bit blocks); the exact path stores f32 and refuses the others\n"
	"    --pp N, --tg N     llama-bench's prompt and generation tests (0: off)\n"
	"    --depth LIST       cache depths for --tg (default 0)\n"
	"    --policy NAME, --ratio R, --set NAME=VALUE, --prefill-chunk C\n"
	"                       run --pp/--tg under a policy (default: the full cache)\n"
	"    --device cuda      every test on the GPU, in a binary built with `kvpc build\n"
	"                       --cuda` (docs/cuda.md): the exact path's f32 weights (--fast\n"
	"                       does not apply) and an f32 store on the device, the same\n"
	"                       sequences and timings; default --device cpu\n"
	"    --f16              with --device cuda: f16 copies of the weights\n"
	"    --quiet            no progress on stderr (a bar with tok/s and ETA on a terminal,\n"
	"                       a line per tenth of the work elsewhere)\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n";

/* cap token ids below n_vocab from a fixed LCG (the same ids every run), the first one
 * the file's BOS when it adds one (bos >= 0), as llama-bench starts its prompt; malloc'ed
 * (the caller frees them); NULL when out of memory. */
static int32_t *bench_tokens(int32_t cap, int n_vocab, int32_t bos)
{
	int32_t *tok = malloc((size_t)cap * sizeof *tok);
	unsigned sd = 12345u;
	for (int j = 0; tok && j < cap; j++) {
		sd = sd * 1103515245u + 12345u;
		tok[j] = (int32_t)((sd >> 8) % (unsigned)n_vocab);
	}
	if (tok && cap > 0 && bos >= 0)
		tok[0] = bos;
	return tok;
}

/* A sequence of m under policy p (rt_policy_full: the full cache) with a store of cap
 * entries per head, chunks of `chunk` tokens and prompt_len (-1: none), the options' policy
 * values applied, on the device of --device. 0, or -1 after printing the error. */
static int bench_seq(rt_seq *s, rt_model *m, const struct kvp_policy *p, const rt_cli_opts *o,
                     int32_t cap, int chunk, int64_t prompt_len)
{
	rt_err err = { "" };
	if (rt_seq_init(s, m, p, cap, chunk, prompt_len, &err) != 0 ||
	    (p != &rt_policy_full && rt_cli_seq_apply(s, o, &err) != 0) ||
	    rt_cli_device_attach(s, &err) != 0) {
		rt_cli_fail(&err);
		return -1;
	}
	return 0;
}

/* One llama-bench test on a fresh sequence under policy p (rt_policy_full: the full
 * cache): prefill `depth` tokens untimed (a policy's depth is its prompt, prefilled with
 * chunked prefill), then time either a prefill of n tokens (pp) or n single-token steps
 * (tg), the policy's hooks and compressions included. note: print the '#' line of the
 * policy's counters. Returns tokens/s, or -1 after printing the error. */
static double bench_policy(rt_model *m, int32_t bos, const struct kvp_policy *p,
                           const rt_cli_opts *o, int chunk, int depth, int n, int pp, int note)
{
	const int32_t cap = depth + n;
	rt_seq s = { 0 };
	rt_err err = { "" };
	int32_t *tok = bench_tokens(cap, m->hp.n_vocab, bos);
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
	double tps = -1.0;
	rt_cli_opts so = *o;
	if (!o->prefill_chunk)
		so.prefill_chunk = chunk;
	if (!tok || !logits) {
		fprintf(stderr, "%s: bench: out of memory for %d entries\n", rt_cli_prog, (int)cap);
		goto out;
	}
	if (bench_seq(&s, m, p, &so, cap, chunk, depth > 0 ? depth : -1) != 0)
		goto out;
	if (depth > 0 && rt_seq_feed(&s, tok, depth, NULL, RT_LOGITS_NONE, &err) != 0)
		goto fail;
	const rt_seq_stats st0 = rt_seq_stats_get(&s);
	double t0 = rt_now();
	if (pp) {
		if (rt_seq_feed(&s, tok + depth, n, logits, RT_LOGITS_LAST, &err) != 0)
			goto fail;
	} else {
		for (int j = 0; j < n; j++)
			if (rt_seq_feed(&s, tok + depth + j, 1, logits, RT_LOGITS_LAST, &err) != 0)
				goto fail;
	}
	tps = n / (rt_now() - t0);
	const rt_seq_stats st = rt_seq_stats_get(&s);
	if (note)
		printf("# policy %s ratio %g: %.1f entries per head at the end, %lld compressions in "
		       "the timed part, %.3f s of it in policy code\n", p->name, o->ratio,
		       rt_seq_mean_entries(&s), (long long)(st.compress_events - st0.compress_events),
		       st.policy_seconds - st0.policy_seconds);
	goto out;
fail:
	rt_cli_fail(&err);
out:
	rt_seq_free(&s);
	free(tok), free(logits);
	return tps;
}

static int bench_table(rt_model *m, int32_t bos, const rt_cli_opts *op, const double *ctxd,
                       int n_ctx);

/* bench --pp/--tg: llama-bench's tests, one line each; p: the policy (NULL: full cache) */
static int bench_llama(rt_model *m, int32_t bos, const rt_cli_opts *o, long pp, long tg,
                       const char *depths, const struct kvp_policy *p)
{
	double dd[RT_CLI_MAX_LIST];
	int nd = 0;
	if (rt_parse_list(depths, 0, INT_MAX, 1, dd, RT_CLI_MAX_LIST, &nd))
		return rt_cli_usage("bench", "--depth: '%s' is not a comma-separated list of token counts",
		                 depths);
	for (int i = 0; i < nd; i++)
		if ((long)dd[i] + (pp > tg ? pp : tg) > m->hp.n_ctx)
			return rt_cli_usage("bench", "--depth %ld plus the test exceeds the model's context_length %d",
			                 (long)dd[i], (int)m->hp.n_ctx);
	if (rt_cli_device_weights())
		printf("# kvrt on %s, %s weights, kv %s\n", o->device, rt_cli_device_weights(),
		       rt_kv_type_name(m->kv_type));
	else
		printf("# kvrt %s path, %d threads, isa %s, kv %s\n", m->exact ? "exact" : "fast",
		       m->exact ? openblas_get_num_threads() : rt_model_threads(m),
		       rt_dot_isa_name(rt_dot_isa_best()), rt_kv_type_name(m->kv_type));
	if (pp > 0) {
		const int c = (int)(o->chunk < pp ? o->chunk : pp);
		double t = bench_policy(m, bos, p ? p : &rt_policy_full, o, c, 0, (int)pp, 1, p != NULL);
		if (t < 0)
			return EXIT_FAILURE;
		printf("pp%ld %.2f\n", pp, t);
		fflush(stdout);
	}
	for (int i = 0; tg > 0 && i < nd; i++) {
		const int d = (int)dd[i];
		double t = bench_policy(m, bos, p ? p : &rt_policy_full, o, (int)o->chunk, d, (int)tg, 0,
		                        p != NULL);
		if (t < 0)
			return EXIT_FAILURE;
		if (d > 0)
			printf("tg%ld@d%d %.2f\n", tg, d, t);
		else
			printf("tg%ld %.2f\n", tg, t);
		fflush(stdout);
	}
	return 0;
}

int rt_cmd_bench(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', O_CTX, O_DECODE, O_CHUNK, O_THREADS, O_PP, O_TG, O_DEPTH,
		O_EXACT, O_FAST, O_QUIET, O_POLICY, O_RATIO, O_SET, O_PREFILL, O_KVTYPE, O_DEVICE, O_F16, 0 };
	rt_cli_opts o = { .ctx_list = "128,1024,4096", .decode = 32, .chunk = RT_CLI_CHUNK };
	int rc = rt_cli_parse("bench", help_bench, argc, argv, &o, opt_ids, 1);
	if (rc != RT_CLI_GO)
		return rc;
	double ctxd[RT_CLI_MAX_LIST];
	int n_ctx = 0;
	if (rt_parse_list(o.ctx_list, 1, INT_MAX, 1, ctxd, RT_CLI_MAX_LIST, &n_ctx))
		return rt_cli_usage("bench", "--ctx: '%s' is not a comma-separated list of token counts",
		                 o.ctx_list);
	const struct kvp_policy *p = NULL;
	if (o.policy || o.ratio > 0 || o.n_sets || o.prefill_chunk) {
		if (!(o.pp > 0 || o.tg > 0))
			return rt_cli_usage("bench", "%s", "--policy, --ratio, --set and --prefill-chunk "
			                    "go with --pp or --tg");
		if (!o.policy)
			return rt_cli_usage("bench", "%s", "--ratio, --set and --prefill-chunk need --policy");
		if (!(p = rt_cli_policy("bench", &o, &rc)))
			return rc;
	}
	if (rt_cli_on_device(&o))
		o.exact = 1; /* the GPU takes the exact path's weights */
	if ((rc = rt_cli_device_check("bench", &o)) != 0)
		return rc;
	rt_cli_threads(o.threads);
	rt_gguf *g = NULL;
	rt_model *m = NULL;
	if (rt_cli_open_model(o.model, &o, &g, NULL, &m) < 0) {
		rt_gguf_close(g);
		return EXIT_FAILURE;
	}
	rt_err terr = { "" }; /* a file without a tokenizer benches without BOS */
	rt_tokenizer *tk = rt_tokenizer_init(g, &terr);
	const int32_t bos = tk ? rt_tokenizer_bos(tk) : -1;
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	if ((rc = rt_cli_device_open("bench", &o, m)) == 0)
		rc = o.pp > 0 || o.tg > 0
		             ? bench_llama(m, bos, &o, o.pp, o.tg, o.depths ? o.depths : "0", p)
		             : bench_table(m, bos, &o, ctxd, n_ctx);
	rt_cli_device_close();
	rt_model_free(m);
	return rc;
}

/* The table: prefill and decode speed of the full cache at each of the n_ctx lengths
 * ctxd. Returns the exit status. */
static int bench_table(rt_model *m, int32_t bos, const rt_cli_opts *op, const double *ctxd,
                       int n_ctx)
{
	const rt_cli_opts o = *op;
	for (int i = 0; i < n_ctx; i++)
		if ((long)ctxd[i] + o.decode > m->hp.n_ctx) {
			fprintf(stderr,
			        "%s: %s: --ctx %ld plus %ld decode steps exceed the model's "
			        "context_length %d\n",
			        rt_cli_prog, o.model, (long)ctxd[i], o.decode, (int)m->hp.n_ctx);
			return RT_CLI_USAGE;
		}
	if (rt_cli_device_weights())
		printf("model %s: %d layers, %d/%d heads, vocab %d; on %s, %s weights, chunk %ld\n",
		       m->path, m->hp.n_layer, m->hp.n_head, m->hp.n_head_kv, m->hp.n_vocab, o.device,
		       rt_cli_device_weights(), o.chunk);
	else
		printf("model %s: %d layers, %d/%d heads, vocab %d; %s path, %d threads, chunk %ld\n",
		       m->path, m->hp.n_layer, m->hp.n_head, m->hp.n_head_kv, m->hp.n_vocab,
		       m->exact ? "exact" : "fast",
		       m->exact ? openblas_get_num_threads() : rt_model_threads(m), o.chunk);
	printf("%9s %15s %14s %11s %15s %10s\n", "context", "prefill tok/s", "decode tok/s",
	       "prefill s", "decode ms/tok", "KV MiB");
	int rc = 0;
	int64_t work = 0, done = 0;
	for (int i = 0; i < n_ctx; i++)
		work += (int64_t)ctxd[i] + o.decode;
	rt_progress prog;
	rt_progress_init(&prog, "bench", "tokens", work, o.quiet);
	for (int i = 0; i < n_ctx && rc == 0; i++) {
		const int L = (int)ctxd[i], D = (int)o.decode;
		rt_seq sq = { 0 };
		rt_err err = { "" };
		int32_t *tok = bench_tokens(L + D, m->hp.n_vocab, bos);
		float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
		rc = EXIT_FAILURE;
		if (!tok || !logits)
			fprintf(stderr, "%s: bench: out of memory at context %d\n", rt_cli_prog, L);
		if (!tok || !logits ||
		    bench_seq(&sq, m, &rt_policy_full, &o, L + D, (int)(o.chunk < L ? o.chunk : L), -1) != 0)
			goto next;
		double t0 = rt_now();
		int bad = rt_seq_feed(&sq, tok, L, logits, RT_LOGITS_LAST, &err);
		double t1 = rt_now();
		rt_progress_update(&prog, done += L);
		for (int j = 0; j < D && !bad; j++) {
			bad = rt_seq_feed(&sq, tok + L + j, 1, logits, RT_LOGITS_LAST, &err);
			rt_progress_update(&prog, ++done);
		}
		double t2 = rt_now();
		rt_progress_end(&prog);
		if (bad) {
			rt_cli_fail(&err);
			goto next;
		}
		printf("%9d %15.1f %14.1f %11.2f %15.2f %10.1f\n", L, L / (t1 - t0), D / (t2 - t1),
		       t1 - t0, 1000.0 * (t2 - t1) / D,
		       (double)rt_kv_bytes_used(&sq.kv) / (1024.0 * 1024.0));
		fflush(stdout);
		rc = 0;
next:
		rt_seq_free(&sq);
		free(tok), free(logits);
	}
	return rc;
}

