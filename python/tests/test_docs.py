"""The Python examples in README.md and docs/*.md run as written."""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks():
    for doc in DOCS:
        for i, m in enumerate(re.finditer(r"```python\n(.*?)```", doc.read_text(), re.S)):
            yield pytest.param(m.group(1), id=f"{doc.name}-{i}")


@pytest.fixture(scope="module")
def s3_env(s3):
    """Examples that use s3:// run against the local moto server (conftest.py), configured the way
    the docs tell users to configure real S3: through AWS_* environment variables."""
    opts = s3
    env = {
        "AWS_ENDPOINT_URL": opts["endpoint"],
        "AWS_REGION": opts["region"],
        "AWS_ACCESS_KEY_ID": opts["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": opts["aws_secret_access_key"],
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield opts
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("code", list(blocks()))
def test_doc_example_runs(code, request):
    if "s3://" in code:
        request.getfixturevalue("s3_env")
    if "import torch" in code:
        pytest.importorskip("torch")  # the wheel venvs have no torch; .venv does
    for lib in ("jax", "flax", "optax", "dask", "distributed", "xarray", "pandas", "zarr", "orbax"):
        if re.search(rf"^(import|from) {lib}\b", code, re.M):
            pytest.importorskip(lib)  # nor JAX's ecosystem, Dask or xarray; zarr needs Python 3.11+
    if "pytree_serialization" in code or "orbax" in code:
        pytest.importorskip("tensorstore")  # JAX's and Orbax's writers need it
    exec(compile(code, "<doc>", "exec"), {"__name__": "__main__"})


def test_there_are_examples():
    assert len(list(blocks())) >= 2
