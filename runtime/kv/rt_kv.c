/*
 * rt_kv: the ragged per-(layer, KV head) KV store on blocks of the process's pool; see
 * rt_kv.h. Each per-entry array of each list is a page-aligned span of one reserved
 * mapping; blocks are committed by writing and decommitted with madvise.
 */
#include "kv/rt_kv.h"
#include "kv/rt_kvq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Largest address space one store may reserve (a guard against absurd capacities). */
#define KV_MAX_RESERVE ((size_t)1 << 40)

/* The per-entry arrays of a list, in layout order. */
enum { A_K, A_V, A_POS, A_COUNT, A_LOGC, A_SPAN, A_STATS, A_N };

static size_t page_size(void)
{
	static size_t ps;
	if (!ps) {
		long v = sysconf(_SC_PAGESIZE);
		ps = v > 0 ? (size_t)v : 4096;
	}
	return ps;
}

static size_t page_up(size_t n)
{
	size_t ps = page_size();
	return (n + ps - 1) / ps * ps;
}

/* Bytes per entry of array a. */
static size_t elem_bytes(const rt_kv *kv, int a)
{
	switch (a) {
	case A_K:
	case A_V: return kv->row_bytes;
	case A_POS: return sizeof(int32_t);
	case A_COUNT:
	case A_LOGC: return sizeof(float);
	case A_SPAN: return sizeof(uint16_t);
	default: return kv->stat_bytes;
	}
}

static uint8_t *array_base(const rt_kv_head *h, int a)
{
	void *p[A_N] = { h->kr, h->vr, h->pos, h->count, h->log_count, h->span, h->stats };
	return p[a];
}

int32_t rt_kv_blocks_for(int32_t n)
{
	return n <= 0 ? 0 : (n - 1) / RT_KV_BLOCK + 1;
}

/* ORDER RT_KV_TYPE */
static const char *const type_names[RT_KV_N_TYPE] = { "f32", "f16", "q8_0" };
static const rt_kvq_kind type_kind[RT_KV_N_TYPE] = { RT_KVQ_F32, RT_KVQ_F16, RT_KVQ_Q8_0 };

const char *rt_kv_type_name(enum rt_kv_type t)
{
	return (unsigned)t < RT_KV_N_TYPE ? type_names[t] : "?";
}

int rt_kv_type_parse(const char *name)
{
	for (int t = 0; t < RT_KV_N_TYPE; t++)
		if (strcmp(name, type_names[t]) == 0)
			return t;
	return -1;
}

size_t rt_kv_row_bytes(enum rt_kv_type t, int head_dim)
{
	if ((unsigned)t >= RT_KV_N_TYPE || head_dim <= 0 ||
	    (t == RT_KV_Q8_0 && head_dim % RT_KVQ_VGROUP != 0))
		return 0;
	return rt_kvq_vrow_bytes(type_kind[t], head_dim);
}

int rt_kv_init(rt_kv *kv, int n_layer, int n_kv_head, int group, int head_dim, int32_t cap,
               size_t stat_bytes, size_t state_bytes, rt_err *err)
{
	return rt_kv_init_pool(kv, rt_kvpool_process(), n_layer, n_kv_head, group, head_dim, cap,
	                       stat_bytes, state_bytes, err);
}

int rt_kv_init_pool(rt_kv *kv, rt_kvpool *pool, int n_layer, int n_kv_head, int group,
                    int head_dim, int32_t cap, size_t stat_bytes, size_t state_bytes,
                    rt_err *err)
{
	return rt_kv_init_typed(kv, pool, RT_KV_F32, n_layer, n_kv_head, group, head_dim, cap,
	                        stat_bytes, state_bytes, err);
}

