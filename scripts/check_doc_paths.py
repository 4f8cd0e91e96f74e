#!/usr/bin/env python3
"""Check that every repository path the docs cite exists in the tree.

Scans README.md and docs/*.md (or the files given) for paths that start with a top-level
folder of the repository (runtime/, compiler/, tests/, ...), that climb out of it (../),
or that stand alone in a code span as a relative file path (`notes/x.md`), and fails, listing FILE:LINE: PATH, for each one that matches no file or folder.
Globs (`tests/test_*.c`), brace lists (`grammar/kvp.{l,y}`) and upper-case placeholders
(`runtime/LAYER/rt_*.c`) are expanded. Paths under build outputs (build/, build-asan/,
build-fuzz/, models/) and absolute system paths are not checked. Run by `make check`.
"""
import glob
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOP = sorted(d for d in os.listdir(ROOT)
             if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith(".")
             and d not in ("build", "build-asan", "build-fuzz", "models"))
# a path: not glued to a longer path or word on its left, a top folder or ../, then
# path characters (braces and * included)
PATH_RE = re.compile(r"(?<![\w/.~$-])((?:\.\./)+[\w.-][\w./*{},-]*|(?:%s)/[\w./*{},-]*)"
                     % "|".join(re.escape(d) for d in TOP))
# a code span that is a relative path with a file name (`shared/notes/x.md`): checked too,
# whatever its first folder
CODE_RE = re.compile(r"`([\w.-]+(?:/[\w.*{},-]+)+\.[\w{},]+)`")
SKIP = ("build/", "build-asan/", "build-fuzz/", "models/")


def expand_braces(p):
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(p[:m.start()] + alt + p[m.end():])
    return out


def exists(path):
    path = path.rstrip(".,;:")
    path = re.sub(r"(?<=/)[A-Z][A-Z_]+(?=/|$|\.)", "*", path)  # LAYER, NAME placeholders
    for p in expand_braces(path):
        if glob.glob(os.path.join(ROOT, p)):
            continue
        return False
    return True


def main(files):
    bad = 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                found = [m.group(1) for m in PATH_RE.finditer(line)]
                found += [m.group(1) for m in CODE_RE.finditer(line)
                          if not m.group(1).startswith(SKIP) and m.group(1) not in found]
                for path in (p.rstrip(".,;:") for p in found):
                    if path.startswith("../") or not exists(path):
                        print("%s:%d: cites '%s', which is not in the tree" %
                              (os.path.relpath(f, ROOT), n, path))
                        bad += 1
    if bad:
        print("check_doc_paths: %d citation(s) of missing files" % bad)
        return 1
    print("docs: every cited path exists (%d files checked)" % len(files))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:] or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "*.md")))
    sys.exit(main(args))
