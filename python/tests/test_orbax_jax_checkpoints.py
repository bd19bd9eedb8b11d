"""Orbax checkpoints and JAX pytree_serialization checkpoints read as trees (issue 54): written
here with the real libraries, then loaded, listed and converted by treepack, which reads their
JSON metadata itself and their arrays through TensorStore, never running Orbax's or JAX's
restore code nor importing anything a checkpoint names."""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import treepack
from hostile_harness import CANARY_MODULE, Hostile

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("tensorstore")
ocp = pytest.importorskip("orbax.checkpoint")
pytest.importorskip("flatbuffers")  # JAX's pytree_serialization writes its tree description with it
from jax.experimental.array_serialization import pytree_serialization  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def same(expected, got, where="<root>", arrays=None):
    """Exact equality: container types, keys in order, array types, dtypes, shapes, values."""
    if isinstance(expected, (np.ndarray, jax.Array)):
        if arrays is not None:
            assert isinstance(got, arrays), f"{where}: {type(got)}"
        e, g = np.asarray(expected), np.asarray(got)
        assert (e.dtype, e.shape) == (g.dtype, g.shape), f"{where}: {e.dtype}{e.shape} vs {g.dtype}{g.shape}"
        assert np.array_equal(e, g), where
        return
    assert type(expected) is type(got), f"{where}: {type(expected)} vs {type(got)}"
    if isinstance(expected, dict):
        assert list(expected) == list(got), f"{where}: {list(expected)} vs {list(got)}"
        for k in expected:
            same(expected[k], got[k], f"{where}/{k}", arrays)
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(got), where
        for i, (a, b) in enumerate(zip(expected, got)):
            same(a, b, f"{where}/{i}", arrays)
    else:
        assert expected == got, f"{where}: {expected!r} vs {got!r}"


def snapshot(root: Path) -> dict:
    """Every file's bytes under ``root``: a load must leave the checkpoint as it was."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def train_state():
    """What a flax TrainState is made of, as Orbax saves it: float32 and bfloat16 parameters,
    Adam's moments (a namedtuple, an empty state), integer and float scalars, a numpy array."""
    import flax.linen as nn
    import optax
    from flax.training import train_state as ts

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(5)(x)
            return x + nn.Embed(7, 5, param_dtype=jnp.bfloat16)(jnp.zeros((1,), int)).astype(x.dtype)

    m = Model()
    params = m.init(jax.random.key(0), jnp.ones((1, 3)))["params"]
    state = ts.TrainState.create(apply_fn=m.apply, params=params, tx=optax.adam(1e-3))
    grads = jax.tree.map(jnp.ones_like, state.params)
    return state.apply_gradients(grads=grads)


