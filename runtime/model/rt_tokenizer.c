/*
 * rt_tokenizer: the tokenizers of GGUF files, reproducing llama.cpp's llama-vocab.cpp and
 * unicode.cpp token for token (checked against llama.cpp's own vectors,
 * models/ggml-vocab-*.gguf.inp/.out, by tests/test_tokenizer_vocab.c):
 *
 *   1. special-token partition (tokenizer_st_partition): control/unknown tokens (only when
 *      parse_special) and user-defined tokens (always) are cut out of the text where their
 *      text occurs verbatim, longest token first;
 *   2. byte-level BPE (tokenizer.ggml.model "gpt2"): pre-tokenization of each remaining
 *      fragment by the pre-tokenizer's pattern (PRE_TYPES: for "smollm" first `\p{N}`,
 *      every number codepoint its own piece, then the GPT-2 pattern on each piece; Llama 3
 *      and Qwen2 have their own patterns). Patterns run with PCRE2 in UTF+UCP mode; `\s`
 *      is spelled out as llama.cpp's whitespace set (Unicode White_Space), and \p{L}/\p{N}
 *      get the Unicode 15 additions llama.cpp knows, so every codepoint is classified as
 *      llama.cpp classifies it. Each piece's bytes become GPT-2 bytes->unicode symbols,
 *      then the adjacent pair of lowest merge rank is merged (equal ranks: leftmost first)
 *      until no pair has a rank, via a binary heap and an (id, id) -> rank hash map, so a
 *      piece of n bytes costs O(n log n); a final symbol missing from the vocabulary gives
 *      the ids of its single bytes (a byte without a token is dropped). Llama 3 first
 *      looks the whole piece up (llama.cpp's ignore_merges);
 *   3. SentencePiece-style BPE (tokenizer.ggml.model "llama", llm_tokenizer_spm): each
 *      fragment gets a leading space when add_space_prefix is set and it follows the start
 *      or a special token, spaces become U+2581, the UTF-8 characters are merged pairwise,
 *      the pair whose concatenation is the vocabulary token of highest score first (equal
 *      scores: leftmost first), and a final symbol that is no token falls back to the
 *      <0xNN> tokens of its bytes.
 *
 * End of generation follows llama.cpp too: the GGUF eos/eot/eom ids plus every token whose
 * text is on llama.cpp's EOG and FIM pad/repo/sep lists (SmolLM2: 0 <|endoftext|>,
 * 2 <|im_end|>, 4 <reponame>).
 *
 * Every string the BPE can meet (vocabulary tokens, both halves of each merge and each
 * merge's result) is interned once at init; vocabulary strings keep their token id, the
 * others get ids >= n_vocab. Symbols are then plain integers during BPE.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/rt_tokenizer.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GGUF tokenizer.ggml.token_type values (llama.h enum llama_token_type). */
enum {
	TT_UNDEFINED = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3,
	TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6,
};

/* Unicode White_Space, the set llama.cpp's unicode-data.cpp marks as `\s`. */
#define WS "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Letters and numbers assigned in Unicode 15.0/15.1 (Kawi, Nag Mundari, Kaktovik numerals,
 * CJK extensions H and I, ...) that llama.cpp's tables know and PCRE2 10.42 (Unicode 14)
 * does not. Found by comparing llama.cpp's unicode_cpt_flags_from_cpt() with PCRE2's
 * \p{L}/\p{N} over every codepoint; with them the two classify all codepoints alike
 * (a newer PCRE2 already has them, which is harmless). */
#define L15 "\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}" \
	"\\x{13441}-\\x{13446}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}" \
	"\\x{1E4D0}-\\x{1E4EB}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define N15 "\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"
#define LET "\\p{L}" L15
#define NUM "\\p{N}" N15

/* The GPT-2 pattern; the final `|\s+` is what llama.cpp's hand-written matcher
 * (unicode_regex_split_custom_gpt2) does for a lone whitespace before a non-space. */
static const char RE_GPT2[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?[" LET "]+| ?[" NUM "]+| ?[^" WS LET NUM "]+"
	"|[" WS "]+(?![^" WS "])|[" WS "]+";
static const char RE_DIGIT[] = "[" NUM "]";
/* Llama 3's pattern as llama-vocab.cpp adapts it (case-insensitive contractions spelled
 * out); Qwen2's is the same with single digits instead of runs of up to three. Their
 * hand-written matchers in unicode.cpp (custom_llama3, custom_qwen2) agree with these. */
#define RE_LLAMA3_LIKE(DIGITS) \
	"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n" LET NUM "]?[" LET "]+" \
	"|[" NUM "]" DIGITS "| ?[^" WS LET NUM "]+[\\r\\n]*|[" WS "]*[\\r\\n]+" \
	"|[" WS "]+(?![^" WS "])|[" WS "]+"
static const char RE_LLAMA3[] = RE_LLAMA3_LIKE("{1,3}");
static const char RE_QWEN2[] = RE_LLAMA3_LIKE("");

/* Pre-tokenizers we implement (llama-vocab.cpp's names for them): whether the `\p{N}`
 * pass runs first, the main pattern, whether a piece that is a whole vocabulary token is
 * taken as is (ignore_merges), and whether prompts start with BOS by default. */
#define PRE_TYPE_ROWS(X) \
	X("smollm", 1, RE_GPT2, 0, 0) X("starcoder", 1, RE_GPT2, 0, 0) X("refact", 1, RE_GPT2, 0, 0) \
	X("command-r", 1, RE_GPT2, 0, 0) X("codeshell", 1, RE_GPT2, 0, 0) \
	X("gpt-2", 0, RE_GPT2, 0, 0) X("mpt", 0, RE_GPT2, 0, 0) X("olmo", 0, RE_GPT2, 0, 0) \
	X("llama-bpe", 0, RE_LLAMA3, 1, 1) X("llama3", 0, RE_LLAMA3, 1, 1) \
	X("llama-v3", 0, RE_LLAMA3, 1, 1) X("dbrx", 0, RE_LLAMA3, 0, 0) X("smaug-bpe", 0, RE_LLAMA3, 0, 0) \
	X("qwen2", 0, RE_QWEN2, 0, 0) X("deepseek-r1-qwen", 0, RE_QWEN2, 0, 0) \
	X("stablelm2", 0, RE_QWEN2, 0, 0)
static const struct pre_type {
	const char *name;
	int split_digits;
	const char *re;
	int ignore_merges, add_bos;
} PRE_TYPES[] = {
#define PRE_ROW(n, d, r, im, ab) {n, d, r, im, ab},
	PRE_TYPE_ROWS(PRE_ROW)
#undef PRE_ROW
};
#define PRE_NAMES_LIST "smollm, starcoder, refact, command-r, codeshell, gpt-2, mpt, olmo, " \
	"llama-bpe, llama3, llama-v3, dbrx, smaug-bpe, qwen2, deepseek-r1-qwen, stablelm2"

/* Token texts llama.cpp treats as end-of-generation (llama-vocab.cpp, load: "maintain a
 * list of tokens that cause end-of-generation"): its EOG list, then its FIM pad, FIM repo
 * and FIM sep spellings, which it also makes EOG (hence SmolLM2's <reponame>, id 4).
 * llama.cpp also forces each of these tokens to the control type; so do we. */
static const char *const EOG_TEXTS[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
	"<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
	"<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
	"<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[",
	"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
	"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
	"<|file_sep|>",
};

/* The FIM prefix/suffix/middle spellings, which llama.cpp forces to the control type
 * (not EOG) when the file names no tokenizer.ggml.fim_{pre,suf,mid}_token_id, the first
 * spelling its hash map meets. We force every one present, key or not (vocabularies hold
 * one spelling per role; CodeLlama's two are control in the file already). */
static const char *const FIM_CONTROL_TEXTS[] = {
	"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\xe2\x96\x81<PRE>",
	"<|code_prefix|>", "<|prefix|>",
	"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "\xe2\x96\x81<SUF>",
	"<|code_suffix|>", "<|suffix|>",
	"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\xe2\x96\x81<MID>",
	"<|code_middle|>", "<|middle|>",
};

/* ---- string interning ---------------------------------------------------------- */

typedef struct strtab {
	char *blob;          /* all strings back to back */
	size_t blob_len, blob_cap;
	uint64_t *off;       /* [n] offset into blob */
	uint32_t *len;       /* [n] */
	int32_t n, cap;
	int32_t *slots;      /* open addressing: string id or -1 */
	uint32_t n_slots;    /* power of two */
} strtab;

static uint32_t hash_bytes(const char *s, size_t n)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 16777619u;
	return h;
}

