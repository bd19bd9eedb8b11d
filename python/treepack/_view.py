"""``treepack.view``: the viewer's page (the server `treepack view` runs, compiled into the
extension) for a tree, the diff of two trees or a repository's history, from Python."""

from __future__ import annotations

import html
from typing import Any, Optional

from . import _core
from ._api import PathLike, StorageOptions, _opts, _path


class ViewServer:
    """A running viewer: ``url`` (with its token), ``close()``; a context manager. It stops when
    closed or when the object is garbage-collected."""

    def __init__(self, server: Any) -> None:
        self._server = server

    @property
    def url(self) -> str:
        """The page's address; its token is what opens it: share it only with whom may read the tree."""
        return self._server.url

    @property
    def running(self) -> bool:
        return self._server.running

    def open_browser(self) -> None:
        """Open the page in the browser (again)."""
        self._server.open_browser()

    def close(self) -> None:
        """Stop serving (harmless when already stopped)."""
        self._server.close()

    def __enter__(self) -> "ViewServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _repr_html_(self) -> str:
        url = html.escape(self.url, quote=True)
        state = "" if self.running else " (closed)"
        return f'<a href="{url}" target="_blank" rel="noopener noreferrer">treepack view</a>{state}'

    def __repr__(self) -> str:
        return f"ViewServer({self.url!r}{'' if self.running else ', closed'})"


def view(
    path: PathLike,
    other: Optional[PathLike] = None,
    *,
    open_browser: bool = True,
    port: int = 0,
    storage_options: StorageOptions = None,
) -> ViewServer:
    """Show the tree at ``path`` in the browser (``treepack view`` from Python; docs/view.md).

    ``path`` is anything ``treepack.open`` opens, or a repository (its trees and history);
    ``other`` a second tree to compare with. The page is served on 127.0.0.1 on a random port
    (``port`` to choose), with a random token in its URL, by threads of the extension: the
    returned ``ViewServer`` stops it with ``close()``. A location that cannot be opened raises
    the error ``treepack.open`` would.
    """
    server = ViewServer(_core.ViewServer(_path(path), None if other is None else _path(other), port, _opts(storage_options)))
    if open_browser:
        try:
            server.open_browser()
        except OSError as e:
            print(f"treepack.view: could not open a browser ({e}); open {server.url}")
    return server
