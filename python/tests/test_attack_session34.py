"""Attack session 34: compressed manifests (format 1.6), background-save snapshots, and cycles
through the containers a loader patches after building (OrderedDict, deque, dict subclasses...).

Hostile files are opened in a child process (`hostile_harness`, through the `attack` fixture:
time and address-space limits, canary files that must not change). Also the
regression tests of the bugs this pass found, fixed in the same session: repository gc reading
compressed tree manifests, a compressed manifest's expansion capped by its stored size, and
sets/dict keys built from objects a cycle completes later checked once it has.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import os
import re
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import blake3
import numpy as np
import pytest

import treepack

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SIGNATURE = b'{"format":"treepack","version":['


# ------------------------------------------------------------------ hand-made zstd frames (RFC 8878)
def _frame_header(window_log=None, fcs=None, dict_id=None):
    """A frame header: single-segment with a content size when `window_log` is None."""
    desc = 0
    if window_log is None:
        desc |= 0x20
    if dict_id is not None:
        desc |= 3
    fcs_bytes = b""
    if fcs is not None:
        if window_log is None and fcs < 256:
            fcs_bytes, flag = bytes([fcs]), 0
        elif 256 <= fcs < 65536 + 256:
            fcs_bytes, flag = struct.pack("<H", fcs - 256), 1
        elif fcs < 2**32:
            fcs_bytes, flag = struct.pack("<I", fcs), 2
        else:
            fcs_bytes, flag = struct.pack("<Q", fcs), 3
        desc |= flag << 6
    out = ZSTD_MAGIC + bytes([desc])
    if window_log is not None:
        out += bytes([(window_log - 10) << 3])
    if dict_id is not None:
        out += struct.pack("<I", dict_id)
    return out + fcs_bytes


def _block(kind, size, last, payload):
    return ((1 if last else 0) | (kind << 1) | (size << 3)).to_bytes(3, "little") + payload


def _raw_blocks(data, last=True):
    parts = [data[i:i + (1 << 17)] for i in range(0, len(data), 1 << 17)] or [b""]
    return b"".join(_block(0, len(p), last and i == len(parts) - 1, p) for i, p in enumerate(parts))


def _rle_blocks(byte, total, last=True):
    out, n = bytearray(), 0
    while n < total:
        k = min(1 << 17, total - n)
        n += k
        out += _block(1, k, last and n >= total, bytes([byte]))
    return bytes(out)


def _frame(data, **kw):
    kw.setdefault("fcs", len(data))
    return _frame_header(**kw) + _raw_blocks(data)


def _skippable(payload):
    return struct.pack("<II", 0x184D2A50, len(payload)) + payload


def _plain_tree(path):
    treepack.save({"a": np.arange(1000.0), "s": "text"}, str(path))
    return (Path(path) / "treepack.json").read_bytes()


def _reseal(text: bytes) -> bytes:
    body = text[: text.rindex(b',\n"manifest_hash"')]
    return body + b',\n"manifest_hash":"' + blake3.blake3(body).hexdigest().encode() + b'"}\n'


# ------------------------------------------------------------------ 1. compressed manifests
HOSTILE_FRAMES = {
    # A window the reader refuses to keep (2^41 and 2^25 bytes; the limit is 2^24).
    "window-2^41": lambda j: _frame(j, window_log=41),
    "window-2^25": lambda j: _frame(j, window_log=25),
    # A frame that needs a dictionary nobody has.
    "dictionary-id": lambda j: _frame(j, dict_id=12345),
    # A skippable frame before the manifest's frame, or after it.
    "skippable-first": lambda j: _skippable(b"x" * 10) + _frame(j),
    "skippable-after": lambda j: _frame(j) + _skippable(b"x" * 10),
    # The manifest split across two frames.
    "two-frames": lambda j: _frame(j[:20]) + _frame(j[20:]),
    # A content size that lies, small and huge.
    "content-size-small": lambda j: _frame(j, fcs=5),
    "content-size-1TiB": lambda j: _frame_header(window_log=20, fcs=1 << 40) + _raw_blocks(j),
    # An empty frame.
    "empty-frame": lambda j: _frame(b""),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FRAMES))
def test_hostile_manifest_frames_are_refused_in_a_child(attack, case):
    j = _plain_tree(attack.loc)
    (attack.loc / "treepack.json").write_bytes(HOSTILE_FRAMES[case](j))
    out = attack.run(f"import treepack\nresult = treepack.load({str(attack.loc)!r})")
    assert out["outcome"] == "error", out
    assert "treepack.json" in out["message"], out["message"]
    # gc refuses too, and keeps the packs of a tree it cannot read.
    packs = sorted(os.listdir(attack.loc / "packs"))
    out = attack.run(f"import treepack\nresult = treepack.gc({str(attack.loc)!r}, grace_secs=0)")
    assert out["outcome"] == "error", out
    assert sorted(os.listdir(attack.loc / "packs")) == packs


def test_a_hand_made_frame_of_a_valid_manifest_loads(tmp_path):
    """The frames above fail for what they change, not for being hand-made."""
    j = _plain_tree(tmp_path / "t")
    (tmp_path / "t" / "treepack.json").write_bytes(_frame(j))
    assert treepack.load(str(tmp_path / "t"))["s"] == "text"
    (tmp_path / "t" / "treepack.json").write_bytes(_frame(j, fcs=None, window_log=20))
    assert treepack.load(str(tmp_path / "t"))["s"] == "text"


def test_a_frame_holding_a_manifest_whose_pack_points_outside_is_refused(attack):
    j = _plain_tree(attack.loc)
    pack = re.search(rb"packs/[0-9a-f]+-0\.tpp", j).group(0)
    evil = _reseal(j.replace(pack, b"../outside/target/deadbeef.tpp"))
    (attack.loc / "treepack.json").write_bytes(_frame(evil))
    for code in (f"treepack.load({str(attack.loc)!r})", f"treepack.gc({str(attack.loc)!r}, grace_secs=0)"):
        out = attack.run("import treepack\nresult = " + code)
        assert out["outcome"] == "error" and "not a safe relative path" in out["message"], out
    assert (attack.outside / "target" / "deadbeef.tpp").read_bytes() == b"\0" * 64


def test_gc_keeps_the_packs_of_a_tree_whose_compressed_manifest_is_damaged(tmp_path):
    for i, damage in enumerate([lambda b: b[:-3], lambda b: b[:20] + bytes([b[20] ^ 0xFF]) + b[21:]]):
        p = tmp_path / f"t{i}"
        treepack.save({"a": np.arange(1000.0)}, str(p), compress_manifest=True)
        m = p / "treepack.json"
        assert m.read_bytes()[:4] == ZSTD_MAGIC
        m.write_bytes(damage(m.read_bytes()))
        packs = sorted(os.listdir(p / "packs"))
        with pytest.raises(Exception):
            treepack.gc(str(p), grace_secs=0)
        assert sorted(os.listdir(p / "packs")) == packs


def test_overwrites_between_plain_and_compressed_manifests_remove_the_old_packs(tmp_path):
    p = str(tmp_path / "t")
    treepack.save({"a": np.arange(1000.0)}, p, compress_manifest=True)
    for i, packed in enumerate([False, True, False], 1):
        treepack.save({"a": np.arange(1000.0) + i}, p, overwrite=True, compress_manifest=packed)
        assert len(os.listdir(tmp_path / "t" / "packs")) == 1
        assert treepack.load(p)["a"][0] == i
    assert treepack.gc(p, grace_secs=0) == []


def test_a_signature_holds_whether_the_manifest_is_compressed_or_not(tmp_path):
    """The signature covers the root hash, version and metadata, not the stored bytes: the
    same tree with its manifest decompressed (or compressed at another level) still verifies,
    and an edit inside the compressed manifest is still refused."""
    cli = Path(__file__).resolve().parents[2] / "target" / "debug" / "treepack"
    if not cli.exists():
        pytest.skip("the treepack CLI is not built")
    key = tmp_path / "k"
    subprocess.run([str(cli), "keygen", str(key)], check=True, capture_output=True)
    pub = str(key) + ".pub.pem"
    p = tmp_path / "t"
    treepack.save({"a": np.arange(1000.0), "m": {"x": 1}}, str(p), compress_manifest=True, metadata={"run": 1})
    subprocess.run([str(cli), "sign", str(p), "--key", str(key)], check=True, capture_output=True)
    assert treepack.load(str(p), signed_by=pub)["m"] == {"x": 1}
    packed = (p / "treepack.json").read_bytes()
    zstd = subprocess.run(["zstd", "-d", "-q", "-c"], input=packed, capture_output=True)
    if zstd.returncode != 0:
        pytest.skip("no zstd command")
    plain = zstd.stdout
    (p / "treepack.json").write_bytes(plain)
    assert treepack.load(str(p), signed_by=pub)["m"] == {"x": 1}
    (p / "treepack.json").write_bytes(_frame(plain))
    assert treepack.load(str(p), signed_by=pub)["m"] == {"x": 1}
    (p / "treepack.json").write_bytes(_frame(_reseal(plain.replace(b'"run":1', b'"run":2'))))
    with pytest.raises(Exception, match="signature|signed"):
        treepack.load(str(p), signed_by=pub)


def test_repository_gc_reads_compressed_tree_manifests(tmp_path):
    repo = treepack.Repository(str(tmp_path / "r"), create=True)
    repo.save({"a": np.arange(1000.0)}, "one", compression="zstd")
    repo.save({"a": np.arange(1000.0) + 1}, "two", compression="zstd")
    assert all(t.read_bytes()[:4] == ZSTD_MAGIC for t in (tmp_path / "r" / "trees").iterdir())
    repo.delete("one")
    repo.gc(grace_secs=0)
    assert len(os.listdir(tmp_path / "r" / "trees")) == 1
    assert repo.load("two")["a"][0] == 1


def test_checkpoint_manager_keeps_the_last_steps_with_compression_on(tmp_path):
    m = treepack.CheckpointManager(str(tmp_path / "ck"), keep_last=2)
    for s in range(4):
        m.save(s, {"a": np.arange(10) + s}, compression="auto")
    m.wait_until_finished()
    assert m.all_steps() == [2, 3]


def test_a_small_compressed_manifest_cannot_make_a_reader_allocate_a_gigabyte(attack):
    _plain_tree(attack.loc)
    bomb = (_frame_header(window_log=20) + _raw_blocks(SIGNATURE, last=False)
            + _rle_blocks(0x20, (1 << 30) - 64 - len(SIGNATURE), last=False) + _raw_blocks(b"1,6]}"))
    assert len(bomb) < 40_000
    (attack.loc / "treepack.json").write_bytes(bomb)
    out = attack.run(textwrap.dedent(f"""
        import resource, treepack
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            treepack.load_structure({str(attack.loc)!r})
            error = None
        except Exception as e:
            error = str(e)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
        result = (grown, error)
    """), timeout=30)
    assert out["outcome"] == "ok", out
    grown, error = eval(out["result"])
    assert error is not None and "out of memory" not in error, error
    assert grown < 256, f"peak RSS grew by {grown} MiB for a {len(bomb)}-byte manifest"


# ------------------------------------------------------------------ 2. background-save snapshots
N = 1 << 17  # float64: 1 MiB, above the snapshot's deferred-copy size


def _bg(tree, path, mutate):
    h = treepack.save(tree, str(path), blocking=False)
    mutate()
    h.result()
    return treepack.load(str(path))


def test_a_background_save_holds_the_values_at_the_call(tmp_path):
    base = np.arange(2 * N, dtype=np.float64)
    v1, v2 = base[:N], base[N // 2: N // 2 + N]
    e1, e2 = v1.copy(), v2.copy()
    full = np.arange(4 * N, dtype=np.float32)
    strided = full.reshape(2 * N, 2)[::2, ::-1]
    es = strided.copy()
    big_endian = np.arange(N, dtype=">i8")
    ebe = big_endian.copy()
    zero = np.zeros((0, 5))

    def mutate():
        base[:] = 7
        full[:] = 0
        big_endian[:] = 3

    back = _bg({"x": v1, "y": v2, "z": v1, "s": strided, "b": big_endian, "0": zero}, tmp_path / "t", mutate)
    assert np.array_equal(back["x"], e1) and np.array_equal(back["z"], e1) and np.array_equal(back["y"], e2)
    assert back["x"] is back["z"]
    assert np.array_equal(back["s"], es) and np.array_equal(back["b"], ebe) and back["0"].shape == (0, 5)


def test_arrays_freed_after_a_background_save_and_a_failed_save_do_not_leak_into_later_saves(tmp_path):
    # A first snapshot fills the buffer pool with a value no later save holds.
    treepack.save({"a": np.full(N, 123456.0)}, str(tmp_path / "secret"), blocking=False).result()
    t = {"f": np.full(N, 5.0)}
    h = treepack.save(t, str(tmp_path / "freed"), blocking=False)
    del t
    gc.collect()
    junk = [np.full(N, 9.0) for _ in range(8)]
    h.result()
    assert np.array_equal(treepack.load(str(tmp_path / "freed"))["f"], np.full(N, 5.0))
    treepack.save({"a": np.full(N, 1.0)}, str(tmp_path / "exists"))
    with pytest.raises(FileExistsError):
        treepack.save({"a": np.full(N, 2.0)}, str(tmp_path / "exists"), blocking=False).result()
    b = np.full(N, 3.0)
    back = _bg({"a": b, "c": np.arange(N, dtype=np.float64)}, tmp_path / "after", lambda: b.fill(4.0))
    assert np.array_equal(back["a"], np.full(N, 3.0)) and np.array_equal(back["c"], np.arange(N, dtype=np.float64))
    assert np.array_equal(treepack.load(str(tmp_path / "exists"))["a"], np.full(N, 1.0))
    del junk


def test_background_saves_from_many_threads_each_hold_their_own_values(tmp_path):
    errors = []

    def worker(i):
        try:
            arr = np.full(N + i, float(i))
            h = treepack.save({"a": arr, "b": arr[::-1].copy()}, str(tmp_path / f"t{i}"), blocking=False)
            arr.fill(-1)
            h.result()
            assert np.array_equal(treepack.load(str(tmp_path / f"t{i}"))["a"], np.full(N + i, float(i)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_during_a_background_save_saves_on_its_own(tmp_path):
    code = textwrap.dedent(f"""
        import os, sys, numpy as np, treepack
        d = {str(tmp_path)!r}
        big = np.arange(8 * {N}, dtype=np.float64)
        h = treepack.save({{"big": big}}, d + "/parent", blocking=False)
        pid = os.fork()
        if pid == 0:
            try:
                c = np.arange({N}, dtype=np.float64)
                h2 = treepack.save({{"c": c}}, d + "/child", blocking=False)
                c.fill(0)
                h2.result()
                ok = np.array_equal(treepack.load(d + "/child")["c"], np.arange({N}, dtype=np.float64))
                os._exit(0 if ok else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        h.result()
        assert np.array_equal(treepack.load(d + "/parent")["big"], np.arange(8 * {N}, dtype=np.float64))
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]


