"""The AWS Spot Advisor feed: bands by region and type, and the rate each band implies."""

from __future__ import annotations

import math

import pytest

from spot_core.errors import ConfigError
from spot_core.market.advisor import Band, band_for_label, band_from_range, load_advisor
from tests.support.spot_helpers import TRACES

FEED = TRACES / "aws-spot-advisor" / "spot-advisor-data.json"


@pytest.mark.parametrize(
    "entry,band",
    [
        ({"label": "<5%", "max": 5}, Band("<5%", 0.0, 0.05)),
        ({"label": "5-10%", "max": 11}, Band("5-10%", 0.05, 0.10)),
        ({"label": "15-20%", "max": 22}, Band("15-20%", 0.15, 0.20)),
        ({"label": ">20%", "max": 100}, Band(">20%", 0.20, 1.0)),
    ],
)
def test_band_edges_come_from_labels(entry, band):
    assert band_from_range(entry) == band


@pytest.mark.parametrize("label,typical", [("<5%", 0.025), ("10-15%", 0.125), (">20%", 0.25)])
def test_band_rate_is_a_monthly_fraction_as_poisson_rate(label, typical):
    band = band_for_label(label)
    assert band.typical == pytest.approx(typical)
    assert band.interruptions_per_hour == pytest.approx(-math.log(1 - typical) / 730)


def test_band_rates_increase_with_band():
    rates = [
        band_for_label(x).interruptions_per_hour
        for x in ("<5%", "5-10%", "10-15%", "15-20%", ">20%")
    ]
    assert rates == sorted(rates) and len(set(rates)) == 5


def test_shipped_excerpt():
    advisor = load_advisor()
    assert advisor.interruption_band("us-east-1", "p3.2xlarge").label == ">20%"
    assert advisor.savings("us-east-1", "p3.2xlarge") == pytest.approx(0.80)
    assert advisor.find_band("us-east-1", "x9.huge") is None
    with pytest.raises(ConfigError, match="no region 'mars-1'"):
        advisor.interruption_band("mars-1", "p3.2xlarge")
    with pytest.raises(ConfigError, match="lists no Linux 'x9.huge'"):
        advisor.interruption_band("us-east-1", "x9.huge")


def test_full_feed_from_the_repository_traces():
    advisor = load_advisor(FEED)
    assert len(advisor.regions()) == 33
    assert [b.label for b in advisor.bands] == ["<5%", "5-10%", "10-15%", "15-20%", ">20%"]
    excerpt = load_advisor()
    for region in excerpt.regions():
        for instance_type in excerpt.entries[region]["Linux"]:
            assert advisor.interruption_band(region, instance_type) == excerpt.interruption_band(
                region, instance_type
            )


@pytest.mark.parametrize(
    "data,match",
    [
        ({"ranges": []}, "no 'spot_advisor' key"),
        ({"spot_advisor": {}, "ranges": [{"index": 0, "label": "lots"}]}, "is not"),
    ],
)
def test_bad_feed(data, match):
    with pytest.raises(ConfigError, match=match):
        load_advisor(data)


def test_missing_feed_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_advisor(tmp_path / "nope.json")
