/*
 * rt_compression: the one definition of compression (see rt_compression.h).
 */
#include "eval/rt_compression.h"

#include <math.h>
#include <string.h>

#include "kv/rt_kvbytes.h"
#include "report/rt_json.h"

static double ratio_of(double full, double held)
{
	return held > 0 ? full / held : 0;
}

/* 1 when (layer, KV head) list hi is one the policy compresses: every list, except the
 * sliding-window layers' under `layers = global_only` (kvp_policy.global_only). */
static int compressed_list(const rt_seq *s, int hi)
{
	const int32_t *w = s->run.ctx.layer_window;
	return !(s->p && s->p->global_only && w && w[hi / s->kv.n_kv_head] > 0);
}

/* The end figures over the lists the policy compresses (all of them, or the full-attention
 * layers' under global_only when the model has windows): tokens × lists over the entries
 * held, and the f16 bytes of those lists over their bytes held. */
static void end_figures(const rt_seq *s, int64_t tokens, rt_compression *c)
{
	const int H = s->kv.n_layer * s->kv.n_kv_head;
	double lists = 0, entries = 0, held = 0;
	for (int hi = 0; hi < H; hi++)
		if (compressed_list(s, hi)) {
			lists += 1;
			entries += (double)s->kv.heads[hi].n;
			held += (double)rt_kvbytes_head_held(&s->kv, hi);
		}
	const double f16 = (double)rt_kvbytes_f16(&s->kv, tokens) * lists / H;
	c->entries_end = ratio_of((double)tokens, lists > 0 ? entries / lists : 0);
	c->bytes_end = ratio_of(f16, held);
}

void rt_compression_of(const rt_seq *s, int64_t tokens, rt_compression *c)
{
	memset(c, 0, sizeof *c);
	const rt_seq_stats st = rt_seq_stats_get(s);
	const double lists = (double)s->kv.n_layer * s->kv.n_kv_head;
	const double f16 = (double)rt_kvbytes_f16(&s->kv, tokens);
	c->tokens = (double)tokens;
	end_figures(s, tokens, c);
	c->entries_peak = ratio_of((double)tokens, (double)st.kv_entries_peak / lists);
	c->bytes_peak = ratio_of(f16, (double)st.kv_kvbytes_peak);
	const int64_t pl = s->run.ctx.prompt_len;
	if (pl > 0 && pl < tokens) {
		c->prompt = (double)pl;
		c->entries_prompt = st.prompt_compression;
		c->bytes_prompt = st.prompt_bytes_compression;
	}
}

void rt_compression_add(rt_compression *acc, const rt_compression *c, int n)
{
	acc->tokens += c->tokens / n;
	acc->prompt += c->prompt / n;
	acc->entries_end += c->entries_end / n;
	acc->bytes_end += c->bytes_end / n;
	acc->entries_peak += c->entries_peak / n;
	acc->bytes_peak += c->bytes_peak / n;
	acc->entries_prompt += c->entries_prompt / n;
	acc->bytes_prompt += c->bytes_prompt / n;
}

void rt_compression_mean(const rt_compression *c, int n, rt_compression *out)
{
	memset(out, 0, sizeof *out);
	for (int i = 0; i < n; i++)
		rt_compression_add(out, &c[i], n);
}

static int differ(double a, double b, double tol)
{
	return fabs(a - b) > tol * (a > b ? a : b);
}

int rt_compression_differ(const rt_compression *a, const rt_compression *b, double tol,
                          int prompt)
{
	return differ(a->bytes_end, b->bytes_end, tol) ||
	       (prompt && a->prompt > 0 && b->prompt > 0 &&
	        differ(a->bytes_prompt, b->bytes_prompt, tol));
}

void rt_compression_json(FILE *out, const rt_compression *c)
{
	rt_json_member_num(out, "compression", c->entries_end);
	rt_json_member_num(out, "bytes_compression", c->bytes_end);
	rt_json_member_num(out, "compression_peak", c->entries_peak);
	rt_json_member_num(out, "bytes_compression_peak", c->bytes_peak);
	if (c->prompt > 0) {
		rt_json_member_num(out, "prompt_compression", c->entries_prompt);
		rt_json_member_num(out, "prompt_bytes_compression", c->bytes_prompt);
	}
}

void rt_compression_table(FILE *out, const rt_compression *c)
{
	fprintf(out, "compression      %.2fx in entries, %.2fx in bytes at the end; %.2fx, %.2fx "
	        "at peak\n", c->entries_end, c->bytes_end, c->entries_peak, c->bytes_peak);
	if (c->prompt > 0)
		fprintf(out, "prompt           %.2fx in entries, %.2fx in bytes after its %.0f tokens "
		        "and its compress\n", c->entries_prompt, c->bytes_prompt, c->prompt);
}
