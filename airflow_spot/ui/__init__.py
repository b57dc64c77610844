"""The Spot view in the Airflow UI: a tab on every task instance and a Spot jobs page,
served by a FastAPI app the plugin mounts under the API server (``app.py``), reading
JobRecords from Airflow's own tables (``jobs.py``) and rendering them (``pages.py``)."""
