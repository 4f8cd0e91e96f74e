/*
 * test_tokenizer: the byte-level BPE tokenizer (runtime/model/rt_tokenizer.c).
 *
 * Model-free cases build tiny GPT-2-style vocabularies with gguf_writer and check
 * hand-computed BPE results (merge order by rank, leftmost on ties, no merges across
 * pre-tokenizer pieces, byte fallback), special-token partitioning, error messages and
 * the ChatML renderer. Model cases (env KVRT_MODEL = the SmolLM2-135M-Instruct GGUF)
 * compare against tests/golden/tokenizer/golden.txt, written by make_golden.py from
 * llama.cpp's own tokenizer (llama-cpp-python, vocab_only) and jinja2: every golden text's
 * ids exactly, decode(tokenize(x)) == x, the decoded bytes of all 49152 tokens (hash), the
 * end-of-generation set, and 1 MB inputs in bounded time.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/gguf_writer.h"
#include "model/rt_chat.h"
#include "model/rt_tokenizer.h"
#include "support/check_run.h"

#define GOLDEN "tests/golden/tokenizer/golden.txt"

/* ---- golden file ----------------------------------------------------------------- */

typedef struct gcase {
	char name[64];
	int special, roundtrip;
	char *text;
	size_t len;
	int32_t *ids;
	int64_t n_ids;
} gcase;

typedef struct golden {
	gcase cases[128];
	int n;
	int32_t eog[64];
	int n_eog;
	uint64_t vocab_fnv;
	struct {
		char *sys, *user, *render; /* sys NULL = template default */
	} chat[16];
	int n_chat;
} golden;

static uint64_t fnv64(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}
#define FNV_INIT 0xcbf29ce484222325ULL

/* Hex to bytes (NUL-terminated copy); "-" and "=" are the empty string. */
static char *unhex(const char *h, size_t *len)
{
	size_t n = strlen(h);
	if (!strcmp(h, "-") || !strcmp(h, "="))
		n = 0;
	ck_assert_msg(n % 2 == 0, "odd hex length %zu", n);
	char *s = malloc(n / 2 + 1);
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;
		ck_assert_int_eq(sscanf(h + 2 * i, "%2x", &v), 1);
		s[i] = (char)v;
	}
	s[n / 2] = '\0';
	if (len)
		*len = n / 2;
	return s;
}

static char *read_prefix(const char *path, size_t n)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	char *s = malloc(n + 1);
	ck_assert_uint_eq(fread(s, 1, n, f), n);
	fclose(f);
	s[n] = '\0';
	return s;
}

static int32_t *parse_ids(char *rest, int64_t *n)
{
	char *end;
	long long cnt = strtoll(rest, &end, 10);
	ck_assert(cnt >= 0);
	int32_t *ids = malloc(((size_t)cnt + 1) * sizeof *ids);
	for (long long i = 0; i < cnt; i++)
		ids[i] = (int32_t)strtol(end, &end, 10);
	*n = cnt;
	return ids;
}

static void golden_load_from(golden *g, const char *path)
{
	memset(g, 0, sizeof *g);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s (run the tests from the repo root)", path);
	char *line = NULL;
	size_t cap = 0;
	ssize_t ll;
	gcase *c = NULL;
	while ((ll = getline(&line, &cap, f)) > 0) {
		if (line[ll - 1] == '\n')
			line[--ll] = '\0';
		if (!strncmp(line, "case ", 5)) {
			ck_assert_int_lt(g->n, 128);
			c = &g->cases[g->n++];
			ck_assert_int_eq(sscanf(line + 5, "%63s %d %d", c->name, &c->special, &c->roundtrip), 3);
		} else if (!strncmp(line, "text ", 5)) {
			c->text = unhex(line + 5, &c->len);
		} else if (!strncmp(line, "file ", 5)) {
			char path[256], sha[80];
			size_t n;
			unsigned long long h;
			ck_assert_int_eq(sscanf(line + 5, "%255s %zu %llx %79s", path, &n, &h, sha), 4);
			c->text = read_prefix(path, n);
			c->len = n;
			ck_assert_msg(fnv64(FNV_INIT, c->text, n) == h,
			              "%s changed on this system (FNV-1a-64 of %zu bytes; sha256 should be %s)",
			              path, n, sha);
		} else if (!strncmp(line, "ids ", 4)) {
			c->ids = parse_ids(line + 4, &c->n_ids);
		} else if (!strncmp(line, "eog ", 4)) {
			int64_t n;
			int32_t *ids = parse_ids(line + 4, &n);
			ck_assert_int_le(n, 64);
			memcpy(g->eog, ids, (size_t)n * sizeof *ids);
			g->n_eog = (int)n;
			free(ids);
		} else if (!strncmp(line, "vocab_fnv ", 10)) {
			g->vocab_fnv = strtoull(line + 10, NULL, 16);
		} else if (!strncmp(line, "chat ", 5)) {
			char *a = strtok(line + 5, " "), *b = strtok(NULL, " "), *r = strtok(NULL, " ");
			ck_assert(a && b && r && g->n_chat < 16);
			g->chat[g->n_chat].sys = strcmp(a, "-") ? unhex(a, NULL) : NULL;
			g->chat[g->n_chat].user = unhex(b, NULL);
			g->chat[g->n_chat].render = unhex(r, NULL);
			g->n_chat++;
		}
	}
	free(line);
	fclose(f);
	ck_assert_int_ge(g->n, 30);
	for (int i = 0; i < g->n; i++)
		ck_assert_msg(g->cases[i].ids != NULL && (g->cases[i].text != NULL),
		              "golden case %s incomplete", g->cases[i].name);
}

static void golden_load(golden *g)
{
	golden_load_from(g, GOLDEN);
}

static void golden_free(golden *g)
{
	for (int i = 0; i < g->n; i++) {
		free(g->cases[i].text);
		free(g->cases[i].ids);
	}
	for (int i = 0; i < g->n_chat; i++) {
		free(g->chat[i].sys);
		free(g->chat[i].user);
		free(g->chat[i].render);
	}
}

/* ---- helpers ------------------------------------------------------------------- */

/* Tokenize into a fresh array (size query first); asserts success. */
static int32_t *tok(const rt_tokenizer *t, const char *s, size_t n, int special, int64_t *count)
{
	rt_err err = {{0}};
	int64_t m = rt_tokenize(t, s, n, special, NULL, 0, &err);
	ck_assert_msg(m >= 0, "tokenize failed: %s", err.msg);
	int32_t *ids = malloc(((size_t)m + 1) * sizeof *ids);
	ck_assert_int_eq(rt_tokenize(t, s, n, special, ids, m, &err), m);
	*count = m;
	return ids;
}

