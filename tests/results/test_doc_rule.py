"""test_doc_rule: a narrowed `make results` run never writes docs/results.md or its plots.

The rule (scripts/results/cells.py doc_refusal): only the full run, no knob set, writes into
the tree; a narrowed run (RESULTS_QUICK, a filtered POLICIES list, any other knob) writes
OUT/docs/results.md, and a RESULTS_DOC inside the tree is refused before anything is
measured. Checked here without measuring anything: the tracked document and plots are
compared byte for byte before and after
  1. render.py and frontier.py called by hand (RESULTS_NARROWED unset, and 1) on docs/results.md;
  2. results.sh with RESULTS_QUICK=1 and RESULTS_DOC=docs/results.md (status 2, no build);
  3. results.sh with POLICIES=h2o, FRONTIER=0, RESULTS_RENDER_ONLY=1 (a filtered list, nothing
     measured): status 0 and its document under OUT/docs, marked a narrowed run;
and the rule's other side: RESULTS_NARROWED=0 (the full run) may write docs/results.md, and
a narrowed run may write under the ignored build folder.

Usage: test_doc_rule.py BUILD_DIR MODEL (from the repository root). Takes seconds: one kvpc
build of one policy.
"""
import glob
import hashlib
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "results"))
import cells  # noqa: E402

failures = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        failures.append(what)


def tracked():
    """sha256 of docs/results.md and every docs/results/* file, by path"""
    out = {}
    for p in [os.path.join(ROOT, "docs", "results.md")] + sorted(
            glob.glob(os.path.join(ROOT, "docs", "results", "*"))):
        with open(p, "rb") as f:
            out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def run(cmd, env_add, env_drop=()):
    env = {k: v for k, v in os.environ.items()
           if k not in env_drop and not k.startswith(("RESULTS_", "FRONTIER"))
           and k not in ("RATIOS", "POLICIES", "TEXTS", "LENGTHS", "DEPTHS", "NEEDLE_POLICIES",
                         "NEEDLE_RATIOS", "OUT", "THREADS")}
    env.update(env_add)
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def main():
    if len(sys.argv) != 3:
        print("usage: test_doc_rule.py BUILD_DIR MODEL", file=sys.stderr)
        return 2
    bdir, model = sys.argv[1], sys.argv[2]
    doc = os.path.join("docs", "results.md")
    before = tracked()
    render = os.path.join("scripts", "results", "render.py")
    frontier = os.path.join("scripts", "results", "frontier.py")
    with tempfile.TemporaryDirectory() as tmp:
        # 1. the renderers by hand: narrowed unless told otherwise
        r_args = [sys.executable, render, tmp, doc, "4096", "2 4", "coreutils", "h2o", "", "",
                  "L1.D0", "1", "c", model, "0", "0", "cmd", "env", "", ""]
        for narrowed in (None, "1"):
            env = {"RESULTS_SVGDIR": os.path.join("docs", "results"), "RESULTS_FAST": "0"}
            if narrowed:
                env["RESULTS_NARROWED"] = narrowed
            r = run(r_args, env)
            check(r.returncode == 2 and "narrowed run writes no generated file" in r.stderr,
                  "render.py refuses docs/results.md (RESULTS_NARROWED=%s): %s"
                  % (narrowed, r.stderr.strip()))
            r = run([sys.executable, frontier, tmp, doc, os.path.join("docs", "results"), "4096",
                     "coreutils", "L1.D0", "h2o", "", "stream", "2", "32"], env)
            check(r.returncode == 2 and "narrowed run writes no generated file" in r.stderr,
                  "frontier.py refuses docs/results.md (RESULTS_NARROWED=%s)" % narrowed)
        # 2. RESULTS_QUICK pointed at the tracked document: refused before the build
        r = run(["scripts/results/results.sh", "--quiet", bdir, model],
                {"RESULTS_QUICK": "1", "RESULTS_DOC": doc, "OUT": tmp})
        check(r.returncode == 2 and "narrowed run writes no generated file" in r.stderr
              and not os.path.exists(os.path.join(tmp, "bin")),
              "results.sh RESULTS_QUICK=1 RESULTS_DOC=docs/results.md: status 2, nothing built")
        # 3. a filtered policy list, rendering only: the document goes under OUT
        out = os.path.join(tmp, "out")
        r = run(["scripts/results/results.sh", "--quiet", bdir, model],
                {"POLICIES": "h2o", "FRONTIER": "0", "RESULTS_RENDER_ONLY": "1", "OUT": out})
        odoc = os.path.join(out, "docs", "results.md")
        text = open(odoc).read() if os.path.exists(odoc) else ""
        check(r.returncode == 0 and "**a narrowed run**" in text,
              "results.sh POLICIES=h2o: status %d, document at OUT/docs/results.md marked narrowed%s"
              % (r.returncode, "" if r.returncode == 0 else ": " + r.stderr.strip()[-400:]))
    check(tracked() == before, "docs/results.md and docs/results/* unchanged")
    # the other side of the rule
    os.environ["RESULTS_NARROWED"] = "0"
    check(cells.doc_refusal(os.path.join(ROOT, doc)) is None, "the full run may write docs/results.md")
    os.environ["RESULTS_NARROWED"] = "1"
    check(cells.doc_refusal(os.path.join(ROOT, "build", "results", "docs", "results.md")) is None,
          "a narrowed run may write under the ignored build folder")
    check(cells.doc_refusal(os.path.join(ROOT, "docs", "other.md")) is not None,
          "a narrowed run may not write docs/other.md")
    if failures:
        print("test_doc_rule: %d failure(s)" % len(failures))
        return 1
    print("test_doc_rule: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
