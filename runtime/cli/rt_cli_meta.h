/*
 * rt_cli_meta: what the command line says about the build it runs from: the commit and
 * whether the tree was modified (--version), and the run metadata every JSON record
 * carries (policy, its source and hash, parameters, ratio, KV type, activations, commit).
 * The Makefile stamps the commit into this file's object alone (KVPC_COMMIT,
 * KVPC_TREE_MODIFIED).
 */
#ifndef RT_CLI_META_H
#define RT_CLI_META_H

#include <stdio.h>

#include "policy/rt_seq.h"

/* The commit the runtime was built from ("unknown" when not stamped). */
const char *rt_cli_commit(void);

/* 1 when the build's tracked files differed from that commit (the Makefile's
 * KVPC_TREE_MODIFIED, from git status), else 0: --version then says "tree modified", as a
 * binary built from local changes is not the commit's alone. */
int rt_cli_tree_modified(void);

/* The run metadata of a JSON record, written to out as members (each with its leading
 * comma but the first): "policy":..,"policy_source":..,"policy_hash":..,"params":{..},
 * "ratio":.. (null when ratio is 0: no --ratio), "byte_ratio" (under --byte-ratio),
 * "kv_type", "activations", "budget_notes" (what a graceful budget did, rt_pick_note_next:
 * [] when nothing) and, in a stamped build, "commit". */
void rt_cli_json_policy(FILE *out, const rt_seq *s, double ratio);

#endif
