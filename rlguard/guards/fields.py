"""Strict checking of configuration values against a dataclass's field types: :func:`check_fields`, the one
validation that every way of configuring the guard goes through (``GuardConfig`` and ``AlertConfig`` when built,
detector and intervention overrides when the guard builds them, TRL's ``--guard`` JSON or YAML mapping, verl's
``trainer.rlguard_guard``).

Values from JSON, YAML or a command line are typed by their parser, so a type is never guessed from a string:
``"false"`` is not a boolean and ``"5"`` not a number. A number is accepted for a ``float`` field (an ``int``
too, never a ``bool``), a JSON list for a ``tuple`` field (it becomes a tuple), a mapping for a dataclass field (its
fields are checked in turn). Errors name the field by its path (``guard.alerts.min_severity``), the value received
and what is accepted.

Numbers are checked for range as well as type: a NaN is never accepted (``critical_above: NaN`` would switch a bound
off, every comparison with it being false), an infinity only where the field's :class:`Range` says so, an integer
beyond 2**53 never (no count or step is that large; it would fail later, mid-training). A class declares its
fields' ranges in one table, ``field_ranges`` (field name -> :class:`Range`; ``"*"``: every other number of the
class), read through its bases: ``Detector`` and ``Intervention`` declare every number ``>= 0`` (a negative
threshold would fire on a healthy run at its first step) and name the fields that need more.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["AT_LEAST_ONE", "NON_NEGATIVE", "POSITIVE", "FieldError", "Range", "check_fields", "check_value", "describe"]

#: the largest integer a field accepts: larger ones are no count or step, and beyond float's exact integers
MAX_INT = 2**53


class FieldError(ValueError):
    """A configuration value of the wrong type, or an unknown field; ``str(err)`` names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a field accepts: ``low <= x <= high`` (``low < x`` when ``open_low``), finite unless
    ``infinite`` (then ``low`` and ``high`` may be reached as infinities too); NaN never."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    infinite: bool = False

    def admits(self, x: float) -> bool:
        """Whether number ``x`` is in the range."""
        if math.isnan(x) or (math.isinf(x) and not self.infinite):
            return False
        return (self.low < x if self.open_low else self.low <= x) and x <= self.high

    def __str__(self) -> str:
        bounds = []
        if self.low > -math.inf:
            bounds.append(f"{'>' if self.open_low else '>='} {self.low:g}")
        if self.high < math.inf:
            bounds.append(f"<= {self.high:g}")
        return ("a number" if self.infinite else "a finite number") + (" " + " and ".join(bounds) if bounds else "")


NON_NEGATIVE = Range(0.0)
POSITIVE = Range(0.0, open_low=True)
AT_LEAST_ONE = Range(1.0)
#: what a number of a class that declares no range accepts
_ANY_FINITE = Range()


def field_range(cls: type, name: str) -> Range:
    """The range of ``cls``'s numeric field ``name``: the first of its classes (in method resolution order) whose
    own ``field_ranges`` names it, else the first whose table has ``"*"``, else any finite number."""
    tables = [vars(c).get("field_ranges") or {} for c in cls.__mro__]
    for key in (name, "*"):
        for table in tables:
            if key in table:
                return table[key]  # type: ignore[no-any-return]
    return _ANY_FINITE


