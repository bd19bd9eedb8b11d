"""Exact for torch users (issue 51): a model built on the meta device loads for real, tensors
that share storage share it again, and map_location callables see the saved device."""

import numpy as np
import pytest

import treepack

torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied, as GPT-2's lm_head and wte


def test_like_a_model_built_on_the_meta_device_loads_real_tensors(tmp_path):
    torch.manual_seed(0)
    src = Net()
    p = str(tmp_path / "sd")
    treepack.save(src.state_dict(), p)
    with torch.device("meta"):
        model = Net()
    like = model.state_dict()
    assert all(t.device.type == "meta" for t in like.values())
    sd = treepack.load(p, like=like)
    assert set(sd) == set(src.state_dict())
    for k, v in sd.items():
        assert isinstance(v, torch.Tensor) and v.device.type == "cpu", (k, v)
        assert torch.equal(v, src.state_dict()[k]), k
    model.load_state_dict(sd, assign=True)
    x = torch.tensor([1, 2, 3])
    assert torch.equal(model.head(model.body(model.emb(x))), src.head(src.body(src.emb(x))))
    # A meta template for one leaf inside an ordinary tree; and a mismatch is still refused.
    sd2 = treepack.load(p, like={k: (torch.empty(v.shape, device="meta") if k == "body.bias" else True) for k, v in like.items()})
    assert sd2["body.bias"].device.type == "cpu" and torch.equal(sd2["body.bias"], src.body.bias.detach())
    with pytest.raises(ValueError, match="body.bias"):
        treepack.load(p, like={**like, "body.bias": torch.empty((5,), device="meta")})


