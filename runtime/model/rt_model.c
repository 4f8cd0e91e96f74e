/*
 * rt_model: loading a GGUF `llama` model into f32 weights and its chunked forward pass
 * over the ragged KV store; see rt_model.h for the maths and the contracts.
 */
#include "model/rt_model.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "model/rt_dot.h"
#include "model/rt_kvattn.h"
#include "model/rt_quant.h"
#include "base/rt_rope.h"

/* Chunks of at least this many rows attend over a narrow-type store by decoding the head's
 * rows once to f32 and multiplying with sgemm; shorter ones read the stored rows directly. */
#define ATT_DECODE_ROWS 16

/* Score-block budget in floats: rows of a chunk are processed in blocks whose
 * [rows·G × entries] score matrix stays around 1 MiB, i.e. in cache across the QK^T
 * product, the softmax and the P·V product. */
#define ATT_BLOCK_FLOATS ((size_t)1 << 18)

/* Floats of score scratch for G query heads over up to cap entries: a row block has
 * rb·G·ncol <= ATT_BLOCK_FLOATS when rb > 1 rows, else G·ncol <= G·cap. */
static size_t score_floats(int G, int32_t cap)
{
	size_t one_row = (size_t)G * (size_t)cap;
	return one_row > ATT_BLOCK_FLOATS ? one_row : ATT_BLOCK_FLOATS;
}

/* Upper bounds that keep every size computation far from overflow for hostile files. */
#define MAX_LAYERS 1024
#define MAX_DIM (1 << 17)
#define MAX_VOCAB (1 << 22)

/* ---- loading ----------------------------------------------------------------------- */

/* The key "ARCH.SUFFIX" into *u (u not NULL) or *f: a required key must be there; an
 * optional one that is absent keeps *u / *f (the default). Fails (-1, err) on a missing
 * required key or a wrong type. */
static int arch_get(const rt_gguf *g, const char *arch, const char *suffix, int required,
                    uint32_t *u, float *f, rt_err *err)
{
	char key[128];
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	if (!required && !rt_gguf_find_kv(g, key))
		return 0;
	return u ? rt_gguf_get_u32(g, key, u, err) : rt_gguf_get_f32(g, key, f, err);
}

static int get_u32_req(const rt_gguf *g, const char *arch, const char *suffix, uint32_t *out,
                       rt_err *err)
{
	return arch_get(g, arch, suffix, 1, out, NULL, err);
}

static int get_u32_opt(const rt_gguf *g, const char *arch, const char *suffix, uint32_t *out,
                       rt_err *err)
{
	return arch_get(g, arch, suffix, 0, out, NULL, err);
}

static int get_f32_opt(const rt_gguf *g, const char *arch, const char *suffix, float *out,
                       rt_err *err)
{
	return arch_get(g, arch, suffix, 0, NULL, out, err);
}

/* A tensor the model needs: its name and expected shape (ne1 = 0 for 1-D). */
typedef struct want {
	char name[96];
	int64_t ne0, ne1;
	const float **dst;
	const rt_gguf_tensor *t;
	rt_wmat *mat;        /* the fast path's view of a matrix, or NULL for a vector */
	int raw;             /* 1: kept in its block type (qmem), 0: dequantised (mem) */
	int neox;            /* 1: rows (vector: values) permuted by permute_neox */
	size_t off;          /* floats from the start of mem, or bytes from the start of qmem */
} want;

static int check_tensor(const rt_gguf *g, want *w, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	const rt_gguf_tensor *t = rt_gguf_find_tensor(g, w->name);
	if (!t)
		return rt_err_set(err, "%s: missing tensor '%s'", path, w->name);
	int want_dims = w->ne1 ? 2 : 1;
	int64_t got1 = t->n_dims >= 2 ? t->ne[1] : 1;
	int extra = 0;
	for (uint32_t d = 2; d < t->n_dims; d++)
		extra |= t->ne[d] != 1;
	if (t->ne[0] != w->ne0 || got1 != (w->ne1 ? w->ne1 : 1) || extra) {
		if (want_dims == 2)
			return rt_err_set(err, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
			                  path, w->name, (long long)t->ne[0], (long long)got1,
			                  (long long)w->ne0, (long long)w->ne1);
		return rt_err_set(err, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld]", path,
		                  w->name, (long long)t->ne[0], (long long)got1, (long long)w->ne0);
	}
	if (!rt_quant_supported(t->type))
		return rt_err_set(err, "%s: tensor '%s' has unsupported type %s (%u)", path, w->name,
		                  rt_ggml_type_name(t->type), t->type);
	int64_t n1 = w->ne1 ? w->ne1 : 1;
	size_t rb = rt_quant_row_bytes(t->type, t->ne[0]);
	if (rb == 0)
		return rt_err_set(err, "%s: tensor '%s' row of %lld values is not a whole number of %s blocks",
		                  path, w->name, (long long)t->ne[0], rt_ggml_type_name(t->type));
	if (t->nbytes != rb * (uint64_t)n1)
		return rt_err_set(err, "%s: tensor '%s' holds %llu bytes, expected %llu", path, w->name,
		                  (unsigned long long)t->nbytes, (unsigned long long)(rb * (uint64_t)n1));
	w->t = t;
	return 0;
}

/* NEOX RoPE as NORMAL mode: within each run of head_dim units (rows of a matrix, or
 * values of a vector), unit i of the first n_rot goes to 2i and unit i + n_rot/2 to
 * 2i + 1, so that rotating adjacent pairs turns the pairs (i, i + n_rot/2) that NEOX
 * turns, by the same angle (rt_model.h). n_units a multiple of head_dim. */
static int permute_neox(uint8_t *data, size_t unit, int64_t n_units, int head_dim, int n_rot)
{
	uint8_t *tmp = malloc(unit * (size_t)n_rot);
	if (!tmp)
		return -1;
	const int half = n_rot / 2;
	for (int64_t h = 0; h < n_units; h += head_dim) {
		uint8_t *base = data + (size_t)h * unit;
		for (int i = 0; i < half; i++) {
			memcpy(tmp + (size_t)(2 * i) * unit, base + (size_t)i * unit, unit);
			memcpy(tmp + (size_t)(2 * i + 1) * unit, base + (size_t)(i + half) * unit, unit);
		}
		memcpy(base, tmp, unit * (size_t)n_rot);
	}
	free(tmp);
	return 0;
}

/* Copy (fast path, raw) or dequantise one checked tensor into the model, refusing a
 * non-finite weight, and set its pointer and its matrix view. */
static int load_tensor(rt_model *m, want *w, const char *path, rt_err *err)
{
	const int64_t rows = w->ne1 ? w->ne1 : 1, n = w->ne0 * rows;
	const size_t rb = rt_quant_row_bytes(w->t->type, w->ne0);
	if (w->raw) {
		uint8_t *dst = (uint8_t *)m->qmem + w->off;
		memcpy(dst, w->t->data, (size_t)w->t->nbytes);
		if (w->neox && permute_neox(dst, rb, rows, m->hp.head_dim, m->hp.n_rot) < 0)
			return rt_err_set(err, "%s: out of memory", path);
		/* the finiteness check decodes the rows a slice at a time */
		float *tmp = malloc((size_t)w->ne0 * 64 * sizeof(float));
		if (!tmp)
			return rt_err_set(err, "%s: out of memory", path);
		for (int64_t r0 = 0; r0 < rows; r0 += 64) {
			const int64_t nr = rows - r0 < 64 ? rows - r0 : 64;
			rt_dequant(w->t->type, dst + (size_t)r0 * rb, tmp, nr * w->ne0);
			for (int64_t j = 0; j < nr * w->ne0; j++)
				if (!isfinite(tmp[j])) {
					free(tmp);
					return rt_err_set(err, "%s: tensor '%s' holds a non-finite value at element %lld",
					                  path, w->name, (long long)(r0 * w->ne0 + j));
				}
		}
		free(tmp);
		*w->mat = (rt_wmat){ .type = w->t->type, .rows = (int)rows, .cols = (int)w->ne0,
			             .row_bytes = rb, .data = dst };
		*w->dst = NULL;
		return 0;
	}
	float *dst = m->mem + w->off;
	if (rt_dequant(w->t->type, w->t->data, dst, n) < 0)
		return rt_err_set(err, "%s: tensor '%s': cannot decode type %s", path, w->name,
		                  rt_ggml_type_name(w->t->type));
	/* a matrix's units are its rows, a vector's its values */
	if (w->neox && permute_neox((uint8_t *)dst, w->ne1 ? (size_t)w->ne0 * sizeof(float) : sizeof(float),
	                            w->ne1 ? rows : w->ne0, m->hp.head_dim, m->hp.n_rot) < 0)
		return rt_err_set(err, "%s: out of memory", path);
	for (int64_t j = 0; j < n; j++)
		if (!isfinite(dst[j]))
			return rt_err_set(err, "%s: tensor '%s' holds a non-finite value at element %lld",
			                  path, w->name, (long long)j);
	*w->dst = dst;
	if (w->mat)
		*w->mat = (rt_wmat){ .type = RT_GGML_F32, .rows = (int)rows, .cols = (int)w->ne0,
			             .row_bytes = (size_t)w->ne0 * sizeof(float), .data = dst };
	return 0;
}

