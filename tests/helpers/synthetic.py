"""Synthetic metric streams with known failure onsets, for testing and calibrating detectors.

A healthy run of a given ``shape`` (``rising``, ``plateau``, ``slow``, ``noisy``) has per-step canonical stats
with realistic noise: lognormal gradient norms, rewards rising or flat, entropy decaying gently at the run's own
level (drawn between 0.15 and 2 nats: LLM per-token entropy is often below 1), a slowly growing KL to the
reference. A failure mode rewrites the stream from ``onset`` on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, get_args

import numpy as np

Shape = Literal["rising", "plateau", "slow", "noisy"]
SHAPES: tuple[str, ...] = get_args(Shape)
Stream = list[dict[str, float]]


def healthy_stream(steps: int, seed: int, shape: Shape = "rising") -> Stream:
    """``steps`` dicts of canonical stats of a healthy run."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {list(SHAPES)}; got {shape!r}.")
    rng = np.random.default_rng(seed)
    noise = 2.0 if shape == "noisy" else 1.0
    t = np.arange(steps) / max(steps - 1, 1)
    e0 = float(rng.uniform(0.15, 2.0))
    g0 = float(rng.uniform(0.3, 5.0))
    if shape == "plateau":
        reward = np.full(steps, rng.uniform(0.3, 0.6))
        entropy = np.full(steps, e0)
    elif shape == "slow":
        reward = 0.3 + 0.15 * t
        entropy = e0 * (1 - 0.2 * t)
    else:
        reward = 0.2 + 0.6 / (1 + np.exp(-8 * (t - 0.4)))
        entropy = e0 * (1 - 0.4 * t)
    lengths = rng.uniform(50, 300) * (1 + 0.3 * t)
    out: Stream = []
    for i in range(steps):
        ln = rng.normal
        out.append(
            {
                "loss": float(ln(0, 0.05 * noise)),
                "reward_mean": float(reward[i] + ln(0, 0.04 * noise)),
                "reward_std": float(abs(0.3 + ln(0, 0.02))),
                "entropy": float(entropy[i] * math.exp(ln(0, 0.04 * noise))),
                "grad_norm": float(g0 * (1 + 0.3 * t[i]) * math.exp(ln(0, 0.25 * noise))),
                "kl_ref": float((1e-3 + 0.03 * t[i]) * math.exp(ln(0, 0.2 * noise))),
                "kl_old": float(2e-3 * math.exp(ln(0, 0.3 * noise))),
                "ratio_max": float(1.0 + 0.5 * math.exp(ln(0, 0.4 * noise))),
                "clip_frac": float(0.03 * math.exp(ln(0, 0.3 * noise))),
                "mismatch_kl": float(3e-4 * math.exp(ln(0, 0.3 * noise))),
                "length_mean": float(lengths[i] * math.exp(ln(0, 0.05 * noise))),
                "truncated_frac": float(rng.binomial(64, 0.02) / 64),
                "repetition_rate": float(rng.binomial(64, 0.01) / 64),
                "frac_zero_std_groups": float(rng.binomial(16, 0.15) / 16),
                "frac_zero_std_solved": float(rng.binomial(16, 0.05) / 16),
                "nonfinite": 0.0,
                "lr": 1e-6,
            }
        )
    return out


def _ramp(i: int, onset: int, length: int) -> float:
    """0 before ``onset``, rising linearly to 1 over ``length`` steps."""
    return min(max((i - onset) / length, 0.0), 1.0)


