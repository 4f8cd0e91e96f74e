/*
 * rt_cli_opts: the shared option table and parser, error printers, list parsing and
 * policy resolution of the command line; see rt_cli_opts.h.
 */
#include "cli/rt_cli_opts.h"

#include "base/rt_outpath.h"
#include "kv/rt_kvpool.h"
#include "cli/rt_cli_meta.h"
#include "cli/rt_cli_tuned.h"
#include "policy/rt_pick.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char *rt_cli_prog = "kvrt";
const struct kvp_policy *const *rt_cli_reg;
int rt_cli_n_reg;

void rt_cli_help(const char *page)
{
	static const char *const slots[] = { "{prog}", "{policy}" };
	const char *at;
	while ((at = strchr(page, '{'))) {
		fwrite(page, 1, (size_t)(at - page), stdout);
		size_t i = 0, n = sizeof slots / sizeof slots[0];
		while (i < n && strncmp(at, slots[i], strlen(slots[i])))
			i++;
		if (i == n) { /* a brace of the text ("kv": {...}) */
			fputc('{', stdout);
			page = at + 1;
			continue;
		}
		fputs(i == 0 ? rt_cli_prog : rt_cli_default_policy(), stdout);
		page = at + strlen(slots[i]);
	}
	fputs(page, stdout);
}

/* ---- errors ---------------------------------------------------------------------------- */

int rt_cli_usage(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s: ", rt_cli_prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '%s %s%s--help' for more information.\n", rt_cli_prog, cmd, *cmd ? " " : "");
	return RT_CLI_USAGE;
}

int rt_cli_fail(const rt_err *err)
{
	fprintf(stderr, "%s: %s\n", rt_cli_prog, err->msg);
	return EXIT_FAILURE;
}

/* ---- the option table ------------------------------------------------------------------- */

/* How an option's value is stored: by opt_value's own case (OPT), as a checked long
 * (INTOPT), as the argument string itself (STROPT) or as a fixed int (FLAGOPT). */
enum { K_OWN, K_LONG, K_STR, K_FLAG };

/* Every option of every command, written once: its name, whether it takes a value, and for
 * the stored kinds the field and, for plain integers, the range. */
typedef struct opt_def {
	int id;
	const char *name;      /* long name ("" for -n) */
	int has_arg;
	int kind;              /* K_* */
	long lo, hi;           /* K_LONG: integer range; K_FLAG: lo is the value stored */
	long off;              /* offsetof(rt_cli_opts, field) of a long, a const char * or an
	                        * int, or -1 (K_OWN) */
	const char *what;      /* "is not ..." of the range error */
} opt_def;

#define INTOPT(id, name, lo, hi, field, what) \
	{ id, name, 1, K_LONG, lo, hi, (long)offsetof(rt_cli_opts, field), what }
#define STROPT(id, name, field) { id, name, 1, K_STR, 0, 0, (long)offsetof(rt_cli_opts, field), NULL }
#define FLAGOPT(id, name, field, v) \
	{ id, name, 0, K_FLAG, v, 0, (long)offsetof(rt_cli_opts, field), NULL }
#define OPT(id, name, has_arg) { id, name, has_arg, K_OWN, 0, 0, -1, NULL }

