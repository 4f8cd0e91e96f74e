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

/*
 * The linear scorer file that `linear_score("FILE")` names (docs/language.md 7.14): KVzap's
 * surrogate (arXiv 2601.07891), per (layer, KV head) a weight vector w over the layer's
 * input hidden state h (after the layer's attention RMSNorm) and a bias b, score =
 * w·h + b, trained by scripts/calibrate/kvzap_train.py to predict log KVzip scores. Baked
 * into the generated C like head_score()'s table; the run refuses a model of another
 * shape (kernels/k_score.h k_linear_check).
 *
 * Format (text, UTF-8; '#' comments and blank lines as above): the first line is
 * `linear L G E` (L layers, G KV heads per layer, E the hidden size: the model the file
 * was trained for; L, G >= 1, 1 <= E <= KVP_LINEAR_MAX_E, at most KVP_LINEAR_MAX numbers
 * in all); then exactly L × G lines of E + 1 finite numbers, w_0 .. w_{E-1} then b, the
 * rows of layer 0's KV heads 0..G-1 first.
 */
#define KVP_LINEAR_MAX_E 16384
#define KVP_LINEAR_MAX (1 << 24) /* numbers per file: L × G × (E + 1) */

/* Read PATH. On success returns 0, *layers = L, *kv_heads = G and *w = the malloc'ed
 * [L × G] weights (row = layer; the caller frees it). On failure returns -1 and writes
 * "PATH:LINE: reason" (or "PATH: reason") into err[errlen]; *w is NULL. */
int kvp_heads_read(const char *path, int *layers, int *kv_heads, double **w, char *err,
                   size_t errlen);

/* Read PATH (format above). On success returns 0, *layers = L, *kv_heads = G, *embd = E
 * and *w = the malloc'ed [L × G × (E + 1)] rows (the caller frees it). On failure returns
 * -1 and writes "PATH:LINE: reason" (or "PATH: reason") into err[errlen]; *w is NULL. */
int kvp_linear_read(const char *path, int *layers, int *kv_heads, int *embd, float **w,
                    char *err, size_t errlen);

#endif
