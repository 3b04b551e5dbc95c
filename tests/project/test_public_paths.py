"""The import paths a user has: every ``from rlguard... import ...`` and every dotted ``rlguard.`` name of the README
and the docs imports without a warning; the paths of modules that moved still work and warn, naming the new place;
renamed fields and class attributes warn and keep working."""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings
from pathlib import Path

import pytest

from rlguard.guards import Guard, GuardConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
IMPORT = re.compile(r"^\s*from (rlguard[\w.]*) import ([\w, ]+(?: as \w+)?)\s*$", re.M)
DOTTED = re.compile(r"`(rlguard(?:\.\w+)+)`")


def _doc_imports() -> list[tuple[str, str, str]]:
    found = set()
    for doc in DOCS:
        for module, names in IMPORT.findall(doc.read_text()):
            for name in names.split(","):
                found.add((doc.name, module, name.split(" as ")[0].strip()))
    return sorted(found)


def _doc_dotted() -> list[tuple[str, str]]:
    """The dotted names of the docs that name a module of the package (``rlguard.gspo`` is a verl loss name)."""
    package = ROOT / "rlguard"
    return sorted(
        (doc.name, name)
        for doc in DOCS
        for name in set(DOTTED.findall(doc.read_text()))
        if (package / name.split(".")[1]).is_dir() or (package / f"{name.split('.')[1]}.py").is_file()
    )


def _resolve(dotted: str) -> object:
    """The module or attribute a dotted name stands for: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_docs_name_imports_to_check() -> None:
    """The scan finds the README's quick starts (a scan that finds nothing checks nothing)."""
    names = {(m, n) for _, m, n in _doc_imports()}
    assert ("rlguard.adapters.trl", "GuardedGRPOConfig") in names
    assert ("rlguard.guards", "Guard") in names
    assert len(_doc_dotted()) > 20


def _moved_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """rlguard's own deprecations among ``caught`` (a framework's warnings on import are not the docs' fault)."""
    return [
        str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and "moved to" in str(w.message)
    ]


@pytest.mark.parametrize(("doc", "module", "name"), _doc_imports())
def test_every_import_of_the_docs_works_without_a_deprecation(doc: str, module: str, name: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert getattr(importlib.import_module(module), name) is not None
    assert not _moved_warnings(caught)


@pytest.mark.parametrize(("doc", "dotted"), _doc_dotted())
def test_every_dotted_name_of_the_docs_resolves_without_a_deprecation(doc: str, dotted: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _resolve(dotted) is not None
    assert not _moved_warnings(caught)


#: old path -> the name it had there, and where it lives now (module, name)
MOVED = {
    "rlguard.guards.actuator.TorchActuator": ("rlguard.guards.actuation", "TorchActuator"),
    "rlguard.guards.actuator.apply_decision": ("rlguard.guards.actuation", "apply_decision"),
    "rlguard.guards.actuator.bind_guard": ("rlguard.guards.actuation", "bind_guard"),
    "rlguard.guards.actuator.make_guard": ("rlguard.guards.guard", "make_guard"),
    "rlguard.guards.actuator.EVENTS_FILE": ("rlguard.guards.actuation", "EVENTS_FILE"),
    "rlguard.guards.actuator.GUARD_STATE_FILE": ("rlguard.guards.actuation", "GUARD_STATE_FILE"),
    "rlguard.guards.actuator.Applied": ("rlguard.guards.actuation", "Applied"),
    "rlguard.guards.snapshot.ModelSnapshot": ("rlguard.guards.actuation.snapshot", "ModelSnapshot"),
    "rlguard.guards.snapshot.check_snapshot_budget": ("rlguard.guards.actuation.budget", "check_snapshot_budget"),
    "rlguard.guards.update_norm.UpdateMeter": ("rlguard.guards.actuation.update_meter", "UpdateMeter"),
    "rlguard.guards.reduction.reduce_rows": ("rlguard.guards.stats.reduction", "reduce_rows"),
    "rlguard.guards.remedies.MismatchRemedy": ("rlguard.guards.interventions.mismatch_remedy", "MismatchRemedy"),
    "rlguard.guards.remedies.CAUSES": ("rlguard.guards.interventions.causes", "CAUSES"),
    "rlguard.guards.trust_region.TrustRegion": ("rlguard.guards.interventions.trust_region", "TrustRegion"),
    "rlguard.guards.entropy_control.EntropyControl": ("rlguard.guards.interventions.clip_higher", "ClipHigher"),
    "rlguard.guards.adaptive_entropy.AdaptiveEntropy": ("rlguard.guards.interventions.entropy_coef", "AdaptiveEntropy"),
    "rlguard.guards.recovery.Recovery": ("rlguard.guards.interventions.recovery", "Recovery"),
    "rlguard.guards.alert_sender.AlertSender": ("rlguard.guards.alerts.sender", "AlertSender"),
    "rlguard.guards.detectors.consequence.judge": ("rlguard.guards.consequence.offline", "judge_log"),
    "rlguard.guards.detectors.consequence.OnlineConsequence": ("rlguard.guards.consequence.live", "OnlineConsequence"),
    "rlguard.guards.detectors.consequence.ConsequenceRule": ("rlguard.guards.consequence.rule", "ConsequenceRule"),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_path_still_works_and_warns_where_it_lives_now(old: str) -> None:
    module, name = old.rsplit(".", 1)
    new_module, new_name = MOVED[old]
    with pytest.warns(DeprecationWarning, match=re.escape(f"moved to {new_module}.{new_name}")):
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(importlib.import_module(new_module), new_name)


def test_a_moved_module_names_its_new_home_for_a_name_it_never_had() -> None:
    with pytest.raises(AttributeError, match=re.escape("moved to rlguard.guards.actuation")):
        importlib.import_module("rlguard.guards.actuator").no_such_name  # noqa: B018


@pytest.mark.parametrize(
    "path",
    [
        "rlguard.guards.interventions.Rollback",
        "rlguard.guards.interventions.LRBackoff",
        "rlguard.guards.stats.StepStats",
        "rlguard.guards.stats.collect_step_stats",
        "rlguard.guards.alerts.AlertConfig",
        "rlguard.guards.actuation.TorchActuator",
    ],
)
def test_paths_that_became_packages_need_no_warning(path: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _resolve(path) is not None
    assert not _moved_warnings(caught)


def test_a_renamed_intervention_field_warns_and_keeps_working() -> None:
    stable = GuardConfig.preset("stable")
    interventions = {**stable.interventions, "clip_controller": {"hold_on": ("mismatch_growth",)}}
    with pytest.warns(DeprecationWarning, match="'hold_on' is now 'explained_by'"):
        guard = Guard(dataclasses.replace(stable, interventions=interventions))
    assert guard.interventions["clip_controller"].explained_by == ("mismatch_growth",)  # type: ignore[attr-defined]
    lr = {**stable.interventions, "lr_backoff": {"hold_on": ("mismatch_growth",)}}
    with pytest.warns(DeprecationWarning, match="'hold_on' no longer exists: the cause table"):
        guard = Guard(dataclasses.replace(stable, interventions=lr))
    assert guard.handed_over == {"lr_backoff": frozenset({"mismatch_growth"})}


def test_a_detector_declaring_consequence_warns_and_gets_its_finding_class() -> None:
    from rlguard.guards import Detector

    with pytest.warns(DeprecationWarning, match="now called finding_class"):

        class Budgeted(Detector):
            name = "budgeted"
            consequence = "budget"

    assert Budgeted.finding_class == "budget"
