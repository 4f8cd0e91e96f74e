/*
 * test_dot: the quantised dot-product kernels of rt_dot, the thread pool of rt_pool and
 * the fast matmul of rt_matmul.
 *
 * References (none of them is the code under test):
 *  - the dequantised f32 product: the weight row decoded by rt_dequant (itself checked
 *    against the numpy decoders of gguf-py in test_quant) dotted in double with the f32
 *    activations;
 *  - each SIMD kernel against the scalar kernel of the same type;
 *  - a hand-computed Q4_1 block.
 * Tolerances:
 *  - against the dequantised product the only approximation is the activation
 *    quantisation: each activation x_i is replaced by d_b·round(x_i/d_b), at most d_b/2
 *    away, so |kernel - ref| <= Σ_i |w_i|·d_b(i)/2 (the bound B below, exact arithmetic),
 *    plus f32 rounding of the block products and of their sum (at most a few ulp of
 *    each term: 1e-5·Σ|w_i·x_i| covers n/32 = 48 terms with a 100x margin);
 *  - SIMD against scalar: the integer block sums are exact in both, so they differ only by
 *    the order of the f32 additions across blocks: 1e-5·Σ|w_i·x_i|;
 *  - F16/F32 weights have no activation quantisation: B = 0, same f32 slack.
 */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gguf_writer.h"
#include "base/rt_pool.h"
#include "kv/rt_kvq.h"
#include "model/rt_dot.h"
#include "model/rt_gguf.h"
#include "model/rt_kvattn.h"
#include "model/rt_matmul.h"
#include "model/rt_quant.h"
#include "support/check_run.h"

static uint32_t g_rng = 12345;

static uint32_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 17;
	g_rng ^= g_rng << 5;
	return g_rng;
}

/* uniform in [lo, hi) */
static float urand(float lo, float hi)
{
	return lo + (hi - lo) * (float)(rnd() >> 8) / 16777216.0f;
}

static void put_f16(uint8_t *p, float v)
{
	uint16_t h = gw_f32_to_f16(v);
	p[0] = (uint8_t)h;
	p[1] = (uint8_t)(h >> 8);
}

/* One random row of n values of type t into w (rt_quant_row_bytes bytes): random codes,
 * scales of a realistic size (values of order 0.1). */
static void random_row(uint32_t t, uint8_t *w, int n)
{
	size_t bytes = rt_quant_row_bytes(t, n);
	for (size_t i = 0; i < bytes; i++)
		w[i] = (uint8_t)rnd();
	size_t bb = rt_quant_block_bytes(t);
	int nb = n / rt_quant_block_values(t);
	for (int b = 0; b < nb && t != RT_GGML_F16 && t != RT_GGML_F32; b++) {
		uint8_t *p = w + (size_t)b * bb;
		switch (t) {
		case RT_GGML_Q4_0: put_f16(p, urand(0.005f, 0.02f)); break;
		case RT_GGML_Q4_1: put_f16(p, urand(0.005f, 0.02f)); put_f16(p + 2, urand(-0.1f, 0.0f)); break;
		case RT_GGML_Q5_0: put_f16(p, urand(0.003f, 0.01f)); break;
		case RT_GGML_Q5_1: put_f16(p, urand(0.003f, 0.01f)); put_f16(p + 2, urand(-0.1f, 0.0f)); break;
		case RT_GGML_Q8_0:
			put_f16(p, urand(0.0005f, 0.002f));
			for (int j = 0; j < 32; j++)
				if (p[2 + j] == 0x80)
					p[2 + j] = 0x81; /* ggml's encoder never writes -128 */
			break;
		case RT_GGML_Q4_K:
		case RT_GGML_Q5_K: put_f16(p, urand(0.0002f, 0.001f)); put_f16(p + 2, urand(0.0002f, 0.002f)); break;
		case RT_GGML_Q6_K: put_f16(p + 208, urand(0.0001f, 0.0005f)); break;
		default: break;
		}
	}
	if (t == RT_GGML_F16)
		for (int i = 0; i < n; i++)
			put_f16(w + 2 * i, urand(-0.2f, 0.2f));
	if (t == RT_GGML_F32)
		for (int i = 0; i < n; i++) {
			float v = urand(-0.2f, 0.2f);
			memcpy(w + 4 * (size_t)i, &v, 4);
		}
}

