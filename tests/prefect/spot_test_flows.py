"""Flows the worker tests deploy (from this folder) to a ``spot`` work pool."""

from __future__ import annotations

import os
import time
from pathlib import Path

from prefect import flow


@flow(retries=1, retry_delay_seconds=0)
def preempted_twice_then_fails_once(marks: str) -> str:
    """Holds its first two spot attempts until the capacity is reclaimed; in the third,
    its own code fails once: that is what its one retry is for."""
    folder = Path(marks)
    folder.mkdir(parents=True, exist_ok=True)
    attempt = int(os.environ.get("SPOT_ATTEMPT", "0"))
    (folder / f"attempt-{attempt}-{time.time_ns()}").write_text("started")
    if attempt <= 2:
        time.sleep(300)  # the capacity is reclaimed long before this ends
    if not (folder / "failed-once").exists():
        (folder / "failed-once").write_text("failed")
        raise RuntimeError("the flow's own bug, first time only")
    return f"done in attempt {attempt}"


@flow
def naps(seconds: float, marks: str) -> str:
    """Runs for ``seconds``; writes a mark when it starts so a test knows it runs."""
    Path(marks).mkdir(parents=True, exist_ok=True)
    (Path(marks) / "started").write_text(str(time.time()))
    time.sleep(seconds)
    return "rested"


@flow(retries=1)
def naps_through_its_first_attempt(marks: str) -> str:
    """A plain flow (no spot_task) with one retry for its own errors: its first attempt
    naps until the capacity is reclaimed; any later attempt returns at once."""
    attempt = int(os.environ.get("SPOT_ATTEMPT", "0"))
    Path(marks).mkdir(parents=True, exist_ok=True)
    (Path(marks) / f"attempt-{attempt}").write_text(str(time.time()))
    if attempt <= 1:
        time.sleep(300)
    return f"done in attempt {attempt}"
