/*
 * rt_seq: one sequence evaluated under one KV-cache policy — the loop that joins the
 * model forward (rt_model), the KV store (rt_kv) and a compiled policy (rt_policy), as
 * docs/architecture.md ("The KV store") and docs/runtime_abi.md describe it. An rt_seq owns the store (cap entries per
 * (layer, KV head)), the policy's run state (parameters, context, scratch) and the
 * forward scratch, all allocated once by rt_seq_init; feeding tokens allocates nothing.
 *
 * Per chunk: rt_run_chunk gives the largest number of tokens that cannot cross the
 * policy's next trigger (or the prompt end); the forward appends their keys/values to
 * every head, calls the policy's init_entries on the new entries (rt_fwd.on_append),
 * runs attention and hands every (layer, KV head, query row) to the policy's observe
 * (probabilities and outputs only when its needs flags ask for them); then
 * rt_run_advance moves the context forward and compresses when the policy says so.
 * Chunked feeding is therefore exactly token-by-token feeding (tests/test_seq.c).
 *
 * Positions. KVP_POS_ORIGINAL: keys keep the RoPE of their token position. KVP_POS_
 * COMPACTED (StreamingLLM's pos_shift, Xiao et al. 2024): the forward rotates the key and
 * the queries of a new token at the index the key gets in its (layer, KV head) list
 * (rt_fwd.rope_at_index), and after every compress (and every chunk on a model with
 * sliding-window layers, whose forward drops what the window hides) rt_seq re-rotates each kept key from
 * the index it was rotated at to its new index by the delta rotation (ggml "normal" RoPE:
 * adjacent pairs (x[2i], x[2i+1]) turned by delta·base^(-2i/n_rot), computed in double).
 * The index each entry was rotated at is kept per (head, original position) in rt_seq,
 * not in rt_kv. Repeated delta rotations accumulate float rounding (about 1e-7 relative
 * per compress that moves the key).
 *
 * Context replay (KVP_NEED_REPLAY, KVzip's `replay_attn`): the sequence records the prompt's
 * tokens; when its last chunk has been forwarded, before the policy's compress, it replays
 * them (rt_replay_run) and points run.ctx.replay at the scores. The store's capacity is then
 * cap + RT_REPLAY_CHUNK + RT_REPLAY_ROOM (room for one replayed chunk).
 *
 * Capacity: a store of cap entries per head must hold the policy's largest budget plus
 * one chunk. Ratio budgets in streaming mode grow with the tokens seen, so rt_cli uses
 * cap = tokens to process. The capacity is reserved address space only: the store's
 * memory is the blocks it holds from the process's KV pool (rt_kv.h), so
 * kv_bytes_peak is the real memory figure.
 */
#ifndef RT_SEQ_H
#define RT_SEQ_H

#include <stdint.h>

#include "kv/rt_kv.h"
#include "model/rt_model.h"
#include "policy/rt_replay.h"
#include "policy/rt_span.h"
#include "policy/rt_policy.h"
#include "base/rt_util.h"

/* Prompt chunk while a trace is recorded and the caller does not want every row's logits
 * (the trace's surprisal needs them; the chunk bounds the internal logits buffer). */
#define RT_SEQ_TRACE_CHUNK 64

