"""The doctor's key maps, derived from the one metric table (:mod:`rlguard.metrics`, ``docs/design.md``).

A key is read after stripping a logger's namespace (``train/`` from wandb and TensorBoard exports of TRL runs).
``rlguard/<name>`` (what rlguard's adapters log) and bare canonical names map to themselves and win over a
framework's own key for the same name: they are computed by rlguard's exact objectives.

The key tables and :func:`canonical_stats` are :mod:`rlguard.metrics`'s, shared with the live adapters; this module
adds what only the doctor needs (keys known to carry no stat) and imports no framework, so the doctor reads logs
without TRL or verl installed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rlguard.doctor.domains import DOMAINS
from rlguard.doctor.keyvalues import KeyValues, ValueIndex, per_step_keys, summarise
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
    "CONFIG_SEGMENTS",
    "DOCTOR_ONLY",
    "KEY_TO_CANONICAL",
    "KNOWN_KEYS",
    "KNOWN_PREFIXES",
    "NAMESPACES",
    "TRL_TO_CANONICAL",
    "VERL_TO_CANONICAL",
    "KeyReport",
    "auto_map_refusal",
    "canonical_name",
    "canonical_stats",
    "classify_keys",
    "eval_direction",
    "parse_key_map",
    "pick_eval_key",
    "step_records",
    "strip_namespace",
    "suggest_canonical",
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
        mapped: raw key -> canonical name, for every key that has one (auto-mapped keys included).
        known: keys recognised as carrying no canonical stat (counters, timings, evaluation, ...).
        unrecognised: every other key, sorted (auto-mapped keys excluded).
        suggestions: unrecognised key -> the canonical name it looks like (for ``--map KEY=CANONICAL``), where it
            was not mapped automatically (ambiguous, or auto-mapping off).
        auto_mapped: raw key -> canonical name mapped because exactly one canonical stat matches it (and no other
            key of the log claims that stat), and its values are evidence for it (:func:`auto_map_refusal`).
        evidence: auto-mapped key -> what it was mapped on (its words, its records, its values and their range).
        refused: key -> why it was not mapped: a key that looks like a canonical stat but whose values are not
            evidence for it, or one refused with ``--map KEY=``.
    """

    mapped: dict[str, str]
    known: list[str]
    unrecognised: list[str]
    suggestions: dict[str, str] = field(default_factory=dict)
    auto_mapped: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def judged(self) -> list[str]:
        """Canonical names found that a built-in detector judges (``judged`` in :data:`rlguard.metrics.METRICS`)."""
        return sorted({c for c in self.mapped.values() if c in JUDGED})

    @property
    def key_map(self) -> dict[str, str]:
        """The raw key -> canonical name map to read the log with (``--map`` entries and the automatic ones)."""
        return dict(self.mapped)


#: path segments of keys that hold a run's configuration, not a step's stats (``args/kl_coef``, ``config/lr``)
CONFIG_SEGMENTS = frozenset({"args", "config", "hparams"})

Rows = Sequence[tuple[int, Mapping[str, float]]]


