/*
 * rt_cli: the shared command line (see rt_cli.h) — option parsing, the help pages and
 * the commands info, ppl, needle, run, tokenize, bench and keepmap over rt_seq (one
 * sequence under one policy), rt_eval's scoring helpers, rt_stats (KL summary), rt_needle
 * and rt_keepmap (the SVG of the kept positions).
 */
#include "base/rt_outpath.h"
#include "base/rt_sha256.h"
#include "base/rt_text.h"
#include "cli/rt_cli.h"
#include "cli/rt_cli_cuda.h"
#include "cli/rt_cli_serve.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval/rt_ab.h"
#include "eval/rt_decode.h"
#include "eval/rt_eval.h"
#include "model/rt_gguf.h"
#include "report/rt_json.h"
#include "report/rt_keepmap.h"
#include "model/rt_dot.h"
#include "model/rt_model.h"
#include "eval/rt_needle.h"
#include "policy/rt_seq.h"
#include "eval/rt_stats.h"
#include "model/rt_tokenizer.h"
#include "base/rt_util.h"

#define EXIT_USAGE 2
#define DEFAULT_CHUNK 512
#define MAX_SETS 64
/* entries per head a ratio run's store holds beyond its budget (see cmd_ppl) */
#define PPL_CAP_SLACK 1024
#define MAX_LIST 32

static const char *g_prog = "kvrt";

/* ---- help pages ------------------------------------------------------------------------ */

static const char *const help_top =
	"NAME\n"
	"    %s - run, evaluate and benchmark a GGUF llama model under KV-cache policies\n"
	"\n"
	"SYNOPSIS\n"
	"    %s info\n"
	"    %s ppl --model MODEL --text FILE [--policy NAME] [--set K=V]... [--ratio R] ...\n"
	"    %s needle --model MODEL [--task passkey|niah] [--lengths L,...] [--depths D,...] ...\n"
	"    %s run --model MODEL --prompt TEXT [-n N] [--chat] [--policy NAME] ...\n"
	"    %s tokenize --model MODEL --text FILE\n"
	"    %s bench --model MODEL [--ctx N,N,...]\n"
	"    %s keepmap --model MODEL --text FILE [--policy NAME] ... --svg OUT\n"
	"    %s serve --model MODEL [--port N] [--kv-memory SIZE] [--policy NAME] ...\n"
	"    %s COMMAND --help\n"
	"\n"
	"DESCRIPTION\n"
	"    Drives the kvpc transformer runtime on a Llama-architecture model stored as\n"
	"    GGUF (for example SmolLM2-135M-Instruct, Q4_1). Weights are dequantised to f32\n"
	"    at load time and the forward pass is computed exactly in f32 with OpenBLAS over\n"
	"    a KV cache that keeps one entry list per (layer, KV head). A KV-cache policy\n"
	"    compiled by kvpc decides which entries each list keeps; the runtime feeds the\n"
	"    largest chunks that cannot cross the policy's next trigger, so chunked\n"
	"    evaluation equals token-by-token evaluation.\n"
	"\n"
	"COMMANDS\n"
	"    info      list the policies of this binary with their parameters\n"
	"    ppl       streaming perplexity of a text under a policy, with KL statistics\n"
	"              against the full cache computed in the same run\n"
	"    needle    passkey / needle-in-a-haystack retrieval accuracy under a policy\n"
	"    run       greedy generation from a prompt under a policy\n"
	"    tokenize  print the token ids of a text file\n"
	"    bench     prefill and decode speed at several context lengths (full cache)\n"
	"    keepmap   draw (SVG) which positions every layer and KV head keeps under a\n"
	"              policy after a prompt\n"
	"    serve     an OpenAI-compatible HTTP server with continuous batching on a\n"
	"              shared KV block pool\n"
	"\n"
	"OPTIONS\n"
	"    -h, --help     show this text (or a command's, after the command)\n"
	"    --device cuda  run ppl or bench on the GPU (binaries built with kvpc build --cuda;\n"
	"                   docs/cuda.md); the default is --device cpu\n"
	"\n"
	"ENVIRONMENT\n"
	"    OPENBLAS_NUM_THREADS  BLAS threads (default: all cores); --threads overrides\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error (file, model, text or policy problem), 2 usage error.\n"
	"    Errors are one line on standard error: \"%s: PATH: reason\".\n";

static const char *const help_info =
	"NAME\n"
	"    %s info - list the KV-cache policies compiled into this binary\n"
	"\n"
	"SYNOPSIS\n"
	"    %s info [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    For each policy: its name, one-line summary, the .kvp source it was compiled\n"
	"    from with the FNV-1a 64 hash of the source bytes, its position convention\n"
	"    (original: keys keep the RoPE of their token position; compacted: kept keys are\n"
	"    re-rotated to their index in the cache), and its parameters with default value,\n"
	"    unit and documentation. Parameters are changed at run time with --set NAME=VALUE.\n"
	"    The built-in policy `full` keeps every token.\n"
	"\n"
	"OPTIONS\n"
	"    --json      one JSON object: {\"policies\":[{name, summary, source, source_hash,\n"
	"                positions, params:[{name, default, unit, doc}]}]}\n"
	"    -h, --help  show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 2 usage error.\n";

static const char *const help_ppl =
	"NAME\n"
	"    %s ppl - streaming perplexity of a text under a KV-cache policy\n"
	"\n"
	"SYNOPSIS\n"
	"    %s ppl --model MODEL --text FILE [--policy NAME] [--set NAME=VALUE]...\n"
	"             [--ratio R] [--ctx N] [--prompt N] [--chunk N] [--threads N] [--json]\n"
	"             [--dump FILE] [--logits FILE] [--no-ref]\n"
	"    %s ppl --model MODEL --text FILE --batch RUNS [--ctx N] [--prompt N]\n"
	"             [--score-from P] [--json] ...\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes FILE, keeps its first N tokens and feeds them through the model\n"
	"    under the policy, scoring each token from the ones before it as the policy\n"
	"    left them in the cache (teacher forcing): NLL_i = -log q(t[i+1] | cache after\n"
	"    t[0..i]), ppl = exp(mean NLL), natural logs, log-sum-exp in double.\n"
	"\n"
	"    Unless the policy is full or --no-ref is given, a second sequence with the full\n"
	"    cache is fed the same tokens in the same run and every token's distribution p\n"
	"    is compared with the policy's q (llama-perplexity --kl-divergence's statistics):\n"
	"    kld_mean (mean KL(p||q), nats) and kld_mean_err, kld_median, kld_p99, kld_max,\n"
	"    ppl_ref, ppl_ratio = ppl / ppl_ref, same_top1 (fraction of tokens with the same\n"
	"    argmax), rms_dp (root mean square of q(t) - p(t) for the correct token t).\n"
	"\n"
	"    Memory and speed: kv_entries_peak is the most entries held by all (layer, KV\n"
	"    head) lists together, measured after each chunk's append (before compressing),\n"
	"    kv_bytes_peak the most bytes of KV pool blocks the sequence held at once\n"
	"    (blocks of 16 entries: keys, values, metadata and policy statistics; the\n"
	"    resident KV memory); compression = tokens / mean entries per (layer, KV head)\n"
	"    list after the last token (1 for full; 4 when a head keeps a quarter of the\n"
	"    text); tokens_per_s counts the policy run only; compress_events is the number\n"
	"    of compress calls; policy_seconds the time spent inside policy code (observe,\n"
	"    init_entries, should_compress, next_trigger, compress). The store reserves\n"
	"    address space for N entries per head (the text's length), or N / R + 1024 with\n"
	"    --ratio R and no --prompt; only the blocks it holds are resident, and evicted\n"
	"    entries' blocks return to the pool at once, so kv_bytes_peak is the memory a\n"
	"    deployment needs.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL   GGUF model file\n"
	"    -t, --text FILE     the text; must be valid UTF-8\n"
	"    --policy NAME       policy (see `%s info`; default %s)\n"
	"    --set NAME=VALUE    override a policy parameter (repeatable)\n"
	"    --ratio R           compression factor: budget = context / R entries per head\n"
	"                        (R >= 1) in place of the policy's own budget\n"
	"    --ctx N             score the first N tokens (default: the whole text, up to\n"
	"                        the model's context_length)\n"
	"    --prompt N          treat the first N tokens as the prompt (prompt-end\n"
	"                        triggers such as SnapKV's fire after it; ratio budgets\n"
	"                        refer to it); default: every scored token, so a ratio\n"
	"                        budget is a fixed N / R entries per head from the first\n"
	"                        token, as in `kvpc ab`\n"
	"    --chunk N           most tokens per forward chunk (default 512)\n"
	"    --threads N         threads (exact path: OpenBLAS's; fast path: the pool)\n"
	"    --fast              the fast path (weights in their GGUF types, 8-bit activations\n"
	"                        when decoding); default --exact (f32 weights, OpenBLAS): the\n"
	"                        quality figures are measured on the exact path\n"
	"    --json              one JSON object: policy, params, ratio, model, model_sha256,\n"
	"                        text, text_sha256, commit, threads, chunk, tokens, scored,\n"
	"                        ppl, nll_mean, top1_acc, kv_entries_peak, kv_bytes_peak,\n"
	"                        compression, tokens_per_s, compress_events, policy_seconds,\n"
	"                        seconds and, with the reference, the KL statistics above\n"
	"    --dump FILE         one JSON line per scored token: {\"pos\":P,\"token\":T,\n"
	"                        \"logprob\":L,\"top1\":A} plus \"logprob_ref\" and \"kld\" with\n"
	"                        the reference\n"
	"    --logits FILE       write the policy run's raw little-endian f32 logits\n"
	"                        [N × n_vocab] to FILE (row i after tokens 0..i)\n"
	"    --no-ref            skip the full-cache reference (half the work)\n"
	"    --score-from P      score only the tokens at positions >= P (all tokens are\n"
	"                        still fed); with --prompt N, P = N + 1 scores exactly the\n"
	"                        tokens predicted from the cache a prompt-end policy left\n"
	"    --batch RUNS        run several policies on the same text in one pass: RUNS has\n"
	"                        one run per line, `POLICY [--ratio R] [--set NAME=VALUE]...`\n"
	"                        ('#' starts a comment line). All runs and the reference are\n"
	"                        fed in lockstep and each chunk's weight GEMMs run once for\n"
	"                        all of them (the weights are read once, not once per run);\n"
	"                        each run gives what a separate `ppl` run gives (one report\n"
	"                        or JSON line per run, in file order, with \"batch\": the\n"
	"                        sequences in the pass) up to float summation order;\n"
	"                        seconds and tokens_per_s are the shared pass's. A run\n"
	"                        whose policy fails (guards above its ratio's budget) leaves\n"
	"                        the pass with an error line ({..., \"error\": why}) and\n"
	"                        exit status 1; the other runs go on\n"
	"    -h, --help          show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error (unknown policy or parameter, R < 1,\n"
	"    --ctx beyond the model's context_length).\n"
	"\n"
	"EXAMPLE\n"
	"    %s ppl --model models/SmolLM2-135M-Instruct.Q4_1.gguf --text t.txt \\\n"
	"           --ctx 1024 --policy h2o --ratio 4 --json\n";

