/*
 * gguf_writer: a small GGUF v3 writer used only by the test suites to craft synthetic
 * model files (tiny llama models with random weights, fixed seed) and broken files
 * (bad magic, truncations, offsets past the end). Not part of libkvrt.
 *
 * Usage: gw_init, then any number of gw_kv_* and gw_tensor calls, then gw_write.
 * Tensor data is copied; the writer owns its buffers until gw_free.
 */
#ifndef GGUF_WRITER_H
#define GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct gw gw;

gw *gw_init(void);
void gw_free(gw *w);

void gw_kv_u32(gw *w, const char *key, uint32_t v);
void gw_kv_i32(gw *w, const char *key, int32_t v);
void gw_kv_f32(gw *w, const char *key, float v);
void gw_kv_bool(gw *w, const char *key, int v);
void gw_kv_str(gw *w, const char *key, const char *v);
/* String array of n NUL-terminated strings. */
void gw_kv_str_arr(gw *w, const char *key, const char *const *v, uint64_t n);
/* i32 array. */
void gw_kv_i32_arr(gw *w, const char *key, const int32_t *v, uint64_t n);

/* Add a tensor of ggml type `type` with dims ne[0..n_dims) (ne[0] = row length) whose
 * encoded bytes are data[0..nbytes). */
void gw_tensor(gw *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
               const void *data, size_t nbytes);
/* Convenience: add an F32 tensor from f32 values. */
void gw_tensor_f32(gw *w, const char *name, int n_dims, const int64_t *ne, const float *data);

/* Write the file (alignment 32, or the value of a u32 "general.alignment" key added by
 * the caller). Returns 0 or -1 on I/O error. */
int gw_write(const gw *w, const char *path);

/* The bytes gw_write would write, in a malloc'ed buffer the caller frees (*len bytes).
 * For tests that truncate or mutate a valid file. Returns 0. */
int gw_serialize(const gw *w, uint8_t **out, size_t *len);

/* f32 -> IEEE binary16 bits with round-to-nearest-even (ggml_compute_fp32_to_fp16). */
uint16_t gw_f32_to_f16(float f);

/* Encode n f32 values (n a multiple of 32) as Q4_1 / Q8_0 blocks into dst (sized with
 * rt_quant_row_bytes), using the reference rounding of ggml-quants.c. For tests that want
 * quantised synthetic weights. */
void gw_quantize_q4_1(const float *src, void *dst, int64_t n);
void gw_quantize_q8_0(const float *src, void *dst, int64_t n);

#endif
