/*
 * rt_cli_opts: the command line's one option table and parser, shared by every command
 * of runtime/cli (info, ppl, needle, run, tokenize, bench, keepmap, serve, ab, tune): each option's name,
 * argument and range are written once; a command lists the options it accepts. Also the
 * usage and runtime error printers (exit codes 2 and 1), comma-list parsing, the help
 * page printer, and the policy resolution every policy-aware command shares (--policy,
 * --set and --ratio checked before any work).
 *
 * Errors: a usage error prints "PROG: reason" and "Try 'PROG CMD --help' ..." and returns
 * RT_CLI_USAGE (2); a range error names its option ("--chunk: 'x' is not a number in
 * 1..65536"). Every command accepts -h/--help and --version (exit 0).
 */
#ifndef RT_CLI_OPTS_H
#define RT_CLI_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "policy/rt_pick.h"
#include "policy/rt_policy.h"
#include "policy/rt_seq.h"
#include "base/rt_numparse.h"
#include "base/rt_util.h"

#define RT_CLI_USAGE 2        /* exit status of a usage error */
#define RT_CLI_CHUNK 512      /* default tokens per forward chunk */
#define RT_CLI_MAX_SETS 64    /* --set overrides per run */
#define RT_CLI_MAX_LIST RT_NUMPARSE_MAX_LIST /* entries of a comma list */
#define RT_CLI_MIN_KV 64      /* run's and serve's default floor (--min-kv): a short chat
                                 keeps its whole context under any policy */

/* Every option's value after parsing (0 / NULL when not given, unless a command set a
 * default before parsing). */
typedef struct rt_cli_opts {
	const char *model, *text, *prompt, *system, *dump, *logits, *ctx_list;
	const char *prompt_file; /* run -f/--file: the prompt read from a file */
	const char *policy, *haystack, *lengths, *depths, *svg, *batch;
	const char *dump_scores, *dump_hidden; /* keepmap: the replay's scores, the hidden states */
	const char *sets[RT_CLI_MAX_SETS];
	int set_side[RT_CLI_MAX_SETS]; /* 0: --set (every policy), 1: --set-a, 2: --set-b */
	int n_sets;
	/* ab: --a, --b, --ratio LIST, --task ppl|needle, --json/--csv/--plot OUT, metadata */
	const char *name_a, *name_b, *ratio_list, *ab_task, *json_out, *csv, *plot, *commit;
	const char *sha_a, *sha_b;
	long resamples;
	unsigned long long seed64;
	int seed64_set;
	long ctx, chunk, n_gen, threads, decode, prompt_len, seed, score_from;
	long prefill_chunk; /* --prefill-chunk C: 0 the exact schedule (rt_seq_set_prefill_chunk) */
	long min_kv;        /* --min-kv N: the floor of a graceful budget, tokens (kvp_ctx.min_kv);
	                       0 strict budgets (each command sets its default) */
	double ratio;
	double byte_ratio;     /* --byte-ratio R: the budget in bytes (rt_seq_set_byte_ratio) */
	int json, chat, special, stats, no_ref, mode_agnostic, mark_question, quiet;
	int task;  /* needle --task: an rt_needle_kind (eval/rt_needle.h), 0 passkey */
	int equal_memory;    /* ab --equal-memory */
	int mode_given;      /* --mode was given; else needle's protocol follows the policies
	                       (agnostic for a prompt-end one: rt_eval_needle_agnostic) */
	int exact;  /* 1: the exact path, 0: the fast path (each command sets its default) */
	int f32_act; /* --f32-act: the fast path's f32 activations at every chunk size */
	int no_share; /* serve --no-share-prefix: requests never share prompt prefixes */
	const char *kv_type; /* --kv-type f32|f16|q8_0 as given (checked), NULL: the default
	                        (rt_cli_kv_type) */
	const char *device;  /* --device cpu|cuda as given (checked), NULL: the CPU
	                        (runtime/cli/rt_cli_cuda.h) */
	int f16_weights;     /* --f16: the GPU holds f16 copies of the weights */
	long pp, tg; /* bench: llama-bench's tests */
	/* tune: every --text in order (o->text is the last), the limits, the sidecar, --gate */
	const char *texts[RT_CLI_MAX_LIST];
	int n_texts;
	double max_kld, min_passkey; /* min_passkey < 0: not given (a command presets -1) */
	const char *out;
	int gate;
	/* tune and ab: --byte-ratio LIST (O_BYTERATIOS), the grid in bytes; tune: --bytes,
	 * --entries (which kind of budget to search with the default grid) */
	const char *byte_ratio_list;
	int bytes_flag, entries_flag;
	/* tune: --param NAME=LIST (O_PARAMGRID), a grid of one parameter's values */
	const char *param_grid;
	/* run: sampling (runtime/eval/rt_sample.h); temp 0 is greedy, run's default */
	double temp, top_p;
	long top_k;
	/* serve: where it listens, its limits, its key and trace (runtime/serve/rt_serve.h) */
	const char *host, *api_key, *trace;
	long port, max_seqs, queue, step_rows, timeout;
	int64_t kv_memory, max_body; /* --kv-memory, --max-body SIZE (rt_kvpool_parse_size) */
} rt_cli_opts;

