/*
 * kvpc: the policy compiler's command line. It models the three jobs a policy author
 * needs: check a .kvp file (located diagnostics only), emit C for one policy or the
 * registry of several, and print a file in canonical form.
 *
 *   kvpc check [--target paged] FILE.kvp...
 *   kvpc emit --target c FILE.kvp [-o OUT] [--no-line]
 *   kvpc emit --target registry A.kvp B.kvp... [-o OUT]
 *   kvpc fmt FILE.kvp... [-w]
 *   kvpc build FILE.kvp... -o BIN [--gate]   (compiler/kvpc_build.h)
 *   kvpc build --shared FILE.kvp... -o LIB.so (the shared ABI, docs/shared_abi.md)
 *   kvpc ab A.kvp B.kvp ..., kvpc tune FILE.kvp ...   (kvpc_ab.h, kvpc_tune.h)
 *   kvpc --help | --version
 *
 * Exit status: 0 success, 1 diagnostics (errors in a .kvp file, or an output that cannot
 * be written), 2 usage errors (unknown command or option, missing file argument).
 * Diagnostics go to stderr in the format of compiler/kvp_src.h; output files are
 * written only when there are no errors, and a failed write removes the partial file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_emit_c.h"
#include "kvp_emit_cuda.h"
#include "kvp_fmt.h"
#include "kvp_ir.h"
#include "kvp_paged.h"
#include "kvp_sema.h"
#include "kvp_src.h"
#include "kvpc_ab.h"
#include "kvpc_build.h"
#include "kvpc_tune.h"

static const char USAGE[] =
	"usage: kvpc check [--target paged] FILE.kvp...\n"
	"       kvpc emit --target c FILE.kvp [-o OUT] [--no-line]\n"
	"       kvpc emit --target registry A.kvp B.kvp... [-o OUT]\n"
	"       kvpc emit --target cuda FILE.kvp [-o OUT] | --target cuda-registry A.kvp...\n"
	"       kvpc fmt FILE.kvp... [-w]\n"
	"       kvpc build FILE.kvp... -o BIN [--gate [--threads N]] [-v]\n"
	"       kvpc build --shared FILE.kvp... -o LIB.so [-v]\n"
	"       kvpc tune FILE.kvp --model M --text FILE... --max-kld X [--min-passkey P] [...]\n"
	"       kvpc ab A.kvp B.kvp --model M --text FILE [--ratio 2,4,8] [...]\n"
	"       kvpc --help | --version\n";

static const char HELP[] =
	"kvpc: the compiler of .kvp KV-cache compression policies (docs/language.md).\n"
	"\n"
	"commands:\n"
	"  check FILE.kvp...      parse and check each file; print located diagnostics\n"
	"       --target paged    also say why a paged engine (vLLM) cannot run it\n"
	"  emit --target c FILE   emit the policy as C (policy ABI, runtime/policy/rt_policy.h)\n"
	"       -o OUT            write to OUT instead of stdout\n"
	"       --no-line         omit #line directives back to the .kvp source\n"
	"  emit --target registry FILES...\n"
	"                         emit the registry unit listing the policies of FILES\n"
	"  emit --target cuda FILE   emit the policy's CUDA unit (docs/cuda.md)\n"
	"  emit --target cuda-registry FILES...\n"
	"                         emit the CUDA registry and backend table of FILES\n"
	"  fmt FILE.kvp...        print each file in canonical form\n"
	"       -w                rewrite the files in place instead\n"
	"  build FILE.kvp... -o BIN\n"
	"                         compile policies into a per-deployment binary (cached);\n"
	"                         BIN info | ppl | needle | run | tokenize | bench |\n"
	"                         keepmap | serve | ab | tune (BIN CMD --help);\n"
	"       --gate            re-check each policy's quality gate (every one needs a\n"
	"                         sidecar from kvpc tune), else no BIN; --threads N\n"
	"                         for its model runs\n"
	"       --cuda            also build the CUDA units (BIN ppl|bench --device cuda)\n"
	"  build --shared FILE.kvp... -o LIB.so\n"
	"                         a shared library with the C ABI of docs/shared_abi.md\n"
	"                         (paged policies only; the vLLM plug-in loads it)\n"
	"  tune FILE.kvp --model M --text FILE... --max-kld X\n"
	"                         the highest compression ratio within the quality limit on\n"
	"                         your texts; writes FILE.tune, which build bakes in as the\n"
	"                         default (build --gate re-checks it; kvpc tune --help)\n"
	"  ab A.kvp B.kvp --model M --text FILE\n"
	"                         build both into one binary and compare them side by side\n"
	"                         on the real model (kvpc ab --help)\n"
	"\n"
	"exit status: 0 success, 1 diagnostics, 2 usage error\n";

static int usage(const char *msg)
{
	if (msg)
		fprintf(stderr, "kvpc: %s\n", msg);
	fputs(USAGE, stderr);
	return 2;
}

/* Open and check one file; prints its diagnostics. Returns the src (NULL when the file
 * cannot be read, after printing why) and *ok. */
