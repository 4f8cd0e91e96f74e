"""The vLLM plug-in on vLLM's CPU backend with SmolLM2-135M (converted from the GGUF):
a real engine and a real model, nothing mocked. Run by `make test-vllm` (docs/vllm.md),
which builds the venv, the model directory, the policy library and kvpc's reference tool
and sets KVPC_VLLM_LIB, KVPC_HF_MODEL, KVPC_GGUF, KVPC_KEPT_REF.

Checked:
  - the plug-in refuses a vLLM other than the pinned one, naming the difference;
  - no-op parity: a request with a policy whose budget exceeds its prompt gives the same
    greedy text as a request without one;
  - kept-set parity: the kept positions per (layer, KV head) the plug-in computes from
    vLLM's paged cache and forward equal kvpc's runtime's on the same token ids (kept_ref,
    exact path on the GGUF): Jaccard >= 0.99 over all heads, for knorm and snapkv;
  - compaction: after the prompt the kept entries are moved into place and the emptied
    blocks go back to vLLM's pool: the free blocks rise by cdiv(n, B) - cdiv(k, B) (B the
    block size, k the kept count the plug-in reports), a second request that does not fit
    beside a full-cache one is admitted beside a compacted one, and the greedy tokens
    after compaction are kvpc's runtime's under the same policy (kept_ref GEN);
  - tensor_parallel_size 3 gives the kept sets and text of 1 (one small request; vLLM
    refuses 2 for this model's 9 query heads);
  - the OpenAI server with vllm_xargs per request: a kv object is accepted, bad ones are
    answered 400.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HF = os.environ.get("KVPC_HF_MODEL")
GGUF = os.environ.get("KVPC_GGUF")
KEPT_REF = os.environ.get("KVPC_KEPT_REF")
if not os.environ.get("KVPC_VLLM_LIB"):
    pytest.skip("run through `make test-vllm` (KVPC_VLLM_LIB unset)", allow_module_level=True)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
DUMP = tempfile.mkdtemp(prefix="kvpc_vllm_")
os.environ["KVPC_VLLM_DUMP"] = DUMP

TEXT = ("The history of the printing press begins in the fifteenth century, when movable "
        "type changed how books were made and read across Europe. ") * 12

# 17 blocks of the CPU backend's 128 tokens, one of them vLLM's null block: 2048 tokens, so
# two 1100-token prompts do not fit side by side with a full cache
ENGINE = dict(model=HF, dtype="float32", enforce_eager=True, enable_prefix_caching=False,
              max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=4,
              async_scheduling=False, seed=0, num_gpu_blocks_override=17)


@pytest.fixture(scope="module")
def llm():
    if not (HF and GGUF and KEPT_REF):
        pytest.skip("the engine tests need KVPC_HF_MODEL, KVPC_GGUF, KVPC_KEPT_REF (make test-vllm)")
    from vllm import LLM
    return LLM(**ENGINE)


def prompt_ids(llm, n=None):
    ids = llm.get_tokenizer().encode(TEXT)
    return ids[:n] if n else ids


def generate(llm, ids, kv=None, max_tokens=16, tokens=False):
    from vllm import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=max_tokens,
                        extra_args={"kv": kv} if kv else None)
    out = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
    return list(out[0].outputs[0].token_ids) if tokens else out[0].outputs[0].text


def dumped(rank=0):
    with open(os.path.join(DUMP, f"kept_rank{rank}.json")) as f:
        return json.load(f)


def reference(ids, policy, set_, ratio, gen=0, whole=False):
    """kvpc's runtime on the same ids: the kept sets (and with gen, the whole answer:
    kept, greedy tokens after the ids, KL; tests/vllm/kept_ref.c)"""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(" ".join(map(str, ids)))
    out = subprocess.run([KEPT_REF, GGUF, policy, set_, str(ratio), f.name, str(gen)],
                         capture_output=True, text=True, check=True)
    os.unlink(f.name)
    r = json.loads(out.stdout)
    return r if whole else r["kept"]


def jaccard(a, b):
    """sum |A ∩ B| / sum |A ∪ B| over (layer, head), and the count of heads that differ"""
    inter = union = differ = 0
    for l, heads in a.items():
        for h, kept in heads.items():
            x, y = set(kept), set(b[str(l)][str(h)])
            inter += len(x & y)
            union += len(x | y)
            differ += x != y
    return inter / union, differ


# test_fast_*: no engine (seconds); `make check` runs them when the venv exists

BAD_KV = [({"policy": "nope"}, "not in this library"),
          ({"policy": "knorm", "ratio": 0.5}, "ratio"),
          ({"policy": "knorm", "set": {"nope": 1}}, "nope"),
          ({"policy": "snapkv", "set": {"window": "x"}}, "window"),
          ("snapkv", "object"),
          ({"policy": "knorm", "budget": 3}, "unknown field"),
          ({"policy": "knorm", "prompt": -1}, "prompt")]


def test_fast_xargs_refusals():
    """Each bad kv object is refused with a message naming its fault, by the same
    validate() the server's request path calls (the 400s of test_server_xargs)."""
    from kvpc_vllm import xargs
    assert xargs.validate({"kv": {"policy": "snapkv", "ratio": 4, "set": {"window": 16}}}) \
        == ("snapkv", "window=16", 4.0, 0)
    assert xargs.validate({"other": 1}) is None
    for bad, word in BAD_KV:
        with pytest.raises(ValueError) as e:
            xargs.validate({"kv": bad})
        assert word in str(e.value), (bad, str(e.value))


