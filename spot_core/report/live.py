"""A live view of a running job for the terminal: the running attempt, progress to the
last checkpoint, and the saving so far, redrawn by ``rich.live.Live`` as the controller
reports transitions.

It is the controller's listener and a rich renderable at once; the driver owns the
``Live`` (only on a terminal: piped or ``--json`` output stays plain lines).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from spot_core.model import JobRecord
from spot_core.report.progress import attempt_line, saving_line

if TYPE_CHECKING:  # rich is imported when the view is drawn
    from rich.console import RenderableType
    from rich.panel import Panel


class LiveProgress:
    """What the last transition said, drawn with the time since the attempt started."""

    def __init__(
        self,
        total_steps: int | None = None,
        *,
        title: str = "spot job",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.total_steps = total_steps
        self.title = title
        self.clock = clock
        self.record: JobRecord | None = None
        self.last = "starting"

    def listener(self, kind: str, record: JobRecord, detail: str) -> None:
        """The controller's listener: remember the newest record and what happened."""
        self.record = record
        self.last = f"{kind}: {detail}" if detail else kind

    def __rich__(self) -> Panel:
        from rich.console import Group
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.text import Text

        record = self.record
        if record is None:
            return Panel(Text(self.last), title=Text(self.title))
        lines: list[RenderableType] = [
            Text(attempt_line(record, self.clock())),
            Text(saving_line(record)),
        ]
        step = record.latest_checkpoint.step if record.latest_checkpoint else 0
        if self.total_steps:
            lines.append(Text(f"checkpointed step {step} of {self.total_steps}"))
            lines.append(
                ProgressBar(total=self.total_steps, completed=min(step, self.total_steps), width=60)
            )
        # one line, cut with an ellipsis at the panel's width, never silently
        lines.append(Text(f"last: {self.last}", style="dim", no_wrap=True, overflow="ellipsis"))
        return Panel(Group(*lines), title=Text(f"{self.title} {record.job_id}"))
