/*
 * rt_seq: one sequence under one policy — chunk planning, the forward's append and
 * observe hooks bridged to the policy ABI, compression, the compacted position
 * convention's re-rotation, and the memory/time counters; see rt_seq.h.
 */
#include "policy/rt_seq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_rope.h"
#include "kv/rt_kvbytes.h"
#include "policy/rt_pick.h"

/* ---- hooks from the forward ------------------------------------------------------------ */

static void seq_on_append(void *user, int layer, int kv_head, int32_t first, int32_t n,
                          const float *xn)
{
	rt_seq *s = user;
	if (s->span.cur || s->span.range_id) {
		rt_kv_head *h = rt_kv_head_at(&s->kv, layer, kv_head);
		for (int32_t i = first; i < first + n; i++)
			h->span[i] = rt_span_mark_at(s->span, h->pos[i]);
	}
	if (s->rot_idx) {
		const rt_kv_head *h = rt_kv_head_at(&s->kv, layer, kv_head);
		int32_t *ri = s->rot_idx +
		              (size_t)(layer * s->kv.n_kv_head + kv_head) * (size_t)s->m->hp.n_ctx;
		for (int32_t i = first; i < first + n; i++)
			ri[h->pos[i]] = i;
	}
	if (s->p->init_entries) {
		double t0 = rt_now();
		s->run.ctx.layer_in = xn; /* linear_score(): KVP_NEED_HIDDEN */
		s->p->init_entries(&s->run.ctx, &s->kv, layer, kv_head, first, n);
		s->run.ctx.layer_in = NULL;
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
		.query = (s->p->needs & KVP_NEED_QUERY) ? v->query : NULL,
	};
	double t0 = rt_now();
	s->p->observe(&s->run.ctx, &s->kv, v->layer, v->kv_head, &ob);
	s->obs_seconds[v->kv_head] += rt_now() - t0;
}

/* ---- the prompt trace (KVP_NEED_TRACE) ---------------------------------------------- */

/* Records, for prompt positions, the RMS-normalised residual stream and the queries of the
 * sampled layers, and every layer's queries of the prompt tail (struct kvp_trace). */
static void seq_on_layer(void *user, int layer, int C, int32_t pos0, const float *x,
                         const float *q)
{
	rt_seq *s = user;
	struct kvp_trace *t = &s->tr;
	const int64_t lim = s->run.ctx.prompt_len < t->cap ? s->run.ctx.prompt_len : t->cap;
	const int E = t->n_embd;
	const size_t qd = (size_t)t->n_head * t->head_dim;
	for (int r = 0; r < C; r++) {
		const int64_t p = (int64_t)pos0 + r;
		if (p >= lim)
			break;
		const float *xr = x + (size_t)r * E, *qr = q + (size_t)r * qd;
		for (int si = 0; si < t->n_sample; si++) { /* a small model may sample a layer twice */
			if (t->sample_layer[si] != layer)
				continue;
			double ss = 0;
			for (int i = 0; i < E; i++)
				ss += (double)xr[i] * xr[i];
			const float inv = (float)(1.0 / sqrt(ss / E + 1e-30));
			float *h = (float *)t->hid + ((size_t)si * t->cap + (size_t)p) * E;
			for (int i = 0; i < E; i++)
				h[i] = xr[i] * inv;
			memcpy((float *)t->q + ((size_t)si * t->cap + (size_t)p) * qd, qr,
			       qd * sizeof(float));
		}
		if (p >= t->tail_start && p < t->tail_start + KVP_TRACE_TAIL)
			memcpy((float *)t->q_tail +
			               ((size_t)layer * KVP_TRACE_TAIL + (size_t)(p - t->tail_start)) * qd,
			       qr, qd * sizeof(float));
	}
}

/* log Σ exp(row[i]) over n values, in double */
static double row_lse(const float *row, int n)
{
	float mx = row[0];
	for (int i = 1; i < n; i++)
		mx = row[i] > mx ? row[i] : mx;
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += exp((double)row[i] - mx);
	return (double)mx + log(sum);
}

/* After a chunk of C tokens at positions seen..seen+C-1 whose logits rows are lg
 * ([C × n_vocab]): the surprisal of every prompt token the rows (or the previous chunk's
 * last row) predict, and the recorded-positions count. */
static void trace_chunk(rt_seq *s, const int32_t *tok, int C, const float *lg)
{
	struct kvp_trace *t = &s->tr;
	const int V = s->m->hp.n_vocab;
	const int64_t seen = s->run.ctx.seen, pl = s->run.ctx.prompt_len;
	const int64_t lim = pl < t->cap ? pl : t->cap;
	float *sur = (float *)t->surprisal;
	if (seen >= lim)
		return;
	RT_ASSERT(lg);
	if (seen == 0)
		sur[0] = 0;
	else if (s->tr_prev_lse > -1e300)
		sur[seen] = (float)(s->tr_prev_lse - s->tr_prev[tok[0]]);
	for (int r = 1; r < C && seen + r < lim; r++) {
		const float *row = lg + (size_t)(r - 1) * V;
		sur[seen + r] = (float)(row_lse(row, V) - row[tok[r]]);
	}
	if (seen + C < lim) {
		memcpy(s->tr_prev, lg + (size_t)(C - 1) * V, (size_t)V * sizeof(float));
		s->tr_prev_lse = row_lse(s->tr_prev, V);
	}
	t->n = (int32_t)(seen + C < lim ? seen + C : lim);
}

/* Whether the next chunk needs every row's logits for the trace. */
static int trace_wants_logits(const rt_seq *s)
{
	if (!s->tr_mem)
		return 0;
	const int64_t lim = s->run.ctx.prompt_len < s->tr.cap ? s->run.ctx.prompt_len : s->tr.cap;
	return s->run.ctx.seen < lim;
}

