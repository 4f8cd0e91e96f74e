/*
 * kvpc_build: `kvpc build` (policies -> a per-deployment binary, cached by a content hash)
 * and the front of `kvpc ab` (build both policies, then run the binary's A/B engine).
 * The build recipe, the runtime search order and the cache key are documented in
 * kvpc_build.h; the A/B engine and its options in runtime/eval/rt_ab.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "kvp_emit_c.h"
#include "kvp_emit_cuda.h"
#include "kvp_ir.h"
#include "kvp_paged.h"
#include "kvp_sema.h"
#include "kvp_src.h"
#include "kvpc_build.h"
#include "kvpc_gate.h"
#include "kvpc_run.h"
#include "base/rt_sha256.h"
#include "base/rt_text.h"
#include "policy/rt_tuned.h"

/* Bumped whenever the layout of the cache directory or the generated main changes. */
#define CACHE_FORMAT "kvpc-build-cache-1"
#define MAX_ARGS 96

static const char BUILD_USAGE[] =
	"usage: kvpc build FILE.kvp... -o BIN [--gate [--threads N]] [--cuda] [-v]\n"
	"       kvpc build --shared FILE.kvp... -o LIB.so [-v]\n";

static const char BUILD_HELP[] =
	"kvpc build: compile policies into a per-deployment binary.\n"
	"\n"
	"  kvpc build FILE.kvp... -o BIN [--gate [--threads N]] [--cuda] [-v]\n"
	"\n"
	"Emits C for each policy, a registry and a main, compiles them with $CC (default cc)\n"
	"and links them against libkvrt.a, OpenBLAS, PCRE2, zlib, libmicrohttpd and jansson.\n"
	"BIN then offers the runtime's commands with these policies (BIN --help; BIN info\n"
	"lists them with their parameters; BIN ab compares two of them; BIN serve serves\n"
	"them over HTTP).\n"
	"\n"
	"  -o BIN     the binary to write (replaced atomically)\n"
	"  --cuda     also emit each policy's CUDA unit, compile them with nvcc ($NVCC, else\n"
	"             nvcc on PATH or /usr/local/cuda/bin/nvcc) and link libkvrt_cuda.a (built\n"
	"             by make cuda), cuBLAS and the CUDA runtime: BIN ppl|bench --device cuda\n"
	"             then run on the GPU (docs/cuda.md)\n"
	"  --gate     re-check every tuned policy's quality gate (its sidecar's texts and\n"
	"             limits, at its ratio or byte ratio) with the built binary, and refuse\n"
	"             to write BIN\n"
	"             (exit 1, naming the text, the measured value and the limit) when one\n"
	"             fails; every policy must have a sidecar\n"
	"  --threads N  the threads of --gate's model runs (BIN tune --threads; default:\n"
	"             the binary's, every core)\n"
	"  --shared   build a shared library instead (LIB.so) exporting the C ABI of\n"
	"             docs/shared_abi.md (kvpc_select: the kept entries of a request's keys\n"
	"             and window queries, runtime/policy/rt_shared.h); only policies a paged\n"
	"             engine can run (kvpc check --target paged) are accepted\n"
	"  -v         print the compiler command line and timings\n"
	"\n"
	"Tuned defaults: a policy FILE.kvp with a sidecar FILE.tune beside it (written by\n"
	"kvpc tune) gets the sidecar's compression ratio, in entries (`ratio`) or in bytes\n"
	"against an f16 full cache (`byte_ratio`), as its default budget in BIN: BIN ppl,\n"
	"needle, run, keepmap and serve use it (as --ratio R or --byte-ratio R) unless\n"
	"--ratio or --byte-ratio is given (BIN info shows it).\n"
	"\n"
	"Builds are cached by a hash of the policy sources, the kvpc version, the compiler\n"
	"flags and the runtime library and headers, in $KVPC_CACHE (default\n"
	"$XDG_CACHE_HOME/kvpc or ~/.cache/kvpc); unchanged inputs are not rebuilt.\n"
	"exit status: 0 success, 1 diagnostics or build error, 2 usage error\n";

/* ---- small helpers ----------------------------------------------------------------------- */

static void errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void errf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static int is_file(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* mkdir -p; 0 or -1 (errno set). */
static int mkdirs(const char *path)
{
	char buf[PATH_MAX];
	if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
		errno = ENAMETOOLONG;
		return -1;
	}
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, 0755) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, 0755) != 0 && errno != EEXIST)
		return -1;
	return is_dir(buf) ? 0 : (errno = ENOTDIR, -1);
}

