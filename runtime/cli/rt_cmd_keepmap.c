/*
 * rt_cmd_keepmap: `keepmap` — an SVG of what a policy keeps per layer and KV head; the man
 * page is help_keepmap below.
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

#include "cli/rt_cli_input.h"
#include "cli/rt_cli_opts.h"
#include "base/rt_outpath.h"
#include "report/rt_keepmap.h"

static const char *const help_keepmap =
	"NAME\n"
	"    {prog} keepmap - draw which positions a KV-cache policy keeps, per layer and KV head\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} keepmap --model MODEL --text FILE [--ctx N] [--policy NAME]\n"
	"             [--set NAME=VALUE]... [--ratio R | --byte-ratio R] [--prompt N] [--chunk N]\n"
	"             [--threads N] [--svg OUT] [--dump-scores FILE] [--dump-hidden FILE]\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes FILE, feeds its first N tokens through the model under the policy\n"
	"    (the N tokens are the prompt, as for ppl, so prompt-end triggers fire after the\n"
	"    last one), then writes OUT, an SVG grid with one row per (layer, KV head), rows\n"
	"    grouped by layer and labelled \"L0 H0\", ..., and x = token position 0..N-1\n"
	"    (bins of ceil(N / 1000) positions when N > 1000). A cell is blue where the head\n"
	"    keeps the position, hatched orange where it holds a merged prototype (an entry\n"
	"    standing for more than one token, drawn at its position), grey where the\n"
	"    position was evicted; each row ends with its kept-entry count. The title gives\n"
	"    the policy, its parameters, the ratio, N and the kept entries per head.\n"
	"    Prints one line: entries kept in all heads, mean / min / max per head, merged.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL   GGUF model file\n"
	"    -t, --text FILE     the text; must be valid UTF-8\n"
	"    --ctx N             feed the first N tokens (default: the whole text, up to the\n"
	"                        model's context_length)\n"
	"    --policy NAME       policy (default {policy}); --set, --ratio, --byte-ratio as for ppl\n"
	"    --prompt N          the prompt length given to the policy (default: N; at\n"
	"                        most N)\n"
	"    --svg OUT           the SVG file to write\n"
	"    --dump-scores FILE  write the context replay's scores (a policy reading replay_attn,\n"
	"                        e.g. kvzip) as a NumPy .npy file: float32 [n_layer, n_kv_head,\n"
	"                        P], P the prompt length; [l, g, i] is the largest attention\n"
	"                        prompt position i received from the query heads of KV head g\n"
	"                        of layer l during the replay, before the policy compressed\n"
	"    --dump-hidden FILE  write each layer's attention input for the prompt as a NumPy\n"
	"                        .npy file: float32 [n_layer, P, n_embd], [l, i] = RMSNorm of\n"
	"                        the residual stream entering layer l at position i times the\n"
	"                        layer's attn_norm weight (what its K, V and Q projections read)\n"
	"                        At least one of --svg, --dump-scores, --dump-hidden is needed.\n"
	"    --chunk N, --threads N, --fast, --quiet, -h/--help  as for ppl\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n"
	"\n"
	"EXAMPLE\n"
	"    {prog} keepmap --model models/SmolLM2-135M-Instruct.Q4_1.gguf --text t.txt \\\n"
	"           --ctx 512 --policy h2o --ratio 4 --svg h2o.svg\n"
	"    {prog} keepmap --model M --text t.txt --ctx 1024 --policy kvzip \\\n"
	"           --dump-scores kvzip.npy --dump-hidden hidden.npy\n";

/* Feed the tokens in blocks of `block` (the chunk bound), with progress. */
static int keepmap_feed(rt_seq *s, const int32_t *ids, int64_t n, int block, int quiet,
                        rt_err *err)
{
	rt_progress prog;
	rt_progress_init(&prog, "keepmap", "tokens", n, quiet);
	int rc = 0;
	for (int64_t off = 0; off < n && rc == 0; off += block) {
		int64_t c = n - off < block ? n - off : block;
		rc = rt_seq_feed(s, ids + off, c, NULL, RT_LOGITS_NONE, err);
		rt_progress_update(&prog, off + c);
	}
	rt_progress_end(&prog);
	return rc;
}

/* A NumPy .npy file (format 1.0: magic, header length, a dict padded to 64 bytes, then
 * the little-endian float32 data in C order) of shape dims[0..nd) from data. */
