"""Install a module as a third-party distribution with an ``rlguard`` entry point, the way ``pip install`` leaves
one on ``sys.path`` (the module and its ``.dist-info`` with ``entry_points.txt``), for a child process to load
through rlguard's plugin manager. Nothing registers the plugin by hand: only the entry point does.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlguard.plugins import DISABLE_AUTOLOAD_ENV, ENTRY_POINT_GROUP


def install_plugin(folder: Path, module: str, source: str) -> dict[str, str]:
    """Write ``module`` (its ``source``) and its distribution's metadata into ``folder``; returns the environment
    of a child process that sees it: ``folder`` first on ``PYTHONPATH``, plugin autoload on."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(source)
    dist = folder / f"{module}-0.1.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{module} = {module}\n")
    env = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return env
