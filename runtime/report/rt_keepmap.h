/*
 * rt_keepmap: a picture of what a KV-cache policy keeps. Given, for every
 * (layer, KV head) entry list, the original positions of the entries it holds and the
 * number of tokens each represents (rt_kv's pos[] and count[]), it draws an SVG 1.1 grid:
 * one row per (layer, KV head), rows grouped by layer, x = token position 0..N-1 (binned
 * into at most RT_KEEPMAP_MAX_COLS columns when N is larger), a cell filled where the head
 * keeps a position (class "k") and filled with a hatch where it holds a merged prototype
 * (count > 1, class "m"), a kept-count per row, an x axis, a legend and a title with the
 * policy, its parameters, the ratio, N and the kept fraction per head.
 *
 * A merged prototype is drawn at its (rounded mean) position: the KV store does not record
 * which positions a prototype stands for, so the span it represents is not drawn.
 *
 * Output is deterministic (same input, same bytes: coordinates with two decimals, the
 * C locale, no timestamps) and always well-formed XML: every caller text goes through
 * rt_svg_escape_append. The drawing is at most 1400 px wide.
 */
#ifndef RT_KEEPMAP_H
#define RT_KEEPMAP_H

#include <stddef.h>
#include <stdint.h>

#include "base/rt_util.h"

#define RT_KEEPMAP_MAX_COLS 1000

/* One (layer, KV head) list (borrowed, not copied). */
typedef struct rt_keepmap_head {
	const int32_t *pos;   /* [n] original positions, tokens, each in [0, n_tokens) */
	const float *count;   /* [n] tokens represented (>= 1; > 1 = merged), or NULL (all 1) */
	int32_t n;            /* entries */
} rt_keepmap_head;

typedef struct rt_keepmap {
	int n_layer;                  /* transformer layers, >= 1 */
	int n_kv_head;                /* KV heads per layer, >= 1 */
	int64_t n_tokens;             /* N: positions 0..N-1 drawn, >= 1 */
	const rt_keepmap_head *heads; /* [n_layer × n_kv_head], index layer·n_kv_head + head */
	const char *policy;           /* policy name (UTF-8, escaped), may be NULL */
	const char *params;           /* parameter text, e.g. "heavy=50% recent=50%", may be NULL */
	double ratio;                 /* compression ratio asked for, 0 = the policy's own */
	double byte_ratio;            /* or one in bytes against f16 (--byte-ratio, or tuned), 0:
	                                 none; at most one of the two is set */
} rt_keepmap;

/* Counts over all heads: entries (all), merged entries (count > 1), and the min / max /
 * mean entries per head. */
typedef struct rt_keepmap_summary {
	int64_t entries, merged;
	int32_t min_per_head, max_per_head;
	double mean_per_head;
} rt_keepmap_summary;

/* Fill *s from km (no validation beyond what rt_keepmap_render checks). */
void rt_keepmap_summarize(const rt_keepmap *km, rt_keepmap_summary *s);

/* Render km to a NUL-terminated heap string (caller frees); *len (if non-NULL) gets its
 * length in bytes. Columns: bin = ceil(N / RT_KEEPMAP_MAX_COLS) positions each; a column
 * is drawn "m" if any merged entry falls in it, else "k" if any entry does (opacity =
 * entries / bin when bin > 1), else left as background. Errors (NULL, err set):
 * n_layer or n_kv_head < 1 or their product > 4096, n_tokens < 1, heads NULL, a head with
 * n < 0 or NULL pos when n > 0, a position outside [0, n_tokens), a count < 1 or NaN. */
char *rt_keepmap_render(const rt_keepmap *km, size_t *len, rt_err *err);

/* Render and write to path. Errors: as rt_keepmap_render, and those of rt_outpath_write
 * (base/rt_outpath.h) for I/O. */
int rt_keepmap_write(const char *path, const rt_keepmap *km, rt_err *err);

#endif
