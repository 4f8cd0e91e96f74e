/*
 * rt_serve: the OpenAI-compatible server — HTTP handlers (one libmicrohttpd thread per
 * connection, which blocks on its request), request validation, the scheduler thread
 * (admission, continuous batching, sampling, stop rules), metrics and the trace; see
 * rt_serve.h. Locking: one mutex guards the queue, the active set, every request's
 * state and the counters; the scheduler drops it only around the forward step.
 */
#include "serve/rt_serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kv/rt_kvbytes.h"
#include "kv/rt_kvpool.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_seq.h"
#include "serve/rt_sample.h"

#define MAX_STOP 4
#define SPAN_SYSTEM 1
#define SPAN_PINNED 2
static const char *const span_names[] = { "", "system", "pinned" };
static const double step_buckets[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5 };
#define N_BUCKETS (int)(sizeof step_buckets / sizeof step_buckets[0])

enum { RQ_QUEUED, RQ_ACTIVE, RQ_DONE };

typedef struct srv srv;

typedef struct req {
	srv *S;
	uint64_t id;
	char id_str[48];
	int chat, stream, include_usage;
	int pi;                      /* policy index (n_reg: full) */
	rt_seq seq;                  /* created at validation, fed by the scheduler */
	int seq_live;
	int32_t *prompt;
	uint8_t *span;               /* [n_prompt] span id of each prompt token */
	int64_t n_prompt, n_pinned, n_system;
	int64_t max_tokens;
	rt_sampler smp;
	char *stop[MAX_STOP];
	int n_stop;
	int64_t footprint;           /* bytes of pool the request may need at worst */
	/* guarded by S->mu */
	int state, cancelled, refs;
	int64_t fed;                 /* prompt tokens fed */
	int32_t next;                /* token to feed in the next decode step */
	char *out;                   /* generated text (raw bytes) */
	size_t len, cap, sent;       /* bytes; sent: bytes streamed so far */
	char *sse;                   /* pending server-sent events */
	size_t sse_len, sse_cap, sse_off;
	int sse_done;
	int64_t n_gen;
	const char *finish;
	int status;                  /* 0 while fine; an HTTP status once failed */
	char err[512];
	const char *err_type;
	double t0, t_first, t_end;
	int64_t compress, evicted, peak_entries, peak_bytes, pinned_kept;
	double policy_s;             /* rt_seq_stats.policy_seconds at the finish */
	int prefill_chunk;           /* the request's prefill schedule (0: token by token) */
	int64_t kv_bytes;            /* at the end: K/V bytes held (runtime/kv/rt_kvbytes.h) */
	double bytes_x;              /* at the end: compression in bytes against f16 */
	double ratio_used;           /* the sequence's ratio and parameters, kept when it ends */
	double byte_ratio_used;
	double *params;
	pthread_cond_t cv;
	struct req *next_q;
} req;

struct srv {
	const rt_serve_cfg *cfg;
	const struct kvp_policy *const *reg;
	int n_reg;
	rt_model *m;
	rt_tokenizer *tk;
	char model_id[256];
	int H;                       /* (layer, KV head) lists */
	pthread_mutex_t mu;
	pthread_cond_t cv;           /* wakes the scheduler */
	req *qhead, *qtail;
	int n_queued;
	req **active;
	int n_active;
	int64_t reserved;            /* footprint bytes of the active requests */
	int draining, stop;
	_Atomic int live;            /* requests allocated and not yet freed */
	pthread_mutex_t up_mu;       /* guards the uploads list (taken before mu, never inside) */
	struct conn *uploads;        /* connections still receiving a request body */
	uint64_t next_id;
	FILE *trace;
	/* step scratch (scheduler only) */
	rt_seq_multi mb;
	float *lg;
	rt_seq **sp;
	const int32_t **tp;
	int *tn;
	rt_err *why;
	req **stepped;
	/* metrics */
	int64_t req_by_status[600];
	int64_t rejected, prompt_tokens, gen_tokens, entries_now;
	int64_t kv_bytes_now, f16_bytes_now; /* the active sequences' K/V bytes, as f16 full caches */
	int64_t *compress_by_p, *evicted_by_p;
	int64_t step_hist[N_BUCKETS + 1], steps;
	double step_sum, busy_seconds;
};

/* ---- small helpers ----------------------------------------------------------------- */

static const struct kvp_policy *policy_at(const srv *S, int i)
{
	return i < S->n_reg ? S->reg[i] : &rt_policy_full;
}

static int policy_find(const srv *S, const char *name)
{
	for (int i = 0; i < S->n_reg; i++)
		if (!strcmp(S->reg[i]->name, name))
			return i;
	return !strcmp(name, "full") ? S->n_reg : -1;
}

static int buf_add(char **b, size_t *len, size_t *cap, const char *s, size_t n)
{
	if (*len + n + 1 > *cap) {
		size_t nc = (*cap ? *cap * 2 : 256);
		while (nc < *len + n + 1)
			nc *= 2;
		char *p = realloc(*b, nc);
		if (!p)
			return -1;
		*b = p, *cap = nc;
	}
	memcpy(*b + *len, s, n);
	*len += n;
	(*b)[*len] = 0;
	return 0;
}

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

/* A JSON string of s[0..n): invalid UTF-8 bytes become U+FFFD. */
static json_t *json_text(const char *s, size_t n)
{
	size_t bad;
	if (rt_utf8_valid(s, n, &bad))
		return json_stringn(s, n);
	char *o = NULL;
	size_t ol = 0, oc = 0;
	for (size_t i = 0; i < n;) {
		size_t k = 1;
		while (k <= 4 && i + k <= n && !rt_utf8_valid(s + i, k, &bad))
			k++;
		if (k <= 4 && i + k <= n) {
			buf_add(&o, &ol, &oc, s + i, k);
			i += k;
		} else {
			buf_add(&o, &ol, &oc, "\xEF\xBF\xBD", 3);
			i++;
		}
	}
	json_t *j = json_stringn(o ? o : "", ol);
	free(o);
	return j;
}

/* ---- responses ---------------------------------------------------------------------- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *body, size_t len, int retry_after)
{
	struct MHD_Response *r =
		MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", type);
	if (retry_after)
		MHD_add_response_header(r, "Retry-After", "1");
	enum MHD_Result rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j,
                                 int retry_after)
{
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!s)
		return MHD_NO;
	enum MHD_Result rc = send_text(c, status, "application/json", s, strlen(s), retry_after);
	free(s);
	return rc;
}

/* OpenAI's error object. */
static json_t *error_obj(const char *msg, const char *type, const char *param, const char *code)
{
	json_t *e = json_object();
	json_object_set_new(e, "message", json_text(msg, strlen(msg)));
	json_object_set_new(e, "type", json_string(type));
	json_object_set_new(e, "param", param ? json_string(param) : json_null());
	json_object_set_new(e, "code", code ? json_string(code) : json_null());
	json_t *o = json_object();
	json_object_set_new(o, "error", e);
	return o;
}

static void count_status(srv *S, unsigned status)
{
	pthread_mutex_lock(&S->mu);
	S->req_by_status[status < 600 ? status : 599]++;
	pthread_mutex_unlock(&S->mu);
}

static enum MHD_Result send_error(srv *S, struct MHD_Connection *c, unsigned status,
                                  const char *param, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(srv *S, struct MHD_Connection *c, unsigned status,
                                  const char *param, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	const char *type = status == 401   ? "authentication_error"
	                   : status == 404 ? "not_found_error"
	                   : status == 503 ? "overloaded_error"
	                   : status >= 500 ? "server_error"
	                                   : "invalid_request_error";
	count_status(S, status);
	return send_json(c, status, error_obj(msg, type, param, NULL), status == 503);
}

/* ---- request lifetime --------------------------------------------------------------- */

static void req_free(req *r)
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

/* Drop one reference (S->mu held). */
static void req_unref(req *r)
{
	if (--r->refs == 0)
		req_free(r);
}

static json_t *usage_obj(const req *r)
{
	json_t *u = json_object();
	json_object_set_new(u, "prompt_tokens", json_integer(r->n_prompt));
	json_object_set_new(u, "completion_tokens", json_integer(r->n_gen));
	json_object_set_new(u, "total_tokens", json_integer(r->n_prompt + r->n_gen));
	return u;
}

/* The "kv" extension of a response: the policy, its parameters, the KV figures. */
static json_t *kv_obj(const srv *S, const req *r)
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
	json_object_set_new(k, "entries_evicted", json_integer(r->evicted));
	json_object_set_new(k, "system_tokens", json_integer(r->n_system));
	json_object_set_new(k, "pinned_tokens", json_integer(r->n_pinned));
	json_object_set_new(k, "pinned_kept", json_integer(r->pinned_kept));
	return k;
}