static void trace_reset(rt_seq *s)
{
	if (!s->tr_mem)
		return;
	s->tr.n = 0;
	int64_t pl = s->run.ctx.prompt_len;
	s->tr.tail_start = pl > KVP_TRACE_TAIL ? (int32_t)(pl - KVP_TRACE_TAIL) : 0;
	s->tr.tail_n = pl < 0 ? 0 : (int32_t)(pl - s->tr.tail_start);
	s->tr_prev_lse = -INFINITY;
}

static int trace_init(rt_seq *s, rt_err *err)
{
	const rt_model_hparams *hp = &s->m->hp;
	struct kvp_trace *t = &s->tr;
	const size_t E = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim;
	const size_t cap = (size_t)s->cap, V = (size_t)hp->n_vocab;
	const size_t n_hid = KVP_TRACE_LAYERS * cap * E, n_q = KVP_TRACE_LAYERS * cap * qd;
	const size_t n_tail = (size_t)hp->n_layer * KVP_TRACE_TAIL * qd;
	const size_t total = n_hid + n_q + n_tail + cap + V + (size_t)RT_SEQ_TRACE_CHUNK * V;
	s->tr_mem = calloc(total, sizeof(float));
	if (!s->tr_mem)
		return rt_err_set(err, "%s: sequence: cannot allocate %zu bytes of prompt trace",
		                  s->m->path, total * sizeof(float));
	t->cap = s->cap;
	t->n_layer = hp->n_layer;
	t->n_embd = hp->n_embd;
	t->n_head = hp->n_head;
	t->head_dim = hp->head_dim;
	t->n_sample = KVP_TRACE_LAYERS;
	for (int i = 0; i < KVP_TRACE_LAYERS; i++) {
		int l = (int)lround((double)(i + 1) * hp->n_layer / KVP_TRACE_LAYERS) - 1;
		t->sample_layer[i] = l < 0 ? 0 : l;
	}
	float *p = s->tr_mem;
	t->hid = p;
	p += n_hid;
	t->q = p;
	p += n_q;
	t->q_tail = p;
	p += n_tail;
	t->surprisal = p;
	p += cap;
	s->tr_prev = p;
	p += V;
	s->tr_lg = p;
	s->run.ctx.trace = t;
	s->fwd.on_layer = seq_on_layer;
	s->fwd.layer_user = s;
	trace_reset(s);
	return 0;
}

/* ---- compacted positions ----------------------------------------------------------------- */

/* After a compress under KVP_POS_COMPACTED: turn every kept key from the index it was
 * rotated at to its current index i (delta = i - old), so entry i sits at rotation i, at
 * its layer's own frequencies (rt_layer.rope_freq: a sliding-window layer's base, RoPE
 * scaling), the ones the forward rotated it with. A
 * store of a narrow element type (f16, q8_0) is decoded, rotated in f32 and stored again
 * (one more rounding of that key; f32 stores rotate in place). */
static void seq_rerotate(rt_seq *s)
{
	const rt_model_hparams *hp = &s->m->hp;
	const int n_rot = hp->n_rot, d = hp->head_dim;
	const int H = s->kv.n_layer * s->kv.n_kv_head;
	double cached = 0; /* delta the cos/sin table holds (0: none) */
	const double *freq = NULL; /* the frequencies it was computed with */
	for (int hi = 0; hi < H; hi++) {
		rt_kv_head *h = &s->kv.heads[hi];
		const double *lf = s->m->layers[hi / s->kv.n_kv_head].rope_freq;
		if (lf != freq) {
			freq = lf;
			cached = 0;
		}
		int32_t *ri = s->rot_idx + (size_t)hi * (size_t)hp->n_ctx;
		if (s->kv.tiered) {
			/* a tiered store takes the head's keys at once: a re-rotated key's key group
			 * is refitted (rt_kv_head_set_keys), not clamped to the old range */
			rt_kv_head_decode(&s->kv, h, 0, h->n, s->rot_row, NULL);
			memset(s->rot_mark, 0, (size_t)h->n);
		}
		for (int32_t i = 0; i < h->n; i++) {
			int32_t old = ri[h->pos[i]];
			RT_ASSERT(old >= i);
			ri[h->pos[i]] = i;
			if (old == i)
				continue;
			double delta = (double)i - (double)old;
			if (delta != cached) {
				rt_rope_cs_f64(s->rot_cs, delta, n_rot, hp->rope_base, freq);
				cached = delta;
			}
			if (s->kv.type == RT_KV_F32 && !s->kv.tiered) {
				rt_rope_rotate_f32_by_f64(h->k + (size_t)i * d, n_rot, s->rot_cs);
			} else if (s->kv.tiered) {
				/* the head's keys, decoded below, rotated in place; stored at once */
				rt_rope_rotate_f32_by_f64(s->rot_row + (size_t)i * d, n_rot, s->rot_cs);
				s->rot_mark[i] = 1;
			} else {
				float *row = s->rot_row;
				/* a narrow type or tier decodes into row (an f32 top row is copied) */
				const float *k = rt_kv_key(&s->kv, h, i, row);
				if (k != row)
					memcpy(row, k, (size_t)d * sizeof *row);
				rt_rope_rotate_f32_by_f64(row, n_rot, s->rot_cs);
				rt_kv_set_key(&s->kv, h, i, row);
			}
		}
		if (s->kv.tiered)
			rt_kv_head_set_keys(&s->kv, h, s->rot_row, s->rot_mark);
	}
}

/* ---- lifecycle ----------------------------------------------------------------------- */

/* A policy whose scorer reads the hidden states (KVP_NEED_HIDDEN) was trained for one
 * model shape: another model is refused before anything is allocated. */