static int strtab_eq(const strtab *st, int32_t id, const char *s, size_t n)
{
	return st->len[id] == n && memcmp(st->blob + st->off[id], s, n) == 0;
}

/* Id of s[0..n), or -1. */
static int32_t strtab_find(const strtab *st, const char *s, size_t n)
{
	if (!st->n_slots)
		return -1;
	uint32_t mask = st->n_slots - 1, i = hash_bytes(s, n) & mask;
	for (;;) {
		int32_t id = st->slots[i];
		if (id < 0)
			return -1;
		if (strtab_eq(st, id, s, n))
			return id;
		i = (i + 1) & mask;
	}
}

static void strtab_rehash(strtab *st, uint32_t n_slots)
{
	free(st->slots);
	st->slots = RT_MALLOC(n_slots * sizeof *st->slots);
	memset(st->slots, 0xff, n_slots * sizeof *st->slots);
	st->n_slots = n_slots;
	uint32_t mask = n_slots - 1;
	for (int32_t id = 0; id < st->n; id++) {
		uint32_t i = hash_bytes(st->blob + st->off[id], st->len[id]) & mask;
		while (st->slots[i] >= 0) {
			/* a later duplicate replaces the earlier one (llama.cpp: token_to_id[text] = id) */
			if (strtab_eq(st, st->slots[i], st->blob + st->off[id], st->len[id]))
				break;
			i = (i + 1) & mask;
		}
		st->slots[i] = id;
	}
}

/* Append s as a new id (even if equal to an existing string; the newest wins lookups). */
static int32_t strtab_add(strtab *st, const char *s, size_t n)
{
	if (st->n == st->cap) {
		st->cap = st->cap ? st->cap * 2 : 1024;
		st->off = realloc(st->off, (size_t)st->cap * sizeof *st->off);
		st->len = realloc(st->len, (size_t)st->cap * sizeof *st->len);
		RT_ASSERT(st->off && st->len);
	}
	if (st->blob_len + n + 1 > st->blob_cap) {
		while (st->blob_len + n + 1 > st->blob_cap)
			st->blob_cap = st->blob_cap ? st->blob_cap * 2 : 65536;
		st->blob = realloc(st->blob, st->blob_cap);
		RT_ASSERT(st->blob);
	}
	memcpy(st->blob + st->blob_len, s, n);
	st->blob[st->blob_len + n] = '\0';
	int32_t id = st->n++;
	st->off[id] = st->blob_len;
	st->len[id] = (uint32_t)n;
	st->blob_len += n + 1;
	if ((uint64_t)st->n * 2 > st->n_slots) {
		strtab_rehash(st, st->n_slots ? st->n_slots * 2 : 4096);
	} else {
		uint32_t mask = st->n_slots - 1, i = hash_bytes(s, n) & mask;
		while (st->slots[i] >= 0 && !strtab_eq(st, st->slots[i], s, n))
			i = (i + 1) & mask;
		st->slots[i] = id;
	}
	return id;
}

/* Id of s[0..n), interning it when new. */
static int32_t strtab_intern(strtab *st, const char *s, size_t n)
{
	int32_t id = strtab_find(st, s, n);
	return id >= 0 ? id : strtab_add(st, s, n);
}

static void strtab_free(strtab *st)
{
	free(st->blob);
	free(st->off);
	free(st->len);
	free(st->slots);
}

/* ---- merge table: (left id, right id) -> (rank, result id) ---------------------- */

typedef struct merge_slot {
	uint64_t key;   /* (left << 32 | right) + 1; 0 = empty */
	int32_t rank;
	int32_t result;
} merge_slot;

static uint32_t hash_u64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	return (uint32_t)k;
}