/* Concatenated decoded bytes of ids (heap, NUL-terminated). */
static char *detok(const rt_tokenizer *t, const int32_t *ids, int64_t n, size_t *len)
{
	size_t cap = 64, w = 0;
	char *s = malloc(cap);
	for (int64_t i = 0; i < n; i++) {
		int k = rt_token_to_bytes(t, ids[i], NULL, 0);
		ck_assert_int_ge(k, 0);
		while (w + (size_t)k + 1 > cap)
			s = realloc(s, cap *= 2);
		ck_assert_int_eq(rt_token_to_bytes(t, ids[i], s + w, k), k);
		w += (size_t)k;
	}
	s[w] = '\0';
	*len = w;
	return s;
}

/* Compare id arrays; on mismatch report the first differing index. */
static void assert_ids(const char *what, const int32_t *got, int64_t ng, const int32_t *exp, int64_t ne)
{
	int64_t i = 0;
	while (i < ng && i < ne && got[i] == exp[i])
		i++;
	ck_assert_msg(ng == ne && i == ne, "%s: %lld ids, expected %lld; first difference at %lld (got %d, expected %d)",
	              what, (long long)ng, (long long)ne, (long long)i, i < ng ? got[i] : -1,
	              i < ne ? exp[i] : -1);
}

/* ---- synthetic vocabularies ------------------------------------------------------ */

/* GPT-2 bytes_to_unicode symbol of byte b, UTF-8. */
static void byte_sym(int b, char out[4])
{
	int n = 0, cp = -1;
	for (int x = 0; x < 256; x++) {
		int keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
		int c = keep ? x : 256 + n++;
		if (x == b)
			cp = c;
	}
	memset(out, 0, 4);
	if (cp < 0x80) {
		out[0] = (char)cp;
	} else {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
	}
}

/*
 * Vocabulary: 0 "<|endoftext|>" (control), 1 "<|im_start|>" (control), 2 "<|im_end|>"
 * (control), 3..258 the 256 byte symbols (id = 3 + byte), then the extra tokens below,
 * then one user-defined token "<tool>". Extra token k has id 259 + k.
 */
static const char *const EXTRA[] = {"ab", "bc", "abc", "aa", "Ġa", "Ġab", "aaaa", "12"};
enum { ID_AB = 259, ID_BC, ID_ABC, ID_AA, ID_SP_A, ID_SP_AB, ID_AAAA, ID_12, ID_TOOL };
#define N_SYN (ID_TOOL + 1)
#define B(c) (3 + (int)(unsigned char)(c))

/* Write a synthetic tokenizer GGUF to a temp file. what selects a defect for error tests:
 * 0 none, 1 no tokenizer.ggml.model, 2 model "llama", 3 pre "llama-bpe", 4 no merges,
 * 5 a merge without a space, 6 no tokenizer.ggml.pre; 7 is valid but types "<|im_end|>" as
 * a normal token; 8 a token_type array shorter than the vocabulary. */
static char *write_syn(int what)
{
	static const char *const merges[] = {
		"a b",   /* 0 -> ab */
		"b c",   /* 1 -> bc */
		"ab c",  /* 2 -> abc */
		"a a",   /* 3 -> aa */
		"Ġ a",   /* 4 -> Ġa */
		"Ġa b",  /* 5 -> Ġab */
		"aa aa", /* 6 -> aaaa */
		"1 2",   /* 7 -> 12 (never applies: smollm splits digits) */
		"x y",   /* 8 -> xy, not in the vocabulary */
		"a Ġ",   /* 9 -> never applies: 'a' and ' ' are in different pieces */
	};
	const char *toks[N_SYN];
	int32_t types[N_SYN];
	char syms[256][4];
	toks[0] = "<|endoftext|>";
	toks[1] = "<|im_start|>";
	toks[2] = "<|im_end|>";
	for (int i = 0; i < 3; i++)
		types[i] = 3;
	for (int b = 0; b < 256; b++) {
		byte_sym(b, syms[b]);
		toks[3 + b] = syms[b];
		types[3 + b] = 1;
	}
	for (int k = 0; k < (int)(sizeof EXTRA / sizeof EXTRA[0]); k++) {
		toks[259 + k] = EXTRA[k];
		types[259 + k] = 1;
	}
	toks[ID_TOOL] = "<tool>";
	types[ID_TOOL] = 4;
	if (what == 7)
		types[2] = 1;
	const char *bad_merges[] = {"a b", "nospace"};

	gw *w = gw_init();
	gw_kv_str(w, "general.architecture", "llama");
	if (what != 1)
		gw_kv_str(w, "tokenizer.ggml.model", what == 2 ? "t5" : "gpt2");
	if (what != 6)
		gw_kv_str(w, "tokenizer.ggml.pre", what == 3 ? "falcon" : "smollm");
	gw_kv_str_arr(w, "tokenizer.ggml.tokens", toks, N_SYN);
	gw_kv_i32_arr(w, "tokenizer.ggml.token_type", types, what == 8 ? N_SYN - 1 : N_SYN);
	if (what == 5)
		gw_kv_str_arr(w, "tokenizer.ggml.merges", bad_merges, 2);
	else if (what != 4)
		gw_kv_str_arr(w, "tokenizer.ggml.merges", merges, sizeof merges / sizeof merges[0]);
	gw_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
	char *path = strdup("/tmp/test_tokenizer_......");
	memset(path + strlen(path) - 6, 'X', 6); /* mkstemp's template suffix */
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(gw_write(w, path), 0);
	gw_free(w);
	return path;
}

static rt_tokenizer *open_syn_variant(int what)
{
	char *path = write_syn(what);
	rt_err err = {{0}};
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	rt_tokenizer *t = rt_tokenizer_init(g, &err);
	ck_assert_msg(t != NULL, "%s", err.msg);
	rt_gguf_close(g); /* the tokenizer keeps its own copies */
	unlink(path);
	free(path);
	return t;
}

static rt_tokenizer *open_syn(void)
{
	return open_syn_variant(0);
}

static void expect_syn(const rt_tokenizer *t, const char *text, int special, const int32_t *exp, int64_t ne)
{
	int64_t n;
	int32_t *ids = tok(t, text, strlen(text), special, &n);
	assert_ids(text, ids, n, exp, ne);
	free(ids);
}
#define EXPECT(t, text, special, ...)                                                    \
	do {                                                                                  \
		const int32_t e_[] = {__VA_ARGS__};                                               \
		expect_syn(t, text, special, e_, (int64_t)(sizeof e_ / sizeof e_[0]));            \
	} while (0)

START_TEST(test_bpe_merge_order)
{
	rt_tokenizer *t = open_syn();
	ck_assert_int_eq(rt_tokenizer_n_vocab(t), N_SYN);
	/* (a,b) rank 0 before (b,c) rank 1, then (ab,c) rank 2 */
	EXPECT(t, "abc", 0, ID_ABC);
	/* "bcab": (a,b) rank 0 merges first, then (b,c) rank 1; (bc,ab) has no rank */
	EXPECT(t, "bcab", 0, ID_BC, ID_AB);
	/* equal ranks: leftmost first; "aaa" -> aa a; "aaaaa" -> aa aa a -> aaaa a */
	EXPECT(t, "aaa", 0, ID_AA, B('a'));
	EXPECT(t, "aaaaa", 0, ID_AAAA, B('a'));
	/* " ab": the space belongs to the letter piece, so Ġ+a (rank 4) beats nothing,
	 * but a+b (rank 0) comes first: Ġ ab, and (Ġ,ab) has no rank */
	EXPECT(t, " ab", 0, B(' '), ID_AB);
	/* " a b": pieces " a", " b" -> Ġa, Ġ b */
	EXPECT(t, " a b", 0, ID_SP_A, B(' '), B('b'));
	/* merge result "xy" is not a token: its bytes */
	EXPECT(t, "xy", 0, B('x'), B('y'));
	rt_tokenizer_free(t);
}
END_TEST