static const opt_def OPTS[] = {
	STROPT('m', "model", model), OPT('t', "text", 1), STROPT('p', "prompt", prompt),
	STROPT('f', "file", prompt_file), OPT(O_CTX, "ctx", 1),
	INTOPT('n', "", 1, INT_MAX, n_gen, "is not a token count >= 1"),
	INTOPT(O_GEN, "gen", 1, 4096, n_gen, "is not a token count in 1..4096"),
	INTOPT(O_PROMPTLEN, "prompt", 0, INT_MAX, prompt_len, "is not a token count"),
	INTOPT(O_CHUNK, "chunk", 1, 65536, chunk, "is not a number in 1..65536"),
	INTOPT(O_THREADS, "threads", 1, 256, threads, "is not a number in 1..256"),
	INTOPT(O_PP, "pp", 0, 1 << 20, pp, "is not a number in 0..1048576"),
	INTOPT(O_TG, "tg", 0, 1 << 20, tg, "is not a number in 0..1048576"),
	INTOPT(O_DECODE, "decode", 1, 1 << 20, decode, "is not a positive count"),
	INTOPT(O_SEED, "seed", 0, LONG_MAX, seed, "is not a non-negative integer"),
	INTOPT(O_SCOREFROM, "score-from", 1, INT_MAX, score_from, "is not a position >= 1"),
	INTOPT(O_PREFILL, "prefill-chunk", 0, 65536, prefill_chunk, "is not a number in 0..65536"),
	INTOPT(O_MINKV, "min-kv", 0, 1 << 30, min_kv, "is not a token count in 0..1073741824"),
	OPT(O_RATIO, "ratio", 1), OPT(O_BYTERATIO, "byte-ratio", 1), OPT(O_SET, "set", 1),
	OPT(O_MODE, "mode", 1),
	OPT(O_TASK, "task", 1), STROPT(O_POLICY, "policy", policy),
	STROPT(O_HAYSTACK, "haystack", haystack), STROPT(O_LENGTHS, "lengths", lengths),
	STROPT(O_DEPTHS, "depths", depths), STROPT(O_SVG, "svg", svg),
	STROPT(O_BATCH, "batch", batch), STROPT(O_DUMP, "dump", dump),
	STROPT(O_DUMPSCORES, "dump-scores", dump_scores),
	STROPT(O_DUMPHIDDEN, "dump-hidden", dump_hidden),
	STROPT(O_LOGITS, "logits", logits), STROPT(O_SYSTEM, "system", system),
	FLAGOPT(O_JSON, "json", json, 1), FLAGOPT(O_NOREF, "no-ref", no_ref, 1),
	FLAGOPT(O_CHAT, "chat", chat, 1), FLAGOPT(O_SPECIAL, "special", special, 1),
	FLAGOPT(O_STATS, "stats", stats, 1), FLAGOPT(O_MARKQ, "mark-question", mark_question, 1),
	FLAGOPT(O_EQMEM, "equal-memory", equal_memory, 1),
	OPT('h', "help", 0), OPT(O_VERSION, "version", 0),
	FLAGOPT(O_EXACT, "exact", exact, 1), FLAGOPT(O_FAST, "fast", exact, 0),
	FLAGOPT(O_F32ACT, "f32-act", f32_act, 1),
	FLAGOPT(O_NOSHARE, "no-share-prefix", no_share, 1),
	STROPT(O_DEPTH, "depth", depths), STROPT(O_A, "a", name_a), STROPT(O_B, "b", name_b),
	STROPT(O_RATIOS, "ratio", ratio_list), OPT(O_ABTASK, "task", 1),
	OPT(O_SETA, "set-a", 1), OPT(O_SETB, "set-b", 1), STROPT(O_JSONOUT, "json", json_out),
	STROPT(O_CSV, "csv", csv), STROPT(O_PLOT, "plot", plot), OPT(O_SEED64, "seed", 1),
	INTOPT(O_RES, "resamples", 2, 1000000, resamples, "is not a number in 2..1000000"),
	STROPT(O_COMMIT, "commit", commit), STROPT(O_SHAA, "source-sha256-a", sha_a),
	STROPT(O_SHAB, "source-sha256-b", sha_b), FLAGOPT(O_QUIET, "quiet", quiet, 1),
	OPT(O_MAXKLD, "max-kld", 1), OPT(O_MINPASSKEY, "min-passkey", 1),
	STROPT(O_OUT, "out", out), FLAGOPT(O_GATE, "gate", gate, 1),
	OPT(O_KVTYPE, "kv-type", 1), STROPT(O_BYTERATIOS, "byte-ratio", byte_ratio_list),
	FLAGOPT(O_BYTES, "bytes", bytes_flag, 1), FLAGOPT(O_ENTRIES, "entries", entries_flag, 1),
	STROPT(O_PARAMGRID, "param", param_grid),
	/* serve */
	STROPT(O_HOST, "host", host), STROPT(O_APIKEY, "api-key", api_key),
	STROPT(O_TRACE, "trace", trace), OPT(O_KVMEM, "kv-memory", 1), OPT(O_MAXBODY, "max-body", 1),
	INTOPT(O_PORT, "port", 0, 65535, port, "is not a whole number in 0..65535"),
	INTOPT(O_MAXSEQS, "max-seqs", 1, 4096, max_seqs, "is not a whole number in 1..4096"),
	INTOPT(O_QUEUE, "queue", 0, 100000, queue, "is not a whole number in 0..100000"),
	INTOPT(O_SERVECHUNK, "chunk", 1, 4096, chunk, "is not a whole number in 1..4096"),
	INTOPT(O_SERVEPREFILL, "prefill-chunk", 0, 4096, prefill_chunk,
	       "is not a whole number in 0..4096"),
	INTOPT(O_STEPROWS, "step-rows", 1, 65536, step_rows, "is not a whole number in 1..65536"),
	INTOPT(O_TIMEOUT, "timeout", 1, 86400, timeout, "is not a whole number in 1..86400"),
	OPT(O_DEVICE, "device", 1), FLAGOPT(O_F16, "f16", f16_weights, 1),
	/* run's sampling: serve's request fields' bounds (runtime/serve/rt_serve_req.c) */
	OPT(O_TEMP, "temp", 1), OPT(O_TOPP, "top-p", 1),
	INTOPT(O_TOPK, "top-k", 0, 1000000, top_k, "is not a whole number in 0..1000000"),
};
#define N_OPTS ((int)(sizeof OPTS / sizeof OPTS[0]))

