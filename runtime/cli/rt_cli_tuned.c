/*
 * rt_cli_tuned: the build's tuned default ratios; see rt_cli_tuned.h.
 */
#include "cli/rt_cli_tuned.h"

#include <string.h>

static const struct rt_cli_tuned *g_tuned;
static int g_n_tuned;

void rt_cli_tuned_set(const struct rt_cli_tuned *tuned, int n)
{
	g_tuned = tuned;
	g_n_tuned = tuned ? n : 0;
}

static const struct rt_cli_tuned *tuned_find(const struct kvp_policy *p)
{
	for (int i = 0; p && i < g_n_tuned; i++)
		if (!strcmp(g_tuned[i].policy, p->name))
			return &g_tuned[i];
	return NULL;
}

double rt_cli_tuned_ratio(const struct kvp_policy *p, int *bytes)
{
	const struct rt_cli_tuned *t = tuned_find(p);
	if (bytes)
		*bytes = t ? t->bytes : 0;
	return t && p->compress ? t->ratio : 0;
}

const char *rt_cli_tuned_sidecar(const struct kvp_policy *p)
{
	const struct rt_cli_tuned *t = tuned_find(p);
	return t ? t->sidecar : NULL;
}
