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

/* RoPE scaling as llama.cpp applies it (ggml-cpu ops.cpp rope_yarn and
 * ggml_rope_cache_init; src/llama-context.cpp for the attention factor): per pair i the
 * extrapolated frequency f_i = base^(-2i/n_rot) / factors[i] (Llama 3.x's
 * rope_freqs.weight; NULL: 1), the interpolated one freq_scale · f_i (linear scaling:
 * freq_scale = 1 / rope.scaling.factor), and under YaRN (Peng et al. 2023, arXiv
 * 2309.00071) the blend f_i · (freq_scale (1 - r_i) + r_i) with r_i the ramp between the
 * correction dimensions of beta_fast and beta_slow at n_ctx_orig positions. Every angle
 * is still pos · freq[i], so the tables and re-rotations below take these freq. mscale
 * multiplies cos and sin (queries and keys), as ggml's: attn_factor, times YaRN's
 * (1 + 0.1 ln(1/freq_scale)) over llama.cpp's cancelling of its own get_mscale. */
typedef struct rt_rope_scaling {
	float freq_scale;     /* 1 / factor (1: none) */
	const float *factors; /* [n_rot/2] frequency divisors, or NULL */
	int yarn;             /* 1: YaRN's ramp and magnitude */
	float yarn_factor;    /* YaRN: the model's 1 / freq_scale of its full-attention layers
	                         (llama.cpp's attention factor is computed from it) */
	float beta_fast, beta_slow; /* YaRN's correction betas (32, 1) */
	int32_t n_ctx_orig;   /* YaRN: the original context (rope.scaling.original_context_length) */
	float attn_factor;    /* rope.scaling.attn_factor (1) */
} rt_rope_scaling;

/* freq[i] for i < n_rot/2 and *mscale under scaling s (NULL: plain, freq = rt_rope_freqs,
 * mscale 1). No allocation, no failure. */
void rt_rope_scaled_freqs(double *freq, float *mscale, int n_rot, float base,
                          const rt_rope_scaling *s);

/* rt_rope_table_f32 from frequencies (rt_rope_scaled_freqs) and a magnitude: cs[r·n_rot
 * + 2i], cs[r·n_rot + 2i + 1] = (float)(mscale cos), (float)(mscale sin) of (pos0 + r) ·
 * freq[i]. With freq = rt_rope_freqs(base) and mscale 1 it is rt_rope_table_f32, bit for
 * bit. */
void rt_rope_table_f32_freq(float *cs, int C, int32_t pos0, int n_rot, const double *freq,
                            float mscale);

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
