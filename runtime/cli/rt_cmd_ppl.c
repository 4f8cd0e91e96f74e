/*
 * rt_cmd_ppl: `ppl` — streaming perplexity of a text under policies, with KL against the
 * full cache; the man page is help_ppl below.
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
#include "cli/rt_cli_meta.h"
#include "cli/rt_cli_opts.h"
#include "cli/rt_cli_runs.h"
#include "eval/rt_compression.h"
#include "eval/rt_eval.h"
#include "eval/rt_stats.h"
#include "kv/rt_kvbytes.h"
#include "policy/rt_pick.h"
#include "report/rt_json.h"

static const char *const help_ppl =
	"NAME\n"
	"    {prog} ppl - streaming perplexity of a text under a KV-cache policy\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} ppl --model MODEL --text FILE [--policy NAME] [--set NAME=VALUE]...\n"
	"             [--ratio R | --byte-ratio R] [--ctx N] [--prompt N [--score-from P]]\n"
	"             [--chunk N] [--prefill-chunk C]\n"
	"             [--threads N] [--json] [--dump FILE] [--logits FILE] [--no-ref] [--fast]\n"
	"             [--kv-type T] [--device cpu|cuda [--f16]]\n"
	"    {prog} ppl --model MODEL --text FILE --batch RUNS [--ctx N] [--prompt N]\n"
	"             [--score-from P] [--json] ...\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes FILE, keeps its first N tokens and feeds them through the model\n"
	"    under the policy, scoring each token from the ones before it as the policy\n"
	"    left them in the cache (teacher forcing): NLL_i = -log q(t[i+1] | cache after\n"
	"    t[0..i]), ppl = exp(mean NLL), natural logs, log-sum-exp in double.\n"
	"\n"
	"    Unless the policy is full or --no-ref is given, a second sequence with the full\n"
	"    cache is fed the same tokens in the same run and every token's distribution p\n"
	"    is compared with the policy's q (llama-perplexity --kl-divergence's statistics):\n"
	"    kld_mean (mean KL(p||q), nats) and kld_mean_err, kld_median, kld_p99, kld_max,\n"
	"    ppl_ref, ppl_ratio = ppl / ppl_ref, same_top1 (fraction of tokens with the same\n"
	"    argmax), rms_dp (root mean square of q(t) - p(t) for the correct token t).\n"
	"\n"
	"    Memory and speed: kv_entries_peak is the most entries held by all (layer, KV\n"
	"    head) lists together, measured after each chunk's append (before compressing),\n"
	"    kv_bytes_peak the most bytes of KV pool blocks the sequence held at once\n"
	"    (blocks of 16 entries: keys, values, metadata and policy statistics; the\n"
	"    resident KV memory). Compression has one definition for every command\n"
	"    (docs/measuring.md, \"Compression\"): a full cache of the tokens over what the\n"
	"    policy held, in entries (compression: tokens / mean entries per (layer, KV head)\n"
	"    list) and in bytes against an f16 full cache (bytes_compression: every token's\n"
	"    key and value at 2 bytes per element, kv_bytes_f16, over the keys and values\n"
	"    held as stored, kv_bytes_kv; an f32 store at 4x in entries is 2x in bytes), at\n"
	"    the end (after the last token) and at peak (compression_peak,\n"
	"    bytes_compression_peak: the most held at once, so a prompt-end policy's peak is\n"
	"    its whole prompt); with --prompt N (N below the tokens), prompt_compression and\n"
	"    prompt_bytes_compression are the figures for the prompt's N tokens right after\n"
	"    its last chunk and its compress (what a prompt-end policy made of the prompt,\n"
	"    before the tokens after it were appended). scored_compressed counts the scored\n"
	"    tokens predicted from a cache the policy had compressed (a compress that\n"
	"    evicted, merged or requantised entries; one that kept them all does not\n"
	"    count): when it is 0 the\n"
	"    figures are the full cache's and ppl warns (a prompt-end policy such as snapkv\n"
	"    without --prompt compresses after the last token; measure it with --prompt N\n"
	"    --score-from N+1, the protocol tune, the gate and ab use: docs/measuring.md);\n"
	"    protocol is the policy's (stream or prompt_end, from its trigger);\n"
	"    tokens_per_s counts the policy run only; compress_events is the number of\n"
	"    compress calls; policy_seconds the time spent inside policy code (observe,\n"
	"    init_entries, should_compress, next_trigger, compress). The store reserves\n"
	"    address space for N entries per head (the text's length), or N / R + 1024 with\n"
	"    --ratio R and no --prompt; only the blocks it holds are resident, and evicted\n"
	"    entries' blocks return to the pool at once, so kv_bytes_peak is the memory a\n"
	"    deployment needs.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL   GGUF model file\n"
	"    -t, --text FILE     the text; must be valid UTF-8\n"
	"    --policy NAME       policy (see `{prog} info`; default {policy})\n"
	"    --set NAME=VALUE    override a policy parameter (repeatable)\n"
	"    --ratio R           compression factor: budget = context / R entries per head\n"
	"                        (R >= 1) in place of the policy's own budget\n"
	"    --byte-ratio R      compression factor in bytes: budget = 1/R of the bytes of an\n"
	"                        f16 full cache of the context (R >= 1); a tiered policy keeps\n"
	"                        entries at narrower tiers within it\n"
	"    --ctx N             score the first N tokens (default: the whole text, up to\n"
	"                        the model's context_length)\n"
	"    --prompt N          treat the first N tokens as the prompt (prompt-end\n"
	"                        triggers such as SnapKV's fire after it; ratio budgets\n"
	"                        refer to it); default: every scored token, so a ratio\n"
	"                        budget is a fixed N / R entries per head from the first\n"
	"                        token, as in `kvpc ab`; at most the tokens fed\n"
	"    --chunk N           most tokens per forward chunk (default 512)\n"
	"    --prefill-chunk C   chunked prefill for a per-step policy (`compress every step`:\n"
	"                        h2o, tova, scissorhands): while the prompt is fed, chunks of\n"
	"                        up to C tokens (at most --chunk, and 512 / sequences in a\n"
	"                        lockstep pass) cross its triggers, every token of a chunk is\n"
	"                        observed, and the policy compresses to its budget at each\n"
	"                        chunk's end (the store holds up to budget + C entries per\n"
	"                        head). Default 0: the exact schedule (a per-step policy then\n"
	"                        prefills token by token); evaluation measures the policy as\n"
	"                        published (docs/language.md, \"Chunked prefill\")\n"
	"    --threads N         threads (exact path: OpenBLAS's; fast path: the pool)\n"
	"    --fast              the fast path (weights in their GGUF types, 8-bit activations\n"
	"                        when decoding); default --exact (f32 weights, OpenBLAS): the\n"
	"                        quality figures are measured on the exact path\n"
	"    --f32-act           with --fast: f32 activations at every chunk size, so a run\n"
	"                        fed in short chunks (a per-step policy prefills token by\n"
	"                        token) and its reference differ by their caches only, not by\n"
	"                        8-bit activation rounding (slower; JSON \"activations\")\n"
	"    --kv-type T         KV storage with --fast: f32, f16 (default) or q8_0 (ggml's\n"
	"                        8-bit blocks); the exact path stores f32 and refuses the others\n"
	"    --device cuda       run every sequence (the runs and the reference) on the GPU, in\n"
	"                        a binary built with `kvpc build --cuda` (docs/cuda.md): the\n"
	"                        exact path's f32 weights and an f32 store on the device, the\n"
	"                        same loop, figures and reports (JSON \"device\", \"weights\");\n"
	"                        --batch runs are fed one after the other; policies the GPU\n"
	"                        cannot run are refused naming why. Default --device cpu\n"
	"    --f16               with --device cuda: f16 copies of the weights (tensor-core\n"
	"                        GEMMs; an approximation, like the CPU's --fast)\n"
	"    --json              one JSON object: policy, params, ratio, model, model_sha256,\n"
	"                        text, text_sha256, commit, threads, chunk, tokens, scored,\n"
	"                        ppl, nll_mean, top1_acc, kv_entries_peak, kv_bytes_peak,\n"
	"                        kv_bytes_kv, kv_bytes_f16, compression, bytes_compression,\n"
	"                        compression_peak, bytes_compression_peak, with --prompt\n"
	"                        prompt_compression, prompt_bytes_compression, protocol,\n"
	"                        scored_compressed,\n"
	"                        tokens_per_s, compress_events, policy_seconds,\n"
	"                        replay_seconds and replay_tokens (a policy reading\n"
	"                        replay_attn: its replay of the prompt, inside seconds),\n"
	"                        seconds and, with the reference, the KL statistics above\n"
	"    --dump FILE         one JSON line per scored token: {\"pos\":P,\"token\":T,\n"
	"                        \"logprob\":L,\"top1\":A} plus \"logprob_ref\" and \"kld\" with\n"
	"                        the reference\n"
	"    --logits FILE       write the policy run's raw little-endian f32 logits\n"
	"                        [N × n_vocab] to FILE (row i after tokens 0..i)\n"
	"    --no-ref            skip the full-cache reference (half the work)\n"
	"    --score-from P      score only the tokens at positions >= P (all tokens are\n"
	"                        still fed); with --prompt N, P = N + 1 scores exactly the\n"
	"                        tokens predicted from the cache a prompt-end policy left\n"
	"    --batch RUNS        run several policies on the same text in one pass: RUNS has\n"
	"                        one run per line, `POLICY [--ratio R | --byte-ratio R]\n"
	"                        [--set NAME=VALUE]... [--kv-type T]` ('#' starts a comment\n"
	"                        line; --kv-type gives the run's KV store type, f32, f16 or\n"
	"                        q8_0, on either path, while the reference keeps the\n"
	"                        command's: KL against one reference for every store type;\n"
	"                        a line without it takes the command's --kv-type, or where\n"
	"                        none is given its policy's default, as a single run does).\n"
	"                        All runs and the reference are fed in lockstep and each\n"
	"                        chunk's weight GEMMs run once for all of them (the weights\n"
	"                        are read once, not once per run);\n"
	"                        each run gives what a separate `ppl` run gives (one report\n"
	"                        or JSON line per run, in file order, with \"batch\": the\n"
	"                        sequences in the pass) up to float summation order;\n"
	"                        seconds and tokens_per_s are the shared pass's. A run\n"
	"                        whose policy fails (guards above its ratio's budget) leaves\n"
	"                        the pass with an error line ({..., \"error\": why}) and\n"
	"                        exit status 1; the other runs go on\n"
	"    --quiet             no progress on stderr (otherwise a bar with tok/s and ETA on\n"
	"                        a terminal, a line per tenth of the run elsewhere)\n"
	"    -h, --help          show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error (unknown policy or parameter, R < 1,\n"
	"    --ctx beyond the model's context_length).\n"
	"\n"
	"EXAMPLE\n"
	"    {prog} ppl --model models/SmolLM2-135M-Instruct.Q4_1.gguf --text t.txt \\\n"
	"           --ctx 1024 --policy h2o --ratio 4 --json\n";

/* The warnings of one run on stderr: a compressing policy that compressed before none of
 * the scored tokens measured the full cache (KL 0 beside a compression it reached only
 * after the last scored token); a prompt-end policy scored on tokens of its own prompt
 * (before its compress) dilutes its KL with the full cache's; and the notes of a graceful
 * budget (a floor or guards raised it: the figures are not the ratio's alone). */