/* Counters of one sequence since rt_seq_init / rt_seq_reset. */
typedef struct rt_seq_stats {
	int64_t tokens;          /* tokens fed */
	int64_t chunks;          /* forward calls (chunks) */
	int64_t kv_entries_peak; /* max over chunks of the entries held by all (layer, KV head)
	                          * lists together, measured after a chunk's append (before any
	                          * compress), so it includes the chunk */
	int64_t kv_bytes_peak;   /* most bytes of KV pool blocks the store held at once
	                          * (rt_kv_bytes_held after a chunk's append): the resident
	                          * KV memory of the sequence */
	int64_t kv_kvbytes_peak; /* most bytes of keys and values held (rt_kvbytes_held) after a
	                          * chunk's append: the peak of the figure compression in bytes
	                          * counts (runtime/eval/rt_compression.h) */
	int64_t compress_events; /* compress calls */
	int64_t first_compress_seen; /* tokens seen when the first compress that changed the
	                              * cache ran (it evicted or merged entries, or stored some
	                              * at a lower tier; 0: none yet): the logits of position
	                              * i >= it came from a cache the policy had compressed */
	int64_t first_call_seen; /* tokens seen when compress first ran at all (0: never): a
	                          * compress that kept every entry (a budget that does not
	                          * bind) still ran */
	double prompt_compression;       /* with a prompt (prompt_len > 0): prompt_len over the
	                                  * mean entries per (layer, KV head) right after the
	                                  * prompt's last chunk and its compress, if any; 0 until
	                                  * the prompt ends */
	double prompt_bytes_compression; /* the same in bytes against an f16 full cache of the
	                                  * prompt (rt_kvbytes_compression): what a prompt-end
	                                  * policy made of the prompt, before later tokens are
	                                  * appended */
	double policy_seconds;   /* time inside policy hooks (init_entries, observe,
	                          * should_compress, compress, next_trigger) and in the
	                          * compacted convention's re-rotation; observe's time is
	                          * summed over the threads that ran it (KV heads in
	                          * parallel), so with several threads this is CPU seconds */
	double seconds;          /* wall time inside rt_seq_feed */
	double replay_seconds;   /* of which the context replay's (KVP_NEED_REPLAY: KVzip's
	                          * second pass over the prompt, runtime/policy/rt_replay.h) */
	int64_t replay_tokens;   /* tokens the replay fed (the prompt and its instructions) */
} rt_seq_stats;

/* A device that runs a sequence's forward and holds its store's contents: the backend
 * interface of rt_seq (runtime/cuda implements it, rt_cuda_seq_attach; docs/cuda.md). The
 * sequence keeps everything else: the policy's run state (parameters, ratio, context), the
 * host view of the store (rt_kv: entry counts and pool blocks, whose figures describe the
 * device store), the chunking rule, the budget check and the counters. So rt_seq_feed,
 * rt_seq_stats_get and everything built on them (the ppl/KL engine rt_eval_runs, bench,
 * the reports) are the same code on the CPU and on a device. */
typedef struct rt_seq_dev {
	const char *name;        /* "cuda": the device's name in messages and reports */
	int max_chunk;           /* most tokens per forward the device takes (>= 1) */
	void *state;             /* the device's own; owned by the sequence once attached */
	/* Forward tokens[0..k) at position pos (rt_model_forward's contract: their keys and
	 * values appended to every (layer, KV head) of the device store, the policy's
	 * statistics observed; logits NULL with RT_LOGITS_NONE, [k × n_vocab] for
	 * RT_LOGITS_ALL, [n_vocab] for RT_LOGITS_LAST). On return the host view's entry counts
	 * (kv->heads[i].n) include the k entries. The pool blocks are already reserved. */
	int (*forward)(void *state, rt_kv *kv, const int32_t *tokens, int32_t k, int64_t pos,
	               float *logits, enum rt_logits_mode mode, rt_err *err);
	/* The policy's compress on the device store (rt_run.compress_on): the host view's
	 * entry counts follow it. */
	int (*compress)(void *state, struct kvp_ctx *ctx, rt_kv *kv, rt_err *err);
	void (*reset)(void *state); /* an empty device store (rt_seq_reset) */
	void (*free)(void *state);
} rt_seq_dev;

