"""Per-token weights on an objective's policy term: how frameworks' token masks and IS weights reach the loss."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torch import Tensor

from rlguard.core_losses.batch import PreparedBatch
from rlguard.core_losses.objective import Objective
from rlguard.core_losses.ratios import Surrogate

_WITH_TOKEN_WEIGHTS: dict[type[Objective], Callable[..., Objective]] = {}


def with_token_weights(cls: type[Objective]) -> Callable[..., Objective]:
    """``cls`` whose per-token policy terms are multiplied by ``token_weights`` ``(B, T)`` (detached): after the
    surrogate, before KL, entropy and aggregation, and without changing the normalisers. That is where verl
    applies ``rollout_is_weights`` and TRL its ``top_entropy_quantile`` mask. One subclass per class."""
    if cls in _WITH_TOKEN_WEIGHTS:
        return _WITH_TOKEN_WEIGHTS[cls]

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class WithTokenWeights(cls):  # type: ignore[valid-type, misc]  # a class built at run time
        token_weights: Tensor | None = None  # (B, T), detached

        def surrogate(self, log_ratio: Tensor, batch: PreparedBatch, mask: Tensor) -> Surrogate:
            terms: Surrogate = super().surrogate(log_ratio, batch, mask)
            if self.token_weights is None:
                return terms
            return dataclasses.replace(terms, loss=terms.loss * self.token_weights.detach().to(terms.loss.dtype))

    WithTokenWeights.__name__ = WithTokenWeights.__qualname__ = f"{cls.__name__}WithTokenWeights"
    _WITH_TOKEN_WEIGHTS[cls] = WithTokenWeights
    return WithTokenWeights


def weighted(objective: Objective, token_weights: Tensor) -> Objective:
    """``objective`` (its hyper-parameters unchanged) with ``token_weights`` ``(B, T)`` on its policy term."""
    values = {f.name: getattr(objective, f.name) for f in dataclasses.fields(objective) if f.init}
    values.pop("token_weights", None)
    return with_token_weights(type(objective))(token_weights=token_weights, **values)
