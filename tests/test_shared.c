/*
 * test_shared: the shared-library ABI (runtime/policy/rt_shared.h, `kvpc build --shared`)
 * and the paged-engine check (compiler/kvp_paged.h, `kvpc check --target paged`).
 * Checked:
 *   - kept-set parity with the runtime: a tiny GQA model (9 query / 3 KV heads and 4 / 1,
 *     head_dim 32, tests/support/tiny_model.h) reads a prompt once under the full cache,
 *     whose store gives the post-RoPE keys and whose layer hook (rt_fwd.on_layer) gives
 *     the post-RoPE queries of the prompt's last rows; kvpc_select on those arrays must
 *     keep exactly the positions the runtime's own sequence (rt_seq under the policy, the
 *     forward's attention and observe) keeps, per (layer, KV head), for knorm and snapkv
 *     with --set values and ratios;
 *   - an independent oracle for knorm: the lowest key norms (in double), ties to the lower
 *     position, budget = prompt / ratio, computed here from the keys;
 *   - the window probe: snapkv observes its `window` parameter's rows, knorm none;
 *   - bad input is a status code and a message, never a crash: unknown policy or
 *     parameter, shape mismatches, NULL arrays, too few window rows, a per-step policy, a
 *     tiered one, an infeasible budget;
 *   - the paged check of every library policy against tests/golden/paged/policies.txt
 *     (reviewed by hand: each refusal names the construct that asks for it);
 *   - `kvpc build --shared` of knorm and snapkv gives a library that dlopen loads, whose
 *     exports answer as the linked ones do, and refuses a per-step policy (h2o).
 * KVPC_UPDATE_GOLDEN=1 rewrites the golden file.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvp_ir.h"
#include "kvp_paged.h"
#include "kvp_sema.h"
#include "kvp_src.h"
#include "model/rt_model.h"
#include "policy/rt_policy.h"
#include "policy/rt_seq.h"
#include "policy/rt_shared.h"
#include "support/tiny_model.h"
#include "support/check_run.h"

#define N_PROMPT 96
#define W_ROWS 40

static const rt_model_opts exact_opts = { .exact = 1, .threads = 0 };

/* What the full-cache run gives a caller: keys [L][H][n][d], values, window queries
 * [L][W][n_head][d] of positions n-W..n-1. */
struct capture {
	int L, H, G, d, n, W;
	float *keys, *values, *queries;
};

static void on_layer(void *user, int layer, int C, int32_t pos0, const float *x, const float *q)
{
	(void)x;
	struct capture *c = user;
	const size_t qd = (size_t)c->H * c->G * c->d;
	for (int r = 0; r < C; r++) {
		const int32_t p = pos0 + r;
		if (p >= c->n - c->W && p < c->n)
			memcpy(c->queries + ((size_t)layer * c->W + (size_t)(p - (c->n - c->W))) * qd,
			       q + (size_t)r * qd, qd * sizeof(float));
	}
}

static void test_tokens(int32_t *t, int n, int vocab, unsigned seed)
{
	for (int i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		t[i] = (int32_t)((seed >> 16) % (unsigned)(vocab - 4)) + 3;
	}
}

