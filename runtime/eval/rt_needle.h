/*
 * rt_needle: synthetic long-context retrieval prompts built to an exact token length with
 * the model's own tokenizer, and their scorers:
 *
 *  - passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention"): an instruction,
 *    repeats of the filler "The grass is green. The sky is blue. ...", the needle "The pass
 *    key is K. Remember it. K is the pass key." at a depth of d% of the filler, more
 *    filler, and the primed question "What is the pass key? The pass key is". Scored by
 *    exact match of the first number generated.
 *  - needle in a haystack (gkamradt/LLMTest_NeedleInAHaystack, offline variant): real text
 *    (e.g. coreutils.info) cut to length, the needle "The best thing to do in San Francisco
 *    is eat a sandwich and sit in Dolores Park on a sunny day." inserted at d% of the
 *    haystack tokens moved back to just after the previous '.' token (as the original
 *    does), and a primed question. Scored by keywords ("sandwich" and "Dolores Park").
 *  - multi-key passkey (RULER's niah_multikey, Hsieh et al. 2024, arXiv 2404.06654, on the
 *    passkey filler): RT_MULTIKEY_N needles "The pass key of the LABEL door is K. Remember
 *    it. K is the pass key of the LABEL door." with distinct labels and keys, one asked
 *    ("What is the pass key of the LABEL door? The pass key of the LABEL door is"), the
 *    others distractors. Scored by exact match of the first number with the asked key (a
 *    distractor's key is a miss).
 *  - multi-instruction (a system prompt of three instructions, IFEval-style checks by
 *    keyword, Zhou et al. 2023, arXiv 2311.07911): always in the chat template, the system
 *    message "Follow these three instructions in every answer. 1. Say that your name is
 *    NAME. 2. Mention your pet PET. 3. Mention the city of CITY." (the three drawn from
 *    the seed), the filler as the user turn's body, then "Tell me about yourself." and the
 *    assistant's turn. Each instruction is checked by its word in the answer (ASCII
 *    case-insensitive). A small model follows only some of them even with the full cache
 *    (SmolLM2-135M: the name, and the pet at short lengths), so a policy is scored against
 *    what the full cache follows on the same prompt (`needle` runs the full cache beside it).
 *
 * The context (everything up to the question) and the question are returned as separate
 * token arrays, so a caller can compress the cache after the context only
 * (question-agnostic) or after context + question (question-aware). Their lengths add up
 * exactly to the requested token count. With `chat` set the prompt is wrapped in the
 * model's chat template (rt_chat_render): the context opens the user turn, the
 * question closes it and opens the assistant turn, ending in the answer priming.
 * Measured with the full cache on SmolLM2-135M-Instruct (greedy, one sample each): plain
 * prompts retrieve the passkey and the NIAH needle at 1024 (depth 50) and 4096 (depth 25)
 * tokens; ChatML prompts do too except the 4096-token passkey (" a magical key that
 * ..."), so plain is the better default for this model.
 */
#ifndef RT_NEEDLE_H
#define RT_NEEDLE_H

#include <stddef.h>
#include <stdint.h>

#include "model/rt_tokenizer.h"
#include "eval/rt_compression.h"
#include "policy/rt_seq.h"
#include "base/rt_util.h"

typedef enum rt_needle_kind {
	RT_NEEDLE_PASSKEY = 0,
	RT_NEEDLE_NIAH = 1,
	RT_NEEDLE_MULTIKEY = 2,
	RT_NEEDLE_INSTRUCT = 3,
} rt_needle_kind;

/* The exact strings of the two tasks (the sources named at the top). */
#define RT_PASSKEY_INSTRUCTION                                                          \
	"There is an important info hidden inside a lot of irrelevant text. Find it and " \
	"memorize them. I will quiz you about the important information there."
#define RT_PASSKEY_FILLER                                                               \
	" The grass is green. The sky is blue. The sun is yellow. Here we go. There and " \
	"back again."
