/*
 * rt_cuda_internal: the device model's layout, shared by the files of libkvrt_cuda only
 * (rt_cuda_model.cu uploads it, rt_cuda_seq.cu runs the forward over it). CUDA/C++ only.
 */
#ifndef RT_CUDA_INTERNAL_H
#define RT_CUDA_INTERNAL_H

#include <cuda_fp16.h>

#include "cuda/rt_cuda.h"

/* One block's weights on the device: norms f32; matrices in the model's wtype, row-major
 * [out × in] as rt_layer. */
typedef struct rt_cuda_layer {
	const float *attn_norm, *ffn_norm;
	const void *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;
} rt_cuda_layer;

struct rt_cuda_model {
	rt_model_hparams hp;
	enum rt_cuda_wtype wt;
	float *f32;              /* the f32 block (a copy of rt_model.mem) */
	__half *f16;             /* RT_CUDA_W_F16: the same block in half, else NULL */
	size_t bytes;
	const float *tok_embd;   /* [n_vocab × n_embd] f32 (gathered) */
	const float *out_norm;   /* [n_embd] */
	const void *output;      /* [n_vocab × n_embd] in wt */
	rt_cuda_layer *layers;   /* [n_layer] (host array of device pointers) */
};

#endif
