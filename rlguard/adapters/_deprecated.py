"""Names an adapter renamed, still importable from their old module for a while: the module's ``__getattr__``
(PEP 562) hands out the object under its new name with a ``DeprecationWarning`` that says what to import instead,
so that only code using an old name is warned.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["renamed"]


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
