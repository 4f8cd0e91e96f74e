/*
 * rt_cmd_ab: `BIN ab` — compare two compiled policies against the full cache and each
 * other (what `kvpc ab` runs); the options go through the shared table of rt_cli_opts and
 * the comparison is runtime/eval/rt_ab.c's.
 */
#include "cli/rt_cmd.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/rt_cli_meta.h"
#include "cli/rt_cli_opts.h"
#include "eval/rt_ab.h"
#include "eval/rt_ab_report.h"

static const char help_ab[] =
	"NAME\n"
	"    {prog} ab - compare two compiled policies (A, B) against the full cache and each other\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} ab --model M --text FILE [--a NAME] [--b NAME] [--ratio 2,4,8 | --byte-ratio 2,4,8]\n"
	"           [--task ppl|needle] [--ctx N] [--prompt N] [--score-from P] [--chunk N]\n"
	"           [--prefill-chunk C] [--threads N]\n"
	"           [--set k=v]... [--set-a k=v]... [--set-b k=v]...\n"
	"           [--json OUT] [--csv OUT] [--plot OUT.svg] [--resamples B] [--seed S]\n"
	"           [--lengths 1024,2048] [--depths 0,50,100] [--mode aware|agnostic]\n"
	"           [--equal-memory]\n"
	"    (normally started by `kvpc ab A.kvp B.kvp ...`, which builds this binary)\n"
	"\n"
	"DESCRIPTION\n"
	"    Loads the model once. For each compression ratio R the full-cache reference and\n"
	"    both policies (budget overridden to context / R entries per KV head; a policy that\n"
	"    never compresses keeps every token; with --byte-ratio, overridden to 1/R of the\n"
	"    bytes of an f16 full cache per KV head, as --byte-ratio of ppl, and the tables,\n"
	"    --json (\"ratio_kind\": \"bytes\"), --csv (column ratio_kind) and --plot say so)\n"
	"    run over the same tokens, chunk by chunk in\n"
	"    lockstep, and every token's distribution is compared with the reference's.\n"
	"    task ppl (default): perplexity of the first N tokens of FILE under one\n"
	"    measurement protocol for both sides (docs/measuring.md), compiled from the\n"
	"    policies' triggers: when either side compresses at the prompt end (snapkv,\n"
	"    pyramidkv, ...) the first N/2 tokens are the prompt (budget N/2 / R entries per KV\n"
	"    head) and the tokens after it are scored; otherwise all N tokens are the prompt\n"
	"    (budget N / R from the first token on) and every token is scored; --prompt and\n"
	"    --score-from choose. It shows ppl, kld_mean, kld_p99, kld_max, ppl_ratio,\n"
	"    same_top1, rms_dp (llama.cpp's --kl-divergence statistics), kv_entries_peak,\n"
	"    kv_bytes_peak, the compression each side reached (in entries and in bytes against\n"
	"    an f16 full cache, at the end and at peak, and with a prompt its compression at\n"
	"    its compress: the one definition every command uses), tokens_per_s,\n"
	"    compress_events and policy_seconds; then the paired circular\n"
	"    block bootstrap 95% CI of the mean per-token NLL difference B - A over the scored\n"
	"    tokens (block length by Politis & White 2004) and a verdict. The verdict names no\n"
	"    winner when the sides' compression in bytes at the end (their memory), or for two\n"
	"    prompt-end policies their prompts' after the compress, differs by more than 10%\n"
	"    or a side compressed before none of the scored tokens:\n"
	"    quality at unequal memory says nothing about the policies. How to read it:\n"
	"    docs/measuring.md, \"Reading an A/B verdict\".\n"
	"    task needle: passkey retrieval (prompt built to exact token lengths, greedy answer,\n"
	"    exact match) for every length x depth; accuracy per policy and an exact sign\n"
	"    (McNemar) test on the discordant trials.\n"
	"\n"
	"OPTIONS\n"
	"    --model M          GGUF model\n"
	"    --text FILE        the text (task ppl; UTF-8, .gz is decompressed)\n"
	"    --a NAME, --b NAME the policies (default: the binary's first two, or the only one)\n"
	"    --ratio LIST       compression ratios in entries, each >= 1 (default 4)\n"
	"    --byte-ratio LIST  or in bytes against an f16 full cache, each >= 1\n"
	"    --task ppl|needle  what to measure (default ppl)\n"
	"    --ctx N            tokens of the text to use (default all, up to context_length)\n"
	"    --prompt N         task ppl: the first N tokens are the prompt (prompt-end\n"
	"                       triggers fire after it, ratio budgets are N / R), scored from\n"
	"                       N + 1 (default: the protocol above)\n"
	"    --score-from P     task ppl: score the tokens at positions >= P\n"
	"    --equal-memory     task ppl, --ratio: at each R the side that would compress more\n"
	"                       runs at the ratio that holds what the other holds at the end\n"
	"                       at R (a prompt-end policy appends every token after its\n"
	"                       prompt, a streaming one holds N / R), so the verdict compares\n"
	"                       equal memory; each side's ratio is in the table and JSON\n"
	"    --chunk N          tokens per forward chunk (default 512; results do not depend on it)\n"
	"    --prefill-chunk C  chunked prefill for both sides (as for ppl): prompt chunks of up\n"
	"                       to C tokens cross a per-step policy's triggers; default 0, the\n"
	"                       exact schedule (results then do not depend on --chunk)\n"
	"    --threads N        BLAS threads (default: OPENBLAS_NUM_THREADS or all cores)\n"
	"    --kv-type f32      KV storage; ab runs the exact path, which stores f32 (f16 and\n"
	"                       q8_0 are refused)\n"
	"    --quiet            no progress on stderr (otherwise a bar with tok/s and ETA on a\n"
	"                       terminal, a line per tenth of the run elsewhere)\n"
	"    -h, --help, --version\n"
	"    --set k=v          parameter override for every policy that has k\n"
	"    --set-a k=v, --set-b k=v   override for one side only\n"
	"    --json OUT         write the report as one JSON object (meta + results)\n"
	"    --csv OUT          write one row per ratio and policy (metadata in columns)\n"
	"    --plot OUT.svg     one SVG with a panel per metric against the ratio\n"
	"    --resamples B      bootstrap resamples (default 1000); --seed S its seed\n"
	"    --lengths LIST     needle: prompt lengths in tokens (default 1024,2048)\n"
	"    --depths LIST      needle: depths in percent (default 0,25,50,75,100)\n"
	"    --mode M           needle: aware (the question inside the compressed prompt)\n"
	"                       or agnostic (compress before it); default, as for `needle`:\n"
	"                       agnostic when a side compresses at the prompt end, else aware\n"
	"    --commit C, --source-sha256-a HEX, --source-sha256-b HEX   metadata (set by kvpc ab)\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error (\"ab: PATH: reason\" on stderr), 2 usage error.\n";

