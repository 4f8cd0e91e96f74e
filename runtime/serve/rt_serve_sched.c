/*
 * rt_serve_sched: a request's lifetime (its JSON, its streamed events, its finish and trace
 * line), admission by footprint, and the scheduler thread: continuous batching over the
 * active sequences, sampling and the stop rules; rt_serve_footprint. Locking:
 * rt_serve_int.h, above struct srv.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kv/rt_kvbytes.h"
#include "kv/rt_kvpool.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_pick.h"
#include "serve/rt_serve_int.h"

#define SRV_HIST_DEF(id, nm, hp, ...)                                                      \
	[id] = { .name = nm, .help = hp, .le = (const double[]){ __VA_ARGS__ },                   \
	         .n = (int)(sizeof((const double[]){ __VA_ARGS__ }) / sizeof(double)) },
const srv_hist_def srv_hists[SRV_N_HISTS] = { SRV_HISTS(SRV_HIST_DEF) };
#undef SRV_HIST_DEF
#define SRV_HIST_LEN(id, nm, hp, ...) \
	_Static_assert(sizeof((const double[]){ __VA_ARGS__ }) / sizeof(double) <= SRV_HIST_MAX, \
	               nm ": more bounds than SRV_HIST_MAX");
SRV_HISTS(SRV_HIST_LEN)
#undef SRV_HIST_LEN

void srv_hist_observe(srv *S, int h, double seconds)
{
	const srv_hist_def *d = &srv_hists[h];
	srv_hist *x = &S->hist[h];
	int b = 0;
	while (b < d->n && seconds > d->le[b])
		b++;
	x->count[b]++;
	x->n++;
	x->sum += seconds;
}

/* ---- request lifetime --------------------------------------------------------------- */

/* Bytes of s[0..n) that form complete UTF-8 characters (an incomplete sequence at the
 * end is held back unless final). */
static size_t utf8_complete(const char *s, size_t n, int final)
{
	if (final || n == 0)
		return n;
	size_t i = n, back = 0;
	while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
		i--, back++;
	if (i == 0)
		return n;
	unsigned char c = (unsigned char)s[i - 1];
	size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
	return need > back + 1 ? i - 1 : n;
}

void srv_req_free(req *r)
{
	if (r->seq_live)
		rt_seq_free(&r->seq);
	rt_sampler_free(&r->smp);
	free(r->prompt);
	free(r->span);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->out);
	free(r->sse);
	free(r->params);
	pthread_cond_destroy(&r->cv);
	r->S->live--;
	free(r);
}

void srv_req_unref(req *r)
{
	if (--r->refs == 0)
		srv_req_free(r);
}

json_t *srv_usage_obj(const req *r)
{
	json_t *u = json_object();
	json_object_set_new(u, "prompt_tokens", json_integer(r->n_prompt));
	json_object_set_new(u, "completion_tokens", json_integer(r->n_gen));
	json_object_set_new(u, "total_tokens", json_integer(r->n_prompt + r->n_gen));
	return u;
}

/* The "kv" extension of a response: the policy, its parameters, the KV figures. */
json_t *srv_kv_obj(const srv *S, const req *r)
{
	const struct kvp_policy *p = policy_at(S, r->pi);
	json_t *k = json_object(), *ps = json_object();
	json_object_set_new(k, "policy", json_string(p->name));
	const double ratio = r->seq_live ? r->seq.run.ctx.ratio : r->ratio_used;
	const double bratio = r->seq_live ? r->seq.run.ctx.byte_ratio : r->byte_ratio_used;
	const double *pv = r->seq_live ? r->seq.run.params : r->params;
	json_object_set_new(k, "ratio", ratio > 0 ? json_real(ratio) : json_null());
	json_object_set_new(k, "byte_ratio", bratio > 0 ? json_real(bratio) : json_null());
	for (int i = 0; pv && i < p->n_params; i++)
		json_object_set_new(ps, p->params[i].name, json_real(pv[i]));
	json_object_set_new(k, "params", ps);
	json_object_set_new(k, "kv_entries_peak", json_integer(r->peak_entries));
	json_object_set_new(k, "kv_bytes_peak", json_integer(r->peak_bytes));
	json_object_set_new(k, "kv_bytes_kv", json_integer(r->seq_live ? rt_kvbytes_held(&r->seq.kv)
	                                                             : r->kv_bytes));
	json_object_set_new(k, "bytes_compression",
	                    json_real(r->seq_live ? rt_kvbytes_compression(&r->seq.kv,
	                                                                   r->seq.run.ctx.seen)
	                                          : r->bytes_x));
	json_object_set_new(k, "compress_events", json_integer(r->compress));
	json_object_set_new(k, "policy_seconds", json_real(r->policy_s));
	json_object_set_new(k, "prefill_chunk", json_integer(r->prefill_chunk));
	json_object_set_new(k, "prompt_steps", json_integer(r->prompt_steps));
	json_object_set_new(k, "prefix_shared_tokens", json_integer(r->shared));
	json_object_set_new(k, "prefix_skipped_tokens", json_integer(r->skipped));
	json_object_set_new(k, "entries_evicted", json_integer(r->evicted));
	json_object_set_new(k, "system_tokens", json_integer(r->n_system));
	json_object_set_new(k, "pinned_tokens", json_integer(r->n_pinned));
	json_object_set_new(k, "pinned_kept", json_integer(r->pinned_kept));
	/* graceful budgets: the floor in force and what it did (rt_pick_note_next) */
	json_object_set_new(k, "min_kv", json_integer((json_int_t)r->min_kv));
	json_t *notes = json_array();
	const char *t;
	for (unsigned n = r->seq_live ? r->seq.run.notes : r->notes; (t = rt_pick_note_next(&n));)
		json_array_append_new(notes, json_string(t));
	json_object_set_new(k, "budget_notes", notes);
	return k;
}

