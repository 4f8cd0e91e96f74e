/*
 * rt_tokenizer: the tokenizers of GGUF files, token for token as llama.cpp's
 * llama-vocab.cpp, built from tokenizer.ggml.{model,pre,tokens,token_type,merges,scores}:
 *   - tokenizer.ggml.model "gpt2": byte-level BPE with the pre-tokenizer named by
 *     tokenizer.ggml.pre (smollm/starcoder/refact/command-r: every digit its own piece,
 *     then the GPT-2 regex; gpt-2/mpt/olmo: the GPT-2 regex; llama-bpe/llama3 (Llama 3):
 *     the Llama 3 regex, whole-word tokens before merges; qwen2: the Qwen2 regex), run
 *     with PCRE2 for Unicode classes;
 *   - tokenizer.ggml.model "llama": SentencePiece-style BPE by token score (Llama 2,
 *     Mistral, Gemma, Phi-3), spaces as U+2581, byte fallback to <0xNN> tokens, a space
 *     before the text when tokenizer.ggml.add_space_prefix says so (default yes);
 * special/control tokens matched verbatim in the input when allowed, decoding back to
 * UTF-8 bytes, and the chat template of the file's tokenizer.chat_template
 * (rt_chat_render). Anything else is refused at init naming the file and the key.
 */
#ifndef RT_TOKENIZER_H
#define RT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "model/rt_gguf.h"
#include "base/rt_util.h"

typedef struct rt_tokenizer rt_tokenizer;

/* Build from an open GGUF (the tokenizer copies what it needs; g may be closed after).
 * Fails with "PATH: tokenizer: reason" for a missing/unsupported model or pre-tokenizer. */
rt_tokenizer *rt_tokenizer_init(const rt_gguf *g, rt_err *err);
void rt_tokenizer_free(rt_tokenizer *t);

int32_t rt_tokenizer_n_vocab(const rt_tokenizer *t);

/* Tokenize len bytes of UTF-8 text. parse_special=1 lets control tokens such as
 * "<|im_start|>" in the text map to their ids (needed for chat prompts); 0 treats them as
 * plain text. No BOS is added (rt_tokenize_prompt adds it). Returns the number of ids;
 * writes at most cap ids to out (call with out=NULL, cap=0 to size). Returns -1 with err
 * set on invalid UTF-8 ("text: invalid UTF-8 at byte N"). */
int64_t rt_tokenize(const rt_tokenizer *t, const char *text, size_t len, int parse_special,
                    int32_t *out, int64_t cap, rt_err *err);

/* rt_tokenize with llama.cpp's add_special (llama_tokenize(..., add_special=true), as
 * llama-perplexity, llama-server and llama-bench feed a prompt): the file's BOS
 * (rt_tokenizer_bos) first when it adds one, then the text's ids. With parse_special, a
 * text that already starts with the BOS token's text (a chat prompt rendered by rt_chat)
 * gets no second BOS, as llama.cpp strips it from the rendered template. Same return,
 * sizing call and errors as rt_tokenize; SmolLM2 (add_bos_token false) gets no BOS. */
int64_t rt_tokenize_prompt(const rt_tokenizer *t, const char *text, size_t len, int parse_special,
                           int32_t *out, int64_t cap, rt_err *err);

/* One piece of a prompt given in pieces (a chat's template parts and messages, serve's
 * prompt segments): text[0..len), UTF-8; special = 1 lets control tokens be parsed in it
 * (template text), 0 keeps it plain text (a message's content cannot forge a turn). */
typedef struct rt_tok_piece {
	const char *text;
	size_t len;
	int special;
} rt_tok_piece;

/* The ids of a prompt given in n pieces, as llama.cpp tokenizes their concatenation with
 * add_special (rt_tokenize_prompt's BOS rule; raw text is tokenized across the pieces'
 * edges, so cutting a prompt into pieces changes no id, e.g. SentencePiece's leading space
 * is added once, not per piece), except that control tokens are parsed only inside pieces
 * with special = 1. Returns a heap array of *n_ids ids the caller frees and, when piece_of
 * is not NULL, in *piece_of a heap array of the index of the piece each id's last byte lies
 * in (a word's leading space may lie in the piece before it: the word belongs to the piece
 * that holds it, so a protected segment's first word is protected; an added BOS: the first
 * non-empty piece), caller frees; NULL with err as rt_tokenize's ("text: invalid UTF-8 at
 * byte N", N counted in the concatenation). A control token is found only inside one
 * special piece; a user-defined token (found in any text) only inside one piece too, so one
 * cut by a piece's edge is tokenized as text, unlike in the whole text. */
int32_t *rt_tokenize_pieces(const rt_tokenizer *t, const rt_tok_piece *p, int n, int64_t *n_ids,
                            int32_t **piece_of, rt_err *err);

/* Bytes of one token's text (byte-level BPE symbols mapped back to raw bytes; control
 * tokens give their literal text). Writes up to cap bytes, returns the full length, or -1
 * for an out-of-range id. */
int rt_token_to_bytes(const rt_tokenizer *t, int32_t id, char *buf, int cap);

/* The BOS id llama.cpp puts before a prompt for this file (tokenizer.ggml.add_bos_token,
 * default yes for "llama" SentencePiece files and the llama-bpe pre-tokenizer, no for
 * other BPE; the id from tokenizer.ggml.bos_token_id, default 1 for SentencePiece), or
 * -1 when the file's prompts start without one (SmolLM2, Qwen2). */
int32_t rt_tokenizer_bos(const rt_tokenizer *t);

/* The file's tokenizer.chat_template text (its length in *len), or NULL when the file has
 * none; the file's path. Both owned by t (rt_chat renders with them). */
const char *rt_tokenizer_chat_template(const rt_tokenizer *t, size_t *len);
const char *rt_tokenizer_path(const rt_tokenizer *t);

/* The vocabulary text of token id (its length in *len; owned by t), or NULL when out of
 * range. */
const char *rt_tokenizer_text(const rt_tokenizer *t, int32_t id, size_t *len);

/* Token id of an exact vocabulary string (e.g. "<|im_end|>"), or -1. */
int32_t rt_tokenizer_find(const rt_tokenizer *t, const char *piece);

/* 1 when id ends generation, by llama.cpp's rule: the GGUF eos/eot/eom ids and the tokens
 * named <|endoftext|>, <|im_end|>, <reponame>, ... (for SmolLM2 the set is {0, 2, 4}). */
int rt_tokenizer_is_eog(const rt_tokenizer *t, int32_t id);

#endif