/* The comma lists: ratios (each >= 1), lengths (whole numbers >= 16), depths (0..100). */
static int ab_lists(const rt_cli_opts *c, rt_ab_opts *o)
{
	double v[RT_CLI_MAX_LIST];
	int n;
	if (c->ratio_list && c->byte_ratio_list)
		return rt_cli_usage("ab", "%s", "--ratio LIST counts entries and --byte-ratio LIST "
		                    "bytes; give one of them");
	const char *rl = c->ratio_list ? c->ratio_list : c->byte_ratio_list;
	if (rl) {
		o->bytes = c->byte_ratio_list != NULL;
		if (rt_parse_ratio_list(rl, v, &n))
			return rt_cli_usage("ab", "%s: '%s' is not a comma list of at most %d "
			                    "compression factors >= 1", o->bytes ? "--byte-ratio" : "--ratio",
			                    rl, RT_AB_MAX_RATIOS);
		memcpy(o->ratios, v, (size_t)n * sizeof *v);
		o->n_ratios = n;
	}
	if (c->lengths) {
		if (rt_parse_list(c->lengths, 16, 1e7, 1, v, 16, &n))
			return rt_cli_usage("ab", "--lengths: '%s' is not a comma list of at most 16 token "
			                    "counts in 16..10000000", c->lengths);
		for (int i = 0; i < n; i++)
			o->lengths[i] = (int64_t)v[i];
		o->n_lengths = n;
	}
	if (c->depths) {
		if (rt_parse_list(c->depths, 0, 100, 0, v, 16, &n))
			return rt_cli_usage("ab", "--depths: '%s' is not a comma list of at most 16 "
			                    "percentages in 0..100", c->depths);
		memcpy(o->depths, v, (size_t)n * sizeof *v);
		o->n_depths = n;
	}
	return 0;
}