typedef struct rt_seq {
	const rt_model *m;
	const struct kvp_policy *p;
	rt_kv kv;                /* the store: cap entries per head */
	struct rt_run run;      /* parameters, kvp_ctx, scratch */
	rt_fwd fwd;              /* forward scratch for chunks of max_chunk tokens */
	int max_chunk;
	int32_t cap;
	void *rot_mem;           /* COMPACTED only: the one allocation rot_cs, rot_idx, rot_row
	                          * and rot_mark point into (rt_seq.c rot_alloc) */
	int32_t *rot_idx;        /* COMPACTED only: [n_layer·n_kv_head × n_ctx] index each
	                          * entry's key is rotated at, by (head, original position) */
	double *rot_cs;          /* COMPACTED only: [n_rot] cos, sin of the current delta */
	float *rot_row;          /* COMPACTED only: [head_dim] a decoded key being re-rotated
	                          * (tiered store: [cap × head_dim], a head's keys) */
	uint8_t *rot_mark;       /* COMPACTED, tiered only: [cap] 1 = the entry's key rotated */
	double hook_seconds;     /* init_entries and re-rotation time (rt_run counts the rest) */
	double *obs_seconds;     /* [n_kv_head] observe time by KV head: the forward attends the
	                          * KV heads of a layer in parallel and calls observe from the
	                          * thread that attended the head, so each slot has one writer
	                          * at a time */
	rt_span_mark span;       /* protected-span ids given to the entries appended next
	                          * (rt_seq_span, rt_seq_span_range) */
	/* the prompt trace (KVP_NEED_TRACE only; run.ctx.trace points at tr) */
	struct kvp_trace tr;
	float *tr_mem;           /* one allocation: hid, q, q_tail, surprisal, prev, lg */
	float *tr_prev;          /* [n_vocab] logits of the last prompt row seen so far */
	double tr_prev_lse;      /* their log-sum-exp; < -1e300 when there is none */
	float *tr_lg;            /* [RT_SEQ_TRACE_CHUNK × n_vocab] logits when the caller asks none */
	/* the context replay (KVP_NEED_REPLAY only; run.ctx.replay points at its scores once
	 * it ran) */
	rt_replay rp;
	rt_seq_stats st;
	rt_seq_dev dev;          /* .forward NULL: the CPU (rt_model_forward on fwd and kv) */
} rt_seq;

/* Create a sequence of model m under policy p (rt_policy_full or a compiled one) with a
 * store of cap entries per head (>= 1) and forward chunks of at most max_chunk tokens
 * (1..65536). prompt_len: tokens of the prompt (ctx.prompt_len; -1 = pure streaming, then
 * prompt-end triggers never fire). Parameters start at the policy's defaults.
 * Returns 0, or -1 with err set (bad sizes, a policy of another ABI, allocation
 * failure); s is then safe to rt_seq_free. */
int rt_seq_init(rt_seq *s, const rt_model *m, const struct kvp_policy *p, int32_t cap,
                int max_chunk, int64_t prompt_len, rt_err *err);
/* The same with a store of element type kv_type instead of the model's (m->kv_type): a
 * narrow store on a model of another type is attended row by row (runtime/model/rt_kvattn.h),
 * so one lockstep pass can compare stores of several types against one reference (`ppl` and
 * `needle` batch lines with --kv-type). Also refuses (-1, err) a policy with KVP_NEED_F32_KV
 * on another type (rt_run_init_typed). */
int rt_seq_init_typed(rt_seq *s, const rt_model *m, const struct kvp_policy *p,
                      enum rt_kv_type kv_type, int32_t cap, int max_chunk, int64_t prompt_len,
                      rt_err *err);
void rt_seq_free(rt_seq *s);

/* Hand the forward of s (initialised, not yet fed) to device d: from now on rt_seq_feed
 * runs d->forward and the policy's compress runs through d->compress; chunks are at most
 * d->max_chunk tokens; the CPU forward scratch is released; d->state belongs to s (d->free
 * runs in rt_seq_free) and may point back at s, so s stays at its address. Refused (-1,
 * err; d is then not taken): a sequence already fed or already on a device, a policy with a
 * prompt trace (KVP_NEED_TRACE), a context replay (KVP_NEED_REPLAY) or compacted positions
 * (the CPU records, replays and re-rotates them). The device refuses what it cannot run
 * before calling this. */
int rt_seq_attach(rt_seq *s, const rt_seq_dev *d, rt_err *err);

/* The name of the device s runs on: "cpu", or the attached device's. */
const char *rt_seq_device(const rt_seq *s);

/* Start a new sequence on the same allocation: empty store, zeroed policy state and
 * counters, the given prompt length; parameters and ratio are kept. A policy with a context
 * replay has its prompt buffers sized for the new length here (rt_replay_reserve). */
void rt_seq_reset(rt_seq *s, int64_t prompt_len);

