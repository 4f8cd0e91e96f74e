/*
 * kvp_emit_c: the C back end. Turns one checked struct kvp_ir into a C11 translation unit
 * that defines the policy's statistics layout and the hooks of the policy ABI
 * (runtime/policy/rt_policy.h) and exports `const struct kvp_policy kvp_policy_<symbol>`; and
 * writes the `registry` unit that lists compiled policies in
 * `const struct kvp_policy *const kvp_registry[]` with `kvp_registry_count`.
 *
 * Contract (docs/architecture.md, "The pipeline"): line 1 is the banner
 * "/" "* generated from X.kvp by kvpc VERSION — do not edit *" "/"; the output is a pure
 * function of the IR and the options (byte-for-byte deterministic); `#line N "X.kvp"`
 * precedes code derived from a source construct unless opts->line_directives is 0; the
 * unit compiles with -std=c11 -Wall -Wextra -Werror; nothing from the .kvp source is
 * pasted as code: generated identifiers (stat_0, param_1) are used, names appear only in
 * fully escaped string literals and comments are made of generated text only, numbers
 * are printed with %.17g, an exact round trip of the stored doubles (integers get `.0`:
 * `2048.0`).
 */
#ifndef KVP_EMIT_C_H
#define KVP_EMIT_C_H

#include <stdio.h>

#include "kvp_emit.h"
#include "kvp_ir.h"

/* Emit the policy ir (already passed kvp_ir_check) to out. Returns 0, or -1 when writing
 * fails (errno is kept). */
int kvp_emit_c(const struct kvp_ir *ir, const struct kvp_emit_opts *opts, FILE *out);

/* Emit the registry unit for n policies named names[0..n) (policy names as in the IR, in
 * the order given). Returns 0, or -1 when two names map to the same symbol (err gets
 * "registry: policies NAME and NAME ...") or writing fails. */
int kvp_emit_registry(const char *const *names, int n, FILE *out, char *err, size_t err_len);

#endif
