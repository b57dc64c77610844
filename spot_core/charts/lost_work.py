"""Work lost to interruptions (done after the last durable checkpoint, so redone) and
time spent checkpointing, per attempt: the price of a preemption that money hides."""

from __future__ import annotations

from spot_core.charts.clock import Clock, clock_of
from spot_core.charts.svg import LOST_COLOUR, OVERHEAD_COLOUR, document, heading, rect, text
from spot_core.model import JobRecord

WIDTH, LABEL_WIDTH, ROW, TOP = 760, 210, 26, 50


def lost_work_chart(record: JobRecord, *, width: int = WIDTH, clock: Clock | None = None) -> str:
    """Lost work and checkpoint overhead per attempt (capacity time), every duration in
    the one unit of ``clock`` (the page's; by default the record's own)."""
    clock = clock or clock_of([record])
    hours = clock.duration
    ledger = record.ledger
    title = (
        f"Lost work {hours(ledger.lost_work_seconds)}, checkpoint overhead "
        f"{hours(ledger.checkpoint_overhead_seconds)} ({record.job_id}; {clock.note()})"
    )
    body, down = heading(title, width)
    body += [
        rect(8, 28 + down, 10, 10, fill=LOST_COLOUR),
        text(22, 37 + down, "lost work"),
        rect(100, 28 + down, 10, 10, fill=OVERHEAD_COLOUR),
        text(114, 37 + down, "checkpoint overhead"),
    ]
    top = max(
        [a.lost_work_seconds + a.checkpoint_overhead_seconds for a in record.attempts] + [1e-9]
    )
    scale = (width - LABEL_WIDTH - 90) / top
    for i, a in enumerate(record.attempts):
        y = TOP + down + i * ROW
        lost, overhead = a.lost_work_seconds * scale, a.checkpoint_overhead_seconds * scale
        body += [
            text(8, y + 15, f"attempt {a.number} ({a.outcome or 'running'})"),
            rect(
                LABEL_WIDTH,
                y + 3,
                lost,
                16,
                f"attempt {a.number}: lost {hours(a.lost_work_seconds)}",
                fill=LOST_COLOUR,
                class_="lost-work",
                data_attempt=a.number,
            ),
            rect(
                LABEL_WIDTH + lost,
                y + 3,
                overhead,
                16,
                f"attempt {a.number}: checkpointing {hours(a.checkpoint_overhead_seconds)}",
                fill=OVERHEAD_COLOUR,
                class_="checkpoint-overhead",
                data_attempt=a.number,
            ),
            text(
                LABEL_WIDTH + lost + overhead + 6,
                y + 15,
                f"lost {hours(a.lost_work_seconds)}",
                fill="#333",
                font_size=11,
            ),
        ]
    height = TOP + down + ROW * max(len(record.attempts), 1) + 8
    return document(width, height, title, body, class_="spot-chart spot-lost-work")
