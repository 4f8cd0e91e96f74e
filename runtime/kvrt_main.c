/*
 * kvrt: the command-line front end of libkvrt. It tokenizes text with a model's own
 * tokenizer, measures perplexity with the full KV cache (the baseline every compression
 * policy is compared against), generates text greedily (optionally through the ChatML
 * template), and benchmarks prefill/decode speed. Exit status: 0 success, 1 runtime error
 * (unreadable or invalid file, model error), 2 usage error (bad command line). Errors are
 * one line on stderr: "kvrt: PATH: reason".
 */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_eval.h"
#include "rt_gguf.h"
#include "rt_model.h"
#include "rt_tokenizer.h"
#include "rt_util.h"

#define EXIT_USAGE 2
#define DEFAULT_CHUNK 512

static const char *const help_top =
	"NAME\n"
	"    kvrt - run, evaluate and benchmark a GGUF llama model with libkvrt\n"
	"\n"
	"SYNOPSIS\n"
	"    kvrt tokenize --model MODEL --text FILE\n"
	"    kvrt ppl --model MODEL --text FILE [--ctx N] [--chunk N] [--json] [--dump FILE]\n"
	"    kvrt run --model MODEL --prompt TEXT [-n N] [--chat]\n"
	"    kvrt bench --model MODEL [--ctx N,N,...]\n"
	"    kvrt COMMAND --help\n"
	"\n"
	"DESCRIPTION\n"
	"    kvrt drives the kvpc transformer runtime on a Llama-architecture model stored\n"
	"    as GGUF (for example SmolLM2-135M-Instruct, Q4_1). Weights are dequantised to\n"
	"    f32 at load time and the forward pass is computed exactly in f32 with OpenBLAS,\n"
	"    over a KV cache that keeps one entry list per (layer, KV head).\n"
	"\n"
	"COMMANDS\n"
	"    tokenize  print the token ids of a text file\n"
	"    ppl       perplexity of a text under the full KV cache\n"
	"    run       greedy generation from a prompt, streamed to standard output\n"
	"    bench     prefill and decode speed at several context lengths\n"
	"\n"
	"OPTIONS\n"
	"    -h, --help     show this text (or a command's, after the command)\n"
	"\n"
	"ENVIRONMENT\n"
	"    OPENBLAS_NUM_THREADS  BLAS threads (default: all cores); --threads overrides\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error (file, model or text problem), 2 usage error.\n"
	"    Errors are one line on standard error: \"kvrt: PATH: reason\".\n"
	"\n"
	"EXAMPLES\n"
	"    kvrt ppl --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\\n"
	"             --text /usr/share/common-licenses/GPL-3 --ctx 2048\n"
	"    kvrt run --model models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \\\n"
	"             --prompt 'What is the capital of France?' -n 64\n";

static const char *const help_tokenize =
	"NAME\n"
	"    kvrt tokenize - print the token ids of a text\n"
	"\n"
	"SYNOPSIS\n"
	"    kvrt tokenize --model MODEL --text FILE [--special]\n"
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

static const char *const help_ppl =
	"NAME\n"
	"    kvrt ppl - perplexity of a text under the full KV cache\n"
	"\n"
	"SYNOPSIS\n"
	"    kvrt ppl --model MODEL --text FILE [--ctx N] [--chunk N] [--threads N]\n"
	"             [--json] [--dump FILE]\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes FILE, keeps its first N tokens and scores each token from the ones\n"
	"    before it (teacher forcing): NLL_i = -log p(t[i+1] | t[0..i]) for i = 0..N-2,\n"
	"    ppl = exp(mean NLL), in nats, with log-sum-exp in double precision. The text is\n"
	"    fed through the model in chunks (chunked prefill); every token is kept in the\n"
	"    cache (policy \"full\"), so this is the exact baseline for KV compression.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    -t, --text FILE    the text; must be valid UTF-8\n"
	"    --ctx N            score the first N tokens (default: the whole text, up to the\n"
	"                       model's context_length); N above context_length is an error;\n"
	"                       a shorter text is scored whole\n"
	"    --chunk N          tokens per forward chunk (default 512); the result does not\n"
	"                       depend on it beyond float rounding\n"
	"    --threads N        BLAS threads (default: OPENBLAS_NUM_THREADS or all cores)\n"
	"    --json             print one JSON object instead of the table: policy, model,\n"
	"                       model_sha256, text, tokens, scored, ppl, nll_mean, top1_acc,\n"
	"                       seconds, tokens_per_s, kv_entries_peak, kv_bytes_peak,\n"
	"                       threads, chunk\n"
	"    --dump FILE        write one JSON line per scored token to FILE:\n"
	"                       {\"pos\":P,\"token\":T,\"logprob\":L,\"top1\":A}\n"
	"                       P = position of the scored token (1..N-1), T its id,\n"
	"                       L = natural-log probability, A = the model's argmax\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error (including --ctx beyond the model's\n"
	"    context_length).\n"
	"\n"
	"EXAMPLE\n"
	"    kvrt ppl --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\\n"
	"             --text /usr/share/common-licenses/GPL-3 --ctx 2048 --json\n";

