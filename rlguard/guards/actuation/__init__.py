"""Acting on a decision: the actuator contract (:mod:`.contract`), the one executor (:mod:`.executor`), rollback
snapshots and their budget (:mod:`.snapshot`, :mod:`.budget`), the size of the last update (:mod:`.update_meter`) and
the plain-torch actuator (:mod:`.torch_actuator`).

The torch-backed names (``TorchActuator``, ``ModelSnapshot``, ``snapshot_cost``) load on first use (PEP 562), so
the contract and the executor import without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlguard._lazy import lazy
from rlguard.guards.actuation.budget import SnapshotBudgetError, SnapshotCost, check_snapshot_budget
from rlguard.guards.actuation.contract import (
    CAPABILITIES,
    OUTCOME_CAPABILITY,
    Actuator,
    Applied,
    Capability,
    check_capabilities,
)
from rlguard.guards.actuation.executor import apply_decision, bind_guard
from rlguard.guards.events import EVENTS_FILE
from rlguard.guards.state import GUARD_STATE_FILE

if TYPE_CHECKING:
    from rlguard.guards.actuation.snapshot import ModelSnapshot, snapshot_cost
    from rlguard.guards.actuation.torch_actuator import TorchActuator
    from rlguard.guards.actuation.update_meter import UpdateMeter

_TORCH_NAMES = {
    "ModelSnapshot": "rlguard.guards.actuation.snapshot",
    "snapshot_cost": "rlguard.guards.actuation.snapshot",
    "TorchActuator": "rlguard.guards.actuation.torch_actuator",
    "UpdateMeter": "rlguard.guards.actuation.update_meter",
}

__all__ = [
    "CAPABILITIES",
    "EVENTS_FILE",
    "GUARD_STATE_FILE",
    "OUTCOME_CAPABILITY",
    "Actuator",
    "Applied",
    "Capability",
    "ModelSnapshot",
    "SnapshotBudgetError",
    "SnapshotCost",
    "TorchActuator",
    "UpdateMeter",
    "apply_decision",
    "bind_guard",
    "check_capabilities",
    "check_snapshot_budget",
    "snapshot_cost",
]


__getattr__ = lazy(__name__, _TORCH_NAMES)