static const uint32_t types[] = { RT_GGML_Q4_0, RT_GGML_Q4_1, RT_GGML_Q5_0, RT_GGML_Q5_1,
	                          RT_GGML_Q8_0, RT_GGML_Q4_K, RT_GGML_Q5_K, RT_GGML_Q6_K,
	                          RT_GGML_F16, RT_GGML_F32 };
#define N_TYPES ((int)(sizeof types / sizeof types[0]))

/* 1 for the 256-value super-block types */
static int is_k(uint32_t t)
{
	return t == RT_GGML_Q4_K || t == RT_GGML_Q5_K || t == RT_GGML_Q6_K;
}

/* row lengths: several blocks, an odd number of 32-blocks (the 512-bit tail), K sizes */
static int len_for(uint32_t t, int k)
{
	static const int legacy[] = { 32, 96, 576, 1536 }, kq[] = { 256, 512, 1536, 2304 },
	                 flt[] = { 7, 77, 576, 1537 };
	if (is_k(t))
		return kq[k];
	if (t == RT_GGML_F16 || t == RT_GGML_F32)
		return flt[k];
	return legacy[k];
}

START_TEST(test_kernels_vs_dequantised_and_scalar)
{
	const uint32_t t = types[_i];
	g_rng = 777 + (uint32_t)_i;
	for (int k = 0; k < 4; k++) {
		const int n = len_for(t, k);
		uint8_t *w = malloc(rt_quant_row_bytes(t, n));
		float *wf = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)n);
		void *xa = aligned_alloc(64, rt_dot_act_bytes(t, n));
		ck_assert_ptr_nonnull(xa);
		for (int rep = 0; rep < 20; rep++) {
			random_row(t, w, n);
			ck_assert_int_eq(rt_dequant(t, w, wf, n), 0);
			/* activations with outliers, like a transformer's hidden state */
			for (int i = 0; i < n; i++)
				x[i] = urand(-1.0f, 1.0f) * (rnd() % 97 == 0 ? 20.0f : 1.0f);
			const rt_dot_kernel *ks = rt_dot_kernel_get(t, RT_ISA_SCALAR);
			ck_assert_ptr_nonnull(ks);
			ks->quant(x, xa, n);
			double ref = 0.0, mag = 0.0, bound = 0.0;
			const int blk = ks->block;
			for (int b = 0; b < n / blk; b++) {
				float amax = 0.0f;
				for (int i = b * blk; i < (b + 1) * blk; i++)
					amax = fmaxf(amax, fabsf(x[i]));
				const double dq = blk > 1 ? amax / 127.0 : 0.0;
				for (int i = b * blk; i < (b + 1) * blk; i++) {
					ref += (double)wf[i] * x[i];
					mag += fabs((double)wf[i] * x[i]);
					bound += fabs((double)wf[i]) * dq / 2;
				}
			}
			const double slack = 1e-5 * mag + 1e-30;
			const float vs = ks->dot(w, xa, n);
			ck_assert_msg(fabs(vs - ref) <= bound + slack,
			              "type %u n %d: scalar %.9g vs dequantised %.9g (bound %.3g)", t, n, vs,
			              ref, bound + slack);
			for (int isa = RT_ISA_AVX2; isa <= rt_dot_isa_best(); isa++) {
				const rt_dot_kernel *kv = rt_dot_kernel_get(t, isa);
				ck_assert_int_eq(kv->isa, isa);
				const float v = kv->dot(w, xa, n);
				ck_assert_msg(fabs(v - vs) <= slack, "type %u n %d %s: %.9g vs scalar %.9g", t, n,
				              rt_dot_isa_name(isa), v, vs);
				ck_assert_msg(fabs(v - ref) <= bound + slack, "type %u n %d %s vs dequantised", t, n,
				              rt_dot_isa_name(isa));
			}
		}
		free(w), free(wf), free(x), free(xa);
	}
}
END_TEST

