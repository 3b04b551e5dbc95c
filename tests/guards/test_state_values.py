"""A guard state file is checked for range as well as type when it is loaded: a NaN baseline, an infinity in a
rolling window, an integer too large for a count are refused at the resume (``GuardStateError`` naming the file
and the key), not accepted to switch a detector off or to fail at the next ``observe``, mid-training."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.state import GuardStateError, long_integer_at, read_state_file
from tests.helpers.synthetic import failing_stream, healthy_stream

SOURCE = "ckpt/rlguard_guard.json"


def _saved() -> dict[str, Any]:
    guard = Guard(GuardConfig.preset("stable"))
    for step, stats in enumerate(healthy_stream(60, seed=3)):
        guard.observe(step, stats)
    state: dict[str, Any] = json.loads(json.dumps(guard.state_dict()))
    return state


@pytest.fixture(scope="module")
def saved() -> dict[str, Any]:
    return _saved()


def _changed(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(state)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def _load(state: Any) -> Guard:
    guard = Guard(GuardConfig.preset("stable"))
    guard.load_state_dict(state, source=SOURCE)
    return guard


NAN, INF = float("nan"), float("inf")
BIG = 10**400


CASES: list[tuple[tuple[Any, ...], Any, str]] = [
    (("detectors", "grad_norm_spike", "_s_window", 0), NAN, r"grad_norm_spike\._s_window: .*item 0 is float nan"),
    (("detectors", "grad_norm_spike", "_s_window", 3), INF, r"_s_window: expected a list of numbers \(finite\)"),
    (("detectors", "grad_norm_spike", "_s_window", 1), BIG, r"item 1 is an integer of 1329 bits"),
    (("detectors", "reward_collapse", "_s_best"), NAN, r"reward_collapse\._s_best: expected a number, not NaN"),
    (("detectors", "length_explosion", "_s_cusum"), NAN, r"length_explosion\._s_cusum: expected a number, not NaN"),
    (("detectors", "reward_collapse", "_s_low"), BIG, r"reward_collapse\._s_low: expected an integer of at most"),
    (("interventions", "trust_region", "_s_scale"), NAN, r"trust_region\._s_scale: expected a number, not NaN"),
    (("seen", "grad_norm_spike"), BIG, r"seen\.grad_norm_spike: expected an integer >= 0; got an integer of"),
    (("last_step",), 2**60, r"last_step: expected an integer >= 0; got an integer of 61 bits \(at most 2\*\*53\)"),
    (("alarms", "grad_norm_spike", "streak"), BIG, r"alarms\.grad_norm_spike\.streak: expected an integer"),
]


@pytest.mark.parametrize(("path", "value", "match"), CASES, ids=[".".join(map(str, c[0])) for c in CASES])
def test_a_value_out_of_range_is_refused_at_load_naming_the_key(
    saved: dict[str, Any], path: tuple[Any, ...], value: Any, match: str
) -> None:
    assert path[-1] in _dig(saved, path[:-1]) or isinstance(path[-1], int)
    with pytest.raises(GuardStateError, match=match) as err:
        _load(_changed(saved, path, value))
    assert SOURCE in str(err.value)


def _dig(state: dict[str, Any], path: tuple[Any, ...]) -> Any:
    for key in path:
        state = state[key]
    return state


def test_a_nan_baseline_no_longer_hides_a_gradient_spike_after_the_resume(saved: dict[str, Any]) -> None:
    """Before: a window of NaN loaded, and a 50x spike after the resume raised nothing."""
    window = saved["detectors"]["grad_norm_spike"]["_s_window"]
    with pytest.raises(GuardStateError, match="grad_norm_spike"):
        _load(_changed(saved, ("detectors", "grad_norm_spike", "_s_window"), [NAN] * len(window)))
    guard = _load(saved)  # the file as written resumes, and the spike is seen
    spike = failing_stream("grad_spike", 80, 61, seed=3)[61]
    guard.observe(61, spike)
    assert "grad_norm_spike" in guard.last_findings


def test_infinite_sentinels_of_a_fresh_detector_still_round_trip() -> None:
    """A best level starts at -inf (no reward seen yet); a state saved then resumes."""
    fresh = json.loads(json.dumps(Guard(GuardConfig.preset("stable")).state_dict()))
    assert _load(fresh).state_dict() == fresh


def test_an_integer_of_5000_digits_in_the_file_is_a_state_error_naming_its_line(
    tmp_path: Path, saved: dict[str, Any]
) -> None:
    """Python's own message ("Exceeds the limit (4300 digits) for integer string conversion") names no place."""
    path = tmp_path / "rlguard_guard.json"
    text = json.dumps(saved, indent=1).replace('"last_step": ', '"last_step": ' + "9" * 5000 + ', "x": ', 1)
    path.write_text(text)
    line = text[: text.index("9" * 5000)].count("\n") + 1
    with pytest.raises(GuardStateError) as err:
        read_state_file(path)
    assert f"{path}, line {line} column " in str(err.value) and "4300" in str(err.value)
    assert "set_int_max_str_digits" not in str(err.value)  # Python's advice to raise its limit is not ours


def test_long_integer_at_finds_the_integer_not_a_long_fraction() -> None:
    text = '{\n "a": 0.' + "1" * 5000 + ',\n  "b": -' + "7" * 4301 + "\n}"
    assert long_integer_at(text) == (3, 8)
    assert long_integer_at('{"a": ' + "7" * 4300 + "}") is None


def test_a_guard_restored_from_anothers_state_shares_no_list_with_it() -> None:
    """The doctor's fold judges a log's last step on a copy restored from its guard's state (not through JSON): the
    copy's observations must leave the original's baselines as they were (the early anchors are lists)."""
    guard = Guard(GuardConfig.preset("monitor"))
    stream = failing_stream("length_explosion", 40, 3, seed=0)
    for step, stats in enumerate(stream[:3]):
        guard.observe(step, stats)
    before = json.dumps(guard.state_dict(), sort_keys=True)
    twin = Guard(GuardConfig.preset("monitor"))
    twin.load_state_dict(guard.state_dict())
    for step, stats in enumerate(stream[3:], start=3):
        twin.observe(step, stats)
    assert json.dumps(guard.state_dict(), sort_keys=True) == before
