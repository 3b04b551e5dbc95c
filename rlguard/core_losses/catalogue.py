"""What ``rlguard losses`` lists, readable without torch: each objective's name, paper, default aggregation, own
defaults and summary.

The objectives declare these themselves (``Objective.name``, ``paper``, ``summary``, :meth:`Objective.hyperparameters`),
and their classes need torch. :data:`BUILTIN` is the built-ins' declarations written out, so that the command
starts as fast as ``rlguard --version`` (``benchmarks/cli_startup.py``); ``tests/core_losses/test_catalogue.py``
checks it against the classes (it fails with the rows to paste when a class changes). Plugin objectives are read from
their classes, with torch, only when an objective plugin is installed (:func:`objective_catalogue`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from rlguard.plugins import DISABLE_AUTOLOAD_ENV, GROUPS

__all__ = ["BUILTIN", "SHARED_OPTIONS", "ObjectiveEntry", "entries_of", "objective_catalogue"]


@dataclass(frozen=True)
class ObjectiveEntry:
    """One objective as ``rlguard losses`` shows it.

    Attributes:
        name: its registered name.
        paper: its paper (``arXiv NNNN.NNNNN``), or ``""`` for an objective without one.
        aggregation: its default aggregation.
        defaults: its own hyper-parameters (those beyond :data:`SHARED_OPTIONS`) and their defaults.
        summary: what it does, in one line.
    """

    name: str
    paper: str
    aggregation: str
    defaults: dict[str, Any] = field(default_factory=dict)
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` record."""
        return {
            "name": self.name,
            "paper": self.paper,
            "aggregation": self.aggregation,
            "defaults": dict(self.defaults),
            "summary": self.summary,
        }


#: the hyper-parameters every objective takes (``Objective.hyperparameters()``)
SHARED_OPTIONS: tuple[str, ...] = (
    "aggregation",
    "beta",
    "entropy_coef",
    "kept_gradient",
    "kl_estimator",
    "kl_unbiased",
    "max_length",
    "off_policy_mask_delta",
    "on_nonfinite",
    "rollout_is",
    "rollout_is_cap",
    "rollout_mask",
    "rollout_mask_high",
    "rollout_mask_low",
)

_PPO = {"clip_low": 0.2, "clip_high": 0.2, "clip_c": None}
_GSPO = {"clip_low": 0.0003, "clip_high": 0.0004, "clip_c": None}
_DPPO = {"clip_low": 0.2, "clip_high": 0.2, "is_cap": 20.0}

#: the built-in objectives' declarations, in ``BUILTIN_OBJECTIVES`` order (checked against the classes)
BUILTIN: tuple[ObjectiveEntry, ...] = (
    ObjectiveEntry(
        "grpo", "arXiv 2402.03300", "seq-mean-token-mean", _PPO, "token ratio, PPO clip; sequence mean of token means"
    ),
    ObjectiveEntry(
        "dr_grpo",
        "arXiv 2503.20783",
        "seq-mean-token-sum-norm",
        _PPO,
        "GRPO without length bias: token sum / (G * max_length)",
    ),
    ObjectiveEntry(
        "dapo",
        "arXiv 2503.14476",
        "token-mean",
        {"clip_low": 0.2, "clip_high": 0.28, "clip_c": None},
        "clip-higher (0.2, 0.28), token mean over the batch",
    ),
    ObjectiveEntry(
        "gspo",
        "arXiv 2507.18071",
        "seq-mean-token-mean",
        _GSPO,
        "length-normalised sequence ratio, clipped per sequence",
    ),
    ObjectiveEntry(
        "gspo_token",
        "arXiv 2507.18071",
        "seq-mean-token-mean",
        _GSPO,
        "GSPO for token-level advantages: sg[s_i] pi_t / sg[pi_t]",
    ),
    ObjectiveEntry(
        "cispo",
        "arXiv 2506.13585",
        "token-mean",
        {"clip_low": None, "clip_high": 4.0, "bounds": "relative"},
        "clipped, detached IS weight times log-prob",
    ),
    ObjectiveEntry(
        "sapo",
        "arXiv 2511.20347",
        "seq-mean-token-mean",
        {"tau_pos": 1.0, "tau_neg": 1.05},
        "soft sigmoid gate 4/tau * sigmoid(tau (r - 1))",
    ),
    ObjectiveEntry(
        "gmpo",
        "arXiv 2507.20673",
        "seq-mean-token-mean",
        {"clip_low": 0.4, "clip_high": 0.4},
        "geometric mean of sign-aware clipped token ratios",
    ),
    ObjectiveEntry(
        "luspo",
        "arXiv 2602.05261",
        "seq-mean-token-sum",
        _GSPO,
        "GSPO's clipped sequence ratio, summed over each sequence's tokens",
    ),
    ObjectiveEntry(
        "vespo",
        "arXiv 2602.10693",
        "token-mean",
        {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
        "gamma kernel W^k e^(lambda (1 - W)) on the sequence IS weight, detached",
    ),
    ObjectiveEntry(
        "clip_cov",
        "arXiv 2505.22617",
        "token-mean",
        {"clip_low": 0.2, "clip_high": 0.2, "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}
        | {"generator": None},
        "PPO clip; random high-covariance tokens lose their gradient",
    ),
    ObjectiveEntry(
        "kl_cov",
        "arXiv 2505.22617",
        "token-mean",
        {"kl_cov_ratio": 0.0002, "kl_cov_coef": 1.0},
        "-A r, |log r| penalty on the top-covariance tokens",
    ),
    ObjectiveEntry("gpg", "arXiv 2504.02546", "token-mean", {}, "plain policy gradient -A log pi"),
    ObjectiveEntry(
        "dppo_tv",
        "arXiv 2602.04879",
        "token-mean",
        _DPPO,
        "TV trust region |pi - pi_old| <= delta on the sampled token; truncated IS",
    ),
    ObjectiveEntry(
        "dppo_kl", "arXiv 2602.04879", "token-mean", _DPPO, "binary-KL trust region on the sampled token; truncated IS"
    ),
    ObjectiveEntry("dro", "arXiv 2405.19107", "token-mean", {"tau": 1.0}, "-A log pi + tau/2 (log pi/pi_old)^2"),
)


def entries_of(classes: Iterable[Any]) -> list[ObjectiveEntry]:
    """The entries of objective ``classes`` from their own declarations (needs the classes, so torch)."""
    out = []
    for cls in classes:
        params = cls.hyperparameters()
        own = {k: v for k, v in params.items() if k not in SHARED_OPTIONS}
        out.append(ObjectiveEntry(cls.name, cls.paper, params["aggregation"], own, cls.summary))
    return out


def _objective_plugins_installed() -> bool:
    """Whether an entry point of a group the objectives load is installed (and autoloading is on)."""
    if os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() in {"1", "true", "yes"}:
        return False
    return any(True for group in GROUPS["objective"] for _ in entry_points(group=group))


def objective_catalogue() -> list[ObjectiveEntry]:
    """Every registered objective, sorted by name: the built-ins from :data:`BUILTIN`; with an objective plugin
    installed, its objectives from their classes (which imports torch and the plugin, and reports a plugin that
    fails to load in one line)."""
    entries = list(BUILTIN)
    if _objective_plugins_installed():
        from rlguard.core_losses.registry import objective_registry  # torch: only for a plugin's classes

        builtin = {e.name for e in BUILTIN}
        entries += entries_of(cls for name, cls in objective_registry().items() if name not in builtin)
    return sorted(entries, key=lambda e: e.name)
