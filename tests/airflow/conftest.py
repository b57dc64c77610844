"""Real Airflow 3.3 on SQLite in a throw-away AIRFLOW_HOME (the standalone end-to-end
test runs on PostgreSQL: tests/support/postgres_helpers.py), and one local spot cloud server.

AIRFLOW_HOME must be set before anything imports ``airflow`` (its configuration is read
at import), so it is set when this conftest is imported; the session fixtures migrate
the database once, start the local cloud once, and run the example DAG once for every
test that asserts on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The helpers shared with the other suites: moto, PostgreSQL, one Kubernetes emulator and
# one `airflow standalone` for the whole session (test_standalone and the Spot UI tests).
from tests.support.aws_helpers import aws_env, moto_server  # noqa: F401  (pytest fixtures)
from tests.support.kube_helpers import kube_client, kube_cluster, kube_namespace  # noqa: F401
from tests.support.postgres_helpers import postgres_url  # noqa: F401  (pytest fixture)
from tests.support.standalone_server import runs, standalone, statsd  # noqa: F401

REPO = Path(__file__).resolve().parents[2]

_HOME = Path(tempfile.mkdtemp(prefix="spot-airflow-home-"))
# The dags folder Airflow syncs from: the example DAG plus the tests' own DAGs.
DAGS = _HOME / "dags"
DAGS.mkdir()
for _dag_file in [
    REPO / "dags" / "spot_ml_pipeline.py",
    REPO / "dags" / "spot_batch_inference.py",
    REPO / "dags" / "spot_sweep.py",
    *(Path(__file__).parent / "dags").glob("*.py"),
]:
    (DAGS / _dag_file.name).symlink_to(_dag_file)
TEST_DIR = _HOME / "task-tests"
TEST_DIR.mkdir()
os.environ.update(
    {
        "AIRFLOW_HOME": str(_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "SPOT_TEST_DIR": str(TEST_DIR),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME}/airflow.db",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
    }
)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_HOME, ignore_errors=True)


def load_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    return bag.dags[dag_id]


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """A migrated SQLite metadata database in the session's AIRFLOW_HOME."""
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run(
        [str(airflow), "db", "migrate"],
        check=True,
        capture_output=True,
        timeout=300,
        env=os.environ.copy(),
    )
    return _HOME


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spot-pipeline")


@pytest.fixture(scope="session")
def cloud_url(workdir, airflow_home):
    """The local spot cloud as a server; its URL and token are exported as
    SPOT_LOCAL_CLOUD_URL and SPOT_LOCAL_CLOUD_TOKEN (the triggerer opens it from those)."""
    from airflow_spot.demo import cloud_server
    from spot_core.localcloud.server import client_environ

    with cloud_server(workdir / "cloud", start_tick=300) as url:  # timing known to preempt twice
        environ = client_environ(url, workdir / "cloud")
        os.environ.update(environ)
        os.environ["SPOT_PIPELINE_WORKDIR"] = str(workdir)
        yield url
        for name in environ:
            os.environ.pop(name, None)


@pytest.fixture(scope="session")
def pipeline_cloud(workdir, airflow_home):
    """The example DAG's own local cloud, started as ``make demo ENGINE=airflow`` starts
    it: the replay waits at the demo's tick until the training step first connects, so
    the step meets the same stretch of the trace (two preemptions) however long the
    tests before it ran. (The shared ``cloud_url`` replays from its start: by the time
    this DAG ran in a full suite, it was minutes further on.)"""
    from airflow_spot.demo import DEMO_TIME_SCALE, cloud_server

    with cloud_server(
        workdir / "pipeline-cloud", time_scale=DEMO_TIME_SCALE, start_on_first_client=True
    ) as url:
        yield url


@pytest.fixture(scope="session")
def pipeline_run(pipeline_cloud, workdir):
    """The example DAG run once under dag.test() as the demo runs it (its replay speed
    and compute per step): (dag run, task instances, report.json)."""
    import json

    from airflow_spot.demo import DEMO_STEP_SECONDS
    from spot_core.localcloud.server import client_environ

    environ = {
        **client_environ(pipeline_cloud, workdir / "pipeline-cloud"),
        "SPOT_PIPELINE_WORKDIR": str(workdir),
    }
    saved = {name: os.environ.get(name) for name in environ}
    os.environ.update(environ)
    try:
        run = load_dag("spot_ml_pipeline").test(
            run_conf={"workdir": str(workdir), "steps": 2000, "step_seconds": DEMO_STEP_SECONDS}
        )
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    reports = list((workdir / "runs").glob("*/report.json"))
    report = json.loads(reports[0].read_text()) if reports else None
    return run, {(ti.task_id, ti.map_index): ti for ti in run.get_task_instances()}, report