json_t *srv_base_obj(const srv *S, const req *r, const char *object)
{
	json_t *o = json_object();
	json_object_set_new(o, "id", json_string(r->id_str));
	json_object_set_new(o, "object", json_string(object));
	json_object_set_new(o, "created", json_integer((json_int_t)time(NULL)));
	json_object_set_new(o, "model", json_string(S->model_id));
	return o;
}

/* One SSE event carrying text delta[0..n) and, at the end, the finish reason and usage
 * (S->mu held). */
static void sse_chunk(srv *S, req *r, const char *delta, size_t n, int final)
{
	json_t *o = srv_base_obj(S, r, r->chat ? "chat.completion.chunk" : "text_completion");
	json_t *ch = json_object();
	json_object_set_new(ch, "index", json_integer(0));
	if (r->chat) {
		json_t *d = json_object();
		if (r->sent == 0 && !final)
			json_object_set_new(d, "role", json_string("assistant"));
		if (n || !final)
			json_object_set_new(d, "content", json_text(delta, n));
		json_object_set_new(ch, "delta", d);
	} else {
		json_object_set_new(ch, "text", json_text(delta, n));
		json_object_set_new(ch, "logprobs", json_null());
	}
	json_object_set_new(ch, "finish_reason", final ? json_string(r->finish) : json_null());
	json_t *arr = json_array();
	json_array_append_new(arr, ch);
	json_object_set_new(o, "choices", arr);
	if (final) {
		json_object_set_new(o, "usage", srv_usage_obj(r));
		json_object_set_new(o, "kv", srv_kv_obj(S, r));
	}
	char *s = json_dumps(o, SRV_JSON_FLAGS);
	json_decref(o);
	if (s) {
		buf_add(&r->sse, &r->sse_len, &r->sse_cap, "data: ", 6);
		buf_add(&r->sse, &r->sse_len, &r->sse_cap, s, strlen(s));
		buf_add(&r->sse, &r->sse_len, &r->sse_cap, "\n\n", 2);
		free(s);
	}
	if (final) {
		buf_add(&r->sse, &r->sse_len, &r->sse_cap, "data: [DONE]\n\n", 14);
		r->sse_done = 1;
	}
}

/* Stream the text generated since the last event, holding back what could still become a
 * stop string or an incomplete character (S->mu held). */
static void stream_flush(srv *S, req *r, int final)
{
	if (!r->stream)
		return;
	size_t hold = 0;
	for (int i = 0; !final && i < r->n_stop; i++)
		if (strlen(r->stop[i]) - 1 > hold)
			hold = strlen(r->stop[i]) - 1;
	size_t upto = r->len > hold ? r->len - hold : 0;
	upto = r->sent + utf8_complete(r->out + r->sent, upto > r->sent ? upto - r->sent : 0, final);
	if (upto > r->sent || final) {
		if (upto > r->sent)
			sse_chunk(S, r, r->out + r->sent, upto - r->sent, 0);
		r->sent = upto;
	}
	if (final)
		sse_chunk(S, r, "", 0, 1);
}