static int hidden_shape_check(const rt_model *m, const struct kvp_policy *p, rt_err *err)
{
	const rt_model_hparams *hp = &m->hp;
	const int *w = p->hidden_shape;
	if (!(p->needs & KVP_NEED_HIDDEN) ||
	    (w[0] == hp->n_layer && w[1] == hp->n_head_kv && w[2] == hp->n_embd))
		return 0;
	return rt_err_setc(err, RT_ERR_INPUT, "policy %s: %s holds a linear scorer for %d layers x %d "
	                   "KV heads x hidden size %d, but the model %s has %d x %d x %d; train one for "
	                   "this model (scripts/calibrate/kvzap_train.py)", p->name,
	                   p->hidden_file ? p->hidden_file : "its weight file", w[0], w[1], w[2],
	                   m->path, hp->n_layer, hp->n_head_kv, hp->n_embd);
}

int rt_seq_init(rt_seq *s, const rt_model *m, const struct kvp_policy *p, int32_t cap,
                int max_chunk, int64_t prompt_len, rt_err *err)
{
	return rt_seq_init_typed(s, m, p, m->kv_type, cap, max_chunk, prompt_len, err);
}

/* The COMPACTED position map and re-rotation scratch as one block (rot_mem): the cos/sin
 * of a delta [n_rot + 1], the rotated-at index of each entry [n], a decoded key row (a
 * tiered store re-rotates a whole head's keys at once: [cap rows]) and, tiered, the
 * rotated marks [cap]. Each part's size keeps the next one aligned. Returns 0 or -1. */
static int rot_alloc(rt_seq *s, size_t n, int n_rot, int head_dim)
{
	const size_t rows = s->kv.tiered ? (size_t)s->kv.cap : 1;
	const size_t cs = (size_t)(n_rot + 1) * sizeof *s->rot_cs, idx = n * sizeof *s->rot_idx;
	const size_t row = rows * (size_t)head_dim * sizeof *s->rot_row;
	const size_t mark = s->kv.tiered ? (size_t)s->kv.cap : 0;
	uint8_t *mem = malloc(cs + idx + row + mark);
	if (!mem)
		return -1;
	s->rot_mem = mem;
	s->rot_cs = (double *)mem;
	s->rot_idx = (int32_t *)(mem + cs);
	s->rot_row = (float *)(mem + cs + idx);
	s->rot_mark = mark ? mem + cs + idx + row : NULL;
	return 0;
}

int rt_seq_init_typed(rt_seq *s, const rt_model *m, const struct kvp_policy *p,
                      enum rt_kv_type kv_type, int32_t cap, int max_chunk, int64_t prompt_len,
                      rt_err *err)
{
	memset(s, 0, sizeof *s);
	const rt_model_hparams *hp = &m->hp;
	if (cap < 1 || max_chunk < 1 || max_chunk > 65536)
		return rt_err_set(err, "%s: sequence: invalid capacity %d or chunk %d", m->path, (int)cap,
		                  max_chunk);
	if (hidden_shape_check(m, p, err) != 0)
		return -1;
	if (p->needs & KVP_NEED_REPLAY) { /* room for one replayed chunk (rt_replay.h) */
		if (cap > INT32_MAX - RT_REPLAY_CHUNK - RT_REPLAY_ROOM)
			return rt_err_set(err, "%s: sequence: invalid capacity %d", m->path, (int)cap);
		cap += RT_REPLAY_CHUNK + RT_REPLAY_ROOM;
		if (rt_replay_init(&s->rp, m, cap, err) != 0)
			return -1;
		rt_replay_reserve(&s->rp, prompt_len); /* feeding allocates nothing (else lazily) */
	}
	if (rt_run_init_typed(&s->run, &s->kv, kv_type, p, hp->n_layer, hp->n_head_kv,
	                      hp->group, hp->head_dim, cap, prompt_len, err) != 0) {
		rt_replay_free(&s->rp);
		return -1;
	}
	s->m = m;
	s->p = p;
	s->cap = cap;
	s->max_chunk = max_chunk;
	if (rt_fwd_init(&s->fwd, m, max_chunk, cap, err) != 0 ||
	    rt_fwd_reserve_tiers(&s->fwd, &s->kv, err) != 0) {
		rt_seq_free(s);
		return -1;
	}
	if (p->positions == KVP_POS_COMPACTED) {
		size_t n = (size_t)hp->n_layer * hp->n_head_kv * (size_t)hp->n_ctx;
		if (rot_alloc(s, n, hp->n_rot, hp->head_dim) != 0) {
			rt_seq_free(s);
			return rt_err_set(err, "%s: sequence: cannot allocate %zu bytes of position map",
			                  m->path, n * sizeof(int32_t));
		}
		s->fwd.rope_at_index = 1;
	}
	s->run.ctx.rope_base = hp->rope_base; /* Expected Attention's future-averaged RoPE */
	s->run.ctx.rope_freq = m->rope_freq;  /* at each layer's own frequencies */
	s->run.ctx.layer_window = m->layer_window; /* `layers = global_only` skips the windowed */
	s->run.ctx.n_rot = hp->n_rot;
	s->run.ctx.n_embd = hp->n_embd; /* linear_score()'s shape check (KVP_NEED_HIDDEN) */
	if ((p->needs & KVP_NEED_QUERY) && rt_fwd_keep_queries(&s->fwd, err) != 0) {
		rt_seq_free(s);
		return -1;
	}
	/* the fast path's threads also run compress's per-head work (kernels/k_compress.h) */
	if (!m->exact && rt_run_set_pool(&s->run, &s->kv, m->pool, err) != 0) {
		rt_seq_free(s);
		return -1;
	}
	s->fwd.on_append = seq_on_append; /* span ids, the position map, init_entries */
	s->fwd.append_user = s;
	s->fwd.observe = p->observe ? seq_observe : NULL;
	s->fwd.observe_user = s;
	/* a policy's observe touches only its own head (rt_policy.h): the KV heads of a layer
	 * are attended and observed in parallel on the fast path */
	s->fwd.observe_parallel = 1;
	s->obs_seconds = calloc((size_t)hp->n_head_kv, sizeof *s->obs_seconds);
	if (!s->obs_seconds) {
		rt_seq_free(s);
		return rt_err_set(err, "%s: sequence: out of memory", m->path);
	}
	if ((p->needs & KVP_NEED_TRACE) && trace_init(s, err) != 0) {
		rt_seq_free(s);
		return -1;
	}
	return 0;
}

