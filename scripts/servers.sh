#!/usr/bin/env bash
# Install the local object-store servers the remote tests start on 127.0.0.1:
#   moto_server (S3), gcp-storage-emulator (GCS), azurite-blob (Azure, from npm).
# They go into .venv (Python ones) and .tools/ (azurite). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
.venv/bin/python -m pip install -q -r tests/servers/requirements.txt
if [ ! -x .tools/node_modules/.bin/azurite-blob ]; then
  mkdir -p .tools
  (cd .tools && npm install --no-audit --no-fund --silent --prefix . azurite@3 >/dev/null)
fi
echo "servers ready: $(ls .venv/bin/moto_server .venv/bin/gcp-storage-emulator .tools/node_modules/.bin/azurite-blob | tr '\n' ' ')"
