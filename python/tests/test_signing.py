"""Signed trees from Python (issue 55, docs/signing.md): sign, load/open(signed_by=) refusing
unsigned, other-key, re-signed and modified trees before anything is returned, keys in every
form, rollback checks, repositories, remote locations, and the OpenSSF model-signing verifier."""

import datetime
import os
import shutil
import subprocess

import numpy as np
import pytest

import treepack
from treepack import _signing


def tree(seed=0):
    return {"params": {"w": np.arange(4096, dtype=np.float32).reshape(64, 64) + seed, "b": np.ones(64)},
            "step": seed}


@pytest.fixture
def keys(tmp_path):
    """Two key pairs on disk: (private, public) paths for `me`, public bytes for `other`."""
    treepack.generate_key(tmp_path / "me.pem")
    _, other = treepack.generate_key(algorithm="ecdsa-p256")
    return str(tmp_path / "me.pem"), str(tmp_path / "me.pub.pem"), other


def saved(loc, seed=0, metadata=None):
    treepack.save(tree(seed), loc, metadata=metadata, overwrite=True)
    return loc


def same(a, b):
    assert a["step"] == b["step"] and np.array_equal(a["params"]["w"], b["params"]["w"])


def test_a_signed_tree_loads_with_its_key_in_every_form(tmp_path, keys):
    me, me_pub, _ = keys
    loc = saved(str(tmp_path / "ckpt"), metadata={"run": 1})
    info = treepack.sign(loc, me, tree_version=4)
    assert info.trusted and info.tree_version == 4 and info.root == treepack.root_hash(loc)
    assert info.file.endswith("treepack.sig") and info.algorithm == "ed25519"
    pem = open(me_pub, "rb").read()
    for key in (me_pub, pem, pem.decode(), [b"not used", me_pub][1:], [treepack.generate_key()[1], pem], me):
        same(treepack.load(loc, signed_by=key), tree())
    # cryptography's key objects, where it is installed.
    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")
    obj = serialization.load_pem_private_key(open(me, "rb").read(), None)
    same(treepack.load(loc, signed_by=obj.public_key()), tree())
    same(treepack.load(loc, signed_by=obj), tree())
    # Partial, lazy, framework loads check first too.
    assert treepack.load(loc, signed_by=pem, select=["step"])["params"]["w"] is None
    view = treepack.open(loc, signed_by=pem)
    assert view["params"]["w"][:2, :3].shape == (2, 3)
    out = treepack.load(loc, signed_by=pem, framework="numpy")
    assert out["step"] == 0
    checked = treepack.verify_signature(loc, pem)
    assert checked.trusted and checked.fingerprint == info.fingerprint
    claimed = treepack.signature(loc)
    assert not claimed.trusted and claimed.matches_tree and claimed.fingerprint == info.fingerprint


def test_unsigned_other_key_resigned_and_modified_trees_are_refused(tmp_path, keys):
    me, me_pub, other = keys
    loc = saved(str(tmp_path / "ckpt"), metadata={"run": 1})
    for call in (lambda k: treepack.load(loc, signed_by=k), lambda k: treepack.open(loc, signed_by=k),
                 lambda k: treepack.load(loc, signed_by=k, select=["params/**"])):
        with pytest.raises(treepack.UnsignedError, match="not signed"):
            call(me_pub)
    treepack.sign(loc, me)
    with pytest.raises(treepack.UntrustedSignerError, match="not by a trusted key"):
        treepack.load(loc, signed_by=other)
    # Someone changes the tree and re-signs it with their own key.
    saved(loc, seed=5, metadata={"run": 1})
    other_priv, _ = treepack.generate_key()
    treepack.sign(loc, other_priv)
    with pytest.raises(treepack.UntrustedSignerError):
        treepack.load(loc, signed_by=me_pub)
    # Changed after signing, signature left in place: the root no longer matches.
    treepack.sign(loc, me)
    saved(loc, seed=6, metadata={"run": 1})
    with pytest.raises(treepack.SignatureMismatchError, match="modified or replaced"):
        treepack.load(loc, signed_by=me_pub)
    with pytest.raises(treepack.SignatureMismatchError):
        treepack.open(loc, signed_by=me_pub)
    # Only the metadata changed.
    treepack.sign(loc, me)
    saved(loc, seed=6, metadata={"run": 2})
    with pytest.raises(treepack.SignatureMismatchError, match="metadata"):
        treepack.load(loc, signed_by=me_pub)
    # The errors are one family, and TreepackErrors.
    assert issubclass(treepack.UnsignedError, treepack.SignatureError)
    assert issubclass(treepack.SignatureError, treepack.TreepackError)


