"""Fixtures of the TRL adapter's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlguard.tasks.hf import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
