/*
 * test_kv: the KV store (runtime/kv/rt_kv.c) and its block pool (rt_kvpool.c). Checks the layout, append
 * semantics (count 1, log_count 0, zeroed statistics), and that eviction by
 * rt_kv_head_keep is an exact in-place gather of every per-entry array, independently
 * per (layer, KV head), on grouped-query shapes.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/rt_kv.h"
#include "support/check_run.h"

/* A value that encodes (head, position, dim) so any misplaced copy is detected. */
static float tag(int head, int pos, int d)
{
	return (float)(head * 100000 + pos * 100 + d);
}

static void fill(rt_kv *kv, int n)
{
	float k[64], v[64];
	for (int l = 0; l < kv->n_layer; l++)
		for (int g = 0; g < kv->n_kv_head; g++) {
			int hid = l * kv->n_kv_head + g;
			rt_kv_head *h = rt_kv_head_at(kv, l, g);
			for (int p = 0; p < n; p++) {
				for (int d = 0; d < kv->head_dim; d++) {
					k[d] = tag(hid, p, d);
					v[d] = -tag(hid, p, d);
				}
				int32_t i = rt_kv_append(kv, h, k, v, p);
				ck_assert_int_eq(i, p);
				for (size_t b = 0; b < kv->stat_bytes; b++)
					h->stats[(size_t)i * kv->stat_bytes + b] = (uint8_t)(p + b);
			}
		}
}

START_TEST(test_init_shapes)
{
	/* 9 query / 3 KV heads, as SmolLM2 */
	rt_kv kv;
	rt_err err = {0};
	ck_assert_int_eq(rt_kv_init(&kv, 2, 3, 3, 64, 16, 8, 4, &err), 0);
	ck_assert_int_eq(kv.group, 3);
	for (int i = 0; i < 6; i++) {
		ck_assert_int_eq(kv.heads[i].n, 0);
		ck_assert_int_eq(kv.heads[i].cap, 16);
		ck_assert_uint_eq((uintptr_t)kv.heads[i].k % 64, 0);
	}
	/* bytes per entry: 2 × 64 f32 + pos + count + log_count + span + 8 stat bytes */
	ck_assert_uint_eq(rt_kv_entry_bytes(&kv), 2 * 64 * 4 + 4 + 4 + 4 + 2 + 8);
	ck_assert_int_eq(rt_kv_entries(&kv), 0);
	rt_kv_free(&kv);
}
END_TEST

START_TEST(test_init_rejects_bad_shapes)
{
	rt_kv kv;
	rt_err err = {0};
	ck_assert_int_eq(rt_kv_init(&kv, 0, 3, 3, 64, 16, 0, 0, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "invalid shape"));
	ck_assert_int_eq(rt_kv_init(&kv, 2, 3, 3, 64, -5, 0, 0, &err), -1);
	ck_assert_int_eq(rt_kv_init(&kv, 30, 3, 3, 64, 2000000000, 0, 0, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "kv:"));
	rt_kv_free(&kv); /* safe on a failed init */
}
END_TEST

START_TEST(test_append_defaults)
{
	rt_kv kv;
	rt_err err = {0};
	ck_assert_int_eq(rt_kv_init(&kv, 1, 1, 4, 8, 4, 3, 0, &err), 0); /* 4/1 group */
	fill(&kv, 3);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 0);
	ck_assert_int_eq(h->n, 3);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(h->pos[i], i);
		ck_assert_float_eq(h->count[i], 1.0f);
		ck_assert_float_eq(h->log_count[i], 0.0f);
		ck_assert_int_eq(h->span[i], 0);
		ck_assert_float_eq(h->k[i * 8 + 5], tag(0, i, 5));
	}
	ck_assert_int_eq(rt_kv_entries(&kv), 3);
	ck_assert_int_eq(rt_kv_bytes_used(&kv), 3 * (int64_t)rt_kv_entry_bytes(&kv));
	rt_kv_free(&kv);
}
END_TEST

