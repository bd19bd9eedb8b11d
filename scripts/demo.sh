#!/usr/bin/env bash
# Main job: build treepack, then save, inspect, load back and verify a real example tree.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/demo-tree}"
cargo build --release -j2 -p treepack-cli
rm -rf "$out" "$out.tpk"
./target/release/treepack demo "$out"
echo
echo "== the same tree as one file: $out.tpk"
./target/release/treepack demo "$out.tpk" > /dev/null
./target/release/treepack verify "$out.tpk"
./target/release/treepack cat "$out.tpk" 'params/dense/kernel[0:3, -4:]'
