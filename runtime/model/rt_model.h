/*
 * rt_model: the decoder-only transformers of llama.cpp's `llama`, `qwen2`, `qwen3` and
 * `gemma3` GGUF architectures (SmolLM2, TinyLlama, Llama 2/3, Qwen 2.5, Qwen 3, Gemma 3) and
 * their exact f32 forward pass over the ragged KV store of rt_kv.
 *
 * Loading reads the hyper-parameters from the GGUF metadata under the architecture's
 * prefix, as llama.cpp's llama-model.cpp reads them (ARCH.block_count, embedding_length,
 * feed_forward_length, attention.head_count(_kv), attention.key_length, rope.freq_base,
 * rope.dimension_count, attention.layer_norm_rms_epsilon, context_length; gemma3 also
 * attention.sliding_window, attention.sliding_window_pattern, rope.freq_base_swa; the
 * others attention.sliding_window for a Mistral-style window on every layer), RoPE scaling
 * (rope.scaling.type none / linear / yarn with its factor, attn_factor,
 * original_context_length and YaRN betas, and Llama 3.x's rope_freqs.weight frequency
 * factors: rt_model_hparams, base/rt_rope.h rt_rope_scaling), checks that every tensor
 * exists with the expected shape and a type rt_quant can decode, and loads the weights
 * (see rt_model_opts). Tied output (no output.weight: logits = token_embd^T h) and an
 * explicit output.weight are both supported. A key that would change the function and is
 * not implemented (longrope and other scaling types, YaRN's log multiplier, a logit
 * soft-cap) is refused with the file, the key and what is supported.
 *
 * The forward is one function for every architecture; the differences are options of the
 * model (rt_arch_info) and of each layer (rt_layer: window, RoPE base). It follows
 * llama.cpp's graphs (src/models/llama.cpp, qwen2.cpp, qwen3.cpp, gemma3.cpp):
 *   x = embd[token] · embd_scale                   (gemma3: sqrt(n_embd), else 1)
 *   per layer: h = RMSNorm(x)·w_attn_norm; q, k, v = h·Wq^T (+bq), h·Wk^T (+bk), h·Wv^T (+bv)
 *              (biases: qwen2); per-head RMSNorm of q and k (qwen3, gemma3);
 *              RoPE on q and k at the layer's frequencies (rt_layer.rope_freq: gemma3's
 *              sliding-window layers at rope.freq_base_swa, unscaled; RoPE scaling on
 *              the others); append k, v to the (layer, KV head) entry lists;
 *              attention with scale attn_scale (1/sqrt(head_dim)); a = o·Wo^T;
 *              x += a, or x += RMSNorm(a)·w_attn_post_norm (gemma3);
 *              h = RMSNorm(x)·w_ffn_norm; f = (act(h·Wg^T) ⊙ h·Wu^T)·Wd^T with act SiLU
 *              (GELU, tanh form, for gemma3); x += f, or x += RMSNorm(f)·w_ffn_post_norm
 *   logits = RMSNorm(x)·w_out_norm · W_out^T
 * RoPE is ggml's NORMAL mode (rotate ADJACENT pairs (x[2i], x[2i+1]) by
 * pos·base^(-2i/n_rot), runtime/base/rt_rope.h) for `llama`, whose converter permuted the
 * Q/K rows. The NEOX architectures (qwen2, qwen3, gemma3: pairs (x[i], x[i + n_rot/2]))
 * have the rows of Wq, Wk (and bq, bk, the Q/K norm weights) permuted at load so that
 * NORMAL mode computes NEOX's rotation: q·k is unchanged by the same permutation of both,
 * so attention, the KV cache and the policies see the same function; stored keys are in the
 * permuted order.
 * Attention of query head q (KV head j = q / group) over that head's entries i:
 *   logit_i = q·k_i · attn_scale + log(count_i),  p = softmax(logit),  o = Σ p_i v_i,
 * over the entries i with pos_q - pos_i < window on a sliding-window layer (llama.cpp's
 * LLAMA_SWA_TYPE_STANDARD mask), all of them elsewhere.
 * For singleton entries (count 1) this is exactly standard causal attention; a merged
 * prototype with count n stands for n identical tokens (docs/architecture.md, "The KV store").
 *
 * Prefill is chunked: a chunk of up to max_chunk tokens is processed at once (GEMMs via
 * OpenBLAS over the chunk), its keys/values are appended to the store, and query row r of
 * the chunk attends to the entries that existed before the chunk plus the chunk's rows
 * 0..r (causal within the chunk). All scratch is sized by rt_fwd_init; nothing is
 * allocated per token.
 */
