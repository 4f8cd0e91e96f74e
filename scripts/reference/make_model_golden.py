#!/usr/bin/env python3
"""Write tests/golden/model/gpl3_2048.txt: per-position next-token log-probs and
top-1 ids of two independent references for the first N tokens of a text.

References: (1) ref_forward.py, the float32 numpy forward pass written from the
GGUF llama spec; (2) llama.cpp through llama-cpp-python. Token ids come from
llama.cpp's tokenizer (no BOS). When llama-cpp-python is not importable the
ids come from ref_tokenizer.py and the llama columns repeat the numpy columns;
the header then carries "# llama pending" (a provisional file only).

Output format (parsed by the C exactness test):
  # text PATH sha256 HEX
  # model sha256 HEX
  # tokens N
  # ppl_ref FLOAT
  # ppl_llama FLOAT
  # script scripts/reference/make_model_golden.py
  then N-1 lines "i token next_token ref_logprob ref_top1 llama_logprob llama_top1",
  logprobs as %.6f (natural log).

Usage: make_model_golden.py [--model M] [--text T] [--n 2048] [--out F] [--dump DIR]
--dump DIR also stores ids.txt, ref_logits.f32 and llama_logits.f32 ([n x vocab]
raw float32) for compare.py.
"""

import argparse
import hashlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402
import ref_forward  # noqa: E402
import ref_tokenizer  # noqa: E402

SCRIPT = "scripts/reference/make_model_golden.py"


def sha256(path):
	h = hashlib.sha256()
	with open(path, "rb") as fh:
		for b in iter(lambda: fh.read(1 << 20), b""):
			h.update(b)
	return h.hexdigest()


def next_logprobs(logits, ids):
	"""(logprob of ids[i+1] under row i, argmax of row i) for i = 0..n-2."""
	n = len(ids)
	lp = np.empty(n - 1)
	top = np.empty(n - 1, dtype=np.int64)
	for a in range(0, n - 1, 256):
		b = min(n - 1, a + 256)
		ls = ref_forward.log_softmax(logits[a:b])
		lp[a:b] = ls[np.arange(b - a), np.asarray(ids[a + 1:b + 1])]
		top[a:b] = np.argmax(logits[a:b], axis=1)
	return lp, top


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
	ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
	ap.add_argument("--n", type=int, default=2048)
	ap.add_argument("--out", default="tests/golden/model/gpl3_2048.txt")
	ap.add_argument("--dump", default=None)
	a = ap.parse_args(argv[1:])

	with open(a.text, encoding="utf-8") as fh:
		text = fh.read()
	have_llama = llama_ref.available()
	if have_llama:
		ids = llama_ref.tokenize(a.model, text)
	else:
		ids = ref_tokenizer.Tokenizer(a.model).encode(text)
	if len(ids) < a.n:
		sys.stderr.write("%s: only %d tokens, need %d\n" % (a.text, len(ids), a.n))
		return 1
	ids = ids[:a.n]

	t0 = time.time()
	m = ref_forward.Model(a.model)
	ref = ref_forward.forward(m, ids)
	del m
	sys.stderr.write("numpy reference: %.1f s\n" % (time.time() - t0))
	ref_lp, ref_top = next_logprobs(ref, ids)
	if have_llama:
		t0 = time.time()
		ll = llama_ref.logits(a.model, ids)
		sys.stderr.write("llama.cpp: %.1f s\n" % (time.time() - t0))
		ll_lp, ll_top = next_logprobs(ll, ids)
	else:
		ll = None
		ll_lp, ll_top = ref_lp, ref_top

	if a.dump:
		os.makedirs(a.dump, exist_ok=True)
		with open(os.path.join(a.dump, "ids.txt"), "w") as fh:
			fh.write(" ".join(str(i) for i in ids) + "\n")
		ref.tofile(os.path.join(a.dump, "ref_logits.f32"))
		if ll is not None:
			ll.tofile(os.path.join(a.dump, "llama_logits.f32"))

	os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
	with open(a.out, "w") as fh:
		fh.write("# text %s sha256 %s\n" % (a.text, sha256(a.text)))
		fh.write("# model sha256 %s\n" % sha256(a.model))
		fh.write("# tokens %d\n" % a.n)
		fh.write("# ppl_ref %.6f\n" % float(np.exp(-ref_lp.mean())))
		fh.write("# ppl_llama %.6f\n" % float(np.exp(-ll_lp.mean())))
		fh.write("# script %s\n" % SCRIPT)
		if not have_llama:
			fh.write("# llama pending\n")
		for i in range(a.n - 1):
			fh.write("%d %d %d %.6f %d %.6f %d\n" % (i, ids[i], ids[i + 1], ref_lp[i], ref_top[i], ll_lp[i], ll_top[i]))
	sys.stderr.write("wrote %s (ppl_ref %.4f, ppl_llama %.4f%s)\n" % (
		a.out, np.exp(-ref_lp.mean()), np.exp(-ll_lp.mean()), "" if have_llama else ", llama pending"))
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
