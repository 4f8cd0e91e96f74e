/*
 * kvpc_tune: `kvpc tune` (build, then the binary's `tune` writes the sidecar; see
 * kvpc_tune.h).
 */
#include "kvpc_tune.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpc_build.h"
#include "kvpc_run.h"
#include "policy/rt_tuned.h"

static const char TUNE_USAGE[] =
	"usage: kvpc tune POLICY.kvp --model M --text FILE [--text FILE]... --max-kld X\n"
	"                 [--min-passkey P] [--ctx N]\n"
	"                 [--ratio LIST | --byte-ratio LIST | --bytes | --entries]\n"
	"                 [--out FILE.tune] [-v] [more: BIN tune --help]\n";

static const char TUNE_HELP[] =
	"\n"
	"The quality gate: decide the acceptable quality loss, then compress as far as it\n"
	"allows. Builds (cached, see kvpc build --help) the policy into a binary and runs its\n"
	"`tune` command, which bisects a grid of compression ratios for the highest one whose\n"
	"mean KL against the full cache is at most X nats per token on every text (and whose\n"
	"passkey accuracy is at least P; a prompt-end policy such as snapkv is scored on the\n"
	"tokens after the first N/2 of each text, its prompt, as `BIN ppl --prompt N/2\n"
	"--score-from N/2+1`: docs/measuring.md), prints the frontier it walked (ratio, compression in\n"
	"bytes against an f16 full cache and in entries, each text's mean KL, passkey) and\n"
	"writes the choice to the policy's sidecar, POLICY.tune next to POLICY.kvp (or --out\n"
	"FILE). The ratio counts bytes against an f16 full cache (as --byte-ratio of ppl) for a\n"
	"policy whose budget is bytes(P) or that has a precision statement, entries (as\n"
	"--ratio) for the others; --bytes / --byte-ratio LIST or --entries / --ratio LIST\n"
	"choose for any policy. The sidecar records which. `kvpc build POLICY.kvp -o BIN`\n"
	"then bakes the budget in as the policy's default (BIN ppl without --ratio or\n"
	"--byte-ratio runs at it), and `kvpc build --gate` re-checks the limits and refuses\n"
	"the build when they fail. A budget that changes nothing (a policy that evicts\n"
	"nothing, KIVI-style, below its fixed compression; a floor or guards holding the\n"
	"budget on every text) does not bind: tune says so and writes no sidecar.\n"
	"\n"
	"  --model M, --text FILE   the GGUF model and your texts (--text repeatable)\n"
	"  --max-kld X              the limit on every text's mean KL (nats per token)\n"
	"  --min-passkey P          the limit on passkey accuracy (0..1; default: none)\n"
	"  --ctx N                  tokens of each text (default 256): the search's cost\n"
	"  --ratio LIST             the grid in entries (default 1.5,2,3,4,6,8,12,16,24,32)\n"
	"  --byte-ratio LIST        the grid in bytes against an f16 full cache (same default)\n"
	"  --bytes, --entries       which kind of budget to search with the default grid\n"
	"  --param NAME=LIST        search parameter NAME instead (a threshold(L) level:\n"
	"                           the highest value within the limits; no sidecar)\n"
	"  --lengths N, --depths D,..   passkey prompt tokens (256) and depths (10,50,90)\n"
	"  --seed S, --chunk N, --threads N, --quiet   as for BIN tune\n"
	"  --out FILE               the sidecar to write (default POLICY.tune)\n"
	"  -v                       show the build and the binary's command line\n"
	"\n"
	"exit status: 0 a ratio was chosen, 1 none is within the limits (or the chosen one\n"
	"does not bind) or an error, 2 usage\n";

/* Options of `BIN tune` that take a value (the rest are flags). */
static const char *const TUNE_VALUE_OPTS[] = {
	"--model", "-m", "--text", "-t", "--max-kld", "--min-passkey", "--ctx", "--ratio",
	"--byte-ratio", "--param",
	"--lengths", "--depths", "--seed", "--chunk", "--threads", NULL,
};

static int tune_usage(const char *msg)
{
	fprintf(stderr, "kvpc tune: %s\n", msg);
	fputs(TUNE_USAGE, stderr);
	return 2;
}

int kvpc_cmd_tune(int argc, char **argv)
{
	const char *file = NULL, *out = NULL;
	int verbose = 0, np = 0;
	char **pass = calloc((size_t)argc + 1, sizeof *pass);
	if (!pass)
		return 1;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			fputs(TUNE_USAGE, stdout);
			fputs(TUNE_HELP, stdout);
			free(pass);
			return 0;
		} else if (!strcmp(a, "-v")) {
			verbose = 1;
		} else if (!strcmp(a, "--gate") || !strcmp(a, "--policy") || !strncmp(a, "--set", 5)) {
			free(pass);
			return tune_usage(!strcmp(a, "--gate")
			                  ? "--gate is kvpc build's (kvpc build --gate POLICY.kvp -o BIN)"
			                  : !strcmp(a, "--policy")
			                  ? "--policy: the policy is the .kvp file given"
			                  : "--set: the sidecar bakes only the ratio; change parameters "
			                    "in the .kvp source");
		} else if (!strcmp(a, "--out")) {
			if (i + 1 >= argc) {
				free(pass);
				return tune_usage("--out needs a value");
			}
			out = argv[++i];
		} else if (a[0] == '-' && a[1]) {
			pass[np++] = argv[i];
			if (!strchr(a, '=') && kvpc_takes_value(TUNE_VALUE_OPTS, a)) {
				if (i + 1 >= argc) {
					free(pass);
					fprintf(stderr, "kvpc tune: %s needs a value\n", a);
					fputs(TUNE_USAGE, stderr);
					return 2;
				}
				pass[np++] = argv[++i];
			}
		} else if (!file) {
			file = a;
		} else {
			free(pass);
			fprintf(stderr, "kvpc tune: one policy file at a time ('%s' is a second)\n", a);
			fputs(TUNE_USAGE, stderr);
			return 2;
		}
	}
	if (!file) {
		free(pass);
		return tune_usage("no policy file");
	}
	int mrc = kvpc_need_model("tune", pass, np, TUNE_VALUE_OPTS);
	if (mrc) {
		free(pass);
		return mrc;
	}
	char sidecar[PATH_MAX];
	if (!out && rt_tuned_path(file, sidecar, sizeof sidecar) != 0) {
		free(pass);
		fprintf(stderr, "%s: error: path too long\n", file);
		return 1;
	}
	if (!out)
		out = sidecar;
	char bin[PATH_MAX + 64];
	char *names[1] = { NULL };
	int compiled = 0, n_names = 0;
	double secs = 0;
	const char *files[1] = { file };
	if (kvpc_build_cached(files, 1, verbose, bin, sizeof bin, names, &n_names, &compiled,
	                      &secs) != 0) {
		free(pass);
		return 1;
	}
	if (compiled || verbose)
		fprintf(stderr, "kvpc tune: built %s in %.2f s\n", file, secs);
	char *const head[] = { bin, "tune", "--policy", names[0], "--out", (char *)out };
	kvpc_exec_built(bin, head, (int)(sizeof head / sizeof head[0]), pass, np, verbose);
	free(pass);
	free(names[0]);
	return 1;
}
