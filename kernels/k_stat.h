/*
 * k_stat: per-entry statistic updates fused into the observe loop of a generated policy,
 * and their read-out at compress time. A statistic lives in 4-byte words of the entry's
 * statistics block (rt_kv_head.stats, zeroed on append): the shared words first
 * (stat_words_entry), then stat_words_qhead words for each query head of the group.
 *
 *   sum / count over the whole history   one float, += x (count: += (x != 0))
 *   ema(alpha)                           one float, s = (1 - alpha) s + alpha x
 *   last                                 one float, s = x
 *   sum/mean over the last W steps       W floats, a ring indexed by step % W: every
 *                                        step writes its cell for every visible entry,
 *                                        so the ring always holds exactly the last W
 *                                        steps (cells of steps before the entry existed
 *                                        stay 0, as the paper's zero padding)
 *   count over the last W steps          ceil(W/32) words, one bit per step, same ring
 *   mean                                 divides by the entry's visible-step counter
 *                                        (one shared float word, +1 per step)
 *
 * Scissorhands (arXiv 2305.17118) is count(attn < 1/seen) over the last 400 steps; H2O
 * (arXiv 2306.14048) is sum(attn) over the whole history; TOVA (arXiv 2401.06104) is
 * last(attn). CPU references for tests are the plain loops in tests/test_policies.c.
 *
 * Every function but k_stat_block is K_HD: the CUDA policies (kernels/k_attn.cuh,
 * k_compact.cuh) update and read the same words with the same arithmetic order, so a
 * statistic updated on the GPU from the same probabilities holds the same bits.
 */
#ifndef K_STAT_H
#define K_STAT_H

#include <stdint.h>
#include <string.h>

#include "k_abi.h"
#include "kv/rt_kv.h"

/* The statistics block of entry i in a head's stats [n × stat_bytes]: [stat_bytes / 4]
 * words. */
K_HD uint32_t *k_stat_at(uint8_t *stats, size_t stat_bytes, int32_t i)
{
	return (uint32_t *)(void *)(stats + (size_t)i * stat_bytes);
}

/* k_stat_at of a read-only stats array. */
K_HD const uint32_t *k_stat_cat(const uint8_t *stats, size_t stat_bytes, int32_t i)
{
	return (const uint32_t *)(const void *)(stats + (size_t)i * stat_bytes);
}

/* k_stat_at of a head of the store. */
static inline uint32_t *k_stat_block(const rt_kv *kv, const rt_kv_head *h, int32_t i)
{
	return k_stat_at(h->stats, kv->stat_bytes, i);
}

/* A statistic word read and written as the f32 it holds (bit copies, no aliasing). */
K_HD float k_stat_getf(const uint32_t *w)
{
	float f;
	memcpy(&f, w, sizeof f);
	return f;
}

K_HD void k_stat_setf(uint32_t *w, float f)
{
	memcpy(w, &f, sizeof f);
}

/* The one-float updates of the table above, on word w: sum (+= x), count (+= 1 when
 * cond != 0), ema (s = (1 - alpha) s + alpha x, in double, stored as f32), last (s = x). */
K_HD void k_stat_sum(uint32_t *w, double x)
{
	k_stat_setf(w, k_stat_getf(w) + (float)x);
}

K_HD void k_stat_count(uint32_t *w, double cond)
{
	if (cond != 0)
		k_stat_setf(w, k_stat_getf(w) + 1.0f);
}

K_HD void k_stat_ema(uint32_t *w, double x, double alpha)
{
	k_stat_setf(w, (float)((1.0 - alpha) * k_stat_getf(w) + alpha * x));
}

K_HD void k_stat_last(uint32_t *w, double x)
{
	k_stat_setf(w, (float)x);
}

/* Ring of W floats: store x as the value of `step`. */
K_HD void k_stat_ring_put(uint32_t *ring, int32_t W, int64_t step, double x)
{
	k_stat_setf(&ring[step % W], (float)x);
}

/* Ring of W bits: store (cond != 0) as the bit of `step`. */
K_HD void k_stat_ring_put_bit(uint32_t *ring, int32_t W, int64_t step, double cond)
{
	int64_t b = step % W;
	uint32_t m = 1u << (b & 31);
	if (cond != 0)
		ring[b >> 5] |= m;
	else
		ring[b >> 5] &= ~m;
}

/* Sum of a float ring, in cell order (deterministic). */
K_HD double k_stat_ring_sum(const uint32_t *ring, int32_t W)
{
	double s = 0;
	for (int32_t j = 0; j < W; j++)
		s += k_stat_getf(&ring[j]);
	return s;
}

/* Set bits of x (the device's __popc on the GPU). */
K_HD int k_popcount(uint32_t x)
{
#ifdef __CUDA_ARCH__
	return __popc(x);
#else
	return __builtin_popcount(x);
#endif
}

/* Set bits of a bit ring. */
K_HD double k_stat_ring_count(const uint32_t *ring, int32_t W)
{
	int32_t c = 0;
	for (int32_t j = 0; j < (W + 31) / 32; j++)
		c += k_popcount(ring[j]);
	return c;
}

/* 1 if the query at `step` lies in the observation window of the last w prompt tokens
 * (positions prompt_len - w .. prompt_len - 1). Unknown prompt length: never. */
K_HD int k_stat_in_prompt_tail(int64_t step, int64_t prompt_len, double w)
{
	return prompt_len >= 0 && step < prompt_len && (double)step >= (double)prompt_len - w;
}

/* Steps of the prompt tail processed by `seen` tokens (0..w). */
K_HD double k_stat_tail_steps(int64_t seen, int64_t prompt_len, double w)
{
	if (prompt_len < 0)
		return 0;
	double start = (double)prompt_len - w, end = (double)(seen < prompt_len ? seen : prompt_len);
	if (start < 0)
		start = 0;
	return end > start ? end - start : 0;
}

/* Mean of a sum over `steps` observations (0 when none). */
K_HD double k_stat_mean(double sum, double steps)
{
	return steps > 0 ? sum / steps : 0.0;
}

#endif
