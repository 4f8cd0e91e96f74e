/*
 * rt_cli_cuda: `--device cpu|cuda` for the runtime's command line. ppl and bench build
 * their sequences as on the CPU (rt_seq, the one engine: rt_eval_runs, the reports) and
 * hand each one to the device with rt_cli_device_attach; on the CPU that is a no-op. On
 * `--device cuda` the device is the CUDA backend a binary built with `kvpc build --cuda`
 * carries (runtime/cuda/rt_cuda.h, struct rt_cuda_backend: rt_cuda_seq_attach); a binary
 * without it, or a machine without an NVIDIA driver and GPU, gets one line on stderr
 * naming why and exit status 1. docs/cuda.md.
 */
#ifndef RT_CLI_CUDA_H
#define RT_CLI_CUDA_H

#include "cli/rt_cli_opts.h"
#include "model/rt_model.h"
#include "policy/rt_seq.h"

/* 1 when the options ask for a device other than the CPU (--device cuda). */
int rt_cli_on_device(const rt_cli_opts *o);

/* Check the device options of command cmd before any model is read: on the CPU, --f16 is
 * a usage error; on cuda, --fast and a --kv-type other than f32 are (the GPU takes the
 * exact path's f32 weights, or their f16 copy with --f16, and stores f32 keys and
 * values), then a binary without the CUDA backend and a machine without a usable GPU are
 * runtime errors ("PROG: CMD --device cuda: no CUDA device: REASON"). Returns 0, or the
 * exit status after printing the error (2 usage, 1 runtime). */
int rt_cli_device_check(const char *cmd, const rt_cli_opts *o);

/* Upload model m (loaded on the exact path) to the device once, for the sequences
 * rt_cli_device_attach moves there; no-op on the CPU. Returns 0, or 1 after printing the
 * error (device memory, a failing call). */
int rt_cli_device_open(const char *cmd, const rt_cli_opts *o, const rt_model *m);

/* Move sequence s (rt_seq_init'ed, its options applied, not yet fed) to the device opened
 * by rt_cli_device_open, with the CUDA unit compiled from its policy; no-op on the CPU.
 * Errors (-1, err): the policy has no CUDA unit in this binary, or the backend refuses it
 * (rt_cuda_seq_attach's errors). */
int rt_cli_device_attach(rt_seq *s, rt_err *err);

/* The weights the device holds ("f32" or "f16"), NULL on the CPU: for reports. */
const char *rt_cli_device_weights(void);

/* Free what rt_cli_device_open uploaded (after every attached sequence is freed). */
void rt_cli_device_close(void);

#endif
