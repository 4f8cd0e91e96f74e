/*
 * rt_cli_runs: one run from the command line or many from a --batch file; see
 * rt_cli_runs.h.
 */
#include "cli/rt_cli_runs.h"

#include "base/rt_numparse.h"
#include "base/rt_text.h"
#include "policy/rt_pick.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Store capacity of a run: every prompt token, or for a ratio run of a policy that
 * compresses as it goes (no prompt-end trigger) its budget plus RT_CLI_CAP_SLACK plus one
 * prefill chunk (what a chunk adds before the compress at its end). A tiered policy keeps
 * more entries than its budget's f16 count (they are narrower), so it gets every token. */
int32_t rt_cli_run_cap(const rt_cli_run *r, int64_t len, int64_t extra)
{
	int64_t cap = len + extra;
	if (r->o.ratio > 0 && !(r->p->needs & (KVP_NEED_PROMPT_LEN | KVP_NEED_TIERS))) {
		int64_t c = (int64_t)ceil((double)len / r->o.ratio) + RT_CLI_CAP_SLACK +
		            r->o.prefill_chunk + extra;
		cap = c < cap ? c : cap;
	}
	return (int32_t)cap;
}

enum rt_kv_type rt_cli_run_kv_type(const rt_cli_run *r, const rt_model *m)
{
	return r->o.kv_type ? (enum rt_kv_type)rt_kv_type_parse(r->o.kv_type) : m->kv_type;
}

/* Free K runs (their sequences and batch lines) and the array; K < 0 counts as 0. */
void rt_cli_runs_free(rt_cli_run *runs, int K)
{
	for (int i = 0; runs && i < K; i++) {
		rt_seq_free(&runs[i].seq);
		free(runs[i].line);
	}
	free(runs);
}

/* Parse a --batch file: one run per non-blank line that does not start with '#':
 * `POLICY [--ratio R | --byte-ratio R] [--set NAME=VALUE]... [--kv-type T]` (T: the run's KV
 * store type in place of the command's, rt_cli_run_kv_type). Checks every policy, override and ratio
 * (as --policy/--set/--ratio would) and reports FILE:LINE: reason for every bad line, not
 * the first only. Returns the runs (n in *n; *rc 0), or with *rc set after printing the
 * errors (the caller frees what it returns). */
