/*
 * kvp_fmt: the canonical text of a .kvp policy (`kvpc fmt`). Canonical form: one
 * statement per line, indented by 4 spaces inside `policy NAME { ... }`; single spaces
 * around binary operators and '=', none inside brackets, ", " between arguments;
 * parentheses only where precedence needs them; numbers as written followed by their
 * unit word (plural, singular for 1: `1 step`) or '%'; comments kept verbatim, a comment
 * on a statement's line stays at the end of that line after two spaces, other comments
 * stay on their own line before the next statement; runs of blank lines become one, and
 * none follows '{' or precedes '}'. Formatting is idempotent: fmt(fmt(x)) == fmt(x).
 */
#ifndef KVP_FMT_H
#define KVP_FMT_H

#include "kvp_ast.h"

/* The canonical text of a tree that parsed without errors (malloc'd, NUL-terminated). */
char *kvp_fmt_file(const kvp_file *f);

/* Parse src and format it. Returns the malloc'd text, or NULL when src has syntax errors
 * (reported in src). */
char *kvp_fmt_src(kvp_src *src);

/* Append the canonical text of expression e to a malloc'd buffer (used by tests and
 * by messages); returns a new malloc'd string. */
char *kvp_fmt_expr(const kvp_expr *e);

#endif