#define RT_PASSKEY_QUESTION "What is the pass key?"
#define RT_PASSKEY_PRIME "The pass key is"
#define RT_NIAH_NEEDLE                                                                  \
	"The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park " \
	"on a sunny day."
#define RT_NIAH_QUESTION "What is the best thing to do in San Francisco?"
#define RT_NIAH_PRIME "The best thing to do in San Francisco is"
/* Multi-key: needles per prompt and their labels (words the passkey filler does not use). */
#define RT_MULTIKEY_N 4
#define RT_MULTIKEY_LABELS { "north", "south", "east", "west" }
/* Multi-instruction: the system message's format (NAME, PET, CITY), the question, and the
 * word lists the three are drawn from (rt_needle_instruct). */
#define RT_INSTRUCT_SYSTEM                                                                 \
	"Follow these three instructions in every answer. 1. Say that your name is %s. "     \
	"2. Mention your pet %s. 3. Mention the city of %s."
#define RT_INSTRUCT_QUESTION "Tell me about yourself."
#define RT_INSTRUCT_NAMES { "Zorblax", "Quimby", "Marlowe", "Bexley" }
#define RT_INSTRUCT_PETS { "tortoise", "parrot", "hedgehog", "llama" }
#define RT_INSTRUCT_CITIES { "Lisbon", "Oslo", "Cairo", "Lima" }
#define RT_INSTRUCT_N 3 /* instructions per prompt: bits 0 (name), 1 (pet), 2 (city) */
/* How far (tokens) the NIAH needle may move back from the requested depth. */
#define RT_NIAH_MAX_BACK 128

/* A built prompt. Owns ctx and question (free with rt_needle_prompt_free). */
typedef struct rt_needle_prompt {
	rt_needle_kind kind;
	int32_t *ctx;          /* [n_ctx] token ids: (chat opener) instruction/haystack+needle */
	int64_t n_ctx;
	int32_t *question;     /* [n_question] token ids: question + answer priming */
	int64_t n_question;
	int64_t needle_pos;    /* token offset of the needle's first token in ctx */
	int64_t needle_len;    /* tokens of the needle */
	int64_t target_pos;    /* token offset in ctx the requested depth maps to */
	int64_t hay_start;     /* offset in ctx where the filler/haystack begins */
	int64_t hay_tokens;    /* filler/haystack tokens in ctx (excluding the needle) */
	int64_t unit;          /* passkey: tokens per filler repeat; NIAH: 0 */
	int64_t sys_pos;       /* multi-instruction: the system message's first token in ctx */
	int64_t sys_len;       /* and its tokens: those whose text overlaps the message's (the
	                        * template's own around it not counted, as serve marks a chat's
	                        * system span); 0 for the other tasks and where the message could
	                        * not be placed */
	double depth;          /* requested depth, percent of the filler/haystack */
	uint32_t passkey;      /* passkey and multi-key: the key asked (1..50000) */
	uint32_t keys[RT_MULTIKEY_N];    /* multi-key: every needle's key; keys[0] is asked */
	int64_t key_pos[RT_MULTIKEY_N];  /* multi-key: token offset of needle j in ctx */
	char words[RT_INSTRUCT_N][16];   /* multi-instruction: NAME, PET, CITY */
	char answer[64];       /* expected answer: the key's digits, RT_NIAH_NEEDLE's keywords
	                        * "sandwich; Dolores Park", or "NAME; PET; CITY" */
} rt_needle_prompt;

/* The passkey for a seed: 1 + rt_rng_below(50000) of rt_rng seeded with seed (rt_stats.h),
 * so a (length, depth, seed) triple always gives the same prompt. */
uint32_t rt_needle_passkey_for_seed(uint64_t seed);

