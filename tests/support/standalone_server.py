"""One ``airflow standalone`` for the whole test session (api-server, scheduler,
dag-processor, triggerer), shared by test_standalone.py, test_standalone_kubernetes.py and
the Spot UI's browser and metrics tests: its own AIRFLOW_HOME on PostgreSQL, bound to
127.0.0.1 on free ports, its own local cloud server, the session's Kubernetes emulator as
the connection ``spot_k8s_standalone`` (node pools and a namespace of its own), and StatsD
metrics sent to a UDP listener of the test (``statsd``). Each test triggers its own DAG
(its own run ids), so they share the server without sharing state. Tests trigger DAG runs
with the CLI and read the outcome from the metadata database in a subprocess (the test
process's own Airflow points at the session's other AIRFLOW_HOME). The fixtures are
registered in conftest.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.support.process_helpers import free_port, stop_tree

BIN = Path(sys.executable).parent
READY_TIMEOUT = 180.0
# (username, simple auth manager role, password) of the standalone's users.
USERS = (("admin", "admin", "spot-admin-pw"), ("viewer", "viewer", "spot-viewer-pw"))

QUERY = r"""
import json, sys
from airflow.models import DagRun, TaskInstance
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
dag_id = sys.argv[1]
with create_session() as s:
    runs = s.query(DagRun).filter(DagRun.dag_id == dag_id).all()
    tis = s.query(TaskInstance).filter(TaskInstance.dag_id == dag_id).all()
    xcoms = s.query(XComModel).filter(XComModel.dag_id == dag_id).all()
    print(json.dumps({
        "runs": {r.run_id: str(r.state) for r in runs},
        "tis": {f"{t.task_id}:{t.map_index}": [str(t.state), t.try_number] for t in tis},
        "xcom": {f"{x.task_id}:{x.map_index}:{x.key}": x.value for x in xcoms},
    }, default=str))
"""


def standalone_env(home: Path, port: int, dags: str) -> dict[str, str]:
    """The environment of an `airflow standalone` of the tests: this process's, without
    its AIRFLOW_* and SPOT_* settings, in ``home``, serving on 127.0.0.1:``port`` with
    free log-server ports, parsing ``dags`` and scheduling quickly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPOT_"))}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": dags,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        }
    )
    return env


