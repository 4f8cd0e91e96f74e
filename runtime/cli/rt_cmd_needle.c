/*
 * rt_cmd_needle: `needle` — passkey / needle-in-a-haystack retrieval under policies; the
 * man page is help_needle below.
 */
#include "cli/rt_cmd.h"

#include "base/rt_progress.h"
#include "base/rt_text.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/rt_cli_input.h"
#include "cli/rt_cli_meta.h"
#include "cli/rt_cli_opts.h"
#include "cli/rt_cli_runs.h"
#include "eval/rt_compression.h"
#include "eval/rt_eval.h"
#include "eval/rt_needle.h"
#include "report/rt_json.h"

static const char *const help_needle =
	"NAME\n"
	"    {prog} needle - long-context retrieval accuracy under a KV-cache policy\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} needle --model MODEL [--task passkey|niah|multikey|instruct]\n"
	"             [--haystack FILE]\n"
	"             [--lengths L,...] [--depths D,...] [--policy NAME] [--set NAME=VALUE]...\n"
	"             [--ratio R] [--mode aware|agnostic] [--gen N] [--seed S] [--chat]\n"
	"             [--chunk N] [--threads N] [--json] [--batch RUNS] [--mark-question]\n"
	"\n"
	"DESCRIPTION\n"
	"    For every length L and depth D builds a prompt of exactly L tokens with the\n"
	"    model's tokenizer (rt_needle): passkey (Mohtashami & Jaggi 2023: filler text\n"
	"    with \"The pass key is K\" at D% of it, K from the seed, length and depth) or\n"
	"    niah (a real text, by default the Info manual of coreutils, with the San\n"
	"    Francisco needle at D%), multikey (four pass keys of the north, south, east\n"
	"    and west doors in the filler, the one asked at D%, the others distractors) or\n"
	"    instruct (the chat template's system message gives three instructions: say\n"
	"    your name is NAME, mention your pet PET, mention the city CITY; the filler\n"
	"    follows and the user asks \"Tell me about yourself.\"; NAME, PET and CITY\n"
	"    drawn from the seed, D only varies the seed). The context is prefilled under\n"
	"    the policy, then the answer is generated greedily (--gen tokens, default 8 for\n"
	"    passkey and multikey, 20 for niah, 48 for instruct) and scored by exact match\n"
	"    (the first number equals the key asked; both \"sandwich\" and \"Dolores\n"
	"    Park\" present). instruct checks each instruction by its word in the answer\n"
	"    and is scored against the full cache, run beside the policies on every\n"
	"    prompt: a trial is correct when the answer follows every instruction the full\n"
	"    cache's answer follows, and the accuracy is the instructions followed out of\n"
	"    those the full cache follows (a small model does not follow all three even\n"
	"    with its whole context). Modes (kvpress's distinction): aware puts the\n"
	"    question inside the compressed prompt; agnostic compresses the context first\n"
	"    (the prompt ends before the question) and appends the question after, the\n"
	"    default for a prompt-end policy (aware for a streaming one).\n"
	"    In aware mode the first answer token comes from the prefill's last position,\n"
	"    computed before the prompt-end compression (as kvpress's presses compress\n"
	"    during the prefill forward); every later token sees the compressed cache.\n"
	"    With --mark-question the question's tokens (with the answer's opening) are\n"
	"    marked as the protected span `question`: a policy with `keep span question`\n"
	"    keeps them exactly, and GraceKV probes the cache with them (otherwise with its\n"
	"    `question` parameter's prompt tail). In instruct the system message is the\n"
	"    span `system`, as serve marks a chat's (by position: the prompt is fed\n"
	"    whole either way), so a policy with `keep span system` keeps the\n"
	"    instructions.\n"
	"    Prints a table of 1/0 per length and depth and the accuracy.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL   GGUF model file\n"
	"    --task T            passkey (default), niah, multikey or instruct\n"
	"    --haystack FILE     niah text (plain or .gz; default\n"
	"                        /usr/share/info/coreutils.info.gz, from its second node)\n"
	"    --lengths LIST      comma-separated prompt lengths in tokens (default\n"
	"                        1024,2048,4096)\n"
	"    --depths LIST       comma-separated depths in percent (default 0,25,50,75,100)\n"
	"    --policy NAME       policy (default {policy}); --set, --ratio, --byte-ratio as for ppl\n"
	"    --mode M            aware or agnostic; default: agnostic when a policy\n"
	"                        compresses at the prompt end (it cannot see the question,\n"
	"                        as a cache reused for later questions), else aware; a\n"
	"                        batch runs in one mode, agnostic when any of its policies\n"
	"                        compresses at the prompt end (a note names the streaming\n"
	"                        ones it moves)\n"
	"    --gen N             answer tokens to generate\n"
	"    --seed S            passkey seed (default 1); the key of (L, D) is drawn from\n"
	"                        seed + 1000003 L + D\n"
	"    --chat              wrap the prompt in the model's chat template\n"
	"    --chunk N, --threads N, --fast, --f32-act, --kv-type T, -h/--help  as for ppl\n"
	"    --mark-question     mark the question as the protected span `question`\n"
	"    --quiet             no progress on stderr (a bar with the trials' speed and ETA on a\n"
	"                        terminal, a line per tenth of the trials elsewhere)\n"
	"    --batch RUNS        several runs (`POLICY [--ratio R] [--set NAME=VALUE]...\n"
	"                        [--kv-type T]` per line, as for ppl) on the same prompts:\n"
	"                        each prompt is prefilled for all runs in lockstep (one\n"
	"                        weight pass per chunk), then each run generates its own\n"
	"                        answer; one report or JSON object per run, in file order\n"
	"    --json              one JSON object: policy, params, ratio, task, mode, model,\n"
	"                        model_sha256, commit, results [{length, depth, answer,\n"
	"                        generated, correct, kv_entries_peak, compress_events,\n"
	"                        compression, bytes_compression, compression_peak,\n"
	"                        bytes_compression_peak}], accuracy, policy_seconds (over\n"
	"                        every trial) and the same compression figures, the means\n"
	"                        over the trials (after the answer, over the tokens seen: the\n"
	"                        one definition of docs/measuring.md, \"Compression\");\n"
	"                        instruct adds per result checks and checks_ref (bit i: the\n"
	"                        run's and the full cache's answers follow instruction i)\n"
	"                        and per run followed and followed_ref (their sums of bits\n"
	"                        in common and of the full cache's), accuracy their ratio\n"
	"                        (null when the full cache followed none)\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success (whatever the accuracy), 1 runtime error, 2 usage error.\n";