int rt_kv_init_typed(rt_kv *kv, rt_kvpool *pool, enum rt_kv_type type, int n_layer,
                     int n_kv_head, int group, int head_dim, int32_t cap, size_t stat_bytes,
                     size_t state_bytes, rt_err *err)
{
	memset(kv, 0, sizeof *kv);
	if (!pool)
		pool = rt_kvpool_process();
	if ((unsigned)type >= RT_KV_N_TYPE)
		return rt_err_set(err, "kv: unknown element type %d", (int)type);
	if (n_layer <= 0 || n_kv_head <= 0 || group <= 0 || head_dim <= 0 || cap <= 0)
		return rt_err_set(err, "kv: invalid shape (layers %d, kv heads %d, group %d, head_dim %d, capacity %d)",
		                  n_layer, n_kv_head, group, head_dim, (int)cap);
	if (head_dim > 65536 || stat_bytes > 65536 || state_bytes > ((size_t)1 << 30))
		return rt_err_set(err, "kv: head_dim %d, %zu statistics bytes or %zu state bytes too large",
		                  head_dim, stat_bytes, state_bytes);
	kv->n_layer = n_layer;
	kv->n_kv_head = n_kv_head;
	kv->group = group;
	kv->head_dim = head_dim;
	kv->cap = cap;
	kv->stat_bytes = stat_bytes;
	kv->state_bytes = state_bytes;
	kv->type = type;
	kv->row_bytes = rt_kv_row_bytes(type, head_dim);
	if (kv->row_bytes == 0) {
		memset(kv, 0, sizeof *kv);
		return rt_err_set(err, "kv: head_dim %d is not a multiple of %d, which %s needs",
		                  head_dim, RT_KVQ_VGROUP, rt_kv_type_name(type));
	}
	kv->pool = pool;
	kv->block_bytes = (int64_t)(RT_KV_BLOCK * rt_kv_entry_bytes(kv));
	const size_t nh = (size_t)n_layer * (size_t)n_kv_head;
	const size_t capr = (size_t)rt_kv_blocks_for(cap) * RT_KV_BLOCK;
	size_t hb = 0;
	for (int a = 0; a < A_N; a++) {
		size_t eb = elem_bytes(kv, a);
		if (eb && capr > KV_MAX_RESERVE / eb)
			hb = KV_MAX_RESERVE + 1;
		else
			hb += page_up(capr * eb);
	}
	if (hb > KV_MAX_RESERVE || nh > KV_MAX_RESERVE / hb) {
		memset(kv, 0, sizeof *kv);
		return rt_err_set(err, "kv: capacity %d entries per head is too large", (int)cap);
	}
	const size_t total = nh * hb, sb = (state_bytes + 63) & ~(size_t)63;
	kv->meta = calloc(1, nh * sizeof(rt_kv_head) + 64 + nh * sb);
	void *mem = mmap(NULL, total, PROT_READ | PROT_WRITE,
	                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (!kv->meta || mem == MAP_FAILED) {
		free(kv->meta);
		if (mem != MAP_FAILED)
			munmap(mem, total);
		memset(kv, 0, sizeof *kv);
		return rt_err_set(err, "kv: cannot reserve %zu bytes for %d entries per head", total,
		                  (int)cap);
	}
	kv->mem = mem;
	kv->mem_bytes = total;
	kv->heads = kv->meta;
	uint8_t *st = (uint8_t *)(((uintptr_t)(kv->heads + nh) + 63) & ~(uintptr_t)63);
	uint8_t *p = mem;
	for (size_t i = 0; i < nh; i++) {
		rt_kv_head *h = &kv->heads[i];
		void **arr[A_N] = { (void **)&h->kr, (void **)&h->vr, (void **)&h->pos,
		                    (void **)&h->count, (void **)&h->log_count, (void **)&h->span,
		                    (void **)&h->stats };
		h->cap = cap;
		for (int a = 0; a < A_N; a++) {
			*arr[a] = p;
			p += page_up(capr * elem_bytes(kv, a));
		}
		h->state = st + i * sb;
		if (type == RT_KV_F32) {
			h->k = (float *)(void *)h->kr;
			h->v = (float *)(void *)h->vr;
		}
	}
	RT_ASSERT((size_t)(p - (uint8_t *)mem) == total);
	return 0;
}

/* Hand the pages of list h past its first keep blocks back to the operating system. */
static void head_unmap(rt_kv *kv, rt_kv_head *h, int32_t keep)
{
	if (h->nb_mapped <= keep)
		return;
	for (int a = 0; a < A_N; a++) {
		size_t eb = elem_bytes(kv, a);
		size_t from = page_up((size_t)keep * RT_KV_BLOCK * eb);
		size_t to = page_up((size_t)h->nb_mapped * RT_KV_BLOCK * eb);
		if (eb && to > from)
			madvise(array_base(h, a) + from, to - from, MADV_DONTNEED);
	}
	h->nb_mapped = keep;
}

/* List h keeps blocks for its n entries and returns the rest. */
static void head_trim(rt_kv *kv, rt_kv_head *h)
{
	int32_t need = rt_kv_blocks_for(h->n);
	RT_ASSERT(need <= h->nb);
	if (need < h->nb) {
		rt_kvpool_give(kv->pool, h->nb - need, kv->block_bytes);
		kv->blocks -= h->nb - need;
		h->nb = need;
	}
	if (h->nb_mapped > h->nb + 1)
		head_unmap(kv, h, h->nb + 1);
}

void rt_kv_free(rt_kv *kv)
{
	if (kv->pool && kv->blocks)
		rt_kvpool_give(kv->pool, kv->blocks, kv->block_bytes);
	if (kv->mem)
		munmap(kv->mem, kv->mem_bytes);
	free(kv->meta);
	memset(kv, 0, sizeof *kv);
}

void rt_kv_reset(rt_kv *kv)
{
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++) {
		rt_kv_head *h = &kv->heads[i];
		h->n = 0;
		head_trim(kv, h);
		head_unmap(kv, h, 0);
		if (kv->state_bytes)
			memset(h->state, 0, kv->state_bytes);
	}
	kv->blocks_peak = 0;
}

