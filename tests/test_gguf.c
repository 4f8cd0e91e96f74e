/*
 * test_gguf: the validating GGUF reader. Valid files written by the test writer
 * (tests/support/gguf_writer.c) must round-trip their metadata and tensor bytes; files
 * crafted byte by byte with a small independent builder (bad magic, versions,
 * truncations, hostile lengths and counts, bad shapes/types/offsets, duplicates) must
 * each be rejected with one "PATH: reason" line naming the right reason, and never
 * crash; 2000 random mutations of a valid file must open or fail cleanly; and the real
 * SmolLM2 file (KVRT_MODEL) must show its known layout (272 tensors: Q4_1 210, F32 61,
 * Q8_0 1; 30 blocks; rope base 100000).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/rt_gguf.h"
#include "model/rt_quant.h"
#include "base/rt_util.h"
#include "support/gguf_writer.h"
#include "support/check_run.h"

static char g_dir[64];

/* Path of a scratch file in the suite's temporary directory. */
static const char *tpath(const char *name)
{
	static char buf[256];
	snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
	return buf;
}

static void write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
	ck_assert_uint_eq(fwrite(p, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
}

/* open must fail with "PATH: ...reason..." on one line. */
static void expect_fail_at(const char *path, const char *reason, int line)
{
	rt_err err = { { 0 } };
	rt_gguf *g = rt_gguf_open(path, &err);
	if (g)
		rt_gguf_close(g);
	ck_assert_msg(g == NULL, "line %d: %s opened, expected '%s'", line, path, reason);
	size_t pl = strlen(path);
	ck_assert_msg(strncmp(err.msg, path, pl) == 0 && strncmp(err.msg + pl, ": ", 2) == 0,
	              "line %d: error '%s' does not start with the path", line, err.msg);
	ck_assert_msg(strstr(err.msg, reason) != NULL, "line %d: error '%s' lacks '%s'", line,
	              err.msg, reason);
	ck_assert_msg(strchr(err.msg, '\n') == NULL, "line %d: multi-line error", line);
}
#define expect_fail(path, reason) expect_fail_at((path), (reason), __LINE__)

/* ---- an independent little-endian byte builder for hand-crafted files ---------------- */

typedef struct rb {
	uint8_t p[4096];
	size_t n;
} rb;

static void rb_bytes(rb *b, const void *s, size_t n)
{
	ck_assert_uint_le(b->n + n, sizeof b->p);
	memcpy(b->p + b->n, s, n);
	b->n += n;
}

static void rb_u8(rb *b, uint8_t v)
{
	rb_bytes(b, &v, 1);
}

static void rb_u32(rb *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		rb_u8(b, (uint8_t)(v >> (8 * i)));
}

static void rb_u64(rb *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		rb_u8(b, (uint8_t)(v >> (8 * i)));
}

static void rb_str(rb *b, const char *s)
{
	rb_u64(b, strlen(s));
	rb_bytes(b, s, strlen(s));
}

static void rb_header(rb *b, uint64_t n_tensors, uint64_t n_kv)
{
	b->n = 0;
	rb_bytes(b, "GGUF", 4);
	rb_u32(b, 3);
	rb_u64(b, n_tensors);
	rb_u64(b, n_kv);
}

static void rb_tinfo(rb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                     uint32_t type, uint64_t offset)
{
	rb_str(b, name);
	rb_u32(b, n_dims);
	for (uint32_t i = 0; i < n_dims; i++)
		rb_u64(b, ne[i]);
	rb_u32(b, type);
	rb_u64(b, offset);
}

static void rb_pad(rb *b, size_t a)
{
	while (b->n % a)
		rb_u8(b, 0);
}

static void rb_zeros(rb *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		rb_u8(b, 0);
}

static const char *rb_write(const rb *b, const char *name)
{
	const char *p = tpath(name);
	write_file(p, b->p, b->n);
	return p;
}

/* ---- a valid file through the writer -------------------------------------------------- */

static const float A_VALS[12] = { 1, -2, 3.5f, 0, 1e-3f, -7, 8, 9, 10, 11, 12, 0.25f };

static gw *valid_writer(void)
{
	gw *w = gw_init();
	gw_kv_str(w, "general.architecture", "llama");
	gw_kv_u32(w, "llama.block_count", 2);
	gw_kv_f32(w, "llama.rope.freq_base", 10000.0f);
	gw_kv_i32(w, "test.neg", -5);
	gw_kv_i32(w, "test.pos", 77);
	gw_kv_bool(w, "test.flag", 1);
	static const char *const toks[] = { "a", "bc", "", "\xc4\xa0t" };
	gw_kv_str_arr(w, "tokenizer.ggml.tokens", toks, 4);
	static const int32_t ids[] = { 1, -2, 3 };
	gw_kv_i32_arr(w, "test.ids", ids, 3);

	int64_t ne_a[2] = { 4, 3 };
	gw_tensor_f32(w, "a", 2, ne_a, A_VALS);
	float x[128];
	for (int i = 0; i < 128; i++)
		x[i] = (float)(i % 17) * 0.125f - 1.0f;
	uint8_t q8[4 * 34], q41[20];
	gw_quantize_q8_0(x, q8, 128);
	int64_t ne_b[2] = { 64, 2 };
	gw_tensor(w, "b", RT_GGML_Q8_0, 2, ne_b, q8, sizeof q8);
	gw_quantize_q4_1(x, q41, 32);
	int64_t ne_c[1] = { 32 };
	gw_tensor(w, "c", RT_GGML_Q4_1, 1, ne_c, q41, sizeof q41);
	uint16_t h[5] = { 0x3C00, 0xC000, 0x0001, 0x7BFF, 0x8000 };
	int64_t ne_d[3] = { 5, 1, 1 };
	gw_tensor(w, "d", RT_GGML_F16, 3, ne_d, h, sizeof h);
	return w;
}

static uint8_t *valid_bytes(size_t *len)
{
	gw *w = valid_writer();
	uint8_t *buf;
	gw_serialize(w, &buf, len);
	gw_free(w);
	return buf;
}

START_TEST(test_valid_roundtrip)
{
	gw *w = valid_writer();
	const char *path = tpath("valid.gguf");
	ck_assert_int_eq(gw_write(w, path), 0);
	gw_free(w);
	rt_err err = { { 0 } };
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_uint_eq(rt_gguf_version(g), 3);
	ck_assert_str_eq(rt_gguf_path(g), path);
	ck_assert_uint_eq(rt_gguf_n_kv(g), 8);
	ck_assert_uint_eq(rt_gguf_n_tensors(g), 4);
	ck_assert_uint_eq(rt_gguf_alignment(g), 32);
	ck_assert_uint_eq(rt_gguf_data_offset(g) % 32, 0);

	/* metadata */
	const rt_gguf_kv *kv = rt_gguf_kv_at(g, 0);
	ck_assert_uint_eq(kv->key.len, strlen("general.architecture"));
	ck_assert_int_eq(memcmp(kv->key.s, "general.architecture", kv->key.len), 0);
	ck_assert_ptr_null(rt_gguf_kv_at(g, 8));
	rt_gguf_str s;
	ck_assert_int_eq(rt_gguf_get_str(g, "general.architecture", &s, &err), 0);
	ck_assert_uint_eq(s.len, 5);
	ck_assert_int_eq(memcmp(s.s, "llama", 5), 0);
	uint32_t u;
	ck_assert_int_eq(rt_gguf_get_u32(g, "llama.block_count", &u, &err), 0);
	ck_assert_uint_eq(u, 2);
	ck_assert_int_eq(rt_gguf_get_u32(g, "test.pos", &u, &err), 0);
	ck_assert_uint_eq(u, 77);
	float f;
	ck_assert_int_eq(rt_gguf_get_f32(g, "llama.rope.freq_base", &f, &err), 0);
	ck_assert_float_eq(f, 10000.0f);
	kv = rt_gguf_find_kv(g, "test.neg");
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(kv->type, RT_GGUF_I32);
	ck_assert_int_eq(kv->v.i64, -5);
	kv = rt_gguf_find_kv(g, "test.flag");
	ck_assert_uint_eq(kv->type, RT_GGUF_BOOL);
	ck_assert_uint_eq(kv->v.u64, 1);
	kv = rt_gguf_find_kv(g, "tokenizer.ggml.tokens");
	ck_assert_uint_eq(kv->type, RT_GGUF_ARRAY);
	ck_assert_uint_eq(kv->arr_type, RT_GGUF_STRING);
	ck_assert_uint_eq(kv->arr_n, 4);
	ck_assert_uint_eq(kv->arr_strs[1].len, 2);
	ck_assert_int_eq(memcmp(kv->arr_strs[1].s, "bc", 2), 0);
	ck_assert_uint_eq(rt_gguf_arr_str(kv, 2).len, 0);
	ck_assert_uint_eq(rt_gguf_arr_str(kv, 3).len, 3);
	ck_assert_int_eq(memcmp(rt_gguf_arr_str(kv, 3).s, "\xc4\xa0t", 3), 0);
	ck_assert_ptr_null(rt_gguf_arr_str(kv, 4).s);
	kv = rt_gguf_find_kv(g, "test.ids");
	ck_assert_uint_eq(kv->arr_type, RT_GGUF_I32);
	ck_assert_uint_eq(kv->arr_n, 3);
	int32_t ids[3];
	memcpy(ids, kv->arr_data, sizeof ids);
	ck_assert_int_eq(ids[0], 1);
	ck_assert_int_eq(ids[1], -2);
	ck_assert_int_eq(ids[2], 3);
	ck_assert_ptr_null(rt_gguf_arr_str(kv, 0).s);

	/* getter errors */
	ck_assert_int_eq(rt_gguf_get_u32(g, "test.neg", &u, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "key 'test.neg' value -5 does not fit in u32"));
	ck_assert_int_eq(rt_gguf_get_u32(g, "general.architecture", &u, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "has type string, expected an integer"));
	ck_assert_int_eq(rt_gguf_get_u32(g, "nope", &u, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, ": key 'nope' missing"));
	ck_assert_int_eq(strncmp(err.msg, path, strlen(path)), 0);
	ck_assert_int_eq(rt_gguf_get_f32(g, "llama.block_count", &f, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "expected a float"));
	ck_assert_int_eq(rt_gguf_get_str(g, "test.flag", &s, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "has type bool, expected a string"));
	ck_assert_ptr_null(rt_gguf_find_kv(g, "general.architectur"));

	/* tensors */
	const rt_gguf_tensor *t = rt_gguf_find_tensor(g, "a");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->type, RT_GGML_F32);
	ck_assert_uint_eq(t->n_dims, 2);
	ck_assert_int_eq(t->ne[0], 4);
	ck_assert_int_eq(t->ne[1], 3);
	ck_assert_int_eq(t->ne[2], 1);
	ck_assert_int_eq(t->ne[3], 1);
	ck_assert_uint_eq(t->nbytes, 48);
	ck_assert_int_eq(memcmp(t->data, A_VALS, 48), 0);
	t = rt_gguf_find_tensor(g, "b");
	ck_assert_uint_eq(t->type, RT_GGML_Q8_0);
	ck_assert_uint_eq(t->nbytes, 4 * 34);
	ck_assert_uint_eq(t->offset % 32, 0);
	t = rt_gguf_find_tensor(g, "c");
	ck_assert_uint_eq(t->nbytes, 20);
	ck_assert_uint_eq(t->n_dims, 1);
	t = rt_gguf_find_tensor(g, "d");
	ck_assert_uint_eq(t->type, RT_GGML_F16);
	ck_assert_uint_eq(t->n_dims, 3);
	ck_assert_uint_eq(t->nbytes, 10);
	float y[5];
	ck_assert_int_eq(rt_dequant(t->type, t->data, y, 5), 0);
	ck_assert_float_eq(y[0], 1.0f);
	ck_assert_float_eq(y[1], -2.0f);
	ck_assert_float_eq(y[2], 0x1p-24f);
	ck_assert_float_eq(y[3], 65504.0f);
	ck_assert_ptr_eq(rt_gguf_tensor_at(g, 3), t);
	ck_assert_ptr_null(rt_gguf_tensor_at(g, 4));
	ck_assert_ptr_null(rt_gguf_find_tensor(g, "e"));
	ck_assert_str_eq(rt_ggml_type_name(RT_GGML_Q4_1), "Q4_1");
	ck_assert_str_eq(rt_ggml_type_name(4), "unknown");
	/* every tensor lies inside the file at an aligned position */
	for (uint64_t i = 0; i < rt_gguf_n_tensors(g); i++) {
		t = rt_gguf_tensor_at(g, i);
		ck_assert_uint_le(rt_gguf_data_offset(g) + t->offset + t->nbytes,
		                  rt_gguf_file_size(g));
		ck_assert_uint_eq((rt_gguf_data_offset(g) + t->offset) % 32, 0);
	}
	rt_gguf_close(g);
}
END_TEST

