/*
 * test_ab: the A/B engine (runtime/eval/rt_ab.c, `BIN ab`) and its front `kvpc ab`, end to end
 * on a tiny synthetic GGUF model (grouped-query: 9 query / 3 KV heads) written by the test,
 * with a real policy (policies/h2o.kvp; "full" is the built-in full cache) compiled by `kvpc build`.
 *
 * Oracles: a policy against itself must give identical metrics, a per-token NLL
 * difference of exactly 0 with the bootstrap CI exactly [0, 0] and a "tie ... not
 * significant" verdict; the full policy against the reference must give KL exactly 0 (the
 * same chunks reach the same code), a small-budget policy KL > 0 and less KV memory; the
 * reference perplexity must equal rt_eval_ppl's (another code path: rt_model_forward
 * without rt_seq) to 1e-6 relative; the JSON must parse (a small recursive-descent
 * parser below) and carry the metadata keys, the model and text SHA-256 must equal
 * coreutils' sha256sum, the CSV must be rectangular and the SVG well-formed enough to
 * hold one panel per metric.
 */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eval/rt_eval.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"
#include "base/rt_util.h"
#include "support/tiny_model.h"
#include "support/proc_run.h"
#include "support/xml_check.h"
#include "support/check_run.h"

static char g_kvpc[PATH_MAX + 16];
static char g_tmp[PATH_MAX];
static char g_model[PATH_MAX + 32], g_text[PATH_MAX + 32], g_bin[PATH_MAX + 32];

#define CTX_TOKENS 160

/* ---- a small JSON reader (RFC 8259 syntax; numbers as double) ---------------------------- */

enum jt { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
	enum jt t;
	double num;        /* J_NUM, J_BOOL (0/1) */
	char *str;         /* J_STR */
	int n;             /* J_ARR, J_OBJ */
	char **keys;       /* J_OBJ [n] */
	struct jv *items;  /* [n] */
} jv;

typedef struct jp {
	const char *s;
	int bad;
} jp;

static void jws(jp *p)
{
	while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
		p->s++;
}

static char *jstr(jp *p)
{
	if (*p->s != '"') {
		p->bad = 1;
		return NULL;
	}
	p->s++;
	size_t cap = 64, len = 0;
	char *out = malloc(cap);
	while (*p->s && *p->s != '"') {
		char c = *p->s++;
		if ((unsigned char)c < 0x20) {
			p->bad = 1;
			break;
		}
		if (c == '\\') {
			char e = *p->s++;
			const char *map = strchr("\"\\/bfnrt", e);
			if (e == 'u') {
				for (int i = 0; i < 4; i++)
					if (!isxdigit((unsigned char)p->s[i]))
						p->bad = 1;
				if (!p->bad)
					p->s += 4;
				c = '?';
			} else if (map && e) {
				c = "\"\\/\b\f\n\r\t"[map - "\"\\/bfnrt"];
			} else {
				p->bad = 1;
				break;
			}
		}
		if (len + 2 > cap)
			out = realloc(out, cap *= 2);
		out[len++] = c;
	}
	out[len] = 0;
	if (*p->s != '"')
		p->bad = 1;
	else
		p->s++;
	return out;
}

static void jparse(jp *p, jv *v, int depth)
{
	memset(v, 0, sizeof *v);
	jws(p);
	if (depth > 64) {
		p->bad = 1;
		return;
	}
	if (*p->s == '{' || *p->s == '[') {
		int obj = *p->s == '{';
		v->t = obj ? J_OBJ : J_ARR;
		p->s++;
		jws(p);
		if (*p->s == (obj ? '}' : ']')) {
			p->s++;
			return;
		}
		for (;;) {
			v->items = realloc(v->items, (size_t)(v->n + 1) * sizeof *v->items);
			if (obj) {
				v->keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof *v->keys);
				jws(p);
				v->keys[v->n] = jstr(p);
				jws(p);
				if (p->bad || *p->s != ':') {
					p->bad = 1;
					memset(&v->items[v->n++], 0, sizeof *v->items);
					return;
				}
				p->s++;
			}
			jparse(p, &v->items[v->n++], depth + 1);
			if (p->bad)
				return;
			jws(p);
			if (*p->s == ',') {
				p->s++;
				continue;
			}
			if (*p->s == (obj ? '}' : ']')) {
				p->s++;
				return;
			}
			p->bad = 1;
			return;
		}
	} else if (*p->s == '"') {
		v->t = J_STR;
		v->str = jstr(p);
	} else if (!strncmp(p->s, "true", 4) || !strncmp(p->s, "false", 5)) {
		v->t = J_BOOL;
		v->num = *p->s == 't';
		p->s += *p->s == 't' ? 4 : 5;
	} else if (!strncmp(p->s, "null", 4)) {
		v->t = J_NULL;
		p->s += 4;
	} else {
		/* -? int frac? exp? */
		const char *q = p->s;
		if (*q == '-')
			q++;
		if (!isdigit((unsigned char)*q)) {
			p->bad = 1;
			return;
		}
		char *end;
		v->t = J_NUM;
		v->num = strtod(p->s, &end);
		p->s = end;
	}
}

static void jfree(jv *v)
{
	for (int i = 0; i < v->n; i++) {
		if (v->keys)
			free(v->keys[i]);
		jfree(&v->items[i]);
	}
	free(v->keys);
	free(v->items);
	free(v->str);
}

/* Member by a dotted path ("meta.policies.A.name"; array elements as numbers). */
static const jv *jget(const jv *v, const char *path)
{
	char buf[256];
	snprintf(buf, sizeof buf, "%s", path);
	char *save = NULL;
	for (char *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save)) {
		const jv *next = NULL;
		if (v->t == J_OBJ) {
			for (int i = 0; i < v->n; i++)
				if (!strcmp(v->keys[i], k))
					next = &v->items[i];
		} else if (v->t == J_ARR && isdigit((unsigned char)k[0])) {
			int i = atoi(k);
			next = i < v->n ? &v->items[i] : NULL;
		}
		v = next;
	}
	return v;
}

static double jnum(const jv *root, const char *path)
{
	const jv *v = jget(root, path);
	ck_assert_msg(v && (v->t == J_NUM || v->t == J_BOOL), "JSON: %s missing or not a number",
	              path);
	return v->num;
}

static const char *jstrv(const jv *root, const char *path)
{
	const jv *v = jget(root, path);
	ck_assert_msg(v && v->t == J_STR, "JSON: %s missing or not a string", path);
	return v->str;
}

