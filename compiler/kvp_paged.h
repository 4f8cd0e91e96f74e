/*
 * kvp_paged: which policies a paged engine can run in this version (`kvpc check --target
 * paged`, `kvpc build --shared`), decided from the IR.
 *
 * A paged engine (vLLM, TensorRT-LLM, SGLang: docs/vllm.md) stores every KV head of a
 * layer in one block and one block table serves every layer of a request, so what it can
 * carry is: evict-only, the same count in every (layer, KV head), original RoPE positions,
 * one precision, compressed once at the prompt end from the keys and the queries of the
 * last prompt window (the shared library replays exactly that, runtime/policy/rt_shared.h).
 * Each reason kvp_paged_check reports names one thing outside that subset and the place in
 * the .kvp source that asks for it.
 */
#ifndef KVP_PAGED_H
#define KVP_PAGED_H

#include "kvp_ir.h"
#include "kvp_src.h"

/* Report, as located errors on src ("FILE:LINE:COL: error: paged: REASON"), every reason
 * a paged engine cannot run the checked policy ir. Returns their number (0: it can). */
int kvp_paged_check(const struct kvp_ir *ir, kvp_src *src);

#endif
