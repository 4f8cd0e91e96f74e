/*
 * rt_eval: the perplexity / KL loop over K runs and the full-cache reference; see rt_eval.h.
 */
#include "eval/rt_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/rt_json.h"

double rt_logprob(const float *logits, int n_vocab, int32_t tok, int32_t *top1)
{
	int32_t best = 0;
	float mx = logits[0];
	for (int i = 1; i < n_vocab; i++)
		if (logits[i] > mx)
			mx = logits[i], best = i;
	double s = 0.0;
	for (int i = 0; i < n_vocab; i++)
		s += exp((double)logits[i] - (double)mx);
	if (top1)
		*top1 = best;
	return (double)logits[tok] - (double)mx - log(s);
}

void rt_eval_score_init(rt_eval_score *s)
{
	memset(s, 0, sizeof *s);
	s->failed_at = -1;
	rt_kld_acc_init(&s->acc);
}

void rt_eval_score_free(rt_eval_score *s)
{
	rt_kld_acc_free(&s->acc);
}

enum kvp_measure rt_eval_measure_of(const struct kvp_policy *const *p, int K)
{
	for (int k = 0; k < K; k++)
		if (p[k]->compress && p[k]->measure == KVP_MEASURE_PROMPT_END)
			return KVP_MEASURE_PROMPT_END;
	return KVP_MEASURE_STREAM;
}

void rt_eval_split_of(enum kvp_measure m, int64_t n, int64_t prompt, int64_t from,
                      rt_eval_split *out)
{
	out->measure = m;
	if (prompt >= 1 && prompt < n) {
		out->prompt = prompt;
		out->score_from = prompt + 1;
	} else if (m == KVP_MEASURE_PROMPT_END && n >= 4) {
		out->prompt = n / 2;
		out->score_from = n / 2 + 1;
	} else {
		out->prompt = n;
		out->score_from = 1;
	}
	if (from >= 1)
		out->score_from = from;
}

int rt_eval_needle_agnostic(const struct kvp_policy *const *p, int K)
{
	return rt_eval_measure_of(p, K) == KVP_MEASURE_PROMPT_END;
}

const char *rt_eval_measure_name(enum kvp_measure m)
{
	return m == KVP_MEASURE_PROMPT_END ? "prompt_end" : "stream";
}

int rt_eval_uncompressed(const struct kvp_policy *p, const rt_eval_score *s)
{
	return p->compress && s->scored > 0 && s->compressed == 0;
}

/* What every block of one rt_eval_runs call shares. */
typedef struct eval_ctx {
	rt_seq *const *runs;
	const rt_eval_loop *o;
	const int32_t *tok;
	int64_t n, from;
	int V;
} eval_ctx;

/* Run 0's per-token extras: the arrays and the dump line. */
static int score_extras(const eval_ctx *e, int64_t pos, double l, int32_t top1,
                        const rt_tok_cmp *cmp, rt_err *err)
{
	const rt_eval_loop *o = e->o;
	if (o->logprob_out)
		o->logprob_out[pos - 1] = (float)l;
	if (o->top1_out)
		o->top1_out[pos - 1] = top1;
	if (!o->dump)
		return 0;
	int bad = fprintf(o->dump, "{\"pos\":%lld,\"token\":%d,\"logprob\":%.6f,\"top1\":%d",
	                  (long long)pos, (int)e->tok[pos], l, (int)top1) < 0;
	if (cmp)
		bad |= fprintf(o->dump, ",\"logprob_ref\":%.6f,\"kld\":%.9g", -cmp->nll_p, cmp->kld) < 0;
	bad |= fputs("}\n", o->dump) < 0;
	return bad ? rt_err_set(err, "%s: write failed", o->dump_name ? o->dump_name : "dump") : 0;
}

/* Score run k's rows lq[c × V] of the block at off, against the reference's rows lp (or
 * NULL). */
