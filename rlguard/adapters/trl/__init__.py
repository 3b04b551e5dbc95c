"""TRL adapter: every rlguard objective inside ``trl.GRPOTrainer``, and the guard acting in its training loop.

>>> from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
>>> args = GuardedGRPOConfig(output_dir="out", objective="gspo", guard="default")  # doctest: +SKIP
>>> GuardedGRPOTrainer(model, reward_funcs, args=args, train_dataset=dataset).train()  # doctest: +SKIP

Modules (``docs/design.md``, "Adapters"):

- :mod:`~rlguard.adapters.trl.mapping`: what a ``GRPOConfig`` means in rlguard (pure, no framework import);
- :mod:`~rlguard.adapters.trl.config`: ``GuardedGRPOConfig`` (TRL's config plus the objective and the guard);
- :mod:`~rlguard.adapters.trl.trainer`: ``GuardedGRPOTrainer`` (the loss glue);
- :mod:`~rlguard.adapters.trl.objective_glue`: what the synchronous and the asynchronous trainers share;
- :mod:`~rlguard.adapters.trl.async_trainer`: ``GuardedAsyncGRPOTrainer`` (TRL's ``AsyncGRPOTrainer``, guarded), with
  :mod:`~rlguard.adapters.trl.async_queue`, :mod:`~rlguard.adapters.trl.async_compat` (its CPU routes) and
  :mod:`~rlguard.adapters.trl.async_stand_in` (a CPU stand-in for the vLLM server);
- :mod:`~rlguard.adapters.trl.trl_metrics`: the loss's metrics under TRL's keys, reduced over processes;
- :mod:`~rlguard.adapters.trl.callback`: ``StabilityCallback`` (the guard glue);
- :mod:`~rlguard.adapters.trl.actuators`: what a decision does under DDP and under DeepSpeed ZeRO (the actuators);
- :mod:`~rlguard.adapters.trl.logprobs`: ``GuardedGRPOConfig(logprobs_from_hidden=True)``;
- :mod:`~rlguard.adapters.trl.compat`: every version gate and every patch of TRL, accelerate and DeepSpeed.
"""

from rlguard.adapters.trl.callback import StabilityCallback
from rlguard.adapters.trl.compat import SUPPORTED_TRL, check_trl_compatibility
from rlguard.adapters.trl.mapping import TRLLossMapping, map_trl_config
from rlguard.adapters.trl.trainer import GuardedGRPOConfig, GuardedGRPOTrainer
from rlguard.guards.events import EVENTS_FILE
from rlguard.guards.guard import make_guard
from rlguard.guards.state import GUARD_STATE_FILE
from rlguard.metrics import TRL_TO_CANONICAL, canonical_stats

__all__ = [
    "EVENTS_FILE",
    "GUARD_STATE_FILE",
    "SUPPORTED_TRL",
    "TRL_TO_CANONICAL",
    "GuardedGRPOConfig",
    "GuardedGRPOTrainer",
    "StabilityCallback",
    "TRLLossMapping",
    "canonical_stats",
    "check_trl_compatibility",
    "make_guard",
    "map_trl_config",
]