/* Everything one `needle` command holds. */
typedef struct needle_job {
	rt_cli_opts o;
	double lens[RT_CLI_MAX_LIST], deps[RT_CLI_MAX_LIST];
	int n_len, n_dep, K;
	int KR;                /* sequences per trial: the K runs, and the full cache for instruct */
	rt_seq ref;            /* instruct: the full cache its checks are read against */
	int ref_ready;
	int64_t n_gen;
	int chunk;             /* the prompt chunk used: --chunk, bounded in a batch */
	rt_cli_run *runs;
	rt_tokenizer *tk;
	rt_model *m;
	char *hay;
	size_t hay_len, hay_off;
	float *logits, *one;
	rt_seq **all;
	rt_seq_batch b;
	rt_needle_answer *res; /* [(length·n_dep + depth)·KR + run]; run K is the reference */
	int warned_sys;        /* the system message's placement warning was printed */
} needle_job;

/* Haystack, model, length check, sequences and batch. Returns 0, or the exit status after
 * printing the error. */
static int needle_setup(needle_job *nj)
{
	const rt_cli_opts *o = &nj->o;
	rt_err err = { "" };
	rt_gguf *g = NULL;
	if (o->task == RT_NEEDLE_NIAH) {
		const char *path = o->haystack ? o->haystack : "/usr/share/info/coreutils.info.gz";
		if (!(nj->hay = rt_text_read(path, &nj->hay_len, &err)))
			return rt_cli_fail(&err);
		nj->hay_off = rt_needle_info_body(nj->hay, nj->hay_len);
	}
	int orc = rt_cli_open_model(o->model, o, &g, &nj->tk, &nj->m);
	rt_gguf_close(g);
	if (orc < 0)
		return EXIT_FAILURE;
	const rt_model *m = nj->m;
	int64_t max_len = 0;
	for (int i = 0; i < nj->n_len; i++) {
		if ((int64_t)nj->lens[i] + nj->n_gen > m->hp.n_ctx) {
			fprintf(stderr, "%s: %s: length %lld plus %lld answer tokens exceed the model's "
			        "context_length %d\n", rt_cli_prog, o->model, (long long)nj->lens[i],
			        (long long)nj->n_gen, (int)m->hp.n_ctx);
			return RT_CLI_USAGE;
		}
		if ((int64_t)nj->lens[i] > max_len)
			max_len = (int64_t)nj->lens[i];
	}
	const int V = m->hp.n_vocab, K = nj->K, KR = nj->KR;
	if (!o->mode_given) { /* the protocol the policies call for (rt_eval_needle_agnostic) */
		const struct kvp_policy **ps = RT_MALLOC((size_t)K * sizeof *ps);
		for (int i = 0; i < K; i++)
			ps[i] = nj->runs[i].p;
		nj->o.mode_agnostic = rt_eval_needle_agnostic(ps, K);
		free(ps);
		/* one mode for the whole batch: say so when it is not a run's own */
		for (int i = 0; nj->o.mode_agnostic && !o->quiet && i < K; i++) {
			const struct kvp_policy *p = nj->runs[i].p;
			if (p->compress && p->measure != KVP_MEASURE_PROMPT_END)
				fprintf(stderr, "%s: needle: note: %s is a streaming policy measured in "
				        "agnostic mode, the batch's one mode (a prompt-end policy in it sets "
				        "it); alone it would run aware: give --mode, or batch it apart\n",
				        rt_cli_prog, p->name);
		}
	}
	/* prompt chunk: a batch stacks K × chunk rows, so it is bounded as in ppl */
	int chunk = (int)o->chunk;
	if (KR > 1 && chunk > 512 / KR)
		chunk = 512 / KR < 1 ? 1 : 512 / KR;
	nj->chunk = chunk;
	if (!(nj->all = calloc((size_t)KR, sizeof *nj->all)) ||
	    !(nj->res = calloc((size_t)KR * nj->n_len * nj->n_dep, sizeof *nj->res)) ||
	    !(nj->logits = malloc((size_t)KR * V * sizeof *nj->logits)) ||
	    !(nj->one = malloc((size_t)V * sizeof *nj->one))) {
		fprintf(stderr, "%s: out of memory\n", rt_cli_prog);
		return EXIT_FAILURE;
	}
	for (int i = 0; i < K; i++) {
		rt_cli_run *r = &nj->runs[i];
		if (rt_seq_init_typed(&r->seq, m, r->p, rt_cli_run_kv_type(r, m),
		                      rt_cli_run_cap(r, max_len, nj->n_gen), chunk, -1, &err) != 0 ||
		    rt_cli_seq_apply(&r->seq, &r->o, &err) != 0)
			return rt_cli_fail(&err);
		nj->all[i] = &r->seq;
		rt_seq_use_spans(nj->all[i]);
	}
	if (KR > K) { /* the full cache in the command's store, the reference of instruct */
		if (rt_seq_init_typed(&nj->ref, m, &rt_policy_full, m->kv_type,
		                      (int32_t)(max_len + nj->n_gen), chunk, -1, &err) != 0)
			return rt_cli_fail(&err);
		nj->ref_ready = 1;
		nj->all[K] = &nj->ref;
		rt_seq_use_spans(nj->all[K]); /* a trial marks spans on every sequence */
	}
	if (KR > 1 && rt_seq_batch_init(&nj->b, nj->all, KR, chunk, &err) != 0)
		return rt_cli_fail(&err);
	return 0;
}

