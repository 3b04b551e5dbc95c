"""The Guard: detectors -> alarms (warm-up, patience, hysteresis) -> interventions -> one Decision per step.

``Guard.observe`` is a pure function of the reduced stats and the guard's state, so ranks that reduced the same
stats (:meth:`rlguard.guards.StepStats.reduce`) take the same decision without another collective.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlguard.guards.alerts import AlertConfig, alert_config, register_alerts
from rlguard.guards.decision import Decision
from rlguard.guards.detectors import Detector
from rlguard.guards.events import SEVERITY_LEVEL, Event, Finding, Severity
from rlguard.guards.interventions import ACTION_PRIORITY, Intervention, Proposal, Rollback, StepContext
from rlguard.guards.recovery import Recovery
from rlguard.guards.registry import detector_registry, intervention_registry, with_plugin_stats
from rlguard.guards.schedules import SCHEDULED_KEYS, Schedule

_LEVEL_NAME: dict[int, Severity] = {1: "warn", 2: "critical"}
#: the actuator capability each action needs (``rlguard.guards.actuator``)
_ACTION_CAPABILITY = {
    "skip_step": "drop_update",
    "rollback": "restore",
    "halt": "stop",
    "scale_lr": "lr_scale",
    "set_clip": "clip",
}


@dataclass
class GuardConfig:
    """What the guard watches and how it may act.

    Attributes:
        detectors: detector name -> keyword overrides of its defaults, or None to switch it off. Registered
            detectors not named here run with their defaults.
        interventions: intervention name -> overrides, or None to switch it off; likewise, except that the opt-in
            ones (``enabled_by_default = False``: ``trust_region``, ``entropy_control``, ``recovery``) run only
            when named. An empty guard (``monitor`` preset) switches all of them off and only observes.
        schedules: ``clip_low``, ``clip_high``, ``beta``, ``entropy_coef`` or ``lr_scale`` -> a schedule by step
            (:mod:`rlguard.guards.schedules`); the decision carries their values.
        snapshot_interval: a healthy step at least this many steps after the last snapshot asks for a new one.
        events_path: if set, every event is appended to this JSONL file.
        observe_only: never act (action is always ``continue``); schedules still apply.
        healthy_despite: detectors whose findings and alarms do not make a step unhealthy: conditions of the data
            or of the rollout engine (a train-inference mismatch, groups without variance) that the weights of a
            snapshot do not carry and a rollback does not change. Without this, such a chronic alarm leaves the
            run with no healthy snapshot, and the next real failure halts it instead of rolling back.
        alerts: where the guard's important decisions are sent (a webhook, W&B), as an :class:`AlertConfig` or
            a mapping of its fields (:mod:`rlguard.guards.alerts`); None sends none.
    """

    detectors: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    interventions: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    schedules: dict[str, Schedule] = field(default_factory=dict)
    snapshot_interval: int = 10
    events_path: str | None = None
    observe_only: bool = False
    healthy_despite: tuple[str, ...] = ()
    alerts: AlertConfig | None = None

    def __post_init__(self) -> None:
        self.alerts = alert_config(self.alerts)
        unknown = set(self.schedules) - set(SCHEDULED_KEYS)
        if unknown:
            raise ValueError(f"schedules may set {list(SCHEDULED_KEYS)}; got {sorted(unknown)}.")
        if self.snapshot_interval < 1:
            raise ValueError(f"snapshot_interval must be >= 1; got {self.snapshot_interval}.")

    @classmethod
    def preset(cls, name: str, **changes: Any) -> GuardConfig:
        """``"monitor"`` (observe only), ``"default"``, ``"strict"`` or ``"stable"``; ``changes`` override fields."""
        presets = {"monitor": _monitor, "default": _default, "strict": _strict, "stable": _stable}
        if name not in presets:
            raise ValueError(f"unknown guard preset {name!r}; presets: {', '.join(presets)}.")
        return replace(presets[name](), **changes)


def _monitor() -> GuardConfig:
    return GuardConfig(observe_only=True)


def _default() -> GuardConfig:
    return GuardConfig()


def _strict() -> GuardConfig:
    spikes = {"warn_factor": 3.0, "critical_factor": 10.0, "min_z": 4.0}
    return GuardConfig(
        detectors={
            "grad_norm_spike": spikes,
            "kl_ref_blowup": {"warn_factor": 5.0, "critical_factor": 30.0, "min_z": 4.0},
            "kl_old_blowup": {"warn_factor": 5.0, "critical_factor": 30.0, "min_z": 4.0},
            "ratio_explosion": {"warn_factor": 3.0, "critical_factor": 20.0, "min_z": 4.0},
            "entropy_collapse": {"warn_ratio": 0.6, "critical_ratio": 0.3, "patience": 2},
            "reward_collapse": {"warn_drop": 4.0, "critical_drop": 8.0, "patience": 2},
            "mismatch_growth": {"warn_above": 2e-3, "critical_above": 1e-2},
        },
        interventions={
            "skip_step": {"severity": "warn", "on": ("nonfinite", "grad_norm_spike", "ratio_explosion")},
            "lr_backoff": {"cooldown": 5, "quiet_steps": 40},
            "clip_controller": {"target": 0.01, "min_scale": 0.1},
            "halt": {"critical_steps": 10},
        },
        snapshot_interval=5,
    )


def _stable() -> GuardConfig:
    """``default`` plus the controllers that keep a run going instead of stopping it (issue 15): the trust region
    on the step size, clip-higher on entropy collapse, and rollbacks that learn (``recovery`` replaces
    ``rollback`` and ``halt``: a persistent critical alarm is a recovery attempt, and the run halts only after
    repeated failed recoveries)."""
    # A train-inference mismatch comes back with the next rollout from the same engine: a rollback does not cure it
    # (lr_backoff slows what it does), and its alarm leaves the steps healthy (snapshots go on). An entropy far
    # below its start with the reward above its early level is a policy that converged on what it learned (a task
    # with one right answer ends near zero entropy): no floor that is critical whatever the reward does.
    recovery = {
        "on": tuple(n for n in Rollback.on if n != "mismatch_growth"),
        "ignore": (*Recovery.ignore, "mismatch_growth"),
    }
    return GuardConfig(
        detectors={"entropy_collapse": {"floor_ratio": 0.0}},
        interventions={
            "trust_region": {},
            "entropy_control": {},
            "recovery": recovery,
            "rollback": None,
            "halt": None,
        },
        healthy_despite=("mismatch_growth",),
    )


@dataclass
class _AlarmState:
    level: int = 0  # 0 none, 1 warn, 2 critical
    streak: int = 0  # consecutive findings
    clean: int = 0  # consecutive clean steps
    critical_age: int = 0  # consecutive steps at critical


class Guard:
    """Watches each step's stats and decides how the trainer should react.

    >>> guard = Guard(GuardConfig.preset("default"))
    >>> decision = guard.observe(step, stats)  # doctest: +SKIP
    """

    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = GuardConfig.preset("default") if config is None else config
        self.detectors: dict[str, Detector] = _build(detector_registry(), self.config.detectors, "detector")
        unknown = sorted(set(self.config.healthy_despite) - set(detector_registry()))
        if unknown:
            raise ValueError(
                f"GuardConfig.healthy_despite names unknown detectors {unknown}; known: {sorted(detector_registry())}."
            )
        self.interventions: dict[str, Intervention] = (
            {}
            if self.config.observe_only
            else _build(intervention_registry(), self.config.interventions, "intervention")
        )
        self.events: list[Event] = []
        self._alarms = {name: _AlarmState() for name in self.detectors}
        #: the findings of the last observed step, by detector (the doctor reads them to judge consequences)
        self.last_findings: dict[str, Finding] = {}
        self._seen = dict.fromkeys(self.detectors, 0)
        self._consecutive_skips = 0
        self._last_healthy_step: int | None = None
        self._last_snapshot_step: int | None = None
        self._last_step: int | None = None
        self._record_only: frozenset[str] = frozenset()
        self._actuator_name = ""
        register_alerts(self)

    @property
    def last_healthy_step(self) -> int | None:
        """The last step with no finding and no raised alarm."""
        return self._last_healthy_step

    def observations(self) -> dict[str, int]:
        """Steps each detector has judged: the steps that carried its stats (warm-up included)."""
        return dict(self._seen)

    def alarms(self) -> dict[str, Severity]:
        """Raised alarms by detector."""
        return {n: _LEVEL_NAME[a.level] for n, a in self._alarms.items() if a.level}

    def observe(self, step: int, stats: Mapping[str, float]) -> Decision:
        """Judge one optimizer step from its reduced stats (canonical names) and decide."""
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(
                f"step must increase: got {step} after {self._last_step}. After a rollback keep counting forward."
            )
        self._last_step = step
        stats = with_plugin_stats(step, stats)  # the plugins' rlguard_step_stats hooks
        findings, new_events = self._run_detectors(step, stats)
        ctx = StepContext(
            step=step,
            stats=stats,
            findings=findings,
            alarms=self.alarms(),
            alarm_age={n: a.critical_age for n, a in self._alarms.items() if a.critical_age},
            consecutive_skips=self._consecutive_skips,
            last_healthy_step=self._last_healthy_step,
        )
        proposals = [p for iv in self.interventions.values() if (p := iv.propose(ctx)) is not None]
        decision = self._decide(step, proposals, findings, new_events)
        self._after(decision, findings)
        self._record(list(decision.events))
        return decision

    def _run_detectors(self, step: int, stats: Mapping[str, float]) -> tuple[dict[str, Finding], list[Event]]:
        findings: dict[str, Finding] = {}
        events: list[Event] = []
        for name, det in self.detectors.items():
            if not det.observes(stats):
                continue  # no evidence this step: alarm, streak and warm-up stay as they are
            armed = self._seen[name] >= det.warmup
            finding = det.check(step, stats, armed)
            self._seen[name] += 1
            alarm = self._alarms[name]
            if finding is None:
                alarm.streak, alarm.clean = 0, alarm.clean + 1
                if alarm.level and alarm.clean >= det.clear_after:
                    alarm.level = 0
            else:
                findings[name] = finding
                alarm.streak, alarm.clean = alarm.streak + 1, 0
                level = SEVERITY_LEVEL[finding.severity]
                if alarm.streak >= det.patience and level > alarm.level:
                    alarm.level = level
                    events.append(
                        Event(step, name, finding.severity, finding.value, finding.message, finding.threshold)
                    )
            alarm.critical_age = alarm.critical_age + 1 if alarm.level == 2 else 0
        self.last_findings = findings
        return findings, events

    def set_record_only(self, capabilities: Iterable[str], *, where: str) -> None:
        """Mark the events of actions needing ``capabilities`` as ``record-only``: ``where`` (the training loop's
        actuator) cannot carry them out. Called by :func:`rlguard.guards.actuator.bind_guard` at start-up."""
        self._record_only = frozenset(capabilities)
        self._actuator_name = where

    def _decide(
        self, step: int, proposals: list[Proposal], findings: Mapping[str, Finding], events: list[Event]
    ) -> Decision:
        best = max(proposals, key=lambda p: ACTION_PRIORITY[p.action], default=Proposal("continue"))
        lr_scale = math.prod(p.lr_scale for p in proposals if p.lr_scale is not None)
        clip_scale = math.prod(p.clip_scale for p in proposals if p.clip_scale is not None)
        clip_high_scale = math.prod(p.clip_high_scale for p in proposals if p.clip_high_scale is not None)
        scheduled = {k: s(step) for k, s in self.config.schedules.items()}
        lr_scale *= scheduled.pop("lr_scale", 1.0)
        healthy = self._healthy(findings)
        due = self._last_snapshot_step is None or step - self._last_snapshot_step >= self.config.snapshot_interval
        value_of = {"scale_lr": lr_scale, "set_clip": clip_scale}
        if best.action != "continue" and best.reason:
            sev: Severity = "critical" if best.action in ("halt", "rollback", "skip_step") else "warn"
            value = value_of.get(best.action, float(len(findings)))
            events.append(Event(step, f"action:{best.action}", sev, value, self._marked(best.action, best.reason)))
        # a control change proposed by an intervention that lost to a higher-priority action still takes effect
        # (controls apply whatever the outcome): it gets its own event
        for p in proposals:
            if p is not best and p.action in value_of and p.reason:
                reason = f"{p.reason}; with {best.action}"
                events.append(
                    Event(step, f"action:{p.action}", "warn", value_of[p.action], self._marked(p.action, reason))
                )
        return Decision(
            step=step,
            action=best.action,
            lr_scale=lr_scale,
            clip_scale=clip_scale,
            clip_high_scale=clip_high_scale,
            rollback_to=best.rollback_to,
            # a control change (set_clip, scale_lr) is no sign of trouble: the step is healthy if nothing was found
            snapshot=healthy and due and best.action in ("continue", "set_clip", "scale_lr"),
            events=tuple(events),
            reason=best.reason,
            **scheduled,
        )

    def _healthy(self, findings: Mapping[str, Finding]) -> bool:
        """No finding and no raised alarm, except those of ``config.healthy_despite``."""
        despite = self.config.healthy_despite
        return not any(n not in despite for n in findings) and not any(
            a.level for n, a in self._alarms.items() if n not in despite
        )

    def _marked(self, action: str, reason: str) -> str:
        """``reason``, marked record-only when the bound actuator cannot carry out ``action``."""
        capability = _ACTION_CAPABILITY.get(action)
        if capability is not None and capability in self._record_only:
            return f"{reason} [record-only: {self._actuator_name} cannot {capability}]"
        return reason

    def _after(self, decision: Decision, findings: Mapping[str, Finding]) -> None:
        self._consecutive_skips = self._consecutive_skips + 1 if decision.action == "skip_step" else 0
        if decision.snapshot:
            self._last_snapshot_step = decision.step
        if self._healthy(findings) and decision.outcome == "step":
            self._last_healthy_step = decision.step
        if decision.action == "rollback":
            # the weights go back to a healthy step: clear alarms so that the run is judged afresh
            for alarm in self._alarms.values():
                alarm.level = alarm.streak = alarm.critical_age = 0
            for iv in self.interventions.values():
                iv.on_rollback(decision.step)

    def _record(self, events: list[Event]) -> None:
        self.events.extend(events)
        if events and self.config.events_path:
            path = Path(self.config.events_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as fh:
                for e in events:
                    fh.write(json.dumps(e.to_dict()) + "\n")

    def report(self) -> str:
        """A short text report: raised alarms and the last events."""
        lines = [f"rlguard: {len(self.events)} events; alarms: {self.alarms() or 'none'}"]
        lines += [f"  step {e.step} [{e.severity}] {e.detector}: {e.message}" for e in self.events[-10:]]
        return "\n".join(lines)

    # -- checkpointing -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue with the same baselines and history (JSON-ready)."""
        return {
            "version": 1,
            "events": [e.to_dict() for e in self.events],
            "alarms": {n: vars(a).copy() for n, a in self._alarms.items()},
            "seen": dict(self._seen),
            "detectors": {n: d.state_dict() for n, d in self.detectors.items()},
            "interventions": {n: iv.state_dict() for n, iv in self.interventions.items()},
            "consecutive_skips": self._consecutive_skips,
            "last_healthy_step": self._last_healthy_step,
            "last_snapshot_step": self._last_snapshot_step,
            "last_step": self._last_step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; detectors or interventions absent from this guard are ignored."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported guard state version {state.get('version')!r}; expected 1.")
        state = copy.deepcopy(dict(state))
        self.events = [Event.from_dict(e) for e in state["events"]]
        for n, a in state["alarms"].items():
            if n in self._alarms:
                self._alarms[n] = _AlarmState(**a)
        self._seen.update({n: v for n, v in state["seen"].items() if n in self._seen})
        for n, s in state["detectors"].items():
            if n in self.detectors:
                self.detectors[n].load_state_dict(s)
        for n, s in state["interventions"].items():
            if n in self.interventions:
                self.interventions[n].load_state_dict(s)
        self._consecutive_skips = state["consecutive_skips"]
        self._last_healthy_step = state["last_healthy_step"]
        self._last_snapshot_step = state["last_snapshot_step"]
        self._last_step = state["last_step"]


def _build(registry: Mapping[str, type], overrides: Mapping[str, dict[str, Any] | None], kind: str) -> dict[str, Any]:
    unknown = set(overrides) - set(registry)
    if unknown:
        raise ValueError(f"unknown {kind}(s) {sorted(unknown)}; registered: {', '.join(registry)}.")
    built = {}
    for name, cls in registry.items():
        if (name in overrides and overrides[name] is None) or (
            name not in overrides and not getattr(cls, "enabled_by_default", True)
        ):
            continue
        params = dict(overrides.get(name) or {})
        try:
            built[name] = cls(**params)
        except TypeError as err:
            accepted = cls.defaults() if hasattr(cls, "defaults") else {}
            raise ValueError(f"bad parameters for {kind} {name!r}: {err}; accepted: {accepted}.") from None
    return built