/* Write len bytes to path (create/truncate). 0 or -1 with a message printed. */
static int write_file(const char *path, const char *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f) {
		errf("%s: error: cannot create: %s", path, strerror(errno));
		return -1;
	}
	int ok = fwrite(buf, 1, len, f) == len;
	ok &= fclose(f) == 0;
	if (!ok) {
		errf("%s: error: cannot write: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* Hash the bytes of a file into c (path and size first, so a rename changes the key).
 * 0, or -1 when it cannot be read. */
static int hash_file(rt_sha256 *c, const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	rt_sha256_update(c, path, strlen(path) + 1);
	char buf[1 << 16];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		rt_sha256_update(c, buf, n);
	int bad = ferror(f);
	fclose(f);
	return bad ? -1 : 0;
}

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

/* Hash every header-like file (*.h, *.cuh, *.cu) of dir, in name order. */
/* Hash every header (.h, .cuh, .cu) of dir and of its sub-folders (the runtime's layers:
 * base/, model/, kv/, ...), in name order, so any header change gives a new cache key.
 * depth bounds the recursion (1: dir and its direct sub-folders). */
static int hash_dir_headers(rt_sha256 *c, const char *dir, int depth)
{
	struct dirent **ents = NULL;
	int n = scandir(dir, &ents, NULL, alphasort);
	if (n < 0)
		return -1;
	int rc = 0;
	for (int i = 0; i < n; i++) {
		const char *nm = ents[i]->d_name;
		char p[PATH_MAX + 300];
		snprintf(p, sizeof p, "%s/%s", dir, nm);
		if (nm[0] == '.')
			;
		else if (ends_with(nm, ".h") || ends_with(nm, ".cuh") || ends_with(nm, ".cu")) {
			if (is_file(p) && hash_file(c, p) != 0)
				rc = -1;
		} else if (depth > 0 && is_dir(p) && hash_dir_headers(c, p, depth - 1) != 0)
			rc = -1;
		free(ents[i]);
	}
	free(ents);
	return rc;
}

/* ---- where the runtime is -------------------------------------------------------------- */

struct toolchain {
	char inc_rt[PATH_MAX];    /* runtime headers (rt_*.h) */
	char inc_k[PATH_MAX];     /* kernel templates (k_*.h) */
	char lib[PATH_MAX];       /* libkvrt.a */
	const char *where;        /* "build tree", "prefix", "source tree" */
	char cc[PATH_MAX];
	char *args[MAX_ARGS];     /* compiler flags (before the sources), heap strings */
	int n_args;
	char *libs[MAX_ARGS];     /* link flags (after libkvrt.a) */
	int n_libs;
};

static int try_layout(struct toolchain *tc, const char *lib, const char *rt, const char *k,
                      const char *where)
{
	char p[PATH_MAX + 96];
	snprintf(p, sizeof p, "%s/policy/rt_policy.h", rt);
	if (!is_file(lib) || !is_file(p) || !is_dir(k))
		return 0;
	if (!realpath(lib, tc->lib) || !realpath(rt, tc->inc_rt) || !realpath(k, tc->inc_k))
		return 0;
	tc->where = where;
	return 1;
}

static void split_push(char **arr, int *n, const char *s)
{
	char *copy = strdup(s);
	for (char *save = NULL, *t = strtok_r(copy, " \t\n", &save); t && *n < MAX_ARGS - 1;
	     t = strtok_r(NULL, " \t\n", &save))
		arr[(*n)++] = strdup(t);
	free(copy);
}

/* Output of a fixed command (no user input is ever passed to the shell), "" on failure. */
static void capture(const char *cmd, char *out, size_t cap)
{
	out[0] = 0;
	FILE *p = popen(cmd, "r");
	if (!p)
		return;
	size_t n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	if (pclose(p) != 0)
		out[0] = 0;
}

static void toolchain_free(struct toolchain *tc)
{
	for (int i = 0; i < tc->n_args; i++)
		free(tc->args[i]);
	for (int i = 0; i < tc->n_libs; i++)
		free(tc->libs[i]);
	tc->n_args = tc->n_libs = 0;
}

static int toolchain_find(struct toolchain *tc)
{
	memset(tc, 0, sizeof *tc);
	char exe[PATH_MAX], d[PATH_MAX], a[PATH_MAX + 64], b[PATH_MAX + 64], c[PATH_MAX + 64];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	int found = 0;
	if (n > 0) {
		exe[n] = 0;
		snprintf(d, sizeof d, "%s", exe);
		char *slash = strrchr(d, '/');
		if (slash)
			*slash = 0;
		snprintf(a, sizeof a, "%s/libkvrt.a", d);
		snprintf(b, sizeof b, "%s/../runtime", d);
		snprintf(c, sizeof c, "%s/../kernels", d);
		found = try_layout(tc, a, b, c, "build tree");
		if (!found) {
			snprintf(a, sizeof a, "%s/../lib/libkvrt.a", d);
			snprintf(b, sizeof b, "%s/../include/kvrt", d);
			snprintf(c, sizeof c, "%s/../share/kvpc/kernels", d);
			found = try_layout(tc, a, b, c, "prefix");
		}
	}
#ifdef KVPC_SRCDIR
	if (!found) {
		snprintf(a, sizeof a, "%s/build/libkvrt.a", KVPC_SRCDIR);
		snprintf(b, sizeof b, "%s/runtime", KVPC_SRCDIR);
		snprintf(c, sizeof c, "%s/kernels", KVPC_SRCDIR);
		found = try_layout(tc, a, b, c, "source tree");
	}
#endif
	if (!found) {
		errf("kvpc: error: cannot find the runtime (libkvrt.a, rt_policy.h, kernels/) for %s: "
		     "looked in its directory (build tree: D/libkvrt.a, D/../runtime) and its prefix "
		     "(D/../lib/libkvrt.a, D/../include/kvrt, D/../share/kvpc/kernels); run `make` or "
		     "`make install PREFIX=...`", n > 0 ? exe : "kvpc");
		return -1;
	}
	const char *cc = getenv("CC");
	snprintf(tc->cc, sizeof tc->cc, "%s", cc && *cc ? cc : "cc");
	split_push(tc->args, &tc->n_args, "-O2 -std=c11 -D_GNU_SOURCE -fno-strict-aliasing");
#if defined(__SANITIZE_ADDRESS__)
	split_push(tc->args, &tc->n_args,
	           "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined");
#endif
	char inc[PATH_MAX + 3];
	snprintf(inc, sizeof inc, "-I%s", tc->inc_rt);
	tc->args[tc->n_args++] = strdup(inc);
	snprintf(inc, sizeof inc, "-I%s", tc->inc_k);
	tc->args[tc->n_args++] = strdup(inc);
	char pk[4096];
	capture("pkg-config --cflags openblas libpcre2-8 zlib libmicrohttpd jansson 2>/dev/null", pk, sizeof pk);
	split_push(tc->args, &tc->n_args, pk);
	capture("pkg-config --libs openblas libpcre2-8 zlib libmicrohttpd jansson 2>/dev/null", pk, sizeof pk);
	split_push(tc->libs, &tc->n_libs, pk[0] ? pk : "-lopenblas -lpcre2-8 -lz -lmicrohttpd -ljansson");
	split_push(tc->libs, &tc->n_libs, "-lm -lpthread");
#if defined(__SANITIZE_ADDRESS__)
	split_push(tc->libs, &tc->n_libs, "-fsanitize=address,undefined");
#endif
	return 0;
}

/* ---- the cache ---------------------------------------------------------------------------- */

static int cache_root(char *out, size_t cap)
{
	const char *e = getenv("KVPC_CACHE");
	if (e && *e)
		snprintf(out, cap, "%s", e);
	else if ((e = getenv("XDG_CACHE_HOME")) && *e == '/')
		snprintf(out, cap, "%s/kvpc", e);
	else if ((e = getenv("HOME")) && *e)
		snprintf(out, cap, "%s/.cache/kvpc", e);
	else
		snprintf(out, cap, "/tmp/kvpc-cache-%ld", (long)getuid());
	if (mkdirs(out) != 0) {
		errf("%s: error: cannot create the build cache: %s (set KVPC_CACHE)", out,
		     strerror(errno));
		return -1;
	}
	return 0;
}

/* Run argv (no shell) with stdout+stderr to log_path. Returns the exit status, or -1. */
static int run_logged(char *const argv[], const char *log_path)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execvp(argv[0], argv);
		fprintf(stderr, "%s: cannot run: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	return kvpc_wait(pid);
}

/* The log a failed run_logged wrote, copied to stderr (nothing when it cannot be read). */
static void show_log(const char *log_path)
{
	size_t ll = 0;
	rt_err e;
	char *text = rt_read_file(log_path, &ll, &e);
	if (text)
		fputs(text, stderr);
	free(text);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One policy as emitted. */
struct unit {
	char *name;      /* registered name */
	char *c;         /* generated C */
	size_t c_len;
	char *cu;        /* generated CUDA (--cuda), else NULL */
	size_t cu_len;
	char *src;       /* source bytes */
	size_t src_len;
	const char *file; /* the .kvp path it came from (the caller's string) */
	char hash[17];   /* the source hash the policy carries (kvp_ir.source_hash) */
};

/* A policy file's tune sidecar (runtime/policy/rt_tuned.h), when it has one. */
struct tuned_in {
	char path[PATH_MAX]; /* "" when the file has no sidecar */
	rt_tuned t;
};

/* The main unit when no policy has a tuned default. */
static const char MAIN_C[] =
	"/* generated by kvpc build — do not edit: the per-deployment binary's entry point */\n"
	"#include \"cli/rt_cli.h\"\n"
	"#include \"model/rt_model.h\"\n"
	"#include \"policy/rt_policy.h\"\n"
	"\n"
	"int main(int argc, char **argv)\n"
	"{\n"
	"\trt_model_blas_setup(argv);\n"
	"\treturn rt_cli_main(argc, argv, kvp_registry, kvp_registry_count);\n"
	"}\n";

/* The extra unit of `--shared`: its reference pulls the exported ABI (rt_shared.o) out of
 * libkvrt.a; SHARED_EXPORTS is the version script that exports that ABI alone. */
static const char SHARED_C[] =
	"/* generated by kvpc build --shared — do not edit: the library's exported C ABI is\n"
	" * runtime/policy/rt_shared.h (kvpc_*), over the registry linked beside it */\n"
	"#include \"policy/rt_shared.h\"\n"
	"\n"
	"int (*const kvpc_shared_anchor)(void) = kvpc_abi_version;\n";
static const char SHARED_EXPORTS[] =
	"{ global: kvpc_abi_version; kvpc_policies; kvpc_window; kvpc_select; local: *; };\n";

/* Compile every policy; on success fill units[] (names deduplicated). shared: refuse, with
 * located reasons, a policy a paged engine cannot run (kvp_paged.h). */
static int emit_units(const char *const *files, int n, struct unit *units, char **reg_c,
                      size_t *reg_len, int *n_units, int cuda, int shared)
{
	int rc = 0;
	*n_units = 0;
	for (int i = 0; i < n; i++) {
		char err[512];
		kvp_src *src = kvp_src_open(files[i], err, sizeof err);
		if (!src) {
			const char *why = strstr(err, ": ");
			errf("%s: error: %s", files[i], why ? why + 2 : err);
			rc = 1;
			continue;
		}
		struct kvp_ir ir;
		if (kvp_compile(src, &ir) != 0) {
			fputs(kvp_src_diags(src), stderr);
			kvp_src_free(src);
			rc = 1;
			continue;
		}
		if (shared && kvp_paged_check(&ir, src) != 0) {
			fputs(kvp_src_diags(src), stderr);
			errf("%s: error: kvpc build --shared: policy '%s' is outside the paged subset "
			     "(kvpc check --target paged)", files[i], ir.name);
			kvp_ir_free(&ir);
			kvp_src_free(src);
			rc = 1;
			continue;
		}
		fputs(kvp_src_diags(src), stderr); /* warnings, if any */
		/* the same policy given twice is built once; two different policies of one
		 * name cannot both be registered (BIN --policy NAME must name one) */
		int dup = 0, clash = -1;
		for (int j = 0; j < *n_units; j++) {
			if (strcmp(units[j].name, ir.name) != 0)
				continue;
			if (units[j].src_len == src->len && !memcmp(units[j].src, src->text, src->len))
				dup = 1;
			else
				clash = j;
		}
		if (!dup && clash >= 0) {
			errf("%s: error: policy '%s' is already defined by %s; two policies of one name "
			     "cannot be built together (rename one: `policy NEW_NAME {`)", files[i], ir.name,
			     units[clash].file);
			kvp_ir_free(&ir);
			kvp_src_free(src);
			rc = 1;
			continue;
		}
		if (!dup) {
			struct unit *u = &units[(*n_units)++];
			char outname[32];
			snprintf(outname, sizeof outname, "policy_%d.c", *n_units - 1);
			FILE *mem = open_memstream(&u->c, &u->c_len);
			struct kvp_emit_opts opts = { .line_directives = 1, .out_name = outname };
			if (!mem || kvp_emit_c(&ir, &opts, mem) != 0) {
				errf("%s: error: the C emitter failed", files[i]);
				rc = 1;
			}
			if (mem)
				fclose(mem);
			if (cuda) {
				FILE *cm = open_memstream(&u->cu, &u->cu_len);
				snprintf(outname, sizeof outname, "policy_%d.cu", *n_units - 1);
				if (!cm || kvp_emit_cuda(&ir, &opts, cm) != 0) {
					errf("%s: error: the CUDA emitter failed", files[i]);
					rc = 1;
				}
				if (cm)
					fclose(cm);
			}
			u->name = strdup(ir.name);
			snprintf(u->hash, sizeof u->hash, "%s", ir.source_hash);
			u->src = malloc(src->len + 1);
			memcpy(u->src, src->text, src->len);
			u->src_len = src->len;
			u->file = files[i];
		}
		kvp_ir_free(&ir);
		kvp_src_free(src);
	}
	if (rc)
		return rc;
	const char **names = calloc((size_t)*n_units + 1, sizeof *names);
	for (int i = 0; i < *n_units; i++)
		names[i] = units[i].name;
	FILE *mem = open_memstream(reg_c, reg_len);
	char err[512] = "";
	if (!mem || kvp_emit_registry(names, *n_units, mem, err, sizeof err) != 0) {
		errf("kvpc: error: %s", err[0] ? err : "cannot emit the registry");
		rc = 1;
	}
	if (mem)
		fclose(mem);
	free(names);
	return rc;
}

/* s as the body of a C string literal. */
static void c_str(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			fprintf(f, "\\%03o", (unsigned char)*s);
		else
			fputc(*s, f);
	}
}

/* The main unit: MAIN_C, or with the tuned defaults of tuned[0..n) (parallel to files) as
 * a table handed to rt_cli_main_tuned. Checks that each sidecar names the policy its file
 * defines; a sidecar measured on another source gets a note. Returns a heap string (*len
 * its length), or NULL after printing the error. */
static char *main_unit(const char *const *files, int n, const struct tuned_in *tuned,
                       const struct unit *units, int n_units, size_t *len)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);
	if (!f)
		return NULL;
	int rows = 0, bad = 0;
	for (int i = 0; tuned && i < n; i++) {
		if (!tuned[i].path[0])
			continue;
		const struct rt_tuned *t = &tuned[i].t;
		const struct unit *u = NULL;
		for (int k = 0; k < n_units; k++)
			if (!strcmp(units[k].name, t->policy))
				u = &units[k];
		if (!u || strcmp(u->file, files[i]) != 0) {
			errf("%s: error: the sidecar is for policy '%s', which %s does not define (run "
			     "kvpc tune %s again, or remove the sidecar)", tuned[i].path, t->policy,
			     files[i], files[i]);
			bad = 1;
			continue;
		}
		if (strcmp(u->hash, t->source_hash) != 0)
			fprintf(stderr, "%s: note: tuned on another version of %s (source hash %s, now %s); "
			        "its %s %g is baked in as it is: check it with kvpc build --gate or "
			        "run kvpc tune again\n", tuned[i].path, files[i], t->source_hash, u->hash,
			        t->bytes ? "byte ratio" : "ratio", t->ratio);
		/* a default that changes what the binary runs is said at build time, not only by
		 * BIN info */
		fprintf(stderr, "%s: note: policy %s defaults to its tuned %s %g (from %s)\n", files[i],
		        t->policy, t->bytes ? "byte ratio" : "ratio", t->ratio, tuned[i].path);
		if (rows++ == 0)
			fputs("/* generated by kvpc build — do not edit: the per-deployment binary's entry "
			      "point, with the tuned defaults of the policies' sidecars */\n"
			      "#include \"cli/rt_cli.h\"\n#include \"model/rt_model.h\"\n"
			      "#include \"policy/rt_policy.h\"\n\n"
			      "static const struct rt_cli_tuned tuned[] = {\n", f);
		fputs("\t{ \"", f);
		c_str(f, t->policy);
		fprintf(f, "\", %.17g, \"", t->ratio);
		c_str(f, tuned[i].path);
		fprintf(f, "\", %d },\n", t->bytes);
	}
	if (rows)
		fprintf(f, "};\n\nint main(int argc, char **argv)\n{\n\trt_model_blas_setup(argv);\n"
		        "\treturn rt_cli_main_tuned(argc, argv, kvp_registry, kvp_registry_count, tuned, "
		        "%d);\n}\n", rows);
	else
		fputs(MAIN_C, f);
	if (fclose(f) != 0 || bad) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* Copy src to dst atomically (temporary file in dst's directory, then rename), mode 755.
 * When dst already has the same bytes it is left alone and *same = 1. */
static int install_bin(const char *src, const char *dst, int *same)
{
	*same = 0;
	size_t na = 0, nb = 0;
	rt_err e;
	char *a = rt_read_file(src, &na, &e);
	if (!a) {
		errf("%s: error: cannot read the cached binary", src);
		return -1;
	}
	char *b = is_file(dst) ? rt_read_file(dst, &nb, &e) : NULL;
	if (b && na == nb && !memcmp(a, b, na)) {
		*same = 1;
		free(a);
		free(b);
		return 0;
	}
	free(b);
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof tmp, "%s.tmpXXXXXX", dst) >= (int)sizeof tmp) {
		errf("%s: error: path too long", dst);
		free(a);
		return -1;
	}
	int fd = mkstemp(tmp);
	if (fd < 0) {
		errf("%s: error: cannot create: %s", dst, strerror(errno));
		free(a);
		return -1;
	}
	size_t off = 0;
	while (off < na) {
		ssize_t w = write(fd, a + off, na - off);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	int ok = off == na && fchmod(fd, 0755) == 0;
	ok &= close(fd) == 0;
	free(a);
	if (!ok || rename(tmp, dst) != 0) {
		errf("%s: error: cannot write: %s", dst, strerror(errno));
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* --cuda: nvcc ($NVCC, PATH, /usr/local/cuda/bin) and libkvrt_cuda.a beside libkvrt.a. */
struct cuda_tools {
	char nvcc[PATH_MAX];
	char lib[PATH_MAX + 32];
	char libdir[PATH_MAX + 32]; /* the toolkit's lib64 (cuBLAS, CUDA runtime) */
};

static int cuda_find(const struct toolchain *tc, struct cuda_tools *ct)
{
	const char *e = getenv("NVCC");
	char found[PATH_MAX] = "";
	if (e && *e)
		snprintf(found, sizeof found, "%s", e);
	else
		capture("command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; }",
		        found, sizeof found);
	found[strcspn(found, "\n")] = 0;
	if (!found[0] || access(found, X_OK) != 0 || !realpath(found, ct->nvcc)) {
		errf("kvpc build --cuda: error: nvcc not found (set NVCC, or install the CUDA toolkit)");
		return -1;
	}
	snprintf(ct->lib, sizeof ct->lib, "%s", tc->lib);
	char *slash = strrchr(ct->lib, '/');
	snprintf(slash ? slash + 1 : ct->lib, sizeof ct->lib - (size_t)(slash ? slash + 1 - ct->lib : 0),
	         "libkvrt_cuda.a");
	if (!is_file(ct->lib)) {
		errf("kvpc build --cuda: error: %s not found (run make cuda)", ct->lib);
		return -1;
	}
	char d[PATH_MAX];
	snprintf(d, sizeof d, "%s", ct->nvcc);
	slash = strrchr(d, '/');
	if (slash)
		*slash = 0;
	snprintf(ct->libdir, sizeof ct->libdir, "-L%s/../lib64", d);
	return 0;
}

/* Compile the CUDA units of a --cuda build into dir: policy_I.cu and registry_cuda.cu ->
 * .o (their paths appended to objs/own). Returns 0, or -1 after printing nvcc's log. */
static int cuda_compile(const struct toolchain *tc, const struct cuda_tools *ct,
                        const struct unit *units, int n_units, const char *cureg, size_t cureg_len,
                        const char *dir, char **objs, int *n_objs, char **own, int *n_own)
{
	const char *arch = getenv("KVPC_CUDA_ARCH");
	for (int i = 0; i <= n_units; i++) {
		char *src = NULL, *obj = NULL, *log = NULL;
		if (asprintf(&src, "%s/%s%d.cu", dir, i < n_units ? "policy_" : "registry_cuda", i) < 0 ||
		    asprintf(&obj, "%s/%s%d.o", dir, i < n_units ? "policy_" : "registry_cuda", i) < 0 ||
		    asprintf(&log, "%s/nvcc_%d.log", dir, i) < 0)
			return -1;
		own[(*n_own)++] = src;
		own[(*n_own)++] = obj;
		own[(*n_own)++] = log;
		if (write_file(src, i < n_units ? units[i].cu : cureg, i < n_units ? units[i].cu_len : cureg_len) != 0)
			return -1;
		char inc_rt[PATH_MAX + 3], inc_k[PATH_MAX + 3];
		snprintf(inc_rt, sizeof inc_rt, "-I%s", tc->inc_rt);
		snprintf(inc_k, sizeof inc_k, "-I%s", tc->inc_k);
		char *argv[] = { (char *)ct->nvcc, "-std=c++17", "-O2", "--fmad=false", "-D_GNU_SOURCE", "-gencode",
			         (char *)(arch && *arch ? arch : "arch=compute_90,code=[sm_90,compute_90]"),
			         inc_rt, inc_k, "-c", src, "-o", obj, NULL };
		int st = run_logged(argv, log);
		if (st != 0) {
			show_log(log);
			errf("kvpc build --cuda: error: nvcc failed (exit %d) on %s; sources and log kept in %s",
			     st, src, dir);
			return -1;
		}
		objs[(*n_objs)++] = obj;
	}
	return 0;
}

static int build_cached(const char *const *files, int n, int verbose, int cuda, int shared,
                        const struct tuned_in *tuned, char *bin, size_t bin_cap, char **names,
                        int *n_names, int *compiled, double *seconds);

int kvpc_build_cached(const char *const *files, int n, int verbose, char *bin, size_t bin_cap,
                      char **names, int *n_names, int *compiled, double *seconds)
{
	return build_cached(files, n, verbose, 0, 0, NULL, bin, bin_cap, names, n_names, compiled,
	                    seconds);
}

/* Everything one build holds: the emitted units, the toolchain, the heap paths. */
struct build {
	int verbose, cuda, shared;  /* shared: a library of the ABI of rt_shared.h */
	struct unit *units;
	int n_units;
	char *reg_c, *cureg, *main_c;
	size_t reg_len, cureg_len, main_len;
	struct toolchain tc;
	struct cuda_tools ct;
	char *objs[MAX_ARGS];      /* the CUDA objects (--cuda) */
	int n_objs;
	char *own[4 * MAX_ARGS];   /* heap paths to free */
	int n_own;
	double t0;
};

/* Emit every unit (policies, registry, main, the CUDA registry with --cuda) and find the
 * toolchain. Returns 0, or -1 after printing the error. */
static int build_emit(struct build *bd, const char *const *files, int n,
                      const struct tuned_in *tuned)
{
	if (n > MAX_ARGS / 2) {
		errf("kvpc build: error: at most %d policies per binary", MAX_ARGS / 2);
		return -1;
	}
	if (!(bd->units = calloc((size_t)n + 1, sizeof *bd->units)) ||
	    emit_units(files, n, bd->units, &bd->reg_c, &bd->reg_len, &bd->n_units, bd->cuda,
	               bd->shared) != 0)
		return -1;
	if (bd->shared) {
		bd->main_len = strlen(SHARED_C);
		bd->main_c = strdup(SHARED_C);
	} else {
		bd->main_c = main_unit(files, n, tuned, bd->units, bd->n_units, &bd->main_len);
	}
	if (!bd->main_c)
		return -1;
	if (toolchain_find(&bd->tc) != 0 || (bd->cuda && cuda_find(&bd->tc, &bd->ct) != 0))
		return -1;
	if (!bd->cuda)
		return 0;
	const char **nm = calloc((size_t)bd->n_units + 1, sizeof *nm);
	for (int i = 0; nm && i < bd->n_units; i++)
		nm[i] = bd->units[i].name;
	FILE *mem = nm ? open_memstream(&bd->cureg, &bd->cureg_len) : NULL;
	char err[512] = "";
	int bad = !mem || kvp_emit_cuda_registry(nm, bd->n_units, mem, err, sizeof err) != 0;
	if (mem)
		fclose(mem);
	free(nm);
	if (bad) {
		errf("kvpc build --cuda: error: %s", err[0] ? err : "cannot emit the CUDA registry");
		return -1;
	}
	return 0;
}

/* The cache key (kvpc_build.h): 32 hex digits into key[65]. Returns 0, or -1 after
 * printing the error. */
static int build_key(const struct build *bd, char key[65])
{
	const struct unit *units = bd->units;
	rt_sha256 h;
	rt_sha256_init(&h);
	rt_sha256_update(&h, CACHE_FORMAT, sizeof CACHE_FORMAT);
	rt_sha256_update(&h, KVP_VERSION, sizeof KVP_VERSION);
	for (int i = 0; i < bd->n_units; i++) {
		rt_sha256_update(&h, units[i].src, units[i].src_len);
		rt_sha256_update(&h, "", 1);
		rt_sha256_update(&h, units[i].c, units[i].c_len);
		rt_sha256_update(&h, "", 1);
	}
	rt_sha256_update(&h, bd->reg_c, bd->reg_len);
	rt_sha256_update(&h, bd->main_c, bd->main_len + 1);
	if (bd->cuda) {
		rt_sha256_update(&h, "cuda", 5);
		for (int i = 0; i < bd->n_units; i++)
			rt_sha256_update(&h, units[i].cu, units[i].cu_len);
		rt_sha256_update(&h, bd->cureg, bd->cureg_len);
		rt_sha256_update(&h, bd->ct.nvcc, strlen(bd->ct.nvcc) + 1);
		const char *arch = getenv("KVPC_CUDA_ARCH");
		if (arch)
			rt_sha256_update(&h, arch, strlen(arch) + 1);
		if (hash_file(&h, bd->ct.lib) != 0) {
			errf("%s: error: cannot read", bd->ct.lib);
			return -1;
		}
	}
	const struct toolchain *tc = &bd->tc;
	rt_sha256_update(&h, tc->cc, strlen(tc->cc) + 1);
	for (int i = 0; i < tc->n_args; i++)
		rt_sha256_update(&h, tc->args[i], strlen(tc->args[i]) + 1);
	for (int i = 0; i < tc->n_libs; i++)
		rt_sha256_update(&h, tc->libs[i], strlen(tc->libs[i]) + 1);
	if (hash_file(&h, tc->lib) != 0 || hash_dir_headers(&h, tc->inc_rt, 1) != 0 ||
	    hash_dir_headers(&h, tc->inc_k, 0) != 0) {
		errf("%s: error: cannot read the runtime library or its headers", tc->lib);
		return -1;
	}
	rt_sha256_hex(&h, key);
	key[32] = 0;
	return 0;
}

/* Write the units into tmp and link them (with the CUDA objects) into tmp/bin. Returns 0,
 * or -1 after printing the error (the compiler's log with it). */
static int build_compile(struct build *bd, const char *tmp)
{
	const struct toolchain *tc = &bd->tc;
	const int n_units = bd->n_units;
	if (bd->cuda && cuda_compile(tc, &bd->ct, bd->units, n_units, bd->cureg, bd->cureg_len, tmp,
	                             bd->objs, &bd->n_objs, bd->own, &bd->n_own) != 0)
		return -1;
	char *argv[3 * MAX_ARGS];
	int na = 0;
	argv[na++] = (char *)tc->cc;
	for (int i = 0; i < tc->n_args; i++)
		argv[na++] = tc->args[i];
	if (bd->shared) {
		/* libkvrt.a is position-independent (Debian's default PIE); the version script
		 * keeps every symbol but the ABI local, so its references bind inside the .so */
		char *map = NULL;
		if (asprintf(&map, "%s/exports.map", tmp) < 0)
			return -1;
		bd->own[bd->n_own++] = map;
		if (write_file(map, SHARED_EXPORTS, strlen(SHARED_EXPORTS)) != 0)
			return -1;
		char *opt = NULL;
		if (asprintf(&opt, "-Wl,--version-script=%s", map) < 0)
			return -1;
		bd->own[bd->n_own++] = opt;
		argv[na++] = "-fPIC";
		argv[na++] = "-shared";
		argv[na++] = opt;
	}
	for (int i = 0; i <= n_units + 1; i++) {
		char *p = NULL;
		const char *text = i < n_units ? bd->units[i].c : i == n_units ? bd->reg_c : bd->main_c;
		size_t len = i < n_units ? bd->units[i].c_len : i == n_units ? bd->reg_len : bd->main_len;
		int ok = i < n_units ? asprintf(&p, "%s/policy_%d.c", tmp, i)
		         : asprintf(&p, "%s/%s", tmp, i == n_units ? "registry.c"
		                                      : bd->shared ? "shared.c" : "main.c");
		if (ok < 0)
			return -1;
		bd->own[bd->n_own++] = p;
		argv[na++] = p;
		if (write_file(p, text, len) != 0)
			return -1;
	}
	for (int i = 0; i < bd->n_objs; i++)
		argv[na++] = bd->objs[i];
	if (bd->cuda)
		argv[na++] = (char *)bd->ct.lib;
	argv[na++] = (char *)tc->lib;
	for (int i = 0; i < tc->n_libs; i++)
		argv[na++] = tc->libs[i];
	if (bd->cuda) {
		argv[na++] = (char *)bd->ct.libdir;
		argv[na++] = "-lcublas";
		argv[na++] = "-lcudart";
		argv[na++] = "-lstdc++";
	}
	char *out = NULL, *log = NULL;
	if (asprintf(&out, "%s/bin", tmp) < 0 || (bd->own[bd->n_own++] = out, 0) ||
	    asprintf(&log, "%s/build.log", tmp) < 0)
		return -1;
	bd->own[bd->n_own++] = log;
	argv[na++] = "-o";
	argv[na++] = out;
	argv[na] = NULL;
	if (bd->verbose) {
		for (int i = 0; i < na; i++)
			fprintf(stderr, "%s%s", i ? " " : "", argv[i]);
		fputc('\n', stderr);
	}
	double t1 = now_s();
	int st = run_logged(argv, log);
	if (st != 0) {
		show_log(log);
		errf("kvpc build: error: %s failed (exit %d) on the generated code; sources and log "
		     "kept in %s", tc->cc, st, tmp);
		return -1;
	}
	if (bd->verbose)
		fprintf(stderr, "kvpc build: emit %.2f s, cc %.2f s\n", t1 - bd->t0, now_s() - t1);
	return 0;
}

static void build_free(struct build *bd, int ok, char **names, int *n_names)
{
	for (int i = 0; bd->units && i < bd->n_units; i++) {
		if (ok && names)
			names[i] = strdup(bd->units[i].name);
		free(bd->units[i].name);
		free(bd->units[i].c);
		free(bd->units[i].cu);
		free(bd->units[i].src);
	}
	if (ok && n_names)
		*n_names = bd->n_units;
	for (int i = 0; i < bd->n_own; i++)
		free(bd->own[i]);
	free(bd->units);
	free(bd->reg_c);
	free(bd->cureg);
	free(bd->main_c);
	toolchain_free(&bd->tc);
}

static int build_cached(const char *const *files, int n, int verbose, int cuda, int shared,
                        const struct tuned_in *tuned, char *bin, size_t bin_cap, char **names,
                        int *n_names, int *compiled, double *seconds)
{
	struct build bd;
	memset(&bd, 0, sizeof bd);
	bd.verbose = verbose;
	bd.cuda = cuda;
	bd.shared = shared;
	bd.t0 = now_s();
	char *tmp = NULL, key[65], root[PATH_MAX], dir[PATH_MAX + 80];
	int rc = 1;
	*compiled = 0;
	*seconds = 0;
	if (n_names)
		*n_names = 0;
	if (build_emit(&bd, files, n, tuned) != 0 || build_key(&bd, key) != 0 ||
	    cache_root(root, sizeof root) != 0)
		goto done;
	snprintf(dir, sizeof dir, "%s/%s", root, key);
	if ((size_t)snprintf(bin, bin_cap, "%s/bin", dir) >= bin_cap) {
		errf("%s: error: path too long", dir);
		goto done;
	}
	if (verbose)
		fprintf(stderr, "kvpc build: %s runtime %s; cache %s\n", bd.tc.where, bd.tc.lib, dir);
	if (is_file(bin) && access(bin, X_OK) == 0) {
		rc = 0;
		goto done;
	}
	/* build in a private directory, then rename it into place */
	if (asprintf(&tmp, "%s/.tmp-%s-%ld", root, key, (long)getpid()) < 0) {
		tmp = NULL;
		goto done;
	}
	if (mkdirs(tmp) != 0) {
		errf("%s: error: cannot create: %s", tmp, strerror(errno));
		goto done;
	}
	if (build_compile(&bd, tmp) != 0)
		goto done;
	if (rename(tmp, dir) != 0) {
		/* another build of the same key won the race: use its result */
		for (int i = 0; i < bd.n_own; i++)
			unlink(bd.own[i]);
		rmdir(tmp);
		if (!is_file(bin)) {
			errf("%s: error: cannot move the build into the cache: %s", dir, strerror(errno));
			goto done;
		}
	}
	*compiled = 1;
	rc = 0;
done:
	*seconds = now_s() - bd.t0;
	build_free(&bd, rc == 0, names, n_names);
	free(tmp);
	return rc;
}

/* ---- kvpc build --------------------------------------------------------------------------- */

/* Read the sidecar of every file that has one into tuned[0..n). Returns 0, or 1 after
 * printing the error; with gate, a file without one is an error too. */
static int tuned_load(const char *const *files, int n, int gate, struct tuned_in *tuned)
{
	int rc = 0;
	for (int i = 0; i < n; i++) {
		struct tuned_in *ti = &tuned[i];
		rt_tuned_init(&ti->t);
		if (rt_tuned_path(files[i], ti->path, sizeof ti->path) != 0) {
			errf("%s: error: path too long", files[i]);
			rc = 1;
		} else if (!is_file(ti->path)) {
			if (gate) {
				errf("%s: error: --gate: no sidecar %s (run kvpc tune %s --model M --text FILE "
				     "--max-kld X first)", files[i], ti->path, files[i]);
				rc = 1;
			}
			ti->path[0] = 0;
		} else {
			rt_err e = { "" };
			if (rt_tuned_read(ti->path, &ti->t, &e) != 0) {
				errf("%s", e.msg);
				rc = 1;
			}
		}
	}
	return rc;
}

/* --gate: run each tuned policy's gate with the cached binary. Returns 0 when all hold. */
static int gate_all(const char *bin, const char *out, const char *const *files, int n,
                    const struct tuned_in *tuned, const char *threads)
{
	for (int i = 0; i < n; i++) {
		if (!tuned[i].path[0])
			continue;
		const rt_tuned *t = &tuned[i].t;
		int dup = 0;
		for (int k = 0; k < i; k++)
			dup |= !strcmp(tuned[k].path, tuned[i].path);
		if (dup)
			continue;
		fprintf(stderr, "kvpc build --gate: %s: %s %g, mean KL <= %g on %d text%s%s\n",
		        t->policy, t->bytes ? "byte ratio" : "ratio", t->ratio, t->max_kld, t->n_texts, t->n_texts == 1 ? "" : "s",
		        t->min_passkey >= 0 ? ", passkey limit too" : "");
		int st = kvpc_gate_run(bin, t->policy, t, threads);
		if (st != 0) {
			errf("kvpc build: %s: refused: the quality gate of %s (%s, from %s) %s; %s was not "
			     "written", out, t->policy, tuned[i].path, files[i],
			     st == 1 ? "no longer holds" : "could not be checked", out);
			return 1;
		}
	}
	return 0;
}

int kvpc_cmd_build(int argc, char **argv)
{
	const char *out = NULL, *threads = NULL;
	int verbose = 0, n_files = 0, cuda = 0, gate = 0, shared = 0;
	const char **files = calloc((size_t)argc + 1, sizeof *files);
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(BUILD_HELP, stdout);
			free(files);
			return 0;
		} else if (!strcmp(argv[i], "-o")) {
			if (i + 1 >= argc) {
				free(files);
				fputs("kvpc build: -o needs a value\n", stderr);
				fputs(BUILD_USAGE, stderr);
				return 2;
			}
			out = argv[++i];
		} else if (!strcmp(argv[i], "-v")) {
			verbose = 1;
		} else if (!strcmp(argv[i], "--cuda")) {
			cuda = 1;
		} else if (!strcmp(argv[i], "--gate")) {
			gate = 1;
		} else if (!strcmp(argv[i], "--threads")) {
			char *end;
			long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
			/* the binary's own bound (runtime/cli/rt_cli_opts.c, --threads) */
			if (i + 1 >= argc || end == argv[i + 1] || *end || v < 1 || v > 256) {
				fprintf(stderr, "kvpc build: --threads needs a thread count 1..256%s%s%s\n",
				        i + 1 < argc ? " (got '" : "", i + 1 < argc ? argv[i + 1] : "",
				        i + 1 < argc ? "')" : "");
				fputs(BUILD_USAGE, stderr);
				free(files);
				return 2;
			}
			threads = argv[++i];
		} else if (!strcmp(argv[i], "--shared")) {
			shared = 1;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			fprintf(stderr, "kvpc build: unknown option '%s'\n", argv[i]);
			fputs(BUILD_USAGE, stderr);
			free(files);
			return 2;
		} else {
			files[n_files++] = argv[i];
		}
	}
	if (!n_files || !out || (shared && (cuda || gate || threads)) || (threads && !gate)) {
		fprintf(stderr, "kvpc build: %s\n", !n_files ? "no input file" : !out ? "-o BIN is required"
		        : shared ? "--shared takes neither --cuda nor --gate (nor its --threads)"
		        : "--threads sets the threads of --gate's runs; give --gate");
		fputs(BUILD_USAGE, stderr);
		free(files);
		return 2;
	}
	/* a clear error for an unwritable output before any work */
	char dirbuf[PATH_MAX];
	snprintf(dirbuf, sizeof dirbuf, "%s", out);
	char *slash = strrchr(dirbuf, '/');
	const char *odir = slash ? (slash == dirbuf ? "/" : (*slash = 0, dirbuf)) : ".";
	if (!is_dir(odir) || access(odir, W_OK) != 0 || is_dir(out)) {
		errf("%s: error: cannot write the binary: %s", out,
		     is_dir(out) ? "is a directory"
		     : !is_dir(odir) ? "no such directory" : strerror(EACCES));
		free(files);
		return 1;
	}
	char bin[PATH_MAX + 64];
	int compiled = 0, n_names = 0;
	double secs = 0;
	struct tuned_in *tuned = calloc((size_t)n_files, sizeof *tuned);
	/* a shared library takes its ratio per call: no tuned defaults */
	int rc = !tuned || (!shared && tuned_load(files, n_files, gate, tuned) != 0);
	if (!rc)
		rc = build_cached(files, n_files, verbose, cuda, shared, tuned, bin, sizeof bin, NULL,
		                  &n_names, &compiled, &secs);
	if (!rc && gate)
		rc = gate_all(bin, out, files, n_files, tuned, threads);
	for (int i = 0; tuned && i < n_files; i++)
		rt_tuned_free(&tuned[i].t);
	free(tuned);
	free(files);
	if (rc)
		return 1;
	int same = 0;
	if (install_bin(bin, out, &same) != 0)
		return 1;
	if (compiled)
		fprintf(stderr, "kvpc build: %s: compiled %d polic%s in %.2f s\n", out, n_names,
		        n_names == 1 ? "y" : "ies", secs);
	else
		fprintf(stderr, "kvpc build: %s: %s (cached)\n", out,
		        same ? "up to date" : "copied from the cache");
	return 0;
}
