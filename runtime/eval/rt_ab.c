/*
 * rt_ab: the A/B engine of a per-deployment binary (`BIN ab`) — see rt_ab.h.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval/rt_ab.h"
#include "base/rt_outpath.h"
#include "base/rt_progress.h"
#include "base/rt_text.h"
#include "base/rt_sha256.h"
#include "eval/rt_compression.h"
#include "eval/rt_eval.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "eval/rt_needle.h"
#include "policy/rt_seq.h"
#include "eval/rt_stats.h"
#include "report/rt_json.h"
#include "report/rt_svg.h"
#include "model/rt_tokenizer.h"

#define AB_MAX_TRIALS 256

/* ---- options -------------------------------------------------------------------------- */

void rt_ab_opts_init(rt_ab_opts *o)
{
	memset(o, 0, sizeof *o);
	o->task = "ppl";
	o->mode = "aware"; /* as `needle`'s default */
	o->commit = "unknown";
	o->chunk = 512;
	o->resamples = RT_BOOT_DEFAULT_B;
	o->seed = RT_BOOT_DEFAULT_SEED;
	o->ratios[0] = 4;
	o->n_ratios = 1;
	o->prompt = -1;
	o->score_from = -1;
	o->lengths[0] = 1024;
	o->lengths[1] = 2048;
	o->n_lengths = 2;
	const double dd[5] = { 0, 25, 50, 75, 100 };
	memcpy(o->depths, dd, sizeof dd);
	o->n_depths = 5;
}

/* ---- the run ------------------------------------------------------------------------------ */

/* One policy at one ratio. */
typedef struct ab_side {
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
} ab_side;

