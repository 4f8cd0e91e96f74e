"""frontier: the byte frontier section of docs/results.md (scripts/results/results.sh step 7).

Reads the cells results.sh cached under OUT/frontier (one `ppl --batch` or `needle --batch`
JSON line per (policy, KV store type, ratio): POLICY.KV.rR.json, KV "own" for a policy that
chooses its own precision, R then its byte ratio, r0 its own budget) and appends to DOC, per text and
protocol: every cell's compression in entries and in bytes (against an f16 full cache, as
the binary measured it: bytes_compression), mean KL against the full cache of the same pass
(f32 rows on the exact path, f16 with RESULTS_FAST=1) and retrieval accuracy; then the frontier (the Pareto set: no other cell of its class compresses as far with a
lower mean KL) and an SVG plot of
mean KL against bytes, one line per (policy, store), into SVGDIR.

Usage: frontier.py OUT DOC SVGDIR TOKENS "TEXTS" NKEY "POLICIES" "PROMPT_END"
       "PROTOCOLS" MIN_X MAX_X; environment RESULTS_NARROWED (0: the full run; unset or 1:
       narrowed, refused a DOC in the tree: cells.py doc_refusal), RESULTS_FAST,
       RESULTS_NEEDLE_TASKS (the retrieval columns, `needle --task` names; default passkey).

Retrieval columns, one per task: passkey and multikey read "correct / trials" (the first
number generated is the key asked; for multikey the other keys in the context are
distractors); instruct reads "followed / followed by the full cache" (the instructions of
the system prompt the run's answers follow, out of those the full cache's answers follow
on the same prompts: `needle --task instruct`). Cells live under OUT/frontier/needle/NKEY
(passkey) and OUT/frontier/needle-TASK/NKEY (the others).
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cells import doc_check, load  # noqa: E402
from paired import against_full  # noqa: E402
from svg import line_plot  # noqa: E402

(out, doc, svgdir, tokens, texts, nkey, policies, pe, prots, fmin, fmax) = sys.argv[1:]
doc_check(doc, "results/frontier.py")  # a narrowed run never writes into the tree
tokens = int(tokens)
texts, policies, pe, prots = texts.split(), policies.split(), set(pe.split()), prots.split()
fmin, fmax = float(fmin), float(fmax)
STORE = {"f32": "f32 rows", "f16": "f16 rows", "q8_0": "q8_0 rows", "own": "own precision"}


def cells(d):
    """{(policy, kv, r): json} of the current policies in directory d"""
    res = {}
    for fn in glob.glob(os.path.join(d, "*.json")):
        b = os.path.basename(fn)[:-len(".json")]
        parts = b.rsplit(".", 2)
        if len(parts) != 3 or not parts[2].startswith("r") or parts[0] not in policies:
            continue
        j = load(fn)
        if j is not None:
            res[(parts[0], parts[1], float(parts[2][1:]))] = j
    return res


def fmt(x, nd=3):
    return "–" if x is None else ("%." + str(nd) + "f") % x


def kl(x):
    """a KL in nats to 3 significant digits (the frontier spans 1e-6 .. 1)"""
    return "–" if x is None else "%.3g" % x


# the classes of the frontier table, in its order (ORDER: cell_class)
CLASSES = ("eviction-only", "quantisation only", "mixed")


def cell_class(kv, j, pe_prot):
    """eviction-only: rows of one store type; quantisation only: the policy chooses its
    precision and keeps every entry (compression in entries 1); mixed: it also evicts"""
    if kv != "own":
        return "eviction-only"
    x = j.get("prompt_compression" if pe_prot else "compression") or 1
    return "quantisation only" if x <= 1.0005 else "mixed"


def retrieval(j, ref=None):
    """a retrieval cell: correct/trials with the prompts lost and gained against ref, the
    full cache's cell (paired.py against_full), or followed/followed_ref for instruct"""
    if j is None:
        return "not run"
    if "error" in j:
        return "refused"
    if j.get("task") == "instruct":
        return "%d/%d" % (j.get("followed", 0), j.get("followed_ref", 0))
    res = j.get("results", [])
    return "%d/%d%s" % (sum(1 for x in res if x.get("correct")), len(res),
                        against_full(j, ref) if ref else "")


TASKS = os.environ.get("RESULTS_NEEDLE_TASKS", "passkey").split()
TASK_HEAD = {"passkey": "passkey", "multikey": "multi-key", "instruct": "instructions",
             "niah": "niah"}


