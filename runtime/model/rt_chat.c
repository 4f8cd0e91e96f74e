/*
 * rt_chat: chat template families (see rt_chat.h for the formats). One table row per
 * family gives the text around each role's turn; one renderer walks the messages.
 */
#include "model/rt_chat.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How a family trims message contents (llama.cpp's trim(): ASCII whitespace). */
enum { TRIM_NONE, TRIM_ALL, TRIM_ASSISTANT };

/* One family. sys_open NULL: no system turn; the pending system text goes, between
 * sys_pre and sys_post, at the start of the next user turn. user_next opens a user turn
 * that follows an assistant one (NULL: user_open). gen is the generation prompt. */
typedef struct chat_tmpl {
	const char *name;
	const char *sys_open, *sys_close, *sys_pre, *sys_post;
	const char *user_open, *user_next, *user_close;
	const char *asst_open, *asst_close, *gen;
	int trim;
} chat_tmpl;

#define SH "<|start_header_id|>"
#define EH "<|end_header_id|>\n\n"
#define CHAT_ROWS(X) \
	X(CHATML, "chatml", "<|im_start|>system\n", "<|im_end|>\n", NULL, NULL, "<|im_start|>user\n", \
	  NULL, "<|im_end|>\n", "<|im_start|>assistant\n", "<|im_end|>\n", "<|im_start|>assistant\n", TRIM_NONE) \
	X(LLAMA3, "llama3", SH "system" EH, "<|eot_id|>", NULL, NULL, SH "user" EH, NULL, "<|eot_id|>", \
	  SH "assistant" EH, "<|eot_id|>", SH "assistant" EH, TRIM_ALL) \
	X(GEMMA, "gemma", NULL, NULL, "", "\n\n", "<start_of_turn>user\n", NULL, "<end_of_turn>\n", \
	  "<start_of_turn>model\n", "<end_of_turn>\n", "<start_of_turn>model\n", TRIM_ALL) \
	X(MISTRAL_V1, "mistral-v1", NULL, NULL, "", "\n\n", " [INST] ", NULL, " [/INST]", " ", "</s>", "", \
	  TRIM_NONE) \
	X(MISTRAL_V3, "mistral-v3", NULL, NULL, "", "\n\n", "[INST] ", NULL, "[/INST]", " ", "</s>", "", \
	  TRIM_ASSISTANT) \
	X(MISTRAL_V3_TEKKEN, "mistral-v3-tekken", NULL, NULL, "", "\n\n", "[INST]", NULL, "[/INST]", "", \
	  "</s>", "", TRIM_NONE) \
	X(MISTRAL_V7, "mistral-v7", "[SYSTEM_PROMPT] ", "[/SYSTEM_PROMPT]", NULL, NULL, "[INST] ", NULL, \
	  "[/INST]", " ", "</s>", "", TRIM_NONE) \
	X(LLAMA2, "llama2", NULL, NULL, "", "\n", "[INST] ", "[INST] ", " [/INST]", "", "</s>", "", TRIM_NONE) \
	X(LLAMA2_SYS, "llama2-sys", NULL, NULL, "<<SYS>>\n", "\n<</SYS>>\n\n", "[INST] ", "[INST] ", \
	  " [/INST]", "", "</s>", "", TRIM_NONE) \
	X(LLAMA2_SYS_BOS, "llama2-sys-bos", NULL, NULL, "<<SYS>>\n", "\n<</SYS>>\n\n", "[INST] ", \
	  "<s>[INST] ", " [/INST]", "", "</s>", "", TRIM_NONE) \
	X(LLAMA2_SYS_STRIP, "llama2-sys-strip", NULL, NULL, "<<SYS>>\n", "\n<</SYS>>\n\n", "[INST] ", \
	  "[INST] ", " [/INST]", "", "</s>", "", TRIM_ALL) \
	X(PHI3, "phi3", "<|system|>\n", "<|end|>\n", NULL, NULL, "<|user|>\n", NULL, "<|end|>\n", \
	  "<|assistant|>\n", "<|end|>\n", "<|assistant|>\n", TRIM_NONE)

enum {
#define CHAT_ID(id, ...) CHAT_##id,
	CHAT_ROWS(CHAT_ID)
#undef CHAT_ID
	CHAT_N
};

static const chat_tmpl TMPL[CHAT_N] = {
#define CHAT_ROW(id, n, so, sc, sp, sq, uo, un, uc, ao, ac, g, tr) {n, so, sc, sp, sq, uo, un, uc, ao, ac, g, tr},
	CHAT_ROWS(CHAT_ROW)
#undef CHAT_ROW
};

