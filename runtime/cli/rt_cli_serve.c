/*
 * rt_cli_serve: `serve` options, checked before the model loads; see rt_cli_serve.h.
 */
#include "cli/rt_cli_serve.h"

#include "cli/rt_cli.h"

#include <getopt.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/rt_kvpool.h"
#include "policy/rt_pick.h"
#include "policy/rt_seq.h"
#include "serve/rt_serve.h"

static const char *const help =
	"NAME\n"
	"    %s serve - an OpenAI-compatible HTTP server under the binary's KV-cache policies\n"
	"\n"
	"SYNOPSIS\n"
	"    %s serve --model MODEL [--host 127.0.0.1] [--port 8080] [--policy NAME]\n"
	"             [--set NAME=VALUE]... [--ratio R | --byte-ratio R] [--kv-memory SIZE]\n"
	"             [--max-seqs N] [--queue N] [--chunk N] [--prefill-chunk C]\n"
	"             [--step-rows N] [--threads N]\n"
	"             [--api-key KEY] [--trace FILE] [--max-body SIZE] [--timeout S] [--exact]\n"
	"             [--kv-type f32|f16|q8_0] [--min-kv N]\n"
	"\n"
	"DESCRIPTION\n"
	"    Serves POST /v1/completions and /v1/chat/completions (in the model's chat\n"
	"    template; \"stream\": true streams Server-Sent Events in OpenAI's chunk\n"
	"    format), GET /v1/models, /health\n"
	"    and /metrics (Prometheus). Sampling: temperature (0 = greedy, the same tokens\n"
	"    as `run`), top_p, top_k, seed, max_tokens, stop. A request may choose its\n"
	"    policy: \"kv\": {\"policy\": NAME, \"ratio\": R, \"set\": {NAME: VALUE}}, checked\n"
	"    as --policy, --ratio and --set are, \"byte_ratio\": R as --byte-ratio (one of\n"
	"    ratio and byte_ratio), and \"prefill_chunk\": C as --prefill-chunk.\n"
	"    The system message is the protected span\n"
	"    `system`; a message or prompt segment with \"protect\": true is span `pinned`.\n"
	"\n"
	"    Every active sequence advances in one weight pass per step; prompts are\n"
	"    prefilled in chunks between the others' decode steps. A request is admitted\n"
	"    when its worst-case KV footprint fits in the pool beside the admitted ones\n"
	"    (else it waits in the queue; a full queue answers 503 with Retry-After). A\n"
	"    client that disconnects frees its sequence at the next step. SIGTERM drains:\n"
	"    new requests get 503, the others finish, then the server exits 0.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL   GGUF model file\n"
	"    --host ADDR         IPv4 address to listen on (default 127.0.0.1)\n"
	"    --port N            TCP port (default 8080; 0 picks a free one, printed)\n"
	"    --policy NAME       default policy of requests without \"kv\" (default %s)\n"
	"    --set NAME=VALUE    default parameter of that policy (repeatable)\n"
	"    --ratio R           default compression ratio in entries (>= 1)\n"
	"    --byte-ratio R      or in bytes against an f16 full cache (>= 1), as for ppl\n"
	"    --kv-memory SIZE    KV pool bytes, e.g. 512M, 2G (default 1G)\n"
	"    --max-seqs N        active sequences at most (default 16)\n"
	"    --queue N           waiting requests at most (default 64)\n"
	"    --chunk N           prefill chunk per sequence and step (default 64)\n"
	"    --prefill-chunk C   chunked prefill of a per-step policy (h2o, tova, ...): its\n"
	"                        prompt chunks of up to C tokens (at most --chunk) cross its\n"
	"                        triggers and it compresses at each chunk's end; 0 prefills\n"
	"                        token by token (the exact schedule). Default 16, at most\n"
	"                        --chunk (docs/language.md, \"Chunked prefill\", says why)\n"
	"    --step-rows N       tokens per step over all sequences (default 256)\n"
	"    --threads N         threads (fast path: the pool, default every core; exact\n"
	"                        path: OpenBLAS's)\n"
	"    --exact             the exact path (f32 weights, OpenBLAS); default: the fast path\n"
	"    --kv-type T         KV storage of every sequence: f32, f16 (the fast path's\n"
	"                        default) or q8_0; the exact path stores f32 and refuses the\n"
	"                        others; a request for a policy that needs f32 rows (gracekv)\n"
	"                        on an f16 or q8_0 server is refused\n"
	"    --min-kv N          graceful budgets: every (layer, KV head) keeps at least N\n"
	"                        tokens whatever the budget or ratio (a prompt of N tokens or\n"
	"                        fewer stays whole), and guards larger than the budget raise\n"
	"                        it instead of a 400; the response's kv object says so\n"
	"                        (budget_notes); a request may set kv.min_kv; 0: budgets as\n"
	"                        written (default 64)\n"
	"    --api-key KEY       require \"Authorization: Bearer KEY\"\n"
	"    --trace FILE        append one JSON line per finished request\n"
	"    --max-body SIZE     request body limit (default 1M)\n"
	"    --timeout S         a request body that stalls for S seconds gets 408; an idle\n"
	"                        connection is closed after S + 1 (default 30)\n"
	"    -h, --help          show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 after a drain, 1 runtime error (model, address), 2 usage error.\n";