/* Feed the prompt under the full cache; fill c from the store and the layer hook. */
static void capture_prompt(rt_model *m, const int32_t *tok, struct capture *c)
{
	c->L = m->hp.n_layer;
	c->H = m->hp.n_head_kv;
	c->G = m->hp.group;
	c->d = m->hp.head_dim;
	c->n = N_PROMPT;
	c->W = W_ROWS;
	const size_t per = (size_t)c->L * c->H * c->n * c->d;
	c->keys = malloc(per * sizeof(float));
	c->values = malloc(per * sizeof(float));
	c->queries = malloc((size_t)c->L * c->W * c->H * c->G * c->d * sizeof(float));
	rt_seq s;
	rt_err err = { "" };
	ck_assert_msg(rt_seq_init(&s, m, &rt_policy_full, N_PROMPT, 32, N_PROMPT, &err) == 0, "%s",
	              err.msg);
	ck_assert_int_eq(s.kv.type, RT_KV_F32);
	s.fwd.on_layer = on_layer;
	s.fwd.layer_user = c;
	ck_assert_msg(rt_seq_feed(&s, tok, N_PROMPT, NULL, RT_LOGITS_NONE, &err) == 0, "%s", err.msg);
	for (int l = 0; l < c->L; l++)
		for (int j = 0; j < c->H; j++) {
			const rt_kv_head *h = rt_kv_head_at(&s.kv, l, j);
			ck_assert_int_eq(h->n, N_PROMPT);
			const size_t o = ((size_t)l * c->H + j) * c->n * c->d;
			for (int i = 0; i < c->n; i++)
				ck_assert_int_eq(h->pos[i], i);
			memcpy(c->keys + o, h->k, (size_t)c->n * c->d * sizeof(float));
			memcpy(c->values + o, h->v, (size_t)c->n * c->d * sizeof(float));
		}
	rt_seq_free(&s);
}

static void capture_free(struct capture *c)
{
	free(c->keys);
	free(c->values);
	free(c->queries);
}

/* The runtime's kept positions per head (sorted) under policy name with sets and ratio. */
static void runtime_kept(rt_model *m, const int32_t *tok, const char *name, const char *set,
                         double ratio, int32_t *keep, int32_t *n_keep)
{
	const struct kvp_policy *p = rt_registry_find(kvp_registry, kvp_registry_count, name);
	ck_assert_ptr_nonnull(p);
	rt_seq s;
	rt_err err = { "" };
	ck_assert_msg(rt_seq_init(&s, m, p, N_PROMPT, 32, N_PROMPT, &err) == 0, "%s", err.msg);
	char buf[128];
	snprintf(buf, sizeof buf, "%s", set ? set : "");
	for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv))
		ck_assert_msg(rt_seq_set(&s, t, &err) == 0, "%s", err.msg);
	if (ratio > 0)
		ck_assert_msg(rt_seq_set_ratio(&s, ratio, &err) == 0, "%s", err.msg);
	ck_assert_msg(rt_seq_feed(&s, tok, N_PROMPT, NULL, RT_LOGITS_NONE, &err) == 0, "%s", err.msg);
	const int H = m->hp.n_head_kv;
	for (int l = 0; l < m->hp.n_layer; l++)
		for (int j = 0; j < H; j++) {
			const rt_kv_head *h = rt_kv_head_at(&s.kv, l, j);
			int32_t *row = keep + ((size_t)l * H + j) * N_PROMPT;
			n_keep[l * H + j] = h->n;
			for (int i = 0; i < h->n; i++) { /* insertion sort: small */
				int32_t v = h->pos[i], k = i;
				for (; k > 0 && row[k - 1] > v; k--)
					row[k] = row[k - 1];
				row[k] = v;
			}
		}
	rt_seq_free(&s);
}

typedef int (*select_fn)(const char *, const char *, double, int, int, int, int, int32_t,
                         const float *, const float *, const uint16_t *, int32_t, const float *,
                         int32_t *, int32_t *, char *, size_t);