/* Each head keeps a different set; every array must follow its entry. */
START_TEST(test_keep_gathers_per_head)
{
	rt_kv kv;
	rt_err err = {0};
	const int n = 10, hd = 16;
	ck_assert_int_eq(rt_kv_init(&kv, 2, 3, 3, hd, n, 5, 0, &err), 0);
	fill(&kv, n);
	static const int32_t sets[6][10] = {
		{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, /* keep all */
		{0, 9},                         /* first and last */
		{3, 4, 5},
		{1, 3, 5, 7, 9},
		{8},
		{0, 2, 4, 6},
	};
	static const int nk[6] = {10, 2, 3, 5, 1, 4};
	for (int hid = 0; hid < 6; hid++) {
		rt_kv_head *h = &kv.heads[hid];
		h->count[sets[hid][0]] = 3.0f; /* a prototype: count and log travel together */
		h->log_count[sets[hid][0]] = logf(3.0f);
		h->span[sets[hid][nk[hid] - 1]] = 7;
		rt_kv_head_keep(&kv, h, sets[hid], nk[hid]);
	}
	int64_t total = 0;
	for (int hid = 0; hid < 6; hid++) {
		rt_kv_head *h = &kv.heads[hid];
		ck_assert_int_eq(h->n, nk[hid]);
		total += nk[hid];
		for (int j = 0; j < nk[hid]; j++) {
			int p = sets[hid][j];
			ck_assert_int_eq(h->pos[j], p);
			for (int d = 0; d < hd; d++) {
				ck_assert_float_eq(h->k[j * hd + d], tag(hid, p, d));
				ck_assert_float_eq(h->v[j * hd + d], -tag(hid, p, d));
			}
			for (int b = 0; b < 5; b++)
				ck_assert_int_eq(h->stats[j * 5 + b], (uint8_t)(p + b));
		}
		ck_assert_float_eq(h->count[0], 3.0f);
		ck_assert_float_eq_tol(h->log_count[0], logf(3.0f), 1e-7);
		ck_assert_int_eq(h->span[nk[hid] - 1], 7);
	}
	ck_assert_int_eq(rt_kv_entries(&kv), total);
	rt_kv_free(&kv);
}
END_TEST

/* Appending after an eviction reuses the freed slots: capacity bounds the memory. */
START_TEST(test_append_after_keep)
{
	rt_kv kv;
	rt_err err = {0};
	ck_assert_int_eq(rt_kv_init(&kv, 1, 4, 1, 4, 4, 0, 8, &err), 0); /* 4/4: plain MHA */
	fill(&kv, 4);
	rt_kv_head *h = rt_kv_head_at(&kv, 0, 2);
	memset(h->state, 0xab, 8);
	int32_t keep[] = {1, 3};
	rt_kv_head_keep(&kv, h, keep, 2);
	float k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
	ck_assert_int_eq(rt_kv_append(&kv, h, k, v, 4), 2);
	ck_assert_int_eq(rt_kv_append(&kv, h, k, v, 5), 3);
	ck_assert_int_eq(h->pos[0], 1);
	ck_assert_int_eq(h->pos[1], 3);
	ck_assert_int_eq(h->pos[3], 5);
	ck_assert_float_eq(h->v[3 * 4 + 2], 7.0f);
	rt_kv_reset(&kv);
	ck_assert_int_eq(rt_kv_entries(&kv), 0);
	ck_assert_int_eq(h->state[5], 0);
	rt_kv_free(&kv);
}
END_TEST

/* Blocks of a private pool, by hand: a 9/3-shaped store (2 layers × 3 KV heads, head_dim
 * 64, 8 statistics bytes) takes one block per list at entries 1, 17, 33 (RT_KV_BLOCK =
 * 16); keeping 5 of 40 entries returns every emptied block at once; a reservation the
 * pool cannot grant fails with nothing taken and a second store's entries untouched;
 * reset and free return everything. */
START_TEST(test_pool_blocks)
{
	rt_kvpool pool = { .limit = INT64_MAX };
	rt_kv kv, other;
	rt_err err = { "" };
	ck_assert_int_eq(rt_kv_init_pool(&kv, &pool, 2, 3, 3, 64, 64, 8, 0, &err), 0);
	ck_assert_int_eq(rt_kv_init_pool(&other, &pool, 1, 1, 4, 64, 64, 0, 0, &err), 0);
	const int64_t bb = 16 * (2 * 64 * 4 + 4 + 4 + 4 + 2 + 8); /* 16 entries of 534 bytes */
	ck_assert_int_eq(kv.block_bytes, bb);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 0); /* init takes no block */
	fill(&kv, 1);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 6);
	rt_kv_reset(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 0);
	fill(&kv, 40); /* 40 entries: 3 blocks per list */
	for (int i = 0; i < 6; i++)
		ck_assert_int_eq(kv.heads[i].nb, 3);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 18);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 18 * bb);
	ck_assert_int_eq(rt_kv_bytes_held(&kv), 18 * bb);
	const int32_t keep[5] = { 0, 9, 17, 30, 39 };
	rt_kv_head_keep(&kv, rt_kv_head_at(&kv, 1, 2), keep, 5);
	ck_assert_int_eq(rt_kv_head_at(&kv, 1, 2)->nb, 1);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 16);
	ck_assert_int_eq(rt_kv_head_at(&kv, 1, 2)->pos[4], 39);
	ck_assert(rt_kv_head_at(&kv, 1, 2)->k[4 * 64 + 5] == tag(5, 39, 5));
	ck_assert_int_eq(rt_kv_bytes_peak(&kv), 18 * bb);
	/* the other store: one list, 20 entries = 2 blocks of its own size */
	float k[64] = { 1 }, v[64] = { 2 };
	for (int p = 0; p < 20; p++)
		rt_kv_append(&other, rt_kv_head_at(&other, 0, 0), k, v, p);
	const int64_t used = rt_kvpool_get(&pool).used;
	ck_assert_int_eq(used, 16 * bb + 2 * other.block_bytes);
	/* the limit leaves room for 4 more of kv's blocks: 9 entries more need 5 (1 per list
	 * holding 40, none for the list of 5) */
	rt_kvpool_set_limit(&pool, used + 4 * bb);
	ck_assert_int_eq(rt_kv_reserve(&kv, 9, &err), -1);
	ck_assert_msg(strstr(err.msg, "KV pool exhausted") != NULL, "%s", err.msg);
	ck_assert_int_eq(err.code, RT_ERR_RESOURCE);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, used);
	ck_assert_int_eq(rt_kvpool_get(&pool).refused, 1);
	ck_assert_int_eq(rt_kv_entries(&kv), 5 * 40 + 5);
	ck_assert_int_eq(rt_kv_reserve(&kv, 8, &err), 0); /* 40 + 8 fits in 3 blocks */
	ck_assert_int_eq(rt_kvpool_get(&pool).used, used);
	rt_kvpool_set_limit(&pool, used + 6 * bb);
	/* 12 more: 52 entries need a 4th block in 5 lists, 17 a 2nd in the sixth */
	ck_assert_int_eq(rt_kv_reserve(&kv, 12, &err), 0);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, used + 6 * bb);
	ck_assert_int_eq(rt_kv_reserve(&kv, 100, &err), -1); /* capacity 64 */
	ck_assert_msg(strstr(err.msg, "capacity") != NULL, "%s", err.msg);
	ck_assert_int_eq(err.code, RT_ERR_RESOURCE);
	ck_assert_int_eq(other.heads[0].n, 20);
	ck_assert(other.heads[0].k[19 * 64] == 1.0f && other.heads[0].v[19 * 64] == 2.0f);
	/* trim after a compaction that set n itself returns the reserved-but-unused blocks */
	rt_kv_trim(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, used);
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 2);
	rt_kv_free(&other);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 0);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
	ck_assert_int_eq(rt_kvpool_get(&pool).peak, used + 6 * bb);
}
END_TEST

