"""Shared references and cycles (issue 26, format 1.2): an object at several places of a tree
(the same id()) is stored once and loads as one object; cycles round-trip; selections and lazy
views go through refs; `shared=False` keeps plain trees; hostile refs are refused clearly."""

import collections
import dataclasses
import fractions
import json
import os

import numpy as np
import pytest

import treepack


@dataclasses.dataclass
class Person:
    name: str
    parent: object = None
    children: list = dataclasses.field(default_factory=list)


TRUST = [__name__ + ".*"]


def manifest(p):
    return json.loads(open(os.path.join(p, "treepack.json")).read()[: -1])


def test_one_object_at_several_places_loads_as_one_object(tmp_path):
    w = np.arange(1000, dtype=np.float32)
    cfg = {"lr": 0.1}
    layers = [1, 2]
    tree = {"enc": {"w": w, "cfg": cfg}, "dec": {"w": w, "cfg": cfg}, "all": [layers, layers], "tied": (w, w)}
    p = str(tmp_path / "t")
    treepack.save(tree, p)
    assert manifest(p)["version"] == [1, 4]  # shared nodes (1.2), dicts as objects (1.4)
    back = treepack.load(p)
    assert back["enc"]["w"] is back["dec"]["w"] is back["tied"][0] is back["tied"][1]
    assert back["enc"]["cfg"] is back["dec"]["cfg"] and back["all"][0] is back["all"][1]
    assert np.array_equal(back["dec"]["w"], w)
    back["enc"]["cfg"]["lr"] = 0.5
    assert back["dec"]["cfg"]["lr"] == 0.5  # the same dict, as it was
    # Stored once: one array node in the manifest.
    assert open(os.path.join(p, "treepack.json")).read().count('"t":"array"') == 1


def test_cycles_round_trip(tmp_path):
    lst = [1]
    lst.append(lst)
    d = {"name": "d"}
    d["me"] = d
    root = Person("root")
    for n in ("a", "b"):
        root.children.append(Person(n, parent=root))
    p = str(tmp_path / "c")
    treepack.save({"lst": lst, "d": d, "family": root}, p)
    back = treepack.load(p, trust=TRUST)
    assert back["lst"][1] is back["lst"] and back["lst"][0] == 1
    assert back["d"]["me"] is back["d"]
    fam = back["family"]
    assert [c.name for c in fam.children] == ["a", "b"]
    assert all(c.parent is fam for c in fam.children)


def test_structure_selection_and_lazy_views_go_through_refs(tmp_path):
    obj = {"x": np.arange(10), "y": "why"}
    p = str(tmp_path / "s")
    treepack.save({"a": obj, "b": obj, "n": 3}, p)
    s = treepack.load_structure(p)
    assert s["b"].kind == "ref" and s["a"]["x"].kind == "array"
    # A ref names the place that holds the object; other leaves have no target.
    assert s["b"].target == "a" and s["a"]["x"].target is None
    assert repr(s["b"]) == "LeafInfo(path='b', kind='ref', dtype=None, shape=None, nbytes=0, inline=True, target='a')"
    assert eval(repr(s["b"]), {"LeafInfo": treepack.LeafInfo}) == s["b"]
    # Big manifests are listed by the outline on a helper thread, in blocks: a ref far from
    # its object still names it.
    rows = [{"i": i, "cfg": obj if i % 1000 == 0 else {"k": i}} for i in range(20_000)]
    big = str(tmp_path / "big")
    treepack.save({"first": obj, "rows": rows}, big)
    s = treepack.load_structure(big)
    assert s["rows"][19000]["cfg"].target == "first" and s["rows"][19001]["cfg"]["k"].target is None
    # Selecting only the ref's place still loads the object (at its own place too).
    back = treepack.load(p, select=["b"])
    assert back["b"] is back["a"] and np.array_equal(back["b"]["x"], np.arange(10))
    assert back["n"] is None
    # Key paths and lazy views continue through a ref.
    v = treepack.open(p)
    assert v["b"].kind == "dict" and sorted(v["b"].keys()) == ["x", "y"]
    assert np.array_equal(v["b"]["x"][2:4], [2, 3])
    assert v["b"]["y"] == "why"
    got = v["b"].read()
    assert got["y"] == "why" and np.array_equal(got["x"], np.arange(10))


