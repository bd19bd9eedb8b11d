#!/usr/bin/env bash
# Every test: formatting, lints, Rust unit/integration/doc tests (and the Python suite once it exists).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -j2 -- -D warnings
echo "== cargo test"
cargo test --workspace -j2
