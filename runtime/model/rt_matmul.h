/*
 * rt_matmul: Y = X·W^T (optionally Y += X·W^T) for a weight matrix kept in its GGUF block
 * type, split over the rows of W on an rt_pool. X's rows come in consecutive segments
 * (one per sequence of a batched chunk; one segment for a lone sequence), and each
 * segment takes one of two ways, chosen by its own row count C:
 *  - C < RT_MATMUL_GEMM_ROWS (decoding): each row of X is quantised once per call to the
 *    activation blocks rt_dot pairs with W's type, and every output element comes from an
 *    rt_dot kernel (weights read once, in their compressed form, for all such rows; up to
 *    RT_DOT_ROWS weight rows per call where the kernel has a rows form, else, for several
 *    such rows (a decode step of several sequences), up to RT_DOT_XROWS of them per call
 *    where it has an xrows form, which decodes each weight block once for all of them);
 *    the threads take chunks of 64 rows from a shared counter;
 *  - C >= RT_MATMUL_GEMM_ROWS (prefill, GEMM-bound): W is dequantised in tiles of
 *    RT_MATMUL_TILE rows into per-thread f32 scratch and multiplied by OpenBLAS's sgemm,
 *    one call per segment (X stays f32: no activation quantisation).
 * Every output element is computed by the same operations whatever the thread count
 * (rows are computed whole and a rows kernel gives each row dot's bits; tiles have fixed
 * boundaries) and whatever the other segments are (the way is the segment's, and
 * OpenBLAS, whose bits for a row depend on the call's row count, sees the segment
 * alone), so a sequence's results do not depend on what is stacked with it: a batch
 * gives each sequence the bits it gets alone with the same chunks.
 * OpenBLAS is called from the pool's threads: it must run single-threaded
 * (openblas_set_num_threads(1)) when the pool has more than one thread.
 */
#ifndef RT_MATMUL_H
#define RT_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "base/rt_pool.h"
#include "base/rt_util.h"

#define RT_MATMUL_GEMM_ROWS 16
#define RT_MATMUL_TILE 96

/* A weight matrix [rows × cols] in GGUF type `type`: row r at data + r·row_bytes. */
typedef struct rt_wmat {
	uint32_t type;
	int rows, cols;
	size_t row_bytes;
	const void *data;
} rt_wmat;

/* Scratch for matmuls of up to max_rows rows of X with up to max_in columns on up to
 * n_threads threads: the quantised activations and one f32 tile per thread. */
typedef struct rt_matmul_scratch {
	int n_threads, max_rows, max_in;
	/* segments of at least gemm_rows rows take the GEMM way: RT_MATMUL_GEMM_ROWS (what
	 * rt_matmul_scratch_init sets), or 1 for f32 activations at every size (evaluation
	 * that must measure the KV cache alone: rt_model_opts.f32_act) */
	int gemm_rows;
	size_t act_stride;  /* bytes per quantised row */
	uint8_t *act;       /* [max_rows × act_stride] */
	float *tiles;       /* [n_threads × RT_MATMUL_TILE × max_in] */
} rt_matmul_scratch;

/* Allocate; -1 with err on bad sizes or out of memory (s is then safe to free). */
int rt_matmul_scratch_init(rt_matmul_scratch *s, int n_threads, int max_rows, int max_in,
                           rt_err *err);
void rt_matmul_scratch_free(rt_matmul_scratch *s);

/* 1 when W's type has an rt_dot kernel and rt_quant decoder for its column count. */
int rt_matmul_supported(uint32_t type, int cols);

/* Y[C × W->rows] = X[C × W->cols]·W^T, or += when accumulate, where X's C rows are nseg
 * consecutive segments of len[0..nseg) rows each (every len >= 1; nseg = 1 and len = &C
 * for one sequence). C <= s->max_rows, W->cols <= s->max_in; uses min(pool threads,
 * s->n_threads) threads. */
void rt_matmul(rt_pool *p, rt_matmul_scratch *s, float *Y, const float *X, const rt_wmat *W,
               const int *len, int nseg, int accumulate);

/* Y = X·W^T as rt_matmul, every segment the GEMM way (f32 activations) whatever its size
 * and s->gemm_rows: the logits of a chunk's last row that took the GEMM way in its layers
 * (rt_model.c, logits_rows), so they have that way's bits though they are one row. */
void rt_matmul_gemm(rt_pool *p, rt_matmul_scratch *s, float *Y, const float *X,
                    const rt_wmat *W, const int *len, int nseg);

/* The same for n matrices with one input X (W[i]->cols equal), in one pool job per way:
 * Y[i] = X·W[i]^T. The matrices may be of different types. n <= 4. */
void rt_matmul_multi(rt_pool *p, rt_matmul_scratch *s, int n, float *const *Y,
                     const float *X, const rt_wmat *const *W, const int *len, int nseg);

#endif
