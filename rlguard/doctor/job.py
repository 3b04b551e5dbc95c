"""Whether the training job behind a watched log is over (:func:`job_ended`): the guard halted it, TRL wrote its
end of training, or its process exited."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlguard.doctor.diagnose import Diagnosis
from rlguard.doctor.readers import trainer_state
from rlguard.guards.events import METRICS_FILE

__all__ = ["job_ended"]


def job_ended(d: Diagnosis | None, pid: int | None) -> str | None:
    """Why the job is over, from what its files and ``pid`` say, or None while it runs."""
    if d is not None:
        if any(e.detector == "action:halt" for e in d.live_events):
            return "the guard halted the run"
        # TRL's state says when training ended; beside rlguard's metrics file, the run folder's latest state does
        state = d.log.path if d.log.format == "trl" else None
        if d.log.path.name == METRICS_FILE and not d.log.streamed:
            state = trainer_state(d.log.path.parent)
        finished = None if state is None else _trl_finished(state)
        if finished is not None:
            return finished
    if pid is not None and not _alive(pid):
        return _exited(pid)
    return None


def _exited(pid: int) -> str:
    """How process ``pid``, gone, ended: its exit code where the watch is its parent (and reaps it), else that the
    code is not known here (only a parent can read it), so that it is never taken for the watch's own."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        return f"process {pid} exited (its exit status is unknown: the watch is not its parent)"
    if reaped != pid:
        return f"process {pid} exited"
    return f"process {pid} exited with exit code {os.waitstatus_to_exitcode(status)}"


def _trl_finished(path: Path) -> str | None:
    """How TRL's ``trainer_state.json`` says training ended: the summary ``Trainer.train`` logs at its end, or the
    checkpoint transformers saves at the last step (``global_step`` reached ``max_steps``); None while it runs."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        history = state.get("log_history") or []
        step, last = int(state.get("global_step") or 0), int(state.get("max_steps") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if history and isinstance(history[-1], dict) and "train_runtime" in history[-1]:
        return "TRL wrote its end-of-training summary"
    if 0 < last <= step:
        return f"TRL saved its last checkpoint (step {step} of {last})"
    return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and, where ``/proc`` tells, has not exited unreaped (a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
