import pytest


@pytest.fixture
def loc(tmp_path):
    """A fresh location path (directory layout)."""
    return str(tmp_path / "tree")
