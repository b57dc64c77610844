"""Views of a JobRecord outside the engines' UIs: terminal tables (rich), a
self-contained HTML page with the SVG charts, and the demo's stable JSON object.

    print_record(record)                        # spot-pipelines run / demo
    page = html_page(record)                    # spot-pipelines report --html FILE
"""

from spot_core.report.demo_json import demo_report
from spot_core.report.live import LiveProgress
from spot_core.report.page import html_page
from spot_core.report.progress import attempt_line, progress_percent, saving_line
from spot_core.report.rows import COLUMNS, attempt_cells, columns, ledger_lines, record_clock
from spot_core.report.terminal import attempts_table, print_record

__all__ = [
    "COLUMNS",
    "LiveProgress",
    "attempt_cells",
    "attempt_line",
    "attempts_table",
    "columns",
    "demo_report",
    "html_page",
    "ledger_lines",
    "print_record",
    "progress_percent",
    "record_clock",
    "saving_line",
]