/* Prefix caching: where a sequence stands after its first tokens, besides its store (the
 * tokens seen, the phase, the policy's compress counters and notes, the counters of
 * rt_seq_stats, the current span), so that another sequence can start there
 * (rt_seq_fork). */
typedef struct rt_seq_mark {
	int64_t seen, compress_count, last_compress_seen, compressions;
	enum kvp_phase phase;
	int prompt_done;
	unsigned notes;
	rt_span_mark span;
	rt_seq_stats st;
} rt_seq_mark;

rt_seq_mark rt_seq_mark_get(const rt_seq *s);

/* Start the fresh sequence s (nothing fed, on the CPU, its policy without a prompt trace, a
 * context replay or compacted positions: they record the prompt's tokens) where the
 * sequence that made px stood when it was made (mk: its rt_seq_mark then, mk->seen equal to
 * rt_kv_prefix_fork_len(px)): its store forks px (rt_kv_prefix_fork: the rows shared, the
 * entries' metadata and policy state copied) and its run state and counters become mk's,
 * but for the time counters (zero: s spent none). So s is then in the state an unshared run
 * of the same policy, parameters and chunks reaches after those tokens, bit for bit,
 * without computing them. The caller must give s the same policy, parameters, ratio,
 * floor, prefill chunk and tokens as the maker (for a compressing policy also its prompt
 * length: its budgets follow it). Returns 1 when s forked, 0 when it cannot (nothing
 * changed), -1 with err (rt_kv_prefix_fork's errors). */
int rt_seq_fork(rt_seq *s, rt_kv_prefix *px, const rt_seq_mark *mk, rt_err *err);

/* Protected spans (`keep span NAME` in a policy, docs/language.md): names[1..n] name
 * span ids 1..n (names[0] is unused; the array must outlive the sequence), n <= 65535.
 * rt_seq_span(s, id) gives every entry appended afterwards span id `id` (0 = none) until
 * the next call, so a caller marks a system prompt or a question by setting the span
 * before feeding it. rt_seq_span_range(s, id, pos, n) gives span `id` to the entries
 * appended afterwards whose token position (from the sequence's start) lies in
 * [pos, pos + n), over the current span, until the next call (n = 0: no range): a span
 * inside a prompt fed in one piece, without cutting the prefill's chunks. rt_seq_reset
 * keeps the names and clears both. The rule: rt_span_mark_at (runtime/policy/rt_span.h). */
void rt_seq_set_span_names(rt_seq *s, const char *const *names, int n);
void rt_seq_span(rt_seq *s, int id);
void rt_seq_span_range(rt_seq *s, int id, int64_t pos, int64_t n);
/* The fewest entries of span `id` that any (layer, KV head) holds, over the full-attention
 * layers (a sliding-window layer drops its old entries whatever the policy: Gemma 3's 15 of
 * 18; every layer when all are windowed); 0 when none holds one. Whether a policy kept a
 * span whole: serve's pinned_kept, run --stats for the system message. O(entries). */
int64_t rt_seq_span_kept(const rt_seq *s, int id);
/* Name the runtime's spans (runtime/policy/rt_span.h): span id RT_SPAN_SYSTEM is
 * "system", and so on; what serve, run, needle and tune use. */
void rt_seq_use_spans(rt_seq *s);

/* "name=value" parameter override (kvp_policy_param_set's errors). */
int rt_seq_set(rt_seq *s, const char *assign, rt_err *err);

/* Compression-factor override: budget = context / R entries per head (rt_run_set_ratio;
 * R = 0 removes it). Errors: R not 0 and not a finite number >= 1; the policy never
 * compresses. */
int rt_seq_set_ratio(rt_seq *s, double R, rt_err *err);

/* The same in bytes: 1/R of an f16 full cache's bytes of the context per head
 * (rt_run_set_byte_ratio). */
int rt_seq_set_byte_ratio(rt_seq *s, double R, rt_err *err);

/* Chunked prefill (rt_run_set_prefill_chunk): prompt chunks of up to C tokens cross the
 * policy's triggers and it compresses at each chunk's end; C is also bounded by the
 * sequence's max_chunk. 0 (the default) keeps the exact schedule. The store then needs
 * room for the budget plus one chunk. Errors: C outside 0..65536. */