static void ppl_warn(const rt_cli_run *r, const rt_eval_score *sc, int64_t use,
                     int64_t prompt_len)
{
	const struct kvp_policy *p = r->p;
	if (rt_eval_uncompressed(p, sc)) {
		fprintf(stderr, "%s: warning: policy %s compressed before none of the %lld scored "
		        "tokens: its figures are the full cache's, not the policy's", rt_cli_prog,
		        p->name, (long long)sc->scored);
		/* what raised the budget, when something did: the guards (a window longer than the
		 * prompt) before the floor, whose note a raise by the guards may also carry */
		const unsigned notes = r->seq.run.notes;
		const int guards = (notes & KVP_NOTE_GUARDS) != 0;
		const int floor = !guards && (notes & KVP_NOTE_FLOOR) != 0;
		if (p->measure == KVP_MEASURE_PROMPT_END && prompt_len < use &&
		    r->seq.st.prompt_compression <= 1.0 + 1e-9) /* its compress kept the prompt */
			fprintf(stderr, " (its budget%s keeps every entry of the %lld-token prompt: "
			        "give %s)\n", guards ? ", raised to hold its guards," :
			        floor ? ", raised by its floor," : "", (long long)prompt_len,
			        guards ? "guards shorter than the prompt (--set), or a longer prompt" :
			        floor ? "a prompt longer than the floor" :
			        "a --ratio, or a prompt longer than the budget");
		else if (p->measure == KVP_MEASURE_PROMPT_END)
			fprintf(stderr, " (it compresses once, after the prompt's last token; measure "
			        "it with --prompt %lld --score-from %lld, docs/measuring.md)\n",
			        (long long)(use / 2), (long long)(use / 2 + 1));
		else
			fprintf(stderr, " (on these %lld tokens its trigger never fired, or its budget, "
			        "with its floor if it has one, kept every entry)\n", (long long)use);
	} else if (p->compress && p->measure == KVP_MEASURE_PROMPT_END &&
	           sc->compressed < sc->scored) {
		fprintf(stderr, "%s: note: %lld of the %lld scored tokens precede policy %s's "
		        "prompt-end compress (they are predicted from the full prompt); "
		        "--score-from %lld scores only the tokens after the prompt\n", rt_cli_prog,
		        (long long)(sc->scored - sc->compressed), (long long)sc->scored, p->name,
		        (long long)prompt_len + 1);
	}
	rt_cli_print_notes(p->name, r->seq.run.notes); /* a graceful budget's */
}