static const rt_arch_info arch_rows[RT_ARCH_N] = {
#define RT_ARCH_ROW(e, nm, bias, qk_norm, post_norm, gelu, embd_scale, neox, swa) \
	[RT_ARCH_##e] = { nm, bias, qk_norm, post_norm, gelu, embd_scale, neox, swa },
	RT_ARCHS(RT_ARCH_ROW)
#undef RT_ARCH_ROW
};

const rt_arch_info *rt_arch_get(enum rt_arch arch)
{
	RT_ASSERT((unsigned)arch < RT_ARCH_N);
	return &arch_rows[arch];
}

/* general.architecture as an enum rt_arch; -1 with err naming what is supported. */
static int read_arch(const rt_gguf *g, enum rt_arch *out, rt_err *err)
{
	rt_gguf_str arch;
	if (rt_gguf_get_str(g, "general.architecture", &arch, err) < 0)
		return -1;
	char known[128] = "";
	for (int a = 0; a < RT_ARCH_N; a++) {
		const char *nm = arch_rows[a].name;
		if (arch.len == strlen(nm) && memcmp(arch.s, nm, arch.len) == 0) {
			*out = (enum rt_arch)a;
			return 0;
		}
		snprintf(known + strlen(known), sizeof known - strlen(known), "%s'%s'", a ? ", " : "", nm);
	}
	return rt_err_set(err, "%s: general.architecture '%.*s' is not supported (supported: %s)",
	                  rt_gguf_path(g), (int)(arch.len > 64 ? 64 : arch.len), arch.s, known);
}

/* Keys that would change the function and that this runtime does not implement: refused
 * with the key and what is supported, rather than computing another model. */
static int refuse_unsupported(const rt_gguf *g, const char *a, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	static const char *const float_keys[] = { "final_logit_softcapping", "attn_logit_softcapping",
		                                  "rope.scaling.yarn_log_multiplier" };
	for (size_t i = 0; i < sizeof float_keys / sizeof float_keys[0]; i++) {
		float v = 0.0f;
		if (get_f32_opt(g, a, float_keys[i], &v, err) < 0)
			return -1;
		if (v != 0.0f)
			return rt_err_set(err, "%s: key '%s.%s' = %g is not supported (supported: absent, or "
			                  "the neutral value 0)", path, a, float_keys[i], (double)v);
	}
	return 0;
}

/* RoPE scaling (rt_model_hparams): the keys llama_model::load_hparams reads, with its
 * defaults; longrope and other types are refused naming the key. */
static int read_rope_scaling(const rt_gguf *g, const char *a, rt_model_hparams *hp, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	char key[128];
	snprintf(key, sizeof key, "%s.rope.scaling.type", a);
	rt_gguf_str st = { "linear", 6 };
	if (rt_gguf_find_kv(g, key) && rt_gguf_get_str(g, key, &st, err) < 0)
		return -1;
	const int none = st.len == 4 && !memcmp(st.s, "none", 4);
	hp->rope_yarn = st.len == 4 && !memcmp(st.s, "yarn", 4);
	if (!none && !hp->rope_yarn && !(st.len == 6 && !memcmp(st.s, "linear", 6)))
		return rt_err_set(err, "%s: key '%s' = '%.*s' is not supported (supported: none, linear, "
		                  "yarn)", path, key, (int)(st.len > 32 ? 32 : st.len), st.s);
	float fac = 0.0f;
	uint32_t orig = (uint32_t)hp->n_ctx;
	hp->rope_attn_factor = 1.0f;
	hp->yarn_beta_fast = 32.0f;
	hp->yarn_beta_slow = 1.0f;
	snprintf(key, sizeof key, "%s.rope.scaling.factor", a);
	const char *fk = rt_gguf_find_kv(g, key) ? "rope.scaling.factor" : "rope.scale_linear";
	if (get_f32_opt(g, a, fk, &fac, err) < 0 ||
	    get_f32_opt(g, a, "rope.scaling.attn_factor", &hp->rope_attn_factor, err) < 0 ||
	    get_f32_opt(g, a, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast, err) < 0 ||
	    get_f32_opt(g, a, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow, err) < 0 ||
	    get_u32_opt(g, a, "rope.scaling.original_context_length", &orig, err) < 0)
		return -1;
	if (!(fac >= 0.0f) || !isfinite(fac) || !(hp->rope_attn_factor > 0.0f) ||
	    !isfinite(hp->rope_attn_factor) || orig < 1 || orig > (1u << 24) ||
	    !isfinite(hp->yarn_beta_fast) || !isfinite(hp->yarn_beta_slow))
		return rt_err_set(err, "%s: %s.%s %g, rope.scaling.attn_factor %g or "
		                  "original_context_length %u out of range", path, a, fk, (double)fac,
		                  (double)hp->rope_attn_factor, orig);
	hp->rope_freq_scale = none || fac == 0.0f ? 1.0f : 1.0f / fac;
	hp->n_ctx_orig = (int32_t)orig;
	return 0;
}

/* The sliding-window options of a gemma3 file: hp->n_swa, swa_pattern, rope_base_swa.
 * The pattern key may only be a number here (llama.cpp also reads a per-layer array). */
static int read_swa(const rt_gguf *g, const char *a, rt_model_hparams *hp, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	uint32_t n_swa = 0, pattern = 6;
	char key[128];
	snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
	const rt_gguf_kv *kv = rt_gguf_find_kv(g, key);
	if (kv && kv->type == RT_GGUF_ARRAY)
		return rt_err_set(err, "%s: key '%s' is an array: per-layer patterns are not supported "
		                  "(supported: a number n, every n-th layer global)", path, key);
	hp->rope_base_swa = 10000.0f;
	if (get_u32_opt(g, a, "attention.sliding_window", &n_swa, err) < 0 ||
	    get_u32_opt(g, a, "attention.sliding_window_pattern", &pattern, err) < 0 ||
	    get_f32_opt(g, a, "rope.freq_base_swa", &hp->rope_base_swa, err) < 0)
		return -1;
	if (n_swa > (1u << 24) || pattern < 1 || pattern > MAX_LAYERS)
		return rt_err_set(err, "%s: %s.attention.sliding_window %u / sliding_window_pattern %u out "
		                  "of range", path, a, n_swa, pattern);
	if (!(hp->rope_base_swa > 0.0f) || !isfinite(hp->rope_base_swa))
		return rt_err_set(err, "%s: %s.rope.freq_base_swa %g must be positive", path, a,
		                  (double)hp->rope_base_swa);
	hp->n_swa = (int32_t)n_swa;
	hp->swa_pattern = (int)pattern;
	if (n_swa == 0)
		hp->rope_base_swa = hp->rope_base;
	return 0;
}

/* Mistral-style files (an architecture without interleaved layers): when
 * ARCH.attention.sliding_window is set, every layer attends over that window at the one
 * RoPE base (swa_pattern n_layer + 1: no layer is global), as HF transformers' Mistral
 * does. llama.cpp's `llama` graph does not read the key and attends over everything, so
 * the two agree up to the window and differ beyond it. */
static int read_window(const rt_gguf *g, const char *a, rt_model_hparams *hp, rt_err *err)
{
	uint32_t n_swa = 0;
	if (get_u32_opt(g, a, "attention.sliding_window", &n_swa, err) < 0)
		return -1;
	if (n_swa > (1u << 24))
		return rt_err_set(err, "%s: %s.attention.sliding_window %u out of range",
		                  rt_gguf_path(g), a, n_swa);
	hp->n_swa = (int32_t)n_swa;
	hp->swa_pattern = hp->n_layer + 1;
	return 0;
}

static int read_hparams(const rt_gguf *g, rt_model_hparams *hp, uint32_t *file_type, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	memset(hp, 0, sizeof *hp);
	if (read_arch(g, &hp->arch, err) < 0)
		return -1;
	const rt_arch_info *ai = rt_arch_get(hp->arch);
	const char *a = ai->name;
	uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_ctx, n_rot = 0, head_dim = 0;
	if (get_u32_req(g, a, "block_count", &n_layer, err) < 0 ||
	    get_u32_req(g, a, "embedding_length", &n_embd, err) < 0 ||
	    get_u32_req(g, a, "feed_forward_length", &n_ff, err) < 0 ||
	    get_u32_req(g, a, "attention.head_count", &n_head, err) < 0 ||
	    get_u32_req(g, a, "context_length", &n_ctx, err) < 0)
		return -1;
	n_head_kv = n_head;
	float base = 10000.0f, eps = 0.0f;
	if (get_u32_opt(g, a, "attention.head_count_kv", &n_head_kv, err) < 0 ||
	    get_u32_opt(g, a, "attention.key_length", &head_dim, err) < 0 ||
	    get_u32_opt(g, a, "rope.dimension_count", &n_rot, err) < 0 ||
	    get_f32_opt(g, a, "rope.freq_base", &base, err) < 0 ||
	    refuse_unsupported(g, a, err) < 0)
		return -1;
	char key[128];
	snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
	if (rt_gguf_get_f32(g, key, &eps, err) < 0)
		return -1;
	if (n_layer < 1 || n_layer > MAX_LAYERS)
		return rt_err_set(err, "%s: %s.block_count %u out of range 1..%d", path, a, n_layer, MAX_LAYERS);
	if (n_embd < 1 || n_embd > MAX_DIM || n_ff < 1 || n_ff > MAX_DIM)
		return rt_err_set(err, "%s: embedding_length %u / feed_forward_length %u out of range 1..%d",
		                  path, n_embd, n_ff, MAX_DIM);
	if (n_head < 1 || n_head > n_embd || n_head_kv < 1 || n_head % n_head_kv != 0)
		return rt_err_set(err, "%s: head_count %u must be a positive multiple of head_count_kv %u",
		                  path, n_head, n_head_kv);
	if (head_dim == 0) {
		if (n_embd % n_head != 0)
			return rt_err_set(err, "%s: embedding_length %u is not a multiple of head_count %u",
			                  path, n_embd, n_head);
		head_dim = n_embd / n_head;
	}
	uint32_t v_len = head_dim;
	if (get_u32_opt(g, a, "attention.value_length", &v_len, err) < 0)
		return -1;
	if (v_len != head_dim)
		return rt_err_set(err, "%s: %s.attention.value_length %u differs from key_length %u (not "
		                  "supported: keys and values share head_dim)", path, a, v_len, head_dim);
	if (head_dim > 4096 || (uint64_t)head_dim * n_head > MAX_DIM)
		return rt_err_set(err, "%s: attention.key_length %u out of range", path, head_dim);
	if (n_rot == 0)
		n_rot = head_dim;
	if (n_rot % 2 != 0 || n_rot > head_dim)
		return rt_err_set(err, "%s: rope.dimension_count %u must be even and <= head_dim %u", path,
		                  n_rot, head_dim);
	if (n_ctx < 1 || n_ctx > (1u << 24))
		return rt_err_set(err, "%s: context_length %u out of range", path, n_ctx);
	if (!(base > 0.0f) || !isfinite(base))
		return rt_err_set(err, "%s: rope.freq_base %g must be positive", path, (double)base);
	if (!(eps > 0.0f) || !isfinite(eps))
		return rt_err_set(err, "%s: layer_norm_rms_epsilon %g must be positive", path, (double)eps);
	hp->n_layer = (int)n_layer;
	hp->n_embd = (int)n_embd;
	hp->n_ff = (int)n_ff;
	hp->n_head = (int)n_head;
	hp->n_head_kv = (int)n_head_kv;
	hp->group = (int)(n_head / n_head_kv);
	hp->head_dim = (int)head_dim;
	hp->n_rot = (int)n_rot;
	hp->n_ctx = (int32_t)n_ctx;
	hp->rope_base = base;
	hp->rope_base_swa = base;
	hp->norm_eps = eps;
	hp->attn_scale = 1.0f / sqrtf((float)head_dim);
	hp->embd_scale = ai->embd_scale ? sqrtf((float)n_embd) : 1.0f;
	/* gemma3's 27B (62 layers) scales by the query width per head, as llama.cpp does */
	if (hp->arch == RT_ARCH_GEMMA3 && n_layer == 62)
		hp->attn_scale = 1.0f / sqrtf((float)(n_embd / n_head));
	if ((ai->swa ? read_swa(g, a, hp, err) : read_window(g, a, hp, err)) < 0 ||
	    read_rope_scaling(g, a, hp, err) < 0)
		return -1;
	*file_type = UINT32_MAX;
	if (rt_gguf_find_kv(g, "general.file_type") &&
	    rt_gguf_get_u32(g, "general.file_type", file_type, err) < 0)
		return -1;
	return 0;
}

/* The vocabulary size (token_embd.weight's rows, agreeing with llama.vocab_size) and
 * whether the KV type o->kv_type can be used with this head_dim and path. 0 and *nv_out,
 * or -1 with err. */
static int check_vocab_kv(const rt_gguf *g, const rt_model_opts *o, const rt_model_hparams *h,
                          int64_t *nv_out, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	rt_model_hparams hp = *h;
	const rt_gguf_tensor *te = rt_gguf_find_tensor(g, "token_embd.weight");
	if (!te) {
		rt_err_set(err, "%s: missing tensor 'token_embd.weight'", path);
		return -1;
	}
	int64_t nv = te->n_dims >= 2 ? te->ne[1] : 0;
	if (nv < 1 || nv > MAX_VOCAB) {
		rt_err_set(err, "%s: tensor 'token_embd.weight' has %lld rows, expected 1..%d", path,
		           (long long)nv, MAX_VOCAB);
		return -1;
	}
	if ((unsigned)o->kv_type >= RT_KV_N_TYPE ||
	    (o->exact && o->kv_type != RT_KV_F32) ||
	    rt_kv_row_bytes(o->kv_type, hp.head_dim) == 0) {
		rt_err_set(err, "%s: KV type %s cannot be used here (%s)", path,
		           rt_kv_type_name(o->kv_type),
		           (unsigned)o->kv_type >= RT_KV_N_TYPE ? "unknown type" :
		           o->exact ? "the exact path stores f32 keys and values" :
		                      "head_dim is not a multiple of 32");
		return -1;
	}
	uint32_t vs = (uint32_t)nv;
	const char *a = rt_arch_get(hp.arch)->name;
	if (get_u32_opt(g, a, "vocab_size", &vs, err) < 0)
		return -1;
	if (vs != (uint32_t)nv) {
		rt_err_set(err, "%s: %s.vocab_size %u disagrees with token_embd.weight's %lld rows", path,
		           a, vs, (long long)nv);
		return -1;
	}
	*nv_out = nv;
	return 0;
}

/* The per-layer options: gemma3's sliding-window layers (all but every swa_pattern-th,
 * llama_hparams::set_swa_pattern) attend over their window at rope_base_swa. */
static void layer_options(rt_model *m)
{
	const rt_model_hparams *hp = &m->hp;
	for (int l = 0; l < hp->n_layer; l++) {
		rt_layer *L = &m->layers[l];
		const int swa = hp->n_swa > 0 && l % hp->swa_pattern < hp->swa_pattern - 1;
		/* only interleaved layers (gemma3) have their own base: a Mistral window keeps it */
		const int own = swa && rt_arch_get(hp->arch)->swa;
		L->window = swa ? hp->n_swa : 0;
		L->rope_base = own ? hp->rope_base_swa : hp->rope_base;
		L->rope_slot = own;
	}
}

/* Each layer's RoPE frequencies and magnitude (rt_rope_scaled_freqs): its base, the
 * file's scaling (freq_scale on the full-attention layers only) and rope_freqs.weight.
 * 0, or -1 with err (out of memory; a factor that is not positive and finite). */
static int rope_setup(rt_model *m, rt_err *err)
{
	const rt_model_hparams *hp = &m->hp;
	const int half = hp->n_rot / 2;
	for (int i = 0; m->rope_factors && i < half; i++)
		if (!(m->rope_factors[i] > 0.0f) || !isfinite(m->rope_factors[i]))
			return rt_err_set(err, "%s: tensor 'rope_freqs.weight'[%d] = %g must be positive",
			                  m->path, i, (double)m->rope_factors[i]);
	m->rope_freq = malloc(((size_t)hp->n_layer * half + 1) * sizeof *m->rope_freq);
	m->layer_window = malloc((size_t)hp->n_layer * sizeof *m->layer_window);
	if (!m->rope_freq || !m->layer_window)
		return rt_err_set(err, "%s: out of memory", m->path);
	for (int l = 0; l < hp->n_layer; l++) {
		rt_layer *L = &m->layers[l];
		m->layer_window[l] = L->window; /* the policies' view of the windows */
		const rt_rope_scaling sc = {
			.freq_scale = L->rope_slot ? 1.0f : hp->rope_freq_scale, .factors = m->rope_factors,
			.yarn = hp->rope_yarn, .yarn_factor = 1.0f / hp->rope_freq_scale,
			.beta_fast = hp->yarn_beta_fast, .beta_slow = hp->yarn_beta_slow,
			.n_ctx_orig = hp->n_ctx_orig, .attn_factor = hp->rope_attn_factor,
		};
		double *f = m->rope_freq + (size_t)l * half;
		rt_rope_scaled_freqs(f, &L->rope_mscale, hp->n_rot, L->rope_base, &sc);
		L->rope_freq = f;
	}
	return 0;
}

/* The tensors the model needs (names, shapes, where each goes) into w[0..n): the
 * embedding, output norm, output (unless tied), 9 per layer and the architecture's extras
 * (rt_arch_info). Returns n. */
static size_t model_wants(rt_model *m, const rt_gguf *g, int64_t nv, want *w)
{
	const rt_model_hparams hp = m->hp;
	const rt_arch_info *ai = rt_arch_get(hp.arch);
	int64_t qd = (int64_t)hp.n_head * hp.head_dim, kd = (int64_t)hp.n_head_kv * hp.head_dim;
	int64_t E = hp.n_embd, F = hp.n_ff, D = hp.head_dim;
	size_t nw = 0;
#define WANT_M(nm, a0, a1, d, mt, nx)                                           \
	do {                                                                    \
		snprintf(w[nw].name, sizeof w[nw].name, "%s", (nm));            \
		w[nw].ne0 = (a0), w[nw].ne1 = (a1), w[nw].dst = (d);            \
		w[nw].mat = (mt);                                               \
		w[nw].neox = (nx) && ai->neox;                                  \
		nw++;                                                           \
	} while (0)
#define WANT(nm, a0, a1, d) WANT_M(nm, a0, a1, d, NULL, 0)
	WANT_M("token_embd.weight", E, nv, &m->tok_embd, &m->embd, 0);
	WANT("output_norm.weight", E, 0, &m->out_norm);
	if (rt_gguf_find_tensor(g, "rope_freqs.weight")) /* Llama 3.x: llama.cpp's LLM_TENSOR_ROPE_FREQS */
		WANT("rope_freqs.weight", hp.n_rot / 2, 0, &m->rope_factors);
	m->tied_output = rt_gguf_find_tensor(g, "output.weight") == NULL;
	if (!m->tied_output)
		WANT_M("output.weight", E, nv, &m->output, &m->out, 0);
	for (int l = 0; l < hp.n_layer; l++) {
		rt_layer *L = &m->layers[l];
		char nm[96];
#define WANT_T(sfx, kind, a0, a1, d, mt, nx)                                    \
	do {                                                                    \
		snprintf(nm, sizeof nm, "blk.%d.%s.%s", l, (sfx), (kind));      \
		WANT_M(nm, a0, a1, d, mt, nx);                                  \
	} while (0)
#define WANT_L(sfx, a0, a1, d, mt) WANT_T(sfx, "weight", a0, a1, d, mt, 0)
		WANT_L("attn_norm", E, 0, &L->attn_norm, NULL);
		WANT_T("attn_q", "weight", E, qd, &L->wq, &L->mq, 1);
		WANT_T("attn_k", "weight", E, kd, &L->wk, &L->mk, 1);
		WANT_L("attn_v", E, kd, &L->wv, &L->mv);
		WANT_L("attn_output", qd, E, &L->wo, &L->mo);
		WANT_L("ffn_norm", E, 0, &L->ffn_norm, NULL);
		WANT_L("ffn_gate", E, F, &L->w_gate, &L->mgate);
		WANT_L("ffn_up", E, F, &L->w_up, &L->mup);
		WANT_L("ffn_down", F, E, &L->w_down, &L->mdown);
		if (ai->qkv_bias) {
			WANT_T("attn_q", "bias", qd, 0, &L->bq, NULL, 1);
			WANT_T("attn_k", "bias", kd, 0, &L->bk, NULL, 1);
			WANT_T("attn_v", "bias", kd, 0, &L->bv, NULL, 0);
		}
		if (ai->qk_norm) {
			WANT_T("attn_q_norm", "weight", D, 0, &L->q_norm, NULL, 1);
			WANT_T("attn_k_norm", "weight", D, 0, &L->k_norm, NULL, 1);
		}
		if (ai->post_norm) {
			WANT_L("post_attention_norm", E, 0, &L->attn_post_norm, NULL);
			WANT_L("post_ffw_norm", E, 0, &L->ffn_post_norm, NULL);
		}
#undef WANT_L
#undef WANT_T
	}
#undef WANT
#undef WANT_M
	return nw;
}

/* WANTS_PER_LAYER bounds the tensors model_wants asks for per layer. */
#define WANTS_PER_LAYER 16


/* Check every wanted tensor, lay the weights out (f32 copies 64-byte aligned for BLAS,
 * block-typed matrices as they are on the fast path) and load them. 0, or -1 with err. */
static int model_place_load(rt_model *m, const rt_gguf *g, want *w, size_t nw, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	size_t total = 0, qtotal = 0;
	for (size_t i = 0; i < nw; i++) {
		if (check_tensor(g, &w[i], err) < 0) {
			return -1;
		}
		/* the fast path keeps a matrix in its block type when rt_dot multiplies it */
		w[i].raw = !m->exact && w[i].mat && rt_matmul_supported(w[i].t->type, (int)w[i].ne0);
		if (w[i].raw) {
			w[i].off = qtotal;
			qtotal += ((size_t)w[i].t->nbytes + 63) & ~(size_t)63;
			continue;
		}
		w[i].off = total;
		/* keep each tensor 64-byte aligned for BLAS */
		total += ((size_t)(w[i].ne0 * (w[i].ne1 ? w[i].ne1 : 1)) + 15) & ~(size_t)15;
	}
	m->mem_bytes = total * sizeof(float);
	m->mem = aligned_alloc(64, m->mem_bytes ? m->mem_bytes : 64);
	m->qmem_bytes = qtotal;
	m->qmem = qtotal ? aligned_alloc(64, qtotal) : NULL;
	if (!m->mem || (qtotal && !m->qmem)) {
		rt_err_set(err, "%s: cannot allocate %zu bytes for the weights", path,
		           m->mem_bytes + m->qmem_bytes);
		return -1;
	}
	for (size_t i = 0; i < nw; i++) {
		if (load_tensor(m, &w[i], path, err) < 0) {
			return -1;
		}
	}
	return 0;
}

rt_model *rt_model_load_opts(const rt_gguf *g, const rt_model_opts *o, rt_err *err)
{
	const char *path = rt_gguf_path(g);
	if (o->threads < 0 || o->threads > 256) {
		rt_err_set(err, "%s: thread count %d is outside 1..256", path, o->threads);
		return NULL;
	}
	rt_model_hparams hp;
	uint32_t ftype;
	int64_t nv;
	if (read_hparams(g, &hp, &ftype, err) < 0 || check_vocab_kv(g, o, &hp, &nv, err) < 0)
		return NULL;
	hp.n_vocab = (int)nv;
	rt_model *m = calloc(1, sizeof *m);
	if (!m) {
		rt_err_set(err, "%s: out of memory", path);
		return NULL;
	}
	m->hp = hp;
	m->file_type = ftype;
	m->exact = o->exact != 0;
	m->kv_type = o->kv_type;
	m->f32_act = !o->exact && o->f32_act;
	snprintf(m->path, sizeof m->path, "%s", path);
	m->layers = calloc((size_t)hp.n_layer, sizeof *m->layers);
	size_t n_want = 4 + WANTS_PER_LAYER * (size_t)hp.n_layer;
	want *w = calloc(n_want, sizeof *w);
	if (!m->layers || !w) {
		rt_err_set(err, "%s: out of memory", path);
		free(w);
		rt_model_free(m);
		return NULL;
	}
	layer_options(m);
	size_t nw = model_wants(m, g, nv, w);
	RT_ASSERT(nw <= n_want);
	if (model_place_load(m, g, w, nw, err) < 0) {
		free(w);
		rt_model_free(m);
		return NULL;
	}
	if (m->tied_output) {
		m->output = m->tok_embd;
		m->out = m->embd;
	}
	free(w);
	if (rope_setup(m, err) < 0) {
		rt_model_free(m);
		return NULL;
	}
	/* the exact path keeps OpenBLAS's own thread setting unless a count was given */
	if ((!m->exact || o->threads > 0) &&
	    rt_model_set_threads(m, o->threads > 0 ? o->threads : 1, err) < 0) {
		rt_model_free(m);
		return NULL;
	}
	return m;
}

rt_model *rt_model_load_gguf(const rt_gguf *g, rt_err *err)
{
	const rt_model_opts o = { .exact = 0, .threads = 1 };
	return rt_model_load_opts(g, &o, err);
}



rt_model *rt_model_open(const char *path, const rt_model_opts *o, rt_err *err)
{
	rt_gguf *g = rt_gguf_open(path, err);
	if (!g)
		return NULL;
	rt_model *m = rt_model_load_opts(g, o, err);
	rt_gguf_close(g);
	return m;
}

rt_model *rt_model_load(const char *path, rt_err *err)
{
	rt_gguf *g = rt_gguf_open(path, err);
	if (!g)
		return NULL;
	rt_model *m = rt_model_load_gguf(g, err);
	rt_gguf_close(g);
	return m;
}

int rt_model_set_threads(rt_model *m, int n, rt_err *err)
{
	if (n < 1 || n > 256)
		return rt_err_set(err, "%s: thread count %d is outside 1..256", m->path, n);
	if (m->exact) {
		openblas_set_num_threads(n);
		return 0;
	}
	if (rt_pool_threads(m->pool) != n || !m->pool) {
		rt_pool *p = rt_pool_create(n, err);
		if (!p)
			return -1;
		rt_pool_free(m->pool);
		m->pool = p;
	}
	openblas_set_num_threads(1);
	return 0;
}

int rt_model_threads(const rt_model *m)
{
	return m->exact ? 1 : rt_pool_threads(m->pool);
}

void rt_model_free(rt_model *m)
{
	if (!m)
		return;
	rt_pool_free(m->pool);
	free(m->qmem);
	free(m->mem);
	free(m->layers);
	free(m->rope_freq);
	free(m->layer_window);
	free(m);
}

void rt_model_blas_setup(char **argv)
{
	static const char *const fallbacks[] = { "Prescott", "Core2", "Penryn", "Dunnington",
		                                 "Nehalem", "Atom", "Sandybridge", "Katmai" };
	if (getenv("OPENBLAS_CORETYPE"))
		return;
	const char *core = openblas_get_corename();
	int fallback = 0;
	for (size_t i = 0; core && i < sizeof fallbacks / sizeof fallbacks[0]; i++)
		fallback |= strcasecmp(core, fallbacks[i]) == 0;
	__builtin_cpu_init();
	if (!fallback || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return;
	int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
	if (setenv("OPENBLAS_CORETYPE", avx512 ? "SkylakeX" : "Haswell", 1) != 0)
		return;
	execv("/proc/self/exe", argv);
	/* exec failed: carry on with the detected kernels (correct, only slower) */
}

int rt_model_kv_init(const rt_model *m, rt_kv *kv, int32_t cap, rt_err *err)
{
	return rt_kv_init_typed(kv, NULL, m->kv_type, m->hp.n_layer, m->hp.n_head_kv, m->hp.group,
	                        m->hp.head_dim, cap, 0, 0, err);
}

/* ---- forward scratch --------------------------------------------------------------- */

/* The rows one sequence contributes to a forward chunk: tokens tok[0..C) at positions
 * pos0.., stacked at row off of the batch scratch; logits of its rows lrow_from..C-1 go to
 * lg (row r at lg + (r - lrow_from)·n_vocab), none when lg is NULL. */
typedef struct fwd_seg {
	const int32_t *tok;
	int C;
	int32_t pos0;
	int off;
	float *lg;
	int lrow_from;
} fwd_seg;

int rt_fwd_init(rt_fwd *f, const rt_model *m, int max_chunk, int32_t cap, rt_err *err)
{
	memset(f, 0, sizeof *f);
	const rt_model_hparams *hp = &m->hp;
	if (max_chunk < 1 || max_chunk > 65536 || cap < 1)
		return rt_err_set(err, "%s: forward: invalid chunk %d or capacity %d", m->path, max_chunk,
		                  (int)cap);
	size_t C = (size_t)max_chunk, E = (size_t)hp->n_embd;
	size_t qd = (size_t)hp->n_head * hp->head_dim, kd = (size_t)hp->n_head_kv * hp->head_dim;
	size_t G = (size_t)hp->group, hd = (size_t)hp->head_dim;
	const int n_att = m->exact ? 1 : rt_pool_threads(m->pool);
	if ((size_t)cap > SIZE_MAX / sizeof(float) / 16 / G / (size_t)n_att)
		return rt_err_set(err, "%s: forward: capacity %d too large", m->path, (int)cap);
	f->n_att = n_att;
	f->qg_stride = (C * G * hd + 15) & ~(size_t)15;
	f->s_stride = (score_floats((int)G, cap) + 15) & ~(size_t)15;
	size_t sizes[12] = {
		C * E, C * E, C * qd, C * kd, C * kd, C * qd, f->qg_stride * n_att, f->qg_stride * n_att,
		f->s_stride * n_att, C * (size_t)hp->n_ff, C * (size_t)hp->n_ff, 2 * C * (size_t)hp->n_rot,
	};
	size_t total = 0;
	for (int i = 0; i < 12; i++)
		total += (sizes[i] + 15) & ~(size_t)15;
	f->mem_bytes = total * sizeof(float);
	f->mem = aligned_alloc(64, f->mem_bytes);
	if (!f->mem) {
		rt_err_set(err, "%s: forward: cannot allocate %zu bytes of scratch", m->path, f->mem_bytes);
		f->mem_bytes = 0;
		return -1;
	}
	memset(f->mem, 0, f->mem_bytes);
	f->segs = calloc((size_t)max_chunk, sizeof(fwd_seg));
	if (hp->n_swa > 0 && !(f->win_keep = malloc((size_t)cap * sizeof *f->win_keep))) {
		rt_fwd_free(f);
		return rt_err_set(err, "%s: forward: cannot allocate %d window indices", m->path, (int)cap);
	}
	f->seg_len = calloc((size_t)max_chunk, sizeof(int));
	if (m->kv_type != RT_KV_F32 && max_chunk >= ATT_DECODE_ROWS) {
		f->kvf_stride = ((size_t)2 * (size_t)cap * hd + 15) & ~(size_t)15;
		if (f->kvf_stride > SIZE_MAX / sizeof(float) / (size_t)n_att)
			f->kvf_stride = 0;
		else
			f->kvf = aligned_alloc(64, f->kvf_stride * (size_t)n_att * sizeof(float));
	}
	if (!f->segs || !f->seg_len || (m->kv_type != RT_KV_F32 && max_chunk >= ATT_DECODE_ROWS && !f->kvf)) {
		rt_fwd_free(f);
		return rt_err_set(err, "%s: forward: cannot allocate %d row segments or the KV decode "
		                  "buffers", m->path, max_chunk);
	}
	float *p = f->mem;
	float **slots[12] = { &f->x, &f->xn, &f->q, &f->k, &f->v, &f->att, &f->qg, &f->og,
		              &f->s, &f->gate, &f->up, &f->rope_cs };
	for (int i = 0; i < 12; i++) {
		*slots[i] = p;
		p += (sizes[i] + 15) & ~(size_t)15;
	}
	if (!m->exact) {
		int in = (int)(E > qd ? E : qd);
		in = in > hp->n_ff ? in : hp->n_ff;
		if (rt_matmul_scratch_init(&f->mm, n_att, max_chunk, in, err) < 0) {
			rt_fwd_free(f);
			return -1;
		}
		if (m->f32_act)
			f->mm.gemm_rows = 1;
	}
	f->m = m;
	f->max_chunk = max_chunk;
	f->cap = cap;
	return 0;
}

int rt_fwd_keep_queries(rt_fwd *f, rt_err *err)
{
	if (f->q_pre)
		return 0;
	const size_t n = (size_t)f->max_chunk * f->m->hp.n_head * f->m->hp.head_dim;
	f->q_pre = malloc(n * sizeof(float));
	if (!f->q_pre)
		return rt_err_set(err, "%s: forward: cannot allocate %zu bytes of query rows", f->m->path,
		                  n * sizeof(float));
	return 0;
}

void rt_fwd_free(rt_fwd *f)
{
	free(f->q_pre);
	free(f->win_keep);
	rt_matmul_scratch_free(&f->mm);
	free(f->segs);
	free(f->seg_len);
	free(f->kvf);
	free(f->mem);
	memset(f, 0, sizeof *f);
}

/* ---- forward ----------------------------------------------------------------------- */

void rt_rms_norm(float *y, const float *x, const float *w, int C, int n, float eps)
{
	for (int r = 0; r < C; r++) {
		const float *xr = x + (size_t)r * n;
		float *yr = y + (size_t)r * n;
		double ss = 0.0;
		for (int i = 0; i < n; i++)
			ss += (double)xr[i] * xr[i];
		float scale = (float)(1.0 / sqrt(ss / n + (double)eps));
		for (int i = 0; i < n; i++)
			yr[i] = xr[i] * scale * w[i];
	}
}

/* Y[C × out] = X[C × in] · W[out × in]^T (+ Y when beta is 1), one BLAS call per segment
 * of len[0..nseg) consecutive rows (C their sum): OpenBLAS's bits for a row depend on the
 * call's row count, so a batched chunk gives each sequence the bits it gets alone. */
static void matmul_wt(float *Y, const float *X, const float *W, const int *len, int nseg,
                      int out, int in, float beta)
{
	for (int s = 0; s < nseg; s++) {
		const int C = len[s];
		if (C == 1)
			cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, W, in, X, 1, beta, Y, 1);
		else
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, C, out, in, 1.0f, X, in, W,
			            in, beta, Y, out);
		X += (size_t)C * in;
		Y += (size_t)C * out;
	}
}

