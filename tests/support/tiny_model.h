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
} tiny_model_cfg;

/* Write the model to path. Returns 0 or -1. */
int tiny_model_write(const tiny_model_cfg *cfg, const char *path);

#endif
