"""The train-inference gap remedies: the kept gradient (CISPO's truncated weight) on clipped objectives, the rollout
corrections the guard's controls switch on, ``MismatchRemedy``'s ladder and its wiring in the ``stable`` preset.

The float64 references below are written from CISPO's formula (MiniMax-M1, arXiv 2506.13585, eqs. 4-5) one token at
a time with Python floats for the detached weights; they share no code with ``rlguard.core_losses``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlguard.core_losses import PolicyBatch, get_objective
from rlguard.guards import Controls, Guard, GuardConfig
from rlguard.guards.actuation import CAPABILITIES, TorchActuator, apply_decision, bind_guard
from rlguard.guards.interventions import StepContext
from rlguard.guards.interventions.mismatch_remedy import MismatchRemedy
from tests.helpers.mismatch import NO_ROLLOUT, TIS_ONLY, WITH_ROLLOUT, ctx, gap, trouble
from tests.helpers.synthetic import healthy_stream

TOL = 1e-10
MASK = [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
#: log r = log pi - log pi_old: tokens far above 1 + 0.28 and far below 1 - 0.2, and some inside
LOG_R = [[0.8, -0.9, 0.05, 0.3], [-0.5, 0.1, 1.2, 0.0], [0.02, -0.3, 0.0, 0.0]]
ADV = [[1.0, -1.0, 0.5, 2.0], [-0.7, 0.3, 1.5, 0.0], [-1.2, 0.8, 0.0, 0.0]]
LOGP = [[-1.1, -0.4, -2.0, -0.7], [-1.5, -0.3, -0.9, -3.0], [-0.6, -1.3, -2.0, -2.0]]
#: log rho = log pi_old - log mu (engine): token 0 above a cap of 1.5, row 2's geometric mean below 1/1.5
LOG_RHO = [[0.6, -0.1, 0.2, 0.5], [0.05, -0.02, 0.1, 0.0], [-0.7, -0.6, 0.0, 0.0]]


def make_batch(rollout: bool = False) -> tuple[PolicyBatch, torch.Tensor]:
    """The fixed float64 batch and its logprobs leaf."""
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    old = logp.detach() - torch.tensor(LOG_R, dtype=torch.float64)
    mu = old - torch.tensor(LOG_RHO, dtype=torch.float64) if rollout else None
    mask = torch.tensor(MASK, dtype=torch.float64)
    adv = torch.tensor(ADV, dtype=torch.float64)
    return PolicyBatch(logprobs=logp, advantages=adv, mask=mask, old_logprobs=old, rollout_logprobs=mu), logp


def loss_and_grad(objective: object, rollout: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    batch, logp = make_batch(rollout)
    loss = objective(batch).loss  # type: ignore[operator]
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


def reference_token_kept(high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-sum_t sg[min(r_t, high)] A_t log pi_t / N (token mean), token by token."""
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    n = sum(map(sum, MASK))
    total = torch.zeros((), dtype=torch.float64)
    for i, row in enumerate(MASK):
        for t, m in enumerate(row):
            if m:
                weight = min(math.exp(LOG_R[i][t]), high)
                total = total - weight * ADV[i][t] * logp[i, t]
    loss = total / n
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def reference_seq_kept(high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's ratio s_i = exp(mean_t log r_it), weight sg[min(s_i, high)], seq-mean of token means."""
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    per_seq = []
    for i, row in enumerate(MASK):
        idx = [t for t, m in enumerate(row) if m]
        s_i = math.exp(sum(LOG_R[i][t] for t in idx) / len(idx))
        weight = min(s_i, high)
        per_seq.append(sum(-weight * ADV[i][t] * logp[i, t] for t in idx) / len(idx))
    loss = sum(per_seq) / len(per_seq)
    (grad,) = torch.autograd.grad(loss, logp)  # type: ignore[arg-type]
    return loss.detach(), grad  # type: ignore[union-attr]


# ---------------------------------------------------------------- 1. the kept gradient on the objectives
def test_grpo_kept_gradient_matches_the_cispo_formula() -> None:
    """GRPO (0.2, 0.28) with kept_gradient: -sg[min(r, 1.28)] A log pi, token mean, to 1e-10 in float64."""
    grpo = get_objective("grpo", clip_low=0.2, clip_high=0.28, aggregation="token-mean", kept_gradient=True)
    loss, grad = loss_and_grad(grpo)
    ref_loss, ref_grad = reference_token_kept(1.28)
    close(loss, ref_loss)
    close(grad, ref_grad)


def test_kept_gradient_keeps_the_gradient_plain_grpo_zeroes() -> None:
    """Tokens with r far outside [0.8, 1.28] on the clipped side: zero gradient in GRPO, non-zero when kept."""
    hp = {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token-mean"}
    _, plain = loss_and_grad(get_objective("grpo", **hp))
    _, kept = loss_and_grad(get_objective("grpo", **hp, kept_gradient=True))
    clipped = [(0, 0), (0, 1), (0, 3), (1, 0), (1, 2)]  # r > 1.28 with A > 0, or r < 0.8 with A < 0
    for i, t in clipped:
        assert plain[i, t] == 0.0, (i, t)
        assert abs(float(kept[i, t])) > 1e-3, (i, t)
    pad = torch.tensor(MASK) == 0
    assert bool((kept[pad] == 0).all()) and bool((plain[~pad] != 0).any())


def test_gspo_kept_gradient_truncates_the_sequence_ratio() -> None:
    """GSPO with kept_gradient: weight min(s_i, 1 + clip_high) per sequence, seq-mean-token-mean, to 1e-10."""
    gspo = get_objective("gspo", clip_low=0.1, clip_high=0.1, kept_gradient=True)
    loss, grad = loss_and_grad(gspo)
    ref_loss, ref_grad = reference_seq_kept(1.1)
    close(loss, ref_loss)
    close(grad, ref_grad)
    # the truncation matters on this batch (row 1's s_i = exp(0.267) > 1.1): a higher cap changes the loss
    wide_loss, _ = loss_and_grad(get_objective("gspo", clip_low=0.1, clip_high=0.5, kept_gradient=True))
    assert abs(float(wide_loss - loss)) > 1e-3


@pytest.mark.parametrize("name", ["cispo", "sapo"])
def test_objectives_that_keep_every_gradient_are_left_alone(name: str) -> None:
    """CISPO and SAPO: kept_gradient changes nothing (same instance), and the actuator lacks the capability."""
    objective = get_objective(name)
    assert objective.with_controls(Controls(kept_gradient=True)) is objective
    model = torch.nn.Linear(2, 1)
    actuator = TorchActuator(model, torch.optim.SGD(model.parameters(), lr=0.1), objective=objective)
    assert "kept_gradient" not in actuator.capabilities
    assert "clip" in actuator.capabilities


def test_grpo_with_kept_gradient_control_and_capabilities() -> None:
    """GRPO: with_controls(kept_gradient) sets the field; the actuator offers kept_gradient, not rollout correction."""
    grpo = get_objective("grpo")
    assert grpo.with_controls(Controls(kept_gradient=True)) == get_objective("grpo", kept_gradient=True)
    assert grpo.with_controls(Controls()) is grpo
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert {"kept_gradient", "clip"} <= TorchActuator(model, opt, objective=grpo).capabilities
    assert "rollout_correction" not in TorchActuator(model, opt, objective=grpo).capabilities
    assert {"rollout_correction", "rollout_mask"} <= TorchActuator(
        model, opt, objective=grpo, rollout_correction=True
    ).capabilities
    bare = TorchActuator(model, opt, rollout_correction=True).capabilities
    assert not bare & {"kept_gradient", "rollout_correction", "clip"}


# ---------------------------------------------------------------- 2. the rollout corrections as controls
@pytest.mark.parametrize(
    ("control", "configured", "different"),
    [
        # token TIS: its cap acts on this batch (the default cap 2 gives another loss)
        ({"rollout_is_cap": 1.5}, {"rollout_is": "token", "rollout_is_cap": 1.5}, {"rollout_is": "token"}),
        # geometric mask [1/1.5, 1.5]: rejects row 2 (its mean log rho is -0.65)
        ({"rollout_mask_high": 1.5}, {"rollout_mask": "geometric", "rollout_mask_high": 1.5}, None),
    ],
)
def test_rollout_controls_equal_the_configured_corrections(
    control: dict[str, float], configured: dict[str, object], different: dict[str, object] | None
) -> None:
    """Controls(rollout_is_cap=C) == GRPO(rollout_is="token", rollout_is_cap=C) and Controls(rollout_mask_high=C)
    == GRPO(rollout_mask="geometric", rollout_mask_high=C): equal objectives, losses and gradients, and the
    correction acts on this batch (the plain loss differs)."""
    grpo = get_objective("grpo")
    controlled = grpo.with_controls(Controls(**control))  # type: ignore[arg-type]
    reference = get_objective("grpo", **configured)
    assert controlled == reference
    loss, grad = loss_and_grad(controlled, rollout=True)
    ref_loss, ref_grad = loss_and_grad(reference, rollout=True)
    close(loss, ref_loss)
    close(grad, ref_grad)
    others = [grpo] + ([get_objective("grpo", **different)] if different else [])
    for other in others:
        assert abs(float(loss_and_grad(other, rollout=True)[0] - loss)) > 1e-4
    if "rollout_mask_high" in control:
        assert bool((grad[2] == 0).all()) and bool((grad[0] != 0).any())


def test_a_configured_rollout_correction_stays_as_configured() -> None:
    """An objective with its own rollout_is / rollout_mask keeps the user's level and bound under the controls."""
    seq_is = get_objective("grpo", rollout_is="sequence", rollout_is_cap=3.0)
    assert seq_is.with_controls(Controls(rollout_is_cap=1.5)) is seq_is
    tok_mask = get_objective("grpo", rollout_mask="token", rollout_mask_high=3.0)
    assert tok_mask.with_controls(Controls(rollout_mask_high=1.5)) is tok_mask
    # the other kind of correction is still added where none was configured
    both = seq_is.with_controls(Controls(rollout_is_cap=1.5, rollout_mask_high=1.5))
    assert (both.rollout_is, both.rollout_is_cap) == ("sequence", 3.0)
    assert (both.rollout_mask, both.rollout_mask_high, both.rollout_mask_low) == ("geometric", 1.5, None)


# ---------------------------------------------------------------- 3. MismatchRemedy on synthetic contexts
@pytest.mark.parametrize("first_on", ["auto", "gap"])
def test_remedy_switches_on_only_for_the_gap(first_on: str) -> None:
    """pi_old = engine's (no rollout_correction): other detectors' findings (even critical) propose nothing; a
    warn mismatch_growth finding switches the first rung at once."""
    remedy = MismatchRemedy(first_on=first_on)  # type: ignore[arg-type]
    for step, name in enumerate(("reward_collapse", "kl_old_blowup", "clip_frac_burst")):
        assert remedy.propose(ctx(step, trouble(name), NO_ROLLOUT)) is None
    assert remedy.active == ()
    p = remedy.propose(ctx(5, gap("warn"), NO_ROLLOUT))
    assert p is not None and p.outcome == "step" and "mismatch_growth" in p.reason
    assert remedy.active == ("kept_gradient",) and dict(p.controls) == {"kept_gradient": True}
    # a higher severity bar: a warn finding is not enough
    assert MismatchRemedy(severity="critical").propose(ctx(0, gap("warn"), NO_ROLLOUT)) is None


def test_remedy_waits_for_a_consequence_where_pi_old_is_recomputed() -> None:
    """pi_old recomputed (rollout_correction): the gap arms the remedy; TIS switches on at the first critical
    consequence after it, not at the gap, not on a warn, not on a consequence before any gap."""
    remedy = MismatchRemedy()
    assert remedy.propose(ctx(0, trouble("reward_collapse"))) is None  # no gap yet: nothing to cure
    assert remedy.propose(ctx(1, gap("warn"))) is None
    for step in range(2, 30):  # the gap comes and goes; warnings and critical non-consequences do not count
        findings = {**trouble("entropy_collapse", "warn"), **trouble("clip_frac_burst", "critical")}
        assert remedy.propose(ctx(step, {**findings, **(gap() if step % 2 else {})})) is None
    assert remedy.active == ()
    p = remedy.propose(ctx(30, trouble("kl_ref_blowup")))  # no gap finding this step: armed at step 1
    assert p is not None and p.outcome == "step"
    assert "diagnosed at step 1" in p.reason and "kl_ref_blowup" in p.reason and "rollout_is on" in p.reason
    assert remedy.active == ("rollout_is",) and dict(p.controls) == {"rollout_is_cap": 2.0}
    # the next rung waits trial_steps after this switch, as everywhere
    later = remedy.propose(ctx(35, trouble()))
    assert later is not None and not later.reason and remedy.active == ("rollout_is",)
    # first_on="gap" switches TIS at the gap here too; "consequence" waits even where pi_old is the engine's
    eager = MismatchRemedy(first_on="gap")
    assert eager.propose(ctx(0, gap())) is not None and eager.active == ("rollout_is",)
    patient = MismatchRemedy(first_on="consequence")
    assert patient.propose(ctx(0, gap(), NO_ROLLOUT)) is None
    assert patient.propose(ctx(1, trouble(), NO_ROLLOUT)) is not None and patient.active == ("kept_gradient",)
    with pytest.raises(ValueError, match=r"mismatch_remedy\.first_on"):
        MismatchRemedy(first_on="always")  # type: ignore[arg-type]


def test_remedy_first_rung_depends_on_the_capabilities() -> None:
    """Without rollout_correction the first rung is kept_gradient; without either, the gap alone proposes nothing
    (neither the off-policy mask nor the LR is a first answer)."""
    p = MismatchRemedy().propose(ctx(0, gap(), NO_ROLLOUT))
    assert p is not None and dict(p.controls) == {"kept_gradient": True}
    assert MismatchRemedy().propose(ctx(0, gap(), NO_ROLLOUT - {"kept_gradient"})) is None  # never mask/LR first
    assert MismatchRemedy().active == ()
    unbound = MismatchRemedy()
    unbound.propose(ctx(0, gap(), None))
    assert unbound.active == ("rollout_is",)
    assert MismatchRemedy().ladder(TIS_ONLY) == ["rollout_is", "kept_gradient", "lr_backoff"]
    assert MismatchRemedy().ladder(WITH_ROLLOUT) == [
        "rollout_is",
        "rollout_mask",
        "kept_gradient",
        "off_policy_mask",
        "lr_backoff",
    ]


def test_remedy_escalates_only_after_trial_steps_then_backs_the_lr_off() -> None:
    """A critical consequence every step: a rung every 10 steps, then LR x0.5 per failure down to 0.05."""
    remedy = MismatchRemedy(first_on="gap")
    remedy.propose(ctx(0, gap()))
    switches = {}
    for step in range(1, 100):
        p = remedy.propose(ctx(step, {**gap(), **trouble()}))
        assert p is not None
        if p.reason:
            assert "did not help (reward_collapse)" in p.reason
            switches[step] = (remedy.active, p.controls.get("lr_scale"))
    rungs = ("rollout_is", "rollout_mask", "kept_gradient", "off_policy_mask", "lr_backoff")
    assert switches == {
        10: (rungs[:2], None),
        20: (rungs[:3], None),
        30: (rungs[:4], None),
        40: (rungs, 0.5),
        50: (rungs, 0.25),
        60: (rungs, 0.125),
        70: (rungs, 0.0625),
        80: (rungs, 0.05),
    }
    final = remedy.propose(ctx(100, trouble()))
    assert final is not None and dict(final.controls) == {
        "kept_gradient": True,
        "rollout_is_cap": 2.0,
        "rollout_mask_high": 2.0,
        "off_policy_mask_delta": 0.5,
        "lr_scale": 0.05,
    }


def test_remedy_does_not_escalate_on_warnings_or_other_detectors() -> None:
    """Warn-level consequences and critical findings outside escalate_on leave the first rung alone."""
    remedy = MismatchRemedy(first_on="gap")
    remedy.propose(ctx(0, gap()))
    for step in range(10, 40):
        findings = {**trouble("entropy_collapse", "warn"), **trouble("clip_frac_burst", "critical")}
        p = remedy.propose(ctx(step, findings))
        assert p is not None and not p.reason and dict(p.controls) == {"rollout_is_cap": 2.0}
    assert remedy.active == ("rollout_is",)
    p = remedy.propose(ctx(40, trouble("grad_norm_explosion")))
    assert p is not None and p.reason and remedy.active == ("rollout_is", "rollout_mask")


def test_remedies_field_forbids_the_others() -> None:
    """remedies=("kept_gradient",): that rung first even with rollout correction, and nothing after it."""
    remedy = MismatchRemedy(remedies=("kept_gradient",), first_on="gap")
    p = remedy.propose(ctx(0, gap()))
    assert p is not None and dict(p.controls) == {"kept_gradient": True}
    for step in (10, 20, 35):
        later = remedy.propose(ctx(step, {**gap("critical"), **trouble()}))
        assert later is not None and not later.reason and dict(later.controls) == {"kept_gradient": True}
    assert remedy.active == ("kept_gradient",)
    # forbidden everywhere the actuator could: the gap alone proposes nothing
    assert MismatchRemedy(remedies=("kept_gradient",)).propose(ctx(0, gap(), WITH_ROLLOUT - {"kept_gradient"})) is None


@pytest.mark.parametrize("remedies", [("tis",), ("kept_gradient", "kept_gradient"), ("rollout_is", "lr_back_off")])
def test_unknown_or_repeated_remedies_raise(remedies: tuple[str, ...]) -> None:
    """Unknown or duplicated remedy names are refused with a ValueError."""
    with pytest.raises(ValueError, match=r"mismatch_remedy\.remedies"):
        MismatchRemedy(remedies=remedies)


def test_remedy_state_round_trips_the_active_rungs() -> None:
    """state_dict -> JSON -> load_state_dict restores the active rungs, the last switch and the LR scale."""
    remedy = MismatchRemedy(first_on="gap")
    remedy.propose(ctx(0, gap()))
    remedy.propose(ctx(10, trouble()))
    state = json.loads(json.dumps(remedy.state_dict()))
    resumed = MismatchRemedy(first_on="gap")
    resumed.load_state_dict(state)
    assert resumed.active == ("rollout_is", "rollout_mask")
    assert resumed.controls() == remedy.controls()
    # the trial period continues from the restored switch: no escalation at step 15, one at 20
    p15 = resumed.propose(ctx(15, trouble()))
    assert p15 is not None and not p15.reason
    resumed.propose(ctx(20, trouble()))
    assert resumed.active == ("rollout_is", "rollout_mask", "kept_gradient")


# ---------------------------------------------------------------- 4. through a real guard (the stable preset)
def run_stable(
    rollout_correction: bool, mismatch: bool, steps: int = 45, explode_at: int | None = None
) -> tuple[TorchActuator, Guard, list]:  # type: ignore[type-arg]
    """The stable guard bound to a tiny torch loop; mismatch_kl jumps to 0.01 (> 0.005) from step 40; from
    ``explode_at`` on the max ratio is 1000 (a ratio_explosion critical by consequence once sustained: 3 critical
    observations of 5, ``ConsequenceRule.sustained``)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    actuator = TorchActuator(model, opt, objective=get_objective("grpo"), rollout_correction=rollout_correction)
    guard = Guard(GuardConfig.preset("stable"))
    bind_guard(guard, actuator, where="a test loop")
    assert guard.capabilities == actuator.capabilities
    decisions = []
    for step, stats in enumerate(healthy_stream(steps, seed=0)):
        if mismatch and step >= 40:
            stats["mismatch_kl"] = 0.01
        if explode_at is not None and step >= explode_at:
            stats["ratio_max"] = 1000.0
        decision = guard.observe(step, stats)
        apply_decision(decision, actuator)
        decisions.append(decision)
    return actuator, guard, decisions


def remedy_events(decisions: list) -> list:  # type: ignore[type-arg]
    """The action:set_clip events whose reason names mismatch_growth."""
    events = [e for d in decisions for e in d.events]
    return [e for e in events if e.detector == "action:set_clip" and "mismatch_growth" in e.message]


def test_stable_guard_keeps_the_gradient_on_a_gap() -> None:
    """pi_old = engine's: the jump switches kept_gradient on (action:set_clip naming mismatch_growth) and the
    actuator's objective keeps the gradient from then on."""
    actuator, guard, decisions = run_stable(rollout_correction=False, mismatch=True)
    assert not any(d.controls.kept_gradient for d in decisions[:40])
    assert all(d.controls.kept_gradient and d.controls.rollout_is_cap is None for d in decisions[40:])
    events = remedy_events(decisions)
    assert [e.step for e in events] == [40] and "kept_gradient on" in events[0].message
    assert actuator.objective_in_use.kept_gradient is True
    assert actuator.objective_in_use == get_objective("grpo", kept_gradient=True)
    assert guard.interventions["mismatch_remedy"].active == ("kept_gradient",)  # type: ignore[attr-defined]


def test_stable_guard_corrects_the_rollout_where_it_can() -> None:
    """With rollout_correction the first remedy is token TIS with cap 2, not the kept gradient, from the gap's
    first critical consequence (the explosion from step 43 is sustained at 45, its third critical observation);
    the gap alone, and the explosion's first two steps (skipped), switch nothing."""
    _, _, quiet = run_stable(rollout_correction=True, mismatch=True)
    assert not any(d.controls.rollout_is_cap or d.controls.kept_gradient for d in quiet)
    actuator, _, decisions = run_stable(rollout_correction=True, mismatch=True, steps=48, explode_at=43)
    assert [d.outcome for d in decisions[43:45]] == ["skip", "skip"]
    assert not any(d.controls.rollout_is_cap for d in decisions[:45])
    assert all(d.controls.rollout_is_cap == 2.0 and not d.controls.kept_gradient for d in decisions[45:])
    events = [e for d in decisions for e in d.events if e.detector == "action:set_clip" and "rollout_is" in e.message]
    assert [e.step for e in events] == [45] and "ratio_explosion" in events[0].message
    used = actuator.objective_in_use
    assert (used.rollout_is, used.rollout_is_cap, used.kept_gradient) == ("token", 2.0, False)


def test_stable_guard_switches_nothing_without_a_gap() -> None:
    """The same stats without the jump: no remedy, the configured objective stays in use."""
    actuator, guard, decisions = run_stable(rollout_correction=True, mismatch=False)
    assert not remedy_events(decisions)
    assert all(not d.controls.kept_gradient and d.controls.rollout_is_cap is None for d in decisions)
    assert actuator.objective_in_use is actuator.objective
    assert guard.interventions["mismatch_remedy"].active == ()  # type: ignore[attr-defined]


def test_stable_lr_backoff_no_longer_answers_the_gap() -> None:
    """stable: mismatch_remedy on and lr_backoff without mismatch_growth; default keeps both as they were."""
    stable = Guard(GuardConfig.preset("stable")).interventions
    default = Guard(GuardConfig.preset("default")).interventions
    assert "mismatch_remedy" in stable and "mismatch_remedy" not in default
    assert "mismatch_growth" not in stable["lr_backoff"].on  # type: ignore[attr-defined]
    assert "mismatch_growth" in default["lr_backoff"].on  # type: ignore[attr-defined]
    assert "grad_norm_spike" in stable["lr_backoff"].on  # type: ignore[attr-defined]


@pytest.mark.parametrize("caps", [NO_ROLLOUT, None, WITH_ROLLOUT])
@pytest.mark.parametrize("signal", ["ratio_explosion", "kl_old_blowup", "grad_norm_spike", "kl_ref_blowup"])
def test_stable_lr_backoff_leaves_the_lr_to_the_remedy_while_the_gap_is_found(
    caps: frozenset[str] | None, signal: str
) -> None:
    """stable's lr_backoff: a signal (even critical) on a step with a mismatch_growth finding does not back the LR
    off, whoever computes pi_old; without the gap finding the same signal backs it off."""
    guard = Guard(GuardConfig.preset("stable"))
    backoff = guard.interventions["lr_backoff"]
    for step in range(0, 40, 10):
        with_gap = backoff.propose(ctx(step, {**gap(), **trouble(signal, "critical")}, caps, guard))
        assert with_gap is not None and not with_gap.reason and with_gap.controls["lr_scale"] == 1.0
    alone = backoff.propose(ctx(40, trouble(signal, "warn"), caps, guard))
    assert alone is not None and alone.controls["lr_scale"] == 0.5 and signal in alone.reason
    # default has no hold: the gap finding is itself one of its signals
    default = Guard(GuardConfig.preset("default"))
    first = default.interventions["lr_backoff"].propose(ctx(0, {**gap(), **trouble(signal, "warn")}, caps, default))
    assert first is not None and first.controls["lr_scale"] == 0.5


@pytest.mark.parametrize("caps", [NO_ROLLOUT, WITH_ROLLOUT])
def test_stable_without_the_remedy_backs_the_lr_off_on_the_gaps_consequences(caps: frozenset[str]) -> None:
    """``"mismatch_remedy": None`` in stable: nothing answers the gap, so lr_backoff holds nothing and backs off on a
    critical signal found beside the gap, as it does without it; with the remedy on, the same step is held."""
    stable = GuardConfig.preset("stable")
    off = Guard(GuardConfig(**{**stable.__dict__, "interventions": {**stable.interventions, "mismatch_remedy": None}}))
    assert "mismatch_remedy" not in off.interventions
    findings = {**gap(), **trouble("grad_norm_spike", "critical")}
    proposal = off.interventions["lr_backoff"].propose(ctx(0, findings, caps, off))
    assert proposal is not None and proposal.controls["lr_scale"] == 0.5 and "grad_norm_spike" in proposal.reason
    on = Guard(stable)
    held = on.interventions["lr_backoff"].propose(ctx(0, findings, caps, on))
    assert held is not None and held.controls["lr_scale"] == 1.0 and not held.reason


@pytest.mark.parametrize(("caps", "holds"), [(NO_ROLLOUT, True), (None, True), (WITH_ROLLOUT, False)])
def test_stable_clip_controller_holds_on_the_gap_only_where_pi_old_is_the_engines(
    caps: frozenset[str] | None, holds: bool
) -> None:
    """kl_old 0.1 (5x the target) with a gap finding: the clip range stays where pi_old is the engine's (kl_old
    measures the gap) and tightens where pi_old is recomputed (kl_old measures the update)."""
    controller = Guard(GuardConfig.preset("stable")).interventions["clip_controller"]
    proposal = controller.propose(StepContext(0, {"kl_old": 0.1}, gap(), {}, {}, 0, None, capabilities=caps))
    assert proposal is not None
    assert proposal.controls["clip_scale"] == (1.0 if holds else 1 / 1.5)


def test_capabilities_are_known_to_the_actuator_contract() -> None:
    """The new capabilities are declared, and the controls map onto them."""
    assert {"kept_gradient", "rollout_correction", "rollout_mask"} <= CAPABILITIES
    caps = Controls.capabilities()
    assert caps["kept_gradient"] == "kept_gradient"
    assert (caps["rollout_is_cap"], caps["rollout_mask_high"]) == ("rollout_correction", "rollout_mask")
    assert Controls(kept_gradient=True, rollout_is_cap=2.0).capabilities_needed() == {
        "kept_gradient",
        "rollout_correction",
    }
    with pytest.raises(ValueError, match="rollout_is_cap"):
        Controls(rollout_is_cap=0.5)
