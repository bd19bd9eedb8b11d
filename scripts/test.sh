#!/usr/bin/env bash
# Every test: formatting, lints, the crates' API docs and packages, the fuzz targets compiled, the
# Rust unit/integration/property/golden/doc tests, then the Python package built once, in release,
# as the wheels users install, and its pytest suite run against them (scripts/wheels.sh).
#
# The Rust code is compiled three ways: checked (clippy, with the features cargo test uses; cargo
# doc and the fuzz check reuse what it checked), tested (dev profile), and in release for the
# wheels (the dependencies once, the extension once per CPython; the sdist's install reuses the
# dependencies). pytest runs once per CPython at most. Each stage prints "== [Ns] stage"; the end,
# how long each took.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# The viewer's browser test fails, rather than skips, when Chromium is missing (scripts/browser.sh
# installs it below).
export TREEPACK_REQUIRE_BROWSER="${TREEPACK_REQUIRE_BROWSER:-1}"
# Installs that wait on the network, not the CPU (the object-store servers, then the Python test
# and framework requirements, then Chromium for the viewer's browser test: scripts/browser.sh),
# run in the background while the Rust checks below compile; on a fresh machine that hides
# minutes. The Python ones go into .venv, one after the other (never two pips in one venv at once).
# torch is not among them: scripts/wheels.sh installs it just before .venv's suite, once the
# Rust build's ~3 GB are gone (scripts/torch.sh says why).
setup_log=$(mktemp)
(bash scripts/servers.sh && .venv/bin/python -m pip install -q -r python/requirements-dev.txt \
  -r python/requirements-frameworks.txt && bash scripts/browser.sh) >"$setup_log" 2>&1 &
setup_pid=$!
finish_setup() {
  if ! wait "$setup_pid"; then cat "$setup_log" >&2; echo "error: installing the test servers or requirements failed" >&2; exit 1; fi
  cat "$setup_log"
}
stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy (every crate, all targets, -D warnings; the failpoints feature as cargo test builds it)"
cargo clippy --workspace --all-targets --features treepack/failpoints -- -D warnings
stage "cargo doc (every crate's API docs, -D warnings: every public item documented, no broken links)"
# Libraries and binaries apart: the CLI's binary and the library are both called `treepack`, and
# one cargo doc of both would write one over the other.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --bins --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib --quiet
stage "fuzz targets compile (cargo check in fuzz/, sharing target/ with the checks above)"
# fuzz/ is its own workspace; with this workspace's target dir and dev profile, the dependencies
# the two lock files agree on are already checked (keep these in step with Cargo.toml's profile).
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
(cd fuzz && CARGO_TARGET_DIR="$target_dir" cargo check --quiet --config 'profile.dev.debug="line-tables-only"' \
  --config 'profile.dev.package."*".opt-level=2' --config 'profile.dev.package."*".debug=false')
stage "cargo package (the crates as crates.io would get them; without --no-verify it would also build each, minutes)"
cargo package -p treepack-format -p treepack-store -p treepack -p treepack-alloc -p treepack-view -p treepack-cli --allow-dirty --no-verify --quiet
stage "wait for the background installs: local object-store servers (moto, azurite, gcp-storage-emulator), the Python requirements, Chromium"
finish_setup
stage "cargo test --no-run (core + CLI, with the failpoints feature the crash tests need)"
if [ -n "${TREEPACK_LEAN_DISK:-}" ]; then
  # CI: test binaries without line tables, about half their size (~1.2 GB over ~45 binaries,
  # on disk beside the wheels' build); a failing assertion still names its file and line.
  export CARGO_PROFILE_DEV_DEBUG=0
fi
cargo test --features treepack/failpoints --no-run
# The tests themselves mostly wait (child processes killed at random moments, the object-store
# servers, sleeps), so they run in the background while the wheels compile in release (another
# profile directory, so no lock is shared); scripts/wheels.sh waits for them before its suites
# and fails if they did. Remote tests start their servers on 127.0.0.1.
stage "cargo test, in the background while the wheels compile (its output follows the wheels' build)"
rust_status=$(mktemp) rust_log=$(mktemp)
rm -f "$rust_status"
(
  rc=0
  cargo test --features treepack/failpoints >"$rust_log" 2>&1 || rc=$?
  if [ -n "${TREEPACK_LEAN_DISK:-}" ]; then
    # CI (.ci/run) gives the Python stage the disk the dev profile held (~3-4 GB: test binaries,
    # rlibs, clippy's metadata). Only the CLI binary the Python suite runs stays:
    # target/debug/treepack is a hard link, so it outlives deps/.
    find target/debug -mindepth 1 -maxdepth 1 ! -name treepack -exec rm -rf {} +
  fi
  echo "$rc" >"$rust_status"
) &
rust_pid=$!
export TREEPACK_RUST_TESTS="$rust_pid:$rust_status:$rust_log"
stop_with_script "$rust_pid"
stage "the wheels and the Python suite (scripts/wheels.sh --main-venv)"
bash scripts/wheels.sh --main-venv
