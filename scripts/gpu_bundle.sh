#!/usr/bin/env bash
# gpu_bundle.sh [DIR] [LAYERS]: everything scripts/gpu_check.sh needs on a GPU machine that
# cannot build the project (no flex, bison, OpenBLAS or check there, nothing to download),
# built here and packed into DIR (default .dev) for a transfer of at most 64 MiB:
#   DIR/bundle.tar.xz   build/cuda/{cuda_probe,gpu_check,k_select_check,kv-gpu-check}
#                       (stripped; nvcc for sm_90 + PTX, docs/cuda.md) and lib/ with the
#                       shared libraries they need beyond glibc, the GCC runtime, the CUDA
#                       runtime and cuBLAS (which the GPU machine has)
#   DIR/model.gguf      the first LAYERS (12) layers of models/SmolLM2-135M-Instruct.Q4_1.gguf,
#                       token_embd re-quantised to Q4_1 (scripts/models/cut_gguf.py), for
#                       the equivalence checks: the full file (94 MB) does not fit
#   DIR/whl/            the gguf wheel, so that the GPU machine's python3 can grow the cut
#                       model back to 30 layers (the real shapes) for the speed rows
# On the GPU machine: scripts/gpu_check.sh --prebuilt DIR (it unpacks the bundle, finds
# cuBLAS and the CUDA runtime there and skips every build step). Exit 1 on any failure.
set -eu
cd "$(dirname "$0")/.."
dir=${1:-.dev}
layers=${2:-12}
src=models/SmolLM2-135M-Instruct.Q4_1.gguf
B=build
make -j"$(nproc)" all >/dev/null
make --no-print-directory cuda >"$B/gpu_bundle.build.log" 2>&1 || { tail -20 "$B/gpu_bundle.build.log"; exit 1; }
"$B/kvpc" build --cuda policies/h2o.kvp policies/tova.kvp policies/snapkv.kvp -o "$B/cuda/kv-gpu-check"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/cuda" "$stage/lib" "$dir"
for b in cuda_probe gpu_check k_select_check kv-gpu-check; do
	strip -o "$stage/build/cuda/$b" "$B/cuda/$b"
done
# every library outside glibc, the GCC runtime and CUDA (OpenBLAS, gfortran, PCRE2, zlib,
# jansson, libmicrohttpd and GnuTLS's chain, check's subunit): resolved here by ldd, copied
# under their sonames; the GPU machine's own glibc (newer) runs them
ldd "$B"/cuda/gpu_check "$B"/cuda/kv-gpu-check "$B"/cuda/k_select_check "$B"/cuda/cuda_probe | awk '$2 == "=>" { print $1, $3 }' | sort -u |
	while read -r so path; do
		case "$so" in
		libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libresolv.so* | libutil.so* | \
			libanl.so* | libnsl.so* | libstdc++* | libgcc_s* | libcublas* | libcudart* | libcuda.so*) ;;
		*) cp -L "$path" "$stage/lib/$so" ;;
		esac
	done
tar -C "$stage" -cJf "$dir/bundle.tar.xz" build lib
python3 scripts/models/cut_gguf.py "$src" "$dir/model.gguf" --layers "$layers" --embd-q4-1
mkdir -p "$dir/whl"
[ -n "$(ls "$dir"/whl/gguf-*.whl 2>/dev/null)" ] ||
	python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/whl" gguf==0.19.0
du -cb "$dir/bundle.tar.xz" "$dir/model.gguf" "$dir"/whl/* | tail -1 |
	awk '{ printf "gpu_bundle: %s: %.1f MiB (the transfer limit is 64 MiB with the tree)\n", "'"$dir"'", $1 / 1048576 }'
