#!/usr/bin/env python3
"""Independent float32 numpy forward pass of a GGUF `llama` model.

This is the reference the kvrt runtime is checked against. It is written from
the GGUF/llama.cpp model definition, not from the C runtime:

* weights: read with gguf.GGUFReader and dequantised with gguf.quants.dequantize
  (ggml's block formats Q4_1, Q8_0, ...), giving float32 matrices of shape
  [ne1 rows x ne0 cols], so y = W @ x maps an ne0-vector to an ne1-vector;
* RMSNorm: x / sqrt(mean(x^2) + eps) * w, eps = llama.attention.layer_norm_rms_epsilon;
* RoPE, ggml NORMAL mode (rope type 0, the one GGUF `llama` uses): within each
  head of size d the adjacent pair (x[2i], x[2i+1]) is rotated by the angle
  pos * base^(-2i/d), base = llama.rope.freq_base. (mode="neox" gives HF's
  rotate-half layout, kept only to show that it is the wrong one for GGUF);
* grouped-query attention: query head h reads KV head h // (n_head / n_head_kv),
  scores scaled by 1/sqrt(d), causal mask over the full sequence, softmax;
* SwiGLU FFN: down(silu(gate x) * up x);
* final RMSNorm, then logits = token_embd^T h when there is no output.weight
  (tied embeddings) or output^T h otherwise.

All arithmetic is float32 (numpy matmuls on float32 arrays); softmax and
normalisation are computed in float32 as well.

Usage as a script:  ref_forward.py MODEL.gguf ID [ID ...]
prints the argmax token and top-5 of the last position's logits.
"""

import sys

import numpy as np

import gguf
from gguf.quants import dequantize


def _field(reader, key):
	f = reader.fields.get(key)
	if f is None:
		raise KeyError("%s: missing GGUF key %s" % (reader.path if hasattr(reader, "path") else "gguf", key))
	return f.contents()


class Model:
	"""Dequantised float32 weights and hyper-parameters of a GGUF llama model."""

	def __init__(self, path):
		r = gguf.GGUFReader(path)
		arch = _field(r, "general.architecture")
		if arch != "llama":
			raise ValueError("%s: architecture %r, expected 'llama'" % (path, arch))
		self.path = path
		self.n_layer = int(_field(r, "llama.block_count"))
		self.n_embd = int(_field(r, "llama.embedding_length"))
		self.n_ff = int(_field(r, "llama.feed_forward_length"))
		self.n_head = int(_field(r, "llama.attention.head_count"))
		self.n_head_kv = int(_field(r, "llama.attention.head_count_kv"))
		self.eps = np.float32(_field(r, "llama.attention.layer_norm_rms_epsilon"))
		self.rope_base = float(_field(r, "llama.rope.freq_base"))
		self.head_dim = self.n_embd // self.n_head
		self.n_rot = int(_field(r, "llama.rope.dimension_count"))
		if self.n_rot != self.head_dim:
			raise ValueError("%s: partial rotary (%d of %d) not supported" % (path, self.n_rot, self.head_dim))
		self.w = {}
		self._raw = {}
		for t in r.tensors:
			if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:
				self._raw[t.name] = np.asarray(t.data)
			a = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
			# ne = (ne0, ne1): ne1 rows of ne0 values
			shape = tuple(int(x) for x in reversed(t.shape))
			self.w[t.name] = np.ascontiguousarray(a.reshape(shape))
		self.tok_embd = self.w["token_embd.weight"]  # [n_vocab x n_embd]
		self.output_name = "output.weight" if "output.weight" in self.w else "token_embd.weight"
		self.output = self.w[self.output_name]
		self.n_vocab = self.tok_embd.shape[0]


	def q4_1_min(self, name):
		"""Per-block minimum m [rows x n_blocks] float32 of a Q4_1 tensor, else None."""
		raw = self._raw.get(name)
		if raw is None:
			return None
		rows = raw.shape[0]
		blk = raw.reshape(rows, -1, 20)
		return blk[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)


def rms_norm(x, w, eps):
	"""x [n x d] float32, w [d] -> [n x d]."""
	ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
	return (x / np.sqrt(ms + eps)).astype(np.float32) * w


