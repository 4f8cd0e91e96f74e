#!/usr/bin/env python3
"""make bench-serve: a serving benchmark (not a test). At a fixed --kv-memory, N
concurrent clients each stream one completion of a ~PROMPT-token prompt and GEN generated
tokens; for the full cache and two policies at ratio 8 it prints the sequences admitted
at once (the most active sequences /metrics reported), aggregate generated tokens/s and
p50/p99 time to first token; then the same load against llama.cpp's llama-server on the
same GGUF with the same KV memory (f16 cache: -c = KV bytes / bytes per token) when
scripts/build_llama.sh can build it.

Usage: bench_serve.py BIN MODEL   (BIN built by kvpc with h2o and tova)
Environment: BENCH_CLIENTS (16), BENCH_PROMPT (2048), BENCH_GEN (128), BENCH_KV_MEMORY
(256M), BENCH_SECONDS (600: a configuration still running then is cut off and its row
counts what finished), BENCH_THREADS (BLAS threads, default all).
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
N = int(os.environ.get("BENCH_CLIENTS", "16"))
PROMPT = int(os.environ.get("BENCH_PROMPT", "2048"))
GEN = int(os.environ.get("BENCH_GEN", "128"))
MEM = os.environ.get("BENCH_KV_MEMORY", "256M")
LIMIT = float(os.environ.get("BENCH_SECONDS", "600"))
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
        self.tokens = 0
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
                if ev.get("choices") and ev["choices"][0].get("text"):
                    if self.ttft is None:
                        self.ttft = time.time() - self.t0
                    self.tokens += 1
                if ev.get("usage"):
                    self.tokens = ev["usage"]["completion_tokens"]
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
        m = re.search(r"^%s (\S+)$" % re.escape(name), t, re.M)
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
        if active_metric:
            a = active_metric()
            peak = max(peak, a or 0)
        time.sleep(0.25)
    wall = time.time() - t0
    done = sum(1 for c in cl if c.t_end)
    toks = sum(c.tokens for c in cl)
    ttft = [c.ttft for c in cl if c.ttft is not None]
    return {"admitted": peak, "tok_s": toks / wall, "p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99),
            "done": done, "wall": wall}


def kvrt_row(policy, ratio):
    port = free_port()
    args = [BIN, "serve", "--model", MODEL, "--port", str(port), "--kv-memory", MEM,
            "--max-seqs", str(max(N, 1)), "--queue", str(4 * N), "--chunk", "64",
            "--step-rows", str(max(512, N)), "--policy", policy] + \
           (["--ratio", str(ratio)] if ratio else []) + (["--threads", THREADS] if THREADS else [])
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    if "listening" not in line:
        p.kill()
        return None
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    body = lambda i: {"prompt": prompt_text(i), "max_tokens": GEN, "temperature": 0,
                      "stream": True, "stream_options": {"include_usage": True}}
    r = load(port, body, lambda: metric(port, "kvpc_sequences_active"))
    p.send_signal(signal.SIGKILL if r["done"] < N else signal.SIGTERM)
    p.wait()
    return r


def llama_row():
    script = os.path.join(ROOT, "scripts", "build_llama.sh")
    if not os.path.exists(script):
        return None, "the llama.cpp build script (scripts/build_llama.sh) is not in this tree"
    out = subprocess.run([script], capture_output=True, text=True)  # prints the binaries' folder
    folder = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    srv = os.path.join(folder, "llama-server") if folder else ""
    if not srv or not os.access(srv, os.X_OK):
        return None, "llama-server could not be built (%s)" % (out.stderr.strip()[-200:] or "no binary")
    # f16 KV per token: 2 (K, V) x layers x KV heads x head_dim x 2 bytes (SmolLM2-135M: 30 x 3 x 64)
    per_tok = 2 * 30 * 3 * 64 * 2
    ctx = mem_bytes(MEM) // per_tok
    port = free_port()
    p = subprocess.Popen([srv, "-m", MODEL, "--port", str(port), "-c", str(ctx), "-np", str(N),
                          "--cont-batching", "--metrics"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    body = lambda i: {"prompt": prompt_text(i), "n_predict": GEN, "max_tokens": GEN,
                      "temperature": 0, "stream": True}
    r = load(port, body, None)
    r["admitted"] = "%d slots x %d" % (N, ctx // N)
    p.kill()
    p.wait()
    return r, None


def main():
    print("bench-serve: %d clients, ~%d-token prompts, %d generated tokens, --kv-memory %s"
          % (N, PROMPT, GEN, MEM), flush=True)
    rows = []
    for policy, ratio in (("full", 0), ("h2o", 8), ("tova", 8)):
        r = kvrt_row(policy, ratio)
        if r:
            rows.append(("kvrt %s%s" % (policy, " x%d" % ratio if ratio else ""), r))
            print("  measured %s: %s" % (rows[-1][0], r), flush=True)
    lr, why = llama_row()
    if lr:
        rows.append(("llama-server (f16 KV)", lr))
    print(flush=True)
    print("| server | admitted at once | finished | gen tok/s | TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|---|")
    for name, r in rows:
        print("| %s | %s | %d/%d | %.1f | %.2f | %.2f |" % (name, r["admitted"], r["done"], N,
              r["tok_s"], r["p50"], r["p99"]))
    if why:
        print("\nllama-server skipped: %s" % why)
    full = next((r for n, r in rows if n == "kvrt full"), None)
    for n, r in rows:
        if full and n.startswith("kvrt ") and n != "kvrt full" and full["admitted"]:
            print("%s admits %.1fx the sequences of full" % (n, r["admitted"] / full["admitted"]))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # cut-off clients may still block in their sockets: do not wait for them
