"""The CPU attention backend subclass: while a request's prompt is processed, keep each
layer's keys and values as the forward computed them (post-RoPE, original positions), and
at the prompt's last chunk ask the kvpc library, with the window of last prompt queries,
which entries to keep, per (layer, KV head); then move them into place (docs/vllm.md,
"How it works").

The keys are not read back from the paged cache: vLLM's CPU backend writes cache rows with
cpu_attn_reshape_and_cache in a layout of its own ISA kernels, so the rows of a
[num_blocks, num_kv_heads, block_size, 2*head_size] slab are not plain key vectors.

Which batch rows end their prompt in this step is recorded from the model runner's
_update_states (after vLLM orders the batch), so the backend needs no request ids.
When KVPC_VLLM_DUMP names a directory, the kept sets (KEPT) and the reasons a request was
not compressed (ERRORS) are written to DIR/kept_rank{R}.json (one file per tensor-parallel
rank, heads numbered globally); without it they are not kept (a server would accumulate
them) and a reason is logged instead.
"""
import json
import os
import re

import numpy as np
import torch
from vllm.logger import init_logger

from . import lib, plan, xargs

logger = init_logger(__name__)

# this step's prefill rows with a kv policy, up to the compression point p:
# row -> (req_id, (policy, set, ratio, p), tokens computed before this chunk, final)
_STEP = {}
# req_id -> p - k of a compacted request (its logical token i >= p is in slot i - (p - k))
DELTA = {}
# req_id -> k: requests compacted in this step, whose block rows are cut at the next one
_TRIM = {}
# the model runner of this process (set at each step)
_RUNNER = None
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


_DUMP_DIR = os.environ.get("KVPC_VLLM_DUMP")


def _dump():
    d = _DUMP_DIR
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"kept_rank{_tp_rank()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"kept": KEPT, "errors": ERRORS}, f)
    os.replace(path + ".tmp", path)


def _select_row(impl, layer, keys, vals, queries, rid, args):
    """Kept positions per KV head of this rank ([H] int32 arrays) of one request's
    prompt (keys, vals: [p, H, d]; queries: [w, H*G, d], the last w before p) at its
    compression point."""
    policy, set_, ratio, p = args
    H = impl.num_kv_heads
    kept = lib.get().select(policy, set_, ratio,
                            keys.permute(1, 0, 2).float().unsqueeze(0).numpy(),
                            queries.float().unsqueeze(0).numpy(),
                            vals.permute(1, 0, 2).float().unsqueeze(0).numpy())[0]
    if _DUMP_DIR:
        h0 = _tp_rank() * H
        KEPT.setdefault(rid, {})[_layer_index(layer)] = {
            h0 + h: kept[h].tolist() for h in range(H)}
    return kept


def _error(rid, msg):
    if _DUMP_DIR:
        ERRORS[rid] = msg
    else:
        logger.warning("kvpc-vllm: request %s not compressed: %s", rid, msg)


