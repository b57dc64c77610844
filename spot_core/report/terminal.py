"""The record as rich tables on the terminal (`spot-pipelines run`, `demo`, `report`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spot_core.model import JobRecord
from spot_core.report.rows import COLUMNS, attempt_cells, ledger_lines

if TYPE_CHECKING:  # rich is imported when a table is drawn
    from rich.console import Console
    from rich.table import Table


def attempts_table(record: JobRecord) -> Table:
    """A rich Table with one row per attempt."""
    from rich.table import Table

    table = Table(title=f"job {record.job_id} ({record.status})")
    for heading, left in COLUMNS:
        table.add_column(heading, justify="left" if left else "right")
    for attempt in record.attempts:
        table.add_row(*attempt_cells(attempt, record))
    return table


def print_record(
    record: JobRecord, time_scale: float = 1.0, console: Console | None = None
) -> None:
    from rich.console import Console

    console = console or Console(highlight=False, width=120)
    console.print(attempts_table(record))
    console.print(ledger_lines(record, time_scale), markup=False)