static uint64_t merge_key(int32_t a, int32_t b)
{
	return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

/* ---- the tokenizer -------------------------------------------------------------- */

typedef struct special_tok {
	int32_t id;
	int32_t type;
	const char *text; /* into strtab blob */
	uint32_t len;
} special_tok;

/* The two tokenizer models (tokenizer.ggml.model). */
enum { TOK_BPE, TOK_SPM };

struct rt_tokenizer {
	int kind;                /* TOK_BPE ("gpt2") or TOK_SPM ("llama") */
	int32_t n_vocab;
	uint8_t *type;           /* [n_vocab] GGUF token type */
	float *score;            /* [n_vocab] SentencePiece scores (TOK_SPM) */
	strtab st;               /* ids 0..n_vocab-1 are the vocabulary */
	char *dec;               /* decoded bytes of every token, back to back */
	uint64_t *dec_off;       /* [n_vocab + 1] */
	merge_slot *merges;
	uint32_t n_merge_slots;  /* power of two */
	int32_t byte_sym[256];   /* TOK_BPE: string id of each byte's GPT-2 symbol (>= n_vocab:
	                          * no token); TOK_SPM: the byte's fallback token or -1 */
	special_tok *specials;   /* longest first */
	int n_specials;
	uint8_t *eog;            /* [n_vocab] */
	int split_digits, ignore_merges, add_space_prefix;
	int32_t bos;             /* the BOS id prompts start with, or -1 */
	int32_t unk;             /* SentencePiece's unknown token (fallback of a byte without one) */
	char *chat_template;     /* tokenizer.chat_template (NUL-terminated copy) or NULL */
	size_t chat_template_len;
	char *path;              /* the GGUF's path, for rt_chat's messages */
	pcre2_code *re_main, *re_digit;
};

/* GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68
 * bytes to U+0100.. in byte order. */
static void byte_map_init(uint32_t cp_of_byte[256])
{
	int n = 0;
	for (int b = 0; b < 256; b++) {
		int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
		cp_of_byte[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
	}
}

static int utf8_put(uint32_t cp, char *o)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xC0 | (cp >> 6));
		o[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xE0 | (cp >> 12));
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (char)(0xF0 | (cp >> 18));
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	o[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* Decode one UTF-8 codepoint of valid text s[0..n); returns its length. */
static int utf8_get(const char *s, size_t n, uint32_t *cp)
{
	const uint8_t *u = (const uint8_t *)s;
	int len = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
	if ((size_t)len > n)
		len = 1;
	uint32_t c = len == 1 ? u[0] : len == 2 ? (u[0] & 0x1Fu) : len == 3 ? (u[0] & 0x0Fu) : (u[0] & 0x07u);
	for (int i = 1; i < len; i++)
		c = (c << 6) | (u[i] & 0x3Fu);
	*cp = c;
	return len;
}

static pcre2_code *re_compile(const char *pat, const char *path, rt_err *err)
{
	int ec;
	PCRE2_SIZE eo;
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
	                               PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, NULL);
	if (!re) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(ec, msg, sizeof msg);
		rt_err_set(err, "%s: tokenizer: PCRE2 cannot compile the pre-tokenizer pattern at %zu: %s",
		           path, (size_t)eo, (const char *)msg);
		return NULL;
	}
	/* JIT is an optimisation only; the interpreter gives the same matches. */
	(void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
	return re;
}

static const rt_gguf_kv *find_arr(const rt_gguf *g, const char *key, uint32_t elem_type,
                                  int required, rt_err *err)
{
	const rt_gguf_kv *kv = rt_gguf_find_kv(g, key);
	if (!kv) {
		if (required)
			rt_err_set(err, "%s: tokenizer: key '%s' missing", rt_gguf_path(g), key);
		return NULL;
	}
	if (kv->type != RT_GGUF_ARRAY || kv->arr_type != elem_type) {
		rt_err_set(err, "%s: tokenizer: key '%s' is not an array of type %u", rt_gguf_path(g),
		           key, elem_type);
		return NULL;
	}
	return kv;
}

static int cmp_special(const void *a, const void *b)
{
	const special_tok *x = a, *y = b;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Optional integer key (tokenizer.ggml.eos_token_id etc.): -1 when absent or out of range. */
static int32_t opt_id(const rt_gguf *g, const char *key, int32_t n_vocab)
{
	uint32_t v;
	if (!rt_gguf_find_kv(g, key) || rt_gguf_get_u32(g, key, &v, NULL) != 0 || v >= (uint32_t)n_vocab)
		return -1;
	return (int32_t)v;
}

/* The tokenizer's GGUF keys (arrays found, types and sizes checked, the model and
 * pre-tokenizer known). 0 and *k filled, or -1 with err naming the file and the key. */
typedef struct tok_keys {
	int kind;                             /* TOK_BPE or TOK_SPM */
	const rt_gguf_kv *tok, *type, *merge; /* tokens, token types (may be NULL), merges (BPE) */
	const rt_gguf_kv *score;              /* SentencePiece scores (may be NULL) */
	const struct pre_type *pre;           /* the BPE pre-tokenizer (PRE_TYPES) */
} tok_keys;

static int str_is(rt_gguf_str s, const char *lit)
{
	return s.len == strlen(lit) && memcmp(s.s, lit, s.len) == 0;
}

/* tokenizer.ggml.model and, for BPE, tokenizer.ggml.pre: k->kind and k->pre. */
static int tok_model_find(const rt_gguf *g, const char *path, tok_keys *k, rt_err *err)
{
	rt_gguf_str model, pre;
	if (rt_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL) != 0) {
		rt_err_set(err, "%s: tokenizer: key 'tokenizer.ggml.model' missing or not a string", path);
		return -1;
	}
	if (str_is(model, "llama")) {
		k->kind = TOK_SPM; /* llama.cpp reads no pre-tokenizer for SentencePiece */
		return 0;
	}
	if (!str_is(model, "gpt2")) {
		rt_err_set(err, "%s: tokenizer: key 'tokenizer.ggml.model' is '%.*s'; supported: 'gpt2' "
		           "(byte-level BPE), 'llama' (SentencePiece)",
		           path, (int)(model.len > 64 ? 64 : model.len), model.s);
		return -1;
	}
	k->kind = TOK_BPE;
	if (rt_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL) != 0) {
		rt_err_set(err, "%s: tokenizer: key 'tokenizer.ggml.pre' missing or not a string", path);
		return -1;
	}
	for (size_t i = 0; i < sizeof PRE_TYPES / sizeof PRE_TYPES[0]; i++)
		if (str_is(pre, PRE_TYPES[i].name))
			k->pre = &PRE_TYPES[i];
	if (!k->pre) {
		rt_err_set(err, "%s: tokenizer: key 'tokenizer.ggml.pre' is '%.*s'; supported: " PRE_NAMES_LIST,
		           path, (int)(pre.len > 64 ? 64 : pre.len), pre.s);
		return -1;
	}
	return 0;
}

static int tok_keys_find(const rt_gguf *g, const char *path, tok_keys *k, rt_err *err)
{
	memset(k, 0, sizeof *k);
	if (tok_model_find(g, path, k, err) != 0)
		return -1;
	const rt_gguf_kv *ktok = k->tok = find_arr(g, "tokenizer.ggml.tokens", RT_GGUF_STRING, 1, err);
	if (!ktok)
		return -1;
	if (ktok->arr_n == 0 || ktok->arr_n > (1u << 24)) {
		rt_err_set(err, "%s: tokenizer: %llu tokens (expected 1..16777216)", path,
		           (unsigned long long)ktok->arr_n);
		return -1;
	}
	const rt_gguf_kv *ktype = k->type = rt_gguf_find_kv(g, "tokenizer.ggml.token_type");
	if (ktype && (ktype->type != RT_GGUF_ARRAY || ktype->arr_n != ktok->arr_n ||
	              (ktype->arr_type != RT_GGUF_I32 && ktype->arr_type != RT_GGUF_U32))) {
		rt_err_set(err, "%s: tokenizer: 'tokenizer.ggml.token_type' is not an i32 array of %llu entries",
		           path, (unsigned long long)ktok->arr_n);
		return -1;
	}
	const rt_gguf_kv *ksc = k->score = rt_gguf_find_kv(g, "tokenizer.ggml.scores");
	if (ksc && (ksc->type != RT_GGUF_ARRAY || ksc->arr_n < ktok->arr_n ||
	            (ksc->arr_type != RT_GGUF_F32 && ksc->arr_type != RT_GGUF_I32))) {
		rt_err_set(err, "%s: tokenizer: 'tokenizer.ggml.scores' is not an f32 or i32 array of "
		           "%llu entries", path, (unsigned long long)ktok->arr_n);
		return -1;
	}
	if (k->kind == TOK_SPM)
		return 0; /* SentencePiece merges by score; merges are not read */
	const rt_gguf_kv *kmerge = k->merge = rt_gguf_find_kv(g, "tokenizer.ggml.merges");
	if (!kmerge) {
		rt_err_set(err, "%s: tokenizer: key 'tokenizer.ggml.merges' missing", path);
		return -1;
	}
	if (kmerge->type != RT_GGUF_ARRAY || kmerge->arr_type != RT_GGUF_STRING) {
		rt_err_set(err, "%s: tokenizer: 'tokenizer.ggml.merges' is not a string array", path);
		return -1;
	}
	if (kmerge->arr_n > (1u << 26)) {
		rt_err_set(err, "%s: tokenizer: %llu merges (at most 67108864)", path,
		           (unsigned long long)kmerge->arr_n);
		return -1;
	}
	return 0;
}

/* Token types, strings and scores into t (n_vocab set). An empty token text becomes
 * "[EMPTY_<id>]" as llama.cpp renames it. */
