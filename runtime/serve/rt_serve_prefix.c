/*
 * rt_serve_prefix: shared prompt prefixes and prefix caching (docs/serving.md, "Shared
 * prefixes and prefix caching"). A request's prefix is the leading run of its prompt's
 * protected tokens (a chat's system turn, a completion's leading protected segments), short
 * of the prompt's last token, cut down to whole sharing units (rt_kv_prefix_unit), under a
 * policy that may share. After the step in which a sequence's prompt passed it, the first
 * sequence with those tokens makes a shared prefix of its rows (rt_kv_prefix_make), which
 * also keeps the rest of its store and its state at that point (rt_seq_mark_get: a prompt
 * chunk stays within one span, so that point is at most the protected run's end). A later
 * request with the same tokens (and spans) up to that point, policy and settings starts
 * there (rt_seq_fork): it skips their prefill and maps the rows; it waits while an earlier
 * request is still computing the prefix it would fork. A sequence that computed the prefix
 * itself (it started before one existed) maps it afterwards when its rows are byte for byte
 * the same (rt_kv_prefix_attach). The pool holds the prefix's keys and values once
 * (runtime/kv/rt_kv.h, "Shared prefixes"), and admission reserves them once for the full
 * cache (share_saves). The registry keeps a prefix while a list shares it. Scheduler thread
 * only; S->mu is held.
 */
#include "serve/rt_serve_int.h"

/* What a sequence's state at the end of its prefix depends on besides the tokens: its
 * policy and, for a compressing policy, its settings and prompt length (its budgets, and so
 * its triggers and prompt chunks before the prefix's end, follow them). */
struct start_key {
	int pi;
	int64_t prompt_len;
	double ratio, byte_ratio, min_kv;
	int32_t pf_run;
	const double *params;    /* [the policy's n_params] */
};

struct srv_prefix {
	int32_t n;               /* prompt tokens whose rows it shares */
	int32_t m;               /* prompt tokens its maker had fed when it was made (>= n) */
	int32_t *tok;            /* [m] their tokens */
	uint8_t *span;           /* [m] their span ids */
	rt_kv_prefix *px;
	struct start_key key;    /* its maker's (key.params: a copy it owns) */
	int forkable;            /* 1: every list held the m entries, mk is the state there */
	rt_seq_mark mk;
};

static struct start_key key_of(const req *r)
{
	const struct rt_run *run = &r->seq.run;
	return (struct start_key){ .pi = r->pi, .prompt_len = run->ctx.prompt_len,
		                   .ratio = run->ctx.ratio, .byte_ratio = run->ctx.byte_ratio,
		                   .min_kv = run->ctx.min_kv, .pf_run = r->pf_run,
		                   .params = run->params };
}

static int key_eq(const srv *S, const struct start_key *a, const struct start_key *b)
{
	const struct kvp_policy *p = policy_at(S, a->pi);
	return a->pi == b->pi &&
	       (!p->compress ||
	        (a->prompt_len == b->prompt_len && a->ratio == b->ratio &&
	         a->byte_ratio == b->byte_ratio && a->min_kv == b->min_kv && a->pf_run == b->pf_run &&
	         (p->n_params == 0 ||
	          !memcmp(a->params, b->params, (size_t)p->n_params * sizeof *a->params))));
}

/* Whether r's policy may share: one that never compresses, or one that keeps protected
 * spans (and so may leave the prefix as it is) and writes rows only through the store's
 * guarded calls: not GraceKV's f32 rewrites, not tiers, not the compacted convention's
 * re-rotation (runtime/kv/rt_kv.h, "Shared prefixes"); not the context replay either, which
 * reads the prompt's tokens again as the sequence was fed them (runtime/policy/rt_replay.h),
 * and a shared prefix is not fed. */
static int policy_shares(const struct kvp_policy *p)
{
	if (!p->compress)
		return 1;
	return (p->needs & KVP_NEED_SPANS) &&
	       !(p->needs & (KVP_NEED_F32_KV | KVP_NEED_TIERS | KVP_NEED_REPLAY)) &&
	       p->positions == KVP_POS_ORIGINAL;
}

/* Entries per list r's prompt could share (whatever the switches). */
static int32_t prefix_len(const srv *S, const req *r)
{
	if (!r->seq_live || !policy_shares(policy_at(S, r->pi)))
		return 0;
	const int32_t u = rt_kv_prefix_unit(&r->seq.kv);
	int64_t run = 0;
	while (run < r->n_prompt - 1 && r->span[run] != 0)
		run++;
	return u ? (int32_t)(run / u * u) : 0;
}