/* What one run's report says, computed once for the table and the JSON. */
typedef struct ppl_fig {
	const rt_cli_run *r;
	const rt_eval_score *sc;
	const rt_model *m;
	const rt_cli_opts *o;
	int64_t n, use, prompt_len;
	int block, ref, batch, threads, pf;
	rt_seq_stats st;
	double mean_entries, nll_mean, ppl, tps;
	rt_compression cx;        /* the one definition (runtime/eval/rt_compression.h) */
	int64_t kv_held, kv_f16;
	rt_kld_summary ks;
} ppl_fig;

static void ppl_fig_of(ppl_fig *f)
{
	const rt_cli_run *r = f->r;
	f->st = rt_seq_stats_get(&r->seq);
	f->mean_entries = rt_seq_mean_entries(&r->seq);
	rt_compression_of(&r->seq, f->use, &f->cx);
	f->kv_held = rt_kvbytes_held(&r->seq.kv);
	f->kv_f16 = rt_kvbytes_f16(&r->seq.kv, f->use);
	f->nll_mean = f->sc->nll / (double)f->sc->scored;
	f->ppl = exp(f->nll_mean);
	f->tps = f->st.seconds > 0 ? (double)f->use / f->st.seconds : 0;
	f->threads = f->m->exact ? openblas_get_num_threads() : rt_model_threads(f->m);
	/* the prefill chunk in force: bounded by the forward block */
	f->pf = (int)(r->o.prefill_chunk < f->block ? r->o.prefill_chunk : f->block);
	memset(&f->ks, 0, sizeof f->ks);
	if (f->ref)
		rt_kld_acc_summary(&f->sc->acc, &f->ks);
}