static const char *const help_needle =
	"NAME\n"
	"    %s needle - long-context retrieval accuracy under a KV-cache policy\n"
	"\n"
	"SYNOPSIS\n"
	"    %s needle --model MODEL [--task passkey|niah] [--haystack FILE]\n"
	"             [--lengths L,...] [--depths D,...] [--policy NAME] [--set NAME=VALUE]...\n"
	"             [--ratio R] [--mode aware|agnostic] [--gen N] [--seed S] [--chat]\n"
	"             [--chunk N] [--threads N] [--json] [--batch RUNS] [--mark-question]\n"
	"\n"
	"DESCRIPTION\n"
	"    For every length L and depth D builds a prompt of exactly L tokens with the\n"
	"    model's tokenizer (rt_needle): passkey (Mohtashami & Jaggi 2023: filler text\n"
	"    with \"The pass key is K\" at D%% of it, K from the seed, length and depth) or\n"
	"    niah (a real text, by default the Info manual of coreutils, with the San\n"
	"    Francisco needle at D%%). The context is prefilled under the policy, then the\n"
	"    answer is generated greedily (--gen tokens, default 8 for passkey, 20 for niah)\n"
	"    and scored by exact match (the first number equals K; both \"sandwich\" and\n"
	"    \"Dolores Park\" present). Modes (kvpress's distinction): aware (default) puts\n"
	"    the question inside the compressed prompt; agnostic compresses the context\n"
	"    first (the prompt ends before the question) and appends the question after.\n"
	"    In aware mode the first answer token comes from the prefill's last position,\n"
	"    computed before the prompt-end compression (as kvpress's presses compress\n"
	"    during the prefill forward); every later token sees the compressed cache.\n"
	"    With --mark-question the question's tokens (with the answer's opening) are\n"
	"    marked as the protected span `question`: a policy with `keep span question`\n"
	"    keeps them exactly, and GraceKV probes the cache with them (otherwise with its\n"
	"    `question` parameter's prompt tail).\n"
	"    Prints a table of 1/0 per length and depth and the accuracy.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL   GGUF model file\n"
	"    --task T            passkey (default) or niah\n"
	"    --haystack FILE     niah text (plain or .gz; default\n"
	"                        /usr/share/info/coreutils.info.gz, from its second node)\n"
	"    --lengths LIST      comma-separated prompt lengths in tokens (default\n"
	"                        1024,2048,4096)\n"
	"    --depths LIST       comma-separated depths in percent (default 0,25,50,75,100)\n"
	"    --policy NAME       policy (default %s); --set, --ratio as for ppl\n"
	"    --mode M            aware (default) or agnostic\n"
	"    --gen N             answer tokens to generate\n"
	"    --seed S            passkey seed (default 1); the key of (L, D) is drawn from\n"
	"                        seed + 1000003 L + D\n"
	"    --chat              wrap the prompt in the model's ChatML template\n"
	"    --chunk N, --threads N, --fast, -h/--help  as for ppl\n"
	"    --mark-question     mark the question as the protected span `question`\n"
	"    --batch RUNS        several runs (`POLICY [--ratio R] [--set NAME=VALUE]...` per\n"
	"                        line, as for ppl) on the same prompts: each prompt is\n"
	"                        prefilled for all runs in lockstep (one weight pass per\n"
	"                        chunk), then each run generates its own answer; one report\n"
	"                        or JSON object per run, in file order\n"
	"    --json              one JSON object: policy, params, ratio, task, mode, model,\n"
	"                        model_sha256, commit, results [{length, depth, answer,\n"
	"                        generated, correct, kv_entries_peak, compress_events}],\n"
	"                        accuracy\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success (whatever the accuracy), 1 runtime error, 2 usage error.\n";

static const char *const help_run =
	"NAME\n"
	"    %s run - greedy generation from a prompt under a KV-cache policy\n"
	"\n"
	"SYNOPSIS\n"
	"    %s run --model MODEL --prompt TEXT [-n N] [--chat] [--system TEXT]\n"
	"             [--policy NAME] [--set NAME=VALUE]... [--ratio R] [--stats]\n"
	"             [--chunk N] [--threads N]\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes TEXT, prefills it under the policy (the prompt is its prompt: prompt-\n"
	"    end triggers fire after it), then repeatedly appends the most likely next token\n"
	"    (greedy, lowest id on ties), writing each token's bytes to standard output as\n"
	"    it is produced. Stops after N tokens, at an end-of-generation token, or at the\n"
	"    model's context_length.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    -p, --prompt TEXT  the prompt (UTF-8)\n"
	"    -n N               tokens to generate at most (default 128)\n"
	"    --chat             wrap the prompt in the model's ChatML template\n"
	"    --system TEXT      system message for --chat (default: the template's)\n"
	"    --policy NAME      policy (default %s); --set, --ratio as for ppl\n"
	"    --stats            print token counts, speed, KV peak and compressions on stderr\n"
	"    --chunk N          prompt prefill chunk (default 512)\n"
	"    --threads N        threads (default: every core)\n"
	"    --exact            the exact path (f32 weights, OpenBLAS); default: the fast path\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n";

static const char *const help_tokenize =
	"NAME\n"
	"    %s tokenize - print the token ids of a text\n"
	"\n"
	"SYNOPSIS\n"
	"    %s tokenize --model MODEL --text FILE [--special]\n"
	"\n"
	"DESCRIPTION\n"
	"    Reads FILE (UTF-8), tokenizes it with MODEL's byte-level BPE tokenizer (no BOS\n"
	"    is added) and prints the ids on one line, separated by spaces. Only the\n"
	"    tokenizer metadata of MODEL is read; the weights are not loaded.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    -t, --text FILE    text to tokenize; must be valid UTF-8\n"
	"    --special          map control-token text such as <|im_start|> to its id\n"
	"                       (default: treat it as plain text)\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n";

static const char *const help_bench =
	"NAME\n"
	"    %s bench - prefill and decode speed\n"
	"\n"
	"SYNOPSIS\n"
	"    %s bench --model MODEL [--ctx N,N,...] [--decode N] [--chunk N] [--threads N]\n"
	"             [--exact] [--pp N] [--tg N] [--depth D,D,...]\n"
	"\n"
	"DESCRIPTION\n"
	"    For each context length L: prefills L synthetic tokens into an empty full cache\n"
	"    (chunked, logits for the last token only) and reports prefill tokens/s; then\n"
	"    feeds --decode single tokens (each with its logits, as generation does) and\n"
	"    reports decode tokens/s at that depth. A benchmark, not a test: figures depend\n"
	"    on the machine and the thread count.\n"
	"    With --pp or --tg it runs llama-bench's tests instead and prints one line per\n"
	"    test, 'NAME TOKENS_PER_S': ppN prefills N tokens into an empty cache; tgN feeds\n"
	"    N single tokens after an untimed prefill of each --depth D (tgN, tgN@dD).\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    --ctx LIST         comma-separated context lengths (default 128,1024,4096)\n"
	"    --decode N         decode steps after each prefill (default 32)\n"
	"    --chunk N          prefill chunk (default 512)\n"
	"    --threads N        threads (fast path: the pool; exact path: OpenBLAS)\n"
	"    --exact            the exact path (f32 weights, OpenBLAS); default: the fast path\n"
	"    --pp N, --tg N     llama-bench's prompt and generation tests (0: off)\n"
	"    --depth LIST       cache depths for --tg (default 0)\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n";

static const char *const help_keepmap =
	"NAME\n"
	"    %s keepmap - draw which positions a KV-cache policy keeps, per layer and KV head\n"
	"\n"
	"SYNOPSIS\n"
	"    %s keepmap --model MODEL --text FILE [--ctx N] [--policy NAME]\n"
	"             [--set NAME=VALUE]... [--ratio R] [--prompt N] [--chunk N]\n"
	"             [--threads N] --svg OUT\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes FILE, feeds its first N tokens through the model under the policy\n"
	"    (the N tokens are the prompt, as for ppl, so prompt-end triggers fire after the\n"
	"    last one), then writes OUT, an SVG grid with one row per (layer, KV head), rows\n"
	"    grouped by layer and labelled \"L0 H0\", ..., and x = token position 0..N-1\n"
	"    (bins of ceil(N / 1000) positions when N > 1000). A cell is blue where the head\n"
	"    keeps the position, hatched orange where it holds a merged prototype (an entry\n"
	"    standing for more than one token, drawn at its position), grey where the\n"
	"    position was evicted; each row ends with its kept-entry count. The title gives\n"
	"    the policy, its parameters, the ratio, N and the kept entries per head.\n"
	"    Prints one line: entries kept in all heads, mean / min / max per head, merged.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL   GGUF model file\n"
	"    -t, --text FILE     the text; must be valid UTF-8\n"
	"    --ctx N             feed the first N tokens (default: the whole text, up to the\n"
	"                        model's context_length)\n"
	"    --policy NAME       policy (default %s); --set, --ratio as for ppl\n"
	"    --prompt N          the prompt length given to the policy (default: N)\n"
	"    --svg OUT           the SVG file to write (required)\n"
	"    --chunk N, --threads N, --fast, -h/--help  as for ppl\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n"
	"\n"
	"EXAMPLE\n"
	"    %s keepmap --model models/SmolLM2-135M-Instruct.Q4_1.gguf --text t.txt \\\n"
	"           --ctx 512 --policy h2o --ratio 4 --svg h2o.svg\n";

/* Print a help page: a printf format whose %s slots the caller fills in order (the
 * program name, and the default policy's name where a page says "default %s"); n_args
 * documents how many the page has. */
static void print_help(const char *page, int n_args, ...)
{
	va_list ap;
	va_start(ap, n_args);
	vprintf(page, ap);
	va_end(ap);
}

/* ---- errors ---------------------------------------------------------------------------- */

static int usage_err(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int usage_err(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s: ", g_prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '%s %s%s--help' for more information.\n", g_prog, cmd, *cmd ? " " : "");
	return EXIT_USAGE;
}

static int runtime_err(const rt_err *err)
{
	fprintf(stderr, "%s: %s\n", g_prog, err->msg);
	return EXIT_FAILURE;
}