/* Entries per list r may share: its prefix, unless sharing is off for it. */
static int32_t share_len(const srv *S, const req *r)
{
	return S->cfg->share_prefix && !r->no_share ? prefix_len(S, r) : 0;
}

/* Whether r may share f's rows: the same n tokens, policy and settings. */
static int same_rows(const srv *S, const struct srv_prefix *f, const req *r, int32_t n)
{
	const struct start_key k = key_of(r);
	return f->n == n && !memcmp(f->tok, r->prompt, (size_t)n * sizeof *f->tok) &&
	       key_eq(S, &f->key, &k);
}

/* Whether r's sequence may start where f's maker stood: it shares f's rows, and its prompt
 * goes on past f's m tokens, which are f's, with f's spans. */
static int same_start(const srv *S, const struct srv_prefix *f, const req *r, int32_t n)
{
	return f->forkable && r->n_prompt > f->m && same_rows(S, f, r, n) &&
	       !memcmp(f->tok, r->prompt, (size_t)f->m * sizeof *f->tok) &&
	       !memcmp(f->span, r->span, (size_t)f->m);
}

/* Whether q computes the prefix of n tokens that r would start from. */
static int same_prefix(const srv *S, const req *q, const req *r, int32_t n)
{
	const struct start_key a = key_of(q), b = key_of(r);
	return share_len(S, q) == n && !memcmp(q->prompt, r->prompt, (size_t)n * sizeof *r->prompt) &&
	       key_eq(S, &a, &b);
}

/* The registry's forkable prefix r may start from, or NULL. */
static struct srv_prefix *fork_source(const srv *S, const req *r, int32_t n)
{
	for (int i = 0; i < S->n_pfx; i++)
		if (rt_kv_prefix_lists(S->pfx[i].px) > 0 && same_start(S, &S->pfx[i], r, n) &&
		    rt_kv_prefix_forkable(&r->seq.kv, S->pfx[i].px))
			return &S->pfx[i];
	return NULL;
}

/* Pool bytes r no longer needs of its footprint once it shares a prefix of px: the prefix's
 * rows, under a policy that never compresses (so never copies them back: the registry
 * reserves them once); 0 under any other. */
static int64_t share_saves(const srv *S, const req *r, const rt_kv_prefix *px)
{
	return policy_at(S, r->pi)->compress ? 0 : rt_kv_prefix_bytes(px);
}

int64_t srv_prefix_discount(const srv *S, const req *r)
{
	const int32_t n = r->fed == 0 && !r->share_tried ? share_len(S, r) : 0;
	const struct srv_prefix *f = n ? fork_source(S, r, n) : NULL;
	return f ? share_saves(S, r, f->px) : 0;
}

/* r shares px now: the counters, and the footprint it no longer needs. */
static void shares(srv *S, req *r, const rt_kv_prefix *px, int32_t n)
{
	const int64_t saved = share_saves(S, r, px);
	r->shared = n;
	r->footprint -= saved;
	S->reserved -= saved;
	S->pfx_shared++;
}

int srv_prefix_start(srv *S, req *r)
{
	if (r->share_tried || r->fed != 0)
		return 0;
	const int32_t n = share_len(S, r);
	if (n == 0)
		return 0;
	struct srv_prefix *f = fork_source(S, r, n);
	if (f) {
		rt_err err = { "" };
		if (rt_seq_fork(&r->seq, f->px, &f->mk, &err) == 1) {
			r->share_tried = 1;
			r->fed = f->m;
			r->skipped = f->m;
			r->compress = rt_seq_stats_get(&r->seq).compress_events;
			S->pfx_skipped += f->m;
			shares(S, r, f->px, n);
		}
		return 0; /* forked, or it computes the prefix itself */
	}
	/* an earlier request computing this prefix will make one r can fork: wait for it */
	for (int i = 0; i < S->n_active && S->active[i] != r; i++) {
		const req *q = S->active[i];
		if (q->seq_live && !q->cancelled && !q->share_tried && q->fed < n &&
		    same_prefix(S, q, r, n))
			return 1;
	}
	return 0;
}

/* Add a prefix made by r (n tokens' rows, at r->fed tokens fed) to the registry; 0, or -1
 * when it cannot (r keeps its own rows). */
