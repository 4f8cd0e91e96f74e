/*
 * rt_ab_int: the state of one A/B run (runtime/eval/rt_ab.h), private to the engine
 * (rt_ab.c, which fills it) and its reports (rt_ab_report.c, which only read it).
 */
#ifndef RT_AB_INT_H
#define RT_AB_INT_H

#include <stdint.h>

#include "base/rt_progress.h"
#include "eval/rt_ab.h"
#include "eval/rt_compression.h"
#include "eval/rt_eval.h"
#include "eval/rt_stats.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_seq.h"

#define AB_MAX_TRIALS 256

/* One policy at one ratio. */
typedef struct ab_side {
	double ratio;         /* the ratio it runs at: the row's, or under --equal-memory the
	                         one matching the other side's memory */
	rt_seq seq;
	int ready;            /* seq initialised */
	int ratio_applied;    /* 0: the policy never compresses, it keeps every token */
	double *nll;          /* [n_scored] per-token NLL (ppl task) */
	rt_kld_summary sum;
	rt_seq_stats st;      /* ppl: the run's counters; needle: summed over trials */
	rt_compression x;     /* ppl: the run's; needle: the mean over the trials */
	rt_compression xt[AB_MAX_TRIALS]; /* needle: each trial's */
	int64_t scored, compressed; /* ppl: tokens scored, of them from a compressed cache */
	int hits, trials;
	uint8_t ok[AB_MAX_TRIALS];
	unsigned notes;       /* KVP_NOTE_* of its run (needle: of any trial): what a graceful
	                         budget did (rt_pick_note_next), so a floor is not hidden */
} ab_side;

typedef struct ab_row {
	double ratio;
	ab_side side[2];
	rt_boot_ci ci;        /* ppl: mean NLL difference B - A */
	int n01, n10;         /* needle: trials only B / only A got right */
	double p_value;       /* needle: exact two-sided sign test on n01 vs n10 */
	int better;           /* 0 tie, 1 A, 2 B */
	int significant;
	char verdict[1200];  /* a refusal's reason (up to 800 bytes, notes included), then the measured verdict */
} ab_row;

typedef struct ab_run {
	rt_ab_opts o;
	const struct kvp_policy *pol[2];
	rt_model *m;
	rt_tokenizer *tok;
	char model_sha[65], text_sha[65];
	int32_t *tokens;
	int64_t n;                /* tokens used (ppl) */
	rt_eval_split split;      /* ppl: the prompt and the scored positions of every sequence */
	char *text;               /* --text, read before the model (load_text takes it) */
	size_t text_len;
	ab_row rows[RT_AB_MAX_RATIOS];
	rt_seq ref;
	int ref_ready;
	rt_seq_stats ref_st;
	rt_compression ref_x;
	double ref_nll_sum;
	int ref_hits, ref_trials;
	int threads;
	rt_progress prog;         /* tokens (ppl) or sequence-trials (needle) done */
} ab_run;

#endif
