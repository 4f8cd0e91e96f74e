"""vLLM's CPU backend with and without a kvpc policy on the same engine (same KV memory):
decode throughput of a batch of requests, and the plug-in's prompt-end cost. Prints one
JSON line. Run with the variables of `make test-vllm` (KVPC_HF_MODEL, KVPC_VLLM_LIB):
    python tests/vllm/bench_vllm.py [N_REQUESTS] [MAX_TOKENS]
"""
import json
import os
import sys
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

TEXT = ("The history of the printing press begins in the fifteenth century, when movable "
        "type changed how books were made and read across Europe. ") * 12


def run(llm, ids, n, max_tokens, kv):
    from vllm import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                        extra_args={"kv": kv} if kv else None)
    t = time.time()
    out = llm.generate([{"prompt_token_ids": ids}] * n, sp, use_tqdm=False)
    dt = time.time() - t
    toks = sum(len(o.outputs[0].token_ids) for o in out)
    return {"requests": n, "tokens": toks, "seconds": round(dt, 2),
            "tokens_per_s": round(toks / dt, 1), "text0": out[0].outputs[0].text[:60]}


if __name__ == "__main__":
    from vllm import LLM
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    mt = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    llm = LLM(model=os.environ["KVPC_HF_MODEL"], dtype="float32", enforce_eager=True,
              enable_prefix_caching=False, max_model_len=2048, max_num_batched_tokens=4096,
              async_scheduling=False, seed=0)
    ids = llm.get_tokenizer().encode(TEXT)
    run(llm, ids, 1, 2, None)  # warm-up
    res = {"prompt_tokens": len(ids),
           "without": run(llm, ids, n, mt, None),
           "knorm_x4": run(llm, ids, n, mt, {"policy": "knorm", "ratio": 4}),
           "snapkv_x4": run(llm, ids, n, mt, {"policy": "snapkv", "ratio": 4})}
    print("BENCH " + json.dumps(res))
