"""A job's record in the Prefect UI: a table of attempts and a markdown summary."""

from __future__ import annotations

import json
from typing import Any

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


def record_key(run_id: Any) -> str:
    """The artifact key under which a flow run's or task run's JobRecord is kept.

    An artifact, not a Variable: a variable's value has a size cap that a long job's
    record (one entry per attempt) outgrows; each save is a new version of the key, and
    the latest version is the record."""
    return f"spot-record-{str(run_id).lower()}"


def save_record(key: str, record: JobRecord, *, flow_run_id: Any = None,
                task_run_id: Any = None) -> None:
    """Write ``record`` as the newest version of ``key`` (before anything acts on it)."""
    from prefect import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    artifact = ArtifactCreate(key=key, type=RECORD_TYPE, data=record.to_dict(),
                              description=f"JobRecord of spot job {record.job_id}",
                              flow_run_id=flow_run_id, task_run_id=task_run_id)
    with get_client(sync_client=True) as client:
        client.create_artifact(artifact)


def load_record(key: str) -> JobRecord | None:
    """The newest record saved under ``key``, or None if the job has none yet."""
    from prefect import get_client
    from prefect.client.schemas.filters import (ArtifactCollectionFilter,
                                                ArtifactCollectionFilterKey)

    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(artifact_filter=ArtifactCollectionFilter(
            key=ArtifactCollectionFilterKey(any_=[key])), limit=1)
    if not found or found[0].data is None:
        return None
    data = found[0].data
    return JobRecord.from_dict(json.loads(data) if isinstance(data, str) else data)
