#!/usr/bin/env bash
# Build what `pip install treepack` installs — one wheel per supported CPython and the sdist, into
# dist/ — then test them as installed (not the source tree):
#   - the oldest and the newest CPython: the wheel in a fresh venv with the test requirements,
#     pytest without the tests marked `slow` (long soaks, many-process jobs);
#   - each CPython between them: the wheel in a fresh venv, imported, a tree saved and loaded;
#   - the sdist: pip-installed into a fresh venv of the newest CPython (maturin's PEP 517 backend
#     compiles it), a tree saved and loaded.
# With --main-venv (what scripts/test.sh runs), the wheel for .venv's Python also replaces the
# package in .venv (`scripts/python-env.sh` puts an editable build back) and the whole suite runs
# there, slow tests and framework integrations (torch, JAX, Dask, ...) included, after the fresh
# venvs' suites and after scripts/torch.sh; that CPython then gets no second pytest run in a fresh
# venv. pytest runs once per CPython at most. The sdist compiles in the background (niced) while
# the fresh venvs' suites run. (The fresh venvs' suites side by side
# took as long as one after the other: both are CPU-bound on 2 cores.)
#
#   scripts/wheels.sh              build + test on 3.10-3.13
#   scripts/wheels.sh --build      build only
#   scripts/wheels.sh --main-venv  build + test, and the whole suite in .venv
#   TREEPACK_WHEEL_PYTHONS="3.11 3.12" scripts/wheels.sh     a subset
#   TREEPACK_WHEEL_PYTEST="3.10 3.11 3.12 3.13" scripts/wheels.sh   pytest on these (default:
#                                                                    the oldest and the newest)
#
# One wheel per CPython version, not one abi3 wheel: abi3 cost 2-3 % more instructions in saves
# and loads (docs/design.md, decision 49). Wheels are stripped of debug symbols and
# manylinux-tagged by maturin's own audit. Interpreters come from pyenv
# ($PYENV_ROOT/versions/3.X.*) or PATH; nothing is downloaded but packages from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# The wheels are stripped, so the release profile's line tables (Cargo.toml, for profiling) would
# be compiled only to be thrown away: without them the release build takes about a fifth less.
export CARGO_PROFILE_RELEASE_DEBUG=${CARGO_PROFILE_RELEASE_DEBUG:-0}
# pyo3's pool of references dropped without the GIL is compiled out of the wheels (design decision
# 101): treepack lets go of those through memory::Held, and a `Py` dropped without the GIL
# anywhere else aborts with pyo3's message, in the suites below first, instead of queueing under
# a lock that a fork can catch held. The sdist's build below gets the same flags (and so reuses
# the compiled dependencies); a user's build from the sdist keeps the pool.
export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }--cfg pyo3_disable_reference_pool"
mode=${1:-}
case "$mode" in ""|--build|--main-venv) ;; *) echo "usage: $0 [--build|--main-venv]" >&2; exit 2;; esac
source scripts/venv.sh
.venv/bin/python -m pip install -q "maturin>=1.7,<2"

in_list() { case " $2 " in *" $1 "*) return 0;; *) return 1;; esac; }
versions=${TREEPACK_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13}
sorted=$(printf '%s\n' $versions | sort -V)
oldest=$(echo "$sorted" | head -1) newest=$(echo "$sorted" | tail -1)
pytest_versions=${TREEPACK_WHEEL_PYTEST:-$oldest $newest}
main_v=""
if [ "$mode" = --main-venv ]; then
  main_v=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  # .venv's CPython gets a wheel even where the list leaves it out.
  in_list "$main_v" "$versions" || versions="$versions $main_v"
fi
rm -rf dist
find_python() {
  local v=$1 root
  root=${PYENV_ROOT:-$HOME/.pyenv}
  for p in $(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r) $(command -v "python$v" || true); do
    if "$p" -c 'import sys, venv' >/dev/null 2>&1; then echo "$p"; return 0; fi
  done
  return 1
}

