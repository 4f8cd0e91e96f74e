/*
 * kvpc_tune: the quality gate's driver side. `kvpc tune POLICY.kvp --model M --text FILE...
 * --max-kld X [--min-passkey P] [...]` builds (cached) a binary of the policy and runs its
 * `tune` command (runtime/cli/rt_cmd_tune.c, the search of runtime/eval/rt_tune.h), which
 * prints the frontier it walked and writes the choice to the policy's sidecar
 * (POLICY.tune, runtime/policy/rt_tuned.h). `kvpc build` bakes a sidecar's ratio (in
 * entries, or in bytes for a byte budget) into the binary as the policy's default; `kvpc
 * build --gate` re-checks it (kvpc_gate.h).
 */
#ifndef KVPC_TUNE_H
#define KVPC_TUNE_H

/* `kvpc tune FILE.kvp [options]` (argv excludes "tune"). Returns only on error (1 build or
 * output error, 2 usage error) or for --help (0): otherwise it executes the binary's
 * `tune`, whose exit status is kvpc's (0 a ratio was chosen and written, 1 none is within
 * the limits or a runtime error, 2 usage error). */
int kvpc_cmd_tune(int argc, char **argv);

#endif