static void load_json(const char *path, jv *out)
{
	rt_err e;
	size_t n;
	char *text = rt_read_file(path, &n, &e);
	ck_assert_msg(text, "%s", e.msg);
	jp p = { text, 0 };
	jparse(&p, out, 0);
	jws(&p);
	ck_assert_msg(!p.bad && *p.s == 0, "%s: invalid JSON near byte %ld", path,
	              (long)(p.s - text));
	free(text);
}

START_TEST(json_reader_rejects_bad_json)
{
	const char *bad[] = { "{", "{\"a\" 1}", "[1,]", "{\"a\":tru}", "\"\x01\"", "[01x]", NULL };
	for (int i = 0; bad[i]; i++) {
		jp p = { bad[i], 0 };
		jv v;
		jparse(&p, &v, 0);
		jws(&p);
		ck_assert_msg(p.bad || *p.s != 0, "accepted %s", bad[i]);
		jfree(&v);
	}
	jp p = { "{\"a\": [1, {\"b\": -2.5e1}], \"c\": \"x\\ny\", \"d\": null}", 0 };
	jv v;
	jparse(&p, &v, 0);
	ck_assert(!p.bad);
	ck_assert(jnum(&v, "a.1.b") == -25);
	ck_assert_str_eq(jstrv(&v, "c"), "x\ny");
	jfree(&v);
}
END_TEST

/* ---- running programs ------------------------------------------------------------------- */

/* Run argv (argv[0] a path) with stdout and stderr captured (heap strings, caller frees;
 * killed after 600 s, the suite's time limit). Returns the exit status (128 + signal when
 * killed). */
static int run(char *const argv[], char **out, char **err)
{
	int rc = proc_exec(argv, 600, out, err);
	ck_assert_msg(rc >= 0, "%s: could not be run", argv[0]);
	return rc;
}

/* `BIN ab` with the model and text and extra arguments (NULL-terminated). */
static int run_ab(char **out, char **err, ...)
{
	char *argv[48];
	int k = 0;
	char ctx[32];
	snprintf(ctx, sizeof ctx, "%d", CTX_TOKENS);
	argv[k++] = g_bin;
	argv[k++] = "ab";
	argv[k++] = "--model";
	argv[k++] = g_model;
	argv[k++] = "--text";
	argv[k++] = g_text;
	argv[k++] = "--ctx";
	argv[k++] = ctx;
	argv[k++] = "--chunk";
	argv[k++] = "48";
	va_list ap;
	va_start(ap, err);
	for (char *a; (a = va_arg(ap, char *)) && k < 47;)
		argv[k++] = a;
	va_end(ap);
	argv[k] = NULL;
	return run(argv, out, err);
}

static void sha256sum(const char *path, char out[65])
{
	char cmd[PATH_MAX + 32];
	snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	char line[PATH_MAX + 80] = "";
	ck_assert_ptr_nonnull(fgets(line, sizeof line, p));
	pclose(p);
	memcpy(out, line, 64);
	out[64] = 0;
}

static void tmp_path(char *buf, size_t cap, const char *name)
{
	snprintf(buf, cap, "%s/%s", g_tmp, name);
}

/* ---- tests ------------------------------------------------------------------------------ */

static const char *const SAME_METRICS[] = {
	"ppl", "kld_mean", "kld_p99", "kld_max", "ppl_ratio", "same_top1", "rms_dp",
	"kv_entries_peak", "kv_bytes_peak", "compression", "bytes_compression", "compress_events", NULL,
};

START_TEST(policy_against_itself_ties_exactly)
{
	char json[PATH_MAX + 16];
	tmp_path(json, sizeof json, "self.json");
	char *out, *err;
	int rc = run_ab(&out, &err, "--a", "h2o", "--b", "h2o", "--ratio", "4", "--json", json,
	                NULL);
	ck_assert_msg(rc == 0, "ab failed (%d): %s", rc, err);
	ck_assert_msg(strstr(out, "tie") && strstr(out, "not significant"), "verdict:\n%s", out);
	jv j;
	load_json(json, &j);
	for (int i = 0; SAME_METRICS[i]; i++) {
		char pa[96], pb[96];
		snprintf(pa, sizeof pa, "results.0.A.%s", SAME_METRICS[i]);
		snprintf(pb, sizeof pb, "results.0.B.%s", SAME_METRICS[i]);
		ck_assert_msg(jnum(&j, pa) == jnum(&j, pb), "%s: %.17g vs %.17g", SAME_METRICS[i],
		              jnum(&j, pa), jnum(&j, pb));
	}
	/* the policy really compressed (otherwise the test would prove little) */
	ck_assert(jnum(&j, "results.0.A.compress_events") > 0);
	ck_assert(jnum(&j, "results.0.A.kld_mean") > 0);
	ck_assert(jnum(&j, "results.0.nll_diff.mean") == 0);
	ck_assert(jnum(&j, "results.0.nll_diff.ci_lo") == 0);
	ck_assert(jnum(&j, "results.0.nll_diff.ci_hi") == 0);
	ck_assert(jnum(&j, "results.0.significant") == 0);
	ck_assert_str_eq(jstrv(&j, "results.0.better"), "tie");
	jfree(&j);
	free(out);
	free(err);
}
END_TEST

static double at(const jv *j, int k, const char *side, const char *m)
{
	char p[128];
	snprintf(p, sizeof p, "results.%d.%s.%s", k, side, m);
	return jnum(j, p);
}

/* full_vs_small_budget's results per ratio (2, 8): A (full) is the reference itself, B
 * (h2o) compressed within its budget, more at the higher ratio. */
