"""svg: the line plot of `make results` (scripts/results/render.py, frontier.py).

line_plot(path, title, xlabel, series, bold) writes an SVG 1.1 file: one polyline with
markers per series, x on a log2 axis (ticks at the powers of two the data spans, labelled
"x2", "x4", ...), y = mean KL on a log10 axis (ticks at the decades), the legend at the
right. series: {name: [(x, y), ...]} (points with y <= 0 sit on the lowest decade);
bold(name): drawn solid and wider (the others dashed). Deterministic: the same input
gives the same bytes. Standard library only.
"""
import html
import math

PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
           "#666666", "#1f78b4", "#b2df8a", "#fb9a99", "#cab2d6", "#ff7f00", "#6a3d9a",
           "#b15928", "#000000"]


def line_plot(path, title, xlabel, series, bold=lambda name: False):
    W, H, ml, mr, mt, mb = 640, 360, 60, 170, 30, 40
    H = max(H, mt + 24 + 14 * len(series))
    xs = sorted({x for s in series.values() for x, _ in s if x > 0})
    ys = [k for s in series.values() for _, k in s if k > 0]
    lo = math.floor(math.log10(min(ys))) if ys else -3
    hi = math.ceil(math.log10(max(ys))) if ys else 0
    if hi == lo:
        hi = lo + 1
    lx0, lx1 = math.floor(math.log2(min(xs))), math.ceil(math.log2(max(xs)))
    if lx1 == lx0:
        lx1 = lx0 + 1
    X = lambda r: ml + (math.log2(r) - lx0) / (lx1 - lx0) * (W - ml - mr)
    Y = lambda k: mt + (hi - math.log10(max(k, 10 ** lo))) / (hi - lo) * (H - mt - mb)
    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="18" font-size="13">%s</text>' % (ml, html.escape(title))]
    for e in range(lo, hi + 1):
        y = Y(10 ** e)
        s.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">1e%d</text>' % (ml, W - mr, y, y, ml - 4, y + 4, e))
    for e in range(lx0, lx1 + 1):
        x = X(2 ** e)
        s.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">×%g</text>' % (x, x, mt, H - mb, x, H - mb + 14, 2 ** e))
    s.append('<text x="%d" y="%d" text-anchor="middle">%s</text>' % ((ml + W - mr) // 2, H - 6, html.escape(xlabel)))
    for i, (p, pts) in enumerate(sorted(series.items())):
        c = PALETTE[i % len(PALETTE)]
        fp = bold(p)
        dash = '' if fp else ' stroke-dasharray="4 3"'
        pts = sorted(pt for pt in pts if pt[0] > 0)
        s.append('<polyline fill="none" stroke="%s" stroke-width="%s"%s points="%s"/>' % (
            c, "2.2" if fp else "1.4", dash, " ".join("%.1f,%.1f" % (X(r), Y(k)) for r, k in pts)))
        for r, k in pts:
            s.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (X(r), Y(k), c))
        ly = mt + 12 + i * 14
        s.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d">%s</text>' % (
            W - mr + 8, W - mr + 28, ly - 4, ly - 4, c, dash, W - mr + 32, ly, html.escape(p)))
    s.append('</svg>')
    with open(path, "w") as f:
        f.write("\n".join(s) + "\n")