def test_fast_pins():
    from kvpc_vllm import compat
    assert compat.problems() == []
    p = compat.problems(pinned="0.31.0")
    assert len(p) == 1 and "pinned to 0.31.0" in p[0]
    sig = dict(compat.SIGNATURES)
    key = next(iter(sig))
    sig[key] = sig[key] + ["extra"]
    p = compat.problems(signatures=sig)
    assert len(p) == 1 and key in p[0] and "expected" in p[0]


def test_noop_parity(llm):
    ids = prompt_ids(llm)
    plain = generate(llm, ids)
    kept = generate(llm, ids, {"policy": "snapkv"})   # capacity 1024 > the prompt
    assert kept == plain and plain.strip()
    last = list(dumped()["kept"].values())[-1]
    assert all(len(v) == len(ids) for heads in last.values() for v in heads.values())


@pytest.mark.parametrize("policy,sets,ratio", [
    ("knorm", {}, 4), ("snapkv", {"window": 16}, 4), ("snapkv", {"capacity": 96}, 0)])
def test_kept_parity(llm, policy, sets, ratio):
    ids = prompt_ids(llm)
    generate(llm, ids, {"policy": policy, "ratio": ratio, "set": sets}, max_tokens=1)
    d = dumped()
    assert not d["errors"], d["errors"]
    got = list(d["kept"].values())[-1]
    assert len(got) == 30
    ref = reference(ids, policy, ",".join(f"{k}={v}" for k, v in sets.items()), ratio)
    j, differ = jaccard(got, ref)
    print(f"{policy} {sets} ratio {ratio}: {len(ids)} tokens, Jaccard {j:.4f}, "
          f"{differ} of 90 heads differ")
    assert j >= 0.99


def scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def block_size(llm):
    return scheduler(llm).kv_cache_manager.coordinator.single_type_managers[0].block_size


def free_blocks(llm):
    return scheduler(llm).kv_cache_manager.block_pool.get_num_free_blocks()


def run_pair(llm, ids, kv):
    """Request a alone for one step (its prompt), then b: free blocks after a's prompt,
    the requests running after b's first step, a's kept count per head, the outputs."""
    from vllm import SamplingParams
    eng = llm.llm_engine
    sp = SamplingParams(temperature=0, max_tokens=3, extra_args={"kv": kv} if kv else None)
    eng.add_request("a", {"prompt_token_ids": ids}, sp)
    eng.step()
    free_a = free_blocks(llm)
    k = None
    if kv:
        last = list(dumped()["kept"].values())[-1]
        k = {len(v) for heads in last.values() for v in heads.values()}
        assert len(k) == 1, k
        k = k.pop()
    eng.add_request("b", {"prompt_token_ids": ids}, sp)
    eng.step()
    running = len(scheduler(llm).running)
    texts = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                texts[o.request_id] = o.outputs[0].text
    return free_a, running, k, texts


