/*
 * rt_needle: builds passkey and needle-in-a-haystack prompts to an exact token count with
 * the model's tokenizer, finds the body of an Info haystack, and scores generated
 * answers. See rt_needle.h for the layouts and references.
 */
#include "eval/rt_needle.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "eval/rt_decode.h"
#include "eval/rt_stats.h"
#include "kv/rt_kvbytes.h"
#include "model/rt_chat.h"

/* Tokenize a NUL-terminated string into a fresh heap array; first: the prompt's first
 * piece, which starts with the file's BOS as llama.cpp feeds a prompt (rt_tokenize_prompt).
 * A needle prompt is assembled from its pieces' ids on purpose (the needle lands at an
 * exact token position, the filler repeats exactly), not tokenized as one text as a chat
 * is (rt_tokenize_pieces): on a SentencePiece vocabulary each piece then starts with its
 * own space, the same for every policy the prompt is run under. */
static int32_t *tok_str(const rt_tokenizer *t, const char *s, size_t len, int special, int first,
                        int64_t *n, rt_err *err)
{
	int64_t (*tok)(const rt_tokenizer *, const char *, size_t, int, int32_t *, int64_t, rt_err *) =
		first ? rt_tokenize_prompt : rt_tokenize;
	int64_t k = tok(t, s, len, special, NULL, 0, err);
	if (k < 0)
		return NULL;
	int32_t *ids = RT_MALLOC((size_t)(k ? k : 1) * sizeof(int32_t));
	if (tok(t, s, len, special, ids, k, err) != k) {
		free(ids);
		rt_err_set(err, "tokenizer: inconsistent token count");
		return NULL;
	}
	*n = k;
	return ids;
}

/* The chat template's pieces around the user message (runtime/model/rt_chat.h), e.g. for
 * ChatML opener = "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\n",
 * closer = "<|im_end|>\n<|im_start|>assistant\n". Heap strings; -1 with err when the
 * model's template is not supported. */
static int chat_split(const rt_tokenizer *t, char **opener, char **closer, rt_err *err)
{
	static const char mark[] = "\x01kvpc-user\x01";
	char *r = rt_chat_render(t, NULL, mark, err);
	if (!r)
		return -1;
	char *m = strstr(r, mark);
	RT_ASSERT(m != NULL);
	size_t ol = (size_t)(m - r);
	*opener = RT_MALLOC(ol + 1);
	memcpy(*opener, r, ol);
	(*opener)[ol] = '\0';
	const char *c = m + strlen(mark);
	*closer = RT_MALLOC(strlen(c) + 1);
	strcpy(*closer, c);
	free(r);
	return 0;
}

/* Concatenate up to 4 strings (NULL ends) into a heap string. */
static char *cat(const char *a, const char *b, const char *c, const char *d)
{
	const char *v[4] = {a, b, c, d};
	size_t n = 0;
	for (int i = 0; i < 4 && v[i]; i++)
		n += strlen(v[i]);
	char *s = RT_MALLOC(n + 1);
	s[0] = '\0';
	for (int i = 0; i < 4 && v[i]; i++)
		strcat(s, v[i]);
	return s;
}

void rt_needle_prompt_free(rt_needle_prompt *p)
{
	if (!p)
		return;
	free(p->ctx);
	free(p->question);
	memset(p, 0, sizeof(*p));
}

uint32_t rt_needle_passkey_for_seed(uint64_t seed)
{
	rt_rng r;
	rt_rng_seed(&r, seed);
	return (uint32_t)(1 + rt_rng_below(&r, 50000));
}

/* Build the prefix / question strings for a task. */
static int task_strings(const rt_tokenizer *t, int chat, const char *instruction,
                        const char *question, const char *prime, char **prefix, char **q,
                        rt_err *err)
{
	if (chat) {
		char *op, *cl;
		if (chat_split(t, &op, &cl, err) != 0)
			return -1;
		*prefix = cat(op, instruction, NULL, NULL);
		*q = cat("\n", question, cl, prime);
		free(op);
		free(cl);
	} else {
		*prefix = cat(instruction, NULL, NULL, NULL);
		*q = cat(instruction[0] ? "\n" : "\n\n", question, " ", prime);
	}
	return 0;
}

