/*
 * rt_numparse: the strict number syntax of every command line (kvrt's options, serve's
 * flags, kvpc ab's checks before its build): a decimal integer, or a comma list of
 * numbers, each with bounds. One parser, so that kvpc refuses a list exactly when the
 * binary it builds would.
 */
#ifndef RT_NUMPARSE_H
#define RT_NUMPARSE_H

/* Entries of a comma list the command-line arrays hold. */
#define RT_NUMPARSE_MAX_LIST 32

/* Strict decimal integer in [lo, hi] (no spaces, no trailing text): 0 with *out, or -1 on
 * anything else (*out untouched). */
int rt_parse_int(const char *s, long lo, long hi, long *out);

/* Comma-separated list of finite numbers in [lo, hi] (whole numbers when integral), no
 * spaces and no empty item, at most cap entries (cap <= RT_NUMPARSE_MAX_LIST), into
 * out[0..*n). 0, or -1 on anything else (out and *n then undefined). "2,4,8" with lo 1:
 * {2, 4, 8}; "2,,8", "2, 4", "inf", "0x10" with integral: -1. */
int rt_parse_list(const char *s, double lo, double hi, int integral, double *out, int cap,
                  int *n);

#endif