/* Build a passkey prompt of exactly n_tokens tokens (n_ctx + n_question == n_tokens).
 * Layout: [chat opener] instruction, filler tokens, needle, filler tokens, question. The
 * filler is the tokenized RT_PASSKEY_FILLER repeated cyclically for the F tokens left over;
 * the needle goes at the filler-repeat boundary nearest to depth% of F (never past F), so
 * |needle_pos - target_pos| <= unit; when F is not a multiple of the repeat, the stream ends
 * with a partial repeat just before the question. depth in [0, 100].
 * Errors (-1, err set): depth outside [0,100], n_tokens too small to hold the fixed parts
 * ("passkey: N tokens is too short; the fixed parts take M"), tokenizer failures. */
int rt_needle_passkey(const rt_tokenizer *t, int64_t n_tokens, double depth, uint64_t seed,
                      int chat, rt_needle_prompt *out, rt_err *err);

/* Build a multi-key passkey prompt of exactly n_tokens tokens: as rt_needle_passkey with
 * RT_MULTIKEY_N needles in the filler, each at the filler-repeat boundary nearest to its
 * depth (never past the filler): needle j at D + j·100/N percent, less 100 above 100 (D =
 * depth; so the asked needle, j = 0, sits at the requested depth and the distractors spread
 * over the rest of the filler; needles at one boundary follow each other in j order).
 * Needle j's label is RT_MULTIKEY_LABELS[(seed + j) mod N]; its key is
 * rt_needle_passkey_for_seed(seed·N + j), the next seed up while it equals an earlier key.
 * needle_pos/needle_len are the asked needle's, key_pos[j] every needle's offset.
 * Errors: as rt_needle_passkey ("multikey: ..."). */
int rt_needle_multikey(const rt_tokenizer *t, int64_t n_tokens, double depth, uint64_t seed,
                       int chat, rt_needle_prompt *out, rt_err *err);

/* Build a multi-instruction prompt of exactly n_tokens tokens in the model's chat template
 * (rt_chat_render; the task has no plain form): ctx = the template's opening with the system
 * message RT_INSTRUCT_SYSTEM and the user turn's opening, then the passkey filler to length;
 * question = "\n" RT_INSTRUCT_QUESTION, the user turn's close and the assistant's opening.
 * NAME, PET and CITY are drawn from their lists by rt_rng seeded with seed (one draw
 * each, in that order). hay_start/hay_tokens delimit the filler; no needle (needle_len 0);
 * sys_pos/sys_len: the tokens whose text overlaps the system message's (each token's
 * bytes, rt_token_to_bytes, walked along the rendered opening; a BOS the tokenizer adds
 * takes none, a SentencePiece space prefix is not counted), sys_len 0 where the walk fails.
 * Errors: as rt_needle_passkey ("instruct: ..."), a model without a chat template. */
int rt_needle_instruct(const rt_tokenizer *t, int64_t n_tokens, uint64_t seed,
                       rt_needle_prompt *out, rt_err *err);

/* Build a needle-in-a-haystack prompt of exactly n_tokens tokens from haystack text[len]
 * (UTF-8; invalid bytes and control bytes other than tab/newline are replaced by ' ').
 * Only as much of the text as needed is tokenized; if the whole text is too short it is
 * repeated. With H haystack tokens and w = round(depth% * H), the needle (newline-wrapped
 * RT_NIAH_NEEDLE) goes right after the last token at or before w whose text ends with '.'
 * (trailing white space ignored) — gkamradt's rule — searched back at most
 * RT_NIAH_MAX_BACK tokens (the start of the haystack also counts); if there is none (info
 * menus, code listings), after the last token ending in a newline in that window; if
 * neither, exactly at w. Depth 100 puts it at the very end.
 * Errors: as rt_needle_passkey ("niah: ..."), and an empty text. */
int rt_needle_niah(const rt_tokenizer *t, const char *text, size_t len, int64_t n_tokens,
                   double depth, int chat, rt_needle_prompt *out, rt_err *err);

void rt_needle_prompt_free(rt_needle_prompt *p);

/* For a GNU Info file (nodes separated by "\x1f\n"), the byte offset where the second
 * node starts, i.e. past the license preamble and the Top node with its long menus, so a
 * haystack starts on prose ("File: coreutils.info,  Node: Introduction, ..." for
 * coreutils.info). 0 when text[len] has fewer than two separators (not an Info file). */
