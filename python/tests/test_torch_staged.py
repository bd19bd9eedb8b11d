"""``load(like=)`` into device tensors through reused staging buffers (issue 53): rows of each
array are read into one of a few host buffers and copied to the device while the next piece is
read. No GPU here: the device is the CPU with copies that happen only when waited for (or at the
end), from the buffer as it is *then* — a buffer refilled before its copy finished gives wrong
bytes, so the pipeline's ordering is what these tests check. bench/gpu_load_bench.py runs the
CUDA copies (pinned buffers, a stream of their own) on a machine with a GPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import treepack  # noqa: E402
from treepack import _staging  # noqa: E402
from treepack.integrations import torch as tt  # noqa: E402


class Deferred:
    """Asynchronous copies, as a device's: queued, done when waited for."""

    made: list = []
    buffers = 0

    def __init__(self, device):
        self.queue = {}
        self.n = 0
        self.waited = 0
        Deferred.made.append(self)

    def buffer(self, n):
        Deferred.buffers += 1
        return torch.empty(n, dtype=torch.uint8)

    def copy(self, dst, src):
        self.n += 1
        self.queue[self.n] = (dst, src, dst.data_ptr())
        return self.n

    def wait(self, event):
        dst, src, ptr = self.queue.pop(event)
        # A device's copy goes to the address it was given: memory moved meanwhile (a storage
        # grown) would lose it.
        assert dst.data_ptr() == ptr, "a copy's destination moved while the copy ran"
        dst.copy_(src)
        self.waited += 1


@pytest.fixture
def staged(monkeypatch):
    monkeypatch.setattr(tt.staging, "STAGED", {"cpu": Deferred})
    monkeypatch.setattr(tt.staging, "STAGE_BYTES", 3 * 4096)
    monkeypatch.setattr(tt.staging, "STAGE_COUNT", 2)
    monkeypatch.setattr(_staging, "_kept", {})
    monkeypatch.setattr(_staging, "_abandoned", [])
    Deferred.made, Deferred.buffers = [], 0
    return Deferred


def state():
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(300, 64, generator=g),  # 256-byte rows: many pieces
        "b": torch.randn(1000, generator=g, dtype=torch.float64),
        "h": torch.randn(40, 32, generator=g).to(torch.bfloat16),
        "i": torch.arange(-5000, 5000, dtype=torch.int64).reshape(100, 100),
        "long": torch.randn(2, 5000, generator=g),  # a row longer than a staging buffer
        "s": torch.tensor(3.5),
        "flag": torch.tensor([True, False, True]),
    }


def test_tensors_are_filled_in_place_through_reused_buffers(tmp_path, staged):
    sd = state()
    treepack.save(sd, tmp_path / "c", chunk_bytes=8192)
    like = {k: torch.zeros_like(v) for k, v in sd.items()}
    ids = {k: id(v) for k, v in like.items()}
    out = treepack.load(tmp_path / "c", like=like)
    for k, v in sd.items():
        assert id(out[k]) == ids[k], k  # the like= tensor itself, filled
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k
    copies = staged.made[0]
    pieces = copies.n
    assert pieces > 20  # rows split into pieces of at most 3 pages (whole chunks), a long row alone
    assert copies.waited == pieces and not copies.queue
    # Two buffers cycled, each grown once at most for the long rows; one grown for a long row
    # (20000 bytes here) is not kept after the load.
    assert staged.buffers <= 4
    assert all(b.size == tt.staging.STAGE_BYTES for b in _staging._kept[Deferred])
    # Without long rows, a second load allocates nothing: the buffers are reused.
    del sd["long"]
    treepack.save(sd, tmp_path / "short", chunk_bytes=8192)
    treepack.load(tmp_path / "short", like={k: torch.zeros_like(v) for k, v in sd.items()})
    before = staged.buffers
    out = treepack.load(tmp_path / "short", like={k: torch.zeros_like(v) for k, v in sd.items()})
    assert staged.buffers == before
    assert all(torch.equal(out[k], v) for k, v in sd.items())


def on_threads(load, n=4):
    """``load()`` on ``n`` threads at once: what each returned (an error is raised here)."""
    import threading

    results, errors = {}, []

    def run(i):
        try:
            results[i] = load()
        except Exception as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == n, errors
    return list(results.values())


def test_loads_on_two_threads_at_once_do_not_share_buffers(tmp_path, staged):
    sd = state()
    treepack.save(sd, tmp_path / "c", chunk_bytes=8192)
    for out in on_threads(lambda: treepack.load(tmp_path / "c", like={k: torch.zeros_like(v) for k, v in sd.items()})):
        assert all(torch.equal(out[k], v) for k, v in sd.items())


def test_a_single_file_and_a_compressed_tree_fill_the_same(tmp_path, staged):
    sd = state()
    treepack.save(sd, tmp_path / "c.tpk", chunk_bytes=4096)
    treepack.save(sd, tmp_path / "z", compression="zstd", chunk_bytes=4096)
    for p in (tmp_path / "c.tpk", tmp_path / "z"):
        out = treepack.load(p, like={k: torch.empty_like(v) for k, v in sd.items()})
        assert all(torch.equal(out[k], v) for k, v in sd.items()), p