/* The run's JSON line (the members help_ppl lists). */
static void ppl_report_json(const ppl_fig *f, const char *msha, const char *tsha)
{
	const rt_cli_run *r = f->r;
	const rt_eval_score *sc = f->sc;
	fputc('{', stdout);
	rt_cli_json_policy(stdout, &r->seq, r->o.ratio);
	fputs(",\"model\":", stdout);
	rt_json_str(stdout, f->m->path);
	if (msha[0]) {
		fputs(",\"model_sha256\":", stdout);
		rt_json_str(stdout, msha);
	}
	fputs(",\"text\":", stdout);
	rt_json_str(stdout, f->o->text);
	fputs(",\"text_sha256\":", stdout);
	rt_json_str(stdout, tsha);
	printf(",\"threads\":%d,\"chunk\":%d,\"prefill_chunk\":%d,\"prompt\":%ld,"
	       "\"tokens\":%lld,\"scored\":%lld,\"score_from\":%ld,\"batch\":%d",
	       f->threads, f->block, f->pf, (long)f->prompt_len, (long long)f->use, (long long)sc->scored,
	       f->o->score_from > 1 ? f->o->score_from : 1, f->batch);
	rt_json_member_num(stdout, "ppl", f->ppl);
	rt_json_member_num(stdout, "nll_mean", f->nll_mean);
	rt_json_member_num(stdout, "top1_acc", (double)sc->hits / (double)sc->scored);
	printf(",\"kv_entries_peak\":%lld,\"kv_bytes_peak\":%lld",
	       (long long)f->st.kv_entries_peak, (long long)f->st.kv_bytes_peak);
	rt_json_member_num(stdout, "kv_entries_per_head", f->mean_entries);
	printf(",\"kv_bytes_kv\":%lld,\"kv_bytes_f16\":%lld", (long long)f->kv_held,
	       (long long)f->kv_f16);
	rt_compression_json(stdout, &f->cx);
	printf(",\"protocol\":\"%s\",\"scored_compressed\":%lld",
	       rt_eval_measure_name(r->p->measure), (long long)sc->compressed);
	rt_json_member_num(stdout, "tokens_per_s", f->tps);
	printf(",\"compress_events\":%lld", (long long)f->st.compress_events);
	rt_json_member_num(stdout, "policy_seconds", f->st.policy_seconds);
	if (r->p->needs & KVP_NEED_REPLAY) { /* the context replay (KVzip), inside seconds */
		rt_json_member_num(stdout, "replay_seconds", f->st.replay_seconds);
		printf(",\"replay_tokens\":%lld", (long long)f->st.replay_tokens);
	}
	rt_json_member_num(stdout, "seconds", f->st.seconds);
	if (rt_cli_device_weights()) {
		fputs(",\"device\":", stdout);
		rt_json_str(stdout, rt_seq_device(&r->seq));
		fputs(",\"weights\":", stdout);
		rt_json_str(stdout, rt_cli_device_weights());
	}
	if (f->ref) {
		rt_json_member_num(stdout, "kld_mean", f->ks.kld_mean);
		rt_json_member_num(stdout, "kld_mean_err", f->ks.kld_mean_err);
		rt_json_member_num(stdout, "kld_median", f->ks.kld_median);
		rt_json_member_num(stdout, "kld_p99", f->ks.kld_p99);
		rt_json_member_num(stdout, "kld_max", f->ks.kld_max);
		rt_json_member_num(stdout, "ppl_ref", f->ks.ppl_p);
		rt_json_member_num(stdout, "ppl_ratio", f->ks.ppl_ratio);
		rt_json_member_num(stdout, "same_top1", f->ks.same_top1);
		rt_json_member_num(stdout, "rms_dp", f->ks.rms_dp);
	}
	fputs("}\n", stdout);
}

