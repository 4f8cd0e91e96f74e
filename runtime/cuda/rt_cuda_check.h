/*
 * rt_cuda_check: every CUDA runtime and cuBLAS call of libkvrt_cuda goes through these
 * macros, which turn a failure into an rt_err "FILE:LINE: CALL: REASON" (the error
 * string of cudaGetErrorString / cublasGetStatusString) and `return -1` from the caller,
 * or `goto fail` for the _GOTO forms (the caller's cleanup label). CUDA/C++ only.
 */
#ifndef RT_CUDA_CHECK_H
#define RT_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "base/rt_util.h"
}

#define RT_CU_TRY(err, call)                                                                  \
	do {                                                                                      \
		cudaError_t e_ = (call);                                                              \
		if (e_ != cudaSuccess)                                                                \
			return rt_err_set((err), "%s:%d: %s: %s", __FILE__, __LINE__, #call,              \
			                  cudaGetErrorString(e_));                                        \
	} while (0)

#define RT_CUBLAS_TRY(err, call)                                                              \
	do {                                                                                      \
		cublasStatus_t s_ = (call);                                                           \
		if (s_ != CUBLAS_STATUS_SUCCESS)                                                      \
			return rt_err_set((err), "%s:%d: %s: %s", __FILE__, __LINE__, #call,              \
			                  cublasGetStatusString(s_));                                     \
	} while (0)

#define RT_CU_GOTO(err, call)                                                                 \
	do {                                                                                      \
		cudaError_t e_ = (call);                                                              \
		if (e_ != cudaSuccess) {                                                              \
			rt_err_set((err), "%s:%d: %s: %s", __FILE__, __LINE__, #call,                     \
			           cudaGetErrorString(e_));                                               \
			goto fail;                                                                        \
		}                                                                                     \
	} while (0)

#define RT_CUBLAS_GOTO(err, call)                                                             \
	do {                                                                                      \
		cublasStatus_t s_ = (call);                                                           \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
			rt_err_set((err), "%s:%d: %s: %s", __FILE__, __LINE__, #call,                     \
			           cublasGetStatusString(s_));                                            \
			goto fail;                                                                        \
		}                                                                                     \
	} while (0)

#endif
