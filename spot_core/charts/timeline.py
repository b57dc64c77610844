"""The attempt timeline: one bar per attempt on a shared clock, coloured by outcome.

Each bar is labelled with its pool and market; a preempted attempt ends in a notice
mark (the capacity was reclaimed there); the checkpoint step an attempt resumed from and
the last one it reached are marked at its ends.
"""

from __future__ import annotations

from spot_core.charts.svg import OUTCOME_COLOURS, document, element, line, rect, text
from spot_core.model import Attempt, JobRecord, Outcome

WIDTH, LABEL_WIDTH, ROW, TOP, BOTTOM = 760, 250, 30, 34, 34


def attempt_timeline(record: JobRecord, *, now: float | None = None, width: int = WIDTH) -> str:
    """The record's attempts as an SVG timeline. ``now`` closes a running attempt's bar
    (default: its start plus nothing, so the chart stays a pure function of the record)."""
    attempts = record.attempts
    height = TOP + ROW * max(len(attempts), 1) + BOTTOM
    title = f"Attempts of spot job {record.job_id}"
    body = [text(8, 18, title, font_weight="600")]
    if not attempts:
        body.append(text(LABEL_WIDTH, TOP + 18, "no attempt yet", fill="#666"))
        return document(width, height, title, body, class_="spot-chart spot-timeline")
    start = min(a.started_at for a in attempts)
    end = max([_end(a, now) for a in attempts] + [start + 1.0])
    scale = (width - LABEL_WIDTH - 36) / (end - start)
    for row, attempt in enumerate(attempts):
        body += _row(
            attempt,
            TOP + row * ROW,
            LABEL_WIDTH + (attempt.started_at - start) * scale,
            max(2.0, (_end(attempt, now) - attempt.started_at) * scale),
        )
    body += _axis(start, end, TOP + ROW * len(attempts) + 6, scale, width)
    return document(
        width, height, title, body, class_="spot-chart spot-timeline", data_attempts=len(attempts)
    )


def _end(attempt: Attempt, now: float | None) -> float:
    if attempt.ended_at is not None:
        return attempt.ended_at
    return max(attempt.started_at, now if now is not None else attempt.started_at)


def _row(attempt: Attempt, y: float, x: float, bar: float) -> list[str]:
    outcome = "running" if attempt.outcome is None else str(attempt.outcome)
    pool = attempt.pool
    label = f"#{attempt.number} {pool.zone} {pool.instance_type} {pool.market}"
    tooltip = (
        f"attempt {attempt.number}: {outcome} on {pool.key}, cost ${attempt.cost:.4f} "
        f"(on-demand ${attempt.on_demand_cost:.4f}); {attempt.message}"
    )
    parts = [
        text(8, y + 17, label),
        rect(
            x,
            y + 4,
            bar,
            ROW - 10,
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
    if attempt.checkpoint_step_start is not None:
        parts.append(_mark(x, y, f"from {attempt.checkpoint_step_start}", "start"))
    if attempt.outcome is Outcome.PREEMPTED:
        parts.append(
            element(
                "path",
                {"d": f"M{x + bar:.1f},{y + 6} l-5,-7 h10 z", "fill": "#bf360c", "class": "notice"},
                "<title>interruption notice: capacity reclaimed</title>",
            )
        )
    if attempt.checkpoint_step_end is not None and attempt.outcome is not None:
        parts.append(_mark(x + bar, y, f"ckpt {attempt.checkpoint_step_end}", "end"))
    return parts


def _mark(x: float, y: float, label: str, anchor: str) -> str:
    """A checkpoint mark: a tick at the bar's edge and its step, inside the bar."""
    shift = 4 if anchor == "start" else -4
    return line(
        x, y + 2, x, y + ROW - 4, stroke="#212121", stroke_width=2, class_="checkpoint"
    ) + text(
        x + shift,
        y + 18,
        label,
        fill="#fff",
        font_size=10,
        text_anchor="start" if anchor == "start" else "end",
    )


def _axis(start: float, end: float, y: float, scale: float, width: int) -> list[str]:
    """Elapsed time below the bars, in the unit that suits the span."""
    span = end - start
    unit, name = (3600.0, "h") if span >= 3 * 3600 else (60.0, "min") if span >= 180 else (1.0, "s")
    parts = [line(LABEL_WIDTH, y, width - 36, y, stroke="#9e9e9e")]
    for i in range(5):
        offset = span * i / 4
        x = LABEL_WIDTH + offset * scale
        parts.append(line(x, y, x, y + 4, stroke="#9e9e9e"))
        parts.append(
            text(
                x,
                y + 16,
                f"+{offset / unit:.3g} {name}",
                text_anchor="middle",
                fill="#555",
                font_size=10,
            )
        )
    return parts
