/*
 * rt_serve: startup and drain of the OpenAI-compatible server (rt_serve.h): load the model,
 * start the scheduler thread (rt_serve_sched.c) and libmicrohttpd (rt_serve_http.c), sweep
 * stalled uploads, and on SIGTERM/SIGINT drain. rt_serve_int.h says how the files divide.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kv/rt_kvpool.h"
#include "model/rt_chat.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "serve/rt_serve_int.h"

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
	/* the least any request holds: one block per (layer, KV head) list at the smallest
	 * store type (a policy's statistics and tiers only add to it; q8_0 needs a head_dim
	 * that is a multiple of 32, else f16 is the smallest); a pool below it could admit
	 * nothing */
	size_t row = rt_kv_row_bytes(RT_KV_Q8_0, S->m->hp.head_dim);
	if (row == 0)
		row = rt_kv_row_bytes(RT_KV_F16, S->m->hp.head_dim);
	const int64_t least = (int64_t)S->H * RT_KV_BLOCK * 2 * (int64_t)row;
	if (c->kv_memory < least)
		return rt_err_set(err, "--kv-memory %lld bytes cannot hold one KV block per list "
		                  "(%d layers x %d KV heads x %d entries of key and value, at least "
		                  "%lld bytes): no request could be admitted", (long long)c->kv_memory,
		                  S->m->hp.n_layer, S->m->hp.n_head_kv, RT_KV_BLOCK, (long long)least);
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
	srv_prefix_free(S);
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
	if (pthread_create(&th, NULL, srv_scheduler, S) != 0) {
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
	                     (uint16_t)cfg->port, NULL, NULL, srv_handler, S, MHD_OPTION_SOCK_ADDR, &addr,
	                     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s + 1,
	                     MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_seqs + cfg->queue + 64),
	                     MHD_OPTION_NOTIFY_COMPLETED, srv_completed, S, MHD_OPTION_END);
	if (!d) {
		fprintf(stderr, "%s: serve: cannot listen on %s:%d: %s\n", cfg->prog, cfg->host,
		        cfg->port, strerror(errno));
		goto out;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	fprintf(stderr, "%s: serve: listening on http://%s:%u (model %s, KV pool %lld bytes)\n",
	        cfg->prog, cfg->host, di ? (unsigned)di->port : (unsigned)cfg->port, S->model_id,
	        (long long)cfg->kv_memory);
	char note[512];
	if (rt_chat_guess_note(S->tk, note, sizeof note))
		fprintf(stderr, "%s: serve: note: %s (/v1/chat/completions)\n", cfg->prog, note);
	fflush(stderr);
	int sig = -1;
	const struct timespec tick = { 0, 100 * 1000 * 1000 };
	while (sig < 0) {
		srv_upload_sweep(S);
		sig = sigtimedwait(&sigs, NULL, &tick);
	}
	fprintf(stderr, "%s: serve: signal %d: draining\n", cfg->prog, sig);
	pthread_mutex_lock(&S->mu);
	S->draining = 1;
	while (S->n_active || S->n_queued) {
		pthread_mutex_unlock(&S->mu);
		srv_upload_sweep(S);
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
