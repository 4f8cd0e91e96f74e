/*
 * rt_ab: the A/B comparison of two compiled policies inside a per-deployment binary
 * (`BIN ab`, started by `kvpc ab`). It loads the model once and, for each
 * compression ratio R, runs three sequences over the same tokens in lockstep, chunk by
 * chunk: the full-cache reference P and the two policies A and B (each with its budget
 * overridden to context / R, rt_run_set_ratio). Every chunk's logits are compared at once
 * (rt_stats_token_cmp), so per-token KL against the reference needs no logits buffer
 * beyond one chunk per sequence; all ratios advance together, so the reference runs once.
 *
 * Task ppl measures under one protocol for both sides (rt_eval_split_of: a prompt-end
 * policy on either side puts the first half of the text in the prompt and scores the tokens
 * after it; --prompt N / --score-from P choose). Reported per ratio and policy: ppl,
 * kld_mean, kld_p99, kld_max, ppl_ratio, same_top1, rms_dp (llama.cpp's `llama-perplexity
 * --kl-divergence` statistics, see runtime/eval/rt_stats.h), kv_entries_peak,
 * kv_bytes_peak, the compression (runtime/eval/rt_compression.h: entries and bytes at the
 * end and at peak; task needle: the mean over the trials), tokens_per_s, compress_events,
 * policy_seconds; then a paired circular block bootstrap 95% CI for the mean per-token NLL
 * difference B - A over the scored tokens (block length by Politis & White 2004,
 * rt_bootstrap_block_len_auto; 1000 resamples, fixed seed) and one verdict line. The
 * verdict names no winner when the sides' compression in bytes at the end (their memory),
 * or for two prompt-end policies their prompts' right after the compress, differs by more
 * than RT_AB_X_TOL, or when a side compressed before none of the scored tokens: quality at unequal memory says nothing about the policies
 * (docs/measuring.md, "Reading an A/B verdict"). Task needle: passkey retrieval accuracy (rt_needle.h) over lengths
 * x depths for the reference, A and B, with an exact McNemar-style sign count.
 *
 * Outputs: the table on stdout; --json (one object: "meta" with commit, model and text
 * sha256, policy names, sources, source hashes and parameters, threads, ratios; "results"
 * per ratio), --csv (one row per ratio and policy, metadata repeated in columns), --plot
 * (one SVG file with one panel per metric against the compression ratio, both policies
 * and the reference). Progress goes to stderr (base/rt_progress.h; --quiet: none). The
 * command line (`BIN ab`, options and help) is runtime/cli/rt_cmd_ab.c.
 */
#ifndef RT_AB_H
#define RT_AB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "policy/rt_policy.h"
#include "base/rt_numparse.h"
#include "base/rt_util.h"

#define RT_AB_MAX_RATIOS RT_RATIO_LIST_MAX /* the ratio list's bound (base/rt_numparse.h) */
#define RT_AB_MAX_SETS 64
/* The most the two sides' compression in bytes at the end (their memory; for two
 * prompt-end policies their prompts' too) may differ, a fraction of the larger, for the
 * verdict to name a winner (rt_compression_differ). */
#define RT_AB_X_TOL 0.10

/* What to compare (filled by the command line, runtime/cli/rt_cmd_ab.c). */
typedef struct rt_ab_opts {
	const char *model, *text, *task, *json, *csv, *plot, *commit, *mode;
	const char *name[2];
	const char *sha[2];
	double ratios[RT_AB_MAX_RATIOS];
	int n_ratios;
	int bytes;           /* 1: the ratios count bytes against an f16 full cache
	                        (rt_seq_set_byte_ratio, `--byte-ratio LIST`), 0: entries */
	int64_t ctx;
	int64_t prompt;      /* task ppl: --prompt N (the first N tokens are the prompt, scored
	                        from N + 1), or -1: the policies' protocol (rt_eval_split_of) */
	int64_t score_from;  /* task ppl: --score-from P (first scored position), or -1 */
	int chunk, threads, resamples;
	int prefill_chunk;   /* chunked prefill of both sides (rt_seq_set_prefill_chunk); 0: exact */
	uint64_t seed;
	const char *sets[2][RT_AB_MAX_SETS];
	int set_all[2][RT_AB_MAX_SETS]; /* 1: from --set (skipped by a policy without the name) */
	int n_sets[2];
	int64_t lengths[16];
	int n_lengths;
	double depths[16];
	int n_depths;
	int quiet;           /* no progress on stderr */
	int equal_memory;    /* task ppl, ratios in entries: the side that would compress more
	                        at R runs at the ratio matching the other's compression at the
	                        end (rt_ab.c, ab_equal_memory) */
} rt_ab_opts;

/* The defaults: task ppl, mode NULL (as `needle`: agnostic when a side compresses at the
 * prompt end, else aware; rt_eval_needle_agnostic), ratio 4, chunk 512, 1000 resamples,
 * RT_BOOT_DEFAULT_SEED, lengths 1024,2048, depths 0,25,50,75,100, commit "unknown". */
void rt_ab_opts_init(rt_ab_opts *o);

struct ab_run; /* the run's state, private to the engine and its reports: eval/rt_ab_int.h */

/* Writes the reports of a finished run: the table to out, then the files its options
 * name (rt_ab_report_write, runtime/eval/rt_ab_report.h). Returns 0, or -1 with err. */
typedef int (*rt_ab_report_fn)(const struct ab_run *r, FILE *out, rt_err *err);

/* Run the comparison with the policies reg[0..n_reg): A and B are o->name[0..1] (default:
 * the first two, or the only one twice). Then report(run, stdout, err) writes the table
 * and the --json, --csv and --plot reports. Returns the exit status: 0 success, 1 runtime
 * error (one line "ab: PATH: reason" on stderr), 2 an unknown policy or parameter. */
int rt_ab_run(const rt_ab_opts *o, const struct kvp_policy *const *reg, int n_reg,
              rt_ab_report_fn report);

#endif
