"""What an installed treepack must carry and say (issue 33): one version everywhere, the type
stubs, and progress bars. scripts/wheels.sh runs this suite against the installed wheel."""

import os
import pathlib
import re
import sys

import numpy as np
import pytest

import treepack

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_one_version_for_crates_wheel_and_module():
    cargo = (ROOT / "Cargo.toml").read_text()
    version = re.search(r'\[workspace\.package\]\s*\nversion = "([^"]+)"', cargo).group(1)
    assert treepack.__version__ == version
    # The path dependencies `cargo package` needs must name the same version.
    for dep in ("treepack", "treepack-alloc"):
        assert re.search(rf'^{dep} = \{{ path = "[^"]+", version = "{re.escape(version)}" \}}$', cargo, re.M), dep
    # The wheel takes its version from Cargo (no second copy in pyproject.toml).
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()


def test_the_package_carries_its_stubs_and_typed_marker():
    pkg = pathlib.Path(treepack.__file__).parent
    assert (pkg / "py.typed").exists()
    stubs = (pkg / "_core.pyi").read_text()
    assert "class Reader" in stubs and "__version__: str" in stubs
    # The stubs parse, and name everything the extension module has (a stub once cut a
    # function's docstring off its `def`, and nothing noticed).
    import ast

    body = ast.parse(stubs).body
    named = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    named |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    named |= {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert sorted(n for n in dir(treepack._core) if not n.startswith("__") and n not in named) == []


def test_progress_true_shows_a_tqdm_bar_for_save_and_load(tmp_path, capsys):
    pytest.importorskip("tqdm", reason="tqdm is in python/requirements-dev.txt")
    tree = {"w": np.arange(1 << 18, dtype=np.float32), "step": 3}
    treepack.save(tree, tmp_path / "t", progress=True)
    err = capsys.readouterr().err
    assert "save" in err and "1.00M" in err, err  # 1 MiB of array bytes, in binary units
    back = treepack.load(tmp_path / "t", progress=True)
    assert np.array_equal(back["w"], tree["w"]) and back["step"] == 3
    assert "load" in capsys.readouterr().err
    handle = treepack.save(tree, tmp_path / "u", progress=True, blocking=False)
    assert handle.result().leaves == 2
    assert "save" in capsys.readouterr().err


def test_progress_false_is_quiet_and_a_callback_still_works(tmp_path, capsys):
    seen = []
    treepack.save({"w": np.ones(1000)}, tmp_path / "t", progress=False)
    treepack.load(tmp_path / "t", progress=lambda done, total: seen.append((done, total)))
    assert capsys.readouterr().err == ""
    assert seen and seen[-1] == (8000, 8000)


def test_progress_true_without_tqdm_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match=r"tqdm is not installed: pip install 'treepack\[progress\]'"):
        treepack.save({"w": np.ones(3)}, tmp_path / "t", progress=True)
    assert not os.path.exists(tmp_path / "t")


def test_progress_of_the_wrong_type_is_refused(tmp_path):
    with pytest.raises(TypeError, match="progress must be True, False, None or a callable"):
        treepack.save({"w": np.ones(3)}, tmp_path / "t", progress="yes")


def test_extras_name_only_what_each_integration_imports():
    from importlib.metadata import metadata

    md = metadata("treepack")
    extras = set(md.get_all("Provides-Extra") or [])
    assert {"jax", "torch", "dask", "zarr", "hdf5", "images", "pandas", "pydantic", "progress", "all"} <= extras, extras
    requires = md.get_all("Requires-Dist") or []
    by_extra = {}
    for r in requires:
        if "extra ==" in r:
            name, extra = r.split(";")[0].strip(), r.split("extra ==")[1].strip().strip("'\"")
            by_extra.setdefault(extra, []).append(name.split(">")[0].split("[")[0].strip().lower())
    assert by_extra["jax"] == ["jax"] and by_extra["images"] == ["pillow"] and by_extra["progress"] == ["tqdm"], by_extra
    assert [r for r in requires if "extra" not in r] == ["numpy>=1.22"], requires