def rope(x, pos, base, mode="normal"):
	"""Rotate x [n x heads x d] at positions pos [n] (ggml NORMAL or NEOX layout)."""
	n, h, d = x.shape
	inv = np.power(np.float32(base), -np.arange(0, d, 2, dtype=np.float32) / np.float32(d)).astype(np.float32)
	ang = pos.astype(np.float32)[:, None] * inv[None, :]  # [n x d/2]
	c = np.cos(ang)[:, None, :].astype(np.float32)
	s = np.sin(ang)[:, None, :].astype(np.float32)
	if mode == "normal":
		x0 = x[..., 0::2]
		x1 = x[..., 1::2]
	elif mode == "neox":
		x0 = x[..., : d // 2]
		x1 = x[..., d // 2:]
	else:
		raise ValueError("rope mode %r" % mode)
	y0 = x0 * c - x1 * s
	y1 = x0 * s + x1 * c
	out = np.empty_like(x)
	if mode == "normal":
		out[..., 0::2] = y0
		out[..., 1::2] = y1
	else:
		out[..., : d // 2] = y0
		out[..., d // 2:] = y1
	return out


def _f16(x):
	return x.astype(np.float16).astype(np.float32)


def _q8_act(x, block=32):
	"""ggml's activation quantisation in front of a quantised matmul (Q8_0/Q8_1,
	blocks of 32): d = max|x| / 127, q = round(x / d). Returns (f16(d) * q as
	float32 [same shape as x], d [.. x n_blocks], q [.. x n_blocks x 32])."""
	shp = x.shape
	b = x.reshape(shp[:-1] + (shp[-1] // block, block)).astype(np.float32)
	d = np.max(np.abs(b), axis=-1, keepdims=True) / np.float32(127.0)
	inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), 0).astype(np.float32)
	q = np.round(b * inv)
	return (_f16(d) * q).reshape(shp).astype(np.float32), d[..., 0], q


def silu(x):
	return x / (np.float32(1.0) + np.exp(-x))


class _Numerics:
	"""Matrix products y = x W^T, exact (float32) or as llama.cpp's CPU backend
	rounds them (diagnostic only, see forward())."""

	def __init__(self, m, llama):
		self.m = m
		self.llama = llama

	def mm(self, x, name):
		W = self.m.w[name]
		if not self.llama:
			return x @ W.T
		xq, d, q = _q8_act(x)
		y = xq @ W.T
		mins = self.m.q4_1_min(name)
		if mins is not None:
			# Q4_1 x Q8_1: the min term uses s = f16(d * sum(q)), not f16(d) * sum(q)
			s = q.sum(axis=-1)
			y = y + (_f16(d * s) - _f16(d) * s) @ mins.T
		return y.astype(np.float32)

	def h16(self, x):
		return _f16(x) if self.llama else x


def forward(m, ids, rope_mode="normal", return_hidden=False, llama_numerics=False):
	"""Logits [n x n_vocab] float32 for token ids [n] (positions 0..n-1, causal).

	llama_numerics=True is a diagnostic, not the reference: it adds llama.cpp
	CPU's rounding steps (Q8_1/Q8_0 activation quantisation in front of every
	quantised matmul, F16 K/V cache, Q and the attention weights rounded to F16
	for the F16 matmuls), to show how much of the llama.cpp-vs-reference gap
	those steps explain."""
	nm = _Numerics(m, llama_numerics)
	ids = np.asarray(ids, dtype=np.int64)
	n = len(ids)
	d = m.head_dim
	rep = m.n_head // m.n_head_kv
	pos = np.arange(n)
	x = m.tok_embd[ids].astype(np.float32)  # [n x n_embd]
	mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
	scale = np.float32(1.0 / np.sqrt(d))
	for L in range(m.n_layer):
		p = "blk.%d." % L
		h = rms_norm(x, m.w[p + "attn_norm.weight"], m.eps)
		q = nm.mm(h, p + "attn_q.weight").reshape(n, m.n_head, d)
		k = nm.mm(h, p + "attn_k.weight").reshape(n, m.n_head_kv, d)
		v = nm.h16(nm.mm(h, p + "attn_v.weight").reshape(n, m.n_head_kv, d))
		q = nm.h16(rope(q, pos, m.rope_base, rope_mode))
		k = nm.h16(rope(k, pos, m.rope_base, rope_mode))
		att = np.empty((n, m.n_head, d), dtype=np.float32)
		for hh in range(m.n_head):
			kv = hh // rep
			s = (q[:, hh, :] @ k[:, kv, :].T) * scale + mask  # [n x n]
			s = s - s.max(axis=1, keepdims=True)
			e = np.exp(s)
			e /= e.sum(axis=1, keepdims=True, dtype=np.float32)
			att[:, hh, :] = nm.h16(e) @ v[:, kv, :]
		x = x + nm.mm(att.reshape(n, m.n_embd), p + "attn_output.weight")
		h = rms_norm(x, m.w[p + "ffn_norm.weight"], m.eps)
		g = nm.mm(h, p + "ffn_gate.weight")
		u = nm.mm(h, p + "ffn_up.weight")
		x = x + nm.mm(silu(g) * u, p + "ffn_down.weight")
	h = rms_norm(x, m.w["output_norm.weight"], m.eps)
	logits = nm.mm(h, m.output_name)
	assert logits.dtype == np.float32
	if return_hidden:
		return logits, h
	return logits


def log_softmax(logits):
	"""Row-wise log softmax, computed in float64 for the final reduction."""
	z = logits.astype(np.float64)
	z = z - z.max(axis=-1, keepdims=True)
	return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def main(argv):
	if len(argv) < 3:
		sys.stderr.write("usage: ref_forward.py MODEL.gguf ID [ID ...]\n")
		return 2
	m = Model(argv[1])
	ids = [int(a) for a in argv[2:]]
	lg = forward(m, ids)
	last = lg[-1]
	top = np.argsort(-last)[:5]
	print("argmax", int(top[0]))
	for t in top:
		print(int(t), float(last[t]))
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