static void fvh_check_results(const jv *j)
{
	for (int k = 0; k < 2; k++) {
#define AT(side, m) at(j, k, side, m)
		ck_assert(AT("A", "kld_mean") == 0);
		ck_assert(AT("A", "kld_max") == 0);
		ck_assert(AT("A", "ppl_ratio") == 1);
		ck_assert(AT("A", "same_top1") == 1);
		ck_assert(AT("A", "rms_dp") == 0);
		ck_assert(AT("A", "compress_events") == 0);
		ck_assert(AT("A", "kv_entries_peak") == 2 * 3 * CTX_TOKENS); /* layers x KV heads x N */
		ck_assert_msg(AT("B", "kld_mean") > 0, "h2o KL %g", AT("B", "kld_mean"));
		ck_assert(AT("B", "kld_max") >= AT("B", "kld_p99"));
		ck_assert(AT("B", "kv_entries_peak") < AT("A", "kv_entries_peak"));
		ck_assert(AT("B", "compress_events") > 0);
		/* budget N/R per head, plus at most one chunk before compress */
		double R = k == 0 ? 2 : 8;
		ck_assert_msg(AT("B", "kv_entries_peak") <= 2 * 3 * (CTX_TOKENS / R + 48),
		              "peak %g at ratio %g", AT("B", "kv_entries_peak"), R);
		ck_assert(AT("B", "compression") > 1);
#undef AT
	}
	ck_assert(jnum(j, "results.1.B.kld_mean") > jnum(j, "results.0.B.kld_mean"));
	ck_assert(jnum(j, "results.1.B.compression") > jnum(j, "results.0.B.compression"));
	/* at ratio 8 h2o's budget, 160 / 8 = 20 entries, is under its `min 64 tokens`: the
	 * floor holds 64 (160 / 64 = 2.5x) and the side says so, as ppl does; the full cache
	 * has no note */
	ck_assert_double_eq_tol(jnum(j, "results.1.B.compression"), 160.0 / 64, 1e-7);
	ck_assert_str_eq(jstrv(j, "results.1.B.budget_notes.0"),
	                 "the floor (min_kv, or the policy's budget min) raised the budget");
	ck_assert_ptr_null(jget(j, "results.1.A.budget_notes.0"));
}

/* full_vs_small_budget's run metadata (j, read from the file json): the given commit,
 * hashes from coreutils' sha256sum (an independent implementation), the parameters in
 * effect, the bootstrap seed. */
static void fvh_check_meta(const jv *j, const char *json)
{
	char sha[65];
	ck_assert_str_eq(jstrv(j, "meta.commit"), "abc123");
	ck_assert_str_eq(jstrv(j, "meta.task"), "ppl");
	sha256sum(g_model, sha);
	ck_assert_str_eq(jstrv(j, "meta.model_sha256"), sha);
	sha256sum(g_text, sha);
	ck_assert_str_eq(jstrv(j, "meta.text_sha256"), sha);
	ck_assert(jnum(j, "meta.tokens") == CTX_TOKENS);
	ck_assert(jnum(j, "meta.threads") == 1);
	ck_assert(jnum(j, "meta.ratios.0") == 2 && jnum(j, "meta.ratios.1") == 8);
	ck_assert_str_eq(jstrv(j, "meta.policies.A.name"), "full");
	ck_assert_str_eq(jstrv(j, "meta.policies.B.name"), "h2o");
	ck_assert_int_eq((int)strlen(jstrv(j, "meta.policies.B.source_hash")), 16);
	ck_assert(jnum(j, "meta.policies.B.params.heavy") == 0.1);
	ck_assert(jnum(j, "meta.policies.B.params.recent") == 0.1);
	ck_assert(jget(j, "meta.policies.A.params") &&
	          jget(j, "meta.policies.A.params")->t == J_OBJ);
	ck_assert(jnum(j, "meta.bootstrap.resamples") == 1000);
	/* the default seed 0x6b7670632d616221 is above 2^53: written as a decimal string so a
	 * parser reading numbers as doubles cannot round it */
	ck_assert_str_eq(jstrv(j, "meta.bootstrap.seed"), "7743500180575576609");
	ck_assert_str_eq(jstrv(j, "results.0.nll_diff.seed"), "7743500180575576609");
	/* and Python's json module (an independent parser) reads the file and the seed */
	if (system("command -v python3 >/dev/null 2>&1") == 0) {
		char cmd[PATH_MAX + 400];
		snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
		         "assert int(d[\"meta\"][\"bootstrap\"][\"seed\"]) == 0x6b7670632d616221; "
		         "assert len(d[\"results\"]) == 2' '%s'", json);
		ck_assert_msg(system(cmd) == 0, "python3 json could not read %s", json);
	}
}

/* full_vs_small_budget's reference perplexity through another code path (rt_eval_ppl:
 * rt_model_forward, no rt_seq). */
static void fvh_check_reference(const jv *j)
{
	rt_err e;
	rt_gguf *g = rt_gguf_open(g_model, &e);
	ck_assert_msg(g, "%s", e.msg);
	rt_tokenizer *tok = rt_tokenizer_init(g, &e);
	const rt_model_opts eo = { .exact = 1, .threads = 0 };
	rt_model *m = rt_model_load_opts(g, &eo, &e);
	rt_gguf_close(g);
	ck_assert(tok && m);
	size_t len;
	char *text = rt_read_file(g_text, &len, &e);
	int32_t ids[4096];
	int64_t n = rt_tokenize(tok, text, len, 0, ids, 4096, &e);
	ck_assert(n >= CTX_TOKENS);
	rt_ppl_opts po = { .chunk = 64 };
	rt_ppl_result pr;
	ck_assert_int_eq(rt_eval_ppl(m, ids, CTX_TOKENS, &po, NULL, NULL, &pr, &e), 0);
	double ref = jnum(j, "reference.ppl");
	ck_assert_msg(fabs(ref - pr.ppl) <= 1e-6 * pr.ppl, "reference ppl %.9g vs rt_eval %.9g",
	              ref, pr.ppl);
	ck_assert(fabs(jnum(j, "results.0.A.ppl") - pr.ppl) <= 1e-6 * pr.ppl);
	free(text);
	rt_model_free(m);
	rt_tokenizer_free(tok);
}

/* full_vs_small_budget's CSV: header + (ref, A, B) per ratio, all rows with the header's
 * field count. */
static void fvh_check_csv(const char *csv)
{
	rt_err e;
	size_t len;
	char *c = rt_read_file(csv, &len, &e);
	ck_assert_ptr_nonnull(c);
	int rows = 0, fields0 = -1;
	for (char *line = c; *line;) {
		int fields = 1, q = 0;
		char *s = line;
		for (; *s && (q || *s != '\n'); s++) {
			if (*s == '"')
				q = !q;
			else if (*s == ',' && !q)
				fields++;
		}
		if (fields0 < 0)
			fields0 = fields;
		ck_assert_msg(fields == fields0, "CSV row %d has %d fields, header %d", rows, fields,
		              fields0);
		rows++;
		line = *s ? s + 1 : s;
	}
	ck_assert_int_eq(rows, 1 + 3 * 2);
	ck_assert(strstr(c, "model_sha256") && strstr(c, "abc123") && strstr(c, "kld_mean"));
	free(c);
}