/* kvpc_select (fn) on the captured arrays equals the runtime's kept sets. */
static void parity(select_fn fn, rt_model *m, const int32_t *tok, const struct capture *c,
                   const char *name, const char *set, double ratio, int expect_evict)
{
	const int HL = c->L * c->H;
	int32_t *k_rt = calloc((size_t)HL * N_PROMPT, sizeof *k_rt), *n_rt = calloc(HL, sizeof *n_rt);
	int32_t *k_sh = calloc((size_t)HL * N_PROMPT, sizeof *k_sh), *n_sh = calloc(HL, sizeof *n_sh);
	runtime_kept(m, tok, name, set, ratio, k_rt, n_rt);
	char err[256];
	const int rc = fn(name, set, ratio, c->L, c->H, c->G, c->d, c->n, c->keys, c->values, NULL,
	                  c->W, c->queries, k_sh, n_sh, err, sizeof err);
	ck_assert_msg(rc == RT_SHARED_OK, "%s: %s", name, err);
	int evicted = 0;
	for (int hh = 0; hh < HL; hh++) {
		ck_assert_msg(n_sh[hh] == n_rt[hh], "%s %s: head %d keeps %d, runtime %d", name,
		              set ? set : "", hh, n_sh[hh], n_rt[hh]);
		evicted |= n_rt[hh] < N_PROMPT;
		for (int i = 0; i < n_rt[hh]; i++)
			ck_assert_msg(k_sh[(size_t)hh * N_PROMPT + i] == k_rt[(size_t)hh * N_PROMPT + i],
			              "%s %s: head %d entry %d: %d vs runtime %d", name, set ? set : "", hh,
			              i, k_sh[(size_t)hh * N_PROMPT + i], k_rt[(size_t)hh * N_PROMPT + i]);
	}
	ck_assert_int_eq(evicted, expect_evict);
	free(k_rt);
	free(n_rt);
	free(k_sh);
	free(n_sh);
}

