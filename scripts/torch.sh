#!/usr/bin/env bash
# Install torch (python/requirements-torch.txt) into a venv (default .venv), one package at a time
# and without triton. Safe to re-run.
#
# Why not a plain `pip install torch`: torch from PyPI brings its CUDA libraries (~3 GB installed)
# and triton (~1 GB); pip downloads every wheel of a resolution before it installs any, so one
# `pip install` needs the compressed wheels and the installed files at once, ~8 GB, and CI machines
# have had as little as 9 GB free for the whole run. One package at a time needs the installed
# files and one wheel. triton is only torch.compile's GPU code generator: `import torch`, tensors,
# torch.save/load and the optimizers never import it, and the tests run on CPUs.
#
#   scripts/torch.sh            into .venv
#   scripts/torch.sh VENV_DIR   into another venv
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
py="$venv/bin/python"
req=python/requirements-torch.txt
if "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "torch ready: $("$py" -c 'import torch; print(torch.__version__)') in $venv"
  exit 0
fi
report=$(mktemp)
trap 'rm -f "$report"' EXIT
# What pip would install (metadata only: PyPI serves each wheel's metadata apart, PEP 658).
"$py" -m pip install -q --dry-run --report "$report" -r "$req"
# The large wheels (torch, the CUDA libraries) one per pip run; the rest in one run.
big=() small=()
while read -r size req; do
  if [ "$size" = big ]; then big+=("$req"); else small+=("$req"); fi
done < <("$py" - "$report" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name.lower() == "triton":
        continue
    big = name.lower() == "torch" or name.lower().startswith(("nvidia", "cuda"))
    print("big" if big else "small", f"{name}=={version}")
PY
)
if [ "${#small[@]}" -gt 0 ]; then "$py" -m pip install -q --no-deps "${small[@]}"; fi
for r in "${big[@]}"; do "$py" -m pip install -q --no-deps "$r"; done
"$py" -c 'import torch; print("torch ready:", torch.__version__)'
