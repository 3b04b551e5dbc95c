"""What the guard decides each step: an outcome plus :class:`Controls` (``docs/design.md``, "Actuator contract").

:func:`rlguard.guards.actuation.apply_decision` is the one place where a :class:`Decision` takes effect.

How decisions are logged is fixed, so that every log the doctor reads means the same: the guard's events name the
action of a proposal ``action:<name>`` (:func:`logged_action`), trackers get a decision's action as a number
(``rlguard/guard/action``, :func:`action_code`), both from :data:`LOGGED_ACTIONS`; every adapter logs a decision
under the keys of :func:`tracker_metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

from rlguard.core_losses.controls import Controls
from rlguard.guards.events import SEVERITY_LEVEL, Event

__all__ = [
    "LOGGED_ACTIONS",
    "OUTCOMES",
    "Controls",
    "Decision",
    "Outcome",
    "Proposal",
    "action_code",
    "decision_action",
    "logged_action",
    "tracker_metrics",
]

Outcome = Literal["step", "skip", "rollback", "halt"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

#: The names of actions in the guard's events (``action:<name>``) and, by position, their codes in trackers
#: (``rlguard/guard/action``: 0 ... 5), in order of precedence (the guard acts on the proposal whose action comes
#: last): a step that changes nothing, one that changes the objective's controls (its clip range, or any other
#: control the objective applies: ``set_clip``), one that changes the LR, then the outcomes that drop the update.
#: The doctor and the demo read these names.
LOGGED_ACTIONS: tuple[str, ...] = ("continue", "set_clip", "scale_lr", "skip_step", "rollback", "halt")
_OUTCOME_ACTION: dict[str, str] = {"step": "continue", "skip": "skip_step", "rollback": "rollback", "halt": "halt"}
_ACTION_EVENT = "action:"


@dataclass(frozen=True)
class Proposal:
    """An intervention's verdict for the step: an outcome, why, and the controls it sets.

    Attributes:
        outcome: ``step`` (apply the update), ``skip``, ``rollback`` or ``halt``.
        reason: why. A ``step`` with a reason announces a change of the controls it sets (an event); without one
            it restates its persistent scales.
        controls: the :class:`Controls` it sets, by name (``{"lr_scale": 0.5}``): the guard combines those of all
            interventions (``Controls.combine``: multipliers multiply); the others are left alone. ``None`` for a
            control whose neutral value is None puts it back as configured, which a ``step`` with a reason
            announces as the change it is (a lowered staleness bound restored).
        rollback_to: the healthy step to restore, for ``rollback``.
        poisoned: for ``skip``, whether the batch is poisoned (its update would harm the weights): poisoned skips in
            a row roll back (``Rollback.max_consecutive_skips``). ``False`` for a batch skipped because it carries
            no signal (``skip_no_signal``), which says nothing about the weights.
    """

    outcome: Outcome = "step"
    reason: str = ""
    controls: Mapping[str, float | None] = field(default_factory=dict)
    rollback_to: int | None = None
    poisoned: bool = True

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"Proposal outcome must be one of {list(OUTCOMES)}; got {self.outcome!r}.")
        unknown = [name for name in self.controls if name not in _LOGGED_AS]
        if unknown:
            raise ValueError(f"Proposal controls {unknown} are not controls; known: {list(_LOGGED_AS)}.")
        restorable = [name for name, value in self.controls.items() if value is None and name not in _RESTORABLE]
        if restorable:
            raise ValueError(
                f"Proposal controls {restorable} are None: only a control whose neutral value is None "
                f"({sorted(_RESTORABLE)}) can be put back as configured; propose its neutral value instead."
            )
        # the values' ranges are checked where the guard combines them into the step's Controls
        object.__setattr__(self, "controls", MappingProxyType(dict(self.controls)))


_LOGGED_AS = Controls.logged_as()
_RESTORABLE = frozenset(name for name, neutral in Controls().to_dict().items() if neutral is None)


def logged_action(proposal: Proposal) -> str:
    """The name of ``proposal``'s action in events and its precedence (:data:`LOGGED_ACTIONS`): its outcome's, or,
    for a step with a reason, the change it announces (``scale_lr`` for the LR before ``set_clip`` for the
    objective's controls: ``Controls``' ``logged_as``)."""
    if proposal.outcome != "step" or not proposal.reason:
        return _OUTCOME_ACTION[proposal.outcome]
    announced = [_LOGGED_AS[name] for name in proposal.controls]
    return max(announced, key=LOGGED_ACTIONS.index, default="continue")


@dataclass(frozen=True)
class Decision:
    """What the adapter applies this step, identically on every rank: an outcome plus :class:`Controls`.

    Carried out by :func:`rlguard.guards.actuation.apply_decision`, the one place where a decision takes effect.

    Attributes:
        step: the optimizer step judged.
        outcome: ``step`` (the update is applied), ``skip`` (dropped), ``rollback`` (dropped, and the last snapshot
            restored) or ``halt`` (dropped, and training stops).
        controls: the knobs set from this step on, whatever the outcome.
        rollback_to: the healthy step to restore, for ``rollback``.
        snapshot: this step was healthy and a snapshot is due: save model and optimizer state.
        events: events raised this step.
        reason: why the outcome was taken.
    """

    step: int
    outcome: Outcome = "step"
    controls: Controls = field(default_factory=Controls)
    rollback_to: int | None = None
    snapshot: bool = False
    events: tuple[Event, ...] = ()
    reason: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"Decision outcome must be one of {list(OUTCOMES)}; got {self.outcome!r}.")

    @classmethod
    def _neutral(cls, step: int, controls: Controls, *, snapshot: bool, events: tuple[Event, ...]) -> Decision:
        """``Decision(step=step, controls=controls, snapshot=snapshot, events=events)``: a step with nothing
        proposed (most steps), built without the frozen fields' one ``object.__setattr__`` each (the guard builds
        one at every step): every field set, in the fields' order, as ``__init__`` sets them."""
        decision = object.__new__(cls)
        decision.__dict__.update(
            {
                "step": step,
                "outcome": "step",
                "controls": controls,
                "rollback_to": None,
                "snapshot": snapshot,
                "events": events,
                "reason": "",
            }
        )
        return decision