typedef struct ab_row {
	double ratio;
	ab_side side[2];
	rt_boot_ci ci;        /* ppl: mean NLL difference B - A */
	int n01, n10;         /* needle: trials only B / only A got right */
	double p_value;       /* needle: exact two-sided sign test on n01 vs n10 */
	int better;           /* 0 tie, 1 A, 2 B */
	int significant;
	char verdict[600];
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

/* Apply the --set options of one side to seq. */
static int apply_sets(ab_run *r, int side, rt_seq *s, rt_err *err)
{
	for (int i = 0; i < r->o.n_sets[side]; i++) {
		const char *a = r->o.sets[side][i];
		char name[256];
		size_t len = (size_t)(strchr(a, '=') - a);
		snprintf(name, sizeof name, "%.*s", (int)(len < 255 ? len : 255), a);
		if (r->o.set_all[side][i] && kvp_policy_param_index(s->p, name) < 0)
			continue;
		if (rt_seq_set(s, a, err) != 0)
			return -1;
	}
	return 0;
}

static int check_sets(ab_run *r, rt_err *err)
{
	for (int i = 0; i < r->o.n_sets[0]; i++) {
		if (!r->o.set_all[0][i])
			continue;
		const char *a = r->o.sets[0][i];
		char name[256];
		size_t len = (size_t)(strchr(a, '=') - a);
		snprintf(name, sizeof name, "%.*s", (int)(len < 255 ? len : 255), a);
		if (kvp_policy_param_index(r->pol[0], name) < 0 &&
		    kvp_policy_param_index(r->pol[1], name) < 0)
			return rt_err_set(err, "--set %s: neither %s nor %s has a parameter '%s'", a,
			                  r->pol[0]->name, r->pol[1]->name, name);
	}
	return 0;
}

static int side_init(ab_run *r, ab_row *row, int side, int32_t cap, int64_t prompt_len,
                     rt_err *err)
{
	ab_side *s = &row->side[side];
	if (rt_seq_init(&s->seq, r->m, r->pol[side], cap, r->o.chunk, prompt_len, err) != 0)
		return -1;
	s->ready = 1;
	if (apply_sets(r, side, &s->seq, err) != 0)
		return -1;
	s->ratio_applied = r->pol[side]->compress != NULL;
	if (s->ratio_applied && (r->o.bytes ? rt_seq_set_byte_ratio(&s->seq, row->ratio, err)
	                                    : rt_seq_set_ratio(&s->seq, row->ratio, err)) != 0)
		return -1;
	return rt_seq_set_prefill_chunk(&s->seq, r->o.prefill_chunk, err);
}

/* 1 when the row's two sides may be compared: each compressed before some scored token
 * (ppl) and their compression at the end is within RT_AB_X_TOL of each other; else 0 with
 * the reason in why. */
static int ab_comparable(const ab_run *r, const ab_row *row, int needle, char *why, size_t cap)
{
	for (int s = 0; s < 2; s++) {
		const ab_side *sd = &row->side[s];
		if (!needle && r->pol[s]->compress && sd->scored > 0 && sd->compressed == 0) {
			snprintf(why, cap, "%s (%s) compressed before none of the %lld scored tokens, so "
			         "its figures are the full cache's (docs/measuring.md)", s ? "B" : "A",
			         r->pol[s]->name, (long long)sd->scored);
			return 0;
		}
	}
	const rt_compression *a = &row->side[0].x, *b = &row->side[1].x;
	if (!rt_compression_differ(a, b, RT_AB_X_TOL))
		return 1;
	snprintf(why, cap, "A (%s) holds %.2fx in entries and %.2fx in bytes at the end, B (%s) "
	         "%.2fx and %.2fx: they differ by more than %.0f%%, so a difference in quality is "
	         "one of memory, not of policy (compare at ratios where both reach the same "
	         "compression)", r->pol[0]->name, a->entries_end, a->bytes_end, r->pol[1]->name,
	         b->entries_end, b->bytes_end, RT_AB_X_TOL * 100);
	return 0;
}

/* A row whose sides cannot be compared: no winner, the reason first. */
static void verdict_refuse(ab_row *row, const char *why)
{
	char was[sizeof row->verdict];
	snprintf(was, sizeof was, "%s", row->verdict);
	row->better = 0;
	row->significant = 0;
	snprintf(row->verdict, sizeof row->verdict, "no winner: %.300s [as measured: %.250s]", why,
	         was);
}

/* Bootstrap and verdict of one ratio (ppl), over the scored positions. */
static int ppl_verdict(ab_run *r, ab_row *row, rt_err *err)
{
	const int64_t from = r->split.score_from, n = r->n - from;
	double *d = RT_MALLOC((size_t)n * sizeof *d);
	double *work = RT_MALLOC((size_t)r->o.resamples * sizeof *work);
	for (int64_t i = 0; i < n; i++) /* nll[pos - 1] is token pos's */
		d[i] = row->side[1].nll[from - 1 + i] - row->side[0].nll[from - 1 + i];
	int64_t L = rt_bootstrap_block_len_auto(d, n);
	int rc = rt_bootstrap_mean_ci(d, n, r->o.resamples, L, 0.95, r->o.seed, work, &row->ci, err);
	free(d);
	free(work);
	if (rc != 0)
		return -1;
	rt_verdict v = rt_verdict_of(&row->ci, &row->significant);
	row->better = v == RT_VERDICT_A_BETTER ? 1 : v == RT_VERDICT_B_BETTER ? 2 : 0;
	rt_verdict_format(&row->ci, r->pol[0]->name, r->pol[1]->name, NULL, NULL, row->verdict,
	                  sizeof row->verdict);
	char why[400];
	if (!ab_comparable(r, row, 0, why, sizeof why))
		verdict_refuse(row, why);
	return 0;
}

/* ab's progress through the evaluation loop: tokens of the lockstep pass. */
static void ppl_progress(void *user, int64_t done, int64_t total)
{
	(void)total;
	rt_progress_update(&((ab_run *)user)->prog, done);
}

/* Task ppl: the reference and every (ratio, side) run through the one evaluation loop
 * (rt_eval_runs), fed one after the other in blocks of at most 128 tokens. */
static int run_ppl(ab_run *r, rt_err *err)
{
	const int64_t n = r->n;
	const int32_t cap = (int32_t)n;
	const int K = 2 * r->o.n_ratios;
	if (r->o.prompt >= n || r->o.score_from >= n)
		return rt_err_set(err, "%s: %lld tokens: --prompt %lld / --score-from %lld must be "
		                  "below them", r->o.text, (long long)n, (long long)r->o.prompt,
		                  (long long)r->o.score_from);
	rt_eval_split_of(rt_eval_measure_of(r->pol, 2), n, r->o.prompt, r->o.score_from,
	                 &r->split);
	const int64_t prompt = r->split.prompt;
	if (rt_seq_init(&r->ref, r->m, &rt_policy_full, cap, r->o.chunk, prompt, err) != 0)
		return -1;
	r->ref_ready = 1;
	rt_seq *seqs[2 * RT_AB_MAX_RATIOS];
	rt_eval_score sc[2 * RT_AB_MAX_RATIOS];
	for (int k = 0; k < K; k++)
		rt_eval_score_init(&sc[k]);
	int rc = 0;
	for (int k = 0; k < r->o.n_ratios && rc == 0; k++)
		for (int s = 0; s < 2 && rc == 0; s++) {
			ab_side *sd = &r->rows[k].side[s];
			rc = side_init(r, &r->rows[k], s, cap, prompt, err);
			sd->nll = RT_MALLOC((size_t)(n - 1) * sizeof(double));
			sc[2 * k + s].nll_tok = sd->nll;
			seqs[2 * k + s] = &sd->seq;
		}
	rt_eval_loop lo = { .block = r->o.chunk < 128 ? r->o.chunk : 128,
		            .score_from = r->split.score_from, .progress = ppl_progress,
		            .progress_user = r };
	rt_progress_init(&r->prog, "ab", "tokens", n, r->o.quiet);
	if (rc == 0)
		rc = rt_eval_runs(seqs, K, &r->ref, r->tokens, n, &lo, sc, &r->ref_nll_sum, err);
	rt_progress_end(&r->prog);
	/* the first run that failed (in the order they were fed) fails the comparison */
	int bad = -1;
	for (int k = 0; rc == 0 && k < K; k++)
		if (sc[k].failed_at >= 0 && (bad < 0 || sc[k].failed_at < sc[bad].failed_at))
			bad = k;
	if (bad >= 0)
		rc = rt_err_set(err, "policy %s at ratio %g: %s", r->pol[bad % 2]->name,
		                r->rows[bad / 2].ratio, sc[bad].error);
	for (int k = 0; k < K; k++) {
		ab_side *sd = &r->rows[k / 2].side[k % 2];
		if (rc == 0) {
			rt_kld_acc_summary(&sc[k].acc, &sd->sum);
			sd->st = rt_seq_stats_get(&sd->seq);
			rt_compression_of(&sd->seq, n, &sd->x);
			sd->scored = sc[k].scored;
			sd->compressed = sc[k].compressed;
		}
		rt_eval_score_free(&sc[k]);
	}
	if (rc)
		return -1;
	r->ref_st = rt_seq_stats_get(&r->ref);
	rt_compression_of(&r->ref, n, &r->ref_x);
	for (int k = 0; k < r->o.n_ratios; k++)
		if (ppl_verdict(r, &r->rows[k], err) != 0)
			return -1;
	return 0;
}

/* ---- needle --------------------------------------------------------------------------- */

#define NEEDLE_GEN 10 /* tokens generated for the answer (a passkey has at most 5 digits) */

/* One needle trial of prompt pr on s alone (rt_needle_trial). Returns 1 hit, 0 miss, -1
 * error. */
static int needle_trial(ab_run *r, rt_seq *s, const rt_needle_prompt *pr, float *logits,
                        rt_err *err)
{
	const rt_needle_how how = { .agnostic = !strcmp(r->o.mode, "agnostic"),
		                    .n_gen = NEEDLE_GEN };
	rt_needle_answer ans;
	float *one = RT_MALLOC((size_t)r->m->hp.n_vocab * sizeof *one);
	int rc = rt_needle_trial(&s, 1, NULL, r->tok, pr, &how, logits, one, &ans, err);
	free(one);
	return rc != 0 ? -1 : ans.correct;
}

/* Two-sided exact sign test of k successes out of n fair coin flips (McNemar's exact test
 * on the discordant pairs): min(1, 2 * P(X <= min(k, n - k))). 1 for n = 0. */
static double sign_test_p(int k, int n)
{
	if (n == 0)
		return 1;
	int m = k < n - k ? k : n - k;
	double p = 0;
	for (int i = 0; i <= m; i++)
		p += exp(lgamma(n + 1.0) - lgamma(i + 1.0) - lgamma(n - i + 1.0) - n * log(2.0));
	return p * 2 > 1 ? 1 : p * 2;
}

static void side_add_stats(ab_side *sd)
{
	rt_seq_stats t = rt_seq_stats_get(&sd->seq);
	sd->st.tokens += t.tokens;
	sd->st.chunks += t.chunks;
	if (t.kv_entries_peak > sd->st.kv_entries_peak)
		sd->st.kv_entries_peak = t.kv_entries_peak;
	if (t.kv_bytes_peak > sd->st.kv_bytes_peak)
		sd->st.kv_bytes_peak = t.kv_bytes_peak;
	sd->st.compress_events += t.compress_events;
	sd->st.policy_seconds += t.policy_seconds;
	sd->st.seconds += t.seconds;
}

static void needle_verdicts(ab_run *r, int n_trials);

/* One prompt for the reference (its counters into *ref_sum) and for both sides of every
 * ratio, *done counting the trials for the progress line. Returns 0, or -1 with err set
 * (naming the policy and the ratio when a side fails). */
static int needle_prompt_all(ab_run *r, const rt_needle_prompt *pr, float *logits,
                             rt_seq_stats *ref_sum, double *done, rt_err *err)
{
	int rc = 0;
	rt_progress_update(&r->prog, (int64_t)*done);
	int hit = needle_trial(r, &r->ref, pr, logits, err);
	if (hit < 0)
		rc = -1;
	else {
		rt_seq_stats t = rt_seq_stats_get(&r->ref);
		ref_sum->tokens += t.tokens;
		ref_sum->seconds += t.seconds;
		if (t.kv_entries_peak > ref_sum->kv_entries_peak)
			ref_sum->kv_entries_peak = t.kv_entries_peak;
		if (t.kv_bytes_peak > ref_sum->kv_bytes_peak)
			ref_sum->kv_bytes_peak = t.kv_bytes_peak;
		r->ref_hits += hit;
		r->ref_trials++;
		rt_compression_of(&r->ref, rt_seq_seen(&r->ref), &r->ref_x);
	}
	(*done)++;
	for (int k = 0; k < r->o.n_ratios && rc == 0; k++)
		for (int s = 0; s < 2 && rc == 0; s++) {
			ab_side *sd = &r->rows[k].side[s];
			rt_progress_update(&r->prog, (int64_t)*done);
			hit = needle_trial(r, &sd->seq, pr, logits, err);
			if (hit < 0) {
				char m2[512];
				snprintf(m2, sizeof m2, "%s", err->msg);
				rt_err_set(err, "policy %s at ratio %g: %s", r->pol[s]->name,
				           r->rows[k].ratio, m2);
				rc = -1;
				break;
			}
			side_add_stats(sd);
			rt_compression_of(&sd->seq, rt_seq_seen(&sd->seq), &sd->xt[sd->trials]);
			sd->ok[sd->trials++] = (uint8_t)hit;
			sd->hits += hit;
			(*done)++;
		}
	return rc;
}

static int run_needle(ab_run *r, rt_err *err)
{
	int64_t maxlen = 0;
	for (int i = 0; i < r->o.n_lengths; i++)
		if (r->o.lengths[i] > maxlen)
			maxlen = r->o.lengths[i];
	if (maxlen + NEEDLE_GEN > r->m->hp.n_ctx)
		return rt_err_set(err, "--lengths: %lld tokens (+%d generated) exceed the model's "
		                  "context_length %d", (long long)maxlen, NEEDLE_GEN, r->m->hp.n_ctx);
	int n_trials = r->o.n_lengths * r->o.n_depths;
	if (n_trials > AB_MAX_TRIALS)
		return rt_err_set(err, "needle: %d trials; at most %d (lengths x depths)", n_trials,
		                  AB_MAX_TRIALS);
	int32_t cap = (int32_t)(maxlen + NEEDLE_GEN);
	if (rt_seq_init(&r->ref, r->m, &rt_policy_full, cap, r->o.chunk, -1, err) != 0)
		return -1;
	r->ref_ready = 1;
	for (int k = 0; k < r->o.n_ratios; k++)
		for (int s = 0; s < 2; s++) {
			if (side_init(r, &r->rows[k], s, cap, -1, err) != 0)
				return -1;
			memset(&r->rows[k].side[s].st, 0, sizeof(rt_seq_stats));
		}
	float *logits = RT_MALLOC((size_t)r->m->hp.n_vocab * sizeof(float));
	int rc = 0, trial = 0;
	double total = (double)n_trials * (1 + 2 * r->o.n_ratios), done = 0;
	rt_progress_init(&r->prog, "ab", "trials", (int64_t)total, r->o.quiet);
	rt_seq_stats ref_sum;
	memset(&ref_sum, 0, sizeof ref_sum);
	for (int li = 0; li < r->o.n_lengths && rc == 0; li++) {
		for (int di = 0; di < r->o.n_depths && rc == 0; di++, trial++) {
			rt_needle_prompt pr;
			if (rt_needle_passkey(r->tok, r->o.lengths[li], r->o.depths[di],
			                      (uint64_t)trial + 1, 0, &pr, err) != 0) {
				rc = -1;
				break;
			}
			rc = needle_prompt_all(r, &pr, logits, &ref_sum, &done, err);
			rt_needle_prompt_free(&pr);
		}
	}
	if (rc == 0)
		rt_progress_update(&r->prog, (int64_t)total);
	rt_progress_end(&r->prog);
	free(logits);
	if (rc)
		return -1;
	r->ref_st = ref_sum;
	needle_verdicts(r, n_trials);
	return 0;
}

/* Each row's discordant counts, exact sign test and verdict over n_trials trials. */
static void needle_verdicts(ab_run *r, int n_trials)
{
	for (int k = 0; k < r->o.n_ratios; k++) {
		ab_row *row = &r->rows[k];
		for (int t = 0; t < n_trials; t++) {
			row->n10 += row->side[0].ok[t] && !row->side[1].ok[t];
			row->n01 += !row->side[0].ok[t] && row->side[1].ok[t];
		}
		row->p_value = sign_test_p(row->n01, row->n01 + row->n10);
		row->better = row->n10 > row->n01 ? 1 : row->n01 > row->n10 ? 2 : 0;
		row->significant = row->p_value < 0.05;
		for (int s = 0; s < 2; s++)
			rt_compression_mean(row->side[s].xt, row->side[s].trials, &row->side[s].x);
		const char *na = r->pol[0]->name, *nb = r->pol[1]->name;
		char head[300];
		if (row->better == 0)
			snprintf(head, sizeof head, "A (%s) and B (%s) tie", na, nb);
		else
			snprintf(head, sizeof head, "%s (%s) better", row->better == 1 ? "A" : "B",
			         row->better == 1 ? na : nb);
		snprintf(row->verdict, sizeof row->verdict,
		         "%s: accuracy %d/%d vs %d/%d, discordant trials %d (A only) vs %d (B only), "
		         "exact sign test p = %.3g, %s", head, row->side[0].hits, n_trials,
		         row->side[1].hits, n_trials, row->n10, row->n01, row->p_value,
		         row->significant ? "significant" : "not significant");
		char why[400];
		if (!ab_comparable(r, row, 1, why, sizeof why))
			verdict_refuse(row, why);
	}
}

/* ---- reporting ------------------------------------------------------------------------- */

enum { M_PPL, M_KLD_MEAN, M_KLD_P99, M_KLD_MAX, M_PPL_RATIO, M_SAME_TOP1, M_RMS_DP, M_ACC,
       M_ENTRIES, M_BYTES, M_COMPRESSION, M_BYTES_X, M_COMPRESSION_PEAK, M_BYTES_X_PEAK,
       M_TPS, M_EVENTS, M_POLICY_S, M_COUNT };

static const struct {
	const char *name;
	int fmt;        /* 0 %.5f, 1 integer, 2 bytes (MiB in the table), 3 %.1f, 4 %.2fx */
	int needle;     /* 0 ppl only, 1 needle only, 2 both */
	const char *axis;
} METRICS[M_COUNT] = {
	{ "ppl", 0, 0, "perplexity" },
	{ "kld_mean", 0, 0, "mean KL(full || policy), nats" },
	{ "kld_p99", 0, 0, "99th percentile KL, nats" },
	{ "kld_max", 0, 0, "max KL, nats" },
	{ "ppl_ratio", 0, 0, "ppl / ppl(full)" },
	{ "same_top1", 0, 0, "same top-1 token as full" },
	{ "rms_dp", 0, 0, "RMS dp of the correct token" },
	{ "accuracy", 0, 1, "passkey accuracy" },
	{ "kv_entries_peak", 1, 2, "peak KV entries (all heads)" },
	{ "kv_bytes_peak", 2, 2, "peak KV bytes" },
	{ "compression", 4, 2, "compression in entries at the end" },
	{ "bytes_compression", 4, 2, "compression in bytes (f16 full cache) at the end" },
	{ "compression_peak", 4, 2, "compression in entries at peak" },
	{ "bytes_compression_peak", 4, 2, "compression in bytes (f16 full cache) at peak" },
	{ "tokens_per_s", 3, 2, "tokens/s" },
	{ "compress_events", 1, 2, "compress calls" },
	{ "policy_seconds", 0, 2, "seconds in policy code" },
};

static int metric_on(const ab_run *r, int m)
{
	int needle = !strcmp(r->o.task, "needle");
	return METRICS[m].needle == 2 || METRICS[m].needle == needle;
}

/* Value of metric m for a side, or for the reference when sd is NULL. */
static double metric_val(const ab_run *r, const ab_side *sd, int m)
{
	const rt_seq_stats *st = sd ? &sd->st : &r->ref_st;
	const int64_t scored = r->n - r->split.score_from;
	switch (m) {
	case M_PPL: return sd ? sd->sum.ppl_q : exp(r->ref_nll_sum / (double)scored);
	case M_KLD_MEAN: return sd ? sd->sum.kld_mean : 0;
	case M_KLD_P99: return sd ? sd->sum.kld_p99 : 0;
	case M_KLD_MAX: return sd ? sd->sum.kld_max : 0;
	case M_PPL_RATIO: return sd ? sd->sum.ppl_ratio : 1;
	case M_SAME_TOP1: return sd ? sd->sum.same_top1 : 1;
	case M_RMS_DP: return sd ? sd->sum.rms_dp : 0;
	case M_ACC:
		return sd ? (sd->trials ? (double)sd->hits / sd->trials : NAN)
		          : (r->ref_trials ? (double)r->ref_hits / r->ref_trials : NAN);
	case M_ENTRIES: return (double)st->kv_entries_peak;
	case M_BYTES: return (double)st->kv_bytes_peak;
	case M_COMPRESSION: return sd ? sd->x.entries_end : r->ref_x.entries_end;
	case M_BYTES_X: return sd ? sd->x.bytes_end : r->ref_x.bytes_end;
	case M_COMPRESSION_PEAK: return sd ? sd->x.entries_peak : r->ref_x.entries_peak;
	case M_BYTES_X_PEAK: return sd ? sd->x.bytes_peak : r->ref_x.bytes_peak;
	case M_TPS: return st->seconds > 0 ? (double)st->tokens / st->seconds : NAN;
	case M_EVENTS: return (double)st->compress_events;
	case M_POLICY_S: return st->policy_seconds;
	}
	return NAN;
}

static void fmt_val(char *buf, size_t cap, int fmt, double v)
{
	if (!isfinite(v))
		snprintf(buf, cap, "-");
	else if (fmt == 1)
		snprintf(buf, cap, "%.0f", v);
	else if (fmt == 2)
		snprintf(buf, cap, "%.2f MiB", v / 1048576.0);
	else if (fmt == 3)
		snprintf(buf, cap, "%.1f", v);
	else if (fmt == 4)
		snprintf(buf, cap, "%.2fx", v);
	else
		snprintf(buf, cap, "%.5f", v);
}

/* The parameters in effect, "recent=0.1 window=32"; under a ratio the ones only the budget
 * reads are named after it: "recent=0.1; budget = context / ratio, in place of heavy". */
static void params_str(const rt_seq *s, char *buf, size_t cap)
{
	const double R = s->run.ctx.ratio > 0 ? s->run.ctx.ratio : s->run.ctx.byte_ratio;
	size_t len = 0;
	int shown = 0, replaced = 0;
	buf[0] = 0;
	for (int i = 0; i < s->p->n_params && len < cap; i++)
		if (kvp_param_in_effect(s->p, i, R))
			len += (size_t)snprintf(buf + len, cap - len, "%s%s=%g", shown++ ? " " : "",
			                        s->p->params[i].name, s->run.params[i]);
	if (!shown && len < cap)
		len += (size_t)snprintf(buf + len, cap - len, "(no parameters)");
	for (int i = 0; i < s->p->n_params && len < cap; i++) {
		if (kvp_param_in_effect(s->p, i, R))
			continue;
		const char *nm = s->p->params[i].name;
		if (replaced++)
			len += (size_t)snprintf(buf + len, cap - len, ", %s", nm);
		else
			len += (size_t)snprintf(buf + len, cap - len, s->run.ctx.byte_ratio > 0
			                        ? "; budget = 1/ratio of an f16 full cache's bytes, in "
			                          "place of %s"
			                        : "; budget = context / ratio, in place of %s", nm);
	}
}

static void print_report(const ab_run *r, FILE *out)
{
	const int needle = !strcmp(r->o.task, "needle");
	fprintf(out, "kvpc ab: A = %s (%s), B = %s (%s)\n", r->pol[0]->name, r->pol[0]->source,
	        r->pol[1]->name, r->pol[1]->source);
	for (int s = 0; s < 2; s++) {
		char ps[1024];
		params_str(&r->rows[0].side[s].seq, ps, sizeof ps);
		fprintf(out, "  %s: %s%s\n", s ? "B" : "A", ps,
		        r->rows[0].side[s].ratio_applied ? "" : "; never compresses, ratio ignored");
	}
	if (needle)
		fprintf(out, "task needle (passkey, question-%s): %d trials (%d lengths x %d depths); "
		        "model %s; %d threads\n", r->o.mode, r->ref_trials, r->o.n_lengths,
		        r->o.n_depths, r->o.model, r->threads);
	else
		fprintf(out, "task ppl, %s protocol: %lld tokens of %s, the first %lld the prompt, "
		        "positions %lld..%lld scored (%lld tokens); model %s; %d threads\n",
		        r->split.measure == KVP_MEASURE_PROMPT_END ? "prompt-end" : "streaming",
		        (long long)r->n, r->o.text, (long long)r->split.prompt,
		        (long long)r->split.score_from, (long long)(r->n - 1),
		        (long long)(r->n - r->split.score_from), r->o.model, r->threads);
	for (int k = 0; k < r->o.n_ratios; k++) {
		const ab_row *row = &r->rows[k];
		if (r->o.bytes)
			fprintf(out, "\n== compression ratio in bytes %g (budget = 1/%g of the bytes of an "
			        "f16 full cache of the %s, per KV head)\n", row->ratio, row->ratio,
			        needle ? "prompt" : "context");
		else if (needle)
			fprintf(out, "\n== compression ratio %g (budget = prompt length / %g entries per KV "
			        "head)\n", row->ratio, row->ratio);
		else
			fprintf(out, "\n== compression ratio %g (budget = %lld / %g = %.1f entries per KV "
			        "head)\n", row->ratio, (long long)r->split.prompt, row->ratio,
			        (double)r->split.prompt / row->ratio);
		fprintf(out, "%-16s %16s %16s %16s\n", "metric", "full (ref)", r->pol[0]->name,
		        r->pol[1]->name);
		for (int m = 0; m < M_COUNT; m++) {
			if (!metric_on(r, m))
				continue;
			char a[48], b[48], c[48];
			fmt_val(a, sizeof a, METRICS[m].fmt, metric_val(r, NULL, m));
			fmt_val(b, sizeof b, METRICS[m].fmt, metric_val(r, &row->side[0], m));
			fmt_val(c, sizeof c, METRICS[m].fmt, metric_val(r, &row->side[1], m));
			fprintf(out, "%-16s %16s %16s %16s\n", METRICS[m].name, a, b, c);
		}
		if (!needle)
			fprintf(out, "dNLL (B - A)     mean %+.5f nats/token, 95%% CI [%+.5f, %+.5f] "
			        "(paired circular block bootstrap, block %lld tokens, %d resamples)\n",
			        row->ci.mean, row->ci.lo, row->ci.hi, (long long)row->ci.block_len,
			        row->ci.n_resamples);
		fprintf(out, "verdict: %s\n", row->verdict);
	}
}

static void json_side_meta(FILE *f, const ab_run *r, int s)
{
	const struct kvp_policy *p = r->pol[s];
	const rt_seq *q = &r->rows[0].side[s].seq;
	fputs("{\"name\": ", f);
	rt_json_str(f, p->name);
	fputs(", \"source\": ", f);
	rt_json_str(f, p->source);
	fputs(", \"source_hash\": ", f);
	rt_json_str(f, p->source_hash);
	fputs(", \"source_sha256\": ", f);
	rt_json_str(f, r->o.sha[s] ? r->o.sha[s] : "unknown");
	fputs(", \"summary\": ", f);
	rt_json_str(f, p->summary ? p->summary : "");
	fputs(", \"params\": {", f);
	for (int i = 0; i < p->n_params; i++) {
		fputs(i ? ", " : "", f);
		rt_json_str(f, p->params[i].name);
		fputs(": ", f);
		rt_json_num(f, q->run.params[i]);
	}
	fputs("}, \"param_defaults\": {", f);
	for (int i = 0; i < p->n_params; i++) {
		fputs(i ? ", " : "", f);
		rt_json_str(f, p->params[i].name);
		fputs(": ", f);
		rt_json_num(f, p->params[i].def);
	}
	fprintf(f, "}, \"ratio_applied\": %s}", r->rows[0].side[s].ratio_applied ? "true" : "false");
}

/* The "meta" object and the reference's metrics of the --json report (its opening "{"
 * included, up to the reference's closing brace). */
static void json_head(FILE *f, const ab_run *r, int needle)
{
	fputs("{\n\"meta\": {\"tool\": \"kvpc ab\", \"commit\": ", f);
	rt_json_str(f, r->o.commit);
	fputs(", \"task\": ", f);
	rt_json_str(f, r->o.task);
	fputs(", \"model\": ", f);
	rt_json_str(f, r->o.model);
	fputs(", \"model_sha256\": ", f);
	rt_json_str(f, r->model_sha);
	fputs(", \"text\": ", f);
	if (r->o.text)
		rt_json_str(f, r->o.text);
	else
		fputs("null", f);
	fputs(", \"text_sha256\": ", f);
	if (r->o.text)
		rt_json_str(f, r->text_sha);
	else
		fputs("null", f);
	fprintf(f, ", \"tokens\": %lld, \"threads\": %d, \"chunk\": %d, \"prefill_chunk\": %d, ",
	        (long long)(needle ? 0 : r->n), r->threads, r->o.chunk, r->o.prefill_chunk);
	if (!needle)
		fprintf(f, "\"protocol\": \"%s\", \"prompt\": %lld, \"score_from\": %lld, ",
		        rt_eval_measure_name(r->split.measure), (long long)r->split.prompt,
		        (long long)r->split.score_from);
	fprintf(f, "\"x_tol\": %g, \"ratios\": [", RT_AB_X_TOL);
	for (int k = 0; k < r->o.n_ratios; k++) {
		fputs(k ? ", " : "", f);
		rt_json_num(f, r->rows[k].ratio);
	}
	fprintf(f, "], \"ratio_kind\": \"%s\", \"bootstrap\": {\"resamples\": %d, \"seed\": ",
	        r->o.bytes ? "bytes" : "entries", r->o.resamples);
	rt_json_uint(f, r->o.seed);
	fputs(", \"level\": 0.95}", f);
	if (needle) {
		fputs(", \"needle\": {\"mode\": ", f);
		rt_json_str(f, r->o.mode);
		fputs(", \"lengths\": [", f);
		for (int i = 0; i < r->o.n_lengths; i++)
			fprintf(f, "%s%lld", i ? ", " : "", (long long)r->o.lengths[i]);
		fputs("], \"depths\": [", f);
		for (int i = 0; i < r->o.n_depths; i++) {
			fputs(i ? ", " : "", f);
			rt_json_num(f, r->o.depths[i]);
		}
		fputs("]}", f);
	}
	fputs(",\n  \"policies\": {\"A\": ", f);
	json_side_meta(f, r, 0);
	fputs(",\n               \"B\": ", f);
	json_side_meta(f, r, 1);
	fputs("}},\n\"reference\": {\"policy\": \"full\"", f);
	for (int m = 0; m < M_COUNT; m++) {
		if (!metric_on(r, m))
			continue;
		fprintf(f, ", \"%s\": ", METRICS[m].name);
		rt_json_num(f, metric_val(r, NULL, m));
	}
}

/* Row k of the --json report's "results": both sides' metrics, the paired statistics and
 * the verdict. */
static void json_row(FILE *f, const ab_run *r, int k, int needle)
{
	const ab_row *row = &r->rows[k];
	fputs(k ? ",\n  {\"ratio\": " : "\n  {\"ratio\": ", f);
	rt_json_num(f, row->ratio);
	for (int s = 0; s < 2; s++) {
		fprintf(f, ", \"%s\": {\"policy\": ", s ? "B" : "A");
		rt_json_str(f, r->pol[s]->name);
		for (int m = 0; m < M_COUNT; m++) {
			if (!metric_on(r, m))
				continue;
			fprintf(f, ", \"%s\": ", METRICS[m].name);
			rt_json_num(f, metric_val(r, &row->side[s], m));
		}
		if (!needle) {
			fprintf(f, ", \"scored\": %lld, \"scored_compressed\": %lld, \"kl\": {",
			        (long long)row->side[s].scored, (long long)row->side[s].compressed);
			rt_kld_summary_json(f, &row->side[s].sum);
			fputs("}", f);
		} else {
			fprintf(f, ", \"hits\": %d, \"trials\": %d", row->side[s].hits,
			        row->side[s].trials);
		}
		fputs("}", f);
	}
	if (!needle) {
		fputs(", \"nll_diff\": {", f);
		rt_boot_ci_json(f, &row->ci);
		fputs("}", f);
	} else {
		fprintf(f, ", \"discordant\": {\"a_only\": %d, \"b_only\": %d, \"p_value\": ",
		        row->n10, row->n01);
		rt_json_num(f, row->p_value);
		fputs("}", f);
	}
	fprintf(f, ", \"better\": \"%s\", \"significant\": %s, \"verdict\": ",
	        row->better == 1 ? "A" : row->better == 2 ? "B" : "tie",
	        row->significant ? "true" : "false");
	rt_json_str(f, row->verdict);
	fputs("}", f);
}

/* path opened for writing, or NULL with err "PATH: REASON" */
static FILE *open_out(const char *path, rt_err *err)
{
	FILE *f = fopen(path, "w");
	if (!f)
		rt_err_set(err, "%s: %s", path, strerror(errno));
	return f;
}

static int write_json(const ab_run *r, const char *path, rt_err *err)
{
	FILE *f = open_out(path, err);
	if (!f)
		return -1;
	const int needle = !strcmp(r->o.task, "needle");
	json_head(f, r, needle);
	fputs("},\n\"results\": [", f);
	for (int k = 0; k < r->o.n_ratios; k++)
		json_row(f, r, k, needle);
	fputs("\n]\n}\n", f);
	if (fclose(f) != 0)
		return rt_err_set(err, "%s: write error: %s", path, strerror(errno));
	return 0;
}

/* A CSV field: quoted when it holds a comma, quote or line break. */
static void csv_str(FILE *f, const char *s)
{
	if (!strpbrk(s, ",\"\n\r")) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"')
			fputc('"', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

static int write_csv(const ab_run *r, const char *path, rt_err *err)
{
	FILE *f = open_out(path, err);
	if (!f)
		return -1;
	const int needle = !strcmp(r->o.task, "needle");
	fputs("commit,task,model,model_sha256,text,text_sha256,tokens,threads,ratio,ratio_kind,"
	      "side,policy,source_hash,source_sha256,params", f);
	for (int m = 0; m < M_COUNT; m++)
		if (metric_on(r, m))
			fprintf(f, ",%s", METRICS[m].name);
	fputs(needle ? ",a_only,b_only,p_value" : ",dnll_mean,dnll_ci_lo,dnll_ci_hi,block_len",
	      f);
	fputs(",better,significant,verdict\n", f);
	for (int k = 0; k < r->o.n_ratios; k++) {
		const ab_row *row = &r->rows[k];
		for (int s = -1; s < 2; s++) {
			csv_str(f, r->o.commit);
			fprintf(f, ",%s,", r->o.task);
			csv_str(f, r->o.model);
			fprintf(f, ",%s,", r->model_sha);
			csv_str(f, r->o.text ? r->o.text : "");
			fprintf(f, ",%s,%lld,%d,%g,%s,%s,", r->o.text ? r->text_sha : "",
			        (long long)(needle ? 0 : r->n), r->threads, row->ratio,
			        r->o.bytes ? "bytes" : "entries", s < 0 ? "ref" : s ? "B" : "A");
			char ps[1024] = "";
			if (s >= 0) {
				csv_str(f, r->pol[s]->name);
				fprintf(f, ",%s,%s,", r->pol[s]->source_hash,
				        r->o.sha[s] ? r->o.sha[s] : "unknown");
				params_str(&row->side[s].seq, ps, sizeof ps);
				csv_str(f, ps);
			} else {
				fputs("full,,,", f);
			}
			for (int m = 0; m < M_COUNT; m++) {
				if (!metric_on(r, m))
					continue;
				double v = metric_val(r, s < 0 ? NULL : &row->side[s], m);
				if (isfinite(v))
					fprintf(f, ",%.9g", v);
				else
					fputs(",", f);
			}
			if (needle)
				fprintf(f, ",%d,%d,%.6g,", row->n10, row->n01, row->p_value);
			else
				fprintf(f, ",%.9g,%.9g,%.9g,%lld,", row->ci.mean, row->ci.lo, row->ci.hi,
				        (long long)row->ci.block_len);
			fprintf(f, "%s,%s,", row->better == 1 ? "A" : row->better == 2 ? "B" : "tie",
			        row->significant ? "true" : "false");
			csv_str(f, row->verdict);
			fputc('\n', f);
		}
	}
	if (fclose(f) != 0)
		return rt_err_set(err, "%s: write error: %s", path, strerror(errno));
	return 0;
}

/* Wilson score interval (Wilson 1927) at 95% for h hits in n trials; NaN for n = 0. */
static void wilson95(int h, int n, double *lo, double *hi)
{
	if (n <= 0) {
		*lo = *hi = NAN;
		return;
	}
	const double z = 1.959963984540054, z2 = z * z;
	double p = (double)h / n, den = 1 + z2 / n, mid = (p + z2 / (2.0 * n)) / den;
	double half = z * sqrt(p * (1 - p) / n + z2 / (4.0 * n * n)) / den;
	*lo = fmax(0.0, mid - half);
	*hi = fmin(1.0, mid + half);
}

/* Error bar ends of metric m for side s (2 = the reference) of row k, where the metric has
 * a statistic for one: mean KL ± 1.96 standard errors, accuracy's Wilson interval. */
static int metric_bar(const ab_run *r, int m, int k, int s, double *lo, double *hi)
{
	const ab_side *sd = s < 2 ? &r->rows[k].side[s] : NULL;
	if (m == M_KLD_MEAN && sd && sd->sum.n > 1) {
		*lo = sd->sum.kld_mean - 1.959963984540054 * sd->sum.kld_mean_err;
		*hi = sd->sum.kld_mean + 1.959963984540054 * sd->sum.kld_mean_err;
		return 1;
	}
	if (m == M_ACC) {
		if (sd)
			wilson95(sd->hits, sd->trials, lo, hi);
		else
			wilson95(r->ref_hits, r->ref_trials, lo, hi);
		return 1;
	}
	return 0;
}

/* Render one panel and place it at grid cell i (two columns under a 40-pixel title). */
static int put_panel(FILE *f, int i, int W, int H, const rt_svg_plot *pl,
                     const rt_svg_series *ser, int n_ser, rt_err *err)
{
	size_t len = 0;
	char *svg = rt_svg_render(pl, ser, n_ser, &len, err);
	if (!svg)
		return -1;
	char *body = strstr(svg, "<svg"); /* drop the XML declaration */
	fprintf(f, "<g transform=\"translate(%d,%d)\">\n%s</g>\n", (i % 2) * W, 40 + (i / 2) * H,
	        body ? body : svg);
	free(svg);
	return 0;
}

/* One SVG holding first the verdict panel — for the ppl task the paired bootstrap
 * interval of the mean NLL difference B - A per ratio, with the zero line (an interval
 * clear of zero is a significant difference); for the needle task the discordant trial
 * counts the exact sign test compares — then one panel per metric (each an rt_svg
 * plot nested as an <svg> element at its grid place, two columns), x = compression ratio
 * (log2 axis when every ratio > 1 and there are at least two), series: A, B and the
 * full-cache reference, drawn side by side (dodged) with distinct markers and dashes so
 * equal values stay visible, with error bars where the metric has an interval. The title
 * names the policies, the text and the token count. */
static int write_plot(const ab_run *r, const char *path, rt_err *err)
{
	const int needle = !strcmp(r->o.task, "needle");
	int ms[M_COUNT], nm = 0;
	for (int m = 0; m < M_COUNT; m++)
		if (metric_on(r, m) && m != M_ENTRIES && m != M_KLD_MAX)
			ms[nm++] = m;
	const int W = 560, H = 360, cols = 2, np = nm + 1, rows = (np + cols - 1) / cols;
	int nr = r->o.n_ratios, log2x = nr >= 2;
	for (int k = 0; k < nr; k++)
		if (!(r->rows[k].ratio > 0))
			log2x = 0;
	double x[RT_AB_MAX_RATIOS], y[3][RT_AB_MAX_RATIOS], lo[3][RT_AB_MAX_RATIOS], hi[3][RT_AB_MAX_RATIOS];
	for (int k = 0; k < nr; k++)
		x[k] = r->rows[k].ratio;
	FILE *f = open_out(path, err);
	if (!f)
		return -1;
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
	        "viewBox=\"0 0 %d %d\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
	        cols * W, rows * H + 40, cols * W, rows * H + 40);
	rt_buf esc = RT_BUF_INIT;
	char title[1024];
	int tl = snprintf(title, sizeof title, "kvpc ab (%s): A = %s, B = %s", r->o.task,
	                  r->pol[0]->name, r->pol[1]->name);
	if (!needle && tl > 0 && (size_t)tl < sizeof title)
		snprintf(title + tl, sizeof title - (size_t)tl, "; %s, %lld tokens (%lld scored)",
		         r->o.text, (long long)r->n, (long long)(r->n - r->split.score_from));
	else if (tl > 0 && (size_t)tl < sizeof title)
		snprintf(title + tl, sizeof title - (size_t)tl, "; passkey, %d trials per policy and ratio",
		         r->rows[0].side[0].trials);
	rt_svg_escape_append(&esc, title);
	fprintf(f, "<text x=\"%d\" y=\"26\" font-family=\"sans-serif\" font-size=\"18\" "
	        "text-anchor=\"middle\">%s</text>\n", cols * W / 2, esc.s);
	rt_buf_free(&esc);
	int rc = 0, panel = 0;
	if (!needle) {
		for (int k = 0; k < nr; k++) {
			y[0][k] = r->rows[k].ci.mean;
			lo[0][k] = r->rows[k].ci.lo;
			hi[0][k] = r->rows[k].ci.hi;
		}
		char nm_b[320], ttl[128];
		snprintf(nm_b, sizeof nm_b, "B - A (%s - %s)", r->pol[1]->name, r->pol[0]->name);
		snprintf(ttl, sizeof ttl, "verdict: paired dNLL, %.0f%% bootstrap CI",
		         100 * (r->rows[0].ci.level > 0 ? r->rows[0].ci.level : 0.95));
		rt_svg_series ser = { nm_b, x, y[0], nr, lo[0], hi[0] };
		rt_svg_plot pl = { ttl, r->o.bytes ? "compression ratio in bytes" : "compression ratio",
		                   "mean NLL(B) - NLL(A), nats/token", W, H,
			           log2x, 0, 1, 0.0 };
		rc = put_panel(f, panel++, W, H, &pl, &ser, 1, err);
	} else {
		/* the sign test's data: trials only A got right, only B got right */
		for (int k = 0; k < nr; k++) {
			y[0][k] = r->rows[k].n10;
			y[1][k] = r->rows[k].n01;
		}
		char na[300], nb[300];
		snprintf(na, sizeof na, "only A right (%s)", r->pol[0]->name);
		snprintf(nb, sizeof nb, "only B right (%s)", r->pol[1]->name);
		rt_svg_series ser[2] = { { na, x, y[0], nr, NULL, NULL }, { nb, x, y[1], nr, NULL, NULL } };
		rt_svg_plot pl = { "verdict: discordant trials (exact sign test)",
		                   r->o.bytes ? "compression ratio in bytes" : "compression ratio",
			           "trials", W, H, log2x, 8.0, 1, 0.0 };
		rc = put_panel(f, panel++, W, H, &pl, ser, 2, err);
	}
	for (int i = 0; i < nm && rc == 0; i++) {
		int m = ms[i], bars = 0;
		for (int k = 0; k < nr; k++)
			for (int s = 0; s < 3; s++) {
				y[s][k] = metric_val(r, s < 2 ? &r->rows[k].side[s] : NULL, m);
				lo[s][k] = hi[s][k] = NAN;
				bars |= metric_bar(r, m, k, s, &lo[s][k], &hi[s][k]);
				if (METRICS[m].fmt == 2) {
					y[s][k] /= 1048576.0;
					lo[s][k] /= 1048576.0;
					hi[s][k] /= 1048576.0;
				}
			}
		char la[300], lb[300], yl[160];
		snprintf(la, sizeof la, "A: %s", r->pol[0]->name);
		snprintf(lb, sizeof lb, "B: %s", r->pol[1]->name);
		snprintf(yl, sizeof yl, "%s%s%s", METRICS[m].axis, METRICS[m].fmt == 2 ? " (MiB)" : "",
		         m == M_KLD_MEAN ? " (bars: 95% normal CI)" : m == M_ACC ? " (bars: 95% Wilson)" : "");
		rt_svg_series ser[3] = { { la, x, y[0], nr, bars ? lo[0] : NULL, bars ? hi[0] : NULL },
			                 { lb, x, y[1], nr, bars ? lo[1] : NULL, bars ? hi[1] : NULL },
			                 { "full cache", x, y[2], nr, bars ? lo[2] : NULL, bars ? hi[2] : NULL } };
		rt_svg_plot pl = { METRICS[m].name,
		                   r->o.bytes ? "compression ratio in bytes" : "compression ratio", yl,
		                   W, H, log2x, 8.0, 0, 0.0 };
		rc = put_panel(f, panel++, W, H, &pl, ser, 3, err);
	}
	fputs("</svg>\n", f);
	if (fclose(f) != 0 && rc == 0)
		return rt_err_set(err, "%s: write error: %s", path, strerror(errno));
	return rc;
}

/* ---- entry point ------------------------------------------------------------------------ */

static void run_free(ab_run *r)
{
	free(r->text);
	for (int k = 0; k < RT_AB_MAX_RATIOS; k++)
		for (int s = 0; s < 2; s++) {
			ab_side *sd = &r->rows[k].side[s];
			if (sd->ready)
				rt_seq_free(&sd->seq);
			free(sd->nll);
		}
	if (r->ref_ready)
		rt_seq_free(&r->ref);
	free(r->tokens);
	if (r->tok)
		rt_tokenizer_free(r->tok);
	if (r->m)
		rt_model_free(r->m);
}

/* Tokenize the first ctx tokens of the text (all when ctx is 0). */
static int load_text(ab_run *r, rt_err *err)
{
	size_t len = 0;
	char *text = r->text; /* read and checked before the model was loaded */
	len = r->text_len;
	r->text = NULL;
	if (rt_sha256_file(r->o.text, r->text_sha, err) != 0) {
		free(text);
		return -1;
	}
	int64_t want = r->o.ctx ? r->o.ctx : r->m->hp.n_ctx;
	if (want > r->m->hp.n_ctx) {
		free(text);
		return rt_err_set(err, "--ctx %lld exceeds the model's context_length %d",
		                  (long long)want, r->m->hp.n_ctx);
	}
	/* tokenize a prefix (16 bytes per wanted token, cut at a character boundary) first */
	size_t cut = len;
	if ((double)want * 16 < (double)len) {
		cut = (size_t)want * 16;
		while (cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80)
			cut--;
	}
	int64_t n = rt_tokenize(r->tok, text, cut, 0, NULL, 0, err);
	if (n < 0) {
		free(text);
		char m2[512];
		snprintf(m2, sizeof m2, "%s", err->msg);
		return rt_err_set(err, "%s: %s", r->o.text, m2);
	}
	r->tokens = RT_MALLOC((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
	rt_tokenize(r->tok, text, cut, 0, r->tokens, n, err);
	free(text);
	r->n = n < want ? n : want;
	if (r->n < 2)
		return rt_err_set(err, "%s: %lld tokens; at least 2 are needed", r->o.text,
		                  (long long)r->n);
	return 0;
}

int rt_ab_run(const rt_ab_opts *o, const struct kvp_policy *const *reg, int n_reg)
{
	ab_run *r = calloc(1, sizeof *r);
	if (!r)
		return 1;
	r->o = *o;
	int rc;
	rt_err err = { "" };
	for (int s = 0; s < 2; s++) {
		const char *nm = r->o.name[s];
		if (nm) {
			r->pol[s] = rt_registry_find(reg, n_reg, nm);
			if (!r->pol[s]) {
				fprintf(stderr, "ab: no policy '%s' in this binary (it has:", nm);
				for (int i = 0; i < n_reg; i++)
					fprintf(stderr, " %s", reg[i]->name);
				fputs(")\n", stderr);
				free(r);
				return 2;
			}
		} else if (n_reg > 0) {
			r->pol[s] = reg[s < n_reg ? s : 0];
		} else {
			fputs("ab: this binary holds no policy\n", stderr);
			free(r);
			return 2;
		}
	}
	for (int k = 0; k < r->o.n_ratios; k++)
		r->rows[k].ratio = r->o.ratios[k];
	if (check_sets(r, &err) != 0) {
		fprintf(stderr, "ab: %s\n", err.msg);
		free(r);
		return 2;
	}
	const char *outs[][2] = { { "--json", r->o.json }, { "--csv", r->o.csv }, { "--plot", r->o.plot } };
	for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
		if (outs[i][1] && rt_outpath_check(outs[i][1], &err) != 0) {
			fprintf(stderr, "ab: %s: %s\n", outs[i][0], err.msg);
			free(r);
			return 2;
		}
	if (r->o.threads > 0)
		openblas_set_num_threads(r->o.threads);
	r->threads = openblas_get_num_threads();
	rc = 1;
	/* inputs and outputs are checked before the model is loaded */
	if (r->o.text && !(r->text = rt_text_read(r->o.text, &r->text_len, &err)))
		goto fail;
	rt_gguf *g = rt_gguf_open(r->o.model, &err);
	if (!g)
		goto fail;
	r->tok = rt_tokenizer_init(g, &err);
	/* A/B comparisons are quality measurements: always on the exact path */
	const rt_model_opts mo = { .exact = 1, .threads = 0 };
	if (r->tok)
		r->m = rt_model_load_opts(g, &mo, &err);
	rt_gguf_close(g);
	if (!r->tok || !r->m)
		goto fail;
	if (rt_sha256_file(r->o.model, r->model_sha, &err) != 0)
		goto fail;
	if (!strcmp(r->o.task, "ppl")) {
		if (load_text(r, &err) != 0 || run_ppl(r, &err) != 0)
			goto fail;
	} else {
		if (r->o.text && rt_sha256_file(r->o.text, r->text_sha, &err) != 0)
			goto fail;
		if (run_needle(r, &err) != 0)
			goto fail;
	}
	print_report(r, stdout);
	fflush(stdout);
	if ((r->o.json && write_json(r, r->o.json, &err) != 0) ||
	    (r->o.csv && write_csv(r, r->o.csv, &err) != 0) ||
	    (r->o.plot && write_plot(r, r->o.plot, &err) != 0))
		goto fail;
	rc = 0;
	goto out;
fail:
	rt_progress_end(&r->prog);
	fprintf(stderr, "ab: %s\n", err.msg[0] ? err.msg : "failed");
out:
	run_free(r);
	free(r);
	return rc;
}