START_TEST(test_pool_parse_size)
{
	int64_t b = 0;
	rt_err err = { "" };
	ck_assert_int_eq(rt_kvpool_parse_size("512M", &b, &err), 0);
	ck_assert_int_eq(b, 512LL << 20);
	ck_assert_int_eq(rt_kvpool_parse_size("2GiB", &b, &err), 0);
	ck_assert_int_eq(b, 2LL << 30);
	ck_assert_int_eq(rt_kvpool_parse_size("4096", &b, &err), 0);
	ck_assert_int_eq(b, 4096);
	ck_assert_int_eq(rt_kvpool_parse_size("3k", &b, &err), 0);
	ck_assert_int_eq(b, 3072);
	const char *bad[] = { "", "M", "-1G", "0", "12X", "1.5G", "99999999999T" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ck_assert_msg(rt_kvpool_parse_size(bad[i], &b, &err) == -1, "'%s' accepted", bad[i]);
		ck_assert(strstr(err.msg, "memory size") != NULL);
	}
}
END_TEST

/* rt_kv_head_evict moves only the kept entries at or past the new length, into the evicted
 * slots below it (in increasing order), and returns the emptied blocks; worked by hand on a
 * 40-entry list (3 blocks) of the 9/3 shape with statistics. */
START_TEST(test_evict_moves_only_the_tail)
{
	rt_kvpool pool = { .limit = INT64_MAX };
	rt_kv kv;
	rt_err err = { "" };
	ck_assert_int_eq(rt_kv_init_pool(&kv, &pool, 2, 3, 3, 64, 64, 8, 0, &err), 0);
	fill(&kv, 40);
	/* keep {0, 9, 17, 30, 39}: 0 stays, 9 17 30 39 fill slots 1..4: 4 moves, 1 block left */
	rt_kv_head *h = rt_kv_head_at(&kv, 1, 2);
	const int32_t keep[5] = { 0, 9, 17, 30, 39 };
	ck_assert_int_eq(rt_kv_head_evict(&kv, h, keep, 5), 4);
	ck_assert_int_eq(h->n, 5);
	ck_assert_int_eq(h->nb, 1);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 16);
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(h->pos[i], keep[i]);
		for (int d = 0; d < 64; d++)
			ck_assert(h->k[i * 64 + d] == tag(5, keep[i], d) && h->v[i * 64 + d] == -tag(5, keep[i], d));
		for (int b = 0; b < 8; b++)
			ck_assert_uint_eq(h->stats[i * 8 + b], (uint8_t)(keep[i] + b));
	}
	/* one eviction in the middle (H2O's step): the last entry fills it, 1 move */
	rt_kv_head *g = rt_kv_head_at(&kv, 0, 1);
	int32_t all[40], n = 0;
	for (int i = 0; i < 40; i++)
		if (i != 10)
			all[n++] = i;
	ck_assert_int_eq(rt_kv_head_evict(&kv, g, all, n), 1);
	ck_assert_int_eq(g->n, 39);
	ck_assert_int_eq(g->pos[10], 39);
	ck_assert(g->k[10 * 64 + 3] == tag(1, 39, 3));
	for (int i = 0; i < 39; i++)
		if (i != 10)
			ck_assert_int_eq(g->pos[i], i);
	/* evicting the last entries (indices 33..38) moves nothing; 33 entries still need 3
	 * blocks */
	for (int i = 0; i < 33; i++)
		all[i] = i;
	ck_assert_int_eq(rt_kv_head_evict(&kv, g, all, 33), 0);
	ck_assert_int_eq(g->n, 33);
	ck_assert_int_eq(g->nb, 3);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 16);
	/* keeping nothing returns every block of the list */
	ck_assert_int_eq(rt_kv_head_evict(&kv, g, all, 0), 0);
	ck_assert_int_eq(g->nb, 0);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 13);
	rt_kv_free(&kv);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
}
END_TEST

