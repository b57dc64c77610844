"""Every kind of bad trace and price file: one ConfigError line naming what to fix, from
the Python API and from `spot-pipelines simulate` and `run` (exit 2, no traceback).

Each row starts from a valid file (the first test shows it loads) and breaks one thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spot_core.errors import ConfigError
from spot_core.market.advisor import load_advisor
from spot_core.market.trace import load_spot_price_history, load_traces

pytestmark = pytest.mark.timeout(120)

STEM = "us-east-1a_v100_1"
TICKS = 60


def csv_text(rows: int = TICKS) -> str:
    lines = ["date,availability"]
    for i in range(rows):
        seconds = i * 195
        lines.append(
            f"2023-02-01 {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d},1"
        )
    return "\n".join(lines) + "\n"


def json_trace(**changes) -> dict:
    meta = {
        "gap_seconds": 600,
        "start_time": "2023-02-01T00:00:00Z",
        "price_info": {"on_demand_price": 3.06},
    }
    data = {"metadata": meta, "data": [0] * TICKS, "prices": [0.9] * TICKS}
    for key, value in changes.items():
        (meta if key in meta or key == "price_info" else data)[key] = value
    return data


def dumps(data) -> bytes:
    return json.dumps(data).encode()  # json writes NaN and Infinity as JS literals


GOOD_PRICES = dumps({STEM: [0.9] * TICKS})

# (id, file suffix, trace bytes, price-file bytes or None, words the line must hold)
ROWS = [
    ("csv-binary", ".csv", b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 20, GOOD_PRICES, "not UTF-8"),
    (
        "csv-latin-1",
        ".csv",
        csv_text().encode() + "caf\xe9,1\n".encode("latin-1"),
        GOOD_PRICES,
        "not UTF-8",
    ),
    ("csv-empty", ".csv", b"", GOOD_PRICES, "date,availability"),
    ("csv-header", ".csv", b"when,up\n2023-02-01 00:00:00,1\n", GOOD_PRICES, "date,availability"),
    ("csv-bad-date", ".csv", b"date,availability\nyesterday,1\n", GOOD_PRICES, "row"),
    ("csv-flag-2", ".csv", b"date,availability\n2023-02-01 00:00:00,2\n", GOOD_PRICES, "0 or 1"),
    ("prices-strings", ".csv", csv_text().encode(), dumps({STEM: ["cheap"] * TICKS}), "price"),
    ("prices-nan", ".csv", csv_text().encode(), dumps({STEM: [float("nan")] * TICKS}), "price"),
    (
        "prices-infinity",
        ".csv",
        csv_text().encode(),
        dumps({STEM: [float("inf")] * TICKS}),
        "price",
    ),
    ("prices-negative", ".csv", csv_text().encode(), dumps({STEM: [-0.5] * TICKS}), "price"),
    # finite but absurd: 1e308 $/h made the record's cost Infinity (`run --json` wrote it,
    # `report` then refused it)
    ("prices-huge", ".csv", csv_text().encode(), dumps({STEM: [1e308] * TICKS}), "from 0 to 1,000"),
    ("prices-null", ".csv", csv_text().encode(), dumps({STEM: [None] * TICKS}), "price"),
    ("prices-not-a-list", ".csv", csv_text().encode(), dumps({STEM: {"a": 1}}), "list"),
    ("prices-a-list", ".csv", csv_text().encode(), dumps([0.9] * TICKS), "object"),
    ("prices-binary", ".csv", csv_text().encode(), b"\xff\xfe\x00garbage", "not UTF-8"),
    ("prices-short", ".csv", csv_text().encode(), dumps({STEM: [0.9] * 3}), "align"),
    ("json-not-json", ".json", b"{metadata: nope", None, "not valid JSON"),
    ("json-binary", ".json", b"\x00\xff\xfe\x89" * 30, None, "not UTF-8"),
    ("json-a-list", ".json", b"[1, 2]", None, "object"),
    ("gap-text", ".json", dumps(json_trace(gap_seconds="fast")), None, "gap_seconds"),
    ("gap-infinity", ".json", dumps(json_trace(gap_seconds=float("inf"))), None, "gap_seconds"),
    ("gap-nan", ".json", dumps(json_trace(gap_seconds=float("nan"))), None, "gap_seconds"),
    ("gap-zero", ".json", dumps(json_trace(gap_seconds=0)), None, "gap_seconds"),
    (
        "gap-missing",
        ".json",
        dumps(
            {
                "metadata": {"price_info": {"on_demand_price": 3.06}},
                "data": [0] * TICKS,
                "prices": [0.9] * TICKS,
            }
        ),
        None,
        "gap_seconds",
    ),
    ("start-time-text", ".json", dumps(json_trace(start_time="yesterday")), None, "start_time"),
    ("start-time-list", ".json", dumps(json_trace(start_time=[2023, 2, 1])), None, "start_time"),
    (
        "on-demand-cheap",
        ".json",
        dumps(json_trace(price_info={"on_demand_price": "cheap"})),
        None,
        "on_demand_price",
    ),
    (
        "on-demand-negative",
        ".json",
        dumps(json_trace(price_info={"on_demand_price": -3})),
        None,
        "on_demand_price",
    ),
    (
        "on-demand-infinity",
        ".json",
        dumps(json_trace(price_info={"on_demand_price": float("inf")})),
        None,
        "on_demand_price",
    ),
    (
        "on-demand-huge",
        ".json",
        dumps(json_trace(price_info={"on_demand_price": 1e308})),
        None,
        "on_demand_price",
    ),
    (
        "json-prices-huge",
        ".json",
        dumps(json_trace(prices=[1e300] * TICKS)),
        None,
        "from 0 to 1,000",
    ),
    ("price-info-text", ".json", dumps(json_trace(price_info="cheap")), None, "price_info"),
    ("metadata-list", ".json", dumps({"metadata": [1], "data": [0] * TICKS}), None, "metadata"),
    ("data-strings", ".json", dumps(json_trace(data=["0"] * TICKS)), None, "'data'"),
    ("data-two", ".json", dumps(json_trace(data=[2] * TICKS)), None, "'data'"),
    ("data-empty", ".json", dumps(json_trace(data=[])), None, "'data'"),
    ("json-prices-strings", ".json", dumps(json_trace(prices=["x"] * TICKS)), None, "price"),
    ("json-prices-nan", ".json", dumps(json_trace(prices=[float("nan")] * TICKS)), None, "price"),
    (
        "history-price-text",
        ".json",
        dumps(
            {
                "SpotPriceHistory": [
                    {
                        "AvailabilityZone": "us-east-1a",
                        "InstanceType": "p3.2xlarge",
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": "cheap",
                        "Timestamp": "2023-02-01T00:00:00Z",
                    }
                ]
            }
        ),
        None,
        "spot price history entry",
    ),
    (
        "history-missing-keys",
        ".json",
        dumps({"SpotPriceHistory": [{"SpotPrice": "0.9"}]}),
        None,
        "spot price history entry",
    ),
    (
        "history-bad-time",
        ".json",
        dumps(
            {
                "SpotPriceHistory": [
                    {
                        "AvailabilityZone": "us-east-1a",
                        "InstanceType": "p3.2xlarge",
                        "SpotPrice": "0.9",
                        "Timestamp": "noon",
                    }
                ]
            }
        ),
        None,
        "spot price history entry",
    ),
]


def write_row(tmp_path, suffix: str, trace: bytes, prices: bytes | None):
    trace_path = tmp_path / f"{STEM}{suffix}"
    trace_path.write_bytes(trace)
    if prices is None:
        return trace_path, None
    prices_path = tmp_path / "prices.json"
    prices_path.write_bytes(prices)
    return trace_path, prices_path


def cli(command: str, trace_path, prices_path, cwd):
    prices = [] if prices_path is None else ["--prices", str(prices_path)]
    args = {
        "simulate": [
            "--task-hours",
            "0.5",
            "--deadline-hours",
            "1",
            "--restart-overhead-hours",
            "0",
            "--windows",
            "1",
            "--json",
        ],
        "run": ["--", "true"],
    }[command]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            command,
            "--trace",
            str(trace_path),
            *prices,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "suffix, trace, prices",
    [(".csv", csv_text().encode(), GOOD_PRICES), (".json", dumps(json_trace()), None)],
    ids=["csv", "json"],
)
def test_the_valid_file_each_row_breaks_loads_and_simulates(tmp_path, suffix, trace, prices):
    trace_path, prices_path = write_row(tmp_path, suffix, trace, prices)
    [loaded] = load_traces([trace_path], prices=prices_path)
    assert loaded.n_ticks == TICKS and loaded.spot_price[0] == 0.9
    proc = cli("simulate", trace_path, prices_path, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mean_cost"] > 0


@pytest.mark.parametrize(
    "suffix, trace, prices, words", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_a_bad_trace_or_price_file_is_one_clear_line(tmp_path, suffix, trace, prices, words):
    trace_path, prices_path = write_row(tmp_path, suffix, trace, prices)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        load_traces([trace_path], prices=prices_path)
    for command in ("simulate", "run"):
        proc = cli(command, trace_path, prices_path, tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert len(lines) == 1 and words in lines[0], proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr


def _fifo(path):
    os.mkfifo(path)


def _zero(path):
    path.symlink_to("/dev/zero")


@pytest.mark.parametrize(
    "kind, words", [(_fifo, "FIFO"), (_zero, "character device")], ids=["fifo", "dev-zero"]
)
@pytest.mark.parametrize("which", ["trace", "prices"])
def test_a_trace_or_price_file_that_is_no_regular_file_is_one_line_not_a_hang(
    tmp_path, kind, words, which
):
    """A FIFO blocked the read for ever, /dev/zero never ended it (and the trace loader
    called a FIFO trace "does not exist")."""
    trace_path, prices_path = write_row(tmp_path, ".csv", csv_text().encode(), GOOD_PRICES)
    odd = trace_path if which == "trace" else prices_path
    odd.unlink()
    kind(odd)
    with pytest.raises(ConfigError, match=words):
        load_traces([trace_path], prices=prices_path)
    for command in ("simulate", "run"):
        proc = cli(command, trace_path, prices_path, tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and str(odd) in lines[0]


def test_a_csv_trace_without_an_on_demand_price_names_a_flag_run_has(tmp_path):
    """The loader told `run` users to pass --on-demand-price, which `run` did not have."""
    trace_path = tmp_path / "zone-a.csv"  # no instance type in the name: no list price
    trace_path.write_text(csv_text())
    prices_path = tmp_path / "prices.json"
    prices_path.write_bytes(dumps({"zone-a": [0.9] * TICKS}))
    for command in ("run", "simulate"):
        proc = cli(command, trace_path, prices_path, tmp_path)
        assert proc.returncode == 2 and "--on-demand-price" in proc.stderr, proc.stderr
    base = [sys.executable, "-m", "spot_core.cli"]
    done = subprocess.run(
        [
            *base,
            "run",
            "--trace",
            str(trace_path),
            "--prices",
            str(prices_path),
            "--on-demand-price",
            "2.5",
            "--json",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["status"] == "succeeded" and record["ledger"]["on_demand_equivalent"] > 0
    from spot_core.providers import check_provider, open_provider

    with pytest.raises(ConfigError, match=r"on_demand_price=1e\+308 must be"):
        check_provider("local", {"on_demand_price": 1e308})
    provider = open_provider(
        "local",
        traces=[str(trace_path)],
        prices=str(prices_path),
        on_demand_price=2.5,
        workdir=str(tmp_path / "cloud"),
    )
    try:  # the option every other surface (operator, block, worker) passes
        assert provider.market.traces[0].on_demand_price == 2.5
        assert provider.options["on_demand_price"] == 2.5
    finally:
        provider.cloud.shutdown()
    done = subprocess.run(
        [
            *base,
            "simulate",
            "--trace",
            str(trace_path),
            "--prices",
            str(prices_path),
            "--on-demand-price",
            "2.5",
            "--task-hours",
            "0.5",
            "--deadline-hours",
            "1",
            "--restart-overhead-hours",
            "0",
            "--windows",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["mean_cost"] > 0, done.stderr


def test_a_history_passed_as_data_is_checked_the_same_way():
    with pytest.raises(ConfigError, match="SpotPrice"):
        load_spot_price_history(
            [
                {
                    "AvailabilityZone": "us-east-1a",
                    "InstanceType": "p3",
                    "SpotPrice": float("nan"),
                    "Timestamp": 0,
                }
            ]
        )


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\xff\xfe\x00\x01", "not UTF-8"),
        (b"not json", "not JSON"),
        (dumps({"spot_advisor": {}, "ranges": [{"label": "<5%"}]}), "ranges"),
        (dumps({"spot_advisor": [1, 2]}), "spot_advisor"),
    ],
    ids=["binary", "not-json", "ranges-without-index", "entries-a-list"],
)
def test_a_bad_spot_advisor_file_is_one_clear_line(tmp_path, content, words):
    path = tmp_path / "spot-advisor-data.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=words):
        load_advisor(path)


def test_a_spot_advisor_entry_with_odd_fields_is_a_corrupt_feed(tmp_path):
    path = tmp_path / "spot-advisor-data.json"
    path.write_bytes(
        dumps({"spot_advisor": {"us-east-1": {"Linux": {"p3.2xlarge": {"r": "high", "s": None}}}}})
    )
    advisor = load_advisor(path)
    with pytest.raises(ConfigError, match="corrupt"):
        advisor.interruption_band("us-east-1", "p3.2xlarge")
    with pytest.raises(ConfigError, match="corrupt"):
        advisor.savings("us-east-1", "p3.2xlarge")
    assert advisor.find_band("us-east-1", "p3.2xlarge") is None
