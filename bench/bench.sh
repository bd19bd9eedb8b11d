#!/usr/bin/env bash
# The one benchmark command: bash bench/bench.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash bench/setup.sh)
"$py" bench/run.py "$@"
