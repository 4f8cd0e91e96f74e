/*
 * rt_kvq: KV-cache quantisation codecs — how a stored key or value is laid out in bytes at
 * each storage tier, and how attention reads it back without materialising f32 rows.
 *
 * Outline
 *   tiers      RT_KVQ_F32, F16, Q8, Q4, Q2 (bits per element; ORDER RT_KVQ_KIND), and
 *              RT_KVQ_Q8_0, ggml's symmetric 8-bit blocks (below)
 *   values     quantised per token: each row of head_dim values is cut into groups of
 *              RT_KVQ_VGROUP channels, each group asymmetric min/max with an f16 scale and
 *              an f16 minimum (KIVI, Liu et al. 2024, arXiv 2402.02750: values per token)
 *   keys       quantised per channel: a *tile* of RT_KVQ_KTILE consecutive entries holds, for
 *              each of the head_dim channels, an f16 scale, an f16 minimum and RT_KVQ_KTILE codes
 *              (KIVI: key outliers live in channels, so a channel's range is shared across
 *              tokens). A tile is encoded when it is full; until then its entries stay at a
 *              higher tier (KIVI's full-precision residual).
 *              The tiered KV store (runtime/kv/rt_kv.h) keeps a tile's ranges apart from its
 *              codes instead (rt_kvq_kcodes_*, below): a tile's entries could not be evicted
 *              or downgraded one by one, an entry's codes against a shared range can.
 *   reading    rt_kvq_ktile_logits computes q·k for every entry of a key tile from the codes:
 *              q·k_t = sum_c q_c min_c + sum_c (q_c scale_c) code_ct, so one pass over the tile
 *              needs no dequantised keys; rt_kvq_vrow_axpy adds w·v to an f32 accumulator.
 *
 * Why these group sizes: 32 is ggml's block size and short enough that the residual of
 * entries waiting for a full key tile stays small (at most 31 per list); at head_dim 64 and 4 bits a value row takes
 * 2 × (4 + 16) = 40 bytes and a key 64 × (4 + 16) / 32 = 40 bytes per entry, 3.2x smaller than
 * f16's 128 bytes, the scales counted.
 *
 * Q8_0 (ggml's block_q8_0, ggml-common.h; quantize_row_q8_0_ref in ggml-quants.c): a row of
 * d values (d a multiple of RT_KVQ_VGROUP) is cut into blocks of 32, each stored as an f16
 * scale D = f16(amax / 127) followed by 32 int8 codes c = round(x · 127 / amax) (amax = max |x|
 * over the block; an all-zero block has scale 0 and codes 0); it decodes to D · c. Keys and
 * values use the same per-row blocks (a key tile at Q8_0 is RT_KVQ_KTILE rows, as at F16).
 * Error: |x - D·c| <= d/2 + 127·|d - D| <= d·(1/2 + 127·2^-11) with d = amax/127 (rounding
 * to the code, then f16's relative rounding 2^-11 of the scale; below f16's normal range
 * |d - D| <= 2^-25 absolute), i.e. within 0.0044 · amax.
 *
 * Rounding: scale = (max - min) / (2^bits - 1) and min are rounded to f16 first and the codes
 * are computed against the rounded pair, so decode(encode(x)) is within scale/2 of x plus the
 * f16 rounding of min (bounds checked in tests/test_kvq.c). A constant group (max == min) has
 * scale 0 and decodes exactly to its f16-rounded value. Non-finite inputs are not accepted:
 * the caller stores only finite keys and values (the forward pass produces no others).
 */
#ifndef RT_KVQ_H
#define RT_KVQ_H

#include <stddef.h>
#include <stdint.h>

/* ORDER RT_KVQ_KIND: rt_kvq_bits[] and rt_kvq_names[] in rt_kvq.c follow this order. */
typedef enum rt_kvq_kind {
	RT_KVQ_F32 = 0,
	RT_KVQ_F16,
	RT_KVQ_Q8,
	RT_KVQ_Q4,
	RT_KVQ_Q2,
	RT_KVQ_Q8_0,
	RT_KVQ_N_KIND
} rt_kvq_kind;

#define RT_KVQ_VGROUP 32   /* channels per value group (per-token quantisation) */
#define RT_KVQ_KTILE  32   /* entries per key tile (per-channel quantisation) */

/* Bits per element of a tier (32, 16, 8, 4, 2, 8). */
int rt_kvq_bits(rt_kvq_kind kind);
/* "f32", "f16", "q8", "q4", "q2", "q8_0"; rt_kvq_parse returns the kind or -1 for another name. */
const char *rt_kvq_name(rt_kvq_kind kind);
int rt_kvq_parse(const char *name);

/* ---- values: one row of d channels (d a multiple of RT_KVQ_VGROUP for Q8/Q4/Q2/Q8_0) ----- */

