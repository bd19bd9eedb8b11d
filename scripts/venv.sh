# Sourced by the set-up scripts: create .venv with an up-to-date pip if it does not exist yet.
# Expects to run from the repository root; PYTHON picks the interpreter (default python3).
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