/* The run's table on stdout. */
static void ppl_report_table(const ppl_fig *f)
{
	const rt_cli_run *r = f->r;
	const rt_eval_score *sc = f->sc;
	printf("model            %s\n", f->m->path);
	/* token 0 has no prediction, so `use` tokens score at most use - 1 (fewer with
	 * --score-from) */
	printf("text             %s (%lld tokens; the first %lld fed, %lld of them scored)\n",
	       f->o->text, (long long)f->n, (long long)f->use, (long long)sc->scored);
	printf("policy           %s", r->p->name);
	for (int i = 0; i < r->p->n_params; i++) /* those in effect: a ratio replaces the budget */
		if (kvp_param_in_effect(r->p, i, r->o.ratio > 0 ? r->o.ratio : r->o.byte_ratio)) {
			char v[48]; /* as --set takes it: a ratio as a percentage */
			rt_param_format_set(&r->p->params[i], r->seq.run.params[i], v, sizeof v);
			printf(" %s=%s", r->p->params[i].name, v);
		}
	if (r->o.ratio > 0)
		printf(" ratio=%g", r->o.ratio);
	if (r->o.byte_ratio > 0)
		printf(" byte_ratio=%g", r->o.byte_ratio);
	if (f->pf > 0)
		printf(" (chunked prefill: %d tokens)", f->pf);
	putchar('\n');
	printf("ppl              %.4f\n", f->ppl);
	printf("nll_mean         %.6f nats/token\n", f->nll_mean);
	printf("top1_acc         %.4f\n", (double)sc->hits / (double)sc->scored);
	if (f->ref) {
		printf("ppl_ref          %.4f (full cache), ppl_ratio %.4f\n", f->ks.ppl_p, f->ks.ppl_ratio);
		printf("kld              mean %.6f ± %.6f, p99 %.6f, max %.6f nats\n", f->ks.kld_mean,
		       f->ks.kld_mean_err, f->ks.kld_p99, f->ks.kld_max);
		printf("same_top1        %.4f, rms_dp %.4f\n", f->ks.same_top1, f->ks.rms_dp);
	}
	printf("kv peak          %lld entries, %.2f MiB\n", (long long)f->st.kv_entries_peak,
	       (double)f->st.kv_bytes_peak / (1024.0 * 1024.0));
	printf("kv at the end    %.1f entries per head, %.2f MiB of keys and values (an f16 full "
	       "cache: %.2f MiB)\n", f->mean_entries, (double)f->kv_held / (1024.0 * 1024.0),
	       (double)f->kv_f16 / (1024.0 * 1024.0));
	rt_compression_table(stdout, &f->cx);
	if (r->p->compress)
		printf("scored           %lld of %lld from a cache the policy had compressed\n",
		       (long long)sc->compressed, (long long)sc->scored);
	printf("compressions     %lld (%.3f s in policy code)\n", (long long)f->st.compress_events,
	       f->st.policy_seconds);
	if (r->p->needs & KVP_NEED_REPLAY)
		printf("replay           %lld tokens in %.2f s (the context replay, a second pass over "
		       "the prompt)\n", (long long)f->st.replay_tokens, f->st.replay_seconds);
	if (rt_cli_device_weights())
		printf("speed            %.1f tokens/s (%.2f s, on %s with %s weights%s)\n", f->tps,
		       f->st.seconds, rt_seq_device(&r->seq), rt_cli_device_weights(),
		       f->batch > 1 + f->ref ? ", runs fed one after the other"
		       : f->batch > 1 ? ", its full-cache reference fed apart" : "");
	else
		printf("speed            %.1f tokens/s (%.2f s, %d thread%s%s)\n", f->tps, f->st.seconds,
		       f->threads, f->threads == 1 ? "" : "s", f->batch > 1 + f->ref ? ", shared by the batch"
		       : f->batch > 1 ? ", shared with the full-cache reference" : "");
	if (f->batch > 1)
		putchar('\n');
}