static rt_model *open_gqa(int gqa)
{
	rt_err err = { "" };
	rt_model *m = tiny_model_open_gqa(gqa, 71u + (unsigned)gqa, &exact_opts, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	return m;
}

/* the cases: policy, --set list, ratio, whether anything is evicted */
static const struct {
	const char *name, *set;
	double ratio;
	int evicts;
} cases[] = {
	{ "knorm", NULL, 4, 1 },
	{ "knorm", "kept=0.3", 0, 1 },
	{ "snapkv", "capacity=40,window=16", 0, 1 },
	{ "snapkv", "window=8", 3, 1 },
	{ "snapkv", NULL, 0, 0 },       /* capacity 1024 > the prompt: keeps everything */
	{ "full", NULL, 0, 0 },
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

START_TEST(select_equals_runtime)
{
	rt_model *m = open_gqa(_i / N_CASES);
	int32_t tok[N_PROMPT];
	test_tokens(tok, N_PROMPT, m->hp.n_vocab, 5u + (unsigned)_i);
	struct capture c;
	capture_prompt(m, tok, &c);
	const int k = _i % N_CASES;
	parity(kvpc_select, m, tok, &c, cases[k].name, cases[k].set, cases[k].ratio, cases[k].evicts);
	capture_free(&c);
	rt_model_free(m);
}
END_TEST

/* knorm's rule from the keys alone: per head the max(N/R, min(64, N)) lowest norms (the
 * library knorm's floor, `min 64 tokens`, over N/R = 24), ties to the lower position
 * (norms summed in double and rounded to f32, the precision of a score) */
START_TEST(knorm_oracle)
{
	rt_model *m = open_gqa(0);
	int32_t tok[N_PROMPT];
	test_tokens(tok, N_PROMPT, m->hp.n_vocab, 11u);
	struct capture c;
	capture_prompt(m, tok, &c);
	const int HL = c.L * c.H, B = N_PROMPT / 4 > 64 ? N_PROMPT / 4 : 64;
	int32_t *keep = calloc((size_t)HL * N_PROMPT, sizeof *keep), *nk = calloc(HL, sizeof *nk);
	char err[256];
	ck_assert_int_eq(kvpc_select("knorm", "", 4, c.L, c.H, c.G, c.d, c.n, c.keys, NULL, NULL, 0,
	                             NULL, keep, nk, err, sizeof err), RT_SHARED_OK);
	for (int hh = 0; hh < HL; hh++) {
		double norm[N_PROMPT];
		for (int i = 0; i < N_PROMPT; i++) {
			double s = 0;
			for (int j = 0; j < c.d; j++) {
				const double x = c.keys[((size_t)hh * N_PROMPT + i) * c.d + j];
				s += x * x;
			}
			norm[i] = (float)sqrt(s); /* scores are f32: norms equal in f32 tie */
		}
		ck_assert_int_eq(nk[hh], B);
		int got[N_PROMPT] = { 0 };
		for (int i = 0; i < B; i++)
			got[keep[(size_t)hh * N_PROMPT + i]] = 1;
		for (int i = 0; i < N_PROMPT; i++) {
			int rank = 0; /* entries that go before i */
			for (int k = 0; k < N_PROMPT; k++)
				rank += norm[k] < norm[i] || (norm[k] == norm[i] && k < i);
			ck_assert_msg(got[i] == (rank < B), "head %d pos %d rank %d kept %d norm %.9g", hh,
			              i, rank, got[i], norm[i]);
		}
	}
	free(keep);
	free(nk);
	capture_free(&c);
	rt_model_free(m);
}
END_TEST

START_TEST(window_probe)
{
	int32_t w = -1;
	char err[256];
	ck_assert_int_eq(kvpc_window("snapkv", NULL, 0, 3, 32, 96, &w, err, sizeof err), 0);
	ck_assert_int_eq(w, 32);
	ck_assert_int_eq(kvpc_window("snapkv", "window=16", 4, 3, 32, 96, &w, err, sizeof err), 0);
	ck_assert_int_eq(w, 16);
	ck_assert_int_eq(kvpc_window("snapkv", "window=200", 0, 3, 32, 96, &w, err, sizeof err), 0);
	ck_assert_int_eq(w, 96); /* the whole prompt */
	ck_assert_int_eq(kvpc_window("knorm", NULL, 0, 3, 32, 96, &w, err, sizeof err), 0);
	ck_assert_int_eq(w, 0);
	ck_assert_int_eq(kvpc_window("nope", NULL, 0, 3, 32, 96, &w, err, sizeof err),
	                 RT_SHARED_E_POLICY);
	/* a policy that observes nothing still has its --set names and ratio checked */
	ck_assert_int_eq(kvpc_window("knorm", "nope=1", 0, 3, 32, 96, &w, err, sizeof err),
	                 RT_SHARED_E_PARAM);
	ck_assert_ptr_nonnull(strstr(err, "nope"));
	ck_assert_int_eq(kvpc_window("knorm", NULL, 0.5, 3, 32, 96, &w, err, sizeof err),
	                 RT_SHARED_E_PARAM);
	ck_assert_int_eq(kvpc_window("snapkv", NULL, 0, 3, 32, 96, NULL, err, sizeof err),
	                 RT_SHARED_E_ARG);
}
END_TEST

/* one bad request: the status and a word of the message */
static void bad(const char *policy, const char *set, double ratio, int n_layer, int32_t n,
                int use_keys, int32_t n_window, int use_q, int want, const char *word)
{
	enum { L = 2, H = 3, G = 3, D = 32, N = 64 };
	static float keys[L * H * N * D], q[L * N * H * G * D];
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
		keys[i] = (float)((i * 7919u) % 101u) / 50.0f - 1.0f;
	int32_t keep[L * H * N], nk[L * H];
	char err[256] = "unset";
	const int rc = kvpc_select(policy, set, ratio, n_layer, H, G, D, n, use_keys ? keys : NULL,
	                           keys, NULL, n_window, use_q ? q : NULL, keep, nk, err, sizeof err);
	ck_assert_msg(rc == want, "%s %s: status %d, want %d (%s)", policy ? policy : "(null)",
	              set ? set : "", rc, want, err);
	ck_assert_msg(strstr(err, word) != NULL, "message '%s' lacks '%s'", err, word);
	/* a NULL err buffer is allowed too */
	ck_assert_int_eq(kvpc_select(policy, set, ratio, n_layer, H, G, D, n, use_keys ? keys : NULL,
	                             keys, NULL, n_window, use_q ? q : NULL, keep, nk, NULL, 0), want);
}

START_TEST(bad_input_is_an_error)
{
	bad("nope", NULL, 0, 2, 64, 1, 0, 0, RT_SHARED_E_POLICY, "not in this library");
	bad(NULL, NULL, 0, 2, 64, 1, 0, 0, RT_SHARED_E_ARG, "policy name");
	bad("knorm", "nope=1", 0, 2, 64, 1, 0, 0, RT_SHARED_E_PARAM, "nope");
	bad("knorm", "kept=abc", 0, 2, 64, 1, 0, 0, RT_SHARED_E_PARAM, "kept");
	bad("knorm", NULL, 0.5, 2, 64, 1, 0, 0, RT_SHARED_E_PARAM, "ratio");
	bad("knorm", NULL, 0, 0, 64, 1, 0, 0, RT_SHARED_E_ARG, "n_layer");
	bad("knorm", NULL, 0, 2, 0, 1, 0, 0, RT_SHARED_E_ARG, "prompt tokens");
	bad("knorm", NULL, 0, 2, 64, 0, 0, 0, RT_SHARED_E_ARG, "keys is NULL");
	bad("knorm", NULL, 0, 2, 64, 1, 65, 1, RT_SHARED_E_ARG, "n_window");
	bad("knorm", NULL, 0, 2, 64, 1, 4, 0, RT_SHARED_E_ARG, "queries");
	bad("snapkv", "window=16", 0, 2, 64, 1, 8, 1, RT_SHARED_E_WINDOW, "last 16");
	bad("snapkv", "capacity=4,window=16", 0, 2, 64, 1, 16, 1, RT_SHARED_E_BUDGET, "snapkv");
	bad("h2o", NULL, 0, 2, 64, 1, 64, 1, RT_SHARED_E_UNSUPPORTED, "prompt end");
	bad("kivi_q8", NULL, 0, 2, 64, 1, 0, 0, RT_SHARED_E_UNSUPPORTED, "tiers");
	bad("gracekv", NULL, 0, 2, 64, 1, 0, 0, RT_SHARED_E_UNSUPPORTED, "trace");
}
END_TEST

/* every library policy through the paged check, in file order; diagnostics verbatim */
START_TEST(paged_golden)
{
	FILE *ls = popen("ls policies/*.kvp", "r");
	ck_assert_ptr_nonnull(ls);
	char *got = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&got, &len);
	char path[512];
	while (fgets(path, sizeof path, ls)) {
		path[strcspn(path, "\n")] = 0;
		char e[512];
		kvp_src *src = kvp_src_open(path, e, sizeof e);
		ck_assert_msg(src != NULL, "%s", e);
		struct kvp_ir ir;
		ck_assert_msg(kvp_compile(src, &ir) == 0, "%s", kvp_src_diags(src));
		if (kvp_paged_check(&ir, src) == 0)
			fprintf(out, "%s: ok (policy %s, paged)\n", path, ir.name);
		fputs(kvp_src_diags(src), out);
		kvp_ir_free(&ir);
		kvp_src_free(src);
	}
	pclose(ls);
	fclose(out);
	const char *gp = "tests/golden/paged/policies.txt";
	if (getenv("KVPC_UPDATE_GOLDEN")) {
		mkdir("tests/golden/paged", 0755);
		FILE *g = fopen(gp, "w");
		fputs(got, g);
		fclose(g);
	}
	FILE *g = fopen(gp, "r");
	ck_assert_msg(g != NULL, "missing golden %s (run with KVPC_UPDATE_GOLDEN=1)", gp);
	char *want = calloc(1, 1 << 16);
	const size_t wl = fread(want, 1, (1 << 16) - 1, g);
	fclose(g);
	ck_assert_msg(wl == len && !memcmp(want, got, len), "paged check differs from %s:\n%s", gp,
	              got);
	/* the library's two paged policies are there, and the refusals name their reasons */
	ck_assert_ptr_nonnull(strstr(got, "policies/knorm.kvp: ok"));
	ck_assert_ptr_nonnull(strstr(got, "policies/snapkv.kvp: ok"));
	ck_assert_ptr_nonnull(strstr(got, "paged: positions compacted"));
	ck_assert_ptr_nonnull(strstr(got, "paged: merging"));
	ck_assert_ptr_nonnull(strstr(got, "paged: precision tiers"));
	ck_assert_ptr_nonnull(strstr(got, "paged: per-head budgets that differ"));
	ck_assert_ptr_nonnull(strstr(got, "paged: per-step observe"));
	free(want);
	free(got);
}
END_TEST

/* the built library: dlopen, same answers as the linked functions; h2o refused */
START_TEST(build_shared_library)
{
	mkdir("tests/tmp", 0755);
	char so[256], cmd[768];
	snprintf(so, sizeof so, "%s/tests/tmp/libkvpc_shared_%d.so", getcwd(cmd, sizeof cmd),
	         (int)getpid());
	snprintf(cmd, sizeof cmd, "build/kvpc build --shared policies/knorm.kvp policies/snapkv.kvp "
	         "-o %s 2>&1", so);
	ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
	void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(dl != NULL, "%s", dlerror());
	int (*ver)(void) = (int (*)(void))dlsym(dl, "kvpc_abi_version");
	const char *(*pol)(void) = (const char *(*)(void))dlsym(dl, "kvpc_policies");
	select_fn sel = (select_fn)dlsym(dl, "kvpc_select");
	ck_assert(ver && pol && sel);
	ck_assert_ptr_null(dlsym(dl, "rt_kv_append")); /* only the ABI is exported */
	ck_assert_int_eq(ver(), RT_SHARED_ABI);
	ck_assert_str_eq(pol(), "knorm,snapkv");
	rt_model *m = open_gqa(0);
	int32_t tok[N_PROMPT];
	test_tokens(tok, N_PROMPT, m->hp.n_vocab, 23u);
	struct capture c;
	capture_prompt(m, tok, &c);
	parity(sel, m, tok, &c, "snapkv", "capacity=30,window=12", 0, 1);
	parity(sel, m, tok, &c, "knorm", NULL, 2, 1);
	char err[256];
	int32_t keep[8], nk[8];
	ck_assert_int_eq(sel("h2o", NULL, 0, 1, 1, 1, 32, 8, c.keys, NULL, NULL, 0, NULL, keep, nk,
	                     err, sizeof err), RT_SHARED_E_POLICY);
	capture_free(&c);
	rt_model_free(m);
	dlclose(dl);
	unlink(so);
	snprintf(cmd, sizeof cmd, "build/kvpc build --shared policies/h2o.kvp -o %s 2>&1", so);
	FILE *p = popen(cmd, "r");
	char outb[4096] = "";
	const size_t nr = fread(outb, 1, sizeof outb - 1, p);
	outb[nr] = 0;
	ck_assert_int_ne(pclose(p), 0);
	ck_assert_msg(strstr(outb, "policies/h2o.kvp:") && strstr(outb, "paged: per-step observe"),
	              "%s", outb);
	ck_assert_int_ne(access(so, F_OK), 0);
}
END_TEST

static Suite *shared_suite(void)
{
	Suite *s = suite_create("shared");
	TCase *tc = tcase_create("shared");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, select_equals_runtime, 0, 2 * N_CASES);
	tcase_add_test(tc, knorm_oracle);
	tcase_add_test(tc, window_probe);
	tcase_add_test(tc, bad_input_is_an_error);
	tcase_add_test(tc, paged_golden);
	tcase_add_test(tc, build_shared_library);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const int failed = check_run(shared_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
