/*
 * rt_cli: the command line shared by build/kvrt and the per-deployment binaries that
 * `kvpc build` links: one main() body that runs a GGUF llama model under any of
 * the KV-cache policies compiled into the binary (plus the built-in `full`), with the
 * commands info, ppl (streaming perplexity, with a full-cache reference in the same run
 * for KL statistics), needle (passkey / needle-in-a-haystack retrieval), run (greedy
 * generation), tokenize, bench, keepmap (an SVG of the kept positions) and ab (the A/B
 * comparison `kvpc ab` runs), one file each (runtime/cli/rt_cmd.h). Every command has a
 * man-page style --help and --version.
 *
 * Exit status: 0 success, 1 runtime error (unreadable or invalid file, model or policy
 * failure), 2 usage error (bad command line: unknown command, option, policy or
 * parameter, bad value). Errors are one line on stderr: "PROG: PATH: reason".
 */
#ifndef RT_CLI_H
#define RT_CLI_H

#include "policy/rt_pick.h"
#include "policy/rt_policy.h"

/* Run the command line argv[0..argc) (argv[0] names the program in messages) with the
 * policies reg[0..n_reg) (NULL/0: only the built-in full policy). The default policy of
 * the policy-aware commands is reg[0] when n_reg > 0, else full. Returns the exit
 * status. Writes results to stdout and errors to stderr. */
int rt_cli_main(int argc, char **argv, const struct kvp_policy *const *reg, int n_reg);

/* A default compression ratio a build baked in for one policy: `kvpc build` reads it from
 * the policy's tune sidecar (runtime/policy/rt_tuned.h, written by `kvpc tune`). */
struct rt_cli_tuned {
	const char *policy;   /* the registered policy's name */
	double ratio;         /* the default compression ratio, >= 1 */
	const char *sidecar;  /* the sidecar it came from (shown by `info`) */
	int bytes;            /* 1: ratio counts bytes (--byte-ratio), 0: entries (--ratio) */
};

/* rt_cli_main with baked-in defaults tuned[0..n_tuned) (the binary's main unit passes
 * them): a policy-aware command (ppl, needle, run, keepmap, serve) run without --ratio
 * and --byte-ratio uses its policy's tuned ratio (in entries or in bytes, as tuned) in
 * place of the policy's own budget; either option overrides it. The array must outlive
 * the call. */
int rt_cli_main_tuned(int argc, char **argv, const struct kvp_policy *const *reg, int n_reg,
                      const struct rt_cli_tuned *tuned, int n_tuned);

/* The baked-in default ratio of policy p, or 0 when the binary has none for it; *bytes
 * (may be NULL) = 1 when it counts bytes. */
double rt_cli_tuned_ratio(const struct kvp_policy *p, int *bytes);
/* The command line's spelling of each field of a policy choice (runtime/policy/rt_pick.h,
 * ORDER RT_PICK_FIELD): "--policy", "--kv-type", "--set", "--ratio", "--byte-ratio",
 * "--prefill-chunk", "--min-kv"; serve's options spell them the same. */
extern const char *const rt_cli_spellings[RT_PICK_N_FIELDS];

/* The sidecar it came from, or NULL. */
const char *rt_cli_tuned_sidecar(const struct kvp_policy *p);

#endif
