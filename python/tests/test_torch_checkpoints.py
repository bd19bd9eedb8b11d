"""torch.save checkpoints read as trees without pickle (issue 54): found by their content,
whatever their name; loaded, opened, listed and converted by the one reader in the core, which
interprets the pickle as data and never imports or calls what it names."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import treepack
from hostile_harness import CANARY_MODULE, Hostile

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg)


def trained_optimizer(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.arange(8)[None]).logits.sum().backward()
    opt.step()
    return opt


def same(a, b, where="<root>"):
    """Deep equality of what torch.load gives and what treepack gives."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
        assert a.requires_grad == b.requires_grad, where
        return
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}/{i}")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def test_a_gpt2_state_dict_and_its_adamw_state_load_as_torch_load_gives_them(tmp_path):
    model = tiny_gpt2()
    opt = trained_optimizer(model)
    sd, osd = tmp_path / "pytorch_model.bin", tmp_path / "optimizer.pt"
    torch.save(model.state_dict(), sd)
    torch.save(opt.state_dict(), osd)
    # The name says nothing (".bin"): the content does.
    got = treepack.load(sd)
    ref = torch.load(sd, weights_only=True)
    same(ref, got)
    assert got._metadata == ref._metadata  # the state_dict's versions, which load_state_dict reads
    # Tied weights stay tied, as torch.load gives them.
    tied = ("lm_head.weight", "transformer.wte.weight")
    assert ref[tied[0]].data_ptr() == ref[tied[1]].data_ptr()
    assert got[tied[0]].data_ptr() == got[tied[1]].data_ptr()
    assert "transformer.h.0.attn.c_attn.weight" in got  # flat, keys as stored
    fresh = tiny_gpt2()
    torch.nn.init.zeros_(fresh.transformer.wte.weight)
    fresh.load_state_dict(got)
    assert torch.equal(fresh.transformer.wte.weight, model.transformer.wte.weight)
    o = treepack.load(osd)
    same(torch.load(osd, weights_only=True), o)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    opt2.load_state_dict(o)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_structure_selection_open_and_conversion(tmp_path):
    model = tiny_gpt2()
    p = tmp_path / "model.pt"
    torch.save(model.state_dict(), p)
    s = treepack.load_structure(p)
    info = s["transformer.wte.weight"]
    assert (info.dtype, info.shape) == ("float32", (97, 32))
    part = treepack.load(p, select=["lm_head.weight"])
    assert torch.equal(part["lm_head.weight"], model.lm_head.weight.detach())
    assert part["transformer.wte.weight"] is None  # not selected: not read
    v = treepack.open(p)
    assert np.array_equal(np.asarray(v["transformer.ln_f.bias"][:4]), model.transformer.ln_f.bias.detach().numpy()[:4])
    n = treepack.convert(p, tmp_path / "m.safetensors", separator=None)
    assert n["tensors"] == len(model.state_dict())
    from safetensors.torch import load_file

    st = load_file(tmp_path / "m.safetensors")
    assert torch.equal(st["transformer.h.1.mlp.c_fc.weight"], model.transformer.h[1].mlp.c_fc.weight.detach())
    treepack.convert(p, tmp_path / "m.tpk")
    same(torch.load(p, weights_only=True), treepack.load(tmp_path / "m.tpk"))
    with pytest.raises(ValueError, match="does not write them"):
        treepack.convert(tmp_path / "m.tpk", tmp_path / "back.pt")
    # A checkpoint's tree is read, never written to.
    with pytest.raises(Exception, match="read as a tree but not written"):
        treepack.save({"x": 1}, p, overwrite=True)
    torch.load(p, weights_only=True)  # still the checkpoint it was


def test_the_cli_inspects_a_checkpoint_without_python(tmp_path):
    cli = Path(__file__).resolve().parents[2] / "target" / "debug" / "treepack"
    if not cli.exists():
        pytest.skip("the CLI is built by cargo (scripts/test.sh builds it before the Python suite)")
    p = tmp_path / "weights.bin"
    torch.save({"w": torch.ones(2, 3), "step": 7}, p)
    out = subprocess.run([str(cli), "inspect", str(p)], capture_output=True, text=True, check=True).stdout
    assert "torch.save checkpoint" in out and "w: float32[2, 3]" in out and "step: int 7" in out