static const char *const help_run =
	"NAME\n"
	"    kvrt run - greedy generation from a prompt\n"
	"\n"
	"SYNOPSIS\n"
	"    kvrt run --model MODEL --prompt TEXT [-n N] [--chat] [--system TEXT] [--stats]\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes TEXT, prefills it, then repeatedly appends the most likely next token\n"
	"    (greedy decoding, lowest id on ties), writing each token's bytes to standard\n"
	"    output as soon as it is produced. Generation stops after N tokens, at an\n"
	"    end-of-generation token (<|endoftext|>, <|im_end|>, the model's EOS), or at the\n"
	"    model's context_length.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    -p, --prompt TEXT  the prompt (UTF-8)\n"
	"    -n N               tokens to generate at most (default 128)\n"
	"    --chat             wrap the prompt in the model's ChatML template (system\n"
	"                       message, user turn, assistant header); control tokens in\n"
	"                       the rendered prompt are parsed as such\n"
	"    --system TEXT      system message for --chat (default: the template's)\n"
	"    --stats            print prompt/generated token counts and speed on stderr\n"
	"    --chunk N          prompt prefill chunk (default 512)\n"
	"    --threads N        BLAS threads\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n";

static const char *const help_bench =
	"NAME\n"
	"    kvrt bench - prefill and decode speed\n"
	"\n"
	"SYNOPSIS\n"
	"    kvrt bench --model MODEL [--ctx N,N,...] [--decode N] [--chunk N] [--threads N]\n"
	"\n"
	"DESCRIPTION\n"
	"    For each context length L: prefills L synthetic tokens into an empty full cache\n"
	"    (chunked, logits for the last token only) and reports prefill tokens/s; then\n"
	"    feeds --decode single tokens (each with its logits, as generation does) and\n"
	"    reports decode tokens/s at that depth. A benchmark, not a test: figures depend\n"
	"    on the machine and the BLAS thread count.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    --ctx LIST         comma-separated context lengths (default 128,1024,4096)\n"
	"    --decode N         decode steps after each prefill (default 32)\n"
	"    --chunk N          prefill chunk (default 512)\n"
	"    --threads N        BLAS threads\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n";

static int usage_err(const char *cmd, const char *fmt, const char *arg)
{
	fputs("kvrt: ", stderr);
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nTry 'kvrt %s--help' for more information.\n", cmd);
	return EXIT_USAGE;
}

