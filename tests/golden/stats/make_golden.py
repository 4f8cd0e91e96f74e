#!/usr/bin/env python3
"""Reference values for tests/test_stats.c (runtime/eval/rt_stats.c), computed independently
with numpy and a pure-Python re-implementation of the PRNG and the bootstrap.

Writes tests/golden/stats/golden.txt, one record per line (space separated, floats as
Python repr, i.e. round-trip exact):
  vec NAME N v0 .. v{N-1}                      a named sample
  pct NAME F EXPECTED                          numpy.percentile(v, 100*F) (method "linear")
  median NAME EXPECTED                         numpy.median(v)
  kl V T KLD NLL_P NLL_Q TOP_P TOP_Q p0..p{V-1} q0..q{V-1}
                                               one token: float32 logits, float64 numpy refs
  sum NT V KLD_MEAN KLD_MEDIAN KLD_P99 KLD_MAX PPL_RATIO SAME_TOP1 RMS_DP
  row T p0..p{V-1} q0..q{V-1}                  the NT rows of the preceding `sum`
  rng SEED N x0 .. x{N-1}                      first N xoshiro256** outputs
  below SEED BOUND N x0 .. x{N-1}              first N rt_rng_below(BOUND) draws
  boot NAME B L LEVEL SEED MEAN LO HI          paired (block) bootstrap of vec NAME
  pwblock NAME L_ROUNDED L_REAL M_HAT M        Politis-White block length of vec NAME

d_real.txt (input, committed): 1023 real per-token NLL differences, SmolLM2-135M-Instruct
Q4_1 on coreutils.info (from "Node: Introduction"), sinks(4)+recent vs recent-only eviction
at budget 128 (8x), chunk 16 -- autocorrelated data for the block-length rule.

Run from the repository root:  python3 tests/golden/stats/make_golden.py
"""
import math
import os
import numpy as np

M64 = (1 << 64) - 1
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.txt")


