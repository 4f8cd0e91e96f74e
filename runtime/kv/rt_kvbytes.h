/*
 * rt_kvbytes: compression counted in bytes. The baseline is the full cache a deployment
 * would otherwise hold: every token's key and value in f16 (2 bytes per element), which
 * is what llama.cpp keeps by default (its --cache-type-k/-v f16), so "1x" is an f16 full
 * cache whatever element type this store uses. The bytes a store holds are its keys and
 * values as stored: for each (layer, KV head) list, entries × 2 rows (K and V) ×
 * rt_kv.row_bytes, so an f32 store at a compression of R entries holds R / 2 times fewer
 * bytes than the f16 baseline and a narrower element type (scales included in row_bytes)
 * more. A tiered store (rt_kv_init_tiered) counts each entry's rows at its own tier:
 * Σ over lists and tiers of the entries at tier t × 2 × the tier's row bytes, plus the
 * key groups' ranges (4 · head_dim bytes each, runtime/kv/rt_kv.h). Per-entry
 * metadata (position, count, span, policy statistics) and the block
 * rounding of the pool are not counted here: rt_kv_bytes_held is that resident figure.
 *
 *   f16 baseline = tokens × n_layer × n_kv_head × 2 × head_dim × 2 bytes
 *   held         = Σ over (layer, KV head) lists of n × 2 × row_bytes
 *                  (tiered: Σ over lists and tiers t of n_t × 2 × row_bytes(t)
 *                   + key groups × 4 · head_dim)
 *   compression  = f16 baseline / held
 */
#ifndef RT_KVBYTES_H
#define RT_KVBYTES_H

#include <stdint.h>

#include "kv/rt_kv.h"

/* Bytes of the keys and values kv holds now (see above). */
int64_t rt_kvbytes_held(const rt_kv *kv);

/* The same for one (layer, KV head) list hi (0 <= hi < n_layer · n_kv_head): its entries'
 * rows (at their tiers) and its key groups; rt_kvbytes_held is the sum over the lists. */
int64_t rt_kvbytes_head_held(const rt_kv *kv, int hi);

/* Bytes an f16 full cache of kv's shape holds after `tokens` tokens (tokens >= 0). */
int64_t rt_kvbytes_f16(const rt_kv *kv, int64_t tokens);

/* rt_kvbytes_f16(kv, tokens) / rt_kvbytes_held(kv): the compression in bytes after
 * `tokens` tokens; 0 when the store holds nothing. */
double rt_kvbytes_compression(const rt_kv *kv, int64_t tokens);

#endif