static kvp_src *load(const char *path)
{
	char err[512];
	kvp_src *src = kvp_src_open(path, err, sizeof err);
	if (!src)
		fprintf(stderr, "%s: error: %s\n", path, strchr(err, ':') ? strchr(err, ':') + 2 : err);
	return src;
}

/* `--target paged` / `--target=paged` at argv[i]: 1 (and *i past it), 0 when argv[i] is
 * something else, -1 for another target (a usage error). */
static int target_paged(int argc, char **argv, int *i)
{
	const char *t = NULL;
	if (!strcmp(argv[*i], "--target") && *i + 1 < argc)
		t = argv[++*i];
	else if (!strncmp(argv[*i], "--target=", 9))
		t = argv[*i] + 9;
	else
		return 0;
	return !strcmp(t, "paged") ? 1 : -1;
}

static int cmd_check(int argc, char **argv)
{
	int bad = 0, paged = 0, n_files = 0;
	for (int i = 0; i < argc; i++) {
		const int tp = target_paged(argc, argv, &i);
		if (tp < 0)
			return usage("check: unknown target (the only check target is paged)");
		paged |= tp;
		if (!tp && argv[i][0] == '-' && argv[i][1])
			return usage("check: unknown option");
		if (!tp)
			argv[n_files++] = argv[i];
	}
	if (n_files == 0)
		return usage("check: no input file");
	for (int i = 0; i < n_files; i++) {
		kvp_src *src = load(argv[i]);
		if (!src) {
			bad = 1;
			continue;
		}
		struct kvp_ir ir;
		int ok = kvp_compile(src, &ir) == 0;
		/* the paged subset (kvp_paged.h): located refusals, after the file's own checks */
		if (ok && paged && kvp_paged_check(&ir, src) != 0) {
			kvp_ir_free(&ir);
			ok = 0;
		}
		fputs(kvp_src_diags(src), stderr);
		if (ok) {
			/* one line per good file, so a successful check says what it checked */
			printf("%s: ok (policy %s%s)\n", argv[i], ir.name, paged ? ", paged" : "");
			kvp_ir_free(&ir);
		} else {
			bad = 1;
		}
		kvp_src_free(src);
	}
	if (fflush(stdout) != 0)
		bad = 1;
	return bad;
}

/* Write through a temporary buffer so that a failing emitter leaves no partial file. */
static int write_out(const char *out_path, char *buf, size_t len)
{
	if (!out_path) {
		if (fwrite(buf, 1, len, stdout) != len || fflush(stdout) != 0) {
			fprintf(stderr, "kvpc: error: cannot write to stdout: %s\n", strerror(errno));
			return 1;
		}
		return 0;
	}
	FILE *f = fopen(out_path, "wb");
	if (!f) {
		fprintf(stderr, "%s: error: cannot create: %s\n", out_path, strerror(errno));
		return 1;
	}
	int ok = fwrite(buf, 1, len, f) == len;
	ok &= fclose(f) == 0;
	if (!ok) {
		fprintf(stderr, "%s: error: cannot write: %s\n", out_path, strerror(errno));
		remove(out_path);
		return 1;
	}
	return 0;
}

