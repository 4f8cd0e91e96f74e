/*
 * test_svg: the A/B report's SVG line plot (runtime/report/rt_svg.c).
 *
 * A tiny XML checker in this file (balanced and properly nested tags, quoted attributes,
 * only the five predefined entities or character references after '&', no raw '<' in
 * text or attribute values, one root element) validates every rendered plot. Checks: the
 * escaping of & < > " ' in title, axis labels and legend names, replacement of control
 * bytes and invalid UTF-8, NaN/inf/non-positive-x points skipped with the line broken at
 * the gap, equal spacing of powers of two on the log2 axis and of equal steps on the y
 * axis (marker coordinates parsed back), tick labels, byte-identical output on repeated
 * renders and in the written file, and the error cases.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "report/rt_svg.h"

#include "support/xml_check.h"
#include "support/check_run.h"

#define ASSERT_WF(xml)                                                          \
	do {                                                                    \
		const char *wf_ = xml_check(xml);                               \
		ck_assert_msg(wf_ == NULL, "not well-formed: %s", wf_ ? wf_ : ""); \
	} while (0)

static int count_sub(const char *s, const char *sub)
{
	int n = 0;
	for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
		n++;
	return n;
}

/* ---- tests ------------------------------------------------------------------------- */

START_TEST(test_checker_itself)
{
	/* the checker must reject what it is meant to catch */
	ck_assert_ptr_null(xml_check("<?xml version=\"1.0\"?>\n<a x=\"1\"><b/>t&amp;</a>\n"));
	ck_assert_ptr_nonnull(xml_check("<a><b></a></b>"));
	ck_assert_ptr_nonnull(xml_check("<a>"));
	ck_assert_ptr_nonnull(xml_check("<a>x & y</a>"));
	ck_assert_ptr_nonnull(xml_check("<a t=\"<\"/>"));
	ck_assert_ptr_nonnull(xml_check("<a t=x/>"));
	ck_assert_ptr_nonnull(xml_check("<a/><b/>"));
	ck_assert_ptr_nonnull(xml_check("<a>1 < 2</a>"));
}
END_TEST

static const double X4[4] = {2, 4, 8, 16};

START_TEST(test_basic_wellformed)
{
	double ya[4] = {10.5, 10.9, 11.6, 13.2}, yb[4] = {10.4, 10.6, 11.0, 11.9};
	rt_svg_series s[2] = {{"snapkv", X4, ya, 4, NULL, NULL}, {"h2o", X4, yb, 4, NULL, NULL}};
	rt_svg_plot p = {"Perplexity vs compression", "compression ratio", "perplexity", 0, 0, 1, 0, 0, 0};
	rt_err err = {0};
	size_t len;
	char *svg = rt_svg_render(&p, s, 2, &len, &err);
	ck_assert_ptr_nonnull(svg);
	ck_assert_uint_eq(len, strlen(svg));
	ASSERT_WF(svg);
	ck_assert(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"") != NULL);
	ck_assert_int_eq(count_sub(svg, "class=\"pt\""), 8);
	ck_assert_int_eq(count_sub(svg, "class=\"legend-pt\""), 2);
	ck_assert(strstr(svg, ">snapkv</text>") && strstr(svg, ">h2o</text>"));
	ck_assert(strstr(svg, ">Perplexity vs compression</text>"));
	ck_assert(strstr(svg, ">compression ratio</text>") && strstr(svg, ">perplexity</text>"));
	/* power-of-two tick labels on the x axis */
	for (int i = 0; i < 4; i++) {
		char want[64];
		snprintf(want, sizeof(want), "text-anchor=\"middle\">%g</text>", X4[i]);
		ck_assert_msg(strstr(svg, want), "missing x tick %g", X4[i]);
	}
	/* y ticks: range 10.4..13.2 gives 1-2-5 step 0.5 from 10.0 to 13.5 */
	ck_assert(strstr(svg, ">10.0</text>") && strstr(svg, ">13.5</text>"));
	ck_assert(strstr(svg, ">12.5</text>"));
	ck_assert(!strstr(svg, ">14.0</text>") && !strstr(svg, ">9.5</text>"));
	free(svg);
}
END_TEST

/* Parse the cx/cy of every circle marker of class pt. */
static int circles(const char *svg, double *cx, double *cy, int cap)
{
	int n = 0;
	for (const char *q = strstr(svg, "<circle class=\"pt\""); q && n < cap;
	     q = strstr(q + 1, "<circle class=\"pt\"")) {
		ck_assert_int_eq(sscanf(q, "<circle class=\"pt\" cx=\"%lf\" cy=\"%lf\"", &cx[n],
		                        &cy[n]), 2);
		n++;
	}
	return n;
}

