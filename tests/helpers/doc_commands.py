"""The shell commands of a docs page's ``bash`` blocks and of the files CI runs (``.ci/run``, the ``Makefile``,
``.ci/wheel-check``), each normalised to the words a user would type, so that a test can tell whether CI runs a
command of the page word for word (tests/project/test_install_page.py, tests/project/test_readme.py).

The normalisation is the one a reader does: a venv's binary is its name (``venv/bin/pip`` and ``$(VENV)/bin/twine``
are ``pip`` and ``twine``), ``python -m pip`` is ``pip``, ``--quiet``, redirections and ``NAME=value`` settings
(``DS_BUILD_OPS=0``, ``PYTEST_ARGS=...``) are dropped, the Makefile's ``TORCH_SPEC`` and the wheel-check's
``$wheel`` are their values, and a CI word that is still a shell variable (``"$core"``, ``"$run"``) stands for
any one word of the page (the user's own folder).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI_FILES = (".ci/run", "Makefile", ".ci/wheel-check")
_FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_VARIABLE = re.compile(r"^\$\{?\w+\}?$")


def torch_spec() -> str:
    """The Makefile's ``TORCH_SPEC`` (the torch build CI installs)."""
    found = re.search(r"^TORCH_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, "the Makefile sets TORCH_SPEC"
    return found.group(1)


def wheel_name(version: str) -> str:
    """The wheel ``python -m build`` writes for ``version`` (a pure-Python wheel)."""
    return f"dist/rlguard-{version}-py3-none-any.whl"


def bash_blocks(page: Path) -> list[str]:
    """The text of every ``bash`` fenced block of ``page`` (indented ones, inside a list, included)."""
    text = page.read_text(encoding="utf-8")
    return [_dedent(code) for lang, code in _FENCE.findall(text) if lang == "bash"]


def _dedent(code: str) -> str:
    lines = code.splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] for line in lines)


def block_commands(code: str) -> list[str]:
    """The commands of a shell block: continuations joined, comments and blank lines dropped."""
    joined = code.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        command = re.split(r"\s#|^#", line, maxsplit=1)[0].strip()
        if command:
            out.append(command)
    return out


def normalise(command: str, version: str) -> list[list[str]]:
    """``command`` as the words a user types, one list per command of a ``&&``/``||``/``;``/``&`` chain."""
    text = command
    # the wheel-check's helpers: pip_install VENV ARGS is pip install ARGS; expect CODE CMD runs CMD
    text = re.sub(r'\bpip_install\s+"?\$\w+"?', "pip install", text)
    text = re.sub(r"^expect\s+\d+\s+", "", text)
    text = re.sub(r"\$\(TORCH_SPEC\)|\$\{?TORCH_SPEC\}?", torch_spec(), text)
    text = re.sub(r"\$\{?wheel\}?(?=\W|$)", wheel_name(version), text)
    text = re.sub(r"\$\(PY\)|\$\(PYTHON\)|\$\{?PYTHON\}?", "python", text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    words = list(lexer)
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word in {"&&", "||", ";", "|", "&"}:  # "&": a command sent to the background ends like ";"
            commands.append([])
        elif word in {">", ">>", "<", "2>", ">&"} or word.endswith(">"):  # ">&": "2>&1"
            skip = True  # and its target
            if commands[-1] and commands[-1][-1].isdigit() and i and words[i - 1] == commands[-1][-1]:
                commands[-1].pop()
        else:
            commands[-1].append(word)
    return [c for c in (_words(c) for c in commands) if c]


def _words(words: list[str]) -> list[str]:
    out = []
    for word in words:
        if re.fullmatch(r"[A-Z_]+=.*", word) or word == "--quiet":
            continue
        word = re.sub(r"^\S*/bin/(\w[\w.-]*)$", r"\1", word)  # a venv's binary
        out.append("python" if word == "python3" else word)
    if out[:3] == ["python", "-m", "pip"]:
        out = ["pip", *out[3:]]
    return out


def ci_commands(version: str) -> list[tuple[str, list[str]]]:
    """Every command of the files CI runs, normalised, with the file it is in."""
    out = []
    for name in CI_FILES:
        text = (ROOT / name).read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or re.match(r"^[\w.$()/-]+:", line):  # a comment, a make rule
                continue
            try:
                for words in normalise(line, version):
                    out.append((name, words))
            except ValueError:  # a line shlex cannot split (a quote opened on another line): no command of a page
                continue
    return out


def _same_word(ci: str, page: str) -> bool:
    """A CI word that is a shell variable stands for any one word of the page that is not an option."""
    return ci == page or (_VARIABLE.match(ci) is not None and not page.startswith("-"))


def run_by_ci(words: list[str], version: str) -> str | None:
    """The CI file that runs ``words`` (a normalised command of a page) word for word, or None."""
    for name, ci in ci_commands(version):
        if len(ci) == len(words) and all(map(_same_word, ci, words)):
            return name
    return None


#: the commands of a page that need a published package: installs from PyPI (of an extra that pyproject declares)
#: and TestPyPI (of this version), and the uploads, which the release steps run after ``make dist-check``
def published(words: list[str], version: str, extras: set[str]) -> bool:
    """Whether ``words`` is a command that needs rlguard published (or publishes it), of a form the test checks."""
    if words[:2] == ["pip", "install"] and len(words) == 3:
        found = re.fullmatch(r"rlguard(?:\[(\w+)\])?", words[2])
        return found is not None and (found.group(1) is None or found.group(1) in extras)
    testpypi = ["--index-url", "https://test.pypi.org/simple/", "--extra-index-url", "https://pypi.org/simple/"]
    if words == ["pip", "install", *testpypi, f"rlguard=={version}"]:
        return True
    return words in (["twine", "upload", "--repository", "testpypi", "dist/*"], ["twine", "upload", "dist/*"])


def quick(words: list[str]) -> bool:
    """Whether ``words`` is a command a test runs itself: ``rlguard ... --help``, ``rlguard --version`` or a
    ``python -c`` check."""
    return (words[0] == "rlguard" and words[-1] in {"--help", "--version"}) or words[:2] == ["python", "-c"]
