/*
 * gguf_writer: builds GGUF v3 files for the test suites (spec: ggml-org/ggml docs/gguf.md).
 * Metadata values are serialised as they are added; tensors are copied and laid out in
 * insertion order, each at the next multiple of the alignment (32, or the value of a
 * u32 "general.alignment" key when the caller added one). The Q4_1/Q8_0 encoders follow
 * quantize_row_q4_1_ref / quantize_row_q8_0_ref of ggml-quants.c, including the
 * round-to-nearest-even f32 -> f16 conversion of the scales, so files written here match
 * what llama.cpp's quantizer would produce for the same values.
 */
#include "gguf_writer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growable byte buffer. */
typedef struct gw_buf {
	uint8_t *p;
	size_t n, cap;
} gw_buf;

typedef struct gw_kv {
	gw_buf bytes; /* key string, u32 type, value: exactly as in the file */
	char *key;
	uint32_t type;
	uint32_t u32; /* the value when type is u32 (for general.alignment) */
} gw_kv;

typedef struct gw_tens {
	char *name;
	uint32_t type;
	int n_dims;
	int64_t ne[4];
	uint8_t *data;
	size_t nbytes;
} gw_tens;

struct gw {
	gw_kv *kv;
	size_t n_kv, cap_kv;
	gw_tens *t;
	size_t n_t, cap_t;
};

static void *gw_alloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "gguf_writer: out of memory (%zu bytes)\n", n);
		abort();
	}
	return p;
}

static void buf_put(gw_buf *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 64;
		while (cap < b->n + n)
			cap *= 2;
		uint8_t *np = realloc(b->p, cap);
		if (!np) {
			fprintf(stderr, "gguf_writer: out of memory (%zu bytes)\n", cap);
			abort();
		}
		b->p = np;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, src, n);
	b->n += n;
}

