"""Encrypted trees from Python (issue 55, docs/encryption.md): real objects round-trip through
every key kind and layout; nothing of the tree is in its files; wrong, missing and unexpected
keys are told apart; tampered files are refused naming the leaf, in a child process with limits
that checks nothing outside changed; what is not supported says so."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import treepack

KEY = bytes(range(32))


@dataclasses.dataclass
class Config:
    lr: float
    layers: int
    name: str


def _tree():
    rng = np.random.default_rng(0)
    return {
        "params": {"w": rng.standard_normal((300, 300)).astype(np.float32), "b": np.arange(300, dtype=np.float64)},
        "config": Config(3e-4, 12, "a secret run name"),
        "history": [{"step": i, "loss": 1.0 / (i + 1)} for i in range(50)],
        "tokens": b"\x00\x01" * 1000,
    }


def _same(a, b):
    assert a.keys() == b.keys()
    np.testing.assert_array_equal(a["params"]["w"], b["params"]["w"])
    np.testing.assert_array_equal(a["params"]["b"], b["params"]["b"])
    assert a["config"] == b["config"] and a["history"] == b["history"] and a["tokens"] == b["tokens"]


class KMS:
    """A stand-in key-management service: wraps data keys with a key it keeps, counts calls."""

    def __init__(self) -> None:
        self.master = os.urandom(32)
        self.calls = []

    def wrap_key(self, data_key: bytes):
        self.calls.append("wrap")
        return "projects/p/keys/k1", bytes(a ^ b for a, b in zip(data_key, self.master))

    def unwrap_key(self, key_id: str, wrapped: bytes) -> bytes:
        self.calls.append("unwrap")
        if key_id != "projects/p/keys/k1":
            raise PermissionError(f"no access to {key_id}")
        return bytes(a ^ b for a, b in zip(wrapped, self.master))


@pytest.mark.parametrize("layout", ["dir", "one.tpk", "memory"])
@pytest.mark.parametrize("kind", ["key", "passphrase", "provider"])
def test_round_trip_every_key_kind_and_layout(tmp_path, layout, kind):
    p = f"memory://enc-{kind}/t" if layout == "memory" else str(tmp_path / layout)
    enc = {"key": KEY, "passphrase": treepack.Passphrase("correct horse battery"), "provider": KMS()}[kind]
    t = _tree()
    trust = [f"{__name__}:Config"]
    treepack.save(t, p, encryption=enc, compression="zstd")
    _same(treepack.load(p, encryption=enc, trust=trust), t)
    # Lazy, partial and structural reads, and verify, all through the key.
    v = treepack.open(p, encryption=enc, trust=trust)
    np.testing.assert_array_equal(v["params"]["w"][5:7], t["params"]["w"][5:7])
    assert treepack.load(p, encryption=enc, select=["history/**"])["history"] == t["history"]
    assert treepack.load_structure(p, encryption=enc)["params"]["w"].shape == (300, 300)
    assert treepack.verify(p, encryption=enc).ok
    assert treepack.root_hash(p, encryption=enc) == treepack.root_hash(_plain_copy(tmp_path, t))
    with pytest.raises(treepack.EncryptedError, match="the tree is encrypted"):
        treepack.load(p)
    if isinstance(enc, KMS):
        assert enc.calls[0] == "wrap" and "unwrap" in enc.calls
        # One load asks the service once (its reader's pinned view reuses the opened envelope).
        enc.calls.clear()
        treepack.load(p, encryption=enc, trust=trust)
        assert enc.calls == ["unwrap"], enc.calls


def _plain_copy(tmp_path, t):
    p = str(tmp_path / "plain-copy")
    treepack.save(t, p, overwrite=True, compression="zstd")
    return p


def test_torch_model_and_optimizer_state_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 1}
    p = tmp_path / "ckpt.tpk"
    key = treepack.generate_encryption_key()
    treepack.save(state, p, encryption=key)
    back = treepack.load(p, encryption=key)
    fresh = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    fresh.load_state_dict(back["model"])
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    assert back["optim"]["state"][0]["exp_avg"].shape == (64, 32)


def test_background_save_is_encrypted_too(tmp_path):
    p = tmp_path / "bg"
    t = _tree()
    h = treepack.save(t, p, encryption=KEY, blocking=False)
    h.result()
    _same(treepack.load(p, encryption=KEY, trust=[f"{__name__}:Config"]), t)
    for f in p.rglob("*"):
        if f.is_file():
            assert f.read_bytes().startswith(b"TPKCRYPT")


def test_nothing_of_the_tree_is_in_its_files(tmp_path):
    t = _tree()
    for p in [tmp_path / "d", tmp_path / "f.tpk"]:
        treepack.save(t, p, encryption=KEY)
        files = [f for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
        for f in files:
            b = f.read_bytes()
            for needle in [b"a secret run name", b"history", b"Config", t["params"]["w"][7].tobytes()[:64],
                           b"\x00\x01\x00\x01\x00\x01\x00\x01\x00\x01"]:
                assert needle not in b, (f, needle[:20])


def test_wrong_missing_and_unexpected_keys(tmp_path):
    p = tmp_path / "t"
    treepack.save(_tree(), p, encryption=KEY)
    with pytest.raises(treepack.WrongKeyError, match="is not the key this tree was encrypted with"):
        treepack.load(p, encryption=os.urandom(32))
    with pytest.raises(treepack.WrongKeyError, match="and a passphrase was given"):
        treepack.load(p, encryption=treepack.Passphrase("guess"))
    with pytest.raises(treepack.EncryptedError, match=r"32-byte key [0-9a-f]{16}.*encryption="):
        treepack.open(p)
    plain = tmp_path / "plain"
    treepack.save({"x": 1}, plain)
    with pytest.raises(treepack.NotEncryptedError, match="not encrypted, but a key was given"):
        treepack.load(plain, encryption=KEY)
    # Keys that are not keys, told before anything is read.
    with pytest.raises(ValueError, match="32-byte key, and 16 bytes"):
        treepack.load(p, encryption=b"0" * 16)
    with pytest.raises(TypeError, match="Passphrase"):
        treepack.load(p, encryption="a passphrase as a str")
    with pytest.raises(ValueError, match="empty passphrase"):
        treepack.Passphrase("")
    assert repr(treepack.Passphrase("hunter2")) == "Passphrase(***)"
    # A key provider that refuses: its words reach the user.
    kms = KMS()
    q = tmp_path / "q"
    treepack.save({"x": np.ones(3)}, q, encryption=kms)

    class Other(KMS):
        def unwrap_key(self, key_id, wrapped):
            raise PermissionError(f"caller may not use {key_id}")

    with pytest.raises(treepack.WrongKeyError, match="key provider failed: PermissionError: caller may not use projects/p/keys/k1"):
        treepack.load(q, encryption=Other())


def test_tampered_files_are_refused_naming_the_leaf(tmp_path, attack):
    """Each tampered copy is opened in a child process (time and memory limits, nothing outside
    touched): a flipped byte, two segments swapped, a pack from another save."""
    base = attack.loc
    treepack.save({"weights": np.arange(200_000, dtype=np.float32), "note": "x"}, base, encryption=KEY)
    other = tmp_path / "other"
    treepack.save({"weights": np.arange(200_000, dtype=np.float32), "note": "x"}, other, encryption=KEY)
    pack = next(Path(base, "packs").iterdir())
    good = pack.read_bytes()
    seg = (64 << 10) + 16
    flipped = bytearray(good)
    flipped[16 + 3 * seg + 5] ^= 1
    swapped = bytearray(good)
    swapped[16:16 + seg], swapped[16 + seg:16 + 2 * seg] = good[16 + seg:16 + 2 * seg], good[16:16 + seg]
    replayed = next(Path(other, "packs").iterdir()).read_bytes()
    for bad in [bytes(flipped), bytes(swapped), replayed]:
        pack.write_bytes(bad)
        out = attack.run(f"import treepack\ntreepack.load(LOC, encryption={KEY!r})")
        assert out["outcome"] == "error" and out["type"] == "TamperedError", out
        assert "`weights`" in out["message"] and "restore the file from a good copy" in out["message"], out
        assert "CorruptError" in out["bases"]
    pack.write_bytes(good)
    out = attack.run(f"import treepack\nresult = int(treepack.load(LOC, encryption={KEY!r})['weights'][-1])")
    assert out["outcome"] == "ok" and out["result"] == "199999", out


def test_hostile_envelopes_are_refused_in_a_child(attack):
    """An envelope asking Argon2id for 4 GiB, one of 10 MB, one that is not JSON: refused, fast,
    without the memory."""
    base = attack.loc
    treepack.save({"x": np.ones(10)}, base, encryption=treepack.Passphrase("pw"))
    m = Path(base, "treepack.json")
    good = m.read_bytes()
    import json as _json
    import struct

    elen = struct.unpack("<I", good[-16:-12])[0]
    body, env = good[:-16 - elen], good[-16 - elen:-16]
    e = _json.loads(env)
    e["key"]["m_kib"] = 4 << 20
    cases = {
        "argon2 memory": _json.dumps(e).encode(),
        "not json": b"{" * 2000,
        "unknown cipher": env.replace(b"aes-256-gcm", b"rot13-00000"),
    }
    for what, new in cases.items():
        m.write_bytes(body + new + struct.pack("<I", len(new)) + b"\0" * 4 + b"TPKCRYPT")
        out = attack.run("import treepack\ntreepack.load(LOC, encryption=treepack.Passphrase('pw'))",
                          mem_bytes=1 << 30, timeout=20)
        assert out["outcome"] == "error" and out["type"] == "WrongKeyError", (what, out)
        assert "envelope" in out["message"], (what, out)
    # A trailer declaring an envelope larger than the file.
    m.write_bytes(body + struct.pack("<I", 1 << 30) + b"\0" * 4 + b"TPKCRYPT")
    out = attack.run("import treepack\ntreepack.load(LOC, encryption=treepack.Passphrase('pw'))", mem_bytes=1 << 30)
    assert out["outcome"] == "error" and out["type"] == "TamperedError", out


def test_what_is_not_supported_says_so(tmp_path):
    repo = treepack.Repository(tmp_path / "repo", create=True)
    with pytest.raises(ValueError, match="trees of a repository cannot be encrypted yet"):
        repo.save({"x": 1}, "main", encryption=KEY)
    with pytest.raises(treepack.NotEncryptedError, match="not encrypted"):
        st = pytest.importorskip("safetensors.numpy")
        f = tmp_path / "m.safetensors"
        st.save_file({"a": np.ones(3, dtype=np.float32)}, str(f))
        treepack.load(f, encryption=KEY)


def test_convert_reads_an_encrypted_source_and_encrypts_a_target(tmp_path):
    pytest.importorskip("safetensors")
    src = tmp_path / "src.tpk"
    treepack.save({"a": np.arange(10, dtype=np.float32)}, src, encryption=KEY)
    out = tmp_path / "m.safetensors"
    treepack.convert(src, out, encryption=KEY)
    np.testing.assert_array_equal(treepack.load(out)["a"], np.arange(10, dtype=np.float32))
    back = tmp_path / "back.tpk"
    treepack.convert(out, back, dst_encryption=treepack.Passphrase("pw"))
    with pytest.raises(treepack.EncryptedError):
        treepack.load(back)
    np.testing.assert_array_equal(treepack.load(back, encryption=treepack.Passphrase("pw"))["a"], np.arange(10))


def test_signed_encrypted_tree(tmp_path):
    priv, pub = treepack.generate_key()
    p = tmp_path / "t.tpk"
    treepack.save({"w": np.ones(4)}, p, encryption=KEY)
    treepack.sign(p, priv, encryption=KEY)
    out = treepack.load(p, encryption=KEY, signed_by=pub)
    np.testing.assert_array_equal(out["w"], np.ones(4))
    assert treepack.verify_signature(p, pub, encryption=KEY).trusted


def test_cli_copies_keep_the_key_unless_told(tmp_path):
    exe = Path(__file__).resolve().parents[2] / "target" / "debug" / "treepack"
    if not exe.exists():
        pytest.skip("the CLI is built by cargo (scripts/test.sh builds it before the Python suite)")
    cli = [str(exe)]
    keyfile = tmp_path / "k"
    keyfile.write_bytes(KEY)
    plain = tmp_path / "plain"
    treepack.save({"w": np.arange(5.0), "s": "text"}, plain)
    run = lambda *a, **k: subprocess.run([*cli, *map(str, a)], capture_output=True, text=True, **k)  # noqa: E731
    r = run("cp", plain, tmp_path / "e.tpk", "--dst-encryption-key", keyfile)
    assert r.returncode == 0, r.stderr
    r = run("inspect", tmp_path / "e.tpk")
    assert r.returncode != 0 and "the tree is encrypted" in r.stderr and "--encryption-key" in r.stderr, r.stderr
    r = run("inspect", tmp_path / "e.tpk", "--encryption-key", keyfile)
    assert r.returncode == 0 and re.search(r"encrypted with the 32-byte key [0-9a-f]{16}, format 1\.7", r.stdout), (
        r.stdout + r.stderr
    )
    r = run("view", tmp_path / "e.tpk", "--encryption-key", keyfile, timeout=60)
    assert r.returncode != 0 and "does not open encrypted trees yet" in r.stderr, r.stderr
    r = run("cp", tmp_path / "e.tpk", tmp_path / "f", "--encryption-key", keyfile)
    assert r.returncode == 0, r.stderr
    with pytest.raises(treepack.EncryptedError):
        treepack.load(tmp_path / "f")
    r = run("cp", tmp_path / "e.tpk", tmp_path / "g", "--encryption-key", keyfile, "--decrypt")
    assert r.returncode == 0, r.stderr
    assert treepack.load(tmp_path / "g")["s"] == "text"
    env = {**os.environ, "PW": "a passphrase"}
    r = run("cp", tmp_path / "e.tpk", tmp_path / "h.tpk", "--encryption-key", keyfile, "--dst-passphrase-env", "PW", env=env)
    assert r.returncode == 0, r.stderr
    r = run("cat", tmp_path / "h.tpk", "s", "--passphrase-env", "PW", env=env)
    assert r.returncode == 0 and "text" in r.stdout, r.stdout + r.stderr
    assert treepack.load(tmp_path / "h.tpk", encryption=treepack.Passphrase("a passphrase"))["s"] == "text"


@pytest.mark.parametrize("name", ["enc/ckpt", "enc/ckpt.tpk"])
def test_s3_encrypted_trees_read_only_their_segments(s3_counted, name):
    """On an object store (moto on 127.0.0.1): an encrypted tree saves, loads, verifies, and a
    lazy slice costs a few ranged GETs of a few segments, not the file."""
    opts, counts = s3_counted
    p = f"s3://bucket/{name}"
    big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    treepack.save({"big": big, "note": "secret"}, p, storage_options=opts, encryption=KEY, overwrite=True)
    back = treepack.load(p, storage_options=opts, encryption=KEY)
    np.testing.assert_array_equal(back["big"], big)
    assert back["note"] == "secret"
    assert treepack.verify(p, storage_options=opts, encryption=KEY).ok
    with pytest.raises(treepack.EncryptedError):
        treepack.load(p, storage_options=opts)
    v = treepack.open(p, storage_options=opts, encryption=KEY)
    counts.clear()
    np.testing.assert_array_equal(v["big"][1_000_000:1_000_010], big[1_000_000:1_000_010])
    gets = counts.get("GET", 0)
    assert 1 <= gets <= 4, counts