/* full_vs_small_budget's SVG: one document holding one nested panel per plotted metric. */
static void fvh_check_svg(const char *svg)
{
	rt_err e;
	size_t len;
	char *c = rt_read_file(svg, &len, &e);
	ck_assert_ptr_nonnull(c);
	ck_assert(!strncmp(c, "<?xml", 5));
	int svgs = 0, closes = 0;
	for (char *s = c; (s = strstr(s, "<svg")); s++)
		svgs++;
	for (char *s = c; (s = strstr(s, "</svg>")); s++)
		closes++;
	ck_assert_int_eq(svgs, closes);
	ck_assert_int_ge(svgs, 1 + 1 + 6);
	ck_assert(strstr(c, "kld_mean") && strstr(c, "h2o"));
	const char *bad_xml = xml_check(c);
	ck_assert_msg(bad_xml == NULL, "%s: %s", svg, bad_xml);
	/* the verdict panel (paired dNLL interval per ratio around the zero line), error bars
	 * (mean KL), and the text with its token count in the title */
	ck_assert(strstr(c, "verdict: paired dNLL, 95% bootstrap CI") && strstr(c, "class=\"ref\""));
	ck_assert(strstr(c, "class=\"errbar\""));
	char want[PATH_MAX + 64];
	snprintf(want, sizeof want, "; %s, %d tokens (%d scored)", g_text, CTX_TOKENS, CTX_TOKENS - 1);
	ck_assert_msg(strstr(c, want), "title lacks '%s'", want);
	free(c);
}

START_TEST(full_vs_small_budget)
{
	char json[PATH_MAX + 16], csv[PATH_MAX + 16], svg[PATH_MAX + 16];
	tmp_path(json, sizeof json, "fvh.json");
	tmp_path(csv, sizeof csv, "fvh.csv");
	tmp_path(svg, sizeof svg, "fvh.svg");
	char *out, *err;
	int rc = run_ab(&out, &err, "--a", "full", "--b", "h2o", "--ratio", "2,8", "--commit",
	                "abc123", "--threads", "1", "--json", json, "--csv", csv, "--plot", svg,
	                NULL);
	ck_assert_msg(rc == 0, "ab failed (%d): %s", rc, err);
	ck_assert_msg(strstr(out, "== compression ratio 2") && strstr(out, "== compression ratio 8"),
	              "%s", out);
	jv j;
	load_json(json, &j);
	fvh_check_results(&j);
	fvh_check_meta(&j, json);
	fvh_check_reference(&j);
	jfree(&j);
	fvh_check_csv(csv);
	fvh_check_svg(svg);
	free(out);
	free(err);
}
END_TEST

START_TEST(kvpc_ab_front_builds_and_runs)
{
	if (access(g_kvpc, X_OK) != 0)
		ck_abort_msg("%s missing", g_kvpc);
	char ctx[16];
	snprintf(ctx, sizeof ctx, "%d", CTX_TOKENS);
	char *argv[] = { g_kvpc, "ab", "policies/h2o.kvp", "policies/h2o.kvp", "--model", g_model,
		         "--text", g_text, "--ctx", ctx, "--ratio", "4", NULL };
	char *out, *err;
	int rc = run(argv, &out, &err);
	ck_assert_msg(rc == 0, "kvpc ab failed (%d): %s", rc, err);
	ck_assert_msg(strstr(out, "A = h2o") && strstr(out, "B = h2o") && strstr(out, "tie"),
	              "%s", out);
	free(out);
	free(err);
	/* a ratio whose budget cannot hold a side's guards (streaming_llm's sinks 4 + recent 8
	 * over 160 / 16 = 10 entries, no floor) fails before the pass, naming the ratio, and
	 * no table is written for the ratio that would fit (2: 80 entries) */
	char *infeasible[] = { g_kvpc, "ab", "policies/streaming_llm.kvp", "policies/h2o.kvp",
		               "--model", g_model, "--text", g_text, "--ctx", ctx, "--set-a",
		               "recent=8", "--ratio", "2,16", NULL };
	ck_assert_int_eq(run(infeasible, &out, &err), 1);
	ck_assert_msg(strstr(err, "at ratio 16: policy streaming_llm: ") &&
	              strstr(err, "no ratio was measured") && !strstr(out, "A = "), "%s\n%s", err, out);
	free(out);
	free(err);
	/* the front checks --model before it builds; the built binary's own messages name the
	 * front the user typed, not the cached binary's file */
	char *nomodel[] = { g_kvpc, "ab", "policies/h2o.kvp", "policies/h2o.kvp", "--text", g_text,
		            NULL };
	ck_assert_int_eq(run(nomodel, &out, &err), 2);
	ck_assert_str_eq(err, "kvpc ab: --model M is required (the GGUF model to measure on)\n");
	free(out);
	free(err);
	/* so are the ratio lists: a typo costs no build (kvpc and the built binary share one
	 * parse, rt_parse_ratio_list: "2, 4" was kvpc's error and the binary's valid list, and
	 * 17 ratios cost a build before the binary refused them) */
	static const char *const badlists[] = { "0.5", "0,4", "2,,4", "4x", "2, 4", "inf",
		                                "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17" };
	for (int i = 0; i < 7; i++) {
		char *badratio[] = { g_kvpc, "ab", "policies/h2o.kvp", "policies/tova.kvp", "--model",
			             g_model, "--text", g_text, "--ratio", (char *)badlists[i], NULL };
		ck_assert_int_eq(run(badratio, &out, &err), 2);
		char want[192];
		snprintf(want, sizeof want, "kvpc ab: --ratio: '%s' is not a comma-separated list of "
		         "at most 16 compression factors >= 1\n", badlists[i]);
		ck_assert_msg(!strncmp(err, want, strlen(want)) && !strstr(err, "built"), "%s", err);
		free(out);
		free(err);
	}
	/* the front needs two files */
	char *bad[] = { g_kvpc, "ab", "policies/h2o.kvp", "--model", g_model, NULL };
	ck_assert_int_eq(run(bad, &out, &err), 2);
	free(out);
	free(err);
	/* the front checks the text and the output paths before it builds anything (the
	 * message is kvpc's, not the built binary's "ab: ...") */
	char *zero[] = { g_kvpc, "ab", "policies/h2o.kvp", "policies/tova.kvp", "--model", g_model,
		         "--text", "/dev/zero", NULL };
	ck_assert_int_eq(run(zero, &out, &err), 1);
	ck_assert_str_eq(err, "kvpc ab: /dev/zero: not a regular file (a character device); a text "
	                      "must be a file\n");
	free(out);
	free(err);
	char *badcsv[] = { g_kvpc, "ab", "policies/h2o.kvp", "policies/tova.kvp", "--model", g_model,
		           "--text", g_text, "--csv=no/such/dir/r.csv", NULL };
	ck_assert_int_eq(run(badcsv, &out, &err), 2);
	ck_assert_str_eq(err, "kvpc ab: --csv: no/such/dir/r.csv: directory 'no/such/dir' does not exist\n");
	free(out);
	free(err);
}
END_TEST

