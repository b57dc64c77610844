"""The cells every view of a record shows, computed once: the attempts table's columns
and rows, and the ledger's lines (the terminal and the HTML page render the same).

Every duration is in the record's clock (capacity time on a trace market, wall time
elsewhere) and in one unit per view (``spot_core.charts.clock``); money never reads
$0.00 when it is not zero; a job that failed or missed its deadline claims no saving.
"""

from __future__ import annotations

import dataclasses

from spot_core.charts.clock import Clock, clock_of, money, saving
from spot_core.model import Attempt, JobRecord

# (heading, left-aligned?); the lost-work heading takes the view's unit (``columns``).
COLUMNS: tuple[tuple[str, bool], ...] = (
    ("#", False),
    ("pool", True),
    ("market", False),
    ("outcome", True),
    ("resumed from", False),
    ("last ckpt", False),
    ("cost", False),
    ("on-demand", False),
    ("lost work h", False),
)


def columns(clock: Clock) -> tuple[tuple[str, bool], ...]:
    """``COLUMNS`` with the lost-work heading in ``clock``'s unit."""
    return (*COLUMNS[:-1], (f"lost work {clock.unit}", False))


def record_clock(record: JobRecord, time_scale: float | None = None) -> Clock:
    """The clock of a view of ``record``: its own ``time_scale``; ``time_scale`` names it
    for a record written before records carried their clock."""
    if time_scale is not None and time_scale != 1.0 and record.time_scale == 1.0:
        record = dataclasses.replace(record, time_scale=time_scale)
    return clock_of([record])


def attempt_cells(
    attempt: Attempt, record: JobRecord | None = None, clock: Clock | None = None
) -> tuple[str, ...]:
    """One attempt's row, in ``COLUMNS`` order; with ``record``, "resumed from" also says
    how long the job was down (from the previous attempt's notice to this one's first
    step, in the view's clock): ``400 in 12.5 s``."""
    a = attempt
    clock = clock or (Clock() if record is None else record_clock(record))
    resume = None if record is None else record.time_to_resume(a)
    scale = 1.0 if record is None else record.time_scale
    return (
        str(a.number),
        f"{a.pool.zone} {a.pool.instance_type}",
        str(a.pool.market),
        "running" if a.outcome is None else str(a.outcome),
        _dash(a.checkpoint_step_start)
        + ("" if resume is None else f" in {clock.duration(clock.capacity(resume, scale))}"),
        _dash(a.checkpoint_step_end),
        money(a.cost),
        money(a.on_demand_cost),
        clock.number(a.lost_work_seconds),
    )


def resumes(record: JobRecord) -> list[tuple[Attempt, float | None]]:
    """Every attempt that resumed the job (after the first, from a checkpoint or after an
    interruption) with its wall time to resume: one list, so a view's count of resumes
    and of times to resume always agree."""
    return [
        (a, record.time_to_resume(a))
        for a in record.attempts[1:]
        if a.checkpoint_step_start is not None or record.time_to_resume(a) is not None
    ]


def resume_words(record: JobRecord, clock: Clock) -> str:
    """``from step 400 in 0.50 h, from the start``: one entry per resume."""
    words = []
    for attempt, wall in resumes(record):
        step = attempt.checkpoint_step_start
        where = "from the start" if step is None else f"from step {step}"
        took = (
            "" if wall is None else f" in {clock.duration(clock.capacity(wall, record.time_scale))}"
        )
        words.append(where + took)
    return ", ".join(words) or "-"


def ledger_lines(record: JobRecord, time_scale: float | None = None) -> str:
    """Counters, money and the clock in three lines: what the job survived, what it
    saved (or why it claims no saving), and which clock the numbers are in."""
    clock = record_clock(record, time_scale)
    ledger = record.ledger
    transfer = (
        f" (incl. {money(ledger.data_transfer_cost)} cross-region data transfer)"
        if ledger.data_transfer_cost > 0
        else ""
    )
    voluntary = (
        f"voluntary disruptions {record.disruptions} (no preemption spent), "
        if record.disruptions
        else ""
    )
    count = len(resumes(record))
    resumed = f"resumed {count} time{'' if count == 1 else 's'}" + (
        f": {resume_words(record, clock)} (time to resume: notice to first step)" if count else ""
    )
    return (
        f"preemptions {record.preemptions}, {voluntary}user failures "
        f"{record.user_failures}, fallbacks to on-demand {record.fallbacks}; {resumed}\n"
        f"spot cost {money(ledger.spent)}{transfer} vs on-demand "
        f"{money(ledger.on_demand_equivalent)}: {saving(record)}; lost work "
        f"{clock.duration(ledger.lost_work_seconds)}; checkpoint overhead "
        f"{clock.duration(ledger.checkpoint_overhead_seconds)}\n"
        f"{clock.sentence()}"
    )


def _dash(value: object) -> str:
    return "-" if value is None else str(value)
