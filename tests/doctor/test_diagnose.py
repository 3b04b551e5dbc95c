"""`rlguard doctor`: every format read, every detector's failure found, healthy runs pass, bad input exits 2."""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import Diagnosis, LogInputError, classify_keys, diagnose, read_log
from rlguard.doctor.keys import canonical_stats
from tests.helpers.doctor_logs import WRITERS, write_log, write_trainer_state
from tests.helpers.synthetic import FAILURES, SHAPES, failing_stream, healthy_stream

runner = CliRunner()
STEPS, ONSET = 220, 120
#: as tests/guards/test_guard.py: the detector's first event within this many steps of the onset
MAX_DELAY = 25
#: logged steps a change-point estimate may lead the onset by: a CUSUM's (Page's estimate: the first observation since
#: its statistic was last 0) counts the noise of the observations just before the change that kept it above 0
MAX_LEAD = 2
FORMATS = sorted(WRITERS)
#: synthetic failures that are one isolated spike on a healthy run (tests.helpers.synthetic)
ABSORBED = {"grad_spike", "ratio_explosion"}
#: synthetic failures of lengths growing 4x (and hitting the budget) while the healthy stream's reward still rises:
#: a drift and a budget condition with a rising reward, warnings by consequence (critical where the reward falls)
DRIFTS = {"length_explosion", "truncation"}


def needs(fmt: str) -> None:
    if fmt == "tensorboard":
        pytest.importorskip("tensorboard")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", sorted(FAILURES))
def test_each_failure_is_found_in_each_format(tmp_path: Path, fmt: str, mode: str) -> None:
    needs(fmt)
    _, detector = FAILURES[mode]
    path = write_log(fmt, failing_stream(mode, STEPS, ONSET, seed=0), tmp_path)
    diagnosis = diagnose(path)
    assert diagnosis.log.format == fmt
    assert len(diagnosis.steps) == STEPS and diagnosis.steps[0] == 1
    found = {f.detector: f for f in diagnosis.findings}
    assert detector in found, (mode, fmt, [(f.detector, f.step) for f in diagnosis.findings])
    onset = ONSET + 1  # logs count steps from 1
    assert onset - MAX_LEAD <= found[detector].step <= onset + MAX_DELAY, (mode, fmt, found[detector])
    if mode in ABSORBED:
        # one spike, after which nothing lost control: the doctor's hindsight makes it a warning
        assert found[detector].severity == "warn" and "recovered from" in found[detector].message, found[detector]
        assert diagnosis.exit_code == 0
    elif mode in DRIFTS:
        assert found[detector].severity == "warn" and not diagnosis.critical, (mode, fmt, diagnosis.findings)
    else:
        assert found[detector].severity == "critical", (mode, fmt, found[detector])
        assert diagnosis.critical


@pytest.mark.parametrize("mode", sorted(DRIFTS))
def test_the_length_failures_are_critical_where_the_reward_falls(tmp_path: Path, mode: str) -> None:
    """The streams of DRIFTS with the reward falling from the onset (0.02 a step): the same findings, critical."""
    stream = failing_stream(mode, STEPS, ONSET, seed=0)
    for i, row in enumerate(stream[ONSET:]):
        row["reward_mean"] -= 0.02 * i
    diagnosis = diagnose(write_log("trl", stream, tmp_path))
    found = {f.detector: f for f in diagnosis.findings}
    assert found[FAILURES[mode][1]].severity == "critical", diagnosis.findings
    assert ONSET + 1 - MAX_LEAD <= found[FAILURES[mode][1]].step <= ONSET + 1 + MAX_DELAY, diagnosis.findings


@pytest.mark.parametrize("fmt", FORMATS)
def test_healthy_logs_get_no_critical_finding(tmp_path: Path, fmt: str) -> None:
    needs(fmt)
    for shape in SHAPES:
        for seed in range(2 if fmt in ("trl", "verl") else 1):
            path = write_log(fmt, healthy_stream(300, seed, shape), tmp_path / f"{shape}-{seed}")  # type: ignore[arg-type]
            diagnosis = diagnose(path)
            assert len(diagnosis.steps) == 300
            critical = [f for f in diagnosis.findings if f.severity == "critical"]
            assert not critical, (fmt, shape, seed, critical)


