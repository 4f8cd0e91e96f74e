/*
 * rt_keepmap: draws the kept positions of every (layer, KV head) list as an SVG grid
 * (rows = heads grouped by layer, columns = token positions or bins of them). See
 * rt_keepmap.h for the contract; text escaping is rt_svg's.
 */
#include "report/rt_keepmap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/rt_svg.h"

#include "base/rt_outpath.h"

/* ---- layout (pixels) ------------------------------------------------------------------ */

#define KM_LEFT 64      /* row labels */
#define KM_GRID_W 1240  /* grid width */
#define KM_RIGHT 56     /* per-row kept counts */
#define KM_TOP 100      /* title, subtitle, legend */
#define KM_LAYER_GAP 3  /* extra space between layers */
#define KM_BOTTOM 56    /* x axis and footnote */

static const char *const km_kept = "#0072B2";   /* Okabe & Ito blue */
static const char *const km_merged = "#D55E00"; /* Okabe & Ito vermillion */
static const char *const km_bg = "#ECECEC";

/* ---- summary -------------------------------------------------------------------------- */

void rt_keepmap_summarize(const rt_keepmap *km, rt_keepmap_summary *s)
{
	memset(s, 0, sizeof *s);
	int nh = km->n_layer * km->n_kv_head;
	for (int h = 0; h < nh; h++) {
		const rt_keepmap_head *e = &km->heads[h];
		s->entries += e->n;
		if (h == 0 || e->n < s->min_per_head)
			s->min_per_head = e->n;
		if (h == 0 || e->n > s->max_per_head)
			s->max_per_head = e->n;
		for (int32_t i = 0; e->count && i < e->n; i++)
			s->merged += e->count[i] > 1.0f;
	}
	s->mean_per_head = nh > 0 ? (double)s->entries / nh : 0;
}

/* ---- validation ----------------------------------------------------------------------- */

static int km_check(const rt_keepmap *km, rt_err *err)
{
	if (!km || km->n_layer < 1 || km->n_kv_head < 1 ||
	    (int64_t)km->n_layer * km->n_kv_head > 4096)
		return rt_err_set(err, "keepmap: need 1..4096 (layer, KV head) rows, got %d x %d",
		                  km ? km->n_layer : 0, km ? km->n_kv_head : 0);
	if (km->n_tokens < 1)
		return rt_err_set(err, "keepmap: need at least 1 token, got %lld",
		                  (long long)km->n_tokens);
	if (!km->heads)
		return rt_err_set(err, "keepmap: no head lists given");
	for (int l = 0; l < km->n_layer; l++)
		for (int h = 0; h < km->n_kv_head; h++) {
			const rt_keepmap_head *e = &km->heads[l * km->n_kv_head + h];
			if (e->n < 0 || (e->n > 0 && !e->pos))
				return rt_err_set(err, "keepmap: layer %d head %d: bad entry list (n = %d)",
				                  l, h, (int)e->n);
			for (int32_t i = 0; i < e->n; i++) {
				if (e->pos[i] < 0 || e->pos[i] >= km->n_tokens)
					return rt_err_set(err, "keepmap: layer %d head %d entry %d: position %d "
					                  "outside 0..%lld", l, h, (int)i, (int)e->pos[i],
					                  (long long)km->n_tokens - 1);
				if (e->count && !(e->count[i] >= 1.0f))
					return rt_err_set(err, "keepmap: layer %d head %d entry %d: count %g "
					                  "below 1", l, h, (int)i, (double)e->count[i]);
			}
		}
	return 0;
}

/* Smallest 1-2-5 step >= raw. */
static int64_t nice_step(double raw)
{
	int64_t p = 1;
	for (;;) {
		if ((double)p >= raw)
			return p;
		if ((double)(2 * p) >= raw)
			return 2 * p;
		if ((double)(5 * p) >= raw)
			return 5 * p;
		p *= 10;
	}
}

/* ---- render --------------------------------------------------------------------------- */

/* The layout of one render. */
typedef struct km_layout {
	int L, H, rows;          /* layers, KV heads, rows = L × H */
	int64_t N, bin;          /* tokens; positions per column */
	int cols;                /* columns */
	double cw;               /* column width, pixels */
	int rh, gap, grid_h;     /* row height, gap between layers, grid height */
	int width, height, font;
} km_layout;

static void km_layout_init(km_layout *g, const rt_keepmap *km)
{
	g->L = km->n_layer;
	g->H = km->n_kv_head;
	g->rows = g->L * g->H;
	g->N = km->n_tokens;
	g->bin = (g->N + RT_KEEPMAP_MAX_COLS - 1) / RT_KEEPMAP_MAX_COLS;
	g->cols = (int)((g->N + g->bin - 1) / g->bin);
	g->cw = (double)KM_GRID_W / g->cols;
	g->rh = 720 / g->rows;
	if (g->rh > 14)
		g->rh = 14;
	if (g->rh < 3)
		g->rh = 3;
	g->gap = g->L > 1 ? KM_LAYER_GAP : 0;
	g->grid_h = g->rows * g->rh + (g->L - 1) * g->gap;
	g->width = KM_LEFT + KM_GRID_W + KM_RIGHT;
	g->height = KM_TOP + g->grid_h + KM_BOTTOM;
	g->font = g->rh - 1 < 11 ? g->rh - 1 : 11;
}

