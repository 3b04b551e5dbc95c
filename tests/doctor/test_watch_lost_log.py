"""A log that is deleted or turns unreadable while watched never ends the watch with the last good read's
verdict as if it held (issue 37): the read error is printed, and the exit code is 2 (1 if the last good read was
already critical)."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

from rich.console import Console

from rlguard.watch import watch
from tests.helpers.logs_extra import jsonl_text, rows


def _watch_while(path: Path, change: object) -> tuple[int, str]:
    calls: list[float] = []

    def sleep(seconds: float) -> None:
        if not calls:
            change(path)  # type: ignore[operator]
        calls.append(seconds)
        time.sleep(0.02)

    out = io.StringIO()
    result = watch(path, console=Console(file=out, width=200), interval=0.05, idle=0.3, sleep=sleep)
    return result.exit_code, out.getvalue()


def test_a_log_deleted_while_watched_is_not_a_clean_bill(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(60)), encoding="utf-8")
    code, out = _watch_while(path, Path.unlink)
    assert code == 2, out
    assert "no such file" in out and "last good read" in out


def test_a_log_that_turns_unreadable_while_watched_is_not_a_clean_bill(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl_text(rows(60)), encoding="utf-8")

    def garble(p: Path) -> None:
        p.write_bytes(p.read_bytes() + b'{"step": 61, "loss": \xff\xfe}\n{"step": 62, "loss": 0.1}\n')
        os.utime(p)

    code, out = _watch_while(path, garble)
    assert code == 2, out
    assert "not UTF-8" in out
