/*
 * rt_cli_cuda: the GPU side of the command line (rt_cli_cuda.h). ppl scores a text with
 * teacher forcing exactly as the CPU ppl does (NLL_i = logsumexp(logits_i) -
 * logits_i[t_{i+1}], rt_logprob of eval/rt_eval.h), with the policy's kernels on the
 * device; bench times prefill and decode of the full cache.
 */
#include "cli/rt_cli_cuda.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/rt_cuda.h"
#include "eval/rt_eval.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "policy/rt_pick.h"
#include "model/rt_tokenizer.h"

/* Defined by the CUDA registry unit of `kvpc build --cuda` binaries; absent elsewhere. */
extern const struct rt_cuda_backend kvp_cuda_backend __attribute__((weak));

int rt_cli_device_take(int argc, char **argv, const char **device)
{
	*device = "cpu";
	int w = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--device")) {
			if (i + 1 >= argc)
				return -1;
			*device = argv[++i];
		} else if (!strncmp(argv[i], "--device=", 9)) {
			*device = argv[i] + 9;
		} else {
			argv[w++] = argv[i];
		}
	}
	argv[w] = NULL;
	return w;
}

/* The CUDA unit compiled from the same source as p (rt_cuda_policy_find, which lives in
 * libkvrt_cuda; this file is linked into binaries without it too). */
static const struct kvp_cuda_policy *cuda_policy_of(const struct rt_cuda_backend *b,
                                                    const struct kvp_policy *p)
{
	for (int i = 0; i < b->n_policies; i++) {
		const struct kvp_cuda_policy *c = b->policies[i];
		if (c && (c->host == p || (!strcmp(c->name, p->name) && !strcmp(c->source_hash, p->source_hash))))
			return c;
	}
	return NULL;
}

static int fail(const char *prog, const char *cmd, const char *msg)
{
	fprintf(stderr, "%s: %s --device cuda: %s\n", prog, cmd, msg);
	return 1;
}

struct gopts {
	const char *model, *text, *policy;
	const char *sets[16];
	int n_sets;
	long ctx, chunk, decode;
	double ratio;
	int f16;
};

static int parse(const char *prog, const char *cmd, int argc, char **argv, struct gopts *o)
{
	static const struct option lo[] = {
		{ "model", required_argument, NULL, 'm' }, { "text", required_argument, NULL, 't' },
		{ "policy", required_argument, NULL, 'P' }, { "set", required_argument, NULL, 'S' },
		{ "ratio", required_argument, NULL, 'R' }, { "ctx", required_argument, NULL, 'c' },
		{ "chunk", required_argument, NULL, 'k' }, { "decode", required_argument, NULL, 'd' },
		{ "f16", no_argument, NULL, 'f' }, { NULL, 0, NULL, 0 },
	};
	optind = 1;
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, "m:t:", lo, NULL)) != -1) {
		char *end = NULL;
		errno = 0;
		switch (c) {
		case 'm': o->model = optarg; break;
		case 't': o->text = optarg; break;
		case 'P': o->policy = optarg; break;
		case 'f': o->f16 = 1; break;
		case 'S':
			if (o->n_sets == 16)
				return fprintf(stderr, "%s: %s: --set: more than 16 overrides\n", prog, cmd), 2;
			o->sets[o->n_sets++] = optarg;
			break;
		case 'R':
			o->ratio = strtod(optarg, &end);
			if (errno || end == optarg || *end || o->ratio == 0 ||
			    rt_pick_ratio_check(o->ratio, 0, NULL) != 0)
				return fprintf(stderr, "%s: %s: --ratio: '%s' is not a compression factor >= 1\n",
				               prog, cmd, optarg), 2;
			break;
		case 'c': case 'k': case 'd': {
			long v = strtol(optarg, &end, 10);
			long hi = c == 'k' ? 256 : INT_MAX;
			if (errno || end == optarg || *end || v < 1 || v > hi)
				return fprintf(stderr, "%s: %s: --%s: '%s' is not a number in 1..%ld\n", prog, cmd,
				               c == 'c' ? "ctx" : c == 'k' ? "chunk" : "decode", optarg, hi), 2;
			*(c == 'c' ? &o->ctx : c == 'k' ? &o->chunk : &o->decode) = v;
			break;
		}
		default:
			return fprintf(stderr, "%s: %s --device cuda: unknown option '%s' (the GPU takes --model, "
			               "--text, --policy, --set, --ratio, --ctx, --chunk, --decode, --f16)\n",
			               prog, cmd, argv[optind - 1]), 2;
		}
	}
	if (!o->model)
		return fprintf(stderr, "%s: %s: --model is required\n", prog, cmd), 2;
	if (!strcmp(cmd, "ppl") && !o->text)
		return fprintf(stderr, "%s: ppl: --text is required\n", prog), 2;
	return 0;
}

