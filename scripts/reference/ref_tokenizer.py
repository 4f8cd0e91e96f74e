#!/usr/bin/env python3
"""Independent byte-level BPE tokenizer for GGUF `gpt2`-model vocabularies
with the `smollm` pre-tokenizer (SmolLM/SmolLM2), read from the GGUF file.

Follows llama.cpp's llm_tokenizer_bpe for LLAMA_VOCAB_PRE_TYPE_SMOLLM:
two regex passes, each applied to every piece of the previous pass
(look-ahead does not see past a piece's end):
  1. \\p{N}  (every digit becomes its own piece; text between digits stays a piece)
  2. the GPT-2 pattern 's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)
     (text no alternative matches is kept as its own piece)
then GPT-2's byte-to-unicode map and greedy lowest-rank BPE merges from
tokenizer.ggml.merges. No BOS/EOS is added, special tokens are not parsed.
It is a cross-check only; the golden token ids come from llama.cpp itself.

Usage: ref_tokenizer.py MODEL.gguf FILE   prints the ids, one line, space-separated.
"""

import sys

import regex

import gguf

PAT_DIGIT = regex.compile(r"\p{N}")
PAT_GPT2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")


def _bytes_to_unicode():
	bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
	cs = bs[:]
	n = 0
	for b in range(256):
		if b not in bs:
			bs.append(b)
			cs.append(256 + n)
			n += 1
	return {b: chr(c) for b, c in zip(bs, cs)}


def _split(pat, s):
	"""Pieces of s: the matches of pat and the unmatched spans between them."""
	out = []
	at = 0
	for mt in pat.finditer(s):
		if mt.start() > at:
			out.append(s[at:mt.start()])
		if mt.end() > mt.start():
			out.append(mt.group())
		at = mt.end()
	if at < len(s):
		out.append(s[at:])
	return out


class Tokenizer:
	def __init__(self, path):
		r = gguf.GGUFReader(path)
		f = r.fields["tokenizer.ggml.tokens"]
		self.tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
		self.id_of = {t: i for i, t in enumerate(self.tokens)}
		f = r.fields["tokenizer.ggml.merges"]
		self.rank = {}
		for rk, i in enumerate(f.data):
			a, b = bytes(f.parts[i]).decode("utf-8").split(" ", 1)
			self.rank[(a, b)] = rk
		self.b2u = _bytes_to_unicode()
		self.cache = {}

	def _bpe(self, word):
		if word in self.cache:
			return self.cache[word]
		parts = list(word)
		while len(parts) > 1:
			best = None
			for j in range(len(parts) - 1):
				rk = self.rank.get((parts[j], parts[j + 1]))
				if rk is not None and (best is None or rk < best[0]):
					best = (rk, j)
			if best is None:
				break
			j = best[1]
			parts[j:j + 2] = [parts[j] + parts[j + 1]]
		ids = [self.id_of[p] for p in parts]
		self.cache[word] = ids
		return ids

	def encode(self, text):
		ids = []
		for p1 in _split(PAT_DIGIT, text):
			for p2 in _split(PAT_GPT2, p1):
				w = "".join(self.b2u[b] for b in p2.encode("utf-8"))
				ids.extend(self._bpe(w))
		return ids


def main(argv):
	if len(argv) != 3:
		sys.stderr.write("usage: ref_tokenizer.py MODEL.gguf FILE\n")
		return 2
	tok = Tokenizer(argv[1])
	with open(argv[2], encoding="utf-8") as fh:
		print(" ".join(str(i) for i in tok.encode(fh.read())))
	return 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
