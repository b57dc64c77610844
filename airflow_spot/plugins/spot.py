"""The provider's Airflow plugin: registers the price-window timetable and the extra links.

Registered through ``get_provider_info()["plugins"]``, so the scheduler, API server and
DAG processor can deserialise DAGs that use ``PriceWindowTimetable`` and show the links.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_spot.links.spot import SpotCheckpointLink, SpotEc2InstanceLink
from airflow_spot.timetables.price_window import PriceWindowTimetable


class SpotPipelinesPlugin(AirflowPlugin):
    name = "spot_pipelines"
    timetables = [PriceWindowTimetable]
    operator_extra_links = [SpotCheckpointLink(), SpotEc2InstanceLink()]
