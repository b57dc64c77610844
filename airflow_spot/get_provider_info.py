"""What Airflow's providers manager learns about this package (entry point
``apache_airflow_provider``); ``airflow providers list`` shows it."""

from __future__ import annotations


def get_provider_info() -> dict:
    return {
        "package-name": "spot-pipelines",
        "name": "Spot Pipelines",
        "description": "Run ML pipeline steps on spot capacity: deferrable spot job operator, "
        "a KubernetesPodOperator for spot node pools, "
        "in-place @task.spot decorator, price-window sensor and timetable; "
        "preemptions never spend Airflow retries.",
        "integrations": [
            {
                "integration-name": "Spot Pipelines",
                "external-doc-url": "https://github.com/spot-pipelines/spot-pipelines",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "Spot Pipelines",
                "python-modules": [
                    "airflow_spot.operators.spot",
                    "airflow_spot.operators.kubernetes",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Spot Pipelines",
                "python-modules": ["airflow_spot.sensors.price_window"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Spot Pipelines",
                "python-modules": ["airflow_spot.hooks.spot", "airflow_spot.hooks.kubernetes"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Spot Pipelines",
                "python-modules": [
                    "airflow_spot.triggers.spot",
                    "airflow_spot.triggers.kubernetes",
                    "airflow_spot.triggers.price_window",
                ],
            }
        ],
        "extra-links": [
            "airflow_spot.links.spot.SpotCheckpointLink",
            "airflow_spot.links.spot.SpotEc2InstanceLink",
            "airflow_spot.links.kubernetes.SpotKubernetesPodLink",
        ],
        "task-decorators": [
            {"class-name": "airflow_spot.decorators.spot.spot_task", "name": "spot"}
        ],
        "plugins": [
            {
                "name": "spot_pipelines",
                "plugin-class": "airflow_spot.plugins.spot.SpotPipelinesPlugin",
            }
        ],
    }
