"""The Spot tab and the Spot jobs page as HTML: tables plus the SVG charts of
``spot_core.charts`` (the same pictures as ``spot-pipelines report``), inline CSS, no
script and nothing fetched from elsewhere. Everything taken from a record is escaped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape

from airflow_spot.ui.jobs import SpotJob
from spot_core.charts import attempt_timeline, cost_chart, lost_work_chart, savings_over_time
from spot_core.errors import ConfigError
from spot_core.fleet import day_of, pool_figures, savings_by
from spot_core.model import Attempt, JobRecord, Lease

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px;color:#212121}
h1{font-size:18px;margin:0 0 8px}h2{font-size:15px;margin:20px 0 6px}
table{border-collapse:collapse;margin:6px 0 14px;font-size:13px}
th,td{border:1px solid #e0e0e0;padding:3px 8px;vertical-align:top}th{background:#f5f5f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}p.note{color:#616161;font-size:12px}
figure{margin:0 0 16px}table.attempts td{white-space:nowrap}
table.attempts td:last-child{white-space:normal;min-width:16em;max-width:26em;
overflow-wrap:anywhere}
"""
MESSAGE_CHARS = 240  # an attempt's message in the table (the chart's tooltip has it too)
# Inside Airflow's iframe: no script, nothing from elsewhere, inline styles only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
ATTEMPT_COLUMNS = (
    "#",
    "pool",
    "market",
    "outcome",
    "started (UTC)",
    "ended (UTC)",
    "notice (UTC)",
    "resumed from step",
    "time to resume s",
    "last checkpoint",
    "cost $",
    "on-demand $",
    "lost work s",
    "ckpt overhead s",
    "data transfer $",
    "message",
)


def page(title: str, body: Iterable[str]) -> str:
    return "".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
            f"<h1>{escape(title)}</h1>",
            *body,
            "</body></html>\n",
        ]
    )


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def table(
    headings: Sequence[str],
    rows: Iterable[Sequence[object]],
    css: str,
    row_class: str | Sequence[str] = "",
) -> str:
    """A table; cells that look like numbers are right-aligned. Cells are escaped here.
    ``row_class``: every row's class, or one per row."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headings)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(f"<td{_num(c)}>{escape(str(c))}</td>" for c in row)
        css_class = row_class if isinstance(row_class, str) else row_class[i]
        body.append(f'<tr class="{escape(css_class)}">{cells}</tr>')
    return (
        f'<table class="{escape(css)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _num(cell: object) -> str:
    text = str(cell).lstrip("$-").replace(".", "", 1).replace("%", "")
    return ' class="num"' if text.isdigit() else ""


# -- the Spot tab of one task instance -------------------------------------------------------
def task_tab(
    job: SpotJob | None,
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int,
    now: float,
    queue: dict | None = None,
) -> str:
    where = f"{dag_id} / {run_id} / {task_id}" + ("" if map_index < 0 else f" [{map_index}]")
    if job is None:
        return page(
            f"Spot: {where}",
            [
                *queue_section(queue),
                '<p class="empty">This task instance has no spot job '
                "record: it is not a spot task, or it has not started.</p>",
            ],
        )
    record = job.record
    return page(
        f"Spot job {record.job_id}",
        [
            f'<p class="where">{escape(where)}: task {escape(job.state or "-")}, job '
            f"{escape(str(record.status))} (from the {escape(job.source)})</p>",
            *queue_section(queue),
            ledger_table(record),
            "<h2>Attempts</h2>",
            attempts_table(record),
            *(
                f"<figure>{svg}</figure>"
                for svg in (
                    attempt_timeline(record, now=now),
                    cost_chart(record),
                    lost_work_chart(record),
                )
            ),
        ],
    )


def queue_section(queue: dict | None) -> list[str]:
    """The run's batch work queue: units done, claimed, pending, failed (docs/batch.md)."""
    if queue is None:
        return []
    head = f'<h2>Work queue</h2><p class="where">{escape(str(queue["uri"]))}</p>'
    if "error" in queue:
        return [head, f'<p class="empty">unreadable here: {escape(str(queue["error"]))}</p>']
    names = ("total", "done", "claimed", "pending", "failed", "lapsed", "reclaims")
    return [head, table(names, [tuple(str(queue[n]) for n in names)], "queue")]


