/*
 * rt_buf: a growable, always NUL-terminated text buffer (SVG, keep-maps, reports). It
 * grows by doubling with realloc; running out of memory aborts with file:line like
 * RT_MALLOC (the texts are bounded by what the caller draws, never by untrusted sizes).
 *
 * Ownership: the buffer owns s until rt_buf_take hands it to the caller; rt_buf_free
 * releases it. A zeroed rt_buf (or RT_BUF_INIT) is an empty buffer with s == NULL.
 */
#ifndef RT_BUF_H
#define RT_BUF_H

#include <stddef.h>

typedef struct rt_buf {
	char *s;      /* [cap] bytes with s[len] == '\0', or NULL before the first append */
	size_t len;   /* bytes of text, without the NUL */
	size_t cap;   /* allocated bytes */
} rt_buf;

#define RT_BUF_INIT { NULL, 0, 0 }

/* Make room for extra more bytes plus the NUL (first allocation: 1024 bytes); s is
 * non-NULL and NUL-terminated afterwards. */
void rt_buf_reserve(rt_buf *b, size_t extra);

/* Append n bytes of s (which need not be NUL-terminated). */
void rt_buf_append(rt_buf *b, const char *s, size_t n);

/* Append the NUL-terminated s; NULL appends nothing. */
void rt_buf_puts(rt_buf *b, const char *s);

/* Append printf-style text. */
void rt_buf_printf(rt_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Hand the text to the caller (NUL-terminated heap string, "" when nothing was appended;
 * caller frees) and leave b empty; *len (if non-NULL) receives its length. */
char *rt_buf_take(rt_buf *b, size_t *len);

/* Release the text and leave b empty. */
void rt_buf_free(rt_buf *b);

#endif
