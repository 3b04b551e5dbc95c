"""Old import paths of modules that moved: each old module is a stub whose attributes resolve, with a
``DeprecationWarning`` naming the new place, to the module that now holds them (``docs/design.md``, "Layout")."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["moved"]


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
