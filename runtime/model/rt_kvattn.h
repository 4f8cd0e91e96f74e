/*
 * rt_kvattn: the attention loop's reads of KV rows stored in a narrow element type (f16,
 * ggml Q8_0; layouts in runtime/kv/rt_kvq.h), without f32 copies of the rows: scores of
 * query rows against stored keys, the probability-weighted sum of stored values, and the
 * decode of a run of rows to f32 (the prefill path decodes a head once per chunk and
 * multiplies with sgemm). Keys are decoded on the fly and dotted against the f32 query
 * (ggml's flash-attention CPU path instead rounds the query to the key's type; keeping the
 * query in f32 is the more accurate of the two and costs the same memory traffic).
 *
 * Every function exists as portable scalar C (the reference) and in AVX2 (+FMA, F16C) and
 * AVX-512 versions, chosen at run time (rt_dot_isa_best, so KVRT_ISA lowers it too). The
 * decoded values are exact in every version (an f16 is exactly an f32; a Q8_0 value is
 * scale × code, an 11-bit by 8-bit product, exact in f32); the versions differ only in the
 * order of f32 additions.
 */
#ifndef RT_KVATTN_H
#define RT_KVATTN_H

#include <stddef.h>
#include <stdint.h>

#include "kv/rt_kv.h"

/* The kernels of one ISA level for one element type. Shapes: rows are n stored rows of
 * rt_kv_row_bytes(type, d) bytes each, d values per row. */
typedef struct rt_kvattn_kernels {
	/* out[n × d] = the decoded rows */
	void (*decode)(const uint8_t *rows, int32_t n, int d, float *out);
	/* S[g·ldS + i] = scale · Σ_j q[g·ldq + j] · row_i[j], for g < G, i < n */
	void (*scores)(const uint8_t *rows, int32_t n, int d, const float *q, size_t ldq, int G,
	               float scale, float *S, size_t ldS);
	/* out[g·ldo + j] = Σ_i P[g·ldP + i] · row_i[j], for g < G, j < d (out overwritten) */
	void (*mix)(const uint8_t *rows, int32_t n, int d, const float *P, size_t ldP, int G,
	            float *out, size_t ldo);
} rt_kvattn_kernels;

/* The kernels for a narrow type (RT_KV_F16 or RT_KV_Q8_0) at ISA level isa (enum
 * rt_dot_isa, clamped to rt_dot_isa_best()); NULL for RT_KV_F32 or another value. Static
 * table: the pointer stays valid for the process. Q8_0 kernels need d % 32 == 0. */
const rt_kvattn_kernels *rt_kvattn_get(enum rt_kv_type type, int isa);

#endif
