/*
 * rt_serve_http: the HTTP side of the server (libmicrohttpd, one thread per connection, which
 * blocks on its request): responses and OpenAI's error object, request bodies and their
 * stall timeout (408), Server-Sent Events, /v1/models, /health, /metrics, and the route
 * table the handler dispatches on. Locking: rt_serve_int.h, above struct srv.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "kv/rt_kvpool.h"
#include "model/rt_model.h"
#include "serve/rt_serve_int.h"

/* ---- the endpoints -------------------------------------------------------------------- */

typedef struct conn {
	char *body;
	size_t len, cap;
	int too_big;
	int ep;                      /* the endpoint: a row of routes[], or N_ROUTES (none) */
	req *r;                      /* a submitted request (a reference), or NULL */
	/* while the body arrives (guarded by S->up_mu): on S->uploads, the socket, when the
	 * last bytes came, the declared length; timed_out once answered 408 */
	struct conn *up_next;
	int uploading, timed_out, fd;
	double last;
	long long declared;
} conn;

/* The endpoints: a path served with another method is 405, a path not here 404. */
typedef enum MHD_Result (*route_fn)(srv *S, struct MHD_Connection *c, conn *cc);
static enum MHD_Result serve_completions(srv *S, struct MHD_Connection *c, conn *cc);
static enum MHD_Result serve_chat(srv *S, struct MHD_Connection *c, conn *cc);
static enum MHD_Result serve_models(srv *S, struct MHD_Connection *c, conn *cc);
static enum MHD_Result serve_health(srv *S, struct MHD_Connection *c, conn *cc);
static enum MHD_Result serve_metrics(srv *S, struct MHD_Connection *c, conn *cc);
static const struct route {
	const char *method, *path;
	route_fn fn;
	int counted; /* in kvpc_requests_total: not the probes and scrapes */
} routes[] = {
	{ "POST", "/v1/completions", serve_completions, 1 },
	{ "POST", "/v1/chat/completions", serve_chat, 1 },
	{ "GET", "/v1/models", serve_models, 1 },
	{ "GET", "/health", serve_health, 0 },
	{ "GET", "/metrics", serve_metrics, 0 },
};
#define N_ROUTES (int)(sizeof routes / sizeof *routes)
_Static_assert(sizeof routes / sizeof *routes + 1 == SRV_N_ENDPOINTS,
               "SRV_N_ENDPOINTS: the routes and one for paths not among them");

/* The row of routes[] whose path is url, or N_ROUTES. */
static int route_find(const char *url)
{
	int i = 0;
	while (i < N_ROUTES && strcmp(url, routes[i].path))
		i++;
	return i;
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
	char *s = json_dumps(j, SRV_JSON_FLAGS);
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

/* Count an answer of endpoint ep by its status (S->mu held). */
static void count_answer(srv *S, int ep, unsigned status)
{
	if (ep == N_ROUTES || routes[ep].counted)
		S->req_by_status[ep][status < 600 ? status : 599]++;
}

static void count_status(srv *S, int ep, unsigned status)
{
	pthread_mutex_lock(&S->mu);
	count_answer(S, ep, status);
	pthread_mutex_unlock(&S->mu);
}

static enum MHD_Result send_error(srv *S, struct MHD_Connection *c, const conn *cc,
                                  unsigned status, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));
static enum MHD_Result send_error(srv *S, struct MHD_Connection *c, const conn *cc,
                                  unsigned status, const char *param, const char *fmt, ...)
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
	count_status(S, cc->ep, status);
	return send_json(c, status, error_obj(msg, type, param, NULL), status == 503);
}

/* ---- HTTP ------------------------------------------------------------------------------ */

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
 * the end of the stream, ends the request and calls srv_completed(), which takes it off the
 * list before the socket is closed (the list holds only open sockets). Called every
 * 100 ms by the main thread. */
void srv_upload_sweep(srv *S)
{
	const double now = rt_now();
	int n408 = 0, ep408[64];
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
		char *b = o ? json_dumps(o, SRV_JSON_FLAGS) : NULL;
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
		if (n408 < 64)
			ep408[n408++] = cc->ep;
	}
	pthread_mutex_unlock(&S->up_mu);
	while (n408 > 0)
		count_status(S, ep408[--n408], 408);
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
	srv_req_unref(x->r);
	pthread_mutex_unlock(&S->mu);
	free(x);
}

/* The final JSON of a non-streamed request. */
static json_t *final_obj(srv *S, req *r)
{
	json_t *o = srv_base_obj(S, r, r->chat ? "chat.completion" : "text_completion");
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
	json_object_set_new(o, "usage", srv_usage_obj(r));
	json_object_set_new(o, "kv", srv_kv_obj(S, r));
	return o;
}

