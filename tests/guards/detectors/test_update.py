"""The update detectors (``rlguard.guards.detectors.update``) through a guard: gradient-norm spikes after zero
norms, clip-fraction bursts over on- and off-policy steps, the KL to the reference after an LR spike, and the
train-inference mismatch from whichever stat the run logs."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.detectors import Detector
from rlguard.guards.detectors.update import (
    ClipFracBurst,
    GradNormExplosion,
    GradNormSpike,
    KLOldBlowup,
    _PolicyGradientSteps,
)
from rlguard.guards.signal import without_signal
from tests.helpers.synthetic import healthy_stream


def test_a_zero_gradient_norm_does_not_make_the_next_normal_one_a_spike() -> None:
    """Zero-variance batches give grad_norm = 0; they must not teach the baseline a median of 0."""
    guard = Guard(GuardConfig.preset("default"))
    stream = healthy_stream(80, seed=8)
    for step, stats in enumerate(stream):
        if 30 <= step < 70:
            stats["grad_norm"] = 0.0
        guard.observe(step, stats)
    assert not [e for e in guard.events if e.detector == "grad_norm_spike"]


def test_on_policy_steps_do_not_make_the_off_policy_clip_fraction_a_burst() -> None:
    """Two optimizer steps per batch (TRL's steps_per_generation, verl's mini-batches): the first is on-policy
    (clip_frac = kl_old = 0 exactly), the second clips ~40% (GSPO's narrow range does, by design). Neither the
    zeros nor the steady 40% are a burst, and the clip controller does not flip-flop on the on-policy zeros."""
    guard = Guard(GuardConfig.preset("default"))
    for step, stats in enumerate(healthy_stream(80, seed=3)):
        off = step % 2 == 1
        stats["clip_frac"] = 0.4 + 0.05 * math.sin(step) if off else 0.0
        stats["kl_old"] = 0.05 if off else 0.0
        decision = guard.observe(step, stats)
        assert decision.controls.lr_scale == 1.0, (step, guard.events)
    assert not [e for e in guard.events if e.detector == "clip_frac_burst"]
    clip_actions = [e.message for e in guard.events if e.detector == "action:set_clip"]
    # kl_old 0.05 > 1.5 x target: it tightens (x1/1.5 per off-policy step down to 0.25) and never relaxes
    assert clip_actions and all(m.startswith("tighten") for m in clip_actions), clip_actions


def test_a_clip_fraction_burst_over_off_policy_steps_is_still_caught() -> None:
    """Patience 2 counts consecutive steps with evidence: the on-policy step between two bursts does not reset it."""
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(80, seed=3)):
        off = step % 2 == 1
        stats["clip_frac"] = (0.6 if step in (71, 73) else 0.04 + 0.005 * math.sin(step)) if off else 0.0
        guard.observe(step, stats)
    hits = [e for e in guard.events if e.detector == "clip_frac_burst"]
    assert [(e.step, e.severity) for e in hits] == [(73, "critical")], hits


def test_kl_level_shift_after_an_lr_spike_is_critical() -> None:
    """The issue's real TRL run: KL to the reference 0.04 -> 2.7 after one x100 LR step and stays near 3 (a
    robust z below 6 over its noisy history): the absolute bound of 2 nats makes it critical."""
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(80, seed=4)):
        stats["kl_ref"] = 0.04 * math.exp(0.9 * math.sin(step)) if step < 50 else 2.7 + 0.3 * math.sin(step)
        guard.observe(step, stats)
    hits = [e for e in guard.events if e.detector == "kl_ref_blowup"]
    assert hits and hits[0].step == 50 and hits[0].severity == "critical", hits


@pytest.mark.parametrize("stat", ["mismatch_logp_abs_mean", "mismatch_prob_abs_mean", "mismatch_logp_abs_max"])
def test_mismatch_is_judged_from_whichever_stat_the_run_has(stat: str) -> None:
    guard = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(healthy_stream(200, seed=2)):
        del stats["mismatch_kl"]
        stats[stat] = 0.01 * math.exp(0.2 * math.sin(step)) * (1.15 ** max(step - 120, 0))
        guard.observe(step, stats)
    hits = [e for e in guard.events if e.detector == "mismatch_growth"]
    assert hits and 120 <= hits[0].step <= 145, (stat, hits)
    assert any(e.severity == "critical" for e in hits), hits
    assert guard.detectors["mismatch_growth"].reads() == (stat,)


def test_mismatch_stat_choice_survives_a_checkpoint() -> None:
    """A guard restored mid-run judges the same stat against the same bounds (mean |log-prob gap| >= 0.16)."""
    stream = healthy_stream(60, seed=2)
    for step, stats in enumerate(stream):
        del stats["mismatch_kl"]
        stats["mismatch_logp_abs_mean"] = 0.01 if step < 40 else 0.2
    first = Guard(GuardConfig.preset("monitor"))
    for step, stats in enumerate(stream[:30]):
        first.observe(step, stats)
    resumed = Guard(GuardConfig.preset("monitor"))
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for step, stats in enumerate(stream[30:], start=30):
        first.observe(step, stats)
        resumed.observe(step, stats)
    assert [e for e in resumed.events if e.step >= 30] == [e for e in first.events if e.step >= 30]
    hits = [e for e in resumed.events if e.detector == "mismatch_growth"]
    assert hits and (hits[0].step, hits[0].severity, hits[0].threshold) == (41, "critical", 0.16), hits


#: the detectors whose stat is the policy-gradient update's size, and those whose stat is not (the policy's distance
#: from the reference, the engine mismatch, the ratio's spread: a ratio baseline cannot fall below 1)
_UPDATE_SIZE = ("grad_norm_spike", "grad_norm_explosion", "kl_old_blowup", "clip_frac_burst")
_OTHERS = ("kl_ref_blowup", "ratio_explosion", "mismatch_growth", "nonfinite")


def test_a_step_without_signal_is_no_observation_of_the_update_size_detectors() -> None:
    """A batch whose every group has all-equal rewards is neither learnt nor judged by the update-size detectors, nor
    counted toward their warm-up; the other update detectors observe it, and a log without the share is unchanged."""
    stream = healthy_stream(40, seed=3)
    guard, plain = Guard(GuardConfig.preset("default")), Guard(GuardConfig.preset("default"))
    for step, stats in enumerate(stream):
        guard.observe(step, {**stats, "frac_zero_std_groups": 1.0 if step < 25 else 0.5})
        plain.observe(step, {k: v for k, v in stats.items() if k != "frac_zero_std_groups"})
    seen, every = guard.observations(), plain.observations()
    assert all(seen[name] == 15 and every[name] == 40 for name in _UPDATE_SIZE), (seen, every)
    assert all(seen[name] == every[name] == 40 for name in _OTHERS), (seen, every)
    for name in _UPDATE_SIZE:
        assert not guard.detectors[name].observes({**stream[0], "frac_zero_std_groups": 1.0})
        assert guard.detectors[name].observes({**stream[0], "frac_zero_std_groups": 0.99})


@dataclass(kw_only=True)
class _Floor(Detector):
    """A plugin's base: observes a value of ``x`` above 1."""

    name = "floor_x"
    metric: str = "x"

    def observes(self, stats: Mapping[str, float]) -> bool:
        return stats.get("x", 0.0) > 1.0


