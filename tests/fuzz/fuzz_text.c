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
 * Every accepted text then goes where a haystack goes: the Info-file body finder, and
 * rt_needle_niah with the tiny byte-level vocabulary of tests/support/tiny_model.c, for a
 * length and depth taken from the first two bytes; a prompt it builds must have exactly
 * the requested length, the needle inside the haystack within RT_NIAH_MAX_BACK tokens
 * before the requested depth, and only vocabulary ids.
 * Built and run by `make fuzz`; seeds: tests/fuzz/corpus/text.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <unistd.h>

#include "base/rt_text.h"
#include "eval/rt_needle.h"
#include "model/rt_gguf.h"
#include "model/rt_tokenizer.h"
#include "tiny_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static rt_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	char tmp[] = "/tmp/fuzz_text_XXXXXX";
	int fd = mkstemp(tmp);
	tiny_model_cfg cfg = { .n_layer = 1, .n_embd = 8, .n_head = 2, .n_head_kv = 1, .n_ff = 16,
		               .n_vocab = 300, .n_ctx = 64, .rope_base = 10000, .seed = 1, .wtype = 0 };
	rt_err err = { "" };
	rt_gguf *g = fd >= 0 && tiny_model_write(&cfg, tmp) == 0 ? rt_gguf_open(tmp, &err) : NULL;
	g_tok = g ? rt_tokenizer_init(g, &err) : NULL;
	rt_gguf_close(g);
	if (fd >= 0)
		close(fd), unlink(tmp);
	if (!g_tok) {
		fprintf(stderr, "fuzz_text: no tiny tokenizer: %s\n", err.msg);
		abort();
	}
	return 0;
}

/* A haystack prompt from text t[0..n) (see the header). */
static void haystack(const char *t, size_t n, const uint8_t *data, size_t size)
{
	int64_t want = 1 + (size > 0 ? data[0] : 0) * 3;
	double depth = size > 1 ? data[1] % 101 : 50;
	rt_needle_prompt p;
	rt_err err = { "" };
	if (rt_needle_niah(g_tok, t, n, want, depth, size > 2 && (data[2] & 1), &p, &err) != 0) {
		if (strncmp(err.msg, "niah: ", 6) != 0) {
			fprintf(stderr, "niah error without its prefix: %s\n", err.msg);
			abort();
		}
		return;
	}
	int32_t nv = rt_tokenizer_n_vocab(g_tok);
	int ok = p.n_ctx + p.n_question == want && p.hay_start >= 0 &&
	         p.needle_pos >= p.hay_start && p.needle_pos <= p.hay_start + p.hay_tokens &&
	         p.needle_pos <= p.target_pos && p.target_pos - p.needle_pos <= RT_NIAH_MAX_BACK &&
	         p.needle_pos + p.needle_len <= p.n_ctx;
	for (int64_t i = 0; i < p.n_ctx && ok; i++)
		ok = p.ctx[i] >= 0 && p.ctx[i] < nv;
	for (int64_t i = 0; i < p.n_question && ok; i++)
		ok = p.question[i] >= 0 && p.question[i] < nv;
	if (!ok) {
		fprintf(stderr, "niah prompt broken: want %lld, ctx %lld + question %lld, needle at "
		        "%lld (target %lld, haystack %lld+%lld)\n", (long long)want, (long long)p.n_ctx,
		        (long long)p.n_question, (long long)p.needle_pos, (long long)p.target_pos,
		        (long long)p.hay_start, (long long)p.hay_tokens);
		abort();
	}
	rt_needle_prompt_free(&p);
}

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
		size_t body = rt_needle_info_body(t, len);
		if (body > len)
			abort();
		if (!strcmp(what, "plain"))
			haystack(t + body, len - body, want, want_n);
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
