"""A growing JSONL log (verl's file logger, a flat metrics JSONL) read by what was appended since the last read:
:class:`JsonlFollower`, for ``rlguard watch``.

The follower keeps the file's offset and identity (device and inode): each :meth:`~JsonlFollower.poll` reads the
bytes appended since the last one, parses the complete lines among them and keeps a torn last line for the next
poll, so reading costs time per appended byte, not per byte of the log. A file shorter than the offset (truncated,
rewritten) or another file under the same name (rotated) is read again from the start, and said
(:attr:`~JsonlFollower.restarts`). Each record is read as :func:`rlguard.doctor.read_log` reads a line of a JSONL
log (the same helpers, the same account in a :class:`~rlguard.doctor.readreport.ReadReport`); :meth:`log` gives
the :class:`~rlguard.doctor.readers.MetricLog` so far, equal to what ``read_log`` gives for the file as it stands.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from rlguard.doctor.jsonlog import NotJson, jsonl_record, jsonl_row
from rlguard.doctor.readers import MetricLog
from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.steps import RunMerger, StepRule

__all__ = ["JsonlFollower"]


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
        *complete, self._pending = (self._pending + data).split(b"\n")
        for raw in complete:
            self._lines += 1
            if self._suspect is not None and raw.strip():
                self._error = self._suspect[1]  # a bad line with lines after it: not torn, bad input
                raise self._error
            try:
                self._line(raw, f"line {self._lines}")
            except NotJson as err:
                self._suspect = (f"line {self._lines}", LogInputError(str(err)))
            except LogInputError as err:
                self._error = err
                raise
        return len(complete)

    def _line(self, raw: bytes, where: str) -> None:
        try:
            line = raw.decode("utf-8-sig" if self._lines == 1 else "utf-8")  # a byte-order mark, as read_log reads it
        except UnicodeDecodeError as err:
            raise LogInputError(
                f"{self.path}, {where}: byte {err.start} of the line is not UTF-8 ({err.reason}); save or export the "
                "log as UTF-8"
            ) from None
        if not line.strip():
            return
        record = jsonl_record(line, self.path, where)
        if self._records == 0 and "step" in record and isinstance(record.get("data"), dict):
            self._format = "verl"
        self._merger.add(jsonl_row(record, self._report, self.step_rule, self._records, self.path, where))
        self._records += 1

    def log(self) -> MetricLog:
        """The log read so far, as :func:`~rlguard.doctor.read_log` reads the file as it stands: a torn last line
        (bytes after the last newline) skipped with a warning. :class:`LogInputError` when it holds no step."""
        now = self
        if self._pending.strip():  # a last line without its newline yet: read as the reader reads it
            now = copy.deepcopy(self)
            now._pending = b""
            now._lines += 1
            if now._suspect is not None:
                raise now._suspect[1]
            try:
                now._line(self._pending, f"line {now._lines}")
            except NotJson as err:
                now._suspect = (f"line {now._lines}", LogInputError(str(err)))
        report = copy.deepcopy(now._report)
        report.records = now._records
        if now._suspect is not None:
            report.records += 1
            report.torn(now._suspect[0])
        if not report.records:
            raise LogInputError(f"{self.path} is empty")
        rows = now._merger.finish(report).copy()  # the follower goes on appending to its own table
        if not rows:
            lines = "; ".join(report.lines())
            raise LogInputError(f"{self.path} ({now._format}) holds no training step with a numeric metric ({lines})")
        return MetricLog(now._format, self.path, rows, report)
