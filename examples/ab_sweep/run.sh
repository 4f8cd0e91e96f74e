#!/usr/bin/env bash
# A/B sweep: H2O (policies/h2o.kvp) against sinks + recent window
# (examples/ab_sweep/sinks_window.kvp) at compression ratios 2, 4 and 8 on the real model,
# with JSON, CSV and an SVG of every metric against the ratio. See README.md.
# Usage: examples/ab_sweep/run.sh [MODEL] [TOKENS]   (from the repository root, after `make`;
# KVPC=path/to/kvpc to use another compiler, e.g. an installed one)
set -euo pipefail
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
tokens=${2:-1024}
out=build/ab_sweep
mkdir -p "$out"
text="$out/coreutils.txt"
if [ -r /usr/share/info/coreutils.info.gz ]; then
  { zcat /usr/share/info/coreutils.info.gz || true; } | head -c $((tokens * 16)) >"$text"
else
  cp /usr/share/common-licenses/GPL-3 "$text"
fi
"${KVPC:-build/kvpc}" ab examples/ab_sweep/sinks_window.kvp policies/h2o.kvp \
  --model "$model" --text "$text" --ctx "$tokens" --ratio 2,4,8 \
  --json "$out/sweep.json" --csv "$out/sweep.csv" --plot "$out/sweep.svg"
echo "reports: $out/sweep.json $out/sweep.csv $out/sweep.svg"
