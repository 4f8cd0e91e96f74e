#!/usr/bin/env bash
# The main job, as `make demo` runs it: build two published policies from
# policies/ into one per-deployment binary and compare them on the real model
# (SmolLM2-135M-Instruct, Q4_1) over a real offline text, the GNU coreutils manual (present
# on every Debian system; the GPL-3 text otherwise), at compression ratio 4:
#
#   kvpc ab policies/streaming_llm.kvp policies/h2o.kvp --model M --text T \
#           --ctx N --ratio 4 --set-a recent=N/4-4
#
# The A/B command runs the full-cache reference and both policies over the same N tokens
# (default 2048, about 2.5 minutes on 2 cores; DEMO_TOKENS=4096 takes about 5.5) and prints
# the side-by-side table, the paired bootstrap CI of the per-token NLL difference and the
# verdict; JSON, CSV and SVG reports land in BUILD_DIR/demo/. StreamingLLM's window is set
# to the ratio's budget minus its 4 sinks (its default window of 2000 tokens is larger
# than the budget, which the A/B command rejects). Then a short chat generation.
# Usage: scripts/demo.sh BUILD_DIR MODEL
set -euo pipefail
bdir=$1; model=$2
tokens=${DEMO_TOKENS:-2048}
ratio=4
mkdir -p "$bdir/demo"
text="$bdir/demo/coreutils.txt"
if [ -r /usr/share/info/coreutils.info.gz ]; then
  # iconv -c drops a multi-byte character that the byte cut may have split
  { zcat /usr/share/info/coreutils.info.gz || true; } | head -c $((tokens * 16)) |
    iconv -c -f UTF-8 -t UTF-8 >"$text"
else
  cp /usr/share/common-licenses/GPL-3 "$text"
fi
recent=$((tokens / ratio - 4))
echo "== kvpc ab: streaming_llm (sinks 4 + recent $recent) vs h2o, compression $ratio, $tokens tokens of $(basename "$text")"
echo "   (building the binary, then the full-cache reference and both policies in lockstep; a few minutes on 2 cores)"
start=$(date +%s)
"$bdir/kvpc" ab policies/streaming_llm.kvp policies/h2o.kvp --model "$model" --text "$text" \
  --ctx "$tokens" --ratio "$ratio" --set-a "recent=$recent" \
  --json "$bdir/demo/ab.json" --csv "$bdir/demo/ab.csv" --plot "$bdir/demo/ab.svg"
echo "reports: $bdir/demo/ab.json $bdir/demo/ab.csv $bdir/demo/ab.svg ($(( $(date +%s) - start )) s)"
echo
echo "== generation (greedy, chat template, full cache)"
"$bdir/kvrt" run --model "$model" --chat -n 48 \
  --prompt "What is a KV cache in a transformer language model? Answer in two sentences."
echo
