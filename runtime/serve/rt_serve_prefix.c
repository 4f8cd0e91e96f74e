/*
 * rt_serve_prefix: shared prompt prefixes (docs/serving.md, "Shared prefixes"). A request's
 * shareable prefix is the leading run of its prompt's protected tokens (a chat's system
 * turn, a completion's leading protected segments), cut down to whole sharing units
 * (rt_kv_prefix_unit). Once a sequence has prefilled it, the first sequence with those tokens
 * makes a shared prefix of its rows (rt_kv_prefix_make) and every later one whose rows are
 * byte for byte the same maps it (rt_kv_prefix_attach), so the pool holds the prefix's keys
 * and values once (runtime/kv/rt_kv.h, "Shared prefixes"). The registry keeps a prefix while
 * a list shares it. Scheduler thread only; S->mu is held.
 */
#include "serve/rt_serve_int.h"

struct srv_prefix {
	int32_t *tok;            /* [n] the prompt tokens it holds */
	int32_t n;
	rt_kv_prefix *px;
};

/* Whether r's policy may share: one that never compresses, or one that keeps protected
 * spans (and so may leave the prefix as it is) and writes rows only through the store's
 * guarded calls: not GraceKV's f32 rewrites, not tiers, not the compacted convention's
 * re-rotation (runtime/kv/rt_kv.h, "Shared prefixes"). */
static int policy_shares(const struct kvp_policy *p)
{
	if (!p->compress)
		return 1;
	return (p->needs & KVP_NEED_SPANS) && !(p->needs & (KVP_NEED_F32_KV | KVP_NEED_TIERS)) &&
	       p->positions == KVP_POS_ORIGINAL;
}

/* Entries per list r may share: its leading run of protected prompt tokens in whole units. */
static int32_t share_len(const srv *S, const req *r)
{
	if (!S->cfg->share_prefix || r->no_share || !policy_shares(policy_at(S, r->pi)))
		return 0;
	const int32_t u = rt_kv_prefix_unit(&r->seq.kv);
	int64_t run = 0;
	while (run < r->n_prompt && r->span[run] != 0)
		run++;
	return u ? (int32_t)(run / u * u) : 0;
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
		if (f->n != n || memcmp(f->tok, r->prompt, (size_t)n * sizeof *f->tok))
			continue;
		int rc = rt_kv_prefix_attach(&r->seq.kv, f->px, &err);
		if (rc == 1) {
			r->shared = n;
			S->pfx_shared++;
		} else {
			S->pfx_differ += rc == 0; /* the rows differ: it keeps its own */
		}
		return;
	}
	if (S->n_pfx == S->cap_pfx) {
		int nc = S->cap_pfx ? 2 * S->cap_pfx : 8;
		struct srv_prefix *np = realloc(S->pfx, (size_t)nc * sizeof *np);
		if (!np)
			return;
		S->pfx = np, S->cap_pfx = nc;
	}
	int32_t *tok = malloc((size_t)n * sizeof *tok);
	rt_kv_prefix *px = tok ? rt_kv_prefix_make(&r->seq.kv, n, &err) : NULL;
	if (!px) {
		free(tok);
		return; /* no room for a memory file: the sequence keeps its own rows */
	}
	memcpy(tok, r->prompt, (size_t)n * sizeof *tok);
	S->pfx[S->n_pfx++] = (struct srv_prefix){ tok, n, px };
	r->shared = n;
	S->pfx_shared++;
}

void srv_prefix_sweep(srv *S)
{
	int64_t bytes = 0, saved = 0, seqs = 0;
	for (int i = 0; i < S->n_pfx;) {
		struct srv_prefix *f = &S->pfx[i];
		const int64_t lists = rt_kv_prefix_lists(f->px);
		if (lists == 0) {
			rt_kv_prefix_unref(f->px);
			free(f->tok);
			S->pfx[i] = S->pfx[--S->n_pfx];
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
	for (int i = 0; i < S->n_pfx; i++) {
		rt_kv_prefix_unref(S->pfx[i].px);
		free(S->pfx[i].tok);
	}
	free(S->pfx);
	S->pfx = NULL;
	S->n_pfx = S->cap_pfx = 0;
}
