"""`rlguard watch`: a log that grows while it is watched (a writer thread or process appending), TRL's checkpoint
folders, the end of the job, Ctrl-C, and the doctor's exit codes."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rlguard.cli import app
from rlguard.doctor import diagnose
from rlguard.guards import Event
from rlguard.watch import job_ended, watch
from tests.helpers.doctor_logs import TRL_KEYS, append_verl, renamed, verl_line
from tests.helpers.synthetic import failing_stream, healthy_stream

pytestmark = pytest.mark.serial  # the watch races a writer thread or process (make test runs it alone)
ROOT = Path(__file__).resolve().parents[2]


def _capture() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=160, color_system=None), buffer


def test_watch_follows_a_growing_verl_log_to_the_critical_end(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    stream = failing_stream("entropy_collapse", steps=90, onset=45, seed=0)
    log.write_text(verl_line(1, stream[0]))
    writer = threading.Thread(target=append_verl, args=(log, stream[1:], 0.02, 20, 2))
    console, buffer = _capture()
    writer.start()
    result = watch(tmp_path, console=console, interval=0.05, idle=1.0)
    writer.join()
    assert result.ended == "no change for 1 s"
    # it saw the log grow: several reads, each at least as long as the one before, ending with every step
    assert len(result.refreshes) >= 5 and result.refreshes == sorted(result.refreshes)
    assert result.refreshes[0] < 45 and result.refreshes[-1] == 90  # began early; saw all 90 steps at the end
    assert result.error is None  # torn lines were read again once whole
    # the same verdict as the doctor on the finished log
    assert result.exit_code == 1 == diagnose(tmp_path).exit_code
    assert result.diagnosis is not None
    assert "entropy_collapse" in {f.detector for f in result.diagnosis.findings}
    frames = buffer.getvalue()
    assert "rlguard watch" in frames and "latest stats" in frames  # the live view was drawn
    assert "watch ended: no change for 1 s; rlguard watch exits 1 (a critical finding)" in frames


def _trl_state(stream: list[dict[str, float]], *, finished: bool) -> str:
    history: list[dict[str, float]] = [{"step": i, **renamed(s, TRL_KEYS)} for i, s in enumerate(stream, start=1)]
    if finished:
        history.append({"step": len(stream), "train_runtime": 12.0, "train_loss": 0.1})
    return json.dumps({"global_step": len(stream), "log_history": history})


def _trl_job(out: Path, stream: list[dict[str, float]], save_steps: int, pause: float) -> None:
    """A TRL output_dir as the Trainer fills it: a checkpoint-N/trainer_state.json every save_steps, the guard's
    events.jsonl, and the final trainer_state.json with the end-of-training summary."""
    for n in range(save_steps, len(stream) + 1, save_steps):
        folder = out / f"checkpoint-{n}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(_trl_state(stream[:n], finished=False))
        if n == 2 * save_steps:
            event = Event(n, "action:set_clip", "warn", 0.67, "kl_old 0.05 above 1.5 x its target: clip x0.67")
            with (out / "events.jsonl").open("a") as fh:
                fh.write(json.dumps(event.to_dict()) + "\n")
        time.sleep(pause)
    (out / "trainer_state.json").write_text(_trl_state(stream, finished=True))


def test_watch_follows_trl_checkpoints_and_ends_with_the_training(tmp_path: Path) -> None:
    stream = healthy_stream(100, seed=3)
    job = threading.Thread(target=_trl_job, args=(tmp_path, stream, 20, 0.5))
    console, buffer = _capture()
    job.start()
    result = watch(tmp_path, console=console, interval=0.05)
    job.join()
    assert result.ended == "TRL wrote its end-of-training summary"
    assert result.exit_code == 0 and result.error is None
    assert result.diagnosis is not None and result.diagnosis.steps[-1] == 100
    assert [e.detector for e in result.diagnosis.live_events] == ["action:set_clip"]
    assert {20, 40, 60, 80, 100} <= set(result.refreshes)  # each checkpoint was read as it appeared
    frames = buffer.getvalue()
    assert "checkpoint-40" in frames and "action:set_clip" in frames  # shown live, before the end


def test_watch_ends_when_the_guard_halts(tmp_path: Path) -> None:
    (tmp_path / "trainer_state.json").write_text(_trl_state(healthy_stream(60, seed=1), finished=False))
    halt = Event(60, "action:halt", "critical", 1.0, "kl_ref_blowup critical for 25 steps")
    (tmp_path / "events.jsonl").write_text(json.dumps(halt.to_dict()) + "\n")
    console, _ = _capture()
    result = watch(tmp_path, console=console, interval=0.05)
    assert result.ended == "the guard halted the run" and result.exit_code == 1  # a critical live event


def test_watch_once_and_bad_input_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["watch", "--once", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no such file or folder" in missing.output
    (tmp_path / "short.jsonl").write_text("".join(verl_line(i, s) for i, s in enumerate(healthy_stream(3, 0), 1)))
    assert runner.invoke(app, ["watch", "--once", str(tmp_path / "short.jsonl")]).exit_code == 3  # too few steps
    assert runner.invoke(app, ["watch", "--once", "--map", "nonsense", str(tmp_path)]).exit_code == 2


def _start_watch(run: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "rlguard", "watch", str(run), "--interval", "0.1", *extra]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # printed once the watch is following the files
    assert first.startswith("rlguard watch"), first
    return proc


@pytest.mark.slow
def test_cli_watch_follows_a_writer_process_until_it_exits(tmp_path: Path) -> None:
    stream = failing_stream("kl_ref_blowup", steps=80, onset=40, seed=2)
    (tmp_path / "stream.json").write_text(json.dumps(stream))
    writer_code = (
        "import json, sys, time\n"
        "from tests.helpers.doctor_logs import append_verl\n"
        "from pathlib import Path\n"
        "folder = Path(sys.argv[1])\n"
        "append_verl(folder / 'metrics.jsonl', json.loads((folder / 'stream.json').read_text()), 0.03)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen([sys.executable, "-c", writer_code, str(tmp_path)], env=env)
    watcher = _start_watch(tmp_path, "--pid", str(writer.pid))
    out, _ = watcher.communicate(timeout=120)
    writer.wait(timeout=60)
    # the writer exited 0; the 1 is the watch's verdict, and the watch, not the writer's parent, cannot know its code
    assert writer.returncode == 0
    unknown = f"process {writer.pid} exited (its exit status is unknown: the watch is not its parent)"
    assert f"watch ended: {unknown}; rlguard watch exits 1 (a critical finding)" in out, out
    assert watcher.returncode == 1 and "kl_ref_blowup" in out


@pytest.mark.slow
def test_cli_watch_on_ctrl_c_exits_with_the_doctor_s_code(tmp_path: Path) -> None:
    (tmp_path / "trainer_state.json").write_text(_trl_state(healthy_stream(80, seed=4), finished=False))
    watcher = _start_watch(tmp_path)
    time.sleep(0.5)
    watcher.send_signal(signal.SIGINT)
    out, _ = watcher.communicate(timeout=60)
    assert "watch ended: interrupted; rlguard watch exits 0 (no critical finding)" in out, out
    assert watcher.returncode == 0


_TRL_JOB = """
import sys, time
from pathlib import Path
from transformers import TrainerCallback
from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.tasks.hf import addition_dataset, addition_reward, cpu_training_arguments, save_tiny_llama