void rt_seq_free(rt_seq *s)
{
	if (s->dev.free)
		s->dev.free(s->dev.state);
	if (s->p)
		rt_run_free(&s->run);
	rt_kv_free(&s->kv);
	rt_fwd_free(&s->fwd);
	free(s->rot_mem);
	free(s->tr_mem);
	free(s->obs_seconds);
	rt_replay_free(&s->rp);
	memset(s, 0, sizeof *s);
}

void rt_seq_reset(rt_seq *s, int64_t prompt_len)
{
	rt_run_reset(&s->run, &s->kv, prompt_len);
	memset(&s->st, 0, sizeof s->st);
	s->hook_seconds = 0;
	for (int j = 0; j < s->kv.n_kv_head; j++)
		s->obs_seconds[j] = 0;
	s->span = (rt_span_mark){ 0 };
	trace_reset(s);
	rt_replay_reset(&s->rp);
	if (s->p->needs & KVP_NEED_REPLAY)
		rt_replay_reserve(&s->rp, prompt_len);
	s->run.ctx.replay = NULL;
	s->run.ctx.replay_n = 0;
	if (s->dev.reset)
		s->dev.reset(s->dev.state);
}

rt_seq_mark rt_seq_mark_get(const rt_seq *s)
{
	const struct kvp_ctx *c = &s->run.ctx;
	return (rt_seq_mark){ .seen = c->seen, .compress_count = c->compress_count,
		              .last_compress_seen = c->last_compress_seen,
		              .compressions = s->run.compressions, .phase = c->phase,
		              .prompt_done = c->prompt_done, .notes = s->run.notes,
		              .span = s->span, .st = s->st };
}

int rt_seq_fork(rt_seq *s, rt_kv_prefix *px, const rt_seq_mark *mk, rt_err *err)
{
	if (s->run.ctx.seen != 0 || s->dev.forward ||
	    (s->p->needs & (KVP_NEED_TRACE | KVP_NEED_REPLAY)) ||
	    s->rot_idx || mk->seen != rt_kv_prefix_fork_len(px))
		return 0;
	const int rc = rt_kv_prefix_fork(&s->kv, px, err);
	if (rc != 1)
		return rc;
	struct kvp_ctx *c = &s->run.ctx;
	c->seen = mk->seen;
	c->phase = mk->phase;
	c->prompt_done = mk->prompt_done;
	c->compress_count = mk->compress_count;
	c->last_compress_seen = mk->last_compress_seen;
	s->run.compressions = mk->compressions;
	s->run.notes = mk->notes;
	s->span = mk->span;
	s->st = mk->st;
	s->st.seconds = 0;
	s->st.policy_seconds = 0;
	return 1;
}

/* rt_run's compress hook of a sequence on a device. */
static int seq_dev_compress(void *user, struct kvp_ctx *ctx, rt_kv *kv, rt_err *err)
{
	rt_seq *s = user;
	return s->dev.compress(s->dev.state, ctx, kv, err);
}

int rt_seq_attach(rt_seq *s, const rt_seq_dev *d, rt_err *err)
{
	const char *why = s->dev.forward ? "it already runs on a device"
	                : s->run.ctx.seen > 0 ? "it has been fed"
	                : (s->p->needs & KVP_NEED_TRACE) ? "its policy records a prompt trace on the CPU"
	                : (s->p->needs & KVP_NEED_REPLAY) ? "its policy replays the context on the CPU forward (replay_attn)"
	                : (s->p->needs & KVP_NEED_HIDDEN) ? "its policy scores entries from the hidden states on the CPU"
	                : s->rot_idx ? "its policy re-rotates compacted positions on the CPU"
	                : d->max_chunk < 1 ? "the device takes no tokens" : NULL;
	if (why)
		return rt_err_setc(err, RT_ERR_INPUT, "policy %s: the sequence cannot move to %s: %s",
		                   s->p->name, d->name, why);
	s->dev = *d;
	if (s->max_chunk > d->max_chunk)
		s->max_chunk = d->max_chunk;
	rt_fwd_free(&s->fwd); /* the device runs the forward */
	s->run.compress_on = seq_dev_compress;
	s->run.compress_user = s;
	return 0;
}

const char *rt_seq_device(const rt_seq *s)
{
	return s->dev.forward ? s->dev.name : "cpu";
}

void rt_seq_set_span_names(rt_seq *s, const char *const *names, int n)
{
	RT_ASSERT(n >= 0 && n <= 65535);
	s->run.ctx.span_names = names;
	s->run.ctx.n_spans = n;
}

void rt_seq_use_spans(rt_seq *s)
{
	static const char *const names[RT_SPAN_END] = { "", RT_SPANS(RT_SPAN_NAME_) };
	rt_seq_set_span_names(s, names, RT_N_SPAN_NAMES);
}

int64_t rt_seq_span_kept(const rt_seq *s, int id)
{
	const rt_kv *kv = &s->kv;
	const int32_t *win = s->run.ctx.layer_window;
	int any_full = 0;
	for (int l = 0; win && l < kv->n_layer; l++)
		any_full |= win[l] == 0;
	int64_t kept = -1;
	for (int l = 0; l < kv->n_layer; l++) {
		if (win && any_full && win[l] > 0)
			continue; /* the model's window, not the policy, drops its old entries */
		for (int h = 0; h < kv->n_kv_head; h++) {
			const rt_kv_head *hd = &kv->heads[l * kv->n_kv_head + h];
			int64_t c = 0;
			for (int32_t e = 0; e < hd->n; e++)
				c += hd->span[e] == id;
			kept = kept < 0 || c < kept ? c : kept;
		}
	}
	return kept < 0 ? 0 : kept;
}

