import os
import sys
from pathlib import Path

import pytest

# JAX on 8 CPU devices (set before any test imports jax: the backend reads these once), so the
# sharding tests have meshes to shard over on any machine.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()


@pytest.fixture
def attack(tmp_path):
    """A `hostile_harness.Hostile`: runs hostile cases in a child process with time and memory
    limits and checks nothing outside the case's location changed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hostile_harness import Hostile

    return Hostile(tmp_path)


@pytest.fixture
def loc(tmp_path):
    """A fresh location path (directory layout)."""
    return str(tmp_path / "tree")


# ---------------------------------------------------------------- local S3 (moto) for remote tests

@pytest.fixture(scope="session")
def s3():
    """A moto S3 server with bucket `bucket`; yields storage_options pointing at it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "servers"))
    import local_s3

    proc, endpoint = local_s3.start("bucket")
    try:
        yield {
            "endpoint": endpoint,
            "region": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
    finally:
        proc.kill()
        proc.wait()




@pytest.fixture
def s3_counted(s3):
    """`s3` seen through a forwarding proxy on 127.0.0.1 that counts requests by method: what a
    load costs an object store, in requests. Yields (storage_options, counts)."""
    import http.client
    import http.server
    import threading
    from collections import Counter
    from urllib.parse import urlparse

    target = urlparse(s3["endpoint"])
    counts: Counter = Counter()

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            counts[self.command] += 1
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            conn.request(self.command, self.path, body=body, headers=dict(self.headers))
            r = conn.getresponse()
            data = r.read()
            self.send_response(r.status)
            head = self.command == "HEAD"
            for k, v in r.getheaders():
                # A HEAD's Content-Length is the object's size (it has no body of its own).
                if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length"):
                    self.send_header(k, v)
            if not head:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {**s3, "endpoint": f"http://127.0.0.1:{server.server_address[1]}"}, counts
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def edits_refused(rewrite_manifest):
    """`edits_refused(tree_dir, [(old, new, match), ...])`: each edit made to the manifest in turn
    (resealed, as `rewrite_manifest` makes it), and the load after each refused with a
    ValueError matching `match`."""
    import treepack

    def check(tree_dir, edits) -> None:
        for old, new, match in edits:
            rewrite_manifest(tree_dir, old, new)
            with pytest.raises(ValueError, match=match):
                treepack.load(tree_dir)

    return check


@pytest.fixture
def wav():
    """`wav(channels, sampwidth, framerate, frames)`: the bytes of a WAV file holding `frames`."""
    import io
    import wave

    def make(channels: int, sampwidth: int, framerate: int, frames: bytes) -> bytes:
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(sampwidth)
            w.setframerate(framerate)
            w.writeframes(frames)
        return buf.getvalue()

    return make


@pytest.fixture
def rewrite_manifest():
    """`rewrite(tree_dir, old, new)`: replace bytes in a saved tree's manifest and reseal its
    hash, to craft a hostile file that passes the checksum (what the reader must still refuse)."""
    import blake3

    def rewrite(tree_dir, old: bytes, new: bytes) -> None:
        path = Path(tree_dir) / "treepack.json"
        text = path.read_bytes()
        assert old in text, f"{old!r} is not in the manifest"
        edited = text.replace(old, new)
        body = edited[: edited.rindex(b',\n"manifest_hash"')]
        path.write_bytes(body + b',\n"manifest_hash":"' + blake3.blake3(body).hexdigest().encode() + b'"}\n')

    return rewrite


def pytest_configure(config):
    # Registered here, not in pyproject.toml: scripts/wheels.sh runs the suite with `-c /dev/null`.
    config.addinivalue_line(
        "markers",
        "slow: a long soak or a many-process job; runs in the main venv (scripts/test.sh) and is "
        "left out of the per-wheel venvs (scripts/wheels.sh), which check the built wheel, not timing",
    )