static const opt_def *opt_find(int id)
{
	for (int i = 0; i < N_OPTS; i++)
		if (OPTS[i].id == id)
			return &OPTS[i];
	return NULL;
}

/* The option's name as the user wrote it, for messages: "--chunk", "-n". */
static const char *opt_spelling(const opt_def *d, char *buf, size_t cap)
{
	if (d->name[0])
		snprintf(buf, cap, "--%s", d->name);
	else
		snprintf(buf, cap, "-%c", (char)d->id);
	return buf;
}

/* 0 when arg is the word a or the word b; else RT_CLI_USAGE after printing
 * "NAME: 'ARG' is not A or B" (nm: the option as spelled). The caller stores arg first:
 * after a usage error nothing reads the options. */
static int one_of(const char *cmd, const char *nm, const char *arg, const char *a, const char *b)
{
	if (strcmp(arg, a) && strcmp(arg, b))
		return rt_cli_usage(cmd, "%s: '%s' is not %s or %s", nm, arg, a, b);
	return 0;
}

/* Check and store one option's value. Returns 0 or RT_CLI_USAGE (message printed). */
static int opt_value(const char *cmd, const opt_def *d, const char *arg, rt_cli_opts *o)
{
	char nm[40];
	opt_spelling(d, nm, sizeof nm);
	switch (d->kind) {
	case K_STR:
		*(const char **)(void *)((char *)o + d->off) = arg;
		return 0;
	case K_FLAG:
		*(int *)(void *)((char *)o + d->off) = (int)d->lo;
		return 0;
	case K_LONG: {
		long v;
		if (rt_parse_int(arg, d->lo, d->hi, &v))
			return rt_cli_usage(cmd, "%s: '%s' %s", nm, arg, d->what);
		*(long *)(void *)((char *)o + d->off) = v;
		return 0;
	}
	}
	switch (d->id) {
	case 't':
		o->text = arg;
		if (o->n_texts < RT_CLI_MAX_LIST)
			o->texts[o->n_texts] = arg;
		o->n_texts++; /* a command that takes several checks the count */
		return 0;
	case O_CTX: {
		long v;
		if (o->ctx_list) {
			o->ctx_list = arg;
			return 0;
		}
		if (rt_parse_int(arg, 2, INT_MAX, &v))
			return rt_cli_usage(cmd, "--ctx: '%s' is not a token count >= 2", arg);
		o->ctx = v;
		return 0;
	}
	case O_RATIO: case O_BYTERATIO: {
		const int bytes = d->id == O_BYTERATIO;
		double r;
		if (rt_parse_double(arg, &r) != 0 || r == 0 || rt_ratio_check(r, bytes, NULL) != 0)
			return rt_cli_usage(cmd, "%s: '%s' is not a compression factor >= 1", nm, arg);
		*(bytes ? &o->byte_ratio : &o->ratio) = r;
		return 0;
	}
	case O_MAXKLD: case O_MINPASSKEY: {
		double v;
		if (rt_parse_double(arg, &v) != 0 || v < 0 || (d->id == O_MINPASSKEY && v > 1))
			return rt_cli_usage(cmd, "%s: '%s' is not %s", nm, arg,
			                    d->id == O_MAXKLD ? "a KL divergence >= 0 (nats per token)"
			                                      : "an accuracy in 0..1");
		*(d->id == O_MAXKLD ? &o->max_kld : &o->min_passkey) = v;
		return 0;
	}
	case O_SET: case O_SETA: case O_SETB:
		if (o->n_sets == RT_CLI_MAX_SETS)
			return rt_cli_usage(cmd, "%s: more than %d overrides", nm, RT_CLI_MAX_SETS);
		if (!strchr(arg, '=') || arg[0] == '=')
			return rt_cli_usage(cmd, "%s: expected NAME=VALUE, got '%s'", nm, arg);
		o->set_side[o->n_sets] = d->id == O_SETA ? 1 : d->id == O_SETB ? 2 : 0;
		o->sets[o->n_sets++] = arg;
		return 0;
	case O_ABTASK:
		o->ab_task = arg;
		return one_of(cmd, nm, arg, "ppl", "needle");
	case O_SEED64: {
		if (rt_parse_u64(arg, &o->seed64))
			return rt_cli_usage(cmd, "--seed: '%s' is not a 64-bit unsigned integer", arg);
		o->seed64_set = 1;
		return 0;
	}
	case O_TEMP: case O_TOPP: {
		const int temp = d->id == O_TEMP;
		double v;
		if (rt_parse_double(arg, &v) != 0 || (temp ? v < 0 || v > 2 : v <= 0 || v > 1))
			return rt_cli_usage(cmd, "%s: '%s' is not %s", nm, arg,
			                    temp ? "a temperature in 0..2" : "a probability in (0, 1]");
		*(temp ? &o->temp : &o->top_p) = v;
		return 0;
	}
	case O_MODE:
		o->mode_agnostic = !strcmp(arg, "agnostic");
		o->mode_given = 1;
		return one_of(cmd, nm, arg, "aware", "agnostic");
	case O_KVTYPE:
		if (rt_kv_type_parse(arg) < 0)
			return rt_cli_usage(cmd, "--kv-type: '%s' is not f32, f16 or q8_0", arg);
		o->kv_type = arg;
		return 0;
	case O_TASK: { /* the names in rt_needle_kind's order */
		static const char *const tasks[] = { "passkey", "niah", "multikey", "instruct" };
		for (int i = 0; i < (int)(sizeof tasks / sizeof *tasks); i++)
			if (!strcmp(arg, tasks[i])) {
				o->task = i;
				return 0;
			}
		return rt_cli_usage(cmd, "%s: '%s' is not passkey, niah, multikey or instruct", nm, arg);
	}
	case O_KVMEM: case O_MAXBODY: {
		rt_err err = { "" };
		if (rt_kvpool_parse_size(arg, d->id == O_KVMEM ? &o->kv_memory : &o->max_body, &err))
			return rt_cli_usage(cmd, "%s: %s", nm, err.msg);
		return 0;
	}
	case O_DEVICE:
		o->device = arg;
		return one_of(cmd, nm, arg, "cpu", "cuda");
	}
	return rt_cli_usage(cmd, "unknown option '%s'", nm);
}

