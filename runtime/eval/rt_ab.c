/*
 * rt_ab: the A/B engine of a per-deployment binary (`BIN ab`) — see rt_ab.h; its table,
 * JSON, CSV and SVG reports are rt_ab_report.c.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/rt_ab.h"
#include "eval/rt_ab_int.h"
#include "base/rt_outpath.h"
#include "base/rt_progress.h"
#include "base/rt_text.h"
#include "base/rt_sha256.h"
#include "eval/rt_compression.h"
#include "eval/rt_eval.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "eval/rt_needle.h"
#include "policy/rt_pick.h"
#include "policy/rt_seq.h"
#include "eval/rt_stats.h"
#include "model/rt_tokenizer.h"

/* ---- options -------------------------------------------------------------------------- */

void rt_ab_opts_init(rt_ab_opts *o)
{
	memset(o, 0, sizeof *o);
	o->task = "ppl";
	o->mode = NULL; /* as `needle`'s default: the policies' protocol (run_needle) */
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

/* The name of the "name=value" a (at most 255 bytes) into name[256]. */
static void set_name(const char *a, char name[256])
{
	size_t len = (size_t)(strchr(a, '=') - a);
	snprintf(name, 256, "%.*s", (int)(len < 255 ? len : 255), a);
}

/* The "name=value" overrides side `side` applies, in order, into sets[RT_AB_MAX_SETS]
 * (with, in all[], 1 for a --set given for both sides): its --set-a or --set-b, and each
 * --set whose name its policy has (a --set for both sides skips a side without it).
 * Returns their count. */
static int side_sets(const ab_run *r, int side, const char **sets, int *all)
{
	int n = 0;
	for (int i = 0; i < r->o.n_sets[side]; i++) {
		const char *a = r->o.sets[side][i];
		char name[256];
		set_name(a, name);
		if (!r->o.set_all[side][i] || kvp_policy_param_index(r->pol[side], name) >= 0) {
			all[n] = r->o.set_all[side][i];
			sets[n++] = a;
		}
	}
	return n;
}

/* Every --set, --set-a and --set-b against its side's policy, before the model loads (the
 * caller makes an error a usage error, exit 2), the option named as it was given: a --set
 * for both sides needs a policy with the name (a side without it skips it); each value's
 * name, unit and range as it is applied (kvp_policy_param_set), then the policy's check of
 * the values once every one is set (kvp_policy_params_check: a rule may read several
 * parameters): rt_pick_vals' rule, split to name the option, which side_apply's rt_pick
 * applies again at every row. */
static int check_sets(ab_run *r, rt_err *err)
{
	char name[256];
	for (int i = 0; i < r->o.n_sets[0]; i++) {
		if (!r->o.set_all[0][i])
			continue;
		const char *a = r->o.sets[0][i];
		set_name(a, name);
		if (kvp_policy_param_index(r->pol[0], name) < 0 &&
		    kvp_policy_param_index(r->pol[1], name) < 0)
			return rt_err_set(err, "--set %s: neither %s nor %s has a parameter '%s'", a,
			                  r->pol[0]->name, r->pol[1]->name, name);
	}
	for (int side = 0; side < 2; side++) {
		const struct kvp_policy *p = r->pol[side];
		double *vals = RT_MALLOC(((size_t)p->n_params + 1) * sizeof *vals);
		const char *sets[RT_AB_MAX_SETS];
		int all[RT_AB_MAX_SETS], rc = 0;
		const int n = side_sets(r, side, sets, all);
		rt_err e = { "" };
		kvp_policy_param_defaults(p, vals);
		for (int i = 0; rc == 0 && i < n; i++)
			if (kvp_policy_param_set(p, vals, sets[i], &e) != 0)
				rc = rt_err_set(err, "%s %s (side %s): %s", all[i] ? "--set" : side ?
				                "--set-b" : "--set-a", sets[i], side ? "B" : "A", e.msg);
		if (rc == 0 && kvp_policy_params_check(p, vals, &e) != 0)
			rc = rt_err_set(err, "the values set for side %s: %s", side ? "B" : "A", e.msg);
		free(vals);
		if (rc)
			return -1;
	}
	return 0;
}

/* Side `side`'s choice at the row's ratio, by the one rule (runtime/policy/rt_pick.h),
 * applied to its fresh sequence: its --set values (a --set for both sides skips a side
 * without that parameter), the ratio when its policy compresses (else none: it keeps
 * every token), the prefill chunk. */
static int side_apply(ab_run *r, ab_row *row, int side, rt_err *err)
{
	static const char *const spellings[RT_PICK_N_FIELDS] = { "policy", "--kv-type", "--set",
		"--ratio", "--byte-ratio", "--prefill-chunk", "--min-kv" };
	const ab_side *s = &row->side[side];
	const char *sets[RT_AB_MAX_SETS];
	int all[RT_AB_MAX_SETS];
	const int n = side_sets(r, side, sets, all);
	const double R = s->ratio_applied ? s->ratio : 0; /* the row's, or --equal-memory's */
	const struct rt_pick_in in = { .reg = &r->pol[side], .n_reg = 1,
		.kv_type = (int)s->seq.kv.type, .sets = sets, .n_sets = n,
		.ratio = r->o.bytes ? 0 : R, .byte_ratio = r->o.bytes ? R : 0,
		.prefill_chunk = r->o.prefill_chunk, .spellings = spellings };
	struct rt_pick pk;
	if (rt_pick(&in, &pk, err) != 0)
		return -1;
	const int rc = rt_seq_apply(&row->side[side].seq, &pk, err);
	rt_pick_free(&pk);
	return rc;
}

static int side_init(ab_run *r, ab_row *row, int side, int32_t cap, int64_t prompt_len,
                     rt_err *err)
{
	ab_side *s = &row->side[side];
	if (rt_seq_init(&s->seq, r->m, r->pol[side], cap, r->o.chunk, prompt_len, err) != 0)
		return -1;
	s->ready = 1;
	s->ratio_applied = r->pol[side]->compress != NULL;
	if (!(s->ratio > 0))
		s->ratio = row->ratio;
	return side_apply(r, row, side, err);
}

/* 1 when the row's two sides may be compared: each compressed before some scored token
 * (ppl) and their compression in bytes at the end (their memory), and for two prompt-end
 * policies their prompts' after the compress, is within RT_AB_X_TOL of each other, whatever
 * their entries (rt_compression_differ); else 0 with the reason in why. */
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
	const int both_pe = r->pol[0]->measure == KVP_MEASURE_PROMPT_END &&
	                    r->pol[1]->measure == KVP_MEASURE_PROMPT_END;
	if (!rt_compression_differ(a, b, RT_AB_X_TOL, both_pe))
		return 1;
	char pr[160] = ""; /* the prompts' bytes, when compared */
	if (both_pe && a->prompt > 0 && b->prompt > 0)
		snprintf(pr, sizeof pr, " (the prompt after its compress: A %.2fx, B %.2fx in bytes)",
		         a->bytes_prompt, b->bytes_prompt);
	/* the way to equal bytes: byte ratios, unless they were given (then a floor, the guards
	 * or a policy's own tiers kept a side from its budget: the notes below say which) */
	const char *how = r->o.bytes || r->o.equal_memory
	                          ? "a side did not reach its ratio: a longer --ctx lets a floor "
	                            "or guards bind, and a policy whose tiers alone compress "
	                            "further holds fewer bytes at any ratio"
	                          : "compare at ratios where both reach the same bytes: "
	                            "--byte-ratio, or --equal-memory";
	int n = snprintf(why, cap, "A (%s) holds %.2fx in entries and %.2fx in bytes at the end, "
	                 "B (%s) %.2fx and %.2fx%s: their bytes differ by more than %.0f%%, so a "
	                 "difference in quality is one of memory, not of policy (%s)",
	                 r->pol[0]->name, a->entries_end, a->bytes_end, r->pol[1]->name,
	                 b->entries_end, b->bytes_end, pr, RT_AB_X_TOL * 100, how);
	/* a budget a floor or guards raised is often why: say so */
	const char *t;
	for (int s = 0; s < 2; s++)
		for (unsigned m = row->side[s].notes; (t = rt_pick_note_next(&m));)
			if (n >= 0 && (size_t)n < cap)
				n += snprintf(why + n, cap - (size_t)n, "; %s (%s): %s", s ? "B" : "A",
				              r->pol[s]->name, t);
	return 0;
}

