"""Names a package hands out on first use (PEP 562): a heavy dependency (torch) is imported only by code that uses
one of them, so ``rlguard doctor`` and ``rlguard --version`` start without it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from rlguard._extras import MissingExtraError, missing_extra, missing_extra_line

__all__ = ["lazy"]


def lazy(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``package`` that imports each of ``names`` (name -> the module that defines it) when
    first asked for and keeps it in the package's namespace. A name whose module needs a missing extra (torch)
    raises :class:`~rlguard._extras.MissingExtraError`, one line naming the extra."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(names[name])
        except ModuleNotFoundError as err:
            missing = missing_extra(err)
            if missing is None:
                raise
            raise MissingExtraError(missing_extra_line(f"{package}.{name}", missing), name=missing) from err
        value = getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