/* The tokens left for the haystack when a prompt of n_tokens has fixed tokens of prefix,
 * needle and question; -1 with err (naming task) when there are fewer than fixed. */
static int64_t hay_room(const char *task, int64_t n_tokens, int64_t fixed, rt_err *err)
{
	if (n_tokens < fixed) {
		rt_err_set(err, "%s: %lld tokens is too short; the fixed parts take %lld", task,
		           (long long)n_tokens, (long long)fixed);
		return -1;
	}
	return n_tokens - fixed;
}

/* out->ctx (allocated here, owned by out) = the prefix tp[np], then nh_total hay tokens
 * cycling over th[nh] with needle j (tn[j][nn[j]]) inserted after the first ins[j] of them
 * (needles at one offset in j order); pos[j] gets needle j's offset in ctx. Sets n_ctx,
 * hay_start and hay_tokens. */
static void ctx_assemble_n(rt_needle_prompt *out, const int32_t *tp, int64_t np,
                           const int32_t *th, int64_t nh, int64_t nh_total,
                           int32_t *const *tn, const int64_t *nn, const int64_t *ins, int n,
                           int64_t *pos)
{
	int64_t total = np + nh_total;
	for (int j = 0; j < n; j++)
		total += nn[j];
	out->n_ctx = total;
	out->ctx = RT_MALLOC((size_t)total * sizeof(int32_t));
	memcpy(out->ctx, tp, (size_t)np * sizeof(int32_t));
	int64_t o = np;
	for (int64_t i = 0; i <= nh_total; i++) {
		for (int j = 0; j < n; j++)
			if (ins[j] == i) {
				pos[j] = o;
				memcpy(out->ctx + o, tn[j], (size_t)nn[j] * sizeof(int32_t));
				o += nn[j];
			}
		if (i < nh_total)
			out->ctx[o++] = th[i % nh];
	}
	RT_ASSERT(o == out->n_ctx);
	out->hay_start = np;
	out->hay_tokens = nh_total;
}

/* ctx_assemble_n with one needle; sets needle_pos and needle_len too. */
static void ctx_assemble(rt_needle_prompt *out, const int32_t *tp, int64_t np,
                         const int32_t *th, int64_t nh, int64_t nh_total, int32_t *tn,
                         int64_t nn, int64_t ins)
{
	ctx_assemble_n(out, tp, np, th, nh, nh_total, &tn, &nn, &ins, 1, &out->needle_pos);
	out->needle_len = nn;
}

/* The filler-repeat boundary (a multiple of nf, at most F) nearest to depth% of F. */
static int64_t filler_slot(double depth, int64_t F, int64_t nf)
{
	int64_t s = (int64_t)llround(depth / 100.0 * (double)F / (double)nf) * nf;
	while (s > F)
		s -= nf;
	return s;
}

