/*
 * rt_numparse: the strict number syntax of the command lines (kvrt's and serve's numeric
 * options, batch lines' ratios, kvpc ab's checks before its build): a decimal integer, a
 * decimal number, or a comma list of numbers with bounds. Strict: no spaces, no hex, no
 * inf or nan, nothing after the number. One parser, so that kvpc refuses a ratio list when
 * the binary it builds would.
 */
#ifndef RT_NUMPARSE_H
#define RT_NUMPARSE_H

/* Entries of a comma list the command-line arrays hold. */
#define RT_NUMPARSE_MAX_LIST 32

/* Strict decimal integer in [lo, hi] (no spaces, no trailing text): 0 with *out, or -1 on
 * anything else (*out untouched). */
int rt_parse_int(const char *s, long lo, long hi, long *out);

/* Strict decimal unsigned 64-bit integer (digits only: no sign, no spaces, no hex): 0 with
 * *out, or -1 on anything else, 18446744073709551616 included (*out untouched). */
int rt_parse_u64(const char *s, unsigned long long *out);

/* Strict finite decimal number: only digits, '.', an exponent and signs ("2", "-0.5",
 * "1e-3"), the whole string. 0 with *out, or -1 on anything else ("", " 2", "2 ", "0x10",
 * "inf", "nan", "1e999": *out untouched). */
int rt_parse_double(const char *s, double *out);

/* Comma-separated list of finite numbers in [lo, hi] (whole numbers when integral), no
 * spaces and no empty item, at most cap entries (cap <= RT_NUMPARSE_MAX_LIST), into
 * out[0..*n), each item as rt_parse_double. 0, or -1 on anything else (out and *n then
 * undefined). "2,4,8" with lo 1: {2, 4, 8}; "2,,8", "2, 4", "inf", "0x10": -1. */
int rt_parse_list(const char *s, double lo, double hi, int integral, double *out, int cap,
                  int *n);

/* The most compression factors one ratio list holds: `ab --ratio` / `--byte-ratio` of the
 * built binary, and kvpc ab's check of the same list before it builds (one bound, so kvpc
 * refuses a list exactly when the binary would). */
#define RT_RATIO_LIST_MAX 16

/* A list of compression factors: rt_parse_list with each item finite and >= 1, at most
 * RT_RATIO_LIST_MAX items, into out[0..*n) (out holds RT_RATIO_LIST_MAX). 0, or -1 ("2,0.5",
 * "2, 4", seventeen items: -1; out and *n then undefined). */
int rt_parse_ratio_list(const char *s, double *out, int *n);

#endif
