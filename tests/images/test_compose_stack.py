"""docker/compose.yaml as real containers: `docker-compose up` against the engine.

Every service runs from its image (the project's three, and PostgreSQL and moto, official
or their stand-ins) on the stack's own network, in `depends_on` order with healthchecks
gating each `service_healthy`. Then, side by side: a run of the spot DAG triggered
through the api-server's REST API succeeds with its checkpoints in the bucket, and a
deployment run on the spot work pool completes. The services share the local cloud's
token by their common UID (the file stays 0600), the local cloud's init reaps its leases,
and `docker-compose down` leaves no container behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.compose_helpers import COMPOSE_FILE, REPO
from tests.support.container_engine import HealthcheckRunner
from tests.support.process_helpers import free_port

pytestmark = pytest.mark.timeout(1200)

DAG_ID = "spot_first_task"
RUN_TIMEOUT = 300.0
UP_TIMEOUT = 900.0
LONG_RUNNING = (
    "postgres",
    "object-store",
    "spot-cloud",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "prefect-server",
    "prefect-worker",
)


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    airflow_url: str

    def compose(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess:
        argv = [_compose_program(), "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
        if check:
            assert done.returncode == 0, (
                f"{' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        return done

    def exec(self, service: str, *command: str, timeout: float = 120) -> str:
        return self.compose("exec", "-T", service, *command, timeout=timeout).stdout

    def logs(self, *services: str, tail: int = 60) -> str:
        return self.compose("logs", "--no-color", f"--tail={tail}", *services, check=False).stdout

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()


def _compose_program() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        pytest.fail(
            "the stack test runs docker/compose.yaml with docker-compose: install it "
            "(Debian/Ubuntu: apt-get install docker-compose)"
        )
    return found


@pytest.fixture(scope="module")
def stack(engine, images, tmp_path_factory):
    project = f"spotstack{os.getpid()}"
    env = engine.env(
        AIRFLOW_PORT=str(free_port()),
        PREFECT_PORT=str(free_port()),
        POSTGRES_IMAGE=images.bases["POSTGRES_IMAGE"],
        MOTO_IMAGE=images.bases["MOTO_IMAGE"],
        COMPOSE_HTTP_TIMEOUT="300",
    )
    env = {k: v for k, v in env.items() if not k.startswith("COMPOSE_FILE")}
    stack = Stack(project, env, f"http://127.0.0.1:{env['AIRFLOW_PORT']}")
    runner = HealthcheckRunner(engine, project) if engine.kind == "podman" else None
    began = time.monotonic()
    try:
        if runner is not None:
            runner.__enter__()
        up = stack.compose("up", "-d", "--no-build", timeout=UP_TIMEOUT, check=False)
        assert up.returncode == 0, f"compose up failed: {up.stderr[-3000:]}\n{stack.logs()}"
        print(f"\nstack up in {time.monotonic() - began:.0f} s")
        yield stack
    finally:
        stopped = time.monotonic()
        down = stack.compose("down", "--volumes", "--timeout", "20", timeout=300, check=False)
        if runner is not None:
            runner.__exit__(None, None, None)
        print(f"stack down in {time.monotonic() - stopped:.0f} s")
        left = engine.docker(
            "ps",
            "-a",
            "--filter",
            f"label=com.docker.compose.project={project}",
            "--format",
            "{{.Names}}",
        ).stdout.split()
        assert down.returncode == 0 and not left, f"{down.stderr[-2000:]} left: {left}"


class AirflowApi:
    """The stack's api-server, through its REST API (every user is an admin locally)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        with urllib.request.urlopen(f"{self.base}/auth/token", timeout=30) as response:
            token = json.loads(response.read())["access_token"]
        request = urllib.request.Request(
            f"{self.base}/api/v2{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"{}")

    def wait_for_dag(self, dag_id: str, timeout: float) -> None:
        """Until the dag-processor has parsed it and the scheduler and triggerer are up."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                health = self.call("GET", "/monitor/health")
                parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
                if all((health.get(p) or {}).get("status") == "healthy" for p in parts):
                    self.call("GET", f"/dags/{dag_id}")
                    return
            except (OSError, urllib.error.HTTPError):
                pass
            assert time.monotonic() < deadline, f"{dag_id} never became runnable"
            time.sleep(2)


def _start_prefect_run(stack: Stack, engine) -> subprocess.Popen:
    """The example flow deployed to the worker's pool from inside the worker's container,
    with the job variables a user of the stack gives. (The script goes in with `docker cp`:
    docker-compose 1.29's `run` asks for legacy links, which podman's API refuses.)"""
    job_variables = {
        "provider": "local",
        "provider_options": {"url": "http://spot-cloud:8790", "workdir": "/var/lib/spot-cloud"},
        "checkpoint_root": "s3://spot-checkpoints/prefect",
        "capacity_wait": 0.5,
        "max_preemptions": 1,  # then on-demand: preemptions are tested elsewhere
    }
    parameters = {"workdir": "/tmp/spot-ml", "steps": 400, "step_seconds": 0.01}
    worker = stack.container("prefect-worker")
    copied = engine.docker(
        "cp", str(Path(__file__).with_name("prefect_run.py")), f"{worker}:/tmp/prefect_run.py"
    )
    assert copied.returncode == 0, copied.stderr
    argv = [
        _compose_program(),
        "-f",
        str(COMPOSE_FILE),
        "-p",
        stack.project,
        "exec",
        "-T",
        "-e",
        "PREFECT_LOGGING_LEVEL=WARNING",
        "prefect-worker",
        "python",
        "/tmp/prefect_run.py",
        "spot",
        "/opt/prefect/flows",
        json.dumps(job_variables),
        json.dumps(parameters),
        str(RUN_TIMEOUT),
    ]
    return subprocess.Popen(
        argv,
        env=stack.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _bucket_keys(stack: Stack, prefix: str) -> list[str]:
    """Keys under ``prefix`` in the stack's bucket, listed from a container on its network."""
    script = (
        "import boto3, json, os, sys; print(json.dumps([o['Key'] for o in boto3.client("
        "'s3').list_objects_v2(Bucket=os.environ['SPOT_CHECKPOINT_BUCKET'], "
        "Prefix=sys.argv[1]).get('Contents', [])]))"
    )
    done = stack.compose(
        "run", "--rm", "--no-deps", "object-store-init", script, prefix, timeout=120
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sql(stack: Stack, database: str, query: str) -> str:
    env = stack.env
    user = env.get("POSTGRES_USER", "spot")
    return stack.exec(
        "postgres", "psql", "-U", user, "-d", database, "-X", "-A", "-t", "-c", query
    ).strip()


def test_a_spot_dag_and_a_spot_flow_run_to_success_on_the_stack(stack, engine):
    began = time.monotonic()
    prefect = _start_prefect_run(stack, engine)
    try:
        api = AirflowApi(stack.airflow_url)
        api.wait_for_dag(DAG_ID, timeout=240)
        api.call("PATCH", f"/dags/{DAG_ID}", {"is_paused": False})
        run = api.call(
            "POST", f"/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"steps": 300}}
        )
        run_id = run["dag_run_id"]
        deadline = time.monotonic() + RUN_TIMEOUT
        while run["state"] not in ("success", "failed") and time.monotonic() < deadline:
            time.sleep(2)
            run = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
        task = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train")
        assert run["state"] == "success", (
            f"{run}\n{task}\n{stack.logs('airflow-scheduler', 'airflow-triggerer', 'spot-cloud')}"
        )
        assert task["try_number"] == 1  # preemptions, if any, spent no Airflow try
        assert _bucket_keys(stack, f"airflow/{DAG_ID}/{run_id}/"), (
            "no checkpoint of the DAG run in the stack's bucket"
        )
        print(f"DAG run done at {time.monotonic() - began:.0f} s")
        out, err = prefect.communicate(timeout=RUN_TIMEOUT + 200)
        print(f"flow run done at {time.monotonic() - began:.0f} s: {out.strip()[-600:]}")
    finally:
        if prefect.poll() is None:
            prefect.kill()
            prefect.wait(timeout=10)
    assert prefect.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["state"] == "COMPLETED", (
        f"{result}\n{err[-2000:]}\n{stack.logs('prefect-worker', 'spot-cloud')}"
    )
    assert _bucket_keys(stack, "prefect/"), "no checkpoint of the flow run in the bucket"
    # Both engines kept their state in the stack's PostgreSQL.
    assert (
        _sql(stack, "airflow", f"SELECT state FROM dag_run WHERE run_id = '{run_id}'") == "success"
    )
    assert (
        _sql(
            stack,
            "prefect",
            f"SELECT state_type FROM flow_run WHERE id = '{result['flow_run_id']}'",
        )
        == "COMPLETED"
    )


def test_the_services_share_the_cloud_token_by_uid_and_stay_healthy(stack, engine):
    # The token stays readable by its owner alone; every service runs as that owner.
    mode = stack.exec("spot-cloud", "stat", "-c", "%a %u", "/var/lib/spot-cloud/server.token")
    assert mode.split() == ["600", "50000"], mode
    for service in ("airflow-triggerer", "airflow-scheduler", "prefect-worker"):
        uid = stack.exec(service, "id", "-u").strip()
        assert uid == "50000", (service, uid)
        token = stack.exec(
            service,
            "python",
            "-c",
            "import sys; from spot_core.localcloud."
            "server import read_token; print(len(read_token(sys.argv[1])))",
            "/var/lib/spot-cloud",
        )
        assert int(token) > 20, (service, token)
    for service in LONG_RUNNING:
        container = stack.container(service)
        status = engine.docker(
            "inspect", "--format", "{{.State.Health.Status}}", container
        ).stdout.strip()
        assert status == "healthy", (service, status, stack.logs(service, tail=30))


def test_the_local_cloud_runs_under_an_init_that_reaps_its_leases(stack):
    init = stack.exec("spot-cloud", "cat", "/proc/1/cmdline").replace("\0", " ")
    assert "spot_core.localcloud.server" in init and not init.startswith("python"), init
    zombies = stack.exec("spot-cloud", "python", "-c", _ZOMBIES)
    assert json.loads(zombies) == [], zombies


_ZOMBIES = """
import json, os
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        continue
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        found.append(stat.split(")")[0] + ")")
print(json.dumps(found))
"""