/* The rows kernels (several weight rows per call): each of nr = 1..RT_DOT_ROWS rows gives
 * the bits of the same level's one-row dot (rt_matmul's results must not depend on how the
 * rows were grouped) and agrees with the scalar kernel as above. Lengths: one block, an
 * odd count below 16 (3), 16 + 1, 16 + 2 (576), 3·16 (1536) and 2·16 + 3 blocks; the rows
 * sit back to back in a buffer of exactly their size (ASan: no read past the last row). */
START_TEST(test_rows_kernels)
{
	static const int lens[] = { 32, 96, 544, 576, 1536, 1120 };
	const uint32_t t = types[_i];
	g_rng = 4242 + (uint32_t)_i;
	for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
		const int n = lens[li];
		if (n % rt_quant_block_values(t))
			continue;
		const size_t rb = rt_quant_row_bytes(t, n);
		uint8_t *w = malloc(rb * RT_DOT_ROWS);
		float *x = malloc(sizeof(float) * (size_t)n);
		void *xa = aligned_alloc(64, rt_dot_act_bytes(t, n));
		for (int r = 0; r < RT_DOT_ROWS; r++)
			random_row(t, w + rb * r, n);
		for (int i = 0; i < n; i++)
			x[i] = urand(-1.0f, 1.0f) * (rnd() % 97 == 0 ? 20.0f : 1.0f);
		const rt_dot_kernel *ks = rt_dot_kernel_get(t, RT_ISA_SCALAR);
		ks->quant(x, xa, n);
		for (int isa = RT_ISA_SCALAR; isa <= rt_dot_isa_best(); isa++) {
			const rt_dot_kernel *k = rt_dot_kernel_get(t, isa);
			if (!k->rows)
				continue;
			for (int nr = 1; nr <= RT_DOT_ROWS; nr++) {
				float out[RT_DOT_ROWS];
				const int r0 = RT_DOT_ROWS - nr; /* the last nr rows: the buffer's end */
				k->rows(w + rb * r0, rb, xa, n, nr, out);
				for (int r = 0; r < nr; r++) {
					const uint8_t *wr = w + rb * (r0 + r);
					const float one = k->dot(wr, xa, n), vs = ks->dot(wr, xa, n);
					ck_assert_msg(memcmp(&out[r], &one, sizeof one) == 0,
					              "type %u n %d %s nr %d row %d: %.9g vs dot %.9g", t, n,
					              rt_dot_isa_name(isa), nr, r, out[r], one);
					double mag = 0.0;
					float *wf = malloc(sizeof(float) * (size_t)n);
					rt_dequant(t, wr, wf, n);
					for (int i = 0; i < n; i++)
						mag += fabs((double)wf[i] * x[i]);
					free(wf);
					ck_assert_msg(fabs(out[r] - vs) <= 1e-5 * mag + 1e-30,
					              "type %u n %d %s nr %d: %.9g vs scalar %.9g", t, n,
					              rt_dot_isa_name(isa), nr, out[r], vs);
				}
			}
		}
		free(w), free(x), free(xa);
	}
}
END_TEST

/* The xrows kernels (one weight row, several activation rows per call, for decode batches):
 * each of nx = 1..RT_DOT_XROWS activation rows gives the bits of the same level's dot of
 * that row alone, and agrees with the scalar kernel within 1e-5 of Σ|w·x| (the dequantised
 * weights, as above); the activation rows sit back to back at their act_bytes stride at
 * the end of a buffer of exactly their size (ASan: no read past the last one). */