/* Narrow element types: rows decode within the bound of their format, keep / compaction
 * moves the stored bytes unchanged, and a block holds the same 16 entries in fewer bytes.
 * Bounds, from the formats (runtime/kv/rt_kvq.h): f16 rounds to nearest with a relative
 * error of at most 2^-11 (values here are far above f16's subnormal range); Q8_0 is within
 * amax·(1/2 + 127·2^-11)/127 of x, amax the largest magnitude of x's block of 32. */
START_TEST(test_narrow_types)
{
	static const enum rt_kv_type types[2] = { RT_KV_F16, RT_KV_Q8_0 };
	static const size_t rows[2] = { 128, 68 }; /* head_dim 64: 64 halves; 2 x (2 + 32) */
	for (int t = 0; t < 2; t++) {
		rt_kvpool pool = { .limit = INT64_MAX };
		rt_kv kv;
		rt_err err = { "" };
		/* grouped-query shape 9/3: 3 KV heads, group 3 */
		ck_assert_int_eq(rt_kv_init_typed(&kv, &pool, types[t], 2, 3, 3, 64, 64, 8, 0, &err), 0);
		ck_assert_uint_eq(kv.row_bytes, rows[t]);
		ck_assert_int_eq(kv.block_bytes, 16 * (int64_t)(2 * rows[t] + 4 + 4 + 4 + 2 + 8));
		ck_assert(kv.heads[0].k == NULL && kv.heads[0].v == NULL);
		float k[40][64], v[40][64];
		uint64_t r = 12345u + (uint64_t)t;
		for (int p = 0; p < 40; p++)
			for (int d = 0; d < 64; d++) {
				r = r * 6364136223846793005ULL + 1442695040888963407ULL;
				k[p][d] = (float)((double)(r >> 40) / (double)(1u << 24) * 8.0 - 4.0);
				v[p][d] = -0.5f * k[p][d] + 0.25f;
			}
		for (int hh = 0; hh < 6; hh++)
			for (int p = 0; p < 40; p++)
				rt_kv_append(&kv, &kv.heads[hh], k[p], v[p], p);
		ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 18); /* 3 blocks per list */
		ck_assert_int_eq(rt_kvpool_get(&pool).used, 18 * kv.block_bytes);
		rt_kv_head *h = rt_kv_head_at(&kv, 1, 2);
		float buf[64];
		for (int p = 0; p < 40; p++) {
			const float *x = rt_kv_key(&kv, h, p, buf);
			for (int d = 0; d < 64; d++) {
				double bound;
				if (types[t] == RT_KV_F16) {
					bound = fabs(k[p][d]) * ldexp(1.0, -11);
				} else {
					double amax = 0;
					for (int j = d / 32 * 32; j < d / 32 * 32 + 32; j++)
						amax = fmax(amax, fabs(k[p][j]));
					bound = amax * (0.5 + 127.0 * ldexp(1.0, -11)) / 127.0;
				}
				ck_assert_msg(fabs(x[d] - k[p][d]) <= bound, "%s entry %d dim %d: %g vs %g",
				              rt_kv_type_name(types[t]), p, d, x[d], k[p][d]);
			}
		}
		/* the stored bytes of kept entries move unchanged */
		uint8_t want[5][2][128];
		const int32_t keep[5] = { 0, 9, 17, 30, 39 };
		for (int j = 0; j < 5; j++) {
			memcpy(want[j][0], h->kr + (size_t)keep[j] * kv.row_bytes, kv.row_bytes);
			memcpy(want[j][1], h->vr + (size_t)keep[j] * kv.row_bytes, kv.row_bytes);
		}
		rt_kv_head_keep(&kv, h, keep, 5);
		ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 16);
		for (int j = 0; j < 5; j++) {
			int32_t at = -1;
			for (int32_t i = 0; i < h->n; i++)
				if (h->pos[i] == keep[j])
					at = i;
			ck_assert_int_ge(at, 0);
			ck_assert(memcmp(h->kr + (size_t)at * kv.row_bytes, want[j][0], kv.row_bytes) == 0);
			ck_assert(memcmp(h->vr + (size_t)at * kv.row_bytes, want[j][1], kv.row_bytes) == 0);
		}
		/* set_key re-encodes: decoding a decoded row gives it back exactly */
		const float *x0 = rt_kv_key(&kv, h, 0, buf);
		float row[64];
		memcpy(row, x0, sizeof row);
		rt_kv_set_key(&kv, h, 0, row);
		const float *x1 = rt_kv_key(&kv, h, 0, buf);
		for (int d = 0; d < 64; d++)
			ck_assert(x1[d] == row[d]);
		rt_kv_free(&kv);
		ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
	}
	/* Q8_0 needs whole blocks of 32 values per row; an unknown type is refused */
	rt_kv kv;
	rt_err err = { "" };
	ck_assert_int_eq(rt_kv_init_typed(&kv, NULL, RT_KV_Q8_0, 1, 1, 4, 40, 8, 0, 0, &err), -1);
	ck_assert_msg(strstr(err.msg, "head_dim 40 is not a multiple of 32, which q8_0 needs"),
	              "%s", err.msg);
	ck_assert_int_eq(rt_kv_init_typed(&kv, NULL, (enum rt_kv_type)7, 1, 1, 4, 64, 8, 0, 0, &err), -1);
	ck_assert_msg(strstr(err.msg, "unknown element type"), "%s", err.msg);
	/* 4/1: one KV head, group 4, f16 at head_dim 40 (f16 has no block constraint) */
	ck_assert_int_eq(rt_kv_init_typed(&kv, NULL, RT_KV_F16, 1, 1, 4, 40, 8, 0, 0, &err), 0);
	ck_assert_uint_eq(kv.row_bytes, 80);
	rt_kv_free(&kv);
	for (int t = 0; t < RT_KV_N_TYPE; t++)
		ck_assert_int_eq(rt_kv_type_parse(rt_kv_type_name((enum rt_kv_type)t)), t);
	ck_assert_int_eq(rt_kv_type_parse("q4_0"), -1);
}
END_TEST

