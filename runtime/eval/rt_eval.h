/*
 * rt_eval: perplexity and KL evaluation, the quality figures every KV policy is compared
 * by, in ONE loop (rt_eval_runs) that `ppl` (one run or a --batch of runs), `ab`'s task
 * ppl and the tests all use. Token i+1 is scored from the logits after tokens 0..i
 * (teacher forcing), i = 0..n-2:
 *   NLL_i = logsumexp(logits_i) - logits_i[t_{i+1}]   (logsumexp in double)
 *   ppl   = exp(mean NLL)
 * K policy runs and, optionally, the full-cache reference P are fed the same tokens in
 * lockstep, block by block; every scored token of every run is compared with P in the
 * same step (rt_stats_token_cmp: KL(P||Q), same top-1, dp), so no run's logits are kept
 * beyond one block. The text is fed in chunks (rt_seq splits them further at the policy's
 * triggers), so memory is bounded by the block, not the text. Also writes the per-token
 * dump (JSON lines), raw logits for reference comparisons, and the one-object JSON summary
 * of rt_eval_ppl.
 */
#ifndef RT_EVAL_H
#define RT_EVAL_H

#include <stdint.h>
#include <stdio.h>

#include "eval/rt_stats.h"
#include "model/rt_model.h"
#include "policy/rt_seq.h"
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

/* ---- the loop ------------------------------------------------------------------------ */

/* What one run of rt_eval_runs scored. Initialise with rt_eval_score_init, release with
 * rt_eval_score_free. */
typedef struct rt_eval_score {
	double nll;            /* sum over scored tokens of -log q(t), nats (rt_logprob) */
	int64_t scored;        /* tokens scored */
	int64_t hits;          /* scored tokens that were q's argmax */
	int64_t compressed;    /* scored tokens predicted from a cache the policy had already
	                        * compressed (position > rt_seq_stats.first_compress_seen);
	                        * 0 with scored > 0: the run measured the full cache, not the
	                        * policy (rt_eval_uncompressed) */
	int64_t after_call;    /* scored tokens after compress first ran at all (position >
	                        * rt_seq_stats.first_call_seen), whether or not it changed
	                        * the cache: 0 means the budget was never even applied */
	rt_kld_acc acc;        /* with a reference: every scored token's rt_tok_cmp */
	double *nll_tok;       /* NULL, or caller-owned [n - 1]: nll_tok[i] = NLL of token i+1
	                        * (with a reference rt_tok_cmp.nll_q, else -rt_logprob) */
	int64_t failed_at;     /* -1, or the block offset at which the run failed and left */
	char error[512];       /* "" or why it failed (the sequence's or the batch's message) */
} rt_eval_score;

void rt_eval_score_init(rt_eval_score *s);
void rt_eval_score_free(rt_eval_score *s);

/* Which tokens are the prompt and which are scored. One rule for ppl's warnings, ab, tune,
 * `kvpc build --gate` and scripts/results/results.sh (docs/measuring.md, "The protocol"). */
typedef struct rt_eval_split {
	enum kvp_measure measure; /* the protocol */
	int64_t prompt;          /* ctx.prompt_len of every sequence, 1..n */
	int64_t score_from;      /* first scored position, 1..n-1 */
} rt_eval_split;

/* KVP_MEASURE_PROMPT_END when any of p[0..K) is a prompt-end policy (they are fed the same
 * tokens, so one split serves all), else KVP_MEASURE_STREAM. */
enum kvp_measure rt_eval_measure_of(const struct kvp_policy *const *p, int K);

/* The split of n >= 2 tokens under protocol m: STREAM, the whole text is the prompt and
 * every token is scored (prompt n, from 1: a ratio budget is a fixed n / R entries per head
 * from the first token); PROMPT_END, the first half is the prompt and the tokens after it
 * are scored (prompt n / 2, from n / 2 + 1, as `ppl --prompt n/2 --score-from n/2+1`: the
 * policy compresses once, after token n / 2 - 1, and every scored token is predicted from
 * that cache). prompt >= 1 (a user's --prompt N, N < n) replaces the prompt and, with
 * from < 1, scores from N + 1; from >= 1 (--score-from P) replaces the first scored
 * position. */
void rt_eval_split_of(enum kvp_measure m, int64_t n, int64_t prompt, int64_t from,
                      rt_eval_split *out);

/* needle's and `ab --task needle`'s protocol for the policies p[0..K) when no --mode is
 * given: 1, question-agnostic (the context is prefilled and compressed, then the question
 * follows, so the policy cannot see it: kvpress's question-agnostic setting, a cache
 * reused for questions not yet asked), when any is a prompt-end policy
 * (rt_eval_measure_of); else 0, question-aware (the question inside the prompt: a
 * streaming policy compresses as it streams in either way, and its budget then counts
 * the question too). docs/measuring.md, "Needle". */
