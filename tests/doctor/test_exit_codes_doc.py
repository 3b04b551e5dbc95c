"""The exit-code tables of the docs are the command line's: each row names its code's constant (``EXIT_OK``...),
and the constants are the codes, so a CI script that reads the docs can trust them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rlguard.doctor as doctor

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\d) \(`(EXIT_[A-Z_]+)`\) \|", re.M)


@pytest.mark.parametrize("doc", ["docs/guides/doctor.md", "docs/cli.md"])
def test_the_exit_code_table_is_the_cli_s_constants(doc: str) -> None:
    rows = ROW.findall((ROOT / doc).read_text(encoding="utf-8"))
    assert [int(code) for code, _ in rows] == [0, 1, 2, 3, 4], rows
    for code, name in rows:
        assert getattr(doctor, name) == int(code), (doc, code, name)
    assert {name for _, name in rows} == {n for n in doctor.__all__ if n.startswith("EXIT_")}


def test_the_command_line_s_own_internal_error_code_is_the_doctor_s() -> None:
    import rlguard.cli as cli

    assert cli.EXIT_INTERNAL == doctor.EXIT_INTERNAL