START_TEST(test_pretokenizer_pieces)
{
	rt_tokenizer *t = open_syn();
	/* smollm splits every digit: the "1 2" merge must never apply */
	EXPECT(t, "12", 0, B('1'), B('2'));
	EXPECT(t, "a12b", 0, B('a'), B('1'), B('2'), B('b'));
	/* "a " : the letter run and the trailing space are different pieces ("a Ġ" unused) */
	EXPECT(t, "a ", 0, B('a'), B(' '));
	/* "aa  ab": "aa", " " (\s+(?!\S) leaves one space), " ab" -> Ġ ab */
	EXPECT(t, "aa  ab", 0, ID_AA, B(' '), B(' '), ID_AB);
	/* contractions are their own pieces: "a's" -> a, ' s */
	EXPECT(t, "a's", 0, B('a'), B('\''), B('s'));
	/* punctuation runs with an optional leading space: " !?" one piece (no merges) */
	EXPECT(t, "a !?", 0, B('a'), B(' '), B('!'), B('?'));
	/* empty input */
	int64_t n;
	int32_t *ids = tok(t, "", 0, 0, &n);
	ck_assert_int_eq(n, 0);
	free(ids);
	rt_tokenizer_free(t);
}
END_TEST

START_TEST(test_special_partition)
{
	rt_tokenizer *t = open_syn();
	/* control tokens only with parse_special */
	EXPECT(t, "<|im_start|>ab<|im_end|>", 1, 1, ID_AB, 2);
	EXPECT(t, "<|im_end|>", 0, B('<'), B('|'), B('i'), B('m'), B('_'), B('e'), B('n'), B('d'),
	       B('|'), B('>'));
	/* a user-defined token is matched either way */
	EXPECT(t, "ab<tool>ab", 0, ID_AB, ID_TOOL, ID_AB);
	EXPECT(t, "<tool><tool>", 1, ID_TOOL, ID_TOOL);
	/* partial special text stays plain text */
	EXPECT(t, "<|im_start|", 1, B('<'), B('|'), B('i'), B('m'), B('_'), B('s'), B('t'), B('a'),
	       B('r'), B('t'), B('|'));
	ck_assert_int_eq(rt_tokenizer_find(t, "<tool>"), ID_TOOL);
	ck_assert_int_eq(rt_tokenizer_find(t, "abc"), ID_ABC);
	ck_assert_int_eq(rt_tokenizer_find(t, "xy"), -1); /* interned merge result, not a token */
	ck_assert_int_eq(rt_tokenizer_find(t, "zzz"), -1);
	/* EOG: <|endoftext|>, <|im_end|> (by text), eos id 2; not <|im_start|> */
	ck_assert(rt_tokenizer_is_eog(t, 0));
	ck_assert(rt_tokenizer_is_eog(t, 2));
	ck_assert(!rt_tokenizer_is_eog(t, 1));
	ck_assert(!rt_tokenizer_is_eog(t, ID_AB));
	ck_assert(!rt_tokenizer_is_eog(t, -1));
	ck_assert(!rt_tokenizer_is_eog(t, N_SYN));
	rt_tokenizer_free(t);
}
END_TEST

/* llama.cpp forces EOG-named tokens to the control type even when the GGUF says normal:
 * "<|im_end|>" then ends generation, is matched only with parse_special, and decodes
 * literally. */
START_TEST(test_eog_text_forces_control)
{
	rt_tokenizer *t = open_syn_variant(7);
	ck_assert(rt_tokenizer_is_eog(t, 2));
	EXPECT(t, "a<|im_end|>", 1, B('a'), 2);
	EXPECT(t, "<|im_end|>", 0, B('<'), B('|'), B('i'), B('m'), B('_'), B('e'), B('n'), B('d'),
	       B('|'), B('>'));
	char buf[16];
	ck_assert_int_eq(rt_token_to_bytes(t, 2, buf, sizeof buf), 10);
	ck_assert(!memcmp(buf, "<|im_end|>", 10));
	rt_tokenizer_free(t);
}
END_TEST

START_TEST(test_decode_and_buffers)
{
	rt_tokenizer *t = open_syn();
	char buf[32];
	ck_assert_int_eq(rt_token_to_bytes(t, ID_SP_AB, buf, sizeof buf), 3);
	ck_assert(!memcmp(buf, " ab", 3));
	ck_assert_int_eq(rt_token_to_bytes(t, B('\n'), buf, sizeof buf), 1);
	ck_assert_int_eq(buf[0], '\n');
	ck_assert_int_eq(rt_token_to_bytes(t, B(0xff), buf, sizeof buf), 1);
	ck_assert_int_eq((unsigned char)buf[0], 0xff);
	ck_assert_int_eq(rt_token_to_bytes(t, 1, buf, sizeof buf), 12); /* control: literal */
	ck_assert(!memcmp(buf, "<|im_start|>", 12));
	/* short buffer: writes cap bytes, returns the full length */
	memset(buf, '#', sizeof buf);
	ck_assert_int_eq(rt_token_to_bytes(t, 1, buf, 3), 12);
	ck_assert(!memcmp(buf, "<|i#", 4));
	ck_assert_int_eq(rt_token_to_bytes(t, -1, buf, sizeof buf), -1);
	ck_assert_int_eq(rt_token_to_bytes(t, N_SYN, buf, sizeof buf), -1);

	/* output capacity: the count is always the full one, at most cap ids written */
	rt_err err = {{0}};
	int32_t out[4] = {-7, -7, -7, -7};
	ck_assert_int_eq(rt_tokenize(t, "x y z", 5, 0, out, 2, &err), 5);
	ck_assert_int_eq(out[0], B('x'));
	ck_assert_int_eq(out[1], B(' '));
	ck_assert_int_eq(out[2], -7);
	ck_assert_int_eq(rt_tokenize(t, "x y z", 5, 0, NULL, 0, &err), 5);
	ck_assert_int_eq(rt_tokenize(t, NULL, 0, 1, NULL, 0, &err), 0);
	ck_assert_int_eq(rt_tokenize(t, "x", 1, 0, NULL, 4, &err), -1);
	ck_assert_str_eq(err.msg, "text: bad output buffer (cap 4)");
	rt_tokenizer_free(t);
}
END_TEST

