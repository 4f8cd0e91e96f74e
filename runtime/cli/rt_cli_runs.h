/*
 * rt_cli_runs: the policy runs of `ppl` and `needle` — the one run --policy, --set and
 * --ratio give, or the lines of a --batch file (`POLICY [--ratio R] [--set NAME=VALUE]...
 * [--kv-type T]` per line, '#' comments), each checked like the command line before any
 * model work.
 */
#ifndef RT_CLI_RUNS_H
#define RT_CLI_RUNS_H

#include <stdint.h>

#include "cli/rt_cli_opts.h"
#include "policy/rt_seq.h"

/* Entries per head a ratio run's store holds beyond its budget (see rt_cli_run_cap). */
#define RT_CLI_CAP_SLACK 1024

/* One policy run of `ppl` or `needle`: the policy with its --set overrides and --ratio
 * (from the command line, or one line of a --batch file), its sequence and, for ppl, its
 * running scores. */
typedef struct rt_cli_run {
	const struct kvp_policy *p;
	rt_cli_opts o;                  /* sets and ratio of this run */
	char *line;              /* owned copy of the batch line the sets point into, or NULL */
	rt_seq seq;
} rt_cli_run;

/* Store capacity of a run over len prompt tokens plus extra: every token, or for a ratio
 * run of a policy that compresses as it goes (no prompt-end trigger) its budget plus
 * RT_CLI_CAP_SLACK plus its --prefill-chunk. */
int32_t rt_cli_run_cap(const rt_cli_run *r, int64_t len, int64_t extra);

/* The KV store type of run r on model m: its batch line's --kv-type, else the command's
 * --kv-type (the model's type), else the single-run rule for the line's policy
 * (rt_cli_kv_type; rt_cli_runs sets it). A batch line may give a narrow store on the exact
 * path too: the reference keeps the model's type, so one pass compares store types
 * against it. */
enum rt_kv_type rt_cli_run_kv_type(const rt_cli_run *r, const rt_model *m);

/* Free K runs (their sequences and batch lines) and the array; K < 0 counts as 0. */
void rt_cli_runs_free(rt_cli_run *runs, int K);

/* The runs of a command: the lines of --batch, or the one run --policy/--set/--ratio give.
 * Returns them (count in *K; free with rt_cli_runs_free) or NULL after printing the
 * error, *rc the exit status (FILE:LINE: reason for a bad batch line). */
rt_cli_run *rt_cli_runs(const char *cmd, const rt_cli_opts *o, int *K, int *rc);

#endif