/* The text's tokens, at most max (0: all). */
static int32_t *tokens_of(const rt_tokenizer *tk, const char *path, long max, int64_t *n, rt_err *err)
{
	size_t len = 0;
	char *s = rt_read_file(path, &len, err);
	if (!s)
		return NULL;
	int64_t cnt = rt_tokenize_prompt(tk, s, len, 0, NULL, 0, err);
	int32_t *ids = cnt > 0 ? malloc((size_t)cnt * sizeof *ids) : NULL;
	if (!ids || rt_tokenize_prompt(tk, s, len, 0, ids, cnt, err) != cnt) {
		if (cnt >= 0 && !err->msg[0])
			rt_err_set(err, "%s: no tokens", path);
		free(ids);
		free(s);
		return NULL;
	}
	free(s);
	*n = max > 0 && cnt > max ? max : cnt;
	return ids;
}

/* The end of a device command: frees its sequence s (may be NULL), tokens and logits;
 * returns rc. */
static int gpu_end(const struct rt_cuda_backend *b, rt_cuda_seq *s, int32_t *tok, float *lg,
                   int rc)
{
	if (s)
		b->seq_free(s);
	free(tok);
	free(lg);
	return rc;
}

static int gpu_ppl(const char *prog, const struct rt_cuda_backend *b, const struct gopts *o,
                   const rt_model *m, const rt_tokenizer *tk, const rt_cuda_model *dm,
                   const struct kvp_policy *const *reg, int n_reg)
{
	rt_err err = { "" };
	const struct kvp_policy *p = NULL;
	const struct kvp_cuda_policy *cp = NULL;
	if (o->policy && strcmp(o->policy, "full") != 0) {
		p = rt_registry_find(reg, n_reg, o->policy);
		if (!p)
			return fprintf(stderr, "%s: ppl: --policy %s: no such policy in this binary\n", prog,
			               o->policy), 2;
		cp = cuda_policy_of(b, p);
		if (!cp)
			return fail(prog, "ppl", "the policy has no CUDA unit in this binary");
	}
	int64_t n = 0;
	int32_t *tok = tokens_of(tk, o->text, o->ctx, &n, &err);
	if (!tok)
		return fail(prog, "ppl", err.msg);
	if (n < 2) {
		free(tok);
		return fail(prog, "ppl", "the text has fewer than 2 tokens");
	}
	const size_t V = (size_t)m->hp.n_vocab;
	float *lg = malloc((size_t)n * V * sizeof *lg);
	rt_cuda_seq *s = lg ? b->seq_init(m, dm, cp, (int32_t)n, o->chunk ? (int)o->chunk : 64, n, &err) : NULL;
	int rc = 1;
	if (!s) {
		fail(prog, "ppl", lg ? err.msg : "out of memory for the logits");
		goto done;
	}
	for (int i = 0; i < o->n_sets; i++)
		if (b->seq_set(s, o->sets[i], &err) != 0) {
			fail(prog, "ppl", err.msg);
			goto done;
		}
	if (o->ratio > 0 && b->seq_set_ratio(s, o->ratio, &err) != 0) {
		fail(prog, "ppl", err.msg);
		goto done;
	}
	double t0 = rt_now();
	if (b->seq_feed(s, tok, n, lg, RT_LOGITS_ALL, &err) != 0) {
		fail(prog, "ppl", err.msg);
		goto done;
	}
	double dt = rt_now() - t0, nll = 0;
	for (int64_t i = 0; i + 1 < n; i++)
		nll -= rt_logprob(lg + (size_t)i * V, (int)V, tok[i + 1], NULL);
	printf("ppl %.4f over %lld scored tokens (policy %s, device cuda, %s weights, %.2f s, %.0f tok/s)\n",
	       exp(nll / (double)(n - 1)), (long long)(n - 1), p ? p->name : "full", o->f16 ? "f16" : "f32",
	       dt, (double)n / dt);
	rc = 0;
done:
	return gpu_end(b, s, tok, lg, rc);
}