def test_a_meta_template_over_numpy_leaves_gives_tensors(tmp_path):
    p = str(tmp_path / "t")
    treepack.save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, p)
    out = treepack.load(p, like={"w": torch.empty((2, 3), device="meta")})
    assert isinstance(out["w"], torch.Tensor) and out["w"].device.type == "cpu"
    assert out["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    param = torch.nn.Parameter(torch.empty((2, 3), device="meta"))
    out = treepack.load(p, like={"w": param})
    assert isinstance(out["w"], torch.nn.Parameter)


def test_map_location_callables_get_the_saved_device(tmp_path):
    p = str(tmp_path / "t")
    treepack.save({"t": torch.ones(2)}, p)
    seen = []
    treepack.load(p, map_location=lambda t, dev: seen.append(dev) or t)
    assert seen == ["cpu"]


def test_tied_weights_and_views_share_storage_again(tmp_path):
    torch.manual_seed(0)
    src = Net()
    sd = src.state_dict()
    base = torch.arange(10.0)
    tree = {"sd": sd, "base": base, "view": base[2:5], "strided": base[::3], "alone": torch.ones(3)}
    p = str(tmp_path / "t")
    treepack.save(tree, p)
    ref = torch.load(_torch_save(tree, tmp_path), weights_only=True)
    back = treepack.load(p)
    # Tied: one storage, as torch.load gives.
    assert ref["sd"]["emb.weight"].untyped_storage().data_ptr() == ref["sd"]["head.weight"].untyped_storage().data_ptr()
    a, b = back["sd"]["emb.weight"], back["sd"]["head.weight"]
    assert torch.equal(a, src.emb.weight.detach()) and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    with torch.no_grad():
        a[0, 0] = 123.0
    assert b[0, 0].item() == 123.0
    # Views: writes through one show in the others.
    assert torch.equal(back["view"], torch.tensor([2.0, 3.0, 4.0])) and torch.equal(back["strided"], base[::3])
    back["base"][3] = -1.0
    assert back["view"][1].item() == -1.0 and back["strided"][1].item() == -1.0
    assert back["alone"].untyped_storage().data_ptr() != back["base"].untyped_storage().data_ptr()
    # Stored once each: the tied pair's bytes are one chunk.
    text = open(p + "/treepack.json").read()
    assert text.count('"storage":{"id":0') == 2 and '"storage":{"id":1' in text, text[:2000]
    # Each tensor still loads alone.
    only = treepack.load(p, select="sd/head.weight")["sd"]["head.weight"]
    assert torch.equal(only, src.emb.weight.detach())


def test_trees_without_shared_storage_carry_no_storage_annotation(tmp_path):
    p = str(tmp_path / "t")
    treepack.save({"a": torch.ones(3), "b": torch.zeros(3)}, p)
    assert '"storage"' not in open(p + "/treepack.json").read()


def test_a_hostile_storage_annotation_cannot_make_a_load_allocate(tmp_path, rewrite_manifest):
    # Strides or offsets that would reach gigabytes: the tensor loads as its own values, alone,
    # instead of the load allocating what the annotation says.
    base = torch.arange(4.0)
    p = str(tmp_path / "t")
    treepack.save({"a": base, "b": base[1:3]}, p)
    rewrite_manifest(p, b'"offset":1,"stride":[1]', b'"offset":1,"stride":[100000000000]')
    back = treepack.load(p)
    assert torch.equal(back["b"], torch.tensor([1.0, 2.0])) and back["b"].untyped_storage().nbytes() == 8
    # Many storages each asking for a megabyte past a few bytes of values: one budget per load.
    many = {f"t{i}": (lambda t: [t, t[1:]])(torch.arange(3.0)) for i in range(300)}
    p2 = str(tmp_path / "t2")
    treepack.save(many, p2)
    text = open(p2 + "/treepack.json", "rb").read()
    assert text.count(b'"offset":1,"stride":[1]') == 300
    rewrite_manifest(p2, b'"offset":1,"stride":[1]', b'"offset":262000,"stride":[1]')
    back = treepack.load(p2)
    total = sum({v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for pair in back.values() for v in pair}.values())
    assert total <= 8 * 300 * (12 + 8) + (1 << 20) + 300 * 12, total
    assert all(torch.equal(pair[1], torch.tensor([1.0, 2.0])) for pair in back.values())


def _torch_save(tree, tmp_path):
    f = str(tmp_path / "ref.pt")
    torch.save(tree, f)
    return f


def test_like_through_a_shared_leaf(tmp_path):
    # One array at two places (a ref in the file): a template array or ShapeDtypeStruct at the
    # ref place matches the object it names (JAX's own pytree test tree has such leaves).
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    p = str(tmp_path / "t")
    treepack.save({"x": a, "y": a, "z": [a]}, p)
    st = treepack.load_structure(p)
    assert st["y"].kind == "ref"
    out = treepack.load(p, like={"x": np.zeros((2, 3), np.float32), "y": np.zeros((2, 3), np.float32), "z": [None]})
    assert np.array_equal(out["y"], a) and np.array_equal(out["x"], a)
    out = treepack.load(p, like={"x": None, "y": np.zeros((2, 3), np.float32), "z": [True]})
    assert np.array_equal(out["y"], a) and np.array_equal(out["z"][0], a)
    with pytest.raises(ValueError, match="`y`"):
        treepack.load(p, like={"x": None, "y": np.zeros((3, 3), np.float32), "z": None})
    jax = pytest.importorskip("jax")
    sds = jax.ShapeDtypeStruct((2, 3), jax.numpy.float32)
    out = treepack.load(p, like={"x": sds, "y": sds, "z": [sds]})
    assert all(isinstance(v, jax.Array) for v in (out["x"], out["y"], out["z"][0]))
    assert np.array_equal(np.asarray(out["y"]), a)


def _load_in_child(path, q):
    try:
        sd = treepack.load(path)
        q.put(bool(sd["a"].untyped_storage().data_ptr() == sd["b"].untyped_storage().data_ptr()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put(repr(e))


def test_a_forked_worker_loads_tied_weights(tmp_path):
    # A DataLoader-style worker forked after the parent ran torch on its thread pool: torch's
    # own kernels hang there, so rebuilding shared storage must not call them.
    import multiprocessing as mp

    w = torch.randn(512, 512)
    (w @ w).sum()  # the parent's thread pool is up
    torch.zeros(10**7).add_(1)
    p = str(tmp_path / "t")
    big = torch.randn(1024, 512)
    treepack.save({"a": big, "b": big[:], "c": big[3:]}, p)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_load_in_child, args=(p, q))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        raise AssertionError("the forked worker hung loading tied weights")
    assert q.get(timeout=5) is True


def test_a_small_view_before_its_big_base_and_a_select_of_one_view_load(tmp_path):
    w = torch.randn(512, 512)
    p = str(tmp_path / "t")
    treepack.save({"tail": w[-2:], "w": w, "head": w[:2]}, p)
    back = treepack.load(p)
    assert torch.equal(back["tail"], w[-2:]) and torch.equal(back["w"], w) and torch.equal(back["head"], w[:2])
    # What comes after its base in the file shares it again.
    assert back["head"].untyped_storage().data_ptr() == back["w"].untyped_storage().data_ptr()
    assert torch.equal(treepack.load(p, select="tail")["tail"], w[-2:])