/* Strict decimal integer in [lo, hi]; -1 on anything else. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* Comma-separated list of numbers in [lo, hi] (integers when integral), at most MAX_LIST. */
static int parse_list(const char *s, double lo, double hi, int integral, double *out, int *n)
{
	*n = 0;
	for (const char *p = s;;) {
		char item[32];
		size_t len = strcspn(p, ",");
		if (*n == MAX_LIST || len == 0 || len >= sizeof item)
			return -1;
		memcpy(item, p, len);
		item[len] = 0;
		char *end;
		errno = 0;
		double v = strtod(item, &end);
		if (errno || end == item || *end || !isfinite(v) || v < lo || v > hi ||
		    (integral && v != floor(v)))
			return -1;
		out[(*n)++] = v;
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

/* ---- options --------------------------------------------------------------------------- */

typedef struct opts {
	const char *model, *text, *prompt, *system, *dump, *logits, *ctx_list;
	const char *policy, *haystack, *lengths, *depths, *svg, *batch;
	const char *sets[MAX_SETS];
	int n_sets;
	long ctx, chunk, n_gen, threads, decode, prompt_len, seed, score_from;
	double ratio;
	int json, chat, special, stats, no_ref, task_niah, mode_agnostic, mark_question;
	int exact;  /* 1: the exact path, 0: the fast path (each command sets its default) */
	long pp, tg; /* bench: llama-bench's tests */
} opts;

enum { O_CTX = 256, O_CHUNK, O_JSON, O_DUMP, O_LOGITS, O_CHAT, O_SYSTEM, O_SPECIAL, O_STATS,
       O_THREADS, O_DECODE, O_POLICY, O_SET, O_RATIO, O_NOREF, O_PROMPTLEN, O_HAYSTACK,
       O_LENGTHS, O_DEPTHS, O_MODE, O_TASK, O_SEED, O_GEN, O_SVG, O_BATCH, O_SCOREFROM, O_MARKQ,
       O_EXACT, O_FAST, O_PP, O_TG, O_DEPTH };

/* Parse argv (argv[0] is the command name) with the command's long options lo and short
 * options so into o, checking every value. Returns 0, 1 after printing help (help_fn),
 * or EXIT_USAGE after printing the error. need_model: --model is required. */
static int parse_opts(const char *cmd, void (*help_fn)(void), int argc, char **argv, opts *o,
                      const struct option *lo, const char *so, int need_model)
{
	optind = 1;
	opterr = 0;
	int c, idx;
	while ((c = getopt_long(argc, argv, so, lo, &idx)) != -1) {
		long v;
		switch (c) {
		case 'h':
			help_fn();
			return 1;
		case 'm': o->model = optarg; break;
		case 't': o->text = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'n':
			if (parse_int(optarg, 0, INT_MAX, &v))
				return usage_err(cmd, "-n: '%s' is not a token count", optarg);
			o->n_gen = v;
			break;
		case O_GEN:
			if (parse_int(optarg, 1, 4096, &v))
				return usage_err(cmd, "--gen: '%s' is not a token count in 1..4096", optarg);
			o->n_gen = v;
			break;
		case O_CTX:
			if (o->ctx_list) {
				o->ctx_list = optarg;
				break;
			}
			if (parse_int(optarg, 2, INT_MAX, &v))
				return usage_err(cmd, "--ctx: '%s' is not a token count >= 2", optarg);
			o->ctx = v;
			break;
		case O_PROMPTLEN:
			if (parse_int(optarg, 0, INT_MAX, &v))
				return usage_err(cmd, "--prompt: '%s' is not a token count", optarg);
			o->prompt_len = v;
			break;
		case O_CHUNK:
			if (parse_int(optarg, 1, 65536, &v))
				return usage_err(cmd, "--chunk: '%s' is not a number in 1..65536", optarg);
			o->chunk = v;
			break;
		case O_THREADS:
			if (parse_int(optarg, 1, 256, &v))
				return usage_err(cmd, "--threads: '%s' is not a number in 1..256", optarg);
			o->threads = v;
			break;
		case O_EXACT:
			o->exact = 1;
			break;
		case O_PP:
		case O_TG:
			if (parse_int(optarg, 0, 1 << 20, &v))
				return usage_err(cmd, "--%s: '%s' is not a number in 0..1048576",
				                 c == O_PP ? "pp" : "tg", optarg);
			*(c == O_PP ? &o->pp : &o->tg) = v;
			break;
		case O_DEPTH:
			o->depths = optarg;
			break;
		case O_FAST:
			o->exact = 0;
			break;
		case O_DECODE:
			if (parse_int(optarg, 1, 1 << 20, &v))
				return usage_err(cmd, "--decode: '%s' is not a positive count", optarg);
			o->decode = v;
			break;
		case O_SEED:
			if (parse_int(optarg, 0, LONG_MAX, &v))
				return usage_err(cmd, "--seed: '%s' is not a non-negative integer", optarg);
			o->seed = v;
			break;
		case O_RATIO: {
			char *end;
			errno = 0;
			double r = strtod(optarg, &end);
			if (errno || end == optarg || *end || !isfinite(r) || r < 1)
				return usage_err(cmd, "--ratio: '%s' is not a compression factor >= 1", optarg);
			o->ratio = r;
			break;
		}
		case O_BATCH: o->batch = optarg; break;
		case O_MARKQ: o->mark_question = 1; break;
		case O_SCOREFROM:
			if (parse_int(optarg, 1, INT_MAX, &v))
				return usage_err(cmd, "--score-from: '%s' is not a position >= 1", optarg);
			o->score_from = v;
			break;
		case O_SET:
			if (o->n_sets == MAX_SETS)
				return usage_err(cmd, "--set: more than %d overrides", MAX_SETS);
			if (!strchr(optarg, '=') || optarg[0] == '=')
				return usage_err(cmd, "--set: expected NAME=VALUE, got '%s'", optarg);
			o->sets[o->n_sets++] = optarg;
			break;
		case O_MODE:
			if (!strcmp(optarg, "aware"))
				o->mode_agnostic = 0;
			else if (!strcmp(optarg, "agnostic"))
				o->mode_agnostic = 1;
			else
				return usage_err(cmd, "--mode: '%s' is not aware or agnostic", optarg);
			break;
		case O_TASK:
			if (!strcmp(optarg, "passkey"))
				o->task_niah = 0;
			else if (!strcmp(optarg, "niah"))
				o->task_niah = 1;
			else
				return usage_err(cmd, "--task: '%s' is not passkey or niah", optarg);
			break;
		case O_POLICY: o->policy = optarg; break;
		case O_HAYSTACK: o->haystack = optarg; break;
		case O_LENGTHS: o->lengths = optarg; break;
		case O_DEPTHS: o->depths = optarg; break;
		case O_SVG: o->svg = optarg; break;
		case O_NOREF: o->no_ref = 1; break;
		case O_JSON: o->json = 1; break;
		case O_DUMP: o->dump = optarg; break;
		case O_LOGITS: o->logits = optarg; break;
		case O_CHAT: o->chat = 1; break;
		case O_SYSTEM: o->system = optarg; break;
		case O_SPECIAL: o->special = 1; break;
		case O_STATS: o->stats = 1; break;
		case ':':
			return usage_err(cmd, "option '%s' needs a value", argv[optind - 1]);
		default:
			return usage_err(cmd, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_err(cmd, "unexpected argument '%s'", argv[optind]);
	if (need_model && !o->model)
		return usage_err(cmd, "%s", "--model is required");
	/* every file written at the end must be writable before any work starts */
	const char *outs[][2] = { { "--svg", o->svg }, { "--dump", o->dump }, { "--logits", o->logits } };
	for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
		rt_err err = { "" };
		if (outs[i][1] && rt_outpath_check(outs[i][1], &err) != 0)
			return usage_err(cmd, "%s: %s", outs[i][0], err.msg);
	}
	return 0;
}

/* ---- shared pieces -------------------------------------------------------------------- */

static const struct kvp_policy *const *g_reg;
static int g_n_reg;

static const char *default_policy_name(void)
{
	return g_n_reg > 0 && g_reg[0] ? g_reg[0]->name : "full";
}

/* The named policy (the registry first, then the built-in full), or NULL. */
static const struct kvp_policy *find_policy(const char *name)
{
	const struct kvp_policy *p = rt_registry_find(g_reg, g_n_reg, name);
	if (!p && !strcmp(name, "full"))
		p = &rt_policy_full;
	return p;
}

/* Resolve --policy and check --set names and values and --ratio against it before any
 * work. Returns the policy, or NULL after printing a usage error (*rc = 2). */
static const struct kvp_policy *policy_from_opts(const char *cmd, const opts *o, int *rc)
{
	const char *name = o->policy ? o->policy : default_policy_name();
	const struct kvp_policy *p = find_policy(name);
	if (!p) {
		char list[512] = "";
		size_t used = 0;
		for (int i = 0; i < g_n_reg && used < sizeof list - 70; i++)
			used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
			                         g_reg[i]->name);
		if (!rt_registry_find(g_reg, g_n_reg, "full"))
			snprintf(list + used, sizeof list - used, "%sfull", used ? ", " : "");
		*rc = usage_err(cmd, "unknown policy '%s' (this binary has: %s)", name, list);
		return NULL;
	}
	double *vals = calloc((size_t)(p->n_params > 0 ? p->n_params : 1), sizeof(double));
	if (!vals) {
		fprintf(stderr, "%s: out of memory\n", g_prog);
		*rc = EXIT_FAILURE;
		return NULL;
	}
	rt_err err = { "" };
	for (int i = 0; i < o->n_sets; i++)
		if (kvp_policy_param_set(p, vals, o->sets[i], &err) != 0) {
			free(vals);
			*rc = usage_err(cmd, "--set: %s", err.msg);
			return NULL;
		}
	free(vals);
	if (o->ratio > 0 && !p->compress) {
		*rc = usage_err(cmd, "--ratio: policy %s never compresses, so a ratio does not apply",
		                p->name);
		return NULL;
	}
	return p;
}

/* Apply --set and --ratio to a sequence (checked before, so failures are runtime). */
static int seq_apply(rt_seq *s, const opts *o, rt_err *err)
{
	for (int i = 0; i < o->n_sets; i++)
		if (rt_seq_set(s, o->sets[i], err) != 0)
			return -1;
	if (o->ratio > 0 && rt_seq_set_ratio(s, o->ratio, err) != 0)
		return -1;
	return 0;
}

static char *read_text(const char *path, size_t *len)
{
	rt_err err = { "" };
	char *s = rt_text_read(path, len, &err);
	if (!s)
		runtime_err(&err);
	return s;
}

static int32_t *tokenize_all(const rt_tokenizer *tk, const char *what, const char *s, size_t len,
                             int special, int64_t *n)
{
	rt_err err = { "" };
	int64_t cnt = rt_tokenize(tk, s, len, special, NULL, 0, &err);
	if (cnt < 0) {
		fprintf(stderr, "%s: %s: %s\n", g_prog, what, err.msg);
		return NULL;
	}
	int32_t *ids = malloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
	if (!ids) {
		fprintf(stderr, "%s: %s: out of memory for %lld tokens\n", g_prog, what, (long long)cnt);
		return NULL;
	}
	if (rt_tokenize(tk, s, len, special, ids, cnt, &err) != cnt) {
		fprintf(stderr, "%s: %s: %s\n", g_prog, what,
		        err.msg[0] ? err.msg : "tokenizer count changed");
		free(ids);
		return NULL;
	}
	*n = cnt;
	return ids;
}

/* Threads when --threads is not given: the exact path keeps OpenBLAS's own default
 * (OPENBLAS_NUM_THREADS or every core), the fast path takes every online core. */
static int default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

/* Open the GGUF of path, its tokenizer (tk non-NULL) and the model (m non-NULL) on the
 * path o->exact asks for with o->threads threads. */
static int open_model(const char *path, const opts *o, rt_gguf **g, rt_tokenizer **tk,
                      rt_model **m)
{
	rt_err err = { "" };
	*g = rt_gguf_open(path, &err);
	if (!*g)
		return runtime_err(&err), -1;
	if (tk && !(*tk = rt_tokenizer_init(*g, &err)))
		return runtime_err(&err), -1;
	if (!m)
		return 0;
	rt_model_opts mo = { .exact = o->exact, .threads = o->threads > 0 ? (int)o->threads : 0 };
	if (!o->exact && o->threads <= 0)
		mo.threads = default_threads();
	if (!(*m = rt_model_load_opts(*g, &mo, &err)))
		return runtime_err(&err), -1;
	return 0;
}

static void set_threads(long t)
{
	if (t > 0)
		openblas_set_num_threads((int)t);
}

/* ---- SHA-256 of files and buffers (rt_ab.h's), for the --json records ------------------ */

/* Hex SHA-256 of a file into out[65]; out = "" when it cannot be read (then omitted). */
static void file_sha256(const char *path, char out[65])
{
	rt_err err = { "" };
	if (rt_sha256_file(path, out, &err) != 0)
		out[0] = 0;
}

static void buf_sha256(const void *p, size_t n, char out[65])
{
	rt_sha256 c;
	rt_sha256_init(&c);
	rt_sha256_update(&c, p, n);
	rt_sha256_hex(&c, out);
}

/* The model of --model and the tokens of the text (len bytes) for ppl and keepmap: *n
 * tokens in *ids (caller frees), *use = min(n, --ctx or the model's context_length). Returns
 * 0, or -1 after printing the error with *rc the exit status (usage error: --ctx beyond the
 * model's context_length). */
static int open_text_model(const opts *o, const char *text, size_t len, rt_tokenizer **tk,
                           rt_model **m, int32_t **ids, int64_t *n, int64_t *use, int *rc)
{
	rt_gguf *g = NULL;
	*rc = EXIT_FAILURE;
	if (open_model(o->model, o, &g, tk, m) < 0) {
		rt_gguf_close(g);
		return -1;
	}
	rt_gguf_close(g);
	if (o->ctx > (*m)->hp.n_ctx) {
		fprintf(stderr, "%s: %s: --ctx %ld exceeds the model's context_length %d\n", g_prog,
		        o->model, o->ctx, (int)(*m)->hp.n_ctx);
		*rc = EXIT_USAGE;
		return -1;
	}
	if (!(*ids = tokenize_all(*tk, o->text, text, len, 0, n)))
		return -1;
	*use = o->ctx ? o->ctx : (*m)->hp.n_ctx;
	if (*use > *n)
		*use = *n;
	return 0;
}

/* ---- JSON helpers ----------------------------------------------------------------------- */

/* ,"policy":..,"params":{..},"ratio":.. ,"commit":.. (the run metadata) */
static void json_policy(FILE *out, const rt_seq *s, double ratio)
{
	fputs("\"policy\":", out);
	rt_json_str(out, s->p->name);
	fputs(",\"policy_source\":", out);
	rt_json_str(out, s->p->source ? s->p->source : "");
	fputs(",\"policy_hash\":", out);
	rt_json_str(out, s->p->source_hash ? s->p->source_hash : "");
	fputs(",\"params\":{", out);
	for (int i = 0; i < s->p->n_params; i++) {
		if (i)
			fputc(',', out);
		rt_json_str(out, s->p->params[i].name);
		fputc(':', out);
		rt_json_num(out, s->run.params[i]);
	}
	fputc('}', out);
	if (ratio > 0)
		rt_json_member_num(out, "ratio", ratio);
	else
		fputs(",\"ratio\":null", out);
#ifdef KVPC_COMMIT
	fputs(",\"commit\":", out);
	rt_json_str(out, KVPC_COMMIT);
#endif
}

/* ---- info ------------------------------------------------------------------------------- */

static void help_info_fn(void)
{
	print_help(help_info, 2, g_prog, g_prog);
}

static void info_one(const struct kvp_policy *p, int json, int first)
{
	const char *pos = p->positions == KVP_POS_COMPACTED ? "compacted" : "original";
	if (json) {
		fputs(first ? "{\"name\":" : ",{\"name\":", stdout);
		rt_json_str(stdout, p->name);
		fputs(",\"summary\":", stdout);
		rt_json_str(stdout, p->summary ? p->summary : "");
		fputs(",\"source\":", stdout);
		rt_json_str(stdout, p->source ? p->source : "");
		fputs(",\"source_hash\":", stdout);
		rt_json_str(stdout, p->source_hash ? p->source_hash : "");
		printf(",\"positions\":\"%s\",\"params\":[", pos);
		for (int i = 0; i < p->n_params; i++) {
			const struct kvp_param *q = &p->params[i];
			fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
			rt_json_str(stdout, q->name);
			char src[64];
			rt_param_format(q, q->def, src, sizeof src);
			fputs(",\"default\":", stdout);
			rt_json_num(stdout, q->def);
			fputs(",\"default_source\":", stdout);
			rt_json_str(stdout, src);
			printf(",\"unit\":\"%s\",\"doc\":", kvp_unit_name(q->unit));
			rt_json_str(stdout, q->doc ? q->doc : "");
			fputc('}', stdout);
		}
		fputs("]}", stdout);
		return;
	}
	printf("%s\n", p->name);
	if (p->summary && *p->summary)
		printf("    %s\n", p->summary);
	printf("    source %s (hash %s), positions %s\n", p->source ? p->source : "?",
	       p->source_hash ? p->source_hash : "?", pos);
	if (p->n_params == 0)
		printf("    no parameters\n");
	for (int i = 0; i < p->n_params; i++) {
		const struct kvp_param *q = &p->params[i];
		char set[96], v[64];
		rt_param_format_set(q, q->def, v, sizeof v);
		snprintf(set, sizeof set, "%s=%s", q->name, v);
		printf("    --set %-22s %-8s %s\n", set, kvp_unit_name(q->unit), q->doc ? q->doc : "");
	}
}

static int cmd_info(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, 0, O_JSON }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	opts o = { 0 };
	int rc = parse_opts("info", help_info_fn, argc, argv, &o, lo, ":h", 0);
	if (rc)
		return rc == 1 ? 0 : rc;
	int first = 1;
	if (o.json)
		fputs("{\"policies\":[", stdout);
	for (int i = 0; i < g_n_reg; i++) {
		info_one(g_reg[i], o.json, first);
		first = 0;
		if (!o.json)
			putchar('\n');
	}
	if (!rt_registry_find(g_reg, g_n_reg, "full"))
		info_one(&rt_policy_full, o.json, first);
	if (o.json)
		fputs("]}\n", stdout);
	return fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
}

/* ---- ppl --------------------------------------------------------------------------------- */

static void help_ppl_fn(void)
{
	print_help(help_ppl, 6, g_prog, g_prog, g_prog, g_prog, default_policy_name(), g_prog);
}

/* One policy run of `ppl` or `needle`: the policy with its --set overrides and --ratio
 * (from the command line, or one line of a --batch file), its sequence and, for ppl, its
 * running scores. */
typedef struct cli_run {
	const struct kvp_policy *p;
	opts o;                  /* sets and ratio of this run */
	char *line;              /* owned copy of the batch line the sets point into, or NULL */
	rt_seq seq;
} cli_run;

/* Store capacity of a run: every prompt token, or for a ratio run of a policy that
 * compresses as it goes (no prompt-end trigger) its budget plus PPL_CAP_SLACK. */
static int32_t run_cap(const cli_run *r, int64_t len, int64_t extra)
{
	int64_t cap = len + extra;
	if (r->o.ratio > 0 && !(r->p->needs & KVP_NEED_PROMPT_LEN)) {
		int64_t c = (int64_t)ceil((double)len / r->o.ratio) + PPL_CAP_SLACK + extra;
		cap = c < cap ? c : cap;
	}
	return (int32_t)cap;
}

/* Free K runs (their sequences and batch lines) and the array; K < 0 counts as 0. */
static void runs_free(cli_run *runs, int K)
{
	for (int i = 0; runs && i < K; i++) {
		rt_seq_free(&runs[i].seq);
		free(runs[i].line);
	}
	free(runs);
}

/* Parse a --batch file: one run per non-blank line that does not start with '#':
 * `POLICY [--ratio R] [--set NAME=VALUE]...`. Checks every policy, override and ratio
 * (as --policy/--set/--ratio would) and reports FILE:LINE: reason. Returns the runs (n in
 * *n) or NULL after printing the error (*rc set). */
static cli_run *runs_parse(const char *cmd, const char *path, int *n, int *rc)
{
	size_t len;
	rt_err err = { "" };
	char *txt = rt_text_read(path, &len, &err);
	*n = 0;
	*rc = EXIT_USAGE;
	if (!txt) {
		runtime_err(&err);
		return NULL;
	}
	int cap = 8;
	cli_run *runs = calloc((size_t)cap, sizeof *runs);
	int lineno = 0, ok = runs != NULL;
	for (char *save = NULL, *ln = strtok_r(txt, "\n", &save); ok && ln;
	     ln = strtok_r(NULL, "\n", &save)) {
		lineno++;
		char *q = ln + strspn(ln, " \t\r");
		if (!*q || *q == '#')
			continue;
		if (*n == cap) {
			cli_run *nr = realloc(runs, (size_t)cap * 2 * sizeof *runs);
			if (!nr) {
				ok = 0;
				break;
			}
			memset(nr + cap, 0, (size_t)cap * sizeof *runs);
			runs = nr, cap *= 2;
		}
		cli_run *r = &runs[*n];
		if (!(r->line = strdup(q))) {
			ok = 0;
			break;
		}
		(*n)++;
		char *tok_save = NULL, *w = strtok_r(r->line, " \t\r", &tok_save);
		const char *name = w;
		const char *why = NULL;
		char whybuf[160];
		while (!why && (w = strtok_r(NULL, " \t\r", &tok_save))) {
			char *v = strtok_r(NULL, " \t\r", &tok_save);
			if (strcmp(w, "--ratio") && strcmp(w, "--set")) {
				snprintf(whybuf, sizeof whybuf, "unknown word '%s' (expected --ratio R or "
				         "--set NAME=VALUE)", w);
				why = whybuf;
			} else if (!v) {
				snprintf(whybuf, sizeof whybuf, "%s needs a value", w);
				why = whybuf;
			} else if (!strcmp(w, "--ratio")) {
				char *end;
				errno = 0;
				double x = strtod(v, &end);
				if (errno || end == v || *end || !isfinite(x) || x < 1) {
					snprintf(whybuf, sizeof whybuf, "--ratio: '%s' is not a compression "
					         "factor >= 1", v);
					why = whybuf;
				}
				r->o.ratio = x;
			} else if (r->o.n_sets == MAX_SETS) {
				why = "more than 64 --set overrides";
			} else if (!strchr(v, '=') || v[0] == '=') {
				snprintf(whybuf, sizeof whybuf, "--set: expected NAME=VALUE, got '%s'", v);
				why = whybuf;
			} else {
				r->o.sets[r->o.n_sets++] = v;
			}
		}
		if (!why) {
			r->o.policy = name;
			int prc; /* policy_from_opts prints its own message */
			r->p = policy_from_opts(cmd, &r->o, &prc);
			if (!r->p) {
				fprintf(stderr, "%s: %s:%d: the run above is refused\n", g_prog, path, lineno);
				free(txt);
				*rc = prc;
				return runs; /* caller frees; r->p NULL marks failure */
			}
		}
		if (why) {
			fprintf(stderr, "%s: %s:%d: %s\n", g_prog, path, lineno, why);
			free(txt);
			r->p = NULL;
			return runs;
		}
	}
	free(txt);
	if (!ok) {
		fprintf(stderr, "%s: out of memory reading %s\n", g_prog, path);
		*rc = EXIT_FAILURE;
		return runs;
	}
	if (*n == 0) {
		fprintf(stderr, "%s: %s: no runs (one `POLICY [--ratio R] [--set NAME=VALUE]...` per "
		        "line)\n", g_prog, path);
		return runs;
	}
	*rc = 0;
	return runs;
}

/* The runs of a command: the lines of --batch, or the one run --policy/--set/--ratio give.
 * Returns them (count in *K; free with runs_free) or NULL after printing the error, *rc
 * the exit status. */
static cli_run *runs_from_opts(const char *cmd, const opts *o, int *K, int *rc)
{
	cli_run *runs;
	*K = 0;
	if (o->batch) {
		if (o->policy || o->n_sets || o->ratio > 0) {
			*rc = usage_err(cmd, "%s", "--batch gives every run's policy, --set and --ratio; "
			                "--policy, --set and --ratio cannot be combined with it");
			return NULL;
		}
		runs = runs_parse(cmd, o->batch, K, rc);
		if (*rc) {
			runs_free(runs, *K);
			return NULL;
		}
		return runs;
	}
	const struct kvp_policy *p = policy_from_opts(cmd, o, rc);
	if (!p)
		return NULL;
	if (!(runs = calloc(1, sizeof *runs))) {
		fprintf(stderr, "%s: out of memory\n", g_prog);
		*rc = EXIT_FAILURE;
		return NULL;
	}
	*K = 1;
	runs[0].p = p;
	runs[0].o = *o;
	return runs;
}

static void ppl_report(const cli_run *r, const rt_eval_score *sc, const rt_model *m, const opts *o, const char *msha,
                       const char *tsha, int64_t n, int64_t use, int64_t prompt_len, int block,
                       int ref, int batch)
{
	const struct kvp_policy *p = r->p;
	rt_seq_stats st = rt_seq_stats_get(&r->seq);
	if (st.compress_events == 0 && p->compress)
		fprintf(stderr, "%s: note: policy %s never compressed on these %lld tokens (its budget "
		        "or trigger was not reached)\n", g_prog, p->name, (long long)use);
	double mean_entries = rt_seq_mean_entries(&r->seq);
	double compression = mean_entries > 0 ? (double)use / mean_entries : 0;
	double nll_mean = sc->nll / (double)sc->scored, ppl = exp(nll_mean);
	double tps = st.seconds > 0 ? (double)use / st.seconds : 0;
	int threads = m->exact ? openblas_get_num_threads() : rt_model_threads(m);
	rt_kld_summary ks;
	memset(&ks, 0, sizeof ks);
	if (ref)
		rt_kld_acc_summary(&sc->acc, &ks);
	if (o->json) {
		fputc('{', stdout);
		json_policy(stdout, &r->seq, r->o.ratio);
		fputs(",\"model\":", stdout);
		rt_json_str(stdout, m->path);
		if (msha[0]) {
			fputs(",\"model_sha256\":", stdout);
			rt_json_str(stdout, msha);
		}
		fputs(",\"text\":", stdout);
		rt_json_str(stdout, o->text);
		fputs(",\"text_sha256\":", stdout);
		rt_json_str(stdout, tsha);
		printf(",\"threads\":%d,\"chunk\":%d,\"prompt\":%ld,\"tokens\":%lld,\"scored\":%lld,"
		       "\"score_from\":%ld,\"batch\":%d",
		       threads, block, (long)prompt_len, (long long)use, (long long)sc->scored,
		       o->score_from > 1 ? o->score_from : 1, batch);
		rt_json_member_num(stdout, "ppl", ppl);
		rt_json_member_num(stdout, "nll_mean", nll_mean);
		rt_json_member_num(stdout, "top1_acc", (double)sc->hits / (double)sc->scored);
		printf(",\"kv_entries_peak\":%lld,\"kv_bytes_peak\":%lld",
		       (long long)st.kv_entries_peak, (long long)st.kv_bytes_peak);
		rt_json_member_num(stdout, "kv_entries_per_head", mean_entries);
		rt_json_member_num(stdout, "compression", compression);
		rt_json_member_num(stdout, "tokens_per_s", tps);
		printf(",\"compress_events\":%lld", (long long)st.compress_events);
		rt_json_member_num(stdout, "policy_seconds", st.policy_seconds);
		rt_json_member_num(stdout, "seconds", st.seconds);
		if (ref) {
			rt_json_member_num(stdout, "kld_mean", ks.kld_mean);
			rt_json_member_num(stdout, "kld_mean_err", ks.kld_mean_err);
			rt_json_member_num(stdout, "kld_median", ks.kld_median);
			rt_json_member_num(stdout, "kld_p99", ks.kld_p99);
			rt_json_member_num(stdout, "kld_max", ks.kld_max);
			rt_json_member_num(stdout, "ppl_ref", ks.ppl_p);
			rt_json_member_num(stdout, "ppl_ratio", ks.ppl_ratio);
			rt_json_member_num(stdout, "same_top1", ks.same_top1);
			rt_json_member_num(stdout, "rms_dp", ks.rms_dp);
		}
		fputs("}\n", stdout);
		return;
	}
	printf("model            %s\n", m->path);
	printf("text             %s (%lld tokens, first %lld scored)\n", o->text, (long long)n,
	       (long long)use);
	printf("policy           %s", p->name);
	for (int i = 0; i < p->n_params; i++)
		printf(" %s=%g", p->params[i].name, r->seq.run.params[i]);
	if (r->o.ratio > 0)
		printf(" ratio=%g", r->o.ratio);
	putchar('\n');
	printf("ppl              %.4f\n", ppl);
	printf("nll_mean         %.6f nats/token\n", nll_mean);
	printf("top1_acc         %.4f\n", (double)sc->hits / (double)sc->scored);
	if (ref) {
		printf("ppl_ref          %.4f (full cache), ppl_ratio %.4f\n", ks.ppl_p, ks.ppl_ratio);
		printf("kld              mean %.6f ± %.6f, p99 %.6f, max %.6f nats\n", ks.kld_mean,
		       ks.kld_mean_err, ks.kld_p99, ks.kld_max);
		printf("same_top1        %.4f, rms_dp %.4f\n", ks.same_top1, ks.rms_dp);
	}
	printf("kv peak          %lld entries, %.2f MiB\n", (long long)st.kv_entries_peak,
	       (double)st.kv_bytes_peak / (1024.0 * 1024.0));
	printf("compression      %.2fx (%.1f entries per head at the end)\n", compression,
	       mean_entries);
	printf("compressions     %lld (%.3f s in policy code)\n", (long long)st.compress_events,
	       st.policy_seconds);
	printf("speed            %.1f tokens/s (%.2f s, %d threads%s)\n", tps, st.seconds, threads,
	       batch > 1 ? ", shared by the batch" : "");
	if (batch > 1)
		putchar('\n');
}

/* The sequences of a ppl pass: the runs and the full-cache reference, with the block. */
typedef struct ppl_pass {
	cli_run *runs;
	int K, ref, block;
	int64_t n, use, prompt_len;
	rt_seq sp;               /* the reference (when ref) */
	rt_seq **all;            /* [K] the runs' sequences */
	rt_eval_score *sc;       /* [K] */
} ppl_pass;

/* Set up the pass's sequences over use tokens (after the model and text are loaded). */
static int ppl_pass_init(ppl_pass *pp, const rt_model *m, const opts *o, rt_err *err)
{
	const int S = pp->K + pp->ref; /* sequences fed in lockstep */
	pp->block = (int)(o->chunk < pp->use ? o->chunk : pp->use);
	if (S > 1) { /* bound the batch's stacked rows and logits (S × block rows) */
		int cap_rows = 512 / S;
		pp->block = pp->block < cap_rows ? pp->block : cap_rows < 1 ? 1 : cap_rows;
	}
	/* Without --prompt the whole scored text is the prompt, so a ratio budget is
	 * use / R entries per head from the first token (a fixed cache budget, the convention
	 * `kvpc ab` uses too) rather than growing from 0 with the tokens seen. */
	pp->prompt_len = o->prompt_len >= 0 ? o->prompt_len : pp->use;
	pp->all = calloc((size_t)pp->K, sizeof *pp->all);
	pp->sc = calloc((size_t)pp->K, sizeof *pp->sc);
	if (!pp->all || !pp->sc)
		return rt_err_set(err, "out of memory");
	for (int i = 0; i < pp->K; i++) {
		rt_eval_score_init(&pp->sc[i]);
		/* A ratio budget over the whole scored text is a fixed use / R entries per head;
		 * a policy that compresses as it goes gets that plus PPL_CAP_SLACK entries for what
		 * it holds between compressions (a block-wise policy's block, a batch eviction's
		 * overshoot), so a batch of many ratios fits in memory; one that overshoots
		 * further stops with "KV cache full". Otherwise (full cache, own budget, a
		 * prompt-end policy, --prompt) the store holds every scored token. */
		cli_run *r = &pp->runs[i];
		int64_t cap = pp->prompt_len == pp->use ? run_cap(r, pp->use, 0) : pp->use;
		if (rt_seq_init(&r->seq, m, r->p, (int32_t)cap, pp->block, pp->prompt_len, err) != 0 ||
		    seq_apply(&r->seq, &r->o, err) != 0)
			return -1;
		pp->all[i] = &r->seq;
	}
	if (pp->ref && rt_seq_init(&pp->sp, m, &rt_policy_full, (int32_t)pp->use, pp->block,
	                           pp->prompt_len, err) != 0)
		return -1;
	return 0;
}

static void ppl_pass_free(ppl_pass *pp)
{
	for (int i = 0; pp->sc && i < pp->K; i++)
		rt_eval_score_free(&pp->sc[i]);
	free(pp->sc);
	free(pp->all);
	rt_seq_free(&pp->sp);
	runs_free(pp->runs, pp->K);
}

/* Open --dump and --logits, run the loop, close them. */
static int ppl_pass_run(ppl_pass *pp, const opts *o, const int32_t *ids, rt_err *err)
{
	FILE *dump = NULL, *lgf = NULL;
	int rc = -1;
	if (o->dump && !(dump = fopen(o->dump, "w")))
		rt_err_set(err, "%s: %s", o->dump, strerror(errno));
	else if (o->logits && !(lgf = fopen(o->logits, "wb")))
		rt_err_set(err, "%s: %s", o->logits, strerror(errno));
	else {
		rt_eval_loop lo = { .block = pp->block, .batched = 1, .score_from = o->score_from,
			            .dump = dump, .dump_name = o->dump, .logits = lgf,
			            .logits_name = o->logits };
		rc = rt_eval_runs(pp->all, pp->K, pp->ref ? &pp->sp : NULL, ids, pp->use, &lo, pp->sc,
		                  NULL, err);
	}
	if (dump && fclose(dump) != 0 && rc == 0)
		rc = rt_err_set(err, "%s: write failed", o->dump);
	if (lgf && fclose(lgf) != 0 && rc == 0)
		rc = rt_err_set(err, "%s: write failed", o->logits);
	return rc;
}

/* One report (or JSON line) per run, an error line for a run that failed; returns the
 * exit status. */
static int ppl_pass_report(const ppl_pass *pp, const rt_model *m, const opts *o,
                           const char *text, size_t len)
{
	char msha[65] = "", tsha[65] = "";
	if (o->json) {
		file_sha256(o->model, msha);
		buf_sha256(text, len, tsha);
	}
	int failed = 0;
	for (int i = 0; i < pp->K; i++) {
		const char *why = pp->sc[i].failed_at >= 0 ? pp->sc[i].error : NULL;
		if (!why) {
			ppl_report(&pp->runs[i], &pp->sc[i], m, o, msha, tsha, pp->n, pp->use,
			           pp->prompt_len, pp->block, pp->ref, pp->K + pp->ref);
			continue;
		}
		/* a run whose policy failed in the batch: the others are still reported */
		failed++;
		fprintf(stderr, "%s: %s\n", g_prog, why); /* why names the policy */
		if (o->json) {
			fputc('{', stdout);
			json_policy(stdout, &pp->runs[i].seq, pp->runs[i].o.ratio);
			fputs(",\"error\":", stdout);
			rt_json_str(stdout, why);
			fputs("}\n", stdout);
		}
	}
	return fflush(stdout) == 0 && !failed ? 0 : EXIT_FAILURE;
}

static int cmd_ppl(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "text", required_argument, 0, 't' },
		{ "ctx", required_argument, 0, O_CTX }, { "chunk", required_argument, 0, O_CHUNK },
		{ "json", no_argument, 0, O_JSON }, { "dump", required_argument, 0, O_DUMP },
		{ "logits", required_argument, 0, O_LOGITS },
		{ "threads", required_argument, 0, O_THREADS }, { "exact", no_argument, 0, O_EXACT },
		{ "fast", no_argument, 0, O_FAST },
		{ "policy", required_argument, 0, O_POLICY }, { "set", required_argument, 0, O_SET },
		{ "ratio", required_argument, 0, O_RATIO }, { "no-ref", no_argument, 0, O_NOREF },
		{ "prompt", required_argument, 0, O_PROMPTLEN },
		{ "batch", required_argument, 0, O_BATCH },
		{ "score-from", required_argument, 0, O_SCOREFROM }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	opts o = { .chunk = DEFAULT_CHUNK, .prompt_len = -1, .exact = 1 };
	int rc = parse_opts("ppl", help_ppl_fn, argc, argv, &o, lo, ":m:t:h", 1);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!o.text)
		return usage_err("ppl", "%s", "--text is required");
	if (o.batch && (o.dump || o.logits))
		return usage_err("ppl", "%s", "--dump and --logits write one run's tokens; they cannot "
		                 "be combined with --batch");
	ppl_pass pp = { .ref = !o.no_ref };
	if (!(pp.runs = runs_from_opts("ppl", &o, &pp.K, &rc)))
		return rc;
	set_threads(o.threads);
	size_t len;
	char *text = read_text(o.text, &len);
	rt_tokenizer *tk = NULL;
	rt_model *m = NULL;
	int32_t *ids = NULL;
	rt_err err = { "" };
	rc = EXIT_FAILURE;
	if (!text)
		goto out;
	if (pp.K == 1 && !strcmp(pp.runs[0].p->name, "full"))
		pp.ref = 0;
	if (open_text_model(&o, text, len, &tk, &m, &ids, &pp.n, &pp.use, &rc) < 0)
		goto out;
	if (pp.use < 2) {
		fprintf(stderr, "%s: %s: text has %lld token%s; perplexity needs at least 2\n", g_prog,
		        o.text, (long long)pp.n, pp.n == 1 ? "" : "s");
		goto out;
	}
	if (o.score_from >= pp.use) {
		fprintf(stderr, "%s: --score-from %ld: only %lld tokens are scored (positions "
		        "1..%lld)\n", g_prog, o.score_from, (long long)pp.use, (long long)pp.use - 1);
		rc = EXIT_USAGE;
		goto out;
	}
	if (ppl_pass_init(&pp, m, &o, &err) != 0 || ppl_pass_run(&pp, &o, ids, &err) != 0) {
		runtime_err(&err);
		goto out;
	}
	rc = ppl_pass_report(&pp, m, &o, text, len);
out:
	ppl_pass_free(&pp);
	free(ids);
	rt_model_free(m);
	rt_tokenizer_free(tk);
	free(text);
	return rc;
}

