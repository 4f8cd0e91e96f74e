/*
 * rt_util: small shared pieces of libkvrt — located error messages, half-float
 * conversion and checked allocation. Every fallible runtime call reports through an
 * rt_err: one line "file: reason" (or "file:line:col: reason" where a place exists),
 * with no trailing newline, written once by the function that detects the problem.
 */
#ifndef RT_UTIL_H
#define RT_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* What kind of failure an rt_err reports, so that a caller can answer it without reading
 * the message (the server maps it to an HTTP status: runtime/serve/rt_serve.c). */
enum rt_err_code {
	RT_ERR_INTERNAL = 0, /* unclassified: the runtime, the machine or a file failed */
	RT_ERR_INPUT,        /* the caller's input is invalid: a parameter value, a budget
	                        below 1 entry or under its guards, a context longer than the
	                        model's */
	RT_ERR_RESOURCE,     /* a limit was reached: the KV block pool is exhausted, a store
	                        is full */
};

/* One-line error message buffer. msg is "" while no error happened; code says what kind
 * of error msg is (RT_ERR_INTERNAL unless the raiser classified it). */
typedef struct rt_err {
	char msg[512];
	enum rt_err_code code;
} rt_err;

/* printf-style: write a message into err (if err is non-NULL) with code RT_ERR_INTERNAL.
 * Returns -1 so callers can `return rt_err_set(err, ...)`. */
int rt_err_set(rt_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* rt_err_set with a code: where the error is raised (or re-raised with more context,
 * passing the inner error's code on). Returns -1. */
int rt_err_setc(rt_err *err, enum rt_err_code code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* IEEE-754 binary16 -> binary32, exact for all inputs including subnormals, inf, NaN. */
float rt_fp16_to_f32(uint16_t h);

/* binary32 -> IEEE-754 binary16, round to nearest, ties to even (as the F16C instruction
 * VCVTPS2PH with rounding mode 0): overflow gives inf, tiny values round to subnormals or
 * zero, NaN stays a (quiet) NaN with its sign. */
uint16_t rt_f32_to_fp16(float f);

/* bfloat16 -> binary32 (exact: bf16 is the top half of an f32). */
float rt_bf16_to_f32(uint16_t h);

/* malloc/calloc that abort with file:line on out-of-memory; use only for sizes that
 * were already validated (never for sizes read from untrusted input). */
void *rt_xmalloc(size_t n, const char *file, int line);
void *rt_xcalloc(size_t n, size_t sz, const char *file, int line);
#define RT_MALLOC(n) rt_xmalloc((n), __FILE__, __LINE__)
#define RT_CALLOC(n, sz) rt_xcalloc((n), (sz), __FILE__, __LINE__)

/* Invariant check that stays on in release builds: prints file:line and aborts. */
#define RT_ASSERT(c) \
	((c) ? (void)0 : rt_assert_fail(#c, __FILE__, __LINE__))
void rt_assert_fail(const char *expr, const char *file, int line)
	__attribute__((noreturn));

/* Read a whole regular file into a NUL-terminated heap buffer (caller frees). Fails with
 * "PATH: reason" on open/read errors and for anything but a regular file. *len receives
 * the byte count (without NUL). Texts given by the user go through rt_text_read instead. */
char *rt_read_file(const char *path, size_t *len, rt_err *err);

struct stat;

/* Opens path read-only, close-on-exec and non-blocking (a FIFO cannot hang the open) and
 * fstat's it into *st. Returns the descriptor (the caller closes it), or -1 with err
 * "PATH: OPEN_WHATREASON" when the open fails (open_what "" or e.g. "cannot open: ") or
 * "PATH: cannot stat: REASON". The caller checks the kind of file in *st. */
int rt_open_stat(const char *path, const char *open_what, struct stat *st, rt_err *err);

/* 1 if s[0..n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF); otherwise 0
 * and *bad_off receives the byte offset of the first invalid sequence. */
int rt_utf8_valid(const char *s, size_t n, size_t *bad_off);

/* Wall-clock seconds from a monotonic clock. */
double rt_now(void);

/* The index of the largest of v[0..n) (n >= 1), the lowest index on ties; a NaN is never
 * larger than anything, so it wins only at index 0. */
int32_t rt_argmax(const float *v, int n);

/* A name table's lookup: the index of name in names[0..n) (an enum's ORDER table, e.g.
 * runtime/kv/rt_kv.c's KV types and tiers), or -1 when it is none of them. */
int rt_name_index(const char *const *names, int n, const char *name);

#endif
