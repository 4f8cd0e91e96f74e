/*
 * rt_matmul: the fast path's matrix products; see rt_matmul.h.
 */
#include "model/rt_matmul.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "model/rt_dot.h"
#include "model/rt_gguf.h"
#include "model/rt_quant.h"

/* one type per distinct activation format (32-blocks, 256-blocks, f32): a row of the
 * activation scratch holds all three, so one job may mix weight types */
static const uint32_t act_types[] = { RT_GGML_Q4_0, RT_GGML_Q4_K, RT_GGML_F32 };

int rt_matmul_scratch_init(rt_matmul_scratch *s, int n_threads, int max_rows, int max_in,
                           rt_err *err)
{
	memset(s, 0, sizeof *s);
	if (n_threads < 1 || n_threads > 256 || max_rows < 1 || max_in < 1 || max_in > (1 << 20) ||
	    max_rows > (1 << 20))
		return rt_err_set(err, "matmul: invalid scratch shape (%d threads, %d rows, %d columns)",
		                  n_threads, max_rows, max_in);
	size_t stride = 0;
	for (size_t i = 0; i < sizeof act_types / sizeof act_types[0]; i++) {
		stride += rt_dot_act_bytes(act_types[i], max_in);
	}
	s->act_stride = stride;
	s->act = aligned_alloc(64, stride * (size_t)max_rows);
	s->tiles = aligned_alloc(64, (size_t)n_threads * RT_MATMUL_TILE * (size_t)max_in * sizeof(float));
	if (!s->act || !s->tiles) {
		rt_matmul_scratch_free(s);
		return rt_err_set(err, "matmul: cannot allocate scratch for %d rows of %d on %d threads",
		                  max_rows, max_in, n_threads);
	}
	s->n_threads = n_threads;
	s->gemm_rows = RT_MATMUL_GEMM_ROWS;
	s->max_rows = max_rows;
	s->max_in = max_in;
	return 0;
}

void rt_matmul_scratch_free(rt_matmul_scratch *s)
{
	free(s->act);
	free(s->tiles);
	memset(s, 0, sizeof *s);
}

int rt_matmul_supported(uint32_t type, int cols)
{
	return rt_dot_kernel_get(type, RT_ISA_SCALAR) && rt_dot_act_bytes(type, cols) > 0 &&
	       rt_quant_row_bytes(type, cols) > 0;
}

typedef struct mm_job {
	rt_matmul_scratch *s;
	int n, in, accumulate, nth;
	int gemm_rows;       /* segments of this many rows or more take the GEMM way */
	const int *len;      /* [nseg] the rows of each segment of X (consecutive) */
	int nseg;
	const float *X;
	float *const *Y;
	const rt_wmat *const *W;
	const rt_dot_kernel *k[4];
	size_t act_off[4];   /* byte offset of matrix i's quantised rows within each act row */
	long row0[5];        /* prefix sums of rows (dot path) or tiles (gemm path) */
	atomic_long next;    /* the dot path's next chunk */
	int n_dot;           /* rows of X on the dot path (dot_xrows when several) */
} mm_job;

/* A segment of len rows takes the GEMM path (1) or the dot path (0): by its own size,
 * never by the call's total, so a row's bits do not depend on the other segments. */
static int seg_gemm(const mm_job *j, int len)
{
	return len >= j->gemm_rows;
}

/* the matrix holding global index g of a prefix-sum table */
static int which(const long *row0, int n, long g)
{
	int i = 0;
	while (i + 1 < n && g >= row0[i + 1])
		i++;
	return i;
}

/* Rows [r0, r1) of matrix i against every dot-way row of X, RT_DOT_XROWS activation rows
 * per kernel call (rt_dot_xrows_fn: each output has dot's bits): a decode step's rows of
 * several sequences share the decoding of each weight block. */
static void dot_xrows(mm_job *j, int i, long r0, long r1)
{
	const size_t st = j->s->act_stride;
	const rt_wmat *W = j->W[i];
	const rt_dot_xrows_fn xr = j->k[i]->xrows;
	const uint8_t *act = j->s->act + j->act_off[i];
	float *Y = j->Y[i];
	const int out = W->rows;
	for (long r = r0; r < r1; r++) {
		const uint8_t *wr = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
		int sg = 0, c0 = 0;
		while (sg < j->nseg) {
			if (seg_gemm(j, j->len[sg])) {
				c0 += j->len[sg++];
				continue;
			}
			int c1 = c0; /* a run of consecutive dot-way segments: rows [c0, c1) */
			while (sg < j->nseg && !seg_gemm(j, j->len[sg]))
				c1 += j->len[sg++];
			for (int c = c0; c < c1; c += RT_DOT_XROWS) {
				const int nx = c1 - c < RT_DOT_XROWS ? c1 - c : RT_DOT_XROWS;
				float v[RT_DOT_XROWS];
				xr(wr, act + (size_t)c * st, st, j->in, nx, v);
				for (int k = 0; k < nx; k++) {
					float *y = Y + (size_t)(c + k) * out + r;
					*y = j->accumulate ? *y + v[k] : v[k];
				}
			}
			c0 = c1;
		}
	}
}

