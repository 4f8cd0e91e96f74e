"""The one rule that says whether, where and to how many entries a request is compacted.

The scheduler (which frees blocks, sched.py) and the workers (which move entries,
backend.py) must agree without talking to each other: a tensor-parallel worker is another
process, and the scheduler decides a step before the workers run it. So both call
decide() with what each of them knows alike: the request's kv object, its compression
point, the chunk that was scheduled, and the model's GQA group and head size.

A paged policy keeps the same count in every (layer, KV head) (`kvpc check --target
paged`), and that count follows from the budget, never from the keys; keep_count() asks
the library for it on a one-head probe, so the count is the library's own.
"""
import functools

import numpy as np

from . import lib


def point(args, n):
    """Where the request is compressed: after its first kv.prompt tokens (the measuring
    protocol of `kvrt ppl --prompt P`), else at the end of its n prompt tokens."""
    p = args[3] if len(args) > 3 else 0
    return p if p else n


@functools.lru_cache(maxsize=256)
def keep_count(policy, set_, ratio, p, group, head_dim):
    """Entries every (layer, KV head) keeps of a prompt of p tokens. Raises lib.KvpcError."""
    L = lib.get()
    w = L.window(policy, set_, ratio, group, head_dim, p)
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((1, 1, p, head_dim), dtype=np.float32)
    queries = rng.standard_normal((1, w, group, head_dim), dtype=np.float32)
    kept = L.select(policy, set_, ratio, keys, queries, keys)
    return len(kept[0][0])


@functools.lru_cache(maxsize=256)
def window(args, group, head_dim):
    """Rows of the last prompt queries (before the compression point) the policy reads."""
    policy, set_, ratio, p = args
    return lib.get().window(policy, set_, ratio, group, head_dim, p)


@functools.lru_cache(maxsize=256)
def decide(args, computed, scheduled, group, head_dim):
    """(k, None) when this step's chunk [computed, computed + scheduled) of a request with
    kv args (xargs.parse) ends exactly at its compression point p and the policy keeps
    k < p entries per head; (None, reason) when the chunk ends there but nothing is
    compacted (reason None: the budget holds the whole prompt); (None, None) when the
    chunk does not end at p."""
    policy, set_, ratio = args[:3]
    p = args[3] if len(args) > 3 and args[3] else None
    if p is None:
        return None, None  # the caller passes args with p filled in (with_point)
    if computed >= p or computed + scheduled < p:
        return None, None
    if computed + scheduled > p:
        return None, (f"kv.prompt {p}: the chunk [{computed}, {computed + scheduled}) "
                      f"crosses the compression point; not compacted")
    try:
        k = keep_count(policy, set_, ratio, p, group, head_dim)
    except lib.KvpcError as e:
        return None, str(e)
    return (k, None) if k < p else (None, None)


def with_point(args, n):
    """args with its compression point filled in for a prompt of n tokens (hashable)."""
    return tuple(args[:3]) + (point(args, n),)