/* ---- needle ------------------------------------------------------------------------------ */

static void help_needle_fn(void)
{
	print_help(help_needle, 3, g_prog, g_prog, default_policy_name());
}

/* the protected span the needle prompts mark: the question (with the answer's opening) */
static const char *const needle_spans[] = { "", "question" };

static int cmd_needle(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "haystack", required_argument, 0, O_HAYSTACK },
		{ "lengths", required_argument, 0, O_LENGTHS }, { "depths", required_argument, 0, O_DEPTHS },
		{ "policy", required_argument, 0, O_POLICY }, { "set", required_argument, 0, O_SET },
		{ "ratio", required_argument, 0, O_RATIO }, { "mode", required_argument, 0, O_MODE },
		{ "task", required_argument, 0, O_TASK }, { "gen", required_argument, 0, O_GEN },
		{ "seed", required_argument, 0, O_SEED }, { "chat", no_argument, 0, O_CHAT },
		{ "chunk", required_argument, 0, O_CHUNK }, { "threads", required_argument, 0, O_THREADS }, { "exact", no_argument, 0, O_EXACT },
		{ "fast", no_argument, 0, O_FAST },
		{ "batch", required_argument, 0, O_BATCH },
		{ "mark-question", no_argument, 0, O_MARKQ },
		{ "json", no_argument, 0, O_JSON }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	opts o = { .chunk = DEFAULT_CHUNK, .seed = 1, .exact = 1, .lengths = "1024,2048,4096",
		   .depths = "0,25,50,75,100" };
	int rc = parse_opts("needle", help_needle_fn, argc, argv, &o, lo, ":m:h", 1);
	if (rc)
		return rc == 1 ? 0 : rc;
	double lens[MAX_LIST], deps[MAX_LIST];
	int n_len, n_dep;
	if (parse_list(o.lengths, 16, 1 << 24, 1, lens, &n_len))
		return usage_err("needle", "--lengths: '%s' is not a comma-separated list of token counts",
		                 o.lengths);
	if (parse_list(o.depths, 0, 100, 0, deps, &n_dep))
		return usage_err("needle", "--depths: '%s' is not a comma-separated list of percentages "
		                 "in 0..100", o.depths);
	if (o.haystack && !o.task_niah)
		return usage_err("needle", "%s", "--haystack needs --task niah");
	int K;
	cli_run *runs = runs_from_opts("needle", &o, &K, &rc);
	if (!runs)
		return rc;
	int64_t n_gen = o.n_gen ? o.n_gen : o.task_niah ? 20 : 8;
	set_threads(o.threads);
	rt_gguf *g = NULL;
	rt_tokenizer *tk = NULL;
	rt_model *m = NULL;
	char *hay = NULL;
	size_t hay_len = 0, hay_off = 0;
	float *logits = NULL, *one = NULL;
	rt_seq **all = NULL;
	rt_seq_batch b = { 0 };
	rt_needle_answer *res = NULL; /* [(length·n_dep + depth)·K + run] */
	rt_err err = { "" };
	rc = EXIT_FAILURE;
	if (o.task_niah) {
		const char *path = o.haystack ? o.haystack : "/usr/share/info/coreutils.info.gz";
		if (!(hay = rt_text_read(path, &hay_len, &err))) {
			runtime_err(&err);
			goto out;
		}
		hay_off = rt_needle_info_body(hay, hay_len);
	}
	if (open_model(o.model, &o, &g, &tk, &m) < 0)
		goto out;
	rt_gguf_close(g);
	g = NULL;
	int64_t max_len = 0;
	for (int i = 0; i < n_len; i++) {
		if ((int64_t)lens[i] + n_gen > m->hp.n_ctx) {
			fprintf(stderr, "%s: %s: length %lld plus %lld answer tokens exceed the model's "
			        "context_length %d\n", g_prog, o.model, (long long)lens[i], (long long)n_gen,
			        (int)m->hp.n_ctx);
			rc = EXIT_USAGE;
			goto out;
		}
		if ((int64_t)lens[i] > max_len)
			max_len = (int64_t)lens[i];
	}
	const int V = m->hp.n_vocab;
	/* prompt chunk: a batch stacks K × chunk rows, so it is bounded as in ppl */
	int chunk = (int)o.chunk;
	if (K > 1 && chunk > 512 / K)
		chunk = 512 / K < 1 ? 1 : 512 / K;
	if (!(all = calloc((size_t)K, sizeof *all)) ||
	    !(res = calloc((size_t)K * n_len * n_dep, sizeof *res)) ||
	    !(logits = malloc((size_t)K * V * sizeof *logits)) ||
	    !(one = malloc((size_t)V * sizeof *one))) {
		fprintf(stderr, "%s: out of memory\n", g_prog);
		goto out;
	}
	for (int i = 0; i < K; i++) {
		if (rt_seq_init(&runs[i].seq, m, runs[i].p, run_cap(&runs[i], max_len, n_gen), chunk, -1,
		                &err) != 0 ||
		    seq_apply(&runs[i].seq, &runs[i].o, &err) != 0) {
			runtime_err(&err);
			goto out;
		}
		all[i] = &runs[i].seq;
		rt_seq_set_span_names(all[i], needle_spans, 1);
	}
	if (K > 1 && rt_seq_batch_init(&b, all, K, chunk, &err) != 0) {
		runtime_err(&err);
		goto out;
	}
	const char *task = o.task_niah ? "niah" : "passkey";
	const char *mode = o.mode_agnostic ? "agnostic" : "aware";
	const rt_needle_how how = { .agnostic = o.mode_agnostic, .mark_question = o.mark_question,
		                    .n_gen = n_gen };
	if (!o.json && K == 1) {
		printf("%s under %s (%s mode), exact match per length and depth (%%)\n", task,
		       runs[0].p->name, mode);
		printf("%8s", "length");
		for (int j = 0; j < n_dep; j++)
			printf(" %6g", deps[j]);
		printf("   acc\n");
	}
	for (int i = 0; i < n_len; i++) {
		int row_ok = 0;
		if (!o.json && K == 1)
			printf("%8lld", (long long)lens[i]);
		for (int j = 0; j < n_dep; j++) {
			rt_needle_prompt np;
			int brc = o.task_niah
				? rt_needle_niah(tk, hay + hay_off, hay_len - hay_off, (int64_t)lens[i],
				                 deps[j], o.chat, &np, &err)
				: rt_needle_passkey(tk, (int64_t)lens[i], deps[j],
				                    (uint64_t)o.seed + 1000003ull * (uint64_t)lens[i] +
				                            (uint64_t)deps[j],
				                    o.chat, &np, &err);
			if (brc != 0) {
				if (!o.json && K == 1)
					putchar('\n');
				runtime_err(&err);
				goto out;
			}
			rt_needle_answer *ans = &res[((size_t)i * n_dep + j) * K];
			int frc = rt_needle_trial(all, K, K > 1 ? &b : NULL, tk, &np, &how, logits, one,
			                          ans, &err) != 0;
			rt_needle_prompt_free(&np);
			if (frc) {
				if (!o.json && K == 1)
					putchar('\n');
				runtime_err(&err);
				goto out;
			}
			if (!o.json && K == 1) {
				row_ok += res[(size_t)i * n_dep + j].correct;
				printf(" %6d", res[(size_t)i * n_dep + j].correct); /* K == 1 */
				fflush(stdout);
			}
		}
		if (!o.json && K == 1)
			printf("  %.2f\n", (double)row_ok / n_dep);
	}
	char msha[65] = "";
	if (o.json)
		file_sha256(o.model, msha);
	int failed = 0;
	for (int k = 0; k < K; k++) {
		const char *why = K > 1 ? rt_seq_batch_error(&b, k) : NULL;
		int correct = 0, total = n_len * n_dep;
		for (int q = 0; q < total; q++)
			correct += res[(size_t)q * K + k].correct;
		if (why) {
			failed++;
			fprintf(stderr, "%s: %s\n", g_prog, why); /* why names the policy */
		}
		if (!o.json) {
			if (K > 1 && !why)
				printf("%s%s ratio %g: accuracy %d/%d = %.3f\n", runs[k].p->name,
				       runs[k].o.n_sets ? " (with --set)" : "", runs[k].o.ratio, correct, total,
				       (double)correct / total);
			else if (!why)
				printf("accuracy %d/%d = %.3f\n", correct, total, (double)correct / total);
			continue;
		}
		fputc('{', stdout);
		json_policy(stdout, &runs[k].seq, runs[k].o.ratio);
		if (why) {
			fputs(",\"error\":", stdout);
			rt_json_str(stdout, why);
			fputs("}\n", stdout);
			continue;
		}
		printf(",\"task\":\"%s\",\"mode\":\"%s\",\"model\":", task, mode);
		rt_json_str(stdout, m->path);
		if (msha[0]) {
			fputs(",\"model_sha256\":", stdout);
			rt_json_str(stdout, msha);
		}
		printf(",\"batch\":%d,\"results\":[", K);
		for (int i = 0; i < n_len; i++)
			for (int j = 0; j < n_dep; j++) {
				const rt_needle_answer *nr = &res[((size_t)i * n_dep + j) * K + k];
				printf("%s{\"length\":%lld,\"depth\":%g,\"answer\":", i + j ? "," : "",
				       (long long)lens[i], deps[j]);
				rt_json_str(stdout, nr->answer);
				fputs(",\"generated\":", stdout);
				rt_json_str(stdout, nr->gen);
				printf(",\"correct\":%s,\"kv_entries_peak\":%lld,\"compress_events\":%lld}",
				       nr->correct ? "true" : "false", (long long)nr->st.kv_entries_peak,
				       (long long)nr->st.compress_events);
			}
		printf("],\"accuracy\":%.6g}\n", (double)correct / total);
	}
	rc = fflush(stdout) == 0 && !failed ? 0 : EXIT_FAILURE;