/* `kvpc ab snapkv tova`: snapkv compresses once at the prompt end, so the automatic
 * protocol puts the first half of the 160 tokens in the prompt and scores the tokens after
 * it, on both sides. Hand-computed compression at ratio 4: SnapKV keeps 80 / 4 = 20 entries
 * per KV head of the prompt and appends the 80 tokens after it (160 / 100 = 1.6x at the end);
 * TOVA evicts every step, to a ratio budget of the prompt while in it and of the tokens seen
 * after it (kernels/k_signal.h k_context), 160 / 4 = 40 entries at the end (4x); every
 * scored token of both comes from a compressed cache, and the verdict names no winner, as
 * the two hold different memory. --prompt 120 --score-from 130 moves the split: SnapKV
 * 30 + 40 entries, TOVA 40. --equal-memory runs TOVA at 160 / 100 = 1.6, SnapKV's
 * compression at ratio 4, so both end at 100 entries and the verdict is the CI's. */
START_TEST(prompt_end_vs_streaming_compresses_both)
{
	char json[PATH_MAX + 16], ctx[16];
	tmp_path(json, sizeof json, "snap_tova.json");
	snprintf(ctx, sizeof ctx, "%d", CTX_TOKENS);
	const struct {
		const char *prompt, *from;
		double prompt_n, from_n, snap_x, tova_x;
		int equal;    /* --equal-memory: TOVA at the ratio holding SnapKV's 100 entries */
	} cases[] = { { NULL, NULL, 80, 81, 160.0 / 100, 160.0 / 40, 0 },
		      { "120", "130", 120, 130, 160.0 / 70, 160.0 / 40, 0 },
		      { NULL, NULL, 80, 81, 160.0 / 100, 160.0 / 100, 1 } };
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		char *argv[24] = { g_kvpc, "ab", "policies/snapkv.kvp", "policies/tova.kvp", "--model",
			           g_model, "--text", g_text, "--ctx", ctx, "--ratio", "4", "--set",
			           "window=4", "--json", json, "--quiet" };
		int k = 17;
		if (cases[c].prompt) {
			argv[k++] = "--prompt";
			argv[k++] = (char *)cases[c].prompt;
			argv[k++] = "--score-from";
			argv[k++] = (char *)cases[c].from;
		}
		if (cases[c].equal)
			argv[k++] = "--equal-memory";
		argv[k] = NULL;
		char *out, *err;
		int rc = run(argv, &out, &err);
		ck_assert_msg(rc == 0, "kvpc ab snapkv tova failed (%d): %s", rc, err);
		ck_assert_msg(strstr(out, "prompt-end protocol") &&
		              (strstr(out, "no winner") == NULL) == cases[c].equal, "%s", out);
		jv j;
		load_json(json, &j);
		ck_assert_str_eq(jstrv(&j, "meta.protocol"), "prompt_end");
		ck_assert(jnum(&j, "meta.prompt") == cases[c].prompt_n);
		ck_assert(jnum(&j, "meta.score_from") == cases[c].from_n);
		const double scored = CTX_TOKENS - cases[c].from_n;
		for (int s = 0; s < 2; s++) {
			const char *side = s ? "B" : "A";
			ck_assert_msg(at(&j, 0, side, "scored") == scored &&
			              at(&j, 0, side, "scored_compressed") == scored,
			              "%s: %g of %g scored tokens from a compressed cache", side,
			              at(&j, 0, side, "scored_compressed"), at(&j, 0, side, "scored"));
			ck_assert_msg(at(&j, 0, side, "kld_mean") > 0, "%s: KL 0", side);
		}
		ck_assert_double_eq_tol(at(&j, 0, "A", "compression"), cases[c].snap_x, 1e-7); /* %.9g */
		ck_assert_double_eq_tol(at(&j, 0, "B", "compression"), cases[c].tova_x, 1e-7);
		/* the ratio each side ran at: TOVA at 160 / 100 = 1.6 under --equal-memory */
		ck_assert_double_eq_tol(at(&j, 0, "A", "ratio"), 4, 1e-12);
		ck_assert_double_eq_tol(at(&j, 0, "B", "ratio"), cases[c].equal ? 1.6 : 4, 1e-12);
		if (cases[c].equal) { /* equal memory: a verdict from the CI, not "no winner" */
			ck_assert_msg(!strstr(jstrv(&j, "results.0.verdict"), "no winner"), "%s",
			              jstrv(&j, "results.0.verdict"));
			jfree(&j);
			free(out);
			free(err);
			continue;
		}
		ck_assert_str_eq(jstrv(&j, "results.0.better"), "tie");
		ck_assert(jnum(&j, "results.0.significant") == 0);
		ck_assert_msg(strstr(jstrv(&j, "results.0.verdict"), "no winner: A (snapkv) holds"),
		              "%s", jstrv(&j, "results.0.verdict"));
		jfree(&j);
		free(out);
		free(err);
	}
	/* task needle: a prompt-end side gets the question after its compress (agnostic), by
	 * default, and the report says which protocol ran */
	char *nd[] = { g_kvpc, "ab", "policies/snapkv.kvp", "policies/tova.kvp", "--model", g_model,
		       "--task", "needle", "--lengths", "300", "--depths", "50", "--ratio", "2",
		       "--set", "window=4", "--json", json, "--quiet", NULL };
	char *out, *err;
	ck_assert_msg(run(nd, &out, &err) == 0, "%s", err);
	ck_assert_msg(strstr(out, "question-agnostic"), "%s", out);
	jv j;
	load_json(json, &j);
	ck_assert_str_eq(jstrv(&j, "meta.needle.mode"), "agnostic");
	jfree(&j);
	free(out);
	free(err);
}
END_TEST

/* Write the policy text to the temporary file NAME (path into kvp) and a tiny 4/1 GQA model
 * with head_dim 32 (the q8/q4 tiers need head_dim a multiple of 32) to MODEL_NAME (path
 * into model). */