def test_a_standard_checkpointer_train_state_loads_as_orbax_restores_it(tmp_path):
    state = train_state()
    p = tmp_path / "ckpt"
    ck = ocp.StandardCheckpointer()
    ck.save(p, {"state": state, "lr": 0.25, "epoch": 3, "done": False, "table": np.arange(6, dtype=np.int16)})
    ck.wait_until_finished()
    restored = ck.restore(p)  # Orbax's own reading: what treepack must give
    before = snapshot(p)

    tree = treepack.load(p)
    same(restored, tree)
    assert isinstance(tree["state"]["params"]["Dense_0"]["kernel"], jax.Array)  # saved as jax.Arrays
    assert isinstance(tree["table"], np.ndarray) and type(tree["epoch"]) is int and tree["lr"] == 0.25
    assert tree["state"]["params"]["Embed_0"]["embedding"].dtype == jnp.bfloat16
    assert tree["state"]["step"] == 1
    same(state.params, tree["state"]["params"])
    same(state.opt_state[0].mu, tree["state"]["opt_state"][0]["mu"])

    plain = treepack.load(p, numpy=True)
    same(restored, plain, arrays=np.ndarray)

    s = treepack.load_structure(p)
    info = s["state"]["params"]["Embed_0"]["embedding"]
    assert (info.path, info.kind, info.dtype, info.shape) == ("state/params/Embed_0/embedding", "array", "bfloat16", (7, 5))
    assert s["state"]["step"].kind == "int" and s["lr"].kind == "float" and s["done"].kind == "bool"

    part = treepack.load(p, select=["state/params/**"], numpy=True)
    same(jax.tree.map(np.asarray, state.params), part["state"]["params"])
    # Built directly, or loaded from a treepack tree in memory (progress= goes that way): the same.
    for sel in (["state/params/**"], ["lr", "?nothing"], ["state/opt_state/0/mu/*/kernel"]):
        same(treepack.load(p, select=sel, numpy=True), treepack.load(p, select=sel, numpy=True, progress=lambda d, t: None))
    assert part["state"]["opt_state"][0]["mu"]["Dense_0"]["kernel"] is None and part["lr"] is None
    with pytest.raises(KeyError, match="nothing"):
        treepack.load(p, select=["state/nothing/**"])

    like = treepack.load_structure(p)
    like["state"]["opt_state"] = None
    got = treepack.load(p, like=like, numpy=True)
    assert got["state"]["opt_state"][0]["mu"]["Dense_0"]["kernel"] is None  # skipped, as like= skips
    assert np.array_equal(got["table"], np.arange(6))

    treepack.convert(p, tmp_path / "ckpt.tpk")
    same(plain, treepack.load(tmp_path / "ckpt.tpk"))
    treepack.convert(p, tmp_path / "params.tpk", select=["state/params/**"])
    assert set(treepack.load(tmp_path / "params.tpk")) == {"state"}
    with pytest.raises(ValueError, match="does not write them"):
        treepack.convert(tmp_path / "ckpt.tpk", tmp_path / "again", to_format="orbax")
    assert snapshot(p) == before  # read, never written


def test_a_checkpoint_manager_step_and_its_folder(tmp_path):
    params = {"b": jnp.zeros(4, jnp.bfloat16), "w": jnp.arange(12.0).reshape(3, 4)}  # (Orbax restores keys sorted)
    mgr = ocp.CheckpointManager(tmp_path / "run")
    mgr.save(5, args=ocp.args.StandardSave(params))
    mgr.wait_until_finished()
    step = tmp_path / "run" / "5"
    assert (step / "default" / "_METADATA").exists()
    same(mgr.restore(5, args=ocp.args.StandardRestore()), treepack.load(step))  # the single item, as restored
    same(params, treepack.load(step))
    same({"5": params}, treepack.load(tmp_path / "run"))  # a folder of steps: a dict of them

    both = ocp.CheckpointManager(tmp_path / "two", item_names=("state", "meta"))
    both.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(params), meta=ocp.args.JsonSave({"lr": 0.1,
                                                                                                     "tags": ["a"]})))
    both.wait_until_finished()
    tree = treepack.load(tmp_path / "two" / "1")
    same(params, tree["state"])
    assert tree["meta"] == {"lr": 0.1, "tags": ["a"]}


@pytest.mark.parametrize("variant", ["rich", "no-ocdbt", "zarr3"])
def test_pytree_checkpointer_variants(tmp_path, variant):
    from orbax.checkpoint._src.metadata import pytree_metadata_options as pmo

    handler = {
        "rich": lambda: ocp.PyTreeCheckpointHandler(pytree_metadata_options=pmo.PyTreeMetadataOptions(support_rich_types=True)),
        "no-ocdbt": lambda: ocp.PyTreeCheckpointHandler(use_ocdbt=False),
        "zarr3": lambda: ocp.PyTreeCheckpointHandler(use_zarr3=True),
    }[variant]()
    pair = collections.namedtuple("Pair", "a b")
    tree = {"w": jnp.arange(6.0).reshape(2, 3), "t": (jnp.ones(2), np.int32(4), 3), "nt": pair(jnp.zeros(1), 2.5),
            "s": "hello", "l": [1, None, {}], "e": ()}
    c = ocp.Checkpointer(handler)
    c.save(tmp_path / "c", tree)
    restored = c.restore(tmp_path / "c")
    got = treepack.load(tmp_path / "c")
    if variant == "rich":  # tuples kept; a namedtuple is the dict of its fields (its class is never looked up)
        restored["nt"] = dict(restored["nt"]._asdict())
    same(restored, got)


