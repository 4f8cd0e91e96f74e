/*
 * fuzz_tokenizer: libFuzzer target for the byte-level BPE tokenizer
 * (runtime/model/rt_tokenizer.c). The first input byte chooses the mode:
 *
 *   bit 0  parse_special (control tokens in the text map to their ids)
 *   bit 1  the vocabulary comes from the input itself: the bytes up to the first NUL are
 *          lines, "M a b" a merge, "C tok" a control token, "U tok" a user-defined token,
 *          anything else a normal token; a GGUF holding them is built in memory
 *          (tests/support/gguf_writer.c) and loaded, which fuzzes rt_tokenizer_init on
 *          hostile vocabularies. The text is what follows the NUL. Bits 2-3 choose
 *          the model: 0 byte-level BPE with the smollm pre-tokenizer, 1 llama-bpe,
 *          2 qwen2, 3 SentencePiece ("llama"; each token's score minus its line number,
 *          so earlier lines merge first; "<0xNN>" lines are byte tokens).
 *          Otherwise the vocabulary is fixed: the real model's when KVRT_MODEL or
 *          models/SmolLM2-135M-Instruct.Q4_1.gguf is readable, else the tiny byte-level
 *          one of tests/support/tiny_model.c (the choice is printed at start-up).
 *
 * The rest is the text. Asserted for every input: rt_tokenize fails exactly when the text
 * is not valid UTF-8; the sizing call and the filling call agree; every id is in the
 * vocabulary. With the fixed vocabulary, decoding the ids gives back the text whenever
 * every byte of the text has a byte token (byte-level BPE loses nothing else).
 * Built and run by `make fuzz`; seeds: tests/fuzz/corpus/tokenizer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "model/rt_gguf.h"
#include "model/rt_tokenizer.h"
#include "tiny_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static rt_gguf *g_fixed_gguf;
static rt_tokenizer *g_fixed;
static uint8_t g_byte_ok[256]; /* byte b has a token that decodes to exactly b */

/* GPT-2 bytes_to_unicode() symbol of byte b as UTF-8 (NUL-terminated). */
static void byte_symbol(int b, char out[4])
{
	int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
	unsigned cp = (unsigned)b;
	if (!keep) {
		int n = 0;
		for (int c = 0; c < b; c++)
			n += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255));
		cp = 256u + (unsigned)n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp, out[1] = 0;
	} else {
		out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	const char *path = getenv("KVRT_MODEL");
	if (!path || access(path, R_OK) != 0)
		path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	rt_err err = { "" };
	if (access(path, R_OK) == 0)
		g_fixed_gguf = rt_gguf_open(path, &err);
	if (!g_fixed_gguf) {
		static char tmp[] = "/tmp/fuzz_tokenizer_XXXXXX";
		int fd = mkstemp(tmp);
		tiny_model_cfg cfg = { .n_layer = 1, .n_embd = 8, .n_head = 2, .n_head_kv = 1,
		                       .n_ff = 16, .n_vocab = 300, .n_ctx = 64, .rope_base = 10000,
		                       .seed = 1, .wtype = 0 };
		if (fd < 0 || tiny_model_write(&cfg, tmp) != 0)
			abort();
		close(fd);
		g_fixed_gguf = rt_gguf_open(tmp, &err);
		unlink(tmp);
		path = "the tiny byte-level vocabulary";
	}
	if (!g_fixed_gguf || !(g_fixed = rt_tokenizer_init(g_fixed_gguf, &err))) {
		fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
		abort();
	}
	for (int b = 0; b < 256; b++) {
		char sym[4], dec[8];
		byte_symbol(b, sym);
		int32_t id = rt_tokenizer_find(g_fixed, sym);
		g_byte_ok[b] = id >= 0 && rt_token_to_bytes(g_fixed, id, dec, sizeof dec) == 1 &&
		               (uint8_t)dec[0] == b;
	}
	fprintf(stderr, "fuzz_tokenizer: fixed vocabulary from %s (%d tokens)\n", path,
	        rt_tokenizer_n_vocab(g_fixed));
	return 0;
}

/* A tokenizer from the vocabulary description v[0..n) (see the header) for model kind
 * (bits 2-3 of the mode byte), or NULL. */
