"""``GuardedGRPOConfig``: ``trl.GRPOConfig`` plus the choice of rlguard objective and guard.

>>> from rlguard.adapters.trl import GuardedGRPOConfig
>>> args = GuardedGRPOConfig(objective="gspo", guard="default")  # doctest: +SKIP

Every TRL field keeps its meaning; :func:`~rlguard.adapters.trl.mapping.map_trl_config` translates the whole
config into an objective (see :mod:`rlguard.adapters.trl.mapping`), once, when the config is built
(``rlguard_mapping``, which ``GuardedGRPOTrainer`` uses; build a changed config with ``dataclasses.replace``). With
an ``objective`` and TRL's clip range or ``loss_type`` left unset, the objective's paper values fill them, said in
one log line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    from trl.trainer.grpo_config import GRPOConfig
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"rlguard.adapters.trl needs TRL: pip install 'rlguard[trl]' ({err}).") from err

from rlguard._deprecated import renamed
from rlguard.adapters.trl.mapping import TRLLossMapping, map_trl_config, paper_trl_settings
from rlguard.core_losses.registry import objective_class
from rlguard.guards import PRESETS, GuardConfig
from rlguard.guards.config import check_preset
from rlguard.guards.registry import check_members

__all__ = ["GuardedGRPOConfig", "guard_field", "objective_field", "objective_kwargs_field", "parse_guard_flag"]

logger = logging.getLogger(__name__)


def objective_field(unset: str) -> Any:
    """The ``objective`` field of the guarded configs (``unset`` says what None means)."""
    return field(default=None, metadata={"help": f"rlguard objective (see `rlguard losses`); {unset}"})


def objective_kwargs_field() -> Any:
    """The ``objective_kwargs`` field of the guarded configs (a dict, or a JSON object string)."""
    return field(
        default=None,
        metadata={
            "help": "Arguments of the rlguard objective, as a dict or a JSON string; they override the values mapped "
            "from TRL's settings."
        },
    )


def guard_field() -> Any:
    """The ``guard`` field of the guarded configs (``--guard`` on the command line)."""
    return field(
        default=None,
        metadata={
            "help": f"Stability guard acting in the loop: a preset ({', '.join(map(repr, PRESETS))}), or a JSON "
            'object of GuardConfig fields with an optional preset they change, e.g. \'{"preset": "strict", '
            '"snapshot_interval": 5}\'.'
        },
    )


@dataclass
class GuardedGRPOConfig(GRPOConfig):
    """``trl.GRPOConfig`` plus the choice of rlguard objective. Every TRL field keeps its meaning (see the module).

    Attributes:
        objective: a registered rlguard objective (``rlguard losses`` lists them); ``None`` follows ``loss_type``.
        objective_kwargs: arguments of the objective, overriding what TRL's settings map to, e.g.
            ``{"aggregation": "seq-mean-token-mean"}`` or ``{"rollout_mask": "geometric"}``; a JSON object string
            (the command line) is parsed. Not ``beta``.
        guard: stability guard acting in the loop (:mod:`rlguard.adapters.trl.callback`): a preset name
            (:data:`~rlguard.guards.PRESETS`: ``"monitor"``, ``"default"``, ``"strict"``, ``"stable"``), a
            ``GuardConfig``, or a JSON object (a string, e.g. on
            the command line, or a mapping, e.g. in a YAML config) of ``GuardConfig`` fields with an optional
            ``"preset"`` they change: ``'{"preset": "strict", "snapshot_interval": 5}'``; ``None`` for none. Its
            detectors' and interventions' settings are checked when the config is built (a NaN, negative or
            out-of-range threshold is refused, naming the field and its range), before TRL loads a model. With
            a guard the objective masks non-finite log-probs (``on_nonfinite="mask"``) so that the guard can skip
            the step.
        epsilon, epsilon_high, loss_type: TRL's, with one difference: with an ``objective`` and a setting left
            unset (``None``, also on the command line and in YAML), the objective's paper value fills it
            (:func:`~rlguard.adapters.trl.mapping.paper_trl_settings`: ``objective="gspo"`` gives the clip range
            3e-4/4e-4 and ``loss_type="grpo"``, GSPO's ``seq-mean-token-mean``); without an ``objective``, TRL's
            defaults (0.2, ``"dapo"``). One log line says which values were used.
        logprobs_from_hidden: compute the policy's per-token log-probs and entropies with
            :func:`rlguard.core_losses.logprobs_from_hidden` (chunked over tokens, logits recomputed in backward)
            instead of TRL's fused LM head kernel; see :mod:`rlguard.adapters.trl.logprobs` for what it refuses.
        fused_objective: compute the objective itself in the LM-head pass
            (:func:`rlguard.core_losses.objective_from_hidden`): the gradients of the hidden states and the LM head
            are formed while each chunk's logits are live, so backward makes no second pass over the vocabulary.
            Implies ``logprobs_from_hidden`` and refuses what it refuses, and TRL's entropy bonus
            (``entropy_coef``; the objective's own ``objective_kwargs={"entropy_coef": ...}`` works).
    """

    objective: str | None = objective_field("None follows loss_type.")
    objective_kwargs: dict[str, Any] | str | None = objective_kwargs_field()  # noqa: RUF009  # a field()
    # TRL's and transformers' parsers take the second member of a union as the type: str here, converted below
    guard: GuardConfig | str | dict[str, Any] | None = guard_field()  # noqa: RUF009  # a field()
    # None = not set by the user: the objective's paper value, or TRL's default without an objective (see above)
    epsilon: float | None = field(  # type: ignore[assignment]  # TRL's float, resolved in __post_init__
        default=None,
        metadata={
            "help": "Lower clip bound (TRL's epsilon). Unset: the objective's paper value with `objective` (gspo: "
            "3e-4), else TRL's 0.2."
        },
    )
    epsilon_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper clip bound (TRL's epsilon_high). Unset: the objective's paper value with `objective` when "
            "epsilon is unset too (gspo: 4e-4), else epsilon."
        },
    )
    loss_type: str | None = field(  # type: ignore[assignment]  # TRL's str, resolved in __post_init__
        default=None,
        metadata={
            "help": "TRL's loss_type (it sets the aggregation). Unset: the one of the objective's paper aggregation "
            "with `objective` (gspo: 'grpo'), else TRL's 'dapo'."
        },
    )
    logprobs_from_hidden: bool = field(
        default=False,
        metadata={
            "help": "Compute the policy's per-token log-probs and entropies with rlguard's logprobs_from_hidden from "
            "the last hidden states and the LM head weight, a chunk of tokens at a time (logits recomputed in "
            "backward), instead of TRL's fused LM head kernel (TRL 1.16 does not build the full logits either; "
            "rlguard's chunks are smaller, see benchmarks/logprobs_memory.py). Float32 accumulation; the "
            "temperature divides the hidden states, which is exact. Refused for LM heads with a bias or LoRA, "
            "logit soft-capping or scaling, MoE auxiliary losses, DeepSpeed ZeRO-3 and FSDP. The reference model "
            "keeps TRL's kernel."
        },
    )

    fused_objective: bool = field(
        default=False,
        metadata={
            "help": "Compute the objective in the LM-head pass with rlguard's objective_from_hidden: the gradients "
            "of hidden states and LM head are formed while each chunk's logits are live (three matrix products, "
            "no recomputation in backward). Implies logprobs_from_hidden and refuses what it refuses, and TRL's "
            "entropy bonus (entropy_coef != 0); objective_kwargs={'entropy_coef': ...} is the objective's own."
        },
    )

    # a JSON string given for these (e.g. on the command line) is parsed into a dict; the base declares it unannotated
    _VALID_DICT_FIELDS = [*GRPOConfig._VALID_DICT_FIELDS, "objective_kwargs"]  # noqa: RUF012

    def __post_init__(self) -> None:
        used = self._fill_unset_trl_settings()
        super().__post_init__()  # type: ignore[no-untyped-call]  # parses a JSON string given for objective_kwargs
        if self.objective_kwargs is None:
            self.objective_kwargs = {}
        if not isinstance(self.objective_kwargs, dict):
            raise ValueError(f"objective_kwargs must be a dict or a JSON object string; got {self.objective_kwargs!r}.")
        # an aggregation in objective_kwargs is the user's, whatever loss_type the objective's own settings filled
        given = "aggregation" in self.objective_kwargs
        told = {k: v for k, v in used.items() if not given or k in ("epsilon", "epsilon_high")}
        if "aggregation" in used and "aggregation" not in self.objective_kwargs:
            self.objective_kwargs = {**self.objective_kwargs, "aggregation": used["aggregation"]}
        self.guard = parse_guard_flag(self.guard)
        #: how this config translates into an rlguard objective (warnings emitted once, here)
        self.rlguard_mapping: TRLLossMapping = map_trl_config(self)
        if self.objective is not None:
            _log_settings_used(self, told)

    def _fill_unset_trl_settings(self) -> dict[str, Any]:
        """Fill ``epsilon``, ``epsilon_high``, ``loss_type`` left ``None``; return what the objective's paper gave."""
        paper = {} if self.objective is None else paper_trl_settings(self.objective)
        used: dict[str, Any] = {}
        if self.epsilon is None:
            # an explicit epsilon keeps TRL's meaning of an unset epsilon_high (= epsilon)
            if self.epsilon_high is None and "epsilon_high" in paper:
                self.epsilon_high = used["epsilon_high"] = paper["epsilon_high"]
            if "epsilon" in paper:
                self.epsilon = used["epsilon"] = paper["epsilon"]
            else:
                self.epsilon = _TRL_DEFAULTS["epsilon"]
        if self.loss_type is None:
            self.loss_type = paper.get("loss_type", _TRL_DEFAULTS["loss_type"])
            used.update({k: paper[k] for k in ("loss_type", "aggregation") if k in paper})
        return used

    def to_dict(self) -> dict[str, Any]:
        """TRL's dict of the settings, JSON-ready (a ``GuardConfig`` given as ``guard`` appears as its repr)."""
        out: dict[str, Any] = super().to_dict()
        if isinstance(out.get("guard"), GuardConfig):
            out["guard"] = repr(out["guard"])
        return out

    def objective_mapping(self) -> TRLLossMapping:
        """How this config translates into an rlguard objective (:func:`map_trl_config`, made when it was built)."""
        return self.rlguard_mapping


#: TRL's own defaults of the settings GuardedGRPOConfig leaves unset (None) by default
_TRL_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in ("epsilon", "loss_type")
}


def parse_guard_flag(spec: GuardConfig | str | Mapping[str, Any] | None) -> GuardConfig | str | None:
    """``GuardedGRPOConfig.guard`` as given (``--guard`` on the command line, a YAML value or Python) -> a preset
    name, a ``GuardConfig`` or None.

    A JSON object (string) or a mapping holds ``GuardConfig`` fields, with an optional ``"preset"`` they change
    (``"default"`` without one), type-checked strictly (:meth:`GuardConfig.from_mapping`: ``{"observe_only":
    "false"}`` is refused, not read as true); schedules, which are functions, cannot be given this way. The
    detectors' and interventions' settings of a ``GuardConfig`` (given or built) are checked here
    (:func:`~rlguard.guards.registry.check_members`), naming ``guard.<kind>s[name].<field>`` and its range: a config
    is refused when it is built, before TRL loads a model.
    """
    if spec is None:
        return spec
    if isinstance(spec, GuardConfig):
        check_members(spec, where="guard")
        return spec
    if isinstance(spec, str):
        if not spec.lstrip().startswith("{"):
            return check_preset(spec)
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"guard: {spec!r} is not valid JSON ({err}); give a preset name or a JSON object."
            ) from err
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"guard must be a preset name ({', '.join(map(repr, PRESETS))}), a GuardConfig or a JSON object of its "
            f"fields; got {spec!r}."
        )
    config = GuardConfig.from_mapping(spec, where="guard")
    check_members(config, where="guard")
    return config


