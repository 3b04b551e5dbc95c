"""``FindingIndex.sync`` reads runs of positions observed by one set at once: read in any chunks (down to one
position at a time), it keeps the same observed positions, findings and reward extremes."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from rlguard.guards.consequence import index as index_module
from rlguard.guards.consequence.index import FindingIndex
from rlguard.guards.events import Finding
from tests.helpers.profiles import examples

_SETS = [frozenset(), frozenset("a"), frozenset("ab"), frozenset("abc"), frozenset("bc")]


def _finding(severity: str) -> Finding:
    return Finding(severity, 1.0, 0.5, "m")  # type: ignore[arg-type]


def _read(index: FindingIndex) -> object:
    return (
        index.n,
        {name: list(index.positions(name)) for name in "abc"},
        {name: [(k, p, f.severity) for k, p, f in index.found(name)] for name in "abc"},
        (repr(index.lowest), repr(index.highest)),  # -0.0 and 0.0 told apart
    )


@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, len(_SETS) - 1),  # the set of detectors that observed it
            st.dictionaries(st.sampled_from("abc"), st.sampled_from(["warn", "critical"]), max_size=2),
            st.sampled_from([0.5, 0.0, -0.0, 1.0, -1.0, math.nan, math.inf]),
        ),
        max_size=40,
    ),
    cuts=st.lists(st.integers(0, 40), max_size=6),
)
@examples(quick=100, long=1000)
def test_the_index_read_in_chunks_equals_one_read_and_one_position_at_a_time(
    steps: list[tuple[int, dict[str, str], float]], cuts: list[int]
) -> None:
    observed = [_SETS[s] for s, _, _ in steps]  # one object per set, as the fold shares them
    findings = [{name: _finding(sev) for name, sev in f.items()} for _, f, _ in steps]
    rewards = [r for _, _, r in steps]
    whole, chunked, single = FindingIndex(), FindingIndex(), FindingIndex()
    whole.sync(observed, findings, rewards)
    for cut in [*sorted(cuts), len(steps)]:
        chunked.sync(observed[:cut], findings[:cut], rewards[:cut])
    for p in range(1, len(steps) + 1):
        single.sync(observed[:p], findings[:p], rewards[:p])
    small, chunk = FindingIndex(), index_module._CHUNK
    index_module._CHUNK = 3  # the rewards' extremes read 3 at a time within one sync
    try:
        small.sync(observed, findings, rewards)
    finally:
        index_module._CHUNK = chunk
    assert _read(whole) == _read(chunked) == _read(single) == _read(small)
    finite = [r for r in rewards if math.isfinite(r)]
    assert repr(whole.lowest) == repr(min(finite, default=math.nan))
    assert repr(whole.highest) == repr(max(finite, default=math.nan))