static int cmd_emit(int argc, char **argv)
{
	const char *target = NULL, *out = NULL;
	int lines = 1;
	const char **files = calloc((size_t)argc + 1, sizeof *files);
	int n_files = 0;
	if (!files)
		return 1;
	int rc = 0;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--target") || !strcmp(argv[i], "-o")) {
			if (i + 1 >= argc) {
				rc = usage("emit: option needs a value");
				goto done;
			}
			if (argv[i][1] == 'o')
				out = argv[++i];
			else
				target = argv[++i];
		} else if (!strncmp(argv[i], "--target=", 9)) {
			target = argv[i] + 9;
		} else if (!strcmp(argv[i], "--no-line")) {
			lines = 0;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			rc = usage("emit: unknown option");
			goto done;
		} else {
			files[n_files++] = argv[i];
		}
	}
	if (!target) {
		rc = usage("emit: --target c, registry, cuda or cuda-registry is required");
		goto done;
	}
	const int is_cu = !strcmp(target, "cuda"), is_cureg = !strcmp(target, "cuda-registry");
	int is_c = !strcmp(target, "c") || is_cu;
	if (!is_c && strcmp(target, "registry") != 0 && !is_cureg) {
		rc = usage("emit: unknown target (use c, registry, cuda or cuda-registry)");
		goto done;
	}
	if (n_files == 0 || (is_c && n_files != 1)) {
		rc = usage(is_c ? "emit --target c: exactly one input file" : "emit: no input file");
		goto done;
	}
	char *buf = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&buf, &len);
	if (!mem) {
		rc = 1;
		goto done;
	}
	if (is_c) {
		kvp_src *src = load(files[0]);
		struct kvp_ir ir;
		if (!src) {
			rc = 1;
		} else if (kvp_compile(src, &ir) != 0) {
			rc = 1;
		} else {
			struct kvp_emit_opts opts = { .line_directives = lines, .out_name = out };
			if ((is_cu ? kvp_emit_cuda(&ir, &opts, mem) : kvp_emit_c(&ir, &opts, mem)) != 0) {
				fprintf(stderr, "%s: error: the %s emitter failed\n", files[0], is_cu ? "CUDA" : "C");
				rc = 1;
			}
			kvp_ir_free(&ir);
		}
		if (src) {
			fputs(kvp_src_diags(src), stderr);
			kvp_src_free(src);
		}
	} else {
		char **names = calloc((size_t)n_files, sizeof *names);
		int n_names = 0;
		for (int i = 0; i < n_files && names; i++) {
			kvp_src *src = load(files[i]);
			struct kvp_ir ir;
			if (!src) {
				rc = 1;
				continue;
			}
			if (kvp_compile(src, &ir) == 0) {
				names[n_names++] = strdup(ir.name);
				kvp_ir_free(&ir);
			} else {
				rc = 1;
			}
			fputs(kvp_src_diags(src), stderr);
			kvp_src_free(src);
		}
		if (rc == 0 && names) {
			char err[512] = "";
			if ((is_cureg ? kvp_emit_cuda_registry((const char *const *)names, n_names, mem, err, sizeof err)
			              : kvp_emit_registry((const char *const *)names, n_names, mem, err, sizeof err)) != 0) {
				fprintf(stderr, "kvpc: error: %s\n", err[0] ? err : "registry failed");
				rc = 1;
			}
		}
		for (int i = 0; i < n_names; i++)
			free(names[i]);
		free(names);
	}
	fclose(mem);
	if (rc == 0)
		rc = write_out(out, buf, len);
	free(buf);
done:
	free(files);
	return rc;
}

