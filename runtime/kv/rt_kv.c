/*
 * rt_kv: the ragged per-(layer, KV head) KV store on blocks of the process's pool; see
 * rt_kv.h. Each per-entry array of each list is a page-aligned span of one reserved
 * mapping; blocks are committed by writing and decommitted with madvise.
 */
#include "kv/rt_kv.h"
#include "kv/rt_kvq.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Largest address space one store may reserve (a guard against absurd capacities). */
#define KV_MAX_RESERVE ((size_t)1 << 40)

/* The per-entry arrays of a list, in layout order (A_K, A_V: untiered stores only; A_TIER,
 * A_SLOT, A_KGRP: tiered stores only; an array a store does not have has 0 bytes per entry). */
enum { A_K, A_V, A_POS, A_COUNT, A_LOGC, A_SPAN, A_STATS, A_TIER, A_SLOT, A_KGRP, A_N };

/* A head's arenas: the tiers' row arenas, then the key-group table (RT_KV_KGROUPS). */
#define N_ARENA (RT_KV_N_TIER + 1)

/* Widest head a tiered store takes (the row buffers of a downgrade live on the stack). */
#define KV_TIER_MAX_DIM 1024

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
	case A_V: return kv->tiered ? 0 : kv->row_bytes;
	case A_TIER: return kv->tiered ? 1 : 0;
	case A_SLOT:
	case A_KGRP: return kv->tiered ? sizeof(int32_t) : 0;
	case A_POS: return sizeof(int32_t);
	case A_COUNT:
	case A_LOGC: return sizeof(float);
	case A_SPAN: return sizeof(uint16_t);
	default: return kv->stat_bytes;
	}
}

static uint8_t *array_base(const rt_kv_head *h, int a)
{
	void *p[A_N] = { h->kr, h->vr, h->pos, h->count, h->log_count, h->span, h->stats,
		         h->tier, h->slot, h->kgrp };
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
	return rt_name_index(type_names, RT_KV_N_TYPE, name);
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

/* ORDER RT_KV_TIER */
static const char *const tier_names[RT_KV_N_TIER] = { "top", "q8", "k8v4", "q4", "q2" };
/* codecs of the quantised tiers' value rows and key codes ([0]: unused, the store's type);
 * the 2-bit tier keeps 4-bit keys (rt_kv.h) */
static const rt_kvq_kind tier_vkind[RT_KV_N_TIER] = { RT_KVQ_F32, RT_KVQ_Q8, RT_KVQ_Q4,
	                                              RT_KVQ_Q4, RT_KVQ_Q2 };
static const rt_kvq_kind tier_kkind[RT_KV_N_TIER] = { RT_KVQ_F32, RT_KVQ_Q8, RT_KVQ_Q8,
	                                              RT_KVQ_Q4, RT_KVQ_Q4 };

const char *rt_kv_tier_name(int t)
{
	return (unsigned)t < RT_KV_N_TIER ? tier_names[t] : "?";
}

int rt_kv_tier_parse(const char *name)
{
	return rt_name_index(tier_names, RT_KV_N_TIER, name);
}

/* The codec of tier t's key (value == 0) or value rows (tier 0: the store's type). */
static rt_kvq_kind tier_kind(const rt_kv *kv, int t, int value)
{
	if (t == RT_KV_TIER_TOP)
		return type_kind[kv->type];
	return value ? tier_vkind[t] : tier_kkind[t];
}

int rt_kv_tier_codec(const rt_kv *kv, int t, int value)
{
	RT_ASSERT(kv->tiered && t >= 0 && t < RT_KV_N_TIER);
	return (int)tier_kind(kv, t, value);
}

/* Bytes of one slot of arena t (without its owner index): a key row and a value row at
 * tier t, or a key group's range (t == RT_KV_KGROUPS). */
static size_t arena_slot_bytes(const rt_kv *kv, int t)
{
	return t == RT_KV_KGROUPS ? kv->kgroup_bytes : 2 * kv->tier_row[t];
}

/* Bytes of one block of arena t: RT_KV_BLOCK slots and their owner indices. */
static int64_t arena_block_bytes(const rt_kv *kv, int t)
{
	return (int64_t)RT_KV_BLOCK * (int64_t)(arena_slot_bytes(kv, t) + sizeof(int32_t));
}

/* Bytes of one block of a list's per-entry arrays. */
static int64_t list_block_bytes(const rt_kv *kv)
{
	return kv->tiered ? (int64_t)RT_KV_BLOCK * (int64_t)kv->meta_bytes : kv->block_bytes;
}

/* Address space of one head: the list's arrays, then (tiered) each arena's rows and owners. */
static size_t head_span_bytes(const rt_kv *kv, size_t capr)
{
	size_t hb = 0;
	for (int a = 0; a < A_N; a++) {
		size_t eb = elem_bytes(kv, a);
		if (eb && capr > KV_MAX_RESERVE / eb)
			return KV_MAX_RESERVE + 1;
		hb += page_up(capr * eb);
	}
	for (int t = 0; kv->tiered && t < N_ARENA; t++)
		hb += page_up(capr * arena_slot_bytes(kv, t)) + page_up(capr * sizeof(int32_t));
	return hb;
}

/* Point head h's arrays into its span at p; returns the end of the span. */
static uint8_t *head_place(rt_kv *kv, rt_kv_head *h, uint8_t *p, size_t capr)
{
	void **arr[A_N] = { (void **)&h->kr, (void **)&h->vr, (void **)&h->pos,
		            (void **)&h->count, (void **)&h->log_count, (void **)&h->span,
		            (void **)&h->stats, (void **)&h->tier, (void **)&h->slot,
		            (void **)&h->kgrp };
	for (int a = 0; a < A_N; a++) {
		size_t eb = elem_bytes(kv, a);
		*arr[a] = eb ? p : NULL;
		p += page_up(capr * eb);
	}
	for (int t = 0; kv->tiered && t < N_ARENA; t++) {
		h->arena[t].rows = p;
		p += page_up(capr * arena_slot_bytes(kv, t));
		h->arena[t].owner = (int32_t *)(void *)p;
		p += page_up(capr * sizeof(int32_t));
	}
	if (kv->type == RT_KV_F32 && !kv->tiered) {
		h->k = (float *)(void *)h->kr;
		h->v = (float *)(void *)h->vr;
	}
	return p;
}

/* The shared part of rt_kv_init_typed and rt_kv_init_tiered (kv->tiered and, when tiered,
 * kv->tier_row set by the caller). */
static int kv_init(rt_kv *kv, rt_kvpool *pool, enum rt_kv_type type, int n_layer,
                   int n_kv_head, int group, int head_dim, int32_t cap, size_t stat_bytes,
                   size_t state_bytes, rt_err *err)
{
	kv->n_layer = n_layer;
	kv->n_kv_head = n_kv_head;
	kv->group = group;
	kv->head_dim = head_dim;
	kv->cap = cap;
	kv->stat_bytes = stat_bytes;
	kv->state_bytes = state_bytes;
	kv->type = type;
	kv->row_bytes = rt_kv_row_bytes(type, head_dim);
	kv->pool = pool;
	kv->meta_bytes = sizeof(int32_t) + 2 * sizeof(float) + sizeof(uint16_t) + stat_bytes +
	                 (kv->tiered ? 1 + 2 * sizeof(int32_t) : 0);
	kv->block_bytes = (int64_t)(RT_KV_BLOCK * rt_kv_entry_bytes(kv));
	const size_t nh = (size_t)n_layer * (size_t)n_kv_head;
	const size_t capr = (size_t)rt_kv_blocks_for(cap) * RT_KV_BLOCK;
	size_t hb = head_span_bytes(kv, capr);
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
		h->cap = cap;
		p = head_place(kv, h, p, capr);
		h->state = st + i * sb;
	}
	RT_ASSERT((size_t)(p - (uint8_t *)mem) == total);
	return 0;
}