def _compact_row(impl, layer, kv_cache, keys, vals, kept, md, row):
    """Write each KV head's k kept entries (their keys and values as the forward computed
    them) to the request's first k slots, in position order: slot j of head h holds the
    entry at position kept[h][j] >= j. The cache rows are written by vLLM's own
    cpu_attn_reshape_and_cache, so the ISA-specific layout stays vLLM's."""
    from vllm import _custom_ops as ops
    idx = torch.as_tensor(np.stack(kept), dtype=torch.long)          # [H, k]
    H, k = idx.shape
    heads = torch.arange(H).unsqueeze(1).expand(H, k)
    kc = keys[idx, heads].transpose(0, 1).contiguous()               # [k, H, d]
    vc = vals[idx, heads].transpose(0, 1).contiguous()
    nb, _, bs, _ = kv_cache.size()
    j = torch.arange(k)
    slots = (md.block_table[row, j // bs].long() * bs + j % bs).to(md.slot_mapping.dtype)
    cache = kv_cache.view((nb, impl.num_kv_heads, bs * 2, -1))
    key_cache, value_cache = cache.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(kc, vc, key_cache, value_cache, slots, layer.isa,
                                   k_scale=layer._k_scale_float, v_scale=layer._v_scale_float,
                                   kv_cache_dtype=impl.kv_cache_dtype)


def on_prefill(impl, layer, query, key, value, kv_cache, md):
    """Stash this chunk's keys, values and last window queries of every prefill row with a
    kv policy (the CPU backend stores cache rows in an ISA-specific packed layout, so the
    keys are taken as the forward computed them: post-RoPE, [tokens, num_kv_heads,
    head_size]); at the chunk that ends the compression point, select, and compact when
    plan.decide says the scheduler freed the request's surplus blocks. The window may span
    chunks: each chunk keeps its last w query rows."""
    li = _layer_index(layer)
    H, d = impl.num_kv_heads, impl.head_size
    G = impl.num_heads // H
    for row, (rid, args, computed, final) in _STEP.items():
        s, e = int(md.query_start_loc[row]), int(md.query_start_loc[row + 1])
        try:
            w = plan.window(args, G, d)
        except lib.KvpcError as ex:
            _error(rid, str(ex))
            continue
        chunks = _STASH.setdefault((rid, li), [])
        chunks.append((key[s:e].clone(), value[s:e].clone(),
                       query[max(s, e - w):e].reshape(-1, H * G, d).clone()))
        if not final:
            continue
        del _STASH[(rid, li)]
        keys = torch.cat([c[0] for c in chunks])
        vals = torch.cat([c[1] for c in chunks])
        queries = torch.cat([c[2] for c in chunks])[queries_from(chunks, w):]
        k, why = plan.decide(args, computed, e - s, G, d)
        try:
            if keys.shape[0] != args[3]:
                raise lib.KvpcError(1, f"kvpc-vllm: {keys.shape[0]} prompt keys seen, the "
                                       f"compression point is {args[3]} (prefix caching "
                                       "must be off, and a chunk must end at kv.prompt)")
            kept = _select_row(impl, layer, keys, vals, queries, rid, args)
        except lib.KvpcError as ex:
            if k is not None:  # the scheduler has freed the blocks: going on would corrupt
                raise RuntimeError(f"kvpc-vllm: request {rid}: {ex}") from None
            _error(rid, str(ex))
            continue
        if why:
            _error(rid, why)
        if k is None:
            continue
        if any(len(x) != k for x in kept):
            raise RuntimeError(f"kvpc-vllm: request {rid}: layer {li} keeps "
                               f"{sorted({len(x) for x in kept})} entries per head, the "
                               f"plan {k}: not a same-count (paged) policy")
        _compact_row(impl, layer, kv_cache, keys, vals, kept, md, row)
        DELTA[rid] = args[3] - k
        _TRIM[rid] = k
    _dump()


def queries_from(chunks, w):
    """Index of the first of the last w stashed query rows."""
    return max(0, sum(c[2].shape[0] for c in chunks) - w)


def _row_deltas(runner, n):
    """[n] int32: DELTA of each batch row in the runner's current order (0 when none)."""
    ids = runner.input_batch.req_ids
    return torch.tensor([DELTA.get(ids[i], 0) if i < len(ids) else 0 for i in range(n)],
                        dtype=torch.int32)


def _classes():
    import dataclasses
    from vllm.v1.attention.backends.cpu_attn import (CPUAttentionBackend,
                                                     CPUAttentionBackendImpl,
                                                     CPUAttentionMetadataBuilder)

    class KvpcCPUAttentionImpl(CPUAttentionBackendImpl):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                    output_scale=None, output_block_scale=None):
            out = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                  output_scale, output_block_scale)
            if attn_metadata is not None and _STEP:
                with torch.no_grad():
                    on_prefill(self, layer, query, key, value, kv_cache, attn_metadata)
            return out

    class KvpcCPUAttentionMetadataBuilder(CPUAttentionMetadataBuilder):
        def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
            # a compacted request attends its slots 0 .. seq_len - DELTA - 1
            cm = common_attn_metadata
            if DELTA and _RUNNER is not None:
                d = _row_deltas(_RUNNER, cm.seq_lens.shape[0]).to(cm.seq_lens.dtype)
                if bool(d.any()):
                    cm = dataclasses.replace(cm, seq_lens=cm.seq_lens - d)
            return super().build(common_prefix_len, cm, fast_build)

    class KvpcCPUAttentionBackend(CPUAttentionBackend):
        @staticmethod
        def get_impl_cls():
            return KvpcCPUAttentionImpl

        @staticmethod
        def get_builder_cls():
            return KvpcCPUAttentionMetadataBuilder

    return KvpcCPUAttentionBackend


