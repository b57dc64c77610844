"""A live view of a running job for the terminal: the running attempt, progress to the
last checkpoint, and the saving so far, redrawn by ``rich.live.Live`` as the controller
reports transitions.

It is the controller's listener and a rich renderable at once; the driver owns the
``Live`` (only on a terminal: piped or ``--json`` output stays plain lines).
"""

from __future__ import annotations

import time
from typing import Callable

from spot_core.model import JobRecord


class LiveProgress:
    """What the last transition said, drawn with the time since the attempt started."""

    def __init__(self, total_steps: int | None = None, *, title: str = "spot job",
                 clock: Callable[[], float] = time.time) -> None:
        self.total_steps = total_steps
        self.title = title
        self.clock = clock
        self.record: JobRecord | None = None
        self.last = "starting"

    def listener(self, kind: str, record: JobRecord, detail: str) -> None:
        """The controller's listener: remember the newest record and what happened."""
        self.record = record
        self.last = f"{kind}: {detail}" if detail else kind

    def __rich__(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.text import Text

        record = self.record
        if record is None:
            return Panel(Text(self.last), title=self.title)
        lines = [Text(self._attempt_line(record)), Text(self._saving_line(record))]
        step = record.latest_checkpoint.step if record.latest_checkpoint else 0
        if self.total_steps:
            lines.append(Text(f"checkpointed step {step} of {self.total_steps}"))
            lines.append(ProgressBar(total=self.total_steps, completed=min(step, self.total_steps),
                                     width=60))
        lines.append(Text(f"last: {self.last}"[:160], style="dim"))
        return Panel(Group(*lines), title=f"{self.title} {record.job_id}")

    def _attempt_line(self, record: JobRecord) -> str:
        attempt = record.attempts[-1] if record.attempts else None
        if attempt is None:
            return "no attempt yet"
        pool = attempt.pool
        if attempt.outcome is None:
            price = (attempt.lease or {}).get("price_per_hour")
            rate = f" at ${price:.3f}/h" if isinstance(price, (int, float)) else ""
            running = max(0.0, self.clock() - attempt.started_at)
            return (f"attempt {attempt.number} running on {pool.zone} {pool.instance_type} "
                    f"({pool.market}){rate} for {running:.0f} s")
        return f"attempt {attempt.number} on {pool.zone} ({pool.market}) ended {attempt.outcome}"

    @staticmethod
    def _saving_line(record: JobRecord) -> str:
        ledger = record.ledger
        return (f"preemptions {record.preemptions}, fallbacks {record.fallbacks}; spent "
                f"${ledger.spent:.2f} vs on-demand ${ledger.on_demand_equivalent:.2f}: saved so "
                f"far ${ledger.saved:.2f} ({ledger.savings_fraction:.0%})")
