"""The layering of the Python package (docs/architecture.md, "The Python packages: integrations
as plug-ins"), kept true by tests: the generic layer imports no framework integration and no
framework, the integrations reach treepack only through its extension API (treepack._plugin),
and an integration is imported the first time a value, a node type or an option of its framework
is met."""

import ast
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

import treepack
from treepack import _registry

PACKAGE = pathlib.Path(treepack.__file__).parent

#: Libraries the generic layer must not import (numpy it may). zarr and h5py are the converters'
#: backends, allowed in _hierarchy.py alone.
FRAMEWORKS = frozenset({
    "torch", "jax", "jaxlib", "flax", "optax", "dask", "distributed", "pandas", "PIL", "xarray", "awkward",
    "pydantic", "zarr", "h5py", "sklearn", "transformers",
})
ALLOWED = {"_hierarchy.py": {"zarr", "h5py"}}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path):
    """(line, names) for every import in the file, at the top or in a function: ``import a.b``
    gives ``("a.b",)``, ``from a import b`` gives ``("a", "a.b")`` (b may be a module or a name
    in a), with relative imports made absolute."""
    tree = ast.parse(path.read_text(), str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, (alias.name,)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                yield node.lineno, (mod, f"{mod}.{alias.name}")


def _generic_modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "integrations" not in p.relative_to(PACKAGE).parts)


def _integration_modules():
    return sorted((PACKAGE / "integrations").rglob("*.py"))


def test_the_generic_layer_imports_no_integration_and_no_framework():
    assert len(_generic_modules()) > 15 and (PACKAGE / "_api.py") in _generic_modules()
    bad = []
    for path in _generic_modules():
        rel = path.relative_to(PACKAGE).as_posix()
        for line, names in _imports(path):
            for mod in names:
                top = mod.partition(".")[0]
                if mod == "treepack.integrations" or mod.startswith("treepack.integrations."):
                    bad.append(f"{rel}:{line} imports {mod}")
                elif top in FRAMEWORKS and top not in ALLOWED.get(rel, ()):
                    bad.append(f"{rel}:{line} imports {mod}")
        # Nor by name through importlib: only the registry's table names integration modules.
        if rel != "_registry.py":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and "treepack.integrations" in node.value:
                    bad.append(f"{rel}:{node.lineno} names {node.value!r}")
    assert not bad, "the generic layer reaches an integration or a framework:\n" + "\n".join(bad)


def test_integrations_reach_treepack_only_through_the_plugin_api():
    bad = []
    for path in _integration_modules():
        for line, names in _imports(path):
            if names[0].partition(".")[0] != "treepack":
                continue
            if any(m == "treepack._plugin" or m.startswith(("treepack._plugin.", "treepack.integrations")) for m in names):
                continue
            bad.append(f"{path.relative_to(PACKAGE)}:{line} imports {names[-1]}")
    assert not bad, "integrations must use treepack._plugin, not the generic layer's modules:\n" + "\n".join(bad)


def test_the_table_and_the_registrations_agree():
    import importlib

    for e in _registry.INTEGRATIONS:
        importlib.import_module(e.module)  # (integrate() refuses a module that disagrees with its entry)
        h = _registry.handlers(e)
        for name in e.nodes + e.class_nodes:
            assert _registry.node_decoder(name) is h.nodes[name]
        for t in e.arrays:
            assert _registry.array_handlers(t) is h
        assert set(e.partial_nodes) <= set(e.nodes + e.class_nodes) and set(e.file_nodes) <= set(e.nodes)
        assert set(e.location_options) <= set(e.options)
    # Every name leads to one integration.
    for field in ("frameworks", "nodes", "arrays", "options", "methods"):
        names = [n for e in _registry.INTEGRATIONS for n in getattr(e, field)]
        assert len(names) == len(set(names)), field
    assert all(n not in treepack._codec.builtins.BUILTIN_TYPES - _registry.NODES for n in _registry.CLASS_NODES)


def _fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter, with ``loaded()`` (the integrations and frameworks
    imported so far); it prints one JSON line last."""
    prelude = (
        "import json, sys\n"
        "def loaded():\n"
        f"    frameworks = {sorted(FRAMEWORKS)!r}\n"
        "    return sorted(m for m in sys.modules\n"
        "                  if m.startswith('treepack.integrations') or m.partition('.')[0] in frameworks)\n"
    )
    out = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_treepack_imports_no_framework_and_no_integration():
    got = _fresh(f"""
        before = set(loaded())  # (whatever site customisation imported)
        import treepack
        print(json.dumps(sorted(set(loaded()) - before)))
    """)
    assert got == []


def test_an_integration_is_imported_when_a_value_node_or_option_of_its_framework_is_met(tmp_path):
    pytest.importorskip("pandas")
    got = _fresh(f"""
        import dataclasses, datetime as dt
        from collections import OrderedDict
        import numpy as np
        import treepack

        @dataclasses.dataclass
        class Point:
            x: int

        out = {{}}
        tz = dt.timezone(dt.timedelta(hours=2))
        plain = {{"a": np.ones(3), "t": dt.datetime(2026, 1, 2, tzinfo=tz), "p": Point(1), "s": {{1, 2}},
                  "o": OrderedDict(x=1)}}
        treepack.save(plain, {str(tmp_path / "plain")!r})
        treepack.load({str(tmp_path / "plain")!r}, trust=["__main__.*"])
        out["plain"] = loaded()
        import pandas as pd
        treepack.save({{"df": pd.DataFrame({{"x": [1, 2]}})}}, {str(tmp_path / "df")!r})
        out["dataframe"] = [m for m in loaded() if m.startswith("treepack.integrations.")]
        treepack.load({str(tmp_path / "plain")!r}, trust=["__main__.*"], map_location=None)
        out["option"] = [m for m in loaded() if (m.startswith("treepack.integrations.") and m.count(".") == 2) or m == "torch"]
        print(json.dumps(out))
    """)
    assert got["plain"] == []
    assert got["dataframe"] == ["treepack.integrations.pandas"]
    assert got["option"] == ["treepack.integrations.pandas", "treepack.integrations.torch"]  # (not torch itself)
    got = _fresh(f"""
        import treepack
        df = treepack.load({str(tmp_path / "df")!r})["df"]
        print(json.dumps([df["x"].tolist(), loaded()]))
    """)
    assert got[0] == [1, 2]
    assert [m for m in got[1] if m.startswith("treepack.integrations.")] == ["treepack.integrations.pandas"]


def test_an_unknown_load_option_is_a_type_error_naming_it(tmp_path):
    treepack.save({"x": 1}, tmp_path / "t")
    with pytest.raises(TypeError, match="unexpected keyword argument 'map_locaton'"):
        treepack.load(tmp_path / "t", map_locaton="cpu")
    with pytest.raises(TypeError, match="'bogus'"):
        treepack.loads(treepack.dumps({"x": 1}), bogus=True)
    assert treepack.load(tmp_path / "t", map_location=None, dask=False) == {"x": 1}


class _Unhashable(type):
    """A metaclass that makes its classes unhashable (it defines ``__eq__`` alone)."""

    def __eq__(cls, other):
        return cls is other

    __hash__ = None


class Odd(metaclass=_Unhashable):
    def __init__(self, x):
        self.x = x


def test_the_lookup_by_class_takes_classes_it_cannot_cache():
    # A value's integration is looked up by its class, cached by class; a class its metaclass
    # makes unhashable is looked up without the cache (a save then goes on as it did before).
    assert _registry.for_type(Odd) is None
    assert _registry.for_type(Odd) is None
