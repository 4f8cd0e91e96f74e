/*
 * rt_eval: perplexity evaluation of a model over a token sequence, the quality figure
 * every KV policy is compared by. Token i+1 is scored from the logits after tokens
 * 0..i (teacher forcing), i = 0..n-2:
 *   NLL_i = logsumexp(logits_i) - logits_i[t_{i+1}]   (logsumexp in double)
 *   ppl   = exp(mean NLL)
 * The text is fed in chunks through rt_model_forward (chunked prefill), so memory is
 * bounded by the chunk, not the text. Also writes the per-token dump (JSON lines), raw
 * logits for reference comparisons, and the one-object JSON summary of `kvrt ppl --json`.
 */
#ifndef RT_EVAL_H
#define RT_EVAL_H

#include <stdint.h>
#include <stdio.h>

#include "model/rt_model.h"
#include "base/rt_util.h"

typedef struct rt_ppl_opts {
	int chunk;        /* tokens per forward call, >= 1 (also the internal chunk) */
	FILE *dump;       /* NULL, or one JSON line per scored token:
	                   * {"pos":P,"token":T,"logprob":L,"top1":A} with P the scored
	                   * token's position (1..n-1), T its id, L = log p(T | tokens < P)
	                   * (natural log), A the model's argmax at P (lowest id on ties) */
	FILE *logits;     /* NULL, or raw little-endian f32 logits [n × n_vocab], row i after
	                   * tokens 0..i (the last row has no scored successor) */
} rt_ppl_opts;

typedef struct rt_ppl_result {
	int64_t tokens;          /* tokens fed (n) */
	int64_t scored;          /* tokens scored (n - 1) */
	double nll_sum;          /* nats */
	double nll_mean;         /* nats per scored token */
	double ppl;              /* exp(nll_mean) */
	int64_t top1_hits;       /* scored tokens that were the model's argmax */
	double seconds;          /* wall time of the forward passes and scoring */
	double tokens_per_s;     /* tokens / seconds */
	int64_t kv_entries_peak; /* max entries held over all (layer, KV head) lists */
	int64_t kv_bytes_peak;   /* the bytes those entries occupied (rt_kv_bytes_used) */
} rt_ppl_result;

/* Perplexity of tokens[0..n) (n >= 2, n <= the model's context_length) under the full
 * cache (every token kept: capacity n entries per head). logprob_out and top1_out are
 * NULL or [n - 1] arrays receiving, for scored position i+1, log p(t_{i+1}) and the
 * argmax. Returns 0, or -1 with err ("PATH: reason") on bad sizes, allocation failure,
 * a forward error or a write error on dump/logits. */
int rt_eval_ppl(const rt_model *m, const int32_t *tokens, int64_t n, const rt_ppl_opts *o,
                float *logprob_out, int32_t *top1_out, rt_ppl_result *res, rt_err *err);

/* Log-softmax of one logits row at index `tok` (natural log, logsumexp in double) and the
 * row's argmax (lowest index on ties) in *top1. */
double rt_logprob(const float *logits, int n_vocab, int32_t tok, int32_t *top1);


/* The `kvrt ppl --json` object (one line): policy, model, model_sha256, text, tokens,
 * scored, ppl, nll_mean, top1_acc, seconds, tokens_per_s, kv_entries_peak, kv_bytes_peak,
 * threads, chunk. text and model_sha256 may be NULL (then omitted); non-finite numbers
 * are written as null. */
void rt_eval_json(FILE *out, const rt_model *m, const char *model_sha256, const char *text,
                  const char *policy, const rt_ppl_result *r, int threads, int chunk);

#endif
