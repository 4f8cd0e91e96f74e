/*
 * rt_tuned: the sidecar file of a tuned policy. `kvpc tune POLICY.kvp ...` (BIN tune)
 * writes it next to the policy, POLICY.tune for POLICY.kvp; `kvpc build` reads it and
 * bakes its ratio (in entries or in bytes) into the binary as the policy's default
 * budget, and
 * `kvpc build --gate` re-measures the gate it records and refuses the build when it no
 * longer holds.
 *
 * Why a sidecar and not a statement in the .kvp source: the chosen ratio is a measurement
 * (of this model, on these texts, under these limits), not part of the algorithm. Kept
 * apart, the policy source and its hash stay what the author wrote, `kvpc fmt` and the
 * policy library are untouched by tuning, one policy can be tuned differently in two
 * deployments, and a re-tune rewrites only the sidecar (a reviewable one-line diff).
 *
 * Format: UTF-8 text, one `KEY VALUE` per line (VALUE runs to the end of the line), '#'
 * starts a comment line, blank lines are ignored, keys in any order, each at most once
 * except `text`:
 *   policy NAME           the policy's name (must match the .kvp file's)
 *   source_hash HEX       16 hex digits: the policy source the gate was measured on
 *                         (struct kvp_policy.source_hash)
 *   ratio R               the chosen compression ratio in entries (>= 1): the baked-in
 *                         default, as --ratio R
 *   byte_ratio R          or the chosen compression ratio in bytes against an f16 full
 *                         cache (>= 1), as --byte-ratio R; exactly one of the two
 *   max_kld X             the limit on every text's mean KL, nats per token
 *   min_passkey P         the limit on passkey accuracy in [0, 1] (absent: none)
 *   passkey_len N         passkey prompt tokens (with min_passkey)
 *   depths LIST           passkey needle depths, percent, comma-separated
 *   ctx N                 tokens of each text the gate scores (its first N)
 *   path exact|fast|fast-f32-act  the forward path tune measured on (its --exact, the
 *                         default; --fast: f16 store and 8-bit activations; --fast
 *                         --f32-act), which the gate uses again: a budget reaches other
 *                         bytes and KL on another path (absent, as in older sidecars: exact)
 *   chunk N               tune's forward chunk (--chunk), which the gate uses again (on the
 *                         fast path it moves the rounding); absent: the default
 *   model PATH            the GGUF model
 *   text PATH             a text of the gate (repeated, 1..RT_TUNED_MAX_TEXTS)
 *   kld MEAN              measured at ratio: the worst text's mean KL (information)
 *   passkey ACC           measured at ratio: passkey accuracy (information)
 *   bytes_x X             measured at ratio: compression in bytes (information)
 *   entries_x X           measured at ratio: compression in entries (information)
 * Paths are absolute (tune resolves them), so the gate runs from any directory.
 */
#ifndef RT_TUNED_H
#define RT_TUNED_H

#include <stddef.h>

#include "base/rt_util.h"

#define RT_TUNED_MAX_TEXTS 32

typedef struct rt_tuned {
	char policy[128];
	char source_hash[17];
	double ratio;            /* >= 1, in entries or (bytes) in bytes */
	int bytes;               /* 1: `byte_ratio` (a budget in bytes), 0: `ratio` (entries) */
	double max_kld;          /* >= 0 */
	double min_passkey;      /* in [0, 1], or -1: no passkey limit */
	long passkey_len;        /* > 0 with min_passkey */
	char depths[256];        /* "" or a comma list */
	long ctx;                /* >= 2 */
	int fast;                /* 1: measured on the fast path (`path fast...`), 0: exact */
	int f32_act;             /* 1: with --f32-act (`path fast-f32-act`) */
	long chunk;              /* tune's --chunk, or 0: the default */
	char *model;             /* heap */
	char *texts[RT_TUNED_MAX_TEXTS]; /* heap */
	int n_texts;
	double kld;              /* measured worst text mean KL at ratio, or -1 */
	double passkey;          /* measured passkey accuracy at ratio, or -1 */
	double bytes_x, entries_x; /* measured compression at ratio, or -1 */
} rt_tuned;

/* An empty record (no texts, min_passkey/kld/passkey/bytes_x/entries_x -1). */
void rt_tuned_init(rt_tuned *t);
void rt_tuned_free(rt_tuned *t);

/* The sidecar path of a policy file: "DIR/NAME.tune" for "DIR/NAME.kvp", else the path
 * with ".tune" appended. Returns 0, or -1 when it does not fit in out[cap]. */
int rt_tuned_path(const char *kvp_path, char *out, size_t cap);

/* Read path into t (rt_tuned_init first; t owns its strings). Errors (-1, err
 * "PATH:LINE: reason", t partly filled, still safe to free): unreadable file, an unknown
 * or repeated key, a value that is not a number in range, a missing required key (policy,
 * source_hash, ratio or byte_ratio, max_kld, ctx, model, at least one text; passkey_len and depths with
 * min_passkey), both `ratio` and `byte_ratio`. */
int rt_tuned_read(const char *path, rt_tuned *t, rt_err *err);

/* Write t to path (atomically: a temporary file renamed into place) after the comment
 * lines of `comment` (each line of it prefixed with "# "; may be NULL). Errors (-1, err
 * "PATH: reason"): cannot create or write. */
int rt_tuned_write(const char *path, const rt_tuned *t, const char *comment, rt_err *err);

#endif
