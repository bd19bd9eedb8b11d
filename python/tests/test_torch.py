"""PyTorch (issue 29): tensors, state_dicts and optimizer states without pickle.

Runs against real torch (installed into .venv by scripts/python-env.sh). The wheel test venvs
do not install torch, so there this module is skipped; the suite in .venv runs it.
"""

import collections
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import treepack  # noqa: E402

ALL_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
]


def _bits(t):
    """The tensor's bytes, for exact comparison of every dtype (NaN payloads, float8)."""
    t = t.detach().resolve_conj().contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes()


def _manifest(loc):
    text = open(os.path.join(loc, "treepack.json")).read()
    return json.loads(text)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: str(d).split(".")[1])
def test_every_dtype_round_trips_bit_for_bit(loc, dtype):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(64, 33, generator=g) * 40
    t = (base > 0) if dtype == torch.bool else base.to(dtype)
    small = t[:2, :3].clone()  # inline in the manifest
    treepack.save({"big": t, "small": small, "scalar": t[0, 0].clone()}, loc)
    out = treepack.load(loc)
    for k, want in {"big": t, "small": small, "scalar": t[0, 0]}.items():
        got = out[k]
        assert type(got) is torch.Tensor and got.dtype == dtype and got.shape == want.shape, k
        assert _bits(got) == _bits(want), k
    root = _manifest(loc)["root"]
    assert _manifest(loc)["version"] == [1, 4]  # annotations (1.3), dicts as objects (1.4)
    node = root["big"]
    assert node["as"] == {"type": "torch.Tensor"}
    assert node["dtype"] == str(dtype).split(".")[1]


def test_views_and_non_contiguous_tensors_are_saved_as_their_values(loc):
    x = torch.arange(120.0).reshape(10, 12)
    tree = {"strided": x[::2, 1::3], "t": x.t(), "expanded": torch.ones(3, 1).expand(3, 5), "conj": torch.tensor([1 + 2j]).conj(),
            "neg": torch.tensor([1 + 2j]).conj().imag, "offset": x[3:5]}
    treepack.save(tree, loc)
    out = treepack.load(loc)
    for k, v in tree.items():
        assert torch.equal(out[k], v.resolve_conj().resolve_neg()), k
    # Alone in its storage, a view comes back as its values.
    for k in ("expanded", "conj", "neg"):
        assert out[k].is_contiguous(), k
    # Views of one storage come back as views of one storage, as torch.load gives them.
    ptrs = {out[k].untyped_storage().data_ptr() for k in ("strided", "t", "offset")}
    assert len(ptrs) == 1
    for k in ("strided", "t", "offset"):
        assert out[k].stride() == tree[k].stride() and out[k].storage_offset() == tree[k].storage_offset(), k


def test_parameters_and_requires_grad_are_kept(loc):
    p = torch.nn.Parameter(torch.randn(3, 4))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    leaf = torch.randn(5, requires_grad=True)
    treepack.save({"p": p, "frozen": frozen, "leaf": leaf, "plain": torch.zeros(1)}, loc)
    out = treepack.load(loc)
    assert type(out["p"]) is torch.nn.Parameter and out["p"].requires_grad and torch.equal(out["p"], p)
    assert type(out["frozen"]) is torch.nn.Parameter and not out["frozen"].requires_grad
    assert type(out["leaf"]) is torch.Tensor and out["leaf"].requires_grad and out["leaf"].is_leaf
    assert not out["plain"].requires_grad
    items = _manifest(loc)["root"]
    assert items["p"]["as"] == {"type": "torch.nn.Parameter", "requires_grad": True}
    assert items["leaf"]["as"] == {"type": "torch.Tensor", "requires_grad": True}


def test_the_same_tensor_twice_is_one_tensor(loc):
    t = torch.randn(100)
    out = treepack.load(treepack.save({"a": t, "b": t, "c": [t]}, loc) and loc)
    assert out["a"] is out["b"] is out["c"][0]


def _model():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    return torch.nn.Sequential(
        torch.nn.Embedding(100, 32), torch.nn.TransformerEncoder(layer, 2), torch.nn.LayerNorm(32),
        torch.nn.BatchNorm1d(8), torch.nn.Linear(32, 100),
    )