static json_t *base_obj(const srv *S, const req *r, const char *object)
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
	json_t *o = base_obj(S, r, r->chat ? "chat.completion.chunk" : "text_completion");
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
		json_object_set_new(o, "usage", usage_obj(r));
		json_object_set_new(o, "kv", kv_obj(S, r));
	}
	char *s = json_dumps(o, JSON_COMPACT);
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
		for (int i = 0; i < S->n_active; i++)
			if (S->active[i] == r) {
				S->active[i] = S->active[--S->n_active];
				break;
			}
	}
	if (r->seq_live) {
		rt_seq_stats st = rt_seq_stats_get(&r->seq);
		r->peak_entries = st.kv_entries_peak;
		r->peak_bytes = st.kv_bytes_peak;
		r->compress = st.compress_events;
		r->policy_s = st.policy_seconds;
		r->kv_bytes = rt_kvbytes_held(&r->seq.kv);
		r->bytes_x = rt_kvbytes_compression(&r->seq.kv, r->seq.run.ctx.seen);
		int64_t pk = -1;
		for (int i = 0; i < S->H; i++) {
			const rt_kv_head *h = &r->seq.kv.heads[i];
			int64_t c = 0;
			for (int32_t e = 0; e < h->n; e++)
				c += h->span[e] == SPAN_PINNED;
			pk = pk < 0 || c < pk ? c : pk;
		}
		r->pinned_kept = pk < 0 ? 0 : pk;
		r->ratio_used = r->seq.run.ctx.ratio;
		r->byte_ratio_used = r->seq.run.ctx.byte_ratio;
		const int np = policy_at(S, r->pi)->n_params;
		if (np > 0 && (r->params = malloc((size_t)np * sizeof(double))))
			memcpy(r->params, r->seq.run.params, (size_t)np * sizeof(double));
		rt_seq_free(&r->seq);
		r->seq_live = 0;
	}
	r->t_end = rt_now();
	r->state = RQ_DONE;
	if (!r->finish)
		r->finish = "stop";
	if (S->trace && !r->cancelled) {
		json_t *t = kv_obj(S, r);
		json_object_set_new(t, "id", json_string(r->id_str));
		json_object_set_new(t, "status", json_integer(r->status ? r->status : 200));
		json_object_set_new(t, "prompt_tokens", json_integer(r->n_prompt));
		json_object_set_new(t, "generated_tokens", json_integer(r->n_gen));
		int64_t appended = (r->fed + r->n_gen) * S->H;
		json_object_set_new(t, "eviction_rate",
		                    json_real(appended ? (double)r->evicted / (double)appended : 0.0));
		json_object_set_new(t, "ttft_s", r->t_first > 0 ? json_real(r->t_first - r->t0)
		                                                : json_null());
		json_object_set_new(t, "total_s", json_real(r->t_end - r->t0));
		json_object_set_new(t, "finish_reason", json_string(r->finish));
		char *s = json_dumps(t, JSON_COMPACT);
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
	req_unref(r);
}

/* The HTTP status of a runtime error, by its code (base/rt_util.h): the client's input
 * 400, a resource limit 503 (retry later), anything else 500. */
static int err_status(const rt_err *e)
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
		if (!r->cancelled && S->reserved + r->footprint > limit)
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
	}
}