static int has(const char *s, size_t n, const char *lit)
{
	return memmem(s, n, lit, strlen(lit)) != NULL;
}

/* The Mistral/Llama 2 branch of llm_chat_detect_template. */
static int detect_inst(const char *s, size_t n)
{
	if (has(s, n, "[SYSTEM_PROMPT]"))
		return CHAT_MISTRAL_V7;
	if (has(s, n, "' [INST] ' + system_message") || has(s, n, "[AVAILABLE_TOOLS]")) {
		if (has(s, n, " [INST]"))
			return CHAT_MISTRAL_V1;
		return has(s, n, "\"[INST]\"") ? CHAT_MISTRAL_V3_TEKKEN : CHAT_MISTRAL_V3;
	}
	if (has(s, n, "content.strip()"))
		return CHAT_LLAMA2_SYS_STRIP;
	if (has(s, n, "bos_token + '[INST]"))
		return CHAT_LLAMA2_SYS_BOS;
	return has(s, n, "<<SYS>>") ? CHAT_LLAMA2_SYS : CHAT_LLAMA2;
}

/* The family of template text s[0..n), or -1 (with *name the llama.cpp family we do not
 * render, when it is one). */
static int chat_detect(const char *s, size_t n, const char **name)
{
	/* llm_chat_detect_template's checks in its order, up to the last family we render;
	 * the families it finds first that we do not render are refused by name */
	static const char *const BEFORE_GEMMA[][3] = {
		{"[gMASK]<sop>", NULL, "chatglm4"}, {"<|assistant|>", "<|user|>", "glmedge/falcon3/exaone-moe"},
		{"<|user|>", "<|endoftext|>", "zephyr"}, {"bos_token + message['role']", NULL, "monarch"},
	};
	*name = NULL;
	if (has(s, n, "<|im_start|>")) {
		if (has(s, n, "<|im_sep|>") || has(s, n, "<end_of_utterance>")) {
			*name = has(s, n, "<|im_sep|>") ? "phi4" : "smolvlm";
			return -1;
		}
		return CHAT_CHATML;
	}
	if ((n >= 7 && !memcmp(s, "mistral", 7)) || has(s, n, "[INST]"))
		return detect_inst(s, n);
	if (has(s, n, "<|assistant|>") && has(s, n, "<|end|>"))
		return CHAT_PHI3;
	for (size_t i = 0; i < sizeof BEFORE_GEMMA / sizeof BEFORE_GEMMA[0]; i++) {
		const char *const *u = BEFORE_GEMMA[i];
		if (has(s, n, u[0]) && (!u[1] || has(s, n, u[1]))) {
			*name = u[2];
			return -1;
		}
	}
	if (has(s, n, "<start_of_turn>"))
		return CHAT_GEMMA;
	static const char *const BEFORE_LLAMA3[][3] = {
		{"'\\n\\nAssistant: ' + eos_token", NULL, "orion"}, {"GPT4 Correct ", NULL, "openchat"},
		{"USER: ", "ASSISTANT: ", "vicuna"}, {"### Instruction:", "<|EOT|>", "deepseek"},
		{"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "command-r"},
	};
	for (size_t i = 0; i < sizeof BEFORE_LLAMA3 / sizeof BEFORE_LLAMA3[0]; i++) {
		const char *const *u = BEFORE_LLAMA3[i];
		if (has(s, n, u[0]) && (!u[1] || has(s, n, u[1]))) {
			*name = u[2];
			return -1;
		}
	}
	if (has(s, n, "<|start_header_id|>") && has(s, n, "<|end_header_id|>"))
		return CHAT_LLAMA3;
	return -1;
}

/* Turn tokens of a vocabulary without a template, in the order tried. */
static const struct {
	const char *token;
	int tmpl;
} TURN_TOKENS[] = {
	{"<|im_start|>", CHAT_CHATML}, {"<start_of_turn>", CHAT_GEMMA}, {"<|start_header_id|>", CHAT_LLAMA3},
};

/* Default system messages of known ChatML templates: used when the template holds the
 * text and the conversation starts without a system message, as those templates do. */
static const char *const DEFAULT_SYSTEM[] = {
	"You are a helpful AI assistant named SmolLM, trained by Hugging Face",
	"You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
};

/* The family of t's file, or -1 with err. */
static int family_of(const rt_tokenizer *t, const char **default_sys, rt_err *err)
{
	const char *why = NULL, *path = rt_tokenizer_path(t);
	size_t n;
	const char *tm = rt_tokenizer_chat_template(t, &n);
	*default_sys = NULL;
	if (tm) {
		for (size_t i = 0; i < sizeof DEFAULT_SYSTEM / sizeof DEFAULT_SYSTEM[0]; i++)
			if (has(tm, n, DEFAULT_SYSTEM[i]))
				*default_sys = DEFAULT_SYSTEM[i];
	}
	int id = tm ? chat_detect(tm, n, &why) : -1;
	if (!tm) {
		for (size_t i = 0; i < sizeof TURN_TOKENS / sizeof TURN_TOKENS[0]; i++)
			if (rt_tokenizer_find(t, TURN_TOKENS[i].token) >= 0)
				return TURN_TOKENS[i].tmpl;
		rt_err_set(err, "%s: tokenizer.chat_template: missing, and the vocabulary has none of the "
		           "turn tokens <|im_start|>, <start_of_turn>, <|start_header_id|>", path);
		return -1;
	}
	if (id < 0) {
		rt_err_set(err, "%s: tokenizer.chat_template: %s%s; supported: chatml, llama3, gemma, "
		           "mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, llama2 (and -sys, -sys-bos, "
		           "-sys-strip), phi3", path, why ? "the template is llama.cpp's " : "template not recognised",
		           why ? why : "");
		return -1;
	}
	return id;
}

const char *rt_chat_family(const rt_tokenizer *t, rt_err *err)
{
	const char *ds;
	int id = family_of(t, &ds, err);
	return id < 0 ? NULL : TMPL[id].name;
}

int rt_chat_guess_note(const rt_tokenizer *t, char *buf, size_t cap)
{
	size_t n;
	rt_err err = { "" };
	const char *ds, *path = rt_tokenizer_path(t);
	if (rt_tokenizer_chat_template(t, &n))
		return 0;
	const int id = family_of(t, &ds, &err);
	if (id < 0)
		return 0; /* no family at all: the render's own error says so */
	snprintf(buf, cap, "%s has no tokenizer.chat_template: chat uses the %s turn format, "
	         "guessed from its turn tokens; a base model (not instruction-tuned) may not "
	         "follow it", path, TMPL[id].name);
	return 1;
}

/* ---- rendering ------------------------------------------------------------------ */

typedef struct seg_buf {
	rt_chat_seg *s;
	int n, cap;
} seg_buf;

static void put(seg_buf *b, const char *text, size_t len, int special, int msg)
{
	if (!text || !len)
		return;
	if (b->n == b->cap) {
		b->cap = b->cap ? 2 * b->cap : 16;
		b->s = realloc(b->s, (size_t)b->cap * sizeof *b->s);
		RT_ASSERT(b->s);
	}
	b->s[b->n++] = (rt_chat_seg){text, len, special, msg};
}

static void put_lit(seg_buf *b, const char *lit, int msg)
{
	if (lit)
		put(b, lit, strlen(lit), 1, msg);
}

/* Content of message i, trimmed as the family says. */
static void put_content(seg_buf *b, const char *c, int trim, int msg)
{
	size_t n = strlen(c), a = 0;
	if (trim) {
		while (a < n && isspace((unsigned char)c[a]))
			a++;
		while (n > a && isspace((unsigned char)c[n - 1]))
			n--;
	}
	put(b, c + a, n - a, 0, msg);
}

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

static int role_of(const char *r)
{
	if (!r)
		return -1;
	if (!strcmp(r, "system") || !strcmp(r, "developer"))
		return ROLE_SYSTEM;
	return !strcmp(r, "user") ? ROLE_USER : !strcmp(r, "assistant") ? ROLE_ASSISTANT : -1;
}

/* The pending system messages [from, to) of a family without a system turn. */
static void put_pending(seg_buf *b, const chat_tmpl *T, const rt_chat_msg *m, int from, int to)
{
	for (int k = from; k < to; k++) {
		if (role_of(m[k].role) != ROLE_SYSTEM)
			continue;
		put_lit(b, T->sys_pre, k);
		put_content(b, m[k].content, T->trim == TRIM_ALL, k);
		put_lit(b, T->sys_post, k);
	}
}

/* One message's turn. *pending: first system message not yet placed (-1: none). */
static void put_turn(seg_buf *b, const chat_tmpl *T, const rt_chat_msg *m, int i, int *pending,
                     int *after_asst)
{
	int role = role_of(m[i].role);
	if (role == ROLE_SYSTEM && !T->sys_open) {
		if (*pending < 0)
			*pending = i;
		return;
	}
	if (role == ROLE_SYSTEM) {
		put_lit(b, T->sys_open, i);
		put_content(b, m[i].content, T->trim == TRIM_ALL, i);
		put_lit(b, T->sys_close, i);
	} else if (role == ROLE_USER) {
		put_lit(b, *after_asst && T->user_next ? T->user_next : T->user_open, i);
		if (*pending >= 0)
			put_pending(b, T, m, *pending, i);
		*pending = -1;
		put_content(b, m[i].content, T->trim == TRIM_ALL, i);
		put_lit(b, T->user_close, i);
	} else {
		put_lit(b, T->asst_open, i);
		put_content(b, m[i].content, T->trim != TRIM_NONE, i);
		put_lit(b, T->asst_close, i);
	}
	*after_asst = role == ROLE_ASSISTANT;
}

rt_chat_seg *rt_chat_segments(const rt_tokenizer *t, const rt_chat_msg *m, int n, int *n_seg,
                              rt_err *err)
{
	const char *def_sys = NULL;
	int id = family_of(t, &def_sys, err);
	if (id < 0)
		return NULL;
	for (int i = 0; i < n; i++) {
		if (role_of(m[i].role) < 0 || !m[i].content) {
			rt_err_set(err, "messages[%d].role: '%s' is not system, developer, user or assistant "
			           "(or the content is missing)", i, m[i].role ? m[i].role : "(none)");
			return NULL;
		}
	}
	const chat_tmpl *T = &TMPL[id];
	seg_buf b = { 0 };
	int32_t bos = rt_tokenizer_bos(t);
	if (bos >= 0) {
		size_t bl;
		const char *bt = rt_tokenizer_text(t, bos, &bl);
		put(&b, bt, bl, 1, -1);
	}
	if (def_sys && T->sys_open && (n == 0 || role_of(m[0].role) != ROLE_SYSTEM)) {
		/* only families with a system turn carry a default (chatml) */
		put_lit(&b, T->sys_open, -1);
		put(&b, def_sys, strlen(def_sys), 0, -1);
		put_lit(&b, T->sys_close, -1);
	}
	int pending = -1, after_asst = 0;
	for (int i = 0; i < n; i++)
		put_turn(&b, T, m, i, &pending, &after_asst);
	put_lit(&b, T->gen, -1);
	*n_seg = b.n;
	if (!b.s)
		b.s = RT_MALLOC(sizeof *b.s);
	return b.s;
}

char *rt_chat_render_msgs(const rt_tokenizer *t, const rt_chat_msg *m, int n, rt_err *err)
{
	int ns;
	rt_chat_seg *s = rt_chat_segments(t, m, n, &ns, err);
	if (!s)
		return NULL;
	size_t len = 0;
	for (int i = 0; i < ns; i++)
		len += s[i].len;
	char *o = RT_MALLOC(len + 1), *w = o;
	for (int i = 0; i < ns; i++) {
		memcpy(w, s[i].text, s[i].len);
		w += s[i].len;
	}
	*w = '\0';
	free(s);
	return o;
}

int32_t *rt_chat_tokenize(const rt_tokenizer *t, const rt_chat_msg *m, int n, int64_t *n_ids,
                          int **msg_of, rt_err *err)
{
	int ns;
	rt_chat_seg *s = rt_chat_segments(t, m, n, &ns, err);
	if (!s)
		return NULL;
	rt_tok_piece *p = RT_MALLOC((size_t)(ns ? ns : 1) * sizeof *p);
	for (int i = 0; i < ns; i++)
		p[i] = (rt_tok_piece){ s[i].text, s[i].len, s[i].special };
	int32_t *piece = NULL;
	int32_t *ids = rt_tokenize_pieces(t, p, ns, n_ids, msg_of ? &piece : NULL, err);
	free(p);
	if (ids && msg_of) { /* the piece's message */
		int *of = RT_MALLOC((size_t)(*n_ids ? *n_ids : 1) * sizeof *of);
		for (int64_t i = 0; i < *n_ids; i++)
			of[i] = ns ? s[piece[i]].msg : -1;
		*msg_of = of;
	}
	free(piece);
	free(s);
	return ids;
}

char *rt_chat_render(const rt_tokenizer *t, const char *system, const char *user, rt_err *err)
{
	rt_chat_msg m[2];
	int n = 0;
	if (system)
		m[n++] = (rt_chat_msg){"system", system};
	m[n++] = (rt_chat_msg){"user", user ? user : ""};
	return rt_chat_render_msgs(t, m, n, err);
}