/* Option ids: short options are their letter ('m' --model, 't' --text, 'p' --prompt
 * TEXT, 'f' --file FILE, 'n' -n N), long-only options these. O_CTX takes a list when ctx_list was preset.
 * One long name may have two ids where commands give it two meanings: `ab`'s and `tune`'s
 * --ratio and --byte-ratio are lists (O_RATIOS, O_BYTERATIOS), its --task is ppl|needle (O_ABTASK), its --json takes a path (O_JSONOUT)
 * and its --seed (and run's) a 64-bit integer (O_SEED64); serve's --chunk and --prefill-chunk stop at
 * 4096 (O_SERVECHUNK, O_SERVEPREFILL). */
enum { O_CTX = 256, O_CHUNK, O_JSON, O_DUMP, O_LOGITS, O_CHAT, O_SYSTEM, O_SPECIAL, O_STATS,
       O_THREADS, O_DECODE, O_POLICY, O_SET, O_RATIO, O_NOREF, O_PROMPTLEN, O_HAYSTACK,
       O_LENGTHS, O_DEPTHS, O_MODE, O_TASK, O_SEED, O_GEN, O_SVG, O_BATCH, O_SCOREFROM, O_MARKQ,
       O_VERSION, O_EXACT, O_FAST, O_PP, O_TG, O_DEPTH, O_A, O_B, O_RATIOS, O_ABTASK,
       O_SETA, O_SETB, O_JSONOUT, O_CSV, O_PLOT, O_RES, O_SEED64, O_COMMIT, O_SHAA, O_SHAB,
       O_QUIET, O_PREFILL, O_MAXKLD, O_MINPASSKEY, O_OUT, O_GATE, O_KVTYPE, O_BYTERATIO,
       O_BYTERATIOS, O_BYTES, O_ENTRIES, O_F32ACT, O_MINKV, O_HOST, O_PORT, O_KVMEM,
       O_MAXSEQS, O_QUEUE, O_SERVECHUNK, O_SERVEPREFILL, O_STEPROWS, O_APIKEY, O_TRACE,
       O_MAXBODY, O_TIMEOUT, O_DEVICE, O_F16, O_EQMEM, O_NOSHARE, O_PARAMGRID,
       O_DUMPSCORES, O_DUMPHIDDEN, O_TEMP, O_TOPP, O_TOPK };

/* The program name in messages (argv[0]'s base name) and the binary's policies. */
extern const char *rt_cli_prog;
extern const struct kvp_policy *const *rt_cli_reg;
extern int rt_cli_n_reg;

