/*
 * tiny_model: writes tiny synthetic GGUF `llama` models for the test suites; see
 * tiny_model.h. Weights are uniform random from a fixed-seed xorshift generator, scaled
 * so activations stay O(1) through the layers and logits O(10) like a real model's
 * (matrices ±1/sqrt(in), norms 1 ± 0.2, embeddings ±3/sqrt(n_embd)). 2-D weights
 * (token_embd included) use cfg->wtype; norms are F32, as in llama.cpp's quantised files.
 * The vocabulary is a minimal byte-level GPT-2 one (ids 0..2 "<|endoftext|>",
 * "<|im_start|>", "<|im_end|>" as control tokens, then the 256 byte symbols, then merges
 * of common pairs, then control fillers) so tokenizer-using tools can run on tiny models
 * too; the model loader itself does not need it.
 */
#include "tiny_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "model/rt_quant.h"

typedef struct rng {
	uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
	r->s ^= r->s << 13;
	r->s ^= r->s >> 7;
	r->s ^= r->s << 17;
	return r->s;
}

/* uniform in [-a, a) */
static float rng_unif(rng *r, float a)
{
	return a * (float)((double)(rng_next(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Add a 2-D tensor [rows × cols] (ne = {cols, rows}) of random values in ±a, encoded as
 * type (F32, Q4_1 or Q8_0). Returns -1 for an unsupported type. */
static int add_matrix(gw *w, const char *name, uint32_t type, int64_t cols, int64_t rows,
                      rng *r, float a)
{
	size_t n = (size_t)(cols * rows);
	float *v = malloc(n * sizeof *v);
	if (!v)
		return -1;
	for (size_t i = 0; i < n; i++)
		v[i] = rng_unif(r, a);
	int64_t ne[2] = { cols, rows };
	int rc = 0;
	if (type == RT_GGML_F32) {
		gw_tensor_f32(w, name, 2, ne, v);
	} else if (type == RT_GGML_Q4_1 || type == RT_GGML_Q8_0) {
		size_t nb = rt_quant_row_bytes(type, cols) * (size_t)rows;
		void *q = nb ? malloc(nb) : NULL;
		if (!q) {
			rc = -1;
		} else {
			if (type == RT_GGML_Q4_1)
				gw_quantize_q4_1(v, q, (int64_t)n);
			else
				gw_quantize_q8_0(v, q, (int64_t)n);
			gw_tensor(w, name, type, 2, ne, q, nb);
			free(q);
		}
	} else {
		rc = -1;
	}
	free(v);
	return rc;
}

static void add_norm(gw *w, const char *name, int64_t n, rng *r)
{
	float *v = malloc((size_t)n * sizeof *v);
	if (!v)
		abort();
	for (int64_t i = 0; i < n; i++)
		v[i] = 1.0f + rng_unif(r, 0.2f);
	gw_tensor_f32(w, name, 1, &n, v);
	free(v);
}

/* UTF-8 of the GPT-2 bytes_to_unicode symbol for byte b. */
static void byte_symbol(int b, char out[4])
{
	unsigned cp;
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
		cp = (unsigned)b;
	} else {
		/* the n-th byte outside those ranges maps to 256 + n */
		int n = 0;
		for (int c = 0; c < b; c++)
			if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)))
				n++;
		cp = 256u + (unsigned)n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp, out[1] = 0;
	} else {
		out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
	}
}

static void add_vocab(gw *w, int n_vocab)
{
	static const char *const pairs[][2] = {
		{ "t", "h" }, { "h", "e" }, { "i", "n" }, { "e", "r" }, { "a", "n" },
		{ "\xC4\xA0", "t" }, { "\xC4\xA0", "a" }, { "o", "n" }, { "r", "e" },
		{ "\xC4\xA0t", "he" }, { "e", "n" }, { "a", "t" }, { "o", "r" }, { "s", "t" },
	};
	const int n_pairs = (int)(sizeof pairs / sizeof pairs[0]);
	char **tok = calloc((size_t)n_vocab, sizeof *tok);
	int32_t *type = calloc((size_t)n_vocab, sizeof *type);
	char **merges = calloc((size_t)n_pairs, sizeof *merges);
	if (!tok || !type || !merges)
		abort();
	const char *specials[3] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" };
	int id = 0, n_merges = 0;
	for (; id < 3 && id < n_vocab; id++)
		tok[id] = strdup(specials[id]), type[id] = 3;
	for (int b = 0; b < 256 && id < n_vocab; b++, id++) {
		char s[4];
		byte_symbol(b, s);
		tok[id] = strdup(s), type[id] = 1;
	}
	for (int p = 0; p < n_pairs && id < n_vocab; p++, id++) {
		size_t la = strlen(pairs[p][0]), lb = strlen(pairs[p][1]);
		tok[id] = malloc(la + lb + 1);
		merges[n_merges] = malloc(la + lb + 2);
		if (!tok[id] || !merges[n_merges])
			abort();
		memcpy(tok[id], pairs[p][0], la);
		memcpy(tok[id] + la, pairs[p][1], lb + 1);
		snprintf(merges[n_merges], la + lb + 2, "%s %s", pairs[p][0], pairs[p][1]);
		n_merges++;
		type[id] = 1;
	}
	for (; id < n_vocab; id++) {
		char s[32];
		snprintf(s, sizeof s, "<|extra_%d|>", id);
		tok[id] = strdup(s), type[id] = 3;
	}
	gw_kv_str(w, "tokenizer.ggml.model", "gpt2");
	gw_kv_str(w, "tokenizer.ggml.pre", "smollm");
	gw_kv_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n_vocab);
	gw_kv_i32_arr(w, "tokenizer.ggml.token_type", type, (uint64_t)n_vocab);
	gw_kv_str_arr(w, "tokenizer.ggml.merges", (const char *const *)merges, (uint64_t)n_merges);
	gw_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
	gw_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
	gw_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
	for (int i = 0; i < n_vocab; i++)
		free(tok[i]);
	for (int i = 0; i < n_merges; i++)
		free(merges[i]);
	free(tok);
	free(type);
	free(merges);
}

