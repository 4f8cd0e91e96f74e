#!/usr/bin/env python3
"""Write the goldens of tests/test_random_models.c: llama.cpp's next-token log-probabilities
on the random-weight GGUF files of scripts/models/make_random_gguf.py, one file per model
(default folder tests/golden/model/random).

It runs llama.cpp's own tool, nothing of this tree, on each MODEL_DIR/NAME.gguf listed in
MODEL_DIR/models.txt:
  llama-perplexity -m NAME.gguf -f TEXT -c 128 --chunks 1 -t 2 -ctk f32 -ctv f32
                   --kl-divergence-base BASE
(an f32 KV cache, so llama.cpp rounds only where its kernels do) and decodes BASE with
make_gemma_golden.read_base. Each golden holds llama.cpp's tokens for the chunk (the first
replaced by BOS when the file's add_bos_token is true, as llama-perplexity does), and for
each scored position i (the second half of the chunk, as llama-perplexity scores) the next
token, its log-probability and the TOPK most probable tokens with theirs, so that a test
can compare distributions without storing the whole vocabulary.

Format (parsed by tests/test_random_models.c):
  # model NAME sha256 HEX      (the generated file the golden was made from)
  # text PATH sha256 HEX
  # n_ctx N first F topk K
  # command ...
  # script scripts/reference/make_random_golden.py
  tokens t0 t1 ... (n_ctx ids)
  then one line per scored position i = F .. N-2:
  "i next logprob floor id:logprob ..." (K pairs, most probable first)
Each log-probability is llama.cpp's 16-bit code times its row scale (log_softmax in
perplexity.cpp), so it carries up to half a step of that row's range / 65535; llama.cpp
stores values below the row's maximum - 16 as the floor, so a next-token log-probability
equal to the floor means "at most the floor".

Usage: make_random_golden.py MODEL_DIR [--text T] [--bin DIR] [--out-dir D] [--topk 16]
Needs numpy.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gemma_golden import read_base, sha256  # noqa: E402

SCRIPT = "scripts/reference/make_random_golden.py"
N_CTX = 128


def golden(a, name, bos, add_bos):
	model = os.path.join(a.model_dir, name + ".gguf")
	fd, base = tempfile.mkstemp(suffix=".kld")
	os.close(fd)
	cmd = [os.path.join(a.bin, "llama-perplexity"), "-m", model, "-f", a.text, "-c", str(N_CTX),
	       "--chunks", "1", "-t", "2", "-ctk", "f32", "-ctv", "f32", "-fa", "off", "--kl-divergence-base", base]
	subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
	n_ctx, n_vocab, tokens, rows = read_base(base)
	os.unlink(base)
	first = n_ctx // 2
	tok = tokens[0].copy()
	if add_bos:
		tok[0] = bos
	scale = rows[0, :, 0:2].copy().view(np.float32)[:, 0]
	minlp = rows[0, :, 2:4].copy().view(np.float32)[:, 0]
	codes = rows[0, :, 4:4 + n_vocab]
	out = os.path.join(a.out_dir, name + ".txt")
	with open(out, "w") as fh:
		fh.write("# model %s sha256 %s\n" % (name, sha256(model)))
		fh.write("# text %s sha256 %s\n" % (a.text, sha256(a.text)))
		fh.write("# n_ctx %d first %d topk %d\n" % (n_ctx, first, a.topk))
		fh.write("# command %s\n" % " ".join(["llama-perplexity"] + cmd[1:-1] + ["BASE"])
		         .replace(model, "MODEL").replace(a.text, "TEXT"))
		fh.write("# script %s\n" % SCRIPT)
		fh.write("tokens " + " ".join(str(int(t)) for t in tok) + "\n")
		for r in range(n_ctx - 1 - first):
			lp = float(scale[r]) * codes[r].astype(np.float64) + float(minlp[r])
			nt = int(tok[first + r + 1])
			top = np.argsort(-codes[r].astype(np.int64), kind="stable")[:a.topk]
			fh.write("%d %d %.6f %.6f %s\n" % (first + r, nt, lp[nt], minlp[r],
			                              " ".join("%d:%.6f" % (int(v), lp[v]) for v in top)))
	sys.stderr.write("wrote %s\n" % out)


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("model_dir")
	ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
	ap.add_argument("--bin", default=os.path.expanduser("~/.cache/kvpc/llama.cpp/build/bin"))
	ap.add_argument("--out-dir", default="tests/golden/model/random")
	ap.add_argument("--topk", type=int, default=16)
	ap.add_argument("--only", action="append", default=[])
	a = ap.parse_args(argv[1:])
	os.makedirs(a.out_dir, exist_ok=True)
	with open(os.path.join(a.model_dir, "models.txt")) as fh:
		for line in fh:
			f = line.split()
			if not a.only or f[0] in a.only:
				golden(a, f[0], int(f[3]), int(f[4]))
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
