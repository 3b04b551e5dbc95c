"""The guard's rollout correction in verl: the driver sets verl's own ``algorithm.rollout_correction`` between steps.

Parity against verl's ``compute_rollout_correction_and_add_to_batch`` (what verl's trainers run on each batch) on
float64 data: its token TIS weights are rlguard's ``truncated_is_weights`` and, through rlguard's guarded verl loss,
give the core objective under ``Controls(rollout_is_cap=C)``. Its geometric rejection (``seq_mean_k1``) keeps the same
sequences as rlguard's geometric mask but changes the loss's normaliser, which is why the driver does not map
``rollout_mask_high``. The driver runs on the stand-in trainers of ``tests/helpers/verl_stand_in.py`` (no Ray).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="the verl adapter needs verl (pip install 'rlguard[verl]')")

from omegaconf import OmegaConf  # after the skip: verl brings omegaconf
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

from rlguard.adapters.verl import driver as verl_guard
from rlguard.adapters.verl import guarded_trainer_class
from rlguard.adapters.verl.loss import verl_objective
from rlguard.adapters.verl.mapping import rollout_correction_fields
from rlguard.core_losses import Controls, PolicyBatch
from rlguard.core_losses.rollout import rejection_keep, rollout_log_ratio, truncated_is_weights
from rlguard.guards import Decision, Guard, GuardConfig
from rlguard.guards.actuation import apply_decision
from rlguard.guards.events import Finding
from rlguard.guards.interventions import StepContext
from rlguard.guards.interventions.mismatch_remedy import MismatchRemedy
from tests.helpers.guards import ScriptedGuard
from tests.helpers.synthetic import healthy_stream
from tests.helpers.verl_stand_in import FakeTrainer, trainer_config

B, T = 4, 6
CAP = 1.5


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """float64 ``(B, T)`` tensors; engine log-probs ``mu`` off pi_old by a per-row shift plus noise, so that some
    token ratios ``pi_old / mu`` exceed ``CAP`` and the rows' geometric means are about 1.9, 1.0, 0.6 and 1.1."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    shift = torch.tensor([math.log(1.9), 0.0, math.log(0.6), math.log(1.1)], dtype=torch.float64).unsqueeze(1)
    engine = old - shift + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    log_prob = old + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([6, 4, 5, 3])
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.8, -1.2], dtype=torch.float64).unsqueeze(1).expand(B, T) * mask
    return {"old_log_probs": old, "rollout_log_probs": engine, "log_prob": log_prob, "advantages": adv, "mask": mask}


def verl_correction(data: dict[str, torch.Tensor], correction: Any) -> DataProto:
    """verl's trainers' step: the batch with ``rollout_is_weights`` and the rejection-masked ``response_mask``."""
    proto = DataProto.from_dict(
        tensors={
            "old_log_probs": data["old_log_probs"],
            "rollout_log_probs": data["rollout_log_probs"],
            "response_mask": data["mask"].clone(),
        }
    )
    out, _ = compute_rollout_correction_and_add_to_batch(proto, correction)
    return out


def grpo_config(tmp_path: Path, **rollout: Any) -> Any:
    config = trainer_config(tmp_path)
    config.actor_rollout_ref.actor.policy_loss.loss_mode = "rlguard.grpo"
    for key, value in rollout.items():
        config.actor_rollout_ref.rollout[key] = value
    return config


def driver_for(config: Any, guard: Guard | None = None) -> verl_guard.VerlGuardDriver:
    return verl_guard.VerlGuardDriver(FakeTrainer(config, []), guard or ScriptedGuard({}))


def correction_of(driver: verl_guard.VerlGuardDriver) -> dict[str, Any] | None:
    node = driver.trainer.config.algorithm.get("rollout_correction", None)
    return None if node is None else OmegaConf.to_container(node)  # type: ignore[return-value]


