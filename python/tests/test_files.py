"""File-backed objects (issue 26): registered types stored as named files in the tree's packs,
identical files stored once, placeholders that keep the files; Pillow images built in."""

import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import treepack


def stored_bytes(p):
    return sum(os.path.getsize(os.path.join(p, "packs", f)) for f in os.listdir(os.path.join(p, "packs")))


class Clip:
    """An audio clip as users have them: a file's bytes and a little metadata."""

    def __init__(self, wav: bytes, label: str):
        self.wav, self.label = wav, label


treepack.register(
    Clip,
    name="test.files.Clip",
    save=lambda c, files: (files.write("audio.wav", c.wav), {"label": c.label})[1],
    load=lambda files: Clip(files.read("audio.wav"), files.data["label"]),
)


def test_files_round_trip_and_identical_files_are_stored_once(tmp_path):
    distinct = [bytes([i]) * 20_000 + os.urandom(2_000) for i in range(10)]
    rows = [{"i": i, "clip": Clip(distinct[i % 10], f"row{i}")} for i in range(1000)]
    p = str(tmp_path / "ds")
    treepack.save({"rows": rows}, p)
    payload = sum(len(b) for b in distinct)
    assert payload <= stored_bytes(p) <= payload * 1.1, (stored_bytes(p), payload)
    back = treepack.load(p)["rows"]
    assert [r["clip"].label for r in back[:3]] == ["row0", "row1", "row2"]
    assert all(r["clip"].wav == distinct[r["i"] % 10] for r in back)
    # The structure shows the files as bytes leaves under the object, readable by key path.
    s = treepack.load_structure(p)["rows"][3]["clip"]
    assert s.type_name == "test.files.Clip" and set(s.children) == {"data", "files"}
    # One file, read alone by key path, without building the object.
    assert treepack.open(p)["rows"][3]["clip"]["files"]["audio.wav"] == distinct[3]


def test_files_written_from_streams_and_errors_name_the_place(tmp_path):
    class Doc:
        def __init__(self, parts):
            self.parts = parts

    def save(d, files):
        for name, b in d.parts:
            files.write(name, io.BytesIO(b) if name.endswith(".s") else b)

    treepack.register(Doc, name="test.files.Doc", save=save, load=lambda f: Doc([(n, f.read(n)) for n in f.names()]))
    p = str(tmp_path / "d")
    treepack.save({"d": Doc([("a.s", b"x" * 300), ("b", b"yz")])}, p)
    back = treepack.load(p)["d"]
    assert back.parts == [("a.s", b"x" * 300), ("b", b"yz")]
    with pytest.raises(TypeError, match=r"cannot save `d`.*written twice"):
        treepack.save({"d": Doc([("a", b"1"), ("a", b"2")])}, str(tmp_path / "e"))
    with pytest.raises(TypeError, match=r"cannot save `d`.*must be bytes or a binary stream"):
        treepack.save({"d": Doc([("a", "text")])}, str(tmp_path / "f"))


def test_register_takes_one_pair_of_functions():
    class T:
        pass

    for kw in [{}, {"to_data": str}, {"save": str}, {"to_data": str, "from_data": str, "save": str, "load": str}]:
        with pytest.raises(TypeError, match="to_data= and from_data=.*or save= and load="):
            treepack.register(T, name="test.files.T", **kw)


