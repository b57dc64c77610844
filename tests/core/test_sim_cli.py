"""`spot-pipelines simulate`: the JSON contract, and bad input as one line with exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spot_core.cli import main

ROWS = 40


def _write_trace(tmp_path, name="us-east-1a_v100_1", rows=ROWS, prices=None):
    start = np.datetime64("2023-02-15T00:00:00")
    lines = ["date,availability"] + [
        f"{str(start + np.timedelta64(195 * i, 's')).replace('T', ' ')},{int(i % 7 != 3)}"
        for i in range(rows)
    ]
    path = tmp_path / f"{name}.csv"
    path.write_text("\n".join(lines) + "\n")
    table = prices if prices is not None else {name: [1.0] * rows}
    price_path = tmp_path / "prices.json"
    price_path.write_text(json.dumps(table))
    return path, price_path


def _simulate(capsys, *args):
    code = main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _base(trace, prices):
    return [
        "--trace",
        str(trace),
        "--prices",
        str(prices),
        "--task-hours",
        "1",
        "--deadline-hours",
        "1.5",
        "--restart-overhead-hours",
        "0.05",
        "--json",
    ]


def test_contract_keys_and_start_order(tmp_path, capsys):
    trace, prices = _write_trace(tmp_path)
    code, out, err = _simulate(
        capsys,
        *_base(trace, prices),
        "--policy",
        "uniform-progress",
        "--start-tick",
        "5",
        "--start-tick",
        "0",
    )
    assert code == 0, err
    data = json.loads(out)
    assert {"policy", "mean_cost", "costs", "deadline_misses", "mean_cost_vs_on_demand"} <= set(
        data
    )
    assert data["policy"] == "uniform-progress" and len(data["costs"]) == 2
    assert data["start_ticks"] == [0, 5]
    assert data["mean_cost"] == pytest.approx(np.mean(data["costs"]))


def test_random_windows_are_reproducible_and_optimal_is_a_policy(tmp_path, capsys):
    trace, prices = _write_trace(tmp_path)
    args = [*_base(trace, prices), "--policy", "optimal", "--windows", "3", "--seed", "4"]
    first = json.loads(_simulate(capsys, *args)[1])
    assert json.loads(_simulate(capsys, *args)[1]) == first
    assert first["deadline_misses"] == 0 and first["mean_cost_vs_on_demand"] < 1


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rows_prices": ROWS - 1}, "prices"),
        ({"nan": True}, "NaN"),
        ({"args": ["--deadline-hours", "0.5"]}, "shorter than the work"),
        ({"args": ["--windows", "0"]}, "--windows"),
        ({"args": ["--policy", "nope"]}, "unknown policy"),
        ({"args": ["--start-tick", "39"]}, "start tick"),
        ({"no_windows": True}, "no windows"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, change, message):
    rows = change.get("rows_prices", ROWS)
    values = [1.0] * rows
    if change.get("nan"):
        values[3] = float("nan")
    trace, prices = _write_trace(tmp_path, prices={"us-east-1a_v100_1": values})
    args = _base(trace, prices) + change.get("args", [])
    if not change.get("no_windows") and not any(
        a in ("--windows", "--start-tick") for a in change.get("args", [])
    ):
        args += ["--windows", "2"]
    code, out, err = _simulate(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_mismatched_trace_lengths(tmp_path, capsys):
    a, _ = _write_trace(tmp_path, "us-east-1a_v100_1")
    b, _ = _write_trace(tmp_path, "us-east-1c_v100_1", rows=ROWS - 5)
    prices = tmp_path / "both.json"
    prices.write_text(
        json.dumps({"us-east-1a_v100_1": [1.0] * ROWS, "us-east-1c_v100_1": [1.0] * (ROWS - 5)})
    )
    code, _, err = _simulate(
        capsys,
        "--trace",
        str(a),
        "--trace",
        str(b),
        "--prices",
        str(prices),
        "--task-hours",
        "1",
        "--deadline-hours",
        "1.5",
        "--restart-overhead-hours",
        "0.05",
        "--windows",
        "1",
        "--json",
    )
    assert code == 2 and "different lengths" in err and err.count("\n") == 1
