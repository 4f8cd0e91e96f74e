/*
 * rt_cli_tuned: the default compression ratios a build baked in, one per policy: `kvpc
 * build` reads them from each policy's tune sidecar (runtime/policy/rt_tuned.h, written
 * by `kvpc tune`) and hands the table to rt_cli_main_tuned (rt_cli.h). The policy choice
 * (runtime/policy/rt_pick.h) asks it for a policy's default when no ratio was given;
 * `info` shows it with its sidecar.
 */
#ifndef RT_CLI_TUNED_H
#define RT_CLI_TUNED_H

#include "policy/rt_policy.h"

/* A default compression ratio a build baked in for one policy. */
struct rt_cli_tuned {
	const char *policy;   /* the registered policy's name */
	double ratio;         /* the default compression ratio, >= 1 */
	const char *sidecar;  /* the sidecar it came from (shown by `info`) */
	int bytes;            /* 1: ratio counts bytes (--byte-ratio), 0: entries (--ratio) */
};

/* Install the table tuned[0..n) (NULL/0: none) for this process; it must outlive every
 * later call. */
void rt_cli_tuned_set(const struct rt_cli_tuned *tuned, int n);

/* The baked-in default ratio of policy p, or 0 when the binary has none for it (or p
 * never compresses); *bytes (may be NULL) = 1 when it counts bytes. */
double rt_cli_tuned_ratio(const struct kvp_policy *p, int *bytes);

/* The sidecar p's default came from, or NULL. */
const char *rt_cli_tuned_sidecar(const struct kvp_policy *p);

#endif
