#!/usr/bin/env python3
"""How far apart are implementations that are all "correct"? Measures the
numeric noise floor that the llama.cpp-vs-reference gap should be judged by.

On the first N tokens of the text (llama.cpp ids, no BOS) it prints KL(P||Q)
mean / max, top-1 agreement and max |dlogit| for:
  llama(b512)      vs ref             the headline gap
  llama(b512)      vs llama(b1)       llama.cpp, batch 512 vs one token per call
  llama(b512)      vs llama(f32 KV)   llama.cpp, F16 vs F32 K/V cache
  llama(b512)      vs ref_llamanum    ref with llama.cpp's rounding steps emulated
  ref              vs ref_llamanum    what those rounding steps alone do to ref
  ref              vs ref_neox        the wrong (rotate-half) RoPE layout, for scale

--hidden adds a probe on "The capital of France is" (ids 504 3575 282 4649 314):
llama.cpp's final hidden state (embedding=True, no pooling) against ref's, exact
and with llama.cpp's rounding emulated, for RoPE bases 30000/100000/300000, the
effect of a 1e-5 relative perturbation of the embeddings, and the output matmul
applied to llama.cpp's own hidden state (exact f32 vs emulated Q8_0).

Usage: noise_floor.py [--model M] [--text T] [--n 512] [--hidden]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import llama_ref  # noqa: E402
import ref_forward  # noqa: E402


def llama_logits(model, ids, n_batch=512, type_kv=None):
	from llama_cpp import Llama
	kw = {}
	if type_kv is not None:
		kw = {"type_k": type_kv, "type_v": type_kv}
	llm = Llama(model_path=model, n_ctx=max(2048, len(ids)), n_batch=n_batch, n_ubatch=n_batch,
		    n_threads=2, n_threads_batch=2, logits_all=True, verbose=False, **kw)
	llm.eval(list(ids))
	out = np.array(llm.scores[:len(ids)], dtype=np.float32, copy=True)
	del llm
	return out


def llama_hidden(model, ids):
	"""llama.cpp's final normed hidden state [n x n_embd] (embedding mode, no pooling)."""
	import llama_cpp
	llm = llama_cpp.Llama(model_path=model, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
			      n_ctx=512, n_threads=2, verbose=False)
	llm.eval(list(ids))
	n_embd = llm.n_embd()
	h = np.array([np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(llm.ctx, i), shape=(n_embd,))
		      for i in range(len(ids))], dtype=np.float32)
	del llm
	return h


def hidden_probe(model):
	ids = [504, 3575, 282, 4649, 314]
	e = llama_hidden(model, ids)
	L = llama_logits(model, ids)
	m = ref_forward.Model(model)

	def rel(h):
		return " ".join("%.4f" % v for v in np.linalg.norm(e - h, axis=1) / np.linalg.norm(e, axis=1))

	print("hidden probe, relative L2 distance to llama.cpp's final hidden state per position:")
	for emu in (False, True):
		for base in (30000.0, 100000.0, 300000.0):
			m.rope_base = base
			_, h = ref_forward.forward(m, ids, return_hidden=True, llama_numerics=emu)
			print("  %-14s base %-8g %s" % ("ref_llamanum" if emu else "ref", base, rel(h)))
	m.rope_base = 100000.0
	E = m.tok_embd
	_, h0 = ref_forward.forward(m, ids, return_hidden=True)
	_, g0 = ref_forward.forward(m, ids, return_hidden=True, llama_numerics=True)
	m.tok_embd = E * np.float32(1.0 + 1e-5)
	_, h1 = ref_forward.forward(m, ids, return_hidden=True)
	_, g1 = ref_forward.forward(m, ids, return_hidden=True, llama_numerics=True)
	m.tok_embd = E
	d = lambda a, b: " ".join("%.2e" % v for v in np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1))
	print("  embeddings x (1+1e-5): ref moves %s; ref_llamanum moves %s" % (d(h0, h1), d(g0, g1)))
	nm = ref_forward._Numerics(m, True)
	print("  logits from llama.cpp's hidden state, max|dlogit| per position: exact f32 %s; emulated Q8_0 %s" % (
		" ".join("%.2e" % v for v in np.abs(e @ m.output.T - L).max(axis=1)),
		" ".join("%.2e" % v for v in np.abs(nm.mm(e, m.output_name) - L).max(axis=1))))


def row(name, P, Q, ids):
	s = compare.stats(P, Q, ids)
	print("%-34s KL mean %.3e  max %.3e  top-1 %.4f  max|dlogit| %.4f" % (
		name, s["kl_mean"], s["kl_max"], s["top1"], s["max_dlogit"]))


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
	ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
	ap.add_argument("--n", type=int, default=512)
	ap.add_argument("--hidden", action="store_true")
	a = ap.parse_args(argv[1:])
	if a.hidden:
		hidden_probe(a.model)
	with open(a.text, encoding="utf-8") as fh:
		ids = llama_ref.tokenize(a.model, fh.read())[:a.n]
	print("first %d tokens of %s; llama-cpp-python %s" % (len(ids), a.text, llama_ref.version()))
	l512 = llama_logits(a.model, ids)
	l1 = llama_logits(a.model, ids, n_batch=1)
	l32 = llama_logits(a.model, ids, type_kv=0)  # GGML_TYPE_F32
	m = ref_forward.Model(a.model)
	ref = ref_forward.forward(m, ids)
	emu = ref_forward.forward(m, ids, llama_numerics=True)
	neox = ref_forward.forward(m, ids, rope_mode="neox")
	row("llama(b512) vs ref", l512, ref, ids)
	row("llama(b512) vs llama(b1)", l512, l1, ids)
	row("llama(b512) vs llama(f32 KV)", l512, l32, ids)
	row("llama(b512) vs ref_llamanum", l512, emu, ids)
	row("ref vs ref_llamanum", ref, emu, ids)
	row("ref vs ref_neox", ref, neox, ids)
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
