/*
 * rt_rope: rotary position embedding (Su et al. 2021, "RoFormer", arXiv 2104.09864) in
 * ggml's NORMAL mode (mode 0, ggml-org/llama.cpp ggml/src/ggml-cpu/ops.cpp rope_f32): the
 * ADJACENT pair (x[2i], x[2i+1]), i < n_rot/2, of a head is rotated by the angle
 *   theta_i = pos · base^(-2i/n_rot)
 *   (x0, x1) -> (x0 cos theta - x1 sin theta,  x0 sin theta + x1 cos theta);
 * dimensions n_rot..head_dim-1 are left as they are. (The GGUF converter permuted the Q/K
 * rows of HF checkpoints so that this equals HF's rotate-half.)
 *
 * The one implementation used by the forward (runtime/model/rt_model.c), the compacted
 * position convention's re-rotation (runtime/policy/rt_seq.c) and GraceKV's prototypes
 * (kernels/k_proto.h). The frequency base^(-2i/n_rot) is always pow((double)base,
 * -2.0 * i / n_rot) and every angle is pos · frequency in double, so the three precisions
 * below agree on the angle to the bit:
 *   - f32 tables (the forward): cos/sin in double rounded to float, products in float;
 *   - f64 tables applied to float vectors (re-rotation, rotate by a position): cos/sin and
 *     products in double, the result rounded to float once;
 *   - double vectors (GraceKV un-rotates keys into double).
 * n_rot is even and 0 <= n_rot <= head_dim throughout (the model loader checks it); no
 * function allocates or fails.
 */
#ifndef RT_ROPE_H
#define RT_ROPE_H

#include <stddef.h>
#include <stdint.h>

/* base^(-2i/n_rot) in double, the frequency of pair i. */
double rt_rope_freq(int i, int n_rot, float base);

/* freq[i] = rt_rope_freq(i, n_rot, base) for i < n_rot/2. freq: [n_rot/2]. */
void rt_rope_freqs(double *freq, int n_rot, float base);

/* The forward's table: for each of C rows r at position pos0 + r, cs[r·n_rot + 2i] and
 * cs[r·n_rot + 2i + 1] = (float)cos, (float)sin of theta_i. cs: [C × n_rot]. */
void rt_rope_table_f32(float *cs, int C, int32_t pos0, int n_rot, float base);

/* Rotate heads h0..h0+nh-1 of each of C rows by that row's f32 table row (products in
 * float). Row r's head h starts at x + r·stride + h·head_dim; cs: [C × n_rot] as
 * rt_rope_table_f32 writes it. */
void rt_rope_apply_f32(float *x, int C, size_t stride, int h0, int nh, int head_dim,
                       int n_rot, const float *cs);

/* One position's angles in double: cs[2i], cs[2i+1] = cos, sin of pos · freq[i], with
 * freq as rt_rope_freqs writes it (NULL: computed here). cs: [n_rot]. */
void rt_rope_cs_f64(double *cs, double pos, int n_rot, float base, const double *freq);

/* Rotate the float vector x[0..n_rot) by the double angles cs (rt_rope_cs_f64): products
 * in double, each result rounded to float once. */
void rt_rope_rotate_f32_by_f64(float *x, int n_rot, const double *cs);

/* Rotate the double vector x[0..n_rot) by the double angles cs, in double. */
void rt_rope_rotate_f64(double *x, int n_rot, const double *cs);

/* Rotate the float vector x by position pos (negative: the inverse rotation), angles and
 * products in double, no table: rt_rope_cs_f64 + rt_rope_rotate_f32_by_f64 pair by pair. */
void rt_rope_by_f32(float *x, int n_rot, float base, double pos);

/* The same for a double vector, in double throughout. */
void rt_rope_by_f64(double *x, int n_rot, float base, double pos);

#endif
