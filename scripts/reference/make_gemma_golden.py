#!/usr/bin/env python3
"""Write the Gemma 3 golden of tests/test_gemma.c (default path gemma3_gpl3.txt under
tests/golden/model): llama.cpp's next-token log-probabilities and top-1 for one
llama-perplexity chunk of a text on Gemma 3 270M.

It runs llama.cpp's own tool, nothing of this tree:
  llama-perplexity -m MODEL -f TEXT -c N_CTX --chunks 1 -t 2 --kl-divergence-base BASE
and decodes BASE (llama-perplexity's format, tools/perplexity/perplexity.cpp: "_logits_",
n_ctx u32, n_vocab i32, n_chunk i32, tokens i32 [n_chunk x n_ctx], then per chunk
n_ctx - 1 - n_ctx/2 rows of 2*((n_vocab+1)/2) + 4 u16: floats scale and min_log_prob, then
codes with log p = scale*code + min_log_prob).

Output format (parsed by tests/test_gemma.c):
  # model sha256 HEX
  # text PATH sha256 HEX
  # n_ctx N first F
  # ppl_llama FLOAT          (over the scored positions of this chunk)
  # command ...
  # script scripts/reference/make_gemma_golden.py
  tokens t0 t1 ... (n_ctx ids as llama-perplexity runs them: t0 = BOS)
  then one line per scored position i = F .. N-2: "i next_token logprob top1"

Usage: make_gemma_golden.py [--model M] [--text T] [--n-ctx 128] [--bin DIR] [--out F]
Needs numpy. With --keep BASE the base file is kept (for KVRT_KL_BASE runs).
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np

SCRIPT = "scripts/reference/make_gemma_golden.py"
BOS = 2  # tokenizer.ggml.bos_token_id of the Gemma 3 file (add_bos_token true)


def sha256(path):
	h = hashlib.sha256()
	with open(path, "rb") as fh:
		for b in iter(lambda: fh.read(1 << 20), b""):
			h.update(b)
	return h.hexdigest()


def read_base(path):
	"""(n_ctx, n_vocab, tokens [n_chunk, n_ctx], rows [n_chunk, nr, nv] uint16)."""
	with open(path, "rb") as fh:
		data = fh.read()
	assert data[:8] == b"_logits_", "%s: not a llama-perplexity base file" % path
	n_ctx, n_vocab, n_chunk = np.frombuffer(data, dtype=np.int32, count=3, offset=8)
	off = 20
	tokens = np.frombuffer(data, dtype=np.int32, count=n_ctx * n_chunk, offset=off).reshape(n_chunk, n_ctx)
	off += 4 * n_ctx * n_chunk
	nv = 2 * ((n_vocab + 1) // 2) + 4
	nr = n_ctx - 1 - n_ctx // 2
	rows = np.frombuffer(data, dtype=np.uint16, count=n_chunk * nr * nv, offset=off).reshape(n_chunk, nr, nv)
	return int(n_ctx), int(n_vocab), tokens, rows


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("--model", default="models/gemma-3-270m-q4_k_m.gguf")
	ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
	ap.add_argument("--n-ctx", type=int, default=128)
	ap.add_argument("--bin", default=os.path.expanduser("~/.cache/kvpc/llama.cpp/build/bin"))
	ap.add_argument("--out", default="tests/golden/model/gemma3_gpl3.txt")
	ap.add_argument("--keep", default=None)
	a = ap.parse_args(argv[1:])

	base = a.keep or tempfile.mktemp(suffix=".kld")
	cmd = [os.path.join(a.bin, "llama-perplexity"), "-m", a.model, "-f", a.text, "-c", str(a.n_ctx),
	       "--chunks", "1", "-t", "2", "--kl-divergence-base", base]
	subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
	n_ctx, n_vocab, tokens, rows = read_base(base)
	if not a.keep:
		os.unlink(base)
	first = n_ctx // 2
	tok = tokens[0].copy()
	tok[0] = BOS
	scale = rows[0, :, 0:2].copy().view(np.float32)[:, 0]
	minlp = rows[0, :, 2:4].copy().view(np.float32)[:, 0]
	codes = rows[0, :, 4:4 + n_vocab]
	lines = []
	nll = 0.0
	for r in range(n_ctx - 1 - first):
		i = first + r
		nt = int(tok[i + 1])
		lp = float(scale[r]) * float(codes[r, nt]) + float(minlp[r])
		nll -= lp
		lines.append("%d %d %.6f %d\n" % (i, nt, lp, int(np.argmax(codes[r]))))
	ppl = float(np.exp(nll / len(lines)))
	with open(a.out, "w") as fh:
		fh.write("# model sha256 %s\n" % sha256(a.model))
		fh.write("# text %s sha256 %s\n" % (a.text, sha256(a.text)))
		fh.write("# n_ctx %d first %d\n" % (n_ctx, first))
		fh.write("# ppl_llama %.6f\n" % ppl)
		fh.write("# command llama-perplexity -m MODEL -f TEXT -c %d --chunks 1 -t 2 --kl-divergence-base BASE\n" % n_ctx)
		fh.write("# script %s\n" % SCRIPT)
		fh.write("tokens " + " ".join(str(int(t)) for t in tok) + "\n")
		fh.writelines(lines)
	sys.stderr.write("wrote %s (ppl_llama %.4f over %d positions)\n" % (a.out, ppl, len(lines)))
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
