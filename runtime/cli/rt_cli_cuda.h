/*
 * rt_cli_cuda: `--device cpu|cuda` for the runtime's command line. `--device cuda` runs
 * `ppl` and `bench` on the GPU through the CUDA backend a binary built with
 * `kvpc build --cuda` carries (runtime/cuda/rt_cuda.h, struct rt_cuda_backend); a binary
 * without it, or a machine without an NVIDIA driver and GPU, gets one line on stderr
 * naming why and exit status 1. docs/cuda.md.
 */
#ifndef RT_CLI_CUDA_H
#define RT_CLI_CUDA_H

#include "policy/rt_policy.h"

/* Remove `--device X` / `--device=X` from argv[1..argc) (argv[0] is the command) and
 * return X in *device ("cpu" when absent). Returns the new argc, or -1 when --device has
 * no value. */
int rt_cli_device_take(int argc, char **argv, const char **device);

/* Run command argv[0] (argc/argv as the command's own: argv[0] is "ppl" or "bench") on the
 * GPU. prog: the binary's name for messages; reg/n_reg: the C policies of the binary.
 * Returns the exit status: 0, 1 (no CUDA backend in this binary, no GPU, a runtime error),
 * 2 (usage). */
int rt_cli_cuda_run(const char *prog, int argc, char **argv, const struct kvp_policy *const *reg,
                    int n_reg);

#endif