int rt_seq_set_prefill_chunk(rt_seq *s, int32_t C, rt_err *err);

/* Apply a front door's choice (runtime/policy/rt_pick.h) to a sequence initialised with
 * its policy: the parameter values, the ratio in force (in entries or bytes, or none), the
 * prefill chunk and the floor of a graceful budget (kvp_ctx.min_kv), replacing what was
 * set. Errors: as rt_run_set_ratio and
 * rt_run_set_prefill_chunk (a choice rt_pick made passes them). */
struct rt_pick;
int rt_seq_apply(rt_seq *s, const struct rt_pick *pk, rt_err *err);

/* Feed tokens[0..n) at positions seen..seen+n-1. logits: NULL with mode RT_LOGITS_NONE,
 * [n × n_vocab] for RT_LOGITS_ALL (row i after tokens[i]), [n_vocab] for RT_LOGITS_LAST.
 * Internally split into the largest chunks (<= max_chunk) that cannot cross the policy's
 * next trigger or the prompt end. Errors (-1, err set; the sequence is then unusable
 * until rt_seq_reset): a forward error (token out of range, context_length exceeded),
 * "KV cache full" when the policy leaves no room in the store (capacity too small for
 * its budget plus a chunk), "KV pool exhausted" when the process's pool cannot grant the
 * blocks of the next chunk (nothing of that chunk is appended; other sequences are
 * untouched), a failed compress. */
int rt_seq_feed(rt_seq *s, const int32_t *tokens, int64_t n, float *logits,
                enum rt_logits_mode mode, rt_err *err);

/* K sequences fed the same tokens in lockstep (one text under several policies, as
 * `ppl --policy a,b,...` and the A/B engine do), on the continuous-batching engine
 * (rt_seq_multi below): each step's weight GEMMs run once over the rows of every
 * sequence that still has tokens of the feed to take, so the weights are read once per
 * step instead of K times; each sequence takes its own chunks (rt_seq_feed's rule) and
 * everything else is its own. So a sequence's results do not depend on the others: it
 * gets, bit for bit, what rt_seq_feed gives it alone with the same calls and a max_chunk
 * of min(its own, the batch's chunk). The sequences stay owned by the caller. */
typedef struct rt_seq_batch {
	int K;                   /* sequences given to rt_seq_batch_init */
	int n_active;            /* those still fed: a sequence whose policy fails leaves */
	rt_seq **s;              /* [K] (borrowed); slots 0..n_active-1 are the active ones */
	int *idx;                /* [K] the caller's index of slot i */
	char (*why)[512];        /* [K] by caller's index: "" or why that sequence left */
	int chunk;               /* tokens per sequence and step at most */
	struct rt_seq_multi *mb; /* the engine's scratch: K sequences, K × chunk rows */
	int64_t *done;           /* [K] by slot: tokens of the current feed taken */
	rt_seq **fed;            /* [K] one step's sequences, their tokens and counts, */
	const int32_t **tk;      /* [K]   the slot each came from */
	int *nn, *slot;          /* [K] */
	rt_err *ew;              /* [K] their errors */
	void *mem;               /* everything above but mb */
} rt_seq_batch;

/* Set up a batch over s[0..K) (same model, K >= 1, each at its own start) with chunks of
 * at most `chunk` tokens (1..4096; the scratch holds K·chunk rows). Errors (-1, err): bad
 * sizes, sequences of different models, a sequence on a device (its forward is the
 * device's: feed it alone), allocation failure (b is then safe to free). */
int rt_seq_batch_init(rt_seq_batch *b, rt_seq *const *s, int K, int chunk, rt_err *err);
void rt_seq_batch_free(rt_seq_batch *b);