START_TEST(test_xrows_kernels)
{
	static const int lens[] = { 32, 96, 576, 1536 };
	const uint32_t t = types[_i];
	g_rng = 777 + (uint32_t)_i;
	for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
		const int n = lens[li];
		if (n % rt_quant_block_values(t))
			continue;
		const size_t rb = rt_quant_row_bytes(t, n), ab = rt_dot_act_bytes(t, n);
		uint8_t *w = malloc(rb);
		float *x = malloc(sizeof(float) * (size_t)n * RT_DOT_XROWS);
		uint8_t *xa = aligned_alloc(64, ab * RT_DOT_XROWS);
		float *wf = malloc(sizeof(float) * (size_t)n);
		random_row(t, w, n);
		rt_dequant(t, w, wf, n);
		const rt_dot_kernel *ks = rt_dot_kernel_get(t, RT_ISA_SCALAR);
		for (int c = 0; c < RT_DOT_XROWS; c++) {
			for (int i = 0; i < n; i++)
				x[(size_t)c * n + i] = urand(-1.0f, 1.0f) * (rnd() % 97 == 0 ? 20.0f : 1.0f);
			ks->quant(x + (size_t)c * n, xa + ab * c, n);
		}
		for (int isa = RT_ISA_SCALAR; isa <= rt_dot_isa_best(); isa++) {
			const rt_dot_kernel *k = rt_dot_kernel_get(t, isa);
			if (!k->xrows)
				continue;
			for (int nx = 1; nx <= RT_DOT_XROWS; nx++) {
				float out[RT_DOT_XROWS];
				const int c0 = RT_DOT_XROWS - nx; /* the last nx rows: the buffer's end */
				k->xrows(w, xa + ab * c0, ab, n, nx, out);
				for (int c = 0; c < nx; c++) {
					const uint8_t *xc = xa + ab * (c0 + c);
					const float one = k->dot(w, xc, n), vs = ks->dot(w, xc, n);
					ck_assert_msg(memcmp(&out[c], &one, sizeof one) == 0,
					              "type %u n %d %s nx %d row %d: %.9g vs dot %.9g", t, n,
					              rt_dot_isa_name(isa), nx, c, out[c], one);
					double mag = 0.0;
					for (int i = 0; i < n; i++)
						mag += fabs((double)wf[i] * x[(size_t)(c0 + c) * n + i]);
					ck_assert_msg(fabs(out[c] - vs) <= 1e-5 * mag + 1e-30,
					              "type %u n %d %s nx %d: %.9g vs scalar %.9g", t, n,
					              rt_dot_isa_name(isa), nx, out[c], vs);
				}
			}
		}
		free(w), free(x), free(xa), free(wf);
	}
}
END_TEST

/* Every level's activation quantiser writes the scalar one's bytes: random blocks with
 * outliers, exact halves (x·(1/d) = k + 1/2 must round away from zero, as roundf does), a
 * zero block, one below the smallest scale, and blocks holding a NaN or an infinity. */
START_TEST(test_quant_levels_agree)
{
	enum { NB = 12, N = NB * 32 };
	g_rng = 31337;
	float x[N];
	for (int rep = 0; rep < 50; rep++) {
		for (int i = 0; i < N; i++)
			x[i] = urand(-1.0f, 1.0f) * (rnd() % 13 == 0 ? 40.0f : 1.0f);
		for (int j = 0; j < 32; j++) /* block 1: amax 127, so d = 1 and x / d = x */
			x[32 + j] = j == 0 ? 127.0f : (float)((int)(rnd() % 200) - 100) + 0.5f;
		for (int j = 0; j < 32; j++) {
			x[64 + j] = 0.0f;         /* block 2: zeros */
			x[96 + j] *= 1e-37f;      /* block 3: below the smallest scale */
		}
		x[128 + rnd() % 32] = NAN;        /* block 4 */
		x[160 + rnd() % 32] = -INFINITY;  /* block 5 */
		for (size_t ti = 0; ti < 3; ti++) {
			const uint32_t t = ti == 0 ? RT_GGML_Q4_0 : ti == 1 ? RT_GGML_Q4_1 : RT_GGML_Q8_0;
			const size_t bytes = rt_dot_act_bytes(t, N);
			uint8_t *ref = aligned_alloc(64, bytes), *got = aligned_alloc(64, bytes);
			memset(ref, 0, bytes);
			rt_dot_kernel_get(t, RT_ISA_SCALAR)->quant(x, ref, N);
			for (int isa = RT_ISA_AVX2; isa <= rt_dot_isa_best(); isa++) {
				memset(got, 0, bytes);
				rt_dot_kernel_get(t, isa)->quant(x, got, N);
				ck_assert_msg(memcmp(ref, got, bytes) == 0, "type %u %s: quantised bytes differ", t,
				              rt_dot_isa_name(isa));
			}
			free(ref), free(got);
		}
	}
}
END_TEST

