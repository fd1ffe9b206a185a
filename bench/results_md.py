"""bench/RESULTS.md: each benchmark script owns one ``## `` section and replaces only it."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, heading: str, body: str) -> None:
    """Replace the section that starts with ``heading`` (up to the next ``## ``), or append it.

    ``body`` is the whole new section, heading included.
    """
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    if heading in text:
        start = text.index(heading)
        nxt = text.find("\n## ", start + len(heading))
        text = text[:start] + body.rstrip("\n") + "\n" + (text[nxt:] if nxt != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    path.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
