"""The small real-trace excerpt shipped inside the package (``spot_core/market/data``).

It keeps the demo and the simulator working where the repository's ``traces/`` folder is
absent: an installed wheel carries this excerpt, not the 6.6 MB of full trace sets. See
``spot_core/market/data/NOTICE`` for which rows were copied from where.
"""

from __future__ import annotations

from pathlib import Path

from spot_core.market.trace import ZoneTrace, load_trace, load_traces

DATA_DIR = Path(__file__).resolve().parent / "data"
CSV_SET = DATA_DIR / "aws-v100-2023-02-excerpt"
JSON_SET = DATA_DIR / "aws-v100-4node-600s-excerpt"


def fixture_trace_paths() -> list[Path]:
    """The three AWS V100 zones (CSV, 195 s ticks, 900 rows), least available first."""
    return sorted(CSV_SET.glob("*.csv"))


def fixture_prices_path() -> Path:
    """``{trace_stem: [$/h per row]}`` for the CSV excerpt."""
    return CSV_SET / "spot_prices.json"


def fixture_json_trace_path() -> Path:
    """One zone in the availability-JSON format (600 s ticks, 1 = preempted on disk)."""
    return JSON_SET / "us-west-2c_v100_1.json"


def default_traces() -> list[ZoneTrace]:
    """The CSV excerpt loaded with its prices: the market the demo replays by default."""
    return load_traces(fixture_trace_paths(), prices=fixture_prices_path())


def default_json_trace() -> ZoneTrace:
    return load_trace(fixture_json_trace_path())
