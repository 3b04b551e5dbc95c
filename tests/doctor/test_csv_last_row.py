"""A CSV row cut inside its last cell keeps the header's number of cells: the file's end is the only evidence
(``rlguard.doctor.csvlog``). A fixed-format column cut short, or a file that grew while it was read, is a torn row
(damage, exit 3); a last row without a newline and no such evidence is read, with a warning; a file that ends with
a newline is read as before."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import rlguard.doctor.csvlog as csvlog
from rlguard.doctor import EXIT_CANNOT_JUDGE, diagnose, read_log
from tests.helpers.logs_extra import STATS, rows


def _fixed(records: list[dict[str, float]]) -> str:
    """A CSV as a printf-style writer writes it (``%.6f`` in every cell), without a newline after its last row."""
    header = ",".join(["step", *STATS])
    body = [",".join([str(int(r["step"])), *(f"{r[k]:.6f}" for k in STATS)]) for r in records]
    return "\n".join([header, *body])


@pytest.mark.parametrize("kept", range(0, 9))
def test_a_fixed_format_last_cell_cut_at_any_byte_is_a_torn_row(tmp_path: Path, kept: int) -> None:
    text = _fixed(rows(60))
    last_cell = text[text.rfind(",") + 1 :]
    assert len(last_cell) == 9  # the length_mean column: "123.456789"-like, 3 + 1 + 6 characters minus one digit
    cut = text[: text.rfind(",") + 1 + kept] if kept < len(last_cell) else text
    path = tmp_path / "log.csv"
    path.write_text(cut, encoding="utf-8")
    log = read_log(path)
    if kept == len(last_cell):  # whole (cut at its comma, kept 0: an empty cell where the column has a format)
        assert not log.report.partial and log.rows[-1][0] == 60
        assert any("does not end with a newline" in w for w in log.report.warnings)
        return
    assert log.report.partial and log.rows[-1][0] == 59, log.report.lines()
    assert any("line 61" in d and "shorter than the column's format" in d for d in log.report.damage)
    assert diagnose(path).exit_code == EXIT_CANNOT_JUDGE


def test_a_last_row_without_a_newline_in_a_column_of_varying_length_is_read_with_a_warning(tmp_path: Path) -> None:
    """``repr`` floats vary in length: nothing in a cut cell's text says it was cut. The row is read (a real log
    may end without a newline), and the read says that its last cell may be cut."""
    header = ",".join(["step", *STATS])
    text = "\n".join([header, *(",".join([str(int(r["step"])), *(repr(r[k]) for k in STATS)]) for r in rows(60))])
    path = tmp_path / "log.csv"
    path.write_text(text, encoding="utf-8")
    log = read_log(path)
    assert not log.report.partial and log.rows[-1][0] == 60
    assert any("line 61: the last row does not end with a newline" in w for w in log.report.warnings)
    path.write_text(text + "\n", encoding="utf-8")
    assert read_log(path).report.warnings == []


def test_a_csv_that_grows_while_it_is_read_has_a_torn_last_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer appending while the doctor reads: the last row read, without its newline, may be half written."""
    text = "\n".join(["step,loss", *(f"{s},{0.1 + s / 1000!r}" for s in range(1, 41))])
    path = tmp_path / "log.csv"
    path.write_text(text, encoding="utf-8")
    asked = []  # the reader's looks at the file's size: at the open, then at the end, 7 bytes appended meanwhile
    real_fstat = os.fstat

    def fstat(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        if sys._getframe(1).f_globals.get("__name__") != csvlog.__name__:
            return st
        asked.append(fd)
        return os.stat_result((*st[:6], st.st_size + (7 if len(asked) > 1 else 0), *st[7:]))

    monkeypatch.setattr(os, "fstat", fstat)  # only the reader's own calls are changed
    log = read_log(path)
    assert len(asked) == 2
    assert log.report.partial and log.rows[-1][0] == 39
    assert any("the file grew while it was read" in d for d in log.report.damage)


def test_a_fixed_format_last_row_that_ends_with_a_newline_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    text = _fixed(rows(60))
    path.write_text(text[: text.rfind(",") + 4] + "\n", encoding="utf-8")  # a short last cell, then a newline
    log = read_log(path)
    assert not log.report.partial and log.report.warnings == [] and log.rows[-1][0] == 60