static void tok_vocab_init(rt_tokenizer *t, const tok_keys *k)
{
	const rt_gguf_kv *ktok = k->tok, *ktype = k->type, *ksc = k->score;
	t->type = RT_MALLOC((size_t)t->n_vocab);
	t->score = RT_CALLOC((size_t)t->n_vocab, sizeof *t->score);
	for (int32_t i = 0; i < t->n_vocab; i++) {
		int32_t ty = TT_NORMAL;
		if (ktype)
			memcpy(&ty, (const char *)ktype->arr_data + 4 * (size_t)i, 4);
		t->type[i] = (ty >= 0 && ty <= TT_BYTE) ? (uint8_t)ty : TT_UNDEFINED;
		if (ksc && ksc->arr_type == RT_GGUF_F32) {
			memcpy(&t->score[i], (const char *)ksc->arr_data + 4 * (size_t)i, 4);
		} else if (ksc) {
			int32_t v;
			memcpy(&v, (const char *)ksc->arr_data + 4 * (size_t)i, 4);
			t->score[i] = (float)v;
		}
		const rt_gguf_str *s = &ktok->arr_strs[i];
		if (s->len == 0) {
			char e[32];
			int n = snprintf(e, sizeof e, "[EMPTY_%d]", (int)i);
			strtab_add(&t->st, e, (size_t)n);
		} else {
			strtab_add(&t->st, s->s, s->len);
		}
	}
}

/* Optional boolean key: its value, or def when absent or not a bool. */
static int opt_bool(const rt_gguf *g, const char *key, int def)
{
	const rt_gguf_kv *kv = rt_gguf_find_kv(g, key);
	return kv && kv->type == RT_GGUF_BOOL ? kv->v.u64 != 0 : def;
}

/* The prompt's BOS (t->bos), SentencePiece's space prefix and unknown token, as
 * llama.cpp's defaults per model overridden by the file's keys. */
static void tok_flags_init(rt_tokenizer *t, const rt_gguf *g, const tok_keys *k)
{
	int spm = k->kind == TOK_SPM;
	int add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", spm ? 1 : k->pre->add_bos);
	int32_t bos = opt_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab);
	if (bos < 0 && spm && t->n_vocab > 1 && !rt_gguf_find_kv(g, "tokenizer.ggml.bos_token_id"))
		bos = 1;
	t->bos = add_bos ? bos : -1;
	t->add_space_prefix = spm && opt_bool(g, "tokenizer.ggml.add_space_prefix", 1);
	t->unk = opt_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab);
	if (t->unk < 0 && spm && !rt_gguf_find_kv(g, "tokenizer.ggml.unknown_token_id"))
		t->unk = 0;
	if (!spm) {
		t->split_digits = k->pre->split_digits;
		t->ignore_merges = k->pre->ignore_merges;
	}
}

/* The end-of-generation set (t->eog) and the control type of its text tokens. */
static void tok_eog_init(rt_tokenizer *t, const rt_gguf *g)
{
	/* end of generation: llama.cpp's text list (made control tokens), plus the GGUF
	 * eos, eot and eom ids */
	t->eog = RT_CALLOC((size_t)t->n_vocab, 1);
	for (size_t i = 0; i < sizeof EOG_TEXTS / sizeof EOG_TEXTS[0]; i++) {
		int32_t id = rt_tokenizer_find(t, EOG_TEXTS[i]);
		if (id >= 0) {
			t->eog[id] = 1;
			t->type[id] = TT_CONTROL;
		}
	}
	for (size_t i = 0; i < sizeof FIM_CONTROL_TEXTS / sizeof FIM_CONTROL_TEXTS[0]; i++) {
		int32_t id = rt_tokenizer_find(t, FIM_CONTROL_TEXTS[i]);
		if (id >= 0)
			t->type[id] = TT_CONTROL;
	}
	/* llama.cpp: where <|tool_response> or <|plamo:eos|> is EOG, </s> is a normal token */
	int32_t s_id = rt_tokenizer_find(t, "</s>");
	if (s_id >= 0 && (rt_tokenizer_find(t, "<|tool_response>") >= 0 ||
	                  rt_tokenizer_find(t, "<|plamo:eos|>") >= 0)) {
		t->eog[s_id] = 0;
		t->type[s_id] = TT_NORMAL;
	}
	static const char *const eog_keys[] = {
		"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
	};
	for (size_t i = 0; i < sizeof eog_keys / sizeof eog_keys[0]; i++) {
		int32_t id = opt_id(g, eog_keys[i], t->n_vocab);
		if (id >= 0)
			t->eog[id] = 1;
	}
	/* SentencePiece's default eos (2) when the file names none */
	if (t->kind == TOK_SPM && !rt_gguf_find_kv(g, "tokenizer.ggml.eos_token_id") && t->n_vocab > 2)
		t->eog[2] = 1;
}

/* SentencePiece's byte fallback: the token of each byte, "<0xNN>" or else the byte's own
 * one-byte text (llama_vocab::byte_to_token), -1 when neither exists. */
static void tok_spm_bytes_init(rt_tokenizer *t)
{
	for (int b = 0; b < 256; b++) {
		char hex[8], one[1] = { (char)b };
		snprintf(hex, sizeof hex, "<0x%02X>", b);
		int32_t id = strtab_find(&t->st, hex, 6);
		if (id < 0 || id >= t->n_vocab)
			id = strtab_find(&t->st, one, 1);
		t->byte_sym[b] = id < t->n_vocab ? id : -1;
	}
}

/* The byte alphabet: byte_of_cp[cp] is the byte a codepoint below 512 stands for (-1:
 * none), and t->byte_sym[b] the symbol of byte b. */
static void tok_bytes_init(rt_tokenizer *t, int32_t byte_of_cp[512])
{
	/* bytes -> symbols. SmolLM2's vocabulary has no token for 21 bytes (0x04, 0x06, 0x13,
	 * 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2, 0xf5..0xff; so the lead byte of any
	 * codepoint U+40000..U+BFFFF too); such a byte's symbol gets an id >= n_vocab and is
	 * dropped from the output, as llama.cpp drops it. */
	uint32_t cp_of_byte[256];
	byte_map_init(cp_of_byte);
	for (int i = 0; i < 512; i++)
		byte_of_cp[i] = -1;
	for (int b = 0; b < 256; b++) {
		char u[4];
		int n = utf8_put(cp_of_byte[b], u);
		byte_of_cp[cp_of_byte[b]] = b;
		t->byte_sym[b] = strtab_intern(&t->st, u, (size_t)n);
	}
}

