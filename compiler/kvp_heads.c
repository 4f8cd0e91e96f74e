/*
 * kvp_heads: the readers of head_score()'s and linear_score()'s weight files; the formats
 * are in kvp_heads.h.
 */
#include "kvp_heads.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The next line with content (comment cut, blanks trimmed) into line; 0 at the end, -1
 * for a line that does not fit in n bytes. */
static int next_line(FILE *f, char *line, size_t n, int *lineno)
{
	while (fgets(line, (int)n, f)) {
		(*lineno)++;
		if (strlen(line) == n - 1 && line[n - 2] != '\n' && !feof(f))
			return -1;
		char *c = strchr(line, '#');
		if (c)
			*c = 0;
		size_t k = strlen(line);
		while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ' ||
		                 line[k - 1] == '\t'))
			line[--k] = 0;
		const char *p = line + strspn(line, " \t");
		if (*p)
			return 1;
	}
	return 0;
}

static int fail(char *err, size_t errlen, const char *path, int lineno, const char *why)
{
	if (lineno > 0)
		snprintf(err, errlen, "%s:%d: %s", path, lineno, why);
	else
		snprintf(err, errlen, "%s: %s", path, why);
	return -1;
}

/* The G weights of one line into w (doubles, or floats when wf); -1 with the reason in
 * why. */
static int parse_row(const char *line, int G, double *w, float *wf, char *why, size_t n)
{
	const char *p = line;
	for (int g = 0; g < G; g++) {
		char *end;
		errno = 0;
		double v = strtod(p, &end);
		if (end == p) {
			snprintf(why, n, "expected %d weights on this line, found %d", G, g);
			return -1;
		}
		if (errno == ERANGE || !isfinite(v)) {
			snprintf(why, n, "weight %d is not a finite number", g + 1);
			return -1;
		}
		if (wf)
			wf[g] = (float)v;
		else
			w[g] = v;
		p = end;
	}
	p += strspn(p, " \t");
	if (*p) {
		snprintf(why, n, "more than %d weights on this line", G);
		return -1;
	}
	return 0;
}

int kvp_heads_read(const char *path, int *layers, int *kv_heads, double **w, char *err,
                   size_t errlen)
{
	*w = NULL;
	FILE *f = fopen(path, "r");
	if (!f) {
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
		return -1;
	}
	char line[65536], why[160];
	int lineno = 0, L = 0, G = 0, rc = -1;
	double *tab = NULL;
	char tail[8];
	if (next_line(f, line, sizeof line, &lineno) != 1) {
		fail(err, errlen, path, 0, "empty; expected a first line `heads LAYERS KV_HEADS`");
		goto out;
	}
	if (sscanf(line, " heads %d %d %7s", &L, &G, tail) != 2 || L < 1 || G < 1) {
		fail(err, errlen, path, lineno, "expected `heads LAYERS KV_HEADS` (whole numbers >= 1)");
		goto out;
	}
	if ((long long)L * G > KVP_HEADS_MAX) {
		snprintf(why, sizeof why, "%d x %d weights; the limit is %d", L, G, KVP_HEADS_MAX);
		fail(err, errlen, path, lineno, why);
		goto out;
	}
	tab = malloc((size_t)L * (size_t)G * sizeof *tab);
	if (!tab) {
		fail(err, errlen, path, 0, "out of memory");
		goto out;
	}
	for (int l = 0; l < L; l++) {
		if (next_line(f, line, sizeof line, &lineno) != 1) {
			snprintf(why, sizeof why, "%d layer lines expected, the file ends after %d", L, l);
			fail(err, errlen, path, 0, why);
			goto out;
		}
		if (parse_row(line, G, tab + (size_t)l * G, NULL, why, sizeof why) != 0) {
			fail(err, errlen, path, lineno, why);
			goto out;
		}
	}
	if (next_line(f, line, sizeof line, &lineno) != 0) {
		snprintf(why, sizeof why, "more than the %d layer lines the header declares", L);
		fail(err, errlen, path, lineno, why);
		goto out;
	}
	*layers = L;
	*kv_heads = G;
	*w = tab;
	tab = NULL;
	rc = 0;
out:
	free(tab);
	fclose(f);
	return rc;
}

/* The rows of linear_score()'s file after its header line: L × G lines of E + 1 numbers. */
static int linear_rows(FILE *f, const char *path, char *line, size_t n, int *lineno, int L,
                       int G, int E, float *tab, char *err, size_t errlen)
{
	char why[160];
	const int rows = L * G;
	for (int r = 0; r < rows; r++) {
		int got = next_line(f, line, n, lineno);
		if (got < 0)
			return fail(err, errlen, path, *lineno, "line too long");
		if (got == 0) {
			snprintf(why, sizeof why, "truncated: %d rows of %d numbers expected (%d layers x %d "
			         "KV heads), the file ends after %d", rows, E + 1, L, G, r);
			return fail(err, errlen, path, 0, why);
		}
		if (parse_row(line, E + 1, NULL, tab + (size_t)r * (size_t)(E + 1), why, sizeof why))
			return fail(err, errlen, path, *lineno, why);
	}
	if (next_line(f, line, n, lineno) != 0) {
		snprintf(why, sizeof why, "more than the %d rows the header declares", rows);
		return fail(err, errlen, path, *lineno, why);
	}
	return 0;
}

int kvp_linear_read(const char *path, int *layers, int *kv_heads, int *embd, float **w,
                    char *err, size_t errlen)
{
	*w = NULL;
	FILE *f = fopen(path, "r");
	if (!f) {
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
		return -1;
	}
	const size_t n = (size_t)(KVP_LINEAR_MAX_E + 1) * 40 + 64; /* 40 bytes a number */
	char *line = malloc(n), why[160], tail[8];
	int lineno = 0, L = 0, G = 0, E = 0, rc = -1;
	float *tab = NULL;
	if (!line) {
		fail(err, errlen, path, 0, "out of memory");
		goto out;
	}
	if (next_line(f, line, n, &lineno) != 1) {
		fail(err, errlen, path, 0, "empty; expected a first line `linear LAYERS KV_HEADS HIDDEN`");
		goto out;
	}
	if (sscanf(line, " linear %d %d %d %7s", &L, &G, &E, tail) != 3 || L < 1 || G < 1 ||
	    E < 1 || E > KVP_LINEAR_MAX_E) {
		snprintf(why, sizeof why, "expected `linear LAYERS KV_HEADS HIDDEN` (whole numbers >= 1, "
		         "HIDDEN <= %d)", KVP_LINEAR_MAX_E);
		fail(err, errlen, path, lineno, why);
		goto out;
	}
	if ((long long)L * G * (E + 1) > KVP_LINEAR_MAX) {
		snprintf(why, sizeof why, "%d x %d x %d numbers; the limit is %d", L, G, E + 1,
		         KVP_LINEAR_MAX);
		fail(err, errlen, path, lineno, why);
		goto out;
	}
	tab = malloc((size_t)L * (size_t)G * (size_t)(E + 1) * sizeof *tab);
	if (!tab) {
		fail(err, errlen, path, 0, "out of memory");
		goto out;
	}
	if (linear_rows(f, path, line, n, &lineno, L, G, E, tab, err, errlen) != 0)
		goto out;
	*layers = L, *kv_heads = G, *embd = E;
	*w = tab;
	tab = NULL;
	rc = 0;
out:
	free(tab);
	free(line);
	fclose(f);
	return rc;
}
