/*
 * rt_text: reads a text input only after checking what the path is (fstat before the
 * first read, so a device or FIFO is never read), how large it is, and — once read or
 * decompressed — that it is UTF-8 without NUL bytes. Gzip data is inflated with zlib
 * into a buffer that never grows past RT_TEXT_MAX_BYTES + 1, so a decompression bomb
 * costs at most that much memory. See rt_text.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/rt_text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* "NAME:LINE:COL: " prefix for the byte at offset off of s. */
static void place(const char *s, size_t off, unsigned long *line, unsigned long *col)
{
	unsigned long l = 1;
	size_t start = 0;
	for (size_t i = 0; i < off; i++)
		if (s[i] == '\n')
			l++, start = i + 1;
	*line = l;
	*col = (unsigned long)(off - start) + 1;
}

int rt_text_check(const char *name, const char *s, size_t n, rt_err *err)
{
	if (n > RT_TEXT_MAX_BYTES)
		return rt_err_set(err, "%s: %zu bytes, more than the %zu bytes (64 MiB) a text may have",
		                  name, n, RT_TEXT_MAX_BYTES);
	size_t bad = n;
	int utf8_ok = rt_utf8_valid(s, n, &bad);
	const char *nul = n ? memchr(s, 0, n) : NULL;
	unsigned long line, col;
	if (nul && (utf8_ok || (size_t)(nul - s) < bad)) {
		size_t off = (size_t)(nul - s);
		place(s, off, &line, &col);
		return rt_err_set(err, "%s:%lu:%lu: binary data: NUL byte (byte offset %zu); a text must "
		                  "be UTF-8 without NUL bytes", name, line, col, off);
	}
	if (!utf8_ok) {
		place(s, bad, &line, &col);
		return rt_err_set(err, "%s:%lu:%lu: not valid UTF-8 (byte offset %zu, byte 0x%02x); a text "
		                  "must be UTF-8", name, line, col, bad, (unsigned)(unsigned char)s[bad]);
	}
	return 0;
}

/* Inflate gzip member(s) gz[0..n) into a fresh buffer of at most RT_TEXT_MAX_BYTES. */
static char *gunzip(const char *name, const unsigned char *gz, size_t n, size_t *len, rt_err *err)
{
	if (n < 2 || gz[0] != 0x1f || gz[1] != 0x8b) {
		rt_err_set(err, "%s: not gzip data (the name ends in .gz)", name);
		return NULL;
	}
	if (n > RT_TEXT_MAX_BYTES) {
		rt_err_set(err, "%s: %zu bytes of gzip data, more than the %zu bytes (64 MiB) a text may "
		           "have", name, n, RT_TEXT_MAX_BYTES);
		return NULL;
	}
	z_stream zs;
	memset(&zs, 0, sizeof zs);
	if (inflateInit2(&zs, 15 + 16) != Z_OK) {
		rt_err_set(err, "%s: zlib: cannot start inflating", name);
		return NULL;
	}
	size_t cap = 4 * n + 4096, used = 0; /* text compresses about 3-4x; grown by doubling */
	if (cap > RT_TEXT_MAX_BYTES + 1)
		cap = RT_TEXT_MAX_BYTES + 1;
	char *buf = malloc(cap + 1);
	const char *why = NULL;
	int corrupt = 0; /* why is zlib's own message */
	zs.next_in = (unsigned char *)(uintptr_t)gz; /* zlib does not write through next_in */
	zs.avail_in = (uInt)n;
	while (buf && !why) {
		if (used == cap) { /* cap <= RT_TEXT_MAX_BYTES here: a larger one was reported */
			size_t nc = 2 * cap > RT_TEXT_MAX_BYTES + 1 ? RT_TEXT_MAX_BYTES + 1 : 2 * cap;
			char *nb = realloc(buf, nc + 1);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap = nc;
		}
		zs.next_out = (unsigned char *)buf + used;
		zs.avail_out = (uInt)(cap - used);
		int ret = inflate(&zs, Z_NO_FLUSH);
		used = cap - zs.avail_out;
		if (used > RT_TEXT_MAX_BYTES) {
			why = "decompresses to more than the 64 MiB a text may have";
		} else if (ret == Z_STREAM_END) {
			if (zs.avail_in == 0)
				break;
			if (zs.avail_in < 2 || zs.next_in[0] != 0x1f || zs.next_in[1] != 0x8b)
				why = "bytes after the end of the gzip data";
			else if (inflateReset(&zs) != Z_OK)
				why = "zlib: cannot read the next gzip member";
		} else if (ret == Z_BUF_ERROR || (ret == Z_OK && zs.avail_in == 0 && zs.avail_out)) {
			why = "truncated gzip data";
		} else if (ret != Z_OK) {
			why = zs.msg ? zs.msg : "data error";
			corrupt = 1;
		}
	}
	if (!buf) {
		inflateEnd(&zs);
		rt_err_set(err, "%s: out of memory while decompressing", name);
		return NULL;
	}
	if (why) {
		rt_err_set(err, "%s: %s%s", name, corrupt ? "corrupt gzip data: " : "", why);
		inflateEnd(&zs);
		free(buf);
		return NULL;
	}
	inflateEnd(&zs);
	buf[used] = '\0';
	*len = used;
	return buf;
}

