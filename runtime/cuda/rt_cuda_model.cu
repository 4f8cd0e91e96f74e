/*
 * rt_cuda_model: device probe and the one-time weight upload of libkvrt_cuda (see
 * rt_cuda.h). The f32 weights of rt_model (one host allocation) are copied as one block,
 * so every tensor keeps its offset; the f16 option converts that block on the device and
 * keeps the f32 copy for the embedding gather and the norms.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <string.h>

#include "cuda/rt_cuda.h"
#include "cuda/rt_cuda_check.h"
#include "cuda/rt_cuda_internal.h"
#include "cuda/rt_cuda_kernels.cuh"

extern "C" int rt_cuda_probe(char *name, size_t name_len, double *peak_gbps, rt_err *err)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess)
		return rt_err_set(err, "no CUDA device: cudaGetDeviceCount: %s%s", cudaGetErrorString(e),
		                  e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
		                      ? " (no NVIDIA driver or GPU on this machine)" : "");
	if (n < 1)
		return rt_err_set(err, "no CUDA device: the driver reports 0 GPUs");
	cudaDeviceProp pr;
	RT_CU_TRY(err, cudaGetDeviceProperties(&pr, 0));
	if (name && name_len)
		snprintf(name, name_len, "%s", pr.name);
	if (peak_gbps) {
		int clk_khz = 0, bus_bits = 0;
		*peak_gbps = 0;
		if (cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess &&
		    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0) == cudaSuccess)
			*peak_gbps = 2.0 * clk_khz * 1e3 * (bus_bits / 8.0) / 1e9; /* DDR: 2 transfers/clock */
	}
	return n;
}

extern "C" void rt_cuda_model_free(rt_cuda_model *dm)
{
	if (!dm)
		return;
	cudaFree(dm->f32);
	cudaFree(dm->f16);
	free(dm->layers);
	free(dm);
}

extern "C" size_t rt_cuda_model_bytes(const rt_cuda_model *dm)
{
	return dm ? dm->bytes : 0;
}

/* The device address of host weight pointer p (inside m->mem). */
static const float *dev_f32(const rt_model *m, const rt_cuda_model *dm, const float *p)
{
	return dm->f32 + (p - m->mem);
}

static const void *dev_w(const rt_model *m, const rt_cuda_model *dm, const float *p)
{
	if (dm->wt == RT_CUDA_W_F16)
		return dm->f16 + (p - m->mem);
	return dev_f32(m, dm, p);
}

extern "C" rt_cuda_model *rt_cuda_model_upload(const rt_model *m, enum rt_cuda_wtype wt, rt_err *err)
{
	if (!m->exact || !m->mem) {
		rt_err_set(err, "%s: cuda: the device takes the exact path's f32 weights; load the model "
		           "with rt_model_load_opts (exact = 1)", m->path);
		return NULL;
	}
	if (m->hp.n_swa || m->rope_factors || m->hp.rope_freq_scale != 1.0f || m->hp.rope_yarn ||
	    m->hp.rope_attn_factor != 1.0f) {
		rt_err_set(err, "%s: cuda: the device forward rotates at rope.freq_base alone, over every "
		           "entry: sliding-window layers, RoPE scaling and rope_freqs.weight run on the "
		           "CPU path only", m->path);
		return NULL;
	}
	if (rt_cuda_probe(NULL, 0, NULL, err) < 0)
		return NULL;
	rt_cuda_model *dm = (rt_cuda_model *)calloc(1, sizeof *dm);
	const size_t nf = m->mem_bytes / sizeof(float);
	if (!dm || !(dm->layers = (rt_cuda_layer *)calloc((size_t)m->hp.n_layer, sizeof *dm->layers))) {
		free(dm);
		rt_err_set(err, "%s: cuda: out of host memory", m->path);
		return NULL;
	}
	dm->hp = m->hp;
	dm->wt = wt;
	RT_CU_GOTO(err, cudaSetDevice(0));
	RT_CU_GOTO(err, cudaMalloc((void **)&dm->f32, m->mem_bytes));
	RT_CU_GOTO(err, cudaMemcpy(dm->f32, m->mem, m->mem_bytes, cudaMemcpyHostToDevice));
	dm->bytes = m->mem_bytes;
	if (wt == RT_CUDA_W_F16) {
		RT_CU_GOTO(err, cudaMalloc((void **)&dm->f16, nf * sizeof(__half)));
		rt_cu_to_half<<<rt_cu_blocks(nf, 256), 256>>>(dm->f16, dm->f32, nf);
		RT_CU_GOTO(err, cudaGetLastError());
		RT_CU_GOTO(err, cudaDeviceSynchronize());
		dm->bytes += nf * sizeof(__half);
	}
	dm->tok_embd = dev_f32(m, dm, m->tok_embd);
	dm->out_norm = dev_f32(m, dm, m->out_norm);
	dm->output = dev_w(m, dm, m->output);
	for (int l = 0; l < m->hp.n_layer; l++) {
		const rt_layer *L = &m->layers[l];
		rt_cuda_layer *D = &dm->layers[l];
		D->attn_norm = dev_f32(m, dm, L->attn_norm);
		D->ffn_norm = dev_f32(m, dm, L->ffn_norm);
		D->wq = dev_w(m, dm, L->wq);
		D->wk = dev_w(m, dm, L->wk);
		D->wv = dev_w(m, dm, L->wv);
		D->wo = dev_w(m, dm, L->wo);
		D->w_gate = dev_w(m, dm, L->w_gate);
		D->w_up = dev_w(m, dm, L->w_up);
		D->w_down = dev_w(m, dm, L->w_down);
	}
	return dm;
fail:
	rt_cuda_model_free(dm);
	return NULL;
}