/* Y[C × out] += X[C × in] · W^T over the segments len[0..nseg): the packed matrix mw on
 * the model's pool (the fast path), or its f32 rows W[out × in] through BLAS (exact). */
static void matmul_add(const rt_model *m, rt_matmul_scratch *mm, float *Y, const float *X,
                       const rt_wmat *mw, const float *W, const int *len, int nseg, int out,
                       int in)
{
	if (!m->exact)
		rt_matmul(m->pool, mm, Y, X, mw, len, nseg, 1);
	else
		matmul_wt(Y, X, W, len, nseg, out, in, 1.0f);
}

/* ---- fast-path helpers: rows split over the pool ----------------------------------- */

enum { ROW_NORM, ROW_ROPE, ROW_SILU, ROW_GELU };

typedef struct row_job {
	int op, C;
	float *y;            /* NORM: output; ROPE: rotated in place; SILU: gate (in place) */
	const float *x;      /* NORM: input; SILU: up */
	const float *w;      /* NORM: weights; ROPE: the cos/sin table */
	int n;               /* NORM/SILU: values per row; ROPE: heads per row */
	int head_dim, n_rot;
	float eps;
} row_job;

static void row_job_fn(void *a, int ith, int nth)
{
	const row_job *j = a;
	long r0, r1;
	rt_pool_range(j->C, ith, nth, &r0, &r1);
	const int nr = (int)(r1 - r0);
	if (nr <= 0)
		return;
	if (j->op == ROW_NORM) {
		rt_rms_norm(j->y + (size_t)r0 * j->n, j->x + (size_t)r0 * j->n, j->w, nr, j->n, j->eps);
	} else if (j->op == ROW_ROPE) {
		const size_t stride = (size_t)j->n * j->head_dim;
		rt_rope_apply_f32(j->y + (size_t)r0 * stride, nr, stride, 0, j->n, j->head_dim, j->n_rot,
		                  j->w + (size_t)r0 * j->n_rot);
	} else if (j->op == ROW_SILU) {
		for (size_t i = (size_t)r0 * j->n; i < (size_t)r1 * j->n; i++) {
			float g = j->y[i];
			j->y[i] = g / (1.0f + expf(-g)) * j->x[i];
		}
	} else {
		/* GELU, tanh form (ggml_gelu): 0.5·g·(1 + tanh(sqrt(2/pi)·(g + 0.044715·g^3))) */
		for (size_t i = (size_t)r0 * j->n; i < (size_t)r1 * j->n; i++) {
			float g = j->y[i];
			j->y[i] = 0.5f * g * (1.0f + tanhf(0.79788456080286535588f * g * (1.0f + 0.044715f * g * g))) *
			          j->x[i];
		}
	}
}

