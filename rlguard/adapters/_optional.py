"""The install hint of an adapter whose framework is missing."""

from __future__ import annotations

__all__ = ["install_hint"]


def install_hint(err: ModuleNotFoundError, adapter: str, extra: str, modules: tuple[str, ...]) -> ImportError | None:
    """The error to raise instead of ``err``, met while importing ``adapter``: an ``ImportError`` naming
    ``pip install 'rlguard[<extra>]'`` if the missing module is one of ``modules`` (or inside one), else None.

    >>> install_hint(ModuleNotFoundError("No module named 'verl'", name="verl"), "a", "verl", ("verl",))
    ImportError("a needs verl: pip install 'rlguard[verl]' (No module named 'verl').")
    """
    if (err.name or "").split(".")[0] not in modules:
        return None
    return ImportError(f"{adapter} needs {extra}: pip install 'rlguard[{extra}]' ({err}).", name=err.name)
