"""The README's code blocks, each classified as one quick start (or an install, a make or a benchmark line), for
the tests that run them as written (tests/project/test_readme.py, integration_tests/test_readme_verl.py)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, its text and what it is."""

    lang: str
    code: str
    kind: str  # "trl", "verl", "log", "install", "make", "benchmark"


def _kind(lang: str, code: str) -> str:
    if lang == "python" and "GuardedGRPOTrainer" in code:
        return "trl"
    if "rlguard.adapters.verl.main_ppo" in code:
        return "verl"
    if code.lstrip().startswith(("rlguard doctor", "rlguard watch")):
        return "log"
    if all(line.startswith("pip install") for line in _lines(code)):
        return "install"
    if all(line.startswith("make ") for line in _lines(code)):
        return "make"
    if all(line.startswith("python benchmarks/") for line in _lines(code)):
        return "benchmark"
    raise AssertionError(f"a README code block no test runs ({lang}):\n{code}")


def _lines(code: str) -> list[str]:
    """Commands of a shell block, comments and continuations joined."""
    joined = code.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


def readme_blocks() -> list[Block]:
    """Every fenced code block of the README, classified (an unknown one raises)."""
    text = README.read_text(encoding="utf-8")
    return [Block(lang, code, _kind(lang, code)) for lang, code in _FENCE.findall(text)]


def block(kind: str) -> Block:
    """The one block of ``kind``."""
    (found,) = [b for b in readme_blocks() if b.kind == kind]
    return found


def commands(b: Block, fill: dict[str, list[str]] | None = None) -> list[list[str]]:
    """The shell commands of ``b``, split as a shell splits words; a ``<placeholder>`` becomes ``fill[placeholder]``
    (a missing one raises)."""
    out = []
    for line in _lines(b.code):
        words: list[str] = []
        for i, part in enumerate(re.split(r"<([^<>]+)>", line)):
            words += (fill or {})[part] if i % 2 else shlex.split(part)
        out.append(words)
    return out
