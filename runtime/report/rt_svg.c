/*
 * rt_svg: renders the A/B report's metric-versus-compression line plot as SVG 1.1 text
 * (axes, "nice" 1-2-5 linear ticks or power-of-two log ticks, grid, legend, gaps at
 * missing points). See rt_svg.h for the contract.
 */
#include "report/rt_svg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rt_outpath.h"

void rt_svg_escape_append(rt_buf *b, const char *text)
{
	rt_buf_reserve(b, 0);
	if (!text)
		return;
	size_t n = strlen(text);
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)text[i];
		const char *rep = NULL;
		char one[2] = {0, 0};
		size_t adv = 1;
		switch (c) {
		case '&': rep = "&amp;"; break;
		case '<': rep = "&lt;"; break;
		case '>': rep = "&gt;"; break;
		case '"': rep = "&quot;"; break;
		case '\'': rep = "&apos;"; break;
		default:
			if (c < 0x20 && c != '\t' && c != '\n') {
				rep = "?";
			} else if (c < 0x80) {
				one[0] = (char)c;
				rep = one;
			} else {
				size_t k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
				size_t bad;
				if (k > 1 && i + k <= n && rt_utf8_valid(text + i, k, &bad)) {
					rt_buf_append(b, text + i, k);
					i += k;
					continue;
				}
				rep = "?";
			}
		}
		rt_buf_puts(b, rep);
		i += adv;
	}
}

/* ---- axes ----------------------------------------------------------------------------- */

/* An axis: data range [lo, hi] in axis units (log2(x) on a log axis) and tick values. */
typedef struct axis {
	double lo, hi;
	double ticks[64];
	int n_ticks;
	int log2;
	int decimals; /* for linear tick labels */
	int sci;      /* 1: label with %.3g (extreme magnitudes) */
} axis;

static void axis_linear(axis *a, double mn, double mx)
{
	if (!(mn <= mx)) { /* no finite data */
		mn = 0.0;
		mx = 1.0;
	}
	if (mx == mn) {
		double pad = mn == 0.0 ? 1.0 : fabs(mn) * 0.1;
		mn -= pad;
		mx += pad;
	}
	double raw = (mx - mn) / 5.0;
	double mag = pow(10.0, floor(log10(raw)));
	double norm = raw / mag;
	double step = (norm < 1.5 ? 1.0 : norm < 3.0 ? 2.0 : norm < 7.0 ? 5.0 : 10.0) * mag;
	a->lo = floor(mn / step) * step;
	a->hi = ceil(mx / step) * step;
	if (!(isfinite(step) && step > 0.0 && isfinite(a->lo) && isfinite(a->hi) &&
	      a->hi > a->lo)) {
		/* extreme magnitudes: scale the data range itself, ticks at both ends */
		if (!isfinite(mx))
			mx = mn;
		a->lo = mn;
		a->hi = mx;
		a->ticks[0] = mn;
		a->ticks[1] = mx;
		a->n_ticks = 2;
		a->decimals = 0;
		a->log2 = 0;
		a->sci = 1;
		return;
	}
	a->sci = 0;
	a->n_ticks = 0;
	int nt = (int)lround((a->hi - a->lo) / step);
	for (int i = 0; i <= nt && a->n_ticks < 64; i++) {
		double v = a->lo + i * step;
		if (fabs(v) < step * 1e-9)
			v = 0.0;
		a->ticks[a->n_ticks++] = v;
	}
	int d = -(int)floor(log10(step) + 1e-9);
	a->decimals = d > 0 ? d : 0;
	a->log2 = 0;
}