/* One Q4_1 block by hand: d = 0.5, m = -1, nibble j = j % 16; x = 0.25 for values 0..15
 * and 2 for 16..31 (so the activation scale is 2/127 and the codes are round(15.875) = 16
 * and 127): dequantised w_j = 0.5·(j % 16) - 1, Σ_{j<16} (0.5j - 1) = 44, so
 * Σ w·x_quantised = 44·(16·2/127) + 44·2 = 99.0866141... */
START_TEST(test_q4_1_hand)
{
	uint8_t blk[20];
	put_f16(blk, 0.5f);
	put_f16(blk + 2, -1.0f);
	for (int j = 0; j < 16; j++)
		blk[4 + j] = (uint8_t)(j | (j << 4));
	float x[32];
	for (int j = 0; j < 32; j++)
		x[j] = j < 16 ? 0.25f : 2.0f;
	_Alignas(64) uint8_t xa[256];
	ck_assert_uint_le(rt_dot_act_bytes(RT_GGML_Q4_1, 32), sizeof xa);
	const double want = 44.0 * 32.0 / 127.0 + 88.0;
	for (int isa = RT_ISA_SCALAR; isa <= rt_dot_isa_best(); isa++) {
		const rt_dot_kernel *k = rt_dot_kernel_get(RT_GGML_Q4_1, isa);
		k->quant(x, xa, 32);
		ck_assert_msg(fabs(k->dot(blk, xa, 32) - want) < 1e-4, "%s: %.7g", rt_dot_isa_name(isa),
		              k->dot(blk, xa, 32));
	}
}
END_TEST

START_TEST(test_unsupported)
{
	ck_assert_ptr_null(rt_dot_kernel_get(RT_GGML_Q2_K, RT_ISA_SCALAR));
	ck_assert_uint_eq(rt_dot_act_bytes(RT_GGML_Q4_1, 33), 0);
	ck_assert_uint_eq(rt_dot_act_bytes(RT_GGML_Q4_K, 288), 0);
}
END_TEST

typedef struct pool_job {
	int *hits;  /* [n] */
	int n;
	int calls[8];
} pool_job;

static void pool_fn(void *a, int ith, int nth)
{
	pool_job *j = a;
	long lo, hi;
	rt_pool_range(j->n, ith, nth, &lo, &hi);
	for (long i = lo; i < hi; i++)
		j->hits[i]++;
	j->calls[ith]++;
}

START_TEST(test_pool_covers_every_index)
{
	rt_err err = { { 0 } };
	for (int nt = 1; nt <= 4; nt++) {
		rt_pool *p = rt_pool_create(nt, &err);
		ck_assert_msg(p != NULL, "%s", err.msg);
		ck_assert_int_eq(rt_pool_threads(p), nt);
		int hits[103] = { 0 };
		pool_job j = { hits, 103, { 0 } };
		for (int rep = 0; rep < 500; rep++)
			rt_pool_run(p, pool_fn, &j);
		for (int i = 0; i < 103; i++)
			ck_assert_int_eq(hits[i], 500);
		for (int t = 0; t < nt; t++)
			ck_assert_int_eq(j.calls[t], 500);
		rt_pool_free(p);
	}
	ck_assert_ptr_null(rt_pool_create(0, &err));
	ck_assert(strstr(err.msg, "1..256") != NULL);
	/* ranges: contiguous, ordered, sizes within one */
	long prev = 0;
	for (int t = 0; t < 7; t++) {
		long lo, hi;
		rt_pool_range(20, t, 7, &lo, &hi);
		ck_assert_int_eq(lo, prev);
		ck_assert(hi - lo == 2 || hi - lo == 3);
		prev = hi;
	}
	ck_assert_int_eq(prev, 20);
}
END_TEST

