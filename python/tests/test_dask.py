"""Dask (issue 30): Dask arrays saved block by block by the tasks that compute them, on the
threaded scheduler and on a real distributed cluster (LocalCluster with worker processes on
127.0.0.1, started and stopped here), and read back lazily as Dask arrays.

Runs against real dask and distributed (installed into .venv by scripts/python-env.sh); the
wheel test venvs do not install them, so there this module is skipped.
"""

import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import treepack

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")


def manifest(path):
    return json.load(open(os.path.join(path, "treepack.json")))


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes, one thread each, on 127.0.0.1."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40) as c:
        yield c


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks written as they are, however small (not merged into bigger ones first)."""
    from treepack.integrations import dask as tpdask

    monkeypatch.setattr(tpdask, "SMALL_BLOCK_BYTES", 0)


def test_threaded_save_writes_blocks_as_parts_and_loads_back(loc, small_blocks):
    x = da.random.default_rng(1).random((1000, 600), chunks=(250, 300)).astype(np.float32)
    y = da.arange(17, chunks=5)  # irregular last block
    z = da.ones((10, 10), chunks=((3, 3, 4), 10))  # irregular: rechunked to regular blocks
    tree = {"x": x, "nested": [y, {"z": z}], "meta": {"n": 3, "name": "run"}, "small": np.ones(3)}
    info = treepack.save(tree, loc, chunk_bytes=100_000)
    assert info.arrays == 4
    m = manifest(loc)
    xs = m["root"]["x"]
    assert xs["shape"] == [1000, 600] and all(b % c == 0 for b, c in zip((250, 300), xs["chunk_shape"]))
    assert "treepack.shards" not in json.dumps(m)
    # One pack per block (4 x 2 of x, 4 of y, 3 of z after the rechunk) and one for the client's
    # part; blocks of equal bytes (z's ones) make the same content-named pack, listed once.
    assert 8 + 4 <= len(m["packs"]) <= 8 + 4 + 3 + 1
    out = treepack.load(loc)
    assert np.array_equal(out["x"], x.compute()) and out["x"].dtype == np.float32
    assert np.array_equal(out["nested"][0], np.arange(17)) and np.array_equal(out["nested"][1]["z"], np.ones((10, 10)))
    assert out["meta"] == {"n": 3, "name": "run"} and np.array_equal(out["small"], np.ones(3))
    assert treepack.verify(loc).ok


def test_to_dask_reads_only_the_chunks_a_slice_needs(loc):
    x = np.arange(4096 * 64, dtype=np.float64).reshape(4096, 64)
    treepack.save({"x": da.from_array(x, chunks=(512, 64))}, loc, chunk_bytes=64 * 64 * 8)  # 64-row chunks
    lazy = treepack.open(loc)["x"].to_dask()
    assert lazy.chunks[0] == (64,) * 64 and lazy.dtype == np.float64
    assert len(pickle.dumps(lazy.__dask_graph__())) < 20_000  # where to read, no data
    from treepack.integrations import dask as tpdask

    got = lazy[::1000].sum().compute(scheduler="threads")
    assert got == x[::1000].sum()
    r = tpdask._reader(loc, None)
    before = r.io_stats()
    assert lazy[130:140].compute(scheduler="threads").tolist() == x[130:140].tolist()
    read_bytes, reads = r.io_stats()[0] - before[0], r.io_stats()[1] - before[1]
    assert read_bytes == 64 * 64 * 8 and reads == 1  # the one chunk holding rows 128..192
    again = treepack.open(loc)["x"].to_dask(chunks=(1024, 64))
    assert np.array_equal(again.compute(), x)
    # load(dask=True): chunked arrays lazy, the rest loaded.
    treepack.save({"x": x, "s": "hello", "small": np.ones(2)}, loc + "2", chunk_bytes=64 * 64 * 8)
    out = treepack.load(loc + "2", dask=True)
    assert isinstance(out["x"], da.Array) and out["s"] == "hello" and isinstance(out["small"], np.ndarray)
    assert np.array_equal(out["x"].compute(), x)


def test_the_write_graph_is_one_layer_whatever_the_block_count(tmp_path):
    # A million blocks: the graph that writes them is built without a task per block up front
    # (one Blockwise layer), so building it takes the same time as for ten.
    from treepack.integrations import dask as tpdask

    x = da.zeros((1_000_000,), chunks=1)
    found = tpdask.Found(None)
    tpdask.placeholder(x, "x", found)
    graphs = tpdask.graphs(found, str(tmp_path / "t"), {})
    layers = graphs[0].__dask_graph__().layers
    from dask.blockwise import Blockwise

    assert any(isinstance(layer, Blockwise) for layer in layers.values())


def test_a_failing_task_commits_nothing_and_gc_removes_its_leftovers(loc, small_blocks):
    def boom(b, block_info=None):
        if block_info[0]["chunk-location"] == (3,):
            raise RuntimeError("block 3 cannot be computed")
        return b

    x = da.ones((100,), chunks=10).map_blocks(boom, dtype=float) * np.arange(100)  # blocks of distinct bytes
    # One block at a time, so that nothing is still writing when save raises (with threads, tasks
    # already running when one fails go on writing after save has raised: gc removes theirs later).
    with dask.config.set(scheduler="synchronous"), pytest.raises(RuntimeError, match="block 3 cannot be computed"):
        treepack.save({"x": x}, loc)
    assert not os.path.exists(os.path.join(loc, "treepack.json"))
    left = os.listdir(os.path.join(loc, "packs"))
    assert 0 < len(left) < 10  # the blocks written before the failure
    removed = treepack.gc(loc, grace_secs=0)
    assert len([r for r in removed if r.endswith(".tpp")]) == len(left)
    assert not os.listdir(os.path.join(loc, "packs"))


def test_a_distributed_cluster_writes_its_blocks_and_reads_them_lazily(cluster, tmp_path):
    with distributed.Client(cluster) as client:
        x = da.random.default_rng(2).standard_normal((2048, 1024), chunks=(256, 1024)).astype(np.float32)
        loc = str(tmp_path / "t")
        info = treepack.save({"x": x, "step": 5}, loc)
        assert info.arrays == 1
        want = x.compute()
        lazy = treepack.load(loc, dask=True)
        assert lazy["step"] == 5
        # Computed on the workers: each task opens the location and reads its own chunks.
        assert float(lazy["x"].sum().compute()) == pytest.approx(float(want.sum()), rel=1e-5)
        assert np.array_equal(lazy["x"][100:300].compute(), want[100:300])
        # The workers wrote the blocks: both took part.
        who = client.run(lambda: __import__("os").getpid())
        assert len(who) == 2


def test_a_cluster_saves_to_an_object_store(cluster, s3):
    with distributed.Client(cluster):
        x = da.arange(100_000, chunks=10_000).astype(np.int32)
        treepack.save({"x": x}, "s3://bucket/dask/t", storage_options=s3)
        out = treepack.load("s3://bucket/dask/t", storage_options=s3)
        assert np.array_equal(out["x"], np.arange(100_000, dtype=np.int32))
        lazy = treepack.open("s3://bucket/dask/t", storage_options=s3)["x"].to_dask()
        assert int(lazy[::7].sum().compute()) == int(np.arange(100_000)[::7].sum())
        # 256 MiB of random values in 32 MiB blocks (a 32 MiB pack per block),
        # compared block by block by hash on the workers.
        big = da.random.default_rng(6).random((8192, 4096), chunks=(1024, 4096))
        treepack.save({"big": big}, "s3://bucket/dask/big", storage_options=s3)
        back = treepack.open("s3://bucket/dask/big", storage_options=s3)["big"].to_dask(chunks=big.chunks)

        def digest(b):
            import hashlib

            return np.frombuffer(hashlib.blake2b(b.tobytes(), digest_size=8).digest(), np.int64).reshape(1, 1)

        kw = dict(dtype=np.int64, chunks=tuple((1,) * len(c) for c in big.chunks))
        assert bool((back.map_blocks(digest, **kw) == big.map_blocks(digest, **kw)).all().compute())


def test_a_larger_than_client_array_never_lands_on_the_client(tmp_path):
    # 512 MiB through 2 worker processes; the client process's peak RSS stays well under it (the
    # array landing there would take it past the bound). Run in a fresh interpreter so that its
    # peak is its own (this test process holds torch and more).
    loc = str(tmp_path / "big")
    code = textwrap.dedent(f"""
        import numpy as np, dask.array as da, distributed, treepack

        def hwm():
            # VmHWM, reset below: ru_maxrss would start at the forking parent's size.
            return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))

        if __name__ == "__main__":
            with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                          dashboard_address=None, silence_logs=40) as c, distributed.Client(c):
                open("/proc/self/clear_refs", "w").write("5")
                before = hwm()
                x = da.random.default_rng(3).random((8192, 8192), chunks=(1024, 8192), dtype=np.float64)  # 512 MiB
                treepack.save({{"x": x}}, {loc!r}, durable=False)
                peak = hwm()
                # Compared block by block, by hash, on the workers: nothing large moves.
                def digest(b):
                    import hashlib
                    return np.frombuffer(hashlib.blake2b(b.tobytes(), digest_size=8).digest(), np.int64).reshape(1, 1)

                lazy = treepack.open({loc!r})["x"].to_dask(chunks=x.chunks)
                kw = dict(dtype=np.int64, chunks=tuple((1,) * len(c) for c in x.chunks))
                ok = bool((lazy.map_blocks(digest, **kw) == x.map_blocks(digest, **kw)).all().compute())
                print("PEAK", before, peak, ok)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    _, before, peak, ok = next(ln for ln in r.stdout.splitlines() if ln.startswith("PEAK")).split()
    assert ok == "True"
    assert int(peak) < 400 << 20, f"client peak RSS {int(peak) >> 20} MiB"
    assert next(iter(manifest(loc)["root"].values()))["shape"] == [8192, 8192]