#ifndef RT_MODEL_H
#define RT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/rt_gguf.h"
#include "model/rt_matmul.h"
#include "kv/rt_kv.h"
#include "base/rt_pool.h"
#include "base/rt_util.h"

/* The architectures (general.architecture) and what sets each apart, one row each:
 * X(enum suffix, name, Q/K/V biases, per-head Q/K RMSNorm, post-attention and post-FFN
 *   norms, GELU FFN (else SiLU), embeddings scaled by sqrt(n_embd), NEOX RoPE,
 *   sliding-window layers read from the file) */
#define RT_ARCHS(X)                                  \
	X(LLAMA, "llama", 0, 0, 0, 0, 0, 0, 0)       \
	X(QWEN2, "qwen2", 1, 0, 0, 0, 0, 1, 0)       \
	X(QWEN3, "qwen3", 0, 1, 0, 0, 0, 1, 0)       \
	X(GEMMA3, "gemma3", 0, 1, 1, 1, 1, 1, 1)

enum rt_arch {
#define RT_ARCH_ENUM(e, name, bias, qk_norm, post_norm, gelu, embd_scale, neox, swa) RT_ARCH_##e,
	RT_ARCHS(RT_ARCH_ENUM)
#undef RT_ARCH_ENUM
	RT_ARCH_N
};

typedef struct rt_arch_info {
	const char *name;   /* general.architecture, the metadata keys' prefix */
	int qkv_bias, qk_norm, post_norm, gelu, embd_scale, neox, swa;
} rt_arch_info;

/* The row of arch (RT_ARCH_LLAMA .. RT_ARCH_N - 1; another value asserts): a static
 * table, valid for the process. */
const rt_arch_info *rt_arch_get(enum rt_arch arch);

/* Hyper-parameters as read from the GGUF metadata (and tensor shapes). */
typedef struct rt_model_hparams {
	enum rt_arch arch;
	int n_layer;      /* transformer blocks */
	int n_embd;       /* hidden size */
	int n_ff;         /* SwiGLU inner size */
	int n_head;       /* query heads */
	int n_head_kv;    /* KV heads (n_head % n_head_kv == 0) */
	int group;        /* query heads per KV head, n_head / n_head_kv */
	int head_dim;     /* values per head */
	int n_rot;        /* rotated dimensions per head (even, <= head_dim) */
	int n_vocab;      /* rows of token_embd */
	int32_t n_ctx;    /* llama.context_length: positions 0..n_ctx-1 are valid */
	float rope_base;  /* ARCH.rope.freq_base: the full-attention layers' RoPE base */
	float rope_base_swa; /* gemma3: ARCH.rope.freq_base_swa (default 10000), the
	                      * sliding-window layers' base; == rope_base elsewhere */
	int32_t n_swa;    /* ARCH.attention.sliding_window: the window of the sliding-window
	                   * layers in tokens (0: every layer attends to all entries) */
	int swa_pattern;  /* gemma3: layer l is a sliding-window layer unless l % swa_pattern
	                   * == swa_pattern - 1 (ARCH.attention.sliding_window_pattern, 6);
	                   * a Mistral-style window: n_layer + 1 (every layer) */
	/* RoPE scaling, read as llama.cpp's llama_model::load_hparams reads it
	 * (base/rt_rope.h rt_rope_scaling): ARCH.rope.scaling.type none / linear / yarn
	 * (absent: linear), .factor (or the older rope.scale_linear; 0 or absent: 1),
	 * .attn_factor, .original_context_length, .yarn_beta_fast / .yarn_beta_slow; the
	 * sliding-window layers keep freq_scale 1 (llama.cpp's rope_freq_scale_train_swa) */
	float rope_freq_scale; /* 1 / factor on the full-attention layers (1: none) */
	int rope_yarn;         /* 1: YaRN */
	float rope_attn_factor, yarn_beta_fast, yarn_beta_slow;
	int32_t n_ctx_orig;    /* YaRN's original context (default context_length) */
	float norm_eps;   /* ARCH.attention.layer_norm_rms_epsilon */
	float attn_scale; /* the attention logits' scale: 1/sqrt(head_dim) (gemma3's 27B
	                   * layout: 1/sqrt(n_embd / n_head), as llama.cpp) */
	float embd_scale; /* the embeddings' factor: sqrt(n_embd) for gemma3, else 1 */
} rt_model_hparams;