static int usage(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage(const char *prog, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: serve: ", prog);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\nTry '%s serve --help' for more information.\n", prog);
	va_end(ap);
	return 2;
}

static int int_arg(const char *prog, const char *opt, const char *v, long lo, long hi, int *out)
{
	char *end = NULL;
	long x = strtol(v, &end, 10);
	if (!*v || *end || x < lo || x > hi)
		return usage(prog, "%s: '%s' is not a whole number in %ld..%ld", opt, v, lo, hi);
	*out = (int)x;
	return 0;
}

enum { O_HOST = 256, O_PORT, O_POLICY, O_SET, O_RATIO, O_BYTERATIO, O_MEM, O_SEQS, O_QUEUE, O_CHUNK,
       O_ROWS, O_THREADS, O_KEY, O_TRACE, O_BODY, O_TIMEOUT, O_EXACT, O_PREFILL, O_KVTYPE,
       O_MINKV };

/* After the options: the arguments that must be there, the KV type the path allows, the
 * default policy (as --policy/--set/--ratio check it), its prefill chunk and tuned ratio.
 * 0 with *pp the policy, or 2 (a usage error, printed). */
static int serve_finish(rt_serve_cfg *c, int argc, char **argv, int kv_type, const char *defp,
                        char **sets, const struct kvp_policy *const *reg, int n_reg,
                        const struct kvp_policy **pp)
{
	const char *prog = c->prog;
	rt_err err = { "" };
	if (optind < argc) {
		usage(prog, "unexpected argument '%s'", argv[optind]);
		return 2;
	}
	if (!c->model) {
		usage(prog, "--model is required");
		return 2;
	}
	if (c->exact && kv_type >= 0 && kv_type != RT_KV_F32) {
		usage(prog, "--kv-type %s: the exact path stores f32 keys and values (drop --exact, "
		      "or --kv-type f32)", rt_kv_type_name((enum rt_kv_type)kv_type));
		return 2;
	}
	c->kv_type = kv_type >= 0 ? (enum rt_kv_type)kv_type : c->exact ? RT_KV_F32 : RT_KV_F16;
	if (c->step_rows < c->max_seqs) {
		usage(prog, "--step-rows %d is below --max-seqs %d (each active sequence needs a row)",
		      c->step_rows, c->max_seqs);
		return 2;
	}
	if (c->prefill_chunk < 0)
		c->prefill_chunk = RT_SERVE_PREFILL_CHUNK;
	if (c->prefill_chunk > c->chunk)
		c->prefill_chunk = c->chunk; /* bounded by the step's chunk */
	/* the default policy, its parameters and ratio: the one policy choice, with the
	 * build's tuned default; the default KV type follows the default policy */
	struct rt_pick_in in = { .reg = reg, .n_reg = n_reg, .policy = c->policy ? c->policy : defp,
		.kv_type = kv_type, .kv_default = c->kv_type, .sets = (const char *const *)sets,
		.n_sets = c->n_sets, .ratio = c->ratio, .byte_ratio = c->byte_ratio,
		.prefill_chunk = c->prefill_chunk, .min_kv = c->min_kv, .tuned = rt_cli_tuned_ratio,
		.spellings = rt_cli_spellings };
	struct rt_pick pk;
	if (rt_pick(&in, &pk, &err) != 0) {
		usage(prog, "%s", err.msg);
		return 2;
	}
	const struct kvp_policy *p = pk.p;
	c->kv_type = pk.kv_type;
	c->ratio = pk.ratio;
	c->byte_ratio = pk.byte_ratio;
	rt_pick_free(&pk);
	*pp = p;
	return 0;
}

