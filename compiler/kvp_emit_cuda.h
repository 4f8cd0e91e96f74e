/*
 * kvp_emit_cuda: the CUDA back end. Turns one checked struct kvp_ir — the same IR the C
 * emitter reads (compiler/kvp_emit_c.h) — into a CUDA C++ unit policy_NAME.cu that exports
 * `const struct kvp_cuda_policy kvp_cuda_policy_<symbol>` (runtime/cuda/rt_cuda_policy.h),
 * the device half of the policy whose C half is kvp_policy_<symbol>:
 *
 *   obs      the policy's statistic update as an observer functor instantiated into the
 *            attention kernel template (kernels/k_attn.cuh): one pass over a head's live
 *            entries computes the probabilities, the output and the statistics
 *   score    the per-entry score as a functor for the device compress pipeline
 *            (kernels/k_compact.cuh: score, pooling, group reduction, guards, selection
 *            with kernels/k_select.cuh's order, compaction), when the policy's pipeline
 *            is one the device covers (kvp_emit_cuda_device_compress); otherwise the
 *            runtime runs the C compress on a host copy of the store
 *
 * The unit compiles with nvcc -std=c++17 -Werror all-warnings and host -Wall -Wextra
 * -Werror (the Makefile's NVFLAGS); the emitted functors are __host__ __device__, so the
 * host tests run them against the C emitter's hooks. Same safety rules as the C emitter:
 * source text reaches the output only as escaped string literals and sanitised comments;
 * numbers are printed with %.17g. Deterministic (byte-identical for the same IR).
 */
#ifndef KVP_EMIT_CUDA_H
#define KVP_EMIT_CUDA_H

#include <stdio.h>

#include "kvp_emit.h"
#include "kvp_ir.h"

/* Emit the CUDA unit of ir (already passed kvp_ir_check) to out, with #line directives
 * as the C emitter's (opts, NULL: on, no switch back). Returns 0, or -1 when writing
 * fails. */
int kvp_emit_cuda(const struct kvp_ir *ir, const struct kvp_emit_opts *opts, FILE *out);

/* The CUDA registry unit for n policies names[0..n): the table of their CUDA policies
 * and `const struct rt_cuda_backend kvp_cuda_backend` (runtime/cuda/rt_cuda.h). Returns 0,
 * or -1 (err set) when two names map to one symbol or writing fails. */
int kvp_emit_cuda_registry(const char *const *names, int n, FILE *out, char *err, size_t err_len);

/* NULL when the device compress pipeline covers ir's compress, else why not (a phrase
 * such as "adaptive allocation across heads"). */
const char *kvp_emit_cuda_host_why(const struct kvp_ir *ir);

#endif
