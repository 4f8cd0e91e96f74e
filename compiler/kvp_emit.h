/*
 * kvp_emit: the emitter core the C back end (kvp_emit_c.c) and the CUDA back end
 * (kvp_emit_cuda.c) print through, so a rule of the generated code is written once: the
 * output buffer (built in memory, so lines can be counted for #line), escaping of
 * strings, names and paths, numbers, the #line switches to the .kvp source and back, the
 * expression printer (signals, operators, float32 comparisons, the budget substitution),
 * the statistic update and read-out statements, and budget_of's return. The two back
 * ends differ only in the spellings of struct kvp_emit_target (the policy context `ctx`
 * and the entry `h->` in C, the scalar block `x` and the entry views `ob.`/`sc.` in CUDA).
 *
 * Safety (both back ends): source text reaches the output only through kvp_em_cstr
 * (escaped literal bodies), kvp_em_comment_name and kvp_em_comment_path (sanitised);
 * numbers are printed with %.17g from the IR's doubles.
 */
#ifndef KVP_EMIT_H
#define KVP_EMIT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvp_ir.h"

struct kvp_emit_opts {
	int line_directives;   /* 1: emit #line back to the .kvp source (default) */
	const char *out_name;  /* the generated file's name for the #line that switches back
	                          after source-derived code; NULL: no switch back */
};

/* How one back end spells what an expression reads (printf formats take an index). */
struct kvp_emit_target {
	const char *param;       /* parameter %d: "P[%d]" */
	const char *stat;        /* statistic %d at compress time: "stat_read_%d(...)" */
	const char *budget;      /* the budget in force: "budget_of(...)" */
	const char *context;     /* the context signal */
	const char *prompt_len;  /* the prompt_len signal */
	const char *n_layers;    /* the n_layers signal */
	const char *prompt_raw;  /* kvp_ctx.prompt_len as it is (-1 = unknown) */
	const char *seen_raw;    /* tokens seen as int64_t, at compress time */
	const char *ratio;       /* kvp_ctx.ratio */
	const char *byte_ratio;  /* kvp_ctx.byte_ratio */
	const char *step;        /* the observed query's position, in observe */
	const char *stat_block;  /* entry i's statistic words, in observe */
	const char *group;       /* query heads of the group, in observe */
	const char *attn;        /* the attention of query head r to entry i, in observe */
	int void_attn;           /* 1: mark attn used (a per-query-head loop may not read it) */
	int host_score;          /* 1: the score runs here with the whole head in reach
	                            (key_cos_mean's anchor, caote/normalize/expected_attention
	                            vectors); 0: those read 0.0 (the host compress runs them) */
};

/* Where the per-entry signals are read from: the entry's arrays (prefix of pos, count,
 * k, v), the head dimension, the entries of the head and the layer. */
struct kvp_emit_view {
	const char *e;           /* "h->" */
	const char *d;           /* "d" */
	const char *n;           /* "n" */
	const char *layer;       /* "layer" */
};

/* One unit being emitted. Zero-initialise, set ir, opts, t and view, then print; the
 * buffer is the caller's to write (kvp_em_write) and free (kvp_em_free). */
struct kvp_em {
	char *buf;
	size_t len, cap;
	int lines;               /* newlines written so far */
	const struct kvp_ir *ir;
	const struct kvp_emit_opts *opts;
	const struct kvp_emit_target *t;
	const struct kvp_emit_view *view;
	int in_src;              /* a #line to the .kvp source is in effect */
	int subst_budget;        /* emitting a trigger limit or target: a subtree equal to the
	                            budget's expression is the budget (see kvp_ir_same_tree) */
	int n_vec;               /* C: whole-head transform nodes, numbered in node order */
	int32_t *vec_of;         /* C: [n_nodes] their temporary index, -1 otherwise */
};

/* ---- buffer ------------------------------------------------------------------------- */
/* Append s[0..n) to em's buffer (grown by doubling, kept NUL-terminated) and count its
 * newlines into em->lines. Running out of memory aborts (RT_ASSERT): the compiler has no
 * partial output to give back. */
