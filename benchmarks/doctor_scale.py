"""Time and peak memory of ``rlguard doctor`` against the length of a JSONL log, beside rldoctor 0.2.0.

    python benchmarks/doctor_scale.py                  # 1k, 10k, 100k, 1M steps; TRL-, verl- and W&B-shaped rows
    python benchmarks/doctor_scale.py --quick          # 1k and 10k steps, TRL-shaped (seconds)
    python benchmarks/doctor_scale.py --rldoctor PYTHON  # rldoctor 0.2.0 too: the python of a throwaway venv
    python benchmarks/doctor_scale.py --write-only 1000000 --shape trl --out /tmp/trl-1m.jsonl
    python benchmarks/doctor_scale.py --watch 10000 100000 1000000   # rlguard watch's cost per appended record
    python benchmarks/doctor_scale.py --watch 10000 --eval-every 10  # with an evaluation key mapped by its values
    python benchmarks/doctor_scale.py --watch 100000 --half-line     # each poll ends mid-line (a writer mid-record)
    python benchmarks/doctor_scale.py --watch 100000 --collapse 5000 # a critical episode ongoing for 5,000 steps
    python benchmarks/doctor_scale.py --watch 100000 --eval-every 2 --args-record  # per-step keys change at each poll
    python benchmarks/doctor_scale.py --reward-history 100000 1000000  # what a judgement still reads whole

Each log is written once into a temporary folder (a healthy run: noise on every stat, no failure injected) and
judged in a fresh process, one at a time, under ``/usr/bin/time -f '%U %S %M'`` when present (CPU seconds, user and
system, and the peak resident set in KiB), else ``resource.getrusage(RUSAGE_CHILDREN)``. Shapes:

- ``trl``: a flat JSONL of TRL ``GRPOTrainer``'s logged keys (``loss``, ``grad_norm``, ``reward``, ``kl``,
  ``entropy``, ``completions/*``, ``clip_ratio/*``, ...), one ``{"step": ..}`` record per optimizer step.
- ``verl``: verl's file logger, ``{"step": .., "data": {"actor/entropy": .., ...}}``.
- ``wandb``: wandb's ``wandb-history.jsonl`` (``_step``, ``_runtime``, ``_timestamp``, ``train/<TRL key>``).

Run with ``OMP_NUM_THREADS=1`` (one core); timings are side by side in one run, on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1_000, 10_000, 100_000, 1_000_000)
SHAPES = ("trl", "verl", "wandb")
CHUNK = 10_000
#: rldoctor 0.2.0 on one log, as benchmarks/doctor_real_logs.py runs it (its Python API: load, then diagnose)
RLDOCTOR = "import sys, rl_doctor; rl_doctor.diagnose(rl_doctor.load_run(sys.argv[1]))"

#: TRL GRPOTrainer's logged keys (trl/trainer/grpo_trainer.py ``_metrics``), with a healthy level and noise
TRL_STATS = {
    "loss": (0.01, 0.01),
    "grad_norm": (0.5, 0.1),
    "learning_rate": (1e-6, 0.0),
    "num_tokens": (0.0, 0.0),
    "completions/mean_length": (180.0, 10.0),
    "completions/min_length": (40.0, 5.0),
    "completions/max_length": (400.0, 20.0),
    "completions/clipped_ratio": (0.02, 0.005),
    "completions/mean_terminated_length": (170.0, 10.0),
    "rewards/accuracy_reward/mean": (0.5, 0.05),
    "rewards/accuracy_reward/std": (0.3, 0.02),
    "reward": (0.5, 0.05),
    "reward_std": (0.3, 0.02),
    "frac_reward_zero_std": (0.1, 0.02),
    "kl": (0.01, 0.002),
    "entropy": (0.8, 0.03),
    "clip_ratio/low_mean": (0.001, 0.0002),
    "clip_ratio/high_mean": (0.001, 0.0002),
    "clip_ratio/region_mean": (0.002, 0.0004),
}
#: verl's logged keys (verl/trainer/ppo/metric_utils.py), level and noise
VERL_STATS = {
    "actor/pg_loss": (0.01, 0.01),
    "actor/entropy": (0.8, 0.03),
    "actor/grad_norm": (0.5, 0.1),
    "actor/kl_loss": (0.01, 0.002),
    "actor/ppo_kl": (0.0005, 0.0001),
    "actor/pg_clipfrac": (0.002, 0.0004),
    "actor/lr": (1e-6, 0.0),
    "critic/score/mean": (0.5, 0.05),
    "critic/score/max": (1.0, 0.0),
    "critic/score/min": (0.0, 0.0),
    "response_length/mean": (180.0, 10.0),
    "response_length/clip_ratio": (0.02, 0.005),
    "timing_s/gen": (1.5, 0.1),
    "training/global_step": (0.0, 0.0),
}


def _columns(stats: dict[str, tuple[float, float]], first: int, n: int, rng: np.random.Generator) -> dict[str, list]:
    steps = np.arange(first, first + n)
    cols = {}
    for key, (level, noise) in stats.items():
        values = level + noise * rng.standard_normal(n)
        if level > 0:
            values = np.abs(values)
        cols[key] = values.round(6).tolist()
    for key in ("num_tokens", "training/global_step"):
        if key in cols:
            cols[key] = (steps * (1000 if key == "num_tokens" else 1)).tolist()
    return cols


def write_log(
    shape: str,
    steps: int,
    path: Path,
    seed: int = 0,
    eval_every: int = 0,
    collapse_at: int | None = None,
    args_record: bool = False,
) -> Path:
    """A healthy ``shape``-shaped JSONL log of ``steps`` optimizer steps (module docstring) at ``path``;
    ``eval_every``: an evaluation record of its own every that many steps, merged into its step's row (the key the
    doctor maps by its values onto ``eval_score``: TRL's ``eval_accuracy``, verl's ``val-core/<task>/acc/mean@1``,
    W&B's ``eval/accuracy``), none at 0. ``collapse_at``: from that step on, the run collapses and stays collapsed
    (:func:`_collapse`). ``args_record``: a first record of the run's arguments, without a stat (no key is then
    logged at every row)."""
    rng, evals = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    stats = VERL_STATS if shape == "verl" else TRL_STATS
    with path.open("w", encoding="utf-8") as fh:
        if args_record:
            fh.write(json.dumps({"step": 0, "args/learning_rate": 1e-6, "args/num_generations": 8}) + "\n")
        for first in range(1, steps + 1, CHUNK):
            n = min(CHUNK, steps + 1 - first)
            cols = _columns(stats, first, n, rng)
            if collapse_at is not None:
                _collapse(cols, first, collapse_at, rng)
            lines = []
            for i in range(n):
                step = first + i
                row = {k: v[i] for k, v in cols.items()}
                if shape == "trl":
                    record = {"step": step, "epoch": round(step / steps, 6), **row}
                elif shape == "verl":
                    record = {"step": step, "data": row}
                else:
                    train = {f"train/{k}": v for k, v in row.items()}
                    record = {"_step": step, "_runtime": 2.0 * step, "_timestamp": 1.7e9 + 2.0 * step, **train}
                lines.append(json.dumps(record))
                if eval_every and step % eval_every == 0:
                    lines.append(
                        json.dumps(_eval_record(shape, step, 0.3 + 0.4 * step / steps + evals.normal(0, 0.02)))
                    )
            fh.write("\n".join(lines) + "\n")
    return path


#: a collapse (:func:`_collapse`): the reward falls to this level (healthy 0.5) and the policy's entropy to this
#: (healthy 0.8), the gradient norm is this many times its healthy level
COLLAPSE_REWARD, COLLAPSE_ENTROPY, COLLAPSE_GRAD = 0.05, 0.05, 20.0


def _collapse(cols: dict[str, list], first: int, at: int, rng: np.random.Generator) -> None:
    """The rows of ``cols`` (steps ``first``, ...) from step ``at`` on, collapsed: the reward (and the reward's score
    in verl's keys) at :data:`COLLAPSE_REWARD`, the entropy at :data:`COLLAPSE_ENTROPY`, the gradient norm
    :data:`COLLAPSE_GRAD` times higher; noise as before. The reward rises before it (0.3 to 0.5 over the first rows
    of the log) so that the fall is from an established peak."""
    n = len(next(iter(cols.values())))
    steps = np.arange(first, first + n)
    for key in ("reward", "rewards/accuracy_reward/mean", "critic/score/mean"):
        if key in cols:
            values = np.array(cols[key])
            values -= 0.2 * np.clip(1 - steps / 1000, 0, 1)  # the rise: 0.3 at step 0 to 0.5 at step 1000
            down = steps >= at
            values[down] = COLLAPSE_REWARD + 0.01 * rng.standard_normal(int(down.sum()))
            cols[key] = np.abs(values).round(6).tolist()
    for key, scale in (("entropy", 0.0), ("actor/entropy", 0.0), ("grad_norm", 1.0), ("actor/grad_norm", 1.0)):
        if key in cols:
            values = np.array(cols[key])
            down = steps >= at
            if scale:
                values[down] *= COLLAPSE_GRAD
            else:
                values[down] = COLLAPSE_ENTROPY + 0.005 * rng.standard_normal(int(down.sum()))
            cols[key] = np.abs(values).round(6).tolist()


def _eval_record(shape: str, step: int, accuracy: float) -> dict[str, object]:
    """An evaluation record of ``shape`` at ``step`` (:func:`write_log`)."""
    if shape == "trl":
        return {"step": step, "eval_accuracy": accuracy}
    if shape == "verl":
        return {"step": step, "data": {"val-core/gsm8k/acc/mean@1": accuracy}}
    return {"_step": step, "eval/accuracy": accuracy}


def measure(command: list[str]) -> tuple[float, float, int]:
    """(CPU seconds, user and system, peak resident MB, exit code) of ``command`` in a fresh process: CPU time,
    not wall time, so that a shared machine's other work does not count."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    timer = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    if timer is not None:
        with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
            proc = subprocess.run(
                [timer, "-o", out.name, "-f", "%U %S %M", *command],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            user, system, kib = Path(out.name).read_text().split()[-3:]
            return float(user) + float(system), int(kib) / 1024, proc.returncode
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    peak = max(after.ru_maxrss, before.ru_maxrss)  # the largest child so far: run largest last
    return cpu, peak / 1024, proc.returncode


def watch_cost(
    shape: str,
    steps: int,
    folder: Path,
    polls: int = 5,
    per_poll: int = 200,
    eval_every: int = 0,
    *,
    half_line: bool = False,
    collapse: int | None = None,
    args_record: bool = False,
) -> dict[str, float]:
    """What ``rlguard watch`` spends on a ``shape``-shaped JSONL of ``steps`` records that grows by ``per_poll``
    records ``polls`` times, judged after each (every poll: more often than the watch's schedule judges), in CPU
    seconds of this process: ``read`` (the appended bytes parsed and merged) and ``fed`` (the appended steps through
    the doctor's fold, the guard's observe) per appended record, ``hindsight`` (the rest of a judgement: the
    table's snapshot, the mapping of keys, the consequence rule over the timeline) and ``view`` (the watch's live
    view of the diagnosis: its latest stats and findings) per judgement. ``eval_every``, ``args_record``:
    :func:`write_log`'s; ``half_line``: each write ends in the middle of a record (a writer mid-line when the watch
    reads); ``collapse``: the run collapsed that many records before the end of the first ``steps`` and stays
    collapsed (a critical episode ongoing at every judgement)."""
    sys.path.insert(0, str(ROOT))
    from rlguard.doctor.fold import DoctorFold
    from rlguard.doctor.stream import JsonlFollower
    from rlguard.watch import live_view

    whole = write_log(
        shape,
        steps + polls * per_poll,
        folder / f"watch-{shape}-{steps}-all.jsonl",
        eval_every=eval_every,
        collapse_at=None if collapse is None else steps - collapse,
        args_record=args_record,
    )
    data = whole.read_bytes()
    whole.unlink()
    ends = np.cumsum([0] + [len(line) for line in data.splitlines(keepends=True)])

    def upto(records: int) -> int:
        """The bytes of the first ``records`` records, and half the next one's where ``half_line``."""
        if half_line and records + 1 < len(ends):
            return int(ends[records] + ends[records + 1]) // 2
        return int(ends[min(records, len(ends) - 1)])

    path = folder / f"watch-{shape}-{steps}.jsonl"
    path.write_bytes(data[: upto(steps)])
    follower, fold = JsonlFollower(path), DoctorFold(path)
    follower.poll()
    fold.judge(follower.log(), final=False)
    fed = [0.0]
    observe = fold._observe

    def timed_observe(*args: object) -> None:
        start = time.process_time()
        observe(*args)  # type: ignore[arg-type]
        fed[0] += time.process_time() - start

    fold._observe = timed_observe  # type: ignore[method-assign,assignment]
    read = judged = view = 0.0
    for k in range(polls):
        with path.open("ab") as fh:
            fh.write(data[upto(steps + k * per_poll) : upto(steps + (k + 1) * per_poll)])
        start = time.process_time()
        follower.poll()
        middle = time.process_time()
        d = fold.judge(follower.log(), final=False)
        end = time.process_time()
        live_view(path, d, None, "watching")
        read, judged, view = read + middle - start, judged + end - middle, view + time.process_time() - end
    appended = polls * per_poll
    return {
        "read_us": 1e6 * read / appended,
        "fed_us": 1e6 * fed[0] / appended,
        "hindsight_s": (judged - fed[0]) / polls,
        "view_s": view / polls,
        "per_poll": per_poll,
        "replays": fold.replays,
        "critical": sum(f.severity == "critical" for f in d.findings),
    }


def reward_history_cost(steps: int, seed: int = 0, polls: int = 5, per_poll: int = 200) -> dict[str, float]:
    """CPU seconds of the two parts of a judgement that ask of the whole reward series, on ``steps`` rewards (a
    rise from 0 to 1 with noise): the established peak (one position asked) and the reward's recovery after a
    critical excursion 500 records before the end. Read whole (``PeakHistory``; ``_reward_recovery`` with a
    history of its own), as a judgement from scratch does; and kept (the watch's ``RewardHistory``, in the fold's
    index), per judgement after ``per_poll`` rewards appended, ``polls`` times, asked at the same position (an
    ongoing episode's first finding; a new episode's first costs a sort of the differences before it, once)."""
    sys.path.insert(0, str(ROOT))
    from rlguard.guards.consequence.excursions import _reward_recovery
    from rlguard.guards.consequence.history import RewardHistory
    from rlguard.guards.consequence.peak import PeakHistory
    from rlguard.guards.consequence.rule import ConsequenceRule

    rng = np.random.default_rng(seed)
    total = steps + polls * per_poll
    every = np.minimum(1.0, np.arange(total) / total + rng.normal(0, 0.05, total)).tolist()
    rewards, positions = array("d", every[:steps]), array("q", range(total))
    rule = ConsequenceRule()
    start = time.process_time()
    PeakHistory(rewards, rule).established(steps - 100)
    middle = time.process_time()
    _reward_recovery(positions, rewards, steps - 500, rule)
    end = time.process_time()
    history = RewardHistory()
    history.read(rewards)
    history.established(steps - 100, rule)
    _reward_recovery(positions, rewards, steps - 500, rule, history)
    peak = recovery = 0.0
    for k in range(polls):
        rewards.extend(every[steps + k * per_poll : steps + (k + 1) * per_poll])
        t0 = time.process_time()
        history.read(rewards)
        history.established(steps - 100, rule)  # an episode's first finding: asked again at each judgement
        t1 = time.process_time()
        _reward_recovery(positions, rewards, steps - 500, rule, history)
        peak, recovery = peak + t1 - t0, recovery + time.process_time() - t1
    return {
        "peak_s": middle - start,
        "recovery_s": end - middle,
        "kept_peak_s": peak / polls,
        "kept_recovery_s": recovery / polls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1k and 10k steps, TRL-shaped")
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--shapes", nargs="*", default=None, choices=SHAPES)
    parser.add_argument("--rldoctor", type=Path, default=None, help="python of a venv with rldoctor 0.2.0")
    parser.add_argument("--rldoctor-max", type=int, default=10_000, help="largest log given to rldoctor")
    parser.add_argument("--write-only", type=int, default=None, metavar="STEPS", help="write one log and exit")
    parser.add_argument("--shape", default="trl", choices=SHAPES)
    parser.add_argument("--watch", type=int, nargs="*", default=None, metavar="STEPS", help="the watch's cost")
    parser.add_argument("--reward-history", type=int, nargs="*", default=None, metavar="STEPS")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--eval-every",
        type=int,
        default=0,
        metavar="N",
        help="an evaluation record every N steps (--watch, --write-only)",
    )
    parser.add_argument("--half-line", action="store_true", help="--watch: each poll ends mid-record")
    parser.add_argument(
        "--collapse",
        type=int,
        default=None,
        metavar="N",
        help="--watch: the run collapsed N records before the end of the log (a critical episode ongoing)",
    )
    parser.add_argument("--args-record", action="store_true", help="a first record of the run's arguments")
    parser.add_argument("--per-poll", type=int, default=200, metavar="N", help="--watch: records appended per poll")
    args = parser.parse_args()
    if args.reward_history is not None:
        print(
            "| rewards | established peak, read whole CPU s | recovery after an excursion, read whole CPU s "
            "| established peak, kept ms / judgement | recovery, kept ms / judgement |"
        )
        print("|---|---|---|---|---|")
        for steps in args.reward_history or (100_000, 1_000_000):
            c = reward_history_cost(steps)
            print(
                f"| {steps} | {c['peak_s']:.2f} | {c['recovery_s']:.2f} | {1e3 * c['kept_peak_s']:.2f} "
                f"| {1e3 * c['kept_recovery_s']:.2f} |",
                flush=True,
            )
        return
    if args.write_only is not None:
        out = args.out or Path(f"{args.shape}-{args.write_only}.jsonl")
        write_log(args.shape, args.write_only, out, eval_every=args.eval_every, args_record=args.args_record)
        return
    if args.watch is not None:
        case = ", ".join(
            c
            for c in (
                "half-written last line" if args.half_line else "",
                f"collapsed {args.collapse} records before" if args.collapse is not None else "",
                f"evaluation every {args.eval_every}" if args.eval_every else "",
                "arguments' record first" if args.args_record else "",
                f"{args.per_poll} records a poll" if args.per_poll != 200 else "",
            )
            if c
        )
        print(
            "| case | shape | records in the log | read µs / record | fed µs / record | rest of a judgement ms "
            "| rest µs / record | live view ms | replays | critical findings |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory(prefix="rlguard-watch-") as tmp:
            for shape in args.shapes or ("trl",):
                for steps in args.watch or (10_000, 100_000, 1_000_000):
                    c = watch_cost(
                        shape,
                        steps,
                        Path(tmp),
                        eval_every=args.eval_every,
                        half_line=args.half_line,
                        collapse=args.collapse,
                        args_record=args.args_record,
                        per_poll=args.per_poll,
                    )
                    print(
                        f"| {case or 'healthy'} | {shape} | {steps} | {c['read_us']:.0f} | {c['fed_us']:.0f} "
                        f"| {1e3 * c['hindsight_s']:.1f} | {1e6 * c['hindsight_s'] / c['per_poll']:.0f} "
                        f"| {1e3 * c['view_s']:.1f} | {c['replays']:.0f} | {c['critical']:.0f} |",
                        flush=True,
                    )
        return
    sizes = args.sizes or ((1_000, 10_000) if args.quick else SIZES)
    shapes = args.shapes or (("trl",) if args.quick else SHAPES)
    print("| shape | steps | MB on disk | rlguard CPU s | rlguard peak MB | exit | rldoctor CPU s | rldoctor peak MB |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="rlguard-scale-") as tmp:
        for shape in shapes:
            for steps in sizes:
                log = write_log(shape, steps, Path(tmp) / f"{shape}-{steps}.jsonl")
                size = log.stat().st_size / 1e6
                cpu, peak, code = measure([sys.executable, "-m", "rlguard", "doctor", str(log)])
                other = "-", "-"
                if args.rldoctor is not None and steps <= args.rldoctor_max:
                    cmd = [str(args.rldoctor), "-c", RLDOCTOR, str(log)]
                    r_cpu, r_peak, _ = measure(cmd)
                    other = f"{r_cpu:.1f}", f"{r_peak:.0f}"
                print(
                    f"| {shape} | {steps} | {size:.1f} | {cpu:.1f} | {peak:.0f} | {code} | {other[0]} | {other[1]} |",
                    flush=True,
                )
                log.unlink()


if __name__ == "__main__":
    main()