def test_an_older_orbax_checkpoint_with_an_aggregated_msgpack_file(tmp_path):
    from orbax.checkpoint import msgpack_utils

    p = tmp_path / "old"
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(p, {"w": np.arange(6.0).reshape(2, 3)})
    (p / "_METADATA").unlink()  # the structure in the msgpack file only
    big = np.arange(10, dtype=np.float32)
    (p / "checkpoint").write_bytes(msgpack_utils.msgpack_serialize(
        {"w": "PLACEHOLDER://w", "inline": big, "step": 9, "pair": (1, np.float16(2.5)), "c": 1 + 2j, "l": [None, "x"]}))
    tree = treepack.load(p)
    assert np.array_equal(tree["w"], np.arange(6.0).reshape(2, 3)) and np.array_equal(tree["inline"], big)
    assert tree["step"] == 9 and tree["c"] == 1 + 2j and tree["l"] == [None, "x"]
    assert tree["pair"][0] == 1 and tree["pair"][1] == np.float16(2.5)
    # Without _CHECKPOINT_METADATA (the oldest layout) the folder is not told by its content: say it.
    (p / "_CHECKPOINT_METADATA").unlink()
    treepack.convert(p, tmp_path / "old.tpk", from_format="orbax")
    assert treepack.load(tmp_path / "old.tpk")["step"] == 9


def test_a_pytree_serialization_checkpoint(tmp_path):
    pair = collections.namedtuple("Pair", "x y")
    jax.export.register_namedtuple_serialization(pair, serialized_name="tests.orbax_jax.Pair")
    data = {
        "layers": [{"w": jnp.ones((3, 2)), "b": None}, {"w": jnp.arange(4, dtype=jnp.int8), "b": jnp.zeros(2, jnp.bfloat16)}],
        "t": (jnp.float32(3.5), None, (jnp.zeros((0, 4)),)),
        "od": collections.OrderedDict([("z", jnp.ones(1)), ("a", jnp.arange(3))]),
        "pair": pair(jnp.ones(2), None),
        "none": None,
    }
    p = tmp_path / "pt"
    pytree_serialization.save(data, p)
    before = snapshot(p)
    tree = treepack.load(p)
    # JAX sorts dict keys when it flattens; an OrderedDict keeps its order; a namedtuple is its fields.
    expected = {
        "layers": [{"b": None, "w": data["layers"][0]["w"]}, {"b": data["layers"][1]["b"], "w": data["layers"][1]["w"]}],
        "none": None,
        "od": data["od"],
        "pair": {"x": data["pair"].x, "y": None},
        "t": data["t"],
    }
    same(expected, tree, arrays=jax.Array)
    same(expected, treepack.load(p, numpy=True), arrays=np.ndarray)
    s = treepack.load_structure(p)
    assert s["layers"][1]["b"].dtype == "bfloat16" and s["t"][2][0].shape == (0, 4) and s["none"].kind == "none"
    assert s["od"].type_name == "py.ordereddict" and list(s["od"]) == ["z", "a"]
    for sel in (["layers/1/**"], ["od/z", "t/0"], ["pair/*"], ["t/0", "?od/nothing"]):
        same(treepack.load(p, select=sel, numpy=True), treepack.load(p, select=sel, numpy=True, progress=lambda d, t: None))
    part = treepack.load(p, select=["layers/1/**"], numpy=True)
    assert part["layers"][0]["w"] is None and np.array_equal(part["layers"][1]["w"], np.arange(4))
    treepack.convert(p, tmp_path / "x.safetensors", select=["layers/*/w", "layers/1/b"])  # through a treepack tree
    from safetensors.numpy import load_file

    assert set(load_file(tmp_path / "x.safetensors")) == {"layers.0.w", "layers.1.w", "layers.1.b"}
    assert snapshot(p) == before