void rt_seq_span(rt_seq *s, int id)
{
	RT_ASSERT(id >= 0 && id <= s->run.ctx.n_spans);
	s->span.cur = (uint16_t)id;
}

void rt_seq_span_range(rt_seq *s, int id, int64_t pos, int64_t n)
{
	RT_ASSERT(id >= 0 && id <= s->run.ctx.n_spans && pos >= 0 && n >= 0);
	s->span.range_id = n > 0 ? (uint16_t)id : 0;
	s->span.lo = pos;
	s->span.hi = pos + n;
}

int rt_seq_set(rt_seq *s, const char *assign, rt_err *err)
{
	return rt_run_set(&s->run, assign, err);
}

int rt_seq_set_ratio(rt_seq *s, double R, rt_err *err)
{
	return rt_run_set_ratio(&s->run, R, err);
}

int rt_seq_set_byte_ratio(rt_seq *s, double R, rt_err *err)
{
	return rt_run_set_byte_ratio(&s->run, R, err);
}

int rt_seq_set_prefill_chunk(rt_seq *s, int32_t C, rt_err *err)
{
	return rt_run_set_prefill_chunk(&s->run, C, err);
}

int rt_seq_apply(rt_seq *s, const struct rt_pick *pk, rt_err *err)
{
	RT_ASSERT(pk->p == s->run.p);
	if (s->run.p->n_params > 0)
		memcpy(s->run.params, pk->vals, (size_t)s->run.p->n_params * sizeof *pk->vals);
	if (rt_run_set_ratio(&s->run, pk->ratio, err) != 0 ||
	    rt_run_set_byte_ratio(&s->run, pk->byte_ratio, err) != 0)
		return -1;
	s->run.ctx.min_kv = pk->min_kv;
	return rt_run_set_prefill_chunk(&s->run, pk->prefill_chunk, err);
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
	st.replay_seconds = s->rp.seconds;
	st.replay_tokens = s->rp.tokens;
	for (int j = 0; j < s->kv.n_kv_head; j++)
		st.policy_seconds += s->obs_seconds[j];
	return st;
}

/* ---- feeding ------------------------------------------------------------------------- */

/* The context replay's part of a chunk (KVP_NEED_REPLAY): record its prompt tokens, and
 * when it ends the prompt, replay the prompt before rt_run_advance's compress sees it. */
static int seq_replay(rt_seq *s, const int32_t *tok, int C, rt_err *err)
{
	const int64_t pl = s->run.ctx.prompt_len, pos = s->run.ctx.seen;
	if (rt_replay_record(&s->rp, tok, C, pos, pl, err) != 0)
		return -1;
	if (pl <= 0 || pos + C != pl)
		return 0;
	rt_err e = { "" };
	if (rt_replay_run(&s->rp, &s->fwd, &s->kv, pl, &e) != 0)
		return rt_err_setc(err, e.code, "policy %s: %s", s->p->name, e.msg);
	s->run.ctx.replay = s->rp.score;
	s->run.ctx.replay_n = s->rp.score_n;
	/* the prompt and a replayed chunk were held at once: that is the sequence's peak */
	if (s->rp.peak_entries > s->st.kv_entries_peak)
		s->st.kv_entries_peak = s->rp.peak_entries;
	if (s->rp.peak_bytes > s->st.kv_bytes_peak)
		s->st.kv_bytes_peak = s->rp.peak_bytes;
	if (s->rp.peak_kvbytes > s->st.kv_kvbytes_peak)
		s->st.kv_kvbytes_peak = s->rp.peak_kvbytes;
	return 0;
}

/* The policy-side half of one chunk: after the forward appended and observed the C tokens
 * tok[0..C) (logits rows lg [C × n_vocab], or NULL when none were computed): the trace,
 * the counters, rt_run_advance (may compress) and the compacted re-rotation. */
static int seq_chunk_done(rt_seq *s, const int32_t *tok, int C, const float *lg, rt_err *err)
{
	if (trace_wants_logits(s))
		trace_chunk(s, tok, C, lg);
	s->st.chunks++;
	int64_t e = rt_kv_entries(&s->kv), held = rt_kv_bytes_held(&s->kv);
	if (e > s->st.kv_entries_peak)
		s->st.kv_entries_peak = e;
	if (held > s->st.kv_bytes_peak)
		s->st.kv_bytes_peak = held;
	const int64_t kvb = rt_kvbytes_held(&s->kv);
	if (kvb > s->st.kv_kvbytes_peak)
		s->st.kv_kvbytes_peak = kvb;
	if ((s->p->needs & KVP_NEED_REPLAY) && seq_replay(s, tok, C, err) != 0)
		return -1;
	int rc = rt_run_advance(&s->run, &s->kv, C, err);
	if (rc < 0)
		return -1;
	/* the first compress that changed the cache: fewer entries (evicted or merged) or
	 * fewer bytes (stored at a lower tier); one under a budget that still holds every
	 * entry leaves the full cache, whose figures are not the policy's */
	if (rc == 1 && s->st.first_compress_seen == 0 &&
	    (rt_kv_entries(&s->kv) < e || rt_kvbytes_held(&s->kv) < kvb))
		s->st.first_compress_seen = s->run.ctx.seen;
	if (rc == 1 && s->st.first_call_seen == 0)
		s->st.first_call_seen = s->run.ctx.seen;
	/* chunks stop at the prompt's end (rt_run_chunk), so this chunk ended it exactly */
	const int64_t pl = s->run.ctx.prompt_len;
	if (pl > 0 && s->run.ctx.seen == pl) {
		const double me = rt_seq_mean_entries(s);
		s->st.prompt_compression = me > 0 ? (double)pl / me : 0;
		s->st.prompt_bytes_compression = rt_kvbytes_compression(&s->kv, pl);
	}
	/* a compress, or on a model with sliding-window layers the forward's window trim,
	 * moved kept entries to new indices */
	if (s->rot_idx && (rc == 1 || s->m->hp.n_swa > 0)) {
		double t1 = rt_now();
		seq_rerotate(s);
		s->hook_seconds += rt_now() - t1;
	}
	s->st.tokens += C;
	return 0;
}