/* 1 when the 0-terminated list ids has id. */
static int ids_have(const int *ids, int id)
{
	for (; *ids; ids++)
		if (*ids == id)
			return 1;
	return 0;
}

int rt_cli_parse(const char *cmd, const char *help, int argc, char **argv, rt_cli_opts *o,
                 const int *ids, int need)
{
	struct option lo[N_OPTS + 1];
	char so[2 * N_OPTS + 2] = ":h";
	int nl = 0, ns = 2;
	for (int i = 0; ids[i]; i++) {
		const opt_def *d = opt_find(ids[i]);
		RT_ASSERT(d != NULL && nl < N_OPTS - 2);
		if (d->name[0])
			lo[nl++] = (struct option){ d->name, d->has_arg ? required_argument : no_argument,
			                            0, d->id };
		if (d->id < 256) {
			so[ns++] = (char)d->id;
			if (d->has_arg)
				so[ns++] = ':';
		}
	}
	lo[nl++] = (struct option){ "help", no_argument, 0, 'h' };
	lo[nl++] = (struct option){ "version", no_argument, 0, O_VERSION };
	lo[nl] = (struct option){ 0, 0, 0, 0 };
	so[ns] = 0;
	optind = 1;
	opterr = 0;
	/* argv as given: getopt_long moves the operands last, and a stray one is best explained
	 * by what it followed (the first 64 words: a longer command line gets the plain
	 * message past them) */
	char *given[64];
	const int ng = argc < 64 ? argc : 64;
	memcpy(given, argv, (size_t)ng * sizeof *given);
	int c, rc;
	while ((c = getopt_long(argc, argv, so, lo, NULL)) != -1) {
		if (c == 'h') {
			rt_cli_help(help);
			return EXIT_SUCCESS;
		}
		if (c == O_VERSION) {
			printf("%s %s (kvpc runtime, commit %s%s)\n", rt_cli_prog, cmd, rt_cli_commit(),
			       rt_cli_tree_modified() ? ", tree modified" : "");
			return EXIT_SUCCESS;
		}
		if (c == ':')
			return rt_cli_usage(cmd, "option '%s' needs a value", argv[optind - 1]);
		const opt_def *d = c == '?' ? NULL : opt_find(c);
		if (!d)
			return rt_cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
		if ((rc = opt_value(cmd, d, optarg, o)) != 0)
			return rc;
	}
	if (optind < argc) {
		for (int i = 1; i < ng; i++) /* "--json out.json": a flag given a value */
			if (given[i] == argv[optind] && given[i - 1][0] == '-') {
				const char *f = given[i - 1] + (given[i - 1][1] == '-' ? 2 : 1);
				for (int k = 0; k < nl; k++)
					if (!strcmp(lo[k].name, f) && lo[k].has_arg == no_argument)
						return rt_cli_usage(cmd, "unexpected argument '%s': %s takes no "
						                    "value%s", argv[optind], given[i - 1],
						                    !strcmp(f, "json") ? " (the JSON goes to standard "
						                    "output: redirect it, > FILE)" : "");
			}
		return rt_cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
	}
	if ((need & RT_CLI_NEED_MODEL) && !o->model)
		return rt_cli_usage(cmd, "%s", "--model is required");
	if (o->kv_type && o->exact && rt_kv_type_parse(o->kv_type) != RT_KV_F32)
		return rt_cli_usage(cmd, "--kv-type %s: the exact path stores f32 keys and values "
		                    "(%s)", o->kv_type,
		                    ids_have(ids, O_FAST) ? "give --fast, or --kv-type f32"
		                    : ids_have(ids, O_EXACT) ? "drop --exact, or --kv-type f32"
		                    : "this command runs the exact path only: --kv-type f32, or "
		                      "leave it out");
	/* every file written at the end must be writable before any work starts */
	const char *outs[][2] = { { "--svg", o->svg }, { "--dump", o->dump },
		                  { "--logits", o->logits }, { "--dump-scores", o->dump_scores },
		                  { "--dump-hidden", o->dump_hidden }, { "--out", o->out } };
	for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
		rt_err err = { "" };
		if (outs[i][1] && rt_outpath_check(outs[i][1], &err) != 0)
			return rt_cli_usage(cmd, "%s: %s", outs[i][0], err.msg);
	}
	if ((need & RT_CLI_NEED_TEXT) && !o->text)
		return rt_cli_usage(cmd, "%s", "--text is required");
	if (o->n_texts > 1 && !(need & RT_CLI_MANY_TEXTS)) /* the last would win, silently */
		return rt_cli_usage(cmd, "--text given %d times: this command reads one text",
		                    o->n_texts);
	return RT_CLI_GO;
}