# ---------------------------------------------------------------- custom nodes and hostile files

_REGISTERED: dict = {}


def custom_node_checkpoint(path: Path, name: str) -> None:
    """A JAX checkpoint holding a custom pytree node registered under ``name``, its auxiliary
    data bytes only its own code reads (here, what a pickle of os.system would look like)."""
    cls = _REGISTERED.get(name)
    if cls is None:
        cls = type(f"Node{len(_REGISTERED)}", (), {"__init__": lambda self, x: setattr(self, "x", x)})
        jax.tree_util.register_pytree_node(cls, lambda n: ((n.x,), None), lambda aux, ch: cls(*ch))
        jax.export.register_pytree_node_serialization(
            cls, serialized_name=name, serialize_auxdata=lambda aux: b"cos\nsystem\n(S'touch PWNED'\ntR.",
            deserialize_auxdata=lambda b: None)
        _REGISTERED[name] = cls
    pytree_serialization.save({"ok": jnp.ones(2), "evil": cls([jnp.arange(3), None])}, path)


@pytest.mark.parametrize("name", ["os.system", "subprocess.Popen", f"{CANARY_MODULE}.Boom", f"{CANARY_MODULE}:Boom"])
def test_a_custom_node_is_refused_or_a_placeholder_and_nothing_runs(tmp_path, name):
    h = Hostile(tmp_path)
    custom_node_checkpoint(h.loc, name)
    r = h.error("import treepack\ntreepack.load(LOC, numpy=True)\n", "UntrustedTypeError", match=name)
    assert "`evil`" in r["message"] and "on_missing='placeholder'" in r["message"]
    # trust= lets a treepack tree import a class; nothing a checkpoint names is ever imported.
    h.error(f"import treepack\ntreepack.load(LOC, numpy=True, trust=[{name[:3] + '*'!r}])\n", "UntrustedTypeError",
            match=name)
    r = h.run("import treepack\nt = treepack.load(LOC, numpy=True, on_missing='placeholder')\n"
              "u = t['evil']\nassert isinstance(u, treepack.Unloadable), u\n"
              "assert u.data['children'][0][0].tolist() == [0, 1, 2] and u.data['auxdata'].startswith(b'cos')\n"
              "assert t['ok'].tolist() == [1, 1]\nresult = u.type_name\n")
    assert r["outcome"] == "ok" and name in r["result"], r
    r = h.run("import treepack\ns = treepack.load_structure(LOC)\nresult = (s['evil'].type_name, s['evil'][0][0].shape)\n")
    assert r["outcome"] == "ok" and name in r["result"] and "(3,)" in r["result"], r
    r = h.run("import treepack\nresult = treepack.load(LOC, numpy=True, select=['ok'])['evil']\n")  # not built: no refusal
    assert r["outcome"] == "ok" and r.get("result") is None, r
    h.error("import treepack\ntreepack.convert(LOC, LOC + '.tpk')\n", "UntrustedTypeError", match="select=")
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_orbax_metadata_naming_a_module_imports_nothing(tmp_path):
    from orbax.checkpoint._src.metadata import pytree_metadata_options as pmo

    h = Hostile(tmp_path)
    pair = collections.namedtuple("Pair", "a b")
    handler = ocp.PyTreeCheckpointHandler(pytree_metadata_options=pmo.PyTreeMetadataOptions(support_rich_types=True))
    ocp.Checkpointer(handler).save(h.loc, {"p": pair(np.ones(2), 3)})
    meta = json.loads((h.loc / "_METADATA").read_text())
    rich = json.loads(meta["value_metadata_tree"])
    rich["p"].update(module=CANARY_MODULE, clazz="Boom")
    meta["value_metadata_tree"] = json.dumps(rich)
    (h.loc / "_METADATA").write_text(json.dumps(meta))
    r = h.run("import treepack\nt = treepack.load(LOC, numpy=True)\nresult = (sorted(t['p']), t['p']['b'])\n")
    assert r["outcome"] == "ok" and r["result"] == "(['a', 'b'], 3)", r


