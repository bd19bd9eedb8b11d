"""``python -m treepack inspect | ls | cat`` of the files only the Python package reads (issue 54:
the command line accepts every foreign input), and the Rust ``treepack`` command running it for
them (design decision 98). Files are written with the real libraries; output lines are checked
whole; a damaged chunk proves that a listing reads no array data and a slice reads only what it
names."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def py(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "treepack", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def rust_binary():
    """The Rust command as `cargo test` (which CI runs before this suite) or a release build left it."""
    for p in (ROOT / "target" / "debug" / "treepack", ROOT / "target" / "release" / "treepack"):
        if p.is_file():
            return p
    if os.environ.get("CI"):
        raise AssertionError("the treepack binary is not built: run `cargo build -p treepack-cli` first")
    pytest.skip("the Rust treepack command is not built here (cargo build -p treepack-cli)")


@pytest.fixture
def h5(tmp_path):
    h5py = pytest.importorskip("h5py")
    p = tmp_path / "d.h5"
    with h5py.File(p, "w") as f:
        g = f.create_group("layer")
        g.create_dataset("w", data=np.arange(20.0).reshape(4, 5), chunks=(2, 5))
        f["n"] = np.int64(3)
        f.attrs["note"] = "hi"
    return p


def test_inspect_ls_and_cat_of_an_hdf5_file(h5):
    out = py("inspect", h5)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{h5}  (hdf5 file, read as a tree by the Python package, no array data read)",
        "<root>: dict[3]",
        "├── layer: dict[1]",
        "│   └── w: float64[4, 5]  160 B",
        "├── n: int64[]  8 B",
        "└── note: str 'hi'",
        "totals: 3 leaves, 2 arrays, 168 B of array data",
    ]
    assert py("inspect", h5, "--depth", "1").stdout.splitlines()[2] == "├── layer: dict[1]"
    assert "│   └── w" not in py("inspect", h5, "--depth", "1").stdout
    assert py("inspect", h5, "--key", "layer").stdout.splitlines()[1:3] == ["layer: dict[1]", "└── w: float64[4, 5]  160 B"]
    js = __import__("json").loads(py("inspect", h5, "--json").stdout)
    assert js["totals"] == {"leaves": 3, "arrays": 2, "array_bytes": 168}
    assert js["leaves"][0] == {"path": "layer/w", "kind": "array", "nbytes": 160, "dtype": "float64", "shape": [4, 5]}
    assert py("ls", h5).stdout.splitlines() == ["layer/w\tfloat64[4, 5]  160 B", "n\tint64[]  8 B", "note\tstr 'hi'"]
    assert py("ls", h5, "layer/**").stdout.splitlines() == ["layer/w\tfloat64[4, 5]  160 B"]
    out = py("cat", h5, "layer/w[1:3, ::2]")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["float64[2, 3] =", "[[ 5.  7.  9.]", " [10. 12. 14.]]"]
    assert py("cat", h5, "layer/w[-1, 4]").stdout.splitlines() == ["float64[] =", "19."]
    assert py("cat", h5, "note").stdout.strip() == "'hi'"


def test_errors_say_what_and_where(h5, tmp_path):
    out = py("cat", h5, "layer/x")
    assert out.returncode == 2
    assert "key path `layer/x` not found: `layer` (dict) has no child `x`; it has: w" in out.stderr
    out = py("cat", h5, "layer/w[0:a]")
    assert out.returncode == 2 and "`0:a` in `[0:a]` is not an index" in out.stderr
    out = py("cat", h5, "note[0]")
    assert out.returncode == 2 and "`note` is not an array" in out.stderr
    out = py("ls", h5, "nothing/**")
    assert out.returncode == 2 and "nothing/**" in out.stderr and "matches nothing" in out.stderr
    out = py("inspect", tmp_path / "missing.h5")
    assert out.returncode == 2 and "missing.h5" in out.stderr
    import treepack

    treepack.save({"a": np.ones(2)}, tmp_path / "t.tpk")
    out = py("inspect", tmp_path / "t.tpk")
    assert out.returncode == 2 and "the Rust `treepack` command reads itself" in out.stderr


def test_npy_npz_and_zarr_listed_without_their_data(tmp_path):
    zarr = pytest.importorskip("zarr")
    np.save(tmp_path / "a.npy", np.arange(6, dtype=np.int16).reshape(2, 3))
    assert py("ls", tmp_path / "a.npy").stdout.splitlines() == ["<root>\tint16[2, 3]  12 B"]
    assert py("cat", tmp_path / "a.npy", "[1, :]").stdout.splitlines() == ["int16[3] =", "[3 4 5]"]
    np.savez_compressed(tmp_path / "c.npz", w=np.arange(4.0), z=np.zeros((2, 2), np.float32))
    assert py("ls", tmp_path / "c.npz").stdout.splitlines() == ["w\tfloat64[4]  32 B", "z\tfloat32[2, 2]  16 B"]
    g = zarr.open_group(tmp_path / "s.zarr", mode="w")
    g.create_array("a", data=np.arange(100.0).reshape(10, 10), chunks=(5, 10))
    chunk = next(p for p in (tmp_path / "s.zarr" / "a").rglob("*") if p.is_file() and p.parts[-2:] == ("1", "0"))
    chunk.write_bytes(b"garbage, not a zstd frame")
    # A damaged chunk: listing, inspecting and a slice of the other chunk work; its own slice fails.
    assert py("ls", tmp_path / "s.zarr").stdout.splitlines() == ["a\tfloat64[10, 10]  800 B"]
    assert py("inspect", tmp_path / "s.zarr").returncode == 0
    assert py("cat", tmp_path / "s.zarr", "a[4, 0:3]").stdout.splitlines() == ["float64[3] =", "[40. 41. 42.]"]
    out = py("cat", tmp_path / "s.zarr", "a[5, 0:3]")
    assert out.returncode == 2 and "s.zarr" in out.stderr


def test_the_rust_command_runs_the_python_one_for_these_files(h5, tmp_path):
    tp = rust_binary()
    env = dict(os.environ, TREEPACK_PYTHON=sys.executable)
    run = lambda *a: subprocess.run([str(tp), *map(str, a)], capture_output=True, text=True, env=env, timeout=120)
    assert run("ls", h5).stdout == py("ls", h5).stdout
    assert run("inspect", h5, "--key", "layer").stdout == py("inspect", h5, "--key", "layer").stdout
    out = run("cat", h5, "layer/w[0, 0:2]")
    assert (out.returncode, out.stdout) == (0, "float64[2] =\n[0. 1.]\n")
    out = run("cat", h5, "layer/x")
    assert out.returncode == 2 and "has no child `x`" in out.stderr
    # convert both ways through the Rust command: HDF5 -> .tpk -> npz.
    out = run("convert", h5, tmp_path / "d.tpk", "-q")
    assert out.returncode == 0, out.stderr
    out = run("convert", tmp_path / "d.tpk", tmp_path / "d.npz", "--select", "layer/**", "--separator", "/", "-q")
    assert out.returncode == 0, out.stderr
    with np.load(tmp_path / "d.npz") as z:
        assert list(z) == ["layer/w"] and np.array_equal(z["layer/w"], np.arange(20.0).reshape(4, 5))


def test_a_treepack_module_in_the_working_folder_is_never_imported(h5, tmp_path):
    """`python -m` would put the working folder first on the module path: a dataset folder
    holding a `treepack/` package (or `treepack.py`) would run when browsed. The Rust command
    runs the installed package only."""
    tp = rust_binary()
    work = tmp_path / "downloaded"
    (work / "treepack").mkdir(parents=True)
    marker = tmp_path / "ran"
    for f in (work / "treepack" / "__init__.py", work / "treepack.py"):
        f.write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(7)\n")
    (work / "treepack" / "__main__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = dict(os.environ, TREEPACK_PYTHON=sys.executable)
    out = subprocess.run([str(tp), "ls", str(h5)], capture_output=True, text=True, env=env, cwd=work, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "layer/w\tfloat64[4, 5]  160 B"
    assert not marker.exists()


def _limited(*args):
    """The Python command in a child with 2 GiB of address space and a minute of CPU (set by
    the shell that starts it: no preexec_fn in a threaded test process)."""
    return subprocess.run(["bash", "-c", 'ulimit -v 2097152 -t 60; exec "$@"', "limited", sys.executable, "-m",
                           "treepack", *map(str, args)], capture_output=True, text=True, timeout=120)


def test_hostile_files_are_refused_by_the_command_with_nothing_outside_read(tmp_path):
    zarr = pytest.importorskip("zarr")
    # An .npy whose header declares 10^12 elements over a few bytes: listed from its header,
    # a slice of it refused as past the file's end; nothing allocated for the declared size.
    big = tmp_path / "big.npy"
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }"
    header += b" " * (118 - len(header)) + b"\n"
    big.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 64)
    out = _limited("ls", big)
    assert out.returncode == 2 and "big.npy" in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = _limited("cat", big, "[0:2]")
    assert out.returncode == 2 and "big.npy" in out.stderr and "Traceback" not in out.stderr, out.stderr
    # A Zarr chunk that is a link to a file outside the store: refused, naming the link; the
    # outside file's bytes never printed, nothing outside changed.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET")
    g = zarr.open_group(tmp_path / "s.zarr", mode="w")
    g.create_array("a", data=np.arange(20.0), chunks=(10,))
    chunk = next(p for p in (tmp_path / "s.zarr" / "a").rglob("*") if p.is_file() and p.name == "1")
    chunk.unlink()
    chunk.symlink_to(outside / "secret.txt")
    # (the store's entries are checked when it is opened: the link is refused, naming it, before
    # any slice is read)
    for args in (("ls", tmp_path / "s.zarr"), ("cat", tmp_path / "s.zarr", "a[10:20]")):
        out = _limited(*args)
        assert out.returncode == 2 and "a/c/1" in out.stderr and "cp -L" in out.stderr, out.stderr
        assert "SECRET" not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert (outside / "secret.txt").read_text() == "SECRET" and sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
