"""Every logged record of a TRL run as one JSON line, ``rlguard_metrics.jsonl`` in the output folder.

TRL writes its ``trainer_state.json`` only when it saves a checkpoint, and a run with ``report_to="none"`` leaves no
other log: ``rlguard doctor``, ``watch`` and ``report`` on the output folder would find nothing to read until the
first checkpoint, or at all. :class:`~rlguard.adapters.trl.callback.StabilityCallback` therefore appends each record
TRL logs (``{"step": global_step, **logs}``, TRL's own keys, evaluation records included) to this file from the
first process, one line per record, flushed at once; :func:`rlguard.doctor.readers.find_log` reads it first.

Its lifecycle is that of the guard's ``events.jsonl``: a run that starts afresh moves an existing file aside
(``rlguard_metrics.jsonl.<its last write, UTC>``); a resumed run keeps the records up to the step it resumes after
(those past it belong to the stretch the resumed run repeats, moved aside whole) and continues the file. A write
that fails is a warning, and training goes on.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from rlguard.guards.events import METRICS_FILE, move_aside, rewrite_aside, warn_rlguard

__all__ = ["METRICS_FILE", "MetricsFile"]


class MetricsFile:
    """The run's ``rlguard_metrics.jsonl`` (module docstring).

    Args:
        path: the file.
        resume_step: None for a run that starts afresh; else the optimizer step it resumes after.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self._fh: TextIO | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is None:
                move_aside(self.path)
            else:
                self._keep_until(resume_step)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - one handle for the run, closed below
        except OSError as err:
            self._warn(f"cannot open {self.path} ({err}): the metrics are not written to a file")
            return
        weakref.finalize(self, self._fh.close)  # a loop that never ends its training (tests, a killed run)

    def write(self, step: int, logs: Mapping[str, Any]) -> None:
        """Append one logged record of optimizer step ``step`` (the values TRL logs: numbers, kept as they are)."""
        if self._fh is None:
            return
        record = {"step": step} | {k: v for k, v in logs.items() if isinstance(v, (int, float)) and k != "step"}
        try:
            self._fh.write(json.dumps(record) + "\n")
            self._fh.flush()
        except OSError as err:
            self._warn(f"could not write step {step} to {self.path} ({err}); training goes on")

    def close(self) -> None:
        """Close the file."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None

    def _keep_until(self, step: int) -> None:
        """Keep the records of steps up to ``step``; an old file with records past it is moved aside whole first."""
        if not self.path.is_file():
            return
        kept, cut = [], False
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                    within = isinstance(record, dict) and int(record["step"]) <= step
                except (ValueError, KeyError, TypeError):
                    within = False
                if within and line.endswith("\n"):
                    kept.append(line)
                else:
                    cut = True
        if not cut:
            return  # the file is the run's record up to the resumed step: continue it
        rewrite_aside(self.path, "".join(kept).encode("utf-8"))

    @staticmethod
    def _warn(message: str) -> None:
        warn_rlguard(message)
