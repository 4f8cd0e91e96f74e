#!/usr/bin/env bash
# gpu_check.sh [--prebuilt DIR] [MODEL] [TEXT]: the CUDA backend's device checks, unattended,
# in a few minutes on a machine with an NVIDIA GPU (docs/cuda.md):
#   1. build (make cuda: libkvrt_cuda, every policy's CUDA unit, the checks), or with
#      --prebuilt DIR take what scripts/gpu_bundle.sh packed into DIR (for a GPU machine that
#      cannot build: the binaries, their libraries, a cut model; nothing is compiled)
#   2. kernels vs their CPU references + decode attention bandwidth (share of peak)
#   3. the selection kernel vs the CPU kernel (ties keep the lower position)
#   4. every policy: 512 tokens of TEXT on the CPU exact path and on the GPU: logits
#      within 1e-3, equal counts per head and at most 1% of entries swapped (near-ties),
#      a second GPU run bit-identical
#   5. prefill and decode tokens/s (f32 and f16 weights)
#   6. the command line: `ppl --device cuda --batch RUNS --json` (the CPU's engine: KL,
#      byte ratios, compression) against the same command on --device cpu, run by run;
#      `bench --device cuda` (llama-bench's tests, f32 and f16 weights, under a policy)
# With --prebuilt, steps 5 and 6's speed rows run on BENCH_MODEL: the cut model grown back to
# 30 layers (scripts/models/cut_gguf.py --repeat-to 30), SmolLM2-135M's shapes.
# Prints one table; exit 0 when every check passed, 1 otherwise (or without a GPU).
set -u
cd "$(dirname "$0")/.."
prebuilt=
unset py_ld
if [ "${1:-}" = --prebuilt ]; then
	prebuilt=${2:?gpu_check: --prebuilt needs the folder gpu_bundle.sh wrote}
	shift 2
fi
text=${2:-/usr/share/common-licenses/GPL-3}
[ -r "$text" ] || text=docs/architecture.md
if [ -n "$prebuilt" ]; then
	B=$prebuilt/build
	model=${1:-$prebuilt/model.gguf}
	python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[1]); t.extraction_filter = getattr(tarfile, "data_filter", None); t.extractall(sys.argv[2])' \
		"$prebuilt/bundle.tar.xz" "$prebuilt" || { echo "gpu_check: $prebuilt/bundle.tar.xz: cannot unpack"; exit 1; }
	# cuBLAS and the CUDA runtime of the machine: the toolkit's or the Python wheels'
	cudalibs=$(find /usr/local /usr/lib /opt -name 'libcublas.so.[0-9]*' -o -name 'libcudart.so.[0-9]*' 2>/dev/null |
		xargs -r -n1 dirname | sort -u | paste -sd: -)
	py_ld=${LD_LIBRARY_PATH:-} # python3 keeps the machine's own zlib and libffi
	export LD_LIBRARY_PATH=$prebuilt/lib${cudalibs:+:$cudalibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	echo "## machine"
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
	echo "cuBLAS / CUDA runtime from: ${cudalibs:-none found}"
	bench_model=$prebuilt/model30.gguf
	if LD_LIBRARY_PATH=$py_ld python3 -m pip install -q --no-index --no-deps --target "$prebuilt/site" "$prebuilt"/whl/gguf-*.whl >/dev/null 2>&1 &&
		LD_LIBRARY_PATH=$py_ld PYTHONPATH=$prebuilt/site python3 scripts/models/cut_gguf.py "$model" "$bench_model" --repeat-to 30; then :; else
		echo "gpu_check: could not grow $model to 30 layers: the speed rows use it as it is"
		bench_model=$model
	fi
else
	B=build
	model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
	bench_model=$model
	make -j"$(nproc)" all >/dev/null && make --no-print-directory cuda >"$B/gpu_check.build.log" 2>&1 ||
		{ tail -20 "$B/gpu_check.build.log"; echo "gpu_check: build failed"; exit 1; }
fi
if ! "$B/cuda/cuda_probe"; then
	echo "gpu_check: no GPU here: device checks not run"
	exit 1
fi
[ -r "$model" ] || { echo "gpu_check: $model: model not found (make model)"; exit 1; }
rc=0
echo "## kernels"
timeout 120 "$B/cuda/gpu_check" --kernels || rc=1
echo "## selection"
timeout 60 "$B/cuda/k_select_check" || rc=1
echo "## equivalence (CPU exact path vs GPU, $text)"
timeout 600 "$B/cuda/gpu_check" --equiv "$model" "$text" 512 || rc=1
echo "## benchmark"
timeout 300 "$B/cuda/gpu_check" --bench "$bench_model" || rc=1
echo "## command line (ppl --device cuda vs --device cpu, --batch, --json; bench --device cuda)"
bin=$B/cuda/kv-gpu-check
runs=$B/gpu_check.runs
printf '%s\n' full 'h2o --ratio 4' 'tova --ratio 8' 'h2o --byte-ratio 4' 'snapkv --ratio 4' >"$runs"
if [ -n "$prebuilt" ] || "$B/kvpc" build --cuda policies/h2o.kvp policies/tova.kvp policies/snapkv.kvp \
	-o "$bin" >"$B/gpu_check.kvpc.log" 2>&1; then
	for d in cpu cuda; do
		timeout 900 "$bin" ppl --device "$d" --model "$model" --text "$text" --ctx 512 --prompt 256 \
			--batch "$runs" --json --quiet >"$B/gpu_check.ppl.$d.json" || rc=1
	done
	LD_LIBRARY_PATH=${py_ld-${LD_LIBRARY_PATH:-}} python3 scripts/gpu_check_ppl.py "$B/gpu_check.ppl.cpu.json" "$B/gpu_check.ppl.cuda.json" || rc=1
	for w in "" --f16; do
		timeout 300 "$bin" bench --device cuda $w --model "$bench_model" --pp 512 --tg 128 --depth 0,1024 \
			--quiet || rc=1
	done
	timeout 300 "$bin" bench --device cuda --model "$bench_model" --tg 64 --depth 1024 --policy h2o \
		--ratio 8 --quiet || rc=1
else
	tail -20 "$B/gpu_check.kvpc.log"
	echo "gpu_check: kvpc build --cuda failed"
	rc=1
fi
[ "$rc" = 0 ] && echo "gpu_check: all checks passed" || echo "gpu_check: some checks FAILED"
exit "$rc"
