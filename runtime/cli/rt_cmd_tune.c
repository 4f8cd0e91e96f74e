/*
 * rt_cmd_tune: `tune` — the quality gate (runtime/eval/rt_tune.h): the highest compression
 * ratio of a grid (in entries or in bytes) whose quality stays within the limits on the
 * given texts, the frontier it walked, and the sidecar `kvpc build` bakes the ratio from;
 * `tune --gate` re-checks one ratio. The man page is help_tune below.
 */
#include "cli/rt_cmd.h"

#include <limits.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "cli/rt_cli_tuned.h"
#include "cli/rt_cli_input.h"
#include "cli/rt_cli_opts.h"
#include "eval/rt_tune.h"
#include "policy/rt_pick.h"
#include "policy/rt_tuned.h"

static const char *const help_tune =
	"NAME\n"
	"    {prog} tune - the highest compression within a quality limit on your texts\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} tune --model MODEL --text FILE [--text FILE]... --max-kld X\n"
	"             [--min-passkey P] [--policy NAME] [--ctx N]\n"
	"             [--ratio LIST | --byte-ratio LIST | --bytes | --entries |\n"
	"              --param NAME=LIST]\n"
	"             [--lengths N] [--depths LIST] [--out FILE.tune]\n"
	"    {prog} tune --gate [--ratio R | --byte-ratio R] --model MODEL --text FILE...\n"
	"             --max-kld X ...\n"
	"\n"
	"DESCRIPTION\n"
	"    Decide the acceptable quality loss first, then compress as far as it allows.\n"
	"    The budget searched counts entries or bytes. In entries, at a compression\n"
	"    ratio R the budget is N / R entries per head (as --ratio of ppl); in bytes, it\n"
	"    is 1/R of the bytes of an f16 full cache of the N tokens (as --byte-ratio of\n"
	"    ppl), which a precision policy spends on entries at its tiers. The default is\n"
	"    bytes for a policy whose budget is bytes(P) or that has a precision statement,\n"
	"    entries for the others; --bytes or --byte-ratio LIST search bytes, --entries or\n"
	"    --ratio LIST entries, for any policy.\n"
	"\n"
	"    Each text is measured under the policy's protocol, compiled from its trigger\n"
	"    (docs/measuring.md): a streaming policy (compress every step, per block, over a\n"
	"    threshold) gets the whole text as its prompt and every token is scored; a\n"
	"    prompt-end policy (`compress at prompt end`: snapkv, pyramidkv, ...) gets the\n"
	"    first N/2 tokens as its prompt, budget over N/2, and is scored on the tokens\n"
	"    after it, as `ppl --prompt N/2 --score-from N/2+1`. A ratio at which the policy\n"
	"    compressed before no scored token of a text is not within the limits (its KL\n"
	"    would be the full cache's 0). At ratio R the policy is within the limits when\n"
	"      - on EVERY text, the mean KL(full cache || policy) per scored token over its\n"
	"        first N tokens is at most X nats (the ppl loop, full-cache reference in the\n"
	"        same pass), and\n"
	"      - with --min-passkey, passkey accuracy (one question-aware prompt of --lengths\n"
	"        tokens per depth of --depths, greedy, as `needle`) is at least P.\n"
	"    The search bisects the ratio grid (it assumes quality falls as R grows), about\n"
	"    log2(grid size) measurements, and prints the frontier it walked: the ratio (or\n"
	"    byte ratio), bytes x (measured compression in bytes against an f16 full cache:\n"
	"    keys and values as stored, scales included), entries x (tokens / mean entries\n"
	"    per list; a prompt-end policy's compression is its prompt's after the compress),\n"
	"    the mean KL over the texts (token-weighted), each text's mean KL (the worst only\n"
	"    beyond 4 texts), passkey and the verdict. The chosen ratio is the highest within\n"
	"    the limits (the next grid ratio, when there is one, was measured and is not),\n"
	"    unless a lower one measured reaches its compression (a floor or the guards held\n"
	"    the budget: then the lowest such). With --out the choice, its kind (ratio or\n"
	"    byte_ratio), the path and the gate go\n"
	"    to a sidecar file (what `kvpc tune` writes next to the policy as POLICY.tune;\n"
	"    `kvpc build` bakes it in as the policy's default budget, `kvpc build --gate`\n"
	"    re-checks it).\n"
	"\n"
	"    A budget that changes nothing does not bind (the frontier marks it): a policy\n"
	"    that evicts nothing (KIVI-style: budget = 100%, every old entry at a fixed low\n"
	"    tier) has a fixed compression in bytes, which a byte ratio below it does not\n"
	"    move; and where a floor or the guards raised the budget on every text, the\n"
	"    budget in force is theirs at that ratio and every higher one. When the chosen\n"
	"    ratio does not bind, tune says why, writes no sidecar and exits 1: build the\n"
	"    policy as it is, give a grid above its fixed ratio, or tune on longer texts.\n"
	"\n"
	"    --param NAME=LIST searches the policy parameter NAME over LIST (increasing;\n"
	"    quality must fall as it grows) instead of a ratio, with no budget override:\n"
	"    the level L of a `budget = threshold(L)` policy (each head keeps the entries\n"
	"    whose score reaches L, so a higher level keeps fewer). The frontier's first\n"
	"    column is then NAME; the choice is the highest value within the limits. A\n"
	"    parameter's value goes in the source or --set, not in a sidecar: with --out\n"
	"    tune says so and writes none.\n"
	"\n"
	"    --gate measures only --ratio R or --byte-ratio R (default: this binary's\n"
	"    baked-in budget of the policy, of the kind tuned) and exits 1 when the limits\n"
	"    no longer hold, naming the text, the measured value and the limit.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL   GGUF model file\n"
	"    -t, --text FILE     a text of yours (repeatable, at most 32)\n"
	"    --max-kld X         the limit on every text's mean KL, nats per token\n"
	"    --min-passkey P     the limit on passkey accuracy, 0..1 (default: not checked)\n"
	"    --policy NAME       policy (default {policy})\n"
	"    --ctx N             tokens of each text to score (default 256; fewer when a text\n"
	"                        is shorter): the cost of the search is linear in N; a\n"
	"                        policy's floor (`min 64 tokens`) holds a quarter of 256\n"
	"                        tokens (half of a prompt-end policy's prompt of N/2), so\n"
	"                        past 4x in entries (2x on a prompt-end policy; half that in\n"
	"                        bytes on the exact path's f32 rows) its budget binds only\n"
	"                        with a longer N\n"
	"    --ratio LIST        the grid in entries, increasing, each >= 1 (default\n"
	"                        1.5,2,3,4,6,8,12,16,24,32); with --gate one ratio\n"
	"    --byte-ratio LIST   the grid in bytes against an f16 full cache (same default)\n"
	"    --bytes, --entries  search bytes or entries with the default grid\n"
	"    --param NAME=LIST   search parameter NAME over LIST (a threshold level)\n"
	"    --lengths N         passkey prompt tokens (default 256)\n"
	"    --depths LIST       passkey needle depths, percent (default 10,50,90)\n"
	"    --seed S            passkey seed (default 1; prompt d's key from S + d)\n"
	"    --out FILE          write the sidecar (not with --gate)\n"
	"    --chunk N, --threads N, --fast, --f32-act   as for ppl (default --exact)\n"
	"    --quiet             no line per measurement on stderr\n"
	"    -h, --help          show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 a ratio was chosen (or the gate holds), 1 none of the grid is within the\n"
	"    limits (or the gate fails, or the chosen one does not bind) or a runtime\n"
	"    error, 2 usage error.\n"
	"\n"
	"EXAMPLE\n"
	"    {prog} tune --model models/SmolLM2-135M-Instruct.Q4_1.gguf --policy h2o \\\n"
	"           --text notes.txt --ctx 256 --max-kld 0.05 --out h2o.tune\n"
	"    {prog} tune --model models/SmolLM2-135M-Instruct.Q4_1.gguf --policy tova_tiers \\\n"
	"           --text notes.txt --ctx 1024 --max-kld 0.03 --byte-ratio 4,6,8,12,16\n";