/* One block's weights, row-major [out × in] (a ggml tensor's rows). The exact path reads
 * the f32 pointers; the fast path reads the rt_wmat views (the GGUF block data). */
typedef struct rt_layer {
	const float *attn_norm; /* [n_embd] */
	const float *wq;        /* [n_head·head_dim × n_embd] */
	const float *wk;        /* [n_head_kv·head_dim × n_embd] */
	const float *wv;        /* [n_head_kv·head_dim × n_embd] */
	const float *wo;        /* [n_embd × n_head·head_dim] */
	const float *ffn_norm;  /* [n_embd] */
	const float *w_gate;    /* [n_ff × n_embd] */
	const float *w_up;      /* [n_ff × n_embd] */
	const float *w_down;    /* [n_embd × n_ff] */
	/* fast path: the same matrices in their file types (NULL data on the exact path) */
	rt_wmat mq, mk, mv, mo, mgate, mup, mdown;
	/* the architecture's extras, NULL where it has none (rt_arch_info) */
	const float *bq, *bk, *bv;      /* [n_head·head_dim], [n_head_kv·head_dim] x2 */
	const float *q_norm, *k_norm;   /* [head_dim] per-head RMSNorm weights */
	const float *attn_post_norm;    /* [n_embd] */
	const float *ffn_post_norm;     /* [n_embd] */
	/* per-layer options */
	int32_t window;   /* sliding window in tokens (hp.n_swa), 0: full attention */
	float rope_base;  /* this layer's RoPE base (hp.rope_base or hp.rope_base_swa) */
	int rope_slot;    /* which of the forward's RoPE tables: 0 rope_base, 1 rope_base_swa */
	const double *rope_freq; /* [n_rot/2] this layer's angle per position of each pair,
	                          * scaling included (rt_rope_scaled_freqs; into rt_model's
	                          * rope_freq): what re-rotating a key by a position delta uses */
	float rope_mscale;       /* the factor on cos and sin in its tables (YaRN; else 1) */
} rt_layer;

typedef struct rt_model {
	rt_model_hparams hp;
	char path[512];          /* the file it was loaded from */
	uint32_t file_type;      /* general.file_type, or UINT32_MAX when absent */
	int tied_output;         /* 1 when logits use token_embd (no output.weight) */
	const float *tok_embd;   /* [n_vocab × n_embd] */
	const float *out_norm;   /* [n_embd] */
	const float *output;     /* [n_vocab × n_embd]; == tok_embd when tied */
	rt_layer *layers;        /* [n_layer] */
	const float *rope_factors; /* [n_rot/2] rope_freqs.weight (Llama 3.x), or NULL */
	double *rope_freq;       /* [n_layer × n_rot/2] each layer's RoPE frequencies */
	int32_t *layer_window;   /* [n_layer] each layer's rt_layer.window (kvp_ctx.layer_window) */
	float *mem;              /* the f32 weights (exact: all; fast: norms and any matrix
	                          * whose type has no rt_dot kernel, dequantised) */
	size_t mem_bytes;
	int exact;               /* 1: the exact path (f32 weights, OpenBLAS) */
	enum rt_kv_type kv_type; /* element type of the stores rt_model_kv_init and rt_seq
	                          * make for this model (RT_KV_F32 on the exact path) */
	int f32_act;             /* rt_model_opts.f32_act (fast path) */
	rt_wmat embd, out;       /* fast path: token_embd and the output matrix (== embd when tied) */
	void *qmem;              /* fast path: the block data behind every rt_wmat */
	size_t qmem_bytes;
	rt_pool *pool;           /* the fast path's threads (NULL: one) */
} rt_model;