# ------------------------------------------------------------------ 3. cycles through patched containers
@dataclasses.dataclass(eq=False)
class Outer:
    table: object = None


@dataclasses.dataclass(frozen=True)
class Key:
    parent: object


class LoggingDict(dict):
    """A trusted dict subclass whose __setitem__ does more than store."""

    def __setitem__(self, k, v):
        super().__setitem__(k, ("wrapped", v))


class Bag(collections.UserDict):
    pass


TRUST = [__name__ + ".*", __name__]


def _no_placeholder(x, seen=None):
    """No bare `object()` anywhere in a loaded tree."""
    seen = set() if seen is None else seen
    if id(x) in seen:
        return True
    seen.add(id(x))
    if type(x) is object:
        return False
    if isinstance(x, (dict, collections.UserDict)):
        return all(_no_placeholder(v, seen) for v in x.values())
    if isinstance(x, (list, tuple, collections.deque)):
        return all(_no_placeholder(v, seen) for v in x)
    if hasattr(x, "__dict__"):
        return all(_no_placeholder(v, seen) for v in vars(x).values())
    return True


def test_cycles_through_patched_containers_round_trip_exactly(tmp_path):
    od = collections.OrderedDict(a=1)
    od["self"] = od
    dd = collections.defaultdict(list, a=[1])
    dd["self"] = dd
    dq = collections.deque([1])
    dq.append(dq)
    sub = LoggingDict()
    dict.__setitem__(sub, "self", sub)
    bag = Bag(a=1)
    bag["self"] = bag
    bag.extra = bag
    tree = {"od": od, "dd": dd, "dq": dq, "sub": sub, "bag": bag}
    treepack.save(tree, str(tmp_path / "t"))
    back = treepack.load(str(tmp_path / "t"), trust=TRUST)
    assert back["od"]["self"] is back["od"] and type(back["od"]) is collections.OrderedDict
    assert back["dd"]["self"] is back["dd"] and back["dd"].default_factory is list
    assert back["dq"][1] is back["dq"]
    assert type(back["sub"]) is LoggingDict and dict.__getitem__(back["sub"], "self") is back["sub"]
    assert back["bag"]["self"] is back["bag"] and back["bag"].extra is back["bag"]
    assert _no_placeholder(back)