/* Everything one `tune` command holds. */
typedef struct tune_job {
	rt_cli_opts o;
	const struct kvp_policy *p;
	double *params;            /* the policy's defaults with --set applied */
	double grid[RT_TUNE_MAX_GRID];
	int n_grid;
	rt_tune_opts to;
	rt_tune_text texts[RT_TUNE_MAX_TEXTS];
	int32_t *ids[RT_TUNE_MAX_TEXTS];
	int n_texts;
	rt_tokenizer *tk;
	rt_model *m;
} tune_job;

/* The kind of budget to search into j->to.bytes: --byte-ratio LIST or --bytes bytes,
 * --ratio LIST or --entries entries, else bytes for a policy whose own budget counts bytes
 * (bytes(P)) or that stores precision tiers, entries for the others. Returns 0 or the
 * usage error's exit status. */
static int tune_kind(tune_job *j)
{
	const rt_cli_opts *o = &j->o;
	if (o->param_grid && (o->ratio_list || o->byte_ratio_list || o->bytes_flag ||
	                      o->entries_flag || o->gate))
		return rt_cli_usage("tune", "%s", "--param NAME=LIST searches a parameter with no "
		                    "budget override; it takes no --ratio, --byte-ratio, --bytes, "
		                    "--entries or --gate");
	if (o->ratio_list && o->byte_ratio_list)
		return rt_cli_usage("tune", "%s", "--ratio LIST is a grid in entries and --byte-ratio "
		                    "LIST one in bytes; give one of them");
	if (o->bytes_flag && o->entries_flag)
		return rt_cli_usage("tune", "%s", "--bytes and --entries: give one of them");
	if ((o->bytes_flag && o->ratio_list) || (o->entries_flag && o->byte_ratio_list))
		return rt_cli_usage("tune", "%s", o->bytes_flag
		                    ? "--bytes with --ratio LIST (a grid in entries): give the grid in "
		                      "bytes as --byte-ratio LIST"
		                    : "--entries with --byte-ratio LIST (a grid in bytes): give the "
		                      "grid in entries as --ratio LIST");
	if (o->byte_ratio_list || o->bytes_flag)
		j->to.bytes = 1;
	else if (o->ratio_list || o->entries_flag)
		j->to.bytes = 0;
	else
		j->to.bytes = j->p->budget_bytes || (j->p->needs & KVP_NEED_TIERS) != 0;
	return 0;
}

