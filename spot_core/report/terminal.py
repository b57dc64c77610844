"""The record as rich tables on the terminal (`spot-pipelines run`, `demo`, `report`)."""

from __future__ import annotations

from spot_core.model import JobRecord
from spot_core.report.rows import COLUMNS, attempt_cells, ledger_lines


def attempts_table(record: JobRecord):
    """A rich Table with one row per attempt."""
    from rich.table import Table

    table = Table(title=f"job {record.job_id} ({record.status})")
    for heading, left in COLUMNS:
        table.add_column(heading, justify="left" if left else "right")
    for attempt in record.attempts:
        table.add_row(*attempt_cells(attempt, record))
    return table


def print_record(record: JobRecord, time_scale: float = 1.0, console=None) -> None:
    from rich.console import Console

    console = console or Console(highlight=False, width=120)
    console.print(attempts_table(record))
    console.print(ledger_lines(record, time_scale), markup=False)