/* The checks every store's parameters pass; 0, or -1 with err (kv zeroed). */
static int kv_check(rt_kv *kv, enum rt_kv_type type, int n_layer, int n_kv_head, int group,
                    int head_dim, int32_t cap, size_t stat_bytes, size_t state_bytes,
                    rt_err *err)
{
	memset(kv, 0, sizeof *kv);
	if ((unsigned)type >= RT_KV_N_TYPE)
		return rt_err_set(err, "kv: unknown element type %d", (int)type);
	if (n_layer <= 0 || n_kv_head <= 0 || group <= 0 || head_dim <= 0 || cap <= 0)
		return rt_err_set(err, "kv: invalid shape (layers %d, kv heads %d, group %d, head_dim %d, capacity %d)",
		                  n_layer, n_kv_head, group, head_dim, (int)cap);
	if (head_dim > 65536 || stat_bytes > 65536 || state_bytes > ((size_t)1 << 30))
		return rt_err_set(err, "kv: head_dim %d, %zu statistics bytes or %zu state bytes too large",
		                  head_dim, stat_bytes, state_bytes);
	if (rt_kv_row_bytes(type, head_dim) == 0)
		return rt_err_set(err, "kv: head_dim %d is not a multiple of %d, which %s needs",
		                  head_dim, RT_KVQ_VGROUP, rt_kv_type_name(type));
	return 0;
}

/* A tiered store's checks and per-tier row sizes (before kv_init, which lays them out). */
static int kv_tiers_setup(rt_kv *kv, enum rt_kv_type top, int head_dim, rt_err *err)
{
	if (top != RT_KV_F16 && top != RT_KV_F32)
		return rt_err_set(err, "kv: tiered store: the top tier is f16 or f32, not %s",
		                  rt_kv_type_name(top));
	if (head_dim % RT_KVQ_VGROUP != 0 || head_dim > KV_TIER_MAX_DIM)
		return rt_err_set(err, "kv: tiered store: head_dim %d is not a multiple of %d up to %d, "
		                  "which the q8/q4/q2 tiers need", head_dim, RT_KVQ_VGROUP,
		                  KV_TIER_MAX_DIM);
	kv->tiered = 1;
	kv->type = top;
	kv->kgroup_bytes = 4 * (size_t)head_dim;
	for (int t = 0; t < RT_KV_N_TIER; t++) {
		kv->tier_krow[t] = t == RT_KV_TIER_TOP ? rt_kvq_vrow_bytes(tier_kind(kv, t, 0), head_dim)
		                                       : rt_kvq_kcodes_bytes(tier_kind(kv, t, 0), head_dim);
		kv->tier_vrow[t] = rt_kvq_vrow_bytes(tier_kind(kv, t, 1), head_dim);
		/* both are whole groups of even byte counts, so the mean is exact */
		kv->tier_row[t] = (kv->tier_krow[t] + kv->tier_vrow[t]) / 2;
	}
	return 0;
}

/* Both constructors: the shape's checks, the tiers' (tiered), then the layout. */
static int kv_open(rt_kv *kv, rt_kvpool *pool, enum rt_kv_type type, int tiered, int n_layer,
                   int n_kv_head, int group, int head_dim, int32_t cap, size_t stat_bytes,
                   size_t state_bytes, rt_err *err)
{
	if (kv_check(kv, type, n_layer, n_kv_head, group, head_dim, cap, stat_bytes, state_bytes,
	             err) != 0)
		return -1;
	if (tiered && kv_tiers_setup(kv, type, head_dim, err) != 0)
		return -1;
	return kv_init(kv, pool ? pool : rt_kvpool_process(), type, n_layer, n_kv_head, group,
	               head_dim, cap, stat_bytes, state_bytes, err);
}

int rt_kv_init_typed(rt_kv *kv, rt_kvpool *pool, enum rt_kv_type type, int n_layer,
                     int n_kv_head, int group, int head_dim, int32_t cap, size_t stat_bytes,
                     size_t state_bytes, rt_err *err)
{
	return kv_open(kv, pool, type, 0, n_layer, n_kv_head, group, head_dim, cap, stat_bytes,
	               state_bytes, err);
}

int rt_kv_init_tiered(rt_kv *kv, rt_kvpool *pool, enum rt_kv_type top, int n_layer,
                      int n_kv_head, int group, int head_dim, int32_t cap, size_t stat_bytes,
                      size_t state_bytes, rt_err *err)
{
	return kv_open(kv, pool, top, 1, n_layer, n_kv_head, group, head_dim, cap, stat_bytes,
	               state_bytes, err);
}

int rt_kv_set_rotation(rt_kv *kv, int keys, int values, rt_err *err)
{
	if (!kv->tiered)
		return rt_err_set(err, "kv: rotate hadamard needs a tiered store (rt_kv_init_tiered)");
	const int d = kv->head_dim;
	if ((keys || values) && (d & (d - 1)) != 0)
		return rt_err_set(err, "kv: rotate hadamard needs a power-of-two head_dim, not %d", d);
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		for (int t = RT_KV_TIER_TOP + 1; t < RT_KV_N_TIER; t++)
			if (kv->heads[i].arena[t].n)
				return rt_err_set(err, "kv: rotation set after entries were quantised");
	kv->rot_keys = keys != 0;
	kv->rot_values = values != 0;
	return 0;
}

/* x rotated into y (y = H·x; x == y allowed) when on, else copied; returns y. */
static float *rot_copy(const rt_kv *kv, int on, const float *x, float *y)
{
	if (x != y)
		memcpy(y, x, (size_t)kv->head_dim * sizeof *y);
	if (on)
		rt_kvq_rotate(y, kv->head_dim);
	return y;
}

/* ---- block accounting ----------------------------------------------------------------- */

static int blocks_take(rt_kv *kv, int64_t n, int64_t bb)
{
	if (n == 0)
		return 0;
	if (rt_kvpool_take(kv->pool, n, bb) != 0)
		return -1;
	atomic_fetch_add(&kv->blocks, n);
	/* the value after this thread's addition, whatever other threads add meanwhile (clang
	 * refuses to read an _Atomic compound assignment's result as a plain int64_t) */
	int64_t now = atomic_fetch_add(&kv->bytes, n * bb) + n * bb, pk = kv->bytes_peak;
	while (now > pk && !atomic_compare_exchange_weak(&kv->bytes_peak, &pk, now))
		;
	return 0;
}

static void blocks_give(rt_kv *kv, int64_t n, int64_t bb)
{
	if (n == 0)
		return;
	rt_kvpool_give(kv->pool, n, bb);
	atomic_fetch_sub(&kv->blocks, n);
	atomic_fetch_sub(&kv->bytes, n * bb);
}

/* Take a block the caller did not reserve; asserts the pool grants it. */
static void block_take_or_die(rt_kv *kv, int64_t bb)
{
	if (blocks_take(kv, 1, bb) != 0)
		rt_assert_fail("KV pool grants a block to an append without a reservation", __FILE__,
		               __LINE__);
}

/* ---- shared prefixes (rt_kv.h, "Shared prefixes") --------------------------------------- */