static int npy_write(const char *path, const float *data, const int64_t *dims, int nd,
                     rt_err *err)
{
	char dict[256];
	int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
	size_t count = 1;
	for (int i = 0; i < nd; i++) {
		n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld, ", (long long)dims[i]);
		count *= (size_t)dims[i];
	}
	n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
	const size_t head = ((10 + (size_t)n + 1 + 63) / 64) * 64, bytes = count * sizeof(float);
	char *buf = malloc(head + bytes);
	if (!buf)
		return rt_err_set(err, "%s: out of memory for %zu bytes", path, head + bytes);
	memcpy(buf, "\x93NUMPY\x01\x00", 8);
	buf[8] = (char)((head - 10) & 0xff);
	buf[9] = (char)((head - 10) >> 8);
	memset(buf + 10, ' ', head - 10);
	memcpy(buf + 10, dict, (size_t)n);
	buf[head - 1] = '\n';
	memcpy(buf + head, data, bytes);
	const int rc = rt_outpath_write(path, buf, head + bytes, err);
	free(buf);
	return rc;
}

/* --dump-hidden: layer l's attention input at each prompt position, [L × P × E]. The forward
 * hands the residual after layer l, which is layer l + 1's input; layer 0's is the
 * embedding (filled after the feed). */
typedef struct hidden_dump {
	const rt_model *m;
	float *h;
	int64_t P;
} hidden_dump;

static void hidden_on_layer(void *user, int layer, int C, int32_t pos0, const float *x,
                            const float *q)
{
	(void)q;
	hidden_dump *d = user;
	const rt_model *m = d->m;
	const int E = m->hp.n_embd;
	if (layer + 1 >= m->hp.n_layer)
		return;
	for (int r = 0; r < C && pos0 + r < d->P; r++)
		rt_rms_norm(d->h + ((size_t)(layer + 1) * d->P + (size_t)(pos0 + r)) * E,
		            x + (size_t)r * E, m->layers[layer + 1].attn_norm, 1, E, m->hp.norm_eps);
}

static int hidden_first(hidden_dump *d, const int32_t *ids)
{
	const int E = d->m->hp.n_embd;
	float *x = malloc((size_t)E * sizeof *x);
	if (!x)
		return -1;
	for (int64_t p = 0; p < d->P; p++) {
		rt_model_embed(d->m, ids[p], x);
		rt_rms_norm(d->h + (size_t)p * E, x, d->m->layers[0].attn_norm, 1, E, d->m->hp.norm_eps);
	}
	free(x);
	return 0;
}

/* The dumps after the feed: the replay's scores and the hidden states, each .npy. */
static int keepmap_dumps(const rt_cli_opts *o, const rt_seq *s, hidden_dump *hd,
                         const int32_t *ids, rt_err *err)
{
	if (o->dump_scores) {
		if (!s->run.ctx.replay)
			return rt_err_set(err, "--dump-scores: the replay did not run (no prompt-end "
			                  "compress fired after the prompt of %lld tokens)",
			                  (long long)s->run.ctx.prompt_len);
		const int64_t dims[3] = { s->kv.n_layer, s->kv.n_kv_head, s->run.ctx.replay_n };
		if (npy_write(o->dump_scores, s->run.ctx.replay, dims, 3, err) != 0)
			return -1;
	}
	if (hd->h) {
		if (hidden_first(hd, ids) != 0)
			return rt_err_set(err, "--dump-hidden: out of memory");
		const int64_t dims[3] = { hd->m->hp.n_layer, hd->P, hd->m->hp.n_embd };
		if (npy_write(o->dump_hidden, hd->h, dims, 3, err) != 0)
			return -1;
	}
	return 0;
}

