"""DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, eq. 9) as a rung of the guard's train-inference-gap
remedy: the ``off_policy_mask_delta`` control, the ``off_policy_mask`` capability of each actuator, its place in
``MismatchRemedy``'s ladder (after the kept gradient, before the LR back-off, never the first answer) and, on a
stock TRL ``GRPOTrainer``, its mapping onto TRL's own ``off_policy_mask_threshold``.

The float64 reference below is written from eq. 9 with Python floats, one token at a time: the GRPO term of a token
counts unless its sequence has a negative advantage and ``(1/|o_i|) sum_t log(pi_behaviour / pi)`` exceeds
``delta``; the normaliser ``1/|o_i|`` and the mean over the ``G`` sequences keep the masked ones. It shares no code
with ``rlguard.core_losses``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlguard.core_losses import Controls, PolicyBatch, get_objective
from rlguard.guards.actuation import CAPABILITIES, TorchActuator
from rlguard.guards.interventions.causes import CAUSES
from rlguard.guards.interventions.mismatch_remedy import REMEDIES, MismatchRemedy
from tests.helpers.mismatch import ctx, gap, trouble

TOL = 1e-10
DELTA = 0.3
MASK = [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
#: one advantage per sequence: row 0 positive (never masked), rows 1 and 2 negative
ADV = [1.0, -1.0, -0.5]
LOGP = [[-1.1, -0.4, -2.0, -0.7], [-1.5, -0.3, -0.9, -3.0], [-0.6, -1.3, -2.0, -2.0]]
#: log r = log pi - log pi_old: rows 0 and 1 drifted 0.5 and 0.4 nats per token (> DELTA), row 2 0.025
LOG_R = [[-0.6, -0.5, -0.4, -0.5], [-0.5, -0.4, -0.3, 0.0], [-0.1, 0.05, 0.0, 0.0]]
#: log rho = log pi_old - log mu (engine): against the engine row 1 drifted 0.367 and row 2 0.475 nats per token
LOG_RHO = [[0.1, 0.0, 0.1, 0.0], [0.05, 0.0, 0.05, 0.0], [-0.5, -0.4, 0.0, 0.0]]
#: the rows eq. 9 drops: against pi_old row 1; against the engine rows 1 and 2 (row 0 has A > 0)
DROPPED = {False: {1}, True: {1, 2}}


def make_batch(rollout: bool) -> tuple[PolicyBatch, torch.Tensor]:
    """The fixed float64 batch (engine log-probs only with ``rollout``) and its logprobs leaf."""
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.tensor(LOG_R, dtype=torch.float64)
    mu = old - torch.tensor(LOG_RHO, dtype=torch.float64) if rollout else None
    mask = torch.tensor(MASK, dtype=torch.float64)
    adv = torch.tensor(ADV, dtype=torch.float64).unsqueeze(1).expand(3, 4)
    return PolicyBatch(logprobs=logp, advantages=adv, mask=mask, old_logprobs=old, rollout_logprobs=mu), logp


def loss_and_grad(objective: Any, rollout: bool) -> tuple[torch.Tensor, torch.Tensor]:
    batch, logp = make_batch(rollout)
    loss = objective(batch).loss
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def reference(rollout: bool, delta: float | None, clip: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO with eq. 9's mask: -(1/G) sum_i (1/|o_i|) sum_t M_i min(r A, clip(r) A), token by token."""
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    total = torch.zeros((), dtype=torch.float64)
    for i, row in enumerate(MASK):
        idx = [t for t, m in enumerate(row) if m]
        # log pi_behaviour - log pi = -log r (pi_old), or -log r - log rho (the engine)
        drift = sum(-LOG_R[i][t] - (LOG_RHO[i][t] if rollout else 0.0) for t in idx) / len(idx)
        if delta is not None and ADV[i] < 0 and drift > delta:
            continue
        for t in idx:
            ratio = torch.exp(logp[i, t] - (LOGP[i][t] - LOG_R[i][t]))
            clipped = ratio.clamp(1 - clip, 1 + clip)
            total = total - torch.minimum(ratio * ADV[i], clipped * ADV[i]) / len(idx)
    loss = total / len(MASK)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


