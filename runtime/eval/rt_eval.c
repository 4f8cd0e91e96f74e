/*
 * rt_eval: chunked teacher-forced perplexity with the full cache; see rt_eval.h.
 */
#include "eval/rt_eval.h"

#include <math.h>
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

int rt_eval_ppl(const rt_model *m, const int32_t *tokens, int64_t n, const rt_ppl_opts *o,
                float *logprob_out, int32_t *top1_out, rt_ppl_result *res, rt_err *err)
{
	memset(res, 0, sizeof *res);
	const int V = m->hp.n_vocab;
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
	rt_kv kv;
	rt_fwd f;
	if (rt_model_kv_init(m, &kv, (int32_t)n, err) < 0)
		return -1;
	if (rt_fwd_init(&f, m, chunk, (int32_t)n, err) < 0) {
		rt_kv_free(&kv);
		return -1;
	}
	float *logits = malloc((size_t)chunk * V * sizeof *logits);
	if (!logits) {
		rt_fwd_free(&f);
		rt_kv_free(&kv);
		return rt_err_set(err, "%s: cannot allocate logits for a chunk of %d", m->path, chunk);
	}
	int rc = 0;
	double t0 = rt_now();
	for (int64_t done = 0; done < n && rc == 0; done += chunk) {
		int c = n - done < chunk ? (int)(n - done) : chunk;
		if (rt_model_forward(&f, &kv, tokens + done, c, (int32_t)done, logits, RT_LOGITS_ALL,
		                     err) < 0) {
			rc = -1;
			break;
		}
		int64_t e = rt_kv_entries(&kv);
		if (e > res->kv_entries_peak) {
			res->kv_entries_peak = e;
			res->kv_bytes_peak = rt_kv_bytes_used(&kv);
		}
		if (o->logits && fwrite(logits, sizeof(float), (size_t)c * V, o->logits) != (size_t)c * V) {
			rc = rt_err_set(err, "logits: write failed");
			break;
		}
		for (int r = 0; r < c; r++) {
			int64_t i = done + r;
			if (i + 1 >= n)
				break;
			int32_t top1;
			double lp = rt_logprob(logits + (size_t)r * V, V, tokens[i + 1], &top1);
			res->nll_sum -= lp;
			res->scored++;
			res->top1_hits += top1 == tokens[i + 1];
			if (logprob_out)
				logprob_out[i] = (float)lp;
			if (top1_out)
				top1_out[i] = top1;
			if (o->dump &&
			    fprintf(o->dump, "{\"pos\":%lld,\"token\":%d,\"logprob\":%.6f,\"top1\":%d}\n",
			            (long long)(i + 1), (int)tokens[i + 1], lp, (int)top1) < 0) {
				rc = rt_err_set(err, "dump: write failed");
				break;
			}
		}
	}
	res->seconds = rt_now() - t0;
	res->tokens = n;
	if (rc == 0) {
		res->nll_mean = res->nll_sum / (double)res->scored;
		res->ppl = exp(res->nll_mean);
		res->tokens_per_s = res->seconds > 0 ? (double)n / res->seconds : 0.0;
	}
	free(logits);
	rt_fwd_free(&f);
	rt_kv_free(&kv);
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
