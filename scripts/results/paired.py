#!/usr/bin/env python3
"""Paired retrieval counts of needle runs against the full cache, over several seeds.

    scripts/results/paired.py [--ref RUN] [--seed S] FILE... [--seed S FILE...]
    scripts/results/paired.py --self-test

Each FILE holds `BIN needle --json` objects (a --batch pass writes one per line; a cell of
`make results` holds one). Prompts are paired by (seed, length, depth): the reference is the
full cache's run (policy "full") on the same prompt, from any FILE. An object written
before needle recorded "seed" takes the seed of the last --seed before its FILE, else 1,
needle's default (make results passes none). The
reference of a prompt is the full cache's answer in the run's mode (aware or agnostic) when
the inputs have it, else in the other mode (the full cache compresses nothing; only its
chunking differs), and the table says which modes it used.

--ref RUN pairs every run with another run instead of the full cache (RUN as the table
names it, e.g. "mikv_rot_q4q2_75": is one policy's difference from another a finding?).

For each run (policy with its --ratio / --byte-ratio) it prints the prompts, the correct
answers, the full cache's on the same prompts, the prompts the full cache answers and the
run does not (lost), the reverse (gained), and the two-sided exact sign test on the
discordant prompts (McNemar's exact test, as `ab --task needle` reports it:
runtime/eval/rt_ab.c sign_test_p): p = min(1, 2 P(X <= min(lost, gained))), X ~ Bin(lost +
gained, 1/2). A small p says the run and the full cache differ on these prompts; a large p
says the prompts cannot tell them apart, not that they are equal. Markdown on stdout;
exit 1 with "paired.py: FILE: reason" on unreadable input or a run without its reference.
"""
import json
import math
import sys


def sign_test_p(k, n):
    """Two-sided exact sign test of k successes in n fair flips; 1 for n = 0."""
    if n == 0:
        return 1.0
    m = min(k, n - k)
    p = sum(math.comb(n, i) for i in range(m + 1)) / 2.0 ** n
    return min(1.0, 2 * p)


def discordant(run, ref):
    """(lost, gained) of a run's answers against a reference's, both {prompt: correct} with
    every prompt of run in ref: the prompts the reference answers and the run misses, and
    the reverse (the pairing of both the table and a cell's "(-L/+G)")."""
    lost = sum(1 for k, c in run.items() if ref[k] and not c)
    gained = sum(1 for k, c in run.items() if c and not ref[k])
    return lost, gained


def against_full(run, ref):
    """" (-L/+G)" for a needle cell against the full cache's cell of the same prompts
    (paired by length and depth; both make results cells, one seed): L prompts the full
    cache answers and the run misses, G the reverse; "" when they agree on every prompt or
    either cell lacks per-prompt results (render.py and frontier.py print it after the
    count, so "11/15 (-2/+0)" reads "two of the full cache's hits lost, none gained")."""
    try:
        ok = [{(r["length"], r["depth"]): bool(r["correct"]) for r in d["results"]}
              for d in (run, ref)]
        lost, gained = discordant(ok[0], ok[1])
    except (KeyError, TypeError):
        return ""
    return " (-%d/+%d)" % (lost, gained) if lost or gained else ""


def label(d):
    """A run's name: its policy and the budget it was given."""
    if d.get("byte_ratio") is not None:
        return "%s --byte-ratio %g" % (d["policy"], d["byte_ratio"])
    if d.get("ratio") is not None:
        return "%s --ratio %g" % (d["policy"], d["ratio"])
    return d["policy"]


def load(paths):
    """{(label, mode, variant): {(seed, length, depth): correct}} over every object of every
    file, variant the task, KV store type and parameters (runs that differ only there are
    kept apart); paths: (path, the seed of an object that records none) pairs. A prompt
    given twice for one run is an error (two inputs measured the same thing)."""
    runs = {}
    for path, dseed in paths:
        try:
            text = open(path).read()
        except OSError as e:
            sys.exit("paired.py: %s: %s" % (path, e.strerror))
        for no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                seed = d.get("seed", dseed)
                res = {(seed, r["length"], r["depth"]): bool(r["correct"]) for r in d["results"]}
            except (ValueError, KeyError, TypeError) as e:
                sys.exit("paired.py: %s:%d: not a needle --json object (%s)" % (path, no, e))
            variant = "%s %s %s" % (d.get("task", "passkey"), d.get("kv_type", ""),
                                    json.dumps(d.get("params", {}), sort_keys=True))
            r = runs.setdefault((label(d), d.get("mode", "aware"), variant), {})
            twice = [k for k in res if k in r]
            if twice:
                sys.exit("paired.py: %s:%d: %s (%s) has prompt seed %s, length %s, depth %s "
                         "already (give each seed once, --seed S for files that lack it)" %
                         ((path, no, label(d), variant) + twice[0]))
            r.update(res)
    return runs


