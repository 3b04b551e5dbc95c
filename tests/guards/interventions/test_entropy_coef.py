"""``rlguard.guards.interventions.entropy_coef``: Skywork-OR1's adaptive entropy coefficient (arXiv 2505.22312), against
a float64 reference written from the paper's rule and TRL 1.16's code, and against TRL's own trainer: a real
``trl.GRPOTrainer(use_adaptive_entropy=True)`` and ``GuardedGRPOTrainer`` with the same flag train the same tiny model,
and their losses and logged ``entropy_coef`` agree step by step; the coefficient survives a TRL checkpoint."""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
from rlguard.guards import Constant, Guard, GuardConfig
from rlguard.guards.decision import logged_action
from rlguard.guards.interventions import CAUSES, StepContext
from rlguard.guards.interventions.entropy_coef import AdaptiveEntropy
from rlguard.guards.registry import intervention_registry
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama


def reference(
    entropies: Sequence[float], *, target: float, delta: float, lo: float, hi: float, c0: float
) -> tuple[list[float], list[float]]:
    """TRL 1.16 ``GRPOTrainer._compute_loss`` (``use_adaptive_entropy``), step by step: the coefficient applied in
    step ``k`` is ``c`` if the previous step's entropy was ``<= target`` (none before the first: ``inf``), then
    ``c <- min(c + delta, hi)`` if this step's entropy is ``<= target``, else ``max(c - delta, lo)``. Returns the
    applied coefficient of each step and ``c`` after it (what TRL logs as ``entropy_coef``)."""
    c, last = c0, math.inf
    applied, logged = [], []
    for h in entropies:
        applied.append(c if last <= target else 0.0)
        c = min(c + delta, hi) if h <= target else max(c - delta, lo)
        last = h
        logged.append(c)
    return applied, logged


def ctx(step: int, stats: dict[str, float]) -> StepContext:
    return StepContext(
        step=step, stats=stats, findings={}, alarms={}, alarm_age={}, consecutive_skips=0, last_healthy_step=None
    )


def drive(iv: AdaptiveEntropy, entropies: Sequence[float]) -> tuple[list[float], list[float]]:
    """The applied coefficient of each step (the control proposed after the step before; 0 before the first) and
    the coefficient after each step."""
    applied, logged, current = [], [], 0.0
    for step, h in enumerate(entropies):
        applied.append(current)
        proposal = iv.propose(ctx(step, {"entropy": h}))
        assert proposal is not None and proposal.outcome == "step"
        coef = proposal.controls["entropy_coef"]
        assert coef is not None  # a coefficient, never "as configured"
        current = coef
        logged.append(iv.coef)
    return applied, logged


# around the target, on it exactly (<= applies), far above it, and a run to both bounds
ENTROPIES = [0.5, 0.3, 0.2, 0.19, 0.1, 0.05, 0.21, 0.4, 0.2, 0.0, 0.0, 0.0, 0.9, 0.9, 0.9, 0.9, 0.9, 0.15]


@pytest.mark.parametrize(
    "fields",
    [
        {},  # TRL's defaults: target 0.2, delta 0.005, bounds [0, 1], initial 0
        {"target": 0.2, "delta": 0.04, "coef_min": 0.01, "coef_max": 0.1, "initial_coef": 0.05},
        {"target": 0.25, "delta": 0.3, "coef_min": 0.0, "coef_max": 0.5, "initial_coef": 0.5},
    ],
)
def test_the_coefficient_follows_the_reference(fields: dict[str, Any]) -> None:
    iv = AdaptiveEntropy(**fields)
    applied, logged = drive(iv, ENTROPIES)
    ref_applied, ref_logged = reference(
        ENTROPIES,
        target=iv.target,
        delta=iv.delta,
        lo=iv.coef_min,
        hi=iv.coef_max,
        c0=iv.initial_coef,
    )
    assert applied == ref_applied and logged == ref_logged  # the same float operations: exactly equal
    assert len(set(logged)) > 3  # the coefficient moved both ways


