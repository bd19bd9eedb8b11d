"""Issue 50, finding 2: a location is the only place treepack reads, writes or deletes.

Links planted inside a location (its ``packs/`` folder, a repository's ``packs/``, ``index/`` or
``refs/``, the manifest, a staging name) are refused with an error naming the link by
``treepack.gc``, ``treepack.save(..., overwrite=True)`` and ``Repository.gc``; each case runs in
a child process (``attack``, hostile_harness.py), which checks that nothing outside the location
changed. The links' target files are aged two days, so that a gc following a link would find
them old enough to delete even with the default grace.
"""

import os
import shutil
import sys
import time

import numpy as np
import pytest

import treepack

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="symbolic links")


def _tree(v=1):
    return {"a": np.full(5000, v, np.uint8), "b": np.arange(3000, dtype=np.int32) + v}


def _age(attack):
    old = time.time() - 48 * 3600
    for p in (attack.outside / "target").iterdir():
        os.utime(p, (old, old))


def _link_folder(attack, where, folder):
    p = where / folder
    shutil.rmtree(p)
    p.symlink_to(attack.outside / "target", target_is_directory=True)
    return p


def _refused(attack, code, link):
    r = attack.error(code, "FormatError", match=f"{link}: is a symbolic link")
    assert "TreepackError" in r["bases"], r
    assert "replace it with" in r["message"], r["message"]
    return r


@pytest.mark.parametrize("grace", ["", ", grace_secs=0"])
def test_gc_refuses_a_linked_packs_folder(attack, grace):
    treepack.save(_tree(), attack.loc)
    link = _link_folder(attack, attack.loc, "packs")
    _age(attack)
    _refused(attack, f"import treepack\ntreepack.gc(LOC{grace})\n", link)


def test_gc_refuses_a_staging_name_that_is_a_link(attack):
    treepack.save(_tree(), attack.loc)
    link = attack.loc / "packs" / "x.tpp#1-1"
    link.symlink_to(attack.outside / "target" / "x.tpp#1-1")
    _age(attack)
    _refused(attack, "import treepack\ntreepack.gc(LOC, grace_secs=0)\n", link)
    assert link.is_symlink()


def test_overwrite_refuses_a_linked_packs_folder(attack):
    treepack.save(_tree(), attack.loc)
    link = _link_folder(attack, attack.loc, "packs")
    code = "import numpy as np, treepack\ntreepack.save({'a': np.full(5000, 7, np.uint8)}, LOC, overwrite=True)\n"
    _refused(attack, code, link)


def test_save_refuses_a_linked_manifest(attack):
    attack.loc.mkdir()
    link = attack.loc / "treepack.json"
    link.symlink_to(attack.outside / "target" / "config.json")
    code = "import numpy as np, treepack\ntreepack.save({'a': np.full(5000, 7, np.uint8)}, LOC, overwrite=True)\n"
    _refused(attack, code, link)
    assert link.is_symlink()


def test_single_file_gc_refuses_a_staging_link(attack):
    attack.loc.mkdir()
    tpk = attack.loc / "t.tpk"
    treepack.save(_tree(), tpk)
    link = attack.loc / "t.tpk#1-1"
    link.symlink_to(attack.outside / "target" / "x.tpp#1-1")
    _age(attack)
    _refused(attack, "import os, treepack\ntreepack.gc(os.path.join(LOC, 't.tpk'), grace_secs=0)\n", link)


@pytest.mark.parametrize("folder", ["packs", "index", "refs"])
def test_repository_gc_refuses_a_linked_folder(attack, folder):
    repo = treepack.Repository(attack.loc, create=True)
    repo.save(_tree(1), "a")
    repo.save(_tree(2), "b")
    repo.delete("a")
    link = _link_folder(attack, attack.loc, folder)
    _age(attack)
    _refused(attack, "import treepack\ntreepack.Repository(LOC).gc(grace_secs=0)\n", link)
