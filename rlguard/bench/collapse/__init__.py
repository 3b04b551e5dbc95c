"""Collapse benchmark: how often GRPO-family training collapses under known stressors, with and without the guard.

    python benchmarks/collapse/run.py --task short [--quick] [--workers 2] [--seeds 8] [--resume]
    python benchmarks/collapse/run.py --task long  [--quick] [--workers 2] [--seeds 8] [--resume]
    python benchmarks/collapse/run.py --task long --report-only      # rebuild the report from runs.jsonl

One harness, two tasks. The harness (:mod:`.spec` what a run is, :mod:`.verdict` the collapse definition,
:mod:`.loop` one run, :mod:`.grid` the grid, its log and order, :mod:`.report` the outputs, :mod:`.cli` the
command line) trains every run with one compact GRPO loop in plain torch (:func:`~.loop.run_one`): per rollout
batch the task's engine samples ``group_size`` completions for each of ``num_prompts`` prompts, the verifier scores
them, group advantages (:func:`~rlguard.core_losses.group_advantages`), then ``minibatches`` optimizer steps on
slices of the batch with the real objective (:func:`~rlguard.core_losses.get_objective`, the paper's defaults);
every slice after the first is off-policy by one step more, as with TRL's ``steps_per_generation`` or verl's
mini-batches (without it ratios are 1 and no objective clips). With a guard, every optimizer step's stats
(:func:`~rlguard.guards.collect_step_stats`) go to ``Guard(GuardConfig.preset(guard))`` and its decision is carried
out by :func:`~rlguard.guards.actuation.apply_decision` on the plain-torch
:class:`~rlguard.guards.actuation.torch_actuator.TorchActuator`, the same executor as the adapters'.

pi_old (``old_logprobs``, a grid dimension: ``--old-logprobs engine,trainer``): ``engine`` [default] takes the
engine's log-probs as the old ones (no recomputation by the trainer), so the first slice's ratio compares trainer
with engine; ``trainer`` recomputes them with the trainer's model before the batch's first update, as verl does
by default, and passes the engine's as ``rollout_logprobs`` (for rollout corrections and mismatch stats).

A task is a subclass of :class:`~.spec.BaseRunConfig` (its model's fields, calibrated defaults and five hooks:
model, warm start, engine under the stressor, sampler, trainer pass) and a :class:`~.grid.TaskSpec` (default grid,
``--quick``, report layout):

- ``short`` (:mod:`.tiny`, results in ``benchmarks/collapse/results``): the tiny GRU of :mod:`rlguard.tasks.tiny`
  on single-digit addition, at most 4 sampled tokens; described below.
- ``long`` (:mod:`rlguard.bench.collapse_long`, results in ``benchmarks/collapse_long/results``): 33-token
  completions, a dense or top-2 MoE transformer and a bf16 rollout engine; design and calibration in its package.

The short task. Warm start: ``warm_start_steps`` [100] supervised steps on correct answers of prompts from a
separate seed stream give the policy the answer format and some arithmetic, as RL fine-tuning starts from an SFT
model; unstressed runs then go from a reward of about 0.4 to 0.45-0.7 in the 100 rollout batches. Stressors (each
a knob of :class:`~.tiny.TinyStressor`, defaults in brackets):

- ``none``: no perturbation.
- ``mismatch``: training-inference mismatch. Completions are sampled from a copy of the policy whose weights
  carry Gaussian noise of ``mismatch_noise`` [0.3] times each tensor's RMS, drawn afresh per rollout, and the
  engine's log-probs are that copy's, computed from bfloat16 logits (mean |log-prob gap| about 0.15 on the
  warm-started model).
- ``high_lr``: the learning rate times ``lr_multiplier`` [5].
- ``stale``: every batch is sampled by the policy of ``stale_steps`` [8] rollout batches ago (asynchronous RL);
  old log-probs are that stale policy's, the ratio is against the current one.
- ``moe``: the model is :class:`~rlguard.tasks.moe.TinyMoELM` (top-1 routing over 4 experts) and the rollout
  engine's router carries Gaussian noise of ``router_noise`` [1.0] times the router's RMS, drawn afresh per
  rollout, so that the experts chosen at rollout differ from those the trainer recomputes (about 16 % of tokens
  on the warm-started model); routing also shifts between the two minibatch updates of a batch, as in the GSPO
  paper's MoE discussion.

Collapse (fixed before the recorded grids; :func:`collapse_verdict`, one definition for both tasks, each with its
constants). ``r_t`` is the mean reward of rollout batch ``t`` (``r_0`` is the warm-started policy's), ``m_t`` its
trailing mean over ``window`` [10] batches (fewer at the start), ``e_t`` likewise for the mean token entropy. A run
has collapsed when any of:

1. non-finite: the loss, the gradient norm or a weight became NaN/Inf (the run stops there);
2. halted: the guard halted the run (it did not finish training, so it counts as a failure);
3. reward collapse: the running peak ``P_t = max(m_s, warmup <= s <= t)`` (``warmup`` [0]: the peak includes
   the warm-started level) reached at least ``min_peak`` [0.3 short, 0.2 long] and from some step ``t0`` to the
   end ``m_t < drop * P_t`` (``drop`` [0.5]) for at least ``window`` steps;
4. entropy collapse: from some ``t0`` to the end ``e_t < entropy_drop * e_start`` (``entropy_drop`` [0.1],
   ``e_start`` the mean entropy of the first ``window`` batches) for at least ``window`` steps, while the final
   ``m_t`` is below ``solved`` [0.95] (a collapsed entropy with every answer right is convergence, not collapse).

Steps to collapse is ``t0``, the first batch of the final collapsed stretch (the stop step for 1 and 2).

Reproducibility: on one machine a run's curves are bit-identical whatever ran before it in the process and
whether it runs in the main process or a worker (``tests/bench/test_collapse.py``). Across machines they are not:
training is chaotic, and another CPU's last-bit differences (MKL picks its kernels by CPU model, ATen by vector
width) grow into other curves within 50-100 batches under ``mismatch`` and ``moe``. Each run records
:func:`~.spec.numerics` in ``runs.jsonl``, and ``--resume`` warns when the runs it keeps were recorded on other
numerics (or before runs recorded them): compare curves only between equal fingerprints, and collapse rates across
machines. A report lists runs in the grid's order, whatever order the log holds them in.
"""

