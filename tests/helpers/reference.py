"""An independent float64 reference for the GRPO-family objectives.

Written from the papers' formulas, one sequence and one token at a time, with plain scalar torch ops so that
autograd gives the reference gradient. It deliberately shares no code with ``rlguard``: every clip, min and
normaliser is spelled out below, and branch decisions (which side of a ``min``/``clip`` is taken) are made on
Python floats, so the gradient of each term is exactly that of the branch the formula selects.

Notation (per sequence i, token t): m_it the mask, L_i = Σ_t m_it, log r_it = logp_it - old_it (clamped to
[-20, 20]), r = exp(log r), A_it the advantage (sequence advantages broadcast over tokens).

References
- GRPO: Shao et al. 2024, arXiv:2402.03300.             - Dr. GRPO: Liu et al. 2025, arXiv:2503.20783.
- DAPO: Yu et al. 2025, arXiv:2503.14476.               - GSPO: Zheng et al. 2025, arXiv:2507.18071.
- CISPO: MiniMax-M1 2025, arXiv:2506.13585.             - SAPO: Qwen 2025, arXiv:2511.20347.
- GMPO: Zhao et al. 2025, arXiv:2507.20673.             - KL estimators k1/k2/k3: Schulman 2020.
- LUSPO: Liu et al. 2026, arXiv:2602.05261.             - VESPO: Shen et al. 2026, arXiv:2602.10693.
- Clip-Cov, KL-Cov: Cui et al. 2025, arXiv:2505.22617.  - GPG: Chu et al. 2025, arXiv:2504.02546.
- DPPO (Binary-TV, Binary-KL): Qi et al. 2026, arXiv:2602.04879.
- DRO: Richemond et al. 2024, arXiv:2405.19107 (policy term with a quadratic log-ratio penalty).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

LOG_RATIO_BOUND = 20.0
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
OBJECTIVES = (
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "gspo_token",
    "cispo",
    "sapo",
    "gmpo",
    "luspo",
    "vespo",
    "clip_cov",
    "kl_cov",
    "gpg",
    "dppo_tv",
    "dppo_kl",
    "dro",
)

_COMMON: dict[str, Any] = {
    "max_length": None,
    "beta": 0.0,
    "kl_estimator": "k3",
    "kl_unbiased": False,
    "entropy_coef": 0.0,
    "rollout_is": None,
    "rollout_is_cap": 2.0,
    "rollout_mask": None,
    "rollout_mask_low": None,
    "rollout_mask_high": 2.0,
    "off_policy_mask_delta": None,
}

DEFAULTS: dict[str, dict[str, Any]] = {
    "grpo": {"clip_low": 0.2, "clip_high": 0.2, "clip_c": None, "aggregation": "seq-mean-token-mean"},
    "dr_grpo": {"clip_low": 0.2, "clip_high": 0.2, "clip_c": None, "aggregation": "seq-mean-token-sum-norm"},
    "dapo": {"clip_low": 0.2, "clip_high": 0.28, "clip_c": None, "aggregation": "token-mean"},
    "gspo": {"clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq-mean-token-mean"},
    "gspo_token": {"clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq-mean-token-mean"},
    "cispo": {"clip_low": None, "clip_high": 4.0, "bounds": "relative", "aggregation": "token-mean"},
    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05, "aggregation": "seq-mean-token-mean"},
    "gmpo": {"clip_low": 0.4, "clip_high": 0.4, "aggregation": "seq-mean-token-mean"},
    "luspo": {"clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq-mean-token-sum"},
    "vespo": {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0, "aggregation": "token-mean"},
    "clip_cov": {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "clip_cov_ratio": 2e-4,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
        "generator": None,
        "aggregation": "token-mean",
    },
    "kl_cov": {"kl_cov_ratio": 2e-4, "kl_cov_coef": 1.0, "aggregation": "token-mean"},
    "gpg": {"aggregation": "token-mean"},
    "dppo_tv": {"clip_low": 0.2, "clip_high": 0.2, "is_cap": 20.0, "aggregation": "token-mean"},
    "dppo_kl": {"clip_low": 0.2, "clip_high": 0.2, "is_cap": 20.0, "aggregation": "token-mean"},
    "dro": {"tau": 1.0, "aggregation": "token-mean"},
}


@dataclass
class ReferenceResult:
    """The reference loss and what happened on the way (for checking that a test exercises clipping)."""

    loss: torch.Tensor  # 0-dim float64
    num_clipped: int = 0  # policy terms whose clip (or dual clip) was the active branch, A != 0
    num_dropped: int = 0  # unmasked tokens removed by rollout / off-policy masking
    clipped: set[tuple[int, int]] = field(default_factory=set)
    kept: set[tuple[int, int]] = field(default_factory=set)  # unmasked tokens that stay in the sums

    @property
    def num_clipped_kept(self) -> int:
        return len(self.clipped & self.kept)


# ---------------------------------------------------------------- scalar helpers (branch chosen on floats)
def _const(x: float) -> torch.Tensor:
    return torch.tensor(float(x), dtype=torch.float64)


def _clip(x: torch.Tensor, lo: float | None, hi: float | None) -> tuple[torch.Tensor, bool]:
    """clip(x, lo, hi); outside the interval the value is a constant (zero gradient)."""
    v = float(x.detach())
    if lo is not None and v < lo:
        return _const(lo), True
    if hi is not None and v > hi:
        return _const(hi), True
    return x, False


def _min(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """min(a, b); returns (value, whether b was taken). Ties take a."""
    if float(b.detach()) < float(a.detach()):
        return b, True
    return a, False


def _clamp_log(x: torch.Tensor) -> torch.Tensor:
    v = float(x.detach())
    if v > LOG_RATIO_BOUND:
        return _const(LOG_RATIO_BOUND)
    if v < -LOG_RATIO_BOUND:
        return _const(-LOG_RATIO_BOUND)
    return x


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


# ---------------------------------------------------------------- the reference
def reference_loss(
    name: str,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    **hyper: Any,
) -> ReferenceResult:
    """Loss of objective ``name`` computed token by token; differentiable w.r.t. ``logprobs``."""
    cfg = {**_COMMON, **DEFAULTS[name]}
    unknown = set(hyper) - set(cfg)
    if unknown:
        raise TypeError(f"reference: unknown hyper-parameters {sorted(unknown)} for {name}")
    cfg.update(hyper)

    B, T = logprobs.shape
    m = [[float(mask[i, t]) != 0.0 for t in range(T)] for i in range(B)]
    tokens = [[t for t in range(T) if m[i][t]] for i in range(B)]
    L = [len(tokens[i]) for i in range(B)]

    def lp(i: int, t: int) -> torch.Tensor:
        return logprobs[i, t]

    def old(i: int, t: int) -> torch.Tensor:
        # on-policy: old = current log-prob, detached
        return old_logprobs[i, t] if old_logprobs is not None else logprobs[i, t].detach()

    def adv(i: int, t: int) -> float:
        return float(advantages[i]) if advantages.dim() == 1 else float(advantages[i, t])

    def log_ratio(i: int, t: int) -> torch.Tensor:
        return _clamp_log(lp(i, t) - old(i, t))

    def seq_adv(i: int) -> float:
        # A_i: masked mean of the token advantages (= A_i itself for sequence advantages)
        return sum(adv(i, t) for t in tokens[i]) / L[i]

    result = ReferenceResult(loss=_const(0.0))

    # ---- engine log-ratio log rho = log pi_old - log mu
    def log_rho(i: int, t: int) -> float:
        assert rollout_logprobs is not None
        v = float(old(i, t)) - float(rollout_logprobs[i, t])
        return max(-LOG_RATIO_BOUND, min(LOG_RATIO_BOUND, v))

    # ---- masking: tokens kept in the sums
    keep = {(i, t): True for i in range(B) for t in tokens[i]}
    if cfg["rollout_mask"] is not None:
        high = cfg["rollout_mask_high"]
        low = cfg["rollout_mask_low"] if cfg["rollout_mask_low"] is not None else 1.0 / high
        for i in range(B):
            if L[i] == 0:
                continue
            if cfg["rollout_mask"] == "token":
                for t in tokens[i]:
                    stat = math.exp(log_rho(i, t))
                    if not (low <= stat <= high):
                        keep[(i, t)] = False
            else:
                total_log = sum(log_rho(i, t) for t in tokens[i])
                if cfg["rollout_mask"] == "sequence":
                    stat = math.exp(total_log)
                elif cfg["rollout_mask"] == "geometric":
                    stat = math.exp(total_log / L[i])
                else:
                    raise ValueError(cfg["rollout_mask"])
                if not (low <= stat <= high):
                    for t in tokens[i]:
                        keep[(i, t)] = False
    if cfg["off_policy_mask_delta"] is not None:
        d = cfg["off_policy_mask_delta"]
        for i in range(B):
            if L[i] == 0:
                continue
            behaviour = rollout_logprobs if rollout_logprobs is not None else None
            gap = 0.0
            for t in tokens[i]:
                b = float(behaviour[i, t]) if behaviour is not None else float(old(i, t))
                gap += b - float(lp(i, t).detach())
            gap /= L[i]
            if seq_adv(i) < 0 and gap > d:
                for t in tokens[i]:
                    keep[(i, t)] = False
    result.num_dropped = sum(1 for k in keep.values() if not k)
    result.kept = {key for key, k in keep.items() if k}

    # ---- per-token policy terms l_it
    policy: dict[tuple[int, int], torch.Tensor] = {}
    for i in range(B):
        if L[i] == 0:
            continue
        if name in ("grpo", "dr_grpo", "dapo"):
            lo, hi, c = 1.0 - cfg["clip_low"], 1.0 + cfg["clip_high"], cfg["clip_c"]
            for t in tokens[i]:
                A = adv(i, t)
                r = torch.exp(log_ratio(i, t))
                r_clip, _ = _clip(r, lo, hi)
                # l = -min(r A, clip(r) A)
                surr, took_clip = _min(r * A, r_clip * A)
                term = -surr
                dual = False
                if c is not None and A < 0:
                    # dual clip: l = min(l, -c A)
                    term, dual = _min(term, _const(-c * A))
                policy[(i, t)] = term
                if A != 0 and (took_clip or dual):
                    result.clipped.add((i, t))
        elif name in ("gspo", "gspo_token"):
            lo, hi = 1.0 - cfg["clip_low"], 1.0 + cfg["clip_high"]
            # s_i = exp( Σ_t m_it log r_it / L_i )
            # over the tokens kept by masking (verl's convention: masks shrink response_mask first)
            kept_i = [t for t in tokens[i] if keep[(i, t)]]
            seq_log_ratio = _const(0.0)
            for t in kept_i:
                seq_log_ratio = seq_log_ratio + log_ratio(i, t)
            s = torch.exp(seq_log_ratio / max(len(kept_i), 1))
            for t in tokens[i]:
                A = adv(i, t)
                # GSPO-token: s_it = sg[s_i] · exp(logp_it - sg[logp_it]), value s_i, gradient per token
                s_it = s if name == "gspo" else s.detach() * torch.exp(lp(i, t) - lp(i, t).detach())
                s_clip, _ = _clip(s_it, lo, hi)
                surr, took_clip = _min(s_it * A, s_clip * A)
                policy[(i, t)] = -surr
                if A != 0 and took_clip:
                    result.clipped.add((i, t))
        elif name == "cispo":
            if cfg["bounds"] == "relative":
                lo = None if cfg["clip_low"] is None else 1.0 - cfg["clip_low"]
                hi = None if cfg["clip_high"] is None else 1.0 + cfg["clip_high"]
            elif cfg["bounds"] == "absolute":
                lo, hi = cfg["clip_low"], cfg["clip_high"]
            else:
                raise ValueError(cfg["bounds"])
            for t in tokens[i]:
                A = adv(i, t)
                ratio = float(torch.exp(log_ratio(i, t)).detach())
                w = ratio
                if lo is not None and w < lo:
                    w = lo
                if hi is not None and w > hi:
                    w = hi
                # l = -sg[clip(r)] A logp
                policy[(i, t)] = -w * A * lp(i, t)
                if A != 0 and w != ratio:
                    result.clipped.add((i, t))
        elif name == "sapo":
            for t in tokens[i]:
                A = adv(i, t)
                tau = cfg["tau_pos"] if A > 0 else cfg["tau_neg"]
                r = torch.exp(log_ratio(i, t))
                # l = -A · σ(τ (r - 1)) · 4/τ
                policy[(i, t)] = -A * _sigmoid(tau * (r - 1.0)) * (4.0 / tau)
        elif name == "gmpo":
            # A_i and the geometric mean over the tokens kept by masking (as for GSPO above)
            kept_i = [t for t in tokens[i] if keep[(i, t)]]
            A_i = sum(adv(i, t) for t in kept_i) / max(len(kept_i), 1)
            sgn = (A_i > 0) - (A_i < 0)
            total = _const(0.0)
            for t in kept_i:
                lr = log_ratio(i, t)
                c, _ = _clip(lr, -cfg["clip_low"], cfg["clip_high"])
                if sgn == 0:
                    x = _const(0.0)
                else:
                    # x = sgn · min(sgn log r, sgn c)
                    chosen, took_clip = _min(sgn * lr, sgn * c)
                    x = sgn * chosen
                    if took_clip:
                        result.clipped.add((i, t))
                total = total + x
            # l_i = -A_i · exp( Σ_t m x_it / L_i ), broadcast over the sequence's tokens
            l_i = -A_i * torch.exp(total / max(len(kept_i), 1))
            for t in tokens[i]:
                policy[(i, t)] = l_i
        elif name == "luspo":
            # LUSPO = GSPO's clipped term l_i on every token of the sequence; the default aggregation
            # (seq-mean-token-sum) sums it over the L_i tokens: L_i · l_i per sequence, mean over sequences
            lo, hi = 1.0 - cfg["clip_low"], 1.0 + cfg["clip_high"]
            kept_i = [t for t in tokens[i] if keep[(i, t)]]
            total = _const(0.0)
            for t in kept_i:
                total = total + log_ratio(i, t)
            s = torch.exp(total / max(len(kept_i), 1))
            for t in tokens[i]:
                A = adv(i, t)
                s_clip, _ = _clip(s, lo, hi)
                surr, took_clip = _min(s * A, s_clip * A)
                policy[(i, t)] = -surr
                if A != 0 and took_clip:
                    result.clipped.add((i, t))
        elif name == "vespo":
            # W_i = Π_t r_it (no length normalisation), log W clamped to [log 1e-8, 20];
            # φ(W) = W^k exp(λ (1 - W)) with (k, λ) = (k_pos, λ_pos) for A ≥ 0 else (k_neg, λ_neg);
            # l_it = -sg[φ(W_i)] A_it log π_it
            kept_i = [t for t in tokens[i] if keep[(i, t)]]
            log_w = sum(float(log_ratio(i, t).detach()) for t in kept_i)
            log_w = min(max(log_w, math.log(1e-8)), 20.0)
            w = math.exp(log_w)
            for t in tokens[i]:
                A = adv(i, t)
                k, lam = (cfg["k_pos"], cfg["lambda_pos"]) if A >= 0 else (cfg["k_neg"], cfg["lambda_neg"])
                phi = w**k * math.exp(lam * (1.0 - w))
                policy[(i, t)] = -phi * A * lp(i, t)
        elif name == "gpg":
            # GPG: the plain policy gradient -A log π, no ratio, no clip
            for t in tokens[i]:
                policy[(i, t)] = -adv(i, t) * lp(i, t)
        elif name == "dro":
            # DRO: -(A log π - τ/2 (log π/π_old)^2)
            for t in tokens[i]:
                lr = lp(i, t) - old(i, t)
                policy[(i, t)] = -(adv(i, t) * lp(i, t) - 0.5 * cfg["tau"] * lr * lr)
        elif name in ("dppo_tv", "dppo_kl"):
            # DPPO-Binary: l = -A · sg[min(r, C)] · log π · M, M = 0 where the update leaves the trust region in
            # the direction the advantage pushes: TV |π - μ| (probabilities) or the binary KL
            # KL(Bern(μ) || Bern(π)) = μ log(μ/π) + (1-μ) log((1-μ)/(1-π)) beyond δ
            for t in tokens[i]:
                A = adv(i, t)
                ratio = math.exp(float(log_ratio(i, t).detach()))
                p, mu = math.exp(float(lp(i, t).detach())), math.exp(float(old(i, t)))
                if name == "dppo_tv":
                    inside = (p - mu <= cfg["clip_high"]) if A > 0 else (p - mu >= -cfg["clip_low"])
                else:
                    eps = 1e-8  # the 1e-8 guards of the reference implementation, for p or μ close to 1
                    kl = mu * (math.log(mu) - math.log(p)) + (1.0 - mu) * math.log((1.0 - mu + eps) / (1.0 - p + eps))
                    inside = (kl <= cfg["clip_high"] or p <= mu) if A > 0 else (kl <= cfg["clip_low"] or p >= mu)
                w = min(ratio, cfg["is_cap"])
                policy[(i, t)] = -A * w * lp(i, t) * (1.0 if inside else 0.0)
                if A != 0 and not inside:
                    result.clipped.add((i, t))
        elif name in ("clip_cov", "kl_cov"):
            pass  # batch-level token selection, below
        else:
            raise ValueError(name)

    if name in ("clip_cov", "kl_cov"):
        _covariance_terms(name, cfg, result, policy, keep, lp, adv, log_ratio)
    result.num_clipped = len(result.clipped)

    # ---- rollout importance weights (detached, multiply the policy term only)
    is_weight: dict[tuple[int, int], float] = {}
    if cfg["rollout_is"] is not None:
        cap = cfg["rollout_is_cap"]
        for i in range(B):
            if cfg["rollout_is"] == "token":
                for t in tokens[i]:
                    is_weight[(i, t)] = min(math.exp(log_rho(i, t)), cap)
            elif cfg["rollout_is"] == "sequence":
                w = min(math.exp(sum(log_rho(i, t) for t in tokens[i])), cap)
                for t in tokens[i]:
                    is_weight[(i, t)] = w
            else:
                raise ValueError(cfg["rollout_is"])

    # ---- full per-token term: policy · IS weight + β KL - c_H H
    def kl_ref(i: int, t: int) -> torch.Tensor:
        assert ref_logprobs is not None
        d = _clamp_log(lp(i, t) - ref_logprobs[i, t])  # log π/π_ref
        est = cfg["kl_estimator"]
        if est == "k1":
            value = d
        elif est == "k2":
            value = 0.5 * d * d
        elif est == "k3":
            value = torch.exp(-d) + d - 1.0  # exp(ref - logp) - (ref - logp) - 1
        else:
            raise ValueError(est)
        if cfg["kl_unbiased"]:
            value = value * torch.exp(log_ratio(i, t))  # not detached
        return value

    def token_term(i: int, t: int) -> torch.Tensor:
        term = policy[(i, t)]
        if (i, t) in is_weight:
            term = term * is_weight[(i, t)]
        if cfg["beta"] != 0.0:
            term = term + cfg["beta"] * kl_ref(i, t)
        if cfg["entropy_coef"] != 0.0:
            assert entropies is not None
            term = term - cfg["entropy_coef"] * float(entropies[i, t])
        return term

    # ---- aggregation; default normalisers from the caller's mask
    N = float(num_tokens) if num_tokens is not None else float(sum(L))
    G = float(num_sequences) if num_sequences is not None else float(sum(1 for n in L if n > 0))
    max_len = float(cfg["max_length"]) if cfg["max_length"] is not None else float(T)
    agg = cfg["aggregation"]
    loss = _const(0.0)
    for i in range(B):
        seq_sum = _const(0.0)
        for t in tokens[i]:
            if keep[(i, t)]:
                seq_sum = seq_sum + token_term(i, t)
        if agg == "token-mean":
            loss = loss + seq_sum / N
        elif agg == "seq-mean-token-mean":
            if L[i] > 0:
                loss = loss + seq_sum / L[i] / G
        elif agg == "seq-mean-token-sum":
            loss = loss + seq_sum / G
        elif agg == "seq-mean-token-sum-norm":
            loss = loss + seq_sum / (G * max_len)
        else:
            raise ValueError(agg)
    result.loss = loss
    return result


def _covariance_terms(name, cfg, result, policy, keep, lp, adv, log_ratio) -> None:
    """Clip-Cov and KL-Cov (arXiv 2505.22617, sec. 4): Cov_t = (log π_t - mean log π)(A_t - mean A) over the N
    tokens of the batch (the kept ones).

    Clip-Cov: among the tokens with ω_low < Cov < ω_high whose PPO term is not already clipped, r·N (at least 1)
    drawn uniformly at random (torch.randperm over them in row-major order, with ``generator``) lose their
    term and gradient. KL-Cov: the top max(1, int(r·N)) tokens by Cov get β |log r_t| added to -A r_t.
    """
    kept = sorted(key for key, k in keep.items() if k)
    if not kept:
        return
    n = len(kept)
    mean_lp = sum(float(lp(i, t).detach()) for i, t in kept) / n
    mean_a = sum(adv(i, t) for i, t in kept) / n
    cov = {key: (float(lp(*key).detach()) - mean_lp) * (adv(*key) - mean_a) for key in kept}
    if name == "clip_cov":
        lo, hi = 1.0 - cfg["clip_low"], 1.0 + cfg["clip_high"]
        candidates = []
        for i, t in kept:
            A = adv(i, t)
            r = torch.exp(log_ratio(i, t))
            r_clip, _ = _clip(r, lo, hi)
            surr, took_clip = _min(r * A, r_clip * A)
            policy[(i, t)] = -surr
            clipped_by_ppo = -float(r_clip.detach()) * A > -float(r.detach()) * A
            if A != 0 and took_clip:
                result.clipped.add((i, t))
            if not clipped_by_ppo and cfg["clip_cov_lb"] < cov[(i, t)] < cfg["clip_cov_ub"]:
                candidates.append((i, t))
        k = max(int(cfg["clip_cov_ratio"] * n), 1)
        if candidates:
            perm = torch.randperm(len(candidates), generator=cfg["generator"])
            for j in perm[: min(k, len(candidates))].tolist():
                policy[candidates[j]] = _const(0.0)
                result.clipped.add(candidates[j])
        return
    k = max(1, int(n * cfg["kl_cov_ratio"]))
    top = sorted(kept, key=lambda key: cov[key], reverse=True)[:k]
    for i, t in kept:
        r = torch.exp(log_ratio(i, t))
        policy[(i, t)] = -adv(i, t) * r
    for i, t in top:
        lr = log_ratio(i, t)
        v = float(lr.detach())
        abs_lr = lr if v > 0 else (-lr if v < 0 else 0.0 * lr)  # |x| with the subgradient 0 at x = 0
        policy[(i, t)] = policy[(i, t)] + cfg["kl_cov_coef"] * abs_lr


def reference_grad(res: ReferenceResult, logprobs: torch.Tensor) -> torch.Tensor:
    """d loss / d logprobs (zeros where the loss does not depend on logprobs at all)."""
    if not res.loss.requires_grad:
        return torch.zeros_like(logprobs)
    (g,) = torch.autograd.grad(res.loss, logprobs, allow_unused=True)
    return torch.zeros_like(logprobs) if g is None else g


# ---------------------------------------------------------------- reference metrics
def token_ratios(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> list[float]:
    B, T = logprobs.shape
    return [
        math.exp(float(logprobs[i, t].detach()) - float(old_logprobs[i, t]))
        for i in range(B)
        for t in range(T)
        if float(mask[i, t]) != 0.0
    ]


def seq_ratios(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> list[float]:
    B, T = logprobs.shape
    out = []
    for i in range(B):
        lrs = [float(logprobs[i, t].detach()) - float(old_logprobs[i, t]) for t in range(T) if float(mask[i, t]) != 0.0]
        if lrs:
            out.append(math.exp(sum(lrs) / len(lrs)))
    return out


def clip_fractions(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[float, float]:
    """(low, high): low counts r < 1-clip_low with A < 0, high r > 1+clip_high with A > 0, over unmasked."""
    B, T = logprobs.shape
    n = low = high = 0
    for i in range(B):
        for t in range(T):
            if float(mask[i, t]) == 0.0:
                continue
            A = float(advantages[i]) if advantages.dim() == 1 else float(advantages[i, t])
            r = math.exp(float(logprobs[i, t].detach()) - float(old_logprobs[i, t]))
            n += 1
            low += r < 1.0 - clip_low and A < 0
            high += r > 1.0 + clip_high and A > 0
    return low / n, high / n
