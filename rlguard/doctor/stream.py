"""A growing JSONL log (verl's file logger, a flat metrics JSONL) read by what was appended since the last read:
:class:`JsonlFollower`, for ``rlguard watch``.

The follower keeps the file's offset and identity (device and inode): each :meth:`~JsonlFollower.poll` reads the
bytes appended since the last one, parses the complete lines among them and keeps a torn last line for the next
poll, so reading costs time per appended byte, not per byte of the log. A file shorter than the offset (truncated,
rewritten) or another file under the same name (rotated) is read again from the start, and said
(:attr:`~JsonlFollower.restarts`). Each record is read as :func:`rlguard.doctor.read_log` reads a line of a JSONL
log (the same helpers, the same account in a :class:`~rlguard.doctor.readreport.ReadReport`); :meth:`log` gives
the :class:`~rlguard.doctor.readers.MetricLog` so far, equal to what ``read_log`` gives for the file as it stands.

A last line without its newline yet (a writer mid-line) costs :meth:`~JsonlFollower.log` no copy of what was read
before it: a line that is not JSON is a torn line in that read's account only; a line that is a whole JSON object
is read into the follower as its record, once. A JSON object followed on its line by anything but JSON whitespace
is no JSON, so such a line can only end as that record or as bad input: :meth:`~JsonlFollower.poll` checks the
bytes that complete it, and anything but whitespace has the file read again from the start, and said.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from rlguard.doctor.jsonlog import NotJson, jsonl_record, jsonl_row
from rlguard.doctor.readers import MetricLog
from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.steps import Row, RunMerger, StepRule

__all__ = ["JsonlFollower"]

#: what JSON reads as whitespace between tokens (RFC 8259): a whole object followed by these is still that object
JSON_SPACE = b" \t\r"


class JsonlFollower:
    """Reads the JSONL log at ``path`` by increments (module docstring).

    Attributes:
        path: the log file.
        bytes_read: bytes read from it in all (re-reads after a truncation or a rotation included).
        restarts: one line per time the file was read again from the start, and why.
    """

    def __init__(self, path: Path, steps: StepRule | None = None, run: str | None = None) -> None:
        self.path = path
        self.step_rule, self.run = steps or StepRule(), run
        self.bytes_read = 0
        self.restarts: list[str] = []
        self._reset()
        self._identity: tuple[int, int] | None = None

    def _reset(self) -> None:
        self._offset = 0
        self._pending = b""  # the bytes after the last newline: a line being written
        self._held = 0  # bytes of `_pending` already read as a record (a whole JSON object before its newline)
        self._lines = 0  # lines complete so far (for "line N" in messages)
        self._records = 0  # JSON records read (lines that are not blank)
        self._report = ReadReport()
        # every record's row merged per step (and run) as read_log merges them, as it is read
        self._merger = RunMerger(self._report, self.step_rule, self.path, self.run)
        self._format = "jsonl"
        self._error: LogInputError | None = None
        # the last complete line, when it is not JSON: torn (the reader skips a torn last line) unless another follows
        self._suspect: tuple[str, LogInputError] | None = None

    @property
    def steps(self) -> int:
        """The distinct training steps read so far (of every run in the file)."""
        return sum(len(r.merged) for r in self._merger.runs.values())

    @property
    def records(self) -> int:
        """The records (JSON lines) parsed in all since the last start from the beginning of the file: each
        appended record is parsed once, whatever the length of the log before it."""
        return self._records

    def poll(self) -> int:
        """Read what was appended since the last poll; the number of complete lines it held. ``OSError`` when the
        file cannot be read; :class:`LogInputError` for a line that is not a JSON object (again at every poll,
        until the file is truncated or replaced)."""
        with self.path.open("rb") as fh:
            st = os.fstat(fh.fileno())
            identity = (st.st_dev, st.st_ino)
            if self._identity is not None and identity != self._identity:
                self.restarts.append(f"{self.path} was replaced by another file (rotated): read again from the start")
                self._reset()
            elif st.st_size < self._offset:
                self.restarts.append(
                    f"{self.path} is shorter ({st.st_size} bytes) than what was read ({self._offset} bytes): "
                    "truncated or rewritten, read again from the start"
                )
                self._reset()
            self._identity = identity
            if self._error is not None:
                raise self._error
            fh.seek(self._offset)
            data = fh.read()
        self._offset += len(data)
        self.bytes_read += len(data)
        if self._held and (self._pending + data)[self._held :].split(b"\n", 1)[0].strip(JSON_SPACE):
            self.restarts.append(
                f"{self.path}, line {self._lines}: the last line, read as a whole JSON object before its newline, "
                "went on with more than whitespace: read again from the start"
            )
            self._reset()
            return self.poll()
        *complete, self._pending = (self._pending + data).split(b"\n")
        if self._held and complete:  # the line read as its record ended: nothing more to read of it
            complete, self._held = complete[1:], 0
            count = 1
        else:
            count = 0
        for raw in complete:
            self._lines += 1
            if self._suspect is not None and raw.strip():
                self._error = self._suspect[1]  # a bad line with lines after it: not torn, bad input
                raise self._error
            where = f"line {self._lines}"
            try:
                record = self._record(raw, self._lines)
                if record is not None:
                    self._merge(
                        record,
                        jsonl_row(record, self._report, self.step_rule, self._records, self.path, where),
                        self._report,
                    )
            except NotJson as err:
                self._suspect = (f"line {self._lines}", LogInputError(str(err)))
            except LogInputError as err:
                self._error = err
                raise
        return count + len(complete)

    def _record(self, raw: bytes, number: int) -> dict[str, Any] | None:
        """Line ``number`` as its JSON object, None for a blank line: :class:`NotJson` for a line that is not JSON,
        LogInputError for one that is not UTF-8 or not an object. Changes nothing."""
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a byte-order mark, as read_log reads it
        except UnicodeDecodeError as err:
            raise LogInputError(
                f"{self.path}, line {number}: byte {err.start} of the line is not UTF-8 ({err.reason}); save or "
                "export the log as UTF-8"
            ) from None
        return jsonl_record(line, self.path, f"line {number}") if line.strip() else None

    def _merge(self, record: dict[str, Any], row: Row, report: ReadReport) -> None:
        """Merge ``record``'s ``row``, counted in ``report`` (the follower's, or a copy of it that becomes the
        follower's)."""
        self._report = self._merger.report = report
        if self._records == 0 and "step" in record and isinstance(record.get("data"), dict):
            self._format = "verl"
        self._merger.add(row)
        self._records += 1

    def _hold(self) -> tuple[str, LogInputError] | None:
        """The last line, without its newline yet, read as ``read_log`` reads it: a whole JSON object is read into
        the follower as its record (held: the bytes that complete the line are checked by :meth:`poll`); a line
        that is not JSON is returned as a torn line (where, why), the follower unchanged. LogInputError for a line
        that cannot be read or a record refused (the follower unchanged), or a record its run refuses (then at
        every poll, as when its line is whole)."""
        number = self._lines + 1
        try:
            record = self._record(self._pending, number)
        except NotJson as err:
            return f"line {number}", LogInputError(str(err))
        if record is None:
            return None  # blank to the reader: nothing to read
        report = copy.deepcopy(self._report)  # the account: a few counters and messages, none per record
        row = jsonl_row(record, report, self.step_rule, self._records, self.path, f"line {number}")
        self._lines, self._held = number, len(self._pending)
        try:
            self._merge(record, row, report)
        except LogInputError as err:
            self._error = err
            raise
        return None

    def log(self) -> MetricLog:
        """The log read so far, as :func:`~rlguard.doctor.read_log` reads the file as it stands: a torn last line
        (bytes after the last newline) skipped with a warning. :class:`LogInputError` when it holds no step. Its
        cost does not grow with the log (module docstring): the table is a snapshot
        (:meth:`~rlguard.doctor.columns.Columns.copy`)."""
        suspect = self._suspect
        if self._pending.strip() and not self._held:  # a last line without its newline yet
            if suspect is not None:
                raise suspect[1]
            suspect = self._hold()
        report = copy.deepcopy(self._report)
        report.records = self._records
        if suspect is not None:
            report.records += 1
            report.torn(suspect[0])
        if not report.records:
            raise LogInputError(f"{self.path} is empty")
        rows = self._merger.finish(report).copy()  # the follower goes on appending to its own table
        if not rows:
            lines = "; ".join(report.lines())
            raise LogInputError(f"{self.path} ({self._format}) holds no training step with a numeric metric ({lines})")
        return MetricLog(self._format, self.path, rows, report)