/* The prompt of trial (length i, depth j) for the command's task. */
static int needle_prompt(const needle_job *nj, int i, int j, rt_needle_prompt *np, rt_err *err)
{
	const rt_cli_opts *o = &nj->o;
	const int64_t len = (int64_t)nj->lens[i];
	const uint64_t seed = (uint64_t)o->seed + 1000003ull * (uint64_t)len + (uint64_t)nj->deps[j];
	switch (o->task) {
	case RT_NEEDLE_NIAH:
		return rt_needle_niah(nj->tk, nj->hay + nj->hay_off, nj->hay_len - nj->hay_off, len,
		                      nj->deps[j], o->chat, np, err);
	case RT_NEEDLE_MULTIKEY:
		return rt_needle_multikey(nj->tk, len, nj->deps[j], seed, o->chat, np, err);
	case RT_NEEDLE_INSTRUCT:
		return rt_needle_instruct(nj->tk, len, seed, np, err);
	}
	return rt_needle_passkey(nj->tk, len, nj->deps[j], seed, o->chat, np, err);
}

/* One trial (length i, depth j) for every run (and the reference). For instruct a run's
 * answer is correct when it follows every instruction the full cache's answer follows. */
static int needle_one(needle_job *nj, int i, int j, rt_err *err)
{
	const rt_cli_opts *o = &nj->o;
	rt_needle_prompt np;
	if (needle_prompt(nj, i, j, &np, err) != 0)
		return -1;
	/* a multi-instruction prompt's system message is the span `system`, as serve marks a
	 * chat's; marked by position, so the feed is the same with or without it. A failed
	 * placement matters only to a run that keeps spans. */
	int spans = 0;
	for (int k = 0; k < nj->K; k++)
		spans |= (nj->runs[k].p->needs & KVP_NEED_SPANS) != 0;
	if (spans && np.kind == RT_NEEDLE_INSTRUCT && np.sys_len == 0 && !nj->warned_sys++)
		fprintf(stderr, "%s: warning: the system message's tokens could not be placed in "
		        "this model's chat opening; it is not marked as the span `system`\n",
		        rt_cli_prog);
	const rt_needle_how how = { .agnostic = o->mode_agnostic, .mark_question = o->mark_question,
		                    .mark_system = np.kind == RT_NEEDLE_INSTRUCT, .n_gen = nj->n_gen };
	rt_needle_answer *ans = &nj->res[((size_t)i * nj->n_dep + j) * nj->KR];
	int rc = rt_needle_trial(nj->all, nj->KR, nj->KR > 1 ? &nj->b : NULL, nj->tk, &np, &how,
	                         nj->logits, nj->one, ans, err);
	rt_needle_prompt_free(&np);
	if (rc == 0 && nj->KR > nj->K) {
		int f = 0, fr = 0; /* summed again by the report */
		for (int k = 0; k < nj->K; k++)
			ans[k].correct = !ans[k].left &&
			                 rt_needle_instruct_vs_ref(ans[k].checks, ans[nj->K].checks, &f, &fr);
	}
	return rc;
}