static int score_block(const eval_ctx *e, int k, rt_eval_score *sc, const float *lq,
                       const float *lp, int64_t off, int c, rt_err *err)
{
	const int V = e->V;
	for (int j = 0; j < c && off + j + 1 < e->n; j++) {
		int64_t pos = off + j + 1;
		if (pos < e->from)
			continue;
		int32_t tgt = e->tok[pos], top1;
		const float *rq = lq + (size_t)j * V;
		double l = rt_logprob(rq, V, tgt, &top1);
		sc->nll -= l;
		sc->scored++;
		/* row pos - 1 came after tokens 0..pos-1 were fed: compressed when the first
		 * compress ran after at most pos - 1 of them */
		const int64_t first = e->runs[k]->st.first_compress_seen;
		sc->compressed += first > 0 && first <= pos - 1;
		const int64_t call = e->runs[k]->st.first_call_seen;
		sc->after_call += call > 0 && call <= pos - 1;
		sc->hits += top1 == tgt;
		rt_tok_cmp cmp;
		if (lp) {
			if (rt_stats_token_cmp(lp + (size_t)j * V, rq, V, tgt, &cmp, err) != 0) {
				char why[sizeof err->msg];
				snprintf(why, sizeof why, "%s", err->msg);
				return rt_err_set(err, "token %lld: %s", (long long)pos, why);
			}
			rt_kld_acc_add(&sc->acc, &cmp);
		}
		if (sc->nll_tok)
			sc->nll_tok[pos - 1] = lp ? cmp.nll_q : -l;
		if (k == 0 && score_extras(e, pos, l, top1, lp ? &cmp : NULL, err) != 0)
			return -1;
	}
	return 0;
}

/* Subtract the reference's log-probabilities of the block's scored tokens from *nll, one
 * token at a time (the order of a running sum). */
static void ref_block_nll(const eval_ctx *e, const float *lp, int64_t off, int c, double *nll)
{
	for (int j = 0; j < c && off + j + 1 < e->n; j++)
		if (off + j + 1 >= e->from)
			*nll -= rt_logprob(lp + (size_t)j * e->V, e->V, e->tok[off + j + 1], NULL);
}

static int write_logits(const eval_ctx *e, const float *lg, int c, rt_err *err)
{
	const rt_eval_loop *o = e->o;
	if (o->logits && fwrite(lg, sizeof(float), (size_t)c * e->V, o->logits) != (size_t)c * e->V)
		return rt_err_set(err, "%s: write failed", o->logits_name ? o->logits_name : "logits");
	return 0;
}

static void run_failed(rt_eval_score *sc, int64_t off, const char *why)
{
	sc->failed_at = off;
	snprintf(sc->error, sizeof sc->error, "%s", why);
}

/* The reference and the K runs fed one after the other into lp and lq ([c × V] each). */
static int block_each(const eval_ctx *e, rt_seq *const *runs, int K, rt_seq *ref, int64_t off,
                      int c, float *lq, float *lp, rt_eval_score *scores, double *ref_nll,
                      rt_err *err)
{
	const int32_t *t = e->tok + off;
	if (ref) {
		if (rt_seq_feed(ref, t, c, lp, RT_LOGITS_ALL, err) != 0) {
			char why[sizeof err->msg];
			snprintf(why, sizeof why, "%s", err->msg);
			return rt_err_set(err, "the full-cache reference failed: %s", why);
		}
		ref_block_nll(e, lp, off, c, ref_nll);
	}
	for (int k = 0; k < K; k++) {
		rt_err e2 = { "" };
		if (scores[k].failed_at >= 0)
			continue;
		if (rt_seq_feed(runs[k], t, c, lq, RT_LOGITS_ALL, &e2) != 0) {
			run_failed(&scores[k], off, e2.msg);
			continue;
		}
		if ((k == 0 && write_logits(e, lq, c, err) != 0) ||
		    score_block(e, k, &scores[k], lq, ref ? lp : NULL, off, c, err) != 0)
			return -1;
	}
	return 0;
}

