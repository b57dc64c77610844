"""Trace loading: every format lands as True = available, with prices aligned tick for tick.

The convention flip between the CSV (1 = available) and JSON (1 = preempted) sets is the
classic silent bug, so it is checked against the availability figures published in
traces/README.md, not against our own reading of the files.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from spot_core.errors import ConfigError
from spot_core.market import (
    default_json_trace,
    default_traces,
    fixture_json_trace_path,
    fixture_prices_path,
    fixture_trace_paths,
    load_spot_price_history,
    load_trace,
    load_traces,
)
from spot_core.market.trace import ZoneTrace, zone_region
from tests.support.spot_helpers import TRACES

README_AVAILABILITY = {  # traces/README.md, "Observed availability of the AWS V100 zones"
    "us-east-1a": 0.167,
    "us-east-1c": 0.467,
    "us-east-1d": 0.447,
    "us-east-1f": 0.591,
    "us-east-2a": 0.759,
    "us-east-2b": 0.682,
    "us-west-2a": 0.883,
    "us-west-2b": 0.905,
    "us-west-2c": 0.891,
}


@pytest.fixture(scope="module")
def aws_csv() -> dict[str, ZoneTrace]:
    paths = sorted((TRACES / "aws-v100-2023-02").glob("*_v100_1.csv"))
    return {t.zone: t for t in load_traces(paths)}


# -- the full sets ------------------------------------------------------------------------------
@pytest.mark.parametrize("zone,expected", sorted(README_AVAILABILITY.items()))
def test_csv_availability_matches_readme(aws_csv, zone, expected):
    assert aws_csv[zone].availability_fraction == pytest.approx(expected, abs=0.005)


def test_csv_set_shape_ticks_and_prices(aws_csv):
    trace = aws_csv["us-east-1a"]
    assert trace.n_ticks == 20158
    assert trace.tick_seconds == 195.0  # median of jittered diffs
    assert trace.start_time == datetime(2023, 2, 15, 22, 8, 16, tzinfo=UTC).timestamp()
    assert trace.on_demand_price == 3.06
    assert trace.spot_price[0] == pytest.approx(1.6703)
    assert aws_csv["us-east-2a"].spot_price[0] == pytest.approx(0.918)
    assert (trace.instance_type, trace.region, trace.cloud) == ("p3.2xlarge", "us-east-1", "aws")


def test_csv_prices_stay_within_the_public_archive_range(aws_csv):
    # price_archive_summary.csv: us-east-2 and us-west-2 zones never went below 0.918 $/h.
    for zone in ("us-east-2a", "us-east-2b", "us-west-2a", "us-west-2b", "us-west-2c"):
        prices = aws_csv[zone].spot_price
        assert prices.min() >= 0.918 - 1e-9 and prices.max() < 1.2


def test_json_4node_set_reads_one_as_preempted(aws_csv):
    """Read as 1 = preempted, the 4-node zones rank like the same zones in the CSV set.

    Read the other way round the order would invert (us-east-1f would look best).
    """
    folder = TRACES / "aws-v100-4node-600s"
    four = {t.zone: t for t in load_traces(sorted(folder.glob("*.json")))}
    assert four["us-east-1f"].availability_fraction == pytest.approx(0.388, abs=0.005)
    assert four["us-east-2a"].availability_fraction == pytest.approx(0.622, abs=0.005)
    assert four["us-west-2c"].availability_fraction == pytest.approx(0.776, abs=0.005)
    order = sorted(four, key=lambda z: four[z].availability_fraction)
    assert order == sorted(four, key=lambda z: aws_csv[z].availability_fraction)
    raw = json.loads((folder / "us-west-2c_v100_1.json").read_text())["data"]
    assert np.array_equal(four["us-west-2c"].available, np.array(raw) == 0)
    assert four["us-west-2c"].tick_seconds == 600 and four["us-west-2c"].start_time is None


def test_gcp_set_loads_with_prices_and_start_time():
    traces = load_traces(sorted((TRACES / "gcp-h100-2025-10").glob("*.json")))
    assert len(traces) == 13
    for trace in traces:
        assert trace.cloud == "gcp" and trace.instance_type == "a3-highgpu-8g"
        assert 0 < trace.spot_price[0] < trace.on_demand_price  # spot is the cheaper market
        assert 0.0 < trace.availability_fraction <= 1.0
    first = traces[0]
    assert first.start_time == pytest.approx(
        datetime(2025, 10, 4, 0, 10, 0, 2281, tzinfo=UTC).timestamp()
    )
    assert first.region == "asia-south2"


# -- the shipped fixture -----------------------------------------------------------------------
def test_fixture_loads_three_zones_with_differing_availability():
    traces = default_traces()
    assert [t.zone for t in traces] == ["us-east-1d", "us-east-2a", "us-west-2b"]
    fractions = [round(t.availability_fraction, 2) for t in traces]
    assert fractions == [0.19, 0.70, 0.91]
    assert all(t.n_ticks == 900 and t.tick_seconds == 195.0 for t in traces)
    assert all(t.preemptions >= 3 for t in traces)


def test_fixture_json_excerpt_is_flipped():
    trace = default_json_trace()
    raw = json.loads(fixture_json_trace_path().read_text())
    assert trace.n_ticks == 300 and trace.tick_seconds == 600
    assert np.array_equal(trace.available, np.array(raw["data"]) == 0)
    assert trace.availability_fraction == pytest.approx(1 - np.mean(raw["data"]))
    assert trace.on_demand_price == 3.06


def test_fixture_is_small_and_has_a_notice():
    data = fixture_prices_path().parent.parent
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    assert total < 200_000
    notice = (data / "NOTICE").read_text()
    assert "andylizf/skynomad-artifact" in notice and "Apache License" in notice
    assert (data / "LICENSE-skynomad-artifact").is_file()


def test_csv_without_prices_argument_uses_the_sibling_price_file():
    path = fixture_trace_paths()[0]
    table = json.loads(fixture_prices_path().read_text())
    trace = load_trace(path)
    assert np.array_equal(trace.spot_price, np.array(table[path.stem]))


def test_prices_keyed_by_zone_name_are_accepted(tmp_path):
    path = fixture_trace_paths()[1]
    prices = {"us-east-2a": [0.5] * 900}
    assert load_trace(path, prices=prices).spot_price.mean() == 0.5


def test_explicit_on_demand_price_wins():
    assert load_trace(fixture_trace_paths()[0], on_demand_price=2.5).on_demand_price == 2.5


def test_slice_moves_start_time_and_keeps_flags():
    trace = default_traces()[0]
    part = trace.slice(100, 200)
    assert part.n_ticks == 100
    assert part.start_time == trace.start_time + 100 * 195.0
    assert np.array_equal(part.available, trace.available[100:200])
    with pytest.raises(ConfigError):
        trace.slice(850, 950)


def test_trace_arrays_are_read_only():
    with pytest.raises(ValueError):
        default_traces()[0].available[0] = True


@pytest.mark.parametrize(
    "zone,region",
    [
        ("us-east-1a", "us-east-1"),
        ("us-central1-a", "us-central1"),
        ("asia-southeast1-b", "asia-southeast1"),
    ],
)
def test_zone_region(zone, region):
    assert zone_region(zone) == region


# -- bad input: one clear ConfigError line that names the fix ---------------------------------
def _csv(tmp_path: Path, name: str, rows: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("date,availability\n" + "\n".join(rows) + "\n")
    return path


ROWS = ["2023-02-15 22:08:16,1", "2023-02-15 22:11:31,0", "2023-02-15 22:14:46,1"]


@pytest.mark.parametrize(
    "case,match",
    [
        ("missing file", "does not exist"),
        ("unknown format", "unknown format"),
        ("price length mismatch", "align row for row"),
        ("zone missing from prices", "no entry for"),
        ("no price file", "pass prices="),
        ("bad availability value", "0 or 1"),
        ("no on-demand price", "on_demand_price="),
        ("not a trace json", "neither an availability trace"),
    ],
)
def test_bad_input_raises_config_error(tmp_path, case, match):
    if case == "missing file":
        call = lambda: load_trace(tmp_path / "nope.csv")  # noqa: E731
    elif case == "unknown format":
        path = tmp_path / "zone.parquet"
        path.write_bytes(b"x")
        call = lambda: load_trace(path)  # noqa: E731
    elif case == "price length mismatch":
        path = _csv(tmp_path, "us-east-1a_v100_1.csv", ROWS)
        call = lambda: load_trace(path, prices={"us-east-1a_v100_1": [1.0, 2.0]})  # noqa: E731
    elif case == "zone missing from prices":
        path = _csv(tmp_path, "us-east-1a_v100_1.csv", ROWS)
        call = lambda: load_trace(path, prices={"us-west-2c_v100_1": [1.0] * 3})  # noqa: E731
    elif case == "no price file":
        call = lambda: load_trace(_csv(tmp_path, "us-east-1a_v100_1.csv", ROWS))  # noqa: E731
    elif case == "bad availability value":
        path = _csv(tmp_path, "us-east-1a_v100_1.csv", ROWS[:2] + ["2023-02-15 22:14:46,2"])
        call = lambda: load_trace(path, prices={"us-east-1a": [1.0] * 3})  # noqa: E731
    elif case == "no on-demand price":
        path = _csv(tmp_path, "us-east-1a_k80_1.csv", ROWS)
        call = lambda: load_trace(path, prices={"us-east-1a": [1.0] * 3})  # noqa: E731
    else:
        path = tmp_path / "x.json"
        path.write_text('{"rows": []}')
        call = lambda: load_trace(path)  # noqa: E731
    with pytest.raises(ConfigError, match=match) as info:
        call()
    assert "\n" not in str(info.value)


def test_traces_with_different_ticks_cannot_be_mixed():
    with pytest.raises(ConfigError, match="different tick lengths"):
        load_traces(
            [fixture_trace_paths()[0], fixture_json_trace_path()], prices=fixture_prices_path()
        )


def test_the_same_zone_twice_is_rejected():
    path = fixture_trace_paths()[0]
    with pytest.raises(ConfigError, match="names repeat"):
        load_traces([path, path])


# -- EC2 spot price history -------------------------------------------------------------------
HISTORY = {
    "SpotPriceHistory": [
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "p3.2xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "0.918000",
            "Timestamp": "2023-02-15T22:00:00+00:00",
        },
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "p3.2xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "1.100000",
            "Timestamp": "2023-02-15T22:25:00+00:00",
        },
        {
            "AvailabilityZone": "us-east-1b",
            "InstanceType": "p3.2xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "0.950000",
            "Timestamp": datetime(2023, 2, 15, 22, 10, tzinfo=UTC),
        },
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "p3.2xlarge",
            "ProductDescription": "Windows",
            "SpotPrice": "9.000000",
            "Timestamp": "2023-02-15T22:05:00+00:00",
        },
    ]
}


def test_spot_price_history_becomes_step_series():
    traces = load_spot_price_history(HISTORY, tick_seconds=600)
    assert set(traces) == {("us-east-1a", "p3.2xlarge"), ("us-east-1b", "p3.2xlarge")}
    a = traces[("us-east-1a", "p3.2xlarge")]
    # grid 22:00, 22:10, 22:20, 22:30: the 22:25 change shows from the 22:30 tick on
    assert a.spot_price.tolist() == [0.918, 0.918, 0.918, 1.1]
    assert a.available.all() and a.on_demand_price == 3.06
    assert a.zone == "us-east-1a" and a.instance_type == "p3.2xlarge"
    b = traces[("us-east-1b", "p3.2xlarge")]
    assert b.spot_price.tolist() == [0.95, 0.95, 0.95, 0.95]  # before its first change: first price


def test_spot_price_history_from_file_and_single_zone_load_trace(tmp_path):
    one = {"SpotPriceHistory": HISTORY["SpotPriceHistory"][:2]}
    path = tmp_path / "history.json"
    path.write_text(json.dumps(one))
    trace = load_trace(path)
    assert trace.name == "us-east-1a_p3.2xlarge" and trace.tick_seconds == 300
    full = tmp_path / "full.json"
    other = dict(HISTORY["SpotPriceHistory"][2], Timestamp="2023-02-15T22:10:00Z")
    full.write_text(json.dumps({"SpotPriceHistory": one["SpotPriceHistory"] + [other]}))
    with pytest.raises(ConfigError, match="load_spot_price_history"):
        load_trace(full)


def test_spot_price_history_rejects_empty():
    with pytest.raises(ConfigError, match="describe_spot_price_history"):
        load_spot_price_history({"SpotPriceHistory": []})