def classify_keys(
    keys: Iterable[str],
    key_map: Mapping[str, str] | None = None,
    auto_map: bool = True,
    *,
    rows: Rows | None = None,
    index: ValueIndex | None = None,
) -> KeyReport:
    """Sort the raw keys of a log into mapped, known and unrecognised; with ``auto_map`` and the log's ``rows``,
    map each unrecognised key whose words match exactly one canonical stat that no other key claims
    (``reward_avg`` -> ``reward_mean``), or, where several claim it, the one key whose words are exactly the stat's
    (``reward_avg`` rather than ``format_reward_avg``), when its values are evidence for the stat
    (:func:`auto_map_refusal`); suggest the rest. One evaluation key is read beside the reward, as ``eval_score`` or
    ``eval_loss`` by its direction (:func:`pick_eval_key`), unless ``--map`` names one. Without ``rows`` nothing is
    mapped automatically. ``--map KEY=`` (an empty name in ``key_map``) refuses ``KEY``, whatever table or rule would
    map it. ``index``: what an earlier call read of ``rows``' values, brought up to date with the rows appended since
    (``rlguard watch`` reads its growing log again and again; :class:`~rlguard.doctor.keyvalues.ValueIndex`)."""
    mapped: dict[str, str] = {}
    known: list[str] = []
    unrecognised: list[str] = []
    refused = {k: "refused with --map KEY=" for k, c in (key_map or {}).items() if not c}
    for key in sorted(set(keys)):
        hit = canonical_name(key, key_map)
        bare = strip_namespace(key)
        if hit is not None:
            mapped[key] = hit[0]
        elif key in refused or bare in KNOWN_KEYS or bare.startswith(KNOWN_PREFIXES):
            known.append(key)
        else:
            unrecognised.append(key)
    taken = set(mapped.values())
    # an evaluation key is read as the evaluation (pick_eval_key), never as a training stat (val/test_score: no reward)
    candidates = {
        k: c
        for k in unrecognised
        if (c := suggest_canonical(k)) is not None and c not in taken and eval_direction(k) is None
    }
    evidence: dict[str, str] = {}
    values: dict[str, KeyValues] = {}
    if auto_map and rows is not None:  # what the rules read of the values: the candidates', each evaluation key's
        watch = {
            **{k: False for k in known + unrecognised if eval_direction(k) is not None},
            **dict.fromkeys(candidates, True),
        }
        values = (index or ValueIndex()).read(rows, watch)
    for k, c in candidates.items() if auto_map else ():
        why = "no values to check" if rows is None else auto_map_refusal(k, c, values[k])
        if why is None:
            evidence[k] = _evidence(k, c, values[k])
        elif rows is not None:
            refused[k] = f"looks like {c}, but {why}"
    suggestions = {k: c for k, c in candidates.items() if k not in refused}
    claims: dict[str, list[str]] = {}
    for k, c in suggestions.items():
        claims.setdefault(c, []).append(k)
    auto: dict[str, str] = {}
    for c, claimants in claims.items():
        exact = [k for k in claimants if _exact(k, c)]
        chosen = claimants if len(claimants) == 1 else exact
        if len(chosen) == 1 and chosen[0] in evidence:  # one key, or one whose words are the stat's and no more
            auto[chosen[0]] = c
    if auto_map and rows is not None and not {"eval_score", "eval_loss"} & (taken | set(auto.values())):
        picked = pick_eval_key([k for k in known + unrecognised if k not in refused and k not in auto], values)
        if picked is not None:
            key, name, why = picked
            auto[key], evidence[key] = name, why
            known = [k for k in known if k != key]
            unrecognised = [k for k in unrecognised if k != key]
    return KeyReport(
        {**mapped, **auto},
        known,
        [k for k in unrecognised if k not in auto],
        {k: c for k, c in suggestions.items() if k not in auto},
        auto,
        {k: evidence[k] for k in auto},
        refused,
    )


def auto_map_refusal(key: str, name: str, rows: Rows | KeyValues) -> str | None:
    """Why the values of ``key`` are not evidence for the canonical stat ``name``, or None if they are.

    Refused: a key under ``args/``, ``config/`` or ``hparams/`` (:data:`CONFIG_SEGMENTS`: the run's configuration,
    ``args/kl_coef`` is not a KL); a key logged only in configuration records (records that hold none of the
    log's per-step keys, :func:`step_records`); a constant series (a setting, or a stat that never moved: nothing
    to judge, and a number that cannot be told from a setting); values outside the stat's domain
    (:data:`rlguard.doctor.domains.DOMAINS`: an entropy >= 0, a fraction in [0, 1], a ratio near 1 that is not a
    fraction). ``rows``: the log's rows, or what they hold of ``key`` (:class:`~rlguard.doctor.keyvalues.KeyValues`).
    """
    segments = strip_namespace(key).lower().split("/")[:-1]
    if CONFIG_SEGMENTS & set(segments):
        return f"it is under {'/'.join(segments)}/, a run's configuration, not a step's stats"
    domain = DOMAINS.get(name)
    v = rows if isinstance(rows, KeyValues) else summarise(rows, {key: domain is not None})[key]
    if not v.count:
        return f"it is logged only in configuration records (step {', '.join(map(str, v.at))}), not in a step's stats"
    if not v.moved:
        return f"it is constant ({v.first:g} on {v.count} records): a setting, or nothing to judge"
    return domain.misfit_of(v.low, v.high, v.median()) if domain is not None else None