/* rt_matmul against the dequantised f32 product, for small and prefill-sized row counts
 * and 1 and 3 threads; the result must not depend on the thread count (bit-for-bit). */
START_TEST(test_matmul_threads_and_reference)
{
	const uint32_t t = types[_i];
	g_rng = 99 + (uint32_t)_i;
	const int in = is_k(t) ? 512 : 96, out = 150;
	const size_t rb = rt_quant_row_bytes(t, in);
	uint8_t *w = malloc(rb * out);
	float *wf = malloc(sizeof(float) * (size_t)in * out);
	for (int o = 0; o < out; o++) {
		random_row(t, w + rb * o, in);
		rt_dequant(t, w + rb * o, wf + (size_t)in * o, in);
	}
	rt_wmat W = { .type = t, .rows = out, .cols = in, .row_bytes = rb, .data = w };
	rt_err err = { { 0 } };
	static const int Cs[] = { 1, 3, 40 };
	for (int ci = 0; ci < 3; ci++) {
		const int C = Cs[ci];
		float *X = malloc(sizeof(float) * (size_t)C * in);
		float *Y1 = malloc(sizeof(float) * (size_t)C * out), *Y3 = malloc(sizeof(float) * (size_t)C * out);
		float *Yg = malloc(sizeof(float) * (size_t)C * out);
		for (int i = 0; i < C * in; i++)
			X[i] = urand(-1.0f, 1.0f);
		for (int nt = 1; nt <= 3; nt += 2) {
			rt_pool *p = rt_pool_create(nt, &err);
			rt_matmul_scratch s;
			ck_assert_int_eq(rt_matmul_scratch_init(&s, nt, C, in, &err), 0);
			rt_matmul(p, &s, nt == 1 ? Y1 : Y3, X, &W, &C, 1, 0);
			if (nt == 1) { /* the GEMM way whatever C, the scratch's rule left as it was */
				rt_matmul_gemm(p, &s, Yg, X, &W, &C, 1);
				ck_assert_int_eq(s.gemm_rows, RT_MATMUL_GEMM_ROWS);
			}
			rt_matmul_scratch_free(&s);
			rt_pool_free(p);
		}
		ck_assert_int_eq(memcmp(Y1, Y3, sizeof(float) * (size_t)C * out), 0);
		if (C >= RT_MATMUL_GEMM_ROWS) /* rt_matmul took the GEMM way itself */
			ck_assert_int_eq(memcmp(Y1, Yg, sizeof(float) * (size_t)C * out), 0);
		for (int r = 0; r < C; r++)
			for (int o = 0; o < out; o++) {
				double ref = 0.0, mag = 0.0, bound = 0.0;
				for (int i = 0; i < in; i++) {
					ref += (double)wf[(size_t)o * in + i] * X[(size_t)r * in + i];
					mag += fabs((double)wf[(size_t)o * in + i] * X[(size_t)r * in + i]);
					/* |x| < 1, so every activation scale is below 1/127 */
					bound += fabs((double)wf[(size_t)o * in + i]) / 127.0 / 2;
				}
				if (t == RT_GGML_F16 || t == RT_GGML_F32 || C >= RT_MATMUL_GEMM_ROWS)
					bound = 0.0; /* no activation quantisation */
				ck_assert_msg(fabs(Y1[(size_t)r * out + o] - ref) <= bound + 1e-5 * mag + 1e-30,
				              "type %u C %d row %d out %d: %.9g vs %.9g", t, C, r, o,
				              Y1[(size_t)r * out + o], ref);
				/* f32 activations: no quantisation bound even for one row */
				ck_assert_msg(fabs(Yg[(size_t)r * out + o] - ref) <= 1e-5 * mag + 1e-30,
				              "gemm way: type %u C %d row %d out %d: %.9g vs %.9g", t, C, r,
				              o, Yg[(size_t)r * out + o], ref);
			}
		free(X), free(Y1), free(Y3), free(Yg);
	}
	free(w), free(wf);
}
END_TEST

