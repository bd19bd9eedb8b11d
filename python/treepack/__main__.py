"""``python -m treepack convert SRC DST``: the conversions that go through Python libraries
(npz, npy, Zarr, HDF5; safetensors too), with a progress bar; ``inspect``, ``ls`` and ``cat`` of
the files only the Python package reads (npy, npz, Zarr, HDF5, Orbax, JAX). The Rust
``treepack`` command runs these for those formats (docs/convert.md)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import convert
from ._core import TreepackError


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m treepack", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="convert between treepack, safetensors, npz, npy, Zarr and HDF5 "
                                       "(formats by extension: .safetensors .npz .npy .zarr .h5 .hdf5; else treepack)")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--from", dest="from_format", help="the source's format, when its extension does not say")
    c.add_argument("--to", dest="to_format", help="the destination's format, when its extension does not say")
    c.add_argument("--separator", default="", help='splits a flat file\'s names into nested keys when read, joins nested keys when written ("." where none is given); by default names are read as stored')
    c.add_argument("--select", action="append", metavar="GLOB", help="convert only what this key-path glob selects "
                   "(repeatable; as load(select=): a leading ? marks a pattern that may match nothing)")
    c.add_argument("--overwrite", action="store_true", help="replace what is at DST")
    c.add_argument("--compression", default=None, help="compression policy of a treepack destination (none, auto, zstd, lz4, ...)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    i = sub.add_parser("inspect", help="show the tree of a npy, npz, Zarr, HDF5, Orbax or JAX checkpoint: types, "
                                        "dtypes, shapes, sizes and totals (no array data read)")
    i.add_argument("path")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--key", help="show the subtree at this key path only")
    i.add_argument("--depth", type=int, help="show this many levels below the root shown (0: the root line only)")
    i.add_argument("--max-lines", type=int, default=200, help="print at most this many lines of the tree (0: all)")
    i.add_argument("--width", type=int, default=120, help="cut values and metadata to this many characters (0: whole)")
    ls = sub.add_parser("ls", help="list the leaves of such a file, one per line; optional key-path globs filter")
    ls.add_argument("path")
    ls.add_argument("patterns", nargs="*", help="key-path globs (`params/**`, `layers/*/w`)")
    cat = sub.add_parser("cat", help="print a value: `cat data.h5 'group/w[0:2, :]'` (numpy-style slice: only "
                                     "what it covers is read)")
    cat.add_argument("path")
    cat.add_argument("key")
    a = p.parse_args(argv)
    if a.command != "convert":
        import signal

        from . import _cli

        # `python -m treepack ls big.h5 | head` ends quietly when `head` stops reading.
        if hasattr(signal, "SIGPIPE"):
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)

        return _cli.main(a.command, a)
    kwargs = {}
    if a.compression is not None:
        kwargs["compression"] = a.compression
    try:
        info = convert(a.src, a.dst, from_format=a.from_format, to_format=a.to_format,
                       separator=a.separator or None, overwrite=a.overwrite, select=a.select,
                       progress=None if a.quiet else _bar(), **kwargs)
    except (ValueError, TypeError, OSError, ImportError, KeyError, TreepackError) as e:
        print(f"treepack: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2
    print(f"converted {info['tensors']} arrays ({info['bytes']} bytes) from {a.src} to {a.dst}")
    return 0


def _bar() -> object:
    """tqdm's bar on a terminal if tqdm is installed, else none."""
    if not sys.stderr.isatty():
        return None
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return None
    return True


if __name__ == "__main__":
    sys.exit(main())
