"""Alerts: a guard's important decisions sent to a team's chat and to W&B (:mod:`.config`: what is sent and how
it is configured; :mod:`.sender`: delivery off the training thread)."""

from __future__ import annotations

from rlguard.guards.alerts.config import (
    AlertConfig,
    AlertPlugin,
    alert_config,
    alert_message,
    alert_plugin,
    webhook_payload,
)
from rlguard.guards.alerts.sender import AlertSender, Message

__all__ = [
    "AlertConfig",
    "AlertPlugin",
    "AlertSender",
    "Message",
    "alert_config",
    "alert_message",
    "alert_plugin",
    "webhook_payload",
]
