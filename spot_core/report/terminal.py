"""The record as rich tables on the terminal (`spot-pipelines run`, `demo`, `report`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spot_core.model import JobRecord
from spot_core.report.rows import attempt_cells, columns, ledger_lines, record_clock

if TYPE_CHECKING:  # rich is imported when a table is drawn
    from rich.console import Console
    from rich.table import Table


def attempts_table(record: JobRecord, time_scale: float | None = None) -> Table:
    """A rich Table with one row per attempt, its durations in the record's clock."""
    from rich.table import Table

    clock = record_clock(record, time_scale)
    table = Table(title=f"job {record.job_id} ({record.status})")
    for heading, left in columns(clock):
        table.add_column(heading, justify="left" if left else "right")
    for attempt in record.attempts:
        table.add_row(*attempt_cells(attempt, record, clock))
    return table


def print_record(
    record: JobRecord, time_scale: float | None = None, console: Console | None = None
) -> None:
    """The attempts table and the ledger; ``time_scale`` names the clock of a record
    written before records carried their own."""
    from rich.console import Console

    console = console or Console(highlight=False, width=120)
    console.print(attempts_table(record, time_scale))
    console.print(ledger_lines(record, time_scale), markup=False)