/* All sequences through the batch b (the reference, when there is one, is its last). */
static int block_batch(const eval_ctx *e, rt_seq_batch *b, int K, int has_ref, int64_t off,
                       int c, float *lg, rt_eval_score *scores, double *ref_nll, rt_err *err)
{
	const size_t rows = (size_t)c * e->V;
	if (rt_seq_batch_feed(b, e->tok + off, c, lg, RT_LOGITS_ALL, err) != 0)
		return -1;
	const float *lp = has_ref ? lg + (size_t)K * rows : NULL;
	if (has_ref) {
		if (rt_seq_batch_error(b, K))
			return rt_err_set(err, "the full-cache reference failed: %s",
			                  rt_seq_batch_error(b, K));
		ref_block_nll(e, lp, off, c, ref_nll);
	}
	for (int k = 0; k < K; k++) {
		if (scores[k].failed_at >= 0)
			continue;
		if (rt_seq_batch_error(b, k)) {
			run_failed(&scores[k], off, rt_seq_batch_error(b, k));
			continue;
		}
		if ((k == 0 && write_logits(e, lg, c, err) != 0) ||
		    score_block(e, k, &scores[k], lg + (size_t)k * rows, lp, off, c, err) != 0)
			return -1;
	}
	return 0;
}

static int any_active(const rt_eval_score *scores, int K)
{
	for (int k = 0; k < K; k++)
		if (scores[k].failed_at < 0)
			return 1;
	return 0;
}

int rt_eval_runs(rt_seq *const *runs, int K, rt_seq *ref, const int32_t *tokens, int64_t n,
                 const rt_eval_loop *o, rt_eval_score *scores, double *ref_nll, rt_err *err)
{
	if (K < 1 || n < 2 || o->block < 1)
		return rt_err_set(err, "evaluation: %d runs over %lld tokens in blocks of %d", K,
		                  (long long)n, o->block);
	eval_ctx e = { runs, o, tokens, n, o->score_from > 1 ? o->score_from : 1,
		       runs[0]->m->hp.n_vocab };
	int on_dev = ref && ref->dev.forward;
	for (int k = 0; k < K; k++)
		on_dev |= runs[k]->dev.forward != NULL;
	/* a sequence on a device runs the device's forward: the batch's shared GEMMs are the
	 * CPU's, so device sequences are fed one after the other */
	const int S = K + (ref != NULL), batched = o->batched && S > 1 && !on_dev;
	const size_t rows = (size_t)o->block * e.V;
	rt_seq_batch b = { 0 };
	rt_seq **all = batched ? calloc((size_t)S, sizeof *all) : NULL;
	float *lg = malloc((batched ? (size_t)S : ref ? 2 : 1) * rows * sizeof *lg);
	double rnll = 0;
	int rc = 0;
	if (!lg || (batched && !all)) {
		rc = rt_err_set(err, "evaluation: out of memory for the logits of %d x %d tokens", S,
		                o->block);
		goto out;
	}
	for (int k = 0; batched && k < S; k++)
		all[k] = k < K ? runs[k] : ref;
	if (batched && rt_seq_batch_init(&b, all, S, o->block, err) != 0) {
		rc = -1;
		goto out;
	}
	for (int k = 0; ref && k < K; k++)
		rt_kld_acc_reserve(&scores[k].acc, n);
	for (int64_t off = 0; off < n && rc == 0 && any_active(scores, K); off += o->block) {
		int c = n - off < o->block ? (int)(n - off) : o->block;
		rc = batched ? block_batch(&e, &b, K, ref != NULL, off, c, lg, scores, &rnll, err)
		             : block_each(&e, runs, K, ref, off, c, lg, lg + rows, scores, &rnll, err);
		if (o->progress)
			o->progress(o->progress_user, off + c, n);
	}
	if (ref_nll)
		*ref_nll = rnll;
out:
	rt_seq_batch_free(&b);
	free(all);
	free(lg);
	return rc;
}