#: where a log keeps its evaluation, in order of preference (verl's core validation metrics first)
EVAL_PREFIXES: tuple[str, ...] = ("val-core/", "eval_", "eval/", "val/", "val_", "test_", "test/", "val-aux/")
#: words of an evaluation key that say its direction: higher is better, lower is better
HIGHER_WORDS = frozenset({"acc", "accuracy", "score", "reward", "pass", "correct", "success", "solved", "f1", "em"})
LOWER_WORDS = frozenset({"loss", "error", "err", "perplexity", "ppl", "nll", "wer", "cer"})
#: words of a key that hold a spread, a count or a cost of the evaluation, not its quality
_NOT_QUALITY = frozenset({"std", "var", "min", "max", "worst", "count", "num", "runtime", "samples", "second", "time"})
_NOT_QUALITY |= frozenset({"seconds", "timing", "steps", "per", "len", "length", "tokens"})


def eval_direction(key: str) -> str | None:
    """``eval_score`` (higher is better) or ``eval_loss`` (lower is better) for an evaluation key by its words, or
    None when it is not an evaluation key (:data:`EVAL_PREFIXES`, or ``accuracy`` as its last part), holds no quality
    (a spread, a count, a time) or its words say both directions or neither."""
    bare = strip_namespace(key).lower()
    if not (bare.startswith(EVAL_PREFIXES) or bare.rsplit("/", 1)[-1] in {"accuracy", "acc"}):
        return None
    words = _words(key)
    up, down = bool(words & HIGHER_WORDS), bool(words & LOWER_WORDS)
    if words & _NOT_QUALITY or up == down:
        return None
    return "eval_score" if up else "eval_loss"


def pick_eval_key(keys: Iterable[str], rows: Rows | Mapping[str, KeyValues]) -> tuple[str, str, str] | None:
    """The evaluation key the doctor reads beside the reward, its canonical name and the evidence: among ``keys``
    with a direction (:func:`eval_direction`) whose values are evidence (:func:`auto_map_refusal`: not
    configuration, not constant), the first by prefix (:data:`EVAL_PREFIXES`), higher-is-better before
    lower-is-better, fewest words, then name. None if there is none. ``rows``: the log's rows, or what they hold of
    each of ``keys`` with a direction (:mod:`rlguard.doctor.keyvalues`)."""
    named = {key: name for key in keys if (name := eval_direction(key)) is not None}
    values = rows if isinstance(rows, Mapping) else summarise(rows, dict.fromkeys(named, False))
    found = []
    for key, name in named.items():
        if auto_map_refusal(key, name, values[key]) is None:
            bare = strip_namespace(key).lower()
            rank = next((i for i, p in enumerate(EVAL_PREFIXES) if bare.startswith(p)), len(EVAL_PREFIXES))
            found.append(((rank, name != "eval_score", len(_words(key)), key), key, name))
    if not found:
        return None
    _, key, name = min(found)
    words = _words(key) & (HIGHER_WORDS if name == "eval_score" else LOWER_WORDS)
    direction = "higher" if name == "eval_score" else "lower"
    v = values[key]
    why = (
        f"an evaluation key, {direction} is better (inferred from {', '.join(sorted(words))}; declare it with --map "
        f"{key}=eval_score or =eval_loss, refuse it with --map {key}=); {v.count} records, values "
        f"{v.low:.4g}..{v.high:.4g}"
    )
    return key, name, why


