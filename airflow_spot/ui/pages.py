"""The Spot tab and the Spot jobs page as HTML: tables plus the SVG charts of
``spot_core.charts`` (the same pictures as ``spot-pipelines report``), inline CSS, no
script and nothing fetched from elsewhere. Everything taken from a record is escaped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape

from airflow_spot.ui.jobs import SpotJob
from spot_core.charts import attempt_timeline, cost_chart, lost_work_chart, savings_over_time
from spot_core.charts.clock import Clock, clock_of, money, saving
from spot_core.errors import ConfigError
from spot_core.fleet import day_of, pool_figures, savings_by
from spot_core.model import Attempt, JobRecord, Lease
from spot_core.report.rows import resume_words, resumes

# Fits Airflow's iframe (about 1,000 px wide in a 1,280 px window): tables wrap their
# text cells and take the frame's width at most, charts scale down to it.
STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:12px;color:#212121}
h1{font-size:18px;margin:0 0 8px;overflow-wrap:anywhere}h2{font-size:15px;margin:20px 0 6px}
table{border-collapse:collapse;margin:6px 0 14px;font-size:13px;max-width:100%}
th,td{border:1px solid #e0e0e0;padding:3px 6px;vertical-align:top;overflow-wrap:break-word}
th{background:#f5f5f5;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
p.note,p.clock{color:#616161;font-size:12px}p.where{overflow-wrap:anywhere}
figure{margin:0 0 16px}figure svg{max-width:100%;height:auto;display:block}
table.attempts td.message,table.jobs td,table.running td{overflow-wrap:anywhere}
table.attempts td.message{min-width:12em}
"""
MESSAGE_CHARS = 240  # an attempt's message in the table (the chart's tooltip has it too)
# Inside Airflow's iframe: no script, nothing from elsewhere, inline styles only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def attempt_columns(clock: Clock) -> tuple[str, ...]:
    """The attempts table's headings, durations in the page's unit: few enough columns
    to fit Airflow's frame (times of one attempt share a cell, steps share one)."""
    unit = clock.unit
    return (
        "#",
        "pool",
        "outcome",
        "ran (UTC)",
        "steps: resumed from, last checkpoint",
        f"time to resume ({unit})",
        "cost",
        "on-demand",
        f"lost work ({unit})",
        f"checkpoint overhead ({unit})",
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
    last_class: str = "",
) -> str:
    """A table; cells that look like numbers are right-aligned. Cells are escaped here.
    ``row_class``: every row's class, or one per row; ``last_class``: the last column's."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headings)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(
            f"<td{_num(c) if j < len(row) - 1 or not last_class else f' class={last_class!r}'}>"
            f"{escape(str(c))}</td>"
            for j, c in enumerate(row)
        )
        css_class = row_class if isinstance(row_class, str) else row_class[i]
        body.append(f'<tr class="{escape(css_class)}">{cells}</tr>')
    return (
        f'<table class="{escape(css)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _num(cell: object) -> str:
    text = str(cell).lstrip("$-").replace(".", "", 1).replace("%", "").replace(",", "")
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
    clock = clock_of([record])
    return page(
        f"Spot job {record.job_id}",
        [
            f'<p class="where">{escape(where)}: task {escape(job.state or "-")}, job '
            f"{escape(str(record.status))} (from the {escape(job.source)})</p>",
            f'<p class="clock">{escape(clock.sentence())}</p>',
            *queue_section(queue),
            ledger_table(record, clock),
            "<h2>Attempts</h2>",
            attempts_table(record, clock),
            *(
                f"<figure>{svg}</figure>"
                for svg in (
                    attempt_timeline(record, now=now, clock=clock),
                    cost_chart(record, clock=clock),
                    lost_work_chart(record, clock=clock),
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


def ledger_table(record: JobRecord, clock: Clock | None = None) -> str:
    """The job's counts and money, every row from the same record (the resumes and their
    times are one list), durations in the page's clock and unit."""
    clock = clock or clock_of([record])
    s, ledger = record.summary(), record.ledger
    preemptions = str(s["preemptions"]) + (
        f" (and {record.disruptions} voluntary disruption"
        f"{'' if record.disruptions == 1 else 's'}, no preemption spent)"
        if record.disruptions
        else ""
    )
    rows = [
        ("attempts", s["attempts"]),
        ("preemptions", preemptions),
        ("fallbacks to on-demand", s["fallbacks"]),
        (f"resumed ({len(resumes(record))})", resume_words(record, clock)),
        ("spot cost", money(ledger.spent)),
        ("on-demand equivalent", money(ledger.on_demand_equivalent)),
        ("saved", saving(record, verb=False)),
        ("lost work", clock.duration(ledger.lost_work_seconds)),
        ("checkpoint overhead", clock.duration(ledger.checkpoint_overhead_seconds)),
        *(
            [("data transfer (in the spot cost)", money(ledger.data_transfer_cost))]
            if ledger.data_transfer_cost
            else []
        ),
        (
            "latest checkpoint step",
            "-" if s["latest_checkpoint_step"] is None else s["latest_checkpoint_step"],
        ),
    ]
    return table(("figure", "this job"), rows, "ledger")


def attempts_table(record: JobRecord, clock: Clock | None = None) -> str:
    """The attempt timeline as a table: one row per attempt, and one for the replacement
    launched on the running attempt's notice while it hands over (not an attempt yet)."""
    clock = clock or clock_of([record])
    rows = [_attempt_cells(a, record, clock) for a in record.attempts]
    classes = ["attempt-row"] * len(rows)
    handing_over = (
        None if record.current_attempt is None else _replacement_cells(record.current_attempt)
    )
    if handing_over is not None:
        rows.append(handing_over)
        classes.append("handover-row")
    return table(attempt_columns(clock), rows, "attempts", classes, last_class="message")