void kvp_em_put(struct kvp_em *em, const char *s, size_t n);
/* kvp_em_put of the printf-formatted text (any length). */
void kvp_em_out(struct kvp_em *em, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The line number the next byte will be on. */
int kvp_em_line_now(const struct kvp_em *em);
/* Write the buffer to f: 0, or -1 when writing fails. */
int kvp_em_write(const struct kvp_em *em, FILE *f);
/* Free the buffer and leave em's buffer empty (the rest of em is the caller's). */
void kvp_em_free(struct kvp_em *em);

/* ---- escaping ----------------------------------------------------------------------- */
/* s as the body of a C string literal (see kvp_emit_cstr). */
void kvp_em_cstr(struct kvp_em *em, const char *s);
/* A name inside a comment: only [A-Za-z0-9_] pass, at most 40 bytes, then "...". */
void kvp_em_comment_name(struct kvp_em *em, const char *s);
/* A path inside a comment: [A-Za-z0-9_./-] pass; never forms a comment closer. */
void kvp_em_comment_path(struct kvp_em *em, const char *s);
/* A double as a C double literal (%.17g round-trips exactly; integers get `.0`). */
void kvp_em_num(struct kvp_em *em, double v);

/* The exported C symbol of a policy: "kvp_policy_" + the name lower-cased with every byte
 * outside [a-z0-9_] replaced by '_'; when that changed anything (or the name is empty),
 * "_" + 8 hex digits of the name's hash are appended so distinct names give distinct
 * symbols. Writes at most len bytes (NUL included); returns the full length. */
size_t kvp_emit_symbol(const char *name, char *buf, size_t len);

/* Write s as the body of a C string literal (no quotes): printable ASCII except \ " ? is
 * copied, everything else becomes an octal escape, so no byte sequence (trigraphs, line
 * splices, comment closers, non-ASCII) can leave the literal. */
void kvp_emit_cstr(FILE *out, const char *s);

/* ---- #line -------------------------------------------------------------------------- */
/* Switch to the .kvp source at loc (nothing when #line is off or loc unknown). */
void kvp_em_line_src(struct kvp_em *em, struct kvp_loc loc);
/* Switch back to the generated file after kvp_em_line_src (needs opts->out_name). */
void kvp_em_line_back(struct kvp_em *em);

/* ---- expressions -------------------------------------------------------------------- */
/* Expression e in the target's spelling (double-valued C/C++). */
void kvp_em_expr(struct kvp_em *em, int32_t e);
/* Scalar expression e, or the number d when e < 0. */
void kvp_em_scalar_or(struct kvp_em *em, int32_t e, double d);
/* Expression e as readable pseudo-source for comments (names sanitised). */
void kvp_em_expr_comment(struct kvp_em *em, int32_t e);
/* 1 if expression e (or anything below it) uses signal s. */
int kvp_em_uses_signal(const struct kvp_ir *ir, int32_t e, enum kvp_ir_signal s);
/* 1 if expression e (or anything below it) reads statistic k. */
int kvp_em_uses_stat(const struct kvp_ir *ir, int32_t e, int k);

/* ---- shared sections ---------------------------------------------------------------- */
/* Before the entry loop of observe: alpha_k of each ema statistic and tail_k (the step is
 * in the observation window) of each prompt-tail one, at indent ind. */
void kvp_em_stat_prelude(struct kvp_em *em, const char *ind);
/* The updates of every statistic stored per query head (per_qhead 1) or shared (0). */
void kvp_em_stat_updates(struct kvp_em *em, int per_qhead, const char *ind);
/* The statistic updates of entry i inside observe's entry loop (at two tabs): its words
 * b, the visible-step count, the shared statistics, then per query head r its attn and
 * words q and the per-query-head statistics. */
void kvp_em_stat_entry(struct kvp_em *em);
/* The update of statistic k with value x_k, at indent ind, inside the entry loop (b: the
 * entry's words, q: the query head's; alpha_k and tail_k declared before the loop). */
void kvp_em_stat_update(struct kvp_em *em, int k, const char *ind);
/* The return statement(s) of statistic k's read-out (b and w declared: the entry's words
 * and the statistic's first word). */
void kvp_em_stat_read(struct kvp_em *em, int k);
/* A trigger limit or target e, where a copy of the budget's expression is the budget in
 * force (so it follows a ratio override), or the budget in force when e < 0. */
void kvp_em_budget_or(struct kvp_em *em, int32_t e);
/* The layer schedule of a k_compress_cfg (cfg: "cfg->" or "cfg."): layers and beta or
 * from/to; an explicit list is the back end's to print. */
void kvp_em_cfg_layers(struct kvp_em *em, const char *cfg);
/* The sinks and recent guards of a k_compress_cfg (cfg: "cfg->" or "cfg."), if any. */
void kvp_em_cfg_guards(struct kvp_em *em, const char *cfg);
/* budget_of's body: one `return k_budget_of(ratio, byte_ratio, context, <the budget>);`
 * (kernels/k_signal.h), the policy's budget or own_default when it has none. */
void kvp_em_budget_return(struct kvp_em *em, const char *own_default);

#endif