def flatbuffer(build) -> str:
    """A ``PyTreeDef`` written with JAX's own FlatBuffers schema code, base64 as in pytreedef.json."""
    import flatbuffers
    from jax._src.export import serialization_generated as fb

    b = flatbuffers.Builder(1024)
    b.Finish(build(b, fb))
    return base64.b64encode(b.Output()).decode()


def node(b, fb, kind, kids=()):
    vec = None
    if kids:
        fb.PyTreeDefStartChildrenVector(b, len(kids))
        for k in reversed(kids):
            b.PrependUOffsetTRelative(k)
        vec = b.EndVector()
    fb.PyTreeDefStart(b)
    fb.PyTreeDefAddKind(b, kind)
    if vec is not None:
        fb.PyTreeDefAddChildren(b, vec)
    return fb.PyTreeDefEnd(b)


def deep(n):
    def build(b, fb):
        x = node(b, fb, fb.PyTreeDefKind.leaf)
        for _ in range(n):
            x = node(b, fb, fb.PyTreeDefKind.list, [x])
        return x
    return build


def shared(n):  # each list holds the one below twice: 2**n leaves from n tables
    def build(b, fb):
        x = node(b, fb, fb.PyTreeDefKind.leaf)
        for _ in range(n):
            x = node(b, fb, fb.PyTreeDefKind.list, [x, x])
        return x
    return build


def write_pytreedef(loc: Path, repr_: str, ids) -> None:
    loc.mkdir(parents=True, exist_ok=True)
    (loc / "pytreedef.json").write_text(json.dumps({"__jax_pytreedef_repr": repr_, "__jax_leaf_ids": ids}))


@pytest.mark.parametrize("case, match", [
    ("deep", "nested more than"),
    ("shared", "more nodes than it holds"),
    ("deep-json", "nested too deep"),
    ("garbage", "damaged"),
    ("bad-ids", "not an array or null"),
])
def test_a_hostile_pytreedef_is_refused(tmp_path, case, match):
    h = Hostile(tmp_path)
    if case == "deep":
        write_pytreedef(h.loc, flatbuffer(deep(100_000)), [None])
    elif case == "shared":
        write_pytreedef(h.loc, flatbuffer(shared(60)), [None] * 100_000)  # leaves enough: the node bound refuses
    elif case == "deep-json":
        h.loc.mkdir()
        (h.loc / "pytreedef.json").write_text('{"__jax_pytreedef_repr": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif case == "garbage":
        write_pytreedef(h.loc, base64.b64encode(b"\xff\xff\xff\x7f" + b"\x00" * 12).decode(), [])
    else:
        write_pytreedef(h.loc, flatbuffer(deep(1)), ["os.system('touch PWNED')"])
    for call in ("treepack.load(LOC, numpy=True)", "treepack.load_structure(LOC)", "treepack.convert(LOC, LOC + '.tpk')"):
        h.error(f"import treepack\n{call}\n", "ForeignFileError", match=match)


def test_huge_declared_shapes_are_refused_before_anything_is_allocated(tmp_path):
    h = Hostile(tmp_path)
    pytree_serialization.save({"w": jnp.ones((4, 4))}, h.loc)
    meta = json.loads((h.loc / "pytreedef.json").read_text())
    meta["__jax_leaf_ids"] = ["Array(float32[1000000000000, 1000000])"]
    (h.loc / "pytreedef.json").write_text(json.dumps(meta))
    h.error("import treepack\ntreepack.load(LOC, numpy=True)\n", "ForeignFileError", match="declared float32")

    other = tmp_path / "orbax"
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(other, {"w": np.ones((4, 4), np.float32)})
    zarray = json.loads((other / "w" / ".zarray").read_text())
    zarray.update(shape=[10**12, 10**6], chunks=[10**6, 10**6])
    (other / "w" / ".zarray").write_text(json.dumps(zarray))
    r = h.error(f"import treepack\ntreepack.load({str(other)!r}, numpy=True)\n", "ForeignFileError",
                match="a hostile shape", mem_bytes=1 << 30)
    assert "`w`" in r["message"]


def orbax_checkpoint(path: Path, ocdbt: bool = False) -> None:
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt)).save(path, {"w": np.arange(4.0), "b": np.ones(2)})


