/*
 * rt_ab_report: the reports of an A/B run; see rt_ab_report.h.
 */
#include "eval/rt_ab_report.h"
#include "eval/rt_ab_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/rt_pick.h"
#include "report/rt_json.h"
#include "report/rt_svg.h"

/* The metrics of every report (table, JSON, CSV, plots), one row each: X(ID, name, fmt,
 * task, axis). fmt: 0 %.5f, 1 integer, 2 bytes (MiB in the table), 3 %.1f, 4 %.2fx; task:
 * 0 ppl only, 1 needle only, 2 both, 3 both with a prompt split (prompt-end: the prompt's
 * compression at its compress, what the budget was asked of, where the end figures also
 * count the uncompressed tokens after it). Each row's value is metric_val's case. */
#define AB_METRICS(X)                                                                      \
	X(PPL, "ppl", 0, 0, "perplexity")                                                  \
	X(KLD_MEAN, "kld_mean", 0, 0, "mean KL(full || policy), nats")                     \
	X(KLD_P99, "kld_p99", 0, 0, "99th percentile KL, nats")                            \
	X(KLD_MAX, "kld_max", 0, 0, "max KL, nats")                                        \
	X(PPL_RATIO, "ppl_ratio", 0, 0, "ppl / ppl(full)")                                 \
	X(SAME_TOP1, "same_top1", 0, 0, "same top-1 token as full")                        \
	X(RMS_DP, "rms_dp", 0, 0, "RMS dp of the correct token")                           \
	X(ACC, "accuracy", 0, 1, "passkey accuracy")                                       \
	X(ENTRIES, "kv_entries_peak", 1, 2, "peak KV entries (all heads)")                 \
	X(BYTES, "kv_bytes_peak", 2, 2, "peak KV bytes")                                   \
	X(COMPRESSION, "compression", 4, 2, "compression in entries at the end")           \
	X(BYTES_X, "bytes_compression", 4, 2, "compression in bytes (f16 full cache) at the end") \
	X(COMPRESSION_PEAK, "compression_peak", 4, 2, "compression in entries at peak")    \
	X(BYTES_X_PEAK, "bytes_compression_peak", 4, 2, "compression in bytes (f16 full cache) at peak") \
	X(COMPRESSION_PROMPT, "prompt_compression", 4, 3, "compression in entries of the prompt") \
	X(BYTES_X_PROMPT, "prompt_bytes_compression", 4, 3, "compression in bytes of the prompt") \
	X(TPS, "tokens_per_s", 3, 2, "tokens/s")                                           \
	X(EVENTS, "compress_events", 1, 2, "compress calls")                               \
	X(POLICY_S, "policy_seconds", 0, 2, "seconds in policy code")

enum ab_metric {
#define AB_METRIC_ID_(id, name, fmt, task, axis) M_##id,
	AB_METRICS(AB_METRIC_ID_)
#undef AB_METRIC_ID_
	M_COUNT
};

static const struct {
	const char *name;
	int fmt;        /* 0 %.5f, 1 integer, 2 bytes (MiB in the table), 3 %.1f, 4 %.2fx */
	int needle;     /* 0 ppl only, 1 needle only, 2 both, 3 both with a prompt split */
	const char *axis;
} METRICS[M_COUNT] = {
#define AB_METRIC_ROW_(id, name, fmt, task, axis) [M_##id] = { name, fmt, task, axis },
	AB_METRICS(AB_METRIC_ROW_)
#undef AB_METRIC_ROW_
};

static int metric_on(const ab_run *r, int m)
{
	int needle = !strcmp(r->o.task, "needle");
	if (METRICS[m].needle == 3) /* the reference's split: the same prompt as both sides' */
		return r->ref_x.prompt > 0;
	return METRICS[m].needle == 2 || METRICS[m].needle == needle;
}

