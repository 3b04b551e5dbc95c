"""A griffe extension for the API reference: the Sphinx roles of rlguard's docstrings (``:func:`~a.b.c` ``) become
cross-references where the docs render the target and code spans where they do not (autorefs' optional links), and
doctest lines (``>>> ...``), which Markdown would read as nested quotes, become Python code blocks."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc):`(~?)([^`<>]+?)`")
#: a run of doctest lines (``>>> `` and its ``... `` continuations) at one indentation
_DOCTEST = re.compile(r"^(?P<indent>[ \t]*)>>> .*(?:\n(?P=indent)(?:>>>|\.\.\.)(?: .*)?)*", re.MULTILINE)
_DOCTEST_FLAG = re.compile(r"\s*# doctest: [^\n]*")


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1) == "~", match.group(2).strip()
    shown = target.rsplit(".", 1)[-1] if short else target
    return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'


def _code_block(match: re.Match[str]) -> str:
    indent = match.group("indent")
    lines = [_DOCTEST_FLAG.sub("", line[len(indent) + 4 :]) for line in match.group(0).splitlines()]
    return "\n".join(f"{indent}{line}".rstrip() for line in ["```python", *lines, "```"])


class SphinxRoles(griffe.Extension):
    """Rewrite the roles and doctests in every docstring before mkdocstrings renders it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        text = obj.docstring.value
        if ">>> " in text:
            text = _DOCTEST.sub(_code_block, text)
        if ":" in text:
            text = _ROLE.sub(_replace, text)
        obj.docstring.value = text
