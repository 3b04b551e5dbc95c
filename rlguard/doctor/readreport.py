"""What a reader read and what it did not: the doctor never gives a clean bill for a log it only half read.

A :class:`ReadReport` counts the records a file holds and those that became training rows, says why the others
were dropped, counts the values that were not numbers (and nulls), values of a repeated step that a later record
replaced, and records damage: data the reader could not get at (a damaged TensorBoard record with bytes after it,
compared with the file's size). A log with damage is a partial read: without a critical finding the doctor exits
3, not 0.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


class LogInputError(ValueError):
    """A log the doctor cannot read; ``str(err)`` is one line a user can act on: the file, the line or record,
    and the fix."""


@dataclass
class ReadReport:
    """The account of one read.

    Attributes:
        records: records the file holds (JSON lines, ``log_history`` entries, CSV rows, TensorBoard records).
        rows: training rows those records gave (before rows of one step are merged).
        dropped: why -> records not read as training rows (the end-of-training summary, records whose values
            are all null or text, ...; a TRL evaluation row's eval_* metrics join its step).
        non_numeric: raw key -> values that were neither numbers nor null (text, booleans, lists).
        nulls: values that were null or empty.
        overwritten: values of a step logged twice that a later record replaced.
        bytes_read: bytes read (TensorBoard), or None.
        bytes_total: the files' size in bytes (TensorBoard), or None.
        damage: data that could not be read, each with where and how much (a partial read), a torn last line too.
        warnings: data read around with no loss to the judgement.
        step_source: where the steps came from when not the log's step column (``--row-steps``, ``--step-key``).
        run: the run judged of a file that holds several (``--run``), or None.
    """

    records: int = 0
    rows: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    non_numeric: Counter[str] = field(default_factory=Counter)
    nulls: int = 0
    overwritten: int = 0
    bytes_read: int | None = None
    bytes_total: int | None = None
    damage: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    step_source: str | None = None
    run: str | None = None

    @property
    def partial(self) -> bool:
        """Whether data of the log could not be read (damage): its judgement covers only part of the run."""
        return bool(self.damage)

    def torn(self, where: str, evidence: str = "") -> None:
        """A last record cut short (a writer stopped mid-line, or a log read while it is written): not read, so
        the read is partial (damage), not a clean bill for the whole run. ``evidence``: how the cut shows, where
        the record itself does not say (a CSV row keeps its cells)."""
        self.drop("torn last line")
        why = f": {evidence}" if evidence else ""
        self.damage.append(
            f"{where}: a torn last line{why} (the writer was stopped mid-line, or is writing it), not read; judge "
            "the log again once the line is whole"
        )

    def drop(self, why: str, n: int = 1) -> None:
        """Count ``n`` records not read as training rows, and why."""
        self.dropped[why] += n

    def number(self, key: str, value: Any) -> float | None:
        """``value`` as a float (numbers, and text that is one: ``"NaN"``, ``"inf"``, ``"0.5"``), or None: counted
        as a null, or as a non-numeric value of ``key``."""
        if value is None or (isinstance(value, str) and not value.strip()):
            self.nulls += 1
            return None
        if isinstance(value, bool):
            self.non_numeric[key] += 1
            return None
        if isinstance(value, (int, float)):
            try:
                return float(value)
            except OverflowError:  # an int beyond float's range
                return math.inf if value > 0 else -math.inf
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        self.non_numeric[key] += 1
        return None

    def lines(self) -> list[str]:
        """What was read and what was not, one line each (empty parts left out)."""
        out = [f"read {self.rows} training rows from {self.records} records"]
        if self.bytes_total is not None and self.bytes_read is not None:
            share = (
                math.floor(100 * self.bytes_read / self.bytes_total) if self.bytes_total else 100
            )  # never 100 if not
            out[0] += f"; {self.bytes_read} of {self.bytes_total} bytes ({share}%)"
        if self.run is not None:
            out.append(f"run {self.run} of the file's runs (--run)")
        if self.step_source is not None:
            out.append(f"steps: {self.step_source}")
        if self.dropped:
            out.append("not training rows: " + ", ".join(f"{n} {why}" for why, n in sorted(self.dropped.items())))
        if self.non_numeric:
            top = ", ".join(f"{k} ({n})" for k, n in self.non_numeric.most_common(5))
            more = f" and {len(self.non_numeric) - 5} more keys" if len(self.non_numeric) > 5 else ""
            out.append(f"values that are not numbers, not read: {top}{more}")
        if self.nulls:
            out.append(f"{self.nulls} null or empty values")
        if self.overwritten:
            out.append(f"{self.overwritten} values of steps logged twice, replaced by the later record")
        out += [f"damaged: {d}" for d in self.damage]
        out += [f"warning: {w}" for w in self.warnings]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "records": self.records,
            "rows": self.rows,
            "dropped": dict(self.dropped),
            "non_numeric": dict(self.non_numeric),
            "nulls": self.nulls,
            "overwritten": self.overwritten,
            "bytes_read": self.bytes_read,
            "bytes_total": self.bytes_total,
            "damage": list(self.damage),
            "warnings": list(self.warnings),
            "step_source": self.step_source,
            "run": self.run,
            "partial": self.partial,
        }