/* run a row job on the model's pool (the exact path and single rows run inline) */
static void rows_run(const rt_model *m, row_job *j)
{
	if (m->exact || j->C < 2 || !m->pool)
		row_job_fn(j, 0, 1);
	else
		rt_pool_run(m->pool, row_job_fn, j);
}

static void norm_rows(const rt_model *m, float *y, const float *x, const float *w, int C, int n,
                      float eps)
{
	row_job j = { .op = ROW_NORM, .C = C, .y = y, .x = x, .w = w, .n = n, .eps = eps };
	rows_run(m, &j);
}

static void rope_rows(const rt_model *m, float *x, int C, int n_heads, int head_dim, int n_rot,
                      const float *cs)
{
	row_job j = { .op = ROW_ROPE, .C = C, .y = x, .w = cs, .n = n_heads, .head_dim = head_dim,
		      .n_rot = n_rot };
	rows_run(m, &j);
}

/* ---- softmax ------------------------------------------------------------------------ */
/* The attention softmax runs over up to context-length entries for every query head and
 * chunk row, so it is written with GCC vector extensions (16 floats) and compiled in
 * AVX-512 / AVX2 / baseline clones picked at load time (target_clones). exp is the
 * Cephes expf polynomial (max error about 2 ulp); arguments are clamped at -80, where
 * exp is 1.8e-35 of the row maximum's weight. Sums are accumulated in double. */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));