int rt_needle_passkey(const rt_tokenizer *t, int64_t n_tokens, double depth, uint64_t seed,
                      int chat, rt_needle_prompt *out, rt_err *err)
{
	memset(out, 0, sizeof(*out));
	if (!(depth >= 0.0 && depth <= 100.0))
		return rt_err_set(err, "passkey: depth %g%% outside [0, 100]", depth);
	uint32_t key = rt_needle_passkey_for_seed(seed);
	char needle[160];
	snprintf(needle, sizeof(needle), " The pass key is %u. Remember it. %u is the pass key.",
	         key, key);
	char *prefix, *qs;
	if (task_strings(t, chat, RT_PASSKEY_INSTRUCTION, RT_PASSKEY_QUESTION, RT_PASSKEY_PRIME,
	                 &prefix, &qs, err) != 0)
		return -1;
	int64_t np = 0, nf = 0, nn = 0, nq = 0;
	int32_t *tp = tok_str(t, prefix, strlen(prefix), chat, 1, &np, err);
	int32_t *tf = tp ? tok_str(t, RT_PASSKEY_FILLER, strlen(RT_PASSKEY_FILLER), 0, 0, &nf, err)
	                 : NULL;
	int32_t *tn = tf ? tok_str(t, needle, strlen(needle), 0, 0, &nn, err) : NULL;
	int32_t *tq = tn ? tok_str(t, qs, strlen(qs), chat, 0, &nq, err) : NULL;
	free(prefix);
	free(qs);
	int rc = -1;
	if (!tq)
		goto done;
	RT_ASSERT(nf > 0);
	int64_t F = hay_room("passkey", n_tokens, np + nn + nq, err);
	if (F < 0)
		goto done;
	double want = depth / 100.0 * (double)F;
	out->kind = RT_NEEDLE_PASSKEY;
	ctx_assemble(out, tp, np, tf, nf, F, tn, nn, filler_slot(depth, F, nf));
	out->question = tq;
	out->n_question = nq;
	tq = NULL;
	out->target_pos = np + (int64_t)llround(want);
	out->unit = nf;
	out->depth = depth;
	out->passkey = key;
	snprintf(out->answer, sizeof(out->answer), "%u", key);
	rc = 0;
done:
	free(tp);
	free(tf);
	free(tn);
	free(tq);
	return rc;
}

int rt_needle_multikey(const rt_tokenizer *t, int64_t n_tokens, double depth, uint64_t seed,
                       int chat, rt_needle_prompt *out, rt_err *err)
{
	enum { N = RT_MULTIKEY_N };
	static const char *const labels[N] = RT_MULTIKEY_LABELS;
	memset(out, 0, sizeof(*out));
	if (!(depth >= 0.0 && depth <= 100.0))
		return rt_err_set(err, "multikey: depth %g%% outside [0, 100]", depth);
	uint64_t ks = seed * N;
	for (int j = 0; j < N; j++) {
		int again;
		do {
			out->keys[j] = rt_needle_passkey_for_seed(ks++);
			again = 0;
			for (int i = 0; i < j; i++)
				again |= out->keys[i] == out->keys[j];
		} while (again);
	}
	const char *asked = labels[seed % N];
	char q[96], prime[96];
	snprintf(q, sizeof q, "What is the pass key of the %s door?", asked);
	snprintf(prime, sizeof prime, "The pass key of the %s door is", asked);
	char *prefix, *qs;
	if (task_strings(t, chat, RT_PASSKEY_INSTRUCTION, q, prime, &prefix, &qs, err) != 0)
		return -1;
	int64_t np = 0, nf = 0, nq = 0, nn[N] = { 0 }, fixed = 0;
	int32_t *tn[N] = { NULL };
	int32_t *tp = tok_str(t, prefix, strlen(prefix), chat, 1, &np, err);
	int32_t *tf = tp ? tok_str(t, RT_PASSKEY_FILLER, strlen(RT_PASSKEY_FILLER), 0, 0, &nf, err)
	                 : NULL;
	int ok = tf != NULL;
	for (int j = 0; j < N && ok; j++) {
		const char *lb = labels[(seed + (uint64_t)j) % N];
		char needle[200];
		snprintf(needle, sizeof needle, " The pass key of the %s door is %u. Remember it. %u "
		         "is the pass key of the %s door.", lb, out->keys[j], out->keys[j], lb);
		ok = (tn[j] = tok_str(t, needle, strlen(needle), 0, 0, &nn[j], err)) != NULL;
		fixed += nn[j];
	}
	int32_t *tq = ok ? tok_str(t, qs, strlen(qs), chat, 0, &nq, err) : NULL;
	free(prefix);
	free(qs);
	int rc = -1;
	if (!tq)
		goto done;
	int64_t F = hay_room("multikey", n_tokens, np + fixed + nq, err);
	if (F < 0)
		goto done;
	int64_t ins[N];
	for (int j = 0; j < N; j++) {
		double d = depth + j * 100.0 / N;
		ins[j] = filler_slot(d > 100.0 ? d - 100.0 : d, F, nf);
	}
	out->kind = RT_NEEDLE_MULTIKEY;
	ctx_assemble_n(out, tp, np, tf, nf, F, tn, nn, ins, N, out->key_pos);
	out->needle_pos = out->key_pos[0];
	out->needle_len = nn[0];
	out->question = tq;
	out->n_question = nq;
	tq = NULL;
	out->target_pos = np + (int64_t)llround(depth / 100.0 * (double)F);
	out->unit = nf;
	out->depth = depth;
	out->passkey = out->keys[0];
	snprintf(out->answer, sizeof(out->answer), "%u", out->keys[0]);
	rc = 0;
done:
	free(tp);
	free(tf);
	for (int j = 0; j < N; j++)
		free(tn[j]);
	free(tq);
	return rc;
}