def test_a_flipped_pack_byte_fails_the_read_against_the_signed_manifest(tmp_path, keys):
    me, me_pub, _ = keys
    loc = saved(str(tmp_path / "ckpt"))
    treepack.sign(loc, me)
    pack = os.path.join(loc, "packs", os.listdir(os.path.join(loc, "packs"))[0])
    with open(pack, "r+b") as f:
        f.seek(8)
        b = f.read(1)
        f.seek(8)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(treepack.CorruptError):
        treepack.load(loc, signed_by=me_pub)
    with pytest.raises(treepack.CorruptError):  # mmap loads check chunks when a signature is asked for
        treepack.load(loc, signed_by=me_pub, mmap=True)
    view = treepack.open(loc, signed_by=me_pub)  # the signature holds: the manifest is the signed one
    with pytest.raises(treepack.CorruptError):
        view["params"]["w"][:]


def test_a_tree_replaced_after_the_check_is_refused(tmp_path, keys, monkeypatch):
    """The load reads through the very reader (or, in one pass, the very manifest bytes) whose
    signature was checked; a tree swapped in after the check makes the load start over on the
    new tree, which is checked again and refused — never loaded."""
    me, me_pub, _ = keys
    loc = saved(str(tmp_path / "ckpt"))
    treepack.sign(loc, me)
    checked = _signing.Signed.check

    def check_then_swap(self, reader):
        info = checked(self, reader)
        treepack.save(tree(9), loc, overwrite=True)  # its packs replace the checked tree's
        return info

    monkeypatch.setattr(_signing.Signed, "check", check_then_swap)
    with pytest.raises(treepack.SignatureMismatchError):
        treepack.load(loc, signed_by=me_pub, select=["params/**"])


def test_rollback_is_refused_by_min_version_not_before_and_expect_root(tmp_path, keys):
    me, me_pub, _ = keys
    old, loc = str(tmp_path / "v1.tpk"), str(tmp_path / "model.tpk")
    saved(old, seed=1)
    treepack.sign(old, me, tree_version=1)
    saved(loc, seed=2)
    info = treepack.sign(loc, me, tree_version=2)
    # The attacker puts release 1 back, with its own valid signature.
    shutil.copy(old, loc)
    shutil.copy(old + ".sig", loc + ".sig")
    same(treepack.load(loc, signed_by=me_pub), tree(1))  # a signature alone cannot tell
    with pytest.raises(treepack.SignatureMismatchError, match="older than min_version 2"):
        treepack.load(loc, signed_by=me_pub, min_version=2)
    for later in ("2999-01-01", datetime.datetime(2999, 1, 1), datetime.date(2999, 1, 1), 32503680000.0):
        with pytest.raises(treepack.SignatureMismatchError, match="before not_before"):
            treepack.load(loc, signed_by=me_pub, not_before=later)
    assert treepack.load(loc, signed_by=me_pub, not_before=info.signed_at - datetime.timedelta(days=1))
    with pytest.raises(treepack.RootMismatchError):
        treepack.load(loc, signed_by=me_pub, expect_root=info.root)
    with pytest.raises(TypeError, match="signed_by"):
        treepack.load(loc, min_version=2)


