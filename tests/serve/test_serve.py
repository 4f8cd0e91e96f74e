#!/usr/bin/env python3
"""End-to-end tests of `BIN serve` against a server this script starts on a loopback
port and stops itself (SIGTERM: the drain must exit 0).

References are independent of the server: greedy output must equal `BIN run` for the
same prompt, policy and prefill chunk; the pinned span must survive compression under
a policy that keeps it (and not under one that does not); every bad input must get a
clear 4xx while the server keeps serving the others unchanged. The real `openai`
client drives completions, chat and streaming; curl drives the raw HTTP cases.

Usage: test_serve.py BIN MODEL   (BIN built by kvpc with h2o, snapkv and h2o_pinned)
SERVE_QUICK=1 (the AddressSanitizer pass of `make check`) skips the `run` references and the
openai client and compares the server's greedy answers with its own first answer instead:
that pass is about memory errors and leaks along every request path, the plain pass about
the answers.
"""
import concurrent.futures as cf
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN, MODEL = sys.argv[1], sys.argv[2]
MODEL_ID = os.path.basename(MODEL).replace(".gguf", "")
CHUNK = 32
PREFILL = 16  # serve's default --prefill-chunk (RT_SERVE_PREFILL_CHUNK, at most --chunk)
FAILS = []
QUICK = os.environ.get("SERVE_QUICK") == "1"
SAN_LINES = []
N_CLIENTS = 16 if QUICK else 64  # concurrent clients (16: all active at once)
DRAINS = []


T0 = time.time()


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + ("[%5.1f s] " % (time.time() - T0) if QUICK else "") + what,
          flush=True)
    if not cond:
        FAILS.append(what)


def start(trace, kv_memory="96M", max_seqs=16, queue=64):
    args = [BIN, "serve", "--model", MODEL, "--port", "0", "--kv-memory", kv_memory,
            "--max-seqs", str(max_seqs), "--queue", str(queue), "--chunk", str(CHUNK),
            "--timeout", "2", "--max-body", "256K", "--threads", "2", "--trace", trace,
            "--policy", "h2o"]
    p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        p.kill()
        sys.exit("server did not start: " + line + p.stderr.read())
    def drain():  # keep what a sanitizer says; the rest of stderr is the server's log
        for l in p.stderr:
            if re.search(r"Sanitizer|runtime error:|^    #\d+ ", l):
                SAN_LINES.append(l.rstrip())
    th = threading.Thread(target=drain, daemon=True)
    th.start()
    DRAINS.append(th)
    return p, int(m.group(1))


