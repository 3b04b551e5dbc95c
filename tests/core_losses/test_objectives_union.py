"""What the generic reference comparison of ``test_objectives.py`` cannot show for the eight objectives added
for the TRL/verl union: that their distinctive mechanism is active on the data and does what the paper says.

Each test writes out the expected arithmetic with plain tensor ops or Python floats, independent of rlguard.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rlguard.core_losses import PolicyBatch, get_objective
from tests.helpers.objective_batches import assert_close, grad_of, make_batch, policy_batch


def _tokens(mask: torch.Tensor) -> list[tuple[int, int]]:
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if float(mask[i, t]) != 0.0]


# ---------------------------------------------------------------- Clip-Cov
def _covariances(d: dict[str, Any]) -> dict[tuple[int, int], float]:
    keys = _tokens(d["mask"])
    lp = {k: float(d["logprobs"][k].detach()) for k in keys}
    adv = d["advantages"]
    a = {k: float(adv[k[0]] if adv.dim() == 1 else adv[k]) for k in keys}
    mean_lp, mean_a = sum(lp.values()) / len(keys), sum(a.values()) / len(keys)
    return {k: (lp[k] - mean_lp) * (a[k] - mean_a) for k in keys}


def test_clip_cov_drops_random_candidates_reproducibly() -> None:
    """With clip_cov_ratio = 0.1 several tokens are dropped: each has Cov in (lb, ub) and a zero gradient;
    the same generator state draws the same tokens, another state other ones."""
    d = make_batch(seed=5)
    hp = {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.2, "clip_cov_ub": 5.0, "clip_low": 0.2, "clip_high": 0.2}
    cov = _covariances(d)
    candidates = [k for k, c in cov.items() if 0.2 < c < 5.0]
    n_drop = max(1, int(0.1 * len(cov)))
    assert len(candidates) > n_drop + 2, "the data must leave a choice"

    def dropped(seed: int) -> set[tuple[int, int]]:
        out = get_objective("clip_cov", generator=torch.Generator().manual_seed(seed), **hp)(policy_batch(d))
        # without any drop the gradient of a token with A != 0 is zero only where PPO clipped it
        plain = get_objective("grpo", aggregation="token-mean", clip_low=0.2, clip_high=0.2)(policy_batch(d))
        g, g_plain = grad_of(out.loss, d["logprobs"]), grad_of(plain.loss, d["logprobs"])
        return {k for k in cov if float(g[k]) == 0.0 and float(g_plain[k]) != 0.0}

    first, again, other = dropped(0), dropped(0), dropped(1)
    assert len(first) == n_drop
    assert first == again
    assert first != other
    assert all(k in candidates for k in first | other)


def test_clip_cov_uses_the_default_generator_when_none_is_given() -> None:
    d = make_batch(seed=5)
    hp = {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.2}
    torch.manual_seed(7)
    a = get_objective("clip_cov", **hp)(policy_batch(d)).loss.detach()
    torch.manual_seed(7)
    b = get_objective("clip_cov", **hp)(policy_batch(d)).loss.detach()
    c = get_objective("clip_cov", **hp)(policy_batch(d)).loss.detach()  # the global state has moved on
    assert float(a) == float(b)
    assert float(a) != float(c)


# ---------------------------------------------------------------- KL-Cov
def test_kl_cov_penalises_exactly_the_top_covariance_tokens() -> None:
    d = make_batch(seed=9)
    ratio, coef = 0.1, 0.7
    cov = _covariances(d)
    k = max(1, int(ratio * len(cov)))
    top = sorted(cov, key=cov.__getitem__, reverse=True)[:k]
    out = get_objective("kl_cov", kl_cov_ratio=ratio, kl_cov_coef=coef)(policy_batch(d))
    base = get_objective("kl_cov", kl_cov_ratio=ratio, kl_cov_coef=0.0)(policy_batch(d))
    lp, old = d["logprobs"].detach(), d["old_logprobs"]
    penalty = sum(coef * abs(float(lp[key] - old[key])) for key in top) / len(cov)  # token mean
    assert float((out.loss - base.loss).detach()) == pytest.approx(penalty, rel=1e-12)
    assert penalty > 0


# ---------------------------------------------------------------- DPPO
@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_masks_only_tokens_pushed_out_of_the_trust_region(name: str) -> None:
    d = make_batch(seed=13)
    delta = 0.05 if name == "dppo_tv" else 0.02
    out = get_objective(name, clip_low=delta, clip_high=delta)(policy_batch(d))
    g = grad_of(out.loss, d["logprobs"])
    n_out = n_in = 0
    for i, t in _tokens(d["mask"]):
        a = float(d["advantages"][i])
        if a == 0:
            continue
        p, mu = math.exp(float(d["logprobs"][i, t].detach())), math.exp(float(d["old_logprobs"][i, t]))
        binary_kl = mu * math.log(mu / p) + (1 - mu) * math.log((1 - mu) / (1 - p))
        div = abs(p - mu) if name == "dppo_tv" else binary_kl
        pushed_out = div > delta and (p > mu if a > 0 else p < mu)
        n_out += pushed_out
        n_in += not pushed_out
        assert (float(g[i, t]) == 0.0) == pushed_out, (i, t)
    assert n_out > 0 and n_in > 0
    assert float(out.metrics["clip_frac"]) > 0


def test_dppo_rejects_positive_log_probs() -> None:
    lp = torch.tensor([[-0.5, 0.3]], dtype=torch.float64)
    batch = PolicyBatch(logprobs=lp, advantages=torch.ones(1, dtype=torch.float64), mask=torch.ones_like(lp))
    with pytest.raises(ValueError, match=r"logprobs holds 1 positive values.*\(0, 1\)"):
        get_objective("dppo_kl")(batch)


# ---------------------------------------------------------------- VESPO, LUSPO
def test_vespo_kernel_is_one_on_policy_and_decays_off_policy() -> None:
    """phi(W) = W^k e^(lambda (1 - W)): 1 at W = 1, so the on-policy loss is -A log pi; for one token with
    W = e^0.5 and A > 0 the weight is e^(2 * 0.5) e^(3 (1 - e^0.5))."""
    lp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([2.0], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.float64)
    on = get_objective("vespo")(PolicyBatch(logprobs=lp, advantages=adv, mask=mask))
    assert float(on.loss.detach()) == pytest.approx(2.0, rel=1e-12)
    off = get_objective("vespo")(PolicyBatch(logprobs=lp, advantages=adv, mask=mask, old_logprobs=lp.detach() - 0.5))
    w = math.exp(0.5)
    phi = w**2.0 * math.exp(3.0 * (1.0 - w))
    assert float(grad_of(off.loss, lp).detach()) == pytest.approx(-2.0 * phi, rel=1e-12)
    assert phi < 0.5


def test_luspo_is_gspo_times_sequence_length() -> None:
    """Per sequence, LUSPO's term is |y_i| times GSPO's (one advantage per sequence, GSPO's per-sequence mean)."""
    d = make_batch(seed=17)
    lengths = d["mask"].sum(-1)
    luspo = get_objective("luspo")(policy_batch(d))
    gspo_sum = torch.zeros((), dtype=torch.float64)
    for i in range(d["mask"].shape[0]):
        if float(lengths[i]) == 0:
            continue
        one = {k: (v[i : i + 1] if v is not None else None) for k, v in d.items()}
        gspo_sum = gspo_sum + float(lengths[i]) * get_objective("gspo")(policy_batch(one)).loss
    assert_close(luspo.loss, gspo_sum / int((lengths > 0).sum()))


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("name", "hp", "match"),
    [
        ("clip_cov", {"clip_cov_ratio": 0.0}, "clip_cov_ratio must be a number > 0.0"),
        ("clip_cov", {"clip_cov_lb": 2.0, "clip_cov_ub": 1.0}, "clip_cov_ub must be a number > 2.0"),
        ("clip_cov", {"generator": 3}, "generator must be a torch.Generator"),
        ("kl_cov", {"kl_cov_ratio": 1.5}, "kl_cov_ratio must be a number > 0.0 and <= 1.0"),
        ("vespo", {"lambda_neg": 0.0}, "lambda_neg must be a number > 0.0"),
        ("dro", {"tau": -1.0}, "tau must be a number > 0.0"),
        ("dppo_tv", {"is_cap": 0.0}, "is_cap must be a number > 0.0"),
    ],
)
def test_bad_hyperparameters_are_named(name: str, hp: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_objective(name, **hp)


# ---------------------------------------------------------------- the collapse benchmark takes them
@pytest.mark.parametrize("name", ["luspo", "vespo", "clip_cov", "kl_cov", "gpg", "dppo_tv", "dppo_kl", "dro"])
def test_collapse_benchmark_runs_each(name: str) -> None:
    """``rlguard bench collapse --objectives NAME`` trains with it, guarded: finite rewards at every batch."""
    from rlguard.bench.collapse import RunConfig, run_one

    result = run_one(RunConfig(objective=name, guard="default", iterations=3, warm_start_steps=5))
    assert len(result.rewards) == 3 and all(math.isfinite(r) for r in result.rewards)
