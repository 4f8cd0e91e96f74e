/*
 * test_keepmap: the kept-positions SVG of `BIN keepmap` (runtime/report/rt_keepmap.c), on hand-made
 * kept sets (no model): the number of kept ("k") and merged ("m") cells in every row of
 * grouped-query shapes 9/3 and 4/1 with two layers, the x position of a cell, binning of a
 * long text (ceil(N / 1000) tokens per column, partial columns drawn with opacity),
 * escaping of a hostile policy name and parameter text, byte-identical output on repeated
 * renders and in the written file, well-formed XML (a small checker: balanced and nested
 * tags, quoted attributes, valid entities, one root), the summary, and the error cases.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "report/rt_keepmap.h"

#include "support/xml_check.h"
#include "support/check_run.h"

#define ASSERT_WF(xml)                                                          \
	do {                                                                    \
		const char *wf_ = xml_check(xml);                               \
		ck_assert_msg(wf_ == NULL, "not well-formed: %s", wf_ ? wf_ : ""); \
	} while (0)

static int count_sub(const char *s, const char *end, const char *sub)
{
	int n = 0;
	for (const char *p = strstr(s, sub); p && (!end || p < end); p = strstr(p + 1, sub))
		n++;
	return n;
}

/* Cells of class cls ("k" or "m") inside the row group of (layer, head); -1 if the row
 * is missing. */
static int row_cells(const char *svg, int layer, int head, const char *cls)
{
	char id[64], want[32];
	snprintf(id, sizeof id, "<g id=\"row-%d-%d\">", layer, head);
	snprintf(want, sizeof want, "<rect class=\"%s\"", cls);
	const char *a = strstr(svg, id);
	if (!a)
		return -1;
	const char *e = strstr(a, "</g>");
	ck_assert_ptr_nonnull(e);
	return count_sub(a, e, want);
}

/* ---- fixtures --------------------------------------------------------------------------- */

/* Two layers of 3 KV heads (9 query heads / 3 KV heads), N = 20 tokens. */
static const int32_t p00[] = { 0, 1, 2, 10, 19 };
static const int32_t p01[] = { 0, 5, 7 };
static const float c01[] = { 1, 3.5f, 1 };
static const int32_t p02[] = { 0 };
static const int32_t p10[] = { 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18 };
static const int32_t p11[] = { 2, 4, 6 };
static const float c11[] = { 2, 2, 2 };
/* layer 1 head 2 keeps nothing */

static rt_keepmap_head g93[6];

static rt_keepmap km93(const char *policy)
{
	memset(g93, 0, sizeof g93);
	g93[0] = (rt_keepmap_head){ p00, NULL, 5 };
	g93[1] = (rt_keepmap_head){ p01, c01, 3 };
	g93[2] = (rt_keepmap_head){ p02, NULL, 1 };
	g93[3] = (rt_keepmap_head){ p10, NULL, 16 };
	g93[4] = (rt_keepmap_head){ p11, c11, 3 };
	g93[5] = (rt_keepmap_head){ NULL, NULL, 0 };
	return (rt_keepmap){ .n_layer = 2, .n_kv_head = 3, .n_tokens = 20, .heads = g93,
		             .policy = policy, .params = "heavy=0.1 recent=0.1", .ratio = 4 };
}

/* ---- tests ------------------------------------------------------------------------------ */