static rt_cli_run *runs_parse(const char *cmd, const char *path, int *n, int *rc)
{
	size_t len;
	rt_err err = { "" };
	char *txt = rt_text_read(path, &len, &err);
	*n = 0;
	*rc = RT_CLI_USAGE;
	if (!txt) {
		rt_cli_fail(&err);
		return NULL;
	}
	int cap = 8;
	rt_cli_run *runs = calloc((size_t)cap, sizeof *runs);
	int lineno = 0, ok = runs != NULL, bad = 0;
	for (char *save = NULL, *ln = strtok_r(txt, "\n", &save); ok && ln;
	     ln = strtok_r(NULL, "\n", &save)) {
		lineno++;
		char *q = ln + strspn(ln, " \t\r");
		if (!*q || *q == '#')
			continue;
		if (*n == cap) {
			rt_cli_run *nr = realloc(runs, (size_t)cap * 2 * sizeof *runs);
			if (!nr) {
				ok = 0;
				break;
			}
			memset(nr + cap, 0, (size_t)cap * sizeof *runs);
			runs = nr, cap *= 2;
		}
		rt_cli_run *r = &runs[*n];
		if (!(r->line = strdup(q))) {
			ok = 0;
			break;
		}
		(*n)++;
		char *tok_save = NULL, *w = strtok_r(r->line, " \t\r", &tok_save);
		const char *name = w;
		const char *why = NULL;
		char whybuf[160];
		while (!why && (w = strtok_r(NULL, " \t\r", &tok_save))) {
			char *v = strtok_r(NULL, " \t\r", &tok_save);
			int bytes = !strcmp(w, "--byte-ratio");
			if (strcmp(w, "--ratio") && !bytes && strcmp(w, "--set") && strcmp(w, "--kv-type")) {
				snprintf(whybuf, sizeof whybuf, "unknown word '%s' (expected --ratio R, "
				         "--byte-ratio R, --set NAME=VALUE or --kv-type T)", w);
				why = whybuf;
			} else if (!v) {
				snprintf(whybuf, sizeof whybuf, "%s needs a value", w);
				why = whybuf;
			} else if (!strcmp(w, "--kv-type")) {
				if (rt_kv_type_parse(v) < 0) {
					snprintf(whybuf, sizeof whybuf, "--kv-type: '%.40s' is not f32, f16 or q8_0", v);
					why = whybuf;
				}
				r->o.kv_type = v;
			} else if (!strcmp(w, "--ratio") || bytes) {
				double x = 0;
				if (rt_parse_double(v, &x) || x == 0 || rt_ratio_check(x, bytes, NULL) != 0) {
					snprintf(whybuf, sizeof whybuf, "%s: '%s' is not a compression "
					         "factor >= 1", w, v);
					why = whybuf;
				}
				if (bytes)
					r->o.byte_ratio = x;
				else
					r->o.ratio = x;
			} else if (r->o.n_sets == RT_CLI_MAX_SETS) {
				why = "more than 64 --set overrides";
			} else if (!strchr(v, '=') || v[0] == '=') {
				snprintf(whybuf, sizeof whybuf, "--set: expected NAME=VALUE, got '%s'", v);
				why = whybuf;
			} else {
				r->o.sets[r->o.n_sets++] = v;
			}
		}
		if (!why) {
			r->o.policy = name;
			int prc; /* rt_cli_policy prints its own message */
			r->p = rt_cli_policy(cmd, &r->o, &prc);
			if (!r->p) {
				fprintf(stderr, "%s: %s:%d: the run above is refused\n", rt_cli_prog, path, lineno);
				if (!bad++ || prc != RT_CLI_USAGE)
					*rc = prc;
			}
		}
		if (why) {
			fprintf(stderr, "%s: %s:%d: %s\n", rt_cli_prog, path, lineno, why);
			r->p = NULL;
			bad++;
		}
	}
	free(txt);
	if (!ok) { /* reported even after bad lines: the lines after it were not checked */
		fprintf(stderr, "%s: out of memory reading %s\n", rt_cli_prog, path);
		*rc = EXIT_FAILURE;
		return runs;
	}
	if (bad) /* every bad line was reported; *rc: a usage error, unless a policy lookup
	          * failed otherwise (its status wins) */
		return runs;
	if (*n == 0) {
		fprintf(stderr, "%s: %s: no runs (one `POLICY [--ratio R] [--set NAME=VALUE]...` per "
		        "line)\n", rt_cli_prog, path);
		return runs;
	}
	*rc = 0;
	return runs;
}

/* The runs of a command: the lines of --batch, or the one run --policy/--set/--ratio give.
 * Returns them (count in *K; free with rt_cli_runs_free) or NULL after printing the error, *rc
 * the exit status. */
rt_cli_run *rt_cli_runs(const char *cmd, const rt_cli_opts *o, int *K, int *rc)
{
	rt_cli_run *runs;
	*K = 0;
	if (o->batch) {
		if (o->policy || o->n_sets || o->ratio > 0) {
			*rc = rt_cli_usage(cmd, "%s", "--batch gives every run's policy, --set and --ratio; "
			                "--policy, --set and --ratio cannot be combined with it");
			return NULL;
		}
		runs = runs_parse(cmd, o->batch, K, rc);
		if (*rc) {
			rt_cli_runs_free(runs, *K);
			return NULL;
		}
		for (int i = 0; i < *K; i++) { /* the command line's schedule, for every run */
			runs[i].o.prefill_chunk = o->prefill_chunk;
			/* a line that names no store, in a command that names none, gets the one
			 * rule of a single run (rt_cli_kv_type: f32 rows for a policy that needs
			 * them, GraceKV, on the fast path too), not the reference's f16 */
			if (!runs[i].o.kv_type && !o->kv_type) {
				rt_cli_opts one = { .policy = runs[i].p->name, .exact = o->exact };
				runs[i].o.kv_type = rt_kv_type_name(rt_cli_kv_type(&one));
			}
		}
		return runs;
	}
	rt_cli_opts one = *o;
	const struct kvp_policy *p = rt_cli_pick(cmd, &one, 1, rc); /* with a tuned default */
	if (!p)
		return NULL;
	if (!(runs = calloc(1, sizeof *runs))) {
		fprintf(stderr, "%s: out of memory\n", rt_cli_prog);
		*rc = EXIT_FAILURE;
		return NULL;
	}
	*K = 1;
	runs[0].p = p;
	runs[0].o = one;
	return runs;
}

