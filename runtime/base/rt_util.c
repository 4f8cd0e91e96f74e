/*
 * rt_util: error buffers, half-float conversion, checked allocation, file reading and
 * UTF-8 validation shared by the whole runtime.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/rt_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int rt_err_set(rt_err *err, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof err->msg, fmt, ap);
		va_end(ap);
		err->code = RT_ERR_INTERNAL;
	}
	return -1;
}

int rt_err_setc(rt_err *err, enum rt_err_code code, const char *fmt, ...)
{
	if (err) {
		/* fmt may print an inner error that is err itself: format into a copy */
		char m[sizeof err->msg];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(m, sizeof m, fmt, ap);
		va_end(ap);
		memcpy(err->msg, m, sizeof m);
		err->code = code;
	}
	return -1;
}

float rt_fp16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;
	uint32_t bits;
	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else { /* subnormal: normalise */
			int e = -1;
			do {
				e++;
				man <<= 1;
			} while (!(man & 0x400u));
			man &= 0x3ffu;
			bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
		}
	} else if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

uint16_t rt_f32_to_fp16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof x);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u) /* NaN: keep it quiet and non-zero */
		return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
	if (ax >= 0x477ff000u) /* rounds to >= 65520: inf */
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) { /* below 2^-14: subnormal half (or zero) */
		if (ax < 0x33000000u) /* below 2^-25 (half the smallest subnormal): zero */
			return sign;
		uint32_t e = ax >> 23, man = (ax & 0x7fffffu) | 0x800000u;
		/* f = man * 2^(e - 150) and a subnormal half is h * 2^-24: h = man >> (126 - e) */
		uint32_t dropped = 126 - e;
		uint32_t half = man >> dropped;
		uint32_t rem = man & ((1u << dropped) - 1), mid = 1u << (dropped - 1);
		if (rem > mid || (rem == mid && (half & 1u)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t h = ((ax >> 13) - ((127u - 15u) << 10));
	uint32_t rem = ax & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
		h++; /* may carry into the exponent, up to inf: correct */
	return (uint16_t)(sign | h);
}

float rt_bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

void rt_assert_fail(const char *expr, const char *file, int line)
{
	fprintf(stderr, "%s:%d: internal error: assertion failed: %s\n", file, line, expr);
	abort();
}

void *rt_xmalloc(size_t n, const char *file, int line)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "%s:%d: out of memory (%zu bytes)\n", file, line, n);
		abort();
	}
	return p;
}

void *rt_xcalloc(size_t n, size_t sz, const char *file, int line)
{
	void *p = calloc(n ? n : 1, sz ? sz : 1);
	if (!p) {
		fprintf(stderr, "%s:%d: out of memory (%zu x %zu bytes)\n", file, line, n, sz);
		abort();
	}
	return p;
}

int rt_open_stat(const char *path, const char *open_what, struct stat *st, rt_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return rt_err_set(err, "%s: %s%s", path, open_what, strerror(errno));
	if (fstat(fd, st) < 0) {
		rt_err_set(err, "%s: cannot stat: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

char *rt_read_file(const char *path, size_t *len, rt_err *err)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		rt_err_set(err, "%s: cannot open: %s", path, strerror(errno));
		return NULL;
	}
	struct stat st; /* a device or FIFO would be read without end */
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
		rt_err_set(err, "%s: not a regular file", path);
		fclose(f);
		return NULL;
	}
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	if (!buf) {
		fclose(f);
		rt_err_set(err, "%s: out of memory", path);
		return NULL;
	}
	for (;;) {
		if (n + 1 >= cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				fclose(f);
				rt_err_set(err, "%s: out of memory", path);
				return NULL;
			}
			buf = nb;
			cap *= 2;
		}
		size_t got = fread(buf + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		rt_err_set(err, "%s: read error: %s", path, strerror(errno));
		free(buf);
		fclose(f);
		return NULL;
	}
	fclose(f);
	buf[n] = 0;
	if (len)
		*len = n;
	return buf;
}

int rt_utf8_valid(const char *s, size_t n, size_t *bad_off)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;
	while (i < n) {
		unsigned c = p[i];
		size_t k;
		uint32_t cp, min;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			k = 1, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			k = 2, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			k = 3, cp = c & 0x07, min = 0x10000;
		} else {
			goto bad;
		}
		if (i + k >= n) /* truncated sequence */
			goto bad;
		for (size_t j = 1; j <= k; j++) {
			if ((p[i + j] & 0xc0) != 0x80)
				goto bad;
			cp = (cp << 6) | (p[i + j] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			goto bad;
		i += k + 1;
	}
	return 1;
bad:
	if (bad_off)
		*bad_off = i;
	return 0;
}

double rt_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int32_t rt_argmax(const float *v, int n)
{
	int32_t best = 0;
	for (int i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return best;
}

int rt_name_index(const char *const *names, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(name, names[i]) == 0)
			return i;
	return -1;
}
