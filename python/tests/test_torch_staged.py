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
        self.queue[self.n] = (dst, src)
        return self.n

    def wait(self, event):
        dst, src = self.queue.pop(event)
        dst.copy_(src)
        self.waited += 1

    def finish(self):
        for event in sorted(self.queue):
            self.wait(event)


@pytest.fixture
def staged(monkeypatch):
    monkeypatch.setattr(tt, "STAGED", {"cpu": Deferred})
    monkeypatch.setattr(tt, "STAGE_BYTES", 3 * 4096)
    monkeypatch.setattr(tt, "STAGE_COUNT", 2)
    monkeypatch.setattr(tt, "_stage_buffers", {})
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
    assert all(b is None or b.numel() == tt.STAGE_BYTES for b in tt._stage_buffers[Deferred])
    # Without long rows, a second load allocates nothing: the buffers are reused.
    del sd["long"]
    treepack.save(sd, tmp_path / "short", chunk_bytes=8192)
    treepack.load(tmp_path / "short", like={k: torch.zeros_like(v) for k, v in sd.items()})
    before = staged.buffers
    out = treepack.load(tmp_path / "short", like={k: torch.zeros_like(v) for k, v in sd.items()})
    assert staged.buffers == before
    assert all(torch.equal(out[k], v) for k, v in sd.items())


def test_loads_on_two_threads_at_once_do_not_share_buffers(tmp_path, staged):
    import threading

    sd = state()
    treepack.save(sd, tmp_path / "c", chunk_bytes=8192)
    results, errors = {}, []

    def load(i):
        try:
            like = {k: torch.zeros_like(v) for k, v in sd.items()}
            results[i] = treepack.load(tmp_path / "c", like=like)
        except Exception as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 4
    for out in results.values():
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
