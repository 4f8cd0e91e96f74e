/*
 * kvpc_ab: `kvpc ab A.kvp B.kvp ...` (kvpc_ab.h): the command line, the paths checked
 * before the build, then the build and the binary's `ab`.
 */
#include "kvpc_ab.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpc_build.h"
#include "kvpc_run.h"
#include "base/rt_numparse.h"
#include "base/rt_outpath.h"
#include "base/rt_sha256.h"
#include "base/rt_text.h"
#include "policy/rt_policy.h"

#ifndef KVPC_COMMIT
#define KVPC_COMMIT "unknown"
#endif

static const char AB_USAGE[] =
	"usage: kvpc ab A.kvp B.kvp --model M --text FILE [--ratio 2,4,8 | --byte-ratio 2,4,8]\n"
	"               [--task ppl|needle] [--ctx N] [--json OUT] [--csv OUT] [--plot OUT.svg] [-v] [more: BIN ab --help]\n";

/* Options of `BIN ab` that take a value (everything else is a flag or a policy file). */
static const char *const AB_VALUE_OPTS[] = {
	"--model", "--text", "--ratio", "--byte-ratio", "--task", "--ctx", "--chunk", "--json", "--csv", "--plot",
	"--set", "--set-a", "--set-b", "--threads", "--lengths", "--depths", "--seed",
	"--resamples", "--mode", "--haystack", "--a", "--b", "--commit", "--label-a", "--label-b",
	"--trials", "--answer", "--source-sha256-a", "--source-sha256-b", "--prompt", "--score-from",
	"--prefill-chunk", "--kv-type", NULL,
};

/* `kvpc ab --help`: the runtime's ab usage, then what kvpc adds, on stdout. */
static void ab_help(void)
{
	fputs(AB_USAGE, stdout);
	fputs("\nBuilds (cached, see kvpc build --help) both policies into one binary and runs\n"
	      "its `ab` command, which loads the model once and runs the full-cache reference\n"
	      "and both policies over the same tokens, per compression ratio. All options\n"
	      "after the two files are those of `BIN ab --help`; -v shows the build.\n"
	      "\n"
	      "  --model M, --text FILE   the GGUF model and the text (task ppl)\n"
	      "  --ratio LIST             compression ratios (default 4): budget = N / R\n"
	      "  --task ppl|needle        perplexity + KL (default) or passkey accuracy\n"
	      "  --ctx N                  tokens of the text (default all, <= context)\n"
	      "  --set k=v, --set-a k=v, --set-b k=v   parameter overrides\n"
	      "  --json OUT, --csv OUT, --plot OUT.svg   reports with run metadata\n"
	      "  --lengths L,.., --depths D,.., --mode agnostic|aware   needle task\n"
	      "  --equal-memory           each ratio's more compressing side matched to the\n"
	      "                           other's memory at the end (task ppl)\n"
	      "  --threads N, --chunk N, --resamples B, --seed S\n"
	      "\n"
	      "exit status: 0 success, 1 build or runtime error, 2 usage error\n",
	      stdout);
}

/* The command line of `kvpc ab`: the two policy files into files, -v into *verbose, every
 * other option (with its value, for those in AB_VALUE_OPTS) into pass[0..*np) in order.
 * -1 to go on; else the exit status to return (0 after --help, 2 on a usage error, with
 * the message and the usage on stderr). */
static int ab_parse(int argc, char **argv, const char *files[2], int *verbose, char **pass,
                    int *np)
{
	int n_files = 0;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			ab_help();
			return 0;
		} else if (!strcmp(a, "-v")) {
			*verbose = 1;
		} else if (a[0] == '-' && a[1]) {
			pass[(*np)++] = argv[i];
			if (!strchr(a, '=') && kvpc_takes_value(AB_VALUE_OPTS, a)) {
				if (i + 1 >= argc) {
					fprintf(stderr, "kvpc ab: %s needs a value\n", a);
					fputs(AB_USAGE, stderr);
					return 2;
				}
				pass[(*np)++] = argv[++i];
			}
		} else if (n_files < 2) {
			files[n_files++] = a;
		} else {
			fprintf(stderr, "kvpc ab: more than two policy files ('%s')\n", a);
			fputs(AB_USAGE, stderr);
			return 2;
		}
	}
	if (n_files != 2) {
		fputs("kvpc ab: two policy files are needed (A.kvp B.kvp; the same file twice compares "
		      "a policy with itself)\n", stderr);
		fputs(AB_USAGE, stderr);
		return 2;
	}
	return -1;
}

