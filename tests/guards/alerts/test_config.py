"""Alert configuration (``AlertConfig``): the webhook's URL stays in the environment, never in the config; bad
fields are refused; TRL's ``--guard`` JSON and verl's ``trainer.rlguard_guard`` carry the alerts."""

from __future__ import annotations

import os

import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.alerts import AlertConfig

ENV = "RLGUARD_TEST_WEBHOOK"


def test_the_url_stays_out_of_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "https://hooks.slack.com/services/T0/B0/SECRET")
    config = GuardConfig.preset("strict", alerts={"webhook_env": ENV, "format": "slack"})
    assert isinstance(config.alerts, AlertConfig) and config.snapshot_interval == 5  # strict, with alerts
    assert "SECRET" not in repr(config) and config.alerts.webhook_url() == os.environ[ENV]
    with pytest.raises(ValueError, match="NAME of an environment variable"):
        AlertConfig(webhook_env="https://hooks.slack.com/services/T0/B0/SECRET")
    monkeypatch.setenv(ENV, "file:///etc/passwd")
    with pytest.raises(ValueError, match="must start with http:// or https://") as err:
        Guard(GuardConfig(alerts=AlertConfig(webhook_env=ENV)))
    assert "passwd" not in str(err.value)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['url'\]"):
        GuardConfig(alerts={"url": "https://example.org"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alerts go nowhere"):
        AlertConfig(wandb=False)
    with pytest.raises(
        ValueError, match=r"alerts\.format: expected one of 'slack', 'discord', 'json'; got str 'teams'"
    ):
        AlertConfig(webhook_env=ENV, format="teams")  # type: ignore[arg-type]


def test_trl_guard_json_and_verl_config_carry_alerts() -> None:
    pytest.importorskip("trl")
    from omegaconf import OmegaConf

    from rlguard.adapters.trl.config import parse_guard_flag as trl_spec
    from rlguard.adapters.verl.settings import resolve_guard_setting as verl_spec

    spec = '{"preset": "strict", "alerts": {"webhook_env": "SLACK_WEBHOOK_URL", "format": "slack"}}'
    trl = trl_spec(spec)
    assert isinstance(trl, GuardConfig) and trl.alerts == AlertConfig(webhook_env="SLACK_WEBHOOK_URL", format="slack")
    verl = verl_spec(OmegaConf.create({"preset": "strict", "alerts": {"webhook_env": "SLACK_WEBHOOK_URL"}}))
    assert isinstance(verl, GuardConfig) and verl.snapshot_interval == 5
    assert verl.alerts == AlertConfig(webhook_env="SLACK_WEBHOOK_URL")
    with pytest.raises(ValueError, match=r"trainer\.rlguard_guard: .*'alert'"):
        verl_spec(OmegaConf.create({"preset": "strict", "alert": {}}))