/* The command line's spelling of each field of a policy choice (runtime/policy/rt_pick.h,
 * ORDER RT_PICK_FIELD): "--policy", "--kv-type", "--set", "--ratio", "--byte-ratio",
 * "--prefill-chunk", "--min-kv"; serve's defaults are spelled the same. */
extern const char *const rt_cli_spellings[RT_PICK_N_FIELDS];

/* Print a help page on stdout, its named slots filled: {prog} the program's name
 * (rt_cli_prog), {policy} the default policy's (rt_cli_default_policy); every other
 * character as written. */
void rt_cli_help(const char *page);

/* Usage error (see above); cmd "" for the top level. Returns RT_CLI_USAGE. */
int rt_cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Runtime error: "PROG: msg" on stderr. Returns EXIT_FAILURE. */
int rt_cli_fail(const rt_err *err);

/* Parse argv (argv[0] is the command name) into o. ids: the options the command accepts,
 * ending with 0 (-h/--help and --version are always accepted). Returns RT_CLI_GO when the
 * command goes on, else the command's exit status: 0 after printing the help page help
 * (rt_cli_help) or the version, RT_CLI_USAGE after printing the error.
 * need: RT_CLI_NEED_MODEL (1): --model is required; | RT_CLI_NEED_TEXT: --text is too,
 * checked last ("--text is required"); | RT_CLI_MANY_TEXTS: --text may be repeated (without
 * it a second --text is a usage error). Every output file (--svg, --dump, --logits,
 * --dump-scores, --dump-hidden, --out) must be writable (rt_outpath_check). */
#define RT_CLI_GO (-1)
#define RT_CLI_NEED_MODEL 1
#define RT_CLI_NEED_TEXT 2
#define RT_CLI_MANY_TEXTS 4 /* --text may be repeated (tune); elsewhere twice is refused */
int rt_cli_parse(const char *cmd, const char *help, int argc, char **argv, rt_cli_opts *o,
                 const int *ids, int need);

/* The KV element type of the run: --kv-type when given; else f32 on the exact path, and on
 * the fast path f16 unless a policy the options name (--policy, --a, --b) needs f32 rows
 * (KVP_NEED_F32_KV, GraceKV), then f32 (a --batch command's own type: its lines' policies
 * choose theirs, rt_cli_runs). rt_cli_parse has refused --kv-type other than f32 on the exact
 * path. */
enum rt_kv_type rt_cli_kv_type(const rt_cli_opts *o);

/* The default policy's name: the binary's first, else "full". */
const char *rt_cli_default_policy(void);

/* The command line's door to the one policy choice (runtime/policy/rt_pick.h): resolve
 * --policy and check --kv-type, --set, --ratio, --byte-ratio and --prefill-chunk against
 * it before any work. tuned: without --ratio and --byte-ratio the build's tuned default
 * (rt_cli_tuned_ratio) is in force, written to o->ratio or o->byte_ratio. Returns the
 * policy, or NULL after printing the error naming the option (*rc = 2, or 1 when memory
 * ran out). */
const struct kvp_policy *rt_cli_pick(const char *cmd, rt_cli_opts *o, int tuned, int *rc);

/* A graceful budget's notes of one run (KVP_NOTE_* bits, rt_pick_note_next) on stderr, one
 * line each: "PROG: note: policy NAME: TEXT" (ppl, keepmap); nothing when notes is 0. */
void rt_cli_print_notes(const char *policy, unsigned notes);

/* rt_cli_pick without the tuned default, leaving o as it is. */
const struct kvp_policy *rt_cli_policy(const char *cmd, const rt_cli_opts *o, int *rc);

/* Apply --set, --ratio, --byte-ratio, --prefill-chunk and --min-kv to a sequence of the
 * policy rt_cli_pick chose and checked: the choice is not made again, only its values
 * (rt_pick_vals) applied (rt_seq_apply), so failures are runtime errors. */
int rt_cli_seq_apply(rt_seq *s, const rt_cli_opts *o, rt_err *err);

#endif