def table(runs, ref_name="full"):
    """The markdown lines: one row per run and mode, the full cache's first; a run's
    reference is the full cache's run of its task in its mode, else in the other mode."""
    task = lambda v: v.split(" ")[0]  # noqa: E731
    refs = {(mode, task(v)): r for (name, mode, v), r in runs.items() if name == ref_name}
    if not refs:
        sys.exit("paired.py: no run %s among the inputs (the reference)" % ref_name)
    shown = {}
    for name, mode, v in runs:
        shown[(name, mode)] = shown.get((name, mode), 0) + 1
    seeds = sorted({k[0] for r in runs.values() for k in r})
    out = ["| run | mode | prompts | correct | %s (its mode), same prompts | lost | "
           "gained | sign test p |" % ("full cache" if ref_name == "full" else ref_name),
           "|---|---|---|---|---|---|---|---|"]
    for name, mode, v in sorted(runs, key=lambda k: (k[0] != ref_name, k[0] != "full", k)):
        r = runs[(name, mode, v)]
        same = [m for (m, t) in refs if t == task(v)]
        if not same:
            sys.exit("paired.py: %s: no %s run of task %s" % (name, ref_name, task(v)))
        # per prompt: the reference's answer in the run's mode, else in the other mode
        ref, used = {}, set()
        for m in sorted(same, key=lambda m: m == mode):
            ref.update(refs[(m, task(v))])
        for k in r:
            if k in ref:
                used.add(mode if k in refs.get((mode, task(v)), {}) else
                         next(m for m in same if k in refs[(m, task(v))]))
        rmode = "+".join(sorted(used)) or mode
        if shown[(name, mode)] > 1 or task(v) != "passkey":
            name = "%s (%s)" % (name, v)
        missing = [k for k in r if k not in ref]
        if missing:
            sys.exit("paired.py: %s: prompt seed %s, length %s, depth %s has no %s run" %
                     ((name,) + missing[0] + (ref_name,)))
        lost, gained = discordant(r, ref)
        out.append("| %s | %s | %d | %d | %d (%s) | %d | %d | %.3g |" % (
            name, mode, len(r), sum(r.values()), sum(ref[k] for k in r), rmode, lost, gained,
            sign_test_p(lost, lost + gained)))
    out.append("")
    out.append("Seeds %s; prompts paired by (seed, length, depth)." %
               ", ".join(str(s) for s in seeds))
    return out


def self_test():
    # hand-computed: P(X <= 0) for n = 5 is 1/32, two-sided 1/16; n = 2, k = 0: 2 * 1/4
    assert sign_test_p(0, 5) == 0.0625
    assert sign_test_p(0, 2) == 0.5
    assert sign_test_p(1, 2) == 1.0 and sign_test_p(0, 0) == 1.0
    # n = 10, k = 1: 2 * (1 + 10) / 1024
    assert abs(sign_test_p(1, 10) - 22 / 1024) < 1e-15
    assert sign_test_p(9, 10) == sign_test_p(1, 10)
    # two prompts of seed 1, the run loses one: lost 1, gained 0, p = 1
    v = "passkey f16 {}"
    runs = {("full", "aware", v): {(1, 1024, 0): True, (1, 1024, 50): True},
            ("h2o --ratio 8", "aware", v): {(1, 1024, 0): True, (1, 1024, 50): False},
            ("kvzip --ratio 8", "agnostic", v): {(1, 1024, 0): False, (1, 1024, 50): False}}
    rows = table(runs)
    assert rows[3] == "| h2o --ratio 8 | aware | 2 | 1 | 2 (aware) | 1 | 0 | 1 |", rows[3]
    assert rows[4] == "| kvzip --ratio 8 | agnostic | 2 | 0 | 2 (aware) | 2 | 0 | 0.5 |", rows[4]
    # against another run: h2o as the reference, kvzip loses the one h2o answers
    rows = table(runs, "h2o --ratio 8")
    assert rows[4] == "| kvzip --ratio 8 | agnostic | 2 | 0 | 1 (aware) | 1 | 0 | 1 |", rows
    assert label({"policy": "kvzip", "ratio": None, "byte_ratio": 8}) == "kvzip --byte-ratio 8"
    full = {"results": [{"length": 1024, "depth": d, "correct": c}
                        for d, c in ((0, True), (50, True), (100, False))]}
    run = {"results": [{"length": 1024, "depth": d, "correct": c}
                       for d, c in ((0, False), (50, True), (100, True))]}
    assert against_full(run, full) == " (-1/+1)"
    assert against_full(full, full) == "" and against_full({"error": "x"}, full) == ""
    print("paired.py: self-test passed")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    paths, dseed, ref = [], 1, "full"
    it = iter(argv)
    for a in it:
        if a == "--seed":
            try:
                dseed = int(next(it))
            except (StopIteration, ValueError):
                sys.exit("paired.py: --seed needs a whole number")
        elif a == "--ref":
            ref = next(it, None)
            if not ref:
                sys.exit("paired.py: --ref needs a run's name")
        else:
            paths.append((a, dseed))
    print("\n".join(table(load(paths), ref)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
