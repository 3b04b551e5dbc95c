"""The consequence rule applied live (``GuardConfig(consequence="online")``,
:class:`rlguard.guards.consequence.live.OnlineConsequence`) on synthetic streams, beside the same stream under
the step rule (``consequence="step"``, ``strict``'s and ``monitor``'s: the detector's severity on the step; ``default``
and ``stable`` judge by consequence, online) and the doctor's hindsight
form (:func:`~rlguard.guards.consequence.offline.judge_log` over the guard's own findings), so that each test can
fail: the two live rules differ on every stream here.

Streams: a lone KL spike of 4.8 nats (the absolute bound is 2) is a warning live and ``skip_step`` still skips its
step; the same spike followed by KL lingering at the warning level is raised to critical at the step where
recovery can no longer start (the spike's logged step + ``horizon`` + 1); three critical observations in five are
critical at the third; a reward falling from a warm-started level clearly above the floor of its range is
critical; a reward at 0 with a blip is not.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.consequence.level import RewardLevel
from rlguard.guards.consequence.offline import Timeline, judge_log
from rlguard.guards.consequence.rule import ConsequenceRule, RecoveryWatch, established_peak
from rlguard.guards.decision import Decision
from rlguard.guards.events import SEVERITY_LEVEL, Event, Finding
from rlguard.guards.interventions import Proposal, SkipStep, StepContext
from rlguard.guards.state import GuardStateError
from tests.helpers.synthetic import healthy_stream

RULE = ConsequenceRule()
SPIKE = 60  # the step of the first KL spike


@dataclass
class Replay:
    guard: Guard
    decisions: list[Decision]
    timeline: Timeline  # the guard's own findings, as the doctor builds it


def _replay(stream: list[dict[str, float]], consequence: str, preset: str = "monitor", **changes: object) -> Replay:
    guard = Guard(GuardConfig.preset(preset, consequence=consequence, **changes))
    decisions, findings, observed = [], [], []
    for step, stats in enumerate(stream):
        before = guard.observations()
        decisions.append(guard.observe(step, stats))
        observed.append(frozenset(n for n, count in guard.observations().items() if count != before[n]))
        findings.append(dict(guard.last_findings))
    rewards = [s.get("reward_mean", math.nan) for s in stream]
    return Replay(guard, decisions, Timeline(list(range(len(stream))), rewards, findings, observed))


def _events(events: list[Event], detector: str) -> list[tuple[int, str]]:
    return [(e.step, e.severity) for e in events if e.detector == detector]


def _final(events: list[Event], detector: str) -> str | None:
    """The highest severity of ``detector``'s events: the final label of its finding."""
    severities = [e.severity for e in events if e.detector == detector]
    return max(severities, key=SEVERITY_LEVEL.__getitem__, default=None)


def _hindsight(r: Replay, detector: str) -> str | None:
    return _final(judge_log(r.timeline, r.guard.detectors, RULE), detector)


def _kl(spikes: dict[int, float], after: float | None = None, steps: int = 120) -> list[dict[str, float]]:
    """A healthy plateau run with KL to the reference set to ``spikes`` at their steps (and to ``after`` on every
    step after the first spike)."""
    stream = healthy_stream(steps, 0, "plateau")
    for step, stats in enumerate(stream):
        if step in spikes:
            stats["kl_ref"] = spikes[step]
        elif after is not None and step > min(spikes):
            stats["kl_ref"] = after
    return stream


def _rewards(values: list[float]) -> list[dict[str, float]]:
    return [{"reward_mean": v} for v in values]