struct rt_kv_prefix {
	int fd;                  /* the memory file: per list, n key rows then n value rows */
	int32_t n;               /* entries per list */
	int n_layer, n_kv_head;
	size_t row_bytes;
	rt_kvpool *pool;
	_Atomic int64_t refs;    /* the owner's reference and one per sharing list */
	_Atomic int64_t lists;   /* lists sharing it */
	/* what a fork copies (rt_kv_prefix_fork), NULL when the maker's lists held different
	 * entry counts: per list, the m entries' positions, counts, log counts, spans and
	 * statistics, the key rows then the value rows of entries [n, m) (not in the memory
	 * file: they do not fill a page), then the list's policy state (meta_list bytes) */
	uint8_t *meta;
	int32_t m;               /* entries every list of the maker held (>= n) */
	size_t stat_bytes, state_bytes;
};

/* The per-entry arrays a fork copies whole (every array of an untiered list but the rows). */
enum { A_META0 = A_POS, A_META1 = A_STATS + 1 };

/* Bytes of one list's snapshot in rt_kv_prefix.meta (m entries, rows from n). */
static size_t meta_list(const rt_kv *kv, int32_t n, int32_t m)
{
	size_t b = kv->state_bytes + 2 * (size_t)(m - n) * kv->row_bytes;
	for (int a = A_META0; a < A_META1; a++)
		b += (size_t)m * elem_bytes(kv, a);
	return b;
}

/* Copy between list h and its snapshot s (to_list 1: into the list): the first m entries'
 * metadata, the rows of entries [n, m), the policy state. */
static void meta_copy(const rt_kv *kv, rt_kv_head *h, uint8_t *s, int32_t n, int32_t m,
                      int to_list)
{
	const size_t rb = kv->row_bytes, tail = (size_t)(m - n) * rb;
	uint8_t *at[A_META1 - A_META0 + 3]; /* the arrays, the two row tails, the state */
	size_t len[A_META1 - A_META0 + 3];
	int k = 0;
	for (int a = A_META0; a < A_META1; a++, k++)
		at[k] = array_base(h, a), len[k] = (size_t)m * elem_bytes(kv, a);
	at[k] = h->kr + (size_t)n * rb, len[k++] = tail;
	at[k] = h->vr + (size_t)n * rb, len[k++] = tail;
	at[k] = h->state, len[k++] = kv->state_bytes;
	for (int i = 0; i < k; s += len[i++])
		if (len[i])
			memcpy(to_list ? at[i] : s, to_list ? s : at[i], len[i]);
}

static int64_t gcd64(int64_t a, int64_t b)
{
	while (b) {
		int64_t t = a % b;
		a = b, b = t;
	}
	return a;
}

int32_t rt_kv_prefix_unit(const rt_kv *kv)
{
	if (kv->tiered || !kv->row_bytes)
		return 0;
	const int64_t ps = (int64_t)page_size(), rb = (int64_t)kv->row_bytes;
	const int64_t per_page = ps / gcd64(ps, rb); /* entries whose rows fill whole pages */
	const int64_t u = per_page / gcd64(per_page, RT_KV_BLOCK) * RT_KV_BLOCK;
	return u <= 4096 ? (int32_t)u : 0;
}

int32_t rt_kv_prefix_len(const rt_kv_prefix *px)
{
	return px->n;
}

int64_t rt_kv_prefix_bytes(const rt_kv_prefix *px)
{
	return (int64_t)px->n_layer * px->n_kv_head * px->n * 2 * (int64_t)px->row_bytes;
}

int64_t rt_kv_prefix_lists(const rt_kv_prefix *px)
{
	return atomic_load(&px->lists);
}

void rt_kv_prefix_unref(rt_kv_prefix *px)
{
	if (!px || atomic_fetch_sub(&px->refs, 1) != 1)
		return;
	const int64_t nh = (int64_t)px->n_layer * px->n_kv_head;
	rt_kvpool_adjust(px->pool, -nh * (px->n / RT_KV_BLOCK), -rt_kv_prefix_bytes(px));
	close(px->fd);
	free(px->meta);
	free(px);
}

/* The pool's side of list h sharing (+1) or no longer sharing (-1) px: its own copy's
 * blocks and bytes leave the pool or come back. */
static void share_count(const rt_kv *kv, rt_kv_prefix *px, int sign)
{
	const int64_t sb = px->n / RT_KV_BLOCK;
	rt_kvpool_adjust(kv->pool, -sign * sb, -sign * sb * RT_KV_BLOCK * 2 * (int64_t)kv->row_bytes);
	atomic_fetch_add(&px->lists, sign);
}

/* Map px's rows of list i over list h's rows [0, n). Returns 0 or -1 (errno set). */
static int share_map(const rt_kv *kv, rt_kv_head *h, rt_kv_prefix *px, size_t i)
{
	const size_t len = (size_t)px->n * kv->row_bytes;
	uint8_t *arr[2] = { h->kr, h->vr };
	for (int k = 0; k < 2; k++) {
		void *p = mmap(arr[k], len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, px->fd,
		               (off_t)((2 * i + (size_t)k) * len));
		if (p == MAP_FAILED)
			return -1;
	}
	return 0;
}

/* List h stops sharing (copy on write): its rows [0, n) go back to private anonymous pages,
 * copied from the shared ones when copy is set (else they are left zero: a reset). */
static void head_unshare(const rt_kv *kv, rt_kv_head *h, int copy)
{
	rt_kv_prefix *px = h->px;
	if (!px)
		return;
	const size_t len = (size_t)px->n * kv->row_bytes;
	uint8_t *arr[2] = { h->kr, h->vr };
	uint8_t *tmp = copy ? malloc(len) : NULL;
	if (copy && !tmp)
		rt_assert_fail("memory for a shared prefix's copy on write", __FILE__, __LINE__);
	for (int k = 0; k < 2; k++) {
		if (copy)
			memcpy(tmp, arr[k], len);
		void *p = mmap(arr[k], len, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED)
			rt_assert_fail("anonymous pages replace a shared prefix's mapping", __FILE__,
			               __LINE__);
		if (copy)
			memcpy(arr[k], tmp, len);
	}
	free(tmp);
	h->px = NULL;
	share_count(kv, px, -1);
	rt_kv_prefix_unref(px);
}

/* Whether kv's lists can share a prefix of n entries: untiered, n a positive multiple of
 * the unit, every list at least n entries and sharing nothing. */
static int share_ok(const rt_kv *kv, int32_t n)
{
	const int32_t u = rt_kv_prefix_unit(kv);
	if (!u || n <= 0 || n % u)
		return 0;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		if (kv->heads[i].n < n || kv->heads[i].px)
			return 0;
	return 1;
}

/* Every list of kv shares px (rows already equal). 0, or -1 with err (no list shares). */
static int share_all(rt_kv *kv, rt_kv_prefix *px, rt_err *err)
{
	const int nh = kv->n_layer * kv->n_kv_head;
	for (int i = 0; i < nh; i++) {
		rt_kv_head *h = &kv->heads[i];
		if (share_map(kv, h, px, (size_t)i) != 0) {
			int e = errno;
			h->px = px; /* the list's mapping may be half replaced: restore it with a copy */
			atomic_fetch_add(&px->refs, 1);
			share_count(kv, px, 1);
			for (int j = 0; j <= i; j++)
				head_unshare(kv, &kv->heads[j], 1);
			return rt_err_set(err, "kv: shared prefix: mmap: %s", strerror(e));
		}
		h->px = px;
		atomic_fetch_add(&px->refs, 1);
		share_count(kv, px, 1);
	}
	return 0;
}

