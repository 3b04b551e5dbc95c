"""The Guard: detectors -> alarms (warm-up, patience, hysteresis) -> interventions -> one Decision per step.

``Guard.observe`` is a pure function of the reduced stats and the guard's state, so ranks that reduced the same
stats (:meth:`rlguard.guards.StepStats.reduce`) take the same decision without another collective.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from rlguard.guards.actuation.executor import apply_decision
from rlguard.guards.alarms import AlarmState
from rlguard.guards.alerts.config import alert_plugin
from rlguard.guards.config import PRESETS, GuardConfig, check_preset
from rlguard.guards.consequence.live import OnlineConsequence
from rlguard.guards.decision import LOGGED_ACTIONS, Controls, Decision, Proposal, logged_action
from rlguard.guards.detectors import Detector
from rlguard.guards.events import Event, EventsLog, Finding, Severity
from rlguard.guards.guard_state import read_guard_state
from rlguard.guards.interventions import Intervention, StepContext, handed_over
from rlguard.guards.observers import Observers
from rlguard.guards.registry import (
    build_members,
    detector_registry,
    guard_plugin_manager,
    intervention_registry,
    with_plugin_stats,
)
from rlguard.guards.state import STATE_VERSION, probe_state, state_object

if TYPE_CHECKING:
    from rlguard.guards.actuation.contract import Actuator, Applied

__all__ = ["PRESETS", "Guard", "GuardConfig", "check_preset", "make_guard"]

_LEVEL_NAME: dict[int, Severity] = {1: "warn", 2: "critical"}
_LEVEL = attrgetter("level")
#: the proposal of a step nobody proposes anything for (frozen: shared)
_NO_PROPOSAL = Proposal()
#: the controls of a step nobody proposes or schedules anything for, combined once (frozen: shared)
_NO_CONTROLS = Controls.combine([], {})


class Guard:
    """Watches each step's stats and decides how the trainer should react.

    >>> guard = Guard(GuardConfig.preset("default"))
    >>> decision = guard.observe(step, stats)  # doctest: +SKIP
    """

    def __init__(self, config: GuardConfig | None = None, *, plugins: pluggy.PluginManager | None = None) -> None:
        """``plugins``: the manager whose plugins' hooks this guard calls (``rlguard_step_stats``,
        ``rlguard_on_decision``); by default a manager of its own holding the process's plugins and this guard's
        alerts (:func:`~rlguard.guards.registry.guard_plugin_manager`). Its relay is :attr:`hook`."""
        self.config = GuardConfig.preset("default") if config is None else config
        self.detectors: dict[str, Detector] = build_members(detector_registry(), self.config.detectors, "detector")
        unknown = sorted(set(self.config.healthy_despite) - set(detector_registry()))
        if unknown:
            raise ValueError(
                f"GuardConfig.healthy_despite names unknown detectors {unknown}; known: {sorted(detector_registry())}."
            )
        self.interventions: dict[str, Intervention] = (
            {}
            if self.config.observe_only
            else build_members(intervention_registry(), self.config.interventions, "intervention")
        )
        #: intervention -> the detectors it leaves to the enabled intervention that answers their cause
        self.handed_over = handed_over(self.interventions)
        self.events: list[Event] = []
        self._alarms = {name: AlarmState() for name in self.detectors}
        #: whether any alarm is raised: read again only where a level may have changed (most steps change none)
        self._raised = False
        #: the detectors that may observe a step, planned once per set of stat names, with each one's ledger of
        #: observations (its warm-up, and what a healthy snapshot is known to predate: StepContext.judged_clean)
        self._observers = Observers(self.detectors, self._alarms)
        self._ledgers = self._observers.ledgers
        #: the findings of the last observed step, by detector, as the detectors made them (the doctor reads them
        #: to judge consequences with hindsight): a new dict at each step, which a reader may keep
        self.last_findings: dict[str, Finding] = {}
        #: the detectors that judged the last observed step (it carried their stats), in the detectors' order
        self.last_observed: list[str] = []
        #: the consequence rule applied live (``config.consequence == "online"``), or None
        self.live_rule = OnlineConsequence(self.detectors) if self.config.consequence == "online" else None
        self._consecutive_skips = 0
        self._last_healthy_step: int | None = None
        self._last_snapshot_step: int | None = None
        self._last_step: int | None = None
        self._unable: dict[str, str] = {}
        self._actuator_name = ""
        #: what the bound actuator can do (:func:`~rlguard.guards.actuation.bind_guard`); None while unbound
        self.capabilities: frozenset[str] | None = None
        self._restored = False  # load_state_dict was called: a resumed run
        self._events_log: EventsLog | None = None
        self._events_opened = False
        self.alerts = alert_plugin(self)
        pm = plugins if plugins is not None else guard_plugin_manager(self.alerts)
        #: the hook relay of this guard's plugins (pluggy's ``pm.hook``), handed to the executor by :meth:`apply`
        self.hook: pluggy.HookRelay = pm.hook

    @property
    def last_healthy_step(self) -> int | None:
        """The last step with no finding and no raised alarm."""
        return self._last_healthy_step

    def observations(self) -> dict[str, int]:
        """Steps each detector has judged: the steps that carried its stats (warm-up included)."""
        return {n: ledger.seen for n, ledger in self._ledgers.items()}

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
        if not self._events_opened and self.config.events_path:
            self.open_events(self.config.events_path)
        stats = with_plugin_stats(self.hook, step, stats)  # the plugins' rlguard_step_stats hooks
        findings, new_events = self._run_detectors(step, stats)
        proposals: list[Proposal] = []
        if self.interventions:  # a guard that only observes proposes nothing: no context to build
            ctx = StepContext(
                step=step,
                stats=stats,
                findings=findings,
                alarms=self.alarms(),
                alarm_age={n: a.critical_age for n, a in self._alarms.items() if a.critical_age},
                consecutive_skips=self._consecutive_skips,
                last_healthy_step=self._last_healthy_step,
                capabilities=self.capabilities,
                handed_over=self.handed_over,
                # a finding beyond an absolute bound is vouched for by any clean observation before it
                judged_clean=frozenset(
                    n
                    for n, ledger in self._ledgers.items()
                    if ledger.judged_clean or (ledger.seen_clean and n in findings and findings[n].absolute)
                ),
            )
            proposals = [p for iv in self.interventions.values() if (p := iv.propose(ctx)) is not None]
        healthy = self._healthy(findings)  # the alarms change only after the decision
        decision = self._decide(step, proposals, healthy, findings, new_events)
        self._after(decision, healthy, poisoned=any([p.outcome == "skip" and p.poisoned for p in proposals]))
        if decision.events:  # most steps raise none
            self.events.extend(decision.events)  # the decision's own Event objects (the alerts compare identities)
            if self._events_log is not None:
                self._events_log.write(decision.events)
        return decision

    def apply(self, decision: Decision, actuator: Actuator) -> Applied:
        """Carry out ``decision`` on ``actuator`` (:func:`~rlguard.guards.actuation.apply_decision`), calling this
        guard's plugins (its alerts included) through :attr:`hook`."""
        return apply_decision(decision, actuator, hook=self.hook)

    def _run_detectors(self, step: int, stats: Mapping[str, float]) -> tuple[dict[str, Finding], list[Event]]:
        """This step's findings (with severity by consequence where ``config.consequence`` is ``"online"``) and
        the alarm events they raise (:meth:`Observers.judge`: each detector that observes the step judges it, its
        ledger counts it; without the live rule each detector's alarm sees its own finding in the same pass, in the
        detectors' order)."""
        alarms, live_rule = self._alarms, self.live_rule
        found, observed, events = self._observers.judge(
            step, stats, by_steps=self.config.warmup_unit == "steps", see=live_rule is None
        )
        self.last_findings, self.last_observed = found, observed
        if live_rule is None:
            if self._observers.alarms_seen:  # an alarm saw a finding or a raised level: its level may have changed
                self._observers.alarms_seen = False
                self._raised = any(map(_LEVEL, alarms.values()))
            return found, events
        patient = [n for n in found if alarms[n].streak + 1 >= self.detectors[n].patience]
        verdict = live_rule.judge_step(step, stats, observed, found, patient)
        findings, raised = verdict.findings, verdict.raised
        seen_events: list[Event | None] = []
        for name in observed:
            det, alarm = self.detectors[name], alarms[name]
            seen_events.append(alarm.see(step, name, findings.get(name), det.patience, det.clear_after))
            if name in raised:
                seen_events.append(alarm.raise_critical(step, name, raised.pop(name)))
            alarm.critical_age = alarm.critical_age + 1 if alarm.level == 2 else 0
        # raised at a step that did not carry the detector's stats
        seen_events.extend(alarms[name].raise_critical(step, name, finding) for name, finding in raised.items())
        self._raised = any(map(_LEVEL, alarms.values()))
        return findings, [e for e in seen_events if e is not None]

    def set_record_only(self, unable: Mapping[str, str], *, where: str) -> None:
        """Mark the events of proposals ``where`` (the training loop's actuator) cannot carry out as
        ``record-only``: ``unable`` maps an outcome or a control to the capability it lacks. Called by
        :func:`rlguard.guards.actuation.bind_guard` at start-up, which knows what each needs."""
        self._unable = dict(unable)
        self._actuator_name = where

    def _decide(
        self, step: int, proposals: list[Proposal], healthy: bool, findings: Mapping[str, Finding], events: list[Event]
    ) -> Decision:
        due = self._last_snapshot_step is None or step - self._last_snapshot_step >= self.config.snapshot_interval
        if not proposals and not self.config.schedules:  # most steps: the neutral decision, nothing to rank
            snapshot = healthy and due and not self.config.observe_only
            return Decision._neutral(step, _NO_CONTROLS, snapshot=snapshot, events=tuple(events))
        best = max(proposals, key=lambda p: LOGGED_ACTIONS.index(logged_action(p)), default=_NO_PROPOSAL)
        action = logged_action(best)
        scheduled = {k: s(step) for k, s in self.config.schedules.items()}
        if proposals or scheduled:
            controls = Controls.combine([p.controls for p in proposals], scheduled)
        else:  # nothing proposed or scheduled (most steps): the neutral controls, combined once
            controls = _NO_CONTROLS
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
            # a control change (set_clip, scale_lr) is no sign of trouble: the step is healthy if nothing was found;
            # a guard that only observes never rolls back, so it keeps no snapshot
            snapshot=healthy and due and best.outcome == "step" and not self.config.observe_only,
            events=tuple(events),
            reason=best.reason,
        )

    def _healthy(self, findings: Mapping[str, Finding]) -> bool:
        """No finding and no raised alarm, except those of ``config.healthy_despite``."""
        if not findings and not self._raised:  # most steps: nothing found or raised
            return True
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

    def _after(self, decision: Decision, healthy: bool, *, poisoned: bool) -> None:
        self._consecutive_skips = self._consecutive_skips + 1 if decision.outcome == "skip" and poisoned else 0
        if decision.snapshot:
            self._last_snapshot_step = decision.step
        if healthy and decision.outcome == "step":
            self._last_healthy_step = decision.step
        if decision.outcome == "rollback":
            # the weights go back to a healthy step: clear alarms so that the run is judged afresh
            for alarm in self._alarms.values():
                alarm.level = alarm.streak = alarm.critical_age = 0
            self._raised = False
            if self.live_rule is not None:
                self.live_rule.reset()
            for iv in self.interventions.values():
                iv.on_rollback(decision.step)

    def open_events(self, path: str | Path | None, *, resume_step: int | None = None) -> None:
        """Write this guard's events to ``path`` from now on (None: to no file, e.g. on ranks other than the first):
        a run that starts afresh moves an existing file aside; a resumed one (``resume_step``, the step it resumes
        after; by default the last step of a state loaded with :meth:`load_state_dict`) continues it with the
        loaded events as its record (:class:`~rlguard.guards.events.EventsLog`). Called by the adapters when
        training starts; otherwise the first :meth:`observe` opens ``config.events_path``."""
        if self._events_log is not None:
            self._events_log.close()
        self._events_opened = True
        self._events_log = None
        if path is None:
            return
        if resume_step is None and self._restored:
            resume_step = self._last_step if self._last_step is not None else 0
        history = list(self.events) if self._restored else None
        self._events_log = EventsLog(path, resume_step=resume_step, history=history)

    @property
    def events_log(self) -> EventsLog | None:
        """Where events are written (None: nowhere)."""
        return self._events_log

    def report(self) -> str:
        """A short text report: raised alarms and the last events."""
        lines = [f"rlguard: {len(self.events)} events; alarms: {self.alarms() or 'none'}"]
        lines += [f"  step {e.step} [{e.severity}] {e.detector}: {e.message}" for e in self.events[-10:]]
        return "\n".join(lines)

    # -- checkpointing -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue with the same baselines and history (JSON-ready); the live
        consequence rule's state (``consequence``) only where ``config.consequence`` is ``"online"``."""
        online = {} if self.live_rule is None else {"consequence": self.live_rule.state_dict()}
        return online | {
            "version": STATE_VERSION,
            "events": [e.to_dict() for e in self.events],
            "alarms": {n: vars(a).copy() for n, a in self._alarms.items()},
            "seen": self.observations(),
            "first_seen": {n: ledger.first_seen for n, ledger in self._ledgers.items()},
            "judged_clean": sorted(n for n, ledger in self._ledgers.items() if ledger.judged_clean),
            "seen_clean": sorted(n for n, ledger in self._ledgers.items() if ledger.seen_clean),
            "detectors": {n: d.state_dict() for n, d in self.detectors.items()},
            "interventions": {n: iv.state_dict() for n, iv in self.interventions.items()},
            "consecutive_skips": self._consecutive_skips,
            "last_healthy_step": self._last_healthy_step,
            "last_snapshot_step": self._last_snapshot_step,
            "last_step": self._last_step,
        }

    def load_state_dict(self, state: Mapping[str, Any], *, source: str = "guard state") -> None:
        """Restore :meth:`state_dict`, validated first (:mod:`rlguard.guards.state`): the version, known keys only
        and the type of every value; :class:`~rlguard.guards.state.GuardStateError` naming ``source`` (the file)
        and the key otherwise, with nothing changed. Detectors and interventions this guard does not run are
        ignored (a state saved by a guard configured otherwise)."""
        read = read_guard_state(state, source, set(self.state_dict()), self.detectors, self._alarms)
        events, alarms, seen, first_seen = read.events, read.alarms, read.seen, read.first_seen
        clean, seen_clean, counters = read.judged_clean, read.seen_clean, read.counters
        # private states last: each validates all of its keys before it changes anything
        owners: dict[str, Mapping[str, Any]] = {"detectors": self.detectors, "interventions": self.interventions}
        private = {kind: state_object(state[kind], f"{source}: {kind}") for kind in owners}
        for kind, parts in private.items():
            for n, s in parts.items():
                if n in owners[kind]:
                    probe_state(owners[kind][n], s, f"{source}: {kind}.{n}")
        online = state.get("consequence")
        if self.live_rule is not None and online is not None:
            probe_state(self.live_rule, online, f"{source}: consequence")
        for kind, parts in private.items():
            for n, s in parts.items():
                if n in owners[kind]:
                    owners[kind][n].load_state_dict(s, where=f"{source}: {kind}.{n}")
        if self.live_rule is not None and online is not None:
            self.live_rule.load_state_dict(online, where=f"{source}: consequence")
        self.events = events
        self._alarms.update(alarms)
        self._raised = any(map(_LEVEL, self._alarms.values()))
        self._observers.clear()  # new alarm objects, and what a detector reads may follow its loaded state
        ledgers, judged, seen_once = self._ledgers, set(clean), set(seen_clean)
        for n, v in seen.items():
            if n in ledgers:
                ledgers[n].seen = v
        for n, first in first_seen.items():
            if n in ledgers:
                ledgers[n].first_seen = first
        for n, ledger in ledgers.items():
            ledger.judged_clean, ledger.seen_clean = n in judged, n in seen_once
        self._consecutive_skips = read.consecutive_skips
        self._last_healthy_step = counters["last_healthy_step"]
        self._last_snapshot_step = counters["last_snapshot_step"]
        self._last_step = counters["last_step"]
        self._restored = True


def make_guard(guard: str | GuardConfig | Guard) -> Guard:
    """A guard from a preset name (:data:`~rlguard.guards.PRESETS`), a ``GuardConfig`` or a ``Guard``."""
    if isinstance(guard, Guard):
        return guard
    if isinstance(guard, GuardConfig):
        return Guard(guard)
    if isinstance(guard, str):
        return Guard(GuardConfig.preset(guard))
    raise ValueError(
        f"guard must be a preset name ({', '.join(map(repr, PRESETS))}), a GuardConfig or a Guard; got {guard!r}."
    )