def written_beside_canary(h: Hostile, write):
    """``write()``'s result, made with the canary module importable (a payload must name it);
    then the canary's traces of being written are cleared, so that the test sees only what a
    load does."""
    sys.path.insert(0, str(h.modules))
    try:
        return write()
    finally:
        sys.path.remove(str(h.modules))
        sys.modules.pop(CANARY_MODULE, None)
        for f in ("IMPORTED", "CONSTRUCTED"):
            (h.outside / f).unlink(missing_ok=True)
        h.before = __import__("hostile_harness")._snapshot(h.outside)


def checkpoint_with(tmp_path: Path, name: str, pkl: bytes) -> Path:
    """A zip laid out as torch.save lays one out, holding the pickle ``pkl``."""
    p = tmp_path / name
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    return p


class Evil:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize(
    "name, payload, named",
    [
        ("system", lambda o: Evil(os.system, (f"touch {o}/PWNED",)), "system"),
        ("popen", lambda o: Evil(subprocess.Popen, (["touch", f"{o}/PWNED"],)), "Popen"),
        ("eval", lambda o: Evil(eval, (f"open('{o}/PWNED', 'w')",)), "eval"),
        ("canary", lambda o: {"w": Evil(_canary_class(), ())}, CANARY_MODULE),
    ],
)
def test_a_checkpoint_naming_code_is_refused_and_nothing_runs(tmp_path, name, payload, named):
    h = Hostile(tmp_path)
    pkl = written_beside_canary(h, lambda: pickle.dumps({"state": payload(h.outside)}, protocol=2))
    p = checkpoint_with(tmp_path, f"{name}.pt", pkl)
    for call in ("treepack.load(P)", "treepack.load_structure(P)", "treepack.open(P)", "treepack.convert(P, LOC)"):
        r = h.error(f"import treepack\nP = {str(p)!r}\n{call}\n", "TreepackError", "Exception", match=named)
        assert "state" in r["message"], r["message"]  # the key path where it was met
    assert not (h.outside / "PWNED").exists()


def _canary_class():
    import importlib

    return importlib.import_module(CANARY_MODULE).Boom


def test_a_legacy_checkpoint_and_a_bare_pickle_are_told_apart(tmp_path):
    legacy = tmp_path / "old.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(Exception, match="legacy torch.save format"):
        treepack.load(legacy)
    # A zip that is not a checkpoint (an .npz named .pt) is read as what it holds.
    npz = tmp_path / "arrays.pt"
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(3))
    npz.write_bytes(buf.getvalue())
    assert np.array_equal(treepack.load(npz)["a"], np.arange(3))


def test_a_safetensors_file_is_read_flat_wherever_a_location_is(tmp_path):
    from safetensors.numpy import save_file as save_numpy
    from safetensors.torch import save_file

    model = tiny_gpt2()
    p = tmp_path / "model.safetensors"
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
    save_file(sd, p, metadata={"format": "pt"})
    got = treepack.load(p)
    assert sorted(got) == sorted(sd)  # flat, names as stored
    assert all(isinstance(v, torch.Tensor) and torch.equal(v, sd[k]) for k, v in got.items())  # "format": "pt"
    fresh = tiny_gpt2()
    fresh.load_state_dict(got, strict=False)
    assert torch.equal(fresh.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].attn.c_attn.weight)
    assert isinstance(treepack.load(p, numpy=True)["transformer.wpe.weight"], np.ndarray)
    assert treepack.load(p, separator=".")["transformer"]["h"]["0"]["ln_1"]["bias"].shape == (32,)
    assert treepack.load_structure(p)["transformer.wte.weight"].shape == (97, 32)
    assert np.array_equal(np.asarray(treepack.open(p)["transformer.ln_f.bias"][:3]), sd["transformer.ln_f.bias"][:3])
    # A file without that mark holds arrays; an existing file is overwritten as a file by convert.
    q = tmp_path / "arrays.safetensors"
    save_numpy({"a.b": np.arange(3.0)}, q)
    assert list(treepack.load(q)) == ["a.b"] and isinstance(treepack.load(q)["a.b"], np.ndarray)
    treepack.save({"x": np.ones(2)}, tmp_path / "t")
    treepack.convert(tmp_path / "t", q, overwrite=True)
    assert list(treepack.load(q)) == ["x"]
    with pytest.raises(Exception, match="read as a tree but not written"):
        treepack.save({"y": 1}, q, overwrite=True)
    with pytest.raises(TypeError, match="separator= applies to files of flat names"):
        treepack.load(tmp_path / "t", separator=".")