out:
	runs_free(runs, K);
	rt_seq_batch_free(&b);
	free(all);
	free(res);
	free(logits);
	free(one);
	free(hay);
	rt_model_free(m);
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	return rc;
}

/* ---- run ----------------------------------------------------------------------------------- */

static void help_run_fn(void)
{
	print_help(help_run, 3, g_prog, g_prog, default_policy_name());
}

static int cmd_run(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "prompt", required_argument, 0, 'p' },
		{ "chat", no_argument, 0, O_CHAT }, { "system", required_argument, 0, O_SYSTEM },
		{ "stats", no_argument, 0, O_STATS }, { "threads", required_argument, 0, O_THREADS }, { "exact", no_argument, 0, O_EXACT },
		{ "fast", no_argument, 0, O_FAST },
		{ "chunk", required_argument, 0, O_CHUNK }, { "policy", required_argument, 0, O_POLICY },
		{ "set", required_argument, 0, O_SET }, { "ratio", required_argument, 0, O_RATIO },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	opts o = { .n_gen = 128, .chunk = DEFAULT_CHUNK };
	int rc = parse_opts("run", help_run_fn, argc, argv, &o, lo, ":m:p:n:h", 1);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!o.prompt)
		return usage_err("run", "%s", "--prompt is required");
	if (o.system && !o.chat)
		return usage_err("run", "%s", "--system needs --chat");
	const struct kvp_policy *p = policy_from_opts("run", &o, &rc);
	if (!p)
		return rc;
	size_t bad;
	if (!rt_utf8_valid(o.prompt, strlen(o.prompt), &bad)) {
		fprintf(stderr, "%s: prompt: not valid UTF-8 at byte %zu\n", g_prog, bad);
		return EXIT_FAILURE;
	}
	set_threads(o.threads);
	rt_gguf *g = NULL;
	rt_tokenizer *tk = NULL;
	rt_model *m = NULL;
	int32_t *ids = NULL;
	float *logits = NULL;
	char *rendered = NULL;
	rt_seq s = { 0 };
	rt_err err = { "" };
	int64_t n = 0;
	rc = EXIT_FAILURE;
	if (open_model(o.model, &o, &g, &tk, &m) < 0)
		goto out;
	rt_gguf_close(g);
	g = NULL;
	const char *prompt = o.prompt;
	if (o.chat) {
		if (!(rendered = rt_chat_render(o.system, o.prompt))) {
			fprintf(stderr, "%s: prompt: out of memory rendering the chat template\n", g_prog);
			goto out;
		}
		prompt = rendered;
	}
	if (!(ids = tokenize_all(tk, "prompt", prompt, strlen(prompt), o.chat, &n)))
		goto out;
	if (n < 1) {
		fprintf(stderr, "%s: prompt: empty after tokenization\n", g_prog);
		goto out;
	}
	if (n >= m->hp.n_ctx) {
		fprintf(stderr, "%s: prompt: %lld tokens leave no room in the context_length %d\n",
		        g_prog, (long long)n, (int)m->hp.n_ctx);
		goto out;
	}
	int64_t cap = n + o.n_gen;
	if (cap > m->hp.n_ctx)
		cap = m->hp.n_ctx;
	int chunk = (int)(o.chunk < n ? o.chunk : n);
	if (rt_seq_init(&s, m, p, (int32_t)cap, chunk, n, &err) != 0 || seq_apply(&s, &o, &err) != 0 ||
	    !(logits = malloc((size_t)m->hp.n_vocab * sizeof *logits))) {
		if (!err.msg[0])
			rt_err_set(&err, "out of memory");
		runtime_err(&err);
		goto out;
	}
	double t0 = rt_now();
	if (rt_seq_feed(&s, ids, n, logits, RT_LOGITS_LAST, &err) != 0) {
		runtime_err(&err);
		goto out;
	}
	double t1 = rt_now();
	char sink[1];
	int64_t gen = rt_decode_greedy(&s, tk, logits, o.n_gen, sink, 0, stdout, &err);
	if (gen < 0) {
		putchar('\n');
		runtime_err(&err);
		goto out;
	}
	putchar('\n');
	double t2 = rt_now();
	if (o.stats) {
		rt_seq_stats st = rt_seq_stats_get(&s);
		fprintf(stderr,
		        "prompt %lld tokens (%.1f tokens/s), generated %lld tokens (%.1f tokens/s); "
		        "policy %s: KV peak %lld entries (%.2f MiB), %lld compressions\n",
		        (long long)n, (double)n / (t1 - t0), (long long)gen,
		        gen ? (double)gen / (t2 - t1) : 0.0, p->name, (long long)st.kv_entries_peak,
		        (double)st.kv_bytes_peak / (1024.0 * 1024.0), (long long)st.compress_events);
	}
	rc = fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
