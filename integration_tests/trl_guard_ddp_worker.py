"""One rank of ``test_trl_guard_faults.py::test_faults_under_torchrun_ddp_every_rank_acts_alike``.

Runs four guarded ``GuardedGRPOTrainer`` trainings in turn under DDP (gloo): a poisoned batch, an exploding
gradient (plain SGD), a poisoned batch with a guard that must halt the step after, and an LR spike that the
strict preset rolls back. Writes ``rank<r>.json``
with each run's non-continue actions, final step and weight checksum; the test compares the ranks.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

from trl_guard_faults import RUN, build, guard_config, summary

from rlguard.adapters.trl import GuardedGRPOConfig, GuardedGRPOTrainer, StabilityCallback
from rlguard.guards.decision import decision_action

AT, STEPS = 4, 8


def run(model: str, out: Path, fault: str, guard: Any, **changes: Any) -> dict[str, Any]:
    args = GuardedGRPOConfig(
        output_dir=str(out), ddp_backend="gloo", guard=guard, max_steps=STEPS, **{**RUN, **changes}
    )
    trainer = build(GuardedGRPOTrainer, Path(model), args, fault, AT)
    trainer.train()
    callback = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, StabilityCallback))
    result = summary(trainer)
    return {
        "actions": [[d.step, a] for d in callback.decisions if (a := decision_action(d)) != "continue"],
        "steps": result["steps"],
        "finite": result["finite"],
        "weights_checksum": result["weights_checksum"],
        "rewards": result["rewards"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    cli = parser.parse_args()
    warnings.simplefilter("ignore")
    out = Path(cli.out)
    halting = guard_config(interventions={"rollback": {"max_consecutive_skips": 1, "max_rollbacks": 0}})
    runs = {
        "poison": run(cli.model, out / "poison", "poison", guard_config()),
        "grad": run(cli.model, out / "grad", "grad", guard_config(), optim="sgd"),
        "halt": run(cli.model, out / "halt", "poison", halting),
        "lr": run(cli.model, out / "lr", "lr", guard_config("strict")),
    }
    import torch.distributed as dist

    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(runs))


if __name__ == "__main__":
    from torchrun_exit import shut_down

    main()
    shut_down()
