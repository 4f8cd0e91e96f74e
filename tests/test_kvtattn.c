/*
 * test_kvtattn: attention read in place from a tiered KV store's codes
 * (runtime/model/rt_kvattn.h, rt_kvattn_tier_scores / rt_kvattn_tier_mix) against attention
 * over the rows rt_kv_head_decode dequantises (itself checked against the inputs by
 * test_kv_tiers), at every ISA level the machine has, for head_dim 64, 128 and 256 and query
 * groups of 3, 4 (the 9/3 and 4/1 shapes) and 17 (more than one fold of query heads).
 * The reference sums in double over the decoded f32 rows; the kernels sum in f32 and fold
 * a key group's range into the query (scale · q·k = scale · Σ q_c lo_c + Σ (scale · q_c
 * step_c) code_c), so each result is bounded by the f32 error of a sum of n terms,
 * γ = (n + 2) · 2^-23, times the sum of the terms' magnitudes, with a key's terms taken as
 * |q_c| (|lo_c| + |step_c · code_c|) <= |q_c| · 2 · kmax_c (the range's ends decode to
 * values of the group, so |lo_c| <= kmax_c and |k_c - lo_c| <= 2 kmax_c). Every tier holds
 * entries, entries were evicted (slots out of entry order), and entries at or past lim are
 * neither read nor written. The vector kernels round a key group's folded query to 16 bits,
 * which adds at most d/65534 of the largest channel term q_c · 2 kmax_c to a quantised key's
 * score (derived beside the check). The same with keys and values stored rotated
 * (rt_kv_set_rotation), the bounds taken over both bases (the top tier's and the rotated
 * codes').
 *
 * Rotation (rt_kvq_rotate) against the explicit normalised Hadamard matrix
 * H[i][j] = (-1)^popcount(i & j) / √d (Sylvester's construction) in double, and its own
 * inverse; a rotated store's decoded rows within the quantisation bound computed here on
 * the rotated row (per group or key group, half a step of its range, plus f16 roundings),
 * measured in the L2 norm (H is orthogonal); rotation lowers the values' error on rows with
 * an outlier channel; rotating costs no byte (rt_kv_bytes_held equal with and without).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/rt_kv.h"
#include "kv/rt_kvq.h"
#include "model/rt_dot.h"
#include "model/rt_kvattn.h"
#include "support/check_run.h"

static unsigned rng(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (*s >> 8) & 0xffffff;
}

static float rnd(unsigned *s)
{
	return (float)rng(s) / (float)0x800000 - 1.0f;
}

/* a key or value row with channel outliers (as keys have) */
static void fill_row(float *x, int d, unsigned *s)
{
	for (int c = 0; c < d; c++)
		x[c] = rnd(s) * (c % 8 == 3 ? 12.0f : 1.0f) + (c == 5 ? 4.0f : 0);
}

/* y = H x with the explicit matrix, in double */
static void hadamard_ref(const float *x, int d, double *y)
{
	for (int i = 0; i < d; i++) {
		double acc = 0;
		for (int j = 0; j < d; j++)
			acc += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[j];
		y[i] = acc / sqrt((double)d);
	}
}

/* the largest |(H x_i)_c| over n rows x, per channel, into m[d] (double) */
static void rot_max(const float *X, int n, int d, double *m)
{
	double *y = malloc((size_t)d * sizeof *y);
	for (int c = 0; c < d; c++)
		m[c] = 0;
	for (int i = 0; i < n; i++) {
		hadamard_ref(X + (size_t)i * d, d, y);
		for (int c = 0; c < d; c++)
			m[c] = fmax(m[c], fabs(y[c]));
	}
	free(y);
}

enum { N = 300, SENT = 12345 };

/* A one-list tiered f16 store of N entries at d channels, tiers by a pattern (every tier
 * used), a fifth evicted. */
