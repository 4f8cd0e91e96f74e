/*
 * rt_serve: `BIN serve`, an OpenAI-compatible HTTP server (libmicrohttpd, one thread per
 * connection; jansson for JSON) on the process's KV block pool (kv/rt_kvpool.h), with
 * continuous batching: one scheduler thread advances every active sequence in one
 * weight pass per step (rt_seq_multi_step), new requests join at step boundaries and
 * long prompts are prefilled in chunks between the others' decode steps. Admission by
 * pool bytes against a request's worst-case footprint, a bounded queue, 503 with
 * Retry-After beyond it; a client that disconnects frees its sequence at the next step
 * boundary; a request body that stalls for --timeout seconds gets 408; SIGTERM (or SIGINT) drains: new requests get 503, queued and active ones
 * finish, then the process exits 0. docs/serving.md describes the API.
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions (the model's chat template,
 * runtime/model/rt_chat.h), both with "stream": true as Server-Sent Events in OpenAI's chunk
 * format; GET /v1/models, GET /health, GET /metrics (Prometheus text format 0.0.4).
 */
#ifndef RT_SERVE_H
#define RT_SERVE_H

#include <stdint.h>

#include "policy/rt_policy.h"

/* serve's default prefill chunk: one KV block (RT_KV_BLOCK entries), so a prompt chunk adds
 * at most one block per list to a sequence's footprint (docs/language.md, "Chunked
 * prefill": the KL it costs against the exact schedule) */
#define RT_SERVE_PREFILL_CHUNK 16
#define RT_SERVE_MIN_KV 64 /* default --min-kv: a short chat keeps its whole context */

typedef struct rt_serve_cfg {
	const char *prog;          /* program name in messages */
	const char *model;         /* GGUF file */
	const char *host;          /* IPv4 address to listen on (default 127.0.0.1) */
	int port;                  /* TCP port; 0 picks a free one (printed on stderr) */
	const char *policy;        /* default policy of requests without "kv" (NULL: reg[0]) */
	const char *const *sets;   /* default "name=value" parameters of that policy */
	int n_sets;
	double ratio;              /* default compression ratio (0: the policy's budget) */
	double byte_ratio;         /* or the default compression ratio in bytes against an f16
	                              full cache (rt_seq_set_byte_ratio); at most one is set */
	int64_t kv_memory;         /* KV pool bytes (the hard limit) */
	int max_seqs;              /* active sequences at most */
	int queue;                 /* waiting requests at most */
	int chunk;                 /* prefill chunk (tokens per sequence per step) */
	int prefill_chunk;         /* default chunked prefill of a per-step policy (tokens,
	                              at most chunk; 0: the exact schedule) */
	int min_kv;                /* default floor of a graceful budget, tokens (--min-kv,
	                              kvp_ctx.min_kv); 0: the policy's budget as written */
	int step_rows;             /* tokens per step over all sequences */
	int64_t max_body;          /* request body bytes at most */
	int timeout_s;             /* a stalled request body gets 408 after this many seconds;
	                              an idle connection is closed one second later */
	const char *api_key;       /* required bearer token, or NULL */
	const char *trace;         /* JSON-lines trace file, or NULL */
	int exact;                 /* 1: the exact path (f32 weights, OpenBLAS); 0: the fast path */
	enum rt_kv_type kv_type;   /* KV storage of every sequence (f32 on the exact path) */
	int threads;               /* threads of the model (0: every online core) */
	int share_prefix;          /* 1: requests share their prompts' protected prefixes
	                              (docs/serving.md, "Shared prefixes"); 0: never */
} rt_serve_cfg;

/* Load the model, listen and serve until SIGTERM/SIGINT; the policies are reg[0..n_reg)
 * plus the built-in full. The caller has checked the configuration's ranges and the
 * default policy's parameters. Returns the exit status: 0 after a drain, 1 on a startup
 * failure (message on stderr: "PROG: serve: reason"). */
int rt_serve_run(const rt_serve_cfg *cfg, const struct kvp_policy *const *reg, int n_reg);

/* The worst-case KV footprint, in entries per (layer, KV head) list, of a sequence of
 * n_prompt + max_tokens tokens under the policy and parameters of s (a fresh sequence,
 * reset to its start again on return) with prefill chunks of `chunk` tokens: the whole
 * sequence for a policy that never compresses or has no entry-ratio override (the ABI
 * exposes no policy's own budget; a byte ratio bounds bytes, not entries: low-precision
 * tiers hold more entries in the same bytes); with ratio R, max(P, ceil(P/R) + T) for a policy that
 * compresses at the prompt end (the whole prompt is held before it runs), else
 * the larger of ceil((P+T)/R) plus the longest chunk its trigger allows at that budget,
 * and ceil(P/R) plus its prefill chunk (rt_seq_set_prefill_chunk, bounded by `chunk`:
 * what a prompt chunk adds before the compress at its end); each ceil(x/R) is the budget
 * the policy really keeps at context x (rt_policy_budget_at: raised by the floor, the
 * larger of kvp_ctx.min_kv and the policy's `budget = B min F`, and by guards that exceed
 * it under that floor). A policy with a context replay (KVP_NEED_REPLAY) holds at least
 * P + min(P, RT_REPLAY_CHUNK) + RT_REPLAY_ROOM entries at the prompt end (the prompt and one
 * replayed chunk, runtime/policy/rt_replay.h). */
struct rt_seq;
int64_t rt_serve_footprint(struct rt_seq *s, int64_t n_prompt, int64_t max_tokens, int chunk);

#endif