static void ppl_report(const rt_cli_run *r, const rt_eval_score *sc, const rt_model *m,
                       const rt_cli_opts *o, const char *msha, const char *tsha, int64_t n,
                       int64_t use, int64_t prompt_len, int block, int ref, int batch)
{
	ppl_fig f = { .r = r, .sc = sc, .m = m, .o = o, .n = n, .use = use,
		      .prompt_len = prompt_len, .block = block, .ref = ref, .batch = batch };
	ppl_warn(r, sc, use, prompt_len);
	ppl_fig_of(&f);
	if (o->json)
		ppl_report_json(&f, msha, tsha);
	else
		ppl_report_table(&f);
}

/* The sequences of a ppl pass: the runs and the full-cache reference, with the block. */
typedef struct ppl_pass {
	rt_cli_run *runs;
	int K, ref, block;
	int64_t n, use, prompt_len;
	rt_seq sp;               /* the reference (when ref) */
	rt_seq **all;            /* [K] the runs' sequences */
	rt_eval_score *sc;       /* [K] */
} ppl_pass;

/* Set up the pass's sequences over use tokens (after the model and text are loaded). */
static int ppl_pass_init(ppl_pass *pp, const rt_model *m, const rt_cli_opts *o, rt_err *err)
{
	const int S = pp->K + pp->ref; /* sequences fed in lockstep */
	pp->block = (int)(o->chunk < pp->use ? o->chunk : pp->use);
	if (S > 1) { /* bound the batch's stacked rows and logits (S × block rows) */
		int cap_rows = 512 / S;
		pp->block = pp->block < cap_rows ? pp->block : cap_rows < 1 ? 1 : cap_rows;
	}
	/* Without --prompt the whole scored text is the prompt, so a ratio budget is
	 * use / R entries per head from the first token (a fixed cache budget, the convention
	 * `kvpc ab` uses too) rather than growing from 0 with the tokens seen. */
	pp->prompt_len = o->prompt_len >= 0 ? o->prompt_len : pp->use;
	pp->all = calloc((size_t)pp->K, sizeof *pp->all);
	pp->sc = calloc((size_t)pp->K, sizeof *pp->sc);
	if (!pp->all || !pp->sc)
		return rt_err_set(err, "out of memory");
	for (int i = 0; i < pp->K; i++) {
		rt_eval_score_init(&pp->sc[i]);
		/* A ratio budget over the whole scored text is a fixed use / R entries per head;
		 * a policy that compresses as it goes gets that plus RT_CLI_CAP_SLACK entries for what
		 * it holds between compressions (a block-wise policy's block, a batch eviction's
		 * overshoot), so a batch of many ratios fits in memory; one that overshoots
		 * further stops with "KV cache full". Otherwise (full cache, own budget, a
		 * prompt-end policy, --prompt) the store holds every scored token. */
		rt_cli_run *r = &pp->runs[i];
		int64_t cap = pp->prompt_len == pp->use ? rt_cli_run_cap(r, pp->use, 0) : pp->use;
		if (rt_seq_init_typed(&r->seq, m, r->p, rt_cli_run_kv_type(r, m), (int32_t)cap,
		                      pp->block, pp->prompt_len, err) != 0 ||
		    rt_cli_seq_apply(&r->seq, &r->o, err) != 0)
			return -1;
		rt_err e = { "" };
		if (rt_cli_device_attach(&r->seq, &e) != 0) { /* this run leaves; the others go on */
			pp->sc[i].failed_at = 0;
			snprintf(pp->sc[i].error, sizeof pp->sc[i].error, "%s", e.msg);
		}
		pp->all[i] = &r->seq;
	}
	if (pp->ref && (rt_seq_init(&pp->sp, m, &rt_policy_full, (int32_t)pp->use, pp->block,
	                            pp->prompt_len, err) != 0 ||
	                rt_cli_device_attach(&pp->sp, err) != 0))
		return -1;
	return 0;
}

