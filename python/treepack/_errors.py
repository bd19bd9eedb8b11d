"""The error of files in other formats (docs/convert.md, "What a converter refuses").

Kept apart from ``_api`` so that the converters and the integrations that decode foreign bytes
inside a tree (``integrations/pillow.py``, ``integrations/audio.py``) can raise it without
importing the API module."""

from __future__ import annotations

from ._core import FormatError


class ForeignFileError(FormatError, ValueError):
    """A file of another format (HDF5, Zarr, ``.npy``/``.npz``, or an image or WAV file stored
    in a tree) is damaged, hostile, or uses a feature treepack refuses to follow (external
    storage, external links, links out of a store, pickled objects, sizes it does not hold).
    The message names the file, the place inside it and what to do. Also a ``ValueError``, the
    error such files raised before."""
