#!/usr/bin/env bash
# Build what `pip install treepack` installs — the wheel and the sdist, into dist/ — then install
# the wheel into a fresh venv for each supported CPython and run the pytest suite against the
# installed package (not the source tree); tests marked `slow` (long soaks, many-process jobs) run
# once, in the main venv, not again per wheel.
#
#   scripts/wheels.sh            build + test on 3.10, 3.11, 3.12 and 3.13
#   scripts/wheels.sh --build    build only
#   TREEPACK_WHEEL_PYTHONS="3.11 3.12" scripts/wheels.sh   a subset
#
# One wheel per CPython version, not one abi3 wheel: abi3 cost 2-3 % more instructions in saves
# and loads (docs/design.md, decision 49). Wheels are stripped of debug symbols and
# manylinux-tagged by maturin's own audit. Interpreters come from pyenv
# ($PYENV_ROOT/versions/3.X.*) or PATH; nothing is downloaded but packages from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
source scripts/venv.sh
.venv/bin/python -m pip install -q "maturin>=1.7,<2"

versions=${TREEPACK_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13}
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
# Test requirements: python/requirements-dev.txt minus the build tool (as a file: lines carry
# environment markers with spaces).
reqs=$(mktemp)
grep -v '^maturin' python/requirements-dev.txt >"$reqs"
# The per-version venvs and their requirements are installed in the background while maturin
# compiles (network, not CPU); each venv then only gets its wheel.
prepare_venvs() {
  local i=0 v py venv
  for v in $versions; do
    py=${pythons[$i]}; i=$((i + 1))
    venv=".wheel-venvs/py$v"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -r "$reqs"
  done
}
venvs_log=$(mktemp)
if [ "${1:-}" != "--build" ]; then
  prepare_venvs >"$venvs_log" 2>&1 &
  venvs_pid=$!
fi
echo "== [${SECONDS}s] maturin build --release: one wheel per CPython ($versions), and the sdist, into dist/" >&2
maturin=(env VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin)
"${maturin[@]}" build -q --release --strip --out dist "${pythons[@]/#/--interpreter=}" >&2
"${maturin[@]}" sdist --out dist >&2
ls -l dist >&2
if [ "${1:-}" = "--build" ]; then exit 0; fi

if ! wait "$venvs_pid"; then cat "$venvs_log" >&2; echo "error: preparing the wheel test venvs failed" >&2; exit 1; fi
root=$PWD
i=0
for v in $versions; do
  py=${pythons[$i]}; i=$((i + 1))
  wheel=$(ls dist/treepack-*-cp"${v/./}"-cp"${v/./}"-*.whl)
  venv=".wheel-venvs/py$v"
  echo "== [${SECONDS}s] CPython $v ($py): fresh venv $venv (requirements installed during the build), pip install $(basename "$wheel"), pytest" >&2
  "$venv/bin/python" -m pip install -q --no-deps "$wheel"
  # From a directory outside the checkout, so that `import treepack` can only find the wheel.
  (cd /tmp && "$root/$venv/bin/python" - "$root" <<'EOF'
import sys, treepack
root = sys.argv[1]
assert not treepack.__file__.startswith(root + "/python/"), treepack.__file__
print(f"treepack {treepack.__version__} from {treepack.__file__}", file=sys.stderr)
EOF
  )
  (cd /tmp && "$root/$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root/python/tests" \
    -c /dev/null -m "not slow" "$root/python/tests")
done

# The sdist builds (what pip does on a platform without a wheel): installed into a fresh venv of
# the last Python, compiled through maturin's PEP 517 backend (sharing this checkout's target dir,
# so only the extension is rebuilt), then used.
echo "== [${SECONDS}s] the sdist: pip install $(basename dist/treepack-*.tar.gz) into a fresh venv (CPython ${v}), save + load" >&2
rm -rf .wheel-venvs/sdist
"$py" -m venv .wheel-venvs/sdist
.wheel-venvs/sdist/bin/python -m pip install -q --upgrade pip >/dev/null
CARGO_TARGET_DIR="$root/target" .wheel-venvs/sdist/bin/python -m pip install -q dist/treepack-*.tar.gz
(cd /tmp && "$root/.wheel-venvs/sdist/bin/python" - <<'EOF'
import os, sys, tempfile
import numpy as np
import treepack
p = os.path.join(tempfile.mkdtemp(), "t")
treepack.save({"w": np.arange(5.0), "n": 1}, p)
back = treepack.load(p)
assert back["n"] == 1 and np.array_equal(back["w"], np.arange(5.0)), back
print(f"sdist: treepack {treepack.__version__} from {treepack.__file__}: saved and loaded", file=sys.stderr)
EOF
)
