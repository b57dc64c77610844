"""Savings over time across many jobs: the cumulative dollars spot saved against
on-demand, one line per series (a DAG and task, a flow, a pool), one dot per job."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from html import escape

from spot_core.charts.clock import saving
from spot_core.charts.svg import (
    SERIES_COLOURS,
    document,
    element,
    heading,
    line,
    money,
    rect,
    text,
)
from spot_core.model import JobRecord

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 320, 70, 44, 40, 60


def savings_over_time(
    jobs: Iterable[tuple[str, JobRecord]],
    *,
    width: int = WIDTH,
    height: int = HEIGHT,
    title: str = "Saved against on-demand",
) -> str:
    """``jobs``: (series label, record) pairs, in any order; a job counts when it ended
    (its last attempt's end, or its creation if it has none)."""
    series: dict[str, list[tuple[float, JobRecord]]] = {}
    for label, record in jobs:
        series.setdefault(str(label), []).append((_ended(record), record))
    total = sum(_saved(r) for points in series.values() for _, r in points)
    caption = f"{title}: {money(total)} over {sum(map(len, series.values()))} jobs"
    body, _ = heading(caption, width)
    if not series:
        body.append(text(LEFT, TOP + 30, "no finished spot job yet", fill="#666"))
        return document(width, height, caption, body, class_="spot-chart spot-savings")
    curves = {label: _cumulative(points) for label, points in sorted(series.items())}
    times = [t for curve in curves.values() for t, _, _ in curve]
    values = [v for curve in curves.values() for _, v, _ in curve] + [0.0]
    # At least 1 s between the axis' 4 stamps: jobs that ended together still get 4
    # distinct labels (in seconds then), never four "12-07 15:49".
    t0, t1 = min(times), max(max(times), min(times) + 3 * MIN_TICK_SECONDS)
    v0, v1 = min(values), max(max(values), min(values) + 1e-9)
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM

    def xy(t: float, v: float) -> tuple[float, float]:
        return LEFT + (t - t0) / (t1 - t0) * plot_w, TOP + (v1 - v) / (v1 - v0) * plot_h

    body += _axes(t0, t1, v0, v1, xy, plot_w)
    for i, (label, curve) in enumerate(curves.items()):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(t, v) for t, v, _ in curve))
        body.append(
            element(
                "polyline",
                {
                    "points": points,
                    "fill": "none",
                    "stroke": colour,
                    "stroke-width": 2,
                    "class": "series",
                    "data-series": label,
                },
            )
        )
        for t, v, record in curve:
            x, y = xy(t, v)
            body.append(
                element(
                    "circle",
                    {
                        "cx": f"{x:.1f}",
                        "cy": f"{y:.1f}",
                        "r": 3.5,
                        "fill": colour,
                        "class": "job",
                        "data-job": record.job_id,
                    },
                    f"<title>{_escaped(label, record)}</title>",
                )
            )
        body += _legend(i, label, colour, width, height)
    return document(
        width,
        height + 18 * ((len(curves) + 2) // 3),
        caption,
        body,
        class_="spot-chart spot-savings",
        data_series=len(curves),
    )


MIN_TICK_SECONDS = 1.0


def _saved(record: JobRecord) -> float:
    """What a job adds to the curve: its claimable saving (nothing for a job that failed
    or missed its deadline)."""
    return record.saving_claimed or 0.0


def stamp_format(tick_seconds: float) -> str:
    """The coarsest stamp that still tells ticks ``tick_seconds`` apart."""
    if tick_seconds >= 86400:
        return "%Y-%m-%d"
    if tick_seconds >= 60:
        return "%m-%d %H:%M"
    return "%H:%M:%S"


def _ended(record: JobRecord) -> float:
    ends = [a.ended_at for a in record.attempts if a.ended_at is not None]
    return max(ends) if ends else record.created_at


def _cumulative(points: list[tuple[float, JobRecord]]) -> list[tuple[float, float, JobRecord]]:
    total, out = 0.0, []
    for t, record in sorted(points, key=lambda p: p[0]):
        total += _saved(record)
        out.append((t, total, record))
    return out


def _escaped(label: str, record: JobRecord) -> str:
    return escape(f"{label}: {record.job_id} {saving(record)}")


def _axes(
    t0: float,
    t1: float,
    v0: float,
    v1: float,
    xy: Callable[[float, float], tuple[float, float]],
    plot_w: float,
) -> list[str]:
    parts = []
    for i in range(5):
        v = v0 + (v1 - v0) * i / 4
        x, y = xy(t0, v)
        parts += [
            line(LEFT, y, LEFT + plot_w, y, stroke="#eeeeee"),
            text(LEFT - 6, y + 4, money(v), text_anchor="end", fill="#555", font_size=10),
        ]
    form = stamp_format((t1 - t0) / 3)
    for i in range(4):
        t = t0 + (t1 - t0) * i / 3
        x, y = xy(t, v0)
        stamp = datetime.fromtimestamp(t, UTC).strftime(form)
        parts.append(text(x, y + 16, stamp, text_anchor="middle", fill="#555", font_size=10))
    return parts


def _legend(i: int, label: str, colour: str, width: int, height: int) -> list[str]:
    col, row = i % 3, i // 3
    x, y = LEFT + col * (width - LEFT) / 3, height - 22 + row * 18
    return [rect(x, y, 10, 10, fill=colour), text(x + 14, y + 9, _short(label, 32))]


def _short(label: str, chars: int) -> str:
    """A legend label cut to its column, with an ellipsis when cut (the dots' tooltips
    carry the whole label)."""
    return label if len(label) <= chars else label[: chars - 1] + "\u2026"
