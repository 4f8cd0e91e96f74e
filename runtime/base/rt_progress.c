/*
 * rt_progress: a progress bar on a terminal, a line per tenth otherwise; see rt_progress.h.
 */
#include "base/rt_progress.h"

#include <string.h>
#include <unistd.h>

#include "base/rt_util.h"

void rt_progress_init(rt_progress *p, const char *what, const char *unit, int64_t total,
                      int quiet)
{
	memset(p, 0, sizeof *p);
	p->what = what;
	p->unit = unit;
	p->total = total > 0 ? total : 1;
	p->quiet = quiet;
	p->out = stderr;
	p->tty = isatty(fileno(stderr));
	p->t0 = p->last = rt_now();
}

/* rate and ETA of done units after dt seconds */
static void rate_eta(const rt_progress *p, int64_t done, double dt, double *rate, double *eta)
{
	*rate = dt > 0 ? (double)done / dt : 0;
	*eta = *rate > 0 ? (double)(p->total - done) / *rate : -1;
}

/* "12.5 tok/s", or for less than one unit a second the seconds each takes ("95 s per
 * trial": a rate of "0.0 trials/s" says nothing). */
static void speed(char *buf, size_t cap, double rate, const char *unit)
{
	if (rate > 0 && rate < 1) {
		size_t n = strlen(unit);
		snprintf(buf, cap, "%.0f s per %.*s", 1.0 / rate,
		         (int)(n > 1 && unit[n - 1] == 's' ? n - 1 : n), unit);
	} else {
		snprintf(buf, cap, "%.1f %s/s", rate, unit);
	}
}

void rt_progress_update(rt_progress *p, int64_t done)
{
	if (p->quiet)
		return;
	if (done > p->total)
		done = p->total;
	double t = rt_now(), rate, eta;
	rate_eta(p, done, t - p->t0, &rate, &eta);
	const char *ru = !strcmp(p->unit, "tokens") ? "tok" : p->unit;
	int pct = (int)(100 * done / p->total);
	if (!p->tty) {
		int dec = (int)(10 * done / p->total);
		if (dec <= p->decile)
			return;
		p->decile = dec;
		char sp[48];
		speed(sp, sizeof sp, rate, ru);
		fprintf(p->out, "%s: %d%% (%lld/%lld %s, %s", p->what, pct, (long long)done,
		        (long long)p->total, p->unit, sp);
		if (eta >= 0 && done < p->total)
			fprintf(p->out, ", ETA %.0f s", eta);
		fputs(")\n", p->out);
		fflush(p->out);
		return;
	}
	if (done < p->total && p->drawn && t - p->last < 0.2)
		return;
	p->last = t;
	char bar[21];
	int k = (int)(20 * done / p->total);
	for (int i = 0; i < 20; i++)
		bar[i] = i < k ? '#' : '.';
	bar[20] = 0;
	char sp[48];
	speed(sp, sizeof sp, rate, ru);
	fprintf(p->out, "\r\033[K%s [%s] %3d%% %lld/%lld %s, %s", p->what, bar, pct,
	        (long long)done, (long long)p->total, p->unit, sp);
	if (eta >= 0 && done < p->total)
		fprintf(p->out, ", ETA %d:%02d", (int)eta / 60, (int)eta % 60);
	fflush(p->out);
	p->drawn = 1;
}

void rt_progress_end(rt_progress *p)
{
	if (p->quiet || !p->tty || !p->drawn)
		return;
	fputs("\r\033[K", p->out);
	fflush(p->out);
	p->drawn = 0;
}