def task_dir(task):
    return os.path.join(out, "frontier", "needle" if task == "passkey" else "needle-" + task, nkey)


L = ["## Byte frontier: quality against compression in bytes\n"]
L.append("Each cell is one run of a lockstep `BIN ppl --batch` pass (the full cache of the same "
         "pass is the reference: %s) and, where measured, of `BIN needle "
         "--batch --task T` for each retrieval column (prompt lengths and depths `%s`: passkey, "
         "multikey with four keys in the context and one asked, instruct with three "
         "instructions in the system prompt, scored against what the full cache's answers "
         "follow). `same top-1` is the share of scored tokens whose most likely next token "
         "is the full cache's. `store` is the element type of "
         "the KV rows (`--kv-type` of the batch line: f32 4 bytes, f16 2, q8_0 34/32 per element; "
         "`own precision`: the policy chooses it, and `ratio` is its `--byte-ratio`, or – for its "
         "own budget). `x bytes` is the compression in bytes against an "
         "f16 full cache as the binary measured it: after the last token when streaming "
         "(`bytes_compression`), of the prompt at its compress in the prompt-end protocol, "
         "`x entries` the compression in entries; cells outside %gx..%gx in bytes were not run. "
         "A block-wise policy (one compress per block of tokens) is measured after its last "
         "compress; between compressions it holds up to a block more entries (the peak KV bytes "
         "column: blocks of the KV pool, metadata and statistics included).\n"
         % ("f16 rows on the fast path, RESULTS_FAST=1" if os.environ.get("RESULTS_FAST") == "1"
            else "f32 rows on the exact path", nkey, fmin, fmax))
needles = {task: cells(task_dir(task)) for task in TASKS}
# the full cache's cells: the frontier's own, else (passkey) the sweep's (results.sh step 5)
full_cells = {}
for task in TASKS:
    full_needle = load(os.path.join(task_dir(task), "full.json"))
    if full_needle is None and task == "passkey":
        full_needle = load(os.path.join(out, "needle", nkey, "full.json"))
    full_cells[task] = full_needle
    if full_needle is not None and task == "instruct":
        L.append("Instructions the full cache's answers follow on the same prompts: %d of %d "
                 "(%d prompts × 3 instructions; the instructions column reads a run's "
                 "answers against these).\n" % (full_needle.get("followed_ref", 0),
                                                  3 * len(full_needle.get("results", [])),
                                                  len(full_needle.get("results", []))))
    elif full_needle is not None:
        L.append("%s of the full cache on the same prompts: %s (the reference the %s column "
                 "is read against).\n" % (TASK_HEAD.get(task, task).capitalize(),
                                           retrieval(full_needle), TASK_HEAD.get(task, task)))
if any(full_cells.get(t) for t in TASKS if t != "instruct"):
    L.append("A passkey or multi-key cell that differs from the full cache on some prompt reads "
             "`n/15 (-L/+G)`: L prompts the full cache answers and the run misses, G the "
             "reverse (scripts/results/paired.py; the full cache's passkey cell is measured "
             "in the prompt-end group, the question after the context, and compresses "
             "nothing either way). The two-sided exact sign test on the "
             "discordant prompts reaches p < 0.05 only with 6 or more of them, nearly all one "
             "way (-6/+0 gives p = 0.031, -8/+1 0.039, -5/+0 0.0625): on 15 prompts a smaller "
             "difference is not a finding; "
             "docs/results_frontier_2026-12-04.md section 8 compares the target cells on more "
             "seeds.\n")
