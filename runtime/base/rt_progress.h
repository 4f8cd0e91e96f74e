/*
 * rt_progress: progress of a long run on standard error, the same for every command (ppl,
 * needle, ab, keepmap, bench). On a terminal: one line redrawn at most 5 times a second,
 *   "ppl [##########..........]  50% 1024/2048 tokens, 85.3 tok/s, ETA 0:12"
 * cleared when the run ends. Otherwise (a log, CI): a plain line each time another tenth
 * of the work is done, "ppl: 50% (1024/2048 tokens, 85.3 tok/s, ETA 12 s)", so logs show
 * the run moving without a flood of lines. quiet silences both.
 */
#ifndef RT_PROGRESS_H
#define RT_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct rt_progress {
	const char *what;     /* the label (borrowed), e.g. the command's name */
	const char *unit;     /* what is counted ("tokens", "trials"); rate says "tok/s" for tokens */
	int64_t total;        /* units of the whole run (> 0) */
	int tty, quiet;
	FILE *out;            /* stderr */
	double t0, last;      /* start, last redraw (monotonic seconds) */
	int decile;           /* plain mode: tenths reported so far */
	int drawn;            /* tty mode: a line is on the screen */
} rt_progress;

/* Start: total units of work; quiet 1 prints nothing. The terminal test is isatty on
 * stderr's descriptor. */
void rt_progress_init(rt_progress *p, const char *what, const char *unit, int64_t total,
                      int quiet);

/* done units of total are finished (0 <= done <= total; values above total count as total). */
void rt_progress_update(rt_progress *p, int64_t done);

/* The run ended (successfully or not): clears the terminal line. */
void rt_progress_end(rt_progress *p);

#endif