/* ---- the scheduler ------------------------------------------------------------------ */

/* Finish request r (S->mu held): free its sequence (every block back to the pool), write
 * the trace line, wake its handler. */
static void req_finish(srv *S, req *r)
{
	if (r->state == RQ_ACTIVE) {
		S->reserved -= r->footprint;
		int i = 0;
		while (i < S->n_active && S->active[i] != r)
			i++;
		RT_ASSERT(i < S->n_active);
		/* the rest keep their arrival order, which plan_step serves prompts in */
		memmove(S->active + i, S->active + i + 1, (size_t)(--S->n_active - i) * sizeof *S->active);
	}
	if (r->seq_live) {
		rt_seq_stats st = rt_seq_stats_get(&r->seq);
		r->peak_entries = st.kv_entries_peak;
		r->peak_bytes = st.kv_bytes_peak;
		r->compress = st.compress_events;
		r->policy_s = st.policy_seconds;
		r->kv_bytes = rt_kvbytes_held(&r->seq.kv);
		r->bytes_x = rt_kvbytes_compression(&r->seq.kv, r->seq.run.ctx.seen);
		r->pinned_kept = rt_seq_span_kept(&r->seq, RT_SPAN_PINNED);
		r->ratio_used = r->seq.run.ctx.ratio;
		r->notes = r->seq.run.notes;
		r->byte_ratio_used = r->seq.run.ctx.byte_ratio;
		const int np = policy_at(S, r->pi)->n_params;
		if (np > 0 && (r->params = malloc((size_t)np * sizeof(double))))
			memcpy(r->params, r->seq.run.params, (size_t)np * sizeof(double));
		rt_seq_free(&r->seq);
		r->seq_live = 0;
	}
	r->t_end = rt_now();
	r->state = RQ_DONE;
	if (r->cancelled) {
		/* the client left first: no response, but a count and a trace line with the tokens
		 * it was given */
		r->finish = "cancelled";
		S->cancelled++;
	} else if (!r->status) {
		srv_hist_observe(S, SRV_H_E2E, r->t_end - r->t0);
	}
	if (!r->finish)
		r->finish = "stop";
	if (S->trace) {
		json_t *t = srv_kv_obj(S, r);
		json_object_set_new(t, "id", json_string(r->id_str));
		const int st = r->status ? r->status : r->cancelled && !r->answered ? 499 : 200;
		json_object_set_new(t, "status", json_integer(st)); /* as kvpc_requests_total */
		json_object_set_new(t, "prompt_tokens", json_integer(r->n_prompt));
		json_object_set_new(t, "generated_tokens", json_integer(r->n_gen));
		int64_t appended = (r->fed + r->n_gen) * S->H;
		json_object_set_new(t, "eviction_rate",
		                    json_real(appended ? (double)r->evicted / (double)appended : 0.0));
		json_object_set_new(t, "ttft_s", r->t_first > 0 ? json_real(r->t_first - r->t0)
		                                                : json_null());
		json_object_set_new(t, "total_s", json_real(r->t_end - r->t0));
		json_object_set_new(t, "finish_reason", json_string(r->finish));
		char *s = json_dumps(t, SRV_JSON_FLAGS);
		json_decref(t);
		if (s) {
			fprintf(S->trace, "%s\n", s);
			fflush(S->trace);
			free(s);
		}
	}
	if (!r->status)
		stream_flush(S, r, 1);
	pthread_cond_broadcast(&r->cv);
	srv_req_unref(r);
}

/* The HTTP status of a runtime error, by its code (base/rt_util.h): the client's input
 * 400, a resource limit 503 (retry later), anything else 500. */
int srv_err_status(const rt_err *e)
{
	return e->code == RT_ERR_INPUT ? 400 : e->code == RT_ERR_RESOURCE ? 503 : 500;
}

static const char *err_type(int status)
{
	return status == 400 ? "invalid_request_error" : status == 503 ? "overloaded_error"
	                                                               : "server_error";
}

static void req_fail(srv *S, req *r, int status, const char *type, const char *msg)
{
	r->status = status;
	r->finish = "error"; /* the trace's finish_reason: the client gets the HTTP error */
	r->err_type = type;
	snprintf(r->err, sizeof r->err, "%s", msg);
	req_finish(S, r);
}

