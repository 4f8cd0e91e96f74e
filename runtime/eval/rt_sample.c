/*
 * rt_sample: temperature / top-k / top-p sampling; see rt_sample.h.
 */
#include "eval/rt_sample.h"

#include "base/rt_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int rt_sampler_init(rt_sampler *s, int n_vocab, double temperature, double top_p, int top_k,
                    uint64_t seed)
{
	memset(s, 0, sizeof *s);
	s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
	s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
	if (!s->idx || !s->prob) {
		rt_sampler_free(s);
		return -1;
	}
	s->n_vocab = n_vocab;
	s->temperature = temperature;
	s->top_p = top_p;
	s->top_k = top_k;
	s->state = seed;
	return 0;
}

void rt_sampler_free(rt_sampler *s)
{
	free(s->idx);
	free(s->prob);
	memset(s, 0, sizeof *s);
}

/* splitmix64 (Steele, Lea, Flood 2014): a uniform double in [0, 1) */
static double next_unit(rt_sampler *s)
{
	uint64_t z = (s->state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* descending logit, then ascending id */
static int cmp_desc(const void *a, const void *b, void *arg)
{
	const float *lg = arg;
	const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	if (lg[x] != lg[y])
		return lg[x] > lg[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

int32_t rt_sample(rt_sampler *s, const float *logits)
{
	const int V = s->n_vocab;
	if (s->temperature <= 0 || s->top_k == 1)
		return rt_argmax(logits, V);
	int n = V;
	for (int i = 0; i < V; i++)
		s->idx[i] = i;
	const int topk = s->top_k > 0 && s->top_k < V;
	if (topk || s->top_p < 1.0) {
		/* candidates best first (the top_k largest logits when top-k is on) */
		qsort_r(s->idx, (size_t)V, sizeof *s->idx, cmp_desc, (void *)logits);
		if (topk)
			n = s->top_k;
	}
	float mx = logits[s->idx[0]];
	for (int i = 1; i < n; i++)
		mx = logits[s->idx[i]] > mx ? logits[s->idx[i]] : mx;
	const double inv_t = 1.0 / s->temperature;
	double sum = 0;
	for (int i = 0; i < n; i++) {
		s->prob[i] = exp(((double)logits[s->idx[i]] - mx) * inv_t);
		sum += s->prob[i];
	}
	/* top-p: the smallest best-first prefix whose probability reaches top_p */
	if (s->top_p < 1.0) {
		double c = 0;
		int m = 0;
		while (m < n) {
			c += s->prob[m++] / sum;
			if (c >= s->top_p)
				break;
		}
		n = m;
		sum = 0;
		for (int i = 0; i < n; i++)
			sum += s->prob[i];
	}
	const double u = next_unit(s) * sum;
	double c = 0;
	for (int i = 0; i < n; i++) {
		c += s->prob[i];
		if (u < c)
			return s->idx[i];
	}
	return s->idx[n - 1];
}
