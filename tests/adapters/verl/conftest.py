"""Fixtures of the verl adapter's tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, dict[str, Any]]]:
    """What verl's loggers receive (the guard's subclass wraps whatever Tracking is when fit starts)."""
    import verl.utils.tracking as tracking

    records: list[tuple[int, dict[str, Any]]] = []

    class Recording(tracking.Tracking):
        def log(self, data: dict[str, Any], step: int, backend: Any = None) -> None:
            records.append((step, dict(data)))

    monkeypatch.setattr(tracking, "Tracking", Recording)
    return records
