"""``rlguard.core_losses.catalogue``: the objectives' declarations, written out so that ``rlguard losses`` needs no
torch, are exactly what the classes declare (a class changed without its row fails here, with the rows to paste)."""

from __future__ import annotations

import pprint

from rlguard.core_losses.catalogue import BUILTIN, SHARED_OPTIONS, entries_of, objective_catalogue
from rlguard.core_losses.objective import Objective
from rlguard.core_losses.objectives import BUILTIN_OBJECTIVES
from rlguard.core_losses.registry import list_objectives


def test_the_written_out_rows_are_the_classes_own_declarations() -> None:
    declared = entries_of(BUILTIN_OBJECTIVES)
    assert list(BUILTIN) == declared, "paste into rlguard/core_losses/catalogue.py:\n" + pprint.pformat(declared)
    assert set(SHARED_OPTIONS) == set(Objective.hyperparameters())


def test_the_catalogue_lists_every_registered_objective() -> None:
    assert [e.name for e in objective_catalogue()] == list_objectives()