static void axis_log2(axis *a, double mn, double mx)
{
	a->log2 = 1;
	a->decimals = 0;
	if (!(mn <= mx)) {
		mn = 1.0;
		mx = 8.0;
	}
	double lo = log2(mn) - 0.25, hi = log2(mx) + 0.25;
	int k0 = (int)ceil(lo), k1 = (int)floor(hi);
	if (k0 > k1) { /* no power of two inside: widen to the neighbouring ones */
		lo = floor(log2(mn)) - 0.25;
		hi = ceil(log2(mx)) + 0.25;
		k0 = (int)ceil(lo);
		k1 = (int)floor(hi);
	}
	a->lo = lo;
	a->hi = hi;
	a->sci = 0;
	int stride = 1;
	while ((k1 - k0) / stride + 1 > 12)
		stride *= 2;
	a->n_ticks = 0;
	for (int k = k0; k <= k1 && a->n_ticks < 64; k += stride)
		a->ticks[a->n_ticks++] = k;
}

/* (v - lo) / (hi - lo), computed on halves so that extreme finite values do not
 * overflow; 0.5 for an empty range; always finite. */
static double frac(double v, double lo, double hi)
{
	double den = hi * 0.5 - lo * 0.5;
	if (!(den > 0.0) || !isfinite(den))
		return 0.5;
	double f = (v * 0.5 - lo * 0.5) / den;
	return isfinite(f) ? f : 0.5;
}

static void tick_label(const axis *a, double v, char *buf, size_t cap)
{
	if (a->log2) {
		int k = (int)v;
		if (k >= 0)
			snprintf(buf, cap, "%.0f", ldexp(1.0, k));
		else
			snprintf(buf, cap, "1/%.0f", ldexp(1.0, -k));
	} else if (a->sci) {
		snprintf(buf, cap, "%.3g", v);
	} else {
		snprintf(buf, cap, "%.*f", a->decimals, v);
	}
}

/* ---- plot ----------------------------------------------------------------------------- */

static const char *const PALETTE[8] = {
	"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
};
static const char *const DASH[4] = {"", "8 4", "3 3", "10 3 3 3"};

static int point_ok(const rt_svg_plot *p, double x, double y)
{
	return isfinite(x) && isfinite(y) && (!p->x_log2 || x > 0.0);
}

/* One marker at (cx, cy) for series i: circle, square, triangle, diamond; filled for even
 * i, hollow (white inside a coloured outline) for odd i. */
static void marker(rt_buf *b, const char *cls, int i, double cx, double cy, const char *col)
{
	char fill[80];
	if (i % 2)
		snprintf(fill, sizeof fill, "#ffffff\" stroke=\"%s\" stroke-width=\"1.5", col);
	else
		snprintf(fill, sizeof fill, "%s", col);
	col = fill;
	switch (i % 4) {
	case 0:
		rt_buf_printf(b, "<circle class=\"%s\" cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"%s\"/>\n",
		          cls, cx, cy, col);
		break;
	case 1:
		rt_buf_printf(b, "<rect class=\"%s\" x=\"%.2f\" y=\"%.2f\" width=\"7\" height=\"7\" "
		          "fill=\"%s\"/>\n", cls, cx - 3.5, cy - 3.5, col);
		break;
	case 2:
		rt_buf_printf(b, "<path class=\"%s\" d=\"M%.2f %.2fL%.2f %.2fL%.2f %.2fZ\" fill=\"%s\"/>\n",
		          cls, cx, cy - 5, cx + 4.5, cy + 3.5, cx - 4.5, cy + 3.5, col);
		break;
	default:
		rt_buf_printf(b, "<path class=\"%s\" d=\"M%.2f %.2fL%.2f %.2fL%.2f %.2fL%.2f %.2fZ\" "
		          "fill=\"%s\"/>\n", cls, cx, cy - 5, cx + 5, cy, cx, cy + 5, cx - 5, cy, col);
	}
}

/* The plot area, the axes and the dodge of one render: where data values land. */
typedef struct frame {
	axis ax, ay;
	double x0, x1, y0, y1; /* plot area, pixels */
	double dodge;          /* pixels between neighbouring series at one x */
	int n_series;
	int W, H;
} frame;

/* Pixel x of data x v for series i (dodged), pixel y of data y v, pixel x of tick t. */
static double map_x(const frame *f, int i, double v)
{
	return f->x0 + frac(f->ax.log2 ? log2(v) : (v), f->ax.lo, f->ax.hi) * (f->x1 - f->x0) +
	       (i - (f->n_series - 1) / 2.0) * f->dodge;
}

