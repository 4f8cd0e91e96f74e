/*
 * kept_ref: kvpc's own runtime as the reference of the vLLM suite (tests/vllm/test_vllm.py):
 * feeds a prompt, given as token ids, through rt_seq under a library policy on the exact
 * (f32) path and prints the positions each (layer, KV head) keeps at the prompt end, as
 * JSON {"kept": {"LAYER": {"HEAD": [positions...]}}, "kl": K, "tokens": [...]}.
 *
 *   kept_ref MODEL.gguf POLICY SET RATIO TOKENS.txt [GEN [PROMPT]]
 *
 * SET is a --set list "name=value,..." ("" for none), RATIO 0 for the policy's own budget,
 * TOKENS.txt whitespace-separated token ids (n of them). PROMPT (default n) is where the
 * policy's prompt ends: the kept sets are those at PROMPT, the rest of the ids is fed after
 * it, and "kl" is the mean KL divergence, in nats, of the next-token distributions after
 * ids PROMPT .. n-2 against the full cache's (kvrt ppl --prompt PROMPT --score-from
 * PROMPT+1; 0 when PROMPT >= n-1). GEN greedy tokens then follow the ids ("tokens").
 * Exit status 0, 1 on any error (one line).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/rt_model.h"
#include "policy/rt_pick.h"
#include "policy/rt_policy.h"
#include "policy/rt_seq.h"

static int die(const char *what, const char *msg)
{
	fprintf(stderr, "kept_ref: %s: %s\n", what, msg);
	return 1;
}

/* KL(p || q) of two logit rows, in nats */
static double kl_rows(const float *p, const float *q, int nv)
{
	double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, kl = 0;
	for (int i = 0; i < nv; i++) {
		mp = fmax(mp, p[i]);
		mq = fmax(mq, q[i]);
	}
	for (int i = 0; i < nv; i++) {
		sp += exp(p[i] - mp);
		sq += exp(q[i] - mq);
	}
	const double lp = mp + log(sp), lq = mq + log(sq);
	for (int i = 0; i < nv; i++)
		kl += exp(p[i] - lp) * ((p[i] - lp) - (q[i] - lq));
	return kl;
}