static void tiered_setup(char *kvp, size_t kcap, const char *name, const char *text,
                         char *model, size_t mcap, const char *model_name)
{
	tmp_path(kvp, kcap, name);
	FILE *f = fopen(kvp, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
	tmp_path(model, mcap, model_name);
	tiny_model_cfg c = { .n_layer = 2, .n_embd = 128, .n_head = 4, .n_head_kv = 1, .n_ff = 96,
		             .n_vocab = 300, .n_ctx = 1024, .rope_base = 10000, .seed = 11,
		             .wtype = RT_GGML_F32 };
	ck_assert_int_eq(tiny_model_write(&c, model), 0);
}

/* Equal memory is equal bytes: under --byte-ratio a tiered TOVA holds more entries at fewer
 * bits in the bytes plain TOVA holds, and the verdict compares them (it named no winner
 * while entries counted as memory). Floors small enough for 160 tokens, so both reach the
 * byte budget: 160 / 2 = 80 f16 entries' bytes per KV head. */
START_TEST(byte_ratio_compares_tiers_at_equal_bytes)
{
	char kvp[PATH_MAX + 32], json[PATH_MAX + 16], ctx[16], model[PATH_MAX + 32];
	tiered_setup(kvp, sizeof kvp, "tova_tiers_small.kvp",
	             "policy tova_tiers_small {\n    budget = bytes(50%) min 8 tokens\n"
	             "    stat now = last(attn)\n    score = now\n    group = mean over layer\n"
	             "    keep sinks 2 tokens\n    keep recent 4 tokens\n"
	             "    precision = tiers(f16, q8, q4)\n    compress every 8 steps\n}\n",
	             model, sizeof model, "tiny_hd32.gguf");
	tmp_path(json, sizeof json, "tiers.json");
	snprintf(ctx, sizeof ctx, "%d", CTX_TOKENS);
	char *argv[] = { g_kvpc, "ab", "policies/tova.kvp", kvp, "--model", model, "--text",
		         g_text, "--ctx", ctx, "--byte-ratio", "2", "--json", json, "--quiet", NULL };
	char *out, *err;
	ck_assert_msg(run(argv, &out, &err) == 0, "%s", err);
	jv j;
	load_json(json, &j);
	const double ea = at(&j, 0, "A", "compression"), eb = at(&j, 0, "B", "compression");
	const double ba = at(&j, 0, "A", "bytes_compression"), bb = at(&j, 0, "B", "bytes_compression");
	ck_assert_msg(ea > 1.5 * eb, "entries %g and %g: the tiers kept no more entries", ea, eb);
	ck_assert_msg(fabs(ba - bb) <= 0.1 * fmax(ba, bb), "bytes %g and %g differ", ba, bb);
	ck_assert_msg(!strstr(jstrv(&j, "results.0.verdict"), "no winner"), "%s",
	              jstrv(&j, "results.0.verdict"));
	jfree(&j);
	free(out);
	free(err);
	unlink(kvp);
	unlink(model);
}
END_TEST

/* Two prompt-end policies hold the same continuation uncompressed, so their bytes at the
 * end can agree while their prompts' do not: SnapKV against the same score storing its
 * ranked entries at q4, at ratio 4 on a 60-token prompt of 160 tokens. Hand-computed: both
 * keep 15 entries per KV head of the prompt (4x in entries); the q4 side stores 11 of them
 * at 18 bytes per 32 elements against f16's 64, so its prompt holds about 7.1 f16 entries'
 * bytes (8.5x) against 15 (4x), while at the end 115 and about 107 entries' bytes of 160
 * differ by 7%, inside the 10% tolerance. The verdict names no winner, quoting the prompts'
 * bytes (it compared the two as equal memory). */
START_TEST(prompt_end_pair_compares_the_prompts_bytes)
{
	char kvp[PATH_MAX + 32], json[PATH_MAX + 16], ctx[16], model[PATH_MAX + 32];
	tiered_setup(kvp, sizeof kvp, "snap_q4.kvp",
	             "policy snap_q4 {\n    budget = 1024 entries\n"
	             "    stat obs = sum(attn) over prompt tail 4\n    score = obs\n"
	             "    keep recent 4\n    precision = tiers(q4 = rest)\n"
	             "    compress at prompt end\n}\n",
	             model, sizeof model, "tiny_hd32_pe.gguf");
	tmp_path(json, sizeof json, "snap_q4.json");
	snprintf(ctx, sizeof ctx, "%d", CTX_TOKENS);
	char *argv[] = { g_kvpc, "ab", "policies/snapkv.kvp", kvp, "--model", model, "--text",
		         g_text, "--ctx", ctx, "--ratio", "4", "--set-a", "window=4", "--prompt", "60",
		         "--score-from", "61", "--json", json, "--quiet", NULL };
	char *out, *err;
	ck_assert_msg(run(argv, &out, &err) == 0, "%s", err);
	jv j;
	load_json(json, &j);
	const double pa = at(&j, 0, "A", "prompt_bytes_compression");
	const double pb = at(&j, 0, "B", "prompt_bytes_compression");
	const double ba = at(&j, 0, "A", "bytes_compression"), bb = at(&j, 0, "B", "bytes_compression");
	ck_assert_msg(pb > 1.8 * pa, "prompt bytes %g and %g", pa, pb);
	ck_assert_msg(fabs(ba - bb) <= 0.1 * fmax(ba, bb), "bytes at the end %g and %g", ba, bb);
	ck_assert_msg(strstr(jstrv(&j, "results.0.verdict"), "no winner: A (snapkv) holds") &&
	              strstr(jstrv(&j, "results.0.verdict"), "(the prompt after its compress: A "),
	              "%s", jstrv(&j, "results.0.verdict"));
	jfree(&j);
	free(out);
	free(err);
	unlink(kvp);
	unlink(model);
}
END_TEST

/* A bad --set, --set-a or --set-b value is a usage error (exit 2) before the model loads,
 * naming the option as typed and its side, whichever side's policy refuses it (it was exit
 * 1, "--set: ...", after loading the model, for a side's own option). */
START_TEST(set_values_are_usage_errors)
{
	static const char *const cases[][3] = {
		{ "--set-b", "recent=20", "--set-b recent=20 (side B): policy h2o: parameter recent is a ratio" },
		{ "--set-a", "heavy=0.2", "--set-a heavy=0.2 (side A): policy full" },
		{ "--set", "heavy=20", "--set heavy=20 (side B): policy h2o: parameter heavy is a ratio" },
		{ "--set", "nosuch=1", "--set nosuch=1: neither full nor h2o has a parameter 'nosuch'" },
	};
	for (int i = 0; i < 4; i++) {
		char *out, *err;
		int rc = run_ab(&out, &err, "--a", "full", "--b", "h2o", (char *)cases[i][0],
		                (char *)cases[i][1], NULL);
		ck_assert_msg(rc == 2 && strstr(err, cases[i][2]) && !out[0], "%s %s: rc %d: %s",
		              cases[i][0], cases[i][1], rc, err);
		free(out), free(err);
	}
}
END_TEST

START_TEST(needle_task_runs)
{
	char json[PATH_MAX + 16], svg[PATH_MAX + 16];
	tmp_path(json, sizeof json, "needle.json");
	tmp_path(svg, sizeof svg, "needle.svg");
	char *out, *err;
	int rc = run_ab(&out, &err, "--task", "needle", "--a", "h2o", "--b", "h2o", "--lengths",
	                "400", "--depths", "0,100", "--ratio", "2", "--json", json, "--plot", svg,
	                NULL);
	ck_assert_msg(rc == 0, "needle ab failed (%d): %s", rc, err);
	jv j;
	load_json(json, &j);
	ck_assert(jnum(&j, "results.0.A.trials") == 2);
	ck_assert(jnum(&j, "results.0.A.accuracy") == jnum(&j, "results.0.B.accuracy"));
	ck_assert(jnum(&j, "results.0.A.kv_entries_peak") < 2 * 3 * 400);
	ck_assert_str_eq(jstrv(&j, "results.0.better"), "tie");
	ck_assert(jnum(&j, "results.0.discordant.p_value") == 1);
	/* the default mode is `needle`'s: question-aware */
	ck_assert_str_eq(jstrv(&j, "meta.needle.mode"), "aware");
	jfree(&j);
	free(out);
	free(err);
	/* the plot: the sign test's discordant counts as the verdict panel, Wilson bars on the
	 * accuracy, well-formed XML */
	size_t len;
	rt_err e;
	char *c = rt_read_file(svg, &len, &e);
	ck_assert_ptr_nonnull(c);
	const char *bad_xml = xml_check(c);
	ck_assert_msg(bad_xml == NULL, "%s: %s", svg, bad_xml);
	ck_assert(strstr(c, "verdict: discordant trials (exact sign test)"));
	ck_assert(strstr(c, "passkey accuracy (bars: 95% Wilson)") && strstr(c, "class=\"errbar\""));
	ck_assert(strstr(c, "2 trials per policy and ratio"));
	free(c);
}
END_TEST

START_TEST(cli_convention)
{
	/* every command of a built binary: --help and --version exit 0, an unknown option is a
	 * usage error (2), and a range error names its option */
	static const char *const cmds[] = { "info", "ppl", "needle", "run", "tokenize", "bench",
		                            "keepmap", "ab" };
	char *out, *err;
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		char *h[] = { g_bin, (char *)cmds[i], "--help", NULL };
		ck_assert_msg(run(h, &out, &err) == 0, "%s --help: %s", cmds[i], err);
		ck_assert_msg(strstr(out, "NAME") && strstr(out, "kv-ab"), "%s --help: %s", cmds[i], out);
		free(out), free(err);
		char *v[] = { g_bin, (char *)cmds[i], "--version", NULL };
		ck_assert_msg(run(v, &out, &err) == 0, "%s --version: %s", cmds[i], err);
		ck_assert_msg(strstr(out, "commit"), "%s --version: %s", cmds[i], out);
		free(out), free(err);
		char *u[] = { g_bin, (char *)cmds[i], "--no-such-option", NULL };
		ck_assert_msg(run(u, &out, &err) == 2, "%s --no-such-option", cmds[i]);
		ck_assert_msg(strstr(err, "--no-such-option"), "%s: %s", cmds[i], err);
		free(out), free(err);
	}
	/* BIN --help lists every command under the binary's name */
	char *top[] = { g_bin, "--help", NULL };
	ck_assert_int_eq(run(top, &out, &err), 0);
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		char want[64];
		snprintf(want, sizeof want, "\n    kv-ab %s", cmds[i]);
		ck_assert_msg(strstr(out, want), "BIN --help lacks '%s'", want);
	}
	free(out), free(err);
	/* the same range mistake is a usage error naming the option in ppl and ab */
	char *p1[] = { g_bin, "ppl", "--model", g_model, "--text", g_text, "--chunk", "0", NULL };
	ck_assert_int_eq(run(p1, &out, &err), 2);
	ck_assert_msg(strstr(err, "--chunk: '0'"), "%s", err);
	free(out), free(err);
	char *p2[] = { g_bin, "ab", "--model", g_model, "--text", g_text, "--chunk", "0", NULL };
	ck_assert_int_eq(run(p2, &out, &err), 2);
	ck_assert_msg(strstr(err, "--chunk: '0'"), "%s", err);
	free(out), free(err);
}
END_TEST

