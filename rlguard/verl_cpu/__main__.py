"""``python -m rlguard.verl_cpu overrides [WORKERS]`` prints the verl overrides of a CPU run;
``python -m rlguard.verl_cpu example DIR [--guarded] [--steps N]`` writes the tiny example and prints the whole
command: stock ``verl.trainer.main_ppo`` with ``rlguard.gspo`` as the policy loss, or, with ``--guarded``, the
guarded trainer ``rlguard.adapters.verl.main_ppo`` with the guarded loss and the ``default`` guard (the README's verl
quick start)."""

from __future__ import annotations

import argparse
import shlex

from rlguard.verl_cpu import cpu_environment, cpu_overrides

#: the policy loss of the example's runs
LOSS_MODE = "actor_rollout_ref.actor.policy_loss.loss_mode=rlguard.gspo"
#: what a guarded run adds: the guarded loss in the workers, the guard on the driver
GUARDED = (
    "actor_rollout_ref.actor.policy_loss._target_=rlguard.adapters.verl.GuardedPolicyLossConfig",
    "+trainer.rlguard_guard=default",
)


def example_command(folder: str, *, workers: int = 1, steps: int = 3, guarded: bool = False) -> list[str]:
    """The command that trains :func:`~rlguard.verl_cpu.example.write_example`'s model in ``folder`` for ``steps``
    optimizer steps (verl's default is 30 epochs of the data), without the environment of
    :func:`~rlguard.verl_cpu.cpu_environment`."""
    from rlguard.verl_cpu.example import example_overrides

    entry = "rlguard.adapters.verl.main_ppo" if guarded else "verl.trainer.main_ppo"
    run = [*example_overrides(folder), *cpu_overrides(workers), f"trainer.total_training_steps={steps}"]
    return ["python", "-m", entry, *run, LOSS_MODE, *(GUARDED if guarded else ())]


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` and print the requested overrides or command."""
    parser = argparse.ArgumentParser(prog="python -m rlguard.verl_cpu", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    overrides = commands.add_parser("overrides", help="print the overrides of a CPU run")
    overrides.add_argument("workers", nargs="?", type=int, default=1, help="actor processes (default 1)")
    example = commands.add_parser("example", help="write the tiny model and data; print the command that trains it")
    example.add_argument("folder")
    example.add_argument("--workers", type=int, default=1)
    example.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    example.add_argument("--guarded", action="store_true", help="the guarded trainer, loss and default guard")
    args = parser.parse_args(argv)
    if args.command == "overrides":
        print(shlex.join(cpu_overrides(args.workers)))
        return
    if args.steps < 1:
        parser.error(f"--steps must be at least 1; got {args.steps}.")
    from rlguard.verl_cpu.example import write_example

    folder = write_example(args.folder)
    env = " ".join(f"{key}={value}" for key, value in cpu_environment().items())
    command = example_command(str(folder), workers=args.workers, steps=args.steps, guarded=args.guarded)
    print(f"{env} {shlex.join(command)}")


if __name__ == "__main__":
    main()
