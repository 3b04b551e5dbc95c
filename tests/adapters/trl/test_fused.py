"""``GuardedGRPOConfig(fused_objective=True)``: the objective computed in the LM-head pass inside TRL's loop.

Reference: TRL's own fused LM head kernel (the same trainer without the flag) through
``GuardedGRPOTrainer._compute_loss``: loss, every parameter's gradient and the logged metrics at float32 tolerance,
with the flag's path checked to have run (TRL's kernel fails if called).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

import trl.trainer.utils as trl_utils

from rlguard.adapters.trl.logprobs import FUSED_REQUEST
from rlguard.tasks.hf import save_tiny_llama
from tests.helpers.trl_hidden import policy_inputs, tiny_trainer

CASES = [
    ({"loss_type": "dapo", "importance_sampling_level": "token"}, 1),
    ({"loss_type": "grpo", "importance_sampling_level": "sequence"}, 1),  # GSPO: chunks of whole sequences
    ({"loss_type": "dr_grpo", "importance_sampling_level": "token"}, 2),  # gradient accumulation
    ({"loss_type": "bnpo", "importance_sampling_level": "token", "beta": 0.0}, 1),
]


@pytest.mark.parametrize(("settings", "accumulation"), CASES, ids=lambda c: str(c))
def test_loss_gradients_and_metrics_equal_trl_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], accumulation: int
) -> None:
    model_dir = save_tiny_llama(tmp_path / "model")
    settings = {"beta": 0.04, "epsilon": 0.1, "use_bias_correction_kl": False, **settings}
    inputs = policy_inputs(3)
    results = []
    for fused in (False, True):
        trainer = tiny_trainer(str(model_dir), tmp_path / str(fused), fused_objective=fused, **settings)
        trainer.current_gradient_accumulation_steps = accumulation
        params = [p for p in trainer.model.parameters() if p.requires_grad]  # type: ignore[union-attr]
        with monkeypatch.context() as patch:
            if fused:
                patch.setattr(trl_utils, "_ChunkedLogProbFunction", None)  # any call to TRL's kernel fails
            loss = trainer._compute_loss(trainer.model, inputs)  # type: ignore[arg-type]
        grads = torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)
        metrics = {k: v[0] for k, v in trainer._metrics["train"].items()}
        results.append((loss.detach(), grads, metrics))
        if fused:
            assert getattr(trainer._rlguard_fused_model, FUSED_REQUEST) is None  # cleared after the forward
    (trl_loss, trl_grads, trl_metrics), (loss, grads, metrics) = results
    assert loss.dtype == trl_loss.dtype == torch.float32
    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=0.0)
    scale = max(float(g.abs().max()) for g in trl_grads)
    assert scale > 0
    for a, b in zip(grads, trl_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0.0, atol=1e-5 * scale)
    assert metrics.keys() == trl_metrics.keys() and "entropy" in metrics
    for key, value in trl_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_eval_mode_has_no_gradient(tmp_path: Path) -> None:
    trainer = tiny_trainer(str(save_tiny_llama(tmp_path / "model")), tmp_path / "run", fused_objective=True)
    trainer.model.eval()  # type: ignore[union-attr]
    with torch.no_grad():
        loss = trainer._compute_loss(trainer.model, policy_inputs(4))  # type: ignore[arg-type]
    assert not loss.requires_grad and torch.isfinite(loss)


def test_trl_entropy_bonus_is_refused(tmp_path: Path) -> None:
    model_dir = save_tiny_llama(tmp_path / "model")
    with pytest.raises(ValueError, match=r"fused_objective=True cannot add TRL's entropy bonus \(entropy_coef=0\.01"):
        tiny_trainer(str(model_dir), tmp_path / "run", fused_objective=True, entropy_coef=0.01)


def test_trl_entropy_masking_is_refused(tmp_path: Path) -> None:
    model_dir = save_tiny_llama(tmp_path / "model")
    with pytest.raises(ValueError, match=r"fused_objective=True cannot apply top_entropy_quantile=0\.5"):
        tiny_trainer(str(model_dir), tmp_path / "run", fused_objective=True, top_entropy_quantile=0.5)
