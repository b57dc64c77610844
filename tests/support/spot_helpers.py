"""Shared builders for the local-cloud tests: traces from strings, the training command."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from spot_core.localcloud.lease_processes import LEASE_MARKER
from spot_core.market.trace import ZoneTrace

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "traces"  # the real trace sets, in the repository (traces/README.md)


def trace(
    name: str,
    pattern: str,
    *,
    tick_seconds: float = 60.0,
    price: float = 0.9,
    on_demand: float = 3.06,
) -> ZoneTrace:
    """A zone whose availability per tick is ``pattern`` ('1' available, '0' not)."""
    available = np.array([c == "1" for c in pattern], dtype=bool)
    return ZoneTrace(
        name=name,
        tick_seconds=tick_seconds,
        available=available,
        spot_price=np.full(available.size, price),
        on_demand_price=on_demand,
        start_time=None,
        source="test",
    )


def write_trace(
    folder: Path,
    name: str,
    pattern: str,
    *,
    tick_seconds: float = 600.0,
    price: float = 0.9,
    on_demand: float = 3.06,
) -> str:
    """``trace(...)`` as an availability-JSON file (its format counts 1 as *unavailable*),
    for surfaces that take trace paths (``provider_options={"traces": [...]}``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(
        json.dumps(
            {
                "metadata": {
                    "gap_seconds": tick_seconds,
                    "price_info": {"price": price, "on_demand_price": on_demand},
                },
                "data": [0 if c == "1" else 1 for c in pattern],
            }
        )
    )
    return str(path)


# One deadline-bound job on a hand-built trace, run from every engine
# (tests/*/..._deadline_policy tests): zone a comes up at tick 3 and stays, zone b never
# does. Durations are trace (capacity) time, per the settings' time convention: at
# DEADLINE_SCALE trace seconds per wall second a 600 s tick lasts 2 wall seconds, so the
# 28-tick deadline is 56 wall seconds: the job needs about 9 s of them, and the rest is room
# for a busy CI machine (14 ticks once missed there, with the step 23 s in). Greedy waits
# for zone a's spot; without a deadline policy the safety net launches on-demand at once.
DEADLINE_TICK, DEADLINE_SCALE = 600.0, 300.0
DEADLINE_ZONES = {"us-east-1a_v100_1": "000" + "1" * 37, "us-east-1b_v100_1": "0" * 40}
DEADLINE_KNOBS = {
    "deadline": "280m",
    "work": "30m",
    "restart_overhead": "30m",
    "total_steps": 40,
    "deadline_policy": "greedy",
}


def deadline_traces(folder: Path) -> list[str]:
    return [
        write_trace(folder, name, pattern, tick_seconds=DEADLINE_TICK)
        for name, pattern in DEADLINE_ZONES.items()
    ]


def check_greedy_record(record, deadline_ticks: int = 28) -> None:
    """What greedy's plan did to the job's record: its deadline counts ``deadline_ticks``
    ticks of trace time (28: 56 wall seconds, not 16800); it waited for zone a's spot (its
    first attempt there, launched at tick 3 of a cloud opened as the job started: at least
    two ticks after the record was created) and never ran on on-demand; it succeeded in
    time."""
    from spot_core.model import JobStatus, Market

    wall = deadline_ticks * DEADLINE_TICK / DEADLINE_SCALE
    assert abs(record.deadline_at - record.created_at - wall) < 1.0
    first = record.attempts[0]
    assert (first.pool.zone, first.pool.market) == ("us-east-1a", Market.SPOT)
    assert first.started_at - record.created_at >= 2 * DEADLINE_TICK / DEADLINE_SCALE
    assert all(a.pool.market is Market.SPOT for a in record.attempts)
    assert record.status is JobStatus.SUCCEEDED
    assert record.attempts[-1].ended_at < record.deadline_at


def train_command(
    steps: int = 300, step_seconds: float = 0.01, seed: int = 7, every_steps: int = 20
) -> tuple[str, ...]:
    return (
        sys.executable,
        "-m",
        "spot_core.workloads.softmax_regression",
        "--steps",
        str(steps),
        "--step-seconds",
        str(step_seconds),
        "--seed",
        str(seed),
        "--checkpoint-every-steps",
        str(every_steps),
    )


def marked_processes(containing: str | None = None) -> list[int]:
    """Every live process that belongs to a local lease (the process table check); with
    ``containing``, only those whose environment mentions it (e.g. a test's tmp_path),
    so that tests running beside other work check only their own leases."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        mine = containing is None or containing.encode() in environ
        if f"{LEASE_MARKER}=".encode() in environ and state != "Z" and mine:
            found.append(int(entry.name))
    return found


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# A writer from a reclaimed node that keeps saving as attempt 1 until it is fenced out;
# argv[1] is the store URI (file:// or s3://, with the endpoint in the environment).
ZOMBIE_WRITER = textwrap.dedent("""
    import sys, time
    from spot_core.checkpoint import open_store
    from spot_core.errors import FencedOut
    store = open_store(sys.argv[1])
    step = 1000
    while True:
        try:
            store.save(step, {"a": b"zombie"}, {"writer": "zombie"}, attempt=1)
        except FencedOut:
            print("fenced", step, flush=True)
            sys.exit(0)
        step += 1
        time.sleep(0.002)
""")


def run_engine_demo(engine: str, cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """``spot-pipelines demo --engine ENGINE --json`` as a user runs it, in ``cwd`` with
    ``env``: (stdout, stdout and stderr together), after checking it succeeded and that its
    final JSON line counts at least one preemption."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "demo", "--engine", engine, "--json"],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=cwd,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["preemptions"] >= 1
    return proc.stdout, out