rt_kv_prefix *rt_kv_prefix_make(rt_kv *kv, int32_t n, rt_err *err)
{
	if (!share_ok(kv, n)) {
		rt_err_set(err, "kv: shared prefix: %d entries are not a multiple of %d held by "
		           "every list of an unshared, untiered store", (int)n,
		           (int)rt_kv_prefix_unit(kv));
		return NULL;
	}
	const int nh = kv->n_layer * kv->n_kv_head;
	const size_t len = (size_t)n * kv->row_bytes;
	rt_kv_prefix *px = calloc(1, sizeof *px);
	int fd = memfd_create("kvpc-prefix", MFD_CLOEXEC);
	if (!px || fd < 0) {
		rt_err_set(err, "kv: shared prefix: memfd_create: %s", strerror(errno));
		goto fail;
	}
	if (ftruncate(fd, (off_t)(2 * len * (size_t)nh)) != 0) {
		rt_err_set(err, "kv: shared prefix: ftruncate: %s", strerror(errno));
		goto fail;
	}
	for (int i = 0; i < nh; i++)
		for (int k = 0; k < 2; k++) {
			const uint8_t *src = k ? kv->heads[i].vr : kv->heads[i].kr;
			const off_t off = (off_t)((2 * (size_t)i + (size_t)k) * len);
			if (pwrite(fd, src, len, off) != (ssize_t)len) {
				rt_err_set(err, "kv: shared prefix: write: %s", strerror(errno));
				goto fail;
			}
		}
	*px = (rt_kv_prefix){ .fd = fd, .n = n, .n_layer = kv->n_layer,
		              .n_kv_head = kv->n_kv_head, .row_bytes = kv->row_bytes,
		              .pool = kv->pool, .refs = 1, .stat_bytes = kv->stat_bytes,
		              .state_bytes = kv->state_bytes };
	int32_t m = kv->heads[0].n; /* every list holds m entries: a fork can start from them */
	for (int i = 1; i < nh; i++)
		m = kv->heads[i].n == m ? m : 0;
	const size_t ml = m ? meta_list(kv, n, m) : 0;
	px->meta = m ? malloc((size_t)nh * ml) : NULL;
	px->m = px->meta ? m : 0;
	for (int i = 0; px->meta && i < nh; i++)
		meta_copy(kv, &kv->heads[i], px->meta + (size_t)i * ml, n, m, 0);
	rt_kvpool_adjust(kv->pool, (int64_t)nh * (n / RT_KV_BLOCK), rt_kv_prefix_bytes(px));
	if (share_all(kv, px, err) != 0) {
		rt_kv_prefix_unref(px);
		return NULL;
	}
	return px;
fail:
	if (fd >= 0)
		close(fd);
	free(px);
	return NULL;
}

int rt_kv_prefix_attach(rt_kv *kv, rt_kv_prefix *px, rt_err *err)
{
	if (kv->n_layer != px->n_layer || kv->n_kv_head != px->n_kv_head ||
	    kv->row_bytes != px->row_bytes || !share_ok(kv, px->n))
		return 0;
	const int nh = kv->n_layer * kv->n_kv_head;
	const size_t len = (size_t)px->n * kv->row_bytes;
	/* the segment's pages, read where they are (a private read-only view) */
	uint8_t *seg = mmap(NULL, 2 * len * (size_t)nh, PROT_READ, MAP_SHARED, px->fd, 0);
	if (seg == MAP_FAILED)
		return rt_err_set(err, "kv: shared prefix: mmap: %s", strerror(errno));
	int same = 1;
	for (int i = 0; i < nh && same; i++)
		same = !memcmp(seg + 2 * (size_t)i * len, kv->heads[i].kr, len) &&
		       !memcmp(seg + (2 * (size_t)i + 1) * len, kv->heads[i].vr, len);
	munmap(seg, 2 * len * (size_t)nh);
	if (!same)
		return 0;
	return share_all(kv, px, err) != 0 ? -1 : 1;
}

int32_t rt_kv_prefix_fork_len(const rt_kv_prefix *px)
{
	return px->m;
}

int rt_kv_prefix_forkable(const rt_kv *kv, const rt_kv_prefix *px)
{
	if (!px->meta || kv->tiered || kv->n_layer != px->n_layer ||
	    kv->n_kv_head != px->n_kv_head || kv->row_bytes != px->row_bytes ||
	    kv->stat_bytes != px->stat_bytes || kv->state_bytes != px->state_bytes)
		return 0;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		if (kv->heads[i].n != 0 || kv->heads[i].px || kv->heads[i].cap < px->m)
			return 0;
	return 1;
}

int rt_kv_prefix_fork(rt_kv *kv, rt_kv_prefix *px, rt_err *err)
{
	if (!rt_kv_prefix_forkable(kv, px))
		return 0;
	/* the shared rows never come from the pool: credit them before the blocks are taken
	 * (share_all gives them back once more, the credit is then cancelled), so the fork
	 * needs only the bytes it does not share, even in a nearly full pool */
	const int nh = kv->n_layer * kv->n_kv_head;
	const int64_t sb = px->n / RT_KV_BLOCK, rows = sb * RT_KV_BLOCK * 2 * (int64_t)kv->row_bytes;
	rt_kvpool_adjust(kv->pool, -nh * sb, -nh * rows);
	int rc = rt_kv_reserve(kv, px->m, err);
	if (rc == 0) {
		const size_t ml = meta_list(kv, px->n, px->m);
		for (int i = 0; i < nh; i++) {
			meta_copy(kv, &kv->heads[i], px->meta + (size_t)i * ml, px->n, px->m, 1);
			kv->heads[i].n = px->m;
		}
		rc = share_all(kv, px, err);
		if (rc != 0)
			rt_kv_reset(kv); /* empty again: the rows half mapped are dropped */
	}
	rt_kvpool_adjust(kv->pool, nh * sb, nh * rows);
	return rc == 0 ? 1 : -1;
}

int rt_kv_shared_lists(const rt_kv *kv)
{
	int c = 0;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		c += kv->heads[i].px != NULL;
	return c;
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

/* The same for arena t of h. */
static void arena_unmap(rt_kv *kv, rt_kv_head *h, int t, int32_t keep)
{
	rt_kv_arena *a = &h->arena[t];
	if (a->nb_mapped <= keep)
		return;
	const size_t eb[2] = { arena_slot_bytes(kv, t), sizeof(int32_t) };
	uint8_t *base[2] = { a->rows, (uint8_t *)a->owner };
	for (int k = 0; k < 2; k++) {
		size_t from = page_up((size_t)keep * RT_KV_BLOCK * eb[k]);
		size_t to = page_up((size_t)a->nb_mapped * RT_KV_BLOCK * eb[k]);
		if (to > from)
			madvise(base[k] + from, to - from, MADV_DONTNEED);
	}
	a->nb_mapped = keep;
}

/* Arena t of h keeps blocks for its n slots and returns the rest. */
static void arena_trim(rt_kv *kv, rt_kv_head *h, int t)
{
	rt_kv_arena *a = &h->arena[t];
	int32_t need = rt_kv_blocks_for(a->n);
	RT_ASSERT(need <= a->nb);
	blocks_give(kv, a->nb - need, arena_block_bytes(kv, t));
	a->nb = need;
	if (a->nb_mapped > a->nb + 1)
		arena_unmap(kv, h, t, a->nb + 1);
}

/* List h keeps blocks for its n entries and returns the rest (and its arenas theirs). */
static void head_trim(rt_kv *kv, rt_kv_head *h)
{
	if (h->px && h->n < h->px->n)
		head_unshare(kv, h, 1); /* a compaction that set n itself cut into the prefix */
	int32_t need = rt_kv_blocks_for(h->n);
	RT_ASSERT(need <= h->nb);
	blocks_give(kv, h->nb - need, list_block_bytes(kv));
	h->nb = need;
	if (h->nb_mapped > h->nb + 1)
		head_unmap(kv, h, h->nb + 1);
	for (int t = 0; kv->tiered && t < N_ARENA; t++)
		arena_trim(kv, h, t);
}

void rt_kv_free(rt_kv *kv)
{
	for (int i = 0; kv->pool && i < kv->n_layer * kv->n_kv_head; i++) {
		rt_kv_head *h = &kv->heads[i];
		if (h->px) { /* the munmap below drops the mapping: no copy */
			rt_kv_prefix *px = h->px;
			h->px = NULL;
			share_count(kv, px, -1);
			rt_kv_prefix_unref(px);
		}
		blocks_give(kv, h->nb, list_block_bytes(kv));
		for (int t = 0; kv->tiered && t < N_ARENA; t++)
			blocks_give(kv, h->arena[t].nb, arena_block_bytes(kv, t));
	}
	RT_ASSERT(kv->blocks == 0 && kv->bytes == 0);
	if (kv->mem)
		munmap(kv->mem, kv->mem_bytes);
	free(kv->meta);
	memset(kv, 0, sizeof *kv);
}

void rt_kv_reset(rt_kv *kv)
{
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++) {
		rt_kv_head *h = &kv->heads[i];
		head_unshare(kv, h, 0);
		h->n = 0;
		for (int t = 0; kv->tiered && t < N_ARENA; t++)
			h->arena[t].n = 0;
		head_trim(kv, h);
		head_unmap(kv, h, 0);
		for (int t = 0; kv->tiered && t < N_ARENA; t++)
			arena_unmap(kv, h, t, 0);
		if (kv->state_bytes)
			memset(h->state, 0, kv->state_bytes);
	}
	kv->bytes_peak = kv->bytes;
}

