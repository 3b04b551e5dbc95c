"""``python -m rlguard.verl_cpu overrides [WORKERS]`` prints the verl overrides of a CPU run;
``python -m rlguard.verl_cpu example DIR`` writes the tiny example and prints the whole command."""

from __future__ import annotations

import argparse
import shlex

from rlguard.verl_cpu import cpu_environment, cpu_overrides


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` and print the requested overrides or command."""
    parser = argparse.ArgumentParser(prog="python -m rlguard.verl_cpu", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    overrides = commands.add_parser("overrides", help="print the overrides of a CPU run")
    overrides.add_argument("workers", nargs="?", type=int, default=1, help="actor processes (default 1)")
    example = commands.add_parser("example", help="write the tiny model and data; print the command that trains it")
    example.add_argument("folder")
    example.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "overrides":
        print(shlex.join(cpu_overrides(args.workers)))
        return
    from rlguard.verl_cpu.example import example_overrides, write_example

    folder = write_example(args.folder)
    env = " ".join(f"{key}={value}" for key, value in cpu_environment().items())
    command = ["python", "-m", "verl.trainer.main_ppo", *example_overrides(folder), *cpu_overrides(args.workers)]
    print(f"{env} {shlex.join(command)}")


if __name__ == "__main__":
    main()
