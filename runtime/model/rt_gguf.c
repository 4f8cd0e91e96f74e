/*
 * rt_gguf: the validating GGUF reader (see rt_gguf.h; format per ggml-org/ggml
 * docs/gguf.md). The file is mapped read-only and parsed with a bounds-checked cursor:
 * every read first checks the bytes remaining, multi-byte values are assembled from
 * bytes (the mapping gives no alignment guarantee for fields inside the header), counts
 * are bounded by what the remaining bytes could possibly hold before anything is
 * allocated, and tensor shapes, types, offsets and sizes are checked against the
 * alignment and the file size. Keys and tensor names are indexed in open-addressing hash
 * tables so duplicates are found in linear time, even for hostile counts.
 */
#include "model/rt_gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

struct rt_gguf {
	char *path;
	int fd;               /* -1 for rt_gguf_open_mem */
	int owns_map;         /* the mapping is ours to munmap */
	const uint8_t *map;
	uint64_t size;
	uint32_t version;
	uint32_t alignment;
	uint64_t data_start;  /* file offset of the tensor data section */
	uint64_t n_kv;
	rt_gguf_kv *kv;
	uint64_t n_tensors;
	rt_gguf_tensor *tensors;
	/* hash indexes: slot holds index+1, 0 = empty; capacity is a power of two */
	uint64_t *kv_idx, kv_cap;
	uint64_t *t_idx, t_cap;
};

/* ---- ggml type table (ggml.c type_traits: blck_size, type_size) ------------------- */

typedef struct ggml_type_info {
	const char *name; /* NULL: an id ggml does not use */
	uint32_t blck;
	uint32_t size;
} ggml_type_info;

/* indexed by the type id (designated rows of RT_GGML_TYPES) */
static const ggml_type_info type_info[RT_GGML_N_TYPE] = {
#define RT_GGML_ROW(nm, id, b, bytes) [id] = { #nm, b, bytes },
	RT_GGML_TYPES(RT_GGML_ROW)
#undef RT_GGML_ROW
};

static const ggml_type_info *type_lookup(uint32_t type)
{
	return type < RT_GGML_N_TYPE && type_info[type].name ? &type_info[type] : NULL;
}

const char *rt_ggml_type_name(uint32_t type)
{
	const ggml_type_info *t = type_lookup(type);
	return t ? t->name : "unknown";
}

int rt_ggml_type_size(uint32_t type, uint32_t *blck, uint32_t *bytes)
{
	const ggml_type_info *t = type_lookup(type);
	if (!t)
		return -1;
	if (blck)
		*blck = t->blck;
	if (bytes)
		*bytes = t->size;
	return 0;
}

