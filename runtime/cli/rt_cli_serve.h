/*
 * rt_cli_serve: the `serve` command of the shared command line (rt_cli.h) — option
 * parsing and checking for rt_serve (runtime/serve/rt_serve.h).
 */
#ifndef RT_CLI_SERVE_H
#define RT_CLI_SERVE_H

#include "policy/rt_policy.h"

/* `PROG serve ...` with argv[0] = "serve"; the policies are reg[0..n_reg) plus full.
 * Returns the exit status (0, 1 runtime error, 2 usage error). */
int rt_cli_serve(int argc, char **argv, const char *prog, const struct kvp_policy *const *reg,
                 int n_reg);

#endif
