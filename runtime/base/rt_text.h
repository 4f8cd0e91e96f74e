/*
 * rt_text: the one loader for every text the runtime reads as input (--text of ppl,
 * tokenize, keepmap and ab; needle's --haystack). A text is accepted only when
 *
 *   - the path names a regular file (not a directory, FIFO, socket or device such as
 *     /dev/zero, which would otherwise be read without end);
 *   - it holds at most RT_TEXT_MAX_BYTES bytes, counted after gzip decompression for a
 *     name ending in ".gz" (decompressed in memory with zlib, RFC 1952; concatenated
 *     members are read as `gzip -dc` reads them, anything after the last member is an
 *     error);
 *   - it is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
 *     U+10FFFF) and contains no NUL byte; a file that fails either test is binary.
 *
 * Errors are one line "PATH: reason", or "PATH:LINE:COL: reason" when a byte of the text
 * is at fault (LINE counts '\n' from 1, COL counts bytes from 1), so the CLI can refuse a
 * bad input before it loads a model.
 */
#ifndef RT_TEXT_H
#define RT_TEXT_H

#include <stddef.h>

#include "base/rt_util.h"

/* Largest text accepted, in bytes after decompression: 64 MiB. A 64 MiB English text is
 * about 16 million tokens, far beyond any context the runtime evaluates. */
#define RT_TEXT_MAX_BYTES ((size_t)64 << 20)

/* Read and check the text at path (gzip-decompressed when the name ends in ".gz").
 * Returns a NUL-terminated heap buffer the caller frees, its byte count (without the NUL)
 * in *len; or NULL with err set (e.g. "/dev/zero: not a regular file (a character
 * device)", "t.bin:1:7: binary data: NUL byte (byte offset 6); a text must be UTF-8"). */
char *rt_text_read(const char *path, size_t *len, rt_err *err);

/* The same checks on bytes already in memory: data[0..n) is the file's content (gzip
 * data when gz is non-zero); name is used in messages. Never reads outside data[0..n).
 * Returns a fresh NUL-terminated copy (decompressed) the caller frees, or NULL. */
char *rt_text_from_mem(const char *name, const void *data, size_t n, int gz, size_t *len,
                       rt_err *err);

/* Check s[0..n) is a text (at most RT_TEXT_MAX_BYTES, valid UTF-8, no NUL). Returns 0, or
 * -1 with "NAME:LINE:COL: reason" / "NAME: reason" in err. */
int rt_text_check(const char *name, const char *s, size_t n, rt_err *err);

#endif
