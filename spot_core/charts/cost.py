"""What the job cost against what on-demand would have: one pair of bars per attempt
and a total, so a reader sees where the money went and what spot saved."""

from __future__ import annotations

from spot_core.charts.clock import Clock, clock_of, saving
from spot_core.charts.svg import (
    ON_DEMAND_COLOUR,
    SPOT_COLOUR,
    document,
    heading,
    line,
    money,
    rect,
    text,
)
from spot_core.model import JobRecord

WIDTH, LABEL_WIDTH, ROW, TOP = 760, 170, 34, 50


def cost_chart(record: JobRecord, *, width: int = WIDTH, clock: Clock | None = None) -> str:
    """Paid (bars per attempt and in total) against the on-demand equivalent; the title
    wraps to the width, says the clock on a trace market, and claims no saving for a job
    that failed or missed its deadline."""
    clock = clock or clock_of([record])
    ledger = record.ledger
    rows: list[tuple[str, float, float, int | None]] = [
        (f"attempt {a.number} ({a.pool.market})", a.cost, a.on_demand_cost, a.number)
        for a in record.attempts
    ]
    rows.append(("total", ledger.spent, ledger.on_demand_equivalent, None))
    top = max([max(paid, od) for _, paid, od, _ in rows] + [1e-9])
    scale = (width - LABEL_WIDTH - 110) / top
    title = (
        f"Cost of {record.job_id}: {money(ledger.spent)} against "
        f"{money(ledger.on_demand_equivalent)} on-demand, {saving(record)}"
        + ("" if clock.is_wall else f" ({clock.note()})")
    )
    body, down = heading(title, width)
    body += [
        rect(8, 28 + down, 10, 10, fill=SPOT_COLOUR),
        text(22, 37 + down, "paid"),
        rect(70, 28 + down, 10, 10, fill=ON_DEMAND_COLOUR),
        text(84, 37 + down, "on-demand equivalent"),
    ]
    for i, (label, paid, on_demand, number) in enumerate(rows):
        y = TOP + down + i * ROW
        if number is None:
            body.append(line(8, y - 3, width - 8, y - 3, stroke="#bdbdbd"))
        body += [
            text(8, y + 17, label, font_weight="600" if number is None else None),
            rect(
                LABEL_WIDTH,
                y + 2,
                on_demand * scale,
                12,
                f"{label}: on-demand {money(on_demand)}",
                fill=ON_DEMAND_COLOUR,
                class_="on-demand-cost",
                data_attempt=number,
            ),
            rect(
                LABEL_WIDTH,
                y + 15,
                paid * scale,
                12,
                f"{label}: paid {money(paid)}",
                fill=SPOT_COLOUR,
                class_="paid-cost",
                data_attempt=number,
            ),
            text(
                LABEL_WIDTH + max(paid, on_demand) * scale + 6,
                y + 20,
                f"{money(paid)} / {money(on_demand)}",
                fill="#333",
                font_size=11,
            ),
        ]
    height = TOP + down + ROW * len(rows) + 8
    return document(width, height, title, body, class_="spot-chart spot-cost")