def ledger_table(record: JobRecord) -> str:
    s, ledger = record.summary(), record.ledger
    rows = [
        ("attempts", s["attempts"]),
        ("preemptions", s["preemptions"]),
        ("fallbacks to on-demand", s["fallbacks"]),
        ("resumed from steps", ", ".join(map(str, s["resumed_from_steps"])) or "-"),
        (
            "time to resume",
            ", ".join(f"{t:.1f} s" for t in s["time_to_resume_seconds"]) or "-",
        ),
        ("spot cost", f"${ledger.spent:.4f}"),
        ("on-demand equivalent", f"${ledger.on_demand_equivalent:.4f}"),
        ("saved", f"${ledger.saved:.4f} ({ledger.savings_fraction:.0%})"),
        ("lost work", f"{ledger.lost_work_seconds:.1f} s"),
        ("checkpoint overhead", f"{ledger.checkpoint_overhead_seconds:.1f} s"),
        ("data transfer", f"${ledger.data_transfer_cost:.4f}"),
        (
            "latest checkpoint step",
            "-" if s["latest_checkpoint_step"] is None else s["latest_checkpoint_step"],
        ),
    ]
    return table(("", "this job"), rows, "ledger")


def attempts_table(record: JobRecord) -> str:
    """The attempt timeline as a table: one row per attempt, and one for the replacement
    launched on the running attempt's notice while it hands over (not an attempt yet)."""
    rows = [_attempt_cells(a, record.time_to_resume(a)) for a in record.attempts]
    classes = ["attempt-row"] * len(rows)
    handing_over = (
        None if record.current_attempt is None else _replacement_cells(record.current_attempt)
    )
    if handing_over is not None:
        rows.append(handing_over)
        classes.append("handover-row")
    return table(ATTEMPT_COLUMNS, rows, "attempts", classes)


def _attempt_cells(a: Attempt, resumed_in: float | None = None) -> tuple[str, ...]:
    return (
        str(a.number),
        f"{a.pool.zone} {a.pool.instance_type}",
        str(a.pool.market),
        "running" if a.outcome is None else str(a.outcome),
        when(a.started_at),
        when(a.ended_at),
        when(a.notice_at),
        _dash(a.checkpoint_step_start),
        "-" if resumed_in is None else f"{resumed_in:.1f}",
        _dash(a.checkpoint_step_end),
        f"{a.cost:.4f}",
        f"{a.on_demand_cost:.4f}",
        f"{a.lost_work_seconds:.1f}",
        f"{a.checkpoint_overhead_seconds:.1f}",
        f"{a.data_transfer_cost:.4f}",
        _shorten(a.message),
    )


def _replacement_cells(running: Attempt) -> tuple[str, ...] | None:
    """The replacement ``running`` launched on its notice and not yet adopted: where, since
    when, and that it takes over once ``running`` has saved its emergency checkpoint or
    ended. None without one (or one that cannot be read: the tab still renders)."""
    replacement = running.replacement or {}
    if replacement.get("state") != "launched":
        return None
    try:
        pool = Lease.from_dict(replacement["lease"]).pool
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError):
        return None
    launched_at = replacement.get("launched_at")
    return (
        str(replacement.get("attempt", "-")),
        f"{pool.zone} {pool.instance_type}",
        str(pool.market),
        "handing over",
        when(launched_at if isinstance(launched_at, (int, float)) else None),
        *("-" for _ in ATTEMPT_COLUMNS[5:-1]),
        _shorten(
            f"launched on attempt {running.number}'s interruption notice; it resumes from "
            f"attempt {running.number}'s emergency checkpoint once that is saved or "
            f"attempt {running.number} has ended. {replacement.get('reason', '')}".strip()
        ),
    )