START_TEST(progress_lines)
{
	/* stderr is a file here: a plain line each time a block of the run passes another tenth
	 * (at most 10), ending at 100%; --quiet prints none; stdout is the report alone */
	char *out, *err;
	char *a[] = { g_bin, "ppl", "--model", g_model, "--text", g_text, "--ctx", "100", "--policy",
		      "h2o", "--ratio", "2", NULL };
	ck_assert_int_eq(run(a, &out, &err), 0);
	ck_assert_msg(strstr(err, "ppl: 100% (100/100 tokens"), "%s", err);
	int lines = 0;
	for (const char *p = err; (p = strstr(p, "ppl: ")); p++)
		lines++;
	ck_assert_msg(lines >= 1 && lines <= 10, "%d progress lines: %s", lines, err);
	ck_assert(!strstr(out, "ppl: "));
	free(out), free(err);
	char *q[] = { g_bin, "ppl", "--model", g_model, "--text", g_text, "--ctx", "100", "--policy",
		      "h2o", "--ratio", "2", "--quiet", NULL };
	ck_assert_int_eq(run(q, &out, &err), 0);
	ck_assert_msg(!strstr(err, "%"), "%s", err);
	free(out), free(err);
	char *k[] = { g_bin, "ab", "--model", g_model, "--text", g_text, "--ctx", "64", "--a", "h2o",
		      "--b", "h2o", "--ratio", "2", NULL };
	ck_assert_int_eq(run(k, &out, &err), 0);
	ck_assert_msg(strstr(err, "ab: 100% (64/64 tokens"), "%s", err);
	free(out), free(err);
}
END_TEST

