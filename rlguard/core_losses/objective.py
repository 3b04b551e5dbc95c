"""The pipeline every objective shares: validate, correct for rollout mismatch, add KL and entropy, aggregate.

An objective is a frozen dataclass: hyper-parameters in the constructor, tensors in ``__call__``. A subclass
supplies only ``surrogate``, its per-token policy term; everything else happens here, once.

An objective also describes itself, in class attributes, for the adapters and the fused path (``docs/design.md``,
"Objectives describe themselves"): the level of its ratio, whether a token's gradient is local to that token,
which fields are its clip bounds (what the guard's clip controls act on, :meth:`Objective.with_controls`), and how
TRL's and verl's settings map onto its fields (:class:`~rlguard.core_losses.translation.Translation`). Nothing
outside this package asks which class an objective is.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from rlguard.core_losses.aggregation import (
    Aggregation,
    Normaliser,
    aggregate,
    check_aggregation,
    check_normaliser,
    masked_max,
    masked_mean,
    masked_min,
)
from rlguard.core_losses.batch import (
    NONFINITE_POLICIES,
    LossOutput,
    NonFinitePolicy,
    PolicyBatch,
    PreparedBatch,
    prepare_batch,
)
from rlguard.core_losses.controls import Controls
from rlguard.core_losses.kl import KL_ESTIMATORS, KLEstimator, k3_from_log_ratio, kl_estimate
from rlguard.core_losses.ratios import Surrogate, seq_log_ratio, token_log_ratio, truncated_weight_surrogate
from rlguard.core_losses.rollout import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_MASK_LEVELS,
    RolloutISLevel,
    RolloutMaskLevel,
    mismatch_metrics,
    off_policy_sequence_keep,
    rejection_keep,
    rollout_log_ratio,
    truncated_is_weights,
)
from rlguard.core_losses.translation import Translation

RatioLevel = Literal["token", "sequence"]


@dataclass(frozen=True, kw_only=True)
class Objective:
    """Base of the GRPO family. Subclasses set ``name``, ``paper`` and implement :meth:`surrogate`.

    Attributes:
        aggregation: how per-token terms become the loss; see :mod:`rlguard.core_losses.aggregation`.
        max_length: the constant of ``seq-mean-token-sum-norm`` (Dr. GRPO); default the batch's ``T``, which
            depends on padding: pass the generation budget (``max_completion_length``/``response_length``).
        beta: coefficient of the KL(pi || pi_ref) penalty added to every token's term; needs ``ref_logprobs``.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (GRPO's); see :mod:`rlguard.core_losses.kl`.
        kl_unbiased: multiply the KL estimate by ``pi/pi_old`` (DeepSeek-V3.2) for off-policy samples.
        entropy_coef: coefficient of an entropy bonus (subtracted from the loss); needs ``entropies``.
        rollout_is: truncated importance sampling against the inference engine, ``"token"``/``"sequence"``.
        rollout_is_cap: the truncation ``C`` of ``rollout_is`` (TIS uses 2).
        rollout_mask: drop tokens/sequences whose engine ratio leaves ``[rollout_mask_low, rollout_mask_high]``:
            ``"token"``, ``"sequence"`` (product) or ``"geometric"`` (per-token geometric mean).
        rollout_mask_low: ``C_min``; default ``1 / rollout_mask_high``.
        rollout_mask_high: ``C_max``.
        off_policy_mask_delta: DeepSeek-V3.2's off-policy sequence masking threshold ``delta`` (None: off). The
            behaviour log-probs are ``rollout_logprobs`` when given, else ``old_logprobs``.
        on_nonfinite: ``"raise"`` (default) or ``"mask"``: drop tokens with NaN/Inf inputs and count them in the
            ``nonfinite`` metric so that a guard can skip the step.
        kept_gradient: replace the objective's hard clip by a detached importance weight truncated at its upper
            ratio bound, ``-sg[min(r, hi)] A log pi`` (CISPO's form, arXiv 2506.13585; :meth:`kept_gradient_surrogate`),
            so that no token's gradient is zeroed by a ratio that the engine's numerics, not the update, moved.
            Ignored by objectives that keep every gradient already (:attr:`keeps_gradient`) or have no upper bound.
            The guard's mismatch remedy sets it (:mod:`rlguard.guards.interventions.mismatch_remedy`).
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    # -- what the objective declares about itself (module docstring) --------------------------------------
    #: the importance ratio it clips or weights: one per token, or one per sequence (GSPO's length-normalised
    #: ratio, GMPO's geometric mean, VESPO's product)
    ratio_level: ClassVar[RatioLevel] = "token"
    #: the registered objective that is this one with one ratio per sequence (GRPO's is GSPO; TRL's
    #: ``importance_sampling_level="sequence"``); None: none
    sequence_variant: ClassVar[str | None] = None
    #: each token's loss gradient depends on that token's log-prob and entropy only, so the fused path may split a
    #: sequence into chunks. Read from the class that defines ``surrogate`` (:meth:`is_token_local`): a subclass
    #: that overrides ``surrogate`` says again whether its term is token-local.
    token_local: ClassVar[bool] = False
    #: each token's term depends on statistics of the whole (micro-)batch (Clip-Cov's and KL-Cov's covariance), which
    #: the fused path, evaluating the objective chunk by chunk, cannot reproduce
    needs_whole_batch: ClassVar[bool] = False
    #: no token's gradient is zeroed by a bound on its ratio (CISPO's truncated weight, SAPO's soft gate): the
    #: ``kept_gradient`` remedy leaves it as it is
    keeps_gradient: ClassVar[bool] = False
    #: the fields of its lower and upper clip bound, on which the guard's clip controls act (:meth:`with_controls`)
    clip_bounds: ClassVar[tuple[str, str] | None] = None
    #: how TRL's ``GRPOConfig`` and verl's actor config set its fields (common settings such as ``beta`` and the
    #: aggregation of TRL's ``loss_type`` are the adapters' own)
    trl: ClassVar[Translation] = Translation()
    verl: ClassVar[Translation] = Translation(fields={"aggregation": "loss_agg_mode"})

    aggregation: Aggregation = "token-mean"
    max_length: int | None = None
    beta: float = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_unbiased: bool = False
    entropy_coef: float = 0.0
    rollout_is: RolloutISLevel | None = None
    rollout_is_cap: float = 2.0
    rollout_mask: RolloutMaskLevel | None = None
    rollout_mask_low: float | None = None
    rollout_mask_high: float = 2.0
    off_policy_mask_delta: float | None = None
    on_nonfinite: NonFinitePolicy = "raise"
    kept_gradient: bool = False

    def __post_init__(self) -> None:
        check_aggregation(self.aggregation)
        if self.max_length is not None and (isinstance(self.max_length, bool) or self.max_length < 1):
            raise ValueError(f"max_length must be a positive int (the generation budget); got {self.max_length!r}.")
        _check_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _check_choice("rollout_is", self.rollout_is, (*ROLLOUT_IS_LEVELS, None))
        _check_choice("rollout_mask", self.rollout_mask, (*ROLLOUT_MASK_LEVELS, None))
        _check_choice("on_nonfinite", self.on_nonfinite, NONFINITE_POLICIES)
        _check_range("beta", self.beta, low=0.0)
        _check_range("entropy_coef", self.entropy_coef, low=0.0)
        _check_range("rollout_is_cap", self.rollout_is_cap, low=0.0, strict=True)
        _check_range("rollout_mask_high", self.rollout_mask_high, low=0.0, strict=True)
        if self.rollout_mask_low is not None:
            _check_range("rollout_mask_low", self.rollout_mask_low, low=0.0)
            if self.rollout_mask_low > self.rollout_mask_high:
                raise ValueError(
                    f"rollout_mask_low ({self.rollout_mask_low}) must not exceed rollout_mask_high "
                    f"({self.rollout_mask_high})."
                )
        if self.off_policy_mask_delta is not None:
            _check_range("off_policy_mask_delta", self.off_policy_mask_delta, low=0.0)
        if not isinstance(self.kept_gradient, bool):
            raise ValueError(f"kept_gradient must be True or False; got {self.kept_gradient!r}.")

    # -- to implement -------------------------------------------------------------------------------------
    def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        """Per-token policy terms ``(B, T)`` from the clamped token log-ratio ``(B, T)``."""
        raise NotImplementedError

    def ratio_bounds(self) -> tuple[float | None, float | None]:
        """``(lo, hi)``: the importance ratio outside which the objective cuts a token's term or weight, in ratio
        units (GRPO: ``1 - clip_low``, ``1 + clip_high``); None where it has no such bound. TRL's clip metrics
        count the tokens outside it (``A < 0`` below, ``A > 0`` above)."""
        return None, None

    def weight_log_ratio(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        """The log of the ratio the objective clips: the token's ``(B, T)``, or for a sequence-level objective the
        sequence's length-normalised one ``(B, 1)`` (GSPO's ``log s_i``). Objectives with another sequence ratio
        override it."""
        return log_ratio if self.ratio_level == "token" else seq_log_ratio(log_ratio, mask)

    def clip_log_width(self) -> float | None:
        """The trust region its clip enforces, in log-ratio units: the distance from ``log r = 0`` to the nearer of
        :meth:`ratio_bounds`, ``min(log hi, -log lo)`` (GRPO's 0.2: 0.182; GSPO's 3e-4/4e-4: 3.0e-4, on its
        sequence log-ratio). A ratio drifted this far from 1 is clipped and its gradient zeroed. None where no
        bound zeroes a gradient (:attr:`keeps_gradient`: CISPO's truncated weight) or there is none."""
        if self.keeps_gradient:
            return None
        lo, hi = self.ratio_bounds()
        widths = []
        if hi is not None:
            widths.append(math.log(hi))
        if lo is not None and lo > 0:  # a lower bound at 0 clips nothing
            widths.append(-math.log(lo))
        return min(widths) if widths else None

    def applies_kept_gradient(self) -> bool:
        """Whether ``kept_gradient`` changes this objective: it zeroes gradients at an upper ratio bound."""
        return not self.keeps_gradient and self.ratio_bounds()[1] is not None

    def kept_gradient_surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
        """The ``kept_gradient`` terms: ``-sg[min(r, hi)] A log pi`` with ``r`` the ratio the objective clips
        (:meth:`weight_log_ratio`) and ``hi`` its upper bound (:meth:`ratio_bounds`); no lower bound (CISPO,
        arXiv 2506.13585, eq. 5). ``(B, T)`` in, terms ``(B, T)``."""
        high = self.ratio_bounds()[1]
        if high is None:
            raise ValueError(f"{self.name}: kept_gradient needs an upper ratio bound; this objective has none.")
        return truncated_weight_surrogate(
            self.weight_log_ratio(log_ratio, mask), batch.advantages, batch.logprobs, None, high
        )

    def sequence_weights(self, log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> Tensor | None:
        """The detached per-sequence weight of the policy gradient, per token ``(B, T)`` (VESPO's ``phi(W_i)``), or
        None for objectives without one. All ``(B, T)``."""
        return None

    # -- self-description, read by the adapters and the fused path ----------------------------------------
    def is_token_local(self) -> bool:
        """Whether each token's loss gradient depends on that token's inputs only, with these hyper-parameters:
        ``token_local`` of the class that defines ``surrogate``, and no off-policy sequence masking (which reads
        the whole sequence's current log-probs)."""
        owner = next(c for c in type(self).__mro__ if "surrogate" in vars(c))
        return bool(vars(owner).get("token_local", False)) and self.off_policy_mask_delta is None

    def with_controls(self, controls: Controls) -> Objective:
        """This objective, as configured, with the guard's ``controls`` (``docs/design.md``, "Actuator contract").

        On the fields named by :attr:`clip_bounds`: ``clip_scale`` (and ``clip_high_scale`` on the upper bound) times
        the scheduled ``clip_low``/``clip_high`` where given, else this objective's value; the scheduled ``beta`` and
        ``entropy_coef`` where given; the mismatch remedies (:mod:`rlguard.guards.interventions.mismatch_remedy`):
        ``kept_gradient`` where it changes the objective (:meth:`applies_kept_gradient`), ``rollout_is_cap`` as
        token-level truncated IS and ``rollout_mask_high`` as a geometric-mean rejection mask ``[1/C, C]`` where the run
        configured no rollout correction of that kind, and ``off_policy_mask_delta`` (DeepSeek-V3.2's mask) where it
        configured no off-policy mask. Call it on the configured objective every time, so that the controls never
        compound; controls that change nothing return ``self``. Objectives without clip bounds keep theirs.
        """
        changes: dict[str, Any] = {}
        if self.clip_bounds is not None:
            low, high = self.clip_bounds
            for name, scheduled, scale in (
                (low, controls.clip_low, controls.clip_scale),
                (high, controls.clip_high, controls.clip_scale * controls.clip_high_scale),
            ):
                value = scheduled if scheduled is not None else getattr(self, name)
                if value is not None:
                    changes[name] = value * scale
        if controls.beta is not None:
            if controls.beta > 0 and self.beta == 0:
                raise ValueError(
                    f"the guard sets beta={controls.beta:g}, but the run was configured with beta=0, so no reference "
                    "log-probs are computed: configure beta > 0 (the guard then replaces it) or drop the beta schedule."
                )
            changes["beta"] = controls.beta
        if controls.entropy_coef is not None:
            changes["entropy_coef"] = controls.entropy_coef
        if controls.kept_gradient and self.applies_kept_gradient():
            changes["kept_gradient"] = True
        # a rollout correction or off-policy mask the run configured itself stays as configured
        if controls.rollout_is_cap is not None and self.rollout_is is None:
            changes.update(rollout_is="token", rollout_is_cap=controls.rollout_is_cap)
        if controls.rollout_mask_high is not None and self.rollout_mask is None:
            mask_high = controls.rollout_mask_high
            changes.update(rollout_mask="geometric", rollout_mask_high=mask_high, rollout_mask_low=None)
        if controls.off_policy_mask_delta is not None and self.off_policy_mask_delta is None:
            changes["off_policy_mask_delta"] = controls.off_policy_mask_delta
        if all(getattr(self, k) == v for k, v in changes.items()):
            return self
        return dataclasses.replace(self, **changes)

    # -- the shared pipeline ------------------------------------------------------------------------------
    def __call__(
        self,
        batch: PolicyBatch,
        *,
        num_tokens: Normaliser | None = None,
        num_sequences: Normaliser | None = None,
    ) -> LossOutput:
        """Loss and canonical metrics of ``batch``.

        Args:
            batch: the (micro-)batch.
            num_tokens: normaliser of ``token-mean``: the step's total unmasked tokens (divided by the
                data-parallel size if gradients are averaged). Default: this batch's count.
            num_sequences: normaliser of the ``seq-mean-*`` modes, likewise. Default: this batch's non-empty rows.
        """
        check_normaliser("num_tokens", num_tokens)
        check_normaliser("num_sequences", num_sequences)
        p = prepare_batch(batch, self.on_nonfinite)
        self._check_optional_inputs(p)
        keep, is_weights = self._rollout_corrections(p)
        mask = p.mask if keep is None else p.mask * keep.to(p.mask.dtype)  # (B, T)

        log_ratio = token_log_ratio(p.logprobs, p.old_logprobs)  # (B, T)
        kept = self.kept_gradient and self.applies_kept_gradient()
        terms = self.kept_gradient_surrogate(log_ratio, p, mask) if kept else self.surrogate(log_ratio, p, mask)
        policy = terms.loss if p.token_weights is None else terms.loss * p.token_weights  # (B, T)
        per_token = policy if is_weights is None else policy * is_weights  # (B, T)
        kl = None
        if p.ref_logprobs is not None:
            old = p.old_logprobs if self.kl_unbiased else None
            kl = kl_estimate(p.logprobs, p.ref_logprobs, self.kl_estimator, old_logprobs=old)
            if self.beta > 0:
                per_token = per_token + self.beta * kl
        if self.entropy_coef > 0 and p.entropies is not None:
            per_token = per_token - self.entropy_coef * p.entropies
        loss = aggregate(
            per_token,
            mask,
            self.aggregation,
            count_mask=p.mask,
            num_tokens=num_tokens,
            num_sequences=num_sequences,
            max_length=self.max_length,
        )
        metrics = self._metrics(loss, log_ratio, terms, kl, p, mask)
        return LossOutput(loss=loss, metrics=metrics)

    def _check_optional_inputs(self, p: PreparedBatch) -> None:
        if self.beta > 0 and p.ref_logprobs is None:
            raise ValueError(f"beta={self.beta} needs batch.ref_logprobs (the reference policy's log-probs).")
        if self.entropy_coef > 0 and p.entropies is None:
            raise ValueError(f"entropy_coef={self.entropy_coef} needs batch.entropies (per-token entropy).")
        if (self.rollout_is or self.rollout_mask) and p.rollout_logprobs is None:
            raise ValueError("rollout_is/rollout_mask need batch.rollout_logprobs (the inference engine's log-probs).")

    def _rollout_corrections(self, p: PreparedBatch) -> tuple[Tensor | None, Tensor | None]:
        """``(keep (B, T) bool or None, detached IS weights (B, T) or None)``."""
        keep: Tensor | None = None
        weights: Tensor | None = None
        if p.rollout_logprobs is not None and (self.rollout_is or self.rollout_mask):
            log_rho = rollout_log_ratio(p.old_logprobs, p.rollout_logprobs)
            if self.rollout_is is not None:
                weights = truncated_is_weights(log_rho, p.mask, self.rollout_is, self.rollout_is_cap)
            if self.rollout_mask is not None:
                low = 1.0 / self.rollout_mask_high if self.rollout_mask_low is None else self.rollout_mask_low
                keep = rejection_keep(log_rho, p.mask, self.rollout_mask, low, self.rollout_mask_high)
        if self.off_policy_mask_delta is not None:
            behaviour = p.old_logprobs if p.rollout_logprobs is None else p.rollout_logprobs
            opm = off_policy_sequence_keep(p.logprobs, behaviour, p.advantages, p.mask, self.off_policy_mask_delta)
            keep = opm if keep is None else keep & opm
        return keep, weights

    def _metrics(
        self,
        loss: Tensor,
        log_ratio: Tensor,
        terms: Surrogate,
        kl: Tensor | None,
        p: PreparedBatch,
        mask: Tensor,
    ) -> dict[str, Tensor]:
        with torch.no_grad():
            lr = log_ratio.detach()
            ratio = torch.exp(lr)
            seq_lr = seq_log_ratio(lr, mask).squeeze(-1)  # (B,)
            seq_mask = (mask.sum(dim=-1) > 0).to(mask.dtype)  # (B,)
            seq_ratio = torch.exp(seq_lr)
            m: dict[str, Tensor] = {
                "loss": loss.detach(),
                "ratio_mean": masked_mean(ratio, mask),
                "ratio_min": masked_min(ratio, mask),
                "ratio_max": masked_max(ratio, mask),
                "seq_ratio_mean": masked_mean(seq_ratio, seq_mask),
                "seq_ratio_min": masked_min(seq_ratio, seq_mask),
                "seq_ratio_max": masked_max(seq_ratio, seq_mask),
                # samples come from pi_old, so k3 = r - 1 - log r estimates KL(pi_old || pi)
                "kl_old": masked_mean(k3_from_log_ratio(lr), mask),
            }
            if terms.clipped_low is not None and terms.clipped_high is not None:
                low, high = terms.clipped_low.to(mask.dtype), terms.clipped_high.to(mask.dtype)
                m["clip_frac_low"] = masked_mean(low, mask)
                m["clip_frac_high"] = masked_mean(high, mask)
                m["clip_frac"] = masked_mean(torch.maximum(low, high), mask)
            if kl is not None:
                m["kl_ref"] = masked_mean(kl.detach(), mask)
            if p.entropies is not None:
                m["entropy"] = masked_mean(p.entropies.detach(), mask)
            if p.rollout_logprobs is not None:
                m.update(mismatch_metrics(p.old_logprobs, p.rollout_logprobs, p.mask))
            m["masked_frac"] = (p.mask.sum() - mask.sum()) / p.mask.sum().clamp(min=1)
            width = self.clip_log_width()
            if width is not None:
                m["clip_log_width"] = torch.full_like(loss.detach(), width)
            m["nonfinite"] = p.nonfinite
        return m

    @classmethod
    def hyperparameters(cls) -> dict[str, Any]:
        """Constructor arguments and their defaults, for ``rlguard losses`` and error messages."""
        return {f.name: f.default for f in fields(cls) if f.init}


def _check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}.")


def _check_range(name: str, value: float, *, low: float, high: float | None = None, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    ok = ok and (value > low if strict else value >= low) and (high is None or value <= high)
    if not ok:
        bound = f"> {low}" if strict else f">= {low}"
        bound += "" if high is None else f" and <= {high}"
        raise ValueError(f"{name} must be a number {bound}; got {value!r}.")
