/*
 * rt_pick: the one policy choice of every front door. The command line (--policy, --set,
 * --ratio, --byte-ratio, --prefill-chunk, --kv-type), serve's defaults and an HTTP
 * request's "kv" object (runtime/serve) each pass what they were given and get back the
 * policy, its parameter values and the compression ratio in force, or one error naming
 * the field that is wrong. Each rule is written here once:
 *   - the policy exists (else the message lists the binary's policies);
 *   - its KV needs fit the store's element type (KVP_NEED_F32_KV: f32 rows, GraceKV;
 *     KVP_NEED_TIERS: a top tier of f16 or f32);
 *   - every "name=value" is a parameter of it with a value its unit allows;
 *   - a ratio is a finite number >= 1 (rt_ratio_check of runtime/policy/rt_policy.h, also
 *     the library's own guard in rt_run_set_ratio), given in entries or in bytes but not both, and only to a
 *     policy that compresses ("never compresses, so a ratio does not apply");
 *   - without a ratio, the build's tuned default for the policy is in force (in entries
 *     or in bytes, as tuned: runtime/policy/rt_tuned.h);
 *   - a floor (min_kv, tokens) turns graceful budgets on: the budget is at least
 *     min(floor, context) entries per head and guards that exceed it raise it
 *     (kernels/k_compress.h k_budget_check, reported in kvp_ctx.notes).
 * A door spells the fields its own way (`--ratio` on the command line, `kv.ratio` in a
 * request): it passes its spellings in, so every message names the field as the user
 * wrote it, and the error's field says which one (the server's `param`).
 */
#ifndef RT_PICK_H
#define RT_PICK_H

#include <stdint.h>
#include <stdio.h>

#include "base/rt_util.h"
#include "kv/rt_kv.h"
#include "policy/rt_policy.h"

/* The fields of a choice. ORDER RT_PICK_FIELD: a door's spellings[]. */
enum rt_pick_field {
	RT_PICK_POLICY = 0,  /* the policy's name */
	RT_PICK_KV_TYPE,     /* the store's element type */
	RT_PICK_SET,         /* a "name=value" parameter value */
	RT_PICK_RATIO,       /* compression factor in entries */
	RT_PICK_BYTE_RATIO,  /* compression factor in bytes */
	RT_PICK_PREFILL,     /* chunked prefill */
	RT_PICK_MIN_KV,      /* the floor of a graceful budget, tokens */
	RT_PICK_N_FIELDS
};

/* What a door was given. Zero-initialise and fill what applies. */
struct rt_pick_in {
	const struct kvp_policy *const *reg; /* the binary's policies [n_reg] (may be NULL) */
	int n_reg;
	const char *policy;       /* the policy's name; NULL: reg[0], else the built-in full */
	int kv_type;              /* the store's element type (enum rt_kv_type) as chosen, or
	                             -1: not chosen, then kv_default, or f32 for a policy that
	                             needs f32 rows */
	enum rt_kv_type kv_default;
	const char *const *sets;  /* [n_sets] "name=value", applied in order */
	int n_sets;
	double ratio;             /* compression factor in entries; 0: none */
	double byte_ratio;        /* compression factor in bytes; 0: none */
	int32_t prefill_chunk;    /* 0..65536 (rt_run_set_prefill_chunk) */
	double min_kv;            /* the floor in tokens (kvp_ctx.min_kv), a whole number
	                             0..2^30; 0: none (strict budgets) */
	/* the build's tuned default of a policy (its ratio, *bytes = 1 when it counts bytes),
	 * 0 when none; NULL: the binary has none */
	double (*tuned)(const struct kvp_policy *p, int *bytes);
	/* the door's name of each field, as its messages print it ("--ratio", "kv.ratio") */
	const char *const *spellings; /* [RT_PICK_N_FIELDS] */
};

/* The choice in force. */
struct rt_pick {
	const struct kvp_policy *p;
	enum rt_kv_type kv_type;  /* the store's element type */
	double *vals;             /* [p->n_params]: defaults, then the sets; owned (rt_pick_free) */
	double ratio, byte_ratio; /* in force, at most one non-zero (given, else the tuned) */
	int tuned;                /* 1: the ratio in force is the build's tuned default */
	int32_t prefill_chunk;
	double min_kv;
	enum rt_pick_field field; /* after an error: the field that is wrong */
};

/* Choose. Returns 0 with *out filled (free with rt_pick_free), or -1 with out->field and
 * err set (code RT_ERR_INPUT, or RT_ERR_INTERNAL when memory ran out); the message names
 * the field with the door's spelling: "--ratio: policy full never compresses, so a ratio
 * does not apply", "unknown policy 'x' (this binary has: h2o, full)". Nothing is
 * allocated after an error. */
int rt_pick(const struct rt_pick_in *in, struct rt_pick *out, rt_err *err);
/* Free what rt_pick allocated in pk (its vals); pk->p is the registry's, not freed. */
void rt_pick_free(struct rt_pick *pk);

/* The parameter values of policy p: its defaults, then "name=value" sets[0..n_sets) in
 * order, into vals[0..p->n_params) (rt_pick's rule for --set and kv.set, for a door that
 * applies a choice it has already checked). Returns 0, or -1 with kvp_policy_param_set's
 * error, or the policy's check_params' once every set is applied (a value its compiler
 * would refuse: kvp_policy_params_check), in err (RT_ERR_INPUT, without a field's
 * spelling). */
int rt_pick_vals(const struct kvp_policy *p, const char *const *sets, int n_sets, double *vals,
                 rt_err *err);

/* The named policy: the registry's, or the built-in full ("full" is reserved); NULL. */
const struct kvp_policy *rt_pick_find(const struct kvp_policy *const *reg, int n_reg,
                                      const char *name);

/* The next note of a graceful budget in *notes (KVP_NOTE_* bits, kvp_ctx.notes: the floor,
 * the guards, a protected span): the text of its lowest set bit, which it clears, for a report
 * or a response; NULL once no known bit is left (unknown bits are cleared unread). Every
 * report walks its notes with it, `for (unsigned n = notes; (t = rt_pick_note_next(&n));)`,
 * so the notes and their order are written here only. */
const char *rt_pick_note_next(unsigned *notes);

/* The notes of `notes` (KVP_NOTE_* bits) as a JSON array of their texts, "[]" for none, on
 * out: every report's `budget_notes` (ppl, needle, ab). */
void rt_pick_notes_json(FILE *out, unsigned notes);

#endif
