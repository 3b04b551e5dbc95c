"""``rlguard.core_losses.catalogue``: the objectives' declarations, written out so that ``rlguard losses`` needs no
torch, are exactly what the classes declare (a class changed without its row fails here, with the rows to paste)."""

from __future__ import annotations

import json
import pprint
import subprocess
import sys
from pathlib import Path

from rlguard.core_losses.catalogue import BUILTIN, SHARED_OPTIONS, entries_of, objective_catalogue
from rlguard.core_losses.objective import Objective
from rlguard.core_losses.objectives import BUILTIN_OBJECTIVES
from rlguard.core_losses.registry import list_objectives
from tests.helpers.plugin_install import install_plugin


def test_the_written_out_rows_are_the_classes_own_declarations() -> None:
    declared = entries_of(BUILTIN_OBJECTIVES)
    assert list(BUILTIN) == declared, "paste into rlguard/core_losses/catalogue.py:\n" + pprint.pformat(declared)
    assert set(SHARED_OPTIONS) == set(Objective.hyperparameters())


def test_the_catalogue_lists_every_registered_objective() -> None:
    assert [e.name for e in objective_catalogue()] == list_objectives()


PLUGIN = """
from dataclasses import dataclass

import torch

from rlguard.core_losses import Objective
from rlguard.core_losses.ratios import Surrogate
from rlguard.hookspecs import hookimpl


@dataclass(frozen=True, kw_only=True)
class CatalogueBandPG(Objective):
    name = "catalogue_band_pg"
    summary = "-A clip(r, 1 - band, 1 + band)"
    band: float = 0.1

    def surrogate(self, log_ratio, batch, mask):
        ratio = torch.exp(log_ratio)  # (B, T)
        return Surrogate(loss=-batch.advantages * ratio.clamp(1 - self.band, 1 + self.band))


@hookimpl
def rlguard_add_objectives():
    return [CatalogueBandPG]
"""


def test_an_installed_plugin_s_objective_is_listed_from_its_class(tmp_path: Path) -> None:
    env = install_plugin(tmp_path, "catalogue_plugin", PLUGIN)
    proc = subprocess.run(
        [sys.executable, "-m", "rlguard", "losses", "--json"], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert rows["catalogue_band_pg"] == {
        "name": "catalogue_band_pg",
        "paper": "",
        "aggregation": "token-mean",  # Objective's default
        "defaults": {"band": 0.1},
        "summary": "-A clip(r, 1 - band, 1 + band)",
    }
    assert {e.name for e in BUILTIN} < set(rows)