START_TEST(test_invalid_utf8)
{
	rt_tokenizer *t = open_syn();
	static const struct {
		const char *s;
		size_t n;
		size_t at;
	} bad[] = {
		{"\xff", 1, 0},
		{"ab\xc3", 3, 2},          /* truncated 2-byte sequence */
		{"a\xc0\xaf", 3, 1},       /* overlong '/' */
		{"xy\xed\xa0\x80z", 6, 2}, /* UTF-16 surrogate */
		{"\xf4\x90\x80\x80", 4, 0}, /* > U+10FFFF */
		{"ok\x80", 3, 2},          /* stray continuation */
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		rt_err err = {{0}};
		int32_t out[16];
		ck_assert_int_eq(rt_tokenize(t, bad[i].s, bad[i].n, 1, out, 16, &err), -1);
		char want[64];
		snprintf(want, sizeof want, "text: invalid UTF-8 at byte %zu", bad[i].at);
		ck_assert_str_eq(err.msg, want);
	}
	rt_tokenizer_free(t);
}
END_TEST

/* Deterministic generator for the property tests (64-bit LCG, high bits). */
static uint32_t rng_next(uint64_t *s)
{
	*s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(*s >> 33);
}

/* Random valid UTF-8 of about n bytes mixing ASCII, spaces, digits, Latin, CJK, emoji and
 * combining marks; skip_notoken leaves out the bytes SmolLM2 has no token for. */
