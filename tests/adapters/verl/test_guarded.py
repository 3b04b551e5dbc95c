"""``rlguard.adapters.verl.guarded``: the guarded policy loss against verl's own.

Float64 inputs through verl's registry (``rlguard.gspo`` under ``GuardedPolicyLossConfig``); references are verl's
own ``gspo`` (equal to ``rlguard.gspo`` for per-sequence advantages, tests/adapters/verl/test_parity.py) on the data
with the poisoned rows masked, or with the clip ratios changed; the kept-gradient remedy against verl's own
``cispo``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

from rlguard.adapters.verl import GuardedPolicyLossConfig, RLGuardPolicyLossConfig
from tests.helpers.verl_loss import actor, guarded, inputs, poison, run

# -- the guarded loss -------------------------------------------------------------------------------------


def test_poisoned_sequences_are_masked_as_verl_would_without_them() -> None:
    clean = inputs()
    rows = torch.tensor([True, False, False, True])
    without = {**clean, "response_mask": clean["response_mask"] & rows.unsqueeze(1)}
    loss, grad, metrics = run("rlguard.gspo", poison(clean), guarded(max_poisoned_frac=1.0))
    ref_loss, ref_grad, _ = run("gspo", without, actor())  # verl's own GSPO on the rows left
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=0)
    assert torch.isfinite(grad).all() and not grad[1:3].any()
    assert ref_grad[0].abs().sum() > 0 and math.isfinite(loss.item())
    # 4 NaN advantages in row 1 (its length) + 1 Inf old log-prob; 2 of 4 sequences; their 9 of 18 tokens
    assert metrics["rlguard/nonfinite"] == 5.0
    assert metrics["rlguard/guard/poisoned_seqs"] == 2.0
    assert metrics["rlguard/guard/skipped"] == 0.0
    assert metrics["rlguard/masked_frac"] == pytest.approx(9 / 18)


def test_poisoned_fraction_over_threshold_gives_zero_loss_and_gradient() -> None:
    loss, grad, metrics = run("rlguard.gspo", poison(inputs()), guarded(max_poisoned_frac=0.25))
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert metrics["rlguard/guard/skipped"] == 1.0 and metrics["rlguard/guard/poisoned_seqs"] == 2.0


def test_skip_from_the_driver_zeroes_a_clean_micro_batch() -> None:
    _, clean_grad, _ = run("rlguard.gspo", inputs(), guarded())
    loss, grad, metrics = run("rlguard.gspo", inputs(), guarded(skip=True))
    assert clean_grad.abs().sum() > 0
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad)) and metrics["rlguard/guard/skipped"] == 1.0


def test_zero_loss_of_a_skip_stays_finite_with_nan_current_log_probs() -> None:
    data = inputs()
    data["log_prob"] = data["log_prob"].detach().clone()
    data["log_prob"][0, 0] = float("nan")
    loss, grad, _ = run("rlguard.gspo", data, guarded(skip=True))
    assert loss.item() == 0.0 and torch.isfinite(grad).all()


@pytest.mark.parametrize(
    ("controls", "low", "high"),
    [
        ({"clip_scale": 0.5}, 0.1, 0.14),
        ({"clip_low": 0.1, "clip_high": 0.2}, 0.1, 0.2),
        ({"clip_low": 0.1, "clip_high": 0.2, "clip_scale": 0.5}, 0.05, 0.1),
    ],
)
def test_clip_controls_set_verls_clip_range(controls: dict[str, float], low: float, high: float) -> None:
    loss, grad, metrics = run("rlguard.gspo", inputs(), guarded(controls=controls))
    ref_loss, ref_grad, ref_metrics = run("gspo", inputs(), actor(clip_ratio_low=low, clip_ratio_high=high))
    _, wide_grad, _ = run("gspo", inputs(), actor())
    torch.testing.assert_close((loss, grad), (ref_loss, ref_grad), rtol=1e-12, atol=0)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(ref_metrics["actor/pg_clipfrac"])
    assert not torch.allclose(grad, wide_grad)  # the range matters on these data
    assert metrics["rlguard/guard/clip_scale"] == controls.get("clip_scale", 1.0)
    assert (metrics["rlguard/guard/clip_low"], metrics["rlguard/guard/clip_high"]) == pytest.approx((low, high))


def test_clip_scale_also_scales_clip_values_in_objective_kwargs() -> None:
    scaled = guarded(objective_kwargs={"clip_low": 0.2, "clip_high": 0.3}, controls={"clip_scale": 0.5})
    direct = actor(
        RLGuardPolicyLossConfig(loss_mode="rlguard.gspo", objective_kwargs={"clip_low": 0.1, "clip_high": 0.15})
    )
    torch.testing.assert_close(run("rlguard.gspo", inputs(), scaled)[:2], run("rlguard.gspo", inputs(), direct)[:2])


def test_the_plain_config_stays_unguarded() -> None:
    plain = actor(RLGuardPolicyLossConfig(loss_mode="rlguard.gspo"))
    with pytest.raises(ValueError, match="advantages contains 4 NaN values"):
        run("rlguard.gspo", poison(inputs()), plain)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_poisoned_frac": 1.5}, r"max_poisoned_frac must be in \[0, 1\].*1\.5"),
        ({"controls": {"clip_scale": 0.0}}, r"clip_scale must be a finite number > 0; got 0\.0"),
        ({"controls": {"clip_low": -0.1}}, r"clip_low must be None or a finite number >= 0; got -0\.1"),
        ({"controls": {"temperature": 1.0}}, r"controls: unknown \['temperature'\]"),
    ],
)
def test_guarded_config_rejects(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GuardedPolicyLossConfig(loss_mode="rlguard.gspo", **kwargs)


# -- the guard's mismatch remedy in verl's loss ------------------------------------------------------------------
def test_kept_gradient_remedy_is_verls_own_cispo_at_the_same_upper_bound() -> None:
    """The driver's kept_gradient control on ``rlguard.grpo`` (verl's clip 0.2 / 0.28) gives verl's own ``cispo``
    loss with no lower bound (``clip_ratio_low=1``) and the same upper one: loss and gradient."""
    data = inputs(1)
    grpo = lambda **kw: actor(GuardedPolicyLossConfig(loss_mode="rlguard.grpo", **kw))  # noqa: E731
    plain, _, _ = run("rlguard.grpo", data, grpo())
    loss, grad, _ = run("rlguard.grpo", data, grpo(controls={"kept_gradient": True}))
    ref_loss, ref_grad, _ = run("cispo", data, actor(clip_ratio_low=1.0))
    assert not torch.allclose(plain, ref_loss), "degenerate case: the hard clip must bind somewhere"
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=0)
