"""The guard's checkpointed state: the private state of detectors and interventions (:class:`PrivateState`), the
validation of a state read back, and its file (``rlguard_guard.json``), written atomically.

A state file is written to a temporary file beside it, ``fsync``-ed and renamed over the old one
(:func:`write_state_file`): a crash leaves the old file or the new one, never half of one. Read back
(:func:`read_state_file`, ``Guard.load_state_dict``) it is validated before anything changes: its version, known
keys only, the type of every value (a state file never sets anything on the guard but its counters and
baselines) and its range: no NaN anywhere (a NaN baseline would switch its detector off: every comparison with it
is false), no infinity in a rolling window or a list, and no integer beyond 2**53 (a count or a step that would
fail at the next ``observe``, mid-training, instead of at the resume); every error names the file and the key.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from rlguard.guards.robust import RollingWindow

__all__ = [
    "GUARD_STATE_FILE",
    "STATE_VERSION",
    "GuardStateError",
    "PrivateState",
    "long_integer_at",
    "missing_state_message",
    "read_state_file",
    "write_state_file",
]

#: the guard's state in each checkpoint folder
GUARD_STATE_FILE = "rlguard_guard.json"
#: the version of the guard's state (``Guard.state_dict()["version"]``); a file of another version is refused
STATE_VERSION = 1


class GuardStateError(ValueError):
    """A guard state that cannot be loaded; ``str(err)`` names the file, the key and what was expected."""


#: the largest integer a state holds (counts and steps; a larger one is no count, and beyond float's exact integers)
MAX_STATE_INT = 2**53


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) <= MAX_STATE_INT


def _is_real(value: Any) -> bool:
    """A number a baseline may hold: not NaN; an integer within :data:`MAX_STATE_INT`; infinities allowed (a best
    level starts at -inf)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    if isinstance(value, numbers.Integral):
        return abs(int(value)) <= MAX_STATE_INT
    return not math.isnan(value)


def _is_finite(value: Any) -> bool:
    """A number a rolling window or a list of observations may hold: finite (a detector learns finite values only)."""
    return _is_real(value) and math.isfinite(value)


def _shown(value: Any) -> str:
    """``value`` for an error message: its type and at most 80 characters (an integer of 400 digits by its length;
    ``repr`` of an int beyond 4,300 digits raises)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) > MAX_STATE_INT:
        return f"an integer of {int(value).bit_length()} bits (at most 2**53)"
    return f"{type(value).__name__} {value!r:.80}"


def state_object(value: Any, where: str, keys: tuple[str, ...] | None = None) -> Mapping[str, Any]:
    """``value`` read from a state file as a JSON object, with exactly ``keys`` (any keys when None);
    :class:`GuardStateError` naming ``where`` otherwise."""
    if not isinstance(value, Mapping):
        raise GuardStateError(f"{where}: expected a JSON object; got {type(value).__name__}")
    if keys is not None and set(value) != set(keys):
        raise GuardStateError(f"{where}: expected the keys {sorted(keys)}; got {sorted(map(str, value))}")
    return value


def state_list(value: Any, where: str) -> list[Any]:
    """``value`` read from a state file as a JSON list; :class:`GuardStateError` naming ``where`` otherwise."""
    if not isinstance(value, list):
        raise GuardStateError(f"{where}: expected a list; got {type(value).__name__}")
    return value


def state_count(value: Any, where: str, least: int = 0) -> int:
    """``value`` read from a state file as an integer ``>= least``; :class:`GuardStateError` naming ``where``
    otherwise."""
    if not _is_int(value) or value < least:
        raise GuardStateError(f"{where}: expected an integer >= {least}; got {_shown(value)}")
    return int(value)


def check_state_value(current: Any, value: Any, where: str) -> Any:
    """``value`` read for an attribute whose value is now ``current``, if of the same kind and range: a list of
    finite numbers for a rolling window or a list, a number (not NaN) for a float, an integer of at most 2**53 for
    an int, a string for a string; for an attribute now None, None or such a number or a string.
    :class:`GuardStateError` naming ``where`` (and the item of a list) otherwise."""
    if isinstance(current, (RollingWindow, list)):
        ok = isinstance(value, list) and all(_is_finite(v) for v in value)
        expected = "a list of numbers (finite)"
        if isinstance(value, list) and not ok:
            at = next(i for i, v in enumerate(value) if not _is_finite(v))
            raise GuardStateError(f"{where}: expected {expected}; item {at} is {_shown(value[at])}")
    elif isinstance(current, bool):
        ok, expected = isinstance(value, bool), "true or false"
    elif isinstance(current, numbers.Integral):
        ok, expected = _is_int(value), "an integer of at most 2**53"
    elif isinstance(current, numbers.Real):
        ok, expected = _is_real(value), "a number, not NaN"
    elif isinstance(current, str):
        ok, expected = isinstance(value, str), "a string"
    else:
        ok = value is None or isinstance(value, str) or _is_real(value)
        expected = "null, a number (not NaN) or a string"
    if not ok:
        raise GuardStateError(f"{where}: expected {expected}; got {_shown(value)}")
    return value


class PrivateState:
    """Saves every attribute named ``_s_*`` (rolling windows as lists) and lists constructor defaults.

    Subclasses are dataclasses: thresholds are fields, state is created in ``__post_init__`` as ``_s_*``.
    """

    def state_dict(self) -> dict[str, Any]:
        """Baselines and counters, JSON-ready."""
        return {
            k: (list(v.values) if isinstance(v, RollingWindow) else v)
            for k, v in vars(self).items()
            if k.startswith("_s_")
        }

    def load_state_dict(self, state: Mapping[str, Any], *, where: str = "state") -> None:
        """Restore what :meth:`state_dict` saved. Only this object's own ``_s_*`` attributes, each of the kind it
        holds now (:func:`check_state_value`); anything else raises :class:`GuardStateError` naming ``where`` and
        the key, before anything changes. A key the state lacks keeps its current value."""
        if not isinstance(state, Mapping):
            raise GuardStateError(f"{where}: expected a mapping; got {type(state).__name__}")
        own = {k: v for k, v in vars(self).items() if k.startswith("_s_")}
        unknown = sorted(str(k) for k in state if k not in own)
        if unknown:
            raise GuardStateError(f"{where}: unknown key(s) {unknown}; this {type(self).__name__} has {sorted(own)}")
        checked = {k: check_state_value(own[k], v, f"{where}.{k}") for k, v in state.items()}
        for k, v in checked.items():
            cur = own[k]
            if isinstance(cur, RollingWindow):
                setattr(self, k, RollingWindow(cur.values.maxlen or len(v), v))
            else:  # a list copied: the state it came from (another guard's, a copy's) must not share it
                setattr(self, k, list(v) if isinstance(v, list) else v)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Constructor arguments and their defaults."""
        return {f.name: f.default for f in fields(cls) if f.init}  # type: ignore[arg-type]


