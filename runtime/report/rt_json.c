/*
 * rt_json: JSON value writer; see rt_json.h.
 */
#include "report/rt_json.h"

#include <math.h>

#define JSON_SAFE_INT 9007199254740992ULL /* 2^53: larger magnitudes are written as strings */

void rt_json_str(FILE *out, const char *s)
{
	if (!s) {
		fputs("null", out);
		return;
	}
	fputc('"', out);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(out, "\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", out);
		else if (*p < 0x20)
			fprintf(out, "\\u%04x", *p);
		else
			fputc(*p, out);
	}
	fputc('"', out);
}

void rt_json_num(FILE *out, double v)
{
	if (isfinite(v))
		fprintf(out, "%.9g", v);
	else
		fputs("null", out);
}

void rt_json_fixed(FILE *out, double v, int decimals)
{
	if (isfinite(v))
		fprintf(out, "%.*f", decimals, v);
	else
		fputs("null", out);
}

void rt_json_uint(FILE *out, uint64_t v)
{
	fprintf(out, v > JSON_SAFE_INT ? "\"%llu\"" : "%llu", (unsigned long long)v);
}

void rt_json_int(FILE *out, int64_t v)
{
	uint64_t mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	fprintf(out, mag > JSON_SAFE_INT ? "\"%lld\"" : "%lld", (long long)v);
}

void rt_json_member_num(FILE *out, const char *key, double v)
{
	fputc(',', out);
	rt_json_str(out, key);
	fputc(':', out);
	rt_json_num(out, v);
}

void rt_json_member_fixed(FILE *out, const char *key, double v, int decimals)
{
	fputc(',', out);
	rt_json_str(out, key);
	fputc(':', out);
	rt_json_fixed(out, v, decimals);
}
