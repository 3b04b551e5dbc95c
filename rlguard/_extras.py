"""Which extra installs a missing module, and the one line that says so.

``pip install rlguard`` is the torch-free core (the doctor, watch, report, alerts, the guard's pure logic); the
rest comes with an extra (``pyproject.toml``, ``docs/install.md``). A ``ModuleNotFoundError`` for one of their
modules becomes one line naming the extra: the command line prints it instead of a traceback
(:func:`run_console_script`), and the packages' lazy names raise it as an ``ImportError`` (:mod:`rlguard._lazy`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

__all__ = ["CORE", "EXTRA_OF", "MissingExtraError", "missing_extra", "missing_extra_line", "run_console_script"]

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


def run_console_script(app: Callable[..., object]) -> None:
    """Run the command line ``app`` as the ``rlguard`` console script: a module of a missing extra ends it in one
    line naming the extra (exit code 2) instead of a traceback; a plugin that failed to load warns in one line."""
    warnings.formatwarning = _plugin_warning_in_one_line
    try:
        app(prog_name="rlguard")
    except ModuleNotFoundError as err:
        missing = missing_extra(err)
        if missing is None:
            raise
        command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
        print(missing_extra_line(f"rlguard {command}".strip(), missing), file=sys.stderr)
        raise SystemExit(2) from None


_format_warning = warnings.formatwarning


def _plugin_warning_in_one_line(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """A plugin that failed to load is one line (its name and error), not the warning's file, line and source."""
    plugins = sys.modules.get("rlguard.plugins")  # not imported: no plugin was loaded, nor failed to
    if plugins is not None and issubclass(category, plugins.PluginLoadWarning):
        return f"warning: {message}\n"
    return _format_warning(message, category, filename, lineno, line)