def test_compaction_frees_blocks_and_admits(llm):
    ids = (prompt_ids(llm) * 4)[:1100]
    B = block_size(llm)
    total = free_blocks(llm)
    plain_free, plain_running, _, _ = run_pair(llm, ids, None)
    assert plain_free == total - -(-len(ids) // B)
    assert plain_running == 1          # b does not fit beside a's full cache
    kv_free, kv_running, k, texts = run_pair(llm, ids, {"policy": "knorm", "ratio": 4})
    predicted = -(-len(ids) // B) - -(-k // B)
    print(f"compaction: {len(ids)} tokens -> {k} per head, blocks of {B}: free blocks "
          f"{plain_free} -> {kv_free} (predicted +{predicted}); running with b: "
          f"{plain_running} -> {kv_running}")
    assert predicted > 0 and kv_free - plain_free == predicted
    assert kv_running == 2             # b is admitted beside the compacted a
    assert all(t.strip() for t in texts.values()) and free_blocks(llm) == total


def test_compacted_decode_matches_kvpc(llm):
    """After compaction, decoding goes on at the original positions over the kept
    entries: the greedy tokens are those of kvpc's runtime under the same policy."""
    ids = prompt_ids(llm)
    kv = {"policy": "snapkv", "ratio": 4, "set": {"window": 16}}
    got = generate(llm, ids, kv, max_tokens=8, tokens=True)
    ref = reference(ids, "snapkv", "window=16", 4, gen=8, whole=True)
    last = list(dumped()["kept"].values())[-1]
    assert len(last["0"]["0"]) < len(ids)   # compacted
    plain = generate(llm, ids, max_tokens=8, tokens=True)
    print(f"compacted decode: vLLM {got}, kvpc {ref['tokens']}, full cache {plain}")
    assert got == ref["tokens"]


def test_tp_equals_tp1(llm):
    """Tensor parallelism gives the kept sets and text of one process. SmolLM2-135M has 9
    query and 3 KV heads, and vLLM 0.32.0 refuses tensor_parallel_size 2 for it ("Total
    number of attention heads (9) must be divisible by tensor parallel size (2)"), so the
    check runs at 3: one KV head and its 3 query heads per rank, each rank a process of its
    own (selecting, compacting its heads), the scheduler in the engine core's."""
    ids = prompt_ids(llm, 64)
    kv = {"policy": "knorm", "ratio": 4}
    text1 = generate(llm, ids, kv, max_tokens=4)
    tp1 = list(dumped()["kept"].values())[-1]
    code = (
        "import json, os, sys\n"
        "from vllm import LLM, SamplingParams\n"
        f"e = {ENGINE!r}\n"
        f"e['tensor_parallel_size'] = {TP}\n"
        "llm = LLM(**e)\n"
        f"sp = SamplingParams(temperature=0, max_tokens=4, extra_args={{'kv': {kv!r}}})\n"
        f"o = llm.generate([{{'prompt_token_ids': {ids!r}}}], sp, use_tqdm=False)\n"
        "print('TEXT=' + json.dumps(o[0].outputs[0].text))\n")
    d2 = tempfile.mkdtemp(prefix="kvpc_vllm_tp_")
    env = dict(os.environ, KVPC_VLLM_DUMP=d2, VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_ENABLE_V1_MULTIPROCESSING="1")
    t = time.time()
    r = subprocess.run([sys.executable, "-c", "if __name__ == '__main__':\n" +
                        "".join("    " + ln + "\n" for ln in code.splitlines())],
                       capture_output=True, text=True, env=env, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    text2 = json.loads(r.stdout.split("TEXT=")[-1].splitlines()[0])
    merged = {}
    for rank in range(TP):
        with open(os.path.join(d2, f"kept_rank{rank}.json")) as f:
            for layer, heads in list(json.load(f)["kept"].values())[-1].items():
                merged.setdefault(layer, {}).update(heads)
    print(f"tensor_parallel_size {TP}: {time.time() - t:.0f} s; text {text2!r}, TP=1 "
          f"{text1!r}; kept sets equal: {merged == tp1}")
    assert merged == tp1
    assert text2 == text1


TP = 3


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_server_xargs():
    if not HF:
        pytest.skip("needs KVPC_HF_MODEL (make test-vllm)")
    import openai
    port = free_port()
    # the server as deployed: the engine core in a process of its own, which loads the
    # plug-in too (vllm.general_plugins)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1")
    srv = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", HF,
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
         "--no-enable-prefix-caching", "--max-model-len", "2048", "--served-model-name", "m"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0,
                          timeout=120)
        for _ in range(900):  # a loaded 2-core machine takes minutes to start it
            try:
                c.models.list()
                break
            except openai.APIConnectionError:
                assert srv.poll() is None, "the server exited"
                time.sleep(1)
        else:
            pytest.fail("the server did not come up in 900 s")
        ok = c.completions.create(model="m", prompt=TEXT[:400], max_tokens=8, temperature=0,
                                  extra_body={"vllm_xargs": {"kv": {
                                      "policy": "snapkv", "ratio": 4, "set": {"window": 16}}}})
        assert ok.choices[0].text
        for bad, word in BAD_KV:
            with pytest.raises(openai.BadRequestError) as e:
                c.completions.create(model="m", prompt="hello", max_tokens=2,
                                     extra_body={"vllm_xargs": {"kv": bad}})
            assert e.value.status_code == 400 and word in str(e.value), (bad, str(e.value))
            print(f"server: kv {json.dumps(bad)} -> 400 {e.value.message}")
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
