/* kvpc_run: children and exec of the built binary (kvpc_run.h). */
#include "kvpc_run.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int kvpc_wait(pid_t pid)
{
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

int kvpc_exec_built(const char *bin, char *const *head, int nh, char *const *pass, int np,
                    int verbose)
{
	char **full = calloc((size_t)(nh + np) + 1, sizeof *full);
	if (!full) {
		fprintf(stderr, "%s: error: cannot run: out of memory\n", bin);
		return 1;
	}
	int nf = 0;
	for (int i = 0; i < nh; i++)
		full[nf++] = head[i];
	/* the built binary speaks as the front the user typed: "kvpc: ..." and "Try 'kvpc ab
	 * --help'", not the cache's file name */
	full[0] = "kvpc";
	for (int i = 0; i < np; i++)
		full[nf++] = pass[i];
	full[nf] = NULL;
	if (verbose) { /* the command that can be run again: the binary's path first */
		for (int i = 0; i < nf; i++)
			fprintf(stderr, "%s%s", i ? " " : "", i ? full[i] : bin);
		fputc('\n', stderr);
	}
	fflush(stdout);
	fflush(stderr);
	execv(bin, full);
	fprintf(stderr, "%s: error: cannot run: %s\n", bin, strerror(errno));
	free(full);
	return 1;
}

int kvpc_need_model(const char *cmd, char *const *pass, int np, const char *const *value_opts)
{
	const char *val = NULL; /* the last one given, as the runtime's getopt takes it */
	for (int i = 0; i < np; i++) {
		const char *o = pass[i], *eq = strchr(o, '=');
		const size_t ol = eq ? (size_t)(eq - o) : strlen(o);
		if (ol == 7 && !strncmp(o, "--model", 7))
			val = eq ? eq + 1 : i + 1 < np ? pass[i + 1] : "";
		else if (!strncmp(o, "-m", 2) && o[2]) /* -mFILE */
			val = o + 2;
		else if (!strcmp(o, "-m"))
			val = i + 1 < np ? pass[i + 1] : "";
		if (!eq && kvpc_takes_value(value_opts, o))
			i++;
	}
	if (!val) {
		fprintf(stderr, "kvpc %s: --model M is required (the GGUF model to measure on)\n", cmd);
		return 2;
	}
	if (access(val, R_OK) != 0) {
		fprintf(stderr, "kvpc %s: --model %s: %s\n", cmd, val, strerror(errno));
		return 1;
	}
	return 0;
}

int kvpc_takes_value(const char *const *value_opts, const char *opt)
{
	for (int i = 0; value_opts[i]; i++)
		if (!strcmp(opt, value_opts[i]))
			return 1;
	return 0;
}
