/*
 * kvpc_build: the part of the kvpc driver that turns .kvp files into a per-deployment
 * binary (`kvpc build`), and the cached build that `kvpc ab` (kvpc_ab.h) and `kvpc tune`
 * (kvpc_tune.h) start from.
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

/* `kvpc build FILE.kvp... -o BIN [-v]` (argv excludes "build"). Exit status: 0 success,
 * 1 diagnostics or a build/output failure (one line naming the file and the reason), 2
 * usage error. Prints one line on stderr: "kvpc build: BIN: compiled N policies in S s"
 * or "kvpc build: BIN: up to date (cached)". BIN is replaced atomically and left
 * untouched (same mtime) when it already holds the cached binary. */
int kvpc_cmd_build(int argc, char **argv);

/* Build files[0..n) into a cached binary. Writes its path (inside the cache) to bin, and
 * when names is not NULL the registered policy names to names[0..*n_names) (heap strings
 * the caller frees): the same source given twice is registered once; two different
 * sources of one policy name are an error (named by file). *compiled = 1 when the compiler ran (0: cache hit);
 * *seconds = wall time. verbose: print the runtime found, the cache directory and the
 * compiler command. Returns 0, or 1 after printing diagnostics/errors. */
int kvpc_build_cached(const char *const *files, int n, int verbose, char *bin, size_t bin_cap,
                      char **names, int *n_names, int *compiled, double *seconds);

#endif
