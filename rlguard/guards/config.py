"""What a guard watches and how it may act: :class:`GuardConfig` and its presets (:data:`PRESETS`, the one list of
their names, which every entry point that takes a preset accepts)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal

from rlguard.guards.alerts.config import AlertConfig
from rlguard.guards.fields import AT_LEAST_ONE, FieldError, Range, check_fields, check_value
from rlguard.guards.interventions import LRBackoff, Rollback
from rlguard.guards.interventions.recovery import Recovery
from rlguard.guards.schedules import SCHEDULED_KEYS, Schedule

__all__ = ["PRESETS", "GuardConfig", "check_preset"]


@dataclass
class GuardConfig:
    """What the guard watches and how it may act.

    Attributes:
        detectors: detector name -> keyword overrides of its defaults, or None to switch it off. Registered
            detectors not named here run with their defaults.
        interventions: intervention name -> overrides, or None to switch it off; likewise, except that the opt-in
            ones (``enabled_by_default = False``: ``trust_region``, ``entropy_control``, ``mismatch_remedy``,
            ``adaptive_entropy``, ``recovery``) run only when named. An empty guard (``monitor`` preset) switches
            all of them off and only observes.
        schedules: ``clip_low``, ``clip_high``, ``beta``, ``entropy_coef`` or ``lr_scale`` -> a schedule by step
            (:mod:`rlguard.guards.schedules`); the decision carries their values.
        snapshot_interval: a healthy step at least this many steps after the last snapshot asks for a new one.
            A longer interval does not lower the memory a snapshot takes (one is kept whatever the interval).
        snapshot_budget: the share of this host's available memory (when training starts, divided among the
            host's ranks) that one rank's rollback snapshot may take; a larger snapshot is refused at start-up with
            the fix. None: not checked. See ``docs/guides/reliability.md`` for what a snapshot costs.
        snapshot_to_disk: keep rollback snapshots in files under the run's output folder instead of host memory
            (``rlguard_snapshot/``; safetensors, one file per rank), written and read one tensor at a time.
        events_path: if set, events are written to this JSONL file: a run that starts afresh moves an existing
            file aside (``events.jsonl.<time>``), a resumed one continues it
            (:class:`~rlguard.guards.events.EventsLog`).
        observe_only: never act (the outcome is always ``step``, no intervention runs); schedules still apply, and
            so does the entropy controller that ``GuardedGRPOTrainer(use_adaptive_entropy=True)`` adds (TRL's flag
            asks for it whatever the guard does).
        healthy_despite: detectors whose findings and alarms do not make a step unhealthy: conditions of the data
            or of the rollout engine (a train-inference mismatch, groups without variance) that the weights of a
            snapshot do not carry and a rollback does not change. Without this, such a chronic alarm leaves the
            run with no healthy snapshot, and the next real failure halts it instead of rolling back.
        alerts: where the guard's important decisions are sent (a webhook, W&B), as an :class:`AlertConfig` or
            a mapping of its fields (:mod:`rlguard.guards.alerts`); None sends none.
        consequence: how a finding's severity is decided live. ``"online"`` (the default, and ``default`` and
            ``stable``'s): by consequence, from the past only
            (:class:`~rlguard.guards.consequence.live.OnlineConsequence`): a lone critical observation is a
            warning (``skip_step`` still skips its step) until what follows makes it critical, a sustained or
            unrecoverable one is critical at once, a reward drawdown needs an established level; so a lone
            excursion gets at most a skip, and a rollback or a halt needs what a critical finding of the doctor
            needs. ``"step"`` (``strict``, ``monitor``): the detector's, on the step itself.
        warmup_unit: how a detector's ``warmup`` is counted. ``"steps"`` (the default, and every preset's but
            ``monitor``): its first ``warmup`` optimizer steps, and at least 5 observations, the fewest a robust
            baseline needs (:func:`~rlguard.guards.detectors.base.warmed_up`); a guard that sees every step counts
            the same either way, one that sees every 5th step (stats logged every 5 steps) judges from its 5th
            observation instead of its ``warmup``-th. ``"observations"``: ``warmup`` observations whatever their
            steps (``monitor``: the doctor fits each warm-up to the whole log itself, in records,
            ``rlguard.doctor.diagnose.fit_warmups``).
    """

    detectors: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    interventions: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    schedules: dict[str, Schedule] = field(default_factory=dict)
    snapshot_interval: int = 10
    snapshot_budget: float | None = 0.5
    snapshot_to_disk: bool = False
    events_path: str | None = None
    observe_only: bool = False
    healthy_despite: tuple[str, ...] = ()
    alerts: AlertConfig | None = None
    consequence: Literal["step", "online"] = "online"
    warmup_unit: Literal["steps", "observations"] = "steps"

    #: a snapshot every step at most; a share of the host's available memory, 0 < x <= 1
    field_ranges: ClassVar[dict[str, Range]] = {
        "snapshot_interval": AT_LEAST_ONE,
        "snapshot_budget": Range(0.0, 1.0, open_low=True),
    }

    def __post_init__(self) -> None:
        # the field types, strictly (a mapping given for alerts becomes an AlertConfig, a list a tuple)
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in check_fields(GuardConfig, given, where="GuardConfig").items():
            setattr(self, name, value)
        unknown = set(self.schedules) - set(SCHEDULED_KEYS)
        if unknown:
            raise ValueError(f"schedules may set {list(SCHEDULED_KEYS)}; got {sorted(unknown)}.")

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any], *, where: str = "guard") -> GuardConfig:
        """A preset changed by fields, as JSON, YAML or a command line give them: ``{"preset": "strict",
        "snapshot_interval": 5}`` (``"default"`` without a preset). Every field is type-checked
        (:func:`~rlguard.guards.fields.check_fields`: ``"false"`` is not a boolean); unknown fields are refused;
        ``schedules``, which are functions, only from Python. Errors name ``where.<field>``."""
        if not isinstance(spec, Mapping):
            raise FieldError(f"{where}: expected a mapping of GuardConfig's fields; got {type(spec).__name__}")
        changes = dict(spec)
        preset = check_value(str, changes.pop("preset", "default"), f"{where}.preset")
        check_preset(preset)
        accepted = sorted(f.name for f in fields(cls) if f.name != "schedules")
        unknown = sorted(str(k) for k in changes if k not in accepted)
        if unknown:
            raise FieldError(
                f"{where}: unknown GuardConfig field(s) {unknown}; accepted: 'preset' and {accepted} (schedules only "
                "from Python, as a GuardConfig)."
            )
        return cls.preset(preset, **check_fields(cls, changes, where=where))

    @classmethod
    def preset(cls, name: str, **changes: Any) -> GuardConfig:
        """The preset ``name`` (:data:`PRESETS`: ``"monitor"`` observes only, ``"default"``, ``"strict"``,
        ``"stable"``); ``changes`` override fields."""
        check_preset(name)
        return replace(_PRESET_CONFIGS[name](), **changes)


def check_preset(name: object) -> str:
    """``name`` if it is a preset (:data:`PRESETS`), else ``ValueError`` listing them; builds nothing."""
    if not isinstance(name, str) or name not in _PRESET_CONFIGS:
        raise ValueError(f"unknown guard preset {name!r}; presets: {', '.join(PRESETS)}.")
    return name


def _monitor() -> GuardConfig:
    # it acts on nothing, so no consequence rule gates an action: it reports each step's findings as the detectors
    # make them (the doctor judges them by consequence with hindsight, consequence.offline.relabel)
    # and its warm-ups are counted in observations: the doctor fits them to the log's records (fit_warmups)
    return GuardConfig(observe_only=True, consequence="step", warmup_unit="observations")


def _default() -> GuardConfig:
    return GuardConfig()


def _strict() -> GuardConfig:
    spikes = {"warn_factor": 3.0, "critical_factor": 10.0, "min_z": 4.0}
    return GuardConfig(
        detectors={
            "grad_norm_spike": spikes,
            "kl_ref_blowup": {"warn_factor": 5.0, "critical_factor": 30.0, "min_z": 4.0},
            "kl_old_blowup": {"warn_factor": 5.0, "critical_factor": 30.0, "min_z": 4.0},
            "ratio_explosion": {"warn_factor": 3.0, "critical_factor": 20.0, "min_z": 4.0},
            "entropy_collapse": {"warn_ratio": 0.6, "critical_ratio": 0.3, "patience": 2},
            "reward_collapse": {"warn_drop": 4.0, "critical_drop": 8.0, "patience": 2},
            "mismatch_growth": {"warn_above": 2e-3, "critical_above": 1e-2},
        },
        interventions={
            "skip_step": {"severity": "warn", "on": ("nonfinite", "grad_norm_spike", "ratio_explosion")},
            "lr_backoff": {"cooldown": 5, "quiet_steps": 40},
            "clip_controller": {"target": 0.01, "min_scale": 0.1},
            "halt": {"critical_steps": 10},
        },
        snapshot_interval=5,
        # acts on the step's own severity: a lone critical step is rolled back at once (where one bad update
        # costs more than a needless rollback); default and stable wait for what a critical finding needs
        consequence="step",
    )


def _stable() -> GuardConfig:
    """``default`` plus the controllers that keep a run going instead of stopping it: the trust region
    on the step size, clip-higher on entropy collapse, the remedy of a train-inference gap (``mismatch_remedy``:
    a rollout correction or a kept gradient, the LR back-off only as its last rung), and rollbacks that learn
    (``recovery`` replaces ``rollback`` and ``halt``: a persistent critical alarm is a recovery attempt, and the
    run halts only after repeated failed recoveries)."""
    # A train-inference mismatch comes back with the next rollout from the same engine: a rollback does not cure it and
    # an LR cut only slows what it does; mismatch_remedy answers it, and while the gap is found lr_backoff leaves the LR
    # to it (its last rung, after the corrections; the cause table, interventions/causes.py). Where pi_old is the
    # engine's, the ratios to pi_old carry the gap: the clip controller holds then (StepContext.gap_in_ratio); the alarm
    # leaves the steps healthy (snapshots go on). An entropy far below its start with the reward above its early level
    # is a policy that converged on what it learned (a task with one right answer ends near zero entropy): no floor that
    # is critical whatever the reward does.
    recovery = {
        "on": tuple(n for n in Rollback.on if n != "mismatch_growth"),
        "ignore": (*Recovery.ignore, "mismatch_growth"),
    }
    return GuardConfig(
        detectors={"entropy_collapse": {"floor_ratio": 0.0}},
        interventions={
            "trust_region": {},
            "entropy_control": {},
            "mismatch_remedy": {},
            "staleness_remedy": {},  # a gap that grows with the samples' age (asynchronous pipelines)
            "lr_backoff": {"on": tuple(n for n in LRBackoff.on if n != "mismatch_growth")},
            "clip_controller": {"explained_by": ("mismatch_growth",)},
            "recovery": recovery,
            "rollback": None,
            "halt": None,
        },
        healthy_despite=("mismatch_growth",),
    )


_PRESET_CONFIGS: dict[str, Callable[[], GuardConfig]] = {
    "monitor": _monitor,
    "default": _default,
    "strict": _strict,
    "stable": _stable,
}
#: the guard presets, by name: the one list every entry point that takes a preset accepts
PRESETS: tuple[str, ...] = tuple(_PRESET_CONFIGS)
