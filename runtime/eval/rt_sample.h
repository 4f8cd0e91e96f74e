/*
 * rt_sample: next-token sampling for the server and `BIN run` (through the one decoder,
 * runtime/eval/rt_decode.h) — temperature, top-k, top-p (nucleus,
 * Holtzman et al. 2020, arXiv 1904.09751) with a per-request seeded generator, in the
 * order llama.cpp's sampler chain applies them (top-k, then top-p over the renormalised
 * softmax at the temperature, then a draw). Temperature 0 is greedy: the most likely
 * token, lowest id on ties — exactly `BIN run`'s choice.
 */
#ifndef RT_SAMPLE_H
#define RT_SAMPLE_H

#include <stdint.h>

typedef struct rt_sampler {
	double temperature; /* >= 0; 0 = greedy */
	double top_p;       /* (0, 1]; 1 = off */
	int top_k;          /* >= 0; 0 = off */
	uint64_t state;     /* generator state (splitmix64), from the seed */
	int32_t *idx;       /* [n_vocab] scratch: candidate ids */
	double *prob;       /* [n_vocab] scratch: their probabilities */
	int n_vocab;
} rt_sampler;

/* Set up for a vocabulary of n_vocab (allocates the scratch: 12·n_vocab bytes). Returns
 * 0, or -1 when out of memory. */
int rt_sampler_init(rt_sampler *s, int n_vocab, double temperature, double top_p, int top_k,
                    uint64_t seed);
void rt_sampler_free(rt_sampler *s);

/* The next token from logits[0..n_vocab) (not modified). */
int32_t rt_sample(rt_sampler *s, const float *logits);

#endif