rt_kv_head *rt_kv_head_at(rt_kv *kv, int layer, int kv_head)
{
	RT_ASSERT(layer >= 0 && layer < kv->n_layer && kv_head >= 0 && kv_head < kv->n_kv_head);
	return &kv->heads[layer * kv->n_kv_head + kv_head];
}

/* Blocks list h (which == -1) or its top arena (which == 0) needs to take `add` more
 * entries without a new block. */
static int32_t reserve_need(const rt_kv_head *h, int which, int32_t add)
{
	int32_t n = which < 0 ? h->n : h->arena[0].n, nb = which < 0 ? h->nb : h->arena[0].nb;
	int32_t want = rt_kv_blocks_for(n + add);
	return want > nb ? want - nb : 0;
}

static int pool_refusal(const rt_kv *kv, int64_t need, int64_t bytes, rt_err *err)
{
	rt_kvpool_stats ps = rt_kvpool_get(kv->pool);
	return rt_err_setc(err, RT_ERR_RESOURCE,
	                   "KV pool exhausted: %lld more blocks (%lld bytes) needed, %lld of %lld "
	                   "bytes in use",
	                   (long long)need, (long long)bytes, (long long)ps.used,
	                   (long long)ps.limit);
}

int rt_kv_reserve(rt_kv *kv, int32_t add, rt_err *err)
{
	RT_ASSERT(add >= 0);
	const int nh = kv->n_layer * kv->n_kv_head;
	int64_t need = 0, need0 = 0;
	for (int i = 0; i < nh; i++) {
		const rt_kv_head *h = &kv->heads[i];
		if ((int64_t)h->n + add > h->cap)
			return rt_err_setc(err, RT_ERR_RESOURCE,
			                  "KV cache full: layer %d kv head %d holds %d entries, %d more "
			                  "exceed the capacity %d",
			                  i / kv->n_kv_head, i % kv->n_kv_head, (int)h->n, (int)add,
			                  (int)h->cap);
		need += reserve_need(h, -1, add);
		need0 += kv->tiered ? reserve_need(h, 0, add) : 0;
	}
	const int64_t lb = list_block_bytes(kv), ab = kv->tiered ? arena_block_bytes(kv, 0) : 1;
	if (blocks_take(kv, need, lb) != 0)
		return pool_refusal(kv, need + need0, need * lb + need0 * ab, err);
	if (blocks_take(kv, need0, ab) != 0) {
		blocks_give(kv, need, lb);
		return pool_refusal(kv, need + need0, need * lb + need0 * ab, err);
	}
	for (int i = 0; i < nh; i++) {
		rt_kv_head *h = &kv->heads[i];
		h->nb += reserve_need(h, -1, add);
		if (h->nb_mapped < h->nb)
			h->nb_mapped = h->nb;
		if (kv->tiered) {
			rt_kv_arena *a = &h->arena[0];
			a->nb += reserve_need(h, 0, add);
			if (a->nb_mapped < a->nb)
				a->nb_mapped = a->nb;
		}
	}
	return 0;
}

/* ---- tier arenas ---------------------------------------------------------------------- */

static uint8_t *slot_key(const rt_kv *kv, const rt_kv_head *h, int t, int32_t s)
{
	return h->arena[t].rows + (size_t)s * 2 * kv->tier_row[t];
}

/* Give entry i a slot at the end of arena t (taking a block when the arena's are full and
 * asserting the pool grants it: callers reserve first). */
static void slot_take(rt_kv *kv, rt_kv_head *h, int t, int32_t i)
{
	rt_kv_arena *a = &h->arena[t];
	RT_ASSERT(a->n < h->cap);
	if (a->n >= a->nb * RT_KV_BLOCK) {
		block_take_or_die(kv, arena_block_bytes(kv, t));
		a->nb++;
		if (a->nb_mapped < a->nb)
			a->nb_mapped = a->nb;
	}
	int32_t s = a->n++;
	a->owner[s] = i;
	h->tier[i] = (uint8_t)t;
	h->slot[i] = s;
}

/* Free slot s of arena t: the arena's last slot moves into it (its owner follows). Blocks
 * are returned by the caller (arena_trim). */
static void slot_free(const rt_kv *kv, rt_kv_head *h, int t, int32_t s)
{
	rt_kv_arena *a = &h->arena[t];
	RT_ASSERT(s >= 0 && s < a->n);
	int32_t last = --a->n;
	if (s == last)
		return;
	memcpy(slot_key(kv, h, t, s), slot_key(kv, h, t, last), 2 * kv->tier_row[t]);
	a->owner[s] = a->owner[last];
	h->slot[a->owner[s]] = s;
}

/* ---- key groups ----------------------------------------------------------------------- */

/* The range of key group g of h: head_dim f16 minima, then head_dim f16 maxima. */
static uint16_t *kgroup_range(const rt_kv *kv, const rt_kv_head *h, int32_t g)
{
	RT_ASSERT(g >= 0 && g < h->arena[RT_KV_KGROUPS].n);
	return (uint16_t *)(void *)(h->arena[RT_KV_KGROUPS].rows + (size_t)g * kv->kgroup_bytes);
}

const uint16_t *rt_kv_kgroup_range(const rt_kv *kv, const rt_kv_head *h, int32_t g)
{
	return kgroup_range(kv, h, g);
}

/* Entry i's key range at its (quantised) tier, unpacked into lo[d] and step[d]. */
static void key_range(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *lo, float *step)
{
	rt_kvq_krange_unpack(tier_kkind[h->tier[i]], kgroup_range(kv, h, h->kgrp[i]), kv->head_dim,
	                     lo, step);
}

/* Free key group g of h (it has no quantised member left): the table's last group moves
 * into slot g, and every entry naming g (members still at the top tier) forgets it, every
 * entry naming the last one names g. Blocks are returned by the caller (arena_trim). */
