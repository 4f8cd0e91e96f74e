/*
 * rt_ab: the A/B comparison of two compiled policies inside a per-deployment binary
 * (`BIN ab`, started by `kvpc ab`, issue 4 item 3). It loads the model once and, for each
 * compression ratio R, runs three sequences over the same tokens in lockstep, chunk by
 * chunk: the full-cache reference P and the two policies A and B (each with its budget
 * overridden to context / R, rt_run_set_ratio). Every chunk's logits are compared at once
 * (rt_stats_token_cmp), so per-token KL against the reference needs no logits buffer
 * beyond one chunk per sequence; all ratios advance together, so the reference runs once.
 *
 * Reported per ratio and policy (task ppl): ppl, kld_mean, kld_p99, kld_max, ppl_ratio,
 * same_top1, rms_dp (llama.cpp's `llama-perplexity --kl-divergence` statistics, see
 * runtime/eval/rt_stats.h), kv_entries_peak, kv_bytes_peak, compression (reference peak bytes /
 * policy peak bytes), tokens_per_s, compress_events, policy_seconds; then a paired
 * circular block bootstrap 95% CI for the mean per-token NLL difference B - A (block
 * length by Politis & White 2004, rt_bootstrap_block_len_auto; 1000 resamples, fixed seed)
 * and one verdict line. Task needle: passkey retrieval accuracy (rt_needle.h) over lengths
 * x depths for the reference, A and B, with an exact McNemar-style sign count.
 *
 * Outputs: the table on stdout; --json (one object: "meta" with commit, model and text
 * sha256, policy names, sources, source hashes and parameters, threads, ratios; "results"
 * per ratio), --csv (one row per ratio and policy, metadata repeated in columns), --plot
 * (one SVG file with one panel per metric against the compression ratio, both policies
 * and the reference). A progress bar goes to stderr only when stderr is a terminal.
 */
#ifndef RT_AB_H
#define RT_AB_H

#include <stddef.h>
#include <stdint.h>

#include "policy/rt_policy.h"
#include "base/rt_util.h"

/* `BIN ab [options]` (argv[0] is "ab"). reg[0..n_reg) are the binary's policies; A and B
 * are chosen with --a NAME / --b NAME (default: the first two, or the only one twice).
 * Exit status: 0 success, 1 runtime error (one line "ab: PATH: reason" on stderr), 2 usage
 * error. `BIN ab --help` lists every option. */
int rt_ab_main(int argc, char **argv, const struct kvp_policy *const *reg, int n_reg);

#endif
