/*
 * k_proto: one prototype — a single merged cache entry standing for a set of entries, with
 * a count whose log the attention adds to the entry's logit (rt_kv's log_count: the entry
 * then weighs as m entries with its key), the building block of GraceKV's prototype trees
 * ("Every Cache Entry Earns Its Place", Tian, Liu, Wang, arXiv 2608.07001; docs/gracekv.md
 * section 3 gives every definition with its source tag).
 *
 * For the n >= 1 members idx[0..n) of the arrays K, V ([· × d], post-RoPE keys, values) at
 * positions P[idx[j]]:
 *   key   K_PROTO_KEY_UNROPE: k°_t = RoPE⁻¹(k_t, t), p = round(mean t) (halves up, exact in
 *         integers), k~ = RoPE(mean k°_t, p);  K_PROTO_KEY_POST: k~ = mean k_t (post-RoPE);
 *   value beta = smooth · mean w_t, v~ = Σ (w_t + beta) v_t / Σ (w_t + beta) (the plain mean
 *         when w is NULL or no w_t is positive);
 *   count coherence ℏ = ‖mean k°‖ / (mean ‖k°‖ + 1e-12); K_PROTO_COUNT_COHERENCE:
 *         m = clamp(n·ℏ², 1, n); K_PROTO_COUNT_N: m = clamp(n, 1, n).
 * RoPE is base/rt_rope (ggml NORMAL mode, angles and products in double). Sums are in
 * double in member order; outputs are rounded to float once. For n == 1 the outputs are
 * the member itself bit for bit (count 1). Nothing is allocated; no errors (the caller
 * checks n >= 1, 0 <= n_rot <= d even).
 */
#ifndef K_PROTO_H
#define K_PROTO_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/rt_rope.h"
#include "base/rt_util.h"

/* ORDER(proto key), ORDER(proto count): the targets of the `tree = prototypes(key = ...,
 * count = ...)` words, mapped by name in compiler/kvp_emit_c.c. */
enum k_proto_key { K_PROTO_KEY_UNROPE = 0, K_PROTO_KEY_POST };
enum k_proto_count { K_PROTO_COUNT_COHERENCE = 0, K_PROTO_COUNT_N };

/* Un-rotate the key k[d] at position pos into out[d] (double). cs: [n_rot] cos, sin of this
 * position's un-rotation angles (k_proto_rope_table), or NULL to compute them. */
static inline void k_proto_unrope(const float *k, int d, int n_rot, float base, int32_t pos,
                                  const double *cs, double *out)
{
	for (int i = 0; i < d; i++)
		out[i] = k[i];
	if (cs)
		rt_rope_rotate_f64(out, n_rot, cs);
	else
		rt_rope_by_f64(out, n_rot, base, -(double)pos);
}

/* cos, sin of the un-rotation angle -pos·base^(-2i/n_rot) for the n positions P[0..n):
 * cs [n × n_rot], the same double values k_proto_unrope computes without a table. */
static inline void k_proto_rope_table(double *cs, const int32_t *P, int32_t n, int n_rot,
                                      float base)
{
	for (int32_t e = 0; e < n; e++)
		rt_rope_cs_f64(cs + (size_t)e * n_rot, -(double)P[e], n_rot, base, NULL);
}

/* The value v~ (see the top): v_out[d], work [d] doubles. */
static inline void k_proto_value(const float *V, const float *w, const int32_t *idx, int n,
                                 int d, double wsum, double smooth, float *v_out, double *vs)
{
	double beta = smooth * wsum / n, den = 0.0;
	int plain = !w || !(wsum > 0.0);
	for (int i = 0; i < d; i++)
		vs[i] = 0.0;
	for (int j = 0; j < n; j++) {
		int32_t e = idx[j];
		double c = plain ? 1.0 : (double)w[e] + beta;
		const float *v = V + (size_t)e * d;
		for (int i = 0; i < d; i++)
			vs[i] += c * v[i];
		den += c;
	}
	for (int i = 0; i < d; i++)
		v_out[i] = (float)(vs[i] / den);
}

/* Merge members idx[0..n) of K, V, P into one prototype (see the top). w: relevance per
 * entry of the arrays (indexed like K), or NULL. cs: the un-rotation table of P
 * (k_proto_rope_table, [· × n_rot]) or NULL. key: enum k_proto_key; count: enum
 * k_proto_count; smooth: the value smoothing share (0.1 in GraceKV). Outputs k_out[d],
 * v_out[d], *pos_out, *count_out = m, *coherence_out = ℏ (may be NULL). work: [2 × d]. */
static inline void k_proto_merge(const float *K, const float *V, const int32_t *P,
                                 const float *w, const int32_t *idx, int n, int d, int n_rot,
                                 float base, const double *cs, int key, int count,
                                 double smooth, float *k_out, float *v_out, int32_t *pos_out,
                                 float *count_out, double *coherence_out, double *work)
{
	RT_ASSERT(n >= 1);
	if (n == 1) {
		memcpy(k_out, K + (size_t)idx[0] * d, (size_t)d * sizeof(float));
		memcpy(v_out, V + (size_t)idx[0] * d, (size_t)d * sizeof(float));
		*pos_out = P[idx[0]];
		*count_out = 1.0f;
		if (coherence_out)
			*coherence_out = 1.0;
		return;
	}
	double *ksum = work, *kt = work + d;
	int64_t psum = 0;
	double norm_sum = 0.0, wsum = 0.0;
	for (int i = 0; i < d; i++)
		ksum[i] = 0.0;
	for (int j = 0; j < n; j++) {
		int32_t e = idx[j];
		psum += P[e];
		if (key == K_PROTO_KEY_POST)
			for (int i = 0; i < d; i++)
				kt[i] = K[(size_t)e * d + i];
		else
			k_proto_unrope(K + (size_t)e * d, d, n_rot, base, P[e],
			               cs ? cs + (size_t)e * n_rot : NULL, kt);
		double nn = 0.0;
		for (int i = 0; i < d; i++) {
			ksum[i] += kt[i];
			nn += kt[i] * kt[i];
		}
		norm_sum += sqrt(nn);
		if (w)
			wsum += w[e];
	}
	/* p = floor(mean + 1/2), exact in integers */
	int64_t p = (2 * psum + n) / (2 * (int64_t)n);
	if (2 * psum + n < 0 && (2 * psum + n) % (2 * (int64_t)n) != 0)
		p--;
	double mnorm = 0.0;
	for (int i = 0; i < d; i++) {
		double m = ksum[i] / n;
		mnorm += m * m;
		k_out[i] = (float)m;
	}
	mnorm = sqrt(mnorm);
	if (key != K_PROTO_KEY_POST) {
		RT_ASSERT(n_rot >= 0 && n_rot <= d && n_rot % 2 == 0);
		rt_rope_by_f32(k_out, n_rot, base, (double)p);
	}
	double coh = mnorm / (norm_sum / n + 1e-12);
	double m = count == K_PROTO_COUNT_N ? (double)n : (double)n * coh * coh;
	m = m < 1.0 ? 1.0 : m > n ? n : m;
	k_proto_value(V, w, idx, n, d, wsum, smooth, v_out, kt);
	*pos_out = (int32_t)p;
	*count_out = (float)m;
	if (coherence_out)
		*coherence_out = coh;
}

#endif
