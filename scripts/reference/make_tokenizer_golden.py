#!/usr/bin/env python3
"""Write tests/golden/model/tokenizer_llama.txt: llama.cpp's token ids (no BOS,
special tokens not parsed) for short tricky strings, cross-checked against the
independent ref_tokenizer.py.

Format: '#' header lines ("# model sha256 HEX", "# cases N", "# script ..."),
then one line per case: HEX ID ID ...  where HEX is the UTF-8 bytes of the
text in lower-case hex (so no escaping is needed) and the ids follow,
space-separated. Exits non-zero if the two tokenizers disagree on any case.

Usage: make_tokenizer_golden.py [--model M] [--out F]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402
import make_model_golden  # noqa: E402
import ref_tokenizer  # noqa: E402

CASES = [
	"Hello, we can use",
	"The capital of France is",
	"\n",
	"Hello world! 123",
	"  multiple   spaces",
	"Café déjà vu.",
	"You are a helpful AI assistant named SmolLM, trained by Hugging Face",
	"Version 3, 29 June 2007",
	"3.14159 and 1,000,000 and 2024-01-01",
	"don't I'm we've they'll she'd it's DON'T",
	"tabs\there\tand\r\nCRLF line",
	"a\n\nb\n\n\n  c   \n",
	"    indented code:\n\tif (x == 1) { return -1; }\n",
	"<|im_start|>user\nhi<|im_end|>",
	"naïve façade coöperate — “quotes” ‘single’ …",
	"日本語のテキスト、中文文本。",
	"emoji 🙂👍🏽 and ümlaut",
	"URL https://www.gnu.org/licenses/ and e-mail a.b@c.org",
	"  ",
	"x",
	"</s> <unk> [INST] ### Response:",
	"The GNU General Public License is a free, copyleft license for software and other kinds of works.",
]


def main(argv):
	ap = argparse.ArgumentParser()
	ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
	ap.add_argument("--out", default="tests/golden/model/tokenizer_llama.txt")
	a = ap.parse_args(argv[1:])
	if not llama_ref.available():
		sys.stderr.write("make_tokenizer_golden.py: llama-cpp-python is not importable\n")
		return 1
	ref = ref_tokenizer.Tokenizer(a.model)
	bad = 0
	lines = []
	for s in CASES:
		ids = llama_ref.tokenize(a.model, s)
		mine = ref.encode(s)
		if ids != mine:
			bad += 1
			sys.stderr.write("disagree on %r: llama.cpp %s, ref_tokenizer %s\n" % (s, ids, mine))
		lines.append("%s %s\n" % (s.encode("utf-8").hex(), " ".join(str(i) for i in ids)))
	with open(a.out, "w") as fh:
		fh.write("# model sha256 %s\n" % make_model_golden.sha256(a.model))
		fh.write("# cases %d\n" % len(CASES))
		fh.write("# format: utf8-hex id id ... (llama.cpp %s tokenizer, no BOS, special tokens as text)\n" % llama_ref.version())
		fh.write("# script scripts/reference/make_tokenizer_golden.py\n")
		fh.writelines(lines)
	sys.stderr.write("wrote %s: %d cases, ref_tokenizer disagrees on %d\n" % (a.out, len(CASES), bad))
	return 1 if bad else 0


if __name__ == "__main__":
	sys.exit(main(sys.argv))