# ---------------------------------------------------------------- 1. the control on the objective
@pytest.mark.parametrize("rollout", [False, True])
def test_the_control_equals_the_configured_mask_and_eq_9(rollout: bool) -> None:
    """Controls(off_policy_mask_delta=d) == GRPO(off_policy_mask_delta=d): equal objectives, losses and gradients,
    both equal to eq. 9 written out; the mask drops the negative-advantage rows that drifted more than ``d`` from
    the behaviour policy (the engine's log-probs where given, else pi_old's), so the plain loss differs."""
    grpo = get_objective("grpo")
    controlled = grpo.with_controls(Controls(off_policy_mask_delta=DELTA))
    configured = get_objective("grpo", off_policy_mask_delta=DELTA)
    assert controlled == configured
    loss, grad = loss_and_grad(controlled, rollout)
    ref_loss, ref_grad = loss_and_grad(configured, rollout)
    close(loss, ref_loss)
    close(grad, ref_grad)
    eq9_loss, eq9_grad = reference(rollout, DELTA)
    close(loss, eq9_loss)
    close(grad, eq9_grad)
    plain_loss, _ = loss_and_grad(grpo, rollout)
    close(plain_loss, reference(rollout, None)[0])
    assert abs(float(plain_loss - loss)) > 1e-3
    for i in range(len(MASK)):
        assert bool((grad[i] == 0).all()) is (i in DROPPED[rollout]), i


def test_a_configured_delta_stays_as_configured() -> None:
    """An objective with its own off_policy_mask_delta keeps it under the control, alone or with other controls."""
    own = get_objective("grpo", off_policy_mask_delta=1.0)
    assert own.with_controls(Controls(off_policy_mask_delta=DELTA)) is own
    both = own.with_controls(Controls(off_policy_mask_delta=DELTA, rollout_is_cap=2.0))
    assert (both.off_policy_mask_delta, both.rollout_is, both.rollout_is_cap) == (1.0, "token", 2.0)
    assert get_objective("grpo").with_controls(Controls()) == get_objective("grpo")


def test_the_control_is_declared_validated_and_serialised() -> None:
    """The control needs the ``off_policy_mask`` capability; a negative or non-finite delta is refused naming it;
    ``to_dict``/``from_dict`` keep it."""
    assert "off_policy_mask" in CAPABILITIES
    assert Controls.capabilities()["off_policy_mask_delta"] == "off_policy_mask"
    assert Controls(off_policy_mask_delta=0.5).capabilities_needed() == {"off_policy_mask"}
    assert Controls(off_policy_mask_delta=0.5).without({"off_policy_mask"}) == Controls()
    for bad in (-0.1, math.nan, math.inf, True):
        with pytest.raises(ValueError, match="off_policy_mask_delta"):
            Controls(off_policy_mask_delta=bad)
    assert Controls.from_dict(Controls(off_policy_mask_delta=0.5).to_dict()) == Controls(off_policy_mask_delta=0.5)
    with pytest.raises(ValueError, match=r"mismatch_remedy\.off_policy_mask_delta"):
        MismatchRemedy(off_policy_mask_delta=-1.0)


# ---------------------------------------------------------------- 2. capabilities and the ladder
def torch_actuator(name: str = "grpo", rollout_correction: bool = False, objective: bool = True) -> TorchActuator:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TorchActuator(
        model, optimizer, objective=get_objective(name) if objective else None, rollout_correction=rollout_correction
    )


#: verl's driver for rlguard.grpo with the engine's log-probs beside a recomputed pi_old: no off-policy mask
VERL_LIKE = frozenset({"snapshot", "restore", "stop", "clip", "lr_scale", "kept_gradient", "rollout_correction"})


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        (
            torch_actuator(rollout_correction=True).capabilities,
            ["rollout_is", "rollout_mask", "kept_gradient", "off_policy_mask", "lr_backoff"],
        ),
        (torch_actuator().capabilities, ["kept_gradient", "off_policy_mask", "lr_backoff"]),
        (torch_actuator("cispo").capabilities, ["off_policy_mask", "lr_backoff"]),
        (torch_actuator(objective=False).capabilities, ["lr_backoff"]),
        (VERL_LIKE, ["rollout_is", "kept_gradient", "lr_backoff"]),
        (None, ["rollout_is", "rollout_mask", "kept_gradient", "off_policy_mask", "lr_backoff"]),
    ],
    ids=["torch-recomputed", "torch-engine-pi-old", "torch-cispo", "torch-no-objective", "verl-like", "unbound"],
)
def test_the_ladder_follows_the_capabilities(caps: frozenset[str] | None, expected: list[str]) -> None:
    """The new rung sits after kept_gradient and before lr_backoff where the actuator can carry it out."""
    assert MismatchRemedy().ladder(caps) == expected
    assert REMEDIES["off_policy_mask"][0] == "off_policy_mask"
    gap_rows = [c for c in CAUSES if c.answer == "mismatch_remedy"]
    assert len(gap_rows) == 2 and all(
        "kept_gradient" in c.remedies and "then off_policy_mask, then lr_backoff" in c.remedies for c in gap_rows
    )


