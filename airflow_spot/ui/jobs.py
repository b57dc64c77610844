"""The spot jobs Airflow knows, read from Airflow's own records in the API server's session.

The JobRecord lives where ``airflow_spot/records.py`` writes it: the task state store
(``spot_job_record`` for ``SpotJobOperator``, ``spot_task_record`` for ``@task.spot``),
written before anything acts on it, so it is the newest; ``SpotJobOperator`` also pushes
the whole record to XCom at the end, which is read when the state store row is gone
(expired by ``[state_store] default_retention_days``). No side database. Callers pass
the DAG ids the user may read; nothing outside them is ever selected.

One thing is newer in the job's checkpoint store than in the task state store: a
deferred task's trigger keeps its record in memory until its one event, so the
replacement it launched on an interruption notice (a handover) is written only to the
store (``handover/attempt-N-replacement.json``, what a restarted trigger reads back).
``with_handover`` reads that one object for the Spot tab of a deferred task.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow.models.task_state_store import TaskStateStoreModel
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_spot.records import JOB_RECORD_KEY, RECORD_KEYS
from spot_core.checkpoint import open_store
from spot_core.checkpoint.handover import read_launched
from spot_core.checkpoint.uri import parse_store_uri
from spot_core.errors import ConfigError
from spot_core.model import JobRecord

log = logging.getLogger(__name__)

MAX_JOBS = 500  # newest first; the page says when it shows only these
ACTIVE_STATES = (
    "running",
    "deferred",
    "queued",
    "scheduled",
    "up_for_reschedule",
    "up_for_retry",
    "restarting",
)


@dataclass(frozen=True)
class SpotJob:
    """One spot task instance and its JobRecord."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    record: JobRecord
    source: str  # "task state store" or "xcom"
    state: str | None  # the task instance's state
    updated_at: datetime | None

    @property
    def running(self) -> bool:
        """A job whose task is live and whose record has an attempt on a lease now."""
        return self.state in ACTIVE_STATES and self.record.current_attempt is not None


# A task instance: (dag_id, run_id, task_id, map_index).
TaskKey = tuple[str, str, str, int]


@dataclass(frozen=True)
class Where:
    """Which task instances to read, inside the DAG ids the user may read."""

    dag_ids: frozenset[str]
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None

    def apply(self, statement, model):
        statement = statement.where(model.dag_id.in_(sorted(self.dag_ids)))
        for name in ("dag_id", "run_id", "task_id", "map_index"):
            value = getattr(self, name)
            if value is not None:
                statement = statement.where(getattr(model, name) == value)
        return statement


def load_jobs(session: Session, where: Where, limit: int = MAX_JOBS) -> tuple[list[SpotJob], int]:
    """The jobs ``where`` selects, newest first, and how many records could not be read."""
    if not where.dag_ids:
        return [], 0
    rows: dict[TaskKey, tuple[Any, str, datetime | None]] = {}
    stored = where.apply(
        select(
            TaskStateStoreModel.dag_id,
            TaskStateStoreModel.run_id,
            TaskStateStoreModel.task_id,
            TaskStateStoreModel.map_index,
            TaskStateStoreModel.value,
            TaskStateStoreModel.updated_at,
        ).where(TaskStateStoreModel.key.in_(RECORD_KEYS)),
        TaskStateStoreModel,
    )
    for dag_id, run_id, task_id, map_index, value, updated in session.execute(
        stored.order_by(TaskStateStoreModel.updated_at.desc()).limit(limit)
    ):
        rows[(dag_id, run_id, task_id, map_index)] = (value, "task state store", updated)
    pushed = where.apply(
        select(
            XComModel.dag_id,
            XComModel.run_id,
            XComModel.task_id,
            XComModel.map_index,
            XComModel.value,
            XComModel.timestamp,
        ).where(XComModel.key == JOB_RECORD_KEY),
        XComModel,
    )
    for dag_id, run_id, task_id, map_index, value, updated in session.execute(
        pushed.order_by(XComModel.timestamp.desc()).limit(limit)
    ):
        rows.setdefault((dag_id, run_id, task_id, map_index), (value, "xcom", updated))
    states = _states(session, where, rows)
    jobs, unreadable = [], 0
    for key, (value, source, updated) in rows.items():
        record = _record(value)
        if record is None:
            unreadable += 1
            continue
        jobs.append(
            SpotJob(*key, record=record, source=source, state=states.get(key), updated_at=updated)
        )
    jobs.sort(key=lambda job: job.record.created_at, reverse=True)
    return jobs[:limit], unreadable


def _states(session: Session, where: Where, keys: Iterable[TaskKey]) -> dict[TaskKey, str | None]:
    """The task instances' states, for the jobs found (one query)."""
    keys = set(keys)
    if not keys:
        return {}
    statement = where.apply(
        select(
            TaskInstance.dag_id,
            TaskInstance.run_id,
            TaskInstance.task_id,
            TaskInstance.map_index,
            TaskInstance.state,
        ),
        TaskInstance,
    )
    statement = statement.where(TaskInstance.run_id.in_(sorted({k[1] for k in keys})))
    return {
        (d, r, t, m): (None if s is None else str(s))
        for d, r, t, m, s in session.execute(statement)
        if (d, r, t, m) in keys
    }


def with_handover(job: SpotJob) -> SpotJob:
    """``job`` with the replacement its trigger launched on a notice, read from the job's
    store while the task is deferred (its record in the task state store is the one it
    deferred with). Unchanged when there is none, or when the store cannot be read here
    (a file store not on this machine is never created; an unreachable one is logged)."""
    running = job.record.current_attempt
    uri = job.record.checkpoint_uri
    if job.state != "deferred" or running is None or running.replacement is not None or not uri:
        return job
    try:
        location = parse_store_uri(uri)
        if location.scheme == "file" and not os.path.isdir(location.path):
            return job
        launched = read_launched(open_store(uri), running.number)
    except Exception as exc:  # noqa: BLE001 - the tab shows the stored record anyway
        log.warning("job %s: cannot read its handover from %s: %s", job.record.job_id, uri, exc)
        return job
    if launched is None:
        return job
    return dataclasses.replace(
        job,
        record=job.record.with_running(replacement=launched),
        source=f"{job.source}, the handover from the job's store",
    )


def load_queue(session: Session, dag_id: str, run_id: str) -> dict | None:
    """The run's batch work queue, if a task published one: its progress, read live."""
    from airflow_spot.queues import WORK_QUEUE_KEY, queue_progress

    value = session.scalar(
        select(XComModel.value)
        .where(XComModel.key == WORK_QUEUE_KEY)
        .where(XComModel.dag_id == dag_id, XComModel.run_id == run_id)
        .limit(1)
    )
    uri = value  # the JSON column gives the string back; a JSON text of it on some backends
    if isinstance(uri, (str, bytes)) and uri[:1] in ('"', b'"'):
        try:
            uri = json.loads(uri)
        except ValueError:
            return None
    return queue_progress(uri) if isinstance(uri, str) else None


def _record(value: Any) -> JobRecord | None:
    """The record a row holds (the state store keeps JSON text, XCom a JSON value)."""
    try:
        data = json.loads(value) if isinstance(value, (str, bytes)) else value
        data = json.loads(data) if isinstance(data, str) else data
        return JobRecord.from_dict(data)
    except (ConfigError, ValueError, TypeError):
        return None