pythons=()
for v in $versions; do
  py=$(find_python "$v") || { echo "error: no CPython $v found under pyenv or on PATH (set TREEPACK_WHEEL_PYTHONS to build fewer)" >&2; exit 1; }
  pythons+=("$py")
done
python_of() { local i=0 v; for v in $versions; do [ "$v" = "$1" ] && echo "${pythons[$i]}"; i=$((i + 1)); done; }
newest_py=$(python_of "$newest")
# Test requirements: python/requirements-dev.txt minus the build tool (as a file: lines carry
# environment markers with spaces).
reqs=$(mktemp)
grep -v '^maturin' python/requirements-dev.txt >"$reqs"
# What each CPython's wheel gets: "main" (the whole suite in .venv), "pytest" (a fresh venv with
# the test requirements) or "smoke" (a fresh venv with numpy: import, save, load).
kind_of() {
  if [ "$1" = "$main_v" ]; then echo main
  elif in_list "$1" "$pytest_versions"; then echo pytest
  else echo smoke; fi
}
# The fresh venvs and their requirements are installed in the background while maturin compiles
# (network, not CPU); each venv then only gets its wheel.
prepare_venvs() {
  local i=0 v py venv kind
  for v in $versions; do
    py=${pythons[$i]}; i=$((i + 1))
    kind=$(kind_of "$v")
    [ "$kind" = main ] && continue
    venv=".wheel-venvs/py$v"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    if [ "$kind" = pytest ]; then
      "$venv/bin/python" -m pip install -q -r "$reqs"
    else
      "$venv/bin/python" -m pip install -q "numpy>=1.22"
    fi
  done
  rm -rf .wheel-venvs/sdist
  "$newest_py" -m venv .wheel-venvs/sdist
  .wheel-venvs/sdist/bin/python -m pip install -q --upgrade pip >/dev/null
}
venvs_log=$(mktemp)
if [ "$mode" != --build ]; then
  prepare_venvs >"$venvs_log" 2>&1 &
  venvs_pid=$!
fi
stage "maturin build --release: one wheel per CPython ($versions), and the sdist, into dist/"
maturin=(env VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin)
# When test.sh runs the Rust tests beside this build (TREEPACK_RUST_TESTS), they go first.
niceness=0
[ -n "${TREEPACK_RUST_TESTS:-}" ] && niceness=5
nice -n "$niceness" "${maturin[@]}" build -q --release --strip --out dist "${pythons[@]/#/--interpreter=}" >&2
"${maturin[@]}" sdist --out dist >&2
ls -l dist >&2
if [ -n "${TREEPACK_RUST_TESTS:-}" ]; then
  # "pid:status file:log" from test.sh: the Rust tests ran in the background during the build.
  stage "wait for the Rust tests (cargo test, run in the background while the wheels compiled)"
  IFS=: read -r rust_pid rust_status rust_log <<<"$TREEPACK_RUST_TESTS"
  while [ ! -s "$rust_status" ] && kill -0 "$rust_pid" 2>/dev/null; do sleep 1; done
  cat "$rust_log" >&2
  rust_rc=$(cat "$rust_status" 2>/dev/null || echo "none: the run was stopped")
  if [ "$rust_rc" != 0 ]; then echo "error: the Rust tests failed (exit status $rust_rc)" >&2; exit 1; fi
fi
if [ "$mode" = --build ]; then exit 0; fi

root=$PWD
# Run from outside the checkout (cd /tmp), so that `import treepack` can only find what is
# installed; checks that it does, then saves and loads a tree.
smoke() {
  (cd /tmp && "$1" - "$root" <<'EOF'
import os, sys, tempfile
import numpy as np
import treepack
root = sys.argv[1]
assert not treepack.__file__.startswith(os.path.join(root, "python", "")), treepack.__file__
p = os.path.join(tempfile.mkdtemp(), "t")
treepack.save({"w": np.arange(5.0), "n": 1, "s": "x"}, p)
back = treepack.load(p)
assert back["n"] == 1 and back["s"] == "x" and np.array_equal(back["w"], np.arange(5.0)), back
print(f"treepack {treepack.__version__} from {treepack.__file__}: imported, saved and loaded", file=sys.stderr)
EOF
  )
}
wheel_for() { ls dist/treepack-*-cp"${1/./}"-cp"${1/./}"-*.whl; }