/* --param NAME=LIST: the parameter's index into j->to.param and its values into the
 * grid. Returns 0 or the usage error's exit status. */
static int tune_param_grid(tune_job *j)
{
	const char *a = j->o.param_grid, *eq = strchr(a, '=');
	char name[128];
	if (!eq || eq == a || (size_t)(eq - a) >= sizeof name)
		return rt_cli_usage("tune", "--param: '%s' is not NAME=LIST (as in --param "
		                    "level=0.001,0.003,0.01)", a);
	memcpy(name, a, (size_t)(eq - a));
	name[eq - a] = 0;
	const int k = kvp_policy_param_index(j->p, name);
	if (k < 0)
		return rt_cli_usage("tune", "--param: policy %s has no parameter '%s'", j->p->name,
		                    name);
	if (rt_parse_list(eq + 1, -1e300, 1e300, 0, j->grid, RT_TUNE_MAX_GRID, &j->n_grid))
		return rt_cli_usage("tune", "--param %s: '%s' is not a comma list of at most %d "
		                    "numbers", name, eq + 1, RT_TUNE_MAX_GRID);
	for (int i = 1; i < j->n_grid; i++)
		if (!(j->grid[i] > j->grid[i - 1]))
			return rt_cli_usage("tune", "--param %s: '%s' is not increasing", name, eq + 1);
	j->to.param = k;
	j->to.bytes = 0;
	return 0;
}

/* The ratio grid: --ratio LIST or --byte-ratio LIST (by j->to.bytes), with --gate the
 * binary's tuned ratio when none is given, else the default grid. Returns 0 or the usage
 * error's exit status. */
static int tune_ratio_grid(tune_job *j)
{
	const rt_cli_opts *o = &j->o;
	const char *grid = j->to.bytes ? o->byte_ratio_list : o->ratio_list;
	const char *gopt = j->to.bytes ? "--byte-ratio" : "--ratio";
	char dflt[64];
	if (!grid && o->gate) {
		int tb = 0;
		const double r = rt_cli_tuned_ratio(j->p, &tb);
		if (!(r > 0))
			return rt_cli_usage("tune", "--gate: --ratio R or --byte-ratio R is needed (this "
			                    "binary has no tuned budget for %s)", j->p->name);
		if ((o->bytes_flag && !tb) || (o->entries_flag && tb))
			return rt_cli_usage("tune", "--gate %s: this binary's tuned budget of %s counts "
			                    "%s", o->bytes_flag ? "--bytes" : "--entries", j->p->name,
			                    tb ? "bytes" : "entries");
		j->to.bytes = tb;
		gopt = tb ? "--byte-ratio" : "--ratio";
		snprintf(dflt, sizeof dflt, "%.17g", r);
		grid = dflt;
	}
	if (!grid)
		grid = "1.5,2,3,4,6,8,12,16,24,32";
	if (rt_parse_list(grid, 1, 1e9, 0, j->grid, RT_TUNE_MAX_GRID, &j->n_grid))
		return rt_cli_usage("tune", "%s: '%s' is not a comma list of at most %d compression "
		                    "factors >= 1", gopt, grid, RT_TUNE_MAX_GRID);
	if (o->gate && j->n_grid != 1)
		return rt_cli_usage("tune", "--gate checks one ratio, got %s '%s'", gopt, grid);
	for (int i = 1; i < j->n_grid; i++)
		if (!(j->grid[i] > j->grid[i - 1]))
			return rt_cli_usage("tune", "%s: '%s' is not increasing", gopt, grid);
	return 0;
}

