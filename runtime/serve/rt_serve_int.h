/*
 * rt_serve_int: what the files of the server share, private to runtime/serve/ (the public
 * interface is rt_serve.h). The server is cut on its rulers:
 *   rt_serve.c        startup and drain (srv_open, srv_close, rt_serve_run);
 *   rt_serve_req.c    an OpenAI request body -> a req with its sequence (validation);
 *   rt_serve_sched.c  request lifetime, admission, continuous batching, stop rules, footprint;
 *   rt_serve_http.c   responses, uploads, SSE, /metrics and the route table.
 */
#ifndef RT_SERVE_INT_H
#define RT_SERVE_INT_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_util.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_seq.h"
#include "eval/rt_sample.h"
#include "serve/rt_serve.h"

#define MAX_STOP 4

/* How every response body and --trace line is written: compact, and numbers to 15
 * significant digits (DBL_DIG: a value the client sent with up to 15 digits comes back as it
 * was typed, where jansson's default 17 echoed kv.set's 0.1 as 0.10000000000000001; a
 * computed figure keeps 15 digits, a relative error of at most 5e-15). */
#define SRV_JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(15))

/* The histograms of /metrics, in seconds: X(id, name, help, upper bounds...). The request
 * latencies are vLLM's (vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
 * vllm:e2e_request_latency_seconds, with its bucket bounds) under the kvpc_ prefix;
 * docs/serving.md says what each measures. */
#define SRV_HISTS(X)                                                                         \
	X(SRV_H_STEP, "kvpc_step_seconds", "wall time of one batched step", 0.005, 0.01, 0.025,   \
	  0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)                                                        \
	X(SRV_H_TTFT, "kvpc_time_to_first_token_seconds",                                         \
	  "time from a request's arrival to its first generated token", 0.001, 0.005, 0.01, 0.02, \
	  0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560)  \
	X(SRV_H_ITL, "kvpc_inter_token_latency_seconds",                                          \
	  "time between two consecutive generated tokens of a request", 0.01, 0.025, 0.05, 0.075, \
	  0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)                     \
	X(SRV_H_E2E, "kvpc_e2e_request_latency_seconds",                                          \
	  "time from a request's arrival to its end, of requests that finished (stop or length)", \
	  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, \
	  7680)
#define SRV_HIST_ID(id, ...) id,
enum { SRV_HISTS(SRV_HIST_ID) SRV_N_HISTS };
#undef SRV_HIST_ID
#define SRV_HIST_MAX 24 /* upper bounds of a histogram at most (checked in rt_serve_sched.c) */

typedef struct srv_hist_def {
	const char *name, *help;
	const double *le;            /* [n] upper bounds, increasing (+Inf implied) */
	int n;
} srv_hist_def;

typedef struct srv_hist {
	int64_t count[SRV_HIST_MAX + 1]; /* per bucket (not cumulative); [n]: above the last */
	int64_t n;
	double sum;
} srv_hist;

/* The endpoints requests are counted by (kvpc_requests_total{endpoint}): the route table's
 * rows (rt_serve_http.c) and one for paths not in it. */
#define SRV_N_ENDPOINTS 6

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
	int answered;                /* its 200 is counted (the answer or the stream began) */
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
	double t0, t_first, t_last, t_end; /* arrival, first and latest token, end (rt_now) */
	int64_t compress, evicted, peak_entries, peak_bytes, pinned_kept;
	double policy_s;             /* rt_seq_stats.policy_seconds at the finish */
	int prefill_chunk;           /* the request's prefill schedule (0: token by token) */
	int pf_fixed;                /* 1: the request gave kv.prefill_chunk (no larger chunks) */
	int32_t pf_run;              /* its sequence's prefill chunk (rt_run_set_prefill_chunk) */
	int64_t prompt_steps;        /* steps its prompt took (guarded by S->mu) */
	int chunk_max;               /* prompt tokens one step may offer it (rt_serve_req.c) */
	int64_t kv_bytes;            /* at the end: K/V bytes held (runtime/kv/rt_kvbytes.h) */
	double bytes_x;              /* at the end: compression in bytes against f16 */
	double ratio_used;           /* the sequence's ratio and parameters, kept when it ends */
	unsigned notes;              /* KVP_NOTE_* of the finished sequence (graceful budgets) */
	double min_kv;               /* the floor in force (kvp_ctx.min_kv), tokens */
	int share_tried;             /* its shared prefix was looked up (rt_serve_prefix.c) */
	int no_share;                /* kv.share_prefix false: it never shares its prefix */
	int32_t shared;              /* prompt tokens whose keys and values it shares, 0: none */
	int32_t skipped;             /* prompt tokens it did not prefill: it forked a shared
	                                prefix (rt_serve_prefix.c) */
	double byte_ratio_used;
	double *params;
	pthread_cond_t cv;
	struct req *next_q;
} req;

