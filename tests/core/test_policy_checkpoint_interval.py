"""Young/Daly checkpoint intervals against values worked out by hand.

Daly (C=60, M=3600): sqrt(C/2M) = sqrt(1/120) = 0.0912871, /3 = 0.0304290;
C/18M = 0.000925926; sqrt(2CM) = 657.26707; 657.26707 * 1.0313549 - 60 = 617.8756.
Daly (C=120, M=600): sqrt(0.1)/3 = 0.1054093; C/18M = 0.0111111;
379.47332 * 1.1165204 - 120 = 303.6897.
"""

from __future__ import annotations

import math

import pytest

from spot_core.errors import ConfigError
from spot_core.policy.checkpoint_interval import (
    FORMULAS,
    checkpoint_interval,
    daly_interval,
    young_interval,
)


@pytest.mark.parametrize(
    "c,m,expected",
    [
        (60, 3600, 657.2671),  # sqrt(432000)
        (30, 1800, 328.6335),  # sqrt(108000)
        (120, 600, 379.4733),  # sqrt(144000)
        (2, 2, 2.8284),  # sqrt(8)
    ],
)
def test_young(c, m, expected):
    assert young_interval(c, m) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    "c,m,expected",
    [
        (60, 3600, 617.8756),
        (30, 1800, 308.9378),  # same C/M ratio as above: exactly half
        (120, 600, 303.6897),
        (60, 36, 31.8125),  # C < 2M still: the expansion holds
        (800, 400, 400.0),  # C = 2M: capped at M
        (1000, 400, 400.0),  # C > 2M: capped at M
    ],
)
def test_daly(c, m, expected):
    assert daly_interval(c, m) == pytest.approx(expected, abs=1e-4)


def test_daly_approaches_young_for_cheap_checkpoints():
    c, m = 1.0, 1e6
    assert daly_interval(c, m) / young_interval(c, m) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize(
    "rate,kwargs,expected",
    [
        (1.0, {}, 617.8756),  # M = 3600 s
        (0.0, {}, 3600.0),  # nothing seen: the longest allowed gap
        (0.0, {"max_seconds": 900}, 900.0),
        (100.0, {}, 60.0),  # 31.8 s clamped up to min_seconds
        (100.0, {"min_seconds": 10}, 31.8125),
        (0.01, {"max_seconds": 600}, 600.0),  # ~1 interruption per 4 days: capped
        (1.0, {"formula": "young"}, 657.2671),
    ],
)
def test_checkpoint_interval(rate, kwargs, expected):
    assert checkpoint_interval(60, rate, **kwargs) == pytest.approx(expected, abs=1e-4)


def test_interval_shrinks_as_interruptions_grow():
    values = [checkpoint_interval(30, r, min_seconds=1, max_seconds=1e6) for r in (0.1, 1, 5, 20)]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((0, 1.0), {}),
        ((-5, 1.0), {}),
        ((60, -1.0), {}),
        ((60, math.nan), {}),
        ((60, 1.0), {"min_seconds": 100, "max_seconds": 50}),
        ((60, 1.0), {"min_seconds": 0}),
        ((60, 1.0), {"formula": "magic"}),
    ],
)
def test_bad_arguments(args, kwargs):
    with pytest.raises(ConfigError):
        checkpoint_interval(*args, **kwargs)


@pytest.mark.parametrize("c,m", [(0, 10), (10, 0), (math.inf, 10)])
def test_formulas_reject_non_positive(c, m):
    with pytest.raises(ConfigError):
        daly_interval(c, m)
    with pytest.raises(ConfigError):
        young_interval(c, m)


def test_formula_registry():
    assert FORMULAS.names() == ["daly", "young"] and FORMULAS.get() is daly_interval