int tiny_model_write(const tiny_model_cfg *c, const char *path)
{
	if (c->n_layer < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->n_head % c->n_head_kv ||
	    c->n_embd % c->n_head || c->n_ff < 1 || c->n_vocab < 3 || c->n_ctx < 1)
		return -1;
	gw *w = gw_init();
	rng r = { 0x9E3779B97F4A7C15ull ^ ((uint64_t)c->seed * 0xD1B54A32D192ED03ull) };
	if (r.s == 0)
		r.s = 1;
	const int64_t E = c->n_embd, F = c->n_ff, hd = E / c->n_head;
	const int64_t kd = hd * c->n_head_kv;
	gw_kv_str(w, "general.architecture", "llama");
	gw_kv_str(w, "general.name", "tiny-test-llama");
	gw_kv_u32(w, "general.file_type", c->wtype == RT_GGML_F32 ? 0 : c->wtype == RT_GGML_Q4_1 ? 3 : 7);
	gw_kv_u32(w, "llama.block_count", (uint32_t)c->n_layer);
	gw_kv_u32(w, "llama.context_length", (uint32_t)c->n_ctx);
	gw_kv_u32(w, "llama.embedding_length", (uint32_t)E);
	gw_kv_u32(w, "llama.feed_forward_length", (uint32_t)F);
	gw_kv_u32(w, "llama.attention.head_count", (uint32_t)c->n_head);
	gw_kv_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_head_kv);
	gw_kv_u32(w, "llama.rope.dimension_count", (uint32_t)hd);
	gw_kv_f32(w, "llama.rope.freq_base", c->rope_base);
	if (c->n_swa > 0)
		gw_kv_u32(w, "llama.attention.sliding_window", (uint32_t)c->n_swa);
	gw_kv_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
	gw_kv_u32(w, "llama.vocab_size", (uint32_t)c->n_vocab);
	add_vocab(w, c->n_vocab);
	int rc = 0;
	rc |= add_matrix(w, "token_embd.weight", c->wtype, E, c->n_vocab, &r, 3.0f / sqrtf((float)E));
	add_norm(w, "output_norm.weight", E, &r);
	for (int l = 0; l < c->n_layer && rc == 0; l++) {
		char nm[64];
		float ae = 1.0f / sqrtf((float)E), af = 1.0f / sqrtf((float)F);
		snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
		add_norm(w, nm, E, &r);
		snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", l);
		rc |= add_matrix(w, nm, c->wtype, E, E, &r, 2.0f * ae);
		snprintf(nm, sizeof nm, "blk.%d.attn_k.weight", l);
		rc |= add_matrix(w, nm, c->wtype, E, kd, &r, 2.0f * ae);
		snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
		rc |= add_matrix(w, nm, c->wtype, E, kd, &r, ae);
		snprintf(nm, sizeof nm, "blk.%d.attn_output.weight", l);
		rc |= add_matrix(w, nm, c->wtype, E, E, &r, ae);
		snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
		add_norm(w, nm, E, &r);
		snprintf(nm, sizeof nm, "blk.%d.ffn_gate.weight", l);
		rc |= add_matrix(w, nm, c->wtype, E, F, &r, ae);
		snprintf(nm, sizeof nm, "blk.%d.ffn_up.weight", l);
		rc |= add_matrix(w, nm, c->wtype, E, F, &r, ae);
		snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", l);
		rc |= add_matrix(w, nm, c->wtype, F, E, &r, af);
	}
	if (rc == 0)
		rc = gw_write(w, path);
	gw_free(w);
	return rc ? -1 : 0;
}

tiny_model_cfg tiny_model_gqa_cfg(int gqa, int n_layer, int head_dim, uint32_t seed)
{
	tiny_model_cfg c = { .n_layer = n_layer, .n_ff = 96, .n_vocab = 300, .n_ctx = 128,
		             .rope_base = 10000.0f, .seed = seed, .wtype = RT_GGML_F32 };
	if (gqa == 0)
		c.n_head = 9, c.n_head_kv = 3;
	else
		c.n_head = 4, c.n_head_kv = 1;
	c.n_embd = c.n_head * head_dim;
	return c;
}

struct rt_model *tiny_model_open(const tiny_model_cfg *c, const struct rt_model_opts *o,
                                 struct rt_err *err)
{
	static _Atomic unsigned serial; /* one file per call, even within a process */
	char path[128];
	mkdir("tests/tmp", 0755);
	snprintf(path, sizeof path, "tests/tmp/tiny_gqa_%d_%u.gguf", (int)getpid(), serial++);
	if (tiny_model_write(c, path) != 0) {
		rt_err_set(err, "%s: cannot write the tiny model", path);
		return NULL;
	}
	struct rt_model *m = rt_model_open(path, o, err);
	unlink(path);
	return m;
}

struct rt_model *tiny_model_open_gqa(int gqa, uint32_t seed, const struct rt_model_opts *o,
                                     struct rt_err *err)
{
	const tiny_model_cfg c = tiny_model_gqa_cfg(gqa, 2, 32, seed);
	return tiny_model_open(&c, o, err);
}
