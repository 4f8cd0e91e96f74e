/*
 * rt_serve_req: an OpenAI request body -> a req with its sequence: the fields this server
 * reads, the prompt (text, segments, token ids, or chat messages in the model's chat
 * template), the limits, the sampler, the stop strings and the "kv" extension (policy, ratio, parameters), checked with
 * the command line's messages; every error names its field (OpenAI's "param").
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/rt_kv.h"
#include "model/rt_chat.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_pick.h"
#include "serve/rt_serve_int.h"


/* ---- request validation --------------------------------------------------------------- */

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
	if (sp == RT_SPAN_PINNED)
		r->n_pinned += c;
	if (sp == RT_SPAN_SYSTEM)
		r->n_system += c;
	return 0;
}

/* The prompt r->prompt from np pieces of text (a completion's segments, a chat's
 * template parts and messages), piece k of span id span[k], tokenized as llama.cpp
 * tokenizes their concatenation with the file's BOS first as llama-server feeds it
 * (rt_tokenize_pieces: control tokens parsed only in pieces with special = 1); an id
 * belongs to the span of the piece holding its last byte (a protected segment's first word
 * is protected though its leading space ends the segment before). */
static int add_pieces(srv *S, req *r, const rt_tok_piece *p, const int *span, int np,
                      int64_t *cap, verr *e, const char *param)
{
	size_t bytes = 0;
	for (int k = 0; k < np; k++)
		bytes += p[k].len;
	if (bytes == 0) /* no text: no ids, not a lone BOS (the empty prompt is refused later) */
		return 0;
	rt_err err = { "" };
	int64_t c = 0;
	int32_t *of = NULL;
	int32_t *ids = rt_tokenize_pieces(S->tk, p, np, &c, &of, &err);
	if (!ids)
		return bad(e, 400, param, "%s: %s", param, err.msg);
	int rc = 0;
	if (r->n_prompt + c > S->m->hp.n_ctx)
		rc = bad(e, 400, param, "the prompt is longer than the model's context_length %d",
		         (int)S->m->hp.n_ctx);
	else if (c > 0)
		rc = prompt_reserve(r, c, cap, e);
	for (int64_t a = 0; rc == 0 && a < c;) { /* one commit per run of one span */
		int64_t b = a + 1;
		while (b < c && span[of[b]] == span[of[a]])
			b++;
		memcpy(r->prompt + r->n_prompt, ids + a, (size_t)(b - a) * sizeof *ids);
		rc = prompt_commit(S, r, b - a, span[of[a]], e, param);
		a = b;
	}
	free(ids);
	free(of);
	return rc;
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
		const rt_tok_piece one = { s, n, 0 };
		const int plain = 0;
		return add_pieces(S, r, &one, &plain, 1, &cap, e, "prompt");
	}
	if (!json_is_array(pr) || json_array_size(pr) == 0)
		return bad(e, 400, "prompt", "prompt must be a string or a non-empty array");
	if (json_is_number(json_array_get(pr, 0)))
		return add_ids(S, r, pr, &cap, e);
	const size_t np = json_array_size(pr);
	rt_tok_piece *pc = RT_MALLOC(np * sizeof *pc);
	int *span = RT_MALLOC(np * sizeof *span);
	size_t i;
	json_t *it;
	int strings = 0, rc = -1;
	json_array_foreach(pr, i, it)
	{
		int sp = 0;
		json_t *tx = it;
		if (json_is_string(it)) {
			if (++strings > 1) {
				bad(e, 400, "prompt", "one prompt per request (batched prompts are not served)");
				goto out;
			}
		} else if (json_is_array(it)) {
			bad(e, 400, "prompt", "one prompt per request (batched prompts are not served)");
			goto out;
		} else if (json_is_object(it)) {
			tx = json_object_get(it, "text");
			json_t *pt = json_object_get(it, "protect");
			if (pt && !json_is_boolean(pt)) {
				bad(e, 400, "prompt", "prompt[%zu].protect must be a boolean", i);
				goto out;
			}
			sp = json_is_true(pt) ? RT_SPAN_PINNED : 0;
		} else {
			bad(e, 400, "prompt", "prompt[%zu] must be a string or {\"text\", \"protect\"} "
			    "(or, in a token prompt, every element an integer)", i);
			goto out;
		}
		char what[48];
		snprintf(what, sizeof what, json_is_object(it) ? "prompt[%zu].text" : "prompt[%zu]", i);
		if (get_text(tx, what, &s, &n, e) != 0)
			goto out;
		pc[i] = (rt_tok_piece){ s, n, 0 };
		span[i] = sp;
	}
	/* the segments as one text: their edges change no id, only which span an id is in */
	rc = add_pieces(S, r, pc, span, (int)np, &cap, e, "prompt");