/* The tokens tp[0..np) of the rendered text rd whose bytes overlap the system message sys:
 * *pos, *len. Each token's bytes (rt_token_to_bytes) must follow on in rd; a BOS the
 * tokenizer adds before the text takes none, and a SentencePiece token that carries the
 * space its tokenizer put before the text (add_space_prefix) takes its bytes but that space.
 * Where the walk fails (a template that rewrites the message, a token that is not its
 * text, no memory for a token longer than the stack buffer) *len is 0: the message is not
 * placed, and nothing is marked (needle says so). */
static void sys_span(const rt_tokenizer *t, const char *rd, const char *sys, const int32_t *tp,
                     int64_t np, int64_t *pos, int64_t *len)
{
	*pos = *len = 0;
	const char *m = strstr(rd, sys);
	if (!m || !*sys)
		return;
	const size_t lo = (size_t)(m - rd), hi = lo + strlen(sys), n = strlen(rd);
	size_t at = 0;
	int64_t p0 = 0, p1 = 0;
	char stack[256]; /* a token's bytes; a longer one gets the heap */
	for (int64_t i = 0; i < np; i++) {
		const int need = rt_token_to_bytes(t, tp[i], NULL, 0);
		char *buf = need > (int)sizeof stack ? malloc((size_t)need) : stack;
		if (!buf)
			return;
		int b = need > 0 ? rt_token_to_bytes(t, tp[i], buf, need) : need;
		const char *x = buf;
		if (b > 0 && buf[0] == ' ' && (at >= n || rd[at] != ' '))
			x++, b--; /* the tokenizer's own space prefix */
		const int ok = b >= 0 && at + (size_t)b <= n && (b == 0 || !memcmp(rd + at, x, (size_t)b));
		if (buf != stack)
			free(buf);
		if (!ok) {
			if (i == 0 && tp[0] == rt_tokenizer_bos(t))
				continue; /* an added BOS */
			return;
		}
		if (b > 0 && at < hi && at + (size_t)b > lo) {
			if (p1 == 0)
				p0 = i;
			p1 = i + 1;
		}
		at += (size_t)b;
	}
	*pos = p0;
	*len = p1 - p0;
}