/* The merge table (hash of symbol pairs to rank and result). 0, or -1 with err. */
static int tok_merges_init(rt_tokenizer *t, const rt_gguf_kv *kmerge, const char *path, rt_err *err)
{
	/* merges "A B" (split at the first space after the first byte, as llama.cpp) */
	uint64_t n_merges = kmerge->arr_n;
	uint32_t ms = 1024;
	while (ms < n_merges * 2 + 2)
		ms *= 2;
	t->n_merge_slots = ms;
	t->merges = RT_CALLOC(ms, sizeof *t->merges);
	for (uint64_t r = 0; r < n_merges; r++) {
		const rt_gguf_str *m = &kmerge->arr_strs[r];
		const char *sp = m->len > 1 ? memchr(m->s + 1, ' ', m->len - 1) : NULL;
		if (!sp) {
			rt_err_set(err, "%s: tokenizer: merge %llu '%.*s' has no space separator", path,
			           (unsigned long long)r, (int)(m->len > 64 ? 64 : m->len), m->s);
			return -1;
		}
		size_t la = (size_t)(sp - m->s), lb = m->len - la - 1;
		int32_t a = strtab_intern(&t->st, m->s, la);
		int32_t b = strtab_intern(&t->st, sp + 1, lb);
		char stackbuf[512];
		char *cat = la + lb <= sizeof stackbuf ? stackbuf : RT_MALLOC(la + lb);
		memcpy(cat, m->s, la);
		memcpy(cat + la, sp + 1, lb);
		int32_t res = strtab_intern(&t->st, cat, la + lb);
		if (cat != stackbuf)
			free(cat);
		if (t->st.n > INT32_MAX / 2) {
			rt_err_set(err, "%s: tokenizer: too many merge strings", path);
			return -1;
		}
		uint64_t key = merge_key(a, b);
		uint32_t i = hash_u64(key) & (ms - 1);
		while (t->merges[i].key && t->merges[i].key != key)
			i = (i + 1) & (ms - 1);
		if (!t->merges[i].key) { /* a duplicate pair keeps its first (lowest) rank */
			t->merges[i].key = key;
			t->merges[i].rank = (int32_t)r;
			t->merges[i].result = res;
		}
	}
	return 0;
}

/* The text of SentencePiece token i (s[0..n)) into o, as llama.cpp's token_to_piece:
 * normal tokens with U+2581 back to spaces, byte tokens their byte (<0xNN>), control,
 * unknown and user-defined tokens their text, unused and undefined ones nothing. Writes
 * at most n bytes; returns the count. */
static size_t spm_piece(const rt_tokenizer *t, int32_t i, const char *s, size_t n, char *o)
{
	switch (t->type[i]) {
	case TT_NORMAL: {
		size_t w = 0;
		for (size_t k = 0; k < n;) {
			if (n - k >= 3 && !memcmp(s + k, "\xe2\x96\x81", 3)) {
				o[w++] = ' ';
				k += 3;
			} else {
				o[w++] = s[k++];
			}
		}
		return w;
	}
	case TT_BYTE:
		if (n >= 4) {
			o[0] = (char)strtol(s + 3, NULL, 16); /* NUL-terminated in the strtab blob */
			return 1;
		}
		return 0;
	case TT_CONTROL: case TT_UNKNOWN: case TT_USER_DEFINED:
		memcpy(o, s, n);
		return n;
	default:
		return 0;
	}
}

/* The decoded bytes of every token (t->dec, t->dec_off). */
static void tok_decode_init(rt_tokenizer *t, const int32_t byte_of_cp[512])
{
	/* decoded bytes of every token */
	size_t total = 0;
	for (int32_t i = 0; i < t->n_vocab; i++)
		total += t->st.len[i];
	t->dec = RT_MALLOC(total + 1);
	t->dec_off = RT_MALLOC(((size_t)t->n_vocab + 1) * sizeof *t->dec_off);
	size_t w = 0;
	for (int32_t i = 0; i < t->n_vocab; i++) {
		const char *s = t->st.blob + t->st.off[i];
		size_t n = t->st.len[i];
		t->dec_off[i] = w;
		if (t->kind == TOK_SPM) {
			w += spm_piece(t, i, s, n, t->dec + w);
		} else if (t->type[i] == TT_NORMAL) {
			size_t valid_to;
			int ok = rt_utf8_valid(s, n, &valid_to);
			for (size_t k = 0; k < n;) {
				uint32_t cp;
				int l = ok ? utf8_get(s + k, n - k, &cp) : 1;
				if (ok && cp < 512 && byte_of_cp[cp] >= 0) {
					t->dec[w++] = (char)byte_of_cp[cp];
				} else { /* outside the byte alphabet: keep the raw text */
					memcpy(t->dec + w, s + k, (size_t)l);
					w += (size_t)l;
				}
				k += (size_t)l;
			}
		} else {
			memcpy(t->dec + w, s, n);
			w += n;
		}
	}
	t->dec_off[t->n_vocab] = w;
}

/* The special tokens of the partition step, sorted by cmp_special. */
static void tok_specials_init(rt_tokenizer *t)
{
	/* special tokens for the partition step */
	t->specials = RT_MALLOC((size_t)t->n_vocab * sizeof *t->specials);
	for (int32_t i = 0; i < t->n_vocab; i++) {
		int ty = t->type[i];
		if ((ty == TT_CONTROL || ty == TT_USER_DEFINED || ty == TT_UNKNOWN) && t->st.len[i] > 0) {
			special_tok *sp = &t->specials[t->n_specials++];
			sp->id = i;
			sp->type = ty;
			sp->text = t->st.blob + t->st.off[i];
			sp->len = t->st.len[i];
		}
	}
	qsort(t->specials, (size_t)t->n_specials, sizeof *t->specials, cmp_special);
}

rt_tokenizer *rt_tokenizer_init(const rt_gguf *g, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	tok_keys k;
	if (tok_keys_find(g, path, &k, err) != 0)
		return NULL;
	rt_tokenizer *t = RT_CALLOC(1, sizeof *t);
	t->kind = k.kind;
	t->n_vocab = (int32_t)k.tok->arr_n;
	tok_vocab_init(t, &k);
	tok_flags_init(t, g, &k);
	tok_eog_init(t, g);
	int32_t byte_of_cp[512];
	if (t->kind == TOK_SPM) {
		tok_spm_bytes_init(t);
	} else {
		tok_bytes_init(t, byte_of_cp);
		if (tok_merges_init(t, k.merge, path, err) != 0)
			goto fail;
		if (!(t->re_main = re_compile(k.pre->re, path, err)))
			goto fail;
		if (t->split_digits && !(t->re_digit = re_compile(RE_DIGIT, path, err)))
			goto fail;
	}
	tok_decode_init(t, byte_of_cp);
	tok_specials_init(t);
	rt_gguf_str ct;
	if (rt_gguf_get_str(g, "tokenizer.chat_template", &ct, NULL) == 0) {
		t->chat_template = RT_MALLOC(ct.len + 1);
		memcpy(t->chat_template, ct.s, ct.len);
		t->chat_template[ct.len] = '\0';
		t->chat_template_len = ct.len;
	}
	t->path = RT_MALLOC(strlen(path) + 1);
	strcpy(t->path, path);
	return t;
fail:
	rt_tokenizer_free(t);
	return NULL;
}

void rt_tokenizer_free(rt_tokenizer *t)
{
	if (!t)
		return;
	strtab_free(&t->st);
	free(t->type);
	free(t->score);
	free(t->dec);
	free(t->dec_off);
	free(t->merges);
	free(t->specials);
	free(t->eog);
	free(t->chat_template);
	free(t->path);
	if (t->re_main)
		pcre2_code_free(t->re_main);
	if (t->re_digit)
		pcre2_code_free(t->re_digit);
	free(t);
}

int32_t rt_tokenizer_bos(const rt_tokenizer *t)
{
	return t->bos;
}

const char *rt_tokenizer_chat_template(const rt_tokenizer *t, size_t *len)
{
	*len = t->chat_template_len;
	return t->chat_template;
}

const char *rt_tokenizer_path(const rt_tokenizer *t)
{
	return t->path;
}

const char *rt_tokenizer_text(const rt_tokenizer *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->n_vocab)
		return NULL;
	*len = t->st.len[id];
	return t->st.blob + t->st.off[id];
}