static void store_make(rt_kv *kv, int d, int G, unsigned seed, int rot)
{
	rt_err err = { "" };
	ck_assert_int_eq(rt_kv_init_tiered(kv, NULL, RT_KV_F16, 1, 1, G, d, N, 0, 0, &err), 0);
	ck_assert_int_eq(rt_kv_set_rotation(kv, rot, rot, &err), 0);
	rt_kv_head *h = &kv->heads[0];
	float *k = malloc((size_t)d * sizeof *k), *v = malloc((size_t)d * sizeof *v);
	unsigned s = seed;
	for (int i = 0; i < N; i++) {
		fill_row(k, d, &s);
		fill_row(v, d, &s);
		rt_kv_append(kv, h, k, v, i);
	}
	uint8_t want[N];
	for (int i = 0; i < N; i++)
		want[i] = (uint8_t)(i >= N - 20 ? RT_KV_TIER_TOP : (i * 7 + i / 64) % RT_KV_N_TIER);
	ck_assert_int_gt(rt_kv_head_set_tiers(kv, h, want, &err), 0);
	int32_t keep[N];
	int nk = 0;
	for (int i = 0; i < N; i++)
		if (i % 5 != 2)
			keep[nk++] = i;
	rt_kv_head_evict(kv, h, keep, nk);
	for (int t = 0; t < RT_KV_N_TIER; t++)
		ck_assert_int_gt(h->arena[t].n, 0);
	free(k), free(v);
}

