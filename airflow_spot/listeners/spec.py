"""The ``on_spot_alert`` listener hook: implement it in an Airflow plugin's ``listeners``.

    # plugins/spot_alerts.py
    from airflow.listeners import hookimpl
    from airflow.plugins_manager import AirflowPlugin

    class SpotAlertListener:
        @hookimpl
        def on_spot_alert(self, alert, dag_id, run_id, task_id, map_index):
            page_oncall(alert["message"])

    class SpotAlertsPlugin(AirflowPlugin):
        name = "spot_alerts"
        listeners = [SpotAlertListener()]

It is called in the task's process, once per alert, when an attempt of a
``SpotJobOperator`` ends and a pool of the job passes ``alert_interruption_rate`` or
``alert_spot_price`` (``airflow_spot/alerts.py``).
"""

from __future__ import annotations

from pluggy import HookspecMarker

hookspec = HookspecMarker("airflow")


@hookspec
def on_spot_alert(alert: dict, dag_id: str, run_id: str, task_id: str, map_index: int) -> None:
    """A spot pool passed an alert threshold. ``alert``: ``PoolAlert.to_dict()`` (pool,
    pool_key, kind ``interruption_rate`` or ``spot_price``, value, threshold,
    observed_at, message)."""
