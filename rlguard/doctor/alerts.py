"""A log's findings and a job's recorded guard events as alerts, for ``rlguard watch --alerts`` (at each judgement of
the growing log) and ``rlguard doctor --alerts`` (once): the in-process guard's :class:`AlertConfig`, webhook and
sender, so that a job nobody can edit (an unguarded verl run, a colleague's TRL job) can page the team as a guarded
one does, from any machine that can read its files.

What raises an alert, the config's rules read for a log:

- a finding of the doctor (one per detector, :class:`~rlguard.doctor.DoctorFinding`) at or above ``min_severity``,
  or whose detector matches one of ``events``;
- an event of the job's ``events.jsonl`` (with its severity after the log's hindsight, as the doctor shows it) at or
  above ``min_severity``, matching ``events``, or an action whose outcome is in ``outcomes`` (``action:rollback``,
  ``action:halt``).

Each is sent once: a finding again only when it became more severe (a warning that turned critical), an event once
per step and name (again if the log's hindsight raised its severity). A judgement with something new is one
message; the sender's rate limit (``min_interval_s``) combines the messages in between into one request and loses
none. There is no W&B alert (this process has no W&B run), so the config must name ``webhook_env``, and the variable
must be set: a watch asked to alert that cannot is refused at its start, not silent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlguard.guards.alerts.config import AlertConfig, alert_config, styled_title, webhook_payload
from rlguard.guards.alerts.sender import AlertSender, Message, post_json
from rlguard.guards.alerts.urls import redacted
from rlguard.guards.events import SEVERITY_LEVEL, Event

if TYPE_CHECKING:
    from rlguard.doctor.diagnose import Diagnosis, DoctorFinding
    from rlguard.doctor.events_only import EventsOnly

__all__ = ["LogAlerts", "log_alert", "log_alerts", "parse_alert_spec"]


def parse_alert_spec(spec: str, option: str = "--alerts") -> AlertConfig:
    """``--alerts SPEC``: a JSON object of :class:`AlertConfig`'s fields, or the path of a ``.json`` file holding
    one; ``ValueError`` naming ``option`` and the fix otherwise."""
    text = spec
    if not spec.lstrip().startswith("{"):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(
                f"{option}: expected a JSON object of AlertConfig's fields (e.g. "
                '\'{"webhook_env": "SLACK_WEBHOOK_URL", "format": "slack"}\') or a .json file holding one; '
                f"{spec!r} is neither (no such file)"
            )
        text = path.read_text(encoding="utf-8")
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{option}: not valid JSON ({err})") from None
    if not isinstance(fields, Mapping):
        raise ValueError(f"{option}: expected a JSON object of AlertConfig's fields; got {type(fields).__name__}")
    config = alert_config(fields)
    assert config is not None
    return config


def _chosen(detector: str, severity: str, config: AlertConfig) -> bool:
    """Whether an event or finding of ``detector`` at ``severity`` raises an alert under ``config``."""
    action = detector.removeprefix("action:") if detector.startswith("action:") else None
    return (
        SEVERITY_LEVEL.get(severity, 0) >= SEVERITY_LEVEL[config.min_severity]
        or any(fnmatchcase(detector, p) for p in config.events)
        or action in config.outcomes
    )


def log_alert(
    step: int, findings: list[DoctorFinding], events: list[Event], config: AlertConfig, source: str
) -> Message:
    """The alert for new ``findings`` and live ``events`` of a log judged up to ``step``, naming the run by
    ``config.run_name`` or else ``source`` (the path watched)."""
    run = config.run_name or source
    items: list[DoctorFinding | Event] = [*findings, *events]
    critical = any(x.severity == "critical" for x in items)
    severity = "critical" if critical else "warn"
    halted = any(e.detector == "action:halt" for e in events)
    what = "the guard halted the run" if halted else f"{len(items)} new {severity} item(s)"
    title = f"rlguard: {run}, step {step}: {what}"
    lines = [styled_title(config.format, title)]
    lines += [f"- [{f.severity}] {f.detector} from step {f.step}: {f.message}" for f in findings]
    lines += [f"- [{e.severity}] guard event at step {e.step}, {e.detector}: {e.message}" for e in events]
    record = {
        "title": title,
        "run": run,
        "step": step,
        "outcome": "halt" if halted else "finding",
        "severity": severity,
        "reason": "; ".join(sorted({x.detector for x in items})),
        "findings": [f.to_dict() for f in findings],
        "events": [e.to_dict() for e in events],
        "record_only": [],
    }
    return "\n".join(lines), severity, record


@dataclass
class LogAlerts:
    """Alerts for one log, judged again and again (:func:`log_alerts` builds it; module docstring).

    Attributes:
        config: what raises an alert and where it goes.
        source: how the messages name the run when ``config.run_name`` is empty.
        sender: the delivery (off this thread, rate-limited, with a total deadline per request).
        url: the webhook's URL (a secret: shown only as :func:`~rlguard.guards.alerts.urls.redacted`).
        messages: the alerts queued so far.
    """

    config: AlertConfig
    source: str
    sender: AlertSender
    url: str
    messages: list[Message] = field(default_factory=list)
    _sent: dict[tuple[Any, ...], int] = field(default_factory=dict)

    def observe(self, d: Diagnosis) -> Message | None:
        """Queue the alert of what in ``d`` is new and raises one (module docstring); the message, or None."""
        return self._observe(d.steps[-1], d.findings, d.live_events)

    def observe_events(self, found: EventsOnly) -> Message | None:
        """:meth:`observe` for a run folder with events and no training log (the events as recorded)."""
        return self._observe(max(e.step for e in found.events), [], found.events)

    def _observe(self, step: int, findings: list[DoctorFinding], events: list[Event]) -> Message | None:
        findings = [f for f in findings if self._new(("finding", f.detector), f.detector, f.severity)]
        events = [e for e in events if self._new(("event", e.step, e.detector), e.detector, e.severity)]
        if not findings and not events:
            return None
        message = log_alert(step, findings, events, self.config, self.source)
        self.messages.append(message)
        self.sender.send(message)
        return message

    def _new(self, key: tuple[Any, ...], detector: str, severity: str) -> bool:
        level = SEVERITY_LEVEL.get(severity, 0)
        if not _chosen(detector, severity, self.config) or self._sent.get(key, 0) >= level:
            return False
        self._sent[key] = level
        return True

    def close(self) -> str:
        """Send what is queued (waiting up to the request's timeout and a second) and stop the sender; one line
        saying what was sent, to the webhook named by scheme and host."""
        delivered = self.sender.flush(self.config.timeout_s + 1.0)
        self.sender.close()
        where = redacted(self.url)
        if not self.messages:
            return f"alerts: nothing to send to {where}"
        failed = "" if not self.sender.failures else f", {self.sender.failures} failed (warned above)"
        unsent = "" if delivered else "; some still unsent when the watch gave up waiting"
        return f"alerts: {len(self.messages)} alert(s) in {self.sender.sent} request(s) to {where}{failed}{unsent}"


def log_alerts(config: AlertConfig, source: str, *, post: Callable[..., None] = post_json) -> LogAlerts:
    """The alerts of ``config`` for a log named ``source``; ``ValueError`` naming the field or variable when they
    could send nothing (no ``webhook_env``, or its variable unset: the watch has no W&B run)."""
    if config.webhook_env is None:
        raise ValueError(
            "alerts: the watch and the doctor send to a webhook only (they have no W&B run): set webhook_env to "
            "the name of the environment variable holding its URL."
        )
    url = config.webhook_url() if os.environ.get(config.webhook_env, "").strip() else None
    if url is None:
        raise ValueError(
            f"alerts: the environment variable {config.webhook_env} (webhook_env) is not set; export the webhook's "
            "URL in it."
        )
    sender = AlertSender(
        url=url,
        headers=config.headers(),
        make_payload=lambda batch, dropped: webhook_payload(config.format, batch, dropped),
        wandb=False,
        min_interval_s=config.min_interval_s,
        timeout_s=config.timeout_s,
        queue_size=config.queue_size,
        post=post,
    )
    return LogAlerts(config, source, sender, url)
