/*
 * rt_tune: measure a policy's quality at a compression ratio and bisect a ratio grid for
 * the highest one within the limits (see rt_tune.h).
 */
#include "eval/rt_tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/rt_eval.h"
#include "eval/rt_needle.h"
#include "eval/rt_stats.h"
#include "policy/rt_pick.h"
#include "policy/rt_seq.h"

/* Answer tokens a passkey trial generates (what `needle` uses for passkey). */
#define TUNE_PASSKEY_GEN 8

/* Give a fresh sequence the point's choice: the parameters (NULL: the policy's defaults)
 * and the ratio R in entries or in bytes, or R as parameter o->param's value, applied as every front door's choice is
 * (rt_seq_apply). */
static int tune_seq_setup(rt_seq *s, const double *params, const rt_tune_opts *o, double R,
                          rt_err *err)
{
	const int n = s->p->n_params;
	double *vals = malloc((size_t)(n > 0 ? n : 1) * sizeof *vals);
	if (!vals)
		return rt_err_set(err, "tune: out of memory");
	if (params && n > 0)
		memcpy(vals, params, (size_t)n * sizeof *vals);
	else
		kvp_policy_param_defaults(s->p, vals);
	const int by_param = o->param >= 0 && o->param < n;
	if (by_param)
		vals[o->param] = R;
	const struct rt_pick pk = { .p = s->p, .kv_type = s->kv.type, .vals = vals,
		                    .ratio = by_param || o->bytes ? 0 : R,
		                    .byte_ratio = !by_param && o->bytes ? R : 0 };
	const int rc = rt_seq_apply(s, &pk, err);
	free(vals);
	return rc;
}

int rt_tune_point_binds(const rt_tune_point *pt)
{
	if (pt->error[0])
		return 1;
	/* a floor or the guards raised the budget above R's on every text: the budget in
	 * force is theirs, the same at every higher R (kernels/k_compress.h k_budget_force);
	 * not so for a parameter's value (a guard length, say), nor where one text binds */
	if (!pt->by_param && pt->raised_all)
		return 0;
	if (!pt->bytes)
		return 1;
	return pt->entries_x > 1 + 1e-9 || !(pt->bytes_x > pt->ratio * 1.02);
}

/* Text t at R under policy p's protocol (rt_eval_split_of): its mean KL into *kld over
 * *scored tokens and its compression into *x. A policy failure at R, or a measurement in
 * which the policy compressed before no scored token (it would read as lossless), goes to
 * pt->error. Returns 0, or -1 with err set. */
static int tune_text(const rt_model *m, const struct kvp_policy *p, const double *params,
                     const rt_tune_text *t, const rt_tune_opts *o, double R, rt_tune_point *pt,
                     double *kld, int64_t *scored, rt_compression *x, rt_err *err)
{
	rt_seq s, ref;
	memset(&s, 0, sizeof s);
	memset(&ref, 0, sizeof ref);
	rt_eval_score sc;
	rt_eval_score_init(&sc);
	rt_eval_split sp;
	rt_eval_split_of(rt_eval_measure_of(&p, 1), t->n, -1, -1, &sp);
	const int block = (int64_t)o->block < t->n ? o->block : (int)t->n;
	int rc = -1;
	if (rt_seq_init(&s, m, p, (int32_t)t->n, block, sp.prompt, err) != 0 ||
	    rt_seq_init(&ref, m, &rt_policy_full, (int32_t)t->n, block, sp.prompt, err) != 0)
		goto out;
	if (tune_seq_setup(&s, params, o, R, err) != 0 || rt_policy_check(&s.run, &s.kv, err) != 0) {
		snprintf(pt->error, sizeof pt->error, "%.80s: %.400s", t->name, err->msg);
		rc = 0;
		goto out;
	}
	rt_seq *runs[1] = { &s };
	rt_eval_loop lo = { .block = block, .batched = 1, .score_from = sp.score_from };
	if (rt_eval_runs(runs, 1, &ref, t->ids, t->n, &lo, &sc, NULL, err) != 0)
		goto out;
	rc = 0;
	if (sc.failed_at >= 0) {
		snprintf(pt->error, sizeof pt->error, "%.80s: %.400s", t->name, sc.error);
		goto out;
	}
	/* a compress that kept every entry is a point whose budget does not bind (KL 0, the
	 * frontier says so: rt_tune_point_binds), not an error; one that never ran before the
	 * scored tokens is */
	if (p->compress && sc.scored > 0 && sc.after_call == 0) {
		snprintf(pt->error, sizeof pt->error, "%.80s: the policy compressed before none of "
		         "the %lld scored tokens (%s protocol, prompt %lld tokens): its KL would be "
		         "the full cache's", t->name, (long long)sc.scored,
		         rt_eval_measure_name(sp.measure), (long long)sp.prompt);
		goto out;
	}
	rt_kld_summary ks;
	rt_kld_acc_summary(&sc.acc, &ks);
	*kld = ks.kld_mean;
	*scored = sc.scored;
	rt_compression_of(&s, t->n, x);
	pt->notes |= s.run.notes;
	pt->raised_all &= s.run.notes; /* a floor's or guards' bit kept only if every text has it */
out:
	rt_eval_score_free(&sc);
	rt_seq_free(&s);
	rt_seq_free(&ref);
	return rc;
}

