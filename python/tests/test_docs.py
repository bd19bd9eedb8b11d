"""The Python examples in README.md and docs/*.md run as written."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks():
    for doc in DOCS:
        for i, m in enumerate(re.finditer(r"```python\n(.*?)```", doc.read_text(), re.S)):
            yield pytest.param(m.group(1), id=f"{doc.name}-{i}")


@pytest.mark.parametrize("code", list(blocks()))
def test_doc_example_runs(code):
    exec(compile(code, "<doc>", "exec"), {"__name__": "__main__"})


def test_there_are_examples():
    assert len(list(blocks())) >= 2
