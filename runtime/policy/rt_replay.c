/*
 * rt_replay: KVzip's context replay, scored from the forward's attention; see rt_replay.h.
 */
#include "policy/rt_replay.h"

#include <stdlib.h>
#include <string.h>

#include "kv/rt_kvbytes.h"
#include "model/rt_chat.h"
#include "model/rt_gguf.h"
#include "model/rt_tokenizer.h"

/* kvpress kvzip_press.py prepare(): the instruction of the first chunk and of the others */
static const char REPLAY_FIRST[] = "\n\nRepeat the previous context exactly.";
static const char REPLAY_NEXT[] = "\n\nRepeat the part of the previous context exactly, starting with";

/* text[0..len) tokenized (no BOS) into a fresh array; its length in *n. */
static int32_t *tokens_of(const rt_tokenizer *t, const char *text, size_t len, int special,
                          int *n, rt_err *err)
{
	const int64_t k = rt_tokenize(t, text, len, special, NULL, 0, err);
	if (k < 0)
		return NULL;
	int32_t *out = malloc((size_t)(k > 0 ? k : 1) * sizeof *out);
	if (!out) {
		rt_err_set(err, "replay: out of memory");
		return NULL;
	}
	if (rt_tokenize(t, text, len, special, out, k, err) != k) {
		free(out);
		return NULL;
	}
	*n = (int)k;
	return out;
}

/* What the chat template writes after a user message's content (kvpress: the rendered
 * template of a dummy message, split after the content), or "\n" without a template. */
static int32_t *suffix_of(const rt_tokenizer *t, int *n, rt_err *err)
{
	const rt_chat_msg msg = { "user", "dummy context" };
	int n_seg = 0;
	rt_err e = { "" };
	rt_chat_seg *seg = rt_chat_segments(t, &msg, 1, &n_seg, &e);
	if (!seg)
		return tokens_of(t, "\n", 1, 0, n, err);
	size_t len = 0;
	int after = 0;
	for (int i = 0; i < n_seg; i++) {
		if (after)
			len += seg[i].len;
		if (seg[i].msg == 0 && !seg[i].special)
			after = 1;
	}
	char *text = malloc(len + 1);
	int32_t *out = NULL;
	if (text) {
		size_t o = 0;
		after = 0;
		for (int i = 0; i < n_seg; i++) {
			if (after) {
				memcpy(text + o, seg[i].text, seg[i].len);
				o += seg[i].len;
			}
			if (seg[i].msg == 0 && !seg[i].special)
				after = 1;
		}
		text[o] = 0;
		out = tokens_of(t, text, o, 1, n, err);
	} else {
		rt_err_set(err, "replay: out of memory");
	}
	free(text);
	free(seg);
	return out;
}

int rt_replay_init(rt_replay *rp, const rt_model *m, int32_t cap, rt_err *err)
{
	memset(rp, 0, sizeof *rp);
	rt_gguf *g = rt_gguf_open(m->path, err);
	if (!g)
		return -1;
	rt_tokenizer *t = rt_tokenizer_init(g, err);
	int rc = -1;
	if (t && (rp->first = tokens_of(t, REPLAY_FIRST, sizeof REPLAY_FIRST - 1, 0, &rp->n_first,
	                                err)) &&
	    (rp->next = tokens_of(t, REPLAY_NEXT, sizeof REPLAY_NEXT - 1, 0, &rp->n_next, err)) &&
	    (rp->suffix = suffix_of(t, &rp->n_suffix, err)))
		rc = 0;
	rt_tokenizer_free(t);
	rt_gguf_close(g);
	if (rc != 0) {
		rt_replay_free(rp);
		return -1;
	}
	if (rp->n_next + RT_REPLAY_TAIL + rp->n_suffix > RT_REPLAY_ROOM ||
	    rp->n_first + rp->n_suffix > RT_REPLAY_ROOM) {
		rt_replay_free(rp);
		return rt_err_set(err, "%s: the replay instruction takes more than %d tokens", m->path,
		                  RT_REPLAY_ROOM);
	}
	rp->n_layer = m->hp.n_layer;
	rp->n_kv_head = m->hp.n_head_kv;
	rp->cap = cap;
	const size_t H = (size_t)rp->n_layer * rp->n_kv_head;
	rp->in = malloc((RT_REPLAY_CHUNK + RT_REPLAY_ROOM) * sizeof *rp->in);
	rp->keep = malloc((size_t)cap * sizeof *rp->keep);
	rp->n_before = malloc(H * sizeof *rp->n_before);
	if (!rp->in || !rp->keep || !rp->n_before) {
		rt_replay_free(rp);
		return rt_err_set(err, "%s: replay: out of memory", m->path);
	}
	for (int32_t i = 0; i < cap; i++)
		rp->keep[i] = i;
	return 0;
}

