import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


@pytest.fixture
def loc(tmp_path):
    """A fresh location path (directory layout)."""
    return str(tmp_path / "tree")


# ---------------------------------------------------------------- local S3 (moto) for remote tests
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3():
    """A moto S3 server with bucket `bucket`; yields storage_options pointing at it."""
    exe = Path(sys.executable).parent / "moto_server"
    assert exe.exists(), "moto_server is missing: run scripts/servers.sh"
    port = _free_port()
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start")
                time.sleep(0.1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/bucket", method="PUT")
        urllib.request.urlopen(req, timeout=10).read()
        yield {
            "endpoint": f"http://127.0.0.1:{port}",
            "region": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
    finally:
        proc.kill()
        proc.wait()


