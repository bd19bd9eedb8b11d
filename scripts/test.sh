#!/usr/bin/env bash
# Every test: formatting, lints, Rust unit/integration/property/golden/doc tests, then the Python
# package is built into .venv and its pytest suite runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# Installs that wait on the network, not the CPU (the object-store servers, then the Python test
# and framework requirements), run in the background while the Rust checks below compile; on a
# fresh machine that hides minutes. Both go into .venv, one after the other (never two pips in
# one venv at once).
setup_log=$(mktemp)
(bash scripts/servers.sh && .venv/bin/python -m pip install -q -r python/requirements-dev.txt \
  -r python/requirements-frameworks.txt) >"$setup_log" 2>&1 &
setup_pid=$!
finish_setup() {
  if ! wait "$setup_pid"; then cat "$setup_log" >&2; echo "error: installing the test servers or requirements failed" >&2; exit 1; fi
  cat "$setup_log"
}
echo "== [${SECONDS}s] cargo fmt --check"
cargo fmt --all -- --check
echo "== [${SECONDS}s] cargo clippy (all crates, all targets)"
cargo clippy --workspace --all-targets --features treepack/failpoints -j2 -- -D warnings
echo "== [${SECONDS}s] fuzz targets compile (cargo check in fuzz/)"; (cd fuzz && cargo check -j2 --quiet)
echo "== [${SECONDS}s] cargo doc (the library's API docs: every public item documented, no broken links)"
RUSTDOCFLAGS="-D warnings" cargo doc -p treepack-format -p treepack --no-deps -j2 --quiet
echo "== [${SECONDS}s] cargo package (the crates as crates.io would get them; \`cargo package\` without --no-verify also builds them, about 2.5 min)"
cargo package -p treepack-format -p treepack -p treepack-alloc -p treepack-cli --allow-dirty --no-verify --quiet
echo "== [${SECONDS}s] local object-store servers for the remote tests (moto, azurite, fake-gcs-server, gcp-storage-emulator), installed in the background"
finish_setup
echo "== [${SECONDS}s] cargo test (core + CLI; remote tests start their servers on 127.0.0.1; crash tests need the failpoints feature)"
cargo test -j2 --features treepack/failpoints
echo "== [${SECONDS}s] python package: build into .venv"
py=$(bash scripts/python-env.sh)
echo "== [${SECONDS}s] pytest"
"$py" -m pytest -q python/tests
echo "== [${SECONDS}s] the wheels: built (release, one per CPython 3.10-3.13), each installed into a fresh venv, pytest there"
bash scripts/wheels.sh
