"""The `rlguard` command through typer's runner: `losses`, `detectors`, and the `demo`'s options and summary (the demo's
TRL runs are in integration_tests/test_demo.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlguard.cli import app, console
from rlguard.core_losses import list_objectives
from rlguard.demo import DEFAULT_RUNS, DemoConfig, DemoResult, RunSpec, RunSummary, parse_runs, summary_rows
from rlguard.demo.console import print_summary
from rlguard.guards import PRESETS, Event

runner = CliRunner()


def test_losses_table_lists_every_objective_with_its_paper() -> None:
    result = runner.invoke(app, ["losses"])
    assert result.exit_code == 0, result.output
    for name in list_objectives():
        assert name in result.output
    assert "arXiv 2507.18071" in result.output and "arXiv 2402.03300" in result.output


def test_losses_json_matches_the_registry_defaults() -> None:
    result = runner.invoke(app, ["losses", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert sorted(rows) == list_objectives()
    assert rows["gspo"]["defaults"]["clip_low"] == 3e-4 and rows["gspo"]["defaults"]["clip_high"] == 4e-4
    assert rows["dapo"]["defaults"]["clip_high"] == 0.28 and rows["dapo"]["aggregation"] == "token-mean"
    assert rows["dr_grpo"]["aggregation"] == "seq-mean-token-sum-norm"


def test_demo_runs_parse_objectives_and_guard_presets() -> None:
    assert parse_runs("grpo,gspo+guard") == (RunSpec("grpo"), RunSpec("gspo", "default"))
    assert parse_runs("dapo+strict, cispo") == (RunSpec("dapo", "strict"), RunSpec("cispo"))
    assert [r.folder for r in parse_runs("gspo,gspo+monitor")] == ["gspo", "gspo-guard-monitor"]
    assert [r.objective for r in parse_runs(",".join(list_objectives()))] == list_objectives()  # every objective
    stressed = parse_runs("grpo@lr_spike, grpo+strict@lr_spike")
    assert stressed == (RunSpec("grpo", None, "lr_spike"), RunSpec("grpo", "strict", "lr_spike"))
    assert [r.label for r in stressed] == ["grpo@lr_spike", "grpo+strict@lr_spike"]
    assert [r.folder for r in stressed] == ["grpo-lr-spike", "grpo-guard-strict-lr-spike"]
    # the default demo: a healthy pair and the same LR spike without and with the guard
    assert (
        DemoConfig().runs
        == parse_runs(DEFAULT_RUNS)
        == (RunSpec("grpo"), RunSpec("gspo", "default"), *stressed[:1], RunSpec("grpo", "strict", "lr_spike"))
    )
    assert (DemoConfig().fault_at, DemoConfig(steps=4).fault_at, DemoConfig(steps=9, fault_step=5).fault_at) == (
        20,
        2,
        5,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--objectives", "grpo,ppo"], "unknown objective 'ppo'"),
        (["--objectives", "gspo+careful"], "unknown guard preset 'careful'"),
        (["--objectives", "grpo,grpo"], "names the same run twice"),
        (["--steps", "1"], "steps must be >= 2"),
        (["--objectives", "grpo@nan"], "unknown fault 'nan' in 'grpo@nan'; faults: lr_spike"),
        (["--objectives", "grpo@lr_spike,grpo@lr_spike"], "names the same run twice"),
    ],
)
def test_demo_bad_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["demo", *args])
    assert result.exit_code == 2
    assert message in result.output and result.output.count("\n") == 1


def _summary(spec: RunSpec, rewards: list[float], events: list[Event]) -> RunSummary:
    steps = list(range(1, len(rewards) + 1))
    series = {"reward_mean": rewards, "entropy": [1.0] * len(steps), "clip_frac": [math.nan] * len(steps)}
    return RunSummary(spec, Path(spec.folder), steps, series, events, 0.25, 0.5, 12.0)


def test_demo_summary_compares_the_first_and_last_fifth_of_each_run(capsys: pytest.CaptureFixture[str]) -> None:
    event = Event(step=4, detector="action:set_clip", severity="warn", value=0.5, message="tighten")
    grpo = _summary(RunSpec("grpo"), [0.1 * i for i in range(1, 11)], [])
    gspo = _summary(RunSpec("gspo", "default"), [0.2, math.nan, 0.4, math.nan, 0.6, 0.8], [event, event])
    # 10 steps: fifths of 2 steps, (0.1 + 0.2) / 2 and (0.9 + 1.0) / 2; 6 steps: at least 2 steps, NaN skipped
    assert grpo.window_mean("reward_mean", end=False) == pytest.approx(0.15)
    assert grpo.window_mean("reward_mean", end=True) == pytest.approx(0.95)
    assert gspo.window_mean("reward_mean", end=False) == pytest.approx(0.2)
    assert gspo.window_mean("reward_mean", end=True) == pytest.approx(0.7)
    assert math.isnan(gspo.window_mean("clip_frac", end=True)) and math.isnan(gspo.window_mean("kl_ref", end=True))
    config = DemoConfig(steps=10, runs=(grpo.spec, gspo.spec))
    result = DemoResult(Path("out"), config, [grpo, gspo], Path("out/report.html"), 1.0, 30.0)
    data = json.loads(json.dumps(result.to_dict()))  # JSON-ready: NaN became null
    assert [r["run"] for r in data["runs"]] == ["grpo", "gspo+default"]
    assert data["runs"][1]["reward_mean"] == {"start": pytest.approx(0.2), "end": pytest.approx(0.7)}
    assert data["runs"][1]["clip_frac"] == {"start": None, "end": None}
    assert [e["detector"] for e in data["runs"][1]["guard_events"]] == ["action:set_clip"] * 2
    rows = summary_rows(result.runs)
    assert rows[0]["reward_mean"] == "0.15 -> 0.95" and rows[0]["guard events"] == "no guard"
    assert rows[1]["guard events"] == "action:set_clip x2" and rows[1]["exact answers"] == "25% -> 50%"
    print_summary(result, console)
    out = capsys.readouterr().out
    assert "0.15 -> 0.95" in out and "action:set_clip x2" in out and "out/report.html" in out


def test_detectors_lists_every_registered_detector_and_intervention() -> None:
    from rlguard.guards.registry import detector_registry, intervention_registry

    result = runner.invoke(app, ["detectors", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["name"] for r in data["detectors"]] == list(detector_registry())
    assert [r["name"] for r in data["interventions"]] == list(intervention_registry())
    table = runner.invoke(app, ["detectors"])
    assert table.exit_code == 0 and "entropy_collapse" in table.output and "rollback" in table.output


def test_detectors_and_the_demo_take_the_guard_s_one_list_of_presets() -> None:
    result = runner.invoke(app, ["detectors", "--json"])
    data = json.loads(result.output)
    assert data["presets"] == list(PRESETS) == ["monitor", "default", "strict", "stable"]
    presets_of = {r["name"]: r["presets"] for r in data["interventions"]}
    # stable's own interventions run in stable only; default's rollback everywhere but monitor and stable
    assert presets_of["trust_region"] == presets_of["recovery"] == ["stable"]
    assert presets_of["rollback"] == ["default", "strict"]
    table = runner.invoke(app, ["detectors"], env={"COLUMNS": "300"})
    assert "guard presets: monitor, default, strict, stable" in table.output
    assert [r.guard for r in parse_runs(",".join(f"grpo+{p}" for p in PRESETS))] == list(PRESETS)
    wrong = runner.invoke(app, ["demo", "--objectives", "grpo+careful"])
    assert wrong.exit_code == 2 and ", ".join("+" + p for p in PRESETS) in wrong.output


def test_bench_collapse_bad_input_exits_2() -> None:
    result = CliRunner().invoke(app, ["bench", "collapse", "--stressors", "none,typo"])
    assert result.exit_code == 2
    assert "typo" in result.output


def test_version_flag_prints_the_package_version() -> None:
    import rlguard

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"rlguard {rlguard.__version__}"


def test_demo_help_shows_the_demo_s_default_runs() -> None:
    from rlguard.cli import _DEMO_RUNS

    assert _DEMO_RUNS == DEFAULT_RUNS  # written out in the command line so that it starts without the demo
    result = runner.invoke(app, ["demo", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0 and DEFAULT_RUNS in result.output


def test_doctor_exits_1_on_a_run_the_live_guard_halted(tmp_path: Path) -> None:
    """The log alone is healthy (exit 0); the guard's events.jsonl beside it records a halt: the run failed (exit 1),
    although the critical alarm behind it is a warning with the log's hindsight."""
    from tests.helpers.doctor_logs import write_trainer_state
    from tests.helpers.synthetic import healthy_stream

    run = tmp_path / "run"
    stream = [{k: v for k, v in s.items() if k != "kl_old"} for s in healthy_stream(60, 0, "plateau")]
    write_trainer_state(stream, run / "checkpoint-60" / "trainer_state.json")
    spike = Event(31, "grad_norm_spike", "critical", 512.0, "grad_norm=512 is 250x its rolling median")
    (run / "events.jsonl").write_text(json.dumps(spike.to_dict()) + "\n", encoding="utf-8")
    assert runner.invoke(app, ["doctor", str(run)]).exit_code == 0
    halt = Event(31, "action:halt", "critical", 1.0, "halt: critical grad_norm_spike")
    with (run / "events.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(halt.to_dict()) + "\n")
    result = runner.invoke(app, ["doctor", str(run)])
    assert result.exit_code == 1, result.output
    assert "action:halt" in result.output
    # a log too short to judge: still exit 1, and the last line says so (not "exit code 3")
    short = tmp_path / "short"
    write_trainer_state(stream[:5], short / "trainer_state.json")
    (short / "events.jsonl").write_text(json.dumps(halt.to_dict()) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["doctor", str(short)], env={"COLUMNS": "300"})
    assert result.exit_code == 1 and "critical (exit code 1)" in result.output, result.output
    assert "exit code 3" not in result.output


def test_doctor_says_why_a_stat_that_is_there_was_not_judged(tmp_path: Path) -> None:
    """An on-policy TRL run (one optimizer step per generation) logs clip_frac 0, kl_old 0 and ratio_max 1 at every
    step: the stats are in the log but none is evidence for its detector. The doctor says so, not that the log
    lacks them."""
    from tests.helpers.doctor_logs import write_trainer_state
    from tests.helpers.synthetic import healthy_stream

    stream = [{**s, "clip_frac": 0.0, "kl_old": 0.0, "ratio_max": 1.0} for s in healthy_stream(30, 0, "plateau")]
    write_trainer_state(stream, tmp_path / "trainer_state.json")
    result = runner.invoke(app, ["doctor", str(tmp_path / "trainer_state.json")], env={"COLUMNS": "300"})
    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") >= 3}
    for detector, stat in (("clip_frac_burst", "clip_frac"), ("kl_old_blowup", "kl_old")):
        assert f"{stat} at its floor on every step" in lines[detector], result.output
        assert "the log has no" not in lines[detector]
