/*
 * rt_cli: the command line shared by build/kvrt and the per-deployment binaries that
 * `kvpc build` links: one main() body that runs a GGUF llama model under any of
 * the KV-cache policies compiled into the binary (plus the built-in `full`), with the
 * commands info, ppl (streaming perplexity, with a full-cache reference in the same run
 * for KL statistics), needle (passkey / needle-in-a-haystack retrieval), run (greedy
 * generation), tokenize, bench, keepmap (an SVG of the kept positions), serve (the
 * OpenAI-compatible server), ab (the A/B comparison `kvpc ab` runs) and tune (the quality
 * gate), one file each (runtime/cli/rt_cmd.h) over the one option table of
 * runtime/cli/rt_cli_opts.h. Every command has a man-page style --help and --version.
 *
 * Exit status: 0 success, 1 runtime error (unreadable or invalid file, model or policy
 * failure), 2 usage error (bad command line: unknown command, option, policy or
 * parameter, bad value). Errors are one line on stderr: "PROG: PATH: reason".
 */
#ifndef RT_CLI_H
#define RT_CLI_H

#include "cli/rt_cli_tuned.h"
#include "policy/rt_policy.h"

/* Run the command line argv[0..argc) (argv[0] names the program in messages) with the
 * policies reg[0..n_reg) (NULL/0: only the built-in full policy). The default policy of
 * the policy-aware commands is reg[0] when n_reg > 0, else full. Returns the exit
 * status. Writes results to stdout and errors to stderr. */
int rt_cli_main(int argc, char **argv, const struct kvp_policy *const *reg, int n_reg);

/* rt_cli_main with baked-in defaults tuned[0..n_tuned) (the binary's main unit passes
 * them; runtime/cli/rt_cli_tuned.h): a policy-aware command (ppl, needle, run, keepmap,
 * serve) run without --ratio and --byte-ratio uses its policy's tuned ratio (in entries
 * or in bytes, as tuned) in place of the policy's own budget; either option overrides
 * it. The array must outlive the call. */
int rt_cli_main_tuned(int argc, char **argv, const struct kvp_policy *const *reg, int n_reg,
                      const struct rt_cli_tuned *tuned, int n_tuned);

#endif
