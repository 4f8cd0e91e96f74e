#!/usr/bin/env python3
"""Train KVzap's linear scorer for linear_score("FILE") (docs/language.md 7.14).

KVzap (arXiv 2601.07891; kvpress kvzap/train.py) predicts KVzip's per-entry score from the
hidden state the layer's attention reads at the entry's position. For each layer l this
fits, by ridge regression (lambda = --alpha, 1 by default as kvpress's scikit-learn Ridge()),
with an intercept,

    y[i, g] = log(max(score[l, g, i], --floor))  ~  w[l, g] . h[l, i] + b[l, g]

h[l, i] the layer-l input at prompt position i after its attention RMSNorm (weight applied),
score[l, g, i] KVzip's: the largest attention position i receives from the query heads of
KV head g while the model reads a repeat instruction and then the text again. numpy only.

Where the training pairs come from:

--pair HIDDEN.npy SCORES.npy (repeatable): dumps of one text, hidden float32 [L, P, E]
  (h above) and KVzip's scores float32 [L, G, P], e.g. from the runtime.
--text T (repeatable, the default): the tree's numpy reference forward
  (scripts/reference/ref_forward.py) over the first --tokens tokens of T, then the repeat
  instruction "\\n\\nRepeat the previous context exactly." and the chat template's turn
  change (ChatML: <|im_end|>\\n<|im_start|>assistant\\n), then the same tokens again, the
  score being the attention probability (softmax over everything the query sees) maximised
  over the group's query heads and every query after the text. Texts are cut into
  --chunks pieces of --tokens tokens.

Use texts the evaluation does not use (docs/results.md scores the coreutils and gettext
manuals). The default is the sed and wget manuals; the grep manual calibrates
duo_heads.py. A tenth of the positions (every tenth) is held out: the script prints, per
layer, the held-out R^2 and the Spearman rank correlation of prediction and target.

--synthetic: fit a random linear target (known w, b, small noise) and check that the fit
  recovers them (exit 1 if not): the test of the fit and the file writer/reader.

  scripts/calibrate/kvzap_train.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --out FILE.kvzap
"""
import argparse
import gzip
import os
import subprocess
import sys
import tempfile

import numpy as np

INSTRUCTION = "\n\nRepeat the previous context exactly."
CHATML_TURN = "<|im_end|>\n<|im_start|>assistant\n"


def fit_ridge(X, Y, alpha):
	"""Ridge regression with an intercept (the intercept not penalised), as scikit-learn's
	Ridge: X [n x E], Y [n x G] -> W [G x E], b [G]. Solved in float64 from the normal
	equations of the centred data."""
	X = np.asarray(X, dtype=np.float64)
	Y = np.asarray(Y, dtype=np.float64)
	mx, my = X.mean(axis=0), Y.mean(axis=0)
	Xc, Yc = X - mx, Y - my
	A = Xc.T @ Xc + alpha * np.eye(X.shape[1])
	W = np.linalg.solve(A, Xc.T @ Yc).T
	return W, my - W @ mx


def spearman(a, b):
	"""Spearman's rank correlation of two vectors (ties broken by order)."""
	ra = np.empty(len(a))
	rb = np.empty(len(b))
	ra[np.argsort(a, kind="stable")] = np.arange(len(a))
	rb[np.argsort(b, kind="stable")] = np.arange(len(b))
	return float(np.corrcoef(ra, rb)[0, 1])


def write_linear(path, W, b, header):
	"""The file of compiler/kvp_heads.h: W [L x G x E], b [L x G]."""
	L, G, E = W.shape
	with open(path, "w") as f:
		for line in header.strip().splitlines():
			f.write("# %s\n" % line)
		f.write("linear %d %d %d\n" % (L, G, E))
		for l in range(L):
			for g in range(G):
				f.write(" ".join("%.7g" % v for v in W[l, g]) + " %.7g\n" % b[l, g])
	print("kvzap_train: wrote %s (%d layers x %d KV heads x %d + 1)" % (path, L, G, E), file=sys.stderr)


def read_linear(path):
	"""(W [L x G x E], b [L x G]) of a file written by write_linear."""
	rows, shape = [], None
	with open(path) as f:
		for line in f:
			line = line.split("#", 1)[0].strip()
			if not line:
				continue
			if shape is None:
				kw, L, G, E = line.split()
				assert kw == "linear", path
				shape = (int(L), int(G), int(E))
				continue
			rows.append([float(x) for x in line.split()])
	a = np.array(rows).reshape(shape[0], shape[1], shape[2] + 1)
	return a[:, :, :-1], a[:, :, -1]