int rt_eval_ppl(const rt_model *m, const int32_t *tokens, int64_t n, const rt_ppl_opts *o,
                float *logprob_out, int32_t *top1_out, rt_ppl_result *res, rt_err *err)
{
	memset(res, 0, sizeof *res);
	if (n < 2)
		return rt_err_set(err, "%s: perplexity needs at least 2 tokens, got %lld", m->path,
		                  (long long)n);
	if (n > m->hp.n_ctx)
		return rt_err_set(err, "%s: %lld tokens exceed the model's context_length %d", m->path,
		                  (long long)n, (int)m->hp.n_ctx);
	int chunk = o->chunk;
	if (chunk < 1)
		return rt_err_set(err, "%s: invalid chunk %d", m->path, chunk);
	if (chunk > n)
		chunk = (int)n;
	rt_seq s;
	if (rt_seq_init(&s, m, &rt_policy_full, (int32_t)n, chunk, -1, err) != 0)
		return -1;
	rt_eval_loop lo = { .block = chunk, .dump = o->dump, .dump_name = "dump",
		            .logits = o->logits, .logits_name = "logits",
		            .logprob_out = logprob_out, .top1_out = top1_out };
	rt_eval_score sc;
	rt_eval_score_init(&sc);
	rt_seq *one = &s;
	double t0 = rt_now();
	int rc = rt_eval_runs(&one, 1, NULL, tokens, n, &lo, &sc, NULL, err);
	if (rc == 0 && sc.failed_at >= 0)
		rc = rt_err_set(err, "%s: %s", m->path, sc.error);
	res->seconds = rt_now() - t0;
	res->tokens = n;
	res->scored = sc.scored;
	res->nll_sum = sc.nll;
	res->top1_hits = sc.hits;
	rt_seq_stats st = rt_seq_stats_get(&s);
	res->kv_entries_peak = st.kv_entries_peak;
	res->kv_bytes_peak = st.kv_bytes_peak;
	if (rc == 0) {
		res->nll_mean = res->nll_sum / (double)res->scored;
		res->ppl = exp(res->nll_mean);
		res->tokens_per_s = res->seconds > 0 ? (double)n / res->seconds : 0.0;
	}
	rt_eval_score_free(&sc);
	rt_seq_free(&s);
	return rc;
}

void rt_eval_json(FILE *out, const rt_model *m, const char *model_sha256, const char *text,
                  const char *policy, const rt_ppl_result *r, int threads, int chunk)
{
	fputs("{\"policy\":", out);
	rt_json_str(out, policy);
	fputs(",\"model\":", out);
	rt_json_str(out, m->path);
	if (model_sha256 && *model_sha256) {
		fputs(",\"model_sha256\":", out);
		rt_json_str(out, model_sha256);
	}
	if (text) {
		fputs(",\"text\":", out);
		rt_json_str(out, text);
	}
	fprintf(out, ",\"tokens\":%lld,\"scored\":%lld", (long long)r->tokens, (long long)r->scored);
	rt_json_member_fixed(out, "ppl", r->ppl, 6);
	rt_json_member_fixed(out, "nll_mean", r->nll_mean, 6);
	rt_json_member_fixed(out, "top1_acc",
	                     r->scored ? (double)r->top1_hits / (double)r->scored : 0.0, 6);
	rt_json_member_fixed(out, "seconds", r->seconds, 3);
	rt_json_member_fixed(out, "tokens_per_s", r->tokens_per_s, 2);
	fprintf(out, ",\"kv_entries_peak\":%lld,\"kv_bytes_peak\":%lld,\"threads\":%d,\"chunk\":%d}\n",
	        (long long)r->kv_entries_peak, (long long)r->kv_bytes_peak, threads, chunk);
}
