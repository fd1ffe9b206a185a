"""The fenced code blocks of README.md and the docs pages, each with a name.

A block opens with ```` ```LANG NAME ```` (GitHub shows LANG and ignores the rest of the
line), and the tests that run the blocks look them up by page and name:
``block("docs/cli.md", "check-rules-output")``. ``named_blocks(page)`` lists every block
of a page, so a test can insist that each one has a name and a test that runs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```([\w-]*)[ \t]*([\w.-]*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced block: its page (relative to the repository root), language, name, text
    and the line its fence opens on."""

    page: str
    lang: str
    name: str
    text: str
    line: int


def named_blocks(page: str) -> list[Block]:
    """Every fenced block of ``page`` (a path relative to the repository root), in order."""
    text = (ROOT / page).read_text()
    return [Block(page, m[1], m[2], m[3], text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def block(page: str, name: str) -> Block:
    """The block called ``name`` on ``page``; a missing or repeated name is an error."""
    found = [b for b in named_blocks(page) if b.name == name]
    if len(found) != 1:
        raise LookupError(f"{page}: {len(found)} blocks named {name!r}")
    return found[0]


def run_python(b: Block, namespace: dict | None = None) -> dict:
    """Execute a python block as written, in ``namespace`` (a new one by default); returns
    the namespace. Its code objects carry the page's path and lines, so a traceback (or an
    error naming the user's source line) shows the line of the page."""
    namespace = {} if namespace is None else namespace
    code = compile("\n" * b.line + b.text, str(ROOT / b.page), "exec")
    exec(code, namespace)  # noqa: S102 - the documentation's own example
    return namespace
