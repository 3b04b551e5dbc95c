"""Guard configuration from JSON, YAML and the command line is type-checked strictly (``rlguard.guards.fields``):
a string is not a boolean or a number, unknown fields are refused, and the error names the field and what it takes.
The same check serves every entry point: ``GuardConfig``, ``GuardConfig.from_mapping``, detector and intervention
overrides, ``AlertConfig``, TRL's ``--guard`` and verl's ``trainer.rlguard_guard``."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.alerts import AlertConfig
from rlguard.guards.fields import FieldError, check_fields, check_value
from rlguard.guards.registry import detector_registry, intervention_registry

BAD = [
    ({"observe_only": "false"}, r"guard\.observe_only: expected true or false \(a boolean\); got str 'false'"),
    ({"observe_only": 0}, r"guard\.observe_only: expected true or false .*got int 0"),
    ({"snapshot_interval": "5"}, r"guard\.snapshot_interval: expected an integer; got str '5'"),
    ({"snapshot_interval": 2.5}, r"guard\.snapshot_interval: expected an integer; got float 2\.5"),
    ({"snapshot_interval": True}, r"guard\.snapshot_interval: expected an integer; got bool True"),
    ({"snapshot_budget": "0.5"}, r"guard\.snapshot_budget: expected a number or null \(None\); got str"),
    ({"events_path": 3}, r"guard\.events_path: expected a string or null"),
    ({"healthy_despite": "mismatch_growth"}, r"guard\.healthy_despite: expected a list of a string"),
    ({"healthy_despite": ["ok", 1]}, r"guard\.healthy_despite\[1\]: expected a string; got int 1"),
    ({"detectors": {"grad_norm_spike": "off"}}, r"guard\.detectors\['grad_norm_spike'\]: expected a mapping"),
    ({"alerts": {"wandb": "yes"}}, r"guard\.alerts\.wandb: expected true or false"),
    ({"alerts": {"min_severity": "loud"}}, r"guard\.alerts\.min_severity: expected one of 'warn', 'critical'"),
    ({"alerts": {"min_interval_s": "30"}}, r"guard\.alerts\.min_interval_s: expected a number; got str '30'"),
    ({"alerts": {"url": "x"}}, r"guard\.alerts: unknown field\(s\) \['url'\]; accepted: \[.*'webhook_env'"),
    ({"snapshot": 3}, r"guard: unknown GuardConfig field\(s\) \['snapshot'\]; accepted: 'preset' and \["),
    ({"schedules": {}}, r"unknown GuardConfig field\(s\) \['schedules'\].*schedules only from Python"),
    ({"preset": 1}, r"guard\.preset: expected a string; got int 1"),
]


@pytest.mark.parametrize(("spec", "match"), BAD)
def test_a_mapping_of_the_wrong_types_is_refused_naming_the_field(spec: dict[str, Any], match: str) -> None:
    with pytest.raises(FieldError, match=match):
        GuardConfig.from_mapping(spec)


def test_a_well_typed_mapping_is_the_preset_changed() -> None:
    config = GuardConfig.from_mapping(
        {"preset": "strict", "observe_only": False, "snapshot_budget": 1, "healthy_despite": ["nonfinite"]}
    )
    assert config == GuardConfig.preset("strict", snapshot_budget=1, healthy_despite=("nonfinite",))
    assert config.healthy_despite == ("nonfinite",)  # a JSON list becomes the tuple the field holds


def test_python_construction_is_checked_too() -> None:
    with pytest.raises(FieldError, match=r"GuardConfig\.observe_only: expected true or false"):
        GuardConfig(observe_only="false")  # type: ignore[arg-type]
    with pytest.raises(FieldError, match=r"alerts\.format: expected one of 'slack', 'discord', 'json'"):
        AlertConfig(webhook_env="X", format="teams")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"detectors": {"grad_norm_spike": {"warn_factor": "5"}}}, r"detectors\['grad_norm_spike'\]\.warn_factor"),
        ({"detectors": {"grad_norm_spike": {"warmup": 2.0}}}, r"\.warmup: expected an integer; got float 2\.0"),
        ({"interventions": {"skip_step": {"severity": "high"}}}, r"skip_step'\]\.severity: expected one of 'warn'"),
        ({"interventions": {"rollback": {"on": "nonfinite"}}}, r"rollback'\]\.on: expected a list of a string"),
        (
            {"interventions": {"trust_region": {"limits": [["update_ratio", "0.02", 1]]}}},
            r"trust_region'\]\.limits\[0\]\[1\]: expected a number; got str '0\.02'",
        ),
    ],
)
def test_detector_and_intervention_overrides_are_checked_against_their_fields(
    overrides: dict[str, Any], match: str
) -> None:
    with pytest.raises(FieldError, match=match):
        Guard(GuardConfig.from_mapping(overrides))


def test_json_lists_for_tuple_fields_build_the_same_guard() -> None:
    spec = {"interventions": {"trust_region": {"limits": [["update_ratio", 0.02, 1]]}, "rollback": {"on": ["x"]}}}
    guard = Guard(GuardConfig.from_mapping(spec))
    assert guard.interventions["trust_region"].limits == (("update_ratio", 0.02, 1),)  # type: ignore[attr-defined]
    assert guard.interventions["rollback"].on == ("x",)  # type: ignore[attr-defined]


@pytest.mark.parametrize("registry", [detector_registry, intervention_registry])
def test_every_registered_class_has_fields_the_check_knows(registry: Any) -> None:
    """The defaults of every detector and intervention pass their own check (no field type it cannot read)."""
    for name, cls in registry().items():
        fields = [f for f in dataclasses.fields(cls) if f.init and f.default is not dataclasses.MISSING]
        defaults = {f.name: f.default for f in fields}
        assert check_fields(cls, defaults, where=name).keys() == defaults.keys(), name


def test_check_value_by_type() -> None:
    assert check_value(float, 3, "x") == 3  # an integer is a number
    assert check_value(tuple[str, ...], ["a"], "x") == ("a",)
    assert check_value(Literal["a", "b"], "b", "x") == "b"
    with pytest.raises(FieldError, match=r"x: expected one of 'a', 'b'; got str 'c'"):
        check_value(Literal["a", "b"], "c", "x")
    with pytest.raises(FieldError, match=r"x: expected a number; got bool True"):
        check_value(float, True, "x")


def test_trl_guard_json_refuses_a_string_boolean() -> None:
    pytest.importorskip("trl")
    from rlguard.adapters.trl.config import parse_guard_flag

    with pytest.raises(FieldError, match=r"guard\.observe_only: expected true or false \(a boolean\); got str"):
        parse_guard_flag('{"observe_only": "false"}')
    config = parse_guard_flag('{"observe_only": false}')
    assert isinstance(config, GuardConfig) and config.observe_only is False


def test_verl_guard_mapping_refuses_a_string_boolean() -> None:
    pytest.importorskip("verl")
    from omegaconf import OmegaConf

    from rlguard.adapters.verl.settings import resolve_guard_setting

    spec = OmegaConf.create({"preset": "strict", "observe_only": "false"})
    with pytest.raises(FieldError, match=r"trainer\.rlguard_guard\.observe_only: expected true or false"):
        resolve_guard_setting(spec)
    with pytest.raises(FieldError, match=r"trainer\.rlguard_guard: unknown GuardConfig field\(s\) \['observe'\]"):
        resolve_guard_setting(OmegaConf.create({"observe": True}))
    config = resolve_guard_setting(OmegaConf.create({"preset": "strict", "observe_only": True}))
    assert isinstance(config, GuardConfig) and config.observe_only and config.snapshot_interval == 5