static int cmd_fmt(int argc, char **argv)
{
	int write = 0, n_files = 0;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "-w"))
			write = 1;
		else if (argv[i][0] == '-' && argv[i][1])
			return usage("fmt: unknown option");
		else
			n_files++;
	}
	if (n_files == 0)
		return usage("fmt: no input file");
	int rc = 0;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "-w"))
			continue;
		kvp_src *src = load(argv[i]);
		if (!src) {
			rc = 1;
			continue;
		}
		char *text = kvp_fmt_src(src);
		fputs(kvp_src_diags(src), stderr);
		if (!text) {
			rc = 1;
		} else if (write) {
			if (strlen(text) != src->len || memcmp(text, src->text, src->len) != 0)
				rc |= write_out(argv[i], text, strlen(text));
		} else {
			rc |= write_out(NULL, text, strlen(text));
		}
		free(text);
		kvp_src_free(src);
	}
	return rc;
}

static const char HELP_CHECK[] =
	"usage: kvpc check [--target paged] FILE.kvp...\n"
	"Parse and check each policy; print located diagnostics on stderr and one line\n"
	"'FILE: ok (policy NAME)' per good file on stdout (docs/language.md).\n"
	"  --target paged   also refuse, with a located reason each, what a paged engine\n"
	"                   cannot run in this version (merging, precision tiers, positions\n"
	"                   compacted, budgets that differ per head or layer, compressing\n"
	"                   before the prompt end, per-step observe; docs/vllm.md)\n"
	"exit status: 0 every file checks, 1 diagnostics, 2 usage error\n";
static const char HELP_EMIT[] =
	"usage: kvpc emit --target c FILE.kvp [-o OUT] [--no-line]\n"
	"       kvpc emit --target registry A.kvp B.kvp... [-o OUT]\n"
	"       kvpc emit --target cuda FILE.kvp [-o OUT] | --target cuda-registry A.kvp...\n"
	"Emit a policy as C against the policy ABI (runtime/policy/rt_policy.h), the registry\n"
	"of several policies, or their CUDA units (docs/cuda.md); stdout unless -o OUT.\n"
	"  --no-line   omit #line directives back to the .kvp source\n"
	"exit status: 0 success, 1 diagnostics or write error, 2 usage error\n";
static const char HELP_FMT[] =
	"usage: kvpc fmt FILE.kvp... [-w]\n"
	"Print each policy in canonical form; -w rewrites the files that differ in place.\n"
	"exit status: 0 success, 1 diagnostics or write error, 2 usage error\n";

/* the subcommands: each takes the arguments after its name; help is printed by main for
 * `kvpc CMD --help` (NULL: the command prints its own, with its options) */
static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *help;
} commands[] = {
	{ "check", cmd_check, HELP_CHECK },   { "emit", cmd_emit, HELP_EMIT },
	{ "fmt", cmd_fmt, HELP_FMT },         { "build", kvpc_cmd_build, NULL },
	{ "ab", kvpc_cmd_ab, NULL },          { "tune", kvpc_cmd_tune, NULL },
};

/* 1 when args hold `flag` */
static int has_flag(int argc, char **argv, const char *flag)
{
	for (int i = 0; i < argc; i++)
		if (!strcmp(argv[i], flag))
			return 1;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(NULL);
	const char *cmd = argv[1];
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
		fputs(HELP, stdout);
		fputs(USAGE, stdout);
		return 0;
	}
	if (!strcmp(cmd, "--version")) {
		printf("kvpc %s\n", KVP_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
		if (strcmp(cmd, commands[i].name))
			continue;
		if (has_flag(argc - 2, argv + 2, "--version")) {
			printf("kvpc %s\n", KVP_VERSION);
			return 0;
		}
		if (commands[i].help &&
		    (has_flag(argc - 2, argv + 2, "--help") || has_flag(argc - 2, argv + 2, "-h"))) {
			fputs(commands[i].help, stdout);
			return 0;
		}
		return commands[i].run(argc - 2, argv + 2);
	}
	fprintf(stderr, "kvpc: unknown command '%s'\n", cmd);
	fputs(USAGE, stderr);
	return 2;
}
