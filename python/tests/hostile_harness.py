"""Run one hostile case in a child process, as an attacker's file would be met.

Each case is Python source run in a fresh interpreter with a time limit and an address-space
limit (``RLIMIT_AS``). Beside the case's location, the harness keeps an ``outside/`` folder the
case must never touch: a canary file, a canary folder a link may point at, and a canary module
(``treepack_canary``, on ``sys.path``) that records being imported. After the child ends the
harness checks that:

- the child ended by itself (no signal such as SIGSEGV or SIGABRT, no time-out, no kill for
  memory) and reported an outcome;
- nothing under ``outside/`` changed (every file's bytes, every link's target, no file added or
  removed), and the canary module was never imported.

The case's source sees ``LOC`` (a path under the test's temporary folder, for the location),
``OUTSIDE`` (the canary folder) and ``CANARY_MODULE`` (the canary module's name). It either
finishes (outcome ``ok``, with ``result`` if it set one) or raises (outcome ``error`` with the
exception's type, its bases and its message).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Optional, Tuple

CANARY_MODULE = "treepack_canary"

_CHILD = r'''
import json, os, resource, sys, traceback
limit = int(os.environ["HOSTILE_MEM"])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
sys.path.insert(0, os.environ["HOSTILE_MODULES"])
LOC = os.environ["HOSTILE_LOC"]
OUTSIDE = os.environ["HOSTILE_OUTSIDE"]
CANARY_MODULE = os.environ["HOSTILE_CANARY"]
out = {"outcome": "ok"}
try:
    exec(compile(open(os.environ["HOSTILE_CASE"]).read(), "<hostile case>", "exec"))
    r = globals().get("result")
    if r is not None:
        out["result"] = repr(r)[:2000]
except BaseException as e:  # noqa: BLE001 - every outcome is reported
    out = {
        "outcome": "error",
        "type": type(e).__name__,
        "bases": [c.__name__ for c in type(e).__mro__],
        "message": str(e)[:4000],
        "traceback": traceback.format_exc()[-4000:],
    }
sys.stdout.flush()
with open(os.environ["HOSTILE_OUT"], "w") as f:
    json.dump(out, f)
'''


def _snapshot(root: Path) -> Dict[str, Tuple[str, str]]:
    """Every entry under ``root`` (not following links): kind and content hash or link target."""
    snap: Dict[str, Tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                snap[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                snap[rel] = ("dir", "")
            else:
                snap[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return snap


class Hostile:
    """The folders of one test: ``loc`` (the location's path, not created), ``outside`` (the
    canary folder, with ``canary.txt``, ``secret.txt`` and a ``target/`` folder of files)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = Path(tmp_path)
        self.loc = self.tmp / "loc"
        self.outside = self.tmp / "outside"
        self.modules = self.outside / "modules"
        self.modules.mkdir(parents=True, exist_ok=True)
        (self.outside / "canary.txt").write_text("canary: must never change\n")
        (self.outside / "secret.txt").write_text("SECRET-0123456789: must never be read into a tree\n")
        target = self.outside / "target"
        target.mkdir(exist_ok=True)
        (target / "config.json").write_text('{"user": "data"}\n')
        (target / "deadbeef.tpp").write_bytes(b"\0" * 64)
        (target / "x.tpp#1-1").write_bytes(b"\0" * 8)
        (self.modules / f"{CANARY_MODULE}.py").write_text(
            "import os\n"
            f"open(os.path.join({str(self.outside)!r}, 'IMPORTED'), 'w').close()\n"
            "class Boom:\n"
            "    def __init__(self, *a, **k):\n"
            f"        open(os.path.join({str(self.outside)!r}, 'CONSTRUCTED'), 'w').close()\n"
        )
        self.before = _snapshot(self.outside)

    @property
    def secret(self) -> bytes:
        return (self.outside / "secret.txt").read_bytes()

    def run(self, code: str, *, timeout: float = 10.0, mem_bytes: int = 2 << 30, env: Optional[dict] = None) -> dict:
        """Run ``code`` in a child process; return its outcome after checking the child ended
        cleanly and nothing outside changed."""
        case = self.tmp / f"case-{os.getpid()}-{len(list(self.tmp.glob('case-*')))}.py"
        case.write_text(textwrap.dedent(code))
        out_file = case.with_suffix(".out.json")
        child_env = dict(os.environ)
        child_env.update(
            HOSTILE_MEM=str(mem_bytes),
            HOSTILE_MODULES=str(self.modules),
            HOSTILE_LOC=str(self.loc),
            HOSTILE_OUTSIDE=str(self.outside),
            HOSTILE_CANARY=CANARY_MODULE,
            HOSTILE_CASE=str(case),
            HOSTILE_OUT=str(out_file),
        )
        child_env.update(env or {})
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=timeout, env=child_env, cwd=self.tmp
            )
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"hostile case ran past {timeout} s:\n{code}\nstderr: {e.stderr}") from None
        if proc.returncode < 0:
            sig = signal.Signals(-proc.returncode).name
            raise AssertionError(f"hostile case killed by {sig}:\n{code}\nstderr: {proc.stderr[-3000:]}")
        assert proc.returncode == 0 and out_file.exists(), (
            f"hostile case exited with {proc.returncode} without an outcome:\n{code}\nstderr: {proc.stderr[-3000:]}"
        )
        self.check_outside()
        return json.loads(out_file.read_text())

    def check_outside(self) -> None:
        after = _snapshot(self.outside)
        assert not (self.outside / "IMPORTED").exists(), "the canary module was imported"
        assert not (self.outside / "CONSTRUCTED").exists(), "a canary class was constructed"
        changed = {k for k in set(self.before) | set(after) if self.before.get(k) != after.get(k)}
        assert not changed, f"files outside the location changed: {sorted(changed)}"

    def error(self, code: str, *kinds: str, match: Optional[str] = None, **kw) -> dict:
        """Run ``code``; it must raise an exception that is (or derives from) one of ``kinds``,
        whose message contains ``match`` if given."""
        r = self.run(code, **kw)
        assert r["outcome"] == "error", f"expected {kinds}, the case finished: {r}"
        assert any(k in r["bases"] for k in kinds), f"expected {kinds}, got {r['type']}: {r['message']}\n{r['traceback']}"
        if match is not None:
            assert match in r["message"], f"{match!r} not in the message: {r['message']}"
        return r
