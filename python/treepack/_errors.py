"""The error of files in other formats (docs/convert.md, "What a converter refuses").

Kept apart from ``_api`` so that the converters and the integrations that decode foreign bytes
inside a tree (``integrations/pillow.py``, ``integrations/audio.py``) can raise it without
importing the API module."""

from __future__ import annotations

from ._core import FormatError, TreepackError


class ForeignFileError(FormatError, ValueError):
    """A file of another format (HDF5, Zarr, ``.npy``/``.npz``, or an image or WAV file stored
    in a tree) is damaged, hostile, or uses a feature treepack refuses to follow (external
    storage, external links, links out of a store, pickled objects, sizes it does not hold).
    The message names the file, the place inside it and what to do. Also a ``ValueError``, the
    error such files raised before."""


class UnsupportedObjectError(TreepackError, TypeError):
    """Objects a save cannot keep: of a class that is neither registered, nor a record treepack
    rebuilds, nor a framework value an integration saves, with ``allow_pickle`` off. A save looks
    on through the whole tree and raises one error for all of them (at most ``LIMIT``): ``objects``
    lists ``(key path, type name, what to do)`` for each, and the message groups them by type.
    Also a ``TypeError``, the error such saves raised before."""

    #: The save stops looking after this many objects (a tree of a million of them would
    #: otherwise build a million errors).
    LIMIT = 100

    def __init__(self, where: str, type_name: str, reason: str) -> None:
        super().__init__(f"cannot save `{where}`: {reason}")
        self.objects = [(where, type_name, reason)]
        #: More objects were left unexamined (``LIMIT`` reached).
        self.stopped = False

    @classmethod
    def combine(cls, errors: "list[UnsupportedObjectError]", stopped: bool,
                ids: "list[int] | None" = None) -> "UnsupportedObjectError":
        """One error for everything a save met (called by the save's walker, in tree order;
        ``ids`` tells the objects apart: one met at two places is one object)."""
        objects = [o for e in errors for o in e.objects]
        count = len(set(ids)) if ids is not None and len(ids) == len(errors) else len(objects)
        if len(objects) == 1 and not stopped:
            return errors[0]
        groups: dict = {}
        for where, type_name, reason in objects:
            groups.setdefault((type_name, reason), []).append(where)
        lines = []
        for (_, reason), places in groups.items():
            shown = ", ".join(f"`{p}`" for p in places[:5])
            more = f" and {len(places) - 5} more places" if len(places) > 5 else ""
            lines.append(f"  - {shown}{more}: {reason}")
        many = f"at least {count} objects" if stopped else ("1 object" if count == 1 else f"{count} objects")
        kinds = f"{len(groups)} kinds" if len(groups) > 1 else "one kind"
        at = f"{len(objects)} places, the first" if count < len(objects) else "the first"
        e = cls(objects[0][0], objects[0][1], objects[0][2])
        e.objects = objects
        e.stopped = stopped
        e.args = (f"cannot save {many} ({kinds}; {at} at `{objects[0][0]}`):\n" + "\n".join(lines)
                  + ("\n  (the save stopped looking there)" if stopped else ""),)
        return e
