"""Adapters: the only modules that import a training framework. Import the one you use, by its full name.

- ``rlguard.adapters.trl``: ``GuardedGRPOConfig``, ``GuardedGRPOTrainer``, ``StabilityCallback`` (``pip install
  rlguard[trl]``); ``rlguard.adapters.trl_guard`` applies the guard's decisions in the training loop.
  ``rlguard.adapters.trl_logprobs`` serves ``GuardedGRPOConfig(logprobs_from_hidden=True)``.
- ``rlguard.adapters.verl``: every objective as the verl policy loss ``rlguard.<name>``, registered on
  ``import verl`` through the ``verl.plugins`` entry point (``pip install rlguard[verl]``).
- ``rlguard.adapters.verl_guard``: the guard in verl: a guarded policy loss in the workers (poisoned sequences
  masked, skipped micro-batches, the guard's clip range) and a trainer subclass on the driver (halt, rollback to
  verl's checkpoints).

This package itself imports nothing, so ``import rlguard.adapters`` works without any framework installed.
"""
