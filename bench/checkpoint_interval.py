"""Checkpoint interval benchmark: lost work plus checkpoint overhead, per pool, on real traces.

What the controller does (``Moves.checkpoint_interval``): each attempt gets the
Young/Daly interval for its pool from the pool's interruption rate as the market reports
it at launch (the trace market: preemptions per hour over the last 24 h) and the save cost.
Here that is compared with fixed intervals, on each zone of the evaluation set
(``traces/aws-v100-2023-02``, 195 s ticks) and of the development set's AWS zones.

The model: a job runs on the zone's spot capacity whenever it is there, over a 48 h
window (``--windows`` random windows per zone, seed 0). Each run of capacity is one
attempt; it saves every ``interval`` of work, each save costing ``C`` seconds. When the
run ends, the work since the last completed save is lost: the worst case, a notice that
never arrived (with a notice, the emergency save makes the interval irrelevant; the
interval is the safety net). The cost of a policy is lost work plus save time, in hours
per window. ``best fixed`` is the best single fixed interval in hindsight for that zone
(an oracle no scheduler has).

Run: ``make bench-interval`` (or ``python -m bench.checkpoint_interval --help``).
Writes ``bench/tables/checkpoint_interval.md``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from spot_core.market.trace import count_preemptions, load_traces
from spot_core.policy.checkpoint_interval import CheckpointBounds, pool_checkpoint_interval
from spot_core.settings import default

ROOT = Path(__file__).resolve().parents[1]
SETS = {
    "evaluation": ROOT / "traces" / "aws-v100-2023-02",
    "development": ROOT / "traces" / "aws-v100-4node-600s",
}
WINDOW_HOURS = 48.0
LOOKBACK_HOURS = 24.0  # the trace market's default look-back (TraceMarket.lookback_hours)
FIXED_MINUTES = (5, 15, 30, 60, 120)
SEED = 0


def runs_in(available: np.ndarray) -> list[tuple[int, int, bool]]:
    """(first tick, length in ticks, ended by a preemption) of each run of capacity."""
    runs, start = [], None
    for t, up in enumerate(available):
        if up and start is None:
            start = t
        elif not up and start is not None:
            runs.append((start, t - start, True))
            start = None
    if start is not None:
        runs.append((start, len(available) - start, False))
    return runs


def waste(run_seconds: float, preempted: bool, interval: float, cost: float) -> float:
    """Save time plus lost work (seconds) of one run saving every ``interval`` of work."""
    saves = int(run_seconds // (interval + cost))
    if not preempted:
        return saves * cost
    return saves * cost + (run_seconds - saves * (interval + cost))


def window_waste(available: np.ndarray, start: int, ticks: int, tick: float, interval_at) -> float:
    """Hours wasted in the window starting at ``start``; ``interval_at(t)`` is the
    interval an attempt launched at absolute tick ``t`` is given."""
    total = 0.0
    for first, length, preempted in runs_in(available[start : start + ticks]):
        total += waste(length * tick, preempted, interval_at(start + first), COST[0])
    return total / 3600.0


COST = [60.0]  # seconds per save; set by main (a list so window_waste reads the current one)


def adaptive(available: np.ndarray, tick: float, bounds: CheckpointBounds):
    """The controller's interval at launch tick t: Young/Daly on the last 24 h's rate."""
    span = max(1, round(LOOKBACK_HOURS * 3600 / tick))

    def interval_at(t: int) -> float:
        seen = available[max(0, t - span + 1) : t + 1]
        rate = count_preemptions(seen) / (seen.size * tick / 3600)
        return pool_checkpoint_interval(rate, bounds.cost, bounds)

    return interval_at


def zone_rows(folder: Path, windows: int, bounds: CheckpointBounds) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("*_v100_1.*")):
        trace = load_traces([str(path)])[0]
        tick = trace.tick_seconds
        ticks = round(WINDOW_HOURS * 3600 / tick)
        history = round(LOOKBACK_HOURS * 3600 / tick)
        rng = np.random.default_rng(SEED)
        starts = rng.integers(history, trace.n_ticks - ticks, size=windows)
        available = trace.available
        row = {
            "zone": trace.name,
            "interruptions_per_hour": round(
                count_preemptions(available) / (available.size * tick / 3600), 3
            ),
        }
        for minutes in FIXED_MINUTES:
            row[f"{minutes}m"] = float(
                np.mean(
                    [
                        window_waste(available, s, ticks, tick, lambda t, m=minutes: m * 60.0)
                        for s in starts
                    ]
                )
            )
        interval_at = adaptive(available, tick, bounds)
        row["adaptive"] = float(
            np.mean([window_waste(available, s, ticks, tick, interval_at) for s in starts])
        )
        row["best fixed"] = min(row[f"{m}m"] for m in FIXED_MINUTES)
        rows.append(row)
    return rows


def table(rows: list[dict], title: str) -> list[str]:
    columns = [f"{m}m" for m in FIXED_MINUTES] + ["adaptive", "best fixed"]
    lines = [
        f"### {title}",
        "",
        "| zone | interruptions/h | " + " | ".join(columns) + " | adaptive / best fixed |",
        "|---|---:|" + "---:|" * len(columns) + "---:|",
    ]
    for row in rows:
        ratio = row["adaptive"] / row["best fixed"] if row["best fixed"] > 0 else 1.0
        lines.append(
            f"| {row['zone']} | {row['interruptions_per_hour']:.3f} | "
            + " | ".join(f"{row[c]:.3f}" for c in columns)
            + f" | {ratio:.2f} |"
        )
    means = {c: float(np.mean([r[c] for r in rows])) for c in columns}
    lines.append(
        "| **mean** | | "
        + " | ".join(f"**{means[c]:.3f}**" for c in columns)
        + f" | {means['adaptive'] / means['best fixed']:.2f} |"
    )
    single = min(FIXED_MINUTES, key=lambda m: means[f"{m}m"])
    lines += [
        "",
        f"Against the best single fixed interval for all zones ({single}m, "
        f"{means[f'{single}m']:.3f} h): adaptive {means['adaptive']:.3f} h, "
        f"{means['adaptive'] / means[f'{single}m']:.2f} of it.",
    ]
    wins = sum(1 for r in rows if r["adaptive"] <= min(r[f"{m}m"] for m in FIXED_MINUTES) + 1e-9)
    beats = {m: sum(1 for r in rows if r["adaptive"] <= r[f"{m}m"] + 1e-9) for m in FIXED_MINUTES}
    lines += [
        "",
        f"Adaptive is the best of all columns in {wins} of {len(rows)} zones; it is "
        "at least as good as each fixed interval in "
        + ", ".join(f"{beats[m]}/{len(rows)} ({m}m)" for m in FIXED_MINUTES)
        + ".",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=50)
    parser.add_argument(
        "--costs",
        type=float,
        nargs="+",
        default=[60.0, 300.0],
        help="seconds one save takes (one table each)",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "tables" / "checkpoint_interval.md"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        or "unknown"
    )
    lines = [
        "# Checkpoint interval: lost work + save time per 48 h window (hours)",
        "",
        f"`make bench-interval` at commit {commit}, {args.windows} windows per zone "
        f"(seed {SEED}); every notice missed (the interval is the safety net); "
        f"adaptive = the controller's Young/Daly interval per attempt from the last "
        f"{LOOKBACK_HOURS:g} h's interruption rate, bounded to "
        f"[{default('checkpoint_interval_min'):g} s, {default('checkpoint_interval_max'):g} s]. "
        "See bench/checkpoint_interval.py for the model.",
        "",
    ]
    for cost in args.costs:
        COST[0] = cost
        bounds = CheckpointBounds(
            cost, default("checkpoint_interval_min"), default("checkpoint_interval_max")
        )
        for name, folder in SETS.items():
            rows = zone_rows(folder, args.windows, bounds)
            lines += table(rows, f"{name} set ({folder.name}), save cost {cost:g} s")
            single = min(np.mean([r[f"{m}m"] for r in rows]) for m in FIXED_MINUTES)
            print(
                f"{name}, save {cost:g} s: adaptive {np.mean([r['adaptive'] for r in rows]):.3f} "
                f"h per window; best single fixed interval {single:.3f} h; per-zone "
                f"hindsight {np.mean([r['best fixed'] for r in rows]):.3f} h",
                flush=True,
            )
    lines.append(f"Runtime {time.perf_counter() - started:.0f} s.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
