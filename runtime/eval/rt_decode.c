/*
 * rt_decode: greedy or sampled decoding on a sequence; see rt_decode.h.
 */
#include "eval/rt_decode.h"

#include <string.h>

int64_t rt_decode(rt_seq *s, const rt_tokenizer *tk, rt_sampler *smp, float *logits,
                  int64_t n_gen, char *text, size_t cap, FILE *out, rt_err *err)
{
	size_t used = 0;
	if (cap)
		text[0] = 0;
	int64_t gen = 0;
	while (gen < n_gen) {
		int32_t t = smp ? rt_sample(smp, logits) : rt_argmax(logits, s->m->hp.n_vocab);
		if (rt_tokenizer_is_eog(tk, t))
			break;
		char piece[256];
		int nb = rt_token_to_bytes(tk, t, piece, (int)sizeof piece);
		if (nb > (int)sizeof piece)
			nb = (int)sizeof piece;
		if (nb > 0) {
			if (out) {
				fwrite(piece, 1, (size_t)nb, out);
				fflush(out);
			}
			if (used + (size_t)nb < cap) {
				memcpy(text + used, piece, (size_t)nb);
				used += (size_t)nb;
				text[used] = 0;
			}
		}
		gen++;
		if (gen >= n_gen || rt_seq_seen(s) >= s->m->hp.n_ctx || rt_seq_seen(s) >= s->cap)
			break;
		if (rt_seq_feed(s, &t, 1, logits, RT_LOGITS_LAST, err) != 0)
			return -1;
	}
	return gen;
}
