"""Adapters: the only modules that import a training framework. Import the one you use, by its full name.

- ``rlguard.adapters.trl``: ``GuardedGRPOConfig``, ``GuardedGRPOTrainer``, ``StabilityCallback`` (``pip install
  rlguard[trl]``).

This package itself imports nothing, so ``import rlguard.adapters`` works without any framework installed.
"""
