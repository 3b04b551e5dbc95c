"""Adapters: the only modules that import a training framework. Import the one you use, by its full name.

- ``rlguard.adapters.trl``: ``GuardedGRPOConfig``, ``GuardedGRPOTrainer``, ``StabilityCallback``
  (``pip install rlguard[trl]``).
- ``rlguard.adapters.verl``: every objective as the verl policy loss ``rlguard.<name>``, registered on
  ``import verl`` through the ``verl.plugins`` entry point, the guarded loss config and the guard on verl's driver
  (``pip install rlguard[verl]``); ``python -m rlguard.adapters.verl.main_ppo`` is verl's ``main_ppo`` with the
  guarded trainers.
- ``rlguard.verl_cpu``: stock ``python -m verl.trainer.main_ppo`` on a CPU (a CPU platform, a Hugging Face
  ``generate()`` rollout, the gloo fix), loaded by verl from ``VERL_USE_EXTERNAL_MODULES``.

Each is a package with a pure mapping module, the trainer/loss glue, the guard glue (an actuator, see
:mod:`rlguard.guards.actuation`) and one ``compat.py`` holding every patch and version gate (``docs/design.md``).
This package itself imports nothing, so ``import rlguard.adapters`` works without any framework installed.
"""
