"""How much of the default policy's gap to the optimum is its forecast, how much its model.

    python -m bench.policy_ceiling --dev --windows 15 --cache C   # the development set
    python -m bench.policy_ceiling --windows 50 --cache C         # the evaluation set

The default (``ForecastDP``) plans by DP against a semi-Markov model of capacity fitted to
the week *before* the window. This bench plans the same DP, with the same parameters,
against the model fitted to the window *itself*: perfect statistics of the future (how
long its runs and outages last, how often a zone's capacity follows another's), though
not its path. It is not a policy (it reads the future, so it bypasses the causal view
every real policy gets); it answers one question for the tuning in bench/README.md: if
the forecast were perfect, how much of the Uniform-Progress-to-optimal gap would this
model class close? What it does not close is the price of not knowing the path (and of
the model's shape: age buckets, one planned spot price, the zone chooser's rules).

Details: the fit's history is the window's own availability and prices (no half-life,
no re-planning, since nothing new is learned); the zone chooser's run statistics see
the window's runs too. The age of the run in progress at the first tick is then read
from the window's end rather than from the real history, a small error in one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.policies import (
    CONFIGS,
    EVALUATION,
    SEED,
    TASK_HOURS,
    TRACES,
    dev_groups,
    gap_closed,
    run_case,
    zone_groups,
)
from bench.progress import run_rows
from spot_core.market.trace import load_traces
from spot_core.policy.deadline.base import Job, Window
from spot_core.policy.deadline.mdp import ForecastDP
from spot_core.policy.deadline.replay import Replay
from spot_core.sim.simulator import random_starts, run_window

BASELINES = ("uniform-progress", "optimal")


def perfect_statistics(window: Window) -> Window:
    """The window with its own ticks as the only history the fit sees."""
    return dataclasses.replace(
        window, past_available=window.available.copy(), past_price=window.price.copy()
    )


def ceiling_case(args: tuple) -> dict[str, object]:
    """UP, the causal default, the perfect-statistics DP and the optimum on one case."""
    name, paths, deadline, overhead, windows, cache = args
    row = run_case((name, paths, deadline, overhead, windows, cache, BASELINES + ("default",)))
    replay = Replay.from_traces(load_traces(paths))
    job = Job.from_hours(TASK_HOURS, deadline, overhead)
    starts = sorted(random_starts(replay.n_ticks, replay.deadline_ticks(job), windows, SEED))
    config = ForecastDP(replan_hours=0.0, history_half_life_hours=0.0, history_hours=1e6)
    costs = []
    for start in starts:
        window = replay.window(start, job)
        costs.append(run_window(window, config.plan(perfect_statistics(window))).cost)
    row["mean"]["ceiling"] = float(np.mean(costs))
    return row


def closed(mean: dict[str, float], policy: str) -> float:
    """``bench.policies.gap_closed``, clipped to [-1, 1] as that table's mean is."""
    return min(max(gap_closed(mean, policy), -1.0), 1.0)


def table(rows: list[dict[str, object]], title: str, command: str, seconds: float) -> str:
    head = [
        "zones",
        "D h",
        "R h",
        "UP $",
        "default $",
        "ceiling $",
        "optimal $",
        "default closes",
        "ceiling closes",
    ]
    lines = [
        f"# The default's forecast against perfect statistics, {title}",
        "",
        f"Produced by `{command}` in {seconds:.0f} s.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        mean = row["mean"]
        cells = [str(row["zones"]), f"{row['deadline']:g}", f"{row['overhead']:g}"]
        cells += [f"{mean[p]:.2f}" for p in ("uniform-progress", "default", "ceiling", "optimal")]
        cells += [f"{closed(mean, p):.2f}" for p in ("default", "ceiling")]
        lines.append("| " + " | ".join(cells) + " |")
    summary = [
        f"{p}: gap closed >= 0.5 in {sum(closed(r['mean'], p) >= 0.5 for r in rows)} "
        f"of {len(rows)} rows, mean {np.mean([closed(r['mean'], p) for r in rows]):.3f}, "
        f"worse than UP in {sum(closed(r['mean'], p) < 0 for r in rows)}"
        for p in ("default", "ceiling")
    ]
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {s}" for s in summary) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.policy_ceiling", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--windows", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--dev", action="store_true", help="the development set")
    parser.add_argument(
        "--cache", type=Path, default=None, help="the baselines' cache file of bench.policies"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    groups = dev_groups(args.traces) if args.dev else zone_groups(args.traces / EVALUATION)
    cases = [
        (name, paths, d, r, args.windows, args.cache)
        for name, paths in groups.items()
        for d, r in CONFIGS
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = run_rows(
            pool,
            ceiling_case,
            sorted(cases, key=lambda c: -len(c[1])),
            label="rows",
            name=lambda r: str(r["zones"]),
        )
    order = {name: i for i, name in enumerate(groups)}
    rows.sort(key=lambda r: (order[r["zones"]], r["deadline"], r["overhead"]))
    title = "the development set" if args.dev else f"the evaluation set ({EVALUATION})"
    command = (
        f"python -m bench.policy_ceiling{' --dev' if args.dev else ''} --windows {args.windows}"
    )
    text = table(rows, title, command, time.perf_counter() - started)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