def _entropy_collapse(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    k = _ramp(i, onset, 20)
    s["entropy"] *= (1 - 0.97 * k) ** strength
    s["reward_mean"] -= 0.1 * k * strength


def _entropy_blowup(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    # towards uniform noise: entropy up to 12x its level (at least 4.5 nats, at most ln 151936 = 11.9), reward falling
    k = _ramp(i, onset, 10)
    s["entropy"] = min(max(s["entropy"] * (1 + 11 * k) ** strength, 4.5 * k * strength), 11.9)
    s["reward_mean"] -= 0.3 * k * strength


def _length_collapse(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    s["length_mean"] *= (1 - 0.97 * _ramp(i, onset, 5)) ** strength


def _reward_collapse(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    s["reward_mean"] -= 0.5 * _ramp(i, onset, 15) * strength


def _grad_spike(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    if i == onset:
        s["grad_norm"] *= 200.0**strength


def _grad_explosion(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    s["grad_norm"] *= 1.15 ** (max(i - onset, 0) * strength)


def _nonfinite(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    # a NaN has no strength
    if i == onset:
        s["loss"] = math.nan
        s["nonfinite"] = 12.0


def _kl_ref_blowup(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    s["kl_ref"] *= 1.4 ** (max(i - onset, 0) * strength)


def _kl_old_blowup(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    if i >= onset:
        s["kl_old"] *= 300.0**strength


def _ratio_explosion(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    if i == onset:
        s["ratio_max"] = 5e3**strength


def _clip_burst(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    if i >= onset:
        s["clip_frac"] = min(0.6 * strength, 1.0)


def _mismatch_growth(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    s["mismatch_kl"] *= 1.2 ** (max(i - onset, 0) * strength)


def _length_explosion(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    k = _ramp(i, onset, 30)
    s["length_mean"] *= (1 + 3 * k) ** strength
    s["truncated_frac"] = max(s["truncated_frac"], min(0.8 * k * strength, 1.0))


def _repetition(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    s["repetition_rate"] = max(s["repetition_rate"], min(0.5 * _ramp(i, onset, 5) * strength, 1.0))


def _too_easy(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    if i >= onset:
        s["frac_zero_std_groups"], s["frac_zero_std_solved"] = min(0.95 * strength, 1.0), min(0.9 * strength, 1.0)


def _too_hard(s: dict[str, float], i: int, onset: int, strength: float = 1.0) -> None:
    if i >= onset:
        s["frac_zero_std_groups"], s["frac_zero_std_solved"] = min(0.95 * strength, 1.0), 0.0


#: failure mode -> (how it rewrites the stream, the detector expected to catch it)
FAILURES: dict[str, tuple[Callable[[dict[str, float], int, int, float], None], str]] = {
    "entropy_collapse": (_entropy_collapse, "entropy_collapse"),
    "entropy_blowup": (_entropy_blowup, "entropy_blowup"),
    "length_collapse": (_length_collapse, "length_collapse"),
    "reward_collapse": (_reward_collapse, "reward_collapse"),
    "grad_spike": (_grad_spike, "grad_norm_spike"),
    "grad_explosion": (_grad_explosion, "grad_norm_explosion"),
    "nonfinite": (_nonfinite, "nonfinite"),
    "kl_ref_blowup": (_kl_ref_blowup, "kl_ref_blowup"),
    "kl_old_blowup": (_kl_old_blowup, "kl_old_blowup"),
    "ratio_explosion": (_ratio_explosion, "ratio_explosion"),
    "clip_burst": (_clip_burst, "clip_frac_burst"),
    "mismatch_growth": (_mismatch_growth, "mismatch_growth"),
    "length_explosion": (_length_explosion, "length_explosion"),
    "truncation": (_length_explosion, "truncation"),
    "repetition": (_repetition, "repetition"),
    "too_easy": (_too_easy, "zero_variance_groups"),
    "too_hard": (_too_hard, "zero_variance_groups"),
}


#: stats TRL logs only on generation steps (with ``steps_per_generation > gradient_accumulation_steps``)
GENERATION_STATS: tuple[str, ...] = (
    "reward_mean",
    "reward_std",
    "frac_zero_std_groups",
    "frac_zero_std_solved",
    "length_mean",
    "truncated_frac",
    "repetition_rate",
)


def sparse_stream(stream: Stream, every: int) -> Stream:
    """``stream`` with :data:`GENERATION_STATS` kept on every ``every``-th step only (absent, not 0, elsewhere)."""
    if every < 1:
        raise ValueError(f"every must be >= 1; got {every}.")
    return [{k: v for k, v in s.items() if i % every == 0 or k not in GENERATION_STATS} for i, s in enumerate(stream)]


def failing_stream(
    mode: str, steps: int, onset: int, seed: int, shape: Shape = "rising", strength: float = 1.0
) -> Stream:
    """A healthy stream of ``shape`` with failure ``mode`` (a key of :data:`FAILURES`) from step ``onset``.

    ``strength`` scales the fault: the exponent of a multiplicative change (a factor ``f`` becomes ``f**strength``:
    its size in log space, where the detectors judge it), the multiple of an additive one (a reward drop, a
    fraction, capped at 1); a non-finite value has none. 1 is the committed stream, value for value."""
    if not strength > 0:
        raise ValueError(f"strength must be > 0; got {strength}.")
    if mode not in FAILURES:
        raise ValueError(f"unknown failure mode {mode!r}; modes: {', '.join(FAILURES)}.")
    stream = healthy_stream(steps, seed, shape)
    inject, _ = FAILURES[mode]
    for i, s in enumerate(stream):
        inject(s, i, onset, strength)
    return stream