/* --set (both sides, skipped by a policy without the name), --set-a, --set-b, in order. */
static int ab_sets(const rt_cli_opts *c, rt_ab_opts *o)
{
	for (int i = 0; i < c->n_sets; i++)
		for (int s = 0; s < 2; s++) {
			if (c->set_side[i] && c->set_side[i] != s + 1)
				continue;
			if (o->n_sets[s] >= RT_AB_MAX_SETS)
				return rt_cli_usage("ab", "--set: more than %d overrides", RT_AB_MAX_SETS);
			o->set_all[s][o->n_sets[s]] = c->set_side[i] == 0;
			o->sets[s][o->n_sets[s]++] = c->sets[i];
		}
	return 0;
}

int rt_cmd_ab(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', 't', O_A, O_B, O_RATIOS, O_BYTERATIOS, O_ABTASK, O_CTX, O_CHUNK,
		O_THREADS, O_SET, O_SETA, O_SETB, O_JSONOUT, O_CSV, O_PLOT, O_RES, O_SEED64,
		O_LENGTHS, O_DEPTHS, O_MODE, O_COMMIT, O_SHAA, O_SHAB, O_QUIET, O_PREFILL, O_KVTYPE,
		O_PROMPTLEN, O_SCOREFROM, O_EQMEM, 0 };
	rt_ab_opts o;
	rt_ab_opts_init(&o);
	rt_cli_opts c = { .chunk = o.chunk, .resamples = o.resamples, .exact = 1, .prompt_len = -1 };
	int rc = rt_cli_parse("ab", help_ab, argc, argv, &c, opt_ids, 1);
	if (rc != RT_CLI_GO)
		return rc;
	if ((rc = ab_lists(&c, &o)) != 0 || (rc = ab_sets(&c, &o)) != 0)
		return rc;
	o.model = c.model;
	o.text = c.text;
	o.name[0] = c.name_a;
	o.name[1] = c.name_b;
	if (c.ab_task)
		o.task = c.ab_task;
	if (c.mode_given)
		o.mode = c.mode_agnostic ? "agnostic" : "aware";
	o.equal_memory = c.equal_memory;
	o.ctx = c.ctx;
	o.prompt = c.prompt_len >= 1 ? c.prompt_len : -1;
	o.score_from = c.score_from >= 1 ? c.score_from : -1;
	if (o.equal_memory && (strcmp(o.task, "ppl") || c.byte_ratio_list))
		return rt_cli_usage("ab", "%s", "--equal-memory matches compression ratios in entries "
		                    "(--ratio) of --task ppl");
	if ((o.prompt > 0 || o.score_from > 0) && strcmp(o.task, "ppl"))
		return rt_cli_usage("ab", "%s", "--prompt and --score-from split the text of --task "
		                    "ppl; a needle prompt is its own");
	o.chunk = (int)c.chunk;
	o.prefill_chunk = (int)c.prefill_chunk;
	o.threads = (int)c.threads;
	o.resamples = (int)c.resamples;
	if (c.seed64_set)
		o.seed = c.seed64;
	o.json = c.json_out;
	o.csv = c.csv;
	o.plot = c.plot;
	/* one file per report: two written to one path would leave only the last */
	const char *outs[3][2] = { { "--json", o.json }, { "--csv", o.csv }, { "--plot", o.plot } };
	for (int i = 0; i < 3; i++)
		for (int k = i + 1; k < 3; k++)
			if (outs[i][1] && outs[k][1] && !strcmp(outs[i][1], outs[k][1]))
				return rt_cli_usage("ab", "%s and %s both write %s: give each report its own "
				                    "file", outs[i][0], outs[k][0], outs[i][1]);

	o.commit = c.commit ? c.commit : rt_cli_commit(); /* the build's, as ppl's JSON records */
	o.sha[0] = c.sha_a;
	o.sha[1] = c.sha_b;
	o.quiet = c.quiet;
	if (!strcmp(o.task, "ppl") && !o.text)
		return rt_cli_usage("ab", "%s", "--text is required for --task ppl");
	return rt_ab_run(&o, rt_cli_reg, rt_cli_n_reg, rt_ab_report_write);
}