/* Batch invariance: rt_matmul over segments of 3, 20, six of 1 (a decode step's rows of
 * six sequences, taken RT_DOT_XROWS at a time where the kernel has an xrows form) and 17
 * rows (both ways in one call), and accumulating, gives every segment the bits of the
 * same rows multiplied alone (oracle: one call per segment), on 2 threads. */
START_TEST(test_matmul_segments_alone)
{
	const uint32_t t = types[_i];
	g_rng = 7 + (uint32_t)_i;
	const int in = is_k(t) ? 512 : 96, out = 150;
	static const int len[] = { 3, 20, 1, 1, 1, 1, 1, 1, 17 };
	enum { NSEG = 9, C = 46 };
	const size_t rb = rt_quant_row_bytes(t, in);
	uint8_t *w = malloc(rb * out);
	for (int o = 0; o < out; o++)
		random_row(t, w + rb * o, in);
	rt_wmat W = { .type = t, .rows = out, .cols = in, .row_bytes = rb, .data = w };
	float *X = malloc(sizeof(float) * (size_t)C * in);
	float *Yb = malloc(sizeof(float) * (size_t)C * out), *Ya = malloc(sizeof(float) * (size_t)C * out);
	for (int i = 0; i < C * in; i++)
		X[i] = urand(-1.0f, 1.0f);
	rt_err err = { { 0 } };
	rt_pool *p = rt_pool_create(2, &err);
	rt_matmul_scratch s;
	ck_assert_int_eq(rt_matmul_scratch_init(&s, 2, C, in, &err), 0);
	for (int acc = 0; acc <= 1; acc++) {
		for (int i = 0; i < C * out; i++)
			Yb[i] = Ya[i] = (float)(i % 7) - 3.0f;
		rt_matmul(p, &s, Yb, X, &W, len, NSEG, acc);
		for (int g = 0, r0 = 0; g < NSEG; r0 += len[g++])
			rt_matmul(p, &s, Ya + (size_t)r0 * out, X + (size_t)r0 * in, &W, &len[g], 1, acc);
		ck_assert_msg(memcmp(Yb, Ya, sizeof(float) * (size_t)C * out) == 0,
		              "type %u accumulate %d: a segment's rows differ from the rows alone", t, acc);
	}
	rt_matmul_scratch_free(&s);
	rt_pool_free(p);
	free(X), free(Yb), free(Ya), free(w);
}
END_TEST

/* rt_kvattn over f16 / Q8_0 rows, every ISA level, group sizes 3 and 4 (the 9/3 and 4/1
 * shapes), head_dim 64 and 96 (two DCH-free widths, one not a power of two) and an f16 width
 * with a tail (40). Oracle: attention over the stored, dequantised entries — rows decoded by
 * rt_kvq_vrow_decode (runtime/kv/rt_kvq.c, a separate implementation), scores and the
 * weighted sum in double. The decoded values are exact in both, so the kernels differ from
 * the oracle only by f32 rounding of the products and their sum: 1e-5·Σ|terms| + 1e-7. */
