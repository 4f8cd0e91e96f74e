"""cells: the cell loader of `make results` (scripts/results/results.sh, render.py, frontier.py).

load(path) returns the JSON object one cached cell file holds, or None when the file is
missing, unreadable or not JSON (a cell not measured, or cut short by an interrupted run).
Undecodable bytes are replaced, not refused: a generated answer in a needle cell can end
inside a multi-byte character. Standard library only.
"""
import json


def load(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
