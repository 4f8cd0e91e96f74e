/*
 * rt_kvbytes: compression in bytes against an f16 full cache (see rt_kvbytes.h).
 */
#include "kv/rt_kvbytes.h"

int64_t rt_kvbytes_held(const rt_kv *kv)
{
	return rt_kv_entries(kv) * 2 * (int64_t)kv->row_bytes;
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
