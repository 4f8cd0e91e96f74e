/*
 * rt_tune: the quality gate. Decide the acceptable quality loss first, then compress as
 * far as it allows: for one policy, measure the quality at a compression ratio R (the
 * budget override of rt_seq_set_ratio: context / R entries per (layer, KV head)) on the
 * user's own texts, and search a grid of ratios for the highest one within the limits.
 *
 * The ratio counts entries or bytes (rt_tune_opts.bytes): in entries R is the budget override
 * of rt_seq_set_ratio; in bytes it is rt_seq_set_byte_ratio's, a budget of 1/R of the bytes
 * of an f16 full cache of the context per (layer, KV head), which a precision policy spends
 * on entries at its tiers (kernels/k_tier.h) and any other policy on f16 entries. A policy
 * whose own tiers already store fewer bytes than the budget (KIVI-style: nothing evicted,
 * every old entry at a fixed low tier) is not constrained by it, nor is one whose floor or
 * guards raised the budget on every text: the point records that (rt_tune_point_binds),
 * because baking such a budget in would change nothing. A prompt-end policy's compression
 * is its prompt's after the compress.
 *
 * Quality at R (rt_tune_measure):
 *   - every text's mean KL(P || Q) per scored token, nats, against the full cache P fed the
 *     same tokens in the same pass (the one perplexity/KL loop, rt_eval_runs), under the
 *     policy's measurement protocol (rt_eval_split_of, compiled from its trigger): a
 *     streaming policy gets the whole text as its prompt, as `ppl` without --prompt (a
 *     fixed budget of n / R entries per head from the first token, every token scored); a
 *     prompt-end policy (`compress at prompt end`) gets the first n / 2 tokens as its
 *     prompt (budget n / 2 / R) and is scored on the tokens after it, as
 *     `ppl --prompt n/2 --score-from n/2+1` and scripts/results/results.sh's prompt-end runs. A
 *     text on which the policy compressed before no scored token fails the ratio with that
 *     reason (its KL would be the full cache's 0). The limit holds when EVERY text's mean
 *     KL is at most max_kld, so one bad text cannot hide behind an average; the frontier
 *     also reports the token-weighted mean over the texts;
 *   - optionally, passkey accuracy (rt_needle_passkey + rt_needle_trial, question-aware,
 *     greedy, 8 answer tokens) over one prompt of passkey_len tokens per depth; the limit
 *     holds when accuracy >= min_passkey;
 *   - the compression reached (rt_compression.h: entries and bytes, at the end and at
 *     peak), averaged over the texts.
 * A ratio at which the policy cannot run (guards above the budget, "KV cache full") fails
 * the limits, with the reason kept in the point.
 *
 * A parameter instead of a ratio (rt_tune_opts.param, `tune --param NAME=LIST`): the grid
 * holds values of one policy parameter, set at each point with no budget override, for a
 * policy whose compression follows a parameter rather than a budget: `budget =
 * threshold(level)` keeps per head the entries whose score reaches the level (KVzap's and
 * DMS's rule), so the level is what trades quality for entries.
 *
 * Search (rt_tune_search): bisection over the increasing grid, assuming quality falls as R
 * grows (as a threshold level rises): with lo the highest ratio known to pass (none at first) and hi the lowest known to
 * fail (none at first), measure the middle grid point and move lo or hi to it, until they
 * are neighbours: about log2(grid size) measurements. The chosen ratio is lo (the grid
 * point after it, when there is one, was measured and failed), or, for a ratio search, the
 * lowest ratio measured that passes and reaches lo's compression within 1%.
 */
#ifndef RT_TUNE_H
#define RT_TUNE_H

#include <stdint.h>

#include "eval/rt_compression.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_policy.h"
#include "base/rt_util.h"

#define RT_TUNE_MAX_GRID 32
#define RT_TUNE_MAX_TEXTS 32
#define RT_TUNE_MAX_DEPTHS 32

/* One text of the gate: its tokens (borrowed) and the name its messages use. */
typedef struct rt_tune_text {
	const char *name;
	const int32_t *ids;
	int64_t n;               /* tokens, >= 2 */
} rt_tune_text;