int32_t rt_tokenizer_n_vocab(const rt_tokenizer *t)
{
	return t->n_vocab;
}

int32_t rt_tokenizer_find(const rt_tokenizer *t, const char *piece)
{
	int32_t id = strtab_find(&t->st, piece, strlen(piece));
	return id < t->n_vocab ? id : -1;
}

int rt_tokenizer_is_eog(const rt_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab && t->eog[id];
}

int rt_token_to_bytes(const rt_tokenizer *t, int32_t id, char *buf, int cap)
{
	if (id < 0 || id >= t->n_vocab)
		return -1;
	size_t n = t->dec_off[id + 1] - t->dec_off[id];
	if (buf && cap > 0)
		memcpy(buf, t->dec + t->dec_off[id], n < (size_t)cap ? n : (size_t)cap);
	return (int)n;
}

/* ---- tokenize ------------------------------------------------------------------ */

typedef struct bpe_sym {
	int32_t id;     /* string id */
	int32_t start;  /* byte offset in the piece */
	int32_t len;    /* bytes; 0 = merged away */
	int32_t prev, next;
} bpe_sym;

/* A candidate merge of symbols left and right: key orders them (BPE: the merge rank;
 * SentencePiece: minus the token's score; ties: leftmost first). BPE keeps the symbol ids
 * it saw (lid, rid) and the result (res) to spot stale pairs; SentencePiece keeps the
 * merged byte length in lid. */
typedef struct bpe_pair {
	double key;
	int32_t left, right;
	int32_t lid, rid, res;
} bpe_pair;

/* Per-call state: output sink and scratch reused across pieces. */
typedef struct tok_run {
	const rt_tokenizer *t;
	int32_t *out;
	int64_t *offs;    /* NULL, or [cap]: the byte offset in base where each id starts */
	const char *base; /* the whole text of the call */
	int64_t cap, n;
	bpe_sym *sym;
	bpe_pair *heap;
	size_t sym_cap, heap_cap, heap_n;
	pcre2_match_data *md;
	rt_err *err;
} tok_run;

/* Append id, which starts at p (a pointer into the call's text). */
static void emit(tok_run *r, int32_t id, const char *p)
{
	if (r->n < r->cap) {
		r->out[r->n] = id;
		if (r->offs)
			r->offs[r->n] = (int64_t)(p - r->base);
	}
	r->n++;
}

static int pair_less(const bpe_pair *a, const bpe_pair *b)
{
	return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static void heap_push(tok_run *r, bpe_pair p)
{
	if (r->heap_n == r->heap_cap) {
		r->heap_cap = r->heap_cap ? r->heap_cap * 2 : 256;
		r->heap = realloc(r->heap, r->heap_cap * sizeof *r->heap);
		RT_ASSERT(r->heap);
	}
	size_t i = r->heap_n++;
	while (i > 0) {
		size_t up = (i - 1) / 2;
		if (!pair_less(&p, &r->heap[up]))
			break;
		r->heap[i] = r->heap[up];
		i = up;
	}
	r->heap[i] = p;
}

static bpe_pair heap_pop(tok_run *r)
{
	bpe_pair top = r->heap[0], last = r->heap[--r->heap_n];
	size_t i = 0, n = r->heap_n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && pair_less(&r->heap[c + 1], &r->heap[c]))
			c++;
		if (!pair_less(&r->heap[c], &last))
			break;
		r->heap[i] = r->heap[c];
		i = c;
	}
	if (n)
		r->heap[i] = last;
	return top;
}

static const merge_slot *merge_find(const rt_tokenizer *t, int32_t a, int32_t b)
{
	uint64_t key = merge_key(a, b);
	uint32_t mask = t->n_merge_slots - 1, i = hash_u64(key) & mask;
	for (;;) {
		const merge_slot *m = &t->merges[i];
		if (m->key == key)
			return m;
		if (!m->key)
			return NULL;
		i = (i + 1) & mask;
	}
}

static void try_pair(tok_run *r, int32_t left, int32_t right)
{
	if (left < 0 || right < 0)
		return;
	const merge_slot *m = merge_find(r->t, r->sym[left].id, r->sym[right].id);
	if (m)
		heap_push(r, (bpe_pair){m->rank, left, right, r->sym[left].id, r->sym[right].id, m->result});
}

/* llama.cpp's ignore_merges (Llama 3): a piece whose byte-level text is a vocabulary
 * token is that token. 1 when emitted. */
static int bpe_whole(tok_run *r, const char *p, size_t n)
{
	const rt_tokenizer *t = r->t;
	char stackbuf[256] = { 0 };
	char *w = 2 * n <= sizeof stackbuf ? stackbuf : RT_MALLOC(2 * n);
	size_t m = 0;
	for (size_t i = 0; i < n; i++) { /* each byte's symbol is 1 or 2 UTF-8 bytes */
		int32_t b = t->byte_sym[(uint8_t)p[i]];
		memcpy(w + m, t->st.blob + t->st.off[b], t->st.len[b]);
		m += t->st.len[b];
	}
	int32_t id = strtab_find(&t->st, w, m);
	if (w != stackbuf)
		free(w);
	if (id < 0 || id >= t->n_vocab)
		return 0;
	emit(r, id, p);
	return 1;
}

/* Byte-level BPE of one pre-tokenized piece p[0..n), n >= 1. */
static void bpe_piece(tok_run *r, const char *p, size_t n)
{
	const rt_tokenizer *t = r->t;
	if (n > r->sym_cap) {
		free(r->sym);
		r->sym_cap = n > 2 * r->sym_cap ? n : 2 * r->sym_cap;
		r->sym = RT_MALLOC(r->sym_cap * sizeof *r->sym);
	}
	if (t->ignore_merges && bpe_whole(r, p, n))
		return;
	bpe_sym *s = r->sym;
	for (size_t i = 0; i < n; i++)
		s[i] = (bpe_sym){t->byte_sym[(uint8_t)p[i]], (int32_t)i, 1, (int32_t)i - 1,
		                 i + 1 < n ? (int32_t)i + 1 : -1};
	r->heap_n = 0;
	for (size_t i = 1; i < n; i++)
		try_pair(r, (int32_t)i - 1, (int32_t)i);
	while (r->heap_n) {
		bpe_pair q = heap_pop(r);
		bpe_sym *L = &s[q.left], *R = &s[q.right];
		if (L->len == 0 || R->len == 0 || L->id != q.lid || R->id != q.rid)
			continue; /* stale */
		L->id = q.res;
		L->len += R->len;
		R->len = 0;
		L->next = R->next;
		if (R->next >= 0)
			s[R->next].prev = q.left;
		try_pair(r, L->prev, q.left);
		try_pair(r, q.left, L->next);
	}
	for (int32_t i = 0; i >= 0; i = s[i].next) {
		if (s[i].id < t->n_vocab) {
			emit(r, s[i].id, p + s[i].start);
		} else { /* a string outside the vocabulary: its bytes that have tokens */
			for (int32_t k = 0; k < s[i].len; k++) {
				int32_t b = t->byte_sym[(uint8_t)p[s[i].start + k]];
				if (b < t->n_vocab)
					emit(r, b, p + s[i].start + k);
			}
		}
	}
}