def test_a_sharded_save_pretrained_folder_loads_as_its_state_dict(tmp_path):
    # transformers' own writer: model.safetensors.index.json and its shards.
    from safetensors.torch import load_file

    model = tiny_gpt2()
    d = tmp_path / "gpt2"
    model.save_pretrained(d, max_shard_size="40KB")
    shards = sorted(d.glob("model-*-of-*.safetensors"))
    assert (d / "model.safetensors.index.json").exists() and len(shards) >= 3, os.listdir(d)
    want = {}
    for s in shards:
        want.update(load_file(s))
    got = treepack.load(d)
    assert type(got) is dict and set(got) == set(want)
    for k, v in want.items():
        assert isinstance(got[k], torch.Tensor) and got[k].dtype == v.dtype and torch.equal(got[k], v), k
    # Into a fresh model, as from_pretrained would: the tied lm_head is not stored.
    fresh = transformers.GPT2LMHeadModel(model.config)
    missing, unexpected = fresh.load_state_dict(got, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    fresh.tie_weights()
    x = torch.arange(8)[None]
    assert torch.equal(fresh.eval()(x).logits, model.eval()(x).logits)
    # Every reading path takes the folder: structure, open, convert.
    assert set(treepack.load_structure(d)) == set(want)
    k = next(iter(want))
    assert np.array_equal(np.asarray(treepack.open(d)[k][...]), want[k].numpy())
    treepack.convert(d, tmp_path / "gpt2.tpk")
    assert set(treepack.load(tmp_path / "gpt2.tpk")) == set(want)
    # Read-only: a save there is refused rather than mixed into the checkpoint.
    with pytest.raises(Exception, match="read as a tree but not written"):
        treepack.save({"x": np.ones(2)}, d)


def test_torch_shards_in_the_layout_transformers_4_wrote_load_in_order(tmp_path):
    # pytorch_model-0000k-of-0000n.bin shards and pytorch_model.bin.index.json, as
    # save_pretrained(safe_serialization=False) wrote them (transformers 5 writes none): each
    # shard's storages are numbered from 0, so a merge that mixed them would mix tensors.
    import json

    model = tiny_gpt2()
    sd = model.state_dict()
    names = list(sd)
    d = tmp_path / "gpt2-bin"
    d.mkdir()
    parts = [names[j * len(names) // 3:(j + 1) * len(names) // 3] for j in range(3)]
    weight_map = {}
    for j, part in enumerate(parts, 1):
        f = f"pytorch_model-{j:05d}-of-00003.bin"
        torch.save({k: sd[k] for k in part}, d / f)
        weight_map.update({k: f for k in part})
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": dict(sorted(weight_map.items()))}))
    got = treepack.load(d)
    assert list(got) == names  # shard by shard, each in its order: the model's own
    for k in names:
        assert torch.equal(got[k], sd[k]), k
    fresh = transformers.GPT2LMHeadModel(model.config)
    fresh.load_state_dict(got)  # strict: every key
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), sd.values()))


