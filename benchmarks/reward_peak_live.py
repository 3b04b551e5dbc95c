"""What the consequence rule's "a reward collapse needs an established peak" does when the live guard applies it.

The doctor applies it with hindsight (:func:`rlguard.guards.consequence.rule.established_peak`: a peak above
the run's start). This replays the reward curves of the committed unguarded collapse-benchmark runs and reports,
by the benchmark's own collapse verdict:

1. through the live ``reward_collapse`` detector (preset ``default``), at its first critical finding, whether the
   rewards seen so far hold the doctor's peak above the run's start;
2. through the guard (preset ``monitor``, ``reward_mean`` only), the first critical ``reward_collapse`` event
   with the severity decided on the step (``GuardConfig(consequence="step")``, the default) and by consequence
   from the past (``consequence="online"``: an established *level* above the floor of the reward's range,
   sustained criticals, lone ones raised when no recovery follows): runs critical in each, and the delay of the
   online rule's first critical event after the step rule's::

    python benchmarks/reward_peak_live.py
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.consequence.rule import ConsequenceRule, established_peak

ROOT = Path(__file__).resolve().parents[1]
LOGS = (ROOT / "benchmarks/collapse/results/runs.jsonl", ROOT / "benchmarks/collapse_long/results/runs.jsonl")


def unguarded(path: Path) -> list[dict[str, Any]]:
    """The runs of ``path`` recorded without a guard."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in rows if row["config"]["guard"] == "off"]


def verdict(row: dict[str, Any]) -> str:
    """The benchmark's own verdict on the run."""
    return "collapsed" if row["verdict"]["collapsed"] else "did not collapse"


def replay(path: Path) -> Counter[tuple[str, str]]:
    """(benchmark verdict, live reward_collapse at its first critical finding) -> unguarded runs of ``path``."""
    rule, counts = ConsequenceRule(), Counter[tuple[str, str]]()
    for row in unguarded(path):
        detector = Guard(GuardConfig.preset("default")).detectors["reward_collapse"]
        seen: list[float] = []
        live = "no critical finding"
        for step, reward in enumerate(row["rewards"]):
            seen.append(reward)
            finding = detector.check(step, {"reward_mean": reward}, armed=step >= detector.warmup)
            if finding is not None and finding.severity == "critical":
                peak = established_peak(seen, len(seen), rule)
                live = "critical, peak established" if peak else "critical, no peak yet (the rule: warn)"
                break
        counts[(verdict(row), live)] += 1
    return counts


def first_critical(rewards: list[float], consequence: str) -> int | None:
    """The step of the first critical ``reward_collapse`` event of a guard fed ``rewards``, or None."""
    guard = Guard(GuardConfig.preset("monitor", consequence=consequence))
    for step, reward in enumerate(rewards):
        for e in guard.observe(step, {"reward_mean": reward}).events:
            if e.detector == "reward_collapse" and e.severity == "critical":
                return step
    return None


def online_vs_step(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per benchmark verdict: runs with a critical reward_collapse event under each rule, those the online rule
    loses, and the online rule's delays (steps after the step rule's first critical event)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        step_at, online_at = first_critical(row["rewards"], "step"), first_critical(row["rewards"], "online")
        r = out.setdefault(verdict(row), {"runs": 0, "step": 0, "online": 0, "lost": 0, "delays": []})
        r["runs"] += 1
        r["step"] += step_at is not None
        r["online"] += online_at is not None
        r["lost"] += step_at is not None and online_at is None
        if step_at is not None and online_at is not None:
            r["delays"].append(online_at - step_at)
    return out


def main() -> None:
    for path in LOGS:
        rows = unguarded(path)
        print(f"{path.relative_to(ROOT)}: {len(rows)} unguarded runs")
        print("  live reward_collapse at its first critical finding, the doctor's peak (above the start):")
        for (v, live), n in sorted(replay(path).items()):
            print(f"    {v:17s} {live:40s} {n}")
        print("  first critical reward_collapse event, consequence 'step' vs 'online':")
        for v, r in sorted(online_vs_step(rows).items()):
            d = r["delays"]
            delay = f"{min(d)} / {statistics.median(d):g} / {max(d)}" if d else "-"
            print(
                f"    {v:17s} runs {r['runs']:3d}  critical: step {r['step']:3d}, online {r['online']:3d} "
                f"(lost {r['lost']}); online delay min / median / max: {delay}; "
                f"delayed > 5 steps: {sum(x > 5 for x in d)}"
            )


if __name__ == "__main__":
    main()
