"""``rlguard --help`` and each command's: no RST or Markdown markup, and no paragraph broken mid-sentence (rich keeps
a docstring's line breaks; :func:`rlguard.cli.app.help_text` unwraps them)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.cli.app import help_text

WIDTH = 100
COMMANDS = [[], ["doctor"], ["watch"], ["report"], ["losses"], ["detectors"], ["demo"], ["bench"]]


def _description(output: str) -> list[list[str]]:
    """The paragraphs between the usage line and the first panel, each as its lines."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:end]:
        if line.strip():
            paragraphs[-1].append(line.rstrip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "rlguard")
def test_help_shows_no_markup_and_no_paragraph_broken_mid_sentence(command: list[str]) -> None:
    out = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)})
    assert out.exit_code == 0, out.output
    for markup in ("``", ":mod:", ":func:", ":class:", "`"):
        assert markup not in out.output, (markup, out.output)
    for paragraph in _description(out.output):
        # every line of a paragraph but its last is filled to the width, less the next word (rich wraps by word)
        short = [line for line in paragraph[:-1] if len(line) < WIDTH - 25]
        assert not short, "\n".join(paragraph)


def test_help_text_unwraps_paragraphs_and_quotes_code() -> None:
    doc = """First line, wrapped
    here.

    Then ``stable`` and `rlguard report` and :mod:`rlguard.doctor`,
    across lines."""
    assert help_text(doc) == (
        "First line, wrapped here.\n\nThen 'stable' and 'rlguard report' and 'rlguard.doctor', across lines."
    )