# -- a lone observation, one not followed by recovery, a sustained condition ---------------------------------------
def test_a_lone_kl_spike_is_a_warning_live_and_skip_step_still_skips_its_step() -> None:
    stream = _kl({SPIKE: 4.8})
    skip_on_kl = {"skip_step": {"on": ("kl_ref_blowup",)}}
    online = _replay(stream, "online", "default", interventions=skip_on_kl)
    assert _events(online.guard.events, "kl_ref_blowup") == [(SPIKE, "warn")]
    assert online.decisions[SPIKE].outcome == "skip"  # the step itself: the detector observed it critical
    assert [d.outcome for d in online.decisions].count("skip") == 1
    finding = online.timeline.findings[SPIKE]["kl_ref_blowup"]
    assert finding.severity == "critical" and finding.observed is None  # the guard's record: as the detector made it
    # the step rule: critical, and the default preset rolls back (rollback outranks skip)
    step = _replay(stream, "step", "default", interventions=skip_on_kl)
    assert _events(step.guard.events, "kl_ref_blowup") == [(SPIKE, "critical")]
    assert step.decisions[SPIKE].outcome in ("rollback", "halt")
    # hindsight agrees with the online rule: a single observation the run recovered from
    assert _hindsight(online, "kl_ref_blowup") == "warn"


