/*
 * rt_seq: one sequence under one policy — chunk planning, the forward's append and
 * observe hooks bridged to the policy ABI, compression, the compacted position
 * convention's re-rotation, and the memory/time counters; see rt_seq.h.
 */
#include "rt_seq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the built-in full-cache policy ----------------------------------------------------- */

static int full_should_compress(const struct kvp_ctx *ctx, const rt_kv *kv)
{
	(void)ctx;
	(void)kv;
	return 0;
}

/* The room of the store: min over heads of cap - n (a policy that never runs). */
static int32_t full_next_trigger(const struct kvp_ctx *ctx, const rt_kv *kv)
{
	(void)ctx;
	int32_t room = kv->cap;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		if (kv->cap - kv->heads[i].n < room)
			room = kv->cap - kv->heads[i].n;
	return room;
}

const struct kvp_policy rt_policy_full = {
	.abi_version = KVP_ABI_VERSION,
	.name = "full",
	.source = "(built in)",
	.source_hash = "0000000000000000",
	.summary = "Full cache: every token is kept (the exact reference).",
	.n_params = 0,
	.params = NULL,
	.positions = KVP_POS_ORIGINAL,
	.needs = 0,
	.should_compress = full_should_compress,
	.next_trigger = full_next_trigger,
};

/* ---- hooks from the forward ------------------------------------------------------------ */

static void seq_on_append(void *user, int layer, int kv_head, int32_t first, int32_t n)
{
	rt_seq *s = user;
	if (s->rot_idx) {
		const rt_kv_head *h = rt_kv_head_at(&s->kv, layer, kv_head);
		int32_t *ri = s->rot_idx +
		              (size_t)(layer * s->kv.n_kv_head + kv_head) * (size_t)s->m->hp.n_ctx;
		for (int32_t i = first; i < first + n; i++)
			ri[h->pos[i]] = i;
	}
	if (s->p->init_entries) {
		double t0 = rt_now();
		s->p->init_entries(&s->run.ctx, &s->kv, layer, kv_head, first, n);
		s->hook_seconds += rt_now() - t0;
	}
}

static void seq_observe(void *user, const rt_attn_view *v)
{
	rt_seq *s = user;
	const struct kvp_obs ob = {
		.step = v->pos,
		.n = v->n_entries,
		.group = v->group,
		.probs = (s->p->needs & KVP_NEED_ATTN) ? v->probs : NULL,
		.out = (s->p->needs & KVP_NEED_OUT) ? v->out : NULL,
	};
	double t0 = rt_now();
	s->p->observe(&s->run.ctx, &s->kv, v->layer, v->kv_head, &ob);
	s->hook_seconds += rt_now() - t0;
}

/* ---- compacted positions ----------------------------------------------------------------- */

/* After a compress under KVP_POS_COMPACTED: turn every kept key from the index it was
 * rotated at to its current index i (delta = i - old), so entry i sits at rotation i. */
static void seq_rerotate(rt_seq *s)
{
	const rt_model_hparams *hp = &s->m->hp;
	const int n_rot = hp->n_rot, d = hp->head_dim;
	const int H = s->kv.n_layer * s->kv.n_kv_head;
	double cached = 0; /* delta the cos/sin table holds (0: none) */
	for (int hi = 0; hi < H; hi++) {
		rt_kv_head *h = &s->kv.heads[hi];
		int32_t *ri = s->rot_idx + (size_t)hi * (size_t)hp->n_ctx;
		for (int32_t i = 0; i < h->n; i++) {
			int32_t old = ri[h->pos[i]];
			RT_ASSERT(old >= i);
			ri[h->pos[i]] = i;
			if (old == i)
				continue;
			double delta = (double)i - (double)old;
			if (delta != cached) {
				for (int p = 0; p < n_rot / 2; p++) {
					s->rot_cs[2 * p] = cos(delta * s->rot_freq[p]);
					s->rot_cs[2 * p + 1] = sin(delta * s->rot_freq[p]);
				}
				cached = delta;
			}
			float *k = h->k + (size_t)i * d;
			for (int p = 0; p < n_rot / 2; p++) {
				double co = s->rot_cs[2 * p], si = s->rot_cs[2 * p + 1];
				double x0 = k[2 * p], x1 = k[2 * p + 1];
				k[2 * p] = (float)(x0 * co - x1 * si);
				k[2 * p + 1] = (float)(x0 * si + x1 * co);
			}
		}
	}
}

/* ---- lifecycle ----------------------------------------------------------------------- */

