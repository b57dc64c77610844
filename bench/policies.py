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
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from spot_core.market.trace import load_traces
from spot_core.policy.deadline import Job
from spot_core.sim.simulator import Replay, random_starts, simulate

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
EVALUATION = "aws-v100-2023-02"
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


def run_case(args: tuple[str, list[Path], float, float, int]) -> dict[str, object]:
    """Every policy on the same windows of one (zones, deadline, overhead) case."""
    name, paths, deadline, overhead, windows = args
    started = time.perf_counter()
    replay = Replay.from_traces(load_traces(paths))
    job = Job.from_hours(TASK_HOURS, deadline, overhead)
    starts = random_starts(replay.n_ticks, replay.deadline_ticks(job), windows, SEED)
    reports = {p: simulate(replay, job, p, starts) for p in POLICIES}
    return {"zones": name, "deadline": deadline, "overhead": overhead,
            "mean": {p: r.mean_cost for p, r in reports.items()},
            "misses": {p: r.deadline_misses for p, r in reports.items()},
            "seconds": time.perf_counter() - started}


def table(rows: list[dict[str, object]], windows: int, seconds: float) -> str:
    head = ["zones", "D h", "R h"] + [f"{p} $ (misses)" for p in POLICIES] + [
        "default / UP", "default / optimal", "gap UP->opt closed"]
    lines = [f"# Deadline policies on the evaluation set ({EVALUATION})", "",
             f"Task {TASK_HOURS:g} h, {windows} random windows per row (seed {SEED}), same windows "
             "for every policy; cost = mean $ per job; misses = windows past the deadline.",
             "UP = uniform-progress. Gap closed = (UP - default) / (UP - optimal).",
             f"Produced by `python -m bench.policies --windows {windows}` in {seconds:.0f} s.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        mean, misses = row["mean"], row["misses"]
        up, opt, dflt = mean["uniform-progress"], mean["optimal"], mean["default"]
        gap = up - opt
        closed = "n/a" if gap <= 1e-9 else f"{(up - dflt) / gap:.2f}"
        cells = [str(row["zones"]), f"{row['deadline']:g}", f"{row['overhead']:g}"]
        cells += [f"{mean[p]:.2f} ({misses[p]})" for p in POLICIES]
        cells += [f"{dflt / up:.3f}", f"{dflt / opt:.3f}", closed]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.policies", description=__doc__)
    parser.add_argument("--windows", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "tables" / "policies.md")
    parser.add_argument("--price-window-only", action="store_true",
                        help="only the price-window table (seconds), appended to --out")
    args = parser.parse_args(argv)
    if args.price_window_only:
        text = price_window_table(args.traces / EVALUATION)
        with args.out.open("a") as out:
            out.write("\n" + text)
        print(text)
        return 0
    groups = zone_groups(args.traces / EVALUATION)
    cases = [(name, paths, d, r, args.windows) for name, paths in groups.items()
             for d, r in CONFIGS]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_case, sorted(cases, key=lambda c: -len(c[1]))))
    order = {name: i for i, name in enumerate(groups)}
    rows.sort(key=lambda r: (order[r["zones"]], r["deadline"], r["overhead"]))
    text = table(rows, args.windows, time.perf_counter() - started)
    text += "\n" + price_window_table(args.traces / EVALUATION)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0



# -- price-window start ---------------------------------------------------------------------------
def price_window_table(folder: Path, job_hours: float = 6.0, window_hours: float = 24.0,
                       windows: int = 50) -> str:
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
        plan = plan_start(profile, job_hours=run_ticks * tick / 3600, window_start=now,
                          window_end=now + span * tick, now=now,
                          current_offers=_offers_at(traces, s, now))
        zone = replay.zones.index(plan.zone)
        begin = s + round((plan.start_at - now) / tick)
        totals["plan_start"] += cum[zone, begin + run_ticks] - cum[zone, begin]
        ready = np.where(replay.available[:, s], replay.price[:, s], np.inf)
        now_zone = int(np.argmin(ready)) if np.isfinite(ready).any() else 0
        totals["start now, cheapest zone"] += cum[now_zone, s + run_ticks] - cum[now_zone, s]
        last = s + span - run_ticks
        totals["oracle"] += float((cum[:, s + run_ticks:last + run_ticks + 1]
                                   - cum[:, s:last + 1]).min())
    lines = [f"## Price-window start ({job_hours:g} h job, {window_hours:g} h window, "
             f"{windows} windows, 9 zones)", "", "| strategy | mean $ |", "|---|---|"]
    lines += [f"| {k} | {v / windows:.2f} |" for k, v in totals.items()]
    return "\n".join(lines) + "\n"


def _offers_at(traces, tick: int, now: float):
    from spot_core.model import Offer, Pool
    return [Offer(Pool(t.cloud, t.region, t.zone, t.instance_type), float(t.spot_price[tick]),
                  t.on_demand_price, bool(t.available[tick]), now) for t in traces]


if __name__ == "__main__":
    raise SystemExit(main())