/* The token after logits: the sampler's choice; then the stop rules. 1 when r finished. */
static int emit_token(srv *S, req *r, const float *logits)
{
	int32_t t = rt_sample(&r->smp, logits);
	if (r->t_first == 0)
		r->t_first = rt_now();
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

/* Plan one step over the active requests: decodes first (one token each), then prefill
 * chunks in the rows left, each within one protected span (S->mu held). Returns K. */
static int plan_step(srv *S)
{
	int K = 0, rows = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < S->n_active; i++) {
			req *r = S->active[i];
			const int dec = r->fed == r->n_prompt;
			if (dec != (pass == 0) || rows >= S->cfg->step_rows)
				continue;
			int n = 1;
			if (!dec) {
				int64_t run = 1;
				while (r->fed + run < r->n_prompt && r->span[r->fed + run] == r->span[r->fed])
					run++;
				int64_t lim = S->cfg->chunk < S->cfg->step_rows - rows ? S->cfg->chunk
				                                                       : S->cfg->step_rows - rows;
				n = (int)(run < lim ? run : lim);
				rt_seq_span(&r->seq, r->span[r->fed]);
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
	S->steps++;
	S->step_sum += dt;
	S->busy_seconds += dt;
	int b = 0;
	while (b < N_BUCKETS && dt > step_buckets[b])
		b++;
	S->step_hist[b]++;
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
			const int st = err_status(&S->why[k]);
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
			r->fed += S->tn[k];
			S->prompt_tokens += S->tn[k];
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
}

static void *scheduler(void *arg)
{
	srv *S = arg;
	pthread_mutex_lock(&S->mu);
	for (;;) {
		for (int i = 0; i < S->n_active;)
			if (S->active[i]->cancelled)
				req_finish(S, S->active[i]);
			else
				i++;
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
			const int st = err_status(&err);
			for (int k = 0; k < K; k++)
				req_fail(S, S->stepped[k], st, err_type(st), err.msg);
			continue;
		}
		step_done(S, K);
	}
	pthread_mutex_unlock(&S->mu);
	return NULL;
}

/* ---- request validation --------------------------------------------------------------- */

typedef struct verr {
	int status;
	char param[64];
	char msg[640];
} verr;

static int bad(verr *e, int status, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int bad(verr *e, int status, const char *param, const char *fmt, ...)
{
	e->status = status;
	snprintf(e->param, sizeof e->param, "%s", param ? param : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof e->msg, fmt, ap);
	va_end(ap);
	return -1;
}

/* Room for need more prompt tokens in r (*cap: the tokens r->prompt and r->span hold). */
static int prompt_reserve(req *r, int64_t need, int64_t *cap, verr *e)
{
	if (r->n_prompt + need <= *cap)
		return 0;
	int64_t nc = (*cap ? *cap : 256);
	while (nc < r->n_prompt + need)
		nc *= 2;
	int32_t *p = realloc(r->prompt, (size_t)nc * sizeof *p);
	uint8_t *s = p ? realloc(r->span, (size_t)nc) : NULL;
	if (p)
		r->prompt = p;
	if (!s)
		return bad(e, 500, NULL, "out of memory");
	r->span = s, *cap = nc;
	return 0;
}

/* Count c new prompt tokens (at r->prompt + r->n_prompt, span sp) after checking that
 * each is a row of the model's embedding: a tokenizer may list more tokens than the model
 * has rows, and the forward pass refuses such an id (runtime/model/rt_model.c). */
static int prompt_commit(srv *S, req *r, int64_t c, int sp, verr *e, const char *param)
{
	const int32_t V = S->m->hp.n_vocab;
	for (int64_t i = 0; i < c; i++) {
		const int32_t t = r->prompt[r->n_prompt + i];
		if (t < 0 || t >= V)
			return bad(e, 400, param, "%s: token %d (prompt token %lld) is outside the "
			           "model's vocabulary 0..%d", param, (int)t,
			           (long long)(r->n_prompt + i), (int)V - 1);
	}
	memset(r->span + r->n_prompt, sp, (size_t)c);
	r->n_prompt += c;
	if (sp == SPAN_PINNED)
		r->n_pinned += c;
	if (sp == SPAN_SYSTEM)
		r->n_system += c;
	return 0;
}

/* Append the tokens of text[0..n) with span id sp to r's prompt. */
static int add_tokens(srv *S, req *r, const char *text, size_t n, int special, int sp,
                      int64_t *cap, verr *e, const char *param)
{
	rt_err err = { "" };
	int64_t c = rt_tokenize(S->tk, text, n, special, NULL, 0, &err);
	if (c < 0)
		return bad(e, 400, param, "%s: %s", param, err.msg);
	if (c == 0)
		return 0; /* an empty text (the prompt may still be empty: parse_request says so) */
	if (r->n_prompt + c > S->m->hp.n_ctx)
		return bad(e, 400, param, "the prompt is longer than the model's context_length %d",
		           (int)S->m->hp.n_ctx);
	if (prompt_reserve(r, c, cap, e) != 0)
		return -1;
	if (rt_tokenize(S->tk, text, n, special, r->prompt + r->n_prompt, c, &err) != c)
		return bad(e, 400, param, "%s: %s", param, err.msg[0] ? err.msg : "tokenizer failed");
	return prompt_commit(S, r, c, sp, e, param);
}

/* OpenAI's token prompt: "prompt": [id, ...], every element an integer id of the model's
 * vocabulary (0..n_vocab-1); the whole array is one prompt of plain span. */
static int add_ids(srv *S, req *r, json_t *a, int64_t *cap, verr *e)
{
	const size_t n = json_array_size(a);
	const int32_t V = S->m->hp.n_vocab;
	if ((int64_t)n > S->m->hp.n_ctx)
		return bad(e, 400, "prompt", "the prompt is longer than the model's context_length %d",
		           (int)S->m->hp.n_ctx);
	if (prompt_reserve(r, (int64_t)n, cap, e) != 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(a, i);
		if (!json_is_integer(v))
			return bad(e, 400, "prompt", "prompt[%zu] must be a token id (an integer): a token "
			           "prompt is an array of integers only", i);
		const json_int_t t = json_integer_value(v);
		if (t < 0 || t >= V)
			return bad(e, 400, "prompt", "prompt[%zu]: token id %lld is outside the model's "
			           "vocabulary 0..%d", i, (long long)t, (int)V - 1);
		r->prompt[r->n_prompt + (int64_t)i] = (int32_t)t;
	}
	return prompt_commit(S, r, (int64_t)n, 0, e, "prompt");
}

static int get_text(json_t *v, const char *param, const char **s, size_t *n, verr *e)
{
	if (!json_is_string(v))
		return bad(e, 400, param, "%s must be a string", param);
	*s = json_string_value(v);
	*n = json_string_length(v);
	if (memchr(*s, 0, *n))
		return bad(e, 400, param, "%s contains a NUL character", param);
	return 0;
}

/* The prompt of /v1/completions: a string, a one-string array, or an array of segments
 * {"text": ..., "protect": bool} (protected segments are span `pinned`). */
static int parse_prompt(srv *S, req *r, json_t *pr, verr *e)
{
	int64_t cap = 0;
	const char *s;
	size_t n;
	if (!pr)
		return bad(e, 400, "prompt", "prompt is required");
	if (json_is_string(pr)) {
		if (get_text(pr, "prompt", &s, &n, e) != 0)
			return -1;
		return add_tokens(S, r, s, n, 0, 0, &cap, e, "prompt");
	}
	if (!json_is_array(pr) || json_array_size(pr) == 0)
		return bad(e, 400, "prompt", "prompt must be a string or a non-empty array");
	if (json_is_number(json_array_get(pr, 0)))
		return add_ids(S, r, pr, &cap, e);
	size_t i;
	json_t *it;
	int strings = 0;
	json_array_foreach(pr, i, it)
	{
		int sp = 0;
		json_t *tx = it;
		if (json_is_string(it)) {
			if (++strings > 1)
				return bad(e, 400, "prompt", "one prompt per request (batched prompts are not served)");
		} else if (json_is_array(it)) {
			return bad(e, 400, "prompt", "one prompt per request (batched prompts are not served)");
		} else if (json_is_object(it)) {
			tx = json_object_get(it, "text");
			json_t *pt = json_object_get(it, "protect");
			if (pt && !json_is_boolean(pt))
				return bad(e, 400, "prompt", "prompt[%zu].protect must be a boolean", i);
			sp = json_is_true(pt) ? SPAN_PINNED : 0;
		} else {
			return bad(e, 400, "prompt", "prompt[%zu] must be a string or {\"text\", \"protect\"} "
			           "(or, in a token prompt, every element an integer)", i);
		}
		char what[48];
		snprintf(what, sizeof what, json_is_object(it) ? "prompt[%zu].text" : "prompt[%zu]", i);
		if (get_text(tx, what, &s, &n, e) != 0 ||
		    add_tokens(S, r, s, n, 0, sp, &cap, e, "prompt") != 0)
			return -1;
	}
	return 0;
}

/* The messages of /v1/chat/completions, rendered in ChatML: template markers are
 * tokenized as control tokens, message contents as plain text (so a message cannot
 * forge a turn); a system message is span `system`, a message with "protect": true span
 * `pinned`. Without a system message the template's default one comes first. */
static int parse_messages(srv *S, req *r, json_t *ms, verr *e)
{
	static const char def_sys[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
	int64_t cap = 0;
	if (!json_is_array(ms) || json_array_size(ms) == 0)
		return bad(e, 400, "messages", "messages must be a non-empty array");
	size_t i;
	json_t *m;
	json_array_foreach(ms, i, m)
	{
		if (!json_is_object(m))
			return bad(e, 400, "messages", "messages[%zu] must be an object", i);
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
		              strcmp(role, "developer")))
			return bad(e, 400, "messages", "messages[%zu].role must be system, developer, user or assistant", i);
		json_t *pt = json_object_get(m, "protect");
		if (pt && !json_is_boolean(pt))
			return bad(e, 400, "messages", "messages[%zu].protect must be a boolean", i);
		const char *s;
		size_t n;
		char what[48];
		snprintf(what, sizeof what, "messages[%zu].content", i);
		if (get_text(json_object_get(m, "content"), what, &s, &n, e) != 0)
			return -1;
		int sys = !strcmp(role, "system") || !strcmp(role, "developer");
		int sp = json_is_true(pt) ? SPAN_PINNED : sys ? SPAN_SYSTEM : 0;
		if (i == 0 && !sys) {
			char head[160];
			int hn = snprintf(head, sizeof head, "<|im_start|>system\n%s<|im_end|>\n", def_sys);
			if (add_tokens(S, r, head, (size_t)hn, 1, 0, &cap, e, "messages") != 0)
				return -1;
		}
		char open[64];
		int on = snprintf(open, sizeof open, "<|im_start|>%s\n", sys ? "system" : role);
		if (add_tokens(S, r, open, (size_t)on, 1, sp, &cap, e, "messages") != 0 ||
		    add_tokens(S, r, s, n, 0, sp, &cap, e, "messages") != 0 ||
		    add_tokens(S, r, "<|im_end|>\n", 11, 1, sp, &cap, e, "messages") != 0)
			return -1;
	}
	return add_tokens(S, r, "<|im_start|>assistant\n", 22, 1, 0, &cap, e, "messages");
}

static int num_field(json_t *o, const char *key, double lo, double hi, int integral,
                     double *out, verr *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v) || (integral && !json_is_integer(v)))
		return bad(e, 400, key, "%s must be %s", key, integral ? "an integer" : "a number");
	double x = json_number_value(v);
	if (!(x >= lo && x <= hi))
		return bad(e, 400, key, "%s must be between %g and %g, not %g", key, lo, hi, x);
	*out = x;
	return 1;
}

/* The "kv" extension: policy, ratio (in entries, or byte_ratio in bytes) and parameters,
 * checked as the command line checks --policy, --ratio, --byte-ratio and --set (the same
 * messages), then applied to r's new sequence. */
