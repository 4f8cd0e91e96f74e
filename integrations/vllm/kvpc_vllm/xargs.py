"""Per-request policy arguments: vllm_xargs = {"kv": {"policy", "ratio", "set", "prompt"}}.

The same object as kvpc's own server (docs/serving.md): policy (a name the library has),
ratio (a number >= 1, optional), set ({"name": value}, optional); and prompt (optional):
compress after the first `prompt` tokens instead of at the prompt's end, the measuring
protocol of `kvrt ppl --prompt P` (prompt logprobs after P then come from the compacted
cache; the chunk scheduled must end at P, e.g. max_num_batched_tokens = P). A bad object is a
VLLMValidationError raised while vLLM validates the request, which its OpenAI server
answers with 400. vLLM types vllm_xargs values as scalars or lists, so install() widens the field to
accept the nested object.
"""
import math

from . import lib

KEYS = {"policy", "ratio", "set", "prompt"}


def parse(extra_args):
    """(policy, set string, ratio, prompt) of a request's extra_args (prompt 0: the whole
    prompt), or None without "kv".
    Raises ValueError naming the problem."""
    if not extra_args or "kv" not in extra_args:
        return None
    kv = extra_args["kv"]
    if not isinstance(kv, dict):
        raise ValueError(f'kv: must be an object {{"policy", "ratio", "set", "prompt"}}, got '
                         f'{type(kv).__name__}')
    extra = set(kv) - KEYS
    if extra:
        raise ValueError(f"kv: unknown field(s) {sorted(extra)}; allowed: policy, ratio, set, "
                         "prompt")
    policy = kv.get("policy")
    if not isinstance(policy, str) or not policy:
        raise ValueError("kv.policy: a policy name is required")
    ratio = kv.get("ratio", 0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) \
            or (ratio != 0 and ratio < 1):
        raise ValueError(f"kv.ratio: must be a number >= 1, got {ratio!r}")
    sets = kv.get("set", {})
    if not isinstance(sets, dict):
        raise ValueError("kv.set: must be an object {name: value}")
    parts = []
    for k, v in sets.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, str)) or "," in str(v) \
                or "=" in str(k) or "," in str(k):
            raise ValueError(f"kv.set.{k}: must be a number (or a percentage string)")
        parts.append(f"{k}={v}")
    prompt = kv.get("prompt", 0)
    if isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 0:
        raise ValueError(f"kv.prompt: must be a token count >= 1, got {prompt!r}")
    return policy, ",".join(parts), float(ratio), prompt


def validate(extra_args):
    """parse() plus the library's own verdict on the policy name and parameters (an
    unknown one is an error here, not at the prompt end)."""
    p = parse(extra_args)
    if p is None:
        return None
    policy, set_, ratio = p[:3]
    try:
        lib.get().window(policy, set_, ratio, 1, 64, 1024)
    except lib.KvpcError as e:
        raise ValueError(f"kv: {e}") from None
    return p


def install():
    """Validate kv objects with the request (400 from the server) and let the OpenAI
    protocol's vllm_xargs carry the nested object."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor
    orig = InputProcessor._validate_params
    if getattr(orig, "_kvpc", False):
        return

    def _validate_params(self, params, supported_tasks):
        out = orig(self, params, supported_tasks)
        extra = getattr(params, "extra_args", None)
        if extra:
            try:
                if "kv" in extra and self.vllm_config.cache_config.enable_prefix_caching:
                    raise ValueError("kv: this server shares prompt blocks (prefix caching); "
                                     "a kvpc policy compacts a request's own blocks: start "
                                     "vLLM with --no-enable-prefix-caching")
                if validate(extra) and not _on_cpu():
                    raise ValueError("kv: kvpc policies compact the cache on vLLM's CPU "
                                     "backend only in this version (docs/vllm.md)")
            except ValueError as e:  # a client error: vLLM's server answers it with 400
                raise VLLMValidationError(str(e), parameter="vllm_xargs.kv") from None
        return out

    _validate_params._kvpc = True
    InputProcessor._validate_params = _validate_params
    _widen_protocol()


def _on_cpu():
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


def _widen_protocol():
    from typing import Any
    for mod in ("vllm.entrypoints.openai.completion.protocol",
                "vllm.entrypoints.openai.chat_completion.protocol"):
        try:
            m = __import__(mod, fromlist=["x"])
        except ImportError:
            continue
        for cls in vars(m).values():
            f = getattr(cls, "model_fields", {}).get("vllm_xargs") if isinstance(cls, type) else None
            if f is not None and cls.__module__ == mod:
                f.annotation = dict[str, Any] | None
                cls.__annotations__["vllm_xargs"] = dict[str, Any] | None
                cls.model_rebuild(force=True)
