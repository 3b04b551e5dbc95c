"""What detectors find and what the guard records; ``events.jsonl``, written (:class:`EventsLog`) and read back
(:func:`read_events`).

An :class:`Event` is validated when it is built (the guard cannot write a malformed one) and when it is read
(:meth:`Event.from_dict`, :func:`read_events`): types are checked, severities are read case-insensitively, fields
this version does not know are kept (``extra``) and written back, and a torn last line (a process killed while
writing) is skipped with a warning.

The file's lifecycle (:class:`EventsLog`): a run that starts afresh moves an existing file aside, as
``events.jsonl.<its last write, UTC>``, and starts an empty one, so that a second run in the same folder shows its
own events only; a resumed run continues the file from the step it resumes after. One handle stays open; each event
is one ``write`` of its whole line, unbuffered, and each step's events are ``fsync``-ed (events are rare, a change
of alarm level or an action, so that is a few ``fsync`` calls per run): a killed process loses at most the line
being written, which the reader skips, and a machine that crashes keeps the events of every finished step. A write
that fails (a full disk) is a warning, and training goes on: the events stay in the guard's state
(``Guard.events``, saved with each checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

Severity = Literal["warn", "critical"]
SEVERITY_LEVEL: dict[str, int] = {"warn": 1, "critical": 2}
#: the guard's events, next to the run's logs
EVENTS_FILE = "events.jsonl"
#: every logged record of a TRL run, written beside them by rlguard's callback (rlguard.adapters.trl.metrics_file)
METRICS_FILE = "rlguard_metrics.jsonl"
_FIELDS = ("step", "detector", "severity", "value", "message", "threshold")


class EventsFileError(ValueError):
    """An ``events.jsonl`` line that is not a valid event; ``str(err)`` names the file, the line and the fix."""


@dataclass(frozen=True)
class Finding:
    """One detector's verdict on one step.

    Attributes:
        severity: ``"warn"`` or ``"critical"``: how urgently the live guard must act on this step.
        value: the statistic it judged (e.g. the gradient norm, or its ratio to the baseline).
        threshold: the bound ``value`` crossed.
        message: what it saw, against which threshold, and what to do.
        unrecoverable: a state training cannot come back from by itself (non-finite values, one-token
            completions): critical whatever follows.
        absolute: the value is beyond an absolute bound of the detector, one that needs no baseline (KL above 2 nats):
            a drift that comes with a rising reward is exempt from criticality only below such a bound.
        observed: the detector's own severity where the live consequence rule (``GuardConfig.consequence =
            "online"``, :mod:`rlguard.guards.consequence.live`) labelled the finding otherwise, None where it did not:
            what acts on the step itself (``skip_step``) reads it, since a lone spike is a warning by consequence and
            still a poisoned step.
    """

    severity: Severity
    value: float
    threshold: float
    message: str
    unrecoverable: bool = False
    observed: Severity | None = None
    absolute: bool = False


def _severity(value: Any) -> Severity:
    """``value`` as a severity, case-insensitively; ValueError naming it otherwise."""
    name = value.strip().lower() if isinstance(value, str) else None
    if name not in SEVERITY_LEVEL:
        raise ValueError(f"severity {value!r} is not one of {sorted(SEVERITY_LEVEL)} (any case)")
    return "critical" if name == "critical" else "warn"


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars are Real too
        raise TypeError(f"{name} must be a number; got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:  # an integer beyond a float's range: not a value the guard wrote
        raise ValueError(f"{name} must be a number within a float's range (+-1.8e308); got a larger integer") from None


@dataclass(frozen=True)
class Event:
    """A finding that changed a detector's alarm level, as recorded in ``Guard.events`` and ``events.jsonl``.

    Attributes:
        step: the optimizer step (an int >= 0).
        detector: the detector's name, or ``action:<name>`` for an intervention.
        severity: ``"warn"`` or ``"critical"``.
        value: the statistic judged (NaN and Inf allowed: they are evidence).
        message: evidence, threshold and suggested fix.
        threshold: the bound crossed, or None.
        extra: fields of a record written by another version, kept as read and written back by :meth:`to_dict`.
    """

    step: int
    detector: str
    severity: Severity
    value: float
    message: str
    threshold: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, numbers.Integral) or self.step < 0:
            raise TypeError(f"Event.step must be an int >= 0; got {type(self.step).__name__} {self.step!r}")
        if not isinstance(self.step, int):
            object.__setattr__(self, "step", int(self.step))  # a numpy integer
        for name in ("detector", "message"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Event.{name} must be a string; got {type(getattr(self, name)).__name__}")
        if self.severity not in SEVERITY_LEVEL:
            raise ValueError(f"Event.severity must be one of {sorted(SEVERITY_LEVEL)}; got {self.severity!r}")
        if not isinstance(self.value, float):
            object.__setattr__(self, "value", _real("Event.value", self.value))
        if self.threshold is not None and not isinstance(self.threshold, float):
            object.__setattr__(self, "threshold", _real("Event.threshold", self.threshold))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the fields, then ``extra``'s."""
        known = {name: getattr(self, name) for name in _FIELDS}
        return {**known, **{k: v for k, v in self.extra.items() if k not in known}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """Inverse of :meth:`to_dict`, validating: ``step`` a whole number >= 0, ``detector`` and ``message``
        strings, ``severity`` one of ``warn``/``critical`` in any case, ``value`` a number, ``threshold`` a number
        or null. Unknown fields go to ``extra``. TypeError or ValueError naming the field otherwise."""
        if not isinstance(data, Mapping):
            raise TypeError(f"an event must be a JSON object; got {type(data).__name__}")
        missing = [k for k in ("step", "detector", "severity", "value") if k not in data]
        if missing:
            raise ValueError(f"missing field(s) {missing}; an event has {list(_FIELDS)}")
        step = data["step"]
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TypeError(f"step must be a whole number >= 0; got {step!r}")
        threshold = data.get("threshold")
        return cls(
            step=step,
            detector=_string("detector", data["detector"]),
            severity=_severity(data["severity"]),
            value=_real("value", data["value"]),
            message=_string("message", data.get("message", "")),
            threshold=None if threshold is None else _real("threshold", threshold),
            extra={k: v for k, v in data.items() if k not in _FIELDS},
        )


def _string(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string; got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class EventsRead:
    """What :func:`read_events` read.

    Attributes:
        events: the valid events, in file order.
        warnings: what was skipped and why (a torn last line).
    """

    events: list[Event]
    warnings: list[str]


def parse_events(lines: list[str], source: str = "events.jsonl") -> EventsRead:
    """Events from the lines of an ``events.jsonl``: one :meth:`Event.to_dict` per line, blank lines ignored. A
    last line that is not JSON is a torn write and is skipped with a warning; any other bad line raises
    :class:`EventsFileError` naming ``source`` and the line."""
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    events: list[Event] = []
    warnings: list[str] = []
    for n, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line, parse_constant=_json_constant)
        except (ValueError, RecursionError) as err:
            if not isinstance(err, (json.JSONDecodeError, RecursionError)):  # an integer of too many digits
                raise EventsFileError(
                    f"{source}, line {number}: an integer of more digits than can be read (4300), not a value the "
                    "guard writes; fix or delete the line"
                ) from None
            if n == len(numbered) - 1:
                warnings.append(f"{source}, line {number}: a torn last line (the writer was stopped mid-line), skipped")
                continue
            why = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deeply"
            raise EventsFileError(
                f"{source}, line {number}: not JSON ({why}); each line must be one event object as the guard writes"
                " it (fix or delete the line)"
            ) from None
        try:
            events.append(Event.from_dict(record))
        except (TypeError, ValueError) as err:
            raise EventsFileError(
                f"{source}, line {number}: not a guard event ({err}); fix or delete the line"
            ) from None
    return EventsRead(events, warnings)


def _json_constant(name: str) -> float:
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def read_events(path: str | Path) -> EventsRead:
    """The events of the ``events.jsonl`` at ``path`` (:func:`parse_events`); :class:`EventsFileError` for a file
    that cannot be read as UTF-8 text."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise EventsFileError(
            f"{path}, line {line}: byte {err.start} is not UTF-8; events.jsonl is UTF-8 JSON lines (re-write it, "
            "or delete the line)"
        ) from None
    except OSError as err:
        raise EventsFileError(f"{path}: cannot be read ({err.strerror})") from None
    return parse_events(text.splitlines(keepends=True), str(path))


def event_line(event: Event) -> bytes:
    """``event`` as one line of ``events.jsonl`` (UTF-8 JSON and a newline)."""
    return (json.dumps(event.to_dict()) + "\n").encode("utf-8")


def move_aside(path: Path) -> Path | None:
    """Move an existing, non-empty file to ``<name>.<its last write, UTC>`` (never over another); where it went,
    or None when there was nothing to move."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(path.stat().st_mtime))
    target, n = path.with_name(f"{path.name}.{stamp}"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{stamp}-{n}")
    os.replace(path, target)
    return target


def rewrite_aside(path: Path, content: bytes) -> Path | None:
    """Move ``path`` aside (:func:`move_aside`) and write ``content`` in its place, atomically; where it went."""
    moved = move_aside(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(content)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return moved


class EventsLog:
    """The guard's ``events.jsonl`` (module docstring: a fresh run moves an old file aside, a resume continues it).

    Args:
        path: the file.
        resume_step: None for a run that starts afresh; else the step the run resumes after. The file then keeps
            its events up to that step (``history`` instead, where given) and continues; events past it (a killed
            stretch the resumed run repeats) or a damaged file are first moved aside whole, so nothing is lost.
        history: the events the resumed guard's state holds (the checkpoint's record), or None without state.

    Attributes:
        moved_to: where an existing file was moved, or None.
        failed: events that could not be written (each failure warned about).
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None, history: Sequence[Event] | None = None):
        self.path = Path(path)
        self.moved_to: Path | None = None
        self.failed = 0
        self._fh: BinaryIO | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is None:
                self._move_aside()
            else:
                self._resume(resume_step, history)
            self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - one handle for the run, closed below
        except OSError as err:
            self._warn(f"cannot open {self.path} ({err}): events are not written to a file")
            return
        weakref.finalize(self, self._fh.close)

    def write(self, events: Sequence[Event]) -> None:
        """Append ``events`` (one step's), each line in one ``write``, then ``fsync``; an ``OSError`` is a warning,
        and a line the error cut short is taken back off the file."""
        if not events:
            return
        if self._fh is None:
            self.failed += len(events)
            return
        fd, end = self._fh.fileno(), None
        try:
            end = os.fstat(fd).st_size
            for event in events:
                line = event_line(event)
                written = self._fh.write(line) or 0
                while written < len(line):  # a short write (rare on a local file): the rest of the line
                    written += self._fh.write(line[written:]) or 0
                end += len(line)
            os.fsync(fd)
        except OSError as err:
            self.failed += len(events)
            if end is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, end)  # no torn line in the middle of the file
            self._warn(
                f"could not write {len(events)} event(s) of step {events[0].step} to {self.path} ({err}); training "
                "goes on, and the events stay in the guard's state (Guard.events, saved with each checkpoint)"
            )

    def close(self) -> None:
        """Close the file (also done when the log is collected)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _move_aside(self) -> None:
        self.moved_to = move_aside(self.path)

    def _resume(self, step: int, history: Sequence[Event] | None) -> None:
        old: list[Event] | None = []
        damaged = False
        if self.path.is_file():
            try:
                read = read_events(self.path)
                old, damaged = read.events, bool(read.warnings)
            except EventsFileError:
                old, damaged = None, True
        keep = list(history) if history is not None else [e for e in old or [] if e.step <= step]
        if not damaged and old is not None and [event_line(e) for e in old] == [event_line(e) for e in keep]:
            return  # the file is the run's record up to the resumed step: continue it
        self.moved_to = rewrite_aside(self.path, b"".join(event_line(e) for e in keep))

    @staticmethod
    def _warn(message: str) -> None:
        warn_rlguard(message)


def warn_rlguard(message: str) -> None:
    """A file of the run could not be written or opened: a warning, and training goes on."""
    warnings.warn(f"rlguard: {message}", RuntimeWarning, stacklevel=4)