def _log_settings_used(config: GuardedGRPOConfig, used: Mapping[str, Any]) -> None:
    """One log line: the clip range and aggregation the objective got, and whether they are its own (its paper's,
    or a plugin's defaults where it names no paper; then at WARNING level: TRL users expect TRL's defaults) or the
    user's TRL settings. A plugin's objective is announced as one, by its class and module."""
    assert config.objective is not None
    cls = objective_class(config.objective)
    own = "the paper's" if cls.paper else "its defaults"
    kwargs = config.rlguard_mapping.kwargs
    parts = []
    low, high = cls.clip_bounds or ("clip_low", "clip_high")  # the fields the objective clips by
    if high in kwargs:
        source = own if used.keys() & {"epsilon", "epsilon_high"} else "from epsilon/epsilon_high"
        parts.append(f"clip range ({kwargs.get(low)}, {kwargs[high]}) ({source})")
    source = own if used.keys() & {"loss_type", "aggregation"} else "from loss_type/objective_kwargs"
    parts.append(f"aggregation {kwargs['aggregation']!r} ({source}, loss_type={config.loss_type!r})")
    hint = "; set epsilon, epsilon_high or loss_type to use TRL's" if used else ""
    # the built-ins live in rlguard; any other module registered the objective through a plugin's entry point
    plugin = "" if cls.__module__.partition(".")[0] == "rlguard" else f" (plugin {cls.__module__}.{cls.__qualname__})"
    logger.log(
        logging.WARNING if used else logging.INFO,
        "rlguard: objective %r%s with %s%s.",
        config.objective,
        plugin,
        " and ".join(parts),
        hint,
    )


__getattr__ = renamed(__name__, guard_from_spec=parse_guard_flag)  # its old name, deprecated