/* The task's name, as --task spells it. */
static const char *task_name(int task)
{
	static const char *const names[] = { "passkey", "niah", "multikey", "instruct" };
	return names[task];
}

/* Every trial, with the 1/0 table on stdout for one run without --json. */
static int needle_trials(needle_job *nj)
{
	const int table = !nj->o.json && nj->K == 1;
	rt_err err = { "" };
	rt_progress prog;
	/* every prompt first: a length too short for a task's fixed parts (which vary with
	 * the key and the depth) is refused before any output or forward */
	for (int i = 0; i < nj->n_len; i++)
		for (int j = 0; j < nj->n_dep; j++) {
			rt_needle_prompt np;
			if (needle_prompt(nj, i, j, &np, &err) != 0) /* the option's value: usage */
				return rt_cli_usage("needle", "--lengths %lld at depth %g: %s",
				                    (long long)nj->lens[i], nj->deps[j], err.msg);
			rt_needle_prompt_free(&np);
		}
	/* on a terminal the 1/0 table, drawn as the trials finish, is the progress */
	rt_progress_init(&prog, "needle", "trials", (int64_t)nj->n_len * nj->n_dep,
	                 nj->o.quiet || (table && isatty(fileno(stderr))));
	if (table) {
		printf("%s under %s (%s mode%s), exact match per length and depth (%%)\n",
		       task_name(nj->o.task), nj->runs[0].p->name,
		       nj->o.mode_agnostic ? "agnostic" : "aware",
		       nj->o.mode_given ? "" : nj->o.mode_agnostic
		       ? ": a prompt-end policy, the question follows the compressed context"
		       : ": a streaming policy, the question inside the prompt");
		printf("%8s", "length");
		for (int j = 0; j < nj->n_dep; j++)
			printf(" %6g", nj->deps[j]);
		printf("   acc\n");
	}
	for (int i = 0; i < nj->n_len; i++) {
		int row_ok = 0;
		if (table)
			printf("%8lld", (long long)nj->lens[i]);
		for (int j = 0; j < nj->n_dep; j++) {
			if (needle_one(nj, i, j, &err) != 0) {
				rt_progress_end(&prog);
				if (table)
					putchar('\n');
				return rt_cli_fail(&err);
			}
			rt_progress_update(&prog, (int64_t)i * nj->n_dep + j + 1);
			if (table) {
				int ok = nj->res[((size_t)i * nj->n_dep + j) * nj->KR].correct; /* K == 1 */
				row_ok += ok;
				printf(" %6d", ok);
				fflush(stdout);
			}
		}
		if (table)
			printf("  %.2f\n", (double)row_ok / nj->n_dep);
	}
	rt_progress_end(&prog);
	return 0;
}

