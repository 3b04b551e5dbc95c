"""How many examples the property tests draw: a few in ``make test`` (seconds in all), many in ``make
test-integration``, which sets ``RLGUARD_HYPOTHESIS_PROFILE=long``."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: the profile in force: ``quick`` (the unit tests) or ``long`` (``make test-integration``)
PROFILE = os.environ.get("RLGUARD_HYPOTHESIS_PROFILE", "quick")
if PROFILE not in ("quick", "long"):
    raise ValueError(f"RLGUARD_HYPOTHESIS_PROFILE: expected quick or long; got {PROFILE!r}")


def examples(quick: int, long: int) -> settings:
    """Hypothesis settings drawing ``quick`` examples, or ``long`` under the long profile; no deadline (a read
    of a real log takes longer on a loaded machine), fixtures of function scope allowed (``tmp_path_factory``)."""
    return settings(
        max_examples=long if PROFILE == "long" else quick,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