static int seq_full_err(const rt_seq *s, rt_err *err)
{
	return rt_err_setc(err, RT_ERR_RESOURCE,
	                  "policy %s: KV cache full at token %lld: the store holds %d "
	                  "entries per head and the policy frees none (budget above "
	                  "the capacity?)",
	                  s->p->name, (long long)s->run.ctx.seen, (int)s->cap);
}

/* Take the pool blocks of the next k entries of every list before the forward, so an
 * exhausted pool fails this sequence alone, with nothing appended. */
static int seq_reserve(rt_seq *s, int32_t k, rt_err *err)
{
	rt_err e = { "" };
	if (rt_kv_reserve(&s->kv, k, &e) == 0)
		return 0;
	return rt_err_setc(err, e.code, "policy %s at token %lld: %s", s->p->name,
	                   (long long)s->run.ctx.seen, e.msg);
}

int rt_seq_feed(rt_seq *s, const int32_t *tokens, int64_t n, float *logits,
                enum rt_logits_mode mode, rt_err *err)
{
	const int V = s->m->hp.n_vocab;
	if (n < 0)
		return rt_err_set(err, "%s: sequence: negative token count", s->m->path);
	if (mode != RT_LOGITS_NONE && !logits)
		return rt_err_set(err, "%s: sequence: logits requested without a buffer", s->m->path);
	/* the budget and guards in force, before the first token (rt_budget) */
	if (s->run.ctx.seen == 0 && n > 0 && rt_policy_check(&s->run, &s->kv, err) != 0)
		return -1;
	double t0 = rt_now();
	for (int64_t done = 0; done < n;) {
		int32_t want = n - done < s->max_chunk ? (int32_t)(n - done) : s->max_chunk;
		const int tr = trace_wants_logits(s) && mode != RT_LOGITS_ALL;
		if (tr && want > RT_SEQ_TRACE_CHUNK)
			want = RT_SEQ_TRACE_CHUNK;
		int32_t k = rt_run_chunk(&s->run, &s->kv, want);
		if (k == 0)
			return seq_full_err(s, err);
		if (seq_reserve(s, k, err) != 0)
			return -1;
		float *lg = NULL;
		enum rt_logits_mode md = RT_LOGITS_NONE;
		if (mode == RT_LOGITS_ALL) {
			lg = logits + (size_t)done * V;
			md = RT_LOGITS_ALL;
		} else if (tr) {
			lg = s->tr_lg;
			md = RT_LOGITS_ALL;
		} else if (mode == RT_LOGITS_LAST && done + k == n) {
			lg = logits;
			md = RT_LOGITS_LAST;
		}
		if ((s->dev.forward ? s->dev.forward(s->dev.state, &s->kv, tokens + done, k,
		                                     s->run.ctx.seen, lg, md, err)
		                    : rt_model_forward(&s->fwd, &s->kv, tokens + done, k,
		                                       (int32_t)s->run.ctx.seen, lg, md, err)) != 0)
			return -1;
		if (tr && mode == RT_LOGITS_LAST && done + k == n)
			memcpy(logits, s->tr_lg + (size_t)(k - 1) * V, (size_t)V * sizeof(float));
		if (seq_chunk_done(s, tokens + done, k, md == RT_LOGITS_ALL ? lg : NULL, err) != 0)
			return -1;
		done += k;
	}
	s->st.seconds += rt_now() - t0;
	return 0;
}

static int step_run(rt_seq_multi *b, rt_seq *const *s, int K, const int32_t *const *tok,
                    int *n, int final_only, rt_err *why, rt_err *err);

/* ---- lockstep batches ---------------------------------------------------------------- */

int rt_seq_batch_init(rt_seq_batch *b, rt_seq *const *s, int K, int chunk, rt_err *err)
{
	memset(b, 0, sizeof *b);
	if (K < 1 || chunk < 1 || chunk > 4096)
		return rt_err_set(err, "sequence batch: invalid size %d or chunk %d", K, chunk);
	const rt_model *m = s[0]->m;
	for (int k = 0; k < K; k++) {
		if (s[k]->m != m)
			return rt_err_set(err, "sequence batch: sequences of different models");
		if (s[k]->dev.forward)
			return rt_err_set(err, "sequence batch: policy %s runs on %s: feed it alone",
			                  s[k]->p->name, s[k]->dev.name);
	}
	const size_t n = (size_t)K;
	b->mem = calloc(1, n * (2 * sizeof(rt_seq *) + sizeof(int32_t *) + sizeof(int64_t) +
	                        3 * sizeof(int) + sizeof(rt_err) + 512));
	b->mb = calloc(1, sizeof *b->mb);
	if (!b->mem || !b->mb) {
		rt_seq_batch_free(b);
		return rt_err_set(err, "%s: sequence batch: out of memory", m->path);
	}
	b->s = b->mem;
	b->fed = b->s + n;
	b->tk = (const int32_t **)(b->fed + n);
	b->done = (int64_t *)(b->tk + n);
	b->ew = (rt_err *)(b->done + n);
	b->idx = (int *)(b->ew + n);
	b->nn = b->idx + n;
	b->slot = b->nn + n;
	b->why = (char (*)[512])(b->slot + n);
	for (int k = 0; k < K; k++) {
		b->s[k] = s[k];
		b->idx[k] = k;
	}
	if (rt_seq_multi_init(b->mb, m, K, K * chunk, err) != 0) {
		rt_seq_batch_free(b);
		return -1;
	}
	b->K = b->n_active = K;
	b->chunk = chunk;
	return 0;
}