/* Little-endian stores (the test machines are little-endian, but be explicit). */
static void put_u32(gw_buf *b, uint32_t v)
{
	uint8_t x[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
	buf_put(b, x, 4);
}

static void put_u64(gw_buf *b, uint64_t v)
{
	put_u32(b, (uint32_t)v);
	put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(gw_buf *b, const char *s)
{
	size_t n = strlen(s);
	put_u64(b, n);
	buf_put(b, s, n);
}

static char *dupstr(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = gw_alloc(n);
	memcpy(d, s, n);
	return d;
}

gw *gw_init(void)
{
	gw *w = gw_alloc(sizeof *w);
	memset(w, 0, sizeof *w);
	return w;
}

void gw_free(gw *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n_kv; i++) {
		free(w->kv[i].bytes.p);
		free(w->kv[i].key);
	}
	for (size_t i = 0; i < w->n_t; i++) {
		free(w->t[i].name);
		free(w->t[i].data);
	}
	free(w->kv);
	free(w->t);
	free(w);
}

/* Start a new kv entry: appends the key and the type, returns the entry. */
static gw_kv *kv_new(gw *w, const char *key, uint32_t type)
{
	if (w->n_kv == w->cap_kv) {
		w->cap_kv = w->cap_kv ? 2 * w->cap_kv : 16;
		gw_kv *nk = realloc(w->kv, w->cap_kv * sizeof *nk);
		if (!nk)
			abort();
		w->kv = nk;
	}
	gw_kv *kv = &w->kv[w->n_kv++];
	memset(kv, 0, sizeof *kv);
	kv->key = dupstr(key);
	kv->type = type;
	put_str(&kv->bytes, key);
	put_u32(&kv->bytes, type);
	return kv;
}

void gw_kv_u32(gw *w, const char *key, uint32_t v)
{
	gw_kv *kv = kv_new(w, key, 4);
	kv->u32 = v;
	put_u32(&kv->bytes, v);
}

void gw_kv_i32(gw *w, const char *key, int32_t v)
{
	put_u32(&kv_new(w, key, 5)->bytes, (uint32_t)v);
}

void gw_kv_f32(gw *w, const char *key, float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	put_u32(&kv_new(w, key, 6)->bytes, u);
}

void gw_kv_bool(gw *w, const char *key, int v)
{
	uint8_t b = v ? 1 : 0;
	buf_put(&kv_new(w, key, 7)->bytes, &b, 1);
}

void gw_kv_str(gw *w, const char *key, const char *v)
{
	put_str(&kv_new(w, key, 8)->bytes, v);
}

void gw_kv_str_arr(gw *w, const char *key, const char *const *v, uint64_t n)
{
	gw_kv *kv = kv_new(w, key, 9);
	put_u32(&kv->bytes, 8);
	put_u64(&kv->bytes, n);
	for (uint64_t i = 0; i < n; i++)
		put_str(&kv->bytes, v[i]);
}

void gw_kv_i32_arr(gw *w, const char *key, const int32_t *v, uint64_t n)
{
	gw_kv *kv = kv_new(w, key, 9);
	put_u32(&kv->bytes, 5);
	put_u64(&kv->bytes, n);
	for (uint64_t i = 0; i < n; i++)
		put_u32(&kv->bytes, (uint32_t)v[i]);
}

void gw_tensor(gw *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
               const void *data, size_t nbytes)
{
	if (n_dims < 0 || n_dims > 4) {
		fprintf(stderr, "gguf_writer: tensor '%s': n_dims %d outside 0..4\n", name, n_dims);
		abort();
	}
	if (w->n_t == w->cap_t) {
		w->cap_t = w->cap_t ? 2 * w->cap_t : 16;
		gw_tens *nt = realloc(w->t, w->cap_t * sizeof *nt);
		if (!nt)
			abort();
		w->t = nt;
	}
	gw_tens *t = &w->t[w->n_t++];
	memset(t, 0, sizeof *t);
	t->name = dupstr(name);
	t->type = type;
	t->n_dims = n_dims;
	for (int i = 0; i < n_dims; i++)
		t->ne[i] = ne[i];
	t->data = gw_alloc(nbytes);
	if (nbytes)
		memcpy(t->data, data, nbytes);
	t->nbytes = nbytes;
}

void gw_tensor_f32(gw *w, const char *name, int n_dims, const int64_t *ne, const float *data)
{
	int64_t n = 1;
	for (int i = 0; i < n_dims; i++)
		n *= ne[i];
	gw_tensor(w, name, 0, n_dims, ne, data, (size_t)n * sizeof(float));
}

static uint32_t gw_alignment(const gw *w)
{
	for (size_t i = 0; i < w->n_kv; i++)
		if (w->kv[i].type == 4 && strcmp(w->kv[i].key, "general.alignment") == 0 &&
		    w->kv[i].u32 != 0)
			return w->kv[i].u32;
	return 32;
}

static void pad_to(gw_buf *b, uint64_t align)
{
	static const uint8_t zero[64];
	while (b->n % align) {
		size_t k = align - b->n % align;
		buf_put(b, zero, k < sizeof zero ? k : sizeof zero);
	}
}

int gw_serialize(const gw *w, uint8_t **out, size_t *len)
{
	gw_buf b = { 0 };
	uint64_t align = gw_alignment(w);
	buf_put(&b, "GGUF", 4);
	put_u32(&b, 3);
	put_u64(&b, w->n_t);
	put_u64(&b, w->n_kv);
	for (size_t i = 0; i < w->n_kv; i++)
		buf_put(&b, w->kv[i].bytes.p, w->kv[i].bytes.n);
	uint64_t off = 0;
	for (size_t i = 0; i < w->n_t; i++) {
		const gw_tens *t = &w->t[i];
		put_str(&b, t->name);
		put_u32(&b, (uint32_t)t->n_dims);
		for (int d = 0; d < t->n_dims; d++)
			put_u64(&b, (uint64_t)t->ne[d]);
		put_u32(&b, t->type);
		put_u64(&b, off);
		off += t->nbytes;
		off = (off + align - 1) / align * align;
	}
	pad_to(&b, align);
	for (size_t i = 0; i < w->n_t; i++) {
		buf_put(&b, w->t[i].data, w->t[i].nbytes);
		if (i + 1 < w->n_t)
			pad_to(&b, align);
	}
	*out = b.p;
	*len = b.n;
	return 0;
}

int gw_write(const gw *w, const char *path)
{
	uint8_t *buf;
	size_t len;
	gw_serialize(w, &buf, &len);
	FILE *f = fopen(path, "wb");
	if (!f) {
		free(buf);
		return -1;
	}
	int ok = fwrite(buf, 1, len, f) == len;
	ok = (fclose(f) == 0) && ok;
	free(buf);
	return ok ? 0 : -1;
}

/* ---- quantisers (ggml-quants.c reference versions) ---------------------------------- */

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

uint16_t gw_f32_to_f16(float f)
{
	/* ggml_compute_fp32_to_fp16 (the FP16 library by Maratyszcza): round to nearest
	 * even, subnormals and overflow to inf handled by float arithmetic. */
	const float scale_to_inf = 0x1.0p+112f;
	const float scale_to_zero = 0x1.0p-110f;
	float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
	const uint32_t w = f32_bits(f);
	const uint32_t shl1_w = w + w;
	const uint32_t sign = w & 0x80000000u;
	uint32_t bias = shl1_w & 0xFF000000u;
	if (bias < 0x71000000u)
		bias = 0x71000000u;
	base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
	const uint32_t bits = f32_bits(base);
	const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
	const uint32_t mantissa_bits = bits & 0x00000FFFu;
	const uint32_t nonsign = exp_bits + mantissa_bits;
	return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static void put_f16(uint8_t *dst, float f)
{
	uint16_t h = gw_f32_to_f16(f);
	dst[0] = (uint8_t)h;
	dst[1] = (uint8_t)(h >> 8);
}

void gw_quantize_q4_1(const float *src, void *dst, int64_t n)
{
	uint8_t *out = dst;
	for (int64_t b = 0; b < n / 32; b++) {
		const float *x = src + b * 32;
		uint8_t *y = out + b * 20;
		float min = x[0], max = x[0];
		for (int j = 1; j < 32; j++) {
			if (x[j] < min)
				min = x[j];
			if (x[j] > max)
				max = x[j];
		}
		const float d = (max - min) / 15.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;
		put_f16(y, d);
		put_f16(y + 2, min);
		for (int j = 0; j < 16; j++) {
			const float x0 = (x[j] - min) * id;
			const float x1 = (x[16 + j] - min) * id;
			int q0 = (int8_t)(x0 + 0.5f), q1 = (int8_t)(x1 + 0.5f);
			q0 = q0 > 15 ? 15 : q0;
			q1 = q1 > 15 ? 15 : q1;
			y[4 + j] = (uint8_t)(q0 | (q1 << 4));
		}
	}
}

void gw_quantize_q8_0(const float *src, void *dst, int64_t n)
{
	uint8_t *out = dst;
	for (int64_t b = 0; b < n / 32; b++) {
		const float *x = src + b * 32;
		uint8_t *y = out + b * 34;
		float amax = 0.0f;
		for (int j = 0; j < 32; j++) {
			float a = fabsf(x[j]);
			amax = a > amax ? a : amax;
		}
		const float d = amax / 127.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;
		put_f16(y, d);
		for (int j = 0; j < 32; j++)
			y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
	}
}
