"""`spot-pipelines simulate`: replay a deadline policy on real spot traces.

Several --trace files are several zones on one clock; a policy may move between them
(each move costs a restart). Windows are drawn at random (--windows N --seed S) or
given (--start-tick T, repeatable; ticks count from the traces' first row). Prints a
table (each window's cost, the mean, the misses); with --json one JSON object instead:
policy, mean_cost, costs (per window, by ascending start tick), deadline_misses,
mean_cost_vs_on_demand (and start_ticks).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable

from spot_core.errors import ConfigError
from spot_core.market.trace import load_traces
from spot_core.policy.deadline.base import Job
from spot_core.policy.deadline.replay import Replay
from spot_core.sim.simulator import SimulationReport, policy_names, random_starts, simulate


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay a deadline policy on real spot traces",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument(
        "--trace",
        action="append",
        required=True,
        metavar="PATH",
        help="a trace file (CSV or JSON); repeat for several zones",
    )
    parser.add_argument(
        "--prices", metavar="PATH", help="per-tick spot prices {trace_stem: [$/h, ...]}"
    )
    parser.add_argument("--task-hours", type=_number, required=True, metavar="C")
    parser.add_argument("--deadline-hours", type=_number, required=True, metavar="D")
    parser.add_argument("--restart-overhead-hours", type=_number, required=True, metavar="R")
    parser.add_argument(
        "--policy", default="default", help=f"one of {', '.join(policy_names())} (default: default)"
    )
    parser.add_argument("--windows", type=int, metavar="N", help="random windows to replay")
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed for --windows (default 0)"
    )
    parser.add_argument(
        "--start-tick",
        type=int,
        action="append",
        metavar="T",
        help="a window's first tick; repeat for several windows",
    )
    parser.add_argument(
        "--on-demand-price",
        type=_number,
        metavar="P",
        help="on-demand $/h (default: the traces', else 3.06 for V100)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (policy, mean_cost, costs, deadline_misses, "
        "mean_cost_vs_on_demand, start_ticks) instead of the table",
    )
    parser.set_defaults(handler=run)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _check_hours(args: argparse.Namespace) -> None:
    """Each hours flag on its own, so the line names the one to fix."""
    if not args.task_hours > 0:
        raise ConfigError(f"--task-hours must be > 0, got {args.task_hours:g}")
    if not args.deadline_hours > 0:
        raise ConfigError(f"--deadline-hours must be > 0, got {args.deadline_hours:g}")
    if args.restart_overhead_hours < 0:
        raise ConfigError(
            f"--restart-overhead-hours must be >= 0, got {args.restart_overhead_hours:g}"
        )


def _check_start_ticks(ticks: Iterable[int], last: int) -> None:
    """A window must fit in the traces from its first tick to its deadline."""
    for tick in ticks:
        if not 0 <= tick <= last:
            raise ConfigError(
                f"--start-tick {tick} leaves no room for the deadline's window "
                f"in the traces; give a start tick from 0 to {last}"
            )


def run(args: argparse.Namespace) -> int:
    if args.windows is not None and args.start_tick:
        raise ConfigError("pass either --windows N or --start-tick T, not both")
    if args.windows is None and not args.start_tick:
        raise ConfigError("no windows to simulate: pass --windows N (N >= 1) or --start-tick T")
    if args.on_demand_price is not None and not args.on_demand_price > 0:
        raise ConfigError(f"--on-demand-price must be > 0, got {args.on_demand_price:g}")
    _check_hours(args)
    job = Job.from_hours(args.task_hours, args.deadline_hours, args.restart_overhead_hours)
    traces = load_traces(args.trace, prices=args.prices, on_demand_price=args.on_demand_price)
    replay = Replay.from_traces(traces, args.on_demand_price)
    _check_start_ticks(args.start_tick or (), replay.n_ticks - replay.deadline_ticks(job))
    starts = args.start_tick or random_starts(
        replay.n_ticks, replay.deadline_ticks(job), args.windows, args.seed
    )
    report = simulate(replay, job, args.policy, starts)
    if args.json:
        print(json.dumps(report.to_dict(), allow_nan=False))
    else:
        print(_table(report, args))
    return 0


def _table(report: SimulationReport, args: argparse.Namespace) -> str:
    """The report for a person: one row per window, costs in dollars to the cent."""
    job = (
        f"policy {report.policy}: {args.task_hours:g} h of work, deadline "
        f"{args.deadline_hours:g} h, restart overhead {args.restart_overhead_hours:g} h "
        "(trace hours)"
    )
    rows = [f"{'start tick':>10}  {'cost $':>10}  {'on-demand $':>11}"]
    for start, cost, on_demand in zip(
        report.starts, report.costs, report.on_demand_costs, strict=True
    ):
        rows.append(f"{start:>10}  {cost:>10.2f}  {on_demand:>11.2f}")
    summary = (
        f"mean cost ${report.mean_cost:.2f} over {len(report.costs)} window(s), "
        f"{report.mean_cost_vs_on_demand:.1%} of on-demand; deadlines missed "
        f"{report.deadline_misses} of {len(report.costs)}"
    )
    return "\n".join([job, *rows, summary])
