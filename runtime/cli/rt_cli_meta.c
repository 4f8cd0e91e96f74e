/*
 * rt_cli_meta: the build's commit and the run metadata of JSON records; see rt_cli_meta.h.
 */
#include "cli/rt_cli_meta.h"

#include "policy/rt_pick.h"
#include "report/rt_json.h"

const char *rt_cli_commit(void)
{
#ifdef KVPC_COMMIT
	return KVPC_COMMIT;
#else
	return "unknown";
#endif
}

int rt_cli_tree_modified(void)
{
#if defined(KVPC_TREE_MODIFIED) && KVPC_TREE_MODIFIED
	return 1;
#else
	return 0;
#endif
}

/* ,"policy":..,"params":{..},"ratio":.. ,"commit":.. (the run metadata) */
void rt_cli_json_policy(FILE *out, const rt_seq *s, double ratio)
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
	if (s->run.ctx.byte_ratio > 0) /* --byte-ratio: the budget in bytes */
		rt_json_member_num(out, "byte_ratio", s->run.ctx.byte_ratio);
	fputs(",\"kv_type\":", out);
	rt_json_str(out, rt_kv_type_name(s->kv.type));
	/* the activations of chunks under 16 rows: f32 (exact path, --f32-act) or 8-bit */
	fputs(s->m->exact || s->m->f32_act ? ",\"activations\":\"f32\"" : ",\"activations\":\"q8\"",
	      out);
	/* what a graceful budget did (a floor or guards raised it): the figures are then
	 * not the ratio's alone */
	fputs(",\"budget_notes\":", out);
	rt_pick_notes_json(out, s->run.notes);
#ifdef KVPC_COMMIT
	fputs(",\"commit\":", out);
	rt_json_str(out, rt_cli_commit());
#endif
}
