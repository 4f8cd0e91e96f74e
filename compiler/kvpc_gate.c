/* kvpc_gate: `kvpc build --gate`'s run of the built binary's `tune --gate` (kvpc_gate.h). */
#include "kvpc_gate.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvpc_run.h"

int kvpc_gate_run(const char *bin, const char *name, const rt_tuned *t, const char *threads)
{
	char ratio[64], kld[64], ctx[32], pk[64], pklen[32], chunk[32];
	snprintf(ratio, sizeof ratio, "%.17g", t->ratio);
	snprintf(kld, sizeof kld, "%.17g", t->max_kld);
	snprintf(ctx, sizeof ctx, "%ld", t->ctx);
	snprintf(pk, sizeof pk, "%.17g", t->min_passkey);
	snprintf(pklen, sizeof pklen, "%ld", t->passkey_len);
	const char *argv[32 + 2 * RT_TUNED_MAX_TEXTS];
	int n = 0;
	/* argv[0]: the binary's messages name the driver the user ran, not the file being
	 * built ("kvpc: gate failed: ...") */
	const char *fixed[] = { "kvpc", "tune", "--gate", "--quiet", "--policy", name,
		                t->bytes ? "--byte-ratio" : "--ratio", ratio,
		                "--model", t->model, "--ctx", ctx, "--max-kld", kld };
	for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
		argv[n++] = fixed[i];
	for (int i = 0; i < t->n_texts; i++) {
		argv[n++] = "--text";
		argv[n++] = t->texts[i];
	}
	if (t->min_passkey >= 0) {
		const char *more[] = { "--min-passkey", pk, "--lengths", pklen, "--depths", t->depths };
		for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
			argv[n++] = more[i];
	}
	if (t->fast) /* the path tune measured on: another path reaches other bytes and KL */
		argv[n++] = "--fast";
	if (t->f32_act)
		argv[n++] = "--f32-act";
	if (t->chunk > 0) { /* its chunk too: on the fast path it moves the rounding */
		snprintf(chunk, sizeof chunk, "%ld", t->chunk);
		argv[n++] = "--chunk";
		argv[n++] = chunk;
	}
	if (threads) {
		argv[n++] = "--threads";
		argv[n++] = threads;
	}
	argv[n] = NULL;
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "kvpc build --gate: error: cannot fork: %s\n", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		execv(bin, (char *const *)argv);
		fprintf(stderr, "%s: error: cannot run: %s\n", bin, strerror(errno));
		_exit(127);
	}
	return kvpc_wait(pid);
}
