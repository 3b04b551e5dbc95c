"""Long-completion task of the collapse benchmark: can it tell GSPO from GRPO?

    python benchmarks/collapse/run.py --task long --workers 2 --seeds 8   # or: rlguard bench collapse --task long
    python benchmarks/collapse/run.py --task long --quick --out /tmp/cl  # smoke test of every layer (CI)

The short task (:mod:`rlguard.bench.collapse.tiny`) samples at most 4 tokens, where GSPO's length-normalised
sequence ratio is nearly GRPO's token ratio. Here completions are 33 tokens and the MoE model's experts are chosen
by a rollout engine whose numerics differ from the trainer's, the two settings the GSPO paper (arXiv 2507.18071,
sec. 5) argues about. The grid, the loop, the log and the report are the harness's (:mod:`rlguard.bench.collapse`);
this package is the task:

- :mod:`.task`: reverse a 32-symbol string and shift each symbol by one place in a 60-symbol alphabet (vocabulary
  64, answer 32 symbols + ``<eos>``); the verifier's reward is the share of positions right (partial credit).
- :mod:`.model`: a pre-LayerNorm decoder-only transformer (d_model 64, 2 layers, 4 heads, 80k parameters),
  dense or with top-2-of-4 MoE MLPs, and KV-cache sampling.
- :mod:`.engine`: the rollout engine: a copy of the policy in bf16 (weights, router logits, output logits),
  optionally with weight or router noise; it reports its own log-probs and chosen experts
  (:func:`~rlguard.bench.collapse.loop.mismatch_stats` measures the share of tokens routed differently from the
  trainer and the mean ``|log pi_trainer - log pi_engine|``).
- :mod:`.stressors`: the perturbations and their strengths; :mod:`.spec`: the run configuration
  (:class:`~.spec.LongRunConfig`), its warm start and hooks, and the report layout: the summary with Wilson
  intervals and paired comparisons (same seed: same initial weights, warm start, prompts and sampling seeds) with
  exact McNemar p-values and paired bootstrap intervals, reward and entropy plots per cell.

One run (:func:`rlguard.bench.collapse.run_one`, defaults of :class:`~.spec.LongRunConfig`): ``warm_start_steps``
[300] supervised steps (batch 64, Adam 3e-3) on demonstrations whose answer symbols are replaced at random with
probability 0.5, so the warm-started policy is right at about half of the positions (reward about 0.5, exact
answers almost never); then ``iterations`` rollout batches of 8 prompts x 8 completions at temperature 1, group
advantages, two Adam steps per batch (lr 1e-3, gradient clipping 1.0) with the objective from
:func:`~rlguard.core_losses.get_objective` at its paper's defaults. By default the old log-probs are the engine's
(no recomputation by the trainer), so the ratio of the first minibatch compares trainer with engine and that of
the second is also off-policy by one step; the guard then also gets the trainer-vs-engine gap of the batch's
first minibatch, as a framework that recomputes the old log-probs reports it. With ``old_logprobs="trainer"`` the
trainer recomputes them before the batch's first update and the engine's become ``rollout_logprobs``.

Collapse: :func:`rlguard.bench.collapse.collapse_verdict` (one definition for both benchmarks) with
``window`` 10, ``min_peak`` 0.2, ``drop`` 0.5, ``entropy_drop`` 0.1, ``solved`` 0.95: non-finite weights or loss,
a guard halt, the 10-batch reward mean below half its running peak to the end for at least 10 batches, or the
10-batch entropy mean below 10 % of its first 10 batches to the end for at least 10 batches while the reward is
below 0.95 (a collapsed entropy with the task solved is convergence).

Stressors (:class:`~.stressors.LongStressor`; defaults in brackets, calibrated below):

- ``none``: the control: dense model, exact engine (KV-cache float32 sampling, log-probs equal to the trainer's
  within 1e-5).
- ``high_lr``: the learning rate times ``lr_multiplier`` [30].
- ``stale``: every batch sampled by the policy of ``stale_steps`` [16] batches ago.
- ``async1``, ``async2``, ``async4``, ``async8``: an asynchronous pipeline with staleness bound ``A`` = 1, 2, 4, 8
  policy versions (one version: one rollout batch's updates, the weight sync of verl's fully async trainer); each
  batch is sampled by the policy of ``age`` batches ago, ``age`` uniform in ``0..A`` drawn per batch
  (:func:`~rlguard.bench.collapse.spec.draw_age`), under the bound the guard set where it lowered it; the guard sees
  the batch's staleness stats and its gap in its age's bucket, and each run records its batches' ages.
- ``mismatch``: the dense engine is a bf16 copy with Gaussian weight noise of ``mismatch_noise`` [0.2] x RMS
  drawn afresh per batch (mean |log-prob gap| 0.28).
- ``moe``: the top-2-of-4 MoE model; the engine is a bf16 copy (router logits too) with router weight noise of
  ``router_noise`` [3.0] x RMS, so 81-86 % of completion tokens go to other experts than in the trainer (mean
  |log-prob gap| 0.27-0.29). bf16 alone routes 0.7 % of tokens differently (gap 0.004).

Calibration, before the grid (GRPO, guard off, 60 rollout batches unless said, one process, 2 shared CPU cores at
a load of 12-20; each run ``run_one(LongRunConfig(stressor=LongStressor(...), seed=s, iterations=60))``).
Reward: mean of batches 0-9 and 50-59; entropy in nats per token, same batches.

Engine gap on the warm-started model (one batch, no training; ``mismatch_stats``): dense bf16 + weight noise
0 / 0.02 / 0.05 / 0.1 / 0.2: |log-prob gap| 0.004 / 0.021 / 0.051 / 0.105 / 0.251; MoE bf16 + router noise
0 / 0.1 / 0.3 / 1.0: routed differently 0.7 % / 7.9 % / 20.7 % / 53.0 %, gap 0.004 / 0.007 / 0.016 / 0.085.

| stressor, strength | seed | collapsed (batch) | reward first -> last 10 | entropy first -> last 10 |
|---|---|---|---|---|
| none (100 batches) | 0 | no | 0.55 -> 0.98 (solved) | 2.32 -> 0.17 |
| none | 1 | no | 0.55 -> 0.93 | 2.31 -> 0.50 |
| high_lr x5 (100 batches) | 0 | no | 0.63 -> 0.99 | 1.89 -> 0.03 |
| high_lr x10 (100 batches) | 0 | no | 0.62 -> 0.98 | 1.78 -> 0.02 |
| high_lr x15 | 0 | no (degraded) | 0.51 -> 0.74 | 2.01 -> 0.30 |
| high_lr x20 | 0 | no (declining) | 0.37 -> 0.27 | 2.28 -> 0.58 |
| high_lr x20 | 1 | reward (46) | 0.34 -> 0.16 | 2.16 -> 0.64 |
| high_lr x30 | 0 | reward (4) | 0.17 -> 0.02 | 2.04 -> 0.007 |
| high_lr x30 | 1 | reward (6) | 0.19 -> 0.02 | 2.04 -> 0.23 |
| stale 4 (100 batches) | 0 | no | 0.50 -> 0.96 | 2.37 -> 0.23 |
| stale 16 | 0 | no (slower) | 0.47 -> 0.64 | 2.41 -> 1.66 |
| mismatch 0.2 | 0 | reward (18) | 0.32 -> 0.13 | 2.83 -> 3.56 |
| mismatch 0.2 | 1 | reward (27) | 0.30 -> 0.14 | 2.94 -> 3.53 |
| mismatch 0.3 | 0 | reward (10) | 0.18 -> 0.05 | 3.03 -> 3.70 |
| moe, router noise 0 (bf16 only; 0.6 % routed differently) | 0 | no | 0.57 -> 0.94 | 2.27 -> 0.44 |
| moe, router noise 1.0 | 0 | no (slower) | 0.52 -> 0.82 | 2.36 -> 0.88 |
| moe, router noise 3.0 | 0 | reward (40) | 0.30 -> 0.13 | 2.79 -> 3.60 |
| moe, router noise 3.0 | 1 | reward (39) | 0.26 -> 0.09 | 2.90 -> 3.07 |

Chosen: high_lr x30, stale 16 (it slows GRPO but does not collapse it at any strength tried: kept as the
off-policy stressor on which GSPO's claim can be checked), mismatch 0.2, moe router noise 3.0. Under mismatch and
moe the collapse is a divergence: the reward falls while the entropy rises towards uniform (ln 64 = 4.16), not an
entropy collapse. The collapse definition and these strengths were fixed before the grid.
"""

from rlguard.bench.collapse_long.engine import EngineNumerics, Rollouts, engine_copy, sample_rollouts, trainer_pass
from rlguard.bench.collapse_long.model import ModelConfig, TinyTransformer, generate, make_model
from rlguard.bench.collapse_long.spec import LONG_TASK, OBJECTIVES, LongRunConfig, warm_start
from rlguard.bench.collapse_long.stressors import STRESSORS, LongStressor, behaviour_policy
from rlguard.bench.collapse_long.task import ReverseShiftTask

__all__ = [
    "LONG_TASK",
    "OBJECTIVES",
    "STRESSORS",
    "EngineNumerics",
    "LongRunConfig",
    "LongStressor",
    "ModelConfig",
    "ReverseShiftTask",
    "Rollouts",
    "TinyTransformer",
    "behaviour_policy",
    "engine_copy",
    "generate",
    "make_model",
    "sample_rollouts",
    "trainer_pass",
    "warm_start",
]
