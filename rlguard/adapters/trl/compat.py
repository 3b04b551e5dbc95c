"""Every version gate and every patch of TRL, transformers, accelerate and DeepSpeed internals, in one place.

rlguard's TRL adapter relies on these non-public parts (each checked at start-up with a clear message, so that a
change upstream fails when training starts, not at the first skipped step):

- ``GRPOTrainer._compute_loss`` (overridden) and ``GRPOTrainer._get_per_token_logps_and_entropies`` (called):
  the objective replaces TRL's loss [1];
- ``GRPOTrainer._metrics`` (read and appended to, through :func:`logged_metrics` only): TRL's per-step metric lists,
  which TRL averages into each log record; the trainer logs its objective's metrics there, the callback reads the
  step's generation metrics and logs the guard's [3];
- ``trainer.accelerator.deepspeed_engine_wrapped``, replaced while training (:func:`install_engine_wrapper`): the
  guard decides between ``engine.backward`` and ``engine.step`` [2];
- the ZeRO optimizer's ``averaged_gradients`` and ``step`` (shadowed for one call, :class:`EngineStepApplying`),
  ``_pre_step``, ``_partition_all_parameters``, ``_overflow_clean_up`` (ZeRO-3), ``micro_step_id``,
  ``all_grad_tensors``, ``_release_preflattened_grad_buffers`` (ZeRO-1/2): the gradient norm before clipping, and
  the step dropped or its LR scaled [2];
- the policy's ``forward`` (:func:`install_forward`), for ``logprobs_from_hidden=True``, on top of TRL's
  ``add_fused_lm_head`` (whose output contract :mod:`rlguard.adapters.trl.logprobs` keeps).

1. :func:`check_trl_compatibility` (``GuardedGRPOTrainer.__init__``): the installed trl in :data:`SUPPORTED_TRL` and
   the private methods' signatures as expected.
2. :func:`check_deepspeed_compatibility` (when the guard starts under DeepSpeed): deepspeed in
   :data:`SUPPORTED_DEEPSPEED`, ZeRO stage 1-3 without optimizer offload, and every private attribute above present.
3. :func:`check_logged_metrics` (``GuardedGRPOTrainer.__init__``, and ``StabilityCallback`` when training starts).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping, MutableMapping
from importlib import metadata
from typing import Any

import torch
from torch import Tensor

try:
    import trl
    from trl.trainer.grpo_trainer import GRPOTrainer
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(f"rlguard.adapters.trl needs TRL: pip install 'rlguard[trl]' ({err}).") from err

__all__ = [
    "FORWARD_KEYS",
    "SUPPORTED_DEEPSPEED",
    "SUPPORTED_TRL",
    "EngineStepApplying",
    "GuardedEngineWrapper",
    "check_deepspeed_compatibility",
    "check_logged_metrics",
    "check_trl_compatibility",
    "drop_zero_gradients",
    "install_engine_wrapper",
    "install_forward",
    "logged_metrics",
    "remove_engine_wrapper",
    "zero_grad_norm",
]

SUPPORTED_TRL = ">=1.16,<1.17"
SUPPORTED_DEEPSPEED = ">=0.19,<0.20"

#: Multimodal inputs that TRL's _compute_loss forwards to _get_per_token_logps_and_entropies.
FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
LOGPS_ARGS = ("model", "input_ids", "attention_mask", "logits_to_keep", "compute_entropy", "compute_aux_loss")


#: The parameters GuardedGRPOTrainer relies on, per private GRPOTrainer method.
_EXPECTED_SIGNATURES: dict[str, tuple[str, ...]] = {
    "_compute_loss": ("self", "model", "inputs"),
    "_get_per_token_logps_and_entropies": ("self", *LOGPS_ARGS, *FORWARD_KEYS),
}


def _in_range(version: str, major_minor: tuple[int, int]) -> bool:
    """``version`` is ``major.minor.*`` (the supported ranges are one minor release each)."""
    parts = version.split(".")
    try:
        return (int(parts[0]), int(parts[1])) == major_minor
    except (ValueError, IndexError):
        return False


def check_trl_compatibility() -> None:
    """Raise ``RuntimeError`` naming the supported TRL range if the installed trl is outside it or a private method
    the trainer overrides or calls has changed."""
    if not _in_range(trl.__version__, (1, 16)):
        raise RuntimeError(
            f"rlguard's GuardedGRPOTrainer supports trl{SUPPORTED_TRL}; the installed trl is {trl.__version__}. "
            "Install a supported trl (pip install 'rlguard[trl]') or use trl.GRPOTrainer."
        )
    for method, expected in _EXPECTED_SIGNATURES.items():
        fn = getattr(GRPOTrainer, method, None)
        params = () if fn is None else tuple(inspect.signature(fn).parameters)
        exact = method == "_compute_loss"
        ok = params == expected if exact else set(expected) <= set(params)
        if not ok:
            raise RuntimeError(
                f"rlguard's GuardedGRPOTrainer supports trl{SUPPORTED_TRL}; the installed trl {trl.__version__} "
                f"has GRPOTrainer.{method}{params if fn is not None else ' missing'}, expected "
                f"{'exactly ' if exact else 'at least '}{expected}. Install a supported trl or use trl.GRPOTrainer."
            )


def check_logged_metrics(trainer: Any) -> None:
    """Raise ``RuntimeError`` naming the supported TRL range if ``trainer`` has no per-mode metric lists
    (``GRPOTrainer._metrics``, which :func:`logged_metrics` reads)."""
    store = getattr(trainer, "_metrics", None)
    if not (isinstance(store, Mapping) and "train" in store and isinstance(store["train"], MutableMapping)):
        raise RuntimeError(
            f"rlguard logs into TRL's per-step metric lists (GRPOTrainer._metrics['train']), which "
            f"{type(trainer).__name__} does not have ({type(store).__name__}); rlguard supports trl{SUPPORTED_TRL}."
        )


def logged_metrics(trainer: Any, mode: str = "train") -> MutableMapping[str, list[Any]]:
    """TRL's metric lists of ``mode`` (``"train"``, ``"eval"``), keyed by what they are logged under: TRL averages
    each list into the next log record and clears it (``GRPOTrainer._metrics[mode]``, a ``defaultdict(list)``)."""
    return trainer._metrics[mode]  # type: ignore[no-any-return]


#: private attributes of DeepSpeed 0.19's ZeRO optimizers that the guard reads or calls, by stage family
_ZERO3_PRIVATE = ("averaged_gradients", "_pre_step", "_partition_all_parameters", "_overflow_clean_up", "loss_scale")
_ZERO12_PRIVATE = ("averaged_gradients", "micro_step_id", "all_grad_tensors", "_release_preflattened_grad_buffers")


def check_deepspeed_compatibility(engine: Any) -> None:
    """Raise if the guard cannot act on this DeepSpeed ``engine``: deepspeed outside :data:`SUPPORTED_DEEPSPEED`,
    ZeRO stage 0, optimizer offload, or a private attribute of the ZeRO optimizer missing. Changes nothing."""
    version = metadata.version("deepspeed")
    optimizer = engine.optimizer
    stage = int(engine.zero_optimization_stage())
    if stage == 0 or not hasattr(optimizer, "averaged_gradients"):
        raise NotImplementedError(
            f"the guard acts under DeepSpeed ZeRO stages 1-3 only; got stage {stage} with {type(optimizer).__name__}. "
            "Set zero_optimization.stage to 2 or 3 in the DeepSpeed config."
        )
    if getattr(optimizer, "cpu_offload", False) or getattr(optimizer, "offload_optimizer", False):
        raise NotImplementedError(
            "the guard does not act under ZeRO-Offload (zero_optimization.offload_optimizer): the gradients live in "
            "CPU buffers it does not read. Remove offload_optimizer from the DeepSpeed config, or use "
            "StabilityCallback() without a guard to record the stats."
        )
    needed = _ZERO3_PRIVATE if stage == 3 else _ZERO12_PRIVATE
    missing = [name for name in needed if not hasattr(optimizer, name)]
    if missing or not _in_range(version, (0, 19)):
        raise RuntimeError(
            f"the guard under DeepSpeed supports deepspeed{SUPPORTED_DEEPSPEED}; the installed deepspeed {version} "
            f"{'lacks ' + ', '.join(missing) + ' on ' + type(optimizer).__name__ if missing else 'is outside it'}. "
            "Install a supported deepspeed, or use StabilityCallback() without a guard to record the stats."
        )


def install_forward(model: Any, forward: Callable[..., Any]) -> None:
    """Bind ``forward`` as ``model.forward`` (an instance attribute, as TRL's ``add_fused_lm_head`` does)."""
    model.forward = types.MethodType(forward, model)


def zero_grad_norm(optimizer: Any) -> Tensor:
    """The 2-norm of the full averaged gradient held by a DeepSpeed ZeRO optimizer (stages 1-3), unscaled.

    Each rank holds the partition of the reduced gradient it updates (``optimizer.averaged_gradients``, filled at
    the accumulation boundary); the squares are summed locally and once over the data-parallel group. NaN and
    inf stay in the result (DeepSpeed's own norm masks them), so the guard counts them.
    """
    device = None
    squares: list[Tensor] = []
    for group in optimizer.averaged_gradients.values():
        for grad in group or ():
            if isinstance(grad, Tensor):
                squares.append(torch.linalg.vector_norm(grad.detach(), dtype=torch.float32).square())
                device = grad.device
    total = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float32, device=device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(total, group=getattr(optimizer, "dp_process_group", None))
    return total.sqrt() / float(getattr(optimizer, "loss_scale", 1.0))


def drop_zero_gradients(optimizer: Any) -> None:
    """Drop the step's gradients the way DeepSpeed's own overflow branch does, without touching the loss scale.

    Mirrors ``DeepSpeedZeroOptimizer.step`` (ZeRO-1/2) and ``DeepSpeedZeroOptimizer_Stage3.step`` (ZeRO-3) of
    deepspeed 0.19 when they find an overflow: the next accumulation starts from empty partitions.
    """
    if hasattr(optimizer, "_overflow_clean_up"):  # ZeRO-3
        optimizer._pre_step()  # micro-step id and backward flags reset, stale bucket entries cleared
        optimizer._partition_all_parameters()
        optimizer._overflow_clean_up(optimizer.loss_scale)
        return
    from deepspeed.runtime.zero.stage_1_and_2 import INITIAL_MICRO_STEP_ID

    optimizer.micro_step_id = INITIAL_MICRO_STEP_ID
    optimizer.zero_grad(set_to_none=True)
    optimizer._release_preflattened_grad_buffers()
    for key in list(optimizer.averaged_gradients):
        optimizer.averaged_gradients[key] = None
        optimizer.all_grad_tensors[key] = None


class EngineStepApplying:
    """During ``engine.step()``: the ZeRO optimizer's ``step`` runs with the LR scaled (restored before the engine
    steps its scheduler), or is replaced by :func:`drop_zero_gradients` when the step is dropped."""

    def __init__(self, optimizer: Any, *, drop: bool, lr_scale: float, grad_norm: Tensor) -> None:
        self.optimizer = optimizer
        self.drop = drop
        self.lr_scale = lr_scale
        self.grad_norm = float(grad_norm)
        self._shadowed: Any = None
        self._previous: Any = None

    def _step(self, *args: Any, **kwargs: Any) -> None:
        optimizer = self.optimizer
        lrs = [group["lr"] for group in optimizer.param_groups]
        try:
            if self.drop:
                drop_zero_gradients(optimizer)
                optimizer.overflow = False  # the step counts as taken: the engine advances its scheduler
                optimizer._global_grad_norm = self.grad_norm  # what the Trainer logs as grad_norm
            else:
                for group in optimizer.param_groups:
                    group["lr"] = group["lr"] * self.lr_scale
                self._shadowed(*args, **kwargs)
        finally:
            for group, lr in zip(optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr

    def __enter__(self) -> None:
        self._shadowed = self.optimizer.step
        # an instance attribute shadows the class's method (or torch's LR-scheduler patch, itself an instance
        # attribute) for this call only
        self._previous = vars(self.optimizer).get("step")
        self.optimizer.step = self._step

    def __exit__(self, *exc: object) -> None:
        if self._previous is None:
            del self.optimizer.step
        else:
            self.optimizer.step = self._previous


class GuardedEngineWrapper:
    """Stands in for accelerate's ``DeepSpeedEngineWrapper``: its ``backward`` with ``decide(engine)`` between
    ``engine.backward`` and ``engine.step`` at the accumulation boundary (``decide`` runs ``engine.step()`` itself);
    everything else is accelerate's wrapper's."""

    def __init__(self, engine: Any, decide: Callable[[Any], None], accelerate_wrapper: Any) -> None:
        self.engine = engine
        self.decide = decide
        self.accelerate_wrapper = accelerate_wrapper

    def backward(self, loss: Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        """accelerate's ``DeepSpeedEngineWrapper.backward``, with the guard deciding how ``engine.step()`` applies."""
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.decide(self.engine)

    def __getattr__(self, name: str) -> Any:
        wrapper = self.__dict__.get("accelerate_wrapper")
        if wrapper is None:
            raise AttributeError(name)
        return getattr(wrapper, name)  # get_global_grad_norm, ...


def install_engine_wrapper(trainer: Any, decide: Callable[[Any], None]) -> GuardedEngineWrapper:
    """Put a :class:`GuardedEngineWrapper` in place of ``trainer.accelerator.deepspeed_engine_wrapped``, after
    :func:`check_deepspeed_compatibility`; :func:`remove_engine_wrapper` puts accelerate's back."""
    current = getattr(trainer.accelerator, "deepspeed_engine_wrapped", None)
    if isinstance(current, GuardedEngineWrapper):
        current = current.accelerate_wrapper  # a second train() call on the same trainer
    engine = getattr(current, "engine", None)
    if engine is None:
        raise ValueError(
            "the guard under DeepSpeed found no DeepSpeed engine in trainer.accelerator.deepspeed_engine_wrapped "
            f"({current!r}); it must run inside trainer.train()."
        )
    check_deepspeed_compatibility(engine)
    wrapper = GuardedEngineWrapper(engine, decide, current)
    trainer.accelerator.deepspeed_engine_wrapped = wrapper
    return wrapper


def remove_engine_wrapper(trainer: Any, wrapper: GuardedEngineWrapper) -> None:
    """Undo :func:`install_engine_wrapper`."""
    trainer.accelerator.deepspeed_engine_wrapped = wrapper.accelerate_wrapper