@pytest.mark.parametrize("key", ["..", "../outside", "/etc/passwd", ".", "a/../../b"])
def test_array_names_that_are_paths_are_refused(tmp_path, key):
    h = Hostile(tmp_path)
    orbax_checkpoint(h.loc)
    meta = json.loads((h.loc / "_METADATA").read_text())
    entry = meta["tree_metadata"].pop("('w',)")
    entry["key_metadata"][0]["key"] = key
    meta["tree_metadata"]["x"] = entry
    (h.loc / "_METADATA").write_text(json.dumps(meta))
    h.error("import treepack\ntreepack.load(LOC, numpy=True)\n", "ForeignFileError", match="not one path segment")

    from orbax.checkpoint import msgpack_utils

    (h.loc / "_METADATA").unlink()
    (h.loc / "checkpoint").write_bytes(msgpack_utils.msgpack_serialize({"w": "PLACEHOLDER://" + key}))
    h.error("import treepack\ntreepack.load(LOC, numpy=True)\n", "ForeignFileError", match="not one path segment")


@pytest.mark.parametrize("what", ["orbax-array-folder", "orbax-chunk", "orbax-metadata", "jax-data-file", "jax-pytreedef",
                                  "fifo"])
def test_links_and_special_files_in_a_checkpoint_are_refused(tmp_path, what):
    h = Hostile(tmp_path)
    if what.startswith("jax"):
        pytree_serialization.save({"w": jnp.arange(5.0)}, h.loc)
        victim = h.loc / "pytreedef.json" if what == "jax-pytreedef" else next((h.loc / "array_store" / "d").iterdir())
    else:
        orbax_checkpoint(h.loc)
        victim = {"orbax-array-folder": h.loc / "w", "orbax-chunk": h.loc / "w" / "0",
                  "orbax-metadata": h.loc / "_METADATA", "fifo": h.loc / "w" / "0"}[what]
    shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
    if what == "fifo":
        os.mkfifo(victim)
    else:
        target = h.outside / ("target" if what == "orbax-array-folder" else "secret.txt")
        victim.symlink_to(target)
    h.before = __import__("hostile_harness")._snapshot(h.outside)
    match = "FIFO" if what == "fifo" else "symbolic link"
    for call in ("treepack.load(LOC, numpy=True)", "treepack.load_structure(LOC)"):
        r = h.error(f"import treepack\n{call}\n", "ForeignFileError", match=match)
        assert "SECRET" not in r["message"]


def test_treepack_imports_without_tensorstore_and_says_what_to_install(tmp_path):
    h = Hostile(tmp_path)
    orbax_checkpoint(h.loc, ocdbt=True)
    code = ("import sys\nsys.modules['tensorstore'] = None\nsys.modules['jax'] = None\nimport treepack\n"
            "treepack.save({'x': 1}, LOC + '.tree')\ntreepack.load(LOC)\n")
    h.error(code, "ImportError", match="pip install tensorstore")


def test_open_of_an_npy_gives_a_lazy_array(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(3))
    # (It was refused as "not read lazily" before session 37; python/tests/test_foreign_open.py.)
    assert treepack.open(tmp_path / "a.npy")[1:].tolist() == [1, 2]
