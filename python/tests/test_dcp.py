"""torch.distributed.checkpoint (DCP) folders read as trees without pickle (issue 54): a folder
`dcp.save` wrote loads, opens, lists and converts as the flat mapping it holds (entries by their
fully qualified names), tensors as torch tensors; its `.metadata` is read by the core's
never-executing pickle reader under DCP's own allow-list."""

from __future__ import annotations

import os
import pickle
import warnings

import numpy as np
import pytest

import treepack

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")


def trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(5, 4)).sum().backward()
    opt.step()
    return model, opt


def save(state, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is not initialized: a single process"
        dcp.save(state, checkpoint_id=str(path))


def flat(state):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    return flatten_state_dict(state)[0]


def same(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}/{i}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} vs {b!r}"


def test_a_model_and_its_optimizer_load_as_the_flattened_state(tmp_path):
    model, opt = trained()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 11, "note": "run 3"}
    d = tmp_path / "ckpt"
    save(state, d)
    assert (d / ".metadata").exists() and list(d.glob("*.distcp"))
    got = treepack.load(d)
    want = flat(state)
    with open(d / ".metadata", "rb") as f:
        order = list(pickle.load(f).state_dict_metadata)  # our own file: trusted
    assert type(got) is dict and list(got) == order and set(got) == set(want)
    for k, v in want.items():
        same(v, got[k], k)
    assert isinstance(got["model.0.weight"], torch.Tensor)
    assert got["optim.param_groups.0.betas"] == (0.9, 0.999)
    # The model's part is its state_dict: into a fresh model.
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    fresh.load_state_dict({k[len("model."):]: v for k, v in got.items() if k.startswith("model.")})
    x = torch.randn(2, 4)
    assert torch.equal(fresh(x), model(x))
    assert isinstance(treepack.load(d, numpy=True)["model.0.bias"], np.ndarray)


def test_every_reading_path_takes_the_folder(tmp_path):
    model, _ = trained()
    d = tmp_path / "ckpt"
    save({"model": model.state_dict(), "step": 3}, d)
    s = treepack.load_structure(d)
    assert (s["model.0.weight"].dtype, s["model.0.weight"].shape) == ("float32", (3, 4))
    part = treepack.load(d, select=["model.2.bias"])
    assert torch.equal(part["model.2.bias"], model[2].bias.detach())
    assert np.array_equal(np.asarray(treepack.open(d)["model.0.bias"][...]), model[0].bias.detach().numpy())
    treepack.convert(d, tmp_path / "x.tpk")
    back = treepack.load(tmp_path / "x.tpk")
    assert torch.equal(back["model.0.weight"], model[0].weight.detach()) and back["step"] == 3
    treepack.convert(d, tmp_path / "x.safetensors", select=["model.*"])  # safetensors holds only arrays
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "x.safetensors")["model.2.weight"], model[2].weight.detach())
    with pytest.raises(Exception, match="read as a tree but not written"):
        treepack.save({"x": 1}, d, overwrite=True)


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_metadata_naming_code_is_refused_and_nothing_runs(tmp_path):
    d = tmp_path / "ckpt"
    save({"w": torch.ones(2)}, d)
    with open(d / ".metadata", "rb") as f:
        md = pickle.load(f)
    pwned = tmp_path / "PWNED"
    md.planner_data = {"w": Evil(pwned)}
    with open(d / ".metadata", "wb") as f:
        pickle.dump(md, f)
    with pytest.raises(treepack.TreepackError, match="system"):
        treepack.load(d)
    assert not pwned.exists()
