"""The doctor's key maps, derived from the one metric table (:mod:`rlguard.metrics`, ``docs/design.md``).

A key is read after stripping a logger's namespace (``train/`` from wandb and TensorBoard exports of TRL runs).
``rlguard/<name>`` (what rlguard's adapters log) and bare canonical names map to themselves and win over a
framework's own key for the same name: they are computed by rlguard's exact objectives.

The key tables and :func:`canonical_stats` are :mod:`rlguard.metrics`'s, shared with the live adapters; this module
adds what only the doctor needs (keys known to carry no stat) and imports no framework, so the doctor reads logs
without TRL or verl installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rlguard.metrics import (
    CANONICAL,
    DOCTOR_ONLY,
    JUDGED,
    KEY_TO_CANONICAL,
    NAMESPACES,
    TRL_TO_CANONICAL,
    VERL_TO_CANONICAL,
    canonical_name,
    canonical_stats,
    strip_namespace,
)

__all__ = [
    "CANONICAL",
    "DOCTOR_ONLY",
    "KEY_TO_CANONICAL",
    "KNOWN_KEYS",
    "KNOWN_PREFIXES",
    "NAMESPACES",
    "TRL_TO_CANONICAL",
    "VERL_TO_CANONICAL",
    "KeyReport",
    "canonical_name",
    "canonical_stats",
    "classify_keys",
    "strip_namespace",
]


#: keys known to carry no canonical stat: counters, timings, evaluation, and framework stats without a counterpart
KNOWN_PREFIXES: tuple[str, ...] = (
    "eval_",
    "eval/",
    "val-core/",
    "val-aux/",
    "test/",
    "timing_s/",
    "timing_per_token_ms/",
    "perf/",
    "rewards/",
    "tools/",
    "vespo/",
    "sampling/",
    "clip_ratio/",
    "completions/",
    "critic/",
    "prompt_length/",
    "response_length/",
    "rollout_corr/",
    "training/",
    "actor/",
    "_",
    # the guard's own records in the adapters' logs: its events and actions, not stats
    "rlguard/event/",
    "rlguard/guard/",
)
KNOWN_KEYS: frozenset[str] = frozenset(
    {"step", "global_step", "epoch", "num_tokens", "step_time", "total_flos", "aux_loss", "policy_loss", "entropy_coef"}
    | {"train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second", "Step"}
)


@dataclass(frozen=True)
class KeyReport:
    """How the keys of a log were read.

    Attributes:
        mapped: raw key -> canonical name, for every key that has one.
        known: keys recognised as carrying no canonical stat (counters, timings, evaluation, ...).
        unrecognised: every other key, sorted.
    """

    mapped: dict[str, str]
    known: list[str]
    unrecognised: list[str]

    @property
    def judged(self) -> list[str]:
        """Canonical names found that a built-in detector judges (``judged`` in :data:`rlguard.metrics.METRICS`)."""
        return sorted({c for c in self.mapped.values() if c in JUDGED})


def classify_keys(keys: Iterable[str]) -> KeyReport:
    """Sort the raw keys of a log into mapped, known and unrecognised."""
    mapped: dict[str, str] = {}
    known: list[str] = []
    unrecognised: list[str] = []
    for key in sorted(set(keys)):
        hit = canonical_name(key)
        bare = strip_namespace(key)
        if hit is not None:
            mapped[key] = hit[0]
        elif bare in KNOWN_KEYS or bare.startswith(KNOWN_PREFIXES):
            known.append(key)
        else:
            unrecognised.append(key)
    return KeyReport(mapped, known, unrecognised)