def _trained():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    for i in range(3):
        x = torch.randint(0, 100, (4, 8), generator=torch.Generator().manual_seed(i))
        loss = model(x).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model, opt, sched


def test_a_whole_checkpoint_round_trips_and_load_state_dict_accepts_it(loc):
    model, opt, sched = _trained()
    ckpt = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "sched": sched.state_dict()}
    treepack.save(ckpt, loc)
    out = treepack.load(loc)
    sd = out["model"]
    assert type(sd) is collections.OrderedDict and list(sd) == list(ckpt["model"])
    assert sd._metadata == ckpt["model"]._metadata
    for k, v in ckpt["model"].items():
        assert type(sd[k]) is torch.Tensor and sd[k].dtype == v.dtype and torch.equal(sd[k], v), k
    assert sd["3.num_batches_tracked"].dtype == torch.int64
    model2 = _model()
    assert not torch.equal(model2[4].weight, model[4].weight)
    res = model2.load_state_dict(sd, strict=True)
    assert not res.missing_keys and not res.unexpected_keys
    # Optimizer state: int keys, tensors (step is a float32 tensor), scalars, tuples.
    o = out["optim"]
    assert list(o["state"]) == list(ckpt["optim"]["state"]) and all(type(k) is int for k in o["state"])
    for k, st in ckpt["optim"]["state"].items():
        for name, v in st.items():
            assert torch.equal(o["state"][k][name], v) and o["state"][k][name].dtype == v.dtype, (k, name)
    assert o["param_groups"] == ckpt["optim"]["param_groups"]
    assert o["param_groups"][0]["betas"] == (0.9, 0.999)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    opt2.load_state_dict(o)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 10)
    sched2.load_state_dict(out["sched"])
    assert out["epoch"] == 3 and sched2.last_epoch == sched.last_epoch
    # The restored pair trains on exactly as the original does.
    x = torch.randint(0, 100, (4, 8), generator=torch.Generator().manual_seed(9))
    for m, op in ((model, opt), (model2, opt2)):
        m.eval()
        loss = m(x).logsumexp(-1).mean()
        op.zero_grad()
        loss.backward()
        op.step()
    for (k, a), (_, b) in zip(model.named_parameters(), model2.named_parameters()):
        assert torch.equal(a, b), k


