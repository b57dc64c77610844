"""The provider's Airflow plugin: the price-window timetable, the extra links, and the
Spot UI (a FastAPI app under the API server, a Spot tab on task instances and a Spot
jobs page in the navigation).

Registered through ``get_provider_info()["plugins"]`` and the ``airflow.plugins`` entry
point, so the scheduler, API server and DAG processor can deserialise DAGs that use
``PriceWindowTimetable``, show the links, and the API server mounts the UI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_spot.links.spot import SpotCheckpointLink, SpotEc2InstanceLink
from airflow_spot.timetables.price_window import PriceWindowTimetable
from airflow_spot.ui.app import URL_PREFIX, app

# Airflow fills {DAG_ID}, {RUN_ID}, {TASK_ID} and {MAP_INDEX} and shows url_route's page
# in an iframe; every task instance gets the tab (a non-spot task's says so).
SPOT_TAB = {
    "name": "Spot",
    "href": f"{URL_PREFIX}/ti/{{DAG_ID}}/{{RUN_ID}}/{{TASK_ID}}/{{MAP_INDEX}}",
    "destination": "task_instance",
    "url_route": "spot",
}
SPOT_JOBS = {
    "name": "Spot jobs",
    "href": f"{URL_PREFIX}/jobs",
    "destination": "nav",
    "category": "browse",
    "url_route": "spot-jobs",
}


class SpotPipelinesPlugin(AirflowPlugin):
    name = "spot_pipelines"
    timetables = [PriceWindowTimetable]
    operator_extra_links = [SpotCheckpointLink(), SpotEc2InstanceLink()]
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Spot pipelines"}]
    external_views = [SPOT_TAB, SPOT_JOBS]
