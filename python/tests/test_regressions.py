"""One regression test per bug new users hit (issue 23), as ripgrep keeps them: each failed on the
main branch before its fix."""

import dataclasses
import datetime
import enum
import json
import os
import subprocess
import sys
import textwrap
from typing import NamedTuple

import numpy as np
import pytest

import treepack

# ---------------------------------------------------------------- 1. fork after a save

FORK_SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys
    import numpy as np
    import treepack

    parent_mode, child_mode, d = sys.argv[1], sys.argv[2], sys.argv[3]
    # Big enough for the parallel hashing and multi-threaded I/O paths.
    # The log of plain records is written as megabytes of text: its buffer is kept between
    # saves (a lock the child must never wait for).
    tree = {"w": np.arange(1 << 20, dtype=np.float64), "small": [np.full(100, i) for i in range(40)],
            "log": [{"step": i, "loss": i * 0.5, "tag": f"t{i}"} for i in range(60000)]}
    if parent_mode == "save":
        treepack.save(tree, os.path.join(d, "parent"))
    elif parent_mode == "nonblocking":
        treepack.save(tree, os.path.join(d, "parent"), blocking=False).result()
    elif parent_mode == "load":
        treepack.save(tree, os.path.join(d, "parent"))

    def child(tag):
        signal.alarm(60)  # a hang fails the test instead of stalling the suite
        dst = os.path.join(d, tag)
        if child_mode == "save":
            treepack.save(tree, dst)
        else:
            treepack.save(tree, dst, blocking=False).result()
        back = treepack.load(dst)
        assert np.array_equal(back["w"], tree["w"]) and np.array_equal(back["small"][39], tree["small"][39])
        assert back["log"] == tree["log"]
        assert treepack.verify(dst).ok

    if parent_mode == "load":
        assert np.array_equal(treepack.load(os.path.join(d, "parent"))["w"], tree["w"])

    pid = os.fork()
    if pid == 0:
        try:
            child("forked")
        except BaseException as e:
            print("child failed:", repr(e), flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"os.fork child: status {status}"

    # multiprocessing with the fork start method (DataLoader workers, Dask's fork workers).
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=child, args=("mp",))
    p.start()
    p.join(90)
    assert p.exitcode == 0, f"multiprocessing child: exit code {p.exitcode}"
    print("ok")
    """
)


@pytest.mark.parametrize("parent", ["save", "nonblocking", "load"])
@pytest.mark.parametrize("child", ["save", "nonblocking"])
def test_a_forked_child_can_save_after_the_parent_did(tmp_path, parent, child):
    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    r = subprocess.run([sys.executable, str(script), parent, child, str(tmp_path)], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


# A thread saves without pause (each save lets go of hundreds of arrays and bytes on treepack's
# threads, without the GIL) while the main thread forks: a child forked while another thread held
# a lock on the released references (pyo3's pool, before design decision 101) hung in its first
# treepack call, or in fork's own clean-up of the other threads. About 1 fork in 200 hung then.
FORK_STRESS_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import numpy as np
    import treepack

    n_forks, d = int(sys.argv[1]), sys.argv[2]
    tree = {"a": [np.full(600, i, dtype=np.float32) for i in range(300)],
            "b": [bytes([i % 256]) * 2400 for i in range(300)]}
    stop = threading.Event()

    def saver():
        i = 0
        while not stop.is_set():
            treepack.save(tree, os.path.join(d, f"p{i % 2}"), overwrite=True, durable=False)
            # A load through the reader (a selection), whose reader is let go of detached.
            assert treepack.load(os.path.join(d, f"p{i % 2}"), select=["a/3"])["a"][3][0] == 3
            i += 1

    threading.Thread(target=saver, daemon=True).start()
    time.sleep(0.2)
    for k in range(n_forks):
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)
            treepack.save({"x": np.arange(10)}, os.path.join(d, f"c{k}"), durable=False)
            os._exit(0 if treepack.load(os.path.join(d, f"c{k}"))["x"][9] == 9 else 3)
        # The child can hang before its alarm is set, so the parent keeps the time.
        deadline = time.monotonic() + 10
        while (r := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.002)
        if r[0] == 0:
            os.kill(pid, signal.SIGKILL)
            r = os.waitpid(pid, 0)
        if not (os.WIFEXITED(r[1]) and os.WEXITSTATUS(r[1]) == 0):
            print(f"fork {k} of {n_forks}: child status {r[1]} (9: hung)", flush=True)
            sys.exit(1)
    stop.set()
    print("ok")
    """
)


