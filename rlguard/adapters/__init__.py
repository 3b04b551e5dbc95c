"""Adapters: the only modules that import a training framework. Import the one you use, by its full name.

- ``rlguard.adapters.trl``: ``GuardedGRPOConfig``, ``GuardedGRPOTrainer``, ``StabilityCallback``
  (``pip install rlguard[trl]``).
- ``rlguard.adapters.verl``: every objective as the verl policy loss ``rlguard.<name>``, registered on
  ``import verl`` through the ``verl.plugins`` entry point, the guarded loss config and the guard on verl's driver
  (``pip install rlguard[verl]``).

Each is a package with a pure mapping module, the trainer/loss glue, the guard glue (an actuator, see
:mod:`rlguard.guards.actuator`) and one ``compat.py`` holding every patch and version gate (``docs/design.md``).
This package itself imports nothing, so ``import rlguard.adapters`` works without any framework installed.
"""