out:
	rt_seq_free(&s);
	free(logits);
	free(rendered);
	free(ids);
	rt_model_free(m);
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	return rc;
}

/* ---- tokenize ------------------------------------------------------------------------------ */

static void help_tokenize_fn(void)
{
	print_help(help_tokenize, 2, g_prog, g_prog);
}

static int cmd_tokenize(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "text", required_argument, 0, 't' },
		{ "special", no_argument, 0, O_SPECIAL }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	opts o = { 0 };
	int rc = parse_opts("tokenize", help_tokenize_fn, argc, argv, &o, lo, ":m:t:h", 1);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!o.text)
		return usage_err("tokenize", "%s", "--text is required");
	size_t len;
	char *text = read_text(o.text, &len);
	if (!text)
		return EXIT_FAILURE;
	rt_gguf *g = NULL;
	rt_tokenizer *tk = NULL;
	int32_t *ids = NULL;
	int64_t n = 0;
	rc = EXIT_FAILURE;
	if (open_model(o.model, &o, &g, &tk, NULL) == 0 &&
	    (ids = tokenize_all(tk, o.text, text, len, o.special, &n))) {
		for (int64_t i = 0; i < n; i++)
			printf(i ? " %d" : "%d", (int)ids[i]);
		putchar('\n');
		rc = fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
	}
	free(ids);
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	free(text);
	return rc;
}

