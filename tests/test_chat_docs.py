"""docs/client.md's AI SDK code is the chat example's code (examples/chat), word for word.

Each fenced block preceded by an `<!-- examples/chat/<file> -->` comment must appear in
that file as it is (the block's own indentation removed), so the docs cannot drift from
the app that tests/system/test_chat_app.py drives in Chromium.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLIENT_DOC = ROOT / "docs" / "client.md"
BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)<!-- (?P<file>examples/chat/[\w./-]+) -->\n"
    r"(?P=indent)```\w*\n(?P<code>.*?)^(?P=indent)```$",
    re.MULTILINE | re.DOTALL,
)


def _blocks() -> list[tuple[str, str]]:
    return [(m["file"], textwrap.dedent(m["code"])) for m in BLOCK.finditer(CLIENT_DOC.read_text())]


def test_the_doc_quotes_the_app() -> None:
    quoted = {file for file, _ in _blocks()}
    assert quoted >= {"examples/chat/src/App.jsx", "examples/chat/server.mjs"}, quoted


@pytest.mark.parametrize(("file", "code"), _blocks())
def test_each_quoted_block_is_in_its_file(file: str, code: str) -> None:
    source = (ROOT / file).read_text()
    # A block quoted from inside a function keeps that function's indentation.
    assert any(textwrap.indent(code, " " * depth) in source for depth in range(0, 9, 2)), (
        f"docs/client.md quotes {file}, but this block is not in it:\n{code}"
    )