def test_shared_false_stores_copies_and_reads_as_before(tmp_path):
    obj = [1, 2]
    p = str(tmp_path / "plain")
    treepack.save([obj, obj], p, shared=False)
    assert manifest(p)["version"] == [1, 0]
    assert treepack.load(p) == [obj, obj]
    treepack.save({"a": obj, "b": obj}, p, shared=False, overwrite=True)
    assert manifest(p)["version"] == [1, 4]  # no shared node (1.2): only its dict's object form
    back = treepack.load(p)
    assert back["a"] == back["b"] and back["a"] is not back["b"]


def test_an_image_dataset_stores_each_image_object_once(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    images = [pil.fromarray(np.full((8, 8, 3), i, np.uint8)) for i in range(10)]
    rows = [{"id": i, "image": images[i % 10]} for i in range(1000)]
    p = str(tmp_path / "imgs")
    treepack.save(rows, p)
    text = open(os.path.join(p, "treepack.json")).read()
    assert text.count('"type":"py.image"') == 10 and text.count('"t":"ref"') == 990
    back = treepack.load(p)
    assert back[0]["image"] is back[10]["image"] and back[3]["image"].tobytes() == images[3].tobytes()


@pytest.mark.parametrize(
    "root, says",
    [
        ('[{"t":"ref","id":0}]', "ref to id 0"),
        ('[{"t":"shared","id":1,"v":[]}]', "out of order"),
        ('{"t":"shared","id":0,"v":{"t":"ref","id":0}}', "must be an object"),
        ('[{"t":"shared","id":0,"v":[]},{"t":"shared","id":0,"v":[]}]', "out of order"),
    ],
)
def test_hostile_refs_are_refused_with_a_clear_error(tmp_path, root, says):
    import blake3

    p = tmp_path / "h"
    p.mkdir()
    body = ('{"format":"treepack","version":[1,2],\n"writer":"hostile",\n"packs":[],\n"root":' + root).encode()
    (p / "treepack.json").write_bytes(body + b',\n"manifest_hash":"' + blake3.blake3(body).hexdigest().encode() + b'"}\n')
    with pytest.raises(treepack.FormatError, match=says):
        treepack.load(str(p))
    with pytest.raises(treepack.FormatError, match=says):
        treepack.open(str(p))


def test_the_golden_1_2_file_loads_with_its_shared_objects():
    import pathlib

    p = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden" / "demo-refs"
    back = treepack.load(str(p), trust=["*"], on_missing="placeholder")
    assert back["again"] is back["model"]
    assert back["cycle"][0] == "loop" and back["cycle"][1] is back["cycle"]
    assert treepack.verify(str(p)).ok


def test_cycles_through_tuples_round_trip_or_are_refused_at_save(tmp_path):
    lst = []
    tup = (lst,)
    lst.append(tup)  # tuple -> list -> the tuple: rebuilt (the list exists before it is filled)
    p = str(tmp_path / "a")
    treepack.save({"t": tup}, p)
    back = treepack.load(p)["t"]
    assert back[0][0] is back
    # A list holding a tuple that holds the list: the tuple would need the list before it is
    # built. Refused when saving, naming the place, never written as a file that cannot load.
    inner = []
    inner.append((inner,))
    with pytest.raises(ValueError, match=r"cannot save `l/0/0`: an object contains itself through a tuple"):
        treepack.save({"l": inner}, str(tmp_path / "b"))

    class Me:
        pass

    treepack.register(Me, name="test.refs.Me", to_data=lambda m: m.me, from_data=lambda d: Me())
    m = Me()
    m.me = m
    with pytest.raises(ValueError, match=r"cannot save `m/data`: an object contains itself through an object of type test.refs.Me"):
        treepack.save({"m": m}, str(tmp_path / "c"))


def test_structure_listings_that_would_take_gigabytes_are_refused(tmp_path):
    # 20k zeros under 20 levels of 1000-byte keys: a 61 KB manifest whose leaves' key paths
    # (each leaf holds its own) would take 390 MB. Refused with a clear error; loading works.
    t = [0] * 20_000
    for i in range(20):
        t = {"k" * 1000 + str(i): t}
    p = str(tmp_path / "deep")
    treepack.save(t, p)
    with pytest.raises(treepack.FormatError, match="key paths would take more memory than the manifest allows") as e:
        treepack.load_structure(p)
    assert len(str(e.value)) < 1000  # the place is named, shortened
    back = treepack.load(p)
    for i in reversed(range(20)):
        back = back["k" * 1000 + str(i)]
    assert back == [0] * 20_000
    # A selection that must place every leaf (the tree holds an object that comes whole) is
    # bounded alike, and says so naming the file.
    treepack.save({"deep": t, "z": collections.Counter(a=1), "o": fractions.Fraction(1, 3)}, p, overwrite=True)
    with pytest.raises(treepack.FormatError, match=r"deep.*: invalid manifest.*key paths would take more memory"):
        treepack.load(p, select="o")


def test_partial_loads_build_objects_whole_or_not_at_all(tmp_path):
    pd = pytest.importorskip("pandas")
    torch = pytest.importorskip("torch")
    from PIL import Image

    img = Image.new("RGB", (4, 4), (1, 2, 3))
    sp = torch.eye(3).to_sparse()
    df = pd.DataFrame({"x": [1, 2]})
    sd = collections.OrderedDict(w=torch.ones(2), b=torch.zeros(2))
    p = str(tmp_path / "o")
    treepack.save({"img": img, "img2": img, "sp": sp, "sp2": sp, "df": df, "df2": df.copy(), "sd": sd, "n": 1}, p)
    # A ref selected loads its object whole (at its own place too); objects not selected are
    # None at every place (their refs too), whatever comes before them.
    back = treepack.load(p, select="sp2")
    assert back["sp2"] is back["sp"] and torch.equal(back["sp"].to_dense(), torch.eye(3))
    assert back["img"] is None and back["img2"] is None and back["df"] is None and back["n"] is None
    # Part of an object selected: the whole object (a DataFrame or a sparse tensor cannot be
    # built from part of it). df2 shares its column labels with df: df comes too.
    back = treepack.load(p, select=["df2/values/0/values", "sp/values"])
    pd.testing.assert_frame_equal(back["df2"], df)
    pd.testing.assert_frame_equal(back["df"], df)
    assert torch.equal(back["sp"].to_dense(), torch.eye(3)) and back["img"] is None
    # A state_dict (an OrderedDict) may come in part: one tensor selected, the others None.
    back = treepack.load(p, select="sd/w")
    assert list(back["sd"]) == ["w", "b"] and torch.equal(back["sd"]["w"], torch.ones(2)) and back["sd"]["b"] is None


def test_a_record_reached_only_through_a_selected_ref_is_audited(tmp_path):
    obj = Person("shared")
    p = str(tmp_path / "r")
    treepack.save({"a": obj, "b": obj, "n": 1}, p)
    with pytest.raises(treepack.UntrustedTypeError, match="Person"):
        treepack.load(p, select="b")
    # A record held at two places is audited at its place (it was skipped, and the load
    # failed late with a bare LookupError).
    with pytest.raises(treepack.UntrustedTypeError, match=r"test_refs:Person: at a\n"):
        treepack.load(p)
    assert treepack.untrusted_types(p) == {__name__ + ":Person": ["a"]}
    back = treepack.load(p, select="b", trust=TRUST)
    assert back["b"] is back["a"] and back["a"].name == "shared" and back["n"] is None
