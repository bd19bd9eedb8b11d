"""GGUF files (llama.cpp's models) read as trees (issue 54): the fixture gguf-py wrote
(crates/treepack/tests/data/gguf/make_fixtures.py), loaded, opened, listed and converted as the
flat mapping of tensors it holds, its metadata the tree's, quantized tensors as their bytes with
their ggml type named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import treepack

DATA = Path(__file__).resolve().parents[2] / "crates" / "treepack" / "tests" / "data" / "gguf"
FILE = DATA / "gguf_py.gguf"


def expected():
    return json.loads((DATA / "expected.json").read_text())


def test_a_gguf_file_loads_as_its_tensors_with_its_metadata(tmp_path):
    want = expected()
    t = treepack.load(FILE)
    assert list(t) == want["order"]
    for name, w in want["tensors"].items():
        a = t[name]
        assert isinstance(a, np.ndarray), name
        assert a.tobytes().hex() == w["hex"], name
    assert treepack.open(FILE).metadata == want["metadata"]
    s = treepack.load_structure(FILE)
    assert set(s) == set(want["order"])
    # Read-only; converted into treepack it is the same tree.
    with pytest.raises(Exception, match="GGUF file"):
        treepack.save({"x": np.ones(2)}, FILE)
    treepack.convert(FILE, tmp_path / "m.tpk")
    back = treepack.load(tmp_path / "m.tpk")
    assert all(np.array_equal(back[k], t[k]) for k in t)
    with pytest.raises(ValueError, match="does not write them"):
        treepack.convert(tmp_path / "m.tpk", tmp_path / "x.gguf", to_format="gguf")


def test_a_truncated_gguf_file_is_refused_naming_it(tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(FILE.read_bytes()[:100])
    r = subprocess.run([sys.executable, "-c", f"import treepack; treepack.load({str(cut)!r})"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "cut.gguf" in r.stderr and "Traceback" in r.stderr, r.stderr[-2000:]
    assert "Segmentation" not in r.stderr
