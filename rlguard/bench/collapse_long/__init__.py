"""Long-completion collapse benchmark: can it tell GSPO from GRPO?

    rlguard bench collapse-long --workers 2 --seeds 8        # or: python benchmarks/collapse_long/run.py
    rlguard bench collapse-long --quick --out /tmp/cl       # smoke test of every layer (CI)

The short benchmark (:mod:`rlguard.bench.collapse`) samples at most 4 tokens, where GSPO's length-normalised
sequence ratio is nearly GRPO's token ratio. Here completions are 33 tokens and the MoE model's experts are chosen
by a rollout engine whose numerics differ from the trainer's, the two settings the GSPO paper (arXiv 2507.18071,
sec. 5) argues about.

Layers (one module each):

- :mod:`.task`: reverse a 32-symbol string and shift each symbol by one place in a 60-symbol alphabet (vocabulary
  64, answer 32 symbols + ``<eos>``); the verifier's reward is the share of positions right (partial credit).
- :mod:`.model`: a pre-LayerNorm decoder-only transformer (d_model 64, 2 layers, 4 heads, 80k parameters),
  dense or with top-2-of-4 MoE MLPs, and KV-cache sampling.
- :mod:`.engine`: the rollout engine: a copy of the policy in bf16 (weights, router logits, output logits),
  optionally with weight or router noise; it reports its own log-probs and chosen experts, and
  :func:`~.engine.mismatch_stats` measures the share of tokens routed differently from the trainer and the mean
  ``|log pi_trainer - log pi_engine|``.
- :mod:`.stressors`: the perturbations and their strengths; :mod:`.train`: the warm start and the RL loop of one
  run; :mod:`.grid`: runs on worker processes, resumable; :mod:`.report`: ``runs.csv``, the summary with Wilson
  intervals, paired comparisons (same seed: same initial weights, warm start, prompts and sampling seeds) with
  exact McNemar p-values and paired bootstrap intervals, per-cell plots; :mod:`.cli`: the command line.

One run (:func:`~.train.run_one`, defaults of :class:`~.train.RunConfig`): ``warm_start_steps`` [300] supervised
steps (batch 64, Adam 3e-3) on demonstrations whose answer symbols are replaced at random with probability 0.5,
so the warm-started policy is right at about half of the positions (reward about 0.5, exact answers almost
never); then ``iterations`` rollout batches of 8 prompts x 8 completions at temperature 1, group advantages, two
Adam steps per batch (lr 1e-3, gradient clipping 1.0) with the objective from
:func:`~rlguard.core_losses.get_objective` at its paper's defaults. The old log-probs are the engine's (no
recomputation by the trainer), so the ratio of the first minibatch compares trainer with engine and that of the
second is also off-policy by one step. With ``guard="default"`` every step's stats go to
``Guard(GuardConfig.preset("default"))``; its decision acts in :func:`~.train.apply_decision` only.

Collapse: :func:`rlguard.bench.collapse.collapse_verdict` (one definition for both benchmarks) with
``window`` 10, ``min_peak`` 0.2, ``drop`` 0.5, ``entropy_drop`` 0.1, ``solved`` 0.95: non-finite weights or loss,
a guard halt, the 10-batch reward mean below half its running peak to the end for at least 10 batches, or the
10-batch entropy mean below 10 % of its first 10 batches to the end for at least 10 batches while the reward is
below 0.95 (a collapsed entropy with the task solved is convergence).

Calibration (GRPO, guard off; ``python /tmp/rl.py``-style single runs, one worker, see CALIBRATION below).
"""

from rlguard.bench.collapse_long.engine import EngineNumerics, MismatchStats, Rollouts, mismatch_stats
from rlguard.bench.collapse_long.model import ModelConfig, TinyTransformer, generate, make_model
from rlguard.bench.collapse_long.stressors import STRESSORS, Stressor
from rlguard.bench.collapse_long.task import ReverseShiftTask
from rlguard.bench.collapse_long.train import RunConfig, RunResult, run_one

__all__ = [
    "STRESSORS",
    "EngineNumerics",
    "MismatchStats",
    "ModelConfig",
    "ReverseShiftTask",
    "Rollouts",
    "RunConfig",
    "RunResult",
    "Stressor",
    "TinyTransformer",
    "generate",
    "make_model",
    "mismatch_stats",
    "run_one",
]
