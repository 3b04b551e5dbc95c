"""Remedies chosen by cause: the guard cures a train-inference gap instead of slowing the run down.

Which intervention answers which diagnosis is the cause table, :data:`~rlguard.guards.interventions.causes.CAUSES`
(shown by ``rlguard detectors``). For a train-inference gap (``mismatch_growth``: the engine's log-probs drift from the
trainer's, through its numerics, a MoE router, or a policy that sampled several updates ago) :class:`MismatchRemedy`
switches on, one rung at a time, the corrections the library already implements:

1. where the loop passes the engine's log-probs beside a pi_old the trainer recomputed (capability
   ``rollout_correction``): token-level truncated importance sampling against the engine, ``min(pi_old / mu, C)``
   with ``C = 2`` (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"),
   then a geometric-mean rejection mask ``[1 / C, C]`` (MIS / IcePop, arXiv 2510.18855);
2. where pi_old *is* the engine's (no recomputation; capability ``kept_gradient``): the ratio ``pi / mu`` carries
   the gap itself, and a hard clip zeroes the gradient of every token the engine's numerics pushed outside the
   clip range; the remedy replaces the clip by a detached weight truncated at the same upper bound,
   ``-sg[min(r, 1 + eps_high)] A log pi`` (CISPO, arXiv 2506.13585), so every token keeps its gradient;
3. when those did not help (capability ``off_policy_mask``; never the first answer): DeepSeek-V3.2's off-policy
   sequence mask (arXiv 2512.02556, eq. 9), which leaves out of the loss every negative-advantage sequence whose
   token mean of ``log mu - log pi`` exceeds ``delta = 0.5`` (``mu`` the engine's log-probs where the loop passes
   them, else pi_old), the samples the gap and the updates made most off-policy;
4. the LR back-off, last: ``x0.5`` per further failure, down to ``x0.05``.

When the first correction switches on depends on where the gap acts (``first_on="auto"``). Where pi_old is the
engine's, the gap is in the clipped ratio and the clip zeroes the gradient of the tokens it pushed out, from the
first step on: the first correction switches on at the gap's finding. Where the trainer recomputes pi_old, the ratio
and its trust region measure the update alone and the gap only biases the gradient (samples drawn from the engine,
not from pi_old); TIS removes that bias at the price of variance (truncated weights of up to ``C``), which a run the
bias does not hurt pays for nothing (measured on the long-completion benchmark: ``benchmarks/README.md``,
"Remedies under train-inference mismatch"). There it
switches on at the first critical finding of a consequence detector (``escalate_on``: reward, entropy or KL control
lost, the ratio or the gradient exploding) once the gap has been diagnosed; ``first_on="gap"`` switches it on at the
gap's finding in both conventions, as Yao et al. run TIS from the first step. The off-policy mask and the LR
back-off are never the first answer: with no correction to switch, the gap alone changes nothing. Every later rung
switches only when the one before did not help: a critical consequence at least ``trial_steps`` after the last
switch. An objective whose clip zeroes no gradient (CISPO, SAPO: ``Objective.keeps_gradient``) has nothing to switch
in rung 2, so a run that learns through the gap is left alone until it shows trouble. A user forbids a remedy by
leaving it out of ``remedies`` (``GuardConfig(interventions={"mismatch_remedy": {"remedies": ("rollout_is",)}})``)
or switches the intervention off with ``None``. A switched remedy stays on (the gap is the engine's and comes back
with every rollout); every switch is an ``action:set_clip`` (or ``action:scale_lr``) event whose reason names the
cause.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from rlguard.guards.events import SEVERITY_LEVEL, Severity
from rlguard.guards.interventions.base import CONSEQUENCES, Intervention, Proposal, StepContext, findings_at_least

__all__ = ["REMEDIES", "MismatchRemedy"]

#: each remedy of :class:`MismatchRemedy`: the actuator capability it needs and what it is
REMEDIES: dict[str, tuple[str, str]] = {
    "rollout_is": ("rollout_correction", "token-level truncated IS against the engine's log-probs, cap 2 (TIS)"),
    "rollout_mask": ("rollout_mask", "geometric-mean rejection mask [1/2, 2] against the engine (IcePop MIS)"),
    "kept_gradient": ("kept_gradient", "the hard clip becomes a weight truncated at its upper bound (CISPO's form)"),
    "off_policy_mask": (
        "off_policy_mask",
        "negative-advantage sequences drifted > 0.5 nats per token left out (DeepSeek-V3.2's off-policy mask)",
    ),
    "lr_backoff": ("lr_scale", "LR x0.5 per further failure, down to x0.05"),
}

#: the remedies that only follow one that did not help, never the first answer to the gap
_ESCALATION_ONLY = frozenset({"off_policy_mask", "lr_backoff"})


@dataclass(kw_only=True)
class MismatchRemedy(Intervention):
    """Cure a train-inference gap with the correction its shape calls for, escalating only when it does not help
    (module docstring).

    Attributes:
        on: the detector that diagnoses the gap.
        severity: the least severity of its finding that switches the first remedy on (that arms it, where it
            waits for a consequence).
        first_on: when the first remedy switches on: ``"gap"`` at the gap's finding, ``"consequence"`` at the
            first critical finding of ``escalate_on`` once the gap has been diagnosed, ``"auto"`` (the default)
            at the gap where pi_old is the engine's and on a consequence where the trainer recomputes it
            (module docstring).
        remedies: the remedies allowed, in the order they are tried (:data:`REMEDIES`); those the actuator cannot
            carry out are passed over.
        escalate_on: consequence detectors whose critical finding, ``trial_steps`` or more after the last switch,
            means the remedy did not help.
        trial_steps: steps a remedy is given before a consequence counts against it.
        rollout_is_cap: the cap ``C`` of truncated IS (TIS uses 2).
        rollout_mask_high: ``C`` of the geometric mask ``[1 / C, C]``.
        off_policy_mask_delta: ``delta`` of DeepSeek-V3.2's off-policy sequence mask, in nats per token. The
            paper publishes no value; 0.5 is TRL's suggested starting point ("a good starting point could be
            delta = 0.5", TRL's paper index, DeepSeek-V3.2 section, ``docs/source/paper_index.md``; ``GRPOConfig``'s
            ``off_policy_mask_threshold`` help: "e.g., 0.5").
        lr_factor: the LR multiplier of each back-off on the last rung.
        lr_min_scale: the LR scale never goes below this.
    """

    name = "mismatch_remedy"
    enabled_by_default = False
    summary = (
        "on mismatch_growth: kept gradient at once (pi_old = engine's) or TIS then geometric MIS on the gap's "
        "first critical consequence (pi_old recomputed); next rung on a critical consequence >= 10 steps later; "
        "DeepSeek-V3.2's off-policy mask, then LR x0.5 last"
    )

    on: str = "mismatch_growth"
    severity: Severity = "warn"
    first_on: Literal["auto", "gap", "consequence"] = "auto"
    remedies: tuple[str, ...] = ("rollout_is", "rollout_mask", "kept_gradient", "off_policy_mask", "lr_backoff")
    escalate_on: tuple[str, ...] = CONSEQUENCES
    trial_steps: int = 10
    rollout_is_cap: float = 2.0
    rollout_mask_high: float = 2.0
    off_policy_mask_delta: float = 0.5
    lr_factor: float = 0.5
    lr_min_scale: float = 0.05

    def __post_init__(self) -> None:
        unknown = [r for r in self.remedies if r not in REMEDIES]
        if unknown:
            raise ValueError(f"mismatch_remedy.remedies: unknown {unknown}; known: {list(REMEDIES)}.")
        if self.first_on not in ("auto", "gap", "consequence"):
            raise ValueError(
                f"mismatch_remedy.first_on={self.first_on!r}: use 'auto' (the default), 'gap' or 'consequence'."
            )
        if len(set(self.remedies)) != len(self.remedies):
            raise ValueError(f"mismatch_remedy.remedies names a remedy twice: {list(self.remedies)}.")
        if self.trial_steps < 1 or self.rollout_is_cap < 1 or self.rollout_mask_high < 1:
            raise ValueError("mismatch_remedy needs trial_steps >= 1, rollout_is_cap >= 1 and rollout_mask_high >= 1.")
        delta = self.off_policy_mask_delta
        if isinstance(delta, bool) or not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta >= 0):
            raise ValueError(f"mismatch_remedy.off_policy_mask_delta must be a finite number >= 0; got {delta!r}.")
        if not (0 < self.lr_factor < 1 and 0 < self.lr_min_scale <= 1):
            raise ValueError("mismatch_remedy needs 0 < lr_factor < 1 and 0 < lr_min_scale <= 1.")
        self._s_active = ""  # the remedies switched on, comma-separated (state is numbers and strings)
        self._s_last_switch: int | None = None
        self._s_gap_step: int | None = None  # the step the gap was first diagnosed at
        self._s_lr_scale = 1.0

    def ladder(self, capabilities: frozenset[str] | None) -> list[str]:
        """The remedies this actuator can carry out, in order (all of them for a guard bound to none)."""
        return [r for r in self.remedies if capabilities is None or REMEDIES[r][0] in capabilities]

    @property
    def active(self) -> tuple[str, ...]:
        """The remedies switched on so far, in order."""
        return tuple(self._s_active.split(",")) if self._s_active else ()

    def controls(self) -> dict[str, Any]:
        """The controls of the remedies switched on."""
        out: dict[str, Any] = {}
        active = self.active
        if "kept_gradient" in active:
            out["kept_gradient"] = True
        if "rollout_is" in active:
            out["rollout_is_cap"] = self.rollout_is_cap
        if "rollout_mask" in active:
            out["rollout_mask_high"] = self.rollout_mask_high
        if "off_policy_mask" in active:
            out["off_policy_mask_delta"] = self.off_policy_mask_delta
        if "lr_backoff" in active:
            out["lr_scale"] = self._s_lr_scale
        return out

    def propose(self, ctx: StepContext) -> Proposal | None:
        active = self.active
        ladder = [r for r in self.ladder(ctx.capabilities) if r not in active]
        if not active:
            finding = ctx.findings.get(self.on)
            # the off-policy mask and the LR back-off never answer the gap itself: only a remedy that did not help
            cures = [r for r in ladder if r not in _ESCALATION_ONLY]
            diagnosed = finding is not None and SEVERITY_LEVEL[finding.severity] >= SEVERITY_LEVEL[self.severity]
            if diagnosed and self._s_gap_step is None:
                self._s_gap_step = ctx.step
            if self._s_gap_step is None or not cures:
                return None
            if self.waits_for_consequence(ctx):
                trouble = findings_at_least(ctx.findings, self.escalate_on, "critical")
                if not trouble:
                    return None
                cause = f"train-inference gap (diagnosed at step {self._s_gap_step}) with {', '.join(trouble)}"
            elif finding is not None and diagnosed:
                cause = f"train-inference gap ({self.on}: {finding.message.split('. ')[0]})"
            else:
                return None
            return self._switch(ctx.step, cures[0], cause)
        proposal = Proposal(controls=self.controls())
        trouble = findings_at_least(ctx.findings, self.escalate_on, "critical")
        waited = self._s_last_switch is None or ctx.step - self._s_last_switch >= self.trial_steps
        if not (trouble and waited):
            return proposal
        cause = f"{', '.join(active)} did not help ({', '.join(trouble)})"
        if ladder:
            return self._switch(ctx.step, ladder[0], cause)
        if "lr_backoff" in active and self._s_lr_scale > self.lr_min_scale:
            self._s_lr_scale = max(self._s_lr_scale * self.lr_factor, self.lr_min_scale)
            self._s_last_switch = ctx.step
            return Proposal("step", f"{cause}: LR x{self._s_lr_scale:.3g}", self.controls())
        return proposal

    def waits_for_consequence(self, ctx: StepContext) -> bool:
        """Whether the first remedy waits for a critical consequence of the gap (``first_on``)."""
        return self.first_on == "consequence" or (self.first_on == "auto" and ctx.pi_old_recomputed)

    def _switch(self, step: int, remedy: str, cause: str) -> Proposal:
        self._s_active = ",".join((*self.active, remedy))
        self._s_last_switch = step
        if remedy == "lr_backoff":
            self._s_lr_scale = self.lr_factor
        what = REMEDIES[remedy][1] if remedy != "lr_backoff" else f"LR x{self._s_lr_scale:.3g}"
        return Proposal("step", f"{cause}: {remedy} on ({what})", self.controls())

    def on_rollback(self, step: int) -> None:
        # the gap is the engine's, not the weights': the remedies stay on after a rollback
        self._s_last_switch = step
