"""What the consequence rule's "a reward collapse needs an established peak" would do if the live guard applied it.

The doctor applies it with hindsight (:func:`rlguard.guards.detectors.consequence.established_peak`); the live guard
does not. This replays the reward curves of the committed unguarded collapse-benchmark runs through the live
``reward_collapse`` detector (preset ``default``) and asks, at its first critical finding, whether the rewards seen
so far hold an established peak. Counts by the benchmark's own collapse verdict::

    python benchmarks/reward_peak_live.py
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rlguard.guards import Guard, GuardConfig
from rlguard.guards.detectors.consequence import ConsequenceRule, established_peak

ROOT = Path(__file__).resolve().parents[1]
LOGS = (ROOT / "benchmarks/collapse/results/runs.jsonl", ROOT / "benchmarks/collapse_long/results/runs.jsonl")


def replay(path: Path) -> Counter[tuple[str, str]]:
    """(benchmark verdict, live reward_collapse at its first critical finding) -> unguarded runs."""
    rule, counts = ConsequenceRule(), Counter[tuple[str, str]]()
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["config"]["guard"] != "off":
            continue
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
        counts[("collapsed" if row["verdict"]["collapsed"] else "did not collapse", live)] += 1
    return counts


def main() -> None:
    for path in LOGS:
        print(path.relative_to(ROOT))
        for (verdict, live), n in sorted(replay(path).items()):
            print(f"  {verdict:17s} {live:40s} {n}")


if __name__ == "__main__":
    main()
