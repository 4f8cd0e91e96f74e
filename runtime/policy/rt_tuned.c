/*
 * rt_tuned: read and write the sidecar of a tuned policy (format in rt_tuned.h).
 */
#include "policy/rt_tuned.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void rt_tuned_init(rt_tuned *t)
{
	memset(t, 0, sizeof *t);
	t->min_passkey = -1;
	t->kld = -1;
	t->passkey = -1;
	t->bytes_x = -1;
	t->entries_x = -1;
}

void rt_tuned_free(rt_tuned *t)
{
	free(t->model);
	for (int i = 0; i < t->n_texts; i++)
		free(t->texts[i]);
	rt_tuned_init(t);
}

int rt_tuned_path(const char *kvp_path, char *out, size_t cap)
{
	size_t n = strlen(kvp_path);
	if (n > 4 && !strcmp(kvp_path + n - 4, ".kvp"))
		n -= 4;
	if (n + 6 > cap)
		return -1;
	memcpy(out, kvp_path, n);
	memcpy(out + n, ".tune", 6);
	return 0;
}

/* A finite number in [lo, hi]: 0, or -1. */
static int num_in(const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* The keys in file order of rt_tuned.h; seen[] marks repeats. */
enum { K_POLICY, K_HASH, K_RATIO, K_MAXKLD, K_MINPK, K_PKLEN, K_DEPTHS, K_CTX, K_MODEL,
       K_TEXT, K_KLD, K_PASSKEY, K_BYTERATIO, K_BYTESX, K_ENTRIESX, K_PATH, K_CHUNK,
       K_COUNT };
static const char *const KEYS[K_COUNT] = { "policy", "source_hash", "ratio", "max_kld",
	"min_passkey", "passkey_len", "depths", "ctx", "model", "text", "kld", "passkey",
	"byte_ratio", "bytes_x", "entries_x", "path", "chunk" };

/* Store one key's value; returns "" or why it is bad. */
static const char *tuned_set(rt_tuned *t, int k, const char *v)
{
	double x;
	switch (k) {
	case K_POLICY:
		if (!v[0] || strlen(v) >= sizeof t->policy || strpbrk(v, " \t"))
			return "policy: expected a policy name";
		snprintf(t->policy, sizeof t->policy, "%s", v);
		return "";
	case K_HASH:
		if (strlen(v) != 16 || strspn(v, "0123456789abcdef") != 16)
			return "source_hash: expected 16 lowercase hex digits";
		snprintf(t->source_hash, sizeof t->source_hash, "%s", v);
		return "";
	case K_RATIO: case K_BYTERATIO:
		t->bytes = k == K_BYTERATIO;
		return num_in(v, 1, 1e9, &t->ratio) ? k == K_RATIO
		       ? "ratio: expected a compression factor >= 1"
		       : "byte_ratio: expected a compression factor in bytes >= 1" : "";
	case K_BYTESX: case K_ENTRIESX:
		if (num_in(v, 0, 1e9, k == K_BYTESX ? &t->bytes_x : &t->entries_x))
			return k == K_BYTESX ? "bytes_x: expected a compression factor >= 0"
			                     : "entries_x: expected a compression factor >= 0";
		return "";
	case K_MAXKLD:
		return num_in(v, 0, 1e9, &t->max_kld) ? "max_kld: expected a number >= 0" : "";
	case K_MINPK:
		return num_in(v, 0, 1, &t->min_passkey) ? "min_passkey: expected a number in 0..1" : "";
	case K_KLD:
		return num_in(v, 0, 1e9, &t->kld) ? "kld: expected a number >= 0" : "";
	case K_PASSKEY:
		return num_in(v, 0, 1, &t->passkey) ? "passkey: expected a number in 0..1" : "";
	case K_PKLEN: case K_CTX:
		if (num_in(v, 2, INT_MAX, &x) || x != floor(x))
			return k == K_CTX ? "ctx: expected a token count >= 2"
			                  : "passkey_len: expected a token count >= 2";
		*(k == K_CTX ? &t->ctx : &t->passkey_len) = (long)x;
		return "";
	case K_PATH:
		if (strcmp(v, "exact") && strcmp(v, "fast") && strcmp(v, "fast-f32-act"))
			return "path: expected exact, fast or fast-f32-act";
		t->fast = strcmp(v, "exact") != 0;
		t->f32_act = !strcmp(v, "fast-f32-act");
		return "";
	case K_CHUNK:
		if (num_in(v, 1, 65536, &x) || x != floor(x))
			return "chunk: expected a token count in 1..65536";
		t->chunk = (long)x;
		return "";
	case K_DEPTHS:
		if (!v[0] || strlen(v) >= sizeof t->depths || strspn(v, "0123456789.,") != strlen(v))
			return "depths: expected a comma list of percentages";
		snprintf(t->depths, sizeof t->depths, "%s", v);
		return "";
	case K_MODEL:
		if (!v[0])
			return "model: expected a path";
		t->model = strdup(v);
		return t->model ? "" : "out of memory";
	case K_TEXT:
		if (!v[0])
			return "text: expected a path";
		if (t->n_texts == RT_TUNED_MAX_TEXTS)
			return "text: more than 32 texts";
		if (!(t->texts[t->n_texts] = strdup(v)))
			return "out of memory";
		t->n_texts++;
		return "";
	}
	return "unknown key";
}

int rt_tuned_read(const char *path, rt_tuned *t, rt_err *err)
{
	size_t len;
	char *text = rt_read_file(path, &len, err);
	if (!text)
		return -1;
	int seen[K_COUNT] = { 0 }, line = 0, rc = 0;
	for (char *save = NULL, *l = text; l && rc == 0; l = save) {
		save = strchr(l, '\n');
		if (save)
			*save++ = 0;
		line++;
		size_t n = strlen(l);
		while (n && (l[n - 1] == '\r' || l[n - 1] == ' ' || l[n - 1] == '\t'))
			l[--n] = 0;
		l += strspn(l, " \t");
		if (!l[0] || l[0] == '#')
			continue;
		size_t kl = strcspn(l, " \t");
		const char *v = l + kl + strspn(l + kl, " \t");
		int k = 0;
		while (k < K_COUNT && (strlen(KEYS[k]) != kl || strncmp(l, KEYS[k], kl)))
			k++;
		if (k == K_COUNT)
			rc = rt_err_set(err, "%s:%d: unknown key '%.*s' (expected policy, source_hash, "
			                "ratio, byte_ratio, max_kld, min_passkey, passkey_len, depths, "
			                "ctx, path, chunk, model, text, kld, passkey, bytes_x or entries_x)", path, line,
			                (int)kl, l);
		else if ((k == K_RATIO && seen[K_BYTERATIO]) || (k == K_BYTERATIO && seen[K_RATIO]))
			rc = rt_err_set(err, "%s:%d: both ratio (entries) and byte_ratio (bytes): the "
			                "sidecar records one budget", path, line);
		else if (seen[k]++ && k != K_TEXT)
			rc = rt_err_set(err, "%s:%d: %s given twice", path, line, KEYS[k]);
		else {
			const char *why = tuned_set(t, k, v);
			if (why[0])
				rc = rt_err_set(err, "%s:%d: %s, got '%s'", path, line, why, v);
		}
	}
	free(text);
	if (rc)
		return rc;
	if (!seen[K_RATIO] && !seen[K_BYTERATIO])
		return rt_err_set(err, "%s: no 'ratio' or 'byte_ratio' line (written by kvpc tune; run "
		                  "it again)", path);
	static const int required[] = { K_POLICY, K_HASH, K_MAXKLD, K_CTX, K_MODEL, K_TEXT };
	for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
		if (!seen[required[i]])
			return rt_err_set(err, "%s: no '%s' line (written by kvpc tune; run it again)",
			                  path, KEYS[required[i]]);
	if (seen[K_MINPK] && (!seen[K_PKLEN] || !seen[K_DEPTHS]))
		return rt_err_set(err, "%s: min_passkey needs passkey_len and depths lines", path);
	return 0;
}

/* The shortest of %.15g, %.16g, %.17g that reads back as v. */
static void num_fmt(double v, char *buf, size_t cap)
{
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, cap, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			return;
	}
}