#define V16 16
/* unaligned 16-float load/store, and lane-wise m ? a : b for a comparison mask m
 * (macros, so no vector is passed by value across a call and no ABI question arises) */
#define V16_LOAD(v, p) memcpy(&(v), (p), sizeof(v16f))
#define V16_STORE(p, v) memcpy((p), &(v), sizeof(v16f))
#define V16_SEL(m, a, b) ((v16f)(((m) & (v16i)(a)) | (~(m) & (v16i)(b))))

/* *x = exp(*x), lane-wise */
static inline __attribute__((always_inline)) void v16_exp(v16f *px)
{
	const v16f zero = { 0 };
	const v16f lo = zero - 80.0f, magic = zero + 12582912.0f; /* 1.5·2^23 */
	v16f x = *px;
	x = V16_SEL(x < lo, lo, x);
	v16f t = x * 1.44269504088896341f + magic;   /* round(x·log2 e) in the low bits */
	v16i n = (v16i)t - (v16i)magic;
	v16f fn = t - magic;
	v16f r = x - fn * 0.693359375f;
	r = r - fn * -2.12194440e-4f;
	v16f y = zero + 1.9875691500e-4f;
	y = y * r + 1.3981999507e-3f;
	y = y * r + 8.3334519073e-3f;
	y = y * r + 4.1665795894e-2f;
	y = y * r + 1.6666665459e-1f;
	y = y * r + 5.0000001201e-1f;
	y = y * (r * r) + r + 1.0f;
	*px = (v16f)((v16i)y + (n << 23));
}

static inline __attribute__((always_inline)) float s_exp(float x)
{
	v16f v = { x };
	v16_exp(&v);
	return v[0];
}

__attribute__((target_clones("avx512f", "avx2", "default")))
void rt_attn_softmax(float *P, size_t ld, int G, int lim, const float *log_count)
{
	const int lv = lim - lim % V16;
	for (int g = 0; g < G; g++) {
		float *row = P + (size_t)g * ld;
		v16f vmx = { 0 };
		vmx -= INFINITY;
		int i = 0;
		for (; i < lv; i += V16) {
			v16f x, lc;
			V16_LOAD(x, row + i);
			V16_LOAD(lc, log_count + i);
			x += lc;
			V16_STORE(row + i, x);
			vmx = V16_SEL(x > vmx, x, vmx);
		}
		float mx = -INFINITY;
		for (int k = 0; k < V16; k++)
			mx = vmx[k] > mx ? vmx[k] : mx;
		for (; i < lim; i++) {
			row[i] += log_count[i];
			mx = row[i] > mx ? row[i] : mx;
		}
		v8d acc = { 0 };
		for (i = 0; i < lv; i += V16) {
			v16f e;
			V16_LOAD(e, row + i);
			e -= mx;
			v16_exp(&e);
			V16_STORE(row + i, e);
			v8f a, b;
			memcpy(&a, row + i, sizeof a);
			memcpy(&b, row + i + 8, sizeof b);
			acc += __builtin_convertvector(a, v8d) + __builtin_convertvector(b, v8d);
		}
		double sum = 0.0;
		for (int k = 0; k < 8; k++)
			sum += acc[k];
		for (; i < lim; i++) {
			row[i] = s_exp(row[i] - mx);
			sum += row[i];
		}
		const float inv = (float)(1.0 / sum);
		for (i = 0; i < lv; i += V16) {
			v16f x;
			V16_LOAD(x, row + i);
			x *= inv;
			V16_STORE(row + i, x);
		}
		for (; i < lim; i++)
			row[i] *= inv;
		memset(row + lim, 0, (ld - (size_t)lim) * sizeof(float));
	}
}

/* Hand row r's probabilities P [G × ncol] (row g at P + g·ncol, the first lim entries
 * valid) to the observe hook, packed to [G × lim] in place (each move goes left). */
static void observe_row(rt_fwd *f, rt_kv_head *h, int layer, int j, int r, int32_t pos0,
                        int lim, int ncol, float *P, const float *o)
{
	const rt_model_hparams *hp = &f->m->hp;
	const int G = hp->group;
	for (int g = 1; g < G && lim < ncol; g++)
		memmove(P + (size_t)g * lim, P + (size_t)g * ncol, (size_t)lim * sizeof(float));
	rt_attn_view v = {
		.layer = layer, .kv_head = j, .row = r, .pos = pos0 + r,
		.n_entries = lim, .group = G, .head_dim = hp->head_dim,
		.probs = P, .probs_ld = (size_t)lim,
		.out = o, .head = h,
		.query = f->q_pre ? f->q_pre + (size_t)r * hp->n_head * hp->head_dim +
		                        (size_t)j * G * hp->head_dim : NULL,
	};
	f->observe(f->observe_user, &v);
}

/* Does a query at position pos see an entry at position p on a layer with window w (0:
 * all)? Not when pos - p >= w, as llama.cpp's LLAMA_SWA_TYPE_STANDARD (src/llama-hparams.h
 * is_masked_swa). */
static inline int window_masked(int32_t pos, int32_t p, int32_t w)
{
	return w && (int64_t)pos - p >= w;
}

/* The entries of head h that a query at position pos cannot see (window_masked), among
 * 0..lim-1: lo when they are exactly the first lo (always so in position order: appends,
 * rt_kv_head_keep), -1 when they are not (rt_kv_head_evict fills evicted slots from the
 * list's tail, so a list a policy compressed is out of position order), and the caller
 * masks entry by entry. */
static int window_first(const rt_kv_head *h, int lim, int32_t pos, int32_t w)
{
	if (!w)
		return 0;
	int lo = 0;
	while (lo < lim && window_masked(pos, h->pos[lo], w))
		lo++;
	for (int t = lo; t < lim; t++)
		if (window_masked(pos, h->pos[t], w))
			return -1;
	return lo;
}

/* rt_attn_softmax over the entries [lo, lim) of each of the G rows of S (ld apart), with
 * probability 0 for the masked entries before lo and from lim on; lo < 0: over the entries
 * of [0, lim) a query at pos sees on a window-w layer (window_masked of epos[t]), each
 * masked one given probability exactly 0. */
static void softmax_window(float *S, size_t ld, int G, int lo, int lim, const float *log_count,
                           const int32_t *epos, int32_t pos, int32_t w)
{
	if (lo < 0) {
		/* the query's own entry is never masked, so the row's maximum is finite */
		for (int g = 0; g < G; g++)
			for (int t = 0; t < lim; t++)
				if (window_masked(pos, epos[t], w))
					S[(size_t)g * ld + (size_t)t] = -INFINITY;
		rt_attn_softmax(S, ld, G, lim, log_count);
		for (int g = 0; g < G; g++)
			for (int t = 0; t < lim; t++)
				if (window_masked(pos, epos[t], w))
					S[(size_t)g * ld + (size_t)t] = 0.0f;
		return;
	}
	if (lo == 0) {
		rt_attn_softmax(S, ld, G, lim, log_count);
		return;
	}
	for (int g = 0; g < G; g++) {
		float *row = S + (size_t)g * ld;
		rt_attn_softmax(row + lo, ld - (size_t)lo, 1, lim - lo, log_count + lo);
		memset(row, 0, (size_t)lo * sizeof(float));
	}
}

/* Attention of the C chunk rows over a head whose rows are stored in a narrow type or in
 * tiers, read in place (rt_kvattn): per row, scores against the stored keys, softmax, the
 * weighted sum of the stored values. Same contract as attend_head. */
static void attend_head_rows(rt_fwd *f, rt_kv *kv, rt_kv_head *h, int layer, int j, int C,
                             int32_t pos0, const float *qg, float *att, float *og_all, float *S)
{
	const rt_model_hparams *hp = &f->m->hp;
	const int G = hp->group, hd = hp->head_dim, qd = hp->n_head * hd;
	const float scale = hp->attn_scale;
	const int32_t w = f->m->layers[layer].window;
	const int isa = rt_dot_isa_best();
	const rt_kvattn_kernels *ka = kv->tiered ? NULL : rt_kvattn_get(kv->type, isa);
	RT_ASSERT(ka != NULL || kv->tiered);
	const int nb = h->n - C;
	for (int r = 0; r < C; r++) {
		const int lim = nb + r + 1;
		float *og = og_all + (size_t)r * G * hd;
		const float *qr = qg + (size_t)r * G * hd;
		if (ka)
			ka->scores(h->kr, lim, hd, qr, (size_t)hd, G, scale, S, (size_t)lim);
		else
			rt_kvattn_tier_scores(kv, h, lim, qr, (size_t)hd, G, scale, S, (size_t)lim, isa);
		softmax_window(S, (size_t)lim, G, window_first(h, lim, pos0 + r, w), lim, h->log_count,
		               h->pos, pos0 + r, w);
		if (ka)
			ka->mix(h->vr, lim, hd, S, (size_t)lim, G, og, (size_t)hd);
		else
			rt_kvattn_tier_mix(kv, h, lim, S, (size_t)lim, G, og, (size_t)hd, isa);
		memcpy(att + (size_t)r * qd + (size_t)j * G * hd, og, (size_t)G * hd * sizeof(float));
		if (f->observe)
			observe_row(f, h, layer, j, r, pos0, lim, lim, S, og);
	}
}

