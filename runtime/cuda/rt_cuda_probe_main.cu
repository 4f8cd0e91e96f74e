/*
 * cuda_probe: prints the first CUDA device's name and peak memory bandwidth and exits 0,
 * or prints why there is none ("no CUDA device: ...") and exits 1. `make cuda` and
 * scripts/gpu_check.sh use it to decide whether the device tests can run.
 * Build: make cuda (build/cuda/cuda_probe).
 */
#include <stdio.h>

#include "cuda/rt_cuda.h"

int main(void)
{
	char name[256];
	double gbps = 0;
	rt_err err = { "" };
	int n = rt_cuda_probe(name, sizeof name, &gbps, &err);
	if (n < 0) {
		printf("%s\n", err.msg);
		return 1;
	}
	printf("%d device(s); device 0: %s, peak memory bandwidth %.0f GB/s\n", n, name, gbps);
	return 0;
}