static double map_y(const frame *f, double v)
{
	return f->y1 - frac((v), f->ay.lo, f->ay.hi) * (f->y1 - f->y0);
}

static double map_xt(const frame *f, double t)
{
	return f->x0 + frac((t), f->ax.lo, f->ax.hi) * (f->x1 - f->x0);
}

/* The arguments rt_svg_render refuses; *W, *H the size in pixels. 0, or -1 with err. */
static int plot_check(const rt_svg_plot *p, const rt_svg_series *s, int n_series, int *W,
                      int *H, rt_err *err)
{
	if (n_series < 0 || n_series > 64)
		return rt_err_set(err, "svg: %d series (allowed 0..64)", n_series);
	for (int i = 0; i < n_series; i++)
		if (s[i].n < 0 || (s[i].n > 0 && (!s[i].x || !s[i].y)))
			return rt_err_set(err, "svg: series %d has no data arrays or a negative count", i);
	*W = p->width ? p->width : 720;
	*H = p->height ? p->height : 440;
	if (*W < 200 || *W > 8192 || *H < 200 || *H > 8192)
		return rt_err_set(err, "svg: size %dx%d outside 200..8192 pixels", *W, *H);
	return 0;
}

/* The axes over the drawable points (error-bar ends and the reference line included) and
 * the plot area left beside the legend. */
static void frame_init(frame *f, const rt_svg_plot *p, const rt_svg_series *s, int n_series,
                       int W, int H)
{
	double xmn = INFINITY, xmx = -INFINITY, ymn = INFINITY, ymx = -INFINITY;
	size_t maxname = 0;
	for (int i = 0; i < n_series; i++) {
		size_t nl = s[i].name ? strlen(s[i].name) : 0;
		if (nl > maxname)
			maxname = nl;
		for (int j = 0; j < s[i].n; j++) {
			double x = s[i].x[j], y = s[i].y[j];
			if (!point_ok(p, x, y))
				continue;
			xmn = fmin(xmn, x);
			xmx = fmax(xmx, x);
			ymn = fmin(ymn, y);
			ymx = fmax(ymx, y);
			for (int e = 0; e < 2 && s[i].lo && s[i].hi; e++) {
				double v = e ? s[i].hi[j] : s[i].lo[j];
				if (isfinite(v))
					ymn = fmin(ymn, v), ymx = fmax(ymx, v);
			}
		}
	}
	if (p->ref_line && isfinite(p->ref_y) && ymn <= ymx)
		ymn = fmin(ymn, p->ref_y), ymx = fmax(ymx, p->ref_y);
	if (p->x_log2)
		axis_log2(&f->ax, xmn, xmx);
	else
		axis_linear(&f->ax, xmn, xmx);
	axis_linear(&f->ay, ymn, ymx);
	double legend_w = n_series ? 44.0 + 7.0 * (double)(maxname > 40 ? 40 : maxname) : 0.0;
	f->x0 = 72.0;
	f->x1 = W - 20.0 - legend_w;
	f->y0 = 48.0;
	f->y1 = H - 56.0;
	if (f->x1 < f->x0 + 50.0)
		f->x1 = f->x0 + 50.0;
	f->dodge = isfinite(p->dodge) && fabs(p->dodge) < 50 ? p->dodge : 0.0;
	f->n_series = n_series;
	f->W = W;
	f->H = H;
}

/* The XML prologue, the <svg> element, the title and the background. */
static void draw_head(rt_buf *b, const rt_svg_plot *p, const frame *f)
{
	rt_buf_printf(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
	rt_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
	          "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, "
	          "Arial, sans-serif\" font-size=\"12\">\n", f->W, f->H, f->W, f->H);
	rt_buf_printf(b, "<title>");
	rt_svg_escape_append(b, p->title ? p->title : "plot");
	rt_buf_printf(b, "</title>\n");
	rt_buf_printf(b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
	              f->W, f->H);
	if (p->title) {
		rt_buf_printf(b, "<text x=\"%.2f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" "
		          "font-weight=\"bold\">", (f->x0 + f->x1) / 2);
		rt_svg_escape_append(b, p->title);
		rt_buf_printf(b, "</text>\n");
	}
}