# ---- PRNG: splitmix64-seeded xoshiro256** (same algorithm as rt_stats.c) ----------------
class Rng:
    def __init__(self, seed):
        x = seed & M64
        self.s = []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    @staticmethod
    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & M64

    def next(self):
        s = self.s
        result = (self.rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self.rotl(s[3], 45)
        return result

    def below(self, n):
        threshold = (1 << 64) % n
        while True:
            x = self.next()
            if x >= threshold:
                return x % n


def percentile_sorted(v, f):
    # Same formula as llama.cpp perplexity.cpp and numpy "linear", written out so that the
    # floating-point operations are those of the C code.
    n = len(v)
    if f <= 0:
        return v[0]
    if f >= 1:
        return v[-1]
    p = f * (n - 1)
    i = int(p)
    w = p - i
    j = min(i + 1, n - 1)
    return (1.0 - w) * v[i] + w * v[j]


def bootstrap(d, B, L, level, seed):
    n = len(d)
    d = [float(x) for x in d]
    d0 = d[0]
    s = 0.0
    for x in d:
        s += x - d0
    mean = d0 + s / n
    rng = Rng(seed)
    L = min(L, n)
    k = (n + L - 1) // L
    m = []
    for _ in range(B):
        acc = 0.0
        taken = 0
        for _ in range(k):
            start = rng.below(n)
            t = 0
            while t < L and taken < n:
                idx = start + t
                if idx >= n:
                    idx -= n
                acc += d[idx] - d0
                t += 1
                taken += 1
        m.append(d0 + acc / n)
    m.sort()
    alpha = (1.0 - level) / 2.0
    return mean, percentile_sorted(m, alpha), percentile_sorted(m, 1.0 - alpha)


def pw_block(x):
    """Politis & White (2004) / Patton, Politis & White (2009) circular-block length."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < 8:
        return 1.0, 0, 0
    e = x - x.mean()
    K = max(5, int(math.floor(math.sqrt(math.log10(n)))))
    m_max = min(int(math.ceil(math.sqrt(n))) + K, n - 1)
    acv = np.array([float(np.dot(e[k:], e[:n - k])) / n for k in range(m_max + 1)])
    if not acv[0] > 0:
        return 1.0, 0, 0
    thr = 2.0 * math.sqrt(math.log10(n) / n)
    m_hat = max(m_max - K, 0)
    for m in range(0, m_max - K + 1):
        if all(abs(acv[m + k] / acv[0]) < thr for k in range(1, K + 1)):
            m_hat = m
            break
    M = min(2 * max(m_hat, 1), m_max)
    g, G = acv[0], 0.0
    for k in range(1, M + 1):
        t = k / M
        lam = 1.0 if t <= 0.5 else 2.0 * (1.0 - t)
        g += 2 * lam * acv[k]
        G += 2 * lam * k * acv[k]
    D = 4.0 / 3.0 * g * g
    if not D > 0:
        return 1.0, m_hat, M
    b = (2 * G * G / D) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    bmax = math.ceil(min(3 * math.sqrt(n), n / 3))
    return min(max(b, 1.0), bmax), m_hat, M


def log_softmax(x):
    x = x.astype(np.float64)
    mx = x.max()
    return x - mx - np.log(np.exp(x - mx).sum())


def tok_cmp(p, q, t):
    lp, lq = log_softmax(p), log_softmax(q)
    kld = float(np.sum(np.exp(lp) * (lp - lq)))
    return max(kld, 0.0), float(-lp[t]), float(-lq[t]), int(np.argmax(p)), int(np.argmax(q))


def r(x):
    return repr(float(x))


def main():
    rs = np.random.default_rng(20261129)
    lines = []

    # Percentiles / medians vs numpy.
    vecs = {
        "one": np.array([3.5]),
        "two": np.array([1.0, 2.0]),
        "five": np.array([0.3, -1.0, 7.25, 2.0, 2.0]),
        "ties": np.array([1.0, 1.0, 1.0, 2.0, 2.0, 5.0]),
        "u1000": rs.random(1000),
        "exp777": rs.exponential(0.05, 777),
    }
    for name, v in vecs.items():
        lines.append("vec %s %d %s" % (name, len(v), " ".join(r(x) for x in v)))
        for f in (0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0):
            lines.append("pct %s %s %s" % (name, r(f), r(np.percentile(v, 100 * f))))
        lines.append("median %s %s" % (name, r(np.median(v))))

    # Single-token KL cases (float32 logits), including large magnitudes and ties.
    cases = []
    for V in (2, 5, 17, 300):
        for _ in range(3):
            p = (rs.normal(0, 3, V)).astype(np.float32)
            q = (p + rs.normal(0, 1, V)).astype(np.float32)
            cases.append((p, q, int(rs.integers(V))))
    big = np.array([1000.0, 999.0, -1000.0, 998.5], dtype=np.float32)
    cases.append((big, (big - 2000).astype(np.float32), 1))
    cases.append((big, np.array([999.0, 1000.0, -1000.0, 998.5], np.float32), 2))
    tie = np.array([2.0, 5.0, 5.0, 1.0], dtype=np.float32)
    cases.append((tie, tie[::-1].copy(), 0))
    for p, q, t in cases:
        kld, np_, nq, tp, tq = tok_cmp(p, q, t)
        lines.append("kl %d %d %s %s %s %d %d %s %s" % (
            len(p), t, r(kld), r(np_), r(nq), tp, tq,
            " ".join(r(x) for x in p), " ".join(r(x) for x in q)))

    # Run summary over 250 tokens of V=11.
    NT, V = 250, 11
    rows, klds, nps, nqs, same, dps = [], [], [], [], [], []
    for i in range(NT):
        p = rs.normal(0, 2, V).astype(np.float32)
        q = (p + rs.normal(0, 0.3 if i % 3 else 1.5, V)).astype(np.float32)
        t = int(rs.integers(V))
        kld, np_, nq, tp, tq = tok_cmp(p, q, t)
        rows.append((t, p, q))
        klds.append(kld); nps.append(np_); nqs.append(nq)
        same.append(tp == tq)
        dps.append(np.exp(-nq) - np.exp(-np_))
    klds = np.array(klds)
    lines.append("sum %d %d %s %s %s %s %s %s %s" % (
        NT, V, r(klds.mean()), r(np.median(klds)), r(np.percentile(klds, 99)), r(klds.max()),
        r(np.exp(np.mean(nqs) - np.mean(nps))), r(np.mean(same)),
        r(np.sqrt(np.mean(np.square(dps))))))
    for t, p, q in rows:
        lines.append("row %d %s %s" % (t, " ".join(r(x) for x in p), " ".join(r(x) for x in q)))

    # PRNG streams.
    for seed in (0, 1, 0xDEADBEEF, 0x6B7670632D616221):
        g = Rng(seed)
        lines.append("rng %d 8 %s" % (seed, " ".join(str(g.next()) for _ in range(8))))
    for seed, bound in ((7, 1), (7, 10), (42, 1000), (42, (1 << 63) + 12345)):
        g = Rng(seed)
        lines.append("below %d %d 8 %s" % (seed, bound, " ".join(str(g.below(bound)) for _ in range(8))))

    # Bootstrap samples: iid noise with a shift, an AR(1) series, a small sample.
    ar = np.zeros(600)
    e = rs.normal(0, 1, 600)
    for i in range(1, 600):
        ar[i] = 0.8 * ar[i - 1] + e[i]
    samples = {
        "d_iid": rs.normal(0.05, 1.0, 400),
        "d_ar1": ar * 0.1 + 0.02,
        "d_small": np.array([0.5, -0.25, 1.0, 0.125, 0.75, -0.5, 0.0]),
    }
    for name, v in samples.items():
        lines.append("vec %s %d %s" % (name, len(v), " ".join(r(x) for x in v)))
    for name, B, L, level, seed in (("d_iid", 1000, 1, 0.95, 0x6B7670632D616221),
                                    ("d_iid", 500, 1, 0.9, 12345),
                                    ("d_ar1", 1000, 1, 0.95, 99),
                                    ("d_ar1", 1000, 32, 0.95, 99),
                                    ("d_ar1", 200, 1000, 0.95, 5),
                                    ("d_small", 2000, 3, 0.8, 1)):
        mean, lo, hi = bootstrap(samples[name], B, L, level, seed)
        lines.append("boot %s %d %d %s %d %s %s %s" % (name, B, L, r(level), seed, r(mean), r(lo), r(hi)))

    # Politis-White block length (same rule as rt_bootstrap_block_len_auto).
    real_d = os.path.join(os.path.dirname(OUT), "d_real.txt")
    pw_samples = dict(samples)
    if os.path.exists(real_d):
        pw_samples["d_real"] = np.loadtxt(real_d)
        lines.append("vec d_real %d %s" % (len(pw_samples["d_real"]),
                                            " ".join(r(x) for x in pw_samples["d_real"])))
    for name, v in pw_samples.items():
        b, m_hat, M = pw_block(v)
        lines.append("pwblock %s %d %s %d %d" % (name, int(round(b)), r(b), m_hat, M))

    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", OUT, len(lines), "lines")


if __name__ == "__main__":
    main()
