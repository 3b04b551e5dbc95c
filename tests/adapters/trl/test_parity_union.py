"""TRL 1.16's ``loss_type="luspo"`` and ``"vespo"`` through ``GuardedGRPOTrainer``: exact parity with TRL's real
``GRPOTrainer._compute_loss``, as in ``tests/adapters/trl/test_parity.py`` (same stub, inputs and tolerances: float64,
rtol 1e-6, gradient accumulation 2 with ``steps_per_generation`` 4), with and without ``beta``, with TRL's
default hyper-parameters and with others, in training and evaluation mode.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from tests.helpers.trl_parity import assert_parity, assert_some_clipped, config, trainer_for

#: VESPO hyper-parameters other than TRL's defaults, exact in float32 (TRL builds k and lambda with torch.where
#: from Python floats, a float32 tensor)
VESPO_OTHER: dict[str, Any] = {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.5}


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("level", ["sequence", "token"])
def test_luspo_equals_trl(model_dir: Path, level: str, beta: float) -> None:
    trainer = trainer_for(
        model_dir, loss_type="luspo", importance_sampling_level=level, beta=beta, use_bias_correction_kl=False
    )
    assert trainer.rlguard_mapping.objective == ("luspo" if level == "sequence" else "grpo")
    assert trainer.rlguard_mapping.kwargs["aggregation"] == "seq-mean-token-sum"
    if level == "sequence":  # GSPO's clip range, which binds per sequence on these inputs
        trainer = trainer_for(
            model_dir,
            loss_type="luspo",
            importance_sampling_level=level,
            beta=beta,
            use_bias_correction_kl=False,
            epsilon=0.05,
            epsilon_high=0.08,
        )
    _, metrics = assert_parity(trainer, seed=zlib.crc32(repr(("luspo", level, beta)).encode()), ref=beta > 0)
    assert_some_clipped(metrics)
    if beta > 0:
        assert metrics["kl"][0] > 0


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("hyper", [{}, VESPO_OTHER], ids=["trl_defaults", "other"])
def test_vespo_equals_trl(model_dir: Path, hyper: dict[str, Any], beta: float) -> None:
    trainer = trainer_for(model_dir, loss_type="vespo", beta=beta, **hyper)
    assert trainer.rlguard_mapping.objective == "vespo"
    _, metrics = assert_parity(trainer, seed=zlib.crc32(repr(("vespo", hyper, beta)).encode()), ref=beta > 0)
    (phi_mean,) = metrics["vespo/phi_seq_mean"]
    assert abs(phi_mean - 1.0) > 0.05, "the kernel must reshape the weights: these inputs are off-policy"


@pytest.mark.parametrize("loss_type", ["luspo", "vespo"])
def test_evaluation_mode_and_other_accumulation(model_dir: Path, loss_type: str) -> None:
    trainer = trainer_for(model_dir, loss_type=loss_type, importance_sampling_level="sequence", beta=0.0)
    for ga in (1, 3):
        trainer.current_gradient_accumulation_steps = ga
        assert_parity(trainer, seed=11, ref=False)
    trainer.model.eval()  # type: ignore[union-attr]
    assert_parity(trainer, seed=12, ref=False)


def test_vespo_mapping_and_refusals() -> None:
    kw = config(loss_type="vespo", **VESPO_OTHER).objective_mapping().kwargs
    assert {k: kw[k] for k in ("k_pos", "lambda_pos", "k_neg", "lambda_neg")} == {
        "k_pos": 1.5,
        "lambda_pos": 2.5,
        "k_neg": 2.5,
        "lambda_neg": 1.5,
    }
    assert kw["aggregation"] == "token-mean"
    with pytest.raises(NotImplementedError, match="TRL folds the engine ratio into VESPO's sequence weight"):
        config(loss_type="vespo", use_vllm=True, vllm_importance_sampling_correction=True).objective_mapping()


# ---------------------------------------------------------------- TRL's entropy masking (top_entropy_quantile)
@pytest.mark.parametrize(
    ("loss_type", "level"),
    [("grpo", "token"), ("dapo", "token"), ("grpo", "sequence"), ("luspo", "sequence"), ("vespo", "token")],
)
def test_top_entropy_quantile_equals_trl(model_dir: Path, loss_type: str, level: str) -> None:
    """TRL's get_high_entropy_mask keeps the top 40% of tokens by entropy for the policy term (the KL term and
    the entropy bonus see the same tokens as in TRL); loss and gradient equal TRL's, and differ from the unmasked
    loss, so the mask is applied."""
    expect = ("trl#3823",) if (loss_type, level) == ("dapo", "sequence") else ()
    options = {"loss_type": loss_type, "importance_sampling_level": level, "beta": 0.04, "entropy_coef": 0.05}
    options["use_bias_correction_kl"] = False
    masked = trainer_for(model_dir, expect, top_entropy_quantile=0.4, **options)
    trl_loss, _ = assert_parity(masked, seed=zlib.crc32(repr(("entropy", loss_type, level)).encode()))
    plain = trainer_for(model_dir, expect, **options)
    plain_loss, _ = assert_parity(plain, seed=zlib.crc32(repr(("entropy", loss_type, level)).encode()))
    assert abs(float(trl_loss - plain_loss)) > 1e-4


@pytest.mark.parametrize("loss_type", ["luspo", "vespo"])
def test_token_level_advantages_and_tool_mask(model_dir: Path, loss_type: str) -> None:
    """(B, T) advantages (VESPO's kernel then picks k, lambda per token, as TRL does) and TRL's tool mask."""
    trainer = trainer_for(
        model_dir, loss_type=loss_type, importance_sampling_level="sequence", beta=0.04, use_bias_correction_kl=False
    )
    assert_parity(trainer, seed=13, token_adv=True, tool_mask=True)
