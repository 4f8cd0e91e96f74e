/*
 * kvp_src: one .kvp source text, its line map and its located diagnostics. Every later
 * stage of kvpc (scanner, parser, semantic analysis, lowering) reports problems through
 * kvp_src_error with a kvp_srcloc, and the text comes out in one stable format (GNU style,
 * golden-tested in tests/golden/kvp/):
 *
 *   FILE:LINE:COL: error: MESSAGE
 *       LINE | source line text
 *            |        ^~~~
 *
 * The gutter is the line number right-aligned in 5 columns, a space, '|' and a space;
 * the caret line has 6 spaces, '|', a space, then the caret under the first character
 * of the located span and '~' under the rest of the span on that line. Lines and
 * columns are 1-based; columns count Unicode code points (UTF-8), and a tab in the
 * source is copied into the caret line so the caret stays aligned. Lines longer than
 * 160 bytes are shown as a window around the column with "..." at the cut ends. Bytes
 * that are not printable UTF-8 (control characters, invalid sequences) are shown as '?'.
 * Diagnostics are collected in memory (kvp_src_diags) and printed by the driver in source
 * order (by the offset of each error or warning, its notes kept after it; errors about the
 * whole file first), whatever order the passes found them in; after KVP_MAX_ERRORS errors
 * further errors are dropped and one line, printed last, says so.
 */
#ifndef KVP_SRC_H
#define KVP_SRC_H

#include <stddef.h>
#include <stdint.h>

/* A source span: bytes [off, end) of the text; line and col (1-based, col in code
 * points) are those of off. Every AST node carries one. */
typedef struct kvp_srcloc {
	uint32_t off, end;
	int line, col;
} kvp_srcloc;

#define KVP_MAX_ERRORS 20
/* Largest source accepted (bytes); bigger files get one error. */
#define KVP_MAX_SOURCE (16u << 20)

typedef struct kvp_src {
	char *path;          /* name used in diagnostics (owned copy) */
	char *text;          /* [len + 2] bytes, NUL-terminated copy of the source (owned) */
	size_t len;
	uint32_t *line_start; /* [n_lines] byte offset where each line starts */
	int n_lines;
	int n_errors;        /* errors reported (including dropped ones) */
	int n_notes;
	char *diags;         /* collected diagnostics text, NUL-terminated (owned) */
	/* kvp_src_pos cache: offset, line index and column of the last query, so the
	 * scanner's left-to-right queries cost O(token) even on a 1 MB line */
	uint32_t pos_off;
	int pos_line, pos_col;
	size_t diags_len, diags_cap;
	/* diags is the concatenation of these groups (an error or warning with its notes) in
	 * order of key (the source offset); a report inserts its group in place */
	struct kvp_diag_group {
		uint64_t key;     /* sort key: source offset, 0 for the whole file, then the cap */
		size_t off, len;  /* bytes [off, off + len) of diags */
	} *groups;
	int n_groups, groups_cap;
	int cur_group;       /* the group the next text goes to (the last report's), -1: none */
} kvp_src;

/* Read PATH into a new kvp_src. Returns NULL and writes "PATH: reason" into err[errlen]
 * when the file cannot be read, is not a regular file (a directory, FIFO or device: opened
 * without blocking and refused before any read) or is larger than KVP_MAX_SOURCE. Free
 * with kvp_src_free. */
kvp_src *kvp_src_open(const char *path, char *err, size_t errlen);

/* A kvp_src over a copy of text[0..len) named name (for tests and the fuzzer); never
 * NULL (aborts on out-of-memory). */
kvp_src *kvp_src_from_mem(const char *name, const char *text, size_t len);

void kvp_src_free(kvp_src *src);

/* Line (1-based) and column (1-based, code points) of byte offset off (clamped to len). */
void kvp_src_pos(kvp_src *src, uint32_t off, int *line, int *col);

/* A kvp_srcloc for bytes [off, end). */
kvp_srcloc kvp_src_loc(kvp_src *src, uint32_t off, uint32_t end);

/* A one-character kvp_srcloc at 1-based line and column (clamped into the text). */
kvp_srcloc kvp_src_loc_at(kvp_src *src, int line, int col);

/* Report an error (printf-style message, no trailing newline or period) at loc. */
void kvp_src_error(kvp_src *src, kvp_srcloc loc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Report a warning at loc ("FILE:LINE:COL: warning: MESSAGE" and the source line): the
 * file still compiles (n_errors is not counted). */
void kvp_src_warning(kvp_src *src, kvp_srcloc loc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* A note attached to the previous error (e.g. "first defined here"); dropped when the
 * error before it was dropped. */
void kvp_src_note(kvp_src *src, kvp_srcloc loc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* An error about the whole file, without a place: "FILE: error: MESSAGE". */
void kvp_src_error_file(kvp_src *src, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* The diagnostics collected so far ("" when none). Owned by src. */
const char *kvp_src_diags(const kvp_src *src);

/* Checks that the text has no NUL byte and is valid UTF-8 (no overlong forms, no
 * surrogates, <= U+10FFFF); reports the first offending byte as an error. Returns 0 when
 * clean, -1 after reporting. */
int kvp_src_check_bytes(kvp_src *src);

/* Levenshtein distance of a and b, capped at cap+1 (used for "did you mean"). */
int kvp_edit_distance(const char *a, const char *b, int cap);

#endif
