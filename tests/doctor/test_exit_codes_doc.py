"""The exit-code tables of the docs are the command line's: each row names its code's constant (``EXIT_OK``...),
the constants are the codes, and ``rlguard doctor``, ``watch --once`` and ``report``, run as a user runs them, give
each code for the case its row names, so a CI script that reads the docs can trust them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rlguard.doctor as doctor
from tests.helpers.logs_extra import csv_text, jsonl_text, rows

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\d) \(`(EXIT_[A-Z_]+)`\) \|", re.M)


@pytest.mark.parametrize("doc", ["docs/guides/doctor.md", "docs/cli.md"])
def test_the_exit_code_table_is_the_cli_s_constants(doc: str) -> None:
    rows = ROW.findall((ROOT / doc).read_text(encoding="utf-8"))
    assert [int(code) for code, _ in rows] == [0, 1, 2, 3, 4], rows
    for code, name in rows:
        assert getattr(doctor, name) == int(code), (doc, code, name)
    assert {name for _, name in rows} == {n for n in doctor.__all__ if n.startswith("EXIT_")}


def test_the_command_line_s_own_internal_error_code_is_the_doctor_s() -> None:
    import rlguard.cli as cli

    assert cli.EXIT_INTERNAL == doctor.EXIT_INTERNAL


# -- the tables against the command line itself: each code, produced by the case its row names -----------------
def _inputs(folder: Path) -> dict[int, list[str]]:
    """For each exit code, the arguments after the command that give it (``{log}`` etc. filled in by the test)."""
    healthy, critical, ragged = folder / "healthy.jsonl", folder / "nan.jsonl", folder / "ragged.csv"
    healthy.write_text(jsonl_text(rows(200)), encoding="utf-8")
    critical.write_text(jsonl_text(rows(200, nan_at=150)), encoding="utf-8")
    lines = csv_text(rows(200)).splitlines()
    lines[20] += ",0.5"  # a row of more cells than the header: not read, so the read is partial
    ragged.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        0: [str(healthy)],
        1: [str(critical)],
        2: [str(folder / "missing.jsonl")],
        3: [str(ragged)],
        4: [str(healthy)],  # with the doctor's functions broken (a bug): _BROKEN
    }


#: the console script with the functions the commands call made to raise, as a bug in rlguard would
_BROKEN = (
    "import sys, rlguard.doctor as d, rlguard.watch as w\n"
    "def boom(*a, **k): raise RuntimeError('boom')\n"
    "d.diagnose = d.write_report = w.watch = boom\n"
    "from rlguard.cli import main\n"
    "sys.argv = ['rlguard', *sys.argv[1:]]\n"
    "main()\n"
)
#: the codes each command gives (report judges nothing: it writes or refuses)
COMMANDS = {"doctor": [0, 1, 2, 3, 4], "watch": [0, 1, 2, 3, 4], "report": [0, 2, 4]}


def _run(command: str, code: int, args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    extra = {"watch": ["--once"], "report": ["--out", str(out)]}.get(command, [])
    program = ["-c", _BROKEN] if code == 4 else ["-m", "rlguard"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, *program, command, *args, *extra], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(("command", "code"), [(c, k) for c, codes in COMMANDS.items() for k in codes])
def test_each_documented_exit_code_is_what_the_command_line_returns(tmp_path: Path, command: str, code: int) -> None:
    documented = {int(c) for c, _ in ROW.findall((ROOT / "docs/guides/doctor.md").read_text(encoding="utf-8"))}
    assert set(_inputs(tmp_path)) == documented  # a new row of the table needs its case here
    result = _run(command, code, _inputs(tmp_path)[code], tmp_path / "report")
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    if code == 4 or (code == 2 and command != "watch"):  # one line on stderr (the watch says why on its display)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_watch_guide_names_the_same_codes() -> None:
    """The watch guide says its codes in a sentence: 0 no critical finding, 1 a critical finding, ... 4."""
    text = " ".join((ROOT / "docs/guides/watch.md").read_text(encoding="utf-8").split())
    said = re.search(r"exits with the doctor's code for the log at that moment: (.+?)\. The last line", text)
    assert said is not None
    assert [int(c) for c in re.findall(r"(?:^|, )(\d) ", said.group(1))] == sorted(COMMANDS["watch"])
