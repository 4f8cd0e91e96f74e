/*
 * tiny_model: writes tiny synthetic GGUF `llama` models for tests (random weights from a
 * fixed seed, a byte-level vocabulary), so attention, KV-store and forward tests need no
 * download. Shapes are chosen by the caller, including grouped-query ones (9 query / 3 KV
 * heads, 4/1, 4/4).
 */
#ifndef TINY_MODEL_H
#define TINY_MODEL_H

#include <stdint.h>

typedef struct tiny_model_cfg {
	int n_layer;      /* e.g. 2 */
	int n_embd;       /* hidden size, e.g. 64 (must be n_head * head_dim) */
	int n_head;       /* query heads, e.g. 9 */
	int n_head_kv;    /* KV heads, e.g. 3 */
	int n_ff;         /* SwiGLU hidden size, e.g. 96 */
	int n_vocab;      /* e.g. 300 (>= 256 + specials) */
	int n_ctx;        /* context length written into the file */
	float rope_base;  /* e.g. 10000 */
	uint32_t seed;
	uint32_t wtype;   /* ggml type of 2-D weights: RT_GGML_F32, RT_GGML_Q4_1, RT_GGML_Q8_0 */
	int n_swa;        /* > 0: llama.attention.sliding_window (Mistral style); 0: absent */
} tiny_model_cfg;

/* Write the model to path. Returns 0 or -1. */
int tiny_model_write(const tiny_model_cfg *cfg, const char *path);

/* The grouped-query test shape gqa (0: 9 query / 3 KV heads; 1: 4 / 1) with n_layer layers
 * and head_dim (n_embd = query heads × head_dim; the precision tiers' codes need a multiple
 * of 32), n_ff 96, 300 tokens, 128 positions, f32 weights, from seed. */
tiny_model_cfg tiny_model_gqa_cfg(int gqa, int n_layer, int head_dim, uint32_t seed);

struct rt_model;
struct rt_model_opts;
struct rt_err;
/* The model of c written to a file of its own under tests/tmp, opened with o and the file
 * removed. The model is the caller's (rt_model_free); NULL with err set when the file
 * cannot be written or opened. */
struct rt_model *tiny_model_open(const tiny_model_cfg *c, const struct rt_model_opts *o,
                                 struct rt_err *err);
/* tiny_model_open of tiny_model_gqa_cfg(gqa, 2 layers, head_dim 32, seed): the model is
 * the caller's (rt_model_free); NULL with err set when it cannot be written or opened. */
struct rt_model *tiny_model_open_gqa(int gqa, uint32_t seed, const struct rt_model_opts *o,
                                     struct rt_err *err);

#endif
