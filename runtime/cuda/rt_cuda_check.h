/*
 * rt_cuda_check: every CUDA runtime and cuBLAS call of libkvrt_cuda goes through these
 * macros, which turn a failure into an rt_err "FILE:LINE: CALL: REASON" (the error
 * string of cudaGetErrorString / cublasGetStatusString), classified by rt_cu_code (device
 * memory exhausted: RT_ERR_RESOURCE, else RT_ERR_INTERNAL), and `return -1` from the
 * caller, or `goto fail` for the _GOTO forms (the caller's cleanup label). CUDA/C++ only.
 */
#ifndef RT_CUDA_CHECK_H
#define RT_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "base/rt_util.h"
}

/* NULL when a CUDA runtime call's result e (or a cuBLAS call's status s) is success, else
 * its reason (cudaGetErrorString / cublasGetStatusString) */
static inline const char *rt_cu_why(cudaError_t e)
{
	return e == cudaSuccess ? NULL : cudaGetErrorString(e);
}

static inline const char *rt_cu_why(cublasStatus_t s)
{
	return s == CUBLAS_STATUS_SUCCESS ? NULL : cublasGetStatusString(s);
}

/* The rt_err class of a failed call: device memory exhausted (cudaMalloc's
 * cudaErrorMemoryAllocation, cuBLAS's CUBLAS_STATUS_ALLOC_FAILED for its workspace) is
 * RT_ERR_RESOURCE, a limit a smaller or later request may fit (the server answers 503);
 * every other failure (a launch, the driver, the device) is RT_ERR_INTERNAL (500). */
static inline enum rt_err_code rt_cu_code(cudaError_t e)
{
	return e == cudaErrorMemoryAllocation ? RT_ERR_RESOURCE : RT_ERR_INTERNAL;
}

static inline enum rt_err_code rt_cu_code(cublasStatus_t s)
{
	return s == CUBLAS_STATUS_ALLOC_FAILED ? RT_ERR_RESOURCE : RT_ERR_INTERNAL;
}

/* 1 after setting err to "FILE:LINE: CALL: REASON" with the class rt_cu_code when the
 * result r (a cudaError_t or cublasStatus_t) is not success; else 0 */
template <class R>
static inline int rt_cu_failed(R r, rt_err *err, const char *file, int line, const char *call)
{
	const char *why = rt_cu_why(r);
	if (!why)
		return 0;
	rt_err_setc(err, rt_cu_code(r), "%s:%d: %s: %s", file, line, call, why);
	return 1;
}

#define RT_CU_TRY(err, call)                                                                  \
	do {                                                                                      \
		if (rt_cu_failed((call), (err), __FILE__, __LINE__, #call))                           \
			return -1;                                                                        \
	} while (0)

#define RT_CUBLAS_TRY(err, call) RT_CU_TRY(err, call)

#define RT_CU_GOTO(err, call)                                                                 \
	do {                                                                                      \
		if (rt_cu_failed((call), (err), __FILE__, __LINE__, #call))                           \
			goto fail;                                                                        \
	} while (0)

#define RT_CUBLAS_GOTO(err, call) RT_CU_GOTO(err, call)

#endif