def test_a_model_state_dict_with_tied_and_non_contiguous_tensors(tmp_path, staged):
    lin = torch.nn.Linear(64, 128)
    emb = torch.nn.Embedding(128, 64)
    lin.weight = emb.weight  # tied (one storage at two keys)
    sd = {"emb.weight": emb.weight.detach().clone(), "lin.bias": lin.bias.detach().clone()}
    treepack.save(sd, tmp_path / "m")
    target = {"emb.weight": torch.zeros(128, 64), "lin.bias": torch.zeros(256)[::2]}  # (a strided view)
    out = treepack.load(tmp_path / "m", like=target)
    assert torch.equal(out["emb.weight"], sd["emb.weight"]) and torch.equal(target["lin.bias"], sd["lin.bias"])
    (copies,) = staged.made
    assert copies.n >= 1  # the contiguous one staged; the strided one through a CPU buffer


def test_damaged_data_fails_naming_the_leaf_and_leaves_no_copy_queued(tmp_path, staged):
    sd = {"w": torch.randn(256, 256)}
    treepack.save(sd, tmp_path / "d", chunk_bytes=16384)
    pack = next((tmp_path / "d" / "packs").iterdir())
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0x55
    pack.write_bytes(bytes(data))
    with pytest.raises(treepack.CorruptError, match="`w`"):
        treepack.load(tmp_path / "d", like={"w": torch.zeros(256, 256)})
    (copies,) = staged.made
    assert not copies.queue  # finished (every queued copy waited for) though the read failed


def test_shape_and_dtype_mismatches_are_refused_before_reading(tmp_path, staged):
    treepack.save({"w": torch.ones(4, 4)}, tmp_path / "m")
    with pytest.raises(ValueError, match="float32 with shape \\(4, 4\\).*float32 with shape \\(4, 5\\)"):
        treepack.load(tmp_path / "m", like={"w": torch.zeros(4, 5)})
    with pytest.raises(ValueError, match="float64"):
        treepack.load(tmp_path / "m", like={"w": torch.zeros(4, 4, dtype=torch.float64)})
    assert np.all([c.n == 0 for c in staged.made])


@pytest.fixture
def seen(monkeypatch):
    """Whether each array the torch loader got was writable (read into host memory) or a
    read-only view of the file (the load read it mapped)."""
    got = []
    tensor = tt.Loader.tensor

    def spy(self, arr, ann):
        got.append(arr.flags.writeable)
        return tensor(self, arr, ann)

    monkeypatch.setattr(tt.Loader, "tensor", spy)
    return got


def test_map_location_to_a_staged_device_reads_the_file_mapped_and_stages_every_tensor(tmp_path, staged, seen):
    # map_location= a device with staged copies (CUDA; here the CPU with deferred copies): a
    # tree of tensors is read as views of the file (no copy of it in host memory) and each
    # tensor goes to the device through the reused buffers; parameters, requires_grad and
    # storages shared by several tensors (tied weights, a view) come back as they were saved.
    sd = state()
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 32, generator=g)
    tree = {"model": {**sd, "p": torch.nn.Parameter(torch.randn(50, 8, generator=g)), "tied_a": w, "tied_b": w,
                      "rows": w[10:20], "frozen": torch.nn.Parameter(torch.ones(4), requires_grad=False)},
            "epoch": 3, "lr": 0.5}
    treepack.save(tree, tmp_path / "c", chunk_bytes=8192)
    out = treepack.load(tmp_path / "c", map_location="cpu")
    assert seen and not any(seen)  # every tensor read as a view of the file
    m = out["model"]
    assert out["epoch"] == 3 and out["lr"] == 0.5
    for k, v in sd.items():
        assert m[k].dtype == v.dtype and torch.equal(m[k], v), k
        assert m[k].untyped_storage().resizable(), k  # memory of its own, not a view of the file's pages
    assert type(m["p"]) is torch.nn.Parameter and m["p"].requires_grad and torch.equal(m["p"], tree["model"]["p"])
    assert type(m["frozen"]) is torch.nn.Parameter and not m["frozen"].requires_grad
    assert torch.equal(m["tied_a"], w) and m["tied_a"].data_ptr() == m["tied_b"].data_ptr()
    assert torch.equal(m["rows"], w[10:20]) and m["rows"].untyped_storage().data_ptr() == m["tied_a"].untyped_storage().data_ptr()
    pieces = sum(c.n for c in staged.made)
    assert pieces > 20 and all(not c.queue for c in staged.made)  # all staged, all finished
    # Reused across tensors: two, each grown once for the long rows, and those two made again
    # at their normal size for the tensors after (a grown buffer is not kept).
    assert staged.buffers <= 6


