"""The verl driver's checkpointed state, ``rlguard_guard.json`` in each ``global_step_<N>`` folder: the guard's
state, the controls and the LR scale in force in the workers, and the checkpoints a rollback discarded; versioned
and validated when read (the file's path in every error)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from numbers import Real
from typing import Any

from rlguard.core_losses import Controls
from rlguard.guards.state import STATE_VERSION, GuardStateError

__all__ = ["driver_state", "read_driver_state"]


def driver_state(
    guard: Mapping[str, Any], controls: Controls, lr_scale: float, discarded: Iterable[int]
) -> dict[str, Any]:
    """The driver's state as written (JSON-ready)."""
    return {
        "version": STATE_VERSION,
        "guard": dict(guard),
        "controls": controls.to_dict(),
        "lr_scale": lr_scale,
        "discarded": sorted(discarded),
    }


def read_driver_state(state: Any, source: str) -> tuple[Mapping[str, Any], Controls, float, set[int]]:
    """The parts of a driver's state file, validated: ``(guard state, controls, LR scale, discarded steps)``. A file
    without ``version`` has this layout too."""
    known = {"version", "guard", "controls", "lr_scale", "discarded"}
    if not isinstance(state, Mapping) or not known - {"version"} <= set(state) <= known:
        found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise GuardStateError(f"{source}: not the verl driver's state: expected the keys {sorted(known)}; got {found}")
    if state.get("version", STATE_VERSION) != STATE_VERSION:
        raise GuardStateError(f"{source}: unsupported version {state['version']!r}; this rlguard reads {STATE_VERSION}")
    lr_scale, discarded = state["lr_scale"], state["discarded"]
    if isinstance(lr_scale, bool) or not isinstance(lr_scale, Real) or not 0 < float(lr_scale) < float("inf"):
        raise GuardStateError(f"{source}: lr_scale: expected a number > 0; got {lr_scale!r:.80}")
    if not isinstance(discarded, list) or any(isinstance(n, bool) or not isinstance(n, int) for n in discarded):
        raise GuardStateError(f"{source}: discarded: expected a list of steps (integers); got {discarded!r:.80}")
    if not isinstance(state["controls"], Mapping):
        raise GuardStateError(f"{source}: controls: expected a JSON object; got {state['controls']!r:.80}")
    try:
        controls = Controls.from_dict(state["controls"])
    except (TypeError, ValueError) as err:
        raise GuardStateError(f"{source}: controls: {err}") from None
    return state["guard"], controls, float(lr_scale), set(discarded)
