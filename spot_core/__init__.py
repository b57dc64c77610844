"""spot-pipelines core: engine-agnostic policy, mechanism and control for spot ML jobs.

Imports neither Airflow nor Prefect; cloud SDKs are imported lazily by their providers.
"""

__version__ = "0.1.0"
