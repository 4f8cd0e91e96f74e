#!/usr/bin/env python3
"""gpu_check_ppl.py CPU.json GPU.json: compare `ppl --batch RUNS --json` on --device cpu
with the same command on --device cuda (scripts/gpu_check.sh), run by run.

Both run the one engine (runtime/eval/rt_eval.h) on the exact path's f32 weights, so the
GPU's figures must follow the CPU's up to GEMM summation order: ppl and ppl_ref within
0.1% relative, kld_mean within 1e-4 + 5% of the CPU's, the same tokens, scored tokens and
compression at the end, and "device": "cuda" on every GPU line. Prints one line per run and
exits 1 when any differs (or a run failed on one device only).
"""
import json
import sys


def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    cpu, gpu = lines(sys.argv[1]), lines(sys.argv[2])
    if len(cpu) != len(gpu) or not cpu:
        print(f"gpu_check: ppl: {len(cpu)} CPU runs vs {len(gpu)} GPU runs")
        return 1
    bad = 0
    for c, g in zip(cpu, gpu):
        name = f"{c.get('policy')} ratio {c.get('ratio')} byte_ratio {c.get('byte_ratio')}"
        if "error" in c or "error" in g:
            ok = "error" in c and "error" in g
            print(f"{'ok  ' if ok else 'FAIL'} {name}: cpu {c.get('error')!r}, cuda {g.get('error')!r}")
            bad += not ok
            continue
        why = []
        if g.get("device") != "cuda":
            why.append(f"device {g.get('device')!r}")
        for k in ("tokens", "scored", "scored_compressed"):
            if c.get(k) != g.get(k):
                why.append(f"{k} {c.get(k)} vs {g.get(k)}")
        for k in ("ppl", "ppl_ref"):
            if k in c and abs(g[k] / c[k] - 1) > 1e-3:
                why.append(f"{k} {c[k]:.5f} vs {g[k]:.5f}")
        if "kld_mean" in c and abs(g["kld_mean"] - c["kld_mean"]) > 1e-4 + 0.05 * c["kld_mean"]:
            why.append(f"kld_mean {c['kld_mean']:.6f} vs {g['kld_mean']:.6f}")
        if abs(g.get("compression", 0) - c.get("compression", 0)) > 1e-6 * max(1, c.get("compression", 0)):
            why.append(f"compression {c.get('compression')} vs {g.get('compression')}")
        print(f"{'FAIL' if why else 'ok  '} {name}: ppl cpu {c['ppl']:.4f} cuda {g['ppl']:.4f}, "
              f"kld_mean cpu {c.get('kld_mean', 0):.6f} cuda {g.get('kld_mean', 0):.6f}, "
              f"tok/s cpu {c['tokens_per_s']:.0f} cuda {g['tokens_per_s']:.0f}"
              + (f" ({'; '.join(why)})" if why else ""))
        bad += bool(why)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