def test_repository_trees_and_memory_locations(tmp_path, keys):
    me, me_pub, _ = keys
    repo = treepack.Repository(str(tmp_path / "runs"), create=True)
    repo.save(tree(1), "step-1")
    repo.save(tree(2), "step-2")
    info = treepack.sign(repo.tree("step-1"), me)
    assert info.file.endswith(os.path.join("signatures", "step-1.sig"))
    same(repo.load("step-1", signed_by=me_pub), tree(1))
    assert repo.open("step-1", signed_by=me_pub)["step"] == 1
    with pytest.raises(treepack.UnsignedError):
        repo.load("step-2", signed_by=me_pub)
    mem = "memory://signing-py/ckpt.tpk"
    treepack.save(tree(3), mem, overwrite=True)
    treepack.sign(mem, me)
    same(treepack.load(mem, signed_by=me_pub), tree(3))


def test_a_remote_tree_is_checked_before_its_data_is_read(s3, keys):
    me, me_pub, other = keys
    loc = "s3://bucket/signing/ckpt"
    treepack.save(tree(4), loc, storage_options=s3, overwrite=True)
    treepack.sign(loc, me, storage_options=s3)
    same(treepack.load(loc, signed_by=me_pub, storage_options=s3), tree(4))
    with pytest.raises(treepack.UntrustedSignerError):
        treepack.load(loc, signed_by=other, storage_options=s3)


def test_keys_that_are_not_keys(tmp_path):
    loc = saved(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="public key"):
        treepack.sign(loc, treepack.generate_key()[1])
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n")
    with pytest.raises(ValueError, match="Ed25519 or ECDSA P-256") as e:
        treepack.sign(loc, str(bad))
    assert "bad.pem" in str(e.value)
    with pytest.raises(FileNotFoundError):
        treepack.load(loc, signed_by=str(tmp_path / "missing.pub.pem"))
    with pytest.raises(ValueError, match="empty"):
        treepack.load(loc, signed_by=[])


def test_a_hostile_signature_file_is_an_invalid_signature(tmp_path, keys):
    me, me_pub, _ = keys
    loc = saved(str(tmp_path / "ckpt"))
    sig = os.path.join(loc, "treepack.sig")
    for text in ("[" * 100_000 + "]" * 100_000, "{}", "not json", '{"payload":"%%%","payloadType":"x","signatures":[]}'):
        with open(sig, "w") as f:
            f.write(text)
        with pytest.raises(treepack.InvalidSignatureError):
            treepack.load(loc, signed_by=me_pub)
        assert treepack.load(loc)["step"] == 0  # unsigned loads do not look at it


def _model_signing():
    exe = os.environ.get("TREEPACK_MODEL_SIGNING") or shutil.which("model_signing")
    if not exe:
        pytest.skip("the model-signing verifier is not installed (pip install model-signing pyopenssl; "
                    "or TREEPACK_MODEL_SIGNING=path/to/model_signing)")
    return exe


def test_the_model_signing_reference_verifier_checks_a_signed_tree(tmp_path):
    exe = _model_signing()
    priv, pub = tmp_path / "k.pem", tmp_path / "k.pub.pem"
    treepack.generate_key(priv, algorithm="ecdsa-p256")
    d, f = saved(str(tmp_path / "ckpt")), saved(str(tmp_path / "m.tpk"))

    def check(model, sig):
        r = subprocess.run([exe, "verify", "key", model, "--signature", sig, "--public_key", str(pub)],
                           capture_output=True, text=True)
        return r.returncode == 0 and "Verification succeeded" in r.stdout, r.stdout + r.stderr

    treepack.sign(d, priv)  # treepack's own statement: model-signing refuses it, never passes it
    ok, out = check(d, os.path.join(d, "treepack.sig"))
    assert not ok and "Predicate type mismatch" in out, out
    for model, sig in ((d, os.path.join(d, "treepack.sig")), (f, f + ".sig")):
        info = treepack.sign(model, priv, model_signing=True)
        assert info.model_signing_files >= 1
        ok, out = check(model, sig)
        assert ok, out
        treepack.load(model, signed_by=pub)  # and treepack checks the same file
    pack = os.path.join(d, "packs", os.listdir(os.path.join(d, "packs"))[0])
    with open(pack, "r+b") as fh:
        fh.write(b"\xff")
    ok, out = check(d, os.path.join(d, "treepack.sig"))
    assert not ok and "Hash mismatch" in out, out


GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden")


@pytest.mark.parametrize("alg", ["ed25519", "p256"])
def test_the_golden_signature_checks_with_another_implementation(alg):
    """docs/format.md section 12 checked by `cryptography` and the standard library alone: the
    bundle's DSSE pre-authentication encoding verifies under the golden public key, and the
    statement's subject is the golden demo tree's root hash — in all four of its layouts."""
    import base64
    import hashlib
    import json

    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    d = os.path.join(GOLDEN, "signing")
    pub_pem = open(os.path.join(d, f"{alg}.pub.pem"), "rb").read()
    bundle = json.load(open(os.path.join(d, f"demo.{alg}.sig")))
    env = bundle["dsseEnvelope"]
    payload = base64.b64decode(env["payload"])
    ptype = env["payloadType"].encode()
    pae = b"DSSEv1 %d %s %d %s" % (len(ptype), ptype, len(payload), payload)
    key = serialization.load_pem_public_key(pub_pem)
    sig = base64.b64decode(env["signatures"][0]["sig"])
    if alg == "p256":
        key.verify(sig, pae, ec.ECDSA(hashes.SHA256()))
    else:
        key.verify(sig, pae)
    fingerprint = hashlib.sha256(pub_pem).hexdigest()
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == fingerprint == env["signatures"][0]["keyid"]
    statement = json.loads(payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://treepack/signature/v1"
    root = statement["subject"][0]["digest"]["treepackRootBlake3"]
    for layout in ("demo", "demo.tpk", "demo-zstd.tpk", "demo-lz4"):
        assert treepack.root_hash(os.path.join(GOLDEN, layout)) == root
    assert statement["predicate"]["formatVersion"] == [1, 4]


def test_signatures_made_by_another_implementation_verify(tmp_path):
    """A statement signed with Python's `cryptography` (ECDSA with random nonces, so half its
    signatures have the high `s` value; Ed25519) checks as treepack's own — and a bare DSSE
    envelope (no bundle around it) is read too."""
    import base64
    import json

    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    loc = saved(str(tmp_path / "ckpt"), metadata={"run": 3})
    treepack.sign(loc, treepack.generate_key()[0])  # for the statement treepack would write
    payload = base64.b64decode(json.load(open(os.path.join(loc, "treepack.sig")))["dsseEnvelope"]["payload"])
    ptype = b"application/vnd.in-toto+json"
    pae = b"DSSEv1 %d %s %d %s" % (len(ptype), ptype, len(payload), payload)
    for make, sign in ((lambda: ec.generate_private_key(ec.SECP256R1()), lambda k: k.sign(pae, ec.ECDSA(hashes.SHA256()))),
                       (ed25519.Ed25519PrivateKey.generate, lambda k: k.sign(pae))):
        key = make()
        pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        for _ in range(16):
            env = {"payload": base64.b64encode(payload).decode(), "payloadType": ptype.decode(),
                   "signatures": [{"sig": base64.urlsafe_b64encode(sign(key)).decode().rstrip("=")}]}
            with open(os.path.join(loc, "treepack.sig"), "w") as f:
                json.dump(env, f)
            info = treepack.verify_signature(loc, pub)
            assert info.trusted and info.root == treepack.root_hash(loc)