/* ---- bench --------------------------------------------------------------------------------- */

static void help_bench_fn(void)
{
	print_help(help_bench, 2, g_prog, g_prog);
}

/* One llama-bench test on a fresh full cache: prefill `depth` tokens untimed, then time
 * either a prefill of n tokens (pp) or n single-token steps (tg). Returns tokens/s, or -1
 * after printing the error. */
static double bench_one(rt_model *m, int chunk, int depth, int n, int pp)
{
	const int32_t cap = depth + n;
	rt_kv kv;
	rt_fwd f;
	rt_err err = { "" };
	int32_t *tok = malloc((size_t)cap * sizeof *tok);
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
	unsigned sd = 12345u;
	for (int j = 0; tok && j < cap; j++) {
		sd = sd * 1103515245u + 12345u;
		tok[j] = (int32_t)((sd >> 8) % (unsigned)m->hp.n_vocab);
	}
	double tps = -1.0;
	if (!tok || !logits || rt_model_kv_init(m, &kv, cap, &err) < 0) {
		fprintf(stderr, "%s: bench: out of memory for %d entries\n", g_prog, (int)cap);
		free(tok), free(logits);
		return -1.0;
	}
	if (rt_fwd_init(&f, m, chunk, cap, &err) < 0) {
		runtime_err(&err);
		goto out;
	}
	if (depth > 0 && rt_model_forward(&f, &kv, tok, depth, 0, NULL, RT_LOGITS_NONE, &err) < 0)
		goto fail;
	double t0 = rt_now();
	if (pp) {
		if (rt_model_forward(&f, &kv, tok + depth, n, depth, logits, RT_LOGITS_LAST, &err) < 0)
			goto fail;
	} else {
		for (int j = 0; j < n; j++)
			if (rt_model_forward(&f, &kv, tok + depth + j, 1, depth + j, logits, RT_LOGITS_LAST,
			                     &err) < 0)
				goto fail;
	}
	tps = n / (rt_now() - t0);
	goto out;
fail:
	runtime_err(&err);
out:
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	free(tok), free(logits);
	return tps;
}

/* bench --pp/--tg: llama-bench's tests, one line each */
static int bench_llama(rt_model *m, const opts *o, long pp, long tg, const char *depths)
{
	double dd[MAX_LIST];
	int nd = 0;
	if (parse_list(depths, 0, INT_MAX, 1, dd, &nd))
		return usage_err("bench", "--depth: '%s' is not a comma-separated list of token counts",
		                 depths);
	for (int i = 0; i < nd; i++)
		if ((long)dd[i] + (pp > tg ? pp : tg) > m->hp.n_ctx)
			return usage_err("bench", "--depth %ld plus the test exceeds the model's context_length %d",
			                 (long)dd[i], (int)m->hp.n_ctx);
	printf("# kvrt %s path, %d threads, isa %s\n", m->exact ? "exact" : "fast",
	       m->exact ? openblas_get_num_threads() : rt_model_threads(m),
	       rt_dot_isa_name(rt_dot_isa_best()));
	if (pp > 0) {
		double t = bench_one(m, (int)(o->chunk < pp ? o->chunk : pp), 0, (int)pp, 1);
		if (t < 0)
			return EXIT_FAILURE;
		printf("pp%ld %.2f\n", pp, t);
		fflush(stdout);
	}
	for (int i = 0; tg > 0 && i < nd; i++) {
		const int d = (int)dd[i];
		double t = bench_one(m, (int)o->chunk, d, (int)tg, 0);
		if (t < 0)
			return EXIT_FAILURE;
		if (d > 0)
			printf("tg%ld@d%d %.2f\n", tg, d, t);
		else
			printf("tg%ld %.2f\n", tg, t);
		fflush(stdout);
	}
	return 0;
}