static int parse_kv(srv *S, req *r, json_t *kv, verr *e)
{
	const rt_serve_cfg *c = S->cfg;
	const char *pname = c->policy ? c->policy : policy_at(S, 0)->name;
	double ratio = c->ratio, bratio = c->byte_ratio, pf = c->prefill_chunk;
	json_t *set = NULL;
	int use_default_sets = 1;
	if (kv && !json_is_null(kv)) {
		if (!json_is_object(kv))
			return bad(e, 400, "kv", "kv must be an object {\"policy\", \"ratio\", "
			           "\"byte_ratio\", \"set\", \"prefill_chunk\"}");
		const char *key;
		json_t *v;
		json_object_foreach(kv, key, v)
		{
			if (strcmp(key, "policy") && strcmp(key, "ratio") && strcmp(key, "byte_ratio") &&
			    strcmp(key, "set") && strcmp(key, "prefill_chunk"))
				return bad(e, 400, "kv", "kv: unknown field '%s' (policy, ratio, byte_ratio, "
				           "set, prefill_chunk)", key);
		}
		if (num_field(kv, "prefill_chunk", 0, 65536, 1, &pf, e) < 0)
			return -1;
		json_t *pv = json_object_get(kv, "policy");
		if (pv) {
			if (!json_is_string(pv))
				return bad(e, 400, "kv.policy", "kv.policy must be a string");
			if (strcmp(json_string_value(pv), pname))
				use_default_sets = 0, ratio = 0, bratio = 0;
			pname = json_string_value(pv);
		}
		json_t *rv = json_object_get(kv, "ratio"), *bv = json_object_get(kv, "byte_ratio");
		if (rv && !json_is_null(rv) && bv && !json_is_null(bv))
			return bad(e, 400, "kv.byte_ratio", "kv.ratio counts entries and kv.byte_ratio "
			           "bytes; give one of them");
		if (rv && !json_is_null(rv)) {
			if (!json_is_number(rv))
				return bad(e, 400, "kv.ratio", "kv.ratio must be a number");
			ratio = json_number_value(rv);
			bratio = 0;
		}
		if (bv && !json_is_null(bv)) {
			if (!json_is_number(bv))
				return bad(e, 400, "kv.byte_ratio", "kv.byte_ratio must be a number");
			bratio = json_number_value(bv);
			ratio = 0;
		}
		set = json_object_get(kv, "set");
		if (set && !json_is_object(set))
			return bad(e, 400, "kv.set", "kv.set must be an object of parameter values");
	}
	r->pi = policy_find(S, pname);
	if (r->pi < 0) {
		char list[512] = "";
		size_t u = 0;
		for (int i = 0; i <= S->n_reg && u < sizeof list - 70; i++)
			u += (size_t)snprintf(list + u, sizeof list - u, "%s%s", i ? ", " : "",
			                      policy_at(S, i)->name);
		return bad(e, 400, "kv.policy", "unknown policy '%s' (this binary has: %s)", pname, list);
	}
	const struct kvp_policy *p = policy_at(S, r->pi);
	rt_err err = { "" };
	if ((p->needs & KVP_NEED_F32_KV) && S->m->kv_type != RT_KV_F32)
		return bad(e, 400, "kv.policy", "policy %s reads and rewrites f32 key/value rows; this "
		           "server stores %s (start it with --kv-type f32)", p->name,
		           rt_kv_type_name(S->m->kv_type));
	if ((p->needs & KVP_NEED_TIERS) && S->m->kv_type == RT_KV_Q8_0)
		return bad(e, 400, "kv.policy", "policy %s sets precision tiers, whose top tier is f16 "
		           "or f32; this server stores q8_0 (start it with --kv-type f16)", p->name);
	int32_t cap = (int32_t)(r->n_prompt + r->max_tokens);
	if (rt_seq_init(&r->seq, S->m, p, cap, c->chunk, r->n_prompt, &err) != 0)
		return bad(e, err_status(&err), NULL, "%s", err.msg);
	r->seq_live = 1;
	rt_seq_set_span_names(&r->seq, span_names, 2);
	for (int i = 0; use_default_sets && i < c->n_sets; i++)
		if (rt_seq_set(&r->seq, c->sets[i], &err) != 0)
			return bad(e, 400, "kv.set", "--set: %s", err.msg);
	const char *key;
	json_t *v;
	json_object_foreach(set, key, v)
	{
		char a[256];
		if (json_is_number(v))
			snprintf(a, sizeof a, "%s=%.17g", key, json_number_value(v));
		else if (json_is_string(v))
			snprintf(a, sizeof a, "%s=%s", key, json_string_value(v));
		else
			return bad(e, 400, "kv.set", "kv.set.%s must be a number or a string", key);
		if (rt_seq_set(&r->seq, a, &err) != 0)
			return bad(e, 400, "kv.set", "%s", err.msg);
	}
	if (ratio != 0) {
		if (!p->compress)
			return bad(e, 400, "kv.ratio",
			           "ratio: policy %s never compresses, so a ratio does not apply", p->name);
		if (rt_seq_set_ratio(&r->seq, ratio, &err) != 0)
			return bad(e, 400, "kv.ratio", "%s", err.msg);
	} else if (bratio != 0) {
		if (!p->compress)
			return bad(e, 400, "kv.byte_ratio",
			           "byte_ratio: policy %s never compresses, so a ratio does not apply",
			           p->name);
		if (rt_seq_set_byte_ratio(&r->seq, bratio, &err) != 0)
			return bad(e, 400, "kv.byte_ratio", "%s", err.msg);
	}
	if (rt_seq_set_prefill_chunk(&r->seq, (int32_t)pf, &err) != 0)
		return bad(e, 400, "kv.prefill_chunk", "%s", err.msg);
	r->prefill_chunk = (int)(pf < c->chunk ? pf : c->chunk);
	return 0;
}

/* The request fields this server reads: OpenAI's names, llama-server's n_predict for
 * max_tokens, and "user" (the caller's own id, which OpenAI only logs: ignored). Any other
 * field is a 400, except that OpenAI fields this server does not implement pass at their
 * neutral value (null, or the value in neutral[]): answering presence_penalty 1.5 by
 * ignoring it would answer a request that was not made. */
static const char *const fields_read[] = { "model", "stream", "stream_options", "n",
	"max_tokens", "max_completion_tokens", "n_predict", "temperature", "top_p", "top_k", "seed",
	"stop", "kv", "user", "prompt", "messages" };
static const struct { const char *name; double value; } neutral[] = {
	{ "frequency_penalty", 0 }, { "presence_penalty", 0 }, { "logprobs", NAN },
	{ "top_logprobs", 0 }, { "echo", NAN }, { "best_of", 1 }, { "logit_bias", NAN },
	{ "suffix", NAN },
}; /* value NAN: no numeric neutral (null, false, or {} for logit_bias) */

/* 0 when every field of the body o is one this server reads (for this endpoint) or an
 * unimplemented OpenAI field at its neutral value; else -1 naming it. */
static int check_fields(const req *r, json_t *o, verr *e)
{
	const char *key;
	json_t *v;
	json_object_foreach(o, key, v)
	{
		size_t i;
		for (i = 0; i < sizeof fields_read / sizeof *fields_read; i++)
			if (!strcmp(key, fields_read[i]))
				break;
		if (i < sizeof fields_read / sizeof *fields_read) {
			const char *other = r->chat ? "prompt" : "messages";
			if (!strcmp(key, other) || (!r->chat && !strcmp(key, "max_completion_tokens")))
				return bad(e, 400, key, "%s is a field of %s, not of this endpoint", key,
				           r->chat ? "/v1/completions" : "/v1/chat/completions");
			continue;
		}
		for (i = 0; i < sizeof neutral / sizeof *neutral; i++)
			if (!strcmp(key, neutral[i].name))
				break;
		if (i == sizeof neutral / sizeof *neutral)
			return bad(e, 400, key, "unknown field '%s'", key);
		const int ok = json_is_null(v) || json_is_false(v) ||
		               (json_is_number(v) && json_number_value(v) == neutral[i].value) ||
		               (json_is_object(v) && json_object_size(v) == 0);
		if (!ok && isnan(neutral[i].value))
			return bad(e, 400, key, "%s is not supported by this server (leave it out, or "
			           "give null)", key);
		if (!ok)
			return bad(e, 400, key, "%s is not supported by this server (leave it out, or "
			           "give %g)", key, neutral[i].value);
	}
	return 0;
}

/* The generation limit: max_tokens, or its other names (max_completion_tokens in chat,
 * llama-server's n_predict), at most one of them; *mt keeps its default when none is
 * given. The name found goes to *key. 0, or -1 with e. */
static int get_max_tokens(json_t *o, double *mt, const char **key, verr *e)
{
	static const char *const names[] = { "max_tokens", "max_completion_tokens", "n_predict" };
	int found = 0;
	for (int i = 0; i < 3; i++) {
		int got = num_field(o, names[i], 1, 1e9, 1, mt, e);
		if (got < 0)
			return -1;
		if (got && found++)
			return bad(e, 400, names[i], "%s and %s are the same limit: give one", *key,
			           names[i]);
		if (got)
			*key = names[i];
	}
	return 0;
}