def test_framework_torch_gives_tensors_from_any_file(tmp_path):
    # A safetensors file without "format": "pt" (numpy's writer): arrays, unless asked.
    from safetensors.numpy import save_file

    model = tiny_gpt2()
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    save_file(sd, str(tmp_path / "np.safetensors"))
    assert isinstance(treepack.load(tmp_path / "np.safetensors")["lm_head.weight"], np.ndarray)
    got = treepack.load(tmp_path / "np.safetensors", framework="torch")
    assert all(isinstance(v, torch.Tensor) for v in got.values())
    fresh = transformers.GPT2LMHeadModel(model.config)
    fresh.load_state_dict(got)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    # Nested trees, tuples and an array at two places (one tensor after), bfloat16 too.
    bf = np.asarray(torch.ones(3, dtype=torch.bfloat16).view(torch.int16).numpy()).view(treepack_bf16())
    shared = np.arange(4.0)
    treepack.save({"a": [shared, (shared, 3)], "bf": bf, "s": "x"}, tmp_path / "t")
    t = treepack.load(tmp_path / "t", framework="torch")
    assert isinstance(t["a"][0], torch.Tensor) and t["a"][1][0] is t["a"][0] and t["a"][1][1] == 3
    assert t["bf"].dtype == torch.bfloat16 and t["s"] == "x"
    assert isinstance(treepack.load(tmp_path / "t", framework="numpy")["a"][0], np.ndarray)
    jax = pytest.importorskip("jax")
    j = treepack.load(tmp_path / "t", framework="jax")
    assert isinstance(j["a"][0], jax.Array) and j["a"][1][0] is j["a"][0] and j["bf"].dtype == treepack_bf16()
    with pytest.raises(ValueError, match="framework='tf'"):
        treepack.load(tmp_path / "t", framework="tf")


def treepack_bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def test_framework_torch_converts_arrays_other_libraries_saved(tmp_path):
    jax = pytest.importorskip("jax")
    treepack.save({"j": jax.numpy.arange(3.0), "t": torch.ones(2)}, tmp_path / "mixed")
    assert isinstance(treepack.load(tmp_path / "mixed")["j"], jax.Array)
    t = treepack.load(tmp_path / "mixed", framework="torch")
    assert isinstance(t["j"], torch.Tensor) and torch.equal(t["j"], torch.arange(3.0)) and torch.equal(t["t"], torch.ones(2))
    j = treepack.load(tmp_path / "mixed", framework="jax")
    assert isinstance(j["t"], jax.Array) and isinstance(j["j"], jax.Array)


def test_with_placeholders_a_checkpoint_naming_code_loads_with_unloadables_and_nothing_runs(tmp_path):
    h = Hostile(tmp_path)
    p = tmp_path / "model.pt"

    def write():
        obj = {
            "model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2)},
            "thing": [_canary_class()(), 3],  # pickled as copyreg.__newobj__ + BUILD of its __dict__
            "system": Evil(os.system, (f"touch {h.outside}/PWNED",)),
        }
        torch.save(obj, p)

    written_beside_canary(h, write)
    boom = f"{CANARY_MODULE}.Boom"
    r = h.run(f"""
import numpy as np, treepack
from treepack import _codec, _core
P = {str(p)!r}
t = treepack.load(P, on_missing="placeholder")
assert sorted(t) == ["model", "system", "thing"], t
assert np.array_equal(np.asarray(t["model"]["w"]), np.arange(6, dtype=np.float32).reshape(2, 3))
assert np.array_equal(np.asarray(t["model"]["b"]), np.ones(2, dtype=np.float32))
u = t["thing"][0]
assert isinstance(u, treepack.Unloadable) and u.type_name == {boom!r} and u.data is None, u
assert "refused global" in u.reason and "nothing named by the file was imported or run" in u.reason, u.reason
assert t["thing"][1] == 3
s = t["system"]
assert isinstance(s, treepack.Unloadable) and s.type_name in ("posix.system", "os.system"), s
# Selections too.
t = treepack.load(P, on_missing="placeholder", select="model")
assert t["thing"] == [None, None] and t["system"] is None and set(t["model"]) == {{"w", "b"}}, t
t = treepack.load(P, on_missing="placeholder", select="thing")
assert isinstance(t["thing"][0], treepack.Unloadable) and t["model"] == {{"w": None, "b": None}}, t
# Such a tree loaded strictly would be refused by the audit, naming the placeholder and where.
bad = _codec.audit(_core.Reader.torch_placeholders(P).types(_codec.AUDIT_FREE), (), False)
assert bad["pickle:" + {boom!r}] == ["thing/0"], bad
""", timeout=120)
    assert r["outcome"] == "ok", r.get("traceback", r)
    # The default is as strict as before: refused, naming the global and the key path.
    r = h.error(f"import treepack\ntreepack.load({str(p)!r})\n", "TreepackError", "Exception", match=CANARY_MODULE)
    assert "thing" in r["message"], r["message"]
    assert not (h.outside / "PWNED").exists()