def test_like_loads_into_the_existing_tensors_in_place(loc):
    model, opt, _ = _trained()
    treepack.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 7}, loc)
    target = _model()
    sd = target.state_dict()
    ptrs = {k: v.data_ptr() for k, v in sd.items()}
    out = treepack.load(loc, like={"model": sd, "optim": True, "epoch": True})
    assert out["epoch"] == 7 and type(out["model"]) is collections.OrderedDict
    assert out["model"]._metadata == model.state_dict()._metadata
    for k, v in out["model"].items():
        assert v is sd[k] and v.data_ptr() == ptrs[k], k
    for (k, a), (_, b) in zip(model.named_parameters(), target.named_parameters()):
        assert torch.equal(a, b), k  # the model's own parameters now hold the saved values
    assert torch.equal(out["optim"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_like_in_place_handles_bf16_non_contiguous_and_reports_mismatches(loc):
    saved = {"w": torch.randn(8, 6).to(torch.bfloat16), "t": torch.arange(12.0).reshape(3, 4), "n": torch.arange(5)}
    treepack.save(saved, loc)
    dst = {"w": torch.zeros(8, 6, dtype=torch.bfloat16), "t": torch.zeros(4, 3).t(), "n": torch.zeros(5, dtype=torch.int64)}
    t_before = dst["t"]
    out = treepack.load(loc, like=dst)
    assert out["w"] is dst["w"] and torch.equal(dst["w"], saved["w"])
    assert out["t"] is t_before and torch.equal(dst["t"], saved["t"])
    assert torch.equal(dst["n"], saved["n"])
    with pytest.raises(ValueError, match=r"`w` the file holds bfloat16 with shape \(8, 6\), but the tensor to load into is float32"):
        treepack.load(loc, like={**dst, "w": torch.zeros(8, 6)})
    with pytest.raises(ValueError, match=r"`n` the file holds int64 with shape \(5,\).*shape \(6,\)"):
        treepack.load(loc, like={**dst, "n": torch.zeros(6, dtype=torch.int64)})
    with pytest.raises(ValueError, match="has no key 'n'"):
        treepack.load(loc, like={"w": dst["w"], "t": dst["t"]})


def test_mmap_gives_tensors_over_the_file_that_can_be_written_without_touching_it(loc):
    a = torch.randn(256, 256)
    treepack.save({"a": a, "b": a.clone(), "p": torch.nn.Parameter(torch.ones(64, 64))}, loc)
    out = treepack.load(loc, mmap=True)
    assert torch.equal(out["a"], a) and torch.equal(out["b"], a)
    # "a" and "b" have equal bytes, stored once: they must not alias in memory.
    out["a"] += 1
    assert torch.equal(out["b"], a) and torch.equal(out["a"], a + 1)
    out["p"].data.mul_(3)
    again = treepack.load(loc)
    assert torch.equal(again["a"], a) and torch.equal(again["p"], torch.ones(64, 64))
    assert treepack.verify(loc).ok


def test_map_location(loc):
    treepack.save({"x": torch.ones(4), "p": torch.nn.Parameter(torch.zeros(2))}, loc)
    meta = treepack.load(loc, map_location="meta")
    assert meta["x"].device.type == "meta" and type(meta["p"]) is torch.nn.Parameter and meta["p"].device.type == "meta"
    by_dict = treepack.load(loc, map_location={"cpu": torch.device("meta")})
    assert by_dict["x"].device.type == "meta"
    seen = []
    out = treepack.load(loc, map_location=lambda t, saved: seen.append(saved) or t * 2)
    # As torch.load: a tensor saved from the CPU names "cpu" as its saved location.
    assert seen == ["cpu", "cpu"] and torch.equal(out["x"], torch.full((4,), 2.0))


def test_tensors_that_cannot_be_stored_are_refused_with_what_to_do(loc):
    cases = {
        "quantized": (torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8), r"quantized tensor.*dequantize"),
        "complex32": (torch.zeros(2, dtype=torch.complex32), r"complex32 has no treepack dtype.*complex64"),
        "meta": (torch.empty(2, device="meta"), "meta device has no data"),
    }
    for name, (t, msg) in cases.items():
        with pytest.raises(TypeError, match=rf"cannot save `x/{name}`: .*{msg}"):
            treepack.save({"x": {name: t}}, loc)


def test_sparse_tensors_of_every_layout_round_trip(loc):
    i = torch.tensor([[0, 1, 1, 1], [2, 0, 2, 2]])
    coo = torch.sparse_coo_tensor(i, torch.tensor([3.0, 4.0, 5.0, 1.0]), (2, 3))  # uncoalesced: (1, 2) twice
    dense = torch.arange(12.0).reshape(3, 4)
    dense[dense % 3 != 0] = 0
    tree = {
        "coo": coo, "coalesced": coo.coalesce(), "hybrid": torch.randn(3, 4, 2).to_sparse(1),
        "csr": dense.to_sparse_csr(), "csc": dense.to_sparse_csc(), "bsr": dense.to_sparse_bsr((1, 2)),
        "bsc": dense.to_sparse_bsc((3, 1)), "grad": coo.coalesce().double().requires_grad_(True),
        "empty": torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (5, 5)),
    }
    treepack.save(tree, loc)
    back = treepack.load(loc)
    for k, t in tree.items():
        b = back[k]
        assert b.layout == t.layout and b.shape == t.shape and b.dtype == t.dtype, k
        assert torch.equal(b.to_dense(), t.to_dense()) and b._nnz() == t._nnz(), k
        assert b.requires_grad == t.requires_grad, k
    assert not back["coo"].is_coalesced() and back["coalesced"].is_coalesced()
    assert torch.equal(back["coo"]._indices(), coo._indices())  # the duplicate is kept as stored
    s = treepack.load_structure(loc)["csr"]
    assert s.type_name == "py.torch_sparse" and s.data == {"layout": "csr", "size": [3, 4]}


def test_hostile_sparse_tensors_are_refused(loc, edits_refused):
    treepack.save({"s": torch.sparse_coo_tensor(torch.tensor([[0], [2]]), torch.tensor([1.0]), (2, 3))}, loc)
    edits_refused(loc, [
        (b'"size":[2,3]', b'"size":[2,2]', "stored coo tensor does not hold together"),
        (b'"size":[2,2]', b'"size":[2,-3]', "needs a list of sizes"),
        (b'"layout":"coo","size":[2,-3]', b'"layout":"xyz","size":[2,3]', "unknown sparse layout 'xyz'"),
    ])


