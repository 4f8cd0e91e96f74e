/*
 * rt_kvbytes: compression in bytes against an f16 full cache (see rt_kvbytes.h).
 */
#include "kv/rt_kvbytes.h"

int64_t rt_kvbytes_held(const rt_kv *kv)
{
	if (!kv->tiered)
		return rt_kv_entries(kv) * 2 * (int64_t)kv->row_bytes;
	int64_t b = 0;
	for (int i = 0; i < kv->n_layer * kv->n_kv_head; i++)
		b += rt_kvbytes_head_held(kv, i);
	return b;
}

int64_t rt_kvbytes_head_held(const rt_kv *kv, int hi)
{
	const rt_kv_head *h = &kv->heads[hi];
	if (!kv->tiered)
		return (int64_t)h->n * 2 * (int64_t)kv->row_bytes;
	int64_t b = (int64_t)h->arena[RT_KV_KGROUPS].n * (int64_t)kv->kgroup_bytes;
	for (int t = 0; t < RT_KV_N_TIER; t++)
		b += (int64_t)h->arena[t].n * 2 * (int64_t)kv->tier_row[t];
	return b;
}

int64_t rt_kvbytes_f16(const rt_kv *kv, int64_t tokens)
{
	return tokens * kv->n_layer * kv->n_kv_head * 2 * (int64_t)kv->head_dim * 2;
}

double rt_kvbytes_compression(const rt_kv *kv, int64_t tokens)
{
	const int64_t held = rt_kvbytes_held(kv);
	return held > 0 ? (double)rt_kvbytes_f16(kv, tokens) / (double)held : 0;
}