def test_a_whole_load_built_from_the_file_gives_what_the_general_path_gives(tmp_path):
    """A whole load of a checkpoint (or a safetensors file) is built straight from the tree the
    file holds (session 37); a load with select= still goes through the tree in memory. Both
    give the same tensors, tied weights, metadata and flags, mmap=True too."""
    from safetensors.torch import save_file

    model = tiny_gpt2()
    opt = trained_optimizer(model)
    p, o, st = tmp_path / "m.bin", tmp_path / "o.pt", tmp_path / "m.safetensors"
    torch.save(model.state_dict(), p)
    torch.save(opt.state_dict(), o)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, st,
              metadata={"format": "pt"})
    for f in (p, o, st):
        for mmap in (False, True):
            whole = treepack.load(f, mmap=mmap)
            general = treepack.load(f, mmap=mmap, select="**")
            same(general, whole, str(f))
            if f != st:
                same(torch.load(f, weights_only=True), whole, str(f))
    # Tied weights stay tied from a memory map too, on the file's own (copy-on-write) bytes:
    # no storage allocated and copied for them (session 37); a write stays in this process.
    lazy = treepack.load(p, mmap=True)
    assert lazy["lm_head.weight"].data_ptr() == lazy["transformer.wte.weight"].data_ptr()
    lazy["lm_head.weight"][0, 0] = 123.0
    assert float(lazy["transformer.wte.weight"][0, 0]) == 123.0
    assert float(treepack.load(p, mmap=True)["transformer.wte.weight"][0, 0]) == float(model.transformer.wte.weight.detach()[0, 0])
    got = treepack.load(p)
    assert got["lm_head.weight"].data_ptr() == got["transformer.wte.weight"].data_ptr()
    assert got._metadata == torch.load(p, weights_only=True)._metadata
    got["transformer.wte.weight"].add_(1)  # writable, its own memory (the file is unchanged)
    assert torch.equal(torch.load(p, weights_only=True)["transformer.wte.weight"], model.transformer.wte.weight)


@pytest.mark.parametrize("kind", ["torch", "safetensors"])
def test_a_default_load_outlives_its_file_rewritten_in_place(tmp_path, kind):
    """``torch.save(treepack.load(p), p)``: the file is truncated and rewritten while the loaded
    tensors live. A default load copies out of the file, so they keep their values (tensors that
    viewed the file's mapping would die with SIGBUS, as with any mmap load: run in a child)."""
    p = tmp_path / ("m.bin" if kind == "torch" else "m.safetensors")
    code = f"""
import torch, treepack
from safetensors.torch import save_file
p = {str(p)!r}
torch.manual_seed(0)
sd = {{f"w{{i}}": torch.randn(256, 1024) for i in range(8)}}
if {kind!r} == "torch":
    torch.save(sd, p)
else:
    save_file(sd, p)
want = [float(t.sum()) for t in sd.values()]
got = treepack.load(p, framework="torch")
if {kind!r} == "torch":
    torch.save({{"other": torch.zeros(3)}}, p)
else:
    save_file({{"other": torch.zeros(3)}}, p)
assert [float(t.sum()) for t in got.values()] == want
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def test_an_mmap_load_of_a_safetensors_file_gives_read_only_views(tmp_path):
    from safetensors.numpy import save_file

    a = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
    save_file({"a": a, "b": a[:3].copy()}, tmp_path / "n.safetensors")
    got = treepack.load(tmp_path / "n.safetensors", mmap=True)
    assert not got["a"].flags.writeable and np.array_equal(got["a"], a)
    copied = treepack.load(tmp_path / "n.safetensors")
    assert copied["a"].flags.writeable and np.array_equal(copied["a"], a)