/* The grid, the passkey settings and the limits from the options. Returns 0 or the usage
 * error's exit status. */
static int tune_args(tune_job *j)
{
	rt_cli_opts *o = &j->o;
	if (o->n_texts < 1)
		return rt_cli_usage("tune", "%s", "--text is required (one or more)");
	if (o->n_texts > RT_TUNE_MAX_TEXTS)
		return rt_cli_usage("tune", "more than %d --text files", RT_TUNE_MAX_TEXTS);
	if (o->max_kld < 0)
		return rt_cli_usage("tune", "%s", "--max-kld X is required: the acceptable mean KL "
		                    "per token (nats) against the full cache");
	if (o->gate && o->out)
		return rt_cli_usage("tune", "%s", "--gate checks a ratio; it writes no sidecar (--out)");
	int rc = 0;
	if (!(j->p = rt_cli_policy("tune", o, &rc)))
		return rc;
	if (!j->p->compress)
		return rt_cli_usage("tune", "policy %s never compresses: there is no ratio to tune",
		                    j->p->name);
	if ((rc = tune_kind(j)) != 0)
		return rc;
	if ((rc = o->param_grid ? tune_param_grid(j) : tune_ratio_grid(j)) != 0)
		return rc;
	double len[RT_CLI_MAX_LIST];
	int n_len = 0;
	if (rt_parse_list(o->lengths, 16, 1 << 24, 1, len, RT_CLI_MAX_LIST, &n_len) || n_len != 1)
		return rt_cli_usage("tune", "--lengths: '%s' is not one token count", o->lengths);
	if (rt_parse_list(o->depths, 0, 100, 0, j->to.depths, RT_TUNE_MAX_DEPTHS, &j->to.n_depths))
		return rt_cli_usage("tune", "--depths: '%s' is not a comma list of percentages "
		                    "in 0..100", o->depths);
	j->to.max_kld = o->max_kld;
	j->to.min_passkey = o->min_passkey;
	j->to.passkey_len = (int64_t)len[0];
	j->to.seed = (uint64_t)o->seed;
	j->to.block = (int)o->chunk;
	if (!(j->params = calloc((size_t)j->p->n_params + 1, sizeof *j->params)))
		return EXIT_FAILURE;
	kvp_policy_param_defaults(j->p, j->params);
	rt_err err = { "" };
	for (int i = 0; i < o->n_sets; i++)
		if (kvp_policy_param_set(j->p, j->params, o->sets[i], &err) != 0)
			return rt_cli_usage("tune", "--set: %s", err.msg);
	if (!o->param_grid && kvp_policy_params_check(j->p, j->params, &err) != 0)
		return rt_cli_usage("tune", "--set: %s", err.msg);
	/* each --param value as a --set of it would be, with the --set values */
	for (int g = 0; o->param_grid && g < j->n_grid; g++) {
		const struct kvp_param *q = &j->p->params[j->to.param];
		char v[64], a[256];
		rt_param_format_set(q, j->grid[g], v, sizeof v);
		snprintf(a, sizeof a, "%s=%s", q->name, v);
		double *vals = malloc(((size_t)j->p->n_params + 1) * sizeof *vals);
		if (!vals)
			return EXIT_FAILURE;
		memcpy(vals, j->params, (size_t)j->p->n_params * sizeof *vals);
		const int bad = kvp_policy_param_set(j->p, vals, a, &err) != 0 ||
		                kvp_policy_params_check(j->p, vals, &err) != 0;
		free(vals);
		if (bad)
			return rt_cli_usage("tune", "--param %s: %s", q->name, err.msg);
	}
	return 0;
}