/* Shared prefixes (rt_kv.h, "Shared prefixes") on f16 stores of 2 layers x 3 KV heads (9/3
 * GQA), head_dim 64: 128-byte rows, so a page of 4096 bytes holds 32 rows and the unit is 32
 * entries. Every figure is hand-computed: a list's shared 32 entries are 2 blocks whose key
 * and value rows are 32 x 256 = 8192 bytes. */
START_TEST(test_shared_prefix)
{
	rt_kvpool pool = { .limit = INT64_MAX };
	rt_kv a, b, ctl, odd;
	rt_err err = { "" };
	rt_kv *all[4] = { &a, &b, &ctl, &odd };
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(rt_kv_init_typed(all[i], &pool, RT_KV_F16, 2, 3, 3, 64, 64, 8, 0, &err), 0);
		fill(all[i], 40);
	}
	const int64_t bb = 16 * (2 * 128 + 4 + 4 + 4 + 2 + 8); /* 16 entries of 278 bytes */
	const int64_t kvb = 32 * 256; /* a list's 32 shared entries' key and value rows */
	ck_assert_int_eq(a.block_bytes, bb);
	ck_assert_int_eq(rt_kv_prefix_unit(&a), 32);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 4 * 18 * bb);
	float x[64];
	for (int d = 0; d < 64; d++)
		x[d] = 0.5f + (float)d;
	rt_kv_set_key(&odd, rt_kv_head_at(&odd, 1, 1), 7, x); /* one row differs */

	ck_assert_ptr_null(rt_kv_prefix_make(&a, 40, &err)); /* not a multiple of 32 */
	ck_assert_msg(strstr(err.msg, "multiple of 32") != NULL, "%s", err.msg);
	rt_kv_prefix *px = rt_kv_prefix_make(&a, 32, &err);
	ck_assert_msg(px != NULL, "%s", err.msg);
	ck_assert_int_eq(rt_kv_prefix_lists(px), 6);
	ck_assert_int_eq(rt_kv_prefix_bytes(px), 6 * 32 * 256);
	/* a's copy left the pool and the prefix came in: the same bytes and blocks */
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 4 * 18 * bb);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 4 * 18);
	ck_assert_int_eq(rt_kv_prefix_attach(&odd, px, &err), 0);
	ck_assert_int_eq(rt_kv_prefix_attach(&b, px, &err), 1);
	ck_assert_int_eq(rt_kv_prefix_attach(&b, px, &err), 0); /* already sharing */
	ck_assert_int_eq(rt_kv_prefix_lists(px), 12);
	ck_assert_int_eq(rt_kv_shared_lists(&b), 6);
	/* counted once: b's 6 lists x 2 blocks left the pool */
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 4 * 18 * bb - 6 * kvb);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 4 * 18 - 12);
	ck_assert_int_eq(rt_kv_bytes_held(&b), 18 * bb); /* the store's own figure: whole lists */
	for (int i = 0; i < 6; i++) {
		ck_assert(!memcmp(a.heads[i].kr, ctl.heads[i].kr, 40 * 128));
		ck_assert(!memcmp(b.heads[i].vr, ctl.heads[i].vr, 40 * 128));
	}
	/* copy on write: a merge-like rewrite of b's entry 3 in list 4 */
	rt_kv_set_key(&b, &b.heads[4], 3, x);
	ck_assert_ptr_null(b.heads[4].px);
	ck_assert_int_eq(rt_kv_prefix_lists(px), 11);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 4 * 18 * bb - 5 * kvb);
	ck_assert(!memcmp(a.heads[4].kr, ctl.heads[4].kr, 40 * 128)); /* a's row untouched */
	ck_assert(memcmp(b.heads[4].kr + 3 * 128, ctl.heads[4].kr + 3 * 128, 128) != 0);
	ck_assert(!memcmp(b.heads[4].kr, ctl.heads[4].kr, 3 * 128));  /* the rest copied */
	ck_assert(!memcmp(b.heads[4].vr, ctl.heads[4].vr, 40 * 128));
	/* an eviction that keeps [0, 32) in place keeps sharing; one below 32 stops it */
	int32_t keep[40], nk = 0;
	for (int32_t i = 0; i < 40; i++)
		if (i != 35)
			keep[nk++] = i;
	rt_kv_head_evict(&a, &a.heads[1], keep, nk);
	ck_assert_ptr_nonnull(a.heads[1].px);
	for (int32_t i = 0; i < 39; i++)
		keep[i] = i + 1;
	rt_kv_head_keep(&a, &a.heads[0], keep, 39);
	ck_assert_ptr_null(a.heads[0].px);
	ck_assert_int_eq(rt_kv_prefix_lists(px), 10);
	ck_assert_int_eq(a.heads[0].pos[0], 1);
	ck_assert(!memcmp(a.heads[0].kr, ctl.heads[0].kr + 128, 39 * 128));
	/* 39 entries still need 3 blocks; the copy is counted again */
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 4 * 18 * bb - 4 * kvb);
	/* a reset leaves private, empty lists; free gives back what a still shares */
	rt_kv_reset(&b);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 3 * 18 * bb - 5 * kvb + 6 * kvb);
	ck_assert_int_eq(rt_kv_shared_lists(&b), 0);
	ck_assert_int_eq(rt_kv_prefix_lists(px), 5);
	fill(&b, 40);
	ck_assert(!memcmp(b.heads[2].kr, ctl.heads[2].kr, 40 * 128));
	rt_kv_free(&a);
	ck_assert_int_eq(rt_kv_prefix_lists(px), 0);
	/* the three stores' blocks and the prefix's 6 lists x 2 blocks, held until its owner lets go */
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 3 * 18 * bb + 6 * kvb);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 3 * 18 + 12);
	rt_kv_prefix_unref(px);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 3 * 18 * bb);
	for (int i = 1; i < 4; i++)
		rt_kv_free(all[i]);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 0);
}
END_TEST

