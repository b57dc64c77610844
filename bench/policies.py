"""Benchmark of the deadline policies on the evaluation traces (``aws-v100-2023-02``).

    python -m bench.policies [--windows 50] [--jobs 2] [--out bench/tables/policies.md]

It ends with a price-window table: an H-hour job that may start anywhere in a W-hour
window, started where and when ``plan_start`` says, against "start now in the cheapest
zone" and against the oracle's best start.

For each evaluation zone alone, the four us-east-1 zones together and all nine together;
task 48 h; deadlines 52 h and 70 h; restart overhead 0.05 h and 0.2 h; the same random
windows (seed 0) for every policy: mean cost and deadline misses of every policy, and
the default's ratio to ``uniform-progress`` and to ``optimal`` plus the share of the
uniform-progress-to-optimal gap it closes. Nothing here tunes anything: the policies'
parameters were chosen on the development set only (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.progress import run_rows
from spot_core.market.trace import load_traces
from spot_core.policy.deadline.base import Job
from spot_core.policy.deadline.replay import Replay
from spot_core.sim.simulator import random_starts, simulate

TRACES = Path(__file__).resolve().parents[1] / "traces"  # the repository's real traces
EVALUATION = "aws-v100-2023-02"
DEVELOPMENT = ("gcp-h100-2025-10", "aws-v100-4node-600s")
POLICIES = ("on-demand", "greedy", "uniform-progress", "default", "optimal")
CONFIGS = ((52.0, 0.05), (52.0, 0.2), (70.0, 0.05), (70.0, 0.2))
TASK_HOURS = 48.0
SEED = 0


def zone_groups(folder: Path) -> dict[str, list[Path]]:
    """Each zone alone, the us-east-1 zones together, all zones together."""
    paths = sorted(folder.glob("us-*.csv"))
    groups = {p.stem.split("_", 1)[0]: [p] for p in paths}
    groups["us-east-1 (4 zones)"] = [p for p in paths if p.stem.startswith("us-east-1")]
    groups["all 9 zones"] = paths
    return groups


def dev_groups(root: Path) -> dict[str, list[Path]]:
    """The development set: each zone of both dev sets alone, and each set as one market."""
    groups: dict[str, list[Path]] = {}
    for folder in DEVELOPMENT:
        paths = sorted((root / folder).glob("*.json"))
        short = folder.split("-")[0] + "-" + folder.split("-")[1]
        groups.update({f"{short}/{p.stem.split('_', 1)[0]}": [p] for p in paths})
        groups[f"{short} ({len(paths)} zones)"] = paths
    return groups


def run_case(args: tuple) -> dict[str, object]:
    """Every policy on the same windows of one (zones, deadline, overhead) case.

    With a cache file, the baselines' per-window costs (everything but ``default``,
    which is what changes while a policy is developed) are read from and added to it.
    """
    name, paths, deadline, overhead, windows, cache, *only = args
    started = time.perf_counter()
    _override_default()
    replay = Replay.from_traces(load_traces(paths))
    job = Job.from_hours(TASK_HOURS, deadline, overhead)
    starts = random_starts(replay.n_ticks, replay.deadline_ticks(job), windows, SEED)
    stored = _read_cache(cache)
    mean, misses = {}, {}
    for p in only[0] if only else POLICIES:
        key = f"{'|'.join(str(x) for x in paths)}|{deadline}|{overhead}|{windows}|{SEED}|{p}"
        if p == "default" or key not in stored:
            report = simulate(replay, job, p, starts)
            stored[key] = [report.mean_cost, report.deadline_misses]
            if p != "default" and cache is not None:
                _write_cache(cache, key, stored[key])
        mean[p], misses[p] = stored[key]
    return {
        "zones": name,
        "deadline": deadline,
        "overhead": overhead,
        "mean": mean,
        "misses": misses,
        "seconds": time.perf_counter() - started,
    }


def _row_name(row: dict[str, object]) -> str:
    return f"{row['zones']} D={row['deadline']:g} h R={row['overhead']:g} h"


def _override_default() -> None:
    """``BENCH_DEFAULT='{"param": value}'``: run ``default`` with other ForecastDP
    parameters (how the development-set sweeps in bench/README.md were run)."""
    params = os.environ.get("BENCH_DEFAULT")
    if params:
        from spot_core.policy.deadline.mdp import ForecastDP
        from spot_core.policy.deadline.policies import DEADLINE_POLICIES

        values = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(params).items()}
        DEADLINE_POLICIES.register("default", ForecastDP(**values), replace=True)


def _read_cache(cache: Path | None) -> dict[str, list]:
    if cache is None or not cache.exists():
        return {}
    out = {}
    for line in cache.read_text().splitlines():
        if line.strip():
            key, value = json.loads(line)
            out[key] = value
    return out


def _write_cache(cache: Path, key: str, value: list) -> None:
    with cache.open("a") as f:  # one line per entry: appends from two processes do not mix
        f.write(json.dumps([key, value]) + "\n")


def table(
    rows: list[dict[str, object]],
    windows: int,
    seconds: float,
    title: str = f"the evaluation set ({EVALUATION})",
    command: str | None = None,
    note: str = "",
) -> str:
    head = (
        ["zones", "D h", "R h"]
        + [f"{p} $ (misses)" for p in POLICIES]
        + ["default / UP", "default / optimal", "gap UP->opt closed"]
    )
    command = command or f"python -m bench.policies --windows {windows}"
    lines = [
        f"# Deadline policies on {title}",
        "",
        f"Task {TASK_HOURS:g} h, {windows} random windows per row (seed {SEED}), same windows "
        "for every policy; cost = mean $ per job; misses = windows past the deadline.",
        "UP = uniform-progress. Gap closed = (UP - default) / (UP - optimal).",
        f"Produced by `{command}` in {seconds:.0f} s.{note}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        mean, misses = row["mean"], row["misses"]
        up, opt, dflt = mean["uniform-progress"], mean["optimal"], mean["default"]
        gap = up - opt
        closed = "n/a" if gap <= 1e-9 else f"{(up - dflt) / gap:.2f}"
        cells = [str(row["zones"]), f"{row['deadline']:g}", f"{row['overhead']:g}"]
        cells += [f"{mean[p]:.2f} ({misses[p]})" for p in POLICIES]
        cells += [f"{dflt / up:.3f}", f"{dflt / opt:.3f}", closed]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n\n" + summary(rows) + "\n"
    return text + (
        "\n" + aims(rows) + "\n" if any(str(r["zones"]).startswith("all ") for r in rows) else ""
    )


def summary(rows: list[dict[str, object]]) -> str:
    """How many rows meet the issue's aims, and the default's totals."""
    half = sum(1 for r in rows if gap_closed(r["mean"]) >= 0.5)
    misses = sum(int(r["misses"]["default"]) for r in rows)
    worse_up = sum(1 for r in rows if r["mean"]["default"] > r["mean"]["uniform-progress"] + 1e-9)
    closed = [min(max(gap_closed(r["mean"]), -1.0), 1.0) for r in rows]
    ratio = [r["mean"]["default"] / r["mean"]["optimal"] for r in rows]
    multi = [r for r in rows if "zones" in str(r["zones"])]
    text = (
        f"Summary: gap closed >= 0.5 in {half} of {len(rows)} rows; default misses {misses}; "
        f"default worse than UP in {worse_up} rows; mean gap closed (clipped to [-1, 1]) "
        f"{np.mean(closed):.3f}; mean default / optimal {np.mean(ratio):.4f}."
    )
    for r in multi:
        m = r["mean"]
        text += (
            f"\n- {r['zones']} {r['deadline']:g} h / {r['overhead']:g} h: default / optimal "
            f"{m['default'] / m['optimal']:.4f}, default / greedy {m['default'] / m['greedy']:.4f}"
        )
    return text


AIM_GAP_CLOSED = 0.6
AIM_ALL_ZONES_RATIO = 1.01


def aims(rows: list[dict[str, object]]) -> str:
    """Issue 16's aims for the default, each met or missed and by how much.

    Why in the table: the issue asks that where an aim is not reached the table says by
    how much, so a reader need not work it out from the rows. The aims: a mean gap
    closed of at least 0.6, no row worse than Uniform Progress, and on the market of
    every zone together, within 1.01 of the optimum and never above greedy in each
    configuration."""
    closed = float(np.mean([min(max(gap_closed(r["mean"]), -1.0), 1.0) for r in rows]))
    worse = [r for r in rows if r["mean"]["default"] > r["mean"]["uniform-progress"] + 1e-9]
    lines = [
        "| aim | measured | met? |",
        "|---|---|---|",
        _aim_line(
            f"mean gap closed >= {AIM_GAP_CLOSED:g}",
            f"{closed:.3f}",
            closed >= AIM_GAP_CLOSED,
            f"{AIM_GAP_CLOSED - closed:.3f} short",
        ),
        _aim_line(
            "no row worse than uniform-progress",
            f"{len(worse)} rows",
            not worse,
            ", ".join(_row_name(r) for r in worse),
        ),
    ]
    every = [r for r in rows if str(r["zones"]).startswith("all ")]
    for r in every:
        m = r["mean"]
        ratio, greedy = m["default"] / m["optimal"], m["default"] / m["greedy"]
        lines.append(
            _aim_line(
                f"{_row_name(r)}: default / optimal <= {AIM_ALL_ZONES_RATIO:g}",
                f"{ratio:.4f}",
                ratio <= AIM_ALL_ZONES_RATIO,
                f"{(ratio / AIM_ALL_ZONES_RATIO - 1) * 100:.2f} % over",
            )
        )
        lines.append(
            _aim_line(
                f"{_row_name(r)}: default / greedy <= 1",
                f"{greedy:.4f}",
                greedy <= 1.0,
                f"{(greedy - 1) * 100:.2f} % over",
            )
        )
    return "Aims (issue 16, item 3):\n\n" + "\n".join(lines)


def _aim_line(aim: str, measured: str, met: bool, shortfall: str) -> str:
    return f"| {aim} | {measured} | {'met' if met else 'missed: ' + shortfall} |"


def gap_closed(mean: dict[str, float], policy: str = "default") -> float:
    """Share of the UP-to-optimal gap ``policy`` closes (1 where there is no gap)."""
    gap = mean["uniform-progress"] - mean["optimal"]
    return 1.0 if gap <= 1e-9 else (mean["uniform-progress"] - mean[policy]) / gap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.policies", description=__doc__)
    parser.add_argument("--windows", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default bench/tables/policies.md (evaluation set only)",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="the development set instead (tuning); prints, writes only --out",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="file that keeps the baselines' results between runs",
    )
    parser.add_argument(
        "--baselines-only",
        action="store_true",
        help="only fill --cache with the baselines' results (no table)",
    )
    parser.add_argument(
        "--price-window-only",
        action="store_true",
        help="only the price-window table (seconds), appended to --out",
    )
    args = parser.parse_args(argv)
    if args.baselines_only and args.cache is None:
        parser.error("--baselines-only needs --cache")
    if args.out is None and not args.dev:
        args.out = Path(__file__).parent / "tables" / "policies.md"
    if args.dev:
        return _run_dev(args)
    if args.price_window_only:
        text = price_window_table(args.traces / EVALUATION)
        with args.out.open("a") as out:
            out.write("\n" + text)
        print(text)
        return 0
    groups = zone_groups(args.traces / EVALUATION)
    cases = [
        (name, paths, d, r, args.windows, args.cache)
        for name, paths in groups.items()
        for d, r in CONFIGS
    ]
    started = time.perf_counter()
    if args.baselines_only:
        return _fill_cache(args, cases, started)
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = run_rows(
            pool, run_case, sorted(cases, key=lambda c: -len(c[1])), label="rows", name=_row_name
        )
    order = {name: i for i, name in enumerate(groups)}
    rows.sort(key=lambda r: (order[r["zones"]], r["deadline"], r["overhead"]))
    command = "python -m bench.policies" + " ".join(
        [""] + [a for a in (argv if argv is not None else __import__("sys").argv[1:])]
    )
    note = (
        ""
        if args.cache is None
        else (
            " The baselines' results (every policy but default) came from the cache file, filled "
            "beforehand for the same windows by the same command with `--baselines-only`; "
            "the time is this run's only (default, plus any baseline not cached)."
        )
    )
    text = table(rows, args.windows, time.perf_counter() - started, command=command, note=note)
    text += "\n" + price_window_table(args.traces / EVALUATION)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


def _fill_cache(args: argparse.Namespace, cases: list[tuple], started: float) -> int:
    """``--baselines-only``: every policy but the default into ``--cache``, no table."""
    baselines = tuple(p for p in POLICIES if p != "default")
    with ProcessPoolExecutor(args.jobs) as pool:
        run_rows(
            pool, run_case, [c + (baselines,) for c in cases], label="baselines", name=_row_name
        )
    print(f"baselines cached in {args.cache} in {time.perf_counter() - started:.0f} s")
    return 0


def _run_dev(args: argparse.Namespace) -> int:
    """The same table on the development set: what the default's design was tuned on."""
    groups = dev_groups(args.traces)
    cases = [
        (name, paths, d, r, args.windows, args.cache)
        for name, paths in groups.items()
        for d, r in CONFIGS
    ]
    started = time.perf_counter()
    if args.baselines_only:
        return _fill_cache(args, cases, started)
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = run_rows(
            pool,
            run_case,
            sorted(cases, key=lambda c: -len(c[1])),
            label="dev rows",
            name=_row_name,
        )
    order = {name: i for i, name in enumerate(groups)}
    rows.sort(key=lambda r: (order[r["zones"]], r["deadline"], r["overhead"]))
    text = table(
        rows,
        args.windows,
        time.perf_counter() - started,
        title="the development set (" + ", ".join(DEVELOPMENT) + ")",
        command=f"python -m bench.policies --dev --windows {args.windows}",
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


# -- price-window start ---------------------------------------------------------------------------
def price_window_table(
    folder: Path, job_hours: float = 6.0, window_hours: float = 24.0, windows: int = 50
) -> str:
    """Where and when to start an H-hour job inside a W-hour window, three ways.

    Realised cost of a start: the job runs in one zone, on spot in the ticks where it is
    available and on on-demand otherwise (the model the hour-of-week profile forecasts).
    ``plan_start`` sees only history before the window and the offers at its start;
    "start now" takes the cheapest zone with spot at the window's start; the oracle
    knows the future and picks the best start tick and zone.
    """
    from spot_core.policy.price_window import build_profile, plan_start

    traces = load_traces(sorted(folder.glob("us-*.csv")))
    tick = traces[0].tick_seconds
    replay = Replay.from_traces(traces)
    run_ticks, span = math.ceil(job_hours * 3600 / tick), round(window_hours * 3600 / tick)
    rate = np.where(replay.available, replay.price, replay.on_demand_price) * tick / 3600
    cum = np.concatenate([np.zeros((rate.shape[0], 1)), np.cumsum(rate, axis=1)], axis=1)
    rng = np.random.default_rng(SEED)
    first = int(7 * 86400 / tick)  # a week of history for the profile
    starts = sorted(rng.integers(first, replay.n_ticks - span, size=windows).tolist())
    totals = {"plan_start": 0.0, "start now, cheapest zone": 0.0, "oracle": 0.0}
    for s in starts:
        now = traces[0].start_time + s * tick
        profile = build_profile(traces, until=now)
        plan = plan_start(
            profile,
            job_hours=run_ticks * tick / 3600,
            window_start=now,
            window_end=now + span * tick,
            now=now,
            current_offers=_offers_at(traces, s, now),
        )
        zone = replay.zones.index(plan.zone)
        begin = s + round((plan.start_at - now) / tick)
        totals["plan_start"] += cum[zone, begin + run_ticks] - cum[zone, begin]
        ready = np.where(replay.available[:, s], replay.price[:, s], np.inf)
        now_zone = int(np.argmin(ready)) if np.isfinite(ready).any() else 0
        totals["start now, cheapest zone"] += cum[now_zone, s + run_ticks] - cum[now_zone, s]
        last = s + span - run_ticks
        totals["oracle"] += float(
            (cum[:, s + run_ticks : last + run_ticks + 1] - cum[:, s : last + 1]).min()
        )
    lines = [
        f"## Price-window start ({job_hours:g} h job, {window_hours:g} h window, "
        f"{windows} windows, 9 zones)",
        "",
        "| strategy | mean $ |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v / windows:.2f} |" for k, v in totals.items()]
    return "\n".join(lines) + "\n"


def _offers_at(traces, tick: int, now: float):
    from spot_core.model import Offer, Pool

    return [
        Offer(
            Pool(t.cloud, t.region, t.zone, t.instance_type),
            float(t.spot_price[tick]),
            t.on_demand_price,
            bool(t.available[tick]),
            now,
        )
        for t in traces
    ]


if __name__ == "__main__":
    raise SystemExit(main())
