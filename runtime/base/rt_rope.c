/*
 * rt_rope: rotary position embedding in ggml's NORMAL mode; see rt_rope.h for the
 * contract and the three precisions.
 */
#include "base/rt_rope.h"

#include <math.h>

double rt_rope_freq(int i, int n_rot, float base)
{
	return pow((double)base, -2.0 * i / n_rot);
}

void rt_rope_freqs(double *freq, int n_rot, float base)
{
	for (int i = 0; i < n_rot / 2; i++)
		freq[i] = rt_rope_freq(i, n_rot, base);
}

void rt_rope_table_f32(float *cs, int C, int32_t pos0, int n_rot, float base)
{
	for (int r = 0; r < C; r++) {
		double pos = (double)(pos0 + r);
		for (int i = 0; i < n_rot / 2; i++) {
			double theta = pos * rt_rope_freq(i, n_rot, base);
			cs[(size_t)r * n_rot + 2 * i] = (float)cos(theta);
			cs[(size_t)r * n_rot + 2 * i + 1] = (float)sin(theta);
		}
	}
}

void rt_rope_table_f32_freq(float *cs, int C, int32_t pos0, int n_rot, const double *freq,
                            float mscale)
{
	for (int r = 0; r < C; r++) {
		double pos = (double)(pos0 + r);
		for (int i = 0; i < n_rot / 2; i++) {
			double theta = pos * freq[i];
			cs[(size_t)r * n_rot + 2 * i] = (float)(cos(theta) * mscale);
			cs[(size_t)r * n_rot + 2 * i + 1] = (float)(sin(theta) * mscale);
		}
	}
}

/* ggml_rope_yarn_corr_dim: the pair index whose wavelength fits n_rot_turns turns in
 * n_ctx_orig positions (ggml.c), in float as ggml computes it */
static float yarn_corr_dim(int n_dims, int32_t n_ctx_orig, float turns, float base)
{
	return (float)n_dims * logf((float)n_ctx_orig / (turns * 2 * (float)M_PI)) / (2 * logf(base));
}

void rt_rope_scaled_freqs(double *freq, float *mscale, int n_rot, float base,
                          const rt_rope_scaling *s)
{
	rt_rope_freqs(freq, n_rot, base);
	*mscale = 1.0f;
	if (!s)
		return;
	float lo = 0, hi = 0;
	if (s->yarn) {
		lo = fmaxf(0, floorf(yarn_corr_dim(n_rot, s->n_ctx_orig, s->beta_fast, base)));
		hi = fminf((float)(n_rot - 1), ceilf(yarn_corr_dim(n_rot, s->n_ctx_orig, s->beta_slow, base)));
	}
	for (int i = 0; i < n_rot / 2; i++) {
		double f = freq[i] / (s->factors ? (double)s->factors[i] : 1.0);
		double mix = 0; /* rope_yarn_ramp: 1 below lo, 0 above hi */
		if (s->yarn) {
			float y = ((float)i - lo) / fmaxf(0.001f, hi - lo);
			mix = 1.0 - fmin(1.0, fmax(0.0, (double)y));
		}
		freq[i] = f * ((double)s->freq_scale * (1.0 - mix) + mix);
	}
	float m = s->attn_factor;
	if (s->yarn) { /* llama_context: get_mscale(factor) / (1 + 0.1 ln factor), then rope_yarn */
		const float fac = s->yarn_factor;
		m *= (fac <= 1.0f ? 1.0f : 0.1f * logf(fac) + 1.0f) / (1.0f + 0.1f * logf(fac));
		m *= 1.0f + 0.1f * logf(1.0f / s->freq_scale);
	}
	*mscale = m;
}

void rt_rope_apply_f32(float *x, int C, size_t stride, int h0, int nh, int head_dim,
                       int n_rot, const float *cs)
{
	for (int r = 0; r < C; r++) {
		const float *c = cs + (size_t)r * n_rot;
		for (int h = h0; h < h0 + nh; h++) {
			float *v = x + (size_t)r * stride + (size_t)h * head_dim;
			for (int i = 0; i < n_rot / 2; i++) {
				float x0 = v[2 * i], x1 = v[2 * i + 1];
				float co = c[2 * i], si = c[2 * i + 1];
				v[2 * i] = x0 * co - x1 * si;
				v[2 * i + 1] = x0 * si + x1 * co;
			}
		}
	}
}

void rt_rope_cs_f64(double *cs, double pos, int n_rot, float base, const double *freq)
{
	for (int i = 0; i < n_rot / 2; i++) {
		double theta = pos * (freq ? freq[i] : rt_rope_freq(i, n_rot, base));
		cs[2 * i] = cos(theta);
		cs[2 * i + 1] = sin(theta);
	}
}

void rt_rope_rotate_f32_by_f64(float *x, int n_rot, const double *cs)
{
	for (int i = 0; i < n_rot / 2; i++) {
		double co = cs[2 * i], si = cs[2 * i + 1];
		double x0 = x[2 * i], x1 = x[2 * i + 1];
		x[2 * i] = (float)(x0 * co - x1 * si);
		x[2 * i + 1] = (float)(x0 * si + x1 * co);
	}
}

void rt_rope_rotate_f64(double *x, int n_rot, const double *cs)
{
	for (int i = 0; i < n_rot / 2; i++) {
		double co = cs[2 * i], si = cs[2 * i + 1];
		double x0 = x[2 * i], x1 = x[2 * i + 1];
		x[2 * i] = x0 * co - x1 * si;
		x[2 * i + 1] = x0 * si + x1 * co;
	}
}

/* cos, sin of pair i's angle at pos, computed as rt_rope_cs_f64 does */
static void pair_cs(double cs[2], int i, int n_rot, float base, double pos)
{
	double theta = pos * rt_rope_freq(i, n_rot, base);
	cs[0] = cos(theta);
	cs[1] = sin(theta);
}

void rt_rope_by_f32(float *x, int n_rot, float base, double pos)
{
	double cs[2];
	for (int i = 0; i < n_rot / 2; i++) {
		pair_cs(cs, i, n_rot, base, pos);
		rt_rope_rotate_f32_by_f64(x + 2 * i, 2, cs);
	}
}

void rt_rope_by_f64(double *x, int n_rot, float base, double pos)
{
	double cs[2];
	for (int i = 0; i < n_rot / 2; i++) {
		pair_cs(cs, i, n_rot, base, pos);
		rt_rope_rotate_f64(x + 2 * i, 2, cs);
	}
}