def _ran(a: Attempt) -> str:
    """Start to end of an attempt (UTC), the date once, and its notice if it had one."""
    end = "running" if a.ended_at is None else when(a.ended_at)[11:]
    notice = "" if a.notice_at is None else f"; notice {when(a.notice_at)[11:]}"
    return f"{when(a.started_at)} \u2192 {end}{notice}"


def _attempt_cells(a: Attempt, record: JobRecord, clock: Clock) -> tuple[str, ...]:
    resumed_in = record.time_to_resume(a)
    return (
        str(a.number),
        f"{a.pool.zone} {a.pool.instance_type} {a.pool.market}",
        "running" if a.outcome is None else str(a.outcome),
        _ran(a),
        f"{_dash(a.checkpoint_step_start)} \u2192 {_dash(a.checkpoint_step_end)}",
        "-" if resumed_in is None else clock.number(clock.capacity(resumed_in, record.time_scale)),
        money(a.cost),
        money(a.on_demand_cost),
        clock.number(a.lost_work_seconds),
        clock.number(a.checkpoint_overhead_seconds),
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
        f"{pool.zone} {pool.instance_type} {pool.market}",
        "handing over",
        f"launched {when(launched_at if isinstance(launched_at, (int, float)) else None)}",
        *("-" for _ in range(6)),
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
    clock = clock_of(j.record for j in jobs)
    body = [
        f'<p class="note">{len(jobs)} spot job(s) in the DAGs you may read'
        + (f" (the newest {limit})" if len(jobs) >= limit else "")
        + (f"; {unreadable} record(s) could not be read" if unreadable else "")
        + ". A job that failed or missed its deadline claims no saving.</p>",
        f'<p class="clock">{escape(clock.sentence())}</p>',
    ]
    body += ["<h2>Running now</h2>", running_table(jobs, now, clock)]
    body += [
        "<h2>Savings per DAG and task</h2>",
        savings_table(jobs, clock, by_day=False),
        f"<figure>{savings_over_time((f'{j.dag_id}.{j.task_id}', j.record) for j in jobs)}"
        "</figure>",
        "<h2>Savings per day</h2>",
        savings_table(jobs, clock, by_day=True),
    ]
    body += ["<h2>Pools</h2>", pools_table(jobs, clock)]
    body += ["<h2>Jobs</h2>", jobs_table(jobs, clock)]
    return page("Spot jobs", body)


def running_table(jobs: list[SpotJob], now: float, clock: Clock | None = None) -> str:
    clock = clock or clock_of(j.record for j in jobs)
    rows = []
    for job in jobs:
        attempt = job.record.current_attempt
        if not job.running or attempt is None:  # a running job has a current attempt
            continue
        lease = attempt.lease or {}
        running = clock.capacity(max(0.0, now - attempt.started_at), job.record.time_scale)
        rows.append(
            (
                job.dag_id,
                job.run_id,
                job.task_id,
                job.state,
                attempt.number,
                attempt.lease_id or "-",
                attempt.pool.key,
                f"{money(float(lease.get('price_per_hour', 0.0)))}/h",
                clock.number(running),
                money(job.record.ledger.spent),
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
            f"running ({clock.unit})",
            "spent so far",
        ),
        rows,
        "running",
        "running-row",
    )


def savings_table(jobs: list[SpotJob], clock: Clock | None = None, *, by_day: bool) -> str:
    clock = clock or clock_of(j.record for j in jobs)
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
            money(s.spent),
            money(s.on_demand_equivalent),
            money(s.saved)
            + (f" (not counting {s.unclaimed_jobs} failed)" if s.unclaimed_jobs else ""),
            f"{s.savings_fraction:.0%}",
            clock.number(s.lost_work_seconds),
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
            f"lost work ({clock.unit})",
        )
    )
    return table(headings, rows, "savings-by-day" if by_day else "savings")


def pools_table(jobs: list[SpotJob], clock: Clock | None = None) -> str:
    """Per pool, in the clock of the costs beside it: hours on spot and interruptions per
    hour are capacity hours on a trace market (the pool alerts' "per spot hour")."""
    clock = clock or clock_of(j.record for j in jobs)
    figures = pool_figures(j.record for j in jobs)
    if not figures:
        return '<p class="empty">No attempt has run on spot yet.</p>'
    hour = "hour" if clock.is_wall else "capacity hour"
    rows = [
        (
            f.pool,
            f.attempts,
            f.interruptions,
            f"{f.spot_hours:.2f}",
            "-" if f.interruptions_per_hour is None else f"{f.interruptions_per_hour:.2f}",
            clock.number(f.lost_work_seconds),
            "-" if f.last_price_per_hour is None else f"{money(f.last_price_per_hour)}/h",
            when(f.last_price_at),
        )
        for f in figures
    ]
    return table(
        (
            "pool",
            "spot attempts",
            "interruptions",
            f"{hour}s on spot",
            f"interruptions per {hour}",
            f"lost work ({clock.unit})",
            "latest lease price",
            "price seen (UTC)",
        ),
        rows,
        "pools",
        "pool-row",
    )


def jobs_table(jobs: list[SpotJob], clock: Clock | None = None) -> str:
    clock = clock or clock_of(j.record for j in jobs)
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
            money(j.record.ledger.spent),
            saving(j.record, verb=False),
            clock.number(j.record.ledger.lost_work_seconds),
        )
        for j in jobs
    ]
    return table(
        (
            "DAG",
            "run",
            "task",
            "map index",
            "task state",
            "job",
            "attempts",
            "preemptions",
            "spent",
            "saved",
            f"lost work ({clock.unit})",
        ),
        rows,
        "jobs",
        "job-row",
    )