/* Run k's compression after the answers (rt_compression.h), the mean over its trials. */
static void needle_mean_x(const needle_job *nj, int k, rt_compression *x)
{
	const int total = nj->n_len * nj->n_dep;
	memset(x, 0, sizeof *x);
	for (int q = 0; q < total; q++)
		rt_compression_add(x, &nj->res[(size_t)q * nj->KR + k].x, total);
}

/* Run k's JSON object. */
static void needle_json(const needle_job *nj, int k, const char *msha, int correct, int total)
{
	/* the seed, answer length and prompt chunk as used: with the model and the grid, what
	 * remakes the prompts and the schedule */
	printf(",\"task\":\"%s\",\"mode\":\"%s\",\"mode_from\":\"%s\",\"seed\":%ld,"
	       "\"gen\":%lld,\"chunk\":%d,\"model\":",
	       task_name(nj->o.task), nj->o.mode_agnostic ? "agnostic" : "aware",
	       nj->o.mode_given ? "--mode" : "protocol", nj->o.seed, (long long)nj->n_gen,
	       nj->chunk);
	rt_json_str(stdout, nj->m->path);
	if (msha[0]) {
		fputs(",\"model_sha256\":", stdout);
		rt_json_str(stdout, msha);
	}
	printf(",\"batch\":%d,\"results\":[", nj->K);
	double policy_s = 0;
	const int instruct = nj->KR > nj->K;
	int followed = 0, followed_ref = 0;
	for (int i = 0; i < nj->n_len; i++)
		for (int j = 0; j < nj->n_dep; j++) {
			const rt_needle_answer *nr = &nj->res[((size_t)i * nj->n_dep + j) * nj->KR + k];
			printf("%s{\"length\":%lld,\"depth\":%g,\"answer\":", i + j ? "," : "",
			       (long long)nj->lens[i], nj->deps[j]);
			rt_json_str(stdout, nr->answer);
			fputs(",\"generated\":", stdout);
			rt_json_str(stdout, nr->gen);
			printf(",\"correct\":%s,\"kv_entries_peak\":%lld,\"compress_events\":%lld",
			       nr->correct ? "true" : "false", (long long)nr->st.kv_entries_peak,
			       (long long)nr->st.compress_events);
			if (instruct) {
				const unsigned ref = nr[nj->K - k].checks;
				printf(",\"checks\":%u,\"checks_ref\":%u", nr->checks, ref);
				rt_needle_instruct_vs_ref(nr->checks, ref, &followed, &followed_ref);
			}
			policy_s += nr->st.policy_seconds;
			rt_compression_json(stdout, &nr->x);
			fputc('}', stdout);
		}
	rt_compression x;
	needle_mean_x(nj, k, &x);
	if (!instruct)
		printf("],\"accuracy\":%.6g", (double)correct / total);
	else if (followed_ref)
		printf("],\"followed\":%d,\"followed_ref\":%d,\"accuracy\":%.6g", followed,
		       followed_ref, (double)followed / followed_ref);
	else
		printf("],\"followed\":0,\"followed_ref\":0,\"accuracy\":null");
	printf(",\"policy_seconds\":%.6g", policy_s);
	rt_compression_json(stdout, &x);
	fputs("}\n", stdout);
}

