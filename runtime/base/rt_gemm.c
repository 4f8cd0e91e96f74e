/*
 * rt_gemm: C = alpha · A · Bᵀ through cblas_sgemm; see rt_gemm.h.
 */
#include "base/rt_gemm.h"

#include <cblas.h>

void rt_gemm_nt_f32(int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                    int ldb, float *C, int ldc)
{
	if (m <= 0 || n <= 0 || k <= 0)
		return;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, alpha, A, lda, B, ldb, 0.0f,
	            C, ldc);
}