def test_map_location_staged_loads_a_tree_with_numpy_arrays_as_before(tmp_path, staged, seen):
    # A numpy array would come back as a read-only view of the file: such a tree is read into
    # host memory as without map_location, and its tensors still go through the buffers.
    tree = {"t": torch.arange(1000.0), "a": np.arange(10)}
    treepack.save(tree, tmp_path / "c", chunk_bytes=1024)
    out = treepack.load(tmp_path / "c", map_location="cpu")
    assert seen == [True]
    assert out["t"].untyped_storage().resizable()  # (staged into memory of its own)
    assert torch.equal(out["t"], tree["t"]) and out["a"].flags.writeable and out["a"].tolist() == list(range(10))
    assert sum(c.n for c in staged.made) >= 1


def test_map_location_staged_still_checks_every_chunk(tmp_path, staged):
    treepack.save({"w": torch.randn(256, 256)}, tmp_path / "d", chunk_bytes=16384)
    pack = next((tmp_path / "d" / "packs").iterdir())
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0x55
    pack.write_bytes(bytes(data))
    with pytest.raises(treepack.CorruptError, match="`w`"):
        treepack.load(tmp_path / "d", map_location="cpu")
    out = treepack.load(tmp_path / "d", map_location="cpu", verify=False)  # (asked: not checked)
    assert out["w"].shape == (256, 256)


def test_map_location_staged_leaves_numpy_loads_alone(tmp_path, staged):
    # numpy=True gives the stored arrays themselves: they stay arrays read into memory of
    # their own, never views of the file, whatever map_location says.
    treepack.save({"t": torch.arange(1000.0), "u": torch.ones(3, 300)}, tmp_path / "c", chunk_bytes=1024)
    out = treepack.load(tmp_path / "c", map_location="cpu", numpy=True)
    assert all(isinstance(v, np.ndarray) and v.flags.writeable for v in out.values())
    assert out["t"].tolist() == list(range(1000))


def test_map_location_staged_copies_of_one_load_overlap_and_are_all_done_when_it_returns(tmp_path, staged):
    # One copier for the whole load, not one per tensor: a tensor's copy to the device is still
    # queued while the next tensors are read (small ones packed into one buffer), and every copy
    # has finished when load() returns.
    tree = {f"t{i}": torch.full((100 + i,), float(i)) for i in range(40)}
    treepack.save(tree, tmp_path / "c")
    depth = []
    copy = Deferred.copy

    def spy(self, dst, src):
        h = copy(self, dst, src)
        depth.append(len(self.queue))
        return h

    Deferred.copy = spy
    try:
        out = treepack.load(tmp_path / "c", map_location="cpu")
    finally:
        Deferred.copy = copy
    (copies,) = staged.made
    assert copies.n == 40 and not copies.queue and copies.waited == 40
    assert max(depth) > 10  # many tensors' copies in flight at once
    assert staged.buffers == tt.staging.STAGE_COUNT
    assert all(torch.equal(out[k], v) for k, v in tree.items())


def test_map_location_staged_storage_grown_on_the_device_keeps_copies_started_before(tmp_path, staged):
    # A view met before its base (a smaller extent first): the storage they share is made on
    # the device for the view, then grown for the base. The view's copy, still running, goes to
    # the storage's memory before it moves: it is waited for first, or the view's values are lost.
    w = torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32)
    tree = {"a_rows": w[10:20], "b_base": w, "c_after": torch.ones(7)}
    treepack.save(tree, tmp_path / "c")
    out = treepack.load(tmp_path / "c", map_location="cpu")
    assert torch.equal(out["b_base"], w) and torch.equal(out["a_rows"], w[10:20]) and torch.equal(out["c_after"], torch.ones(7))
    assert out["a_rows"].untyped_storage().data_ptr() == out["b_base"].untyped_storage().data_ptr()


def test_map_location_staged_a_failed_copy_or_read_fails_the_load(tmp_path, staged, monkeypatch):
    tree = {f"t{i}": torch.full((1000,), float(i)) for i in range(20)}
    treepack.save(tree, tmp_path / "c", chunk_bytes=4096)

    def broken(self, event):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with monkeypatch.context() as m:
        m.setattr(Deferred, "wait", broken)
        with pytest.raises(RuntimeError, match="illegal memory access"):
            treepack.load(tmp_path / "c", map_location="cpu")
    # Its buffers may still be read by copies that never finished: never reused, never freed.
    assert _staging._abandoned and Deferred not in _staging._kept
    # A copy that cannot start, after others did: its error is the load's, and the copies
    # started were all waited for before the buffers went back.
    copy = Deferred.copy

    def refused(self, dst, src):
        if self.n == 5:
            raise RuntimeError("CUDA out of memory")
        return copy(self, dst, src)

    staged.made.clear()
    monkeypatch.setattr(Deferred, "copy", refused)
    with pytest.raises(RuntimeError, match="out of memory"):
        treepack.load(tmp_path / "c", map_location="cpu")
    (copies,) = staged.made
    assert copies.n == 5 and copies.waited == 5 and not copies.queue
    assert len(_staging._kept[Deferred]) >= 1  # put back: every copy out of them finished


def test_map_location_staged_loads_on_four_threads(tmp_path, staged):
    sd = state()
    treepack.save(sd, tmp_path / "c", chunk_bytes=8192)
    for out in on_threads(lambda: treepack.load(tmp_path / "c", map_location="cpu")):
        assert all(torch.equal(out[k], v) for k, v in sd.items())
