"""Alerts: the guard's important decisions sent to a team's chat (a Slack or Discord webhook, or any endpoint taking
JSON) and to the active W&B run (``wandb.run.alert``), from the ``rlguard_on_decision`` hook.

Configured by ``GuardConfig(alerts=AlertConfig(...))``, TRL's ``--guard '{"alerts": {...}}'`` or verl's
``+trainer.rlguard_guard='{alerts: {...}}'``. The webhook's URL is read from the environment variable the config names
(``webhook_env``), so that it never lands in a config file, a log or a checkpoint; so are the values of any request
headers the endpoint needs (``headers_env``: a bearer token). ``rlguard watch --alerts`` and ``rlguard doctor --alerts``
send a log's findings and a job's recorded events with the same config (:mod:`rlguard.doctor.alerts`). What is sent, one
message per decision of rank 0 (the decision is the same on every rank):

- every event at or above ``min_severity`` (``critical`` by default: critical alarms, skips, rollbacks, halts);
- every event whose name matches one of ``events`` (glob patterns; by default rollbacks, halts and remedy switches,
  ``action:remedy*``), whatever its severity;
- every decision whose outcome, as carried out, is one of ``outcomes`` (``rollback``, ``halt``).

Each guard built with alerts holds one plugin (:class:`AlertPlugin`) in its own plugin manager, beside the
process's third-party plugins, so it sees that guard's decisions only (``Guard.hook``). Delivery is
:class:`~rlguard.guards.alerts.sender.AlertSender`: off the training thread, rate-limited, with a timeout.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
import sys
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from rlguard.guards.alerts.sender import AlertSender, Message
from rlguard.guards.alerts.urls import check_env_name, check_header, check_webhook_url
from rlguard.guards.events import SEVERITY_LEVEL
from rlguard.guards.fields import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, check_fields
from rlguard.hookspecs import hookimpl

if TYPE_CHECKING:
    from rlguard.guards.actuation.contract import Applied
    from rlguard.guards.decision import Decision
    from rlguard.guards.guard import Guard

__all__ = [
    "AlertConfig",
    "AlertPlugin",
    "alert_config",
    "alert_message",
    "alert_plugin",
    "styled_title",
    "webhook_payload",
]

logger = logging.getLogger("rlguard.alerts")

PayloadFormat = Literal["slack", "discord", "json"]
#: Discord refuses a message ``content`` over 2,000 characters
_DISCORD_LIMIT = 2000


@dataclass(frozen=True)
class AlertConfig:
    """Where the guard's alerts go and which decisions raise one (module docstring).

    Attributes:
        webhook_env: name of the environment variable holding the webhook URL (http or https). The URL itself is
            never part of the config. None: no webhook (W&B only).
        headers_env: request headers the webhook needs, each header's name mapped to the NAME of the environment
            variable holding its value (``{"Authorization": "ALERT_AUTH"}`` with ``ALERT_AUTH="Bearer ..."``): the
            values, secrets, are never part of the config nor shown in a message. Where the webhook's variable is
            set, each of these must be set too.
        format: the webhook's payload: ``slack`` (``{"text": ...}``, also Mattermost's and Rocket.Chat's
            incoming webhooks), ``discord`` (``{"content": ...}``) or ``json`` (the alerts as records, ``text``
            included).
        min_severity: events at or above this severity (``warn`` or ``critical``) raise an alert.
        events: glob patterns of event names (``action:rollback``, ``kl_ref_blowup``) that raise an alert whatever
            their severity.
        outcomes: decision outcomes, as carried out (``skip``, ``rollback``, ``halt``), that raise an alert.
        wandb: also call ``wandb.run.alert`` when the training process has a W&B run.
        run_name: shown in every message (e.g. the output folder or the experiment's name).
        min_interval_s: at most one request per this many seconds; alerts in between are combined into the next.
        timeout_s: timeout of one request.
        queue_size: alerts waiting to be sent at most; beyond that they are dropped and counted.
    """

    webhook_env: str | None = None
    headers_env: dict[str, str] = field(default_factory=dict)
    format: PayloadFormat = "json"
    min_severity: Literal["warn", "critical"] = "critical"
    events: tuple[str, ...] = ("action:rollback", "action:halt", "action:remedy*")
    outcomes: tuple[str, ...] = ("rollback", "halt")
    wandb: bool = True
    run_name: str = ""
    min_interval_s: float = 30.0
    timeout_s: float = 5.0
    queue_size: int = 64

    #: a request needs time (a timeout of 0 would make the socket non-blocking); the queue holds one alert at least
    field_ranges: ClassVar[dict[str, Range]] = {
        "min_interval_s": NON_NEGATIVE,
        "timeout_s": POSITIVE,
        "queue_size": AT_LEAST_ONE,
    }

    def __post_init__(self) -> None:
        # the field types, strictly (lists given for events and outcomes become tuples)
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in check_fields(AlertConfig, given, where="alerts").items():
            object.__setattr__(self, name, value)
        bad = sorted(set(self.outcomes) - {"step", "skip", "rollback", "halt"})
        if bad:
            raise ValueError(f"alerts.outcomes may hold 'step', 'skip', 'rollback', 'halt'; got {bad}.")
        if self.webhook_env is None and not self.wandb:
            raise ValueError("alerts go nowhere: set alerts.webhook_env (an environment variable name) or wandb=True.")
        if self.webhook_env is not None and (not self.webhook_env or "://" in self.webhook_env):
            raise ValueError(
                "alerts.webhook_env is the NAME of an environment variable holding the webhook URL (e.g. "
                "'RLGUARD_ALERT_WEBHOOK'), so that the URL stays out of configs and logs; got "
                + ("a URL" if "://" in self.webhook_env else repr(self.webhook_env))
                + "."
            )
        for name, env in self.headers_env.items():
            check_env_name(env, f"alerts.headers_env[{name!r}]")
        if self.webhook_env is not None and os.environ.get(self.webhook_env, "").strip():
            self.webhook_url()  # a malformed URL is an error here, not a warning at the first alert
            self.headers()  # so is a header whose variable is missing on the machine that sends

    def __hash__(self) -> int:  # headers_env is a dict: hashed by its items
        values = tuple(getattr(self, f.name) for f in dataclasses.fields(self))
        return hash(tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v for v in values))

    def webhook_url(self) -> str | None:
        """The URL from ``webhook_env``; None (with a warning) when the variable is unset or empty. A URL that is
        not a well-formed http(s) URL with a host raises ``ValueError`` naming the variable (never echoing the
        URL's path: it is a secret)."""
        if self.webhook_env is None:
            return None
        url = os.environ.get(self.webhook_env, "").strip()
        if not url:
            logger.warning(
                "rlguard alerts: environment variable %s (alerts.webhook_env) is not set: no webhook alerts",
                self.webhook_env,
            )
            return None
        return check_webhook_url(url, self.webhook_env)

    def headers(self) -> dict[str, str]:
        """Header name -> value, the values read from the variables ``headers_env`` names; ``ValueError`` naming
        the variable (never its value) when one is unset or empty, or holds a line break."""
        out = {}
        for name, env in self.headers_env.items():
            value = os.environ.get(env, "").strip()
            if not value:
                raise ValueError(
                    f"alerts.headers_env: the environment variable {env} (the value of header {name}) is not set; "
                    f"export it where the alerts are sent from, or drop {name!r} from headers_env."
                )
            out[name] = check_header(name, value, env)
        return out


def alert_config(spec: AlertConfig | Mapping[str, Any] | None) -> AlertConfig | None:
    """``GuardConfig.alerts`` as given (an ``AlertConfig``, a mapping of its fields from JSON or YAML, or None)."""
    if spec is None or isinstance(spec, AlertConfig):
        return spec
    if not isinstance(spec, Mapping):
        raise ValueError(f"alerts must be an AlertConfig or a mapping of its fields; got {spec!r}.")
    return AlertConfig(**check_fields(AlertConfig, spec, where="alerts"))


def alert_message(decision: Decision, applied: Applied, config: AlertConfig) -> Message | None:
    """The alert for ``decision`` as carried out (``applied``), or None when nothing in it calls for one."""
    floor = SEVERITY_LEVEL[config.min_severity]
    chosen = [
        e
        for e in decision.events
        if SEVERITY_LEVEL.get(e.severity, 0) >= floor or any(fnmatch.fnmatchcase(e.detector, p) for p in config.events)
    ]
    outcome = applied.outcome
    if not chosen and outcome not in config.outcomes:
        return None
    events = chosen or list(decision.events)
    critical = outcome in ("rollback", "halt") or any(e.severity == "critical" for e in events)
    severity = "critical" if critical else "warn"
    run = f" {config.run_name}" if config.run_name else ""
    title = f"rlguard{run}: step {decision.step}, {outcome}"
    lines = [styled_title(config.format, title)]
    if decision.reason:
        lines.append(f"reason: {decision.reason}")
    lines += [f"- [{e.severity}] {e.detector}: {e.message}" for e in events]
    if applied.record_only:
        lines.append(f"recorded only (this training loop cannot): {', '.join(applied.record_only)}")
    record = {
        "title": title,
        "run": config.run_name,
        "step": decision.step,
        "outcome": outcome,
        "severity": severity,
        "reason": decision.reason,
        "events": [e.to_dict() for e in events],
        "record_only": list(applied.record_only),
    }
    return "\n".join(lines), severity, record


def styled_title(fmt: PayloadFormat, title: str) -> str:
    """A message's first line in bold where format ``fmt`` has bold (Slack's ``*...*``, Discord's ``**...**``)."""
    return f"*{title}*" if fmt == "slack" else f"**{title}**" if fmt == "discord" else title


def webhook_payload(fmt: PayloadFormat, batch: Sequence[Message], dropped: int) -> dict[str, Any]:
    """The request body for ``batch`` (alerts combined by the rate limit) in format ``fmt``; ``dropped`` alerts
    the full queue refused are counted in it.

    Text read from a run (metric names, ``events.jsonl``) cannot page a channel: for Slack, ``&``, ``<`` and ``>``
    are escaped as its message-formatting reference asks, so ``<!channel>`` or ``<@U123>`` arrive as text; for
    Discord, ``allowed_mentions`` with no type to parse, so ``@everyone`` and user or role mentions notify nobody."""
    text = "\n\n".join(t for t, _, _ in batch)
    if dropped:
        text += f"\n\n({dropped} more alert(s) dropped: the endpoint was too slow)"
    if fmt == "slack":
        return {"text": text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")}
    if fmt == "discord":
        content = text if len(text) <= _DISCORD_LIMIT else text[: _DISCORD_LIMIT - 1] + "…"
        return {"content": content, "allowed_mentions": {"parse": []}}
    return {"source": "rlguard", "text": text, "alerts": [r for _, _, r in batch], "dropped": dropped}


def _rank() -> int:
    """This process's global rank: ``torch.distributed``'s once initialised (never imported here), else ``RANK``."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0") or 0)


class AlertPlugin:
    """The ``rlguard_on_decision`` hook of one guard's alerts (built by :func:`alert_plugin`), registered in that
    guard's own plugin manager only: every decision it sees is its guard's."""

    def __init__(self, config: AlertConfig, sender: AlertSender) -> None:
        self.config = config
        self.sender = sender

    @hookimpl
    def rlguard_on_decision(self, decision: Decision, applied: Applied) -> None:
        """Queue the alert of ``decision`` if it calls for one (on rank 0 only)."""
        if _rank() != 0:
            return
        message = alert_message(decision, applied, self.config)
        if message is not None:
            self.sender.send(message)


def alert_plugin(guard: Guard) -> AlertPlugin | None:
    """The alerts of ``guard.config.alerts`` as a plugin for that guard's manager, its sender closed when ``guard``
    is collected; None without alerts."""
    config = guard.config.alerts
    if config is None:
        return None
    url = config.webhook_url()
    sender = AlertSender(
        url=url,
        headers=config.headers() if url is not None else {},
        make_payload=lambda batch, dropped: webhook_payload(config.format, batch, dropped),
        wandb=config.wandb,
        min_interval_s=config.min_interval_s,
        timeout_s=config.timeout_s,
        queue_size=config.queue_size,
    )
    weakref.finalize(guard, sender.close)
    return AlertPlugin(config, sender)
