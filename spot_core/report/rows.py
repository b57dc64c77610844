"""The cells every view of a record shows, computed once: the attempts table's columns
and rows, and the ledger's lines (the terminal and the HTML page render the same)."""

from __future__ import annotations

from spot_core.model import Attempt, JobRecord

# (heading, left-aligned?)
COLUMNS: tuple[tuple[str, bool], ...] = (
    ("#", False),
    ("pool", True),
    ("market", False),
    ("outcome", True),
    ("resumed from", False),
    ("last ckpt", False),
    ("cost $", False),
    ("on-demand $", False),
    ("lost work h", False),
)


def attempt_cells(attempt: Attempt, record: JobRecord | None = None) -> tuple[str, ...]:
    """One attempt's row, in ``COLUMNS`` order; with ``record``, "resumed from" also says
    how long the job was down (the wall seconds from the previous attempt's notice to this
    one's first step): ``400 in 12.5 s``."""
    a = attempt
    resume = None if record is None else record.time_to_resume(a)
    return (
        str(a.number),
        f"{a.pool.zone} {a.pool.instance_type}",
        str(a.pool.market),
        "running" if a.outcome is None else str(a.outcome),
        _dash(a.checkpoint_step_start) + ("" if resume is None else f" in {resume:.1f} s"),
        _dash(a.checkpoint_step_end),
        f"{a.cost:.2f}",
        f"{a.on_demand_cost:.2f}",
        f"{a.lost_work_seconds / 3600:.3f}",
    )


def ledger_lines(record: JobRecord, time_scale: float = 1.0) -> str:
    """Counters and money in two lines: what the job survived and what it saved."""
    ledger = record.ledger
    clock = (
        ""
        if time_scale == 1
        else (f" (capacity time; the local cloud replays 1 s as {time_scale / 3600:g} h)")
    )
    transfer = (
        f" (incl. ${ledger.data_transfer_cost:.2f} cross-region data transfer)"
        if ledger.data_transfer_cost > 0
        else ""
    )
    voluntary = (
        f"voluntary disruptions {record.disruptions} (no preemption spent), "
        if record.disruptions
        else ""
    )
    resumes = record.time_to_resume_seconds
    resumed = (
        f"; time to resume {', '.join(f'{t:.1f}' for t in resumes)} s (notice to first step)"
        if resumes
        else ""
    )
    return (
        f"preemptions {record.preemptions}, {voluntary}user failures "
        f"{record.user_failures}, fallbacks "
        f"to on-demand {record.fallbacks}, resumed from steps "
        f"{record.summary()['resumed_from_steps']}{resumed}\n"
        f"spot cost ${ledger.spent:.2f}{transfer} vs on-demand "
        f"${ledger.on_demand_equivalent:.2f}: saved ${ledger.saved:.2f} "
        f"({ledger.savings_fraction:.0%}); lost work {ledger.lost_work_seconds / 3600:.2f} h; "
        f"checkpoint overhead {ledger.checkpoint_overhead_seconds / 3600:.2f} h{clock}"
    )


def _dash(value: object) -> str:
    return "-" if value is None else str(value)
