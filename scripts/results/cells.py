"""cells: the cell loader of `make results` (scripts/results/results.sh, render.py, frontier.py),
and the rule of where a run's document may go.

load(path) returns the JSON object one cached cell file holds, or None when the file is
missing, unreadable or not JSON (a cell not measured, or cut short by an interrupted run).
Undecodable bytes are replaced, not refused: a generated answer in a needle cell can end
inside a multi-byte character.

doc_refusal(doc) says why the run may not write its document at doc (None: it may). Only
the full run writes into the tree: results.sh sets RESULTS_NARROWED=0 when no knob narrows
it; any other run (RESULTS_NARROWED=1, or unset: render.py or frontier.py called by hand)
is narrowed and may write only outside the tree or under a path git ignores (the build
folder), so a narrowed run can never replace docs/results.md or its plots. results.sh
checks it before measuring (`cells.py --check-doc DOC`: the message on stderr, status 2),
render.py and frontier.py again before they write. Standard library only.
"""
import json
import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def doc_refusal(doc):
    if os.environ.get("RESULTS_NARROWED", "1") == "0":
        return None
    path, top = os.path.realpath(doc), os.path.realpath(TOP)
    if os.path.commonpath([path, top]) != top:
        return None
    ignored = subprocess.run(["git", "-C", top, "check-ignore", "-q", path],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    if ignored:
        return None
    return ("%s: a narrowed run writes no generated file into the tree (only the full run, "
            "no knob set, writes docs/results.md); leave RESULTS_DOC unset or point it "
            "outside the tree" % doc)


def doc_check(doc, who):
    """Exit with status 2 and the refusal on stderr when doc_refusal(doc) refuses."""
    why = doc_refusal(doc)
    if why:
        print("%s: %s" % (who, why), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--check-doc":
        print("usage: cells.py --check-doc DOC", file=sys.stderr)
        sys.exit(2)
    doc_check(sys.argv[2], "results.sh")
