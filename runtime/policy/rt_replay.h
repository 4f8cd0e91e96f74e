/*
 * rt_replay: KVzip's context replay (Kim et al., "KVzip: Query-Agnostic KV Cache Compression
 * with Context Reconstruction", arXiv 2505.23416; kvpress kvzip_press.py), the runtime side
 * of the `replay_attn` signal (docs/language.md 7.13). When the prompt of a sequence under a
 * policy with KVP_NEED_REPLAY ends, before the compress there, the model reads a repeat
 * instruction and then the prompt again, teacher-forced, on top of the full cache; the score
 * of each prompt entry is the largest attention it receives, over the query heads of its GQA
 * group and every replayed query (instruction included). The replay's own KV rows are then
 * removed, so the store holds the prompt exactly as before and the policy compresses it.
 *
 * The replay follows kvpress's KVzipPress:
 *   * the prompt is replayed in chunks of RT_REPLAY_CHUNK tokens; chunk c's input is
 *       c = 0:  "\n\nRepeat the previous context exactly." + SUFFIX + prompt[0 .. C)
 *       c > 0:  "\n\nRepeat the part of the previous context exactly, starting with"
 *               + the last RT_REPLAY_TAIL prompt tokens of chunk c-1 + SUFFIX + the chunk
 *     where SUFFIX is what the model's chat template writes after a user message's content
 *     (the end of the user turn and the assistant's header: "<|im_end|>\n<|im_start|>
 *     assistant\n" for ChatML, runtime/model/rt_chat.h), or "\n" for a file without a
 *     template; the text is tokenized without BOS. Each chunk sits at the positions right
 *     after the prompt (its KV rows are removed before the next chunk);
 *   * chunk [start, end)'s scores come from the forward's own attention probabilities p
 *     over every entry it sees (the prompt and the replay so far, causal), renormalised
 *     over kvpress's key set S = the first min(RT_REPLAY_SINKS, start) positions, the chunk
 *     [start, end) and the replay rows: score_i = max over the group's query heads r and
 *     the chunk's replayed queries t of p_rt,i / Σ_{j in S} p_rt,j, for i in [start, end).
 *     A prompt of at most RT_REPLAY_CHUNK tokens is one chunk and S is every entry: the
 *     score is the plain attention probability (softmax over context + instruction +
 *     replay). No other normalisation (kvpress: none). kvpress replays the context after
 *     a chat template's prefix and scores the prefix 0 but its first n_sink tokens 1; here
 *     the whole prompt is the context and sinks are a policy guard (`keep sinks`).
 *
 * Cost: a second forward over the prompt (plus the instruction per chunk), so about twice
 * the prefill; the store needs room for one replayed chunk beyond the prompt
 * (RT_REPLAY_CHUNK + RT_REPLAY_ROOM entries per head, reserved address space: rt_seq adds
 * it to the capacity), and the positions prompt_len .. prompt_len + that must be inside the
 * model's context_length. The replay runs on the CPU forward.
 *
 * Sliding-window layers (Gemma 3's five of six, a Mistral window): the replay's forward
 * masks as any forward does (a replayed query at position t sees the entries at positions
 * above t - window), but skips the window trim (rt_fwd.keep_windows), so the prompt's
 * entries in a window list stay while the replay runs and the list holds after it what it
 * held before. Such a list holds only what the next position sees (the prompt's last window -
 * 1 tokens), and every replayed chunk sits at the positions right after the prompt, so only
 * its first window - 1 queries (its instruction and the start of its text) reach them: their
 * scores measure that, not the reconstruction of the whole prompt. Compression counts every
 * list, so a ratio applies to the window lists too.
 */
#ifndef RT_REPLAY_H
#define RT_REPLAY_H

#include <stdint.h>

#include "base/rt_util.h"
#include "kv/rt_kv.h"
#include "model/rt_model.h"

#define RT_REPLAY_CHUNK 2048 /* kvpress prepare(chunk_size = 2048) */
#define RT_REPLAY_TAIL 8     /* kvpress prepare(prev_postfix_size = 8) */
#define RT_REPLAY_SINKS 4    /* kvpress n_sink: the leading positions in every chunk's key set */
#define RT_REPLAY_ROOM 96    /* entries beyond a chunk: instruction, tail and suffix (at most) */

typedef struct rt_replay {
	int32_t *first, *next, *suffix; /* instruction tokens: chunk 0's, later chunks', SUFFIX */
	int n_first, n_next, n_suffix;
	int32_t *tok;            /* [cap_tok] the prompt's tokens as fed (rt_replay_record) */
	int64_t n_tok, cap_tok;
	float *score;            /* [n_layer × n_kv_head × score_n] the scores (kvp_ctx.replay) */
	int64_t score_n;         /* positions per row: the prompt length of the last replay */
	size_t score_cap;        /* floats allocated */
	int32_t *in;             /* [RT_REPLAY_CHUNK + RT_REPLAY_ROOM] one chunk's input */
	int32_t *keep;           /* [cap] 0, 1, ...: the entries kept when a chunk's rows go */
	int32_t *n_before;       /* [n_layer × n_kv_head] entries per list before a chunk */
	int32_t cap;             /* the store's capacity */
	int64_t start, end;      /* while a chunk runs: the prompt positions it replays */
	int64_t prompt_len;      /* while a chunk runs: the first replay position */
	int n_layer, n_kv_head;
	int64_t tokens;          /* tokens replayed (instructions included) since reset */
	int64_t peak_entries;    /* most entries the store held during a replay (the prompt and
	                            a replayed chunk, rt_kv_entries), and its bytes then */
	int64_t peak_bytes, peak_kvbytes; /* (rt_kv_bytes_held, rt_kvbytes_held) */
	double seconds;          /* wall time of the replays since reset */
} rt_replay;

/* Prepare the replay of sequences of model m on stores of cap entries per head: reads the
 * tokenizer of the model's file (m->path) and tokenizes the instructions. Errors (-1, err):
 * the file cannot be opened or has no tokenizer, instructions longer than RT_REPLAY_ROOM
 * allows, allocation failure (rp is then safe to free). */
int rt_replay_init(rt_replay *rp, const rt_model *m, int32_t cap, rt_err *err);
void rt_replay_free(rt_replay *rp);
/* Forget the recorded prompt and the counters (a new sequence); keeps the allocations. */
void rt_replay_reset(rt_replay *rp);
/* Size the token and score buffers for a prompt of prompt_len tokens (<= 0: nothing), so
 * that feeding that prompt allocates nothing (rt_seq calls it at init and reset). Returns
 * 0, or -1 on allocation failure (the buffers then grow when the prompt is fed). */
int rt_replay_reserve(rt_replay *rp, int64_t prompt_len);

/* Record tokens tok[0..n) fed at positions pos.. (those before prompt_len are prompt
 * tokens; recording stops there). Grows the token buffer only when rt_replay_reserve did
 * not size it. Errors (-1, err): allocation failure. */
int rt_replay_record(rt_replay *rp, const int32_t *tok, int n, int64_t pos, int64_t prompt_len,
                     rt_err *err);

/* Replay the recorded prompt (prompt_len tokens, all of them recorded, the store holding
 * them and nothing after) through forward f on store kv and fill rp->score; f's hooks are
 * replaced for the replay and restored, the replayed rows removed. Errors (-1, err): fewer
 * tokens recorded than the prompt, no room in the store or beyond the model's
 * context_length for a chunk, the KV pool exhausted, a forward error, allocation failure. */
int rt_replay_run(rt_replay *rp, rt_fwd *f, rt_kv *kv, int64_t prompt_len, rt_err *err);

#endif