/* Run re over s[0..n), calling piece() for every match and every unmatched gap. */
static int regex_split(tok_run *r, const pcre2_code *re, const char *s, size_t n,
                       int (*piece)(tok_run *, const char *, size_t))
{
	size_t pos = 0;
	while (pos < n) {
		int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, r->md, NULL);
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0) {
			PCRE2_UCHAR msg[160];
			pcre2_get_error_message(rc, msg, sizeof msg);
			return rt_err_set(r->err, "text: pre-tokenizer regex failed near byte %zu: %s", pos,
			                  (const char *)msg);
		}
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->md);
		size_t ms = ov[0], me = ov[1];
		if (me == ms) { /* no pattern here matches empty; guard against a loop anyway */
			me = ms + 1;
			while (me < n && ((uint8_t)s[me] & 0xC0) == 0x80)
				me++;
		}
		if (ms > pos && piece(r, s + pos, ms - pos) < 0)
			return -1;
		if (piece(r, s + ms, me - ms) < 0)
			return -1;
		pos = me;
	}
	if (pos < n && piece(r, s + pos, n - pos) < 0)
		return -1;
	return 0;
}

static int piece_bpe(tok_run *r, const char *s, size_t n)
{
	bpe_piece(r, s, n);
	return 0;
}

static int piece_gpt2(tok_run *r, const char *s, size_t n)
{
	return regex_split(r, r->t->re_main, s, n, piece_bpe);
}

/* Pre-tokenize and BPE one raw-text fragment. */
static int fragment(tok_run *r, const char *s, size_t n)
{
	if (n == 0)
		return 0;
	if (r->t->split_digits)
		return regex_split(r, r->t->re_digit, s, n, piece_gpt2);
	return piece_gpt2(r, s, n);
}

/* Candidate SentencePiece merge of adjacent symbols left and right of buf: pushed when
 * their concatenation is a vocabulary token (any type, as llama.cpp's text_to_token). */
static void spm_try(tok_run *r, const char *buf, int32_t left, int32_t right)
{
	if (left < 0 || right < 0)
		return;
	const bpe_sym *L = &r->sym[left], *R = &r->sym[right];
	int32_t id = strtab_find(&r->t->st, buf + L->start, (size_t)(L->len + R->len));
	if (id >= 0 && id < r->t->n_vocab)
		heap_push(r, (bpe_pair){-(double)r->t->score[id], left, right, L->len + R->len, 0, id});
}

/* llm_tokenizer_spm on one raw fragment s[0..n), n >= 1, with a leading space when
 * prefix: spaces become U+2581, UTF-8 characters are the first symbols, and the pair of
 * highest token score merges first (ties: leftmost) until no adjacent pair is a token;
 * a final symbol that is no token gives its bytes' fallback tokens. */
static void spm_fragment(tok_run *r, const char *s, size_t n, int prefix)
{
	const rt_tokenizer *t = r->t;
	char *buf = RT_MALLOC(3 * (n + 1));
	/* buf byte -> byte of s it came from, only when the caller wants offsets */
	size_t *at = r->offs ? RT_MALLOC(3 * (n + 1) * sizeof *at) : NULL;
	size_t m = 0;
	if (prefix) {
		memcpy(buf, "\xe2\x96\x81", 3);
		if (at)
			at[0] = at[1] = at[2] = 0;
		m = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(buf + m, "\xe2\x96\x81", 3);
			if (at)
				at[m] = at[m + 1] = at[m + 2] = i;
			m += 3;
		} else {
			if (at)
				at[m] = i;
			buf[m++] = s[i];
		}
	}
	if (m > r->sym_cap) {
		free(r->sym);
		r->sym_cap = m > 2 * r->sym_cap ? m : 2 * r->sym_cap;
		r->sym = RT_MALLOC(r->sym_cap * sizeof *r->sym);
	}
	bpe_sym *y = r->sym;
	int32_t ns = 0;
	for (size_t i = 0; i < m; ns++) {
		uint8_t c = (uint8_t)buf[i];
		size_t l = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
		if (l > m - i)
			l = m - i;
		y[ns] = (bpe_sym){0, (int32_t)i, (int32_t)l, ns - 1, i + l < m ? ns + 1 : -1};
		i += l;
	}
	r->heap_n = 0;
	for (int32_t i = 1; i < ns; i++)
		spm_try(r, buf, i - 1, i);
	while (r->heap_n) {
		bpe_pair q = heap_pop(r);
		bpe_sym *L = &y[q.left], *R = &y[q.right];
		if (L->len == 0 || R->len == 0 || L->len + R->len != q.lid)
			continue; /* stale */
		L->len += R->len;
		R->len = 0;
		L->next = R->next;
		if (R->next >= 0)
			y[R->next].prev = q.left;
		spm_try(r, buf, L->prev, q.left);
		spm_try(r, buf, q.left, L->next);
	}
	for (int32_t i = 0; ns > 0 && i >= 0; i = y[i].next) {
		int32_t id = strtab_find(&t->st, buf + y[i].start, (size_t)y[i].len);
		if (id >= 0 && id < t->n_vocab) {
			emit(r, id, at ? s + at[y[i].start] : s);
			continue;
		}
		for (int32_t k = 0; k < y[i].len; k++) { /* byte fallback */
			int32_t b = t->byte_sym[(uint8_t)buf[y[i].start + k]];
			if (b >= 0 || t->unk >= 0)
				emit(r, b >= 0 ? b : t->unk, at ? s + at[y[i].start + k] : s);
		}
	}
	free(at);
	free(buf);
}

/* tokenizer_st_partition: cut special tokens out of s[0..n) (the longest token first,
 * every occurrence left to right within each remaining raw fragment), then tokenize the
 * raw fragments. Fragments live in a list of (start, len, id) where id -1 is raw text;
 * ctl: control tokens may be cut from it (parse_special, or its bytes' mask). */
typedef struct frag {
	size_t start, len;
	int32_t id;
	int ctl;
} frag;

/* Room for one more fragment in both lists. */
static void frag_room(frag **fr, frag **nx, size_t nn, size_t *fcap)
{
	if (nn + 3 <= *fcap)
		return;
	*fcap *= 2;
	*fr = realloc(*fr, *fcap * sizeof **fr);
	*nx = realloc(*nx, *fcap * sizeof **nx);
	RT_ASSERT(*fr && *nx);
}

/* rt_tokenize with control tokens parsed where mask[i] != 0 (mask NULL: everywhere when
 * parse_special, nowhere else; user-defined tokens are parsed everywhere, as llama.cpp
 * does), raw text next to raw text tokenized together (across the mask's edges), and the
 * byte offset of each id in offs (NULL: none). */