START_TEST(cells_gqa_9_3)
{
	rt_keepmap km = km93("h2o");
	rt_err err = { "" };
	size_t len = 0;
	char *svg = rt_keepmap_render(&km, &len, &err);
	ck_assert_msg(svg != NULL, "%s", err.msg);
	ck_assert_uint_eq(len, strlen(svg));
	ASSERT_WF(svg);
	/* expected (kept, merged) cells per row, by hand from the fixture */
	static const int want_k[6] = { 5, 2, 1, 16, 0, 0 };
	static const int want_m[6] = { 0, 1, 0, 0, 3, 0 };
	for (int r = 0; r < 6; r++) {
		ck_assert_int_eq(row_cells(svg, r / 3, r % 3, "k"), want_k[r]);
		ck_assert_int_eq(row_cells(svg, r / 3, r % 3, "m"), want_m[r]);
	}
	ck_assert_int_eq(row_cells(svg, 2, 0, "k"), -1);
	/* labels, and the merged entry of L0 H1 at position 5: x = 64 + 5 · 1240 / 20 */
	ck_assert_ptr_nonnull(strstr(svg, ">L0 H0</text>"));
	ck_assert_ptr_nonnull(strstr(svg, ">L1 H2</text>"));
	ck_assert_ptr_nonnull(strstr(svg, "<rect class=\"m\" x=\"374.00\""));
	ck_assert_ptr_nonnull(strstr(svg, "<rect class=\"k\" x=\"1242.00\"")); /* position 19 */
	/* title: mean (5+3+1+16+3+0)/6 = 4.67 of 20 = 23.3 %, min 0, max 16, 4 merged */
	ck_assert_ptr_nonnull(strstr(svg, "mean 4.7 of 20 positions (23.3%), min 0, max 16; "
	                                  "28 entries, 4 merged prototypes"));
	ck_assert_ptr_nonnull(strstr(svg, "params heavy=0.1 recent=0.1; ratio 4; N = 20 tokens"));
	/* width within 1400 px */
	int w = 0;
	ck_assert_int_eq(sscanf(strstr(svg, "width=\""), "width=\"%d\"", &w), 1);
	ck_assert_int_le(w, 1400);
	free(svg);
}
END_TEST

