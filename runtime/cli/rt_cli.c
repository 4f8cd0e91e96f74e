/*
 * rt_cli: the command line's dispatch (see rt_cli.h): the top-level help and the command
 * table; the commands are runtime/cli/rt_cmd_*.c over the shared option table of
 * rt_cli_opts.
 */
#include "cli/rt_cli.h"

#include <stdio.h>
#include <string.h>

#include "cli/rt_cli_meta.h"
#include "cli/rt_cli_opts.h"
#include "cli/rt_cmd.h"

static const char *const help_top =
	"NAME\n"
	"    {prog} - run, evaluate and benchmark a GGUF llama model under KV-cache policies\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} info\n"
	"    {prog} ppl --model MODEL --text FILE [--policy NAME] [--set K=V]... [--ratio R] ...\n"
	"    {prog} needle --model MODEL [--task passkey|multikey|instruct|niah] [--lengths L,...] ...\n"
	"    {prog} run --model MODEL (--prompt TEXT | --file FILE) [-n N] [--chat] ...\n"
	"    {prog} tokenize --model MODEL --text FILE\n"
	"    {prog} bench --model MODEL [--ctx N,N,...]\n"
	"    {prog} keepmap --model MODEL --text FILE [--policy NAME] ... --svg OUT\n"
	"    {prog} serve --model MODEL [--port N] [--kv-memory SIZE] [--policy NAME] ...\n"
	"    {prog} ab --model MODEL --text FILE [--a NAME] [--b NAME] [--ratio LIST] ...\n"
	"    {prog} tune --model MODEL --text FILE... --max-kld X [--min-passkey P] ...\n"
	"    {prog} COMMAND --help\n"
	"\n"
	"DESCRIPTION\n"
	"    Drives the kvpc transformer runtime on a GGUF model of the llama, qwen2, qwen3\n"
	"    or gemma3 architecture (for example SmolLM2-135M-Instruct, Q4_1), over a KV\n"
	"    cache that keeps one entry list per (layer, KV head), on one of two paths: the\n"
	"    exact path (--exact, the default of ppl, needle, keepmap, ab and tune)\n"
	"    dequantises the weights to f32 and computes in f32 with OpenBLAS, keys and\n"
	"    values in f32; the fast path (--fast, the default of run, bench and serve) keeps\n"
	"    the weights in their GGUF types with 8-bit activations on a thread pool, keys\n"
	"    and values in f16 unless --kv-type says f32 or q8_0. A KV-cache policy compiled\n"
	"    by kvpc decides which entries each list keeps; the runtime feeds the largest\n"
	"    chunks that cannot cross the policy's next trigger, so chunked evaluation equals\n"
	"    token-by-token evaluation (unless --prefill-chunk allows a per-step policy's\n"
	"    prompt chunks to cross it). ppl and bench also run on the GPU with their option\n"
	"    --device cuda, in binaries built with kvpc build --cuda (docs/cuda.md).\n"
	"\n"
	"COMMANDS\n"
	"    info      list the policies of this binary with their parameters\n"
	"    ppl       streaming perplexity of a text under a policy, with KL statistics\n"
	"              against the full cache computed in the same run\n"
	"    needle    passkey / needle-in-a-haystack retrieval accuracy under a policy\n"
	"    run       generation from a prompt under a policy (greedy, or --temp)\n"
	"    tokenize  print the token ids of a text file\n"
	"    bench     prefill and decode speed at several context lengths (full cache)\n"
	"    keepmap   draw (SVG) which positions every layer and KV head keeps under a\n"
	"              policy after a prompt\n"
	"    serve     an OpenAI-compatible HTTP server with continuous batching on a\n"
	"              shared KV block pool\n"
	"    ab        compare two policies against the full cache and each other\n"
	"              (what `kvpc ab` runs)\n"
	"    tune      the quality gate: the highest compression ratio within a KL (and\n"
	"              passkey) limit on given texts (what `kvpc tune` runs)\n"
	"\n"
	"OPTIONS\n"
	"    -h, --help     show this text (or a command's, after the command)\n"
	"    --version      the commit the runtime was built from\n"
	"\n"
	"ENVIRONMENT\n"
	"    OPENBLAS_NUM_THREADS  BLAS threads (default: all cores); --threads overrides\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error (file, model, text or policy problem), 2 usage error.\n"
	"    Errors are one line on standard error: \"{prog}: PATH: reason\".\n";

/* ---- entry --------------------------------------------------------------------------------- */

int rt_cli_main_tuned(int argc, char **argv, const struct kvp_policy *const *reg, int n_reg,
                      const struct rt_cli_tuned *tuned, int n_tuned)
{
	rt_cli_tuned_set(tuned, n_tuned);
	return rt_cli_main(argc, argv, reg, n_reg);
}

int rt_cli_main(int argc, char **argv, const struct kvp_policy *const *reg, int n_reg)
{
	rt_cli_prog = "kvrt";
	if (argc > 0 && argv[0] && *argv[0]) {
		const char *b = strrchr(argv[0], '/');
		rt_cli_prog = b ? b + 1 : argv[0];
	}
	rt_cli_reg = reg;
	rt_cli_n_reg = reg ? n_reg : 0;
	if (argc < 2)
		return rt_cli_usage("", "%s", "missing command (info, ppl, needle, run, tokenize, bench, keepmap, serve, "
		                    "ab, tune)");
	const char *cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		rt_cli_help(help_top);
		return 0;
	}
	if (!strcmp(cmd, "--version")) {
		printf("%s (kvpc runtime, commit %s%s)\n", rt_cli_prog, rt_cli_commit(),
		       rt_cli_tree_modified() ? ", tree modified" : "");
		return 0;
	}
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {
		{ "info", rt_cmd_info }, { "ppl", rt_cmd_ppl }, { "needle", rt_cmd_needle }, { "run", rt_cmd_run },
		{ "tokenize", rt_cmd_tokenize }, { "bench", rt_cmd_bench }, { "keepmap", rt_cmd_keepmap },
		{ "serve", rt_cmd_serve }, { "ab", rt_cmd_ab }, { "tune", rt_cmd_tune },
	};
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		if (!strcmp(cmd, cmds[i].name))
			return cmds[i].fn(argc - 1, argv + 1);
	return rt_cli_usage("", "unknown command '%s'", cmd);
}