/* The model and every text's first --ctx tokens. Returns 0 or the exit status. */
static int tune_load(tune_job *j)
{
	rt_gguf *g = NULL;
	int orc = rt_cli_open_model(j->o.model, &j->o, &g, &j->tk, &j->m);
	rt_gguf_close(g);
	if (orc < 0)
		return EXIT_FAILURE;
	const int64_t n_ctx = j->m->hp.n_ctx;
	if (j->o.ctx > n_ctx || (j->to.min_passkey >= 0 && j->to.passkey_len + 8 > n_ctx)) {
		fprintf(stderr, "%s: %s: --ctx %ld or --lengths %lld exceeds the model's "
		        "context_length %lld\n", rt_cli_prog, j->o.model, j->o.ctx,
		        (long long)j->to.passkey_len, (long long)n_ctx);
		return RT_CLI_USAGE;
	}
	for (int i = 0; i < j->o.n_texts; i++) {
		const char *name = j->o.texts[i];
		size_t len;
		char *text = rt_cli_read_text(name, &len);
		int64_t n = 0;
		j->ids[i] = text ? rt_cli_tokenize(j->tk, name, text, len, 0, &n) : NULL;
		free(text);
		if (!j->ids[i])
			return EXIT_FAILURE;
		j->n_texts++;
		if (n > j->o.ctx)
			n = j->o.ctx;
		if (n < 2) {
			fprintf(stderr, "%s: %s: %lld token%s; the gate scores at least 2\n", rt_cli_prog,
			        name, (long long)n, n == 1 ? "" : "s");
			return EXIT_FAILURE;
		}
		j->texts[i] = (rt_tune_text){ .name = name, .ids = j->ids[i], .n = n };
	}
	return 0;
}

/* "ratio", "byte ratio" or the parameter's name (--param): how messages name the grid. */
static const char *kind_name(const tune_job *j)
{
	if (j->to.param >= 0)
		return j->p->params[j->to.param].name;
	return j->to.bytes ? "byte ratio" : "ratio";
}

static void tune_progress(void *user, const rt_tune_point *pt)
{
	const tune_job *j = user;
	if (j->o.quiet)
		return;
	if (pt->error[0])
		fprintf(stderr, "%s tune: %s %g: cannot run: %s\n", rt_cli_prog, kind_name(j), pt->ratio,
		        pt->error);
	else
		fprintf(stderr, "%s tune: %s %g: %.2fx in bytes, %.2fx in entries, mean KL %.6f "
		        "(worst %.6f, %s)%s\n", rt_cli_prog, kind_name(j), pt->ratio, pt->bytes_x,
		        pt->entries_x, pt->kld_mean, pt->kld_worst, j->texts[pt->worst].name,
		        pt->pass ? ", within the limits" : ", beyond the limits");
}

/* 1 when a byte ratio's point stores more than 1/0.9 of its budget (bytes x below 0.9 R):
 * guards kept at the top tier (f32 on the exact path, twice f16's bytes) that the budget,
 * checked in entries, cannot hold. */
static int over_budget(const rt_tune_point *pt)
{
	return pt->bytes && !pt->error[0] && pt->bytes_x < 0.9 * pt->ratio;
}

/* Texts whose mean KL gets a column of its own in the frontier (beyond: the worst only). */
#define TUNE_TEXT_COLS 4

/* The frontier table on stdout: one row per measured ratio, each text's mean KL in a
 * column (KL 1.. named under the table). */
