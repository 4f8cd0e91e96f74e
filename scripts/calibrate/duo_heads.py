#!/usr/bin/env python3
"""Calibrate DuoAttention-style head weights for head_score("FILE") (docs/language.md 7.12).

A head whose streaming costs more is a retrieval head. Two measures of that cost, per
(layer, KV head) of a model:

--measure mass (default; one numpy forward, scripts/reference/ref_forward.py's, over the
first TOKENS tokens of each text): the attention mass the head's queries put on the
positions a streaming head drops (sinks <= j <= t - recent for the query at t), averaged
over the queries that have such positions and over the query heads of its GQA group.

--measure kl (one run per head, through the runtime; slow on a shared machine): make that
head alone a streaming head (it keeps the first SINKS and the last RECENT positions of
the prompt; every other head keeps its whole prompt) and measure the mean KL divergence
per token between the full cache's next-token distribution and the probe's over the
tokens that follow the prompt.

The file this writes is what policies/duo_attention.kvp names. For --measure kl, all
probes run as one policy (a probe index picks the head, through a table of head
indices read with head_score() itself) in one lockstep pass per text (`BIN ppl --batch`,
docs/measuring.md), built with `kvpc build`. The budget is chosen so that the global
allocation keeps every other head whole and the probed head's guards only: with H heads,
guards g = SINKS + RECENT and a prompt of N = g + H*k tokens, a budget of B = g + (H-1)*k
entries per head leaves exactly H*(B-g) = (H-1)*(N-g) entries beyond the guards.

Use texts that the evaluation does not (docs/results.md scores the coreutils and gettext
manuals); the default is the grep manual.

  scripts/calibrate/duo_heads.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --out policies/smollm2_135m.heads
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

import gguf
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import ref_forward  # noqa: E402  (the tree's numpy reference forward)


def model_shape(path):
	"""(layers, KV heads) of a GGUF model."""
	r = gguf.GGUFReader(path)
	arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
	def num(key):
		f = r.fields["%s.%s" % (arch, key)]
		return int(f.parts[-1][0])
	return num("block_count"), num("attention.head_count_kv")


def read_text(path, out_dir, n_bytes):
	"""The first n_bytes of a text (a .gz is decompressed) written to out_dir."""
	op = gzip.open if path.endswith(".gz") else open
	with op(path, "rb") as f:
		data = f.read(n_bytes)
	dst = os.path.join(out_dir, os.path.basename(path).replace(".gz", "") + ".txt")
	with open(dst, "wb") as f:
		f.write(data)
	return dst


def mass_weights(model, ids, sinks, recent):
	"""Per (layer, KV head): the attention mass the head's queries put on the positions a
	streaming head drops, sinks <= j <= t - recent for the query at t (queries with
	t >= sinks + recent), averaged over those queries and over the query heads of the
	GQA group. The forward is scripts/reference/ref_forward.py's, layer by layer."""
	m = ref_forward.Model(model)
	n = len(ids)
	d, rep = m.head_dim, m.n_head // m.n_head_kv
	pos = np.arange(n)
	mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
	t = np.arange(n)[:, None]
	j = np.arange(n)[None, :]
	drop = (j >= sinks) & (j <= t - recent)  # [n x n] what a streaming head loses
	rows = np.arange(n) >= sinks + recent
	w = np.zeros((m.n_layer, m.n_head_kv))
	x = m.tok_embd[np.asarray(ids)].astype(np.float32)
	scale = np.float32(1.0 / np.sqrt(d))
	for L in range(m.n_layer):
		p = "blk.%d." % L
		h = ref_forward.rms_norm(x, m.w[p + "attn_norm.weight"], m.eps)
		q = ref_forward.rope((h @ m.w[p + "attn_q.weight"].T).reshape(n, m.n_head, d), pos, m.rope_base)
		k = ref_forward.rope((h @ m.w[p + "attn_k.weight"].T).reshape(n, m.n_head_kv, d), pos, m.rope_base)
		v = (h @ m.w[p + "attn_v.weight"].T).reshape(n, m.n_head_kv, d)
		att = np.empty((n, m.n_head, d), dtype=np.float32)
		for hh in range(m.n_head):
			kv = hh // rep
			sc = (q[:, hh, :] @ k[:, kv, :].T) * scale + mask
			e = np.exp(sc - sc.max(axis=1, keepdims=True))
			e /= e.sum(axis=1, keepdims=True)
			att[:, hh, :] = e @ v[:, kv, :]
			w[L, kv] += (e * drop).sum(axis=1)[rows].mean() / rep
		x = x + att.reshape(n, m.n_embd) @ m.w[p + "attn_output.weight"].T
		h = ref_forward.rms_norm(x, m.w[p + "ffn_norm.weight"], m.eps)
		g = h @ m.w[p + "ffn_gate.weight"].T
		u = h @ m.w[p + "ffn_up.weight"].T
		x = x + (ref_forward.silu(g) * u) @ m.w[p + "ffn_down.weight"].T
	return w


