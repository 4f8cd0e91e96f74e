#include "base/rt_numparse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int rt_parse_int(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	if (isspace((unsigned char)*s))
		return -1;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int rt_parse_u64(const char *s, unsigned long long *out)
{
	if (!*s || strspn(s, "0123456789") != strlen(s))
		return -1;
	char *end;
	errno = 0;
	const unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

int rt_parse_double(const char *s, double *out)
{
	if (!*s || strspn(s, "0123456789.eE+-") != strlen(s))
		return -1;
	char *end;
	errno = 0;
	const double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v))
		return -1;
	*out = v;
	return 0;
}

int rt_parse_list(const char *s, double lo, double hi, int integral, double *out, int cap,
                  int *n)
{
	*n = 0;
	for (const char *p = s;;) {
		char item[32];
		size_t len = strcspn(p, ",");
		if (*n == cap || *n == RT_NUMPARSE_MAX_LIST || len == 0 || len >= sizeof item)
			return -1;
		memcpy(item, p, len);
		item[len] = 0;
		double v;
		if (rt_parse_double(item, &v) || v < lo || v > hi || (integral && v != floor(v)))
			return -1;
		out[(*n)++] = v;
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

int rt_parse_ratio_list(const char *s, double *out, int *n)
{
	return rt_parse_list(s, 1, INFINITY, 0, out, RT_RATIO_LIST_MAX, n);
}
