/*
 * rt_kvpool: the process-wide KV block pool's accounting; see rt_kvpool.h.
 */
#include "kv/rt_kvpool.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static rt_kvpool process_pool = { .limit = INT64_MAX };

rt_kvpool *rt_kvpool_process(void)
{
	return &process_pool;
}

void rt_kvpool_set_limit(rt_kvpool *p, int64_t bytes)
{
	RT_ASSERT(bytes > 0);
	atomic_store(&p->limit, bytes);
}

int rt_kvpool_take(rt_kvpool *p, int64_t n, int64_t block_bytes)
{
	RT_ASSERT(n >= 0 && block_bytes > 0 && n <= INT64_MAX / block_bytes);
	const int64_t add = n * block_bytes, lim = atomic_load(&p->limit);
	int64_t cur = atomic_load(&p->used);
	do {
		if (add > lim - cur) {
			atomic_fetch_add(&p->refused, 1);
			return -1;
		}
	} while (!atomic_compare_exchange_weak(&p->used, &cur, cur + add));
	atomic_fetch_add(&p->blocks, n);
	int64_t pk = atomic_load(&p->peak);
	while (cur + add > pk && !atomic_compare_exchange_weak(&p->peak, &pk, cur + add))
		;
	return 0;
}

void rt_kvpool_give(rt_kvpool *p, int64_t n, int64_t block_bytes)
{
	RT_ASSERT(n >= 0 && block_bytes > 0);
	int64_t before = atomic_fetch_sub(&p->used, n * block_bytes);
	RT_ASSERT(before >= n * block_bytes);
	atomic_fetch_sub(&p->blocks, n);
}

void rt_kvpool_adjust(rt_kvpool *p, int64_t dblocks, int64_t dbytes)
{
	int64_t before = atomic_fetch_add(&p->used, dbytes);
	RT_ASSERT(before + dbytes >= 0);
	atomic_fetch_add(&p->blocks, dblocks);
}

rt_kvpool_stats rt_kvpool_get(const rt_kvpool *p)
{
	rt_kvpool_stats s = {
		.limit = atomic_load(&p->limit),
		.used = atomic_load(&p->used),
		.blocks = atomic_load(&p->blocks),
		.peak = atomic_load(&p->peak),
		.refused = atomic_load(&p->refused),
	};
	return s;
}

void rt_kvpool_peak_reset(rt_kvpool *p)
{
	atomic_store(&p->peak, atomic_load(&p->used));
}

int rt_kvpool_parse_size(const char *text, int64_t *bytes, rt_err *err)
{
	if (!text || !*text)
		return rt_err_set(err, "memory size: empty (give e.g. 512M or 2G)");
	if (!isdigit((unsigned char)text[0]))
		return rt_err_set(err, "memory size '%s': not a number (give e.g. 512M or 2G)", text);
	errno = 0;
	char *end = NULL;
	unsigned long long v = strtoull(text, &end, 10);
	if (errno == ERANGE)
		return rt_err_set(err, "memory size '%s': too large", text);
	int shift = 0;
	if (*end) {
		static const char *const suf[] = { "K", "M", "G", "T" };
		int found = 0;
		for (int i = 0; i < 4 && !found; i++) {
			const char *s = end;
			if (toupper((unsigned char)*s) != suf[i][0])
				continue;
			s++;
			if (*s == 'i' || *s == 'I')
				s++;
			if (*s == 'b' || *s == 'B')
				s++;
			if (!*s) {
				shift = 10 * (i + 1);
				found = 1;
			}
		}
		if (!found)
			return rt_err_set(err, "memory size '%s': unknown suffix '%s' (K, M, G or T)", text,
			                  end);
	}
	if (v == 0)
		return rt_err_set(err, "memory size '%s': must be positive", text);
	if (v > (unsigned long long)(INT64_MAX >> shift))
		return rt_err_set(err, "memory size '%s': too large", text);
	*bytes = (int64_t)(v << shift);
	return 0;
}