void rt_seq_batch_free(rt_seq_batch *b)
{
	if (b->mb)
		rt_seq_multi_free(b->mb);
	free(b->mb);
	free(b->mem);
	memset(b, 0, sizeof *b);
}

const char *rt_seq_batch_error(const rt_seq_batch *b, int k)
{
	RT_ASSERT(k >= 0 && k < b->K);
	return b->why[k][0] ? b->why[k] : NULL;
}

/* Sequence in slot i leaves the batch because of err: its reason is kept under the
 * caller's index and the last active slot moves into its place. */
static void batch_drop(rt_seq_batch *b, int i, const rt_err *err)
{
	snprintf(b->why[b->idx[i]], sizeof b->why[0], "%s", err->msg[0] ? err->msg : "failed");
	int last = --b->n_active;
	b->s[i] = b->s[last], b->done[i] = b->done[last], b->idx[i] = b->idx[last];
}

/* The checks before a feed: sizes, every active sequence at the same position, and, at
 * the first token, each one's budget and guards (rt_budget; a sequence failing them
 * leaves). 0, or -1 with err. */
static int batch_feed_check(rt_seq_batch *b, int64_t n, const float *logits,
                            enum rt_logits_mode mode, rt_err *err)
{
	if (b->K < 1)
		return rt_err_set(err, "sequence batch: not initialised");
	const char *path = b->s[0]->m->path;
	if (n < 0)
		return rt_err_set(err, "%s: sequence: negative token count", path);
	if (mode != RT_LOGITS_NONE && !logits)
		return rt_err_set(err, "%s: sequence: logits requested without a buffer", path);
	if (b->n_active < 1)
		return rt_err_set(err, "sequence batch: every sequence has left (%s)", b->why[0]);
	const int64_t seen = b->s[0]->run.ctx.seen;
	for (int k = 1; k < b->n_active; k++)
		if (b->s[k]->run.ctx.seen != seen)
			return rt_err_set(err,
			                  "sequence batch: policy %s has seen %lld tokens, policy %s %lld",
			                  b->s[0]->p->name, (long long)seen, b->s[k]->p->name,
			                  (long long)b->s[k]->run.ctx.seen);
	if (seen == 0 && n > 0)
		for (int i = 0; i < b->n_active;) {
			rt_err e = { "" };
			if (rt_policy_check(&b->s[i]->run, &b->s[i]->kv, &e) != 0) {
				batch_drop(b, i, &e);
				continue;
			}
			i++;
		}
	if (b->n_active < 1)
		return rt_err_set(err, "sequence batch: every sequence has left (%s)", b->why[0]);
	return 0;
}

int rt_seq_batch_feed(rt_seq_batch *b, const int32_t *tokens, int64_t n, float *logits,
                      enum rt_logits_mode mode, rt_err *err)
{
	if (batch_feed_check(b, n, logits, mode, err) != 0)
		return -1;
	rt_seq_multi *mb = b->mb;
	const int V = b->s[0]->m->hp.n_vocab;
	for (int i = 0; i < b->n_active; i++)
		b->done[i] = 0;
	double t0 = rt_now();
	for (;;) {
		/* one step: every sequence with tokens of this feed left offers its rest */
		int J = 0;
		for (int i = 0; i < b->n_active; i++) {
			if (b->done[i] >= n)
				continue;
			const int64_t left = n - b->done[i];
			b->fed[J] = b->s[i];
			b->tk[J] = tokens + b->done[i];
			b->nn[J] = left < b->chunk ? (int)left : b->chunk;
			/* RT_LOGITS_LAST: the logits of a chunk that may be the last only (the rest
			 * fits in it; a trigger can still cut it short, and a later chunk then
			 * overwrites the row) */
			mb->lgq[J] = mode == RT_LOGITS_ALL ? logits + ((size_t)b->idx[i] * n + b->done[i]) * V
			             : mode == RT_LOGITS_LAST && left <= b->chunk ? logits + (size_t)b->idx[i] * V
			             : NULL;
			mb->allq[J] = mode == RT_LOGITS_ALL;
			b->slot[J++] = i;
		}
		if (J == 0)
			break;
		if (step_run(mb, b->fed, J, b->tk, b->nn, 1, b->ew, err) < 0)
			return -1;
		/* from the last slot down, so a leaving slot is only replaced by one already
		 * stepped (or not offered) */
		for (int j = J - 1; j >= 0; j--) {
			if (b->nn[j] < 0)
				batch_drop(b, b->slot[j], &b->ew[j]);
			else
				b->done[b->slot[j]] += b->nn[j];
		}
	}
	if (b->n_active < 1)
		return rt_err_set(err, "sequence batch: every sequence has left (%s)", b->why[0]);
	const double dt = rt_now() - t0;
	for (int i = 0; i < b->n_active; i++)
		b->s[i]->st.seconds += dt;
	return 0;
}

/* ---- continuous batching -------------------------------------------------------------- */