static int registry_add(srv *S, req *r, int32_t n)
{
	if (S->n_pfx == S->cap_pfx) {
		int nc = S->cap_pfx ? 2 * S->cap_pfx : 8;
		struct srv_prefix *np = realloc(S->pfx, (size_t)nc * sizeof *np);
		if (!np)
			return -1;
		S->pfx = np, S->cap_pfx = nc;
	}
	const struct kvp_policy *p = policy_at(S, r->pi);
	const int32_t m = (int32_t)r->fed;
	rt_err err = { "" };
	int32_t *tok = malloc((size_t)m * sizeof *tok);
	uint8_t *span = malloc((size_t)m);
	double *pv = malloc((size_t)(p->n_params + 1) * sizeof *pv);
	rt_kv_prefix *px = tok && span && pv ? rt_kv_prefix_make(&r->seq.kv, n, &err) : NULL;
	if (!px) {
		free(tok);
		free(span);
		free(pv);
		return -1; /* no room for a memory file: the sequence keeps its own rows */
	}
	memcpy(tok, r->prompt, (size_t)m * sizeof *tok);
	memcpy(span, r->span, (size_t)m);
	if (p->n_params > 0)
		memcpy(pv, r->seq.run.params, (size_t)p->n_params * sizeof *pv);
	struct start_key key = key_of(r);
	key.params = pv;
	S->pfx[S->n_pfx++] = (struct srv_prefix){
		.n = n, .m = m, .tok = tok, .span = span, .px = px, .key = key,
		.forkable = rt_kv_prefix_fork_len(px) == m, .mk = rt_seq_mark_get(&r->seq) };
	S->reserved += rt_kv_prefix_bytes(px); /* the registry reserves the rows once */
	return 0;
}

void srv_prefix_step(srv *S, req *r)
{
	if (r->share_tried || !r->seq_live)
		return;
	const int32_t n = share_len(S, r);
	if (n == 0) {
		r->share_tried = 1;
		return;
	}
	if (r->fed < n)
		return;
	r->share_tried = 1;
	rt_err err = { "" };
	for (int i = 0; i < S->n_pfx; i++) {
		struct srv_prefix *f = &S->pfx[i];
		if (!same_rows(S, f, r, n))
			continue;
		int rc = rt_kv_prefix_attach(&r->seq.kv, f->px, &err);
		if (rc == 1)
			shares(S, r, f->px, n);
		else
			S->pfx_differ += rc == 0; /* the rows differ: it keeps its own */
		return;
	}
	if (registry_add(S, r, n) == 0)
		shares(S, r, S->pfx[S->n_pfx - 1].px, n);
}

static void registry_drop(srv *S, int i)
{
	struct srv_prefix *f = &S->pfx[i];
	S->reserved -= rt_kv_prefix_bytes(f->px);
	rt_kv_prefix_unref(f->px);
	free(f->tok);
	free(f->span);
	free((double *)f->key.params);
	S->pfx[i] = S->pfx[--S->n_pfx];
}

void srv_prefix_sweep(srv *S)
{
	int64_t bytes = 0, saved = 0, seqs = 0;
	for (int i = 0; i < S->n_pfx;) {
		struct srv_prefix *f = &S->pfx[i];
		const int64_t lists = rt_kv_prefix_lists(f->px);
		if (lists == 0) {
			registry_drop(S, i);
			continue;
		}
		const int64_t b = rt_kv_prefix_bytes(f->px);
		bytes += b;
		saved += lists * (b / S->H) - b;
		i++;
	}
	int64_t held = 0;
	for (int i = 0; i < S->n_active; i++) {
		if (!S->active[i]->seq_live)
			continue;
		seqs += rt_kv_shared_lists(&S->active[i]->seq.kv) > 0;
		held += rt_kv_bytes_held(&S->active[i]->seq.kv);
	}
	/* one snapshot: the pool's figure and the sequences' own, taken together */
	S->kv_held_now = held;
	S->pool_used_now = rt_kvpool_get(rt_kvpool_process()).used;
	S->pfx_bytes_now = bytes;
	S->pfx_saved_now = saved;
	S->pfx_seqs_now = seqs;
}

void srv_prefix_free(srv *S)
{
	while (S->n_pfx > 0)
		registry_drop(S, S->n_pfx - 1);
	free(S->pfx);
	S->pfx = NULL;
	S->n_pfx = S->cap_pfx = 0;
}