/* The server. Locking: one mutex (mu) guards the queue, the active set, every request's
 * state and the counters; the scheduler drops it only around the forward step. up_mu guards
 * the uploads list and is taken before mu, never inside it. */
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
	int64_t req_by_status[SRV_N_ENDPOINTS][600];
	int64_t rejected, cancelled, prompt_tokens, gen_tokens, entries_now;
	int64_t kv_bytes_now, f16_bytes_now; /* the active sequences' K/V bytes, as f16 full caches */
	int64_t *compress_by_p, *evicted_by_p;
	/* shared prompt prefixes (rt_serve_prefix.c) */
	struct srv_prefix *pfx;
	int n_pfx, cap_pfx;
	int64_t pfx_shared, pfx_differ;     /* sequences that shared a prefix; that found one
	                                       whose rows differed from theirs */
	int64_t pfx_skipped;                /* prompt tokens not prefilled: forked prefixes */
	int64_t pfx_bytes_now, pfx_saved_now, pfx_seqs_now; /* after a step: the prefixes'
	                                       bytes (counted once in the pool), the bytes the
	                                       sequences sharing them do not hold twice, those
	                                       sequences */
	int64_t pool_used_now, kv_held_now; /* after a step: the pool's bytes in use and the
	                                       active sequences' block bytes (rt_kv_bytes_held,
	                                       each counting its whole lists) */
	srv_hist hist[SRV_N_HISTS];
	double busy_seconds;
};

/* ---- small helpers ----------------------------------------------------------------- */

static inline const struct kvp_policy *policy_at(const srv *S, int i)
{
	return i < S->n_reg ? S->reg[i] : &rt_policy_full;
}

static inline int policy_find(const srv *S, const char *name)
{
	for (int i = 0; i < S->n_reg; i++)
		if (!strcmp(S->reg[i]->name, name))
			return i;
	return !strcmp(name, "full") ? S->n_reg : -1;
}

static inline int buf_add(char **b, size_t *len, size_t *cap, const char *s, size_t n)
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

/* A JSON string of s[0..n): invalid UTF-8 bytes become U+FFFD. */
static inline json_t *json_text(const char *s, size_t n)
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

/* ---- across the files ---------------------------------------------------------------- */

/* A request's validation error: the HTTP status, the field (OpenAI's "param"), the text. */
typedef struct verr {
	int status;
	char param[64];
	char msg[640];
} verr;

/* rt_serve_req.c: the whole request body into r (r->chat, r->id and r->S set by the caller):
 * prompt, limits, sampler, stop strings, the "kv" extension with r's new sequence, the
 * footprint. 0, or -1 with e (what r holds is freed by srv_req_free). */
int srv_parse_request(srv *S, req *r, const char *body, size_t len, verr *e);

/* rt_serve_sched.c */
extern const srv_hist_def srv_hists[SRV_N_HISTS];
/* Count one observation of `seconds` in histogram h (SRV_HISTS' ids) of S (S->mu held). */
void srv_hist_observe(srv *S, int h, double seconds);
/* Free r and everything it owns (its live sequence's blocks back to the pool, its prompt,
 * stop strings, output, SSE buffer); S->live drops by one. Only srv_req_unref calls it
 * when the last reference goes. */
void srv_req_free(req *r);
void srv_req_unref(req *r);    /* drop one reference (S->mu held) */
/* OpenAI's "usage" object of r (prompt, completion, total tokens); the caller owns it. */
json_t *srv_usage_obj(const req *r);
/* The "kv" extension of r's response or trace line: its policy, ratios, parameters and
 * the KV figures (docs/serving.md, "Responses"), from the live sequence or, once r
 * finished, from what req_finish kept; the caller owns it (S->mu held). */
json_t *srv_kv_obj(const srv *S, const req *r);
/* A response object's common fields (id, object = `object`, created, model); the caller
 * owns it. */
json_t *srv_base_obj(const srv *S, const req *r, const char *object);
/* The HTTP status of runtime error e by its code: input 400, resource 503, else 500. */
int srv_err_status(const rt_err *e);
void *srv_scheduler(void *arg); /* the scheduler thread (arg: the srv) */

/* rt_serve_prefix.c (S->mu held, the scheduler thread) */
int64_t srv_prefix_discount(const srv *S, const req *r); /* footprint bytes r would not
                                        need now: a prefix it could fork, counted once */
int srv_prefix_start(srv *S, req *r); /* before r's first prompt chunk: fork a prefix (r
                                        skips its prefill); 1: r waits, an earlier request
                                        is computing the prefix it would fork */
void srv_prefix_step(srv *S, req *r); /* after a step that fed r's prompt: share its prefix */
void srv_prefix_sweep(srv *S);        /* drop prefixes no list shares; the pool gauges */
void srv_prefix_free(srv *S);         /* drop every prefix and the registry (at shutdown,
                                        after the sequences are freed) */

/* rt_serve_http.c */
/* libmicrohttpd's access handler (MHD_AccessHandlerCallback; cls the srv): collects a POST
 * body (413 past the limit), checks the API key (401), then dispatches on the route table
 * (404 unknown path, 405 wrong method). */
enum MHD_Result srv_handler(void *cls, struct MHD_Connection *c, const char *url,
                            const char *method, const char *version, const char *upload,
                            size_t *upload_size, void **con_cls);
/* libmicrohttpd's completion callback (MHD_RequestCompletedCallback): frees the
 * connection's state and takes it off the list of incomplete uploads. */
void srv_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                   enum MHD_RequestTerminationCode toe);
/* Answer 408 to requests whose body has stalled for --timeout seconds and shut
 * them down (rt_serve_http.c says why); the main thread calls it every 100 ms. */
void srv_upload_sweep(srv *S);

#endif