/* How to load a model. */
typedef struct rt_model_opts {
	/* 1: the exact path (docs/exactness.md): every weight dequantised to f32 at load,
	 * matmuls by OpenBLAS, the function the exactness tests check. 0: the fast path:
	 * matrices stay in their GGUF block types (a type without an rt_dot kernel, such as
	 * Q5_0, is dequantised to f32 and multiplied in f32) and are multiplied by rt_matmul. */
	int exact;
	/* fast path: threads of the pool (0 or 1: one). Exact path: 0 keeps OpenBLAS's
	 * setting, n > 0 sets it to n (rt_model_set_threads) */
	int threads;
	/* element type of the KV stores made for this model (rt_model_kv_init, rt_seq_init):
	 * RT_KV_F32 (0, the library's default), RT_KV_F16 or RT_KV_Q8_0 (the fast path only;
	 * the command line's default there is f16). The exact path refuses any but f32. */
	enum rt_kv_type kv_type;
	/* fast path: 1 multiplies chunks of every size with f32 activations (the GEMM way of
	 * runtime/model/rt_matmul.h at any row count), so a policy run that is fed in short
	 * chunks (a per-step policy prefills token by token) and its full-cache reference fed
	 * in long ones differ by their caches only, not by the 8-bit activation rounding of
	 * chunks under 16 rows (a KL of 0.0028 nats/token on its own for the full cache, 1024
	 * tokens of coreutils.info); decoding is then slower (the weights are dequantised
	 * every step). 0: llama.cpp's arithmetic (8-bit activations under 16 rows). */
	int f32_act;
} rt_model_opts;

/* Load with options; same errors as rt_model_load_gguf plus a thread count outside
 * 0..256, a pool that cannot start, a KV type outside enum rt_kv_type, an exact model
 * with a KV type other than f32, or a head_dim the KV type cannot hold. */
rt_model *rt_model_load_opts(const rt_gguf *g, const rt_model_opts *o, rt_err *err);

/* Set the thread count (1..256). Fast path: the pool is replaced by one of n threads and
 * OpenBLAS (called from the pool's threads for prefill tiles) is set to one thread. Exact
 * path: OpenBLAS's thread count is set to n (the process-wide setting). Forward contexts
 * made before the call keep their scratch and use at most the threads they were sized
 * for. Returns -1 with err when the pool cannot start (the model keeps its old pool). */
int rt_model_set_threads(rt_model *m, int n, rt_err *err);
/* The fast path's thread count (1 for an exact model). */
int rt_model_threads(const rt_model *m);

/* Load a `llama` model from an open GGUF on the fast path with one thread (the library's
 * default; rt_model_load_opts asks for the exact path). Returns NULL and sets err to
 * "PATH: reason" for another architecture, a missing or ill-typed key, a missing tensor, a
 * tensor of the wrong shape or of a type rt_quant cannot decode, a non-finite weight, or
 * inconsistent hyper-parameters. The model copies everything it needs; g may be closed
 * afterwards. Caller frees with rt_model_free. */
rt_model *rt_model_load_gguf(const rt_gguf *g, rt_err *err);
/* Open PATH, load (fast path, one thread), close it. Same errors plus rt_gguf_open's. */
rt_model *rt_model_load(const char *path, rt_err *err);
/* Open PATH, load with options o (see rt_model_opts below), close it. */
rt_model *rt_model_open(const char *path, const struct rt_model_opts *o, rt_err *err);
void rt_model_free(rt_model *m);

/* What the attention loop hands a policy after computing one query row of one
 * (layer, KV head): the probabilities of the group's query heads over the entries this
 * row attended and their attention outputs. Pointers are valid only during the call. */
