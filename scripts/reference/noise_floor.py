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

Usage: noise_floor.py [--model M] [--text T] [--n 512]
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


def row(name, P, Q, ids):
	s = compare.stats(P, Q, ids)
	print("%-34s KL mean %.3e  max %.3e  top-1 %.4f  max|dlogit| %.4f" % (
		name, s["kl_mean"], s["kl_max"], s["top1"], s["max_dlogit"]))


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
	ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
	ap.add_argument("--n", type=int, default=512)
	a = ap.parse_args(argv[1:])
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
