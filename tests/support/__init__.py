"""What the test suites share: fixtures (moto, PostgreSQL, the Kubernetes emulator,
``airflow standalone``, the Prefect stack), builders, and the small programs tests run as
subprocesses, by path (``SUPPORT / "handover_step.py"``). docs/testing.md lists them.

Each module imports only what its own suite's environment has: ``standalone_server`` and
``task_context`` need Airflow, ``prefect_helpers`` and ``prefect_stack`` Prefect; the rest
run in every environment.
"""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