def _check_range(cls: type, name: str, value: Any, where: str) -> None:
    """:class:`FieldError` naming ``where`` unless ``value`` (a field's value, type-checked) is in its range;
    values that are not numbers (None, strings, lists) are left to the type check."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return
    if isinstance(value, numbers.Integral) and abs(int(value)) > MAX_INT:
        raise FieldError(f"{where}: expected an integer of at most 2**53; got an integer of {len(str(value))} digits")
    allowed = field_range(cls, name)
    if not allowed.admits(float(value)):
        tp = _init_fields(cls).get(name, Any)
        members = (tp, *typing.get_args(tp))
        whole = int in members and float not in members
        accepted = str(allowed).replace("a finite number", "an integer") if whole else str(allowed)
        raise FieldError(f"{where}: expected {accepted}; got {_show(value)}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _init_fields(cls: type) -> dict[str, Any]:
    """The constructor's fields of dataclass ``cls`` and their resolved types."""
    hints = _hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def check_fields(cls: type, values: Mapping[Any, Any], *, where: str, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """``values`` (field name -> value) checked against the field types of dataclass ``cls`` and, for numbers,
    against their ranges (:func:`field_range`): unknown names, values of another type and numbers out of range
    raise :class:`FieldError` naming ``where.<field>``; returns the values, lists given for tuples as tuples and
    mappings given for dataclass fields built. Fields in ``exclude`` are refused here."""
    if not isinstance(values, Mapping):
        raise FieldError(f"{where}: expected a mapping of {cls.__name__}'s fields; got {_show(values)}")
    known = {k: v for k, v in _init_fields(cls).items() if k not in exclude}
    unknown = sorted(str(k) for k in values if k not in known)
    if unknown:
        raise FieldError(f"{where}: unknown field(s) {unknown}; accepted: {sorted(known)}")
    checked = {str(k): check_value(known[str(k)], v, f"{where}.{k}") for k, v in values.items()}
    for name, value in checked.items():
        _check_range(cls, name, value, f"{where}.{name}")
    return checked


def check_value(tp: Any, value: Any, where: str) -> Any:
    """``value`` if it is of type ``tp`` (converted as the module says), else :class:`FieldError` naming ``where``."""
    ok, converted = _match(tp, value, where)
    if not ok:
        raise FieldError(f"{where}: expected {describe(tp)}; got {_show(value)}")
    return converted


def _match(tp: Any, value: Any, where: str) -> tuple[bool, Any]:
    """Whether ``value`` is a ``tp``, and the value to use. The items of a list or mapping and the fields of a
    dataclass raise their own :class:`FieldError` (it names the item, which says more than "expected ...")."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True, value
    if origin in (typing.Union, types.UnionType):
        for member in args:
            ok, converted = _match(member, value, where)
            if ok:
                return True, converted
        return False, value
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args), value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool), value
    if tp is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool), value
    if tp is str:
        return isinstance(value, str), value
    if origin is tuple:
        return _sequence(args, value, where)
    if origin is Callable:
        return callable(value), value
    if origin is list:
        ok, items = _sequence((args[0], ...) if args else (), value, where)
        return ok, list(items) if ok else value
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return _mapping(args, value, where)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return True, value
        if isinstance(value, Mapping):
            return True, tp(**check_fields(tp, value, where=where))
        return False, value
    if isinstance(tp, type):
        return isinstance(value, tp), value
    return True, value  # a type this checker does not know (a callable's signature): the field's own code checks it


def _sequence(args: tuple[Any, ...], value: Any, where: str) -> tuple[bool, Any]:
    if not isinstance(value, (list, tuple)):
        return False, value
    if len(args) == 2 and args[1] is Ellipsis:
        members = [args[0]] * len(value)
    elif args:
        if len(args) != len(value):
            return False, value
        members = list(args)
    else:
        members = [Any] * len(value)
    return True, tuple(check_value(t, v, f"{where}[{i}]") for i, (t, v) in enumerate(zip(members, value, strict=True)))


def _mapping(args: tuple[Any, ...], value: Any, where: str) -> tuple[bool, Any]:
    if not isinstance(value, Mapping):
        return False, value
    key_type, value_type = args if args else (Any, Any)
    return True, {
        check_value(key_type, k, f"{where} key {k!r}"): check_value(value_type, v, f"{where}[{k!r}]")
        for k, v in value.items()
    }


def describe(tp: Any) -> str:
    """``tp`` in words, as error messages say what is accepted."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {describe(args[0])}"
        return f"a list of {len(args)}: [{', '.join(describe(a) for a in args)}]"
    if origin is list:
        return f"a list of {describe(args[0])}" if args else "a list"
    if origin is Callable:
        return "a function (from Python only)"
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return f"a mapping of {describe(args[0])} to {describe(args[1])}" if args else "a mapping"
    words = {bool: "true or false (a boolean)", int: "an integer", float: "a number", str: "a string"}
    if tp in words:
        return words[tp]
    if tp is type(None):
        return "null (None)"
    if tp is Any:
        return "any value"
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return f"a mapping of {tp.__name__}'s fields"
    return getattr(tp, "__name__", str(tp))


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"
