"""Old names that still work for a while, each with a ``DeprecationWarning`` that says what to use instead: modules
that moved (:func:`moved`: the old module is a stub whose attributes resolve to the module that now holds them;
``docs/design.md``, "Layout") and functions that were renamed in their module (:func:`renamed`). Both give a
module ``__getattr__`` (PEP 562), so only code that uses an old name is warned."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["moved", "renamed"]


def moved(old: str, new: Sequence[str], renamed: dict[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the stub at ``old``: a name is looked up in the modules ``new`` in order (a
    name in ``renamed`` under its new name), with a warning that names where it lives now."""
    renamed = renamed or {}

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = renamed.get(name, name)
        for module_name in new:
            module = importlib.import_module(module_name)
            if hasattr(module, target):
                warnings.warn(
                    f"{old}.{name} moved to {module_name}.{target}; import it from there "
                    f"({old} will be removed in a future release).",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(module, target)
        raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {', '.join(new)})")

    return __getattr__


def renamed(module: str, **old_names: Callable[..., Any]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``module`` that gives each old name (a keyword) what it is now, after a
    ``DeprecationWarning`` naming its new name and module, and raises ``AttributeError`` for any other name.

    >>> import warnings
    >>> module_getattr = renamed("m", size=len)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     module_getattr("size") is len
    True
    >>> str(caught[0].message)
    'm.size is deprecated: use builtins.len, which takes the same arguments.'
    """

    def __getattr__(name: str) -> Any:
        new = old_names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is deprecated: use {new.__module__}.{new.__qualname__}, which takes the same arguments.",
            DeprecationWarning,
            stacklevel=2,  # the line that used the old name
        )
        return new

    return __getattr__