def test_the_bonus_is_gated_off_above_the_target_and_its_switches_are_announced() -> None:
    iv = AdaptiveEntropy(target=0.2, delta=0.1, initial_coef=0.3)
    first = iv.propose(ctx(0, {"entropy": 0.5}))  # above: coefficient down to 0.2, bonus off
    assert first is not None and first.controls == {"entropy_coef": 0.0} and not first.reason
    assert iv.coef == pytest.approx(0.2) and iv.applied_coef == 0.0
    on = iv.propose(ctx(1, {"entropy": 0.2}))  # at the target: on, with the raised coefficient
    assert on is not None and on.controls["entropy_coef"] == pytest.approx(0.3) and iv.applied_coef == iv.coef
    assert logged_action(on) == "set_clip" and "adaptive entropy bonus on at 0.3" in on.reason
    same = iv.propose(ctx(2, {"entropy": 0.1}))  # still on: a step of delta is not announced
    assert same is not None and not same.reason and same.controls["entropy_coef"] == pytest.approx(0.4)
    off = iv.propose(ctx(3, {"entropy": 0.2000001}))  # just above: off, although the coefficient stays positive
    assert off is not None and off.controls == {"entropy_coef": 0.0} and iv.coef == pytest.approx(0.3)
    assert "adaptive entropy bonus off (entropy=0.2 > target 0.2" in off.reason
    held = iv.propose(ctx(4, {"loss": 1.0}))  # no entropy this step: coefficient and gate as they were
    nan = iv.propose(ctx(5, {"entropy": math.nan}))
    assert held is not None and nan is not None and held.controls == nan.controls == {"entropy_coef": 0.0}
    assert iv.coef == pytest.approx(0.3)