def __getattr__(name):  # the class path register_backend names, built on first use
    if name == "KvpcCPUAttentionBackend":
        cls = _classes()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def _trim(runner, rid, k):
    """Cut the worker's block list of a request compacted to k entries to the blocks the
    scheduler left it (sched.py), so that the blocks it appends next land at the right
    index of the row."""
    st = runner.requests.get(rid)
    row = runner.input_batch.req_id_to_index.get(rid)
    if st is None or row is None:
        return
    for g, bt in enumerate(runner.input_batch.block_table.block_tables):
        m = -(-k // bt.block_size)
        nb = int(bt.num_blocks_per_row[row])
        if nb > m:
            bt.block_table.np[row, m:nb] = 0
            bt.num_blocks_per_row[row] = m
            del st.block_ids[g][m:]


def _patch_runner():
    from vllm.v1.worker.block_table import MultiGroupBlockTable
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    orig = GPUModelRunner._update_states
    if getattr(orig, "_kvpc", False):
        return

    def _update_states(self, scheduler_output):
        global _RUNNER
        _RUNNER = self
        cached = scheduler_output.scheduled_cached_reqs
        gone = set(scheduler_output.finished_req_ids) | set(cached.resumed_req_ids)
        for rid in gone:
            DELTA.pop(rid, None)   # a preempted request is recomputed from its start
            _TRIM.pop(rid, None)
        for key in [key for key in _STASH if key[0] in gone]:
            del _STASH[key]
        for rid, k in _TRIM.items():
            _trim(self, rid, k)
        _TRIM.clear()
        out = orig(self, scheduler_output)
        plan_rows = {}
        nst = scheduler_output.num_scheduled_tokens
        for row, rid in enumerate(self.input_batch.req_ids):
            st = self.requests.get(rid)
            sp = getattr(st, "sampling_params", None)
            extra = getattr(sp, "extra_args", None)
            if not extra or "kv" not in extra or st.prompt_token_ids is None or rid in DELTA:
                continue
            args = plan.with_point(xargs.parse(extra), len(st.prompt_token_ids))
            c = st.num_computed_tokens
            if c < args[3] and nst.get(rid, 0) > 0:
                plan_rows[row] = (rid, args, c, args[3] <= c + nst[rid])
        _STEP.clear()
        _STEP.update(plan_rows)
        return out

    _update_states._kvpc = True
    GPUModelRunner._update_states = _update_states

    orig_slots = MultiGroupBlockTable.compute_slot_mapping

    def compute_slot_mapping(self, num_reqs, query_start_loc, positions):
        # a compacted request's logical token i (its RoPE position) lives in slot i - DELTA
        if DELTA and _RUNNER is not None:
            d = _row_deltas(_RUNNER, num_reqs)
            if bool(d.any()):
                counts = (query_start_loc[1:num_reqs + 1] - query_start_loc[:num_reqs]).cpu()
                per_tok = torch.repeat_interleave(d, counts.long())
                positions = positions.clone()
                positions[:per_tok.shape[0]] -= per_tok.to(positions.dtype)
        return orig_slots(self, num_reqs, query_start_loc, positions)

    MultiGroupBlockTable.compute_slot_mapping = compute_slot_mapping


def install():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    register_backend(AttentionBackendEnum.CPU_ATTN, "kvpc_vllm.backend.KvpcCPUAttentionBackend")
    _patch_runner()
