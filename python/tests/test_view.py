"""``treepack.view`` and the notebooks' HTML (issue 56), without a browser: the server's handle,
errors as ``treepack.open`` raises them, ``_repr_html_`` of views and structures, names from the
file escaped. The page itself: test_view_browser.py."""

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

import treepack


def test_view_serves_until_closed_and_needs_its_token(tmp_path):
    treepack.save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, tmp_path / "t")
    with treepack.view(tmp_path / "t", open_browser=False) as server:
        assert server.url.startswith("http://127.0.0.1:") and "?token=" in server.url
        base, token = server.url.split("/?token=")
        got = json.loads(urllib.request.urlopen(f"{base}/api/slice?token={token}&path=w&slice=1,:").read())
        assert got["y"] == [3.0, 4.0, 5.0]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/api/slice?path=w&slice=1,:")
        assert e.value.code == 403
        assert "treepack view" in server._repr_html_()
    assert not server.running
    server.close()  # twice is harmless
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{base}/?token={token}", timeout=5)


def test_view_raises_what_open_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no treepack tree found"):
        treepack.view(tmp_path / "missing", open_browser=False)
    treepack.save({"a": 1}, tmp_path / "t")
    with pytest.raises(FileNotFoundError):
        treepack.view(tmp_path / "t", tmp_path / "missing", open_browser=False)


def test_notebooks_draw_views_and_structures_as_html(tmp_path):
    tree = {"params": {"w": np.zeros((4, 8), np.float32), "<script>alert(1)</script>": "x"}, "step": 3}
    treepack.save(tree, tmp_path / "t")
    view = treepack.open(tmp_path / "t")
    html = view._repr_html_()
    assert "float32</b>[4, 8]" in html and "128 B" in html and "3 leaves" in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<details" in view["params"]._repr_html_()
    s = treepack.load_structure(tmp_path / "t")
    html = treepack.html_tree(s)._repr_html_()
    assert "float32</b>[4, 8]" in html and "&lt;script&gt;" in html and "<script>" not in html
    # A chunked array shows the manifest's preview: min, max and its first values.
    treepack.save({"ramp": np.arange(1000, dtype=np.float64) - 5}, tmp_path / "r")
    html = treepack.open(tmp_path / "r")._repr_html_()
    assert "min -5.0 max 994.0  [-5.0, -4.0, -3.0, -2.0, -1.0, 0.0, …]" in html, html


def test_struct_nodes_draw_themselves(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class Cfg:
        lr: float
        w: np.ndarray

    treepack.save({"cfg": Cfg(0.1, np.ones(3))}, tmp_path / "t")
    node = treepack.load_structure(tmp_path / "t")["cfg"]
    assert isinstance(node, treepack.StructNode)
    html = node._repr_html_()
    assert "record" in html and "float64</b>[3]" in html


def _api(server, endpoint, **params):
    import urllib.parse

    base, token = server.url.split("/?token=")
    q = urllib.parse.urlencode({"token": token, **params})
    return json.loads(urllib.request.urlopen(f"{base}/api/{endpoint}?{q}").read())


def test_view_of_a_tree_in_an_object_store(tmp_path):
    # memory:// is an object store (the client S3, GCS and Azure share) held by this process,
    # which the extension's server shares: the viewer reads it as it reads s3://….
    loc = f"memory://view-test/{tmp_path.name}"
    treepack.save({"w": np.arange(12, dtype=np.float32).reshape(3, 4), "step": 7}, loc)
    with treepack.view(loc, open_browser=False) as server:
        info = _api(server, "info")
        assert info["tree"] and info["location"] == loc and info["totals"]["leaves"] == 2
        assert _api(server, "slice", path="w", slice="2, 1:3")["y"] == [9.0, 10.0]
        assert _api(server, "io")["bytes_read"] > 0


def test_the_leaf_panel_shows_jax_shardings(tmp_path):
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    x = jax.device_put(np.arange(16, dtype=np.float32).reshape(4, 4), NamedSharding(mesh, PartitionSpec("data", None)))
    treepack.save({"x": x}, tmp_path / "t")
    with treepack.view(tmp_path / "t", open_browser=False) as server:
        node = _api(server, "node", path="x")
    ann = node["annotation"]
    assert ann["type"] == "jax.Array" and "sharding" in ann, ann
    assert "data" in json.dumps(ann["sharding"]), ann
