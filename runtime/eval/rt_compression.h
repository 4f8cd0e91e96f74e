/*
 * rt_compression: the one definition of "compression" every command reports (ppl, ab,
 * needle, tune, bench tables and JSON), documented in docs/measuring.md ("Compression").
 * A full cache of T tokens holds T entries per (layer, KV head) list and, in bytes, every
 * token's key and value in f16 (runtime/kv/rt_kvbytes.h: the baseline llama.cpp keeps by
 * default). A run's compression is that full cache over what the policy held:
 *
 *   entries_end  = T / mean entries per list after the last token
 *   bytes_end    = f16 bytes of T tokens / key and value bytes held after the last token
 *   entries_peak = T / (most entries held at once by all lists / lists)
 *   bytes_peak   = f16 bytes of T tokens / most key and value bytes held at once
 *
 * "At once" is after a chunk's append, before any compress (rt_seq_stats), so the peak of a
 * prompt-end policy is its whole prompt: the memory a deployment must provision. With a
 * prompt split (prompt tokens P < T) entries_prompt and bytes_prompt are the same figures
 * for the P prompt tokens right after the prompt's compress (what a prompt-end policy made of
 * the prompt before the continuation was appended). Metadata, statistics and block rounding
 * are not compression: kv_bytes_peak (rt_kv_bytes_held) is that resident figure.
 */
#ifndef RT_COMPRESSION_H
#define RT_COMPRESSION_H

#include <stdint.h>
#include <stdio.h>

#include "policy/rt_seq.h"

typedef struct rt_compression {
	double tokens;           /* T: tokens fed (a mean over runs may be fractional) */
	double entries_end, bytes_end, entries_peak, bytes_peak; /* as above; 0 when held 0 */
	double prompt;           /* P when 0 < P < T, else 0 */
	double entries_prompt, bytes_prompt; /* with P: after the prompt's compress, else 0 */
} rt_compression;

/* Sequence s's compression after it was fed `tokens` tokens (its counters and store now). */
void rt_compression_of(const rt_seq *s, int64_t tokens, rt_compression *c);

/* The mean of c[0..n) (n >= 1), field by field: what a command reports over several
 * prompts or texts of one policy. */
void rt_compression_mean(const rt_compression *c, int n, rt_compression *out);

/* acc += c / n, field by field (acc zeroed first by the caller): the mean of n runs one run
 * at a time. */
void rt_compression_add(rt_compression *acc, const rt_compression *c, int n);

/* 1 when a and b hold different memory: their compression in bytes at the end differs by
 * more than `tol` (a fraction, e.g. 0.10) of the larger, |a - b| > tol × max(a, b); with
 * prompt = 1 (both compress once at the prompt end, so the continuation after it is the
 * same uncompressed tokens for both and the end hides what they kept) their prompt's bytes
 * right after its compress are compared too. Entries alone do not count: a tiered policy
 * holding more entries at fewer bits in the same bytes holds the same memory (its entries
 * are its policy's choice). */
int rt_compression_differ(const rt_compression *a, const rt_compression *b, double tol,
                          int prompt);

/* The JSON members, each preceded by a comma: "compression", "bytes_compression" (at the
 * end), "compression_peak", "bytes_compression_peak" and with a prompt split
 * "prompt_compression", "prompt_bytes_compression" (non-finite as null). */
void rt_compression_json(FILE *out, const rt_compression *c);

/* One table line: "compression      4.00x in entries, 3.98x in bytes at the end; 1.02x,
 * 1.01x at peak" and, with a prompt split, a second line for the prompt. */
void rt_compression_table(FILE *out, const rt_compression *c);

#endif