def decision_action(decision: Decision) -> str:
    """The name ``decision`` is logged under (:data:`LOGGED_ACTIONS`): its outcome's, or, for a step, the change
    its events announce (``scale_lr`` before ``set_clip``), else ``continue``."""
    if decision.outcome != "step":
        return _OUTCOME_ACTION[decision.outcome]
    announced = [
        name
        for e in decision.events
        if e.detector.startswith(_ACTION_EVENT) and (name := e.detector[len(_ACTION_EVENT) :]) in LOGGED_ACTIONS
    ]
    return max(announced, key=LOGGED_ACTIONS.index, default="continue")


def action_code(decision: Decision) -> float:
    """``rlguard/guard/action``: the position of :func:`decision_action` in :data:`LOGGED_ACTIONS` (0 ... 5)."""
    return float(LOGGED_ACTIONS.index(decision_action(decision)))


def tracker_metrics(decision: Decision, *, skipped: bool, rollback_to: int | None, halted: bool) -> dict[str, float]:
    """The tracker's record of ``decision`` once carried out, the same keys in every adapter (TRL's logs, verl's
    loggers). What the framework carried out is given, since an actuator may not do all that was decided:

    - ``rlguard/guard/action``: :func:`action_code` of the decision (what the guard decided);
    - ``rlguard/guard/lr_scale``, ``rlguard/guard/clip_scale``: its controls' LR and clip-range multipliers;
    - ``rlguard/guard/skipped``: 1 where this step's update was dropped by a skip (``skipped``), else 0;
    - ``rlguard/guard/rollback_to``: the step whose snapshot was restored, only where a rollback was carried out
      (``rollback_to``; None: none);
    - ``rlguard/guard/halted``: 1 where training stops at this step (``halted``), else 0;
    - ``rlguard/event/<detector>``: each event of the step, 1 for warn, 2 for critical.
    """
    logged = {
        "rlguard/guard/action": action_code(decision),
        "rlguard/guard/lr_scale": float(decision.controls.lr_scale),
        "rlguard/guard/clip_scale": float(decision.controls.clip_scale),
        "rlguard/guard/skipped": float(skipped),
        "rlguard/guard/halted": float(halted),
    }
    if rollback_to is not None:
        logged["rlguard/guard/rollback_to"] = float(rollback_to)
    logged.update({f"rlguard/event/{e.detector}": float(SEVERITY_LEVEL[e.severity]) for e in decision.events})
    return logged