def write_state_file(path: str | Path, state: Mapping[str, Any]) -> None:
    """Write ``state`` as JSON to ``path`` atomically: a temporary file beside it, ``fsync``, ``os.replace``, then
    the folder ``fsync``-ed (where the system allows), so that a crash leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return  # a folder cannot be opened on this system (Windows): the rename is what it is
    try:
        os.fsync(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


def read_state_file(path: str | Path) -> Any:
    """The JSON in ``path``; :class:`GuardStateError` naming the file when it cannot be read or is not JSON (a
    truncated file, say)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise GuardStateError(f"{path}: cannot be read as the guard's state ({err})") from None
    try:
        return json.loads(text)  # NaN and Infinity, which the guard's baselines may hold, read back as floats
    except json.JSONDecodeError as err:
        raise GuardStateError(
            f"{path}: not the guard's state, not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); a "
            "file cut short by a crash? Resume from an earlier checkpoint, or delete the file to start the guard "
            "afresh (its baselines and history are then lost)"
        ) from None
    except ValueError:  # an integer of more than 4,300 digits (Python's limit on converting them)
        at = long_integer_at(text)
        where = "" if at is None else f", line {at[0]} column {at[1]}"
        raise GuardStateError(
            f"{path}{where}: not the guard's state: an integer of more digits than Python reads "
            f"({sys.get_int_max_str_digits()}), no count or baseline the guard writes; resume from an earlier "
            "checkpoint, or delete the file to start the guard afresh"
        ) from None


def long_integer_at(text: str) -> tuple[int, int] | None:
    """``(line, column)`` (from 1) of the first integer in JSON ``text`` of more digits than Python converts
    (``sys.get_int_max_str_digits()``, 4,300 by default): where ``json.loads``'s ValueError does not say; None if
    there is none."""
    limit = sys.get_int_max_str_digits()
    found = re.search(rf"(?<![\d.eE+-])-?\d{{{limit + 1},}}(?![\d.eE])", text) if limit else None
    if found is None:
        return None
    start = found.start()
    return text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)


def missing_state_message(path: str | Path, step: int) -> str:
    """What a resume without the guard's state says, and what it costs."""
    return (
        f"rlguard: resuming at step {step} WITHOUT the guard's state: {path} is missing. The guard starts over: "
        "every detector's baseline and warm-up begin again (no drift or spike alarm until they have re-learnt the "
        "run, and the early-run anchors are now this late stretch), the event history and the LR and clip "
        "multipliers the interventions had set are lost, and there is no rollback snapshot until the next healthy "
        "step. Resume from a checkpoint that holds rlguard_guard.json to keep them."
    )


#: the guard's counters in its state, each a step or a count (None: not yet)
GUARD_COUNTERS = ("consecutive_skips", "last_healthy_step", "last_snapshot_step", "last_step")
#: the fields of one detector's alarm in the guard's state
ALARM_FIELDS = ("level", "streak", "clean", "critical_age")


def state_step(value: Any, where: str) -> int | None:
    """``value`` read as a step or a count, or None; :class:`GuardStateError` naming ``where`` otherwise."""
    return None if value is None else state_count(value, where)


def state_alarm(value: Any, where: str) -> dict[str, int]:
    """One alarm of the guard's state (:data:`ALARM_FIELDS`, level 0 none, 1 warn, 2 critical), validated."""
    fields = state_object(value, where)
    if set(fields) != set(ALARM_FIELDS):
        raise GuardStateError(f"{where}: expected the keys {list(ALARM_FIELDS)}; got {sorted(fields)}")
    alarm = {k: state_count(fields[k], f"{where}.{k}") for k in ALARM_FIELDS}
    if alarm["level"] > 2:
        raise GuardStateError(f"{where}.level: expected 0 (none), 1 (warn) or 2 (critical); got {alarm['level']}")
    return alarm


def probe_state(owner: Any, state: Any, where: str) -> None:
    """Validate ``state`` for ``owner`` (anything with ``load_state_dict``) on a copy, so that a bad key later in
    the file changes nothing."""
    copy.deepcopy(owner).load_state_dict(state, where=where)
