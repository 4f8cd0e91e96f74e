#!/usr/bin/env python3
"""llama.cpp as the second, external reference (through llama-cpp-python).

tokenize(): llama.cpp's own tokenizer for the GGUF vocabulary (no BOS, no
special-token parsing). logits(): f32 logits for every position of one causal
sequence, from llama.cpp with logits_all=True, n_batch 512, n_threads 2 and
its default settings otherwise (CPU backend, F16 KV cache).
"""

import numpy as np


def available():
	try:
		import llama_cpp  # noqa: F401
	except ImportError:
		return False
	return True


def version():
	import llama_cpp
	return getattr(llama_cpp, "__version__", "unknown")


def tokenize(model_path, text):
	"""Token ids of text (str) with llama.cpp's tokenizer, no BOS."""
	from llama_cpp import Llama
	llm = Llama(model_path=model_path, vocab_only=True, verbose=False)
	ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
	del llm
	return [int(i) for i in ids]


def logits(model_path, ids, n_ctx=None):
	"""Logits [len(ids) x n_vocab] float32 from llama.cpp for one sequence at positions 0..n-1."""
	from llama_cpp import Llama
	n = len(ids)
	if n_ctx is None:
		n_ctx = max(2048, n)
	llm = Llama(model_path=model_path, n_ctx=n_ctx, n_batch=512, n_threads=2,
		    n_threads_batch=2, logits_all=True, verbose=False)
	llm.reset()
	llm.eval(list(ids))
	out = np.array(llm.scores[:n], dtype=np.float32, copy=True)
	del llm
	return out