/* A complete POST to a generation endpoint. */
static enum MHD_Result serve_generate(srv *S, struct MHD_Connection *c, conn *cc, int chat)
{
	if (cc->too_big)
		return send_error(S, c, cc, 413, NULL, "the request body exceeds %lld bytes",
		                  (long long)S->cfg->max_body);
	req *r = calloc(1, sizeof *r);
	if (!r)
		return send_error(S, c, cc, 500, NULL, "out of memory");
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
	if (srv_parse_request(S, r, cc->body ? cc->body : "", cc->len, &e) != 0) {
		srv_req_free(r);
		return send_error(S, c, cc, (unsigned)e.status, e.param[0] ? e.param : NULL, "%s", e.msg);
	}
	pthread_mutex_lock(&S->mu);
	if (S->draining || S->n_queued >= S->cfg->queue) {
		S->rejected++;
		int dr = S->draining;
		pthread_mutex_unlock(&S->mu);
		srv_req_free(r);
		return send_error(S, c, cc, 503, NULL, dr ? "the server is shutting down"
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
		count_answer(S, cc->ep, 499); /* nginx's "client closed request": no answer sent */
		srv_req_unref(r);
		pthread_mutex_unlock(&S->mu);
		return MHD_NO;
	}
	if (r->status) {
		unsigned st = (unsigned)r->status;
		char msg[512];
		snprintf(msg, sizeof msg, "%s", r->err);
		srv_req_unref(r);
		pthread_mutex_unlock(&S->mu);
		return send_error(S, c, cc, st, NULL, "%s", msg);
	}
	count_answer(S, cc->ep, 200);
	r->answered = 1;
	if (!r->stream) {
		json_t *o = final_obj(S, r);
		srv_req_unref(r);
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
		srv_req_unref(r);
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

static enum MHD_Result serve_models(srv *S, struct MHD_Connection *c, conn *cc)
{
	(void)cc;
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
	count_status(S, cc->ep, 200);
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

/* One row of /metrics: a gauge or counter without labels. */
typedef struct metric_row {
	const char *name, *type, *help;
	double v;
} metric_row;

static void metric_rows(char **b, size_t *l, size_t *cp, const metric_row *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		metric(b, l, cp, r[i].name, r[i].type, r[i].help, r[i].v);
}

/* kvpc_requests_total{endpoint, status} (S->mu held). */
static void metric_requests(const srv *S, char **b, size_t *l, size_t *cp)
{
	static const char rq[] = "# HELP kvpc_requests_total requests answered, by endpoint and "
	                         "HTTP status (not /health or /metrics; 499: the client left "
	                         "before an answer)\n# TYPE kvpc_requests_total counter\n";
	buf_add(b, l, cp, rq, sizeof rq - 1);
	for (int ep = 0; ep < SRV_N_ENDPOINTS; ep++)
		for (int st = 0; st < 600; st++)
			if (S->req_by_status[ep][st]) {
				char t[256];
				int n = snprintf(t, sizeof t,
				                 "kvpc_requests_total{endpoint=\"%s\",status=\"%d\"} %lld\n",
				                 ep < N_ROUTES ? routes[ep].path : "other", st,
				                 (long long)S->req_by_status[ep][st]);
				buf_add(b, l, cp, t, (size_t)n);
			}
}

/* One Prometheus histogram: cumulative buckets, +Inf, _sum, _count (S->mu held). */
static void metric_hist(char **b, size_t *l, size_t *cp, const srv_hist_def *d,
                        const srv_hist *x)
{
	char t[512];
	int n = snprintf(t, sizeof t, "# HELP %s %s\n# TYPE %s histogram\n", d->name, d->help,
	                 d->name);
	buf_add(b, l, cp, t, (size_t)n);
	int64_t cum = 0;
	for (int i = 0; i <= d->n; i++) {
		cum += x->count[i];
		char le[32];
		if (i < d->n)
			snprintf(le, sizeof le, "%g", d->le[i]);
		else
			snprintf(le, sizeof le, "+Inf");
		n = snprintf(t, sizeof t, "%s_bucket{le=\"%s\"} %lld\n", d->name, le, (long long)cum);
		buf_add(b, l, cp, t, (size_t)n);
	}
	n = snprintf(t, sizeof t, "%s_sum %.9g\n%s_count %lld\n", d->name, x->sum, d->name,
	             (long long)x->n);
	buf_add(b, l, cp, t, (size_t)n);
}

static enum MHD_Result serve_metrics(srv *S, struct MHD_Connection *c, conn *cc)
{
	(void)cc;
	char *b = NULL, t[512];
	size_t l = 0, cp = 0;
	rt_kvpool_stats ps = rt_kvpool_get(rt_kvpool_process());
	pthread_mutex_lock(&S->mu);
	const int64_t kvb = S->kv_bytes_now;
	const metric_row rows[] = {
		{ "kvpc_pool_bytes_total", "gauge", "KV pool size (--kv-memory), bytes",
		  (double)S->cfg->kv_memory },
		{ "kvpc_pool_bytes_in_use", "gauge", "KV pool bytes held by sequences", (double)ps.used },
		{ "kvpc_pool_bytes_reserved", "gauge",
		  "worst-case KV bytes reserved by admitted requests (a shared prefix's rows once)",
		  (double)S->reserved },
		{ "kvpc_pool_blocks_in_use", "gauge", "KV pool blocks held", (double)ps.blocks },
		{ "kvpc_kv_entries_in_use", "gauge", "KV entries held by the active sequences",
		  (double)S->entries_now },
		{ "kvpc_kv_bytes_in_use", "gauge",
		  "key and value bytes the active sequences hold, as stored", (double)kvb },
		{ "kvpc_kv_f16_bytes", "gauge",
		  "key and value bytes of f16 full caches of the active sequences' tokens",
		  (double)S->f16_bytes_now },
		{ "kvpc_kv_bytes_compression", "gauge",
		  "kvpc_kv_f16_bytes / kvpc_kv_bytes_in_use (0 with no active sequence)",
		  kvb > 0 ? (double)S->f16_bytes_now / (double)kvb : 0 },
		{ "kvpc_step_pool_bytes_in_use", "gauge",
		  "kvpc_pool_bytes_in_use at the end of the last step", (double)S->pool_used_now },
		{ "kvpc_step_kv_bytes_held", "gauge",
		  "pool bytes the active sequences' lists would hold unshared, at the end of the "
		  "last step", (double)S->kv_held_now },
		{ "kvpc_prefix_segments", "gauge", "shared prompt prefixes held", S->n_pfx },
		{ "kvpc_prefix_bytes", "gauge",
		  "key and value bytes of the shared prefixes, counted once in the pool",
		  (double)S->pfx_bytes_now },
		{ "kvpc_prefix_bytes_saved", "gauge",
		  "pool bytes the sequences sharing prefixes do not hold twice",
		  (double)S->pfx_saved_now },
		{ "kvpc_prefix_sequences", "gauge", "active sequences sharing a prompt prefix",
		  (double)S->pfx_seqs_now },
		{ "kvpc_prefix_shared_total", "counter", "sequences that shared a prompt prefix",
		  (double)S->pfx_shared },
		{ "kvpc_prefix_differed_total", "counter",
		  "sequences whose prefix rows differed from the shared copy's (kept their own)",
		  (double)S->pfx_differ },
		{ "kvpc_prefix_skipped_tokens_total", "counter",
		  "prompt tokens not prefilled: their sequences forked a shared prefix",
		  (double)S->pfx_skipped },
		{ "kvpc_sequences_active", "gauge", "sequences being decoded or prefilled",
		  S->n_active },
		{ "kvpc_sequences_queued", "gauge", "requests waiting for admission", S->n_queued },
	};
	metric_rows(&b, &l, &cp, rows, sizeof rows / sizeof *rows);
	metric_requests(S, &b, &l, &cp);
	metric(&b, &l, &cp, "kvpc_requests_rejected_total", "counter",
	       "requests refused with 503 (queue full or draining)", (double)S->rejected);
	metric(&b, &l, &cp, "kvpc_requests_cancelled_total", "counter",
	       "requests whose client left before their end (each a trace line, finish_reason "
	       "cancelled)", (double)S->cancelled);
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
	for (int h = 0; h < SRV_N_HISTS; h++)
		metric_hist(&b, &l, &cp, &srv_hists[h], &S->hist[h]);
	metric(&b, &l, &cp, "kvpc_tokens_per_second", "gauge",
	       "generated tokens per second of busy step time",
	       S->busy_seconds > 0 ? (double)S->gen_tokens / S->busy_seconds : 0.0);
	pthread_mutex_unlock(&S->mu);
	enum MHD_Result rc = send_text(c, 200, "text/plain; version=0.0.4", b ? b : "", l, 0);
	free(b);
	return rc;
}

static enum MHD_Result serve_health(srv *S, struct MHD_Connection *c, conn *cc)
{
	(void)cc;
	pthread_mutex_lock(&S->mu);
	int dr = S->draining;
	pthread_mutex_unlock(&S->mu);
	json_t *o = json_object();
	json_object_set_new(o, "status", json_string(dr ? "draining" : "ok"));
	return send_json(c, dr ? 503 : 200, o, dr);
}

static enum MHD_Result serve_completions(srv *S, struct MHD_Connection *c, conn *cc)
{
	return serve_generate(S, c, cc, 0);
}

static enum MHD_Result serve_chat(srv *S, struct MHD_Connection *c, conn *cc)
{
	return serve_generate(S, c, cc, 1);
}


/* libmicrohttpd's access handler: collects a POST body, checks the API key, then dispatches
 * on routes[]. */
enum MHD_Result srv_handler(void *cls, struct MHD_Connection *c, const char *url,
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
		cc->ep = route_find(url);
		if (post) {
			const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
			if (cl && strtoll(cl, NULL, 10) > S->cfg->max_body)
				return send_error(S, c, cc, 413, NULL, "the request body of %s bytes exceeds %lld bytes",
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
			return send_error(S, c, cc, 401, NULL, "a valid API key is required (Authorization: Bearer KEY)");
	}
	if (cc->ep == N_ROUTES)
		return send_error(S, c, cc, 404, NULL, "%s %s: no such endpoint", method, url);
	const struct route *rt = &routes[cc->ep];
	if (strcmp(method, rt->method))
		return send_error(S, c, cc, 405, NULL, "%s takes %s", url, rt->method);
	return rt->fn(S, c, cc);
}

void srv_completed(void *cls, struct MHD_Connection *c, void **con_cls,
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