/* The grid, the axes with their ticks and tick labels, the axis labels and the reference
 * line. */
static void draw_axes(rt_buf *b, const rt_svg_plot *p, const frame *f)
{
	const axis *ax = &f->ax, *ay = &f->ay;
	rt_buf_printf(b, "<g class=\"grid\" stroke=\"#dddddd\" stroke-width=\"1\">\n");
	for (int i = 0; i < ax->n_ticks; i++) {
		double X = map_xt(f, ax->ticks[i]);
		rt_buf_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", X, f->y0,
		              X, f->y1);
	}
	for (int i = 0; i < ay->n_ticks; i++) {
		double Y = map_y(f, ay->ticks[i]);
		rt_buf_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", f->x0, Y,
		              f->x1, Y);
	}
	rt_buf_printf(b, "</g>\n");
	rt_buf_printf(b, "<g class=\"axes\" stroke=\"#000000\" stroke-width=\"1\">\n");
	rt_buf_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", f->x0, f->y1,
	              f->x1, f->y1);
	rt_buf_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", f->x0, f->y0,
	              f->x0, f->y1);
	for (int i = 0; i < ax->n_ticks; i++) {
		double X = map_xt(f, ax->ticks[i]);
		rt_buf_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n", X, f->y1,
		              X, f->y1 + 5);
	}
	for (int i = 0; i < ay->n_ticks; i++) {
		double Y = map_y(f, ay->ticks[i]);
		rt_buf_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n",
		              f->x0 - 5, Y, f->x0, Y);
	}
	rt_buf_printf(b, "</g>\n");
	char lab[64];
	rt_buf_printf(b, "<g class=\"ticklabels\" fill=\"#000000\">\n");
	for (int i = 0; i < ax->n_ticks; i++) {
		tick_label(ax, ax->ticks[i], lab, sizeof(lab));
		rt_buf_printf(b, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
		              map_xt(f, ax->ticks[i]), f->y1 + 19, lab);
	}
	for (int i = 0; i < ay->n_ticks; i++) {
		tick_label(ay, ay->ticks[i], lab, sizeof(lab));
		rt_buf_printf(b, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n",
		              f->x0 - 8, map_y(f, ay->ticks[i]) + 4, lab);
	}
	rt_buf_printf(b, "</g>\n");
	if (p->x_label) {
		rt_buf_printf(b, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">",
		              (f->x0 + f->x1) / 2, (double)f->H - 14);
		rt_svg_escape_append(b, p->x_label);
		rt_buf_printf(b, "</text>\n");
	}
	if (p->y_label) {
		double cy = (f->y0 + f->y1) / 2;
		rt_buf_printf(b, "<text x=\"18\" y=\"%.2f\" text-anchor=\"middle\" "
		          "transform=\"rotate(-90 18 %.2f)\">", cy, cy);
		rt_svg_escape_append(b, p->y_label);
		rt_buf_printf(b, "</text>\n");
	}
	if (p->ref_line && isfinite(p->ref_y) && ay->lo <= p->ref_y && p->ref_y <= ay->hi)
		rt_buf_printf(b, "<line class=\"ref\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
		          "stroke=\"#000000\" stroke-width=\"1\" stroke-dasharray=\"2 2\"/>\n",
		          f->x0, map_y(f, p->ref_y), f->x1, map_y(f, p->ref_y));
}

