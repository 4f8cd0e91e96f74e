#!/usr/bin/env python3
"""Compare full next-token distributions of three implementations of the same
model on the same token sequence:

  ref    ref_forward.py (float32 numpy, written from the GGUF llama spec)
  llama  llama.cpp via llama-cpp-python (llama_ref.py)
  kvrt   our C runtime: `kvrt ppl --model M --text T --ctx N --logits OUT.f32`

For each pair (P = the first named, Q = the second) it prints, over all N
positions and the full vocabulary: KL(P || Q) mean / p99 / max in nats,
top-1 agreement rate, max |logit difference|, max |difference of the log-prob
of the actual next token|, and the perplexity of each over the N-1 next-token
predictions.

The ref and llama logits are read from DIR (written by
`make_model_golden.py --dump DIR`) or recomputed when DIR lacks them.
kvrt tokenizes the text itself; its ids are checked against llama.cpp's when
`kvrt tokenize` exists, and the logits are compared only if the kvrt run
produced exactly N rows.

Usage: compare.py [--model M] [--text T] [--n 2048] [--dump DIR] [--kvrt build/kvrt]
                  [--rope-check N]
--rope-check N also runs the numpy reference with HF's rotate-half (NEOX) RoPE
on the first N tokens and reports its KL from llama.cpp, next to the NORMAL
(adjacent-pair) one, which shows which convention llama.cpp uses.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402
import ref_forward  # noqa: E402


def log_softmax(z):
	return ref_forward.log_softmax(z)


def stats(P, Q, ids, chunk=128):
	"""KL(P||Q) per position, top-1 agreement, max |dlogit|, ppl of P and Q."""
	n = P.shape[0]
	kl = np.empty(n)
	agree = 0
	maxd = 0.0
	nll_p = 0.0
	nll_q = 0.0
	maxlp = 0.0
	for a in range(0, n, chunk):
		b = min(n, a + chunk)
		lp = log_softmax(P[a:b])
		lq = log_softmax(Q[a:b])
		kl[a:b] = np.sum(np.exp(lp) * (lp - lq), axis=1)
		agree += int(np.sum(np.argmax(P[a:b], axis=1) == np.argmax(Q[a:b], axis=1)))
		maxd = max(maxd, float(np.max(np.abs(P[a:b].astype(np.float64) - Q[a:b]))))
		for r in range(a, min(b, n - 1)):
			nll_p -= lp[r - a, ids[r + 1]]
			nll_q -= lq[r - a, ids[r + 1]]
			maxlp = max(maxlp, abs(lp[r - a, ids[r + 1]] - lq[r - a, ids[r + 1]]))
	return {
		"kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)), "kl_max": float(kl.max()),
		"kl_argmax": int(np.argmax(kl)), "top1": agree / n, "max_dlogit": maxd, "max_dlogprob": maxlp,
		"ppl_p": float(np.exp(nll_p / (n - 1))), "ppl_q": float(np.exp(nll_q / (n - 1))),
	}


def report(name_p, name_q, s):
	print("%s vs %s: KL(%s||%s) mean %.3e p99 %.3e max %.3e (pos %d); top-1 agreement %.4f; "
	      "max|dlogit| %.4f; max|dlogprob(next)| %.6f; ppl %s %.4f, ppl %s %.4f" % (
		name_p, name_q, name_p, name_q, s["kl_mean"], s["kl_p99"], s["kl_max"], s["kl_argmax"],
		s["top1"], s["max_dlogit"], s["max_dlogprob"], name_p, s["ppl_p"], name_q, s["ppl_q"]))


def load_f32(path, vocab):
	a = np.fromfile(path, dtype=np.float32)
	if a.size % vocab:
		raise ValueError("%s: %d floats is not a multiple of vocab %d" % (path, a.size, vocab))
	return a.reshape(-1, vocab)


def kvrt_ids(kvrt, model, text):
	"""ids from `kvrt tokenize`, or None when that subcommand does not exist/fails."""
	for args in ([kvrt, "tokenize", "--model", model, "--text", text],):
		try:
			r = subprocess.run(args, capture_output=True, text=True, timeout=300)
		except (OSError, subprocess.TimeoutExpired):
			return None
		if r.returncode == 0:
			try:
				return [int(x) for x in r.stdout.split()]
			except ValueError:
				return None
	return None


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
	ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
	ap.add_argument("--n", type=int, default=2048)
	ap.add_argument("--dump", default="/tmp/kvpc_exactness")
	ap.add_argument("--kvrt", default="build/kvrt")
	ap.add_argument("--rope-check", type=int, default=0)
	a = ap.parse_args(argv[1:])

	if not llama_ref.available():
		sys.stderr.write("compare.py: llama-cpp-python is not importable\n")
		return 1
	with open(a.text, encoding="utf-8") as fh:
		text = fh.read()
	ids = llama_ref.tokenize(a.model, text)[:a.n]
	if len(ids) < a.n:
		sys.stderr.write("%s: only %d tokens\n" % (a.text, len(ids)))
		return 1
	n = a.n
	os.makedirs(a.dump, exist_ok=True)
	idp = os.path.join(a.dump, "ids.txt")
	if os.path.exists(idp):
		with open(idp) as fh:
			old = [int(x) for x in fh.read().split()]
		if old != ids:
			sys.stderr.write("%s: ids differ from llama.cpp's, recomputing\n" % idp)
			for f in ("ref_logits.f32", "llama_logits.f32"):
				if os.path.exists(os.path.join(a.dump, f)):
					os.remove(os.path.join(a.dump, f))
	with open(idp, "w") as fh:
		fh.write(" ".join(str(i) for i in ids) + "\n")

	rp = os.path.join(a.dump, "ref_logits.f32")
	lp = os.path.join(a.dump, "llama_logits.f32")
	m = None
	if os.path.exists(rp):
		vocab = os.path.getsize(rp) // 4 // n
		ref = load_f32(rp, vocab)
	else:
		m = ref_forward.Model(a.model)
		ref = ref_forward.forward(m, ids)
		ref.tofile(rp)
	vocab = ref.shape[1]
	if os.path.exists(lp):
		ll = load_f32(lp, vocab)
	else:
		ll = llama_ref.logits(a.model, ids)
		ll.tofile(lp)
	if ref.shape[0] != n or ll.shape[0] != n:
		sys.stderr.write("compare.py: cached logits have %d/%d rows, want %d\n" % (ref.shape[0], ll.shape[0], n))
		return 1
	print("model %s, text %s, %d tokens (llama.cpp tokenizer, no BOS), vocab %d, llama-cpp-python %s" % (
		a.model, a.text, n, vocab, llama_ref.version()))
	report("llama", "ref", stats(ll, ref, ids))

	if a.rope_check:
		k = a.rope_check
		if m is None:
			m = ref_forward.Model(a.model)
		for mode in ("normal", "neox"):
			r2 = ref_forward.forward(m, ids[:k], rope_mode=mode)
			s = stats(ll[:k], r2, ids[:k])
			print("rope-check %s (first %d tokens): KL(llama||ref_%s) mean %.3e max %.3e top-1 %.4f ppl %.4f" % (
				mode, k, mode, s["kl_mean"], s["kl_max"], s["top1"], s["ppl_q"]))
	del m

	if not os.access(a.kvrt, os.X_OK):
		print("kvrt: %s not found; C runtime not compared" % a.kvrt)
		return 0
	kids = kvrt_ids(a.kvrt, a.model, a.text)
	if kids is None:
		print("kvrt: no `kvrt tokenize`; token ids checked only through the logits")
	else:
		same = kids[:n] == ids
		first = next((i for i in range(min(len(kids), n)) if kids[i] != ids[i]), None)
		print("kvrt tokenizer: %d ids for the whole text (llama.cpp %d); first %d %s%s" % (
			len(kids), len(llama_ref.tokenize(a.model, text)), n,
			"EQUAL to llama.cpp's" if same else "DIFFER from llama.cpp's",
			"" if same else " (first difference at %s)" % first))
	with tempfile.TemporaryDirectory() as td:
		out = os.path.join(td, "kvrt_logits.f32")
		cmd = [a.kvrt, "ppl", "--model", a.model, "--text", a.text, "--ctx", str(n), "--logits", out]
		r = subprocess.run(cmd, capture_output=True, text=True)
		print("kvrt: `%s` rc %d; stdout: %s" % (" ".join(cmd), r.returncode, r.stdout.strip().replace("\n", " | ")))
		if r.returncode != 0:
			print("kvrt stderr: %s" % r.stderr.strip()[-500:])
			return 1
		kv = load_f32(out, vocab)
	if kv.shape[0] != n:
		print("kvrt produced %d rows, expected %d; not compared" % (kv.shape[0], n))
		return 1
	report("ref", "kvrt", stats(ref, kv, ids))
	report("llama", "kvrt", stats(ll, kv, ids))
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