static void tune_table(const tune_job *j, const rt_tune_point *w, int n, int chosen)
{
	const int cols = j->n_texts <= TUNE_TEXT_COLS ? j->n_texts : 0;
	unsigned notes = 0;
	printf("tune %s on %d text%s (at most %ld tokens each, the %s path), %s %s, %s: mean KL "
	       "<= %g on every text", j->p->name, j->n_texts, j->n_texts == 1 ? "" : "s", j->o.ctx,
	       j->o.exact ? "exact" : "fast",
	       j->to.param >= 0 ? "searching parameter" : "budget in",
	       j->to.param >= 0 ? kind_name(j) : j->to.bytes ? "bytes" : "entries",
	       j->p->measure == KVP_MEASURE_PROMPT_END
	               ? "prompt-end protocol (the first half of each text is the prompt, the "
	                 "tokens after it are scored)"
	               : "streaming protocol (each text is the prompt, every token scored)",
	       j->to.max_kld);
	if (j->to.min_passkey >= 0)
		printf(", passkey >= %g (%d prompts of %lld tokens)", j->to.min_passkey,
		       j->to.n_depths, (long long)j->to.passkey_len);
	printf("\n%10s %8s %9s %10s", kind_name(j), "bytes x", "entries x",
	       "mean KL");
	for (int t = 0; t < cols; t++)
		printf("   KL %-5d", t + 1);
	if (!cols)
		printf(" %10s", "worst KL");
	printf("  %-8s %s\n", "passkey", "within");
	for (int i = 0; i < n; i++) {
		const rt_tune_point *pt = &w[i];
		if (pt->error[0]) {
			printf("%10g %8s %9s %10s", pt->ratio, "-", "-", "-");
			for (int t = 0; t < (cols ? cols : 1); t++)
				printf(" %10s", "-");
			printf("  %-8s no: %s\n", "-", pt->error);
			continue;
		}
		char pk[32] = "-";
		if (pt->passkey_n)
			snprintf(pk, sizeof pk, "%d/%d", pt->passkey_ok, pt->passkey_n);
		printf("%10g %8.2f %9.2f %10.6f", pt->ratio, pt->bytes_x, pt->entries_x, pt->kld_mean);
		for (int t = 0; t < cols; t++)
			printf(" %10.6f", pt->kld_text[t]);
		if (!cols)
			printf(" %10.6f", pt->kld_worst);
		printf("  %-8s %s%s%s%s\n", pk, pt->pass ? "yes" : "no",
		       !rt_tune_point_binds(pt) ? " (budget does not bind)"
		       : over_budget(pt) ? " (over the budget)" : "",
		       pt->notes ? " (budget raised: note)" : "", i == chosen ? "  <- chosen" : "");
		notes |= pt->notes;
	}
	for (int t = 0; t < cols && j->n_texts > 1; t++)
		printf("    KL %d: %s\n", t + 1, j->texts[t].name);
	const char *t;
	for (unsigned n = notes; (t = rt_pick_note_next(&n));) /* as ppl's notes */
		printf("note: at the points marked \"budget raised\", %s: their compression is "
		       "that, not the %s's (a longer --ctx lets the %s bind)\n", t, kind_name(j),
		       kind_name(j));
}

/* Why a point is beyond the limits: "text T: mean KL X > limit Y" or the passkey's. */
static void tune_why(const tune_job *j, const rt_tune_point *pt, char *buf, size_t cap)
{
	if (pt->error[0])
		snprintf(buf, cap, "the policy cannot run: %s", pt->error);
	else if (pt->kld_worst > j->to.max_kld)
		snprintf(buf, cap, "text %s: mean KL %.6f nats/token > limit %g (--max-kld)",
		         j->texts[pt->worst].name, pt->kld_worst, j->to.max_kld);
	else
		snprintf(buf, cap, "passkey accuracy %d/%d = %.3f < limit %g (--min-passkey)",
		         pt->passkey_ok, pt->passkey_n, (double)pt->passkey_ok / pt->passkey_n,
		         j->to.min_passkey);
}

/* path made absolute against the working directory (symbolic links kept), heap; NULL on
 * failure. */
static char *abs_path(const char *path)
{
	char *out = NULL, cwd[PATH_MAX];
	if (path[0] == '/')
		return strdup(path);
	if (!getcwd(cwd, sizeof cwd) || asprintf(&out, "%s/%s", cwd, path) < 0)
		return NULL;
	return out;
}