out:
	free(pc);
	free(span);
	return rc;
}

/* The messages of /v1/chat/completions, rendered in the model's chat template
 * (runtime/model/rt_chat.h: ChatML, Llama 3, Gemma, Mistral, ...): template markers are
 * tokenized as control tokens, message contents as plain text (so a message cannot
 * forge a turn); a system message is span `system`, a message with "protect": true span
 * `pinned`. Without a system message the template's default one (if any) comes first. */
static int parse_messages(srv *S, req *r, json_t *ms, verr *e)
{
	int64_t cap = 0;
	if (!json_is_array(ms) || json_array_size(ms) == 0)
		return bad(e, 400, "messages", "messages must be a non-empty array");
	const size_t nm = json_array_size(ms);
	rt_chat_msg *cm = RT_MALLOC(nm * sizeof *cm);
	int *span = RT_MALLOC(nm * sizeof *span);
	int rc = -1, ns = 0, *psp = NULL;
	rt_chat_seg *sg = NULL;
	rt_tok_piece *pc = NULL;
	size_t i;
	json_t *m;
	json_array_foreach(ms, i, m)
	{
		if (!json_is_object(m)) {
			bad(e, 400, "messages", "messages[%zu] must be an object", i);
			goto out;
		}
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!role || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
		              strcmp(role, "developer"))) {
			bad(e, 400, "messages", "messages[%zu].role must be system, developer, user or assistant", i);
			goto out;
		}
		json_t *pt = json_object_get(m, "protect");
		if (pt && !json_is_boolean(pt)) {
			bad(e, 400, "messages", "messages[%zu].protect must be a boolean", i);
			goto out;
		}
		const char *mk;
		json_t *mv;
		json_object_foreach(m, mk, mv) /* a misspelt "protect" must not drop the protection */
		{
			if (strcmp(mk, "role") && strcmp(mk, "content") && strcmp(mk, "protect") &&
			    strcmp(mk, "name")) {
				bad(e, 400, "messages", "messages[%zu]: unknown field '%s' (role, content, "
				    "protect; name is read and ignored)", i, mk);
				goto out;
			}
		}
		const char *s;
		size_t n;
		char what[48];
		snprintf(what, sizeof what, "messages[%zu].content", i);
		if (get_text(json_object_get(m, "content"), what, &s, &n, e) != 0)
			goto out;
		int sys = !strcmp(role, "system") || !strcmp(role, "developer");
		span[i] = json_is_true(pt) ? RT_SPAN_PINNED : sys ? RT_SPAN_SYSTEM : 0;
		cm[i] = (rt_chat_msg){role, s};
	}
	rt_err err = { "" };
	if (!(sg = rt_chat_segments(S->tk, cm, (int)nm, &ns, &err))) {
		bad(e, 400, "messages", "%s", err.msg);
		goto out;
	}
	pc = RT_MALLOC((size_t)(ns ? ns : 1) * sizeof *pc);
	psp = RT_MALLOC((size_t)(ns ? ns : 1) * sizeof *psp);
	for (int k = 0; k < ns; k++) {
		pc[k] = (rt_tok_piece){ sg[k].text, sg[k].len, sg[k].special };
		psp[k] = sg[k].msg >= 0 ? span[sg[k].msg] : 0;
	}
	rc = add_pieces(S, r, pc, psp, ns, &cap, e, "messages");
out:
	free(pc);
	free(psp);
	free(sg);
	free(cm);
	free(span);
	return rc;
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

/* The most prompt tokens r's sequence may take in one step (its scratch is sized for it):
 * up to the step's rows for a prompt longer than --chunk. parse_request narrows r's
 * chunk_max to --chunk where such chunks would raise the request's footprint. */
static int seq_max_chunk(const srv *S, const req *r)
{
	const rt_serve_cfg *c = S->cfg;
	const int64_t m = r->n_prompt < c->step_rows ? r->n_prompt : c->step_rows;
	return (int)(m > c->chunk ? m : c->chunk);
}

/* A request's spelling of each field of the policy choice (ORDER RT_PICK_FIELD), and the
 * field its 400 names (OpenAI's "param"). */
