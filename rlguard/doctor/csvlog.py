"""wandb's CSV exports read row by row: a run's history (``train/reward``, ``_step``) or a chart export of one run.

**The last row.** A row cut short inside its last cell keeps the header's number of cells, so its count cannot
show the cut; only the file's end can. A file that ends with a newline ended its last row. One that does not
(some writers never end their last line: 6 of the 19 CSVs in ``../shared``) may be whole, or cut inside its last
cell (a copy of a file being written, a writer stopped mid-row). The reader takes as evidence of a cut, and then
does not read the row (damage: exit 3, as a torn JSONL line): the file changed size while it was read (it is being
written), or the last cell's text is a proper prefix of the one shape that the same column's cells had in the
:data:`_FORMAT_ROWS` rows before it (a fixed-format writer, ``%.6f``: ``1.06`` where the column reads ``0.125000``,
``4.813125``, ``1.123175``; digits compared as digits, the integer part as one digit, the sign dropped; an empty
last cell, the row cut at its comma, is a prefix of every shape). Without
such evidence the row is read, and a warning says it may be cut. What this cannot see: a cut in a column whose
cells vary in length (``repr`` floats, integers), which leaves a number of a plausible shape; and a whole last
cell shorter than a fixed-format column's (a row written by another writer) is taken for a cut (exit 3, said)."""

from __future__ import annotations

import csv
import os
import re
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.steps import Row, StepRule, run_name

__all__ = ["read_csv"]

_WANDB_AGGREGATE = re.compile(r"__(MIN|MAX)$")
_ENCODING = "utf-8-sig"
#: rows before the last whose cells of one column, all of one shape, show a fixed-format writer (module docstring)
_FORMAT_ROWS = 3
_DIGIT = re.compile(r"\d")
_INTEGER_PART = re.compile(r"^9+")


