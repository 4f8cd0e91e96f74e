/*
 * rt_sha256: SHA-256 (FIPS 180-4). One implementation for the whole tree: the run metadata
 * of every report (model, text and policy-source hashes) and kvpc's build cache key.
 * Streaming: init, update any number of times, then hex; a context is plain memory owned by
 * the caller (no allocation).
 */
#ifndef RT_SHA256_H
#define RT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "base/rt_util.h"

typedef struct rt_sha256 {
	uint32_t h[8];
	uint8_t buf[64];
	uint64_t len;   /* bytes hashed so far */
} rt_sha256;

void rt_sha256_init(rt_sha256 *c);
void rt_sha256_update(rt_sha256 *c, const void *p, size_t n);
/* Finish and write 64 lower-case hex digits + NUL to out. c must be re-initialised
 * before reuse. */
void rt_sha256_hex(rt_sha256 *c, char out[65]);
/* Hex SHA-256 of a whole file. Returns 0, or -1 with err "PATH: reason" (out = ""). */
int rt_sha256_file(const char *path, char out[65], rt_err *err);

#endif