int rt_cmd_keepmap(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', 't', O_CTX, O_CHUNK, O_THREADS, O_POLICY, O_SET, O_RATIO,
		O_BYTERATIO, O_PROMPTLEN, O_SVG, O_DUMPSCORES, O_DUMPHIDDEN, O_EXACT, O_FAST, O_QUIET,
		0 };
	rt_cli_opts o = { .chunk = RT_CLI_CHUNK, .prompt_len = -1, .exact = 1 };
	int rc = rt_cli_parse("keepmap", help_keepmap, argc, argv, &o, opt_ids,
	                      RT_CLI_NEED_MODEL | RT_CLI_NEED_TEXT);
	if (rc != RT_CLI_GO)
		return rc;
	if (!o.svg && !o.dump_scores && !o.dump_hidden)
		return rt_cli_usage("keepmap", "%s", "--svg, --dump-scores or --dump-hidden is required");
	const struct kvp_policy *p = rt_cli_pick("keepmap", &o, 1, &rc); /* with a tuned default */
	if (!p)
		return rc;
	if (o.dump_scores && !(p->needs & KVP_NEED_REPLAY))
		return rt_cli_usage("keepmap", "--dump-scores: policy %s reads no context replay "
		                    "scores (replay_attn); use a policy that does, e.g. kvzip", p->name);
	if (o.dump_hidden && (p->needs & KVP_NEED_TRACE))
		return rt_cli_usage("keepmap", "--dump-hidden: policy %s records a prompt trace, "
		                    "which uses the forward's layer hook; use another policy", p->name);
	rt_cli_threads(o.threads);
	size_t len;
	char *text = rt_cli_read_text(o.text, &len);
	if (!text)
		return EXIT_FAILURE;
	rt_cli_text_model tm = { 0 };
	rt_keepmap_head *heads = NULL;
	rt_seq s = { 0 };
	rt_err err = { "" };
	hidden_dump hd = { 0 };
	if (rt_cli_open_text_model(&o, text, len, &tm, &rc) < 0)
		goto out;
	rc = EXIT_FAILURE;
	const int64_t use = tm.use;
	if (use < 1) {
		fprintf(stderr, "%s: %s: text has no tokens\n", rt_cli_prog, o.text);
		goto out;
	}
	int block = (int)(o.chunk < use ? o.chunk : use);
	int64_t prompt_len = o.prompt_len >= 0 ? o.prompt_len : use;
	if (rt_seq_init(&s, tm.m, p, (int32_t)use, block, prompt_len, &err) != 0 ||
	    rt_cli_seq_apply(&s, &o, &err) != 0) {
		rt_cli_fail(&err);
		goto out;
	}
	if (o.dump_hidden) {
		hd.m = tm.m;
		hd.P = prompt_len; /* at most use (rt_cli_open_text_model) */
		const size_t nf = (size_t)tm.m->hp.n_layer * (size_t)hd.P * (size_t)tm.m->hp.n_embd;
		if (!(hd.h = calloc(nf, sizeof *hd.h))) {
			fprintf(stderr, "%s: --dump-hidden: out of memory for %zu floats\n", rt_cli_prog, nf);
			goto out;
		}
		s.fwd.on_layer = hidden_on_layer;
		s.fwd.layer_user = &hd;
	}
	if (keepmap_feed(&s, tm.ids, use, block, o.quiet, &err) != 0 ||
	    keepmap_dumps(&o, &s, &hd, tm.ids, &err) != 0) {
		rt_cli_fail(&err);
		goto out;
	}
	if (!o.svg) {
		printf("keepmap: policy %s, %lld tokens%s%s%s%s\n", p->name, (long long)use,
		       o.dump_scores ? ", scores in " : "", o.dump_scores ? o.dump_scores : "",
		       o.dump_hidden ? ", hidden states in " : "", o.dump_hidden ? o.dump_hidden : "");
		rc = fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
		goto out;
	}
	rt_seq_stats st = rt_seq_stats_get(&s);
	if (st.compress_events == 0 && p->compress)
		fprintf(stderr, "%s: note: policy %s never compressed on these %lld tokens (its budget "
		        "or trigger was not reached)\n", rt_cli_prog, p->name, (long long)use);
	/* as ppl: the map is not the ratio's alone when a floor or the guards raised the budget */
	rt_cli_print_notes(p->name, s.run.notes);
	const int nh = s.kv.n_layer * s.kv.n_kv_head;
	if (!(heads = calloc((size_t)nh, sizeof *heads))) {
		fprintf(stderr, "%s: out of memory\n", rt_cli_prog);
		goto out;
	}
	for (int i = 0; i < nh; i++) {
		heads[i].pos = s.kv.heads[i].pos;
		heads[i].count = s.kv.heads[i].count;
		heads[i].n = s.kv.heads[i].n;
	}
	char params[1024] = "";
	size_t used = 0;
	for (int i = 0; i < p->n_params && used < sizeof params - 1; i++) {
		char v[48]; /* as --set takes it: a ratio as a percentage */
		rt_param_format_set(&p->params[i], s.run.params[i], v, sizeof v);
		int w = snprintf(params + used, sizeof params - used, "%s%s=%s", i ? " " : "",
		                 p->params[i].name, v);
		if (w < 0)
			break;
		used += (size_t)w;
	}
	rt_keepmap km = { .n_layer = s.kv.n_layer, .n_kv_head = s.kv.n_kv_head, .n_tokens = use,
		          .heads = heads, .policy = p->name, .params = params, .ratio = o.ratio,
		          .byte_ratio = o.byte_ratio };
	if (rt_keepmap_write(o.svg, &km, &err) != 0) {
		rt_cli_fail(&err);
		goto out;
	}
	rt_keepmap_summary sm;
	rt_keepmap_summarize(&km, &sm);
	printf("keepmap %s: policy %s, %lld tokens, %d x %d heads: kept %lld entries, mean %.1f per "
	       "head (%.1f%%), min %d, max %d, %lld merged, %lld compressions\n", o.svg, p->name,
	       (long long)use, km.n_layer, km.n_kv_head, (long long)sm.entries, sm.mean_per_head,
	       100.0 * sm.mean_per_head / (double)use, (int)sm.min_per_head, (int)sm.max_per_head,
	       (long long)sm.merged, (long long)st.compress_events);
	rc = fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
out:
	rt_seq_free(&s);
	free(hd.h);
	free(heads);
	rt_cli_text_model_free(&tm);
	free(text);
	return rc;
}