def test_findings_are_sorted_most_severe_first_then_by_onset(tmp_path: Path) -> None:
    stream = failing_stream("clip_burst", STEPS, 60, seed=1)
    for i, s in enumerate(stream):  # a second failure, later
        if i == 150:
            s["grad_norm"] *= 500.0
    diagnosis = diagnose(write_trainer_state(stream, tmp_path / "trainer_state.json"))
    levels = [2 if f.severity == "critical" else 1 for f in diagnosis.findings]
    assert levels == sorted(levels, reverse=True)
    for a, b in zip(diagnosis.findings, diagnosis.findings[1:], strict=False):
        if a.severity == b.severity:
            assert a.step <= b.step
    assert {"clip_frac_burst", "grad_norm_spike"} <= {f.detector for f in diagnosis.findings}


def test_cli_exit_codes_and_table(tmp_path: Path) -> None:
    """Spikes in 3 of 5 consecutive steps are sustained: critical; one alone, or spikes 5 steps apart, the run
    recovered from: a warning, exit 0."""
    stream = failing_stream("grad_spike", STEPS, ONSET, 0)
    once = write_trainer_state(stream, tmp_path / "once" / "trainer_state.json")
    apart = [dict(s) for s in stream]
    for i in (ONSET + 5, ONSET + 10):
        apart[i]["grad_norm"] *= 200.0
    write_trainer_state(apart, tmp_path / "apart" / "trainer_state.json")
    for i in (ONSET + 1, ONSET + 3):
        stream[i]["grad_norm"] *= 200.0
    bad = write_trainer_state(stream, tmp_path / "bad" / "trainer_state.json")
    result = runner.invoke(app, ["doctor", str(tmp_path / "apart")])
    assert result.exit_code == 0 and "recovered from" in result.stdout, result.output
    good = write_trainer_state(healthy_stream(STEPS, 0, "plateau"), tmp_path / "good" / "trainer_state.json")
    result = runner.invoke(app, ["doctor", str(once)])
    assert result.exit_code == 0 and "recovered from" in result.stdout, result.output
    result = runner.invoke(app, ["doctor", str(bad)])
    assert result.exit_code == 1, result.output
    assert "grad_norm_spike" in result.stdout and str(ONSET + 1) in result.stdout
    doc = json.loads(runner.invoke(app, ["doctor", str(bad), "--json"]).stdout)
    (spike,) = [f for f in doc["findings"] if f["detector"] == "grad_norm_spike"]
    assert spike["severity"] == "critical" and "sustained: critical in 3 of 5" in spike["message"]
    assert "Skip this step" in spike["message"]  # the detector's suggested fix (the table wraps it by its width)
    result = runner.invoke(app, ["doctor", str(good)])
    assert result.exit_code == 0, result.output
    assert "critical" not in result.stdout
    # a run folder is resolved to its log, as `rlguard report` does
    assert runner.invoke(app, ["doctor", str(bad.parent)]).exit_code == 1


