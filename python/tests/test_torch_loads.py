"""Loads into torch (issue 53): what a load gives ``load_state_dict`` and how tensors that share a
storage are rebuilt without a second buffer.

Runs against real torch (installed into .venv by scripts/python-env.sh); skipped without it.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import treepack  # noqa: E402
import treepack.integrations.torch as tt  # noqa: E402


@pytest.fixture
def counted(monkeypatch):
    """Bytes zeroed into and copied into shared storages during a load (``_fill``, ``_copy_into``)."""
    seen = {"filled": 0, "copied": 0}
    fill, copy = tt._fill, tt._copy_into

    def _fill(storage, start, end):
        seen["filled"] += end - start
        fill(storage, start, end)

    def _copy_into(dst, src, stager=None):
        seen["copied"] += src.numel() * src.element_size()
        copy(dst, src, stager)

    monkeypatch.setattr(tt, "_fill", _fill)
    monkeypatch.setattr(tt, "_copy_into", _copy_into)
    return seen


def test_tied_weights_load_into_the_first_tensors_memory(loc, counted):
    # GPT-2's lm_head.weight and wte.weight: two tensors over one storage. The storage is the
    # first tensor's loaded buffer: nothing of its size is allocated and zeroed, and the second
    # tensor's values, equal to what is there, are compared, not copied.
    w = torch.randn(300, 64)
    sd = {"wte": w, "mid": torch.randn(8), "lm_head": w.detach()}  # two tensor objects, as state_dict() gives
    treepack.save(sd, loc)
    out = treepack.load(loc)
    assert counted["filled"] == 0
    assert counted["copied"] == 0
    assert out["wte"].data_ptr() == out["lm_head"].data_ptr()
    assert out["wte"].untyped_storage().nbytes() == w.numel() * 4
    assert torch.equal(out["wte"], w) and torch.equal(out["lm_head"], w)
    out["lm_head"][0, 0] = 1234.0
    assert out["wte"][0, 0].item() == 1234.0


@pytest.mark.parametrize("param", [False, True], ids=["tensor", "parameter"])
def test_a_storage_that_outgrows_its_first_tensor_takes_that_tensor_along(loc, param):
    # The first tensor (a prefix view) becomes the storage; the whole tensor after it reaches
    # further, so the storage is remade bigger and the first tensor moved onto it.
    x = torch.arange(40.0).reshape(8, 5)
    wrap = (lambda t: torch.nn.Parameter(t, requires_grad=False)) if param else (lambda t: t)
    base = wrap(x)
    tree = {"head": base[:3], "all": base, "tail": base[5:]}
    if param:
        tree = {"head": torch.nn.Parameter(x[:3]), "all": base, "tail": x[5:]}
    treepack.save(tree, loc)
    out = treepack.load(loc)
    for k in tree:
        assert torch.equal(out[k].detach(), tree[k].detach()), k
        assert out[k].storage_offset() == tree[k].storage_offset() and out[k].stride() == tree[k].stride(), k
    assert len({out[k].untyped_storage().data_ptr() for k in tree}) == 1
    assert out["head"].untyped_storage().nbytes() == x.numel() * 4
    with torch.no_grad():
        out["all"][1, 1] = -7.0
        out["tail"][0, 0] = -9.0
    assert out["head"][1, 1].item() == -7.0
    assert out["all"][5, 0].item() == -9.0
    if param:
        assert type(out["head"]) is torch.nn.Parameter and out["head"].requires_grad
        assert type(out["all"]) is torch.nn.Parameter and not out["all"].requires_grad


def test_views_met_before_their_base_still_share_one_storage(loc):
    x = torch.arange(24.0).reshape(4, 6)
    tree = {"late": x[2:], "base": x, "cols": x[:, 1::2]}
    treepack.save(tree, loc)
    out = treepack.load(loc)
    assert len({out[k].untyped_storage().data_ptr() for k in tree}) == 1
    for k in tree:
        assert torch.equal(out[k], tree[k]), k


def test_mmap_loads_keep_tied_weights_tied(loc):
    w = torch.randn(64, 32)
    treepack.save({"a": w, "b": w}, loc)
    out = treepack.load(loc, mmap=True)
    assert out["a"].data_ptr() == out["b"].data_ptr()
    assert torch.equal(out["a"], w)


def test_loaded_tensors_are_what_load_state_dict_copies_fastest(loc):
    # Plain, writable, C-contiguous, aligned CPU tensors of the saved dtype that do not require
    # grad: load_state_dict's copy_ takes them as it takes torch.load's.
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 64, bias=False))
    model[2].weight = torch.nn.Parameter(torch.randn(64, 256))
    sd = model.state_dict()
    treepack.save(sd, loc)
    for kw in ({}, {"verify": False}):
        got = treepack.load(loc, **kw)
        assert list(got) == list(sd)
        for k, t in got.items():
            assert type(t) is torch.Tensor and not t.requires_grad, k
            assert t.dtype == sd[k].dtype and t.shape == sd[k].shape and t.device.type == "cpu", k
            assert t.is_contiguous() and t.storage_offset() == 0, k
            assert t.data_ptr() % 64 == 0, k
            assert t.numpy().flags.writeable, k
        fresh = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 64, bias=False))
        fresh.load_state_dict(got)
        for k, t in fresh.state_dict().items():
            assert torch.equal(t, sd[k]), k


def test_like_a_state_dict_reads_into_the_models_tensors(loc):
    model = torch.nn.Linear(128, 64)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    treepack.save(sd, loc)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    target = model.state_dict()
    ptrs = {k: v.data_ptr() for k, v in target.items()}
    treepack.load(loc, like=target)
    for k, v in model.state_dict().items():
        assert v.data_ptr() == ptrs[k] and torch.equal(v, sd[k]), k
    assert np.all(model.weight.detach().numpy() == sd["weight"].numpy())


def test_a_whole_load_reads_equal_leaves_once_and_keeps_them_apart(loc):
    # Big leaves with equal bytes (the zeroed tensors of a fresh model, tied weights) take the
    # whole-load path too: read once, then two tensors that do not alias unless tied.
    w = torch.randn(1024, 1024)
    zeros = [torch.zeros(512, 1024) for _ in range(3)]
    sd = {"wte": w, "z0": zeros[0], "z1": zeros[1], "lm_head": w.detach(), "z2": zeros[2], "other": torch.randn(1024, 1024)}
    treepack.save(sd, loc)
    for kw in ({}, {"verify": False}):
        out = treepack.load(loc, **kw)
        for k, t in sd.items():
            assert torch.equal(out[k], t), k
        assert out["wte"].data_ptr() == out["lm_head"].data_ptr()
        assert len({out[f"z{i}"].data_ptr() for i in range(3)}) == 3
        out["z1"][0, 0] = 5.0
        assert out["z0"][0, 0].item() == 0.0 and out["z2"][0, 0].item() == 0.0


def test_like_reads_all_tensors_at_once_as_one_after_another_would(loc):
    # The reader fills a like= tree's CPU tensors in one pass (Reader.read_many_into). What
    # they end up holding must be what reading them in the file's order leaves: a tensor
    # named at two paths (tied weights) holds the later path's values, and of views that share
    # memory each later one overwrites what it covers.
    g = torch.Generator().manual_seed(1)
    stored = {k: torch.randn(8, 8, generator=g) for k in ("a", "b", "whole", "t")}
    stored["row"] = torch.randn(8, generator=g)
    stored["tt"] = torch.randn(8, 8, generator=g)
    stored["small"] = [torch.randn(3, 20, generator=g) for _ in range(40)]  # (240 bytes: in packs, not inline)
    treepack.save(stored, loc)

    tied = torch.zeros(8, 8)
    base = torch.zeros(8, 8)
    tbase = torch.zeros(8, 8)
    small = [torch.zeros(3, 20) for _ in range(40)]
    like = {"a": tied, "b": tied, "whole": base, "row": base[2], "t": tbase, "tt": tbase.t(), "small": small}
    for verify in (True, False):
        for t in (tied, base, tbase, *small):
            t.zero_()
        treepack.load(loc, like=like, verify=verify)
        assert torch.equal(tied, stored["b"])
        want = stored["whole"].clone()
        want[2] = stored["row"]
        assert torch.equal(base, want)
        assert torch.equal(tbase, stored["tt"].t())
        for got, want_small in zip(small, stored["small"]):
            assert torch.equal(got, want_small)
    # Stored the other way round, the whole tensors come last and overwrite their views.
    order = ("b", "a", "row", "whole", "tt", "t", "small")
    treepack.save({k: stored[k] for k in order}, loc + "-reversed")
    for t in (tied, base, tbase):
        t.zero_()
    treepack.load(loc + "-reversed", like=like)
    assert torch.equal(tied, stored["a"]) and torch.equal(base, stored["whole"]) and torch.equal(tbase, stored["t"])


def test_read_many_into_refuses_destinations_it_cannot_write(loc):
    treepack.save({"x": np.arange(6.0), "y": np.arange(4.0)}, loc)
    from treepack import _core

    r = _core.Reader(loc, None)
    ro = np.zeros(6)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="`x`: the destination array is read-only"):
        r.read_many_into([("y", np.zeros(4)), ("x", ro)])
    with pytest.raises(ValueError, match="`x`: the destination array is not C-contiguous"):
        r.read_many_into([("x", np.zeros(12)[::2])])
    with pytest.raises(Exception, match="the destination has 40 bytes but the stored float64 array of shape \\[6\\] has 48"):
        r.read_many_into([("y", np.zeros(4)), ("x", np.zeros(5))])
    x, y = np.zeros(6), np.zeros(4)
    r.read_many_into([("x", x), ("y", y)])
    assert x.tolist() == list(range(6)) and y.tolist() == list(range(4))


def test_read_many_into_gives_what_reading_one_by_one_gives(loc):
    # Destinations that share memory in every way: the same memory at two paths storing the
    # same bytes (read once) and different bytes (read in order), nested, chained and empty
    # views; the result must be what reading them one after another leaves.
    from treepack import _core

    g = np.random.default_rng(3)
    tree = {f"x{i}": g.standard_normal(n) for i, n in enumerate([64, 64, 16, 32, 32, 8, 0, 64])}
    tree["same"] = tree["x0"]  # (the same array object: stored once, at two paths)
    treepack.save(tree, loc)
    r = _core.Reader(loc, None)

    def views(buf):
        return [("x0", buf[0:64]), ("same", buf[0:64]), ("x1", buf[0:64]), ("x2", buf[10:26]), ("x3", buf[20:52]),
                ("x4", buf[100:132]), ("x5", buf[90:98]), ("x6", buf[5:5]), ("x7", buf[200:264]), ("x0", buf[300:364])]

    one_by_one = np.zeros(400)
    for path, v in views(one_by_one):
        r.read_into(path, v)
    for verify in (True, False):
        at_once = np.zeros(400)
        r.read_many_into(views(at_once), verify)
        assert np.array_equal(at_once, one_by_one)
    # A path that is not there, or of another size, fails even when its memory is another's.
    buf = np.zeros(64)
    with pytest.raises(KeyError):
        r.read_many_into([("nope", buf), ("x0", buf)])
    with pytest.raises(Exception, match="the destination has 512 bytes but the stored float64 array of shape \\[16\\]"):
        r.read_many_into([("x2", buf), ("x0", buf)])
