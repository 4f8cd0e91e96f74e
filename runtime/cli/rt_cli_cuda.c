/*
 * rt_cli_cuda: the device of ppl and bench (rt_cli_cuda.h): the CUDA backend's lookup,
 * the GPU probe, the weights uploaded once, and the move of each sequence to the device.
 * Everything else (options, text, tokens, the ppl/KL loop, bench, the reports) is the CPU
 * commands' own code.
 */
#include "cli/rt_cli_cuda.h"

#include <stdio.h>
#include <string.h>

#include "cuda/rt_cuda.h"

/* Defined by the CUDA registry unit of `kvpc build --cuda` binaries; absent elsewhere. */
extern const struct rt_cuda_backend kvp_cuda_backend __attribute__((weak));

/* The device of this process's command: the weights on the GPU (NULL on the CPU). */
static struct {
	const struct rt_cuda_backend *b;
	rt_cuda_model *dm;
	int f16;
} dev;

int rt_cli_on_device(const rt_cli_opts *o)
{
	return o->device && !strcmp(o->device, "cuda");
}

static int fail(const char *cmd, const char *msg)
{
	fprintf(stderr, "%s: %s --device cuda: %s\n", rt_cli_prog, cmd, msg);
	return 1;
}

int rt_cli_device_check(const char *cmd, const rt_cli_opts *o)
{
	if (!rt_cli_on_device(o))
		return o->f16_weights ? rt_cli_usage(cmd, "%s", "--f16: f16 weights are the GPU's "
		                                     "(give --device cuda)") : 0;
	if (!o->exact)
		return rt_cli_usage(cmd, "%s", "--fast: the GPU takes the exact path's f32 weights "
		                    "(or --f16 for their f16 copy)");
	if (o->kv_type && rt_kv_type_parse(o->kv_type) != RT_KV_F32)
		return rt_cli_usage(cmd, "--kv-type %s: the GPU stores f32 keys and values", o->kv_type);
	const struct rt_cuda_backend *b = &kvp_cuda_backend;
	if (!b)
		return fail(cmd, "this binary was built without CUDA (build one with kvpc build --cuda)");
	rt_err err = { "" };
	char name[256];
	if (b->probe(name, sizeof name, NULL, &err) < 0)
		return fail(cmd, err.msg);
	dev.b = b;
	dev.f16 = o->f16_weights;
	return 0;
}

int rt_cli_device_open(const char *cmd, const rt_cli_opts *o, const rt_model *m)
{
	if (!rt_cli_on_device(o))
		return 0;
	rt_err err = { "" };
	if (!dev.b)
		return fail(cmd, "the device was not checked (rt_cli_device_check)");
	dev.dm = dev.b->model_upload(m, dev.f16 ? RT_CUDA_W_F16 : RT_CUDA_W_F32, &err);
	return dev.dm ? 0 : fail(cmd, err.msg);
}

int rt_cli_device_attach(rt_seq *s, rt_err *err)
{
	if (!dev.dm)
		return 0;
	const struct kvp_cuda_policy *cp = NULL;
	if (s->p != &rt_policy_full && !(cp = rt_cuda_policy_find(dev.b, s->p)))
		return rt_err_setc(err, RT_ERR_INPUT, "policy %s: no CUDA unit in this binary (build "
		                   "it with kvpc build --cuda)", s->p->name);
	return dev.b->seq_attach(s, dev.dm, cp, err);
}

const char *rt_cli_device_weights(void)
{
	return dev.dm ? (dev.f16 ? "f16" : "f32") : NULL;
}

void rt_cli_device_close(void)
{
	if (dev.dm)
		dev.b->model_free(dev.dm);
	dev.dm = NULL;
}
