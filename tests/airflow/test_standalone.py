"""End to end under ``airflow standalone`` (api-server, scheduler, dag-processor, triggerer).

One standalone Airflow for this module, in its own AIRFLOW_HOME, on PostgreSQL as in
production (a fresh database on the session's server: tests/core/postgres_helpers.py),
bound to 127.0.0.1 on free ports, with its own local cloud server. Tests trigger DAG runs with
the CLI and read the outcome from the metadata database in a subprocess (the test
process's own Airflow points at the session's other AIRFLOW_HOME).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

# Standalone start-up, parsing and two DAG runs take minutes on a busy machine.
pytestmark = pytest.mark.timeout(900)

BIN = Path(sys.executable).parent
READY_TIMEOUT = 180.0

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _kill_tree(pid: int) -> None:
    """SIGTERM a process we started, its children and everything still in its session
    (the test SIGKILLs a triggerer, whose orphaned log server then hangs off init but
    keeps the session), then SIGKILL what is left."""
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        parent = None
    procs = [] if parent is None else [parent, *parent.children(recursive=True)]
    procs += [p for p in psutil.process_iter() if p not in procs and _session_of(p.pid) == pid]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=20)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


class Standalone:
    def __init__(self, home: Path, env: dict[str, str], port: int) -> None:
        self.home, self.env, self.port = home, env, port
        self.proc: subprocess.Popen | None = None
        self.extra: list[subprocess.Popen] = []

    def cli(self, *args: str, timeout: float = 120) -> str:
        return subprocess.run([str(BIN / "airflow"), *args], env=self.env, check=True,
                              capture_output=True, text=True, timeout=timeout).stdout

    def state(self, dag_id: str) -> dict:
        out = subprocess.run([sys.executable, "-c", QUERY, dag_id], env=self.env, check=True,
                             capture_output=True, text=True, timeout=120).stdout
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
        raise AssertionError(f"{dag_id} run {run_id} did not finish in {timeout} s: "
                             f"{self.state(dag_id)}")

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


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, postgres_url):
    from conftest import DAGS, TEST_DIR
    from postgres_helpers import fresh_database, with_driver

    from airflow_spot.demo import cloud_server
    from spot_core.localcloud.server import client_environ

    home = tmp_path_factory.mktemp("standalone-home")
    work = tmp_path_factory.mktemp("standalone-work")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPOT_"))}
    env.update({
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "SPOT_TEST_DIR": str(TEST_DIR),
        "SPOT_PIPELINE_WORKDIR": str(work),
    })
    with fresh_database(postgres_url, "spot_airflow_standalone") as database, \
            cloud_server(work / "cloud", start_tick=300) as url:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = with_driver(database,
                                                                 "postgresql+psycopg2")
        env.update(client_environ(url, work / "cloud"))
        airflow = Standalone(home, env, port)
        log = open(home / "standalone.log", "wb")
        airflow.proc = subprocess.Popen([str(BIN / "airflow"), "standalone"], env=env,
                                        stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            _wait_healthy(airflow)
            yield airflow
        finally:
            for proc in airflow.extra:
                _kill_tree(proc.pid)
            _kill_tree(airflow.proc.pid)
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
            if all((health.get(part) or {}).get("status") == "healthy"
                   for part in ("metadatabase", "scheduler", "triggerer")):
                return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"airflow standalone did not become healthy ({health}): "
                         + (airflow.home / "standalone.log").read_text()[-3000:])


@pytest.fixture(scope="module")
def runs(standalone) -> dict[str, str]:
    """Both DAG runs at once (they run side by side; the tests look at them in turn)."""
    work = standalone.env["SPOT_PIPELINE_WORKDIR"]
    return {"spot_ml_pipeline": standalone.trigger("spot_ml_pipeline",
                                                   {"workdir": work, "steps": 1000}),
            "spot_task_sigkill": standalone.trigger("spot_task_sigkill")}


def test_pipeline_survives_a_triggerer_restart_mid_training(standalone, runs):
    from spot_core.checkpoint import open_store

    dag_id = "spot_ml_pipeline"
    work = Path(standalone.env["SPOT_PIPELINE_WORKDIR"])
    run_id = runs[dag_id]
    runs = work / "runs"
    # Kill the triggerer while it watches the lease: past step 100 and deferred at the same
    # moment. Between attempts (after a preemption) the task is briefly running again, so
    # the two are awaited together rather than the state asserted once at step 100.
    deadline = time.monotonic() + 240
    step_at_kill, step, ti = None, 0, None
    while time.monotonic() < deadline and step_at_kill is None:
        refs = [open_store(d.as_uri()).latest() for d in runs.glob("*/checkpoints/train")]
        step = max((ref.step for ref in refs if ref is not None), default=0)
        if step >= 100:
            ti = standalone.state(dag_id)["tis"].get("train:-1")
            if ti is not None and ti[0] == "deferred":
                step_at_kill = step
                break
        time.sleep(0.5)
    assert step_at_kill is not None, f"train never deferred past step 100 (step {step}, {ti})"

    pids = standalone.triggerer_pids()
    assert pids, "no triggerer process found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)  # our own standalone's triggerer, by pid
    time.sleep(5)  # training goes on on its lease while no triggerer watches it
    standalone.extra.append(subprocess.Popen([str(BIN / "airflow"), "triggerer"],
                                             env=standalone.env, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True))

    state = standalone.wait_run(dag_id, run_id, timeout=400)
    assert state["runs"][run_id] == "success", state
    assert state["tis"]["train:-1"] == ["success", 1], "the restart cost an Airflow try"
    record = state["xcom"]["train:-1:spot_job_record"]
    record = json.loads(record) if isinstance(record, str) else record
    outcomes = [a["outcome"] for a in record["attempts"]]
    assert "infrastructure_failed" not in outcomes and outcomes[-1] == "succeeded"
    # No progress lost: no attempt after the restart went back before the step reached.
    later = [a for a in record["attempts"] if a["checkpoint_step_end"] is not None
             and a["checkpoint_step_end"] >= step_at_kill]
    assert later, record
    starts = [a["checkpoint_step_start"] or 0 for a in record["attempts"]]
    assert starts == sorted(starts)
    report = json.loads(next(runs.glob("*/report.json")).read_text())["result"]
    assert report["final_weights_sha256"] == report["uninterrupted_weights_sha256"]


def test_sigkilled_task_spot_resumes_from_the_last_periodic_checkpoint(standalone, runs):
    """The task process dies without notice; the supervisor fails the try; the retry
    closes the lost attempt and resumes from the newest periodic checkpoint."""
    dag_id = "spot_task_sigkill"
    run_id = runs[dag_id]
    state = standalone.wait_run(dag_id, run_id, timeout=240)
    assert state["runs"][run_id] == "success", state
    assert state["tis"]["crunch_killed:-1"] == ["success", 2]
    result = state["xcom"]["crunch_killed:-1:return_value"]
    result = json.loads(result) if isinstance(result, str) else result
    assert result == {"start": 30, "try": 2}  # killed at step 37; saved every 10 steps
    summary = state["xcom"]["crunch_killed:-1:spot_task_record"]
    summary = json.loads(summary) if isinstance(summary, str) else summary
    assert summary["preemptions"] == 1 and summary["resumed_from_steps"] == [30]
    assert summary["lost_work_seconds"] > 0


def _api(standalone: Standalone, method: str, path: str, body: dict | None = None) -> dict:
    """One call to the standalone's REST API with a token (all users are admins here)."""
    base = f"http://127.0.0.1:{standalone.port}"
    with urllib.request.urlopen(f"{base}/auth/token", timeout=30) as response:
        token = json.loads(response.read())["access_token"]
    request = urllib.request.Request(f"{base}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"{}")


def test_a_deferred_spot_task_marked_failed_leaves_no_lease(standalone):
    """Marking the deferred task failed cancels its trigger; the trigger stops the lease."""
    from conftest import TEST_DIR
    from spot_helpers import marked_processes, wait_until

    dag_id, task_id = "spot_job_mark_failed", "long_step"
    mine = str(TEST_DIR / f"ckpt-{dag_id}")
    run_id = standalone.trigger(dag_id)
    assert wait_until(lambda: standalone.state(dag_id)["tis"].get(f"{task_id}:-1", [None])[0]
                      == "deferred" and marked_processes(mine), timeout=240, interval=2), \
        f"the task never deferred with a running lease: {standalone.state(dag_id)}"
    _api(standalone, "PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}",
         {"new_state": "failed"})
    assert wait_until(lambda: not marked_processes(mine), timeout=90, interval=1), \
        "the lease of the task marked failed is still running"
    assert standalone.state(dag_id)["tis"][f"{task_id}:-1"][0] == "failed"