/* The prologue, the hatch pattern, the style sheet and the background. */
static void km_draw_head(rt_buf *b, const km_layout *g)
{
	rt_buf_printf(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	          "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
	          "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Arial, "
	          "sans-serif\">\n", g->width, g->height, g->width, g->height);
	rt_buf_printf(b, "<defs>\n<pattern id=\"hatch\" patternUnits=\"userSpaceOnUse\" width=\"4\" "
	          "height=\"4\" patternTransform=\"rotate(45)\"><rect width=\"4\" height=\"4\" "
	          "fill=\"%s\"/><rect width=\"1.5\" height=\"4\" fill=\"#FFFFFF\" "
	          "fill-opacity=\"0.55\"/></pattern>\n</defs>\n", km_merged);
	rt_buf_printf(b, "<style type=\"text/css\">.k{fill:%s}.m{fill:url(#hatch)}.bg{fill:%s}"
	          ".lab{font-size:%dpx;fill:#333333}.t{font-size:15px;font-weight:bold}"
	          ".s{font-size:12px;fill:#222222}</style>\n", km_kept, km_bg, g->font);
	rt_buf_printf(b, "<rect width=\"%d\" height=\"%d\" fill=\"#FFFFFF\"/>\n", g->width,
	              g->height);
}

/* The title, the parameters and statistics line, and the legend. */
static void km_draw_title(rt_buf *b, const rt_keepmap *km, const km_layout *g)
{
	rt_keepmap_summary sm;
	rt_keepmap_summarize(km, &sm);
	const int64_t N = g->N, bin = g->bin;
	rt_buf_printf(b, "<text class=\"t\" x=\"%d\" y=\"22\">Kept KV entries per (layer, KV head): "
	          "policy ", KM_LEFT);
	rt_svg_escape_append(b, km->policy ? km->policy : "?");
	rt_buf_printf(b, "</text>\n<text class=\"s\" x=\"%d\" y=\"42\">", KM_LEFT);
	if (km->params && *km->params) {
		rt_buf_printf(b, "params ");
		rt_svg_escape_append(b, km->params);
		rt_buf_printf(b, "; ");
	}
	if (km->ratio > 0)
		rt_buf_printf(b, "ratio %g; ", km->ratio);
	else if (km->byte_ratio > 0)
		rt_buf_printf(b, "byte ratio %g (bytes against f16); ", km->byte_ratio);
	else
		rt_buf_printf(b, "policy's own budget; ");
	rt_buf_printf(b, "N = %lld tokens; %d layers x %d KV heads</text>\n", (long long)N, g->L,
	              g->H);
	rt_buf_printf(b, "<text class=\"s\" x=\"%d\" y=\"60\">kept per head: mean %.1f of %lld "
	          "positions (%.1f%%), min %d, max %d; %lld entries, %lld merged prototypes; "
	          "1 column = %lld token%s</text>\n", KM_LEFT, sm.mean_per_head, (long long)N,
	          100.0 * sm.mean_per_head / (double)N, (int)sm.min_per_head, (int)sm.max_per_head,
	          (long long)sm.entries, (long long)sm.merged, (long long)bin, bin > 1 ? "s" : "");
	int lx = KM_LEFT;
	rt_buf_printf(b, "<g class=\"legend\">\n<rect x=\"%d\" y=\"72\" width=\"14\" height=\"12\" "
	          "fill=\"%s\"/><text class=\"s\" x=\"%d\" y=\"82\">kept token%s</text>\n", lx,
	          km_kept, lx + 18, bin > 1 ? " (opacity = share of the column's tokens)" : "");
	lx += bin > 1 ? 390 : 110;
	rt_buf_printf(b, "<rect x=\"%d\" y=\"72\" width=\"14\" height=\"12\" fill=\"url(#hatch)\"/>"
	          "<text class=\"s\" x=\"%d\" y=\"82\">merged prototype (count &gt; 1), at its "
	          "position</text>\n", lx, lx + 18);
	lx += 300;
	rt_buf_printf(b, "<rect x=\"%d\" y=\"72\" width=\"14\" height=\"12\" fill=\"%s\"/>"
	          "<text class=\"s\" x=\"%d\" y=\"82\">evicted</text>\n", lx, km_bg, lx + 18);
	rt_buf_printf(b, "<text class=\"s\" x=\"%d\" y=\"82\" text-anchor=\"end\">kept</text>\n</g>\n",
	          g->width - 4);
}

/* The row of (layer l, KV head h): its background, a rectangle per column holding entries
 * (hatched when one of them is merged), its label and count. cnt, mrg: [cols] scratch. */