/* The sidecar of the chosen point (absolute paths). */
static int tune_write(const tune_job *j, const rt_tune_point *pt, rt_err *err)
{
	rt_tuned t;
	rt_tuned_init(&t);
	snprintf(t.policy, sizeof t.policy, "%s", j->p->name);
	snprintf(t.source_hash, sizeof t.source_hash, "%s", j->p->source_hash ? j->p->source_hash : "");
	t.ratio = pt->ratio;
	t.bytes = pt->bytes;
	t.bytes_x = pt->bytes_x;
	t.entries_x = pt->entries_x;
	t.max_kld = j->to.max_kld;
	t.min_passkey = j->to.min_passkey;
	t.passkey_len = (long)j->to.passkey_len;
	snprintf(t.depths, sizeof t.depths, "%s", j->o.depths);
	t.ctx = j->o.ctx;
	t.fast = !j->o.exact;
	t.f32_act = t.fast && j->o.f32_act;
	t.chunk = j->o.chunk != RT_CLI_CHUNK ? j->o.chunk : 0; /* the default stays implicit */
	t.model = abs_path(j->o.model);
	for (int i = 0; i < j->n_texts; i++)
		if ((t.texts[t.n_texts] = abs_path(j->o.texts[i])))
			t.n_texts++;
	t.kld = pt->kld_worst;
	t.passkey = pt->passkey_n ? (double)pt->passkey_ok / pt->passkey_n : -1;
	int rc;
	if (!t.model || t.n_texts != j->n_texts)
		rc = rt_err_set(err, "%s: cannot resolve the model's and the texts' paths", j->o.out);
	else {
		char note[512];
		snprintf(note, sizeof note, "written by kvpc tune: policy %s at %s %g (%.2fx in "
		         "bytes against an f16 full cache, %.2fx in entries)\n`kvpc build` bakes it in "
		         "as the policy's default budget (as %s %g); `kvpc build --gate` re-checks "
		         "the limits", j->p->name, kind_name(j), pt->ratio, pt->bytes_x, pt->entries_x,
		         pt->bytes ? "--byte-ratio" : "--ratio", pt->ratio);
		rc = rt_tuned_write(j->o.out, &t, note, err);
	}
	rt_tuned_free(&t);
	return rc;
}

/* The chosen ratio within the limits does not bind (a floor or the guards held the
 * budget at this length; or a policy whose tiers alone compress further, evicting
 * nothing: KIVI-style): say so. Returns 1 (no sidecar is written). */
static int tune_unbound(const tune_job *j, const rt_tune_point *w, int n, int chosen)
{
	const rt_tune_point *c = &w[chosen];
	if (c->raised_all) { /* the length decides, not the ratio (rt_tune_point_binds) */
		const int guards = (c->raised_all & KVP_NOTE_GUARDS) != 0; /* as ppl names them */
		fprintf(stderr, "%s: tune: policy %s at %s %g: %s raised the budget on every text, "
		        "so on texts of this length the budget in force is theirs (%.2fx in bytes, "
		        "%.2fx in entries) at this ratio and every higher one: there is no %s to "
		        "bake in. Tune on longer texts (--ctx, with a longer --text), or lower %s\n",
		        rt_cli_prog, j->p->name, kind_name(j), c->ratio,
		        guards ? "the guards" : "the floor (min_kv, or the policy's budget min)",
		        c->bytes_x, c->entries_x, kind_name(j),
		        guards ? "the guards (--set)" : "the floor (--set, or the policy's `min`)");
		return EXIT_FAILURE;
	}
	fprintf(stderr, "%s: tune: policy %s evicts nothing at byte ratio %g: its tiers alone store "
	        "%.2fx fewer bytes than an f16 full cache, so its compression in bytes is fixed by "
	        "its precision and a budget of at most %.2fx changes nothing; there is no byte "
	        "budget to bake in", rt_cli_prog, j->p->name, c->ratio, c->bytes_x, c->bytes_x);
	if (chosen + 1 < n && !w[chosen + 1].pass) {
		char why[768];
		tune_why(j, &w[chosen + 1], why, sizeof why);
		fprintf(stderr, ", and the next byte ratio, %g (where the budget evicts by the "
		        "policy's score), is beyond the limits: %s", w[chosen + 1].ratio, why);
	} else { /* the higher ones passed, compressing no further (rt_tune_search) */
		fprintf(stderr, " within this grid");
	}
	fprintf(stderr, ". Build the policy as it is (its own budget), or give --byte-ratio LIST "
	        "above %.2f to trade entries too\n", c->bytes_x);
	return EXIT_FAILURE;
}