START_TEST(tier_scores_and_mix_equal_decoded_rows)
{
	static const int dims[] = { 64, 128, 256 }, groups[] = { 3, 4, 17 };
	const int d = dims[_i % 3], G = groups[_i / 3 % 3], rot = _i / 9;
	rt_kv kv;
	store_make(&kv, d, G, 11u + (unsigned)_i, rot);
	const rt_kv_head *h = &kv.heads[0];
	const int n = h->n;
	float *K = malloc((size_t)n * d * sizeof *K), *V = malloc((size_t)n * d * sizeof *V);
	float *q = malloc((size_t)G * d * sizeof *q), *P = malloc((size_t)G * n * sizeof *P);
	float *S = malloc((size_t)G * n * sizeof *S), *out = malloc((size_t)G * d * sizeof *out);
	double *kmax = calloc((size_t)d, sizeof *kmax), *vmax = calloc((size_t)d, sizeof *vmax);
	rt_kv_head_decode(&kv, h, 0, n, K, V);
	for (int i = 0; i < n; i++)
		for (int c = 0; c < d; c++) {
			kmax[c] = fmax(kmax[c], fabs(K[(size_t)i * d + c]));
			vmax[c] = fmax(vmax[c], fabs(V[(size_t)i * d + c]));
		}
	/* the codes' basis: the rotated rows' channel maxima (0 without rotation) */
	double *krmax = calloc((size_t)d, sizeof *krmax), *vrmax = calloc((size_t)d, sizeof *vrmax);
	double *qr = malloc((size_t)d * sizeof *qr), vr_sum = 0;
	if (rot) {
		rot_max(K, n, d, krmax);
		rot_max(V, n, d, vrmax);
		for (int c = 0; c < d; c++)
			vr_sum += 2 * vrmax[c];
	}
	unsigned s = 5u + (unsigned)_i;
	for (int j = 0; j < G * d; j++)
		q[j] = rnd(&s);
	const float scale = 1.0f / sqrtf((float)d);
	const int lims[2] = { n, n - 7 };
	/* AVX2's results, which the AVX-512 kernels reproduce bit for bit (rt_kvattn.c) */
	float *S2 = malloc(2 * (size_t)G * n * sizeof *S2), *out2 = malloc(2 * (size_t)G * d * sizeof *out2);
	for (int isa = RT_ISA_SCALAR; isa <= rt_dot_isa_best(); isa++)
		for (int li = 0; li < 2; li++) {
			const int lim = lims[li];
			for (int j = 0; j < G * n; j++)
				S[j] = SENT;
			rt_kvattn_tier_scores(&kv, h, lim, q, (size_t)d, G, scale, S, (size_t)n, isa);
			if (isa == RT_ISA_AVX2)
				memcpy(S2 + (size_t)li * G * n, S, (size_t)G * n * sizeof *S);
			if (isa == RT_ISA_AVX512)
				ck_assert_msg(!memcmp(S2 + (size_t)li * G * n, S, (size_t)G * n * sizeof *S),
				              "d %d G %d lim %d: AVX-512 scores differ from AVX2's", d, G, lim);
			/* the rotation's rounding: log2 d passes, each 2^-24 relative */
			const double gk = (d + 2 + 2 * log2(d)) * ldexp(1.0, -23);
			for (int g = 0; g < G; g++) {
				double mag = 0, big = 0;
				if (rot)
					hadamard_ref(q + (size_t)g * d, d, qr);
				for (int c = 0; c < d; c++) {
					mag += fabs(q[(size_t)g * d + c]) * 2 * kmax[c] + (rot ? fabs(qr[c]) * 2 * krmax[c] : 0);
					big = fmax(big, rot ? fabs(qr[c]) * 2 * krmax[c] : fabs(q[(size_t)g * d + c]) * 2 * kmax[c]);
				}
				/* the vector kernels round a key group's folded query to 16 bits (rt_kvattn.c
				 * tier_qfold_avx2): a quantised key's score moves by at most
				 * (1/2 + 2^-10) · d · (2^b − 1) · D, D = max_c |scale · q_c · step_c| / 32767
				 * <= scale · max_c |q_c| · 2 kmax_c / ((2^b − 1) · 32767) (a key group's range
				 * is within ±kmax_c; 1 % for the f16 rounding of its ends) */
				const double q16 = isa > RT_ISA_SCALAR ? 1.01 * (0.5 + ldexp(1.0, -10)) * d * scale * big / 32767 : 0;
				for (int i = 0; i < n; i++) {
					const float got = S[(size_t)g * n + i];
					if (i >= lim) {
						ck_assert_msg(got == SENT, "isa %d: entry %d past lim %d written", isa, i, lim);
						continue;
					}
					double ref = 0;
					for (int c = 0; c < d; c++)
						ref += (double)q[(size_t)g * d + c] * K[(size_t)i * d + c];
					ref *= scale;
					ck_assert_msg(fabs(got - ref) <= gk * scale * mag + (h->tier[i] != RT_KV_TIER_TOP ? q16 : 0),
					              "isa %d d %d G %d: score g %d entry %d tier %d: %.9g vs %.9g", isa,
					              d, G, g, i, h->tier[i], got, ref);
				}
			}
			/* probabilities: any non-negative weights (entries past lim get poison), the
			 * same at every ISA */
			unsigned sp = s + (unsigned)li;
			for (int g = 0; g < G; g++)
				for (int i = 0; i < n; i++)
					P[(size_t)g * n + i] = i < lim ? (float)rng(&sp) / (float)0xffffff : NAN;
			rt_kvattn_tier_mix(&kv, h, lim, P, (size_t)n, G, out, (size_t)d, isa);
			if (isa == RT_ISA_AVX2)
				memcpy(out2 + (size_t)li * G * d, out, (size_t)G * d * sizeof *out);
			if (isa == RT_ISA_AVX512)
				ck_assert_msg(!memcmp(out2 + (size_t)li * G * d, out, (size_t)G * d * sizeof *out),
				              "d %d G %d lim %d: AVX-512 mix differs from AVX2's", d, G, lim);
			const double gv = (lim + 2 + 2 * log2(d)) * ldexp(1.0, -23);
			for (int g = 0; g < G; g++)
				for (int c = 0; c < d; c++) {
					double ref = 0, mag = 0, psum = 0;
					for (int i = 0; i < lim; i++) {
						ref += (double)P[(size_t)g * n + i] * V[(size_t)i * d + c];
						mag += P[(size_t)g * n + i] * 2 * vmax[c];
						psum += P[(size_t)g * n + i];
					}
					/* the rotated sum's error, spread by H: |H e|_c <= Σ_j |e_j| / √d */
					mag += rot ? psum * vr_sum / sqrt((double)d) : 0;
					const float got = out[(size_t)g * d + c];
					ck_assert_msg(fabs(got - ref) <= gv * mag,
					              "isa %d d %d G %d: out g %d channel %d: %.9g vs %.9g", isa, d, G,
					              g, c, got, ref);
				}
		}
	free(K), free(V), free(q), free(P), free(S), free(out), free(kmax), free(vmax);
	free(krmax), free(vrmax), free(qr), free(S2), free(out2);
	rt_kv_free(&kv);
}
END_TEST

