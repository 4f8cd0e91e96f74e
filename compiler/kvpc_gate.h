/*
 * kvpc_gate: the quality gate's check as `kvpc build --gate` runs it. A policy's sidecar
 * (POLICY.tune, written by `kvpc tune`, runtime/policy/rt_tuned.h) records the ratio it
 * chose and the texts and limits it was chosen on; the gate re-runs the built binary's
 * `tune --gate` (runtime/cli/rt_cmd_tune.c) at that ratio on those texts, and the build
 * keeps its binary only when the limits still hold.
 */
#ifndef KVPC_GATE_H
#define KVPC_GATE_H

#include "policy/rt_tuned.h"

/* Run `bin tune --gate` for policy name with the sidecar t's ratio (--ratio, or
 * --byte-ratio when t->bytes), texts and limits, on `threads` threads (its --threads; NULL:
 * the binary's default), its output going to kvpc's stdout and stderr. Returns its exit
 * status (0: the gate holds), or -1 when it cannot be run (message printed). */
int kvpc_gate_run(const char *bin, const char *name, const rt_tuned *t, const char *threads);

#endif