int rt_seq_multi_init(rt_seq_multi *b, const rt_model *m, int max_seqs, int max_rows,
                      rt_err *err)
{
	memset(b, 0, sizeof *b);
	if (max_seqs < 1 || max_rows < 1 || max_rows > (1 << 20) || max_seqs > max_rows)
		return rt_err_set(err, "sequence step: invalid size %d sequences, %d rows", max_seqs,
		                  max_rows);
	const size_t K = (size_t)max_seqs;
	const size_t ptrs = K * (sizeof(rt_fwd *) + sizeof(rt_kv *) + sizeof(int32_t *) +
	                         2 * sizeof(float *));
	b->mem = calloc(1, ptrs + K * (4 * sizeof(int) + sizeof(int32_t)));
	if (!b->mem)
		return rt_err_set(err, "%s: sequence step: out of memory", m->path);
	b->fw = b->mem;
	b->kv = (rt_kv **)(b->fw + K);
	b->tok = (const int32_t **)(b->kv + K);
	b->lgp = (float **)(b->tok + K);
	b->lgq = b->lgp + K;
	b->n = (int *)(b->lgq + K);
	b->all = b->n + K;
	b->allq = b->all + K;
	b->idx = b->allq + K;
	b->pos = (int32_t *)(b->idx + K);
	if (rt_fwd_init(&b->big, m, max_rows, 1, err) != 0) {
		rt_seq_multi_free(b);
		return -1;
	}
	b->max_seqs = max_seqs;
	b->max_rows = max_rows;
	return 0;
}

void rt_seq_multi_free(rt_seq_multi *b)
{
	rt_fwd_free(&b->big);
	free(b->mem);
	memset(b, 0, sizeof *b);
}

/* Sequence i of a step (offered n tokens) takes its next chunk, as rt_seq_feed's rule
 * gives it: at most its max_chunk, no trigger or prompt end crossed, a trace chunk while
 * it records a prompt trace and its rows are not all wanted. Its size, or 0 with why set
 * (KV cache full). */
static int32_t step_take(rt_seq *s, int n, int all_rows, rt_err *why)
{
	int32_t want = n < s->max_chunk ? n : s->max_chunk;
	if (trace_wants_logits(s) && !all_rows && want > RT_SEQ_TRACE_CHUNK)
		want = RT_SEQ_TRACE_CHUNK;
	const int32_t k = rt_run_chunk(&s->run, &s->kv, want);
	if (k == 0)
		seq_full_err(s, why);
	return k;
}

/* The engine of both batch kinds: one forward over the sequences s[0..K) that step_take
 * gives a chunk of the n[i] tokens tok[i] offered, their rows stacked (the weight GEMMs
 * once over all, each sequence's matmul segment its own: runtime/model/rt_matmul.h). Each
 * one's logits go to b->lgq[i] (NULL: none): every row when b->allq[i], else the chunk's
 * last row — when final_only, only for a chunk that takes all n[i]. A sequence tracing
 * its prompt keeps every row in its trace buffer. n[i] becomes the tokens taken, or -1
 * with why[i]. Returns the sequences fed, or -1 with err (a forward error). */
static int step_run(rt_seq_multi *b, rt_seq *const *s, int K, const int32_t *const *tok,
                    int *n, int final_only, rt_err *why, rt_err *err)
{
	const int V = b->big.m->hp.n_vocab;
	int J = 0, rows = 0;
	for (int i = 0; i < K; i++) {
		why[i].msg[0] = 0;
		if (s[i]->m != b->big.m || n[i] < 1)
			return rt_err_set(err, "sequence step: sequence %d: another model or %d tokens", i,
			                  n[i]);
		const int32_t k = step_take(s[i], n[i], b->allq[i], &why[i]);
		if (k > 0 && rows + k > b->max_rows)
			rt_err_set(&why[i], "sequence step: more than %d rows", b->max_rows);
		if (k == 0 || rows + k > b->max_rows || seq_reserve(s[i], k, &why[i]) != 0) {
			n[i] = -1;
			continue;
		}
		const int tr = trace_wants_logits(s[i]) && !b->allq[i];
		const int last = b->lgq[i] && (!final_only || k == n[i]);
		b->fw[J] = &s[i]->fwd;
		b->kv[J] = &s[i]->kv;
		b->tok[J] = tok[i];
		b->n[J] = k;
		b->pos[J] = (int32_t)s[i]->run.ctx.seen;
		b->lgp[J] = tr ? s[i]->tr_lg : b->allq[i] || last ? b->lgq[i] : NULL;
		b->all[J] = tr || b->allq[i];
		b->idx[J] = i;
		n[i] = k;
		rows += k;
		J++;
	}
	if (J == 0)
		return 0;
	if (rt_model_forward_multi(&b->big, b->fw, b->kv, J, b->tok, b->n, b->pos, b->lgp, b->all,
	                           err) != 0)
		return -1;
	for (int j = 0; j < J; j++) {
		const int i = b->idx[j], k = b->n[j];
		rt_seq *q = s[i];
		const int tr = b->lgp[j] && b->lgp[j] == q->tr_lg;
		if (tr && b->lgq[i] && (!final_only || k == n[i]))
			memcpy(b->lgq[i], q->tr_lg + (size_t)(k - 1) * V, (size_t)V * sizeof(float));
		if (seq_chunk_done(q, tok[i], k, b->all[j] ? b->lgp[j] : NULL, &why[i]) != 0)
			n[i] = -1;
	}
	return J;
}

int rt_seq_multi_step(rt_seq_multi *b, rt_seq *const *s, int K, const int32_t *const *tok,
                      int *n, float *logits, rt_err *why, rt_err *err)
{
	if (K < 1 || K > b->max_seqs)
		return rt_err_set(err, "sequence step: %d sequences for a step of %d", K, b->max_seqs);
	const int V = b->big.m->hp.n_vocab;
	for (int i = 0; i < K; i++) {
		b->lgq[i] = logits + (size_t)i * V;
		b->allq[i] = 0;
	}
	double t0 = rt_now();
	const int J = step_run(b, s, K, tok, n, 0, why, err);
	const double dt = rt_now() - t0;
	for (int j = 0; j < J; j++) /* step_run leaves the fed ones in b->idx */
		s[b->idx[j]]->st.seconds += dt;
	return J;
}
