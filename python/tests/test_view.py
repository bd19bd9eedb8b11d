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