/* Attention of the C chunk rows for KV head j of one layer. The chunk's keys and values
 * were appended already, so the head holds nb = n - C earlier entries followed by the
 * chunk's C entries; row r attends to the prefix of nb + r + 1 entries. Rows are taken in
 * blocks [r0, r1) that only score the nb + r1 entries they can see. qg, og, S: this
 * call's slices of the forward's attention scratch; kvf: its slice of the f32 decode
 * buffers (NULL when the forward has none). A store of a narrow type is decoded to kvf
 * for chunks of ATT_DECODE_ROWS rows or more, else read in place (attend_head_rows); so
 * is a tiered f16 store (its rows in the tier arenas), while an f32 one (the exact path)
 * is always decoded to kvf (rt_kv_head_decode_all). */
static void attend_head(rt_fwd *f, rt_kv *kv, int layer, int j, int C, int32_t pos0,
                        const float *q, float *att, float *qg, float *og_all, float *S,
                        float *kvf)
{
	const rt_model_hparams *hp = &f->m->hp;
	const int G = hp->group, hd = hp->head_dim, qd = hp->n_head * hd;
	const float scale = hp->attn_scale;
	const int32_t w = f->m->layers[layer].window;
	rt_kv_head *h = rt_kv_head_at(kv, layer, j);
	const int n = h->n, nb = n - C;
	RT_ASSERT(nb >= 0 && n <= f->cap);
	for (int r = 0; r < C; r++)
		memcpy(qg + (size_t)r * G * hd, q + (size_t)r * qd + (size_t)j * G * hd,
		       (size_t)G * hd * sizeof(float));
	const float *K = h->k, *V = h->v;
	if (kv->tiered && kv->type == RT_KV_F16 && C < ATT_DECODE_ROWS) {
		attend_head_rows(f, kv, h, layer, j, C, pos0, qg, att, og_all, S);
		return;
	}
	if (kv->tiered) {
		/* every tier decoded to f32 once per chunk (fwd_tier_scratch sized kvf) */
		const rt_kvattn_kernels *ka = kv->type == RT_KV_F32 ? NULL :
		                              rt_kvattn_get(kv->type, rt_dot_isa_best());
		rt_kv_head_decode_all(kv, h, kvf, kvf + (size_t)n * hd, ka ? ka->decode : NULL);
		K = kvf;
		V = kvf + (size_t)n * hd;
	} else if (kv->type != RT_KV_F32) {
		if (C < ATT_DECODE_ROWS || !kvf || (size_t)2 * n * hd > f->kvf_stride) {
			attend_head_rows(f, kv, h, layer, j, C, pos0, qg, att, og_all, S);
			return;
		}
		const rt_kvattn_kernels *ka = rt_kvattn_get(kv->type, rt_dot_isa_best());
		ka->decode(h->kr, n, hd, kvf);
		ka->decode(h->vr, n, hd, kvf + (size_t)n * hd);
		K = kvf;
		V = kvf + (size_t)n * hd;
	}
	int rb = (int)(ATT_BLOCK_FLOATS / ((size_t)G * n));
	rb = rb < 1 ? 1 : rb > C ? C : rb;
	RT_ASSERT((size_t)rb * G * n <= score_floats(G, f->cap));
	for (int r0 = 0; r0 < C; r0 += rb) {
		const int r1 = r0 + rb < C ? r0 + rb : C, nr = r1 - r0, ncol = nb + r1;
		float *og = og_all + (size_t)r0 * G * hd;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr * G, ncol, hd, scale,
		            qg + (size_t)r0 * G * hd, hd, K, hd, 0.0f, S, ncol);
		for (int r = r0; r < r1; r++)
			softmax_window(S + (size_t)(r - r0) * G * ncol, (size_t)ncol, G,
			               window_first(h, nb + r + 1, pos0 + r, w), nb + r + 1, h->log_count,
			               h->pos, pos0 + r, w);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr * G, hd, ncol, 1.0f, S,
		            ncol, V, hd, 0.0f, og, hd);
		for (int r = r0; r < r1; r++) {
			memcpy(att + (size_t)r * qd + (size_t)j * G * hd, og_all + (size_t)r * G * hd,
			       (size_t)G * hd * sizeof(float));
			/* S is no longer needed after the P·V product */
			if (f->observe)
				observe_row(f, h, layer, j, r, pos0, nb + r + 1, ncol,
				            S + (size_t)(r - r0) * G * ncol, og_all + (size_t)r * G * hd);
		}
	}
}

typedef struct att_job {
	rt_fwd *f;
	rt_kv *kv;
	int layer, C;
	int32_t pos0;
	const float *q;
	float *att;
} att_job;

/* the KV heads of a layer dealt out round-robin to the first n_att threads, each with
 * its own slice of the scratch (a head's result does not depend on which thread ran it) */
static void att_job_fn(void *a, int ith, int nth)
{
	att_job *j = a;
	rt_fwd *f = j->f;
	const int nt = nth < f->n_att ? nth : f->n_att;
	if (ith >= nt)
		return;
	for (int h = ith; h < f->m->hp.n_head_kv; h += nt)
		attend_head(f, j->kv, j->layer, h, j->C, j->pos0, j->q, j->att,
		            f->qg + (size_t)ith * f->qg_stride, f->og + (size_t)ith * f->qg_stride,
		            f->s + (size_t)ith * f->s_stride,
		            f->kvf ? f->kvf + (size_t)ith * f->kvf_stride : NULL);
}

/* One pool job for the attention of a batch of K sequences at one layer: the K × n_head_kv
 * (sequence, KV head) pairs taken from a shared counter by the first nt threads (nt: at
 * most every sequence's n_att), each thread with its own slice of that sequence's scratch.
 * A decode step of K sequences then costs one job per layer instead of K, and the pairs
 * spread evenly over the threads (a sequence alone deals its 3 KV heads 2:1 over 2
 * threads); a head's result does not depend on which thread ran it or when. */
typedef struct att_batch_job {
	rt_fwd *const *fs;
	rt_kv *const *kvs;
	const fwd_seg *sg;
	int K, layer, nt;
	const float *q;
	float *att;
	atomic_int next;
} att_batch_job;

static void att_batch_fn(void *a, int ith, int nth)
{
	att_batch_job *j = a;
	(void)nth;
	if (ith >= j->nt)
		return;
	const rt_model_hparams *hp = &j->fs[0]->m->hp;
	const int H = hp->n_head_kv, qd = hp->n_head * hp->head_dim;
	for (;;) {
		const int i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		if (i >= j->K * H)
			break;
		const int s = i / H, h = i % H;
		rt_fwd *f = j->fs[s];
		const size_t o = (size_t)j->sg[s].off * qd;
		attend_head(f, j->kvs[s], j->layer, h, j->sg[s].C, j->sg[s].pos0, j->q + o, j->att + o,
		            f->qg + (size_t)ith * f->qg_stride, f->og + (size_t)ith * f->qg_stride,
		            f->s + (size_t)ith * f->s_stride,
		            f->kvf ? f->kvf + (size_t)ith * f->kvf_stride : NULL);
	}
}

/* The threads a batch's attention job may use: 0 when some sequence must attend head
 * by head on the calling thread (the exact path, one attention slice, an observe hook
 * not declared parallel-safe), else the fewest attention slices of any of them. */
static int att_batch_threads(rt_fwd *const *fs, int K)
{
	int nt = fs[0]->m->exact ? 0 : rt_pool_threads(fs[0]->m->pool);
	for (int s = 0; s < K && nt > 1; s++) {
		const rt_fwd *f = fs[s];
		if (f->n_att < 2 || (f->observe && !f->observe_parallel))
			return 0;
		nt = f->n_att < nt ? f->n_att : nt;
	}
	return nt > 1 ? nt : 0;
}

/* Attention of the C chunk rows for every KV head of one layer: in parallel over the KV
 * heads on the fast path (unless an observe hook that is not declared parallel-safe is
 * set), else head by head in order. */
static void attend_layer(rt_fwd *f, rt_kv *kv, int layer, int C, int32_t pos0, const float *q,
                         float *att)
{
	if (!f->m->exact && f->n_att > 1 && (!f->observe || f->observe_parallel)) {
		att_job j = { f, kv, layer, C, pos0, q, att };
		rt_pool_run(f->m->pool, att_job_fn, &j);
		return;
	}
	for (int j = 0; j < f->m->hp.n_head_kv; j++)
		attend_head(f, kv, layer, j, C, pos0, q, att, f->qg, f->og, f->s, f->kvf);
}

void rt_model_embed(const rt_model *m, int32_t t, float *xr)
{
	const int E = m->hp.n_embd;
	if (m->tok_embd)
		memcpy(xr, m->tok_embd + (size_t)t * E, (size_t)E * sizeof(float));
	else
		rt_dequant(m->embd.type, (const uint8_t *)m->embd.data + (size_t)t * m->embd.row_bytes,
		           xr, E);
	if (m->hp.embd_scale != 1.0f)
		for (int i = 0; i < E; i++)
			xr[i] *= m->hp.embd_scale;
}

/* The token embeddings of every segment's rows into big->x (rows stacked by segment). */
static void chunk_embed(rt_fwd *big, int K, const fwd_seg *sg)
{
	const rt_model *m = big->m;
	const int E = m->hp.n_embd;
	for (int k = 0; k < K; k++)
		for (int r = 0; r < sg[k].C; r++)
			rt_model_embed(m, sg[k].tok[r], big->x + ((size_t)sg[k].off + r) * E);
}

/* Number of RoPE tables the model's layers use: 2 when sliding-window layers have their
 * own base (table 1), else 1. */
static int rope_tables(const rt_model_hparams *hp)
{
	return hp->n_swa > 0 ? 2 : 1;
}

/* The layer whose frequencies RoPE table t holds (every layer of a slot has the same). */
static const rt_layer *rope_table_layer(const rt_model *m, int t)
{
	for (int l = 0; l < m->hp.n_layer; l++)
		if (m->layers[l].rope_slot == t)
			return &m->layers[l];
	return &m->layers[0];
}

/* Fill RoPE table t (tab, C rows from position pos0). */
static void rope_table_fill(const rt_model *m, int t, float *tab, int C, int32_t pos0)
{
	const rt_layer *L = rope_table_layer(m, t);
	rt_rope_table_f32_freq(tab, C, pos0, m->hp.n_rot, L->rope_freq, L->rope_mscale);
}

/* RoPE table t of f (max_chunk × n_rot floats each). */
static float *rope_table(rt_fwd *f, int t)
{
	return f->rope_cs + (size_t)t * f->max_chunk * f->m->hp.n_rot;
}

/* The RoPE tables of the chunk: one set in big when the segments are in lockstep (shared),
 * and one in each other sequence's context that rotates by its own positions (not
 * shared) or by cache index (rope_at_index: rebuilt per head in seg_rope). */