def loss_and_grad(fn: Any, data: dict[str, torch.Tensor], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    log_prob = data["log_prob"].detach().clone().requires_grad_()
    loss = fn(log_prob, **kwargs)
    loss.backward()
    assert log_prob.grad is not None
    return loss.detach(), log_prob.grad


# -- (a) parity on a batch ----------------------------------------------------------------------------------------


def test_verls_token_tis_under_the_driver_is_rlguards_truncated_is(tmp_path: Path) -> None:
    """The config the driver sets for ``rollout_is_cap=1.5`` makes verl compute rlguard's ``min(pi_old / mu, C)``."""
    driver = driver_for(grpo_config(tmp_path))
    driver.set_controls(Controls(rollout_is_cap=CAP))
    data = batch()
    out = verl_correction(data, driver.trainer.config.algorithm.rollout_correction)
    log_rho = rollout_log_ratio(data["old_log_probs"], data["rollout_log_probs"])  # (B, T)
    core = truncated_is_weights(log_rho, data["mask"], "token", CAP) * data["mask"]  # verl zeroes padding
    torch.testing.assert_close(out.batch["rollout_is_weights"], core, rtol=1e-12, atol=0)
    assert torch.equal(out.batch["response_mask"], data["mask"])  # TIS rejects nothing
    live = data["mask"].bool()
    assert (core[live] >= CAP - 1e-12).any() and (core[live] < 1.0).any()  # the cap binds on this batch


def test_verls_weights_through_the_guarded_loss_are_the_core_objective_with_the_control(tmp_path: Path) -> None:
    """verl's weights reach rlguard's loss once (the driver's loss controls carry no rollout correction): loss and
    gradient equal the core objective ``with_controls(Controls(rollout_is_cap=C))`` given the engine's log-probs."""
    driver = driver_for(grpo_config(tmp_path))
    driver.set_controls(Controls(rollout_is_cap=CAP))
    actor = driver.actor_config()
    assert Controls.from_dict(actor.policy_loss.controls) == Controls()  # not applied twice
    data = batch()
    weights = verl_correction(data, driver.trainer.config.algorithm.rollout_correction).batch["rollout_is_weights"]
    fn = core_algos.get_policy_loss_fn("rlguard.grpo")

    def verl_loss(log_prob: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
        common = {"old_log_prob": data["old_log_probs"], "advantages": data["advantages"]}
        loss, _ = fn(
            log_prob=log_prob,
            **common,
            response_mask=data["mask"].bool(),
            loss_agg_mode=actor.loss_agg_mode,
            config=actor,
            rollout_is_weights=rollout_is_weights,
        )
        return loss

    configured, norm = verl_objective("grpo", actor, actor.loss_agg_mode)
    assert configured.rollout_is is None
    controlled = configured.with_controls(Controls(rollout_is_cap=CAP))

    def core_loss(log_prob: torch.Tensor) -> torch.Tensor:
        policy = PolicyBatch(
            logprobs=log_prob,
            advantages=data["advantages"],
            mask=data["mask"],
            old_logprobs=data["old_log_probs"],
            rollout_logprobs=data["rollout_log_probs"],
        )
        return controlled(policy, num_tokens=norm.num_tokens, num_sequences=norm.num_sequences).loss

    loss, grad = loss_and_grad(verl_loss, data, rollout_is_weights=weights)
    ref_loss, ref_grad = loss_and_grad(core_loss, data)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=0)
    plain, _ = loss_and_grad(verl_loss, data, rollout_is_weights=None)
    assert abs(float(plain - loss)) > 1e-4  # the weights change the loss: the comparison can fail
    # the objective's own rollout_is inside the loss would need the engine's log-probs, which verl never passes
    raw_loss = dataclasses.replace(actor.policy_loss, controls=Controls(rollout_is_cap=CAP).to_dict())
    raw = dataclasses.replace(actor, policy_loss=raw_loss)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        fn(
            log_prob=data["log_prob"],
            old_log_prob=data["old_log_probs"],
            advantages=data["advantages"],
            response_mask=data["mask"].bool(),
            loss_agg_mode=raw.loss_agg_mode,
            config=raw,
        )


def test_verls_geometric_rejection_keeps_the_same_rows_but_not_the_normaliser(tmp_path: Path) -> None:
    """Why ``rollout_mask_high`` is not mapped: verl's ``seq_mean_k1`` at ``C`` rejects exactly the rows whose
    geometric mean leaves rlguard's ``[1/C, C]``, but it removes them from ``response_mask``, so the token-mean loss
    divides by the kept tokens where rlguard's mask divides by all of them."""
    data = batch()
    rejection = OmegaConf.create({"rollout_is": None, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": CAP})
    verl_mask = verl_correction(data, rejection).batch["response_mask"]
    log_rho = rollout_log_ratio(data["old_log_probs"], data["rollout_log_probs"])
    core_keep = rejection_keep(log_rho, data["mask"], "geometric", 1 / CAP, CAP) * data["mask"]
    torch.testing.assert_close(verl_mask, core_keep, rtol=0, atol=0)
    assert core_keep.sum(dim=-1).eq(0).tolist() == [True, False, True, False]  # rows 0 and 2 rejected, 1, 3 kept
    # token-mean over the batch: verl's loss is rlguard's times all tokens / kept tokens
    actor = driver_for(grpo_config(tmp_path)).actor_config()
    configured, _ = verl_objective("grpo", actor, "token-mean")
    policy = PolicyBatch(
        logprobs=data["log_prob"],
        advantages=data["advantages"],
        mask=data["mask"],
        old_logprobs=data["old_log_probs"],
        rollout_logprobs=data["rollout_log_probs"],
    )
    core = configured.with_controls(Controls(rollout_mask_high=CAP))(policy).loss
    fn = core_algos.get_policy_loss_fn("rlguard.grpo")
    verl_loss, _ = fn(
        log_prob=data["log_prob"],
        old_log_prob=data["old_log_probs"],
        advantages=data["advantages"],
        response_mask=verl_mask.bool(),
        loss_agg_mode="token-mean",
        config=actor,
    )
    kept, total = float(verl_mask.sum()), float(data["mask"].sum())
    torch.testing.assert_close(verl_loss * kept, core * total, rtol=1e-12, atol=0)
    assert abs(float(verl_loss - core)) > 1e-4


# -- (b) the driver sets and clears verl's config ------------------------------------------------------------


def test_rollout_correction_fields_follow_with_controls_rule() -> None:
    cap = Controls(rollout_is_cap=CAP)
    tis = {"rollout_is": "token", "rollout_is_threshold": CAP, "rollout_is_batch_normalize": False}
    assert rollout_correction_fields(cap, None) == tis
    assert rollout_correction_fields(cap, {"rollout_is": None, "rollout_rs": "seq_sum_k1"}) == tis
    assert rollout_correction_fields(cap, {"rollout_is": "sequence", "rollout_is_threshold": 3.0}) == {}
    assert rollout_correction_fields(Controls(), {"rollout_is": None}) == {}
    assert rollout_correction_fields(Controls(rollout_mask_high=2.0), {"rollout_is": None}) == {}


class CorrectionTrainer(FakeTrainer):
    """``FakeTrainer`` that, as verl's trainers do in ``_compute_advantage``, reads ``algorithm.rollout_correction``
    afresh for each step's batch (recorded in ``read``) before the step is logged."""

    def __init__(self, config: Any, steps: list[dict[str, float]]) -> None:
        super().__init__(config, steps)
        self.read: list[dict[str, Any] | None] = []

    def fit(self) -> None:
        from verl.utils.tracking import Tracking

        logger = Tracking(project_name="p", experiment_name="e", default_backend=[])
        for step in range(1, len(self.steps) + 1):
            self.global_steps = step
            node = self.config.algorithm.get("rollout_correction", None)
            self.read.append(None if node is None else OmegaConf.to_container(node))  # type: ignore[arg-type]
            logger.log(data={**self.steps[step - 1], "training/global_step": step}, step=step)


CorrectionGuarded = guarded_trainer_class(CorrectionTrainer)


def run_script(config: Any) -> list[dict[str, Any] | None]:
    """TIS at cap 1.5 decided at steps 2 and 3, none at 4: what verl reads at each of steps 1-5."""
    on = Controls(rollout_is_cap=CAP)
    script = {2: Decision(2, controls=on), 3: Decision(3, controls=on), 4: Decision(4)}
    steps = [{"actor/pg_loss": 0.1} for _ in range(5)]
    trainer = CorrectionGuarded(config, steps, guard=ScriptedGuard(script))
    trainer.fit()
    return trainer.read


def test_the_driver_sets_token_tis_between_steps_and_clears_it(tmp_path: Path) -> None:
    config = grpo_config(tmp_path)
    own = OmegaConf.to_container(config.algorithm.rollout_correction)
    assert isinstance(own, dict) and own["rollout_is"] is None and own["rollout_rs"] is None  # verl's default
    tis = {**own, "rollout_is": "token", "rollout_is_threshold": CAP, "rollout_is_batch_normalize": False}
    # decided after steps 2 and 3 are logged: verl uses it from step 3; cleared after step 4
    assert run_script(config) == [own, own, tis, tis, own]


def test_a_run_without_its_own_correction_gets_one_and_loses_it_again(tmp_path: Path) -> None:
    config = grpo_config(tmp_path)
    config.algorithm.rollout_correction = None
    read = run_script(config)
    assert read[:2] == [None, None] and read[4] is None
    assert read[2] == {"rollout_is": "token", "rollout_is_threshold": CAP, "rollout_is_batch_normalize": False}


def test_a_configured_correction_stays_as_configured(tmp_path: Path) -> None:
    config = grpo_config(tmp_path)
    config.algorithm.rollout_correction.rollout_is = "sequence"
    config.algorithm.rollout_correction.rollout_is_threshold = 3.0
    own = OmegaConf.to_container(config.algorithm.rollout_correction)
    assert run_script(config) == [own] * 5
    # the user's rejection sampling alone: TIS is added beside it, the rejection kept
    config = grpo_config(tmp_path / "rs")
    config.algorithm.rollout_correction.rollout_rs = "seq_mean_k1"
    config.algorithm.rollout_correction.rollout_rs_threshold = "0.5_2.0"
    read = run_script(config)
    assert read[2] is not None and (read[2]["rollout_is"], read[2]["rollout_is_threshold"]) == ("token", CAP)
    assert all(
        r is not None and (r["rollout_rs"], r["rollout_rs_threshold"]) == ("seq_mean_k1", "0.5_2.0") for r in read
    )
    assert read[4] is not None and read[4]["rollout_is"] is None


@pytest.mark.parametrize(
    ("calculate_log_probs", "bypass_mode", "declared"),
    [(True, False, True), (False, False, False), (True, True, False)],
)
def test_the_capability_needs_engine_log_probs_beside_a_recomputed_pi_old(
    tmp_path: Path, calculate_log_probs: bool, bypass_mode: bool, declared: bool
) -> None:
    config = grpo_config(tmp_path, calculate_log_probs=calculate_log_probs)
    config.algorithm.rollout_correction.bypass_mode = bypass_mode
    driver = driver_for(config)
    assert ("rollout_correction" in driver.capabilities) is declared
    before = correction_of(driver)
    applied = apply_decision(Decision(1, controls=Controls(rollout_is_cap=CAP)), driver)
    assert ("rollout_correction" in applied.record_only) is not declared
    after = correction_of(driver)
    assert after is not None and (after["rollout_is"] == "token") is declared
    if not declared:
        assert after == before


def test_the_correction_is_saved_with_the_guard_and_set_again_on_resume(tmp_path: Path) -> None:
    driver = driver_for(grpo_config(tmp_path))
    driver.set_controls(Controls(rollout_is_cap=CAP))
    driver.save(tmp_path / "global_step_3")
    resumed = driver_for(grpo_config(tmp_path / "resumed"))
    assert correction_of(resumed)["rollout_is"] is None  # type: ignore[index]
    assert resumed.load(tmp_path / "global_step_3")
    assert correction_of(resumed)["rollout_is_threshold"] == CAP  # type: ignore[index]


def test_the_geometric_mask_is_not_mapped_and_is_recorded_only(tmp_path: Path) -> None:
    """The driver does not declare ``rollout_mask`` (verl has no exact geometric mask): a decision carrying
    ``rollout_mask_high`` is recorded only for it, and verl's config gets the TIS beside the run's own rejection."""
    driver = driver_for(grpo_config(tmp_path))
    assert "rollout_mask" not in driver.capabilities
    before = correction_of(driver)
    applied = apply_decision(Decision(1, controls=Controls(rollout_is_cap=CAP, rollout_mask_high=2.0)), driver)
    assert "rollout_mask" in applied.record_only and "rollout_correction" not in applied.record_only
    assert driver.controls.rollout_mask_high is None
    after = correction_of(driver)
    assert after is not None and before is not None
    assert (after["rollout_is"], after["rollout_rs"]) == ("token", before["rollout_rs"])
    apply_decision(Decision(2, controls=Controls(rollout_mask_high=2.0)), driver)
    assert correction_of(driver) == before


# -- (c) the mismatch remedy under the verl driver ------------------------------------------------------------


def test_the_remedy_picks_rollout_is_first_under_the_verl_driver(tmp_path: Path) -> None:
    guard = Guard(GuardConfig.preset("stable"))
    driver = driver_for(grpo_config(tmp_path), guard)
    assert guard.capabilities is not None and "rollout_correction" in guard.capabilities
    # verl has no exact geometric mask: the ladder skips that rung (TIS, then the kept gradient)
    assert "rollout_mask" not in guard.capabilities
    assert MismatchRemedy().ladder(guard.capabilities)[:2] == ["rollout_is", "kept_gradient"]
    gap = {"mismatch_growth": Finding("warn", 0.01, 0.005, "mismatch_kl=0.01 is above 0.005")}
    remedy = MismatchRemedy()
    # pi_old recomputed by verl: the gap arms the remedy, its first critical consequence switches TIS on
    assert remedy.propose(StepContext(1, {}, gap, {}, {}, 0, None, capabilities=guard.capabilities)) is None
    explosion = {"ratio_explosion": Finding("critical", 1000.0, 50.0, "ratio_max=1000")}
    proposal = remedy.propose(StepContext(2, {}, explosion, {}, {}, 0, None, capabilities=guard.capabilities))
    assert proposal is not None and dict(proposal.controls) == {"rollout_is_cap": 2.0}
    without = driver_for(grpo_config(tmp_path / "off", calculate_log_probs=False), Guard(GuardConfig.preset("stable")))
    caps = without.guard.capabilities
    proposal = MismatchRemedy().propose(StepContext(1, {}, gap, {}, {}, 0, None, capabilities=caps))
    assert proposal is not None and dict(proposal.controls) == {"kept_gradient": True}
    assert driver.controls == Controls()


def test_the_stable_guard_on_the_driver_switches_verls_tis_on_at_the_gaps_consequence(tmp_path: Path) -> None:
    """verl's ``rollout_corr/k3_kl`` (``mismatch_kl``) jumps to 0.01 at step 40 and the max ratio explodes from
    step 43 on: the stable guard's remedy switches token TIS (cap 2) on in verl's config at the explosion's
    critical consequence (sustained at step 45, its third critical observation) and from then on, not the kept
    gradient, and not at the gap alone or at the explosion's first, lone, steps."""
    driver = driver_for(grpo_config(tmp_path), Guard(GuardConfig.preset("stable")))
    read = []
    for step, stats in enumerate(healthy_stream(48, seed=0), start=1):
        # verl's key for the gap, as its trainers log it (the stream's canonical mismatch_kl would be read first)
        gap = 0.01 if step >= 40 else stats.pop("mismatch_kl")
        stats.pop("mismatch_kl", None)
        data = {**stats, "rollout_corr/k3_kl": gap, "training/global_step": step}
        if step >= 43:
            data["ratio_max"] = 1000.0
        driver.on_log(data, step)
        read.append(correction_of(driver))
    assert all(r is not None and r["rollout_is"] is None for r in read[:44])  # steps 1-44
    assert all(r is not None and (r["rollout_is"], r["rollout_is_threshold"]) == ("token", 2.0) for r in read[44:])
    assert driver.controls.rollout_is_cap == 2.0 and not driver.controls.kept_gradient
