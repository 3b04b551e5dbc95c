"""The docs site's pages as the tests that run their examples read them: a section under a heading, its code
blocks by language."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DOCS", "code_blocks", "section"]

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section(page: str, heading: str) -> str:
    """The text of ``page`` from the line ``heading`` to the next heading of any level (outside code blocks)."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines(keepends=True)
    start = lines.index(heading + "\n")
    fenced = False
    for end in range(start + 1, len(lines)):
        fenced ^= lines[end].startswith("```")
        if not fenced and re.match(r"#{1,6} ", lines[end]):
            break
    else:
        end = len(lines)
    return "".join(lines[start:end])


def code_blocks(text: str, lang: str) -> list[str]:
    """The code blocks of ``text`` fenced as ``lang``, in order."""
    return [str(b) for b in re.findall(rf"^```{lang}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]