def test_interventions_see_the_label_and_the_detectors_severity(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[int, Finding] = {}
    propose = SkipStep.propose

    def spy(self: SkipStep, ctx: StepContext) -> Proposal | None:
        if "kl_ref_blowup" in ctx.findings:
            seen[ctx.step] = ctx.findings["kl_ref_blowup"]
        return propose(self, ctx)

    monkeypatch.setattr(SkipStep, "propose", spy)
    _replay(_kl({SPIKE: 4.8}), "online", "default")
    assert (seen[SPIKE].severity, seen[SPIKE].observed) == ("warn", "critical")
    assert "a single critical observation" in seen[SPIKE].message
    seen.clear()
    _replay(_kl({SPIKE: 4.8}), "step", "default")
    assert (seen[SPIKE].severity, seen[SPIKE].observed) == ("critical", None)


def test_a_spike_not_followed_by_recovery_becomes_critical_horizon_plus_one_steps_later() -> None:
    """KL 4.8 once, then 1.5 on every step (above the 1-nat warning bound): never 3 clean observations in a row.
    Recovery could start at the spike's logged step + horizon at the latest; the finding at the step after shows
    it did not: k = 60 + 10 + 1."""
    stream = _kl({SPIKE: 4.8}, after=1.5)
    online = _replay(stream, "online")
    k = SPIKE + RULE.horizon + 1
    assert _events(online.guard.events, "kl_ref_blowup") == [(SPIKE, "warn"), (k, "critical")]
    raised = next(e for e in online.guard.events if e.severity == "critical")
    assert f"the observation of step {SPIKE}, no sign of recovery within 10 logged steps" in raised.message
    assert raised.value == 4.8  # the finding that was raised, not the lingering one
    assert online.guard.alarms() == {"kl_ref_blowup": "critical"}
    assert _events(_replay(stream, "step").guard.events, "kl_ref_blowup") == [(SPIKE, "critical")]
    assert _hindsight(online, "kl_ref_blowup") == "critical"  # agree: the doctor raises it at the spike itself


def test_a_spike_followed_by_lost_control_is_raised_at_that_step() -> None:
    """A lone gradient spike, then the entropy collapsing to 0.1% of its level for good (critical from its
    third observation on, sustained): the spike is raised at the entropy's first sustained critical step."""
    stream = healthy_stream(120, 1, "plateau")
    stream[SPIKE]["grad_norm"] *= 500
    for stats in stream[SPIKE + 2 :]:
        stats["entropy"] *= 1e-3
    online = _replay(stream, "online")
    entropy = _events(online.guard.events, "entropy_collapse")
    first_sustained = next(s for s, sev in entropy if sev == "critical")
    assert first_sustained <= SPIKE + RULE.horizon
    assert _events(online.guard.events, "grad_norm_spike") == [(SPIKE, "warn"), (first_sustained, "critical")]
    raised = next(e for e in online.guard.events if e.detector == "grad_norm_spike" and e.severity == "critical")
    assert f"followed by lost control (entropy_collapse at step {first_sustained})" in raised.message
    assert _hindsight(online, "grad_norm_spike") == "critical"


def test_three_critical_observations_in_five_are_critical_at_the_third() -> None:
    stream = _kl(dict.fromkeys((SPIKE, SPIKE + 2, SPIKE + 4), 4.8))
    online = _replay(stream, "online")
    assert _events(online.guard.events, "kl_ref_blowup") == [(SPIKE, "warn"), (SPIKE + 4, "critical")]
    assert "sustained: critical in 3 of 5 observations" in online.guard.events[-1].message
    # two in five are not: both lone, both recovered from
    two = _replay(_kl(dict.fromkeys((SPIKE, SPIKE + 2), 4.8)), "online")
    assert _events(two.guard.events, "kl_ref_blowup") == [(SPIKE, "warn")]
    assert _events(_replay(stream, "step").guard.events, "kl_ref_blowup") == [(SPIKE, "critical")]
    assert _hindsight(online, "kl_ref_blowup") == "critical" and _hindsight(two, "kl_ref_blowup") == "warn"


def _grad_ramp(start: int = SPIKE, growth: float = 1.3, steps: int = 120) -> list[dict[str, float]]:
    """A healthy plateau run whose gradient norm grows by ``growth`` a step from ``start``: a sustained rise."""
    stream = healthy_stream(steps, 0, "plateau")
    for step, stats in enumerate(stream):
        if step >= start:
            stats["grad_norm"] *= growth ** (step - start + 1)
    return stream


def test_a_cusum_alarm_is_sustained_at_its_first_critical_observation() -> None:
    """A CUSUM's critical alarm already rests on at least ``critical_h / (z_cap - slack)`` observations above its
    baseline (``Detector.evidence``): the live rule acts on it at once instead of waiting for two more."""
    stream = _grad_ramp()
    step_rule = _replay(stream, "step")
    first = next(s for s, sev in _events(step_rule.guard.events, "grad_norm_explosion") if sev == "critical")
    assert first > SPIKE
    online = _replay(stream, "online")
    events = _events(online.guard.events, "grad_norm_explosion")
    assert next(s for s, sev in events if sev == "critical") == first
    raised = next(e for e in online.guard.events if e.detector == "grad_norm_explosion" and e.severity == "critical")
    assert "sustained: its statistic rests on at least 3 observations" in raised.message
    assert _hindsight(online, "grad_norm_explosion") == "critical"


def test_an_absolute_bound_of_a_cusum_detector_is_one_observation() -> None:
    """An absolute bound judges one value: a lone critical observation, a warning live until its consequence
    shows."""
    stream = healthy_stream(120, 0, "plateau")
    for stats in stream:
        stats["mismatch_kl"] = 1e-4
    for step in (SPIKE, SPIKE + 1):  # two: the detector's patience
        stream[step]["mismatch_kl"] = 0.05  # above mismatch_growth's absolute critical bound (2e-2)
    online = _replay(stream, "online")
    assert _events(online.guard.events, "mismatch_growth")[:1] == [(SPIKE + 1, "warn")]
    assert _events(_replay(stream, "step").guard.events, "mismatch_growth")[:1] == [(SPIKE + 1, "critical")]


def test_the_evidence_of_a_cusum_finding_follows_its_parameters() -> None:
    from rlguard.guards.detectors.update import GradNormExplosion

    alarm = Finding("critical", 10.0, 40.0, "a sustained rise")
    bound = Finding("critical", 10.0, 1.0, "above the absolute bound", absolute=True)
    assert GradNormExplosion().evidence(alarm) == 3  # min(ceil(40 / (5 - 1)) = 10, 5 // 2 + 1 = 3)
    assert GradNormExplosion(recent=21).evidence(alarm) == 10
    assert GradNormExplosion(critical_h=8.0, recent=21).evidence(alarm) == 2
    assert GradNormExplosion(recent=1).evidence(alarm) == 1
    assert GradNormExplosion().evidence(bound) == 1


def test_nonfinite_is_critical_at_once() -> None:
    stream = healthy_stream(80, 2, "plateau")
    stream[40]["loss"] = math.nan
    online = _replay(stream, "online")
    assert _events(online.guard.events, "nonfinite") == [(40, "critical")]


# -- the reward: an established level ------------------------------------------------------------------------------
def _warm_started_fall(seed: int = 0) -> list[float]:
    """A run warm-started at 0.5 (it never rises above its start), falling to 0.1 from step 60."""
    rng = np.random.default_rng(seed)
    return [0.5 - 0.4 * min(max(i - 59, 0) / 10, 1.0) + float(rng.normal(0, 0.03)) for i in range(120)]


def test_a_reward_falling_from_a_warm_started_level_is_critical_live() -> None:
    rewards = _warm_started_fall()
    online = _replay(_rewards(rewards), "online")
    step = _replay(_rewards(rewards), "step")
    assert _final(online.guard.events, "reward_collapse") == "critical"
    assert _events(online.guard.events, "reward_collapse") == _events(step.guard.events, "reward_collapse")
    # by design the doctor disagrees: its peak must be above the run's start, which this run never was
    assert not established_peak(rewards, len(rewards), RULE)
    assert _hindsight(online, "reward_collapse") == "warn"


@pytest.mark.parametrize("blip", [0.0125, 0.08])
def test_a_reward_at_zero_with_a_blip_is_not_critical_live(blip: float) -> None:
    """30 steps at 0, a blip for 8 steps, 0 again: the step rule calls the fall from the blip critical (many of
    its tiny sigmas, all of its range); the EWMA never was 10% of the range above the floor: no level."""
    rewards = _rewards([0.0] * 30 + [blip] * 8 + [0.0] * 40)
    online = _replay(rewards, "online")
    assert _final(_replay(rewards, "step").guard.events, "reward_collapse") == "critical"
    # 42: the level at the blip is its maximum less the expected maximum of its observations (expected_maximum)
    assert _events(online.guard.events, "reward_collapse") == [(42, "warn")]
    assert _hindsight(online, "reward_collapse") == "warn"  # agree


def test_the_reward_level_is_clearly_above_the_floor_of_its_range() -> None:
    level = RewardLevel(RULE)
    for r in [0.0] * 20 + [0.09] * 20:  # EWMA up to 0.09: below 10% of [0, 1]
        level.push(r)
    assert not level.established()
    for r in [0.2] * 4:
        level.push(r)
    assert not level.established()  # four observations above 0.1, five needed
    level.push(0.2)
    assert level.established()
    # a range below 0: the floor is the lowest reward seen
    below = RewardLevel(RULE)
    for r in [-0.5] * 10 + [-0.38] * 10:  # 0.12 above the floor, 10% of [-0.5, 1] is 0.15
        below.push(r)
    assert not below.established()
    for r in [-0.3] * 10:
        below.push(r)
    assert below.established() and below.floor() == -0.5
    level.push(math.nan)  # ignored
    assert level.established()


# -- where the online and hindsight forms cannot agree -------------------------------------------------------------
def test_a_spike_just_before_the_log_ends_is_pending_live_and_unresolved_in_hindsight() -> None:
    """The doctor calls a lone spike whose recovery the log cannot show unresolved (a warning, issue 36); live, the
    run goes on, so the verdict waits for the horizon."""
    stream = _kl({117: 4.8})
    online = _replay(stream, "online")
    assert _events(online.guard.events, "kl_ref_blowup") == [(117, "warn")]
    assert _hindsight(online, "kl_ref_blowup") == "warn"


def test_rollback_forgets_the_pending_lone_observations() -> None:
    stream = _kl({SPIKE: 4.8}, after=1.5)
    guard = Guard(GuardConfig.preset("monitor", consequence="online"))
    for step, stats in enumerate(stream[: SPIKE + 5]):
        guard.observe(step, stats)
    assert guard.live_rule is not None
    guard.live_rule.reset()
    for step, stats in enumerate(stream[SPIKE + 5 :], SPIKE + 5):
        guard.observe(step, stats)
    assert _events(guard.events, "kl_ref_blowup") == [(SPIKE, "warn")]


def test_the_recovery_watch_is_the_doctors() -> None:
    watch = RecoveryWatch(until=10, clean=3)
    assert [watch.see(q, f) for q, f in [(1, True), (2, False), (3, False), (4, True), (8, False), (9, False)]] == [
        None,
        None,
        None,
        None,
        None,
        None,
    ]
    assert watch.see(10, False) is True  # three clean in a row, started at 8 <= 10
    late = RecoveryWatch(until=10, clean=3)
    assert late.see(5, True) is None and late.see(11, False) is False  # recovery would start after the horizon
    broken = RecoveryWatch(until=10, clean=3)
    assert broken.see(10, False) is None and broken.see(11, True) is False


def test_the_option_and_its_default() -> None:
    # default and stable judge live by consequence; strict acts on the step, monitor reports the step's findings
    assert GuardConfig().consequence == "online" and Guard().live_rule is not None
    assert {p: GuardConfig.preset(p).consequence for p in ("monitor", "default", "strict", "stable")} == {
        "monitor": "step",
        "default": "online",
        "strict": "step",
        "stable": "online",
    }
    assert GuardConfig.from_mapping({"consequence": "step"}).consequence == "step"
    assert GuardConfig.from_mapping({"consequence": "online"}).consequence == "online"
    with pytest.raises(ValueError, match=r"guard\.consequence: expected one of 'step', 'online'"):
        GuardConfig.from_mapping({"consequence": "hindsight"})
    with pytest.raises(ValueError, match="level_window must be >= 1"):
        ConsequenceRule(level_window=0)


def test_a_resumed_guard_judges_alike() -> None:
    """Saved between the spike and its raise (JSON round trip), the resumed guard raises it at the same step."""
    stream = _kl({SPIKE: 4.8}, after=1.5)
    whole = _replay(stream, "online").guard
    first = Guard(GuardConfig.preset("monitor", consequence="online"))
    for step, stats in enumerate(stream[: SPIKE + 5]):
        first.observe(step, stats)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["consequence"]["pending"]["kl_ref_blowup"][0]["step"] == SPIKE
    resumed = Guard(GuardConfig.preset("monitor", consequence="online"))
    resumed.load_state_dict(state)
    for step, stats in enumerate(stream[SPIKE + 5 :], SPIKE + 5):
        resumed.observe(step, stats)
    assert resumed.events == whole.events
    assert resumed.state_dict() == json.loads(json.dumps(whole.state_dict()))
    # the step rule's state has no such key, and ignores it; an online guard starts it afresh without it
    assert "consequence" not in Guard(GuardConfig.preset("monitor")).state_dict()
    Guard(GuardConfig.preset("monitor")).load_state_dict(state)
    Guard(GuardConfig.preset("monitor", consequence="online")).load_state_dict(Guard().state_dict())
    state["consequence"]["pending"]["kl_ref_blowup"][0]["streak"] = "2"
    with pytest.raises(GuardStateError, match=r"consequence\.pending\.kl_ref_blowup\[0\]\.streak: expected an integer"):
        Guard(GuardConfig.preset("monitor", consequence="online")).load_state_dict(state)


def test_reward_peak_live_online_vs_step_counts_every_unguarded_run_once() -> None:
    root = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import reward_peak_live
    finally:
        sys.path.remove(str(root / "benchmarks"))
    rows = reward_peak_live.unguarded(reward_peak_live.LOGS[0])
    table = reward_peak_live.online_vs_step(rows)
    assert sum(r["runs"] for r in table.values()) == len(rows)
    assert table["collapsed"]["runs"] == sum(bool(r["verdict"]["collapsed"]) for r in rows)
    assert all(r["online"] <= r["step"] for r in table.values())  # online criticals are the step rule's, or fewer


# -- issue 36, class 1: what a healthy run looks like, live and offline ----------------------------------------------
def _learning_with_spikes(n: int, spikes: dict[int, float], seed: int = 3) -> list[dict[str, float]]:
    """A run that learns: reward 0.02 -> 2.1 (linear, noise 0.05), KL to the reference rising slowly and
    geometrically 0.001 -> 0.23 (noise 20%), with one-record KL ``spikes`` (index -> value)."""
    rng = np.random.default_rng(seed)
    stream = healthy_stream(n, seed=seed)
    for i, row in enumerate(stream):
        t = i / (n - 1)
        row["reward_mean"] = 0.02 + 2.08 * t + float(rng.normal(0, 0.05))
        row["kl_ref"] = spikes.get(i, 0.001 * 230**t * math.exp(float(rng.normal(0, 0.2))))
    return stream


@pytest.mark.parametrize(
    ("spikes", "critical_on_the_step"),
    [({118: 0.43}, False), ({80: 4.8, 160: 3.0, 239: 4.8}, True)],
    ids=["slow KL rise with a 0.43 spike", "isolated spikes ending on one"],
)
def test_kl_growing_with_the_reward_and_lone_spikes_roll_nothing_back(
    tmp_path: Path, spikes: dict[int, float], critical_on_the_step: bool
) -> None:
    """Issue 36, class 1: a slow KL rise that comes with a rising reward, one record of 0.43 back to 0.06 at the
    next; isolated one-record spikes above the 2-nat bound, the last on the last record. Live, ``default`` and
    ``stable`` see each spike and roll back and halt nothing (a lone excursion gets at most a skip), while the same
    presets with the step's severity (``consequence="step"``) act on those above the bound, so the test can fail;
    the doctor finds nothing critical (the last spike is unresolved: a warning)."""
    from rlguard.doctor import diagnose
    from tests.helpers.doctor_logs import write_trainer_state

    stream = _learning_with_spikes(240, spikes)
    for preset in ("default", "stable"):
        guard = Guard(GuardConfig.preset(preset))
        outcomes = {guard.observe(step, stats).outcome for step, stats in enumerate(stream)}
        assert not outcomes & {"rollback", "halt"}, (preset, outcomes)
        assert {e.step for e in guard.events if e.detector == "kl_ref_blowup"} == set(spikes)  # each spike is seen
        # the same preset judging each step by its own severity acts on a lone spike above the 2-nat bound (0.43,
        # 48x the rolling median, is a warning even there: the baseline follows the run)
        step_rule = {d.outcome for d in _replay(stream, "step", preset).decisions}
        assert bool(step_rule & {"rollback", "halt"}) == critical_on_the_step, (preset, step_rule)
    d = diagnose(write_trainer_state(stream, tmp_path / "trainer_state.json"))
    assert not [f for f in d.findings if f.severity == "critical"] and d.exit_code == 0, d.findings


def _outcomes(stream: list[dict[str, float]], preset: str) -> list[tuple[int, str]]:
    guard = Guard(GuardConfig.preset(preset))
    out: list[tuple[int, str]] = []
    for step, stats in enumerate(stream):
        d = guard.observe(step, stats)
        if d.outcome != "step":
            out.append((step, d.outcome))
        if d.outcome == "halt":
            break
    return out


@pytest.mark.parametrize("preset", ["default", "stable"])
@pytest.mark.parametrize(
    ("stat", "healthy", "collapsed"),
    [("entropy", 0.5, 6.0), ("length_mean", 200.0, 10.0)],
    ids=["entropy blow-up", "length collapse"],
)
def test_a_sustained_blowup_of_the_policys_outputs_rolls_back_to_before_its_onset(
    preset: str, stat: str, healthy: float, collapsed: float
) -> None:
    """Issue 36, live: ``entropy_blowup`` and ``length_collapse`` see many collapses first; a critical finding of
    theirs by the consequence rule (sustained: 3 of 5 observations) is a state of the weights, so ``rollback``
    (``default``) and ``recovery`` (``stable``) roll back to the last healthy step, before the onset at step 40."""
    rng = np.random.default_rng(0)
    onset = 40
    stream = [
        {
            "reward_mean": 0.5 + float(rng.normal(0, 0.02)),
            stat: (healthy if i < onset else collapsed) * (1 + 0.02 * i % 3),
        }
        for i in range(70)
    ]
    outcomes = _outcomes(stream, preset)
    assert outcomes and outcomes[0][1] == "rollback" and onset <= outcomes[0][0] <= onset + 5, outcomes
    guard = Guard(GuardConfig.preset(preset))
    for step, stats in enumerate(stream):
        d = guard.observe(step, stats)
        if d.outcome == "rollback":
            assert d.rollback_to is not None and d.rollback_to < onset, d
            break


def _kl_from_the_first_record(reward: float, n: int = 60) -> list[dict[str, float]]:
    """The KL to the reference 3-35 nats from the first record (above the 2-nat bound: measured against another
    model than the run's initial policy), the reward at ``reward`` with noise."""
    rng = np.random.default_rng(1)
    return [
        {"reward_mean": reward + float(rng.normal(0, 0.1)), "kl_ref": float(3.0 + 32.0 * rng.random())}
        for _ in range(n)
    ]


@pytest.mark.parametrize("preset", ["default", "stable"])
def test_kl_above_its_bound_from_the_first_record_with_the_reward_at_its_level_is_not_rolled_back(preset: str) -> None:
    """Issue 36: a KL above the absolute bound from the run's first record (Tau-Bench's 34.7 nats) has no healthy
    state before it to roll back to, and its level alone is no lost control: while the reward holds an
    established level, the live guard neither rolls back nor halts (before: halted, "no healthy snapshot"). The
    same KL with the reward at 0 (no level: nothing vouches for the run) is still halted, and a KL that crosses the
    bound after healthy records is still rolled back."""
    assert _outcomes(_kl_from_the_first_record(4.5), preset) == []
    lost = _outcomes(_kl_from_the_first_record(0.0), preset)
    assert lost and lost[-1][1] == "halt", lost
    later = [{"reward_mean": 4.5, "kl_ref": 0.01 * (1 + 0.1 * (i % 3))} for i in range(30)]
    later += _kl_from_the_first_record(4.5, 30)
    crossed = _outcomes(later, preset)
    assert crossed and crossed[0][1] == "rollback" and 30 <= crossed[0][0] <= 35, crossed
    # crossed inside the detector's warm-up: the absolute bound needs no baseline, so the clean records before the
    # crossing vouch for the snapshot (a rollback, not a halt for want of a snapshot from before the onset)
    early = [{"reward_mean": 4.5, "kl_ref": 0.5}] * 3 + _kl_from_the_first_record(4.5, 30)
    early_crossed = _outcomes(early, preset)
    assert early_crossed and early_crossed[0][1] == "rollback" and early_crossed[0][0] <= 8, early_crossed


def test_the_episode_of_a_condition_present_from_the_start_survives_a_resume() -> None:
    """The live rule's episodes of findings are part of the guard's state: a guard resumed from the state of the
    one above judges the rest of the stream alike."""
    stream = _kl_from_the_first_record(4.5)
    whole = Guard(GuardConfig.preset("default"))
    first = Guard(GuardConfig.preset("default"))
    for step, stats in enumerate(stream[:20]):
        whole.observe(step, stats)
        first.observe(step, stats)
    resumed = Guard(GuardConfig.preset("default"))
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for step, stats in enumerate(stream[20:], start=20):
        assert whole.observe(step, stats) == resumed.observe(step, stats)


@pytest.mark.parametrize("preset", ["default", "stable"])
@pytest.mark.parametrize(("before", "outcome"), [(3, "halt"), (8, "rollback")], ids=["in the warm-up", "after it"])
def test_a_log_written_every_5_steps_is_judged_after_a_warm_up_of_steps_not_of_5x_the_records(
    preset: str, before: int, outcome: str
) -> None:
    """Issue 36, class 4 live: stats logged every 5 optimizer steps (nips-grpo-dynamics), entropy 0.2 that blows up
    to 3-8 nats after ``before`` records. The warm-up covers the run's first ``warmup`` optimizer steps and at least
    5 records (``MIN_BASELINE``: a median of 5 survives two blown-up records among them), the early baseline is
    what the detector saw in its warm-up: the guard acts within 5 records of the onset. Before, the warm-up of 10
    records (50 steps) held the blow-up in the baseline: no action. A blow-up that began in the warm-up is found
    from the detector's first judged record: every snapshot may hold it, so the guard halts ("no snapshot known to
    be from before the onset"); one that began after a clean judged record is rolled back to a step before it."""
    blowup = [2.8, 3.5, 4.2, 6.0, 7.4, 7.9, 8.0, 8.1, 8.2, 7.6, 7.0, 6.5]
    entropy = [(0.18, 0.15, 0.24, 0.2)[i % 4] for i in range(before)] + blowup
    onset = 5 * (before + 1)
    guard = Guard(GuardConfig.preset(preset))
    first = None
    for i, h in enumerate(entropy):
        d = guard.observe(5 * (i + 1), {"entropy": h, "reward_mean": 0.5})
        if d.outcome != "step":
            first = d
            break
    assert first is not None and first.outcome == outcome, first
    assert onset <= first.step <= onset + 5 * 5, first
    if outcome == "rollback":
        assert first.rollback_to is not None and first.rollback_to < onset, first
    else:
        assert "no snapshot known to be from before the onset" in first.reason, first


def test_warm_ups_are_steps_and_at_least_five_observations() -> None:
    """``warmed_up``: every step seen, the warm-up is ``warmup`` observations as before; sparse, it is ``warmup``
    steps but never fewer than 5 observations; with no steps known, observations alone."""
    from rlguard.guards.detectors.base import MIN_BASELINE, warmed_up

    assert [warmed_up(10, seen, seen) for seen in (9, 10)] == [False, True]  # every step
    assert not warmed_up(10, MIN_BASELINE - 1, 50)  # 4 records 50 steps apart: too few for a baseline
    assert warmed_up(10, MIN_BASELINE, 25) and not warmed_up(20, MIN_BASELINE, 19)
    assert not warmed_up(10, 9, None) and warmed_up(10, 10, None)


def test_a_guard_resumed_inside_a_sparse_warm_up_judges_alike() -> None:
    """The step of each detector's first observation and the detectors that judged a clean one are part of the
    guard's state: resumed after 4 records of a log written every 5 steps, the guard arms and halts as the one that
    ran through (without them it would count the warm-up in steps from the resume: armed a record later, with a
    blown-up record in its baseline). A state written before these keys existed still loads."""
    entropy = [0.18, 0.15, 0.24, 2.8, 3.5, 4.2, 6.0, 7.4, 7.9, 8.0, 8.1, 8.2]
    stream = [(5 * (i + 1), {"entropy": h, "reward_mean": 0.5}) for i, h in enumerate(entropy)]
    whole, first = Guard(GuardConfig.preset("default")), Guard(GuardConfig.preset("default"))
    for step, stats in stream[:4]:
        whole.observe(step, stats)
        first.observe(step, stats)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["first_seen"]["entropy_blowup"] == 5
    resumed = Guard(GuardConfig.preset("default"))
    resumed.load_state_dict(state)
    for step, stats in stream[4:]:
        a, b = whole.observe(step, stats), resumed.observe(step, stats)
        assert a == b, (a, b)
        if a.outcome == "halt":
            break
    assert a.outcome == "halt"
    old = {k: v for k, v in state.items() if k not in ("first_seen", "judged_clean", "seen_clean")}
    Guard(GuardConfig.preset("default")).load_state_dict(old)