def _crafted_key_cycle(tmp_path, as_set):
    """Outer whose table (a set, or a dict with a record key) holds Key(parent=<that Outer>):
    the saver refuses such a cycle; a crafted manifest makes it."""
    o, o2 = Outer(), Outer()
    o.table = {Key(o2)} if as_set else {Key(o2): 1}
    p = tmp_path / ("s" if as_set else "d")
    treepack.save({"root": o, "other": [o2, o]}, str(p))
    m = p / "treepack.json"
    text = m.read_bytes()
    inner = (b'{"t":"shared","id":1,"v":{"t":"record","type":"' + f"{__name__}:Outer".encode()
             + b'","fields":[["table",null]]}}')
    assert inner in text, text
    text = text.replace(inner, b'{"t":"ref","id":0}')
    text = text.replace(b'"other":[{"t":"ref","id":1},{"t":"ref","id":0}]', b'"other":[{"t":"ref","id":0}]')
    m.write_bytes(_reseal(text))
    return str(p)


@pytest.mark.parametrize("as_set", [True, False], ids=["set", "dict-key"])
def test_a_crafted_ref_inside_a_hashed_element_is_refused_or_exact(tmp_path, as_set):
    p = _crafted_key_cycle(tmp_path, as_set)
    try:
        back = treepack.load(p, trust=TRUST)
    except (ValueError, treepack.FormatError):
        return  # refused: fine
    root = back["root"]
    (k,) = list(root.table)
    assert k.parent is root and back["other"][0] is root
    assert k in root.table, "the loaded container holds an element it cannot find (stale hash)"
