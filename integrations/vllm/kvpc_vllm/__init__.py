"""kvpc-compiled KV-cache policies inside vLLM (docs/vllm.md).

vLLM calls register() in every process it starts (entry point vllm.general_plugins).
It checks the installed vLLM against the pinned version and signatures (compat.py),
lets requests carry {"kv": {"policy", "ratio", "set"}} in vllm_xargs (xargs.py), and
replaces the CPU attention backend by a subclass that, at the end of a request's prompt,
gathers each layer's keys and window queries, asks the kvpc library which entries to
keep, and moves them to the request's first slots (backend.py), while the scheduler
returns the emptied blocks to vLLM's pool (sched.py; plan.py is the rule both follow).
KVPC_VLLM_LIB names the library (`kvpc build --shared`).
"""
import os

_registered = False


def register():
    """The vllm.general_plugins entry point. Raises compat.VersionMismatch (vLLM then
    stops starting) when the installed vLLM is not the one this package is pinned to."""
    global _registered
    if _registered or os.environ.get("KVPC_VLLM_DISABLE") == "1":
        return
    from . import compat
    compat.check()
    from . import xargs, backend, sched
    xargs.install()
    backend.install()
    sched.install()
    _registered = True
