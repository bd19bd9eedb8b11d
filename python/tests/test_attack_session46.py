"""Session 46's attacker, on what the session added: flax msgpack files read by `load` (a file, or
an older Orbax folder's `checkpoint`), and `like=` templates walked against the file node by
node. Each case runs in a child with time and memory limits (hostile_harness), and nothing
outside its location may change."""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_harness import Hostile  # noqa: E402

msgpack = pytest.importorskip("msgpack")
blake3 = pytest.importorskip("blake3")


def _pack(o):
    return msgpack.packb(o, use_bin_type=True)


def _nested_tuples(n):
    inner = _pack([])
    for _ in range(n - 1):
        inner = _pack([msgpack.ExtType(4, inner)])
    return _pack({"a": msgpack.ExtType(4, inner)})


def _chunked(dims):
    shape = {str(i): 1 for i in range(dims)}
    return _pack({"a": {"__msgpack_chunked_array__": True, "shape": shape, "chunks": {}}})


@pytest.mark.parametrize("case, data, match", [
    # Each nested tuple is another msgpack decode on the C stack: 200 overflowed 8 MiB (SIGSEGV).
    ("tuples", lambda: _nested_tuples(200), "tuples nested more than 32 deep"),
    # The shape's product was taken before its length was checked: minutes of big-int products.
    ("dims", lambda: _chunked(200_000), "a chunked array of 200000 dimensions"),
    # One byte per empty map: ~200 bytes of memory per byte of file, unbounded.
    ("maps", lambda: _pack({"a": [{}] * 3_000_000}), "more maps and arrays than a checkpoint of"),
    ("bytes-key", lambda: _pack({b"ab": 1}), "a map with a key that is not a string"),
    ("long-double", lambda: _pack({"a": msgpack.ExtType(1, msgpack.packb([[1], b"longdouble", bytes(16)]))}),
     "which treepack does not read from msgpack"),
])
def test_hostile_msgpack_files_are_refused(tmp_path, case, data, match):
    h = Hostile(tmp_path)
    f = Path(str(h.loc) + ".msgpack")
    f.write_bytes(data())
    for call in ("treepack.load(F)", "treepack.load_structure(F)", "treepack.open(F)"):
        r = h.error(f"import treepack\nF = {str(f)!r}\n{call}\n", "ForeignFileError", match=match,
                    timeout=60, mem_bytes=3 << 30)
        # The file is the checkpoint: its reasons do not name a `checkpoint` file it lacks.
        assert "`checkpoint`" not in r["message"] and str(f) in r["message"], r["message"]


def test_a_linked_or_special_msgpack_file_is_refused_and_never_blocks(tmp_path):
    h = Hostile(tmp_path)
    (h.outside / "secret.msgpack").write_bytes(_pack({"w": 1}))
    h.before = __import__("hostile_harness")._snapshot(h.outside)
    link = Path(str(h.loc) + ".msgpack")
    link.symlink_to(h.outside / "secret.msgpack")
    h.error(f"import treepack\ntreepack.load({str(link)!r})\n", "ForeignFileError", match="is a symbolic link")
    fifo = tmp_path / "pipe.msgpack"
    os.mkfifo(fifo)
    # (detection must not open a FIFO: that blocks until someone writes to it)
    r = h.run(f"import treepack\ntreepack.load({str(fifo)!r})\n", timeout=30)
    assert r["outcome"] == "error", r


def _craft(d: Path, root: str) -> str:
    d.mkdir(parents=True)
    body = '{"format":"treepack","version":[1,4],\n"writer":"evil",\n"packs":[],\n"root":' + root
    digest = blake3.blake3(body.encode()).hexdigest()
    (d / "treepack.json").write_text(body + ',\n"manifest_hash":"' + digest + '"}\n')
    return str(d)


A = '{"t":"array","dtype":"float32","shape":[2],"data":"AACAPwAAgD8="}'  # [1, 1]
B = '{"t":"array","dtype":"float32","shape":[2],"data":"AAAgQQAAIEE="}'  # [10, 10]