typedef struct rt_attn_view {
	int layer;              /* 0..n_layer-1 */
	int kv_head;            /* 0..n_head_kv-1 */
	int row;                /* query row within the chunk */
	int32_t pos;            /* the query token's position */
	int32_t n_entries;      /* entries attended: a prefix of the head's list */
	int group;              /* query heads of this KV head (rows of probs/out) */
	int head_dim;
	const float *probs;     /* [group × n_entries] contiguous (rows sum to 1) */
	size_t probs_ld;        /* == n_entries: floats between consecutive heads' rows */
	const float *out;       /* [group × head_dim], contiguous */
	rt_kv_head *head;       /* the entry list (entries 0..n_entries-1 were attended) */
	const float *query;     /* [group × head_dim] the group's query rows before RoPE, or
	                           NULL unless rt_fwd_keep_queries was called */
} rt_attn_view;

/* Observation hook (a compiled policy's `observe`, docs/runtime_abi.md). */
typedef void (*rt_observe_fn)(void *user, const rt_attn_view *v);

/* Append hook (a compiled policy's `init_entries`): entries [first, first + n) of
 * (layer, kv_head) were just appended. xn: [n × n_embd] the layer's input after its
 * attention RMSNorm (weight applied) for those rows, the vectors the keys and values were
 * projected from; valid only during the call. */
typedef void (*rt_append_fn)(void *user, int layer, int kv_head, int32_t first, int32_t n,
                             const float *xn);

/* Layer hook (the prompt trace of rt_seq): layer `layer` has run for the C rows of a
 * chunk at positions pos0 .. pos0+C-1. x: [C × n_embd] the residual stream after the
 * layer; q: [C × n_head·head_dim] the layer's post-RoPE queries as the attention used them.
 * Pointers are valid only during the call. */
typedef void (*rt_layer_fn)(void *user, int layer, int C, int32_t pos0, const float *x,
                            const float *q);

/* Forward context: scratch for one sequence, sized for chunks of up to max_chunk tokens
 * and a KV store of up to cap entries per head. */
typedef struct rt_fwd {
	const rt_model *m;
	int max_chunk;          /* tokens per internal chunk */
	int32_t cap;            /* entries per head the scratch can attend over */
	rt_observe_fn observe;  /* NULL, or called per (layer, KV head, query row) */
	void *observe_user;
	/* NULL, or called per (layer, KV head) once the chunk's keys and values were appended
	 * to every KV head of the layer, before the layer's attention (so init_entries runs
	 * before observe sees the new entries) */
	rt_append_fn on_append;
	void *append_user;
	rt_layer_fn on_layer;   /* NULL, or called after every layer of every chunk */
	void *layer_user;
	/* RoPE positions. 0 (rt_fwd_init's default): queries and keys of a token are rotated
	 * at its position in the text (pos0 + row; keys keep their original rotation). 1: the
	 * compacted convention (StreamingLLM's pos_shift): per (layer, KV head), the key of
	 * chunk row r is rotated at the index it gets in that head's entry list (entries
	 * before the chunk + r) and the group's queries of row r at the same index; the caller
	 * re-rotates kept keys to their new index after each eviction, its own and the
	 * window trim at the end of each forward call (rt_seq does). */
	int rope_at_index;
	int32_t rope_at[2];     /* internal: the position each rope_cs table's row 0 holds */
	/* scratch (one allocation) */
	float *x;       /* [max_chunk × n_embd] residual stream */
	float *xn;      /* [max_chunk × n_embd] normalised input */
	float *q;       /* [max_chunk × n_head·head_dim] */
	float *k;       /* [max_chunk × n_head_kv·head_dim] */
	float *v;       /* [max_chunk × n_head_kv·head_dim] */
	float *att;     /* [max_chunk × n_head·head_dim] attention output */
	float *qg;      /* [max_chunk·group × head_dim] one KV head's packed queries */
	float *og;      /* [max_chunk·group × head_dim] their outputs */
	float *s;       /* [max(2^18, group × cap)] scores / probabilities of a row block */
	float *gate;    /* [max_chunk × n_ff] */
	float *up;      /* [max_chunk × n_ff] */
	float *rope_cs; /* [2 × max_chunk × n_rot] interleaved cos, sin per rotated pair: table
	                   0 at hp.rope_base, table 1 (from max_chunk·n_rot on) at
	                   hp.rope_base_swa */
	/* fast path: qg, og and s hold n_att copies (one per pool thread) att_stride floats
	 * apart each, so the KV heads of a layer are attended in parallel (only when observe
	 * is NULL or observe_parallel is set: the hook is then called from several threads,
	 * for different KV heads) */
	int n_att;
	size_t qg_stride, s_stride;
	/* model with a narrow KV type (m->kv_type f16 / q8_0): n_att slices, kvf_stride floats
	 * apart, of [2 × cap × head_dim] floats into which a chunk of 16 or more rows decodes
	 * a head's keys and values for sgemm (shorter chunks read the stored rows directly,
	 * runtime/model/rt_kvattn.h); NULL otherwise */
	float *kvf;
	size_t kvf_stride;
	int observe_parallel;
	/* models with sliding-window layers: [cap] indices of the entries a layer keeps when
	 * the entries that fell out of its window are evicted (rt_model_forward); NULL else */
	int32_t *win_keep;
	/* 1: the window trim is skipped (the lists keep entries that fell out of a layer's
	 * window; the mask still hides them from every query). KVzip's context replay sets it
	 * for its forward, whose rows it removes after (runtime/policy/rt_replay.h), so the
	 * window lists hold what they held before. 0 (rt_fwd_init's default): trimmed. */
	int keep_windows;
	rt_matmul_scratch mm;   /* fast path: quantised activations and dequantised tiles */
	void *segs;     /* [max_chunk] internal: the sequences' rows of a batched chunk */
	int *seg_len;   /* [max_chunk] internal: their row counts, the matmuls' segments */
	float *q_pre;   /* [max_chunk × n_head·head_dim] the chunk's queries before RoPE, for
	                   observe (rt_fwd_keep_queries); NULL by default */
	void *mem;
	size_t mem_bytes;
} rt_fwd;