/* "stream" and "stream_options": sets r->stream and r->include_usage or says why not. */
static int parse_stream(req *r, json_t *o, verr *e)
{
	json_t *st = json_object_get(o, "stream");
	if (st && !json_is_boolean(st) && !json_is_null(st))
		return bad(e, 400, "stream", "stream must be a boolean");
	r->stream = json_is_true(st);
	json_t *so = json_object_get(o, "stream_options");
	if (so && !json_is_null(so) && !json_is_object(so))
		return bad(e, 400, "stream_options", "stream_options must be an object");
	const char *sk;
	json_t *sov;
	json_object_foreach(so, sk, sov)
	{
		if (strcmp(sk, "include_usage"))
			return bad(e, 400, "stream_options",
			           "stream_options: unknown field '%s' (include_usage)", sk);
		if (!json_is_boolean(sov) && !json_is_null(sov))
			return bad(e, 400, "stream_options",
			           "stream_options.include_usage must be a boolean");
	}
	r->include_usage = json_is_true(json_object_get(so, "include_usage"));
	return 0;
}

/* "stop" (sv, or NULL): a string or up to MAX_STOP non-empty strings, copied to r->stop
 * (freed with the request). */
static int parse_stop(req *r, json_t *sv, verr *e)
{
	if (!sv || json_is_null(sv))
		return 0;
	json_t *one[1] = { sv };
	size_t ns = json_is_array(sv) ? json_array_size(sv) : 1;
	if ((!json_is_string(sv) && !json_is_array(sv)) || ns > MAX_STOP)
		return bad(e, 400, "stop", "stop must be a string or an array of at most %d strings",
		           MAX_STOP);
	for (size_t i = 0; i < ns; i++) {
		json_t *s1 = json_is_array(sv) ? json_array_get(sv, i) : one[0];
		if (!json_is_string(s1) || json_string_length(s1) == 0)
			return bad(e, 400, "stop", "stop strings must be non-empty strings");
		r->stop[r->n_stop++] = strdup(json_string_value(s1));
	}
	return 0;
}

/* The whole request body: fills r or says why not. */
static int parse_request(srv *S, req *r, const char *body, size_t len, verr *e)
{
	json_error_t je;
	json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!o)
		return bad(e, 400, NULL, "invalid JSON at line %d column %d: %s", je.line, je.column,
		           je.text);
	int rc = -1;
	double x;
	if (!json_is_object(o)) {
		bad(e, 400, NULL, "the request body must be a JSON object");
		goto out;
	}
	if (check_fields(r, o, e) != 0)
		goto out;
	json_t *mv = json_object_get(o, "model");
	if (mv && !json_is_string(mv)) {
		bad(e, 400, "model", "model must be a string");
		goto out;
	}
	if (mv && strcmp(json_string_value(mv), S->model_id)) {
		bad(e, 404, "model", "model '%s' does not exist (this server has '%s')",
		    json_string_value(mv), S->model_id);
		goto out;
	}
	if (parse_stream(r, o, e) != 0)
		goto out;
	if ((x = 1, num_field(o, "n", 1, 1, 1, &x, e)) < 0)
		goto out;
	if ((r->chat ? parse_messages(S, r, json_object_get(o, "messages"), e)
	             : parse_prompt(S, r, json_object_get(o, "prompt"), e)) != 0)
		goto out;
	if (r->n_prompt < 1) {
		bad(e, 400, r->chat ? "messages" : "prompt", "the prompt is empty after tokenization");
		goto out;
	}
	const int64_t room = S->m->hp.n_ctx - r->n_prompt;
	if (room < 1) {
		bad(e, 400, r->chat ? "messages" : "prompt",
		    "the prompt's %lld tokens leave no room in the model's context_length %d",
		    (long long)r->n_prompt, (int)S->m->hp.n_ctx);
		goto out;
	}
	double mt = r->chat ? (double)(room < 512 ? room : 512) : 16;
	const char *mt_key = "max_tokens";
	if (get_max_tokens(o, &mt, &mt_key, e) != 0)
		goto out;
	if (mt > (double)room) {
		bad(e, 400, mt_key,
		    "%s %.0f is beyond the context: the prompt has %lld tokens and the "
		    "model's context_length is %d (at most %lld)",
		    mt_key, mt, (long long)r->n_prompt, (int)S->m->hp.n_ctx, (long long)room);
		goto out;
	}
	r->max_tokens = (int64_t)mt;
	double temp = 1.0, top_p = 1.0, top_k = 0, seed = 0;
	if (num_field(o, "temperature", 0, 2, 0, &temp, e) < 0 ||
	    num_field(o, "top_p", 1e-9, 1, 0, &top_p, e) < 0 ||
	    num_field(o, "top_k", 0, 1e6, 1, &top_k, e) < 0 ||
	    num_field(o, "seed", -9.2e18, 9.2e18, 1, &seed, e) < 0)
		goto out;
	uint64_t sd = json_object_get(o, "seed") ? (uint64_t)json_integer_value(json_object_get(o, "seed"))
	                                         : (uint64_t)r->id * 0x9e3779b97f4a7c15ull;
	if (rt_sampler_init(&r->smp, S->m->hp.n_vocab, temp, top_p, (int)top_k, sd) != 0) {
		bad(e, 500, NULL, "out of memory");
		goto out;
	}
	if (parse_stop(r, json_object_get(o, "stop"), e) != 0 ||
	    parse_kv(S, r, json_object_get(o, "kv"), e) != 0)
		goto out;
	int64_t fp = rt_serve_footprint(&r->seq, r->n_prompt, r->max_tokens, S->cfg->chunk);
	r->footprint = (int64_t)rt_kv_blocks_for((int32_t)fp) * S->H * r->seq.kv.block_bytes;
	if (r->footprint > S->cfg->kv_memory) {
		bad(e, 400, "max_tokens",
		    "the request needs up to %lld bytes of KV memory (%lld entries per list under "
		    "policy %s), more than the server's --kv-memory %lld",
		    (long long)r->footprint, (long long)fp, policy_at(S, r->pi)->name,
		    (long long)S->cfg->kv_memory);
		goto out;
	}
	rc = 0;
out:
	json_decref(o);
	return rc;
}

int64_t rt_serve_footprint(rt_seq *s, int64_t n_prompt, int64_t max_tokens, int chunk)
{
	const int64_t P = n_prompt, T = max_tokens, N = P + T;
	const double R = s->run.ctx.ratio;
	if (!s->p->compress || R <= 0)
		return N;
	/* the policy's own triggers (the probes below), then the prefill chunk */
	const int32_t pf = s->run.prefill_chunk < chunk ? s->run.prefill_chunk : chunk;
	s->run.prefill_chunk = 0;
	/* prompt-end trigger: from an empty store the first chunk runs to the prompt end */
	int32_t k0 = rt_run_chunk(&s->run, &s->kv, (int32_t)(P < 65536 ? P : 65536));
	if (P > 1 && k0 >= (P < 65536 ? P : 65536)) {
		s->run.prefill_chunk = pf;
		int64_t a = (int64_t)ceil((double)P / R) + T;
		return a > P ? (a < N ? a : N) : P;
	}
	/* streaming: at the end the store holds about ceil(N / R) entries; the longest chunk
	 * its trigger allows there bounds what an append adds. While the prompt is fed the
	 * budget is ceil(P / R) (the context is the prompt), and a chunked prefill's chunk
	 * adds at most pf entries to it before the compress at the chunk's end */
	const int64_t b = (int64_t)ceil((double)N / R);
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
	const int64_t fp = (int64_t)ceil((double)P / R) + pf;
	f = fp > f ? fp : f;
	return f < N ? f : N;
}

/* ---- HTTP ------------------------------------------------------------------------------ */

typedef struct conn {
	char *body;
	size_t len, cap;
	int too_big;
	req *r;                      /* a submitted request (a reference), or NULL */
	/* while the body arrives (guarded by S->up_mu): on S->uploads, the socket, when the
	 * last bytes came, the declared length; timed_out once answered 408 */
	struct conn *up_next;
	int uploading, timed_out, fd;
	double last;
	long long declared;
} conn;

/* Put cc on the list of bodies in progress (the socket from libmicrohttpd). */
static void upload_start(srv *S, struct MHD_Connection *c, conn *cc, long long declared)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return;
	pthread_mutex_lock(&S->up_mu);
	cc->fd = ci->connect_fd;
	cc->last = rt_now();
	cc->declared = declared;
	cc->uploading = 1;
	cc->up_next = S->uploads;
	S->uploads = cc;
	pthread_mutex_unlock(&S->up_mu);
}