START_TEST(bad_arguments)
{
	char *out, *err;
	ck_assert_int_eq(run_ab(&out, &err, "--a", "nosuch", NULL), 2);
	ck_assert_msg(strstr(err, "nosuch") && strstr(err, "h2o"), "%s", err);
	free(out);
	free(err);
	ck_assert_int_eq(run_ab(&out, &err, "--ratio", "0.5", NULL), 2);
	ck_assert_msg(strstr(err, "--ratio"), "%s", err);
	free(out);
	free(err);
	ck_assert_int_eq(run_ab(&out, &err, "--set", "nosuch=1", NULL), 2);
	ck_assert_msg(strstr(err, "nosuch"), "%s", err);
	free(out);
	free(err);
	char *argv[] = { g_bin, "ab", "--model", "no/such/model.gguf", "--text", g_text, NULL };
	ck_assert_int_eq(run(argv, &out, &err), 1);
	ck_assert_msg(strstr(err, "no/such/model.gguf") && strchr(err, '\n') == err + strlen(err) - 1,
	              "%s", err);
	free(out);
	free(err);
	/* inputs and outputs are checked before the model is loaded (the model does not exist) */
	char *zero[] = { g_bin, "ab", "--model", "no/such/model.gguf", "--text", "/dev/zero", NULL };
	ck_assert_int_eq(run(zero, &out, &err), 1);
	ck_assert_str_eq(err, "ab: /dev/zero: not a regular file (a character device); a text must be a file\n");
	free(out);
	free(err);
	char *badout[] = { g_bin, "ab", "--model", "no/such/model.gguf", "--text", g_text,
		           "--plot", "no/such/dir/p.svg", NULL };
	ck_assert_int_eq(run(badout, &out, &err), 2);
	ck_assert_str_eq(err, "ab: --plot: no/such/dir/p.svg: directory 'no/such/dir' does not exist\n");
	free(out);
	free(err);
	/* two reports to one file, a second --text, an f16 store on this exact-only command:
	 * usage errors before the model (the last report or text won silently) */
	char *same[] = { g_bin, "ab", "--model", "no/such/model.gguf", "--text", g_text,
		         "--json", "r.out", "--csv", "r.out", NULL };
	ck_assert_int_eq(run(same, &out, &err), 2);
	ck_assert_msg(strstr(err, "--json and --csv both write r.out"), "%s", err);
	free(out);
	free(err);
	char *two[] = { g_bin, "ab", "--model", "no/such/model.gguf", "--text", g_text, "--text",
		        g_text, NULL };
	ck_assert_int_eq(run(two, &out, &err), 2);
	ck_assert_msg(strstr(err, "--text given 2 times"), "%s", err);
	free(out);
	free(err);
	char *kv[] = { g_bin, "ab", "--model", "no/such/model.gguf", "--text", g_text,
		       "--kv-type", "f16", NULL };
	ck_assert_int_eq(run(kv, &out, &err), 2);
	ck_assert_msg(strstr(err, "this command runs the exact path only") && !strstr(err, "--exact"),
	              "%s", err);
	free(out);
	free(err);
	/* guards larger than the ratio's budget: the library h2o's own floor (`min 64
	 * tokens`) makes the budget graceful, so the run is measured, not refused (the clear
	 * error of a policy without a floor: test_seq's cli_ppl_json, mikv_h2o --ratio 16) */
	ck_assert_msg(run_ab(&out, &err, "--a", "h2o", "--b", "h2o", "--ratio", "16", NULL) == 0,
	              "%s", err);
	free(out);
	free(err);
}
END_TEST

static Suite *ab_suite(void)
{
	Suite *s = suite_create("ab");
	TCase *tc = tcase_create("ab");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, json_reader_rejects_bad_json);
	tcase_add_test(tc, policy_against_itself_ties_exactly);
	tcase_add_test(tc, full_vs_small_budget);
	tcase_add_test(tc, kvpc_ab_front_builds_and_runs);
	tcase_add_test(tc, set_values_are_usage_errors);
	tcase_add_test(tc, needle_task_runs);
	tcase_add_test(tc, byte_ratio_compares_tiers_at_equal_bytes);
	tcase_add_test(tc, prompt_end_pair_compares_the_prompts_bytes);
	tcase_add_test(tc, prompt_end_vs_streaming_compresses_both);
	tcase_add_test(tc, cli_convention);
	tcase_add_test(tc, progress_lines);
	tcase_add_test(tc, bad_arguments);
	suite_add_tcase(s, tc);
	return s;
}

/* Some English prose, enough for CTX_TOKENS byte-level tokens. */
static const char TEXT[] =
	"The quick brown fox jumps over the lazy dog. A cache keeps what was computed so that it "
	"need not be computed again; a small cache must decide what to forget. Attention sinks "
	"are the first tokens of a text, which absorb the attention that has nowhere else to go. "
	"Heavy hitters are the tokens that receive most of the attention over time. The grass is "
	"green, the sky is blue, the sun is yellow, and here we go, there and back again. "
	"Compression trades memory for quality, and an honest comparison measures both.\n";

int main(void)
{
	snprintf(g_tmp, sizeof g_tmp, "/tmp/kvpc_test_ab_XXXXXX");
	if (!mkdtemp(g_tmp)) {
		perror("mkdtemp");
		return EXIT_FAILURE;
	}
	if (proc_bin_path("kvpc", "KVPC", g_kvpc, sizeof g_kvpc) != 0)
		return EXIT_FAILURE;
	char cache[PATH_MAX + 16];
	snprintf(cache, sizeof cache, "%s/cache", g_tmp);
	setenv("KVPC_CACHE", cache, 1);
	snprintf(g_model, sizeof g_model, "%s/tiny.gguf", g_tmp);
	snprintf(g_text, sizeof g_text, "%s/text.txt", g_tmp);
	snprintf(g_bin, sizeof g_bin, "%s/kv-ab", g_tmp);
	tiny_model_cfg c = { .n_layer = 2, .n_embd = 72, .n_head = 9, .n_head_kv = 3, .n_ff = 96,
		             .n_vocab = 300, .n_ctx = 1024, .rope_base = 10000, .seed = 7,
		             .wtype = RT_GGML_F32 };
	FILE *f = fopen(g_text, "w");
	if (tiny_model_write(&c, g_model) != 0 || !f || fputs(TEXT, f) < 0 || fclose(f) != 0) {
		fprintf(stderr, "test_ab: cannot write the model or text under %s\n", g_tmp);
		return EXIT_FAILURE;
	}
	/* the binary under test: h2o and the built-in full (shared by the tests, built once here) */
	char cmd[4 * PATH_MAX];
	snprintf(cmd, sizeof cmd, "'%s' build policies/h2o.kvp -o '%s' 2>/dev/null",
	         g_kvpc, g_bin);
	if (system(cmd) != 0) {
		fprintf(stderr, "test_ab: `%s build` failed (build kvpc first, or set KVPC)\n", g_kvpc);
		return EXIT_FAILURE;
	}
	int failed = check_run(ab_suite());
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
	if (!failed && system(cmd) != 0)
		fprintf(stderr, "test_ab: could not remove %s\n", g_tmp);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