static int gpu_bench(const char *prog, const struct rt_cuda_backend *b, const struct gopts *o,
                     const rt_model *m, const rt_cuda_model *dm)
{
	rt_err err = { "" };
	const long T = o->ctx ? o->ctx : 1024, D = o->decode ? o->decode : 64;
	if (T + D > m->hp.n_ctx)
		return fail(prog, "bench", "--ctx plus --decode exceed the model's context length");
	int32_t *tok = malloc((size_t)(T + D) * sizeof *tok);
	float *lg = malloc((size_t)m->hp.n_vocab * sizeof *lg);
	rt_cuda_seq *s = tok && lg ? b->seq_init(m, dm, NULL, (int32_t)(T + D), o->chunk ? (int)o->chunk : 256, T, &err) : NULL;
	int rc = 1;
	if (!s) {
		fail(prog, "bench", tok && lg ? err.msg : "out of memory");
		goto done;
	}
	for (long i = 0; i < T + D; i++)
		tok[i] = (int32_t)(1 + (i * 7919) % (m->hp.n_vocab - 1));
	double t0 = rt_now();
	if (b->seq_feed(s, tok, T, lg, RT_LOGITS_LAST, &err) != 0) {
		fail(prog, "bench", err.msg);
		goto done;
	}
	double t1 = rt_now();
	for (long i = 0; i < D; i++)
		if (b->seq_feed(s, tok + T + i, 1, lg, RT_LOGITS_LAST, &err) != 0) {
			fail(prog, "bench", err.msg);
			goto done;
		}
	double t2 = rt_now();
	printf("bench (device cuda, %s weights): prefill %ld tokens %.0f tok/s, decode %ld tokens %.1f tok/s\n",
	       o->f16 ? "f16" : "f32", T, T / (t1 - t0), D, D / (t2 - t1));
	rc = 0;
done:
	return gpu_end(b, s, tok, lg, rc);
}

int rt_cli_cuda_run(const char *prog, int argc, char **argv, const struct kvp_policy *const *reg,
                    int n_reg)
{
	const char *cmd = argv[0];
	const struct rt_cuda_backend *b = &kvp_cuda_backend;
	if (!b)
		return fail(prog, cmd, "this binary was built without CUDA (build one with kvpc build --cuda)");
	if (strcmp(cmd, "ppl") != 0 && strcmp(cmd, "bench") != 0)
		return fail(prog, cmd, "the GPU runs ppl and bench; this command runs on the CPU (drop --device)");
	rt_err err = { "" };
	char name[256];
	if (b->probe(name, sizeof name, NULL, &err) < 0)
		return fail(prog, cmd, err.msg);
	struct gopts o;
	memset(&o, 0, sizeof o);
	int rc = parse(prog, cmd, argc, argv, &o);
	if (rc)
		return rc;
	rt_gguf *g = rt_gguf_open(o.model, &err);
	const rt_model_opts mo = { .exact = 1, .threads = 0 };
	rt_model *m = g ? rt_model_load_opts(g, &mo, &err) : NULL;
	rt_tokenizer *tk = m ? rt_tokenizer_init(g, &err) : NULL;
	rt_cuda_model *dm = tk ? b->model_upload(m, o.f16 ? RT_CUDA_W_F16 : RT_CUDA_W_F32, &err) : NULL;
	if (!dm)
		rc = fail(prog, cmd, err.msg);
	else if (!strcmp(cmd, "ppl"))
		rc = gpu_ppl(prog, b, &o, m, tk, dm, reg, n_reg);
	else
		rc = gpu_bench(prog, b, &o, m, dm);
	if (dm)
		b->model_free(dm);
	if (tk)
		rt_tokenizer_free(tk);
	rt_model_free(m);
	if (g)
		rt_gguf_close(g);
	return rc;
}
