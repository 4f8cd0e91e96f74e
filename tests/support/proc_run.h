/*
 * proc_run: runs a program, or a command-line entry point such as rt_cli_main, in a child
 * process with its stdout and stderr captured, for the suites that check what a command
 * prints and how it exits (test_cli, test_ab, test_build, test_tune, test_text).
 *
 * A child, not a call in the test process: a command may exit(), write to the real stdout
 * and stderr, or hang; the test sees its output as text and its exit status, and a time
 * limit (alarm(2) in the child, kept across execv) turns a hang into SIGALRM instead of a
 * stray process outliving check's own timeout. Output goes to anonymous temporary files
 * (tmpfile(3)), not pipes, so a child that writes much to both streams cannot block.
 *
 * Both functions need no check and no runtime library: they return what happened and the
 * suites assert on it.
 */
#ifndef PROC_RUN_H
#define PROC_RUN_H

#include <stddef.h>

/* A command-line entry point run in the child: argc, argv as main gets them; user as given
 * to proc_call. Its return value is the child's exit status. */
typedef int (*proc_main_fn)(int argc, char **argv, void *user);

/* Run argv[0] (a path: execv, no PATH search) with arguments argv (NULL-terminated) in a
 * child, killed by SIGALRM after limit_s seconds (0: no limit). The streams are captured
 * into *out and *err (NUL-terminated heap strings, caller frees; either pointer may be
 * NULL to discard that stream). Returns the exit status (0..255), 128 + N when the child
 * was killed by signal N (the shell's convention; 126 when the child could not redirect
 * its streams, 127 when execv failed, with the reason on the captured stderr), or -1 when
 * no child could be run or its output not read back (fork, tmpfile or read failed: a
 * message naming the step on this process's stderr, *out and *err NULL). */
int proc_exec(char *const argv[], unsigned limit_s, char **out, char **err);

/* The same with fn(argc, argv, user) run in the forked child instead of a program (argc
 * counted from the NULL-terminated argv); the child flushes every stdio stream and exits
 * with fn's return value. Same returns and ownership as proc_exec. */
int proc_call(proc_main_fn fn, void *user, char *argv[], unsigned limit_s, char **out,
              char **err);

/* The program name of the build a test belongs to, for a test binary at BUILD/tests/test_x
 * (read from /proc/self/exe): "BUILD/name" into buf[0..cap); or the value of the
 * environment variable env when env is not NULL and the variable is set and not empty
 * (e.g. KVPC=/opt/kvpc: the suites run against another kvpc). 0, or -1 when
 * /proc/self/exe cannot be read or the path does not fit in cap bytes. */
int proc_bin_path(const char *name, const char *env, char *buf, size_t cap);

#endif
