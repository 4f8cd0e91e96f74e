/*
 * rt_cmd_run: `run` — generation from a prompt under a policy (greedy, or sampled with
 * serve's sampler); the man page is
 * help_run below.
 */
#include "cli/rt_cmd.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/rt_cli_input.h"
#include "cli/rt_cli_opts.h"
#include "eval/rt_decode.h"
#include "model/rt_chat.h"

static const char *const help_run =
	"NAME\n"
	"    {prog} run - generation from a prompt under a KV-cache policy\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} run --model MODEL (--prompt TEXT | --file FILE) [-n N] [--chat]\n"
	"             [--system TEXT]\n"
	"             [--policy NAME] [--set NAME=VALUE]... [--ratio R | --byte-ratio R] [--stats]\n"
	"             [--chunk N] [--prefill-chunk C] [--threads N] [--exact]\n"
	"             [--kv-type f32|f16|q8_0] [--min-kv N]\n"
	"             [--temp T] [--top-k K] [--top-p P] [--seed S]\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes the prompt, prefills it under the policy (the prompt is its prompt:\n"
	"    prompt-end triggers fire after it), then repeatedly appends the next token, writing\n"
	"    its bytes to standard output as it is produced: by default the most likely one\n"
	"    (greedy, lowest id on ties); with --temp T > 0 one drawn as serve draws it\n"
	"    (top-k, then top-p over the softmax at temperature T, then a draw from a\n"
	"    generator seeded with S: the same S gives the same text). Stops after N\n"
	"    tokens, at an end-of-generation token, or at the model's context_length.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    -p, --prompt TEXT  the prompt (UTF-8)\n"
	"    -f, --file FILE    the prompt read from FILE (UTF-8 text, gzip when it ends in\n"
	"                       .gz; the whole file, its last newline included), in place\n"
	"                       of --prompt\n"
	"    -n N               tokens to generate at most, N >= 1 (default 128)\n"
	"    --chat             wrap the prompt in the model's chat template (ChatML, Llama 3,\n"
	"                       Gemma, Mistral, ...: from tokenizer.chat_template), tokenized as\n"
	"                       serve does: the template's markers as control tokens, the\n"
	"                       messages as plain text\n"
	"    --system TEXT      system message for --chat (default: the template's), marked as\n"
	"                       the span `system` (a policy's `keep span system` keeps it)\n"
	"    --policy NAME      policy (default {policy}); --set, --ratio, --byte-ratio as for ppl\n"
	"    --stats            print token counts, speed, KV peak and compressions on stderr\n"
	"    --chunk N          prompt prefill chunk (default 512)\n"
	"    --prefill-chunk C  chunked prefill for a per-step policy: prompt chunks of up to\n"
	"                       C tokens (at most --chunk) cross its triggers and it compresses\n"
	"                       at each chunk's end; default 0, the exact schedule (as ppl)\n"
	"    --threads N        threads (default: every core)\n"
	"    --exact            the exact path (f32 weights, OpenBLAS); default: the fast path\n"
	"    --kv-type T        KV storage: f32, f16 (the fast path's default) or q8_0 (ggml's\n"
	"                       8-bit blocks); the exact path stores f32 and refuses the others\n"
	"    --min-kv N         graceful budget: every (layer, KV head) keeps at least N tokens\n"
	"                       whatever the budget or --ratio, so a prompt of N tokens or fewer\n"
	"                       stays whole, and guards larger than the budget raise it (a note\n"
	"                       with --stats) instead of failing; 0: the policy's budget as\n"
	"                       written, its own `min` floor included (default 64)\n"
	"    --temp T           sampling temperature in 0..2 (default 0: greedy; --top-k,\n"
	"                       --top-p and --seed need T > 0)\n"
	"    --top-k K          sample among the K most likely tokens (default 0: all)\n"
	"    --top-p P          nucleus: the smallest set of most likely tokens whose\n"
	"                       probability reaches P, in (0, 1] (default 1: all)\n"
	"    --seed S           the sampler's seed, a 64-bit unsigned integer (default 0)\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n";
/* --chat's prompt: the system message (--system, if given) and the user's, as token ids
 * tokenized as serve tokenizes a chat (rt_chat_tokenize), and the system message's ids
 * [*sys_lo, *sys_lo + *sys_n): serve's span `system`, its template text included (0 ids
 * without --system: a template's default system message is not marked, as in serve).
 * Heap ids (caller frees), *n of them; NULL with err. */