def run_cli(prompt, n, policy, ratio, chat=False, system=None, prefill=PREFILL, chunk=CHUNK):
    # the server's default prefill chunk is PREFILL; `run`'s default is 0 (exact)
    args = [BIN, "run", "--model", MODEL, "--prompt", prompt, "-n", str(n), "--policy", policy,
            "--chunk", str(chunk), "--prefill-chunk", str(prefill), "--threads", "2"]
    if ratio:
        args += ["--ratio", str(ratio)]
    if chat:
        args += ["--chat"] + (["--system", system] if system else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout


def post(port, path, body, raw=False, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if raw else json.dumps(body).encode()
    c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    txt = r.read().decode("utf-8", "replace")
    c.close()
    try:
        return r.status, json.loads(txt), r
    except ValueError:
        return r.status, txt, r


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    t = r.read().decode()
    c.close()
    return r.status, t


def metric(port, name):
    _, t = get(port, "/metrics")
    m = re.search(r"^%s (\S+)$" % re.escape(name), t, re.M)
    return float(m.group(1)) if m else None


def wait_freed(port, limit=5.0):
    """Seconds until no sequence is active and no pool byte is in use, or None."""
    t0 = time.time()
    while time.time() - t0 < limit:
        if metric(port, "kvpc_sequences_active") == 0 and metric(port, "kvpc_pool_bytes_in_use") == 0:
            return time.time() - t0
        time.sleep(0.02)
    return None


def count(port, name):
    """A counter's value (0 while it has no sample yet)."""
    v = metric(port, name)
    return 0 if v is None else v


def req_count(port, endpoint, status):
    return count(port, 'kvpc_requests_total{endpoint="%s",status="%d"}' % (endpoint, status))


def hist(port, name):
    """(count, sum, cumulative buckets in order) of a histogram."""
    _, t = get(port, "/metrics")
    b = [(m.group(1), float(m.group(2))) for m in
         re.finditer(r'^%s_bucket\{le="([^"]+)"\} (\S+)$' % re.escape(name), t, re.M)]
    c = re.search(r"^%s_count (\S+)$" % re.escape(name), t, re.M)
    s = re.search(r"^%s_sum (\S+)$" % re.escape(name), t, re.M)
    return (float(c.group(1)) if c else None, float(s.group(1)) if s else None, b)


def metrics_ops(port):
    """/metrics counts requests by endpoint and status, not its own scrapes or /health; the
    latency histograms move by what one request did, measured by the client."""
    ok = req_count(port, "/v1/completions", 200)
    for _ in range(3):
        get(port, "/metrics")
        get(port, "/health")
    _, t = get(port, "/metrics")
    check('endpoint="/metrics"' not in t and 'endpoint="/health"' not in t and
          "kvpc_requests_total{status=" not in t,
          "scrapes of /metrics and /health are not counted as requests")
    before = {h: hist(port, h) for h in ("kvpc_time_to_first_token_seconds",
              "kvpc_inter_token_latency_seconds", "kvpc_e2e_request_latency_seconds")}
    t0 = time.time()
    st, a, _ = post(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6,
                    "temperature": 0, "kv": {"policy": "full"}})
    wall = time.time() - t0
    after = {h: hist(port, h) for h in before}
    check(st == 200 and req_count(port, "/v1/completions", 200) == ok + 1,
          "a completion counts once under endpoint /v1/completions, status 200")
    d = {h: (after[h][0] - before[h][0], after[h][1] - before[h][1]) for h in before}
    n_gen = a["usage"]["completion_tokens"] if st == 200 else -1
    ttft, itl, e2e = (d["kvpc_time_to_first_token_seconds"], d["kvpc_inter_token_latency_seconds"],
                      d["kvpc_e2e_request_latency_seconds"])
    check(ttft[0] == 1 and e2e[0] == 1 and 0 < ttft[1] <= e2e[1] <= wall,
          "one request: one TTFT and one end-to-end sample, TTFT <= e2e <= the client's %.3f s: %s"
          % (wall, d))
    check(a["choices"][0]["finish_reason"] != "length" or (itl[0] == n_gen - 1 and itl[1] <= e2e[1]),
          "one request of %d tokens: %d inter-token samples" % (n_gen, itl[0]))
    for h, (c, s, b) in after.items():
        cums = [v for _, v in b]
        check(c is not None and b and b[-1][0] == "+Inf" and cums[-1] == c and cums == sorted(cums),
              "%s: cumulative buckets ending at +Inf = _count" % h)
    st404, st405 = req_count(port, "other", 404), req_count(port, "/v1/completions", 405)
    get(port, "/nosuch")
    get(port, "/v1/completions")
    check(req_count(port, "other", 404) == st404 + 1 and
          req_count(port, "/v1/completions", 405) == st405 + 1,
          "an unknown path counts under endpoint other (404), a wrong method under its endpoint (405)")


def prefill_order(port, filler, kv):
    """Prompts are prefilled in arrival order, under the full cache and under a per-step
    policy (kv): of two long prompts sent together, the first is prefilled in the first step
    (its chunk may take the step's rows) and gives its first token while the second is still
    being prefilled (round-robin chunks would give both at about the same time). Whole
    answers (a stream idle through a long step would meet the test server's 3 s connection
    timeout); the time to first token comes from the trace. Returns the two request ids."""
    long_text = (filler + " ") * 6
    ids = [None, None]

    def one(i):
        st, a, _ = post(port, "/v1/completions", {"prompt": "%d. %s" % (i, long_text),
                        "max_tokens": 4, "temperature": 0, "kv": kv}, timeout=120)
        ids[i] = a.get("id") if st == 200 else None
    ths = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    ths[0].start()
    time.sleep(0.05)
    ths[1].start()
    for th in ths:
        th.join()
    return ids


SHARED_SYS = ("You are the archive assistant of a small coastal museum. You answer questions "
              "about the lighthouse, the harbour and the fishing fleet in one or two short "
              "sentences, plainly, without lists, and you say so when the archive holds no "
              "record of what is asked. Dates are given as day, month and year. ") * 2
SHARED_USERS = ["When was the lighthouse built?", "Who kept the harbour records?",
                "How many boats were in the fleet?"]


def shared_prefix(port, with_run):
    """Requests that start with the same protected tokens (one system prompt) share their key
    and value rows, and a request that finds them in the pool skips their prefill
    (docs/serving.md, "Shared prefixes"): three chat requests sent together, under the full
    cache and under h2o_pinned x2 (keep span system; fixed prefill chunks), give token for
    token the answers each gives alone with kv.share_prefix false (an unshared run: its
    prefix_shared_tokens is 0) and, for the full cache when with_run (the plain pass),
    `run --chat --system`'s with the server's cut (the first user turn, all but the last
    token of its prompt in one chunk, then the last). All three share P tokens' rows: the first to arrive computes them,
    the other two wait for it and start from its store and state where its first prompt step
    at or past P ended (the system turn's end under the full cache), so each reports those
    tokens skipped, as /metrics does; under h2o_pinned only a request with the
    prompt length of an earlier one starts from its state (a compressing policy's budget
    follows the prompt length), the others compute their own prefix, each its own copy. While they run, /metrics counts the prefix
    once: in one step's snapshot the pool holds the sequences' own bytes less (sharers -
    prefixes) copies of a prefix, whose bytes are hand-computed: 30 layers x 3 KV heads x P entries
    x 2 rows of 64 f16 values (256 bytes), P = the system turn's tokens cut to a multiple of
    32 (a 4096-byte page of 128-byte rows, two 16-entry blocks). Returns (the first user
    turn's prompt tokens, P)."""
    sysmsg, users = SHARED_SYS, SHARED_USERS
    # h2o_pinned's chunks are fixed (kv.prefill_chunk): a per-step policy's answer depends
    # on its chunk sizes, which otherwise follow the load (docs/serving.md)
    n_prompt = P = -1
    for kv in ({"policy": "full"}, {"policy": "h2o_pinned", "ratio": 2, "prefill_chunk": PREFILL}):
        def ask(u, share=True):
            return post(port, "/v1/chat/completions", {"messages": [
                {"role": "system", "content": sysmsg}, {"role": "user", "content": u}],
                "max_tokens": 8 if QUICK else 24, "temperature": 0,
                "kv": dict(kv, share_prefix=share)}, timeout=300)
        alone = [ask(u, False) for u in users]
        snaps = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                _, t = get(port, "/metrics")
                g = {k: float(v) for k, v in re.findall(r"^(kvpc_(?:step|prefix)_\w+) (\S+)$", t, re.M)}
                if g.get("kvpc_prefix_sequences", 0) >= 2:
                    snaps.append(g)
                time.sleep(0.01)
        skipped0 = count(port, "kvpc_prefix_skipped_tokens_total")
        w = threading.Thread(target=watch)
        w.start()
        with cf.ThreadPoolExecutor(3) as ex:
            together = list(ex.map(ask, users))
        stop.set()
        w.join()
        ok = all(a[0] == 200 for a in alone + together)
        texts = lambda rs: [r[1]["choices"][0]["message"]["content"] if r[0] == 200 else r for r in rs]
        kvs = lambda rs, k: [r[1]["kv"][k] for r in rs] if ok else []
        P = alone[0][1]["kv"]["system_tokens"] // 32 * 32 if ok else -1
        n_prompt = alone[0][1]["usage"]["prompt_tokens"] if ok else -1
        # a compressing policy's state after the prefix follows the prompt's length (its
        # budget): only a request with the same length starts from another's
        makers = 1 if kv["policy"] == "full" else len({r[1]["usage"]["prompt_tokens"] for r in alone}) if ok else 0
        # a fork starts where its maker's first prompt step at or past P ended: under the
        # full cache (chunks of up to the step's rows within one span) the system turn's end
        n_sys = alone[0][1]["kv"]["system_tokens"] if ok else -1
        skipped = sorted(kvs(together, "prefix_skipped_tokens"))
        forks = skipped[makers:]
        check(ok and texts(together) == texts(alone) and kvs(alone, "prefix_shared_tokens") == [0, 0, 0] and
              kvs(alone, "prefix_skipped_tokens") == [0, 0, 0] and
              kvs(together, "prefix_shared_tokens") == [P] * 3 and P >= 64 and
              skipped[:makers] == [0] * makers and len(set(forks)) == 1 and
              (forks[0] == n_sys if kv["policy"] == "full" else P <= forks[0] <= n_sys) and
              count(port, "kvpc_prefix_skipped_tokens_total") - skipped0 == sum(forks),
              "%s: a shared system prompt (%d tokens shared of %s, skipped %s) answers as unshared runs: %s" %
              (kv["policy"], P, kvs(together, "prefix_shared_tokens"),
               kvs(together, "prefix_skipped_tokens"), texts(together)))
        if kv["policy"] == "full" and with_run and ok:
            # the server's schedule: a lone full-cache prompt takes two steps, which `run`
            # reproduces with all but the last token in one chunk, then the last; on the fast
            # path the cut can tip a near-tie (docs/exactness.md), so `run` is given it
            n_p, steps = alone[0][1]["usage"]["prompt_tokens"], alone[0][1]["kv"]["prompt_steps"]
            ref = run_cli(users[0], 24, "full", 0, True, sysmsg, PREFILL, n_p - 1)
            check(steps == 2 and texts(alone)[0] == ref,
                  "full: the lone chat answer (%d prompt tokens in %d steps) is `run --chat --system "
                  "--chunk %d`'s: %r vs %r" % (n_p, steps, n_p - 1, texts(alone)[0], ref))
        seg = 30 * 3 * P * 256
        good = [g for g in snaps if g["kvpc_prefix_bytes"] == g["kvpc_prefix_segments"] * seg and
                g["kvpc_prefix_bytes_saved"] == (g["kvpc_prefix_sequences"] - g["kvpc_prefix_segments"]) * seg and
                g["kvpc_step_pool_bytes_in_use"] == g["kvpc_step_kv_bytes_held"] - g["kvpc_prefix_bytes_saved"]]
        check(snaps and len(good) == len(snaps),
              "%s: /metrics counts each shared prefix (%d bytes) once in the pool: %d of %d snapshots, e.g. %s" %
              (kv["policy"], seg, len(good), len(snaps), snaps[-1] if snaps else None))
    check(wait_freed(port) is not None and metric(port, "kvpc_prefix_segments") == 0 and
          metric(port, "kvpc_pool_bytes_reserved") == 0,
          "every block, reservation and shared prefix is back when the requests end")
    return n_prompt, P


def shared_admission(trace, n_prompt, P):
    """Admission counts a shared prefix once under the full cache: four requests with one
    system prompt and user turn (n_prompt tokens, P shared) and max_tokens T on a pool
    that holds one unshared footprint F but not two, where F = ceil((n_prompt + T) / 16)
    blocks x 90 lists x 4320 bytes (a block: 16 entries of a 128-byte f16 key row and value
    row, a 4-byte position, count and log count, a 2-byte span), and the prefix's rows are
    S = 90 x P x 256 bytes. Unshared, one runs at a time; shared, the first reserves F (its
    own rows less the prefix, and the prefix once) and each later one F - S, so three run at
    once (3F - 2S fits, 4F - 3S does not), and while three run the server reserves exactly
    3F - 2S. The answers are the same either way."""
    T = 16 if QUICK else 32  # SERVE_QUICK: a sanitized server is slow per token
    F = -(-(n_prompt + T) // 16) * 90 * 4320
    S = 90 * P * 256
    mem = 3 * F - 2 * S + 65536
    assert 2 * F > mem and 4 * F - 3 * S > mem
    srv, port = start(trace, kv_memory=str(mem), max_seqs=8, queue=8)
    try:
        for share in (True, False):
            seen = []
            stop = threading.Event()

            def watch():
                while not stop.is_set():
                    _, t = get(port, "/metrics")  # one scrape: the two figures together
                    g = dict(re.findall(r"^(kvpc_sequences_active|kvpc_pool_bytes_reserved) (\S+)$", t, re.M))
                    seen.append((float(g["kvpc_sequences_active"]), float(g["kvpc_pool_bytes_reserved"])))
                    time.sleep(0.01)
            w = threading.Thread(target=watch)
            w.start()
            body = {"messages": [{"role": "system", "content": SHARED_SYS},
                                 {"role": "user", "content": SHARED_USERS[0]}],
                    "max_tokens": T, "temperature": 0, "kv": {"policy": "full", "share_prefix": share}}
            with cf.ThreadPoolExecutor(4) as ex:
                rs = list(ex.map(lambda _: post(port, "/v1/chat/completions", body, timeout=300), range(4)))
            stop.set()
            w.join()
            texts = [r[1]["choices"][0]["message"]["content"] if r[0] == 200 else r for r in rs]
            most = max(a for a, _ in seen)
            at_most = sorted({r for a, r in seen if a == most})
            want = (3, [3 * F - 2 * S]) if share else (1, [F])
            check(all(r[0] == 200 for r in rs) and len(set(texts)) == 1 and (most, at_most) == want,
                  "a %d-byte pool, footprint %d, prefix %d: %s, at most %d requests ran at once "
                  "(want %d) reserving %s (want %s): %s" %
                  (mem, F, S, "shared" if share else "unshared", most, want[0], at_most, want[1], texts[0]))
        check(wait_freed(port) is not None and metric(port, "kvpc_pool_bytes_reserved") == 0,
              "the small pool's blocks and reservations are back")
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=20)


def raw_request(port, body):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def queue_full(trace, prompt, ref):
    """A server with a small pool (a few requests' footprints) and a queue of one: while one
    request runs, of five more sent at once at least one waits or runs and the rest get 503
    with Retry-After; the ones served give the same text as `run`; a request whose
    footprint exceeds the whole pool is a 400."""
    # SERVE_QUICK (a sanitized server, slow per token): 12 tokens on a 2M pool
    srv, port = start(trace, kv_memory="2M" if QUICK else "3M", max_seqs=4, queue=1)
    try:
        body = {"prompt": prompt, "max_tokens": 12 if QUICK else 40, "temperature": 0,
                "kv": {"policy": "full"}}

        def one(i):
            st, a, r = post(port, "/v1/completions", body, timeout=120)
            return st, a, r.getheader("Retry-After")
        with cf.ThreadPoolExecutor(6) as ex:
            first = ex.submit(one, 0)
            t0 = time.time()
            while metric(port, "kvpc_sequences_active") != 1 and time.time() - t0 < 30:
                time.sleep(0.01)
            res = list(ex.map(one, range(5))) + [first.result()]
        ok = [a["choices"][0]["text"] for st, a, _ in res if st == 200]
        ref = ref if ref is not None else (ok[0] if ok else None)
        busy = [(a, ra) for st, a, ra in res if st == 503]
        check(len(ok) >= 2 and set(ok) == {ref} and len(busy) >= 1 and len(ok) + len(busy) == 6,
              "queue full: %d x 200 equal to %s, %d x 503" %
              (len(ok), "the first answer" if QUICK else "`run`", len(busy)))
        check(all(ra == "1" and a["error"]["type"] == "overloaded_error" and
                  "queue is full" in a["error"]["message"] for a, ra in busy),
              "each 503 has Retry-After: 1 and an overloaded_error: %s" % (busy[:1],))
        check(metric(port, "kvpc_requests_rejected_total") == len(busy),
              "kvpc_requests_rejected_total counts the 503s")
        st, a, _ = post(port, "/v1/completions", dict(body, max_tokens=2000))
        check(st == 400 and "kv-memory" in a["error"]["message"] and a["error"]["param"] == "max_tokens",
              "a footprint beyond the whole pool is a 400 naming max_tokens (a shorter answer "
              "fits): %d %s" % (st, a["error"]))
        st, a, _ = post(port, "/v1/completions", dict(body, prompt=prompt * 200, max_tokens=1))
        check(st == 400 and "the prompt alone does not fit" in a["error"]["message"] and
              a["error"]["param"] == "prompt",
              "a prompt beyond the whole pool is a 400 naming the prompt: %d %s" % (st, a["error"]))
        st, a, _ = post(port, "/v1/completions", body)
        check(st == 200 and a["choices"][0]["text"] == ref, "served after the 503s")
        check(wait_freed(port) is not None, "every block is back in the small pool")
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = None
    check(rc == 0, "the small server drains and exits 0 (rc %s)" % rc)


def prefill_fallback(trace, story, ref):
    """A pool that holds a request's footprint but not one prompt chunk of the whole prompt
    cuts the chunk to what it holds: the h2o x4 story's footprint is its floor, 64 entries,
    plus PREFILL, 5 blocks per list (2.03 MB); one chunk of its 103 tokens would take 7
    blocks per list, 0.81 MB more than the 0.47 MB left of a 2.5 MB pool (one block per
    list), so the prompt takes more than one step (96 tokens, then 7) and no block is
    refused (a refusal fails the request). Its greedy text is `run --prefill-chunk PREFILL`'s
    (this story's is the same under every prefill schedule tested), and every block comes
    back."""
    srv, port = start(trace, kv_memory="2500K", max_seqs=2, queue=2)
    try:
        st, a, _ = post(port, "/v1/completions", {"prompt": story, "max_tokens": 12,
                        "temperature": 0, "kv": {"ratio": 4}}, timeout=120)
        steps = a["kv"]["prompt_steps"] if st == 200 else None
        ref = ref if ref is not None else (a["choices"][0]["text"] if st == 200 else None)
        check(st == 200 and steps and steps > 1 and a["choices"][0]["text"] == ref,
              "a nearly full pool cuts the prompt chunk to what it holds: %s, %s steps, %r vs %s %r" %
              (st, steps, a["choices"][0]["text"] if st == 200 else a,
               "itself" if QUICK else "`run --prefill-chunk %d`" % PREFILL, ref))
        check(wait_freed(port) is not None, "every block is back in the 2.5 MB pool")
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()


def pool_below_one_block():
    """A --kv-memory that cannot hold one block per list refuses to start (exit 1, the
    least it needs), rather than listening and refusing every request."""
    p = subprocess.run([BIN, "serve", "--model", MODEL, "--port", "0", "--kv-memory", "1K"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 1 and "--kv-memory 1024 bytes cannot hold one KV block per list" in p.stderr
          and "listening" not in p.stderr,
          "serve --kv-memory 1K refuses to start: rc %d %s" % (p.returncode, p.stderr.strip()[-160:]))


def main():
    pool_below_one_block()
    try:
        import openai
    except ImportError:
        openai = None
        print("SKIP the openai client cases: the Python package `openai` is not installed "
              "(make deps installs it with pip)")
    if QUICK:
        openai = None
        print("SERVE_QUICK=1: no `run` references, no openai client")
    trace = tempfile.mktemp(suffix=".jsonl")
    n_shared_prompt = P_shared = -1
    srv, port = start(trace)
    t_start = time.time()
    base = "http://127.0.0.1:%d/v1" % port
    try:
        prompt = "The three primary colors are"
        story = ("The lighthouse keeper walked up the spiral stairs every evening to light the lamp. "
                 "Ships passed the rocky coast safely because of his careful work. One stormy night "
                 "the lamp went out, and the keeper had to climb the tower in the dark wind to fix it. ") * 2
        sysmsg, user = "You answer in one short sentence.", "What is the capital of Italy?"
        if QUICK:
            st, a, _ = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12,
                            "temperature": 0, "kv": {"ratio": 2}}, timeout=120)
            ref_h2o, ref_full = a["choices"][0]["text"], None
        else:
            with cf.ThreadPoolExecutor(3) as ex:
                refs = [ex.submit(run_cli, prompt, 12, "h2o", 2), ex.submit(run_cli, story, 12, "snapkv", 2),
                        ex.submit(run_cli, user, 10, "h2o", 2, True, sysmsg),
                        ex.submit(run_cli, story, 12, "h2o", 4, False, None, 0),
                        ex.submit(run_cli, story, 12, "h2o", 4),
                        ex.submit(run_cli, prompt, 40, "full", 0),
                        ex.submit(run_cli, story, 12, "h2o", 4, False, None, 256, 256)]
                ref_h2o, ref_snap, ref_chat, ref_exact, ref_chunked, ref_full, ref_whole = \
                    [f.result() for f in refs]

        # ---- the openai client: completions, chat, streaming, per-request policy
        if openai:
            cl = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
            ids = [m.id for m in cl.models.list().data]
            check(ids == [MODEL_ID], "GET /v1/models lists the model: %s" % ids)
            r = cl.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12,
                                      temperature=0, extra_body={"kv": {"ratio": 2}})
            check(r.choices[0].text == ref_h2o,
                  "completion (h2o x2) equals `run`: %r vs %r" % (r.choices[0].text, ref_h2o))
            check(r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 0, "usage filled")
            r = cl.completions.create(model=MODEL_ID, prompt=story, max_tokens=12, temperature=0,
                                      extra_body={"kv": {"policy": "snapkv", "ratio": 2}})
            check(r.choices[0].text == ref_snap and r.model_extra["kv"]["policy"] == "snapkv",
                  "per-request policy snapkv x2 equals `run`: %r vs %r" % (r.choices[0].text, ref_snap))
            parts, usage = [], None
            for ch in cl.chat.completions.create(
                    model=MODEL_ID, max_tokens=10, temperature=0, stream=True,
                    messages=[{"role": "system", "content": sysmsg}, {"role": "user", "content": user}],
                    extra_body={"kv": {"ratio": 2}}):
                if ch.choices and ch.choices[0].delta.content:
                    parts.append(ch.choices[0].delta.content)
                usage = ch.usage or usage
            check("".join(parts) == ref_chat,
                  "streamed chat equals `run --chat`: %r vs %r" % ("".join(parts), ref_chat))
            check(usage is not None and usage.completion_tokens == len(parts) or usage is not None,
                  "the last stream chunk carries usage")
            r = cl.chat.completions.create(model=MODEL_ID, max_tokens=10, temperature=0,
                                           messages=[{"role": "system", "content": sysmsg},
                                                     {"role": "user", "content": user}],
                                           extra_body={"kv": {"ratio": 2}})
            check(r.choices[0].message.content == ref_chat, "chat (not streamed) equals `run --chat`")
            # h2o's default budget is 20% of the context: 0.8 entries for a 4-token prompt;
            # under the server's floor (--min-kv 64) the prompt stays whole and is answered,
            # without any floor (kv.min_kv 0, and h2o_pinned has no `min` of its own, unlike
            # the library h2o) it is refused as kvpc check refuses it (a 400 naming the
            # budget, not an empty cache)
            r = cl.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=4)
            check(r.choices[0].text != "", "a budget below 1 entry under the floor is answered")
            try:
                cl.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8,
                                      extra_body={"kv": {"policy": "h2o_pinned", "min_kv": 0}})
                check(False, "a budget below 1 entry is refused")
            except openai.BadRequestError as e:
                check("below 1 entry" in str(e), "a budget below 1 entry is a 400: %s" % e)
            r = cl.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8,
                                      temperature=0.8, top_p=0.9, seed=7,
                                      extra_body={"kv": {"ratio": 2}})
            r2 = cl.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8,
                                       temperature=0.8, top_p=0.9, seed=7,
                                       extra_body={"kv": {"ratio": 2}})
            check(r.choices[0].text == r2.choices[0].text, "sampling with a seed is reproducible")
            r = cl.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12, temperature=0,
                                      stop=[" and"], extra_body={"kv": {"ratio": 2}})
            want = ref_h2o.split(" and")[0] if " and" in ref_h2o else ref_h2o
            check(r.choices[0].text == want, "stop string cuts the text: %r" % r.choices[0].text)
            # the prefill schedule per request: 0 is `run`'s exact token-by-token prefill,
            # the default is chunks of PREFILL (what `run --prefill-chunk PREFILL` does)
            r = cl.completions.create(model=MODEL_ID, prompt=story, max_tokens=12, temperature=0,
                                      extra_body={"kv": {"ratio": 4, "prefill_chunk": 0}})
            check(r.choices[0].text == ref_exact,
                  "prefill_chunk 0 (h2o x4) equals `run` (exact): %r vs %r" % (r.choices[0].text, ref_exact))
            # a request that fixes its prefill chunk gets exactly that schedule; without one a
            # lone prompt on a roomy pool takes one chunk (the step's rows: the whole story)
            r = cl.completions.create(model=MODEL_ID, prompt=story, max_tokens=12, temperature=0,
                                      extra_body={"kv": {"ratio": 4, "prefill_chunk": PREFILL}})
            steps = r.model_extra["kv"]["prompt_steps"]
            check(r.choices[0].text == ref_chunked and steps > 1,
                  "prefill_chunk %d (h2o x4) equals `run --prefill-chunk %d`, in %d steps: %r vs %r"
                  % (PREFILL, PREFILL, steps, r.choices[0].text, ref_chunked))
            r = cl.completions.create(model=MODEL_ID, prompt=story, max_tokens=12, temperature=0,
                                      extra_body={"kv": {"ratio": 4}})
            steps = r.model_extra["kv"]["prompt_steps"]
            check(r.choices[0].text == ref_whole and steps == 1,
                  "default prefill of a lone prompt (h2o x4) is one step, equal to `run --chunk "
                  "256 --prefill-chunk 256`: %d steps, %r vs %r" % (steps, r.choices[0].text, ref_whole))
            for bad_pf in (-1, 1.5, "8"):
                try:
                    cl.completions.create(model=MODEL_ID, prompt="x", max_tokens=2,
                                          extra_body={"kv": {"ratio": 2, "prefill_chunk": bad_pf}})
                    check(False, "prefill_chunk %r is refused" % (bad_pf,))
                except openai.BadRequestError as e:
                    check("prefill_chunk" in str(e), "prefill_chunk %r is a 400: %s" % (bad_pf, e))
            try:
                cl.completions.create(model=MODEL_ID, prompt="x", max_tokens=5,
                                      extra_body={"kv": {"policy": "nosuch"}})
                check(False, "the openai client sees a 400 for an unknown policy")
            except openai.BadRequestError as e:
                check("unknown policy 'nosuch'" in str(e), "the openai client sees a 400: %s" % e)

        # ---- a pinned span is kept by a policy that keeps it, not by one that does not
        filler = " ".join("Item %d is a plain filler sentence about nothing much." % i for i in range(3))
        req = "REQUIREMENT: every answer must mention the number 4217."
        msgs = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": req, "protect": True},
                {"role": "user", "content": filler + " Now summarise."}]
        # (the library h2o's own floor, 64 tokens, would keep this short chat whole: its
        # case gets a longer filler, so that ratio 4 evicts)
        long_msgs = msgs[:2] + [{"role": "user", "content": " ".join(
            "Item %d is a plain filler sentence about nothing much." % i for i in range(30)) + " Now summarise."}]
        bodies = [("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                              "kv": {"policy": "h2o_pinned", "ratio": 4, "min_kv": 0}}),
                  ("/v1/chat/completions", {"messages": long_msgs, "max_tokens": 4, "temperature": 0,
                                              "kv": {"policy": "h2o", "ratio": 4, "min_kv": 0}}),
                  ("/v1/completions", {"prompt": [{"text": req, "protect": True}, filler],
                                       "max_tokens": 2, "temperature": 0,
                                       "kv": {"policy": "h2o_pinned", "ratio": 4, "min_kv": 0}})]
        with cf.ThreadPoolExecutor(3) as ex:  # three sequences in one batch
            got = list(ex.map(lambda b: post(port, b[0], b[1], timeout=120), bodies))
        kvs = [a.get("kv", {}) if st == 200 else {} for st, a, _ in got]
        kv = kvs[0]
        check(kv.get("pinned_tokens", 0) > 5 and kv["pinned_kept"] == kv["pinned_tokens"]
              and kv["compress_events"] > 0,
              "pinned span kept under h2o_pinned x4: %s" % {k: kv.get(k) for k in ("pinned_tokens", "pinned_kept", "compress_events")})
        # the protected spans (system and pinned, about 30 tokens) hold more than the budget
        # (a quarter of the context, about 15 entries, less the recent window): kept whole,
        # and the response says the cache holds more than its budget
        check(any("protected span exceeded the budget" in n for n in kv.get("budget_notes", [])),
              "a span over the budget is reported: %s" % kv.get("budget_notes"))
        kv = kvs[1]
        check(kv.get("pinned_kept", 99) < kv.get("pinned_tokens", 0),
              "without `keep span pinned` h2o x4 evicts part of it: %s/%s" % (kv.get("pinned_kept"), kv.get("pinned_tokens")))
        kv = kvs[2]
        check(kv.get("pinned_tokens", 0) > 5 and kv["pinned_kept"] == kv["pinned_tokens"],
              "a protected prompt segment is kept: %s" % kv)

        # ---- bad input: a clear 4xx each, the server keeps serving
        long_prompt = "word " * 9000
        cases = [
            ("malformed JSON", b'{"prompt": "x",', 400, "invalid JSON"),
            ("not an object", b'[1,2]', 400, "JSON object"),
            ("wrong type max_tokens", {"prompt": "x", "max_tokens": "8"}, 400, "max_tokens"),
            ("wrong type temperature", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
            ("wrong type prompt", {"prompt": 5}, 400, "prompt"),
            ("wrong type stream", {"prompt": "x", "stream": "yes"}, 400, "stream"),
            ("missing prompt", {"max_tokens": 3}, 400, "prompt is required"),
            ("unknown policy", {"prompt": "x", "kv": {"policy": "nosuch"}}, 400, "unknown policy"),
            ("unknown parameter", {"prompt": "x", "kv": {"policy": "h2o", "set": {"nosuch": 3}}}, 400, "nosuch"),
            ("bad parameter value", {"prompt": "x", "kv": {"policy": "h2o", "set": {"heavy": -1}}}, 400, "heavy"),
            ("ratio below 1", {"prompt": "x", "kv": {"ratio": 0.5}}, 400, "ratio"),
            ("byte_ratio below 1", {"prompt": "x", "kv": {"byte_ratio": 0.5}}, 400, "in bytes must be a finite number >= 1"),
            ("ratio and byte_ratio", {"prompt": "x", "kv": {"ratio": 2, "byte_ratio": 4}}, 400, "give one of them"),
            ("unknown kv field", {"prompt": "x", "kv": {"budget": 3}}, 400, "unknown field"),
            ("budget below the guards", {"prompt": filler, "max_tokens": 4, "kv": {"policy": "h2o_pinned", "ratio": 16, "min_kv": 0}}, 400, "guards (recent 3 tokens) exceed the budget (2.25 entries"),
            ("budget below 1 entry", {"prompt": filler, "max_tokens": 4, "kv": {"policy": "h2o_pinned", "ratio": 200, "min_kv": 0}}, 400, "below 1 entry"),
            ("max_tokens beyond the context", {"prompt": "x", "max_tokens": 100000}, 400, "beyond the context"),
            ("prompt over the context", {"prompt": long_prompt, "max_tokens": 1}, 400, "context_length"),
            ("unknown model", {"model": "gpt-9", "prompt": "x"}, 404, "does not exist"),
            ("invalid UTF-8", b'{"prompt": "\xff\xfe"}', 400, "decode byte"),
            # a token prompt (OpenAI's array of ids): each id a row of the model's embedding
            ("token id past the vocabulary", {"prompt": [504, 49152]}, 400,
             "prompt[1]: token id 49152 is outside the model's vocabulary 0..49151"),
            ("negative token id", {"prompt": [-1]}, 400, "prompt[0]: token id -1 is outside"),
            ("token prompt with a string", {"prompt": [504, "x"]}, 400, "prompt[1] must be a token id"),
            ("token prompt with a fraction", {"prompt": [1.5]}, 400, "prompt[0] must be a token id"),
            ("batched token prompts", {"prompt": [[504, 2365]]}, 400, "one prompt per request"),
            ("empty prompt", {"prompt": ""}, 400, "empty after tokenization"),
            ("empty prompt array", {"prompt": []}, 400, "non-empty array"),
            ("prompt segment without text", {"prompt": [{"protect": True}]}, 400, "prompt[0].text must be a string"),
            ("NUL in the prompt", b'{"prompt": "a\\u0000b"}', 400, "invalid JSON"),
            # n_predict is llama-server's name for max_tokens, checked the same way
            ("negative n_predict", {"prompt": "x", "n_predict": -1}, 400, "n_predict must be between 1 and"),
            ("huge n_predict", {"prompt": "x", "n_predict": 10**9}, 400, "n_predict 1000000000 is beyond the context"),
            ("n_predict beside max_tokens", {"prompt": "x", "max_tokens": 2, "n_predict": 2}, 400, "give one"),
            ("wrong type n_predict", {"prompt": "x", "n_predict": "8"}, 400, "n_predict must be an integer"),
            ("zero max_tokens", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be between 1 and"),
            ("fractional max_tokens", {"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens must be an integer"),
            ("unknown field", {"prompt": "x", "max_token": 3}, 400, "unknown field 'max_token'"),
            ("unsupported penalty", {"prompt": "x", "presence_penalty": 1.5}, 400, "presence_penalty is not supported"),
            ("chat field on completions", {"prompt": "x", "messages": []}, 400, "messages is a field of /v1/chat/completions"),
            ("wrong type include_usage", {"prompt": "x", "stream_options": {"include_usage": 1}}, 400,
             "include_usage must be a boolean"),
            ("wrong type top_k", {"prompt": "x", "top_k": 2.5}, 400, "top_k must be an integer"),
            ("n above 1", {"prompt": "x", "n": 2}, 400, "n must be between 1 and 1"),
            ("oversized body", b'{"prompt": "' + b"a" * 300000 + b'"}', 413, "exceeds"),
        ]
        # a budget in bytes per request (as --byte-ratio): the response's kv says which
        st, a, _ = post(port, "/v1/completions", {"prompt": story, "max_tokens": 4, "temperature": 0,
                        "kv": {"policy": "h2o", "byte_ratio": 2}}, timeout=120)
        kv = a.get("kv", {}) if isinstance(a, dict) else {}
        check(st == 200 and kv.get("byte_ratio") == 2 and kv.get("ratio") is None,
              "kv.byte_ratio 2 is the request's budget: %d %s" % (st, {k: kv.get(k) for k in ("ratio", "byte_ratio")}))
        # a parameter sent as 0.3 reads back as 0.3 (jansson's default 17 digits wrote
        # 0.29999999999999999, and h2o's default heavy 10% 0.10000000000000001)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": "Hello", "max_tokens": 1, "kv": {"policy": "h2o", "set": {"recent": 0.3}}}).encode(),
            headers={"Content-Type": "application/json"})
        r = c.getresponse()
        txt = r.read().decode()
        c.close()
        check(r.status == 200 and '"params":{"heavy":0.1,"recent":0.3}' in txt,
              "kv.params echo the values as sent: %d %s" % (r.status, txt[txt.find('"params"'):][:80]))
        # graceful budgets (the server's default --min-kv 64): a short prompt under a ratio
        # is answered whole, and guards over the budget raise it with a note, not a 400
        st, a, _ = post(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0,
                        "kv": {"policy": "snapkv", "ratio": 8}}, timeout=120)
        check(st == 200, "snapkv x8 on 'Hello' is answered under the floor: %d %s" % (st, str(a)[:120]))
        st, a, _ = post(port, "/v1/completions", {"prompt": filler, "max_tokens": 4, "temperature": 0,
                        "kv": {"policy": "h2o_pinned", "ratio": 16, "min_kv": 1}}, timeout=120)
        kv = a.get("kv", {}) if isinstance(a, dict) else {}
        check(st == 200 and kv.get("min_kv") == 1 and
              any("guards exceeded the budget" in n for n in kv.get("budget_notes", [])),
              "h2o x16 with guards over the budget: 200 with a note: %d %s" % (st, {k: kv.get(k) for k in ("min_kv", "budget_notes")}))
        for name, body, want, text in cases:
            st, a, resp = post(port, "/v1/completions", body, raw=isinstance(body, bytes))
            msg = a.get("error", {}).get("message", "") if isinstance(a, dict) else str(a)
            check(st == want and text in msg, "%s: %d %s" % (name, st, msg[:110]))
        chat_cases = [
            ("content not a string", {"messages": [{"role": "user", "content": 5}]}, 400,
             "messages[0].content must be a string"),
            ("unknown role", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
            ("completion field on chat", {"messages": [{"role": "user", "content": "x"}], "prompt": "x"},
             400, "prompt is a field of /v1/completions"),
            ("two limits on chat", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                                    "max_completion_tokens": 2}, 400, "give one"),
            # a misspelt "protect" must not drop the protection silently
            ("unknown message field", {"messages": [{"role": "user", "content": "x",
                                                     "protected": True}]}, 400,
             "messages[0]: unknown field 'protected'"),
        ]
        for name, body, want, text in chat_cases:
            st, a, resp = post(port, "/v1/chat/completions", body)
            msg = a.get("error", {}).get("message", "") if isinstance(a, dict) else str(a)
            check(st == want and text in msg, "chat %s: %d %s" % (name, st, msg[:110]))
        # the neutral values of OpenAI fields the server does not implement pass, and a
        # token prompt gives the same answer as its text (ids from `BIN tokenize`)
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as tf:
            tf.write(prompt)
            tf.flush()
            ids = [int(t) for t in subprocess.run([BIN, "tokenize", "--model", MODEL, "--text", tf.name],
                   capture_output=True, text=True, timeout=60, check=True).stdout.split()]
        st, a, _ = post(port, "/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0,
                        "kv": {"ratio": 2}, "presence_penalty": 0, "logit_bias": {}, "user": "u1",
                        "logprobs": None})
        check(st == 200 and a["choices"][0]["text"] == ref_h2o and a["usage"]["prompt_tokens"] == len(ids),
              "a token prompt of %d ids answers as its text does: %d %s" % (len(ids), st, str(a)[:110]))
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "GET",
                              base + "/completions"], capture_output=True, text=True, timeout=30)
        check(out.stdout == "405", "curl GET /v1/completions: %s" % out.stdout)
        out = subprocess.run(["curl", "-s", base.replace("/v1", "/nosuch")], capture_output=True,
                             text=True, timeout=30)
        check('"not_found_error"' in out.stdout, "curl unknown endpoint: 404 object")
        out = subprocess.run(["curl", "-s", "-N", base + "/completions", "-d",
                              json.dumps({"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                          "stream": True, "kv": {"ratio": 2}})],
                             capture_output=True, text=True, timeout=60)
        ev = [json.loads(l[6:]) for l in out.stdout.splitlines() if l.startswith("data: {")]
        check(out.stdout.rstrip().endswith("data: [DONE]") and
              "".join(e["choices"][0]["text"] for e in ev) == ref_h2o and "usage" in ev[-1],
              "curl streams SSE chunks that add up to `run`'s text, usage last")

        # a request that never finishes sending its body: 408 after --timeout (2 s)
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
        t0 = time.time()
        answer = {"got": b"", "t": None}

        def read_answer():
            try:
                while True:
                    b = s.recv(4096)
                    if answer["t"] is None:
                        answer["t"] = time.time() - t0
                    if not b:
                        break
                    answer["got"] += b
            except OSError:
                pass
        rd = threading.Thread(target=read_answer)
        rd.start()
        st, a, _ = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12,
                        "temperature": 0, "kv": {"ratio": 2}})
        check(st == 200 and a["choices"][0]["text"] == ref_h2o,
              "served while a client never finishes sending")
        rd.join()
        s.close()
        got, dt = answer["got"], answer["t"] or 99
        head, _, js = got.partition(b"\r\n\r\n")
        try:
            err = json.loads(js)["error"]
        except ValueError:
            err = {}
        check(head.startswith(b"HTTP/1.1 408") and "within 2 s (5 of 100 bytes" in err.get("message", "")
              and 1.9 < dt < 4, "a body that never finishes gets 408 after %.1f s: %r" % (dt, got[:160]))
        st, a, _ = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12,
                        "temperature": 0, "kv": {"ratio": 2}})
        check(st == 200 and a["choices"][0]["text"] == ref_h2o, "served after the 408")

        metrics_ops(port)
        order_ids = [(kv, prefill_order(port, filler, kv))
                     for kv in ({"policy": "full"}, {"policy": "h2o", "ratio": 8})]
        n_shared_prompt, P_shared = shared_prefix(port, not QUICK)
        cancelled0, gone0 = count(port, "kvpc_requests_cancelled_total"), req_count(port, "/v1/completions", 499)
        # a client that disconnects mid-stream frees its sequence at once (2000 tokens to
        # go: without the disconnect it would run for many seconds)
        s = raw_request(port, json.dumps({"prompt": filler, "max_tokens": 2000, "stream": True,
                                          "temperature": 0, "kv": {"policy": "full"}}).encode())
        got = b""
        while got.count(b"data: {") < 5:  # five events: at least five tokens streamed
            got += s.recv(4096)
        check(metric(port, "kvpc_sequences_active") == 1 and metric(port, "kvpc_pool_bytes_in_use") > 0,
              "the streamed sequence holds blocks while it runs")
        s.close()
        dt = wait_freed(port)
        check(dt is not None and dt < 3.0,
              "a client that disconnects mid-stream frees its sequence and blocks (%s s)" % dt)
        # ... and one that disconnects while waiting for a whole (not streamed) answer
        s = raw_request(port, json.dumps({"prompt": filler, "max_tokens": 2000, "temperature": 0,
                                          "kv": {"policy": "full"}}).encode())
        t0 = time.time()
        while metric(port, "kvpc_sequences_active") != 1 and time.time() - t0 < 10:
            time.sleep(0.02)
        time.sleep(0.2)
        s.close()
        dt = wait_freed(port)
        check(dt is not None and dt < 3.0,
              "a client that disconnects before a whole answer frees its sequence (%s s)" % dt)
        check(count(port, "kvpc_requests_cancelled_total") == cancelled0 + 2 and
              req_count(port, "/v1/completions", 499) == gone0 + 1,
              "both disconnects count as cancelled, the one that got no answer as status 499")

        # 64 concurrent clients (bounded: 16 active, 64 queued); outputs unchanged
        def one(i):
            return post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 3,
                        "temperature": 0, "kv": {"policy": "full"}}, timeout=120)[:2]
        st, solo, _ = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 3,
                           "temperature": 0, "kv": {"policy": "full"}})
        solo = solo["choices"][0]["text"]
        peak = {"active": 0, "queued": 0}
        done = threading.Event()

        def watch():  # the server's own gauges while the 64 clients run
            while not done.is_set():
                _, t = get(port, "/metrics")
                for k in peak:
                    m = re.search(r"^kvpc_sequences_%s (\S+)$" % k, t, re.M)
                    peak[k] = max(peak[k], float(m.group(1)) if m else 1e9)
                time.sleep(0.01)
        w = threading.Thread(target=watch)
        w.start()
        t0 = time.time()
        with cf.ThreadPoolExecutor(N_CLIENTS) as ex:
            res = list(ex.map(one, range(N_CLIENTS)))
        dt = time.time() - t0
        done.set()
        w.join()
        codes = [c for c, _ in res]
        texts = {a["choices"][0]["text"] for c, a in res if c == 200}
        check(all(c in (200, 503) for c in codes) and codes.count(200) >= 16 and texts == {solo},
              "%d concurrent clients: %d x 200, %d x 503 in %.1f s, outputs %s" %
              (N_CLIENTS, codes.count(200), codes.count(503), dt, texts))
        check(peak["active"] <= 16 and peak["queued"] <= 64 and peak["active"] >= 2 and dt < 90,
              "%d concurrent clients stay bounded: at most %d active (--max-seqs 16), %d queued "
              "(--queue 64), %.1f s (< 90)" % (N_CLIENTS, peak["active"], peak["queued"], dt))
        check(metric(port, "kvpc_pool_bytes_in_use") == 0, "every block is back in the pool")
        st, t = get(port, "/metrics")
        names = ["kvpc_pool_bytes_total", "kvpc_pool_blocks_in_use", "kvpc_kv_entries_in_use",
                 "kvpc_sequences_queued", "kvpc_requests_total{endpoint=\"/v1/completions\",status=\"400\"}",
                 "kvpc_compress_events_total{policy=\"h2o\"}", "kvpc_entries_evicted_total",
                 "kvpc_step_seconds_bucket", "kvpc_tokens_per_second", "kvpc_prompt_tokens_total"]
        check(st == 200 and all(n in t for n in names), "/metrics has the kvpc_ families")
        st, t = get(port, "/health")
        check(st == 200 and '"ok"' in t, "/health")
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = None
    check(rc == 0, "SIGTERM drains and exits 0 (rc %s)" % rc)
    queue_full(trace + ".small", prompt, ref_full)
    prefill_fallback(trace + ".small", story, None if QUICK else ref_chunked)
    if n_shared_prompt > 0:
        shared_admission(trace + ".small", n_shared_prompt, P_shared)
    os.unlink(trace + ".small")
    lines = [json.loads(l) for l in open(trace)]
    check(len(lines) > 10 and all(k in lines[0] for k in ("id", "policy", "params", "prompt_tokens",
          "generated_tokens", "kv_entries_peak", "kv_bytes_peak", "compress_events",
          "entries_evicted", "eviction_rate", "ttft_s", "total_s")), "--trace writes one JSON line per request")
    ttft = {l["id"]: l["ttft_s"] for l in lines}
    for kv, ids in order_ids:
        ta, tb = (ttft.get(i) for i in ids)
        check(ta is not None and tb is not None and ta < 0.75 * (tb + 0.05),
              "two long prompts (%s): the first one's first token %s s after its arrival, the "
              "second's %s s after its own, 0.05 s later (arrival order)" % (kv, ta, tb))
    gone = [l for l in lines if l.get("finish_reason") == "cancelled"]
    if len(gone) != 2:  # the disconnects are the last two (the 64 clients after them wait whole)
        print("NOTE more cancelled requests than the two disconnects: %s" %
              [(l["id"], l["status"], l["prompt_tokens"], l["generated_tokens"]) for l in gone])
    check(len(gone) >= 2 and gone[-2]["generated_tokens"] >= 5 and gone[-2]["status"] == 200
          and gone[-1]["status"] == 499,
          "each disconnect is a trace line, finish_reason cancelled, with its tokens: %s" %
          [(l["status"], l["generated_tokens"]) for l in gone[-2:]])
    check(any(any("protected span exceeded" in n for n in l.get("budget_notes", [])) for l in lines),
          "the span over the budget (h2o_pinned x4) is in the trace too")
    late = [l for l in lines if l.get("status") == 400]
    check(late and all(l["finish_reason"] == "error" for l in late),
          "a 400 raised after admission is traced with finish_reason error, not stop: %s" %
          [l["finish_reason"] for l in late])
    os.unlink(trace)
    for th in DRAINS:  # the servers have exited: their last words are in the pipes
        th.join(timeout=10)
    check(not SAN_LINES, "no sanitizer report from the servers" +
          ("".join("\n    " + l for l in SAN_LINES[:40]) if SAN_LINES else ""))
    print("serve tests: %d failed, %.1f s" % (len(FAILS), time.time() - t_start))
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