rhead = " | ".join(TASK_HEAD.get(task, task) for task in TASKS)
rsep = "---|" * len(TASKS)
rnone = " |" * len(TASKS)
plots = []
for t in texts:
    ppl = cells(os.path.join(out, "frontier", "ppl", "%s.%d" % (t, tokens)))
    for prot in prots:
        sel = {k: v for k, v in ppl.items() if (k[0] in pe) == (prot == "prompt_end")}
        if not sel:
            continue
        what = ("streaming: budget N / R entries per head from the first token, every token "
                "scored" if prot == "stream" else
                "prompt-end: the first %d tokens are the prompt, the %d after it are scored" %
                (tokens // 2, tokens - tokens // 2))
        L.append("### %s, %d tokens, %s\n" % (t, tokens, what))
        pe_prot = prot == "prompt_end"
        if pe_prot:
            L.append("`x entries` and `x bytes` are the prompt's compression, right after its "
                     "compress (`prompt_compression`, `prompt_bytes_compression`: the ratio a "
                     "prompt-end policy applies, as kvpress counts it); the tokens after the "
                     "prompt are appended at the top tier with no further compress (the "
                     "language gives a policy one trigger), so the store after the last token "
                     "holds `x bytes at the end`.\n")
        L.append("| policy | store | ratio | x entries | x bytes |%s mean KL | ± err | kld_p99 | same top-1 | %s | peak KV bytes |"
                 % (" x bytes at the end |" if pe_prot else "", rhead))
        L.append("|---|---|---|---|---|%s---|---|---|---|%s---|" % ("---|" if pe_prot else "", rsep))
        series = {}
        ok = []
        for (p, kv, r), j in sorted(sel.items(), key=lambda c: (c[0][0], c[0][1], c[0][2])):
            nj = [needles[task].get((p, kv, r)) for task in TASKS]
            if "error" in j:
                L.append("| %s | %s | %g | | |%s refused: %s | | | |%s |" % (
                    p, STORE.get(kv, kv), r, " |" if pe_prot else "", j["error"], rnone))
                continue
            bx = j.get("prompt_bytes_compression" if pe_prot else "bytes_compression")
            ex = j.get("prompt_compression" if pe_prot else "compression")
            L.append("| %s | %s | %s | %s | %s |%s %s | %s | %s | %s | %s | %s |" % (
                p, STORE.get(kv, kv), "%g" % r if r else "–", fmt(ex, 2), fmt(bx, 2),
                " %s |" % fmt(j.get("bytes_compression"), 2) if pe_prot else "",
                kl(j.get("kld_mean")), kl(j.get("kld_mean_err")),
                kl(j.get("kld_p99")), fmt(j.get("same_top1"), 3),
                " | ".join(retrieval(x, full_cells.get(task)) for x, task in zip(nj, TASKS)),
                j.get("kv_bytes_peak", "–")))
            if bx and j.get("kld_mean") is not None:
                series.setdefault("%s (%s)" % (p, kv), []).append((bx, j["kld_mean"]))
                ok.append((p, kv, r, bx, j["kld_mean"], nj))
        L.append("")
        if ok:
            L.append("Frontier (the Pareto set of each class: the cells that no other cell of the "
                     "class beats, i.e. none compresses at least as far in bytes with a lower mean "
                     "KL), by increasing compression in bytes. The classes: eviction-only (rows of one store "
                     "type), quantisation only (the policy chooses each entry's precision and keeps "
                     "every entry: 1x in entries), mixed (it chooses precision and evicts):\n")
            L.append("| class | x bytes | policy | store | ratio | mean KL | %s |" % rhead)
            L.append("|---|---|---|---|---|---|%s" % rsep)
            for name in CLASSES:
                c = [o for o in ok if cell_class(o[1], sel[o[:3]], pe_prot) == name]
                front = [o for o in c if not any(q[3] >= o[3] and q[4] < o[4] for q in c)]
                for o in sorted(front, key=lambda o: (o[3], o[4])):
                    L.append("| %s | %.2f | %s | %s | %s | %s | %s |" % (
                        name, o[3], o[0], STORE.get(o[1], o[1]),
                        "%g" % o[2] if o[2] else "–", kl(o[4]),
                        " | ".join(retrieval(x, full_cells.get(task))
                                   for x, task in zip(o[5], TASKS))))
            L.append("")
            svg = os.path.join(svgdir, "frontier_%s_%s.svg" % (t, prot))
            line_plot(svg, "mean KL vs full cache against bytes — %s, %s, %d tokens" % (t, prot, tokens),
                      "compression in bytes (against an f16 full cache)", series,
                      lambda name: name.endswith("(own)"))
            plots.append(svg)
            L.append("![mean KL against the compression in bytes, %s, %s](%s)\n" % (
                t, prot, os.path.relpath(svg, os.path.dirname(os.path.abspath(doc)))))
if not plots:
    L.append("No frontier cell was measured in this run.\n")
with open(doc, "a") as f:
    f.write("\n".join(L) + "\n")
print("results/frontier.py: appended the byte frontier to %s%s" % (doc, "".join(", " + p for p in plots)))