/* Admit queued requests in arrival order while their footprints fit (S->mu held). */
static void admit(srv *S)
{
	const int64_t limit = S->cfg->kv_memory;
	while (S->qhead && S->n_active < S->cfg->max_seqs) {
		req *r = S->qhead;
		/* a prefix r can fork now counts once: r reserves the rest (rt_serve_prefix.c) */
		if (!r->cancelled && S->reserved + r->footprint - srv_prefix_discount(S, r) > limit)
			break;
		S->qhead = r->next_q;
		if (!S->qhead)
			S->qtail = NULL;
		S->n_queued--;
		if (r->cancelled) {
			req_finish(S, r);
			continue;
		}
		r->state = RQ_ACTIVE;
		S->reserved += r->footprint;
		S->active[S->n_active++] = r;
		srv_prefix_start(S, r);
	}
}

/* The token after logits: the sampler's choice; then the stop rules. 1 when r finished. */
static int emit_token(srv *S, req *r, const float *logits)
{
	int32_t t = rt_sample(&r->smp, logits);
	const double now = rt_now();
	if (r->t_first == 0) {
		r->t_first = now;
		srv_hist_observe(S, SRV_H_TTFT, now - r->t0);
	} else {
		srv_hist_observe(S, SRV_H_ITL, now - r->t_last);
	}
	r->t_last = now;
	if (rt_tokenizer_is_eog(S->tk, t)) {
		r->finish = "stop";
		return 1;
	}
	char piece[256];
	int nb = rt_token_to_bytes(S->tk, t, piece, (int)sizeof piece);
	nb = nb < 0 ? 0 : nb > (int)sizeof piece ? (int)sizeof piece : nb;
	const size_t before = r->len;
	buf_add(&r->out, &r->len, &r->cap, piece, (size_t)nb);
	r->n_gen++;
	S->gen_tokens++;
	for (int i = 0; i < r->n_stop; i++) {
		size_t sl = strlen(r->stop[i]);
		size_t from = before >= sl ? before - sl + 1 : 0;
		char *hit = r->len >= sl ? memmem(r->out + from, r->len - from, r->stop[i], sl) : NULL;
		if (hit) {
			r->len = (size_t)(hit - r->out);
			r->out[r->len] = 0;
			r->finish = "stop";
			return 1;
		}
	}
	if (r->n_gen >= r->max_tokens || rt_seq_seen(&r->seq) >= S->m->hp.n_ctx ||
	    rt_seq_seen(&r->seq) + 1 > r->seq.cap) {
		r->finish = "length";
		return 1;
	}
	r->next = t;
	stream_flush(S, r, 0);
	return 0;
}

/* Bytes of pool that prompt r's next chunk of k tokens may need beyond its footprint: every
 * list holding k more entries, against the blocks the footprint reserved. */
static int64_t over_footprint(const srv *S, const req *r, int32_t k)
{
	const rt_kv *kv = &r->seq.kv;
	int64_t need = 0;
	for (int i = 0; i < S->H; i++)
		need += rt_kv_blocks_for(kv->heads[i].n + k);
	need *= kv->block_bytes;
	return need > r->footprint ? need - r->footprint : 0;
}

/* The chunk prompt r takes of the n tokens offered (rt_run_chunk: its policy's next
 * trigger, the prompt end, its prefill chunk). A per-step policy's chunk, cut to its
 * prefill chunk, may cross its triggers up to all n tokens when the request did not fix
 * its prefill chunk: the longest such chunk whose blocks beyond the footprint fit in the
 * pool's unreserved bytes (*slack, which this shrinks); the compress at the chunk's end, in
 * the same step, cuts the lists back to the budget (docs/serving.md, "Continuous
 * batching"). */
static int32_t prompt_chunk(req *r, int32_t n, const srv *S, int64_t *slack)
{
	struct rt_run *run = &r->seq.run;
	run->prefill_chunk = r->pf_run;
	const int32_t k = rt_run_chunk(run, &r->seq.kv, n);
	if (r->pf_fixed || r->pf_run <= 0 || k >= n)
		return k;
	run->prefill_chunk = n;
	int32_t big = rt_run_chunk(run, &r->seq.kv, n);
	if (big > k && over_footprint(S, r, big) > *slack) {
		int32_t lo = k, hi = big; /* over_footprint grows with the chunk: bisect */
		while (hi - lo > 1) {
			const int32_t mid = lo + (hi - lo) / 2;
			if (over_footprint(S, r, mid) <= *slack)
				lo = mid;
			else
				hi = mid;
		}
		big = lo;
	}
	if (big <= k) {
		run->prefill_chunk = r->pf_run;
		return k;
	}
	run->prefill_chunk = big;
	*slack -= over_footprint(S, r, big);
	return big;
}