static void kgroup_free(const rt_kv *kv, rt_kv_head *h, int32_t g)
{
	rt_kv_arena *a = &h->arena[RT_KV_KGROUPS];
	RT_ASSERT(g >= 0 && g < a->n && a->owner[g] == 0);
	const int32_t last = --a->n;
	if (g != last) {
		memcpy(a->rows + (size_t)g * kv->kgroup_bytes, a->rows + (size_t)last * kv->kgroup_bytes,
		       kv->kgroup_bytes);
		a->owner[g] = a->owner[last];
	}
	for (int32_t i = 0; i < h->n; i++)
		if (h->kgrp[i] == g)
			h->kgrp[i] = -1;
		else if (h->kgrp[i] == last)
			h->kgrp[i] = g;
}

/* Undo the key groups made from table slot g0 on (none has a quantised member yet). */
static void kgroups_undo(rt_kv *kv, rt_kv_head *h, int32_t g0)
{
	for (int32_t i = 0; i < h->n; i++)
		if (h->kgrp[i] >= g0)
			h->kgrp[i] = -1;
	h->arena[RT_KV_KGROUPS].n = g0;
	arena_trim(kv, h, RT_KV_KGROUPS);
}

/* Every entry that leaves the top tier now (want[i] > tier[i] == top) and has no key group
 * gets one: the group of its position block b = pos / RT_KV_KGROUP is every entry of h in
 * that block still at the top tier without a group (so every member was at the top tier,
 * exact, when the range was fitted), and its range is their keys' per-channel minima and
 * maxima. Entries of the block appended later form a group of their own when they leave
 * the top tier. Returns 0, or -1 with err when the pool refuses a table block (the groups
 * made here are undone). */
static int kgroups_make(rt_kv *kv, rt_kv_head *h, const uint8_t *want, rt_err *err)
{
	rt_kv_arena *a = &h->arena[RT_KV_KGROUPS];
	const int32_t g0 = a->n;
	const int d = kv->head_dim;
	float kb[KV_TIER_MAX_DIM], lo[KV_TIER_MAX_DIM], hi[KV_TIER_MAX_DIM];
	for (int32_t i = 0; i < h->n; i++) {
		if (want[i] <= h->tier[i] || h->tier[i] != RT_KV_TIER_TOP || h->kgrp[i] >= 0)
			continue;
		if (a->n >= a->nb * RT_KV_BLOCK) {
			const int64_t bb = arena_block_bytes(kv, RT_KV_KGROUPS);
			if (blocks_take(kv, 1, bb) != 0) {
				kgroups_undo(kv, h, g0);
				return pool_refusal(kv, 1, bb, err);
			}
			a->nb++;
			if (a->nb_mapped < a->nb)
				a->nb_mapped = a->nb;
		}
		const int32_t g = a->n++, blk = h->pos[i] / RT_KV_KGROUP;
		a->owner[g] = 0;
		for (int c = 0; c < d; c++) {
			lo[c] = INFINITY;
			hi[c] = -INFINITY;
		}
		for (int32_t j = 0; j < h->n; j++) {
			if (h->tier[j] != RT_KV_TIER_TOP || h->kgrp[j] >= 0 ||
			    h->pos[j] / RT_KV_KGROUP != blk)
				continue;
			h->kgrp[j] = g;
			rt_kv_head_decode(kv, h, j, 1, kb, NULL);
			rot_copy(kv, kv->rot_keys, kb, kb); /* the range of the keys as coded */
			for (int c = 0; c < d; c++) {
				lo[c] = kb[c] < lo[c] ? kb[c] : lo[c];
				hi[c] = kb[c] > hi[c] ? kb[c] : hi[c];
			}
		}
		rt_kvq_krange_set(lo, hi, d, kgroup_range(kv, h, g));
	}
	return 0;
}

/* ---- entries -------------------------------------------------------------------------- */

