#!/usr/bin/env python3
"""make bench-serve: a serving benchmark (not a test). Per workload row, at one --kv-memory,
concurrent clients each stream one completion; for the full cache, an 8x eviction policy
(h2o, ratio 8), an 8x-bytes mixed policy (tova_tiers: TOVA eviction with f16/q8/q4 tiers,
byte ratio 8) and llama.cpp's llama-server on the same GGUF with the same KV memory (f16
cache: -c = KV bytes / bytes per token, as many slots as hold a whole sequence; when
scripts/bench/build_llama.sh can build it) it prints the sequences admitted at once (the most
active sequences /metrics reported), the sequences the pool fits by the server's worst-case
footprint, aggregate generated tokens/s, p50/p99 time to first token (queueing included) and
p50/p99 inter-token latency (the gaps between a stream's token events).

Workloads (BENCH_ROWS, comma-separated; default decode, chat, long):
  prefill  1 client, a ~2048-token prompt, 1 generated token: the lone sequence's prefill
           rate (prompt tokens / TTFT) against `BIN bench --pp N` (the full cache, the same
           N prompt tokens and threads) run right after each server
  decode   8 clients, a ~2048-token prompt each, 256 generated tokens
  chat     16 clients, one shared ~500-token system prompt and a ~200-token user turn each
           (chat completions), 128 generated tokens
  long     4 clients, a ~6144-token prompt each, 128 generated tokens
Servers (BENCH_SERVERS, comma-separated; default full,h2o,tova_tiers,llama).

The KV memory defaults to 1.5x the full cache's footprint for one request of the row (asked
of the server: a request over --kv-memory is refused with its footprint), so `full` admits
one sequence at a time and the policies' admission is limited by the pool or the clients;
the chat row's is 1.5x that of 4 requests, so that the full cache runs several at once and
they share the system prompt.

The chat row's kvrt lines also give the shared system prompt's figures from /metrics
(docs/serving.md, "Shared prefixes and prefix caching"): the sequences that held it in a
shared prefix (the first one of a run makes it), the most at once, the most pool bytes
sharing saved at once (kvpc_prefix_bytes_saved; the prefix counted once), and the prompt
tokens prefilled and skipped (forked from the prefix); the chat row also runs the full
cache with kv.share_prefix false ("prefix not shared"), the peer the sharing is measured
against.

Usage: bench_serve.py BIN MODEL   (BIN built by kvpc with h2o and tova_tiers)
Environment: BENCH_ROWS, BENCH_SERVERS (above), BENCH_CLIENTS, BENCH_PROMPT, BENCH_GEN
(override the row's), BENCH_QUICK=1 (a smoke run: at most 4 clients, an eighth of each
prompt, a quarter of the system prompt, at most 32 generated tokens, a 300 s cut-off), BENCH_KV_MEMORY (auto: see above; or a size such as 256M),
BENCH_SECONDS (600: a configuration still running then is cut off and its row counts what
finished), BENCH_THREADS (threads, default all).
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
MEM = os.environ.get("BENCH_KV_MEMORY", "auto")
QUICK = os.environ.get("BENCH_QUICK") == "1"
LIMIT = float(os.environ.get("BENCH_SECONDS", "300" if QUICK else "600"))
THREADS = os.environ.get("BENCH_THREADS", "")
N_MAX = 8  # the clients of the row being run (the server's --max-seqs)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# name: clients, prompt tokens (the user turn's for chat), generated tokens, shared system
# prompt tokens (chat only)
ROWS = {"prefill": (1, 2048, 1, 0), "decode": (8, 2048, 256, 0), "chat": (16, 200, 128, 500), "long": (4, 6144, 128, 0)}
# the automatic --kv-memory in full caches of one request: chat's holds 4, so the full
# cache runs several sequences at once and they can share the system prompt
MEM_SEQS = {"chat": 4}
# name: label, policy, kv fields of the request
SERVERS = {"full": ("kvrt full", "full", {}),
           "full_noshare": ("kvrt full, prefix not shared", "full", {"share_prefix": False}),
           "h2o": ("kvrt h2o x8", "h2o", {"ratio": 8}),
           "tova_tiers": ("kvrt tova_tiers x8 bytes", "tova_tiers", {"byte_ratio": 8})}


def env_list(name, default):
    v = [x.strip() for x in os.environ.get(name, default).split(",") if x.strip()]
    return v


def mem_bytes(s):
    m = re.fullmatch(r"(\d+)([KMGT]?)", s.upper().replace("IB", "").replace("B", ""))
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2) or " "))


def words_text(n_tokens, tag, i):
    # distinct ~n_tokens-token texts (about 1.3 tokens per word for this filler)
    words = []
    k = 0
    while len(words) < int(n_tokens / 1.35):
        words += ("%s %d of client %d notes that the river rose by %d centimetres "
                  "after the storm." % (tag, k, i, (k * 7 + i) % 97)).split()
        k += 1
    return " ".join(words)


class Row:
    def __init__(self, name):
        n, prompt, gen, system = ROWS[name]
        if QUICK:
            n, prompt, gen, system = min(n, 4), prompt // 8, min(gen, 32), system // 4
        self.name = name
        self.n = int(os.environ.get("BENCH_CLIENTS", n))
        self.prompt = int(os.environ.get("BENCH_PROMPT", prompt))
        self.gen = int(os.environ.get("BENCH_GEN", gen))
        self.system = system
        self.sys_text = words_text(system, "Rule", 0) if system else None

    def path(self):
        return "/v1/chat/completions" if self.system else "/v1/completions"

    def body(self, i, extra):
        b = dict(extra, max_tokens=self.gen, temperature=0, stream=True)
        if self.system:
            b["messages"] = [{"role": "system", "content": self.sys_text},
                             {"role": "user", "content": words_text(self.prompt, "Record", i)}]
        else:
            b["prompt"] = words_text(self.prompt, "Record", i)
        return b

    def describe(self):
        return "%d clients, %s~%d-token prompt%s, %d generated tokens each" % (
            self.n, "a shared ~%d-token system prompt and a " % self.system if self.system else "",
            self.prompt, " (user turn)" if self.system else "", self.gen)


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
        self.events = []  # arrival times of the events that carried text
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
                delta = ch[0].get("delta") or {}
                if ch[0].get("text") or ch[0].get("content") or delta.get("content"):
                    self.events.append(time.time())
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


def load(port, row, extra, active_metric, peaks=()):
    """Run the row's clients; the most active sequences seen, and the most of each metric
    named in peaks (polled every 0.25 s)."""
    cl = [Client(port, row.path(), row.body(i, extra)) for i in range(row.n)]
    t0 = time.time()
    for c in cl:
        c.start()
    peak = 0
    most = {k: 0.0 for k in peaks}
    while any(c.is_alive() for c in cl) and time.time() - t0 < LIMIT:
        a = active_metric()
        peak = max(peak, a or 0)
        for k in peaks:
            most[k] = max(most[k], metric(port, k) or 0)
        time.sleep(0.25)
    wall = time.time() - t0
    done = sum(1 for c in cl if c.t_end)
    toks = sum(c.tokens for c in cl)
    ttft = [c.ttft for c in cl if c.ttft is not None]
    itl = [b - a for c in cl for a, b in zip(c.events, c.events[1:])]
    ptoks = [c.prompt_tokens for c in cl if c.prompt_tokens]
    return {"admitted": int(peak), "tok_s": toks / wall, "p50": pct(ttft, 0.5),
            "p99": pct(ttft, 0.99), "itl50": pct(itl, 0.5), "itl99": pct(itl, 0.99),
            "done": done, "wall": wall, "prompt_tokens": sum(ptoks) / len(ptoks) if ptoks else 0,
            "most": most}


def serve(mem, extra):
    port = free_port()
    args = [BIN, "serve", "--model", MODEL, "--port", str(port), "--kv-memory", str(mem),
            "--max-seqs", str(max(N_MAX, 1)), "--queue", str(4 * N_MAX), "--chunk", "64",
            "--step-rows", str(max(512, N_MAX))] + extra + (["--threads", THREADS] if THREADS else [])
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    if "listening" not in line:
        p.kill()
        sys.exit("bench-serve: %s did not start: %s" % (BIN, line + p.stderr.read()))
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, port


def footprints(row, servers):
    """Each server's worst-case footprint in bytes for the row's first request, as the server
    computes it: a server with a 1 MiB pool refuses the request and says what it needs."""
    p, port = serve(1 << 20, [])
    out = {}
    for key in servers:
        _, policy, kv = SERVERS[key]
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = row.body(0, {"kv": dict(kv, policy=policy)})
        body["stream"] = False
        c.request("POST", row.path(), body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        t = c.getresponse().read().decode()
        c.close()
        m = re.search(r"needs up to (\d+) bytes", t)
        if not m:
            p.kill()
            sys.exit("bench-serve: no footprint for %s: %s" % (policy, t[:300]))
        out[key] = int(m.group(1))
    p.send_signal(signal.SIGTERM)
    p.wait()
    return out


def kvrt_row(row, key, mem):
    _, policy, kv = SERVERS[key]
    p, port = serve(mem, [])
    r = load(port, row, {"kv": dict(kv, policy=policy),
                         "stream_options": {"include_usage": True}},
             lambda: metric(port, "kvpc_sequences_active"),
             ("kvpc_prefix_bytes_saved", "kvpc_prefix_bytes", "kvpc_prefix_sequences")
             if row.system else ())
    if row.system:
        r["shared"] = metric(port, "kvpc_prefix_shared_total") or 0
        r["differed"] = metric(port, "kvpc_prefix_differed_total") or 0
        r["skipped"] = metric(port, "kvpc_prefix_skipped_tokens_total") or 0
        r["prefilled"] = metric(port, "kvpc_prompt_tokens_total") or 0
    p.send_signal(signal.SIGKILL if r["done"] < row.n else signal.SIGTERM)
    p.wait()
    return r


def llama_row(row, mem):
    script = os.path.join(ROOT, "scripts", "bench", "build_llama.sh")
    if not os.path.exists(script):
        return None, "the llama.cpp build script (scripts/bench/build_llama.sh) is not in this tree"
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
    # has not granted the AMX state (scripts/bench/bench.sh says the same of llama-bench)
    need = int((row.prompt + row.system + row.gen) * 1.05) + 64
    slots = max(1, min(row.n, ctx // need))
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
    r = load(port, row, {"n_predict": row.gen}, lambda: metric(port, "llamacpp:requests_processing"))
    r["slots"] = "%d x %d tokens" % (slots, ctx // slots)
    p.kill()
    p.wait()
    return r, None


def bench_pp(n):
    """`BIN bench --pp n` on the full cache with the servers' threads: prompt tokens/s."""
    args = [BIN, "bench", "--model", MODEL, "--pp", str(n)] + (["--threads", THREADS] if THREADS else [])
    out = subprocess.run(args, capture_output=True, text=True)
    m = re.search(r"^pp%d\s+(\S+)" % n, out.stdout, re.M)
    if not m:
        sys.exit("bench-serve: %s printed no pp%d: %s" % (" ".join(args), n, out.stderr[-300:]))
    return float(m.group(1))


