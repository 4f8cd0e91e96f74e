/*
 * rt_pick: the one policy choice of every front door; see rt_pick.h.
 */
#include "policy/rt_pick.h"

#include "report/rt_json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct kvp_policy *rt_pick_find(const struct kvp_policy *const *reg, int n_reg,
                                      const char *name)
{
	return rt_registry_find(reg, reg ? n_reg : 0, name); /* "full" is reserved: built in */
}

/* The text of one note bit; NULL for any other bit. */
static const char *pick_note(unsigned bit)
{
	switch (bit) {
	case KVP_NOTE_FLOOR:
		return "the floor (min_kv, or the policy's budget min) raised the budget";
	case KVP_NOTE_GUARDS:
		return "the guards exceeded the budget, which was raised to hold them";
	case KVP_NOTE_SPAN:
		return "a protected span exceeded the budget and was kept whole: the cache holds "
		       "more than the budget";
	}
	return NULL;
}

const char *rt_pick_note_next(unsigned *notes)
{
	for (unsigned b = 1; b <= KVP_NOTE_LAST; b <<= 1)
		if (*notes & b) {
			*notes &= ~b;
			return pick_note(b);
		}
	*notes = 0; /* bits above the last note name nothing */
	return NULL;
}

void rt_pick_notes_json(FILE *out, unsigned notes)
{
	fputc('[', out);
	const char *t;
	for (unsigned n = notes, first = 1; (t = rt_pick_note_next(&n)); first = 0) {
		fputs(first ? "" : ",", out);
		rt_json_str(out, t);
	}
	fputc(']', out);
}

/* An error of field f: out->field = f, the message in err (RT_ERR_INPUT). Returns -1. */
static int pick_fail(struct rt_pick *out, enum rt_pick_field f, rt_err *err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int pick_fail(struct rt_pick *out, enum rt_pick_field f, rt_err *err, const char *fmt, ...)
{
	char msg[sizeof err->msg];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	out->field = f;
	return rt_err_setc(err, RT_ERR_INPUT, "%s", msg);
}

/* "unknown policy 'x' (this binary has: a, b, full)" */
static int unknown_policy(const struct rt_pick_in *in, const char *name, struct rt_pick *out,
                          rt_err *err)
{
	char list[384] = "";
	size_t used = 0;
	for (int i = 0; i < in->n_reg && in->reg && used < sizeof list - 70; i++)
		used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
		                         in->reg[i]->name);
	snprintf(list + used, sizeof list - used, "%sfull", used ? ", " : ""); /* reserved */
	return pick_fail(out, RT_PICK_POLICY, err, "unknown policy '%.64s' (this binary has: %s)",
	                 name, list);
}

/* The element type in force, or -1 after an error: a policy's KV needs against it. */
static int pick_kv_type(const struct rt_pick_in *in, const struct kvp_policy *p,
                        struct rt_pick *out, rt_err *err)
{
	const char *sp = in->spellings[RT_PICK_KV_TYPE];
	enum rt_kv_type t = in->kv_type >= 0 ? (enum rt_kv_type)in->kv_type
	                    : (p->needs & KVP_NEED_F32_KV) ? RT_KV_F32 : in->kv_default;
	if ((p->needs & KVP_NEED_F32_KV) && t != RT_KV_F32)
		return pick_fail(out, RT_PICK_KV_TYPE, err, "%s %s: policy %s reads and rewrites f32 "
		                 "key/value rows; it needs --kv-type f32", sp, rt_kv_type_name(t), p->name);
	if ((p->needs & KVP_NEED_TIERS) && t == RT_KV_Q8_0)
		return pick_fail(out, RT_PICK_KV_TYPE, err, "%s q8_0: policy %s sets precision tiers, "
		                 "whose top tier is f16 or f32", sp, p->name);
	out->kv_type = t;
	return 0;
}

