/*
 * rt_buf: growable text buffer; see rt_buf.h.
 */
#include "base/rt_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_util.h"

void rt_buf_reserve(rt_buf *b, size_t extra)
{
	if (b->len + extra + 1 <= b->cap)
		return;
	size_t nc = b->cap ? b->cap : 1024;
	while (nc < b->len + extra + 1)
		nc *= 2;
	char *p = realloc(b->s, nc);
	if (!p)
		rt_assert_fail("out of memory", __FILE__, __LINE__);
	p[b->len] = '\0';
	b->s = p;
	b->cap = nc;
}

void rt_buf_append(rt_buf *b, const char *s, size_t n)
{
	rt_buf_reserve(b, n);
	if (n)
		memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
}

void rt_buf_puts(rt_buf *b, const char *s)
{
	if (s)
		rt_buf_append(b, s, strlen(s));
}

void rt_buf_printf(rt_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	RT_ASSERT(n >= 0);
	rt_buf_reserve(b, (size_t)n);
	va_start(ap, fmt);
	vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

char *rt_buf_take(rt_buf *b, size_t *len)
{
	rt_buf_reserve(b, 0);
	char *s = b->s;
	if (len)
		*len = b->len;
	b->s = NULL;
	b->len = b->cap = 0;
	return s;
}

void rt_buf_free(rt_buf *b)
{
	free(b->s);
	b->s = NULL;
	b->len = b->cap = 0;
}
