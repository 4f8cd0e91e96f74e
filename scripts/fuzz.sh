#!/usr/bin/env bash
# Run one libFuzzer target of tests/fuzz/ (built by `make fuzz-build` into build-fuzz/).
# Usage: scripts/fuzz.sh run|smoke NAME SECONDS  (FUZZ_BIN_DIR: where the binaries are, default build-fuzz)
#   run:   fuzz NAME for SECONDS on its seeds; new inputs are kept in build-fuzz/corpus/NAME,
#          a crash or hang is written to build-fuzz/NAME-crash-* / -timeout-* (exit 1).
#   smoke: replay tests/fuzz/regress/NAME/* (each must pass), then fuzz 20000 inputs from the
#          seeds into a scratch directory with a fixed seed (what `make check` runs): the
#          same inputs on every machine, so CI cannot fail by chance; SECONDS only bounds it.
# Seeds of NAME: tests/fuzz/corpus/NAME, build-fuzz/seeds/NAME, and for kvpc_check the
# shipped policies and tests/golden/kvp.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=$1 name=$2 secs=$3
bin=${FUZZ_BIN_DIR:-build-fuzz}/fuzz_$name
[ -x "$bin" ] || { echo "fuzz.sh: $bin is not built (make fuzz-build)" >&2; exit 2; }
opts=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
seeds=()
for d in tests/fuzz/corpus/$name build-fuzz/seeds/$name; do [ -d "$d" ] && seeds+=("$d"); done
case $name in
  kvpc_check) opts+=(-max_len=4096 -dict=tests/fuzz/kvp.dict)
              seeds+=(policies tests/golden/kvp/bad tests/golden/kvp/good tests/golden/kvp/fmt) ;;
  gguf)       opts+=(-max_len=65536 -dict=tests/fuzz/gguf.dict) ;;
  tokenizer)  opts+=(-max_len=4096 -dict=tests/fuzz/tokenizer.dict) ;;
  text)       opts+=(-max_len=16384) ;;
  *) echo "fuzz.sh: unknown target '$name'" >&2; exit 2 ;;
esac
case $mode in
  run)
    mkdir -p "build-fuzz/corpus/$name"
    exec "$bin" "${opts[@]}" -max_total_time="$secs" -artifact_prefix="build-fuzz/$name-" \
      "build-fuzz/corpus/$name" "${seeds[@]}" ;;
  smoke)
    shopt -s nullglob
    reg=(tests/fuzz/regress/$name/*)
    if [ "${#reg[@]}" -gt 0 ]; then
      "$bin" "${opts[@]}" "${reg[@]}" >"build-fuzz/$name-regress.log" 2>&1 ||
        { tail -n 30 "build-fuzz/$name-regress.log"; echo "fuzz $name: a regression input fails"; exit 1; }
    fi
    scratch=$(mktemp -d build-fuzz/smoke-$name.XXXXXX)
    log=build-fuzz/$name-smoke.log
    if ! "$bin" "${opts[@]}" -seed=1 -runs=20000 -max_total_time="$((secs * 12))" \
         -artifact_prefix="build-fuzz/$name-" "$scratch" "${seeds[@]}" >"$log" 2>&1; then
      tail -n 30 "$log"; rm -rf "$scratch"; echo "fuzz $name: failed (log: $log)"; exit 1
    fi
    rm -rf "$scratch"
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -n 1)
    echo "fuzz $name: ${#reg[@]} regression inputs pass, ${runs:-?} runs (seed 1), no crash" ;;
  *) echo "fuzz.sh: unknown mode '$mode'" >&2; exit 2 ;;
esac