/* Search (or --gate: one ratio), report, write. Returns the exit status. */
static int tune_run(tune_job *j)
{
	rt_err err = { "" };
	rt_tune_point walked[RT_TUNE_MAX_GRID];
	int n_walked = 0, chosen = -1;
	if (rt_tune_search(j->m, j->tk, j->p, j->params, j->texts, j->n_texts, &j->to, j->grid,
	                   j->n_grid, walked, &n_walked, &chosen, tune_progress, j, &err) != 0)
		return rt_cli_fail(&err);
	tune_table(j, walked, n_walked, chosen);
	char why[768];
	if (j->o.gate) {
		if (chosen < 0) {
			tune_why(j, &walked[0], why, sizeof why);
			fprintf(stderr, "%s: gate failed: policy %s at %s %g: %s\n", rt_cli_prog,
			        j->p->name, kind_name(j), j->grid[0], why);
			return EXIT_FAILURE;
		}
		printf("gate holds: policy %s at %s %g (%.2fx in bytes, %.2fx in entries, the %s "
		       "path)\n", j->p->name, kind_name(j), j->grid[0], walked[0].bytes_x,
		       walked[0].entries_x, j->o.exact ? "exact" : "fast");
		return 0;
	}
	if (chosen < 0) {
		tune_why(j, &walked[0], why, sizeof why);
		fprintf(stderr, "%s: tune: no %s of the grid is within the limits: at the lowest, "
		        "%g, %s%s\n", rt_cli_prog, kind_name(j), walked[0].ratio, why,
		        j->o.exact && j->to.bytes && (j->p->needs & KVP_NEED_TIERS)
		                ? " (on the exact path the top tier is f32 rows, twice f16's bytes, "
		                  "so a byte budget evicts sooner than in the f16 store a deployment "
		                  "runs: --fast measures that store)"
		                : "");
		return EXIT_FAILURE;
	}
	if (!rt_tune_point_binds(&walked[chosen]))
		return tune_unbound(j, walked, n_walked, chosen);
	printf("chosen: %s %g, %.2fx in bytes against an f16 full cache, %.2fx in entries",
	       kind_name(j), walked[chosen].ratio, walked[chosen].bytes_x, walked[chosen].entries_x);
	if (over_budget(&walked[chosen])) { /* why, when the run said: its budget notes */
		unsigned nb = walked[chosen].notes;
		const char *why1 = rt_pick_note_next(&nb);
		printf(" (over the budget: it holds more than 1/%g of the full cache's bytes: %s)",
		       walked[chosen].ratio, why1 ? why1 : "the entries the guards keep at the top "
		       "tier take more bytes than that");
	}
	if (chosen + 1 < n_walked && walked[chosen + 1].pass) { /* rt_tune_search moved down */
		double top = walked[chosen + 1].ratio;
		for (int i = chosen + 1; i < n_walked && walked[i].pass; i++)
			top = walked[i].ratio;
		printf("; the higher ratios measured, up to %g, are within the limits but compress "
		       "no further at this length (a floor or the guards hold the budget; a longer "
		       "--ctx lets them bind)", top);
	} else if (chosen + 1 < n_walked) {
		tune_why(j, &walked[chosen + 1], why, sizeof why);
		printf("; the next step, %g, is not within the limits (%s)", walked[chosen + 1].ratio,
		       why);
	} else {
		printf("; the top of the grid");
	}
	putchar('\n');
	if (j->o.out && j->to.param >= 0) {
		printf("no sidecar: a sidecar bakes a ratio, and %s is a parameter; write `param %s = "
		       "%g` in the policy's source or run it with --set %s=%g\n", kind_name(j),
		       kind_name(j), walked[chosen].ratio, kind_name(j), walked[chosen].ratio);
	} else if (j->o.out) {
		if (tune_write(j, &walked[chosen], &err) != 0)
			return rt_cli_fail(&err);
		printf("wrote %s\n", j->o.out);
	}
	return fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
}

int rt_cmd_tune(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', 't', O_POLICY, O_SET, O_CTX, O_RATIOS, O_MAXKLD,
		O_MINPASSKEY, O_LENGTHS, O_DEPTHS, O_SEED, O_OUT, O_GATE, O_CHUNK, O_THREADS, O_EXACT,
		O_FAST, O_QUIET, O_BYTERATIOS, O_BYTES, O_ENTRIES, O_F32ACT, O_PARAMGRID, 0 };
	tune_job j = { .o = { .chunk = RT_CLI_CHUNK, .exact = 1, .ctx = 256, .seed = 1,
		              .max_kld = -1, .min_passkey = -1, .lengths = "256",
		              .depths = "10,50,90" },
		       .to = { .param = -1 } };
	int rc = rt_cli_parse("tune", help_tune, argc, argv, &j.o, opt_ids,
	                      RT_CLI_NEED_MODEL | RT_CLI_MANY_TEXTS);
	if (rc != RT_CLI_GO)
		return rc;
	rt_cli_threads(j.o.threads);
	if ((rc = tune_args(&j)) == 0 && (rc = tune_load(&j)) == 0)
		rc = tune_run(&j);
	for (int i = 0; i < j.n_texts; i++)
		free(j.ids[i]);
	free(j.params);
	rt_model_free(j.m);
	rt_tokenizer_free(j.tk);
	return rc;
}