/* Take cc off the list (S->up_mu held). */
static void upload_unlink(srv *S, conn *cc)
{
	for (conn **p = &S->uploads; *p; p = &(*p)->up_next)
		if (*p == cc) {
			*p = cc->up_next;
			break;
		}
	cc->uploading = 0;
}

/* The body is complete, or the request is over: off the list. 1 when the request was
 * already answered 408 (its connection is shut down). */
static int upload_end(srv *S, conn *cc)
{
	pthread_mutex_lock(&S->up_mu);
	if (cc->uploading)
		upload_unlink(S, cc);
	int t = cc->timed_out;
	pthread_mutex_unlock(&S->up_mu);
	return t;
}

/* Answer 408 to every request whose body has stalled for --timeout seconds: libmicrohttpd's
 * own connection timeout (set a second later) would close such a connection without a
 * response, and while a body is incomplete it calls no handler that could queue one, so
 * the answer is written to the socket here, which is then shut down; libmicrohttpd sees
 * the end of the stream, ends the request and calls completed(), which takes it off the
 * list before the socket is closed (the list holds only open sockets). Called every
 * 100 ms by the main thread. */
static void upload_sweep(srv *S)
{
	const double now = rt_now();
	int n408 = 0;
	pthread_mutex_lock(&S->up_mu);
	for (conn **p = &S->uploads; *p;) {
		conn *cc = *p;
		if (now - cc->last < S->cfg->timeout_s) {
			p = &cc->up_next;
			continue;
		}
		char msg[256], head[256], got[64];
		if (cc->declared > 0)
			snprintf(got, sizeof got, "%zu of %lld bytes", cc->len, cc->declared);
		else
			snprintf(got, sizeof got, "%zu bytes", cc->len);
		snprintf(msg, sizeof msg, "the request body was not received within %d s (%s arrived)",
		         S->cfg->timeout_s, got);
		json_t *o = error_obj(msg, "invalid_request_error", NULL, "request_timeout");
		char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
		json_decref(o);
		const size_t bl = b ? strlen(b) : 0;
		int hl = snprintf(head, sizeof head, "HTTP/1.1 408 Request Timeout\r\nContent-Type: "
		                  "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
		                  bl);
		/* a best effort: the client stopped sending, it may have stopped reading too */
		if (send(cc->fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT) == hl && b)
			(void)send(cc->fd, b, bl, MSG_NOSIGNAL | MSG_DONTWAIT);
		free(b);
		shutdown(cc->fd, SHUT_RDWR);
		*p = cc->up_next;
		cc->uploading = 0;
		cc->timed_out = 1;
		n408++;
	}
	pthread_mutex_unlock(&S->up_mu);
	while (n408-- > 0)
		count_status(S, 408);
}

/* 1 when the client has closed its side of the connection. */
static int client_gone(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return 0;
	char b;
	ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Wait (S->mu held) up to 50 ms for a signal on r->cv; then, if r is not done and the
 * client c (NULL: none to watch) has left, mark r cancelled, wake the worker and return
 * -1; else 0. */
static int wait_slice(srv *S, req *r, struct MHD_Connection *c)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 50 * 1000 * 1000;
	if (ts.tv_nsec >= 1000000000)
		ts.tv_sec++, ts.tv_nsec -= 1000000000;
	pthread_cond_timedwait(&r->cv, &S->mu, &ts);
	if (r->state != RQ_DONE && c && client_gone(c)) {
		r->cancelled = 1;
		pthread_cond_signal(&S->cv);
		return -1;
	}
	return 0;
}

/* Wait (S->mu held) until pred holds for r or the client leaves; 0 or -1 (gone). */
static int wait_req(srv *S, req *r, struct MHD_Connection *c, int for_done)
{
	while (for_done ? r->state != RQ_DONE
	                : r->state != RQ_DONE && r->sse_len == r->sse_off && r->t_first == 0) {
		if (wait_slice(S, r, c) < 0)
			return -1;
	}
	return 0;
}