size_t rt_needle_info_body(const char *text, size_t len);

/* 1 if the first run of decimal digits in generated text equals `key` exactly (no leading
 * zeros, not a longer number), else 0 (also 0 when there is no digit). */
int rt_needle_score_passkey(const char *generated, uint32_t key);

/* 1 if generated text contains both "sandwich" and "Dolores Park" (ASCII
 * case-insensitive), else 0. */
int rt_needle_score_niah(const char *generated);

/* Multi-instruction: the instructions generated text follows, bit i for words[i] found in
 * it (ASCII case-insensitive substring). */
unsigned rt_needle_instruct_checks(const rt_needle_prompt *p, const char *generated);

/* Multi-instruction against the full cache: 1 when the run's checks include every check of
 * the full cache's (ref), else 0 (1 too when ref is 0: nothing to follow); adds the bits of
 * run & ref to *followed and those of ref to *followed_ref (the accuracy `needle` reports is
 * their ratio over the trials). */
int rt_needle_instruct_vs_ref(unsigned run, unsigned ref, int *followed, int *followed_ref);

/* Score by the prompt's kind: passkey and multi-key by rt_needle_score_passkey of the asked
 * key, NIAH by its keywords, multi-instruction 1 when every instruction is followed (the
 * absolute score; `needle` reads it against the full cache's checks instead). */
int rt_needle_score(const rt_needle_prompt *p, const char *generated);

/* ---- one trial ---------------------------------------------------------------------- */

/* How a trial runs. Modes (kvpress's distinction): aware puts the question inside the
 * compressed prompt (prompt length = context + question, so prompt-end triggers fire after
 * the question); agnostic compresses the context first and appends the question after. */
typedef struct rt_needle_how {
	int agnostic;        /* 0: question-aware (the default of `needle` and `ab`), 1: agnostic */
	int mark_question;   /* 1: the question's tokens carry span RT_SPAN_QUESTION */
	int mark_system;     /* 1: a multi-instruction prompt's system message carries span
	                      * RT_SPAN_SYSTEM, as serve marks a chat's (runtime/policy/rt_span.h),
	                      * by its positions (rt_seq_span_range), so the prompt is fed whole
	                      * as without it. Every sequence must have its span names
	                      * (rt_seq_use_spans), as for mark_question */
	int64_t n_gen;       /* answer tokens to generate at most */
} rt_needle_how;

/* What one sequence answered. */
typedef struct rt_needle_answer {
	char gen[512];       /* the generated text, cut to its longest valid UTF-8 prefix */
	char answer[64];     /* the prompt's expected answer (rt_needle_prompt.answer) */
	int correct;         /* rt_needle_score of the text as generated */
	unsigned checks;     /* multi-instruction: rt_needle_instruct_checks of it; else 0 */
	int left;            /* 1: the sequence had left the batch (nothing generated) */
	rt_seq_stats st;     /* the sequence's counters after the answer */
	rt_compression x;    /* after the answer, over the tokens seen (rt_compression.h) */
} rt_needle_answer;

/* One trial of prompt np on K sequences s[0..K): each is reset (prompt length by the
 * mode), the context is prefilled (in lockstep through b when b is not NULL, which must be
 * a batch over s[0..K); else K must be 1), the question is fed (marked when asked), and
 * each sequence still in the batch generates its answer with rt_decode (greedy) and is
 * scored into ans[k]. logits: [K × n_vocab] floats, one: [n_vocab] scratch. Returns 0, or
 * -1 with err set (a forward or decoding error). */
int rt_needle_trial(rt_seq *const *s, int K, rt_seq_batch *b, const rt_tokenizer *tk,
                    const rt_needle_prompt *np, const rt_needle_how *how, float *logits,
                    float *one, rt_needle_answer *ans, rt_err *err);

#endif