/* Passkey trials at R: correct answers into pt->passkey_ok of pt->passkey_n. */
static int tune_passkey(const rt_model *m, const rt_tokenizer *tk, const struct kvp_policy *p,
                        const double *params, const rt_tune_opts *o, double R,
                        rt_tune_point *pt, rt_err *err)
{
	const int V = m->hp.n_vocab;
	float *logits = malloc((size_t)V * sizeof *logits), *one = malloc((size_t)V * sizeof *one);
	rt_seq s;
	memset(&s, 0, sizeof s);
	int rc = -1;
	if (!logits || !one) {
		rt_err_set(err, "tune: out of memory");
		goto out;
	}
	const int32_t cap = (int32_t)(o->passkey_len + TUNE_PASSKEY_GEN);
	if (rt_seq_init(&s, m, p, cap, o->block, -1, err) != 0)
		goto out;
	rt_seq_use_spans(&s);
	if (tune_seq_setup(&s, params, o, R, err) != 0) {
		snprintf(pt->error, sizeof pt->error, "passkey: %.400s", err->msg);
		rc = 0;
		goto out;
	}
	const rt_needle_how how = { .n_gen = TUNE_PASSKEY_GEN };
	rt_seq *all[1] = { &s };
	for (int d = 0; d < o->n_depths; d++) {
		rt_needle_prompt np;
		if (rt_needle_passkey(tk, o->passkey_len, o->depths[d], o->seed + (uint64_t)d, 0, &np,
		                      err) != 0)
			goto out;
		rt_needle_answer ans;
		memset(&ans, 0, sizeof ans);
		int trc = rt_needle_trial(all, 1, NULL, tk, &np, &how, logits, one, &ans, err);
		rt_needle_prompt_free(&np);
		if (trc != 0) { /* the policy cannot run this prompt at R */
			snprintf(pt->error, sizeof pt->error, "passkey (depth %g): %.400s", o->depths[d],
			         err->msg);
			rc = 0;
			goto out;
		}
		pt->passkey_ok += ans.correct;
		pt->passkey_n++;
	}
	rc = 0;
out:
	rt_seq_free(&s);
	free(logits);
	free(one);
	return rc;
}

