/*
 * rt_cmd_info: `info` — list the policies of this binary with their parameters; the man
 * page is help_info below.
 */
#include "cli/rt_cmd.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/rt_cli_opts.h"
#include "cli/rt_cli_tuned.h"
#include "eval/rt_eval.h"
#include "report/rt_json.h"

static const char *const help_info =
	"NAME\n"
	"    {prog} info - list the KV-cache policies compiled into this binary\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} info [--json]\n"
	"\n"
	"DESCRIPTION\n"
	"    For each policy: its name, one-line summary, the .kvp source it was compiled\n"
	"    from with the FNV-1a 64 hash of the source bytes, its position convention\n"
	"    (original: keys keep the RoPE of their token position; compacted: kept keys are\n"
	"    re-rotated to their index in the cache), how its quality is measured (streaming,\n"
	"    or prompt_end: scored on the tokens after a prompt, docs/measuring.md), whether\n"
	"    its compress needs an f32 store (it reads and rewrites key/value rows: GraceKV;\n"
	"    such a policy is refused --kv-type f16 or q8_0), its parameters with default value,\n"
	"    unit and documentation, and its other statements as written in the .kvp source\n"
	"    (budget, statistics, score, guards and spans kept, precision, trigger; comments\n"
	"    dropped). Parameters are changed at run time with --set NAME=VALUE.\n"
	"    The built-in policy `full` keeps every token.\n"
	"\n"
	"OPTIONS\n"
	"    --json      one JSON object: {\"policies\":[{name, summary, source, source_hash,\n"
	"                positions, measure, kv_f32_only, tuned (with a baked-in ratio:\n"
	"                {ratio or byte_ratio, sidecar}), statements (a line each),\n"
	"                params:[{name, default, unit, doc}]}]}\n"
	"    -h, --help  show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 2 usage error.\n";

static void info_one(const struct kvp_policy *p, int json, int first)
{
	const char *pos = p->positions == KVP_POS_COMPACTED ? "compacted" : "original";
	const int f32_only = (p->needs & KVP_NEED_F32_KV) != 0; /* rt_run_init_typed's refusal */
	int tuned_bytes = 0; /* a sidecar's ratio baked in by kvpc build (0: none) */
	const double tuned = rt_cli_tuned_ratio(p, &tuned_bytes);
	if (json) {
		fputs(first ? "{\"name\":" : ",{\"name\":", stdout);
		rt_json_str(stdout, p->name);
		fputs(",\"summary\":", stdout);
		rt_json_str(stdout, p->summary ? p->summary : "");
		fputs(",\"source\":", stdout);
		rt_json_str(stdout, p->source ? p->source : "");
		fputs(",\"source_hash\":", stdout);
		rt_json_str(stdout, p->source_hash ? p->source_hash : "");
		printf(",\"positions\":\"%s\",\"measure\":\"%s\",\"kv_f32_only\":%s", pos,
		       rt_eval_measure_name(p->measure), f32_only ? "true" : "false");
		if (tuned > 0) { /* as the text's "tuned default" line */
			printf(",\"tuned\":{\"%s\":", tuned_bytes ? "byte_ratio" : "ratio");
			rt_json_num(stdout, tuned);
			fputs(",\"sidecar\":", stdout);
			rt_json_str(stdout, rt_cli_tuned_sidecar(p));
			fputc('}', stdout);
		}
		fputs(",\"statements\":", stdout);
		rt_json_str(stdout, p->statements ? p->statements : "");
		fputs(",\"params\":[", stdout);
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
	printf("    source %s (hash %s), positions %s, measured %s\n", p->source ? p->source : "?",
	       p->source_hash ? p->source_hash : "?", pos,
	       p->measure == KVP_MEASURE_PROMPT_END ? "after a prompt (prompt-end protocol)"
	                                            : "streaming");
	if (f32_only)
		printf("    needs an f32 store (--kv-type f32): its compress rewrites key/value rows\n");
	if (tuned > 0)
		printf("    tuned default %s %g (baked in from %s; --ratio or --byte-ratio overrides "
		       "it)\n", tuned_bytes ? "byte ratio" : "ratio", tuned, rt_cli_tuned_sidecar(p));
	if (p->n_params == 0)
		printf("    no parameters\n");
	for (int i = 0; i < p->n_params; i++) {
		const struct kvp_param *q = &p->params[i];
		char set[96], v[64];
		rt_param_format_set(q, q->def, v, sizeof v);
		snprintf(set, sizeof set, "%s=%s", q->name, v);
		printf("    --set %-22s %-8s %s\n", set, kvp_unit_name(q->unit), q->doc ? q->doc : "");
	}
	if (p->statements && *p->statements) { /* the algorithm as written, a line each */
		printf("    statements:\n");
		for (const char *l = p->statements; *l;) {
			const size_t n = strcspn(l, "\n");
			printf("        %.*s\n", (int)n, l);
			l += n + (l[n] == '\n');
		}
	}
}

int rt_cmd_info(int argc, char **argv)
{
	static const int opt_ids[] = { O_JSON, 0 };
	rt_cli_opts o = { 0 };
	int rc = rt_cli_parse("info", help_info, argc, argv, &o, opt_ids, 0);
	if (rc != RT_CLI_GO)
		return rc;
	int first = 1;
	if (o.json)
		fputs("{\"policies\":[", stdout);
	for (int i = 0; i < rt_cli_n_reg; i++) {
		info_one(rt_cli_reg[i], o.json, first);
		first = 0;
		if (!o.json)
			putchar('\n');
	}
	if (!rt_registry_find(rt_cli_reg, rt_cli_n_reg, "full"))
		info_one(&rt_policy_full, o.json, first);
	if (o.json)
		fputs("]}\n", stdout);
	return fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
}