int rt_needle_instruct(const rt_tokenizer *t, int64_t n_tokens, uint64_t seed,
                       rt_needle_prompt *out, rt_err *err)
{
	static const char *const lists[RT_INSTRUCT_N][4] = { RT_INSTRUCT_NAMES, RT_INSTRUCT_PETS,
		                                             RT_INSTRUCT_CITIES };
	memset(out, 0, sizeof(*out));
	rt_rng r;
	rt_rng_seed(&r, seed);
	for (int i = 0; i < RT_INSTRUCT_N; i++)
		snprintf(out->words[i], sizeof out->words[i], "%s", lists[i][rt_rng_below(&r, 4)]);
	char sys[256];
	snprintf(sys, sizeof sys, RT_INSTRUCT_SYSTEM, out->words[0], out->words[1], out->words[2]);
	static const char mark[] = "\x01kvpc-user\x01";
	char *rd = rt_chat_render(t, sys, mark, err);
	if (!rd)
		return -1;
	char *m = strstr(rd, mark);
	RT_ASSERT(m != NULL);
	*m = '\0';
	char *qs = cat("\n", RT_INSTRUCT_QUESTION, m + strlen(mark), NULL);
	int64_t np = 0, nf = 0, nq = 0;
	int32_t *tp = tok_str(t, rd, strlen(rd), 1, 1, &np, err);
	if (tp)
		sys_span(t, rd, sys, tp, np, &out->sys_pos, &out->sys_len);
	int32_t *tf = tp ? tok_str(t, RT_PASSKEY_FILLER, strlen(RT_PASSKEY_FILLER), 0, 0, &nf, err)
	                 : NULL;
	int32_t *tq = tf ? tok_str(t, qs, strlen(qs), 1, 0, &nq, err) : NULL;
	free(rd);
	free(qs);
	int rc = -1;
	if (!tq)
		goto done;
	int64_t F = hay_room("instruct", n_tokens, np + nq, err);
	if (F < 0)
		goto done;
	out->kind = RT_NEEDLE_INSTRUCT;
	ctx_assemble_n(out, tp, np, tf, nf, F, NULL, NULL, NULL, 0, NULL);
	out->needle_pos = np;
	out->question = tq;
	out->n_question = nq;
	tq = NULL;
	out->unit = nf;
	snprintf(out->answer, sizeof(out->answer), "%s; %s; %s", out->words[0], out->words[1],
	         out->words[2]);
	rc = 0;
done:
	free(tp);
	free(tf);
	free(tq);
	return rc;
}

/* Copy text[0..n) replacing invalid UTF-8 and control bytes (not tab/newline) by ' '. */
static char *clean_text(const char *text, size_t n)
{
	char *s = RT_MALLOC(n + 1);
	size_t i = 0;
	while (i < n) {
		unsigned char c = (unsigned char)text[i];
		if (c < 0x80) {
			s[i] = (c < 0x20 && c != '\t' && c != '\n') || c == 0x7f ? ' ' : (char)c;
			i++;
			continue;
		}
		size_t k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
		size_t bad;
		if (k > 1 && i + k <= n && rt_utf8_valid(text + i, k, &bad)) {
			memcpy(s + i, text + i, k);
			i += k;
		} else {
			s[i++] = ' ';
		}
	}
	s[n] = '\0';
	return s;
}

/* line_end = 0: 1 if the token's text, ignoring trailing white space, ends with '.'.
 * line_end = 1: 1 if the token's text ends with a newline. */
static int ends_boundary(const rt_tokenizer *t, int32_t id, int line_end)
{
	char b[256];
	int l = rt_token_to_bytes(t, id, b, (int)sizeof(b));
	if (l <= 0 || l > (int)sizeof(b))
		return 0;
	if (line_end)
		return b[l - 1] == '\n';
	while (l > 0 && (b[l - 1] == ' ' || b[l - 1] == '\n' || b[l - 1] == '\t'))
		l--;
	return l > 0 && b[l - 1] == '.';
}

