#!/usr/bin/env bash
# Create .venv (if needed), install build/test requirements, and build+install the treepack
# Python package into it (maturin develop). Safe to re-run; prints the venv's python path last.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
.venv/bin/python -m pip install -q -r python/requirements-dev.txt -r python/requirements-frameworks.txt
bash scripts/torch.sh >&2
profile_flag=()
if [ "${TREEPACK_RELEASE:-0}" = "1" ]; then profile_flag=(--release); fi
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin develop -q "${profile_flag[@]}" >&2
echo "$PWD/.venv/bin/python"