/* ---- policies -------------------------------------------------------------------------- */


const char *rt_cli_default_policy(void)
{
	return rt_cli_n_reg > 0 && rt_cli_reg[0] ? rt_cli_reg[0]->name : "full";
}

/* The named policy (the registry first, then the built-in full), or NULL. */
static const struct kvp_policy *find_policy(const char *name)
{
	return rt_pick_find(rt_cli_reg, rt_cli_n_reg, name);
}

enum rt_kv_type rt_cli_kv_type(const rt_cli_opts *o)
{
	if (o->kv_type)
		return (enum rt_kv_type)rt_kv_type_parse(o->kv_type);
	if (o->exact)
		return RT_KV_F32;
	/* a --batch command names no policy: its lines choose their own stores
	 * (rt_cli_runs), and the reference keeps f16 whatever the registry's first policy */
	const char *names[3] = { o->policy ? o->policy : o->batch ? NULL : rt_cli_default_policy(),
		                 o->name_a, o->name_b };
	for (int i = 0; i < 3; i++) {
		const struct kvp_policy *p = names[i] ? find_policy(names[i]) : NULL;
		if (p && (p->needs & KVP_NEED_F32_KV))
			return RT_KV_F32;
	}
	return RT_KV_F16;
}

const char *const rt_cli_spellings[RT_PICK_N_FIELDS] = { "--policy", "--kv-type", "--set",
	"--ratio", "--byte-ratio", "--prefill-chunk", "--min-kv" };

