/*
 * k_select_check.cu: GPU-vs-CPU check of the selection kernel (k_select.cuh against
 * k_select_topk of k_select.h) on random heads with many ties, equal positions' order
 * and NaN scores. `make cuda` builds it (build/cuda/k_select_check) and
 * scripts/gpu_check.sh runs it; by hand, on a machine with a GPU:
 *   nvcc -std=c++17 -Ikernels -Iruntime tests/cuda/k_select_check.cu -o build/k_select_check
 *   build/k_select_check      # prints "k_select_check: N heads identical" or the first mismatch
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "k_select.cuh"
#include "k_select.h"

#define CUDA_CHECK(x)                                                                     \
	do {                                                                                  \
		cudaError_t e_ = (x);                                                             \
		if (e_ != cudaSuccess) {                                                          \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));  \
			return 1;                                                                     \
		}                                                                                 \
	} while (0)

int main()
{
	const int H = 64;
	const int32_t cap = 1000;
	std::vector<float> score((size_t)H * cap);
	std::vector<int32_t> pos((size_t)H * cap), n(H), k(H);
	std::vector<uint8_t> cand((size_t)H * cap), keep_gpu((size_t)H * cap), keep_cpu((size_t)H * cap);
	srand(11);
	for (int h = 0; h < H; h++) {
		n[h] = 1 + rand() % cap;
		k[h] = rand() % (n[h] + 1);
		for (int32_t i = 0; i < n[h]; i++) {
			int r = rand() % 17;
			score[(size_t)h * cap + i] = r == 16 ? NAN : (float)(r % 5);
			pos[(size_t)h * cap + i] = i * 2 + (rand() % 2);
			cand[(size_t)h * cap + i] = rand() % 8 != 0;
		}
	}
	float *ds;
	int32_t *dp, *dn, *dk;
	uint8_t *dc, *dkeep;
	CUDA_CHECK(cudaMalloc(&ds, score.size() * sizeof(float)));
	CUDA_CHECK(cudaMalloc(&dp, pos.size() * sizeof(int32_t)));
	CUDA_CHECK(cudaMalloc(&dn, H * sizeof(int32_t)));
	CUDA_CHECK(cudaMalloc(&dk, H * sizeof(int32_t)));
	CUDA_CHECK(cudaMalloc(&dc, cand.size()));
	CUDA_CHECK(cudaMalloc(&dkeep, cand.size()));
	CUDA_CHECK(cudaMemcpy(ds, score.data(), score.size() * sizeof(float), cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaMemcpy(dp, pos.data(), pos.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaMemcpy(dn, n.data(), H * sizeof(int32_t), cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaMemcpy(dk, k.data(), H * sizeof(int32_t), cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaMemcpy(dc, cand.data(), cand.size(), cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaMemset(dkeep, 0, cand.size()));
	CUDA_CHECK(k_cu_select_launch(ds, dp, dc, dn, dk, cap, dkeep, H, 0));
	CUDA_CHECK(cudaDeviceSynchronize());
	CUDA_CHECK(cudaMemcpy(keep_gpu.data(), dkeep, cand.size(), cudaMemcpyDeviceToHost));
	std::vector<k_cand> buf(cap), tmp(cap);
	for (int h = 0; h < H; h++) {
		size_t o = (size_t)h * cap;
		k_select_topk(&score[o], &pos[o], &cand[o], n[h], k[h], &keep_cpu[o], buf.data(), tmp.data());
		for (int32_t i = 0; i < n[h]; i++)
			if (keep_cpu[o + i] != keep_gpu[o + i]) {
				printf("k_select_check: head %d entry %d: cpu %d gpu %d\n", h, i, keep_cpu[o + i],
				       keep_gpu[o + i]);
				return 1;
			}
	}
	printf("k_select_check: %d heads identical\n", H);
	cudaFree(ds);
	cudaFree(dp);
	cudaFree(dn);
	cudaFree(dk);
	cudaFree(dc);
	cudaFree(dkeep);
	return 0;
}
