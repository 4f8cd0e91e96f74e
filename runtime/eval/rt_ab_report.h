/*
 * rt_ab_report: the reports of an A/B run (runtime/eval/rt_ab.h), apart from the engine
 * that measures it (rt_ab.c): the table on stdout (per ratio: every metric for the
 * reference, A and B, the NLL difference's interval, the verdict), --json (one object:
 * "meta" and "results" per ratio), --csv (one row per ratio and policy, the metadata in
 * columns) and --plot (one SVG, a panel per metric against the compression ratio). The
 * metrics are one table (METRICS in rt_ab_report.c) that every format reads.
 */
#ifndef RT_AB_REPORT_H
#define RT_AB_REPORT_H

#include <stdio.h>

#include "base/rt_util.h"

struct ab_run; /* the run's state, private to rt_ab.c and rt_ab_report.c: eval/rt_ab_int.h */

/* The report writer of `BIN ab`, passed to rt_ab_run (runtime/cli/rt_cmd_ab.c), so the
 * engine does not know its reports. Print the table of the finished run r to out, then
 * write the files its options name (r->o.json, .csv, .plot; their paths were checked before
 * the run). Returns 0, or -1 with err "PATH: reason" when a file cannot be written. */
int rt_ab_report_write(const struct ab_run *r, FILE *out, rt_err *err);

#endif
