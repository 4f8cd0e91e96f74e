/*
 * kvp_src: the source text of a .kvp file, the map from byte offsets to lines and
 * columns, and the located diagnostics printer (format in kvp_src.h). Rendering follows
 * GCC/Clang's caret style (and chibicc's verror_at / jq's locfile_locate): the location,
 * the message, the source line, a caret under the span.
 */
#include "kvp_src.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void *xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);
	if (!q) {
		fprintf(stderr, "kvpc: out of memory (%zu bytes)\n", n);
		abort();
	}
	return q;
}

static char *xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = xrealloc(NULL, n);
	memcpy(d, s, n);
	return d;
}

static void build_lines(kvp_src *src)
{
	int cap = 64;
	src->line_start = xrealloc(NULL, sizeof(uint32_t) * (size_t)cap);
	src->n_lines = 0;
	src->line_start[src->n_lines++] = 0;
	for (size_t i = 0; i < src->len; i++) {
		if (src->text[i] != '\n')
			continue;
		if (src->n_lines == cap) {
			cap *= 2;
			src->line_start = xrealloc(src->line_start, sizeof(uint32_t) * (size_t)cap);
		}
		src->line_start[src->n_lines++] = (uint32_t)(i + 1);
	}
}

static kvp_src *src_new(const char *name, char *text, size_t len)
{
	kvp_src *src = xrealloc(NULL, sizeof *src);
	memset(src, 0, sizeof *src);
	src->path = xstrdup(name);
	src->text = text;
	src->len = len;
	src->diags = xrealloc(NULL, 256);
	src->diags_cap = 256;
	src->diags[0] = '\0';
	src->cur_group = -1;
	build_lines(src);
	return src;
}

kvp_src *kvp_src_from_mem(const char *name, const char *text, size_t len)
{
	char *copy = xrealloc(NULL, len + 2);
	if (len)
		memcpy(copy, text, len);
	copy[len] = copy[len + 1] = '\0';
	return src_new(name, copy, len);
}

kvp_src *kvp_src_open(const char *path, char *err, size_t errlen)
{
	/* open without blocking (a FIFO would wait for a writer) and read only regular files
	 * (a device such as /dev/zero never ends) */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s: not a regular file%s", path,
		         S_ISDIR(st.st_mode) ? " (a directory)" : "");
		close(fd);
		return NULL;
	}
	FILE *f = fdopen(fd, "rb");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	size_t cap = 4096, len = 0;
	char *buf = xrealloc(NULL, cap);
	for (;;) {
		if (len + 2 >= cap) {
			if (cap > KVP_MAX_SOURCE) {
				snprintf(err, errlen, "%s: file is larger than %u bytes", path,
				         KVP_MAX_SOURCE);
				free(buf);
				fclose(f);
				return NULL;
			}
			cap *= 2;
			buf = xrealloc(buf, cap);
		}
		size_t n = fread(buf + len, 1, cap - len - 2, f);
		len += n;
		if (n == 0)
			break;
	}
	if (ferror(f)) {
		snprintf(err, errlen, "%s: read error", path);
		free(buf);
		fclose(f);
		return NULL;
	}
	fclose(f);
	buf[len] = buf[len + 1] = '\0';
	return src_new(path, buf, len);
}

void kvp_src_free(kvp_src *src)
{
	if (!src)
		return;
	free(src->path);
	free(src->text);
	free(src->line_start);
	free(src->diags);
	free(src->groups);
	free(src);
}

