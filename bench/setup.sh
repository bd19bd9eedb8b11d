#!/usr/bin/env bash
# Build treepack in release mode into .venv and install the benchmark peers.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(TREEPACK_RELEASE=1 bash scripts/python-env.sh)
"$py" -m pip install -q -r bench/requirements.txt
echo "$py"
