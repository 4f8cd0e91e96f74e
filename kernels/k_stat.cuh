/*
 * k_stat.cuh: the statistic updates and read-outs of kernels/k_stat.h for both sides
 * (device kernels and host references), one function per function of k_stat.h with the
 * same storage (4-byte words, floats stored bit-exactly) and the same arithmetic order,
 * so a statistic updated on the GPU from the same probabilities holds the same bits as on
 * the CPU when the device code is compiled without FMA contraction (--fmad=false, as the
 * generated policy units are). Versions: 1. CPU reference: kernels/k_stat.h itself
 * (tests/cuda compare the two on the host).
 */
#ifndef K_STAT_CUH
#define K_STAT_CUH

#include <stdint.h>
#include <string.h>

#include "k_cu.cuh"

K_CU_HD uint32_t *k_cu_stat_block(uint8_t *stats, size_t stat_bytes, int32_t i)
{
	return (uint32_t *)(void *)(stats + (size_t)i * stat_bytes);
}

K_CU_HD const uint32_t *k_cu_stat_cblock(const uint8_t *stats, size_t stat_bytes, int32_t i)
{
	return (const uint32_t *)(const void *)(stats + (size_t)i * stat_bytes);
}

K_CU_HD float k_cu_stat_getf(const uint32_t *w)
{
	float f;
	memcpy(&f, w, sizeof f);
	return f;
}

K_CU_HD void k_cu_stat_setf(uint32_t *w, float f)
{
	memcpy(w, &f, sizeof f);
}

K_CU_HD void k_cu_stat_sum(uint32_t *w, double x)
{
	k_cu_stat_setf(w, k_cu_stat_getf(w) + (float)x);
}

K_CU_HD void k_cu_stat_count(uint32_t *w, double cond)
{
	if (cond != 0)
		k_cu_stat_setf(w, k_cu_stat_getf(w) + 1.0f);
}

K_CU_HD void k_cu_stat_ema(uint32_t *w, double x, double alpha)
{
	k_cu_stat_setf(w, (float)((1.0 - alpha) * k_cu_stat_getf(w) + alpha * x));
}

K_CU_HD void k_cu_stat_last(uint32_t *w, double x)
{
	k_cu_stat_setf(w, (float)x);
}

K_CU_HD void k_cu_stat_ring_put(uint32_t *ring, int32_t W, int64_t step, double x)
{
	k_cu_stat_setf(&ring[step % W], (float)x);
}

K_CU_HD void k_cu_stat_ring_put_bit(uint32_t *ring, int32_t W, int64_t step, double cond)
{
	int64_t b = step % W;
	uint32_t m = 1u << (b & 31);
	if (cond != 0)
		ring[b >> 5] |= m;
	else
		ring[b >> 5] &= ~m;
}

K_CU_HD double k_cu_stat_ring_sum(const uint32_t *ring, int32_t W)
{
	double s = 0;
	for (int32_t j = 0; j < W; j++)
		s += k_cu_stat_getf(&ring[j]);
	return s;
}

K_CU_HD int k_cu_popcount(uint32_t x)
{
#ifdef __CUDA_ARCH__
	return __popc(x);
#else
	return __builtin_popcount(x);
#endif
}

K_CU_HD double k_cu_stat_ring_count(const uint32_t *ring, int32_t W)
{
	int32_t c = 0;
	for (int32_t j = 0; j < (W + 31) / 32; j++)
		c += k_cu_popcount(ring[j]);
	return c;
}

K_CU_HD int k_cu_stat_in_prompt_tail(int64_t step, int64_t prompt_len, double w)
{
	return prompt_len >= 0 && step < prompt_len && (double)step >= (double)prompt_len - w;
}

K_CU_HD double k_cu_stat_tail_steps(int64_t seen, int64_t prompt_len, double w)
{
	if (prompt_len < 0)
		return 0;
	double start = (double)prompt_len - w, end = (double)(seen < prompt_len ? seen : prompt_len);
	if (start < 0)
		start = 0;
	return end > start ? end - start : 0;
}

K_CU_HD double k_cu_stat_mean(double sum, double steps)
{
	return steps > 0 ? sum / steps : 0.0;
}

/* The scalar signals of kernels/k_signal.h and kernels/k_score.h's k_norm, by value. */
K_CU_HD double k_cu_context(int64_t prompt_len, double seen)
{
	if (prompt_len >= 0 && seen <= (double)prompt_len)
		return (double)prompt_len;
	return seen;
}

K_CU_HD double k_cu_prompt_len(int64_t prompt_len, double seen)
{
	return prompt_len >= 0 ? (double)prompt_len : seen;
}

K_CU_HD double k_cu_norm(const float *x, int d)
{
	double s = 0;
	for (int j = 0; j < d; j++)
		s += (double)x[j] * x[j];
	return sqrt(s);
}

#endif