/* 1 when v is a list of compression factors as the built binary parses --ratio and
 * --byte-ratio (rt_parse_ratio_list, its count bound included), so kvpc refuses a list
 * exactly when the binary would, before the build. */
static int ab_ratio_list_ok(const char *v)
{
	double x[RT_RATIO_LIST_MAX];
	int n;
	return rt_parse_ratio_list(v, x, &n) == 0;
}

/* The text, the ratio lists and the output paths among the passed options pass[0..np),
 * checked first: a bad one is reported before the build. 0, or the exit status (1: the
 * text cannot be read, 2: a ratio list is malformed or an output path is not writable)
 * with the message on stderr. */
static int ab_check_paths(char *const *pass, int np)
{
	for (int i = 0; i < np; i++) {
		const char *o = pass[i], *eq = strchr(o, '=');
		const char *val = eq ? eq + 1 : i + 1 < np ? pass[i + 1] : NULL;
		size_t ol = eq ? (size_t)(eq - o) : strlen(o);
		rt_err e = { "" };
		if (!val)
			break;
		if (ol == 6 && !strncmp(o, "--text", 6)) {
			size_t n;
			char *t = rt_text_read(val, &n, &e);
			free(t);
			if (!t) {
				fprintf(stderr, "kvpc ab: %s\n", e.msg);
				return 1;
			}
		} else if ((ol == 7 && !strncmp(o, "--ratio", 7)) ||
		           (ol == 12 && !strncmp(o, "--byte-ratio", 12))) {
			if (!ab_ratio_list_ok(val)) {
				fprintf(stderr, "kvpc ab: %.*s: '%s' is not a comma-separated list of "
				        "at most %d compression factors >= 1\n", (int)ol, o, val,
				        RT_RATIO_LIST_MAX);
				fputs(AB_USAGE, stderr);
				return 2;
			}
		} else if (((ol == 6 && (!strncmp(o, "--json", 6) || !strncmp(o, "--plot", 6))) ||
		            (ol == 5 && !strncmp(o, "--csv", 5))) && rt_outpath_check(val, &e) != 0) {
			fprintf(stderr, "kvpc ab: %.*s: %s\n", (int)ol, o, e.msg);
			return 2;
		}
		if (!eq && kvpc_takes_value(AB_VALUE_OPTS, o))
			i++;
	}
	return 0;
}

/* Build files[0] and files[1] (cached) into one binary and exec its `ab` with the policy
 * names, the commit, both sources' SHA-256 and pass[0..np). Returns only on failure: 1,
 * the message on stderr. */
static int ab_build_exec(const char *files[2], int verbose, char *const *pass, int np)
{
	char bin[PATH_MAX + 64];
	char *names[2] = { NULL, NULL };
	int compiled = 0, n_names = 0;
	double secs = 0;
	if (kvpc_build_cached(files, 2, verbose, bin, sizeof bin, names, &n_names, &compiled,
	                      &secs) != 0)
		return 1;
	if (compiled || verbose)
		fprintf(stderr, "kvpc ab: built %s and %s in %.2f s\n", files[0], files[1], secs);
	/* names: the same file (or identical sources) twice registers one policy */
	const char *na = names[0], *nb = n_names > 1 ? names[1] : names[0];
	char sha[2][65];
	for (int i = 0; i < 2; i++) {
		rt_err e;
		if (rt_sha256_file(files[i], sha[i], &e) != 0)
			snprintf(sha[i], sizeof sha[i], "unknown");
	}
	char *const head[] = { bin, "ab", "--a", (char *)na, "--b", (char *)nb, "--commit",
		               KVPC_COMMIT, "--source-sha256-a", sha[0], "--source-sha256-b", sha[1] };
	kvpc_exec_built(bin, head, (int)(sizeof head / sizeof head[0]), pass, np, verbose);
	free(names[0]);
	free(names[1]);
	return 1;
}

int kvpc_cmd_ab(int argc, char **argv)
{
	const char *files[2];
	int verbose = 0, np = 0;
	char **pass = calloc((size_t)argc + 32, sizeof *pass);
	int rc = ab_parse(argc, argv, files, &verbose, pass, &np);
	if (rc < 0 && !(rc = kvpc_need_model("ab", pass, np, AB_VALUE_OPTS)) &&
	    !(rc = ab_check_paths(pass, np)))
		rc = ab_build_exec(files, verbose, pass, np);
	free(pass);
	return rc;
}
