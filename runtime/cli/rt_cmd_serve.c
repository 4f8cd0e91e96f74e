/*
 * rt_cmd_serve: `serve` — the OpenAI-compatible server (runtime/serve/rt_serve.h) under
 * the binary's policies; its options come from the one option table (rt_cli_opts.h) and
 * are checked, with the default policy, before the model loads. The man page is
 * help_serve below.
 */
#include "cli/rt_cmd.h"

#include <stdio.h>

#include "cli/rt_cli_opts.h"
#include "serve/rt_serve.h"

static const char *const help_serve =
	"NAME\n"
	"    {prog} serve - an OpenAI-compatible HTTP server under the binary's KV-cache policies\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} serve --model MODEL [--host 127.0.0.1] [--port 8080] [--policy NAME]\n"
	"             [--set NAME=VALUE]... [--ratio R | --byte-ratio R] [--kv-memory SIZE]\n"
	"             [--max-seqs N] [--queue N] [--chunk N] [--prefill-chunk C]\n"
	"             [--step-rows N] [--threads N]\n"
	"             [--api-key KEY] [--trace FILE] [--max-body SIZE] [--timeout S] [--exact]\n"
	"             [--kv-type f32|f16|q8_0] [--min-kv N] [--no-share-prefix]\n"
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
	"    --policy NAME       default policy of requests without \"kv\" (default {policy})\n"
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
	"                        written, a policy's own `min` floor included (default 64)\n"
	"    --no-share-prefix   requests never share the keys and values of a common\n"
	"                        protected prompt prefix (a system prompt); by default they\n"
	"                        do, counted once in the pool (docs/serving.md)\n"
	"    --api-key KEY       require \"Authorization: Bearer KEY\"\n"
	"    --trace FILE        append one JSON line per finished request\n"
	"    --max-body SIZE     request body limit (default 1M)\n"
	"    --timeout S         a request body that stalls for S seconds gets 408; an idle\n"
	"                        connection is closed after S + 1 (default 30)\n"
	"    -h, --help          show this text\n"
	"    --version           the commit the runtime was built from\n"
	"\n"
	"EXIT STATUS\n"
	"    0 after a drain, 1 runtime error (model, address), 2 usage error.\n";

int rt_cmd_serve(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', O_HOST, O_PORT, O_POLICY, O_SET, O_RATIO, O_BYTERATIO,
		O_KVMEM, O_MAXSEQS, O_QUEUE, O_SERVECHUNK, O_SERVEPREFILL, O_STEPROWS, O_THREADS,
		O_APIKEY, O_TRACE, O_MAXBODY, O_TIMEOUT, O_EXACT, O_KVTYPE, O_MINKV, O_NOSHARE, 0 };
	rt_cli_opts o = { .host = "127.0.0.1", .port = 8080, .kv_memory = 1LL << 30, .max_seqs = 16,
	                  .queue = 64, .chunk = 64, .step_rows = 256, .max_body = 1 << 20,
	                  .timeout = 30, .prefill_chunk = -1, .min_kv = RT_SERVE_MIN_KV };
	int rc = rt_cli_parse("serve", help_serve, argc, argv, &o, opt_ids, RT_CLI_NEED_MODEL);
	if (rc != RT_CLI_GO)
		return rc;
	if (o.step_rows < o.max_seqs)
		return rt_cli_usage("serve", "--step-rows %ld is below --max-seqs %ld (each active "
		                    "sequence needs a row)", o.step_rows, o.max_seqs);
	if (o.prefill_chunk < 0)
		o.prefill_chunk = RT_SERVE_PREFILL_CHUNK;
	if (o.prefill_chunk > o.chunk)
		o.prefill_chunk = o.chunk; /* bounded by the step's chunk */
	/* the default policy, its parameters and ratio: the one policy choice, with the build's
	 * tuned default; the default KV type follows the default policy */
	const struct kvp_policy *p = rt_cli_pick("serve", &o, 1, &rc);
	if (!p)
		return rc;
	const rt_serve_cfg c = {
		.prog = rt_cli_prog, .model = o.model, .host = o.host, .port = (int)o.port,
		.policy = p->name, .sets = o.sets, .n_sets = o.n_sets, .ratio = o.ratio,
		.byte_ratio = o.byte_ratio, .kv_memory = o.kv_memory, .max_seqs = (int)o.max_seqs,
		.queue = (int)o.queue, .chunk = (int)o.chunk, .prefill_chunk = (int)o.prefill_chunk,
		.min_kv = (int)o.min_kv, .step_rows = (int)o.step_rows, .max_body = o.max_body,
		.timeout_s = (int)o.timeout, .api_key = o.api_key, .trace = o.trace, .exact = o.exact,
		.kv_type = rt_cli_kv_type(&o), .threads = (int)o.threads, .share_prefix = !o.no_share,
	};
	return rt_serve_run(&c, rt_cli_reg, rt_cli_n_reg);
}
