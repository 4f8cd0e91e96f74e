/*
 * rt_kv: the ragged per-(layer, KV head) KV store; see rt_kv.h. All arrays of all heads
 * live in one allocation carved into 64-byte-aligned slices.
 */
#include "kv/rt_kv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* Bytes of one head's arrays, or 0 on overflow. */
static size_t head_bytes(int head_dim, int32_t cap, size_t stat_bytes, size_t state_bytes)
{
	size_t c = (size_t)cap, hd = (size_t)head_dim;
	if (c > SIZE_MAX / 8 / (hd + 1) || (stat_bytes && c > SIZE_MAX / 8 / stat_bytes))
		return 0;
	return 2 * align64(c * hd * sizeof(float)) + align64(c * sizeof(int32_t)) +
	       2 * align64(c * sizeof(float)) + align64(c * sizeof(uint16_t)) +
	       align64(c * stat_bytes) + align64(state_bytes);
}

int rt_kv_init(rt_kv *kv, int n_layer, int n_kv_head, int group, int head_dim, int32_t cap,
               size_t stat_bytes, size_t state_bytes, rt_err *err)
{
	memset(kv, 0, sizeof *kv);
	if (n_layer <= 0 || n_kv_head <= 0 || group <= 0 || head_dim <= 0 || cap <= 0)
		return rt_err_set(err, "kv: invalid shape (layers %d, kv heads %d, group %d, head_dim %d, capacity %d)",
		                  n_layer, n_kv_head, group, head_dim, (int)cap);
	size_t hb = head_bytes(head_dim, cap, stat_bytes, state_bytes);
	size_t nh = (size_t)n_layer * (size_t)n_kv_head;
	if (hb == 0 || nh > SIZE_MAX / hb / 2)
		return rt_err_set(err, "kv: capacity %d entries per head is too large", (int)cap);
	size_t total = align64(nh * sizeof(rt_kv_head)) + nh * hb;
	uint8_t *mem = aligned_alloc(64, align64(total));
	if (!mem)
		return rt_err_set(err, "kv: cannot allocate %zu bytes for %d entries per head", total, (int)cap);
	memset(mem, 0, align64(total));
	kv->n_layer = n_layer;
	kv->n_kv_head = n_kv_head;
	kv->group = group;
	kv->head_dim = head_dim;
	kv->cap = cap;
	kv->stat_bytes = stat_bytes;
	kv->state_bytes = state_bytes;
	kv->mem = mem;
	kv->mem_bytes = total;
	kv->heads = (rt_kv_head *)mem;
	uint8_t *p = mem + align64(nh * sizeof(rt_kv_head));
	size_t c = (size_t)cap, hd = (size_t)head_dim;
	for (size_t i = 0; i < nh; i++) {
		rt_kv_head *h = &kv->heads[i];
		h->cap = cap;
		h->k = (float *)p, p += align64(c * hd * sizeof(float));
		h->v = (float *)p, p += align64(c * hd * sizeof(float));
		h->pos = (int32_t *)p, p += align64(c * sizeof(int32_t));
		h->count = (float *)p, p += align64(c * sizeof(float));
		h->log_count = (float *)p, p += align64(c * sizeof(float));
		h->span = (uint16_t *)p, p += align64(c * sizeof(uint16_t));
		h->stats = p, p += align64(c * stat_bytes);
		h->state = p, p += align64(state_bytes);
	}
	RT_ASSERT((size_t)(p - mem) == total);
	return 0;
}

void rt_kv_free(rt_kv *kv)
{
	free(kv->mem);
	memset(kv, 0, sizeof *kv);
}

void rt_kv_reset(rt_kv *kv)
{
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++) {
		kv->heads[i].n = 0;
		if (kv->state_bytes)
			memset(kv->heads[i].state, 0, kv->state_bytes);
	}
}

rt_kv_head *rt_kv_head_at(rt_kv *kv, int layer, int kv_head)
{
	RT_ASSERT(layer >= 0 && layer < kv->n_layer && kv_head >= 0 && kv_head < kv->n_kv_head);
	return &kv->heads[layer * kv->n_kv_head + kv_head];
}

int32_t rt_kv_append(rt_kv *kv, rt_kv_head *h, const float *k, const float *v, int32_t pos)
{
	RT_ASSERT(h->n < h->cap);
	int32_t i = h->n++;
	size_t hd = (size_t)kv->head_dim;
	memcpy(h->k + (size_t)i * hd, k, hd * sizeof(float));
	memcpy(h->v + (size_t)i * hd, v, hd * sizeof(float));
	h->pos[i] = pos;
	h->count[i] = 1.0f;
	h->log_count[i] = 0.0f;
	h->span[i] = 0;
	if (kv->stat_bytes)
		memset(h->stats + (size_t)i * kv->stat_bytes, 0, kv->stat_bytes);
	return i;
}

void rt_kv_head_keep(rt_kv *kv, rt_kv_head *h, const int32_t *keep, int32_t n_keep)
{
	RT_ASSERT(n_keep >= 0 && n_keep <= h->n);
	size_t hd = (size_t)kv->head_dim, sb = kv->stat_bytes;
	for (int32_t j = 0; j < n_keep; j++) {
		int32_t i = keep[j];
		RT_ASSERT(i >= j && i < h->n && (j == 0 || i > keep[j - 1]));
		if (i == j)
			continue;
		/* i > j always, so a forward gather never overwrites an entry still to be read */
		memcpy(h->k + (size_t)j * hd, h->k + (size_t)i * hd, hd * sizeof(float));
		memcpy(h->v + (size_t)j * hd, h->v + (size_t)i * hd, hd * sizeof(float));
		h->pos[j] = h->pos[i];
		h->count[j] = h->count[i];
		h->log_count[j] = h->log_count[i];
		h->span[j] = h->span[i];
		if (sb)
			memcpy(h->stats + (size_t)j * sb, h->stats + (size_t)i * sb, sb);
	}
	h->n = n_keep;
}

size_t rt_kv_entry_bytes(const rt_kv *kv)
{
	return 2 * (size_t)kv->head_dim * sizeof(float) + sizeof(int32_t) + 2 * sizeof(float) +
	       sizeof(uint16_t) + kv->stat_bytes;
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