def step_records(rows: Rows) -> list[Mapping[str, float]]:
    """The records that hold a step's training stats: each holds at least one of the log's per-step keys
    (:func:`~rlguard.doctor.keyvalues.per_step_keys`). The others (a first record of the run's arguments, a
    summary) are configuration records."""
    counts: dict[str, int] = {}
    for _, r in rows:
        for k in r:
            counts[k] = counts.get(k, 0) + 1
    per_step = per_step_keys(counts)
    return [r for _, r in rows if per_step & r.keys()]


def _evidence(key: str, name: str, v: KeyValues) -> str:
    fits = DOMAINS[name].why if name in DOMAINS else "any value"
    return (
        f"its words ({' '.join(sorted(_words(key)))}) match {name} alone; {v.count} records, values "
        f"{v.low:.4g}..{v.high:.4g}, median {v.median():.4g} ({fits})"
    )


#: words in a key -> the canonical name it likely holds, first match wins; each rule needs all its words
_SUGGEST: tuple[tuple[frozenset[str], str], ...] = tuple(
    (frozenset(words.split()), name)
    for words, name in (
        ("entropy", "entropy"),
        ("ppo kl", "kl_old"),
        ("old kl", "kl_old"),
        ("kl", "kl_ref"),
        ("reward std", "reward_std"),
        ("reward", "reward_mean"),
        ("score", "reward_mean"),
        ("return", "reward_mean"),
        ("len max", "length_max"),
        ("length max", "length_max"),
        ("len", "length_mean"),
        ("length", "length_mean"),
        ("grad norm", "grad_norm"),
        ("gradnorm", "grad_norm"),
        ("clip", "clip_frac"),
        ("ratio max", "ratio_max"),
        ("ratio", "ratio_mean"),
        ("truncated", "truncated_frac"),
        ("lr", "lr"),
    )
)
_ABBREVIATIONS = {"ent": "entropy", "rew": "reward", "rwd": "reward", "gnorm": "gradnorm", "trunc": "truncated"}


#: words that name an aggregate of a stat without changing which stat it is
_AGGREGATES = frozenset({"avg", "mean", "average"})


def _words(key: str) -> set[str]:
    return {_ABBREVIATIONS.get(w, w) for w in re.split(r"[^a-z0-9]+", strip_namespace(key).lower()) if w}


def _exact(key: str, name: str) -> bool:
    """Whether ``key``'s words are those of a rule for ``name``, aggregates (avg, mean) aside."""
    words = _words(key) - _AGGREGATES
    return any(need == words for need, rule_name in _SUGGEST if rule_name == name)


def suggest_canonical(key: str) -> str | None:
    """The one canonical name an unrecognised key looks like (``reward_avg`` -> ``reward_mean``,
    ``avg_response_len`` -> ``length_mean``), or None when none or several match. A rule whose words are all
    within another matching rule's (``reward`` within ``reward std``) gives way to it."""
    words = _words(key)
    hits = [(need, name) for need, name in _SUGGEST if need <= words]
    specific = {name for need, name in hits if not any(need < other for other, _ in hits)}
    return next(iter(specific)) if len(specific) == 1 else None


def parse_key_map(items: Iterable[str]) -> dict[str, str]:
    """``["reward_avg=reward_mean", "policy_ratio="]`` (``--map``) -> ``{"reward_avg": "reward_mean",
    "policy_ratio": ""}``: ``KEY=`` refuses ``KEY`` (it is read as no stat); ValueError naming the item for a
    malformed one or an unknown canonical name."""
    out: dict[str, str] = {}
    names = CANONICAL | DOCTOR_ONLY
    for item in items:
        key, sep, name = item.partition("=")
        if not sep or not key:
            raise ValueError(
                f"--map {item!r}: expected KEY=CANONICAL, e.g. --map reward_avg=reward_mean (or KEY= to refuse KEY)"
            )
        if name and name not in names:
            raise ValueError(
                f"--map {item!r}: {name!r} is not a canonical name; canonical names: {', '.join(sorted(names))}"
            )
        out[key] = name
    return out