def prefill_rates(rows):
    """The prefill row: each server's lone prompt tokens/s against bench's pp rate."""
    print("\n| prefill | prompt tokens | TTFT s | prompt tok/s | bench pp tok/s | ratio |\n"
          "|---|---|---|---|---|---|")
    for name, r in rows:
        rate = r["prompt_tokens"] / r["p50"] if r["p50"] and r["p50"] == r["p50"] else 0
        print("| %s | %.0f | %.2f | %.1f | %.1f | %.2fx |" % (
            name, r["prompt_tokens"], r["p50"], rate, r["pp"], rate / r["pp"]))


def run_row(row, servers):
    keys = [k for k in servers if k in SERVERS]
    if row.system and "full" in keys and "full_noshare" not in keys:  # the peer of sharing
        keys.insert(keys.index("full") + 1, "full_noshare")
    fp = footprints(row, keys + ([] if "full" in keys else ["full"]))
    k = MEM_SEQS.get(row.name, 1)
    mem = mem_bytes(MEM) if MEM != "auto" else int(1.5 * k * fp["full"])
    print("bench-serve %s: %s, --kv-memory %d (%.1f MiB%s)" % (
        row.name, row.describe(), mem, mem / 1048576.0,
        ": 1.5x the full cache's footprint%s" % (" of %d requests" % k if k > 1 else "")
        if MEM == "auto" else ""), flush=True)
    rows = []
    for key in keys:
        r = kvrt_row(row, key, mem)
        if row.name == "prefill":  # the engine's rate at the same prompt, right after
            r["pp"] = bench_pp(int(r["prompt_tokens"]))
        r["fit"] = "%d (%.1f MiB each)" % (mem // fp[key], fp[key] / 1048576.0)
        rows.append((SERVERS[key][0], r))
        print("  measured %s: %s" % (SERVERS[key][0], r), flush=True)
    why = None
    if "llama" in servers:
        lr, why = llama_row(row, mem)
        if lr:
            lr["fit"] = lr["slots"]
            rows.append(("llama-server (f16 KV, full)", lr))
            print("  measured llama-server: %s" % lr, flush=True)
    print(flush=True)
    print("| %s | admitted at once | pool fits | finished | prompt tokens | gen tok/s "
          "| TTFT p50 s | TTFT p99 s | ITL p50 s | ITL p99 s |" % row.name)
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        print("| %s | %s | %s | %d/%d | %.0f | %.1f | %.2f | %.2f | %.3f | %.3f |" % (
            name, r["admitted"], r["fit"], r["done"], row.n, r["prompt_tokens"], r["tok_s"],
            r["p50"], r["p99"], r["itl50"], r["itl99"]))
    for name, r in rows:
        if "shared" in r:
            print("%s: %d of %d sequences held the system prompt's keys and values in a shared "
                  "prefix (%d differed and kept their own), at most %d at once; the prefix "
                  "%.1f MiB counted once, sharing saved at most %.1f MiB of pool at once; "
                  "%d prompt tokens prefilled, %d skipped (forked from a shared prefix)" % (
                      name, r["shared"], row.n, r["differed"],
                      r["most"]["kvpc_prefix_sequences"],
                      r["most"]["kvpc_prefix_bytes"] / 1048576.0,
                      r["most"]["kvpc_prefix_bytes_saved"] / 1048576.0,
                      r["prefilled"], r["skipped"]))
    if why:
        print("\nllama-server skipped: %s" % why)
    if row.name == "prefill":
        prefill_rates([(n, r) for n, r in rows if "pp" in r])
    full = next((r for n, r in rows if n == "kvrt full"), None)
    for n, r in rows:
        if full and n.startswith("kvrt ") and n != "kvrt full" and full["tok_s"] > 0:
            print("%s: %.2fx the generated tok/s of full, TTFT p50 %.2fx full's, %.1fx the "
                  "sequences admitted at once" % (n, r["tok_s"] / full["tok_s"],
                                                  r["p50"] / full["p50"] if full["p50"] else float("nan"),
                                                  r["admitted"] / max(1, full["admitted"])))
    print(flush=True)


def main():
    rows = [Row(n) for n in env_list("BENCH_ROWS", "decode,chat,long") if n in ROWS]
    servers = env_list("BENCH_SERVERS", "full,h2o,tova_tiers,llama")
    if not rows:
        sys.exit("bench-serve: BENCH_ROWS names none of %s" % ", ".join(ROWS))
    global N_MAX
    for row in rows:
        N_MAX = row.n
        run_row(row, servers)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # cut-off clients may still block in their sockets: do not wait for them