int32_t rt_kv_append(rt_kv *kv, rt_kv_head *h, const float *k, const float *v, int32_t pos)
{
	RT_ASSERT(h->n < h->cap);
	if (h->n >= h->nb * RT_KV_BLOCK) {
		block_take_or_die(kv, list_block_bytes(kv));
		h->nb++;
		if (h->nb_mapped < h->nb)
			h->nb_mapped = h->nb;
	}
	int32_t i = h->n++;
	if (kv->tiered) {
		RT_ASSERT(pos >= 0);
		slot_take(kv, h, RT_KV_TIER_TOP, i);
		h->kgrp[i] = -1;
	}
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

/* Entry i's stored key row (its codes at a quantised tier; value row: + tier key row
 * bytes) and its codec. */
static uint8_t *entry_row(const rt_kv *kv, const rt_kv_head *h, int32_t i, int value,
                          rt_kvq_kind *kind)
{
	if (!kv->tiered) {
		*kind = type_kind[kv->type];
		return (value ? h->vr : h->kr) + (size_t)i * kv->row_bytes;
	}
	const int t = h->tier[i];
	*kind = tier_kind(kv, t, value);
	return slot_key(kv, h, t, h->slot[i]) + (value ? kv->tier_krow[t] : 0);
}

/* 1 when entry i's key is coded per channel against its key group's range. */
static int key_grouped(const rt_kv *kv, const rt_kv_head *h, int32_t i)
{
	return kv->tiered && h->tier[i] != RT_KV_TIER_TOP;
}

static const float *row_get(const rt_kv *kv, const rt_kv_head *h, int32_t i, int value,
                            float *buf)
{
	rt_kvq_kind kind;
	const uint8_t *row = entry_row(kv, h, i, value, &kind);
	if (!value && key_grouped(kv, h, i)) {
		float lo[KV_TIER_MAX_DIM], step[KV_TIER_MAX_DIM];
		key_range(kv, h, i, lo, step);
		rt_kvq_kcodes_decode(kind, lo, step, row, kv->head_dim, buf);
		return rot_copy(kv, kv->rot_keys, buf, buf);
	}
	if (kind == RT_KVQ_F32)
		return (const float *)(const void *)row;
	rt_kvq_vrow_decode(kind, row, kv->head_dim, buf);
	return rot_copy(kv, value && key_grouped(kv, h, i) && kv->rot_values, buf, buf);
}

const float *rt_kv_key(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *buf)
{
	RT_ASSERT(i >= 0 && i < h->n);
	return row_get(kv, h, i, 0, buf);
}

const float *rt_kv_value(const rt_kv *kv, const rt_kv_head *h, int32_t i, float *buf)
{
	RT_ASSERT(i >= 0 && i < h->n);
	return row_get(kv, h, i, 1, buf);
}

/* entry_row for a write: a list that shares a prefix's rows is first given rows of its own
 * (the shared rows are read-only; runtime/kv/rt_kv.h, "Shared prefixes"). */
static uint8_t *entry_row_own(const rt_kv *kv, rt_kv_head *h, int32_t i, int value,
                              rt_kvq_kind *kind)
{
	RT_ASSERT(i >= 0 && i < h->n);
	if (h->px && i < h->px->n)
		head_unshare(kv, h, 1);
	return entry_row(kv, h, i, value, kind);
}

void rt_kv_set_key(const rt_kv *kv, rt_kv_head *h, int32_t i, const float *x)
{
	rt_kvq_kind kind;
	uint8_t *row = entry_row_own(kv, h, i, 0, &kind);
	if (key_grouped(kv, h, i)) {
		float lo[KV_TIER_MAX_DIM], step[KV_TIER_MAX_DIM], xr[KV_TIER_MAX_DIM];
		key_range(kv, h, i, lo, step);
		rt_kvq_kcodes_encode(kind, lo, step, rot_copy(kv, kv->rot_keys, x, xr), kv->head_dim,
		                     row);
		return;
	}
	rt_kvq_vrow_encode(kind, x, kv->head_dim, row);
}

void rt_kv_set_value(const rt_kv *kv, rt_kv_head *h, int32_t i, const float *x)
{
	rt_kvq_kind kind;
	uint8_t *row = entry_row_own(kv, h, i, 1, &kind);
	float xr[KV_TIER_MAX_DIM];
	if (key_grouped(kv, h, i) && kv->rot_values)
		x = rot_copy(kv, 1, x, xr);
	rt_kvq_vrow_encode(kind, x, kv->head_dim, row);
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

void rt_kv_head_decode(const rt_kv *kv, const rt_kv_head *h, int32_t i0, int32_t n, float *K,
                       float *V)
{
	RT_ASSERT(i0 >= 0 && n >= 0 && i0 + n <= h->n);
	const size_t hd = (size_t)kv->head_dim;
	if (!kv->tiered) {
		if (K)
			rt_kv_rows_decode(kv, h->kr + (size_t)i0 * kv->row_bytes, n, K);
		if (V)
			rt_kv_rows_decode(kv, h->vr + (size_t)i0 * kv->row_bytes, n, V);
		return;
	}
	float lo[KV_TIER_MAX_DIM], step[KV_TIER_MAX_DIM];
	int32_t g_have = -1, t_have = -1; /* the range unpacked in lo / step */
	for (int32_t j = 0; j < n; j++) {
		const int32_t i = i0 + j;
		float *kd = K ? K + (size_t)j * hd : NULL, *vd = V ? V + (size_t)j * hd : NULL;
		const float *p;
		if (kd && key_grouped(kv, h, i)) {
			if (h->kgrp[i] != g_have || h->tier[i] != t_have) {
				g_have = h->kgrp[i], t_have = h->tier[i];
				key_range(kv, h, i, lo, step);
			}
			rt_kvq_kcodes_decode(tier_kkind[t_have], lo, step,
			                     slot_key(kv, h, t_have, h->slot[i]), (int)hd, kd);
			rot_copy(kv, kv->rot_keys, kd, kd);
		} else if (kd && (p = row_get(kv, h, i, 0, kd)) != kd) {
			memcpy(kd, p, hd * sizeof(float));
		}
		if (vd && (p = row_get(kv, h, i, 1, vd)) != vd)
			memcpy(vd, p, hd * sizeof(float));
	}
}

/* The quantised tier t of h decoded into K and V, slot by slot; a key group's range is
 * unpacked once for a run of slots of the same group (slots follow the order entries
 * arrived in, so neighbouring slots mostly share a group). */
static void arena_decode(const rt_kv *kv, const rt_kv_head *h, int t, float *K, float *V)
{
	const rt_kv_arena *a = &h->arena[t];
	const size_t hd = (size_t)kv->head_dim, rb = kv->tier_krow[t];
	float lo[KV_TIER_MAX_DIM], step[KV_TIER_MAX_DIM];
	int32_t g_have = -1;
	for (int32_t s = 0; s < a->n; s++) {
		const int32_t e = a->owner[s];
		const uint8_t *row = a->rows + (size_t)s * 2 * kv->tier_row[t];
		if (h->kgrp[e] != g_have) {
			g_have = h->kgrp[e];
			key_range(kv, h, e, lo, step);
		}
		rt_kvq_kcodes_decode(tier_kkind[t], lo, step, row, (int)hd, K + (size_t)e * hd);
		rt_kvq_vrow_decode(tier_vkind[t], row + rb, (int)hd, V + (size_t)e * hd);
		rot_copy(kv, kv->rot_keys, K + (size_t)e * hd, K + (size_t)e * hd);
		rot_copy(kv, kv->rot_values, V + (size_t)e * hd, V + (size_t)e * hd);
	}
}

void rt_kv_head_decode_all(const rt_kv *kv, const rt_kv_head *h, float *K, float *V,
                           rt_kv_rows_fn top)
{
	if (!kv->tiered || (!top && kv->type != RT_KV_F32)) {
		rt_kv_head_decode(kv, h, 0, h->n, K, V);
		return;
	}
	const size_t hd = (size_t)kv->head_dim;
	const rt_kv_arena *a = &h->arena[RT_KV_TIER_TOP];
	const size_t rb = kv->tier_krow[RT_KV_TIER_TOP];
	for (int32_t s = 0; s < a->n; s++) {
		const int32_t e = a->owner[s];
		const uint8_t *row = a->rows + (size_t)s * 2 * kv->tier_row[RT_KV_TIER_TOP];
		float *kd = K + (size_t)e * hd, *vd = V + (size_t)e * hd;
		if (kv->type == RT_KV_F32) {
			memcpy(kd, row, hd * sizeof(float));
			memcpy(vd, row + rb, hd * sizeof(float));
		} else {
			top(row, 1, (int)hd, kd);
			top(row + rb, 1, (int)hd, vd);
		}
	}
	for (int t = RT_KV_TIER_TOP + 1; t < RT_KV_N_TIER; t++)
		arena_decode(kv, h, t, K, V);
}

int rt_kv_head_set_tiers(rt_kv *kv, rt_kv_head *h, const uint8_t *want, rt_err *err)
{
	if (!kv->tiered)
		return rt_err_set(err, "kv: set tiers on a store without tiers (rt_kv_init_tiered)");
	int32_t arrive[RT_KV_N_TIER] = { 0 }, moves = 0;
	for (int32_t i = 0; i < h->n; i++) {
		if (want[i] >= RT_KV_N_TIER)
			return rt_err_set(err, "kv: entry %d: tier %d outside 0..%d", (int)i, want[i],
			                  RT_KV_N_TIER - 1);
		if (want[i] > h->tier[i]) {
			arrive[want[i]]++;
			moves++;
		}
	}
	if (!moves)
		return 0;
	const int32_t g0 = h->arena[RT_KV_KGROUPS].n;
	if (kgroups_make(kv, h, want, err) != 0)
		return -1;
	int64_t need[RT_KV_N_TIER] = { 0 }, nblk = 0, nbytes = 0;
	for (int t = 1; t < RT_KV_N_TIER; t++) {
		int32_t nb = rt_kv_blocks_for(h->arena[t].n + arrive[t]);
		need[t] = nb > h->arena[t].nb ? nb - h->arena[t].nb : 0;
		nblk += need[t];
		nbytes += need[t] * arena_block_bytes(kv, t);
	}
	for (int t = 1; t < RT_KV_N_TIER; t++)
		if (blocks_take(kv, need[t], arena_block_bytes(kv, t)) != 0) {
			for (int u = 1; u < t; u++)
				blocks_give(kv, need[u], arena_block_bytes(kv, u));
			kgroups_undo(kv, h, g0);
			return pool_refusal(kv, nblk, nbytes, err);
		}
	for (int t = 1; t < RT_KV_N_TIER; t++) {
		rt_kv_arena *a = &h->arena[t];
		a->nb += (int32_t)need[t];
		if (a->nb_mapped < a->nb)
			a->nb_mapped = a->nb;
	}
	float kb[KV_TIER_MAX_DIM], vb[KV_TIER_MAX_DIM];
	for (int32_t i = 0; i < h->n; i++) {
		if (want[i] <= h->tier[i])
			continue;
		const int from = h->tier[i];
		rt_kv_head_decode(kv, h, i, 1, kb, vb);
		slot_free(kv, h, from, h->slot[i]);
		slot_take(kv, h, want[i], i);
		if (from == RT_KV_TIER_TOP)
			h->arena[RT_KV_KGROUPS].owner[h->kgrp[i]]++;
		rt_kv_set_key(kv, h, i, kb);
		rt_kv_set_value(kv, h, i, vb);
	}
	for (int t = 0; t < RT_KV_N_TIER; t++)
		arena_trim(kv, h, t);
	return moves;
}

void rt_kv_head_set_keys(const rt_kv *kv, rt_kv_head *h, const float *K, const uint8_t *changed)
{
	const size_t d = (size_t)kv->head_dim;
	for (int32_t i = 0; i < h->n; i++)
		if (changed[i] && !key_grouped(kv, h, i))
			rt_kv_set_key(kv, h, i, K + (size_t)i * d);
	if (!kv->tiered)
		return;
	float lo[KV_TIER_MAX_DIM], hi[KV_TIER_MAX_DIM], step[KV_TIER_MAX_DIM], kr[KV_TIER_MAX_DIM];
	for (int32_t g = 0; g < h->arena[RT_KV_KGROUPS].n; g++) {
		int any = 0;
		for (size_t c = 0; c < d; c++)
			lo[c] = INFINITY, hi[c] = -INFINITY;
		for (int32_t j = 0; j < h->n; j++) {
			if (h->kgrp[j] != g)
				continue;
			any |= changed[j];
			const float *k = rot_copy(kv, kv->rot_keys, K + (size_t)j * d, kr); /* as coded */
			for (size_t c = 0; c < d; c++) {
				lo[c] = k[c] < lo[c] ? k[c] : lo[c];
				hi[c] = k[c] > hi[c] ? k[c] : hi[c];
			}
		}
		if (!any)
			continue;
		rt_kvq_krange_set(lo, hi, (int)d, kgroup_range(kv, h, g));
		for (int32_t j = 0; j < h->n; j++)
			if (h->kgrp[j] == g && key_grouped(kv, h, j)) {
				key_range(kv, h, j, lo, step);
				rt_kvq_kcodes_encode(tier_kkind[h->tier[j]], lo, step,
				                     rot_copy(kv, kv->rot_keys, K + (size_t)j * d, kr), (int)d,
				                     slot_key(kv, h, h->tier[j], h->slot[j]));
			}
	}
}

/* Copy every per-entry array of entry src over entry dst (tiered: the rows stay in their
 * slot, whose owner becomes dst). */
static void entry_move(const rt_kv *kv, rt_kv_head *h, int32_t dst, int32_t src)
{
	const size_t rb = kv->row_bytes, sb = kv->stat_bytes;
	if (kv->tiered) {
		h->tier[dst] = h->tier[src];
		h->slot[dst] = h->slot[src];
		h->kgrp[dst] = h->kgrp[src];
		h->arena[h->tier[dst]].owner[h->slot[dst]] = dst;
	} else {
		memcpy(h->kr + (size_t)dst * rb, h->kr + (size_t)src * rb, rb);
		memcpy(h->vr + (size_t)dst * rb, h->vr + (size_t)src * rb, rb);
	}
	h->pos[dst] = h->pos[src];
	h->count[dst] = h->count[src];
	h->log_count[dst] = h->log_count[src];
	h->span[dst] = h->span[src];
	if (sb)
		memcpy(h->stats + (size_t)dst * sb, h->stats + (size_t)src * sb, sb);
}

/* Check keep[0..n_keep) is strictly increasing within the head; in a tiered store free the
 * slots of the entries it leaves out (before any entry moves, while owners still name the
 * old indices), and the key groups left without a quantised member. */
static void keep_prepare(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep)
{
	RT_ASSERT(n_keep >= 0 && n_keep <= h->n);
	for (int32_t j = 0; j < n_keep; j++)
		RT_ASSERT(keep[j] >= 0 && keep[j] < h->n && (j == 0 || keep[j] > keep[j - 1]));
	/* a shared prefix stays shared only when every entry of it stays where it is (keep is
	 * strictly increasing, so keep[n - 1] == n - 1 keeps all of [0, n) in place) */
	if (h->px && (n_keep < h->px->n || keep[h->px->n - 1] != h->px->n - 1))
		head_unshare(kv, h, 1);
	if (!kv->tiered || n_keep == h->n)
		return;
	int32_t *live = h->arena[RT_KV_KGROUPS].owner;
	for (int32_t i = 0, j = 0; i < h->n; i++) {
		if (j < n_keep && keep[j] == i) {
			j++;
			continue;
		}
		slot_free(kv, h, h->tier[i], h->slot[i]);
		if (h->tier[i] != RT_KV_TIER_TOP && --live[h->kgrp[i]] == 0)
			kgroup_free(kv, h, h->kgrp[i]);
	}
}

void rt_kv_head_keep(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep)
{
	keep_prepare(kv, h, keep, n_keep);
	for (int32_t j = 0; j < n_keep; j++) {
		int32_t i = keep[j];
		RT_ASSERT(i >= j);
		/* i > j always, so a forward gather never overwrites an entry still to be read */
		if (i != j)
			entry_move(kv, h, j, i);
	}
	h->n = n_keep;
	head_trim(kv, h);
}

int32_t rt_kv_head_evict(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep)
{
	keep_prepare(kv, h, keep, n_keep);
	int32_t t = 0; /* keep[0..t) are below n_keep and stay; keep[t..n_keep) fill the holes */
	for (int32_t j = 0; j < n_keep; j++)
		t += keep[j] < n_keep;
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
	if (kv->tiered)
		return rt_kv_tier_entry_bytes(kv, RT_KV_TIER_TOP);
	return 2 * kv->row_bytes + sizeof(int32_t) + 2 * sizeof(float) + sizeof(uint16_t) +
	       kv->stat_bytes;
}

size_t rt_kv_tier_entry_bytes(const rt_kv *kv, int t)
{
	RT_ASSERT(t >= 0 && t < RT_KV_N_TIER);
	if (!kv->tiered)
		return t == RT_KV_TIER_TOP ? rt_kv_entry_bytes(kv) : 0;
	return kv->meta_bytes + 2 * kv->tier_row[t] + sizeof(int32_t);
}

size_t rt_kv_tier_row_bytes(const rt_kv *kv, int t)
{
	RT_ASSERT(t >= 0 && t < RT_KV_N_TIER);
	if (!kv->tiered)
		return t == RT_KV_TIER_TOP ? kv->row_bytes : 0;
	return kv->tier_row[t] + (t == RT_KV_TIER_TOP ? 0 : kv->kgroup_bytes / (2 * RT_KV_KGROUP));
}

double rt_kv_kgroup_fill(const rt_kv *kv)
{
	int64_t groups = 0, members = 0;
	for (int i = 0; kv->tiered && i < kv->n_layer * kv->n_kv_head; i++) {
		const rt_kv_arena *a = &kv->heads[i].arena[RT_KV_KGROUPS];
		groups += a->n;
		for (int32_t g = 0; g < a->n; g++)
			members += a->owner[g];
	}
	return groups > 0 ? (double)members / (double)groups : (double)RT_KV_KGROUP;
}

int64_t rt_kv_kgroups(const rt_kv *kv)
{
	int64_t n = 0;
	for (int i = 0; kv->tiered && i < kv->n_layer * kv->n_kv_head; i++)
		n += kv->heads[i].arena[RT_KV_KGROUPS].n;
	return n;
}

size_t rt_kv_f16_entry_bytes(const rt_kv *kv)
{
	return 4 * (size_t)kv->head_dim;
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
	if (!kv->tiered)
		return rt_kv_entries(kv) * (int64_t)rt_kv_entry_bytes(kv);
	int64_t b = rt_kv_entries(kv) * (int64_t)kv->meta_bytes;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		for (int t = 0; t < N_ARENA; t++)
			b += (int64_t)kv->heads[i].arena[t].n *
			     (int64_t)(arena_slot_bytes(kv, t) + sizeof(int32_t));
	return b;
}

int64_t rt_kv_bytes_held(const rt_kv *kv)
{
	return kv->bytes;
}

int64_t rt_kv_bytes_peak(const rt_kv *kv)
{
	return kv->bytes_peak;
}