void rt_replay_free(rt_replay *rp)
{
	free(rp->first);
	free(rp->next);
	free(rp->suffix);
	free(rp->tok);
	free(rp->score);
	free(rp->in);
	free(rp->keep);
	free(rp->n_before);
	memset(rp, 0, sizeof *rp);
}

void rt_replay_reset(rt_replay *rp)
{
	rp->n_tok = 0;
	rp->score_n = 0;
	rp->tokens = 0;
	rp->seconds = 0;
	rp->peak_entries = rp->peak_bytes = rp->peak_kvbytes = 0;
}

/* Room for n tokens and their scores. */
static int replay_grow(rt_replay *rp, int64_t n)
{
	if (n > rp->cap_tok) {
		int32_t *nt = realloc(rp->tok, (size_t)n * sizeof *nt);
		if (!nt)
			return -1;
		rp->tok = nt;
		rp->cap_tok = n;
	}
	const size_t need = (size_t)rp->n_layer * rp->n_kv_head * (size_t)n;
	if (need > rp->score_cap) {
		float *ns = realloc(rp->score, need * sizeof *ns);
		if (!ns)
			return -1;
		rp->score = ns;
		rp->score_cap = need;
	}
	return 0;
}

int rt_replay_reserve(rt_replay *rp, int64_t prompt_len)
{
	return prompt_len > 0 ? replay_grow(rp, prompt_len) : 0;
}

int rt_replay_record(rt_replay *rp, const int32_t *tok, int n, int64_t pos, int64_t prompt_len,
                     rt_err *err)
{
	if (prompt_len <= 0 || pos >= prompt_len || pos != rp->n_tok)
		return 0;
	const int64_t k = pos + n > prompt_len ? prompt_len - pos : n;
	if (rp->n_tok + k > rp->cap_tok && replay_grow(rp, prompt_len) != 0)
		return rt_err_set(err, "replay: out of memory for a prompt of %lld tokens",
		                  (long long)prompt_len);
	memcpy(rp->tok + rp->n_tok, tok, (size_t)k * sizeof *tok);
	rp->n_tok += k;
	return 0;
}

/* The forward's observe hook during a chunk: for each query head of the group, the
 * probabilities renormalised over kvpress's key set (rt_replay.h), maxed into the scores
 * of the chunk's positions. Each call writes only its own (layer, KV head) row. */
static void replay_observe(void *user, const rt_attn_view *v)
{
	rt_replay *rp = user;
	const int32_t *pos = v->head->pos;
	const int64_t s0 = rp->start, s1 = rp->end, pl = rp->prompt_len;
	const int64_t sink = s0 < RT_REPLAY_SINKS ? s0 : RT_REPLAY_SINKS;
	float *row = rp->score +
	             ((size_t)v->layer * rp->n_kv_head + (size_t)v->kv_head) * (size_t)rp->score_n;
	for (int r = 0; r < v->group; r++) {
		const float *p = v->probs + (size_t)r * v->probs_ld;
		double S = 0;
		for (int32_t i = 0; i < v->n_entries; i++)
			if (pos[i] < sink || (pos[i] >= s0 && pos[i] < s1) || pos[i] >= pl)
				S += p[i];
		if (!(S > 0))
			continue;
		const double inv = 1.0 / S;
		for (int32_t i = 0; i < v->n_entries; i++)
			if (pos[i] >= s0 && pos[i] < s1) {
				const float a = (float)(p[i] * inv);
				if (a > row[pos[i]])
					row[pos[i]] = a;
			}
	}
}

/* One chunk: prompt[start, end) after its instruction, at the positions after the prompt,
 * then its rows removed from every list. */