def test_without_torch_the_error_names_the_leaves_and_placeholder_gives_numpy(loc):
    treepack.save({"a": torch.zeros(3), "b": {"c": torch.ones(2, dtype=torch.bfloat16)}, "n": np.arange(2)}, loc)
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import numpy as np, treepack
        try:
            treepack.load({loc!r})
        except ImportError as e:
            print("ERR", e)
        out = treepack.load({loc!r}, on_missing="placeholder")
        print(type(out["a"]).__name__, out["b"]["c"].dtype, out["a"].tolist())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = r.stdout.splitlines()
    assert lines[0] == (
        "ERR this tree holds 2 torch tensor(s) (`a`, `b/c`) but torch cannot be imported: install it (pip install torch, "
        "or pip install 'treepack[torch]'), or pass on_missing='placeholder' to load them as numpy arrays"
    )
    assert lines[1] == "ndarray bfloat16 [0.0, 0.0, 0.0]"


def test_loading_a_tree_without_tensors_never_imports_torch(loc):
    treepack.save({"x": np.arange(3), "y": [1, "a"]}, loc)
    code = f"import sys, treepack; treepack.load({loc!r}); treepack.load_structure({loc!r}); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_a_tensor_tree_is_plain_arrays_to_readers_that_do_not_know_torch(loc):
    # Other tools see arrays: the structure, lazy views and slices are numpy's.
    treepack.save({"w": torch.arange(12.0).reshape(3, 4)}, loc)
    info = treepack.load_structure(loc)["w"]
    assert (info.kind, info.dtype, info.shape) == ("array", "float32", (3, 4))
    view = treepack.open(loc)
    np.testing.assert_array_equal(view["w"][1:, 2], np.array([6.0, 10.0], dtype=np.float32))


def test_the_golden_1_3_file_loads_as_tensors():
    # tests/golden/demo-torch, written by the Rust writer (format 1.3): what docs/format.md's
    # annotation table says comes back.
    from pathlib import Path

    golden = str(Path(__file__).resolve().parents[2] / "tests" / "golden" / "demo-torch")
    out = treepack.load(golden, select=["weight", "step"])  # (the demo beside them holds Rust records)
    w = out["weight"]
    assert type(w) is torch.nn.Parameter and w.requires_grad and w.dtype == torch.bfloat16 and w.shape == (256, 256)
    assert w[0, :2].tolist() == [1.0, 1.0078125]
    assert type(out["step"]) is torch.Tensor and out["step"].tolist() == [3, 4] and out["step"].device.type == "cpu"
    seen = []
    treepack.load(golden, select=["weight", "step"], map_location=lambda t, saved: seen.append(saved) or t)
    assert sorted(map(str, seen)) == ["cpu", "cuda:0"]


def test_an_annotation_naming_any_other_type_is_never_acted_on(loc):
    # A hostile file may put any `type` in an array's annotation: the binding matches it against
    # its fixed table only, so an unknown one is a plain array and nothing is imported.
    import blake3

    treepack.save({"x": np.arange(3, dtype=np.int8)}, loc)
    p = os.path.join(loc, "treepack.json")
    raw = open(p, "rb").read()
    body = raw[: -86].replace(b'"shape":[3],', b'"shape":[3],"as":{"type":"evil_module_xyz.Boom","args":["rm"]},')
    open(p, "wb").write(body + b',\n"manifest_hash":"' + blake3.blake3(body).hexdigest().encode() + b'"}\n')
    out = treepack.load(loc)
    assert type(out["x"]) is np.ndarray and out["x"].tolist() == [0, 1, 2]
    assert "evil_module_xyz" not in sys.modules
    bad = body.replace(b'{"type":"evil_module_xyz.Boom","args":["rm"]}', b'"torch.Tensor"')
    open(p, "wb").write(bad + b',\n"manifest_hash":"' + blake3.blake3(bad).hexdigest().encode() + b'"}\n')
    with pytest.raises(treepack.FormatError, match="`as` must be a JSON object"):
        treepack.load(loc)
