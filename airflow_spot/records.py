"""The JobRecord in the task state store: written before anything acts on it, read back
strictly. Shared by ``SpotJobOperator`` and ``@task.spot`` (each under its own key).

The persist callback is also the one place that sees an attempt end, whichever process
closed it (worker, or triggerer then ``execute_complete``): it compares the record it
writes with the one it replaces, and for each attempt that finished in between emits the
Airflow metrics (``airflow_spot.metrics``) and calls ``on_attempt_end`` (alerts), once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from spot_core.errors import ConfigError
from spot_core.model import Attempt, JobRecord

# The task state store keys (also read by the Spot UI, airflow_spot/ui/jobs.py).
JOB_RECORD_KEY = "spot_job_record"  # SpotJobOperator (also its XCom with the full record)
TASK_RECORD_KEY = "spot_task_record"  # @task.spot (its XCom holds the summary)
RECORD_KEYS = (JOB_RECORD_KEY, TASK_RECORD_KEY)

log = logging.getLogger(__name__)
AttemptEnd = Callable[[JobRecord, Attempt], None]


def persister(
    context, key: str, on_attempt_end: AttemptEnd | None = None
) -> Callable[[JobRecord], None]:
    """A controller ``persist`` callback that writes the record under ``key``, then reports
    each attempt that ended since the stored record (metrics, ``on_attempt_end``)."""
    store = context.get("task_state_store")
    ti = context.get("ti")

    def persist(record: JobRecord) -> None:
        if store is None:
            return
        before = store.get(key)
        store.set(key, record.to_dict())
        for attempt in newly_finished(before, record):
            _report_attempt_end(ti, record, attempt, on_attempt_end)

    return persist


def newly_finished(before: Any, after: JobRecord) -> list[Attempt]:
    """Attempts finished in ``after`` but not in ``before`` (a stored dict, or None)."""
    try:
        earlier = None if before is None else JobRecord.from_dict(before)
    except ConfigError:
        earlier = None  # unreadable: stored_record refuses it before anything persists
    done = set() if earlier is None else {a.number for a in earlier.attempts if a.finished}
    return [a for a in after.attempts if a.finished and a.number not in done]


def _report_attempt_end(
    ti, record: JobRecord, attempt: Attempt, on_attempt_end: AttemptEnd | None
) -> None:
    """Metrics and the callback; neither may fail the task (the record is already written)."""
    from airflow_spot.metrics import emit_attempt_end

    try:
        emit_attempt_end(
            record, attempt, dag_id=getattr(ti, "dag_id", ""), task_id=getattr(ti, "task_id", "")
        )
    except Exception:  # noqa: BLE001 - a metrics backend outage must not fail the job
        log.warning("spot metrics for attempt %d were not emitted", attempt.number, exc_info=True)
    if on_attempt_end is not None:
        try:
            on_attempt_end(record, attempt)
        except Exception:  # noqa: BLE001 - a user's alert callback must not fail the job
            log.warning("on_attempt_end for attempt %d raised", attempt.number, exc_info=True)


def stored_record(context, key: str, task_id: str) -> JobRecord | None:
    """The record an earlier run left under ``key``, if any. One that cannot be read
    (another schema version, truncated, NaN, not a record) fails the task without retries
    and is left as it is: nothing overwrites it, nothing launches."""
    store = context.get("task_state_store")
    stored = None if store is None else store.get(key)
    if stored is None:
        return None
    try:
        return JobRecord.from_dict(stored)
    except ConfigError as exc:
        raise AirflowFailException(
            f"{task_id}: the JobRecord in the task state store (key {key!r}) cannot be read: "
            f"{exc}. Upgrade spot-pipelines if it is newer, or delete the key (REST API: "
            f"DELETE .../taskInstances/{{task_id}}/state-store/{key}) to start the job afresh "
            "from its newest checkpoint"
        ) from None