typedef struct stream_ctx {
	req *r;
	struct MHD_Connection *c;
} stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	stream_ctx *x = cls;
	req *r = x->r;
	srv *S = r->S;
	pthread_mutex_lock(&S->mu);
	for (;;) {
		if (r->sse_off < r->sse_len) {
			size_t n = r->sse_len - r->sse_off < max ? r->sse_len - r->sse_off : max;
			memcpy(buf, r->sse + r->sse_off, n);
			r->sse_off += n;
			pthread_mutex_unlock(&S->mu);
			return (ssize_t)n;
		}
		if (r->sse_done || r->state == RQ_DONE) {
			pthread_mutex_unlock(&S->mu);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		if (wait_slice(S, r, x->c) < 0) {
			pthread_mutex_unlock(&S->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
	}
}

static void stream_free(void *cls)
{
	stream_ctx *x = cls;
	srv *S = x->r->S;
	pthread_mutex_lock(&S->mu);
	if (x->r->state != RQ_DONE) {
		x->r->cancelled = 1; /* the client left mid-stream */
		pthread_cond_signal(&S->cv);
	}
	req_unref(x->r);
	pthread_mutex_unlock(&S->mu);
	free(x);
}

/* The final JSON of a non-streamed request. */
static json_t *final_obj(srv *S, req *r)
{
	json_t *o = base_obj(S, r, r->chat ? "chat.completion" : "text_completion");
	json_t *ch = json_object();
	json_object_set_new(ch, "index", json_integer(0));
	if (r->chat) {
		json_t *msg = json_object();
		json_object_set_new(msg, "role", json_string("assistant"));
		json_object_set_new(msg, "content", json_text(r->out ? r->out : "", r->len));
		json_object_set_new(ch, "message", msg);
	} else {
		json_object_set_new(ch, "text", json_text(r->out ? r->out : "", r->len));
		json_object_set_new(ch, "logprobs", json_null());
	}
	json_object_set_new(ch, "finish_reason", json_string(r->finish));
	json_t *arr = json_array();
	json_array_append_new(arr, ch);
	json_object_set_new(o, "choices", arr);
	json_object_set_new(o, "usage", usage_obj(r));
	json_object_set_new(o, "kv", kv_obj(S, r));
	return o;
}

/* A complete POST to a generation endpoint. */
static enum MHD_Result serve_generate(srv *S, struct MHD_Connection *c, conn *cc, int chat)
{
	req *r = calloc(1, sizeof *r);
	if (!r)
		return send_error(S, c, 500, NULL, "out of memory");
	pthread_cond_init(&r->cv, NULL);
	r->S = S;
	S->live++;
	r->chat = chat;
	r->t0 = rt_now();
	pthread_mutex_lock(&S->mu);
	r->id = ++S->next_id;
	pthread_mutex_unlock(&S->mu);
	snprintf(r->id_str, sizeof r->id_str, "%s-%llu", chat ? "chatcmpl" : "cmpl",
	         (unsigned long long)r->id);
	verr e = { 0 };
	if (parse_request(S, r, cc->body ? cc->body : "", cc->len, &e) != 0) {
		req_free(r);
		return send_error(S, c, (unsigned)e.status, e.param[0] ? e.param : NULL, "%s", e.msg);
	}
	pthread_mutex_lock(&S->mu);
	if (S->draining || S->n_queued >= S->cfg->queue) {
		S->rejected++;
		int dr = S->draining;
		pthread_mutex_unlock(&S->mu);
		req_free(r);
		return send_error(S, c, 503, NULL, dr ? "the server is shutting down"
		                                      : "the server is busy: the request queue is full; retry later");
	}
	r->refs = 2; /* this handler and the scheduler */
	r->state = RQ_QUEUED;
	if (S->qtail)
		S->qtail->next_q = r;
	else
		S->qhead = r;
	S->qtail = r;
	S->n_queued++;
	pthread_cond_signal(&S->cv);
	if (wait_req(S, r, c, !r->stream) != 0) {
		req_unref(r);
		pthread_mutex_unlock(&S->mu);
		return MHD_NO;
	}
	if (r->status) {
		unsigned st = (unsigned)r->status;
		char msg[512];
		snprintf(msg, sizeof msg, "%s", r->err);
		req_unref(r);
		pthread_mutex_unlock(&S->mu);
		return send_error(S, c, st, NULL, "%s", msg);
	}
	S->req_by_status[200]++;
	if (!r->stream) {
		json_t *o = final_obj(S, r);
		req_unref(r);
		pthread_mutex_unlock(&S->mu);
		return send_json(c, 200, o, 0);
	}
	pthread_mutex_unlock(&S->mu);
	stream_ctx *x = malloc(sizeof *x);
	struct MHD_Response *resp =
		x ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, x, stream_free)
		  : NULL;
	if (!resp) {
		free(x);
		pthread_mutex_lock(&S->mu);
		r->cancelled = 1;
		req_unref(r);
		pthread_mutex_unlock(&S->mu);
		return MHD_NO;
	}
	x->r = r;
	x->c = c;
	MHD_add_response_header(resp, "Content-Type", "text/event-stream");
	MHD_add_response_header(resp, "Cache-Control", "no-cache");
	enum MHD_Result rc = MHD_queue_response(c, 200, resp);
	MHD_destroy_response(resp);
	return rc;
}

static enum MHD_Result serve_models(srv *S, struct MHD_Connection *c)
{
	json_t *m = json_object(), *pl = json_array();
	json_object_set_new(m, "id", json_string(S->model_id));
	json_object_set_new(m, "object", json_string("model"));
	json_object_set_new(m, "created", json_integer(0));
	json_object_set_new(m, "owned_by", json_string("kvpc"));
	for (int i = 0; i <= S->n_reg; i++)
		json_array_append_new(pl, json_string(policy_at(S, i)->name));
	json_object_set_new(m, "kv_policies", pl);
	json_object_set_new(m, "context_length", json_integer(S->m->hp.n_ctx));
	json_t *o = json_object(), *arr = json_array();
	json_array_append_new(arr, m);
	json_object_set_new(o, "object", json_string("list"));
	json_object_set_new(o, "data", arr);
	count_status(S, 200);
	return send_json(c, 200, o, 0);
}

static void metric(char **b, size_t *l, size_t *cp, const char *name, const char *type,
                   const char *help, double v)
{
	char t[512];
	int n = snprintf(t, sizeof t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
	                 type, name, v);
	buf_add(b, l, cp, t, (size_t)n);
}

static enum MHD_Result serve_metrics(srv *S, struct MHD_Connection *c)
{
	char *b = NULL, t[512];
	size_t l = 0, cp = 0;
	rt_kvpool_stats ps = rt_kvpool_get(rt_kvpool_process());
	pthread_mutex_lock(&S->mu);
	metric(&b, &l, &cp, "kvpc_pool_bytes_total", "gauge", "KV pool size (--kv-memory), bytes",
	       (double)S->cfg->kv_memory);
	metric(&b, &l, &cp, "kvpc_pool_bytes_in_use", "gauge", "KV pool bytes held by sequences",
	       (double)ps.used);
	metric(&b, &l, &cp, "kvpc_pool_bytes_reserved", "gauge",
	       "worst-case KV bytes reserved by admitted requests", (double)S->reserved);
	metric(&b, &l, &cp, "kvpc_pool_blocks_in_use", "gauge", "KV pool blocks held",
	       (double)ps.blocks);
	metric(&b, &l, &cp, "kvpc_kv_entries_in_use", "gauge",
	       "KV entries held by the active sequences", (double)S->entries_now);
	metric(&b, &l, &cp, "kvpc_kv_bytes_in_use", "gauge",
	       "key and value bytes the active sequences hold, as stored", (double)S->kv_bytes_now);
	metric(&b, &l, &cp, "kvpc_kv_f16_bytes", "gauge",
	       "key and value bytes of f16 full caches of the active sequences' tokens",
	       (double)S->f16_bytes_now);
	metric(&b, &l, &cp, "kvpc_kv_bytes_compression", "gauge",
	       "kvpc_kv_f16_bytes / kvpc_kv_bytes_in_use (0 with no active sequence)",
	       S->kv_bytes_now > 0 ? (double)S->f16_bytes_now / (double)S->kv_bytes_now : 0);
	metric(&b, &l, &cp, "kvpc_sequences_active", "gauge", "sequences being decoded or prefilled",
	       S->n_active);
	metric(&b, &l, &cp, "kvpc_sequences_queued", "gauge", "requests waiting for admission",
	       S->n_queued);
	static const char rq[] = "# HELP kvpc_requests_total requests answered, by HTTP status\n"
	                         "# TYPE kvpc_requests_total counter\n";
	buf_add(&b, &l, &cp, rq, sizeof rq - 1);
	for (int s = 0; s < 600; s++)
		if (S->req_by_status[s]) {
			int n = snprintf(t, sizeof t, "kvpc_requests_total{status=\"%d\"} %lld\n", s,
			                 (long long)S->req_by_status[s]);
			buf_add(&b, &l, &cp, t, (size_t)n);
		}
	metric(&b, &l, &cp, "kvpc_requests_rejected_total", "counter",
	       "requests refused with 503 (queue full or draining)", (double)S->rejected);
	metric(&b, &l, &cp, "kvpc_prompt_tokens_total", "counter", "prompt tokens prefilled",
	       (double)S->prompt_tokens);
	metric(&b, &l, &cp, "kvpc_generated_tokens_total", "counter", "tokens generated",
	       (double)S->gen_tokens);
	const char *fams[2] = { "kvpc_compress_events_total", "kvpc_entries_evicted_total" };
	const char *helps[2] = { "compress calls, by policy", "KV entries evicted or merged, by policy" };
	for (int f = 0; f < 2; f++) {
		int n = snprintf(t, sizeof t, "# HELP %s %s\n# TYPE %s counter\n", fams[f], helps[f], fams[f]);
		buf_add(&b, &l, &cp, t, (size_t)n);
		for (int i = 0; i <= S->n_reg; i++) {
			n = snprintf(t, sizeof t, "%s{policy=\"%s\"} %lld\n", fams[f], policy_at(S, i)->name,
			             (long long)(f ? S->evicted_by_p[i] : S->compress_by_p[i]));
			buf_add(&b, &l, &cp, t, (size_t)n);
		}
	}
	static const char sh[] = "# HELP kvpc_step_seconds wall time of one batched step\n"
	                         "# TYPE kvpc_step_seconds histogram\n";
	buf_add(&b, &l, &cp, sh, sizeof sh - 1);
	int64_t cum = 0;
	for (int i = 0; i <= N_BUCKETS; i++) {
		cum += S->step_hist[i];
		int n = i < N_BUCKETS
		            ? snprintf(t, sizeof t, "kvpc_step_seconds_bucket{le=\"%g\"} %lld\n", step_buckets[i],
		                       (long long)cum)
		            : snprintf(t, sizeof t, "kvpc_step_seconds_bucket{le=\"+Inf\"} %lld\n", (long long)cum);
		buf_add(&b, &l, &cp, t, (size_t)n);
	}
	int n = snprintf(t, sizeof t, "kvpc_step_seconds_sum %.9g\nkvpc_step_seconds_count %lld\n",
	                 S->step_sum, (long long)S->steps);
	buf_add(&b, &l, &cp, t, (size_t)n);
	metric(&b, &l, &cp, "kvpc_tokens_per_second", "gauge",
	       "generated tokens per second of busy step time",
	       S->busy_seconds > 0 ? (double)S->gen_tokens / S->busy_seconds : 0.0);
	S->req_by_status[200]++;
	pthread_mutex_unlock(&S->mu);
	enum MHD_Result rc = send_text(c, 200, "text/plain; version=0.0.4", b ? b : "", l, 0);
	free(b);
	return rc;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
	(void)version;
	srv *S = cls;
	conn *cc = *con_cls;
	const int post = !strcmp(method, "POST");
	if (!cc) {
		if (!(cc = calloc(1, sizeof *cc)))
			return MHD_NO;
		*con_cls = cc;
		if (post) {
			const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
			if (cl && strtoll(cl, NULL, 10) > S->cfg->max_body)
				return send_error(S, c, 413, NULL, "the request body of %s bytes exceeds %lld bytes",
				                  cl, (long long)S->cfg->max_body);
			const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
			if ((cl && strtoll(cl, NULL, 10) > 0) || te)
				upload_start(S, c, cc, cl ? strtoll(cl, NULL, 10) : -1);
			return MHD_YES;
		}
	}
	if (post && *upload_size) {
		pthread_mutex_lock(&S->up_mu);
		const int dead = cc->timed_out;
		cc->last = rt_now();
		pthread_mutex_unlock(&S->up_mu);
		if (dead)
			return MHD_NO;
		if (cc->len + *upload_size > (size_t)S->cfg->max_body)
			cc->too_big = 1;
		else if (buf_add(&cc->body, &cc->len, &cc->cap, upload, *upload_size) != 0)
			cc->too_big = 1;
		*upload_size = 0;
		return MHD_YES;
	}
	if (post && upload_end(S, cc))
		return MHD_NO; /* answered 408 already */
	if (S->cfg->api_key) {
		const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
		if (!a || strncmp(a, "Bearer ", 7) || strcmp(a + 7, S->cfg->api_key))
			return send_error(S, c, 401, NULL, "a valid API key is required (Authorization: Bearer KEY)");
	}
	const int gen = !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions");
	if (gen) {
		if (!post)
			return send_error(S, c, 405, NULL, "%s takes POST", url);
		if (cc->too_big)
			return send_error(S, c, 413, NULL, "the request body exceeds %lld bytes",
			                  (long long)S->cfg->max_body);
		return serve_generate(S, c, cc, !strcmp(url, "/v1/chat/completions"));
	}
	if (strcmp(method, "GET"))
		return send_error(S, c, strcmp(url, "/v1/models") && strcmp(url, "/health") &&
		                                strcmp(url, "/metrics") ? 404 : 405,
		                  NULL, "%s %s: no such endpoint", method, url);
	if (!strcmp(url, "/v1/models"))
		return serve_models(S, c);
	if (!strcmp(url, "/metrics"))
		return serve_metrics(S, c);
	if (!strcmp(url, "/health")) {
		pthread_mutex_lock(&S->mu);
		int dr = S->draining;
		pthread_mutex_unlock(&S->mu);
		count_status(S, dr ? 503 : 200);
		json_t *o = json_object();
		json_object_set_new(o, "status", json_string(dr ? "draining" : "ok"));
		return send_json(c, dr ? 503 : 200, o, dr);
	}
	return send_error(S, c, 404, NULL, "GET %s: no such endpoint", url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
	(void)c, (void)toe;
	conn *cc = *con_cls;
	if (!cc)
		return;
	upload_end(cls, cc);
	free(cc->body);
	free(cc);
	*con_cls = NULL;
}

/* ---- startup and drain ---------------------------------------------------------------- */

static int srv_open(srv *S, rt_err *err)
{
	const rt_serve_cfg *c = S->cfg;
	rt_gguf *g = rt_gguf_open(c->model, err);
	if (!g)
		return -1;
	S->tk = rt_tokenizer_init(g, err);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	rt_model_opts mo = { .exact = c->exact, .kv_type = c->kv_type,
	                     .threads = c->threads > 0 ? c->threads
	                                : c->exact ? 0 : (int)(ncpu < 1 ? 1 : ncpu > 256 ? 256 : ncpu) };
	S->m = S->tk ? rt_model_load_opts(g, &mo, err) : NULL;
	rt_gguf_close(g);
	if (!S->m)
		return -1;
	const char *base = strrchr(c->model, '/');
	snprintf(S->model_id, sizeof S->model_id, "%s", base ? base + 1 : c->model);
	char *dot = strstr(S->model_id, ".gguf");
	if (dot)
		*dot = 0;
	S->H = S->m->hp.n_layer * S->m->hp.n_head_kv;
	const int K = c->max_seqs, V = S->m->hp.n_vocab;
	if (rt_seq_multi_init(&S->mb, S->m, K, c->step_rows > K ? c->step_rows : K, err) != 0)
		return -1;
	S->lg = malloc((size_t)K * V * sizeof *S->lg);
	S->sp = calloc((size_t)K, sizeof *S->sp);
	S->tp = calloc((size_t)K, sizeof *S->tp);
	S->tn = calloc((size_t)K, sizeof *S->tn);
	S->why = calloc((size_t)K, sizeof *S->why);
	S->stepped = calloc((size_t)K, sizeof *S->stepped);
	S->active = calloc((size_t)K, sizeof *S->active);
	S->compress_by_p = calloc((size_t)S->n_reg + 1, sizeof(int64_t));
	S->evicted_by_p = calloc((size_t)S->n_reg + 1, sizeof(int64_t));
	if (!S->lg || !S->sp || !S->tp || !S->tn || !S->why || !S->stepped || !S->active ||
	    !S->compress_by_p || !S->evicted_by_p)
		return rt_err_set(err, "out of memory");
	if (c->trace && !(S->trace = fopen(c->trace, "a")))
		return rt_err_set(err, "%s: cannot open the trace file: %s", c->trace, strerror(errno));
	rt_kvpool_set_limit(rt_kvpool_process(), c->kv_memory);
	return 0;
}

static void srv_close(srv *S)
{
	rt_seq_multi_free(&S->mb);
	free(S->lg), free(S->sp), free(S->tp), free(S->tn), free(S->why), free(S->stepped);
	free(S->active), free(S->compress_by_p), free(S->evicted_by_p);
	if (S->trace)
		fclose(S->trace);
	rt_model_free(S->m);
	rt_tokenizer_free(S->tk);
}

int rt_serve_run(const rt_serve_cfg *cfg, const struct kvp_policy *const *reg, int n_reg)
{
	srv S0 = { .cfg = cfg, .reg = reg, .n_reg = n_reg }, *S = &S0;
	pthread_mutex_init(&S->mu, NULL);
	pthread_mutex_init(&S->up_mu, NULL);
	pthread_cond_init(&S->cv, NULL);
	rt_err err = { "" };
	/* every thread started from here on inherits the blocked signals; main waits for them */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	int rc = 1;
	pthread_t th;
	int th_live = 0;
	struct MHD_Daemon *d = NULL;
	if (srv_open(S, &err) != 0) {
		fprintf(stderr, "%s: serve: %s\n", cfg->prog, err.msg);
		goto out;
	}
	if (pthread_create(&th, NULL, scheduler, S) != 0) {
		fprintf(stderr, "%s: serve: cannot start the scheduler thread\n", cfg->prog);
		goto out;
	}
	th_live = 1;
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port) };
	if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1) {
		fprintf(stderr, "%s: serve: --host %s is not an IPv4 address\n", cfg->prog, cfg->host);
		goto out;
	}
	d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD,
	                     (uint16_t)cfg->port, NULL, NULL, handler, S, MHD_OPTION_SOCK_ADDR, &addr,
	                     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s + 1,
	                     MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_seqs + cfg->queue + 64),
	                     MHD_OPTION_NOTIFY_COMPLETED, completed, S, MHD_OPTION_END);
	if (!d) {
		fprintf(stderr, "%s: serve: cannot listen on %s:%d: %s\n", cfg->prog, cfg->host,
		        cfg->port, strerror(errno));
		goto out;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	fprintf(stderr, "%s: serve: listening on http://%s:%u (model %s, KV pool %lld bytes)\n",
	        cfg->prog, cfg->host, di ? (unsigned)di->port : (unsigned)cfg->port, S->model_id,
	        (long long)cfg->kv_memory);
	fflush(stderr);
	int sig = -1;
	const struct timespec tick = { 0, 100 * 1000 * 1000 };
	while (sig < 0) {
		upload_sweep(S);
		sig = sigtimedwait(&sigs, NULL, &tick);
	}
	fprintf(stderr, "%s: serve: signal %d: draining\n", cfg->prog, sig);
	pthread_mutex_lock(&S->mu);
	S->draining = 1;
	while (S->n_active || S->n_queued) {
		pthread_mutex_unlock(&S->mu);
		upload_sweep(S);
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&S->mu);
	}
	pthread_mutex_unlock(&S->mu);
	/* let the last responses leave (at most 10 s) */
	for (int i = 0; i < 500 && S->live > 0; i++) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	MHD_stop_daemon(d);
	d = NULL;
	rc = 0;
out:
	if (d)
		MHD_stop_daemon(d);
	if (th_live) {
		pthread_mutex_lock(&S->mu);
		S->stop = 1;
		pthread_cond_signal(&S->cv);
		pthread_mutex_unlock(&S->mu);
		pthread_join(th, NULL);
	}
	srv_close(S);
	return rc;
}
