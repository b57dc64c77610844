"""A job in the Prefect UI: a progress artifact updated as its attempts start and end,
and at the end a table of attempts, a markdown summary and a chart (the attempt timeline
and cost against on-demand, SVG images inlined as data URIs, so the UI needs no other
server). All keyed by the job (``spot-job-<job id>``, ``-summary``, ``-chart``,
``-progress``); the JobRecord itself is kept under ``spot-record-<run id>``.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any

from prefect_spot._jobs import slug
from spot_core.attempt_env import clip
from spot_core.charts import attempt_timeline, cost_chart
from spot_core.charts.clock import clock_of, money, saving
from spot_core.errors import SpotError
from spot_core.model import JobRecord
from spot_core.report import attempt_line, progress_percent, saving_line
from spot_core.report.rows import resume_words, resumes

log = logging.getLogger(__name__)


def attempts_table(record: JobRecord) -> list[dict[str, Any]]:
    """One row per attempt, headed in words, every number rounded as the Spot tab shows
    it and every duration in the record's clock and one unit (named in the heading)."""
    clock = clock_of([record])
    unit = clock.unit
    rows = []
    for a in record.attempts:
        resumed_in = record.time_to_resume(a)
        rows.append(
            {
                "attempt": a.number,
                "pool": f"{a.pool.cloud}/{a.pool.zone}/{a.pool.instance_type}",
                "market": str(a.pool.market),
                "outcome": "running" if a.outcome is None else str(a.outcome),
                "resumed from step": _dash(a.checkpoint_step_start),
                f"time to resume ({unit})": "-"
                if resumed_in is None
                else clock.number(clock.capacity(resumed_in, record.time_scale)),
                "last checkpoint step": _dash(a.checkpoint_step_end),
                "cost": money(a.cost),
                "on-demand cost": money(a.on_demand_cost),
                f"lost work ({unit})": clock.number(a.lost_work_seconds),
                "message": a.message if len(a.message) <= 160 else a.message[:159] + "\u2026",
            }
        )
    return rows


def _dash(step: int | None) -> int | str:
    return "-" if step is None else step


def summary_markdown(record: JobRecord) -> str:
    """The job's counts and money as a two-column table headed in words; the resumes
    and their times are one list (their counts agree); the last line names the clock."""
    s, ledger, clock = record.summary(), record.ledger, clock_of([record])
    return "\n".join(
        [
            f"### Spot job `{record.job_id}`: {s['status']}",
            "",
            "| figure | value |",
            "|---|---|",
            f"| attempts | {s['attempts']} |",
            f"| preemptions | {s['preemptions']} |",
            *([f"| voluntary disruptions | {record.disruptions} |"] if record.disruptions else []),
            f"| fallbacks to on-demand | {s['fallbacks']} |",
            f"| resumed ({len(resumes(record))}) | {resume_words(record, clock)} |",
            f"| spot cost | {money(ledger.spent)} |",
            f"| on-demand equivalent | {money(ledger.on_demand_equivalent)} |",
            f"| saved | {saving(record, verb=False)} |",
            f"| lost work | {clock.duration(ledger.lost_work_seconds)} |",
            f"| checkpoint overhead | {clock.duration(ledger.checkpoint_overhead_seconds)} |",
            "",
            clock.sentence(),
        ]
    )


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")


def chart_markdown(record: JobRecord) -> str:
    """The attempt timeline and the cost chart as markdown images (no remote URL)."""
    return "\n".join(
        [
            f"### Spot job `{record.job_id}`",
            "",
            clock_of([record]).sentence(),
            "",
            f"![Attempt timeline]({svg_data_uri(attempt_timeline(record))})",
            "",
            f"![Cost against on-demand]({svg_data_uri(cost_chart(record))})",
        ]
    )


def artifact_key(record: JobRecord) -> str:
    return f"spot-job-{slug(record.job_id, 60)}"


