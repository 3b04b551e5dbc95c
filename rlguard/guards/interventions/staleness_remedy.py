"""Remedies for stale samples: an asynchronous pipeline's train-inference gap that grows with the samples' age.

In an asynchronous pipeline (TRL's ``AsyncGRPOTrainer``, verl's fully async and one-step-off trainers) a sample's
log-probs were computed by the policy of ``age`` versions ago. Its gap ``|log p_trainer - log p_rollout|`` is the
engine's numerics at age 0 and the policy's drift since sampling on top of that above it (the gap by age bucket,
:data:`rlguard.metrics.STALENESS_BUCKETS`, :mod:`rlguard.guards.stats.staleness`). :class:`StalenessRemedy`
diagnoses staleness, not the engine, when the gap of an older bucket exceeds the age-0 gap by at least the drift
that matters, and is at least ``min_ratio`` times it (2: the drift is at least the engine's own share). The drift
that matters is the smaller of ``min_excess`` nats per token (0.08: the bound at which ``mismatch_growth`` warns of a
mean |log-prob gap|, so the drift alone is a gap the guard would warn of) and the objective's own trust region,
``clip_log_width`` (:meth:`~rlguard.core_losses.Objective.clip_log_width`, the clip range in force, its narrower
side in log-ratio units, which the objective reports among its stats): a drift that wide puts a typical stale sample
outside the clip, where its gradient is zeroed, however small it is next to the engine's warn level (GSPO's sequence
clip, 3e-4, against a drift of 0.01-0.03 nats per token at ages 1-3 on the long benchmark). A gap that is as large at
age 0 is the engine's, answered by ``mismatch_remedy``. Then, one rung at a time, each a capability an actuator
declares:

1. an age-aware correction with the controls the library already has: where pi_old is the engine's, the kept
   gradient (``kept_gradient``: the hard clip zeroes the gradient of exactly the tokens the drift pushed out of the
   clip range, the older samples' most); where the trainer recomputes pi_old, token-level truncated IS against the
   engine (``rollout_correction``, TIS cap 2), on the first critical consequence as ``mismatch_remedy`` does. Both
   weigh each token by its own drift, which grows with its sample's age;
2. on a critical consequence ``trial_steps`` or more after the last switch: the pipeline's staleness bound halved
   (``staleness_bound``: ``Controls.max_staleness``, TRL's ``max_staleness``), and the samples over it dropped by
   the framework's own mechanism (``drop_stale``: ``Controls.stale_drop_age``), per further failure down to
   ``min_bound`` (1: a one-step-off pipeline, which still overlaps generation and training);
3. after ``recovery_steps`` steps with no critical consequence the bound is doubled back, up to the configured
   one (the controls then leave it as configured): a lower bound costs the pipeline its throughput, paid only
   while the gap's consequence lasts.

Every change of the bound, lowered or doubled back, is an ``action:set_clip`` event whose reason says
``staleness bound <before> -> <after>``; the step that puts it back as configured proposes the bound's controls as
None, which announces the change (:class:`~rlguard.guards.decision.Proposal`).

Measured on the long-completion benchmark's ``async<A>`` stressors: ``benchmarks/README.md`` ("Asynchronous
pipelines").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlguard.guards.interventions.base import CONSEQUENCES, Intervention, Proposal, StepContext, findings_at_least
from rlguard.metrics import STALENESS_BUCKETS

__all__ = ["STALENESS_REMEDIES", "StalenessRemedy"]

#: each remedy of :class:`StalenessRemedy`: the actuator capability it needs and what it is
STALENESS_REMEDIES: dict[str, tuple[str, str]] = {
    "rollout_is": ("rollout_correction", "token-level truncated IS against the engine's log-probs, cap 2 (TIS)"),
    "kept_gradient": ("kept_gradient", "the hard clip becomes a weight truncated at its upper bound (CISPO's form)"),
    "lower_bound": ("staleness_bound", "the pipeline's staleness bound halved, down to 1; doubled back on recovery"),
    "drop_stale": ("drop_stale", "samples older than the lowered bound dropped by the framework's own mechanism"),
}
_CORRECTIONS = ("rollout_is", "kept_gradient")
_BOUNDS = ("lower_bound", "drop_stale")
_BOUND_CONTROLS = {"lower_bound": "max_staleness", "drop_stale": "stale_drop_age"}  # remedy -> its control
_AGE0 = STALENESS_BUCKETS[0][0]


@dataclass(kw_only=True)
class StalenessRemedy(Intervention):
    """Cure a gap that grows with the samples' age: an age-aware correction, then a lower staleness bound while
    the gap's consequence lasts (module docstring).

    Attributes:
        remedies: the remedies allowed (:data:`STALENESS_REMEDIES`); those the actuator cannot carry out are passed
            over.
        min_excess: nats per token by which an older bucket's gap must exceed the age-0 gap (``mismatch_growth``'s
            warn bound on the mean |log-prob gap|), or the objective's ``clip_log_width`` where that is smaller.
        min_ratio: how many times the age-0 gap an older bucket's gap must be (2: the drift is at least the
            engine's share).
        span: the span of the exponential mean of each bucket's gap, in steps where the bucket is seen
            (``alpha = 2 / (span + 1)``).
        escalate_on: consequence detectors whose critical finding, ``trial_steps`` or more after the last switch,
            means the remedy did not help.
        trial_steps: steps a remedy is given before a consequence counts against it.
        recovery_steps: steps with no critical consequence after which a lowered bound is doubled back.
        min_bound: the bound is never lowered below this many policy versions.
        rollout_is_cap: the cap ``C`` of truncated IS (TIS uses 2).
    """

    name = "staleness_remedy"
    enabled_by_default = False
    summary = (
        "on a gap that grows with age (older bucket >= 2x and +min(0.08, the objective's log clip width) over age "
        "0): kept gradient or TIS; on a "
        "critical consequence >= 10 steps later the staleness bound halved (down to 1), doubled back after 20 "
        "steps without one"
    )

    remedies: tuple[str, ...] = ("rollout_is", "kept_gradient", "lower_bound", "drop_stale")
    min_excess: float = 0.08
    min_ratio: float = 2.0
    span: int = 10
    escalate_on: tuple[str, ...] = CONSEQUENCES
    trial_steps: int = 10
    recovery_steps: int = 20
    min_bound: int = 1
    rollout_is_cap: float = 2.0

    def __post_init__(self) -> None:
        unknown = [r for r in self.remedies if r not in STALENESS_REMEDIES]
        if unknown:
            raise ValueError(f"staleness_remedy.remedies: unknown {unknown}; known: {list(STALENESS_REMEDIES)}.")
        if self.min_ratio < 1 or self.span < 1 or self.trial_steps < 1 or self.recovery_steps < 1:
            raise ValueError("staleness_remedy needs min_ratio >= 1, span >= 1, trial_steps >= 1, recovery_steps >= 1.")
        if self.min_bound < 0 or self.rollout_is_cap < 1 or not math.isfinite(self.min_excess):
            raise ValueError("staleness_remedy needs min_bound >= 0, rollout_is_cap >= 1 and a finite min_excess.")
        for name, _, _ in STALENESS_BUCKETS:
            setattr(self, f"_s_gap_{name}", None)  # exponential mean of the bucket's gap; None: not seen yet
        self._s_clip_width: float | None = None  # the objective's trust region, as it last reported it
        self._s_stale_step: int | None = None  # the step staleness was diagnosed at
        self._s_corrected = ""  # the correction switched on, or ""
        self._s_last_switch: int | None = None
        self._s_configured_bound: int | None = None  # the pipeline's bound before the guard lowered it
        self._s_bound: int | None = None  # the bound in force; None: as configured
        self._s_last_trouble: int | None = None
        self._allowed: frozenset[str] = frozenset(self.remedies)  # this step's, from the actuator's capabilities

    def gap_by_age(self) -> dict[str, float]:
        """The exponential mean of each age bucket's gap seen so far (NaN where not seen)."""
        gaps = {name: getattr(self, f"_s_gap_{name}") for name, _, _ in STALENESS_BUCKETS}
        return {name: math.nan if gap is None else float(gap) for name, gap in gaps.items()}

    def stale(self) -> str | None:
        """The older bucket whose gap grows past the age-0 gap (module docstring), or None."""
        gaps = self.gap_by_age()
        ref = gaps[_AGE0]
        if math.isnan(ref):
            return None  # no on-policy reference: the engine's share is unknown
        excess = self.excess_bound()
        for name, gap in list(gaps.items())[1:]:
            if gap - ref >= excess and gap >= self.min_ratio * ref:
                return name
        return None

    def excess_bound(self) -> float:
        """The drift that matters (module docstring): ``min_excess``, or the objective's last reported
        ``clip_log_width`` where that is smaller."""
        width = self._s_clip_width
        return self.min_excess if width is None else min(self.min_excess, width)

    def controls(self) -> dict[str, Any]:
        """The controls of the remedies in force."""
        out: dict[str, Any] = {}
        if self._s_corrected == "kept_gradient":
            out["kept_gradient"] = True
        elif self._s_corrected == "rollout_is":
            out["rollout_is_cap"] = self.rollout_is_cap
        if self._s_bound is not None:
            out.update({c: self._s_bound for r, c in _BOUND_CONTROLS.items() if r in self._allowed})
        return out

    def propose(self, ctx: StepContext) -> Proposal | None:
        self._observe(ctx.stats)
        self._allowed = self._can(ctx.capabilities)
        trouble = findings_at_least(ctx.findings, self.escalate_on, "critical")
        if trouble:
            self._s_last_trouble = ctx.step
        if self._s_stale_step is None:
            bucket = self.stale()
            if bucket is None:
                return None
            self._s_stale_step = ctx.step
            self._s_last_switch = None
            gaps = self.gap_by_age()
            why = f"stale samples: {bucket} gap {gaps[bucket]:.3g} vs {gaps[_AGE0]:.3g} at age 0 (drift that matters: "
            why += f"{self.excess_bound():.3g})"
            corrections = [r for r in _CORRECTIONS if r in self._allowed]
            pick = "rollout_is" if ctx.pi_old_recomputed and "rollout_is" in corrections else None
            pick = pick or ("kept_gradient" if not ctx.pi_old_recomputed and "kept_gradient" in corrections else None)
            if pick is not None and not (pick == "rollout_is" and not trouble):
                self._s_corrected, self._s_last_switch = pick, ctx.step
                return Proposal("step", f"{why}: {pick} on ({STALENESS_REMEDIES[pick][1]})", self.controls())
            return None
        waited = self._s_last_switch is None or ctx.step - self._s_last_switch >= self.trial_steps
        if trouble and waited:
            return self._escalate(ctx, trouble)
        if self._s_bound is not None and self._recovered(ctx.step):
            return self._restore(ctx.step)
        return Proposal(controls=self.controls())

    def _escalate(self, ctx: StepContext, trouble: list[str]) -> Proposal:
        cause = f"stale samples (diagnosed at step {self._s_stale_step}) with {', '.join(trouble)}"
        if not self._s_corrected and ctx.pi_old_recomputed and "rollout_is" in self._allowed:
            self._s_corrected, self._s_last_switch = "rollout_is", ctx.step
            return Proposal("step", f"{cause}: rollout_is on ({STALENESS_REMEDIES['rollout_is'][1]})", self.controls())
        bounds = [r for r in _BOUNDS if r in self._allowed]
        current = self._s_bound if self._s_bound is not None else self._bound_now(ctx.stats)
        if not bounds or current is None or current <= self.min_bound:
            return Proposal(controls=self.controls())
        if self._s_configured_bound is None:
            self._s_configured_bound = current
        self._s_bound = max(current // 2, self.min_bound)
        self._s_last_switch = ctx.step
        return Proposal("step", f"{cause}: staleness bound {current} -> {self._s_bound}", self.controls())

    def _restore(self, step: int) -> Proposal:
        assert self._s_bound is not None and self._s_configured_bound is not None
        before, doubled = self._s_bound, self._s_bound * 2
        self._s_bound = None if doubled >= self._s_configured_bound else doubled
        self._s_last_switch = self._s_last_trouble = step  # the next doubling waits recovery_steps again
        after = self._s_configured_bound if self._s_bound is None else self._s_bound
        controls: dict[str, Any] = self.controls()
        if self._s_bound is None:  # back as configured: None announces it (an event, as the lowering was)
            controls.update({c: None for r, c in _BOUND_CONTROLS.items() if r in self._allowed})
        return Proposal("step", f"recovered: staleness bound {before} -> {after}", controls)

    def _recovered(self, step: int) -> bool:
        since = self._s_last_trouble if self._s_last_trouble is not None else self._s_last_switch
        return since is not None and step - since >= self.recovery_steps

    def _bound_now(self, stats: Any) -> int | None:
        """The pipeline's bound: as its actuator reports it (``staleness_bound``), else the largest age seen."""
        value = stats.get("staleness_bound", stats.get("staleness_max"))
        return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    def _observe(self, stats: Any) -> None:
        width = stats.get("clip_log_width")
        if isinstance(width, (int, float)) and math.isfinite(width) and width >= 0:
            self._s_clip_width = float(width)
        alpha = 2.0 / (self.span + 1)
        for name, _, _ in STALENESS_BUCKETS:
            value = stats.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                prev = getattr(self, f"_s_gap_{name}")
                setattr(self, f"_s_gap_{name}", float(value) if prev is None else prev + alpha * (value - prev))

    def _can(self, capabilities: frozenset[str] | None) -> frozenset[str]:
        return frozenset(r for r in self.remedies if capabilities is None or STALENESS_REMEDIES[r][0] in capabilities)

    def on_rollback(self, step: int) -> None:
        # the samples stay as old after a rollback: the diagnosis and the remedies in force stay
        self._s_last_switch = step