def _shorten(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "\u2026"


def _dash(value) -> str:
    return "-" if value is None else str(value)


# -- the Spot jobs page --------------------------------------------------------------------
def jobs_page(jobs: list[SpotJob], *, unreadable: int, limit: int, now: float) -> str:
    body = [
        f'<p class="note">{len(jobs)} spot job(s) in the DAGs you may read'
        + (f" (the newest {limit})" if len(jobs) >= limit else "")
        + (f"; {unreadable} record(s) could not be read" if unreadable else "")
        + ".</p>"
    ]
    body += ["<h2>Running now</h2>", running_table(jobs, now)]
    body += [
        "<h2>Savings per DAG and task</h2>",
        savings_table(jobs, by_day=False),
        f"<figure>{savings_over_time((f'{j.dag_id}.{j.task_id}', j.record) for j in jobs)}"
        "</figure>",
        "<h2>Savings per day</h2>",
        savings_table(jobs, by_day=True),
    ]
    body += ["<h2>Pools</h2>", pools_table(jobs)]
    body += ["<h2>Jobs</h2>", jobs_table(jobs)]
    return page("Spot jobs", body)


def running_table(jobs: list[SpotJob], now: float) -> str:
    rows = []
    for job in jobs:
        attempt = job.record.current_attempt
        if not job.running or attempt is None:  # a running job has a current attempt
            continue
        lease = attempt.lease or {}
        rows.append(
            (
                job.dag_id,
                job.run_id,
                job.task_id,
                job.state,
                attempt.number,
                attempt.lease_id or "-",
                attempt.pool.key,
                f"${float(lease.get('price_per_hour', 0.0)):.4f}/h",
                f"{max(0.0, now - attempt.started_at):.0f}",
                f"${job.record.ledger.spent:.4f}",
            )
        )
    if not rows:
        return '<p class="empty running">No spot job is running now.</p>'
    return table(
        (
            "DAG",
            "run",
            "task",
            "state",
            "attempt",
            "lease",
            "pool",
            "lease price",
            "running s",
            "spent so far",
        ),
        rows,
        "running",
        "running-row",
    )


def savings_table(jobs: list[SpotJob], *, by_day: bool) -> str:
    keyed = (
        (
            (j.dag_id, j.task_id, day_of(j.record.created_at)) if by_day else (j.dag_id, j.task_id),
            j.record,
        )
        for j in jobs
    )
    rows = [
        (
            *s.group,
            s.jobs,
            s.preemptions,
            f"${s.spent:.4f}",
            f"${s.on_demand_equivalent:.4f}",
            f"${s.saved:.4f}",
            f"{s.savings_fraction:.0%}",
            f"{s.lost_work_seconds:.1f}",
        )
        for s in savings_by(keyed)
    ]
    headings = (
        ("DAG", "task")
        + (("day (UTC)",) if by_day else ())
        + (
            "jobs",
            "preemptions",
            "spent",
            "on-demand equivalent",
            "saved",
            "saved %",
            "lost work s",
        )
    )
    return table(headings, rows, "savings-by-day" if by_day else "savings")


def pools_table(jobs: list[SpotJob]) -> str:
    figures = pool_figures(j.record for j in jobs)
    if not figures:
        return '<p class="empty">No attempt has run on spot yet.</p>'
    rows = [
        (
            f.pool,
            f.attempts,
            f.interruptions,
            f"{f.spot_hours:.3f}",
            "-" if f.interruptions_per_hour is None else f"{f.interruptions_per_hour:.2f}",
            f"{f.lost_work_seconds:.1f}",
            "-" if f.last_price_per_hour is None else f"${f.last_price_per_hour:.4f}/h",
            when(f.last_price_at),
        )
        for f in figures
    ]
    return table(
        (
            "pool",
            "spot attempts",
            "interruptions",
            "hours on spot",
            "interruptions per hour",
            "lost work s",
            "latest lease price",
            "price seen",
        ),
        rows,
        "pools",
        "pool-row",
    )


def jobs_table(jobs: list[SpotJob]) -> str:
    rows = [
        (
            j.dag_id,
            j.run_id,
            j.task_id,
            j.map_index,
            j.state or "-",
            str(j.record.status),
            len(j.record.attempts),
            j.record.preemptions,
            f"${j.record.ledger.spent:.4f}",
            f"${j.record.ledger.saved:.4f}",
            f"{j.record.ledger.lost_work_seconds:.1f}",
        )
        for j in jobs
    ]
    return table(
        (
            "DAG",
            "run",
            "task",
            "map",
            "task state",
            "job",
            "attempts",
            "preemptions",
            "spent",
            "saved",
            "lost work s",
        ),
        rows,
        "jobs",
        "job-row",
    )