static const char *const kv_spellings[RT_PICK_N_FIELDS] = { "kv.policy",
	"this server's --kv-type", "kv.set", "kv.ratio", "kv.byte_ratio", "kv.prefill_chunk",
	"kv.min_kv" };
static const char *const kv_params[RT_PICK_N_FIELDS] = { "kv.policy", "kv.policy", "kv.set",
	"kv.ratio", "kv.byte_ratio", "kv.prefill_chunk", "kv.min_kv" };

/* The one policy choice (runtime/policy/rt_pick.h) of a request: the server's first
 * n_default --set values, then the request's kv.set, on the server's KV type. 0 with *pk
 * (the caller frees it), or -1 with the 400 in e. */
static int kv_pick(srv *S, const char *pname, int n_default, json_t *set, double ratio,
                   double bratio, int32_t pf, double min_kv, struct rt_pick *pk, verr *e)
{
	const rt_serve_cfg *c = S->cfg;
	const int n = n_default + (int)json_object_size(set);
	char (*own)[256] = calloc((size_t)(n > 0 ? n : 1), sizeof *own);
	const char **sets = calloc((size_t)(n > 0 ? n : 1), sizeof *sets);
	int k = 0, rc = -1;
	if (!own || !sets) {
		rc = bad(e, 503, NULL, "out of memory for the request's parameters");
		goto out;
	}
	for (; k < n_default; k++)
		sets[k] = c->sets[k];
	const char *key;
	json_t *v;
	json_object_foreach(set, key, v)
	{
		if (json_is_number(v))
			snprintf(own[k], sizeof own[k], "%s=%.17g", key, json_number_value(v));
		else if (json_is_string(v))
			snprintf(own[k], sizeof own[k], "%s=%s", key, json_string_value(v));
		else {
			bad(e, 400, "kv.set", "kv.set.%s must be a number or a string", key);
			goto out;
		}
		sets[k] = own[k];
		k++;
	}
	struct rt_pick_in in = { .reg = S->reg, .n_reg = S->n_reg, .policy = pname,
		.kv_type = (int)S->m->kv_type, .sets = sets, .n_sets = k, .ratio = ratio,
		.byte_ratio = bratio, .prefill_chunk = pf, .min_kv = min_kv, .spellings = kv_spellings };
	rt_err err = { "" };
	if (rt_pick(&in, pk, &err) != 0)
		bad(e, err.code == RT_ERR_INPUT ? 400 : 503, kv_params[pk->field], "%s", err.msg);
	else
		rc = 0;
out:
	free(own);
	free(sets);
	return rc;
}

/* The "kv" extension: policy, ratio (in entries, or byte_ratio in bytes), parameters and
 * prefill chunk, decoded here and chosen by the command line's rules (kv_pick, rt_pick),
 * then applied to r's new sequence. A request's policy other than the server's default
 * starts from its own parameters and budget; kv.ratio replaces the server's byte ratio
 * and kv.byte_ratio its ratio. */