/* Rows [lo, hi) of the job's concatenated matrices, every output of X's rows. */
static void dot_rows(mm_job *j, long lo, long hi)
{
	const size_t st = j->s->act_stride;
	for (long g = lo; g < hi;) {
		const int i = which(j->row0, j->n, g);
		const rt_wmat *W = j->W[i];
		const long end = hi < j->row0[i + 1] ? hi : j->row0[i + 1];
		const rt_dot_fn dot = j->k[i]->dot;
		const rt_dot_rows_fn rows = j->k[i]->rows;
		const uint8_t *act = j->s->act + j->act_off[i];
		float *Y = j->Y[i];
		const int out = W->rows;
		if (!rows && j->k[i]->xrows && j->n_dot > 1) {
			dot_xrows(j, i, g - j->row0[i], end - j->row0[i]);
			g = end;
			continue;
		}
		/* RT_DOT_ROWS rows per call where the kernel has a rows form (each row's value is
		 * the same bits as dot's, so the grouping does not change results) */
		for (long r = g - j->row0[i], re = end - j->row0[i]; r < re;) {
			const int nr = rows && re - r >= RT_DOT_ROWS ? RT_DOT_ROWS : 1;
			const uint8_t *wr = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
			for (int sg = 0, c0 = 0; sg < j->nseg; c0 += j->len[sg++]) {
				if (seg_gemm(j, j->len[sg]))
					continue;
				for (int c = c0; c < c0 + j->len[sg]; c++) {
					float v[RT_DOT_ROWS];
					if (nr > 1)
						rows(wr, W->row_bytes, act + (size_t)c * st, j->in, nr, v);
					else
						v[0] = dot(wr, act + (size_t)c * st, j->in);
					float *y = Y + (size_t)c * out + r;
					for (int k = 0; k < nr; k++)
						y[k] = j->accumulate ? y[k] + v[k] : v[k];
				}
			}
			r += nr;
		}
		g = end;
	}
}

/* The dot path's threads take chunks of DOT_CHUNK rows from a shared counter, as ggml's
 * mul_mat does: a thread that starts late or is descheduled on a busy machine leaves its
 * rows to the others instead of holding up the product. A chunk is a multiple of
 * RT_DOT_ROWS and of 16 floats (no two threads write one cache line when C = 1). */
#define DOT_CHUNK 64

static void dot_job(void *a, int ith, int nth)
{
	mm_job *j = a;
	(void)nth;
	if (ith >= j->nth)
		return;
	const long total = j->row0[j->n], chunks = (total + DOT_CHUNK - 1) / DOT_CHUNK;
	for (;;) {
		const long c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		if (c >= chunks)
			break;
		dot_rows(j, c * DOT_CHUNK, (c + 1) * DOT_CHUNK < total ? (c + 1) * DOT_CHUNK : total);
	}
}

static void gemm_job(void *a, int ith, int nth)
{
	mm_job *j = a;
	if (ith >= j->nth)
		return;
	nth = j->nth;
	float *tile = j->s->tiles + (size_t)ith * RT_MATMUL_TILE * (size_t)j->s->max_in;
	const int in = j->in;
	for (long t = ith; t < j->row0[j->n]; t += nth) {
		const int i = which(j->row0, j->n, t);
		const rt_wmat *W = j->W[i];
		const int o0 = (int)(t - j->row0[i]) * RT_MATMUL_TILE;
		const int nr = W->rows - o0 < RT_MATMUL_TILE ? W->rows - o0 : RT_MATMUL_TILE;
		const float *B;
		if (W->type == RT_GGML_F32 && ((uintptr_t)W->data & 3) == 0) {
			B = (const float *)((const uint8_t *)W->data + (size_t)o0 * W->row_bytes);
		} else {
			rt_dequant(W->type, (const uint8_t *)W->data + (size_t)o0 * W->row_bytes, tile,
			           (int64_t)nr * in);
			B = tile;
		}
		/* one sgemm per segment: OpenBLAS's bits for a row depend on the call's row count */
		for (int sg = 0, c0 = 0; sg < j->nseg; c0 += j->len[sg++])
			if (seg_gemm(j, j->len[sg]))
				cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->len[sg], nr, in, 1.0f,
				            j->X + (size_t)c0 * in, in, B, in, j->accumulate ? 1.0f : 0.0f,
				            j->Y[i] + (size_t)c0 * W->rows + o0, W->rows);
	}
}