def test_forks_while_another_thread_saves_never_hang(tmp_path):
    script = tmp_path / "fork_stress.py"
    script.write_text(FORK_STRESS_SCRIPT)
    r = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", str(script), "800", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_references_dropped_off_the_gil_are_released(tmp_path):
    import time
    import weakref

    arrays = [np.full(4096, i, dtype=np.float32) for i in range(4)]
    blobs = [bytes([i]) * 4096 for i in range(4)]
    base = [sys.getrefcount(x) for x in arrays + blobs]

    def released(alive=lambda: False, deadline_s=30):
        # Polled: a worker may let go of a buffer just after the save returned.
        deadline = time.monotonic() + deadline_s
        while ([sys.getrefcount(x) for x in arrays + blobs] != base or alive()) and time.monotonic() < deadline:
            treepack._core._release_deferred()
            sum(range(20_000))  # Python work: this thread holds the GIL most of the time
        return treepack._core._release_deferred()[1]  # how many were ever deferred

    # A small save drops its tree on the calling thread with the GIL released: let go of on return.
    treepack.save({"a": arrays, "b": blobs}, tmp_path / "small", durable=False)
    released()
    assert [sys.getrefcount(x) for x in arrays + blobs] == base
    # A big one drops it on a thread of its own, which never holds the GIL, while this one
    # mostly does: every reference it lets go of is deferred (a thread that took another's GIL
    # for its own would decref without it), then released at treepack's next call.
    many = [np.full(2, i, dtype=np.float32) for i in range(12_000)]
    before = treepack._core._release_deferred()[1]
    treepack.save({"a": arrays, "b": blobs, "many": many}, tmp_path / "big", durable=False)
    refs = [weakref.ref(x) for x in many]
    del many
    assert released(alive=lambda: any(r() is not None for r in refs)) - before >= 12_000
    assert all(r() is None for r in refs)
    assert [sys.getrefcount(x) for x in arrays + blobs] == base


# ---------------------------------------------------------------- 2. flags


class Perm(enum.IntFlag):
    R = 4
    W = 2
    X = 1


class Color(enum.Flag):
    RED = enum.auto()
    GREEN = enum.auto()
    BLUE = enum.auto()


class Plain(enum.Enum):
    A = "a"
    B = "b"


def test_flag_combinations_load_back(tmp_path):
    tree = {
        "rw": Perm.R | Perm.W,
        "none": Perm(0),
        "one": Perm.X,
        "colors": Color.RED | Color.BLUE,
        "nocolor": Color(0),
        "plain": Plain.B,
    }
    treepack.save(tree, tmp_path / "t")
    back = treepack.load(tmp_path / "t", trust=[__name__ + ".*"])
    assert back == tree
    assert all(type(back[k]) is type(tree[k]) for k in tree)
    # The manifest keeps the value, and the name where there is one, for people reading it.
    m = json.loads((tmp_path / "t" / "treepack.json").read_text())
    text = json.dumps(m, separators=(",", ":"))
    assert '"value":6' in text and '"member":"B"' in text


def test_enums_written_by_name_only_still_load(tmp_path, monkeypatch):
    # Files written before flags were stored by value name the member alone: write one that way.
    from treepack import _codec

    def old_encode(obj, where, allow_pickle, *args):
        if isinstance(obj, enum.Enum):
            return ("custom", "py.enum", json.dumps({"class": f"{__name__}:{type(obj).__qualname__}", "member": obj.name}), [])
        return new_encode(obj, where, allow_pickle, *args)

    new_encode = _codec.encode_other
    monkeypatch.setattr(_codec, "encode_other", old_encode)
    treepack.save({"p": Plain.A, "x": Perm.X}, tmp_path / "t")
    monkeypatch.undo()
    assert '"value"' not in (tmp_path / "t" / "treepack.json").read_text()
    assert treepack.load(tmp_path / "t", trust=[__name__ + ".*"]) == {"p": Plain.A, "x": Perm.X}


# ---------------------------------------------------------------- 3. like=


