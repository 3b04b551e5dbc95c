"""Interventions: each proposes an outcome and controls for the step (a :class:`Proposal`) from the detectors'
findings and alarms.

The guard acts on the proposal that comes first in ``halt > rollback > skip > a step that changes the LR > a step
that changes the clip range > a step`` (:data:`~rlguard.guards.decision.LOGGED_ACTIONS`); the LR and clip scales of
all interventions are carried in the decision's controls whatever the outcome. Interventions are keyword-only
dataclasses with private state (``_s_*``) saved in ``state_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from rlguard.guards.decision import Proposal
from rlguard.guards.events import SEVERITY_LEVEL, Finding, Severity
from rlguard.guards.state import PrivateState

__all__ = [
    "BUILTIN_INTERVENTIONS",
    "ClipController",
    "Halt",
    "Intervention",
    "LRBackoff",
    "Proposal",
    "Rollback",
    "SkipStep",
    "StepContext",
]


@dataclass(frozen=True)
class StepContext:
    """What interventions see.

    Attributes:
        step: the optimizer step.
        stats: the reduced stats.
        findings: this step's findings by detector (after warm-up, before patience).
        alarms: raised alarms by detector (after patience and hysteresis).
        alarm_age: steps each raised alarm has been at ``critical`` (0 if only ``warn``).
        consecutive_skips: steps skipped in a row before this one.
        last_healthy_step: the last step with no finding and no alarm, or None.
        capabilities: what the bound actuator can do (``Actuator.capabilities``); None for a guard bound to none.
    """

    step: int
    stats: Mapping[str, float]
    findings: Mapping[str, Finding]
    alarms: Mapping[str, Severity]
    alarm_age: Mapping[str, int]
    consecutive_skips: int
    last_healthy_step: int | None
    capabilities: frozenset[str] | None = None

    def gap_in_ratio(self, explained_by: tuple[str, ...]) -> bool:
        """Whether a finding of ``explained_by`` (``mismatch_growth``) this step means the ratios to pi_old carry
        the train-inference gap: true unless pi_old is recomputed by the trainer, which the capability
        ``rollout_correction`` declares (the engine's log-probs then arrive beside pi_old, not as pi_old, and the
        ratio measures the update alone)."""
        return not self.pi_old_recomputed and any(n in self.findings for n in explained_by)

    @property
    def pi_old_recomputed(self) -> bool:
        """Whether the trainer recomputes pi_old and passes the engine's log-probs beside it (the actuator
        declares ``rollout_correction``); false for a guard bound to no actuator."""
        return self.capabilities is not None and "rollout_correction" in self.capabilities


@dataclass(kw_only=True)
class Intervention(PrivateState):
    """Base class; subclasses set ``name`` and implement :meth:`propose`.

    ``enabled_by_default = False`` makes an intervention opt-in: it runs only where a
    :class:`~rlguard.guards.GuardConfig` names it (a preset, or the user's config).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    enabled_by_default: ClassVar[bool] = True

    def propose(self, ctx: StepContext) -> Proposal | None:
        """The proposal for this step, or None."""
        raise NotImplementedError

    def on_rollback(self, step: int) -> None:
        """Called when the guard decides to roll back (state that must not survive it)."""

    def answers(self) -> tuple[str, ...]:
        """Detectors whose findings this intervention answers with a cure of their cause (``mismatch_remedy``:
        ``mismatch_growth``); an intervention that holds back on them (``LRBackoff.hold_on``) hands them to it."""
        return ()

    def hand_over(self, answered: frozenset[str]) -> None:
        """Told by the guard which detectors its enabled interventions answer (:meth:`answers`), once, after
        they are built; an intervention holds back only on what another one answers."""


def _hits(findings: Mapping[str, Finding], on: tuple[str, ...], severity: Severity) -> list[str]:
    level = SEVERITY_LEVEL[severity]
    return [n for n in on if n in findings and SEVERITY_LEVEL[findings[n].severity] >= level]


@dataclass(kw_only=True)
class SkipStep(Intervention):
    """Skip the optimizer step when this step's batch is poisoned (non-finite values, a gradient spike, an
    exploding ratio): weights and optimizer state stay as they are.

    Attributes:
        on: detectors whose finding on this very step skips it.
        severity: the least severity that skips.
    """

    name = "skip_step"
    summary = "skip the optimizer step on a critical nonfinite / grad_norm_spike / ratio_explosion finding"

    on: tuple[str, ...] = ("nonfinite", "grad_norm_spike", "ratio_explosion")
    severity: Severity = "critical"

    def propose(self, ctx: StepContext) -> Proposal | None:
        # the step itself decides: the severity the detector observed (``Finding.observed``), not its label by
        # consequence (a lone spike is a warning by consequence, and still a poisoned step)
        level = SEVERITY_LEVEL[self.severity]
        hits = [
            n
            for n in self.on
            if n in ctx.findings and SEVERITY_LEVEL[ctx.findings[n].observed or ctx.findings[n].severity] >= level
        ]
        return Proposal("skip", f"poisoned step ({', '.join(hits)})") if hits else None


@dataclass(kw_only=True)
class LRBackoff(Intervention):
    """Scale the learning rate down on trouble and let it recover after a quiet period.

    Attributes:
        on: detectors whose findings back the LR off.
        severity: the least severity that backs off.
        factor: multiplier per back-off.
        min_scale: the scale never goes below this.
        cooldown: steps between two back-offs.
        quiet_steps: steps without trouble before each recovery step.
        recover_factor: multiplier per recovery step (capped at 1).
        hold_on: detectors whose finding this step hands the LR to the intervention that answers them (``stable``:
            ``mismatch_growth``, whose remedy, ``mismatch_remedy``, backs the LR off as its last rung, after the
            corrections, on a critical consequence): no back-off on such a step. The LR back-off is the last
            answer to a train-inference gap, not the first; a gap also explains the signals themselves (the ratio
            to the engine's pi_old carries it; a biased gradient grows). In a guard, a detector that no enabled
            intervention answers (``"mismatch_remedy": None``) is not held: the back-off acts on it as usual.
    """

    name = "lr_backoff"
    summary = "LR x0.5 on warn from KL/grad/mismatch/clip detectors (>= 10 steps apart); x2 after 20 quiet steps"

    on: tuple[str, ...] = (
        "grad_norm_spike",
        "grad_norm_explosion",
        "kl_ref_blowup",
        "kl_old_blowup",
        "clip_frac_burst",
        "mismatch_growth",
        "ratio_explosion",
        "length_explosion",
    )
    severity: Severity = "warn"
    factor: float = 0.5
    min_scale: float = 0.05
    cooldown: int = 10
    quiet_steps: int = 20
    recover_factor: float = 2.0
    hold_on: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.factor < 1 or not 0 < self.min_scale <= 1 or self.recover_factor <= 1:
            raise ValueError("lr_backoff needs 0 < factor < 1, 0 < min_scale <= 1 and recover_factor > 1.")
        self._s_scale = 1.0
        self._s_last_backoff: int | None = None
        self._s_last_trouble: int | None = None
        self._s_last_recover: int | None = None
        self._held = self.hold_on  # narrowed by the guard to what an enabled intervention answers

    def hand_over(self, answered: frozenset[str]) -> None:
        self._held = tuple(n for n in self.hold_on if n in answered)

    def propose(self, ctx: StepContext) -> Proposal | None:
        hits = _hits(ctx.findings, self.on, self.severity)
        if hits and any(n in ctx.findings for n in self._held):
            return Proposal(controls={"lr_scale": self._s_scale})
        if hits:
            self._s_last_trouble = ctx.step
            ready = self._s_last_backoff is None or ctx.step - self._s_last_backoff >= self.cooldown
            if ready and self._s_scale > self.min_scale:
                self._s_scale = max(self._s_scale * self.factor, self.min_scale)
                self._s_last_backoff = ctx.step
                return Proposal("step", f"LR x{self._s_scale:.3g} ({', '.join(hits)})", {"lr_scale": self._s_scale})
            return Proposal(controls={"lr_scale": self._s_scale})
        if self._s_scale < 1.0:
            since = [s for s in (self._s_last_trouble, self._s_last_recover) if s is not None]
            if not since or ctx.step - max(since) >= self.quiet_steps:
                self._s_scale = min(self._s_scale * self.recover_factor, 1.0)
                self._s_last_recover = ctx.step
                return Proposal("step", f"LR recovering to x{self._s_scale:.3g}", {"lr_scale": self._s_scale})
        return Proposal(controls={"lr_scale": self._s_scale})


@dataclass(kw_only=True)
class ClipController(Intervention):
    """The dynamic stability boundary: scale the clip range so that ``metric`` stays near ``target``, the way
    PPO's adaptive KL coefficient keeps the KL near its target (Schulman et al. 2017, sec. 4):
    ``scale /= factor`` when ``metric > target * tolerance``, ``scale *= factor`` when
    ``metric < target / tolerance``, within ``[min_scale, max_scale]``.

    Attributes:
        metric: the divergence to control (``kl_old``: KL from the behaviour policy).
        target: its target value.
        tolerance: the band ``[target / tolerance, target * tolerance]`` leaves the scale alone.
        factor: multiplicative step of the scale.
        min_scale: tightest scale (of the objective's configured clip range).
        max_scale: widest scale; 1.0 never widens beyond the configured range.
        floor: values at or below it leave the scale alone: the on-policy first optimizer step of each batch has
            ``kl_old = 0`` whatever the update size, and would otherwise relax the range every other step.
        hold_on: detectors whose finding this step holds the scale where it is: a divergence they explain is not
            the step's (``stable``: ``mismatch_growth``: where pi_old is the engine's, ``kl_old`` measures the gap
            to the engine, not the update; :meth:`StepContext.gap_in_ratio`).
    """

    name = "clip_controller"
    summary = "clip range x1/1.5 when kl_old > 1.5 x target (0.02), x1.5 back when < target/1.5; scale in [0.25, 1]"

    metric: str = "kl_old"
    target: float = 0.02
    tolerance: float = 1.5
    factor: float = 1.5
    min_scale: float = 0.25
    max_scale: float = 1.0
    floor: float = 1e-8
    hold_on: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.target <= 0 or self.tolerance <= 1 or self.factor <= 1 or not 0 < self.min_scale <= self.max_scale:
            raise ValueError("clip_controller needs target > 0, tolerance > 1, factor > 1, 0 < min_scale <= max_scale.")
        self._s_scale = 1.0

    def propose(self, ctx: StepContext) -> Proposal | None:
        value = ctx.stats.get(self.metric)
        held = ctx.gap_in_ratio(self.hold_on)
        if value is None or value != value or value <= self.floor or held:
            return Proposal(controls={"clip_scale": self._s_scale})
        old = self._s_scale
        if value > self.target * self.tolerance:
            self._s_scale = max(old / self.factor, self.min_scale)
        elif value < self.target / self.tolerance:
            self._s_scale = min(old * self.factor, self.max_scale)
        if self._s_scale != old:
            verb = "tighten" if self._s_scale < old else "relax"
            return Proposal(
                "step",
                f"{verb} clip range to x{self._s_scale:.3g} ({self.metric}={value:.3g}, target {self.target:g})",
                {"clip_scale": self._s_scale},
            )
        return Proposal(controls={"clip_scale": self._s_scale})


@dataclass(kw_only=True)
class Rollback(Intervention):
    """Roll model and optimizer back to the last healthy snapshot on a critical alarm of a slow failure
    (collapse cannot be undone by skipping a step), or after too many skipped steps in a row.

    Attributes:
        on: detectors whose critical alarm rolls back.
        max_consecutive_skips: skipped steps in a row that also roll back.
        max_rollbacks: after this many rollbacks the guard halts instead.
    """

    name = "rollback"
    summary = "roll back on critical entropy/reward collapse, KL blow-up or repetition, or 3 skips in a row"

    on: tuple[str, ...] = ("entropy_collapse", "reward_collapse", "kl_ref_blowup", "repetition", "mismatch_growth")
    max_consecutive_skips: int = 3
    max_rollbacks: int = 3

    def __post_init__(self) -> None:
        self._s_rollbacks = 0

    def propose(self, ctx: StepContext) -> Proposal | None:
        critical = [n for n in self.on if ctx.alarms.get(n) == "critical"]
        skips = ctx.consecutive_skips >= self.max_consecutive_skips
        if not critical and not skips:
            return None
        why = ", ".join(critical) if critical else f"{ctx.consecutive_skips} skipped steps in a row"
        if self._s_rollbacks >= self.max_rollbacks:
            return Proposal("halt", f"{why}; {self._s_rollbacks} rollbacks did not help")
        if ctx.last_healthy_step is None:
            return Proposal("halt", f"{why}; no healthy snapshot to roll back to")
        self._s_rollbacks += 1
        return Proposal("rollback", why, rollback_to=ctx.last_healthy_step)


@dataclass(kw_only=True)
class Halt(Intervention):
    """Stop the run with a report when a critical alarm persists despite the other interventions.

    Attributes:
        critical_steps: steps a critical alarm may last before the run halts.
        ignore: detectors whose persistent alarms do not halt (data-side problems such as easy prompts).
    """

    name = "halt"
    summary = "halt when any critical alarm persists 25 steps (zero_variance_groups and truncation excepted)"

    critical_steps: int = 25
    ignore: tuple[str, ...] = ("zero_variance_groups", "truncation")

    def propose(self, ctx: StepContext) -> Proposal | None:
        stuck = [n for n, age in ctx.alarm_age.items() if age >= self.critical_steps and n not in self.ignore]
        return Proposal("halt", f"critical for {self.critical_steps}+ steps: {', '.join(stuck)}") if stuck else None


BUILTIN_INTERVENTIONS: tuple[type[Intervention], ...] = (SkipStep, LRBackoff, ClipController, Rollback, Halt)
