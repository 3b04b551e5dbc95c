"""Text read from a file cannot take over the terminal: control characters in metric names, event messages and
file names reach ``rlguard doctor`` and ``rlguard watch`` as visible escapes (``rlguard.terminal.safe_text``)."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.terminal import safe_text
from rlguard.watch import watch
from tests.helpers.synthetic import healthy_stream

CLEAR = "\x1b[2J"
OSC8 = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
HOSTILE = [CLEAR, OSC8, "\r", "\x07", "\x08", "\x9b2J", "\u202e", "\x00", "\x7f"]


@pytest.mark.parametrize("raw", HOSTILE)
def test_safe_text_writes_every_control_character_visibly(raw: str) -> None:
    shown = safe_text(f"a{raw}b")
    assert shown.startswith("a") and shown.endswith("b")
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in shown), repr(shown)
    assert "\\x" in shown or "\\u" in shown


def test_safe_text_escapes_rich_markup_and_keeps_plain_text() -> None:
    assert safe_text("[bold red]x[/]") == "\\[bold red]x\\[/]"
    assert safe_text("[bold]x", markup=False) == "[bold]x"
    assert safe_text("plain: grad_norm=1.5, é, 日本") == "plain: grad_norm=1.5, é, 日本"


def _hostile_run(folder: Path) -> Path:
    """A healthy flat JSONL with a hostile metric name, and an events.jsonl with hostile messages."""
    folder.mkdir()
    rows = [{"step": s, **stats, f"x{CLEAR}{OSC8}": 1.0} for s, stats in enumerate(healthy_stream(60, 0), 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    event = {"step": 30, "detector": f"grad{CLEAR}", "severity": "warn", "value": 1.0, "message": f"hi\r{OSC8}"}
    (folder / "events.jsonl").write_text(json.dumps(event) + "\n")
    return folder


def _healthy_jsonl(path: Path) -> Path:
    lines = [json.dumps({"step": s, **stats}) + "\n" for s, stats in enumerate(healthy_stream(30, 0), 1)]
    path.write_text("".join(lines))
    return path


def _no_control(out: str) -> None:
    assert "\x1b" not in out and "\r" not in out and "\x9b" not in out, repr(out)
    assert "\\x1b[2J" in out  # shown, not obeyed


def test_doctor_shows_hostile_names_and_messages_escaped(tmp_path: Path) -> None:
    run = _hostile_run(tmp_path / "run")
    result = CliRunner().invoke(app, ["doctor", str(run)])
    assert result.exit_code in (0, 1, 3), result.output
    _no_control(result.output)


def test_watch_shows_hostile_names_and_file_names_escaped(tmp_path: Path) -> None:
    run = _hostile_run(tmp_path / f"run{CLEAR}")
    buffer = io.StringIO()
    # a terminal without colour: rich itself writes no escape, so any escape in the output came from the files
    console = Console(file=buffer, force_terminal=False, width=200, color_system=None)
    watch(run, console=console, once=True)
    _no_control(buffer.getvalue())
    assert "run\\x1b[2J" in buffer.getvalue()


@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "{bad}"],
        ["watch", "--once", "{bad}"],
        ["report", "{bad}"],
        ["doctor", "{good}", "--map", f"no{CLEAR}key=entropy"],
        ["doctor", "{good}", "--step-key", f"it{OSC8}"],
        ["doctor", "{good}", "--run", f"r{CLEAR}"],
        ["doctor", "{runs}"],
    ],
    ids=["doctor-file-name", "watch-file-name", "report-file-name", "map", "step-key", "run", "run-names"],
)
def test_bad_input_messages_reach_a_terminal_escaped(tmp_path: Path, args: list[str]) -> None:
    """The one line of a refusal quotes file names, keys and run names read from the log: on a terminal (click
    strips nothing there, and never strips an OSC-8 link) each control character is shown, not obeyed."""
    bad = tmp_path / f"log{CLEAR}{OSC8.replace('/', '')}.jsonl"
    bad.write_text("not json\n{}\n")
    good = _healthy_jsonl(tmp_path / f"good{CLEAR}.jsonl")
    runs = tmp_path / "runs.csv"
    runs.write_text("step,loss,run\n" + "".join(f"{s},0.1,{name}\n" for name in (f"a{CLEAR}", "b\x07") for s in (1, 2)))
    named = [a.format(bad=bad, good=good, runs=runs) for a in args]
    result = CliRunner().invoke(app, named, color=True)  # as on a terminal: click strips no escape sequence
    assert result.exit_code == 2, result.output
    said = result.stderr.strip() if args[0] != "watch" else result.stdout  # the watch says it on its console
    assert "\x1b" not in said and "\x07" not in said, repr(said)
    assert "\\x1b" in said or "\\x07" in said, said
    assert args[0] == "watch" or "\n" not in said


def test_a_report_folder_on_a_full_disk_is_named_in_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails on a full disk raises an OSError without a file name: the refusal still names the
    folder."""
    log = _healthy_jsonl(tmp_path / "log.jsonl")

    def full(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    monkeypatch.setattr(Path, "write_bytes", full)
    result = CliRunner().invoke(app, ["report", str(log), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'out'}: cannot write the report there (No space left on device)" in result.stderr
    assert "Traceback" not in result.output
