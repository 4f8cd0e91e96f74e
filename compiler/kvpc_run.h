/*
 * kvpc_run: how the kvpc driver runs what a build made. `kvpc ab`, `kvpc tune` and
 * `kvpc build --gate` each build a binary (compiler/kvpc_build.h) and hand the work to one
 * of its commands (runtime/cli/rt_cli.h); this module waits for children, replaces kvpc
 * with the built binary and tells which of the binary's options take a value, so that
 * each front passes its command line on unchanged.
 */
#ifndef KVPC_RUN_H
#define KVPC_RUN_H

#include <sys/types.h>

/* Waits for the child pid (retrying on EINTR): its exit status, 128 + the signal that
 * ended it, or -1 when waitpid fails. */
int kvpc_wait(pid_t pid);

/* Run the built binary bin (execv, no return on success) with the arguments head[0..nh)
 * (head[0] is replaced by "kvpc": the binary's messages name the front) then pass[0..np), printing the command line to stderr first when
 * verbose. When execv fails: prints "BIN: error: cannot run: REASON" and returns 1; the
 * caller still owns head and pass. */
int kvpc_exec_built(const char *bin, char *const *head, int nh, char *const *pass, int np,
                    int verbose);

/* The front `kvpc CMD` checks --model (or -m) among the passed options pass[0..np) before
 * it builds anything (value_opts: the options that take a value, so a value is not read as
 * an option): 0 when given and readable; else the message on stderr and the exit status
 * (2: not given, 1: the file cannot be read). */
int kvpc_need_model(const char *cmd, char *const *pass, int np, const char *const *value_opts);

/* 1 when opt is in the NULL-terminated list value_opts (the options of a built binary's
 * command that take a value, as in `--text FILE`), else 0. */
int kvpc_takes_value(const char *const *value_opts, const char *opt);

#endif
