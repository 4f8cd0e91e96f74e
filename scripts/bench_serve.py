#!/usr/bin/env python3
"""make bench-serve: a serving benchmark (not a test). At one --kv-memory, N concurrent
clients each stream one completion of a ~PROMPT-token prompt and GEN generated tokens; for
the full cache and two policies at ratio 8 (h2o, tova; serve's default chunked prefill) it
prints the sequences admitted at once (the most active sequences /metrics reported), the
sequences the pool fits by the server's worst-case footprint, aggregate generated tokens/s
and p50/p99 time to first token (queueing included); then the same load against llama.cpp's
llama-server on the same GGUF with the same KV memory (f16 cache: -c = KV bytes / bytes per
token, as many slots as hold a whole sequence) when scripts/build_llama.sh can build it.

The KV memory defaults to 1.5x the full cache's footprint for one sequence (asked of the
server: a request over --kv-memory is refused with its footprint), so `full` admits one
sequence at a time and the policies' admission is limited by the pool or by N.

Usage: bench_serve.py BIN MODEL   (BIN built by kvpc with h2o and tova)
Environment: BENCH_CLIENTS (8), BENCH_PROMPT (2048), BENCH_GEN (32), BENCH_KV_MEMORY (auto:
see above; or a size such as 256M), BENCH_SECONDS (150: a configuration still running then
is cut off and its row counts what finished), BENCH_THREADS (threads, default all).
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

BIN, MODEL = sys.argv[1], sys.argv[2]
N = int(os.environ.get("BENCH_CLIENTS", "8"))
PROMPT = int(os.environ.get("BENCH_PROMPT", "2048"))
GEN = int(os.environ.get("BENCH_GEN", "32"))
MEM = os.environ.get("BENCH_KV_MEMORY", "auto")
LIMIT = float(os.environ.get("BENCH_SECONDS", "150"))
POLICIES = (("full", 0), ("h2o", 8), ("tova", 8))
THREADS = os.environ.get("BENCH_THREADS", "")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mem_bytes(s):
    m = re.fullmatch(r"(\d+)([KMGT]?)", s.upper().replace("IB", "").replace("B", ""))
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2) or " "))


def prompt_text(i):
    # distinct ~PROMPT-token texts (about 1.3 tokens per word for this filler)
    words = []
    k = 0
    while len(words) < int(PROMPT / 1.35):
        words += ("Record %d of client %d notes that the river rose by %d centimetres "
                  "after the storm." % (k, i, (k * 7 + i) % 97)).split()
        k += 1
    return " ".join(words)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Client(threading.Thread):
    def __init__(self, port, path, body):
        super().__init__(daemon=True)
        self.port, self.path, self.body = port, path, body
        self.t0 = self.ttft = self.t_end = None
        self.tokens = self.prompt_tokens = 0
        self.status = None

    def run(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=LIMIT + 60)
            self.t0 = time.time()
            c.request("POST", self.path, body=json.dumps(self.body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            self.status = r.status
            for line in r:
                if not line.startswith(b"data: {"):
                    continue
                ev = json.loads(line[6:])
                ch = ev.get("choices") or [{}]
                if ch[0].get("text") or ch[0].get("content"):
                    if self.ttft is None:
                        self.ttft = time.time() - self.t0
                    self.tokens += 1
                if ev.get("usage"):
                    self.tokens = ev["usage"].get("completion_tokens", self.tokens)
                    self.prompt_tokens = ev["usage"].get("prompt_tokens", 0)
                if ev.get("timings"):  # llama-server's last event
                    self.prompt_tokens = ev["timings"].get("prompt_n", self.prompt_tokens)
            self.t_end = time.time()
            c.close()
        except Exception:
            pass


def metric(port, name):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        t = c.getresponse().read().decode()
        c.close()
        m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), t, re.M)
        return float(m.group(1)) if m else None
    except OSError:
        return None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def load(port, body_of, active_metric):
    cl = [Client(port, "/v1/completions", body_of(i)) for i in range(N)]
    t0 = time.time()
    for c in cl:
        c.start()
    peak = 0
    while any(c.is_alive() for c in cl) and time.time() - t0 < LIMIT:
        a = active_metric()
        peak = max(peak, a or 0)
        time.sleep(0.25)
    wall = time.time() - t0
    done = sum(1 for c in cl if c.t_end)
    toks = sum(c.tokens for c in cl)
    ttft = [c.ttft for c in cl if c.ttft is not None]
    ptoks = [c.prompt_tokens for c in cl if c.prompt_tokens]
    return {"admitted": int(peak), "tok_s": toks / wall, "p50": pct(ttft, 0.5),
            "p99": pct(ttft, 0.99), "done": done, "wall": wall,
            "prompt_tokens": sum(ptoks) / len(ptoks) if ptoks else 0}


def serve(mem, extra):
    port = free_port()
    args = [BIN, "serve", "--model", MODEL, "--port", str(port), "--kv-memory", str(mem),
            "--max-seqs", str(max(N, 1)), "--queue", str(4 * N), "--chunk", "64",
            "--step-rows", str(max(512, N))] + extra + (["--threads", THREADS] if THREADS else [])
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    if "listening" not in line:
        p.kill()
        sys.exit("bench-serve: %s did not start: %s" % (BIN, line + p.stderr.read()))
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, port


def footprints():
    """Each configuration's worst-case footprint in bytes, as the server computes it: a
    server with a 1 MiB pool refuses the request and says what it needs."""
    p, port = serve(1 << 20, [])
    out = {}
    for policy, ratio in POLICIES:
        kv = {"policy": policy, "ratio": ratio} if ratio else {"policy": policy}
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": prompt_text(0), "max_tokens": GEN, "kv": kv}),
            headers={"Content-Type": "application/json"})
        t = c.getresponse().read().decode()
        c.close()
        m = re.search(r"needs up to (\d+) bytes", t)
        if not m:
            p.kill()
            sys.exit("bench-serve: no footprint for %s: %s" % (policy, t[:300]))
        out[policy] = int(m.group(1))
    p.send_signal(signal.SIGTERM)
    p.wait()
    return out


def kvrt_row(policy, ratio, mem):
    p, port = serve(mem, ["--policy", policy] + (["--ratio", str(ratio)] if ratio else []))
    body = lambda i: {"prompt": prompt_text(i), "max_tokens": GEN, "temperature": 0,
                      "stream": True, "stream_options": {"include_usage": True}}
    r = load(port, body, lambda: metric(port, "kvpc_sequences_active"))
    p.send_signal(signal.SIGKILL if r["done"] < N else signal.SIGTERM)
    p.wait()
    return r


def llama_row(mem):
    script = os.path.join(ROOT, "scripts", "build_llama.sh")
    if not os.path.exists(script):
        return None, "the llama.cpp build script (scripts/build_llama.sh) is not in this tree"
    env = dict(os.environ, LLAMA_TARGETS="llama-server")
    out = subprocess.run([script], capture_output=True, text=True, env=env)  # prints the folder
    folder = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    srv = os.path.join(folder, "llama-server") if folder else ""
    if not srv or not os.access(srv, os.X_OK):
        return None, "llama-server could not be built (%s)" % (out.stderr.strip()[-200:] or "no binary")
    # f16 KV per token: 2 (K, V) x layers x KV heads x head_dim x 2 bytes (SmolLM2-135M: 30 x 3 x 64)
    per_tok = 2 * 30 * 3 * 64 * 2
    ctx = mem // per_tok
    # every slot must hold a whole sequence (llama-server splits -c evenly over -np slots);
    # --no-repack: ggml's AMX kernels (a GGML_NATIVE build) die with SIGILL on a kernel that
    # has not granted the AMX state (scripts/bench.sh says the same of llama-bench)
    need = int((PROMPT + GEN) * 1.05) + 16
    slots = max(1, min(N, ctx // need))
    port = free_port()
    args = [srv, "-m", MODEL, "--port", str(port), "-c", str(slots * (ctx // slots)), "-np",
            str(slots), "--cont-batching", "--metrics", "--no-warmup", "--no-repack"] + \
           (["-t", THREADS] if THREADS else [])
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    up = False
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                up = True
                break
        except OSError:
            pass
        time.sleep(0.2)
    if not up:
        p.kill()
        p.wait()
        return None, "llama-server did not start (%s)" % " ".join(args[1:])
    body = lambda i: {"prompt": prompt_text(i), "n_predict": GEN, "max_tokens": GEN,
                      "temperature": 0, "stream": True}
    r = load(port, body, lambda: metric(port, "llamacpp:requests_processing"))
    r["slots"] = "%d x %d tokens" % (slots, ctx // slots)
    p.kill()
    p.wait()
    return r, None


def main():
    fp = footprints()
    mem = mem_bytes(MEM) if MEM != "auto" else int(1.5 * fp["full"])
    print("bench-serve: %d clients, ~%d-token prompts, %d generated tokens each (fewer than the "
          "serving issue's 128, so the run fits in a few minutes on 2 cores), --kv-memory %d "
          "(%.1f MiB%s)" % (N, PROMPT, GEN, mem, mem / 1048576.0,
                            ": 1.5x the full cache's footprint" if MEM == "auto" else ""),
          flush=True)
    rows = []
    for policy, ratio in POLICIES:
        r = kvrt_row(policy, ratio, mem)
        r["fit"] = "%d (%.1f MiB each)" % (mem // fp[policy], fp[policy] / 1048576.0)
        name = "kvrt %s%s" % (policy, " x%d" % ratio if ratio else "")
        rows.append((name, r))
        print("  measured %s: %s" % (name, r), flush=True)
    lr, why = llama_row(mem)
    if lr:
        lr["fit"] = lr["slots"]
        rows.append(("llama-server (f16 KV, full)", lr))
        print("  measured llama-server: %s" % lr, flush=True)
    print(flush=True)
    print("| server | admitted at once | pool fits | finished | prompt tokens | gen tok/s "
          "| TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        print("| %s | %s | %s | %d/%d | %.0f | %.1f | %.2f | %.2f |" % (
            name, r["admitted"], r["fit"], r["done"], N, r["prompt_tokens"], r["tok_s"],
            r["p50"], r["p99"]))
    if why:
        print("\nllama-server skipped: %s" % why)
    full = next((r for n, r in rows if n == "kvrt full"), None)
    for n, r in rows:
        if full and n.startswith("kvrt ") and n != "kvrt full" and full["admitted"]:
            print("%s admits %.1fx the sequences of full at once (measured; at most %d clients); "
                  "its footprint fits %.1fx" % (n, r["admitted"] / full["admitted"], N,
                                                 (mem // fp[n.split()[1]]) / max(1, mem // fp["full"])))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # cut-off clients may still block in their sockets: do not wait for them
