"""Which extra installs a missing module, and the one line that says so.

``pip install rlguard`` is the torch-free core (the doctor, watch, report, alerts, the guard's pure logic); the
rest comes with an extra (``pyproject.toml``, ``docs/install.md``). A ``ModuleNotFoundError`` for one of their
modules becomes one line naming the extra: the command line prints it instead of a traceback
(:func:`rlguard.cli.main`), and the packages' lazy names raise it as an ``ImportError`` (:mod:`rlguard._lazy`).
"""

from __future__ import annotations

__all__ = ["CORE", "EXTRA_OF", "MissingExtraError", "missing_extra", "missing_extra_line"]

#: top-level module -> the extra that installs it
EXTRA_OF: dict[str, str] = {
    "torch": "torch",
    "safetensors": "torch",
    "matplotlib": "plots",
    "trl": "trl",
    "transformers": "trl",
    "datasets": "trl",
    "accelerate": "trl",
    "verl": "verl",
    "ray": "verl",
    "omegaconf": "verl",
    "hydra": "verl",
    "deepspeed": "deepspeed",
    "tensorboard": "tensorboard",
}
#: the core's own dependencies: missing, they mean a broken install, not a missing extra
CORE = frozenset({"numpy", "pluggy", "typer", "rich", "click"})


class MissingExtraError(ModuleNotFoundError):
    """A module of an extra (or of the core, in a broken install) is not installed; the message is one line, and
    ``name`` the missing module."""


def missing_extra(err: BaseException) -> str | None:
    """The top-level module ``err`` (a ``ModuleNotFoundError``) did not find, if an extra or the core owns it."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    top = err.name.partition(".")[0]
    return top if top in EXTRA_OF or top in CORE else None


def missing_extra_line(what: str, module: str) -> str:
    """One line: ``what`` needs ``module`` and the pip command that installs it."""
    extra = EXTRA_OF.get(module)
    if extra is None:
        return (
            f"{what} needs {module}, a dependency of rlguard's core that is not installed (a broken install): "
            'pip install --force-reinstall "rlguard"'
        )
    return f'{what} needs {module}, which comes with the {extra} extra: pip install "rlguard[{extra}]"'
