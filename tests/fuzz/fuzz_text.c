/*
 * fuzz_text: libFuzzer target for the text and haystack loader (runtime/base/rt_text.c).
 * Any byte string is a file's content. Checked against independent references:
 *   - plain: rt_text_from_mem accepts exactly the strings PCRE2's UTF-8 validity check
 *     (RFC 3629) accepts and that hold no NUL byte, and a refusal names the first bad
 *     byte's offset as PCRE2 (or memchr) finds it;
 *   - gzip: the input compressed by zlib as one gzip member, and split in two members,
 *     gives the plain verdict and the same bytes back;
 *   - hostile gzip: the raw input read as gzip data is refused or yields a text that
 *     passes the plain check (no crash, no read outside the input, bounded memory).
 * The Info-file body finder of the haystack reader runs on every accepted text.
 * Built and run by `make fuzz`; seeds: tests/fuzz/corpus/text.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/rt_text.h"
#include "eval/rt_needle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The offset of the first byte that makes s[0..n) not a text, or n when it is one. */
static size_t first_bad(const uint8_t *s, size_t n)
{
	static pcre2_code *re;
	static pcre2_match_data *md;
	if (!re) {
		int ec;
		PCRE2_SIZE eo;
		re = pcre2_compile((PCRE2_SPTR) "", 0, PCRE2_UTF, &ec, &eo, NULL);
		md = pcre2_match_data_create(1, NULL);
		if (!re || !md)
			abort();
	}
	size_t bad = n;
	int rc = pcre2_match(re, s, n, 0, 0, md, NULL);
	if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
		bad = pcre2_get_startchar(md);
	else if (rc < 0)
		abort();
	const uint8_t *z = n ? memchr(s, 0, n) : NULL;
	if (z && (size_t)(z - s) < bad)
		bad = (size_t)(z - s);
	return bad;
}

/* Gzip of s[0..n) as one member (zlib deflate with the gzip wrapper). */
static uint8_t *gz(const uint8_t *s, size_t n, size_t *out_n)
{
	z_stream zs;
	memset(&zs, 0, sizeof zs);
	if (deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
		abort();
	size_t cap = deflateBound(&zs, (uLong)n) + 32;
	uint8_t *o = malloc(cap);
	zs.next_in = (Bytef *)(uintptr_t)s;
	zs.avail_in = (uInt)n;
	zs.next_out = o;
	zs.avail_out = (uInt)cap;
	if (deflate(&zs, Z_FINISH) != Z_STREAM_END)
		abort();
	*out_n = cap - zs.avail_out;
	deflateEnd(&zs);
	return o;
}

/* The loader's verdict on s[0..n) must be `bad` (n = accepted) and give back want[]. */
static void expect(const char *what, const uint8_t *s, size_t n, int is_gz, size_t bad,
                   const uint8_t *want, size_t want_n)
{
	rt_err err = { "" };
	size_t len = 0;
	char *t = rt_text_from_mem("fuzz.txt", s, n, is_gz, &len, &err);
	if ((t != NULL) != (bad == want_n)) {
		fprintf(stderr, "%s: loader %s a text the reference %s (first bad byte %zu): %s\n",
		        what, t ? "accepted" : "refused", t ? "refuses" : "accepts", bad, err.msg);
		abort();
	}
	if (t) {
		if (len != want_n || memcmp(t, want, len) != 0 || t[len] != 0) {
			fprintf(stderr, "%s: loader changed the text\n", what);
			abort();
		}
		(void)rt_needle_info_body(t, len);
		free(t);
		return;
	}
	char off[48];
	snprintf(off, sizeof off, "(byte offset %zu", bad);
	if (strncmp(err.msg, "fuzz.txt:", 9) != 0 || !strstr(err.msg, off)) {
		fprintf(stderr, "%s: refusal does not name byte %zu: %s\n", what, bad, err.msg);
		abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t bad = first_bad(data, size);
	expect("plain", data, size, 0, bad, data, size);

	size_t zn;
	uint8_t *z = gz(data, size, &zn);
	expect("gzip", z, zn, 1, bad, data, size);
	/* two members, split where the first byte says */
	size_t cut = size ? data[0] % (size + 1) : 0, z1n, z2n;
	uint8_t *z1 = gz(data, cut, &z1n), *z2 = gz(data + cut, size - cut, &z2n);
	uint8_t *zz = malloc(z1n + z2n);
	memcpy(zz, z1, z1n);
	memcpy(zz + z1n, z2, z2n);
	expect("two gzip members", zz, z1n + z2n, 1, bad, data, size);
	/* a truncated member is an error */
	rt_err err = { "" };
	size_t len;
	char *t = rt_text_from_mem("fuzz.txt", z, zn - 1, 1, &len, &err);
	if (t) {
		fprintf(stderr, "a truncated gzip member was accepted\n");
		abort();
	}
	free(z), free(z1), free(z2), free(zz);

	/* the input itself as gzip data */
	t = rt_text_from_mem("fuzz.txt", data, size, 1, &len, &err);
	if (t) {
		if (first_bad((const uint8_t *)t, len) != len) {
			fprintf(stderr, "hostile gzip: accepted a decompressed text that is not one\n");
			abort();
		}
		free(t);
	} else if (strncmp(err.msg, "fuzz.txt", 8) != 0) {
		abort();
	}
	return 0;
}