static int64_t tokenize_core(const rt_tokenizer *t, const char *text, size_t len,
                             int parse_special, const uint8_t *mask, int32_t *out,
                             int64_t *offs, int64_t cap, rt_err *err)
{
	size_t bad;
	if (len && !text)
		return rt_err_set(err, "text: NULL with length %zu", len);
	if (!rt_utf8_valid(text, len, &bad))
		return rt_err_set(err, "text: invalid UTF-8 at byte %zu", bad);
	if (cap < 0 || (cap > 0 && !out))
		return rt_err_set(err, "text: bad output buffer (cap %lld)", (long long)cap);

	/* two fragment lists: each special token rewrites cur into nxt, O(fragments); with a
	 * mask, one raw fragment per run of equal mask bytes to start with */
	size_t nf = 0, fcap = 16;
	frag *fr = RT_MALLOC(fcap * sizeof *fr), *nx = RT_MALLOC(fcap * sizeof *nx);
	if (!mask) {
		fr[nf++] = (frag){0, len, -1, parse_special};
	} else {
		for (size_t a = 0; a < len;) {
			size_t b = a;
			while (b < len && !mask[b] == !mask[a])
				b++;
			frag_room(&fr, &nx, nf, &fcap);
			fr[nf++] = (frag){a, b - a, -1, mask[a] != 0};
			a = b;
		}
		if (!nf)
			fr[nf++] = (frag){0, 0, -1, 0};
	}
	for (int k = 0; k < t->n_specials; k++) {
		const special_tok *sp = &t->specials[k];
		const int user = sp->type == TT_USER_DEFINED;
		size_t nn = 0;
		for (size_t f = 0; f < nf; f++) {
			frag cur = fr[f];
			while (cur.id < 0 && (cur.ctl || user) && cur.len >= sp->len) {
				const char *base = text + cur.start;
				const char *hit = memmem(base, cur.len, sp->text, sp->len);
				if (!hit)
					break;
				size_t off = (size_t)(hit - base);
				frag_room(&fr, &nx, nn, &fcap);
				if (off > 0)
					nx[nn++] = (frag){cur.start, off, -1, cur.ctl};
				nx[nn++] = (frag){cur.start + off, sp->len, sp->id, cur.ctl};
				cur = (frag){cur.start + off + sp->len, cur.len - off - sp->len, -1, cur.ctl};
			}
			if (cur.id >= 0 || cur.len > 0) {
				frag_room(&fr, &nx, nn, &fcap);
				nx[nn++] = cur;
			}
		}
		frag *tmp = fr;
		fr = nx;
		nx = tmp;
		nf = nn;
	}
	/* raw text that a mask's edge cut in two is one fragment, as in the whole text */
	size_t w = 0;
	for (size_t f = 0; f < nf; f++) {
		if (w > 0 && fr[f].id < 0 && fr[w - 1].id < 0 && fr[w - 1].start + fr[w - 1].len == fr[f].start)
			fr[w - 1].len += fr[f].len;
		else
			fr[w++] = fr[f];
	}
	nf = w;

	tok_run r = {.t = t, .out = out, .offs = offs, .base = text, .cap = cap, .err = err};
	r.md = pcre2_match_data_create(4, NULL);
	RT_ASSERT(r.md);
	int rc = 0, prev_special = 1; /* SentencePiece: the text start counts as a special */
	for (size_t f = 0; f < nf && rc == 0; f++) {
		if (fr[f].id >= 0) {
			emit(&r, fr[f].id, text + fr[f].start);
			prev_special = 1;
		} else if (t->kind == TOK_SPM) {
			if (fr[f].len > 0)
				spm_fragment(&r, text + fr[f].start, fr[f].len, t->add_space_prefix && prev_special);
			prev_special = 0;
		} else {
			rc = fragment(&r, text + fr[f].start, fr[f].len);
		}
	}
	pcre2_match_data_free(r.md);
	free(r.sym);
	free(r.heap);
	free(fr);
	free(nx);
	return rc < 0 ? -1 : r.n;
}

int64_t rt_tokenize(const rt_tokenizer *t, const char *text, size_t len, int parse_special,
                    int32_t *out, int64_t cap, rt_err *err)
{
	return tokenize_core(t, text, len, parse_special, NULL, out, NULL, cap, err);
}

/* The BOS rule of a prompt (rt_tokenize_prompt) over tokenize_core: 1 when the file's BOS
 * is put first, i.e. it adds one and the text does not start with its text where control
 * tokens are parsed (a rendered chat prompt carries its BOS as text: llama.cpp strips it
 * from the template's output before tokenizing with add_special, so the prompt holds one
 * BOS either way). */
static int bos_added(const rt_tokenizer *t, const char *text, size_t len, int parse_special,
                     const uint8_t *mask)
{
	size_t bl = 0;
	const char *bt = t->bos >= 0 ? rt_tokenizer_text(t, t->bos, &bl) : NULL;
	if (!bt)
		return 0;
	const int ctl = mask ? len > 0 && mask[0] : parse_special;
	return !(ctl && bl && len >= bl && text && !memcmp(text, bt, bl));
}

static int64_t tokenize_prompt_core(const rt_tokenizer *t, const char *text, size_t len,
                                    int parse_special, const uint8_t *mask, int32_t *out,
                                    int64_t *offs, int64_t cap, rt_err *err)
{
	const int add = bos_added(t, text, len, parse_special, mask);
	if (cap < 0 || (cap > 0 && !out))
		return rt_err_set(err, "text: bad output buffer (cap %lld)", (long long)cap);
	int64_t n = tokenize_core(t, text, len, parse_special, mask, cap > add ? out + add : NULL,
	                          offs && cap > add ? offs + add : NULL, cap > add ? cap - add : 0,
	                          err);
	if (n < 0)
		return -1;
	if (add && cap > 0) {
		out[0] = t->bos;
		if (offs)
			offs[0] = 0;
	}
	return n + add;
}

int64_t rt_tokenize_prompt(const rt_tokenizer *t, const char *text, size_t len, int parse_special,
                           int32_t *out, int64_t cap, rt_err *err)
{
	return tokenize_prompt_core(t, text, len, parse_special, NULL, out, NULL, cap, err);
}

int32_t *rt_tokenize_pieces(const rt_tokenizer *t, const rt_tok_piece *p, int n, int64_t *n_ids,
                            int32_t **piece_of, rt_err *err)
{
	size_t len = 0;
	for (int i = 0; i < n; i++)
		len += p[i].len;
	char *text = RT_MALLOC(len + 1);
	uint8_t *mask = RT_MALLOC(len + 1);
	size_t *start = RT_MALLOC(((size_t)n + 1) * sizeof *start); /* each piece's first byte */
	size_t at = 0;
	for (int i = 0; i < n; i++) {
		start[i] = at;
		if (p[i].len)
			memcpy(text + at, p[i].text, p[i].len);
		memset(mask + at, p[i].special != 0, p[i].len);
		at += p[i].len;
	}
	text[len] = 0;
	int32_t *ids = NULL, *of = NULL;
	int64_t *offs = NULL;
	int64_t c = tokenize_prompt_core(t, text, len, 0, mask, NULL, NULL, 0, err);
	if (c >= 0) {
		ids = RT_MALLOC((size_t)(c ? c : 1) * sizeof *ids);
		offs = RT_MALLOC((size_t)(c ? c : 1) * sizeof *offs);
		if (tokenize_prompt_core(t, text, len, 0, mask, ids, offs, c, err) != c) {
			if (!err->msg[0])
				rt_err_set(err, "text: tokenizer count changed");
			c = -1;
		}
	}
	if (c >= 0 && piece_of) { /* the piece of each id's last byte: offsets ascend */
		of = RT_MALLOC((size_t)(c ? c : 1) * sizeof *of);
		int k = 0;
		for (int64_t i = 0; i < c; i++) {
			const int64_t end = i + 1 < c ? offs[i + 1] : (int64_t)len;
			const size_t last = (size_t)(end > offs[i] ? end - 1 : offs[i]);
			while (k + 1 < n && last >= start[k + 1])
				k++;
			of[i] = n ? k : 0;
		}
		*piece_of = of;
	}
	free(offs);
	free(start);
	free(mask);
	free(text);
	if (c < 0) {
		free(ids);
		return NULL;
	}
	*n_ids = c;
	return ids;
}
