/*
 * rt_gemm: one single-precision matrix product, C = alpha · A · Bᵀ, by OpenBLAS's
 * cblas_sgemm (row-major, A not transposed, B transposed). It sits in base/ so that the
 * policy kernels (kernels/, which may include only base/, kv/ and policy/) and the model
 * share the same BLAS call and therefore the same rounding.
 *
 * Shapes: A [m × k] with row stride lda, B [n × k] with row stride ldb, C [m × n] with row
 * stride ldc, all float, row-major; C is overwritten (beta 0). m, n or k of 0 leaves C
 * untouched. Nothing is allocated; no errors. Threading: whatever the process set for
 * OpenBLAS (runtime/model/rt_matmul.h sets one thread when its pool runs).
 */
#ifndef RT_GEMM_H
#define RT_GEMM_H

void rt_gemm_nt_f32(int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                    int ldb, float *C, int ldc);

#endif
