#!/usr/bin/env python3
"""Check that every repository path the docs and the source comments cite exists in the tree.

Scans README.md and docs/*.md, and the comments of compiler/, runtime/, kernels/, grammar/,
tests/ (C, CUDA), scripts/ and the Makefile (or the files given), for paths that start with
a top-level folder of the repository (runtime/, compiler/, tests/, ...), that climb out of
it (../), or that stand alone in a code span as a relative file path with a file name, and
fails, listing FILE:LINE: PATH, for each one that matches no file or folder. Globs
(`tests/test_*.c`), brace lists (`grammar/kvp.{l,y}`) and upper-case placeholders
(`runtime/LAYER/rt_*.c`) are expanded. Paths under build outputs (build/, build-asan/,
build-fuzz/, models/, the tests' scratch folder tests/tmp), absolute system paths and a path
written after another repository's name (`ggml-org/ggml docs/gguf.md`) are not checked. The
tree stands alone, so a document that is not in it (the design notes and reviews kept beside
the repository, a machine's work folder) may not be cited at all, whether or not a file of
that name exists.
Comments are: C/CUDA/flex/bison /* */ and // text (string literals skipped); `#` lines of
shell, Python and make files, and Python docstrings. Run by `make check`.
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
# a code span that is a relative path with a file name: checked too, whatever its first
# folder
CODE_RE = re.compile(r"`([\w.-]+(?:/[\w.*{},-]+)+\.[\w{},]+)`")
SKIP = ("build/", "build-asan/", "build-fuzz/", "models/", "tests/tmp")
# "owner/repo " right before a path: the path is in that repository, not in this one
OTHER_REPO_RE = re.compile(r"(?<![\w/.-])([\w-]+)/[\w-]+\s+$")
# documents outside the tree, refused by name (written as patterns so this file passes)
DENY_RE = re.compile(r"\b(DESIGN\.md|aesthetics\.md|code_review\.md|field_2026\.md"
                     r"|algorithms\.md|engines\.md|peers\.md|model_and_data\.md"
                     r"|kv_quantisation\.md)\b"
                     r"|\.\./shared\b|(?<![\w./-])shared/research\b|(?<![\w.])/work/")
C_EXT = (".c", ".h", ".cu", ".cuh", ".l", ".y", ".def")
HASH_EXT = (".sh", ".py", ".mk")


def c_comments(text):
    """The text with everything outside /* */ and // comments blanked (newlines kept, so
    line numbers stay); string and character literals are skipped."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(text[i:j])
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(text[i:j])
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        else:
            out.append(c if c == "\n" else " ")
            i += 1
    return "".join(out)


def hash_comments(text, python):
    """`#` comments (and, for Python, triple-quoted strings), other text blanked."""
    keep = []
    in_doc = False
    for line in text.split("\n"):
        s = line.strip()
        if python and (in_doc or s.startswith(('"""', "r\"\"\"", "'\''\''"))):
            keep.append(line)
            quotes = line.count('"""') + line.count("\'\'\'")
            if quotes % 2 == 1:
                in_doc = not in_doc
            continue
        k = line.find("#")
        keep.append(line[k:] if k >= 0 else "")
    return "\n".join(keep)


def comment_text(path):
    """The lines of a file to check: a document whole, a source file's comments only."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    base = os.path.basename(path)
    if path.endswith(C_EXT):
        text = c_comments(text)
    elif path.endswith(HASH_EXT) or base == "Makefile":
        text = hash_comments(text, path.endswith(".py"))
    return text.split("\n")


def sources():
    """The source files whose comments are checked."""
    out = [os.path.join(ROOT, "Makefile")]
    for d in ("compiler", "runtime", "kernels", "grammar", "scripts"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, d)):
            out += [os.path.join(dirpath, x) for x in names if x.endswith(C_EXT + HASH_EXT)]
    for pat in ("tests/*.c", "tests/support/*.[ch]", "tests/cuda/*.cu"):
        out += glob.glob(os.path.join(ROOT, pat))
    return sorted(out)


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
    path = re.sub(r"(?<=/)[A-Z][A-Z_]*(?=/|$|\.)", "*", path)  # LAYER, NAME placeholders
    for p in expand_braces(path):
        if glob.glob(os.path.join(ROOT, p)):
            continue
        return False
    return True


def other_repo(before, prev):
    """Whether the text before a path (the previous line's too when the path opens its
    line) ends in another repository's owner/name."""
    if not before.strip(" */#"):
        before = prev.rstrip() + " "
    m = OTHER_REPO_RE.search(before)
    return bool(m) and m.group(1) not in TOP


def main(files):
    bad = 0
    for f in files:
        prev = ""
        for n, line in enumerate(comment_text(f), 1):
            for m in DENY_RE.finditer(line):
                print("%s:%d: cites '%s', which is outside the tree" %
                      (os.path.relpath(f, ROOT), n, m.group(0)))
                bad += 1
            found = [m.group(1) for m in PATH_RE.finditer(line)
                     if not m.group(1).startswith(SKIP)
                     and not other_repo(line[:m.start()], prev)]
            found += [m.group(1) for m in CODE_RE.finditer(line)
                      if not m.group(1).startswith(SKIP) and m.group(1) not in found]
            for path in (p.rstrip(".,;:") for p in found):
                if path.startswith("../") or not exists(path):
                    print("%s:%d: cites '%s', which is not in the tree" %
                          (os.path.relpath(f, ROOT), n, path))
                    bad += 1
            prev = line
    if bad:
        print("check_doc_paths: %d citation(s) of missing files" % bad)
        return 1
    print("docs and comments: every cited path exists (%d files checked)" % len(files))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:] or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "*.md"))) + sources()
    sys.exit(main(args))