int rt_seq_init(rt_seq *s, const rt_model *m, const struct kvp_policy *p, int32_t cap,
                int max_chunk, int64_t prompt_len, rt_err *err)
{
	memset(s, 0, sizeof *s);
	const rt_model_hparams *hp = &m->hp;
	if (cap < 1 || max_chunk < 1 || max_chunk > 65536)
		return rt_err_set(err, "%s: sequence: invalid capacity %d or chunk %d", m->path, (int)cap,
		                  max_chunk);
	if (kvp_run_init(&s->run, &s->kv, p, hp->n_layer, hp->n_head_kv, hp->group, hp->head_dim,
	                 cap, prompt_len, err) != 0)
		return -1;
	s->m = m;
	s->p = p;
	s->cap = cap;
	s->max_chunk = max_chunk;
	if (rt_fwd_init(&s->fwd, m, max_chunk, cap, err) != 0) {
		rt_seq_free(s);
		return -1;
	}
	if (p->positions == KVP_POS_COMPACTED) {
		size_t n = (size_t)hp->n_layer * hp->n_head_kv * (size_t)hp->n_ctx;
		s->rot_idx = malloc(n * sizeof *s->rot_idx);
		s->rot_freq = malloc((size_t)(hp->n_rot / 2 + 1) * sizeof *s->rot_freq);
		s->rot_cs = malloc((size_t)(hp->n_rot + 1) * sizeof *s->rot_cs);
		if (!s->rot_idx || !s->rot_freq || !s->rot_cs) {
			rt_seq_free(s);
			return rt_err_set(err, "%s: sequence: cannot allocate %zu bytes of position map",
			                  m->path, n * sizeof(int32_t));
		}
		for (int p = 0; p < hp->n_rot / 2; p++)
			s->rot_freq[p] = pow((double)hp->rope_base, -2.0 * p / hp->n_rot);
		s->fwd.rope_at_index = 1;
	}
	s->fwd.on_append = (p->init_entries || s->rot_idx) ? seq_on_append : NULL;
	s->fwd.append_user = s;
	s->fwd.observe = p->observe ? seq_observe : NULL;
	s->fwd.observe_user = s;
	return 0;
}

void rt_seq_free(rt_seq *s)
{
	if (s->p)
		kvp_run_free(&s->run);
	rt_kv_free(&s->kv);
	rt_fwd_free(&s->fwd);
	free(s->rot_idx);
	free(s->rot_freq);
	free(s->rot_cs);
	memset(s, 0, sizeof *s);
}

void rt_seq_reset(rt_seq *s, int64_t prompt_len)
{
	kvp_run_reset(&s->run, &s->kv, prompt_len);
	memset(&s->st, 0, sizeof s->st);
	s->hook_seconds = 0;
}

int rt_seq_set(rt_seq *s, const char *assign, rt_err *err)
{
	return kvp_run_set(&s->run, assign, err);
}

int rt_seq_set_ratio(rt_seq *s, double R, rt_err *err)
{
	return kvp_run_set_ratio(&s->run, R, err);
}

int64_t rt_seq_seen(const rt_seq *s)
{
	return s->run.ctx.seen;
}

double rt_seq_mean_entries(const rt_seq *s)
{
	return (double)rt_kv_entries(&s->kv) / ((double)s->kv.n_layer * s->kv.n_kv_head);
}

rt_seq_stats rt_seq_stats_get(const rt_seq *s)
{
	rt_seq_stats st = s->st;
	st.compress_events = s->run.compressions;
	st.policy_seconds = s->run.policy_seconds + s->hook_seconds;
	return st;
}

/* ---- feeding ------------------------------------------------------------------------- */

int rt_seq_feed(rt_seq *s, const int32_t *tokens, int64_t n, float *logits,
                enum rt_logits_mode mode, rt_err *err)
{
	const int V = s->m->hp.n_vocab;
	if (n < 0)
		return rt_err_set(err, "%s: sequence: negative token count", s->m->path);
	if (mode != RT_LOGITS_NONE && !logits)
		return rt_err_set(err, "%s: sequence: logits requested without a buffer", s->m->path);
	double t0 = rt_now();
	for (int64_t done = 0; done < n;) {
		int32_t want = n - done < s->max_chunk ? (int32_t)(n - done) : s->max_chunk;
		int32_t k = kvp_run_chunk(&s->run, &s->kv, want);
		if (k == 0)
			return rt_err_set(err,
			                  "policy %s: KV cache full at token %lld: the store holds %d "
			                  "entries per head and the policy frees none (budget above "
			                  "the capacity?)",
			                  s->p->name, (long long)s->run.ctx.seen, (int)s->cap);
		float *lg = NULL;
		enum rt_logits_mode md = RT_LOGITS_NONE;
		if (mode == RT_LOGITS_ALL) {
			lg = logits + (size_t)done * V;
			md = RT_LOGITS_ALL;
		} else if (mode == RT_LOGITS_LAST && done + k == n) {
			lg = logits;
			md = RT_LOGITS_LAST;
		}
		if (rt_model_forward(&s->fwd, &s->kv, tokens + done, k, (int32_t)s->run.ctx.seen, lg, md,
		                     err) != 0)
			return -1;
		s->st.chunks++;
		int64_t e = rt_kv_entries(&s->kv);
		if (e > s->st.kv_entries_peak) {
			s->st.kv_entries_peak = e;
			s->st.kv_bytes_peak = rt_kv_bytes_used(&s->kv);
		}
		int rc = kvp_run_advance(&s->run, &s->kv, k, err);
		if (rc < 0)
			return -1;
		if (rc == 1 && s->rot_idx) {
			double t1 = rt_now();
			seq_rerotate(s);
			s->hook_seconds += rt_now() - t1;
		}
		done += k;
		s->st.tokens += k;
	}
	s->st.seconds += rt_now() - t0;
	return 0;
}
