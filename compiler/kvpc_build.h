/*
 * kvpc_build: the part of the kvpc driver that turns .kvp files into a per-deployment
 * binary (`kvpc build`) and the front of the A/B comparison (`kvpc ab`), which builds two
 * policies into one binary and hands the comparison to that binary's `ab` command
 * (runtime/eval/rt_ab.h).
 *
 * A build emits C for every policy (compiler/kvp_emit_c.h), the registry unit listing
 * them, and a main() that hands the command line to the runtime (rt_cli_main, which
 * also dispatches `ab`); then runs the C compiler once over these units and links them
 * against libkvrt.a, OpenBLAS and PCRE2 (flags from pkg-config); docs/architecture.md, "The pipeline".
 *
 * Where the runtime comes from (first match wins), with D the directory of the running
 * kvpc executable (/proc/self/exe):
 *   build tree:  D/libkvrt.a, headers in D/../runtime and D/../kernels (build/kvpc);
 *   prefix:      D/../lib/libkvrt.a, headers in D/../include/kvrt and
 *                D/../share/kvpc/kernels (`make install PREFIX=P` puts kvpc in P/bin);
 *   source tree: KVPC_SRCDIR (compile-time, absolute) /build/libkvrt.a, /runtime, /kernels.
 * A kvpc built with AddressSanitizer links binaries with -fsanitize=address,undefined (a
 * sanitised libkvrt.a needs it).
 *
 * Cache: the binary is built in CACHE/KEY/ where KEY is the SHA-256 (first 32 hex digits)
 * of: a format tag, the kvpc version, every policy's source bytes and generated C, the
 * registry and main units, the compiler and its flags, the bytes of libkvrt.a and of every
 * runtime and kernel header. CACHE is $KVPC_CACHE, else $XDG_CACHE_HOME/kvpc, else
 * $HOME/.cache/kvpc. Unchanged inputs are never recompiled; a directory is filled under a
 * temporary name and renamed into place, so concurrent builds are safe.
 */
#ifndef KVPC_BUILD_H
#define KVPC_BUILD_H

#include <stddef.h>
#include <sys/types.h>

/* `kvpc build FILE.kvp... -o BIN [-v]` (argv excludes "build"). Exit status: 0 success,
 * 1 diagnostics or a build/output failure (one line naming the file and the reason), 2
 * usage error. Prints one line on stderr: "kvpc build: BIN: compiled N policies in S s"
 * or "kvpc build: BIN: up to date (cached)". BIN is replaced atomically and left
 * untouched (same mtime) when it already holds the cached binary. */
int kvpc_cmd_build(int argc, char **argv);

/* `kvpc ab A.kvp B.kvp --model M --text FILE [options]` (argv excludes "ab"): builds
 * (cached) both policies into one binary and executes `BIN ab --a NAME --b NAME ...` with
 * the remaining options (runtime/eval/rt_ab.h documents them). Returns only on error (exit
 * status as kvpc_cmd_build) or for --help. */
int kvpc_cmd_ab(int argc, char **argv);

/* Build files[0..n) into a cached binary. Writes its path (inside the cache) to bin, and
 * when names is not NULL the registered policy names to names[0..*n_names) (heap strings
 * the caller frees): the same source given twice is registered once; two different
 * sources of one policy name are an error (named by file). *compiled = 1 when the compiler ran (0: cache hit);
 * *seconds = wall time. verbose: print the runtime found, the cache directory and the
 * compiler command. Returns 0, or 1 after printing diagnostics/errors. */
int kvpc_build_cached(const char *const *files, int n, int verbose, char *bin, size_t bin_cap,
                      char **names, int *n_names, int *compiled, double *seconds);

/* Waits for the child pid (retrying on EINTR): its exit status, 128 + the signal that
 * ended it, or -1 when waitpid fails. */
int kvpc_wait(pid_t pid);

/* Run the built binary bin (execv, no return on success) with the arguments head[0..nh)
 * (head[0] is argv[0]) then pass[0..np), printing the command line to stderr first when
 * verbose. When execv fails: prints "BIN: error: cannot run: REASON" and returns 1; the
 * caller still owns head and pass. */
int kvpc_exec_built(const char *bin, char *const *head, int nh, char *const *pass, int np,
                    int verbose);

#endif
