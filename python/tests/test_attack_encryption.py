"""Attack pass on encrypted trees (issue 55, docs/encryption.md).

Hostile files are opened in a child process (`hostile_harness`, through the `attack` fixture).
Regression tests of what this pass found: an encrypted file cut short or extended by a byte was
reported as a *plain* tree put in its place (`NotEncryptedError`) instead of a damaged one
(`TamperedError`); model-signing file digests of an encrypted tree were the plain files' (they
confirmed a guess of a pack's content and described no file on disk: now the stored files'). Also what held: every read path refuses a plain tree swapped in, manifests
swapped between two saves with the same key, rollback caught by `expect_root`, slices across
segment boundaries in memory:// with compression, wrong-key messages that say what to do.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import treepack

KEY = bytes(range(100, 132))


def _tree(seed=0):
    return {"w": np.arange(200_003, dtype=np.float32) + seed, "note": f"seed {seed}"}


@pytest.mark.parametrize("layout", ["dir", "one.tpk"])
@pytest.mark.parametrize("how", ["cut one byte", "one byte appended", "trailer cut off"])
def test_an_encrypted_file_cut_or_extended_is_tampered_not_a_plain_tree(attack, layout, how):
    """Bug: the object holding the manifest, cut short or extended by a byte, was refused as
    `NotEncryptedError` ("a plain tree where an encrypted one was expected may have been put
    there by someone else"): it still begins with the TPKCRYPT header, so it is a damaged
    encrypted file — `TamperedError`, a CorruptError, as for a damaged pack."""
    loc = Path(str(attack.loc) + (".tpk" if layout.endswith(".tpk") else ""))
    code_loc = "LOC + '.tpk'" if layout.endswith(".tpk") else "LOC"
    treepack.save(_tree(), loc, encryption=KEY)
    f = loc if layout.endswith(".tpk") else loc / "treepack.json"
    good = f.read_bytes()
    f.write_bytes({"cut one byte": good[:-1], "one byte appended": good + b"\0", "trailer cut off": good[:-16]}[how])
    for call in ["load", "open", "root_hash", "load_structure"]:
        r = attack.error(f"import treepack\ntreepack.{call}({code_loc}, encryption={KEY!r})", "TamperedError")
        assert "CorruptError" in r["bases"] and "restore the file from a good copy" in r["message"], r
    f.write_bytes(good)
    out = attack.run(f"import treepack\nresult = treepack.load({code_loc}, encryption={KEY!r})['note']")
    assert out == {"outcome": "ok", "result": "'seed 0'"}


@pytest.mark.parametrize("layout", ["plain", "plain.tpk"])
def test_every_read_path_refuses_a_plain_tree_put_in_place(tmp_path, layout):
    p = tmp_path / layout
    treepack.save(_tree(), p)
    priv, pub = treepack.generate_key()
    treepack.sign(p, priv)
    calls = {
        "load": lambda: treepack.load(p, encryption=KEY),
        "load select": lambda: treepack.load(p, encryption=KEY, select=["note"]),
        "open": lambda: treepack.open(p, encryption=KEY)["w"][0:2],
        "load_structure": lambda: treepack.load_structure(p, encryption=KEY),
        "root_hash": lambda: treepack.root_hash(p, encryption=KEY),
        "verify": lambda: treepack.verify(p, encryption=KEY),
        "diff": lambda: treepack.diff(p, p, encryption=KEY),
        "verify_signature": lambda: treepack.verify_signature(p, pub, encryption=KEY),
    }
    for name, call in calls.items():
        with pytest.raises(treepack.NotEncryptedError, match="not encrypted, but a key was given"):
            call()
    # Nothing was removed on the way.
    assert treepack.load(p)["note"] == "seed 0"


def test_manifests_swapped_between_saves_and_rollback(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    treepack.save(_tree(1), a, encryption=KEY)
    treepack.save(_tree(2), b, encryption=KEY)
    old = tmp_path / "old"
    shutil.copytree(a, old)
    # b's manifest in a: it names b's packs (keyed by b's data key), which a does not hold.
    Path(a, "treepack.json").write_bytes(Path(b, "treepack.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="which the manifest names, is missing"):
        treepack.load(a, encryption=KEY)
    # b's packs copied too: a complete copy of b, which loads as b (not a mix of the two).
    for f in Path(b, "packs").iterdir():
        shutil.copy(f, Path(a, "packs", f.name))
    np.testing.assert_array_equal(treepack.load(a, encryption=KEY)["w"], _tree(2)["w"])
    # a's packs under b's names: refused, not read as b's.
    pa, pb = next(Path(old, "packs").iterdir()), next(Path(b, "packs").iterdir())
    Path(a, "packs", pb.name).write_bytes(pa.read_bytes())
    with pytest.raises(treepack.TamperedError, match="`w`"):
        treepack.load(a, encryption=KEY)
    # Rollback: an older save loads (documented), and expect_root catches it.
    root_new = treepack.root_hash(b, encryption=KEY)
    assert treepack.load(old, encryption=KEY)["note"] == "seed 1"
    with pytest.raises(treepack.TreepackError, match="root"):
        treepack.load(old, encryption=KEY, expect_root=root_new)


@pytest.mark.parametrize("compression", [None, "zstd:1"])
def test_slices_across_segments_in_memory_and_files(tmp_path, compression):
    w = np.arange(300_007, dtype=np.float32)
    t = {"pad": np.ones(5), "w": w, "m": np.arange(4 * 70_001, dtype=np.int8).reshape(4, 70_001)}
    kw = {} if compression is None else {"compression": compression}
    for p in [f"memory://attack-enc-{compression}/t", tmp_path / "t", tmp_path / "t.tpk"]:
        treepack.save(t, p, encryption=KEY, chunk_bytes=70_001, **kw)
        r = treepack.open(p, encryption=KEY)
        for a, b in [(0, 1), (16_383, 16_385), (16_000, 200_000), (300_000, 300_007)]:
            np.testing.assert_array_equal(r["w"][a:b], w[a:b], err_msg=f"{p} {a}:{b}")
        np.testing.assert_array_equal(r["m"][1:3, 65_530:65_540], t["m"][1:3, 65_530:65_540])
        sel = treepack.load(p, encryption=KEY, select=["m"])
        np.testing.assert_array_equal(sel["m"], t["m"])


def test_wrong_keys_say_what_to_do(tmp_path):
    p = tmp_path / "k.tpk"
    treepack.save(_tree(), p, encryption=KEY)
    with pytest.raises(treepack.WrongKeyError, match="pass the key it was encrypted with"):
        treepack.load(p, encryption=bytes(32))
    with pytest.raises(treepack.WrongKeyError, match="32-byte key [0-9a-f]{16}, and a passphrase was given"):
        treepack.load(p, encryption=treepack.Passphrase("guess"))
    with pytest.raises(treepack.EncryptedError, match="encryption="):
        treepack.load(p)


def test_model_signing_digests_of_an_encrypted_tree_describe_the_stored_files(tmp_path):
    enc, plain = tmp_path / "enc", tmp_path / "plain"
    t = _tree()
    treepack.save(t, enc, encryption=KEY)
    treepack.save(t, plain)
    priv, _ = treepack.generate_key()
    treepack.sign(enc, priv, model_signing=True, encryption=KEY)
    sig = json.loads(Path(enc, "treepack.sig").read_bytes())
    stmt = json.loads(base64.b64decode(sig["dsseEnvelope"]["payload"]))
    listed = {r["name"]: r["digest"] for r in stmt["predicate"]["resources"]}
    plain_digests = {hashlib.sha256(f.read_bytes()).hexdigest() for f in Path(plain, "packs").iterdir()}
    assert not plain_digests & set(listed.values()), "the signature lists the plain packs' SHA-256"
    for name, digest in listed.items():
        assert hashlib.sha256(Path(enc, name).read_bytes()).hexdigest() == digest, name