static int replay_chunk(rt_replay *rp, rt_fwd *f, rt_kv *kv, int64_t start, int64_t end,
                        rt_err *err)
{
	int n = 0;
	if (start == 0) {
		memcpy(rp->in, rp->first, (size_t)rp->n_first * sizeof *rp->in);
		n = rp->n_first;
	} else {
		memcpy(rp->in, rp->next, (size_t)rp->n_next * sizeof *rp->in);
		n = rp->n_next;
		const int64_t t0 = start - RT_REPLAY_TAIL < 0 ? 0 : start - RT_REPLAY_TAIL;
		memcpy(rp->in + n, rp->tok + t0, (size_t)(start - t0) * sizeof *rp->in);
		n += (int)(start - t0);
	}
	memcpy(rp->in + n, rp->suffix, (size_t)rp->n_suffix * sizeof *rp->in);
	n += rp->n_suffix;
	memcpy(rp->in + n, rp->tok + start, (size_t)(end - start) * sizeof *rp->in);
	n += (int)(end - start);
	const int64_t pl = rp->prompt_len;
	if (pl + n > f->m->hp.n_ctx)
		return rt_err_setc(err, RT_ERR_INPUT,
		                   "replay: a prompt of %lld tokens and its replayed chunk of %d "
		                   "reach position %lld, beyond the model's context_length %d",
		                   (long long)pl, n, (long long)(pl + n), (int)f->m->hp.n_ctx);
	const size_t H = (size_t)rp->n_layer * rp->n_kv_head;
	for (size_t i = 0; i < H; i++) {
		rp->n_before[i] = kv->heads[i].n;
		if (kv->heads[i].n + n > kv->cap)
			return rt_err_setc(err, RT_ERR_RESOURCE,
			                   "replay: the store holds %d entries per head, too few for the "
			                   "prompt and a replayed chunk of %d tokens",
			                   (int)kv->cap, n);
	}
	if (rt_kv_reserve(kv, n, err) != 0)
		return -1;
	rp->start = start;
	rp->end = end;
	const rt_fwd saved = *f;
	f->observe = replay_observe;
	f->observe_user = rp;
	f->observe_parallel = 1; /* each call writes its own (layer, KV head) row */
	f->on_append = NULL;
	f->on_layer = NULL;
	f->keep_windows = 1; /* the replay's rows go below; the window lists stay as they are */
	const int rc = rt_model_forward(f, kv, rp->in, n, (int32_t)pl, NULL, RT_LOGITS_NONE, err);
	f->keep_windows = saved.keep_windows;
	f->observe = saved.observe;
	f->observe_user = saved.observe_user;
	f->observe_parallel = saved.observe_parallel;
	f->on_append = saved.on_append;
	f->on_layer = saved.on_layer;
	const int64_t e = rt_kv_entries(kv), b = rt_kv_bytes_held(kv), kb = rt_kvbytes_held(kv);
	rp->peak_entries = e > rp->peak_entries ? e : rp->peak_entries;
	rp->peak_bytes = b > rp->peak_bytes ? b : rp->peak_bytes;
	rp->peak_kvbytes = kb > rp->peak_kvbytes ? kb : rp->peak_kvbytes;
	for (size_t i = 0; i < H; i++)
		if (kv->heads[i].n > rp->n_before[i])
			rt_kv_head_evict(kv, &kv->heads[i], rp->keep, rp->n_before[i]);
	rp->tokens += n;
	return rc;
}

int rt_replay_run(rt_replay *rp, rt_fwd *f, rt_kv *kv, int64_t prompt_len, rt_err *err)
{
	if (rp->n_tok < prompt_len || prompt_len <= 0)
		return rt_err_set(err, "replay: %lld of the prompt's %lld tokens were recorded",
		                  (long long)rp->n_tok, (long long)prompt_len);
	const double t0 = rt_now();
	const size_t need = (size_t)rp->n_layer * rp->n_kv_head * (size_t)prompt_len;
	if (replay_grow(rp, prompt_len) != 0)
		return rt_err_set(err, "replay: out of memory for %zu scores", need);
	memset(rp->score, 0, need * sizeof *rp->score);
	rp->score_n = prompt_len;
	rp->prompt_len = prompt_len;
	int rc = 0;
	for (int64_t s = 0; s < prompt_len && rc == 0; s += RT_REPLAY_CHUNK) {
		const int64_t e = s + RT_REPLAY_CHUNK < prompt_len ? s + RT_REPLAY_CHUNK : prompt_len;
		rc = replay_chunk(rp, f, kv, s, e, err);
	}
	rp->seconds += rt_now() - t0;
	return rc;
}
