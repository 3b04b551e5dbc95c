"""Severity that says consequence, judged with hindsight over a whole log.

The live guard must decide on the step itself, so a spike far above the rolling baseline is critical there (it
skips that optimizer step). The doctor sees what followed. A spike is a consequence-free excursion, and its
critical event becomes a warning, when all of these hold:

- it is isolated: fewer than ``repeat`` critical spikes of that detector within ``repeat_window`` logged steps;
- control held: no other detector found anything critical (that was not itself a spike) in the ``horizon``
  logged steps after it: entropy, reward, KL, length and the rest stayed in hand;
- the log goes on for at least ``horizon`` steps after it (otherwise recovery is unknown and it stays critical).

Gradient clipping absorbs such spikes in the healthy verl GSM8K baselines (``benchmarks/doctor_real_logs.py``); a
spike followed by lost entropy, reward or KL control, or spikes that repeat, stay critical.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from rlguard.guards.events import Event, Finding


@dataclass(frozen=True)
class ConsequenceRule:
    """When a critical spike counts as absorbed.

    Attributes:
        horizon: logged steps after the spike that must show no lost control.
        repeat: critical spikes of one detector within ``repeat_window`` logged steps that stay critical.
        repeat_window: logged steps over which spikes count as repeated.
    """

    horizon: int = 10
    repeat: int = 3
    repeat_window: int = 50


def downgrade_absorbed(
    events: Sequence[Event],
    findings: Sequence[Mapping[str, Finding]],
    steps: Sequence[int],
    rule: ConsequenceRule | None = None,
) -> list[Event]:
    """``events`` with each critical event raised by an absorbed spike turned into a warning (message says why).

    Args:
        events: the guard's events over the log, in order.
        findings: the guard's findings at each logged step (``Guard.last_findings``), aligned with ``steps``.
        steps: the logged steps, increasing.
        rule: the thresholds (defaults: :class:`ConsequenceRule`).
    """
    rule = rule or ConsequenceRule()
    index = {step: i for i, step in enumerate(steps)}
    spikes: dict[str, list[int]] = {}  # detector -> positions of its critical transient findings
    lost: list[tuple[int, str]] = []  # positions and detectors of critical findings that are not spikes
    for i, by_detector in enumerate(findings):
        for name, f in by_detector.items():
            if f.severity == "critical":
                if f.transient:
                    spikes.setdefault(name, []).append(i)
                else:
                    lost.append((i, name))
    out = []
    for e in events:
        at = index.get(e.step)
        found = findings[at].get(e.detector) if at is not None else None
        if e.severity != "critical" or found is None or not found.transient or at is None:
            out.append(e)
            continue
        i = at
        nearby = [j for j in spikes.get(e.detector, []) if abs(j - i) < rule.repeat_window]
        after = [name for j, name in lost if i <= j <= i + rule.horizon and name != e.detector]
        if len(nearby) >= rule.repeat or after or i + rule.horizon >= len(steps):
            out.append(e)
            continue
        note = (
            f" In hindsight a warning: an isolated spike, absorbed: no detector found lost control in the "
            f"{rule.horizon} logged steps after it (the live guard skips such a step)."
        )
        out.append(replace(e, severity="warn", message=e.message + note))
    return out