def test_the_mask_is_never_the_first_answer() -> None:
    """CISPO on a plain loop (no kept gradient to switch, no rollout correction): the gap alone switches nothing,
    even with first_on='gap', although the actuator can apply the mask."""
    caps = torch_actuator("cispo").capabilities
    assert "off_policy_mask" in caps
    for first_on in ("auto", "gap"):
        remedy = MismatchRemedy(first_on=first_on)
        assert remedy.propose(ctx(0, gap(), caps)) is None
        assert remedy.propose(ctx(1, {**gap(), **trouble()}, caps)) is None
        assert remedy.active == ()


@pytest.mark.parametrize("rollout_correction", [True, False])
def test_escalation_reaches_the_mask_before_the_lr_backoff(rollout_correction: bool) -> None:
    """A critical consequence every step (first_on='gap'): one rung per trial period, the mask right after
    kept_gradient and before the first LR back-off, and the actuator's objective applies it from then on."""
    actuator = torch_actuator(rollout_correction=rollout_correction)
    caps = actuator.capabilities
    remedy = MismatchRemedy(first_on="gap")
    first = remedy.propose(ctx(0, gap(), caps))
    assert first is not None and first.reason
    switches: dict[int, tuple[str, ...]] = {0: remedy.active}
    for step in range(1, 60):
        p = remedy.propose(ctx(step, {**gap(), **trouble()}, caps))
        assert p is not None
        actuator.set_controls(Controls.from_dict(p.controls))
        if p.reason:
            switches[step] = remedy.active
            if remedy.active[-1] == "off_policy_mask":
                assert "off_policy_mask on" in p.reason and "DeepSeek-V3.2" in p.reason
    rungs = ("rollout_is", "rollout_mask", "kept_gradient") if rollout_correction else ("kept_gradient",)
    mask_step = 10 * len(rungs)
    assert switches[mask_step] == (*rungs, "off_policy_mask")
    assert switches[mask_step + 10] == (*rungs, "off_policy_mask", "lr_backoff")
    assert all(s <= mask_step for s, active in switches.items() if "lr_backoff" not in active)
    controls = remedy.controls()
    assert controls["off_policy_mask_delta"] == 0.5 and controls["lr_scale"] < 1.0
    assert actuator.objective_in_use.off_policy_mask_delta == 0.5


def test_remedy_state_round_trips_the_mask() -> None:
    """state_dict -> JSON -> load_state_dict with the mask switched on: same rungs and controls, and the LR
    back-off follows trial_steps after the restored switch."""
    caps = torch_actuator().capabilities
    remedy = MismatchRemedy(first_on="gap", off_policy_mask_delta=0.25)
    remedy.propose(ctx(0, gap(), caps))
    remedy.propose(ctx(10, trouble(), caps))
    assert remedy.active == ("kept_gradient", "off_policy_mask")
    state = json.loads(json.dumps(remedy.state_dict()))
    resumed = MismatchRemedy(first_on="gap", off_policy_mask_delta=0.25)
    resumed.load_state_dict(state)
    assert resumed.active == remedy.active
    assert resumed.controls() == remedy.controls() == {"kept_gradient": True, "off_policy_mask_delta": 0.25}
    p15 = resumed.propose(ctx(15, trouble(), caps))
    assert p15 is not None and not p15.reason
    resumed.propose(ctx(20, trouble(), caps))
    assert list(resumed.active) == ["kept_gradient", "off_policy_mask", "lr_backoff"]