/* Series i: its line broken at missing points, its error bars, then its markers. */
static void draw_series(rt_buf *b, const rt_svg_plot *p, const rt_svg_series *si, int i,
                        const frame *f)
{
	const char *col = PALETTE[i % 8];
	const char *dash = DASH[i % 4];
	rt_buf_printf(b, "<g class=\"series\" id=\"series%d\">\n", i);
	rt_buf_printf(b, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s%s%s d=\"", col,
	          dash[0] ? " stroke-dasharray=\"" : "", dash, dash[0] ? "\"" : "");
	int pen = 0;
	for (int j = 0; j < si->n; j++) {
		double x = si->x[j], y = si->y[j];
		if (!point_ok(p, x, y)) {
			pen = 0;
			continue;
		}
		rt_buf_printf(b, "%s%.2f %.2f", pen ? " L" : (b->s[b->len - 1] == '"' ? "M" : " M"),
		              map_x(f, i, x), map_y(f, y));
		pen = 1;
	}
	rt_buf_printf(b, "\"/>\n");
	for (int j = 0; j < si->n && si->lo && si->hi; j++) {
		double x = si->x[j], y = si->y[j], lo = si->lo[j], hi = si->hi[j];
		if (!point_ok(p, x, y) || !isfinite(lo) || !isfinite(hi))
			continue;
		double X = map_x(f, i, x), Yl = map_y(f, lo), Yh = map_y(f, hi);
		rt_buf_printf(b, "<path class=\"errbar\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
		          "d=\"M%.2f %.2fL%.2f %.2fM%.2f %.2fL%.2f %.2fM%.2f %.2fL%.2f %.2f\"/>\n", col,
		          X, Yl, X, Yh, X - 4, Yl, X + 4, Yl, X - 4, Yh, X + 4, Yh);
	}
	for (int j = 0; j < si->n; j++) {
		double x = si->x[j], y = si->y[j];
		if (point_ok(p, x, y))
			marker(b, "pt", i, map_x(f, i, x), map_y(f, y), col);
	}
	rt_buf_printf(b, "</g>\n");
}

/* The legend right of the plot area: one line, marker and name per series. */
static void draw_legend(rt_buf *b, const rt_svg_series *s, int n_series, const frame *f)
{
	double lx = f->x1 + 16, ly = f->y0 + 6;
	rt_buf_printf(b, "<g class=\"legend\">\n");
	for (int i = 0; i < n_series; i++) {
		const char *col = PALETTE[i % 8];
		const char *dash = DASH[i % 4];
		double yy = ly + 20.0 * i;
		rt_buf_printf(b, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
		          "stroke-width=\"2\"%s%s%s/>\n", lx, yy, lx + 28, yy, col,
		          dash[0] ? " stroke-dasharray=\"" : "", dash, dash[0] ? "\"" : "");
		marker(b, "legend-pt", i, lx + 14, yy, col);
		rt_buf_printf(b, "<text x=\"%.2f\" y=\"%.2f\">", lx + 34, yy + 4);
		rt_svg_escape_append(b, s[i].name ? s[i].name : "");
		rt_buf_printf(b, "</text>\n");
	}
	rt_buf_printf(b, "</g>\n");
}

char *rt_svg_render(const rt_svg_plot *p, const rt_svg_series *s, int n_series, size_t *len,
                    rt_err *err)
{
	int W = 0, H = 0;
	if (plot_check(p, s, n_series, &W, &H, err) != 0)
		return NULL;
	frame f;
	frame_init(&f, p, s, n_series, W, H);
	rt_buf b = RT_BUF_INIT;
	draw_head(&b, p, &f);
	draw_axes(&b, p, &f);
	for (int i = 0; i < n_series; i++)
		draw_series(&b, p, &s[i], i, &f);
	if (n_series)
		draw_legend(&b, s, n_series, &f);
	rt_buf_printf(&b, "</svg>\n");
	return rt_buf_take(&b, len);
}

int rt_svg_write(const char *path, const rt_svg_plot *p, const rt_svg_series *s,
                 int n_series, rt_err *err)
{
	size_t n;
	char *txt = rt_svg_render(p, s, n_series, &n, err);
	if (!txt)
		return -1;
	int rc = rt_outpath_write(path, txt, n, err);
	free(txt);
	return rc;
}
