/*
 * kept_ref: kvpc's own runtime as the reference of the vLLM suite (tests/vllm/test_vllm.py):
 * feeds a prompt, given as token ids, through rt_seq under a library policy on the exact
 * (f32) path and prints the positions each (layer, KV head) keeps at the prompt end, as
 * JSON {"kept": {"LAYER": {"HEAD": [positions...]}}}.
 *
 *   kept_ref MODEL.gguf POLICY SET RATIO TOKENS.txt
 *
 * SET is a --set list "name=value,..." ("" for none), RATIO 0 for the policy's own budget,
 * TOKENS.txt whitespace-separated token ids. Exit status 0, 1 on any error (one line).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/rt_model.h"
#include "policy/rt_policy.h"
#include "policy/rt_seq.h"

static int die(const char *what, const char *msg)
{
	fprintf(stderr, "kept_ref: %s: %s\n", what, msg);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 6)
		return die("usage", "kept_ref MODEL.gguf POLICY SET RATIO TOKENS.txt");
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
	rt_seq s;
	if (rt_seq_init(&s, m, p, n, 64, n, &err) != 0)
		return die("init", err.msg);
	char *set = strdup(argv[3]);
	for (char *sv = NULL, *a = strtok_r(set, ",", &sv); a; a = strtok_r(NULL, ",", &sv))
		if (rt_seq_set(&s, a, &err) != 0)
			return die("set", err.msg);
	const double R = atof(argv[4]);
	if (R > 0 && rt_seq_set_ratio(&s, R, &err) != 0)
		return die("ratio", err.msg);
	if (rt_seq_feed(&s, tok, n, NULL, RT_LOGITS_NONE, &err) != 0)
		return die("feed", err.msg);
	printf("{\"kept\": {");
	for (int l = 0; l < m->hp.n_layer; l++) {
		printf("%s\"%d\": {", l ? ", " : "", l);
		for (int j = 0; j < m->hp.n_head_kv; j++) {
			const rt_kv_head *h = rt_kv_head_at(&s.kv, l, j);
			printf("%s\"%d\": [", j ? ", " : "", j);
			for (int i = 0; i < h->n; i++)
				printf("%s%d", i ? ", " : "", h->pos[i]);
			printf("]");
		}
		printf("}");
	}
	printf("}}\n");
	rt_seq_free(&s);
	rt_model_free(m);
	free(set);
	free(tok);
	return 0;
}