def test_cli_json_schema(tmp_path: Path) -> None:
    path = write_log("verl", failing_stream("entropy_collapse", STEPS, ONSET, 0), tmp_path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": STEPS + 1, "data": {"my_team/custom_metric": 1.0, "actor/entropy": 0.01}}) + "\n")
    result = runner.invoke(app, ["doctor", str(path), "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == "verl" and doc["steps"] == STEPS + 1
    assert doc["unrecognised_keys"] == ["my_team/custom_metric"]  # verl's own timing/score keys are known
    assert doc["findings"], doc
    for f in doc["findings"]:
        assert {"detector", "severity", "step", "message"} <= set(f)
        assert f["severity"] in ("warn", "critical") and isinstance(f["step"], int) and f["message"]
    assert doc["findings"][0]["severity"] == "critical"
    assert doc["mapped_keys"]["actor/entropy"] == "entropy"


def test_cli_html_report_embeds_a_plot_per_finding(tmp_path: Path) -> None:
    path = write_log("trl", failing_stream("kl_ref_blowup", STEPS, ONSET, 0), tmp_path)
    html = tmp_path / "out" / "doctor.html"
    result = runner.invoke(app, ["doctor", str(path), "--html", str(html)])
    assert result.exit_code == 1, result.output
    text = html.read_text(encoding="utf-8")
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    n_findings = len(diagnose(path).findings)
    assert n_findings >= 1 and len(images) == n_findings
    assert all(base64.b64decode(img).startswith(b"\x89PNG\r\n\x1a\n") for img in images)
    assert "kl_ref_blowup" in text and 'src="http' not in text  # self-contained


def test_cli_html_on_a_healthy_log(tmp_path: Path) -> None:
    path = write_log("jsonl", healthy_stream(60, 0, "plateau"), tmp_path)
    assert not diagnose(path).findings
    html = tmp_path / "doctor.html"
    assert runner.invoke(app, ["doctor", str(path), "--html", str(html), "--json"]).exit_code == 0
    assert "No finding" in html.read_text(encoding="utf-8")


def _bad_input(path: Path, *extra: str) -> str:
    result = runner.invoke(app, ["doctor", str(path), *extra])
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("rlguard doctor: ")
    return lines[0]


def test_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    assert "no such file" in _bad_input(tmp_path / "nope" / "trainer_state.json")
    assert "no such file" in _bad_input(tmp_path / "nope.jsonl", "--json")


def test_unknown_format_is_one_line_exit_2(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("step reward\n1 0.5\n", encoding="utf-8")
    assert "unknown log format" in _bad_input(text)
    blob = tmp_path / "weights.bin"
    blob.write_bytes(bytes(range(256)) * 4)
    assert "is not UTF-8" in _bad_input(blob)
    other_json = tmp_path / "config.json"
    other_json.write_text(json.dumps({"model": "x"}, indent=2), encoding="utf-8")
    assert "unknown log format" in _bad_input(other_json)
    empty_dir = tmp_path / "empty_run"
    empty_dir.mkdir()
    assert "no training log in folder" in _bad_input(empty_dir)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew\n{"step": 3, "reward": 0.5}\n', encoding="utf-8")
    assert "line 2: not JSON" in _bad_input(broken)


def test_no_usable_metric_is_one_line_exit_2(tmp_path: Path) -> None:
    flat = tmp_path / "metrics.jsonl"
    flat.write_text("".join(json.dumps({"step": i, "throughput": 3.0, "learning_rate": 1e-6}) + "\n" for i in range(5)))
    line = _bad_input(flat)
    assert "no usable metric" in line and "throughput" in line
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({"log_history": [{"step": 1, "eval_loss": 0.3}, {"train_runtime": 1.0}]}))
    line = _bad_input(state)  # an evaluation alone: its eval_loss is read, and is no stat a detector judges
    assert "no usable metric" in line and "(eval_loss)" in line


def test_trainer_state_eval_rows_nan_and_gaps(tmp_path: Path) -> None:
    """Eval-only rows join the step they were logged at (their eval_* metrics, not their epoch), the summary is
    skipped; NaN is kept as evidence; a missing key is a gap, not a zero."""
    stream = healthy_stream(60, 0)  # an eval row at step 50
    stream[30]["grad_norm"] = math.nan
    path = write_trainer_state(stream, tmp_path / "trainer_state.json")
    data = json.loads(path.read_text())
    del data["log_history"][10]["entropy"]  # step 11  # a gap
    path.write_text(json.dumps(data))
    log = read_log(path)
    assert [s for s, _ in log.rows] == list(range(1, 61))
    assert {k for k in log.keys if k.startswith("eval_")} == {"eval_loss", "eval_runtime"}
    assert "train_runtime" not in log.keys and log.report.overwritten == 0
    assert log.rows[49][1]["eval_loss"] == 0.5 and "loss" in log.rows[49][1]  # step 50: the training row and its eval
    diagnosis = diagnose(path)
    assert math.isnan(diagnosis.series["entropy"][10]) and math.isfinite(diagnosis.series["entropy"][11])
    nonfinite = [f for f in diagnosis.findings if f.detector == "nonfinite"]
    assert nonfinite and nonfinite[0].step == 31 and nonfinite[0].severity == "critical"


def test_wandb_chart_export_columns(tmp_path: Path) -> None:
    """wandb's chart export: ``Step`` and ``<run> - train/<key>`` with ``__MIN``/``__MAX`` columns."""
    path = tmp_path / "export.csv"
    lines = ["Step,run-1 - train/reward,run-1 - train/reward__MIN,run-1 - train/reward__MAX,run-1 - train/entropy"]
    lines += [f"{i},{0.1 * i},0,9,{1.0 - 0.01 * i}" for i in range(1, 11)]
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.format == "wandb-csv" and [s for s, _ in log.rows] == list(range(1, 11))
    assert log.rows[2][1] == {"train/reward": pytest.approx(0.3), "train/entropy": pytest.approx(0.97)}


def test_keys_of_the_issue_map_to_canonical_names() -> None:
    expected = {
        "actor/entropy": "entropy",
        "actor/grad_norm": "grad_norm",
        "actor/pg_clipfrac": "clip_frac",
        "actor/ppo_kl": "kl_old",
        "actor/kl_loss": "kl_ref",
        "critic/score/mean": "reward_mean",
        "response_length/mean": "length_mean",
        "response_length/clip_ratio": "truncated_frac",
        "rollout_corr/k3_kl": "mismatch_kl",
        "training/rollout_actor_probs_pearson_corr": "mismatch_prob_corr",
        "reward": "reward_mean",
        "reward_std": "reward_std",
        "frac_reward_zero_std": "frac_zero_std_groups",
        "entropy": "entropy",
        "kl": "kl_ref",
        "clip_ratio/region_mean": "clip_frac",
        "grad_norm": "grad_norm",
        "completions/mean_length": "length_mean",
        "completions/clipped_ratio": "truncated_frac",
        "sampling/sampling_logp_difference/mean": "mismatch_logp_abs_mean",
        "train/reward": "reward_mean",
        "rlguard/ratio_max": "ratio_max",
        "train/rlguard/kl_old": "kl_old",
    }
    guard_keys = ["rlguard/event/action:scale_lr", "rlguard/guard/lr_scale"]
    report = classify_keys([*expected, "epoch", "timing_s/gen", "eval/loss", "rewards/acc/mean", *guard_keys, "weird"])
    assert report.mapped == dict(sorted(expected.items()))
    assert report.unrecognised == ["weird"]
    # rlguard's own stat wins over the framework's key for the same name
    assert canonical_stats({"kl": 1.0, "rlguard/kl_ref": 2.0}) == {"kl_ref": 2.0}
    assert canonical_stats({"rlguard/kl_ref": 2.0, "kl": 1.0}) == {"kl_ref": 2.0}
    # verl's trainers log the guarded loss's rlguard/<name> under actor/
    assert canonical_stats({"actor/rlguard/nonfinite": 3.0, "actor/entropy": 1.5}) == {"nonfinite": 3.0, "entropy": 1.5}
    assert canonical_stats({"actor/rlguard/guard/skipped": 1.0}) == {}


def test_read_log_errors_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(LogInputError, match="no such file"):
        read_log(tmp_path / "missing.json")


def test_doctor_needs_neither_trl_nor_matplotlib_without_html(tmp_path: Path) -> None:
    """The doctor reads logs where TRL is not installed; ``import rlguard.cli`` does not load matplotlib."""
    path = write_log("trl", failing_stream("kl_old_blowup", 60, 40, 0), tmp_path)
    code = (
        "import sys\n"
        "for name in ('trl', 'transformers', 'matplotlib', 'verl'): sys.modules[name] = None  # import fails\n"
        "from typer.testing import CliRunner\n"
        "from rlguard.cli import app\n"
        f"result = CliRunner().invoke(app, ['doctor', {str(path)!r}, '--json'])\n"
        "assert result.exit_code == 1, result.output\n"
        "assert 'kl_old_blowup' in result.stdout\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_log_of_21_records_is_judged_with_warm_ups_fitted_to_it(tmp_path: Path) -> None:
    """21 records (logged every 20-25 steps): each detector's warm-up is at most a quarter of its observations,
    never under 5 (issue 36, class 4), so an entropy collapse at the 9th record is found and a healthy log judged."""
    from tests.helpers.doctor_logs import shaped_stream

    flat = {"reward_mean": lambda i: 0.3 + 0.01 * (i % 2)}
    healthy = diagnose(write_trainer_state(shaped_stream(21, 0, **flat), tmp_path / "h" / "trainer_state.json"))
    assert healthy.judged and healthy.exit_code == 0, healthy.coverage
    checked, why = healthy.coverage["entropy_collapse"]
    assert checked and "warm-up 5, fitted to the log: 20 by default" in why, why
    collapsed = shaped_stream(21, 0, entropy=lambda i: 0.8 if i < 8 else 0.02, **flat)
    d = diagnose(write_trainer_state(collapsed, tmp_path / "c" / "trainer_state.json"))
    assert any(f.detector == "entropy_collapse" and f.severity == "critical" for f in d.findings), d.findings


def test_the_runs_onset_is_after_the_rewards_last_recovery_and_earlier_incidents_are_in_the_json(
    tmp_path: Path,
) -> None:
    """All completions truncated for 30 steps from index 80 while the reward falls 0.8 -> 0.4 (critical: the budget
    cost reward), then the reward comes back to 0.8; from index 200 the entropy blows up 10x and the reward goes to
    0. The run recovered from the truncation: it is an incident with its own onset, and the run's onset is the
    blow-up's. Without the recovery (the reward stays at 0.4), the run's onset is the truncation's."""
    from tests.helpers.doctor_logs import shaped_stream

    def run(reward_back: float, where: str) -> Diagnosis:
        rows = shaped_stream(
            300,
            11,
            truncated_frac=lambda i: 0.9 if 80 <= i < 110 else 0.02,
            reward_mean=lambda i: 0.0 if i >= 205 else 0.4 if 85 <= i < 115 else 0.8 if i < 85 else reward_back,
            entropy=lambda i: 8.0 if i >= 200 else 0.8,
        )
        return diagnose(write_trainer_state(rows, tmp_path / where / "trainer_state.json"))

    d = run(0.8, "recovered")
    critical = {f.detector: f.step for f in d.findings if f.severity == "critical"}
    assert {"truncation", "entropy_blowup"} <= set(critical) and 80 < critical["truncation"] <= 82, critical
    assert 200 < critical["entropy_blowup"] <= 202 and d.onset == critical["entropy_blowup"], (critical, d.onset)
    (incident,) = d.incidents
    assert incident.excursion.detector == "truncation" and incident.excursion.onset == critical["truncation"]
    # the reward fell at index 85 (step 86; the first window of 5 whose median is below starts a step or two
    # before) and is back at 0.8 from index 115 (step 116)
    assert (incident.level, incident.recovered) == (0.8, 116) and 84 <= incident.fell <= 86, incident
    doc = json.loads(json.dumps(d.to_dict()))
    assert doc["onset"] == d.onset
    assert doc["incidents"] == [
        {
            "detector": "truncation",
            "onset": incident.excursion.onset,
            "end": incident.excursion.end,
            "severity_step": incident.excursion.severity_step,
            "reward_level": 0.8,
            "reward_fell": incident.fell,
            "reward_recovered": 116,
        }
    ]
    printed = runner.invoke(app, ["doctor", str(tmp_path / "recovered")])
    assert printed.exit_code == 1 and "recovered incident: truncation from step" in printed.stdout, printed.output
    assert f"the run's onset, after the reward's last recovery: step {d.onset}" in printed.stdout, printed.output
    stayed = run(0.4, "stayed")
    assert stayed.incidents == [] and stayed.onset == critical["truncation"], (stayed.onset, stayed.incidents)
    assert diagnose(write_log("trl", healthy_stream(60, 0), tmp_path / "healthy")).onset is None