/* Size the scratch (for the fast path: for the model's thread count at this call).
 * max_chunk >= 1, cap >= 1. Returns -1 with err on bad sizes or allocation failure (f is
 * then safe to rt_fwd_free). */
int rt_fwd_init(rt_fwd *f, const rt_model *m, int max_chunk, int32_t cap, rt_err *err);
void rt_fwd_free(rt_fwd *f);

/* Give f now the f32 decode buffers a tiered store kv is read through (attention decodes
 * every tier of a head once per chunk), which a forward would otherwise allocate at its
 * first call: so that feeding a sequence allocates nothing (rt_seq_init calls it). Nothing
 * for an untiered store or when f has them. 0, or -1 with err (allocation failure). */
int rt_fwd_reserve_tiers(rt_fwd *f, const rt_kv *kv, rt_err *err);

/* Keep every chunk's queries before RoPE for the observe hook (rt_attn_view.query:
 * Expected Attention's query statistics, arXiv 2510.00636): allocates f->q_pre, max_chunk
 * × n_head·head_dim floats, freed by rt_fwd_free. Returns -1 with err on allocation
 * failure (f unchanged). */
int rt_fwd_keep_queries(rt_fwd *f, rt_err *err);

/* RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467) as llama.cpp's ggml_rms_norm:
 * y[r] = x[r] / sqrt(mean(x[r]^2) + eps) ⊙ w for C rows of n floats each (y, x: C × n,
 * w: n), the sum of squares in double. y may equal x. No errors, no allocation. The
 * forward's exact path, and the CPU reference of the CUDA rmsnorm kernel. */
void rt_rms_norm(float *y, const float *x, const float *w, int C, int n, float eps);

/* The residual stream the forward starts token t from (layer 0's input): its embedding row
 * times hp.embd_scale, into xr[0..n_embd). t must be in 0..n_vocab-1. */
void rt_model_embed(const rt_model *m, int32_t t, float *xr);

/* Which logits rt_model_forward writes. */
enum rt_logits_mode {
	RT_LOGITS_NONE = 0,   /* logits may be NULL */
	RT_LOGITS_ALL = 1,    /* logits is [n × n_vocab], row i for tokens[i] */
	RT_LOGITS_LAST = 2,   /* logits is [n_vocab], for tokens[n-1] only */
};