static size_t rand_utf8(uint64_t *st, char *o, size_t n, int skip_notoken)
{
	static const uint32_t lo[] = {0x00, 0x20, 0x30, 0x09, 0xA0, 0x300, 0x4E00, 0x1F300, 0x10000};
	static const uint32_t hi[] = {0x7F, 0x20, 0x39, 0x0D, 0x24F, 0x36F, 0x9FFF, 0x1FAFF, 0x10FFFF};
	size_t w = 0;
	while (w + 4 <= n) {
		int r = (int)(rng_next(st) % 9);
		uint32_t cp = lo[r] + rng_next(st) % (hi[r] - lo[r] + 1);
		if (cp >= 0xD800 && cp <= 0xDFFF)
			continue;
		/* SmolLM2 has no token for bytes 04 06 13 14 16 1d, nor for the lead bytes f1 f2
		 * of U+40000..U+BFFFF (planes 4-11, unassigned) */
		if (skip_notoken && (cp == 0x04 || cp == 0x06 || cp == 0x13 || cp == 0x14 || cp == 0x16 ||
		                     cp == 0x1d || (cp >= 0x40000 && cp <= 0xBFFFF)))
			continue;
		if (cp < 0x80) {
			o[w++] = (char)cp;
		} else if (cp < 0x800) {
			o[w++] = (char)(0xC0 | (cp >> 6));
			o[w++] = (char)(0x80 | (cp & 0x3F));
		} else if (cp < 0x10000) {
			o[w++] = (char)(0xE0 | (cp >> 12));
			o[w++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			o[w++] = (char)(0x80 | (cp & 0x3F));
		} else {
			o[w++] = (char)(0xF0 | (cp >> 18));
			o[w++] = (char)(0x80 | ((cp >> 12) & 0x3F));
			o[w++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			o[w++] = (char)(0x80 | (cp & 0x3F));
		}
	}
	return w;
}

static void roundtrip_random(const rt_tokenizer *t, int iters, int skip_notoken)
{
	uint64_t st = 12345;
	char buf[512];
	for (int it = 0; it < iters; it++) {
		size_t n = rand_utf8(&st, buf, 1 + rng_next(&st) % sizeof buf, skip_notoken);
		int64_t m;
		int32_t *ids = tok(t, buf, n, (int)(it & 1), &m);
		size_t len;
		char *back = detok(t, ids, m, &len);
		ck_assert_msg(len == n && !memcmp(back, buf, n), "iteration %d: decode(tokenize(x)) != x", it);
		free(back);
		free(ids);
	}
}

/* Random bytes: either valid UTF-8 (then ids come back) or one located error, never a crash. */
START_TEST(test_random_bytes_and_roundtrip)
{
	rt_tokenizer *t = open_syn();
	uint64_t st = 777;
	int n_bad = 0;
	for (int it = 0; it < 2000; it++) {
		char buf[64];
		size_t n = rng_next(&st) % sizeof buf;
		for (size_t i = 0; i < n; i++)
			buf[i] = (char)(rng_next(&st) & (it & 1 ? 0xFF : 0xBF));
		rt_err err = {{0}};
		int32_t out[128];
		size_t bad_at;
		int valid = rt_utf8_valid(buf, n, &bad_at);
		int64_t m = rt_tokenize(t, buf, n, 1, out, 128, &err);
		if (valid) {
			ck_assert_int_ge(m, 0);
			ck_assert_int_le(m, (int64_t)n);
		} else {
			char want[64];
			snprintf(want, sizeof want, "text: invalid UTF-8 at byte %zu", bad_at);
			ck_assert_int_eq(m, -1);
			ck_assert_str_eq(err.msg, want);
			n_bad++;
		}
	}
	ck_assert_int_gt(n_bad, 100);
	roundtrip_random(t, 300, 0);
	rt_tokenizer_free(t);
}
END_TEST

/* ---- SentencePiece (tokenizer.ggml.model "llama") ---------------------------------- */

/* A SentencePiece vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3..258 the byte tokens <0x00>..
 * <0xFF>, then normal pieces with integer scores (higher merges first). flags: 1 = the
 * file sets add_space_prefix false, 2 = add_bos_token false. */
enum { SPM_SP = 259, SPM_A, SPM_B, SPM_AB, SPM_SP_A, SPM_SP_AB, SPM_AA, SPM_N };
static rt_tokenizer *open_spm_ex(int flags, const char *bos_text, const char *chat_template,
                                 const char *extra_control)
{
	const char *toks[SPM_N];
	int32_t types[SPM_N], scores[SPM_N];
	char bytes[256][8];
	toks[0] = "<unk>", toks[1] = bos_text, toks[2] = extra_control ? extra_control : "</s>";
	types[0] = 2, types[1] = types[2] = 3;
	for (int b = 0; b < 256; b++) {
		snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
		toks[3 + b] = bytes[b];
		types[3 + b] = 6;
	}
	static const struct { const char *s; int32_t score; } P[] = {
		{"\xe2\x96\x81", -1}, {"a", -2}, {"b", -3}, {"ab", -5}, {"\xe2\x96\x81" "a", -4},
		{"\xe2\x96\x81" "ab", -6}, {"aa", -2},
	};
	for (int i = 0; i < SPM_N; i++)
		scores[i] = 0;
	for (int k = 0; k < SPM_N - SPM_SP; k++) {
		toks[SPM_SP + k] = P[k].s;
		types[SPM_SP + k] = 1;
		scores[SPM_SP + k] = P[k].score;
	}
	gw *w = gw_init();
	gw_kv_str(w, "general.architecture", "llama");
	gw_kv_str(w, "tokenizer.ggml.model", "llama");
	gw_kv_str_arr(w, "tokenizer.ggml.tokens", toks, SPM_N);
	gw_kv_i32_arr(w, "tokenizer.ggml.token_type", types, SPM_N);
	gw_kv_i32_arr(w, "tokenizer.ggml.scores", scores, SPM_N);
	if (flags & 1)
		gw_kv_bool(w, "tokenizer.ggml.add_space_prefix", 0);
	if (flags & 2)
		gw_kv_bool(w, "tokenizer.ggml.add_bos_token", 0);
	if (chat_template)
		gw_kv_str(w, "tokenizer.chat_template", chat_template);
	char path[] = "/tmp/test_tokenizer_spm_XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(gw_write(w, path), 0);
	gw_free(w);
	rt_err err = {{0}};
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	rt_tokenizer *t = rt_tokenizer_init(g, &err);
	ck_assert_msg(t != NULL, "%s", err.msg);
	rt_gguf_close(g);
	unlink(path);
	return t;
}

static rt_tokenizer *open_spm(int flags)
{
	return open_spm_ex(flags, "<s>", NULL, NULL);
}

static void expect_ids(const rt_tokenizer *t, const char *s, int special, const int32_t *want, int n)
{
	int64_t m;
	int32_t *ids = tok(t, s, strlen(s), special, &m);
	ck_assert_msg(m == n, "'%s': %lld ids, want %d", s, (long long)m, n);
	for (int i = 0; i < n; i++)
		ck_assert_msg(ids[i] == want[i], "'%s': id %d is %d, want %d", s, i, ids[i], want[i]);
	free(ids);
}
#define EXPECT_SPM(t, s, sp, ...) do { \
	const int32_t w_[] = { __VA_ARGS__ }; \
	expect_ids(t, s, sp, w_, (int)(sizeof w_ / sizeof w_[0])); } while (0)

/* Hand-computed SentencePiece merges: the highest score first, the leftmost on equal
 * scores, a leading U+2581 when add_space_prefix (at the start and after a special token
 * only), byte fallback for a character without a piece, BOS from the defaults. */
START_TEST(test_spm_merges)
{
	rt_tokenizer *t = open_spm(0);
	/* "\u2581ab": (\u2581,a) -4 beats (a,b) -5; then "\u2581a"+"b" = "\u2581ab" */
	EXPECT_SPM(t, "ab", 0, SPM_SP_AB);
	/* "\u2581aaa": the two (a,a) pairs tie at -2; the left one merges; "\u2581aa" and
	 * "aaa" are no pieces */
	EXPECT_SPM(t, "aaa", 0, SPM_SP, SPM_AA, SPM_A);
	/* spaces are U+2581: "\u2581a\u2581b" */
	EXPECT_SPM(t, "a b", 0, SPM_SP_A, SPM_SP, SPM_B);
	/* byte fallback: 'c' and the two bytes of U+00E9 have no piece */
	EXPECT_SPM(t, "c", 0, SPM_SP, 3 + 'c');
	EXPECT_SPM(t, "\xc3\xa9", 0, SPM_SP, 3 + 0xc3, 3 + 0xa9);
	/* the prefix space follows a special token, not plain text */
	EXPECT_SPM(t, "<s>ab<s>ab", 1, 1, SPM_SP_AB, 1, SPM_SP_AB);
	EXPECT_SPM(t, "ab<s>", 1, SPM_SP_AB, 1);
	/* without parse_special "<s>" is text: "\u2581<s>ab" */
	EXPECT_SPM(t, "<s>", 0, SPM_SP, 3 + '<', 3 + 's', 3 + '>');
	int64_t m;
	free(tok(t, "", 0, 0, &m));
	ck_assert_int_eq(m, 0);
	ck_assert_int_eq(rt_tokenizer_bos(t), 1); /* SentencePiece default: BOS 1 added */
	ck_assert(rt_tokenizer_is_eog(t, 2));    /* default eos 2 */
	char b[16];
	ck_assert_int_eq(rt_token_to_bytes(t, SPM_SP_AB, b, sizeof b), 3);
	ck_assert(!memcmp(b, " ab", 3));
	ck_assert_int_eq(rt_token_to_bytes(t, 3 + 0xc3, b, sizeof b), 1);
	ck_assert_int_eq((uint8_t)b[0], 0xc3);
	ck_assert_int_eq(rt_token_to_bytes(t, 1, b, sizeof b), 3);
	ck_assert(!memcmp(b, "<s>", 3));
	rt_tokenizer_free(t);

	t = open_spm(1 | 2);
	EXPECT_SPM(t, "ab", 0, SPM_AB);
	EXPECT_SPM(t, " ab", 0, SPM_SP_AB);
	ck_assert_int_eq(rt_tokenizer_bos(t), -1);
	rt_tokenizer_free(t);
}
END_TEST

START_TEST(test_init_errors)
{
	static const char *const want[] = {
		NULL,
		"key 'tokenizer.ggml.model' missing",
		"key 'tokenizer.ggml.model' is 't5'; supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece)",
		"key 'tokenizer.ggml.pre' is 'falcon'; supported: smollm,",
		"key 'tokenizer.ggml.merges' missing",
		"merge 1 'nospace' has no space separator",
		"key 'tokenizer.ggml.pre' missing",
		NULL,
		"'tokenizer.ggml.token_type' is not an i32 array of 268 entries",
	};
	for (int what = 1; what <= 8; what++) {
		if (!want[what])
			continue;
		char *path = write_syn(what);
		rt_err err = {{0}};
		rt_gguf *g = rt_gguf_open(path, &err);
		ck_assert_msg(g != NULL, "%s", err.msg);
		ck_assert_ptr_null(rt_tokenizer_init(g, &err));
		ck_assert_msg(strstr(err.msg, want[what]) && strstr(err.msg, path) &&
		                  strstr(err.msg, ": tokenizer: "),
		              "case %d: '%s' lacks '%s'", what, err.msg, want[what]);
		rt_gguf_close(g);
		unlink(path);
		free(path);
	}
}
END_TEST

static rt_tokenizer *model_tok; /* the SmolLM2 file's (model cases) */

/* ---- chat templates ------------------------------------------------------------------ */

/* The family chosen from a tokenizer.chat_template and its rendering of one conversation,
 * against hand-written prompts in each family's documented format (Llama 3's model card,
 * Gemma's <start_of_turn> format, Mistral's [INST] formats, ChatML, Phi-3): system text,
 * two user turns and an assistant turn with spaces around it (kept or trimmed as the
 * family does), the generation prompt where the family has one, and the BOS text first
 * when the vocabulary adds BOS. */
START_TEST(test_chat_families)
{
	static const struct {
		const char *tmpl, *bos; /* bos NULL: the vocabulary adds none */
		const char *family, *want;
	} C[] = {
		{"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
		 "'<|im_end|>' + '\\n'}}{% endfor %}", NULL, "chatml",
		 "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
		 "<|im_start|>assistant\n Hello. <|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
		 "<|im_start|>assistant\n"},
		{"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
		 "message['content'] | trim + '<|eot_id|>' %}", "<|begin_of_text|>", "llama3",
		 "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
		 "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
		 "<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?"
		 "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{{ '<start_of_turn>' + role + '\\n' }}",
		 "<bos>", "gemma",
		 "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
		 "Hello.<end_of_turn>\n<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n"},
		{"{{- \"[AVAILABLE_TOOLS] [\" }}{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}", "<s>",
		 "mistral-v3", "<s>[INST] You are terse.\n\nHi[/INST] Hello.</s>[INST] 2+2?[/INST]"},
		{"{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{{- '[INST]' }}", "<s>",
		 "mistral-v7",
		 "<s>[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST] Hi[/INST]  Hello. </s>[INST] 2+2?[/INST]"},
		{"{{ bos_token }}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
		 "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}", "<s>",
		 "llama2", "<s>[INST] You are terse.\nHi [/INST] Hello. </s>[INST] 2+2? [/INST]"},
		{"{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>\\n' + '<|assistant|>\\n'}}",
		 NULL, "phi3",
		 "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n Hello. <|end|>\n"
		 "<|user|>\n2+2?<|end|>\n<|assistant|>\n"},
	};
	static const rt_chat_msg conv[] = {
		{"system", "You are terse."}, {"user", "Hi"}, {"assistant", " Hello. "}, {"user", "2+2?"},
	};
	for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
		rt_tokenizer *t = open_spm_ex(C[i].bos ? 0 : 2, C[i].bos ? C[i].bos : "<s>", C[i].tmpl, NULL);
		rt_err err = {{0}};
		const char *fam = rt_chat_family(t, &err);
		ck_assert_msg(fam && !strcmp(fam, C[i].family), "case %zu: family %s, want %s (%s)", i,
		              fam ? fam : "none", C[i].family, err.msg);
		char *got = rt_chat_render_msgs(t, conv, 4, &err);
		ck_assert_msg(got != NULL, "%s: %s", C[i].family, err.msg);
		ck_assert_msg(!strcmp(got, C[i].want), "%s:\n got '%s'\nwant '%s'", C[i].family, got, C[i].want);
		/* the pieces: contents are plain text and carry their message's index */
		int ns;
		rt_chat_seg *sg = rt_chat_segments(t, conv, 4, &ns, &err);
		ck_assert_ptr_nonnull(sg);
		int saw_user2 = 0;
		for (int k = 0; k < ns; k++)
			if (!sg[k].special && sg[k].len == 4 && !memcmp(sg[k].text, "2+2?", 4))
				saw_user2 = sg[k].msg == 3;
		ck_assert_msg(saw_user2, "%s: the last user content is not one plain piece of message 3", C[i].family);
		free(sg);
		free(got);
		rt_tokenizer_free(t);
	}
}
END_TEST

