#!/usr/bin/env bash
# The vLLM plug-in on a GPU (for a session that is lent one; docs/vllm.md): installs vllm
# (CUDA build, the pinned version) into a venv (the machine needs PyPI, or a venv carried
# in as VLLM_GPU_VENV), builds the policy library, converts SmolLM2 to an HF directory,
# and runs the checks that apply on a GPU in this version: the plug-in loads and accepts
# the pins, and per-request kv objects are validated: a bad one is refused naming its
# fault, a good one is refused because kept sets and compaction are the CPU backend's only
# (the scheduler side is not installed on a GPU). Reports those and the full cache's
# greedy text and throughput. Writes JSON to $OUT/gpu_vllm.json.
#   scripts/gpu_vllm_check.sh [BUILD_DIR]   (run from the repository root)
set -euo pipefail
B=${1:-build}
OUT=${OUT:-$B/gpu_vllm}
VENV=${VLLM_GPU_VENV:-$HOME/.cache/kvpc/vllm-gpu-venv}
mkdir -p "$OUT"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "vllm==0.32.0" gguf accelerate
"$VENV/bin/python" -m pip install -q --no-deps -e integrations/vllm
make -s "$B/kvpc" "$B/libkvrt.a"
"$B/kvpc" build --shared policies/knorm.kvp policies/snapkv.kvp -o "$B/libkvpc_vllm.so"
"$VENV/bin/python" integrations/vllm/convert_model.py models/SmolLM2-135M-Instruct.Q4_1.gguf "$B/hf-smollm2"
KVPC_VLLM_LIB=$PWD/$B/libkvpc_vllm.so VLLM_ENABLE_V1_MULTIPROCESSING=0 \
"$VENV/bin/python" - "$B/hf-smollm2" "$OUT/gpu_vllm.json" <<'PY'
import json, sys, time
from vllm import LLM, SamplingParams
from kvpc_vllm import compat
res = {"pins": compat.problems()}
llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, enable_prefix_caching=False,
          gpu_memory_utilization=0.3, max_model_len=2048)
ids = llm.get_tokenizer().encode("The history of the printing press. " * 40)
def gen(kv):
    sp = SamplingParams(temperature=0, max_tokens=32, extra_args={"kv": kv} if kv else None)
    t = time.time()
    o = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0].outputs[0].text
    return o, time.time() - t
plain, t0 = gen(None)
res.update(full_cache_text=plain, tokens_per_s=32 / t0,
           kept_sets="CPU backend only in this version",
           compaction="CPU backend only in this version")
for name, kv in [("good_kv", {"policy": "snapkv", "ratio": 4}), ("bad_kv", {"policy": "nope"})]:
    try:
        gen(kv)
        res[name] = "served"
    except Exception as e:  # vLLM's VLLMValidationError
        res[name] = f"refused: {e}"
json.dump(res, open(sys.argv[2], "w"), indent=1)
print(json.dumps(res))
PY