/* What the gate measures and its limits. */
typedef struct rt_tune_opts {
	double max_kld;          /* limit on every text's mean KL, nats per token, >= 0 */
	double min_passkey;      /* limit on passkey accuracy in [0, 1], or < 0: no passkey */
	int64_t passkey_len;     /* passkey prompt tokens (with min_passkey >= 0) */
	double depths[RT_TUNE_MAX_DEPTHS]; /* passkey needle depths, percent */
	int n_depths;
	uint64_t seed;           /* passkey seed: prompt d's key is drawn from seed + d */
	int block;               /* tokens per lockstep block of the KL pass, >= 1 */
	int bytes;               /* 1: R is a compression factor in bytes (rt_seq_set_byte_ratio),
	                            0: in entries (rt_seq_set_ratio) */
	int param;               /* -1: the grid holds ratios; else the index of the policy
	                            parameter each grid value sets, with no ratio override (a
	                            `budget = threshold(L)` policy's level: tune --param) */
} rt_tune_opts;

/* The quality at one ratio. */
typedef struct rt_tune_point {
	double ratio;            /* R, in entries or in bytes (rt_tune_opts.bytes), or the
	                            parameter's value (rt_tune_opts.param) */
	int bytes;               /* rt_tune_opts.bytes of the measurement */
	double kld_mean;         /* token-weighted mean KL over every text, nats */
	double kld_worst;        /* the largest text mean KL */
	int worst;               /* index of that text */
	double kld_text[RT_TUNE_MAX_TEXTS]; /* each text's mean KL */
	double entries_x;        /* compression in entries, mean over the texts: at the end, or
	                            a prompt-end policy's prompt at its compress (what its
	                            budget was asked of; the end also counts the continuation) */
	double bytes_x;          /* the same in bytes against an f16 full cache */
	rt_compression x;        /* the compression (rt_compression.h), mean over the texts */
	enum kvp_measure measure; /* the protocol the texts were measured under */
	int passkey_ok, passkey_n; /* correct trials, trials (0 without passkey) */
	int pass;                /* 1: within every limit */
	unsigned notes;          /* KVP_NOTE_* of any text's run: a floor or guards raised the
	                            budget, so the point's compression is theirs, not R's */
	unsigned raised_all;     /* of KVP_NOTE_FLOOR | KVP_NOTE_GUARDS, the bits every text's run
	                            has (the budget in force was theirs on every text) */
	int by_param;            /* R is a parameter's value (rt_tune_opts.param), not a ratio */
	char error[512];         /* "" or why the policy could not run at R (then pass = 0) */
} rt_tune_point;

/* Measure policy p (with parameters params[0..p->n_params), e.g. the defaults) at ratio R
 * (>= 1) on texts[0..n_texts) (1..RT_TUNE_MAX_TEXTS) into *pt and judge it against o's
 * limits. tk may be NULL without passkey. Returns 0 (also when the policy fails at R: then
 * pt->error says why), or -1 with err set (a forward error, out of memory, a passkey
 * prompt that cannot be built at passkey_len). */
int rt_tune_measure(const rt_model *m, const rt_tokenizer *tk, const struct kvp_policy *p,
                    const double *params, const rt_tune_text *texts, int n_texts,
                    const rt_tune_opts *o, double R, rt_tune_point *pt, rt_err *err);

/* 1 when the budget at pt's ratio constrains the policy: not when a floor or the guards
 * raised it on every text (pt->raised_all: the budget in force was theirs, the same at any
 * higher ratio; a parameter search is not judged so); else always for an entry ratio; for
 * a byte ratio unless nothing was evicted and the bytes stored are below the budget (bytes
 * x more than 2% above R: the policy's tiers alone compress further than R asks). */
int rt_tune_point_binds(const rt_tune_point *pt);

/* Bisection over grid[0..n_grid) (strictly increasing, each >= 1, 1..RT_TUNE_MAX_GRID) as
 * described above. The measured points go to walked[0..*n_walked) in increasing ratio
 * order (at most n_grid); *chosen is the index in walked of the highest passing ratio, or
 * -1 when even grid[0] fails; for a ratio search (not --param) the lowest passing ratio
 * measured that reaches that one's compression within 1% (a floor or the guards held the
 * budget).
 * Returns 0, or -1 with err set (rt_tune_measure's errors). */
int rt_tune_search(const rt_model *m, const rt_tokenizer *tk, const struct kvp_policy *p,
                   const double *params, const rt_tune_text *texts, int n_texts,
                   const rt_tune_opts *o, const double *grid, int n_grid,
                   rt_tune_point *walked, int *n_walked, int *chosen,
                   void (*progress)(void *user, const rt_tune_point *pt), void *user,
                   rt_err *err);

#endif
