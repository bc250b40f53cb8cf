"""ddplan.bounds: every flag's range, checked by hand at its edges."""

from __future__ import annotations

import math

import pytest

from ddplan import bounds
from ddplan.errors import UsageError


@pytest.mark.parametrize("flag, ok, bad", [
    ("--gpus", [1, 1_000_000], [0, 1_000_001, -8]),
    ("--price", [0.01, 10_000], [0, -1, 10_000.5]),  # a price of 0 is not an offer
    ("--headroom", [0, 0.99], [1, -0.01]),  # [0, 1): a layout may not need all of memory free
    ("--startup-min", [0, 100_000], [-1e-9, 1e9]),
    ("--measured-step-time", [1e-6, 1e6], [0, 1e7]),
])
def test_edges(flag, ok, bad):
    for value in ok:
        bounds.check(flag, value)
    for value in bad:
        with pytest.raises(UsageError) as e:
            bounds.check(flag, value)
        assert e.value.field == flag and bounds.describe(flag) in e.value.message


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_is_refused_everywhere(value):
    for flag in bounds.RANGES:
        with pytest.raises(UsageError):
            bounds.check(flag, value)


def test_none_is_not_given():
    bounds.check("--gpus", None)


def test_describe_reads_as_a_range():
    assert bounds.describe("--gpus") == "[1, 1,000,000] GPUs in total"
    assert bounds.describe("--headroom") == "[0, 1) fraction of usable memory"
    assert bounds.describe("--price") == "(0, 10,000] USD per GPU-hour"
