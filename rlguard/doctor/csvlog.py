"""wandb's CSV exports read row by row: a run's history (``train/reward``, ``_step``) or a chart export of one run."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.steps import Row, StepRule, run_name

__all__ = ["read_csv"]

_WANDB_AGGREGATE = re.compile(r"__(MIN|MAX)$")
_ENCODING = "utf-8-sig"


def read_csv(path: Path, report: ReadReport, steps: StepRule) -> Iterator[Row]:
    """wandb's run-history export (``train/reward``, ``_step``) or a chart export of one run (``Step``,
    ``<run> - train/reward``, ``<run> - train/reward__MIN``); ``__MIN``/``__MAX`` columns are skipped. A chart
    export of several runs, or a column name given twice, is refused: their values would collapse onto one key. A
    row with more or fewer cells than the header is not read (its cells may have shifted columns): damage, or a
    warning for a short last row (a torn write)."""
    with path.open(encoding=_ENCODING, newline="") as fh:
        reader = csv.reader(fh)
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
            yield steps.of(row, raw, n, path, where), row, where, run_name(raw)
            n += 1
        _report_ragged(report, ragged, len(header), reader.line_num)


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