def train(pairs, alpha, floor):
	"""pairs: [(hidden [L x P x E], scores [L x G x P])]. Per layer a ridge fit on every
	position but each tenth, which is held out. Returns W [L x G x E], b [L x G] and the
	held-out (R^2, Spearman) per layer, averaged over the KV heads."""
	L, _, E = pairs[0][0].shape
	G = pairs[0][1].shape[1]
	W = np.zeros((L, G, E))
	b = np.zeros((L, G))
	quality = []
	for l in range(L):
		X = np.concatenate([h[l] for h, _ in pairs])                      # [n x E]
		Y = np.concatenate([np.log(np.maximum(s[l].T, floor)) for _, s in pairs])  # [n x G]
		test = np.arange(len(X)) % 10 == 9
		W[l], b[l] = fit_ridge(X[~test], Y[~test], alpha)
		P = X[test] @ W[l].T + b[l]
		T = Y[test]
		r2 = 1 - ((P - T) ** 2).sum(axis=0) / ((T - T.mean(axis=0)) ** 2).sum(axis=0)
		rho = [spearman(P[:, g], T[:, g]) for g in range(G)]
		quality.append((float(r2.mean()), float(np.mean(rho))))
	return W, b, quality


def tokenize(kvrt, model, text, special=False):
	with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
		f.write(text)
		path = f.name
	try:
		cmd = [kvrt, "tokenize", "--model", model, "--text", path] + (["--special"] if special else [])
		out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
	finally:
		os.unlink(path)
	return [int(x) for x in out.split()]


def read_text(path, n_bytes):
	op = gzip.open if path.endswith(".gz") else open
	with op(path, "rb") as f:
		return f.read(n_bytes).decode("utf-8", "replace")


def replay_pair(m, ctx, instr):
	"""One numpy forward (ref_forward's arithmetic, layer by layer) over ctx + instr + ctx:
	hidden [L x N x E] (each layer's input after attn_norm at the N context positions) and
	KVzip's scores [L x G x N] (the largest attention probability a context position
	receives from the group's query heads at the positions after the context)."""
	import ref_forward
	ids = np.asarray(list(ctx) + list(instr) + list(ctx))
	n, N = len(ids), len(ctx)
	d, rep = m.head_dim, m.n_head // m.n_head_kv
	pos = np.arange(n)
	mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
	scale = np.float32(1.0 / np.sqrt(d))
	x = m.tok_embd[ids].astype(np.float32)
	hid = np.zeros((m.n_layer, N, m.n_embd), dtype=np.float32)
	sc = np.zeros((m.n_layer, m.n_head_kv, N), dtype=np.float32)
	for L in range(m.n_layer):
		p = "blk.%d." % L
		h = ref_forward.rms_norm(x, m.w[p + "attn_norm.weight"], m.eps)
		hid[L] = h[:N]
		q = ref_forward.rope((h @ m.w[p + "attn_q.weight"].T).reshape(n, m.n_head, d), pos, m.rope_base)
		k = ref_forward.rope((h @ m.w[p + "attn_k.weight"].T).reshape(n, m.n_head_kv, d), pos, m.rope_base)
		v = (h @ m.w[p + "attn_v.weight"].T).reshape(n, m.n_head_kv, d)
		att = np.empty((n, m.n_head, d), dtype=np.float32)
		for hh in range(m.n_head):
			kv = hh // rep
			s = (q[:, hh, :] @ k[:, kv, :].T) * scale + mask
			e = np.exp(s - s.max(axis=1, keepdims=True))
			e /= e.sum(axis=1, keepdims=True)
			att[:, hh, :] = e @ v[:, kv, :]
			sc[L, kv] = np.maximum(sc[L, kv], e[N:, :N].max(axis=0))
		x = x + att.reshape(n, m.n_embd) @ m.w[p + "attn_output.weight"].T
		h = ref_forward.rms_norm(x, m.w[p + "ffn_norm.weight"], m.eps)
		x = x + (ref_forward.silu(h @ m.w[p + "ffn_gate.weight"].T) * (h @ m.w[p + "ffn_up.weight"].T)) \
			@ m.w[p + "ffn_down.weight"].T
	return hid, sc