/* The ratio in force: the given one (checked), else the tuned default. */
static int pick_ratio(const struct rt_pick_in *in, const struct kvp_policy *p,
                      struct rt_pick *out, rt_err *err)
{
	const char *const *sp = in->spellings;
	rt_err e = { "" };
	if (rt_ratio_check(in->ratio, 0, &e) != 0)
		return pick_fail(out, RT_PICK_RATIO, err, "%s: %s", sp[RT_PICK_RATIO], e.msg);
	if (rt_ratio_check(in->byte_ratio, 1, &e) != 0)
		return pick_fail(out, RT_PICK_BYTE_RATIO, err, "%s: %s", sp[RT_PICK_BYTE_RATIO], e.msg);
	if ((in->ratio > 0 || in->byte_ratio > 0) && !p->compress) {
		enum rt_pick_field f = in->ratio > 0 ? RT_PICK_RATIO : RT_PICK_BYTE_RATIO;
		return pick_fail(out, f, err, "%s: policy %s never compresses, so a ratio does not "
		                 "apply", sp[f], p->name);
	}
	if (in->ratio > 0 && in->byte_ratio > 0)
		return pick_fail(out, RT_PICK_BYTE_RATIO, err, "%s counts entries and %s bytes; give "
		                 "one of them", sp[RT_PICK_RATIO], sp[RT_PICK_BYTE_RATIO]);
	out->ratio = in->ratio;
	out->byte_ratio = in->byte_ratio;
	int bytes = 0;
	double t = in->ratio > 0 || in->byte_ratio > 0 || !in->tuned || !p->compress
	           ? 0 : in->tuned(p, &bytes);
	if (t > 0) {
		*(bytes ? &out->byte_ratio : &out->ratio) = t;
		out->tuned = 1;
	}
	return 0;
}

int rt_pick(const struct rt_pick_in *in, struct rt_pick *out, rt_err *err)
{
	memset(out, 0, sizeof *out);
	const char *name = in->policy ? in->policy
	                   : in->reg && in->n_reg > 0 && in->reg[0] ? in->reg[0]->name : "full";
	const struct kvp_policy *p = rt_pick_find(in->reg, in->n_reg, name);
	if (!p)
		return unknown_policy(in, name, out, err);
	if (pick_kv_type(in, p, out, err) != 0)
		return -1;
	if (in->prefill_chunk < 0 || in->prefill_chunk > 65536)
		return pick_fail(out, RT_PICK_PREFILL, err, "%s: prefill chunk must be 0..65536 "
		                 "tokens, got %d", in->spellings[RT_PICK_PREFILL], (int)in->prefill_chunk);
	out->prefill_chunk = in->prefill_chunk;
	if (!(in->min_kv >= 0 && in->min_kv <= 1 << 30 && in->min_kv == floor(in->min_kv)))
		return pick_fail(out, RT_PICK_MIN_KV, err, "%s: the floor must be a whole number of "
		                 "tokens in 0..1073741824, got %g", in->spellings[RT_PICK_MIN_KV],
		                 in->min_kv);
	out->min_kv = in->min_kv;
	out->vals = calloc((size_t)(p->n_params > 0 ? p->n_params : 1), sizeof *out->vals);
	if (!out->vals) {
		out->field = RT_PICK_POLICY;
		return rt_err_set(err, "policy %s: out of memory for its parameters", p->name);
	}
	rt_err e = { "" };
	if (rt_pick_vals(p, in->sets, in->n_sets, out->vals, &e) != 0) {
		rt_pick_free(out);
		return pick_fail(out, RT_PICK_SET, err, "%s: %s", in->spellings[RT_PICK_SET], e.msg);
	}
	if (pick_ratio(in, p, out, err) != 0) {
		enum rt_pick_field f = out->field;
		rt_pick_free(out);
		out->field = f;
		return -1;
	}
	out->p = p;
	return 0;
}

int rt_pick_vals(const struct kvp_policy *p, const char *const *sets, int n_sets, double *vals,
                 rt_err *err)
{
	kvp_policy_param_defaults(p, vals);
	for (int i = 0; i < n_sets; i++)
		if (kvp_policy_param_set(p, vals, sets[i], err) != 0)
			return -1;
	return kvp_policy_params_check(p, vals, err); /* once all are set */
}

void rt_pick_free(struct rt_pick *pk)
{
	free(pk->vals);
	pk->vals = NULL;
	pk->p = NULL;
}