/* A batch run's text report (K > 1): its budget as given ("ratio R", "byte ratio R" or its
 * own), accuracy and compression, then its 1/0 answers per length at the depths of the
 * header needle_report printed. */
static void needle_batch_run(const needle_job *nj, int k, int correct, int total)
{
	const rt_cli_run *r = &nj->runs[k];
	char budget[48];
	if (r->o.byte_ratio > 0)
		snprintf(budget, sizeof budget, "byte ratio %g", r->o.byte_ratio);
	else if (r->o.ratio > 0)
		snprintf(budget, sizeof budget, "ratio %g", r->o.ratio);
	else
		snprintf(budget, sizeof budget, "its own budget");
	rt_compression x;
	needle_mean_x(nj, k, &x);
	printf("%s%s at %s: accuracy %d/%d = %.3f, compression %.2fx in entries, %.2fx in bytes "
	       "at the end, %.2fx, %.2fx at peak\n", r->p->name, r->o.n_sets ? " (with --set)" : "",
	       budget, correct, total, (double)correct / total, x.entries_end, x.bytes_end,
	       x.entries_peak, x.bytes_peak);
	for (int i = 0; i < nj->n_len; i++) {
		printf("  %8lld", (long long)nj->lens[i]);
		for (int j = 0; j < nj->n_dep; j++)
			printf(" %6d", nj->res[((size_t)i * nj->n_dep + j) * nj->KR + k].correct);
		putchar('\n');
	}
}

