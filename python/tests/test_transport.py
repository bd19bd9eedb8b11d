"""JSON transport (docs/transport.md): dumps/loads, a .json document as a location, export_json,
and the JSON Schema of a tree's type checked with a real validator (jsonschema)."""

import dataclasses
import json

import jsonschema
import numpy as np
import pytest

import treepack


@dataclasses.dataclass
class Run:
    name: str
    steps: int


def tree():
    w = np.linspace(-1, 1, 20000, dtype=np.float32).reshape(100, 200)
    shared = [1, 2, 3]
    return {
        "params": {"w": w, "b": np.arange(7, dtype=np.int64), "half": np.ones(300, dtype=np.float16)},
        "cfg": {"lr": 3e-4, "name": "run-7", "tags": ("a", "b"), "none": None, "big": 2**70, "nan": float("nan")},
        "blob": bytes(range(256)) * 40,
        "text": "x" * 5000,
        "a": shared,
        "again": shared,
    }


def same(a, b):
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def test_dumps_and_loads_round_trip_values_identity_and_root(tmp_path):
    t = tree()
    doc = treepack.dumps(t)
    assert isinstance(doc, str) and doc.startswith('{"format":"treepack-json","version":[1,0],')
    # Plain JSON a person or any tool can read: the structure and small values are there.
    parsed = json.loads(doc)
    assert parsed["encoding"] == "base85"
    assert '"run-7"' in doc and "preview" in doc
    back = treepack.loads(doc)
    assert same(back, t)
    assert back["a"] is back["again"]
    # The document has the root hash the tree has when saved.
    treepack.save(t, tmp_path / "t")
    assert treepack.loads(doc, expect_root=treepack.root_hash(tmp_path / "t"))["cfg"]["name"] == "run-7"
    # A saved tree exports to the very same document.
    assert treepack.export_json(tmp_path / "t") == doc


def test_compression_and_encodings_and_what_they_cost():
    t = {"w": np.zeros((512, 512), np.float32), "x": np.arange(1 << 16, dtype=np.int32)}
    raw85 = treepack.dumps(t)
    raw64 = treepack.dumps(t, encoding="base64")
    z = treepack.dumps(t, compression="zstd")
    nbytes = t["w"].nbytes + t["x"].nbytes
    assert nbytes * 1.25 < len(raw85) < nbytes * 1.26 + 4096
    assert nbytes * 4 / 3 < len(raw64) < nbytes * 4 / 3 + 4096
    assert len(z) < nbytes / 10
    for d in (raw85, raw64, z):
        assert same(treepack.loads(d), t)
    with pytest.raises(ValueError, match="unknown encoding"):
        treepack.dumps(t, encoding="base91")
    with pytest.raises(TypeError, match="storage_options"):
        treepack.dumps(t, storage_options={})


def test_loads_is_strict_and_partial():
    doc = treepack.dumps({"run": Run("r", 3), "w": np.arange(10.0)})
    with pytest.raises(treepack.UntrustedTypeError, match="Run"):
        treepack.loads(doc)
    assert treepack.loads(doc, trust=[f"{__name__}:Run"])["run"] == Run("r", 3)
    assert treepack.loads(doc, select=["w"])["run"] is None
    with pytest.raises(TypeError, match="dask"):
        treepack.loads(doc, dask=True)


def test_damaged_documents_say_what_is_wrong():
    doc = treepack.dumps({"w": np.arange(1000.0), "lr": 0.1})
    with pytest.raises(treepack.FormatError, match="cut short"):
        treepack.loads(doc[:20])
    with pytest.raises(treepack.FormatError, match="transport document begins with"):
        treepack.loads("[1, 2, 3]")
    with pytest.raises(treepack.CorruptError, match="checksum"):
        treepack.loads(doc.replace('"lr"', '"LR"'))
    data_at = doc.index('"data":"') + 8
    with pytest.raises(treepack.FormatError, match="not valid base85"):
        treepack.loads(doc[:data_at] + "'" + doc[data_at + 1:])
    # Data damaged inside valid base85: the chunk's hash catches it.
    flipped = doc[:data_at + 40] + ("0" if doc[data_at + 40] != "0" else "1") + doc[data_at + 41:]
    with pytest.raises(treepack.CorruptError, match="corrupt"):
        treepack.loads(flipped)


def test_a_json_document_on_disk_is_a_location(tmp_path):
    t = tree()
    p = tmp_path / "tree.json"
    p.write_text(treepack.dumps(t, compression="auto"))
    assert same(treepack.load(p), t)
    st = treepack.load_structure(p)
    assert st["params"]["w"].shape == (100, 200) and st["params"]["w"].dtype == "float32"
    r = treepack.open(p)
    assert np.array_equal(r["params"]["w"][10:12, :5], t["params"]["w"][10:12, :5])
    assert treepack.verify(p).ok
    with pytest.raises(PermissionError, match="treepack import"):
        treepack.save({"x": 1}, p, overwrite=True)


def test_the_schema_validates_documents_of_the_same_type_only(tmp_path):
    t = tree()
    treepack.save(t, tmp_path / "t")
    schema = treepack.schema(tmp_path / "t")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    check = jsonschema.Draft202012Validator(schema)
    check.validate(json.loads(treepack.dumps(t)))
    # Same type, other values and another batch size: valid.
    other = tree()
    other["params"]["w"] = np.zeros((3, 200), np.float32)
    other["cfg"]["lr"] = 1.0
    other["cfg"]["name"] = "y" * 9000
    check.validate(json.loads(treepack.dumps(other, compression="zstd")))
    # Another dtype, a missing key, a renamed key, a list for a tuple: each invalid.
    for change in (
        lambda u: u["params"].__setitem__("w", u["params"]["w"].astype(np.float64)),
        lambda u: u["cfg"].pop("none"),
        lambda u: u.__setitem__("text2", u.pop("text")),
        lambda u: u["cfg"].__setitem__("tags", ["a", "b"]),
        lambda u: u["params"].__setitem__("b", np.arange(7, dtype=np.int64).reshape(7, 1)),
    ):
        u = tree()
        change(u)
        with pytest.raises(jsonschema.ValidationError):
            check.validate(json.loads(treepack.dumps(u)))
