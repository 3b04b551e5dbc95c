"""Numbers in a guard's configuration are checked for finiteness, sign and range at every entry: Python, JSON
(TRL's ``--guard``), YAML and verl's ``+trainer.rlguard_guard``; the error names the field, the value and the
accepted range (``rlguard.guards.fields``: each class's ``field_ranges``)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type information

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.alerts import AlertConfig
from rlguard.guards.fields import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, FieldError, Range

NAN, INF = float("nan"), float("inf")


def _python(spec: dict[str, Any]) -> GuardConfig:
    return GuardConfig(**spec)


def _json(spec: dict[str, Any]) -> GuardConfig:
    """As TRL's ``--guard '{...}'`` gives it (Python's json reads NaN and Infinity)."""
    from rlguard.adapters.trl.config import parse_guard_flag

    config = parse_guard_flag(json.dumps(spec))
    assert isinstance(config, GuardConfig)
    return config


def _yaml(spec: dict[str, Any]) -> GuardConfig:
    """A YAML file's mapping (``.nan``, ``-.inf``), as ``GuardConfig.from_mapping`` reads it."""
    text = yaml.safe_dump(spec)
    return GuardConfig.from_mapping(yaml.safe_load(text))


def _verl(spec: dict[str, Any]) -> GuardConfig:
    from omegaconf import OmegaConf

    from rlguard.adapters.verl.settings import resolve_guard_setting

    config = resolve_guard_setting(OmegaConf.create(spec))
    assert isinstance(config, GuardConfig)
    return config


ENTRIES: dict[str, Callable[[dict[str, Any]], GuardConfig]] = {
    "python": _python,
    "json": _json,
    "yaml": _yaml,
    "verl": _verl,
}

BAD: list[tuple[dict[str, Any], str, str]] = [
    # (the config, the field as the error names it, the accepted range)
    ({"detectors": {"kl_ref_blowup": {"critical_above": NAN}}}, "kl_ref_blowup'].critical_above", ">= 0"),
    ({"detectors": {"kl_ref_blowup": {"critical_above": -1.0}}}, "kl_ref_blowup'].critical_above", ">= 0"),
    ({"detectors": {"kl_ref_blowup": {"warn_above": INF}}}, "kl_ref_blowup'].warn_above", "a finite number"),
    ({"detectors": {"grad_norm_spike": {"critical_factor": -INF}}}, "critical_factor", ">= 0"),
    ({"detectors": {"entropy_collapse": {"patience": 0}}}, "entropy_collapse'].patience", "an integer >= 1"),
    ({"detectors": {"length_explosion": {"min_sigma": 0.0}}}, "length_explosion'].min_sigma", "> 0"),
    ({"detectors": {"grad_norm_spike": {"window": 2**60}}}, "grad_norm_spike'].window", "at most 2**53"),
    ({"interventions": {"halt": {"critical_steps": -1}}}, "halt'].critical_steps", "an integer >= 0"),
    ({"interventions": {"lr_backoff": {"factor": NAN}}}, "lr_backoff'].factor", ">= 0"),
    ({"snapshot_interval": 0}, "snapshot_interval", "an integer >= 1"),
    ({"snapshot_budget": NAN}, "snapshot_budget", "> 0 and <= 1"),
    ({"snapshot_budget": 1.5}, "snapshot_budget", "> 0 and <= 1"),
    ({"alerts": {"webhook_env": "X_HOOK", "timeout_s": 0}}, "alerts.timeout_s", "> 0"),
    ({"alerts": {"webhook_env": "X_HOOK", "min_interval_s": NAN}}, "alerts.min_interval_s", ">= 0"),
    ({"alerts": {"webhook_env": "X_HOOK", "queue_size": 0}}, "alerts.queue_size", "an integer >= 1"),
]


def _skip_unavailable(entry: str) -> None:
    if entry == "json":
        pytest.importorskip("trl")
    if entry == "verl":
        pytest.importorskip("omegaconf")


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize(("spec", "field", "accepted"), BAD, ids=[f"{b[1]}={i}" for i, b in enumerate(BAD)])
def test_a_number_out_of_range_is_refused_at_every_entry(
    entry: str, spec: dict[str, Any], field: str, accepted: str
) -> None:
    _skip_unavailable(entry)
    if entry == "verl" and any(isinstance(v, int) and v > 2**31 for v in _numbers(spec)):
        pytest.skip("OmegaConf itself refuses integers beyond 32 bits")
    with pytest.raises(ValueError, match="expected") as err:
        Guard(ENTRIES[entry](spec))  # detectors and interventions are built, and checked, with the guard
    message = str(err.value)
    assert field in message and accepted in message, message
    assert "got" in message  # the value received


def _numbers(spec: Any) -> list[Any]:
    if isinstance(spec, dict):
        return [n for v in spec.values() for n in _numbers(v)]
    return [spec]


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_numbers_in_range_still_build(entry: str) -> None:
    _skip_unavailable(entry)
    config = ENTRIES[entry](
        {
            "detectors": {"kl_ref_blowup": {"critical_above": 0.0, "warn_above": None}},
            "interventions": {"halt": {"critical_steps": 0}},
            "snapshot_budget": 1.0,
        }
    )
    guard = Guard(config)
    assert guard.detectors["kl_ref_blowup"].critical_above == 0.0  # type: ignore[attr-defined]