def test_the_coefficient_stays_within_its_bounds() -> None:
    iv = AdaptiveEntropy(delta=0.3, coef_min=0.1, coef_max=0.5, initial_coef=0.1)
    _, coefs = drive(iv, [0.0] * 4)
    assert coefs == [0.4, 0.5, 0.5, 0.5]  # min(0.1 + 0.3, 0.5), then held at the upper bound
    _, coefs = drive(iv, [9.0] * 4)
    assert coefs == [pytest.approx(0.2), 0.1, 0.1, 0.1]  # max(0.5 - 0.3, 0.1), then held at the lower bound


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"delta": 0.0}, r"delta > 0.*delta=0\.0"),
        ({"target": -0.1}, r"target >= 0.*target=-0\.1"),
        ({"coef_min": 0.5, "coef_max": 0.2}, r"coef_min <= initial_coef <= coef_max.*coef_min=0\.5"),
        ({"initial_coef": 2.0}, r"initial_coef=2\.0.*entropy_coef"),
        ({"coef_min": -0.1}, r"0 <= coef_min.*coef_min=-0\.1"),
        ({"target": math.inf}, r"finite numbers; got target=inf"),
        ({"delta": "0.1"}, r"finite numbers; got delta='0\.1'"),
        ({"stat": ""}, r"a stat name.*stat=''"),
    ],
)
def test_bad_fields_are_refused_naming_them(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AdaptiveEntropy(**fields)


def test_the_state_round_trips_through_the_guard() -> None:
    config = GuardConfig(interventions={"adaptive_entropy": {"delta": 0.05, "initial_coef": 0.1}})
    guard = Guard(config)
    for step, h in enumerate([0.1, 0.1, 0.5]):
        guard.observe(step, {"entropy": h, "loss": 0.0, "nonfinite": 0.0})
    saved = json.loads(json.dumps(guard.state_dict()))
    assert saved["interventions"]["adaptive_entropy"] == {"_s_coef": pytest.approx(0.15), "_s_entropy": 0.5}
    resumed = Guard(config)
    resumed.load_state_dict(saved, source="ckpt/rlguard_guard.json")
    assert resumed.state_dict() == saved
    decision = resumed.observe(3, {"entropy": 0.1, "loss": 0.0, "nonfinite": 0.0})
    assert decision.controls.entropy_coef == pytest.approx(0.2)  # 0.15 + 0.05, on again


def test_it_is_registered_opt_in_and_not_in_any_preset() -> None:
    assert intervention_registry()["adaptive_entropy"] is AdaptiveEntropy
    for preset in ("default", "strict", "stable"):
        assert "adaptive_entropy" not in Guard(GuardConfig.preset(preset)).interventions
    assert any(c.answer == "adaptive_entropy" for c in CAUSES)


# ---------------------------------------------------------------- TRL
# chosen so that a run of 7 steps holds the coefficient at its lower bound, raises it, lowers it and gates it off
# (checked below):
# entropies 2.69, 2.58, 2.47, 2.44, 2.52, 2.57, 2.59 against a target of 2.5, each at least 0.02 from it
ADAPTIVE = {
    "use_adaptive_entropy": True,
    "entropy_target": 2.5,
    "entropy_coef_delta": 0.3,
    "entropy_coef": 0.1,
    "entropy_coef_max": 1.0,
}
RUN = {
    **cpu_training_arguments(),
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 4,
    "gradient_accumulation_steps": 2,  # the entropy of a step spans both micro-batches
    "learning_rate": 1e-2,
    "logging_steps": 1,
    "save_strategy": "no",
    "disable_tqdm": True,
    "seed": 0,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


class WorldEntropy(TrainerCallback):
    """TRL's controller's input of each optimizer step: ``_last_world_entropy``, the token mean of the entropy over
    the step's micro-batches and processes (TRL's logged ``entropy`` averages the micro-batches' means instead)."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.values: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.values.append(self.trainer._last_world_entropy)


def train(
    cls: type[GRPOTrainer], args: GRPOConfig, model_dir: Path, record: WorldEntropy | None = None, **kwargs: Any
) -> GRPOTrainer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer = cls(
            model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(16),  # type: ignore[arg-type]
            callbacks=None if record is None else [record],
        )  # fmt: skip
        if record is not None:
            record.trainer = trainer
        trainer.train(**kwargs)
    return trainer


def logged(trainer: GRPOTrainer, key: str) -> list[float]:
    return [r[key] for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r]


def test_guarded_trainer_runs_trls_adaptive_entropy_like_trl(model_dir: Path, tmp_path: Path) -> None:
    settings = {**RUN, **ADAPTIVE, "max_steps": 7}
    world = WorldEntropy()
    stock = train(GRPOTrainer, GRPOConfig(output_dir=str(tmp_path / "trl"), **settings), model_dir, world)
    ours = train(GuardedGRPOTrainer, GRPOConfig(output_dir=str(tmp_path / "ours"), **settings), model_dir)
    assert isinstance(ours, GuardedGRPOTrainer)
    # the reference on the entropies TRL's controller measured gives what TRL logged
    entropies = world.values
    _, expected = reference(entropies, target=2.5, delta=0.3, lo=0.0, hi=1.0, c0=0.1)
    assert logged(stock, "entropy_coef") == expected
    assert min(abs(h - 2.5) for h in entropies) > 0.01  # float32 vs float64 reductions cannot flip a comparison
    coefs = logged(ours, "entropy_coef")
    assert coefs == expected  # exactly: the same float operations on the same side of the target
    steps = [b - a for a, b in itertools.pairwise(coefs)]
    assert coefs[0] == 0.0 and max(steps) > 0 > min(steps)  # 0.1 - 0.3 held at the lower bound, then both ways
    assert any(h > 2.5 and c > 0 for h, c in zip(entropies, coefs, strict=True))  # gated off while c > 0
    assert logged(ours, "loss") == pytest.approx(logged(stock, "loss"), rel=1e-5, abs=1e-7)
    assert logged(ours, "entropy") == pytest.approx(logged(stock, "entropy"), rel=1e-6)
    # the guard's entropy: the step's token-weighted mean over both micro-batches, as TRL's controller measures it
    (callback,) = [cb for cb in ours.callback_handler.callbacks if isinstance(cb, StabilityCallback)]
    assert [o["entropy"] for o in callback.observed] == pytest.approx(entropies, rel=1e-6)
    # without a configured guard: only the controller acts; nonfinite log-probs are not masked (TRL's behaviour)
    assert ours.rlguard_guard is not None and list(ours.rlguard_guard.interventions) == ["adaptive_entropy"]
    assert ours.rlguard_guard.detectors == {} and ours.rlguard_objective.on_nonfinite != "mask"
    assert not any(d.snapshot for d in callback.decisions)
    assert ours.entropy_coef == 0.1  # TRL's own controller never ran: its coefficient is the initial one


def test_the_coefficient_survives_a_trl_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    settings = {**RUN, **ADAPTIVE, "save_strategy": "steps", "save_steps": 3}
    out = tmp_path / "run"
    first = train(GuardedGRPOTrainer, GuardedGRPOConfig(output_dir=str(out), **settings, max_steps=3), model_dir)
    checkpoint = out / "checkpoint-3"
    state = json.loads((checkpoint / "rlguard_guard.json").read_text())["interventions"]["adaptive_entropy"]
    assert state["_s_coef"] == logged(first, "entropy_coef")[-1] == 0.3
    assert not (checkpoint / "entropy_ctrl_state.json").exists()  # TRL's copy of the controller does not run
    resumed = train(
        GuardedGRPOTrainer,
        GuardedGRPOConfig(output_dir=str(out), **settings, max_steps=4),
        model_dir,
        resume_from_checkpoint=str(checkpoint),
    )
    assert isinstance(resumed, GuardedGRPOTrainer) and resumed.rlguard_guard is not None
    assert resumed.state.log_history[-2]["step"] == 4  # the log history of steps 1-3 came with the checkpoint
    h = logged(resumed, "entropy")[-1]
    assert logged(resumed, "entropy_coef")[-1] == (min(0.3 + 0.3, 1.0) if h <= 2.5 else max(0.3 - 0.3, 0.0))


def test_the_controller_joins_the_configured_guard_and_is_configured_once(model_dir: Path, tmp_path: Path) -> None:
    def build(**overrides: Any) -> GuardedGRPOTrainer:
        args = GuardedGRPOConfig(output_dir=str(tmp_path), **{**RUN, **ADAPTIVE, "max_steps": 1, **overrides})
        return GuardedGRPOTrainer(
            model=str(model_dir), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(8)
        )

    trainer = build(guard="default")
    assert trainer.rlguard_guard is not None
    assert {"skip_step", "rollback", "adaptive_entropy"} <= set(trainer.rlguard_guard.interventions)
    assert trainer.rlguard_objective.on_nonfinite == "mask"  # a guard the user asked for
    iv = trainer.rlguard_guard.interventions["adaptive_entropy"]
    assert isinstance(iv, AdaptiveEntropy)
    assert (iv.target, iv.delta, iv.coef_min, iv.coef_max, iv.initial_coef) == (2.5, 0.3, 0.0, 1.0, 0.1)
    monitor = build(guard="monitor")  # TRL's flag asks for the controller: it acts in an observe-only guard too
    assert monitor.rlguard_guard is not None and list(monitor.rlguard_guard.interventions) == ["adaptive_entropy"]
    with pytest.raises(ValueError, match="one controller configured twice"):
        build(guard=GuardConfig(interventions={"adaptive_entropy": {}}))
    with pytest.raises(ValueError, match=r"schedules entropy_coef too"):
        build(guard=GuardConfig(schedules={"entropy_coef": Constant(0.01)}))
    with pytest.raises(ValueError, match=r"adaptive_entropy needs .*entropy_coef_max"):
        build(entropy_coef_max=0.05)  # the initial coefficient 0.1 above the upper bound
    with pytest.raises(ValueError, match=r"cannot add TRL's entropy bonus .*use_adaptive_entropy=True"):
        build(fused_objective=True)


def test_what_stays_refused(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match=r"top_entropy_quantile=0\.5: TRL's controller then measures"):
        GuardedGRPOConfig(output_dir=str(tmp_path), **{**RUN, **ADAPTIVE, "top_entropy_quantile": 0.5})
