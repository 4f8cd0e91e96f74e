/*
 * rt_svg: a small, dependency-free SVG 1.1 line plot for the A/B report (`kvpc ab
 * --plot OUT.svg`): several series of (x, y) points, x = compression ratio on a log2 axis
 * (or a linear axis), y = one metric, with a title, axis labels, tick marks and labels, a
 * legend and a colour-blind-safe palette (Okabe & Ito 2008) with a distinct dash pattern
 * and marker per series (filled for even series, hollow for odd ones, so a point hidden
 * under another series' point still shows) so the plot also reads in grey scale; optional
 * error bars, a horizontal reference line and a sideways offset ("dodge") between series.
 *
 * Output is deterministic: the same input gives the same bytes (coordinates printed with
 * two decimals in the C locale, no timestamps). All user text is XML-escaped (& < > " '),
 * C0 control bytes other than tab/newline and bytes of invalid UTF-8 become '?', so the
 * file is always well-formed XML.
 *
 * Missing data: a point whose x or y is NaN or infinite (or x <= 0 on a log axis) is not
 * drawn, and the series' line is broken there (no segment bridges a gap).
 */
#ifndef RT_SVG_H
#define RT_SVG_H

#include <stddef.h>

#include "base/rt_buf.h"
#include "base/rt_util.h"

/* One series; x and y have n entries each (borrowed, not copied). */
typedef struct rt_svg_series {
	const char *name;   /* legend text (UTF-8) */
	const double *x;    /* [n] */
	const double *y;    /* [n] */
	int n;
	/* [n] each, or both NULL: the ends of an interval around y[j] (e.g. a 95% confidence
	 * interval), drawn as a vertical error bar with caps; a non-finite end is not drawn */
	const double *lo, *hi;
} rt_svg_series;

typedef struct rt_svg_plot {
	const char *title;    /* may be NULL */
	const char *x_label;  /* may be NULL */
	const char *y_label;  /* may be NULL */
	int width, height;    /* pixels; 0 selects 720 x 440 */
	int x_log2;           /* 1: log2 x axis with ticks at powers of two */
	/* pixels between neighbouring series at one x, so equal points and their error bars
	 * stay visible side by side: series i is drawn at x + (i - (n_series - 1) / 2) * dodge
	 * pixels (0: no offset) */
	double dodge;
	int ref_line;         /* 1: a horizontal reference line at ref_y, inside the y range */
	double ref_y;
} rt_svg_plot;

/* Render the plot to a NUL-terminated heap string (caller frees); *len (if non-NULL)
 * receives its length in bytes. Errors (NULL, err set): n_series < 0 or > 64, a series
 * with n < 0 or NULL arrays when n > 0, width/height not in [200, 8192]. */
char *rt_svg_render(const rt_svg_plot *p, const rt_svg_series *s, int n_series, size_t *len,
                    rt_err *err);

/* Render and write to path. Errors: as rt_svg_render, and those of rt_outpath_write
 * (base/rt_outpath.h) for I/O. */
int rt_svg_write(const char *path, const rt_svg_plot *p, const rt_svg_series *s,
                 int n_series, rt_err *err);

/* Append the XML-escaped form of text (NULL: nothing) to b; b->s is non-NULL afterwards.
 * Shared by the SVG writers (rt_keepmap, the A/B grid) and exposed for tests. */
void rt_svg_escape_append(rt_buf *b, const char *text);

#endif