if ! wait "$venvs_pid"; then cat "$venvs_log" >&2; echo "error: preparing the wheel test venvs failed" >&2; exit 1; fi
# The sdist builds (what pip does on a platform without a wheel): installed into a fresh venv of
# the newest Python, compiled through maturin's PEP 517 backend (sharing this checkout's target
# dir, so the dependencies are not compiled again), then used. It compiles in the background,
# niced, while the suites below run: they leave a core idle much of the time (servers, child
# processes, files), and the compile fills it.
sdist=$(ls dist/treepack-*.tar.gz)
sdist_log=$(mktemp)
stage "the sdist: pip install $(basename "$sdist") into a fresh venv ($newest_py, PEP 517 build), in the background while the suites run"
(CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" CARGO_BUILD_JOBS=1 nice -n 10 \
  .wheel-venvs/sdist/bin/python -m pip install -q "$sdist" && smoke "$root/.wheel-venvs/sdist/bin/python") \
  >"$sdist_log" 2>&1 &
sdist_pid=$!
stop_with_script "$sdist_pid"

i=0
for v in $versions; do
  py=${pythons[$i]}; i=$((i + 1))
  kind=$(kind_of "$v")
  [ "$kind" = main ] && continue
  wheel=$(wheel_for "$v")
  venv=".wheel-venvs/py$v"
  if [ "$kind" = pytest ]; then
    stage "CPython $v ($py): $(basename "$wheel") into a fresh venv ($venv, requirements installed during the build), pytest -m 'not slow'"
  else
    stage "CPython $v ($py): $(basename "$wheel") into a fresh venv ($venv), imported, a tree saved and loaded"
  fi
  "$venv/bin/python" -m pip install -q --no-deps "$wheel"
  smoke "$root/$venv/bin/python"
  if [ "$kind" = pytest ]; then
    # (-c /dev/null leaves pyproject.toml's settings out: its tmp_path retention is said again.)
    (cd /tmp && "$root/$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root/python/tests" \
      -c /dev/null -o tmp_path_retention_policy=failed -o tmp_path_retention_count=1 -m "not slow" \
      "$root/python/tests")
  fi
  # CI (TREEPACK_LEAN_DISK): each fresh venv (~0.8 GB with the test requirements) goes once used.
  if [ -n "${TREEPACK_LEAN_DISK:-}" ]; then rm -rf "$venv"; fi
done
stage "wait for the sdist's build (started in the background above)"
rc=0
wait "$sdist_pid" || rc=$?
cat "$sdist_log" >&2
if [ "$rc" != 0 ]; then echo "error: the sdist did not install or its smoke test failed (exit status $rc)" >&2; exit 1; fi

if [ -n "$main_v" ]; then
  # .venv's suite comes last, after the fresh venvs and the release build are gone (in CI), so that
  # torch's CUDA libraries (~4 GB, installed only now) never share the disk with them.
  if [ -n "${TREEPACK_LEAN_DISK:-}" ]; then rm -rf .wheel-venvs target/release; fi
  stage "torch into .venv (scripts/torch.sh: one package at a time, without triton; a no-op where it is installed)"
  bash scripts/torch.sh
  wheel=$(wheel_for "$main_v")
  stage "CPython $main_v (.venv): pip install $(basename "$wheel") into .venv, the whole pytest suite (slow tests and framework integrations included)"
  .venv/bin/python -m pip install -q --force-reinstall --no-deps "$wheel"
  smoke "$root/.venv/bin/python"
  .venv/bin/python -m pytest -q python/tests
fi
