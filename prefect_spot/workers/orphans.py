"""Flow runs a dead spot worker left ``Running``: found, so another worker adopts them.

A spot worker puts a preempted flow run back (``AwaitingRetry``) once its lease ended.
The node hands the run back first: the engine ends it without a state, as Prefect's
``relinquish`` intent asks ("leave the next state to retrying infrastructure"). If the
worker dies between the two, nobody sets the next state: Prefect's workers pick up only
scheduled runs, and the lease is gone, so its watcher cannot end the run either. The run
would stay ``Running`` for ever.

So every spot worker looks, every ``ORPHAN_CHECK_SECONDS``, at the ``Running`` flow runs
of its work pool that it does not drive itself, and adopts a run when all three hold:

- its record (the ``spot-record-<flow run id>`` artifact) has an attempt still open;
- the job's heartbeat, renewed by whichever worker drives the run (at most every minute),
  is older than the job's ``heartbeat_timeout``: no worker drives it;
- the open attempt's lease has ended: a lease that still runs is the node's to end (its
  watcher stops the step once the heartbeat is that old, and the run ends ``Failed``).

Adopting is driving the run from its record, as a worker restarted with it would: the
controller watches the open attempt, closes it from the lease's end (a reclaim is a
preemption), and the worker reschedules or settles the run as usual. Nothing stops two
workers adopting the same run in the same moment; both would close the same open attempt
from the same record (one preemption either way) and both set ``AwaitingRetry`` (not
tested). The flow-run retry the adopted attempt used is not given back (the adopter reads
the run count after it), so a ``@flow(retries=...)`` may lose one to such a preemption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from spot_core.checkpoint.heartbeat import Beat, Heartbeat
from spot_core.model import JobRecord
from spot_core.providers.base import LeaseStatus

ORPHAN_CHECK_SECONDS = 30.0
"""How often a worker looks for orphaned runs (a read of its pool's Running runs)."""


@dataclass(frozen=True)
class Evidence:
    """What an adoption is decided on, read by :func:`gather`."""

    record: JobRecord | None
    beat: Beat | None
    status: LeaseStatus | None


def orphaned(evidence: Evidence, heartbeat_timeout: float | None, now: float) -> str | None:
    """Why the run is an orphan to adopt, or None to leave it alone (pure)."""
    record = evidence.record
    if record is None or record.current_attempt is None or heartbeat_timeout is None:
        return None  # nothing open, or no heartbeat to tell a live driver by
    beat = evidence.beat
    if beat is not None and now - beat.renewed_at < heartbeat_timeout:
        return None  # a worker drives it
    status = evidence.status
    if status is None or not status.ended:
        return None  # the lease runs (or is unknown yet): the node's watcher ends it
    age = "no heartbeat" if beat is None else f"heartbeat {now - beat.renewed_at:.0f} s old"
    return (f"attempt {record.current_attempt.number} is open, its lease "
            f"{record.current_attempt.lease_id} has ended and no worker drives it ({age})")


def gather(checkpoint_uri: str, stores, heartbeat_timeout: float, now: float,
           read_record: Callable[[], JobRecord | None], provider) -> Evidence:
    """The job's heartbeat and, only when it is stale, its record and its open attempt's
    lease status (blocking I/O: run in a thread). A run some worker drives costs one read."""
    beat = Heartbeat(stores(checkpoint_uri)).read()
    if beat is not None and now - beat.renewed_at < heartbeat_timeout:
        return Evidence(None, beat, None)
    record = read_record()
    running = record.current_attempt if record is not None else None
    lease = running.lease_of(record.job_id) if running is not None else None
    if lease is None:
        return Evidence(record, beat, None)
    return Evidence(record, beat, provider.observe([lease]).get(lease.lease_id))


def next_look(evidence: Evidence, heartbeat_timeout: float, now: float) -> float:
    """When this run is next worth a look: not before its heartbeat could have gone stale."""
    if evidence.beat is not None and now - evidence.beat.renewed_at < heartbeat_timeout:
        return evidence.beat.renewed_at + heartbeat_timeout
    return now