class _Lines:
    """The lines of a file for :func:`csv.reader`, remembering whether the last one ended with a newline."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = lines
        self.ended = True

    def __iter__(self) -> Iterator[str]:
        for line in self._lines:
            self.ended = line.endswith(("\n", "\r"))
            yield line


def _shape(cell: str) -> str:
    """A number's text with its sign dropped, each digit as ``9`` and the integer part as one ``9``: ``0.125000``
    and ``-916.814636`` are both ``9.999999``, ``1.5e-05`` is ``9.9e-99``."""
    return _INTEGER_PART.sub("9", _DIGIT.sub("9", cell.strip().lstrip("+-")))


def _cut_short(cell: str, before: Iterable[str]) -> bool:
    """Whether ``cell`` (the last cell of the last row) is a proper prefix of the one shape of the cells ``before``
    it in its column (:data:`_FORMAT_ROWS` of them): a fixed-format number cut short, or cut at its comma (an empty
    cell where the column had one non-empty shape)."""
    shapes = {_shape(c) for c in before}
    if len(shapes) != 1:
        return False
    (usual,) = shapes
    return usual != _shape(cell) and usual.startswith(_shape(cell))


def read_csv(path: Path, report: ReadReport, steps: StepRule) -> Iterator[Row]:
    """wandb's run-history export (``train/reward``, ``_step``) or a chart export of one run (``Step``,
    ``<run> - train/reward``, ``<run> - train/reward__MIN``); ``__MIN``/``__MAX`` columns are skipped. A chart
    export of several runs, or a column name given twice, is refused: their values would collapse onto one key. A
    row with more or fewer cells than the header is not read (its cells may have shifted columns): damage (a short
    last row: a torn write). A last row without a newline: the module docstring."""
    with path.open(encoding=_ENCODING, newline="") as fh:
        size = os.fstat(fh.fileno()).st_size
        lines = _Lines(fh)
        reader = csv.reader(lines)
        header = next(reader, None)
        if not header:
            raise LogInputError(f"{path}: empty CSV, no header row")
        columns = [c for c in header if not _WANDB_AGGREGATE.search(c)]
        runs = sorted({c.split(" - ", 1)[0] for c in columns if " - " in c})
        if len(runs) > 1:
            shown = ", ".join(runs[:5]) + (", ..." if len(runs) > 5 else "")
            raise LogInputError(
                f"{path} is a wandb chart export of {len(runs)} runs ({shown}): their columns would collapse onto one "
                "key per stat; export one run (its run page's history), or delete the other runs' columns"
            )
        keys = [c.split(" - ", 1)[1] if " - " in c else c for c in header]
        twice = sorted({k for i, k in enumerate(keys) if k in keys[:i] and not _WANDB_AGGREGATE.search(header[i])})
        if twice:
            raise LogInputError(
                f"{path}: column(s) {', '.join(twice)} appear twice: their values would collapse onto one key; "
                "keep one column per stat"
            )
        ragged: dict[str, list[int]] = {"more": [], "fewer": []}
        pending: tuple[Row, list[str]] | None = None  # the last row read, yielded once another row follows it
        before: deque[list[str]] = deque(maxlen=_FORMAT_ROWS)  # the cells of the rows before it
        n = 0
        for cells in reader:
            if not cells:
                continue  # a blank line
            report.records += 1
            line = reader.line_num
            if len(cells) != len(header):
                ragged["more" if len(cells) > len(header) else "fewer"].append(line)
                report.drop("rows with more or fewer cells than the header")
                continue
            where = f"line {line}"
            row: dict[str, float] = {}
            raw: dict[str, Any] = {}
            for column, key, cell in zip(header, keys, cells, strict=True):
                if _WANDB_AGGREGATE.search(column):
                    continue
                raw[key] = cell if cell.strip() else None
                number = report.number(key, cell)
                if number is not None:
                    row[key] = number
            if pending is not None:
                yield pending[0]
                before.append(pending[1])
            pending = (steps.of(row, raw, n, path, where), row, where, run_name(raw)), cells
            n += 1
        if pending is not None:
            last = _last_row(
                pending, before, report, reader.line_num, lines.ended, os.fstat(fh.fileno()).st_size != size
            )
            if last is not None:
                yield last
        _report_ragged(report, ragged, len(header), reader.line_num)


def _last_row(
    pending: tuple[Row, list[str]], before: deque[list[str]], report: ReadReport, end: int, ended: bool, grew: bool
) -> Row | None:
    """The last row read, or None where the evidence says that it was cut inside its last cell (module docstring):
    not read, and damage; a warning where the file does not end with a newline and nothing says more."""
    row, cells = pending
    where = row[2]
    if where != f"line {end}" or ended:
        return row  # a row follows it (a ragged one), or its line ended: it is whole
    column = [c[-1] for c in before]
    if grew or (len(column) == _FORMAT_ROWS and _cut_short(cells[-1], column)):
        evidence = (
            "the file grew while it was read"
            if grew
            else f"its last cell {cells[-1].strip()!r} is shorter than the column's format ({column[-1].strip()!r})"
        )
        report.torn(where, f"no newline at its end, and {evidence}")
        return None
    report.warnings.append(
        f"{where}: the last row does not end with a newline: read as it is, but if the file was cut short or is "
        "still being written, its last cell may be cut (nothing in its text says so)"
    )
    return row


def _report_ragged(report: ReadReport, ragged: dict[str, list[int]], cells: int, last_line: int) -> None:
    if ragged["fewer"] and ragged["fewer"][-1] == last_line:
        report.damage.append(
            f"line {last_line}: a torn last row (fewer cells than the header: the writer was stopped mid-row, or is "
            "writing it), not read; judge the log again once the row is whole"
        )
        ragged["fewer"].pop()
    for kind, lines in ragged.items():
        if lines:
            shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
            report.damage.append(
                f"{len(lines)} rows with {kind} cells than the header's {cells} (line {shown}), not read: a cell "
                "holding the separator may have shifted their values; quote such cells, or fix the rows"
            )
