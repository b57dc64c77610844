"""SVG charts of JobRecords, rendered on the server: no JavaScript, no internet.

Pure functions, records in and one ``<svg>`` string out, so the Airflow Spot tab and jobs
page, ``spot-pipelines report --html`` and Prefect artifacts draw the same pictures.
Every label taken from a record is escaped; every attempt's bar is a ``<rect>`` with
``class="attempt ..."`` and ``data-attempt``, so a browser test can count them.
"""

from spot_core.charts.cost import cost_chart
from spot_core.charts.lost_work import lost_work_chart
from spot_core.charts.savings import savings_over_time
from spot_core.charts.timeline import attempt_timeline

__all__ = ["attempt_timeline", "cost_chart", "lost_work_chart", "savings_over_time"]
