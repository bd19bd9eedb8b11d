"""Framework integrations, each in its own module and imported only when its framework already is
(``import treepack`` never imports JAX, PyTorch or Dask)."""

from __future__ import annotations

import sys


def register_loaded() -> None:
    """Register treepack's types with the frameworks this process has imported so far."""
    if "jax" in sys.modules:
        from . import jax as _jax

        _jax.register()
