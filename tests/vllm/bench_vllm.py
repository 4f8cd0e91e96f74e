"""vLLM with and without a kvpc policy at the same KV memory (docs/vllm.md, the measured
table): one engine with a fixed number of KV blocks runs the same batch of requests under
each policy and reports

  - admitted: the most requests running at once (the rest wait for blocks);
  - tokens/s: generated tokens over the batch's wall time;
  - blocks freed by compaction;
  - KL: mean KL divergence (nats) of vLLM's next-token distributions (prompt_logprobs over
    the whole vocabulary) under the policy against vLLM's full cache, for a prompt of
    KL_PROMPT tokens compressed and the KL_SCORE tokens after it scored (kv.prompt: the
    protocol of `kvrt ppl --prompt P --score-from P+1`), next to kvpc's own figure for
    the same policy, ratio and token ids (tests/vllm/kept_ref.c on the GGUF, exact path).

Run with the variables of `make test-vllm` (KVPC_HF_MODEL, KVPC_VLLM_LIB, KVPC_GGUF,
KVPC_KEPT_REF), or `make bench-vllm`:
    python tests/vllm/bench_vllm.py [--blocks 17] [--requests 8] [--prompt 448]
        [--max-tokens 32] [--policies knorm:4,snapkv:4] [--json OUT.json]
Prints a markdown table and writes the JSON (default build/bench_vllm.json). On a GPU
(scripts/gpu_vllm_check.sh) the same script runs with --device cuda.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

TEXT = ("The history of the printing press begins in the fifteenth century, when movable "
        "type changed how books were made and read across Europe. Printers in Mainz, "
        "Venice and Paris competed for scholars, merchants and churches, and within fifty "
        "years presses worked in more than two hundred towns. ")


def engine(a):
    from vllm import LLM
    kw = dict(model=os.environ["KVPC_HF_MODEL"], dtype="float32", enforce_eager=True,
              enable_prefix_caching=False, max_num_batched_tokens=a.kl_prompt,
              max_num_seqs=a.requests, async_scheduling=False, seed=0, max_logprobs=-1,
              num_gpu_blocks_override=a.blocks, max_model_len=a.max_model_len)
    if a.device == "cuda":
        kw["gpu_memory_utilization"] = 0.3
    return LLM(**kw)


def batch(llm, ids, a, kv):
    """Run a.requests copies of ids at once; (admitted, tokens/s, blocks freed, seconds)."""
    from vllm import SamplingParams
    from kvpc_vllm import sched
    eng = llm.llm_engine
    core = eng.engine_core.engine_core.scheduler
    sp = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True,
                        extra_args={"kv": kv} if kv else None)
    freed0 = sum(sched.FREED.values())
    t = time.time()
    for i in range(a.requests):
        eng.add_request(f"{kv and kv['policy']}-{i}-{t}", {"prompt_token_ids": ids}, sp)
    admitted = toks = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                toks += len(o.outputs[0].token_ids)
        admitted = max(admitted, len(core.running))
    dt = time.time() - t
    return admitted, toks / dt, sum(sched.FREED.values()) - freed0, dt


def prompt_lp(llm, ids, kv, vocab):
    """[len(ids) - P - 1, vocab] log-probabilities of the tokens after P + 1 .. end."""
    from vllm import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=-1, flat_logprobs=True,
                        detokenize=False, extra_args={"kv": kv} if kv else None)
    out = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0]
    plp = out.prompt_logprobs
    rows = []
    for j in range(P_KL + 1, len(ids)):
        s, e = plp.start_indices[j], plp.end_indices[j]
        r = np.full(vocab, -np.inf)
        r[np.asarray(plp.token_ids[s:e])] = plp.logprobs[s:e]
        rows.append(r)
    return np.stack(rows)


def kl(full, pol):
    p = np.exp(full)
    return float(np.mean(np.sum(np.where(p > 0, p * (full - pol), 0.0), axis=1)))


def kvpc_kl(ids, policy, ratio):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(" ".join(map(str, ids)))
    r = subprocess.run([os.environ["KVPC_KEPT_REF"], os.environ["KVPC_GGUF"], policy, "",
                        str(ratio), f.name, "0", str(P_KL)], capture_output=True, text=True)
    os.unlink(f.name)
    if r.returncode:
        return None
    return json.loads(r.stdout)["kl"]


def main():
    global P_KL
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=17)  # one is vLLM's null block
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=448)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--policies", default="knorm:4,snapkv:4")
    ap.add_argument("--kl-prompt", type=int, default=256)
    ap.add_argument("--kl-score", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default="build/bench_vllm.json")
    a = ap.parse_args()
    P_KL = a.kl_prompt
    if a.device == "cpu":
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = engine(a)
    tok = llm.get_tokenizer()
    base = tok.encode(TEXT)
    ids = (base * (a.prompt // len(base) + 2))[:a.prompt]
    kl_ids = (base * ((P_KL + a.kl_score) // len(base) + 2))[:P_KL + a.kl_score]
    vocab = llm.llm_engine.model_config.get_vocab_size()
    bs = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.coordinator \
        .single_type_managers[0].block_size
    batch(llm, ids[:64], argparse.Namespace(**{**vars(a), "requests": 1, "max_tokens": 2}),
          None)  # warm-up
    rows = []
    full_lp = prompt_lp(llm, kl_ids, None, vocab)
    for spec in ["full"] + a.policies.split(","):
        policy, _, ratio = spec.partition(":")
        kv = None if policy == "full" else {"policy": policy, "ratio": float(ratio)}
        adm, tps, freed, dt = batch(llm, ids, a, kv)
        row = {"policy": spec, "admitted": adm, "tokens_per_s": round(tps, 2),
               "blocks_freed": freed, "seconds": round(dt, 1)}
        if kv:
            kv_kl = dict(kv, prompt=P_KL)
            row["kl_vllm"] = kl(full_lp, prompt_lp(llm, kl_ids, kv_kl, vocab))
            row["kl_kvpc"] = kvpc_kl(kl_ids, policy, ratio)
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = {"device": a.device, "kv_blocks": a.blocks, "block_size": bs,
           "requests": a.requests, "prompt_tokens": a.prompt, "max_tokens": a.max_tokens,
           "kl_prompt": P_KL, "kl_scored": a.kl_score - 1, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"\n{a.blocks} KV blocks of {bs} tokens, {a.requests} requests of {a.prompt} prompt "
          f"tokens + {a.max_tokens} generated; KL over {a.kl_score - 1} tokens after a "
          f"{P_KL}-token prompt\n")
    print("| policy | admitted | tokens/s | blocks freed | KL vLLM | KL kvpc |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        f = lambda x: "-" if x is None else f"{x:.4f}"
        print(f"| {r['policy']} | {r['admitted']} | {r['tokens_per_s']} | {r['blocks_freed']} "
              f"| {f(r.get('kl_vllm'))} | {f(r.get('kl_kvpc'))} |")


P_KL = 256

if __name__ == "__main__":
    sys.exit(main())
