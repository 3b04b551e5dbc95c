"""The guard's checkpointed state (``rlguard.guards.state``, ``Guard.load_state_dict``): written atomically, carries
a version, validated on load (known keys and types only, the file in every error, nothing changed by a bad file),
and a resume without it says what it costs, in TRL and verl alike."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.state import GuardStateError, read_state_file, write_state_file
from tests.helpers.synthetic import failing_stream


def trained(steps: int = 60) -> Guard:
    guard = Guard(GuardConfig.preset("stable"))
    for step, stats in enumerate(failing_stream("grad_spike", steps, 40, seed=6)):
        guard.observe(step, stats)
    return guard


@pytest.fixture(scope="module")
def saved() -> dict[str, Any]:
    return json.loads(json.dumps(trained().state_dict()))


def load(state: Any) -> Guard:
    guard = Guard(GuardConfig.preset("stable"))
    guard.load_state_dict(state, source="ckpt/rlguard_guard.json")
    return guard


def changed(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(state)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def test_a_valid_state_round_trips(saved: dict[str, Any]) -> None:
    assert load(saved).state_dict() == saved


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("version",), 2, r"ckpt/rlguard_guard\.json: unsupported guard state version 2; this rlguard reads version 1"),
        (("version",), True, r"unsupported guard state version True"),
        (("events",), {}, r"ckpt/rlguard_guard\.json: events: expected a list; got dict"),
        (("events", 0, "severity"), "<script>", r"ckpt/rlguard_guard\.json: events: severity '<script>' is not one"),
        (("seen", "nonfinite"), "3", r"seen\.nonfinite: expected an integer >= 0; got str '3'"),
        (("alarms", "nonfinite", "level"), 7, r"alarms\.nonfinite\.level: expected 0 \(none\), 1 \(warn\) or 2"),
        (("alarms", "nonfinite", "evil"), 1, r"alarms\.nonfinite: expected the keys"),
        (("last_step",), -1, r"last_step: expected an integer >= 0; got int -1"),
        (("consecutive_skips",), None, r"consecutive_skips: expected an integer >= 0; got None"),
        (("detectors", "grad_norm_spike", "_s_window"), "x", r"detectors\.grad_norm_spike\._s_window: expected a list"),
        (("detectors", "grad_norm_spike", "_s_window"), [1.0, "2"], r"_s_window: expected a list of numbers"),
        (("interventions", "trust_region", "_s_scale"), "0.5", r"interventions\.trust_region\._s_scale: expected a"),
        # a state file sets counters and baselines only: never a threshold, a method or any other attribute
        (("detectors", "grad_norm_spike", "warn_factor"), 1e9, r"grad_norm_spike: unknown key\(s\) \['warn_factor'\]"),
        (("interventions", "trust_region", "propose"), None, r"trust_region: unknown key\(s\) \['propose'\]"),
        (("detectors", "grad_norm_spike", "_s_backdoor"), 1, r"unknown key\(s\) \['_s_backdoor'\]"),
        (("extra",), 1, r"not a guard state: unknown key\(s\) \['extra'\]"),
    ],
)
def test_a_bad_state_is_refused_naming_the_file_and_the_key(
    saved: dict[str, Any], path: tuple[str, ...], value: Any, match: str
) -> None:
    with pytest.raises(GuardStateError, match=match):
        load(changed(saved, path, value))


def test_a_state_holding_only_a_version_names_what_is_missing(saved: dict[str, Any]) -> None:
    with pytest.raises(GuardStateError, match=r"missing key\(s\) \['alarms', 'consecutive_skips', 'detectors'"):
        load({"version": 1})


def test_a_bad_key_late_in_the_file_changes_nothing(saved: dict[str, Any]) -> None:
    guard = Guard(GuardConfig.preset("stable"))
    before = guard.state_dict()
    bad = changed(saved, ("interventions", "trust_region", "_s_scale"), "0.5")
    with pytest.raises(GuardStateError):
        guard.load_state_dict(bad)
    assert guard.state_dict() == before  # detectors, loaded before the bad intervention, are untouched


def test_state_files_are_written_atomically(tmp_path: Path, saved: dict[str, Any], monkeypatch: Any) -> None:
    path = tmp_path / "rlguard_guard.json"
    write_state_file(path, saved)
    assert read_state_file(path) == saved

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", crash)  # the process dies in the middle of writing the new state
    with pytest.raises(OSError):
        write_state_file(path, {"version": 1})
    assert read_state_file(path) == saved and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_truncated_file_names_itself(tmp_path: Path, saved: dict[str, Any]) -> None:
    path = tmp_path / "rlguard_guard.json"
    path.write_text(json.dumps(saved)[:100])
    with pytest.raises(GuardStateError, match=rf"{path}: not the guard's state, not valid JSON .*Resume from an"):
        read_state_file(path)


def _trl_begin_resumed_at_step_3(output_dir: Path) -> None:
    """A TRL StabilityCallback's on_train_begin on a run resumed at global step 3 of ``output_dir``."""
    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from rlguard.adapters.trl import StabilityCallback

    callback = StabilityCallback(guard="default")
    callback.attach(type("Stand", (), {"_metrics": {"train": {}}})())
    model = torch.nn.Linear(2, 2)
    args = TrainingArguments(output_dir=str(output_dir), use_cpu=True, report_to="none", logging_steps=1)
    state = TrainerState()
    state.global_step = 3
    callback.on_train_begin(args, state, TrainerControl(), model=model, optimizer=torch.optim.SGD(model.parameters()))


def test_trl_resume_without_state_warns_with_its_cost(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    with pytest.warns(UserWarning, match=r"resuming at step 3 WITHOUT the guard's state: .*checkpoint-3.*baseline"):
        _trl_begin_resumed_at_step_3(tmp_path)


def test_trl_resume_with_a_bad_state_names_the_file(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from rlguard.adapters.trl import GUARD_STATE_FILE

    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / GUARD_STATE_FILE).write_text('{"version": 1')
    with pytest.raises(GuardStateError, match=rf"{folder / GUARD_STATE_FILE}: not the guard's state"):
        _trl_begin_resumed_at_step_3(tmp_path)