/* Accuracy lines or JSON objects per run; returns the exit status. */
static int needle_report(const needle_job *nj)
{
	char msha[65] = "";
	if (nj->o.json)
		rt_cli_file_sha256(nj->o.model, msha);
	int failed = 0, K = nj->K;
	if (K > 1 && !nj->o.json) {
		printf("%s, %d runs in lockstep (%s mode), exact match per length and depth\n  %8s",
		       task_name(nj->o.task), K, nj->o.mode_agnostic ? "agnostic" : "aware", "length");
		for (int j = 0; j < nj->n_dep; j++)
			printf(" %6g", nj->deps[j]);
		putchar('\n');
	}
	for (int k = 0; k < K; k++) {
		const rt_cli_run *r = &nj->runs[k];
		const char *why = nj->KR > 1 ? rt_seq_batch_error(&nj->b, k) : NULL;
		int correct = 0, total = nj->n_len * nj->n_dep;
		for (int q = 0; q < total; q++)
			correct += nj->res[(size_t)q * nj->KR + k].correct;
		if (why) {
			failed++;
			fprintf(stderr, "%s: %s\n", rt_cli_prog, why); /* why names the policy */
		}
		if (!nj->o.json) {
			rt_compression x;
			needle_mean_x(nj, k, &x);
			if (K > 1 && !why)
				needle_batch_run(nj, k, correct, total);
			else if (!why)
				printf("accuracy %d/%d = %.3f\n(after the answers, mean over the trials; "
				       "docs/measuring.md)\n", correct, total, (double)correct / total);
			if (!why && K == 1)
				rt_compression_table(stdout, &x);
			continue;
		}
		fputc('{', stdout);
		rt_cli_json_policy(stdout, &r->seq, r->o.ratio);
		if (why) {
			fputs(",\"error\":", stdout);
			rt_json_str(stdout, why);
			fputs("}\n", stdout);
			continue;
		}
		needle_json(nj, k, msha, correct, total);
	}
	return fflush(stdout) == 0 && !failed ? 0 : EXIT_FAILURE;
}

int rt_cmd_needle(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', O_HAYSTACK, O_LENGTHS, O_DEPTHS, O_POLICY, O_SET, O_RATIO, O_BYTERATIO,
		O_MODE, O_TASK, O_GEN, O_SEED, O_CHAT, O_CHUNK, O_THREADS, O_BATCH, O_MARKQ, O_JSON,
		O_EXACT, O_FAST, O_QUIET, O_KVTYPE, O_F32ACT, 0 };
	needle_job nj = { .o = { .chunk = RT_CLI_CHUNK, .seed = 1, .exact = 1,
		                 .lengths = "1024,2048,4096",
		                 .depths = "0,25,50,75,100" } };
	rt_cli_opts *o = &nj.o;
	int rc = rt_cli_parse("needle", help_needle, argc, argv, o, opt_ids, 1);
	if (rc != RT_CLI_GO)
		return rc;
	if (rt_parse_list(o->lengths, 16, 1 << 24, 1, nj.lens, RT_CLI_MAX_LIST, &nj.n_len))
		return rt_cli_usage("needle", "--lengths: '%s' is not a comma-separated list of token "
		                    "counts, each a whole number in 16..16777216", o->lengths);
	if (rt_parse_list(o->depths, 0, 100, 0, nj.deps, RT_CLI_MAX_LIST, &nj.n_dep))
		return rt_cli_usage("needle", "--depths: '%s' is not a comma-separated list of "
		                    "percentages in 0..100", o->depths);
	if (o->haystack && o->task != RT_NEEDLE_NIAH)
		return rt_cli_usage("needle", "%s", "--haystack needs --task niah");
	if (!(nj.runs = rt_cli_runs("needle", o, &nj.K, &rc)))
		return rc;
	nj.n_gen = o->n_gen ? o->n_gen
	         : o->task == RT_NEEDLE_NIAH ? 20 : o->task == RT_NEEDLE_INSTRUCT ? 48 : 8;
	nj.KR = nj.K + (o->task == RT_NEEDLE_INSTRUCT);
	rt_cli_threads(o->threads);
	rc = needle_setup(&nj);
	if (rc == 0)
		rc = needle_trials(&nj);
	if (rc == 0)
		rc = needle_report(&nj);
	rt_cli_runs_free(nj.runs, nj.K);
	rt_seq_batch_free(&nj.b);
	free(nj.all);
	free(nj.res);
	free(nj.logits);
	free(nj.one);
	free(nj.hay);
	if (nj.ref_ready)
		rt_seq_free(&nj.ref);
	rt_model_free(nj.m);
	rt_tokenizer_free(nj.tk);
	return rc;
}
