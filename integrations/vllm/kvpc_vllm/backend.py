"""The CPU attention backend subclass: at the end of a request's prompt, gather each
layer's keys from the paged cache and the window queries from the forward, and ask the
kvpc library which entries to keep, per (layer, KV head).

vLLM's CPU cache holds, per layer, [num_blocks, num_kv_heads, block_size, 2*head_size]:
each (block, head) slab holds block_size keys then block_size values. Keys there are
post-RoPE at their original positions, which is what the library takes.

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

# this step's rows whose prompt ends in it: row -> (req_id, (policy, set, ratio), n)
_STEP = {}
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


def _select_row(impl, layer, query, kv_cache, md, row, rid, args, n):
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
    nblk, _, bs, _ = kv_cache.shape
    kv = kv_cache.view(nblk, H, 2 * bs, d)
    nb = (n + bs - 1) // bs
    ids = md.block_table[row, :nb].long()
    slab = kv[ids]                                     # [nb, H, 2*bs, d]
    keys = slab[:, :, :bs, :].permute(1, 0, 2, 3).reshape(H, nb * bs, d)[:, :n]
    vals = slab[:, :, bs:, :].permute(1, 0, 2, 3).reshape(H, nb * bs, d)[:, :n]
    q = query[e - w:e].reshape(w, H * G, d)
    kept = L.select(policy, set_, ratio, keys.float().unsqueeze(0).numpy(),
                    q.float().unsqueeze(0).numpy(), vals.float().unsqueeze(0).numpy())[0]
    h0 = _tp_rank() * H
    KEPT.setdefault(rid, {})[_layer_index(layer)] = {
        h0 + h: kept[h].tolist() for h in range(H)}


def on_prompt_end(impl, layer, query, kv_cache, md):
    for row, (rid, args, n) in _STEP.items():
        try:
            _select_row(impl, layer, query, kv_cache, md, row, rid, args, n)
        except lib.KvpcError as e:
            ERRORS[rid] = str(e)
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
                    on_prompt_end(self, layer, query, kv_cache, attn_metadata)
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
            if st.num_computed_tokens < n <= st.num_computed_tokens + nst.get(rid, 0):
                plan[row] = (rid, xargs.parse(extra), n)
        _STEP.clear()
        _STEP.update(plan)
        return out

    _update_states._kvpc = True
    GPUModelRunner._update_states = _update_states


def install():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    register_backend(AttentionBackendEnum.CPU_ATTN, "kvpc_vllm.backend.KvpcCPUAttentionBackend")
    _patch_runner()