PROBE = """# probe of scripts/calibrate/duo_heads.py: head `probe` streams, every other head is whole
policy duo_probe {{
    param probe = 0  # index of the streaming head (layer * KV heads + KV head)
    param capacity = {cap} entries  # g + (H - 1) * k: the other heads whole
    budget = capacity
    score = if(head_score("index.heads") == probe, 0, 1)
    allocate = global(floor = 0)
    keep sinks {sinks} tokens
    keep recent {recent} tokens
    compress at prompt end
}}
"""


def main():
	ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
	ap.add_argument("--model", required=True)
	ap.add_argument("--text", action="append",
	                help="calibration text (repeatable; default: the grep manual)")
	ap.add_argument("--out", required=True, help="the head file to write")
	ap.add_argument("--kvpc", default="build/kvpc")
	ap.add_argument("--sinks", type=int, default=128)
	ap.add_argument("--recent", type=int, default=256)
	ap.add_argument("--k", type=int, default=4,
	                help="prompt = sinks + recent + H*k tokens (default 4)")
	ap.add_argument("--scored", type=int, default=64, help="tokens scored after the prompt")
	ap.add_argument("--threads", type=int, default=2)
	ap.add_argument("--measure", choices=["mass", "kl"], default="mass",
	                help="mass: attention mass a streaming head drops (one numpy forward); "
	                     "kl: the KL when that head alone streams (one probe run per head)")
	ap.add_argument("--tokens", type=int, default=1024, help="tokens of each text (mass)")
	ap.add_argument("--kvrt", default="build/kvrt")
	a = ap.parse_args()
	texts = a.text or ["/usr/share/info/grep.info.gz"]
	L, G = model_shape(a.model)
	if a.measure == "mass":
		w = np.zeros((L, G))
		with tempfile.TemporaryDirectory() as tmp:
			for t in texts:
				tf = read_text(t, tmp, 16 * a.tokens)
				out = subprocess.run([a.kvrt, "tokenize", "--model", a.model, "--text", tf],
				                     check=True, capture_output=True, text=True).stdout
				ids = [int(x) for x in out.split()][:a.tokens]
				if len(ids) < a.tokens:
					sys.exit("duo_heads: %s has %d tokens, fewer than %d" % (t, len(ids), a.tokens))
				w += mass_weights(a.model, ids, a.sinks, a.recent) / len(texts)
		what = ("the attention mass (mean over queries and the GQA group) that a streaming\n"
		        "# head with %d sinks + %d recent drops, over the first %d tokens"
		        % (a.sinks, a.recent, a.tokens))
		write_heads(a.out, w, what, a.model, texts)
		return
	H = L * G
	g = a.sinks + a.recent
	N = g + H * a.k
	cap = g + (H - 1) * a.k
	ctx = N + a.scored
	with tempfile.TemporaryDirectory() as tmp:
		with open(os.path.join(tmp, "index.heads"), "w") as f:
			f.write("# head indices: layer * %d + KV head\nheads %d %d\n" % (G, L, G))
			for l in range(L):
				f.write(" ".join(str(l * G + j) for j in range(G)) + "\n")
		kvp = os.path.join(tmp, "duo_probe.kvp")
		with open(kvp, "w") as f:
			f.write(PROBE.format(cap=cap, sinks=a.sinks, recent=a.recent))
		binp = os.path.join(tmp, "probe_bin")
		subprocess.run([a.kvpc, "build", kvp, "-o", binp], check=True)
		runs = os.path.join(tmp, "runs")
		with open(runs, "w") as f:
			for h in range(H):
				f.write("duo_probe --set probe=%d\n" % h)
		kl = [0.0] * H
		for t in texts:
			tf = read_text(t, tmp, 64 * ctx)  # a token is a few bytes
			cmd = [binp, "ppl", "--model", a.model, "--text", tf, "--ctx", str(ctx),
			       "--prompt", str(N), "--score-from", str(N + 1), "--batch", runs,
			       "--threads", str(a.threads), "--fast", "--json"]
			print("duo_heads: " + " ".join(cmd), file=sys.stderr)
			out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
			rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
			if len(rows) != H:
				sys.exit("duo_heads: %d results for %d probes" % (len(rows), H))
			for h, r in enumerate(rows):
				kl[h] += r["kld_mean"] / len(texts)
	what = ("the mean KL (nats/token) when that (layer, KV head) alone keeps %d sinks +\n"
	        "# %d recent of a %d-token prompt, over the %d tokens after it"
	        % (a.sinks, a.recent, N, a.scored))
	write_heads(a.out, np.array(kl).reshape(L, G), what, a.model, texts)


def write_heads(path, w, what, model, texts):
	"""The head file (compiler/kvp_heads.h) of weights w [L x G]."""
	L, G = w.shape
	with open(path, "w") as f:
		f.write("# DuoAttention head weights for head_score() (docs/language.md 7.12):\n# %s;\n"
		        "# model %s; texts %s. Written by scripts/calibrate/duo_heads.py.\n"
		        % (what, os.path.basename(model), ", ".join(os.path.basename(t) for t in texts)))
		f.write("heads %d %d\n" % (L, G))
		for l in range(L):
			f.write(" ".join("%.6g" % w[l, j] for j in range(G)) + "\n")
	print("duo_heads: wrote %s (%d x %d heads)" % (path, L, G), file=sys.stderr)


if __name__ == "__main__":
	main()
