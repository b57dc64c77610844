"""The JobRecord in the task state store: written before anything acts on it, read back
strictly. Shared by ``SpotJobOperator`` and ``@task.spot`` (each under its own key)."""

from __future__ import annotations

from typing import Callable

from airflow.sdk.exceptions import AirflowFailException

from spot_core.errors import ConfigError
from spot_core.model import JobRecord


def persister(context, key: str) -> Callable[[JobRecord], None]:
    """A controller ``persist`` callback that writes the record under ``key``."""
    store = context.get("task_state_store")

    def persist(record: JobRecord) -> None:
        if store is not None:
            store.set(key, record.to_dict())

    return persist


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
            "from its newest checkpoint") from None