def test_a_missing_type_leaves_a_placeholder_that_keeps_the_files(tmp_path):
    p = str(tmp_path / "other")
    # Saved by a process that has the type; this one never registered `other.Photo`.
    code = textwrap.dedent(
        f"""
        import treepack
        class Photo:
            pass
        treepack.register(Photo, name="other.Photo", save=lambda o, f: (f.write("raw", b"\\x89" * 500), [1, 2])[1],
                          load=lambda f: Photo())
        treepack.save({{"p": Photo()}}, {p!r})
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(treepack.UntrustedTypeError, match="other.Photo"):
        treepack.load(p)
    ph = treepack.load(p, on_missing="placeholder")["p"]
    assert isinstance(ph, treepack.Unloadable) and ph.type_name == "other.Photo"
    assert ph.files == {"raw": b"\x89" * 500} and ph.data == [1, 2]


PIL = pytest.importorskip("PIL.Image", reason="Pillow is in python/requirements-dev.txt")


def _image(i, size=(32, 24)):
    rng = np.random.default_rng(i)
    return PIL.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def test_a_dataset_of_images_stores_each_distinct_image_once(tmp_path):
    images = [_image(i) for i in range(100)]
    rows = [{"id": i, "image": images[i % 100], "label": i % 7} for i in range(10_000)]
    p = str(tmp_path / "imgs")
    treepack.save(rows, p)
    png = 0
    for im in images:
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        png += len(buf.getvalue())
    assert stored_bytes(p) <= 1.1 * png, (stored_bytes(p), png)
    back = treepack.load(p)
    assert len(back) == 10_000
    for r in (back[0], back[4321], back[9999]):
        got = r["image"]
        assert got.format == "PNG" and got.size == (32, 24) and got.mode == "RGB"
        assert got.tobytes() == images[r["id"] % 100].tobytes()


def test_images_from_files_keep_their_bytes_and_modified_ones_become_png(tmp_path):
    src = str(tmp_path / "photo.jpg")
    _image(1, (64, 48)).save(src, format="JPEG", quality=80)
    original = open(src, "rb").read()
    photo = PIL.open(src)
    changed = PIL.open(src)
    changed.load()
    changed.paste((255, 0, 0), (0, 0, 8, 8))  # in place: format and filename stay, pixels differ
    p = str(tmp_path / "t")
    treepack.save({"photo": photo, "changed": changed}, p)
    manifest = open(os.path.join(p, "treepack.json")).read()
    assert '"format":"JPEG"' in manifest and '"format":"PNG"' in manifest
    back = treepack.load(p)
    assert back["photo"].format == "JPEG" and back["photo"].tobytes() == photo.tobytes()
    raw = treepack.open(p)["photo"]["files"]["image"]
    assert raw == original  # the file's bytes as they were
    assert back["changed"].format == "PNG" and back["changed"].tobytes() == changed.tobytes()


def test_images_opened_from_file_objects_keep_their_bytes(tmp_path):
    # Image.open(io.BytesIO(data)): how images fetched over HTTP or read from archives arrive.
    # Before their pixels are loaded Pillow holds the file object, and its bytes are stored as
    # they are (a JPEG stays a JPEG, not a PNG several times its size); once loaded, Pillow
    # lets go of it and the pixels are stored as PNG, as for any image made in memory.
    stored = {}
    for fmt in ("JPEG", "PNG", "WEBP"):
        buf = io.BytesIO()
        _image(2, (40, 30)).save(buf, format=fmt, **({"lossless": True} if fmt == "WEBP" else {}))
        stored[fmt] = buf.getvalue()
    lazy = {fmt: PIL.open(io.BytesIO(b)) for fmt, b in stored.items()}
    reader = io.BytesIO(stored["JPEG"])
    positioned = PIL.open(reader)
    reader.seek(7)  # wherever the caller left it: the image is read from the start
    loaded = PIL.open(io.BytesIO(stored["JPEG"]))
    loaded.load()
    p = str(tmp_path / "t")
    treepack.save({"lazy": lazy, "positioned": positioned, "loaded": loaded}, p)
    raw = treepack.open(p)
    for fmt, b in stored.items():
        assert raw["lazy"][fmt]["files"]["image"] == b
    assert raw["positioned"]["files"]["image"] == stored["JPEG"]
    back = treepack.load(p)
    for fmt in stored:
        assert back["lazy"][fmt].format == fmt and back["lazy"][fmt].tobytes() == lazy[fmt].tobytes()
    assert back["loaded"].format == "PNG" and back["loaded"].tobytes() == loaded.tobytes()


def test_images_of_every_mode_round_trip_exactly_and_keep_what_pillow_would_write(tmp_path, monkeypatch):
    from treepack import _core

    encoded = []
    rust = _core.encode_png
    monkeypatch.setattr(_core, "encode_png", lambda b, w, h, m: (encoded.append(m), rust(b, w, h, m))[1])
    rng = np.random.default_rng(5)
    made = {  # the modes encoded in Rust (odd sizes: rows of 1-bit images end mid-byte)
        "1": PIL.fromarray(rng.random((13, 21)) < 0.5),
        "L": PIL.fromarray(rng.integers(0, 256, (17, 9), dtype=np.uint8)),
        "LA": PIL.fromarray(rng.integers(0, 256, (5, 7, 2), dtype=np.uint8), "LA"),
        "RGB": PIL.fromarray(rng.integers(0, 256, (31, 33, 3), dtype=np.uint8)),
        "RGBA": PIL.fromarray(rng.integers(0, 256, (3, 64, 4), dtype=np.uint8)),
        "I;16": PIL.fromarray(rng.integers(0, 65536, (11, 6), dtype=np.uint16)),
    }
    # Left to Pillow: a palette with a transparency key, an image carrying an ICC profile.
    pal = made["L"].convert("P")
    pal.info["transparency"] = 3
    icc = made["RGB"].copy()
    icc.info["icc_profile"] = b"not really a profile, kept as given"
    p = str(tmp_path / "modes")
    treepack.save({**made, "pal": pal, "icc": icc}, p)
    assert sorted(encoded) == sorted(made), encoded
    back = treepack.load(p)
    for name, im in {**made, "pal": pal, "icc": icc}.items():
        got = back[name]
        assert (got.format, got.mode, got.size) == ("PNG", im.mode, im.size), name
        assert got.tobytes() == im.tobytes(), name
    assert back["pal"].info["transparency"] == 3 and back["pal"].getpalette() == pal.getpalette()
    assert back["icc"].info["icc_profile"] == icc.info["icc_profile"]
    # An empty image has no PNG: refused, saying so.
    with pytest.raises(TypeError, match=r"cannot save `empty`: an empty Pillow image \(0x4\) has no PNG file"):
        treepack.save({"empty": PIL.new("RGB", (0, 4))}, tmp_path / "empty")


def test_image_loads_allow_only_safe_formats_and_keep_the_bomb_limit(tmp_path, monkeypatch, rewrite_manifest):
    p = str(tmp_path / "b")
    treepack.save({"im": _image(2, (60, 60))}, p)
    rewrite_manifest(p, b'"format":"PNG"', b'"format":"BMP"')
    with pytest.raises(ValueError, match="format 'BMP' is not allowed"):
        treepack.load(p)
    q = str(tmp_path / "big")
    treepack.save({"im": _image(3, (60, 60))}, q)
    monkeypatch.setattr(PIL, "MAX_IMAGE_PIXELS", 1000)  # 3600 pixels > 2 x 1000: a "bomb"
    with pytest.raises(Exception, match="decompression bomb"):
        treepack.load(q)


def test_an_image_dataset_on_s3_loads_with_a_few_coalesced_requests(s3_counted):
    opts, counts = s3_counted
    images = [_image(i) for i in range(100)]
    rows = [{"id": i, "image": images[i % 100]} for i in range(10_000)]
    treepack.save(rows, "s3://bucket/files/images", storage_options=opts)
    counts.clear()
    back = treepack.load("s3://bucket/files/images", storage_options=opts)
    assert back[4242]["image"].tobytes() == images[42].tobytes()
    # One file per image would be 100 GETs (10 000 in the one-object-per-row pattern); the
    # images share a pack and are fetched with coalesced ranged reads.
    print("requests of the load:", dict(counts))
    assert 1 <= counts["GET"] <= 6, dict(counts)


def test_paths_are_embedded_on_request_and_files_carry_bytes(tmp_path):
    import pathlib

    report = tmp_path / "report.pdf"
    report.write_bytes(b"%PDF-1.7 " + bytes(range(256)) * 40)
    tree = {"doc": report, "missing": tmp_path / "nope.txt", "inline": treepack.File(data=b"abc", name="a.txt")}
    p = str(tmp_path / "t")
    treepack.save(tree, p, embed=True)
    back = treepack.load(p)
    doc = back["doc"]
    assert isinstance(doc, treepack.File) and doc.name == "report.pdf" and doc.path == str(report)
    assert doc.data == report.read_bytes() and doc.open().read(8) == b"%PDF-1.7"
    assert back["missing"] == tmp_path / "nope.txt"  # not a file: stays a path
    assert back["inline"] == treepack.File(data=b"abc", name="a.txt") and back["inline"].path is None
    out = doc.save_to(tmp_path / "out")  if (tmp_path / "out").mkdir() is None else None
    assert pathlib.Path(out).read_bytes() == report.read_bytes() and out.endswith("report.pdf")
    # Without embed=True a path is a path.
    q = str(tmp_path / "plain")
    treepack.save({"doc": report}, q)
    assert treepack.load(q)["doc"] == report
    with pytest.raises(TypeError, match=r"cannot save `f`: .*nope.txt cannot be read"):
        treepack.save({"f": treepack.File(tmp_path / "nope.txt")}, str(tmp_path / "bad"))


def test_wave_audio_is_a_built_in_file_backed_object(tmp_path, wav):
    import io
    import os
    import wave

    import numpy as np

    def clip(seed):
        return wav(2, 2, 16000, np.random.default_rng(seed).integers(-2**15, 2**15, 32000, dtype=np.int16).tobytes())

    clips = [clip(i) for i in range(10)]
    # 1,000 rows, 10 distinct clips, each row its own reader (content dedup, not identity).
    rows = [{"audio": wave.open(io.BytesIO(clips[i % 10]), "rb"), "label": i} for i in range(1000)]
    rows[0]["audio"].readframes(100)  # a reader part-way through: saved whole, position kept
    treepack.save(rows, tmp_path / "ds")
    assert rows[0]["audio"].tell() == 100
    stored = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / "ds" / "packs") for f in fs)
    assert stored <= 1.1 * sum(len(c) for c in clips), stored
    back = treepack.load(tmp_path / "ds")
    for i in (0, 7, 999):
        w = back[i]["audio"]
        assert isinstance(w, wave.Wave_read) and w.tell() == 0
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (2, 2, 16000, 16000)
        assert w.readframes(w.getnframes()) == wave.open(io.BytesIO(clips[i % 10])).readframes(16000)
    s = treepack.load_structure(tmp_path / "ds")[3]["audio"]
    assert s.type_name == "py.audio" and s.data["framerate"] == 16000


def test_damaged_audio_bytes_fail_clearly(tmp_path, monkeypatch, wav):
    import io
    import wave

    from treepack.integrations import audio

    good = wav(1, 1, 8000, b"\x80" * 100)
    monkeypatch.setattr(audio, "encode", lambda r: ({"format": "WAV"}, b"RIFF not really"))
    treepack.save({"a": wave.open(io.BytesIO(good), "rb")}, tmp_path / "t")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="py.audio: the stored bytes are not a WAV file"):
        treepack.load(tmp_path / "t")