from rlguard.bench.collapse.cli import build_parser, main, split_names, task_specs
from rlguard.bench.collapse.grid import TaskSpec, build_grid, canonical_order, read_log, run_grid
from rlguard.bench.collapse.loop import MismatchStats, mismatch_stats, run_one, warm_started_model
from rlguard.bench.collapse.report import ReportLayout, write_results
from rlguard.bench.collapse.spec import (
    GUARDS,
    OLD_LOGPROBS,
    BaseRunConfig,
    BaseStressor,
    GuardName,
    OldLogprobs,
    RunResult,
    TrainerPass,
    numerics,
    same_numerics,
)
from rlguard.bench.collapse.tiny import (
    OBJECTIVES,
    STRESSORS,
    TINY_TASK,
    TinyRunConfig,
    TinyStressor,
    behaviour_policy,
    effective_lr,
    perturbed_copy,
    warm_start,
)
from rlguard.bench.collapse.verdict import CollapseVerdict, collapse_verdict

RunConfig = TinyRunConfig  # the default task's run (``rlguard bench collapse``)
Stressor = TinyStressor  # the default task's stressors

__all__ = [
    "GUARDS",
    "OBJECTIVES",
    "OLD_LOGPROBS",
    "STRESSORS",
    "TINY_TASK",
    "BaseRunConfig",
    "BaseStressor",
    "CollapseVerdict",
    "GuardName",
    "MismatchStats",
    "OldLogprobs",
    "ReportLayout",
    "RunConfig",
    "RunResult",
    "Stressor",
    "TaskSpec",
    "TinyRunConfig",
    "TinyStressor",
    "TrainerPass",
    "behaviour_policy",
    "build_grid",
    "build_parser",
    "canonical_order",
    "collapse_verdict",
    "effective_lr",
    "main",
    "mismatch_stats",
    "numerics",
    "perturbed_copy",
    "read_log",
    "run_grid",
    "run_one",
    "same_numerics",
    "split_names",
    "task_specs",
    "warm_start",
    "warm_started_model",
    "write_results",
]
