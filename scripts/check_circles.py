#!/usr/bin/env python3
"""check_circles.py [--report] DIR...: refuse include circles between modules.

A module is a .c/.h pair (compiler/kvpc_build.c and .h are one module, kvpc_build). Module A
uses module B when a file of A includes B's header. A circle is a set of modules that use
each other round (A uses B and B uses A, or longer), which makes neither readable or
testable without the other (docs/architecture.md). Every file under the DIRs
(recursively: .c, .h, .cu, .cuh) is read; an include "X" is resolved next to the file,
then under runtime/, compiler/ and kernels/ (the build's -I paths); other headers (system,
generated) are not modules here. A header without a .c (a module's internal header, a
header-only kernel) is looked through: who includes it uses what it includes.

Prints each circle as "circle: A <-> B ..." (its modules, then the file and line of each
use among them) and exits
1 if there is one, else prints one line and exits 0. --report prints the same but always
exits 0 (for a tree where a circle is still being opened).
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ROOTS = ("runtime", "compiler", "kernels")
EXTS = (".c", ".h", ".cu", ".cuh")


def module_of(path):
    return os.path.splitext(os.path.normpath(path))[0]


def resolve(inc, here):
    for base in (here,) + ROOTS:
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(p):
            return p
    return None


def uses(dirs):
    """{module: {used module: (file, line)}} over the files under dirs, header-only
    modules looked through."""
    edges, sources = {}, set()
    for d in dirs:
        for root, _, files in os.walk(d):
            for name in sorted(files):
                if not name.endswith(EXTS):
                    continue
                path = os.path.join(root, name)
                a = module_of(path)
                edges.setdefault(a, {})
                if name.endswith((".c", ".cu")):
                    sources.add(a)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for ln, text in enumerate(f, 1):
                        m = INCLUDE.match(text)
                        p = m and resolve(m.group(1), root)
                        if p and p.endswith((".h", ".cuh")) and module_of(p) != a:
                            edges[a].setdefault(module_of(p), (path, ln))
    return look_through(edges, sources)


def look_through(edges, sources):
    """Replace every use of a header-only module (no .c/.cu) by the uses it makes."""
    inner = [m for m in edges if m not in sources]
    changed = True
    while changed:
        changed = False
        for a in edges:
            for h in [h for h in edges[a] if h in inner]:
                where = edges[a].pop(h)
                for b in edges.get(h, {}):
                    if b != a and b not in edges[a]:
                        edges[a][b] = where
                changed = True
    for h in inner:
        edges.pop(h, None)
    return edges


def circles(edges):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []
    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main(argv):
    report = "--report" in argv
    dirs = [a for a in argv if a != "--report"]
    if not dirs:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    edges = uses(dirs)
    found = circles(edges)
    for comp in found:
        print("circle: " + " <-> ".join(comp) + (" (report only)" if report else ""))
        for a in comp:
            for b in comp:
                if b in edges[a]:
                    f, ln = edges[a][b]
                    print(f"  {f}:{ln}: {a} uses {b}")
    if not found:
        print(f"circles: none among the modules of {' '.join(dirs)}")
    return 1 if found and not report else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
