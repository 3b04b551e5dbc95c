"""A griffe extension for the API reference: the Sphinx roles of rlguard's docstrings (``:func:`~a.b.c` ``) become
cross-references where the docs render the target and code spans where they do not (autorefs' optional links)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc):`(~?)([^`<>]+?)`")


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1) == "~", match.group(2).strip()
    shown = target.rsplit(".", 1)[-1] if short else target
    return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'


class SphinxRoles(griffe.Extension):
    """Rewrite the roles in every docstring before mkdocstrings renders it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = _ROLE.sub(_replace, obj.docstring.value)
