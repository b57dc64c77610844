"""When an attempt's work resumed: a small JSON object next to the checkpoints.

At ``resumed/attempt-NNNNNN.json`` in the job's store. The step's ``Checkpointer`` writes
it once, when the step has restored (or found nothing to restore) and made its first step:
the moment the job does useful work again. The controller reads it when it closes the
attempt and records ``Attempt.resumed_at``; the JobRecord derives the time a reclaim cost
(``time_to_resume_seconds``) from it and the previous attempt's notice. It lives in the
job's store because the node may vanish and the driver never sees the step's clock.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from spot_core.checkpoint.store import CheckpointStore

RESUMED_PREFIX = "resumed"


def resumed_key(attempt: int) -> str:
    return f"{RESUMED_PREFIX}/attempt-{attempt:06d}.json"


@dataclass(frozen=True)
class ResumeReport:
    """What the step said about its start: when it resumed (POSIX seconds), from which
    checkpoint step (None: a fresh start) and how long the restore itself took."""

    attempt: int
    resumed_at: float
    step: int | None = None
    restore_seconds: float = 0.0

    def to_bytes(self) -> bytes:
        doc = {
            "attempt": self.attempt,
            "resumed_at": self.resumed_at,
            "step": self.step,
            "restore_seconds": self.restore_seconds,
        }
        return json.dumps(doc, allow_nan=False).encode()


def write_resumed(store: CheckpointStore, report: ResumeReport) -> None:
    """Write the attempt's resume report (one whole object; a later one replaces it)."""
    store.put_object(resumed_key(report.attempt), report.to_bytes())


def read_resumed(store: CheckpointStore, attempt: int) -> ResumeReport | None:
    """The attempt's resume report, or None when there is none or it is not one.

    Anyone who can write the store could have written it, so it is judged, never
    trusted: a report for another attempt, or with a time that is not a finite
    non-negative number, is read as none."""
    data = store.get_object(resumed_key(attempt))
    return parse_resumed(data, attempt)


def parse_resumed(data: bytes | None, attempt: int) -> ResumeReport | None:
    if not data:
        return None
    try:
        doc = json.loads(data, parse_constant=float)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("attempt") != attempt:
        return None
    resumed_at = _seconds(doc.get("resumed_at"))
    if resumed_at is None:
        return None
    step = doc.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        step = None
    return ResumeReport(
        attempt=attempt,
        resumed_at=resumed_at,
        step=step,
        restore_seconds=_seconds(doc.get("restore_seconds")) or 0.0,
    )


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)
