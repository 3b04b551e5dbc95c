"""rlguard's objectives against the independent float64 reference in ``tests/helpers/reference.py``, plus invariances.

Every batch is float64 and seeded (see ``make_batch``). Masks are random and always contain a row with one
unmasked token at a random position, one with a single token at position 0, a full row and an empty row.
Log-ratios have a per-row scale from {1e-4, 0.05, 0.3, 1.5}, pushed towards or away from the advantage's sign,
so that tight (GSPO), medium (GRPO/GMPO) and loose (CISPO, dual-clip) clip ranges are all active on some terms
and inactive on others; each comparison asserts that this is so.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import pytest
import torch

from rlguard.core_losses import PolicyBatch, get_objective
from tests.helpers.objective_batches import assert_close, grad_of, make_batch, policy_batch
from tests.helpers.reference import (
    AGGREGATIONS,
    OBJECTIVES,
    clip_fractions,
    reference_grad,
    reference_loss,
    seq_ratios,
    token_ratios,
)

SPLIT_TOL = 1e-9  # split invariance, float64
CLIPPED = {"grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "cispo", "gmpo", "luspo", "clip_cov", "dppo_tv", "dppo_kl"}
#: objectives whose terms depend on statistics of the whole (micro-)batch (the covariance of log-prob and
#: advantage over its tokens, as in the paper and verl): micro-batches do not add up to the batch
BATCH_STATISTICS = {"clip_cov", "kl_cov"}
#: DPPO's default thresholds (verl's 0.2) bind on a few tokens of these batches only; tighter ones make the
#: comparison reach both sides of every trust region
TIGHTER = {"dppo_tv": {"clip_low": 0.05, "clip_high": 0.05}, "dppo_kl": {"clip_low": 0.02, "clip_high": 0.02}}
RNG_SEED = 1234  # Clip-Cov's random token draw: the objective and the reference get generators in this state


def with_generator(name: str, hp: dict[str, Any]) -> dict[str, Any]:
    """``hp`` plus a freshly seeded generator for Clip-Cov, so that each call draws the same tokens."""
    return {**hp, "generator": torch.Generator().manual_seed(RNG_SEED)} if name == "clip_cov" else hp


def reference(name: str, d: dict[str, Any], **kw: Any):
    return reference_loss(
        name,
        d["logprobs"],
        d["advantages"],
        d["mask"],
        old_logprobs=d["old_logprobs"],
        ref_logprobs=d["ref_logprobs"],
        rollout_logprobs=d["rollout_logprobs"],
        entropies=d["entropies"],
        **kw,
    )


# ---------------------------------------------------------------- 1. against the reference
OPTION_CASES: list[tuple[str, dict[str, Any]]] = []
for _name in OBJECTIVES:
    OPTION_CASES.append((_name, {}))
    for _agg in AGGREGATIONS:
        OPTION_CASES.append((_name, {"aggregation": _agg}))
    OPTION_CASES.append((_name, {"beta": 0.05, "kl_estimator": "k3"}))
    OPTION_CASES.append((_name, {"rollout_is": "token"}))
    OPTION_CASES.append((_name, {"rollout_is": "sequence"}))
    for _level in ("token", "sequence", "geometric"):
        OPTION_CASES.append((_name, {"rollout_mask": _level}))
    OPTION_CASES.append((_name, {"off_policy_mask_delta": 0.05}))
OPTION_CASES += [
    ("grpo", {"clip_c": 3.0}),
    ("dapo", {"clip_c": 3.0}),
    ("grpo", {"clip_low": 0.1, "clip_high": 0.3}),
    ("grpo", {"beta": 0.05, "kl_estimator": "k1"}),
    ("grpo", {"beta": 0.05, "kl_estimator": "k2"}),
    ("grpo", {"beta": 0.05, "kl_estimator": "k3"}),
    ("grpo", {"beta": 0.05, "kl_estimator": "k1", "kl_unbiased": True}),
    ("grpo", {"beta": 0.05, "kl_estimator": "k2", "kl_unbiased": True}),
    ("grpo", {"beta": 0.05, "kl_estimator": "k3", "kl_unbiased": True}),
    ("gspo", {"beta": 0.05, "kl_estimator": "k3", "kl_unbiased": True}),
    ("grpo", {"entropy_coef": 0.01}),
    ("sapo", {"entropy_coef": 0.01}),
    ("gmpo", {"entropy_coef": 0.01}),
    ("grpo", {"rollout_is": "token", "rollout_is_cap": 1.5}),
    ("grpo", {"rollout_mask": "token", "rollout_mask_low": 0.7, "rollout_mask_high": 1.6}),
    ("grpo", {"rollout_is": "token", "rollout_mask": "geometric"}),
    ("dr_grpo", {"max_length": 11}),
    ("gspo", {"clip_low": 0.1, "clip_high": 0.1}),
    ("cispo", {"bounds": "absolute", "clip_low": 0.5, "clip_high": 2.0}),
    ("cispo", {"bounds": "relative", "clip_low": 0.5, "clip_high": 1.0}),
    ("sapo", {"tau_pos": 2.0, "tau_neg": 0.5}),
    ("gmpo", {"clip_low": 0.2, "clip_high": 0.6}),
]


def _case_id(case: tuple[str, dict[str, Any]]) -> str:
    name, hp = case
    return name + ("-" + ",".join(f"{k}={v}" for k, v in hp.items()) if hp else "")


@pytest.mark.parametrize("token_adv", [False, True], ids=["seq_adv", "token_adv"])
@pytest.mark.parametrize("case", OPTION_CASES, ids=[_case_id(c) for c in OPTION_CASES])
def test_matches_reference(case: tuple[str, dict[str, Any]], token_adv: bool) -> None:
    name, hp = case
    d = make_batch(seed=zlib.crc32(_case_id(case).encode()) % 10_000, token_adv=token_adv)
    hp = {**TIGHTER.get(name, {}), **hp}
    ref = reference(name, d, **with_generator(name, hp))
    expected_grad = reference_grad(ref, d["logprobs"])

    out = get_objective(name, **with_generator(name, hp))(policy_batch(d))
    assert out.loss.dim() == 0
    assert_close(out.loss, ref.loss)
    assert_close(grad_of(out.loss, d["logprobs"]), expected_grad)

    # the test must exercise the interesting branches
    n_tokens = int(d["mask"].sum())
    if name in CLIPPED:
        assert 0 < ref.num_clipped_kept < len(ref.kept), "clipping should be active on some terms, not all"
        if "clip_frac" in out.metrics:
            assert float(out.metrics["clip_frac"]) > 0.0
    if hp.get("clip_c") is not None:
        assert any(
            float(torch.exp(d["logprobs"][i, t].detach() - d["old_logprobs"][i, t])) > hp["clip_c"]
            and float(d["advantages"][i] if d["advantages"].dim() == 1 else d["advantages"][i, t]) < 0
            for i, t in ref.clipped
        ), "dual clip should be active"
    if "rollout_mask" in hp or "off_policy_mask_delta" in hp:
        assert 0 < ref.num_dropped < n_tokens, "masking should drop some tokens, not all"
    if hp.get("rollout_is") is not None:
        cap = hp.get("rollout_is_cap", 2.0)
        log_rho = (d["old_logprobs"] - d["rollout_logprobs"])[d["mask"] != 0]
        assert bool((log_rho.exp() > cap).any()), "the IS cap should be active"


def test_explicit_normalisers_match_reference() -> None:
    d = make_batch(seed=7)
    for name in OBJECTIVES:
        for agg in AGGREGATIONS:
            hp = with_generator(name, {"aggregation": agg})
            ref = reference(name, d, num_tokens=97, num_sequences=13, **hp)
            hp = with_generator(name, {"aggregation": agg})
            out = get_objective(name, **hp)(policy_batch(d), num_tokens=97, num_sequences=13)
            assert_close(out.loss, ref.loss)
            assert_close(grad_of(out.loss, d["logprobs"]), reference_grad(ref, d["logprobs"]))


# ---------------------------------------------------------------- 2. identities between objectives
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_and_gspo_token_agree_for_sequence_advantages(aggregation: str) -> None:
    d = make_batch(seed=11)
    gspo = get_objective("gspo", aggregation=aggregation)(policy_batch(d))
    g1 = grad_of(gspo.loss, d["logprobs"])
    tok = get_objective("gspo_token", aggregation=aggregation)(policy_batch(d))
    g2 = grad_of(tok.loss, d["logprobs"])
    assert_close(tok.loss, gspo.loss)
    assert_close(g2, g1)
    # some sequences clipped (zero gradient despite A != 0), some not
    live = (d["advantages"] != 0)[:, None] & (d["mask"] != 0)
    assert bool((g1[live] == 0).any()) and bool((g1[live] != 0).any())


@pytest.mark.parametrize("clip", [(3e-4, 4e-4), (0.2, 0.28)])
def test_gspo_equals_grpo_for_one_token_sequences(clip: tuple[float, float]) -> None:
    g = torch.Generator().manual_seed(5)
    B = 16
    logprobs = (-(0.1 + torch.rand(B, 1, generator=g, dtype=torch.float64))).requires_grad_(True)
    scale = torch.tensor([1e-4, 0.3] * (B // 2), dtype=torch.float64)[:, None]
    old = logprobs.detach() - scale * torch.randn(B, 1, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, 1, dtype=torch.float64)
    mask[3] = 0.0
    batch = PolicyBatch(logprobs=logprobs, advantages=adv, mask=mask, old_logprobs=old)
    hp = {"clip_low": clip[0], "clip_high": clip[1]}
    gspo = get_objective("gspo", **hp)(batch)
    grpo = get_objective("grpo", **hp)(batch)
    g_gspo, g_grpo = grad_of(gspo.loss, logprobs), grad_of(grpo.loss, logprobs)
    assert_close(gspo.loss, grpo.loss)
    assert_close(g_gspo, g_grpo)
    assert bool((g_grpo[mask != 0] == 0).any()) and bool((g_grpo != 0).any())


def plain_policy_gradient_loss(
    logprobs: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, aggregation: str
) -> torch.Tensor:
    """-A·logp aggregated, vectorised (no reference code). adv ``(B, T)``."""
    lengths = mask.sum(-1)
    G = (lengths > 0).sum()
    term = -adv * torch.where(mask != 0, logprobs, torch.zeros_like(logprobs))
    if aggregation == "token-mean":
        return term.sum() / mask.sum()
    if aggregation == "seq-mean-token-mean":
        return (term.sum(-1) / lengths.clamp(min=1)).sum() / G
    if aggregation == "seq-mean-token-sum":
        return term.sum() / G
    return term.sum() / (G * mask.shape[1])


@pytest.mark.parametrize("token_adv", [False, True], ids=["seq_adv", "token_adv"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("name", [n for n in OBJECTIVES if n != "clip_cov"])  # Clip-Cov drops a token even on-policy
def test_on_policy_gradient_is_the_policy_gradient(name: str, aggregation: str, token_adv: bool) -> None:
    # On-policy r = 1 (s_i = 1) and no clip is active, so every clipped surrogate has the gradient of
    # -A·logp under the same aggregation (CISPO: sg[clip(1)] = 1). SAPO: d/dlogp [σ(τ(r-1))·4/τ] = σ'(0)·4 = 1.
    # GMPO: l_i = -A_i exp(Σ_t m x_it / L_i) has d l_i/dlogp_it = -A_i m_it / L_i, the gradient of the
    # geometric form -A_i·mean_t logp_it; broadcast over the L_i tokens of sequence i, L_i·mean_t = Σ_t, so
    # under every aggregation this is -A_i·logp aggregated, with A_i the masked mean of the token advantages.
    # GSPO likewise: Σ_t' A_it' ds_i/dlogp_it = L_i·A_i·m_it/L_i, so it sees the mean advantage A_i too;
    # GSPO-token keeps A_it; LUSPO is GSPO. VESPO: phi(1) = 1; DPPO: r = 1, every token in its trust region;
    # KL-Cov: |log r| = 0 with subgradient 0; DRO: the square has zero slope at log r = 0; GPG is -A·logp.
    d = make_batch(seed=3, on_policy=True, token_adv=token_adv)
    mask = d["mask"]
    adv = d["advantages"] if token_adv else d["advantages"][:, None].expand_as(mask)
    if name in ("gmpo", "gspo", "luspo"):
        seq_mean = (adv * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        adv = seq_mean.expand_as(mask)
    out = get_objective(name, aggregation=aggregation)(policy_batch(d))
    got = grad_of(out.loss, d["logprobs"])
    expected = grad_of(plain_policy_gradient_loss(d["logprobs"], adv, mask, aggregation), d["logprobs"])
    assert_close(got, expected)
    assert bool((expected != 0).any())


# ---------------------------------------------------------------- 3. padding invariance
PAD_CASES: list[tuple[str, dict[str, Any]]] = []
for _name in OBJECTIVES:
    PAD_CASES.append((_name, {}))
    PAD_CASES.append(
        (
            _name,
            {
                "beta": 0.05,
                "kl_estimator": "k3",
                "entropy_coef": 0.01,
                "rollout_is": "token",
                "rollout_mask": "geometric",
                "aggregation": "seq-mean-token-sum-norm",
            },
        )
    )


def pad(d: dict[str, Any], extra: int, fill: str, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for key, x in d.items():
        if x is None or (key == "advantages" and x.dim() == 1):
            out[key] = x
            continue
        B = x.shape[0]
        if key == "mask":
            filler = torch.zeros(B, extra, dtype=x.dtype)
        elif fill == "nan":
            filler = torch.full((B, extra), float("nan"), dtype=torch.float64)
        else:
            filler = 100.0 * torch.rand(B, extra, generator=g, dtype=torch.float64) - 50.0
        out[key] = torch.cat([x.detach(), filler], dim=1)
    out["logprobs"].requires_grad_(True)
    return out


@pytest.mark.parametrize("fill", ["garbage", "nan"])
@pytest.mark.parametrize("token_adv", [False, True], ids=["seq_adv", "token_adv"])
@pytest.mark.parametrize("case", PAD_CASES, ids=[_case_id(c) for c in PAD_CASES])
def test_padding_invariance(case: tuple[str, dict[str, Any]], token_adv: bool, fill: str) -> None:
    name, hp = case
    d = make_batch(seed=21, token_adv=token_adv)
    T = d["mask"].shape[1]
    hp = {**hp, "max_length": T} if name == "dr_grpo" or "aggregation" in hp else hp
    base = get_objective(name, **with_generator(name, hp))(policy_batch(d))
    g_base = grad_of(base.loss, d["logprobs"])

    p = pad(d, extra=3, fill=fill, seed=22)
    padded = get_objective(name, **with_generator(name, hp))(policy_batch(p))
    g_pad = grad_of(padded.loss, p["logprobs"])
    assert torch.isfinite(padded.loss.detach())
    assert_close(padded.loss, base.loss, rtol=1e-12)
    assert_close(g_pad[:, :T], g_base, rtol=1e-12)
    if fill == "garbage":
        assert bool((g_pad[:, T:] == 0).all())
        for key, value in base.metrics.items():
            assert_close(padded.metrics[key], value, rtol=1e-12)


# ---------------------------------------------------------------- 4. split invariance
SPLITS = (slice(0, 3), slice(3, 4), slice(4, 13), slice(13, 21))  # row 3 is empty: a micro-batch with no tokens
SPLIT_OPTIONS: tuple[dict[str, Any], ...] = (
    {},
    {"beta": 0.05, "kl_estimator": "k3", "kl_unbiased": True, "rollout_is": "sequence", "rollout_mask": "token"},
    {"max_length": 17, "off_policy_mask_delta": 0.05, "entropy_coef": 0.01},
)


@pytest.mark.parametrize("token_adv", [False, True], ids=["seq_adv", "token_adv"])
@pytest.mark.parametrize("options", SPLIT_OPTIONS, ids=["plain", "kl_rollout", "max_length_offpolicy"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("name", [n for n in OBJECTIVES if n not in BATCH_STATISTICS])
def test_split_invariance(name: str, aggregation: str, options: dict[str, Any], token_adv: bool) -> None:
    # micro-batches given the whole batch's counts: losses add up, gradients accumulate to the whole's
    d = make_batch(seed=31, token_adv=token_adv)
    objective = get_objective(name, aggregation=aggregation, **options)
    whole = objective(policy_batch(d))
    g_whole = grad_of(whole.loss, d["logprobs"])

    lengths = d["mask"].sum(-1)
    num_tokens, num_sequences = int(lengths.sum()), int((lengths > 0).sum())
    total = torch.zeros((), dtype=torch.float64)
    for rows in SPLITS:
        part = objective(policy_batch(d, rows), num_tokens=num_tokens, num_sequences=num_sequences)
        assert torch.isfinite(part.loss.detach())
        part.loss.backward()
        total = total + part.loss.detach()
    assert_close(total, whole.loss, rtol=SPLIT_TOL, atol=1e-15)
    assert_close(d["logprobs"].grad, g_whole, rtol=SPLIT_TOL, atol=1e-15)


# ---------------------------------------------------------------- 5. metrics
def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x.detach()[mask != 0]


@pytest.mark.parametrize("token_adv", [False, True], ids=["seq_adv", "token_adv"])
def test_grpo_metrics(token_adv: bool) -> None:
    d = make_batch(seed=41, token_adv=token_adv)
    hp = {"clip_low": 0.2, "clip_high": 0.28}
    out = get_objective("grpo", **hp)(policy_batch(d))
    mets = out.metrics
    for key, value in mets.items():
        assert value.dim() == 0, key

    low, high = clip_fractions(d["logprobs"], d["old_logprobs"], d["advantages"], d["mask"], **hp)
    assert low > 0 and high > 0
    assert float(mets["clip_frac_low"]) == pytest.approx(low, rel=1e-12)
    assert float(mets["clip_frac_high"]) == pytest.approx(high, rel=1e-12)
    assert float(mets["clip_frac"]) == pytest.approx(low + high, rel=1e-12)

    ratios = token_ratios(d["logprobs"], d["old_logprobs"], d["mask"])
    assert float(mets["ratio_min"]) == pytest.approx(min(ratios), rel=1e-12)
    assert float(mets["ratio_max"]) == pytest.approx(max(ratios), rel=1e-12)
    assert float(mets["ratio_mean"]) == pytest.approx(sum(ratios) / len(ratios), rel=1e-12)
    entropy = _masked(d["entropies"], d["mask"]).mean()
    assert float(mets["entropy"]) == pytest.approx(float(entropy), rel=1e-12)


def test_kl_old_metric() -> None:
    # k3 estimate of KL(π_old || π) from samples of π_old: E_old[r - 1 - log r], r = π/π_old, token mean
    d = make_batch(seed=41)
    out = get_objective("grpo")(policy_batch(d))
    ratios = token_ratios(d["logprobs"], d["old_logprobs"], d["mask"])
    kl_old = sum(r - 1.0 - math.log(r) for r in ratios) / len(ratios)
    assert float(out.metrics["kl_old"]) == pytest.approx(kl_old, rel=1e-9)


def test_gspo_seq_ratio_metrics() -> None:
    d = make_batch(seed=43)
    out = get_objective("gspo")(policy_batch(d))
    seq = seq_ratios(d["logprobs"], d["old_logprobs"], d["mask"])
    assert len(seq) == int((d["mask"].sum(-1) > 0).sum())
    assert float(out.metrics["seq_ratio_min"]) == pytest.approx(min(seq), rel=1e-12)
    assert float(out.metrics["seq_ratio_max"]) == pytest.approx(max(seq), rel=1e-12)
    assert float(out.metrics["seq_ratio_mean"]) == pytest.approx(sum(seq) / len(seq), rel=1e-12)


@pytest.mark.parametrize(
    "hp",
    [
        {"rollout_mask": "token"},
        {"rollout_mask": "sequence"},
        {"rollout_mask": "geometric"},
        {"off_policy_mask_delta": 0.05},
    ],
    ids=["token", "sequence", "geometric", "off_policy"],
)
def test_masked_frac(hp: dict[str, Any]) -> None:
    d = make_batch(seed=47)
    ref = reference("grpo", d, **hp)
    n_tokens = int(d["mask"].sum())
    assert 0 < ref.num_dropped < n_tokens
    out = get_objective("grpo", **hp)(policy_batch(d))
    assert float(out.metrics["masked_frac"]) == pytest.approx(ref.num_dropped / n_tokens, rel=1e-12)
    assert_close(out.loss, ref.loss)