int rt_eval_needle_agnostic(const struct kvp_policy *const *p, int K);

/* "stream" or "prompt_end": the protocol's name in tables and JSON. */
const char *rt_eval_measure_name(enum kvp_measure m);

/* 1 when a run of a compressing policy scored tokens but none from a compressed cache:
 * its KL is the full cache's (0), not the policy's. */
int rt_eval_uncompressed(const struct kvp_policy *p, const rt_eval_score *s);

/* How rt_eval_runs feeds and what it writes besides the scores. */
typedef struct rt_eval_loop {
	int block;              /* tokens per lockstep step, >= 1 */
	int batched;            /* 1: all sequences through one rt_seq_batch (each block's weight
	                         * GEMMs once for all; logits K+1 × block × n_vocab floats);
	                         * 0: the reference, then each run, fed one after the other
	                         * (2 × block × n_vocab floats; each run's figures are those of
	                         * a separate run, bit for bit); always so when a sequence runs
	                         * on a device (rt_seq_attach) */
	int64_t score_from;     /* score positions >= score_from (>= 1; 0 means 1) */
	FILE *dump;             /* NULL, or run 0's per-token JSON lines:
	                         * {"pos":P,"token":T,"logprob":L,"top1":A} (P the scored
	                         * token's position, L = log q(T | tokens < P), natural log, A
	                         * q's argmax, lowest id on ties) plus "logprob_ref" and "kld"
	                         * with a reference */
	const char *dump_name;  /* for its write error */
	FILE *logits;           /* NULL, or run 0's raw little-endian f32 logits [n × n_vocab],
	                         * row i after tokens 0..i */
	const char *logits_name;
	float *logprob_out;     /* NULL or [n - 1]: run 0's log q(t_{i+1}) */
	int32_t *top1_out;      /* NULL or [n - 1]: run 0's argmax at i */
	/* NULL, or called after every block with the tokens fed so far and n */
	void (*progress)(void *user, int64_t done, int64_t total);
	void *progress_user;
} rt_eval_loop;

/* Feed tokens[0..n) (n >= 2) to the K >= 1 sequences runs[0..K) and, when ref is not NULL,
 * to the full-cache reference ref, all at the same start, in lockstep blocks of o->block
 * tokens, scoring every run's tokens into scores[0..K) (initialised by the caller) and
 * comparing them with the reference's. *ref_nll (may be NULL) receives the reference's
 * summed NLL over the same scored tokens. A run whose policy fails (a compress error,
 * "KV cache full") leaves the loop with scores[k].error and failed_at set; the others go
 * on. Returns 0, or -1 with err set when the reference fails ("the full-cache reference
 * failed: ..."), a forward error stops the batch, a logit is not finite, or dump/logits
 * cannot be written ("NAME: write failed"). Allocates one block's logits per call. */
int rt_eval_runs(rt_seq *const *runs, int K, rt_seq *ref, const int32_t *tokens, int64_t n,
                 const rt_eval_loop *o, rt_eval_score *scores, double *ref_nll, rt_err *err);

/* Perplexity of tokens[0..n) (n >= 2, n <= the model's context_length) under the full
 * cache (every token kept: capacity n entries per head): rt_eval_runs over one
 * rt_policy_full sequence, chunks of o->chunk tokens. logprob_out and top1_out are
 * NULL or [n - 1] arrays receiving, for scored position i+1, log p(t_{i+1}) and the
 * argmax. Returns 0, or -1 with err ("PATH: reason") on bad sizes, allocation failure,
 * a forward error or a write error on dump/logits. */
int rt_eval_ppl(const rt_model *m, const int32_t *tokens, int64_t n, const rt_ppl_opts *o,
                float *logprob_out, int32_t *top1_out, rt_ppl_result *res, rt_err *err);

/* Log-softmax of one logits row at index `tok` (natural log, logsumexp in double) and the
 * row's argmax (lowest index on ties) in *top1 (may be NULL). */
double rt_logprob(const float *logits, int n_vocab, int32_t tok, int32_t *top1);

/* The `kvrt ppl --json` object (one line): policy, model, model_sha256, text, tokens,
 * scored, ppl, nll_mean, top1_acc, seconds, tokens_per_s, kv_entries_peak, kv_bytes_peak,
 * threads, chunk. text and model_sha256 may be NULL (then omitted); non-finite numbers
 * are written as null. */
void rt_eval_json(FILE *out, const rt_model *m, const char *model_sha256, const char *text,
                  const char *policy, const rt_ppl_result *r, int threads, int chunk);

#endif