char *rt_text_from_mem(const char *name, const void *data, size_t n, int gz, size_t *len,
                       rt_err *err)
{
	size_t m = 0;
	char *s;
	if (gz) {
		s = gunzip(name, data, n, &m, err);
		if (!s)
			return NULL;
	} else {
		if (rt_text_check(name, data, n, err) < 0)
			return NULL;
		s = malloc(n + 1);
		if (!s) {
			rt_err_set(err, "%s: out of memory for %zu bytes", name, n);
			return NULL;
		}
		if (n)
			memcpy(s, data, n);
		s[n] = '\0';
		m = n;
	}
	if (gz && rt_text_check(name, s, m, err) < 0) {
		free(s);
		return NULL;
	}
	*len = m;
	return s;
}

static const char *kind_of(mode_t m)
{
	return S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device" :
	       S_ISBLK(m) ? "a block device" : S_ISFIFO(m) ? "a FIFO" :
	       S_ISSOCK(m) ? "a socket" : "not a file";
}

char *rt_text_read(const char *path, size_t *len, rt_err *err)
{
	size_t pl = strlen(path);
	int gz = pl > 3 && !strcmp(path + pl - 3, ".gz");
	struct stat st;
	int fd = rt_open_stat(path, "", &st, err);
	if (fd < 0)
		return NULL;
	if (!S_ISREG(st.st_mode)) {
		rt_err_set(err, "%s: not a regular file (%s); a text must be a file", path,
		           kind_of(st.st_mode));
		close(fd);
		return NULL;
	}
	if ((uint64_t)st.st_size > RT_TEXT_MAX_BYTES) {
		rt_err_set(err, "%s: %lld bytes, more than the %zu bytes (64 MiB) a text may have", path,
		           (long long)st.st_size, RT_TEXT_MAX_BYTES);
		close(fd);
		return NULL;
	}
	size_t n = (size_t)st.st_size, got = 0;
	char *raw = malloc(n + 1);
	if (!raw) {
		rt_err_set(err, "%s: out of memory for %zu bytes", path, n);
		close(fd);
		return NULL;
	}
	while (got < n) { /* a file that shrank meanwhile ends early; one that grew is cut */
		ssize_t r = read(fd, raw + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rt_err_set(err, "%s: read error: %s", path, strerror(errno));
			free(raw);
			close(fd);
			return NULL;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (gz) {
		char *s = rt_text_from_mem(path, raw, got, 1, len, err);
		free(raw);
		return s;
	}
	if (rt_text_check(path, raw, got, err) < 0) {
		free(raw);
		return NULL;
	}
	raw[got] = '\0';
	*len = got;
	return raw;
}
