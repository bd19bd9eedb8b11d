"""Session 45's attacker pass: what it found, as regression tests."""

import os
import textwrap

import numpy as np
import pytest

import treepack


@pytest.mark.parametrize("blocking", [True, False])
def test_a_save_whose_folder_is_replaced_midway_fails_and_leaves_both_trees_whole(tmp_path, blocking):
    # The root folder was opened by its path at each step: replaced while a save ran (here from
    # its progress callback, as another process would), the save put its packs in the first
    # folder and its manifest in the second, returned success, and neither loaded right.
    loc = str(tmp_path / "loc")
    treepack.save({"w": np.zeros(1000), "tag": "old"}, loc)
    swapped = []

    def progress(done, total):
        if done >= total and not swapped:
            swapped.append(1)
            os.rename(loc, loc + ".moved")
            treepack.save({"w": np.ones(1000), "tag": "other"}, loc)

    big = np.random.default_rng(0).random(4 << 20)
    with pytest.raises(OSError, match="replaced while treepack used it"):
        h = treepack.save({"w": big, "tag": "new"}, loc, overwrite=True, blocking=blocking, progress=progress)
        if not blocking:
            h.result()
    assert swapped
    assert treepack.load(loc)["tag"] == "other" and treepack.load(loc + ".moved")["tag"] == "old"


def test_a_folder_swapped_for_a_link_midway_gets_nothing_written_through_it(attack):
    # The same swap to a link to a folder of other files: the manifest went there.
    mine = attack.outside / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    from hostile_harness import _snapshot

    attack.before = _snapshot(attack.outside)
    code = textwrap.dedent("""
        import os, numpy as np, treepack
        target = os.path.join(OUTSIDE, "mine")
        treepack.save({"tag": "old", "w": np.zeros(1000)}, LOC)
        swapped = []
        def progress(done, total):
            if done >= total and not swapped:
                swapped.append(1)
                os.rename(LOC, LOC + ".moved")
                os.symlink(target, LOC)
        treepack.save({"w": np.random.default_rng(0).random(4 << 20)}, LOC, overwrite=True, progress=progress)
        """)
    r = attack.error(code, "OSError", timeout=60, mem_bytes=4 << 30)
    assert "replaced while treepack used it" in r["message"], r["message"]
    assert sorted(os.listdir(mine)) == ["notes.txt"]
