#!/usr/bin/env bash
# Build treepack in release mode into .venv and install the benchmark peers.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(TREEPACK_RELEASE=1 bash scripts/python-env.sh)
"$py" -m pip install -q -r bench/requirements.txt
# fio measures the disk's own bandwidth beside W14 (bench/w14_bench.py); Debian's package.
command -v fio >/dev/null || { [ "$(id -u)" = 0 ] && { apt-get install -y -qq fio >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq fio >/dev/null 2>&1; }; } || echo "fio not installed: W14 runs without the disk's limits" >&2; }
echo "$py"