static void ppl_pass_free(ppl_pass *pp)
{
	for (int i = 0; pp->sc && i < pp->K; i++)
		rt_eval_score_free(&pp->sc[i]);
	free(pp->sc);
	free(pp->all);
	rt_seq_free(&pp->sp);
	rt_cli_runs_free(pp->runs, pp->K);
}

static void ppl_progress(void *user, int64_t done, int64_t total)
{
	(void)total;
	rt_progress_update(user, done);
}

/* Open --dump and --logits, run the loop, close them. */
static int ppl_pass_run(ppl_pass *pp, const rt_cli_opts *o, const int32_t *ids, rt_err *err)
{
	FILE *dump = NULL, *lgf = NULL;
	int rc = -1;
	if (o->dump && !(dump = fopen(o->dump, "w")))
		rt_err_set(err, "%s: %s", o->dump, strerror(errno));
	else if (o->logits && !(lgf = fopen(o->logits, "wb")))
		rt_err_set(err, "%s: %s", o->logits, strerror(errno));
	else {
		rt_progress prog;
		rt_progress_init(&prog, "ppl", "tokens", pp->use, o->quiet);
		rt_eval_loop lo = { .block = pp->block, .batched = 1, .score_from = o->score_from,
			            .dump = dump, .dump_name = o->dump, .logits = lgf,
			            .logits_name = o->logits, .progress = ppl_progress,
			            .progress_user = &prog };
		rc = rt_eval_runs(pp->all, pp->K, pp->ref ? &pp->sp : NULL, ids, pp->use, &lo, pp->sc,
		                  NULL, err);
		rt_progress_end(&prog);
	}
	if (dump && fclose(dump) != 0 && rc == 0)
		rc = rt_err_set(err, "%s: write failed", o->dump);
	if (lgf && fclose(lgf) != 0 && rc == 0)
		rc = rt_err_set(err, "%s: write failed", o->logits);
	return rc;
}

/* One report (or JSON line) per run, an error line for a run that failed; returns the
 * exit status. */