/* Refusals name the file and the key; a file without a template falls back on its turn
 * tokens (Gemma 3 270M's GGUF has no tokenizer.chat_template). */
START_TEST(test_chat_refused_and_fallback)
{
	rt_err err = {{0}};
	rt_tokenizer *t = open_spm_ex(0, "<s>", "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' }}", NULL);
	char *r = rt_chat_render(t, NULL, "Hi", &err);
	ck_assert_ptr_null(r);
	ck_assert_msg(strstr(err.msg, "/tmp/test_tokenizer_spm_") && strstr(err.msg, "tokenizer.chat_template") &&
	              strstr(err.msg, "command-r") && strstr(err.msg, "supported: chatml"), "%s", err.msg);
	rt_tokenizer_free(t);
	t = open_spm_ex(0, "<s>", "{{ messages }}", NULL);
	ck_assert_ptr_null(rt_chat_render(t, NULL, "Hi", &err));
	ck_assert_msg(strstr(err.msg, "template not recognised"), "%s", err.msg);
	rt_tokenizer_free(t);
	t = open_spm_ex(0, "<s>", NULL, NULL);
	ck_assert_ptr_null(rt_chat_render(t, NULL, "Hi", &err));
	ck_assert_msg(strstr(err.msg, "tokenizer.chat_template: missing"), "%s", err.msg);
	rt_tokenizer_free(t);
	t = open_spm_ex(0, "<bos>", NULL, "<start_of_turn>");
	r = rt_chat_render(t, "Be brief.", "Hi", &err);
	ck_assert_msg(r != NULL, "%s", err.msg);
	ck_assert_str_eq(r, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
	free(r);
	/* the guess is said: the note names the file and the format guessed */
	char note[512] = "";
	ck_assert_int_eq(rt_chat_guess_note(t, note, sizeof note), 1);
	ck_assert_msg(strstr(note, "/tmp/test_tokenizer_spm_") &&
	              strstr(note, "has no tokenizer.chat_template: chat uses the gemma turn format"),
	              "%s", note);
	rt_tokenizer_free(t);
	/* a file with a template, or with no family at all, gets no note */
	t = open_spm_ex(0, "<s>", "{{ messages }}", NULL);
	ck_assert_int_eq(rt_chat_guess_note(t, note, sizeof note), 0);
	rt_tokenizer_free(t);
	t = open_spm_ex(0, "<s>", NULL, NULL);
	ck_assert_int_eq(rt_chat_guess_note(t, note, sizeof note), 0);
	rt_tokenizer_free(t);
}
END_TEST

/* SmolLM2's own template (tokenizer.chat_template of the model file) against the golden
 * renders jinja2 made of it (make_golden.py), and its default system message spelled
 * out (the template's own default, as jinja2 renders it without a system turn). */
START_TEST(test_chat_render)
{
	golden g;
	golden_load(&g);
	ck_assert_int_ge(g.n_chat, 3);
	rt_err err = {{0}};
	for (int i = 0; i < g.n_chat; i++) {
		char *s = rt_chat_render(model_tok, g.chat[i].sys, g.chat[i].user, &err);
		ck_assert_msg(s != NULL, "%s", err.msg);
		ck_assert_str_eq(s, g.chat[i].render);
		free(s);
	}
	char *s = rt_chat_render(model_tok, NULL, "Hi", &err);
	ck_assert_str_eq(s, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
	                    "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
	free(s);
	ck_assert_str_eq(rt_chat_family(model_tok, &err), "chatml");
	golden_free(&g);
}
END_TEST

/* ---- real model ------------------------------------------------------------------- */

static golden *model_golden;

static void model_setup(void)
{
	const char *path = getenv("KVRT_MODEL");
	rt_err err = {{0}};
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	model_tok = rt_tokenizer_init(g, &err);
	ck_assert_msg(model_tok != NULL, "%s", err.msg);
	rt_gguf_close(g);
	model_golden = malloc(sizeof *model_golden);
	golden_load(model_golden);
}

static void model_teardown(void)
{
	rt_tokenizer_free(model_tok);
	golden_free(model_golden);
	free(model_golden);
}

static int sanitized(void)
{
	const char *s = getenv("KVRT_SANITIZED");
	return s && *s && strcmp(s, "0");
}

START_TEST(test_model_selfcheck)
{
	/* hand-picked vectors, also in tests/golden/tokenizer/golden.txt (llama.cpp's ids) */
	static const struct {
		const char *text;
		int32_t ids[20];
		int n;
	} v[] = {
		{"Hello, we can use", {19556, 28, 392, 416, 722}, 5},
		{"The capital of France is", {504, 3575, 282, 4649, 314}, 5},
		{"\n", {198}, 1},
		{"Hello world! 123", {19556, 905, 17, 216, 33, 34, 35}, 7},
		{"  multiple   spaces", {216, 2701, 256, 5600}, 4},
		{"Caf\xc3\xa9 d\xc3\xa9j\xc3\xa0 vu.", {51, 1939, 2756, 32564, 90, 16739, 386, 101, 30}, 9},
		{"You are a helpful AI assistant named SmolLM, trained by Hugging Face",
		 {2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182}, 16},
	};
	ck_assert_int_eq(rt_tokenizer_n_vocab(model_tok), 49152);
	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		int64_t n;
		int32_t *ids = tok(model_tok, v[i].text, strlen(v[i].text), 0, &n);
		assert_ids(v[i].text, ids, n, v[i].ids, v[i].n);
		free(ids);
	}
	ck_assert_int_eq(rt_tokenizer_find(model_tok, "<|endoftext|>"), 0);
	ck_assert_int_eq(rt_tokenizer_find(model_tok, "<|im_start|>"), 1);
	ck_assert_int_eq(rt_tokenizer_find(model_tok, "<|im_end|>"), 2);
	ck_assert_int_eq(rt_tokenizer_find(model_tok, "\xc4\x8a"), 198); /* "Ċ" = "\n" */
}
END_TEST

START_TEST(test_model_goldens)
{
	golden *g = model_golden;
	for (int i = 0; i < g->n; i++) {
		gcase *c = &g->cases[i];
		if (sanitized() && c->len > 4096)
			continue;
		int64_t n;
		int32_t *ids = tok(model_tok, c->text, c->len, c->special, &n);
		assert_ids(c->name, ids, n, c->ids, c->n_ids);
		free(ids);
	}
}
END_TEST

START_TEST(test_model_roundtrip)
{
	golden *g = model_golden;
	int checked = 0;
	for (int i = 0; i < g->n; i++) {
		gcase *c = &g->cases[i];
		size_t len;
		char *back = detok(model_tok, c->ids, c->n_ids, &len);
		if (c->roundtrip) {
			ck_assert_msg(len == c->len && !memcmp(back, c->text, len), "%s: decode(ids) != text",
			              c->name);
			checked++;
		} else {
			/* bytes without a token (0x04 0x06 0x13 0x1d here) are dropped, as llama.cpp does */
			char *kept = malloc(c->len + 1);
			size_t k = 0;
			for (size_t j = 0; j < c->len; j++) {
				unsigned char b = (unsigned char)c->text[j];
				if (b != 0x04 && b != 0x06 && b != 0x13 && b != 0x14 && b != 0x16 && b != 0x1d)
					kept[k++] = c->text[j];
			}
			ck_assert_msg(len == k && !memcmp(back, kept, k), "%s: decode != text minus dropped bytes",
			              c->name);
			ck_assert_uint_lt(k, c->len);
			free(kept);
		}
		free(back);
	}
	ck_assert_int_ge(checked, 30);
}
END_TEST

START_TEST(test_model_random_roundtrip)
{
	roundtrip_random(model_tok, sanitized() ? 100 : 500, 1);
}
END_TEST

START_TEST(test_model_vocab_decode)
{
	uint64_t h = FNV_INIT;
	char buf[512];
	for (int32_t id = 0; id < rt_tokenizer_n_vocab(model_tok); id++) {
		int n = rt_token_to_bytes(model_tok, id, buf, sizeof buf);
		ck_assert(n >= 0 && n <= (int)sizeof buf);
		uint8_t le[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
		h = fnv64(h, le, 4);
		h = fnv64(h, buf, (size_t)n);
	}
	ck_assert_msg(h == model_golden->vocab_fnv, "decoded vocabulary hash %016llx, llama.cpp %016llx",
	              (unsigned long long)h, (unsigned long long)model_golden->vocab_fnv);
}
END_TEST

START_TEST(test_model_eog)
{
	golden *g = model_golden;
	int n = 0;
	for (int32_t id = 0; id < rt_tokenizer_n_vocab(model_tok); id++)
		n += rt_tokenizer_is_eog(model_tok, id);
	ck_assert_int_eq(n, g->n_eog);
	for (int i = 0; i < g->n_eog; i++)
		ck_assert_msg(rt_tokenizer_is_eog(model_tok, g->eog[i]), "id %d should end generation",
		              g->eog[i]);
	/* concretely: <|endoftext|> 0, <|im_end|> 2, <reponame> 4 (llama.cpp's FIM-repo rule) */
	ck_assert_int_eq(g->n_eog, 3);
	ck_assert(rt_tokenizer_is_eog(model_tok, 0) && rt_tokenizer_is_eog(model_tok, 2));
	ck_assert(!rt_tokenizer_is_eog(model_tok, 1));
}
END_TEST

START_TEST(test_model_special_both_ways)
{
	const char *s = "<|im_start|>user\nHi<|im_end|>\n";
	int64_t n1, n0;
	int32_t *a = tok(model_tok, s, strlen(s), 1, &n1);
	int32_t *b = tok(model_tok, s, strlen(s), 0, &n0);
	ck_assert_int_eq(a[0], 1);
	ck_assert_int_eq(a[n1 - 2], 2);
	ck_assert_int_eq(a[n1 - 1], 198);
	for (int64_t i = 0; i < n0; i++)
		ck_assert_msg(b[i] > 16, "plain text produced control token %d", b[i]);
	ck_assert_int_gt(n0, n1);
	/* both decode back to the same text */
	size_t la, lb;
	char *da = detok(model_tok, a, n1, &la), *db = detok(model_tok, b, n0, &lb);
	ck_assert_str_eq(da, s);
	ck_assert_str_eq(db, s);
	free(a);
	free(b);
	free(da);
	free(db);
	/* the rendered chat prompt tokenizes to <|im_start|> ... <|im_start|> ass istant \n
	 * (ids 1 520 9531 198 from llama.cpp) */
	rt_err cerr = {{0}};
	char *p = rt_chat_render(model_tok, NULL, "What is 2+2?", &cerr);
	ck_assert_msg(p != NULL, "%s", cerr.msg);
	int32_t *c = tok(model_tok, p, strlen(p), 1, &n1);
	ck_assert_int_eq(c[0], 1);
	ck_assert_int_eq(c[n1 - 4], 1);
	ck_assert_int_eq(c[n1 - 3], 520);
	ck_assert_int_eq(c[n1 - 2], 9531);
	ck_assert_int_eq(c[n1 - 1], 198);
	ck_assert_int_eq(rt_tokenizer_find(model_tok, "ass"), 520);
	free(c);
	free(p);
}
END_TEST

START_TEST(test_model_invalid_utf8)
{
	rt_err err = {{0}};
	const char s[] = "The capital of Fran\xe7\x61 is";
	ck_assert_int_eq(rt_tokenize(model_tok, s, sizeof s - 1, 0, NULL, 0, &err), -1);
	ck_assert_str_eq(err.msg, "text: invalid UTF-8 at byte 19");
}
END_TEST

/* CPU seconds this process has used: unlike wall time it does not grow when other
 * processes load the machine, so the ratio below compares like with like. */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Large inputs: linear-time BPE and regex on prose, one long word, one long whitespace
 * run and one long punctuation run; each round-trips, and tokenizing n bytes costs at
 * most 30 times the CPU time of n/10 bytes (linear: 10 times, quadratic: 100 times; the
 * 1 ms floor keeps a tiny first measurement from making the bound meaningless). A ratio
 * rather than a time limit, so a loaded or slow machine cannot fail it. */
START_TEST(test_model_long_inputs)
{
	size_t n = sanitized() ? 100000 : 1000000;
	const gcase *gpl = NULL;
	for (int i = 0; i < model_golden->n; i++)
		if (!strcmp(model_golden->cases[i].name, "gpl3_20k"))
			gpl = &model_golden->cases[i];
	ck_assert_ptr_nonnull(gpl);
	char *s = malloc(n + 1);
	for (int kind = 0; kind < 4; kind++) {
		for (size_t i = 0; i < n; i++)
			s[i] = kind == 0 ? gpl->text[i % gpl->len] : kind == 1 ? 'q' : kind == 2 ? ' ' : '!';
		int64_t m;
		double t0 = cpu_now();
		free(tok(model_tok, s, n / 10, 0, &m));
		double t1 = cpu_now();
		int32_t *ids = tok(model_tok, s, n, 0, &m);
		double t2 = cpu_now(), small = t1 - t0 > 1e-3 ? t1 - t0 : 1e-3;
		ck_assert_msg(t2 - t1 < 30.0 * small, "kind %d: %zu bytes took %.3f CPU s, %zu took %.3f",
		              kind, n, t2 - t1, n / 10, t1 - t0);
		ck_assert_int_gt(m, 0);
		ck_assert_int_lt(m, (int64_t)n);
		size_t len;
		char *back = detok(model_tok, ids, m, &len);
		ck_assert(len == n && !memcmp(back, s, n));
		free(back);
		free(ids);
	}
	free(s);
}
END_TEST

/* ---- Gemma 3 (SentencePiece, a real file) --------------------------------------------- */

#define GOLDEN_GEMMA3 "tests/golden/tokenizer/gemma3.txt"

/* Gemma 3 270M's tokenizer (env KVRT_GEMMA, make model-gemma) against llama.cpp's
 * llama-tokenize on the same file (gemma3.txt, written by make_gemma3.py): every golden.txt
 * text's ids exactly, decode(ids) == text where golden.txt says it round-trips, the BOS the
 * file asks for and its end-of-generation tokens. */
START_TEST(test_gemma3_goldens)
{
	rt_err err = {{0}};
	rt_gguf *gf = rt_gguf_open(getenv("KVRT_GEMMA"), &err);
	ck_assert_msg(gf != NULL, "%s", err.msg);
	rt_tokenizer *t = rt_tokenizer_init(gf, &err);
	ck_assert_msg(t != NULL, "%s", err.msg);
	rt_gguf_close(gf);
	golden *g = malloc(sizeof *g);
	golden_load_from(g, GOLDEN_GEMMA3);
	for (int i = 0; i < g->n; i++) {
		gcase *c = &g->cases[i];
		int64_t n;
		int32_t *ids = tok(t, c->text, c->len, c->special, &n);
		assert_ids(c->name, ids, n, c->ids, c->n_ids);
		if (c->roundtrip) {
			size_t len;
			char *back = detok(t, ids, n, &len);
			ck_assert_msg(len == c->len && !memcmp(back, c->text, len), "%s: decode(ids) != text", c->name);
			free(back);
		}
		free(ids);
	}
	ck_assert_int_eq(rt_tokenizer_bos(t), 2); /* <bos>; the file sets add_bos_token */
	ck_assert(rt_tokenizer_is_eog(t, 1));     /* <eos> */
	ck_assert(rt_tokenizer_is_eog(t, rt_tokenizer_find(t, "<end_of_turn>")));
	ck_assert_str_eq(rt_chat_family(t, &err), "gemma"); /* no template in the file: by its turn tokens */
	golden_free(g);
	free(g);
	rt_tokenizer_free(t);
}
END_TEST

static Suite *tokenizer_suite(void)
{
	Suite *s = suite_create("tokenizer");
	TCase *tc = tcase_create("synthetic");
	tcase_add_test(tc, test_bpe_merge_order);
	tcase_add_test(tc, test_pretokenizer_pieces);
	tcase_add_test(tc, test_special_partition);
	tcase_add_test(tc, test_eog_text_forces_control);
	tcase_add_test(tc, test_decode_and_buffers);
	tcase_add_test(tc, test_invalid_utf8);
	tcase_add_test(tc, test_random_bytes_and_roundtrip);
	tcase_add_test(tc, test_init_errors);
	tcase_add_test(tc, test_spm_merges);
	tcase_add_test(tc, test_chat_families);
	tcase_add_test(tc, test_chat_refused_and_fallback);
	suite_add_tcase(s, tc);

	const char *model = getenv("KVRT_MODEL");
	if (model && *model) {
		TCase *tm = tcase_create("model");
		tcase_set_timeout(tm, 300);
		tcase_add_unchecked_fixture(tm, model_setup, model_teardown);
		tcase_add_test(tm, test_model_selfcheck);
		tcase_add_test(tm, test_chat_render);
		tcase_add_test(tm, test_model_goldens);
		tcase_add_test(tm, test_model_roundtrip);
		tcase_add_test(tm, test_model_random_roundtrip);
		tcase_add_test(tm, test_model_vocab_decode);
		tcase_add_test(tm, test_model_eog);
		tcase_add_test(tm, test_model_special_both_ways);
		tcase_add_test(tm, test_model_invalid_utf8);
		tcase_add_test(tm, test_model_long_inputs);
		suite_add_tcase(s, tm);
	} else {
		fprintf(stderr, "test_tokenizer: KVRT_MODEL not set, real-model cases skipped\n");
	}
	const char *gemma = getenv("KVRT_GEMMA");
	if (gemma && *gemma && access(gemma, R_OK) == 0) {
		TCase *tg = tcase_create("gemma3");
		tcase_set_timeout(tg, 300);
		tcase_add_test(tg, test_gemma3_goldens);
		suite_add_tcase(s, tg);
	} else {
		fprintf(stderr, "test_tokenizer: KVRT_GEMMA unset or unreadable (make model-gemma), Gemma 3 cases skipped\n");
	}
	return s;
}

int main(void)
{
	int failed = check_run(tokenizer_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
