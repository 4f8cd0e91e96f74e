"""The CPU attention backend subclass: while a request's prompt is processed, keep each
layer's keys and values as the forward computed them (post-RoPE, original positions), and
at the prompt's last chunk ask the kvpc library, with the window queries of that chunk,
which entries to keep, per (layer, KV head).

The keys are not read back from the paged cache: vLLM's CPU backend writes cache rows with
cpu_attn_reshape_and_cache in a layout of its own ISA kernels, so the rows of a
[num_blocks, num_kv_heads, block_size, 2*head_size] slab are not plain key vectors.

Which batch rows end their prompt in this step is recorded from the model runner's
_update_states (after vLLM orders the batch), so the backend needs no request ids.
The kept sets are kept in KEPT and, when KVPC_VLLM_DUMP names a directory, written to
DIR/kept_rank{R}.json (one file per tensor-parallel rank, heads numbered globally).
"""
import json
import os
import re

import torch

from . import lib, xargs

# this step's prefill rows with a kv policy: row -> (req_id, (policy, set, ratio), n, final)
_STEP = {}
# (req_id, layer) -> [(keys, values) of each prefill chunk so far]
_STASH = {}
# req_id -> {layer: {global KV head: [kept positions]}}
KEPT = {}
# req_id -> error message of a failed selection
ERRORS = {}


def _layer_index(layer):
    m = re.search(r"layers\.(\d+)\.", getattr(layer, "layer_name", ""))
    return int(m.group(1)) if m else -1


def _tp_rank():
    try:
        from vllm.distributed import get_tensor_model_parallel_rank
        return get_tensor_model_parallel_rank()
    except Exception:  # not initialised: one process
        return 0


def _dump():
    d = os.environ.get("KVPC_VLLM_DUMP")
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"kept_rank{_tp_rank()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"kept": KEPT, "errors": ERRORS}, f)
    os.replace(path + ".tmp", path)


def _select_row(impl, layer, query, keys, vals, md, row, rid, args, n):
    policy, set_, ratio = args
    H, d = impl.num_kv_heads, impl.head_size
    G = impl.num_heads // H
    L = lib.get()
    s, e = int(md.query_start_loc[row]), int(md.query_start_loc[row + 1])
    w = L.window(policy, set_, ratio, G, d, n)
    if w > e - s:
        raise lib.KvpcError(5, f"policy {policy}: its window of {w} prompt queries spans "
                               f"more than the last prefill chunk ({e - s} tokens): raise "
                               "max_num_batched_tokens or disable chunked prefill")
    q = query[e - w:e].reshape(w, H * G, d)
    kept = L.select(policy, set_, ratio, keys.permute(1, 0, 2).float().unsqueeze(0).numpy(),
                    q.float().unsqueeze(0).numpy(),
                    vals.permute(1, 0, 2).float().unsqueeze(0).numpy())[0]
    h0 = _tp_rank() * H
    KEPT.setdefault(rid, {})[_layer_index(layer)] = {
        h0 + h: kept[h].tolist() for h in range(H)}


def on_prefill(impl, layer, query, key, value, md):
    """Stash this chunk's keys and values of every prefill row with a kv policy (the CPU
    backend stores cache rows in an ISA-specific packed layout, so the keys are taken as
    the forward computed them: post-RoPE, [tokens, num_kv_heads, head_size]); at the
    prompt's last chunk, select."""
    li = _layer_index(layer)
    for row, (rid, args, n, final) in _STEP.items():
        s, e = int(md.query_start_loc[row]), int(md.query_start_loc[row + 1])
        chunks = _STASH.setdefault((rid, li), [])
        chunks.append((key[s:e].clone(), value[s:e].clone()))
        if not final:
            continue
        del _STASH[(rid, li)]
        keys = torch.cat([c[0] for c in chunks])
        vals = torch.cat([c[1] for c in chunks])
        try:
            if keys.shape[0] != n:
                raise lib.KvpcError(1, f"kvpc-vllm: {keys.shape[0]} prompt keys seen, the "
                                       f"prompt has {n} (prefix caching must be off)")
            _select_row(impl, layer, query, keys, vals, md, row, rid, args, n)
        except lib.KvpcError as ex:
            ERRORS[rid] = str(ex)
    _dump()


def _classes():
    from vllm.v1.attention.backends.cpu_attn import (CPUAttentionBackend,
                                                     CPUAttentionBackendImpl)

    class KvpcCPUAttentionImpl(CPUAttentionBackendImpl):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                    output_scale=None, output_block_scale=None):
            out = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                  output_scale, output_block_scale)
            if attn_metadata is not None and _STEP:
                with torch.no_grad():
                    on_prefill(self, layer, query, key, value, attn_metadata)
            return out

    class KvpcCPUAttentionBackend(CPUAttentionBackend):
        @staticmethod
        def get_impl_cls():
            return KvpcCPUAttentionImpl

    return KvpcCPUAttentionBackend


def __getattr__(name):  # the class path register_backend names, built on first use
    if name == "KvpcCPUAttentionBackend":
        cls = _classes()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def _patch_runner():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    orig = GPUModelRunner._update_states
    if getattr(orig, "_kvpc", False):
        return

    def _update_states(self, scheduler_output):
        out = orig(self, scheduler_output)
        plan = {}
        nst = scheduler_output.num_scheduled_tokens
        for row, rid in enumerate(self.input_batch.req_ids):
            st = self.requests.get(rid)
            sp = getattr(st, "sampling_params", None)
            extra = getattr(sp, "extra_args", None)
            if not extra or "kv" not in extra or st.prompt_token_ids is None:
                continue
            n = len(st.prompt_token_ids)
            if st.num_computed_tokens < n and nst.get(rid, 0) > 0:
                final = n <= st.num_computed_tokens + nst[rid]
                plan[row] = (rid, xargs.parse(extra), n, final)
        _STEP.clear()
        _STEP.update(plan)
        return out

    _update_states._kvpc = True
    GPUModelRunner._update_states = _update_states


def install():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    register_backend(AttentionBackendEnum.CPU_ATTN, "kvpc_vllm.backend.KvpcCPUAttentionBackend")
    _patch_runner()