static int ppl_pass_report(const ppl_pass *pp, const rt_model *m, const rt_cli_opts *o,
                           const char *text, size_t len)
{
	char msha[65] = "", tsha[65] = "";
	if (o->json) {
		rt_cli_file_sha256(o->model, msha);
		rt_cli_buf_sha256(text, len, tsha);
	}
	int failed = 0;
	for (int i = 0; i < pp->K; i++) {
		const char *why = pp->sc[i].failed_at >= 0 ? pp->sc[i].error : NULL;
		if (!why) {
			ppl_report(&pp->runs[i], &pp->sc[i], m, o, msha, tsha, pp->n, pp->use,
			           pp->prompt_len, pp->block, pp->ref, pp->K + pp->ref);
			continue;
		}
		/* a run whose policy failed in the batch: the others are still reported */
		failed++;
		fprintf(stderr, "%s: %s\n", rt_cli_prog, why); /* why names the policy */
		if (o->json) {
			fputc('{', stdout);
			rt_cli_json_policy(stdout, &pp->runs[i].seq, pp->runs[i].o.ratio);
			fputs(",\"error\":", stdout);
			rt_json_str(stdout, why);
			fputs("}\n", stdout);
		}
	}
	return fflush(stdout) == 0 && !failed ? 0 : EXIT_FAILURE;
}

int rt_cmd_ppl(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', 't', O_CTX, O_CHUNK, O_JSON, O_DUMP, O_LOGITS, O_THREADS,
		O_POLICY, O_SET, O_RATIO, O_BYTERATIO, O_NOREF, O_PROMPTLEN, O_BATCH, O_SCOREFROM, O_EXACT, O_FAST,
		O_QUIET, O_PREFILL, O_KVTYPE, O_F32ACT, O_DEVICE, O_F16, 0 };
	rt_cli_opts o = { .chunk = RT_CLI_CHUNK, .prompt_len = -1, .exact = 1 };
	int rc = rt_cli_parse("ppl", help_ppl, argc, argv, &o, opt_ids,
	                      RT_CLI_NEED_MODEL | RT_CLI_NEED_TEXT);
	if (rc != RT_CLI_GO)
		return rc;
	if (o.batch && (o.dump || o.logits))
		return rt_cli_usage("ppl", "%s", "--dump and --logits write one run's tokens; they cannot "
		                 "be combined with --batch");
	ppl_pass pp = { .ref = !o.no_ref };
	if (!(pp.runs = rt_cli_runs("ppl", &o, &pp.K, &rc)))
		return rc;
	rt_cli_threads(o.threads);
	size_t len;
	char *text = rt_cli_read_text(o.text, &len);
	rt_cli_text_model tm = { 0 };
	rt_err err = { "" };
	rc = EXIT_FAILURE;
	if (!text)
		goto out;
	if ((rc = rt_cli_device_check("ppl", &o)) != 0)
		goto out;
	rc = EXIT_FAILURE;
	if (pp.K == 1 && !strcmp(pp.runs[0].p->name, "full"))
		pp.ref = 0;
	if (rt_cli_open_text_model(&o, text, len, &tm, &rc) < 0 ||
	    (rc = rt_cli_device_open("ppl", &o, tm.m)) != 0)
		goto out;
	rc = EXIT_FAILURE;
	pp.n = tm.n;
	pp.use = tm.use;
	if (pp.use < 2) {
		fprintf(stderr, "%s: %s: text has %lld token%s; perplexity needs at least 2\n", rt_cli_prog,
		        o.text, (long long)pp.n, pp.n == 1 ? "" : "s");
		goto out;
	}
	if (o.score_from >= pp.use) {
		fprintf(stderr, "%s: --score-from %ld: only %lld tokens are scored (positions "
		        "1..%lld)\n", rt_cli_prog, o.score_from, (long long)pp.use, (long long)pp.use - 1);
		rc = RT_CLI_USAGE;
		goto out;
	}
	if (ppl_pass_init(&pp, tm.m, &o, &err) != 0 || ppl_pass_run(&pp, &o, tm.ids, &err) != 0) {
		rt_cli_fail(&err);
		goto out;
	}
	rc = ppl_pass_report(&pp, tm.m, &o, text, len);
out:
	ppl_pass_free(&pp);
	rt_cli_device_close();
	rt_cli_text_model_free(&tm);
	free(text);
	return rc;
}

