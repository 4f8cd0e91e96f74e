#!/usr/bin/env python3
"""Write a copy of a llama-family GGUF model with fewer or more transformer layers, so that a
model fits a size limit (the GPU machine's 64 MiB transfer, scripts/gpu_bundle.sh) and can be
grown back to its original shapes on the other side.

  cut_gguf.py IN OUT --layers N [--embd-q4-1]
      keep blocks 0..N-1 (every blk.I.* tensor with I < N) and set ARCH.block_count = N;
      --embd-q4-1 re-quantises token_embd.weight to Q4_1 (gguf-py's reference quantiser):
      the largest single tensor of a small model, about half its bytes at Q8_0
  cut_gguf.py IN OUT --repeat-to M
      block I of OUT is block (I mod N) of IN, for I < M: the original model's shapes (and so
      its speed) with real, repeated weights; the logits are not the original model's

Everything else (metadata, tokenizer, norms, output) is copied unchanged. The result is a
valid model, not the original one: use it for checks that compare two engines on the same file
(the CPU path against the GPU, scripts/gpu_check.sh) and for speed, never for quality figures.
Needs numpy and the PyPI package gguf. Errors (a file that is not GGUF, no block_count, N out of
range) exit 1 with a message naming the file.
"""

import argparse
import re
import sys

import numpy as np

try:
	import gguf
except ImportError as e:
	sys.exit("cut_gguf: python module missing (%s): pip install gguf" % e)

BLK = re.compile(r"^blk\.(\d+)\.(.*)$")


def field_value(f):
	t = f.types[0]
	sub = f.types[-1] if t == gguf.GGUFValueType.ARRAY else None
	return f.contents(), t, sub


def main():
	ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
	ap.add_argument("inp")
	ap.add_argument("out")
	g = ap.add_mutually_exclusive_group(required=True)
	g.add_argument("--layers", type=int)
	g.add_argument("--repeat-to", type=int)
	ap.add_argument("--embd-q4-1", action="store_true")
	a = ap.parse_args()
	try:
		r = gguf.GGUFReader(a.inp)
	except Exception as e:  # gguf-py raises ValueError/OSError on bad files
		sys.exit("cut_gguf: %s: not a readable GGUF file (%s)" % (a.inp, e))
	if "general.architecture" not in r.fields:
		sys.exit("cut_gguf: %s: no general.architecture" % a.inp)
	arch = r.fields["general.architecture"].contents()
	key = "%s.block_count" % arch
	if key not in r.fields:
		sys.exit("cut_gguf: %s: no %s" % (a.inp, key))
	n_in = int(r.fields[key].contents())
	n_out = a.layers if a.layers is not None else a.repeat_to
	if n_out < 1 or (a.layers is not None and n_out > n_in):
		sys.exit("cut_gguf: %s: %d layers asked, the file has %d" % (a.inp, n_out, n_in))

	w = gguf.GGUFWriter(a.out, arch)
	if "general.alignment" in r.fields:  # the writer pads tensor data to its own alignment
		w.add_custom_alignment(int(r.fields["general.alignment"].contents()))
	for f in r.fields.values():
		if f.name in ("general.architecture", "general.alignment") or f.name.startswith("GGUF."):
			continue
		v, t, sub = field_value(f)
		if f.name == key:
			v = n_out
		w.add_key_value(f.name, v, t, sub_type=sub)

	plan = []  # (name in OUT, tensor of IN, data, type)
	for t in r.tensors:
		m = BLK.match(t.name)
		if m:
			continue
		data, typ = t.data, t.tensor_type
		if t.name == "token_embd.weight" and a.embd_q4_1 and typ != gguf.GGMLQuantizationType.Q4_1:
			f32 = gguf.quants.dequantize(t.data, typ)
			typ = gguf.GGMLQuantizationType.Q4_1
			data = gguf.quants.quantize(f32.astype(np.float32), typ)
		plan.append((t.name, data, typ))
	for i in range(n_out):
		src = i % n_in
		for t in r.tensors:
			m = BLK.match(t.name)
			if m and int(m.group(1)) == src:
				plan.append(("blk.%d.%s" % (i, m.group(2)), t.data, t.tensor_type))
	for name, data, typ in plan:
		w.add_tensor_info(name, data.shape, data.dtype, data.nbytes, typ)
	w.write_header_to_file()
	w.write_kv_data_to_file()
	w.write_ti_data_to_file()
	for name, data, typ in plan:
		w.write_tensor_data(data, tensor_endianess=r.endianess)
	w.close()
	print("cut_gguf: %s: %d of %d layers -> %s" % (a.inp, n_out, n_in, a.out))


if __name__ == "__main__":
	main()