/* Plan one step over the active requests, which are in arrival order (S->mu held): every
 * decoding sequence one token first, so decodes are never starved; then the rows left go to
 * the prompts in arrival order, each a chunk of up to its chunk_max tokens within one
 * protected span (prompt_chunk), so the oldest prompt takes as many rows as it can and a
 * younger one starts only with the rows it leaves (docs/serving.md, "Continuous
 * batching"). A prompt not yet started first forks a shared prefix, or waits for the one
 * an earlier request is computing (srv_prefix_start). Returns K. */
static int plan_step(srv *S)
{
	const int R = S->cfg->step_rows;
	int K = 0, rows = 0;
	/* pool bytes no admitted footprint claims: a larger prompt chunk's room this step */
	int64_t slack = S->cfg->kv_memory - S->reserved;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < S->n_active && rows < R; i++) {
			req *r = S->active[i];
			const int dec = r->fed == r->n_prompt;
			if (dec != (pass == 0))
				continue;
			int n = 1;
			if (!dec) {
				if (srv_prefix_start(S, r))
					continue; /* the prefix it will fork is being computed */
				int64_t run = 1;
				while (r->fed + run < r->n_prompt && r->span[r->fed + run] == r->span[r->fed])
					run++;
				const int64_t lim = r->chunk_max < R - rows ? r->chunk_max : R - rows;
				n = (int)(run < lim ? run : lim);
				rt_seq_span(&r->seq, r->span[r->fed]);
				/* what the sequence will take: the rows it leaves go to the next prompt */
				const int32_t k = prompt_chunk(r, n, S, &slack);
				n = k > 0 ? k : n;
			} else {
				rt_seq_span(&r->seq, 0);
			}
			S->sp[K] = &r->seq;
			S->tp[K] = dec ? &r->next : r->prompt + r->fed;
			S->tn[K] = n;
			S->stepped[K++] = r;
			rows += n;
		}
	return K;
}

static void observe_step(srv *S, double dt)
{
	srv_hist_observe(S, SRV_H_STEP, dt);
	S->busy_seconds += dt;
}

/* After a step: counters, first tokens, stop rules (S->mu held). */
static void step_done(srv *S, int K)
{
	const int V = S->m->hp.n_vocab;
	for (int k = 0; k < K; k++) {
		req *r = S->stepped[k];
		if (S->tn[k] < 0) {
			/* e.g. the policy's budget check (policy/rt_budget: a budget below 1 entry
			 * or under its guards for this prompt) is the client's error */
			const int st = srv_err_status(&S->why[k]);
			req_fail(S, r, st, err_type(st), S->why[k].msg);
			continue;
		}
		rt_seq_stats st = rt_seq_stats_get(&r->seq);
		int64_t ev = st.tokens * S->H - rt_kv_entries(&r->seq.kv);
		S->evicted_by_p[r->pi] += ev - r->evicted;
		S->compress_by_p[r->pi] += st.compress_events - r->compress;
		r->evicted = ev;
		r->compress = st.compress_events;
		if (r->fed < r->n_prompt) {
			r->prompt_steps++;
			r->fed += S->tn[k];
			S->prompt_tokens += S->tn[k];
			srv_prefix_step(S, r);
			if (r->fed < r->n_prompt)
				continue;
		}
		if (r->cancelled || emit_token(S, r, S->lg + (size_t)k * V))
			req_finish(S, r);
		else
			pthread_cond_broadcast(&r->cv);
	}
	int64_t e = 0, kb = 0, fb = 0;
	for (int i = 0; i < S->n_active; i++) {
		const rt_seq *q = &S->active[i]->seq;
		e += rt_kv_entries(&q->kv);
		kb += rt_kvbytes_held(&q->kv);
		fb += rt_kvbytes_f16(&q->kv, q->run.ctx.seen);
	}
	S->entries_now = e;
	S->kv_bytes_now = kb;
	S->f16_bytes_now = fb;
	srv_prefix_sweep(S);
}

