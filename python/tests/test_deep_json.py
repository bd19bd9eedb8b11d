"""JSON nested 100,000 deep wherever a file holds free JSON (issue 50, finding 3): a manifest's
``metadata``, a custom node's ``data``, an array's ``as``, ``preview`` and structured ``dtype``, a
transport document's manifest; and a safetensors tensor name with 20,000 dots. Each used to kill
the interpreter (SIGSEGV: the core recursed once per level). Each case runs in a child process
(``attack`` fixture: no signal, nothing outside changed) and must raise a ``TreepackError`` naming
the file and the member, from every entry point that reads the file.
"""

import json
import struct

import blake3
import pytest

DEEP = 100_000
LISTS = "[" * DEEP + "]" * DEEP
TOO_DEEP = "JSON nested deeper than 128 levels"


def manifest(root: str = "1", metadata: str = "") -> bytes:
    """A sealed manifest in the writer's layout: its checksum holds, so the parse is what refuses it."""
    md = f'\n"metadata":{metadata},' if metadata else ""
    body = '{"format":"treepack","version":[1,4],\n"writer":"deep",' + md + '\n"packs":[],\n"root":' + root
    return (body + ',\n"manifest_hash":"' + blake3.blake3(body.encode()).hexdigest() + '"}\n').encode()


def int8_array(extra: str) -> str:
    return '{"model":{"w":{"t":"array","dtype":"int8","shape":[1],' + extra + '"data":"AQ=="}}}'


#: (case, manifest, what the message names besides the file and the depth)
TREES = [
    ("metadata", lambda: manifest(metadata=LISTS), ["member `metadata`"]),
    ("custom-data", lambda: manifest('{"m":{"t":"custom","type":"x.Y","data":' + LISTS + "}}"), ["at `m`", "member `data`"]),
    ("as", lambda: manifest(int8_array('"as":{"type":"torch.Tensor","x":' + LISTS + "},")), ["at `model/w`", "member `as`"]),
    ("preview", lambda: manifest(int8_array('"preview":{"head":' + LISTS + "},")), ["at `model/w`", "member `preview`"]),
]

#: Every way the Python package reads a stored tree.
READERS = [
    "treepack.load(LOC)",
    "treepack.load(LOC, allow_pickle=True)",
    "treepack.load_structure(LOC)",
    "treepack.open(LOC)",
    "treepack.open(LOC).metadata",
    "treepack.untrusted_types(LOC)",
]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("case,make,names", TREES, ids=[t[0] for t in TREES])
def test_deep_json_in_a_manifest_is_a_typed_error(attack, case, make, names, reader):
    attack.loc.mkdir()
    (attack.loc / "treepack.json").write_bytes(make())
    r = attack.error(f"import treepack\nresult = {reader}", "TreepackError", match=TOO_DEEP)
    for n in ["treepack.json", *names]:
        assert n in r["message"], (n, r["message"])


def test_deep_structured_dtype_is_refused_at_the_dtypes_own_bound(attack):
    attack.loc.mkdir()
    deep = '{"a":' * DEEP + "1" + "}" * DEEP
    root = '{"w":{"t":"array","dtype":{"struct":[{"name":"a","dtype":' + deep + '}]},"shape":[0],"data":""}}'
    (attack.loc / "treepack.json").write_bytes(manifest(root))
    for reader in ["treepack.load(LOC)", "treepack.load_structure(LOC)", "treepack.open(LOC)"]:
        r = attack.error(f"import treepack\nresult = {reader}", "TreepackError", match="member `dtype`: JSON nested deeper than 52 levels")
        assert "at `w`" in r["message"], r["message"]


def transport_document(m: bytes) -> bytes:
    """A transport document (docs/format.md section 11) holding the manifest `m` and no chunks."""
    return b'{"format":"treepack-json","version":[1,0],\n"manifest":' + m[:-1] + b',\n"encoding":"base85",\n"data":""}\n'


def test_deep_metadata_in_a_transport_document(attack):
    attack.loc.mkdir()
    doc = attack.loc / "doc.json"
    doc.write_bytes(transport_document(manifest('{"a":1}', metadata=LISTS)))
    for code in [
        "result = treepack.loads(open(LOC + '/doc.json', 'rb').read())",
        "result = treepack.load(LOC + '/doc.json')",
        "result = treepack.load_structure(LOC + '/doc.json')",
    ]:
        r = attack.error("import treepack\n" + code, "TreepackError", match=TOO_DEEP)
        assert "member `metadata`" in r["message"], r["message"]


def safetensors(name: str) -> bytes:
    header = json.dumps({name: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\x07"


def test_safetensors_name_with_20000_dots(attack):
    attack.loc.mkdir()
    (attack.loc / "m.safetensors").write_bytes(safetensors("a." * 20_000 + "w"))
    r = attack.error(
        "import treepack\nresult = treepack.convert(LOC + '/m.safetensors', LOC + '/t', separator='.')",
        "TreepackError",
        match="splits into more than 999 nested keys",
    )
    assert "m.safetensors" in r["message"] and 'tensor "a.a.a.a.' in r["message"], r["message"]
    assert not (attack.loc / "t").exists()


def test_values_as_deep_as_python_writes_them_read_back(tmp_path):
    import treepack

    # json.dumps of a value 127 lists deep: the deepest the package writes (its values pass
    # through serde_json's default limit); readers accept one level more.
    deep = 1
    for _ in range(127):
        deep = [deep]
    treepack.save({"a": 1}, tmp_path / "t", metadata={"m": deep[0]})
    assert treepack.open(tmp_path / "t").metadata == {"m": deep[0]}
    assert treepack.load(tmp_path / "t") == {"a": 1}