class Standalone:
    def __init__(self, home: Path, env: dict[str, str], port: int) -> None:
        self.home, self.env, self.port = home, env, port
        self.proc: subprocess.Popen | None = None
        self.extra: list[subprocess.Popen] = []

    def cli(self, *args: str, timeout: float = 120) -> str:
        return subprocess.run(
            [str(BIN / "airflow"), *args],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
        ).stdout

    def state(self, dag_id: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", QUERY, dag_id],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        run_id = f"test__{dag_id}__{time.time_ns()}"
        deadline = time.monotonic() + 120
        while True:  # the dag-processor must have parsed the DAG first
            try:
                self.cli("dags", "unpause", dag_id)
                self.cli("dags", "trigger", dag_id, "-r", run_id, "-c", json.dumps(conf or {}))
                return run_id
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(3)

    def wait_run(self, dag_id: str, run_id: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(dag_id)
            if state["runs"].get(run_id) in ("success", "failed"):
                return state
            time.sleep(3)
        raise AssertionError(
            f"{dag_id} run {run_id} did not finish in {timeout} s: {self.state(dag_id)}"
        )

    def token(self, username: str = "admin") -> str:
        """A JWT for one of ``USERS`` from ``POST /auth/token``, as a script would get it."""
        password = next(p for u, _, p in USERS if u == username)
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/auth/token",
            method="POST",
            data=json.dumps({"username": username, "password": password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["access_token"]

    def triggerer_pids(self) -> list[int]:
        found = []
        roots = [self.proc.pid, *(p.pid for p in self.extra)]
        for root in roots:
            try:
                procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in procs:
                try:
                    if "triggerer" in " ".join(proc.cmdline()):
                        found.append(proc.pid)
                except psutil.NoSuchProcess:
                    pass
        return found


def kubernetes_env(kube_cluster, work: Path) -> dict[str, str]:
    """What tests/airflow/dags/spot_k8s_dags.py reads at parse time: the emulator as the
    connection ``spot_k8s_standalone``, two node pools of its own (Karpenter spot, EKS
    on-demand) with their prices, a namespace of its own, and ``work`` for checkpoints."""
    from tests.support.kube_helpers import add_test_pool

    made = {}
    for flavour, capacity, zone in (
        ("karpenter", "spot", "us-east-1a"),
        ("eks", "on-demand", "us-east-1c"),
    ):
        made[flavour], _ = add_test_pool(
            kube_cluster,
            flavour,
            capacity_type=capacity,
            zone=zone,
            instance_type="c6i.2xlarge",
            pods=4,
        )
    namespace = f"sa-{time.time_ns() % 10**8}"
    kube_cluster.api.create("namespaces", "", {"metadata": {"name": namespace}})
    return {
        "AIRFLOW_CONN_SPOT_K8S_STANDALONE": json.dumps(
            {
                "conn_type": "kubernetes",
                "extra": {"kube_config_path": str(kube_cluster.kubeconfig_path)},
            }
        ),
        "SPOT_K8S_WORK": str(work),
        "SPOT_K8S_NAMESPACE": namespace,
        "SPOT_K8S_NODE_POOLS": ",".join(made.values()),
        "SPOT_K8S_PRICES": json.dumps(
            {made["karpenter"]: {"spot": 0.2}, made["eks"]: {"on_demand": 0.34}}
        ),
    }


@pytest.fixture(scope="session")
def standalone(tmp_path_factory, postgres_url, statsd, kube_cluster):
    """`airflow standalone` on PostgreSQL as in production (a fresh database on the
    session's server: tests/support/postgres_helpers.py). One per session: each start (a
    fresh database migrated, four processes healthy) took one to two minutes."""
    from airflow_spot.demo import cloud_server
    from spot_core.localcloud.server import client_environ
    from tests.support.postgres_helpers import fresh_database, with_driver

    home = tmp_path_factory.mktemp("standalone-home")
    work = tmp_path_factory.mktemp("standalone-work")
    port = free_port()
    env = standalone_env(home, port, os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    env.update(
        {
            # Real logins (the Spot UI test logs in; no token is a 401): the simple auth
            # manager's users with passwords the tests know.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r, _ in USERS),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "SPOT_TEST_DIR": os.environ["SPOT_TEST_DIR"],  # tests/airflow/conftest.py's
            "SPOT_PIPELINE_WORKDIR": str(work),
            # Airflow's metrics (and the provider's spot.* metrics) to the test's UDP listener;
            # the InfluxDB line format carries the tags (dag_id, task_id, pool).
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
            "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
        }
    )
    env.update(kubernetes_env(kube_cluster, tmp_path_factory.mktemp("k8s-standalone-work")))
    (home / "passwords.json").write_text(json.dumps({u: p for u, _, p in USERS}))
    # The trace's clock starts at the first launch (the train task's), as in `make demo`, so
    # training meets the demo's preemptions however long Airflow took to start.
    with (
        fresh_database(postgres_url, "spot_airflow_standalone") as database,
        cloud_server(work / "cloud", start_on_first_client=True) as url,
    ):
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = with_driver(database, "postgresql+psycopg2")
        env.update(client_environ(url, work / "cloud"))
        try:
            with running_standalone(home, env, port) as airflow:
                yield airflow
        finally:
            kube_cluster.delete_namespace(env["SPOT_K8S_NAMESPACE"])


@contextmanager
def running_standalone(home: Path, env: dict[str, str], port: int) -> Iterator[Standalone]:
    """`airflow standalone` in ``home`` with ``env`` (it migrates its database on start),
    healthy on ``port``; it and every process a test added to ``extra`` are stopped after."""
    airflow = Standalone(home, env, port)
    log = open(home / "standalone.log", "wb")
    airflow.proc = subprocess.Popen(
        [str(BIN / "airflow"), "standalone"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_healthy(airflow)
        yield airflow
    finally:
        for proc in airflow.extra:
            stop_tree(proc.pid)
        stop_tree(airflow.proc.pid)
        log.close()


def _wait_healthy(airflow: Standalone) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    url = f"http://127.0.0.1:{airflow.port}/api/v2/monitor/health"
    health: dict = {}
    while time.monotonic() < deadline:
        assert airflow.proc.poll() is None, (airflow.home / "standalone.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                health = json.loads(response.read())
            if all(
                (health.get(part) or {}).get("status") == "healthy"
                for part in ("metadatabase", "scheduler", "triggerer")
            ):
                return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(
        f"airflow standalone did not become healthy ({health}): "
        + (airflow.home / "standalone.log").read_text()[-3000:]
    )


@pytest.fixture(scope="session")
def runs(standalone) -> dict[str, str]:
    """Both DAG runs at once (they run side by side; the tests look at them in turn)."""
    work = standalone.env["SPOT_PIPELINE_WORKDIR"]
    return {
        "spot_ml_pipeline": standalone.trigger(
            "spot_ml_pipeline", {"workdir": work, "steps": 2000}
        ),
        "spot_task_sigkill": standalone.trigger("spot_task_sigkill"),
    }


class StatsdListener:
    """A UDP socket on 127.0.0.1 that keeps every StatsD line it receives (bounded)."""

    MAX_LINES = 200_000

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except OSError:
                continue
            if len(self.lines) < self.MAX_LINES:
                self.lines.extend(data.decode(errors="replace").splitlines())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture(scope="session")
def statsd():
    listener = StatsdListener()
    yield listener
    listener.close()