static void km_draw_row(rt_buf *b, const rt_keepmap *km, const km_layout *g, int l, int h,
                        int32_t *cnt, unsigned char *mrg)
{
	const rt_keepmap_head *e = &km->heads[l * g->H + h];
	const int rh = g->rh, cols = g->cols;
	const int64_t bin = g->bin;
	int y = KM_TOP + (l * g->H + h) * rh + l * g->gap;
	memset(cnt, 0, (size_t)cols * sizeof *cnt);
	memset(mrg, 0, (size_t)cols);
	for (int32_t i = 0; i < e->n; i++) {
		int c = (int)(e->pos[i] / bin);
		cnt[c]++;
		if (e->count && e->count[i] > 1.0f)
			mrg[c] = 1;
	}
	rt_buf_printf(b, "<g id=\"row-%d-%d\">", l, h);
	rt_buf_printf(b, "<rect class=\"bg\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>",
	          KM_LEFT, y, KM_GRID_W, rh - (rh > 4));
	for (int c = 0; c < cols; c++) {
		if (!cnt[c])
			continue;
		rt_buf_printf(b, "<rect class=\"%s\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" "
		          "height=\"%d\"", mrg[c] ? "m" : "k", KM_LEFT + c * g->cw, y, g->cw,
		          rh - (rh > 4));
		int64_t span = c == cols - 1 ? g->N - (int64_t)c * bin : bin;
		if (span > 1 && !mrg[c] && cnt[c] < span)
			rt_buf_printf(b, " fill-opacity=\"%.2f\"", (double)cnt[c] / (double)span);
		rt_buf_printf(b, "/>");
	}
	if (rh >= 6 || h == 0)
		rt_buf_printf(b, "<text class=\"lab\" x=\"%d\" y=\"%d\" text-anchor=\"end\">"
		          "L%d H%d</text>", KM_LEFT - 4, y + rh - 2, l, h);
	if (rh >= 6)
		rt_buf_printf(b, "<text class=\"lab\" x=\"%d\" y=\"%d\" text-anchor=\"end\">"
		          "%d</text>", g->width - 4, y + rh - 2, (int)e->n);
	rt_buf_printf(b, "</g>\n");
}

/* The position axis under the grid, with its ticks, labels and caption. */
static void km_draw_axis(rt_buf *b, const km_layout *g)
{
	int ya = KM_TOP + g->grid_h + 2;
	int64_t step = nice_step((double)g->N / 10.0);
	rt_buf_printf(b, "<g class=\"axis\" stroke=\"#444444\" stroke-width=\"1\">\n"
	          "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", KM_LEFT, ya,
	          KM_LEFT + KM_GRID_W, ya);
	for (int64_t p = 0; p < g->N; p += step) {
		double x = KM_LEFT + (double)p * g->cw / (double)g->bin;
		rt_buf_printf(b, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>\n", x, ya, x,
		              ya + 5);
	}
	rt_buf_printf(b, "</g>\n<g class=\"s\" text-anchor=\"middle\">\n");
	for (int64_t p = 0; p < g->N; p += step) {
		double x = KM_LEFT + (double)p * g->cw / (double)g->bin;
		rt_buf_printf(b, "<text x=\"%.2f\" y=\"%d\">%lld</text>\n", x, ya + 18, (long long)p);
	}
	rt_buf_printf(b, "</g>\n<text class=\"s\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">token "
	          "position (original, 0 = first token of the text)</text>\n",
	          KM_LEFT + KM_GRID_W / 2, ya + 40);
}

char *rt_keepmap_render(const rt_keepmap *km, size_t *len, rt_err *err)
{
	if (km_check(km, err) != 0)
		return NULL;
	km_layout g;
	km_layout_init(&g, km);
	int32_t *cnt = calloc((size_t)g.cols, sizeof *cnt);
	unsigned char *mrg = calloc((size_t)g.cols, 1);
	if (!cnt || !mrg) {
		free(cnt);
		free(mrg);
		rt_err_set(err, "keepmap: out of memory for %d columns", g.cols);
		return NULL;
	}
	rt_buf b = RT_BUF_INIT;
	km_draw_head(&b, &g);
	km_draw_title(&b, km, &g);
	rt_buf_printf(&b, "<g shape-rendering=\"crispEdges\">\n");
	for (int l = 0; l < g.L; l++)
		for (int h = 0; h < g.H; h++)
			km_draw_row(&b, km, &g, l, h, cnt, mrg);
	rt_buf_printf(&b, "</g>\n");
	km_draw_axis(&b, &g);
	rt_buf_printf(&b, "</svg>\n");
	free(cnt);
	free(mrg);
	return rt_buf_take(&b, len);
}

int rt_keepmap_write(const char *path, const rt_keepmap *km, rt_err *err)
{
	size_t n;
	char *s = rt_keepmap_render(km, &n, err);
	if (!s)
		return -1;
	int rc = rt_outpath_write(path, s, n, err);
	free(s);
	return rc;
}