def test_xarray_datasets_round_trip_with_lazy_variables(loc):
    xr = pytest.importorskip("xarray")
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(4)
    ds = xr.Dataset(
        {
            "temp": (("time", "x"), rng.random((400, 300)).astype(np.float32), {"units": "K", "scale": np.float64(0.5)}),
            "mask": (("x",), rng.random(300) > 0.5),
            "big": (("time", "x"), da.random.default_rng(5).random((400, 300), chunks=(100, 300))),
        },
        coords={"time": pd.date_range("2026-01-01", periods=400, freq="h"), "x": [f"s{i}" for i in range(300)],
                "lat": ("x", np.linspace(-90, 90, 300))},
        attrs={"title": "a run", "version": np.int64(3), "tags": ["a", "b"]},
    )
    treepack.save({"ds": ds, "temp": ds["temp"]}, loc)
    out = treepack.load(loc)
    xr.testing.assert_identical(out["ds"], ds.compute())
    xr.testing.assert_identical(out["temp"], ds["temp"])
    # Key paths reach every variable.
    assert treepack.open(loc)["ds"]["data_vars"]["temp"]["data"][0:2].shape == (2, 300)
    lazy = treepack.load(loc, dask=True)
    assert isinstance(lazy["ds"]["temp"].data, da.Array) and isinstance(lazy["ds"]["big"].data, da.Array)
    assert lazy["ds"].attrs["title"] == "a run" and lazy["ds"]["temp"].attrs["units"] == "K"
    xr.testing.assert_identical(lazy["ds"].compute(), ds.compute())
    # Refused with the reason: names that are not strings.
    with pytest.raises(TypeError, match=r"cannot save `<root>`: the data variable name 1 is a int"):
        treepack.save(xr.Dataset({1: ("x", [1, 2])}), loc + "-bad")


