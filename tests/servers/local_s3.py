"""Start a moto S3 server on 127.0.0.1 with one bucket: for the Python tests (conftest.py) and
the benchmark's S3 peers (bench/run.py). `bash scripts/servers.sh` installs moto_server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request


def start(bucket: str):
    """(process, endpoint URL) of a fresh moto server holding `bucket`; kill the process to stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Beside this interpreter, or in the checkout's .venv (where scripts/servers.sh puts it; the
    # wheel test venvs of scripts/wheels.sh use that one).
    here = os.path.join(os.path.dirname(sys.executable), "moto_server")
    repo = os.path.join(os.path.dirname(__file__), "..", "..", ".venv", "bin", "moto_server")
    exe = next((p for p in (here, repo) if os.path.exists(p)), None)
    if exe is None:
        raise RuntimeError("moto_server is missing: run scripts/servers.sh")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint + "/", timeout=2).read()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto_server did not start")
            time.sleep(0.1)
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=10).read()
    return proc, endpoint