/* Version 2 is accepted; a custom power-of-two alignment is honoured. */
START_TEST(test_version2_and_alignment)
{
	size_t len;
	uint8_t *buf = valid_bytes(&len);
	buf[4] = 2;
	const char *p = tpath("v2.gguf");
	write_file(p, buf, len);
	free(buf);
	rt_err err = { { 0 } };
	rt_gguf *g = rt_gguf_open(p, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_uint_eq(rt_gguf_version(g), 2);
	rt_gguf_close(g);

	gw *w = gw_init();
	gw_kv_u32(w, "general.alignment", 128);
	int64_t ne[1] = { 3 };
	float v[3] = { 1, 2, 3 };
	gw_tensor_f32(w, "x", 1, ne, v);
	gw_tensor_f32(w, "y", 1, ne, v);
	p = tpath("a128.gguf");
	ck_assert_int_eq(gw_write(w, p), 0);
	gw_free(w);
	g = rt_gguf_open(p, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_uint_eq(rt_gguf_alignment(g), 128);
	ck_assert_uint_eq(rt_gguf_data_offset(g) % 128, 0);
	ck_assert_uint_eq(rt_gguf_find_tensor(g, "y")->offset, 128);
	rt_gguf_close(g);

	/* alignment 48 or of the wrong type */
	rb b;
	rb_header(&b, 0, 1);
	rb_str(&b, "general.alignment");
	rb_u32(&b, RT_GGUF_U32);
	rb_u32(&b, 48);
	expect_fail(rb_write(&b, "a48.gguf"), "general.alignment 48 is not a power of two");
	rb_header(&b, 0, 1);
	rb_str(&b, "general.alignment");
	rb_u32(&b, RT_GGUF_U32);
	rb_u32(&b, 0);
	expect_fail(rb_write(&b, "a0.gguf"), "general.alignment 0 is not a power of two");
	rb_header(&b, 0, 1);
	rb_str(&b, "general.alignment");
	rb_u32(&b, RT_GGUF_STRING);
	rb_str(&b, "32");
	expect_fail(rb_write(&b, "astr.gguf"), "'general.alignment' has type string, expected u32");
}
END_TEST

START_TEST(test_bad_open)
{
	expect_fail(tpath("does-not-exist.gguf"), "cannot open: No such file or directory");
	expect_fail(g_dir, "not a regular file");
	const char *p = tpath("empty.gguf");
	write_file(p, "", 0);
	expect_fail(p, "empty file");
	p = tpath("short.gguf");
	write_file(p, "GG", 2);
	expect_fail(p, "truncated in header");
}
END_TEST

START_TEST(test_bad_header)
{
	rb b;
	rb_header(&b, 0, 0);
	b.p[3] = 'X';
	expect_fail(rb_write(&b, "magic.gguf"), "bad magic (expected GGUF)");
	rb_header(&b, 0, 0);
	memcpy(b.p, "PK\x03\x04", 4);
	expect_fail(rb_write(&b, "zip.gguf"), "bad magic");
	rb_header(&b, 0, 0);
	b.p[4] = 1;
	expect_fail(rb_write(&b, "v1.gguf"), "unsupported GGUF version 1 (expected 3");
	rb_header(&b, 0, 0);
	b.p[4] = 99;
	expect_fail(rb_write(&b, "v99.gguf"), "unsupported GGUF version 99");
	rb_header(&b, 0, 0);
	b.p[4] = 0;
	b.p[7] = 3;
	expect_fail(rb_write(&b, "be.gguf"), "big-endian GGUF is not supported");
	rb_header(&b, 0, 0);
	b.n = 12;
	expect_fail(rb_write(&b, "hdr12.gguf"), "truncated in header (12 bytes)");
	b.n = 23;
	expect_fail(rb_write(&b, "hdr23.gguf"), "truncated in header (23 bytes)");
	/* a header alone is a valid (empty) file */
	rb_header(&b, 0, 0);
	rt_err err = { { 0 } };
	rt_gguf *g = rt_gguf_open(rb_write(&b, "hdr.gguf"), &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_uint_eq(rt_gguf_n_kv(g), 0);
	ck_assert_uint_eq(rt_gguf_n_tensors(g), 0);
	rt_gguf_close(g);
	/* absurd counts are rejected before any allocation */
	rb_header(&b, 0, UINT64_MAX);
	expect_fail(rb_write(&b, "nkv.gguf"), "metadata count 18446744073709551615 impossible");
	rb_header(&b, 1ull << 60, 0);
	expect_fail(rb_write(&b, "nt.gguf"), "tensor count 1152921504606846976 impossible");
	rb_header(&b, 2, 0);
	rb_zeros(&b, 60);
	expect_fail(rb_write(&b, "nt2.gguf"), "tensor count 2 impossible for a file of 84 bytes");
}
END_TEST

START_TEST(test_bad_metadata)
{
	rb b;
	/* key length past the end of the file */
	rb_header(&b, 0, 1);
	rb_u64(&b, 0xFFFFFFFFFFull);
	rb_bytes(&b, "abcdefghijklmn", 14);
	expect_fail(rb_write(&b, "klen.gguf"), "truncated in metadata key 0 (key of 1099511627775 bytes");
	/* string value length past the end */
	rb_header(&b, 0, 1);
	rb_str(&b, "k");
	rb_u32(&b, RT_GGUF_STRING);
	rb_u64(&b, 1000);
	rb_bytes(&b, "xyz", 3);
	expect_fail(rb_write(&b, "slen.gguf"), "truncated in value of metadata key 0 'k' (string of 1000 bytes");
	/* second key cut inside its length field */
	rb_header(&b, 0, 2);
	rb_str(&b, "kkkkkkkkkkkkkkkk");
	rb_u32(&b, RT_GGUF_U8);
	rb_u8(&b, 7);
	rb_bytes(&b, "\x03\x00\x00", 3);
	expect_fail(rb_write(&b, "k2.gguf"), "truncated in metadata key 1");
	/* value cut short */
	rb_header(&b, 0, 1);
	rb_str(&b, "kkkkkkkk");
	rb_u32(&b, RT_GGUF_U64);
	rb_u32(&b, 5);
	expect_fail(rb_write(&b, "val.gguf"), "truncated in value of metadata key 0 'kkkkkkkk'");
	/* type cut short */
	rb_header(&b, 0, 1);
	rb_str(&b, "kkkkkkkkkk");
	rb_u8(&b, 6);
	rb_u8(&b, 0);
	expect_fail(rb_write(&b, "typ.gguf"), "truncated in metadata key 0 'kkkkkkkkkk' (type)");
	/* unknown value type */
	rb_header(&b, 0, 1);
	rb_str(&b, "k");
	rb_u32(&b, 13);
	rb_u64(&b, 0);
	expect_fail(rb_write(&b, "vt.gguf"), "metadata key 0 'k' has unknown value type 13");
	/* absurd array count (u8 elements, then strings) */
	rb_header(&b, 0, 1);
	rb_str(&b, "arr");
	rb_u32(&b, RT_GGUF_ARRAY);
	rb_u32(&b, RT_GGUF_U8);
	rb_u64(&b, 1ull << 62);
	rb_zeros(&b, 16);
	expect_fail(rb_write(&b, "acount.gguf"), "array count 4611686018427387904 exceeds the 16 bytes left");
	rb_header(&b, 0, 1);
	rb_str(&b, "arr");
	rb_u32(&b, RT_GGUF_ARRAY);
	rb_u32(&b, RT_GGUF_STRING);
	rb_u64(&b, UINT64_MAX / 8);
	rb_zeros(&b, 16);
	expect_fail(rb_write(&b, "scount.gguf"), "array count 2305843009213693951 exceeds");
	/* string array whose third string runs past the end */
	rb_header(&b, 0, 1);
	rb_str(&b, "arr");
	rb_u32(&b, RT_GGUF_ARRAY);
	rb_u32(&b, RT_GGUF_STRING);
	rb_u64(&b, 3);
	rb_str(&b, "x");
	rb_str(&b, "y");
	rb_u64(&b, 50);
	rb_bytes(&b, "zz", 2);
	expect_fail(rb_write(&b, "sarr.gguf"), "truncated in value of metadata key 0 'arr' (string 2 of 3, length 50)");
	/* nested arrays and arrays of unknown type */
	rb_header(&b, 0, 1);
	rb_str(&b, "nest");
	rb_u32(&b, RT_GGUF_ARRAY);
	rb_u32(&b, RT_GGUF_ARRAY);
	rb_u64(&b, 1);
	rb_u32(&b, RT_GGUF_U8);
	rb_u64(&b, 1);
	rb_u8(&b, 1);
	expect_fail(rb_write(&b, "nest.gguf"), "'nest': nested arrays are not supported");
	rb_header(&b, 0, 1);
	rb_str(&b, "au");
	rb_u32(&b, RT_GGUF_ARRAY);
	rb_u32(&b, 77);
	rb_u64(&b, 1);
	rb_zeros(&b, 8);
	expect_fail(rb_write(&b, "aunk.gguf"), "'au': array of unknown value type 77");
	/* empty key, bool out of range, duplicate key */
	rb_header(&b, 0, 1);
	rb_str(&b, "");
	rb_u32(&b, RT_GGUF_U8);
	rb_u8(&b, 0);
	rb_zeros(&b, 8);
	expect_fail(rb_write(&b, "ekey.gguf"), "metadata key 0 is empty");
	rb_header(&b, 0, 1);
	rb_str(&b, "flag");
	rb_u32(&b, RT_GGUF_BOOL);
	rb_u8(&b, 2);
	expect_fail(rb_write(&b, "bool.gguf"), "'flag': bool value 2 is not 0 or 1");
	rb_header(&b, 0, 2);
	rb_str(&b, "dup");
	rb_u32(&b, RT_GGUF_U8);
	rb_u8(&b, 1);
	rb_str(&b, "dup");
	rb_u32(&b, RT_GGUF_U8);
	rb_u8(&b, 2);
	expect_fail(rb_write(&b, "dupk.gguf"), "duplicate metadata key 'dup' (key 1)");
}
END_TEST

/* A file with no metadata and the given tensor infos followed by `data` zero bytes. */
static const char *one_tensor(const char *file, uint32_t n_dims, const uint64_t *ne,
                              uint32_t type, uint64_t offset, size_t data)
{
	rb b;
	rb_header(&b, 1, 0);
	rb_tinfo(&b, "w", n_dims, ne, type, offset);
	rb_pad(&b, 32);
	rb_zeros(&b, data);
	return rb_write(&b, file);
}

START_TEST(test_bad_tensors)
{
	uint64_t ne[5] = { 32, 2, 1, 1, 1 };
	/* the same builder gives a valid file with the right data size */
	rt_err err = { { 0 } };
	rt_gguf *g = rt_gguf_open(one_tensor("ok.gguf", 2, ne, RT_GGML_Q4_1, 0, 40), &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_uint_eq(rt_gguf_find_tensor(g, "w")->nbytes, 40);
	rt_gguf_close(g);

	expect_fail(one_tensor("nd0.gguf", 0, ne, RT_GGML_F32, 0, 64), "tensor 'w' has n_dims 0 (expected 1..4)");
	expect_fail(one_tensor("nd5.gguf", 5, ne, RT_GGML_F32, 0, 512), "tensor 'w' has n_dims 5 (expected 1..4)");
	expect_fail(one_tensor("ty99.gguf", 2, ne, 99, 0, 512), "tensor 'w' has unknown ggml type 99");
	expect_fail(one_tensor("ty4.gguf", 2, ne, 4, 0, 512), "unknown ggml type 4");
	expect_fail(one_tensor("unal.gguf", 2, ne, RT_GGML_Q4_1, 4, 64), "tensor 'w' offset 4 is not a multiple of the alignment 32");
	/* data past the end: header 24 + info (8+1+4+16+4+8 = 41) = 65 -> data at 96; 40 bytes
	 * needed, 39 present */
	expect_fail(one_tensor("past.gguf", 2, ne, RT_GGML_Q4_1, 0, 39), "tensor 'w' data ends at byte 136, past end of file (135 bytes)");
	expect_fail(one_tensor("past2.gguf", 2, ne, RT_GGML_Q4_1, 1ull << 40, 40), "past end of file (136 bytes)");
	expect_fail(one_tensor("past3.gguf", 2, ne, RT_GGML_Q4_1, UINT64_MAX - 31, 40), "past end of file");
	uint64_t ne0[2] = { 32, 0 };
	expect_fail(one_tensor("zero.gguf", 2, ne0, RT_GGML_F32, 0, 64), "tensor 'w' dimension 1 is 0");
	uint64_t big[2] = { 1ull << 32, 1ull << 32 };
	expect_fail(one_tensor("ovf.gguf", 2, big, RT_GGML_F32, 0, 64), "tensor 'w' element count overflows");
	uint64_t huge[1] = { 1ull << 63 };
	expect_fail(one_tensor("huge.gguf", 1, huge, RT_GGML_F32, 0, 64), "dimension 0 is 9223372036854775808");
	uint64_t bytes_ovf[2] = { 1ull << 31, 1ull << 31 }; /* 2^62 values * 4 bytes */
	expect_fail(one_tensor("bovf.gguf", 2, bytes_ovf, RT_GGML_F32, 0, 64), "tensor 'w' byte size overflows");
	uint64_t q8big[2] = { 1ull << 35, 1ull << 27 }; /* 2^57 blocks * 34 bytes: no overflow */
	expect_fail(one_tensor("bovf2.gguf", 2, q8big, RT_GGML_Q8_0, 0, 64), "tensor 'w' data ends at byte 4899916394579099744, past end of file (160 bytes)");
	uint64_t row48[2] = { 48, 2 };
	expect_fail(one_tensor("row.gguf", 2, row48, RT_GGML_Q4_1, 0, 64), "tensor 'w' row length 48 is not a multiple of the Q4_1 block size 32");

	/* truncated inside the tensor info */
	rb b;
	rb_header(&b, 1, 0);
	rb_tinfo(&b, "weight", 2, ne, RT_GGML_F32, 0);
	b.n -= 6;
	expect_fail(rb_write(&b, "tinfo.gguf"), "truncated in tensor info 0 'weight'");
	rb_header(&b, 1, 0);
	rb_u64(&b, 500);
	rb_zeros(&b, 30);
	expect_fail(rb_write(&b, "tname.gguf"), "truncated in tensor info 0 (name)");

	/* duplicate and overlapping tensors, bad names */
	uint64_t ne1[1] = { 8 };
	rb_header(&b, 2, 0);
	rb_tinfo(&b, "w", 1, ne1, RT_GGML_F32, 0);
	rb_tinfo(&b, "w", 1, ne1, RT_GGML_F32, 32);
	rb_pad(&b, 32);
	rb_zeros(&b, 64);
	expect_fail(rb_write(&b, "dupt.gguf"), "duplicate tensor name 'w' (tensor 1)");
	rb_header(&b, 2, 0);
	rb_tinfo(&b, "u", 1, ne1, RT_GGML_F32, 0);
	rb_tinfo(&b, "v", 1, ne1, RT_GGML_F32, 0);
	rb_pad(&b, 32);
	rb_zeros(&b, 64);
	expect_fail(rb_write(&b, "ovl.gguf"), "tensors 'u' and 'v' overlap");
	rb_header(&b, 1, 0);
	rb_tinfo(&b, "", 1, ne1, RT_GGML_F32, 0);
	rb_pad(&b, 32);
	rb_zeros(&b, 32);
	expect_fail(rb_write(&b, "noname.gguf"), "tensor 0 has an empty name");
	char longname[201];
	memset(longname, 'n', 200);
	longname[200] = 0;
	rb_header(&b, 1, 0);
	rb_tinfo(&b, longname, 1, ne1, RT_GGML_F32, 0);
	rb_pad(&b, 32);
	rb_zeros(&b, 32);
	expect_fail(rb_write(&b, "longname.gguf"), "tensor 0 name is 200 bytes long (at most 127 allowed)");
	/* a control byte in a name (a fuzzer's newline split later messages in two) */
	rb_header(&b, 1, 0);
	rb_tinfo(&b, "blk.0\nw", 1, ne1, RT_GGML_F32, 0);
	rb_pad(&b, 32);
	rb_zeros(&b, 32);
	expect_fail(rb_write(&b, "ctlname.gguf"), "tensor 0 name contains the control byte 0x0a at offset 5");
}
END_TEST

/* Truncating a valid file at every length fails cleanly, with the reason matching the
 * section the cut falls in. */
START_TEST(test_truncations)
{
	size_t len;
	uint8_t *buf = valid_bytes(&len);
	/* find where the sections start in the writer's output: the infos of the first
	 * tensor "a" (2 dims, ne0 = 4) and of the last one "d" (3 dims, ne0 = 5) */
	static const uint8_t info_a[21] = { 1, 0, 0, 0, 0, 0, 0, 0, 'a', 2, 0, 0, 0, 4 };
	static const uint8_t info_d[21] = { 1, 0, 0, 0, 0, 0, 0, 0, 'd', 3, 0, 0, 0, 5 };
	const uint8_t *ta = memmem(buf, len, info_a, sizeof info_a);
	const uint8_t *td = memmem(buf, len, info_d, sizeof info_d);
	ck_assert_ptr_nonnull(ta);
	ck_assert_ptr_nonnull(td);
	size_t tinfo_start = (size_t)(ta - buf);
	size_t tinfo_end = (size_t)(td - buf) + 8 + 1 + 4 + 3 * 8 + 4 + 8;
	rt_err err = { { 0 } };
	const char *p = tpath("full.gguf");
	write_file(p, buf, len);
	rt_gguf *g = rt_gguf_open(p, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	size_t data_start = (size_t)rt_gguf_data_offset(g);
	size_t last_data = data_start + (size_t)rt_gguf_find_tensor(g, "d")->offset;
	rt_gguf_close(g);
	ck_assert_uint_eq(last_data + 10, len);
	ck_assert_uint_eq(data_start, (tinfo_end + 31) / 32 * 32);

	for (size_t cut = 0; cut < len; cut++) {
		char name[32];
		snprintf(name, sizeof name, "cut%zu.gguf", cut);
		p = tpath(name);
		write_file(p, buf, cut);
		const char *why;
		if (cut == 0)
			why = "empty file";
		else if (cut < 24)
			why = "truncated in header";
		else if (cut < 24 + 8 + 20)
			why = "truncated in metadata key 0";
		else if (cut < 24 + 8 + 20 + 4)
			why = "truncated in metadata key 0 'general.architecture' (type)";
		else if (cut < 24 + 8 + 20 + 4 + 8 + 5)
			why = "truncated in value of metadata key 0 'general.architecture'";
		else if (cut < tinfo_start)
			why = "metadata key";
		else if (cut < tinfo_start + 9)
			why = "truncated in tensor info 0 (name)";
		else if (cut < tinfo_end)
			why = "truncated in tensor info";
		else if (cut < last_data)
			why = "past end of file";
		else
			why = "tensor 'd' data ends at byte";
		/* counts bound by file size may fire before the section is reached */
		rt_gguf *h = rt_gguf_open(p, &err);
		ck_assert_msg(h == NULL, "cut at %zu opened", cut);
		ck_assert_msg(strstr(err.msg, why) || strstr(err.msg, "impossible for a file of"),
		              "cut at %zu: '%s' lacks '%s'", cut, err.msg, why);
		unlink(p);
	}
	free(buf);
}
END_TEST

/* Random mutations of a valid file (fixed seed): open either fails with a located error
 * or succeeds with every tensor inside the file; all data and strings stay readable. */
START_TEST(test_mutations)
{
	size_t len;
	uint8_t *orig = valid_bytes(&len);
	uint8_t *buf = malloc(len + 64);
	uint64_t s = 0x853C49E6748FEA9Bull;
#define RND() (s ^= s << 13, s ^= s >> 7, s ^= s << 17, s)
	static const uint64_t interesting[] = { 0, 1, 31, 32, 255, 0x7FFFFFFF, 0xFFFFFFFF,
		                                  1ull << 32, 1ull << 63, UINT64_MAX, 0x7FFFFFFFFFFFFFFF };
	int iters = getenv("KVRT_SANITIZED") ? 1000 : 2000, opened = 0, failed = 0;
	if (getenv("KVRT_GGUF_FUZZ_ITERS")) /* longer runs by hand */
		iters = atoi(getenv("KVRT_GGUF_FUZZ_ITERS"));
	const char *p = tpath("mut.gguf");
	for (int it = 0; it < iters; it++) {
		memcpy(buf, orig, len);
		size_t n = len;
		int k = 1 + (int)(RND() % 4);
		for (int m = 0; m < k; m++) {
			size_t at = (size_t)(RND() % n);
			switch (RND() % 5) {
			case 0: buf[at] = (uint8_t)RND(); break;
			case 1: buf[at] ^= (uint8_t)(1u << (RND() % 8)); break;
			case 2: {
				uint64_t v = interesting[RND() % (sizeof interesting / sizeof interesting[0])];
				size_t w = (RND() & 1) ? 8 : 4;
				if (at + w <= n)
					memcpy(buf + at, &v, w);
				break;
			}
			case 3: n = at + 1; break;
			default: buf[at] = (uint8_t)(buf[at] + 1); break;
			}
		}
		write_file(p, buf, n);
		rt_err err = { { 0 } };
		rt_gguf *g = rt_gguf_open(p, &err);
		if (!g) {
			ck_assert_msg(strncmp(err.msg, p, strlen(p)) == 0 && err.msg[strlen(p)] == ':',
			              "iteration %d: bad error '%s'", it, err.msg);
			ck_assert_ptr_null(strchr(err.msg, '\n'));
			failed++;
			continue;
		}
		opened++;
		unsigned acc = 0;
		for (uint64_t i = 0; i < rt_gguf_n_kv(g); i++) {
			const rt_gguf_kv *kv = rt_gguf_kv_at(g, i);
			for (uint64_t j = 0; j < kv->key.len; j++)
				acc += (unsigned char)kv->key.s[j];
			if (kv->type == RT_GGUF_STRING)
				for (uint64_t j = 0; j < kv->v.str.len; j++)
					acc += (unsigned char)kv->v.str.s[j];
			for (uint64_t e = 0; kv->arr_strs && e < kv->arr_n; e++)
				for (uint64_t j = 0; j < kv->arr_strs[e].len; j++)
					acc += (unsigned char)kv->arr_strs[e].s[j];
		}
		for (uint64_t i = 0; i < rt_gguf_n_tensors(g); i++) {
			const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
			ck_assert_uint_le(rt_gguf_data_offset(g) + t->offset + t->nbytes, n);
			for (uint64_t j = 0; j < t->nbytes; j++)
				acc += ((const uint8_t *)t->data)[j];
		}
		(void)acc;
		rt_gguf_close(g);
	}
#undef RND
	fprintf(stderr, "test_mutations: %d opened, %d rejected\n", opened, failed);
	ck_assert_int_gt(failed, iters / 4);
	ck_assert_int_gt(opened, iters / 50);
	unlink(p);
	free(buf);
	free(orig);
}
END_TEST

START_TEST(test_real_model)
{
	const char *path = getenv("KVRT_MODEL");
	if (!path || !*path) {
		fprintf(stderr, "test_real_model: KVRT_MODEL not set, skipped\n");
		return;
	}
	rt_err err = { { 0 } };
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	ck_assert_uint_eq(rt_gguf_version(g), 3);
	ck_assert_uint_eq(rt_gguf_n_tensors(g), 272);
	ck_assert_uint_eq(rt_gguf_n_kv(g), 33);
	int count[64] = { 0 };
	for (uint64_t i = 0; i < rt_gguf_n_tensors(g); i++) {
		const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
		ck_assert_uint_lt(t->type, 64);
		count[t->type]++;
		ck_assert_uint_le(rt_gguf_data_offset(g) + t->offset + t->nbytes, rt_gguf_file_size(g));
	}
	ck_assert_int_eq(count[RT_GGML_Q4_1], 210);
	ck_assert_int_eq(count[RT_GGML_F32], 61);
	ck_assert_int_eq(count[RT_GGML_Q8_0], 1);
	uint32_t u;
	float f;
	rt_gguf_str s;
	ck_assert_int_eq(rt_gguf_get_u32(g, "llama.block_count", &u, &err), 0);
	ck_assert_uint_eq(u, 30);
	ck_assert_int_eq(rt_gguf_get_f32(g, "llama.rope.freq_base", &f, &err), 0);
	ck_assert_float_eq(f, 100000.0f);
	ck_assert_int_eq(rt_gguf_get_u32(g, "llama.embedding_length", &u, &err), 0);
	ck_assert_uint_eq(u, 576);
	ck_assert_int_eq(rt_gguf_get_u32(g, "llama.attention.head_count_kv", &u, &err), 0);
	ck_assert_uint_eq(u, 3);
	ck_assert_int_eq(rt_gguf_get_str(g, "general.architecture", &s, &err), 0);
	ck_assert_uint_eq(s.len, 5);
	ck_assert_int_eq(memcmp(s.s, "llama", 5), 0);
	const rt_gguf_kv *kv = rt_gguf_find_kv(g, "tokenizer.ggml.tokens");
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(kv->arr_type, RT_GGUF_STRING);
	ck_assert_uint_eq(kv->arr_n, 49152);
	rt_gguf_str t0 = rt_gguf_arr_str(kv, 0), tl = rt_gguf_arr_str(kv, 49151);
	ck_assert_uint_eq(t0.len, 13);
	ck_assert_int_eq(memcmp(t0.s, "<|endoftext|>", 13), 0);
	ck_assert_uint_eq(tl.len, 7);
	ck_assert_int_eq(memcmp(tl.s, "ectable", 7), 0);
	kv = rt_gguf_find_kv(g, "tokenizer.ggml.merges");
	ck_assert_uint_eq(kv->arr_n, 48900);
	ck_assert_int_eq(memcmp(rt_gguf_arr_str(kv, 0).s, "\xc4\xa0 t", 4), 0);
	const rt_gguf_tensor *t = rt_gguf_find_tensor(g, "token_embd.weight");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->type, RT_GGML_Q8_0);
	ck_assert_int_eq(t->ne[0], 576);
	ck_assert_int_eq(t->ne[1], 49152);
	ck_assert_uint_eq(t->nbytes, 30081024);
	ck_assert_uint_eq(rt_gguf_data_offset(g), 1785664);
	ck_assert_ptr_null(rt_gguf_find_tensor(g, "output.weight"));
	t = rt_gguf_find_tensor(g, "blk.29.ffn_down.weight");
	ck_assert_uint_eq(t->type, RT_GGML_Q4_1);
	ck_assert_int_eq(t->ne[0], 1536);
	ck_assert_int_eq(t->ne[1], 576);
	rt_gguf_close(g);
}
END_TEST

static Suite *gguf_suite(void)
{
	Suite *s = suite_create("gguf");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_valid_roundtrip);
	tcase_add_test(tc, test_version2_and_alignment);
	tcase_add_test(tc, test_bad_open);
	tcase_add_test(tc, test_bad_header);
	tcase_add_test(tc, test_bad_metadata);
	tcase_add_test(tc, test_bad_tensors);
	tcase_add_test(tc, test_truncations);
	tcase_add_test(tc, test_mutations);
	tcase_add_test(tc, test_real_model);
	suite_add_tcase(s, tc);
	return s;
}

/* Remove the scratch directory and everything in it. */
static void rm_tree(const char *dir)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "test_gguf: could not remove %s\n", dir);
}

int main(void)
{
	snprintf(g_dir, sizeof g_dir, "/tmp/kvpc_test_gguf_XXXXXX");
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return EXIT_FAILURE;
	}
	int failed = check_run(gguf_suite());
	rm_tree(g_dir);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
