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
