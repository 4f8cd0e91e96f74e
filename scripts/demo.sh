#!/usr/bin/env bash
# The main job, as `make demo` runs it: the real model (SmolLM2-135M-Instruct, Q4_1) on a
# real offline text. Prints perplexity over the first 2048 tokens of the GNU coreutils
# manual (present on every Debian system) and a short chat generation.
# Usage: scripts/demo.sh BUILD_DIR MODEL
set -euo pipefail
bdir=$1; model=$2
mkdir -p "$bdir/demo"
text="$bdir/demo/coreutils.txt"
if [ -r /usr/share/info/coreutils.info.gz ]; then
  zcat /usr/share/info/coreutils.info.gz | head -c 200000 >"$text"
else
  cp /usr/share/common-licenses/GPL-3 "$text"
fi
echo "== perplexity: $model on the first 2048 tokens of $(basename "$text") (full KV cache)"
"$bdir/kvrt" ppl --model "$model" --text "$text" --ctx 2048
echo
echo "== generation (greedy, chat template)"
"$bdir/kvrt" run --model "$model" --chat -n 64 \
  --prompt "What is a KV cache in a transformer language model? Answer in two sentences."
echo