int rt_tune_measure(const rt_model *m, const rt_tokenizer *tk, const struct kvp_policy *p,
                    const double *params, const rt_tune_text *texts, int n_texts,
                    const rt_tune_opts *o, double R, rt_tune_point *pt, rt_err *err)
{
	memset(pt, 0, sizeof *pt);
	pt->ratio = R;
	pt->bytes = o->bytes;
	pt->by_param = o->param >= 0;
	pt->raised_all = KVP_NOTE_FLOOR | KVP_NOTE_GUARDS;
	if (n_texts < 1 || n_texts > RT_TUNE_MAX_TEXTS || !(o->param >= 0 ? isfinite(R) : R >= 1) ||
	    o->block < 1 || (o->param >= 0 && o->param >= p->n_params) ||
	    (o->min_passkey >= 0 && (!tk || o->n_depths < 1 || o->n_depths > RT_TUNE_MAX_DEPTHS)))
		return rt_err_set(err, "tune: %d texts at ratio %g (1..%d texts, ratio >= 1 or a "
		                  "finite value of a parameter of the policy, passkey needs the "
		                  "tokenizer and 1..%d depths)", n_texts, R,
		                  RT_TUNE_MAX_TEXTS, RT_TUNE_MAX_DEPTHS);
	double wsum = 0;
	int64_t scored = 0;
	rt_compression xs[RT_TUNE_MAX_TEXTS];
	pt->measure = rt_eval_measure_of(&p, 1);
	for (int i = 0; i < n_texts; i++) {
		double kld = 0;
		int64_t sn = 0;
		if (tune_text(m, p, params, &texts[i], o, R, pt, &kld, &sn, &xs[i], err) != 0)
			return -1;
		if (pt->error[0])
			return 0;
		pt->kld_text[i] = kld;
		wsum += kld * (double)sn;
		scored += sn;
		if (i == 0 || kld > pt->kld_worst) {
			pt->kld_worst = kld;
			pt->worst = i;
		}
	}
	pt->kld_mean = wsum / (double)scored;
	rt_compression_mean(xs, n_texts, &pt->x);
	/* what the budget was asked of: a prompt-end policy's prompt at its compress (its end
	 * figures also count the continuation, which no policy compresses) */
	const int pe = pt->measure == KVP_MEASURE_PROMPT_END && pt->x.prompt > 0;
	pt->entries_x = pe ? pt->x.entries_prompt : pt->x.entries_end;
	pt->bytes_x = pe ? pt->x.bytes_prompt : pt->x.bytes_end;
	if (o->min_passkey >= 0 && tune_passkey(m, tk, p, params, o, R, pt, err) != 0)
		return -1;
	pt->pass = !pt->error[0] && pt->kld_worst <= o->max_kld &&
	           (o->min_passkey < 0 ||
	            (double)pt->passkey_ok >= o->min_passkey * (double)pt->passkey_n - 1e-9);
	return 0;
}

int rt_tune_search(const rt_model *m, const rt_tokenizer *tk, const struct kvp_policy *p,
                   const double *params, const rt_tune_text *texts, int n_texts,
                   const rt_tune_opts *o, const double *grid, int n_grid,
                   rt_tune_point *walked, int *n_walked, int *chosen,
                   void (*progress)(void *user, const rt_tune_point *pt), void *user,
                   rt_err *err)
{
	*n_walked = 0;
	*chosen = -1;
	if (n_grid < 1 || n_grid > RT_TUNE_MAX_GRID)
		return rt_err_set(err, "tune: %d ratios in the grid (1..%d)", n_grid, RT_TUNE_MAX_GRID);
	for (int i = 0; i < n_grid; i++)
		if (!(o->param >= 0 ? isfinite(grid[i]) : grid[i] >= 1) ||
		    (i > 0 && !(grid[i] > grid[i - 1])))
			return rt_err_set(err, "tune: the grid must be increasing and finite, ratios >= 1 "
			                  "(%g at place %d)", grid[i], i + 1);
	int lo = -1, hi = n_grid; /* grid[lo] passes, grid[hi] fails (-1, n_grid: none yet) */
	while (hi - lo > 1) {
		const int mid = lo + (hi - lo) / 2;
		rt_tune_point pt;
		if (rt_tune_measure(m, tk, p, params, texts, n_texts, o, grid[mid], &pt, err) != 0)
			return -1;
		if (progress)
			progress(user, &pt);
		int at = *n_walked; /* insert in ratio order */
		while (at > 0 && walked[at - 1].ratio > pt.ratio) {
			walked[at] = walked[at - 1];
			at--;
		}
		walked[at] = pt;
		(*n_walked)++;
		if (pt.pass)
			lo = mid;
		else
			hi = mid;
	}
	for (int i = 0; lo >= 0 && i < *n_walked; i++)
		if (walked[i].ratio == grid[lo])
			*chosen = i;
	/* a higher ratio that compresses no further than a lower passing one measured (a floor
	 * or the guards hold the budget at this length) is not chosen: the lowest such is */
	for (int i = 0; *chosen > 0 && o->param < 0 && i < *chosen; i++) {
		const rt_tune_point *a = &walked[i], *c = &walked[*chosen];
		const double xa = o->bytes ? a->bytes_x : a->entries_x;
		const double xc = o->bytes ? c->bytes_x : c->entries_x;
		if (a->pass && xa >= xc * (1 - 0.01)) {
			*chosen = i;
			break;
		}
	}
	return 0;
}