def test_like_finds_a_refs_object_by_the_cores_key_paths(tmp_path):
    # `z` refers to the object under the str key "1", beside the int key 1: a template load must
    # give what a plain load gives (it gave B: key paths built as str(key) named both "1").
    jax = pytest.importorskip("jax")
    h = Hostile(tmp_path)
    for name, d, key in [("intstr", '{"t":"dict","items":[["1",{"t":"shared","id":0,"v":' + A + '}],[1,' + B + ']]}', None),
                         ("star", '{"a*":{"t":"shared","id":0,"v":' + A + '}}', "a*"),
                         ("empty", '{"":{"t":"shared","id":0,"v":' + A + '}}', "")]:
        p = _craft(h.loc / name, '{"d":' + d + ',"z":{"t":"ref","id":0}}')
        like_d = "None" if key is None else f"{{{key!r}: S}}"
        r = h.run(
            "import numpy as np, jax, treepack\n"
            "S = jax.ShapeDtypeStruct((2,), np.float32)\n"
            f"plain = treepack.load({p!r})['z']\n"
            f"like = treepack.load({p!r}, like={{'d': {like_d}, 'z': S}})['z']\n"
            "result = (np.asarray(plain).tolist(), np.asarray(like).tolist())\n", timeout=60, mem_bytes=64 << 30)
        assert r["outcome"] == "ok" and r["result"] == repr(([1.0, 1.0], [1.0, 1.0])), (name, r)
    del jax


def test_like_over_many_refs_is_linear(tmp_path):
    # 8000 refs: each template leaf's ref was found by a walk from the root (50 s).
    pytest.importorskip("jax")
    h = Hostile(tmp_path)
    n = 8000
    root = '{"s":{"t":"shared","id":0,"v":' + A + '},' + ",".join(f'"k{i}":{{"t":"ref","id":0}}' for i in range(n)) + "}"
    p = _craft(h.loc / "refs", root)
    r = h.run(
        "import time, numpy as np, jax, treepack\n"
        f"s = treepack.load_structure({p!r})\n"
        "like = {k: jax.ShapeDtypeStruct((2,), np.float32) for k in s}\n"
        f"back = treepack.load({p!r}, like=like)\n"
        "result = (len(back), float(back['k7999'][0]))\n", timeout=60, mem_bytes=64 << 30)  # (JAX maps much)
    assert r["outcome"] == "ok" and r["result"] == repr((n + 1, 1.0)), r


def test_a_template_load_audits_the_objects_refs_bring(tmp_path):
    # The template asks for `p`, a ref to an untrusted record stored at `q`: refused up front
    # (UntrustedTypeError), not left to the build.
    h = Hostile(tmp_path)
    rec = '{"t":"record","type":"os:system","fields":[["x",1]]}'
    p = _craft(h.loc / "t", '{"q":{"t":"shared","id":0,"v":' + rec + '},"p":{"t":"ref","id":0},"w":' + A + '}')
    for like in ("{'q': None, 'p': True, 'w': True}", "{'q': None, 'p': True, 'w': np.zeros(2, np.float32)}"):
        r = h.error(f"import numpy as np, treepack\ntreepack.load({p!r}, like={like})\n", "UntrustedTypeError",
                    match="os:system: at q")
        assert json.dumps(r)  # (reported)


def test_an_audit_of_a_chain_of_objects_is_linear(tmp_path):
    # 300 nested shared records and a list of refs to each, innermost first: the audit of a
    # read of the list walked each object once per ref to it (45 150 rows, 54 MB of paths).
    h = Hostile(tmp_path)
    n = 300
    node = '{"t":"record","type":"m:N","fields":[["x",1]]}'
    for i in reversed(range(n)):
        inner = node
        node = '{"t":"shared","id":' + str(i) + ',"v":{"t":"record","type":"m:N","fields":[["next",' + inner + ']]}}'
    refs = ",".join('{"t":"ref","id":' + str(i) + '}' for i in reversed(range(n)))
    p = _craft(h.loc / "chain", '{"chain":' + node + ',"refs":[' + refs + ']}')
    r = h.run(f"import treepack\nv = treepack.open({p!r})\nresult = len(v._r.types_within(['refs']))\n", timeout=60)
    assert r["outcome"] == "ok" and int(r["result"]) == n + 1, r