def test_a_dask_save_uses_the_compression_policy(loc):
    x = da.zeros((2048, 256), chunks=(512, 256), dtype=np.float32)
    treepack.save({"x": x}, loc, compression="zstd")
    m = manifest(loc)
    chunks = m["root"]["x"]["chunks"]
    assert {c["codec"] for c in chunks} == {"zstd"} and sum(c["length"] for c in chunks) < 2048 * 256 * 4 // 50
    assert np.array_equal(treepack.load(loc)["x"], np.zeros((2048, 256), np.float32))


def test_small_blocks_are_merged_into_a_few_packs(loc):
    # 4000 blocks of 800 bytes: written as one merged block, one pack (not 4000 objects).
    x = da.arange(400_000, chunks=100).astype(np.float64).reshape(4000, 100)
    assert x.npartitions == 4000
    treepack.save({"x": x}, loc)
    m = manifest(loc)
    assert len(m["packs"]) <= 2  # the merged block's pack (+ the client's, when it writes any)
    assert np.array_equal(treepack.load(loc)["x"], np.arange(400_000, dtype=np.float64).reshape(4000, 100))


def test_a_dask_save_with_a_plain_dict_at_two_places(loc):
    # The plain dict is written as text the first time and met again: the save walks the tree a
    # second time as nodes, and the Dask arrays the first walk counted are forgotten.
    meta = {"n": 3, "tags": ["a", "b"]}
    x = da.arange(40, chunks=10)
    tree = {"meta": meta, "x": x, "again": meta, "y": da.ones(7, chunks=3)}
    treepack.save(tree, loc)
    out = treepack.load(loc)
    assert out["meta"] is out["again"] and out["meta"] == meta
    assert np.array_equal(out["x"], np.arange(40)) and np.array_equal(out["y"], np.ones(7))
    assert "treepack.shards" not in json.dumps(manifest(loc))
