"""Collapse benchmark: how often GRPO-family training collapses under known stressors, with and without the guard.

    python benchmarks/collapse/run.py [--quick] [--workers 2] [--seeds 8] [--out benchmarks/collapse/results]

Each run trains the tiny GRU of :mod:`rlguard.tasks.tiny` on single-digit addition with a compact GRPO loop
(pure torch, one thread): sample ``group_size`` [8] completions for each of ``num_prompts`` [8] prompts, score
them, compute group advantages (:func:`~rlguard.core_losses.group_advantages`), then take ``minibatches`` [2]
optimizer steps on slices of the batch with the real objective (:func:`~rlguard.core_losses.get_objective`, the
paper's defaults); the old log-probs are those of the policy that sampled, so the second minibatch is off-policy
by one step, as with TRL's ``steps_per_generation`` or verl's mini-batches (without it ratios are 1 and no
objective clips). With ``guard="default"`` every optimizer step's stats
(:func:`~rlguard.guards.collect_step_stats`) go to ``Guard(GuardConfig.preset("default"))`` and its decision is
carried out by :func:`~rlguard.guards.actuator.apply_decision` on the plain-torch
:class:`~rlguard.guards.actuator.TorchActuator`, the same executor as the adapters'.

Warm start: before RL, ``warm_start_steps`` [100] supervised steps on correct answers of prompts from a separate
seed stream give the policy the answer format and some arithmetic, as RL fine-tuning starts from an SFT model;
unstressed runs then go from a reward of about 0.4 to 0.45-0.7 in the 100 rollout batches.

Stressors (each a knob of :class:`Stressor`, defaults in brackets):

- ``none``: no perturbation.
- ``mismatch``: training-inference mismatch. Completions are sampled from a copy of the policy whose weights
  carry Gaussian noise of ``mismatch_noise`` [0.3] times each tensor's RMS, drawn afresh per rollout, and the
  engine's log-probs are that copy's, computed from bfloat16 logits (mean |log-prob gap| about 0.15 on the
  warm-started model). The objective's old log-probs are the engine's (no recomputation by the trainer), so
  ratios compare the trainer with the engine.
- ``high_lr``: the learning rate times ``lr_multiplier`` [5].
- ``stale``: every batch is sampled by the policy of ``stale_steps`` [8] rollout batches ago (asynchronous RL);
  old log-probs are that stale policy's, the ratio is against the current one.
- ``moe``: the model is :class:`~rlguard.tasks.moe.TinyMoELM` (top-1 routing over 4 experts) and the rollout
  engine's router carries Gaussian noise of ``router_noise`` [1.0] times the router's RMS, drawn afresh per
  rollout, so that the experts chosen at rollout differ from those the trainer recomputes (about 16 % of tokens
  on the warm-started model); routing also shifts between the two minibatch updates of a batch, as in the GSPO
  paper's MoE discussion.

Collapse (fixed before the recorded grid; :func:`collapse_verdict`). ``r_t`` is the mean reward of rollout batch
``t`` (``r_0`` is the warm-started policy's), ``m_t`` its trailing mean over ``window`` [10] batches (fewer at
the start), ``e_t`` likewise for the mean token entropy. A run has collapsed when any of:

1. non-finite: the loss, the gradient norm or a weight became NaN/Inf (the run stops there);
2. halted: the guard halted the run (it did not finish training, so it counts as a failure);
3. reward collapse: the running peak ``P_t = max(m_s, warmup <= s <= t)`` (``warmup`` [0]: the peak includes
   the warm-started level) reached at least ``min_peak`` [0.3] and from some step ``t0`` to the end
   ``m_t < drop * P_t`` (``drop`` [0.5]) for at least ``window`` steps;
4. entropy collapse: from some ``t0`` to the end ``e_t < entropy_drop * e_start`` (``entropy_drop`` [0.1],
   ``e_start`` the mean entropy of the first ``window`` batches) for at least ``window`` steps, while the final
   ``m_t`` is below ``solved`` [0.95] (a collapsed entropy with every answer right is convergence, not collapse).

Steps to collapse is ``t0``, the first batch of the final collapsed stretch (the stop step for 1 and 2).

Reproducibility: on one machine a run's curves are bit-identical whatever ran before it in the process and
whether it runs in the main process or a worker (``tests/test_bench_collapse.py``). Across machines they are not:
training is chaotic, and another CPU's last-bit differences (MKL picks its kernels by CPU model, ATen by vector
width) grow into other curves within 50-100 batches under ``mismatch`` and ``moe``. Each run records
:func:`~rlguard.bench.collapse.spec.numerics` in ``runs.jsonl``, and ``--resume`` warns when the runs it keeps were
recorded on other numerics: compare curves only between equal fingerprints, and collapse rates across machines.

Layers: :mod:`~rlguard.bench.collapse.spec` (what a run is), :mod:`~rlguard.bench.collapse.verdict` (the collapse
definition), :mod:`~rlguard.bench.collapse.loop` (one run), :mod:`~rlguard.bench.collapse.grid` (the grid, its
summary and plots), :mod:`~rlguard.bench.collapse.cli` (the command line).
"""

from rlguard.bench.collapse.cli import (
    QUICK_ITERATIONS,
    QUICK_OBJECTIVES,
    QUICK_STRESSORS,
    build_parser,
    main,
    run_benchmark,
    split_names,
)
from rlguard.bench.collapse.grid import CellKey, build_grid, plot_curves, run_grid, summarise, write_results
from rlguard.bench.collapse.loop import behaviour_policy, effective_lr, perturbed_copy, run_one, warm_start
from rlguard.bench.collapse.spec import (
    GUARDS,
    OBJECTIVES,
    STRESSORS,
    GuardName,
    RunConfig,
    RunFields,
    RunResult,
    Stressor,
    check_run_fields,
    numerics,
    same_numerics,
)
from rlguard.bench.collapse.verdict import CollapseVerdict, collapse_verdict

__all__ = [
    "GUARDS",
    "OBJECTIVES",
    "QUICK_ITERATIONS",
    "QUICK_OBJECTIVES",
    "QUICK_STRESSORS",
    "STRESSORS",
    "CellKey",
    "CollapseVerdict",
    "GuardName",
    "RunConfig",
    "RunFields",
    "RunResult",
    "Stressor",
    "behaviour_policy",
    "build_grid",
    "build_parser",
    "check_run_fields",
    "collapse_verdict",
    "effective_lr",
    "main",
    "numerics",
    "perturbed_copy",
    "plot_curves",
    "run_benchmark",
    "run_grid",
    "run_one",
    "same_numerics",
    "split_names",
    "summarise",
    "warm_start",
    "write_results",
]
