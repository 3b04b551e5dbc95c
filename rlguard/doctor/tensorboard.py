"""TensorBoard event files read record by record, checksums verified, so that a damaged file is never read as a
short, healthy one.

An event file is a sequence of TFRecords: ``uint64 length``, ``uint32 masked CRC-32C of length``, ``data``,
``uint32 masked CRC-32C of data`` (TensorFlow's ``tf_record`` format). Reading stops at the first record whose
checksum fails (nothing after it can be framed reliably): the bytes after it are reported as damage, and so is a
last record cut short at the end of the file (a writer that was stopped, or a partial copy): the record is lost,
so the log cannot be judged whole. A negative step, or one of 2**53 or more, is refused, as the other readers refuse
it. A folder is one run per directory (TensorBoard's own notion of a run); a folder holding several runs that log
the same tags is refused.
The ``tensorboard`` package is needed only for its protobuf classes and CRC, imported when a file is read.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from rlguard.doctor.readreport import LogInputError, ReadReport
from rlguard.doctor.steps import MAX_STEP

TB_GLOB = "events.out.tfevents.*"


def _imports() -> tuple[object, object, object]:
    try:
        from tensorboard.compat.proto import event_pb2  # type: ignore[import-untyped]
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (  # type: ignore[import-untyped]
            masked_crc32c,
        )
        from tensorboard.util import tensor_util  # type: ignore[import-untyped]
    except ImportError:
        raise LogInputError(
            "reading a TensorBoard log needs the tensorboard package (pip install tensorboard)"
        ) from None
    return event_pb2, masked_crc32c, tensor_util


def event_files(path: Path) -> list[Path]:
    """The event files of ``path`` (a file, or a folder searched at any depth); LogInputError for a folder that
    holds several runs (directories) logging the same tags."""
    return [path] if path.is_file() else sorted(path.rglob(TB_GLOB))


def read_tensorboard(path: Path, report: ReadReport) -> Iterator[tuple[int, dict[str, float], str]]:
    """``(step, {tag: value}, where)`` for each scalar summary of the event file(s) at ``path``, with the read
    accounted in ``report`` (records, bytes read of the files' size, damage)."""
    event_pb2, masked_crc32c, tensor_util = _imports()
    files = event_files(path)
    runs: dict[Path, set[str]] = {}
    out: list[tuple[int, dict[str, float], str]] = []
    report.bytes_read = report.bytes_total = 0
    for file in files:
        tags = runs.setdefault(file.parent, set())
        for step, row, where in _read_file(file, report, event_pb2, masked_crc32c, tensor_util):
            tags.update(row)
            out.append((step, row, where))
    shared = [d for d, tags in runs.items() if any(tags & other for e, other in runs.items() if e != d)]
    if len(shared) > 1:
        names = ", ".join(str(d) for d in shared[:4])
        raise LogInputError(
            f"{path} holds {len(shared)} TensorBoard runs logging the same tags ({names}): their values would "
            "collapse onto one key per step; pass one run's folder"
        )
    yield from out


def _read_file(
    file: Path, report: ReadReport, event_pb2: object, masked_crc32c: object, tensor_util: object
) -> Iterator[tuple[int, dict[str, float], str]]:
    data = file.read_bytes()
    size = len(data)
    assert report.bytes_total is not None and report.bytes_read is not None
    report.bytes_total += size
    offset, index = 0, 0
    while offset < size:
        where = f"{file.name}, record {index + 1} at byte {offset}"
        if size - offset < 12:
            _damaged(report, file, where, "it is cut short at the end of the file", size - offset)
            break
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        end = offset + 12 + length + 4
        if length_crc != masked_crc32c(header):  # type: ignore[operator]
            _damaged(report, file, where, "its length fails its checksum", size - offset)
            break
        if end > size:
            _damaged(report, file, where, "it is cut short at the end of the file", size - offset)
            break
        payload = data[offset + 12 : offset + 12 + length]
        (data_crc,) = struct.unpack("<I", data[end - 4 : end])
        if data_crc != masked_crc32c(payload):  # type: ignore[operator]
            _damaged(report, file, where, "its data fail their checksum", size - offset)
            break
        try:
            event = event_pb2.Event.FromString(payload)  # type: ignore[attr-defined]
        except Exception:  # protobuf raises its own DecodeError; a record that does not parse is damage
            _damaged(report, file, where, "it is not an Event protobuf", size - offset)
            break
        report.records += 1
        report.bytes_read += end - offset
        offset, index = end, index + 1
        if not event.HasField("summary"):
            report.drop("TensorBoard records without scalars (file version, graphs, metadata)")
            continue
        row: dict[str, float] = {}
        for value in event.summary.value:
            if value.HasField("simple_value"):
                row[value.tag] = float(value.simple_value)
            elif value.HasField("tensor"):
                array = tensor_util.make_ndarray(value.tensor)  # type: ignore[attr-defined]
                if array.size == 1 and array.dtype.kind in "fiu":
                    row[value.tag] = float(array.reshape(()))
                else:
                    report.non_numeric[value.tag] += 1
        if not 0 <= event.step <= MAX_STEP:
            raise LogInputError(
                f"{file.parent / where}: step {event.step} is not a whole number of steps from 0 to 2**53 - 1; the "
                "writer's global_step must count optimizer steps"
            )
        if row:
            yield int(event.step), row, where
        else:
            report.drop("TensorBoard records without scalars (file version, graphs, metadata)")


def _damaged(report: ReadReport, file: Path, where: str, why: str, lost: int) -> None:
    report.damage.append(
        f"{where}: {why}; the {lost} bytes from there to the end of {file.name} were not read (the file is damaged; "
        "re-copy it from the training machine)"
    )