def publish(
    record: JobRecord, *, flow_run_id: Any = None, task_run_id: Any = None, what: str | None = None
) -> list[Any]:
    """Create the table, summary and chart artifacts of ``record`` on the given run (the
    UI's view: a failure is logged, never raised into the job)."""
    from prefect import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    key, what = artifact_key(record), what or f"spot job {record.job_id}"
    wanted = [
        ("table", key, json.dumps(attempts_table(record), allow_nan=False), f"Attempts of {what}"),
        ("markdown", f"{key}-summary", summary_markdown(record), f"Cost and recovery of {what}"),
        ("markdown", f"{key}-chart", chart_markdown(record), f"Attempts and cost of {what}"),
    ]
    created = []
    with get_client(sync_client=True) as client:
        for kind, name, data, description in wanted:
            try:
                created.append(
                    client.create_artifact(
                        ArtifactCreate(
                            key=name,
                            type=kind,
                            data=data,
                            description=description,
                            flow_run_id=flow_run_id,
                            task_run_id=task_run_id,
                        )
                    )
                )
            except Exception:  # noqa: BLE001 - the UI view must not fail the run
                log.warning("could not create artifact %s", name, exc_info=True)
    return created


class JobProgress:
    """The job's progress artifact (``spot-job-<job id>-progress``), as a controller
    listener: created at the first transition this process sees (or found by its key,
    when another worker process ran the earlier attempts) and updated at every one.

    The percentage is the last durable checkpoint's share of ``total_steps`` (100 once
    the job succeeded; 0 while the job's length is unknown); the description says which
    attempt runs where and what the job has saved so far."""

    def __init__(
        self, *, flow_run_id: Any = None, task_run_id: Any = None, total_steps: int | None = None
    ) -> None:
        self.flow_run_id, self.task_run_id = flow_run_id, task_run_id
        self.total_steps = total_steps
        self.artifact_id: Any = None

    def __call__(self, kind: str, record: JobRecord, detail: str = "") -> None:
        try:
            self._show(record)
        except Exception:  # noqa: BLE001 - as for every UI view
            log.warning(
                "could not update the progress artifact of %s", record.job_id, exc_info=True
            )

    def _show(self, record: JobRecord) -> None:
        from prefect import get_client
        from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate

        progress = progress_percent(record, self.total_steps)
        description = f"{attempt_line(record, time.time())}; {saving_line(record)}"
        key = f"{artifact_key(record)}-progress"
        with get_client(sync_client=True) as client:
            if self.artifact_id is None:
                self.artifact_id = _latest_id(client, key)
            if self.artifact_id is None:
                self.artifact_id = client.create_artifact(
                    ArtifactCreate(
                        key=key,
                        type="progress",
                        data=progress,
                        description=description,
                        flow_run_id=self.flow_run_id,
                        task_run_id=self.task_run_id,
                    )
                ).id
            else:
                client.update_artifact(
                    self.artifact_id, ArtifactUpdate(data=progress, description=description)
                )


def _latest_id(client, key: str) -> Any:
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey

    found = client.read_latest_artifacts(
        artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=[key])),
        limit=1,
    )
    return found[0].latest_id if found else None


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


def save_record(
    key: str, record: JobRecord, *, flow_run_id: Any = None, task_run_id: Any = None
) -> None:
    """Write ``record`` as the newest version of ``key`` (before anything acts on it).

    Raises RecordNotSaved (one line naming the fix) if Prefect does not take it."""
    from prefect import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    artifact = ArtifactCreate(
        key=key,
        type=RECORD_TYPE,
        data=record.to_dict(),
        description=f"JobRecord of spot job {record.job_id}",
        flow_run_id=flow_run_id,
        task_run_id=task_run_id,
    )
    try:
        with get_client(sync_client=True) as client:
            client.create_artifact(artifact)
    except Exception as exc:  # noqa: BLE001 - any failure means the record is not kept
        raise RecordNotSaved(
            f"could not save the JobRecord of spot job {record.job_id} to Prefect (artifact "
            f"{key!r}): {type(exc).__name__}: {str(exc)[:200]}; the job stops rather than "
            "act on an unsaved record: check that the Prefect API (PREFECT_API_URL) is "
            "reachable and run it again"
        ) from exc


def load_record(key: str) -> JobRecord | None:
    """The newest record saved under ``key``, or None if the job has none yet.

    A damaged one (not JSON, not a record, edited by hand) is CorruptRecord."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=[key])),
            limit=1,
        )
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
        reason = clip(str(exc).split(";")[0], 160)
        raise CorruptRecord(
            f"the JobRecord in Prefect artifact {key!r} is damaged ({reason}); the job does "
            f"not restart its budgets from nothing: run `prefect artifact delete {key}` to "
            "start it afresh"
        ) from None