# ---------------------------------------------------------------- 3. TRL: the controlled trainer and a stock one
def test_trl_capabilities_and_the_stock_mapping() -> None:
    """GuardedGRPOTrainer-like (a ControlledTrainer) and a stock trainer with ``off_policy_mask_threshold`` declare
    the capability; the stock one gets the delta as TRL's threshold, a threshold the user configured stays, and
    neutral controls restore the configured value."""
    pytest.importorskip("trl")
    from rlguard.adapters.trl.actuators import TrainerActuator, set_trl_off_policy_mask, trainer_capabilities

    class Controlled(SimpleNamespace):
        def rlguard_set_controls(self, controls: Controls) -> None:
            self.controls = controls

    assert "off_policy_mask" in trainer_capabilities(Controlled(rlguard_configured_objective=get_objective("grpo")))
    assert "off_policy_mask" not in trainer_capabilities(SimpleNamespace(use_vllm=False))
    stock = SimpleNamespace(use_vllm=False, off_policy_mask_threshold=None, args=SimpleNamespace())
    stock.args.off_policy_mask_threshold = None
    assert "off_policy_mask" in trainer_capabilities(stock)
    model = torch.nn.Linear(2, 1)
    actuator = TrainerActuator(model, torch.optim.SGD(model.parameters(), lr=0.1), owns_step=False, trainer=stock)
    assert "off_policy_mask" in actuator.capabilities
    actuator.set_controls(Controls(off_policy_mask_delta=0.5))
    assert stock.off_policy_mask_threshold == 0.5
    actuator.set_controls(Controls())
    assert stock.off_policy_mask_threshold is None
    users = SimpleNamespace(off_policy_mask_threshold=1.0, args=SimpleNamespace(off_policy_mask_threshold=1.0))
    set_trl_off_policy_mask(users, Controls(off_policy_mask_delta=0.5))
    assert users.off_policy_mask_threshold == 1.0


@pytest.fixture(scope="module")
def trl_helpers() -> Any:
    """The TRL parity harness of ``tests/helpers/trl_parity.py`` (real trainer on the tiny Llama, shared stub)."""
    pytest.importorskip("trl")
    from tests.helpers import trl_parity

    return trl_parity


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("trl")
    from rlguard.tasks.hf import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.mark.parametrize("sampling", [False, True], ids=["behaviour-pi-old", "behaviour-engine"])
def test_stock_trl_with_the_mapped_threshold_equals_the_control(
    trl_helpers: Any, model_dir: Path, sampling: bool
) -> None:
    """TRL 1.16's own ``GRPOTrainer._compute_loss`` with ``off_policy_mask_threshold`` set by the guard's mapping
    equals ``GuardedGRPOTrainer`` with the ``off_policy_mask_delta`` control (its objective applies it): loss and
    gradient, on a batch where the mask drops some sequences and not others and changes the loss. The behaviour
    log-probs are pi_old's, or vLLM's where the batch carries them."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rlguard.adapters.trl import GuardedGRPOTrainer
    from rlguard.adapters.trl.actuators import set_trl_off_policy_mask

    h = trl_helpers
    delta = 0.2
    trainer = h.trainer_for(model_dir, loss_type="grpo", beta=0.0)
    assert trainer.args.off_policy_mask_threshold is None and trainer.off_policy_mask_threshold is None
    theta, inputs, policy = h.make_inputs(11, ref=False, sampling=sampling)
    keeps = {
        key: GRPOTrainer.get_off_policy_mask(
            inputs["advantages"].unsqueeze(1), policy()[0], inputs[key], inputs["completion_mask"], delta
        )
        for key in ("old_per_token_logps", "sampling_per_token_logps")
        if key in inputs
    }
    keep = keeps["sampling_per_token_logps" if sampling else "old_per_token_logps"]
    assert 1 < keep.sum() < h.B, "the mask must drop some sequences, not all (the empty row is always kept)"
    # against the engine it drops a sequence it keeps against pi_old: the test tells the behaviour log-probs apart
    assert not sampling or not torch.equal(keeps["old_per_token_logps"], keep)
    plain_loss, _ = h.run(trainer, GRPOTrainer._compute_loss, theta, inputs, policy)
    try:
        set_trl_off_policy_mask(trainer, Controls(off_policy_mask_delta=delta))
        assert trainer.off_policy_mask_threshold == delta
        trl_loss, trl_grad = h.run(trainer, GRPOTrainer._compute_loss, theta, inputs, policy)
        set_trl_off_policy_mask(trainer, Controls())
        assert trainer.off_policy_mask_threshold is None
        trainer.rlguard_set_controls(Controls(off_policy_mask_delta=delta))
        assert trainer.rlguard_objective.off_policy_mask_delta == delta
        loss, grad = h.run(trainer, GuardedGRPOTrainer._compute_loss, theta, inputs, policy)
    finally:
        trainer.off_policy_mask_threshold = None
        trainer.rlguard_set_controls(Controls())
    assert abs(float(plain_loss - trl_loss)) > 1e-4, "degenerate case: the mask must change TRL's loss"
    torch.testing.assert_close(loss, trl_loss.to(loss.dtype), rtol=h.RTOL, atol=h.ATOL)
    torch.testing.assert_close(grad, trl_grad, rtol=h.RTOL, atol=h.ATOL)
