"""The scheduler's side of compaction: free the blocks a compacted request no longer needs
and size its later allocations by what it holds.

When the chunk that ends a request's compression point p is scheduled (plan.decide), the
workers will, in that step, keep k entries per (layer, KV head) and write them to the
request's first k slots (backend.py). From then on the request's logical token i >= p
lives in slot i - (p - k). So right after scheduling that chunk the scheduler cuts the
request's block list to cdiv(k, block_size) blocks and returns the rest to vLLM's pool,
and every later allocation for it counts p - k tokens fewer (DELTA). Returning the blocks
before the step has run is safe: the step runs before any later one can write them.

Only the KV cache coordinator's allocation arithmetic is wrapped; the freed blocks go
back through the block pool as vLLM's own free does.
"""
import inspect

from . import plan, xargs

# request id -> p - k, the tokens a compacted request no longer holds
DELTA = {}
# request id -> blocks freed by its compaction (for tests and the bench)
FREED = {}


def _gqa(vllm_config):
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    return mc.get_num_attention_heads(pc) // mc.get_num_kv_heads(pc), mc.get_head_size()


def _compact(sched, rid, k):
    coord = sched.kv_cache_manager.coordinator
    freed = 0
    for mgr in coord.single_type_managers:
        blocks = mgr.req_to_blocks.get(rid)
        if not blocks:
            continue
        m = -(-k // mgr.block_size)
        tail = blocks[m:]
        del blocks[m:]
        mgr.block_pool.free_blocks(reversed(tail))
        freed += len(tail)
    return freed


def _wrap_update_after_schedule(Scheduler):
    orig = Scheduler._update_after_schedule
    if getattr(orig, "_kvpc", False):
        return

    def _update_after_schedule(self, scheduler_output):
        todo = []
        for rid, nsched in scheduler_output.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            sp = getattr(req, "sampling_params", None)
            extra = getattr(sp, "extra_args", None)
            if not extra or "kv" not in extra or rid in DELTA:
                continue
            args = plan.with_point(xargs.parse(extra), req.num_prompt_tokens)
            k, _ = plan.decide(args, req.num_computed_tokens, nsched, *_gqa(self.vllm_config))
            if k is not None:
                todo.append((rid, args[3] - k, k))
        out = orig(self, scheduler_output)
        for rid, delta, k in todo:
            DELTA[rid] = delta
            FREED[rid] = _compact(self, rid, k)
        return out

    _update_after_schedule._kvpc = True
    Scheduler._update_after_schedule = _update_after_schedule


def _shift(orig, names):
    """Wrap a coordinator method so that, for a compacted request, the token counts in
    names are those of the slots it holds (logical count - DELTA)."""
    sig = inspect.signature(orig)

    def wrapped(self, *a, **kw):
        b = sig.bind(self, *a, **kw)
        d = DELTA.get(b.arguments["request_id"])
        if d:
            for nm in names:
                if nm in b.arguments:
                    b.arguments[nm] = max(0, b.arguments[nm] - d)
        return orig(*b.args, **b.kwargs)

    wrapped._kvpc = True
    return wrapped


def _forget(orig):
    def wrapped(self, request_id, *a, **kw):
        DELTA.pop(request_id, None)
        return orig(self, request_id, *a, **kw)

    wrapped._kvpc = True
    return wrapped


def install():
    """Wrap the scheduler, on the CPU backend only: the workers move entries in the CPU
    attention backend's subclass (backend.py), and freeing blocks that no worker compacts
    would hand a request's live entries to another."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        return
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
    from vllm.v1.core.sched.scheduler import Scheduler
    _wrap_update_after_schedule(Scheduler)
    C = KVCacheCoordinator
    if getattr(C.allocate_new_blocks, "_kvpc", False):
        return
    C.get_num_blocks_to_allocate = _shift(C.get_num_blocks_to_allocate, (
        "num_tokens", "total_computed_tokens", "num_local_computed_tokens",
        "num_tokens_main_model"))
    C.allocate_new_blocks = _shift(C.allocate_new_blocks, ("num_tokens", "num_tokens_main_model"))
    C.free = _forget(C.free)
    C.pop_blocks_for_free = _forget(C.pop_blocks_for_free)