int rt_needle_niah(const rt_tokenizer *t, const char *text, size_t len, int64_t n_tokens,
                   double depth, int chat, rt_needle_prompt *out, rt_err *err)
{
	memset(out, 0, sizeof(*out));
	if (!(depth >= 0.0 && depth <= 100.0))
		return rt_err_set(err, "niah: depth %g%% outside [0, 100]", depth);
	if (len == 0)
		return rt_err_set(err, "niah: empty haystack text");
	static const char needle[] = "\n" RT_NIAH_NEEDLE "\n";
	char *prefix, *qs;
	if (task_strings(t, chat, "", RT_NIAH_QUESTION, RT_NIAH_PRIME, &prefix, &qs, err) != 0)
		return -1;
	int64_t np = 0, nn = 0, nq = 0, nh = 0;
	int32_t *tp = tok_str(t, prefix, strlen(prefix), chat, 1, &np, err);
	int32_t *tn = tp ? tok_str(t, needle, strlen(needle), 0, 0, &nn, err) : NULL;
	int32_t *tq = tn ? tok_str(t, qs, strlen(qs), chat, 0, &nq, err) : NULL;
	int32_t *th = NULL;
	free(prefix);
	free(qs);
	int rc = -1;
	if (!tq)
		goto done;
	int64_t H = hay_room("niah", n_tokens, np + nn + nq, err);
	if (H < 0)
		goto done;
	/* Tokenize a growing prefix of the text until it yields H tokens (plus a margin,
	 * since the cut may split the last word), or the whole text. */
	size_t take = (size_t)H * 6 + 4096;
	for (;;) {
		int whole = take >= len;
		size_t n = whole ? len : take;
		while (!whole && n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80)
			n--; /* cut at a character boundary */
		char *c = clean_text(text, n);
		free(th);
		th = tok_str(t, c, n, 0, 0, &nh, err);
		free(c);
		if (!th)
			goto done;
		if (whole || nh >= H + 16)
			break;
		take *= 2;
	}
	if (nh == 0) {
		rt_err_set(err, "niah: haystack text has no tokens");
		goto done;
	}
	int64_t want = (int64_t)llround(depth / 100.0 * (double)H);
	int64_t ins = want;
	if (want < H) {
		/* back to just after a '.' token; else a line end; else the exact offset */
		int64_t lim = want > RT_NIAH_MAX_BACK ? want - RT_NIAH_MAX_BACK : 0;
		int found = 0;
		for (int pass = 0; pass < 2 && !found; pass++)
			for (int64_t k = want; k >= lim; k--) {
				if (k == 0 || ends_boundary(t, th[(k - 1) % nh], pass)) {
					ins = k;
					found = 1;
					break;
				}
			}
	}
	out->kind = RT_NEEDLE_NIAH;
	ctx_assemble(out, tp, np, th, nh, H, tn, nn, ins);
	out->question = tq;
	out->n_question = nq;
	tq = NULL;
	out->target_pos = np + want;
	out->unit = 0;
	out->depth = depth;
	snprintf(out->answer, sizeof(out->answer), "sandwich; Dolores Park");
	rc = 0;
done:
	free(tp);
	free(tn);
	free(tq);
	free(th);
	return rc;
}

/* ---- haystack files -------------------------------------------------------------------- */

size_t rt_needle_info_body(const char *text, size_t len)
{
	int seen = 0;
	for (size_t i = 0; i + 1 < len; i++)
		if (text[i] == '\x1f' && text[i + 1] == '\n' && ++seen == 2)
			return i + 2;
	return 0;
}

/* ---- scoring --------------------------------------------------------------------------- */

int rt_needle_score_passkey(const char *g, uint32_t key)
{
	char want[16];
	snprintf(want, sizeof(want), "%u", key);
	const char *p = g;
	while (*p && !isdigit((unsigned char)*p))
		p++;
	if (!*p)
		return 0;
	size_t n = 0;
	while (isdigit((unsigned char)p[n]))
		n++;
	return n == strlen(want) && !strncmp(p, want, n);
}

static int contains_ci(const char *hay, const char *needle)
{
	size_t n = strlen(needle);
	for (const char *p = hay; *p; p++)
		if (!strncasecmp(p, needle, n))
			return 1;
	return 0;
}

int rt_needle_score_niah(const char *g)
{
	return contains_ci(g, "sandwich") && contains_ci(g, "Dolores Park");
}

unsigned rt_needle_instruct_checks(const rt_needle_prompt *p, const char *g)
{
	unsigned c = 0;
	for (int i = 0; i < RT_INSTRUCT_N; i++)
		if (p->words[i][0] && contains_ci(g, p->words[i]))
			c |= 1u << i;
	return c;
}

