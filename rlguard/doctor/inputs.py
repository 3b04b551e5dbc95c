"""A log given as a pipe, a FIFO or stdin (``-``) is read once and whole; a device file is refused.

Format detection reads the start of a file and the reader opens it again: on a pipe (``rlguard doctor <(cat
log.jsonl)``, ``cat log.jsonl | rlguard doctor -``) the first read consumes what the second needs, and a device
file (``/dev/zero``) never ends. So a non-seekable input is copied once, in chunks of 1 MiB, into a temporary file
(disk, not memory), at most :data:`STREAM_LIMIT_BYTES` of it; the format is detected from those bytes and the
copy is read as any log file, then deleted. A stream whose first chunk holds a NUL byte and is not a TensorBoard
event file (``cat /dev/zero |``) is refused at once: text logs never hold one. A character or block device, or a
socket, is refused naming it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rlguard.doctor.readreport import LogInputError

__all__ = ["STDIN", "STREAM_LIMIT_BYTES", "LogInput", "is_stream", "open_input"]

#: the path that names stdin
STDIN = "-"
#: the most bytes read from a pipe, a FIFO or stdin (an endless stream stops there, as bad input)
STREAM_LIMIT_BYTES = 4 * 1024**3
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class LogInput:
    """A log to read.

    Attributes:
        path: the file (or folder) to read: the one given, or the temporary copy of a stream.
        shown: how the log is named to the user (``<stdin>``, ``/dev/fd/63``, the path given).
        streamed: whether it was a stream (no run folder, no ``events.jsonl`` beside it).
    """

    path: Path
    shown: Path
    streamed: bool = False


def is_stream(given: str | Path) -> bool:
    """Whether ``given`` names a stream (``-``, a pipe or a FIFO): read once, it holds nothing more to follow."""
    try:
        return str(given) == STDIN or stat.S_ISFIFO(Path(given).stat().st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def open_input(given: str | Path) -> Iterator[LogInput]:
    """The log at ``given``: a file or folder as is; stdin (``-``), a pipe or a FIFO spooled to a temporary file for
    as long as the ``with`` block lasts; LogInputError for a device file, a socket, or a stream over the limit."""
    if str(given) == STDIN:
        with _spool(sys.stdin.buffer, Path("<stdin>")) as spooled:
            yield spooled
        return
    path = Path(given)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise LogInputError(f"no such file or folder: {path}") from None
    except OSError as err:
        raise LogInputError(f"{path}: cannot be read ({err.strerror or err})") from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        yield LogInput(path, path)
        return
    if not stat.S_ISFIFO(mode):
        kind = "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else "a socket"
        raise LogInputError(f"{path} is {kind}, not a log file: give a log file, a run folder, or - to read stdin")
    try:
        fh = path.open("rb")
    except OSError as err:
        raise LogInputError(f"{path}: cannot be read ({err.strerror or err})") from None
    with fh, _spool(fh, path) as spooled:
        yield spooled


@contextlib.contextmanager
def _spool(source: BinaryIO, shown: Path) -> Iterator[LogInput]:
    fd, name = tempfile.mkstemp(prefix="rlguard-stream-")
    copy = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            limit = STREAM_LIMIT_BYTES
            total = 0
            while chunk := source.read(min(_CHUNK, limit + 1 - total)):
                if not total and b"\0" in chunk and b"brain.Event:" not in chunk[:64]:
                    raise LogInputError(
                        f"{shown}: binary data that is not a TensorBoard event file (a NUL byte in the first "
                        f"{len(chunk)} bytes), not a log; give a log file, or its text"
                    )
                total += len(chunk)
                if total > limit:
                    raise LogInputError(
                        f"{shown}: more than {limit} bytes read from the stream, the most the doctor reads from a "
                        "pipe or stdin (an endless stream?); save it to a file and give the file"
                    )
                out.write(chunk)
        yield LogInput(copy, shown, streamed=True)
    finally:
        copy.unlink(missing_ok=True)
