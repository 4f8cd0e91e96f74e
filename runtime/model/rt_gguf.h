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

/* The ggml tensor types, one row each: X(name, id (ggml.h enum ggml_type), values per block,
 * bytes per block (ggml.c type_traits blck_size, type_size)). The one table of the types:
 * the enum below, rt_ggml_type_name and rt_ggml_type_size read it, and rt_quant takes its
 * block geometry from rt_ggml_type_size. */
#define RT_GGML_TYPES(X)                                                                \
	X(F32, 0, 1, 4) X(F16, 1, 1, 2) X(Q4_0, 2, 32, 18) X(Q4_1, 3, 32, 20)           \
	X(Q5_0, 6, 32, 22) X(Q5_1, 7, 32, 24) X(Q8_0, 8, 32, 34) X(Q8_1, 9, 32, 36)     \
	X(Q2_K, 10, 256, 84) X(Q3_K, 11, 256, 110) X(Q4_K, 12, 256, 144)                \
	X(Q5_K, 13, 256, 176) X(Q6_K, 14, 256, 210) X(Q8_K, 15, 256, 292)               \
	X(IQ2_XXS, 16, 256, 66) X(IQ2_XS, 17, 256, 74) X(IQ3_XXS, 18, 256, 98)          \
	X(IQ1_S, 19, 256, 50) X(IQ4_NL, 20, 32, 18) X(IQ3_S, 21, 256, 110)              \
	X(IQ2_S, 22, 256, 82) X(IQ4_XS, 23, 256, 136) X(I8, 24, 1, 1) X(I16, 25, 1, 2)  \
	X(I32, 26, 1, 4) X(I64, 27, 1, 8) X(F64, 28, 1, 8) X(IQ1_M, 29, 256, 56)        \
	X(BF16, 30, 1, 2) X(TQ1_0, 34, 256, 54) X(TQ2_0, 35, 256, 66)

/* ggml tensor type ids (ggml.h enum ggml_type). */
enum rt_ggml_type {
#define RT_GGML_ENUM(nm, id, blck, bytes) RT_GGML_##nm = id,
	RT_GGML_TYPES(RT_GGML_ENUM)
#undef RT_GGML_ENUM
	RT_GGML_N_TYPE = 36 /* one past the largest id */
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