START_TEST(test_log2_and_linear_spacing)
{
	double y[4] = {1, 2, 3, 4};
	rt_svg_series s = {"a", X4, y, 4, NULL, NULL};
	rt_svg_plot p = {"t", "x", "y", 800, 500, 1, 0, 0, 0};
	rt_err err = {0};
	char *svg = rt_svg_render(&p, &s, 1, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	double cx[8], cy[8];
	ck_assert_int_eq(circles(svg, cx, cy, 8), 4);
	double dx = cx[1] - cx[0], dy = cy[1] - cy[0];
	ck_assert(dx > 50 && dy < -20);
	for (int i = 1; i < 4; i++) {
		ck_assert_msg(fabs((cx[i] - cx[i - 1]) - dx) < 0.02, "log2 spacing %g vs %g",
		              cx[i] - cx[i - 1], dx);
		ck_assert(fabs((cy[i] - cy[i - 1]) - dy) < 0.02);
	}
	free(svg);

	/* linear x axis: x = 1, 2, 4 gives spacing 1 : 2 */
	double xl[3] = {1, 2, 4}, yl[3] = {0, 0, 0};
	rt_svg_series sl = {"lin", xl, yl, 3, NULL, NULL};
	p.x_log2 = 0;
	svg = rt_svg_render(&p, &sl, 1, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	ASSERT_WF(svg);
	ck_assert_int_eq(circles(svg, cx, cy, 8), 3);
	ck_assert(fabs((cx[2] - cx[1]) - 2 * (cx[1] - cx[0])) < 0.02);
	ck_assert(cy[0] == cy[1] && cy[1] == cy[2]);
	free(svg);
}
END_TEST

START_TEST(test_escaping)
{
	double y[2] = {1, 2};
	rt_svg_series s[2] = {{"x&y<z>", X4, y, 2, NULL, NULL}, {"q\"uote's", X4, y, 2, NULL, NULL}};
	rt_svg_plot p = {"a<b & \"c\" 'd'>", "ratio <&>", "kld \"nats\"\x01\xff caf\xc3\xa9",
	                 0, 0, 1, 0, 0, 0};
	rt_err err = {0};
	char *svg = rt_svg_render(&p, s, 2, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	ASSERT_WF(svg);
	ck_assert(strstr(svg, ">a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;</text>"));
	ck_assert(strstr(svg, "<title>a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;</title>"));
	ck_assert(strstr(svg, ">ratio &lt;&amp;&gt;</text>"));
	ck_assert(strstr(svg, ">x&amp;y&lt;z&gt;</text>"));
	ck_assert(strstr(svg, ">q&quot;uote&apos;s</text>"));
	/* control byte and invalid UTF-8 replaced, valid UTF-8 kept */
	ck_assert(strstr(svg, ">kld &quot;nats&quot;?? caf\xc3\xa9</text>"));
	ck_assert(!strstr(svg, "a<b"));
	ck_assert(!strchr(svg, '\x01') && !strchr(svg, '\xff'));
	free(svg);

	/* the escaper on its own, including a truncated multibyte sequence */
	rt_buf buf = RT_BUF_INIT;
	rt_svg_escape_append(&buf, "<&>\"'\t\n\xe2\x82");
	ck_assert_str_eq(buf.s, "&lt;&amp;&gt;&quot;&apos;\t\n??");
	ck_assert_uint_eq(buf.len, strlen(buf.s));
	rt_buf_free(&buf);
}
END_TEST

START_TEST(test_nan_skipped)
{
	double x[6] = {1, 2, 4, 8, 16, 32};
	double y[6] = {1, 2, NAN, 4, 5, INFINITY};
	double x2[4] = {0, -2, 4, 8}, y2[4] = {3, 3, NAN, 1};
	rt_svg_series s[2] = {{"gappy", x, y, 6, NULL, NULL}, {"neg", x2, y2, 4, NULL, NULL}};
	rt_svg_plot p = {"t", NULL, NULL, 0, 0, 1, 0, 0, 0};
	rt_err err = {0};
	char *svg = rt_svg_render(&p, s, 2, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	ASSERT_WF(svg);
	ck_assert(!strstr(svg, "nan") && !strstr(svg, "inf"));
	/* 4 drawable points in series 0 (circles), 1 in series 1 (squares: x=0, -2 are not
	 * drawable on a log axis, y=NaN is skipped) */
	ck_assert_int_eq(count_sub(svg, "<circle class=\"pt\""), 4);
	ck_assert_int_eq(count_sub(svg, "<rect class=\"pt\""), 1);
	/* series 0's path: M L (gap) M L, no segment across the NaN */
	const char *g0 = strstr(svg, "id=\"series0\"");
	ck_assert_ptr_nonnull(g0);
	const char *d = strstr(g0, " d=\"");
	ck_assert_ptr_nonnull(d);
	const char *e = strchr(d + 4, '"');
	int nm = 0, nl = 0;
	for (const char *c = d + 4; c < e; c++) {
		nm += *c == 'M';
		nl += *c == 'L';
	}
	ck_assert_int_eq(nm, 2);
	ck_assert_int_eq(nl, 2);
	free(svg);

	/* all points missing: still a valid plot with axes */
	double xn[2] = {NAN, NAN}, yn[2] = {1, 2};
	rt_svg_series sn = {"none", xn, yn, 2, NULL, NULL};
	svg = rt_svg_render(&p, &sn, 1, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	ASSERT_WF(svg);
	ck_assert_int_eq(count_sub(svg, "class=\"pt\""), 0);
	free(svg);
	/* no series at all */
	svg = rt_svg_render(&p, NULL, 0, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	ASSERT_WF(svg);
	free(svg);
}
END_TEST

START_TEST(test_deterministic_and_file)
{
	double y[4] = {0.0123, 0.05, 0.11, 0.31}, y2[4] = {0.01, 0.02, 0.09, 0.2};
	rt_svg_series s[2] = {{"a", X4, y, 4, NULL, NULL}, {"b", X4, y2, 4, NULL, NULL}};
	rt_svg_plot p = {"KLD", "compression", "mean KLD (nats)", 0, 0, 1, 0, 0, 0};
	rt_err err = {0};
	size_t l1, l2;
	char *a = rt_svg_render(&p, s, 2, &l1, &err);
	char *b = rt_svg_render(&p, s, 2, &l2, &err);
	ck_assert_uint_eq(l1, l2);
	ck_assert(memcmp(a, b, l1) == 0);
	char path[64];
	snprintf(path, sizeof(path), "/tmp/test_svg_%s", "......");
	memset(path + strlen(path) - 6, 'X', 6); /* mkstemp's template suffix */
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(rt_svg_write(path, &p, s, 2, &err), 0);
	size_t fl;
	char *f = rt_read_file(path, &fl, &err);
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fl, l1);
	ck_assert(memcmp(f, a, l1) == 0);
	unlink(path);
	free(f);
	free(a);
	free(b);
}
END_TEST

START_TEST(test_odd_ranges)
{
	rt_err err = {0};
	rt_svg_plot p = {"t", "x", "y", 0, 0, 1, 0, 0, 0};
	/* one point at a ratio that is not a power of two: ticks at the neighbours 2 and 4 */
	double x3[1] = {3}, y3[1] = {0.5};
	rt_svg_series s3 = {"three", x3, y3, 1, NULL, NULL};
	char *svg = rt_svg_render(&p, &s3, 1, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	ASSERT_WF(svg);
	ck_assert(strstr(svg, "text-anchor=\"middle\">2</text>"));
	ck_assert(strstr(svg, "text-anchor=\"middle\">4</text>"));
	ck_assert_int_eq(count_sub(svg, "class=\"pt\""), 1);
	free(svg);
	/* extreme magnitudes and sub-1 ratios: finite coordinates, no nan/inf text */
	double xe[3] = {0.25, 1, 1024}, ye[3] = {-1.7e308, 0, 1.7e308};
	rt_svg_series se = {"extreme", xe, ye, 3, NULL, NULL};
	svg = rt_svg_render(&p, &se, 1, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	ASSERT_WF(svg);
	ck_assert(!strstr(svg, "nan") && !strstr(svg, "inf"));
	ck_assert(strstr(svg, ">1/4</text>") && strstr(svg, ">1024</text>"));
	ck_assert_int_eq(count_sub(svg, "class=\"pt\""), 3);
	free(svg);
	double yt[2] = {1.7e308, 1.7e308};
	rt_svg_series st = {"top", xe, yt, 2, NULL, NULL};
	svg = rt_svg_render(&p, &st, 1, NULL, &err);
	ck_assert_ptr_nonnull(svg);
	ASSERT_WF(svg);
	ck_assert(!strstr(svg, "nan") && !strstr(svg, "inf"));
	free(svg);
}
END_TEST

START_TEST(test_errors)
{
	rt_err err = {0};
	double y[1] = {1};
	rt_svg_series s = {"a", X4, y, 1, NULL, NULL};
	rt_svg_plot p = {"t", NULL, NULL, 10, 10, 1, 0, 0, 0};
	ck_assert_ptr_null(rt_svg_render(&p, &s, 1, NULL, &err));
	ck_assert_str_eq(err.msg, "svg: size 10x10 outside 200..8192 pixels");
	p.width = p.height = 0;
	rt_svg_series bad = {"b", NULL, y, 3, NULL, NULL};
	ck_assert_ptr_null(rt_svg_render(&p, &bad, 1, NULL, &err));
	ck_assert_str_eq(err.msg, "svg: series 0 has no data arrays or a negative count");
	ck_assert_ptr_null(rt_svg_render(&p, &s, -1, NULL, &err));
	ck_assert_int_eq(rt_svg_write("/nonexistent-dir/x.svg", &p, &s, 1, &err), -1);
	ck_assert_str_eq(err.msg,
	                 "/nonexistent-dir/x.svg: cannot open for writing: No such file or directory");
}
END_TEST

/* Error bars, the reference line, dodging and hollow markers (rt_svg.h). */
START_TEST(error_bars_dodge_and_reference_line)
{
	static const double y[4] = { 1.0, 2.0, 3.0, 4.0 };
	static const double lo[4] = { 0.5, 1.5, NAN, 3.0 }, hi[4] = { 1.5, 3.0, 3.5, 4.5 };
	rt_svg_series s[2] = { { "a", X4, y, 4, lo, hi }, { "b", X4, y, 4, NULL, NULL } };
	rt_svg_plot p = { "t", "x", "y", 0, 0, 1, 10.0, 1, -1.0 };
	rt_err err = { 0 };
	char *svg = rt_svg_render(&p, s, 2, NULL, &err);
	ck_assert_msg(svg != NULL, "%s", err.msg);
	const char *bad = xml_check(svg);
	ck_assert_msg(bad == NULL, "%s", bad);
	/* 3 bars (the NaN end drops one), each: stem at the marker's x, caps 8 px wide */
	ck_assert_int_eq(count_sub(svg, "class=\"errbar\""), 3);
	double cx[8], cy[8];
	ck_assert_int_eq(circles(svg, cx, cy, 8), 4);
	const char *q = svg;
	int k = 0;
	double scale = NAN;
	for (int j = 0; j < 4; j++) {
		if (j == 2)
			continue;
		q = strstr(q, "class=\"errbar\"");
		double X1, Yl, X2, Yh, c0, c1, c2, c3;
		ck_assert_int_eq(sscanf(strstr(q, "d=\"") + 3, "M%lf %lfL%lf %lfM%lf %*f L%lf", &X1, &Yl,
		                        &X2, &Yh, &c0, &c1), 6);
		(void)c2, (void)c3;
		ck_assert(X1 == X2 && fabs(X1 - cx[j]) < 0.01);
		ck_assert(fabs(c0 - (X1 - 4)) < 0.01 && fabs(c1 - (X1 + 4)) < 0.01);
		/* one linear y scale maps lo, y and hi: (Y(lo) - Y(y)) / (y - lo) is the same */
		double sc = (Yl - cy[j]) / (y[j] - lo[j]), sc2 = (cy[j] - Yh) / (hi[j] - y[j]);
		ck_assert(fabs(sc - sc2) < 0.02 * sc);
		if (k++)
			ck_assert(fabs(sc - scale) < 0.02 * sc);
		scale = sc;
		q++;
	}
	/* series b (squares, hollow) sits 10 px right of series a at every x */
	double rx[4];
	q = svg;
	for (int j = 0; j < 4; j++) {
		q = strstr(q, "<rect class=\"pt\"");
		ck_assert_ptr_nonnull(q);
		ck_assert_int_eq(sscanf(q, "<rect class=\"pt\" x=\"%lf\"", &rx[j]), 1);
		ck_assert(strstr(q, "fill=\"#ffffff\"") < strchr(q, '>'));
		ck_assert(fabs(rx[j] + 3.5 - cx[j] - 10.0) < 0.01);
		q++;
	}
	/* the reference line at y = -1 extends the y range below every point */
	const char *ref = strstr(svg, "class=\"ref\"");
	ck_assert_ptr_nonnull(ref);
	double ry;
	ck_assert_int_eq(sscanf(ref, "class=\"ref\" x1=\"%*f\" y1=\"%lf\"", &ry), 1);
	for (int j = 0; j < 4; j++)
		ck_assert(ry > cy[j]);
	free(svg);
}
END_TEST

static Suite *svg_suite(void)
{
	Suite *s = suite_create("svg");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_checker_itself);
	tcase_add_test(tc, test_basic_wellformed);
	tcase_add_test(tc, test_log2_and_linear_spacing);
	tcase_add_test(tc, test_escaping);
	tcase_add_test(tc, test_nan_skipped);
	tcase_add_test(tc, test_deterministic_and_file);
	tcase_add_test(tc, test_odd_ranges);
	tcase_add_test(tc, test_errors);
	tcase_add_test(tc, error_bars_dodge_and_reference_line);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed = check_run(svg_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