int rt_tuned_write(const char *path, const rt_tuned *t, const char *comment, rt_err *err)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof tmp, "%s.tmpXXXXXX", path) >= (int)sizeof tmp)
		return rt_err_set(err, "%s: path too long", path);
	int fd = mkstemp(tmp);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		int e = errno;
		if (fd >= 0) {
			close(fd);
			unlink(tmp);
		}
		return rt_err_set(err, "%s: cannot create: %s", path, strerror(e));
	}
	for (const char *c = comment; c && *c;) {
		size_t n = strcspn(c, "\n");
		fprintf(f, "#%s%.*s\n", n ? " " : "", (int)n, c);
		c += n + (c[n] == '\n');
	}
	char r[32], k[32], p[32];
	num_fmt(t->ratio, r, sizeof r);
	num_fmt(t->max_kld, k, sizeof k);
	num_fmt(t->min_passkey, p, sizeof p);
	fprintf(f, "policy %s\nsource_hash %s\n%s %s\nmax_kld %s\n", t->policy, t->source_hash,
	        t->bytes ? "byte_ratio" : "ratio", r, k);
	if (t->min_passkey >= 0)
		fprintf(f, "min_passkey %s\npasskey_len %ld\ndepths %s\n", p, t->passkey_len,
		        t->depths);
	fprintf(f, "ctx %ld\npath %s\n", t->ctx,
	        !t->fast ? "exact" : t->f32_act ? "fast-f32-act" : "fast");
	if (t->chunk > 0)
		fprintf(f, "chunk %ld\n", t->chunk);
	fprintf(f, "model %s\n", t->model);
	for (int i = 0; i < t->n_texts; i++)
		fprintf(f, "text %s\n", t->texts[i]);
	if (t->kld >= 0)
		fprintf(f, "kld %.6g\n", t->kld);
	if (t->passkey >= 0)
		fprintf(f, "passkey %.6g\n", t->passkey);
	if (t->bytes_x >= 0)
		fprintf(f, "bytes_x %.6g\n", t->bytes_x);
	if (t->entries_x >= 0)
		fprintf(f, "entries_x %.6g\n", t->entries_x);
	int bad = ferror(f);
	bad |= fclose(f) != 0;
	if (bad || rename(tmp, path) != 0) {
		int e = errno;
		unlink(tmp);
		return rt_err_set(err, "%s: cannot write: %s", path, strerror(e));
	}
	return 0;
}
