"""The attempt timeline: one bar per attempt on a shared clock, coloured by outcome.

Each bar is labelled with its pool and market (and, for an attempt that resumed after an
interruption, how long the job was down: notice to first step); a preempted attempt ends in
a notice mark (the capacity was reclaimed there); the checkpoint step an attempt resumed
from and the last one it reached are ticks at its ends, their steps written under the bar,
where a short attempt's two labels are joined into one instead of printing over each other.
"""

from __future__ import annotations

from spot_core.charts.clock import Clock, clock_of
from spot_core.charts.svg import (
    OUTCOME_COLOURS,
    document,
    element,
    heading,
    line,
    money,
    rect,
    text,
)
from spot_core.model import Attempt, JobRecord, Outcome

WIDTH, LABEL_WIDTH, ROW, TOP, BOTTOM = 760, 250, 44, 34, 34
BAR_TOP, BAR_HEIGHT, STEP_LINE = 4, 20, 37  # within a row: the bar, then its steps' line
STEP_FONT = 10
CHAR_WIDTH = 0.62 * STEP_FONT  # a generous average glyph width: labels never touch


def attempt_timeline(
    record: JobRecord, *, now: float | None = None, width: int = WIDTH, clock: Clock | None = None
) -> str:
    """The record's attempts as an SVG timeline. ``now`` closes a running attempt's bar
    (default: its start plus nothing, so the chart stays a pure function of the record).
    Its axis and resume times are in ``clock`` (the page's; by default the record's)."""
    clock = clock or clock_of([record])
    attempts = record.attempts
    title = f"Attempts of spot job {record.job_id} ({clock.note()})"
    body, down = heading(title, width)
    top = TOP + down
    height = top + ROW * max(len(attempts), 1) + BOTTOM
    if not attempts:
        body.append(text(LABEL_WIDTH, top + 18, "no attempt yet", fill="#666"))
        return document(width, height, title, body, class_="spot-chart spot-timeline")
    start = min(a.started_at for a in attempts)
    end = max([_end(a, now) for a in attempts] + [start + 1.0])
    scale = (width - LABEL_WIDTH - 36) / (end - start)
    for row, attempt in enumerate(attempts):
        body += _row(
            attempt,
            top + row * ROW,
            LABEL_WIDTH + (attempt.started_at - start) * scale,
            max(2.0, (_end(attempt, now) - attempt.started_at) * scale),
            _in(clock, record, record.time_to_resume(attempt)),
            width - 8,
        )
    body += _axis(start, end, top + ROW * len(attempts) + 6, scale, width, clock, record)
    return document(
        width, height, title, body, class_="spot-chart spot-timeline", data_attempts=len(attempts)
    )


def _in(clock: Clock, record: JobRecord, wall_seconds: float | None) -> str | None:
    """A wall duration of ``record`` in the page's clock and unit, or None."""
    if wall_seconds is None:
        return None
    return clock.duration(clock.capacity(wall_seconds, record.time_scale))


def _end(attempt: Attempt, now: float | None) -> float:
    if attempt.ended_at is not None:
        return attempt.ended_at
    return max(attempt.started_at, now if now is not None else attempt.started_at)


def _row(
    attempt: Attempt,
    y: float,
    x: float,
    bar: float,
    resumed_in: str | None = None,
    right: float = WIDTH - 8,
) -> list[str]:
    outcome = "running" if attempt.outcome is None else str(attempt.outcome)
    pool = attempt.pool
    label = f"#{attempt.number} {pool.zone} {pool.instance_type} {pool.market}"
    resumed = "" if resumed_in is None else f"resumed {resumed_in} after the interruption"
    tooltip = (
        f"attempt {attempt.number}: {outcome} on {pool.key}, cost {money(attempt.cost)} "
        f"(on-demand {money(attempt.on_demand_cost)}); {attempt.message}"
        + (f"; {resumed}" if resumed else "")
    )
    parts = [
        text(8, y + 17, label),
        rect(
            x,
            y + BAR_TOP,
            bar,
            BAR_HEIGHT,
            tooltip,
            class_=f"attempt outcome-{outcome}",
            fill=OUTCOME_COLOURS.get(outcome, "#607d8b"),
            rx=3,
            data_attempt=attempt.number,
            data_outcome=outcome,
            data_market=str(pool.market),
            data_pool=pool.key,
        ),
    ]
    if resumed:
        parts.append(
            text(20, y + STEP_LINE, resumed, fill="#555", font_size=STEP_FONT, class_="resumed")
        )
    if attempt.outcome is Outcome.PREEMPTED:
        parts.append(
            element(
                "path",
                {"d": f"M{x + bar:.1f},{y + 6} l-5,-7 h10 z", "fill": "#bf360c", "class": "notice"},
                "<title>interruption notice: capacity reclaimed</title>",
            )
        )
    start = attempt.checkpoint_step_start
    end = attempt.checkpoint_step_end if attempt.outcome is not None else None
    if start is not None:
        parts.append(_tick(x, y))
    if end is not None:
        parts.append(_tick(x + bar, y))
    parts += _step_labels(
        x,
        bar,
        y,
        None if start is None else f"from {start}",
        None if end is None else f"ckpt {end}",
        right,
    )
    return parts


def _tick(x: float, y: float) -> str:
    """A checkpoint mark: a tick across the bar's edge."""
    return line(
        x,
        y + 1,
        x,
        y + BAR_TOP + BAR_HEIGHT + 3,
        stroke="#212121",
        stroke_width=2,
        class_="checkpoint",
    )


def label_width(label: str) -> float:
    """The width a step label takes, over-estimated so two never touch."""
    return len(label) * CHAR_WIDTH


def _step_labels(
    x: float, bar: float, y: float, first: str | None, last: str | None, right: float
) -> list[str]:
    """The steps under the bar: ``first`` at its start, ``last`` at its end; when the bar
    is too short for both side by side, one joined label from the start (kept inside the
    chart), so a short attempt never prints "from 330" over "ckpt 640"."""
    style = {"fill": "#212121", "font_size": STEP_FONT, "class_": "step"}
    if first and last and label_width(first) + label_width(last) + 8 > bar:
        first, last = f"{first} \u2192 {last}", None
    parts = []
    if first:
        left = max(LABEL_WIDTH, min(x, right - label_width(first)))
        parts.append(text(left, y + STEP_LINE, first, text_anchor="start", **style))
    if last:
        left = max(LABEL_WIDTH, x + bar - label_width(last))
        parts.append(text(left, y + STEP_LINE, last, text_anchor="start", **style))
    return parts


def _axis(
    start: float, end: float, y: float, scale: float, width: int, clock: Clock, record: JobRecord
) -> list[str]:
    """Elapsed time below the bars, in the page's clock and unit."""
    span = end - start
    unit, name = clock.unit_seconds, clock.unit
    parts = [line(LABEL_WIDTH, y, width - 36, y, stroke="#9e9e9e")]
    for i in range(5):
        offset = span * i / 4
        x = LABEL_WIDTH + offset * scale
        parts.append(line(x, y, x, y + 4, stroke="#9e9e9e"))
        parts.append(
            text(
                x,
                y + 16,
                f"+{clock.capacity(offset, record.time_scale) / unit:.3g} {name}",
                text_anchor="middle",
                fill="#555",
                font_size=10,
            )
        )
    return parts