static int32_t *chat_ids(const rt_tokenizer *tk, const rt_cli_opts *o, int64_t *n,
                         int64_t *sys_lo, int64_t *sys_n, rt_err *err)
{
	rt_chat_msg msg[2];
	int nm = 0, *of = NULL;
	if (o->system)
		msg[nm++] = (rt_chat_msg){ "system", o->system };
	msg[nm++] = (rt_chat_msg){ "user", o->prompt };
	int32_t *ids = rt_chat_tokenize(tk, msg, nm, n, &of, err);
	if (!ids)
		return NULL;
	int64_t lo = -1, hi = -1;
	for (int64_t i = 0; o->system && i < *n; i++)
		if (of[i] == 0) {
			if (lo < 0)
				lo = i;
			hi = i + 1;
		}
	free(of);
	*sys_lo = lo < 0 ? 0 : lo;
	*sys_n = lo < 0 ? 0 : hi - lo;
	return ids;
}

int rt_cmd_run(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', 'p', 'f', 'n', O_CHAT, O_SYSTEM, O_STATS, O_THREADS, O_CHUNK, O_POLICY,
		O_SET, O_RATIO, O_BYTERATIO, O_EXACT, O_FAST, O_PREFILL, O_KVTYPE, O_MINKV, O_TEMP,
		O_TOPK, O_TOPP, O_SEED64, 0 };
	rt_cli_opts o = { .n_gen = 128, .chunk = RT_CLI_CHUNK, .min_kv = RT_CLI_MIN_KV, .top_p = 1 };
	int rc = rt_cli_parse("run", help_run, argc, argv, &o, opt_ids, 1);
	if (rc != RT_CLI_GO)
		return rc;
	if (!o.prompt == !o.prompt_file)
		return rt_cli_usage("run", "%s", o.prompt ? "--prompt and --file: give the prompt "
		                    "one way" : "--prompt TEXT or --file FILE is required");
	if (o.prompt && !o.prompt[0])
		return rt_cli_usage("run", "%s", "--prompt: the prompt is empty; give the text to continue");
	if (o.system && !o.chat)
		return rt_cli_usage("run", "%s", "--system needs --chat");
	/* a truncation without a temperature would be silently greedy: say so instead */
	if (!(o.temp > 0) && (o.top_k > 0 || o.top_p < 1 || o.seed64_set))
		return rt_cli_usage("run", "%s", "--top-k, --top-p and --seed shape sampling, which "
		                    "needs --temp T > 0 (run is greedy by default)");
	const struct kvp_policy *p = rt_cli_pick("run", &o, 1, &rc); /* with a tuned default */
	if (!p)
		return rc;
	size_t bad, len;
	char *file_text = NULL; /* --file's text, read before the model (rt_text_read's checks) */
	if (o.prompt_file) {
		if (!(file_text = rt_cli_read_text(o.prompt_file, &len)))
			return EXIT_FAILURE;
		if (!len) {
			fprintf(stderr, "%s: %s: the prompt file is empty; give the text to continue\n",
			        rt_cli_prog, o.prompt_file);
			free(file_text);
			return EXIT_FAILURE;
		}
		o.prompt = file_text;
	} else if (!rt_utf8_valid(o.prompt, strlen(o.prompt), &bad)) {
		fprintf(stderr, "%s: prompt: not valid UTF-8 at byte %zu\n", rt_cli_prog, bad);
		return EXIT_FAILURE;
	}
	if (o.system && !rt_utf8_valid(o.system, strlen(o.system), &bad)) {
		fprintf(stderr, "%s: --system: not valid UTF-8 at byte %zu\n", rt_cli_prog, bad);
		free(file_text);
		return EXIT_FAILURE;
	}
	rt_cli_threads(o.threads);
	rt_gguf *g = NULL;
	rt_tokenizer *tk = NULL;
	rt_model *m = NULL;
	int32_t *ids = NULL;
	float *logits = NULL;
	rt_seq s = { 0 };
	rt_sampler smp = { 0 };
	rt_err err = { "" };
	int64_t n = 0;
	rc = EXIT_FAILURE;
	if (rt_cli_open_model(o.model, &o, &g, &tk, &m) < 0)
		goto out;
	rt_gguf_close(g);
	g = NULL;
	const char *what = o.prompt_file ? o.prompt_file : "prompt"; /* the input, in messages */
	int64_t sys_lo = 0, sys_n = 0; /* the system message's tokens: span `system` */
	if (o.chat) {
		if (!(ids = chat_ids(tk, &o, &n, &sys_lo, &sys_n, &err))) {
			rt_cli_fail(&err); /* the template's error (the texts were checked above) */
			goto out;
		}
		char note[512];
		if (rt_chat_guess_note(tk, note, sizeof note))
			fprintf(stderr, "%s: run: note: %s\n", rt_cli_prog, note);
	} else if (!(ids = rt_cli_tokenize(tk, what, o.prompt, strlen(o.prompt), 0, &n))) {
		goto out;
	}
	if (n < 1) {
		fprintf(stderr, "%s: %s: empty after tokenization\n", rt_cli_prog, what);
		goto out;
	}
	if (n >= m->hp.n_ctx) {
		fprintf(stderr, "%s: %s: %lld tokens leave no room in the context_length %d\n",
		        rt_cli_prog, what, (long long)n, (int)m->hp.n_ctx);
		goto out;
	}
	int64_t cap = n + o.n_gen;
	if (cap > m->hp.n_ctx)
		cap = m->hp.n_ctx;
	int chunk = (int)(o.chunk < n ? o.chunk : n);
	if (rt_seq_init(&s, m, p, (int32_t)cap, chunk, n, &err) != 0 || rt_cli_seq_apply(&s, &o, &err) != 0 ||
	    !(logits = malloc((size_t)m->hp.n_vocab * sizeof *logits)) ||
	    rt_sampler_init(&smp, m->hp.n_vocab, o.temp, o.top_p, (int)o.top_k, o.seed64) != 0) {
		if (!err.msg[0])
			rt_err_set(&err, "out of memory");
		rt_cli_fail(&err);
		goto out;
	}
	/* the system message is span `system` as serve marks it (a policy's `keep span system`) */
	rt_seq_use_spans(&s);
	rt_seq_span_range(&s, RT_SPAN_SYSTEM, sys_lo, sys_n);
	double t0 = rt_now();
	int frc = rt_seq_feed(&s, ids, n, logits, RT_LOGITS_LAST, &err);
	rt_seq_span_range(&s, 0, 0, 0);
	if (frc != 0) {
		rt_cli_fail(&err);
		goto out;
	}
	double t1 = rt_now();
	char sink[1];
	/* the sampler decides: temperature 0 (the default) is rt_sample's argmax, greedy */
	int64_t gen = rt_decode(&s, tk, &smp, logits, o.n_gen, sink, 0, stdout, &err);
	if (gen < 0) {
		putchar('\n');
		rt_cli_fail(&err);
		goto out;
	}
	putchar('\n');
	/* the answer before the stats: stdout is buffered when piped, stderr is not */
	const int flushed = fflush(stdout) == 0;
	double t2 = rt_now();
	if (o.stats) {
		rt_seq_stats st = rt_seq_stats_get(&s);
		fprintf(stderr,
		        "prompt %lld tokens (%.1f tokens/s), generated %lld tokens (%.1f tokens/s); "
		        "policy %s: KV peak %lld entries (%.2f MiB), %lld compression%s, %.3f s in "
		        "policy code\n",
		        (long long)n, (double)n / (t1 - t0), (long long)gen,
		        gen ? (double)gen / (t2 - t1) : 0.0, p->name, (long long)st.kv_entries_peak,
		        (double)st.kv_bytes_peak / (1024.0 * 1024.0), (long long)st.compress_events,
		        st.compress_events == 1 ? "" : "s", st.policy_seconds);
		if (sys_n) /* kept: the fewest of its entries any full-attention head holds */
			fprintf(stderr, "system message: span `system`, %lld tokens at %lld..%lld, %lld "
			        "kept by every full-attention head\n", (long long)sys_n, (long long)sys_lo,
			        (long long)(sys_lo + sys_n - 1), (long long)rt_seq_span_kept(&s, RT_SPAN_SYSTEM));
		const char *t;
		for (unsigned n = s.run.notes; (t = rt_pick_note_next(&n));)
			fprintf(stderr, "note: %s\n", t);
	}
	rc = flushed && fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
out:
	free(file_text);
	rt_sampler_free(&smp);
	rt_seq_free(&s);
	free(logits);
	free(ids);
	rt_model_free(m);
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	return rc;
}