rt_kv_head *rt_kv_head_at(rt_kv *kv, int layer, int kv_head)
{
	RT_ASSERT(layer >= 0 && layer < kv->n_layer && kv_head >= 0 && kv_head < kv->n_kv_head);
	return &kv->heads[layer * kv->n_kv_head + kv_head];
}

static void blocks_taken(rt_kv *kv, int64_t n)
{
	kv->blocks += n;
	if (kv->blocks > kv->blocks_peak)
		kv->blocks_peak = kv->blocks;
}

int rt_kv_reserve(rt_kv *kv, int32_t add, rt_err *err)
{
	RT_ASSERT(add >= 0);
	const int nh = kv->n_layer * kv->n_kv_head;
	int64_t need = 0;
	for (int i = 0; i < nh; i++) {
		const rt_kv_head *h = &kv->heads[i];
		if ((int64_t)h->n + add > h->cap)
			return rt_err_setc(err, RT_ERR_RESOURCE,
			                  "KV cache full: layer %d kv head %d holds %d entries, %d more "
			                  "exceed the capacity %d",
			                  i / kv->n_kv_head, i % kv->n_kv_head, (int)h->n, (int)add,
			                  (int)h->cap);
		int32_t nb = rt_kv_blocks_for(h->n + add);
		need += nb > h->nb ? nb - h->nb : 0;
	}
	if (need == 0)
		return 0;
	if (rt_kvpool_take(kv->pool, need, kv->block_bytes) != 0) {
		rt_kvpool_stats ps = rt_kvpool_get(kv->pool);
		return rt_err_setc(err, RT_ERR_RESOURCE,
		                  "KV pool exhausted: %lld more blocks (%lld bytes) needed, %lld of "
		                  "%lld bytes in use",
		                  (long long)need, (long long)(need * kv->block_bytes),
		                  (long long)ps.used, (long long)ps.limit);
	}
	for (int i = 0; i < nh; i++) {
		rt_kv_head *h = &kv->heads[i];
		int32_t nb = rt_kv_blocks_for(h->n + add);
		if (nb > h->nb) {
			h->nb = nb;
			if (h->nb_mapped < nb)
				h->nb_mapped = nb;
		}
	}
	blocks_taken(kv, need);
	return 0;
}

int32_t rt_kv_append(rt_kv *kv, rt_kv_head *h, const float *k, const float *v, int32_t pos)
{
	RT_ASSERT(h->n < h->cap);
	if (h->n >= h->nb * RT_KV_BLOCK) {
		if (rt_kvpool_take(kv->pool, 1, kv->block_bytes) != 0)
			rt_assert_fail("KV pool grants a block to an append without a reservation",
			               __FILE__, __LINE__);
		h->nb++;
		if (h->nb_mapped < h->nb)
			h->nb_mapped = h->nb;
		blocks_taken(kv, 1);
	}
	int32_t i = h->n++;
	rt_kv_set_key(kv, h, i, k);
	rt_kv_set_value(kv, h, i, v);
	h->pos[i] = pos;
	h->count[i] = 1.0f;
	h->log_count[i] = 0.0f;
	h->span[i] = 0;
	if (kv->stat_bytes)
		memset(h->stats + (size_t)i * kv->stat_bytes, 0, kv->stat_bytes);
	return i;
}

static const float *row_get(const rt_kv *kv, const uint8_t *row, float *buf)
{
	if (kv->type == RT_KV_F32)
		return (const float *)(const void *)row;
	rt_kvq_vrow_decode(type_kind[kv->type], row, kv->head_dim, buf);
	return buf;
}

const float *rt_kv_key(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *buf)
{
	RT_ASSERT(i >= 0 && i < h->n);
	return row_get(kv, h->kr + (size_t)i * kv->row_bytes, buf);
}

