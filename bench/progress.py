"""Progress of a benchmark's rows on stderr, so stdout (the table) stays as it was.

On a terminal a rich progress bar (rows done, elapsed, time left); otherwise one plain
line per finished row, so a log or CI shows the run is alive.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, as_completed
from typing import TypeVar

Row = TypeVar("Row")


def run_rows(
    executor: Executor,
    fn: Callable[..., Row],
    cases: Iterable,
    *,
    label: str = "rows",
    name: Callable[[Row], str] = str,
) -> list[Row]:
    """``fn`` over ``cases`` on ``executor``; results in the order they finish."""
    futures = [executor.submit(fn, case) for case in cases]
    done = as_completed(futures)
    return list(
        _with_bar(done, len(futures), label, name)
        if sys.stderr.isatty()
        else _with_lines(done, len(futures), label, name)
    )


def _with_bar(done, total: int, label: str, name) -> Iterator:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task(label, total=total)
        for future in done:
            row = future.result()
            progress.update(task, advance=1, description=f"{label}: {name(row)}"[:60])
            yield row


def _with_lines(done, total: int, label: str, name) -> Iterator:
    started = time.perf_counter()
    for i, future in enumerate(done, 1):
        row = future.result()
        print(
            f"{label} {i}/{total} ({time.perf_counter() - started:.0f} s): {name(row)}",
            file=sys.stderr,
            flush=True,
        )
        yield row