def synthetic(alpha):
	"""A random linear target with known weights: the fit and the file must recover them."""
	rng = np.random.default_rng(7)
	L, G, E, n = 2, 3, 24, 4000
	Wt = rng.normal(size=(L, G, E))
	bt = rng.normal(size=(L, G)) - 5
	pairs = []
	for _ in range(2):
		H = rng.normal(size=(L, n // 2, E)).astype(np.float32)
		S = np.exp(np.einsum("lge,lpe->lgp", Wt, H) + bt[:, :, None]
		           + 1e-3 * rng.normal(size=(L, G, n // 2)))
		pairs.append((H, S.astype(np.float64)))
	W, b, quality = train(pairs, alpha, 1e-300)
	with tempfile.TemporaryDirectory() as tmp:
		path = os.path.join(tmp, "synthetic.kvzap")
		write_linear(path, W, b, "synthetic target")
		W2, b2 = read_linear(path)
	err = max(np.abs(W2 - Wt).max(), np.abs(b2 - bt).max())
	print("kvzap_train: synthetic: max |w - w_true| over weights and biases %.2e; held-out R^2 %s"
	      % (err, " ".join("%.6f" % q[0] for q in quality)))
	return 0 if err < 1e-2 and min(q[0] for q in quality) > 0.999 else 1


def main():
	ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
	ap.add_argument("--model")
	ap.add_argument("--out")
	ap.add_argument("--text", action="append", help="training text (repeatable; default: the sed and wget manuals)")
	ap.add_argument("--pair", nargs=2, action="append", metavar=("HIDDEN", "SCORES"),
	                help="the runtime's dumps of one text (repeatable)")
	ap.add_argument("--tokens", type=int, default=512, help="tokens per context (numpy forward)")
	ap.add_argument("--chunks", type=int, default=2, help="contexts per text (numpy forward)")
	ap.add_argument("--alpha", type=float, default=1.0, help="ridge penalty (default 1)")
	ap.add_argument("--floor", type=float, default=1e-8, help="scores below are clipped before the log")
	ap.add_argument("--kvrt", default="build/kvrt")
	ap.add_argument("--note", default="", help="a line for the file's header (how the dumps were made)")
	ap.add_argument("--synthetic", action="store_true")
	a = ap.parse_args()
	if a.synthetic:
		return synthetic(a.alpha)
	if not a.model or not a.out:
		ap.error("--model and --out are required")
	pairs, source = [], ""
	if a.pair:
		for hp, sp in a.pair:
			pairs.append((np.load(hp), np.load(sp)))
		source = "the runtime's KVzip dumps %s" % ", ".join(os.path.basename(s) for _, s in a.pair)
	else:
		sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
		import ref_forward
		m = ref_forward.Model(a.model)
		texts = a.text or ["/usr/share/info/sed.info.gz", "/usr/share/info/wget.info.gz"]
		instr = tokenize(a.kvrt, a.model, INSTRUCTION + CHATML_TURN, special=True)
		for t in texts:
			ids = tokenize(a.kvrt, a.model, read_text(t, 16 * a.tokens * a.chunks))
			if len(ids) < a.tokens * a.chunks:
				sys.exit("kvzap_train: %s has %d tokens, fewer than %d" % (t, len(ids), a.tokens * a.chunks))
			for c in range(a.chunks):
				ctx = ids[c * a.tokens:(c + 1) * a.tokens]
				print("kvzap_train: %s chunk %d: numpy forward over %d tokens"
				      % (os.path.basename(t), c, 2 * len(ctx) + len(instr)), file=sys.stderr)
				pairs.append(replay_pair(m, ctx, instr))
		source = ("KVzip scores from the numpy reference forward (scripts/reference/ref_forward.py)\n"
		          "over %d chunks of %d tokens of %s, each followed by the repeat instruction\n"
		          "and itself" % (a.chunks, a.tokens, ", ".join(os.path.basename(t) for t in texts)))
	W, b, quality = train(pairs, a.alpha, a.floor)
	for l, (r2, rho) in enumerate(quality):
		print("layer %2d: held-out R^2 %.3f, Spearman %.3f" % (l, r2, rho))
	print("mean: held-out R^2 %.3f, Spearman %.3f"
	      % (np.mean([q[0] for q in quality]), np.mean([q[1] for q in quality])))
	header = ("KVzap linear scorer for linear_score() (docs/language.md 7.14): per (layer, KV head)\n"
	          "w . h + b predicting log KVzip score (clipped at %g), h the layer's input after\n"
	          "its attention RMSNorm; ridge lambda %g on %s;\n"
	          "held-out R^2 %.3f, Spearman %.3f (mean over layers); model %s.\n"
	          "%sWritten by scripts/calibrate/kvzap_train.py."
	          % (a.floor, a.alpha, source, np.mean([q[0] for q in quality]),
	             np.mean([q[1] for q in quality]), os.path.basename(a.model),
	             a.note + "\n" if a.note else ""))
	write_linear(a.out, W, b, header)
	return 0


if __name__ == "__main__":
	sys.exit(main())