@dataclass(kw_only=True)
class _PluginSpike(GradNormSpike):
    """A plugin that narrows the gradient-norm spike's steps further and calls ``super().observes``."""

    name = "plugin_spike"

    def observes(self, stats: Mapping[str, float]) -> bool:
        return stats.get("grad_norm", 0.0) < 100.0 and super().observes(stats)


@dataclass(kw_only=True)
class _PluginUpdate(_PolicyGradientSteps, _Floor):
    """The mixin over a plugin's own ``observes``."""

    name = "plugin_update"


@given(
    stats=st.dictionaries(
        st.sampled_from(["grad_norm", "kl_old", "clip_frac", "x", "frac_zero_std_groups"]),
        st.sampled_from([0.0, -0.0, 1e-5, 0.5, 1.0, 2.0, 500.0, math.nan, math.inf, -math.inf]),
    )
)
def test_the_update_size_observes_is_the_signal_test_then_super_s(stats: dict[str, float]) -> None:
    # the parent's observes is resolved once per class: the method super() finds, for built-ins and plugins alike
    for cls in (GradNormSpike, GradNormExplosion, KLOldBlowup, ClipFracBurst, _PluginSpike, _PluginUpdate):
        det = cls()
        parent = super(_PolicyGradientSteps, det).observes(stats)  # type: ignore[misc]
        assert _PolicyGradientSteps.observes(det, stats) == (not without_signal(stats) and parent), cls
    plugin = _PluginSpike()  # its own test, then the mixin's through super()
    assert plugin.observes(stats) == (stats.get("grad_norm", 0.0) < 100.0 and GradNormSpike().observes(stats))
