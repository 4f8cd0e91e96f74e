#!/usr/bin/env python3
"""Write tests/golden/tokenizer/gemma3.txt: llama.cpp's token ids for Gemma 3's tokenizer.

The texts are golden.txt's (the SmolLM2 cases: scripts, Unicode spaces, control bytes,
special tokens, random text, the GPL-3 prefix); the reference is llama.cpp's own
llama-tokenize (built by scripts/bench/build_llama.sh with LLAMA_TARGETS=llama-tokenize) on the
Gemma 3 270M GGUF (make model-gemma), without BOS, no escape processing, special tokens parsed as each case says.
The format is golden.txt's (case / text or file / ids records; see make_golden.py).

Usage: python3 tests/golden/tokenizer/make_gemma3.py LLAMA_TOKENIZE GEMMA_GGUF \
           > tests/golden/tokenizer/gemma3.txt   (run from the repo root)
"""
import hashlib
import os
import re
import subprocess
import sys
import tempfile

TOOL, MODEL = sys.argv[1], sys.argv[2]
GOLDEN = "tests/golden/tokenizer/golden.txt"


def ids_of(data, special):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        path = f.name
    try:
        cmd = [TOOL, "-m", MODEL, "-f", path, "--ids", "--no-bos", "--no-escape", "--log-disable"]
        if not special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True).stdout.decode()
    finally:
        os.unlink(path)
    m = re.search(r"\[([0-9, ]*)\]", out)
    if not m:
        sys.exit("no id list in llama-tokenize's output: " + out[:200])
    return [int(x) for x in m.group(1).replace(",", " ").split()]


def main():
    sha = hashlib.sha256(open(MODEL, "rb").read()).hexdigest()
    print("# llama.cpp llama-tokenize on the Gemma 3 270M GGUF, no BOS (make_gemma3.py)")
    print("model_sha256 " + sha)
    case = None
    for line in open(GOLDEN):
        line = line.rstrip("\n")
        if line.startswith("case "):
            case = line.split()
            print(line)
        elif line.startswith("text "):
            print(line)
            h = line[5:]
            data = b"" if h in ("-", "=") else bytes.fromhex(h)
            ids = ids_of(data, case[2] == "1")
            print("ids %d %s" % (len(ids), " ".join(map(str, ids))))
        elif line.startswith("file "):
            print(line)
            _, path, n, _, _ = line.split()
            data = open(path, "rb").read()[: int(n)]
            ids = ids_of(data, case[2] == "1")
            print("ids %d %s" % (len(ids), " ".join(map(str, ids))))


main()