static void chunk_rope_tables(rt_fwd *big, rt_fwd *const *fs, int K, const fwd_seg *sg,
                              int shared)
{
	const rt_model_hparams *hp = &big->m->hp;
	for (int t = 0; t < rope_tables(hp); t++) {
		if (shared) {
			rope_table_fill(big->m, t, rope_table(big, t), sg[0].C, sg[0].pos0);
			big->rope_at[t] = sg[0].pos0;
		}
		for (int k = 0; k < K; k++)
			if (fs[k] != big && (fs[k]->rope_at_index || !shared)) {
				rope_table_fill(big->m, t, rope_table(fs[k], t), sg[k].C, sg[k].pos0);
				fs[k]->rope_at[t] = sg[k].pos0;
			}
	}
}

/* Per-head RMSNorm of rows x[rows × n_heads·head_dim] in place with weights w[head_dim]. */
static void norm_heads(const rt_model *m, float *x, const float *w, int rows, int n_heads)
{
	norm_rows(m, x, x, w, rows * n_heads, m->hp.head_dim, m->hp.norm_eps);
}

/* y[r] += b for each of the rows of y[rows × n]. */
static void add_bias(float *y, const float *b, int rows, int n)
{
	for (int r = 0; r < rows; r++)
		for (int i = 0; i < n; i++)
			y[(size_t)r * n + i] += b[i];
}

/* Layer l's attention norm of big->x and the Q, K, V projections of all the rows (K
 * segments of big->seg_len rows). */
static void layer_qkv(rt_fwd *big, const rt_layer *L, int K, int rows)
{
	const int *len = big->seg_len;
	const rt_model *m = big->m;
	const rt_model_hparams *hp = &m->hp;
	const int E = hp->n_embd, qd = hp->n_head * hp->head_dim, kd = hp->n_head_kv * hp->head_dim;
	norm_rows(m, big->xn, big->x, L->attn_norm, rows, E, hp->norm_eps);
	if (m->exact) {
		matmul_wt(big->q, big->xn, L->wq, len, K, qd, E, 0.0f);
		matmul_wt(big->k, big->xn, L->wk, len, K, kd, E, 0.0f);
		matmul_wt(big->v, big->xn, L->wv, len, K, kd, E, 0.0f);
	} else {
		float *const Y[3] = { big->q, big->k, big->v };
		const rt_wmat *const W[3] = { &L->mq, &L->mk, &L->mv };
		rt_matmul_multi(m->pool, &big->mm, 3, Y, big->xn, W, len, K);
	}
	if (L->bq) {
		add_bias(big->q, L->bq, rows, qd);
		add_bias(big->k, L->bk, rows, kd);
		add_bias(big->v, L->bv, rows, kd);
	}
	if (L->q_norm) {
		norm_heads(m, big->q, L->q_norm, rows, hp->n_head);
		norm_heads(m, big->k, L->k_norm, rows, hp->n_head_kv);
	}
}

/* RoPE on one segment's C query rows q and key rows kk of layer l: by position from the
 * chunk's table t (cs, the layer's base), or, under rope_at_index, by each KV head's cache
 * index, so table t in f is rebuilt when a head's first new index differs from the last
 * one built. */
static void seg_rope(rt_fwd *f, rt_kv *kv, int l, int C, float *q, float *kk, const float *cs)
{
	const rt_model *m = f->m;
	const rt_model_hparams *hp = &m->hp;
	const int hd = hp->head_dim, qd = hp->n_head * hd, kd = hp->n_head_kv * hd;
	if (!f->rope_at_index) {
		rope_rows(m, q, C, hp->n_head, hd, hp->n_rot, cs);
		rope_rows(m, kk, C, hp->n_head_kv, hd, hp->n_rot, cs);
		return;
	}
	/* table t of f holds the rows from f->rope_at[t] on */
	const int t = m->layers[l].rope_slot;
	float *tab = rope_table(f, t);
	for (int j = 0; j < hp->n_head_kv; j++) {
		int32_t at = rt_kv_head_at(kv, l, j)->n; /* index of row 0's key */
		if (at != f->rope_at[t]) {
			rope_table_fill(m, t, tab, C, at);
			f->rope_at[t] = at;
		}
		rt_rope_apply_f32(q, C, (size_t)qd, j * hp->group, hp->group, hd, hp->n_rot, tab);
		rt_rope_apply_f32(kk, C, (size_t)kd, j, 1, hd, hp->n_rot, tab);
	}
}

/* One segment's C keys kk and values vv of layer l appended to every KV head of its
 * store (positions pos0..pos0 + C - 1), then the on_append hook told of each head's new
 * entries and given xn, the segment's normalised layer input rows. */
static void seg_append(rt_fwd *f, rt_kv *kv, int l, int C, int32_t pos0, const float *kk,
                       const float *vv, const float *xn)
{
	const rt_model_hparams *hp = &f->m->hp;
	const int hd = hp->head_dim, kd = hp->n_head_kv * hd;
	for (int j = 0; j < hp->n_head_kv; j++) {
		rt_kv_head *h = rt_kv_head_at(kv, l, j);
		for (int r = 0; r < C; r++)
			rt_kv_append(kv, h, kk + (size_t)r * kd + (size_t)j * hd,
			             vv + (size_t)r * kd + (size_t)j * hd, pos0 + r);
	}
	for (int j = 0; f->on_append && j < hp->n_head_kv; j++)
		f->on_append(f->append_user, l, j, rt_kv_head_at(kv, l, j)->n - C, C, xn);
}

/* Layer l's attention for every segment, each with its own forward context and cache:
 * the queries before RoPE kept (q_pre, when the forward keeps them), RoPE, the append of
 * its keys and values, attention into its rows of big->att (for a batch of several, one
 * pool job over every sequence's heads: att_batch_job). */
static void layer_attention(rt_fwd *big, rt_fwd *const *fs, rt_kv *const *kvs, int K,
                            const fwd_seg *sg, int shared, int l)
{
	const rt_model_hparams *hp = &big->m->hp;
	const int qd = hp->n_head * hp->head_dim, kd = hp->n_head_kv * hp->head_dim;
	/* a batch: every sequence's keys and values first, then one job for all their heads */
	const int nt = K > 1 ? att_batch_threads(fs, K) : 0;
	for (int s = 0; s < K; s++) {
		rt_fwd *f = fs[s];
		const int C = sg[s].C, o = sg[s].off;
		float *q = big->q + (size_t)o * qd, *kk = big->k + (size_t)o * kd;
		float *vv = big->v + (size_t)o * kd, *att = big->att + (size_t)o * qd;
		if (f->q_pre)
			memcpy(f->q_pre, q, (size_t)C * qd * sizeof(float));
		const int t = big->m->layers[l].rope_slot;
		seg_rope(f, kvs[s], l, C, q, kk, rope_table(shared ? big : f, t));
		seg_append(f, kvs[s], l, C, sg[s].pos0, kk, vv, big->xn + (size_t)o * hp->n_embd);
		if (!nt)
			attend_layer(f, kvs[s], l, C, sg[s].pos0, q, att);
	}
	if (nt) {
		att_batch_job j = { .fs = fs, .kvs = kvs, .sg = sg, .K = K, .layer = l, .nt = nt,
		                    .q = big->q, .att = big->att };
		atomic_init(&j.next, 0);
		rt_pool_run(big->m->pool, att_batch_fn, &j);
	}
}

/* x += X·W^T over the segments, or, with a post-norm weight pn (gemma3), x += RMSNorm(X·W^T)·pn
 * with the product in tmp[rows × out]. */
static void matmul_residual(const rt_model *m, rt_fwd *big, float *tmp, const float *X,
                            const rt_wmat *mw, const float *W, const float *pn, int rows, int K,
                            int out, int in)
{
	const int *len = big->seg_len;
	if (!pn) {
		matmul_add(m, &big->mm, big->x, X, mw, W, len, K, out, in);
		return;
	}
	if (m->exact)
		matmul_wt(tmp, X, W, len, K, out, in, 0.0f);
	else
		rt_matmul(m->pool, &big->mm, tmp, X, mw, len, K, 0);
	norm_rows(m, tmp, tmp, pn, rows, out, m->hp.norm_eps);
	for (size_t i = 0; i < (size_t)rows * out; i++)
		big->x[i] += tmp[i];
}

/* Layer l after attention, over all the rows: the output projection into the residual
 * (through the post-attention norm where the layer has one), the FFN norm, the gated
 * feed-forward (SiLU or GELU) into the residual (through the post-FFN norm), then each
 * segment's on_layer hook. */
static void layer_ffn(rt_fwd *big, rt_fwd *const *fs, int K, const fwd_seg *sg,
                      const rt_layer *L, int l, int rows)
{
	const rt_model *m = big->m;
	const rt_model_hparams *hp = &m->hp;
	const int E = hp->n_embd, F = hp->n_ff, qd = hp->n_head * hp->head_dim;
	const int *len = big->seg_len;
	/* x += att · Wo^T (straight into the residual unless post-normed; xn is free here) */
	matmul_residual(m, big, big->xn, big->att, &L->mo, L->wo, L->attn_post_norm, rows, K, E, qd);
	norm_rows(m, big->xn, big->x, L->ffn_norm, rows, E, hp->norm_eps);
	if (m->exact) {
		matmul_wt(big->gate, big->xn, L->w_gate, len, K, F, E, 0.0f);
		matmul_wt(big->up, big->xn, L->w_up, len, K, F, E, 0.0f);
	} else {
		float *const Y[2] = { big->gate, big->up };
		const rt_wmat *const W[2] = { &L->mgate, &L->mup };
		rt_matmul_multi(m->pool, &big->mm, 2, Y, big->xn, W, len, K);
	}
	row_job sj = { .op = rt_arch_get(hp->arch)->gelu ? ROW_GELU : ROW_SILU, .C = rows,
		       .y = big->gate, .x = big->up, .n = F };
	rows_run(m, &sj);
	/* xn (the FFN's input) is free once gate and up are computed */
	matmul_residual(m, big, big->xn, big->gate, &L->mdown, L->w_down, L->ffn_post_norm, rows, K,
	                E, F);
	for (int s = 0; s < K; s++)
		if (fs[s]->on_layer)
			fs[s]->on_layer(fs[s]->layer_user, l, sg[s].C, sg[s].pos0,
			                big->x + (size_t)sg[s].off * E, big->q + (size_t)sg[s].off * qd);
}

/* The output GEMM of c normed rows xs into lg. On the fast path the rows take the way of
 * the chunk they came from: a chunk of gemm_rows rows or more ran its layers the GEMM way
 * (f32 activations), so its last row's logits do too (rt_matmul_gemm), though it is one
 * row; else the dot way with 8-bit activations, as decoding does. So when a prompt's
 * last chunk has gemm_rows rows or more, its last logits (RT_LOGITS_LAST: `run`'s first
 * token) have the exact path's bits (f32 KV), not a decode step's (docs/exactness.md); a
 * shorter last chunk (a needle question fed after its context, a prompt's tail) keeps the
 * 8-bit way its layers took. */
static void logits_rows(rt_fwd *big, float *lg, const float *xs, const int *len, int nseg,
                        int gemm_way)
{
	const rt_model *m = big->m;
	const int V = m->hp.n_vocab, E = m->hp.n_embd;
	if (m->exact) {
		matmul_wt(lg, xs, m->output, len, nseg, V, E, 0.0f);
		return;
	}
	if (gemm_way)
		rt_matmul_gemm(m->pool, &big->mm, lg, xs, &m->out, len, nseg);
	else
		rt_matmul(m->pool, &big->mm, lg, xs, &m->out, len, nseg, 0);
}