static const char *vtype_name(uint32_t t)
{
	static const char *names[] = { "u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
	                               "bool", "string", "array", "u64", "i64", "f64" };
	return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* Size in bytes of a fixed-size value type, 0 for string/array/unknown. */
static uint32_t vtype_size(uint32_t t)
{
	switch (t) {
	case RT_GGUF_U8: case RT_GGUF_I8: case RT_GGUF_BOOL: return 1;
	case RT_GGUF_U16: case RT_GGUF_I16: return 2;
	case RT_GGUF_U32: case RT_GGUF_I32: case RT_GGUF_F32: return 4;
	case RT_GGUF_U64: case RT_GGUF_I64: case RT_GGUF_F64: return 8;
	default: return 0;
	}
}

/* ---- bounds-checked cursor ---------------------------------------------------------- */

typedef struct cursor {
	const uint8_t *p;
	uint64_t size, off;
} cursor;

static uint64_t cur_left(const cursor *c)
{
	return c->size - c->off;
}

static uint64_t ld_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static int rd_u32(cursor *c, uint32_t *v)
{
	if (cur_left(c) < 4)
		return -1;
	*v = (uint32_t)ld_le(c->p + c->off, 4);
	c->off += 4;
	return 0;
}

static int rd_u64(cursor *c, uint64_t *v)
{
	if (cur_left(c) < 8)
		return -1;
	*v = ld_le(c->p + c->off, 8);
	c->off += 8;
	return 0;
}

/* A string: u64 length then bytes. Returns -1 on truncation (*overlong set when the
 * length itself was readable but exceeds the remaining bytes). */
static int rd_str(cursor *c, rt_gguf_str *s, uint64_t *len_out)
{
	uint64_t n;
	if (rd_u64(c, &n) < 0)
		return -1;
	if (len_out)
		*len_out = n;
	if (n > cur_left(c))
		return -1;
	s->s = (const char *)(c->p + c->off);
	s->len = n;
	c->off += n;
	return 0;
}

/* ---- hash index --------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, uint64_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (uint64_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return h;
}

static uint64_t *idx_new(uint64_t n, uint64_t *cap)
{
	uint64_t c = 16;
	while (c < 2 * n)
		c *= 2;
	*cap = c;
	return RT_CALLOC(c, sizeof(uint64_t));
}

/* The key/name of entry i (for kvs and tensors respectively). */
typedef void (*name_fn)(const rt_gguf *g, uint64_t i, const char **s, uint64_t *n);

static void kv_name(const rt_gguf *g, uint64_t i, const char **s, uint64_t *n)
{
	*s = g->kv[i].key.s;
	*n = g->kv[i].key.len;
}

static void t_name(const rt_gguf *g, uint64_t i, const char **s, uint64_t *n)
{
	*s = g->tensors[i].name;
	*n = strlen(g->tensors[i].name);
}

/* Find s[0..n) in the index: returns the entry index or UINT64_MAX; *slot receives the
 * slot where it is or would go. */
static uint64_t idx_find(const rt_gguf *g, const uint64_t *idx, uint64_t cap, name_fn nf,
                         const char *s, uint64_t n, uint64_t *slot)
{
	uint64_t h = hash_bytes(s, n) & (cap - 1);
	for (;;) {
		if (!idx[h]) {
			if (slot)
				*slot = h;
			return UINT64_MAX;
		}
		const char *es;
		uint64_t en;
		nf(g, idx[h] - 1, &es, &en);
		if (en == n && memcmp(es, s, n) == 0) {
			if (slot)
				*slot = h;
			return idx[h] - 1;
		}
		h = (h + 1) & (cap - 1);
	}
}

/* ---- parsing ------------------------------------------------------------------------ */

/* Printable form of a key/name for error messages (truncated, control bytes as '?'). */
static void printable(char *dst, size_t cap, const char *s, uint64_t n)
{
	size_t k = 0;
	for (uint64_t i = 0; i < n && k + 4 < cap; i++) {
		unsigned char ch = (unsigned char)s[i];
		dst[k++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
	}
	if (n > cap - 4 && k + 3 < cap) {
		dst[k++] = '.';
		dst[k++] = '.';
		dst[k++] = '.';
	}
	dst[k] = 0;
}

static int parse_value(rt_gguf *g, cursor *c, rt_gguf_kv *kv, uint64_t i, rt_err *err)
{
	char key[80];
	printable(key, sizeof key, kv->key.s, kv->key.len);
	uint32_t t = kv->type;
	if (t > RT_GGUF_F64)
		return rt_err_set(err, "%s: metadata key %" PRIu64 " '%s' has unknown value type %u",
		                  g->path, i, key, t);
	if (t == RT_GGUF_STRING) {
		uint64_t n = 0;
		if (rd_str(c, &kv->v.str, &n) < 0)
			return rt_err_set(err, "%s: truncated in value of metadata key %" PRIu64
			                  " '%s' (string of %" PRIu64 " bytes, %" PRIu64 " left in file)",
			                  g->path, i, key, n, cur_left(c));
		return 0;
	}
	if (t == RT_GGUF_ARRAY) {
		uint32_t at;
		uint64_t n;
		if (rd_u32(c, &at) < 0 || rd_u64(c, &n) < 0)
			return rt_err_set(err, "%s: truncated in value of metadata key %" PRIu64 " '%s'",
			                  g->path, i, key);
		if (at == RT_GGUF_ARRAY)
			return rt_err_set(err, "%s: metadata key %" PRIu64 " '%s': nested arrays are not "
			                  "supported", g->path, i, key);
		if (at > RT_GGUF_F64)
			return rt_err_set(err, "%s: metadata key %" PRIu64 " '%s': array of unknown "
			                  "value type %u", g->path, i, key, at);
		uint64_t esz = at == RT_GGUF_STRING ? 8 : vtype_size(at);
		if (n > cur_left(c) / esz)
			return rt_err_set(err, "%s: metadata key %" PRIu64 " '%s': array count %" PRIu64
			                  " exceeds the %" PRIu64 " bytes left in file", g->path, i, key, n,
			                  cur_left(c));
		kv->arr_type = at;
		kv->arr_n = n;
		kv->arr_data = c->p + c->off;
		if (at == RT_GGUF_STRING) {
			rt_gguf_str *strs = RT_CALLOC(n ? n : 1, sizeof *strs);
			kv->arr_strs = strs;
			for (uint64_t j = 0; j < n; j++) {
				uint64_t len = 0;
				if (rd_str(c, &strs[j], &len) < 0)
					return rt_err_set(err, "%s: truncated in value of metadata key %" PRIu64
					                  " '%s' (string %" PRIu64 " of %" PRIu64 ", length %"
					                  PRIu64 ")", g->path, i, key, j, n, len);
			}
		} else {
			c->off += n * esz;
		}
		return 0;
	}
	uint32_t sz = vtype_size(t);
	if (cur_left(c) < sz)
		return rt_err_set(err, "%s: truncated in value of metadata key %" PRIu64 " '%s'",
		                  g->path, i, key);
	uint64_t raw = ld_le(c->p + c->off, (int)sz);
	c->off += sz;
	switch (t) {
	case RT_GGUF_I8: kv->v.i64 = (int8_t)raw; break;
	case RT_GGUF_I16: kv->v.i64 = (int16_t)raw; break;
	case RT_GGUF_I32: kv->v.i64 = (int32_t)raw; break;
	case RT_GGUF_I64: kv->v.i64 = (int64_t)raw; break;
	case RT_GGUF_F32: {
		uint32_t b = (uint32_t)raw;
		float f;
		memcpy(&f, &b, 4);
		kv->v.f64 = f;
		break;
	}
	case RT_GGUF_F64: memcpy(&kv->v.f64, &raw, 8); break;
	case RT_GGUF_BOOL:
		if (raw > 1)
			return rt_err_set(err, "%s: metadata key %" PRIu64 " '%s': bool value %u is not "
			                  "0 or 1", g->path, i, key, (unsigned)raw);
		kv->v.u64 = raw;
		break;
	default: kv->v.u64 = raw; break;
	}
	return 0;
}

static int parse_kvs(rt_gguf *g, cursor *c, rt_err *err)
{
	/* the smallest kv is an 8-byte key length, a 1-byte key, a u32 type and a 1-byte value */
	if (g->n_kv > cur_left(c) / 14)
		return rt_err_set(err, "%s: metadata count %" PRIu64 " impossible for a file of %"
		                  PRIu64 " bytes", g->path, g->n_kv, g->size);
	g->kv = RT_CALLOC(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
	g->kv_idx = idx_new(g->n_kv, &g->kv_cap);
	for (uint64_t i = 0; i < g->n_kv; i++) {
		rt_gguf_kv *kv = &g->kv[i];
		uint64_t len = 0;
		if (rd_str(c, &kv->key, &len) < 0) {
			if (c->off + 8 <= c->size)
				return rt_err_set(err, "%s: truncated in metadata key %" PRIu64 " (key of %"
				                  PRIu64 " bytes, %" PRIu64 " left in file)", g->path, i,
				                  len, cur_left(c));
			return rt_err_set(err, "%s: truncated in metadata key %" PRIu64, g->path, i);
		}
		if (kv->key.len == 0)
			return rt_err_set(err, "%s: metadata key %" PRIu64 " is empty", g->path, i);
		if (memchr(kv->key.s, 0, kv->key.len))
			return rt_err_set(err, "%s: metadata key %" PRIu64 " contains a NUL byte",
			                  g->path, i);
		uint64_t slot;
		if (idx_find(g, g->kv_idx, g->kv_cap, kv_name, kv->key.s, kv->key.len, &slot) !=
		    UINT64_MAX) {
			char key[80];
			printable(key, sizeof key, kv->key.s, kv->key.len);
			return rt_err_set(err, "%s: duplicate metadata key '%s' (key %" PRIu64 ")",
			                  g->path, key, i);
		}
		g->kv_idx[slot] = i + 1;
		if (rd_u32(c, &kv->type) < 0) {
			char key[80];
			printable(key, sizeof key, kv->key.s, kv->key.len);
			return rt_err_set(err, "%s: truncated in metadata key %" PRIu64 " '%s' (type)",
			                  g->path, i, key);
		}
		if (parse_value(g, c, kv, i, err) < 0)
			return -1;
	}
	return 0;
}

static int parse_alignment(rt_gguf *g, rt_err *err)
{
	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	const rt_gguf_kv *kv = rt_gguf_find_kv(g, "general.alignment");
	if (!kv)
		return 0;
	if (kv->type != RT_GGUF_U32)
		return rt_err_set(err, "%s: key 'general.alignment' has type %s, expected u32",
		                  g->path, vtype_name(kv->type));
	uint64_t a = kv->v.u64;
	if (a == 0 || (a & (a - 1)))
		return rt_err_set(err, "%s: general.alignment %" PRIu64 " is not a power of two",
		                  g->path, a);
	g->alignment = (uint32_t)a;
	return 0;
}

static int parse_tensor_infos(rt_gguf *g, cursor *c, rt_err *err)
{
	/* smallest info: name length 8 + 1 byte, n_dims 4, one dim 8, type 4, offset 8 */
	if (g->n_tensors > cur_left(c) / 33)
		return rt_err_set(err, "%s: tensor count %" PRIu64 " impossible for a file of %"
		                  PRIu64 " bytes", g->path, g->n_tensors, g->size);
	g->tensors = RT_CALLOC(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
	g->t_idx = idx_new(g->n_tensors, &g->t_cap);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		rt_gguf_tensor *t = &g->tensors[i];
		rt_gguf_str name;
		uint64_t len = 0;
		if (rd_str(c, &name, &len) < 0)
			return rt_err_set(err, "%s: truncated in tensor info %" PRIu64 " (name)",
			                  g->path, i);
		if (name.len == 0)
			return rt_err_set(err, "%s: tensor %" PRIu64 " has an empty name", g->path, i);
		if (name.len >= sizeof t->name)
			return rt_err_set(err, "%s: tensor %" PRIu64 " name is %" PRIu64 " bytes long "
			                  "(at most %zu allowed)", g->path, i, name.len,
			                  sizeof t->name - 1);
		/* control bytes are refused here so that every later message can print the name
		 * as it is (a name with a newline would split an error line in two) */
		for (uint64_t k = 0; k < name.len; k++) {
			unsigned char ch = (unsigned char)name.s[k];
			if (ch < 0x20 || ch == 0x7f)
				return rt_err_set(err, "%s: tensor %" PRIu64 " name contains the control "
				                  "byte 0x%02x at offset %" PRIu64, g->path, i, ch, k);
		}
		memcpy(t->name, name.s, name.len);
		t->name[name.len] = 0;
		char pn[sizeof t->name];
		printable(pn, sizeof pn, name.s, name.len);
		uint64_t slot;
		if (idx_find(g, g->t_idx, g->t_cap, t_name, t->name, name.len, &slot) != UINT64_MAX)
			return rt_err_set(err, "%s: duplicate tensor name '%s' (tensor %" PRIu64 ")",
			                  g->path, pn, i);
		g->t_idx[slot] = i + 1;
		if (rd_u32(c, &t->n_dims) < 0)
			return rt_err_set(err, "%s: truncated in tensor info %" PRIu64 " '%s'", g->path,
			                  i, pn);
		if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
			return rt_err_set(err, "%s: tensor '%s' has n_dims %u (expected 1..%d)", g->path,
			                  pn, t->n_dims, GGUF_MAX_DIMS);
		uint64_t nelem = 1;
		for (int d = 0; d < GGUF_MAX_DIMS; d++)
			t->ne[d] = 1;
		for (uint32_t d = 0; d < t->n_dims; d++) {
			uint64_t ne;
			if (rd_u64(c, &ne) < 0)
				return rt_err_set(err, "%s: truncated in tensor info %" PRIu64 " '%s'",
				                  g->path, i, pn);
			if (ne == 0 || ne > (uint64_t)INT64_MAX)
				return rt_err_set(err, "%s: tensor '%s' dimension %u is %" PRIu64
				                  " (must be 1..2^63-1)", g->path, pn, d, ne);
			if (ne > (uint64_t)INT64_MAX / nelem)
				return rt_err_set(err, "%s: tensor '%s' element count overflows", g->path,
				                  pn);
			nelem *= ne;
			t->ne[d] = (int64_t)ne;
		}
		if (rd_u32(c, &t->type) < 0 || rd_u64(c, &t->offset) < 0)
			return rt_err_set(err, "%s: truncated in tensor info %" PRIu64 " '%s'", g->path,
			                  i, pn);
		uint32_t blck, bsz;
		if (rt_ggml_type_size(t->type, &blck, &bsz) < 0)
			return rt_err_set(err, "%s: tensor '%s' has unknown ggml type %u", g->path, pn,
			                  t->type);
		if (t->ne[0] % blck)
			return rt_err_set(err, "%s: tensor '%s' row length %" PRId64 " is not a multiple "
			                  "of the %s block size %u", g->path, pn, t->ne[0],
			                  rt_ggml_type_name(t->type), blck);
		uint64_t nblocks = nelem / blck;
		if (nblocks > UINT64_MAX / bsz || nblocks * bsz > (uint64_t)SIZE_MAX)
			return rt_err_set(err, "%s: tensor '%s' byte size overflows", g->path, pn);
		t->nbytes = nblocks * bsz;
		if (t->offset % g->alignment)
			return rt_err_set(err, "%s: tensor '%s' offset %" PRIu64 " is not a multiple of "
			                  "the alignment %u", g->path, pn, t->offset, g->alignment);
	}
	return 0;
}

static int cmp_by_offset(const void *a, const void *b, void *arg)
{
	const rt_gguf_tensor *t = arg;
	uint64_t oa = t[*(const uint64_t *)a].offset, ob = t[*(const uint64_t *)b].offset;
	return oa < ob ? -1 : oa > ob;
}

static int place_tensors(rt_gguf *g, uint64_t end_of_infos, rt_err *err)
{
	uint64_t a = g->alignment;
	g->data_start = end_of_infos + (a - end_of_infos % a) % a;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		rt_gguf_tensor *t = &g->tensors[i];
		uint64_t start = g->data_start + t->offset;
		if (t->offset > g->size || start > g->size || t->nbytes > g->size - start) {
			if (t->offset > UINT64_MAX - g->data_start ||
			    start > UINT64_MAX - t->nbytes)
				return rt_err_set(err, "%s: tensor '%s' offset %" PRIu64 " is past end of "
				                  "file (%" PRIu64 " bytes)", g->path, t->name, t->offset,
				                  g->size);
			return rt_err_set(err, "%s: tensor '%s' data ends at byte %" PRIu64 ", past end "
			                  "of file (%" PRIu64 " bytes)", g->path, t->name,
			                  start + t->nbytes, g->size);
		}
		t->data = g->map + start;
	}
	/* no two tensors may share bytes */
	if (g->n_tensors > 1) {
		uint64_t *ord = RT_MALLOC(g->n_tensors * sizeof *ord);
		for (uint64_t i = 0; i < g->n_tensors; i++)
			ord[i] = i;
		qsort_r(ord, g->n_tensors, sizeof *ord, cmp_by_offset, g->tensors);
		for (uint64_t k = 0; k + 1 < g->n_tensors; k++) {
			const rt_gguf_tensor *p = &g->tensors[ord[k]], *q = &g->tensors[ord[k + 1]];
			if (p->offset + p->nbytes > q->offset) {
				rt_err_set(err, "%s: tensors '%s' and '%s' overlap in the data section",
				           g->path, p->name, q->name);
				free(ord);
				return -1;
			}
		}
		free(ord);
	}
	return 0;
}

static int parse(rt_gguf *g, rt_err *err)
{
	cursor c = { g->map, g->size, 0 };
	if (g->size < 4)
		return rt_err_set(err, "%s: truncated in header (%" PRIu64 " bytes)", g->path,
		                  g->size);
	if (memcmp(g->map, "GGUF", 4) != 0)
		return rt_err_set(err, "%s: bad magic (expected GGUF)", g->path);
	c.off = 4;
	if (rd_u32(&c, &g->version) < 0)
		return rt_err_set(err, "%s: truncated in header (%" PRIu64 " bytes)", g->path,
		                  g->size);
	if (g->version != 2 && g->version != 3) {
		if ((g->version & 0xffff) == 0 && (g->version >> 24) >= 1 && (g->version >> 24) <= 3)
			return rt_err_set(err, "%s: big-endian GGUF is not supported", g->path);
		return rt_err_set(err, "%s: unsupported GGUF version %u (expected 3; 2 accepted)",
		                  g->path, g->version);
	}
	if (rd_u64(&c, &g->n_tensors) < 0 || rd_u64(&c, &g->n_kv) < 0)
		return rt_err_set(err, "%s: truncated in header (%" PRIu64 " bytes)", g->path,
		                  g->size);
	if (parse_kvs(g, &c, err) < 0)
		return -1;
	if (parse_alignment(g, err) < 0)
		return -1;
	if (parse_tensor_infos(g, &c, err) < 0)
		return -1;
	return place_tensors(g, c.off, err);
}

/* Parse size bytes at map; on failure the mapping (if owned) and fd are released. */
static rt_gguf *open_common(const char *path, int fd, const void *map, int owns_map,
                            uint64_t size, rt_err *err)
{
	rt_gguf *g = RT_CALLOC(1, sizeof *g);
	size_t pl = strlen(path) + 1;
	g->path = RT_MALLOC(pl);
	memcpy(g->path, path, pl);
	g->fd = fd;
	g->owns_map = owns_map;
	g->map = map;
	g->size = size;
	if (parse(g, err) < 0) {
		rt_gguf_close(g);
		return NULL;
	}
	return g;
}

rt_gguf *rt_gguf_open(const char *path, rt_err *err)
{
	struct stat st;
	int fd = rt_open_stat(path, "cannot open: ", &st, err);
	if (fd < 0)
		return NULL;
	if (!S_ISREG(st.st_mode)) {
		rt_err_set(err, "%s: not a regular file", path);
		close(fd);
		return NULL;
	}
	if (st.st_size == 0) {
		rt_err_set(err, "%s: empty file (expected a GGUF model)", path);
		close(fd);
		return NULL;
	}
	void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rt_err_set(err, "%s: cannot map: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	return open_common(path, fd, map, 1, (uint64_t)st.st_size, err);
}

rt_gguf *rt_gguf_open_mem(const char *name, const void *data, size_t size, rt_err *err)
{
	if (size == 0) {
		rt_err_set(err, "%s: empty file (expected a GGUF model)", name);
		return NULL;
	}
	return open_common(name, -1, data, 0, (uint64_t)size, err);
}

void rt_gguf_close(rt_gguf *g)
{
	if (!g)
		return;
	if (g->kv)
		for (uint64_t i = 0; i < g->n_kv; i++)
			free((void *)g->kv[i].arr_strs);
	free(g->kv);
	free(g->tensors);
	free(g->kv_idx);
	free(g->t_idx);
	if (g->map && g->owns_map)
		munmap((void *)g->map, (size_t)g->size);
	if (g->fd >= 0)
		close(g->fd);
	free(g->path);
	free(g);
}

const char *rt_gguf_path(const rt_gguf *g)
{
	return g->path;
}

uint64_t rt_gguf_file_size(const rt_gguf *g)
{
	return g->size;
}

uint32_t rt_gguf_version(const rt_gguf *g)
{
	return g->version;
}

uint32_t rt_gguf_alignment(const rt_gguf *g)
{
	return g->alignment;
}

uint64_t rt_gguf_data_offset(const rt_gguf *g)
{
	return g->data_start;
}

uint64_t rt_gguf_n_kv(const rt_gguf *g)
{
	return g->n_kv;
}

const rt_gguf_kv *rt_gguf_kv_at(const rt_gguf *g, uint64_t i)
{
	return i < g->n_kv ? &g->kv[i] : NULL;
}

const rt_gguf_kv *rt_gguf_find_kv(const rt_gguf *g, const char *key)
{
	uint64_t i = idx_find(g, g->kv_idx, g->kv_cap, kv_name, key, strlen(key), NULL);
	return i == UINT64_MAX ? NULL : &g->kv[i];
}

static const rt_gguf_kv *need_kv(const rt_gguf *g, const char *key, rt_err *err)
{
	const rt_gguf_kv *kv = rt_gguf_find_kv(g, key);
	if (!kv)
		rt_err_set(err, "%s: key '%s' missing", g->path, key);
	return kv;
}

int rt_gguf_get_u32(const rt_gguf *g, const char *key, uint32_t *out, rt_err *err)
{
	const rt_gguf_kv *kv = need_kv(g, key, err);
	if (!kv)
		return -1;
	switch (kv->type) {
	case RT_GGUF_U8: case RT_GGUF_U16: case RT_GGUF_U32: case RT_GGUF_U64:
		if (kv->v.u64 > UINT32_MAX)
			return rt_err_set(err, "%s: key '%s' value %" PRIu64 " does not fit in u32",
			                  g->path, key, kv->v.u64);
		*out = (uint32_t)kv->v.u64;
		return 0;
	case RT_GGUF_I8: case RT_GGUF_I16: case RT_GGUF_I32: case RT_GGUF_I64:
		if (kv->v.i64 < 0 || kv->v.i64 > (int64_t)UINT32_MAX)
			return rt_err_set(err, "%s: key '%s' value %" PRId64 " does not fit in u32",
			                  g->path, key, kv->v.i64);
		*out = (uint32_t)kv->v.i64;
		return 0;
	default:
		return rt_err_set(err, "%s: key '%s' has type %s, expected an integer", g->path, key,
		                  vtype_name(kv->type));
	}
}

int rt_gguf_get_f32(const rt_gguf *g, const char *key, float *out, rt_err *err)
{
	const rt_gguf_kv *kv = need_kv(g, key, err);
	if (!kv)
		return -1;
	if (kv->type != RT_GGUF_F32 && kv->type != RT_GGUF_F64)
		return rt_err_set(err, "%s: key '%s' has type %s, expected a float", g->path, key,
		                  vtype_name(kv->type));
	*out = (float)kv->v.f64;
	return 0;
}

int rt_gguf_get_str(const rt_gguf *g, const char *key, rt_gguf_str *out, rt_err *err)
{
	const rt_gguf_kv *kv = need_kv(g, key, err);
	if (!kv)
		return -1;
	if (kv->type != RT_GGUF_STRING)
		return rt_err_set(err, "%s: key '%s' has type %s, expected a string", g->path, key,
		                  vtype_name(kv->type));
	*out = kv->v.str;
	return 0;
}

uint64_t rt_gguf_n_tensors(const rt_gguf *g)
{
	return g->n_tensors;
}

const rt_gguf_tensor *rt_gguf_tensor_at(const rt_gguf *g, uint64_t i)
{
	return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const rt_gguf_tensor *rt_gguf_find_tensor(const rt_gguf *g, const char *name)
{
	uint64_t i = idx_find(g, g->t_idx, g->t_cap, t_name, name, strlen(name), NULL);
	return i == UINT64_MAX ? NULL : &g->tensors[i];
}

const char *rt_gguf_vtype_name(uint32_t type)
{
	return vtype_name(type);
}

rt_gguf_str rt_gguf_arr_str(const rt_gguf_kv *kv, uint64_t i)
{
	rt_gguf_str none = { NULL, 0 };
	if (kv->type != RT_GGUF_ARRAY || kv->arr_type != RT_GGUF_STRING || i >= kv->arr_n)
		return none;
	return kv->arr_strs[i];
}