static int cmd_bench(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "ctx", required_argument, 0, O_CTX },
		{ "decode", required_argument, 0, O_DECODE }, { "chunk", required_argument, 0, O_CHUNK },
		{ "pp", required_argument, 0, O_PP }, { "tg", required_argument, 0, O_TG },
		{ "depth", required_argument, 0, O_DEPTH },
		{ "threads", required_argument, 0, O_THREADS }, { "exact", no_argument, 0, O_EXACT },
		{ "fast", no_argument, 0, O_FAST }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	opts o = { .ctx_list = "128,1024,4096", .decode = 32, .chunk = DEFAULT_CHUNK };
	int rc = parse_opts("bench", help_bench_fn, argc, argv, &o, lo, ":m:h", 1);
	if (rc)
		return rc == 1 ? 0 : rc;
	double ctxd[MAX_LIST];
	int n_ctx = 0;
	if (parse_list(o.ctx_list, 1, INT_MAX, 1, ctxd, &n_ctx))
		return usage_err("bench", "--ctx: '%s' is not a comma-separated list of token counts",
		                 o.ctx_list);
	set_threads(o.threads);
	rt_gguf *g = NULL;
	rt_model *m = NULL;
	if (open_model(o.model, &o, &g, NULL, &m) < 0) {
		rt_gguf_close(g);
		return EXIT_FAILURE;
	}
	rt_gguf_close(g);
	if (o.pp > 0 || o.tg > 0) {
		rc = bench_llama(m, &o, o.pp, o.tg, o.depths ? o.depths : "0");
		rt_model_free(m);
		return rc;
	}
	for (int i = 0; i < n_ctx; i++)
		if ((long)ctxd[i] + o.decode > m->hp.n_ctx) {
			fprintf(stderr,
			        "%s: %s: --ctx %ld plus %ld decode steps exceed the model's "
			        "context_length %d\n",
			        g_prog, o.model, (long)ctxd[i], o.decode, (int)m->hp.n_ctx);
			rt_model_free(m);
			return EXIT_USAGE;
		}
	printf("model %s: %d layers, %d/%d heads, vocab %d; %s path, %d threads, chunk %ld\n",
	       m->path, m->hp.n_layer, m->hp.n_head, m->hp.n_head_kv, m->hp.n_vocab,
	       m->exact ? "exact" : "fast", m->exact ? openblas_get_num_threads() : rt_model_threads(m),
	       o.chunk);
	printf("%9s %15s %14s %11s %15s %10s\n", "context", "prefill tok/s", "decode tok/s",
	       "prefill s", "decode ms/tok", "KV MiB");
	rc = 0;
	for (int i = 0; i < n_ctx && rc == 0; i++) {
		int L = (int)ctxd[i], D = (int)o.decode;
		int32_t cap = L + D;
		rt_kv kv;
		rt_fwd f;
		rt_err err = { "" };
		int32_t *tok = malloc((size_t)cap * sizeof *tok);
		float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
		unsigned sd = 12345u;
		for (int j = 0; tok && j < cap; j++) {
			sd = sd * 1103515245u + 12345u;
			tok[j] = (int32_t)((sd >> 8) % (unsigned)m->hp.n_vocab);
		}
		int chunk = (int)(o.chunk < L ? o.chunk : L);
		if (!tok || !logits || rt_model_kv_init(m, &kv, cap, &err) < 0) {
			fprintf(stderr, "%s: bench: out of memory at context %d\n", g_prog, L);
			free(tok), free(logits);
			rc = EXIT_FAILURE;
			break;
		}
		if (rt_fwd_init(&f, m, chunk, cap, &err) < 0) {
			runtime_err(&err);
			rt_kv_free(&kv);
			free(tok), free(logits);
			rc = EXIT_FAILURE;
			break;
		}
		double t0 = rt_now();
		rc = rt_model_forward(&f, &kv, tok, L, 0, logits, RT_LOGITS_LAST, &err);
		double t1 = rt_now();
		for (int j = 0; j < D && rc == 0; j++)
			rc = rt_model_forward(&f, &kv, tok + L + j, 1, L + j, logits, RT_LOGITS_LAST, &err);
		double t2 = rt_now();
		if (rc) {
			runtime_err(&err);
			rc = EXIT_FAILURE;
		} else {
			printf("%9d %15.1f %14.1f %11.2f %15.2f %10.1f\n", L, L / (t1 - t0), D / (t2 - t1),
			       t1 - t0, 1000.0 * (t2 - t1) / D,
			       (double)rt_kv_bytes_used(&kv) / (1024.0 * 1024.0));
			fflush(stdout);
		}
		rt_fwd_free(&f);
		rt_kv_free(&kv);
		free(tok), free(logits);
	}
	rt_model_free(m);
	return rc;
}

/* ---- keepmap ------------------------------------------------------------------------------ */

static void help_keepmap_fn(void)
{
	print_help(help_keepmap, 4, g_prog, g_prog, default_policy_name(), g_prog);
}

static int cmd_keepmap(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "text", required_argument, 0, 't' },
		{ "ctx", required_argument, 0, O_CTX }, { "chunk", required_argument, 0, O_CHUNK },
		{ "threads", required_argument, 0, O_THREADS }, { "exact", no_argument, 0, O_EXACT },
		{ "fast", no_argument, 0, O_FAST },
		{ "policy", required_argument, 0, O_POLICY }, { "set", required_argument, 0, O_SET },
		{ "ratio", required_argument, 0, O_RATIO },
		{ "prompt", required_argument, 0, O_PROMPTLEN }, { "svg", required_argument, 0, O_SVG },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	opts o = { .chunk = DEFAULT_CHUNK, .prompt_len = -1, .exact = 1 };
	int rc = parse_opts("keepmap", help_keepmap_fn, argc, argv, &o, lo, ":m:t:h", 1);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!o.text)
		return usage_err("keepmap", "%s", "--text is required");
	if (!o.svg)
		return usage_err("keepmap", "%s", "--svg is required");
	const struct kvp_policy *p = policy_from_opts("keepmap", &o, &rc);
	if (!p)
		return rc;
	set_threads(o.threads);
	size_t len;
	char *text = read_text(o.text, &len);
	if (!text)
		return EXIT_FAILURE;
	rt_tokenizer *tk = NULL;
	rt_model *m = NULL;
	int32_t *ids = NULL;
	rt_keepmap_head *heads = NULL;
	rt_seq s = { 0 };
	rt_err err = { "" };
	int64_t n = 0;
	rc = EXIT_FAILURE;
	int64_t use;
	if (open_text_model(&o, text, len, &tk, &m, &ids, &n, &use, &rc) < 0)
		goto out;
	if (use < 1) {
		fprintf(stderr, "%s: %s: text has no tokens\n", g_prog, o.text);
		goto out;
	}
	int block = (int)(o.chunk < use ? o.chunk : use);
	int64_t prompt_len = o.prompt_len >= 0 ? o.prompt_len : use;
	if (rt_seq_init(&s, m, p, (int32_t)use, block, prompt_len, &err) != 0 ||
	    seq_apply(&s, &o, &err) != 0 || rt_seq_feed(&s, ids, use, NULL, RT_LOGITS_NONE, &err) != 0) {
		runtime_err(&err);
		goto out;
	}
	rt_seq_stats st = rt_seq_stats_get(&s);
	if (st.compress_events == 0 && p->compress)
		fprintf(stderr, "%s: note: policy %s never compressed on these %lld tokens (its budget "
		        "or trigger was not reached)\n", g_prog, p->name, (long long)use);
	const int nh = s.kv.n_layer * s.kv.n_kv_head;
	if (!(heads = calloc((size_t)nh, sizeof *heads))) {
		fprintf(stderr, "%s: out of memory\n", g_prog);
		goto out;
	}
	for (int i = 0; i < nh; i++) {
		heads[i].pos = s.kv.heads[i].pos;
		heads[i].count = s.kv.heads[i].count;
		heads[i].n = s.kv.heads[i].n;
	}
	char params[1024] = "";
	size_t used = 0;
	for (int i = 0; i < p->n_params && used < sizeof params - 1; i++) {
		int w = snprintf(params + used, sizeof params - used, "%s%s=%g", i ? " " : "",
		                 p->params[i].name, s.run.params[i]);
		if (w < 0)
			break;
		used += (size_t)w;
	}
	rt_keepmap km = { .n_layer = s.kv.n_layer, .n_kv_head = s.kv.n_kv_head, .n_tokens = use,
		          .heads = heads, .policy = p->name, .params = params, .ratio = o.ratio };
	if (rt_keepmap_write(o.svg, &km, &err) != 0) {
		runtime_err(&err);
		goto out;
	}
	rt_keepmap_summary sm;
	rt_keepmap_summarize(&km, &sm);
	printf("keepmap %s: policy %s, %lld tokens, %d x %d heads: kept %lld entries, mean %.1f per "
	       "head (%.1f%%), min %d, max %d, %lld merged, %lld compressions\n", o.svg, p->name,
	       (long long)use, km.n_layer, km.n_kv_head, (long long)sm.entries, sm.mean_per_head,
	       100.0 * sm.mean_per_head / (double)use, (int)sm.min_per_head, (int)sm.max_per_head,
	       (long long)sm.merged, (long long)st.compress_events);
	rc = fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
out:
	rt_seq_free(&s);
	free(heads);
	free(ids);
	rt_model_free(m);
	rt_tokenizer_free(tk);
	free(text);
	return rc;
}

/* ---- entry --------------------------------------------------------------------------------- */

int rt_cli_main(int argc, char **argv, const struct kvp_policy *const *reg, int n_reg)
{
	g_prog = "kvrt";
	if (argc > 0 && argv[0] && *argv[0]) {
		const char *b = strrchr(argv[0], '/');
		g_prog = b ? b + 1 : argv[0];
	}
	g_reg = reg;
	g_n_reg = reg ? n_reg : 0;
	if (argc < 2)
		return usage_err("", "%s", "missing command (info, ppl, needle, run, tokenize, bench, keepmap, serve)");
	const char *cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		print_help(help_top, 11, g_prog, g_prog, g_prog, g_prog, g_prog, g_prog, g_prog, g_prog,
		           g_prog, g_prog, g_prog);
		return 0;
	}
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {
		{ "info", cmd_info }, { "ppl", cmd_ppl }, { "needle", cmd_needle }, { "run", cmd_run },
		{ "tokenize", cmd_tokenize }, { "bench", cmd_bench }, { "keepmap", cmd_keepmap },
	};
	const char *device;
	const int cargc = rt_cli_device_take(argc - 1, argv + 1, &device);
	if (cargc < 0)
		return usage_err(cmd, "%s", "--device needs a value (cpu or cuda)");
	if (!strcmp(device, "cuda"))
		return rt_cli_cuda_run(g_prog, cargc, argv + 1, reg, g_n_reg);
	if (strcmp(device, "cpu") != 0)
		return usage_err(cmd, "--device: '%s' is not cpu or cuda", device);
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		if (!strcmp(cmd, cmds[i].name))
			return cmds[i].fn(cargc, argv + 1);
	if (!strcmp(cmd, "serve"))
		return rt_cli_serve(cargc, argv + 1, g_prog, g_reg, g_n_reg);
	return usage_err("", "unknown command '%s'", cmd);
}