START_TEST(test_kvattn_vs_decoded_rows)
{
	static const int dims[3] = { 64, 96, 40 };
	enum { N = 37 };
	for (int ti = 0; ti < 2; ti++)
		for (int di = 0; di < 3; di++)
			for (int G = 3; G <= 4; G++)
				for (int isa = RT_ISA_SCALAR; isa <= rt_dot_isa_best(); isa++) {
					const enum rt_kv_type type = ti ? RT_KV_Q8_0 : RT_KV_F16;
					const rt_kvq_kind kind = ti ? RT_KVQ_Q8_0 : RT_KVQ_F16;
					const int d = dims[di];
					if (ti && d % 32)
						continue;
					const size_t rb = rt_kv_row_bytes(type, d);
					uint8_t *rows = malloc(N * rb);
					float *x = malloc(sizeof(float) * d), *dec = malloc(sizeof(float) * N * d);
					float *q = malloc(sizeof(float) * G * d), *P = malloc(sizeof(float) * G * N);
					float *S = malloc(sizeof(float) * G * N), *o = malloc(sizeof(float) * G * d);
					float *dk = malloc(sizeof(float) * N * d);
					for (int i = 0; i < N; i++) {
						for (int j = 0; j < d; j++)
							x[j] = urand(-3.0f, 3.0f);
						rt_kvq_vrow_encode(kind, x, d, rows + (size_t)i * rb);
						rt_kvq_vrow_decode(kind, rows + (size_t)i * rb, d, dec + (size_t)i * d);
					}
					for (int j = 0; j < G * d; j++)
						q[j] = urand(-1.0f, 1.0f);
					for (int j = 0; j < G * N; j++)
						P[j] = urand(0.0f, 1.0f) / N;
					const rt_kvattn_kernels *ka = rt_kvattn_get(type, isa);
					ck_assert_ptr_nonnull(ka);
					ka->decode(rows, N, d, dk);
					ck_assert(memcmp(dk, dec, sizeof(float) * N * d) == 0);
					ka->scores(rows, N, d, q, (size_t)d, G, 0.125f, S, N);
					ka->mix(rows, N, d, P, N, G, o, (size_t)d);
					for (int g = 0; g < G; g++) {
						for (int i = 0; i < N; i++) {
							double ref = 0, mag = 0;
							for (int j = 0; j < d; j++) {
								ref += (double)q[g * d + j] * dec[(size_t)i * d + j];
								mag += fabs((double)q[g * d + j] * dec[(size_t)i * d + j]);
							}
							ck_assert_msg(fabs(S[g * N + i] - 0.125 * ref) <= 0.125 * (1e-5 * mag + 1e-7),
							              "scores %s d %d G %d isa %d", rt_kv_type_name(type), d, G, isa);
						}
						for (int j = 0; j < d; j++) {
							double ref = 0, mag = 0;
							for (int i = 0; i < N; i++) {
								ref += (double)P[g * N + i] * dec[(size_t)i * d + j];
								mag += fabs((double)P[g * N + i] * dec[(size_t)i * d + j]);
							}
							ck_assert_msg(fabs(o[g * d + j] - ref) <= 1e-5 * mag + 1e-7,
							              "mix %s d %d G %d isa %d", rt_kv_type_name(type), d, G, isa);
						}
					}
					free(rows), free(x), free(dec), free(q), free(P), free(S), free(o), free(dk);
				}
	ck_assert_ptr_null(rt_kvattn_get(RT_KV_F32, RT_ISA_SCALAR));
}
END_TEST

static Suite *dot_suite(void)
{
	Suite *s = suite_create("dot");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_kernels_vs_dequantised_and_scalar, 0, N_TYPES);
	tcase_add_loop_test(tc, test_rows_kernels, 0, N_TYPES);
	tcase_add_loop_test(tc, test_xrows_kernels, 0, N_TYPES);
	tcase_add_test(tc, test_quant_levels_agree);
	tcase_add_test(tc, test_q4_1_hand);
	tcase_add_test(tc, test_kvattn_vs_decoded_rows);
	tcase_add_test(tc, test_unsupported);
	tcase_add_test(tc, test_pool_covers_every_index);
	tcase_add_loop_test(tc, test_matmul_threads_and_reference, 0, N_TYPES);
	tcase_add_loop_test(tc, test_matmul_segments_alone, 0, N_TYPES);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	/* rt_matmul calls sgemm from the pool's threads (see rt_matmul.h) */
	openblas_set_num_threads(1);
	int nf = check_run(dot_suite());
	return nf == 0 ? 0 : 1;
}