/* Bytes of one stored value row of d channels at kind (scales included). */
size_t rt_kvq_vrow_bytes(rt_kvq_kind kind, int d);
/* Encode x[d] into out[rt_kvq_vrow_bytes(kind, d)]. */
void rt_kvq_vrow_encode(rt_kvq_kind kind, const float *x, int d, uint8_t *out);
/* Decode a stored row into x[d]. */
void rt_kvq_vrow_decode(rt_kvq_kind kind, const uint8_t *row, int d, float *x);
/* acc[d] += w * decode(row): the attention output's weighted sum over values, read on the fly. */
void rt_kvq_vrow_axpy(rt_kvq_kind kind, const uint8_t *row, int d, float w, float *acc);

/* ---- keys: one tile of RT_KVQ_KTILE entries × d channels, per-channel groups -------------- */

/* Bytes of one stored key tile (all RT_KVQ_KTILE entries) at kind. For F32/F16 a tile is
 * simply RT_KVQ_KTILE rows; for Q8/Q4/Q2 it is d × (2 f16 + RT_KVQ_KTILE codes). */
size_t rt_kvq_ktile_bytes(rt_kvq_kind kind, int d);
/* Encode k[RT_KVQ_KTILE × d] (row-major, entry t at k + t*d) into out. */
void rt_kvq_ktile_encode(rt_kvq_kind kind, const float *k, int d, uint8_t *out);
/* Decode entry t (0 <= t < RT_KVQ_KTILE) of a tile into x[d]. */
void rt_kvq_ktile_decode(rt_kvq_kind kind, const uint8_t *tile, int d, int t, float *x);
/* logits[t] = scale * (q · k_t) for the first n entries of a tile (n <= RT_KVQ_KTILE), read
 * from the codes without dequantising a row; equals the dot with rt_kvq_ktile_decode's rows
 * up to f32 summation order. */
void rt_kvq_ktile_logits(rt_kvq_kind kind, const uint8_t *tile, int d, int n, const float *q,
                         float scale, float *logits);

/* ---- keys per channel against a shared range: one entry's codes, the range elsewhere ---- */
/*
 * The tiered store (runtime/kv/rt_kv.h) codes a quantised key as d codes only; the range of
 * each channel is shared by the entries of a key group (KIVI's per-channel keys, arXiv
 * 2402.02750, with the range kept apart from the codes so that each entry's codes stay its
 * own). A range is range[0..d) the channels' minima and range[d..2d) their maxima, as f16.
 * At b bits (kind Q8, Q4 or Q2) channel c has the step s_c = (max_c − min_c) / (2^b − 1)
 * (f32, from the f16 pair), code round((x_c − min_c) / s_c) clamped to [0, 2^b − 1] (0 when
 * s_c = 0), and decodes to min_c + s_c · code: a value inside the range is within s_c / 2 of
 * its decode (plus the f16 rounding of the pair), a value outside it is clamped.
 */

/* Bytes of one key's codes at kind (Q8, Q4, Q2): d · bits / 8 (d a multiple of 8). */
size_t rt_kvq_kcodes_bytes(rt_kvq_kind kind, int d);
/* The range of channels whose minima and maxima are lo[d], hi[d] (lo <= hi) into range[2d]. */
void rt_kvq_krange_set(const float *lo, const float *hi, int d, uint16_t *range);
/* The range's minima and steps at kind as floats: lo[d], step[d] (what encode and decode use). */
void rt_kvq_krange_unpack(rt_kvq_kind kind, const uint16_t *range, int d, float *lo,
                          float *step);
/* Encode x[d] into out[rt_kvq_kcodes_bytes(kind, d)] against an unpacked range. */
void rt_kvq_kcodes_encode(rt_kvq_kind kind, const float *lo, const float *step, const float *x,
                          int d, uint8_t *out);
/* Decode codes into x[d] against an unpacked range. */
void rt_kvq_kcodes_decode(rt_kvq_kind kind, const float *lo, const float *step,
                          const uint8_t *codes, int d, float *x);

/* ---- rotation before quantisation ------------------------------------------------------- */
/*
 * x ← H x with H = H_d / √d the normalised Walsh-Hadamard matrix (Sylvester order, d a
 * power of two), by the fast transform: log2 d butterfly passes, d log2 d additions, no
 * storage. H is orthogonal and symmetric, so H H = I: the same call undoes it (up to f32
 * rounding, about log2 d · 2^-24 relative), and (H q) · (H k) = q · k. Rotating a row
 * before quantising spreads an outlier channel's energy over every channel, so a group's
 * range is set by the row's RMS instead of its largest channel (QuaRot, Ashkboos et al.
 * 2024, arXiv 2404.00456; llama.cpp rotates K and V this way before its quantised KV types).
 */
void rt_kvq_rotate(float *x, int d);

#endif