START_TEST(rotation_is_normalised_hadamard)
{
	const int d = 64 << _i; /* 64, 128, 256 */
	float *x = malloc((size_t)d * sizeof *x), *y = malloc((size_t)d * sizeof *y);
	double *ref = malloc((size_t)d * sizeof *ref);
	unsigned s = 9u + (unsigned)_i;
	fill_row(x, d, &s);
	memcpy(y, x, (size_t)d * sizeof *y);
	rt_kvq_rotate(y, d);
	hadamard_ref(x, d, ref);
	double nx = 0;
	for (int c = 0; c < d; c++)
		nx += (double)x[c] * x[c];
	nx = sqrt(nx);
	for (int c = 0; c < d; c++)
		ck_assert_msg(fabs(y[c] - ref[c]) <= 2 * log2(d) * ldexp(1.0, -24) * nx * 2,
		              "d %d channel %d: %.9g vs %.9g", d, c, y[c], ref[c]);
	rt_kvq_rotate(y, d); /* H H = I */
	for (int c = 0; c < d; c++)
		ck_assert_msg(fabs(y[c] - x[c]) <= 4 * log2(d) * ldexp(1.0, -24) * nx * 2,
		              "d %d: H H x channel %d: %.9g vs %.9g", d, c, y[c], x[c]);
	free(x), free(y), free(ref);
}
END_TEST

/* bits of the values and keys at each tier (runtime/kv/rt_kv.h: the 2-bit tier keeps 4-bit
 * keys) */
static const int vbits_of[RT_KV_N_TIER] = { 16, 8, 4, 4, 2 };
static const int kbits_of[RT_KV_N_TIER] = { 16, 8, 8, 4, 4 };

/* The L2 bound of a row coded per group of `gs` channels of y (rotated, double) at b bits
 * against ranges lo/hi per channel: half a step per channel plus the f16 rounding of the
 * pair (2^-11 relative each, through the step's 2^b - 1 levels). */
static double l2_bound(const double *lo, const double *hi, int d, int b)
{
	double e2 = 0;
	for (int c = 0; c < d; c++) {
		const double w = hi[c] - lo[c], m = fmax(fabs(lo[c]), fabs(hi[c]));
		const double e = w / ((1 << b) - 1) / 2 + 4 * ldexp(m, -11);
		e2 += e * e;
	}
	return sqrt(e2);
}