/* Value of metric m for a side, or for the reference when sd is NULL. */
static double metric_val(const ab_run *r, const ab_side *sd, int m)
{
	const rt_seq_stats *st = sd ? &sd->st : &r->ref_st;
	const int64_t scored = r->n - r->split.score_from;
	switch ((enum ab_metric)m) { /* every row (-Wswitch names a missing one) */
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
	case M_COMPRESSION_PROMPT: return sd ? sd->x.entries_prompt : r->ref_x.entries_prompt;
	case M_BYTES_X_PROMPT: return sd ? sd->x.bytes_prompt : r->ref_x.bytes_prompt;
	case M_TPS: return st->seconds > 0 ? (double)st->tokens / st->seconds : NAN;
	case M_EVENTS: return (double)st->compress_events;
	case M_POLICY_S: return st->policy_seconds;
	case M_COUNT: break;
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

/* The parameters in effect as --set takes them, "recent=10% window=32"; under a ratio, the
 * budget that replaces the policy's whole budget expression, and the parameters only that
 * expression read: "recent=10%; budget = context / ratio, replacing the policy's (heavy has
 * no effect)". */
static void params_str(const rt_seq *s, char *buf, size_t cap)
{
	const double R = s->run.ctx.ratio > 0 ? s->run.ctx.ratio : s->run.ctx.byte_ratio;
	size_t len = 0;
	int shown = 0, replaced = 0;
	buf[0] = 0;
	for (int i = 0; i < s->p->n_params && len < cap; i++)
		if (kvp_param_in_effect(s->p, i, R)) {
			char v[48]; /* as --set takes it: a ratio as a percentage */
			rt_param_format_set(&s->p->params[i], s->run.params[i], v, sizeof v);
			len += (size_t)snprintf(buf + len, cap - len, "%s%s=%s", shown++ ? " " : "",
			                        s->p->params[i].name, v);
		}
	if (!shown && len < cap)
		len += (size_t)snprintf(buf + len, cap - len, "(no parameters in effect)");
	if (R <= 0 || !s->p->compress || len >= cap)
		return;
	len += (size_t)snprintf(buf + len, cap - len, "; budget = %s, replacing the policy's",
	                        s->run.ctx.byte_ratio > 0 ? "1/ratio of an f16 full cache's bytes"
	                                                  : "context / ratio");
	for (int i = 0; i < s->p->n_params && len < cap; i++)
		if (!kvp_param_in_effect(s->p, i, R))
			len += (size_t)snprintf(buf + len, cap - len, "%s%s", replaced++ ? ", " : " (",
			                        s->p->params[i].name);
	if (replaced && len < cap)
		snprintf(buf + len, cap - len, " %s no effect)", replaced > 1 ? "have" : "has");
}

static void write_table(const ab_run *r, FILE *out)
{
	const int needle = !strcmp(r->o.task, "needle");
	fprintf(out, "ab: A = %s (%s), B = %s (%s)\n", r->pol[0]->name, r->pol[0]->source,
	        r->pol[1]->name, r->pol[1]->source);
	for (int s = 0; s < 2; s++) {
		char ps[1024];
		params_str(&r->rows[0].side[s].seq, ps, sizeof ps);
		fprintf(out, "  %s: %s%s\n", s ? "B" : "A", ps,
		        r->rows[0].side[s].ratio_applied ? "" : "; never compresses, ratio ignored");
	}
	if (needle)
		fprintf(out, "task needle (passkey, question-%s): %d trial%s (%d length%s x %d "
		        "depth%s); model %s; %d thread%s\n", r->o.mode, r->ref_trials,
		        r->ref_trials == 1 ? "" : "s", r->o.n_lengths, r->o.n_lengths == 1 ? "" : "s",
		        r->o.n_depths, r->o.n_depths == 1 ? "" : "s", r->o.model, r->threads,
		        r->threads == 1 ? "" : "s");
	else
		fprintf(out, "task ppl, %s protocol: %lld tokens of %s, the first %lld the prompt, "
		        "positions %lld..%lld scored (%lld tokens); model %s; %d thread%s\n",
		        r->split.measure == KVP_MEASURE_PROMPT_END ? "prompt-end" : "streaming",
		        (long long)r->n, r->o.text, (long long)r->split.prompt,
		        (long long)r->split.score_from, (long long)(r->n - 1),
		        (long long)(r->n - r->split.score_from), r->o.model, r->threads,
		        r->threads == 1 ? "" : "s");
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
		if (r->o.equal_memory)
			fprintf(out, "equal memory: %s at ratio %.4g, %s at ratio %.4g (each side's "
			        "ratio chosen to hold what the other holds at the end)\n",
			        r->pol[0]->name, row->side[0].ratio, r->pol[1]->name, row->side[1].ratio);
		/* the name column as wide as the longest metric (prompt_bytes_compression) */
		fprintf(out, "%-24s %16s %16s %16s\n", "metric", "full (ref)", r->pol[0]->name,
		        r->pol[1]->name);
		for (int m = 0; m < M_COUNT; m++) {
			if (!metric_on(r, m))
				continue;
			char a[48], b[48], c[48];
			fmt_val(a, sizeof a, METRICS[m].fmt, metric_val(r, NULL, m));
			fmt_val(b, sizeof b, METRICS[m].fmt, metric_val(r, &row->side[0], m));
			fmt_val(c, sizeof c, METRICS[m].fmt, metric_val(r, &row->side[1], m));
			fprintf(out, "%-24s %16s %16s %16s\n", METRICS[m].name, a, b, c);
		}
		if (!needle)
			fprintf(out, "dNLL (B - A)     mean %+.5f nats/token, 95%% CI [%+.5f, %+.5f] "
			        "(paired circular block bootstrap, block %lld tokens, %d resamples)\n",
			        row->ci.mean, row->ci.lo, row->ci.hi, (long long)row->ci.block_len,
			        row->ci.n_resamples);
		const char *t;
		for (int s = 0; s < 2; s++) /* a floor or guards raised the budget (as ppl's notes) */
			for (unsigned n = row->side[s].notes; (t = rt_pick_note_next(&n));)
				fprintf(out, "note: %s (%s): %s\n", s ? "B" : "A", r->pol[s]->name, t);
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
	fprintf(f, "], \"ratio_kind\": \"%s\", \"equal_memory\": %s, \"bootstrap\": {\"resamples\": %d, \"seed\": ",
	        r->o.bytes ? "bytes" : "entries", r->o.equal_memory ? "true" : "false", r->o.resamples);
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
		fputs(", \"ratio\": ", f); /* the side's own under --equal-memory */
		rt_json_num(f, row->side[s].ratio > 0 ? row->side[s].ratio : row->ratio);
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
		fputs(", \"budget_notes\": ", f); /* as ppl's and needle's JSON */
		rt_pick_notes_json(f, row->side[s].notes);
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
	int tl = snprintf(title, sizeof title, "ab (%s): A = %s, B = %s", r->o.task,
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

int rt_ab_report_write(const struct ab_run *r, FILE *out, rt_err *err)
{
	write_table(r, out);
	fflush(out);
	if ((r->o.json && write_json(r, r->o.json, err) != 0) ||
	    (r->o.csv && write_csv(r, r->o.csv, err) != 0) ||
	    (r->o.plot && write_plot(r, r->o.plot, err) != 0))
		return -1;
	return 0;
}