static int argmax(const float *x, int nv)
{
	int b = 0;
	for (int i = 1; i < nv; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

int main(int argc, char **argv)
{
	if (argc < 6 || argc > 8)
		return die("usage", "kept_ref MODEL.gguf POLICY SET RATIO TOKENS.txt [GEN [PROMPT]]");
	FILE *f = fopen(argv[5], "r");
	if (!f)
		return die(argv[5], "cannot open");
	int32_t *tok = NULL;
	int n = 0, cap = 0, t;
	while (fscanf(f, "%d", &t) == 1) {
		if (n == cap && !(tok = realloc(tok, (size_t)(cap = cap ? 2 * cap : 256) * sizeof *tok)))
			return die(argv[5], "out of memory");
		tok[n++] = t;
	}
	fclose(f);
	if (n == 0)
		return die(argv[5], "no token ids");
	rt_err err = { "" };
	const rt_model_opts o = { .exact = 1, .threads = 0 };
	rt_model *m = rt_model_open(argv[1], &o, &err);
	if (!m)
		return die(argv[1], err.msg);
	const struct kvp_policy *p = rt_registry_find(kvp_registry, kvp_registry_count, argv[2]);
	if (!p)
		return die(argv[2], "no such policy");
	const int gen = argc > 6 ? atoi(argv[6]) : 0;
	const int P = argc > 7 ? atoi(argv[7]) : n;
	if (gen < 0 || P < 1 || P > n)
		return die("usage", "GEN >= 0 and 1 <= PROMPT <= the ids");
	rt_seq s, full;
	if (rt_seq_init(&s, m, p, n + gen, 64, P, &err) != 0 ||
	    rt_seq_init(&full, m, &rt_policy_full, n + gen, 64, P, &err) != 0)
		return die("init", err.msg);
	/* SET and RATIO through the one policy choice of every front door (rt_pick) */
	static const char *const spellings[RT_PICK_N_FIELDS] = { "POLICY", "kv type", "SET",
		"RATIO", "byte ratio", "prefill chunk", "min_kv" };
	const char *sets[64];
	int n_sets = 0;
	char *set = strdup(argv[3]);
	for (char *sv = NULL, *a = strtok_r(set, ",", &sv); a; a = strtok_r(NULL, ",", &sv))
		if (n_sets < 64)
			sets[n_sets++] = a;
	const double R = atof(argv[4]);
	const struct rt_pick_in in = { .reg = &p, .n_reg = 1, .kv_type = (int)s.kv.type,
		.sets = sets, .n_sets = n_sets, .ratio = R > 0 ? R : 0, .spellings = spellings };
	struct rt_pick pk;
	if (rt_pick(&in, &pk, &err) != 0 || rt_seq_apply(&s, &pk, &err) != 0)
		return die("policy", err.msg);
	rt_pick_free(&pk);
	const int nv = m->hp.n_vocab, rest = n - P;
	float *lg = malloc((size_t)(rest > 1 ? rest : 1) * nv * sizeof *lg);
	float *lf = malloc((size_t)(rest > 1 ? rest : 1) * nv * sizeof *lf);
	int *out = calloc((size_t)gen + 1, sizeof *out);
	if (!lg || !lf || !out)
		return die("logits", "out of memory");
	/* the prompt's last logits are the first greedy token's when no ids follow it */
	if (rt_seq_feed(&s, tok, P, lg, RT_LOGITS_LAST, &err) != 0)
		return die("feed", err.msg);
	double kl = 0;
	char *kept = NULL;
	size_t kept_len = 0;
	FILE *ks = open_memstream(&kept, &kept_len);
	if (!ks)
		return die("kept", "out of memory");
	for (int l = 0; l < m->hp.n_layer; l++) {
		fprintf(ks, "%s\"%d\": {", l ? ", " : "", l);
		for (int j = 0; j < m->hp.n_head_kv; j++) {
			const rt_kv_head *h = rt_kv_head_at(&s.kv, l, j);
			fprintf(ks, "%s\"%d\": [", j ? ", " : "", j);
			for (int i = 0; i < h->n; i++)
				fprintf(ks, "%s%d", i ? ", " : "", h->pos[i]);
			fprintf(ks, "]");
		}
		fprintf(ks, "}");
	}
	fclose(ks);
	if (rt_seq_feed(&full, tok, P, NULL, RT_LOGITS_NONE, &err) != 0)
		return die("feed", err.msg);
	if (rest > 0 && (rt_seq_feed(&s, tok + P, rest, lg, RT_LOGITS_ALL, &err) != 0 ||
	                 rt_seq_feed(&full, tok + P, rest, lf, RT_LOGITS_ALL, &err) != 0))
		return die("feed", err.msg);
	for (int i = 0; i + 1 < rest; i++)
		kl += kl_rows(lf + (size_t)i * nv, lg + (size_t)i * nv, nv) / (rest - 1);
	for (int g = 0; g < gen; g++) {
		const float *row = g ? lg : lg + (size_t)(rest > 0 ? rest - 1 : 0) * nv;
		out[g] = argmax(row, nv);
		if (g + 1 < gen && rt_seq_feed(&s, &out[g], 1, lg, RT_LOGITS_LAST, &err) != 0)
			return die("feed", err.msg);
	}
	printf("{\"kept\": {%s}, \"kl\": %.9g, \"tokens\": [", kept, kl);
	for (int g = 0; g < gen; g++)
		printf("%s%d", g ? ", " : "", out[g]);
	printf("]}\n");
	free(kept);
	free(lg);
	free(lf);
	free(out);
	rt_seq_free(&full);
	rt_seq_free(&s);
	rt_model_free(m);
	free(set);
	free(tok);
	return 0;
}
