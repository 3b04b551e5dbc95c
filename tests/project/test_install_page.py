"""The install page and the release steps work as written (``docs/install.md``, ``CHANGELOG.md``): every command of
the page's ``bash`` blocks is run here (``--help``, ``--version``, a ``python -c`` check) or is, word for word, a
command CI runs (``.ci/run``, the ``Makefile``, ``.ci/wheel-check``; tests/helpers/doc_commands.py says how words
are compared); the uploads run against a local package index where ``make dist-check`` left ``dist/`` (CI), and the
installs from PyPI and TestPyPI, which need the package published, are of a checked form; the version is in one
place, which the metadata, the page and the changelog follow."""

from __future__ import annotations

import http.server
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import rlguard
from tests.helpers.doc_commands import (
    ROOT,
    bash_blocks,
    block_commands,
    normalise,
    published,
    quick,
    run_by_ci,
    wheel_name,
)

PAGE = ROOT / "docs" / "install.md"
VERSION = rlguard.__version__


def _extras() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _page_commands(page: Path = PAGE) -> list[list[str]]:
    commands = [command for code in bash_blocks(page) for command in block_commands(code)]
    return [words for command in commands for words in normalise(command, VERSION)]


def classify(words: list[str], extras: set[str]) -> str:
    """``"quick"`` (run here), ``"ci:<file>"`` (CI runs it) or ``"published"``; a command nothing runs raises."""
    if quick(words):
        return "quick"
    where = run_by_ci(words, VERSION)
    if where is not None:
        return f"ci:{where}"
    if published(words, VERSION, extras):
        return "published"
    raise AssertionError(f"a command of the docs that no test and no CI step runs: {' '.join(words)}")


def test_every_command_of_the_install_page_is_run_by_a_test_or_by_ci() -> None:
    kinds = [classify(words, _extras()) for words in _page_commands()]
    # the page shows each way: run here, run by each CI file, and after publication
    assert {"quick", "ci:.ci/run", "ci:Makefile", "ci:.ci/wheel-check", "published"} <= set(kinds), kinds


@pytest.mark.parametrize(
    "command",
    [
        "pip install -e .",  # no CI step installs the bare checkout
        'pip install "rlguard[gpu]"',  # no such extra
        "pip install dist/rlguard-9.9.9-py3-none-any.whl",  # another version's wheel
        "make demo",  # the Makefile has the target, but CI does not run it
        "twine upload --repository pypi dist/*",
        "venv/bin/rlguard doctor --html out/",  # the wheel-check's --html takes a file and a log
    ],
)
def test_a_command_that_nothing_runs_fails_the_check(command: str) -> None:
    (words,) = normalise(command, VERSION)
    with pytest.raises(AssertionError, match="no test and no CI step runs"):
        classify(words, _extras())


def test_the_quick_commands_of_the_install_page_run() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLGUARD_DISABLE_PLUGIN_AUTOLOAD": "1"}
    ran = []
    for words in _page_commands():
        if not quick(words):
            continue
        argv = [sys.executable, *words[1:]] if words[0] == "python" else [sys.executable, "-m", "rlguard", *words[1:]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        assert done.returncode == 0, (words, done.stdout, done.stderr)
        if words == ["rlguard", "--version"]:
            assert done.stdout.strip() == f"rlguard {VERSION}"
        ran.append(words[:2])
    assert ["rlguard", "--version"] in ran and ["python", "-c"] in ran


def test_the_readme_s_install_lines_are_run_by_ci() -> None:
    from tests.helpers.readme_blocks import block, commands

    install = commands(block("install"))
    assert install and all(classify(words, _extras()).startswith("ci:") for words in install)


def test_the_version_is_in_one_place() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rlguard.__version__"}
    assert importlib.metadata.version("rlguard") == VERSION
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    text = PAGE.read_text()
    wheels = set(re.findall(r"dist/rlguard-[\w.]+-py3-none-any\.whl", text))
    assert wheels == {wheel_name(VERSION)}, "the install page names the wheel of this version"
    assert f"rlguard=={VERSION}" in text and f"git tag v{VERSION}" in text


def test_the_changelog_keeps_a_changelog_and_its_latest_version_is_the_package_s() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "keepachangelog.com/en/1.1.0/" in text
    versions = re.findall(r"^## \[([^\]]+)\](.*)$", text, re.MULTILINE)
    assert versions[0] == ("Unreleased", "")
    assert versions[1][0] == VERSION, "the newest released section is rlguard.__version__"
    for _, date in versions[1:]:
        assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", date), date
    kinds = set(re.findall(r"^### (.+)$", text, re.MULTILINE))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds


class _Index(http.server.BaseHTTPRequestHandler):
    """A package index's upload endpoint: it keeps each upload's form fields (not the file)."""

    uploads: list[dict[str, str]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        fields = dict(re.findall(rb'name="(\w+)"(?:; filename="[^"]*")?\r\n(?:[^\r\n]+\r\n)*\r\n([^\r]{0,200})', body))
        self.uploads.append({k.decode(): v.decode(errors="replace") for k, v in fields.items()})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_upload_commands_upload_what_make_dist_check_built(tmp_path: Path) -> None:
    """Each ``twine upload`` of the release steps, run as written against a local index (``TWINE_REPOSITORY_URL``
    overrides ``--repository``), uploads this version's wheel and sdist. CI runs ``make dist-check`` before the
    tests, which leaves ``dist/`` and twine (the ``release`` extra) in its venv; elsewhere this is skipped."""
    path = os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))
    built = [ROOT / wheel_name(VERSION), ROOT / "dist" / f"rlguard-{VERSION}.tar.gz"]
    if shutil.which("twine", path=path) is None or not all(p.is_file() for p in built):
        pytest.skip("needs make dist-check's dist/ and twine (the release extra), as CI has them")
    uploads = [c for c in _page_commands() if c[:2] == ["twine", "upload"]]
    assert len(uploads) == 2  # TestPyPI, then PyPI

    class Index(_Index):
        uploads: list[dict[str, str]] = []  # noqa: RUF012  # this test's own class: one list per test

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **os.environ, "PATH": path, "HOME": str(tmp_path), "TWINE_NON_INTERACTIVE": "1",
        "TWINE_REPOSITORY_URL": f"http://127.0.0.1:{server.server_port}/legacy/",
        "TWINE_USERNAME": "__token__", "TWINE_PASSWORD": "pypi-local-test",
    }  # fmt: skip
    try:
        for words in uploads:
            done = subprocess.run(["bash", "-c", " ".join(words)], cwd=ROOT, env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr
    finally:
        server.shutdown()
        server.server_close()
    sent = sorted((u.get("name"), u.get("version"), u.get("filetype")) for u in Index.uploads)
    assert sent == sorted([("rlguard", VERSION, "bdist_wheel"), ("rlguard", VERSION, "sdist")] * 2), Index.uploads