class Abstract:
    """A stand-in for jax.ShapeDtypeStruct: only shape and dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def test_like_with_arrays_shape_dtype_structs_and_true(tmp_path):
    tree = {"w": np.arange(6.0).reshape(2, 3), "b": np.ones(3, np.float32), "s": 5, "name": "run"}
    treepack.save(tree, tmp_path / "t")
    out = treepack.load(tmp_path / "t", like={"w": np.zeros((2, 3)), "b": Abstract((3,), "float32"), "s": True, "name": None})
    assert np.array_equal(out["w"], tree["w"]) and np.array_equal(out["b"], tree["b"])
    assert out["s"] == 5 and out["name"] is None
    # An example tree as the template: scalars of the stored kind load too.
    out = treepack.load(tmp_path / "t", like={"w": False, "b": None, "s": 0, "name": ""})
    assert out == {"w": None, "b": None, "s": 5, "name": "run"}
    # True for a whole subtree, LeafInfos from load_structure.
    assert treepack.load(tmp_path / "t", like=True)["s"] == 5
    st = treepack.load_structure(tmp_path / "t")
    st["w"] = None
    out = treepack.load(tmp_path / "t", like=st)
    assert out["w"] is None and out["s"] == 5


def test_jax_shape_dtype_structs_as_like(tmp_path):
    import jax
    import jax.numpy as jnp

    tree = {"params": {"w": np.ones((4, 2), np.float32)}, "step": np.int32(7)}
    treepack.save(tree, tmp_path / "t")
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype), {"params": tree["params"]})
    out = treepack.load(tmp_path / "t", like={"params": abstract["params"], "step": None})
    assert np.array_equal(out["params"]["w"], tree["params"]["w"]) and out["step"] is None


def test_like_mismatches_raise_naming_the_key_path(tmp_path):
    treepack.save({"p": {"w": np.zeros((2, 3), np.float32)}, "s": 1, "l": [1, 2]}, tmp_path / "t")
    load = lambda like: treepack.load(tmp_path / "t", like=like)  # noqa: E731
    full = {"p": {"w": True}, "s": True, "l": [True, True]}
    with pytest.raises(ValueError, match=r"`p/w`.*float32 with shape \(2, 3\).*float32 with shape \(3, 2\)"):
        load({**full, "p": {"w": np.zeros((3, 2), np.float32)}})
    with pytest.raises(ValueError, match=r"`p/w`.*float32.*float64"):
        load({**full, "p": {"w": np.zeros((2, 3))}})
    with pytest.raises(TypeError, match=r"at `s` got object"):
        load({**full, "s": object()})
    with pytest.raises(ValueError, match=r"at `s` like= has a str but the file holds an int leaf"):
        load({**full, "s": "x"})
    with pytest.raises(ValueError, match=r"at `p` like= has no key 'w'"):
        load({**full, "p": {}})
    with pytest.raises(ValueError, match=r"at the root like= has a key 'extra'"):
        load({**full, "extra": None})
    with pytest.raises(ValueError, match=r"at `l` the file holds a list of 2 items but like= has 3"):
        load({**full, "l": [True, True, True]})
    with pytest.raises(ValueError, match=r"at `l` the file holds a list of 2 but like= has a dict"):
        load({**full, "l": {}})
    with pytest.raises(ValueError, match=r"`p/w` like= has an array .* but the file holds"):
        treepack.save({"p": {"w": 3}}, tmp_path / "u")
        treepack.load(tmp_path / "u", like={"p": {"w": np.zeros(1)}})


# ---------------------------------------------------------------- 4. lazy-view indexes


def test_view_indexes_never_wrap_around(tmp_path):
    treepack.save({"layers": [10, 20, 30], "pair": ("a", "b")}, tmp_path / "t")
    v = treepack.open(tmp_path / "t")
    assert v["layers"][2] == 30 and v["layers"][-1] == 30 and v["layers"][-3] == 10
    assert v["pair"][-2] == "a"
    for view, i in [(v["layers"], 3), (v["layers"], 5), (v["layers"], -4), (v["pair"], 7), (v["pair"], -3)]:
        with pytest.raises(IndexError, match=f"index {i} is out of range"):
            view[i]
    with pytest.raises(TypeError, match="index it with an integer"):
        v["layers"]["0"]


# ---------------------------------------------------------------- 5. trust for what is loaded


@dataclasses.dataclass
class OptState:
    mu: np.ndarray
    count: int


@dataclasses.dataclass
class Model:
    w: np.ndarray
    b: np.ndarray


def _ckpt(tmp_path):
    tree = {"params": {"w": np.ones(3)}, "opt": OptState(np.zeros(3), 4), "model": Model(np.ones(2), np.zeros(2))}
    treepack.save(tree, tmp_path / "t")
    return tmp_path / "t"


def test_partial_loads_need_trust_only_for_what_they_build(tmp_path):
    p = _ckpt(tmp_path)
    out = treepack.load(p, select=["params/**"])  # OptState and Model untrusted, not loaded
    assert np.array_equal(out["params"]["w"], np.ones(3)) and out["opt"] is None and out["model"] is None
    st = treepack.load_structure(p)
    st["opt"] = st["model"] = None
    out = treepack.load(p, like=st)
    assert out["opt"] is None and out["model"] is None
    assert treepack.untrusted_types(p) != {}  # the whole file still names them
    # Selecting inside a record builds it, so it must be trusted.
    with pytest.raises(treepack.UntrustedTypeError) as e:
        treepack.load(p, select=["opt/mu"])
    assert list(e.value.types) == [f"{__name__}:OptState"]
    out = treepack.load(p, select=["opt/mu"], trust=[__name__ + ".*"])
    assert isinstance(out["opt"], OptState) and out["opt"].count is None and out["model"] is None


def test_masking_record_fields_with_jax_tree_map(tmp_path):
    import jax

    p = _ckpt(tmp_path)
    st = treepack.load_structure(p)
    assert isinstance(st["opt"], treepack.StructNode)
    # StructNode is a pytree node: the map reaches the record's fields.
    mask = jax.tree.map(lambda leaf: leaf if leaf.path != "opt/count" else None, st)
    assert isinstance(mask["opt"], treepack.StructNode) and mask["opt"].children["count"] is None
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(st)[0]]
    assert "['opt']['mu']" in paths
    out = treepack.load(p, like=mask, trust=[__name__ + ".*"])
    assert out["opt"].count is None and np.array_equal(out["opt"].mu, np.zeros(3))
    assert isinstance(out["model"], Model)


# ---------------------------------------------------------------- 6. messages


def test_untrusted_message_says_how_each_kind_is_allowed(tmp_path):
    # A registered type saved by another process, loaded in a fresh one that did not register it.
    writer = textwrap.dedent(
        """
        import dataclasses, sys, treepack
        class Point:
            def __init__(self, x):
                self.x = x
        @dataclasses.dataclass
        class Config:
            lr: float
        treepack.register(Point, name="tests.Point", to_data=lambda p: {"x": p.x}, from_data=lambda d: Point(d["x"]))
        treepack.save({"pt": Point(1), "cfg": Config(0.1)}, sys.argv[1])
        """
    )
    subprocess.run([sys.executable, "-c", writer, str(tmp_path / "t")], check=True, timeout=120)
    with pytest.raises(treepack.UntrustedTypeError) as e:
        treepack.load(tmp_path / "t")
    msg = str(e.value)
    assert e.value.types == {"__main__:Config": ["cfg"], "tests.Point": ["pt"]}
    assert "load(..., trust=['__main__.*'])" in msg
    assert "registered types (tests.Point): call treepack.register(" in msg and "trust= does not apply" in msg


def test_to_data_errors_name_the_key_path_and_type(tmp_path):
    class Broken:
        pass

    def fail(obj):
        raise TypeError("cannot convert")

    treepack.register(Broken, name="tests.Broken", to_data=fail, from_data=lambda d: Broken())
    with pytest.raises(TypeError, match=r"cannot save `a/0`: to_data of the type registered as 'tests.Broken' .* raised TypeError: cannot convert"):
        treepack.save({"a": [Broken()]}, tmp_path / "t")


def test_a_reference_cycle_is_named_once(tmp_path):
    # Without shared references (shared=False: a plain tree), a cycle is refused, named once.
    loop = [1]
    loop.append(loop)
    with pytest.raises(ValueError) as e:
        treepack.save({"x": {"y": loop}}, tmp_path / "t", shared=False)
    msg = str(e.value)
    assert "reference cycle at `x/y`: it contains itself at `x/y/1`" in msg and len(msg) < 400, msg
    assert "shared=True" in msg
    d = {}
    d["self"] = d
    with pytest.raises(ValueError, match=r"reference cycle at `<root>`: it contains itself at `self`"):
        treepack.save(d, tmp_path / "u", shared=False)
    # By default it round-trips (issue 26).
    treepack.save(d, tmp_path / "v")
    back = treepack.load(tmp_path / "v")
    assert back["self"] is back


class Opaque:
    """A class treepack cannot store without pickle (module level: pickle needs to find it)."""


def test_object_arrays_are_stored_element_by_element(tmp_path):
    # They were refused (or pickled whole with allow_pickle=True); now each element is a tree
    # value, so only an element nothing else can store needs allow_pickle, and says where it is.
    a = np.array([1, "two", None], dtype=object)
    treepack.save({"o": a}, tmp_path / "t")
    back = treepack.load(tmp_path / "t")["o"]
    assert back.dtype == object and back.tolist() == [1, "two", None]

    b = np.array([1, Opaque()], dtype=object)
    with pytest.raises(TypeError, match=r"`o/items/1`: objects of type .*Opaque are not supported.*allow_pickle=True"):
        treepack.save({"o": b}, tmp_path / "u")
    treepack.save({"o": b}, tmp_path / "u", allow_pickle=True)  # what the message suggests works
    back = treepack.load(tmp_path / "u", allow_pickle=True)["o"]
    assert back.dtype == object and back[0] == 1 and type(back[1]).__name__ == "Opaque"


def test_metadata_that_is_not_json_names_the_argument_and_path(tmp_path):
    with pytest.raises(TypeError, match=r"metadata=: the value at `opt/lr` is a numpy.float32.*\.item\(\)"):
        treepack.save({"x": 1}, tmp_path / "t", metadata={"opt": {"lr": np.float32(1e-3)}})
    treepack.save({"x": 1}, tmp_path / "t", metadata={"run": "a", "tags": [1, 2.5, None]})
    assert treepack.open(tmp_path / "t").metadata == {"run": "a", "tags": [1, 2.5, None]}


def test_cli_cat_prints_datetimes_and_record_types(tmp_path):
    exe = os.path.join(os.path.dirname(__file__), "..", "..", "target", "debug", "treepack")
    assert os.path.exists(exe), "the treepack CLI is not built: run `cargo build` (scripts/test.sh does)"
    when = datetime.datetime(2026, 11, 22, tzinfo=datetime.timezone.utc)
    treepack.save({"when": when, "opt": OptState(np.zeros(1), 2)}, tmp_path / "t")
    out = subprocess.run([exe, "cat", str(tmp_path / "t"), "when"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "custom py.datetime 2026-11-22T00:00:00Z"
    out = subprocess.run([exe, "cat", str(tmp_path / "t"), "opt"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"record {__name__}:OptState:")


@pytest.mark.parametrize("inner,ok", [(lambda: 1, True), (lambda: "s", True), (lambda: [], False), (lambda: 2**70, False),
                                      (lambda: float("nan"), False), (lambda: {"a": 1}, False), (lambda: np.zeros(2), False)])
def test_a_save_never_writes_what_readers_refuse_at_the_deepest_level(tmp_path, inner, ok):
    # 1000 lists deep: a plain scalar may sit there, a container or tagged value may not.
    x = inner()
    for _ in range(1000):
        x = [x]
    p = str(tmp_path / "t")
    if ok:
        treepack.save(x, p)
        back = treepack.load(p)
        for _ in range(1000):
            back = back[0]
        assert back == inner()
    else:
        with pytest.raises((ValueError, treepack.TreepackError), match="1000"):
            treepack.save(x, p)
        assert not os.path.exists(os.path.join(p, "treepack.json"))


def test_a_small_tree_with_a_trusted_class_or_compressed_leaves_is_read_and_built_once(tmp_path, monkeypatch):
    """A whole load first tries to build the tree in one pass over its manifest, and hands it
    to the reader path when it meets a type that needs the audit. That pass refused the type
    only once the node's contents were read and built, so a small checkpoint whose root is a
    TrainState-like object (everything under a trusted class) was read, verified and built
    twice. The type is now refused as soon as it is read, before its fields or children."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    optax = pytest.importorskip("optax")
    flax_core = pytest.importorskip("flax.core")
    from treepack.integrations.jax import arrays

    built = []
    real = arrays.Loader.array
    monkeypatch.setattr(arrays.Loader, "array", lambda self, a, ann: built.append(a.shape) or real(self, a, ann))
    params = {"w": jnp.ones((3, 3)), "b": jnp.zeros(3)}
    noise = jnp.asarray(np.random.default_rng(0).standard_normal(20000).astype(np.float32))
    cases = {
        "record": ({"opt": optax.adam(1e-2).init(params), "step": 3}, ["optax.*"], 5),  # ScaleByAdamState
        "custom": ({"p": flax_core.FrozenDict(params)}, ["flax.*"], 2),  # a jax.pytree node
        # The same cause for compression: the pass gave up at the first compressed leaf, after
        # reading the raw ones before it (random floats stay raw under zstd). It now decodes
        # small trees itself.
        "compressed": ({"noise": noise, "zeros": jnp.zeros(20000)}, [], 2),
    }
    for name, (tree, trust, arrays_in_tree) in cases.items():
        p = str(tmp_path / name)
        treepack.save(tree, p, compression="zstd" if name == "compressed" else None)
        built.clear()
        back = treepack.load(p, trust=trust)
        assert len(built) == arrays_in_tree, name
        for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
