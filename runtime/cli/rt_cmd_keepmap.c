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
#include "report/rt_keepmap.h"

static const char *const help_keepmap =
	"NAME\n"
	"    {prog} keepmap - draw which positions a KV-cache policy keeps, per layer and KV head\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} keepmap --model MODEL --text FILE [--ctx N] [--policy NAME]\n"
	"             [--set NAME=VALUE]... [--ratio R | --byte-ratio R] [--prompt N] [--chunk N]\n"
	"             [--threads N] --svg OUT\n"
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
	"    --prompt N          the prompt length given to the policy (default: N)\n"
	"    --svg OUT           the SVG file to write (required)\n"
	"    --chunk N, --threads N, --fast, --quiet, -h/--help  as for ppl\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n"
	"\n"
	"EXAMPLE\n"
	"    {prog} keepmap --model models/SmolLM2-135M-Instruct.Q4_1.gguf --text t.txt \\\n"
	"           --ctx 512 --policy h2o --ratio 4 --svg h2o.svg\n";

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

int rt_cmd_keepmap(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', 't', O_CTX, O_CHUNK, O_THREADS, O_POLICY, O_SET, O_RATIO,
		O_BYTERATIO, O_PROMPTLEN, O_SVG, O_EXACT, O_FAST, O_QUIET, 0 };
	rt_cli_opts o = { .chunk = RT_CLI_CHUNK, .prompt_len = -1, .exact = 1 };
	int rc = rt_cli_parse("keepmap", help_keepmap, argc, argv, &o, opt_ids,
	                      RT_CLI_NEED_MODEL | RT_CLI_NEED_TEXT);
	if (rc != RT_CLI_GO)
		return rc;
	if (!o.svg)
		return rt_cli_usage("keepmap", "%s", "--svg is required");
	const struct kvp_policy *p = rt_cli_pick("keepmap", &o, 1, &rc); /* with a tuned default */
	if (!p)
		return rc;
	rt_cli_threads(o.threads);
	size_t len;
	char *text = rt_cli_read_text(o.text, &len);
	if (!text)
		return EXIT_FAILURE;
	rt_cli_text_model tm = { 0 };
	rt_keepmap_head *heads = NULL;
	rt_seq s = { 0 };
	rt_err err = { "" };
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
	    rt_cli_seq_apply(&s, &o, &err) != 0 || keepmap_feed(&s, tm.ids, use, block, o.quiet, &err) != 0) {
		rt_cli_fail(&err);
		goto out;
	}
	rt_seq_stats st = rt_seq_stats_get(&s);
	if (st.compress_events == 0 && p->compress)
		fprintf(stderr, "%s: note: policy %s never compressed on these %lld tokens (its budget "
		        "or trigger was not reached)\n", rt_cli_prog, p->name, (long long)use);
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
		int w = snprintf(params + used, sizeof params - used, "%s%s=%g", i ? " " : "",
		                 p->params[i].name, s.run.params[i]);
		if (w < 0)
			break;
		used += (size_t)w;
	}
	rt_keepmap km = { .n_layer = s.kv.n_layer, .n_kv_head = s.kv.n_kv_head, .n_tokens = use,
		          .heads = heads, .policy = p->name, .params = params, .ratio = o.ratio };
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
	free(heads);
	rt_cli_text_model_free(&tm);
	free(text);
	return rc;
}