/* What the options give rt_pick; tuned: the build's tuned default applies. */
static struct rt_pick_in pick_in(const rt_cli_opts *o, int tuned)
{
	return (struct rt_pick_in){
		.reg = rt_cli_reg, .n_reg = rt_cli_n_reg, .policy = o->policy,
		.kv_type = (int)rt_cli_kv_type(o), .sets = o->sets, .n_sets = o->n_sets,
		.ratio = o->ratio, .byte_ratio = o->byte_ratio,
		.prefill_chunk = (int32_t)o->prefill_chunk, .min_kv = (double)o->min_kv,
		.tuned = tuned ? rt_cli_tuned_ratio : NULL, .spellings = rt_cli_spellings,
	};
}

void rt_cli_print_notes(const char *policy, unsigned notes)
{
	const char *t;
	while ((t = rt_pick_note_next(&notes)))
		fprintf(stderr, "%s: note: policy %s: %s\n", rt_cli_prog, policy, t);
}

const struct kvp_policy *rt_cli_pick(const char *cmd, rt_cli_opts *o, int tuned, int *rc)
{
	struct rt_pick_in in = pick_in(o, tuned);
	struct rt_pick pk;
	rt_err err = { "" };
	if (rt_pick(&in, &pk, &err) != 0) {
		if (err.code != RT_ERR_INPUT) {
			*rc = rt_cli_fail(&err);
			return NULL;
		}
		*rc = rt_cli_usage(cmd, "%s", err.msg);
		return NULL;
	}
	const struct kvp_policy *p = pk.p;
	o->ratio = pk.ratio;
	o->byte_ratio = pk.byte_ratio;
	rt_pick_free(&pk);
	return p;
}

const struct kvp_policy *rt_cli_policy(const char *cmd, const rt_cli_opts *o, int *rc)
{
	rt_cli_opts copy = *o;
	return rt_cli_pick(cmd, &copy, 0, rc);
}

int rt_cli_seq_apply(rt_seq *s, const rt_cli_opts *o, rt_err *err)
{
	const struct kvp_policy *p = s->run.p;
	double *vals = malloc((size_t)(p->n_params > 0 ? p->n_params : 1) * sizeof *vals);
	if (!vals)
		return rt_err_set(err, "policy %s: out of memory for its parameters", p->name);
	const struct rt_pick pk = { .p = p, .kv_type = s->kv.type, .vals = vals, .ratio = o->ratio,
		.byte_ratio = o->byte_ratio, .prefill_chunk = (int32_t)o->prefill_chunk,
		.min_kv = (double)o->min_kv };
	const int rc = rt_pick_vals(p, o->sets, o->n_sets, vals, err) != 0 ? -1
	             : rt_seq_apply(s, &pk, err);
	free(vals);
	return rc;
}
