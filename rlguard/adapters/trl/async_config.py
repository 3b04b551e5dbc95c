"""``GuardedAsyncGRPOConfig``: TRL's ``AsyncGRPOConfig`` with the rlguard objective and guard, and its loss as the
``GRPOConfig`` that :func:`~rlguard.adapters.trl.mapping.map_trl_config` translates (:func:`map_async_config`).

Re-exported by :mod:`rlguard.adapters.trl.async_trainer`, where the trainer that reads it lives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from trl.trainer.grpo_config import GRPOConfig

from rlguard.adapters.trl.async_compat import trainer_module
from rlguard.adapters.trl.config import guard_field, objective_field, objective_kwargs_field, parse_guard_flag
from rlguard.adapters.trl.mapping import TRLLossMapping, map_trl_config
from rlguard.guards import GuardConfig

if TYPE_CHECKING:
    from trl.experimental.async_grpo.async_grpo_config import AsyncGRPOConfig
else:  # imported by async_compat with TRL's experimental-API warning silenced
    AsyncGRPOConfig = trainer_module.AsyncGRPOConfig

__all__ = ["GuardedAsyncGRPOConfig", "map_async_config"]


@dataclass
class GuardedAsyncGRPOConfig(AsyncGRPOConfig):
    """``AsyncGRPOConfig`` plus the rlguard objective and guard, as in ``GuardedGRPOConfig`` (every TRL field keeps
    its meaning; ``epsilon``/``epsilon_high`` are TRL's clip range, given to the objective).

    Attributes:
        objective: a registered rlguard objective; None is TRL's own loss (``dapo``).
        objective_kwargs: the objective's arguments, overriding the mapped ones (a dict or a JSON object string).
        guard: a preset name, a ``GuardConfig`` or a JSON object of its fields (``--guard``); None for none.
    """

    objective: str | None = objective_field("None is AsyncGRPOTrainer's own loss, dapo's.")
    objective_kwargs: dict[str, Any] | str | None = objective_kwargs_field()  # noqa: RUF009  # a field()
    guard: GuardConfig | str | dict[str, Any] | None = guard_field()  # noqa: RUF009  # a field()

    _VALID_DICT_FIELDS = [*AsyncGRPOConfig._VALID_DICT_FIELDS, "objective_kwargs"]  # noqa: RUF012

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[no-untyped-call]  # parses a JSON string given for objective_kwargs
        if self.objective_kwargs is None:
            self.objective_kwargs = {}
        if not isinstance(self.objective_kwargs, dict):
            raise ValueError(f"objective_kwargs must be a dict or a JSON object string; got {self.objective_kwargs!r}.")
        self.guard = parse_guard_flag(self.guard)
        #: how this config translates into an rlguard objective
        self.rlguard_mapping: TRLLossMapping = map_async_config(self)

    def to_dict(self) -> dict[str, Any]:
        """TRL's dict of the settings, JSON-ready (a ``GuardConfig`` given as ``guard`` appears as its repr)."""
        out: dict[str, Any] = super().to_dict()
        if isinstance(out.get("guard"), GuardConfig):
            out["guard"] = repr(out["guard"])
        return out


def _grpo_defaults() -> dict[str, Any]:
    """``GRPOConfig``'s field defaults, without building one (building runs transformers' device set-up)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def map_async_config(args: AsyncGRPOConfig) -> TRLLossMapping:
    """``args`` as the ``GRPOConfig`` whose loss ``AsyncGRPOTrainer``'s is (``loss_type="dapo"``: the clipped token
    terms summed and divided by the step's loss tokens), translated by :func:`map_trl_config`, the one translation."""
    settings = {
        **_grpo_defaults(),
        "loss_type": "dapo",
        "epsilon": args.epsilon,
        "epsilon_high": args.epsilon_high,
        "beta": 0.0,
        "max_completion_length": args.max_completion_length,
        "use_vllm": False,
        "objective": getattr(args, "objective", None),
        "objective_kwargs": getattr(args, "objective_kwargs", None) or {},
    }
    return map_trl_config(cast(GRPOConfig, _Settings(settings)))


class _Settings:
    """Attribute access to a dict of config values (what :func:`map_trl_config` reads)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
