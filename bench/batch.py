"""Batch inference on the busiest trace: the work queue against plain mapped shards.

    make bench-batch                     # 10,000 items, 4 workers / 4 shards
    python -m bench.batch --items 2000   # a quicker look

Both variants run side by side in one run, on one local spot cloud replaying the
busiest zone of the evaluation traces (``aws-v100-2023-02``: the zone with the most
interruptions, us-east-1c, 343 in 45 days), so they meet the same reclaims:

- **queue**: N workers share one ``WorkQueue`` of units (``spot_core.workloads.batch``);
  a reclaim costs the unfinished part of a unit;
- **shards**: N plain mapped tasks, shard i of N each, restarting the whole shard from
  its first item on every reclaim (``bench/batch_shard.py``).

Each worker or shard is a spot job under the controller (the same retry policy: spot
only, outages waited out, up to ``max_preemptions`` reclaims). Reported per variant:
wall seconds until the batch is done, cost (spot and on-demand as billed) against the
on-demand equivalent, preemptions, attempts, and whether every item's output is there
once and equals a plain loop's. Numbers go in bench/README.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spot_core.controller import Controller, JobSpec
from spot_core.market.trace import load_traces
from spot_core.model import JobRecord
from spot_core.policy.retry import RetryPolicy
from spot_core.providers.local import LocalProvider
from spot_core.workloads.batch import ItemRange, WorkQueue, outputs_sha256
from spot_core.workloads.batch_inference import ITEM_SECONDS, infer

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces" / "aws-v100-2023-02"


def busiest_trace():
    """The zone with the most interruptions (capacity lost from one tick to the next)."""
    traces = load_traces(
        sorted(glob.glob(str(TRACES / "*_v100_1.csv"))), prices=TRACES / "spot_prices.json"
    )

    def interruptions(t) -> int:
        a = t.available
        return int((a[:-1] & ~a[1:]).sum())

    return max(traces, key=interruptions), {t.name: interruptions(t) for t in traces}


def start_tick(trace, window: int = 300) -> int:
    """The start of the trace's busiest stretch: the ``window`` ticks with the most
    interruptions (ties: more capacity), starting on a tick with capacity."""
    a = trace.available
    drops = (a[:-1] & ~a[1:]).astype(int)
    best = max(range(0, len(a) - window), key=lambda i: (drops[i : i + window].sum(), a[i]))
    return next(i for i in range(best, len(a)) if a[i])


def policy(max_preemptions: int) -> RetryPolicy:
    """Spot only, as batch work that is not urgent runs: outages are waited out (up to
    200 s of wall time each), reclaims relaunched, up to ``max_preemptions``."""
    return RetryPolicy(
        max_preemptions=max_preemptions,
        on_demand_fallback=False,
        capacity_wait_seconds=0.5,
        max_capacity_waits=400,
    )


def run_queue(provider, args, workdir: Path) -> tuple[list[JobRecord], dict]:
    queue = WorkQueue.create(
        (workdir / "queue").as_uri(),
        ItemRange(0, args.items),
        unit_size=args.unit_size,
        claim_timeout_seconds=3.0,
    )
    command = (
        sys.executable,
        "-m",
        "spot_core.workloads.batch_worker",
        "--queue",
        queue.uri,
        "--function",
        "spot_core.workloads.batch_inference:infer",
    )
    specs = [
        JobSpec(
            f"bench-queue-w{i}",
            command,
            (workdir / f"q{i}").as_uri(),
            provider.pools(),
            env={ITEM_SECONDS: str(args.item_seconds)},
        )
        for i in range(args.workers)
    ]
    records = _run(provider, specs, args)
    outputs = list(queue.outputs())
    items = [o["item"] for _, values in outputs for o in values]
    return records, {
        "items_done": len(set(items)),
        "duplicates": len(items) - len(set(items)),
        "sha": outputs_sha256(outputs),
        "reclaimed_units": queue.progress().reclaims,
    }


def run_shards(provider, args, workdir: Path) -> tuple[list[JobRecord], dict]:
    specs = []
    for i in range(args.workers):
        command = (
            sys.executable,
            str(REPO / "bench" / "batch_shard.py"),
            "--items",
            str(args.items),
            "--shard",
            str(i),
            "--shards",
            str(args.workers),
            "--out",
            str(workdir / f"shard-{i}.json"),
        )
        specs.append(
            JobSpec(
                f"bench-shard-{i}",
                command,
                (workdir / f"s{i}").as_uri(),
                provider.pools(),
                env={ITEM_SECONDS: str(args.item_seconds)},
            )
        )
    records = _run(provider, specs, args)
    items = [
        o["item"]
        for i in range(args.workers)
        if (workdir / f"shard-{i}.json").exists()
        for o in json.loads((workdir / f"shard-{i}.json").read_text())
    ]
    return records, {"items_done": len(set(items)), "duplicates": len(items) - len(set(items))}


def _run(provider, specs, args) -> list[JobRecord]:
    controller = Controller(
        provider, provider.market, policy(args.max_preemptions), poll_interval_seconds=0.2
    )
    with ThreadPoolExecutor(len(specs)) as pool:
        return list(pool.map(controller.run, specs))


def row(name: str, records: list[JobRecord], seconds: float, extra: dict) -> dict:
    s = [r.summary() for r in records]
    return {
        "variant": name,
        "wall_seconds": round(seconds, 1),
        "cost": round(sum(x["spot_cost"] for x in s), 2),
        "on_demand_equivalent": round(sum(x["on_demand_cost"] for x in s), 2),
        "preemptions": sum(x["preemptions"] for x in s),
        "attempts": sum(x["attempts"] for x in s),
        "fallbacks": sum(x["fallbacks"] for x in s),
        "succeeded": sum(x["status"] == "succeeded" for x in s),
        **{k: v for k, v in extra.items() if k != "sha"},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--unit-size", type=int, default=50)
    parser.add_argument("--item-seconds", type=float, default=0.005)
    parser.add_argument(
        "--time-scale",
        type=float,
        default=300.0,
        help="trace seconds per wall second (default 300: 5 min per s)",
    )
    parser.add_argument("--max-preemptions", type=int, default=40)
    args = parser.parse_args(argv)
    trace, counts = busiest_trace()
    tick = start_tick(trace)
    print(
        f"trace {trace.name} ({counts[trace.name]} interruptions; others "
        f"{min(counts.values())}-{max(v for k, v in counts.items() if k != trace.name)}), "
        f"from tick {tick}, {args.time_scale:g} trace s per wall s; {args.items} items x "
        f"{args.item_seconds} s, {args.workers} workers / shards",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        work = Path(tmp)
        with LocalProvider.from_traces(
            [trace], time_scale=args.time_scale, start_tick=tick, workdir=work / "cloud"
        ) as provider:
            results = {}

            def timed(name, fn):
                started = time.monotonic()
                records, extra = fn(provider, args, work / name)
                results[name] = (records, time.monotonic() - started, extra)

            (work / "queue").mkdir()
            (work / "shards").mkdir()
            with ThreadPoolExecutor(2) as both:  # side by side: the same reclaims
                for f in [
                    both.submit(timed, "queue", run_queue),
                    both.submit(timed, "shards", run_shards),
                ]:
                    f.result()
    plain = outputs_sha256(
        [
            (u, [infer(i) for i in range(s, min(s + args.unit_size, args.items))])
            for u, s in (
                (f"unit-{k:06d}", k * args.unit_size)
                for k in range(-(-args.items // args.unit_size))
            )
        ]
    )
    rows = [row(name, *results[name]) for name in ("queue", "shards")]
    rows[0]["outputs_equal_plain_loop"] = results["queue"][2]["sha"] == plain
    for r in rows:
        print(json.dumps(r), flush=True)
    q, s = rows
    print(
        f"queue / shards: wall {q['wall_seconds'] / s['wall_seconds']:.2f}, "
        f"cost {q['cost'] / s['cost']:.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
