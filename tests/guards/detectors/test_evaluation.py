"""The evaluation's drop (``rlguard.guards.detectors.evaluation``): ``reward_collapse``'s drawdown rule on the eval
metric, oriented by its direction; a warm start destroyed is critical at its first fall, a dip of a few points is
not, and ``reward_collapse`` itself is unchanged."""

from __future__ import annotations

import random

from rlguard.guards.detectors import EvalDrop, RewardCollapse


def _feed(det: RewardCollapse, rows: list[dict[str, float]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for i, stats in enumerate(rows):
        f = det.check(i, stats, armed=i >= det.warmup)
        if f is not None:
            out.append((i, f.severity))
    return out


def test_a_warm_start_destroyed_is_critical_at_its_first_fall() -> None:
    """Eval accuracy 0.99 for 6 records (a warm start), then 0.64 and frozen: critical one record after the fall,
    once the EWMA has fallen 10% of the level (0.99 - 0.2 * 0.35 = 0.92 is 7%; 0.864 is 13%): the first record of
    the fall would warn but for min_drop, so its jump does not become the noise that scales the second."""
    rows = [{"eval_score": 0.99}] * 6 + [{"eval_score": 0.64}] * 15
    found = _feed(EvalDrop(), rows)
    assert found[0] == (7, "critical") and {s for _, s in found} == {"critical"}, found


def test_a_dip_of_a_few_points_is_no_finding() -> None:
    """0.99 -> 0.97 is 2% of the level: under min_drop (10%), whatever the spread of a stretch that held one value;
    a noisy evaluation's ordinary dips are no finding either."""
    assert _feed(EvalDrop(), [{"eval_score": 0.99}] * 6 + [{"eval_score": 0.97}] * 15) == []
    rng = random.Random(0)
    assert _feed(EvalDrop(), [{"eval_score": 0.45 + rng.gauss(0, 0.02)} for _ in range(300)]) == []


def test_a_lower_is_better_metric_is_judged_negated() -> None:
    """eval_loss 0.5 -> 2.0: a fall of its negation; the message says which way it reads."""
    det = EvalDrop()
    rng = random.Random(1)
    rows = [{"eval_loss": 0.5 + rng.gauss(0, 0.01)} for _ in range(8)] + [{"eval_loss": 2.0}] * 5
    found = _feed(det, rows)
    assert found and found[0][0] <= 9 and {s for _, s in found} == {"critical"}, found
    f = det.check(20, {"eval_loss": 2.0}, armed=True)
    assert f is not None and f.message.startswith("eval_loss (lower is better, negated)"), f


def test_reward_collapse_reads_the_reward_and_says_so() -> None:
    det = RewardCollapse()
    assert det.reads() == ("reward_mean",) and det.min_drop == 0.0
    rows = [{"reward_mean": 0.8 + 0.001 * (i % 3)} for i in range(30)] + [{"reward_mean": 0.1}] * 10
    found = _feed(det, rows)
    assert found and found[-1][1] == "critical"
    f = det.check(99, {"reward_mean": 0.1}, armed=True)
    assert f is not None and f.message.startswith("reward (EWMA)") and "reward hacking" in f.message
