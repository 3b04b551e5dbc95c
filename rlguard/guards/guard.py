"""The Guard: detectors -> alarms (warm-up, patience, hysteresis) -> interventions -> one Decision per step.

``Guard.observe`` is a pure function of the reduced stats and the guard's state, so ranks that reduced the same
stats (:meth:`rlguard.guards.StepStats.reduce`) take the same decision without another collective.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlguard.guards.alerts import register_alerts
from rlguard.guards.config import PRESETS, GuardConfig, check_preset
from rlguard.guards.decision import LOGGED_ACTIONS, Controls, Decision, Proposal, logged_action
from rlguard.guards.detectors import Detector
from rlguard.guards.events import SEVERITY_LEVEL, Event, Finding, Severity
from rlguard.guards.interventions import Intervention, StepContext
from rlguard.guards.registry import detector_registry, intervention_registry, with_plugin_stats

__all__ = ["PRESETS", "Guard", "GuardConfig", "check_preset"]

_LEVEL_NAME: dict[int, Severity] = {1: "warn", 2: "critical"}


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
        self._unable: dict[str, str] = {}
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

    def set_record_only(self, unable: Mapping[str, str], *, where: str) -> None:
        """Mark the events of proposals ``where`` (the training loop's actuator) cannot carry out as
        ``record-only``: ``unable`` maps an outcome or a control to the capability it lacks. Called by
        :func:`rlguard.guards.actuator.bind_guard` at start-up, which knows what each needs."""
        self._unable = dict(unable)
        self._actuator_name = where

    def _decide(
        self, step: int, proposals: list[Proposal], findings: Mapping[str, Finding], events: list[Event]
    ) -> Decision:
        best = max(proposals, key=lambda p: LOGGED_ACTIONS.index(logged_action(p)), default=Proposal())
        action = logged_action(best)
        scheduled = {k: s(step) for k, s in self.config.schedules.items()}
        controls = Controls.combine([p.controls for p in proposals], scheduled)
        healthy = self._healthy(findings)
        due = self._last_snapshot_step is None or step - self._last_snapshot_step >= self.config.snapshot_interval
        value_of = {"scale_lr": controls.lr_scale, "set_clip": controls.clip_scale}
        if action != "continue" and best.reason:
            sev: Severity = "warn" if best.outcome == "step" else "critical"
            value = value_of.get(action, float(len(findings)))
            events.append(Event(step, f"action:{action}", sev, value, self._marked(best, best.reason)))
        # a control change proposed by an intervention that lost to a higher-priority action still takes effect
        # (controls apply whatever the outcome): it gets its own event
        for p in proposals:
            name = logged_action(p)
            if p is not best and name in value_of:
                events.append(
                    Event(step, f"action:{name}", "warn", value_of[name], self._marked(p, f"{p.reason}; with {action}"))
                )
        return Decision(
            step=step,
            outcome=best.outcome,
            controls=controls,
            rollback_to=best.rollback_to,
            # a control change (set_clip, scale_lr) is no sign of trouble: the step is healthy if nothing was found
            snapshot=healthy and due and best.outcome == "step",
            events=tuple(events),
            reason=best.reason,
        )

    def _healthy(self, findings: Mapping[str, Finding]) -> bool:
        """No finding and no raised alarm, except those of ``config.healthy_despite``."""
        despite = self.config.healthy_despite
        return not any(n not in despite for n in findings) and not any(
            a.level for n, a in self._alarms.items() if n not in despite
        )

    def _marked(self, proposal: Proposal, reason: str) -> str:
        """``reason``, marked record-only when the bound actuator cannot carry out ``proposal``: its outcome, or for
        a step the controls it sets."""
        needs = tuple(proposal.controls) if proposal.outcome == "step" else (proposal.outcome,)
        capability = next((self._unable[n] for n in needs if n in self._unable), None)
        if capability is not None:
            return f"{reason} [record-only: {self._actuator_name} cannot {capability}]"
        return reason

    def _after(self, decision: Decision, findings: Mapping[str, Finding]) -> None:
        self._consecutive_skips = self._consecutive_skips + 1 if decision.outcome == "skip" else 0
        if decision.snapshot:
            self._last_snapshot_step = decision.step
        if self._healthy(findings) and decision.outcome == "step":
            self._last_healthy_step = decision.step
        if decision.outcome == "rollback":
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