const float *rt_kv_value(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *buf)
{
	RT_ASSERT(i >= 0 && i < h->n);
	return row_get(kv, h->vr + (size_t)i * kv->row_bytes, buf);
}

void rt_kv_set_key(const rt_kv *kv, rt_kv_head *h, int32_t i, const float *x)
{
	RT_ASSERT(i >= 0 && i < h->n);
	rt_kvq_vrow_encode(type_kind[kv->type], x, kv->head_dim, h->kr + (size_t)i * kv->row_bytes);
}

void rt_kv_set_value(const rt_kv *kv, rt_kv_head *h, int32_t i, const float *x)
{
	RT_ASSERT(i >= 0 && i < h->n);
	rt_kvq_vrow_encode(type_kind[kv->type], x, kv->head_dim, h->vr + (size_t)i * kv->row_bytes);
}

void rt_kv_rows_decode(const rt_kv *kv, const uint8_t *rows, int32_t n, float *out)
{
	const size_t hd = (size_t)kv->head_dim, rb = kv->row_bytes;
	if (kv->type == RT_KV_F32) {
		memcpy(out, rows, (size_t)n * rb);
		return;
	}
	for (int32_t i = 0; i < n; i++)
		rt_kvq_vrow_decode(type_kind[kv->type], rows + (size_t)i * rb, (int)hd, out + (size_t)i * hd);
}

/* Copy every per-entry array of entry src over entry dst. */
static void entry_move(const rt_kv *kv, rt_kv_head *h, int32_t dst, int32_t src)
{
	const size_t rb = kv->row_bytes, sb = kv->stat_bytes;
	memcpy(h->kr + (size_t)dst * rb, h->kr + (size_t)src * rb, rb);
	memcpy(h->vr + (size_t)dst * rb, h->vr + (size_t)src * rb, rb);
	h->pos[dst] = h->pos[src];
	h->count[dst] = h->count[src];
	h->log_count[dst] = h->log_count[src];
	h->span[dst] = h->span[src];
	if (sb)
		memcpy(h->stats + (size_t)dst * sb, h->stats + (size_t)src * sb, sb);
}

void rt_kv_head_keep(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep)
{
	RT_ASSERT(n_keep >= 0 && n_keep <= h->n);
	for (int32_t j = 0; j < n_keep; j++) {
		int32_t i = keep[j];
		RT_ASSERT(i >= j && i < h->n && (j == 0 || i > keep[j - 1]));
		/* i > j always, so a forward gather never overwrites an entry still to be read */
		if (i != j)
			entry_move(kv, h, j, i);
	}
	h->n = n_keep;
	head_trim(kv, h);
}

int32_t rt_kv_head_evict(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep)
{
	RT_ASSERT(n_keep >= 0 && n_keep <= h->n);
	int32_t t = 0; /* keep[0..t) are below n_keep and stay; keep[t..n_keep) fill the holes */
	for (int32_t j = 0; j < n_keep; j++) {
		RT_ASSERT(keep[j] >= 0 && keep[j] < h->n && (j == 0 || keep[j] > keep[j - 1]));
		t += keep[j] < n_keep;
	}
	int32_t src = t, k = 0, moves = 0;
	for (int32_t i = 0; src < n_keep; i++) {
		RT_ASSERT(i < n_keep);
		if (k < t && keep[k] == i) {
			k++;
			continue;
		}
		entry_move(kv, h, i, keep[src++]);
		moves++;
	}
	h->n = n_keep;
	head_trim(kv, h);
	return moves;
}

void rt_kv_trim(rt_kv *kv)
{
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		head_trim(kv, &kv->heads[i]);
}

size_t rt_kv_entry_bytes(const rt_kv *kv)
{
	return 2 * kv->row_bytes + sizeof(int32_t) + 2 * sizeof(float) + sizeof(uint16_t) +
	       kv->stat_bytes;
}

int64_t rt_kv_entries(const rt_kv *kv)
{
	int64_t n = 0;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		n += kv->heads[i].n;
	return n;
}

int64_t rt_kv_bytes_used(const rt_kv *kv)
{
	return rt_kv_entries(kv) * (int64_t)rt_kv_entry_bytes(kv);
}

int64_t rt_kv_bytes_held(const rt_kv *kv)
{
	return kv->blocks * kv->block_bytes;
}

int64_t rt_kv_bytes_peak(const rt_kv *kv)
{
	return kv->blocks_peak * kv->block_bytes;
}
