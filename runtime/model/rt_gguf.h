/*
 * rt_gguf: a validating reader for GGUF v3 files (the llama.cpp/ggml model container,
 * spec: ggml-org/ggml docs/gguf.md). The file is mmap'ed read-only; every count, string
 * length, array length, tensor dimension, type, offset and size is checked against the
 * file size and the declared alignment before anything points into the mapping, so a
 * truncated or hostile file yields one located error line and never a crash.
 *
 * Ownership: an rt_gguf owns its mapping and all metadata; pointers it hands out (names,
 * strings, tensor data) stay valid until rt_gguf_close().
 */
#ifndef RT_GGUF_H
#define RT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "base/rt_util.h"

/* ggml tensor type ids (ggml.h enum ggml_type). */
enum rt_ggml_type {
	RT_GGML_F32 = 0,
	RT_GGML_F16 = 1,
	RT_GGML_Q4_0 = 2,
	RT_GGML_Q4_1 = 3,
	RT_GGML_Q5_0 = 6,
	RT_GGML_Q5_1 = 7,
	RT_GGML_Q8_0 = 8,
	RT_GGML_Q8_1 = 9,
	RT_GGML_Q2_K = 10,
	RT_GGML_Q3_K = 11,
	RT_GGML_Q4_K = 12,
	RT_GGML_Q5_K = 13,
	RT_GGML_Q6_K = 14,
	RT_GGML_Q8_K = 15,
	RT_GGML_BF16 = 30,
};

/* GGUF metadata value types (gguf.md). */
enum rt_gguf_vtype {
	RT_GGUF_U8 = 0, RT_GGUF_I8 = 1, RT_GGUF_U16 = 2, RT_GGUF_I16 = 3,
	RT_GGUF_U32 = 4, RT_GGUF_I32 = 5, RT_GGUF_F32 = 6, RT_GGUF_BOOL = 7,
	RT_GGUF_STRING = 8, RT_GGUF_ARRAY = 9, RT_GGUF_U64 = 10, RT_GGUF_I64 = 11,
	RT_GGUF_F64 = 12,
};

/* A length-delimited string inside the mapping (not NUL-terminated). */
typedef struct rt_gguf_str {
	const char *s;
	uint64_t len;
} rt_gguf_str;

/* One metadata key/value. For arrays, arr_type/arr_n describe the elements and
 * arr_data points at the first element inside the mapping; string arrays are exposed
 * through rt_gguf_arr_str(). */
typedef struct rt_gguf_kv {
	rt_gguf_str key;
	uint32_t type;
	union {
		uint64_t u64;
		int64_t i64;
		double f64;
		rt_gguf_str str;
	} v;
	uint32_t arr_type;
	uint64_t arr_n;
	const void *arr_data;
	const rt_gguf_str *arr_strs; /* [arr_n] when arr_type == RT_GGUF_STRING, else NULL */
} rt_gguf_kv;

/* One tensor: ne[0] is the row length (fastest-varying), as in ggml. data points into
 * the mapping and has exactly nbytes valid bytes. */
typedef struct rt_gguf_tensor {
	char name[128];          /* NUL-terminated copy; GGUF caps names at 64 bytes */
	uint32_t type;           /* enum rt_ggml_type */
	uint32_t n_dims;         /* 1..4 */
	int64_t ne[4];           /* elements per dimension; unused dims are 1 */
	uint64_t offset;         /* bytes from the start of the data section */
	uint64_t nbytes;
	const void *data;
} rt_gguf_tensor;

typedef struct rt_gguf rt_gguf;

/* Open and fully validate a GGUF v3 (v2 accepted) file. Returns NULL and sets err to
 * "PATH: reason" (e.g. "m.gguf: bad magic", "m.gguf: tensor 'x' data [a, b) past end of
 * file (n bytes)") on any problem. Unsupported tensor types are rejected here only if
 * their block size is unknown; rt_quant decides what it can dequantise. */
rt_gguf *rt_gguf_open(const char *path, rt_err *err);
void rt_gguf_close(rt_gguf *g);

/* The same reader over size bytes already in memory (a test's or a fuzzer's buffer);
 * name stands for the path in messages. The bytes are borrowed, never written, and
 * must stay valid until rt_gguf_close(); nothing outside data[0..size) is read. */
rt_gguf *rt_gguf_open_mem(const char *name, const void *data, size_t size, rt_err *err);

const char *rt_gguf_path(const rt_gguf *g);
uint64_t rt_gguf_file_size(const rt_gguf *g);
uint32_t rt_gguf_version(const rt_gguf *g);

uint64_t rt_gguf_n_kv(const rt_gguf *g);
const rt_gguf_kv *rt_gguf_kv_at(const rt_gguf *g, uint64_t i);
/* Lookup by key; NULL when absent. */
const rt_gguf_kv *rt_gguf_find_kv(const rt_gguf *g, const char *key);

/* Typed getters: return 0 on success, -1 with "PATH: key 'k' missing" or
 * "PATH: key 'k' has type T, expected an integer" in err. Integer getters accept any
 * integer type whose value fits. */
int rt_gguf_get_u32(const rt_gguf *g, const char *key, uint32_t *out, rt_err *err);
int rt_gguf_get_f32(const rt_gguf *g, const char *key, float *out, rt_err *err);
int rt_gguf_get_str(const rt_gguf *g, const char *key, rt_gguf_str *out, rt_err *err);

uint64_t rt_gguf_n_tensors(const rt_gguf *g);
const rt_gguf_tensor *rt_gguf_tensor_at(const rt_gguf *g, uint64_t i);
/* Lookup by name; NULL when absent. */
const rt_gguf_tensor *rt_gguf_find_tensor(const rt_gguf *g, const char *name);

/* Name of a ggml type id ("Q4_1"), or "unknown". */
const char *rt_ggml_type_name(uint32_t type);

/* Block geometry of any ggml type the container knows (ggml.c type_traits), decodable
 * or not: *blck values per block, *bytes bytes per block. Returns 0, or -1 for an
 * unknown type id. */
int rt_ggml_type_size(uint32_t type, uint32_t *blck, uint32_t *bytes);

/* Name of a metadata value type ("u32", "string"), or "unknown". */
const char *rt_gguf_vtype_name(uint32_t type);

/* Alignment of the data section in bytes (general.alignment, default 32) and the file
 * offset where the data section starts. */
uint32_t rt_gguf_alignment(const rt_gguf *g);
uint64_t rt_gguf_data_offset(const rt_gguf *g);

/* Element i of a string-array kv; {NULL, 0} when kv is not a string array or i >= arr_n.
 * (Elements of numeric arrays sit unaligned in the mapping at arr_data: memcpy them.) */
rt_gguf_str rt_gguf_arr_str(const rt_gguf_kv *kv, uint64_t i);

#endif