/* A row whose sides cannot be compared: no winner, the reason first. */
static void verdict_refuse(ab_row *row, const char *why)
{
	char was[sizeof row->verdict];
	snprintf(was, sizeof was, "%s", row->verdict);
	row->better = 0;
	row->significant = 0;
	snprintf(row->verdict, sizeof row->verdict, "no winner: %.800s [as measured: %.350s]", why,
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
	char why[800];
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
/* The compression in entries at the end that policy p reaches at ratio R over n tokens
 * under the split (docs/measuring.md): a streaming policy holds n / R (its ratio budget
 * follows the tokens seen once the prompt is done), a prompt-end one the prompt's P / R
 * plus every token after it (SnapKV does not evict while decoding), one that never
 * compresses all n. */
static double ab_end_x(const struct kvp_policy *p, const rt_eval_split *sp, int64_t n, double R)
{
	if (!p->compress)
		return 1;
	if (p->measure != KVP_MEASURE_PROMPT_END)
		return R;
	return (double)n / ((double)sp->prompt / R + (double)(n - sp->prompt));
}

/* The inverse of ab_end_x: the ratio at which p reaches compression x at the end, at least
 * 1 (x below what p can reach gives 1, x above it the largest finite ratio p needs). */
static double ab_ratio_for(const struct kvp_policy *p, const rt_eval_split *sp, int64_t n,
                           double x)
{
	if (p->measure != KVP_MEASURE_PROMPT_END)
		return x > 1 ? x : 1;
	const double left = (double)n / x - (double)(n - sp->prompt); /* what the prompt keeps */
	const double R = left > 0 ? (double)sp->prompt / left : 1e9;
	return R > 1 ? R : 1;
}

/* --equal-memory: at row k's ratio R, the side that would compress more at the end runs
 * at the ratio that holds what the other holds at R (SnapKV against TOVA at R = 4 over 512
 * tokens split 256 + 256: SnapKV ends at 512 / (64 + 256) = 1.6x, so TOVA runs at 1.6).
 * The verdict's rule (ab_comparable) still compares what each side reached. */
static void ab_equal_memory(ab_run *r, ab_row *row)
{
	double x[2];
	for (int s = 0; s < 2; s++) {
		row->side[s].ratio = row->ratio;
		x[s] = ab_end_x(r->pol[s], &r->split, r->n, row->ratio);
	}
	if (!r->pol[0]->compress || !r->pol[1]->compress || x[0] == x[1])
		return;
	const int hi = x[0] > x[1] ? 0 : 1;
	row->side[hi].ratio = ab_ratio_for(r->pol[hi], &r->split, r->n, x[1 - hi]);
}

static int run_ppl(ab_run *r, rt_err *err)
{
	const int64_t n = r->n;
	const int32_t cap = (int32_t)n;
	const int K = 2 * r->o.n_ratios;
	if (r->o.prompt >= n || r->o.score_from >= n) /* name the option given (-1: not) */
		return rt_err_set(err, "%s: %lld tokens: --%s %lld must be below them", r->o.text,
		                  (long long)n, r->o.prompt >= n ? "prompt" : "score-from",
		                  (long long)(r->o.prompt >= n ? r->o.prompt : r->o.score_from));
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
	for (int k = 0; k < r->o.n_ratios && r->o.equal_memory; k++)
		ab_equal_memory(r, &r->rows[k]);
	for (int k = 0; k < r->o.n_ratios && rc == 0; k++)
		for (int s = 0; s < 2 && rc == 0; s++) {
			ab_side *sd = &r->rows[k].side[s];
			rc = side_init(r, &r->rows[k], s, cap, prompt, err);
			sd->nll = RT_MALLOC((size_t)(n - 1) * sizeof(double));
			sc[2 * k + s].nll_tok = sd->nll;
			seqs[2 * k + s] = &sd->seq;
			/* a budget that cannot hold its guards at this ratio fails now, before
			 * the pass computes every other run for nothing (the pass's own check,
			 * at the first token, would fail only this run) */
			if (rc == 0 && rt_policy_check(&sd->seq.run, &sd->seq.kv, err) != 0) {
				char why[sizeof err->msg];
				snprintf(why, sizeof why, "%s", err->msg);
				rc = rt_err_set(err, "at ratio %g: %s (no ratio was measured; drop it "
				                "from the list)", sd->ratio, why);
			}
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
			sd->notes |= sd->seq.run.notes;
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
			sd->notes |= sd->seq.run.notes;
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
	if (!r->o.mode) /* agnostic when a side compresses at the prompt end */
		r->o.mode = rt_eval_needle_agnostic(r->pol, 2) ? "agnostic" : "aware";
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
		rt_verdict_head(row->better == 1 ? RT_VERDICT_A_BETTER
		                : row->better == 2 ? RT_VERDICT_B_BETTER : RT_VERDICT_TIE,
		                row->significant, na, nb, head, sizeof head);
		snprintf(row->verdict, sizeof row->verdict,
		         "%s: accuracy %d/%d vs %d/%d, discordant trials %d (A only) vs %d (B only), "
		         "exact sign test p = %.3g, %s", head, row->side[0].hits, n_trials,
		         row->side[1].hits, n_trials, row->n10, row->n01, row->p_value,
		         row->significant ? "significant" : "not significant");
		char why[800];
		if (!ab_comparable(r, row, 1, why, sizeof why))
			verdict_refuse(row, why);
	}
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
	int64_t n = rt_tokenize_prompt(r->tok, text, cut, 0, NULL, 0, err);
	if (n < 0) {
		free(text);
		char m2[512];
		snprintf(m2, sizeof m2, "%s", err->msg);
		return rt_err_set(err, "%s: %s", r->o.text, m2);
	}
	r->tokens = RT_MALLOC((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
	rt_tokenize_prompt(r->tok, text, cut, 0, r->tokens, n, err);
	free(text);
	r->n = n < want ? n : want;
	if (r->n < 2)
		return rt_err_set(err, "%s: %lld tokens; at least 2 are needed", r->o.text,
		                  (long long)r->n);
	return 0;
}

int rt_ab_run(const rt_ab_opts *o, const struct kvp_policy *const *reg, int n_reg,
              rt_ab_report_fn report)
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
	if (report(r, stdout, &err) != 0)
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