START_TEST(cells_gqa_4_1)
{
	static const int32_t a[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	static const int32_t b[] = { 0, 6, 7 };
	static const float bc[] = { 1, 1, 1.0001f };
	rt_keepmap_head h[2] = { { a, NULL, 8 }, { b, bc, 3 } };
	rt_keepmap km = { .n_layer = 2, .n_kv_head = 1, .n_tokens = 8, .heads = h,
		          .policy = "snapkv", .params = NULL, .ratio = 0 };
	rt_err err = { "" };
	char *svg = rt_keepmap_render(&km, NULL, &err);
	ck_assert_msg(svg != NULL, "%s", err.msg);
	ASSERT_WF(svg);
	ck_assert_int_eq(row_cells(svg, 0, 0, "k"), 8);
	ck_assert_int_eq(row_cells(svg, 0, 0, "m"), 0);
	ck_assert_int_eq(row_cells(svg, 1, 0, "k"), 2);
	ck_assert_int_eq(row_cells(svg, 1, 0, "m"), 1);
	ck_assert_int_eq(row_cells(svg, 0, 1, "k"), -1);
	ck_assert_ptr_nonnull(strstr(svg, "policy's own budget; N = 8 tokens; 2 layers x 1 KV heads"));
	/* a budget in bytes is named as one, not as the policy's own */
	rt_keepmap kb = km;
	kb.byte_ratio = 8;
	char *svb = rt_keepmap_render(&kb, NULL, &err);
	ck_assert_msg(svb != NULL, "%s", err.msg);
	ck_assert_ptr_nonnull(strstr(svb, "byte ratio 8 (bytes against f16); N = 8 tokens"));
	ck_assert_ptr_null(strstr(svb, "policy's own budget"));
	free(svb);
	/* cells of one token are 1240 / 8 = 155 px wide */
	ck_assert_ptr_nonnull(strstr(svg, "<rect class=\"k\" x=\"219.00\" y=\""));
	ck_assert_ptr_nonnull(strstr(svg, "width=\"155.00\""));
	rt_keepmap_summary s;
	rt_keepmap_summarize(&km, &s);
	ck_assert_int_eq(s.entries, 11);
	ck_assert_int_eq(s.merged, 1);
	ck_assert_int_eq(s.min_per_head, 3);
	ck_assert_int_eq(s.max_per_head, 8);
	ck_assert_double_eq_tol(s.mean_per_head, 5.5, 1e-12);
	free(svg);
}
END_TEST

START_TEST(binning)
{
	/* N = 2500 > 1000: bin = 3 tokens, 834 columns (the last holds token 2499 only) */
	static const int32_t a[] = { 0, 1, 2, 3, 1500, 2499 };
	static const float ac[] = { 1, 1, 1, 1, 9, 1 };
	rt_keepmap_head h[1] = { { a, ac, 6 } };
	rt_keepmap km = { .n_layer = 1, .n_kv_head = 1, .n_tokens = 2500, .heads = h,
		          .policy = "x", .ratio = 8 };
	rt_err err = { "" };
	char *svg = rt_keepmap_render(&km, NULL, &err);
	ck_assert_msg(svg != NULL, "%s", err.msg);
	ASSERT_WF(svg);
	ck_assert_int_eq(row_cells(svg, 0, 0, "k"), 3); /* columns 0, 1, 833 */
	ck_assert_int_eq(row_cells(svg, 0, 0, "m"), 1); /* column 500 */
	ck_assert_ptr_nonnull(strstr(svg, "1 column = 3 tokens"));
	/* column 1 holds 1 of its 3 tokens; columns 0 and 833 are full (no opacity) */
	ck_assert_int_eq(count_sub(svg, NULL, "fill-opacity=\"0.33\""), 1);
	ck_assert_int_eq(count_sub(svg, NULL, "<rect class=\"k\""), 3);
	free(svg);
}
END_TEST

START_TEST(escaping)
{
	rt_keepmap km = km93("<script>alert('x')</script> & \"q\" \x01");
	km.params = "a<b=1 c&d=2";
	rt_err err = { "" };
	char *svg = rt_keepmap_render(&km, NULL, &err);
	ck_assert_msg(svg != NULL, "%s", err.msg);
	ASSERT_WF(svg);
	ck_assert_ptr_null(strstr(svg, "<script"));
	ck_assert_ptr_nonnull(strstr(svg, "&lt;script&gt;alert(&apos;x&apos;)&lt;/script&gt; "
	                                  "&amp; &quot;q&quot; ?"));
	ck_assert_ptr_nonnull(strstr(svg, "params a&lt;b=1 c&amp;d=2;"));
	free(svg);
}
END_TEST

START_TEST(determinism)
{
	rt_keepmap km = km93("h2o");
	rt_err err = { "" };
	size_t n1, n2;
	char *a = rt_keepmap_render(&km, &n1, &err);
	char *b = rt_keepmap_render(&km, &n2, &err);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(n1, n2);
	ck_assert_int_eq(memcmp(a, b, n1), 0);
	char path[] = "/tmp/test_keepmap_XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(rt_keepmap_write(path, &km, &err), 0);
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	char *c = malloc(n1 + 16);
	size_t got = fread(c, 1, n1 + 16, f);
	fclose(f);
	unlink(path);
	ck_assert_uint_eq(got, n1);
	ck_assert_int_eq(memcmp(a, c, n1), 0);
	free(a);
	free(b);
	free(c);
	ck_assert_int_eq(rt_keepmap_write("/nonexistent-dir/x.svg", &km, &err), -1);
	ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent-dir/x.svg: "));
}
END_TEST

START_TEST(errors)
{
	rt_err err = { "" };
	rt_keepmap km = km93("h2o");
	static const int32_t bad_pos[] = { 3, 20 };
	g93[2] = (rt_keepmap_head){ bad_pos, NULL, 2 };
	ck_assert_ptr_null(rt_keepmap_render(&km, NULL, &err));
	ck_assert_str_eq(err.msg, "keepmap: layer 0 head 2 entry 1: position 20 outside 0..19");
	static const int32_t ok_pos[] = { 3 };
	static const float bad_c[] = { 0.5f };
	g93[2] = (rt_keepmap_head){ ok_pos, bad_c, 1 };
	ck_assert_ptr_null(rt_keepmap_render(&km, NULL, &err));
	ck_assert_ptr_nonnull(strstr(err.msg, "count 0.5 below 1"));
	g93[2] = (rt_keepmap_head){ NULL, NULL, 1 };
	ck_assert_ptr_null(rt_keepmap_render(&km, NULL, &err));
	ck_assert_ptr_nonnull(strstr(err.msg, "bad entry list"));
	km = km93("h2o");
	km.n_layer = 0;
	ck_assert_ptr_null(rt_keepmap_render(&km, NULL, &err));
	km = km93("h2o");
	km.n_tokens = 0;
	ck_assert_ptr_null(rt_keepmap_render(&km, NULL, &err));
	km = km93("h2o");
	km.heads = NULL;
	ck_assert_ptr_null(rt_keepmap_render(&km, NULL, &err));
	ck_assert_ptr_null(rt_keepmap_render(NULL, NULL, &err));
}
END_TEST

static Suite *keepmap_suite(void)
{
	Suite *s = suite_create("keepmap");
	TCase *tc = tcase_create("render");
	tcase_add_test(tc, cells_gqa_9_3);
	tcase_add_test(tc, cells_gqa_4_1);
	tcase_add_test(tc, binning);
	tcase_add_test(tc, escaping);
	tcase_add_test(tc, determinism);
	tcase_add_test(tc, errors);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed = check_run(keepmap_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
