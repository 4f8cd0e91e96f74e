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

/*
 * Tiered heads (runtime/kv/rt_kv.h, rt_kv_init_tiered): the decode step's attention reads
 * every entry's rows in place from the tier arenas, slot by slot, instead of decoding the
 * head to f32 first, so it reads each entry's stored bytes once (a 4-bit entry's 32 + 40
 * bytes at head_dim 64 against f16's 256). A top-tier row is decoded into a buffer in L1
 * (f16). A quantised key is never dequantised: its key group's per-channel range is
 * folded into the query once per run of slots of the same group (scale · q·k = base +
 * Σ_c qs_c · code_c with base = scale · Σ_c q_c lo_c, qs_c = scale · q_c · step_c), and
 * the codes, unpacked to floats, are dotted against qs (the scalar reference); the vector
 * versions round qs to 16-bit integers per query row and key group (D = max |qs_c| / 32767)
 * and dot them with the codes widened to 16 bits by integer multiply-adds (25 instructions
 * per 32 channels and three query heads against the float dot's 43), which moves a
 * quantised key's score by at most
 * (1/2 + 2^-10) · d · (2^b − 1) · D, i.e. d / 65534 of the largest channel term (bounded in
 * tests/test_kvtattn.c). A quantised value row is
 * added as Σ (p · scale) · code per group of 32 channels plus p · minimum once (the scalar
 * reference dequantises the row into the L1 buffer instead). The AVX2 version takes eight
 * entries of a key group at a time and reduces their dots together (8 f32 or 8 32-bit
 * integer partial sums, each lane converted to f32 before the horizontal sum), and keeps a 32-channel
 * slice of the output of three query heads in registers over all entries; the AVX-512
 * level runs it too (a row's codes are 16 to 64 bytes: the loop over entries, not the
 * vector width, bounds it). Rotated tiers (rt_kv_set_rotation): the quantised keys are
 * dotted with H·q, and the quantised values' share of the output is summed apart and
 * rotated back once (H Σ p·(H v) = Σ p·v). Otherwise the versions differ only in the order
 * of f32 additions and in fused multiply-adds (tests/test_kvtattn.c bounds each against
 * attention over rt_kv_head_decode's rows).
 * Shapes: q, P and out hold G rows (ldq, ldP, ldo apart) of head_dim floats (P: entries);
 * S and P are indexed by entry (S[g·ldS + i], i < lim), entries >= lim are neither read
 * nor written (a chunk's row r sees the first lim). isa as for rt_kvattn_get. Reads
 * only: several threads may read one head. Asserts a tiered store, head_dim <= 1024 and
 * 0 <= lim <= h->n.
 */
/* S[g·ldS + i] = scale · q_g · k_i for g < G, i < lim (k_i as rt_kv_key decodes it). */
void rt_kvattn_tier_scores(const rt_kv *kv, const rt_kv_head *h, int32_t lim, const float *q,
                           size_t ldq, int G, float scale, float *S, size_t ldS, int isa);
/* out[g·ldo + j] = Σ_{i < lim} P[g·ldP + i] · v_i[j] for g < G (out overwritten). */
void rt_kvattn_tier_mix(const rt_kv *kv, const rt_kv_head *h, int32_t lim, const float *P,
                        size_t ldP, int G, float *out, size_t ldo, int isa);

#endif