static int bits_set(unsigned c)
{
	int n = 0;
	for (; c; c &= c - 1)
		n++;
	return n;
}

int rt_needle_instruct_vs_ref(unsigned run, unsigned ref, int *followed, int *followed_ref)
{
	*followed += bits_set(run & ref);
	*followed_ref += bits_set(ref);
	return (run & ref) == ref;
}

int rt_needle_score(const rt_needle_prompt *p, const char *generated)
{
	switch (p->kind) {
	case RT_NEEDLE_PASSKEY:
	case RT_NEEDLE_MULTIKEY:
		return rt_needle_score_passkey(generated, p->passkey);
	case RT_NEEDLE_INSTRUCT:
		return rt_needle_instruct_checks(p, generated) == (1u << RT_INSTRUCT_N) - 1;
	case RT_NEEDLE_NIAH:
		break;
	}
	return rt_needle_score_niah(generated);
}

/* ---- one trial -------------------------------------------------------------------------- */

/* Feed tokens[0..n) to every sequence (through b, or to the one sequence). */
static int trial_feed(rt_seq *const *s, rt_seq_batch *b, const int32_t *t, int64_t n,
                      float *logits, enum rt_logits_mode mode, rt_err *err)
{
	return b ? rt_seq_batch_feed(b, t, n, logits, mode, err)
	         : rt_seq_feed(s[0], t, n, logits, mode, err);
}

int rt_needle_trial(rt_seq *const *s, int K, rt_seq_batch *b, const rt_tokenizer *tk,
                    const rt_needle_prompt *np, const rt_needle_how *how, float *logits,
                    float *one, rt_needle_answer *ans, rt_err *err)
{
	RT_ASSERT(K >= 1 && (b || K == 1));
	const int V = s[0]->m->hp.n_vocab;
	int64_t plen = how->agnostic ? np->n_ctx : np->n_ctx + np->n_question;
	for (int k = 0; k < K; k++)
		rt_seq_reset(s[k], plen);
	/* the prompt in lockstep (or alone), the question's tokens marked when asked, then
	 * each sequence's answer on its own */
	for (int k = 0; how->mark_system && k < K; k++) /* the prompt stays one feed */
		rt_seq_span_range(s[k], RT_SPAN_SYSTEM, np->sys_pos, np->sys_len);
	int rc = trial_feed(s, b, np->ctx, np->n_ctx, NULL, RT_LOGITS_NONE, err);
	for (int k = 0; k < K; k++)
		rt_seq_span_range(s[k], 0, 0, 0);
	for (int k = 0; how->mark_question && k < K; k++)
		rt_seq_span(s[k], RT_SPAN_QUESTION);
	if (rc == 0)
		rc = trial_feed(s, b, np->question, np->n_question, logits, RT_LOGITS_LAST, err);
	for (int k = 0; k < K; k++)
		rt_seq_span(s[k], 0);
	for (int k = 0; rc == 0 && k < K; k++) {
		rt_needle_answer *a = &ans[k];
		a->left = b && rt_seq_batch_error(b, k);
		if (a->left)
			continue;
		memcpy(one, logits + (size_t)k * V, (size_t)V * sizeof *one);
		if (rt_decode(s[k], tk, NULL, one, how->n_gen, a->gen, sizeof a->gen, NULL, err) < 0)
			return -1;
		a->correct = rt_needle_score(np, a->gen);
		a->checks = np->kind == RT_NEEDLE_INSTRUCT ? rt_needle_instruct_checks(np, a->gen) : 0;
		snprintf(a->answer, sizeof a->answer, "%s", np->answer);
		/* an answer cut inside a multi-byte character keeps its valid prefix */
		size_t bad;
		if (!rt_utf8_valid(a->gen, strlen(a->gen), &bad))
			a->gen[bad] = 0;
		a->st = rt_seq_stats_get(s[k]);
		rt_compression_of(s[k], s[k]->run.ctx.seen, &a->x);
	}
	return rc;
}