/* Prefix caching (rt_kv_prefix_fork) on the same f16 stores as test_shared_prefix (2 layers x
 * 3 KV heads, 9/3 GQA, head_dim 64, 8 statistics bytes and 4 bytes of policy state a list):
 * a store forked from a prefix of 32 rows made when every list held 40 entries holds, array
 * for array, what the maker's lists held (rows 0..31 through the shared pages, 32..39
 * copied), and the pool holds its 3 blocks a list less the 32 x 256 row bytes a list it
 * shares. Refused: a prefix made from lists of different lengths, a store already holding
 * entries, another statistics size. */
START_TEST(test_prefix_fork)
{
	rt_kvpool pool = { .limit = INT64_MAX };
	rt_kv a, b, c, ragged, odd;
	rt_err err = { "" };
	rt_kv *all[5] = { &a, &b, &c, &ragged, &odd };
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(rt_kv_init_typed(all[i], &pool, RT_KV_F16, 2, 3, 3, 64, 64,
		                                  i == 4 ? 4 : 8, 4, &err), 0);
	fill(&a, 40);
	fill(&ragged, 40);
	int32_t keep[39];
	for (int32_t i = 0; i < 39; i++)
		keep[i] = i;
	rt_kv_head_keep(&ragged, &ragged.heads[5], keep, 39); /* one list holds 39, the rest 40 */
	fill(&c, 1);
	for (int i = 0; i < 6; i++) {
		a.heads[i].span[5] = 1; /* a protected entry, as a system turn's */
		a.heads[i].count[36] = 2.0f;
		memcpy(a.heads[i].state, (uint8_t[4]){ 1, 2, 3, (uint8_t)i }, 4);
	}
	const int64_t bb = 16 * (2 * 128 + 4 + 4 + 4 + 2 + 8), kvb = 32 * 256;
	rt_kv_prefix *px = rt_kv_prefix_make(&a, 32, &err);
	ck_assert_msg(px != NULL, "%s", err.msg);
	ck_assert_int_eq(rt_kv_prefix_fork_len(px), 40);
	ck_assert_int_eq(rt_kv_prefix_fork(&c, px, &err), 0);   /* c holds an entry */
	ck_assert_int_eq(rt_kv_prefix_fork(&odd, px, &err), 0); /* 4 statistics bytes, not 8 */
	const int64_t used = rt_kvpool_get(&pool).used;
	ck_assert_int_eq(rt_kv_prefix_fork(&b, px, &err), 1);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, used + 6 * (3 * bb - kvb));
	ck_assert_int_eq(rt_kv_prefix_lists(px), 12);
	ck_assert_int_eq(rt_kv_bytes_held(&b), 6 * 3 * bb);
	for (int i = 0; i < 6; i++) {
		const rt_kv_head *x = &a.heads[i], *y = &b.heads[i];
		ck_assert_int_eq(y->n, 40);
		ck_assert_ptr_eq(y->px, px);
		ck_assert(!memcmp(x->kr, y->kr, 40 * 128) && !memcmp(x->vr, y->vr, 40 * 128));
		ck_assert(!memcmp(x->pos, y->pos, 40 * 4) && !memcmp(x->count, y->count, 40 * 4) &&
		          !memcmp(x->log_count, y->log_count, 40 * 4) && !memcmp(x->span, y->span, 40 * 2) &&
		          !memcmp(x->stats, y->stats, 40 * 8) && !memcmp(x->state, y->state, 4));
		ck_assert_int_eq(y->pos[39], 39);
		ck_assert_int_eq(y->span[5], 1);
		ck_assert(y->count[36] == 2.0f);
		ck_assert_int_eq(y->state[3], i);
	}
	/* b's entries past the shared rows are its own: a rewrite there keeps sharing */
	float k[64] = { 0 };
	k[0] = 9.0f;
	rt_kv_set_key(&b, &b.heads[2], 35, k);
	ck_assert_ptr_eq(b.heads[2].px, px);
	ck_assert(memcmp(a.heads[2].kr + 35 * 128, b.heads[2].kr + 35 * 128, 128) != 0);
	rt_kv_prefix *pr = rt_kv_prefix_make(&ragged, 32, &err); /* rows shared, no fork */
	ck_assert_msg(pr != NULL, "%s", err.msg);
	ck_assert_int_eq(rt_kv_prefix_fork_len(pr), 0);
	ck_assert_int_eq(rt_kv_prefix_fork(&odd, pr, &err), 0);
	rt_kv_prefix_unref(pr);
	rt_kv_free(&b);
	ck_assert_int_eq(rt_kv_prefix_lists(px), 6);
	rt_kv_prefix_unref(px);
	for (int i = 0; i < 5; i++)
		if (i != 1)
			rt_kv_free(all[i]);
	ck_assert_int_eq(rt_kvpool_get(&pool).used, 0);
	ck_assert_int_eq(rt_kvpool_get(&pool).blocks, 0);
}
END_TEST

static Suite *kv_suite(void)
{
	Suite *s = suite_create("kv");
	TCase *tc = tcase_create("store");
	tcase_add_test(tc, test_init_shapes);
	tcase_add_test(tc, test_init_rejects_bad_shapes);
	tcase_add_test(tc, test_append_defaults);
	tcase_add_test(tc, test_keep_gathers_per_head);
	tcase_add_test(tc, test_append_after_keep);
	tcase_add_test(tc, test_pool_blocks);
	tcase_add_test(tc, test_pool_parse_size);
	tcase_add_test(tc, test_narrow_types);
	tcase_add_test(tc, test_evict_moves_only_the_tail);
	tcase_add_test(tc, test_shared_prefix);
	tcase_add_test(tc, test_prefix_fork);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed = check_run(kv_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