class Pause(TrainerCallback):  # a second after each checkpoint, as a real step would take
    def on_save(self, args, state, control, **kwargs):
        time.sleep(1.0)

out = Path(sys.argv[1])
model = save_tiny_llama(out.parent / "model")
args = GuardedGRPOConfig(
    output_dir=str(out), objective="gspo", guard="default", per_device_train_batch_size=8, num_generations=4,
    max_completion_length=4, max_steps=6, logging_steps=1, save_strategy="steps", save_steps=2, disable_tqdm=True,
    **cpu_training_arguments(),
)
trainer = GuardedGRPOTrainer(
    model=str(model), reward_funcs=addition_reward, args=args, train_dataset=addition_dataset(32), callbacks=[Pause()]
)
trainer.train()
"""


@pytest.mark.slow
def test_watch_follows_a_real_trl_run_from_before_its_first_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen([sys.executable, "-c", _TRL_JOB, str(out)], env=env, stderr=subprocess.PIPE, text=True)
    console, _ = _capture()
    try:
        result = watch(out, console=console, interval=0.2, pid=job.pid, idle=300)
    finally:
        _, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    # it waited for the first record, read the callback's metrics file as it grew (how often it judged depends on the
    # machine's timing), and ended with the last checkpoint, which TRL's state says is the last
    assert result.ended == "TRL saved its last checkpoint (step 6 of 6)", (result.ended, result.error)
    assert result.refreshes and result.refreshes[-1] == 6, result.refreshes
    assert result.diagnosis is not None and result.diagnosis.log.path == out / "rlguard_metrics.jsonl"
    assert result.exit_code == 3  # six logged steps: read, but shorter than the detectors' warm-up


def test_the_end_of_a_pid_says_its_exit_code_only_where_the_watch_can_know_it(tmp_path: Path) -> None:
    """A process the watch is not the parent of (here reaped by its Popen) ends with its exit code unknown (only a
    parent can read it), and the final line names the code as the watch's own verdict; a child of the watch's
    process is reaped and its own code said."""
    reaped = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    while reaped.poll() is None:
        time.sleep(0.01)
    unknown = f"process {reaped.pid} exited (its exit status is unknown: the watch is not its parent)"
    assert job_ended(None, reaped.pid) == unknown
    (tmp_path / "short.jsonl").write_text("".join(verl_line(i, s) for i, s in enumerate(healthy_stream(3, 0), 1)))
    console, buffer = _capture()
    result = watch(tmp_path / "short.jsonl", console=console, interval=0.05, pid=reaped.pid)
    assert result.exit_code == 3
    assert buffer.getvalue().rstrip().endswith(f"watch ended: {unknown}; rlguard watch exits 3 (could not judge)")
    zombie = os.posix_spawn(sys.executable, [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
    while Path(f"/proc/{zombie}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)  # exited, not yet reaped: the watch's own child
    assert job_ended(None, zombie) == f"process {zombie} exited with exit code 3"