static int runtime_err(const rt_err *err)
{
	fprintf(stderr, "kvrt: %s\n", err->msg);
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

/* Common option values. */
typedef struct opts {
	const char *model, *text, *prompt, *system, *dump, *logits, *ctx_list;
	long ctx, chunk, n_gen, threads, decode;
	int json, chat, special, stats;
} opts;

enum { O_CTX = 256, O_CHUNK, O_JSON, O_DUMP, O_LOGITS, O_CHAT, O_SYSTEM, O_SPECIAL, O_STATS,
       O_THREADS, O_DECODE };

/* Parse argv (argv[0] is the command name) with the command's long options lo and short
 * options so into o, checking every numeric value. --ctx is one count, or for `bench`
 * (whose o->ctx_list is preset) a list kept as text. Returns 0, 1 after printing help,
 * or EXIT_USAGE after printing the error. */
static int parse_opts(const char *cmd, const char *help, int argc, char **argv, opts *o,
                      const struct option *lo, const char *so)
{
	char cmdsp[32];
	snprintf(cmdsp, sizeof cmdsp, "%s ", cmd);
	optind = 1;
	opterr = 0;
	int c, idx;
	while ((c = getopt_long(argc, argv, so, lo, &idx)) != -1) {
		long v;
		switch (c) {
		case 'h':
			fputs(help, stdout);
			return 1;
		case 'm': o->model = optarg; break;
		case 't': o->text = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'n':
			if (parse_int(optarg, 0, INT_MAX, &v))
				return usage_err(cmdsp, "-n: '%s' is not a token count", optarg);
			o->n_gen = v;
			break;
		case O_CTX:
			if (o->ctx_list) {
				o->ctx_list = optarg;
				break;
			}
			if (parse_int(optarg, 2, INT_MAX, &v))
				return usage_err(cmdsp, "--ctx: '%s' is not a token count >= 2", optarg);
			o->ctx = v;
			break;
		case O_CHUNK:
			if (parse_int(optarg, 1, 65536, &v))
				return usage_err(cmdsp, "--chunk: '%s' is not a number in 1..65536", optarg);
			o->chunk = v;
			break;
		case O_THREADS:
			if (parse_int(optarg, 1, 1024, &v))
				return usage_err(cmdsp, "--threads: '%s' is not a number in 1..1024", optarg);
			o->threads = v;
			break;
		case O_DECODE:
			if (parse_int(optarg, 1, 1 << 20, &v))
				return usage_err(cmdsp, "--decode: '%s' is not a positive count", optarg);
			o->decode = v;
			break;
		case O_JSON: o->json = 1; break;
		case O_DUMP: o->dump = optarg; break;
		case O_LOGITS: o->logits = optarg; break;
		case O_CHAT: o->chat = 1; break;
		case O_SYSTEM: o->system = optarg; break;
		case O_SPECIAL: o->special = 1; break;
		case O_STATS: o->stats = 1; break;
		case ':':
			return usage_err(cmdsp, "option '%s' needs a value", argv[optind - 1]);
		default:
			return usage_err(cmdsp, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_err(cmdsp, "unexpected argument '%s'", argv[optind]);
	if (!o->model)
		return usage_err(cmdsp, "%s", "--model is required");
	return 0;
}

/* Read a text file and check it is UTF-8. Returns NULL after printing the error. */
static char *read_text(const char *path, size_t *len)
{
	rt_err err = {0};
	char *s = rt_read_file(path, len, &err);
	if (!s) {
		runtime_err(&err);
		return NULL;
	}
	size_t bad;
	if (!rt_utf8_valid(s, *len, &bad)) {
		fprintf(stderr, "kvrt: %s: not valid UTF-8 at byte %zu\n", path, bad);
		free(s);
		return NULL;
	}
	return s;
}

/* Tokenize len bytes into a heap array; *n receives the count. NULL after printing. */
static int32_t *tokenize_all(const rt_tokenizer *tk, const char *what, const char *s, size_t len,
                             int special, int64_t *n)
{
	rt_err err = {0};
	int64_t cnt = rt_tokenize(tk, s, len, special, NULL, 0, &err);
	if (cnt < 0) {
		fprintf(stderr, "kvrt: %s: %s\n", what, err.msg);
		return NULL;
	}
	int32_t *ids = malloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
	if (!ids) {
		fprintf(stderr, "kvrt: %s: out of memory for %lld tokens\n", what, (long long)cnt);
		return NULL;
	}
	if (rt_tokenize(tk, s, len, special, ids, cnt, &err) != cnt) {
		fprintf(stderr, "kvrt: %s: %s\n", what, err.msg[0] ? err.msg : "tokenizer count changed");
		free(ids);
		return NULL;
	}
	*n = cnt;
	return ids;
}

/* Open the GGUF and build what a command needs. Prints errors; returns -1 on failure. */
static int open_model(const char *path, rt_gguf **g, rt_tokenizer **tk, rt_model **m)
{
	rt_err err = {0};
	*g = rt_gguf_open(path, &err);
	if (!*g)
		return runtime_err(&err), -1;
	if (tk && !(*tk = rt_tokenizer_init(*g, &err)))
		return runtime_err(&err), -1;
	if (m && !(*m = rt_model_load_gguf(*g, &err)))
		return runtime_err(&err), -1;
	return 0;
}

static void set_threads(long t)
{
	if (t > 0)
		openblas_set_num_threads((int)t);
}

/* ---- SHA-256 (FIPS 180-4) of the model file, for the --json record -------------------- */

typedef struct sha256 {
	uint32_t h[8];
	uint8_t buf[64];
	uint64_t len;   /* bytes hashed */
} sha256;

static const uint32_t sha256_k[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(sha256 *c, const uint8_t *p)
{
	uint32_t w[64], a[8];
	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ROR32(w[i - 15], 7) ^ ROR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ROR32(w[i - 2], 17) ^ ROR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	memcpy(a, c->h, sizeof a);
	for (int i = 0; i < 64; i++) {
		uint32_t S1 = ROR32(a[4], 6) ^ ROR32(a[4], 11) ^ ROR32(a[4], 25);
		uint32_t ch = (a[4] & a[5]) ^ (~a[4] & a[6]);
		uint32_t t1 = a[7] + S1 + ch + sha256_k[i] + w[i];
		uint32_t S0 = ROR32(a[0], 2) ^ ROR32(a[0], 13) ^ ROR32(a[0], 22);
		uint32_t maj = (a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]);
		memmove(a + 1, a, 7 * sizeof a[0]);
		a[4] += t1;
		a[0] = t1 + S0 + maj;
	}
	for (int i = 0; i < 8; i++)
		c->h[i] += a[i];
}

static void sha256_init(sha256 *c)
{
	static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
		                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	memcpy(c->h, h0, sizeof h0);
	c->len = 0;
}

static void sha256_update(sha256 *c, const uint8_t *p, size_t n)
{
	size_t have = (size_t)(c->len % 64);
	c->len += n;
	if (have) {
		size_t take = 64 - have < n ? 64 - have : n;
		memcpy(c->buf + have, p, take);
		p += take, n -= take;
		if (have + take < 64)
			return;
		sha256_block(c, c->buf);
	}
	for (; n >= 64; p += 64, n -= 64)
		sha256_block(c, p);
	memcpy(c->buf, p, n);
}

static void sha256_hex(sha256 *c, char out[65])
{
	uint64_t bits = c->len * 8;
	uint8_t pad[72] = { 0x80 };
	size_t padn = (size_t)((c->len % 64) < 56 ? 56 - c->len % 64 : 120 - c->len % 64);
	for (int i = 0; i < 8; i++)
		pad[padn + i] = (uint8_t)(bits >> (56 - 8 * i));
	sha256_update(c, pad, padn + 8);
	for (int i = 0; i < 8; i++)
		snprintf(out + 8 * i, 9, "%08x", c->h[i]);
}

/* Hex SHA-256 of a file into out[65]; 0, or -1 (out = "") when it cannot be read. */
static int file_sha256(const char *path, char out[65])
{
	out[0] = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	static uint8_t buf[1 << 20];
	sha256 c;
	sha256_init(&c);
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		sha256_update(&c, buf, n);
	int bad = ferror(f);
	fclose(f);
	if (bad)
		return -1;
	sha256_hex(&c, out);
	return 0;
}

/* ---- commands -------------------------------------------------------------------------- */

static int cmd_tokenize(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "text", required_argument, 0, 't' },
		{ "special", no_argument, 0, O_SPECIAL }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	opts o = {0};
	int rc = parse_opts("tokenize", help_tokenize, argc, argv, &o, lo, ":m:t:h");
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!o.text)
		return usage_err("tokenize ", "%s", "--text is required");
	size_t len;
	char *text = read_text(o.text, &len);
	if (!text)
		return EXIT_FAILURE;
	rt_gguf *g = NULL;
	rt_tokenizer *tk = NULL;
	int32_t *ids = NULL;
	int64_t n = 0;
	rc = EXIT_FAILURE;
	if (open_model(o.model, &g, &tk, NULL) == 0 &&
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

static int cmd_ppl(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "text", required_argument, 0, 't' },
		{ "ctx", required_argument, 0, O_CTX }, { "chunk", required_argument, 0, O_CHUNK },
		{ "json", no_argument, 0, O_JSON }, { "dump", required_argument, 0, O_DUMP },
		{ "logits", required_argument, 0, O_LOGITS },
		{ "threads", required_argument, 0, O_THREADS }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	opts o = { .chunk = DEFAULT_CHUNK };
	int rc = parse_opts("ppl", help_ppl, argc, argv, &o, lo, ":m:t:h");
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!o.text)
		return usage_err("ppl ", "%s", "--text is required");
	set_threads(o.threads);
	size_t len;
	char *text = read_text(o.text, &len);
	if (!text)
		return EXIT_FAILURE;
	rt_gguf *g = NULL;
	rt_tokenizer *tk = NULL;
	rt_model *m = NULL;
	int32_t *ids = NULL;
	FILE *dump = NULL, *lg = NULL;
	int64_t n = 0;
	rc = EXIT_FAILURE;
	if (open_model(o.model, &g, &tk, &m) < 0)
		goto out;
	rt_gguf_close(g);
	g = NULL;
	if (o.ctx > m->hp.n_ctx) {
		fprintf(stderr, "kvrt: %s: --ctx %ld exceeds the model's context_length %d\n", o.model,
		        o.ctx, (int)m->hp.n_ctx);
		rc = EXIT_USAGE;
		goto out;
	}
	if (!(ids = tokenize_all(tk, o.text, text, len, 0, &n)))
		goto out;
	int64_t use = o.ctx ? o.ctx : m->hp.n_ctx;
	if (use > n)
		use = n;
	if (use < 2) {
		fprintf(stderr, "kvrt: %s: text has %lld token%s; perplexity needs at least 2\n", o.text,
		        (long long)n, n == 1 ? "" : "s");
		goto out;
	}
	if (o.dump && !(dump = fopen(o.dump, "w"))) {
		fprintf(stderr, "kvrt: %s: %s\n", o.dump, strerror(errno));
		goto out;
	}
	if (o.logits && !(lg = fopen(o.logits, "wb"))) {
		fprintf(stderr, "kvrt: %s: %s\n", o.logits, strerror(errno));
		goto out;
	}
	rt_ppl_opts po = { .chunk = (int)o.chunk, .dump = dump, .logits = lg };
	rt_ppl_result r;
	rt_err err = {0};
	if (rt_eval_ppl(m, ids, use, &po, NULL, NULL, &r, &err) < 0) {
		runtime_err(&err);
		goto out;
	}
	if (dump && fclose(dump) != 0) {
		dump = NULL;
		fprintf(stderr, "kvrt: %s: write failed\n", o.dump);
		goto out;
	}
	dump = NULL;
	if (lg && fclose(lg) != 0) {
		lg = NULL;
		fprintf(stderr, "kvrt: %s: write failed\n", o.logits);
		goto out;
	}
	lg = NULL;
	int threads = openblas_get_num_threads();
	if (o.json) {
		char sha[65];
		file_sha256(o.model, sha); /* omitted from the record when unreadable */
		rt_eval_json(stdout, m, sha, o.text, "full", &r, threads, (int)o.chunk);
	} else {
		printf("model        %s\n", m->path);
		printf("text         %s (%lld tokens, first %lld scored)\n", o.text, (long long)n,
		       (long long)use);
		printf("policy       full\n");
		printf("tokens       %lld (%lld scored)\n", (long long)r.tokens, (long long)r.scored);
		printf("ppl          %.4f\n", r.ppl);
		printf("nll_mean     %.6f nats/token\n", r.nll_mean);
		printf("top1_acc     %.4f\n", (double)r.top1_hits / (double)r.scored);
		printf("speed        %.1f tokens/s (%.2f s, %d threads, chunk %ld)\n", r.tokens_per_s,
		       r.seconds, threads, o.chunk);
		printf("kv peak      %lld entries, %.2f MiB\n", (long long)r.kv_entries_peak,
		       (double)r.kv_bytes_peak / (1024.0 * 1024.0));
	}
	rc = fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
out:
	if (dump)
		fclose(dump);
	if (lg)
		fclose(lg);
	free(ids);
	rt_model_free(m);
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	free(text);
	return rc;
}

/* argmax, lowest id on ties */
static int32_t argmax(const float *v, int n)
{
	int32_t b = 0;
	for (int i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return b;
}

static int cmd_run(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "prompt", required_argument, 0, 'p' },
		{ "chat", no_argument, 0, O_CHAT }, { "system", required_argument, 0, O_SYSTEM },
		{ "stats", no_argument, 0, O_STATS }, { "threads", required_argument, 0, O_THREADS },
		{ "chunk", required_argument, 0, O_CHUNK }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	opts o = { .n_gen = 128, .chunk = DEFAULT_CHUNK };
	int rc = parse_opts("run", help_run, argc, argv, &o, lo, ":m:p:n:h");
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!o.prompt)
		return usage_err("run ", "%s", "--prompt is required");
	if (o.system && !o.chat)
		return usage_err("run ", "%s", "--system needs --chat");
	size_t bad;
	if (!rt_utf8_valid(o.prompt, strlen(o.prompt), &bad)) {
		fprintf(stderr, "kvrt: prompt: not valid UTF-8 at byte %zu\n", bad);
		return EXIT_FAILURE;
	}
	set_threads(o.threads);
	rt_gguf *g = NULL;
	rt_tokenizer *tk = NULL;
	rt_model *m = NULL;
	int32_t *ids = NULL;
	float *logits = NULL;
	char *rendered = NULL;
	rt_kv kv = {0};
	rt_fwd f = {0};
	rt_err err = {0};
	int64_t n = 0;
	rc = EXIT_FAILURE;
	if (open_model(o.model, &g, &tk, &m) < 0)
		goto out;
	rt_gguf_close(g);
	g = NULL;
	const char *prompt = o.prompt;
	if (o.chat) {
		rendered = rt_chat_render(o.system, o.prompt);
		if (!rendered) {
			fprintf(stderr, "kvrt: prompt: out of memory rendering the chat template\n");
			goto out;
		}
		prompt = rendered;
	}
	if (!(ids = tokenize_all(tk, "prompt", prompt, strlen(prompt), o.chat, &n)))
		goto out;
	if (n < 1) {
		fprintf(stderr, "kvrt: prompt: empty after tokenization\n");
		goto out;
	}
	if (n >= m->hp.n_ctx) {
		fprintf(stderr, "kvrt: prompt: %lld tokens leave no room in the context_length %d\n",
		        (long long)n, (int)m->hp.n_ctx);
		goto out;
	}
	int64_t cap = n + o.n_gen;
	if (cap > m->hp.n_ctx)
		cap = m->hp.n_ctx;
	int chunk = (int)(o.chunk < n ? o.chunk : n);
	logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
	if (!logits || rt_model_kv_init(m, &kv, (int32_t)cap, &err) < 0 ||
	    rt_fwd_init(&f, m, chunk, (int32_t)cap, &err) < 0) {
		if (!err.msg[0])
			rt_err_set(&err, "out of memory");
		runtime_err(&err);
		goto out;
	}
	double t0 = rt_now();
	if (rt_model_forward(&f, &kv, ids, (int)n, 0, logits, RT_LOGITS_LAST, &err) < 0) {
		runtime_err(&err);
		goto out;
	}
	double t1 = rt_now();
	int64_t gen = 0;
	char buf[256];
	for (int64_t pos = n; gen < o.n_gen; pos++) {
		int32_t t = argmax(logits, m->hp.n_vocab);
		if (rt_tokenizer_is_eog(tk, t))
			break;
		int nb = rt_token_to_bytes(tk, t, buf, (int)sizeof buf);
		if (nb > 0)
			fwrite(buf, 1, (size_t)(nb < (int)sizeof buf ? nb : (int)sizeof buf), stdout);
		fflush(stdout);
		gen++;
		if (gen >= o.n_gen || pos >= cap) /* done, or no room to feed it back */
			break;
		if (rt_model_forward(&f, &kv, &t, 1, (int32_t)pos, logits, RT_LOGITS_LAST, &err) < 0) {
			runtime_err(&err);
			goto out;
		}
	}
	putchar('\n');
	double t2 = rt_now();
	if (o.stats)
		fprintf(stderr, "prompt %lld tokens (%.1f tokens/s), generated %lld tokens (%.1f tokens/s)\n",
		        (long long)n, (double)n / (t1 - t0), (long long)gen,
		        gen ? (double)gen / (t2 - t1) : 0.0);
	rc = fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
out:
	rt_fwd_free(&f);
	rt_kv_free(&kv);
	free(logits);
	free(rendered);
	free(ids);
	rt_model_free(m);
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	return rc;
}

static int cmd_bench(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "ctx", required_argument, 0, O_CTX },
		{ "decode", required_argument, 0, O_DECODE }, { "chunk", required_argument, 0, O_CHUNK },
		{ "threads", required_argument, 0, O_THREADS }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	opts o = { .ctx_list = "128,1024,4096", .decode = 32, .chunk = DEFAULT_CHUNK };
	int rc = parse_opts("bench", help_bench, argc, argv, &o, lo, ":m:h");
	if (rc)
		return rc == 1 ? 0 : rc;
	long ctxs[32];
	int n_ctx = 0;
	for (const char *p = o.ctx_list;;) {
		char item[32];
		size_t len = strcspn(p, ",");
		if (n_ctx == 32)
			return usage_err("bench ", "--ctx: more than 32 lengths in '%s'", o.ctx_list);
		if (len == 0 || len >= sizeof item)
			return usage_err("bench ", "--ctx: '%s' is not a comma-separated list of token counts",
			                 o.ctx_list);
		memcpy(item, p, len);
		item[len] = 0;
		if (parse_int(item, 1, INT_MAX, &ctxs[n_ctx]))
			return usage_err("bench ", "--ctx: '%s' is not a comma-separated list of token counts",
			                 o.ctx_list);
		n_ctx++;
		if (!p[len])
			break;
		p += len + 1;
	}
	set_threads(o.threads);
	rt_gguf *g = NULL;
	rt_model *m = NULL;
	if (open_model(o.model, &g, NULL, &m) < 0) {
		rt_gguf_close(g);
		return EXIT_FAILURE;
	}
	rt_gguf_close(g);
	for (int i = 0; i < n_ctx; i++)
		if (ctxs[i] + o.decode > m->hp.n_ctx) {
			fprintf(stderr,
			        "kvrt: %s: --ctx %ld plus %ld decode steps exceed the model's "
			        "context_length %d\n",
			        o.model, ctxs[i], o.decode, (int)m->hp.n_ctx);
			rt_model_free(m);
			return EXIT_USAGE;
		}
	printf("model %s: %d layers, %d/%d heads, vocab %d; %d BLAS threads, chunk %ld\n",
	       m->path, m->hp.n_layer, m->hp.n_head, m->hp.n_head_kv, m->hp.n_vocab,
	       openblas_get_num_threads(), o.chunk);
	printf("%9s %15s %14s %11s %15s %10s\n", "context", "prefill tok/s", "decode tok/s",
	       "prefill s", "decode ms/tok", "KV MiB");
	rc = 0;
	for (int i = 0; i < n_ctx && rc == 0; i++) {
		int L = (int)ctxs[i], D = (int)o.decode;
		int32_t cap = L + D;
		rt_kv kv;
		rt_fwd f;
		rt_err err = {0};
		int32_t *tok = malloc((size_t)cap * sizeof *tok);
		float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
		unsigned s = 12345u;
		for (int j = 0; tok && j < cap; j++) {
			s = s * 1103515245u + 12345u;
			tok[j] = (int32_t)((s >> 8) % (unsigned)m->hp.n_vocab);
		}
		int chunk = (int)(o.chunk < L ? o.chunk : L);
		if (!tok || !logits || rt_model_kv_init(m, &kv, cap, &err) < 0) {
			fprintf(stderr, "kvrt: bench: out of memory at context %d\n", L);
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

int main(int argc, char **argv)
{
	rt_model_blas_setup(argv);
	if (argc < 2)
		return usage_err("", "%s", "missing command (tokenize, ppl, run, bench)");
	const char *cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		fputs(help_top, stdout);
		return 0;
	}
	if (!strcmp(cmd, "tokenize"))
		return cmd_tokenize(argc - 1, argv + 1);
	if (!strcmp(cmd, "ppl"))
		return cmd_ppl(argc - 1, argv + 1);
	if (!strcmp(cmd, "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(cmd, "bench"))
		return cmd_bench(argc - 1, argv + 1);
	return usage_err("", "unknown command '%s'", cmd);
}
