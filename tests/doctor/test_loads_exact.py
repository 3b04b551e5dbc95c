"""``loads_exact`` (orjson where installed) reads every line as ``json.loads`` does: the same object (types, float
bits, key order) or the same error, on records a trainer writes, on text near them and on random text."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rlguard.doctor.jsonlog import loads_exact
from tests.helpers.profiles import examples

#: numbers at the edges: 64-bit integer limits, floats near 2**63 and overflow, signed zeros, subnormals
EDGES = [
    0,
    -0.0,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    10**30,
    -(10**30),
    9.2e18,
    9.3e18,
    -9.3e18,
    5e-324,
    1.7976931348623157e308,
    0.1,
    1e23,
]
SCALARS = st.one_of(
    st.sampled_from(EDGES),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.booleans(),
    st.none(),
)
RECORDS = st.recursive(
    st.dictionaries(st.text(max_size=6), SCALARS, max_size=6),
    lambda inner: st.dictionaries(st.text(max_size=6), st.one_of(SCALARS, inner, st.lists(inner, max_size=3))),
    max_leaves=20,
)
#: spellings json accepts and orjson may not, or that a writer produces: NaN, Infinity, overflow, surrogates
SPELLINGS = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1.7976931348623159e308", '"\\ud800"', "1E5", "-0", "01", "1."]
)


def _read(line: str, loads: Any) -> tuple[str, str]:
    try:
        return "ok", repr(loads(line))  # repr: int or float, the float's digits and sign, the keys' order
    except (ValueError, RecursionError) as err:
        return type(err).__name__, str(err)


def _same(line: str) -> None:
    assert _read(line, loads_exact) == _read(line, json.loads), line


@pytest.fixture(autouse=True)
def _fast_reader() -> None:
    pytest.importorskip("orjson")  # without it loads_exact is json.loads: nothing to compare


@examples(quick=200, long=5000)
@given(record=RECORDS)
@example(record={"step": 2**64, "loss": 0.5})
@example(record={"run": 2**70, "step": 1})
@example(record={"data": {"x": [1, {"y": -(2**63) - 1}]}})
def test_a_record_written_by_json_reads_the_same(record: dict[str, Any]) -> None:
    _same(json.dumps(record))


@examples(quick=200, long=5000)
@given(record=RECORDS, key=st.text(max_size=4), spelling=SPELLINGS, cut=st.integers(0, 400))
def test_unusual_spellings_and_torn_lines_read_the_same(
    record: dict[str, Any], key: str, spelling: str, cut: int
) -> None:
    line = json.dumps(record)
    with_value = line[:-1] + (", " if record else "") + f"{json.dumps(key)}: {spelling}}}"
    _same(with_value)
    _same(with_value[:cut])  # a line torn anywhere
    _same(line + line)  # two records on one line


@examples(quick=200, long=5000)
@given(text=st.text(alphabet=st.sampled_from(list('{}[]":,.-+eE0123456789 \t\ntruefalsnulNaIfiy\\u')), max_size=40))
def test_random_text_reads_the_same(text: str) -> None:
    _same(text)


def test_duplicate_keys_and_deep_nesting_read_the_same() -> None:
    _same('{"a": 1, "b": 2, "a": 3}')
    for depth in (100, 990, 1030, 5000):
        _same("[" * depth + "]" * depth)
        _same('{"a": ' * depth + "1" + "}" * depth)


def test_an_integer_beyond_64_bits_stays_an_integer() -> None:
    """orjson alone reads it as a float: a run id or step of 2**64 would change type (and its message)."""
    record = loads_exact('{"step": 18446744073709551616, "run": -9223372036854775809}')
    assert record == {"step": 2**64, "run": -(2**63) - 1}
    assert all(type(v) is int for v in record.values())
    assert math.isnan(loads_exact('{"loss": NaN}')["loss"])


@examples(quick=200, long=5000)
@given(
    values=st.lists(
        st.one_of(
            st.sampled_from([*EDGES, 2.0**62, -(2.0**62), 2.0**63 - 1024, 4.6e18, -9.2e18, True]),
            st.floats(allow_nan=False, allow_infinity=False),
            st.integers(),
        ),
        max_size=8,
    )
)
def test_a_flat_record_of_numbers_is_narrow_exactly_when_each_float_is(values: list[Any]) -> None:
    """``_narrow``'s one-call check of a flat record (its norm) agrees with reading the values one by one, at and
    around the bound, with big integers (never wide: only a float is) and booleans."""
    from rlguard.doctor.jsonlog import _WIDE, _narrow

    record = {f"k{i}": v for i, v in enumerate(values)}
    assert _narrow(record) == all(-_WIDE < v < _WIDE for v in values if type(v) is float)