/* Feed tokens[0..n) to every active sequence of the batch; they must all have seen the
 * same number of tokens. Steps run until every sequence has taken all n, each taking its
 * own next chunk per step (so every sequence sees exactly what rt_seq_feed gives it,
 * bit for bit). logits: NULL with RT_LOGITS_NONE; for
 * RT_LOGITS_ALL [K × n × n_vocab] (sequence k's row i at (k·n + i)·n_vocab); for
 * RT_LOGITS_LAST [K × n_vocab] (k: the caller's index; a sequence that left keeps
 * whatever its rows held). A sequence whose policy fails (a compress error such as guards
 * above the budget, "KV cache full", or "KV pool exhausted" for its next chunk's blocks)
 * leaves the batch: rt_seq_batch_error says why,
 * the others go on. Every sequence's `seconds` counter grows by the batch's wall time
 * (shared). Errors (-1, err): a forward error (every sequence is then unusable),
 * sequences at different positions, no active sequence left. */
int rt_seq_batch_feed(rt_seq_batch *b, const int32_t *tokens, int64_t n, float *logits,
                      enum rt_logits_mode mode, rt_err *err);

/* NULL while sequence k (the caller's index) is in the batch, else why it left. */
const char *rt_seq_batch_error(const rt_seq_batch *b, int k);

/* Continuous batching (a server's step loop): K sequences, each at its own position with
 * its own tokens, advance in one forward whose weight GEMMs run once over all their rows
 * (rt_model_forward_multi). Sequences may join and leave between steps. */
typedef struct rt_seq_multi {
	int max_seqs;            /* sequences per step at most */
	int max_rows;            /* rows (tokens) per step at most, over all sequences */
	rt_fwd big;              /* scratch for max_rows stacked rows */
	rt_fwd **fw;             /* [max_seqs] per step: the fed sequences' forward contexts */
	rt_kv **kv;              /* [max_seqs] their stores */
	const int32_t **tok;     /* [max_seqs] their tokens */
	int *n;                  /* [max_seqs] their token counts */
	int32_t *pos;            /* [max_seqs] their first positions */
	float **lgp;             /* [max_seqs] where their logits go */
	int *all;                /* [max_seqs] 1: every row's logits (a prompt trace) */
	float **lgq;             /* [max_seqs] by the caller's index: where logits are wanted */
	int *allq;               /* [max_seqs] by the caller's index: 1 for every row's */
	int *idx;                /* [max_seqs] the caller's index of each fed sequence */
	void *mem;
} rt_seq_multi;

/* Scratch for steps of at most max_seqs sequences and max_rows tokens (1..2^20 each,
 * max_seqs <= max_rows). Errors (-1, err): bad sizes, allocation failure (b is then safe
 * to free). */
int rt_seq_multi_init(rt_seq_multi *b, const rt_model *m, int max_seqs, int max_rows,
                      rt_err *err);
void rt_seq_multi_free(rt_seq_multi *b);

/* One step: sequence s[i] (i < K <= max_seqs, all of b's model) is offered n[i] >= 1
 * tokens tok[i][0..n[i]) at its next position and takes the largest prefix its policy
 * allows (rt_seq_feed's chunk rule: no trigger or prompt end crossed, at most its
 * max_chunk, a trace chunk while it records a prompt trace); n[i] is set to the tokens
 * taken, and logits[i·n_vocab ..] to the logits after its last taken token. Σ n[i] must
 * not exceed max_rows. A sequence that cannot go on (KV cache full, KV pool exhausted —
 * its chunk is then not appended — or a failed compress) gets n[i] = -1 and why[i] set;
 * the others go on. Every fed sequence's `seconds` grows by the step's wall time.
 * Returns the sequences fed, or -1 with err set on a forward error (every sequence of
 * the step is then unusable) or bad sizes. */
int rt_seq_multi_step(rt_seq_multi *b, rt_seq *const *s, int K, const int32_t *const *tok,
                      int *n, float *logits, rt_err *why, rt_err *err);

/* Tokens seen so far (= the position of the next token). */
int64_t rt_seq_seen(const rt_seq *s);

/* Mean entries per (layer, KV head) list now: rt_kv_entries / (n_layer × n_kv_head). */
double rt_seq_mean_entries(const rt_seq *s);

/* Counters, with policy_seconds filled in. */
rt_seq_stats rt_seq_stats_get(const rt_seq *s);

#endif