START_TEST(rotated_round_trip_and_gain)
{
	enum { NE = 128 };
	const int d = 64 << (_i % 3), t = 1 + _i / 3; /* q8, q4, q2 */
	rt_err err = { "" };
	double err_rv[2] = { 0, 0 }; /* values' mean L2 error without, with rotation */
	int64_t bytes[2];
	for (int rot = 0; rot < 2; rot++) {
		rt_kv kv;
		ck_assert_int_eq(rt_kv_init_tiered(&kv, NULL, RT_KV_F16, 1, 1, 3, d, NE, 0, 0, &err), 0);
		ck_assert_int_eq(rt_kv_set_rotation(&kv, rot, rot, &err), 0);
		rt_kv_head *h = &kv.heads[0];
		float *X = malloc((size_t)2 * NE * d * sizeof *X), *buf = malloc((size_t)d * sizeof *buf);
		unsigned s = 21u + (unsigned)_i;
		for (int i = 0; i < NE; i++) {
			float *k = X + (size_t)(2 * i) * d, *v = k + d;
			fill_row(k, d, &s);
			fill_row(v, d, &s);
			v[7] = 40.0f * (i % 2 ? 1 : -1); /* an outlier channel */
			for (int c = 0; c < d; c++) /* the f16 top tier's rows, as first stored */
				k[c] = rt_fp16_to_f32(rt_f32_to_fp16(k[c])), v[c] = rt_fp16_to_f32(rt_f32_to_fp16(v[c]));
			rt_kv_append(&kv, h, k, v, i);
		}
		uint8_t want[NE];
		memset(want, t, sizeof want);
		ck_assert_int_eq(rt_kv_head_set_tiers(&kv, h, want, &err), NE);
		double *y = malloc((size_t)d * sizeof *y), *lo = malloc((size_t)2 * d * sizeof *lo);
		double *hi = lo + d, *klo = malloc((size_t)4 * d * sizeof *klo), *khi = klo + 2 * d;
		/* key ranges per key group (64 positions), per channel of the coded rows */
		for (int g = 0; g < 2; g++)
			for (int c = 0; c < d; c++)
				klo[g * d + c] = INFINITY, khi[g * d + c] = -INFINITY;
		for (int i = 0; i < NE; i++) {
			const float *k = X + (size_t)(2 * i) * d;
			if (rot)
				hadamard_ref(k, d, y);
			for (int c = 0; c < d; c++) {
				const double v = rot ? y[c] : k[c];
				klo[(i / 64) * d + c] = fmin(klo[(i / 64) * d + c], v);
				khi[(i / 64) * d + c] = fmax(khi[(i / 64) * d + c], v);
			}
		}
		for (int i = 0; i < NE; i++) {
			const float *k = X + (size_t)(2 * i) * d, *v = k + d;
			/* key: within its key group's range bound */
			const float *kd = rt_kv_key(&kv, h, i, buf);
			double e2 = 0;
			for (int c = 0; c < d; c++)
				e2 += ((double)kd[c] - k[c]) * ((double)kd[c] - k[c]);
			const double kb = l2_bound(klo + (i / 64) * d, khi + (i / 64) * d, d, kbits_of[t]);
			ck_assert_msg(sqrt(e2) <= kb * (1 + 1e-4) + 1e-5,
			              "rot %d d %d tier %d key %d: L2 error %g > %g", rot, d, t, i, sqrt(e2), kb);
			/* value: per group of 32 channels of the coded row */
			if (rot)
				hadamard_ref(v, d, y);
			for (int c0 = 0; c0 < d; c0 += 32) {
				double a = INFINITY, b = -INFINITY;
				for (int c = c0; c < c0 + 32; c++) {
					const double u = rot ? y[c] : v[c];
					a = fmin(a, u), b = fmax(b, u);
				}
				for (int c = c0; c < c0 + 32; c++)
					lo[c] = a, hi[c] = b;
			}
			const float *vd = rt_kv_value(&kv, h, i, buf);
			e2 = 0;
			for (int c = 0; c < d; c++)
				e2 += ((double)vd[c] - v[c]) * ((double)vd[c] - v[c]);
			const double vb = l2_bound(lo, hi, d, vbits_of[t]);
			ck_assert_msg(sqrt(e2) <= vb * (1 + 1e-4) + 1e-5,
			              "rot %d d %d tier %d value %d: L2 error %g > %g", rot, d, t, i, sqrt(e2), vb);
			err_rv[rot] += sqrt(e2) / NE;
		}
		bytes[rot] = rt_kv_bytes_held(&kv);
		free(X), free(buf), free(y), free(lo), free(klo);
		rt_kv_free(&kv);
	}
	ck_assert_msg(err_rv[1] < 0.8 * err_rv[0], "d %d tier %d: rotation did not lower the values' "
	              "error on outlier rows (%g vs %g)", d, t, err_rv[1], err_rv[0]);
	ck_assert_int_eq(bytes[0], bytes[1]);
}
END_TEST

START_TEST(rotation_refusals)
{
	rt_kv kv;
	rt_err err = { "" };
	ck_assert_int_eq(rt_kv_init_tiered(&kv, NULL, RT_KV_F16, 1, 1, 3, 96, 8, 0, 0, &err), 0);
	ck_assert_int_eq(rt_kv_set_rotation(&kv, 1, 0, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "power-of-two head_dim, not 96"));
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kv_init_typed(&kv, NULL, RT_KV_F16, 1, 1, 3, 64, 8, 0, 0, &err), 0);
	ck_assert_int_eq(rt_kv_set_rotation(&kv, 1, 1, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "tiered store"));
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kv_init_tiered(&kv, NULL, RT_KV_F16, 1, 1, 3, 64, 8, 0, 0, &err), 0);
	float x[64] = { 1 };
	rt_kv_append(&kv, &kv.heads[0], x, x, 0);
	uint8_t want[1] = { RT_KV_TIER_Q4 };
	ck_assert_int_eq(rt_kv_head_set_tiers(&kv, &kv.heads[0], want, &err), 1);
	ck_assert_int_eq(rt_kv_set_rotation(&kv, 1, 1, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "after entries were quantised"));
	rt_kv_free(&kv);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kvtattn");
	TCase *tc = tcase_create("tier_attention");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, tier_scores_and_mix_equal_decoded_rows, 0, 18);
	tcase_add_loop_test(tc, rotation_is_normalised_hadamard, 0, 3);
	tcase_add_loop_test(tc, rotated_round_trip_and_gain, 0, 9);
	tcase_add_test(tc, rotation_refusals);
	suite_add_tcase(s, tc);
	int failed = check_run(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
