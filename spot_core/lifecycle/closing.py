"""How an attempt's end reads: its outcome from the lease's status, its message, and what
its store says of it (the newest checkpoint it reached, its resume report, who fenced it).

Pure or read-only helpers of ``Controller._close_attempt``; none of them writes.
"""

from __future__ import annotations

import dataclasses
import logging

from spot_core.attempt_env import INFRASTRUCTURE_EXIT_CODE, readable_reason
from spot_core.checkpoint import CheckpointStore
from spot_core.checkpoint.resumed import read_resumed
from spot_core.model import Attempt, CheckpointRef, Outcome
from spot_core.providers.base import LeaseState, LeaseStatus, Provider

log = logging.getLogger(__name__)


def classify(status: LeaseStatus) -> Outcome:
    """How an ended lease's attempt ended. A notice or a reclaim is never a failure; a
    provider's own verdict (``LeaseStatus.outcome``) stands as given."""
    if status.outcome is not None:
        return Outcome(status.outcome)
    if status.exit_code == 0:
        return Outcome.SUCCEEDED
    if status.state is LeaseState.RECLAIMED or status.notice_at is not None:
        return Outcome.PREEMPTED
    if status.exit_code == INFRASTRUCTURE_EXIT_CODE:  # the step's store stayed unreachable
        return Outcome.INFRASTRUCTURE_FAILED
    if status.state is LeaseState.TERMINATED or status.exit_code is None or status.exit_code < 0:
        return Outcome.INFRASTRUCTURE_FAILED
    return Outcome.USER_FAILED


def _message(outcome: Outcome, status: LeaseStatus) -> str:
    """The provider's message; for the step's own failure, led by its exit code."""
    if outcome is Outcome.DRAINED:
        return "drained: stopped with a checkpoint to move the job where the policy said"
    message = readable_reason(status.message) if status.message else ""
    if outcome is Outcome.USER_FAILED and status.exit_code is not None:
        return f"exit code {status.exit_code}" + (f": {message}" if message else "")
    return message


def _fenced_above(store: CheckpointStore, attempt: int) -> int | None:
    """The newer attempt that fenced ``attempt`` out of the store, or None."""
    try:
        level = store.fence_level()
    except Exception as exc:  # noqa: BLE001 - unknown: classify by the exit alone
        log.warning("could not read the fence of %s: %s", store.uri, exc)
        return None
    return level if level > attempt else None


def _end_ref(store: CheckpointStore, running: Attempt) -> CheckpointRef | None:
    """The newest checkpoint the attempt could have reached: with a handover, the
    replacement may already have saved newer ones, which are not this attempt's."""
    ref = store.latest()
    if ref is None or ref.attempt <= running.number:
        return ref
    older = [r for r in store.list() if r.attempt <= running.number]
    return older[-1] if older else None


def _with_resume_report(store: CheckpointStore, attempt: Attempt) -> Attempt:
    """The attempt with what its step reported at its first step (``checkpoint.resumed``):
    when it resumed, and the step it actually restored (a replacement adopted after a
    handover restores the old attempt's emergency checkpoint, which may be pruned from the
    store by the time the old attempt closes). Never fatal: an unread report costs a
    measurement, not the close."""
    try:
        report = read_resumed(store, attempt.number)
    except Exception as exc:  # noqa: BLE001 - a measurement, never the lifecycle
        log.warning("could not read the resume report of attempt %d: %s", attempt.number, exc)
        return attempt
    if report is None:
        return attempt
    return dataclasses.replace(
        attempt,
        resumed_at=attempt.resumed_at or report.resumed_at,
        checkpoint_step_start=attempt.checkpoint_step_start if report.step is None else report.step,
    )


def _stopped(now: float, message: str) -> LeaseStatus:
    return LeaseStatus(LeaseState.TERMINATED, ended_at=now, message=message)


def _checkpoint_seconds(ref: CheckpointRef | None, attempt: int) -> float:
    """Save time the attempt's Checkpointer reported in its newest checkpoint's metadata."""
    if ref is None or ref.attempt != attempt:
        return 0.0
    return float(ref.metadata.get("checkpoint_seconds_total", 0.0))


def lost_work(
    provider: Provider,
    outcome: Outcome,
    running: Attempt,
    end_ref: CheckpointRef | None,
    ended_at: float,
) -> float:
    """Work done after the last durable checkpoint, which the next attempt must redo.

    None after the attempt's own emergency checkpoint: the step stops at that save, so
    the time until its lease ended (the process exiting, the node being reclaimed at
    the notice's end) was teardown, not work to redo."""
    if outcome is Outcome.SUCCEEDED:
        return 0.0
    saved_at = running.started_at
    if end_ref is not None and end_ref.attempt == running.number:
        if end_ref.metadata.get("emergency"):
            return 0.0
        saved_at = max(saved_at, end_ref.created_at)
    return provider.capacity_seconds(max(0.0, ended_at - saved_at))