def test_a_nan_bound_no_longer_switches_a_detector_off() -> None:
    """Before: NaN was accepted, and ``value >= NaN`` is never true, so the bound never fired."""
    with pytest.raises(FieldError, match=r"critical_above: expected a finite number >= 0; got float nan"):
        Guard(GuardConfig(detectors={"kl_ref_blowup": {"critical_above": NAN}}))


def test_a_negative_bound_would_have_halted_a_healthy_run() -> None:
    with pytest.raises(FieldError, match=r"critical_above: expected a finite number >= 0; got int -1"):
        Guard(GuardConfig.from_mapping({"detectors": {"kl_ref_blowup": {"critical_above": -1}}}))


def test_alert_config_from_python_is_checked_too() -> None:
    with pytest.raises(FieldError, match=r"alerts\.timeout_s: expected a finite number > 0; got float inf"):
        AlertConfig(webhook_env="X_HOOK", timeout_s=INF)


@pytest.mark.parametrize(
    ("allowed", "inside", "outside", "words"),
    [
        (NON_NEGATIVE, [0.0, 1e300], [-1e-300, NAN, INF], "a finite number >= 0"),
        (POSITIVE, [1e-300], [0.0, NAN], "a finite number > 0"),
        (AT_LEAST_ONE, [1.0, 7.0], [0.5, -INF], "a finite number >= 1"),
        (Range(-1.0, 1.0), [-1.0, 1.0], [1.01, NAN], "a finite number >= -1 and <= 1"),
        (Range(0.0, infinite=True), [INF, 0.0], [-INF, NAN], "a number >= 0"),
        (Range(), [-1e300, 0.0], [NAN, INF, -INF], "a finite number"),
    ],
)
def test_range_admits_and_says_what_it_accepts(
    allowed: Range, inside: list[float], outside: list[float], words: str
) -> None:
    assert all(allowed.admits(x) for x in inside) and not any(allowed.admits(x) for x in outside)
    assert str(allowed) == words
    assert math.isnan(NAN)


#: the rows of BAD that set a detector's or an intervention's field: the guard builds those, so an entry that only
#: read the config would let them through until the model was loaded
MEMBERS = [b for b in BAD if "detectors" in b[0] or "interventions" in b[0]]


@pytest.mark.parametrize("entry", ["json", "verl"])
@pytest.mark.parametrize(("spec", "field", "accepted"), MEMBERS, ids=[f"{b[1]}={i}" for i, b in enumerate(MEMBERS)])
def test_a_bad_detector_or_intervention_number_is_refused_where_the_config_is_read(
    entry: str, spec: dict[str, Any], field: str, accepted: str
) -> None:
    """TRL's ``--guard`` and verl's ``+trainer.rlguard_guard`` refuse it when the config is parsed, before a trainer
    (and its model) exists, naming the key the user wrote."""
    _skip_unavailable(entry)
    if entry == "verl" and any(isinstance(v, int) and v > 2**31 for v in _numbers(spec)):
        pytest.skip("OmegaConf itself refuses integers beyond 32 bits")
    with pytest.raises(ValueError, match="expected") as err:
        ENTRIES[entry](spec)  # no Guard built
    message = str(err.value)
    where = "guard." if entry == "json" else "trainer.rlguard_guard."
    assert message.startswith(where) and field in message and accepted in message, message


def test_guarded_grpo_config_refuses_a_nan_threshold_when_it_is_constructed() -> None:
    """``GuardedGRPOConfig(guard=...)`` (a mapping, as YAML gives it, or a ``GuardConfig``) refuses in its
    ``__post_init__``, before ``GuardedGRPOTrainer`` loads the model; a good one still builds."""
    pytest.importorskip("trl")
    from rlguard.adapters.trl import GuardedGRPOConfig

    common: dict[str, Any] = {"output_dir": "unused", "use_cpu": True, "bf16": False, "report_to": "none"}
    bad = {"detectors": {"kl_ref_blowup": {"critical_above": NAN}}}
    for guard in (bad, GuardConfig(**bad)):  # type: ignore[arg-type]
        with pytest.raises(FieldError, match=r"^guard\.detectors\['kl_ref_blowup'\]\.critical_above: expected"):
            GuardedGRPOConfig(**common, guard=guard)
    ok = GuardedGRPOConfig(**common, guard={"detectors": {"kl_ref_blowup": {"critical_above": 2.0}}})
    assert isinstance(ok.guard, GuardConfig)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")  # verl and ray, imported
@pytest.mark.parametrize("entry", ["main_ppo", "fully_async_main"])
def test_verls_entries_refuse_a_bad_threshold_before_starting_ray(entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m rlguard.adapters.verl.main_ppo ... +trainer.rlguard_guard='{...}'`` (and ``fully_async_main``):
    refused in ``main``, before ``run_ppo`` starts Ray and the task runner (which built the guard, after the
    tokenizer and the datasets)."""
    pytest.importorskip("verl")
    import importlib

    import verl.trainer.main_ppo as verl_main_ppo
    from omegaconf import OmegaConf

    module = importlib.import_module(f"rlguard.adapters.verl.{entry}")
    started: list[object] = []
    monkeypatch.setattr(verl_main_ppo, "run_ppo", lambda *a, **k: started.append(a))
    guard = {"interventions": {"halt": {"critical_steps": -1}}}
    config = OmegaConf.create({"async_training": {}, "trainer": {"rlguard_guard": guard}})
    with pytest.raises(FieldError, match=r"^trainer\.rlguard_guard\.interventions\['halt'\]\.critical_steps"):
        module.main.__wrapped__(config)  # hydra's wrapper keeps the function
    assert not started
