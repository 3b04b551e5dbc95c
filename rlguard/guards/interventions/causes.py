"""The cause table: each diagnosis, the detectors that make it, and the intervention that answers it.

One table drives both what the guard does and what ``rlguard detectors`` prints: while a cause's detectors find
something and its answering intervention is enabled, the interventions named in ``yields`` hold back on that step
(:meth:`~rlguard.guards.interventions.base.StepContext.yields`): the LR back-off leaves a train-inference gap to
``mismatch_remedy``, whose last rung is itself an LR back-off, after the corrections. Where the answering
intervention is switched off (``"mismatch_remedy": None``), nobody yields and the others act as usual.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["CAUSES", "Cause", "handed_over"]


@dataclass(frozen=True)
class Cause:
    """One row of the cause table.

    Attributes:
        diagnosis: the cause, in words.
        detectors: the detectors whose findings diagnose it; empty where the answering intervention reads a stat
            itself (``evidence``).
        answer: the intervention that answers it.
        remedies: what that intervention does about it, in the order it tries (shown by ``rlguard detectors``).
        yields: the interventions that hold back while the cause is found and ``answer`` is enabled.
        evidence: the stat the answering intervention reads, where no detector diagnoses the cause.
    """

    diagnosis: str
    detectors: tuple[str, ...]
    answer: str
    remedies: str
    yields: tuple[str, ...] = ()
    evidence: str = ""

    @property
    def diagnosed_by(self) -> str:
        """The detectors, or the stat read where there is none, in words."""
        return ", ".join(self.detectors) if self.detectors else f"{self.evidence} (no detector)"


CAUSES: tuple[Cause, ...] = (
    Cause(
        "train-inference gap, pi_old recomputed by the trainer",
        ("mismatch_growth",),
        "mismatch_remedy",
        "rollout_is on the gap's first critical consequence, then rollout_mask (where the loop applies it), "
        "then kept_gradient, then off_policy_mask, then lr_backoff",
        yields=("lr_backoff",),
    ),
    Cause(
        "train-inference gap or stale sampler, pi_old = the engine's log-probs",
        ("mismatch_growth",),
        "mismatch_remedy",
        "kept_gradient at the gap, then off_policy_mask, then lr_backoff",
        yields=("lr_backoff",),
    ),
    Cause(
        "stale samples: the train-inference gap grows with the samples' age (asynchronous pipelines)",
        (),
        "staleness_remedy",
        "kept_gradient (pi_old = the engine's) or rollout_is on a critical consequence (pi_old recomputed), then "
        "the pipeline's staleness bound halved per critical consequence (lower_bound: max_staleness; drop_stale: "
        "over-age samples dropped by the framework), doubled back after recovery",
        evidence="mismatch_logp_abs_mean_age*",
    ),
    Cause("too large a step", (), "trust_region", "trust region on the LR", evidence="update_ratio"),
    Cause(
        "entropy collapse", ("entropy_collapse",), "entropy_control", "clip-higher (upper clip bound x1.2, up to x1.44)"
    ),
    Cause(
        "entropy below a set target", (), "adaptive_entropy", "adaptive entropy bonus (Skywork-OR1)", evidence="entropy"
    ),
    Cause("poisoned batch", ("nonfinite", "grad_norm_spike", "ratio_explosion"), "skip_step", "skip the step"),
    Cause(
        "batch without policy-gradient signal: every group's rewards equal, so every group-relative advantage is 0 "
        "(GRPO, arXiv 2402.03300, sec. 4.1.2)",
        (),
        "skip_no_signal",
        "skip the step, as DAPO's dynamic sampling drops such prompts (arXiv 2503.14476, sec. 3.2); not counted "
        "toward the skips in a row that roll back",
        evidence="frac_zero_std_groups",
    ),
    Cause(
        "slow collapse",
        (
            "reward_collapse",
            "entropy_collapse",
            "entropy_blowup",
            "kl_ref_blowup",
            "length_collapse",
            "length_explosion",
            "repetition",
        ),
        "recovery",
        "rollback that learns",
    ),
)


def handed_over(enabled: Collection[str], causes: tuple[Cause, ...] = CAUSES) -> dict[str, frozenset[str]]:
    """Intervention -> the detectors whose findings it leaves to another enabled intervention (``enabled``: the
    names of a guard's interventions), from ``causes``."""
    out: dict[str, set[str]] = {}
    for cause in causes:
        if cause.answer not in enabled:
            continue
        for name in cause.yields:
            if name != cause.answer:
                out.setdefault(name, set()).update(cause.detectors)
    return {name: frozenset(detectors) for name, detectors in out.items()}
