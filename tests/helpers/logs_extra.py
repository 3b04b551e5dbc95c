"""Small logs written byte by byte for the reader tests: flat JSONL and CSV lines, and TensorBoard event files
framed here (TFRecord: length, masked CRC-32C of it, data, masked CRC-32C of the data) without torch."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tests.helpers.synthetic import healthy_stream

#: the stats written: canonical names, which the doctor reads as themselves
STATS = ("loss", "reward_mean", "entropy", "grad_norm", "kl_ref", "length_mean")


def rows(steps: int, seed: int = 0, *, nan_at: int | None = None, first: int = 1) -> list[dict[str, float]]:
    """``steps`` rows ``{"step": first.., stats}`` of a healthy plateau run; with ``nan_at``, that step's loss NaN
    and its gradient norm 1e6 (a critical ``nonfinite`` finding)."""
    out = []
    for i, stats in enumerate(healthy_stream(steps, seed, "plateau")):
        row: dict[str, float] = {"step": first + i, **{k: stats[k] for k in STATS}}
        if nan_at == first + i:
            row["loss"], row["grad_norm"] = math.nan, 1e6
        out.append(row)
    return out


def jsonl_text(records: Iterable[Mapping[str, object]]) -> str:
    return "".join(json.dumps(dict(r)) + "\n" for r in records)


def csv_text(records: Sequence[Mapping[str, object]], columns: list[str] | None = None) -> str:
    columns = columns or list(records[0])
    lines = [",".join(columns)] + [",".join(repr(r[c]) if c in r else "" for c in columns) for r in records]
    return "\n".join(lines) + "\n"


def write_events(path: Path, records: Iterable[tuple[int, Mapping[str, float]]]) -> Path:
    """A TensorBoard event file: the file-version record, then one event of scalars per ``(step, values)``."""
    from tensorboard.compat.proto import event_pb2, summary_pb2  # type: ignore[import-untyped]
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c  # type: ignore[import-untyped]

    def frame(event: object) -> bytes:
        data = event.SerializeToString()  # type: ignore[attr-defined]
        header = struct.pack("<Q", len(data))
        return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))

    out = [frame(event_pb2.Event(wall_time=0.0, file_version="brain.Event:2"))]
    for step, values in records:
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        )
        out.append(frame(event_pb2.Event(wall_time=1.0, step=step, summary=summary)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(out))
    return path
