"""A job's record in the Prefect UI: a table of attempts and a markdown summary."""

from __future__ import annotations

import json
from typing import Any

from spot_core.errors import SpotError
from spot_core.model import JobRecord

from prefect_spot._jobs import slug


def attempts_table(record: JobRecord) -> list[dict[str, Any]]:
    """One row per attempt: pool, market, outcome, cost, resumed-from step."""
    return [{
        "attempt": a.number,
        "pool": f"{a.pool.cloud}/{a.pool.zone}/{a.pool.instance_type}",
        "market": str(a.pool.market),
        "outcome": "running" if a.outcome is None else str(a.outcome),
        "resumed_from_step": a.checkpoint_step_start,
        "last_checkpoint_step": a.checkpoint_step_end,
        "cost_usd": round(a.cost, 4),
        "on_demand_usd": round(a.on_demand_cost, 4),
        "lost_work_seconds": round(a.lost_work_seconds, 1),
        "message": a.message[:120],
    } for a in record.attempts]


def summary_markdown(record: JobRecord) -> str:
    s = record.summary()
    return "\n".join([
        f"### Spot job `{record.job_id}`: {s['status']}",
        "",
        "| | |",
        "|---|---|",
        f"| attempts | {s['attempts']} |",
        f"| preemptions | {s['preemptions']} |",
        f"| fallbacks to on-demand | {s['fallbacks']} |",
        f"| resumed from steps | {s['resumed_from_steps']} |",
        f"| spot cost | ${s['spot_cost']:.4f} |",
        f"| on-demand equivalent | ${s['on_demand_cost']:.4f} |",
        f"| saved | ${s['saved']:.4f} ({s['savings_fraction']:.0%}) |",
        f"| lost work | {s['lost_work_seconds'] / 3600:.3f} h |",
        f"| checkpoint overhead | {s['checkpoint_overhead_seconds'] / 3600:.3f} h |",
    ])


def artifact_key(record: JobRecord) -> str:
    return f"spot-job-{slug(record.job_id, 60)}"


def publish(record: JobRecord) -> tuple[Any, Any]:
    """Create the table and markdown artifacts (in the current run's context, if any)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    key = artifact_key(record)
    table = create_table_artifact(table=attempts_table(record), key=key,
                                  description=f"Attempts of spot job {record.job_id}")
    summary = create_markdown_artifact(markdown=summary_markdown(record), key=f"{key}-summary",
                                       description=f"Cost and recovery of {record.job_id}")
    return table, summary


# -- the JobRecord itself, kept in Prefect -----------------------------------------------------
RECORD_TYPE = "spot-record"


class RecordNotSaved(SpotError):
    """The JobRecord could not be written to Prefect: the driver stops instead of acting
    on a record no other process can see (which would restart the budgets there)."""

    retryable = True


class CorruptRecord(SpotError):
    """The record read back from Prefect is damaged: one clear error, never a fresh
    start, which would silently reset the job's preemption and retry budgets."""


def record_key(run_id: Any) -> str:
    """The artifact key under which a flow run's or task run's JobRecord is kept.

    An artifact, not a Variable: a variable's value has a size cap that a long job's
    record (one entry per attempt) outgrows; each save is a new version of the key, and
    the latest version is the record."""
    return f"spot-record-{str(run_id).lower()}"


def save_record(key: str, record: JobRecord, *, flow_run_id: Any = None,
                task_run_id: Any = None) -> None:
    """Write ``record`` as the newest version of ``key`` (before anything acts on it).

    Raises RecordNotSaved (one line naming the fix) if Prefect does not take it."""
    from prefect import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    artifact = ArtifactCreate(key=key, type=RECORD_TYPE, data=record.to_dict(),
                              description=f"JobRecord of spot job {record.job_id}",
                              flow_run_id=flow_run_id, task_run_id=task_run_id)
    try:
        with get_client(sync_client=True) as client:
            client.create_artifact(artifact)
    except Exception as exc:  # noqa: BLE001 - any failure means the record is not kept
        raise RecordNotSaved(
            f"could not save the JobRecord of spot job {record.job_id} to Prefect (artifact "
            f"{key!r}): {type(exc).__name__}: {str(exc)[:200]}; the job stops rather than "
            "act on an unsaved record: check that the Prefect API (PREFECT_API_URL) is "
            "reachable and run it again") from exc


def load_record(key: str) -> JobRecord | None:
    """The newest record saved under ``key``, or None if the job has none yet.

    A damaged one (not JSON, not a record, edited by hand) is CorruptRecord."""
    from prefect import get_client
    from prefect.client.schemas.filters import (ArtifactCollectionFilter,
                                                ArtifactCollectionFilterKey)

    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(artifact_filter=ArtifactCollectionFilter(
            key=ArtifactCollectionFilterKey(any_=[key])), limit=1)
    if not found or found[0].data is None:
        return None
    return parse_record(key, found[0].data)


def parse_record(key: str, data: Any) -> JobRecord:
    """``data`` (an artifact's JSON or its text) as a JobRecord, or CorruptRecord."""
    try:
        if isinstance(data, (str, bytes)):
            data = json.loads(data)
        if not isinstance(data, dict):
            raise ValueError(f"a {type(data).__name__}, not an object")
        return JobRecord.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        reason = str(exc).split(";")[0][:160]
        raise CorruptRecord(
            f"the JobRecord in Prefect artifact {key!r} is damaged ({reason}); the job does "
            f"not restart its budgets from nothing: run `prefect artifact delete {key}` to "
            "start it afresh") from None
