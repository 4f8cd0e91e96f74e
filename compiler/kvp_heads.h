/*
 * kvp_heads: the per-(layer, KV head) weight file that `head_score("FILE")` names
 * (docs/language.md 7.12): DuoAttention-style head classes (arXiv 2410.10819), written by
 * scripts/calibrate/duo_heads.py or by hand. The compiler reads it once and bakes the table into
 * the generated C, so a build carries its weights and the runtime reads no file.
 *
 * Format (text, UTF-8): '#' starts a comment that runs to the end of the line; blank lines
 * are skipped. The first line is `heads L G` (L layers >= 1, G KV heads per layer >= 1,
 * at most KVP_HEADS_MAX weights in all); then exactly L lines of G finite numbers each,
 * the weights of layer 0's KV heads 0..G-1 first. A higher weight is a head that needs its
 * whole history (a retrieval head); the lowest ones are streamed first.
 */
#ifndef KVP_HEADS_H
#define KVP_HEADS_H

#include <stddef.h>

#define KVP_HEADS_MAX 65536 /* weights per file: L × G */

/* Read PATH. On success returns 0, *layers = L, *kv_heads = G and *w = the malloc'ed
 * [L × G] weights (row = layer; the caller frees it). On failure returns -1 and writes
 * "PATH:LINE: reason" (or "PATH: reason") into err[errlen]; *w is NULL. */
int kvp_heads_read(const char *path, int *layers, int *kv_heads, double **w, char *err,
                   size_t errlen);

#endif