/* Run tokens[0..n) at positions pos0..pos0+n-1 through the model, appending one entry per
 * token to every (layer, KV head) of kv (shapes must match the model), in internal chunks
 * of at most f->max_chunk tokens. Within the call no entry is evicted by a policy, so every
 * head needs room for n more entries; after each chunk a sliding-window layer (rt_layer
 * window > 0) drops the entries no later query can see (pos <= last position + 1 - window),
 * which returns their blocks (the model's rule: no policy decides it, and the logits are
 * those of the window mask alone; a list out of position order, as a policy's tail-fill
 * eviction leaves it, is masked and trimmed entry by entry); under rope_at_index only after
 * the last chunk of the call, and the caller re-rotates the kept keys to their new indices
 * before the next call (rt_seq does). Errors (-1, err set, checked before anything is
 * computed, so kv is unchanged): token id out of range, pos0+n beyond the model's
 * context_length, a head whose entries + n exceed kv->cap or f->cap ("KV cache full"), a KV
 * pool that cannot grant the blocks of the n new entries ("KV pool exhausted";
 * rt_kv_reserve), a KV store of another shape, logits requested with a NULL buffer. Logits
 * are f32 pre-softmax scores; the observe hook, when set, is called per (layer, KV head,
 * query row) in that nesting. */
int rt_model_forward(rt_fwd *f, rt_kv *kv, const int32_t *tokens, int n, int32_t pos0,
                     float *logits, enum rt_logits_mode mode, rt_err *err);

/* Continuous-batching forward: K sequences, each with its OWN tokens tokens[k][0..n[k])
 * at its own positions pos0[k].. (a decode step of one token, or a prefill chunk), in
 * one chunk: the weight GEMMs run once over the Σ n[k] stacked rows, everything else per
 * sequence exactly as rt_model_forward (appends to kv[k], f[k]'s hooks, position
 * convention and attention scratch). No internal chunking: Σ n[k] <= big->max_chunk,
 * 1 <= n[k] <= f[k]->max_chunk. logits[k]: NULL (none), or where sequence k's logits go:
 * [n[k] × n_vocab] when all_rows[k] is 1, else [n_vocab] for its last row (all_rows may
 * be NULL: last rows only). big may be f[0] only when K = 1. Same errors as
 * rt_model_forward, checked for every sequence before anything is computed, plus sizes
 * outside the limits above. Each sequence's rows are their own matmul segment
 * (runtime/model/rt_matmul.h), so a sequence's results are those of rt_model_forward with
 * the same chunks, bit for bit, whatever is stacked with it. */
int rt_model_forward_multi(rt_fwd *big, rt_fwd *const *f, rt_kv *const *kv, int K,
                           const int32_t *const *tokens, const int *n, const int32_t *pos0,
                           float *const *logits, const int *all_rows, rt_err *err);

/* The attention softmax used by the forward, exposed for tests and kernels: for each of
 * the G rows P[g·ld .. g·ld + ld) (scaled scores q·k/sqrt(d)), add log_count[0..lim) to the
 * first lim values and replace them by softmax probabilities (exp with max error about
 * 2 ulp, arguments below -80 are clamped to -80; the sum is accumulated in double), and
 * set values lim..ld-1 to 0. lim >= 1, ld >= lim. */
void rt_attn_softmax(float *P, size_t ld, int G, int lim, const float *log_count);

/* OpenBLAS picks its kernels by CPU model at load time and falls back to the SSE3
 * "Prescott" kernels on CPUs it does not recognise (common on virtual machines), which
 * makes the f32 GEMMs about 3x slower. Call first thing in main(): when OPENBLAS_CORETYPE
 * is unset, the detected core is such a fallback and the CPU has AVX2+FMA, it sets
 * OPENBLAS_CORETYPE to SkylakeX (AVX-512F/BW/DQ/VL present) or Haswell and re-executes
 * /proc/self/exe with the same argv (the variable must be set before OpenBLAS's
 * constructor runs). Returns only when nothing is to be done or exec failed. */
void rt_model_blas_setup(char **argv);

/* Allocate a KV store shaped for the model (cap entries per head, no policy state) with
 * the model's KV element type (m->kv_type). */
int rt_model_kv_init(const rt_model *m, rt_kv *kv, int32_t cap, rt_err *err);

#endif
