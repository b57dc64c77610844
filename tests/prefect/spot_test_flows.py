"""Flows the worker tests deploy (from this folder) to a ``spot`` work pool."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from prefect import flow

from prefect_spot import spot_task


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


def sum_steps(
    checkpointer, total_steps: int, step_seconds: float, save_seconds: float, marks: str
) -> int:
    """Adds up every step's number, resumably (handover_step.py's loop, for a restored
    Checkpointer): the sum equals an uninterrupted run's only if the job resumed exactly
    where its newest checkpoint left it. Its emergency save takes ``save_seconds`` (a big
    model's), so the old lease outlives the notice and the replacement starts beside it;
    it leaves ``emergency-<attempt>.json`` in ``marks`` with the step it saved (the store
    prunes old checkpoints)."""
    total, step = 0, checkpointer.start_step
    if checkpointer.restored is not None:
        total = json.loads(checkpointer.store.load(checkpointer.restored)["state.json"])["total"]

    def payload() -> dict[str, bytes]:
        if checkpointer.emergency_requested:
            time.sleep(save_seconds)
            attempt = os.environ.get("SPOT_ATTEMPT", "0")
            Path(marks, f"emergency-{attempt}.json").write_text(json.dumps({"step": step + 1}))
        return {"state.json": json.dumps({"total": total}).encode()}

    for step in range(checkpointer.start_step, total_steps):
        total += step
        time.sleep(step_seconds)
        checkpointer.maybe_save(step + 1, payload)
    return total


@spot_task(checkpoint_every_steps=10)
def sums_steps(
    total_steps: int, step_seconds: float, save_seconds: float, marks: str, checkpointer=None
) -> int:
    """``sum_steps`` in place, under the spot worker."""
    return sum_steps(checkpointer, total_steps, step_seconds, save_seconds, marks)


@flow(retries=1, retry_delay_seconds=0)
def sums_through_a_handover(
    total_steps: int, step_seconds: float, save_seconds: float, result: str
) -> int:
    """``sums_steps`` as a flow with one retry for its own errors; writes the sum and the
    attempt that finished to ``result`` (its emergency marks go beside it)."""
    total = sums_steps(total_steps, step_seconds, save_seconds, str(Path(result).parent))
    Path(result).write_text(
        json.dumps({"total": total, "attempt": int(os.environ.get("SPOT_ATTEMPT", "0"))})
    )
    return total