static int parse_kv(srv *S, req *r, json_t *kv, verr *e)
{
	const rt_serve_cfg *c = S->cfg;
	const char *pname = c->policy ? c->policy : policy_at(S, 0)->name;
	double ratio = c->ratio, bratio = c->byte_ratio, pf = c->prefill_chunk, mkv = c->min_kv;
	json_t *set = NULL;
	int use_default_sets = 1;
	if (kv && !json_is_null(kv)) {
		if (!json_is_object(kv))
			return bad(e, 400, "kv", "kv must be an object {\"policy\", \"ratio\", "
			           "\"byte_ratio\", \"set\", \"prefill_chunk\", \"min_kv\", "
			           "\"share_prefix\"}");
		const char *key;
		json_t *v;
		json_object_foreach(kv, key, v)
		{
			if (strcmp(key, "policy") && strcmp(key, "ratio") && strcmp(key, "byte_ratio") &&
			    strcmp(key, "set") && strcmp(key, "prefill_chunk") && strcmp(key, "min_kv") &&
			    strcmp(key, "share_prefix"))
				return bad(e, 400, "kv", "kv: unknown field '%s' (policy, ratio, byte_ratio, "
				           "set, prefill_chunk, min_kv, share_prefix)", key);
		}
		json_t *sh = json_object_get(kv, "share_prefix");
		if (sh && !json_is_boolean(sh))
			return bad(e, 400, "kv.share_prefix", "kv.share_prefix must be true or false");
		if (sh)
			r->no_share = json_is_false(sh);
		const int got_pf = num_field(kv, "prefill_chunk", 0, 65536, 1, &pf, e);
		if (got_pf < 0 || num_field(kv, "min_kv", 0, 1 << 30, 1, &mkv, e) < 0)
			return -1;
		r->pf_fixed = got_pf > 0;
		json_t *pv = json_object_get(kv, "policy");
		if (pv) {
			if (!json_is_string(pv))
				return bad(e, 400, "kv.policy", "kv.policy must be a string");
			if (strcmp(json_string_value(pv), pname))
				use_default_sets = 0, ratio = 0, bratio = 0;
			pname = json_string_value(pv);
		}
		/* a request's ratio replaces the server's in either unit (both: rt_pick refuses) */
		json_t *rv = json_object_get(kv, "ratio"), *bv = json_object_get(kv, "byte_ratio");
		const int has_r = rv && !json_is_null(rv), has_b = bv && !json_is_null(bv);
		if (has_r && !json_is_number(rv))
			return bad(e, 400, "kv.ratio", "kv.ratio must be a number");
		if (has_b && !json_is_number(bv))
			return bad(e, 400, "kv.byte_ratio", "kv.byte_ratio must be a number");
		if (has_r || has_b) {
			ratio = has_r ? json_number_value(rv) : 0;
			bratio = has_b ? json_number_value(bv) : 0;
		}
		set = json_object_get(kv, "set");
		if (set && !json_is_object(set))
			return bad(e, 400, "kv.set", "kv.set must be an object of parameter values");
	}
	struct rt_pick pk;
	if (kv_pick(S, pname, use_default_sets ? c->n_sets : 0, set, ratio, bratio, (int32_t)pf,
	            mkv, &pk, e) != 0)
		return -1;
	r->min_kv = pk.min_kv;
	const struct kvp_policy *p = pk.p;
	r->pi = policy_find(S, p->name);
	rt_err err = { "" };
	int32_t cap = (int32_t)(r->n_prompt + r->max_tokens);
	if (rt_seq_init(&r->seq, S->m, p, cap, seq_max_chunk(S, r), r->n_prompt, &err) != 0) {
		rt_pick_free(&pk);
		return bad(e, srv_err_status(&err), NULL, "%s", err.msg);
	}
	r->seq_live = 1;
	rt_seq_use_spans(&r->seq);
	int rc = rt_seq_apply(&r->seq, &pk, &err);
	rt_pick_free(&pk);
	if (rc != 0)
		return bad(e, 400, "kv", "%s", err.msg);
	r->prefill_chunk = (int)(pf < c->chunk ? pf : c->chunk);
	r->pf_run = r->seq.run.prefill_chunk;
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

/* The whole request body: fills r or says why not (rt_serve_int.h). */
int srv_parse_request(srv *S, req *r, const char *body, size_t len, verr *e)
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
	/* prompt chunks beyond --chunk (up to the step's rows) where they cost no footprint: a
	 * policy that never compresses or compresses at the prompt end, a per-step one whose
	 * prefill chunk bounds them anyway */
	r->chunk_max = S->cfg->chunk;
	if (r->seq.max_chunk > S->cfg->chunk &&
	    rt_serve_footprint(&r->seq, r->n_prompt, r->max_tokens, r->seq.max_chunk) <= fp)
		r->chunk_max = r->seq.max_chunk;
	if (r->footprint > S->cfg->kv_memory) {
		/* the field to change: the answer's length when a shorter one fits, else the
		 * prompt (or the policy, which the message names) */
		const int64_t fp1 = rt_serve_footprint(&r->seq, r->n_prompt, 1, S->cfg->chunk);
		const int prompt = (int64_t)rt_kv_blocks_for((int32_t)fp1) * S->H *
		                   r->seq.kv.block_bytes > S->cfg->kv_memory;
		bad(e, 400, prompt ? (r->chat ? "messages" : "prompt") : mt_key,
		    "the request needs up to %lld bytes of KV memory (%lld entries per list under "
		    "policy %s), more than the server's --kv-memory %lld%s",
		    (long long)r->footprint, (long long)fp, policy_at(S, r->pi)->name,
		    (long long)S->cfg->kv_memory,
		    prompt ? ": the prompt alone does not fit (a shorter prompt, or a policy or "
		             "kv.ratio that keeps fewer entries)" : "; a smaller max_tokens may fit");
		goto out;
	}
	rc = 0;
out:
	json_decref(o);
	return rc;
}
