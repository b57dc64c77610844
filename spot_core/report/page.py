"""The record as one self-contained HTML page: the terminal's tables and the SVG charts,
inline CSS, no script and no link out, so it opens offline and can be mailed or archived
as a build artefact. Everything taken from the record is escaped."""

from __future__ import annotations

from html import escape

from spot_core.charts import attempt_timeline, cost_chart, lost_work_chart
from spot_core.charts.clock import Clock
from spot_core.model import JobRecord
from spot_core.report.rows import attempt_cells, columns, ledger_lines, record_clock

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#212121}
h1{font-size:20px;margin:0 0 4px}p.ledger{white-space:pre-line;margin:8px 0 16px}
table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}
th,td{border:1px solid #e0e0e0;padding:4px 8px;white-space:nowrap}th{background:#f5f5f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:0 0 20px}figure svg{max-width:100%;height:auto}
"""


def html_page(record: JobRecord, time_scale: float | None = None) -> str:
    """The whole page (UTF-8 text); ``record`` as the attempts table, the ledger and the
    attempt timeline, cost and lost-work charts, all in one clock and one unit, which the
    ledger's last line names."""
    title = f"Spot job {record.job_id} ({record.status})"
    clock = record_clock(record, time_scale)
    charts = (
        attempt_timeline(record, clock=clock),
        cost_chart(record, clock=clock),
        lost_work_chart(record, clock=clock),
    )
    return "".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
            # No script, no remote anything: the page is data, whatever the record holds.
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "style-src 'unsafe-inline'; img-src data:\">",
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
            f"<h1>{escape(title)}</h1>",
            f'<p class="ledger">{escape(ledger_lines(record, time_scale))}</p>',
            _attempts_table(record, clock),
            *(f"<figure>{svg}</figure>" for svg in charts),
            "</body></html>\n",
        ]
    )


NUMBER = ' class="num"'


def _attempts_table(record: JobRecord, clock: Clock) -> str:
    head = "".join(f"<th>{escape(heading)}</th>" for heading, _ in columns(clock))
    rows = []
    for attempt in record.attempts:
        cells = "".join(
            f"<td{'' if left else NUMBER}>{escape(cell)}</td>"
            for (_, left), cell in zip(
                columns(clock), attempt_cells(attempt, record, clock), strict=True
            )
        )
        rows.append(f'<tr class="attempt-row" data-attempt="{attempt.number}">{cells}</tr>')
    return (
        f'<table class="attempts"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