/* Index (0-based) of the line holding byte off. */
static int line_of(const kvp_src *src, uint32_t off)
{
	int lo = 0, hi = src->n_lines - 1;
	while (lo < hi) {
		int mid = lo + (hi - lo + 1) / 2;
		if (src->line_start[mid] <= off)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

static int is_cont(unsigned char c)
{
	return (c & 0xC0) == 0x80;
}

void kvp_src_pos(kvp_src *src, uint32_t off, int *line, int *col)
{
	if (off > src->len)
		off = (uint32_t)src->len;
	int li;
	int c = 1;
	uint32_t from;
	if (src->pos_line > 0 && off >= src->pos_off &&
	    (src->pos_line == src->n_lines || off < src->line_start[src->pos_line])) {
		/* same line as the last query, further right: continue from there */
		li = src->pos_line - 1;
		c = src->pos_col;
		from = src->pos_off;
	} else {
		li = line_of(src, off);
		from = src->line_start[li];
	}
	for (uint32_t i = from; i < off; i++)
		if (!is_cont((unsigned char)src->text[i]))
			c++;
	src->pos_off = off;
	src->pos_line = li + 1;
	src->pos_col = c;
	*line = li + 1;
	*col = c;
}

kvp_srcloc kvp_src_loc(kvp_src *src, uint32_t off, uint32_t end)
{
	kvp_srcloc l;
	l.off = off;
	l.end = end < off ? off : end;
	kvp_src_pos(src, off, &l.line, &l.col);
	return l;
}

kvp_srcloc kvp_src_loc_at(kvp_src *src, int line, int col)
{
	if (line < 1)
		line = 1;
	if (line > src->n_lines)
		line = src->n_lines;
	uint32_t off = src->line_start[line - 1];
	for (int c = 1; c < col && off < src->len && src->text[off] != '\n'; off++)
		if (!is_cont((unsigned char)src->text[off + 1]))
			c++;
	return kvp_src_loc(src, off, off + 1 <= src->len ? off + 1 : off);
}

/* Key of a group that sorts after every place: the "too many errors" line. */
#define KEY_LAST UINT64_MAX

/* Start a new group of diagnostics sorting at key (after the groups of equal key, so two
 * reports at one place keep the order they were made in): later text goes into it. */
static void group_begin(kvp_src *src, uint64_t key)
{
	if (src->n_groups == src->groups_cap) {
		src->groups_cap = src->groups_cap ? 2 * src->groups_cap : 8;
		src->groups = xrealloc(src->groups, sizeof *src->groups * (size_t)src->groups_cap);
	}
	int i = src->n_groups;
	while (i > 0 && src->groups[i - 1].key > key)
		i--;
	memmove(src->groups + i + 1, src->groups + i,
	        sizeof *src->groups * (size_t)(src->n_groups - i));
	src->groups[i] = (struct kvp_diag_group){
		.key = key,
		.off = i < src->n_groups ? src->groups[i + 1].off : src->diags_len,
	};
	src->n_groups++;
	src->cur_group = i;
}

/* Append s[0..n) to the current group (a note with no report before it starts its own). */
static void diag_put(kvp_src *src, const char *s, size_t n)
{
	if (src->cur_group < 0)
		group_begin(src, KEY_LAST - 1);
	if (src->diags_len + n + 1 > src->diags_cap) {
		while (src->diags_len + n + 1 > src->diags_cap)
			src->diags_cap *= 2;
		src->diags = xrealloc(src->diags, src->diags_cap);
	}
	struct kvp_diag_group *g = &src->groups[src->cur_group];
	size_t at = g->off + g->len;
	memmove(src->diags + at + n, src->diags + at, src->diags_len - at + 1); /* with the NUL */
	memcpy(src->diags + at, s, n);
	g->len += n;
	for (int i = src->cur_group + 1; i < src->n_groups; i++)
		src->groups[i].off += n;
	src->diags_len += n;
}

static void diag_printf(kvp_src *src, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void diag_printf(kvp_src *src, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof buf)
		n = (int)sizeof buf - 1;
	diag_put(src, buf, (size_t)n);
}

/* Length of the UTF-8 sequence starting at s[0] if it is valid and complete within
 * s[0..n), else 0. */
static int utf8_len(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	if (c < 0x80)
		return 1;
	int len;
	unsigned min;
	uint32_t cp;
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
		cp = c & 0x1F;
		min = 0x80;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		cp = c & 0x0F;
		min = 0x800;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		cp = c & 0x07;
		min = 0x10000;
	} else {
		return 0;
	}
	if ((size_t)len > n)
		return 0;
	for (int i = 1; i < len; i++) {
		if (!is_cont(s[i]))
			return 0;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		return 0;
	return len;
}

int kvp_src_check_bytes(kvp_src *src)
{
	const unsigned char *t = (const unsigned char *)src->text;
	for (size_t i = 0; i < src->len;) {
		if (t[i] == 0) {
			kvp_src_error(src, kvp_src_loc(src, (uint32_t)i, (uint32_t)i + 1),
			              "NUL byte in source");
			return -1;
		}
		int l = utf8_len(t + i, src->len - i);
		if (l == 0) {
			kvp_src_error(src, kvp_src_loc(src, (uint32_t)i, (uint32_t)i + 1),
			              "invalid UTF-8 byte 0x%02x in source", t[i]);
			return -1;
		}
		i += (size_t)l;
	}
	return 0;
}

#define SHOW_MAX 160 /* bytes of a source line shown before it is windowed */

/* Print the source line of loc and the caret line under it. */
static void show_line(kvp_src *src, kvp_srcloc loc)
{
	uint32_t off = loc.off > src->len ? (uint32_t)src->len : loc.off;
	int li = line_of(src, off);
	uint32_t ls = src->line_start[li];
	uint32_t le = ls;
	while (le < src->len && src->text[le] != '\n')
		le++;
	if (le > ls && src->text[le - 1] == '\r')
		le--;
	if (off > le)
		off = le;
	uint32_t end = loc.end < off ? off : loc.end;
	if (end > le)
		end = le;
	/* the window [ws, we) of the line that is shown */
	uint32_t ws = ls, we = le;
	int cut_left = 0, cut_right = 0;
	if (le - ls > SHOW_MAX) {
		ws = off > ls + SHOW_MAX / 2 ? off - SHOW_MAX / 2 : ls;
		while (ws > ls && is_cont((unsigned char)src->text[ws]))
			ws--;
		we = ws + SHOW_MAX < le ? ws + SHOW_MAX : le;
		while (we < le && is_cont((unsigned char)src->text[we]))
			we++;
		if (end > we)
			end = we;
		cut_left = ws > ls;
		cut_right = we < le;
	}
	char gutter[32];
	snprintf(gutter, sizeof gutter, "%5d | ", li + 1);
	diag_put(src, gutter, strlen(gutter));
	if (cut_left)
		diag_put(src, "...", 3);
	const unsigned char *t = (const unsigned char *)src->text;
	for (uint32_t i = ws; i < we;) {
		int l = utf8_len(t + i, we - i);
		if (l == 0 || (t[i] < 0x20 && t[i] != '\t') || t[i] == 0x7F) {
			diag_put(src, "?", 1);
			i++;
			continue;
		}
		diag_put(src, (const char *)t + i, (size_t)l);
		i += (uint32_t)l;
	}
	if (cut_right)
		diag_put(src, "...", 3);
	diag_put(src, "\n      | ", 9);
	if (cut_left)
		diag_put(src, "   ", 3);
	/* pad to the caret: one space per shown character ('?' for invalid bytes counts
	 * one per byte), tabs copied */
	for (uint32_t i = ws; i < off;) {
		int l = utf8_len(t + i, we - i);
		if (l == 0)
			l = 1;
		diag_put(src, t[i] == '\t' ? "\t" : " ", 1);
		i += (uint32_t)l;
	}
	diag_put(src, "^", 1);
	uint32_t i = off;
	if (i < end) {
		int l = utf8_len(t + i, end - i);
		i += (uint32_t)(l ? l : 1);
	}
	while (i < end) {
		int l = utf8_len(t + i, end - i);
		diag_put(src, "~", 1);
		i += (uint32_t)(l ? l : 1);
	}
	diag_put(src, "\n", 1);
}

static void vreport(kvp_src *src, kvp_srcloc loc, const char *kind, const char *fmt,
                    va_list ap)
{
	char msg[768];
	vsnprintf(msg, sizeof msg, fmt, ap);
	if (strcmp(kind, "note") != 0) /* a note stays with the report before it */
		group_begin(src, (uint64_t)loc.off + 1);
	int line, col;
	kvp_src_pos(src, loc.off, &line, &col);
	diag_printf(src, "%s:%d:%d: %s: %s\n", src->path, line, col, kind, msg);
	show_line(src, loc);
}

void kvp_src_error(kvp_src *src, kvp_srcloc loc, const char *fmt, ...)
{
	src->n_errors++;
	if (src->n_errors > KVP_MAX_ERRORS) {
		if (src->n_errors == KVP_MAX_ERRORS + 1) {
			group_begin(src, KEY_LAST);
			diag_printf(src, "%s: error: too many errors; stopping after %d\n",
			            src->path, KVP_MAX_ERRORS);
		}
		return;
	}
	va_list ap;
	va_start(ap, fmt);
	vreport(src, loc, "error", fmt, ap);
	va_end(ap);
}

void kvp_src_warning(kvp_src *src, kvp_srcloc loc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport(src, loc, "warning", fmt, ap);
	va_end(ap);
}

void kvp_src_note(kvp_src *src, kvp_srcloc loc, const char *fmt, ...)
{
	if (src->n_errors > KVP_MAX_ERRORS)
		return;
	src->n_notes++;
	va_list ap;
	va_start(ap, fmt);
	vreport(src, loc, "note", fmt, ap);
	va_end(ap);
}

void kvp_src_error_file(kvp_src *src, const char *fmt, ...)
{
	src->n_errors++;
	if (src->n_errors > KVP_MAX_ERRORS)
		return;
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	group_begin(src, 0);
	diag_printf(src, "%s: error: %s\n", src->path, msg);
}

const char *kvp_src_diags(const kvp_src *src)
{
	return src->diags;
}

int kvp_edit_distance(const char *a, const char *b, int cap)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 64 || lb > 64)
		return cap + 1;
	if ((la > lb ? la - lb : lb - la) > (size_t)cap)
		return cap + 1;
	int prev[65], cur[65];
	for (size_t j = 0; j <= lb; j++)
		prev[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		cur[0] = (int)i;
		int best = cur[0];
		for (size_t j = 1; j <= lb; j++) {
			int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
			int del = prev[j] + 1, ins = cur[j - 1] + 1;
			int m = sub < del ? sub : del;
			cur[j] = m < ins ? m : ins;
			if (cur[j] < best)
				best = cur[j];
		}
		if (best > cap)
			return cap + 1;
		memcpy(prev, cur, sizeof(int) * (lb + 1));
	}
	return prev[lb] > cap ? cap + 1 : prev[lb];
}