int rt_cli_serve(int argc, char **argv, const char *prog, const struct kvp_policy *const *reg,
                 int n_reg)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "host", required_argument, 0, O_HOST },
		{ "port", required_argument, 0, O_PORT }, { "policy", required_argument, 0, O_POLICY },
		{ "set", required_argument, 0, O_SET }, { "ratio", required_argument, 0, O_RATIO },
		{ "byte-ratio", required_argument, 0, O_BYTERATIO },
		{ "kv-memory", required_argument, 0, O_MEM }, { "max-seqs", required_argument, 0, O_SEQS },
		{ "queue", required_argument, 0, O_QUEUE }, { "chunk", required_argument, 0, O_CHUNK },
		{ "step-rows", required_argument, 0, O_ROWS }, { "threads", required_argument, 0, O_THREADS },
		{ "api-key", required_argument, 0, O_KEY }, { "trace", required_argument, 0, O_TRACE },
		{ "max-body", required_argument, 0, O_BODY }, { "timeout", required_argument, 0, O_TIMEOUT },
		{ "exact", no_argument, 0, O_EXACT }, { "prefill-chunk", required_argument, 0, O_PREFILL },
		{ "kv-type", required_argument, 0, O_KVTYPE }, { "min-kv", required_argument, 0, O_MINKV },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *defp = n_reg > 0 && reg[0] ? reg[0]->name : "full";
	rt_serve_cfg c = { .prog = prog, .host = "127.0.0.1", .port = 8080, .kv_memory = 1LL << 30,
	                   .max_seqs = 16, .queue = 64, .chunk = 64, .step_rows = 256,
	                   .max_body = 1 << 20, .timeout_s = 30, .prefill_chunk = -1,
	                   .min_kv = RT_SERVE_MIN_KV };
	char **sets = calloc((size_t)argc + 1, sizeof *sets);
	int threads = 0, rc = 2, kv_type = -1;
	rt_err err = { "" };
	if (!sets)
		return 1;
	optind = 1;
	opterr = 0;
	int ch;
	while ((ch = getopt_long(argc, argv, ":m:h", lo, NULL)) != -1) {
		switch (ch) {
		case 'm': c.model = optarg; break;
		case 'h': printf(help, prog, prog, defp); rc = 0; goto out;
		case O_HOST: c.host = optarg; break;
		case O_PORT: if (int_arg(prog, "--port", optarg, 0, 65535, &c.port)) goto out; break;
		case O_POLICY: c.policy = optarg; break;
		case O_SET: sets[c.n_sets++] = optarg; break;
		case O_RATIO: case O_BYTERATIO: {
			char *end = NULL;
			double *r = ch == O_RATIO ? &c.ratio : &c.byte_ratio;
			*r = strtod(optarg, &end);
			if (!*optarg || *end || *r == 0 || rt_pick_ratio_check(*r, ch == O_BYTERATIO, NULL)) {
				usage(prog, "%s: '%s' is not a number >= 1",
				      ch == O_RATIO ? "--ratio" : "--byte-ratio", optarg);
				goto out;
			}
			break;
		}
		case O_MEM:
		case O_BODY: {
			int64_t b;
			if (rt_kvpool_parse_size(optarg, &b, &err) != 0) {
				usage(prog, "%s: %s", ch == O_MEM ? "--kv-memory" : "--max-body", err.msg);
				goto out;
			}
			if (ch == O_MEM)
				c.kv_memory = b;
			else
				c.max_body = b;
			break;
		}
		case O_SEQS: if (int_arg(prog, "--max-seqs", optarg, 1, 4096, &c.max_seqs)) goto out; break;
		case O_QUEUE: if (int_arg(prog, "--queue", optarg, 0, 100000, &c.queue)) goto out; break;
		case O_CHUNK: if (int_arg(prog, "--chunk", optarg, 1, 4096, &c.chunk)) goto out; break;
		case O_PREFILL:
			if (int_arg(prog, "--prefill-chunk", optarg, 0, 4096, &c.prefill_chunk))
				goto out;
			break;
		case O_MINKV:
			if (int_arg(prog, "--min-kv", optarg, 0, 1 << 30, &c.min_kv))
				goto out;
			break;
		case O_ROWS: if (int_arg(prog, "--step-rows", optarg, 1, 65536, &c.step_rows)) goto out; break;
		case O_THREADS: if (int_arg(prog, "--threads", optarg, 1, 256, &threads)) goto out; break;
		case O_KEY: c.api_key = optarg; break;
		case O_EXACT: c.exact = 1; break;
		case O_KVTYPE:
			if ((kv_type = rt_kv_type_parse(optarg)) < 0) {
				usage(prog, "--kv-type: '%s' is not f32, f16 or q8_0", optarg);
				goto out;
			}
			break;
		case O_TRACE: c.trace = optarg; break;
		case O_TIMEOUT: if (int_arg(prog, "--timeout", optarg, 1, 86400, &c.timeout_s)) goto out; break;
		case ':': usage(prog, "option %s needs a value", argv[optind - 1]); goto out;
		default: usage(prog, "unknown option '%s'", argv[optind - 1]); goto out;
		}
	}
	const struct kvp_policy *p = NULL;
	if (serve_finish(&c, argc, argv, kv_type, defp, sets, reg, n_reg, &p) != 0)
		goto out;
	c.policy = p->name;
	c.sets = sets;
	c.threads = threads;
	rc = rt_serve_run(&c, reg, n_reg);
out:
	free(sets);
	return rc;
}