static rt_tokenizer *vocab_from_input(const char *v, size_t n, int kind)
{
	char **tok = calloc(n + 2, sizeof *tok), **mer = calloc(n + 1, sizeof *mer);
	int32_t *type = calloc(n + 2, sizeof *type);
	uint64_t nt = 0, nm = 0;
	for (size_t i = 0; i <= n;) {
		size_t e = i;
		while (e < n && v[e] != '\n')
			e++;
		const char *l = v + i;
		size_t ll = e - i;
		char **dst;
		if (ll >= 2 && (l[0] == 'M' || l[0] == 'C' || l[0] == 'U') && l[1] == ' ') {
			dst = l[0] == 'M' ? &mer[nm++] : &tok[nt];
			if (l[0] != 'M')
				type[nt++] = l[0] == 'C' ? 3 : 4;
			l += 2, ll -= 2;
		} else {
			dst = &tok[nt];
			type[nt++] = 1;
		}
		*dst = strndup(l, ll);
		i = e + 1;
	}
	static const char *const pre[] = { "smollm", "llama-bpe", "qwen2" };
	int32_t *score = calloc(nt + 1, sizeof *score);
	for (uint64_t i = 0; i < nt; i++) {
		score[i] = -(int32_t)i;
		if (kind == 3 && strlen(tok[i]) == 6 && !strncmp(tok[i], "<0x", 3) && tok[i][5] == '>')
			type[i] = 6;
	}
	gw *w = gw_init();
	gw_kv_str(w, "general.architecture", "llama");
	gw_kv_str(w, "tokenizer.ggml.model", kind == 3 ? "llama" : "gpt2");
	if (kind != 3)
		gw_kv_str(w, "tokenizer.ggml.pre", pre[kind]);
	gw_kv_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)tok, nt);
	gw_kv_i32_arr(w, "tokenizer.ggml.token_type", type, nt);
	if (kind == 3)
		gw_kv_i32_arr(w, "tokenizer.ggml.scores", score, nt);
	else
		gw_kv_str_arr(w, "tokenizer.ggml.merges", (const char *const *)mer, nm);
	free(score);
	gw_kv_u32(w, "tokenizer.ggml.eos_token_id", 0);
	uint8_t *buf = NULL;
	size_t len = 0;
	gw_serialize(w, &buf, &len);
	gw_free(w);
	for (uint64_t i = 0; i < nt; i++)
		free(tok[i]);
	for (uint64_t i = 0; i < nm; i++)
		free(mer[i]);
	free(tok), free(mer), free(type);
	rt_err err = { "" };
	rt_gguf *g = rt_gguf_open_mem("vocab.gguf", buf, len, &err);
	rt_tokenizer *t = g ? rt_tokenizer_init(g, &err) : NULL;
	/* the tokenizer copies what it needs: close the file before using it */
	rt_gguf_close(g);
	free(buf);
	return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int special = data[0] & 1, own = data[0] & 2;
	const char *text = (const char *)data + 1;
	size_t len = size - 1;
	rt_tokenizer *t = g_fixed;
	if (own) {
		const char *nul = memchr(text, 0, len);
		size_t vn = nul ? (size_t)(nul - text) : len;
		t = vocab_from_input(text, vn, (data[0] >> 2) & 3);
		if (!t)
			return 0;
		text += nul ? vn + 1 : vn;
		len -= nul ? vn + 1 : vn;
	}
	rt_err err = { "" };
	int64_t n = rt_tokenize(t, text, len, special, NULL, 0, &err);
	if ((n < 0) != !rt_utf8_valid(text, len, NULL)) {
		fprintf(stderr, "tokenize returned %lld (%s) for a text rt_utf8_valid calls %s\n",
		        (long long)n, err.msg, n < 0 ? "valid" : "invalid");
		abort();
	}
	if (n >= 0) {
		int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
		if (rt_tokenize(t, text, len, special, ids, n, &err) != n)
			abort();
		int32_t nv = rt_tokenizer_n_vocab(t);
		int all_bytes = !own;
		for (size_t i = 0; i < len && all_bytes; i++)
			all_bytes = g_byte_ok[(uint8_t)text[i]];
		char *dec = all_bytes ? malloc(len + 1) : NULL;
		size_t w = 0;
		for (int64_t i = 0; i < n; i++) {
			if (ids[i] < 0 || ids[i] >= nv)
				abort();
			if (dec) {
				int k = rt_token_to_bytes(t, ids[i], NULL, 0);
				if (k < 0 || w + (size_t)k > len) {
					fprintf(stderr, "decoding gives more bytes than the text\n");
					abort();
				}
				rt_token_to_bytes(t, ids[i], dec + w, k);
				w += (size_t)k;
			}
		}
		if (dec && (w != len || memcmp(dec, text, len) != 0)) {
			fprintf(stderr, "decode(encode(text)) != text (%zu vs %zu bytes)\n", w, len);
			abort();
		}
		free(dec);
		free(ids);
	}
	if (own)
		rt_tokenizer_free(t);
	return 0;
}
