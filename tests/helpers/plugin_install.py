"""Install a module as a third-party distribution with an ``rlguard`` entry point, the way ``pip install`` leaves
one on ``sys.path`` (the module and its ``.dist-info`` with ``entry_points.txt``), for a child process to load
through rlguard's plugin manager. Nothing registers the plugin by hand: only the entry point does.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Mapping
from pathlib import Path

from rlguard.plugins import DISABLE_AUTOLOAD_ENV, ENTRY_POINT_GROUP

#: the worked plugin of docs/guides/plugins.md: its package and pyproject.toml, tested as written
EXAMPLE_PLUGIN = Path(__file__).resolve().parents[2] / "docs" / "examples" / "plugin"
#: its objective's module (BandPG), which the plugin-objective tests install on its own
BAND_PG_SOURCE = (EXAMPLE_PLUGIN / "band_plugin" / "objective.py").read_text()
GUIDE = EXAMPLE_PLUGIN.parents[1] / "guides" / "plugins.md"


def guide_python_blocks(heading: str) -> list[str]:
    """The ``python`` blocks of the plugin guide's section ``heading`` (to the next heading of any level)."""
    text = GUIDE.read_text()
    section = text[text.index(f"\n{heading}\n") + len(heading) + 2 :]
    following = re.search(r"^#{1,6} ", section, re.MULTILINE)
    section = section[: following.start()] if following else section
    return re.findall(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)


def install_distribution(
    folder: Path, dist: str, entry_points: Mapping[str, Mapping[str, str]], modules: Mapping[str, str]
) -> None:
    """Write the ``modules`` (dotted name -> source; a package's ``__init__`` named as such) and a distribution
    ``dist`` whose ``entry_points.txt`` has ``entry_points`` (group -> {name: module}) into ``folder``, as ``pip
    install`` leaves them on ``sys.path``."""
    folder.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        path = folder.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    info = folder / f"{dist}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 0.1\n")
    groups = "".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) + "\n"
        for group, eps in entry_points.items()
    )
    (info / "entry_points.txt").write_text(groups)


def install_plugin(folder: Path, module: str, source: str) -> dict[str, str]:
    """Write ``module`` (its ``source``) and its distribution's metadata into ``folder``, one entry point in the
    ``rlguard`` group; returns the environment of a child process that sees it: ``folder`` first on
    ``PYTHONPATH``, plugin autoload on."""
    install_distribution(folder, module, {ENTRY_POINT_GROUP: {module: module}}, {module: source})
    env = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return env