void *srv_scheduler(void *arg)
{
	srv *S = arg;
	pthread_mutex_lock(&S->mu);
	for (;;) {
		for (int i = 0; i < S->n_active;)
			if (S->active[i]->cancelled)
				req_finish(S, S->active[i]);
			else
				i++;
		srv_prefix_sweep(S);
		admit(S);
		if (S->n_active == 0) {
			if (S->stop && !S->qhead)
				break;
			pthread_cond_wait(&S->cv, &S->mu);
			continue;
		}
		const int K = plan_step(S);
		pthread_mutex_unlock(&S->mu);
		rt_err err = { "" };
		double t0 = rt_now();
		int rc = rt_seq_multi_step(&S->mb, S->sp, K, S->tp, S->tn, S->lg, S->why, &err);
		double dt = rt_now() - t0;
		pthread_mutex_lock(&S->mu);
		observe_step(S, dt);
		if (rc < 0) {
			const int st = srv_err_status(&err);
			for (int k = 0; k < K; k++)
				req_fail(S, S->stepped[k], st, err_type(st), err.msg);
			continue;
		}
		step_done(S, K);
	}
	pthread_mutex_unlock(&S->mu);
	return NULL;
}

/* Entries per list that sequence s's policy keeps at ratio R once the context is x tokens:
 * the budget in force (rt_policy_budget_at: ceil(x / R) raised by the floor, the larger of
 * min_kv and the policy's `budget = B min F`, and by guards that exceed it under that
 * floor, as compress keeps them), rounded up; ceil(x / R) when the check fails at x (the
 * request then fails when it starts, or compress keeps at least that early in a stream). */
static int64_t ratio_budget(rt_seq *s, int64_t x, double R)
{
	const int64_t b = (int64_t)ceil((double)x / R);
	double in_force = 0;
	rt_err e = { "" };
	if (rt_policy_budget_at(&s->run, &s->kv, x, &in_force, &e) != 0)
		return b;
	const int64_t f = (int64_t)ceil(in_force - 1e-9);
	return f > b ? f : b;
}

int64_t rt_serve_footprint(rt_seq *s, int64_t n_prompt, int64_t max_tokens, int chunk)
{
	const int64_t P = n_prompt, T = max_tokens, N = P + T;
	const double R = s->run.ctx.ratio;
	/* a context replay holds the prompt and one replayed chunk at once (rt_replay.h) */
	const int64_t rp = (s->p->needs & KVP_NEED_REPLAY)
	                 ? P + (P < RT_REPLAY_CHUNK ? P : RT_REPLAY_CHUNK) + RT_REPLAY_ROOM : 0;
	if (!s->p->compress || R <= 0)
		return N > rp ? N : rp;
	/* the policy's own triggers (the probes below), then the prefill chunk */
	const int32_t pf = s->run.prefill_chunk < chunk ? s->run.prefill_chunk : chunk;
	s->run.prefill_chunk = 0;
	/* prompt-end trigger: from an empty store the first chunk runs to the prompt end */
	int32_t k0 = rt_run_chunk(&s->run, &s->kv, (int32_t)(P < 65536 ? P : 65536));
	if (P > 1 && k0 >= (P < 65536 ? P : 65536)) {
		s->run.prefill_chunk = pf;
		int64_t a = ratio_budget(s, P, R) + T;
		a = a > P ? (a < N ? a : N) : P;
		return a > rp ? a : rp;
	}
	/* streaming: at the end the store holds about ceil(N / R) entries; the longest chunk
	 * its trigger allows there bounds what an append adds. While the prompt is fed the
	 * budget is ceil(P / R) (the context is the prompt), and a chunked prefill's chunk
	 * adds at most pf entries to it before the compress at the chunk's end */
	const int64_t b = ratio_budget(s, N, R);
	const int H = s->kv.n_layer * s->kv.n_kv_head;
	const int64_t seen = s->run.ctx.seen;
	for (int i = 0; i < H; i++)
		s->kv.heads[i].n = (int32_t)(b < s->cap ? b : s->cap);
	s->run.ctx.seen = N - 1 > 0 ? N - 1 : 0;
	s->run.ctx.prompt_done = 1;
	s->run.ctx.phase = KVP_PHASE_DECODE;
	int32_t k = rt_run_chunk(&s->run, &s->kv, chunk);
	for (int i = 0; i < H; i++)
		s->kv.heads[i].n = 0;
	s->run.ctx.seen = seen;
	rt_seq_reset(s, P);
	s->run.prefill_chunk = pf;
	int64_t f = b + (k > 0 ? k : chunk);
	const int64_t fp = ratio_budget(s, P, R) + pf;
	f = fp > f ? fp : f;
	return f < N ? f : N;
}
