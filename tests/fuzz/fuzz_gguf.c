/*
 * fuzz_gguf: libFuzzer target for the GGUF reader (runtime/model/rt_gguf.c) and what reads
 * a model out of it: the tokenizer's vocabulary loader (rt_tokenizer_init) and the llama
 * loader (rt_model_load_gguf). Any byte string is a file: rt_gguf_open_mem must either
 * refuse it with one "fuzz.gguf: reason" line or hand out metadata and tensors that lie
 * inside the buffer. Every accessor is then walked and every tensor's first and last byte
 * read, so AddressSanitizer sees any pointer the reader let out of bounds (libFuzzer's
 * buffer is exactly `size` bytes). A vocabulary that loads tokenizes a fixed text and
 * decodes every id; a model that loads runs one forward step of two tokens.
 * Built and run by `make fuzz`; seeds: tests/fuzz/corpus/gguf and the tiny models that
 * tests/fuzz/gen_seeds.c writes with tests/support/tiny_model.c.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/rt_kv.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

/* Touch every byte range the reader exposes. */
static void walk(const rt_gguf *g, const uint8_t *data, size_t size)
{
	for (uint64_t i = 0; i < rt_gguf_n_kv(g); i++) {
		const rt_gguf_kv *kv = rt_gguf_kv_at(g, i);
		if (!kv || kv->key.len == 0)
			abort();
		sink ^= (uint8_t)(kv->key.s[0] ^ kv->key.s[kv->key.len - 1]);
		if (kv->type == RT_GGUF_STRING && kv->v.str.len)
			sink ^= (uint8_t)kv->v.str.s[kv->v.str.len - 1];
		if (kv->type == RT_GGUF_ARRAY) {
			for (uint64_t j = 0; j < kv->arr_n && kv->arr_type == RT_GGUF_STRING; j++) {
				rt_gguf_str s = rt_gguf_arr_str(kv, j);
				if (s.len)
					sink ^= (uint8_t)(s.s[0] ^ s.s[s.len - 1]);
			}
			if (kv->arr_n && kv->arr_type != RT_GGUF_STRING)
				sink ^= *(const uint8_t *)kv->arr_data;
		}
		/* find_kv must find every key that has no NUL (keys with one are refused) */
		char key[256];
		if (kv->key.len < sizeof key) {
			memcpy(key, kv->key.s, kv->key.len);
			key[kv->key.len] = 0;
			if (rt_gguf_find_kv(g, key) != kv)
				abort();
		}
	}
	for (uint64_t i = 0; i < rt_gguf_n_tensors(g); i++) {
		const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
		const uint8_t *p = t->data;
		if (rt_gguf_find_tensor(g, t->name) != t)
			abort();
		if (t->nbytes) {
			if (p < data || p + t->nbytes > data + size)
				abort();
			sink ^= (uint8_t)(p[0] ^ p[t->nbytes - 1]);
		}
	}
}

static void try_tokenizer(const rt_gguf *g)
{
	rt_err err = { "" };
	rt_tokenizer *t = rt_tokenizer_init(g, &err);
	if (!t)
		return;
	static const char text[] = "Hello, world! 12345 <|im_start|>user\n\xc3\xa9t\xc3\xa9 \xe2\x82\xac";
	int64_t n = rt_tokenize(t, text, sizeof text - 1, 1, NULL, 0, &err);
	if (n < 0)
		abort(); /* valid UTF-8 is always tokenizable */
	int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
	if (rt_tokenize(t, text, sizeof text - 1, 1, ids, n, &err) != n)
		abort();
	for (int64_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= rt_tokenizer_n_vocab(t))
			abort();
	free(ids);
	char buf[64];
	int32_t nv = rt_tokenizer_n_vocab(t);
	for (int32_t id = 0; id < nv && id < 4096; id++)
		if (rt_token_to_bytes(t, id, buf, sizeof buf) < 0)
			abort();
	rt_tokenizer_free(t);
}

static void try_model(const rt_gguf *g)
{
	rt_err err = { "" };
	rt_model *m = rt_model_load_gguf(g, &err);
	if (!m)
		return;
	rt_fwd f;
	rt_kv kv;
	memset(&f, 0, sizeof f);
	memset(&kv, 0, sizeof kv);
	int32_t tok[2] = { 0, m->hp.n_vocab - 1 };
	int n = m->hp.n_ctx >= 2 ? 2 : 1;
	float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
	if (logits && (uint64_t)m->hp.n_embd * (uint64_t)m->hp.n_vocab < (1u << 22) &&
	    rt_fwd_init(&f, m, 2, 4, &err) == 0 && rt_model_kv_init(m, &kv, 4, &err) == 0 &&
	    rt_model_forward(&f, &kv, tok, n, 0, logits, RT_LOGITS_LAST, &err) != 0) {
		fprintf(stderr, "forward of a loaded model failed: %s\n", err.msg);
		abort();
	}
	free(logits);
	rt_kv_free(&kv);
	rt_fwd_free(&f);
	rt_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	rt_err err = { "" };
	rt_gguf *g = rt_gguf_open_mem("fuzz.gguf", data, size, &err);
	if (!g) {
		if (strncmp(err.msg, "fuzz.gguf: ", 11) != 0 || strchr(err.msg, '\n')) {
			fprintf(stderr, "error not of the form 'fuzz.gguf: reason': %s\n", err.msg);
			abort();
		}
		return 0;
	}
	walk(g, data, size);
	try_tokenizer(g);
	try_model(g);
	rt_gguf_close(g);
	return 0;
}
