#!/usr/bin/env python3
"""KL divergence between two raw f32 logits dumps of the same token sequence.

Each dump is [N x vocab] float32, row i the logits after token i, as written by
`kvrt ppl --logits OUT.f32`. Prints, over all N positions and the full vocabulary,
KL(P || Q) mean / p99 / max in nats (log-softmax in float64), the top-1 agreement rate,
max |logit difference| and the perplexity of each over the N-1 next-token predictions
(the ids come from `kvrt tokenize`), in the format of compare.py.

Usage: kl_dumps.py P.f32 Q.f32 --vocab V --ids IDS.txt [--names P,Q]
The fast path's cost against the exact path (docs/exactness.md) was measured with it:
  kvrt ppl --model M --text T --ctx 2048 --logits exact.f32            (exact path)
  kvrt ppl --model M --text T --ctx 2048 --logits fast.f32 --fast      (prefill numerics)
  kvrt ppl ... --fast --chunk 8 --logits fast8.f32                     (decode numerics;
                                              f16 KV by default, --kv-type f32|q8_0)
  kvrt tokenize --model M --text T > ids.txt
  kl_dumps.py exact.f32 fast8.f32 --vocab 49152 --ids ids.txt --names exact,fast
"""

import argparse
import sys

import numpy as np


def log_softmax(z):
	z = z.astype(np.float64)
	m = z.max(axis=1, keepdims=True)
	return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("p")
	ap.add_argument("q")
	ap.add_argument("--vocab", type=int, required=True)
	ap.add_argument("--ids", required=True)
	ap.add_argument("--names", default="P,Q")
	a = ap.parse_args(argv[1:])
	P = np.fromfile(a.p, dtype=np.float32).reshape(-1, a.vocab)
	Q = np.fromfile(a.q, dtype=np.float32).reshape(-1, a.vocab)
	if P.shape != Q.shape:
		sys.stderr.write("kl_dumps.py: %s has %d rows, %s has %d\n" % (a.p, P.shape[0], a.q, Q.shape[0]))
		return 1
	n = P.shape[0]
	with open(a.ids) as fh:
		ids = [int(x) for x in fh.read().split()][:n]
	if len(ids) < n:
		sys.stderr.write("kl_dumps.py: %s has %d ids, need %d\n" % (a.ids, len(ids), n))
		return 1
	kl = np.empty(n)
	agree, maxd, nll_p, nll_q = 0, 0.0, 0.0, 0.0
	for s in range(0, n, 128):
		e = min(n, s + 128)
		lp, lq = log_softmax(P[s:e]), log_softmax(Q[s:e])
		kl[s:e] = np.sum(np.exp(lp) * (lp - lq), axis=1)
		agree += int(np.sum(np.argmax(P[s:e], axis=1) == np.argmax(Q[s:e], axis=1)))
		maxd = max(maxd, float(np.max(np.abs(P[s:e].astype(np.float64) - Q[s:e]))))
		for r in range(s, min(e, n - 1)):
			nll_p -= lp[r - s, ids[r + 1]]
			nll_q -= lq[r - s, ids[r + 1]]
	np_, nq = a.names.split(",")
	print("%s vs %s (%d positions): KL mean %.3e p99 %.3e max %.3e; top-1 agreement %.4f; "
	      "max|dlogit| %.4f; ppl %s %.4f, ppl %s %.4f" % (
		np_, nq, n, kl.mean(), np.percentile(kl, 99), kl.max(), agree / n, maxd,
		np_, np.exp(nll_p / (n - 1)), nq, np.exp(nll_q / (n - 1))))
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