/* The job's units for one way (gemm: tiles of RT_MATMUL_TILE rows of W, else rows of
 * W) and, for the dot way, the rows of X's dot segments quantised once per distinct
 * activation format (matrices whose kernels share a quant function share them). */
static void job_prepare(mm_job *j, int gemm)
{
	rt_matmul_scratch *s = j->s;
	size_t off = 0;
	for (int i = 0; i < j->n; i++) {
		const rt_wmat *W = j->W[i];
		long units = gemm ? (W->rows + RT_MATMUL_TILE - 1) / RT_MATMUL_TILE : W->rows;
		j->row0[i + 1] = j->row0[i] + units;
		if (gemm)
			continue;
		int same = -1;
		for (int k = 0; k < i; k++)
			if (j->k[k]->quant == j->k[i]->quant && j->k[k]->block == j->k[i]->block)
				same = k;
		if (same >= 0) {
			j->act_off[i] = j->act_off[same];
			continue;
		}
		const size_t need = rt_dot_act_bytes(W->type, j->in);
		RT_ASSERT(need > 0 && off + need <= s->act_stride);
		j->act_off[i] = off;
		for (int sg = 0, c0 = 0; sg < j->nseg; c0 += j->len[sg++])
			for (int c = c0; !seg_gemm(j, j->len[sg]) && c < c0 + j->len[sg]; c++)
				j->k[i]->quant(j->X + (size_t)c * j->in,
				               s->act + (size_t)c * s->act_stride + off, j->in);
		off += need;
	}
}

static void run(rt_pool *p, rt_matmul_scratch *s, int n, float *const *Y, const float *X,
                const rt_wmat *const *W, const int *len, int nseg, int accumulate,
                int gemm_rows)
{
	RT_ASSERT(n >= 1 && n <= 4 && nseg >= 1 && gemm_rows >= 1);
	mm_job j = { .s = s, .n = n, .in = W[0]->cols, .accumulate = accumulate, .X = X,
		     .Y = Y, .W = W, .len = len, .nseg = nseg, .gemm_rows = gemm_rows };
	RT_ASSERT(j.in <= s->max_in);
	int C = 0, dot_rows_n = 0;
	for (int sg = 0; sg < nseg; sg++) {
		RT_ASSERT(len[sg] >= 1);
		C += len[sg];
		dot_rows_n += seg_gemm(&j, len[sg]) ? 0 : len[sg];
	}
	RT_ASSERT(C <= s->max_rows);
	j.n_dot = dot_rows_n;
	j.nth = rt_pool_threads(p) < s->n_threads ? rt_pool_threads(p) : s->n_threads;
	for (int i = 0; i < n; i++) {
		RT_ASSERT(W[i]->cols == j.in);
		j.k[i] = rt_dot_kernel_get(W[i]->type, rt_dot_isa_best());
		RT_ASSERT(j.k[i] != NULL);
	}
	if (dot_rows_n > 0) {
		atomic_init(&j.next, 0);
		job_prepare(&j, 0);
		rt_pool_run(p, dot_job, &j);
	}
	if (dot_rows_n < C) {
		job_prepare(&j, 1);
		rt_pool_run(p, gemm_job, &j);
	}
}

void rt_matmul(rt_pool *p, rt_matmul_scratch *s, float *Y, const float *X, const rt_wmat *W,
               const int *len, int nseg, int accumulate)
{
	run(p, s, 1, &Y, X, &W, len, nseg, accumulate, s->gemm_rows);
}

void rt_matmul_gemm(rt_pool *p, rt_matmul_scratch *s, float *Y, const float *X,
                    const rt_wmat *W, const int *len, int nseg)
{
	run(p, s, 1, &Y, X, &W, len, nseg, 0, 1);
}

void rt_matmul_multi(rt_pool *p, rt_matmul_scratch *s, int n, float *const *Y,
                     const float *X, const rt_wmat *const *W, const int *len, int nseg)
{
	run(p, s, n, Y, X, W, len, nseg, 0, s->gemm_rows);
}