/* The logits of the rows each segment asked for (from lrow_from on, into its lg; none
 * when lg is NULL): the output norm, then one output GEMM when the rows land in
 * consecutive rows of one buffer and their chunks took one way (logits_rows), else one per
 * segment. */
static void chunk_logits(rt_fwd *big, int K, const fwd_seg *sg)
{
	const rt_model *m = big->m;
	const rt_model_hparams *hp = &m->hp;
	const int E = hp->n_embd;
	/* the requested rows of every segment, normed into consecutive rows of xn, one
	 * matmul segment each */
	int nr = 0, ns = 0, contig = 1, ways = 0; /* ways: bit 1 dot, bit 2 GEMM */
	float *lg0 = NULL;
	for (int s = 0; s < K; s++) {
		if (!sg[s].lg)
			continue;
		const int c = sg[s].C - sg[s].lrow_from;
		norm_rows(m, big->xn + (size_t)nr * E, big->x + ((size_t)sg[s].off + sg[s].lrow_from) * E,
		          m->out_norm, c, E, hp->norm_eps);
		if (!lg0)
			lg0 = sg[s].lg;
		else if (sg[s].lg != lg0 + (size_t)nr * hp->n_vocab)
			contig = 0;
		ways |= sg[s].C >= big->mm.gemm_rows ? 2 : 1;
		big->seg_len[ns++] = c;
		nr += c;
	}
	if (!nr)
		return;
	if (contig && ways != 3) {
		/* the requested rows are consecutive rows of the output */
		logits_rows(big, lg0, big->xn, big->seg_len, ns, ways == 2);
		return;
	}
	for (int s = 0, r = 0; s < K; s++) {
		if (!sg[s].lg)
			continue;
		const int c = sg[s].C - sg[s].lrow_from;
		logits_rows(big, sg[s].lg, big->xn + (size_t)r * E, &c, 1, sg[s].C >= big->mm.gemm_rows);
		r += c;
	}
}

/* One chunk for K sequences (K = 1, big = fs[0]: the plain forward). big's scratch holds
 * the stacked rows of every segment; the weight GEMMs run once over all of them,
 * everything that depends on a sequence's cache or position runs per sequence with its
 * own forward context. shared: every segment has the same tokens, C and pos0 (lockstep),
 * so one RoPE table serves all; otherwise each sequence's table is built in its own
 * forward context. */
static void forward_chunk(rt_fwd *big, rt_fwd *const *fs, rt_kv *const *kvs, int K,
                          const fwd_seg *sg, int shared)
{
	const rt_model *m = big->m;
	const int rows = sg[K - 1].off + sg[K - 1].C;
	chunk_embed(big, K, sg);
	chunk_rope_tables(big, fs, K, sg, shared);
	for (int k = 0; k < K; k++)
		big->seg_len[k] = sg[k].C;
	for (int l = 0; l < m->hp.n_layer; l++) {
		const rt_layer *L = &m->layers[l];
		layer_qkv(big, L, K, rows);
		layer_attention(big, fs, kvs, K, sg, shared, l);
		layer_ffn(big, fs, K, sg, L, l, rows);
	}
	chunk_logits(big, K, sg);
}

/* The checks rt_model_forward documents, for one sequence. */
static int forward_check(const rt_fwd *f, rt_kv *kv, const int32_t *tokens, int n,
                         int32_t pos0, rt_err *err)
{
	const rt_model *m = f->m;
	const rt_model_hparams *hp = &m->hp;
	if ((int64_t)pos0 + n > hp->n_ctx)
		return rt_err_setc(err, RT_ERR_INPUT,
		                   "%s: context of %lld tokens exceeds the model's context_length %d",
		                  m->path, (long long)pos0 + n, (int)hp->n_ctx);
	if (kv->n_layer != hp->n_layer || kv->n_kv_head != hp->n_head_kv ||
	    kv->head_dim != hp->head_dim || kv->group != hp->group)
		return rt_err_set(err,
		                  "%s: forward: KV store shape (%d layers, %d kv heads, head_dim %d) "
		                  "does not match the model",
		                  m->path, kv->n_layer, kv->n_kv_head, kv->head_dim);
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
			return rt_err_setc(err, RT_ERR_INPUT,
			                   "%s: token %d at index %d is outside the vocabulary (0..%d)",
			                   m->path, (int)tokens[i], i, hp->n_vocab - 1);
	int32_t room = kv->cap < f->cap ? kv->cap : f->cap;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		if ((int64_t)kv->heads[i].n + n > room)
			return rt_err_setc(err, RT_ERR_RESOURCE,
			                  "%s: KV cache full: layer %d kv head %d holds %d entries, "
			                  "%d more exceed the capacity %d",
			                  m->path, i / kv->n_kv_head, i % kv->n_kv_head,
			                  (int)kv->heads[i].n, n, (int)room);
	rt_err e = { "" };
	if (rt_kv_reserve(kv, n, &e) != 0) /* blocks for the n new entries of every list */
		return rt_err_setc(err, e.code, "%s: %s", m->path, e.msg);
	return 0;
}

/* A tiered store is read through f32 decode buffers for every chunk (attend_head): give
 * a forward that has none (f32 or small-chunk scratch) its n_att slices of 2 × cap ×
 * head_dim floats, once. 0, or -1 with err (allocation failure, before any work). */
static int fwd_tier_scratch(rt_fwd *f, const rt_kv *kv, rt_err *err)
{
	const size_t need = ((size_t)2 * (size_t)f->cap * (size_t)f->m->hp.head_dim + 15) &
	                    ~(size_t)15;
	if (!kv->tiered || (f->kvf && f->kvf_stride >= need))
		return 0;
	float *p = NULL;
	if (need <= SIZE_MAX / sizeof(float) / (size_t)f->n_att)
		p = aligned_alloc(64, need * (size_t)f->n_att * sizeof(float));
	if (!p)
		return rt_err_set(err, "%s: forward: cannot allocate the tiered KV decode buffers "
		                  "(%d threads × %zu floats)", f->m->path, f->n_att, need);
	free(f->kvf);
	f->kvf = p;
	f->kvf_stride = need;
	return 0;
}

int rt_fwd_reserve_tiers(rt_fwd *f, const rt_kv *kv, rt_err *err)
{
	return fwd_tier_scratch(f, kv, err);
}

/* Sequence scratch fk of a batch of K on scratch big: the same model as big and, in a
 * batch of more than one, not big itself. 0, or -1 with err. */
static int batch_member_check(const rt_fwd *big, const rt_fwd *fk, int K, rt_err *err)
{
	const rt_model *m = big->m;
	if (fk->m != m)
		return rt_err_set(err, "%s: forward: batch of sequences of different models", m->path);
	if (K > 1 && fk == big)
		return rt_err_set(err, "%s: forward: the batch scratch is one of its sequences",
		                  m->path);
	return 0;
}

/* After a chunk whose last row is at position last: each sliding-window layer keeps only
 * the entries a query at last + 1 or later can see (window_masked), in their list order,
 * the rest evicted with their blocks (rt_model_forward's contract). Under rope_at_index
 * only at the end of the call (at_end): the kept keys then sit at the wrong index until
 * the caller re-rotates them, which it does between calls. */
static void window_trim(rt_fwd *f, rt_kv *kv, int32_t last, int at_end)
{
	const rt_model *m = f->m;
	if (!f->win_keep || f->keep_windows || (f->rope_at_index && !at_end))
		return;
	for (int l = 0; l < m->hp.n_layer; l++) {
		const int32_t w = m->layers[l].window;
		for (int j = 0; w && j < m->hp.n_head_kv; j++) {
			rt_kv_head *h = rt_kv_head_at(kv, l, j);
			int32_t nk = 0;
			for (int32_t i = 0; i < h->n; i++)
				if (!window_masked(last + 1, h->pos[i], w))
					f->win_keep[nk++] = i;
			if (nk < h->n)
				rt_kv_head_keep(kv, h, f->win_keep, nk);
		}
	}
}

int rt_model_forward(rt_fwd *f, rt_kv *kv, const int32_t *tokens, int n, int32_t pos0,
                     float *logits, enum rt_logits_mode mode, rt_err *err)
{
	const rt_model *m = f->m;
	const rt_model_hparams *hp = &m->hp;
	if (n < 0 || pos0 < 0)
		return rt_err_set(err, "%s: forward: invalid token count %d or position %d", m->path, n,
		                  (int)pos0);
	if (n == 0)
		return 0;
	if (mode != RT_LOGITS_NONE && !logits)
		return rt_err_set(err, "%s: forward: logits requested without a buffer", m->path);
	if (forward_check(f, kv, tokens, n, pos0, err) != 0 || fwd_tier_scratch(f, kv, err) != 0)
		return -1;
	for (int done = 0; done < n;) {
		const int C = n - done < f->max_chunk ? n - done : f->max_chunk;
		float *lg = NULL;
		int from = 0;
		if (mode == RT_LOGITS_ALL) {
			lg = logits + (size_t)done * hp->n_vocab;
		} else if (mode == RT_LOGITS_LAST && done + C == n) {
			lg = logits;
			from = C - 1;
		}
		fwd_seg *sg = f->segs;
		sg[0] = (fwd_seg){ .tok = tokens + done, .C = C, .pos0 = pos0 + done, .off = 0,
		                   .lg = lg, .lrow_from = from };
		forward_chunk(f, &f, &kv, 1, sg, 1);
		window_trim(f, kv, pos0 + done + C - 1, done + C == n);
		done += C;
	}
	return 0;
}

int rt_model_forward_multi(rt_fwd *big, rt_fwd *const *f, rt_kv *const *kv, int K,
                           const int32_t *const *tokens, const int *n, const int32_t *pos0,
                           float *const *logits, const int *all_rows, rt_err *err)
{
	const rt_model *m = big->m;
	if (K < 1 || K > big->max_chunk)
		return rt_err_set(err, "%s: forward: batch of %d sequences for a scratch of %d rows",
		                  m->path, K, big->max_chunk);
	fwd_seg *sg = big->segs;
	int rows = 0;
	for (int k = 0; k < K; k++) {
		if (batch_member_check(big, f[k], K, err) != 0)
			return -1;
		if (n[k] < 1 || n[k] > f[k]->max_chunk || pos0[k] < 0)
			return rt_err_set(err, "%s: forward: sequence %d: %d tokens at position %d for a "
			                  "chunk of %d", m->path, k, n[k], (int)pos0[k], f[k]->max_chunk);
		if (n[k] > big->max_chunk - rows)
			return rt_err_set(err, "%s: forward: more than %d rows in one batch", m->path,
			                  big->max_chunk);
		if (forward_check(f[k], kv[k], tokens[k], n[k], pos0[k], err) != 0 ||
		    fwd_tier_scratch(f[k], kv[k], err) != 0)
			return -1;
		sg[k] = (fwd_seg){ .tok = tokens[k], .C = n[k], .pos0 = pos0[k], .off = rows,
		                   .lg = logits ? logits[k] : NULL,
		                   .lrow_from = all_rows && all_rows[k] ? 0 : n[k] - 1 };
		rows += n[k];
	}
	forward_chunk(big, f, kv, K, sg, 0);
	for (int k = 0; k < K; k++)
		window_trim(f[k], kv[k], pos0[k] + n[k] - 1, 1);
	return 0;
}
