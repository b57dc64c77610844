"""Shared builders for the local-cloud tests: traces from strings, the training command."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from spot_core.market.trace import ZoneTrace
from spot_core.emulators.lease_processes import LEASE_MARKER

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "traces"  # the real trace sets, in the repository (traces/README.md)


def trace(name: str, pattern: str, *, tick_seconds: float = 60.0, price: float = 0.9,
          on_demand: float = 3.06) -> ZoneTrace:
    """A zone whose availability per tick is ``pattern`` ('1' available, '0' not)."""
    available = np.array([c == "1" for c in pattern], dtype=bool)
    return ZoneTrace(name=name, tick_seconds=tick_seconds, available=available,
                     spot_price=np.full(available.size, price), on_demand_price=on_demand,
                     start_time=None, source="test")


def train_command(steps: int = 300, step_seconds: float = 0.01, seed: int = 7,
                  every_steps: int = 20) -> tuple[str, ...]:
    return (sys.executable, "-m", "spot_core.workloads.softmax_regression", "--steps",
            str(steps), "--step-seconds", str(step_seconds), "--seed", str(seed),
            "--checkpoint-every-steps", str(every_steps))


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
